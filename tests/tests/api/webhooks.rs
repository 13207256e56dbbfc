//! Team webhooks end to end on the simulated cluster: the control loop's notifier turns job
//! ends into deliveries, a local receiver verifies every Standard Webhooks signature with the
//! secret from creation, a receiver that fails gets the same message again, and the delivery
//! log and the routes are the team's alone.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
};
use base64::{engine::general_purpose::STANDARD as BASE64, Engine as _};
use fairway::{control, serve};
use fairway_tests::{call, TestApp};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::lifecycle::{submit, wait_for, wait_for_inventory};

/// One request the receiver got.
#[derive(Clone, Debug)]
pub(crate) struct Received {
    /// The path it was sent to, without the leading `/`.
    path: String,
    pub(crate) id: String,
    timestamp: String,
    signature: String,
    content_type: String,
    body: String,
}

/// A local webhook receiver: records every request; paths starting `flaky` answer 500 to
/// the first request of each message and 200 after.
#[derive(Clone, Default)]
pub(crate) struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    pub(crate) async fn start() -> (String, Receiver) {
        let receiver = Receiver::default();
        let app = axum::Router::new().route("/{*path}", axum::routing::post(receive)).with_state(receiver.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        tokio::spawn(async move { axum::serve(listener, app).await.expect("receiver") });
        (format!("http://{addr}"), receiver)
    }

    fn at(&self, path: &str) -> Vec<Received> {
        self.got.lock().expect("lock").iter().filter(|r| r.path == path).cloned().collect()
    }

    /// Waits until `path` got requests for which `done` holds.
    pub(crate) async fn wait(&self, path: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        for _ in 0..400 {
            let got = self.at(path);
            if done(&got) {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the receiver at /{path} did not get what was expected: {:#?}", self.at(path));
    }
}

async fn receive(
    State(receiver): State<Receiver>,
    Path(path): Path<String>,
    headers: HeaderMap,
    body: String,
) -> StatusCode {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let got = Received {
        id: header("webhook-id"),
        timestamp: header("webhook-timestamp"),
        signature: header("webhook-signature"),
        content_type: header("content-type"),
        path,
        body,
    };
    let mut all = receiver.got.lock().expect("lock");
    let again = all.iter().any(|r| r.path == got.path && r.id == got.id);
    let status =
        if got.path.starts_with("flaky") && !again { StatusCode::INTERNAL_SERVER_ERROR } else { StatusCode::OK };
    all.push(got);
    status
}

/// Whether `r` carries a valid Standard Webhooks signature by `secret`: one of the
/// space-separated `v1,<base64>` values is the HMAC-SHA256 of `{id}.{timestamp}.{body}`.
fn verifies(secret: &str, r: &Received) -> bool {
    let key = BASE64.decode(secret.strip_prefix("whsec_").expect("whsec_ secret")).expect("base64 secret");
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("key");
    mac.update(format!("{}.{}.{}", r.id, r.timestamp, r.body).as_bytes());
    let expected = BASE64.encode(mac.finalize().into_bytes());
    let recent = r.timestamp.parse::<i64>().is_ok_and(|t| (chrono::Utc::now().timestamp() - t).abs() < 300);
    recent && r.signature.split(' ').any(|s| s.strip_prefix("v1,") == Some(expected.as_str()))
}

/// An app whose control loop runs on the simulated cluster at 10×, notifies every 50 ms and
/// retries webhooks after 50 ms; team `ml` with 16 reserved H100s; the admin's and a member
/// token's credentials.
pub(crate) async fn platform() -> (TestApp, String, String) {
    let app = TestApp::spawn().await;
    let mut state = app.state.clone();
    let mut config = (*state.config).clone();
    config.sim_speedup = Some(10.0);
    config.cycle_interval = Duration::from_millis(50);
    state.config = Arc::new(config);
    let mut ctx = serve::control_context(&state).await.expect("control context");
    ctx.config.reconcile_interval = Duration::from_millis(50);
    ctx.config.notify_interval = Duration::from_millis(50);
    ctx.config.webhook_retry_unit = Duration::from_millis(10);
    let options = (*app.pool.connect_options()).clone();
    control::spawn(ctx, options, format!("test-{}", uuid::Uuid::new_v4().simple()));
    wait_for_inventory(&app).await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100-80gb", 16, 0).await;
    let (_, token) = app.api_token(&admin, "ml", "member").await;
    (app, admin, token)
}

/// Creates a webhook of `team`; its id and secret.
pub(crate) async fn webhook(app: &TestApp, admin: &str, team: &str, body: Value) -> (String, String) {
    let r = app.send(call("POST", &format!("/api/v1/teams/{team}/webhooks")).token(admin).json(&body)).await;
    r.assert_status(201);
    let v = r.json();
    (v["id"].as_str().expect("id").to_owned(), v["secret"].as_str().expect("secret").to_owned())
}

/// A job of one H100 for one simulated second, exiting with `exit_code`.
pub(crate) fn job(name: &str, exit_code: i32) -> Value {
    json!({"name": name, "gpu_class": "h100-80gb", "image": "x",
           "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "1", "FAIRWAY_SIM_EXIT_CODE": exit_code.to_string()}})
}

async fn deliveries(app: &TestApp, token: &str, team: &str, webhook: &str) -> Vec<Value> {
    let r = app.send(call("GET", &format!("/api/v1/teams/{team}/webhooks/{webhook}/deliveries")).token(token)).await;
    r.assert_status(200);
    r.json()["items"].as_array().expect("items").clone()
}

#[tokio::test]
async fn a_failed_and_a_succeeded_job_reach_the_teams_webhook_signed_with_its_secret() {
    let (app, admin, token) = platform().await;
    let (base, receiver) = Receiver::start().await;
    let (hook, secret) =
        webhook(&app, &admin, "ml", json!({"url": format!("{base}/hook"), "events": ["job.failed", "job.succeeded"]}))
            .await;
    let failing = submit(&app, &token, "ml", job("breaks", 3)).await;
    let passing = submit(&app, &token, "ml", job("works", 0)).await;
    for id in [&failing, &passing] {
        wait_for(&app, &token, id, Duration::from_secs(30), |j| j["finished_at"].is_string()).await;
    }

    let got = receiver.wait("hook", |got| got.len() >= 2).await;
    for r in &got {
        assert!(verifies(&secret, r), "a signature does not verify: {r:#?}");
        assert_eq!(r.content_type, "application/json");
        assert!(r.id.starts_with("msg_"), "{}", r.id);
    }
    let bodies: Vec<Value> = got.iter().map(|r| serde_json::from_str(&r.body).expect("JSON body")).collect();
    let failed = bodies.iter().find(|b| b["data"]["job"] == failing.as_str()).expect("the failed job's message");
    assert_eq!(failed["type"], "job.failed");
    assert_eq!(failed["data"]["name"], "breaks");
    assert_eq!(failed["data"]["team"], "ml");
    assert_eq!(failed["data"]["state"], "failed");
    assert_eq!(failed["data"]["exit_code"], 3);
    assert_eq!(failed["data"]["url"], format!("/api/v1/jobs/{failing}"));
    assert!(failed["timestamp"].as_str().is_some_and(|t| chrono::DateTime::parse_from_rfc3339(t).is_ok()));
    let succeeded = bodies.iter().find(|b| b["data"]["job"] == passing.as_str()).expect("the succeeded job's message");
    assert_eq!(succeeded["type"], "job.succeeded");
    assert_eq!(succeeded["data"]["exit_code"], 0);

    // The log, readable by a member, shows both delivered at the first attempt.
    let log = deliveries(&app, &token, "ml", &hook).await;
    assert_eq!(log.len(), 2, "{log:#?}");
    for d in &log {
        assert_eq!(d["state"], "delivered", "{d:#}");
        assert_eq!(d["attempts"], 1);
        assert_eq!(d["last_status"], 200);
    }
    // A member sees where the webhook points only up to its origin; the secret never.
    let list = app.send(call("GET", "/api/v1/teams/ml/webhooks").token(&token)).await;
    list.assert_status(200);
    let listed = &list.json()["items"][0];
    assert_eq!(listed["url"], format!("{base}/…"));
    assert!(listed.get("secret").is_none());
}

#[tokio::test]
async fn a_receiver_that_answers_500_gets_the_same_message_again_and_the_log_counts_both_attempts() {
    let (app, admin, token) = platform().await;
    let (base, receiver) = Receiver::start().await;
    let (hook, secret) =
        webhook(&app, &admin, "ml", json!({"url": format!("{base}/flaky"), "events": ["job.failed"]})).await;
    let id = submit(&app, &token, "ml", job("breaks", 3)).await;
    wait_for(&app, &token, &id, Duration::from_secs(30), |j| j["finished_at"].is_string()).await;

    let got = receiver.wait("flaky", |got| got.len() >= 2).await;
    assert_eq!(got[0].id, got[1].id, "a retry carries the first attempt's webhook-id");
    assert_eq!(got[0].body, got[1].body, "a retry carries the same body");
    assert!(got.iter().all(|r| verifies(&secret, r)), "{got:#?}");

    let log = loop {
        let log = deliveries(&app, &token, "ml", &hook).await;
        if log.first().is_some_and(|d| d["state"] == "delivered") {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["message_id"], got[0].id.as_str());
    assert_eq!(log[0]["event_type"], "job.failed");
    assert_eq!(log[0]["attempts"], 2);
    assert_eq!(log[0]["last_status"], 200);
}

#[tokio::test]
async fn a_slack_format_webhook_gets_one_sentence_in_text_with_the_same_signature_headers() {
    let (app, admin, token) = platform().await;
    let (base, receiver) = Receiver::start().await;
    let (_, secret) = webhook(
        &app,
        &admin,
        "ml",
        json!({"url": format!("{base}/slack"), "events": ["job.failed"], "format": "slack"}),
    )
    .await;
    let id = submit(&app, &token, "ml", job("breaks", 3)).await;
    wait_for(&app, &token, &id, Duration::from_secs(30), |j| j["finished_at"].is_string()).await;

    let got = receiver.wait("slack", |got| !got.is_empty()).await;
    assert!(verifies(&secret, &got[0]));
    let body: Value = serde_json::from_str(&got[0].body).expect("JSON body");
    let text = body["text"].as_str().expect("text");
    assert_eq!(body.as_object().map(serde_json::Map::len), Some(1), "{body:#}");
    assert!(text.starts_with("Job breaks of team ml failed"), "{text}");
    assert!(text.contains("exit code 3"), "{text}");
}

#[tokio::test]
async fn webhook_routes_answer_404_to_another_teams_token() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.team(&admin, "other", None).await;
    let (hook, _) =
        webhook(&app, &admin, "ml", json!({"url": "https://hooks.example.com/ml", "events": ["job.failed"]})).await;
    let (_, stranger) = app.api_token(&admin, "other", "member").await;
    for (method, path) in [
        ("GET", "/api/v1/teams/ml/webhooks".to_owned()),
        ("POST", "/api/v1/teams/ml/webhooks".to_owned()),
        ("DELETE", format!("/api/v1/teams/ml/webhooks/{hook}")),
        ("GET", format!("/api/v1/teams/ml/webhooks/{hook}/deliveries")),
    ] {
        let c = call(method, &path).token(&stranger);
        let c = if method == "POST" {
            c.json(&json!({"url": "https://evil.example.com/", "events": ["job.failed"]}))
        } else {
            c
        };
        app.send(c).await.assert_status(404);
    }
    // Nor does its own team's route reach ml's webhook.
    app.send(call("GET", &format!("/api/v1/teams/other/webhooks/{hook}/deliveries")).token(&stranger))
        .await
        .assert_problem(404, "not_found");
    // The webhook is still there, and deleting it is audited and final.
    app.send(call("DELETE", &format!("/api/v1/teams/ml/webhooks/{hook}")).token(&admin)).await.assert_status(204);
    app.send(call("DELETE", &format!("/api/v1/teams/ml/webhooks/{hook}")).token(&admin)).await.assert_status(404);
    let audit = app.send(call("GET", "/api/v1/teams/ml/audit-log").token(&admin)).await;
    let actions = audit.json().to_string();
    assert!(actions.contains("webhook.create") && actions.contains("webhook.delete"), "{actions}");
}

#[tokio::test]
async fn a_webhook_with_a_bad_url_or_an_unknown_event_is_refused_naming_the_field() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    let cases = [
        (json!({"url": "ftp://hooks.example.com/", "events": ["job.failed"]}), "url"),
        (json!({"url": "not a url", "events": ["job.failed"]}), "url"),
        (json!({"url": "https://hooks.example.com/", "events": []}), "events"),
        (json!({"url": "https://hooks.example.com/", "events": ["job.failed", "job.exploded"]}), "events[1]"),
        (json!({"url": "https://hooks.example.com/", "events": ["job.failed"], "format": "teams"}), "format"),
    ];
    for (body, field) in cases {
        let r = app.send(call("POST", "/api/v1/teams/ml/webhooks").token(&admin).json(&body)).await;
        let problem = r.assert_problem(422, "validation_failed");
        assert_eq!(problem["field"], field, "{body}: {problem:#}");
    }
}
