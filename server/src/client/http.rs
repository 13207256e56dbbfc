//! The client's one way to the server: its HTTP API, with a bearer token, retries where a
//! repeat cannot do harm, and RFC 9457 problems turned into messages and exit statuses.

use std::time::Duration;

use reqwest::{header, Method, RequestBuilder, Response, StatusCode, Url};
use serde::Deserialize;
use serde_json::Value;

use super::{config::Settings, exit::Exit};

/// How long a request may take, body included (not the streams, which last as long as the job).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Pauses before the second, third and fourth tries: a server restarting behind a load
/// balancer is back within seconds, and a CI step should not fail for that.
const RETRY_DELAYS: [Duration; 3] = [Duration::from_millis(500), Duration::from_secs(1), Duration::from_secs(2)];

/// One failing field of a problem.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the field, e.g. `gpus_per_replica`.
    pub field: String,
    /// Stable reason, e.g. `too_small`.
    #[serde(default)]
    pub code: String,
    /// A sentence for people.
    #[serde(default)]
    pub message: String,
}

/// What the client keeps of an RFC 9457 problem document.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct Problem {
    /// The sentence explaining this occurrence.
    #[serde(default)]
    pub detail: String,
    /// Stable code, e.g. `validation_failed`, `not_found`.
    #[serde(default)]
    pub code: String,
    /// Every failing field.
    #[serde(default)]
    pub errors: Vec<FieldError>,
}

impl Problem {
    /// Reads a problem from an error response's body; a body that is not one (a proxy's page)
    /// still gives a line to show.
    fn from_body(status: StatusCode, body: &str) -> Self {
        match serde_json::from_str::<Problem>(body) {
            Ok(problem) if !problem.detail.is_empty() || !problem.code.is_empty() => problem,
            _ => {
                let first = body.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default();
                let detail = match first.chars().count() {
                    0 => status.canonical_reason().unwrap_or("error").to_lowercase(),
                    n if n > 200 => format!("{}…", first.chars().take(200).collect::<String>()),
                    _ => first.to_owned(),
                };
                Problem { detail, ..Problem::default() }
            }
        }
    }
}

/// Why a command could not do what it was asked.
#[derive(Debug)]
pub enum Error {
    /// A flag, file or setting is wrong; nothing was sent.
    Usage(String),
    /// The server refused the request (4xx other than 401/403).
    Refused {
        /// The HTTP status.
        status: StatusCode,
        /// What the server said.
        problem: Problem,
    },
    /// No token to send: nothing was sent.
    Unauthenticated(String),
    /// Not authenticated, or not allowed (401/403).
    NotAllowed {
        /// The HTTP status.
        status: StatusCode,
        /// What the server said.
        problem: Problem,
    },
    /// The server could not be reached, answered 5xx, or answered something unreadable.
    Unavailable(String),
}

impl Error {
    /// The exit status this error ends the command with.
    pub fn exit(&self) -> Exit {
        match self {
            Error::Usage(_) => Exit::Usage,
            Error::Refused { .. } => Exit::Refused,
            Error::Unauthenticated(_) | Error::NotAllowed { .. } => Exit::NotAllowed,
            Error::Unavailable(_) => Exit::Unavailable,
        }
    }

    /// Whether the server answered 404 (a job it does not know, or a route it does not have).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Refused { status: StatusCode::NOT_FOUND, .. })
    }

    /// The message for standard error: the problem's detail, then each failing field.
    pub fn report(&self) -> String {
        match self {
            Error::Usage(message) | Error::Unauthenticated(message) | Error::Unavailable(message) => {
                format!("fairway: {message}")
            }
            Error::Refused { status, problem } | Error::NotAllowed { status, problem } => {
                let code = if problem.code.is_empty() { String::new() } else { format!(", {}", problem.code) };
                let mut text = format!("fairway: {} ({}{code})", problem.detail, status.as_u16());
                for e in &problem.errors {
                    let line = format!("{}: {}", e.field, e.message);
                    // A problem about one field often says it whole in its detail.
                    if line != problem.detail {
                        text.push_str(&format!("\n  {line}"));
                    }
                }
                if *status == StatusCode::UNAUTHORIZED {
                    text.push_str("\n  check the token: --token, FAIRWAY_TOKEN or `token` in client.toml");
                }
                text
            }
        }
    }
}

/// Whether a request may be sent again after a failure that left its fate unknown (a
/// timeout, a 502 between a proxy and the server). One that never reached the server (the
/// connection was refused) may always be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repeat {
    /// Reads, cancels, and submissions with an idempotency key.
    Safe,
    /// A submission without a key: a second try could make a second job.
    Unsafe,
}

/// The server's API, as one caller.
#[derive(Debug, Clone)]
pub struct Api {
    http: reqwest::Client,
    base: Url,
    token: Option<String>,
}

impl Api {
    /// A client for the server and token of `settings`.
    pub fn new(settings: &Settings) -> Result<Self, Error> {
        let base = Url::parse(&settings.url).map_err(|e| Error::Usage(format!("{}: {e}", settings.url)))?;
        let http = reqwest::Client::builder()
            .user_agent(concat!("fairway/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| Error::Unavailable(format!("cannot set up HTTP: {e}")))?;
        Ok(Self { http, base, token: settings.token.clone() })
    }

    /// The address of `/api/v1/<segments...>`, each segment escaped, under the base address's
    /// own path (a server behind a proxy at `/fairway/` keeps it).
    pub fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(["api", "v1"]).extend(segments);
        }
        url
    }

    /// A request with the caller's token.
    pub fn request(&self, method: Method, url: Url) -> RequestBuilder {
        let request = self.http.request(method, url);
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// GETs JSON.
    pub async fn get(&self, url: Url) -> Result<Value, Error> {
        let response =
            self.send(|| self.request(Method::GET, url.clone()).timeout(REQUEST_TIMEOUT), Repeat::Safe).await?;
        json(response).await
    }

    /// POSTs a JSON body (already serialized: its bytes may be what a key was derived from).
    pub async fn post(&self, url: Url, body: Option<&[u8]>, key: Option<&str>, repeat: Repeat) -> Result<Value, Error> {
        let build = || {
            let mut request = self.request(Method::POST, url.clone()).timeout(REQUEST_TIMEOUT);
            if let Some(body) = body {
                request = request.header(header::CONTENT_TYPE, "application/json").body(body.to_vec());
            }
            if let Some(key) = key {
                request = request.header("idempotency-key", key);
            }
            request
        };
        json(self.send(build, repeat).await?).await
    }

    /// Sends what `build` makes, again after failures `repeat` allows, and turns an error
    /// status into an [`Error`]. The answer's body is left to read (a stream may be endless).
    pub async fn send(&self, build: impl Fn() -> RequestBuilder, repeat: Repeat) -> Result<Response, Error> {
        let mut delays = RETRY_DELAYS.iter();
        loop {
            let outcome = build().send().await;
            let again = match &outcome {
                Err(e) => e.is_connect() || (repeat == Repeat::Safe && (e.is_timeout() || e.is_request())),
                Ok(r) => {
                    repeat == Repeat::Safe
                        && matches!(
                            r.status(),
                            StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
                        )
                }
            };
            match delays.next() {
                Some(delay) if again => tokio::time::sleep(*delay).await,
                _ => return check(outcome.map_err(|e| self.unreachable(&e))?).await,
            }
        }
    }

    /// The message for a request that got no answer.
    pub fn unreachable(&self, e: &reqwest::Error) -> Error {
        let what = if e.is_connect() {
            "cannot connect"
        } else if e.is_timeout() {
            "no answer in time"
        } else {
            "the request failed"
        };
        // The error's own text names the URL, but not the cause below it.
        let mut cause = String::new();
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            cause = format!(": {s}");
            source = s.source();
        }
        Error::Unavailable(format!("{what} to {}{cause} (--url, FAIRWAY_URL, `url` in client.toml)", self.base))
    }
}

/// Passes a 2xx answer through; turns any other into the matching [`Error`].
async fn check(response: Response) -> Result<Response, Error> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let body = response.text().await.unwrap_or_default();
    let problem = Problem::from_body(status, &body);
    Err(match status.as_u16() {
        401 | 403 => Error::NotAllowed { status, problem },
        400..=499 => Error::Refused { status, problem },
        _ => Error::Unavailable(format!("the server answered {}: {}", status.as_u16(), problem.detail)),
    })
}

/// Reads a JSON body.
pub async fn json(response: Response) -> Result<Value, Error> {
    let bytes = response.bytes().await.map_err(|e| Error::Unavailable(format!("reading the answer: {e}")))?;
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes).map_err(|e| Error::Unavailable(format!("the server's answer is not JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::config::Output;

    fn api(url: &str) -> Api {
        Api::new(&Settings { url: url.to_owned(), token: None, team: None, output: Output::Text }).unwrap()
    }

    #[test]
    fn paths_go_under_the_base_address_with_each_segment_escaped() {
        assert_eq!(
            api("http://h:8080").url(&["teams", "ml research", "jobs:dry-run"]).as_str(),
            "http://h:8080/api/v1/teams/ml%20research/jobs:dry-run"
        );
        assert_eq!(api("https://h/fairway/").url(&["me"]).as_str(), "https://h/fairway/api/v1/me");
        assert_eq!(api("https://h/fairway").url(&["teams", "a/b"]).as_str(), "https://h/fairway/api/v1/teams/a%2Fb");
    }

    #[test]
    fn a_problem_reports_its_detail_and_every_field() {
        let body = r#"{"type":"/problems/validation","title":"Invalid","status":422,"detail":"the job is invalid","code":"validation_failed","errors":[{"field":"gpus_per_replica","code":"too_small","message":"must be at least 1"}]}"#;
        let error = Error::Refused {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            problem: Problem::from_body(StatusCode::UNPROCESSABLE_ENTITY, body),
        };
        assert_eq!(error.exit(), Exit::Refused);
        assert_eq!(
            error.report(),
            "fairway: the job is invalid (422, validation_failed)\n  gpus_per_replica: must be at least 1"
        );
    }

    #[test]
    fn a_body_that_is_no_problem_still_says_something() {
        let page = Problem::from_body(StatusCode::BAD_GATEWAY, "\n<html>bad gateway</html>\n");
        assert_eq!(page.detail, "<html>bad gateway</html>");
        assert_eq!(Problem::from_body(StatusCode::NOT_FOUND, "").detail, "not found");
    }
}
