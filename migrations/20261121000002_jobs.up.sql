-- Jobs and their lifecycle: the jobs themselves, their event timeline, the dispatch
-- outbox, the scheduler's leadership record, usage intervals, the nodes clusters report,
-- and the simulated cluster's objects.

-- Limits and weights the scheduler needs per team and per priority class.
alter table teams
    add column max_runtime_seconds integer not null default 604800
        constraint teams_max_runtime_seconds_check check (max_runtime_seconds between 60 and 2592000),
    add column fair_share_weight_milli integer not null default 1000
        constraint teams_fair_share_weight_check check (fair_share_weight_milli between 1 and 1000000);

alter table priority_classes
    add column preemption_grace_seconds integer not null default 30
        constraint priority_classes_grace_check check (preemption_grace_seconds between 0 and 86400);

-- What each cluster reports it has: one row per node and GPU class (a MIG-partitioned node
-- has a row per profile). Replaced by the cluster's backend on every inventory sync.
create table cluster_nodes (
    cluster_id         uuid not null constraint cluster_nodes_cluster_id_fkey references clusters (id) on delete cascade,
    name               text not null,
    gpu_class_id       uuid not null constraint cluster_nodes_gpu_class_id_fkey references gpu_classes (id) on delete cascade,
    gpus               integer not null constraint cluster_nodes_gpus_check check (gpus between 1 and 64),
    -- Units per NVLink domain; 0 means the whole node is one domain.
    nvlink_domain_size integer not null default 0 constraint cluster_nodes_domain_check check (nvlink_domain_size >= 0),
    rack               text,
    zone               text,
    -- A cloud pool without topology; `gpus` is its maximum size.
    elastic            boolean not null default false,
    constraint cluster_nodes_pkey primary key (cluster_id, name, gpu_class_id)
);

create table jobs (
    id                       uuid primary key,
    -- The engine's job id and the list cursor: dense, ordered by submission.
    seq                      bigint generated always as identity constraint jobs_seq_key unique,
    team_id                  uuid not null constraint jobs_team_id_fkey references teams (id) on delete cascade,
    name                     text not null,
    gpu_class_id             uuid not null constraint jobs_gpu_class_id_fkey references gpu_classes (id),
    priority_class           text not null constraint jobs_priority_class_fkey references priority_classes (name),
    replicas                 integer not null constraint jobs_replicas_check check (replicas between 1 and 1024),
    gpus_per_replica         integer not null constraint jobs_gpus_per_replica_check check (gpus_per_replica between 1 and 64),
    max_runtime_seconds      integer not null constraint jobs_max_runtime_check check (max_runtime_seconds between 1 and 2592000),
    image                    text not null,
    command                  jsonb not null default '[]',
    env                      jsonb not null default '{}',
    labels                   jsonb not null default '{}',
    -- `any`, or `required`/`preferred` with a level.
    topology_mode            text not null default 'any'
                             constraint jobs_topology_mode_check check (topology_mode in ('any', 'required', 'preferred')),
    topology_level           text constraint jobs_topology_level_check
                             check (topology_level in ('nvlink-domain', 'node', 'rack', 'zone')),
    -- Overrides the priority class's grace period when set.
    preemption_grace_seconds integer constraint jobs_grace_check check (preemption_grace_seconds between 0 and 86400),
    -- Retries after the application itself failed (other outcomes have platform budgets).
    max_retries              integer not null default 0 constraint jobs_max_retries_check check (max_retries between 0 and 100),
    state                    text not null default 'pending' constraint jobs_state_check
                             check (state in ('pending', 'admitted', 'running', 'succeeded', 'failed', 'cancelled', 'preempted')),
    -- Incremented at every admission: one backend object per attempt.
    attempt                  integer not null default 0,
    -- True from admission until the backend confirms the attempt's object is gone.
    holds_gpus               boolean not null default false,
    cluster_id               uuid constraint jobs_cluster_id_fkey references clusters (id),
    -- [{"node": name, "gpus": [unit, ...]}] per replica.
    placement                jsonb,
    borrowing                boolean not null default false,
    -- Refreshed by every scheduling cycle while pending.
    pending_reason           text,
    pending_message          text,
    queue_position           integer,
    expected_start_at        timestamptz,
    -- Set when the job is asked to stop (cancel, preemption); the backend gets the grace.
    stop_requested_at        timestamptz,
    last_checkpoint_at       timestamptz,
    exit_code                integer,
    -- How often each outcome has sent the job back to the queue.
    preemptions              integer not null default 0,
    capacity_retries         integer not null default 0,
    node_lost_retries        integer not null default 0,
    app_retries              integer not null default 0,
    submitted_by             text not null,
    submitted_at             timestamptz not null default now(),
    -- When it last entered the queue (submission or requeue): queue wait is measured from here.
    queued_at                timestamptz not null default now(),
    admitted_at              timestamptz,
    -- When the backend accepted the attempt's object.
    dispatched_at            timestamptz,
    started_at               timestamptz,
    finished_at              timestamptz,
    updated_at               timestamptz not null default now(),
    version                  bigint not null default 1,
    constraint jobs_topology_level_given check ((topology_mode = 'any') = (topology_level is null)),
    constraint jobs_placed_when_holding check (not holds_gpus or (placement is not null and cluster_id is not null))
);
create index jobs_team_id_seq_idx on jobs (team_id, seq);
-- The scheduler reads only live jobs; a partial index keeps that independent of history.
create index jobs_live_idx on jobs (seq) where state in ('pending', 'admitted', 'running') or holds_gpus;
create index jobs_labels_idx on jobs using gin (labels jsonb_path_ops);

create table job_events (
    id      bigint generated always as identity primary key,
    job_id  uuid not null constraint job_events_job_id_fkey references jobs (id) on delete cascade,
    at      timestamptz not null default now(),
    -- submitted, admitted, dispatched, running, preempted, requeued, cancel_requested,
    -- cancelled, succeeded, failed, checkpoint, dispatch_error, lost, orphan_removed
    kind    text not null,
    attempt integer not null,
    reason  text,
    message text not null default '',
    data    jsonb
);
create index job_events_job_id_idx on job_events (job_id, id);

-- Work for the dispatcher, written in the same transaction as the decision behind it.
create table dispatch_outbox (
    id         bigint generated always as identity primary key,
    job_id     uuid not null constraint dispatch_outbox_job_id_fkey references jobs (id) on delete cascade,
    attempt    integer not null,
    action     text not null constraint dispatch_outbox_action_check check (action in ('submit', 'stop')),
    -- For `stop`: how long the job may take to checkpoint.
    grace_ms   bigint not null default 0,
    tries      integer not null default 0,
    not_before timestamptz not null default now(),
    last_error text,
    created_at timestamptz not null default now(),
    done_at    timestamptz
);
create index dispatch_outbox_todo_idx on dispatch_outbox (not_before, id) where done_at is null;

-- The scheduler's leadership: one row. The leader holds an advisory lock and this row's
-- epoch; every decision transaction checks the epoch, so a leader that lost its lock while
-- paused commits nothing when it resumes.
create table scheduler_leader (
    id           integer primary key constraint scheduler_leader_one_row check (id = 1),
    epoch        bigint not null,
    holder       text not null,
    backend_pid  integer not null,
    acquired_at  timestamptz not null,
    heartbeat_at timestamptz not null
);

-- Intervals of GPU time, one per job attempt, opened at the backend's real start and
-- closed at its real stop. Billing builds on these.
create table usage_intervals (
    job_id         uuid not null constraint usage_intervals_job_id_fkey references jobs (id) on delete cascade,
    attempt        integer not null,
    team_id        uuid not null,
    gpu_class_id   uuid not null,
    priority_class text not null,
    gpus           integer not null constraint usage_intervals_gpus_check check (gpus > 0),
    fraction_milli integer not null,
    -- Ran on capacity borrowed beyond the team's reserved quota: counts in fair-share history.
    borrowing      boolean not null default false,
    started_at     timestamptz not null,
    ended_at       timestamptz,
    constraint usage_intervals_pkey primary key (job_id, attempt),
    constraint usage_intervals_order check (ended_at is null or ended_at >= started_at)
);
create index usage_intervals_team_idx on usage_intervals (team_id, started_at);
create index usage_intervals_open_idx on usage_intervals (job_id) where ended_at is null;

-- The simulated cluster's objects: what a real cluster would keep in its own store. Kept
-- in the database so that the simulation survives restarts like a real cluster does; only
-- the `sim` backend touches it, in its own statements, never in a scheduler transaction.
create table sim_objects (
    name              text primary key,
    cluster           text not null,
    job_id            uuid not null,
    attempt           integer not null,
    spec              jsonb not null,
    created_at        timestamptz not null default now(),
    -- Simulated run time in milliseconds, already divided by the speed-up factor.
    run_ms            bigint not null,
    -- Outcome when the run time is over: exit code 0 = success.
    exit_code         integer not null default 0,
    -- The node is lost after this many (scaled) milliseconds, if set.
    lost_after_ms     bigint,
    stop_requested_at timestamptz,
    grace_ms          bigint not null default 0,
    -- Time the application takes to checkpoint and exit after SIGTERM (scaled).
    checkpoint_ms     bigint not null default 0
);
create index sim_objects_cluster_idx on sim_objects (cluster);
