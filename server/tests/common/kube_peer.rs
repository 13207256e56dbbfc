//! A real Kubernetes control plane for the tests: etcd, `kube-apiserver` and
//! `kube-controller-manager` (v1.20, built from Debian's source package by
//! `.ci/build-kube-peer`, see ../shared/peers/KUBERNETES.md), on loopback ports of their own,
//! with static tokens: `admin` (system:masters) and `dispatcher` (no rights until a test binds
//! the ClusterRole of `deploy/kubernetes/rbac.yaml` to it).
//!
//! No kubelet and no scheduler run: [`Kubelet`] plays both through real API calls (binding a
//! pod to its node, writing its status, finishing a graceful deletion).
//!
//! One control plane serves a whole test binary. Its processes are started from a thread that
//! lives as long as the binary and die with it (`PR_SET_PDEATHSIG`).

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::OnceLock,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    api::{Api, DeleteParams, Patch, PatchParams, PostParams},
    Client,
};
use serde_json::{json, Value};

use super::free_port;

/// The running control plane.
pub struct KubePeer {
    pub url: String,
    pub dir: PathBuf,
    pub admin_token_file: PathBuf,
    pub dispatcher_token_file: PathBuf,
}

static PEER: OnceLock<KubePeer> = OnceLock::new();

/// The control plane of this test binary, started on first use.
pub fn peer() -> &'static KubePeer {
    PEER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel();
        // The children's parent-death signal follows the thread that spawned them: it must
        // outlive every test, so it parks forever once they run.
        std::thread::spawn(move || {
            let (peer, _children) = start();
            tx.send(peer).expect("report the control plane");
            loop {
                std::thread::park();
            }
        });
        rx.recv().expect("the control plane thread")
    })
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_owned()
}

/// The directory holding `kube-apiserver` and `kube-controller-manager`: `FAIRWAY_KUBE_BIN`,
/// or what `.ci/build-kube-peer` builds (once per machine; minutes the first time).
fn binaries() -> PathBuf {
    if let Some(dir) = std::env::var_os("FAIRWAY_KUBE_BIN") {
        return PathBuf::from(dir);
    }
    let out = Command::new("bash")
        .arg(repo_root().join(".ci/build-kube-peer"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run .ci/build-kube-peer");
    assert!(out.status.success(), ".ci/build-kube-peer failed; see its output above");
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(stdout.lines().last().expect("the script prints the binaries' directory").trim())
}

/// Starts `program` so that it is killed when the test thread that started it dies
/// (util-linux `setpriv` sets the parent-death signal, then execs it).
fn spawn(dir: &Path, name: &str, program: &Path, args: &[String]) -> Child {
    let log = fs::File::create(dir.join(format!("{name}.log"))).expect("log file");
    let mut cmd = Command::new("setpriv");
    cmd.args(["--pdeathsig", "KILL", "--"]).arg(program).args(args);
    cmd.current_dir(dir).stdin(Stdio::null()).stdout(log.try_clone().expect("log")).stderr(log);
    cmd.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()))
}

/// Starts the control plane; the children are kept (never waited on) until the process ends.
fn start() -> (KubePeer, Vec<Child>) {
    let bin = binaries();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("kube-peer-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("certs")).expect("peer dir");
    let certs = dir.join("certs");
    let openssl = |args: &[&str]| {
        let ok = Command::new("openssl").args(args).current_dir(&certs).stderr(Stdio::null()).status();
        assert!(ok.is_ok_and(|s| s.success()), "openssl {args:?}");
    };
    openssl(&["genrsa", "-out", "sa.key", "2048"]);
    openssl(&["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
    fs::write(
        certs.join("tokens.csv"),
        "admin-token,admin,admin,\"system:masters\"\ndispatcher-token,dispatcher,dispatcher\n",
    )
    .expect("tokens");
    let admin_token_file = dir.join("admin.token");
    let dispatcher_token_file = dir.join("dispatcher.token");
    fs::write(&admin_token_file, "admin-token").expect("token");
    fs::write(&dispatcher_token_file, "dispatcher-token").expect("token");

    let (client_port, peer_port, api_port, cm_port) = (free_port(), free_port(), free_port(), free_port());
    let etcd = which("etcd");
    let mut children = Vec::new();
    children.push(spawn(
        &dir,
        "etcd",
        &etcd,
        &[
            "--data-dir=etcd-data".into(),
            format!("--listen-client-urls=http://127.0.0.1:{client_port}"),
            format!("--advertise-client-urls=http://127.0.0.1:{client_port}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
            "--unsafe-no-fsync".into(),
        ],
    ));
    children.push(spawn(
        &dir,
        "kube-apiserver",
        &bin.join("kube-apiserver"),
        &[
            format!("--etcd-servers=http://127.0.0.1:{client_port}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={api_port}"),
            "--insecure-port=0".into(),
            "--cert-dir=certs".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--authorization-mode=Node,RBAC".into(),
            "--token-auth-file=certs/tokens.csv".into(),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            "--service-account-key-file=certs/sa.pub".into(),
            "--service-account-signing-key-file=certs/sa.key".into(),
            "--enable-priority-and-fairness=false".into(),
        ],
    ));
    let url = format!("https://127.0.0.1:{api_port}");
    let kubeconfig = dir.join("admin.kubeconfig");
    fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: peer\n  cluster:\n    server: {url}\n    \
             insecure-skip-tls-verify: true\nusers:\n- name: admin\n  user:\n    token: admin-token\n\
             contexts:\n- name: peer\n  context:\n    cluster: peer\n    user: admin\ncurrent-context: peer\n"
        ),
    )
    .expect("kubeconfig");
    wait_ready(&url, &dir);
    // The controller-manager creates each namespace's default ServiceAccount (pods need it)
    // and computes ResourceQuota usage (quota admission refuses pods until it has). Its node
    // lifecycle controller is off: no kubelet heartbeats here, so it would evict everything.
    children.push(spawn(
        &dir,
        "kube-controller-manager",
        &bin.join("kube-controller-manager"),
        &[
            format!("--kubeconfig={}", kubeconfig.display()),
            "--leader-elect=false".into(),
            "--service-account-private-key-file=certs/sa.key".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={cm_port}"),
            "--port=0".into(),
            "--controllers=*,-nodelifecycle".into(),
        ],
    ));
    (KubePeer { url, dir, admin_token_file, dispatcher_token_file }, children)
}

fn which(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|paths| std::env::split_paths(&paths).map(|p| p.join(program)).find(|p| p.is_file()))
        .unwrap_or_else(|| panic!("{program} is not installed (apt-get install etcd-server)"))
}

fn wait_ready(url: &str, dir: &Path) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let started = Instant::now();
        loop {
            let client = client(url, &dir.join("admin.token")).await;
            if client.apiserver_version().await.is_ok() {
                return;
            }
            let log = fs::read_to_string(dir.join("kube-apiserver.log")).unwrap_or_default();
            assert!(started.elapsed() < Duration::from_secs(60), "kube-apiserver did not start:\n{log}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
}

/// A client of `url` authenticated by the token in `token_file`.
pub async fn client(url: &str, token_file: &Path) -> Client {
    let mut config = kube::Config::new(url.parse().expect("url"));
    config.accept_invalid_certs = true;
    config.auth_info.token_file = Some(token_file.display().to_string());
    Client::try_from(config).expect("kube client")
}

impl KubePeer {
    /// A client with every right.
    pub async fn admin(&self) -> Client {
        client(&self.url, &self.admin_token_file).await
    }

    /// Grants the `dispatcher` user exactly the ClusterRole of `deploy/kubernetes/rbac.yaml`.
    pub async fn grant_dispatcher(&self) {
        let admin = self.admin().await;
        let text = fs::read_to_string(repo_root().join("deploy/kubernetes/rbac.yaml")).expect("rbac.yaml");
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let mut object: Value = serde::Deserialize::deserialize(doc).expect("yaml");
            match object["kind"].as_str() {
                Some("ClusterRole") => {}
                Some("ClusterRoleBinding") => {
                    object["subjects"] =
                        json!([{"kind": "User", "name": "dispatcher", "apiGroup": "rbac.authorization.k8s.io"}]);
                }
                _ => continue,
            }
            let kind = object["kind"].as_str().unwrap().to_owned();
            let name = object["metadata"]["name"].as_str().expect("name").to_owned();
            let resource = kube::api::ApiResource {
                group: "rbac.authorization.k8s.io".into(),
                version: "v1".into(),
                api_version: "rbac.authorization.k8s.io/v1".into(),
                kind: kind.clone(),
                plural: if kind == "ClusterRole" { "clusterroles".into() } else { "clusterrolebindings".into() },
            };
            let api: Api<kube::api::DynamicObject> = Api::all_with(admin.clone(), &resource);
            api.patch(&name, &PatchParams::apply("fairway-tests").force(), &Patch::Apply(&object))
                .await
                .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
        }
    }

    /// Registers a GPU node as GPU Feature Discovery would label it, Ready.
    pub async fn gpu_node(&self, name: &str, labels: Value, allocatable: Value) {
        let admin = self.admin().await;
        let nodes: Api<Node> = Api::all(admin);
        let mut labels = labels;
        labels["kubernetes.io/hostname"] = json!(format!("{name}-host"));
        let node: Node = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).expect("node");
        nodes.create(&PostParams::default(), &node).await.unwrap_or_else(|e| panic!("create node {name}: {e}"));
        // Admission taints a new node `not-ready` until the node lifecycle controller (off
        // here) sees it Ready; clear it as that controller would.
        let untaint = json!({"spec": {"taints": null}});
        nodes.patch(name, &PatchParams::default(), &Patch::Merge(&untaint)).await.expect("untaint node");
        self.node_ready(name, true).await;
        let status = json!({"status": {"capacity": allocatable, "allocatable": allocatable}});
        nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("node status");
    }

    /// Marks a node Ready or NotReady (since ten minutes ago, past any grace).
    pub async fn node_ready(&self, name: &str, ready: bool) {
        let nodes: Api<Node> = Api::all(self.admin().await);
        let since =
            (chrono::Utc::now() - chrono::Duration::minutes(10)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let status = json!({"status": {"conditions": [{
            "type": "Ready", "status": if ready { "True" } else { "False" }, "reason": "Test",
            "lastHeartbeatTime": since, "lastTransitionTime": since,
        }]}});
        nodes.patch_status(name, &PatchParams::default(), &Patch::Strategic(&status)).await.expect("node condition");
    }

    /// Sets a node condition of `type_` (merged with its others by type), as a health
    /// monitor such as NVIDIA's NVSentinel does: `status` since `since` (RFC 3339).
    pub async fn node_condition(&self, name: &str, type_: &str, status: bool, message: &str, since: &str) {
        let nodes: Api<Node> = Api::all(self.admin().await);
        let patch = json!({"status": {"conditions": [{
            "type": type_, "status": if status { "True" } else { "False" }, "reason": format!("{type_}Test"),
            "message": message, "lastHeartbeatTime": since, "lastTransitionTime": since,
        }]}});
        nodes.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch)).await.expect("node condition");
    }

    /// Replaces a node's taints (`[]` clears them).
    pub async fn taints(&self, name: &str, taints: Value) {
        let nodes: Api<Node> = Api::all(self.admin().await);
        let patch = json!({"spec": {"taints": taints}});
        nodes.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("node taints");
    }
}

/// The labels and allocatable resources of a node with eight H100s in `rack`, as NVIDIA's
/// GPU feature discovery labels it.
pub fn h100_node(rack: &str) -> (Value, Value) {
    (
        json!({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
               "nvidia.com/gpu.count": "8", "fairway.dev/rack": rack, "topology.kubernetes.io/zone": "zone-a",
               "fairway.dev/nvlink-domain-size": "8"}),
        json!({"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti", "pods": "110"}),
    )
}

/// A pod deleted (404) or already bound (409) while the kubelet acted: it raced Fairway,
/// as a real kubelet can, and there is nothing left to do.
fn gone(e: kube::Error) -> Result<(), kube::Error> {
    match &e {
        kube::Error::Api(s) if s.code == 404 || s.code == 409 => Ok(()),
        _ => Err(e),
    }
}

/// Plays the kubelet and the scheduler for pods, through the API.
pub struct Kubelet {
    pub client: Client,
}

impl Kubelet {
    /// Binds a pod to the node its affinity names (as the scheduler would) and reports it
    /// running.
    pub async fn run(&self, pod: &Pod) {
        let ns = pod.metadata.namespace.as_deref().expect("namespace");
        let name = pod.metadata.name.as_deref().expect("name");
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        if pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none() {
            let node = pod.metadata.annotations.as_ref().and_then(|a| a.get("fairway.dev/node")).expect("placed node");
            let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                                 "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
            pods.create_subresource::<Value, Value>("binding", name, &PostParams::default(), &binding)
                .await
                .map(drop)
                .or_else(gone)
                .unwrap_or_else(|e| panic!("bind {name}: {e}"));
        }
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let status = json!({"status": {"phase": "Running", "startTime": now, "containerStatuses": [{
            "name": "main", "ready": true, "restartCount": 0, "image": "x", "imageID": "",
            "state": {"running": {"startedAt": now}}}]}});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map(drop)
            .or_else(gone)
            .unwrap_or_else(|e| panic!("run {name}: {e}"));
    }

    /// Reports a running pod's container exited with `code`.
    pub async fn exit(&self, pod: &Pod, code: i32, reason: &str) {
        let ns = pod.metadata.namespace.as_deref().expect("namespace");
        let name = pod.metadata.name.as_deref().expect("name");
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let phase = if code == 0 { "Succeeded" } else { "Failed" };
        let status = json!({"status": {"phase": phase, "containerStatuses": [{
            "name": "main", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
            "state": {"terminated": {"exitCode": code, "reason": reason, "startedAt": now, "finishedAt": now}}}]}});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map(drop)
            .or_else(gone)
            .unwrap_or_else(|e| panic!("exit {name}: {e}"));
    }

    /// Finishes a graceful deletion: the container has exited after SIGTERM.
    pub async fn terminated(&self, pod: &Pod) {
        let ns = pod.metadata.namespace.as_deref().expect("namespace");
        let name = pod.metadata.name.as_deref().expect("name");
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let _ = pods.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() }).await;
    }
}
