//! What an operator and a client see when the database is down: a 503 for the client, and
//! one log line with its cause and the request id for the operator.
//!
//! A binary of its own, not one more test of the API suite: the log line is captured by a
//! subscriber set for this test alone, and in a process where other tests' threads create
//! spans with no subscriber at the same time, one of them could register the request span's
//! callsite as disabled between this test's subscriber and its request (tracing caches each
//! callsite's interest process-wide), and the line then came without the request id (seen
//! once in a CI run on 2026-12-02, even with the interest cache rebuilt after the subscriber
//! was set). Here no other test runs in the process.

use std::sync::{Arc, Mutex};

use fairway_tests::{call, TestApp};
use serde_json::json;

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
