alter table jobs drop column workload, drop column memory_mib, drop column cpu_millis;
alter table gpu_classes drop column memory_mib_per_gpu, drop column cpu_millis_per_gpu;
