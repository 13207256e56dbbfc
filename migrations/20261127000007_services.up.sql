-- Inference services: a workload of independent replicas (not a gang) with no maximum
-- runtime, kept at `replicas` between `min_replicas` and `max_replicas` by the leader's
-- service pass. Each replica is a job of its own (one replica of `gpus_per_replica` GPUs),
-- so it is queued, admitted, placed, preempted, metered and billed as every job is. The
-- service row holds the replica template the pass creates them from; `revision` counts the
-- changes of what replicas run (image, command, environment) that a rolling update carries
-- to every replica.
create table services (
    id             uuid primary key,
    team_id        uuid not null constraint services_team_id_fkey references teams (id) on delete cascade,
    name           text not null,
    min_replicas   int4 not null constraint services_min_replicas_check check (min_replicas between 1 and 64),
    max_replicas   int4 not null constraint services_max_replicas_check check (max_replicas between min_replicas and 64),
    replicas       int4 not null,
    constraint services_replicas_check check (replicas = 0 and deleted_at is not null
                                              or replicas between min_replicas and max_replicas),
    port           int4 not null constraint services_port_check check (port between 1 and 65535),
    revision       int4 not null default 1,
    -- The validated replica: class, GPUs, image, command, environment, resources, priority
    -- classes, restart budget (domain::service::Template).
    template       jsonb not null,
    -- The replica as it was asked for (ops::services::ReplicaSpec), checked again whole when
    -- an update changes part of it.
    replica_spec   jsonb not null,
    created_by     text not null,
    created_at     timestamptz not null default now(),
    -- The last change of its size or revision: a replica that ended for good before it
    -- is started again; one that ended after it leaves its slot empty (the restart budget).
    changed_at     timestamptz not null default now(),
    deleted_at     timestamptz,
    version        int8 not null default 1,
    seq            bigserial not null
);
-- A name is taken while the service lives; a deleted one keeps its rows for the bills.
create unique index services_team_id_name_idx on services (team_id, name) where deleted_at is null;
create index services_team_id_seq_idx on services (team_id, seq);

-- Where a service can be reached on each cluster its replicas were dispatched to.
create table service_endpoints (
    service_id uuid not null constraint service_endpoints_service_id_fkey references services (id) on delete cascade,
    cluster_id uuid not null constraint service_endpoints_cluster_id_fkey references clusters (id) on delete cascade,
    address    text not null,
    primary key (service_id, cluster_id)
);

alter table jobs add column service_id uuid
    constraint jobs_service_id_fkey references services (id) on delete cascade;
alter table jobs add column service_slot int4;
alter table jobs add column service_revision int4;
alter table jobs add constraint jobs_service_replica_check
    check ((service_id is null) = (service_slot is null) and (service_id is null) = (service_revision is null));
-- A service's replicas, for the pass and the service's page.
create index jobs_service_id_slot_idx on jobs (service_id, service_slot) where service_id is not null;
-- A replica has no maximum runtime: it is stored as the largest value the column holds.
alter table jobs drop constraint jobs_max_runtime_check;
alter table jobs add constraint jobs_max_runtime_check
    check (max_runtime_seconds between 1 and 2592000 or service_id is not null and max_runtime_seconds = 2147483647);
