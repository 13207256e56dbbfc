//! What the backends report: clusters, their nodes and GPUs, and GPU classes nobody
//! declared yet.

use crate::domain::{ClusterId, GpuClassId};

use super::Tx;

/// A node row as reported by a backend.
#[derive(Debug, Clone)]
pub struct NodeRow {
    pub cluster_id: ClusterId,
    pub cluster: String,
    pub name: String,
    pub gpu_class_id: GpuClassId,
    pub gpus: i32,
    pub nvlink_domain_size: i32,
    pub rack: Option<String>,
    pub zone: Option<String>,
    pub elastic: bool,
    pub spot: bool,
    pub price_micros_per_gpu_hour: Option<i64>,
    /// The driver and CUDA version its GPUs run, as its cluster reports them.
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
    /// The CPU (thousandths of a core) and memory (MiB) it gives to replicas; `None` where
    /// its cluster does not say.
    pub cpu_millis: Option<i32>,
    pub memory_mib: Option<i32>,
}

/// Ensures a cluster row exists and returns its id.
pub async fn ensure_cluster(tx: &mut Tx<'_>, name: &str, backend: &str) -> Result<ClusterId, sqlx::Error> {
    sqlx::query_scalar!(
        r#"insert into clusters (id, name, backend) values ($1, $2, $3)
         on conflict (name) do update set backend = excluded.backend
         returning id as "id: ClusterId""#,
        ClusterId::new() as ClusterId,
        name,
        backend
    )
    .fetch_one(&mut **tx)
    .await
}

/// Ensures a GPU class exists (classes a backend reports but nobody declared yet).
pub async fn ensure_gpu_class(
    tx: &mut Tx<'_>,
    name: &str,
    kind: &str,
    memory_mib: i32,
    fraction_milli: i32,
) -> Result<GpuClassId, sqlx::Error> {
    // An existing class is read, not updated: `do update` would lock its row `for update`
    // until the inventory's transaction ends, and every job, quota and node written
    // meanwhile checks its foreign key against that row (`for key share`), so submissions
    // waited for the sync, and a batch of them naming two classes could deadlock with it.
    let found = sqlx::query_scalar!(
        r#"with new as (
               insert into gpu_classes (id, name, kind, memory_mib, fraction_milli, description)
               values ($1, $2, $3, $4, $5, 'reported by a cluster')
               on conflict (name) do nothing
               returning id
           )
           select id as "id!: GpuClassId" from new
           union all
           select id from gpu_classes where name = $2"#,
        GpuClassId::new() as GpuClassId,
        name,
        kind,
        memory_mib,
        fraction_milli
    )
    .fetch_optional(&mut **tx)
    .await?;
    match found {
        Some(id) => Ok(id),
        // Another transaction inserted it after this statement's snapshot was taken; a new
        // statement sees it.
        None => {
            sqlx::query_scalar!(r#"select id as "id: GpuClassId" from gpu_classes where name = $1"#, name)
                .fetch_one(&mut **tx)
                .await
        }
    }
}

/// Ids of GPU classes by name.
pub async fn class_ids(tx: &mut Tx<'_>) -> Result<Vec<(String, GpuClassId)>, sqlx::Error> {
    let rows = sqlx::query!(r#"select name, id as "id: GpuClassId" from gpu_classes"#).fetch_all(&mut **tx).await?;
    Ok(rows.into_iter().map(|r| (r.name, r.id)).collect())
}

/// Replaces a cluster's nodes and its declared capacity with what its backend reports, less
/// the nodes with an open GPU fault (`db::health`).
pub async fn replace_nodes(tx: &mut Tx<'_>, cluster_id: ClusterId, nodes: &[NodeRow]) -> Result<(), sqlx::Error> {
    sqlx::query!("delete from cluster_nodes where cluster_id = $1", cluster_id as ClusterId).execute(&mut **tx).await?;
    let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let classes: Vec<GpuClassId> = nodes.iter().map(|n| n.gpu_class_id).collect();
    let gpus: Vec<i32> = nodes.iter().map(|n| n.gpus).collect();
    let domains: Vec<i32> = nodes.iter().map(|n| n.nvlink_domain_size).collect();
    let racks: Vec<Option<String>> = nodes.iter().map(|n| n.rack.clone()).collect();
    let zones: Vec<Option<String>> = nodes.iter().map(|n| n.zone.clone()).collect();
    let elastic: Vec<bool> = nodes.iter().map(|n| n.elastic).collect();
    let spot: Vec<bool> = nodes.iter().map(|n| n.spot).collect();
    let prices: Vec<Option<i64>> = nodes.iter().map(|n| n.price_micros_per_gpu_hour).collect();
    let drivers: Vec<Option<String>> = nodes.iter().map(|n| n.driver_version.clone()).collect();
    let cudas: Vec<Option<String>> = nodes.iter().map(|n| n.cuda_version.clone()).collect();
    let cpus: Vec<Option<i32>> = nodes.iter().map(|n| n.cpu_millis).collect();
    let memories: Vec<Option<i32>> = nodes.iter().map(|n| n.memory_mib).collect();
    sqlx::query!(
        "insert into cluster_nodes (cluster_id, name, gpu_class_id, gpus, nvlink_domain_size, rack, zone, elastic,
                                    spot, price_micros_per_gpu_hour, driver_version, cuda_version, cpu_millis,
                                    memory_mib)
         select $1, u.* from unnest($2::text[], $3::uuid[], $4::int4[], $5::int4[], $6::text[], $7::text[], $8::bool[],
                                    $9::bool[], $10::int8[], $11::text[], $12::text[], $13::int4[], $14::int4[])
                               as u(name, gpu_class_id, gpus, nvlink_domain_size, rack, zone, elastic, spot, price,
                                    driver_version, cuda_version, cpu_millis, memory_mib)
         -- A node with a GPU fault DCGM reported offers nothing until a platform admin clears it.
         where not exists (select 1 from gpu_faults f where f.cluster_id = $1 and f.node = u.name)",
        cluster_id as ClusterId,
        &names,
        &classes as &[GpuClassId],
        &gpus,
        &domains,
        &racks as &[Option<String>],
        &zones as &[Option<String>],
        &elastic,
        &spot,
        &prices as &[Option<i64>],
        &drivers as &[Option<String>],
        &cudas as &[Option<String>],
        &cpus as &[Option<i32>],
        &memories as &[Option<i32>]
    )
    .execute(&mut **tx)
    .await?;
    sqlx::query!("delete from cluster_capacity where cluster_id = $1", cluster_id as ClusterId)
        .execute(&mut **tx)
        .await?;
    // Per class, what submissions are validated against (see `db::jobs::submit_catalogue`).
    sqlx::query!(
        "insert into cluster_capacity (cluster_id, gpu_class_id, gpus, largest_node, largest_nvlink_domain,
                                       largest_rack, largest_zone)
         select n.cluster_id, n.gpu_class_id, sum(n.gpus)::int4, max(n.gpus),
                max(case when n.nvlink_domain_size = 0 or n.elastic then n.gpus
                         else least(n.gpus, n.nvlink_domain_size) end),
                (select max(s) from (select sum(r.gpus) as s from cluster_nodes r
                                     where r.cluster_id = n.cluster_id and r.gpu_class_id = n.gpu_class_id
                                     group by coalesce(r.rack, r.name)) x)::int4,
                (select max(s) from (select sum(z.gpus) as s from cluster_nodes z
                                     where z.cluster_id = n.cluster_id and z.gpu_class_id = n.gpu_class_id
                                     group by coalesce(z.zone, z.name)) x)::int4
         from cluster_nodes n where n.cluster_id = $1
         group by n.cluster_id, n.gpu_class_id",
        cluster_id as ClusterId
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// How many nodes, and how many cloud batch pools, offer GPU class `class`: a service's
/// replicas run only on nodes.
pub async fn class_nodes(pool: &sqlx::PgPool, class: GpuClassId) -> Result<(i64, i64), sqlx::Error> {
    let row = sqlx::query!(
        r#"select count(*) filter (where not elastic) as "fixed!", count(*) filter (where elastic) as "pools!"
           from cluster_nodes where gpu_class_id = $1"#,
        class as GpuClassId
    )
    .fetch_one(pool)
    .await?;
    Ok((row.fixed, row.pools))
}

/// The driver stacks the nodes of GPU class `class` run, across clusters: (driver version,
/// CUDA version, GPUs), as reported.
pub async fn class_drivers(
    pool: &sqlx::PgPool,
    class: GpuClassId,
) -> Result<Vec<(Option<String>, Option<String>, i64)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"select driver_version, cuda_version, sum(gpus)::int8 as "gpus!" from cluster_nodes
           where gpu_class_id = $1 group by driver_version, cuda_version"#,
        class as GpuClassId
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.driver_version, r.cuda_version, r.gpus)).collect())
}

/// Replaces the GPU faults recorded for a cluster's nodes: (node, since, why).
pub async fn replace_faults(
    tx: &mut Tx<'_>,
    cluster_id: ClusterId,
    faults: &[(String, chrono::DateTime<chrono::Utc>, String)],
) -> Result<(), sqlx::Error> {
    sqlx::query!("delete from node_faults where cluster_id = $1", cluster_id as ClusterId).execute(&mut **tx).await?;
    if faults.is_empty() {
        return Ok(());
    }
    let nodes: Vec<String> = faults.iter().map(|f| f.0.clone()).collect();
    let since: Vec<chrono::DateTime<chrono::Utc>> = faults.iter().map(|f| f.1).collect();
    let why: Vec<String> = faults.iter().map(|f| f.2.clone()).collect();
    sqlx::query!(
        "insert into node_faults (cluster_id, node, since, why)
         select $1, u.node, u.since, u.why from unnest($2::text[], $3::timestamptz[], $4::text[]) as u(node, since, why)
         on conflict do nothing",
        cluster_id as ClusterId,
        &nodes,
        &since,
        &why
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}
