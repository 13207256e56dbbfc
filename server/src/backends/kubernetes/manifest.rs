//! The Kubernetes objects Fairway writes, built as pure functions of the gang and the
//! cluster settings so their exact shape is unit-tested and reviewed in one place.
//!
//! Per team: a namespace (Pod Security `restricted` enforced), a `ResourceQuota` on GPUs
//! equal to the team's platform limit (a second fence behind the engine), and a network
//! policy that admits traffic only from the team's own pods.
//!
//! Per gang: a headless Service (the gang's anchor and rendezvous name; its annotations say
//! how many replicas the gang has, whether every pod was created and whether we asked it to
//! stop) and one Pod per replica, pinned to the node the engine chose, owned by the Service.
//! Names derive from the job id and attempt, so a retried dispatch rewrites the same objects.
//!
//! Nothing the user submits reaches a field that could widen its privileges: the image,
//! command, environment, (valid, non-reserved) labels, CPU and memory, claims and Secrets
//! of the team's own namespace by name, image pull secrets and a node selector (beside the
//! node the engine chose) are all it can set. The security context, service account token,
//! host namespaces and namespace are ours: a name the job gives is looked up in the pod's
//! namespace, the team's, so it never reaches another team's objects.

use std::collections::BTreeMap;

use k8s_openapi::api::{
    core::v1::{Namespace, Pod, ResourceQuota, Service},
    networking::v1::NetworkPolicy,
};
use serde_json::{json, Value};

use crate::backends::{Gang, ServiceBinding};

/// Label every object we create carries; watches select on it.
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "fairway");
/// The Fairway cluster an object belongs to (one Kubernetes cluster may back several).
pub const CLUSTER_LABEL: &str = "fairway.dev/cluster";
/// The gang (backend object name) a Service or Pod belongs to.
pub const OBJECT_LABEL: &str = "fairway.dev/object";
pub const JOB_LABEL: &str = "fairway.dev/job-id";
pub const ATTEMPT_LABEL: &str = "fairway.dev/attempt";
pub const TEAM_LABEL: &str = "fairway.dev/team";
pub const PRIORITY_LABEL: &str = "fairway.dev/priority-class";
pub const RANK_LABEL: &str = "fairway.dev/rank";
/// The service a replica's pod serves, which the service's own Service selects.
pub const SERVICE_LABEL: &str = "fairway.dev/service";
/// Service annotation: the gang's replica count.
pub const REPLICAS_ANNOTATION: &str = "fairway.dev/replicas";
/// Service annotation, set once every pod of the gang exists: from then on a missing pod
/// means it vanished, not that dispatch is still under way.
pub const COMPLETE_ANNOTATION: &str = "fairway.dev/complete";
/// Service annotation: when the pods must be gone by after we asked the gang to stop
/// (RFC 3339); its presence means a stop was requested.
pub const STOP_DEADLINE_ANNOTATION: &str = "fairway.dev/stop-deadline";
/// Service annotation: when we asked the gang to stop (RFC 3339), written with the deadline.
/// Pods that all exited 0 before it finished on their own; after it, exit 0 is how an
/// application answers SIGTERM (a checkpoint written), and the job is not done.
pub const STOP_ASKED_ANNOTATION: &str = "fairway.dev/stop-asked";
/// Pod annotation: the node the engine placed the replica on.
pub const NODE_ANNOTATION: &str = "fairway.dev/node";
/// The field manager of every server-side apply.
pub const FIELD_MANAGER: &str = "fairway";
/// The name of the one container of every pod we write: whose log is the replica's.
pub const CONTAINER: &str = "main";
/// The port rank 0 listens on for rendezvous (`MASTER_PORT`).
pub const RENDEZVOUS_PORT: u16 = 29500;
/// Name of the per-team GPU quota.
pub const QUOTA_NAME: &str = "fairway-gpus";
/// Name of the per-team network policy.
pub const NETWORK_POLICY_NAME: &str = "fairway-team-isolation";
/// The user and group jobs run as: Pod Security `restricted` forbids root.
pub const RUN_AS_ID: i64 = 1000;

/// How the gang's pods are shaped beyond what the gang says.
#[derive(Debug, Clone)]
pub struct PodSettings {
    /// The Fairway cluster name, written into [`CLUSTER_LABEL`].
    pub cluster: String,
    /// Taint keys on GPU nodes that our pods tolerate (e.g. `nvidia.com/gpu`).
    pub tolerated_taints: Vec<String>,
}

/// The namespace of a team's jobs: `prefix` + team, shortened with a hash when the result
/// would not be a DNS label.
pub fn namespace_for(prefix: &str, team: &str) -> String {
    let name = format!("{prefix}{team}");
    if name.len() <= 63 {
        return name;
    }
    use sha2::Digest as _;
    let digest: String = sha2::Sha256::digest(name.as_bytes()).iter().take(4).map(|b| format!("{b:02x}")).collect();
    format!("{}-{digest}", &name[..63 - digest.len() - 1].trim_end_matches('-'))
}

/// A replica's pod name.
pub fn pod_name(object: &str, rank: usize) -> String {
    format!("{object}-{rank}")
}

fn managed_labels(cluster: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()), (CLUSTER_LABEL.to_owned(), cluster.to_owned())])
}

/// The label selector of every object of ours on `cluster`.
pub fn managed_selector(cluster: &str) -> String {
    format!("{}={},{CLUSTER_LABEL}={cluster}", MANAGED_BY.0, MANAGED_BY.1)
}

/// A team's namespace.
pub fn namespace(name: &str, team: &str, cluster: &str) -> Namespace {
    let mut labels = managed_labels(cluster);
    labels.insert(TEAM_LABEL.into(), team.into());
    // Enforced by the Pod Security admission controller (Kubernetes 1.23+); older servers
    // keep the labels and the pod spec below satisfies the profile anyway.
    labels.insert("pod-security.kubernetes.io/enforce".into(), "restricted".into());
    labels.insert("pod-security.kubernetes.io/enforce-version".into(), "latest".into());
    labels.insert("pod-security.kubernetes.io/warn".into(), "restricted".into());
    from_json(json!({
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": { "name": name, "labels": labels },
    }))
}

/// The team's GPU quota in its namespace: `limits` maps a Kubernetes resource name
/// (`nvidia.com/gpu`, `nvidia.com/mig-3g.40gb`) to the most GPUs the platform lets the team
/// hold. Extended resources can only be fenced on requests.
pub fn resource_quota(namespace: &str, team: &str, cluster: &str, limits: &BTreeMap<String, u32>) -> ResourceQuota {
    let mut labels = managed_labels(cluster);
    labels.insert(TEAM_LABEL.into(), team.into());
    let mut hard: BTreeMap<String, String> =
        limits.iter().map(|(resource, n)| (format!("requests.{resource}"), n.to_string())).collect();
    if hard.is_empty() {
        hard.insert("requests.nvidia.com/gpu".into(), "0".into());
    }
    from_json(json!({
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": { "name": QUOTA_NAME, "namespace": namespace, "labels": labels },
        "spec": { "hard": hard },
    }))
}

/// Denies ingress from everywhere but the team's own pods (gangs rendezvous inside the
/// namespace).
pub fn network_policy(namespace: &str, team: &str, cluster: &str) -> NetworkPolicy {
    let mut labels = managed_labels(cluster);
    labels.insert(TEAM_LABEL.into(), team.into());
    from_json(json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": { "name": NETWORK_POLICY_NAME, "namespace": namespace, "labels": labels },
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress"],
            "ingress": [{ "from": [{ "podSelector": {} }] }],
        },
    }))
}

fn gang_labels(gang: &Gang, cluster: &str) -> BTreeMap<String, String> {
    let mut labels = managed_labels(cluster);
    labels.insert(OBJECT_LABEL.into(), gang.object.clone());
    labels.insert(JOB_LABEL.into(), gang.job_id.to_string());
    labels.insert(ATTEMPT_LABEL.into(), gang.attempt.to_string());
    labels.insert(TEAM_LABEL.into(), gang.team.clone());
    labels.insert(PRIORITY_LABEL.into(), gang.priority_class.clone());
    labels
}

/// The gang's headless Service: its anchor (owner of the pods) and the rendezvous name
/// `MASTER_ADDR` resolves through. `complete` marks that every pod exists.
pub fn service(gang: &Gang, namespace: &str, cluster: &str, complete: bool) -> Service {
    let mut annotations = BTreeMap::from([(REPLICAS_ANNOTATION.to_owned(), gang.replicas.len().to_string())]);
    if complete {
        annotations.insert(COMPLETE_ANNOTATION.into(), "true".into());
    }
    from_json(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": gang.object,
            "namespace": namespace,
            "labels": gang_labels(gang, cluster),
            "annotations": annotations,
        },
        "spec": {
            "clusterIP": "None",
            "selector": { OBJECT_LABEL: gang.object },
            // Ranks must find each other before they are ready.
            "publishNotReadyAddresses": true,
            // `protocol` is part of the list's key for server-side apply, and servers before
            // 1.22 have no default for it there.
            "ports": [{ "name": "rendezvous", "protocol": "TCP", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT }],
        },
    }))
}

/// The name of a service's Service in its team's namespace (a DNS-1035 label: service
/// names are at most 50 characters and start with a letter).
pub fn endpoint_name(service: &str) -> String {
    format!("fw-svc-{service}")
}

/// A service's stable endpoint: a ClusterIP Service over the pods of every replica of the
/// service, whatever their attempt or revision. It carries no object label, so it is never
/// read as a gang.
pub fn endpoint(team: &str, binding: &ServiceBinding, namespace: &str, cluster: &str) -> Service {
    let mut labels = managed_labels(cluster);
    labels.insert(TEAM_LABEL.into(), team.to_owned());
    labels.insert(SERVICE_LABEL.into(), binding.name.clone());
    from_json(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": endpoint_name(&binding.name), "namespace": namespace, "labels": labels },
        "spec": {
            "type": "ClusterIP",
            "selector": { SERVICE_LABEL: binding.name },
            "ports": [{ "name": "serve", "protocol": "TCP", "port": binding.port, "targetPort": binding.port }],
        },
    }))
}

/// What a replica asks for and where it must run.
#[derive(Debug, Clone)]
pub struct ReplicaTarget {
    /// The node's `kubernetes.io/hostname` label (its name when unlabelled).
    pub hostname: String,
    /// The node's name, recorded on the pod so a lost node can be told.
    pub node: String,
    /// `nvidia.com/gpu` or `nvidia.com/mig-<profile>`.
    pub resource: String,
    pub count: u32,
}

/// Replica `rank`'s pod. `owner_uid` is the Service's uid, so the pods are collected with it.
pub fn pod(
    gang: &Gang,
    namespace: &str,
    rank: usize,
    target: &ReplicaTarget,
    owner_uid: &str,
    settings: &PodSettings,
) -> Pod {
    let name = pod_name(&gang.object, rank);
    let mut labels: BTreeMap<String, String> =
        gang.labels.iter().filter(|(k, v)| user_label_allowed(k, v)).map(|(k, v)| (k.clone(), v.clone())).collect();
    labels.extend(gang_labels(gang, &settings.cluster));
    labels.insert(RANK_LABEL.into(), rank.to_string());
    if let Some(binding) = &gang.service {
        labels.insert(SERVICE_LABEL.into(), binding.name.clone());
    }
    let world = gang.replicas.len().to_string();
    // An elastic gang's extra replica joins its gang's rendezvous.
    let anchor = gang.extra_of.as_ref().map_or(gang.object.as_str(), |e| e.object.as_str());
    let master = format!("{}.{}", pod_name(anchor, 0), anchor);
    // The platform's variables (`Gang::env`) and the rendezvous ones win over the user's.
    let mut env = gang.env();
    for (k, v) in [
        ("FAIRWAY_RANK", rank.to_string()),
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", world.clone()),
        ("NODE_RANK", rank.to_string()),
        ("NNODES", world.clone()),
        ("MASTER_ADDR", master),
        ("MASTER_PORT", RENDEZVOUS_PORT.to_string()),
    ] {
        env.insert(k.into(), v);
    }
    let workload = &gang.workload;
    // A Secret's variable never replaces one the platform or the user set in plain text
    // (submission refuses the clash; a platform name added later still wins).
    let from_secrets: Vec<Value> = workload
        .secret_env
        .iter()
        .filter(|s| !env.contains_key(&s.name))
        .map(|s| json!({ "name": s.name, "valueFrom": { "secretKeyRef": { "name": s.secret, "key": s.key } } }))
        .collect();
    let mut env: Vec<Value> = env.into_iter().map(|(name, value)| json!({ "name": name, "value": value })).collect();
    env.extend(from_secrets);
    let quantity = target.count.to_string();
    let mut amounts = BTreeMap::from([(target.resource.clone(), quantity)]);
    if let Some(millis) = gang.cpu_millis {
        amounts.insert("cpu".into(), format!("{millis}m"));
    }
    if let Some(mib) = gang.memory_mib {
        amounts.insert("memory".into(), format!("{mib}Mi"));
    }
    let volumes: Vec<Value> = workload
        .volumes
        .iter()
        .enumerate()
        .map(|(i, v)| {
            json!({ "name": format!("volume-{i}"), "persistentVolumeClaim": { "claimName": v.claim, "readOnly": v.read_only } })
        })
        .collect();
    let mounts: Vec<Value> = workload
        .volumes
        .iter()
        .enumerate()
        .map(|(i, v)| json!({ "name": format!("volume-{i}"), "mountPath": v.mount_path, "readOnly": v.read_only }))
        .collect();
    let mut container = json!({
        "name": CONTAINER,
        "image": gang.image,
        "env": env,
        // Requests equal limits: a gang's replicas get what they asked for and no more, and
        // the pod is in the Guaranteed class (the last a node evicts under pressure).
        "resources": { "requests": amounts, "limits": amounts },
        "securityContext": {
            "privileged": false,
            "allowPrivilegeEscalation": false,
            "capabilities": { "drop": ["ALL"] },
            "runAsNonRoot": true,
        },
    });
    if !gang.command.is_empty() {
        container["command"] = json!(gang.command);
    }
    if !mounts.is_empty() {
        container["volumeMounts"] = json!(mounts);
    }
    let tolerations: Vec<Value> = settings
        .tolerated_taints
        .iter()
        // Every effect: the inventory keeps nodes with these taints, whatever their effect.
        .map(|key| json!({ "key": key, "operator": "Exists" }))
        .collect();
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            // The gang's size on each pod too: the Service and the pods are watched apart, and
            // a gang seen by its pods alone must not pass for complete with some still unseen.
            "annotations": { NODE_ANNOTATION: target.node, REPLICAS_ANNOTATION: world },
            "ownerReferences": [{
                "apiVersion": "v1",
                "kind": "Service",
                "name": gang.object,
                "uid": owner_uid,
            }],
        },
        "spec": {
            "restartPolicy": "Never",
            "hostname": name,
            "subdomain": gang.object,
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "hostNetwork": false,
            "hostPID": false,
            "hostIPC": false,
            // A service's replica has no maximum runtime.
            "activeDeadlineSeconds": gang.service.is_none().then(|| gang.max_runtime.as_secs().max(1)),
            "affinity": { "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{ "matchExpressions": [{
                    "key": "kubernetes.io/hostname",
                    "operator": "In",
                    "values": [target.hostname],
                }] }],
            } } },
            "tolerations": tolerations,
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": RUN_AS_ID,
                "runAsGroup": RUN_AS_ID,
                "fsGroup": RUN_AS_ID,
                "seccompProfile": { "type": "RuntimeDefault" },
            },
            "containers": [container],
        },
    });
    // The engine's node stays pinned through the affinity above; a selector narrows nothing
    // further when the placement honoured it and keeps the pod pending when it did not.
    if !workload.node_selector.is_empty() {
        pod["spec"]["nodeSelector"] = json!(workload.node_selector);
    }
    if !volumes.is_empty() {
        pod["spec"]["volumes"] = json!(volumes);
    }
    if !workload.image_pull_secrets.is_empty() {
        let names: Vec<Value> = workload.image_pull_secrets.iter().map(|n| json!({ "name": n })).collect();
        pod["spec"]["imagePullSecrets"] = json!(names);
    }
    from_json(pod)
}

/// A user label reaches the pods when Kubernetes accepts it and it is not one of ours.
pub fn user_label_allowed(key: &str, value: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let reserved = |p: &str| {
        p == "fairway.dev" || p.ends_with(".fairway.dev") || p.ends_with("kubernetes.io") || p.ends_with("k8s.io")
    };
    let label_value = |s: &str, max: usize| {
        s.len() <= max
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && s.bytes().next().is_none_or(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_none_or(|b| b.is_ascii_alphanumeric())
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !reserved(p)
            && p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    });
    prefix_ok && !name.is_empty() && label_value(name, 63) && label_value(value, 63)
}

fn from_json<T: serde::de::DeserializeOwned>(value: Value) -> T {
    // The JSON above is ours and fixed in shape; the unit tests parse every builder.
    serde_json::from_value(value).expect("a Kubernetes object built by Fairway parses")
}

#[cfg(test)]
mod tests {
    use crate::domain::JobId;
    use std::time::Duration;

    use super::*;
    use crate::backends::ReplicaSlot;

    fn gang(replicas: usize) -> Gang {
        Gang {
            object: crate::backends::object_name(JobId::from_u128(7), 1),
            job_id: JobId::from_u128(7),
            attempt: 1,
            team: "vision".into(),
            job_name: "train".into(),
            gpu_class: "h100-80gb".into(),
            priority_class: "batch".into(),
            image: "nvcr.io/nvidia/pytorch:24.05-py3".into(),
            command: vec!["torchrun".into(), "train.py".into()],
            env: BTreeMap::from([
                ("MASTER_ADDR".into(), "evil".into()),
                ("LR".into(), "0.1".into()),
                ("NVIDIA_VISIBLE_DEVICES".into(), "all".into()),
            ]),
            labels: BTreeMap::from([
                ("experiment".into(), "e1".into()),
                ("fairway.dev/team".into(), "other".into()),
                ("bad key!".into(), "x".into()),
            ]),
            max_runtime: Duration::from_secs(3600),
            cpu_millis: None,
            memory_mib: None,
            workload: Default::default(),
            replicas: (0..replicas).map(|i| ReplicaSlot { node: format!("n{i}"), gpus: (0..8).collect() }).collect(),
            array: None,
            service: None,
            extra_of: None,
        }
    }

    fn settings() -> PodSettings {
        PodSettings { cluster: "gpu".into(), tolerated_taints: vec!["nvidia.com/gpu".into()] }
    }

    fn target() -> ReplicaTarget {
        ReplicaTarget { hostname: "host-3".into(), node: "node-3".into(), resource: "nvidia.com/gpu".into(), count: 8 }
    }

    #[test]
    fn a_replica_pod_is_pinned_to_its_node_and_requests_exactly_its_gpus() {
        let pod = pod(&gang(4), "fw-vision", 2, &target(), "uid-1", &settings());
        let v = serde_json::to_value(&pod).unwrap();
        assert_eq!(v["metadata"]["name"], format!("{}-2", gang(1).object));
        assert_eq!(v["metadata"]["namespace"], "fw-vision");
        let term = &v["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"][0];
        assert_eq!(term["key"], "kubernetes.io/hostname");
        assert_eq!(term["values"], json!(["host-3"]));
        let resources = &v["spec"]["containers"][0]["resources"];
        assert_eq!(resources["requests"]["nvidia.com/gpu"], "8");
        assert_eq!(resources["limits"]["nvidia.com/gpu"], "8");
        assert_eq!(v["spec"]["activeDeadlineSeconds"], 3600);
        assert_eq!(v["spec"]["restartPolicy"], "Never");
        assert_eq!(v["spec"]["tolerations"][0]["key"], "nvidia.com/gpu");
        assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "uid-1");
        assert_eq!(v["metadata"]["ownerReferences"][0]["kind"], "Service");
    }

    #[test]
    fn a_pod_can_never_be_privileged_or_reach_the_host_or_a_service_account_token() {
        let v = serde_json::to_value(pod(&gang(2), "fw-vision", 0, &target(), "u", &settings())).unwrap();
        let spec = &v["spec"];
        assert_eq!(spec["automountServiceAccountToken"], false);
        assert_eq!(spec["hostNetwork"], false);
        assert_eq!(spec["hostPID"], false);
        assert_eq!(spec["hostIPC"], false);
        assert!(spec.get("volumes").is_none());
        assert!(spec.get("serviceAccountName").is_none());
        assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
        assert_eq!(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault");
        let sc = &spec["containers"][0]["securityContext"];
        assert_eq!(sc["privileged"], false);
        assert_eq!(sc["allowPrivilegeEscalation"], false);
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    }

    /// A pod's plain (not from a Secret) environment variables.
    fn plain_env(pod: &serde_json::Value) -> BTreeMap<String, String> {
        pod["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| Some((e["name"].as_str()?.to_owned(), e["value"].as_str()?.to_owned())))
            .collect()
    }

    #[test]
    fn rendezvous_variables_are_ours_even_when_the_user_sets_the_same_names() {
        let g = gang(4);
        let v = serde_json::to_value(pod(&g, "fw-vision", 3, &target(), "u", &settings())).unwrap();
        let env = plain_env(&v);
        assert_eq!(env["MASTER_ADDR"], format!("{0}-0.{0}", g.object));
        assert_eq!(env["MASTER_PORT"], "29500");
        assert_eq!(env["FAIRWAY_RANK"], "3");
        assert_eq!(env["FAIRWAY_WORLD_SIZE"], "4");
        assert_eq!(env["FAIRWAY_JOB_ID"], g.job_id.to_string());
        assert_eq!(env["LR"], "0.1");
        assert!(!env.contains_key("NVIDIA_VISIBLE_DEVICES"), "never chooses its own devices");
        assert_eq!(v["spec"]["hostname"], format!("{}-3", g.object));
        assert_eq!(v["spec"]["subdomain"], g.object);
    }

    #[test]
    fn an_elastic_gangs_extra_replica_joins_its_gangs_rendezvous() {
        let mut g = gang(1);
        let gang_object = crate::backends::object_name(JobId::from_u128(3), 2);
        g.extra_of = Some(crate::backends::ElasticBinding { job_id: JobId::from_u128(3), object: gang_object.clone() });
        let v = serde_json::to_value(pod(&g, "fw-vision", 0, &target(), "u", &settings())).unwrap();
        let env = plain_env(&v);
        assert_eq!(env["MASTER_ADDR"], format!("{gang_object}-0.{gang_object}"));
        assert_eq!(env["FAIRWAY_ELASTIC_GANG"], JobId::from_u128(3).to_string());
        // Its own pod still has its own name.
        assert_eq!(v["spec"]["hostname"], format!("{}-0", g.object));
    }

    #[test]
    fn an_array_task_finds_its_index_and_the_task_count_in_its_environment() {
        let mut g = gang(1);
        g.env.insert("JOB_COMPLETION_INDEX".into(), "99".into());
        g.array =
            Some(crate::backends::ArrayTaskEnv { id: crate::domain::ArrayId::from_u128(5), index: 41, count: 1000 });
        let v = serde_json::to_value(pod(&g, "fw-vision", 0, &target(), "u", &settings())).unwrap();
        let env = plain_env(&v);
        assert_eq!(env["FAIRWAY_ARRAY_TASK_ID"], "41");
        assert_eq!(env["JOB_COMPLETION_INDEX"], "41", "the platform's index wins over the user's");
        assert_eq!(env["FAIRWAY_ARRAY_TASK_COUNT"], "1000");
        assert_eq!(env["FAIRWAY_ARRAY_ID"], crate::domain::ArrayId::from_u128(5).to_string());
        let plain = serde_json::to_value(pod(&gang(1), "fw-vision", 0, &target(), "u", &settings())).unwrap();
        assert!(!plain.to_string().contains("FAIRWAY_ARRAY_TASK_ID"), "a job that is no task has no index");
    }

    #[test]
    fn a_pod_carries_the_jobs_cpu_memory_claims_secret_references_pull_secrets_and_node_selector() {
        use crate::domain::workload::{SecretEnv, Volume, Workload};
        let g = Gang {
            cpu_millis: Some(4000),
            memory_mib: Some(32 * 1024),
            workload: Workload {
                volumes: vec![
                    Volume { claim: "datasets".into(), mount_path: "/data".into(), read_only: true },
                    Volume { claim: "scratch".into(), mount_path: "/scratch".into(), read_only: false },
                ],
                secret_env: vec![
                    SecretEnv { name: "HF_TOKEN".into(), secret: "hf".into(), key: "token".into() },
                    // A platform name is never taken from a Secret.
                    SecretEnv { name: "FAIRWAY_RANK".into(), secret: "evil".into(), key: "k".into() },
                ],
                cloud_secret_env: Vec::new(),
                image_pull_secrets: vec!["regcred".into()],
                node_selector: BTreeMap::from([("example.com/fabric".into(), "infiniband".into())]),
            },
            ..gang(2)
        };
        let v = serde_json::to_value(pod(&g, "fw-vision", 0, &target(), "u", &settings())).unwrap();
        let c = &v["spec"]["containers"][0];
        for side in ["requests", "limits"] {
            assert_eq!(c["resources"][side]["cpu"], "4000m");
            assert_eq!(c["resources"][side]["memory"], "32768Mi");
            assert_eq!(c["resources"][side]["nvidia.com/gpu"], "8");
        }
        assert_eq!(
            v["spec"]["volumes"],
            json!([
                { "name": "volume-0", "persistentVolumeClaim": { "claimName": "datasets", "readOnly": true } },
                { "name": "volume-1", "persistentVolumeClaim": { "claimName": "scratch", "readOnly": false } },
            ])
        );
        assert_eq!(
            c["volumeMounts"],
            json!([
                { "name": "volume-0", "mountPath": "/data", "readOnly": true },
                { "name": "volume-1", "mountPath": "/scratch", "readOnly": false },
            ])
        );
        let env = c["env"].as_array().unwrap();
        let hf = env.iter().find(|e| e["name"] == "HF_TOKEN").unwrap();
        assert_eq!(hf["valueFrom"]["secretKeyRef"], json!({ "name": "hf", "key": "token" }));
        let rank: Vec<&Value> = env.iter().filter(|e| e["name"] == "FAIRWAY_RANK").collect();
        assert_eq!(rank, [&json!({ "name": "FAIRWAY_RANK", "value": "0" })]);
        assert_eq!(v["spec"]["imagePullSecrets"], json!([{ "name": "regcred" }]));
        assert_eq!(v["spec"]["nodeSelector"], json!({ "example.com/fabric": "infiniband" }));
        // The engine's node pinning stays.
        let term = &v["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"][0];
        assert_eq!(term["values"], json!(["host-3"]));
        // A job from before CPU and memory were asked for asks for GPUs alone.
        let old = serde_json::to_value(pod(&gang(1), "fw-vision", 0, &target(), "u", &settings())).unwrap();
        assert_eq!(old["spec"]["containers"][0]["resources"]["requests"], json!({ "nvidia.com/gpu": "8" }));
    }

    #[test]
    fn user_labels_reach_the_pod_only_when_valid_and_not_reserved() {
        let v = serde_json::to_value(pod(&gang(1), "fw-vision", 0, &target(), "u", &settings())).unwrap();
        let labels = &v["metadata"]["labels"];
        assert_eq!(labels["experiment"], "e1");
        assert_eq!(labels["fairway.dev/team"], "vision");
        assert!(labels.get("bad key!").is_none());
        assert!(!user_label_allowed("kubernetes.io/hostname", "x"));
        assert!(!user_label_allowed("team.fairway.dev/x", "y"));
        assert!(user_label_allowed("example.com/run", "a.b_c-1"));
        assert!(!user_label_allowed("run", "-bad"));
        assert!(!user_label_allowed("run", &"x".repeat(64)));
    }

    #[test]
    fn the_service_is_headless_and_marks_when_every_pod_exists() {
        let g = gang(4);
        let pending = serde_json::to_value(service(&g, "fw-vision", "gpu", false)).unwrap();
        assert_eq!(pending["spec"]["clusterIP"], "None");
        assert_eq!(pending["spec"]["selector"][OBJECT_LABEL], g.object);
        assert_eq!(pending["metadata"]["annotations"][REPLICAS_ANNOTATION], "4");
        assert!(pending["metadata"]["annotations"].get(COMPLETE_ANNOTATION).is_none());
        let done = serde_json::to_value(service(&g, "fw-vision", "gpu", true)).unwrap();
        assert_eq!(done["metadata"]["annotations"][COMPLETE_ANNOTATION], "true");
    }

    #[test]
    fn team_namespaces_enforce_restricted_pods_and_fence_gpus_by_quota() {
        let ns = serde_json::to_value(namespace("fw-vision", "vision", "gpu")).unwrap();
        assert_eq!(ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted");
        assert_eq!(ns["metadata"]["labels"][TEAM_LABEL], "vision");
        let limits = BTreeMap::from([("nvidia.com/gpu".to_owned(), 24), ("nvidia.com/mig-3g.40gb".to_owned(), 4)]);
        let quota = serde_json::to_value(resource_quota("fw-vision", "vision", "gpu", &limits)).unwrap();
        assert_eq!(quota["spec"]["hard"]["requests.nvidia.com/gpu"], "24");
        assert_eq!(quota["spec"]["hard"]["requests.nvidia.com/mig-3g.40gb"], "4");
        let none = serde_json::to_value(resource_quota("fw-x", "x", "gpu", &BTreeMap::new())).unwrap();
        assert_eq!(none["spec"]["hard"]["requests.nvidia.com/gpu"], "0");
        let policy = serde_json::to_value(network_policy("fw-vision", "vision", "gpu")).unwrap();
        assert_eq!(policy["spec"]["podSelector"], json!({}));
        assert_eq!(policy["spec"]["ingress"][0]["from"][0]["podSelector"], json!({}));
    }

    #[test]
    fn long_team_names_still_give_dns_label_namespaces() {
        assert_eq!(namespace_for("fw-", "vision"), "fw-vision");
        let long = "a".repeat(63);
        let ns = namespace_for("fw-", &long);
        assert!(ns.len() <= 63, "{ns}");
        assert_ne!(ns, namespace_for("fw-", &format!("{}b", "a".repeat(62))));
    }
}
