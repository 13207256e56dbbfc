//! Every request in one span with a request id, and one log line and one metrics sample
//! per routed request.
//!
//! The id comes from the caller's `x-request-id` when it sent a usable one (a proxy or a CI
//! job correlating its own logs), or is made up here; it is answered in `x-request-id` and
//! carried by every log line written while the request is served, among them the one line
//! that records a server error's cause (`http::error`).

use std::time::Instant;

use axum::{
    extract::{MatchedPath, Request, State},
    http::{HeaderName, HeaderValue},
    middleware::Next,
    response::Response,
};
use tracing::Instrument as _;

use crate::state::AppState;

/// The header that carries the request id, both ways.
pub static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The longest caller-chosen request id we keep; longer ones are replaced.
const MAX_REQUEST_ID: usize = 128;

/// The id of the request being served, in its extensions.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// Middleware (outermost): gives the request an id and serves it inside a span naming it.
pub async fn request_span(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| usable(v))
        .map_or_else(|| uuid::Uuid::new_v4().simple().to_string(), str::to_owned);
    let span = tracing::info_span!("request", request_id = %id);
    request.extensions_mut().insert(RequestId(id.clone()));
    let mut response = next.run(request).instrument(span).await;
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID.clone(), value);
    }
    response
}

/// A caller's id is kept when it is short and plain (letters, digits and `-_.:/`), so it
/// cannot forge log structure or bloat every line.
fn usable(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_REQUEST_ID
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b))
}

/// Middleware (on routed API requests): logs each request once (method, route, status,
/// duration; never bodies or credentials) and records it in the metrics.
pub async fn observe(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().as_str().to_owned();
    // The route template, not the raw path: bounded label cardinality, no names in metrics.
    let route =
        request.extensions().get::<MatchedPath>().map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(request).await;
    let elapsed = started.elapsed();
    let status = response.status().as_u16();
    state.metrics.observe(&method, &route, status, elapsed);
    tracing::info!(
        http.method = %method,
        http.route = %route,
        http.status = status,
        duration_ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
        "request"
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_caller_ids_are_kept_and_anything_else_is_replaced() {
        assert!(usable("ci-run-1234/step:7"));
        assert!(usable("0f8fad5b-d9cb-469f-a165-70867728950e"));
        assert!(!usable(""));
        assert!(!usable("two words"));
        assert!(!usable("line\nbreak"));
        assert!(!usable(&"x".repeat(MAX_REQUEST_ID + 1)));
    }
}
