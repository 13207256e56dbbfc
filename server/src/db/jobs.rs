//! Jobs as users see them: submission, reads, the queue, cancellation, checkpoints and the
//! event timeline. The scheduler's writes are in `db::scheduling`.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{types::Json, PgPool};

use super::Tx;
use crate::domain::{
    dependency::{After, IfDependencyFails},
    workload::Workload,
    ArrayId, GpuClassId, JobId, JobState, ServiceId, TeamId, TokenId, TopologyLevel, TopologyMode, TopologyWish,
    WaitFigures,
};
use uuid::Uuid;

/// A stored job with the names of what it refers to.
#[derive(Debug, Clone)]
pub struct JobRow {
    pub id: JobId,
    pub seq: i64,
    pub team_id: TeamId,
    pub team: String,
    pub name: String,
    pub gpu_class_id: GpuClassId,
    pub gpu_class: String,
    pub priority_class: String,
    pub replicas: i32,
    pub gpus_per_replica: i32,
    /// An elastic gang's most replicas (`replicas` is its least); `None`: a fixed gang.
    pub max_replicas: Option<i32>,
    /// The elastic gang this job is an extra replica of.
    pub extra_of: Option<JobId>,
    /// That gang's current attempt, whose rendezvous the extra joins.
    pub extra_of_attempt: Option<i32>,
    pub max_runtime_seconds: i32,
    /// The runtime the job declared it expects; `None` when it declared none.
    pub expected_runtime_seconds: Option<i32>,
    pub image: String,
    pub command: Json<Vec<String>>,
    pub env: Json<Value>,
    pub labels: Json<Value>,
    pub topology_mode: String,
    pub topology_level: Option<String>,
    pub preemption_grace_seconds: Option<i32>,
    /// Its own preemption delay; `None`: its priority class's.
    pub preemption_delay_seconds: Option<i32>,
    pub max_retries: i32,
    pub allow_spot: bool,
    /// CPU (millicores) and memory (MiB) per replica; `None` for jobs from before they were
    /// asked for, which ask their backend for none.
    pub cpu_millis: Option<i32>,
    pub memory_mib: Option<i32>,
    /// Volumes, secret references, image pull secrets and node selector.
    pub workload: Json<Workload>,
    /// The least driver and CUDA version its nodes must run.
    pub min_driver_version: Option<String>,
    pub min_cuda_version: Option<String>,
    pub state: JobState,
    pub attempt: i32,
    pub holds_gpus: bool,
    pub cluster: Option<String>,
    pub placement: Option<Json<Value>>,
    pub borrowing: bool,
    pub pending_reason: Option<String>,
    pub pending_message: Option<String>,
    pub pending_figures: Option<Json<WaitFigures>>,
    pub queue_position: Option<i32>,
    pub expected_start_at: Option<DateTime<Utc>>,
    pub stop_requested_at: Option<DateTime<Utc>>,
    pub last_checkpoint_at: Option<DateTime<Utc>>,
    pub exit_code: Option<i32>,
    pub preemptions: i32,
    pub submitted_by: String,
    pub submitted_at: DateTime<Utc>,
    pub admitted_at: Option<DateTime<Utc>>,
    pub dispatched_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
    pub version: i64,
    pub if_dependency_fails: IfDependencyFails,
    /// The array it is a task of, with its index and the array's task count.
    pub array_id: Option<ArrayId>,
    pub array_index: Option<i32>,
    pub array_task_count: Option<i32>,
    /// The service it is a replica of, with its slot and revision, the service's name and
    /// the port its replicas listen on.
    pub service_id: Option<ServiceId>,
    pub service_slot: Option<i32>,
    pub service_revision: Option<i32>,
    pub service: Option<String>,
    pub service_port: Option<i32>,
}

/// A job to insert; every value already validated.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub id: JobId,
    pub name: String,
    pub gpu_class_id: GpuClassId,
    pub priority_class: String,
    pub replicas: i32,
    pub gpus_per_replica: i32,
    /// An elastic gang's most replicas, at least `replicas`; `None`: a fixed gang.
    pub max_replicas: Option<i32>,
    pub max_runtime_seconds: i32,
    /// The runtime the job declares it expects, at most `max_runtime_seconds`: the median of
    /// its runtime forecast. `None`: the forecast learns it from history.
    pub expected_runtime_seconds: Option<i32>,
    pub image: String,
    pub command: Value,
    pub env: Value,
    pub labels: Value,
    pub topology_mode: String,
    pub topology_level: Option<String>,
    pub preemption_grace_seconds: Option<i32>,
    /// Its own preemption delay; `None`: its priority class's.
    pub preemption_delay_seconds: Option<i32>,
    pub max_retries: i32,
    /// Tolerates spot capacity.
    pub allow_spot: bool,
    /// CPU (millicores) and memory (MiB) per replica, the job's own or its class's default.
    pub cpu_millis: Option<i32>,
    pub memory_mib: Option<i32>,
    /// Volumes, secret references, image pull secrets and node selector, validated.
    pub workload: Workload,
    /// The least driver and CUDA version its nodes must run, checked as versions.
    pub min_driver_version: Option<String>,
    pub min_cuda_version: Option<String>,
    /// The jobs it waits for, each visible to its team: with some, it is stored waiting for
    /// them (`waits_for_dependencies`) until the leader's dependency pass releases it.
    pub depends_on: Vec<(JobId, After)>,
    pub if_dependency_fails: IfDependencyFails,
    /// What it was accepted despite (a quota or budget it waits for, a soft budget it
    /// overruns), in words: kept in its `submitted` event, so its timeline says so.
    pub accepted_despite: Vec<String>,
    /// The array it is a task of, when it is one.
    pub array: Option<ArrayTask>,
    /// The service it is a replica of, when it is one.
    pub service: Option<ServiceReplica>,
}

/// A job's place in its service.
#[derive(Debug, Clone)]
pub struct ServiceReplica {
    pub service_id: ServiceId,
    pub name: String,
    pub port: i32,
    /// 0 to the service's replicas - 1.
    pub slot: i32,
    pub revision: i32,
}

/// A job's place in its array.
#[derive(Debug, Clone)]
pub struct ArrayTask {
    pub array_id: ArrayId,
    /// 0 to `count` - 1.
    pub index: i32,
    pub count: i32,
    /// Held back by the array's parallelism, with the reason's words: stored with
    /// `held_by_array` until the leader's array pass releases it.
    pub held: Option<String>,
}

/// How many jobs wait for admission, over all teams.
pub async fn pending_count(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(r#"select count(*) as "n!" from jobs where state = 'pending'"#).fetch_one(pool).await
}

/// The channel the scheduler listens on for work.
pub const SCHEDULE_CHANNEL: &str = "fairway_schedule";

/// What the database assigned to a job it stored.
#[derive(Debug, Clone, Copy)]
pub struct Stored {
    pub id: JobId,
    pub seq: i64,
    pub submitted_at: DateTime<Utc>,
}

/// One job to store for a team, submitted by someone.
#[derive(Debug, Clone, Copy)]
pub struct Submission<'a> {
    pub team_id: TeamId,
    /// Who submitted it, as the audit log names them.
    pub submitted_by: &'a str,
    pub job: &'a NewJob,
    /// What must still hold when it is written, when it was authorised from cached
    /// credentials; it is not stored otherwise.
    pub check: Option<WriteCheck>,
}

/// What a submission authorised from a cached API token, and validated against a cached
/// catalogue, must still find true in the statement that stores it: the token live, its
/// team unchanged, the catalogue at the version it was validated against. The write is then
/// as exact as one authenticated and validated from fresh reads, with one round trip less.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteCheck {
    pub token_id: TokenId,
    pub team_version: i64,
    pub catalogue_version: i64,
}

/// Inserts jobs of one team with their `submitted` events in one statement: see
/// [`insert_submissions`].
pub async fn insert_many(
    db: impl sqlx::PgExecutor<'_>,
    team_id: TeamId,
    submitted_by: &str,
    jobs: &[NewJob],
) -> Result<Vec<Stored>, sqlx::Error> {
    let submissions: Vec<Submission> =
        jobs.iter().map(|job| Submission { team_id, submitted_by, job, check: None }).collect();
    insert_submissions(db, &submissions).await
}

/// Inserts jobs, of any teams, with their `submitted` events in one statement, so it is
/// atomic without a transaction around it; what the database assigned, in no particular
/// order. A submission whose [`WriteCheck`] fails is left out, and so missing from the
/// answer. It does not wake the scheduler: see [`wake_scheduler`].
pub async fn insert_submissions(
    db: impl sqlx::PgExecutor<'_>,
    submissions: &[Submission<'_>],
) -> Result<Vec<Stored>, sqlx::Error> {
    let column = |f: fn(&NewJob) -> String| submissions.iter().map(|s| f(s.job)).collect::<Vec<_>>();
    let ints = |f: fn(&NewJob) -> i32| submissions.iter().map(|s| f(s.job)).collect::<Vec<_>>();
    let jsons = |f: fn(&NewJob) -> Value| submissions.iter().map(|s| f(s.job)).collect::<Vec<_>>();
    let teams: Vec<TeamId> = submissions.iter().map(|s| s.team_id).collect();
    let by: Vec<&str> = submissions.iter().map(|s| s.submitted_by).collect();
    let ids: Vec<JobId> = submissions.iter().map(|s| s.job.id).collect();
    let classes: Vec<GpuClassId> = submissions.iter().map(|s| s.job.gpu_class_id).collect();
    let levels: Vec<Option<String>> = submissions.iter().map(|s| s.job.topology_level.clone()).collect();
    let graces: Vec<Option<i32>> = submissions.iter().map(|s| s.job.preemption_grace_seconds).collect();
    let delays: Vec<Option<i32>> = submissions.iter().map(|s| s.job.preemption_delay_seconds).collect();
    let maxima: Vec<Option<i32>> = submissions.iter().map(|s| s.job.max_replicas).collect();
    let tokens: Vec<Option<TokenId>> = submissions.iter().map(|s| s.check.map(|c| c.token_id)).collect();
    let team_versions: Vec<Option<i64>> = submissions.iter().map(|s| s.check.map(|c| c.team_version)).collect();
    let catalogues: Vec<Option<i64>> = submissions.iter().map(|s| s.check.map(|c| c.catalogue_version)).collect();
    let expected: Vec<Option<i32>> = submissions.iter().map(|s| s.job.expected_runtime_seconds).collect();
    let despite: Vec<Option<String>> = submissions
        .iter()
        .map(|s| (!s.job.accepted_despite.is_empty()).then(|| s.job.accepted_despite.join("; ")))
        .collect();
    let cpus: Vec<Option<i32>> = submissions.iter().map(|s| s.job.cpu_millis).collect();
    let memories: Vec<Option<i32>> = submissions.iter().map(|s| s.job.memory_mib).collect();
    let workloads: Vec<Value> = submissions.iter().map(|s| serde_json::json!(s.job.workload)).collect();
    let waits: Vec<bool> = submissions.iter().map(|s| !s.job.depends_on.is_empty()).collect();
    let if_fails: Vec<&str> = submissions.iter().map(|s| s.job.if_dependency_fails.as_str()).collect();
    let arrays: Vec<Option<ArrayId>> = submissions.iter().map(|s| s.job.array.as_ref().map(|a| a.array_id)).collect();
    let indices: Vec<Option<i32>> = submissions.iter().map(|s| s.job.array.as_ref().map(|a| a.index)).collect();
    let held: Vec<Option<String>> =
        submissions.iter().map(|s| s.job.array.as_ref().and_then(|a| a.held.clone())).collect();
    let services: Vec<Option<ServiceId>> =
        submissions.iter().map(|s| s.job.service.as_ref().map(|r| r.service_id)).collect();
    let slots: Vec<Option<i32>> = submissions.iter().map(|s| s.job.service.as_ref().map(|r| r.slot)).collect();
    let revisions: Vec<Option<i32>> = submissions.iter().map(|s| s.job.service.as_ref().map(|r| r.revision)).collect();
    let min_drivers: Vec<Option<String>> = submissions.iter().map(|s| s.job.min_driver_version.clone()).collect();
    let min_cudas: Vec<Option<String>> = submissions.iter().map(|s| s.job.min_cuda_version.clone()).collect();
    let (mut dependents, mut depended, mut afters) = (Vec::new(), Vec::new(), Vec::new());
    for s in submissions {
        for &(on, after) in &s.job.depends_on {
            dependents.push(s.job.id);
            depended.push(on);
            afters.push(after.as_str());
        }
    }
    sqlx::query_as!(
        Stored,
        r#"with j as (
               insert into jobs (id, team_id, name, gpu_class_id, priority_class, replicas, gpus_per_replica,
                                 max_runtime_seconds, image, command, env, labels, topology_mode, topology_level,
                                 preemption_grace_seconds, max_retries, allow_spot, submitted_by,
                                 expected_runtime_seconds, waits_for_dependencies, if_dependency_fails,
                                 array_id, array_index, held_by_array, pending_reason, pending_message,
                                 cpu_millis, memory_mib, workload, service_id, service_slot, service_revision,
                                 min_driver_version, min_cuda_version, preemption_delay_seconds, max_replicas)
               select u.id, u.team, u.name, u.class, u.priority, u.replicas, u.gpus, u.runtime, u.image, u.command,
                      u.env, u.labels, u.mode, u.level, u.grace, u.retries, u.spot, u.by, u.expected, u.waits,
                      u.if_fails, u.array_id, u.array_index, u.held is not null,
                      case when u.held is not null then 'array_task_limit' end, u.held,
                      u.cpu, u.memory, u.workload, u.service_id, u.service_slot, u.service_revision,
                      u.min_driver, u.min_cuda, u.delay, u.max_replicas
               from unnest($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::uuid[], $6::text[], $7::int4[],
                           $8::int4[], $9::int4[], $10::text[], $11::jsonb[], $12::jsonb[], $13::jsonb[],
                           $14::text[], $15::text[], $16::int4[], $17::int4[], $18::bool[], $19::uuid[],
                           $20::int8[], $21::int8[], $22::int4[], $24::bool[], $25::text[], $29::uuid[],
                           $30::int4[], $31::text[], $32::int4[], $33::int4[], $34::jsonb[], $35::uuid[],
                           $36::int4[], $37::int4[], $38::text[], $39::text[], $40::int4[], $41::int4[])
                    as u(team, by, id, name, class, priority, replicas, gpus, runtime, image, command, env, labels,
                         mode, level, grace, retries, spot, token, team_version, catalogue, expected, waits, if_fails,
                         array_id, array_index, held, cpu, memory, workload, service_id, service_slot,
                         service_revision, min_driver, min_cuda, delay, max_replicas)
               where u.token is null or submission_check_holds(u.token, u.team, u.team_version, u.catalogue)
               returning id, seq, submitted_at, submitted_by
           ),
           e as (
               insert into job_events (job_id, kind, attempt, message)
               select j.id, 'submitted', 0, 'submitted by ' || j.submitted_by || coalesce('; accepted despite: ' || w.despite, '')
               from j join unnest($3::uuid[], $23::text[]) as w(id, despite) on w.id = j.id
           ),
           d as (
               insert into job_dependencies (job_id, depends_on, after)
               select x.id, x.dep, x.after
               from unnest($26::uuid[], $27::uuid[], $28::text[]) as x(id, dep, after) join j on j.id = x.id
           )
           select id as "id: JobId", seq, submitted_at from j"#,
        &teams as &[TeamId],
        &by as &[&str],
        &ids as &[JobId],
        &column(|j| j.name.clone()),
        &classes as &[GpuClassId],
        &column(|j| j.priority_class.clone()),
        &ints(|j| j.replicas),
        &ints(|j| j.gpus_per_replica),
        &ints(|j| j.max_runtime_seconds),
        &column(|j| j.image.clone()),
        &jsons(|j| j.command.clone()),
        &jsons(|j| j.env.clone()),
        &jsons(|j| j.labels.clone()),
        &column(|j| j.topology_mode.clone()),
        &levels as &[Option<String>],
        &graces as &[Option<i32>],
        &ints(|j| j.max_retries),
        &submissions.iter().map(|s| s.job.allow_spot).collect::<Vec<_>>(),
        &tokens as &[Option<TokenId>],
        &team_versions as &[Option<i64>],
        &catalogues as &[Option<i64>],
        &expected as &[Option<i32>],
        &despite as &[Option<String>],
        &waits,
        &if_fails as &[&str],
        &dependents as &[JobId],
        &depended as &[JobId],
        &afters as &[&'static str],
        &arrays as &[Option<ArrayId>],
        &indices as &[Option<i32>],
        &held as &[Option<String>],
        &cpus as &[Option<i32>],
        &memories as &[Option<i32>],
        &workloads,
        &services as &[Option<ServiceId>],
        &slots as &[Option<i32>],
        &revisions as &[Option<i32>],
        &min_drivers as &[Option<String>],
        &min_cudas as &[Option<String>],
        &delays as &[Option<i32>],
        &maxima as &[Option<i32>],
    )
    .fetch_all(db)
    .await
}

impl JobRow {
    /// The row of `job` as [`insert_many`] stored it: pending, never admitted. Saves reading
    /// back what was just written.
    pub fn submitted(job: NewJob, stored: Stored, team_id: TeamId, team: &str, gpu_class: &str, by: &str) -> Self {
        Self {
            id: stored.id,
            seq: stored.seq,
            team_id,
            team: team.to_owned(),
            name: job.name,
            gpu_class_id: job.gpu_class_id,
            gpu_class: gpu_class.to_owned(),
            priority_class: job.priority_class,
            replicas: job.replicas,
            gpus_per_replica: job.gpus_per_replica,
            max_replicas: job.max_replicas,
            extra_of: None,
            extra_of_attempt: None,
            max_runtime_seconds: job.max_runtime_seconds,
            expected_runtime_seconds: job.expected_runtime_seconds,
            image: job.image,
            command: Json(serde_json::from_value(job.command).unwrap_or_default()),
            env: Json(job.env),
            labels: Json(job.labels),
            topology_mode: job.topology_mode,
            topology_level: job.topology_level,
            preemption_grace_seconds: job.preemption_grace_seconds,
            preemption_delay_seconds: job.preemption_delay_seconds,
            max_retries: job.max_retries,
            allow_spot: job.allow_spot,
            cpu_millis: job.cpu_millis,
            memory_mib: job.memory_mib,
            workload: Json(job.workload),
            min_driver_version: job.min_driver_version,
            min_cuda_version: job.min_cuda_version,
            state: JobState::Pending,
            attempt: 0,
            holds_gpus: false,
            cluster: None,
            placement: None,
            borrowing: false,
            pending_reason: job.array.as_ref().and_then(|a| a.held.as_ref()).map(|_| "array_task_limit".to_owned()),
            pending_message: job.array.as_ref().and_then(|a| a.held.clone()),
            pending_figures: None,
            queue_position: None,
            expected_start_at: None,
            stop_requested_at: None,
            last_checkpoint_at: None,
            exit_code: None,
            preemptions: 0,
            submitted_by: by.to_owned(),
            submitted_at: stored.submitted_at,
            admitted_at: None,
            dispatched_at: None,
            started_at: None,
            finished_at: None,
            updated_at: stored.submitted_at,
            version: 1,
            if_dependency_fails: job.if_dependency_fails,
            array_id: job.array.as_ref().map(|a| a.array_id),
            array_index: job.array.as_ref().map(|a| a.index),
            array_task_count: job.array.as_ref().map(|a| a.count),
            service_id: job.service.as_ref().map(|r| r.service_id),
            service_slot: job.service.as_ref().map(|r| r.slot),
            service_revision: job.service.as_ref().map(|r| r.revision),
            service_port: job.service.as_ref().map(|r| r.port),
            service: job.service.map(|r| r.name),
        }
    }
}

/// Wakes the scheduler now, outside any transaction. Submissions call this after their
/// commit instead of notifying inside it: PostgreSQL serialises the commits of notifying
/// transactions (a database-wide lock held through the commit's WAL flush), which would let
/// only one submission commit at a time.
pub async fn wake_scheduler(pool: &PgPool) -> Result<(), sqlx::Error> {
    sqlx::query!("select pg_notify($1, '')", SCHEDULE_CHANNEL).execute(pool).await?;
    Ok(())
}

/// Cancels jobs that hold no GPUs at once (one statement, however many): an array's
/// tasks, a service's replicas.
pub async fn cancel_idle(tx: &mut Tx<'_>, ids: &[JobId]) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update jobs set state = 'cancelled', waits_for_dependencies = false, held_by_array = false,
                finished_at = now(), pending_reason = null, pending_message = null, pending_figures = null,
                queue_position = null, expected_start_at = null, updated_at = now(), version = version + 1
         where id = any($1) and not holds_gpus",
        ids as &[JobId]
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Sends a notification on `channel` when the transaction commits.
pub async fn notify(tx: &mut Tx<'_>, channel: &str) -> Result<(), sqlx::Error> {
    sqlx::query!("select pg_notify($1, '')", channel).execute(&mut **tx).await?;
    Ok(())
}

/// A query for [`JobRow`]s: the one column list, from `jobs j` with its team, class and
/// cluster joined, followed by `$rest` (the where clause and what follows it) and its
/// arguments. Written once so every read of a job shows the same fields.
macro_rules! select_jobs {
    ($rest:tt, $($arg:expr),* $(,)?) => {
        sqlx::query_as!(
            JobRow,
            r#"select j.id as "id: JobId", j.seq, j.team_id as "team_id: TeamId", t.name as team, j.name,
                  j.gpu_class_id as "gpu_class_id: GpuClassId", c.name as gpu_class,
                  j.priority_class, j.replicas, j.gpus_per_replica, j.max_replicas, j.extra_of as "extra_of: JobId",
                  (select g.attempt from jobs g where g.id = j.extra_of) as "extra_of_attempt?",
                  j.max_runtime_seconds, j.expected_runtime_seconds, j.image,
                  j.command as "command: Json<Vec<String>>", j.env as "env: Json<Value>",
                  j.labels as "labels: Json<Value>", j.topology_mode, j.topology_level,
                  j.preemption_grace_seconds, j.preemption_delay_seconds, j.max_retries, j.allow_spot,
                  j.cpu_millis, j.memory_mib, j.workload as "workload: Json<Workload>", j.min_driver_version, j.min_cuda_version,
                  j.state as "state: JobState", j.attempt, j.holds_gpus,
                  cl.name as "cluster?", j.placement as "placement: Json<Value>", j.borrowing,
                  j.pending_reason, j.pending_message, j.pending_figures as "pending_figures: Json<WaitFigures>",
                  j.queue_position, j.expected_start_at, j.stop_requested_at, j.last_checkpoint_at, j.exit_code, j.preemptions, j.submitted_by,
                  j.submitted_at, j.admitted_at, j.dispatched_at, j.started_at, j.finished_at, j.updated_at,
                  j.version, j.if_dependency_fails as "if_dependency_fails: IfDependencyFails",
                  j.array_id as "array_id: ArrayId", j.array_index, a.task_count as "array_task_count?",
                  j.service_id as "service_id: ServiceId", j.service_slot, j.service_revision,
                  s.name as "service?", s.port as "service_port?"
           from jobs j
           join teams t on t.id = j.team_id
           join gpu_classes c on c.id = j.gpu_class_id
           left join clusters cl on cl.id = j.cluster_id
           left join job_arrays a on a.id = j.array_id
           left join services s on s.id = j.service_id
           "# + $rest,
            $($arg),*
        )
    };
}

/// The job `id`, whichever team owns it (authorization happens before).
pub async fn get(db: impl sqlx::PgExecutor<'_>, id: JobId) -> Result<Option<JobRow>, sqlx::Error> {
    select_jobs!(r#"where j.id = $1"#, id as JobId).fetch_optional(db).await
}

/// The jobs `ids` that exist, in no particular order.
pub async fn get_many(db: impl sqlx::PgExecutor<'_>, ids: &[JobId]) -> Result<Vec<JobRow>, sqlx::Error> {
    select_jobs!(r#"where j.id = any($1)"#, ids as &[JobId]).fetch_all(db).await
}

/// The team owning job `id`, for authorization.
pub async fn team_of(pool: &PgPool, id: JobId) -> Result<Option<TeamId>, sqlx::Error> {
    sqlx::query_scalar!(r#"select team_id as "team_id: TeamId" from jobs where id = $1"#, id as JobId)
        .fetch_optional(pool)
        .await
}

/// Filters of a job list.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub state: Option<JobState>,
    pub gpu_class: Option<String>,
    /// Jobs whose labels contain all of these.
    pub labels: Option<Value>,
    /// Newest first: only jobs submitted before this sequence number.
    pub before_seq: Option<i64>,
}

/// A team's jobs, newest first.
pub async fn list(pool: &PgPool, team_id: TeamId, filter: &JobFilter, limit: i64) -> Result<Vec<JobRow>, sqlx::Error> {
    select_jobs!(
        r#"where j.team_id = $1
             and ($2::text is null or j.state = $2)
             and ($3::text is null or c.name = $3)
             and ($4::jsonb is null or j.labels @> $4)
             and ($5::int8 is null or j.seq < $5)
           order by j.seq desc
           limit $6"#,
        team_id as TeamId,
        filter.state.map(JobState::as_str),
        filter.gpu_class,
        filter.labels,
        filter.before_seq,
        limit
    )
    .fetch_all(pool)
    .await
}

/// The tasks of array `array_id` in index order from `from_index`, in `state` when given.
pub async fn array_tasks(
    pool: &PgPool,
    array_id: ArrayId,
    state: Option<JobState>,
    from_index: i32,
    limit: i64,
) -> Result<Vec<JobRow>, sqlx::Error> {
    select_jobs!(
        r#"where j.array_id = $1 and j.array_index >= $2 and ($3::text is null or j.state = $3)
           order by j.array_index
           limit $4"#,
        array_id as ArrayId,
        from_index,
        state.map(JobState::as_str),
        limit
    )
    .fetch_all(pool)
    .await
}

/// The replicas of service `id` that run or will, or still give GPUs back, and those
/// that ended since `since`, in slot order (newest first within a slot).
pub async fn service_replicas(
    db: impl sqlx::PgExecutor<'_>,
    id: ServiceId,
    since: DateTime<Utc>,
) -> Result<Vec<JobRow>, sqlx::Error> {
    select_jobs!(
        r#"where j.service_id = $1
             and (j.state in ('pending', 'admitted', 'running') or j.holds_gpus or j.finished_at >= $2)
           order by j.service_slot, j.seq desc"#,
        id as ServiceId,
        since
    )
    .fetch_all(db)
    .await
}

/// One pending job in its team's queue.
#[derive(Debug, Clone)]
pub struct QueueRow {
    pub id: JobId,
    pub name: String,
    pub gpu_class: String,
    pub priority_class: String,
    pub gpus: i32,
    pub submitted_at: DateTime<Utc>,
    pub queue_position: Option<i32>,
    pub pending_reason: Option<String>,
    pub pending_message: Option<String>,
    pub pending_figures: Option<Json<WaitFigures>>,
    pub expected_start_at: Option<DateTime<Utc>>,
}

/// A team's pending jobs in the order the scheduler would admit them.
pub async fn queue(pool: &PgPool, team_id: TeamId, limit: i64) -> Result<Vec<QueueRow>, sqlx::Error> {
    sqlx::query_as!(
        QueueRow,
        r#"select j.id as "id: JobId", j.name, c.name as gpu_class, j.priority_class, j.replicas * j.gpus_per_replica as "gpus!",
                  j.submitted_at, j.queue_position, j.pending_reason, j.pending_message,
                  j.pending_figures as "pending_figures: Json<WaitFigures>", j.expected_start_at
           from jobs j join gpu_classes c on c.id = j.gpu_class_id
           where j.team_id = $1 and j.state = 'pending'
           order by j.queue_position nulls last, j.seq
           limit $2"#,
        team_id as TeamId,
        limit
    )
    .fetch_all(pool)
    .await
}

/// Where pending job `job_id` stands among its team's pending jobs (1 first), in the order
/// [`queue`] lists them; `None` when it is not pending.
pub async fn team_position(pool: &PgPool, team_id: TeamId, job_id: JobId) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"select q.position as "position!" from (
               select id, row_number() over (order by queue_position nulls last, seq) as position
               from jobs where team_id = $1 and state = 'pending') q
           where q.id = $2"#,
        team_id as TeamId,
        job_id as JobId
    )
    .fetch_optional(pool)
    .await
}

/// A job's name and team, for pages that mention jobs by id.
#[derive(Debug, Clone)]
pub struct JobName {
    pub id: JobId,
    pub name: String,
    pub team_id: TeamId,
}

/// The names and teams of the jobs in `ids` that exist.
pub async fn names(pool: &PgPool, ids: &[JobId]) -> Result<Vec<JobName>, sqlx::Error> {
    sqlx::query_as!(
        JobName,
        r#"select id as "id: JobId", name, team_id as "team_id: TeamId" from jobs where id = any($1)"#,
        ids as &[JobId]
    )
    .fetch_all(pool)
    .await
}

/// One entry of a job's timeline.
#[derive(Debug, Clone)]
pub struct EventRow {
    pub id: i64,
    pub job_id: JobId,
    pub at: DateTime<Utc>,
    pub kind: String,
    pub attempt: i32,
    pub reason: Option<String>,
    pub message: String,
    pub data: Option<Value>,
}

impl JobRow {
    /// The topology the job asked for, if any.
    pub fn topology(&self) -> Option<TopologyWish> {
        let level = self.topology_level.as_deref().and_then(TopologyLevel::parse)?;
        match self.topology_mode.as_str() {
            "required" => Some(TopologyWish { level, mode: TopologyMode::Required }),
            "preferred" => Some(TopologyWish { level, mode: TopologyMode::Preferred }),
            _ => None,
        }
    }
}

/// A job's events in order, after event `after`.
pub async fn events(pool: &PgPool, job_id: JobId, after: i64, limit: i64) -> Result<Vec<EventRow>, sqlx::Error> {
    sqlx::query_as!(
        EventRow,
        r#"select id, job_id as "job_id: JobId", at, kind, attempt, reason, message, data from job_events
           where job_id = $1 and id > $2 order by id limit $3"#,
        job_id as JobId,
        after,
        limit
    )
    .fetch_all(pool)
    .await
}

/// The events of every job of team `team_id` in order, after event `after`.
pub async fn team_events(pool: &PgPool, team_id: TeamId, after: i64, limit: i64) -> Result<Vec<EventRow>, sqlx::Error> {
    sqlx::query_as!(
        EventRow,
        r#"select e.id, e.job_id as "job_id: JobId", e.at, e.kind, e.attempt, e.reason, e.message, e.data
           from job_events e join jobs j on j.id = e.job_id
           where j.team_id = $1 and e.id > $2 order by e.id limit $3"#,
        team_id as TeamId,
        after,
        limit
    )
    .fetch_all(pool)
    .await
}

/// The id of the newest event of any job (0 when there is none); ids only grow, so a change
/// says some timeline grew.
pub async fn newest_event_id(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(r#"select coalesce(max(id), 0)::int8 as "id!" from job_events"#).fetch_one(pool).await
}

/// Appends one event to a job's timeline.
pub async fn add_event(
    tx: &mut Tx<'_>,
    job_id: JobId,
    attempt: i32,
    kind: &str,
    reason: Option<&str>,
    message: &str,
    data: Option<Value>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "insert into job_events (job_id, attempt, kind, reason, message, data) values ($1, $2, $3, $4, $5, $6)",
        job_id as JobId,
        attempt,
        kind,
        reason,
        message,
        data
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// An event to add to a job's timeline (see [`add_events`]).
pub struct NewEvent {
    pub job_id: JobId,
    pub attempt: i32,
    pub kind: &'static str,
    pub reason: Option<String>,
    pub message: String,
    pub data: Option<Value>,
}

/// Adds events to jobs' timelines in one statement, in the order given.
pub async fn add_events(tx: &mut Tx<'_>, events: &[NewEvent]) -> Result<(), sqlx::Error> {
    if events.is_empty() {
        return Ok(());
    }
    let ids: Vec<JobId> = events.iter().map(|e| e.job_id).collect();
    let attempts: Vec<i32> = events.iter().map(|e| e.attempt).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind).collect();
    let reasons: Vec<Option<String>> = events.iter().map(|e| e.reason.clone()).collect();
    let messages: Vec<String> = events.iter().map(|e| e.message.clone()).collect();
    let data: Vec<Value> = events.iter().map(|e| e.data.clone().unwrap_or(Value::Null)).collect();
    sqlx::query!(
        "insert into job_events (job_id, attempt, kind, reason, message, data)
         select id, attempt, kind, reason, message, nullif(data, 'null'::jsonb)
         from unnest($1::uuid[], $2::int4[], $3::text[], $4::text[], $5::text[], $6::jsonb[])
              with ordinality as e(id, attempt, kind, reason, message, data, n)
         order by n",
        &ids as &[JobId],
        &attempts,
        &kinds as &[&str],
        &reasons as &[Option<String>],
        &messages,
        &data
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The job's state, attempt and whether it holds GPUs, locked for update.
pub struct LockedJob {
    pub state: JobState,
    pub attempt: i32,
    pub holds_gpus: bool,
    pub grace_ms: i64,
}

/// Locks job `id` for a state change.
pub async fn lock(tx: &mut Tx<'_>, id: JobId) -> Result<Option<LockedJob>, sqlx::Error> {
    sqlx::query_as!(
        LockedJob,
        r#"select j.state as "state: JobState", j.attempt, j.holds_gpus,
                  coalesce(j.preemption_grace_seconds, p.preemption_grace_seconds)::int8 * 1000 as "grace_ms!"
           from jobs j join priority_classes p on p.name = j.priority_class
           where j.id = $1 for update of j"#,
        id as JobId
    )
    .fetch_optional(&mut **tx)
    .await
}

/// Marks a job cancelled. A job holding GPUs keeps them until its backend object is gone;
/// `stop` queues the request to stop it.
pub async fn mark_cancelled(
    tx: &mut Tx<'_>,
    id: JobId,
    attempt: i32,
    stop_grace_ms: Option<i64>,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update jobs set state = 'cancelled', waits_for_dependencies = false, held_by_array = false,
                stop_requested_at = case when holds_gpus then coalesce(stop_requested_at, now()) end,
                finished_at = case when holds_gpus then null else now() end,
                pending_reason = null, pending_message = null, pending_figures = null, queue_position = null,
                expected_start_at = null,
                updated_at = now(), version = version + 1
         where id = $1",
        id as JobId
    )
    .execute(&mut **tx)
    .await?;
    if let Some(grace_ms) = stop_grace_ms {
        sqlx::query!(
            "insert into dispatch_outbox (job_id, attempt, action, grace_ms) values ($1, $2, 'stop', $3)",
            id as JobId,
            attempt,
            grace_ms
        )
        .execute(&mut **tx)
        .await?;
        notify(tx, super::outbox::DISPATCH_CHANNEL).await?;
    }
    notify(tx, SCHEDULE_CHANNEL).await?;
    Ok(())
}

/// Records a checkpoint of a running job; false when the job is not running.
pub async fn checkpoint(tx: &mut Tx<'_>, id: JobId, at: DateTime<Utc>) -> Result<bool, sqlx::Error> {
    let updated = sqlx::query!(
        "update jobs set last_checkpoint_at = $2, updated_at = now() where id = $1 and state = 'running'",
        id as JobId,
        at
    )
    .execute(&mut **tx)
    .await?;
    Ok(updated.rows_affected() == 1)
}

/// The longest gang (replicas × GPUs per replica) and largest replica any placement of a
/// class could give, and whether any cluster reports inventory at all.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClassCapacity {
    pub inventory_known: bool,
    pub total_gpus: i64,
    pub largest_node: i32,
    pub largest_nvlink_domain: i32,
    pub largest_rack: i64,
    pub largest_zone: i64,
    /// The GPUs of the class in its largest cluster: a gang lies within one cluster (a cloud
    /// pool is a cluster of its own).
    pub largest_cluster: i64,
    /// CPU (millicores) and memory (MiB) a replica gets per GPU of the class when its job
    /// names none; `None`: the platform's default.
    pub cpu_millis_per_gpu: Option<i32>,
    pub memory_mib_per_gpu: Option<i32>,
    /// The most CPU (millicores) and memory (MiB) any node of the class gives a replica;
    /// `None` when some node (or cloud pool) does not say, so no bound is known.
    pub largest_cpu_millis: Option<i32>,
    pub largest_memory_mib: Option<i32>,
}

/// What submissions of one team are validated against, read in one round trip.
#[derive(Debug, Clone)]
pub struct SubmitCatalogue {
    /// The team's runtime limit.
    pub max_runtime: i32,
    /// Every priority class, by name.
    pub priorities: Vec<String>,
    /// The priority classes that may be preempted (and so may borrow beyond reserved quota).
    pub preemptible: Vec<String>,
    /// The asked-for classes that exist, with what the inventory offers of each.
    pub classes: Vec<(String, GpuClassId, ClassCapacity)>,
    /// The team and its ancestors, nearest first, with their quotas for the asked-for
    /// classes: every level must hold a job within its reserved + burst.
    pub chain: Vec<ChainTeam>,
    /// Whether any team of the chain has a budget, of any month: only then is a submission
    /// checked against budgets (read fresh, since spend moves all the time).
    pub budgeted: bool,
    /// The catalogue's version this was read at (bumped by every change to it).
    pub version: i64,
}

/// One team of a submitting team's chain, with its quotas for the asked-for classes.
#[derive(Debug, Clone)]
pub struct ChainTeam {
    pub name: String,
    /// `(class, reserved, burst)` in GPUs; a class not listed has no quota (zero and zero).
    pub quotas: Vec<(GpuClassId, i32, i32)>,
}

impl ChainTeam {
    /// The team's reserved and burst quota of `class`, in GPUs.
    pub fn quota(&self, class: GpuClassId) -> (i32, i32) {
        self.quotas.iter().find(|q| q.0 == class).map_or((0, 0), |q| (q.1, q.2))
    }
}

/// The catalogue for submissions of team `team_id` asking for `classes`; `None` when the
/// team does not exist. Only capacity a backend reported with its nodes counts (its
/// `largest_node` is set); capacity declared through `PUT /clusters/{name}` has no shape
/// to validate a gang against.
pub async fn submit_catalogue(
    pool: &PgPool,
    team_id: TeamId,
    classes: &[String],
) -> Result<Option<SubmitCatalogue>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"select t.max_runtime_seconds,
                  (select v.version from catalogue_version v where v.id = 1) as "version!",
                  (select coalesce(array_agg(name order by name), '{}') from priority_classes) as "priorities!",
                  (select coalesce(array_agg(name order by name), '{}') from priority_classes where preemptible)
                      as "preemptible!",
                  exists (select 1 from cluster_nodes) as "inventory_known!",
                  c.id as "class_id?: GpuClassId", c.name as "class_name?",
                  coalesce(sum(cc.gpus), 0)::int8 as "total_gpus!",
                  coalesce(max(cc.largest_node), 0) as "largest_node!",
                  coalesce(max(cc.largest_nvlink_domain), 0) as "largest_nvlink_domain!",
                  coalesce(max(cc.largest_rack), 0)::int8 as "largest_rack!",
                  coalesce(max(cc.largest_zone), 0)::int8 as "largest_zone!",
                  coalesce(max(cc.gpus), 0)::int8 as "largest_cluster!",
                  c.cpu_millis_per_gpu, c.memory_mib_per_gpu,
                  (select case when bool_or(n.cpu_millis is null) then null else max(n.cpu_millis) end
                   from cluster_nodes n where n.gpu_class_id = c.id) as largest_cpu_millis,
                  (select case when bool_or(n.memory_mib is null) then null else max(n.memory_mib) end
                   from cluster_nodes n where n.gpu_class_id = c.id) as largest_memory_mib
           from teams t
           left join gpu_classes c on c.name = any($2::text[])
           left join cluster_capacity cc on cc.gpu_class_id = c.id and cc.largest_node > 0
           where t.id = $1
           group by t.id, c.id"#,
        team_id as TeamId,
        classes
    )
    .fetch_all(pool)
    .await?;
    let Some(first) = rows.first() else { return Ok(None) };
    let (max_runtime, priorities, preemptible, version) =
        (first.max_runtime_seconds, first.priorities.clone(), first.preemptible.clone(), first.version);
    let class_ids: Vec<Uuid> = rows.iter().filter_map(|r| r.class_id).map(Uuid::from).collect();
    // The tree is at most a few levels deep; the depth bound keeps a cycle (which the API
    // refuses) from looping.
    let quota_rows = sqlx::query!(
        r#"with recursive chain (id, name, parent_id, depth) as (
               select t.id, t.name, t.parent_id, 0 from teams t where t.id = $1
               union all
               select t.id, t.name, t.parent_id, c.depth + 1 from teams t join chain c on t.id = c.parent_id
               where c.depth < 64
           )
           select c.name as "name!", c.depth as "depth!", q.gpu_class_id as "class_id?: GpuClassId",
                  q.reserved as "reserved?", q.burst as "burst?",
                  exists (select 1 from budgets b where b.team_id = c.id) as "budgeted!"
           from chain c left join quotas q on q.team_id = c.id and q.gpu_class_id = any($2::uuid[])
           order by c.depth"#,
        team_id as TeamId,
        &class_ids
    )
    .fetch_all(pool)
    .await?;
    let mut chain: Vec<ChainTeam> = Vec::new();
    let mut depth = -1;
    let budgeted = quota_rows.iter().any(|r| r.budgeted);
    for r in quota_rows {
        if r.depth != depth {
            depth = r.depth;
            chain.push(ChainTeam { name: r.name, quotas: Vec::new() });
        }
        if let (Some(class), Some(reserved), Some(burst), Some(team)) =
            (r.class_id, r.reserved, r.burst, chain.last_mut())
        {
            team.quotas.push((class, reserved, burst));
        }
    }
    let classes = rows
        .into_iter()
        .filter_map(|r| {
            let capacity = ClassCapacity {
                inventory_known: r.inventory_known,
                total_gpus: r.total_gpus,
                largest_node: r.largest_node,
                largest_nvlink_domain: r.largest_nvlink_domain,
                largest_rack: r.largest_rack,
                largest_zone: r.largest_zone,
                largest_cluster: r.largest_cluster,
                cpu_millis_per_gpu: r.cpu_millis_per_gpu,
                memory_mib_per_gpu: r.memory_mib_per_gpu,
                largest_cpu_millis: r.largest_cpu_millis,
                largest_memory_mib: r.largest_memory_mib,
            };
            Some((r.class_name?, r.class_id?, capacity))
        })
        .collect();
    Ok(Some(SubmitCatalogue { max_runtime, priorities, preemptible, classes, chain, budgeted, version }))
}

/// Adds `ids.len()` extra replicas to elastic gang `gang`: job rows of one replica each,
/// copied from the gang and naming it in `extra_of`, pending until the cycle that added them
/// admits them in the same transaction. They never retry: an extra comes back only by the
/// gang growing again.
pub async fn insert_extras(tx: &mut Tx<'_>, gang: JobId, ids: &[JobId]) -> Result<u64, sqlx::Error> {
    let inserted = sqlx::query!(
        r#"with e as (
               insert into jobs (id, team_id, name, gpu_class_id, priority_class, replicas, gpus_per_replica,
                                 max_runtime_seconds, image, command, env, labels, topology_mode, topology_level,
                                 preemption_grace_seconds, max_retries, allow_spot, submitted_by, cpu_millis,
                                 memory_mib, workload, min_driver_version, min_cuda_version,
                                 preemption_delay_seconds, extra_of)
               select u.id, g.team_id, g.name, g.gpu_class_id, g.priority_class, 1, g.gpus_per_replica,
                      g.max_runtime_seconds, g.image, g.command, g.env, g.labels, 'any', null,
                      g.preemption_grace_seconds, 0, g.allow_spot, g.submitted_by, g.cpu_millis,
                      g.memory_mib, g.workload, g.min_driver_version, g.min_cuda_version,
                      g.preemption_delay_seconds, g.id
               from jobs g cross join unnest($2::uuid[]) as u(id)
               where g.id = $1 and g.max_replicas is not null
               returning id
           )
           insert into job_events (job_id, kind, attempt, message)
           select e.id, 'submitted', 0, 'added to elastic gang ' || $1::uuid || ' as an extra replica, in capacity no waiting job needs'
           from e"#,
        gang as JobId,
        ids as &[JobId]
    )
    .execute(&mut **tx)
    .await?;
    Ok(inserted.rows_affected())
}

/// Ends the extras that no longer belong to a running gang: those of a gang that ended or is
/// stopping, and any that was sent back to the queue (an extra never waits: it comes back
/// only by the gang growing). One holding GPUs is stopped with its grace period. Returns how
/// many were ended.
pub async fn end_orphan_extras(tx: &mut Tx<'_>) -> Result<u64, sqlx::Error> {
    let ended = sqlx::query!(
        r#"with o as (
               select e.id, e.attempt, e.holds_gpus,
                      coalesce(e.preemption_grace_seconds, p.preemption_grace_seconds)::int8 * 1000 as grace
               from jobs e
               join jobs g on g.id = e.extra_of
               join priority_classes p on p.name = e.priority_class
               where e.extra_of is not null and e.state in ('pending', 'admitted', 'running')
                 and (e.state = 'pending' or g.state not in ('admitted', 'running'))
               order by e.id
               for update of e
           ), ended as (
               update jobs j set state = 'cancelled',
                      stop_requested_at = case when o.holds_gpus then coalesce(j.stop_requested_at, now()) end,
                      finished_at = case when o.holds_gpus then null else now() end,
                      pending_reason = null, pending_message = null, pending_figures = null, queue_position = null,
                      expected_start_at = null, updated_at = now(), version = j.version + 1
               from o where j.id = o.id
               returning j.id, j.attempt, o.holds_gpus, o.grace
           ), events as (
               insert into job_events (job_id, attempt, kind, reason, message)
               select id, attempt, case when holds_gpus then 'cancel_requested' else 'cancelled' end, 'gang_ended',
                      'its elastic gang is no longer running, or it was sent back to the queue: an extra replica ends'
               from ended
           ), outbox as (
               insert into dispatch_outbox (job_id, attempt, action, grace_ms)
               select id, attempt, 'stop', grace from ended where holds_gpus
           )
           select count(*) as "ended!" from ended"#
    )
    .fetch_one(&mut **tx)
    .await?;
    Ok(ended.ended as u64)
}

/// How many extra replicas of elastic gang `gang` run (or are being started) now.
pub async fn running_extras(pool: &PgPool, gang: JobId) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(
        r#"select count(*) as "n!" from jobs where extra_of = $1 and state in ('admitted', 'running')"#,
        gang as JobId
    )
    .fetch_one(pool)
    .await
}
