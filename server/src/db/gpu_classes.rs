//! GPU classes and their effective-dated rates.

use crate::domain::GpuClassId;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::Tx;

/// A stored GPU class with the rate in effect now.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuClassRow {
    pub id: GpuClassId,
    pub name: String,
    pub kind: String,
    pub memory_mib: i32,
    pub fraction_milli: i32,
    pub description: String,
    /// CPU (millicores) and memory (MiB) a replica gets per GPU of the class when its job
    /// names none; `None`: the platform's default.
    pub cpu_millis_per_gpu: Option<i32>,
    pub memory_mib_per_gpu: Option<i32>,
    /// Rate in effect now; `None` when every rate starts in the future.
    pub rate_micros_per_gpu_hour: Option<i64>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub version: i64,
}

/// What a replica gets per GPU of a class when its job names no CPU or memory; `None`: the
/// platform's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerGpu {
    pub cpu_millis: Option<i32>,
    pub memory_mib: Option<i32>,
}

/// One entry of a class's rate history.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RateRow {
    pub effective_from: DateTime<Utc>,
    pub rate_micros_per_gpu_hour: i64,
    pub created_at: DateTime<Utc>,
}

/// The class called `name`, in or outside a transaction.
pub async fn by_name(db: impl sqlx::PgExecutor<'_>, name: &str) -> Result<Option<GpuClassRow>, sqlx::Error> {
    sqlx::query_as!(
        GpuClassRow,
        r#"select c.id, c.name, c.kind, c.memory_mib, c.fraction_milli, c.description,
                  c.cpu_millis_per_gpu, c.memory_mib_per_gpu,
                  (select r.rate_micros_per_gpu_hour from gpu_class_rates r
                   where r.gpu_class_id = c.id and r.effective_from <= now()
                   order by r.effective_from desc limit 1) as rate_micros_per_gpu_hour,
                  c.created_at, c.updated_at, c.version
           from gpu_classes c where c.name = $1"#,
        name
    )
    .fetch_optional(db)
    .await
}

/// Classes by name, after `after`.
pub async fn list(pool: &PgPool, after: Option<&str>, limit: i64) -> Result<Vec<GpuClassRow>, sqlx::Error> {
    sqlx::query_as!(
        GpuClassRow,
        r#"select c.id, c.name, c.kind, c.memory_mib, c.fraction_milli, c.description,
                  c.cpu_millis_per_gpu, c.memory_mib_per_gpu,
                  (select r.rate_micros_per_gpu_hour from gpu_class_rates r
                   where r.gpu_class_id = c.id and r.effective_from <= now()
                   order by r.effective_from desc limit 1) as rate_micros_per_gpu_hour,
                  c.created_at, c.updated_at, c.version
           from gpu_classes c where $1::text is null or c.name > $1
           order by c.name limit $2"#,
        after,
        limit
    )
    .fetch_all(pool)
    .await
}

/// Creates a class; fails on `gpu_classes_name_key` when the name is taken.
pub async fn insert(
    tx: &mut Tx<'_>,
    name: &str,
    kind: &str,
    memory_mib: i32,
    fraction_milli: i32,
    description: &str,
    per_gpu: PerGpu,
) -> Result<GpuClassId, sqlx::Error> {
    let row = sqlx::query!(
        "insert into gpu_classes (id, name, kind, memory_mib, fraction_milli, description, cpu_millis_per_gpu,
                                  memory_mib_per_gpu)
         values ($1, $2, $3, $4, $5, $6, $7, $8) returning id",
        GpuClassId::new() as GpuClassId,
        name,
        kind,
        memory_mib,
        fraction_milli,
        description,
        per_gpu.cpu_millis,
        per_gpu.memory_mib,
    )
    .fetch_one(&mut **tx)
    .await?;
    Ok(row.id.into())
}

/// Adds a rate effective from `effective_from` (the transaction's start when `None`, so the
/// database clock alone decides what is in effect); fails on `gpu_class_rates_pkey` when a
/// rate already starts at that instant.
pub async fn add_rate(
    tx: &mut Tx<'_>,
    class_id: GpuClassId,
    effective_from: Option<DateTime<Utc>>,
    rate_micros_per_gpu_hour: i64,
) -> Result<RateRow, sqlx::Error> {
    sqlx::query_as!(
        RateRow,
        "insert into gpu_class_rates (gpu_class_id, effective_from, rate_micros_per_gpu_hour)
         values ($1, coalesce($2, now()), $3) returning effective_from, rate_micros_per_gpu_hour, created_at",
        class_id as GpuClassId,
        effective_from,
        rate_micros_per_gpu_hour
    )
    .fetch_one(&mut **tx)
    .await
}

/// The rate history of a class, oldest first.
pub async fn rates(pool: &PgPool, class_id: GpuClassId) -> Result<Vec<RateRow>, sqlx::Error> {
    sqlx::query_as!(
        RateRow,
        "select effective_from, rate_micros_per_gpu_hour, created_at
         from gpu_class_rates where gpu_class_id = $1 order by effective_from",
        class_id as GpuClassId
    )
    .fetch_all(pool)
    .await
}

/// Locks a class against other changes and returns its version. Jobs and nodes that point
/// at the class may still be written meanwhile (see `db::quotas::context_for_update`).
pub async fn lock(tx: &mut Tx<'_>, id: GpuClassId) -> Result<Option<i64>, sqlx::Error> {
    let row = sqlx::query!("select version from gpu_classes where id = $1 for no key update", id as GpuClassId)
        .fetch_optional(&mut **tx)
        .await?;
    Ok(row.map(|r| r.version))
}

/// Changes the description, memory and per-GPU defaults of a class (its kind and fraction
/// are fixed: jobs and usage already refer to them).
pub async fn update(
    tx: &mut Tx<'_>,
    id: GpuClassId,
    memory_mib: i32,
    description: &str,
    per_gpu: PerGpu,
) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "update gpu_classes set memory_mib = $2, description = $3, cpu_millis_per_gpu = $4, memory_mib_per_gpu = $5,
                                updated_at = now(), version = version + 1
         where id = $1",
        id as GpuClassId,
        memory_mib,
        description,
        per_gpu.cpu_millis,
        per_gpu.memory_mib,
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Names of the GPU classes that have no rate at all, not even a future one.
pub async fn unpriced(pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!(
        "select c.name from gpu_classes c
         where not exists (select 1 from gpu_class_rates r where r.gpu_class_id = c.id)
         order by c.name"
    )
    .fetch_all(pool)
    .await
}

/// How many GPU classes the catalogue has.
pub async fn count(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar!(r#"select count(*) as "n!" from gpu_classes"#).fetch_one(pool).await
}
