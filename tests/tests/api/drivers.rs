//! Jobs that require a driver or CUDA version, on the simulated cluster's fleet mid-upgrade
//! (`sim_default.toml`: rack-2's H100s run 560.35.03 with CUDA 12.6, rack-1's 550.90.07 with
//! CUDA 12.4): placed only where their requirement holds, waiting with the reason and the
//! figures when it holds nowhere, and the cluster view warning about the mixed class.

use std::time::Duration;

use fairway_tests::{call, TestApp};
use serde_json::{json, Value};

use crate::{
    lifecycle::{start_control, submit, wait_for, wait_for_inventory},
    portal::{body, sign_in},
};

async fn fleet() -> (TestApp, String) {
    let app = TestApp::spawn().await;
    start_control(&app).await;
    wait_for_inventory(&app).await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100-80gb", 48, 0).await;
    (app, admin)
}

fn job(name: &str, gpus: i64, requires: Value) -> Value {
    let mut spec = json!({"name": name, "gpu_class": "h100-80gb", "gpus_per_replica": gpus, "image": "x",
                          "priority_class": "production", "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "3000"}});
    spec.as_object_mut().unwrap().extend(requires.as_object().unwrap().clone());
    spec
}

fn nodes_of(job: &Value) -> Vec<String> {
    job["placement"].as_array().into_iter().flatten().map(|r| r["node"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn a_job_that_requires_a_newer_driver_runs_only_on_the_nodes_that_have_it() {
    let (app, admin) = fleet().await;
    let (_, ci) = app.api_token(&admin, "ml", "member").await;
    let mut placed = Vec::new();
    // Four jobs of 8 GPUs requiring 560: the four upgraded nodes and no other, though rack-1's
    // four stand idle beside them.
    for i in 0..4 {
        placed
            .push(submit(&app, &ci, "ml", job(&format!("new-{i}"), 8, json!({"min_driver_version": "560.35"}))).await);
    }
    let mut nodes = Vec::new();
    for id in &placed {
        let j = wait_for(&app, &ci, id, Duration::from_secs(30), |j| j["state"] == "running").await;
        assert_eq!(j["min_driver_version"], "560.35", "the job shows what it requires");
        nodes.extend(nodes_of(&j));
    }
    nodes.sort();
    assert_eq!(nodes, ["r2-h100-1", "r2-h100-2", "r2-h100-3", "r2-h100-4"]);
    // A fifth waits for them, though 32 GPUs of the class are free, and says so with numbers.
    let fifth = submit(&app, &ci, "ml", job("new-4", 1, json!({"min_cuda_version": "12.6"}))).await;
    let j = wait_for(&app, &ci, &fifth, Duration::from_secs(30), |j| j["pending"]["reason"] == "no_driver_fit").await;
    let message = j["pending"]["message"].as_str().unwrap();
    assert!(message.starts_with("32 GPUs of h100-80gb are free to it"), "{message}");
    assert!(message.contains("only 0 of them on nodes that run CUDA ≥ 12.6"), "{message}");
    assert_eq!(j["pending"]["figures"]["drivers"]["free_gpus_meeting"], 0.0);
    assert!(j["pending"]["expected_start_at"].is_string(), "capacity frees: a forecast can place it: {j:#}");
    // A job that requires nothing takes rack-1.
    // The job's page says what it requires.
    app.user(&admin, "alice", None).await;
    app.member(&admin, "ml", "alice", "member").await;
    let alice = sign_in(&app, "alice").await;
    let page = body(&app.send(call("GET", &format!("/jobs/{}", placed[0])).header("cookie", &alice)).await);
    assert!(page.contains(r#"<dd class="requires-drivers">driver ≥ 560.35</dd>"#), "{page}");
    let any = submit(&app, &ci, "ml", job("any", 8, json!({}))).await;
    let j = wait_for(&app, &ci, &any, Duration::from_secs(30), |j| j["state"] == "running").await;
    assert!(nodes_of(&j)[0].starts_with("r1-"), "{j:#}");
}

#[tokio::test]
async fn a_job_that_requires_a_driver_no_node_runs_is_accepted_with_a_warning_and_waits_for_an_upgrade() {
    let (app, admin) = fleet().await;
    let (_, ci) = app.api_token(&admin, "ml", "member").await;
    let r = app
        .send(call("POST", "/api/v1/teams/ml/jobs").token(&ci).json(&job(
            "cuda-13",
            1,
            json!({"min_cuda_version": "13.0"}),
        )))
        .await;
    r.assert_status(201);
    let created = r.json();
    let warning = &created["warnings"][0];
    assert_eq!(
        (warning["field"].as_str(), warning["code"].as_str()),
        (Some("min_cuda_version"), Some("no_node_meets"))
    );
    assert_eq!(
        warning["message"],
        "0 GPUs of h100-80gb run CUDA ≥ 13.0, and the job needs 1 (the newest driver there is 560.35.03); it waits until enough nodes are upgraded"
    );
    let id = created["id"].as_str().unwrap();
    let j = wait_for(&app, &ci, id, Duration::from_secs(30), |j| j["pending"]["reason"] == "driver_unavailable").await;
    let pending = &j["pending"];
    assert_eq!(pending["figures"]["unforeseeable"], "driver_change");
    assert!(pending["expected_start_at"].is_null(), "no forecast knows when nodes are upgraded: {j:#}");
    assert_eq!(
        pending["figures"]["drivers"],
        json!({"min_cuda_version": "13.0", "newest_driver_version": "560.35.03", "newest_cuda_version": "12.6",
               "free_gpus_meeting": 0.0})
    );
    let message = pending["message"].as_str().unwrap();
    assert!(
        message.starts_with("it requires CUDA ≥ 13.0, and no node of h100-80gb runs it, or not enough of them to hold its 1 GPUs (the newest there: driver 560.35.03, CUDA 12.6)"),
        "{message}"
    );
    assert!(
        message.ends_with("it starts only after nodes of this class are upgraded to the driver it requires"),
        "{message}"
    );
}

#[tokio::test]
async fn a_driver_version_that_is_not_one_is_refused_naming_the_field() {
    let (app, admin) = fleet().await;
    let (_, ci) = app.api_token(&admin, "ml", "member").await;
    for (field, value) in
        [("min_driver_version", "latest"), ("min_cuda_version", "12.4.1.1"), ("min_driver_version", "")]
    {
        let r = app
            .send(call("POST", "/api/v1/teams/ml/jobs").token(&ci).json(&job("bad", 1, json!({field: value}))))
            .await;
        r.assert_status(422);
        let problem = r.json();
        assert_eq!(problem["errors"][0]["field"], field, "{problem:#}");
        assert_eq!(problem["errors"][0]["code"], "invalid_version");
    }
    let jobs: i64 = sqlx::query_scalar("select count(*) from jobs").fetch_one(&app.pool).await.unwrap();
    assert_eq!(jobs, 0, "nothing half-written");
}

#[tokio::test]
async fn the_cluster_view_warns_that_a_class_runs_mixed_driver_versions() {
    let (app, admin) = fleet().await;
    let clusters: Value = app.send(call("GET", "/api/v1/clusters").token(&admin)).await.json();
    let sim = clusters.as_array().unwrap().iter().find(|c| c["name"] == "sim").expect("the simulated cluster");
    let warning = "h100-80gb runs 2 driver versions: 560.35.03 (CUDA 12.6) on 4 nodes, 550.90.07 (CUDA 12.4) on 4 nodes; a job that requires a minimum version runs only on the nodes that meet it, and a job built for the newest may fail on the others";
    assert_eq!(sim["driver_warnings"], json!([warning]), "only the H100s are mixed");
    let a100: Vec<&Value> =
        sim["drivers"].as_array().unwrap().iter().filter(|d| d["gpu_class"] == "a100-80gb").collect();
    assert_eq!(a100.len(), 1);
    assert_eq!(
        (&a100[0]["driver_version"], &a100[0]["cuda_version"], &a100[0]["gpus"]),
        (&json!("535.183.06"), &json!("12.2"), &json!(8))
    );
    app.user(&admin, "alice", None).await;
    let alice = sign_in(&app, "alice").await;
    let r = app.send(call("GET", "/clusters").header("cookie", &alice)).await;
    r.assert_status(200);
    let page = body(&r);
    assert!(page.contains("<h2>Mixed driver versions</h2>"), "{page}");
    assert!(page.contains(&format!("sim: {warning}")), "{page}");
}

#[tokio::test]
async fn a_services_replicas_that_require_cuda_12_6_run_only_on_the_upgraded_rack() {
    let (app, admin) = fleet().await;
    let (_, ci) = app.api_token(&admin, "ml", "member").await;
    let r = app
        .send(call("POST", "/api/v1/teams/ml/services").token(&ci).json(&json!({
            "name": "chat", "min_replicas": 3,
            "replica": {"gpu_class": "h100-80gb", "gpus": 8, "image": "ghcr.io/acme/chat:1", "min_cuda_version": "12.6"}})))
        .await;
    r.assert_status(201);
    assert_eq!(r.json()["min_cuda_version"], "12.6", "the service shows what its replicas require");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let jobs = loop {
        let s = app.send(call("GET", "/api/v1/teams/ml/services/chat").token(&ci)).await.json();
        let jobs = s["replica_jobs"].as_array().cloned().unwrap_or_default();
        if jobs.len() == 3 && jobs.iter().all(|j| j["state"] == "running") {
            break jobs;
        }
        assert!(tokio::time::Instant::now() < deadline, "the replicas never all ran: {s:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    for j in &jobs {
        assert_eq!(j["min_cuda_version"], "12.6", "each replica job carries the requirement: {j:#}");
        let node = j["placement"][0]["node"].as_str().unwrap();
        assert!(node.starts_with("r2-"), "a replica on {node}, whose driver supports only CUDA 12.4: {j:#}");
    }
}
