drop table gpu_faults;
drop table gpu_health_reads;
