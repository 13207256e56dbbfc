//! Job dependencies (Slurm's afterok / afterany / afternotok) end to end: jobs waiting for
//! others through the real control loop on the simulated cluster, and what a submission
//! naming them may say.

use std::time::Duration;

use fairway_tests::{call, TestApp};
use serde_json::{json, Value};

use crate::lifecycle::{events, job, kinds, start_control, submit, wait_for, wait_for_inventory};

const WITHIN: Duration = Duration::from_secs(60);

/// A platform with the simulated cluster and team `ml` (16 H100 reserved); a member's token.
async fn platform(app: &TestApp) -> String {
    start_control(app).await;
    wait_for_inventory(app).await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100-80gb", 16, 0).await;
    app.api_token(&admin, "ml", "member").await.1
}

/// A one-GPU job that runs `seconds` of simulated time and exits with `exit_code`.
fn spec(name: &str, seconds: u32, exit_code: u32, depends_on: Value) -> Value {
    json!({"name": name, "gpu_class": "h100-80gb", "image": "ghcr.io/acme/pipeline:1", "depends_on": depends_on,
           "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": seconds.to_string(), "FAIRWAY_SIM_EXIT_CODE": exit_code.to_string()}})
}

fn ended(j: &Value) -> bool {
    ["succeeded", "failed", "cancelled"].contains(&j["state"].as_str().unwrap_or_default())
}

fn at(j: &Value, field: &str) -> chrono::DateTime<chrono::Utc> {
    j[field].as_str().and_then(|t| t.parse().ok()).unwrap_or_else(|| panic!("no {field}: {j:#}"))
}

#[tokio::test]
async fn a_chain_preprocess_train_evaluate_runs_in_order_and_a_waiting_job_names_what_it_waits_for() {
    let app = TestApp::spawn().await;
    let ml = platform(&app).await;
    let preprocess = submit(&app, &ml, "ml", spec("preprocess", 30, 0, json!([]))).await;
    let train = submit(&app, &ml, "ml", spec("train", 10, 0, json!([{"job": preprocess, "after": "succeeded"}]))).await;
    let evaluate =
        submit(&app, &ml, "ml", spec("evaluate", 10, 0, json!([{"job": train, "after": "succeeded"}]))).await;
    // While preprocess runs, train waits, saying for which job and in which state.
    let waiting = wait_for(&app, &ml, &train, WITHIN, |j| {
        j["pending"]["message"].as_str().is_some_and(|m| m.ends_with("running"))
            && j["depends_on"][0]["state"] == "running"
    })
    .await;
    assert_eq!(
        (waiting["state"].as_str(), waiting["pending"]["reason"].as_str()),
        (Some("pending"), Some("waiting_for_dependencies"))
    );
    assert_eq!(
        waiting["depends_on"],
        json!([{"job": preprocess, "name": "preprocess", "after": "succeeded", "state": "running"}])
    );
    let message = waiting["pending"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(&format!("job preprocess ({preprocess}), running")), "{message}");
    assert_eq!(waiting["pending"]["figures"]["waiting_for"][0]["job"], preprocess.as_str(), "{waiting:#}");
    let last = wait_for(&app, &ml, &evaluate, WITHIN, ended).await;
    assert_eq!(last["state"], "succeeded", "{last:#}");
    let (first, middle) = (job(&app, &ml, &preprocess).await, job(&app, &ml, &train).await);
    assert_eq!((first["state"].as_str(), middle["state"].as_str()), (Some("succeeded"), Some("succeeded")));
    assert!(at(&middle, "started_at") >= at(&first, "finished_at"), "train started before preprocess ended");
    assert!(at(&last, "started_at") >= at(&middle, "finished_at"), "evaluate started before train ended");
    let timeline = kinds(&events(&app, &ml, &train).await);
    assert_eq!(&timeline[..3], ["submitted", "waiting", "released"], "{timeline:?}");
}

#[tokio::test]
async fn a_failed_dependency_cancels_its_dependents_down_the_chain_and_runs_the_job_waiting_for_the_failure() {
    let app = TestApp::spawn().await;
    let ml = platform(&app).await;
    let preprocess = submit(&app, &ml, "ml", spec("preprocess", 5, 1, json!([]))).await;
    let train = submit(&app, &ml, "ml", spec("train", 5, 0, json!([{"job": preprocess, "after": "succeeded"}]))).await;
    let evaluate = submit(&app, &ml, "ml", spec("evaluate", 5, 0, json!([{"job": train, "after": "succeeded"}]))).await;
    let report = submit(&app, &ml, "ml", spec("report", 5, 0, json!([{"job": train, "after": "finished"}]))).await;
    let alert = submit(&app, &ml, "ml", spec("alert", 5, 0, json!([{"job": preprocess, "after": "failed"}]))).await;
    let alert = wait_for(&app, &ml, &alert, WITHIN, ended).await;
    assert_eq!(alert["state"], "succeeded", "after failed runs when the dependency failed: {alert:#}");
    let train_done = wait_for(&app, &ml, &train, WITHIN, ended).await;
    assert_eq!(train_done["state"], "cancelled", "{train_done:#}");
    assert_eq!(train_done["started_at"], Value::Null, "train never ran");
    let timeline = events(&app, &ml, &train).await;
    let cancelled = timeline.iter().find(|e| e["kind"] == "cancelled").expect("a cancelled event");
    assert_eq!(cancelled["reason"], "dependency_failed");
    assert_eq!(cancelled["data"]["dependency"], preprocess.as_str());
    let message = cancelled["message"].as_str().unwrap_or_default();
    assert!(message.contains(&format!("job preprocess ({preprocess}) ended failed")), "{message}");
    // The cancel cascades: evaluate waited for train to succeed, which it never will.
    let evaluated = wait_for(&app, &ml, &evaluate, WITHIN, ended).await;
    assert_eq!(evaluated["state"], "cancelled", "{evaluated:#}");
    let cascaded = events(&app, &ml, &evaluate).await;
    let cancelled = cascaded.iter().find(|e| e["kind"] == "cancelled").expect("a cancelled event");
    assert_eq!(cancelled["data"]["dependency"], train.as_str(), "{cancelled:#}");
    // A job waiting for train to finish in any state runs: cancelled is finished.
    let report = wait_for(&app, &ml, &report, WITHIN, ended).await;
    assert_eq!(report["state"], "succeeded", "{report:#}");
}

#[tokio::test]
async fn a_job_waiting_for_a_failure_is_cancelled_when_its_dependency_succeeds() {
    let app = TestApp::spawn().await;
    let ml = platform(&app).await;
    let train = submit(&app, &ml, "ml", spec("train", 5, 0, json!([]))).await;
    let cleanup = submit(&app, &ml, "ml", spec("cleanup", 5, 0, json!([{"job": train, "after": "failed"}]))).await;
    let cleanup = wait_for(&app, &ml, &cleanup, WITHIN, ended).await;
    assert_eq!(cleanup["state"], "cancelled", "{cleanup:#}");
    assert_eq!(job(&app, &ml, &train).await["state"], "succeeded");
}

#[tokio::test]
async fn with_keep_a_job_whose_dependency_failed_stays_pending_saying_so() {
    let app = TestApp::spawn().await;
    let ml = platform(&app).await;
    // Waits long enough to be cancelled before it runs.
    let mut first = spec("preprocess", 5, 0, json!([]));
    first["gpu_class"] = json!("h100-80gb");
    first["replicas"] = json!(3);
    first["gpus_per_replica"] = json!(8);
    first["wait_for_quota"] = json!(true);
    let preprocess = submit(&app, &ml, "ml", first).await;
    let mut body = spec("train", 5, 0, json!([{"job": preprocess, "after": "succeeded"}]));
    body["if_dependency_fails"] = json!("keep");
    let train = submit(&app, &ml, "ml", body).await;
    app.send(call("POST", &format!("/api/v1/jobs/{preprocess}/cancel")).token(&ml)).await.assert_status(200);
    let kept = wait_for(&app, &ml, &train, WITHIN, |j| j["pending"]["reason"] == "dependency_failed").await;
    assert_eq!(kept["state"], "pending");
    assert_eq!(kept["if_dependency_fails"], "keep");
    let message = kept["pending"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("ended cancelled") && message.contains("kept pending"), "{message}");
    assert_eq!(kept["depends_on"][0]["state"], "cancelled");
    // The pending reasons gauge counts it under its reason, cycle after cycle, while it
    // is neither run nor cancelled.
    let gauge = "fairway_pending_jobs_by_reason{reason=\"dependency_failed\"} 1";
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let metrics = crate::portal::body(&app.send(call("GET", "/metrics")).await);
        if metrics.contains(gauge) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no {gauge} in {metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(job(&app, &ml, &train).await["state"], "pending");
}

#[tokio::test]
async fn a_dependency_on_another_teams_job_is_refused_exactly_as_one_on_no_job() {
    let app = TestApp::spawn().await;
    let ml = platform(&app).await;
    let admin = app.admin().await;
    app.team(&admin, "vision", None).await;
    app.quota(&admin, "vision", "h100-80gb", 8, 0).await;
    let (_, vision) = app.api_token(&admin, "vision", "member").await;
    let theirs = submit(&app, &vision, "vision", spec("secret", 5, 0, json!([]))).await;
    let nobody = uuid::Uuid::new_v4().to_string();
    let mut answers = Vec::new();
    for id in [&theirs, &nobody] {
        let body = spec("train", 5, 0, json!([{"job": id, "after": "succeeded"}]));
        let r = app.send(call("POST", "/api/v1/teams/ml/jobs").token(&ml).json(&body)).await;
        let doc = r.assert_problem(422, "validation_failed");
        assert_eq!(doc["errors"][0]["field"], "depends_on[0].job", "{doc}");
        assert_eq!(doc["errors"][0]["code"], "not_found", "{doc}");
        answers.push(doc["errors"][0]["message"].as_str().unwrap_or_default().replace(id.as_str(), "ID"));
    }
    assert_eq!(answers[0], answers[1], "another tenant's job reads as no job");
}

#[tokio::test]
async fn malformed_dependencies_are_refused_with_a_422_naming_the_field() {
    let app = TestApp::spawn().await;
    let ml = platform(&app).await;
    let mine = submit(&app, &ml, "ml", spec("preprocess", 5, 0, json!([]))).await;
    let many: Vec<Value> =
        (0..33).map(|_| json!({"job": uuid::Uuid::new_v4().to_string(), "after": "finished"})).collect();
    let cases = [
        (json!([{"job": "not-a-uuid", "after": "succeeded"}]), None, "depends_on[0].job", "invalid_value"),
        (json!([{"job": mine, "after": "afterok"}]), None, "depends_on[0].after", "invalid_value"),
        (json!([{"job": mine}]), None, "depends_on[0].after", "missing_field"),
        (json!([{"job": mine, "after": "finished", "when": 1}]), None, "depends_on[0].when", "unknown_field"),
        (
            json!([{"job": mine, "after": "finished"}, {"job": mine, "after": "failed"}]),
            None,
            "depends_on[1].job",
            "duplicate",
        ),
        (Value::Array(many), None, "depends_on", "too_many"),
        (json!([{"job": mine, "after": "succeeded"}]), Some(json!("maybe")), "if_dependency_fails", "invalid_value"),
    ];
    for (depends_on, if_fails, field, code) in cases {
        let mut body = spec("train", 5, 0, depends_on);
        if let Some(v) = if_fails {
            body["if_dependency_fails"] = v;
        }
        let r = app.send(call("POST", "/api/v1/teams/ml/jobs").token(&ml).json(&body)).await;
        let doc = r.assert_problem(422, "validation_failed");
        assert_eq!(
            (doc["errors"][0]["field"].as_str(), doc["errors"][0]["code"].as_str()),
            (Some(field), Some(code)),
            "{doc}"
        );
    }
}

#[tokio::test]
async fn the_job_page_shows_the_chain_with_links_both_ways() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.gpu_class(&admin, "h100").await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100", 8, 0).await;
    let alice = app.user(&admin, "alice", None).await;
    app.member(&admin, "ml", "alice", "member").await;
    let job = |name: &str, depends_on: Value| json!({"name": name, "gpu_class": "h100", "image": "train:1", "depends_on": depends_on});
    let preprocess = submit(&app, &alice, "ml", job("preprocess", json!([]))).await;
    let r = app
        .send(
            call("POST", "/api/v1/teams/ml/jobs")
                .token(&alice)
                .json(&job("train", json!([{"job": preprocess, "after": "succeeded"}]))),
        )
        .await;
    r.assert_status(201);
    let created = r.json();
    assert_eq!(created["depends_on"][0]["job"], preprocess.as_str(), "the submission's answer names it: {created:#}");
    let train = created["id"].as_str().unwrap_or_default().to_owned();
    let session = crate::portal::sign_in(&app, "alice").await;
    let page = crate::portal::body(&app.send(call("GET", &format!("/jobs/{train}")).header("cookie", &session)).await);
    assert!(page.contains("Waits for"), "{page}");
    assert!(page.contains(&format!("<a href=\"/jobs/{preprocess}\">preprocess</a> to have succeeded")), "{page}");
    let page =
        crate::portal::body(&app.send(call("GET", &format!("/jobs/{preprocess}")).header("cookie", &session)).await);
    assert!(page.contains(&format!("<a href=\"/jobs/{train}\">train</a>, until this job has succeeded")), "{page}");
}

#[tokio::test]
async fn cancelling_a_job_that_waits_for_its_dependencies_ends_it_at_once_and_its_dependents_follow() {
    let app = TestApp::spawn().await;
    let ml = platform(&app).await;
    let mut first = spec("preprocess", 5, 0, json!([]));
    first["replicas"] = json!(3);
    first["gpus_per_replica"] = json!(8);
    first["wait_for_quota"] = json!(true);
    let preprocess = submit(&app, &ml, "ml", first).await;
    let train = submit(&app, &ml, "ml", spec("train", 5, 0, json!([{"job": preprocess, "after": "succeeded"}]))).await;
    let evaluate = submit(&app, &ml, "ml", spec("evaluate", 5, 0, json!([{"job": train, "after": "succeeded"}]))).await;
    wait_for(&app, &ml, &train, WITHIN, |j| j["pending"]["reason"] == "waiting_for_dependencies").await;
    let r = app.send(call("POST", &format!("/api/v1/jobs/{train}/cancel")).token(&ml)).await;
    r.assert_status(200);
    assert_eq!(r.json()["state"], "cancelled");
    let evaluated = wait_for(&app, &ml, &evaluate, WITHIN, ended).await;
    assert_eq!(evaluated["state"], "cancelled", "{evaluated:#}");
    let timeline = events(&app, &ml, &evaluate).await;
    let cancelled = timeline.iter().find(|e| e["kind"] == "cancelled").expect("a cancelled event");
    assert_eq!(
        (cancelled["reason"].as_str(), cancelled["data"]["dependency"].as_str()),
        (Some("dependency_failed"), Some(train.as_str()))
    );
    assert_eq!(job(&app, &ml, &preprocess).await["state"], "pending", "the job depended on is left as it was");
}

#[tokio::test]
async fn a_rerun_waits_for_what_the_job_waited_for_and_the_job_list_shows_each_jobs_dependencies() {
    let app = TestApp::spawn().await;
    let ml = platform(&app).await;
    let preprocess = submit(&app, &ml, "ml", spec("preprocess", 5, 0, json!([]))).await;
    let mut body = spec("train", 5, 0, json!([{"job": preprocess, "after": "finished"}]));
    body["if_dependency_fails"] = json!("keep");
    let train = submit(&app, &ml, "ml", body).await;
    let r = app.send(call("GET", "/api/v1/teams/ml/jobs").token(&ml)).await;
    r.assert_status(200);
    let listed = r.json();
    let items = listed["items"].as_array().cloned().unwrap_or_default();
    let row = items.iter().find(|j| j["id"] == train.as_str()).expect("train is listed");
    assert_eq!(row["depends_on"][0]["job"], preprocess.as_str(), "{row:#}");
    assert_eq!(row["depends_on"][0]["after"], "finished");
    let first = items.iter().find(|j| j["id"] == preprocess.as_str()).expect("preprocess is listed");
    assert!(first.get("depends_on").is_none(), "a job waiting for none shows none: {first:#}");
    wait_for(&app, &ml, &train, WITHIN, ended).await;
    let r = app.send(call("POST", &format!("/api/v1/jobs/{train}/rerun")).token(&ml)).await;
    r.assert_status(201);
    let again = r.json();
    assert_eq!(
        again["depends_on"],
        json!([{"job": preprocess, "name": "preprocess", "after": "finished", "state": "succeeded"}]),
        "{again:#}"
    );
    assert_eq!(again["if_dependency_fails"], "keep");
    // Its dependency has ended as it waits for, so the leader releases it and it runs.
    let id = again["id"].as_str().unwrap().to_owned();
    let done = wait_for(&app, &ml, &id, WITHIN, ended).await;
    assert_eq!(done["state"], "succeeded", "{done:#}");
    assert!(kinds(&events(&app, &ml, &id).await).contains(&"released".to_owned()));
}

#[tokio::test]
async fn a_batch_chains_its_own_jobs_by_index_runs_them_in_order_and_a_cycle_is_refused_with_422() {
    let app = TestApp::spawn().await;
    let ml = platform(&app).await;
    let batch =
        |jobs: Value| app.send(call("POST", "/api/v1/teams/ml/jobs:batch").token(&ml).json(&json!({"jobs": jobs})));
    // A cycle: nothing is stored, and the answer names the cycle.
    let r = batch(json!([
        spec("a", 5, 0, json!([{"batch_index": 2, "after": "succeeded"}])),
        spec("b", 5, 0, json!([{"batch_index": 0, "after": "succeeded"}])),
        spec("c", 5, 0, json!([{"batch_index": 1, "after": "finished"}])),
    ]))
    .await;
    let problem = r.assert_problem(422, "validation_failed");
    let error = &problem["errors"][0];
    assert_eq!(
        (error["field"].as_str(), error["code"].as_str()),
        (Some("jobs[0].depends_on[0].batch_index"), Some("cycle"))
    );
    let message = error["message"].as_str().unwrap_or_default();
    assert!(message.contains("jobs[0] waits for jobs[2] waits for jobs[1] waits for jobs[0]"), "{message}");
    let stored: i64 = sqlx::query_scalar("select count(*) from jobs").fetch_one(&app.pool).await.unwrap();
    assert_eq!(stored, 0, "a refused batch stores nothing");
    // Out of range, itself, both ways of naming at once: each named.
    let r = batch(json!([
        spec("a", 5, 0, json!([{"batch_index": 5, "after": "succeeded"}])),
        spec("b", 5, 0, json!([{"batch_index": 1, "after": "succeeded"}])),
    ]))
    .await;
    let problem = r.assert_problem(422, "validation_failed");
    let codes: Vec<(&str, &str)> = problem["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["field"].as_str().unwrap(), e["code"].as_str().unwrap()))
        .collect();
    assert_eq!(
        codes,
        [("jobs[0].depends_on[0].batch_index", "out_of_range"), ("jobs[1].depends_on[0].batch_index", "itself")]
    );
    // A job submitted alone cannot name a batch's job.
    let r = app
        .send(call("POST", "/api/v1/teams/ml/jobs").token(&ml).json(&spec(
            "alone",
            5,
            0,
            json!([{"batch_index": 0, "after": "succeeded"}]),
        )))
        .await;
    let problem = r.assert_problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["code"], "only_in_batch", "{problem:#}");

    // The chain, listed evaluate first: it runs preprocess, then train, then evaluate.
    let r = batch(json!([
        spec("evaluate", 5, 0, json!([{"batch_index": 2, "after": "succeeded"}])),
        spec("preprocess", 10, 0, json!([])),
        spec("train", 5, 0, json!([{"batch_index": 1, "after": "succeeded"}])),
    ]))
    .await;
    r.assert_status(201);
    let ids: Vec<String> =
        r.json()["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_str().unwrap().to_owned()).collect();
    let evaluate = wait_for(&app, &ml, &ids[0], WITHIN, ended).await;
    assert_eq!(evaluate["state"], "succeeded", "{evaluate:#}");
    assert_eq!(evaluate["depends_on"][0]["job"], ids[2].as_str(), "the index became the job's id");
    let (pre, train) = (job(&app, &ml, &ids[1]).await, job(&app, &ml, &ids[2]).await);
    assert!(at(&train, "started_at") >= at(&pre, "finished_at"), "train started before preprocess ended");
    assert!(at(&evaluate, "started_at") >= at(&train, "finished_at"), "evaluate started before train ended");
}

#[tokio::test]
async fn a_rerun_of_a_job_cancelled_for_a_failed_dependency_leaves_that_dependency_out_and_says_so() {
    let app = TestApp::spawn().await;
    let ml = platform(&app).await;
    let preprocess = submit(&app, &ml, "ml", spec("preprocess", 5, 1, json!([]))).await;
    let train = submit(&app, &ml, "ml", spec("train", 5, 0, json!([{"job": preprocess, "after": "succeeded"}]))).await;
    let cancelled = wait_for(&app, &ml, &train, WITHIN, ended).await;
    assert_eq!(cancelled["state"], "cancelled", "{cancelled:#}");
    let r = app.send(call("POST", &format!("/api/v1/jobs/{train}/rerun")).token(&ml)).await;
    r.assert_status(201);
    let again = r.json();
    assert!(again.get("depends_on").is_none(), "{again:#}");
    let warning = &again["warnings"][0];
    assert_eq!(warning["code"], "dependency_dropped", "{again:#}");
    let message = warning["message"].as_str().unwrap_or_default();
    assert!(message.contains("ended failed") && message.contains("the rerun does not wait for it"), "{message}");
    let done = wait_for(&app, &ml, again["id"].as_str().unwrap(), WITHIN, ended).await;
    assert_eq!(done["state"], "succeeded", "{done:#}");
}
