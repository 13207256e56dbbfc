alter table cluster_nodes drop column cpu_millis, drop column memory_mib;
