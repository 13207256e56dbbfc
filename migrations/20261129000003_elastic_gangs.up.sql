-- Elastic gangs. A job with max_replicas is admitted at its replicas (its minimum) and grows,
-- one replica at a time, into capacity no waiting job needs, up to max_replicas. Each replica
-- beyond the minimum (an extra) is a job row of its own, with extra_of naming its gang: it is
-- dispatched, metered and billed as any job, given back (cancelled with its grace period)
-- when a waiting job needs its GPUs, and ended with its gang.
alter table jobs
    add column max_replicas integer,
    add column extra_of uuid constraint jobs_extra_of_fkey references jobs (id) on delete cascade,
    add constraint jobs_max_replicas_check check (max_replicas is null or max_replicas between replicas and 1024),
    add constraint jobs_extra_is_one_replica_check check (extra_of is null or (replicas = 1 and max_replicas is null));
create index jobs_extra_of_idx on jobs (extra_of) where extra_of is not null;
