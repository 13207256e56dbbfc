//! The control loop's SQL: leadership, the snapshot the engine decides from, the one
//! transaction that records a cycle's decisions, the dispatch outbox, inventory sync, and
//! the reconciler's state changes. Every write of the control loop runs in a transaction
//! that first checks the leader's epoch ([`check_epoch`]), so a leader that lost its
//! leadership while paused commits nothing.

use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
};

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::Tx;

/// The channel the dispatcher listens on.
pub const DISPATCH_CHANNEL: &str = "fairway_dispatch";

// ---------------------------------------------------------------------------------------
// Leadership

/// Records `holder` as leader with a new epoch; run on the connection holding the lock.
pub async fn take_leadership(conn: &mut PgConnection, holder: &str) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(
        "insert into scheduler_leader (id, epoch, holder, backend_pid, acquired_at, heartbeat_at)
         values (1, 1, $1, pg_backend_pid(), now(), now())
         on conflict (id) do update
         set epoch = scheduler_leader.epoch + 1, holder = $1, backend_pid = pg_backend_pid(),
             acquired_at = now(), heartbeat_at = now()
         returning epoch",
        holder
    )
    .fetch_one(conn)
    .await
}

/// Renews the lease; false when another leader took over.
pub async fn heartbeat(conn: &mut PgConnection, epoch: i64) -> Result<bool, sqlx::Error> {
    let r = sqlx::query!("update scheduler_leader set heartbeat_at = now() where id = 1 and epoch = $1", epoch)
        .execute(conn)
        .await?;
    Ok(r.rows_affected() == 1)
}

/// The current leader: holder, epoch, and how many seconds ago it last renewed its lease.
pub struct LeaderRow {
    pub holder: String,
    pub epoch: i64,
    pub backend_pid: i32,
    pub silent_seconds: f64,
}

/// The leader record, if any leader ever ran.
pub async fn leader(conn: &mut PgConnection) -> Result<Option<LeaderRow>, sqlx::Error> {
    sqlx::query_as!(
        LeaderRow,
        r#"select holder, epoch, backend_pid,
                  extract(epoch from now() - heartbeat_at)::float8 as "silent_seconds!"
           from scheduler_leader where id = 1"#
    )
    .fetch_optional(conn)
    .await
}

/// Ends every session of a leader whose lease ran out (it is paused or partitioned): its
/// advisory lock and any open transaction go with them.
pub async fn evict(conn: &mut PgConnection, holder: &str, backend_pid: i32) -> Result<u64, sqlx::Error> {
    let n = sqlx::query_scalar!(
        r#"select count(*) filter (where pg_terminate_backend(pid)) as "n!"
           from pg_stat_activity
           where pid <> pg_backend_pid() and (pid = $2 or application_name = $1)"#,
        holder,
        backend_pid
    )
    .fetch_one(conn)
    .await?;
    Ok(n as u64)
}

/// True when `epoch` is still the leader's. Takes a share lock on the leader row, so a
/// takeover (which updates it) waits for this transaction, and this transaction sees a
/// takeover that committed first.
pub async fn check_epoch(tx: &mut Tx<'_>, epoch: i64) -> Result<bool, sqlx::Error> {
    let current = sqlx::query_scalar!("select epoch from scheduler_leader where id = 1 for share")
        .fetch_optional(&mut **tx)
        .await?;
    Ok(current == Some(epoch))
}

// ---------------------------------------------------------------------------------------
// Inventory

/// A node row as reported by a backend.
#[derive(Debug, Clone)]
pub struct NodeRow {
    pub cluster_id: Uuid,
    pub cluster: String,
    pub name: String,
    pub gpu_class_id: Uuid,
    pub gpus: i32,
    pub nvlink_domain_size: i32,
    pub rack: Option<String>,
    pub zone: Option<String>,
    pub elastic: bool,
    pub spot: bool,
    pub price_micros_per_gpu_hour: Option<i64>,
}

/// Ensures a cluster row exists and returns its id.
pub async fn ensure_cluster(tx: &mut Tx<'_>, name: &str, backend: &str) -> Result<Uuid, sqlx::Error> {
    sqlx::query_scalar!(
        "insert into clusters (id, name, backend) values ($1, $2, $3)
         on conflict (name) do update set backend = excluded.backend
         returning id",
        Uuid::new_v4(),
        name,
        backend
    )
    .fetch_one(&mut **tx)
    .await
}

/// Ensures a GPU class exists (classes a backend reports but nobody declared yet).
pub async fn ensure_gpu_class(
    tx: &mut Tx<'_>,
    name: &str,
    kind: &str,
    memory_mib: i32,
    fraction_milli: i32,
) -> Result<Uuid, sqlx::Error> {
    sqlx::query_scalar!(
        "insert into gpu_classes (id, name, kind, memory_mib, fraction_milli, description)
         values ($1, $2, $3, $4, $5, 'reported by a cluster')
         on conflict (name) do update set name = excluded.name
         returning id",
        Uuid::new_v4(),
        name,
        kind,
        memory_mib,
        fraction_milli
    )
    .fetch_one(&mut **tx)
    .await
}

/// Ids of GPU classes by name.
pub async fn class_ids(tx: &mut Tx<'_>) -> Result<Vec<(String, Uuid)>, sqlx::Error> {
    let rows = sqlx::query!("select name, id from gpu_classes").fetch_all(&mut **tx).await?;
    Ok(rows.into_iter().map(|r| (r.name, r.id)).collect())
}

/// Replaces a cluster's nodes and its declared capacity with what its backend reports.
pub async fn replace_nodes(tx: &mut Tx<'_>, cluster_id: Uuid, nodes: &[NodeRow]) -> Result<(), sqlx::Error> {
    sqlx::query!("delete from cluster_nodes where cluster_id = $1", cluster_id).execute(&mut **tx).await?;
    let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let classes: Vec<Uuid> = nodes.iter().map(|n| n.gpu_class_id).collect();
    let gpus: Vec<i32> = nodes.iter().map(|n| n.gpus).collect();
    let domains: Vec<i32> = nodes.iter().map(|n| n.nvlink_domain_size).collect();
    let racks: Vec<Option<String>> = nodes.iter().map(|n| n.rack.clone()).collect();
    let zones: Vec<Option<String>> = nodes.iter().map(|n| n.zone.clone()).collect();
    let elastic: Vec<bool> = nodes.iter().map(|n| n.elastic).collect();
    let spot: Vec<bool> = nodes.iter().map(|n| n.spot).collect();
    let prices: Vec<Option<i64>> = nodes.iter().map(|n| n.price_micros_per_gpu_hour).collect();
    sqlx::query!(
        "insert into cluster_nodes (cluster_id, name, gpu_class_id, gpus, nvlink_domain_size, rack, zone, elastic,
                                    spot, price_micros_per_gpu_hour)
         select $1, * from unnest($2::text[], $3::uuid[], $4::int4[], $5::int4[], $6::text[], $7::text[], $8::bool[],
                                  $9::bool[], $10::int8[])",
        cluster_id,
        &names,
        &classes,
        &gpus,
        &domains,
        &racks as &[Option<String>],
        &zones as &[Option<String>],
        &elastic,
        &spot,
        &prices as &[Option<i64>]
    )
    .execute(&mut **tx)
    .await?;
    sqlx::query!("delete from cluster_capacity where cluster_id = $1", cluster_id).execute(&mut **tx).await?;
    // Per class, what submissions are validated against (see `db::jobs::submit_catalogue`).
    sqlx::query!(
        "insert into cluster_capacity (cluster_id, gpu_class_id, gpus, largest_node, largest_nvlink_domain,
                                       largest_rack, largest_zone)
         select n.cluster_id, n.gpu_class_id, sum(n.gpus)::int4, max(n.gpus),
                max(case when n.nvlink_domain_size = 0 or n.elastic then n.gpus
                         else least(n.gpus, n.nvlink_domain_size) end),
                (select max(s) from (select sum(r.gpus) as s from cluster_nodes r
                                     where r.cluster_id = n.cluster_id and r.gpu_class_id = n.gpu_class_id
                                     group by coalesce(r.rack, r.name)) x)::int4,
                (select max(s) from (select sum(z.gpus) as s from cluster_nodes z
                                     where z.cluster_id = n.cluster_id and z.gpu_class_id = n.gpu_class_id
                                     group by coalesce(z.zone, z.name)) x)::int4
         from cluster_nodes n where n.cluster_id = $1
         group by n.cluster_id, n.gpu_class_id",
        cluster_id
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Snapshot

/// A GPU class with its rate now.
pub struct ClassRow {
    pub id: Uuid,
    pub name: String,
    pub rate: i64,
    pub fraction_milli: i32,
}

/// A team with its weight.
pub struct TeamRow {
    pub id: Uuid,
    pub name: String,
    pub parent_id: Option<Uuid>,
    pub fair_share_weight_milli: i32,
}

/// A quota.
pub struct QuotaRow {
    pub team_id: Uuid,
    pub gpu_class_id: Uuid,
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
}

/// A job the engine must know of: pending, or holding GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveJob {
    pub id: Uuid,
    pub seq: i64,
    pub team_id: Uuid,
    pub gpu_class_id: Uuid,
    pub priority_class: String,
    pub replicas: i32,
    pub gpus_per_replica: i32,
    pub topology_mode: String,
    pub topology_level: Option<String>,
    pub max_runtime_seconds: i32,
    pub preemption_grace_seconds: Option<i32>,
    pub state: String,
    pub attempt: i32,
    pub holds_gpus: bool,
    pub cluster_id: Option<Uuid>,
    pub placement: Option<Value>,
    pub submitted_at: DateTime<Utc>,
    pub queued_at: DateTime<Utc>,
    pub admitted_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub last_checkpoint_at: Option<DateTime<Utc>>,
    /// The reason last recorded while it waits.
    pub pending_reason: Option<String>,
    pub allow_spot: bool,
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
    pub history: Vec<(Uuid, f64)>,
    /// Ordered by `seq`.
    pub jobs: Vec<Arc<LiveJob>>,
}

impl LiveJob {
    /// Whether the engine must know of the job: it waits, or holds GPUs.
    fn is_live(&self) -> bool {
        matches!(self.state.as_str(), "pending" | "admitted" | "running") || self.holds_gpus
    }
}

/// The live jobs as of the last snapshot, which the leader keeps between cycles: with ten
/// thousand jobs queued, reading them all took most of a cycle, while a cycle changes only
/// a few. A default (empty) copy makes the next [`snapshot_rows`] read every live job.
#[derive(Default)]
pub struct LiveJobs {
    by_id: HashMap<Uuid, Arc<LiveJob>>,
    /// The xmin of the snapshot the copy is exact for; `None` before the first read.
    xmin: Option<i64>,
}

impl LiveJobs {
    /// Records the pending reasons a cycle wrote, which do not mark the rows changed
    /// (`changed_in`), so that the copy stays exact.
    pub fn set_pending_reasons<'a>(&mut self, reasons: impl IntoIterator<Item = (Uuid, &'a str)>) {
        for (id, reason) in reasons {
            if let Some(job) = self.by_id.get_mut(&id) {
                if job.state == "pending" && job.pending_reason.as_deref() != Some(reason) {
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

/// Reads the scheduler's view of the world at one instant. Of the jobs, only those changed
/// since `live` was last brought up to date are read (every live job when it is empty), and
/// `live` is brought up to date.
pub async fn snapshot_rows(
    pool: &PgPool,
    half_life_seconds: f64,
    live: &mut LiveJobs,
) -> Result<SnapshotRows, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query!("set transaction isolation level repeatable read, read only").execute(&mut *tx).await?;
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
                n.elastic, n.spot, n.price_micros_per_gpu_hour
         from cluster_nodes n join clusters cl on cl.id = n.cluster_id
         order by cl.name, n.name, n.gpu_class_id"
    )
    .fetch_all(&mut *tx)
    .await?;
    let teams =
        sqlx::query_as!(TeamRow, "select id, name, parent_id, fair_share_weight_milli from teams order by name")
            .fetch_all(&mut *tx)
            .await?;
    let quotas = sqlx::query_as!(QuotaRow, "select team_id, gpu_class_id, reserved, burst, lendable from quotas")
        .fetch_all(&mut *tx)
        .await?;
    let priorities = sqlx::query_as!(
        PriorityRow,
        "select name, priority, preemptible, usage_factor_milli, price_multiplier_milli, preemption_grace_seconds
         from priority_classes order by priority desc, name"
    )
    .fetch_all(&mut *tx)
    .await?;
    // ∫ rate × GPUs × factor × 2^(-(now - t)/h) dt over each borrowing interval, in money:
    // τ × rate/h × GPUs × factor × (e^(-(now-end)/τ) - e^(-(now-start)/τ)), τ = h / ln 2.
    // Intervals older than 20 half-lives add less than a millionth and are skipped.
    let history = sqlx::query!(
        r#"select u.team_id,
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
            let rows = sqlx::query_as!(
                LiveJob,
                r#"select id, seq, team_id, gpu_class_id, priority_class, replicas, gpus_per_replica, topology_mode,
                          topology_level, max_runtime_seconds, preemption_grace_seconds, state, attempt, holds_gpus,
                          cluster_id, placement, submitted_at, queued_at, admitted_at, started_at, last_checkpoint_at,
                          pending_reason, allow_spot
                   from jobs
                   where state in ('pending', 'admitted', 'running') or holds_gpus"#
            )
            .fetch_all(&mut *tx)
            .await?;
            live.by_id.clear();
            live.apply(rows);
        }
        Some(since) => {
            let rows = sqlx::query_as!(
                LiveJob,
                r#"select id, seq, team_id, gpu_class_id, priority_class, replicas, gpus_per_replica, topology_mode,
                          topology_level, max_runtime_seconds, preemption_grace_seconds, state, attempt, holds_gpus,
                          cluster_id, placement, submitted_at, queued_at, admitted_at, started_at, last_checkpoint_at,
                          pending_reason, allow_spot
                   from jobs
                   where changed_in >= $1::int8::text::xid8"#,
                since
            )
            .fetch_all(&mut *tx)
            .await?;
            live.apply(rows);
        }
    }
    tx.commit().await?;
    live.xmin = Some(at.xmin);
    // A team's deletion removes its jobs without marking anything changed.
    let team_ids: HashSet<Uuid> = teams.iter().map(|t| t.id).collect();
    live.by_id.retain(|_, job| team_ids.contains(&job.team_id));
    let jobs = live.sorted();
    Ok(SnapshotRows { now, classes, nodes, teams, quotas, priorities, history, jobs })
}

// ---------------------------------------------------------------------------------------
// Recording a cycle

/// An admission to record.
pub struct AdmitRow {
    pub job_id: Uuid,
    pub cluster_id: Uuid,
    pub placement: Value,
    pub borrowing: bool,
    pub message: String,
    pub data: Value,
}

/// Records admissions: the job becomes `admitted` with its placement, a new attempt, an
/// event and a `submit` outbox row. Jobs no longer pending (cancelled meanwhile) are left
/// alone. Returns the admitted jobs.
pub async fn admit(tx: &mut Tx<'_>, rows: &[AdmitRow]) -> Result<Vec<Uuid>, sqlx::Error> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = rows.iter().map(|r| r.job_id).collect();
    let clusters: Vec<Uuid> = rows.iter().map(|r| r.cluster_id).collect();
    let placements: Vec<Value> = rows.iter().map(|r| r.placement.clone()).collect();
    let borrowing: Vec<bool> = rows.iter().map(|r| r.borrowing).collect();
    let messages: Vec<String> = rows.iter().map(|r| r.message.clone()).collect();
    let data: Vec<Value> = rows.iter().map(|r| r.data.clone()).collect();
    sqlx::query_scalar!(
        r#"with u as (
               select * from unnest($1::uuid[], $2::uuid[], $3::jsonb[], $4::bool[], $5::text[], $6::jsonb[])
                   as u(id, cluster, placement, borrowing, message, data)
           ), admitted as (
               update jobs j set state = 'admitted', attempt = j.attempt + 1, holds_gpus = true,
                      cluster_id = u.cluster, placement = u.placement, borrowing = u.borrowing,
                      admitted_at = now(), dispatched_at = null, started_at = null, stop_requested_at = null,
                      exit_code = null, pending_reason = null, pending_message = null, queue_position = null,
                      expected_start_at = null, updated_at = now(), version = j.version + 1
               from u where j.id = u.id and j.state = 'pending'
               returning j.id, j.attempt
           ), events as (
               insert into job_events (job_id, attempt, kind, reason, message, data)
               select a.id, a.attempt, 'admitted', case when u.borrowing then 'burst' else 'reserved' end,
                      u.message, u.data
               from admitted a join u on u.id = a.id
           ), outbox as (
               insert into dispatch_outbox (job_id, attempt, action) select id, attempt, 'submit' from admitted
           )
           select id as "id!" from admitted"#,
        &ids,
        &clusters,
        &placements,
        &borrowing,
        &messages,
        &data
    )
    .fetch_all(&mut **tx)
    .await
}

/// A preemption to record.
pub struct PreemptRow {
    pub job_id: Uuid,
    pub grace_ms: i64,
    pub reason: String,
    pub message: String,
    pub data: Value,
}

/// Records preemptions: the job becomes `preempted`, keeps its GPUs until its object is
/// gone, and gets an event and a `stop` outbox row with its grace period.
pub async fn preempt(tx: &mut Tx<'_>, rows: &[PreemptRow]) -> Result<Vec<Uuid>, sqlx::Error> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = rows.iter().map(|r| r.job_id).collect();
    let graces: Vec<i64> = rows.iter().map(|r| r.grace_ms).collect();
    let reasons: Vec<String> = rows.iter().map(|r| r.reason.clone()).collect();
    let messages: Vec<String> = rows.iter().map(|r| r.message.clone()).collect();
    let data: Vec<Value> = rows.iter().map(|r| r.data.clone()).collect();
    sqlx::query_scalar!(
        r#"with u as (
               select * from unnest($1::uuid[], $2::int8[], $3::text[], $4::text[], $5::jsonb[])
                   as u(id, grace, reason, message, data)
           ), preempted as (
               update jobs j set state = 'preempted', stop_requested_at = now(), updated_at = now(),
                      version = j.version + 1
               from u where j.id = u.id and j.state in ('admitted', 'running')
               returning j.id, j.attempt
           ), events as (
               insert into job_events (job_id, attempt, kind, reason, message, data)
               select p.id, p.attempt, 'preempted', u.reason, u.message, u.data from preempted p join u on u.id = p.id
           ), outbox as (
               insert into dispatch_outbox (job_id, attempt, action, grace_ms)
               select p.id, p.attempt, 'stop', u.grace from preempted p join u on u.id = p.id
           )
           select id as "id!" from preempted"#,
        &ids,
        &graces,
        &reasons,
        &messages,
        &data
    )
    .fetch_all(&mut **tx)
    .await
}

/// Locks the rows of `ids` in id order. The scheduling cycle and the reconciler both
/// change several jobs in one transaction; taking every lock up front in one order is what
/// keeps the two from deadlocking on jobs they both touch.
pub async fn lock_jobs(tx: &mut Tx<'_>, ids: &[Uuid]) -> Result<(), sqlx::Error> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query!("select id from jobs where id = any($1) order by id for update", ids).fetch_all(&mut **tx).await?;
    Ok(())
}

/// Why each pending job waits.
#[derive(Debug, Clone)]
pub struct PendingRow {
    pub job_id: Uuid,
    pub reason: String,
    pub message: String,
    pub position: i32,
    pub expected_start_at: Option<DateTime<Utc>>,
}

/// Refreshes the reason, position and expected start of pending jobs, touching only rows
/// whose values changed. Rows another transaction holds are skipped, not waited for: what
/// is written here is for people to read, and the next refresh writes it. Returns the jobs
/// whose rows were written.
pub async fn set_pending(tx: &mut Tx<'_>, rows: &[PendingRow]) -> Result<Vec<Uuid>, sqlx::Error> {
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = rows.iter().map(|r| r.job_id).collect();
    let reasons: Vec<String> = rows.iter().map(|r| r.reason.clone()).collect();
    let messages: Vec<String> = rows.iter().map(|r| r.message.clone()).collect();
    let positions: Vec<i32> = rows.iter().map(|r| r.position).collect();
    let starts: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.expected_start_at).collect();
    sqlx::query_scalar!(
        "with target as (
             select j.id, u.reason, u.message, u.position, u.start
             from unnest($1::uuid[], $2::text[], $3::text[], $4::int4[], $5::timestamptz[])
                  as u(id, reason, message, position, start)
             join jobs j on j.id = u.id
             where j.state = 'pending'
               and (j.pending_reason, j.pending_message, j.queue_position, j.expected_start_at)
                   is distinct from (u.reason, u.message, u.position, u.start)
             for update of j skip locked
         )
         update jobs j set pending_reason = t.reason, pending_message = t.message, queue_position = t.position,
                expected_start_at = t.start
         from target t where j.id = t.id
         returning j.id",
        &ids,
        &reasons,
        &messages,
        &positions,
        &starts as &[Option<DateTime<Utc>>]
    )
    .fetch_all(&mut **tx)
    .await
}

/// Teams whose admitted GPUs exceed reserved + burst for a class, at any level of the team
/// tree: the invariant every cycle must keep. Empty when all is well.
pub async fn quota_violations(db: impl sqlx::PgExecutor<'_>) -> Result<Vec<(String, String, i64, i64)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"with recursive ancestry (team_id, ancestor_id) as (
               select id, id from teams
               union all
               select a.team_id, t.parent_id from ancestry a join teams t on t.id = a.ancestor_id
               where t.parent_id is not null
           ), used as (
               select a.ancestor_id as team_id, j.gpu_class_id, sum(j.replicas * j.gpus_per_replica)::int8 as gpus
               from jobs j join ancestry a on a.team_id = j.team_id
               where j.holds_gpus
               group by a.ancestor_id, j.gpu_class_id
           )
           select t.name as "team!", c.name as "gpu_class!", u.gpus as "used!",
                  (coalesce(q.reserved, 0) + coalesce(q.burst, 0))::int8 as "limit!"
           from used u
           join teams t on t.id = u.team_id
           join gpu_classes c on c.id = u.gpu_class_id
           left join quotas q on q.team_id = u.team_id and q.gpu_class_id = u.gpu_class_id
           where u.gpus > coalesce(q.reserved, 0) + coalesce(q.burst, 0)"#
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.team, r.gpu_class, r.used, r.limit)).collect())
}

// ---------------------------------------------------------------------------------------
// Dispatch outbox

/// A claimed outbox row with what the dispatcher needs of its job.
#[derive(Debug, Clone)]
pub struct OutboxRow {
    pub id: i64,
    pub job_id: Uuid,
    pub attempt: i32,
    pub action: String,
    pub grace_ms: i64,
    pub tries: i32,
    pub job_state: String,
    pub job_attempt: i32,
    pub cluster: Option<String>,
}

/// Claims the oldest due outbox rows (up to `limit`) nobody else holds, locking them and
/// (shared) their jobs for the rest of the transaction, so the scheduler cannot change a job
/// while its object is being created. A row whose job someone is changing right now is left
/// for the next claim: waiting for it while holding the batch's other jobs could deadlock
/// with the reconciler, which locks jobs in id order.
pub async fn claim(tx: &mut Tx<'_>, limit: i64) -> Result<Vec<OutboxRow>, sqlx::Error> {
    sqlx::query_as!(
        OutboxRow,
        r#"select o.id, o.job_id, o.attempt, o.action, o.grace_ms, o.tries, j.state as job_state,
                  j.attempt as job_attempt, cl.name as "cluster?"
           from dispatch_outbox o
           join jobs j on j.id = o.job_id
           left join clusters cl on cl.id = j.cluster_id
           where o.done_at is null and o.not_before <= now()
           order by o.id
           limit $1
           for update of o skip locked
           for share of j skip locked"#,
        limit
    )
    .fetch_all(&mut **tx)
    .await
}

/// Marks an outbox row done.
pub async fn complete(tx: &mut Tx<'_>, id: i64, note: Option<&str>) -> Result<(), sqlx::Error> {
    sqlx::query!("update dispatch_outbox set done_at = now(), last_error = $2 where id = $1", id, note)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Schedules another try of an outbox row after `delay_ms`.
pub async fn retry_later(tx: &mut Tx<'_>, id: i64, delay_ms: i64, error: &str) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update dispatch_outbox set tries = tries + 1, last_error = $3,
                not_before = now() + make_interval(secs => $2::float8 / 1000.0)
         where id = $1",
        id,
        delay_ms as f64,
        error
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Records that the backend accepted the job's object.
pub async fn mark_dispatched(tx: &mut Tx<'_>, job_id: Uuid, attempt: i32) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update jobs set dispatched_at = coalesce(dispatched_at, clock_timestamp()), updated_at = now()
         where id = $1 and attempt = $2",
        job_id,
        attempt
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Reconciliation

/// A job holding GPUs on a cluster, as the reconciler compares it with the backend.
#[derive(Debug, Clone)]
pub struct HeldJob {
    pub id: Uuid,
    pub attempt: i32,
    pub state: String,
    pub stop_requested_at: Option<DateTime<Utc>>,
    pub dispatched_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub grace_ms: i64,
    /// A `submit` for this attempt is still in the outbox.
    pub submit_pending: bool,
    /// A `stop` for this attempt is still in the outbox: the dispatcher tells the backend.
    pub stop_pending: bool,
}

/// Jobs holding GPUs on `cluster`.
pub async fn held_jobs(pool: &PgPool, cluster: &str) -> Result<Vec<HeldJob>, sqlx::Error> {
    sqlx::query_as!(
        HeldJob,
        r#"select j.id, j.attempt, j.state, j.stop_requested_at, j.dispatched_at, j.started_at,
                  coalesce(j.preemption_grace_seconds, p.preemption_grace_seconds)::int8 * 1000 as "grace_ms!",
                  exists (select 1 from dispatch_outbox o where o.job_id = j.id and o.attempt = j.attempt
                          and o.action = 'submit' and o.done_at is null) as "submit_pending!",
                  exists (select 1 from dispatch_outbox o where o.job_id = j.id and o.attempt = j.attempt
                          and o.action = 'stop' and o.done_at is null) as "stop_pending!"
           from jobs j
           join clusters cl on cl.id = j.cluster_id
           join priority_classes p on p.name = j.priority_class
           where j.holds_gpus and cl.name = $1"#,
        cluster
    )
    .fetch_all(pool)
    .await
}

/// What the reconciler needs of any job an object names.
pub struct JobAttempt {
    pub attempt: i32,
    pub holds_gpus: bool,
}

/// The current attempt of job `id`.
pub async fn job_attempt(pool: &PgPool, id: Uuid) -> Result<Option<JobAttempt>, sqlx::Error> {
    sqlx::query_as!(JobAttempt, "select attempt, holds_gpus from jobs where id = $1", id).fetch_optional(pool).await
}

/// An attempt and an instant: when it started or ended.
pub type AttemptAt = (Uuid, i32, DateTime<Utc>);

/// Marks admitted attempts running and opens their usage intervals (once). Returns the
/// attempts that were admitted until now.
pub async fn mark_running(tx: &mut Tx<'_>, starts: &[AttemptAt]) -> Result<Vec<(Uuid, i32)>, sqlx::Error> {
    if starts.is_empty() {
        return Ok(Vec::new());
    }
    let (ids, attempts, at) = columns(starts);
    let updated = sqlx::query!(
        "update jobs j set state = 'running', started_at = u.at, dispatched_at = coalesce(j.dispatched_at, u.at),
                updated_at = now(), version = j.version + 1
         from unnest($1::uuid[], $2::int4[], $3::timestamptz[]) as u(id, attempt, at)
         where j.id = u.id and j.attempt = u.attempt and j.state = 'admitted'
         returning j.id, j.attempt",
        &ids,
        &attempts,
        &at
    )
    .fetch_all(&mut **tx)
    .await?;
    open_intervals(tx, starts).await?;
    Ok(updated.into_iter().map(|r| (r.id, r.attempt)).collect())
}

fn columns(rows: &[AttemptAt]) -> (Vec<Uuid>, Vec<i32>, Vec<DateTime<Utc>>) {
    (rows.iter().map(|r| r.0).collect(), rows.iter().map(|r| r.1).collect(), rows.iter().map(|r| r.2).collect())
}

/// Opens the usage intervals of attempts that started; a repeat does nothing.
pub async fn open_intervals(tx: &mut Tx<'_>, starts: &[AttemptAt]) -> Result<(), sqlx::Error> {
    if starts.is_empty() {
        return Ok(());
    }
    let (ids, attempts, at) = columns(starts);
    sqlx::query!(
        "insert into usage_intervals (job_id, attempt, team_id, gpu_class_id, priority_class, gpus, fraction_milli,
                                      borrowing, started_at, rate_micros_per_gpu_hour)
         select j.id, u.attempt, j.team_id, j.gpu_class_id, j.priority_class, j.replicas * j.gpus_per_replica,
                c.fraction_milli, j.borrowing, u.at,
                -- A pool with a price of its own (a cloud pool) meters the attempt at it.
                (select n.price_micros_per_gpu_hour from cluster_nodes n
                 where n.cluster_id = j.cluster_id and n.gpu_class_id = j.gpu_class_id
                   and n.name = j.placement -> 0 ->> 'node')
         from unnest($1::uuid[], $2::int4[], $3::timestamptz[]) as u(id, attempt, at)
         join jobs j on j.id = u.id and j.attempt = u.attempt
         join gpu_classes c on c.id = j.gpu_class_id
         on conflict (job_id, attempt) do nothing",
        &ids,
        &attempts,
        &at
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Closes the usage intervals of attempts that ended; an interval already closed keeps its
/// end.
pub async fn close_intervals(tx: &mut Tx<'_>, ends: &[AttemptAt]) -> Result<(), sqlx::Error> {
    if ends.is_empty() {
        return Ok(());
    }
    let (ids, attempts, at) = columns(ends);
    sqlx::query!(
        "update usage_intervals i set ended_at = greatest(i.started_at, u.at)
         from unnest($1::uuid[], $2::int4[], $3::timestamptz[]) as u(id, attempt, at)
         where i.job_id = u.id and i.attempt = u.attempt and i.ended_at is null",
        &ids,
        &attempts,
        &at
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The counters and limits that decide what follows an attempt.
pub struct AttemptEnd {
    pub id: Uuid,
    pub state: String,
    pub attempt: i32,
    pub holds_gpus: bool,
    pub max_retries: i32,
    pub preemptions: i32,
    pub capacity_retries: i32,
    pub node_lost_retries: i32,
    pub app_retries: i32,
}

/// Locks jobs, in id order, to end their attempts.
pub async fn lock_for_end(tx: &mut Tx<'_>, ids: &[Uuid]) -> Result<Vec<AttemptEnd>, sqlx::Error> {
    sqlx::query_as!(
        AttemptEnd,
        "select id, state, attempt, holds_gpus, max_retries, preemptions, capacity_retries, node_lost_retries,
                app_retries
         from jobs where id = any($1) order by id for update",
        ids
    )
    .fetch_all(&mut **tx)
    .await
}

/// How an attempt's end changes its job.
pub struct EndUpdate {
    pub job_id: Uuid,
    pub attempt: i32,
    /// The next state: `pending` to requeue, or a final one.
    pub state: &'static str,
    pub exit_code: Option<i32>,
    /// Which retry counter to bump, if any.
    pub bump: Option<&'static str>,
}

/// Applies attempts' ends: GPUs released, states set, counters bumped, and the scheduler
/// woken to use the freed GPUs.
pub async fn end_attempts(tx: &mut Tx<'_>, updates: &[EndUpdate]) -> Result<(), sqlx::Error> {
    if updates.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = updates.iter().map(|u| u.job_id).collect();
    let attempts: Vec<i32> = updates.iter().map(|u| u.attempt).collect();
    let states: Vec<&str> = updates.iter().map(|u| u.state).collect();
    let exit_codes: Vec<Option<i32>> = updates.iter().map(|u| u.exit_code).collect();
    let bumps: Vec<&str> = updates.iter().map(|u| u.bump.unwrap_or("")).collect();
    sqlx::query!(
        "update jobs j set holds_gpus = false, state = u.state, exit_code = coalesce(u.exit_code, j.exit_code),
                finished_at = case when u.state = 'pending' then null else now() end,
                queued_at = case when u.state = 'pending' then now() else j.queued_at end,
                preemptions = j.preemptions + (case when u.bump = 'preemptions' then 1 else 0 end),
                capacity_retries = j.capacity_retries + (case when u.bump = 'capacity_retries' then 1 else 0 end),
                node_lost_retries = j.node_lost_retries + (case when u.bump = 'node_lost_retries' then 1 else 0 end),
                app_retries = j.app_retries + (case when u.bump = 'app_retries' then 1 else 0 end),
                updated_at = now(), version = j.version + 1
         from unnest($1::uuid[], $2::int4[], $3::text[], $4::int4[], $5::text[])
              as u(id, attempt, state, exit_code, bump)
         where j.id = u.id and j.attempt = u.attempt",
        &ids,
        &attempts,
        &states as &[&str],
        &exit_codes as &[Option<i32>],
        &bumps as &[&str]
    )
    .execute(&mut **tx)
    .await?;
    super::jobs::notify(tx, super::jobs::SCHEDULE_CHANNEL).await
}
