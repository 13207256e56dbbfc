-- How long a job waits for capacity before it may preempt anyone, counted from when it last
-- entered the queue: per priority class (0: it preempts at once), and per job to override it
-- (null: its class's). Within it the job takes any capacity that comes (jobs ending, nodes an
-- autoscaler or a cloud pool adds) and evicts no one.
alter table priority_classes
    add column preemption_delay_seconds integer not null default 0
        constraint priority_classes_preemption_delay_check check (preemption_delay_seconds between 0 and 86400);
alter table jobs
    add column preemption_delay_seconds integer
        constraint jobs_preemption_delay_check check (preemption_delay_seconds between 0 and 86400);
