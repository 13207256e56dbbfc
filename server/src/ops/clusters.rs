//! Clusters and the GPU capacity the platform knows of.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{audit::record, Precondition, Result};
use crate::{
    auth::Principal,
    db,
    domain::{
        check_range,
        driver::{mixed_warning, Installed},
        FieldError, TeamName, MAX_GPUS,
    },
    state::AppState,
};

/// Backends a cluster can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// The built-in simulated GPU cluster.
    Sim,
    Kubernetes,
    AwsBatch,
    GcpBatch,
}

impl Backend {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Sim => "sim",
            Backend::Kubernetes => "kubernetes",
            Backend::AwsBatch => "aws-batch",
            Backend::GcpBatch => "gcp-batch",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        [Backend::Sim, Backend::Kubernetes, Backend::AwsBatch, Backend::GcpBatch].into_iter().find(|b| b.as_str() == s)
    }
}

/// A cluster as declared by an admin.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    pub backend: Backend,
    /// GPUs per GPU class name.
    #[serde(default)]
    pub capacity: BTreeMap<String, i64>,
}

/// Declares cluster `name` and its capacity, replacing what was declared before, audited.
/// The parsed name, and whether the cluster is new.
pub async fn put(
    state: &AppState,
    principal: &Principal,
    name: &str,
    precondition: &Precondition,
    spec: &ClusterSpec,
) -> Result<(String, bool)> {
    // Cluster names follow the same DNS-label rule as team names.
    let name = TeamName::parse("cluster", name)?;
    let mut capacity = Vec::new();
    for (class_name, gpus) in &spec.capacity {
        let field = format!("capacity.{class_name}");
        check_range(&field, *gpus, 0, MAX_GPUS)?;
        let class = db::gpu_classes::by_name(&state.db, class_name).await?.ok_or_else(|| {
            FieldError::new(field.clone(), "not_found", format!("GPU class {class_name} does not exist"))
        })?;
        capacity.push((class.id, *gpus as i32));
    }
    let mut tx = state.db.begin().await?;
    let before = db::clusters::get_for_update(&mut tx, name.as_str()).await?;
    precondition.check(before.as_ref().map_or(0, |b| b.version))?;
    db::clusters::upsert(&mut tx, name.as_str(), spec.backend.as_str(), &capacity).await?;
    let capacity_after = db::clusters::capacity(&mut *tx).await?;
    let after: BTreeMap<&str, i32> =
        capacity_after.iter().filter(|r| r.cluster == name.as_str()).map(|r| (r.gpu_class.as_str(), r.gpus)).collect();
    record(
        &mut tx,
        principal,
        "cluster.put",
        "cluster",
        name.as_str(),
        None,
        before.as_ref(),
        Some(&serde_json::json!({"backend": spec.backend, "capacity": after})),
    )
    .await?;
    tx.commit().await?;
    Ok((name.as_str().to_owned(), before.is_none()))
}

/// Nodes of one GPU class that run one driver stack.
#[derive(Serialize, ToSchema)]
pub struct DriverView {
    pub gpu_class: String,
    /// The NVIDIA driver's version; null where the nodes do not say.
    #[schema(example = "550.90.07")]
    pub driver_version: Option<String>,
    /// The CUDA version that driver supports; null where the nodes do not say.
    #[schema(example = "12.4")]
    pub cuda_version: Option<String>,
    pub nodes: i64,
    pub gpus: i64,
}

/// Per cluster, the driver stacks its GPU classes' nodes run, and a warning for each class
/// that runs several (the cluster view's, in the API and the portal alike).
pub async fn drivers(db: &sqlx::PgPool) -> Result<BTreeMap<String, (Vec<DriverView>, Vec<String>)>> {
    let rows = db::clusters::drivers(db).await?;
    let mut by_class: BTreeMap<(String, String), Vec<Installed>> = BTreeMap::new();
    let mut out: BTreeMap<String, (Vec<DriverView>, Vec<String>)> = BTreeMap::new();
    for r in rows {
        by_class.entry((r.cluster.clone(), r.gpu_class.clone())).or_default().push(Installed {
            driver: r.driver_version.clone(),
            cuda: r.cuda_version.clone(),
            nodes: r.nodes,
            gpus: r.gpus,
        });
        out.entry(r.cluster).or_default().0.push(DriverView {
            gpu_class: r.gpu_class,
            driver_version: r.driver_version,
            cuda_version: r.cuda_version,
            nodes: r.nodes,
            gpus: r.gpus,
        });
    }
    for ((cluster, class), installed) in by_class {
        if let Some(warning) = mixed_warning(&class, &installed) {
            out.entry(cluster).or_default().1.push(warning);
        }
    }
    Ok(out)
}

/// The GPU faults a platform admin cleared on one node.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ClearedFaults {
    pub cluster: String,
    pub node: String,
    /// Each GPU cleared, with why it was out.
    pub gpus: Vec<ClearedGpu>,
}

/// One GPU whose fault was cleared.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ClearedGpu {
    /// Its ordinal on the node, as DCGM numbers it.
    pub gpu: String,
    pub why: String,
}

/// Clears the GPU faults DCGM reported on `node` of `cluster`, once a person has reset or
/// replaced its GPUs; audited. The node offers its GPUs again from the next inventory sync.
/// A node with no such fault is not found; faults its cluster reports (a condition or a
/// taint) clear with them, not here.
pub async fn clear_faults(state: &AppState, principal: &Principal, cluster: &str, node: &str) -> Result<ClearedFaults> {
    let mut tx = state.db.begin().await?;
    let cleared = db::health::clear_faults(&mut tx, cluster, node).await?;
    if cleared.is_empty() {
        return Err(super::Error::NotFound("GPU fault"));
    }
    let view = ClearedFaults {
        cluster: cluster.to_owned(),
        node: node.to_owned(),
        gpus: cleared.into_iter().map(|(gpu, why)| ClearedGpu { gpu, why }).collect(),
    };
    record(&mut tx, principal, "gpu_fault.clear", "node", &format!("{cluster}/{node}"), None, Some(&view), None::<&()>)
        .await?;
    tx.commit().await?;
    Ok(view)
}
