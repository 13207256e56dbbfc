-- What a job's replicas get beyond GPUs: CPU and memory per replica, and the rest of the
-- spec the backends carry (volumes, secret references, image pull secrets, a node
-- selector). Fairway stores references to secrets only, never their values.

-- The CPU and memory a replica gets per GPU of the class when its job names none; null:
-- the platform's default (`domain::workload`).
alter table gpu_classes
    add column cpu_millis_per_gpu integer
        constraint gpu_classes_cpu_millis_per_gpu_check check (cpu_millis_per_gpu between 1 and 1024000),
    add column memory_mib_per_gpu integer
        constraint gpu_classes_memory_mib_per_gpu_check check (memory_mib_per_gpu between 1 and 16777216);

-- Per replica, resolved at submission (the job's own or its class's default); null for jobs
-- submitted before this migration, which ask their backend for no CPU or memory.
alter table jobs
    add column cpu_millis integer constraint jobs_cpu_millis_check check (cpu_millis > 0),
    add column memory_mib integer constraint jobs_memory_mib_check check (memory_mib > 0),
    -- `domain::workload::Workload` as JSON: volumes, secret references, image pull secrets,
    -- node selector; validated before it is stored.
    add column workload jsonb not null default '{}'
        constraint jobs_workload_check check (jsonb_typeof(workload) = 'object');
