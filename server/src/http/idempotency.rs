//! `Idempotency-Key` on creates: the same key and body get the same response; the same key
//! with another body gets 422; while the first request is still running, a repeat waits
//! briefly for it and then gets 409. Keys are scoped per principal and kept at least 24 h.
//!
//! A record is claimed before the handler runs, so of many concurrent duplicates exactly
//! one executes. If the handler fails on our side (5xx) the claim is released so the
//! client's retry runs again; a claim abandoned by a crashed process is taken over once it
//! is older than the request timeout.

use axum::{
    body::{to_bytes, Body},
    extract::{Request, State},
    http::{HeaderName, HeaderValue, Method, StatusCode},
    middleware::Next,
    response::{IntoResponse, Response},
};
use sha2::Digest as _;

use super::error::ApiError;
use crate::{auth::Principal, db, domain::FieldError, state::AppState};

/// The request header.
pub const HEADER: &str = "idempotency-key";
/// Top-level fields of a JSON answer that are never stored for replay: a handler whose
/// answer carries a secret (a minted token) returns this as a response extension, and a
/// replay shows those fields as `null`. Secrets then exist only in the one answer that
/// created them, never in the database or its WAL.
#[derive(Debug, Clone, Copy)]
pub struct WithheldOnReplay(pub &'static [&'static str]);

/// Response headers stored and replayed with the body.
const REPLAYED_HEADERS: [&str; 3] = ["content-type", "etag", "location"];

/// Middleware enforcing idempotency on POST requests that carry the header.
pub async fn idempotency(State(state): State<AppState>, request: Request, next: Next) -> Result<Response, ApiError> {
    if request.method() != Method::POST {
        return Ok(next.run(request).await);
    }
    let Some(key) = request.headers().get(HEADER) else { return Ok(next.run(request).await) };
    let key = key
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= 255)
        .ok_or_else(|| {
            FieldError::new("Idempotency-Key", "invalid_value", "must be 1 to 255 visible ASCII characters")
        })?
        .to_owned();
    // Public routes (signing in) have no principal to scope a key to; they are not creates.
    let Some(principal) = request.extensions().get::<Principal>().map(Principal::key) else {
        return Ok(next.run(request).await);
    };

    let (parts, body) = request.into_parts();
    let bytes = to_bytes(body, state.config.max_body_bytes).await.map_err(|_| ApiError::PayloadTooLarge)?;
    let path = parts.uri.path().to_owned();
    let method = parts.method.as_str().to_owned();
    let mut hasher = sha2::Sha256::new();
    hasher.update(method.as_bytes());
    hasher.update([0]);
    hasher.update(parts.uri.to_string().as_bytes());
    hasher.update([0]);
    hasher.update(&bytes);
    let hash = hasher.finalize().to_vec();
    let stale_after = state.config.request_timeout.as_secs_f64() * 2.0;

    let deadline = tokio::time::Instant::now() + state.config.idempotency_wait;
    loop {
        if db::idempotency::claim(&state.db, &principal, &key, &method, &path, &hash, stale_after).await? {
            let response = next.run(Request::from_parts(parts, Body::from(bytes))).await;
            return store(&state, &principal, &key, response).await;
        }
        match db::idempotency::get(&state.db, &principal, &key).await? {
            // Released between our claim and our read: claim again.
            None => continue,
            Some(row) if row.request_hash != hash => return Err(ApiError::IdempotencyKeyReused),
            Some(row) => {
                if let (Some(status), Some(body)) = (row.response_status, row.response_body) {
                    return Ok(replay(status, row.response_headers, body));
                }
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::IdempotencyInFlight);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

async fn store(state: &AppState, principal: &str, key: &str, response: Response) -> Result<Response, ApiError> {
    let (parts, body) = response.into_parts();
    let bytes = match to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            db::idempotency::release(&state.db, principal, key).await?;
            return Err(ApiError::Internal(format!("reading the response body: {e}").into()));
        }
    };
    let stored = match parts.extensions.get::<WithheldOnReplay>() {
        Some(withheld) => withhold(&bytes, withheld.0),
        None => Some(bytes.to_vec()),
    };
    if parts.status.is_server_error() {
        db::idempotency::release(&state.db, principal, key).await?;
    } else if let Some(stored) = stored {
        let headers: serde_json::Map<String, serde_json::Value> = REPLAYED_HEADERS
            .iter()
            .filter_map(|name| {
                let value = parts.headers.get(*name)?.to_str().ok()?;
                Some(((*name).to_owned(), serde_json::Value::String(value.to_owned())))
            })
            .collect();
        db::idempotency::complete(&state.db, principal, key, i32::from(parts.status.as_u16()), headers.into(), &stored)
            .await?;
    } else {
        // An answer with secrets that cannot be withheld field by field is not kept at all.
        db::idempotency::release(&state.db, principal, key).await?;
    }
    Ok(Response::from_parts(parts, Body::from(bytes)))
}

/// `body` with `fields` set to `null`; `None` when it is not a JSON object.
fn withhold(body: &[u8], fields: &[&str]) -> Option<Vec<u8>> {
    let mut value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let object = value.as_object_mut()?;
    for field in fields {
        if let Some(v) = object.get_mut(*field) {
            *v = serde_json::Value::Null;
        }
    }
    serde_json::to_vec(&value).ok()
}

fn replay(status: i32, headers: Option<serde_json::Value>, body: Vec<u8>) -> Response {
    let status = u16::try_from(status).ok().and_then(|s| StatusCode::from_u16(s).ok()).unwrap_or(StatusCode::OK);
    let mut response = (status, body).into_response();
    if let Some(serde_json::Value::Object(map)) = headers {
        for (name, value) in map {
            if let (Ok(name), Some(Ok(value))) =
                (HeaderName::try_from(name.as_str()), value.as_str().map(HeaderValue::from_str))
            {
                response.headers_mut().insert(name, value);
            }
        }
    }
    response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
    response
}
