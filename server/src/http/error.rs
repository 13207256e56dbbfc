//! The one error type of the REST API, rendered as RFC 9457 `application/problem+json`
//! with a stable `code` and, for validation failures, the fields that are wrong.
//!
//! 5xx bodies say nothing internal: the cause, with its whole chain, is logged once, here,
//! inside the request's span (so the line carries the request id), and the client gets a
//! generic sentence. Use cases answer [`ops::Error`]; it converts variant by variant.

use axum::{
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
};
use serde::Serialize;
use utoipa::ToSchema;

use crate::{
    domain::FieldError,
    ops::{self, error::BoxError},
};

/// An RFC 9457 problem document.
#[derive(Debug, Serialize, ToSchema)]
pub struct Problem {
    /// URI reference naming the problem type.
    #[serde(rename = "type")]
    pub type_: String,
    /// Short summary of the problem type.
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// Explanation of this occurrence.
    pub detail: String,
    /// Stable machine-readable code, e.g. `validation_failed`.
    pub code: String,
    /// The first failing field, when the problem is about one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Every failing field.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
}

/// Everything a handler or middleware can answer instead of success.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("authentication required")]
    Unauthenticated,
    #[error("invalid username or password")]
    InvalidCredentials,
    #[error("forbidden")]
    Forbidden,
    #[error("{0} not found")]
    NotFound(&'static str),
    /// The path exists, but not with this method; sent with `Allow`.
    #[error("this method is not allowed on this path")]
    MethodNotAllowed,
    /// The request's header section is larger than the service accepts.
    #[error("the request headers are too large")]
    HeadersTooLarge { limit: usize },
    #[error("validation failed")]
    Validation(Vec<FieldError>),
    #[error("malformed request body")]
    MalformedBody { field: Option<String>, detail: String },
    /// The path or query itself cannot be used (see `http::hostile`).
    #[error("malformed request")]
    MalformedRequest { field: String, detail: String },
    #[error("{detail}")]
    Conflict { code: &'static str, detail: String, field: Option<String> },
    #[error("the resource changed since it was read")]
    PreconditionFailed,
    /// A provider's or CI issuer's token was refused, with why.
    #[error("{reason}")]
    IdentityRefused { reason: String },
    /// An identity provider or CI issuer could not be used.
    #[error("{reason}")]
    ProviderUnavailable { reason: String },
    /// Too many failed sign-ins from the caller's address; sent with `Retry-After`.
    #[error("too many failed sign-ins")]
    TooManyAttempts { retry_after: std::time::Duration },
    #[error("request body too large")]
    PayloadTooLarge,
    #[error("unsupported media type")]
    UnsupportedMediaType,
    #[error("idempotency key reused with another request")]
    IdempotencyKeyReused,
    #[error("a request with this idempotency key is in flight")]
    IdempotencyInFlight,
    #[error("request timed out")]
    Timeout,
    /// The database cannot be reached; the cause is logged.
    #[error("service unavailable")]
    Unavailable(#[source] BoxError),
    /// Our fault; the cause is logged, the client learns nothing of it.
    #[error("internal error")]
    Internal(#[source] BoxError),
    /// A submission authorised from cached credentials found them changed when it was
    /// written, and stored nothing. Never reaches a client: the authorization middleware
    /// answers it by authenticating again from the database (it renders as 401 should it
    /// ever escape).
    #[error("the credentials changed since they were cached")]
    CredentialsChanged,
}

impl ApiError {
    /// One failing field.
    pub fn field(error: FieldError) -> Self {
        ApiError::Validation(vec![error])
    }

    /// A conflict with the current state, e.g. a duplicate name.
    pub fn conflict(code: &'static str, field: Option<&str>, detail: impl Into<String>) -> Self {
        ApiError::Conflict { code, detail: detail.into(), field: field.map(str::to_owned) }
    }

    fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        use ApiError::*;
        match self {
            Unauthenticated | CredentialsChanged => {
                (StatusCode::UNAUTHORIZED, "unauthenticated", "Authentication required")
            }
            InvalidCredentials => (StatusCode::UNAUTHORIZED, "invalid_credentials", "Invalid credentials"),
            Forbidden => (StatusCode::FORBIDDEN, "forbidden", "Forbidden"),
            NotFound(_) => (StatusCode::NOT_FOUND, "not_found", "Not found"),
            MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "Method not allowed"),
            HeadersTooLarge { .. } => {
                (StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "headers_too_large", "Request headers too large")
            }
            Validation(_) => (StatusCode::UNPROCESSABLE_ENTITY, "validation_failed", "Validation failed"),
            MalformedBody { .. } => (StatusCode::BAD_REQUEST, "malformed_body", "Malformed request body"),
            MalformedRequest { .. } => (StatusCode::BAD_REQUEST, "malformed_request", "Malformed request"),
            Conflict { code, .. } => (StatusCode::CONFLICT, code, "Conflict"),
            PreconditionFailed => (StatusCode::PRECONDITION_FAILED, "etag_mismatch", "Precondition failed"),
            IdentityRefused { .. } => (StatusCode::UNAUTHORIZED, "identity_refused", "Identity refused"),
            ProviderUnavailable { .. } => {
                (StatusCode::BAD_GATEWAY, "provider_unavailable", "Identity provider unavailable")
            }
            TooManyAttempts { .. } => (StatusCode::TOO_MANY_REQUESTS, "too_many_attempts", "Too many attempts"),
            PayloadTooLarge => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", "Payload too large"),
            UnsupportedMediaType => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type", "Unsupported media type")
            }
            IdempotencyKeyReused => {
                (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused", "Idempotency key reused")
            }
            IdempotencyInFlight => (StatusCode::CONFLICT, "idempotency_in_flight", "Request in flight"),
            Timeout => (StatusCode::SERVICE_UNAVAILABLE, "request_timeout", "Request timed out"),
            Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable", "Service unavailable"),
            Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal_error", "Internal server error"),
        }
    }

    /// The problem document this error renders as.
    pub fn problem(&self) -> Problem {
        let (status, code, title) = self.parts();
        let (detail, field, errors) = match self {
            ApiError::Validation(errors) => {
                let detail =
                    errors.iter().map(|e| format!("{}: {}", e.field, e.message)).collect::<Vec<_>>().join("; ");
                (detail, errors.first().map(|e| e.field.clone()), errors.clone())
            }
            ApiError::MalformedBody { field, detail } => (detail.clone(), field.clone(), Vec::new()),
            ApiError::MalformedRequest { field, detail } => (detail.clone(), Some(field.clone()), Vec::new()),
            ApiError::Conflict { detail, field, .. } => (detail.clone(), field.clone(), Vec::new()),
            ApiError::PayloadTooLarge => {
                ("the request body exceeds the size limit".into(), Some("body".into()), Vec::new())
            }
            ApiError::HeadersTooLarge { limit } => {
                (format!("the request headers exceed {} KiB in all", limit / 1024), None, Vec::new())
            }
            ApiError::UnsupportedMediaType => {
                ("the request body must be sent as application/json".into(), None, Vec::new())
            }
            ApiError::IdempotencyKeyReused => (
                "this Idempotency-Key was already used with a different request".into(),
                Some("Idempotency-Key".into()),
                Vec::new(),
            ),
            ApiError::IdempotencyInFlight => (
                "the first request with this Idempotency-Key is still being processed; retry later".into(),
                Some("Idempotency-Key".into()),
                Vec::new(),
            ),
            ApiError::TooManyAttempts { retry_after } => (
                format!(
                    "too many failed sign-ins for this username from this address; try again in {} s",
                    retry_seconds(*retry_after)
                ),
                None,
                Vec::new(),
            ),
            ApiError::PreconditionFailed => (
                "If-Match does not match the current ETag; read the resource again".into(),
                Some("If-Match".into()),
                Vec::new(),
            ),
            ApiError::Internal(_) => ("the server failed to handle the request".into(), None, Vec::new()),
            ApiError::Unavailable(_) => ("the service is briefly unavailable; retry shortly".into(), None, Vec::new()),
            other => (other.to_string(), None, Vec::new()),
        };
        Problem {
            type_: format!("/problems/{}", code.replace('_', "-")),
            title: title.into(),
            status: status.as_u16(),
            detail,
            code: code.into(),
            field,
            errors,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            ApiError::Internal(cause) => tracing::error!(error = %ops::error::chain(&**cause), "request failed"),
            ApiError::Unavailable(cause) => {
                tracing::warn!(error = %ops::error::chain(&**cause), "request failed: database unavailable");
            }
            _ => {}
        }
        let problem = self.problem();
        let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::to_vec(&problem).unwrap_or_default();
        let mut response = (status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        match &self {
            ApiError::TooManyAttempts { retry_after } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_seconds(*retry_after)));
            }
            // Brief by nature (a lost connection, a deadlock's rollback): say when to try.
            ApiError::Unavailable(_) | ApiError::Timeout => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(1));
            }
            _ => {}
        }
        if matches!(self, ApiError::Unauthenticated) {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"fairway\""));
        }
        response
    }
}

impl From<ops::Error> for ApiError {
    fn from(error: ops::Error) -> Self {
        match error {
            ops::Error::NotFound(what) => ApiError::NotFound(what),
            ops::Error::Forbidden => ApiError::Forbidden,
            ops::Error::InvalidCredentials => ApiError::InvalidCredentials,
            ops::Error::Validation(errors) => ApiError::Validation(errors),
            ops::Error::Conflict { code, detail, field } => ApiError::Conflict { code, detail, field },
            ops::Error::PreconditionFailed => ApiError::PreconditionFailed,
            ops::Error::IdentityRefused { reason } => ApiError::IdentityRefused { reason },
            ops::Error::ProviderUnavailable { reason } => ApiError::ProviderUnavailable { reason },
            ops::Error::Throttled { retry_after } => ApiError::TooManyAttempts { retry_after },
            ops::Error::CredentialsChanged => ApiError::CredentialsChanged,
            ops::Error::Unavailable(cause) => ApiError::Unavailable(Box::new(cause)),
            internal @ ops::Error::Internal { .. } => ApiError::Internal(Box::new(internal)),
        }
    }
}

/// Whole seconds to wait, rounded up: `Retry-After` has no fractions, and 0 would invite an
/// attempt that is still too early.
fn retry_seconds(wait: std::time::Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

impl From<sqlx::Error> for ApiError {
    fn from(error: sqlx::Error) -> Self {
        ops::Error::from(error).into()
    }
}

impl From<Vec<FieldError>> for ApiError {
    fn from(errors: Vec<FieldError>) -> Self {
        ApiError::Validation(errors)
    }
}

impl From<FieldError> for ApiError {
    fn from(error: FieldError) -> Self {
        ApiError::field(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_case_errors_keep_their_status_and_their_cause() {
        let unavailable = ApiError::from(ops::Error::from(sqlx::Error::PoolTimedOut));
        assert_eq!(unavailable.problem().status, 503);
        assert_eq!(unavailable.problem().code, "unavailable");
        let internal = ApiError::from(ops::Error::from(sqlx::Error::RowNotFound));
        let problem = internal.problem();
        assert_eq!(problem.status, 500);
        assert!(!problem.detail.contains("rows"), "nothing internal in the body: {}", problem.detail);
        let cause = std::error::Error::source(&internal).expect("the cause is kept");
        assert!(ops::error::chain(cause).contains("no rows returned"));
        let conflict = ApiError::from(ops::Error::conflict("team_exists", Some("name"), "team ml already exists"));
        assert_eq!((conflict.problem().status, conflict.problem().field.as_deref()), (409, Some("name")));
    }
}
