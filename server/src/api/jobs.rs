//! Jobs: submission (one or a batch of up to 1,000, atomically), reads, the team's queue,
//! cancellation, checkpoints, the event timeline, and dry runs through the engine.

use std::collections::{BTreeMap, HashMap};

use axum::{
    extract::State,
    http::{header, HeaderMap, StatusCode},
    Extension, Json,
};
use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::{
    error::ApiError,
    extract::{etag, ApiJson, ListQuery, Page},
};
use crate::{
    app::AppState,
    auth::{
        policy::{JobAccess, TeamAccess},
        CatalogueVersion, Principal,
    },
    backends::ReplicaSlot,
    control,
    db::{self, jobs::NewJob},
    domain::{
        check_range,
        job::{self, check_command, check_env, check_grace, check_image, check_labels},
        FieldError, JobState, TopologyLevel, TopologyMode, TopologyWish,
    },
    scheduler,
};

/// The most jobs one batch may submit.
pub const MAX_BATCH: usize = 1000;
/// Default maximum runtime when a job names none: a day, or the team's limit if lower.
const DEFAULT_MAX_RUNTIME_SECONDS: i32 = 86_400;

/// A job to submit.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Free text shown to people.
    pub name: String,
    /// GPU class from the catalogue, e.g. `h100-80gb` or `a100-80gb.mig-3g.40gb`.
    pub gpu_class: String,
    /// Replicas of the gang (all or none run). Default 1.
    #[serde(default = "one")]
    pub replicas: i64,
    /// GPUs (units of the class) per replica, all on one node. Default 1.
    #[serde(default = "one")]
    pub gpus_per_replica: i64,
    /// Priority class. Default `experiment` (preemptible, may borrow burst capacity).
    #[serde(default)]
    pub priority_class: Option<String>,
    /// Longest the job may run; at most the team's limit. Default a day (or the limit).
    #[serde(default)]
    pub max_runtime_seconds: Option<i64>,
    /// Container image.
    pub image: String,
    /// Command and arguments.
    #[serde(default)]
    pub command: Vec<String>,
    /// Environment variables (names starting with `FAIRWAY_` are the platform's, except the
    /// simulator's `FAIRWAY_SIM_*` hints).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Labels, Kubernetes style, for filtering and cost allocation.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Keep the gang within one domain of a topology level.
    #[serde(default)]
    pub topology: Option<TopologyWish>,
    /// Seconds to checkpoint when preempted; default from the priority class.
    #[serde(default)]
    pub preemption_grace_seconds: Option<i64>,
    /// Times to rerun the job after the application fails. Default 0.
    #[serde(default)]
    pub max_retries: Option<i64>,
    /// The job tolerates spot capacity: it may run on spot cloud pools (cheaper), and a spot
    /// interruption requeues it without counting as a failure. Default false.
    #[serde(default)]
    pub allow_spot: bool,
}

fn one() -> i64 {
    1
}

/// Why a pending job waits.
#[derive(Debug, Serialize, ToSchema)]
pub struct PendingInfo {
    /// Stable code of the first rule that blocks it, e.g. `fair_share_behind:ml-research`.
    pub reason: Option<String>,
    /// The same in words.
    pub message: Option<String>,
    /// 1-based rank in the admission order of the last cycle.
    pub position: Option<i32>,
    /// When it is expected to start, if that can be foreseen.
    pub expected_start_at: Option<DateTime<Utc>>,
}

/// A job.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobView {
    pub id: Uuid,
    pub team: String,
    pub name: String,
    pub gpu_class: String,
    pub priority_class: String,
    pub replicas: i32,
    pub gpus_per_replica: i32,
    pub max_runtime_seconds: i32,
    pub image: String,
    pub command: Vec<String>,
    pub env: Value,
    pub labels: Value,
    pub topology: Option<TopologyWish>,
    pub preemption_grace_seconds: Option<i32>,
    pub max_retries: i32,
    /// May run on spot capacity.
    pub allow_spot: bool,
    pub state: JobState,
    /// Admissions so far; each runs as its own backend object.
    pub attempt: i32,
    /// Where the current attempt runs.
    pub cluster: Option<String>,
    /// Per replica: the node and GPU indices.
    pub placement: Option<Vec<ReplicaSlot>>,
    /// Runs on burst capacity and may be preempted to give it back.
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
}

impl From<db::jobs::JobRow> for JobView {
    fn from(r: db::jobs::JobRow) -> Self {
        let state = JobState::parse(&r.state).unwrap_or(JobState::Pending);
        let topology = match (r.topology_mode.as_str(), r.topology_level.as_deref().and_then(TopologyLevel::parse)) {
            ("required", Some(level)) => Some(TopologyWish { level, mode: TopologyMode::Required }),
            ("preferred", Some(level)) => Some(TopologyWish { level, mode: TopologyMode::Preferred }),
            _ => None,
        };
        Self {
            id: r.id,
            team: r.team,
            name: r.name,
            gpu_class: r.gpu_class,
            priority_class: r.priority_class,
            replicas: r.replicas,
            gpus_per_replica: r.gpus_per_replica,
            max_runtime_seconds: r.max_runtime_seconds,
            image: r.image,
            command: r.command.0,
            env: r.env.0,
            labels: r.labels.0,
            topology,
            preemption_grace_seconds: r.preemption_grace_seconds,
            max_retries: r.max_retries,
            allow_spot: r.allow_spot,
            pending: (state == JobState::Pending).then_some(PendingInfo {
                reason: r.pending_reason,
                message: r.pending_message,
                position: r.queue_position,
                expected_start_at: r.expected_start_at,
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
        }
    }
}

/// The catalogue a batch is validated against, read once per request.
struct Catalogue {
    classes: HashMap<String, (Uuid, db::jobs::ClassCapacity)>,
    priorities: Vec<String>,
    max_runtime: i32,
}

/// Catalogues read for submissions, by team and asked-for classes, each with the version it
/// was read at. A request whose authentication saw the same version uses the copy: the
/// version is bumped in the transaction of every change, so the copy is exactly current.
#[derive(Default)]
pub struct CatalogueCache(std::sync::Mutex<HashMap<(Uuid, Vec<String>), db::jobs::SubmitCatalogue>>);

/// Entries kept before the cache starts over (one per team and set of classes in use).
const CATALOGUE_CACHE_ENTRIES: usize = 4096;

impl Catalogue {
    async fn load(
        state: &AppState,
        team_id: Uuid,
        specs: &[JobSpec],
        version: CatalogueVersion,
    ) -> Result<Self, ApiError> {
        let mut names: Vec<String> = specs.iter().map(|s| s.gpu_class.clone()).collect();
        names.sort_unstable();
        names.dedup();
        let key = (team_id, names);
        let cached = version.0.and_then(|v| {
            let cache = state.catalogues.0.lock().ok()?;
            cache.get(&key).filter(|c| c.version == v).cloned()
        });
        let catalogue = match cached {
            Some(c) => c,
            None => {
                let c =
                    db::jobs::submit_catalogue(&state.db, team_id, &key.1).await?.ok_or(ApiError::NotFound("team"))?;
                if let Ok(mut cache) = state.catalogues.0.lock() {
                    if cache.len() >= CATALOGUE_CACHE_ENTRIES {
                        cache.clear();
                    }
                    cache.insert(key, c.clone());
                }
                c
            }
        };
        Ok(Self {
            classes: catalogue.classes.into_iter().map(|(name, id, capacity)| (name, (id, capacity))).collect(),
            priorities: catalogue.priorities,
            max_runtime: catalogue.max_runtime,
        })
    }

    /// Validates one spec, naming failing fields under `prefix`.
    fn validate(&self, prefix: &str, spec: &JobSpec) -> Result<NewJob, Vec<FieldError>> {
        let at = |f: &str| format!("{prefix}{f}");
        let mut errors = Vec::new();
        let mut check = |r: Result<(), FieldError>| {
            if let Err(e) = r {
                errors.push(e);
            }
        };
        check(job::check_name(&at("name"), &spec.name));
        check(check_image(&at("image"), &spec.image));
        check(check_command(&at("command"), &spec.command));
        check(check_env(&at("env"), &spec.env));
        check(check_labels(&at("labels"), &spec.labels));
        check(check_range(&at("replicas"), spec.replicas, 1, 1024));
        check(check_range(&at("gpus_per_replica"), spec.gpus_per_replica, 1, 64));
        if let Some(g) = spec.preemption_grace_seconds {
            check(check_grace(&at("preemption_grace_seconds"), g));
        }
        if let Some(r) = spec.max_retries {
            check(check_range(&at("max_retries"), r, 0, 100));
        }
        let max_runtime =
            spec.max_runtime_seconds.unwrap_or(i64::from(DEFAULT_MAX_RUNTIME_SECONDS.min(self.max_runtime)));
        if max_runtime < 1 {
            check(Err(FieldError::new(at("max_runtime_seconds"), "too_small", "must be at least 1")));
        } else if max_runtime > i64::from(self.max_runtime) {
            check(Err(FieldError::new(
                at("max_runtime_seconds"),
                "exceeds_team_limit",
                format!("must be at most the team's limit of {} seconds", self.max_runtime),
            )));
        }
        let priority = spec.priority_class.clone().unwrap_or_else(|| "experiment".into());
        if !self.priorities.contains(&priority) {
            check(Err(FieldError::new(
                at("priority_class"),
                "not_found",
                format!("priority class {priority} does not exist; one of: {}", self.priorities.join(", ")),
            )));
        }
        let class = self.classes.get(&spec.gpu_class);
        match class {
            None => check(Err(FieldError::new(
                at("gpu_class"),
                "not_found",
                format!("GPU class {} does not exist", spec.gpu_class),
            ))),
            Some((_, cap)) if cap.inventory_known => {
                if cap.total_gpus == 0 {
                    check(Err(FieldError::new(
                        at("gpu_class"),
                        "no_capacity",
                        format!("no cluster offers GPU class {}", spec.gpu_class),
                    )));
                } else if spec.gpus_per_replica > i64::from(cap.largest_node) {
                    check(Err(FieldError::new(
                        at("gpus_per_replica"),
                        "never_fits",
                        format!("a replica must fit on one node, and the largest has {} GPUs", cap.largest_node),
                    )));
                } else if spec.replicas.saturating_mul(spec.gpus_per_replica) > cap.total_gpus {
                    check(Err(FieldError::new(
                        at("replicas"),
                        "never_fits",
                        format!(
                            "the gang needs {} GPUs and all clusters together have {}",
                            spec.replicas.saturating_mul(spec.gpus_per_replica),
                            cap.total_gpus
                        ),
                    )));
                } else if let Some(TopologyWish { level, mode: TopologyMode::Required }) = spec.topology {
                    let largest = match level {
                        TopologyLevel::NvlinkDomain => i64::from(cap.largest_nvlink_domain),
                        TopologyLevel::Node => i64::from(cap.largest_node),
                        TopologyLevel::Rack => cap.largest_rack,
                        TopologyLevel::Zone => cap.largest_zone,
                    };
                    if spec.replicas.saturating_mul(spec.gpus_per_replica) > largest {
                        check(Err(FieldError::new(
                            at("topology"),
                            "never_fits",
                            format!(
                                "the gang needs {} GPUs within one {}, and the largest has {largest}",
                                spec.replicas.saturating_mul(spec.gpus_per_replica),
                                level.as_str()
                            ),
                        )));
                    }
                }
            }
            Some(_) => {}
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let (mode, level) = match spec.topology {
            None => ("any", None),
            Some(TopologyWish { level, mode: TopologyMode::Required }) => ("required", Some(level.as_str().to_owned())),
            Some(TopologyWish { level, mode: TopologyMode::Preferred }) => {
                ("preferred", Some(level.as_str().to_owned()))
            }
        };
        Ok(NewJob {
            id: Uuid::new_v4(),
            name: spec.name.trim().to_owned(),
            gpu_class_id: class.map(|c| c.0).unwrap_or_default(),
            priority_class: priority,
            replicas: spec.replicas as i32,
            gpus_per_replica: spec.gpus_per_replica as i32,
            max_runtime_seconds: max_runtime as i32,
            image: spec.image.clone(),
            command: serde_json::json!(spec.command),
            env: serde_json::json!(spec.env),
            labels: serde_json::json!(spec.labels),
            topology_mode: mode.to_owned(),
            topology_level: level,
            preemption_grace_seconds: spec.preemption_grace_seconds.map(|g| g as i32),
            max_retries: spec.max_retries.unwrap_or(0) as i32,
            allow_spot: spec.allow_spot,
        })
    }
}

fn with_etag(view: JobView) -> (HeaderMap, Json<JobView>) {
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag(view.version));
    (headers, Json(view))
}

async fn view(state: &AppState, id: Uuid) -> Result<JobView, ApiError> {
    Ok(db::jobs::get(&state.db, id).await?.ok_or(ApiError::NotFound("job"))?.into())
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
    let row = submit(&state, &access.team, &principal.actor(), spec, version, check).await?;
    let (headers, body) = with_etag(row.into());
    Ok((StatusCode::CREATED, headers, body))
}

/// Validates `spec` against the catalogue and queues it for `team` on behalf of `by`; the
/// stored job. The API and the portal both submit through this. With a `check` (the caller
/// was authorised from cached credentials) nothing is stored unless the write finds it
/// still true: [`ApiError::CredentialsChanged`] otherwise.
pub async fn submit(
    state: &AppState,
    team: &db::teams::TeamRow,
    by: &str,
    spec: JobSpec,
    version: CatalogueVersion,
    check: Option<db::jobs::WriteCheck>,
) -> Result<db::jobs::JobRow, ApiError> {
    let catalogue = Catalogue::load(state, team.id, std::slice::from_ref(&spec), version).await?;
    let job = catalogue.validate("", &spec).map_err(ApiError::Validation)?;
    let stored =
        state.submissions.submit(team.id, by, job.clone(), check).await?.ok_or(ApiError::CredentialsChanged)?;
    state.wake_scheduler();
    Ok(db::jobs::JobRow::submitted(job, stored, team.id, &team.name, &spec.gpu_class, by))
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
    pub id: Uuid,
    pub name: String,
    pub state: JobState,
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
    if batch.jobs.is_empty() || batch.jobs.len() > MAX_BATCH {
        return Err(ApiError::field(FieldError::new(
            "jobs",
            if batch.jobs.is_empty() { "too_few" } else { "too_many" },
            format!("must hold 1 to {MAX_BATCH} jobs"),
        )));
    }
    let catalogue = Catalogue::load(&state, access.team.id, &batch.jobs, version).await?;
    let mut jobs = Vec::with_capacity(batch.jobs.len());
    let mut errors = Vec::new();
    for (i, spec) in batch.jobs.iter().enumerate() {
        match catalogue.validate(&format!("jobs[{i}]."), spec) {
            Ok(job) => jobs.push(job),
            Err(mut e) => errors.append(&mut e),
        }
    }
    if !errors.is_empty() {
        return Err(ApiError::Validation(errors));
    }
    db::jobs::insert_many(&state.db, access.team.id, &principal.actor(), &jobs).await?;
    state.wake_scheduler();
    let jobs: Vec<SubmittedJob> =
        jobs.into_iter().map(|j| SubmittedJob { id: j.id, name: j.name, state: JobState::Pending }).collect();
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
    let before_seq = match page.after.as_deref() {
        None => None,
        Some(c) => Some(c.parse::<i64>().map_err(|_| {
            ApiError::field(FieldError::new("cursor", "invalid_value", "is not a cursor this API issued"))
        })?),
    };
    let filter = db::jobs::JobFilter { state: params.state, gpu_class: params.gpu_class, labels, before_seq };
    let rows = db::jobs::list(&state.db, access.team.id, &filter, page.fetch()).await?;
    Ok(Json(page.page(rows, |r| r.seq.to_string(), JobView::from)))
}

/// Reads a job.
#[utoipa::path(
    get, path = "/api/v1/jobs/{job}", tag = "jobs", operation_id = "get_job",
    params(("job" = Uuid, Path, description = "Job id")),
    responses((status = 200, body = JobView), (status = 404, body = super::error::Problem))
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
    cancel(&state, &principal.actor(), job.id).await?;
    Ok(with_etag(view(&state, job.id).await?))
}

/// Cancels job `id` on behalf of `actor`: a job that holds GPUs is stopped with its grace
/// period, one that does not is cancelled at once; cancelling a cancelled job is harmless.
/// The API and the portal both cancel through this.
pub async fn cancel(state: &AppState, actor: &str, id: Uuid) -> Result<(), ApiError> {
    let mut tx = state.db.begin().await?;
    let locked = db::jobs::lock(&mut tx, id).await?.ok_or(ApiError::NotFound("job"))?;
    match locked.state.as_str() {
        "cancelled" => {}
        "succeeded" | "failed" => {
            return Err(ApiError::conflict("job_finished", None, format!("the job has already {}", locked.state)))
        }
        "preempted" if !locked.holds_gpus => {
            return Err(ApiError::conflict("job_finished", None, "the job was preempted and is out of retries"))
        }
        _ => {
            let stop = locked.holds_gpus.then_some(locked.grace_ms);
            db::jobs::mark_cancelled(&mut tx, id, locked.attempt, stop).await?;
            let message = if locked.holds_gpus {
                format!("cancel requested by {actor}; stopping with a {} s grace period", locked.grace_ms / 1000)
            } else {
                format!("cancelled by {actor} before it ran")
            };
            let kind = if locked.holds_gpus { "cancel_requested" } else { "cancelled" };
            db::jobs::add_event(&mut tx, id, locked.attempt, kind, Some("user"), &message, None).await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

/// One entry of a job's timeline.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobEvent {
    pub id: i64,
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
    Ok(Json(
        rows.into_iter()
            .map(|e| JobEvent {
                id: e.id,
                at: e.at,
                kind: e.kind,
                attempt: e.attempt,
                reason: e.reason,
                message: e.message,
                data: e.data,
            })
            .collect(),
    ))
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
    let now = Utc::now();
    let at = body.at.unwrap_or(now);
    if at > now + chrono::Duration::seconds(5) {
        return Err(ApiError::field(FieldError::new("at", "in_future", "must not be in the future")));
    }
    let mut tx = state.db.begin().await?;
    let locked = db::jobs::lock(&mut tx, job.id).await?.ok_or(ApiError::NotFound("job"))?;
    if !db::jobs::checkpoint(&mut tx, job.id, at).await? {
        return Err(ApiError::conflict("job_not_running", None, format!("the job is {}", locked.state)));
    }
    let message = match body.step {
        Some(step) => format!("checkpoint at step {step}"),
        None => "checkpoint".to_owned(),
    };
    db::jobs::add_event(
        &mut tx,
        job.id,
        locked.attempt,
        "checkpoint",
        None,
        &message,
        Some(serde_json::json!({"step": body.step, "at": at})),
    )
    .await?;
    tx.commit().await?;
    Ok(with_etag(view(&state, job.id).await?))
}

/// A pending job in its team's queue.
#[derive(Debug, Serialize, ToSchema)]
pub struct QueueEntry {
    pub id: Uuid,
    pub name: String,
    pub gpu_class: String,
    pub priority_class: String,
    pub gpus: i32,
    pub submitted_at: DateTime<Utc>,
    /// 1-based rank in the admission order of the last cycle (over all teams).
    pub position: Option<i32>,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub expected_start_at: Option<DateTime<Utc>>,
}

/// Paging of the queue.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct QueueParams {
    /// At most this many (1 to 1000, default 100).
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
            .map(|r| QueueEntry {
                id: r.id,
                name: r.name,
                gpu_class: r.gpu_class,
                priority_class: r.priority_class,
                gpus: r.gpus,
                submitted_at: r.submitted_at,
                position: r.queue_position,
                reason: r.pending_reason,
                message: r.pending_message,
                expected_start_at: r.expected_start_at,
            })
            .collect(),
    ))
}

/// A running job that would be preempted.
#[derive(Debug, Serialize, ToSchema)]
pub struct WouldPreempt {
    pub team: String,
    /// The job's id when it is the caller's team's; other teams' jobs are not named.
    pub job: Option<Uuid>,
    /// `priority`, `reclaim` or `fair_share`.
    pub reason: String,
    pub gpus: i32,
}

/// What would happen to a job submitted now.
#[derive(Debug, Serialize, ToSchema)]
pub struct DryRunResult {
    /// It would be admitted at once.
    pub fits_now: bool,
    /// Where, if so.
    pub placement: Option<Vec<ReplicaSlot>>,
    pub cluster: Option<String>,
    /// Running jobs it would preempt.
    pub would_preempt: Vec<WouldPreempt>,
    /// Why it would wait, if it would.
    pub reason: Option<String>,
    pub message: Option<String>,
    pub position: Option<u32>,
    pub expected_start_at: Option<DateTime<Utc>>,
    /// Most it can cost: GPUs × rate × maximum runtime × the priority's multiplier, in
    /// micro-units of the platform currency.
    pub max_cost_micros: i64,
    pub currency: String,
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
    Ok(Json(dry_run(&state, access.team.id, &spec, version).await?))
}

/// The engine's answer for `spec` submitted by `team_id` now; changes nothing. The API and
/// the portal's preview both ask through this.
pub async fn dry_run(
    state: &AppState,
    team_id: Uuid,
    spec: &JobSpec,
    version: CatalogueVersion,
) -> Result<DryRunResult, ApiError> {
    let catalogue = Catalogue::load(state, team_id, std::slice::from_ref(spec), version).await?;
    let job = catalogue.validate("", spec).map_err(ApiError::Validation)?;
    let engine = control::engine_config(&state.config);
    let world = control::cycle::world(&state.db, &engine, state.config.chargeback, &mut Default::default())
        .await
        .map_err(|e| ApiError::Internal(e.to_string()))?;
    let proposed = world
        .proposed(team_id, &job)
        .ok_or_else(|| ApiError::Internal("the job does not map onto the snapshot".into()))?;
    let (world, answer) = super::off_thread(move || {
        let answer = scheduler::dry_run::dry_run(&world.snapshot, &proposed);
        (world, answer)
    })
    .await?;
    let (cluster, placement) = match answer.placement.as_ref().and_then(|p| world.stored_placement(p)) {
        Some((_, cluster, slots)) => (Some(cluster), Some(slots)),
        None => (None, None),
    };
    let would_preempt = answer
        .victims
        .iter()
        .filter_map(|v| {
            let victim = world.jobs.get(&v.victim)?;
            Some(WouldPreempt {
                job: (victim.team_id == team_id).then_some(victim.id),
                team: world.team_name_of(victim.team_id),
                reason: v.reason.code().to_owned(),
                gpus: victim.replicas * victim.gpus_per_replica,
            })
        })
        .collect();
    let (reason, message) = answer.reason.as_ref().map(|r| world.pending_text(r)).unzip();
    Ok(DryRunResult {
        fits_now: placement.is_some(),
        placement,
        cluster,
        would_preempt,
        reason,
        message,
        position: answer.position,
        expected_start_at: answer.expected_start_ms.and_then(|ms| Utc.timestamp_millis_opt(ms).single()),
        max_cost_micros: answer.max_cost_micros,
        currency: state.config.currency.clone(),
    })
}
