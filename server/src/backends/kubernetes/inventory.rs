//! Reads the GPU inventory from Node objects, as NVIDIA's GPU Feature Discovery labels them:
//! `nvidia.com/gpu.product`, `nvidia.com/gpu.memory` (MiB), `nvidia.com/mig.strategy`,
//! `nvidia.com/mig-<profile>.memory`, and the device plugin's allocatable `nvidia.com/gpu`
//! and `nvidia.com/mig-<profile>`. Pure: the node watch cache supplies the nodes.
//!
//! A node offers one inventory entry per GPU class it has (whole GPUs, and each MIG profile
//! under the `mixed` strategy), like the simulator's MIG nodes. A node whose GPUs are shared
//! by time-slicing (GFD's `nvidia.com/gpu.replicas` and `nvidia.com/gpu.sharing-strategy`,
//! a product ending `-SHARED`) offers a `time-slice` class `<product>.shared-<replicas>`,
//! each unit a `1/replicas` share of a GPU in quota and bill. Each entry carries the node's
//! driver and CUDA version from GFD's labels ([`driver_version`], [`cuda_version`]), which jobs
//! that require a minimum are placed by. Cordoned nodes, nodes that are
//! not Ready, nodes with a taint we do not tolerate and nodes that report a GPU fault (a
//! condition or taint as NVIDIA's NVSentinel sets them, [`fault`]) offer nothing.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::{Container, Node, Pod};

use crate::backends::{ClassDecl, InventoryNode};

/// The resource whole GPUs are requested by.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The resource time-sliced GPUs are requested by when the device plugin renames them.
pub const SHARED_RESOURCE: &str = "nvidia.com/gpu.shared";
const MIG_PREFIX: &str = "nvidia.com/mig-";
/// The most GPUs of one class one node may offer (the engine's unit indices are `u8`).
const MAX_UNITS: u32 = 64;

/// How nodes are read.
#[derive(Debug, Clone)]
pub struct InventorySettings {
    /// `nvidia.com/gpu.product` value → GPU class name; products not listed get a class
    /// named after the product (lowercased, without the `nvidia-` prefix).
    pub products: BTreeMap<String, String>,
    pub zone_label: String,
    pub rack_label: String,
    /// Label holding the number of GPUs per NVLink domain on the node.
    pub nvlink_domain_label: String,
    /// Taint keys that do not take a node out of the inventory (our pods tolerate them).
    pub tolerated_taints: Vec<String>,
    /// Node condition types, by prefix, that report a GPU fault when `True` (NVSentinel's
    /// health monitors write `GpuXidError`, `GpuMemWatch`, ...).
    pub fault_conditions: Vec<String>,
    /// Taint keys that report a GPU fault (NVSentinel's fault quarantine, by default
    /// `nvidia.com/gpu-xid-error`).
    pub fault_taints: Vec<String>,
}

/// A GPU fault a node reports: since when, and why, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub since: DateTime<Utc>,
    pub why: String,
}

/// The GPU fault `node` reports through a condition or a taint, if any: the earliest one.
/// Its gangs are lost from that instant, and it offers nothing until the fault clears.
pub fn fault(node: &Node, settings: &InventorySettings, now: DateTime<Utc>) -> Option<Fault> {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref()).into_iter().flatten();
    let by_condition = conditions
        .filter(|c| c.status == "True" && settings.fault_conditions.iter().any(|p| c.type_.starts_with(p.as_str())))
        .map(|c| Fault {
            since: c.last_transition_time.as_ref().and_then(super::time).unwrap_or(now),
            why: match c.message.as_deref().filter(|m| !m.is_empty()) {
                Some(message) => format!("{}: {message}", c.type_),
                None => c.type_.clone(),
            },
        });
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_ref()).into_iter().flatten();
    let by_taint = taints.filter(|t| settings.fault_taints.contains(&t.key)).map(|t| Fault {
        since: t.time_added.as_ref().and_then(super::time).unwrap_or(now),
        why: format!("taint {}={}:{}", t.key, t.value.as_deref().unwrap_or(""), t.effect),
    });
    by_condition.chain(by_taint).min_by_key(|f| f.since).map(|f| Fault { since: f.since.min(now), ..f })
}

/// One GPU class on one node, and how a pod asks for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeGpus {
    pub entry: InventoryNode,
    pub class: ClassDecl,
    /// The resource a pod requests: `nvidia.com/gpu` or `nvidia.com/mig-<profile>`.
    pub resource: String,
    /// The node's `kubernetes.io/hostname` label (its name when it has none).
    pub hostname: String,
}

fn quantity(node: &Node, resource: &str) -> u32 {
    allocatable(node, resource).and_then(|q| q.parse::<u32>().ok()).unwrap_or(0).min(MAX_UNITS)
}

/// The node's allocatable amount of `resource`, as Kubernetes writes it.
fn allocatable<'a>(node: &'a Node, resource: &str) -> Option<&'a str> {
    node.status.as_ref().and_then(|s| s.allocatable.as_ref()).and_then(|a| a.get(resource)).map(|q| q.0.as_str())
}

/// The node's Ready condition: true, and since when it was last not.
fn ready(node: &Node) -> (bool, Option<DateTime<Utc>>) {
    let condition =
        node.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    match condition {
        Some(c) => (c.status == "True", c.last_transition_time.as_ref().and_then(super::time)),
        None => (false, None),
    }
}

/// Whether the node may take new gangs.
pub fn schedulable(node: &Node, settings: &InventorySettings) -> bool {
    let spec = node.spec.as_ref();
    let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
    let tainted = spec.and_then(|s| s.taints.as_ref()).is_some_and(|taints| {
        taints.iter().any(|t| {
            matches!(t.effect.as_str(), "NoSchedule" | "NoExecute") && !settings.tolerated_taints.contains(&t.key)
        })
    });
    !cordoned && !tainted && ready(node).0 && fault(node, settings, Utc::now()).is_none()
}

/// Nodes whose pods are lost: NotReady for longer than `after` (a short blip is not a loss).
/// Deleted nodes are lost too; the caller knows them by their absence.
pub fn lost_nodes<'a>(
    nodes: impl Iterator<Item = &'a Node>,
    now: DateTime<Utc>,
    after: chrono::Duration,
) -> HashSet<String> {
    nodes
        .filter(|n| {
            let (is_ready, since) = ready(n);
            !is_ready && since.is_none_or(|since| now - since >= after)
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect()
}

/// Whether `labels` match an equality-based label selector: `key=value` (or `==`),
/// `key!=value`, `key` (present) and `!key` (absent), comma-separated, all of which must hold.
pub fn selector_matches(selector: &str, labels: &BTreeMap<String, String>) -> bool {
    selector.split(',').map(str::trim).filter(|t| !t.is_empty()).all(|term| {
        if let Some((key, value)) = term.split_once("!=") {
            labels.get(key.trim()).is_none_or(|v| v != value.trim())
        } else if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
            labels.get(key.trim()).is_some_and(|v| v == value.trim())
        } else if let Some(key) = term.strip_prefix('!') {
            !labels.contains_key(key.trim())
        } else {
            labels.contains_key(term)
        }
    })
}

/// The NVIDIA driver's version a node runs, from GFD's labels: `nvidia.com/cuda.driver-version.full`,
/// else its `.major`, `.minor` and `.revision`, else the deprecated `nvidia.com/cuda.driver.*`
/// labels of older GFD releases. `None` when none reads as a version.
pub fn driver_version(labels: &BTreeMap<String, String>) -> Option<String> {
    version_label(
        labels,
        "nvidia.com/cuda.driver-version.full",
        &[
            [
                "nvidia.com/cuda.driver-version.major",
                "nvidia.com/cuda.driver-version.minor",
                "nvidia.com/cuda.driver-version.revision",
            ],
            ["nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev"],
        ],
    )
}

/// The CUDA version a node's driver supports, from GFD's `nvidia.com/cuda.runtime-version.full`,
/// else its `.major` and `.minor`, else the deprecated `nvidia.com/cuda.runtime.*` labels.
pub fn cuda_version(labels: &BTreeMap<String, String>) -> Option<String> {
    version_label(
        labels,
        "nvidia.com/cuda.runtime-version.full",
        &[
            ["nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime-version.minor", ""],
            ["nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor", ""],
        ],
    )
}

/// The version in label `full`, else assembled from the first set of part labels present;
/// only text that reads as a version.
fn version_label(labels: &BTreeMap<String, String>, full: &str, parts: &[[&str; 3]]) -> Option<String> {
    let valid = |v: String| v.parse::<crate::domain::driver::Version>().is_ok().then_some(v);
    if let Some(v) = labels.get(full).cloned().and_then(valid) {
        return Some(v);
    }
    parts.iter().find_map(|keys| {
        let found: Vec<&String> = keys.iter().filter(|k| !k.is_empty()).map_while(|k| labels.get(*k)).collect();
        (found.len() >= 2).then(|| found.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(".")).and_then(valid)
    })
}

/// The GPU class name of a product label value.
pub fn class_of_product(product: &str, settings: &InventorySettings) -> String {
    if let Some(class) = settings.products.get(product) {
        return class.clone();
    }
    let lower = product.to_ascii_lowercase();
    let name = lower.strip_prefix("nvidia-").unwrap_or(&lower);
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' { c } else { '-' }).collect()
}

/// Memory in MiB from a name that states it in GB, e.g. `3g.40gb` or `A100-SXM4-80GB`.
fn memory_in_name(name: &str) -> Option<i32> {
    let lower = name.to_ascii_lowercase();
    let at = lower.find("gb")?;
    let digits: String =
        lower[..at].chars().rev().take_while(char::is_ascii_digit).collect::<Vec<_>>().into_iter().rev().collect();
    digits.parse::<i32>().ok().filter(|gb| *gb > 0).map(|gb| gb * 1024)
}

/// Thousandths of a GPU in a MIG profile such as `3g.40gb` (7 compute slices per GPU).
fn mig_fraction(profile: &str) -> i32 {
    let slices: i32 = profile.split('g').next().and_then(|s| s.parse().ok()).unwrap_or(1);
    (slices.clamp(1, 7) * 1000) / 7
}

/// What a node offers, one entry per GPU class; empty when it cannot take gangs.
pub fn node_gpus(node: &Node, settings: &InventorySettings) -> Vec<NodeGpus> {
    if !schedulable(node, settings) {
        return Vec::new();
    }
    let Some(name) = node.metadata.name.clone() else { return Vec::new() };
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let label = |key: &str| labels.get(key).filter(|v| !v.is_empty()).cloned();
    let hostname = label("kubernetes.io/hostname").unwrap_or_else(|| name.clone());
    let Some(product) = label("nvidia.com/gpu.product") else { return Vec::new() };
    let nvlink = label(&settings.nvlink_domain_label).and_then(|v| v.parse::<u8>().ok()).unwrap_or(0);
    let entry = |gpu_class: String, gpus: u32| InventoryNode {
        name: name.clone(),
        gpu_class,
        gpus: gpus as u8,
        nvlink_domain_size: nvlink,
        rack: label(&settings.rack_label),
        zone: label(&settings.zone_label),
        elastic: false,
        spot: false,
        price_micros_per_gpu_hour: None,
        driver_version: driver_version(&labels),
        cuda_version: cuda_version(&labels),
        cpu_millis: None,
        memory_mib: None,
    };
    let mut out = Vec::new();
    // Under the `single` strategy every GPU is cut alike and the product label names the
    // profile, e.g. `NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`; the devices are `nvidia.com/gpu`.
    let (product, single_profile) = match product.split_once("-MIG-") {
        Some((base, profile)) => (base.to_owned(), Some(profile.to_owned())),
        None => (product, None),
    };
    // Time-slicing (or MPS) as GFD labels it: each GPU is offered `replicas` times, the
    // product carries `-SHARED`, and the device plugin may rename the resource.
    let replicas = label("nvidia.com/gpu.replicas").and_then(|r| r.parse::<u32>().ok()).filter(|r| *r > 1);
    let strategy = label("nvidia.com/gpu.sharing-strategy").filter(|s| s != "none");
    let product = product.strip_suffix("-SHARED").map(str::to_owned).unwrap_or(product);
    let base = class_of_product(&product, settings);
    if let (Some(replicas), Some(strategy), None) = (replicas, &strategy, &single_profile) {
        let resource = if quantity(node, SHARED_RESOURCE) > 0 { SHARED_RESOURCE } else { GPU_RESOURCE };
        let count = quantity(node, resource);
        let memory = label("nvidia.com/gpu.memory").and_then(|m| m.parse().ok()).or_else(|| memory_in_name(&product));
        if count > 0 {
            let class = format!("{base}.shared-{replicas}");
            tracing::debug!(node = %name, class, strategy, "a time-sliced GPU node");
            out.push(NodeGpus {
                entry: entry(class.clone(), count),
                class: ClassDecl {
                    name: class,
                    kind: "time-slice".into(),
                    // Time-slicing does not divide memory: each share may use all of it.
                    memory_mib: memory.unwrap_or(0),
                    fraction_milli: i32::try_from(1000 / replicas).unwrap_or(1).max(1),
                },
                resource: resource.into(),
                hostname: hostname.clone(),
            });
        }
    }
    let whole = if replicas.is_some() && strategy.is_some() && single_profile.is_none() {
        0
    } else {
        quantity(node, GPU_RESOURCE)
    };
    if whole > 0 {
        let (class, kind, memory, fraction) = match &single_profile {
            Some(profile) => (
                format!("{base}.mig-{profile}"),
                "mig",
                label(&format!("nvidia.com/mig-{profile}.memory"))
                    .and_then(|m| m.parse().ok())
                    .or_else(|| memory_in_name(profile)),
                mig_fraction(profile),
            ),
            None => (
                base.clone(),
                "whole",
                label("nvidia.com/gpu.memory").and_then(|m| m.parse().ok()).or_else(|| memory_in_name(&product)),
                1000,
            ),
        };
        out.push(NodeGpus {
            entry: entry(class.clone(), whole),
            class: ClassDecl {
                name: class,
                kind: kind.into(),
                memory_mib: memory.unwrap_or(0),
                fraction_milli: fraction,
            },
            resource: GPU_RESOURCE.into(),
            hostname: hostname.clone(),
        });
    }
    let resources = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    let profiles: Vec<String> = resources
        .map(|a| a.keys().filter_map(|k| k.strip_prefix(MIG_PREFIX)).map(str::to_owned).collect())
        .unwrap_or_default();
    for profile in profiles {
        let resource = format!("{MIG_PREFIX}{profile}");
        let count = quantity(node, &resource);
        if count == 0 {
            continue;
        }
        let class = format!("{base}.mig-{profile}");
        out.push(NodeGpus {
            entry: entry(class.clone(), count),
            class: ClassDecl {
                name: class,
                kind: "mig".into(),
                memory_mib: label(&format!("nvidia.com/mig-{profile}.memory"))
                    .and_then(|m| m.parse().ok())
                    .or_else(|| memory_in_name(&profile))
                    .unwrap_or(0),
                fraction_milli: mig_fraction(&profile),
            },
            resource,
            hostname: hostname.clone(),
        });
    }
    // A class whose memory neither the labels nor its name tell cannot enter the catalogue.
    out.retain(|g| {
        let known = g.class.memory_mib > 0;
        if !known {
            tracing::warn!(node = %name, class = %g.class.name, "GPU memory unknown (no GFD memory label); node skipped");
        }
        known
    });
    // A node of one class gives its CPU and memory to that class's replicas; a node split
    // across classes (mixed MIG, time-slicing beside whole GPUs) is counted by none, as the
    // engine holds each class's GPUs of a node apart.
    if let [only] = out.as_mut_slice() {
        only.entry.cpu_millis = allocatable(node, "cpu").and_then(cpu_millis);
        only.entry.memory_mib = allocatable(node, "memory").and_then(memory_mib);
    }
    out
}

/// What one pod asks of its node, as the Kubernetes scheduler counts it: its containers'
/// requests summed (with init containers that keep running, sidecars), or its largest other
/// init container's if that is more, plus its overhead. CPU in thousandths of a core,
/// memory in MiB (each quantity rounded down to whole MiB).
pub fn pod_requests(pod: &Pod) -> (u64, u64) {
    let Some(spec) = pod.spec.as_ref() else { return (0, 0) };
    let asks = |c: &Container| -> (u64, u64) {
        let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
        let get = |key: &str, parse: fn(&str) -> Option<u32>| {
            requests.and_then(|r| r.get(key)).and_then(|q| parse(&q.0)).map_or(0, u64::from)
        };
        (get("cpu", cpu_millis), get("memory", memory_mib))
    };
    let add = |a: (u64, u64), b: (u64, u64)| (a.0 + b.0, a.1 + b.1);
    let inits = spec.init_containers.as_deref().unwrap_or_default();
    let sidecar = |c: &&Container| c.restart_policy.as_deref() == Some("Always");
    let running = spec.containers.iter().chain(inits.iter().filter(sidecar)).map(asks).fold((0, 0), add);
    let first = inits.iter().filter(|c| !sidecar(c)).map(asks).fold((0, 0), |a, b| (a.0.max(b.0), a.1.max(b.1)));
    let overhead = spec.overhead.as_ref().map_or((0, 0), |o| {
        let get = |key: &str, parse: fn(&str) -> Option<u32>| o.get(key).and_then(|q| parse(&q.0)).map_or(0, u64::from);
        (get("cpu", cpu_millis), get("memory", memory_mib))
    });
    add((running.0.max(first.0), running.1.max(first.1)), overhead)
}

/// The CPU and memory that `pods` (bound to a node and not finished) ask of each node, by
/// node name: what a DaemonSet's pods and any other workload Fairway did not start hold of
/// a node's allocatable.
pub fn held_by_pods<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> HashMap<String, (u64, u64)> {
    let mut held: HashMap<String, (u64, u64)> = HashMap::new();
    for pod in pods {
        let finished =
            pod.status.as_ref().and_then(|s| s.phase.as_deref()).is_some_and(|p| p == "Succeeded" || p == "Failed");
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty()) else {
            continue;
        };
        if finished {
            continue;
        }
        let (cpu, memory) = pod_requests(pod);
        let entry = held.entry(node).or_default();
        entry.0 += cpu;
        entry.1 += memory;
    }
    held
}

/// `entries` (a node's GPUs by class) with what other pods hold of each node taken off the
/// CPU and memory it gives replicas.
pub fn less_held(mut entries: Vec<InventoryNode>, held: &HashMap<String, (u64, u64)>) -> Vec<InventoryNode> {
    for e in &mut entries {
        if let Some(&(cpu, memory)) = held.get(&e.name) {
            let less = |have: Option<u32>, used: u64| have.map(|h| u64::from(h).saturating_sub(used) as u32);
            e.cpu_millis = less(e.cpu_millis, cpu);
            e.memory_mib = less(e.memory_mib, memory);
        }
    }
    entries
}

/// A Kubernetes CPU quantity (`64`, `63500m`, `0.5`) in thousandths of a core; `None` for a
/// form this does not read.
pub fn cpu_millis(text: &str) -> Option<u32> {
    if let Some(m) = text.strip_suffix('m') {
        return m.parse().ok();
    }
    let cores: f64 = text.parse().ok().filter(|c: &f64| c.is_finite() && *c >= 0.0)?;
    let millis = (cores * 1000.0).floor();
    (millis <= f64::from(u32::MAX)).then_some(millis as u32)
}

/// A Kubernetes memory quantity (`527951876Ki`, `512Gi`, `16G`, bytes) in MiB, rounded down;
/// `None` for a form this does not read.
pub fn memory_mib(text: &str) -> Option<u32> {
    const UNITS: [(&str, f64); 11] = [
        ("Ki", 1024.0),
        ("Mi", 1024.0 * 1024.0),
        ("Gi", 1024.0 * 1024.0 * 1024.0),
        ("Ti", 1024.0 * 1024.0 * 1024.0 * 1024.0),
        ("Pi", 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("", 1.0),
    ];
    let (number, factor) = UNITS.iter().find_map(|&(suffix, f)| text.strip_suffix(suffix).map(|n| (n, f)))?;
    let number: f64 = number.parse().ok().filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
    let mib = (number * factor / (1024.0 * 1024.0)).floor();
    (mib <= f64::from(u32::MAX)).then_some(mib as u32)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn settings() -> InventorySettings {
        InventorySettings {
            products: BTreeMap::from([("NVIDIA-H100-80GB-HBM3".into(), "h100-80gb".into())]),
            zone_label: "topology.kubernetes.io/zone".into(),
            rack_label: "fairway.dev/rack".into(),
            nvlink_domain_label: "fairway.dev/nvlink-domain-size".into(),
            tolerated_taints: vec!["nvidia.com/gpu".into()],
            fault_conditions: vec!["Gpu".into()],
            fault_taints: vec!["nvidia.com/gpu-xid-error".into()],
        }
    }

    fn node(labels: serde_json::Value, allocatable: serde_json::Value, spec: serde_json::Value, ready: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "gpu-1", "labels": labels},
            "spec": spec,
            "status": {"allocatable": allocatable, "conditions": [
                {"type": "Ready", "status": ready, "lastTransitionTime": "2026-11-23T10:00:00Z"}]},
        }))
        .unwrap()
    }

    fn h100(spec: serde_json::Value, ready: &str) -> Node {
        node(
            json!({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
                "kubernetes.io/hostname": "gpu-1.example", "fairway.dev/rack": "r1",
                "topology.kubernetes.io/zone": "z1", "fairway.dev/nvlink-domain-size": "8"}),
            json!({"nvidia.com/gpu": "8", "cpu": "96"}),
            spec,
            ready,
        )
    }

    #[test]
    fn a_gpu_fault_reported_as_nvsentinel_does_takes_the_node_out_from_the_instant_it_began() {
        let at = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        let now = at("2026-11-23T12:00:00Z");
        let healthy = h100(json!({}), "True");
        assert_eq!(fault(&healthy, &settings(), now), None);
        let mut sick = healthy.clone();
        let conditions = sick.status.as_mut().unwrap().conditions.as_mut().unwrap();
        conditions.push(
            serde_json::from_value(
                json!({"type": "GpuXidError", "status": "True", "reason": "GpuXidErrorIsNotHealthy",
                "message": "ErrorCode:79 GPU has fallen off the bus", "lastTransitionTime": "2026-11-23T11:59:40Z"}),
            )
            .unwrap(),
        );
        // A condition of the same family that is fine says nothing.
        conditions.push(
            serde_json::from_value(json!({"type": "GpuThermalWatch", "status": "False",
                "lastTransitionTime": "2026-11-23T09:00:00Z"}))
            .unwrap(),
        );
        let f = fault(&sick, &settings(), now).expect("a fault");
        assert_eq!(f.since, at("2026-11-23T11:59:40Z"));
        assert_eq!(f.why, "GpuXidError: ErrorCode:79 GPU has fallen off the bus");
        assert!(node_gpus(&sick, &settings()).is_empty(), "a faulty node offers nothing");
        // Fault quarantine's taint alone (the node still Ready) is a fault too, from when it was added.
        let tainted = h100(
            json!({"taints": [{"key": "nvidia.com/gpu-xid-error", "value": "true", "effect": "NoSchedule",
                               "timeAdded": "2026-11-23T11:59:50Z"}]}),
            "True",
        );
        let f = fault(&tainted, &settings(), now).expect("a fault");
        assert_eq!(
            (f.since, f.why.as_str()),
            (at("2026-11-23T11:59:50Z"), "taint nvidia.com/gpu-xid-error=true:NoSchedule")
        );
    }

    #[test]
    fn gfd_sharing_labels_make_a_time_sliced_class_whose_unit_is_a_share_of_a_gpu() {
        let shared = |allocatable: serde_json::Value| {
            node(
                json!({"nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.memory": "15360",
                    "nvidia.com/gpu.count": "2", "nvidia.com/gpu.replicas": "4",
                    "nvidia.com/gpu.sharing-strategy": "time-slicing"}),
                allocatable,
                json!({}),
                "True",
            )
        };
        let gpus = node_gpus(&shared(json!({"nvidia.com/gpu": "8"})), &settings());
        assert_eq!(gpus.len(), 1, "{gpus:?}");
        let g = &gpus[0];
        assert_eq!((g.entry.gpu_class.as_str(), g.entry.gpus), ("tesla-t4.shared-4", 8));
        assert_eq!((g.class.kind.as_str(), g.class.fraction_milli, g.class.memory_mib), ("time-slice", 250, 15360));
        assert_eq!(g.resource, "nvidia.com/gpu");
        // The device plugin's `renameByDefault` offers them as `nvidia.com/gpu.shared`.
        let renamed = node_gpus(&shared(json!({"nvidia.com/gpu.shared": "8"})), &settings());
        assert_eq!((renamed[0].resource.as_str(), renamed[0].entry.gpus), ("nvidia.com/gpu.shared", 8));
        // Without a sharing strategy the replicas label alone changes nothing.
        let mut plain = shared(json!({"nvidia.com/gpu": "2"}));
        plain.metadata.labels.as_mut().unwrap().remove("nvidia.com/gpu.sharing-strategy");
        let whole = node_gpus(&plain, &settings());
        assert_eq!((whole[0].class.kind.as_str(), whole[0].entry.gpus), ("whole", 2));
    }

    #[test]
    fn a_gpu_node_offers_its_allocatable_gpus_with_class_and_topology_from_its_labels() {
        let gpus = node_gpus(&h100(json!({}), "True"), &settings());
        assert_eq!(gpus.len(), 1);
        let g = &gpus[0];
        assert_eq!(g.entry.gpu_class, "h100-80gb");
        assert_eq!(g.entry.gpus, 8);
        assert_eq!(g.entry.rack.as_deref(), Some("r1"));
        assert_eq!(g.entry.zone.as_deref(), Some("z1"));
        assert_eq!(g.entry.nvlink_domain_size, 8);
        assert_eq!(g.class.memory_mib, 81559);
        assert_eq!(g.class.kind, "whole");
        assert_eq!(g.resource, "nvidia.com/gpu");
        assert_eq!(g.hostname, "gpu-1.example");
    }

    #[test]
    fn what_other_pods_ask_of_a_node_is_taken_off_the_cpu_and_memory_it_gives_replicas() {
        let pod = |node: &str, phase: &str, spec: serde_json::Value| -> Pod {
            let mut spec = spec;
            spec["nodeName"] = json!(node);
            serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec, "status": {"phase": phase}}))
                .unwrap()
        };
        let asks = |cpu: &str, memory: &str| json!({"requests": {"cpu": cpu, "memory": memory}});
        // A DaemonSet's pod: two containers, an init container larger than neither in sum, a
        // sidecar that keeps running, and an overhead.
        let daemon = pod(
            "gpu-1",
            "Running",
            json!({
                "containers": [{"name": "a", "resources": asks("500m", "256Mi")}, {"name": "b", "resources": asks("1", "1Gi")}],
                "initContainers": [
                    {"name": "setup", "resources": asks("1", "512Mi")},
                    {"name": "proxy", "restartPolicy": "Always", "resources": asks("250m", "128Mi")}
                ],
                "overhead": {"cpu": "100m", "memory": "64Mi"}
            }),
        );
        assert_eq!(pod_requests(&daemon), (1_850, 1_472));
        // An init container larger than the rest is what the pod holds while it runs first.
        let big_init = pod(
            "gpu-1",
            "Pending",
            json!({"containers": [{"name": "a", "resources": asks("1", "1Gi")}],
                   "initContainers": [{"name": "warm", "resources": asks("4", "512Mi")}]}),
        );
        assert_eq!(pod_requests(&big_init), (4_000, 1_024));
        let done = pod("gpu-1", "Succeeded", json!({"containers": [{"name": "a", "resources": asks("8", "8Gi")}]}));
        let elsewhere = pod("cpu-1", "Running", json!({"containers": [{"name": "a", "resources": asks("8", "8Gi")}]}));
        let held = held_by_pods([&daemon, &big_init, &done, &elsewhere]);
        assert_eq!(held.get("gpu-1"), Some(&(5_850, 2_496)), "a finished pod holds nothing");
        let entry = InventoryNode {
            name: "gpu-1".into(),
            gpu_class: "h100-80gb".into(),
            gpus: 8,
            nvlink_domain_size: 0,
            rack: None,
            zone: None,
            elastic: false,
            spot: false,
            price_micros_per_gpu_hour: None,
            driver_version: None,
            cuda_version: None,
            cpu_millis: Some(96_000),
            memory_mib: Some(2_000),
        };
        let [left] = less_held(vec![entry], &held).try_into().unwrap();
        assert_eq!((left.cpu_millis, left.memory_mib), (Some(90_150), Some(0)), "never below nothing");
    }

    #[test]
    fn a_one_class_node_gives_its_allocatable_cpu_and_memory_and_a_split_one_gives_none() {
        let mut n = h100(json!({}), "True");
        let allocatable = n.status.as_mut().unwrap().allocatable.as_mut().unwrap();
        allocatable
            .insert("memory".into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("2113175188Ki".into()));
        let g = &node_gpus(&n, &settings())[0];
        assert_eq!((g.entry.cpu_millis, g.entry.memory_mib), (Some(96_000), Some(2_063_647)));
        let mixed = node(
            json!({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/mig-3g.40gb.memory": "40192",
                "nvidia.com/mig-1g.10gb.memory": "9728"}),
            json!({"nvidia.com/mig-3g.40gb": "4", "nvidia.com/mig-1g.10gb": "6", "cpu": "64", "memory": "512Gi"}),
            json!({}),
            "True",
        );
        let gpus = node_gpus(&mixed, &settings());
        assert_eq!(gpus.len(), 2);
        assert!(gpus.iter().all(|g| g.entry.cpu_millis.is_none() && g.entry.memory_mib.is_none()));
    }

    #[test]
    fn kubernetes_quantities_of_cpu_and_memory_are_read_in_every_common_form() {
        assert_eq!(cpu_millis("96"), Some(96_000));
        assert_eq!(cpu_millis("63500m"), Some(63_500));
        assert_eq!(cpu_millis("0.5"), Some(500));
        assert_eq!(cpu_millis("lots"), None);
        assert_eq!(cpu_millis("-1"), None);
        assert_eq!(memory_mib("512Gi"), Some(512 * 1024));
        assert_eq!(memory_mib("1048576Ki"), Some(1024));
        assert_eq!(memory_mib("16G"), Some(15_258));
        assert_eq!(memory_mib("1073741824"), Some(1024));
        assert_eq!(memory_mib("1Ei"), None);
    }

    #[test]
    fn cordoned_not_ready_and_foreign_tainted_nodes_offer_nothing() {
        assert!(node_gpus(&h100(json!({"unschedulable": true}), "True"), &settings()).is_empty());
        assert!(node_gpus(&h100(json!({}), "False"), &settings()).is_empty());
        let foreign = json!({"taints": [{"key": "maintenance", "effect": "NoSchedule"}]});
        assert!(node_gpus(&h100(foreign, "True"), &settings()).is_empty());
        let gpu_taint = json!({"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]});
        assert_eq!(node_gpus(&h100(gpu_taint, "True"), &settings()).len(), 1);
    }

    #[test]
    fn mixed_mig_nodes_offer_one_class_per_profile_requested_by_its_own_resource() {
        let n = node(
            json!({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/mig.strategy": "mixed",
                "nvidia.com/mig-3g.40gb.memory": "40192"}),
            json!({"nvidia.com/gpu": "0", "nvidia.com/mig-3g.40gb": "4", "nvidia.com/mig-1g.10gb": "6"}),
            json!({}),
            "True",
        );
        let gpus = node_gpus(&n, &settings());
        let by_class: BTreeMap<_, _> = gpus.iter().map(|g| (g.entry.gpu_class.as_str(), g)).collect();
        assert_eq!(by_class.len(), 2);
        let big = by_class["a100-sxm4-80gb.mig-3g.40gb"];
        assert_eq!(
            (big.entry.gpus, big.resource.as_str(), big.class.kind.as_str()),
            (4, "nvidia.com/mig-3g.40gb", "mig")
        );
        assert_eq!(big.class.memory_mib, 40192);
        assert_eq!(big.class.fraction_milli, 428);
        assert_eq!(by_class["a100-sxm4-80gb.mig-1g.10gb"].entry.gpus, 6);
        assert_eq!(by_class["a100-sxm4-80gb.mig-1g.10gb"].class.memory_mib, 10240, "from the profile's name");
    }

    #[test]
    fn single_strategy_mig_nodes_are_one_mig_class_requested_as_gpus() {
        let n = node(
            json!({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "nvidia.com/mig.strategy": "single"}),
            json!({"nvidia.com/gpu": "56"}),
            json!({}),
            "True",
        );
        let gpus = node_gpus(&n, &settings());
        assert_eq!(gpus.len(), 1);
        assert_eq!(gpus[0].entry.gpu_class, "a100-sxm4-40gb.mig-1g.5gb");
        assert_eq!(gpus[0].resource, "nvidia.com/gpu");
        assert_eq!(gpus[0].entry.gpus, 56);
    }

    #[test]
    fn node_selectors_match_equality_existence_and_absence() {
        let labels = BTreeMap::from([("gpu".to_owned(), "true".to_owned()), ("pool".to_owned(), "a".to_owned())]);
        assert!(selector_matches("gpu=true", &labels));
        assert!(selector_matches("gpu==true, pool", &labels));
        assert!(selector_matches("pool!=b,!spot", &labels));
        assert!(!selector_matches("gpu=true,pool=b", &labels));
        assert!(!selector_matches("spot", &labels));
        assert!(!selector_matches("!pool", &labels));
    }

    #[test]
    fn a_node_is_lost_only_after_being_not_ready_for_a_while() {
        let n = h100(json!({}), "False");
        let at = |s: &str| s.parse::<DateTime<Utc>>().unwrap();
        let after = chrono::Duration::seconds(60);
        assert!(lost_nodes([&n].into_iter(), at("2026-11-23T10:00:30Z"), after).is_empty());
        assert!(lost_nodes([&n].into_iter(), at("2026-11-23T10:01:00Z"), after).contains("gpu-1"));
        let ok = h100(json!({}), "True");
        assert!(lost_nodes([&ok].into_iter(), at("2026-11-23T11:00:00Z"), after).is_empty());
    }

    /// GPU Feature Discovery's labels as NVML's answers on a real H200 give them
    /// (`server/data/gpu/h200/facts.json`, captured by `server/data/gpu/capture.py`).
    fn h200_labels() -> BTreeMap<String, String> {
        let facts: serde_json::Value = serde_json::from_str(include_str!("../../../data/gpu/h200/facts.json")).unwrap();
        serde_json::from_value(facts["gfd_labels"].clone()).unwrap()
    }

    #[test]
    fn a_nodes_driver_and_cuda_versions_come_from_gfds_labels_as_a_real_h200_gives_them() {
        let labels = h200_labels();
        assert_eq!(driver_version(&labels).as_deref(), Some("580.159.04"), "as nvidia-smi prints it");
        assert_eq!(cuda_version(&labels).as_deref(), Some("13.0"));
        let mut gfd = serde_json::to_value(&labels).unwrap();
        gfd["kubernetes.io/hostname"] = json!("gpu-1");
        let gpus = node_gpus(&node(gfd, json!({"nvidia.com/gpu": "1"}), json!({}), "True"), &settings());
        assert_eq!(gpus[0].entry.gpu_class, "h200");
        assert_eq!(gpus[0].class.memory_mib, 143771);
        assert_eq!(
            (gpus[0].entry.driver_version.as_deref(), gpus[0].entry.cuda_version.as_deref()),
            (Some("580.159.04"), Some("13.0"))
        );
    }

    #[test]
    fn older_gfd_releases_driver_labels_in_parts_are_read_too_and_nonsense_is_not() {
        let parts = |keys: [(&str, &str); 3]| -> BTreeMap<String, String> {
            keys.iter().filter(|(_, v)| !v.is_empty()).map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
        };
        let old = parts([
            ("nvidia.com/cuda.driver.major", "535"),
            ("nvidia.com/cuda.driver.minor", "104"),
            ("nvidia.com/cuda.driver.rev", "05"),
        ]);
        assert_eq!(driver_version(&old).as_deref(), Some("535.104.05"));
        let runtime =
            parts([("nvidia.com/cuda.runtime.major", "12"), ("nvidia.com/cuda.runtime.minor", "2"), ("", "")]);
        assert_eq!(cuda_version(&runtime).as_deref(), Some("12.2"));
        let mut bad = h200_labels();
        bad.insert("nvidia.com/cuda.driver-version.full".into(), "latest".into());
        assert_eq!(
            driver_version(&bad).as_deref(),
            Some("580.159.04"),
            "the parts stand in for a full label that is not a version"
        );
        assert_eq!(driver_version(&BTreeMap::new()), None);
    }
}
