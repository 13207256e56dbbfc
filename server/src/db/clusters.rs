//! Clusters and the GPU capacity they hold.

use crate::domain::ClusterId;
use crate::domain::GpuClassId;
use crate::domain::TeamId;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::Tx;

/// A stored cluster.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClusterRow {
    pub id: ClusterId,
    pub name: String,
    pub backend: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub version: i64,
}

/// One class's capacity in a cluster.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CapacityRow {
    pub cluster: String,
    pub gpu_class: String,
    pub gpus: i32,
}

/// All clusters by name.
pub async fn list(pool: &PgPool) -> Result<Vec<ClusterRow>, sqlx::Error> {
    sqlx::query_as!(ClusterRow, "select id, name, backend, created_at, updated_at, version from clusters order by name")
        .fetch_all(pool)
        .await
}

/// Capacity of every cluster, by cluster and class name.
pub async fn capacity(db: impl sqlx::PgExecutor<'_>) -> Result<Vec<CapacityRow>, sqlx::Error> {
    sqlx::query_as!(
        CapacityRow,
        "select cl.name as cluster, c.name as gpu_class, cc.gpus
         from cluster_capacity cc
         join clusters cl on cl.id = cc.cluster_id
         join gpu_classes c on c.id = cc.gpu_class_id
         order by cl.name, c.name"
    )
    .fetch_all(db)
    .await
}

/// The cluster called `name`, locked for update.
pub async fn get_for_update(tx: &mut Tx<'_>, name: &str) -> Result<Option<ClusterRow>, sqlx::Error> {
    sqlx::query_as!(
        ClusterRow,
        "select id, name, backend, created_at, updated_at, version from clusters where name = $1 for update",
        name
    )
    .fetch_optional(&mut **tx)
    .await
}

/// Creates or updates a cluster and replaces its capacity.
pub async fn upsert(
    tx: &mut Tx<'_>,
    name: &str,
    backend: &str,
    capacity: &[(GpuClassId, i32)],
) -> Result<ClusterRow, sqlx::Error> {
    let row = sqlx::query_as!(
        ClusterRow,
        "insert into clusters (id, name, backend) values ($1, $2, $3)
         on conflict (name) do update
         set backend = excluded.backend, updated_at = now(), version = clusters.version + 1
         returning id, name, backend, created_at, updated_at, version",
        ClusterId::new() as ClusterId,
        name,
        backend
    )
    .fetch_one(&mut **tx)
    .await?;
    sqlx::query!("delete from cluster_capacity where cluster_id = $1", row.id as ClusterId).execute(&mut **tx).await?;
    let (classes, gpus): (Vec<GpuClassId>, Vec<i32>) = capacity.iter().copied().unzip();
    sqlx::query!(
        "insert into cluster_capacity (cluster_id, gpu_class_id, gpus)
         select $1, c, g from unnest($2::uuid[], $3::int4[]) as t(c, g)",
        row.id as ClusterId,
        &classes as &[GpuClassId],
        &gpus
    )
    .execute(&mut **tx)
    .await?;
    Ok(row)
}

/// The GPUs of `class_id` the platform knows of across all clusters; `None` when no
/// cluster declares any capacity at all (nothing to compare against).
pub async fn known_capacity(tx: &mut Tx<'_>, class_id: GpuClassId) -> Result<Option<i64>, sqlx::Error> {
    let row = sqlx::query!(
        r#"select (select count(*) from cluster_capacity) as "any!",
                  (select coalesce(sum(gpus), 0) from cluster_capacity where gpu_class_id = $1) as "gpus!""#,
        class_id as GpuClassId
    )
    .fetch_one(&mut **tx)
    .await?;
    Ok((row.any > 0).then_some(row.gpus))
}

/// One node's units of one GPU class, as the cluster view draws them.
#[derive(Debug, Clone)]
pub struct NodeUnits {
    pub cluster: String,
    pub node: String,
    pub rack: Option<String>,
    pub gpu_class: String,
    pub kind: String,
    pub fraction_milli: i32,
    pub units: i32,
    pub elastic: bool,
    /// GPUs per NVLink domain on the node; 0 when unknown (one domain).
    pub nvlink_domain_size: i32,
}

/// Every node's units, by cluster, rack and node.
pub async fn layout(pool: &PgPool) -> Result<Vec<NodeUnits>, sqlx::Error> {
    sqlx::query_as!(
        NodeUnits,
        r#"select c.name as cluster, n.name as node, n.rack, g.name as gpu_class, g.kind, g.fraction_milli,
                  n.gpus as units, n.elastic, n.nvlink_domain_size
           from cluster_nodes n
           join clusters c on c.id = n.cluster_id
           join gpu_classes g on g.id = n.gpu_class_id
           order by c.name, n.rack nulls last, n.name, g.fraction_milli desc, g.name"#
    )
    .fetch_all(pool)
    .await
}

/// Where a job holding GPUs sits.
#[derive(Debug, Clone)]
pub struct HeldPlacement {
    pub cluster: String,
    pub team_id: TeamId,
    pub team: String,
    pub job_name: String,
    pub gpu_class: String,
    /// `[{"node": name, "gpus": [unit, ...]}]` per replica.
    pub placement: serde_json::Value,
}

/// The placements of every job holding GPUs.
pub async fn held_placements(pool: &PgPool) -> Result<Vec<HeldPlacement>, sqlx::Error> {
    sqlx::query_as!(
        HeldPlacement,
        r#"select c.name as cluster, j.team_id, t.name as team, j.name as job_name, g.name as gpu_class,
                  j.placement as "placement!"
           from jobs j
           join clusters c on c.id = j.cluster_id
           join teams t on t.id = j.team_id
           join gpu_classes g on g.id = j.gpu_class_id
           where j.holds_gpus and j.placement is not null"#
    )
    .fetch_all(pool)
    .await
}

/// A node whose GPUs report a fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultRow {
    pub cluster: String,
    pub node: String,
    pub since: chrono::DateTime<chrono::Utc>,
    pub why: String,
    pub source: crate::domain::gpu_health::FaultSource,
}

/// Every node fault: those recorded at the clusters' last inventory syncs and those DCGM's
/// fields opened (one row per node, its GPUs' reasons joined), by cluster and node.
pub async fn faults(pool: &PgPool) -> Result<Vec<FaultRow>, sqlx::Error> {
    sqlx::query_as!(
        FaultRow,
        r#"select c.name as "cluster!", f.node as "node!", f.since as "since!", f.why as "why!",
                  f.source as "source!: crate::domain::gpu_health::FaultSource"
           from (select cluster_id, node, since, why, 'node' as source from node_faults
                 union all
                 select cluster_id, node, min(since), string_agg('GPU ' || gpu || ': ' || why, '; ' order by gpu), 'dcgm'
                 from gpu_faults group by cluster_id, node) f
           join clusters c on c.id = f.cluster_id
           order by c.name, f.node, f.source"#
    )
    .fetch_all(pool)
    .await
}

/// Nodes of one GPU class of one cluster that run one driver stack.
#[derive(Debug, Clone)]
pub struct DriverRow {
    pub cluster: String,
    pub gpu_class: String,
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
    pub nodes: i64,
    pub gpus: i64,
}

/// Per cluster and GPU class, the driver stacks its nodes run (cloud pools included where
/// they say), as of the last inventory syncs.
pub async fn drivers(pool: &PgPool) -> Result<Vec<DriverRow>, sqlx::Error> {
    sqlx::query_as!(
        DriverRow,
        r#"select c.name as cluster, g.name as gpu_class, n.driver_version, n.cuda_version,
                  count(distinct n.name) as "nodes!", sum(n.gpus)::int8 as "gpus!"
           from cluster_nodes n
           join clusters c on c.id = n.cluster_id
           join gpu_classes g on g.id = n.gpu_class_id
           group by c.name, g.name, n.driver_version, n.cuda_version
           order by c.name, g.name, n.driver_version, n.cuda_version"#
    )
    .fetch_all(pool)
    .await
}
