//! Job arrays end to end: many tasks of one spec through the real control loop on the
//! simulated cluster, each told its index; a failed task retried on its own; parallelism
//! holding tasks back; cancelling one task or the whole array; what a submission may say,
//! and who may see an array.

use std::time::Duration;

use fairway_tests::{call, TestApp};
use serde_json::{json, Value};

use crate::lifecycle::{events, job, kinds, start_control, wait_for_inventory};

const WITHIN: Duration = Duration::from_secs(180);

/// A platform with the simulated cluster and team `ml` with `gpus` H100 reserved; a member's
/// token.
async fn platform(app: &TestApp, gpus: i64) -> String {
    start_control(app).await;
    wait_for_inventory(app).await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100-80gb", gpus, 0).await;
    app.api_token(&admin, "ml", "member").await.1
}

/// An array of `count` one-GPU tasks of `seconds` simulated time each.
fn array(count: i64, parallelism: Option<i64>, seconds: u32, env: Value) -> Value {
    let mut env = env;
    env["FAIRWAY_SIM_RUNTIME_SECONDS"] = json!(seconds.to_string());
    env["FAIRWAY_SIM_LOG_EVERY_SECONDS"] = json!("0");
    let mut body = json!({"count": count,
                          "task": {"name": "sweep", "gpu_class": "h100-80gb", "image": "ghcr.io/acme/sweep:1",
                                   "max_retries": 1, "env": env}});
    if let Some(p) = parallelism {
        body["parallelism"] = json!(p);
    }
    body
}

async fn submit_array(app: &TestApp, token: &str, body: Value) -> Value {
    let r = app.send(call("POST", "/api/v1/teams/ml/arrays").token(token).json(&body)).await;
    r.assert_status(201);
    r.json()
}

async fn read_array(app: &TestApp, token: &str, id: &str) -> Value {
    let r = app.send(call("GET", &format!("/api/v1/teams/ml/arrays/{id}")).token(token)).await;
    r.assert_status(200);
    r.json()
}

/// Polls the array until `done` holds, checking `each` on every read on the way.
async fn wait_array(
    app: &TestApp,
    token: &str,
    id: &str,
    done: impl Fn(&Value) -> bool,
    mut each: impl FnMut(&Value),
) -> Value {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let a = read_array(app, token, id).await;
        each(&a);
        if done(&a) {
            return a;
        }
        assert!(tokio::time::Instant::now() < deadline, "array {id} did not get there in time: {a:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every task of the array, in index order, read through the paged task list.
async fn tasks(app: &TestApp, token: &str, id: &str, query: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("/api/v1/teams/ml/arrays/{id}/tasks?limit=200{query}");
        if let Some(c) = &cursor {
            url.push_str(&format!("&cursor={c}"));
        }
        let r = app.send(call("GET", &url).token(token)).await;
        r.assert_status(200);
        let page = r.json();
        out.extend(page["items"].as_array().cloned().unwrap_or_default());
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return out,
        }
    }
}

fn counts(a: &Value, state: &str) -> i64 {
    a["counts"][state].as_i64().unwrap_or_else(|| panic!("no count {state}: {a:#}"))
}

#[tokio::test]
async fn an_array_of_a_thousand_tasks_runs_every_index_retries_its_one_failed_task_and_counts_them() {
    let app = TestApp::spawn().await;
    let ml = platform(&app, 64).await;
    let submitted = submit_array(&app, &ml, array(1000, None, 1, json!({"FAIRWAY_SIM_FAIL_TASKS": "417"}))).await;
    assert_eq!((submitted["count"].as_i64(), submitted["state"].as_str()), (Some(1000), Some("pending")));
    assert_eq!(submitted["counts"]["pending"], 1000, "{submitted:#}");
    let id = submitted["id"].as_str().expect("id").to_owned();
    let done = wait_array(&app, &ml, &id, |a| a["state"] != "pending" && a["state"] != "running", |_| {}).await;
    assert_eq!(done["state"], "succeeded", "{done:#}");
    assert_eq!((counts(&done, "succeeded"), counts(&done, "failed"), counts(&done, "pending")), (1000, 0, 0));

    let all = tasks(&app, &ml, &id, "").await;
    let indices: Vec<i64> = all.iter().map(|t| t["array"]["index"].as_i64().expect("index")).collect();
    assert_eq!(indices, (0..1000).collect::<Vec<_>>(), "the task list is every index in order");
    assert!(all.iter().all(|t| t["array"]["id"] == id.as_str() && t["array"]["count"] == 1000));
    // Task 417's first attempt failed, and it alone ran again.
    let retried: Vec<i64> =
        all.iter().filter(|t| t["attempt"] != 1).map(|t| t["array"]["index"].as_i64().unwrap()).collect();
    assert_eq!(retried, [417], "only the failed task runs twice");
    let task = all.iter().find(|t| t["array"]["index"] == 417).unwrap();
    let timeline = events(&app, &ml, task["id"].as_str().unwrap()).await;
    let requeued = timeline.iter().find(|e| e["kind"] == "requeued").unwrap_or_else(|| panic!("{timeline:#?}"));
    let message = requeued["message"].as_str().unwrap_or_default();
    assert!(message.contains("retry 1 of 1"), "{message}");
    assert_eq!(kinds(&timeline).last().map(String::as_str), Some("succeeded"));
    assert_eq!(job(&app, &ml, task["id"].as_str().unwrap()).await["state"], "succeeded");

    // Each run was told its own task's index: every task's kept log says so, on every
    // attempt (the failed task twice), and no task's log names another index.
    let told: Vec<(i32, i32, String)> = sqlx::query_as(
        "select j.array_index, l.attempt, l.line from job_logs l join jobs j on j.id = l.job_id
         where l.line like '%array task %'",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(told.len(), 1001, "one line per run: 1,000 tasks and one retry");
    for (index, _, line) in &told {
        assert_eq!(line, &format!("[rank 0] array task {index} of 1000"));
    }
    let runs_of_417: Vec<i32> = told.iter().filter(|(i, _, _)| *i == 417).map(|(_, a, _)| *a).collect();
    assert_eq!(runs_of_417.len(), 2, "{runs_of_417:?}");
}

#[tokio::test]
async fn parallelism_keeps_at_most_that_many_tasks_under_way_releasing_the_lowest_index_first() {
    let app = TestApp::spawn().await;
    let ml = platform(&app, 16).await;
    let submitted = submit_array(&app, &ml, array(6, Some(2), 20, json!({}))).await;
    let id = submitted["id"].as_str().unwrap().to_owned();
    assert_eq!((submitted["parallelism"].as_i64(), counts(&submitted, "held")), (Some(2), 4), "{submitted:#}");
    let held = tasks(&app, &ml, &id, "").await;
    let waiting = &held[5];
    assert_eq!(waiting["pending"]["reason"], "array_task_limit", "{waiting:#}");
    let message = waiting["pending"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("at most 2 of its 6 tasks"), "{message}");
    let mut most = 0;
    let done = wait_array(
        &app,
        &ml,
        &id,
        |a| a["state"] == "succeeded",
        |a| {
            let under_way = counts(a, "admitted") + counts(a, "running") + counts(a, "stopping");
            let released = counts(a, "pending") - counts(a, "held");
            most = most.max(under_way + released);
            assert!(under_way + released <= 2, "more than 2 tasks under way or queued: {a:#}");
        },
    )
    .await;
    assert_eq!(counts(&done, "succeeded"), 6);
    assert_eq!(most, 2, "the array used its parallelism");
    // Released lowest index first: no task started before a lower-indexed one.
    let all = tasks(&app, &ml, &id, "").await;
    let started: Vec<chrono::DateTime<chrono::Utc>> =
        all.iter().map(|t| t["started_at"].as_str().and_then(|s| s.parse().ok()).expect("started")).collect();
    let finished: Vec<chrono::DateTime<chrono::Utc>> =
        all.iter().map(|t| t["finished_at"].as_str().and_then(|s| s.parse().ok()).expect("finished")).collect();
    assert!(
        started[2] >= finished[0].min(finished[1]),
        "task 2 started before a slot was free: {started:?} {finished:?}"
    );
    assert!(started.windows(2).all(|w| w[0] <= w[1] + chrono::Duration::seconds(1)), "{started:?}");
    let timeline = kinds(&events(&app, &ml, all[5]["id"].as_str().unwrap()).await);
    assert_eq!(&timeline[..2], ["submitted", "released"], "{timeline:?}");
}

#[tokio::test]
async fn one_task_can_be_cancelled_alone_and_cancelling_the_array_stops_the_rest() {
    let app = TestApp::spawn().await;
    let ml = platform(&app, 16).await;
    let submitted = submit_array(&app, &ml, array(5, Some(2), 3600, json!({}))).await;
    let id = submitted["id"].as_str().unwrap().to_owned();
    wait_array(&app, &ml, &id, |a| counts(a, "running") == 2, |_| {}).await;
    let all = tasks(&app, &ml, &id, "").await;
    // Task 3 is held; cancelled alone, it ends and the others are untouched.
    let three = all[3]["id"].as_str().unwrap();
    app.send(call("POST", &format!("/api/v1/jobs/{three}/cancel")).token(&ml)).await.assert_status(200);
    let a = read_array(&app, &ml, &id).await;
    assert_eq!((counts(&a, "cancelled"), counts(&a, "running"), counts(&a, "held")), (1, 2, 2), "{a:#}");
    let r = app.send(call("POST", &format!("/api/v1/teams/ml/arrays/{id}/cancel")).token(&ml)).await;
    r.assert_status(200);
    let answer = r.json();
    assert_eq!(answer["done"], json!({"cancelled": 2, "stopping": 2}), "{answer:#}");
    let ended = wait_array(&app, &ml, &id, |a| a["state"] == "cancelled", |_| {}).await;
    assert_eq!((counts(&ended, "cancelled"), counts(&ended, "stopping"), counts(&ended, "held")), (5, 0, 0));
    let stopped = events(&app, &ml, all[0]["id"].as_str().unwrap()).await;
    assert!(
        stopped.iter().any(|e| e["kind"] == "cancel_requested"
            && e["message"].as_str().is_some_and(|m| m.contains("cancel of its array"))),
        "{stopped:#?}"
    );
    // Cancelling an array that has ended changes nothing.
    let again = app.send(call("POST", &format!("/api/v1/teams/ml/arrays/{id}/cancel")).token(&ml)).await;
    again.assert_status(200);
    assert_eq!(again.json()["done"], json!({"cancelled": 0, "stopping": 0}));
}

#[tokio::test]
async fn an_array_that_is_malformed_or_could_never_run_is_refused_naming_the_field_and_stores_nothing() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.gpu_class(&admin, "h100-80gb").await;
    app.quota(&admin, "ml", "h100-80gb", 8, 0).await;
    let ml = app.api_token(&admin, "ml", "member").await.1;
    let refused = |body: Value, field: &'static str, code: &'static str| {
        let app = &app;
        let ml = ml.clone();
        async move {
            let r = app.send(call("POST", "/api/v1/teams/ml/arrays").token(&ml).json(&body)).await;
            r.assert_status(422);
            let problem = r.json();
            let errors = problem["errors"].as_array().cloned().unwrap_or_default();
            assert!(
                errors.iter().any(|e| e["field"] == field && e["code"] == code),
                "expected {field} {code}: {problem:#}"
            );
        }
    };
    refused(array(0, None, 1, json!({})), "count", "too_small").await;
    refused(array(10_001, None, 1, json!({})), "count", "too_large").await;
    refused(array(10, Some(11), 1, json!({})), "parallelism", "too_large").await;
    let mut unknown_class = array(10, None, 1, json!({}));
    unknown_class["task"]["gpu_class"] = json!("tpu-v5");
    refused(unknown_class, "task.gpu_class", "not_found").await;
    let mut too_big = array(10, None, 1, json!({}));
    too_big["task"]["replicas"] = json!(2);
    too_big["task"]["gpus_per_replica"] = json!(8);
    refused(too_big, "task.replicas", "exceeds_quota").await;
    let mut typo = array(10, None, 1, json!({}));
    typo["paralelism"] = json!(2);
    let r = app.send(call("POST", "/api/v1/teams/ml/arrays").token(&ml).json(&typo)).await;
    r.assert_status(422);
    let r = app.send(call("GET", "/api/v1/teams/ml/arrays").token(&ml)).await;
    r.assert_status(200);
    assert_eq!(r.json()["items"], json!([]), "nothing was stored");
    let jobs: i64 = sqlx::query_scalar("select count(*) from jobs").fetch_one(&app.pool).await.unwrap();
    assert_eq!(jobs, 0);
}

#[tokio::test]
async fn another_team_can_neither_see_nor_cancel_an_array_and_its_tasks_read_as_jobs_of_their_array() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.team(&admin, "vision", None).await;
    app.gpu_class(&admin, "h100-80gb").await;
    app.quota(&admin, "ml", "h100-80gb", 8, 0).await;
    let ml = app.api_token(&admin, "ml", "member").await.1;
    let vision = app.api_token(&admin, "vision", "member").await.1;
    let submitted = submit_array(&app, &ml, array(3, Some(1), 1, json!({}))).await;
    let id = submitted["id"].as_str().unwrap().to_owned();
    for (method, path) in [
        ("GET", format!("/api/v1/teams/vision/arrays/{id}")),
        ("GET", format!("/api/v1/teams/vision/arrays/{id}/tasks")),
        ("POST", format!("/api/v1/teams/vision/arrays/{id}/cancel")),
    ] {
        let r = app.send(call(method, &path).token(&vision)).await;
        r.assert_status(404);
    }
    let r = app.send(call("GET", &format!("/api/v1/teams/ml/arrays/{id}")).token(&vision)).await;
    r.assert_status(404);
    let r = app.send(call("GET", "/api/v1/teams/vision/arrays").token(&vision)).await;
    assert_eq!(r.json()["items"], json!([]));
    // Nothing was cancelled by those attempts.
    assert_eq!(counts(&read_array(&app, &ml, &id).await, "cancelled"), 0);
    // A task is a job of its team, naming its array.
    let first = tasks(&app, &ml, &id, "").await;
    let task = job(&app, &ml, first[0]["id"].as_str().unwrap()).await;
    assert_eq!(task["array"], json!({"id": id, "index": 0, "count": 3}));
    assert_eq!(task["name"], "sweep");
    let r = app.send(call("GET", &format!("/api/v1/jobs/{}", first[0]["id"].as_str().unwrap())).token(&vision)).await;
    r.assert_status(404);
    // A task run again is a job of its own, told the same index.
    let r =
        app.send(call("POST", &format!("/api/v1/jobs/{}/rerun", first[1]["id"].as_str().unwrap())).token(&ml)).await;
    r.assert_status(201);
    let again = r.json();
    assert_eq!(again["array"], Value::Null, "the array keeps its own task 1: {again:#}");
    assert_eq!(
        (again["env"]["FAIRWAY_ARRAY_TASK_ID"].as_str(), again["env"]["JOB_COMPLETION_INDEX"].as_str()),
        (Some("1"), Some("1")),
        "{again:#}"
    );
    assert_eq!(again["env"]["FAIRWAY_ARRAY_ID"], id.as_str());
    // The list pages in index order.
    let r = app.send(call("GET", &format!("/api/v1/teams/ml/arrays/{id}/tasks?limit=2")).token(&ml)).await;
    let page = r.json();
    let cursor = page["next_cursor"].as_str().expect("a second page").to_owned();
    let next =
        app.send(call("GET", &format!("/api/v1/teams/ml/arrays/{id}/tasks?limit=2&cursor={cursor}")).token(&ml)).await;
    let indices: Vec<i64> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .chain(next.json()["items"].as_array().unwrap())
        .map(|t| t["array"]["index"].as_i64().unwrap())
        .collect();
    assert_eq!(indices, [0, 1, 2]);
}

#[tokio::test]
async fn an_array_waiting_for_a_job_starts_after_it_and_its_held_tasks_keep_saying_they_are_held() {
    let app = TestApp::spawn().await;
    let ml = platform(&app, 16).await;
    let prep = crate::lifecycle::submit(
        &app,
        &ml,
        "ml",
        json!({"name": "prep", "gpu_class": "h100-80gb", "image": "ghcr.io/acme/prep:1",
               "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "20"}}),
    )
    .await;
    let mut body = array(3, Some(1), 600, json!({}));
    body["task"]["depends_on"] = json!([{"job": prep, "after": "succeeded"}]);
    let id = submit_array(&app, &ml, body).await["id"].as_str().unwrap().to_owned();
    // While prep runs, task 0 waits for it and the others for their turn.
    let reasons = |tasks: &[Value]| -> Vec<String> {
        tasks.iter().map(|t| t["pending"]["reason"].as_str().unwrap_or("none").to_owned()).collect()
    };
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let all = tasks(&app, &ml, &id, "").await;
        if reasons(&all) == ["waiting_for_dependencies", "array_task_limit", "array_task_limit"] {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{:?}", reasons(&all));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Once prep succeeded task 0 runs, and the held tasks still say why they wait.
    let running = wait_array(&app, &ml, &id, |a| counts(a, "running") == 1, |_| {}).await;
    assert_eq!(counts(&running, "held"), 2, "{running:#}");
    let all = tasks(&app, &ml, &id, "").await;
    assert_eq!(&reasons(&all)[1..], ["array_task_limit", "array_task_limit"], "{all:#?}");
    assert!(all[1]["pending"]["message"].as_str().unwrap_or_default().contains("at most 1 of its 3 tasks"));
    let prep = job(&app, &ml, &prep).await;
    let started: chrono::DateTime<chrono::Utc> = all[0]["started_at"].as_str().unwrap().parse().unwrap();
    let ended: chrono::DateTime<chrono::Utc> = prep["finished_at"].as_str().unwrap().parse().unwrap();
    assert!(started >= ended, "task 0 started before prep ended");
    app.send(call("POST", &format!("/api/v1/teams/ml/arrays/{id}/cancel")).token(&ml)).await.assert_status(200);
}

#[tokio::test]
async fn an_array_that_together_exceeds_a_hard_budget_is_accepted_with_a_warning_naming_the_whole() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.gpu_class(&admin, "h100-80gb").await;
    app.quota(&admin, "ml", "h100-80gb", 8, 0).await;
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    app.send(
        call("PUT", &format!("/api/v1/teams/ml/budgets/{month}"))
            .token(&admin)
            .json(&json!({"unit": "gpu-hours", "amount": 10, "enforcement": "hard"})),
    )
    .await
    .assert_status(200);
    let ml = app.api_token(&admin, "ml", "member").await.1;
    // Each task may use one GPU-hour, so each fits the budget; twenty together do not.
    let mut body = array(20, Some(4), 1, json!({}));
    body["task"]["max_runtime_seconds"] = json!(3600);
    let submitted = submit_array(&app, &ml, body).await;
    let warnings = submitted["warnings"].as_array().cloned().unwrap_or_default();
    let warning =
        warnings.iter().find(|w| w["code"] == "array_exceeds_budget").unwrap_or_else(|| panic!("{submitted:#}"));
    assert_eq!(warning["field"], "count");
    let message = warning["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("its 20 tasks together may use up to 20.00 GPU-hours"), "{message}");
    assert!(message.contains("tasks run until the budget holds the rest back"), "{message}");
    // One task alone is no warning of the array's.
    let mut one = array(1, None, 1, json!({}));
    one["task"]["max_runtime_seconds"] = json!(3600);
    let single = submit_array(&app, &ml, one).await;
    assert!(single.get("warnings").is_none(), "{single:#}");
}
