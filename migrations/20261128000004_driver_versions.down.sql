alter table jobs
    drop column min_cuda_version,
    drop column min_driver_version;

alter table cluster_nodes
    drop column cuda_version,
    drop column driver_version;
