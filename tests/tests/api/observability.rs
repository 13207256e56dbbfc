//! What an operator sees of a request: its id (the one log line a failure writes, and what a
//! client sees when the database is down, are `tests/outage_log.rs`, in a process of its own).

use fairway_tests::{
    call,
    prometheus::{Prometheus, Target},
    TestApp,
};

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
