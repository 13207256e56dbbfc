//! Following a job's timeline as a server-sent event stream, over a real socket with the
//! control loop running: what `fairway submit --wait` and the live job page read.

use std::time::Duration;

use fairway_tests::{call, TestApp};
use serde_json::{json, Value};

use crate::lifecycle::{start_control, submit, wait_for_inventory};

/// One frame of an event stream.
#[derive(Debug, Clone, PartialEq)]
struct Frame {
    id: Option<String>,
    event: String,
    data: Value,
}

/// An open stream, read frame by frame.
struct Stream {
    response: reqwest::Response,
    buffer: String,
}

impl Stream {
    async fn open(base: &str, token: &str, job: &str, query: &str, last_event_id: Option<&str>) -> Self {
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let mut request = http.get(format!("{base}/api/v1/jobs/{job}/events:stream{query}")).bearer_auth(token);
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id);
        }
        let response = request.send().await.expect("open the stream");
        assert_eq!(response.status(), 200, "{:?}", response.headers());
        let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
        assert_eq!(content_type, "text/event-stream");
        Self { response, buffer: String::new() }
    }

    /// The next frame (comments skipped), or `None` once the server closed the stream.
    async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut frame = Frame { id: None, event: "message".into(), data: Value::Null };
                let mut data = String::new();
                for line in block.lines() {
                    match line.split_once(':') {
                        Some(("", _)) => {}
                        Some(("id", v)) => frame.id = Some(v.trim_start().to_owned()),
                        Some(("event", v)) => frame.event = v.trim_start().to_owned(),
                        Some(("data", v)) => data.push_str(v.strip_prefix(' ').unwrap_or(v)),
                        _ => {}
                    }
                }
                if data.is_empty() {
                    continue;
                }
                frame.data = serde_json::from_str(&data).unwrap_or(Value::String(data));
                return Some(frame);
            }
            let chunk = tokio::time::timeout(Duration::from_secs(30), self.response.chunk())
                .await
                .expect("a frame or the end within 30 s")
                .expect("read the stream")?;
            self.buffer.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
        }
    }

    /// Every frame until the server closes the stream.
    async fn rest(&mut self) -> Vec<Frame> {
        let mut frames = Vec::new();
        while let Some(frame) = self.next().await {
            frames.push(frame);
        }
        frames
    }
}

fn kinds(frames: &[Frame]) -> Vec<&str> {
    frames.iter().filter(|f| f.event == "job_event").map(|f| f.data["kind"].as_str().unwrap_or_default()).collect()
}

/// An app with its control loop, team `ml` with 8 reserved H100s, a member token of it and
/// the address it listens on.
async fn platform() -> (TestApp, String, String) {
    let app = TestApp::spawn().await;
    start_control(&app).await;
    wait_for_inventory(&app).await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100-80gb", 8, 0).await;
    let (_, token) = app.api_token(&admin, "ml", "member").await;
    let base = format!("http://{}", app.listen().await);
    (app, token, base)
}

fn job_body(runtime_seconds: u32) -> Value {
    json!({"name": "train", "gpu_class": "h100-80gb", "gpus_per_replica": 1, "image": "x",
           "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": runtime_seconds.to_string()}})
}

#[tokio::test]
async fn a_follower_gets_each_event_as_it_happens_and_last_the_job_once_it_has_ended() {
    let (app, token, base) = platform().await;
    // 20 simulated seconds at 10x: the stream is open long before the job ends.
    let id = submit(&app, &token, "ml", job_body(20)).await;
    let mut stream = Stream::open(&base, &token, &id, "", None).await;
    let frames = stream.rest().await;
    assert_eq!(kinds(&frames), ["submitted", "admitted", "dispatched", "running", "succeeded"], "{frames:#?}");
    let ids: Vec<i64> = frames.iter().filter_map(|f| f.id.as_deref()?.parse().ok()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");
    assert_eq!(ids, frames[..5].iter().map(|f| f.data["id"].as_i64().unwrap()).collect::<Vec<_>>());
    let end = frames.last().unwrap();
    assert_eq!(end.event, "end", "the job comes last: {frames:#?}");
    assert_eq!((end.data["id"].as_str(), end.data["state"].as_str()), (Some(id.as_str()), Some("succeeded")));
    assert_eq!(end.data["exit_code"], 0);
    // The same timeline as the plain read.
    let r = app.send(call("GET", &format!("/api/v1/jobs/{id}/events")).token(&token)).await;
    let listed: Vec<Value> = r.json().as_array().unwrap().clone();
    let streamed: Vec<Value> = frames.iter().filter(|f| f.event == "job_event").map(|f| f.data.clone()).collect();
    assert_eq!(streamed, listed);
}

#[tokio::test]
async fn a_follower_that_reconnects_with_its_last_event_id_gets_only_what_came_after() {
    let (app, token, base) = platform().await;
    let id = submit(&app, &token, "ml", job_body(1)).await;
    let all = Stream::open(&base, &token, &id, "", None).await.rest().await;
    assert_eq!(kinds(&all).len(), 5, "{all:#?}");
    let second = all[1].id.clone().unwrap();
    // As a browser reconnects: the header, with the URL it first opened.
    let resumed = Stream::open(&base, &token, &id, "", Some(&second)).await.rest().await;
    assert_eq!(kinds(&resumed), ["dispatched", "running", "succeeded"]);
    assert_eq!(resumed.last().unwrap().event, "end");
    // As a client reconnects: the query; the later of the two counts.
    let third = all[2].id.clone().unwrap();
    let resumed = Stream::open(&base, &token, &id, &format!("?after={third}"), Some(&second)).await.rest().await;
    assert_eq!(kinds(&resumed), ["running", "succeeded"]);
}

#[tokio::test]
async fn another_teams_token_cannot_follow_a_job_and_a_bad_last_event_id_is_named() {
    let (app, token, _) = platform().await;
    let admin = app.admin().await;
    app.team(&admin, "vision", None).await;
    let (_, other) = app.api_token(&admin, "vision", "member").await;
    let id = submit(&app, &token, "ml", job_body(1)).await;
    let path = format!("/api/v1/jobs/{id}/events:stream");
    app.send(call("GET", &path).token(&other)).await.assert_problem(404, "not_found");
    let problem = app
        .send(call("GET", &path).token(&token).header("last-event-id", "yesterday"))
        .await
        .assert_problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["field"], "Last-Event-ID", "{problem:#}");
    let problem =
        app.send(call("GET", &format!("{path}?after=-1")).token(&token)).await.assert_problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["field"], "after", "{problem:#}");
}

#[tokio::test]
async fn open_streams_end_when_the_server_drains_so_shutdown_is_not_held_by_them() {
    let (app, token, base) = platform().await;
    let id = submit(&app, &token, "ml", job_body(3000)).await;
    let mut stream = Stream::open(&base, &token, &id, "", None).await;
    assert_eq!(stream.next().await.map(|f| f.data["kind"].clone()), Some(json!("submitted")));
    app.state.feed.close();
    let rest = stream.rest().await;
    assert!(rest.iter().all(|f| f.event == "job_event"), "no end frame: the job still runs: {rest:#?}");
    let r = app.send(call("POST", &format!("/api/v1/jobs/{id}/cancel")).token(&token)).await;
    r.assert_status(200);
}

#[tokio::test]
async fn a_teams_stream_carries_its_jobs_events_as_they_happen_and_nothing_of_another_team() {
    let (app, token, base) = platform().await;
    let admin = app.admin().await;
    app.team(&admin, "vision", None).await;
    app.quota(&admin, "vision", "h100-80gb", 8, 0).await;
    let (_, other) = app.api_token(&admin, "vision", "member").await;
    app.send(call("GET", "/api/v1/teams/ml/events:stream").token(&other)).await.assert_problem(404, "not_found");
    // Opened before either job exists: it carries what is written from now on.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let response =
        http.get(format!("{base}/api/v1/teams/ml/events:stream")).bearer_auth(&token).send().await.expect("open");
    assert_eq!(response.status(), 200);
    let mut stream = Stream { response, buffer: String::new() };
    let theirs = submit(&app, &other, "vision", job_body(1)).await;
    let ours = submit(&app, &token, "ml", job_body(1)).await;
    let mut frames = Vec::new();
    while !frames.iter().any(|f: &Frame| f.data["kind"] == "succeeded") {
        frames.push(stream.next().await.expect("the team's stream stays open"));
    }
    assert!(
        frames.iter().all(|f| f.data["job"] == ours.as_str()),
        "only team ml's job ({ours}, not {theirs}): {frames:#?}"
    );
    assert_eq!(kinds(&frames), ["submitted", "admitted", "dispatched", "running", "succeeded"], "{frames:#?}");
}
