//! The `kubernetes` backend against a real API server (see `common::kube_peer`): a real
//! `fairway serve` process dispatches through the `dispatcher` account, which holds exactly
//! the ClusterRole of `deploy/kubernetes/rbac.yaml`, and the test plays the kubelet.
//!
//! Each test has its own database, Fairway cluster name, namespace prefix and nodes (selected
//! by a label of their own), so the tests share one control plane without seeing each other.

mod common;

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    time::{Duration, Instant},
};

use common::{
    kube_peer::{self, h100_node as h100},
    platform::Platform,
};
use fairway::backends::kubernetes::rbac::RULES;
use k8s_openapi::api::{
    core::v1::{Namespace, Pod, ResourceQuota, Secret, Service},
    networking::v1::NetworkPolicy,
};
use kube::api::{Api, ListParams, PostParams};
use serde_json::{json, Value};

/// One test's platform with a `kubernetes` cluster over the nodes labelled for the test.
struct Fairway {
    platform: Platform,
    kube: kube::Client,
}

impl std::ops::Deref for Fairway {
    type Target = Platform;
    fn deref(&self) -> &Platform {
        &self.platform
    }
}

impl std::ops::DerefMut for Fairway {
    fn deref_mut(&mut self) -> &mut Platform {
        &mut self.platform
    }
}

impl Fairway {
    /// Starts Fairway on a fresh database with one `kubernetes` cluster over the nodes
    /// labelled for this test, once `nodes` exist.
    async fn start(test: &str, nodes: &[(&str, Value, Value)]) -> Self {
        let peer = kube_peer::peer();
        peer.grant_dispatcher().await;
        for (name, labels, allocatable) in nodes {
            let mut labels = labels.clone();
            labels["fairway-test"] = json!(test);
            peer.gpu_node(name, labels, allocatable.clone()).await;
        }
        let clusters = format!(
            r#"[[cluster]]
name = "{test}"
kind = "kubernetes"
server = "{}"
token_file = "{}"
insecure_skip_tls_verify = true
namespace_prefix = "{test}-"
node_selector = "fairway-test={test}"
rack_label = "fairway.dev/rack"
node_lost_after_seconds = 5

[cluster.gpu_products]
"NVIDIA-H100-80GB-HBM3" = "h100-80gb"
"NVIDIA-A100-SXM4-80GB" = "a100-80gb"
"#,
            peer.url,
            peer.dispatcher_token_file.display()
        );
        let platform = Platform::start(test, &clusters, &[]).await;
        Fairway { platform, kube: peer.admin().await }
    }

    /// The pods of one job, or of every job of this test, as the API server has them.
    async fn pods(&self, job: Option<&str>) -> Vec<Pod> {
        let mut selector = format!("fairway.dev/cluster={}", self.test);
        if let Some(job) = job {
            selector.push_str(&format!(",fairway.dev/job-id={job}"));
        }
        let pods: Api<Pod> = Api::all(self.kube.clone());
        let mut items = pods.list(&ListParams::default().labels(&selector)).await.unwrap().items;
        items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        items
    }

    async fn services(&self) -> Vec<Service> {
        let services: Api<Service> = Api::all(self.kube.clone());
        let selector = format!("fairway.dev/cluster={}", self.test);
        services.list(&ListParams::default().labels(&selector)).await.unwrap().items
    }

    async fn wait_pods(&self, job: &str, n: usize) -> Vec<Pod> {
        let started = Instant::now();
        loop {
            let pods = self.pods(Some(job)).await;
            if pods.len() == n && pods.iter().all(|p| p.metadata.deletion_timestamp.is_none()) {
                return pods;
            }
            if started.elapsed() > Duration::from_secs(30) {
                let timeline = self.ok(reqwest::Method::GET, &format!("/api/v1/jobs/{job}/events"), None).await;
                panic!("waited 30 s for {n} pods of job {job}: {timeline:#}\n--- fairway log ---\n{}", self.log());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn kubelet(&self) -> kube_peer::Kubelet {
        kube_peer::Kubelet { client: self.kube.clone() }
    }

    async fn stop(self) {
        self.platform.stop().await;
    }
}

fn node_of(pod: &Pod) -> String {
    pod.metadata.annotations.as_ref().unwrap()["fairway.dev/node"].clone()
}

/// The GPU resources (`nvidia.com/...`) a pod's container requests; CPU and memory aside.
fn gpus_requested(pod: &Pod) -> BTreeMap<String, String> {
    let container = &pod.spec.as_ref().unwrap().containers[0];
    let requests = container.resources.as_ref().unwrap().requests.as_ref().unwrap();
    requests.iter().filter(|(k, _)| k.starts_with("nvidia.com/")).map(|(k, v)| (k.clone(), v.0.clone())).collect()
}

fn affinity_host(pod: &Pod) -> String {
    let v = serde_json::to_value(pod).unwrap();
    v["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
        ["matchExpressions"][0]["values"][0]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_four_by_eight_gang_lands_as_four_pinned_pods_on_four_nodes_of_one_rack_and_runs_to_success() {
    let t = "gang";
    // Rack r1 has four nodes, rack r2 three: only r1 can hold the gang.
    let mut nodes = Vec::new();
    for (rack, n) in [("r1", 4), ("r2", 3)] {
        for i in 0..n {
            let (labels, alloc) = h100(rack);
            nodes.push((format!("{t}-{rack}-n{i}"), labels, alloc));
        }
    }
    let nodes: Vec<(&str, Value, Value)> = nodes.iter().map(|(n, l, a)| (n.as_str(), l.clone(), a.clone())).collect();
    let owned = Fairway::start(t, &nodes).await;
    let fw = &owned;
    fw.team("vision", "h100-80gb", 32, 0).await;
    let id = fw
        .submit(
            "vision",
            json!({"name": "llama", "gpu_class": "h100-80gb", "replicas": 4, "gpus_per_replica": 8,
                   "image": "nvcr.io/nvidia/pytorch:24.05-py3", "command": ["torchrun", "train.py"],
                   "topology": {"level": "rack", "mode": "required"}, "max_runtime_seconds": 7200}),
        )
        .await;
    let pods = fw.wait_pods(&id, 4).await;
    let placed: BTreeSet<String> = pods.iter().map(node_of).collect();
    assert_eq!(placed.len(), 4, "four distinct nodes: {placed:?}");
    assert!(placed.iter().all(|n| n.starts_with(&format!("{t}-r1-"))), "all in rack r1: {placed:?}");
    for pod in &pods {
        assert_eq!(gpus_requested(pod), BTreeMap::from([("nvidia.com/gpu".to_owned(), "8".to_owned())]));
        assert_eq!(affinity_host(pod), format!("{}-host", node_of(pod)), "pinned by hostname");
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.active_deadline_seconds, Some(7200));
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("gang-vision"));
        let owner = &pod.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.kind, "Service");
    }
    // The team's namespace is fenced: restricted pods, a GPU quota equal to its limit, and
    // isolation from other teams.
    let ns: Namespace = Api::all(fw.kube.clone()).get("gang-vision").await.unwrap();
    assert_eq!(ns.metadata.labels.unwrap()["pod-security.kubernetes.io/enforce"], "restricted");
    let quota: ResourceQuota = fw
        .wait("the team's quota", Duration::from_secs(30), || async move {
            Api::<ResourceQuota>::namespaced(fw.kube.clone(), "gang-vision").get_opt("fairway-gpus").await.unwrap()
        })
        .await;
    assert_eq!(quota.spec.unwrap().hard.unwrap()["requests.nvidia.com/gpu"].0, "32");
    let policy = Api::<NetworkPolicy>::namespaced(fw.kube.clone(), "gang-vision").get("fairway-team-isolation").await;
    assert!(policy.is_ok(), "{policy:?}");
    let services = fw.services().await;
    assert_eq!(services.len(), 1);
    assert_eq!(services[0].spec.as_ref().unwrap().cluster_ip.as_deref(), Some("None"));

    // The kubelet starts every replica: the job runs; every replica exits 0: it succeeded.
    let kubelet = fw.kubelet();
    for pod in &pods {
        kubelet.run(pod).await;
    }
    fw.wait_state(&id, "running", Duration::from_secs(30)).await;
    for pod in &fw.pods(Some(&id)).await {
        kubelet.exit(pod, 0, "Completed").await;
    }
    let done = fw.wait_state(&id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(done["exit_code"], 0);
    assert_eq!(fw.event_kinds(&id).await, ["submitted", "admitted", "dispatched", "running", "succeeded"]);
    // Finished gangs are collected.
    fw.wait("the gang's objects to be deleted", Duration::from_secs(30), || async move {
        (fw.pods(None).await.is_empty() && fw.services().await.is_empty()).then_some(())
    })
    .await;
    owned.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_with_cpu_memory_a_claim_and_a_secret_reference_makes_pods_that_carry_them_and_no_other_teams_secret_can_be_named(
) {
    let t = "spec";
    let (labels, alloc) = h100("r1");
    let owned = Fairway::start(t, &[("spec-n0", labels, alloc)]).await;
    let fw = &owned;
    fw.team("vision", "h100-80gb", 8, 0).await;
    // Another team's namespace holds a Secret of the same name as the one vision uses.
    let namespaces: Api<Namespace> = Api::all(fw.kube.clone());
    let other: Namespace = serde_json::from_value(json!({"metadata": {"name": "spec-finance"}})).unwrap();
    namespaces.create(&PostParams::default(), &other).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(fw.kube.clone(), "spec-finance");
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "hf"}, "stringData": {"token": "finance's"}})).unwrap();
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    let base = json!({"name": "train", "gpu_class": "h100-80gb", "gpus_per_replica": 2,
                      "image": "nvcr.io/nvidia/pytorch:24.05-py3"});
    let with = |changes: Value| {
        let mut body = base.clone();
        for (k, v) in changes.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    // Naming it through its namespace is refused at submission, as is any object elsewhere.
    for (changes, field) in [
        (
            json!({"secret_env": [{"name": "HF_TOKEN", "secret": "spec-finance/hf", "key": "token"}]}),
            "secret_env[0].secret",
        ),
        (json!({"volumes": [{"claim": "spec-finance/data", "mount_path": "/data"}]}), "volumes[0].claim"),
        (json!({"image_pull_secrets": ["spec-finance/regcred"]}), "image_pull_secrets[0]"),
    ] {
        let (status, problem) = fw.send(reqwest::Method::POST, "/api/v1/teams/vision/jobs", Some(with(changes))).await;
        assert_eq!(status, 422, "{problem:#}");
        assert_eq!(
            (problem["errors"][0]["field"].as_str(), problem["errors"][0]["code"].as_str()),
            (Some(field), Some("other_namespace")),
            "{problem:#}"
        );
    }
    let id = fw
        .submit(
            "vision",
            with(json!({"cpu": "6", "memory": "48Gi",
                        "volumes": [{"claim": "datasets", "mount_path": "/data", "read_only": true}],
                        "secret_env": [{"name": "HF_TOKEN", "secret": "hf", "key": "token"}],
                        "image_pull_secrets": ["regcred"],
                        "node_selector": {"fairway.dev/rack": "r1"}})),
        )
        .await;
    let pods = fw.wait_pods(&id, 1).await;
    let pod = &pods[0];
    // The pod lives in vision's namespace, so every name it gives is looked up there.
    assert_eq!(pod.metadata.namespace.as_deref(), Some("spec-vision"));
    let spec = pod.spec.as_ref().unwrap();
    let container = &spec.containers[0];
    let resources = container.resources.as_ref().unwrap();
    for amounts in [resources.requests.as_ref().unwrap(), resources.limits.as_ref().unwrap()] {
        // The API server may write a quantity in another form of the same amount.
        assert_eq!(fairway::domain::workload::parse_cpu("cpu", &amounts["cpu"].0), Ok(6000), "{amounts:?}");
        assert_eq!(fairway::domain::workload::parse_memory("memory", &amounts["memory"].0), Ok(48 * 1024));
        assert_eq!(amounts["nvidia.com/gpu"].0, "2");
    }
    let volumes = spec.volumes.as_ref().unwrap();
    let claim = volumes[0].persistent_volume_claim.as_ref().unwrap();
    assert_eq!((claim.claim_name.as_str(), claim.read_only), ("datasets", Some(true)));
    let mount = &container.volume_mounts.as_ref().unwrap()[0];
    assert_eq!(
        (mount.name.as_str(), mount.mount_path.as_str(), mount.read_only),
        (volumes[0].name.as_str(), "/data", Some(true))
    );
    let env = container.env.as_ref().unwrap();
    let hf = env.iter().find(|e| e.name == "HF_TOKEN").unwrap();
    let key = hf.value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
    assert_eq!((key.name.as_str(), key.key.as_str()), ("hf", "token"));
    assert!(hf.value.is_none(), "Fairway never holds the value");
    assert_eq!(spec.image_pull_secrets.as_ref().unwrap()[0].name, "regcred");
    assert_eq!(spec.node_selector.as_ref().unwrap()["fairway.dev/rack"], "r1");
    assert_eq!(affinity_host(pod), format!("{}-host", node_of(pod)), "still pinned to the engine's node");
    // The pod is one a kubelet runs to the end like any other.
    let kubelet = fw.kubelet();
    kubelet.run(pod).await;
    fw.wait_state(&id, "running", Duration::from_secs(30)).await;
    kubelet.exit(pod, 0, "Completed").await;
    fw.wait_state(&id, "succeeded", Duration::from_secs(30)).await;
    // A node selector no node of the cluster meets: refused at dispatch, saying which label,
    // rather than a pod pending for ever.
    let unmet = fw.submit("vision", with(json!({"node_selector": {"fairway.dev/rack": "r9"}}))).await;
    fw.wait_state(&unmet, "failed", Duration::from_secs(30)).await;
    let timeline = fw.ok(reqwest::Method::GET, &format!("/api/v1/jobs/{unmet}/events"), None).await;
    assert!(timeline.to_string().contains("lacks the label fairway.dev/rack=r9"), "{timeline:#}");
    assert!(fw.pods(Some(&unmet)).await.is_empty(), "no pod was made");
    owned.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mig_job_requests_its_mig_profile_and_an_application_failure_reports_the_exit_code() {
    let t = "mig";
    let labels = json!({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/mig.strategy": "mixed",
                        "nvidia.com/mig-3g.40gb.memory": "40192", "fairway.dev/rack": "r1"});
    let alloc = json!({"nvidia.com/gpu": "0", "nvidia.com/mig-3g.40gb": "4", "nvidia.com/mig-1g.10gb": "6"});
    let owned = Fairway::start(t, &[("mig-a100-0", labels, alloc)]).await;
    let fw = &owned;
    fw.team("nlp", "a100-80gb.mig-3g.40gb", 4, 0).await;
    let id = fw
        .submit(
            "nlp",
            json!({"name": "infer", "gpu_class": "a100-80gb.mig-3g.40gb", "replicas": 1, "gpus_per_replica": 1,
                   "image": "nvcr.io/nvidia/tritonserver:24.05-py3"}),
        )
        .await;
    let pods = fw.wait_pods(&id, 1).await;
    assert_eq!(gpus_requested(&pods[0]), BTreeMap::from([("nvidia.com/mig-3g.40gb".to_owned(), "1".to_owned())]));
    let quota: ResourceQuota = fw
        .wait("the team's quota", Duration::from_secs(30), || async move {
            Api::<ResourceQuota>::namespaced(fw.kube.clone(), "mig-nlp").get_opt("fairway-gpus").await.unwrap()
        })
        .await;
    assert_eq!(quota.spec.unwrap().hard.unwrap()["requests.nvidia.com/mig-3g.40gb"].0, "4");
    let kubelet = fw.kubelet();
    kubelet.run(&pods[0]).await;
    fw.wait_state(&id, "running", Duration::from_secs(30)).await;
    kubelet.exit(&pods[0], 137, "OOMKilled").await;
    let failed = fw.wait_state(&id, "failed", Duration::from_secs(30)).await;
    assert_eq!(failed["exit_code"], 137);
    let events = fw.ok(reqwest::Method::GET, &format!("/api/v1/jobs/{id}/events"), None).await;
    let last = events.as_array().unwrap().last().unwrap().clone();
    assert!(last.to_string().contains("OOMKilled"), "{last:#}");
    owned.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gfd_sharing_labels_make_a_time_sliced_class_billed_by_its_share_and_requested_as_one_replica() {
    let t = "tslice";
    let labels = json!({"nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.memory": "15360",
                        "nvidia.com/gpu.count": "2", "nvidia.com/gpu.replicas": "4",
                        "nvidia.com/gpu.sharing-strategy": "time-slicing", "fairway.dev/rack": "r1"});
    let alloc = json!({"nvidia.com/gpu": "8", "cpu": "32", "memory": "128Gi", "pods": "110"});
    let owned = Fairway::start(t, &[("tslice-t4-0", labels, alloc)]).await;
    let fw = &owned;
    let class = fw
        .wait("the time-sliced class in the catalogue", Duration::from_secs(30), || async move {
            let (status, class) = fw.send(reqwest::Method::GET, "/api/v1/gpu-classes/tesla-t4.shared-4", None).await;
            (status == 200).then_some(class)
        })
        .await;
    assert_eq!(
        (class["kind"].as_str(), class["fraction_milli"].as_i64()),
        (Some("time-slice"), Some(250)),
        "{class:#}"
    );
    fw.team("vision", "tesla-t4.shared-4", 8, 0).await;
    let id = fw
        .submit(
            "vision",
            json!({"name": "notebook", "gpu_class": "tesla-t4.shared-4", "replicas": 1, "gpus_per_replica": 1,
                   "image": "nvcr.io/nvidia/pytorch:24.05-py3"}),
        )
        .await;
    let pods = fw.wait_pods(&id, 1).await;
    // One share is one replica of the device plugin's `nvidia.com/gpu`.
    assert_eq!(gpus_requested(&pods[0]), BTreeMap::from([("nvidia.com/gpu".to_owned(), "1".to_owned())]));
    fw.kubelet().run(&pods[0]).await;
    fw.wait_state(&id, "running", Duration::from_secs(30)).await;
    // Its usage counts a quarter of a GPU.
    let fraction: i32 = sqlx::query_scalar("select fraction_milli from usage_intervals where job_id = $1::uuid")
        .bind(&id)
        .fetch_one(&fw.pool)
        .await
        .unwrap();
    assert_eq!(fraction, 250);
    owned.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_daemonsets_pod_asks_of_a_gpu_node_is_not_offered_to_replicas() {
    let t = "daemon";
    let (labels, alloc) = h100("r1");
    let owned = Fairway::start(t, &[("daemon-n0", labels, alloc)]).await;
    let fw = &owned;
    let offered = |cpu: i32, memory: i32| async move {
        let row: Option<(Option<i32>, Option<i32>)> =
            sqlx::query_as("select cpu_millis, memory_mib from cluster_nodes where name = 'daemon-n0'")
                .fetch_optional(&fw.pool)
                .await
                .unwrap();
        (row == Some((Some(cpu), Some(memory)))).then_some(())
    };
    // All of the node's allocatable: 96 cores and 1 TiB.
    fw.wait("the node's whole allocatable", Duration::from_secs(30), || offered(96_000, 1_048_576)).await;
    // A monitoring DaemonSet's pod lands on it, as the DaemonSet controller binds one.
    let namespaces: Api<Namespace> = Api::all(fw.kube.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "daemon-monitoring"}})).unwrap();
    namespaces.create(&PostParams::default(), &ns).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(fw.kube.clone(), "daemon-monitoring");
    let exporter: Pod = serde_json::from_value(json!({
        "metadata": {"name": "dcgm-exporter-x1"},
        "spec": {"nodeName": "daemon-n0", "automountServiceAccountToken": false,
                 "containers": [{"name": "exporter", "image": "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5",
                                 "resources": {"requests": {"cpu": "1500m", "memory": "2Gi"}}}]}
    }))
    .unwrap();
    // A fresh namespace's default service account may not exist yet: the API server answers
    // 500 "retry after ..." until the controller has made it.
    fw.wait("the exporter pod created", Duration::from_secs(30), || {
        let (pods, exporter) = (pods.clone(), exporter.clone());
        async move {
            match pods.create(&PostParams::default(), &exporter).await {
                Ok(_) => Some(()),
                Err(kube::Error::Api(s)) if s.code == 409 => Some(()),
                Err(_) => None,
            }
        }
    })
    .await;
    fw.wait("the exporter's requests taken off", Duration::from_secs(30), || offered(94_500, 1_046_528)).await;
    // Once it is gone, the node offers all of it again.
    pods.delete("dcgm-exporter-x1", &kube::api::DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
        .await
        .unwrap();
    fw.wait("the whole allocatable again", Duration::from_secs(30), || offered(96_000, 1_048_576)).await;
    owned.stop().await;
}

/// GPU Feature Discovery's driver labels as NVML's answers on a real H200 give them
/// (`server/data/gpu/h200/facts.json`): the driver and CUDA version ones only.
fn real_driver_labels() -> Value {
    let facts: Value = serde_json::from_str(include_str!("../data/gpu/h200/facts.json")).unwrap();
    let labels = facts["gfd_labels"].as_object().unwrap();
    labels.iter().filter(|(k, _)| k.starts_with("nvidia.com/cuda.")).map(|(k, v)| (k.clone(), v.clone())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gfd_driver_labels_place_a_job_only_on_the_node_that_runs_the_cuda_it_requires() {
    let t = "drivers";
    // One H100 node upgraded (the driver labels a real H200's driver gives: 580.159.04, CUDA
    // 13.0), one not, labelled as older GFD releases do (`cuda.driver.*` in parts).
    let (mut new, alloc) = h100("r1");
    new.as_object_mut().unwrap().extend(real_driver_labels().as_object().unwrap().clone());
    let (mut old, _) = h100("r1");
    old.as_object_mut().unwrap().extend(
        json!({"nvidia.com/cuda.driver.major": "535", "nvidia.com/cuda.driver.minor": "104",
               "nvidia.com/cuda.driver.rev": "05", "nvidia.com/cuda.runtime.major": "12",
               "nvidia.com/cuda.runtime.minor": "2"})
        .as_object()
        .unwrap()
        .clone(),
    );
    // The old node has fewer GPUs: best fit alone would put a gang there first.
    let fewer = json!({"nvidia.com/gpu": "6", "cpu": "96", "memory": "1Ti", "pods": "110"});
    let owned = Fairway::start(t, &[("drivers-old", old, fewer), ("drivers-new", new, alloc)]).await;
    let fw = &owned;
    fw.team("ml", "h100-80gb", 16, 0).await;
    let spec = |name: &str, gpus: i64, requires: Value| {
        let mut spec = json!({"name": name, "gpu_class": "h100-80gb", "gpus_per_replica": gpus,
                              "priority_class": "production", "image": "nvcr.io/nvidia/pytorch:25.01-py3"});
        spec.as_object_mut().unwrap().extend(requires.as_object().unwrap().clone());
        spec
    };
    let cuda13 = fw.submit("ml", spec("cuda13", 4, json!({"min_cuda_version": "13.0"}))).await;
    let pods = fw.wait_pods(&cuda13, 1).await;
    assert_eq!(node_of(&pods[0]), "drivers-new", "the only node whose driver supports CUDA 13.0");
    assert_eq!(affinity_host(&pods[0]), "drivers-new-host", "pinned by its hostname label");
    // A job that requires a driver newer than either waits, saying what the nodes run.
    let newer = fw.submit("ml", spec("newer", 1, json!({"min_driver_version": "590"}))).await;
    let newer = newer.as_str();
    let job = fw
        .wait("the job's driver reason", Duration::from_secs(30), || async move {
            let job = fw.job(newer).await;
            (job["pending"]["reason"] == "driver_unavailable").then_some(job)
        })
        .await;
    assert_eq!(job["pending"]["figures"]["drivers"]["newest_driver_version"], "580.159.04", "{job:#}");
    assert_eq!(job["pending"]["figures"]["drivers"]["newest_cuda_version"], "13.0");
    // The cluster view names both drivers of the class.
    let clusters = fw.ok(reqwest::Method::GET, "/api/v1/clusters", None).await;
    let cluster = clusters.as_array().unwrap().iter().find(|c| c["name"] == t).unwrap();
    let warning = cluster["driver_warnings"][0].as_str().unwrap_or_default();
    assert!(
        warning.starts_with(
            "h100-80gb runs 2 driver versions: 580.159.04 (CUDA 13.0) on 1 node, 535.104.05 (CUDA 12.2) on 1 node"
        ),
        "{cluster:#}"
    );
    owned.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_job_is_preempted_with_its_grace_period_when_its_gpus_are_reclaimed() {
    let t = "preempt";
    let (l0, a0) = h100("r1");
    let (l1, a1) = h100("r1");
    let owned = Fairway::start(t, &[("preempt-n0", l0, a0), ("preempt-n1", l1, a1)]).await;
    let fw = &owned;
    fw.team("alpha", "h100-80gb", 8, 8).await;
    fw.team("beta", "h100-80gb", 8, 0).await;
    let body = |name: &str| {
        json!({"name": name, "gpu_class": "h100-80gb", "replicas": 1, "gpus_per_replica": 8,
               "image": "nvcr.io/nvidia/pytorch:24.05-py3", "priority_class": "experiment"})
    };
    let first = fw.submit("alpha", body("a1")).await;
    let second = fw.submit("alpha", body("a2")).await;
    let kubelet = fw.kubelet();
    for id in [&first, &second] {
        let pods = fw.wait_pods(id, 1).await;
        kubelet.run(&pods[0]).await;
        fw.wait_state(id, "running", Duration::from_secs(30)).await;
    }
    // Beta claims its reserved GPUs, which alpha borrowed: one of alpha's jobs must go.
    let claim = fw
        .submit(
            "beta",
            json!({"name": "b", "gpu_class": "h100-80gb", "replicas": 1,
        "gpus_per_replica": 8, "image": "nvcr.io/nvidia/pytorch:24.05-py3"}),
        )
        .await;
    let stopping = fw
        .wait("a pod deleted with its grace period", Duration::from_secs(30), || async move {
            fw.pods(None).await.into_iter().find(|p| p.metadata.deletion_timestamp.is_some())
        })
        .await;
    // The priority class's grace period (30 s): SIGTERM now, SIGKILL later.
    assert_eq!(stopping.metadata.deletion_grace_period_seconds, Some(30));
    let victim = stopping.metadata.labels.as_ref().unwrap()["fairway.dev/job-id"].clone();
    let victim: &str = &victim;
    assert!(victim == first || victim == second);
    assert_eq!(fw.job(&claim).await["state"], "pending", "the claim waits while the victim checkpoints");
    // The application checkpoints and exits: the victim is requeued, the claim dispatched.
    kubelet.terminated(&stopping).await;
    fw.wait("the victim to be requeued", Duration::from_secs(30), || async move {
        let job = fw.job(victim).await;
        (job["state"] == "pending" || job["state"] == "queued").then_some(job)
    })
    .await;
    let events = fw.events(victim).await;
    let said = |kind: &str, reason: &str| events.contains(&(kind.to_owned(), reason.to_owned()));
    assert!(said("preempted", "reclaim") && said("requeued", "stopped"), "{events:?}");
    let claim_pods = fw.wait_pods(&claim, 1).await;
    assert_eq!(node_of(&claim_pods[0]), node_of(&stopping), "the claim runs where the victim ran");
    owned.stop().await;
}

/// Team `speech` with one 8-GPU job running on one of the test's nodes: its id and node.
async fn one_gang_running(fw: &Fairway) -> (String, String) {
    fw.team("speech", "h100-80gb", 16, 0).await;
    let id = fw
        .submit(
            "speech",
            json!({"name": "asr", "gpu_class": "h100-80gb", "replicas": 1, "gpus_per_replica": 8,
                   "image": "nvcr.io/nvidia/pytorch:24.05-py3"}),
        )
        .await;
    let pods = fw.wait_pods(&id, 1).await;
    fw.kubelet().run(&pods[0]).await;
    fw.wait_state(&id, "running", Duration::from_secs(30)).await;
    let node = node_of(&pods[0]);
    (id, node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_node_requeues_its_gang_and_unknown_objects_with_our_labels_are_removed() {
    let t = "lost";
    let (l0, a0) = h100("r1");
    let (l1, a1) = h100("r1");
    let owned = Fairway::start(t, &[("lost-n0", l0, a0), ("lost-n1", l1, a1)]).await;
    let fw = &owned;
    let (id, node) = one_gang_running(fw).await;
    let id: &str = &id;
    kube_peer::peer().node_ready(&node, false).await;
    fw.wait("the job to be requeued after losing its node", Duration::from_secs(30), || async move {
        fw.events(id).await.contains(&("requeued".to_owned(), "node_lost".to_owned())).then_some(())
    })
    .await;
    // It comes back on the node that is left.
    let again = fw
        .wait("the job's second attempt", Duration::from_secs(30), || async move {
            let pods = fw.pods(Some(id)).await;
            pods.into_iter().find(|p| p.metadata.labels.as_ref().unwrap()["fairway.dev/attempt"] == "2")
        })
        .await;
    assert_ne!(node_of(&again), node);

    // Someone left a pod with our labels for a job Fairway never had: it is removed.
    let stray: Pod = serde_json::from_value(json!({
        "metadata": {"name": "stray", "namespace": "lost-speech", "labels": {
            "app.kubernetes.io/managed-by": "fairway", "fairway.dev/cluster": t,
            "fairway.dev/object": "fw-00000000000000000000000000000001-1",
            "fairway.dev/job-id": "00000000-0000-0000-0000-000000000001", "fairway.dev/attempt": "1"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], "securityContext": {"runAsNonRoot": true, "runAsUser": 1000}},
    }))
    .unwrap();
    Api::<Pod>::namespaced(fw.kube.clone(), "lost-speech").create(&PostParams::default(), &stray).await.unwrap();
    fw.wait("the stray pod to be removed", Duration::from_secs(30), || async move {
        Api::<Pod>::namespaced(fw.kube.clone(), "lost-speech").get_opt("stray").await.unwrap().is_none().then_some(())
    })
    .await;
    kube_peer::peer().node_ready(&node, true).await;
    owned.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_fault_reported_as_nvsentinel_does_requeues_the_gang_off_the_node_and_ends_its_billing_at_the_fault() {
    let t = "fault";
    let (l0, a0) = h100("r1");
    let (l1, a1) = h100("r1");
    let owned = Fairway::start(t, &[("fault-n0", l0, a0), ("fault-n1", l1, a1)]).await;
    let fw = &owned;
    let (id, node) = one_gang_running(fw).await;
    let id: &str = &id;
    // NVSentinel's health monitor reports an XID 79 on the node, and its fault quarantine
    // taints it; the node stays Ready and the pod keeps running as far as the kubelet says.
    // The fault comes a whole second (condition times have no finer grain) after its start.
    let started: chrono::DateTime<chrono::Utc> = fw.job(id).await["started_at"].as_str().unwrap().parse().unwrap();
    let failed_at = chrono::DateTime::from_timestamp(started.timestamp() + 2, 0).unwrap();
    if let Ok(ahead) = (failed_at - chrono::Utc::now()).to_std() {
        tokio::time::sleep(ahead).await;
    }
    let since = failed_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let peer = kube_peer::peer();
    peer.node_condition(&node, "GpuXidError", true, "ErrorCode:79 GPU has fallen off the bus", &since).await;
    peer.taints(&node, json!([{"key": "nvidia.com/gpu-xid-error", "value": "true", "effect": "NoSchedule"}])).await;
    let signalled = Instant::now();
    fw.wait("the job to be requeued off the faulty node", Duration::from_secs(60), || async move {
        fw.events(id).await.contains(&("requeued".to_owned(), "node_lost".to_owned())).then_some(())
    })
    .await;
    let requeued_within = signalled.elapsed();
    let again = fw
        .wait("the job's second attempt", Duration::from_secs(30), || async move {
            let pods = fw.pods(Some(id)).await;
            pods.into_iter().find(|p| p.metadata.labels.as_ref().unwrap()["fairway.dev/attempt"] == "2")
        })
        .await;
    assert_ne!(node_of(&again), node, "the faulty node is excluded");
    // The first attempt's time ends when the GPU failed, to the second the condition says.
    let ended: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("select ended_at from usage_intervals where job_id = $1::uuid and attempt = 1")
            .bind(id)
            .fetch_one(&fw.pool)
            .await
            .unwrap();
    assert_eq!(ended, failed_at, "billing ends at the fault; requeued {requeued_within:?} after the signal");
    assert!(requeued_within < Duration::from_secs(60));
    // The cluster says which node is unhealthy, since when and why.
    let unhealthy = fw
        .wait("the node listed as unhealthy", Duration::from_secs(30), || async move {
            let clusters = fw.ok(reqwest::Method::GET, "/api/v1/clusters", None).await;
            let cluster = clusters.as_array()?.iter().find(|c| c["name"] == t)?.clone();
            cluster["unhealthy_nodes"].as_array().filter(|n| !n.is_empty()).cloned()
        })
        .await;
    assert_eq!(unhealthy[0]["node"], node.as_str(), "{unhealthy:#?}");
    assert_eq!(unhealthy[0]["why"], "GpuXidError: ErrorCode:79 GPU has fallen off the bus", "{unhealthy:#?}");
    assert_eq!(
        unhealthy[0]["since"].as_str().and_then(|s| s.parse::<chrono::DateTime<chrono::Utc>>().ok()),
        Some(failed_at)
    );
    peer.node_condition(&node, "GpuXidError", false, "", &since).await;
    peer.taints(&node, json!([])).await;
    owned.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_fairway_during_dispatch_twenty_times_never_leaves_a_duplicate_or_orphan_pod() {
    const KILLS: u64 = 20;
    let t = "crash";
    let mut nodes = Vec::new();
    for i in 0..4 {
        let (labels, alloc) = h100("r1");
        nodes.push((format!("crash-n{i}"), labels, alloc));
    }
    let nodes: Vec<(&str, Value, Value)> = nodes.iter().map(|(n, l, a)| (n.as_str(), l.clone(), a.clone())).collect();
    let mut fw = Fairway::start(t, &nodes).await;
    fw.team("ml", "h100-80gb", 32, 0).await;
    let mut rng = fairway::rng::SplitMix64(0x6b75_6265);
    let mut submitted = Vec::new();
    for round in 0..KILLS {
        for i in 0..3 {
            let body = json!({"name": format!("r{round}-{i}"), "gpu_class": "h100-80gb", "replicas": 2,
                              "gpus_per_replica": 1 + (i % 2), "image": "nvcr.io/nvidia/pytorch:24.05-py3"});
            submitted.push(fw.submit("ml", body).await);
        }
        // The kill lands anywhere from before the first cycle to well into dispatch.
        tokio::time::sleep(Duration::from_millis(100 + rng.next_u64() % 900)).await;
        fw.server.as_ref().unwrap().signal(libc::SIGKILL);
        fw.restart();
        fw.login().await;
        // Let every pod that exists run to completion, as a kubelet would, so the GPUs free up.
        let kubelet = fw.kubelet();
        let pods = fw.pods(None).await;
        one_gang_per_job(&pods);
        for pod in pods {
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
            match phase.as_str() {
                "Pending" if pod.metadata.deletion_timestamp.is_none() => kubelet.run(&pod).await,
                "Running" => kubelet.exit(&pod, 0, "Completed").await,
                _ => {}
            }
        }
    }
    // After the last restart every job runs to success with exactly one gang per attempt.
    let owned = fw;
    let fw = &owned;
    let kubelet = &fw.kubelet();
    let submitted = &submitted;
    fw.wait("every job to succeed", Duration::from_secs(90), || async move {
        let pods = fw.pods(None).await;
        one_gang_per_job(&pods);
        for pod in pods {
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
            match phase.as_str() {
                "Pending" if pod.metadata.deletion_timestamp.is_none() => kubelet.run(&pod).await,
                "Running" => kubelet.exit(&pod, 0, "Completed").await,
                _ => {}
            }
        }
        let done: i64 = sqlx::query_scalar("select count(*) from jobs where state = 'succeeded'")
            .fetch_one(&fw.pool)
            .await
            .unwrap();
        (done == submitted.len() as i64 && fw.pods(None).await.is_empty() && fw.services().await.is_empty())
            .then_some(())
    })
    .await;
    let count = |sql: &'static str| {
        let pool = fw.pool.clone();
        async move { sqlx::query_scalar::<_, i64>(sql).fetch_one(&pool).await.unwrap() }
    };
    assert_eq!(count("select count(*) from jobs where attempt <> 1").await, 0, "no job was admitted twice");
    assert_eq!(
        count(
            "select count(*) from (select job_id, attempt from job_events where kind = 'dispatched'
             group by 1, 2 having count(*) > 1) d"
        )
        .await,
        0,
        "no attempt was dispatched twice"
    );
    assert_eq!(count("select count(*) from job_events where kind = 'orphan_removed'").await, 0, "no orphans");
    assert_eq!(count("select count(*) from dispatch_outbox where done_at is null").await, 0);
    println!("{} jobs across {KILLS} kills all succeeded once", submitted.len());
    owned.stop().await;
}

/// Never two gangs of one job at once (a duplicate): pod names derive from the job and its
/// attempt, so a duplicate shows as pods of two attempts.
fn one_gang_per_job(pods: &[Pod]) {
    let mut attempts: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for pod in pods {
        let labels = pod.metadata.labels.as_ref().unwrap();
        attempts.entry(labels["fairway.dev/job-id"].clone()).or_default().insert(labels["fairway.dev/attempt"].clone());
    }
    assert!(attempts.values().all(|a| a.len() == 1), "one gang per job at a time: {attempts:?}");
}

/// The manifests grant the dispatcher exactly what the backend uses: the ClusterRole in
/// `deploy/kubernetes/rbac.yaml` equals [`RULES`], rule by rule.
#[test]
fn the_deployed_cluster_role_grants_exactly_the_rules_the_backend_uses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/rbac.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut roles = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let object: Value = serde::Deserialize::deserialize(doc).unwrap();
        if object["kind"] == "ClusterRole" {
            roles.push(object);
        }
    }
    assert_eq!(roles.len(), 1, "one ClusterRole in {}", path.display());
    let granted: Vec<(String, String, Vec<String>)> = roles[0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let one = |k: &str| {
                let list = r[k].as_array().unwrap();
                assert_eq!(list.len(), 1, "one {k} per rule: {r}");
                list[0].as_str().unwrap().to_owned()
            };
            let verbs = r["verbs"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()).collect();
            (one("apiGroups"), one("resources"), verbs)
        })
        .collect();
    let used: Vec<(String, String, Vec<String>)> = RULES
        .iter()
        .map(|(g, r, v)| ((*g).to_owned(), (*r).to_owned(), v.iter().map(|v| (*v).to_owned()).collect()))
        .collect();
    assert_eq!(granted, used);
}

/// Opt-in proof on a real cluster: with `KUBECONFIG` naming a cluster that has the NVIDIA GPU
/// Operator, dispatches one 1-GPU replica of `nvidia-smi` (image `FAIRWAY_E2E_IMAGE`, default
/// a CUDA base image) to the first GPU node the backend finds, and waits for it to succeed.
/// Creates the namespace `fw-e2e` and removes its gang afterwards. Run with
/// `KUBECONFIG=... cargo test -p fairway --test kubernetes -- --ignored on_a_real_cluster`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real GPU cluster: set KUBECONFIG and run with --ignored"]
async fn on_a_real_cluster_a_one_gpu_job_runs_nvidia_smi_to_success() {
    use fairway::backends::{
        kubernetes::{KubeBackend, KubeClusterConfig, Wake},
        Backend, Gang, Outcome, Phase, ReplicaSlot,
    };
    let path = std::env::var("KUBECONFIG").expect("KUBECONFIG names the cluster to test");
    let config: KubeClusterConfig = toml::from_str(&format!("name = \"e2e\"\nkubeconfig = {path:?}")).unwrap();
    let wake = Wake { reconcile: Default::default(), inventory: Default::default() };
    let backend = KubeBackend::start(config.client().await.expect("client"), config, wake);
    let inventory = backend.inventory().await.expect("inventory");
    println!("inventory: {inventory:#?}");
    let node = inventory.iter().find(|n| n.gpus > 0).expect("a schedulable GPU node");
    let job = fairway::domain::JobId::new();
    let gang = Gang {
        object: fairway::backends::object_name(job, 1),
        job_id: job,
        attempt: 1,
        team: "e2e".into(),
        job_name: "nvidia-smi".into(),
        gpu_class: node.gpu_class.clone(),
        priority_class: "production".into(),
        image: std::env::var("FAIRWAY_E2E_IMAGE")
            .unwrap_or_else(|_| "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04".into()),
        command: vec!["nvidia-smi".into()],
        env: Default::default(),
        labels: Default::default(),
        max_runtime: Duration::from_secs(600),
        cpu_millis: None,
        memory_mib: None,
        workload: Default::default(),
        replicas: vec![ReplicaSlot { node: node.name.clone(), gpus: vec![0] }],
        array: None,
        service: None,
        extra_of: None,
    };
    backend.submit(&gang).await.expect("submit");
    let started = Instant::now();
    let outcome = loop {
        let objects = backend.objects().await.expect("objects");
        if let Some(Phase::Finished { outcome, .. }) =
            objects.iter().find(|o| o.object == gang.object).map(|o| &o.phase)
        {
            break outcome.clone();
        }
        assert!(started.elapsed() < Duration::from_secs(600), "not finished in 10 minutes: {objects:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    backend.delete(&gang.object).await.expect("delete");
    assert_eq!(outcome, Outcome::Succeeded);
}

/// The manifests deploy what the README says: every file kustomize lists parses, two server
/// replicas run under the `fairway` ServiceAccount, the binding gives that account the
/// dispatcher role, and the clusters file they mount is one Fairway accepts.
#[test]
fn the_deploy_manifests_run_two_replicas_under_the_service_account_bound_to_the_dispatcher_role() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
    let kustomization: Value =
        serde_yaml::from_str(&std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap()).unwrap();
    let mut objects: Vec<Value> = Vec::new();
    for file in kustomization["resources"].as_array().unwrap() {
        let text = std::fs::read_to_string(dir.join(file.as_str().unwrap())).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let object: Value = serde::Deserialize::deserialize(doc).unwrap();
            if !object.is_null() {
                objects.push(object);
            }
        }
    }
    let find = |kind: &str| objects.iter().find(|o| o["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"));
    let deployment = find("Deployment");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "fairway");
    let account = find("ServiceAccount");
    assert_eq!(account["metadata"]["name"], "fairway");
    let binding = find("ClusterRoleBinding");
    assert_eq!(binding["roleRef"]["name"], find("ClusterRole")["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["kind"], "ServiceAccount");
    assert_eq!(binding["subjects"][0]["name"], "fairway");
    assert_eq!(binding["subjects"][0]["namespace"], account["metadata"]["namespace"]);
    let clusters = find("ConfigMap")["data"]["clusters.toml"].as_str().expect("clusters.toml");
    let parsed = fairway::backends::clusters::parse(clusters).expect("the mounted clusters file is valid");
    assert!(matches!(parsed[0], fairway::backends::clusters::ClusterConfig::Kubernetes(_)));
    let env = pod["containers"][0]["env"].as_array().unwrap();
    assert!(env.iter().any(|e| e["name"] == "FAIRWAY_CLUSTERS"), "{env:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_task_of_an_array_is_a_pod_told_its_index_and_a_failed_task_alone_runs_again() {
    let t = "array";
    let (labels, alloc) = h100("r1");
    let owned = Fairway::start(t, &[("array-n0", labels, alloc)]).await;
    let fw = &owned;
    fw.team("vision", "h100-80gb", 8, 0).await;
    let array = fw
        .ok(
            reqwest::Method::POST,
            "/api/v1/teams/vision/arrays",
            Some(json!({"count": 3, "task": {"name": "shard", "gpu_class": "h100-80gb", "gpus_per_replica": 2,
                                             "image": "ghcr.io/acme/shard:1", "max_retries": 1}})),
        )
        .await;
    let id = array["id"].as_str().unwrap().to_owned();
    let tasks = fw.ok(reqwest::Method::GET, &format!("/api/v1/teams/vision/arrays/{id}/tasks"), None).await;
    let tasks: Vec<String> =
        tasks["items"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(tasks.len(), 3);
    let kubelet = fw.kubelet();
    let mut running = Vec::new();
    for (index, task) in tasks.iter().enumerate() {
        let pods = fw.wait_pods(task, 1).await;
        let env = pods[0].spec.as_ref().unwrap().containers[0].env.clone().unwrap_or_default();
        let value = |name: &str| env.iter().find(|e| e.name == name).and_then(|e| e.value.clone());
        assert_eq!(value("FAIRWAY_ARRAY_TASK_ID"), Some(index.to_string()), "task {index}");
        assert_eq!(value("JOB_COMPLETION_INDEX"), Some(index.to_string()), "task {index}");
        assert_eq!(value("FAIRWAY_ARRAY_TASK_COUNT").as_deref(), Some("3"));
        assert_eq!(value("FAIRWAY_ARRAY_ID"), Some(id.clone()));
        kubelet.run(&pods[0]).await;
        running.push(pods[0].clone());
    }
    // Task 1 fails once; it alone runs again, as a new pod told the same index.
    let first = running[1].clone();
    kubelet.exit(&first, 3, "Error").await;
    let second = fw
        .wait("a second pod of task 1", Duration::from_secs(30), || async {
            let pods = fw.pods(Some(&tasks[1])).await;
            pods.into_iter().find(|p| p.metadata.name != first.metadata.name && p.metadata.deletion_timestamp.is_none())
        })
        .await;
    let env = second.spec.as_ref().unwrap().containers[0].env.clone().unwrap_or_default();
    assert!(env.iter().any(|e| e.name == "FAIRWAY_ARRAY_TASK_ID" && e.value.as_deref() == Some("1")));
    kubelet.run(&second).await;
    running[1] = second;
    for (task, pod) in tasks.iter().zip(&running) {
        kubelet.exit(pod, 0, "Completed").await;
        fw.wait_state(task, "succeeded", Duration::from_secs(30)).await;
    }
    let done = fw.ok(reqwest::Method::GET, &format!("/api/v1/teams/vision/arrays/{id}"), None).await;
    assert_eq!(
        (done["state"].as_str(), done["counts"]["succeeded"].as_i64()),
        (Some("succeeded"), Some(3)),
        "{done:#}"
    );
    assert_eq!(fw.job(&tasks[1]).await["attempt"], 2, "task 1 ran twice");
    owned.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_makes_a_pod_per_replica_behind_one_service_restarts_a_failed_replica_and_cannot_name_another_teams_secret(
) {
    let t = "svc";
    let (labels, alloc) = h100("r1");
    let owned = Fairway::start(t, &[("svc-n0", labels, alloc)]).await;
    let fw = &owned;
    fw.team("vision", "h100-80gb", 8, 0).await;
    let spec = |secret: &str| {
        json!({"name": "chat", "min_replicas": 2, "port": 9000,
               "replica": {"gpu_class": "h100-80gb", "gpus": 2, "image": "ghcr.io/acme/chat:1",
                           "secret_env": [{"name": "HF_TOKEN", "secret": secret, "key": "token"}]}})
    };
    // Another team's Secret cannot be named, not even through its namespace.
    let (status, problem) =
        fw.send(reqwest::Method::POST, "/api/v1/teams/vision/services", Some(spec("svc-finance/hf"))).await;
    assert_eq!(status, 422, "{problem:#}");
    assert_eq!(
        (problem["errors"][0]["field"].as_str(), problem["errors"][0]["code"].as_str()),
        (Some("replica.secret_env[0].secret"), Some("other_namespace")),
        "{problem:#}"
    );
    fw.ok(reqwest::Method::POST, "/api/v1/teams/vision/services", Some(spec("hf"))).await;
    let replicas = fw
        .wait("two replica jobs", Duration::from_secs(30), || async {
            let s = fw.ok(reqwest::Method::GET, "/api/v1/teams/vision/services/chat", None).await;
            let jobs: Vec<String> =
                s["replica_jobs"].as_array()?.iter().map(|j| j["id"].as_str().unwrap().to_owned()).collect();
            (jobs.len() == 2).then_some(jobs)
        })
        .await;
    let kubelet = fw.kubelet();
    let mut pods = Vec::new();
    for (slot, job) in replicas.iter().enumerate() {
        let pod = fw.wait_pods(job, 1).await.remove(0);
        assert_eq!(pod.metadata.namespace.as_deref(), Some("svc-vision"));
        assert_eq!(pod.metadata.labels.as_ref().unwrap()["fairway.dev/service"], "chat");
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.active_deadline_seconds, None, "a replica has no maximum runtime");
        let env = spec.containers[0].env.clone().unwrap_or_default();
        let value = |name: &str| env.iter().find(|e| e.name == name).and_then(|e| e.value.clone());
        assert_eq!(value("FAIRWAY_SERVICE").as_deref(), Some("chat"));
        assert_eq!(value("FAIRWAY_SERVICE_REPLICA"), Some(slot.to_string()));
        assert_eq!(value("PORT").as_deref(), Some("9000"));
        let hf = env.iter().find(|e| e.name == "HF_TOKEN").unwrap();
        assert_eq!(hf.value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap().name, "hf");
        kubelet.run(&pod).await;
        pods.push(pod);
    }
    // One Service in the team's namespace selects every replica's pod, on the service's port.
    let services: Api<Service> = Api::namespaced(fw.kube.clone(), "svc-vision");
    let endpoint = services.get("fw-svc-chat").await.expect("the service's Service");
    let spec = endpoint.spec.as_ref().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    let selector = spec.selector.clone().unwrap();
    assert_eq!(selector, BTreeMap::from([("fairway.dev/service".to_owned(), "chat".to_owned())]));
    let port = &spec.ports.as_ref().unwrap()[0];
    assert_eq!(
        (port.port, port.target_port.clone()),
        (9000, Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(9000)))
    );
    for pod in &pods {
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert!(selector.iter().all(|(k, v)| labels.get(k) == Some(v)), "the Service selects {:?}", pod.metadata.name);
    }
    let ready = fw
        .wait("the service ready", Duration::from_secs(30), || async {
            let s = fw.ok(reqwest::Method::GET, "/api/v1/teams/vision/services/chat", None).await;
            (s["state"] == "ready").then_some(s)
        })
        .await;
    assert_eq!(ready["endpoints"][0]["address"], "fw-svc-chat.svc-vision.svc:9000", "{ready:#}");

    // Replica 0's application crashes: the same job runs again as a new pod, on its budget.
    kubelet.exit(&pods[0], 1, "Error").await;
    let again = fw
        .wait("a second pod of replica 0", Duration::from_secs(30), || async {
            fw.pods(Some(&replicas[0]))
                .await
                .into_iter()
                .find(|p| p.metadata.name != pods[0].metadata.name && p.metadata.deletion_timestamp.is_none())
        })
        .await;
    assert_eq!(again.metadata.labels.as_ref().unwrap()["fairway.dev/service"], "chat");
    kubelet.run(&again).await;
    fw.wait_state(&replicas[0], "running", Duration::from_secs(30)).await;
    assert_eq!(fw.job(&replicas[0]).await["attempt"], 2);

    // Deleted: every replica's pod is asked to stop; once they have, the Service goes too.
    fw.ok(reqwest::Method::DELETE, "/api/v1/teams/vision/services/chat", None).await;
    let stopping = fw
        .wait("both replicas' pods stopping", Duration::from_secs(30), || async {
            let pods: Vec<Pod> =
                fw.pods(None).await.into_iter().filter(|p| p.metadata.deletion_timestamp.is_some()).collect();
            (pods.len() == 2).then_some(pods)
        })
        .await;
    for pod in &stopping {
        kubelet.terminated(pod).await;
    }
    for job in &replicas {
        fw.wait_state(job, "cancelled", Duration::from_secs(30)).await;
    }
    fw.wait("the Service removed", Duration::from_secs(30), || async {
        services.get_opt("fw-svc-chat").await.unwrap().is_none().then_some(())
    })
    .await;
    owned.stop().await;
}
