//! What jobs' GPUs did (`replica_utilisation`): per replica, the last sample read from DCGM
//! and running sums over the attempt.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::Tx;
use crate::domain::JobId;

/// One replica's sample, as `backends::dcgm` reads it.
pub type Sample = crate::domain::activity::ReplicaActivity;

/// Adds `samples`, taken at `at`, to their replicas' rows. A sample of an attempt that is
/// not running (it ended, or the series outlived it in Prometheus) is dropped. Returns the
/// replicas recorded.
pub async fn record(tx: &mut Tx<'_>, samples: &[Sample], at: DateTime<Utc>) -> Result<u64, sqlx::Error> {
    if samples.is_empty() {
        return Ok(0);
    }
    let column = |f: fn(&Sample) -> f64| samples.iter().map(f).collect::<Vec<_>>();
    let ids: Vec<JobId> = samples.iter().map(|s| s.job_id).collect();
    let attempts: Vec<i32> = samples.iter().map(|s| s.attempt).collect();
    let replicas: Vec<i32> = samples.iter().map(|s| s.replica).collect();
    let gpus: Vec<i32> = samples.iter().map(|s| s.gpus).collect();
    let used: Vec<i64> = samples.iter().map(|s| s.fb_used_mib).collect();
    let total: Vec<i64> = samples.iter().map(|s| s.fb_total_mib).collect();
    let done = sqlx::query!(
        "insert into replica_utilisation as r
             (job_id, attempt, replica, gpus, first_sampled_at, sampled_at, samples, gpu_util_pct, sm_active,
              tensor_active, fb_used_mib, fb_total_mib, gpu_util_pct_sum, sm_active_sum, tensor_active_sum,
              fb_used_mib_peak)
         select u.id, u.attempt, u.replica, u.gpus, $10, $10, 1, u.util, u.sm, u.tensor, u.used, u.total,
                u.util, u.sm, u.tensor, u.used
         from unnest($1::uuid[], $2::int4[], $3::int4[], $4::int4[], $5::float8[], $6::float8[], $7::float8[],
                     $8::int8[], $9::int8[]) as u(id, attempt, replica, gpus, util, sm, tensor, used, total)
         join jobs j on j.id = u.id and j.attempt = u.attempt and j.state = 'running'
         on conflict (job_id, attempt, replica) do update set
             gpus = excluded.gpus, sampled_at = excluded.sampled_at, samples = r.samples + 1,
             gpu_util_pct = excluded.gpu_util_pct, sm_active = excluded.sm_active,
             tensor_active = excluded.tensor_active, fb_used_mib = excluded.fb_used_mib,
             fb_total_mib = excluded.fb_total_mib,
             gpu_util_pct_sum = r.gpu_util_pct_sum + excluded.gpu_util_pct,
             sm_active_sum = r.sm_active_sum + excluded.sm_active,
             tensor_active_sum = r.tensor_active_sum + excluded.tensor_active,
             fb_used_mib_peak = greatest(r.fb_used_mib_peak, excluded.fb_used_mib)
         where r.sampled_at < excluded.sampled_at",
        &ids as &[JobId],
        &attempts,
        &replicas,
        &gpus,
        &column(|s| s.gpu_util_pct),
        &column(|s| s.sm_active),
        &column(|s| s.tensor_active),
        &used,
        &total,
        at
    )
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected())
}

/// One replica's activity: the last sample and the attempt's means.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaRow {
    pub replica: i32,
    pub gpus: i32,
    pub first_sampled_at: DateTime<Utc>,
    pub sampled_at: DateTime<Utc>,
    pub samples: i32,
    pub gpu_util_pct: f64,
    pub sm_active: f64,
    pub tensor_active: f64,
    pub fb_used_mib: i64,
    pub fb_total_mib: i64,
    pub mean_gpu_util_pct: f64,
    pub mean_sm_active: f64,
    pub mean_tensor_active: f64,
    pub fb_used_mib_peak: i64,
}

/// The replicas of `job`'s attempt `attempt` that have been sampled, by rank.
pub async fn of_attempt(pool: &PgPool, job: JobId, attempt: i32) -> Result<Vec<ReplicaRow>, sqlx::Error> {
    sqlx::query_as!(
        ReplicaRow,
        r#"select replica, gpus, first_sampled_at, sampled_at, samples, gpu_util_pct, sm_active, tensor_active,
                  fb_used_mib, fb_total_mib,
                  gpu_util_pct_sum / samples as "mean_gpu_util_pct!",
                  sm_active_sum / samples as "mean_sm_active!",
                  tensor_active_sum / samples as "mean_tensor_active!",
                  fb_used_mib_peak
           from replica_utilisation where job_id = $1 and attempt = $2 order by replica"#,
        job as JobId,
        attempt
    )
    .fetch_all(pool)
    .await
}

/// A team's billed GPU time in billing period `period` whose activity was measured, and that
/// time weighted by each job's mean SM activity (over its sampled replicas and attempts):
/// (measured, effective), GPU-thousandths × milliseconds.
pub async fn effective_in_period(
    pool: &PgPool,
    team_id: crate::domain::TeamId,
    period: chrono::NaiveDate,
) -> Result<(i64, i64), sqlx::Error> {
    let row = sqlx::query!(
        r#"with used as (
               select job_id, sum(gpu_milli_ms)::int8 as used
               from usage_ledger where team_id = $1 and billing_period = $2 and job_id is not null
               group by job_id
           ), activity as (
               select r.job_id, sum(r.sm_active_sum * r.gpus) / nullif(sum(r.samples * r.gpus), 0) as sm
               from replica_utilisation r where r.job_id in (select job_id from used)
               group by r.job_id
           )
           select coalesce(sum(u.used), 0)::int8 as "measured!",
                  coalesce(sum(round(u.used * a.sm)), 0)::int8 as "effective!"
           from used u join activity a on a.job_id = u.job_id
           where a.sm is not null"#,
        team_id as crate::domain::TeamId,
        period
    )
    .fetch_one(pool)
    .await?;
    Ok((row.measured, row.effective))
}

/// What the jobs of one name, on one GPU class, were seen to do in a billing period.
#[derive(Debug, Clone, PartialEq)]
pub struct NameSizing {
    pub job_name: String,
    pub gpu_class: String,
    /// Jobs of that name and class billed in the period whose activity was measured.
    pub jobs: i64,
    /// What they were billed in the period, micro-units.
    pub billed_cost_micros: i64,
    /// The most memory any of their GPUs used, MiB.
    pub peak_memory_mib: i64,
    /// Their SM activity, mean over their samples weighted by GPUs (ratio).
    pub mean_sm_active: f64,
}

/// A team's measured jobs of billing period `period`, by job name and class, costliest first.
pub async fn sizing_by_job_name(
    pool: &PgPool,
    team_id: crate::domain::TeamId,
    period: chrono::NaiveDate,
) -> Result<Vec<NameSizing>, sqlx::Error> {
    sqlx::query_as!(
        NameSizing,
        r#"with billed as (
               select job_id, min(job_name) as job_name, min(gpu_class) as gpu_class,
                      sum(billed_cost_micros)::int8 as cost
               from usage_ledger where team_id = $1 and billing_period = $2 and job_id is not null
               group by job_id
           ), activity as (
               select r.job_id, max(r.fb_used_mib_peak) as peak, sum(r.sm_active_sum * r.gpus) as sm_weighted,
                      sum(r.samples * r.gpus) as weight
               from replica_utilisation r where r.job_id in (select job_id from billed)
               group by r.job_id
           )
           select b.job_name as "job_name!", b.gpu_class as "gpu_class!", count(*) as "jobs!",
                  sum(b.cost)::int8 as "billed_cost_micros!", max(a.peak)::int8 as "peak_memory_mib!",
                  (sum(a.sm_weighted) / nullif(sum(a.weight), 0))::float8 as "mean_sm_active!"
           from billed b join activity a on a.job_id = b.job_id
           where a.weight > 0
           group by b.job_name, b.gpu_class
           order by 4 desc, 1, 2"#,
        team_id as crate::domain::TeamId,
        period
    )
    .fetch_all(pool)
    .await
}
