//! Priority classes: priority, preemptibility, fair-share usage factor, price multiplier.

use axum::{
    extract::{Path, State},
    http::{header, HeaderMap, StatusCode},
    Extension, Json,
};

use super::{
    error::ApiError,
    extract::{etag, ApiJson},
};
use crate::{
    auth::Principal,
    db::{self, priority_classes::PriorityClassRow},
    ops::{
        priority_classes::{self, NewPriorityClass, PriorityClassSpec, PriorityClassView},
        Precondition,
    },
    state::AppState,
};

fn with_etag(row: PriorityClassRow) -> (HeaderMap, Json<PriorityClassView>) {
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag(row.version));
    (headers, Json(PriorityClassView::from(row)))
}

/// Lists priority classes, highest priority first.
#[utoipa::path(
    get, path = "/api/v1/priority-classes", tag = "priority-classes", operation_id = "list_priority_classes",
    responses((status = 200, body = Vec<PriorityClassView>))
)]
pub async fn list_priority_classes(State(state): State<AppState>) -> Result<Json<Vec<PriorityClassView>>, ApiError> {
    let rows = db::priority_classes::list(&state.db).await?;
    Ok(Json(rows.into_iter().map(PriorityClassView::from).collect()))
}

/// Reads a priority class.
#[utoipa::path(
    get, path = "/api/v1/priority-classes/{priority_class}", tag = "priority-classes", operation_id = "get_priority_class",
    params(("priority_class" = String, Path, description = "Priority class name")),
    responses((status = 200, body = PriorityClassView), (status = 404, body = super::error::Problem))
)]
pub async fn get_priority_class(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<(HeaderMap, Json<PriorityClassView>), ApiError> {
    let row = db::priority_classes::by_name(&state.db, &name).await?.ok_or(ApiError::NotFound("priority class"))?;
    Ok(with_etag(row))
}

/// Adds a priority class.
#[utoipa::path(
    post, path = "/api/v1/priority-classes", tag = "priority-classes", operation_id = "create_priority_class",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    request_body = NewPriorityClass,
    responses((status = 201, body = PriorityClassView), (status = 409, body = super::error::Problem), (status = 422, body = super::error::Problem))
)]
pub async fn create_priority_class(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiJson(body): ApiJson<NewPriorityClass>,
) -> Result<(StatusCode, HeaderMap, Json<PriorityClassView>), ApiError> {
    let row = priority_classes::create(&state, &principal, &body).await?;
    let (headers, json) = with_etag(row);
    Ok((StatusCode::CREATED, headers, json))
}

/// Replaces a priority class's settings. Honours `If-Match`.
#[utoipa::path(
    put, path = "/api/v1/priority-classes/{priority_class}", tag = "priority-classes", operation_id = "put_priority_class",
    params(("priority_class" = String, Path, description = "Priority class name"),
           ("If-Match" = Option<String>, Header, description = "ETag from a previous read")),
    request_body = PriorityClassSpec,
    responses((status = 200, body = PriorityClassView), (status = 404, body = super::error::Problem), (status = 412, body = super::error::Problem))
)]
pub async fn put_priority_class(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    if_match: Precondition,
    ApiJson(spec): ApiJson<PriorityClassSpec>,
) -> Result<(HeaderMap, Json<PriorityClassView>), ApiError> {
    Ok(with_etag(priority_classes::put(&state, &principal, &name, &spec, &if_match).await?))
}
