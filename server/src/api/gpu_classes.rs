//! GPU classes: the catalogue of schedulable GPU capacity and its rate card.

use axum::{
    extract::{Path, State},
    http::{header, HeaderMap, StatusCode},
    Extension, Json,
};

use super::{
    error::ApiError,
    extract::{etag, ApiJson, ListQuery, Page, PageParams, PageRequest},
};
use crate::{
    auth::Principal,
    db::{self, gpu_classes::GpuClassRow},
    ops::{
        gpu_classes::{self, GpuClassPatch, GpuClassView, NewGpuClass, Rate},
        Precondition,
    },
    state::AppState,
};

fn with_etag(row: GpuClassRow, currency: &str) -> (HeaderMap, Json<GpuClassView>) {
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag(row.version));
    (headers, Json(gpu_classes::view(row, currency)))
}

/// Adds a GPU class with its first rate.
#[utoipa::path(
    post, path = "/api/v1/gpu-classes", tag = "gpu-classes", operation_id = "create_gpu_class",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    request_body = NewGpuClass,
    responses((status = 201, body = GpuClassView), (status = 409, body = super::error::Problem), (status = 422, body = super::error::Problem))
)]
pub async fn create_gpu_class(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiJson(body): ApiJson<NewGpuClass>,
) -> Result<(StatusCode, HeaderMap, Json<GpuClassView>), ApiError> {
    let row = gpu_classes::create(&state, &principal, &body).await?;
    let (headers, json) = with_etag(row, &state.config.currency);
    Ok((StatusCode::CREATED, headers, json))
}

/// Lists GPU classes.
#[utoipa::path(
    get, path = "/api/v1/gpu-classes", tag = "gpu-classes", operation_id = "list_gpu_classes",
    params(PageParams),
    responses((status = 200, body = Page<GpuClassView>))
)]
pub async fn list_gpu_classes(
    State(state): State<AppState>,
    ListQuery(params): ListQuery<PageParams>,
) -> Result<Json<Page<GpuClassView>>, ApiError> {
    let page = PageRequest::parse(params)?;
    let rows = db::gpu_classes::list(&state.db, page.after.as_deref(), page.fetch()).await?;
    let currency = state.config.currency.clone();
    Ok(Json(page.page(rows, |c| c.name.clone(), |r| gpu_classes::view(r, &currency))))
}

/// Reads a GPU class.
#[utoipa::path(
    get, path = "/api/v1/gpu-classes/{gpu_class}", tag = "gpu-classes", operation_id = "get_gpu_class",
    params(("gpu_class" = String, Path, description = "GPU class name")),
    responses((status = 200, body = GpuClassView), (status = 404, body = super::error::Problem))
)]
pub async fn get_gpu_class(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<(HeaderMap, Json<GpuClassView>), ApiError> {
    Ok(with_etag(gpu_classes::find(&state, &name).await?, &state.config.currency))
}

/// Changes a GPU class's memory or description. Honours `If-Match`.
#[utoipa::path(
    patch, path = "/api/v1/gpu-classes/{gpu_class}", tag = "gpu-classes", operation_id = "update_gpu_class",
    params(("gpu_class" = String, Path, description = "GPU class name"),
           ("If-Match" = Option<String>, Header, description = "ETag from a previous read")),
    request_body = GpuClassPatch,
    responses((status = 200, body = GpuClassView), (status = 412, body = super::error::Problem))
)]
pub async fn update_gpu_class(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    if_match: Precondition,
    ApiJson(body): ApiJson<GpuClassPatch>,
) -> Result<(HeaderMap, Json<GpuClassView>), ApiError> {
    let after = gpu_classes::update(&state, &principal, &name, &if_match, &body).await?;
    Ok(with_etag(after, &state.config.currency))
}

/// The rate history of a GPU class, oldest first.
#[utoipa::path(
    get, path = "/api/v1/gpu-classes/{gpu_class}/rates", tag = "gpu-classes", operation_id = "list_gpu_class_rates",
    params(("gpu_class" = String, Path, description = "GPU class name")),
    responses((status = 200, body = Vec<Rate>))
)]
pub async fn list_gpu_class_rates(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Vec<Rate>>, ApiError> {
    let class = gpu_classes::find(&state, &name).await?;
    let rows = db::gpu_classes::rates(&state.db, class.id).await?;
    Ok(Json(rows.into_iter().map(Rate::from).collect()))
}

/// Adds a rate from a future point in time (or from now). Rates already in effect are
/// never changed, so past periods keep their prices.
#[utoipa::path(
    post, path = "/api/v1/gpu-classes/{gpu_class}/rates", tag = "gpu-classes", operation_id = "create_gpu_class_rate",
    params(("gpu_class" = String, Path, description = "GPU class name"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    request_body = Rate,
    responses((status = 201, body = Rate), (status = 409, body = super::error::Problem), (status = 422, body = super::error::Problem))
)]
pub async fn create_gpu_class_rate(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<Rate>,
) -> Result<(StatusCode, Json<Rate>), ApiError> {
    Ok((StatusCode::CREATED, Json(gpu_classes::add_rate(&state, &principal, &name, &body).await?)))
}
