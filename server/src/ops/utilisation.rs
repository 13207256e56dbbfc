//! What a job's GPUs did: its attempt's DCGM activity as the leader's utilisation pass
//! recorded it (`control::utilisation`), per replica and for the job as a whole, now and over
//! the attempt. Allocation is what a job holds and is billed for; this is what it used.

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::{Error, Result};
use crate::{
    db::{self, utilisation::ReplicaRow},
    domain::{
        sizing::{self, Recommendation, Seen},
        JobId,
    },
    state::AppState,
};

/// GPU activity at one moment or over a span. Percentages are of the GPUs' capacity (SM and
/// tensor-core activity are DCGM's profiling ratios, times 100).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct Activity {
    /// Share of time a kernel ran (`DCGM_FI_DEV_GPU_UTIL`), percent. High even for a
    /// kernel that keeps one SM busy: read SM activity for how much work was done.
    pub gpu_util_percent: f64,
    /// Share of SM cycles with work resident (`DCGM_FI_PROF_SM_ACTIVE`), percent.
    pub sm_active_percent: f64,
    /// Share of cycles the tensor cores were busy (`DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`), percent.
    pub tensor_active_percent: f64,
    /// Memory used on the fullest GPU, MiB (over a span: its peak).
    pub memory_used_mib: i64,
    /// That GPU's memory, MiB.
    pub memory_total_mib: i64,
}

/// One replica's GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct ReplicaActivity {
    pub replica: i32,
    /// GPUs that reported.
    pub gpus: i32,
    pub first_sampled_at: DateTime<Utc>,
    pub sampled_at: DateTime<Utc>,
    pub samples: i32,
    /// The last sample.
    pub now: Activity,
    /// The mean of the attempt's samples; memory is the peak.
    pub attempt_mean: Activity,
}

/// A job's GPU activity.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct JobActivity {
    #[schema(value_type = uuid::Uuid)]
    pub job: JobId,
    /// The attempt described: the job's latest.
    pub attempt: i32,
    /// Whether this platform reads GPU activity at all (a Prometheus server that scrapes
    /// DCGM is configured). When it does not, nothing below is ever filled.
    pub measured: bool,
    /// When the latest sample was taken; absent before the first.
    pub sampled_at: Option<DateTime<Utc>>,
    /// The whole job at the last sample: the replicas' means weighted by their GPUs, memory
    /// of the fullest GPU.
    pub now: Option<Activity>,
    /// The whole job over the attempt: means weighted the same way, the peak memory.
    pub attempt_mean: Option<Activity>,
    /// Each replica sampled, by rank.
    pub replicas: Vec<ReplicaActivity>,
    /// A cheaper GPU class or MIG profile that would have held what the job was seen to use
    /// (its peak memory with 10% to spare, its SM activity with 25%), once it was sampled.
    pub recommendation: Option<SizingAdvice>,
}

/// Right-sizing advice for a job.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub struct SizingAdvice {
    /// The class or MIG profile that would have held it.
    pub gpu_class: String,
    /// Memory of one of its units, MiB.
    pub memory_mib: i64,
    /// Its price per unit-hour as a percentage of the job's class's.
    pub price_percent: i64,
    /// What the job has cost so far would have been this much less there, in the platform
    /// currency (a decimal with six places).
    pub saving: String,
    /// The advice in words, with the numbers.
    pub message: String,
}

/// The activity of `job`'s latest attempt, with right-sizing advice once it was sampled.
/// The caller has checked that the job is visible.
pub async fn of_job(state: &AppState, job: JobId) -> Result<JobActivity> {
    let row = db::jobs::get(&state.db, job).await?.ok_or(Error::NotFound("job"))?;
    let rows = db::utilisation::of_attempt(&state.db, job, row.attempt).await?;
    let mut activity = job_activity(job, row.attempt, state.config.reads_gpu_activity(), &rows);
    if let Some(mean) = &activity.attempt_mean {
        let seen = Seen { peak_memory_mib: mean.memory_used_mib, mean_sm_active: mean.sm_active_percent / 100.0 };
        let classes = crate::billing::statement::sizing_options(&state.db).await?;
        let current = classes.iter().find(|c| c.name == row.gpu_class);
        if let Some(advice) = current.and_then(|current| sizing::recommend(&seen, current, &classes)) {
            let cost =
                crate::billing::budgets::job_cost(&state.db, job, chrono::Utc::now(), state.config.chargeback).await?;
            activity.recommendation =
                Some(advice_of(&advice, &seen, &row.gpu_class, cost.cost_micros, &state.config.currency));
        }
    }
    Ok(activity)
}

/// Advice in words: what was seen, what would have held it, what it would have saved.
pub fn advice_of(r: &Recommendation, seen: &Seen, current: &str, cost_micros: i64, currency: &str) -> SizingAdvice {
    let saving = r.saving_of(cost_micros);
    SizingAdvice {
        gpu_class: r.class.clone(),
        memory_mib: r.memory_mib,
        price_percent: (r.price_ratio_milli + 5) / 10,
        saving: crate::metering::micros_decimal(saving),
        message: format!(
            "it used at most {:.1} GiB of memory and {:.1}% of its GPUs' SMs on {current}: {} ({:.0} GiB) would have held it at {}% of the price, {} {currency} less so far",
            seen.peak_memory_mib as f64 / 1024.0,
            seen.mean_sm_active * 100.0,
            r.class,
            r.memory_mib as f64 / 1024.0,
            (r.price_ratio_milli + 5) / 10,
            crate::metering::figures::cents(saving),
        ),
    }
}

fn replica_activity(r: &ReplicaRow) -> ReplicaActivity {
    ReplicaActivity {
        replica: r.replica,
        gpus: r.gpus,
        first_sampled_at: r.first_sampled_at,
        sampled_at: r.sampled_at,
        samples: r.samples,
        now: activity(r.gpu_util_pct, r.sm_active, r.tensor_active, r.fb_used_mib, r.fb_total_mib),
        attempt_mean: activity(
            r.mean_gpu_util_pct,
            r.mean_sm_active,
            r.mean_tensor_active,
            r.fb_used_mib_peak,
            r.fb_total_mib,
        ),
    }
}

/// Percent to one decimal, ratios as percent: what people read, and what a test can compare.
fn activity(util_pct: f64, sm: f64, tensor: f64, used: i64, total: i64) -> Activity {
    let one_decimal = |x: f64| (x * 10.0).round() / 10.0;
    Activity {
        gpu_util_percent: one_decimal(util_pct),
        sm_active_percent: one_decimal(sm * 100.0),
        tensor_active_percent: one_decimal(tensor * 100.0),
        memory_used_mib: used,
        memory_total_mib: total,
    }
}

/// The job from its replicas: each replica's figures weighted by its GPUs; memory of the
/// replica whose GPU is fullest.
fn job_activity(job: JobId, attempt: i32, measured: bool, rows: &[ReplicaRow]) -> JobActivity {
    let gpus: f64 = rows.iter().map(|r| f64::from(r.gpus.max(0))).sum();
    let weighted = |f: fn(&ReplicaRow) -> f64| {
        if gpus > 0.0 {
            rows.iter().map(|r| f(r) * f64::from(r.gpus.max(0))).sum::<f64>() / gpus
        } else {
            0.0
        }
    };
    let fullest = |f: fn(&ReplicaRow) -> i64| rows.iter().max_by_key(|r| f(r)).map(|r| (f(r), r.fb_total_mib));
    let now = fullest(|r| r.fb_used_mib).map(|(used, total)| {
        activity(weighted(|r| r.gpu_util_pct), weighted(|r| r.sm_active), weighted(|r| r.tensor_active), used, total)
    });
    let attempt_mean = fullest(|r| r.fb_used_mib_peak).map(|(peak, total)| {
        activity(
            weighted(|r| r.mean_gpu_util_pct),
            weighted(|r| r.mean_sm_active),
            weighted(|r| r.mean_tensor_active),
            peak,
            total,
        )
    });
    JobActivity {
        job,
        attempt,
        measured,
        sampled_at: rows.iter().map(|r| r.sampled_at).max(),
        now,
        attempt_mean,
        replicas: rows.iter().map(replica_activity).collect(),
        recommendation: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(replica: i32, gpus: i32, sm: f64, mean_sm: f64, used: i64, peak: i64) -> ReplicaRow {
        let at = "2026-11-28T10:00:00Z".parse().unwrap();
        ReplicaRow {
            replica,
            gpus,
            first_sampled_at: at,
            sampled_at: at,
            samples: 4,
            gpu_util_pct: sm * 100.0,
            sm_active: sm,
            tensor_active: sm / 2.0,
            fb_used_mib: used,
            fb_total_mib: 81920,
            mean_gpu_util_pct: mean_sm * 100.0,
            mean_sm_active: mean_sm,
            mean_tensor_active: mean_sm / 2.0,
            fb_used_mib_peak: peak,
        }
    }

    #[test]
    fn a_jobs_activity_weighs_each_replica_by_its_gpus_and_takes_the_fullest_gpus_memory() {
        let job = JobId::new();
        let rows = [row(0, 6, 0.02, 0.10, 9216, 20000), row(1, 2, 0.62, 0.50, 4096, 30000)];
        let a = job_activity(job, 1, true, &rows);
        let now = a.now.unwrap();
        // (6 × 2% + 2 × 62%) / 8 = 17%
        assert_eq!(now.sm_active_percent, 17.0);
        assert_eq!(now.tensor_active_percent, 8.5);
        assert_eq!((now.memory_used_mib, now.memory_total_mib), (9216, 81920));
        let mean = a.attempt_mean.unwrap();
        assert_eq!(mean.sm_active_percent, 20.0);
        assert_eq!(mean.memory_used_mib, 30000, "the peak over the attempt");
        assert_eq!(a.replicas.len(), 2);
        assert_eq!(a.replicas[0].now.sm_active_percent, 2.0);
    }

    #[test]
    fn a_job_never_sampled_has_no_activity_rather_than_zero() {
        let a = job_activity(JobId::new(), 1, false, &[]);
        assert_eq!((a.now, a.attempt_mean, a.sampled_at, a.measured), (None, None, None, false));
    }
}
