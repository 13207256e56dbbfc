-- How long a job ran in its attempts that ended with it back in the queue (ms): the service
-- it has attained, which the service queue order (FAIRWAY_QUEUE_ORDER=service) ranks by and
-- least-attained-service preemption compares with its threshold. Its current attempt is not
-- counted: the scheduler adds the time since started_at.
alter table jobs add column attained_ms bigint not null default 0
    constraint jobs_attained_ms_check check (attained_ms >= 0);
