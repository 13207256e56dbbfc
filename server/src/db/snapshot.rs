//! The scheduler's view of the world, read in one repeatable-read transaction: classes and
//! rates, teams, quotas, priority classes, and the live jobs (kept between cycles, only
//! changed rows read again).

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgPool;

use super::inventory::NodeRow;
use crate::domain::{ClusterId, GpuClassId, JobId, JobState, TeamId};

/// A GPU class with its rate now.
pub struct ClassRow {
    pub id: GpuClassId,
    pub name: String,
    pub rate: i64,
    pub fraction_milli: i32,
}

/// A team with its weight.
pub struct TeamRow {
    pub id: TeamId,
    pub name: String,
    pub parent_id: Option<TeamId>,
    pub fair_share_weight_milli: i32,
}

/// A quota.
pub struct QuotaRow {
    pub team_id: TeamId,
    pub gpu_class_id: GpuClassId,
    pub reserved: i32,
    pub burst: i32,
    pub lendable: Option<i32>,
}

/// A priority class.
pub struct PriorityRow {
    pub name: String,
    pub priority: i32,
    pub preemptible: bool,
    pub usage_factor_milli: i32,
    pub price_multiplier_milli: i32,
    pub preemption_grace_seconds: i32,
    pub preemption_delay_seconds: i32,
}

/// A job the engine must know of: pending, or holding GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveJob {
    pub id: JobId,
    pub seq: i64,
    pub team_id: TeamId,
    /// What runtime history knows it by, with its team.
    pub name: String,
    pub gpu_class_id: GpuClassId,
    pub priority_class: String,
    pub replicas: i32,
    pub gpus_per_replica: i32,
    /// An elastic gang's most replicas; `None`: a fixed gang.
    pub max_replicas: Option<i32>,
    /// The elastic gang it is an extra replica of.
    pub extra_of: Option<JobId>,
    pub topology_mode: String,
    pub topology_level: Option<String>,
    pub max_runtime_seconds: i32,
    /// The runtime it declared it expects, if any: the median of its runtime forecast.
    pub expected_runtime_seconds: Option<i32>,
    pub preemption_grace_seconds: Option<i32>,
    /// Its own preemption delay, overriding its priority class's.
    pub preemption_delay_seconds: Option<i32>,
    pub state: JobState,
    pub attempt: i32,
    pub holds_gpus: bool,
    pub cluster_id: Option<ClusterId>,
    pub placement: Option<Value>,
    pub submitted_at: DateTime<Utc>,
    pub queued_at: DateTime<Utc>,
    pub admitted_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub last_checkpoint_at: Option<DateTime<Utc>>,
    /// How long it ran in its earlier attempts (ms), its current one not counted.
    pub attained_ms: i64,
    /// The reason last recorded while it waits.
    pub pending_reason: Option<String>,
    pub allow_spot: bool,
    /// The least driver and CUDA version its nodes must run, as submitted.
    pub min_driver_version: Option<String>,
    pub min_cuda_version: Option<String>,
    /// CPU (thousandths of a core) and memory (MiB) per replica; `None` for jobs from before
    /// they were recorded, which ask for none.
    pub cpu_millis: Option<i32>,
    pub memory_mib: Option<i32>,
    /// Held back before the engine: it still waits for jobs it depends on, or its array's
    /// parallelism holds it. The engine does not see it until the leader's dependency or
    /// array pass releases it (`control::dependencies`, `control::arrays`).
    pub held: bool,
    /// A service's replica: it keeps no progress that a preemption could lose.
    pub service_replica: bool,
    /// It runs on nodes only, never in a cloud pool: a service's replica, or a job that
    /// needs Kubernetes (claims, Kubernetes Secrets, pull secrets, a node selector).
    pub fixed_nodes_only: bool,
}

/// Everything a snapshot is built from, read in one repeatable-read transaction.
pub struct SnapshotRows {
    pub now: DateTime<Utc>,
    pub classes: Vec<ClassRow>,
    pub nodes: Vec<NodeRow>,
    pub teams: Vec<TeamRow>,
    pub quotas: Vec<QuotaRow>,
    pub priorities: Vec<PriorityRow>,
    /// Decayed borrowed usage in money per team (see `fairshare`).
    pub history: Vec<(TeamId, f64)>,
    /// Ordered by `seq`.
    pub jobs: Vec<Arc<LiveJob>>,
}

impl LiveJob {
    /// Whether the engine must know of the job: it waits (for admission, not for jobs it
    /// depends on), or holds GPUs.
    fn is_live(&self) -> bool {
        (self.state == JobState::Pending && !self.held)
            || matches!(self.state, JobState::Admitted | JobState::Running)
            || self.holds_gpus
    }
}

/// The live jobs as of the last snapshot, which the leader keeps between cycles: with ten
/// thousand jobs queued, reading them all took most of a cycle, while a cycle changes only
/// a few. A default (empty) copy makes the next [`snapshot_rows`] read every live job.
#[derive(Default)]
pub struct LiveJobs {
    by_id: HashMap<JobId, Arc<LiveJob>>,
    /// The xmin of the snapshot the copy is exact for; `None` before the first read.
    xmin: Option<i64>,
}

impl LiveJobs {
    /// Records the pending reasons a cycle wrote, which do not mark the rows changed
    /// (`changed_in`), so that the copy stays exact.
    pub fn set_pending_reasons<'a>(&mut self, reasons: impl IntoIterator<Item = (JobId, &'a str)>) {
        for (id, reason) in reasons {
            if let Some(job) = self.by_id.get_mut(&id) {
                if job.state == JobState::Pending && job.pending_reason.as_deref() != Some(reason) {
                    Arc::make_mut(job).pending_reason = Some(reason.to_owned());
                }
            }
        }
    }

    fn apply(&mut self, rows: Vec<LiveJob>) {
        for job in rows {
            if job.is_live() {
                self.by_id.insert(job.id, Arc::new(job));
            } else {
                self.by_id.remove(&job.id);
            }
        }
    }

    fn sorted(&self) -> Vec<Arc<LiveJob>> {
        let mut jobs: Vec<Arc<LiveJob>> = self.by_id.values().cloned().collect();
        jobs.sort_unstable_by_key(|j| j.seq);
        jobs
    }
}

/// A query for [`LiveJob`]s: the one column list from `jobs`, followed by `$rest` (the
/// where clause) and its arguments.
macro_rules! select_live_jobs {
    ($rest:tt $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            LiveJob,
            r#"select id, seq, team_id, name, gpu_class_id, priority_class, replicas, gpus_per_replica,
                      max_replicas, extra_of as "extra_of: JobId", topology_mode,
                      topology_level, max_runtime_seconds, expected_runtime_seconds, preemption_grace_seconds, preemption_delay_seconds, state as "state: JobState",
                      attempt, holds_gpus, cluster_id as "cluster_id: ClusterId", placement, submitted_at, queued_at, admitted_at, started_at,
                      last_checkpoint_at, attained_ms, pending_reason, allow_spot, min_driver_version, min_cuda_version,
                      cpu_millis, memory_mib,
                      (waits_for_dependencies or held_by_array) as "held!",
                      service_id is not null as "service_replica!",
                      (service_id is not null
                       or workload ?| array['volumes', 'secret_env', 'image_pull_secrets', 'node_selector'])
                          as "fixed_nodes_only!"
               from jobs
               "# + $rest
            $(, $arg)*
        )
    };
}

/// Reads the scheduler's view of the world at one instant. Of the jobs, only those changed
/// since `live` was last brought up to date are read (every live job when it is empty), and
/// `live` is brought up to date.
pub async fn snapshot_rows(
    pool: &PgPool,
    half_life_seconds: f64,
    live: &mut LiveJobs,
) -> Result<SnapshotRows, sqlx::Error> {
    let mut tx = super::read_snapshot(pool).await?;
    // The first query fixes the transaction's snapshot; its xmin is where the next read of
    // changed jobs starts (see the migration that adds `jobs.changed_in`).
    let at = sqlx::query!(r#"select now() as "now!", pg_snapshot_xmin(pg_current_snapshot())::text::int8 as "xmin!""#)
        .fetch_one(&mut *tx)
        .await?;
    let now = at.now;
    let classes = sqlx::query_as!(
        ClassRow,
        r#"select c.id, c.name, c.fraction_milli,
                  coalesce((select r.rate_micros_per_gpu_hour from gpu_class_rates r
                            where r.gpu_class_id = c.id and r.effective_from <= now()
                            order by r.effective_from desc limit 1), 0) as "rate!"
           from gpu_classes c order by c.name"#
    )
    .fetch_all(&mut *tx)
    .await?;
    let nodes = sqlx::query_as!(
        NodeRow,
        "select n.cluster_id, cl.name as cluster, n.name, n.gpu_class_id, n.gpus, n.nvlink_domain_size, n.rack, n.zone,
                n.elastic, n.spot, n.price_micros_per_gpu_hour, n.driver_version, n.cuda_version, n.cpu_millis,
                n.memory_mib
         from cluster_nodes n join clusters cl on cl.id = n.cluster_id
         order by cl.name, n.name, n.gpu_class_id"
    )
    .fetch_all(&mut *tx)
    .await?;
    let teams = sqlx::query_as!(
        TeamRow,
        r#"select id, name, parent_id as "parent_id: TeamId", fair_share_weight_milli from teams order by name"#
    )
    .fetch_all(&mut *tx)
    .await?;
    let quotas = sqlx::query_as!(QuotaRow, "select team_id, gpu_class_id, reserved, burst, lendable from quotas")
        .fetch_all(&mut *tx)
        .await?;
    let priorities = sqlx::query_as!(
        PriorityRow,
        "select name, priority, preemptible, usage_factor_milli, price_multiplier_milli, preemption_grace_seconds,
                preemption_delay_seconds
         from priority_classes order by priority desc, name"
    )
    .fetch_all(&mut *tx)
    .await?;
    // ∫ rate × GPUs × factor × 2^(-(now - t)/h) dt over each borrowing interval, in money:
    // τ × rate/h × GPUs × factor × (e^(-(now-end)/τ) - e^(-(now-start)/τ)), τ = h / ln 2.
    // Intervals older than 20 half-lives add less than a millionth and are skipped.
    let history = sqlx::query!(
        r#"select u.team_id as "team_id: TeamId",
                  sum(coalesce(r.rate, 0)::float8 / 3600.0 * u.gpus * p.usage_factor_milli / 1000.0
                      * ($1::float8 / ln(2))
                      * (exp(-extract(epoch from now() - coalesce(u.ended_at, now())) / ($1::float8 / ln(2)))
                         - exp(-extract(epoch from now() - u.started_at) / ($1::float8 / ln(2))))) as "value!"
           from usage_intervals u
           join priority_classes p on p.name = u.priority_class
           left join lateral (select rate_micros_per_gpu_hour as rate from gpu_class_rates r
                              where r.gpu_class_id = u.gpu_class_id and r.effective_from <= now()
                              order by r.effective_from desc limit 1) r on true
           where u.borrowing and coalesce(u.ended_at, now()) > now() - make_interval(secs => 20 * $1::float8)
           group by u.team_id"#,
        half_life_seconds
    )
    .fetch_all(&mut *tx)
    .await?
    .into_iter()
    .map(|r| (r.team_id, r.value))
    .collect();
    // Columns read here that a cycle may need to see change must mark the row changed: the
    // trigger `jobs_mark_changed` fires on updates of `version` and `last_checkpoint_at`.
    match live.xmin {
        None => {
            let rows = select_live_jobs!(
                r#"where (state = 'pending' and not waits_for_dependencies and not held_by_array) or state in ('admitted', 'running') or holds_gpus"#
            )
                .fetch_all(&mut *tx)
                .await?;
            live.by_id.clear();
            live.apply(rows);
        }
        Some(since) => {
            let rows =
                select_live_jobs!(r#"where changed_in >= $1::int8::text::xid8"#, since).fetch_all(&mut *tx).await?;
            live.apply(rows);
        }
    }
    tx.commit().await?;
    live.xmin = Some(at.xmin);
    // A team's deletion removes its jobs without marking anything changed.
    let team_ids: HashSet<TeamId> = teams.iter().map(|t| t.id).collect();
    live.by_id.retain(|_, job| team_ids.contains(&job.team_id));
    let jobs = live.sorted();
    Ok(SnapshotRows { now, classes, nodes, teams, quotas, priorities, history, jobs })
}

/// Which of the passes before a cycle's snapshot have anything to do (see
/// `control::cycle::run_with`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassesDue {
    /// A pending job waits for its dependencies.
    pub dependencies: bool,
    /// A task is held back by its array's parallelism.
    pub arrays: bool,
    /// A live service, or a deleted one whose replicas have not all ended.
    pub services: bool,
    /// `jobs` holds more than twice the rows it held when PostgreSQL last gathered its
    /// statistics, and at least [`STALE_AFTER_ROWS`] more: see [`analyze_jobs`].
    pub jobs_statistics_stale: bool,
}

/// How many rows `jobs` may gain beyond twice what its statistics saw before the leader
/// gathers them itself: a burst is analysed at 5,000 rows, 15,000, 35,000 and so on, a
/// handful of times however large it grows, and never for updates alone.
pub const STALE_AFTER_ROWS: i64 = 5_000;

/// [`PassesDue`] in one round trip a cycle. Each answer probes an index that is empty when
/// the pass has nothing to do, so each costs microseconds; asked separately, on a database
/// busy with a burst, each waited its turn for a core (about 20 ms apiece).
pub async fn passes_due(pool: &PgPool) -> Result<PassesDue, sqlx::Error> {
    sqlx::query_as!(
        PassesDue,
        r#"select exists (select 1 from jobs where waits_for_dependencies and state = 'pending') as "dependencies!",
                  exists (select 1 from jobs where held_by_array) as "arrays!",
                  -- From the services: looking for live replicas among the live jobs read
                  -- thousands of rows a cycle.
                  exists (select 1 from services where deleted_at is null)
                  or exists (select 1 from services s join jobs j on j.service_id = s.id
                             where s.deleted_at is not null
                               and (j.state in ('pending', 'admitted', 'running') or j.holds_gpus)) as "services!",
                  (select pg_stat_get_live_tuples(c.oid) > $1::int8 + 2 * greatest(c.reltuples::int8, 0)
                   from pg_class c where c.oid = 'jobs'::regclass) as "jobs_statistics_stale!""#,
        STALE_AFTER_ROWS
    )
    .fetch_one(pool)
    .await
}

/// Gathers the planner's statistics of `jobs` now, rather than when autovacuum next looks
/// (once a minute by default). A burst into a table whose statistics predate it is planned
/// as if each flag were true of half the rows: the probes of [`passes_due`] then scan the
/// whole table instead of their empty partial indexes (179 ms a cycle at 50,000 jobs in
/// `bench scale`, against 0.03 ms), and join `jobs` by hashing all of it. Sampling reads
/// up to 30,000 rows (about a second on a database busy with that burst) and blocks no
/// reads or writes. Without the table's ownership PostgreSQL skips it, warning.
pub async fn analyze_jobs(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::raw_sql("analyze jobs").execute(pool).await.map(drop)
}
