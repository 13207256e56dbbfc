-- What each replica's GPUs did, read from NVIDIA DCGM through Prometheus
-- (`control::utilisation`): the last sample, and running sums over the attempt, so a job's
-- activity now and over its life is one row per replica, not one per sample.
create table replica_utilisation (
    job_id            uuid not null constraint replica_utilisation_job_id_fkey references jobs (id) on delete cascade,
    attempt           int4 not null,
    replica           int4 not null,
    -- GPUs of the replica that reported in the last sample.
    gpus              int4 not null,
    first_sampled_at  timestamptz not null,
    sampled_at        timestamptz not null,
    samples           int4 not null check (samples >= 1),
    -- The last sample: percent (0-100), ratios (0-1), MiB of the replica's fullest GPU.
    gpu_util_pct      float8 not null,
    sm_active         float8 not null,
    tensor_active     float8 not null,
    fb_used_mib       int8 not null,
    fb_total_mib      int8 not null,
    -- Over the attempt: sums of the samples (a mean is a sum over `samples`), the peak memory.
    gpu_util_pct_sum  float8 not null,
    sm_active_sum     float8 not null,
    tensor_active_sum float8 not null,
    fb_used_mib_peak  int8 not null,
    primary key (job_id, attempt, replica)
);
