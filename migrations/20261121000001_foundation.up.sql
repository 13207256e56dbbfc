-- Foundation: users, teams and their members, API tokens, GPU classes and their
-- effective-dated rates, quotas, priority classes, budgets, the audit log and
-- idempotency records. Enumerations are text with named check constraints, so a
-- violation maps to a clear client error and new values need no type migration.

create table users (
    id            uuid primary key,
    username      text not null constraint users_username_key unique,
    password_hash text not null,
    platform_role text constraint users_platform_role_check
                  check (platform_role in ('platform-admin', 'finance')),
    disabled      boolean not null default false,
    created_at    timestamptz not null default now(),
    updated_at    timestamptz not null default now(),
    version       bigint not null default 1
);

create table teams (
    id           uuid primary key,
    name         text not null constraint teams_name_key unique,
    parent_id    uuid constraint teams_parent_id_fkey references teams (id),
    display_name text not null default '',
    created_at   timestamptz not null default now(),
    updated_at   timestamptz not null default now(),
    version      bigint not null default 1
);
create index teams_parent_id_idx on teams (parent_id);

create table team_members (
    team_id    uuid not null constraint team_members_team_id_fkey references teams (id) on delete cascade,
    user_id    uuid not null constraint team_members_user_id_fkey references users (id) on delete cascade,
    role       text not null constraint team_members_role_check check (role in ('admin', 'member', 'viewer')),
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now(),
    constraint team_members_pkey primary key (team_id, user_id)
);
create index team_members_user_id_idx on team_members (user_id);

create table api_tokens (
    id             uuid primary key,
    team_id        uuid not null constraint api_tokens_team_id_fkey references teams (id) on delete cascade,
    name           text not null,
    role           text not null constraint api_tokens_role_check check (role in ('admin', 'member', 'viewer')),
    -- SHA-256 of the whole secret; the secret itself is never stored.
    token_hash     bytea not null constraint api_tokens_token_hash_key unique,
    display_prefix text not null,
    created_by     uuid constraint api_tokens_created_by_fkey references users (id) on delete set null,
    created_at     timestamptz not null default now(),
    expires_at     timestamptz not null,
    last_used_at   timestamptz,
    revoked_at     timestamptz
);
create index api_tokens_team_id_idx on api_tokens (team_id, created_at);

create table gpu_classes (
    id             uuid primary key,
    name           text not null constraint gpu_classes_name_key unique,
    kind           text not null constraint gpu_classes_kind_check check (kind in ('whole', 'mig', 'time-slice')),
    memory_mib     integer not null constraint gpu_classes_memory_mib_check check (memory_mib > 0),
    -- Share of one physical GPU in thousandths: 1000 for a whole GPU, 428 for a 3g MIG slice of 7.
    fraction_milli integer not null constraint gpu_classes_fraction_milli_check
                   check (fraction_milli between 1 and 1000),
    description    text not null default '',
    created_at     timestamptz not null default now(),
    updated_at     timestamptz not null default now(),
    version        bigint not null default 1,
    constraint gpu_classes_whole_is_one_gpu check (kind <> 'whole' or fraction_milli = 1000)
);

create table gpu_class_rates (
    gpu_class_id             uuid not null constraint gpu_class_rates_gpu_class_id_fkey
                             references gpu_classes (id) on delete cascade,
    effective_from           timestamptz not null,
    -- Money is integer micro-units of the platform currency, per GPU-hour of this class.
    rate_micros_per_gpu_hour bigint not null constraint gpu_class_rates_rate_check
                             check (rate_micros_per_gpu_hour >= 0),
    created_at               timestamptz not null default now(),
    constraint gpu_class_rates_pkey primary key (gpu_class_id, effective_from)
);

create table quotas (
    team_id      uuid not null constraint quotas_team_id_fkey references teams (id) on delete cascade,
    gpu_class_id uuid not null constraint quotas_gpu_class_id_fkey references gpu_classes (id) on delete cascade,
    reserved     integer not null constraint quotas_reserved_check check (reserved >= 0),
    burst        integer not null constraint quotas_burst_check check (burst >= 0),
    -- How much of `reserved` others may borrow while it is idle; null means all of it.
    lendable     integer constraint quotas_lendable_check check (lendable >= 0 and lendable <= reserved),
    created_at   timestamptz not null default now(),
    updated_at   timestamptz not null default now(),
    version      bigint not null default 1,
    constraint quotas_pkey primary key (team_id, gpu_class_id)
);
create index quotas_gpu_class_id_idx on quotas (gpu_class_id);

create table priority_classes (
    name                   text primary key,
    priority               integer not null,
    preemptible            boolean not null,
    -- Fair-share usage factor and price multiplier, both in thousandths (1000 = 1.0).
    usage_factor_milli     integer not null constraint priority_classes_usage_factor_check
                           check (usage_factor_milli between 0 and 10000),
    price_multiplier_milli integer not null constraint priority_classes_price_multiplier_check
                           check (price_multiplier_milli between 0 and 100000),
    description            text not null default '',
    created_at             timestamptz not null default now(),
    updated_at             timestamptz not null default now(),
    version                bigint not null default 1
);

insert into priority_classes (name, priority, preemptible, usage_factor_milli, price_multiplier_milli, description) values
    ('serving',    1000, false, 1000, 1250, 'Online inference: never preempted, billed at a premium.'),
    ('production',  500, false, 1000, 1000, 'Scheduled production training and batch work.'),
    ('experiment',  100, true,   750,  800, 'Research runs that may be preempted and requeued.'),
    ('scavenger',     0, true,   250,  300, 'Opportunistic use of idle GPUs, first to be preempted.');

create table budgets (
    team_id     uuid not null constraint budgets_team_id_fkey references teams (id) on delete cascade,
    -- First day of the budget's calendar month (UTC).
    period      date not null constraint budgets_period_check check (extract(day from period) = 1),
    unit        text not null constraint budgets_unit_check check (unit in ('gpu-hours', 'money')),
    -- GPU-hours, or micro-units of the platform currency.
    amount      bigint not null constraint budgets_amount_check check (amount >= 0),
    enforcement text not null constraint budgets_enforcement_check check (enforcement in ('hard', 'soft')),
    created_at  timestamptz not null default now(),
    updated_at  timestamptz not null default now(),
    version     bigint not null default 1,
    constraint budgets_pkey primary key (team_id, period)
);

-- Append-only record of every change. The team is kept without a foreign key so the
-- history of a deleted team survives it.
create table audit_log (
    id          bigint generated always as identity primary key,
    at          timestamptz not null default now(),
    actor       text not null,
    action      text not null,
    object_type text not null,
    object_id   text not null,
    team_id     uuid,
    before      jsonb,
    after       jsonb
);
create index audit_log_team_id_idx on audit_log (team_id, id);

create table idempotency_keys (
    principal        text not null,
    key              text not null,
    method           text not null,
    path             text not null,
    request_hash     bytea not null,
    -- Null while the first request with this key is still being handled.
    response_status  integer,
    response_headers jsonb,
    response_body    bytea,
    created_at       timestamptz not null default now(),
    constraint idempotency_keys_pkey primary key (principal, key)
);
create index idempotency_keys_created_at_idx on idempotency_keys (created_at);

-- Places jobs run and the GPUs they hold, per class. Backends keep `capacity` current from
-- their inventory; admins may also declare it. Quota validation warns when reserved quota
-- exceeds what the platform knows of.
create table clusters (
    id         uuid primary key,
    name       text not null constraint clusters_name_key unique,
    backend    text not null constraint clusters_backend_check
               check (backend in ('sim', 'kubernetes', 'aws-batch', 'gcp-batch')),
    created_at timestamptz not null default now(),
    updated_at timestamptz not null default now(),
    version    bigint not null default 1
);

create table cluster_capacity (
    cluster_id   uuid not null constraint cluster_capacity_cluster_id_fkey references clusters (id) on delete cascade,
    gpu_class_id uuid not null constraint cluster_capacity_gpu_class_id_fkey references gpu_classes (id) on delete cascade,
    gpus         integer not null constraint cluster_capacity_gpus_check check (gpus >= 0),
    constraint cluster_capacity_pkey primary key (cluster_id, gpu_class_id)
);
