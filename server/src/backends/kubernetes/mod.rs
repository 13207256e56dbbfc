//! The `kubernetes` backend: hands gangs the engine already placed to a Kubernetes cluster
//! (one Pod per replica pinned to its node, under a headless Service), reads the GPU
//! inventory from GPU Feature Discovery labels, and fences each team in a namespace of its
//! own with a GPU `ResourceQuota` and a network policy.
//!
//! Nodes, our Services and our Pods, and the other pods bound to nodes (for the CPU and
//! memory they hold), are kept current by watches (reflectors), never by polling: [`Backend::inventory`] and [`Backend::objects`] read the caches, and every change
//! a watch sees asks the reconciler for a pass. While a watch is broken the backend answers
//! `Transient` rather than from a stale cache, so the reconciler never mistakes lag for loss.
//!
//! Writes are server-side apply with one field manager ([`manifest::FIELD_MANAGER`]) and
//! names derived from the job id and attempt, so a dispatch retried after a crash rewrites the
//! same objects instead of duplicating them. The permissions all this needs are exactly
//! [`rbac::RULES`]; `deploy/kubernetes/rbac.yaml` grants them and a test holds the two equal.
//!
//! The pure parts live in [`manifest`] (what we write), [`status`] (what a gang's pods mean)
//! and [`inventory`] (what a node offers).

pub mod inventory;
pub mod manifest;
#[cfg(test)]
mod mock_tests;
pub mod rbac;
pub mod status;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use crate::domain::JobId;
use chrono::Utc;
use futures_util::StreamExt as _;
use k8s_openapi::api::{
    core::v1::{Namespace, Node, Pod, ResourceQuota, Service},
    networking::v1::NetworkPolicy,
};
use kube::{
    api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams},
    runtime::{reflector, reflector::Store, watcher, WatchStreamExt as _},
    Client, Resource, ResourceExt as _,
};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Notify;

use self::{
    inventory::{InventorySettings, NodeGpus},
    manifest::{PodSettings, ReplicaTarget},
};
use super::{
    Backend, BackendError, ClassDecl, Gang, InventoryNode, LogLine, LogQuery, ObjectStatus, Outcome, Phase, Tenant,
};

/// The most of a pod's log read at once: a replica that writes faster is read over several
/// passes.
const LOG_READ_BYTES: i64 = 1 << 20;

/// A `kubernetes` cluster's settings, from the clusters file (`FAIRWAY_CLUSTERS`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeClusterConfig {
    /// The Fairway cluster name.
    pub name: String,
    /// The API server's URL; with `token_file`, used instead of a kubeconfig.
    pub server: Option<String>,
    /// A file holding the bearer token (re-read as it rotates).
    pub token_file: Option<PathBuf>,
    /// Skip TLS verification of `server` (test clusters only).
    #[serde(default)]
    pub insecure_skip_tls_verify: bool,
    /// Only nodes matching this label selector belong to the cluster (e.g.
    /// `nvidia.com/gpu.present=true`); all nodes when unset.
    pub node_selector: Option<String>,
    /// A kubeconfig file (with `context`). When neither it nor `server` is set, credentials
    /// are inferred: `$KUBECONFIG` or `~/.kube/config` first, then the in-cluster service
    /// account. `kubeconfig` and `context` are ignored when `server` is set.
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context; its current one when unset.
    pub context: Option<String>,
    /// Team namespaces are named this plus the team.
    #[serde(default = "default_namespace_prefix")]
    pub namespace_prefix: String,
    /// Node label holding the zone.
    #[serde(default = "default_zone_label")]
    pub zone_label: String,
    /// Node label holding the rack.
    #[serde(default = "default_rack_label")]
    pub rack_label: String,
    /// Node label holding the number of GPUs per NVLink domain.
    #[serde(default = "default_nvlink_label")]
    pub nvlink_domain_label: String,
    /// Taints of GPU nodes our pods tolerate.
    #[serde(default = "default_tolerated_taints")]
    pub tolerated_taints: Vec<String>,
    /// A node NotReady this long loses its gangs.
    #[serde(default = "default_node_lost_after")]
    pub node_lost_after_seconds: u64,
    /// Node condition types (by prefix) that report a GPU fault when `True`: the node leaves
    /// the inventory and its gangs are lost from the condition's transition. NVSentinel's
    /// health monitors name theirs `Gpu...`.
    #[serde(default = "default_fault_conditions")]
    pub gpu_fault_conditions: Vec<String>,
    /// Taint keys that report a GPU fault, as NVSentinel's fault quarantine sets them.
    #[serde(default = "default_fault_taints")]
    pub gpu_fault_taints: Vec<String>,
    /// `nvidia.com/gpu.product` values → GPU class names.
    #[serde(default)]
    pub gpu_products: BTreeMap<String, String>,
}

fn default_namespace_prefix() -> String {
    "fw-".into()
}
fn default_zone_label() -> String {
    "topology.kubernetes.io/zone".into()
}
fn default_rack_label() -> String {
    "fairway.dev/rack".into()
}
fn default_nvlink_label() -> String {
    "fairway.dev/nvlink-domain-size".into()
}
fn default_tolerated_taints() -> Vec<String> {
    vec!["nvidia.com/gpu".into()]
}
fn default_node_lost_after() -> u64 {
    60
}
fn default_fault_conditions() -> Vec<String> {
    vec!["Gpu".into()]
}
fn default_fault_taints() -> Vec<String> {
    vec!["nvidia.com/gpu-xid-error".into()]
}

impl KubeClusterConfig {
    /// A client for the cluster this names.
    pub async fn client(&self) -> Result<Client, BackendError> {
        let bad = |what: &str, e: &dyn std::fmt::Display| {
            BackendError::Rejected(format!("cluster {}: {what}: {e}", self.name))
        };
        let mut config = match (&self.server, &self.kubeconfig) {
            (Some(server), _) => {
                let url = server.parse().map_err(|e| bad("server is not a URL", &e))?;
                let mut config = kube::Config::new(url);
                config.auth_info.token_file = self.token_file.as_ref().map(|p| p.display().to_string());
                config
            }
            (None, Some(path)) => {
                let file = kube::config::Kubeconfig::read_from(path).map_err(|e| bad("kubeconfig", &e))?;
                let options = kube::config::KubeConfigOptions { context: self.context.clone(), ..Default::default() };
                kube::Config::from_custom_kubeconfig(file, &options).await.map_err(|e| bad("kubeconfig", &e))?
            }
            (None, None) => kube::Config::infer().await.map_err(|e| bad("no in-cluster or KUBECONFIG access", &e))?,
        };
        config.accept_invalid_certs |= self.insecure_skip_tls_verify;
        config.connect_timeout = Some(Duration::from_secs(10));
        Client::try_from(config).map_err(|e| bad("client", &e))
    }
}

/// Whom the watches wake when they see a change.
#[derive(Clone)]
pub struct Wake {
    /// The reconciler (every change).
    pub reconcile: Arc<Notify>,
    /// The inventory sync (node changes).
    pub inventory: Arc<Notify>,
}

/// Whether each watch is connected and has listed everything once.
#[derive(Default)]
struct WatchHealth {
    nodes: AtomicBool,
    services: AtomicBool,
    pods: AtomicBool,
    others: AtomicBool,
}

/// The backend of one Kubernetes cluster.
pub struct KubeBackend {
    client: Client,
    config: KubeClusterConfig,
    inventory: InventorySettings,
    pods_settings: PodSettings,
    nodes: Store<Node>,
    services: Store<Service>,
    pods: Store<Pod>,
    /// Pods Fairway did not make that are bound to a node and not finished (DaemonSets' and
    /// any other workload's): what they ask is not the replicas' to have.
    others: Store<Pod>,
    health: Arc<WatchHealth>,
    /// Namespaces known to exist with their policy, and the GPU limits last applied to each.
    namespaces: Mutex<HashSet<String>>,
    quotas: Mutex<HashMap<String, BTreeMap<String, u32>>>,
    watches: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for KubeBackend {
    fn drop(&mut self) {
        for watch in &self.watches {
            watch.abort();
        }
    }
}

/// How long a call waits for the watch caches to fill after a (re)start.
const READY_WAIT: Duration = Duration::from_secs(15);

impl KubeBackend {
    /// Starts the watches of nodes and of our Services and Pods; each change they see wakes
    /// the reconciler, and node changes the inventory sync too.
    pub fn start(client: Client, config: KubeClusterConfig, wake: Wake) -> Self {
        let inventory = InventorySettings {
            products: config.gpu_products.clone(),
            zone_label: config.zone_label.clone(),
            rack_label: config.rack_label.clone(),
            nvlink_domain_label: config.nvlink_domain_label.clone(),
            tolerated_taints: config.tolerated_taints.clone(),
            fault_conditions: config.gpu_fault_conditions.clone(),
            fault_taints: config.gpu_fault_taints.clone(),
        };
        let pods_settings =
            PodSettings { cluster: config.name.clone(), tolerated_taints: config.tolerated_taints.clone() };
        let health = Arc::new(WatchHealth::default());
        let selector = manifest::managed_selector(&config.name);
        let ours = watcher::Config::default().labels(&selector);
        // Every node is watched, so a pod's node that merely stops matching `node_selector`
        // is not taken for lost; the selector picks the inventory from them.
        let (nodes, w1) = watch(
            Api::all(client.clone()),
            watcher::Config::default(),
            &config.name,
            "nodes",
            vec![wake.reconcile.clone(), wake.inventory.clone()],
            {
                let h = health.clone();
                move |ok| h.nodes.store(ok, Ordering::Relaxed)
            },
        );
        let (services, w2) =
            watch(Api::all(client.clone()), ours.clone(), &config.name, "services", vec![wake.reconcile.clone()], {
                let h = health.clone();
                move |ok| h.services.store(ok, Ordering::Relaxed)
            });
        let (pods, w3) = watch(Api::all(client.clone()), ours, &config.name, "pods", vec![wake.reconcile], {
            let h = health.clone();
            move |ok| h.pods.store(ok, Ordering::Relaxed)
        });
        let (others, w4) = watch(
            Api::all(client.clone()),
            others_watched(&config.name),
            &config.name,
            "other pods",
            vec![wake.inventory],
            {
                let h = health.clone();
                move |ok| h.others.store(ok, Ordering::Relaxed)
            },
        );
        Self {
            client,
            config,
            inventory,
            pods_settings,
            nodes,
            services,
            pods,
            others,
            health,
            namespaces: Mutex::default(),
            quotas: Mutex::default(),
            watches: vec![w1, w2, w3, w4],
        }
    }

    /// Waits until every watch has listed its objects once; then whether all of them are
    /// connected now. A watch that resumes after a broken connection says nothing until the
    /// next change, so callers read the API directly while this is false.
    async fn ready(&self) -> Result<bool, BackendError> {
        let wait = async {
            let _ = self.nodes.wait_until_ready().await;
            let _ = self.services.wait_until_ready().await;
            let _ = self.pods.wait_until_ready().await;
        };
        tokio::time::timeout(READY_WAIT, wait)
            .await
            .map_err(|_| self.transient("the watches have not listed the cluster yet"))?;
        let h = &self.health;
        Ok(h.nodes.load(Ordering::Relaxed) && h.services.load(Ordering::Relaxed) && h.pods.load(Ordering::Relaxed))
    }

    /// Nodes, our Services and our Pods: from the watch caches while they are connected,
    /// else listed from the API server (one call each).
    async fn state(&self) -> Result<(Vec<Arc<Node>>, Vec<Arc<Service>>, Vec<Arc<Pod>>), BackendError> {
        if self.ready().await? {
            return Ok((self.nodes.state(), self.services.state(), self.pods.state()));
        }
        let cluster = &self.config.name;
        let ours = ListParams::default().labels(&manifest::managed_selector(cluster));
        let nodes = Api::<Node>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| api_error(cluster, "list nodes", e))?;
        let services = Api::<Service>::all(self.client.clone())
            .list(&ours)
            .await
            .map_err(|e| api_error(cluster, "list services", e))?;
        let pods =
            Api::<Pod>::all(self.client.clone()).list(&ours).await.map_err(|e| api_error(cluster, "list pods", e))?;
        Ok((arcs(nodes.items), arcs(services.items), arcs(pods.items)))
    }

    /// The pods that are not ours on the nodes: from their watch cache while it is
    /// connected, else listed from the API server.
    async fn others(&self) -> Result<Vec<Arc<Pod>>, BackendError> {
        let listed = tokio::time::timeout(READY_WAIT, self.others.wait_until_ready()).await.is_ok();
        if listed && self.health.others.load(Ordering::Relaxed) {
            return Ok(self.others.state());
        }
        let cluster = &self.config.name;
        let params = ListParams::default().labels(&others_selector(cluster)).fields(OTHERS_FIELDS);
        let pods = Api::<Pod>::all(self.client.clone())
            .list(&params)
            .await
            .map_err(|e| api_error(cluster, "list other pods", e))?;
        Ok(arcs(pods.items))
    }

    fn transient(&self, why: &str) -> BackendError {
        BackendError::Transient(format!("cluster {}: {why}", self.config.name))
    }

    fn gpus(&self) -> Vec<NodeGpus> {
        self.gpus_of(self.nodes.state())
    }

    /// What the nodes matching `node_selector` offer.
    fn gpus_of(&self, mut nodes: Vec<Arc<Node>>) -> Vec<NodeGpus> {
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        nodes.iter().filter(|n| self.selected(n)).flat_map(|n| inventory::node_gpus(n, &self.inventory)).collect()
    }

    /// Whether a node belongs to the cluster: it matches `node_selector`.
    fn selected(&self, node: &Node) -> bool {
        let labels = node.metadata.labels.clone().unwrap_or_default();
        self.config.node_selector.as_deref().is_none_or(|s| inventory::selector_matches(s, &labels))
    }

    /// The resource a class is requested by: as a node offering it says, else by its name.
    fn resource_of(&self, class: &str, gpus: &[NodeGpus]) -> String {
        gpus.iter().find(|g| g.entry.gpu_class == class).map_or_else(
            || match class.split_once(".mig-") {
                Some((_, profile)) => format!("nvidia.com/mig-{profile}"),
                None => inventory::GPU_RESOURCE.to_owned(),
            },
            |g| g.resource.clone(),
        )
    }

    fn apply_params() -> PatchParams {
        PatchParams::apply(manifest::FIELD_MANAGER).force()
    }

    /// The team's namespace with its network policy, applied once per process.
    async fn ensure_namespace(&self, team: &str) -> Result<String, BackendError> {
        let name = manifest::namespace_for(&self.config.namespace_prefix, team);
        if self.namespaces.lock().expect("namespace cache").contains(&name) {
            return Ok(name);
        }
        let ns = manifest::namespace(&name, team, &self.config.name);
        Api::<Namespace>::all(self.client.clone())
            .patch(&name, &Self::apply_params(), &Patch::Apply(&ns))
            .await
            .map_err(|e| api_error(&self.config.name, "apply namespace", e))?;
        let policy = manifest::network_policy(&name, team, &self.config.name);
        Api::<NetworkPolicy>::namespaced(self.client.clone(), &name)
            .patch(manifest::NETWORK_POLICY_NAME, &Self::apply_params(), &Patch::Apply(&policy))
            .await
            .map_err(|e| api_error(&self.config.name, "apply network policy", e))?;
        self.namespaces.lock().expect("namespace cache").insert(name.clone());
        Ok(name)
    }

    /// Where a gang's objects are: the namespace of its Service or pods in the cache, or
    /// asked of the API server when the cache has not seen them yet.
    async fn namespace_of(&self, object: &str) -> Result<Option<String>, BackendError> {
        let cached =
            self.services.find(|s| s.metadata.name.as_deref() == Some(object)).and_then(|s| s.namespace()).or_else(
                || self.pods.find(|p| label(p, manifest::OBJECT_LABEL) == Some(object)).and_then(|p| p.namespace()),
            );
        if cached.is_some() {
            return Ok(cached);
        }
        let selector = format!("{},{}={object}", manifest::managed_selector(&self.config.name), manifest::OBJECT_LABEL);
        let params = ListParams::default().labels(&selector);
        let services = Api::<Service>::all(self.client.clone())
            .list_metadata(&params)
            .await
            .map_err(|e| api_error(&self.config.name, "find gang", e))?;
        if let Some(ns) = services.items.first().and_then(|s| s.metadata.namespace.clone()) {
            return Ok(Some(ns));
        }
        let pods = Api::<Pod>::all(self.client.clone())
            .list_metadata(&params)
            .await
            .map_err(|e| api_error(&self.config.name, "find gang", e))?;
        Ok(pods.items.first().and_then(|p| p.metadata.namespace.clone()))
    }

    async fn delete_pods(&self, namespace: &str, object: &str, grace: Option<Duration>) -> Result<(), BackendError> {
        let selector = format!("{}={object}", manifest::OBJECT_LABEL);
        // Whole seconds, rounded up: the grace is what the application was promised at least.
        let seconds = |g: Duration| g.as_secs() + u64::from(g.subsec_nanos() > 0);
        let params = DeleteParams {
            grace_period_seconds: grace.map(|g| u32::try_from(seconds(g)).unwrap_or(u32::MAX)),
            ..DeleteParams::background()
        };
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .delete_collection(&params, &ListParams::default().labels(&selector))
            .await
            .map(|_| ())
            .or_else(not_found_is_ok)
            .map_err(|e| api_error(&self.config.name, "delete pods", e))
    }
}

/// Pods bound to a node and not finished: the field selector of [`KubeBackend::others`].
const OTHERS_FIELDS: &str = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed";

/// Pods this Fairway cluster did not make (a label `key!=value` also matches pods without
/// the label).
fn others_selector(cluster: &str) -> String {
    format!("{}!={cluster}", manifest::CLUSTER_LABEL)
}

/// The watch of the pods that are not ours on the nodes.
fn others_watched(cluster: &str) -> watcher::Config {
    watcher::Config::default().labels(&others_selector(cluster)).fields(OTHERS_FIELDS)
}

/// Starts one reflector; `healthy` follows the watch (false on errors, true once events flow
/// again).
fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    cluster: &str,
    what: &'static str,
    changed: Vec<Arc<Notify>>,
    healthy: impl Fn(bool) + Send + 'static,
) -> (Store<K>, tokio::task::JoinHandle<()>)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let cluster = cluster.to_owned();
    let stream = watcher(api, config).default_backoff().reflect(writer);
    let task = tokio::spawn(async move {
        futures_util::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                Ok(_) => {
                    healthy(true);
                    for wake in &changed {
                        wake.notify_one();
                    }
                }
                Err(e) => {
                    healthy(false);
                    tracing::warn!(cluster, what, error = %e, "kubernetes watch failed; retrying");
                }
            }
        }
    });
    (store, task)
}

fn arcs<K>(items: Vec<K>) -> Vec<Arc<K>> {
    items.into_iter().map(Arc::new).collect()
}

/// A Kubernetes timestamp as the rest of Fairway keeps time.
fn time(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> Option<chrono::DateTime<Utc>> {
    chrono::DateTime::from_timestamp(t.0.as_second(), u32::try_from(t.0.subsec_nanosecond()).unwrap_or(0))
}

fn label<'a, K: Resource>(obj: &'a K, key: &str) -> Option<&'a str> {
    obj.meta().labels.as_ref()?.get(key).map(String::as_str)
}

fn not_found_is_ok<T: Default>(e: kube::Error) -> Result<T, kube::Error> {
    match &e {
        kube::Error::Api(status) if status.code == 404 => Ok(T::default()),
        _ => Err(e),
    }
}

/// Maps an API error to the dispatcher's retry classes: throttling, server errors and
/// network trouble are transient; a quota refusal is a capacity shortage; an invalid object
/// can never succeed.
pub fn api_error(cluster: &str, what: &str, e: kube::Error) -> BackendError {
    match &e {
        kube::Error::Api(status) => {
            let message = format!("cluster {cluster}: {what}: {} ({})", status.message, status.reason);
            // An admission webhook or Pod Security refusing the pod will refuse it again.
            let refused_by_policy =
                status.message.contains("admission webhook") || status.message.contains("violates PodSecurity");
            match status.code {
                403 if status.message.contains("exceeded quota") => BackendError::CapacityUnavailable(message),
                403 if refused_by_policy => BackendError::Rejected(message),
                400 | 422 => BackendError::Rejected(message),
                _ => BackendError::Transient(message),
            }
        }
        other => BackendError::Transient(format!("cluster {cluster}: {what}: {other}")),
    }
}

#[async_trait::async_trait]
impl Backend for KubeBackend {
    fn kind(&self) -> &'static str {
        "kubernetes"
    }

    fn declared_classes(&self) -> Vec<ClassDecl> {
        let mut seen = HashSet::new();
        self.gpus().into_iter().filter(|g| seen.insert(g.class.name.clone())).map(|g| g.class).collect()
    }

    async fn inventory(&self) -> Result<Vec<InventoryNode>, BackendError> {
        let (nodes, _, _) = self.state().await?;
        let others = self.others().await?;
        let held = inventory::held_by_pods(others.iter().map(AsRef::as_ref));
        Ok(inventory::less_held(self.gpus_of(nodes).into_iter().map(|g| g.entry).collect(), &held))
    }

    async fn faults(&self) -> Result<Vec<super::NodeFault>, BackendError> {
        let now = Utc::now();
        let (nodes, _, _) = self.state().await?;
        Ok(nodes
            .iter()
            .filter(|n| self.selected(n))
            .filter_map(|n| {
                let fault = inventory::fault(n, &self.inventory, now)?;
                Some(super::NodeFault { node: n.metadata.name.clone()?, since: fault.since, why: fault.why })
            })
            .collect())
    }

    async fn sync_tenants(&self, tenants: &[Tenant]) -> Result<(), BackendError> {
        let gpus = self.gpus();
        for tenant in tenants {
            let namespace = self.ensure_namespace(&tenant.team).await?;
            let mut limits: BTreeMap<String, u32> = BTreeMap::new();
            for (class, n) in &tenant.gpu_limits {
                *limits.entry(self.resource_of(class, &gpus)).or_default() += n;
            }
            if self.quotas.lock().expect("quota cache").get(&namespace) == Some(&limits) {
                continue;
            }
            let quota = manifest::resource_quota(&namespace, &tenant.team, &self.config.name, &limits);
            Api::<ResourceQuota>::namespaced(self.client.clone(), &namespace)
                .patch(manifest::QUOTA_NAME, &Self::apply_params(), &Patch::Apply(&quota))
                .await
                .map_err(|e| api_error(&self.config.name, "apply resource quota", e))?;
            self.quotas.lock().expect("quota cache").insert(namespace, limits);
        }
        Ok(())
    }

    async fn submit(&self, gang: &Gang) -> Result<(), BackendError> {
        let namespace = self.ensure_namespace(&gang.team).await?;
        let result = self.create_gang(gang, &namespace).await;
        if let Err(BackendError::Transient(message)) = &result {
            // The namespace was deleted behind our back: make it again on the retry.
            if message.contains("NotFound") {
                self.namespaces.lock().expect("namespace cache").remove(&namespace);
            }
        }
        result
    }

    async fn stop(&self, object: &str, grace: Duration) -> Result<(), BackendError> {
        self.stop_gang(object, grace).await
    }

    /// Deletes the service's Service from the team's namespace.
    async fn withdraw(&self, team: &str, service: &str) -> Result<(), BackendError> {
        let namespace = manifest::namespace_for(&self.config.namespace_prefix, team);
        Api::<Service>::namespaced(self.client.clone(), &namespace)
            .delete(&manifest::endpoint_name(service), &DeleteParams::background())
            .await
            .map(|_| ())
            .or_else(not_found_is_ok)
            .map_err(|e| api_error(&self.config.name, "delete service endpoint", e))
    }

    /// The cluster DNS name of the service's Service in the team's namespace.
    fn endpoint(&self, team: &str, service: &crate::backends::ServiceBinding) -> Result<String, BackendError> {
        let namespace = manifest::namespace_for(&self.config.namespace_prefix, team);
        Ok(format!("{}.{namespace}.svc:{}", manifest::endpoint_name(&service.name), service.port))
    }

    async fn objects(&self) -> Result<Vec<ObjectStatus>, BackendError> {
        self.gang_statuses().await
    }

    async fn logs(&self, query: &LogQuery) -> Result<Vec<LogLine>, BackendError> {
        let Some(namespace) = self.namespace_of(&query.object).await? else { return Ok(Vec::new()) };
        let pod = manifest::pod_name(&query.object, usize::try_from(query.replica).unwrap_or(usize::MAX));
        let params = LogParams {
            container: Some(manifest::CONTAINER.to_owned()),
            timestamps: true,
            // Whole seconds, rounded down: the API server filters by the second (and kube
            // would round to the nearest, losing the lines of a second's second half).
            since_time: query
                .since
                .map(|at| k8s_openapi::jiff::Timestamp::from_second(at.timestamp()))
                .transpose()
                .ok()
                .flatten(),
            limit_bytes: Some(LOG_READ_BYTES),
            ..LogParams::default()
        };
        match Api::<Pod>::namespaced(self.client.clone(), &namespace).logs(&pod, &params).await {
            Ok(text) => Ok(status::log_lines(&text, LOG_READ_BYTES, query.limit)),
            // No such pod (deleted), or a container not started yet or without a node: nothing
            // to read now.
            Err(kube::Error::Api(e)) if e.code == 400 || e.code == 404 => Ok(Vec::new()),
            Err(e) => Err(api_error(&self.config.name, "read pod log", e)),
        }
    }

    async fn delete(&self, object: &str) -> Result<(), BackendError> {
        self.delete_gang(object).await
    }
}

impl KubeBackend {
    /// The gang's Service, then its pods, then the Service marked complete.
    async fn create_gang(&self, gang: &Gang, namespace: &str) -> Result<(), BackendError> {
        // The engine places by GPUs, not by node labels: a node that lacks a label the job's
        // node selector asks for would leave its pod pending for ever, so the job is refused
        // now, saying which.
        if !gang.workload.node_selector.is_empty() {
            let nodes = self.nodes.state();
            for slot in &gang.replicas {
                let labels = nodes
                    .iter()
                    .find(|n| n.metadata.name.as_deref() == Some(slot.node.as_str()))
                    .and_then(|n| n.metadata.labels.clone())
                    .unwrap_or_default();
                if let Some((k, v)) = gang.workload.node_selector.iter().find(|(k, v)| labels.get(*k) != Some(*v)) {
                    return Err(BackendError::Rejected(format!(
                        "node {} was chosen for its GPUs but lacks the label {k}={v} the job's node_selector asks for; Fairway does not place by node labels yet",
                        slot.node
                    )));
                }
            }
        }
        let cluster = &self.config.name;
        let namespace = namespace.to_owned();
        let services = Api::<Service>::namespaced(self.client.clone(), &namespace);
        // A gang already complete, or already asked to stop, is left alone: re-applying it
        // would resurrect pods that were stopped.
        let existing = services.get_opt(&gang.object).await.map_err(|e| api_error(cluster, "read service", e))?;
        if let Some(annotations) = existing.as_ref().and_then(|s| s.metadata.annotations.as_ref()) {
            if annotations.contains_key(manifest::STOP_DEADLINE_ANNOTATION)
                || annotations.get(manifest::COMPLETE_ANNOTATION).is_some_and(|v| v == "true")
            {
                return Ok(());
            }
        }
        if let Some(binding) = &gang.service {
            let endpoint = manifest::endpoint(&gang.team, binding, &namespace, cluster);
            services
                .patch(&manifest::endpoint_name(&binding.name), &Self::apply_params(), &Patch::Apply(&endpoint))
                .await
                .map_err(|e| api_error(cluster, "apply service endpoint", e))?;
        }
        let service = manifest::service(gang, &namespace, cluster, false);
        let applied = services
            .patch(&gang.object, &Self::apply_params(), &Patch::Apply(&service))
            .await
            .map_err(|e| api_error(cluster, "apply service", e))?;
        let owner_uid = applied.metadata.uid.clone().unwrap_or_default();
        let gpus = self.gpus();
        let pods = Api::<Pod>::namespaced(self.client.clone(), &namespace);
        for (rank, slot) in gang.replicas.iter().enumerate() {
            let node = gpus.iter().find(|g| g.entry.name == slot.node && g.entry.gpu_class == gang.gpu_class);
            let target = ReplicaTarget {
                hostname: node.map_or_else(|| slot.node.clone(), |g| g.hostname.clone()),
                node: slot.node.clone(),
                resource: self.resource_of(&gang.gpu_class, &gpus),
                count: slot.gpus.len() as u32,
            };
            let pod = manifest::pod(gang, &namespace, rank, &target, &owner_uid, &self.pods_settings);
            pods.patch(&manifest::pod_name(&gang.object, rank), &Self::apply_params(), &Patch::Apply(&pod))
                .await
                .map_err(|e| api_error(cluster, "apply pod", e))?;
        }
        let complete = manifest::service(gang, &namespace, cluster, true);
        services
            .patch(&gang.object, &Self::apply_params(), &Patch::Apply(&complete))
            .await
            .map_err(|e| api_error(cluster, "mark gang complete", e))?;
        tracing::debug!(cluster, object = %gang.object, namespace, replicas = gang.replicas.len(), "gang created");
        Ok(())
    }

    /// Records the stop deadline, then deletes the gang's pods with the grace period.
    async fn stop_gang(&self, object: &str, grace: Duration) -> Result<(), BackendError> {
        let Some(namespace) = self.namespace_of(object).await? else { return Ok(()) };
        let services = Api::<Service>::namespaced(self.client.clone(), &namespace);
        // The deadline is recorded by a field manager of its own, so a re-applied Service
        // (a retried dispatch) cannot remove it; the first stop's deadline is kept.
        let service = services.get_opt(object).await.map_err(|e| api_error(&self.config.name, "read service", e))?;
        let asked = service
            .as_ref()
            .and_then(|s| s.metadata.annotations.as_ref())
            .is_some_and(|a| a.contains_key(manifest::STOP_DEADLINE_ANNOTATION));
        if service.is_some() && !asked {
            let asked_at = Utc::now();
            let deadline = asked_at + chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::MAX);
            let patch = json!({"metadata": {"annotations": {
                manifest::STOP_DEADLINE_ANNOTATION: deadline.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                manifest::STOP_ASKED_ANNOTATION: asked_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            }}});
            services
                .patch(object, &PatchParams::apply("fairway-stop"), &Patch::Merge(&patch))
                .await
                .map(|_| ())
                .or_else(not_found_is_ok)
                .map_err(|e| api_error(&self.config.name, "mark gang stopping", e))?;
        }
        // SIGTERM now, SIGKILL after the grace period: the kubelet's deletion contract. At
        // least a second: zero would remove the pod before its container is killed, and its
        // GPUs could be handed out while the old process still holds them.
        self.delete_pods(&namespace, object, Some(grace.max(Duration::from_secs(1)))).await
    }

    /// Every gang of ours with its phase, from the watch caches (or the API while a watch
    /// is down).
    async fn gang_statuses(&self) -> Result<Vec<ObjectStatus>, BackendError> {
        let (nodes, services, pods) = self.state().await?;
        let now = Utc::now();
        let after = chrono::Duration::seconds(self.config.node_lost_after_seconds as i64);
        let mut lost = inventory::lost_nodes(nodes.iter().map(std::convert::AsRef::as_ref), now, after);
        // A node whose GPUs fault loses its gangs at once, from the instant of the fault.
        let faults: HashMap<String, inventory::Fault> = nodes
            .iter()
            .filter_map(|n| Some((n.metadata.name.clone()?, inventory::fault(n, &self.inventory, now)?)))
            .collect();
        lost.extend(faults.keys().cloned());
        let known: HashSet<String> = nodes.iter().filter_map(|n| n.metadata.name.clone()).collect();
        let mut gangs: BTreeMap<String, (Option<&Service>, Vec<&Pod>)> = BTreeMap::new();
        for service in &services {
            if let Some(object) = label(service.as_ref(), manifest::OBJECT_LABEL) {
                gangs.entry(object.to_owned()).or_default().0 = Some(service.as_ref());
            }
        }
        for pod in &pods {
            if let Some(node) = status::pod_node(pod).filter(|n| !known.contains(*n)) {
                lost.insert(node.to_owned());
            }
            if let Some(object) = label(pod.as_ref(), manifest::OBJECT_LABEL) {
                gangs.entry(object.to_owned()).or_default().1.push(pod.as_ref());
            }
        }
        let mut out = Vec::with_capacity(gangs.len());
        for (object, (service, gang_pods)) in gangs {
            let any: Option<&dyn ResourceMeta> =
                service.map(|s| s as &dyn ResourceMeta).or_else(|| gang_pods.first().map(|p| *p as &dyn ResourceMeta));
            let Some(meta) = any else { continue };
            let job_id = meta.label(manifest::JOB_LABEL).and_then(|v| v.parse::<JobId>().ok());
            let attempt = meta.label(manifest::ATTEMPT_LABEL).and_then(|v| v.parse::<i32>().ok());
            let (Some(job_id), Some(attempt)) = (job_id, attempt) else {
                tracing::warn!(cluster = %self.config.name, object, "object with our labels but no job id; ignored");
                continue;
            };
            let (mut phase, mut stop_requested) = status::gang_phase(service, &gang_pods, &lost, now);
            // The Service and Pod caches are separate watches: a pod the service says exists
            // may not have reached its cache yet. A loss is confirmed from the API first.
            if matches!(phase, Phase::Finished { outcome: Outcome::NodeLost, .. }) {
                if let Some(namespace) = service.and_then(|s| s.metadata.namespace.clone()) {
                    let selector = format!("{}={object}", manifest::OBJECT_LABEL);
                    let live = Api::<Pod>::namespaced(self.client.clone(), &namespace)
                        .list(&ListParams::default().labels(&selector))
                        .await
                        .map_err(|e| api_error(&self.config.name, "list a gang's pods", e))?;
                    let live: Vec<&Pod> = live.items.iter().collect();
                    (phase, stop_requested) = status::gang_phase(service, &live, &lost, now);
                }
            }
            // Its time ends when its GPUs failed, not when the fault was seen.
            if let Phase::Finished { outcome: Outcome::NodeLost, started_at, ended_at } = &mut phase {
                let failed = gang_pods.iter().filter_map(|p| faults.get(status::pod_node(p)?)).map(|f| f.since).min();
                if let Some(failed) = failed {
                    *ended_at = started_at.map_or(failed, |s| failed.max(s)).min(*ended_at);
                    tracing::warn!(cluster = %self.config.name, object, failed = %failed, "a node of the gang reports a GPU fault");
                }
            }
            out.push(ObjectStatus { object, job_id, attempt, phase, stop_requested, next_change: None });
        }
        Ok(out)
    }

    /// Removes a finished or unknown gang: its pods, then its Service.
    async fn delete_gang(&self, object: &str) -> Result<(), BackendError> {
        let Some(namespace) = self.namespace_of(object).await? else { return Ok(()) };
        self.delete_pods(&namespace, object, Some(Duration::ZERO)).await?;
        Api::<Service>::namespaced(self.client.clone(), &namespace)
            .delete(object, &DeleteParams::background())
            .await
            .map(|_| ())
            .or_else(not_found_is_ok)
            .map_err(|e| api_error(&self.config.name, "delete service", e))
    }
}

/// Labels of a Service or a Pod, whichever of a gang's objects is at hand.
trait ResourceMeta {
    fn label(&self, key: &str) -> Option<&str>;
}

impl<K: Resource> ResourceMeta for K {
    fn label(&self, key: &str) -> Option<&str> {
        label(self, key)
    }
}
