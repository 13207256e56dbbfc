//! Inference services: create one of N independent replicas with no maximum runtime, read
//! its state, replicas and endpoints, scale it or roll it to a new image, delete it. Each
//! replica is a job: read, followed and its logs read through `/api/v1/jobs/{job}`.

use axum::{
    extract::{Path, State},
    http::{header, HeaderMap, StatusCode},
    Extension, Json,
};
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::{
    error::ApiError,
    extract::{etag, ApiJson, ListQuery, Page, PageParams, PageRequest},
    jobs::JobView,
};
use crate::{
    auth::{policy::TeamAccess, CatalogueVersion, Principal},
    domain::{
        service::{ReplicaCounts, ServiceState},
        ServiceId,
    },
    ops::{
        services::{self, ServiceSpec, ServiceUpdate, Status},
        Precondition,
    },
    state::AppState,
};

/// An inference service.
#[derive(Debug, Serialize, ToSchema)]
pub struct ServiceView {
    pub id: ServiceId,
    pub team: String,
    pub name: String,
    /// `starting` (fewer than `min_replicas` run yet), `ready` (every replica asked for runs
    /// the current revision), `scaling` (at least the minimum run; replicas are being added
    /// or removed), `rolling` (replicas of an older revision are being replaced),
    /// `degraded` (a replica ran out of restarts; its slot stays empty until the service is
    /// changed) or `deleted`.
    pub state: ServiceState,
    pub min_replicas: i32,
    pub max_replicas: i32,
    /// Replicas asked for now.
    pub replicas: i32,
    pub counts: ReplicaCounts,
    /// Counts what replicas run: each image, command or environment change adds one.
    pub revision: i32,
    pub port: i32,
    /// Where it can be reached, per cluster its replicas were placed on.
    pub endpoints: Vec<EndpointView>,
    pub gpu_class: String,
    /// GPUs per replica.
    pub gpus: i32,
    pub image: String,
    pub command: Vec<String>,
    /// The minimum replicas' class (not preemptible).
    pub priority_class: String,
    /// The class of the replicas above the minimum (preemptible).
    pub burst_priority_class: String,
    /// Restarts each replica gets after the application fails.
    pub restart_budget: i32,
    /// The oldest driver, and CUDA version, each replica's node must run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_driver_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_cuda_version: Option<String>,
    /// Its replica jobs that run, will run, still stop, or ended since the last change, in
    /// slot order. Only when one service is read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_jobs: Option<Vec<JobView>>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    /// The last change of its size or what it runs.
    pub changed_at: DateTime<Utc>,
    pub deleted_at: Option<DateTime<Utc>>,
    pub version: i64,
}

/// Where a service can be reached on one cluster.
#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointView {
    pub cluster: String,
    /// `host:port`: on Kubernetes the Service `fw-svc-<name>` in the team's namespace.
    pub address: String,
}

impl ServiceView {
    fn of(status: Status, with_jobs: bool) -> Self {
        let Status { service: s, state, counts, endpoints, replicas } = status;
        let t = s.template.0;
        Self {
            id: s.id,
            team: s.team,
            name: s.name,
            state,
            min_replicas: s.min_replicas,
            max_replicas: s.max_replicas,
            replicas: s.replicas,
            counts,
            revision: s.revision,
            port: s.port,
            endpoints: endpoints.into_iter().map(|e| EndpointView { cluster: e.cluster, address: e.address }).collect(),
            gpu_class: s.gpu_class,
            gpus: t.gpus,
            image: t.image,
            command: t.command,
            priority_class: t.priority_class,
            burst_priority_class: t.burst_priority_class,
            restart_budget: t.restart_budget,
            min_driver_version: t.min_driver_version,
            min_cuda_version: t.min_cuda_version,
            replica_jobs: with_jobs.then(|| replicas.into_iter().map(JobView::from).collect()),
            created_by: s.created_by,
            created_at: s.created_at,
            changed_at: s.changed_at,
            deleted_at: s.deleted_at,
            version: s.version,
        }
    }
}

async fn one(
    state: &AppState,
    team: crate::domain::TeamId,
    name: &str,
) -> Result<(HeaderMap, Json<ServiceView>), ApiError> {
    let status = services::status(state, team, name).await?;
    Ok(with_etag(ServiceView::of(status, true)))
}

fn with_etag(view: ServiceView) -> (HeaderMap, Json<ServiceView>) {
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag(view.version));
    (headers, Json(view))
}

/// Creates a service: `replicas` independent replicas (default `min_replicas`) of one spec,
/// none with a maximum runtime, each restarted after a failure up to `restart_budget`
/// times, reachable at one endpoint. The minimum replicas must fit the team's reserved
/// quota and are never preempted; replicas above it may borrow and are preempted first.
/// Cloud batch pools take no services. Send an `Idempotency-Key` so a retried request
/// cannot create twice.
#[utoipa::path(
    post, path = "/api/v1/teams/{team}/services", tag = "services", operation_id = "create_service",
    params(("team" = String, Path, description = "Team name"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    request_body = ServiceSpec,
    responses((status = 201, body = ServiceView), (status = 409, body = super::error::Problem),
              (status = 422, body = super::error::Problem))
)]
pub async fn create_service(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Extension(version): Extension<CatalogueVersion>,
    ApiJson(spec): ApiJson<ServiceSpec>,
) -> Result<(StatusCode, HeaderMap, Json<ServiceView>), ApiError> {
    let row = services::create(&state, &principal, &access.team, spec, version).await?;
    let (headers, json) = one(&state, access.team.id, &row.name).await?;
    Ok((StatusCode::CREATED, headers, json))
}

/// Lists a team's services, oldest first, each with its state and replica counts.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/services", tag = "services", operation_id = "list_services",
    params(("team" = String, Path, description = "Team name"), PageParams),
    responses((status = 200, body = Page<ServiceView>), (status = 422, body = super::error::Problem))
)]
pub async fn list_services(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    ListQuery(params): ListQuery<PageParams>,
) -> Result<Json<Page<ServiceView>>, ApiError> {
    let page = PageRequest::parse(params)?;
    let statuses = services::list(&state, access.team.id, page.after_number()?, page.fetch()).await?;
    Ok(Json(page.page(statuses, |s| s.service.seq.to_string(), |s| ServiceView::of(s, false))))
}

/// Reads a service: its state, counts, endpoints and replica jobs. Its `ETag` is what a
/// change's `If-Match` names.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/services/{service}", tag = "services", operation_id = "get_service",
    params(("team" = String, Path, description = "Team name"), ("service" = String, Path, description = "Service name")),
    responses((status = 200, body = ServiceView), (status = 404, body = super::error::Problem))
)]
pub async fn get_service(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
) -> Result<(HeaderMap, Json<ServiceView>), ApiError> {
    one(&state, access.team.id, &path.1).await
}

/// Scales a service (`replicas`, `min_replicas`, `max_replicas`) or rolls it to a new
/// image, command or environment: replicas are replaced one at a time, each old one
/// stopped once its successor runs (or at once when there is no room for both), so the
/// update never exceeds the quotas. Honours `If-Match`.
#[utoipa::path(
    patch, path = "/api/v1/teams/{team}/services/{service}", tag = "services", operation_id = "update_service",
    params(("team" = String, Path, description = "Team name"), ("service" = String, Path, description = "Service name"),
           ("If-Match" = Option<String>, Header, description = "ETag from a previous read")),
    request_body = ServiceUpdate,
    responses((status = 200, body = ServiceView), (status = 404, body = super::error::Problem),
              (status = 412, body = super::error::Problem), (status = 422, body = super::error::Problem))
)]
pub async fn update_service(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Extension(version): Extension<CatalogueVersion>,
    Path(path): Path<(String, String)>,
    if_match: Precondition,
    ApiJson(update): ApiJson<ServiceUpdate>,
) -> Result<(HeaderMap, Json<ServiceView>), ApiError> {
    let row = services::update(&state, &principal, &access.team, &path.1, update, &if_match, version).await?;
    one(&state, access.team.id, &row.name).await
}

/// Deletes a service: its replicas stop with their grace period, its name is free again,
/// its bills remain.
#[utoipa::path(
    delete, path = "/api/v1/teams/{team}/services/{service}", tag = "services", operation_id = "delete_service",
    params(("team" = String, Path, description = "Team name"), ("service" = String, Path, description = "Service name")),
    responses((status = 200, description = "The service as deleted", body = ServiceView),
              (status = 404, body = super::error::Problem))
)]
pub async fn delete_service(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
) -> Result<Json<ServiceView>, ApiError> {
    let status = services::delete(&state, &principal, &access.team, &path.1).await?;
    Ok(Json(ServiceView::of(status, false)))
}
