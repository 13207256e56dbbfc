-- GPU health from DCGM's fields as a Prometheus server keeps dcgm-exporter's series.
--
-- The last value each GPU's health field read. DCGM keeps an XID in its gauge until the
-- driver reloads or the exporter restarts, so a fault is a change of value, not a value: a
-- GPU opens a fault once when its field changes to one that is a fault, and a fault an
-- operator cleared does not open again while the gauge still holds the old XID.
create table gpu_health_reads (
    host    text not null,
    gpu     text not null,
    field   text not null,
    value   float8 not null,
    read_at timestamptz not null,
    primary key (host, gpu, field)
);

-- GPUs whose DCGM fields report a fault. Their node offers nothing, and the gangs on it are
-- lost from `since`, until a platform admin clears the fault: sticky, as the failures they
-- report (a double-bit ECC error, a GPU fallen off the bus) need a person to reset or
-- replace the GPU.
create table gpu_faults (
    cluster_id uuid not null constraint gpu_faults_cluster_id_fkey references clusters (id) on delete cascade,
    node       text not null,
    gpu        text not null,
    since      timestamptz not null,
    why        text not null,
    opened_at  timestamptz not null default now(),
    primary key (cluster_id, node, gpu)
);
