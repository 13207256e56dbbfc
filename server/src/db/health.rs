//! GPU health from DCGM: the last value each GPU's health field read (so a sticky gauge opens
//! one fault per change, `domain::gpu_health::opens`), and the GPU faults it opened, which
//! keep their node out of the inventory until a platform admin clears them.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::Tx;

/// A GPU's health field: (host, GPU ordinal, field).
pub type FieldKey = (String, String, String);

/// The last value recorded for each of `keys` that has one.
pub async fn last_reads(tx: &mut Tx<'_>, keys: &[FieldKey]) -> Result<HashMap<FieldKey, f64>, sqlx::Error> {
    if keys.is_empty() {
        return Ok(HashMap::new());
    }
    let hosts: Vec<String> = keys.iter().map(|k| k.0.clone()).collect();
    let gpus: Vec<String> = keys.iter().map(|k| k.1.clone()).collect();
    let fields: Vec<String> = keys.iter().map(|k| k.2.clone()).collect();
    let rows = sqlx::query!(
        "select r.host, r.gpu, r.field, r.value from gpu_health_reads r
         join unnest($1::text[], $2::text[], $3::text[]) as u(host, gpu, field)
           on r.host = u.host and r.gpu = u.gpu and r.field = u.field",
        &hosts,
        &gpus,
        &fields
    )
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows.into_iter().map(|r| ((r.host, r.gpu, r.field), r.value)).collect())
}

/// Records the values that changed: (key, value), read at `at`.
pub async fn record_reads(tx: &mut Tx<'_>, reads: &[(FieldKey, f64)], at: DateTime<Utc>) -> Result<(), sqlx::Error> {
    if reads.is_empty() {
        return Ok(());
    }
    let hosts: Vec<String> = reads.iter().map(|r| r.0 .0.clone()).collect();
    let gpus: Vec<String> = reads.iter().map(|r| r.0 .1.clone()).collect();
    let fields: Vec<String> = reads.iter().map(|r| r.0 .2.clone()).collect();
    let values: Vec<f64> = reads.iter().map(|r| r.1).collect();
    sqlx::query!(
        "insert into gpu_health_reads (host, gpu, field, value, read_at)
         select u.host, u.gpu, u.field, u.value, $5
         from unnest($1::text[], $2::text[], $3::text[], $4::float8[]) as u(host, gpu, field, value)
         on conflict (host, gpu, field) do update set value = excluded.value, read_at = excluded.read_at",
        &hosts,
        &gpus,
        &fields,
        &values,
        at
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A GPU fault to open: (host, GPU ordinal, since, why).
pub type NewFault = (String, String, DateTime<Utc>, String);

/// A GPU fault opened, with its cluster's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenedFault {
    pub cluster: String,
    pub node: String,
    pub gpu: String,
    pub since: DateTime<Utc>,
    pub why: String,
}

/// Opens `faults` on the nodes of that name in any cluster's inventory, or out of it for a
/// fault (not cloud pools, whose failed instances their provider replaces). A GPU with an
/// open fault keeps it.
/// Returns the faults opened.
pub async fn open_faults(tx: &mut Tx<'_>, faults: &[NewFault]) -> Result<Vec<OpenedFault>, sqlx::Error> {
    if faults.is_empty() {
        return Ok(Vec::new());
    }
    let hosts: Vec<String> = faults.iter().map(|f| f.0.clone()).collect();
    let gpus: Vec<String> = faults.iter().map(|f| f.1.clone()).collect();
    let since: Vec<DateTime<Utc>> = faults.iter().map(|f| f.2).collect();
    let why: Vec<String> = faults.iter().map(|f| f.3.clone()).collect();
    sqlx::query_as!(
        OpenedFault,
        "with opened as (
             insert into gpu_faults (cluster_id, node, gpu, since, why)
             select distinct n.cluster_id, u.host, u.gpu, u.since, u.why
             from unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[]) as u(host, gpu, since, why)
             -- A node out of the inventory for a fault already (another GPU's, or one its
             -- cluster reports) still records this one: clearing the first must not bring
             -- back a node whose other GPU failed.
             join (select cluster_id, name from cluster_nodes where not elastic
                   union select cluster_id, node from node_faults
                   union select cluster_id, node from gpu_faults) n on n.name = u.host
             on conflict do nothing
             returning cluster_id, node, gpu, since, why)
         select c.name as cluster, o.node, o.gpu, o.since, o.why
         from opened o join clusters c on c.id = o.cluster_id
         order by c.name, o.node, o.gpu",
        &hosts,
        &gpus,
        &since,
        &why
    )
    .fetch_all(&mut **tx)
    .await
}

/// Clears the GPU faults of node `node` of cluster `cluster`; returns the GPUs cleared with
/// why each was out, none when the node had no fault.
pub async fn clear_faults(tx: &mut Tx<'_>, cluster: &str, node: &str) -> Result<Vec<(String, String)>, sqlx::Error> {
    let rows = sqlx::query!(
        "delete from gpu_faults f using clusters c
         where c.id = f.cluster_id and c.name = $1 and f.node = $2
         returning f.gpu, f.why",
        cluster,
        node
    )
    .fetch_all(&mut **tx)
    .await?;
    let mut cleared: Vec<(String, String)> = rows.into_iter().map(|r| (r.gpu, r.why)).collect();
    cleared.sort();
    Ok(cleared)
}

/// Every node with an open GPU fault: (cluster, node).
pub async fn faulted_nodes(pool: &sqlx::PgPool) -> Result<std::collections::BTreeSet<(String, String)>, sqlx::Error> {
    let rows = sqlx::query!(
        "select distinct c.name as cluster, f.node from gpu_faults f join clusters c on c.id = f.cluster_id"
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|r| (r.cluster, r.node)).collect())
}
