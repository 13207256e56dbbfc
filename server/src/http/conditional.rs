//! Conditional reads (RFC 9110 §13.1.2): a `GET` whose `If-None-Match` names the entity tag
//! the response would carry is answered `304 Not Modified` with no body, so a client polling
//! a resource (a CI pipeline waiting on a job) downloads it only when it changed.
//!
//! The handler still runs: the tag is the one it computes from what it read, which keeps the
//! answer exact; what is saved is the body on the wire.

use axum::{
    extract::Request,
    http::{header, HeaderMap, Method, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
};

/// Turns a `200` whose `ETag` matches the request's `If-None-Match` into a `304`.
pub async fn not_modified(request: Request, next: Next) -> Response {
    let condition = (request.method() == Method::GET || request.method() == Method::HEAD)
        .then(|| request.headers().get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()).map(str::to_owned))
        .flatten();
    let response = next.run(request).await;
    let Some(condition) = condition else { return response };
    if response.status() != StatusCode::OK {
        return response;
    }
    let Some(tag) = response.headers().get(header::ETAG).and_then(|v| v.to_str().ok()) else { return response };
    if !matches_any(&condition, tag) {
        return response;
    }
    // A 304 carries the validators and caching headers the 200 would have (§15.4.5).
    let mut headers = HeaderMap::new();
    for name in [header::ETAG, header::CACHE_CONTROL, header::VARY, header::EXPIRES] {
        if let Some(value) = response.headers().get(&name) {
            headers.insert(name, value.clone());
        }
    }
    (StatusCode::NOT_MODIFIED, headers).into_response()
}

/// The weak comparison `If-None-Match` uses: `*`, or any listed tag equal to `tag` once
/// both are stripped of `W/`.
fn matches_any(condition: &str, tag: &str) -> bool {
    let opaque = |t: &str| t.trim().trim_start_matches("W/").to_owned();
    let tag = opaque(tag);
    condition.split(',').any(|candidate| candidate.trim() == "*" || opaque(candidate) == tag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn if_none_match_compares_weakly_and_accepts_lists_and_the_wildcard() {
        assert!(matches_any("\"3\"", "\"3\""));
        assert!(matches_any("W/\"3\"", "\"3\""));
        assert!(matches_any("\"1\", \"3\"", "W/\"3\""));
        assert!(matches_any("*", "\"9\""));
        assert!(!matches_any("\"31\"", "\"3\""));
        assert!(!matches_any("\"3.ab\"", "\"3\""));
    }
}
