//! Jobs: submission (one or a batch of up to 1,000, atomically), reads, the team's queue,
//! cancellation, checkpoints, the event timeline, and dry runs through the engine.

use crate::domain::JobId;
use axum::{
    extract::State,
    http::{header, HeaderMap, HeaderValue, StatusCode},
    response::sse::{Event as SseEvent, KeepAlive, Sse},
    Extension, Json,
};
use chrono::{DateTime, Utc};
use futures_util::{Stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::{collections::BTreeMap, convert::Infallible};
use utoipa::{IntoParams, ToSchema};

use super::{
    error::ApiError,
    extract::{etag, ApiJson, ListQuery, Page},
};
use crate::{
    auth::{
        policy::{JobAccess, TeamAccess},
        CatalogueVersion, Principal,
    },
    backends::ReplicaSlot,
    db,
    domain::{
        check_range,
        dependency::{After, IfDependencyFails},
        workload::{self, CloudSecretEnv, SecretEnv, Volume},
        FieldError, JobState, TopologyWish, WaitFigures,
    },
    ops::{
        self,
        jobs::{self, DryRunResult, JobSpec},
        timeline::{self, Followed},
    },
    state::AppState,
};

/// Why a pending job waits.
#[derive(Debug, Serialize, ToSchema)]
pub struct PendingInfo {
    /// Stable code of the first rule that blocks it, one of `never_fits`, `burst_limit`,
    /// `exceeds_quota`, `reserved_quota_exhausted`, `budget_exhausted`, `no_topology_fit`,
    /// `fair_share`, `insufficient_capacity`, `waiting_for_reclaim`, `reserved_for_gang`,
    /// `behind_head_of_line`, `victims_in_minimum_runtime`, `driver_unavailable`,
    /// `no_driver_fit`, `no_cpu_memory_fit`, `preemption_delayed`; or, before the scheduler sees
    /// the job, `waiting_for_dependencies` (jobs it depends on have not ended as it waits
    /// for; `figures.waiting_for` names them), `dependency_failed` (one never can, and
    /// the job has `if_dependency_fails: keep`) and `array_task_limit` (an array task its
    /// array's parallelism holds back until an earlier task ends).
    pub reason: Option<String>,
    /// The same in words, with the numbers.
    pub message: Option<String>,
    /// The numbers behind the reason.
    pub figures: Option<WaitFigures>,
    /// 1-based rank in the admission order of the last cycle.
    pub position: Option<i32>,
    /// When it is expected to start (the forecast's median), if that can be foreseen;
    /// `message` says what it waits for when it cannot.
    pub expected_start_at: Option<DateTime<Utc>>,
    /// The interval it is expected to start in: p10 and p90 of the forecast, calibrated by
    /// how wrong past forecasts were.
    pub earliest_start_at: Option<DateTime<Utc>>,
    pub latest_start_at: Option<DateTime<Utc>>,
}

/// A job.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobView {
    pub id: JobId,
    pub team: String,
    pub name: String,
    pub gpu_class: String,
    pub priority_class: String,
    pub replicas: i32,
    pub gpus_per_replica: i32,
    /// An elastic gang's most replicas (`replicas` is its least); null for a fixed gang.
    pub max_replicas: Option<i32>,
    /// The elastic gang this job is an extra replica of; null for any other job.
    pub extra_of: Option<JobId>,
    pub max_runtime_seconds: i32,
    /// What the job expects to run, in seconds; the forecast of expected starts uses it as
    /// this job's median runtime instead of its team's history. At most max_runtime_seconds.
    /// Null when the job declared none.
    pub expected_runtime_seconds: Option<i32>,
    pub image: String,
    pub command: Vec<String>,
    pub env: Value,
    pub labels: Value,
    pub topology: Option<TopologyWish>,
    pub preemption_grace_seconds: Option<i32>,
    /// Its own preemption delay in seconds; null: its priority class's.
    pub preemption_delay_seconds: Option<i32>,
    pub max_retries: i32,
    /// May run on spot capacity.
    pub allow_spot: bool,
    /// CPU per replica as asked for or defaulted from the GPU class (`4`, `500m`); null for
    /// jobs from before CPU was asked for.
    #[schema(example = "4")]
    pub cpu: Option<String>,
    /// The same in millicores.
    pub cpu_millis: Option<i32>,
    /// Memory per replica as asked for or defaulted from the GPU class (`32Gi`).
    #[schema(example = "32Gi")]
    pub memory: Option<String>,
    /// The same in MiB.
    pub memory_mib: Option<i32>,
    /// PersistentVolumeClaims mounted into every replica.
    pub volumes: Vec<Volume>,
    /// Variables read from Kubernetes Secrets of the team's namespace (references only).
    pub secret_env: Vec<SecretEnv>,
    /// Variables read from a cloud secret store (references only).
    pub cloud_secret_env: Vec<CloudSecretEnv>,
    /// Secrets of the team's namespace with registry credentials.
    pub image_pull_secrets: Vec<String>,
    /// Node labels each replica's node must carry.
    pub node_selector: BTreeMap<String, String>,
    /// The least NVIDIA driver version its nodes must run; null for any.
    #[schema(example = "550.54")]
    pub min_driver_version: Option<String>,
    /// The least CUDA version its nodes' driver must support; null for any.
    #[schema(example = "12.4")]
    pub min_cuda_version: Option<String>,
    pub state: JobState,
    /// Admissions so far; each runs as its own backend object.
    pub attempt: i32,
    /// Where the current attempt runs.
    pub cluster: Option<String>,
    /// Per replica: the node and GPU indices.
    pub placement: Option<Vec<ReplicaSlot>>,
    /// Admitted beyond its team's reserved quota: billed as burst and, if its priority class
    /// is preemptible, it may be preempted to give the capacity back. (A non-preemptible job
    /// runs beside its team's preemptible ones in the reserved quota; those give it back.)
    pub borrowing: bool,
    /// Present while pending.
    pub pending: Option<PendingInfo>,
    pub exit_code: Option<i32>,
    pub preemptions: i32,
    pub submitted_by: String,
    pub submitted_at: DateTime<Utc>,
    pub admitted_at: Option<DateTime<Utc>>,
    pub dispatched_at: Option<DateTime<Utc>>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub stop_requested_at: Option<DateTime<Utc>>,
    pub last_checkpoint_at: Option<DateTime<Utc>>,
    pub version: i64,
    /// The jobs this one waits for, each with what it waits for and the job's state now
    /// (absent when it waits for none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<DependencyView>,
    /// What becomes of it when a dependency can no longer be met: `cancel` or `keep`.
    pub if_dependency_fails: IfDependencyFails,
    /// The array it is a task of, when it is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub array: Option<ArrayTaskView>,
    /// The service it is a replica of, when it is one (its `max_runtime_seconds` then reads
    /// 2147483647: a replica has no maximum runtime).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceReplicaView>,
    /// Only in the answer to a submission, and only when there are some: what may keep the
    /// accepted job from running as asked (e.g. `exceeds_quota` with `wait_for_quota`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<FieldError>,
}

/// A task's place in its array.
#[derive(Debug, Serialize, ToSchema)]
pub struct ArrayTaskView {
    /// The array (`/api/v1/teams/{team}/arrays/{id}`).
    pub id: crate::domain::ArrayId,
    /// Its index, 0 to count - 1, which its environment holds as `FAIRWAY_ARRAY_TASK_ID`.
    pub index: i32,
    /// The array's task count.
    pub count: i32,
}

/// A replica's place in its service.
#[derive(Debug, Serialize, ToSchema)]
pub struct ServiceReplicaView {
    /// The service (`/api/v1/teams/{team}/services/{name}`).
    pub name: String,
    /// Its slot, 0 to the service's replicas - 1 (`FAIRWAY_SERVICE_REPLICA`); slots below the
    /// minimum run at the service's non-preemptible class.
    pub slot: i32,
    /// The service's revision it runs (`FAIRWAY_SERVICE_REVISION`).
    pub revision: i32,
}

/// A job another waits for.
#[derive(Debug, Serialize, ToSchema)]
pub struct DependencyView {
    pub job: JobId,
    pub name: String,
    /// What is waited for: `succeeded`, `finished` or `failed`.
    pub after: After,
    /// The job's state now.
    pub state: JobState,
}

impl From<db::dependencies::DependencyRow> for DependencyView {
    fn from(d: db::dependencies::DependencyRow) -> Self {
        Self { job: d.job, name: d.name, after: d.after, state: d.state }
    }
}

impl From<db::jobs::JobRow> for JobView {
    fn from(r: db::jobs::JobRow) -> Self {
        let state = r.state;
        let topology = r.topology();
        Self {
            id: r.id,
            team: r.team,
            name: r.name,
            gpu_class: r.gpu_class,
            priority_class: r.priority_class,
            replicas: r.replicas,
            gpus_per_replica: r.gpus_per_replica,
            max_replicas: r.max_replicas,
            extra_of: r.extra_of,
            max_runtime_seconds: r.max_runtime_seconds,
            expected_runtime_seconds: r.expected_runtime_seconds,
            image: r.image,
            command: r.command.0,
            env: r.env.0,
            labels: r.labels.0,
            topology,
            preemption_grace_seconds: r.preemption_grace_seconds,
            preemption_delay_seconds: r.preemption_delay_seconds,
            max_retries: r.max_retries,
            allow_spot: r.allow_spot,
            cpu: r.cpu_millis.map(workload::format_cpu),
            cpu_millis: r.cpu_millis,
            memory: r.memory_mib.map(workload::format_memory),
            memory_mib: r.memory_mib,
            volumes: r.workload.0.volumes,
            secret_env: r.workload.0.secret_env,
            cloud_secret_env: r.workload.0.cloud_secret_env,
            image_pull_secrets: r.workload.0.image_pull_secrets,
            node_selector: r.workload.0.node_selector,
            min_driver_version: r.min_driver_version,
            min_cuda_version: r.min_cuda_version,
            pending: (state == JobState::Pending).then(|| {
                let figures = r.pending_figures.map(|f| f.0);
                PendingInfo {
                    reason: r.pending_reason,
                    message: r.pending_message,
                    earliest_start_at: figures.as_ref().and_then(|f| f.earliest_start_at),
                    latest_start_at: figures.as_ref().and_then(|f| f.latest_start_at),
                    figures,
                    position: r.queue_position,
                    expected_start_at: r.expected_start_at,
                }
            }),
            state,
            attempt: r.attempt,
            cluster: r.cluster,
            placement: r.placement.and_then(|p| serde_json::from_value(p.0).ok()),
            borrowing: r.borrowing,
            exit_code: r.exit_code,
            preemptions: r.preemptions,
            submitted_by: r.submitted_by,
            submitted_at: r.submitted_at,
            admitted_at: r.admitted_at,
            dispatched_at: r.dispatched_at,
            started_at: r.started_at,
            finished_at: r.finished_at,
            stop_requested_at: r.stop_requested_at,
            last_checkpoint_at: r.last_checkpoint_at,
            version: r.version,
            depends_on: Vec::new(),
            if_dependency_fails: r.if_dependency_fails,
            array: match (r.array_id, r.array_index, r.array_task_count) {
                (Some(id), Some(index), Some(count)) => Some(ArrayTaskView { id, index, count }),
                _ => None,
            },
            service: match (r.service, r.service_slot, r.service_revision) {
                (Some(name), Some(slot), Some(revision)) => Some(ServiceReplicaView { name, slot, revision }),
                _ => None,
            },
            warnings: Vec::new(),
        }
    }
}

pub(super) fn with_etag(view: JobView) -> (HeaderMap, Json<JobView>) {
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, job_etag(&view));
    (headers, Json(view))
}

/// A job's entity tag: its version, which every state change bumps, plus a digest of what
/// changes without one (the scheduler's word on a waiting job, the last checkpoint), so a
/// conditional read never answers 304 for a representation that moved.
fn job_etag(view: &JobView) -> HeaderValue {
    let pending = view
        .pending
        .as_ref()
        .filter(|p| p.reason.is_some() || p.message.is_some() || p.position.is_some() || p.expected_start_at.is_some());
    if pending.is_none() && view.last_checkpoint_at.is_none() && view.depends_on.is_empty() {
        return etag(view.version);
    }
    use sha2::Digest as _;
    let volatile = serde_json::to_vec(&(pending, view.last_checkpoint_at, &view.depends_on)).unwrap_or_default();
    let digest: String = sha2::Sha256::digest(&volatile)[..8].iter().map(|b| format!("{b:02x}")).collect();
    // Digits, a dot and hex only: always a valid header value.
    HeaderValue::from_str(&format!("\"{}.{digest}\"", view.version)).unwrap_or_else(|_| etag(view.version))
}

async fn view(state: &AppState, id: JobId) -> Result<JobView, ApiError> {
    let job: JobView = db::jobs::get(&state.db, id).await?.ok_or(ApiError::NotFound("job"))?.into();
    with_dependencies(state, job).await
}

/// `job` with the jobs it waits for and their states now.
async fn with_dependencies(state: &AppState, mut job: JobView) -> Result<JobView, ApiError> {
    job.depends_on = db::dependencies::of_job(&state.db, job.id).await?.into_iter().map(Into::into).collect();
    Ok(job)
}

/// `jobs` with the jobs each waits for and their states now, in one read.
pub(super) async fn with_dependencies_all(state: &AppState, jobs: &mut [JobView]) -> Result<(), ApiError> {
    let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
    let mut by_job: std::collections::HashMap<JobId, Vec<DependencyView>> = std::collections::HashMap::new();
    for (waiting, d) in db::dependencies::of_jobs(&state.db, &ids).await? {
        by_job.entry(waiting).or_default().push(d.into());
    }
    for job in jobs {
        job.depends_on = by_job.remove(&job.id).unwrap_or_default();
    }
    Ok(())
}

/// Submits a job to the team's queue. Send an `Idempotency-Key` so a retried request
/// cannot submit twice.
#[utoipa::path(
    post, path = "/api/v1/teams/{team}/jobs", tag = "jobs", operation_id = "create_job",
    params(("team" = String, Path, description = "Team name"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    request_body = JobSpec,
    responses((status = 201, body = JobView), (status = 422, body = super::error::Problem))
)]
pub async fn create_job(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Extension(version): Extension<CatalogueVersion>,
    check: Option<Extension<db::jobs::WriteCheck>>,
    ApiJson(spec): ApiJson<JobSpec>,
) -> Result<(StatusCode, HeaderMap, Json<JobView>), ApiError> {
    let check = check.map(|Extension(c)| c);
    let depends = !spec.depends_on.is_empty();
    let submitted = jobs::submit(&state, &access.team, &principal.actor(), spec, version, check).await?;
    let mut view = JobView { warnings: submitted.warnings, ..submitted.job.into() };
    if depends {
        view = with_dependencies(&state, view).await?;
    }
    let (headers, body) = with_etag(view);
    Ok((StatusCode::CREATED, headers, body))
}

/// Runs a job again: a new job asking for exactly what this one asked for (image, command,
/// environment, labels, resources, limits, the jobs it waits for), submitted by the caller and checked as any new
/// submission; its label `fairway.dev/rerun-of` names this job. Send an `Idempotency-Key` so
/// a retried request cannot run it twice.
#[utoipa::path(
    post, path = "/api/v1/jobs/{job}/rerun", tag = "jobs", operation_id = "rerun_job",
    params(("job" = Uuid, Path, description = "The job to run again"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    responses(
        (status = 201, description = "The new job", body = JobView),
        (status = 404, description = "No such job, or not visible to the caller", body = super::error::Problem),
        (status = 422, description = "It could not run now as asked (a quota or budget changed)", body = super::error::Problem)
    )
)]
pub async fn rerun_job(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Extension(job): Extension<JobAccess>,
    Extension(version): Extension<CatalogueVersion>,
) -> Result<(StatusCode, HeaderMap, Json<JobView>), ApiError> {
    let job = db::jobs::get(&state.db, job.id).await?.ok_or(ApiError::NotFound("job"))?;
    let submitted = jobs::rerun(&state, &access.team, &principal.actor(), &job, version).await?;
    let view = with_dependencies(&state, JobView { warnings: submitted.warnings, ..submitted.job.into() }).await?;
    let (headers, body) = with_etag(view);
    Ok((StatusCode::CREATED, headers, body))
}

/// Up to 1,000 jobs submitted together.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobBatch {
    pub jobs: Vec<JobSpec>,
}

/// One submitted job of a batch.
#[derive(Debug, Serialize, ToSchema)]
pub struct SubmittedJob {
    pub id: JobId,
    pub name: String,
    pub state: JobState,
    /// What may keep it from running as asked, when anything does.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<FieldError>,
}

/// The jobs a batch submitted, in request order.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchResult {
    pub count: usize,
    pub jobs: Vec<SubmittedJob>,
}

/// Submits up to 1,000 jobs atomically: all are queued, or none (every invalid field of
/// every job is reported, as `jobs[i].field`).
#[utoipa::path(
    post, path = "/api/v1/teams/{team}/jobs:batch", tag = "jobs", operation_id = "create_jobs_batch",
    params(("team" = String, Path, description = "Team name"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    request_body = JobBatch,
    responses((status = 201, body = BatchResult), (status = 422, body = super::error::Problem))
)]
pub async fn create_jobs_batch(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Extension(version): Extension<CatalogueVersion>,
    ApiJson(batch): ApiJson<JobBatch>,
) -> Result<(StatusCode, Json<BatchResult>), ApiError> {
    let (jobs, warnings) = jobs::submit_batch(&state, access.team.id, &principal.actor(), &batch.jobs, version).await?;
    let jobs: Vec<SubmittedJob> = jobs
        .into_iter()
        .zip(warnings)
        .map(|(j, warnings)| SubmittedJob { id: j.id, name: j.name, state: JobState::Pending, warnings })
        .collect();
    Ok((StatusCode::CREATED, Json(BatchResult { count: jobs.len(), jobs })))
}

/// Filters of the job list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct JobListParams {
    /// Only jobs in this state.
    pub state: Option<String>,
    /// Only jobs of this GPU class.
    pub gpu_class: Option<String>,
    /// Only jobs carrying this label, as `key=value` (repeat with commas for several).
    pub label: Option<String>,
    /// Items per page, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    /// Cursor from a previous page's `next_cursor`.
    pub cursor: Option<String>,
}

/// Lists a team's jobs, newest first.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/jobs", tag = "jobs", operation_id = "list_jobs",
    params(("team" = String, Path, description = "Team name"), JobListParams),
    responses((status = 200, body = Page<JobView>), (status = 422, body = super::error::Problem))
)]
pub async fn list_jobs(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    ListQuery(params): ListQuery<JobListParams>,
) -> Result<Json<Page<JobView>>, ApiError> {
    let page = super::extract::PageRequest::parse(super::extract::PageParams {
        limit: params.limit,
        cursor: params.cursor.clone(),
    })?;
    if let Some(s) = &params.state {
        if JobState::parse(s).is_none() {
            let all: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
            return Err(ApiError::field(FieldError::new(
                "state",
                "invalid_value",
                format!("must be one of {}", all.join(", ")),
            )));
        }
    }
    let labels = match &params.label {
        None => None,
        Some(text) => {
            let mut map = serde_json::Map::new();
            for pair in text.split(',') {
                let (k, v) = pair.split_once('=').ok_or_else(|| {
                    ApiError::field(FieldError::new("label", "invalid_value", "must be key=value[,key=value...]"))
                })?;
                map.insert(k.trim().to_owned(), Value::String(v.trim().to_owned()));
            }
            Some(Value::Object(map))
        }
    };
    let before_seq = page.after_number()?;
    let filter = db::jobs::JobFilter {
        state: params.state.as_deref().and_then(JobState::parse),
        gpu_class: params.gpu_class,
        labels,
        before_seq,
    };
    let rows = db::jobs::list(&state.db, access.team.id, &filter, page.fetch()).await?;
    let mut listed = page.page(rows, |r| r.seq.to_string(), JobView::from);
    with_dependencies_all(&state, &mut listed.items).await?;
    Ok(Json(listed))
}

/// Reads a job. Send the `ETag` of a previous read as `If-None-Match` to poll cheaply: the
/// answer is `304` with no body until the job changes.
#[utoipa::path(
    get, path = "/api/v1/jobs/{job}", tag = "jobs", operation_id = "get_job",
    params(("job" = Uuid, Path, description = "Job id"),
           ("If-None-Match" = Option<String>, Header, description = "ETag from a previous read")),
    responses(
        (status = 200, description = "The job; its `ETag` changes whenever the representation does", body = JobView),
        (status = 304, description = "Unchanged since the read whose `ETag` was sent"),
        (status = 404, description = "No such job, or not visible to the caller", body = super::error::Problem)
    )
)]
pub async fn get_job(
    State(state): State<AppState>,
    Extension(job): Extension<JobAccess>,
) -> Result<(HeaderMap, Json<JobView>), ApiError> {
    Ok(with_etag(view(&state, job.id).await?))
}

/// Cancels a job. A pending job is cancelled at once; a running one is asked to stop with
/// its grace period and keeps its GPUs until it has. Cancelling a finished job is a 409.
#[utoipa::path(
    post, path = "/api/v1/jobs/{job}/cancel", tag = "jobs", operation_id = "cancel_job",
    params(("job" = Uuid, Path, description = "Job id")),
    responses((status = 200, body = JobView), (status = 409, description = "Already finished", body = super::error::Problem))
)]
pub async fn cancel_job(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(job): Extension<JobAccess>,
) -> Result<(HeaderMap, Json<JobView>), ApiError> {
    jobs::cancel(&state, &principal.actor(), job.id).await?;
    Ok(with_etag(view(&state, job.id).await?))
}

/// One entry of a job's timeline.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobEvent {
    pub id: i64,
    /// The job it belongs to.
    #[schema(value_type = uuid::Uuid)]
    pub job: JobId,
    pub at: DateTime<Utc>,
    /// `submitted`, `admitted`, `dispatched`, `running`, `preempted`, `requeued`,
    /// `cancel_requested`, `cancelled`, `succeeded`, `failed`, `checkpoint`,
    /// `dispatch_error`, `orphan_removed`.
    pub kind: String,
    /// The attempt it belongs to.
    pub attempt: i32,
    /// Stable code, e.g. `reclaim`, `burst`, `app_failed:OOMKilled`.
    pub reason: Option<String>,
    /// What happened, in words.
    pub message: String,
    /// Details: placement, the preemptor, the outcome.
    pub data: Option<Value>,
}

/// Paging of the timeline.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventParams {
    /// Only events after this id.
    pub after: Option<i64>,
    /// At most this many (1 to 1000, default 500).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
}

/// A job's timeline, oldest first.
#[utoipa::path(
    get, path = "/api/v1/jobs/{job}/events", tag = "jobs", operation_id = "list_job_events",
    params(("job" = Uuid, Path, description = "Job id"), EventParams),
    responses((status = 200, body = Vec<JobEvent>))
)]
pub async fn list_job_events(
    State(state): State<AppState>,
    Extension(job): Extension<JobAccess>,
    ListQuery(params): ListQuery<EventParams>,
) -> Result<Json<Vec<JobEvent>>, ApiError> {
    let limit = params.limit.unwrap_or(500);
    check_range("limit", limit, 1, 1000)?;
    let rows = db::jobs::events(&state.db, job.id, params.after.unwrap_or(0), limit).await?;
    Ok(Json(rows.into_iter().map(JobEvent::from).collect()))
}

impl From<db::jobs::EventRow> for JobEvent {
    fn from(e: db::jobs::EventRow) -> Self {
        Self {
            id: e.id,
            job: e.job_id,
            at: e.at,
            kind: e.kind,
            attempt: e.attempt,
            reason: e.reason,
            message: e.message,
            data: e.data,
        }
    }
}

/// Where a stream of the timeline starts.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StreamParams {
    /// Only events after this id. A reconnecting client sends the last id it saw, here or
    /// as `Last-Event-ID` (what browsers send); the later of the two counts.
    #[param(minimum = 0)]
    pub after: Option<i64>,
}

/// Follows a job's timeline as a server-sent event stream (`text/event-stream`), instead of
/// polling: each event as a frame `id: <event id>`, `event: job_event`, `data: <JobEvent>`;
/// once the job has ended and every event was sent, a last frame `event: end` whose data is
/// the job, and the stream closes. A comment line every 15 s keeps proxies from closing an
/// idle stream. A stream that closes without `end` (the server restarting) is resumed by
/// reconnecting with the last id seen. A job of another team is a 404, as everywhere.
#[utoipa::path(
    get, path = "/api/v1/jobs/{job}/events:stream", tag = "jobs", operation_id = "stream_job_events",
    params(("job" = Uuid, Path, description = "Job id"), StreamParams,
           ("Last-Event-ID" = Option<String>, Header, description = "The last event id seen, when reconnecting")),
    responses(
        (status = 200, description = "Frames `job_event` (data: a JobEvent), then `end` (data: the Job)",
         content_type = "text/event-stream", body = String),
        (status = 404, description = "No such job, or not visible to the caller", body = super::error::Problem)
    )
)]
pub async fn stream_job_events(
    State(state): State<AppState>,
    Extension(job): Extension<JobAccess>,
    headers: HeaderMap,
    ListQuery(params): ListQuery<StreamParams>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let after = resume_after(&params, &headers)?.unwrap_or(0);
    let frames = timeline::follow(&state, job.id, after).map(frame);
    Ok(Sse::new(frames).keep_alive(KeepAlive::default()))
}

/// Follows the timelines of every job of a team as one server-sent event stream: frames
/// `job_event` as [`stream_job_events`] sends them (each event names its `job`), from now on,
/// or after the event id given as `after` or `Last-Event-ID`. It has no end: the client
/// closes it. A team the caller cannot see is a 404.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/events:stream", tag = "jobs", operation_id = "stream_team_events",
    params(("team" = String, Path, description = "Team name"), StreamParams,
           ("Last-Event-ID" = Option<String>, Header, description = "The last event id seen, when reconnecting")),
    responses(
        (status = 200, description = "Frames `job_event` (data: a JobEvent)", content_type = "text/event-stream", body = String),
        (status = 404, description = "No such team, or not visible to the caller", body = super::error::Problem)
    )
)]
pub async fn stream_team_events(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    headers: HeaderMap,
    ListQuery(params): ListQuery<StreamParams>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiError> {
    let after = resume_after(&params, &headers)?;
    let frames = timeline::follow_team(&state, access.team.id, after).await?.map(frame);
    Ok(Sse::new(frames).keep_alive(KeepAlive::default()))
}

/// Which part of a job's log to read.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LogParams {
    /// The attempt, from 1; the job's latest by default.
    #[param(minimum = 1)]
    pub attempt: Option<i64>,
    /// One replica's lines, from 0; by default every replica's, each line prefixed
    /// `[replica N] ` when the job has more than one.
    #[param(minimum = 0)]
    pub replica: Option<i64>,
    /// Go on with each new line as it is kept, until the attempt is over (as `kubectl logs
    /// -f`); a job that has not started yet is waited for.
    pub follow: Option<bool>,
    /// Start each line with the time the backend received it (RFC 3339, microseconds).
    pub timestamps: Option<bool>,
}

/// What the job's GPUs did in its latest attempt, from NVIDIA DCGM as the platform's
/// Prometheus server scrapes it (dcgm-exporter on Kubernetes; the simulated cluster publishes
/// the same fields): utilisation, SM and tensor-core activity and memory, per replica and
/// for the whole job, at the last sample and over the attempt. Allocation (what the job
/// holds and is billed for) is on the job itself; this is what it used. Sampled every
/// `FAIRWAY_UTILISATION_INTERVAL_MS` while the job runs; `measured` is false where no
/// Prometheus server is configured. A job of another team is a 404.
#[utoipa::path(
    get, path = "/api/v1/jobs/{job}/utilisation", tag = "jobs", operation_id = "job_utilisation",
    params(("job" = Uuid, Path, description = "Job id")),
    responses(
        (status = 200, body = ops::utilisation::JobActivity),
        (status = 404, description = "No such job, or not visible to the caller", body = super::error::Problem)
    )
)]
pub async fn job_utilisation(
    State(state): State<AppState>,
    Extension(job): Extension<JobAccess>,
) -> Result<Json<ops::utilisation::JobActivity>, ApiError> {
    Ok(Json(ops::utilisation::of_job(&state, job.id).await?))
}

/// A job's log as plain text, one line per line the application wrote (standard output and
/// error, as its backend keeps them), oldest first. Fairway keeps the newest lines of each
/// replica and attempt (`FAIRWAY_LOG_TAIL_LINES`, 5,000 by default) after the backend's
/// object is gone; a first line says how many older ones were let go. With `follow=true` the
/// response goes on until the attempt is over. Lines reach Fairway every few seconds while a
/// job runs, and all of them before its end is recorded. A job of another team is a 404.
#[utoipa::path(
    get, path = "/api/v1/jobs/{job}/logs", tag = "jobs", operation_id = "job_logs",
    params(("job" = Uuid, Path, description = "Job id"), LogParams),
    responses(
        (status = 200, description = "The log's lines", content_type = "text/plain", body = String),
        (status = 404, description = "No such job, or not visible to the caller", body = super::error::Problem),
        (status = 422, description = "An attempt or replica the job does not have", body = super::error::Problem)
    )
)]
pub async fn job_logs(
    State(state): State<AppState>,
    Extension(job): Extension<JobAccess>,
    ListQuery(params): ListQuery<LogParams>,
) -> Result<axum::response::Response, ApiError> {
    let request = ops::logs::LogRequest {
        attempt: params.attempt,
        replica: params.replica,
        follow: params.follow.unwrap_or(false),
        timestamps: params.timestamps.unwrap_or(false),
    };
    let reader = ops::logs::open(&state, job.id, request).await?;
    Ok(crate::http::text_stream(reader.stream()))
}

/// Where a stream resumes: the later of `after` and `Last-Event-ID`, or `None` when neither
/// was sent.
fn resume_after(params: &StreamParams, headers: &HeaderMap) -> Result<Option<i64>, ApiError> {
    if let Some(after) = params.after {
        check_range("after", after, 0, i64::MAX)?;
    }
    let last_seen = match headers.get("last-event-id") {
        None => None,
        Some(v) => {
            Some(v.to_str().ok().and_then(|v| v.trim().parse::<i64>().ok()).filter(|&id| id >= 0).ok_or_else(|| {
                FieldError::new("Last-Event-ID", "invalid", "must be an event id, a whole number of at least 0")
            })?)
        }
    };
    Ok(params.after.max(last_seen))
}

/// One item of a followed timeline as a frame.
fn frame(item: ops::Result<Followed>) -> Result<SseEvent, Infallible> {
    Ok(match item {
        Ok(Followed::Event(e)) => {
            let id = e.id;
            sse_json(SseEvent::default().id(id.to_string()).event("job_event"), &JobEvent::from(e))
        }
        Ok(Followed::End(job)) => sse_json(SseEvent::default().event("end"), &JobView::from(*job)),
        Err(e) => {
            tracing::warn!(error = %e, "an event stream stopped");
            SseEvent::default().event("error").data("the stream stopped; reconnect with the last event id")
        }
    })
}

/// A frame carrying `value` as JSON; serialising our own wire types cannot fail, and if it
/// did the frame says so rather than the stream breaking.
fn sse_json(frame: SseEvent, value: &impl Serialize) -> SseEvent {
    match serde_json::to_string(value) {
        Ok(json) => frame.data(json),
        Err(_) => frame.event("error").data("an event could not be written"),
    }
}

/// A checkpoint a running job reports: work before it survives a preemption, and the
/// scheduler prefers victims that lose the least.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// When the checkpoint was written; default now. Not in the future.
    #[serde(default)]
    pub at: Option<DateTime<Utc>>,
    /// Training step or other progress marker, for the timeline.
    #[serde(default)]
    pub step: Option<i64>,
}

/// Reports a checkpoint of a running job.
#[utoipa::path(
    post, path = "/api/v1/jobs/{job}/checkpoint", tag = "jobs", operation_id = "report_checkpoint",
    params(("job" = Uuid, Path, description = "Job id")),
    request_body = Checkpoint,
    responses((status = 200, body = JobView), (status = 409, description = "The job is not running", body = super::error::Problem))
)]
pub async fn report_checkpoint(
    State(state): State<AppState>,
    Extension(job): Extension<JobAccess>,
    ApiJson(body): ApiJson<Checkpoint>,
) -> Result<(HeaderMap, Json<JobView>), ApiError> {
    jobs::report_checkpoint(&state, job.id, body.at, body.step).await?;
    Ok(with_etag(view(&state, job.id).await?))
}

/// A pending job in its team's queue.
#[derive(Debug, Serialize, ToSchema)]
pub struct QueueEntry {
    pub id: JobId,
    pub name: String,
    pub gpu_class: String,
    pub priority_class: String,
    pub gpus: i32,
    pub submitted_at: DateTime<Utc>,
    /// 1-based rank in the admission order of the last cycle (over all teams).
    pub position: Option<i32>,
    pub reason: Option<String>,
    pub message: Option<String>,
    /// The numbers behind the reason.
    pub figures: Option<WaitFigures>,
    /// When it is expected to start (the forecast's median), and the interval around it
    /// (p10 and p90, calibrated by how wrong past forecasts were).
    pub expected_start_at: Option<DateTime<Utc>>,
    pub earliest_start_at: Option<DateTime<Utc>>,
    pub latest_start_at: Option<DateTime<Utc>>,
}

/// Paging of the queue.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct QueueParams {
    /// At most this many (1 to 1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
}

/// The team's pending jobs in admission order, each with its reason and expected start.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/queue", tag = "jobs", operation_id = "get_queue",
    params(("team" = String, Path, description = "Team name"), QueueParams),
    responses((status = 200, body = Vec<QueueEntry>))
)]
pub async fn get_queue(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    ListQuery(params): ListQuery<QueueParams>,
) -> Result<Json<Vec<QueueEntry>>, ApiError> {
    let limit = params.limit.unwrap_or(100);
    check_range("limit", limit, 1, 1000)?;
    let rows = db::jobs::queue(&state.db, access.team.id, limit).await?;
    Ok(Json(
        rows.into_iter()
            .map(|r| {
                let figures = r.pending_figures.map(|f| f.0);
                QueueEntry {
                    id: r.id,
                    name: r.name,
                    gpu_class: r.gpu_class,
                    priority_class: r.priority_class,
                    gpus: r.gpus,
                    submitted_at: r.submitted_at,
                    position: r.queue_position,
                    reason: r.pending_reason,
                    message: r.pending_message,
                    earliest_start_at: figures.as_ref().and_then(|f| f.earliest_start_at),
                    latest_start_at: figures.as_ref().and_then(|f| f.latest_start_at),
                    figures,
                    expected_start_at: r.expected_start_at,
                }
            })
            .collect(),
    ))
}

/// Answers "what if I submitted this now" through the engine, on the current state,
/// without changing anything.
#[utoipa::path(
    post, path = "/api/v1/teams/{team}/jobs:dry-run", tag = "jobs", operation_id = "dry_run_job",
    params(("team" = String, Path, description = "Team name")),
    request_body = JobSpec,
    responses((status = 200, body = DryRunResult), (status = 422, body = super::error::Problem))
)]
pub async fn dry_run_job(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    Extension(version): Extension<CatalogueVersion>,
    ApiJson(spec): ApiJson<JobSpec>,
) -> Result<Json<DryRunResult>, ApiError> {
    Ok(Json(jobs::dry_run(&state, access.team.id, &spec, version).await?))
}
