//! Clusters and the GPU capacity the platform knows of.

use std::collections::BTreeMap;

use axum::{
    extract::{Path, State},
    http::StatusCode,
    Extension, Json,
};
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::{error::ApiError, extract::ApiJson};
use crate::domain::gpu_health::FaultSource;
use crate::{
    auth::Principal,
    db,
    ops::{
        clusters::{self, Backend, ClusterSpec},
        Precondition,
    },
    state::AppState,
};

/// A cluster and its capacity.
#[derive(Serialize, ToSchema)]
pub struct ClusterView {
    pub name: String,
    pub backend: Backend,
    /// GPUs per GPU class name.
    pub capacity: BTreeMap<String, i32>,
    /// Nodes whose GPUs report a fault (out of the capacity above until it clears), as of
    /// the last inventory sync.
    pub unhealthy_nodes: Vec<NodeFaultView>,
    /// Per GPU class, the driver stacks its nodes run, as the cluster reports them.
    pub drivers: Vec<clusters::DriverView>,
    /// A sentence per GPU class whose nodes run more than one driver version.
    pub driver_warnings: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub version: i64,
}

/// A node whose GPUs report a fault.
#[derive(Serialize, ToSchema)]
pub struct NodeFaultView {
    pub node: String,
    /// When the fault began, as the node reports it.
    pub since: DateTime<Utc>,
    /// What is wrong, in the reporter's words (a node condition's type and message, a taint,
    /// or each GPU's XID or row-remap failure as DCGM reported it).
    pub why: String,
    /// Who reported it: `node`, a condition or taint on the node, which clears when they do;
    /// `dcgm`, a GPU's DCGM fields, which a platform admin clears once the GPU is reset or
    /// replaced (`DELETE /api/v1/clusters/{cluster}/nodes/{node}/faults`).
    pub source: FaultSource,
}

async fn views(db: &sqlx::PgPool) -> Result<Vec<ClusterView>, ApiError> {
    let clusters = db::clusters::list(db).await?;
    let capacity = db::clusters::capacity(db).await?;
    let faults = db::clusters::faults(db).await?;
    let mut drivers = clusters::drivers(db).await?;
    Ok(clusters
        .into_iter()
        .map(|c| {
            let (stacks, driver_warnings) = drivers.remove(&c.name).unwrap_or_default();
            ClusterView {
                drivers: stacks,
                driver_warnings,
                unhealthy_nodes: faults
                    .iter()
                    .filter(|f| f.cluster == c.name)
                    .map(|f| NodeFaultView {
                        node: f.node.clone(),
                        since: f.since,
                        why: f.why.clone(),
                        source: f.source,
                    })
                    .collect(),
                capacity: capacity
                    .iter()
                    .filter(|r| r.cluster == c.name)
                    .map(|r| (r.gpu_class.clone(), r.gpus))
                    .collect(),
                name: c.name,
                backend: Backend::parse(&c.backend).unwrap_or(Backend::Sim),
                created_at: c.created_at,
                updated_at: c.updated_at,
                version: c.version,
            }
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
    let (name, created) = clusters::put(&state, &principal, &name, &if_match, &spec).await?;
    let view = views(&state.db).await?.into_iter().find(|c| c.name == name).ok_or(ApiError::NotFound("cluster"))?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(view)))
}

/// Clears the GPU faults DCGM reported on a node, once its GPUs were reset or replaced: the
/// node offers them again from the next inventory sync. Audited.
#[utoipa::path(
    delete, path = "/api/v1/clusters/{cluster}/nodes/{node}/faults", tag = "clusters", operation_id = "clear_node_faults",
    params(("cluster" = String, Path, description = "Cluster name"), ("node" = String, Path, description = "Node name")),
    responses((status = 200, description = "The faults cleared", body = clusters::ClearedFaults),
              (status = 403, body = super::error::Problem), (status = 404, body = super::error::Problem))
)]
pub async fn clear_node_faults(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((cluster, node)): Path<(String, String)>,
) -> Result<Json<clusters::ClearedFaults>, ApiError> {
    Ok(Json(clusters::clear_faults(&state, &principal, &cluster, &node).await?))
}
