//! What an operator sees of a request: its id, and for a failure the one log line that says
//! why; and what a client sees when the database is down.

use std::sync::{Arc, Mutex};

use fairway_tests::{call, TestApp};
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
