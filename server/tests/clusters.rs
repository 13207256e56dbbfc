//! Several clusters of one GPU class, through a real `fairway serve` and real HTTP: a gang
//! runs within one cluster (a cluster runs a gang as one set of objects with one
//! rendezvous), even where best-fit alone would have split it over the fuller one and another.

mod common;

use std::time::Duration;

use common::{fresh_dir, platform::Platform};
use serde_json::{json, Value};

/// A simulated cluster's inventory of `nodes` H100 nodes of 8 GPUs, written into `dir`.
fn inventory(dir: &std::path::Path, cluster: &str, nodes: usize) -> std::path::PathBuf {
    let file = dir.join(format!("{cluster}.toml"));
    let mut text = String::from("[[class]]\nname = \"h100-80gb\"\nkind = \"whole\"\nmemory_mib = 81920\n");
    for i in 1..=nodes {
        text.push_str(&format!("\n[[node]]\nname = \"{cluster}-{i}\"\ngpu_class = \"h100-80gb\"\ngpus = 8\n"));
    }
    std::fs::write(&file, text).unwrap();
    file
}

fn job(name: &str, replicas: u32, gpus_per_replica: u32) -> Value {
    json!({"name": name, "gpu_class": "h100-80gb", "replicas": replicas, "gpus_per_replica": gpus_per_replica,
           "image": "nvcr.io/nvidia/pytorch:24.05-py3", "command": ["python", "train.py"],
           "priority_class": "experiment", "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "3600"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_runs_within_one_cluster_though_the_fuller_node_is_in_another() {
    let dir = fresh_dir("clusters-gang");
    let clusters = format!(
        "[[cluster]]\nname = \"east\"\nkind = \"sim\"\ninventory = \"{}\"\n\n\
         [[cluster]]\nname = \"west\"\nkind = \"sim\"\ninventory = \"{}\"\n",
        inventory(&dir, "east", 1).display(),
        inventory(&dir, "west", 2).display()
    );
    let p = Platform::start("clusters-gang", &clusters, &[]).await;
    p.team("ml", "h100-80gb", 24, 0).await;
    // Half of east's only node: the fullest node from then on.
    let half = p.submit("ml", job("half", 1, 4)).await;
    let half = p.wait_state(&half, "running", Duration::from_secs(30)).await;
    assert_eq!(half["cluster"], "east", "{half}");
    // Three replicas of 4: best-fit alone would put one beside `half` on east and two on west,
    // a gang no cluster could run; it runs whole on west.
    let gang = p.submit("ml", job("gang", 3, 4)).await;
    let gang = p.wait_state(&gang, "running", Duration::from_secs(30)).await;
    assert_eq!(gang["cluster"], "west", "{gang}");
    let nodes: Vec<&str> = gang["placement"].as_array().unwrap().iter().map(|r| r["node"].as_str().unwrap()).collect();
    assert_eq!(nodes.len(), 3);
    assert!(nodes.iter().all(|n| n.starts_with("west-")), "{nodes:?}");
    // A single replica still takes the fullest node, wherever it is.
    let single = p.submit("ml", job("single", 1, 4)).await;
    let single = p.wait_state(&single, "running", Duration::from_secs(30)).await;
    assert_eq!(single["cluster"], "east", "{single}");
    p.stop().await;
}
