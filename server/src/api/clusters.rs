//! Clusters and the GPU capacity the platform knows of.

use std::collections::BTreeMap;

use axum::{
    extract::{Path, State},
    http::StatusCode,
    Extension, Json,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{error::ApiError, extract::ApiJson};
use crate::{
    auth::Principal,
    db,
    domain::{check_range, FieldError, TeamName, MAX_GPUS},
    ops::{audit::record, Precondition},
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
    fn as_str(self) -> &'static str {
        match self {
            Backend::Sim => "sim",
            Backend::Kubernetes => "kubernetes",
            Backend::AwsBatch => "aws-batch",
            Backend::GcpBatch => "gcp-batch",
        }
    }

    fn parse(s: &str) -> Option<Self> {
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

/// A cluster and its capacity.
#[derive(Serialize, ToSchema)]
pub struct ClusterView {
    pub name: String,
    pub backend: Backend,
    /// GPUs per GPU class name.
    pub capacity: BTreeMap<String, i32>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub version: i64,
}

async fn views(db: &sqlx::PgPool) -> Result<Vec<ClusterView>, ApiError> {
    let clusters = db::clusters::list(db).await?;
    let capacity = db::clusters::capacity(db).await?;
    Ok(clusters
        .into_iter()
        .map(|c| ClusterView {
            capacity: capacity.iter().filter(|r| r.cluster == c.name).map(|r| (r.gpu_class.clone(), r.gpus)).collect(),
            name: c.name,
            backend: Backend::parse(&c.backend).unwrap_or(Backend::Sim),
            created_at: c.created_at,
            updated_at: c.updated_at,
            version: c.version,
        })
        .collect())
}

/// Lists clusters with their capacity.
#[utoipa::path(
    get, path = "/api/v1/clusters", tag = "clusters", operation_id = "list_clusters",
    responses((status = 200, body = Vec<ClusterView>))
)]
pub async fn list_clusters(State(state): State<AppState>) -> Result<Json<Vec<ClusterView>>, ApiError> {
    Ok(Json(views(&state.db).await?))
}

/// Declares a cluster and its capacity, replacing what was declared before. Honours `If-Match`.
#[utoipa::path(
    put, path = "/api/v1/clusters/{cluster}", tag = "clusters", operation_id = "put_cluster",
    params(("cluster" = String, Path, description = "Cluster name"),
           ("If-Match" = Option<String>, Header, description = "ETag from a previous read")),
    request_body = ClusterSpec,
    responses((status = 200, description = "Updated", body = ClusterView), (status = 201, description = "Created", body = ClusterView),
              (status = 412, body = super::error::Problem), (status = 422, body = super::error::Problem))
)]
pub async fn put_cluster(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    if_match: Precondition,
    ApiJson(spec): ApiJson<ClusterSpec>,
) -> Result<(StatusCode, Json<ClusterView>), ApiError> {
    // Cluster names follow the same DNS-label rule as team names.
    let name = TeamName::parse("cluster", &name)?;
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
    if_match.check(before.as_ref().map_or(0, |b| b.version))?;
    db::clusters::upsert(&mut tx, name.as_str(), spec.backend.as_str(), &capacity).await?;
    let capacity_after = db::clusters::capacity(&mut *tx).await?;
    let after: BTreeMap<&str, i32> =
        capacity_after.iter().filter(|r| r.cluster == name.as_str()).map(|r| (r.gpu_class.as_str(), r.gpus)).collect();
    record(
        &mut tx,
        &principal,
        "cluster.put",
        "cluster",
        name.as_str(),
        None,
        before.as_ref(),
        Some(&serde_json::json!({"backend": spec.backend, "capacity": after})),
    )
    .await?;
    tx.commit().await?;
    let view =
        views(&state.db).await?.into_iter().find(|c| c.name == name.as_str()).ok_or(ApiError::NotFound("cluster"))?;
    let status = if before.is_some() { StatusCode::OK } else { StatusCode::CREATED };
    Ok((status, Json(view)))
}
