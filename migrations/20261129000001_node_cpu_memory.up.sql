-- The CPU and memory a node can give to replicas beside its GPUs (Kubernetes' allocatable,
-- the simulated cluster's declared size); null where the cluster does not say (cloud pools
-- size their machines to the job). Placement counts them: a node whose CPUs are spent takes
-- no replica however many GPUs it has free.
alter table cluster_nodes
    add column cpu_millis integer constraint cluster_nodes_cpu_millis_check check (cpu_millis >= 0),
    add column memory_mib integer constraint cluster_nodes_memory_mib_check check (memory_mib >= 0);
