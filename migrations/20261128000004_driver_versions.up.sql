-- The driver stack each node runs, as its cluster reports it (GPU Feature Discovery's
-- `nvidia.com/cuda.driver-version.full` and `nvidia.com/cuda.runtime-version.full` on
-- Kubernetes; the simulated cluster's configuration); null where the cluster does not say.
alter table cluster_nodes
    add column driver_version text,
    add column cuda_version text;

-- The least driver and CUDA version a job's nodes must run; null for no requirement. Checked
-- as dotted numbers when the job is submitted.
alter table jobs
    add column min_driver_version text,
    add column min_cuda_version text;
