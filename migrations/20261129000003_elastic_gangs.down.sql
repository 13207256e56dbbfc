drop index jobs_extra_of_idx;
alter table jobs
    drop constraint jobs_extra_is_one_replica_check,
    drop constraint jobs_max_replicas_check,
    drop column extra_of,
    drop column max_replicas;
