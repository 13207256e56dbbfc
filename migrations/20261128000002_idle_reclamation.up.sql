-- Idle reclamation (`domain::idle`): policies per team and priority class, and the idle
-- stretches of jobs' attempts that `control::utilisation` records.

-- A team's (or every team's, team_id null) policy for a priority class (or every class,
-- priority_class null). The most specific one governs a job; `exempt` opts its jobs out.
create table idle_policies (
    id                      uuid primary key,
    team_id                 uuid constraint idle_policies_team_id_fkey references teams (id) on delete cascade,
    priority_class          text constraint idle_policies_priority_class_fkey
                                 references priority_classes (name) on delete cascade,
    below_sm_active_percent float8 not null constraint idle_policies_below_check
                                 check (below_sm_active_percent > 0 and below_sm_active_percent <= 100),
    idle_seconds            int4 not null constraint idle_policies_idle_seconds_check
                                 check (idle_seconds between 1 and 604800),
    notice_seconds          int4 not null constraint idle_policies_notice_seconds_check
                                 check (notice_seconds between 0 and 604800),
    action                  text not null constraint idle_policies_action_check
                                 check (action in ('notify', 'stop', 'preempt', 'exempt')),
    created_at              timestamptz not null default now(),
    updated_at              timestamptz not null default now(),
    constraint idle_policies_scope_key unique nulls not distinct (team_id, priority_class)
);

-- A stretch in which an attempt's GPUs stayed idle (SM activity below the governing
-- policy's threshold, or the default 5%): from the first idle read to the last. One per
-- attempt is open at a time. `gpu_milli` is the GPUs held times the class's fraction in
-- thousandths, the ledger's unit, so a stretch's GPU time is `gpu_milli` × milliseconds.
create table idle_spans (
    job_id     uuid not null constraint idle_spans_job_id_fkey references jobs (id) on delete cascade,
    attempt    int4 not null,
    started_at timestamptz not null,
    ended_at   timestamptz not null,
    gpu_milli  int8 not null,
    open       boolean not null default true,
    warned_at  timestamptz,
    acted_at   timestamptz,
    primary key (job_id, attempt, started_at),
    constraint idle_spans_order_check check (ended_at >= started_at)
);
create unique index idle_spans_one_open_idx on idle_spans (job_id, attempt) where open;
create index idle_spans_ended_at_idx on idle_spans (ended_at);
