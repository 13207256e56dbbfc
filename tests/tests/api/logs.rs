//! Jobs' logs end to end on the simulated cluster: the control loop's collector reads what
//! each replica wrote while it runs and its last lines before its end is recorded, keeps the
//! tail after the backend object is gone, and `GET /jobs/{job}/logs` serves it, per replica
//! and attempt, followed or not, to the job's team only.

use std::time::Duration;

use fairway_tests::{call, TestApp};
use serde_json::{json, Value};

use crate::lifecycle::{submit, wait_for, wait_for_inventory};

/// An app whose control loop reads logs every 100 ms and keeps `tail_lines` per replica,
/// the simulated cluster at 10×; team `ml` with 16 reserved H100s and a member token.
async fn platform(tail_lines: u32) -> (TestApp, String) {
    platform_reading_every(tail_lines, Duration::from_millis(100)).await
}

/// As [`platform`], the collector reading running attempts' logs every `log_interval`.
async fn platform_reading_every(tail_lines: u32, log_interval: Duration) -> (TestApp, String) {
    let app = TestApp::spawn().await;
    crate::lifecycle::start_control_tuned(&app, |c| {
        c.log_interval = log_interval;
        c.log_tail_lines = tail_lines;
    })
    .await;
    wait_for_inventory(&app).await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100-80gb", 16, 0).await;
    let (_, token) = app.api_token(&admin, "ml", "member").await;
    (app, token)
}

/// A job of `replicas` × 1 H100 running `seconds` of simulated time, a progress line every
/// simulated second, then exiting with `exit_code`.
fn job(replicas: u32, seconds: u32, exit_code: i32) -> Value {
    json!({"name": "train", "gpu_class": "h100-80gb", "gpus_per_replica": 1, "replicas": replicas, "image": "x",
           "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": seconds.to_string(), "FAIRWAY_SIM_EXIT_CODE": exit_code.to_string(),
                   "FAIRWAY_SIM_LOG_EVERY_SECONDS": "1", "FAIRWAY_SIM_FAIL_MESSAGE": "NCCL watchdog timeout"}})
}

async fn ended(app: &TestApp, token: &str, id: &str) -> Value {
    wait_for(app, token, id, Duration::from_secs(30), |j| j["finished_at"].is_string()).await
}

async fn log(app: &TestApp, token: &str, id: &str, query: &str) -> String {
    let r = app.send(call("GET", &format!("/api/v1/jobs/{id}/logs{query}")).token(token)).await;
    r.assert_status(200);
    assert_eq!(r.header("content-type").as_deref(), Some("text/plain; charset=utf-8"));
    String::from_utf8(r.body.clone()).expect("utf-8")
}

#[tokio::test]
async fn a_failed_jobs_whole_log_is_readable_as_soon_as_it_ended_and_after_its_object_is_gone() {
    let (app, token) = platform(5_000).await;
    let id = submit(&app, &token, "ml", job(1, 5, 3)).await;
    let job = ended(&app, &token, &id).await;
    assert_eq!((job["state"].as_str(), job["exit_code"].as_i64()), (Some("failed"), Some(3)), "{job:#}");
    // Read at once: the collector keeps an attempt's last lines before its end is recorded.
    let text = log(&app, &token, &id, "").await;
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("[rank 0/1] train attempt 1 on "), "{text}");
    assert_eq!(lines.iter().filter(|l| l.contains("] step ")).count(), 4, "a line per simulated second: {text}");
    assert_eq!(lines[lines.len() - 2..], ["RuntimeError: NCCL watchdog timeout", "[rank 0] exit code 3"], "{text}");
    // The cluster no longer has the object; the log does not depend on it.
    let objects: i64 = sqlx::query_scalar("select count(*) from sim_objects where job_id = $1::uuid")
        .bind(&id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(objects, 0, "the simulated cluster deleted the finished object");
    assert_eq!(log(&app, &token, &id, "?attempt=1").await, text);
}

#[tokio::test]
async fn a_gangs_lines_name_their_replica_and_one_replica_reads_alone_with_timestamps() {
    let (app, token) = platform(5_000).await;
    let id = submit(&app, &token, "ml", job(2, 2, 0)).await;
    assert_eq!(ended(&app, &token, &id).await["state"], "succeeded");
    let text = log(&app, &token, &id, "").await;
    assert!(text.lines().all(|l| l.starts_with("[replica 0] ") || l.starts_with("[replica 1] ")), "{text}");
    for replica in 0..2 {
        let finished = format!("[replica {replica}] [rank {replica}] finished: 20 steps");
        assert!(text.lines().any(|l| l == finished), "no {finished:?} in {text}");
    }
    let one = log(&app, &token, &id, "?replica=1&timestamps=true").await;
    assert!(!one.is_empty());
    for line in one.lines() {
        let (at, rest) = line.split_once(' ').unwrap();
        assert!(chrono::DateTime::parse_from_rfc3339(at).is_ok(), "not a timestamp: {line}");
        assert!(rest.starts_with("[rank 1"), "only replica 1, without a prefix: {line}");
    }
}

#[tokio::test]
async fn an_attempt_or_replica_the_job_lacks_is_named_and_another_teams_token_gets_404() {
    let (app, token) = platform(5_000).await;
    let admin = app.admin().await;
    app.team(&admin, "vision", None).await;
    let (_, other) = app.api_token(&admin, "vision", "member").await;
    let id = submit(&app, &token, "ml", job(2, 1, 0)).await;
    ended(&app, &token, &id).await;
    let path = format!("/api/v1/jobs/{id}/logs");
    let r = app.send(call("GET", &path).token(&other)).await;
    assert!(!String::from_utf8_lossy(&r.body).contains("rank"), "no line reaches another team");
    r.assert_problem(404, "not_found");
    for (query, field) in [("?attempt=2", "attempt"), ("?attempt=0", "attempt"), ("?replica=2", "replica")] {
        let problem = app
            .send(call("GET", &format!("{path}{query}")).token(&token))
            .await
            .assert_problem(422, "validation_failed");
        assert_eq!(problem["errors"][0]["field"], field, "{query}: {problem:#}");
    }
    let problem = app
        .send(call("GET", &format!("{path}?follow=maybe")).token(&token))
        .await
        .assert_problem(422, "validation_failed");
    assert!(problem.to_string().contains("follow"), "{problem:#}");
}

#[tokio::test]
async fn only_the_newest_lines_are_kept_and_the_log_says_how_many_were_let_go() {
    let (app, token) = platform(20).await;
    // 2 opening lines, 59 progress lines, the last: 62 lines, of which 20 are kept.
    let id = submit(&app, &token, "ml", job(1, 60, 0)).await;
    assert_eq!(ended(&app, &token, &id).await["state"], "succeeded");
    let text = log(&app, &token, &id, "").await;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 21, "{text}");
    assert_eq!(
        lines[0], "[fairway: 42 earlier lines of this attempt are not kept; the newest of each replica are]",
        "{text}"
    );
    assert!(lines[1].contains("] step 410 "), "the oldest kept line is step 410: {text}");
    assert_eq!(lines[20], "[rank 0] finished: 600 steps");
}

#[tokio::test]
async fn an_attempt_that_wrote_thousands_of_lines_unread_has_all_of_them_kept_when_it_ends() {
    // The collector never reads it while it runs: at its end, its last lines are more pages
    // than one read returns (1,000 lines), and every one is kept.
    let (app, token) = platform_reading_every(5_000, Duration::from_secs(3_600)).await;
    let chatty = json!({"name": "train", "gpu_class": "h100-80gb", "gpus_per_replica": 1, "replicas": 1, "image": "x",
                        "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "25", "FAIRWAY_SIM_LOG_EVERY_SECONDS": "0.01"}});
    let id = submit(&app, &token, "ml", chatty).await;
    assert_eq!(ended(&app, &token, &id).await["state"], "succeeded");
    let text = log(&app, &token, &id, "").await;
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("[rank 0/1] train attempt 1 on "), "the first line is kept: {}", lines[0]);
    let steps = lines.iter().filter(|l| l.contains("] step ")).count();
    assert!(steps > 2_000, "every progress line is kept, not one page of them: {steps}");
    assert!(!text.contains("earlier lines of this attempt are not kept"), "nothing was let go");
    assert!(lines.last().is_some_and(|l| l.contains("finished")), "the last line is kept: {:?}", lines.last());
}

#[tokio::test]
async fn a_followed_log_gives_lines_while_the_job_runs_and_ends_with_the_attempt() {
    let (app, token) = platform(5_000).await;
    // 40 simulated seconds at 10×: four real seconds of lines.
    let id = submit(&app, &token, "ml", job(1, 40, 0)).await;
    let base = format!("http://{}", app.listen().await);
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut response = http
        .get(format!("{base}/api/v1/jobs/{id}/logs?follow=true"))
        .bearer_auth(&token)
        .send()
        .await
        .expect("open the log");
    assert_eq!(response.status(), 200);
    let mut text = String::new();
    let mut seen_running = false;
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(30), response.chunk())
        .await
        .expect("a line or the end within 30 s")
        .expect("read the log")
    {
        text.push_str(std::str::from_utf8(&chunk).unwrap());
        if text.contains("] step ") && !seen_running {
            // Lines arrive while the job still runs, not all at its end.
            let r = app.send(call("GET", &format!("/api/v1/jobs/{id}")).token(&token)).await;
            seen_running = r.json()["state"] == "running";
        }
    }
    assert!(seen_running, "a step line arrived while the job ran: {text}");
    assert_eq!(text.lines().last(), Some("[rank 0] finished: 400 steps"), "the stream ends with the attempt");
    assert_eq!(text, log(&app, &token, &id, "").await, "following gives what a later read gives");
}

#[tokio::test]
async fn a_jobs_portal_page_shows_the_end_of_its_log_escaped() {
    let (app, token) = platform(5_000).await;
    let admin = app.admin().await;
    app.user(&admin, "alice", None).await;
    app.member(&admin, "ml", "alice", "viewer").await;
    let mut body = job(1, 3, 1);
    body["env"]["FAIRWAY_SIM_FAIL_MESSAGE"] = json!("<script>alert(1)</script>");
    let id = submit(&app, &token, "ml", body).await;
    ended(&app, &token, &id).await;
    let session = crate::portal::sign_in(&app, "alice").await;
    let page = app.send(call("GET", &format!("/jobs/{id}")).header("cookie", &session)).await;
    let html = crate::portal::body(&page);
    let log = html.split_once("<pre class=\"log\" id=\"log\">").map(|(_, rest)| rest).expect("a log section");
    let log = log.split_once("</pre>").expect("closed").0;
    assert!(log.starts_with("[rank 0/1] train attempt 1 on "), "{log}");
    assert!(log.contains("RuntimeError: &#60;script&#62;alert(1)&#60;/script&#62;"), "escaped: {log}");
    assert!(!html.contains("<script>alert(1)"), "the application's text is never markup");
    assert!(html.contains("The last 9 lines of attempt 1."), "{html}");
    // Ended: nothing more to follow, so no script.
    assert!(!html.contains("job-live.js") && !html.contains("data-live"), "{html}");
    // What the script reads is the job's team's only, as the page is.
    let r = app.send(call("GET", &format!("/jobs/{id}/log")).header("cookie", &session)).await;
    assert!(crate::portal::body(&r).contains("RuntimeError"), "a member reads the log");
    app.user(&admin, "bob", None).await;
    let outsider = crate::portal::sign_in(&app, "bob").await;
    for path in [format!("/jobs/{id}/log"), format!("/jobs/{id}/live"), format!("/jobs/{id}")] {
        let r = app.send(call("GET", &path).header("cookie", &outsider)).await;
        assert_eq!(r.status.as_u16(), 404, "{path}: {}", crate::portal::body(&r));
    }
}
