//! What every request meets at the door and every response carries out of it, whatever the
//! route: a limit on the header section, a truthful `Connection: close`, and HSTS behind a
//! TLS-terminating proxy.

use std::{
    pin::Pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    task::{Context, Poll},
};

use axum::{
    body::Body,
    extract::Request,
    http::{header, HeaderMap, HeaderValue, Version},
    middleware::Next,
    response::{IntoResponse as _, Response},
};
use http_body::{Body as HttpBody, Frame, SizeHint};

use super::error::ApiError;

/// The most header bytes (names, values and their separators) a request may carry. Far above
/// what a browser or client sends (a bearer token and a few cookies take 2–3 KiB), and small
/// enough that a client cannot make every request hold large buffers.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// `Strict-Transport-Security` for responses that went out over TLS: two years, as the HSTS
/// preload list asks. Subdomains are left alone: they may be other teams' services.
const HSTS: HeaderValue = HeaderValue::from_static("max-age=63072000");

/// Refuses oversized header sections with 431, and marks the response on its way out: HSTS
/// when a proxy says the client spoke HTTPS, and `Connection: close` when the connection
/// cannot be reused because the request's body was left unread.
pub async fn door(request: Request, next: Next) -> Response {
    if header_bytes(request.headers()) > MAX_HEADER_BYTES {
        let mut response = ApiError::HeadersTooLarge { limit: MAX_HEADER_BYTES }.into_response();
        // The body (if any) will not be read either.
        close_connection(&mut response, request.version());
        return response;
    }
    let over_tls = forwarded_https(request.headers());
    let version = request.version();
    let (request, body_finished) = track_body(request);
    let mut response = next.run(request).await;
    if over_tls {
        response.headers_mut().insert(header::STRICT_TRANSPORT_SECURITY, HSTS);
    }
    if body_finished.is_some_and(|finished| !finished.load(Ordering::Acquire)) {
        // An answer given before the body was read (401, 403, 413, 415...): the server cannot
        // find the next request's start in this connection, so it closes it. Saying so lets
        // the client retry on a fresh connection instead of writing into a closed one.
        close_connection(&mut response, version);
    }
    response
}

/// The size of a header section as HTTP/1.1 sends it: `name: value\r\n` per field.
fn header_bytes(headers: &HeaderMap) -> usize {
    headers.iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum()
}

/// Whether the proxy in front says the client connected over HTTPS (`X-Forwarded-Proto`, its
/// first entry). Not a trust decision: browsers ignore HSTS received over plain HTTP, so a
/// client that forges the header gains nothing.
fn forwarded_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(',').next())
        .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"))
}

/// HTTP/2 and later have no `Connection` header (and multiplex instead).
fn close_connection(response: &mut Response, version: Version) {
    if version <= Version::HTTP_11 {
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
}

/// Wraps a request that has a body so that reading it to its end is recorded; `None` for a
/// request without one.
fn track_body(request: Request) -> (Request, Option<Arc<AtomicBool>>) {
    if request.body().is_end_stream() {
        return (request, None);
    }
    let finished = Arc::new(AtomicBool::new(false));
    let request = request.map(|inner| Body::new(Tracked { inner, finished: finished.clone() }));
    (request, Some(finished))
}

/// A request body that notes when its last frame was read.
struct Tracked {
    inner: Body,
    finished: Arc<AtomicBool>,
}

impl HttpBody for Tracked {
    type Data = <Body as HttpBody>::Data;
    type Error = <Body as HttpBody>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.finished.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_section_is_measured_as_it_travels() {
        let mut headers = HeaderMap::new();
        headers.insert("x-a", HeaderValue::from_static("12345"));
        assert_eq!(header_bytes(&headers), 3 + 5 + 4);
    }

    #[test]
    fn only_a_first_forwarded_proto_of_https_counts_as_tls() {
        let with = |value: &'static str| {
            let mut headers = HeaderMap::new();
            headers.insert("x-forwarded-proto", HeaderValue::from_static(value));
            forwarded_https(&headers)
        };
        assert!(with("https"));
        assert!(with("HTTPS, http"));
        assert!(!with("http, https"));
        assert!(!forwarded_https(&HeaderMap::new()));
    }
}
