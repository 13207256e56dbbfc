//! Clusters and the GPU capacity the platform knows of.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{audit::record, Precondition, Result};
use crate::{
    auth::Principal,
    db,
    domain::{check_range, FieldError, TeamName, MAX_GPUS},
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
