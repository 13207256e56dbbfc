//! What the two faces (the REST API and the portal) share about HTTP: the problem-document
//! error and its mapping from use-case errors, request extractors (JSON bodies whose structs
//! must be objects), the door every request passes (header limit, HSTS, `Connection: close`),
//! refusal of text the database cannot store, idempotency keys,
//! authentication and authorization middleware, conditional reads (`If-None-Match`), and
//! request ids with their span.

pub mod authorize;
pub mod conditional;
pub mod edge;
pub mod error;
pub mod extract;
pub mod hostile;
pub mod idempotency;
pub mod objects_only;
pub mod trace;

/// A plain-text answer streamed as it is produced (a job's log, followed or not). An error
/// after the first bytes cannot become a status: the body ends abruptly instead, so that a
/// reader never takes a cut text for a whole one. `no-transform` keeps it out of the
/// compression layer, whose buffer would hold followed lines back.
pub fn text_stream(
    chunks: impl futures_util::Stream<Item = crate::ops::Result<String>> + Send + 'static,
) -> axum::response::Response {
    use axum::{
        http::{header, HeaderValue},
        response::IntoResponse as _,
    };
    use futures_util::StreamExt as _;
    let body = chunks.map(|chunk| {
        chunk.map_err(|e| {
            tracing::warn!(error = %crate::ops::error::chain(&e), "a streamed answer failed midway");
            std::io::Error::other("reading failed")
        })
    });
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8")),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store, no-transform")),
        ],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}
