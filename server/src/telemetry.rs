//! Logging and metrics. Logs are compact text locally and JSON lines in clusters
//! (`FAIRWAY_LOG_FORMAT=json`); metrics are Prometheus text at `/metrics`.
//!
//! The metrics registry is a handful of counters and one histogram kept under a mutex: the
//! request rate of a control-plane API does not justify a metrics crate and its dependencies.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    sync::Mutex,
    time::{Duration, Instant},
};

use axum::{
    extract::{MatchedPath, Request, State},
    middleware::Next,
    response::Response,
};

use crate::app::AppState;

/// Installs the global tracing subscriber once; later calls are no-ops.
pub fn init(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,sqlx=warn"));
    use std::io::IsTerminal as _;
    // Colour only for a person at a terminal, never into files or log pipelines.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = if json { builder.json().flatten_event(true).try_init() } else { builder.compact().try_init() };
}

/// Upper bounds of the latency histogram, in seconds.
const BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// Request counters and latencies by route.
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    latency: Mutex<BTreeMap<(String, String), Histogram>>,
}

impl Metrics {
    /// Records one finished request.
    pub fn observe(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let key = (method.to_owned(), route.to_owned());
        if let Ok(mut requests) = self.requests.lock() {
            *requests.entry((key.0.clone(), key.1.clone(), status)).or_default() += 1;
        }
        if let Ok(mut latency) = self.latency.lock() {
            let h = latency.entry(key).or_default();
            let secs = elapsed.as_secs_f64();
            for (i, bound) in BUCKETS.iter().enumerate() {
                if secs <= *bound {
                    h.counts[i] += 1;
                }
            }
            h.count += 1;
            h.sum += secs;
        }
    }

    /// The Prometheus text exposition. `pool` is (open, idle) database connections.
    pub fn render(&self, pool: (u32, usize)) -> String {
        let mut out = String::new();
        out.push_str("# HELP fairway_http_requests_total HTTP requests by method, route and status.\n");
        out.push_str("# TYPE fairway_http_requests_total counter\n");
        if let Ok(requests) = self.requests.lock() {
            for ((method, route, status), n) in requests.iter() {
                let _ = writeln!(
                    out,
                    "fairway_http_requests_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP fairway_http_request_duration_seconds HTTP request latency.\n");
        out.push_str("# TYPE fairway_http_request_duration_seconds histogram\n");
        if let Ok(latency) = self.latency.lock() {
            for ((method, route), h) in latency.iter() {
                let labels = format!("method=\"{method}\",route=\"{route}\"");
                for (bound, n) in BUCKETS.iter().zip(h.counts) {
                    let _ =
                        writeln!(out, "fairway_http_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {n}");
                }
                let _ =
                    writeln!(out, "fairway_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}", h.count);
                let _ = writeln!(out, "fairway_http_request_duration_seconds_sum{{{labels}}} {}", h.sum);
                let _ = writeln!(out, "fairway_http_request_duration_seconds_count{{{labels}}} {}", h.count);
            }
        }
        let (open, idle) = pool;
        out.push_str("# HELP fairway_db_connections Database pool connections by state.\n");
        out.push_str("# TYPE fairway_db_connections gauge\n");
        let _ = writeln!(out, "fairway_db_connections{{state=\"idle\"}} {idle}");
        let _ = writeln!(out, "fairway_db_connections{{state=\"in_use\"}} {}", (open as usize).saturating_sub(idle));
        out
    }
}

/// Middleware: logs each request once (method, route, status, duration; never bodies or
/// credentials) and records it in the metrics.
pub async fn observe(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().as_str().to_owned();
    // The route template, not the raw path: bounded label cardinality, no names in metrics.
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let response = next.run(request).await;
    let elapsed = started.elapsed();
    let status = response.status().as_u16();
    state.metrics.observe(&method, &route, status, elapsed);
    tracing::info!(
        http.method = %method,
        http.route = %route,
        http.status = status,
        duration_ms = elapsed.as_millis() as u64,
        "request"
    );
    response
}
