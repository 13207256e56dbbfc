-- Metering and billing: an append-only ledger of GPU time, billing periods, hourly rollups
-- with capacity and idle time, and soft-budget alerts.

-- Calendar months (UTC) finance has closed. A closed period takes no new ledger rows: late
-- usage lands in the first open period after it, marked as a correction in exports.
create table billing_periods (
    period    date primary key constraint billing_periods_first_day check (extract(day from period) = 1),
    closed_at timestamptz not null default now(),
    closed_by text not null
);

-- The first open billing period at or after the month holding `at`.
create function billing_period_for(at timestamptz) returns date language sql stable as $$
    with recursive m(p) as (
        select date_trunc('month', at at time zone 'UTC')::date
        union all
        select (m.p + interval '1 month')::date from m
        where exists (select 1 from billing_periods b where b.period = m.p)
    )
    select max(p) from m
$$;

-- One row per piece of GPU time: a stretch of one job attempt within one UTC hour and under
-- one rate. Rows are never changed: a correction is a new row that references the row it
-- corrects and says why. The ledger outlives jobs and teams (no foreign keys), so a bill can
-- always be reproduced; names are copied for the same reason.
create table usage_ledger (
    id                       bigint generated always as identity primary key,
    -- `usage` of a job attempt, a `correction` of a usage row, or, under the
    -- reserved-plus-burst chargeback model, the hourly charge for a team's `reservation`.
    kind                     text not null
                             constraint usage_ledger_kind_check check (kind in ('usage', 'correction', 'reservation')),
    corrects                 bigint constraint usage_ledger_corrects_fkey references usage_ledger (id),
    reason                   text,
    job_id                   uuid,
    attempt                  integer,
    job_name                 text,
    team_id                  uuid not null,
    team_name                text not null,
    gpu_class_id             uuid not null,
    gpu_class                text not null,
    priority_class           text not null,
    gpus                     integer not null constraint usage_ledger_gpus_check check (gpus > 0),
    fraction_milli           integer not null constraint usage_ledger_fraction_check check (fraction_milli between 1 and 1000),
    borrowing                boolean not null,
    -- The piece, whole milliseconds, within one UTC hour. A correction repeats the corrected
    -- piece's span and carries the (negative) difference in the amounts below.
    charge_start             timestamptz not null,
    charge_end               timestamptz not null,
    duration_ms              bigint not null,
    -- gpus × fraction_milli × duration_ms: physical GPU-milliseconds in thousandths.
    gpu_milli_ms             bigint not null,
    rate_micros_per_gpu_hour bigint not null,
    price_multiplier_milli   integer not null,
    -- At the rate card's price; billed applies the priority class's multiplier.
    list_cost_micros         bigint not null,
    billed_cost_micros       bigint not null,
    currency                 text not null,
    billing_period           date not null,
    labels                   jsonb not null default '{}',
    recorded_at              timestamptz not null default now(),
    constraint usage_ledger_correction_refers check ((kind = 'correction') = (corrects is not null)),
    constraint usage_ledger_job_unless_reservation check (
        (kind = 'reservation') = (job_id is null) and (job_id is null) = (attempt is null)
        and (job_id is null) = (job_name is null)),
    constraint usage_ledger_within_an_hour check (
        charge_end > charge_start and date_trunc('hour', charge_start, 'UTC') = date_trunc('hour', charge_end - interval '1 microsecond', 'UTC'))
);
-- Re-delivered events cannot count twice: one piece per attempt and start, one correction
-- per corrected piece.
create unique index usage_ledger_piece_key on usage_ledger (job_id, attempt, charge_start) where kind = 'usage';
create unique index usage_ledger_correction_key on usage_ledger (corrects) where kind = 'correction';
create unique index usage_ledger_reservation_key on usage_ledger (team_id, gpu_class_id, charge_start)
    where kind = 'reservation';
create index usage_ledger_period_idx on usage_ledger (billing_period, id);
create index usage_ledger_team_idx on usage_ledger (team_id, charge_start);
create index usage_ledger_hour_idx on usage_ledger (charge_start);

-- Append-only for every role. Grants alone cannot bind the table's owner (the role the
-- service migrates and runs as), so a trigger refuses changes whoever asks; the revoke
-- covers any other role given access.
create function usage_ledger_append_only() returns trigger language plpgsql as $$
begin
    raise exception 'usage_ledger is append-only: % is not allowed; record a correction instead', tg_op
        using errcode = 'insufficient_privilege';
end
$$;
create trigger usage_ledger_no_change before update or delete on usage_ledger
    for each row execute function usage_ledger_append_only();
create trigger usage_ledger_no_truncate before truncate on usage_ledger
    for each statement execute function usage_ledger_append_only();
revoke update, delete, truncate on usage_ledger from public;

-- Each team's reserved quota over time, for the reserved-plus-burst chargeback model:
-- written with every quota change, in its transaction.
create table quota_history (
    team_id        uuid not null constraint quota_history_team_id_fkey references teams (id) on delete cascade,
    gpu_class_id   uuid not null constraint quota_history_gpu_class_id_fkey references gpu_classes (id) on delete cascade,
    effective_from timestamptz not null,
    reserved       integer not null constraint quota_history_reserved_check check (reserved >= 0),
    constraint quota_history_pkey primary key (team_id, gpu_class_id, effective_from)
);
insert into quota_history (team_id, gpu_class_id, effective_from, reserved)
select team_id, gpu_class_id, date_trunc('milliseconds', updated_at), reserved from quotas;

-- Schedulable units of each class across all clusters, effective-dated: written by inventory
-- syncs when the total changes, read to report capacity and idle time per hour.
create table capacity_history (
    gpu_class_id   uuid not null constraint capacity_history_gpu_class_id_fkey references gpu_classes (id) on delete cascade,
    effective_from timestamptz not null,
    gpus           integer not null constraint capacity_history_gpus_check check (gpus >= 0),
    constraint capacity_history_pkey primary key (gpu_class_id, effective_from)
);

-- Per hour, team, class and priority class: what the ledger holds (corrections in the hour
-- they correct). Recomputed whole for an hour from the ledger, so recomputing is harmless.
create table usage_rollups (
    hour               timestamptz not null,
    team_id            uuid not null,
    gpu_class_id       uuid not null,
    priority_class     text not null,
    gpu_milli_ms       bigint not null,
    billed_cost_micros bigint not null,
    constraint usage_rollups_pkey primary key (hour, team_id, gpu_class_id, priority_class)
);
create index usage_rollups_team_idx on usage_rollups (team_id, hour);

-- Per hour and class: capacity, allocated (the ledger) and idle, in the ledger's unit;
-- allocated + idle = capacity.
create table class_hours (
    hour               timestamptz not null,
    gpu_class_id       uuid not null,
    capacity_milli_ms  bigint not null,
    allocated_milli_ms bigint not null,
    idle_milli_ms      bigint not null,
    constraint class_hours_pkey primary key (hour, gpu_class_id),
    constraint class_hours_sum check (allocated_milli_ms + idle_milli_ms = capacity_milli_ms)
);

-- Hours whose rollups are stale: written with the ledger rows in the same transaction, taken
-- by the rollup pass in the transaction that recomputes them, so no row is ever missed.
-- Deliberately without a unique key: writers marking the same hour never wait on each other
-- (a unique key would make two metering transactions queue, and deadlock, on one hour).
create table rollup_dirty_hours (
    hour timestamptz not null
);
create index rollup_dirty_hours_hour_idx on rollup_dirty_hours (hour);

-- Where the metering pass's work starts: `reservations_from` (reservation charges are booked
-- from the hour the reserved-plus-burst model was first on, never back in time) and
-- `class_hours_to` (capacity rows exist for every completed hour before it).
create table metering_state (
    key text primary key,
    at  timestamptz not null
);

-- Soft-budget (and hard-budget) alerts: each threshold of each team's period once.
create table budget_alerts (
    team_id      uuid not null constraint budget_alerts_team_id_fkey references teams (id) on delete cascade,
    period       date not null,
    threshold    integer not null constraint budget_alerts_threshold_check check (threshold in (50, 80, 100)),
    spent        bigint not null,
    amount       bigint not null,
    unit         text not null,
    raised_at    timestamptz not null default now(),
    constraint budget_alerts_pkey primary key (team_id, period, threshold)
);
