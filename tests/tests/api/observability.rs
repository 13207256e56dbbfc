//! What an operator sees of a request: its id, and for a failure the one log line that says
//! why; and what a client sees when the database is down.

use std::sync::{Arc, Mutex};

use fairway_tests::{
    call,
    prometheus::{Prometheus, Target},
    TestApp,
};
use serde_json::json;

#[tokio::test]
async fn every_response_carries_a_request_id_and_a_callers_own_id_comes_back() {
    let app = TestApp::spawn().await;
    let made_up = app.send(call("GET", "/healthz")).await;
    let id = made_up.header("x-request-id").expect("a request id");
    assert_eq!(id.len(), 32, "{id}");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    let other = app.send(call("GET", "/healthz")).await.header("x-request-id").unwrap();
    assert_ne!(id, other, "each request gets its own id");

    let echoed = app.send(call("GET", "/api/v1/me").header("x-request-id", "ci-run-42/step:3")).await;
    echoed.assert_status(401);
    assert_eq!(echoed.header("x-request-id").as_deref(), Some("ci-run-42/step:3"));

    let replaced = app.send(call("GET", "/login").header("x-request-id", "forged\" level=error")).await;
    let id = replaced.header("x-request-id").unwrap();
    assert!(!id.contains("forged"), "a caller's id that could forge log structure is replaced: {id}");
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_database_outage_answers_503_and_is_logged_once_with_its_cause_and_the_request_id() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.gpu_class(&admin, "h100-80gb").await;

    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    // Other tests' threads, with no subscriber, may have registered the request span's
    // callsite as disabled while this one was being set; ask every callsite again, now.
    tracing::callsite::rebuild_interest_cache();

    app.pool.close().await;
    let spec = json!({"name": "train", "gpu_class": "h100-80gb", "image": "ghcr.io/acme/train:1"});
    let r = app.send(call("POST", "/api/v1/teams/ml/jobs:dry-run").token(&admin).json(&spec)).await;
    let problem = r.assert_problem(503, "unavailable");
    assert!(!problem["detail"].as_str().unwrap().contains("pool"), "no internal detail: {problem}");
    let id = r.header("x-request-id").unwrap();

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let failures: Vec<&str> = text.lines().filter(|l| l.contains("database unavailable")).collect();
    assert_eq!(failures.len(), 1, "logged once:\n{text}");
    assert!(failures[0].contains(&format!("request_id={id}")), "with the request id:\n{text}");
    assert!(failures[0].contains("closed"), "with its cause:\n{text}");
}

#[tokio::test]
async fn a_real_prometheus_scrapes_metrics_with_the_token_and_sees_every_kind_of_series() {
    let app = TestApp::spawn_with(|c| c.metrics_token = Some(fairway::config::Secret::new("scrape-token"))).await;
    let admin = app.admin().await;
    app.send(call("GET", "/api/v1/teams").token(&admin)).await.assert_status(200);
    app.state.metrics.budget_alert("ml", 80);
    app.state.metrics.declare(&["priority"], &["succeeded"]);
    let prometheus =
        Prometheus::start(&[Target { job: "fairway", addr: app.listen().await, token: Some("scrape-token") }]);
    let http = reqwest::Client::builder().no_proxy().timeout(std::time::Duration::from_secs(5)).build().unwrap();
    prometheus.wait_until_up(&http, &["fairway"]).await;
    // It parsed every kind: an info metric, counters (a team's, with the token; one declared
    // at zero), a histogram, gauges, and the process collector's.
    let version = prometheus.query(&http, "fairway_build_info").await;
    assert_eq!(version[0].0["version"], env!("CARGO_PKG_VERSION"), "{version:?}");
    let teams = prometheus.query(&http, "fairway_http_requests_total{route=\"/api/v1/teams\"}").await;
    assert_eq!(teams.len(), 1, "{teams:?}");
    let alerts = prometheus.query(&http, "fairway_budget_alerts_total{team=\"ml\",threshold=\"80\"}").await;
    assert_eq!(alerts.first().map(|(_, v)| v.as_str()), Some("1"), "{alerts:?}");
    let declared = prometheus.query(&http, "fairway_job_attempts_total{outcome=\"succeeded\"}").await;
    assert_eq!(declared.first().map(|(_, v)| v.as_str()), Some("0"), "{declared:?}");
    let buckets =
        prometheus.query(&http, "fairway_http_request_duration_seconds_bucket{route=\"/api/v1/teams\"}").await;
    assert_eq!(buckets.len(), 12, "11 bounds and +Inf: {buckets:?}");
    for gauge in ["fairway_scheduler_leader", "fairway_db_connections", "process_resident_memory_bytes"] {
        assert!(!prometheus.query(&http, gauge).await.is_empty(), "{gauge} was not scraped");
    }
}
