//! Job arrays: submission of up to 10,000 tasks at once, an array's state and task counts,
//! its tasks in index order, and cancelling it whole. Each task is a job: read, followed and
//! cancelled through `/api/v1/jobs/{job}`.

use axum::{
    extract::{Path, State},
    http::StatusCode,
    Extension, Json,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{
    error::ApiError,
    extract::{ApiJson, ListQuery, Page, PageParams, PageRequest},
    jobs::JobView,
};
use crate::{
    auth::{policy::TeamAccess, CatalogueVersion, Principal},
    db,
    domain::{
        array::{ArrayState, TaskCounts},
        ArrayId, FieldError, JobState,
    },
    ops::arrays::{self, ArraySpec, Cancelled},
    state::AppState,
};

/// A job array.
#[derive(Debug, Serialize, ToSchema)]
pub struct ArrayView {
    pub id: ArrayId,
    pub team: String,
    /// The name its tasks share.
    pub name: String,
    /// How many tasks it has.
    pub count: i32,
    /// At most this many tasks are released to the queue or run at once; null: all.
    pub parallelism: Option<i32>,
    /// `pending` (no task admitted yet), `running` (some under way, or some ended and
    /// others waiting), `succeeded` (all did), `failed` (all ended, one or more failed) or
    /// `cancelled` (all ended, none failed, one or more cancelled).
    pub state: ArrayState,
    /// Tasks per state (`held`: pending tasks the parallelism holds back, also counted in
    /// `pending`; `stopping`: tasks cancelled or preempted still giving their GPUs back).
    pub counts: TaskCounts,
    pub gpu_class: String,
    pub priority_class: String,
    /// Replicas of each task's gang.
    pub replicas: i32,
    pub gpus_per_replica: i32,
    pub image: String,
    pub submitted_by: String,
    pub submitted_at: DateTime<Utc>,
    /// Only in the answer to a submission, and only when there are some: what may keep
    /// its tasks from running as asked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<FieldError>,
}

impl ArrayView {
    fn of(a: db::arrays::ArrayRow, counts: TaskCounts) -> Self {
        Self {
            id: a.id,
            team: a.team,
            name: a.name,
            count: a.task_count,
            parallelism: a.parallelism,
            state: counts.state(),
            counts,
            gpu_class: a.gpu_class,
            priority_class: a.priority_class,
            replicas: a.replicas,
            gpus_per_replica: a.gpus_per_replica,
            image: a.image,
            submitted_by: a.submitted_by,
            submitted_at: a.submitted_at,
            warnings: Vec::new(),
        }
    }
}

/// The array named in a path: one that is not an id reads as one that does not exist.
fn array_id(text: &str) -> Result<ArrayId, ApiError> {
    text.parse().map_err(|_| ApiError::NotFound("array"))
}

async fn view(state: &AppState, access: &TeamAccess, id: ArrayId) -> Result<ArrayView, ApiError> {
    let array = db::arrays::get(&state.db, access.team.id, id).await?.ok_or(ApiError::NotFound("array"))?;
    let counts = arrays::counts_of(state, id).await?;
    Ok(ArrayView::of(array, counts))
}

/// Submits an array of `count` tasks of one job spec, all or none: each task is a job that
/// finds its index in `FAIRWAY_ARRAY_TASK_ID` (and `JOB_COMPLETION_INDEX`), is retried on
/// its own up to the spec's `max_retries`, and is read and cancelled as any job. The spec is
/// checked as a job's is, its fields named `task.<field>`. Send an `Idempotency-Key` so a
/// retried request cannot submit twice.
#[utoipa::path(
    post, path = "/api/v1/teams/{team}/arrays", tag = "arrays", operation_id = "create_array",
    params(("team" = String, Path, description = "Team name"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    request_body = ArraySpec,
    responses((status = 201, body = ArrayView), (status = 422, body = super::error::Problem))
)]
pub async fn create_array(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Extension(version): Extension<CatalogueVersion>,
    ApiJson(spec): ApiJson<ArraySpec>,
) -> Result<(StatusCode, Json<ArrayView>), ApiError> {
    let submitted = arrays::submit(&state, &access.team, &principal.actor(), spec, version).await?;
    let view = ArrayView { warnings: submitted.warnings, ..ArrayView::of(submitted.array, submitted.counts) };
    Ok((StatusCode::CREATED, Json(view)))
}

/// Lists a team's arrays, newest first, each with its state and task counts.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/arrays", tag = "arrays", operation_id = "list_arrays",
    params(("team" = String, Path, description = "Team name"), PageParams),
    responses((status = 200, body = Page<ArrayView>), (status = 422, body = super::error::Problem))
)]
pub async fn list_arrays(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    ListQuery(params): ListQuery<PageParams>,
) -> Result<Json<Page<ArrayView>>, ApiError> {
    let page = PageRequest::parse(params)?;
    let before_seq = page.after_number()?;
    let rows = db::arrays::list(&state.db, access.team.id, before_seq, page.fetch()).await?;
    let ids: Vec<ArrayId> = rows.iter().map(|a| a.id).collect();
    let counts: std::collections::HashMap<ArrayId, TaskCounts> =
        db::arrays::counts(&state.db, &ids).await?.into_iter().collect();
    Ok(Json(page.page(
        rows,
        |a| a.seq.to_string(),
        |a| {
            let c = counts.get(&a.id).copied().unwrap_or_default();
            ArrayView::of(a, c)
        },
    )))
}

/// Reads an array: its state and how many tasks are in each state.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/arrays/{array}", tag = "arrays", operation_id = "get_array",
    params(("team" = String, Path, description = "Team name"), ("array" = Uuid, Path, description = "Array id")),
    responses((status = 200, body = ArrayView), (status = 404, body = super::error::Problem))
)]
pub async fn get_array(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
) -> Result<Json<ArrayView>, ApiError> {
    Ok(Json(view(&state, &access, array_id(&path.1)?).await?))
}

/// Filters of an array's task list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TaskListParams {
    /// Only tasks in this state.
    pub state: Option<String>,
    /// Items per page, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    /// Cursor from a previous page's `next_cursor`.
    pub cursor: Option<String>,
}

/// Lists an array's tasks in index order: each a job, with its `array` index.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/arrays/{array}/tasks", tag = "arrays", operation_id = "list_array_tasks",
    params(("team" = String, Path, description = "Team name"), ("array" = Uuid, Path, description = "Array id"),
           TaskListParams),
    responses((status = 200, body = Page<JobView>), (status = 404, body = super::error::Problem),
              (status = 422, body = super::error::Problem))
)]
pub async fn list_array_tasks(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
    ListQuery(params): ListQuery<TaskListParams>,
) -> Result<Json<Page<JobView>>, ApiError> {
    let id = array_id(&path.1)?;
    db::arrays::get(&state.db, access.team.id, id).await?.ok_or(ApiError::NotFound("array"))?;
    let page = PageRequest::parse(PageParams { limit: params.limit, cursor: params.cursor })?;
    let state_filter = match params.state.as_deref() {
        None => None,
        Some(s) => Some(JobState::parse(s).ok_or_else(|| {
            let all: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
            ApiError::field(FieldError::new("state", "invalid_value", format!("must be one of {}", all.join(", "))))
        })?),
    };
    // The cursor is the last index shown; the page starts after it.
    let from = match page.after_number()? {
        Some(last) => i32::try_from(last.saturating_add(1)).unwrap_or(i32::MAX),
        None => 0,
    };
    let rows = db::jobs::array_tasks(&state.db, id, state_filter, from, page.fetch()).await?;
    let mut listed = page.page(rows, |r| r.array_index.unwrap_or_default().to_string(), JobView::from);
    super::jobs::with_dependencies_all(&state, &mut listed.items).await?;
    Ok(Json(listed))
}

/// Cancels every task of the array that has not ended: tasks holding GPUs stop with their
/// grace period, the others are cancelled at once. Tasks that ended keep their state, so
/// cancelling an array that has ended changes nothing.
#[utoipa::path(
    post, path = "/api/v1/teams/{team}/arrays/{array}/cancel", tag = "arrays", operation_id = "cancel_array",
    params(("team" = String, Path, description = "Team name"), ("array" = Uuid, Path, description = "Array id")),
    responses((status = 200, description = "The array after the cancel, with what it did", body = CancelledArray),
              (status = 404, body = super::error::Problem))
)]
pub async fn cancel_array(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
) -> Result<Json<CancelledArray>, ApiError> {
    let id = array_id(&path.1)?;
    let done = arrays::cancel(&state, &principal.actor(), access.team.id, id).await?;
    Ok(Json(CancelledArray { array: view(&state, &access, id).await?, done }))
}

/// An array after a cancel, and what the cancel did.
#[derive(Debug, Serialize, ToSchema)]
pub struct CancelledArray {
    pub array: ArrayView,
    pub done: Cancelled,
}
