//! Placement with the CPU and memory nodes report, through the real control loop on a
//! simulated cluster whose nodes declare them (`cpus`, `memory_gib`): a replica goes only
//! where its CPUs fit beside its GPUs; by best-fit or, with `FAIRWAY_PLACEMENT=fragmentation`,
//! where it strands the fewest GPUs for the shapes that wait and run.

use std::time::Duration;

use fairway::scheduler::Placement;
use fairway_tests::{call, TestApp};
use serde_json::{json, Value};

use crate::lifecycle::{h100_inventory, start_control, submit, wait_for, wait_for_inventory};

/// A 2-GPU node with 16 cores and a 4-GPU node with 64, in one rack.
const NODES: &str = r#"
[[node]]
name = "a-lean"
gpu_class = "h100-80gb"
gpus = 2
rack = "r1"
cpus = 16
memory_gib = 256

[[node]]
name = "b-wide"
gpu_class = "h100-80gb"
gpus = 4
rack = "r1"
cpus = 64
memory_gib = 1024
"#;

async fn fleet(placement: Placement) -> (TestApp, String) {
    let file = h100_inventory(NODES);
    let app = TestApp::spawn_with(|c| {
        c.sim_inventory = Some(file);
        c.placement = placement;
    })
    .await;
    start_control(&app).await;
    wait_for_inventory(&app).await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100-80gb", 6, 0).await;
    let (_, ci) = app.api_token(&admin, "ml", "member").await;
    (app, ci)
}

fn job(name: &str, gpus: i64, cpu: &str) -> Value {
    json!({"name": name, "gpu_class": "h100-80gb", "gpus_per_replica": gpus, "image": "x", "cpu": cpu,
           "memory": "8Gi", "priority_class": "production", "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "3000"}})
}

fn node_of(job: &Value) -> String {
    job["placement"][0]["node"].as_str().unwrap_or_default().to_owned()
}

async fn running(app: &TestApp, token: &str, id: &str) -> Value {
    wait_for(app, token, id, Duration::from_secs(30), |j| j["state"] == "running").await
}

#[tokio::test]
async fn a_replica_goes_only_where_its_cpus_fit_beside_its_gpus() {
    let (app, ci) = fleet(Placement::BestFit).await;
    // Best-fit by GPUs is the 2-GPU node; 8 cores fit there.
    let first = submit(&app, &ci, "ml", job("first", 1, "8")).await;
    assert_eq!(node_of(&running(&app, &ci, &first).await), "a-lean");
    // One GPU is left there, but only 8 cores: a job asking for 12 goes to the other node.
    let wide = submit(&app, &ci, "ml", job("wide", 1, "12")).await;
    assert_eq!(node_of(&running(&app, &ci, &wide).await), "b-wide");
    // One asking for 8 still fits beside the last GPU of the fuller node.
    let narrow = submit(&app, &ci, "ml", job("narrow", 1, "8")).await;
    assert_eq!(node_of(&running(&app, &ci, &narrow).await), "a-lean");
    // Three GPUs are free on the 4-GPU node, but 52 of its cores: a job asking 60 waits, and
    // says it is CPU, not GPUs, that it waits for.
    let hungry = submit(&app, &ci, "ml", job("hungry", 1, "60")).await;
    let j = wait_for(&app, &ci, &hungry, Duration::from_secs(30), |j| j["pending"]["reason"].is_string()).await;
    assert_eq!(j["pending"]["reason"], "no_cpu_memory_fit", "{j:#}");
    let message = j["pending"]["message"].as_str().unwrap();
    assert!(message.contains("no node with free GPUs also has the 60 CPU and 8Gi memory"), "{message}");
    // No node has 100 cores: it could never run, and is refused, naming the field.
    let r = app.send(call("POST", "/api/v1/teams/ml/jobs").token(&ci).json(&job("huge", 1, "100"))).await;
    let doc = r.assert_problem(422, "validation_failed");
    assert_eq!((doc["field"].as_str(), doc["errors"][0]["code"].as_str()), (Some("cpu"), Some("never_fits")));
    let message = doc["errors"][0]["message"].as_str().unwrap();
    assert!(message.contains("asks for 100 beside its GPUs, and the largest node of h100-80gb gives 64"), "{message}");
    // Nor may a job that names no memory take more than the default allows: 4 GPUs get 64 GiB.
    let mut roomy = job("roomy", 4, "8");
    roomy.as_object_mut().unwrap().remove("memory");
    let r = app.send(call("POST", "/api/v1/teams/ml/jobs").token(&ci).json(&roomy)).await;
    r.assert_status(201);
    let mut greedy = job("greedy", 1, "8");
    greedy["memory"] = json!("2Ti");
    let r = app.send(call("POST", "/api/v1/teams/ml/jobs").token(&ci).json(&greedy)).await;
    let doc = r.assert_problem(422, "validation_failed");
    assert_eq!(doc["field"].as_str(), Some("memory"));
}

#[tokio::test]
async fn by_fragmentation_a_replica_leaves_the_node_whose_last_gpu_it_would_strand() {
    // One GPU with 16 cores. Best-fit puts it on the 2-GPU node and spends its cores, so the
    // node's other GPU can take nothing; by fragmentation it goes to the 4-GPU node.
    let (best_fit, ci) = fleet(Placement::BestFit).await;
    let id = submit(&best_fit, &ci, "ml", job("wide", 1, "16")).await;
    assert_eq!(node_of(&running(&best_fit, &ci, &id).await), "a-lean");
    let (by_fragmentation, ci) = fleet(Placement::Fragmentation).await;
    let id = submit(&by_fragmentation, &ci, "ml", job("wide", 1, "16")).await;
    assert_eq!(node_of(&running(&by_fragmentation, &ci, &id).await), "b-wide");
}
