//! Preemption that waits for capacity, through the real control loop on a simulated cluster
//! that follows its inventory file: a job within its preemption delay evicts no one and takes
//! a node that joins meanwhile (as an autoscaler's would); once the delay has passed with no
//! capacity, it preempts.

use std::time::Duration;

use fairway_tests::{call, TestApp};
use serde_json::{json, Value};

use crate::lifecycle::{h100_inventory, start_control_tuned, submit, wait_for, wait_for_inventory, H100_CLASS};

fn node(name: &str) -> String {
    format!("\n[[node]]\nname = \"{name}\"\ngpu_class = \"h100-80gb\"\ngpus = 8\nrack = \"r1\"\n")
}

/// One 8-GPU node, run by team research's experiment borrowing team prod's idle reserved
/// quota; returns the app, the inventory file, and prod's and research's tokens.
async fn a_borrowed_node() -> (TestApp, std::path::PathBuf, String, String) {
    let file = h100_inventory(&node("n1"));
    let app = TestApp::spawn_with(|c| c.sim_inventory = Some(file.clone())).await;
    start_control_tuned(&app, |c| {
        c.engine.min_runtime_before_preemption_ms = 0;
        // Nodes written into the file join within a fraction of a second.
        c.inventory_interval = Duration::from_millis(200);
    })
    .await;
    wait_for_inventory(&app).await;
    let admin = app.admin().await;
    for (team, reserved, burst) in [("prod", 8, 0), ("research", 0, 8)] {
        app.team(&admin, team, None).await;
        app.quota(&admin, team, "h100-80gb", reserved, burst).await;
    }
    let (_, prod) = app.api_token(&admin, "prod", "member").await;
    let (_, research) = app.api_token(&admin, "research", "member").await;
    let sweep = submit(
        &app,
        &research,
        "research",
        json!({"name": "sweep", "gpu_class": "h100-80gb", "gpus_per_replica": 8, "image": "x",
               "priority_class": "experiment", "preemption_grace_seconds": 1,
               "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "30000"}}),
    )
    .await;
    wait_for(&app, &research, &sweep, Duration::from_secs(30), |j| j["state"] == "running").await;
    (app, file, prod, research)
}

fn serving(delay_seconds: i64) -> Value {
    json!({"name": "serving-eval", "gpu_class": "h100-80gb", "gpus_per_replica": 8, "image": "x",
           "priority_class": "production", "preemption_delay_seconds": delay_seconds,
           "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "30000"}})
}

async fn the_sweep(app: &TestApp, research: &str) -> Value {
    let r = app.send(call("GET", "/api/v1/teams/research/jobs").token(research)).await;
    r.assert_status(200);
    r.json()["items"][0].clone()
}

#[tokio::test]
async fn within_its_delay_a_job_preempts_no_one_and_takes_a_node_that_joins_meanwhile() {
    let (app, file, prod, research) = a_borrowed_node().await;
    let id = submit(&app, &prod, "prod", serving(600)).await;
    // Reclaiming its reserved quota would preempt the sweep; its delay says wait for capacity.
    let waiting =
        wait_for(&app, &prod, &id, Duration::from_secs(30), |j| j["pending"]["reason"] == "preemption_delayed").await;
    let message = waiting["pending"]["message"].as_str().unwrap();
    assert!(
        message.contains("it needs 8 and 0 are free to it; preempting 1 running job would make room, but its preemption delay lets capacity come first"),
        "{message}"
    );
    let figures = &waiting["pending"]["figures"];
    assert_eq!(figures["would_preempt_jobs"], 1, "{figures:#}");
    let preempts_at = chrono::DateTime::parse_from_rfc3339(figures["preempts_at"].as_str().unwrap()).unwrap();
    // Its forecast is the delay's end at the latest, plus the sweep's grace period.
    let expected = waiting["pending"]["expected_start_at"].as_str().unwrap();
    let submitted = chrono::DateTime::parse_from_rfc3339(waiting["submitted_at"].as_str().unwrap()).unwrap();
    let expected_at = chrono::DateTime::parse_from_rfc3339(expected).unwrap();
    let wait = (expected_at - submitted).num_seconds();
    assert!((590..=660).contains(&wait), "expected to start {wait} s after submission: {waiting:#}");
    let delay = (preempts_at - submitted).num_seconds();
    assert!((599..=601).contains(&delay), "preempts {delay} s after submission: {waiting:#}");
    // A few cycles later the sweep still runs, untouched.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let sweep = the_sweep(&app, &research).await;
    assert_eq!((sweep["state"].as_str(), sweep["preemptions"].as_i64()), (Some("running"), Some(0)), "{sweep:#}");
    // A node joins (an autoscaler's): the job starts there, and no one was preempted.
    std::fs::write(&file, format!("{H100_CLASS}{}{}", node("n1"), node("n2"))).unwrap();
    let running = wait_for(&app, &prod, &id, Duration::from_secs(30), |j| j["state"] == "running").await;
    assert_eq!(running["placement"][0]["node"], "n2", "{running:#}");
    let sweep = the_sweep(&app, &research).await;
    assert_eq!((sweep["state"].as_str(), sweep["preemptions"].as_i64()), (Some("running"), Some(0)), "{sweep:#}");
}

#[tokio::test]
async fn once_its_delay_has_passed_with_no_capacity_come_the_job_preempts() {
    let (app, _file, prod, research) = a_borrowed_node().await;
    let id = submit(&app, &prod, "prod", serving(2)).await;
    let running = wait_for(&app, &prod, &id, Duration::from_secs(60), |j| j["state"] == "running").await;
    assert_eq!(running["placement"][0]["node"], "n1", "{running:#}");
    let sweep = the_sweep(&app, &research).await;
    assert_eq!(sweep["preemptions"], 1, "{sweep:#}");
    // It waited its delay first: admitted no sooner than 2 s after it was submitted.
    let at = |k: &str| chrono::DateTime::parse_from_rfc3339(running[k].as_str().unwrap()).unwrap();
    assert!((at("admitted_at") - at("submitted_at")).num_milliseconds() >= 2_000, "{running:#}");
}

#[tokio::test]
async fn a_priority_classes_preemption_delay_is_kept_shown_and_checked_and_so_is_a_jobs() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    let class = json!({"name": "interactive", "priority": 700, "preemptible": false, "usage_factor_milli": 1000,
                       "price_multiplier_milli": 1000, "preemption_delay_seconds": 180});
    let r = app.send(call("POST", "/api/v1/priority-classes").token(&admin).json(&class)).await;
    r.assert_status(201);
    assert_eq!(r.json()["preemption_delay_seconds"], 180);
    let r = app.send(call("GET", "/api/v1/priority-classes/interactive").token(&admin)).await;
    assert_eq!(r.json()["preemption_delay_seconds"], 180);
    // Left out, it is 0: the class preempts at once.
    let r = app.send(call("GET", "/api/v1/priority-classes/production").token(&admin)).await;
    assert_eq!(r.json()["preemption_delay_seconds"], 0);
    let mut too_long = class.clone();
    too_long.as_object_mut().unwrap().remove("name");
    too_long["preemption_delay_seconds"] = json!(86_401);
    let r = app.send(call("PUT", "/api/v1/priority-classes/interactive").token(&admin).json(&too_long)).await;
    let doc = r.assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "preemption_delay_seconds", "{doc}");
    app.team(&admin, "ml", None).await;
    let r = app.send(call("POST", "/api/v1/teams/ml/jobs").token(&admin).json(&serving(-1))).await;
    let doc = r.assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "preemption_delay_seconds", "{doc}");
}
