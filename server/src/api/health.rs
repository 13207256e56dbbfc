//! Liveness, readiness and metrics.

use axum::{
    extract::State,
    http::{header, StatusCode},
    response::IntoResponse,
};

use crate::{db, state::AppState};

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "health", operation_id = "get_healthz",
    responses((status = 200, description = "Alive", body = String)), security(()))]
pub async fn get_healthz() -> &'static str {
    "ok"
}

/// Readiness: the database answers.
#[utoipa::path(get, path = "/readyz", tag = "health", operation_id = "get_readyz",
    responses((status = 200, description = "Ready", body = String), (status = 503, description = "Database unreachable", body = String)),
    security(()))]
pub async fn get_readyz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if db::ping(&state.db).await {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "database unreachable")
    }
}

/// Prometheus metrics in the text exposition format.
#[utoipa::path(get, path = "/metrics", tag = "health", operation_id = "get_metrics",
    responses((status = 200, description = "Prometheus text format", body = String)), security(()))]
pub async fn get_metrics(State(state): State<AppState>) -> impl IntoResponse {
    let pool = (state.db.size(), state.db.num_idle());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render(pool))
}
