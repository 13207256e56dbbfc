//! Liveness, readiness and metrics.

use axum::{
    extract::State,
    http::{header, HeaderMap, StatusCode},
    response::IntoResponse,
};

use crate::{db, state::AppState, telemetry::Tenants};

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

/// Prometheus metrics in the text exposition format. Series that name a team (pending jobs,
/// budgets) are included only for a scraper sending `Authorization: Bearer` with the
/// configured `FAIRWAY_METRICS_TOKEN`; everyone else gets the rest.
#[utoipa::path(get, path = "/metrics", tag = "health", operation_id = "get_metrics",
    responses((status = 200, description = "Prometheus text format", body = String)), security(()))]
pub async fn get_metrics(State(state): State<AppState>, headers: HeaderMap) -> impl IntoResponse {
    let pool = (state.db.size(), state.db.num_idle());
    let tenants = if holds_metrics_token(&state, &headers) { Tenants::Named } else { Tenants::Hidden };
    ([(header::CONTENT_TYPE, crate::telemetry::CONTENT_TYPE)], state.metrics.render(pool, tenants))
}

/// Whether the request carries the configured metrics token. Digests are compared, so the
/// time taken says nothing about how much of the token a guess got right.
fn holds_metrics_token(state: &AppState, headers: &HeaderMap) -> bool {
    use sha2::{Digest as _, Sha256};
    let Some(token) = &state.config.metrics_token else { return false };
    let Some(sent) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else { return false };
    let Some(sent) = sent.strip_prefix("Bearer ") else { return false };
    Sha256::digest(sent.trim().as_bytes()) == Sha256::digest(token.expose().as_bytes())
}
