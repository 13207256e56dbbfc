//! GPU classes: the catalogue of schedulable GPU capacity and its rate card.

use crate::domain::GpuClassId;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{audit::record, Error, OnConstraint as _, Precondition, Result};
use crate::{
    auth::Principal,
    db::{
        self,
        gpu_classes::{GpuClassRow, PerGpu, RateRow},
    },
    domain::{check_range, workload, DisplayText, FieldError, GpuClassName, GpuKind},
    state::AppState,
};

/// Largest GPU memory accepted, in MiB (16 TiB: well beyond any device).
const MAX_MEMORY_MIB: i64 = 16 * 1024 * 1024;
/// Largest rate, in micro-units per GPU-hour (a million currency units).
const MAX_RATE_MICROS: i64 = 1_000_000_000_000;

/// A new GPU class.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewGpuClass {
    /// e.g. `h100-80gb` or `a100-80gb.mig-3g.40gb`.
    pub name: String,
    pub kind: GpuKind,
    /// GPU memory of one unit of this class, in MiB.
    #[schema(minimum = 1, maximum = 16777216)]
    pub memory_mib: i64,
    /// Share of one physical GPU in thousandths; must be 1000 for `whole`. Defaults to 1000.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000)]
    pub fraction_milli: Option<i64>,
    /// Price per GPU-hour in micro-units of the platform currency.
    #[schema(minimum = 0, maximum = 1e12)]
    pub rate_micros_per_gpu_hour: i64,
    /// When the first rate applies; defaults to now.
    #[serde(default)]
    pub rate_effective_from: Option<DateTime<Utc>>,
    #[serde(default)]
    pub description: Option<String>,
    /// CPU a replica of a job that names none gets per GPU of this class: cores (`8`) or
    /// millicores (`500m`). Default: 4 cores.
    #[serde(default)]
    #[schema(example = "8")]
    pub cpu_per_gpu: Option<String>,
    /// Memory a replica of a job that names none gets per GPU of this class (`64Gi`).
    /// Default: 16Gi.
    #[serde(default)]
    #[schema(example = "64Gi")]
    pub memory_per_gpu: Option<String>,
}

/// Changes to a GPU class. Its kind and fraction are fixed once created.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuClassPatch {
    #[schema(minimum = 1, maximum = 16777216)]
    pub memory_mib: Option<i64>,
    pub description: Option<String>,
    /// CPU per GPU for jobs that name none (`8`, `500m`); jobs already submitted keep theirs.
    #[schema(example = "8")]
    pub cpu_per_gpu: Option<String>,
    /// Memory per GPU for jobs that name none (`64Gi`); jobs already submitted keep theirs.
    #[schema(example = "64Gi")]
    pub memory_per_gpu: Option<String>,
}

/// A GPU class.
#[derive(Serialize, ToSchema)]
pub struct GpuClassView {
    pub id: GpuClassId,
    pub name: String,
    pub kind: GpuKind,
    pub memory_mib: i32,
    /// Share of one physical GPU in thousandths.
    pub fraction_milli: i32,
    pub description: String,
    /// CPU a replica of a job that names none gets per GPU of this class (the platform's
    /// default of 4 cores unless set).
    pub cpu_per_gpu: String,
    /// Memory a replica of a job that names none gets per GPU of this class (16Gi unless set).
    pub memory_per_gpu: String,
    /// The rate in effect now, in micro-units per GPU-hour; absent before the first rate starts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_micros_per_gpu_hour: Option<i64>,
    /// ISO 4217 currency of the rate.
    pub currency: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub version: i64,
}

/// The class as the catalogue shows it, with its current rate in `currency`.
pub fn view(row: GpuClassRow, currency: &str) -> GpuClassView {
    GpuClassView {
        id: row.id,
        name: row.name,
        kind: GpuKind::parse(&row.kind).unwrap_or(GpuKind::Whole),
        memory_mib: row.memory_mib,
        fraction_milli: row.fraction_milli,
        description: row.description,
        cpu_per_gpu: workload::format_cpu(row.cpu_millis_per_gpu.unwrap_or(workload::DEFAULT_CPU_MILLIS_PER_GPU)),
        memory_per_gpu: workload::format_memory(row.memory_mib_per_gpu.unwrap_or(workload::DEFAULT_MEMORY_MIB_PER_GPU)),
        rate_micros_per_gpu_hour: row.rate_micros_per_gpu_hour,
        currency: currency.to_owned(),
        created_at: row.created_at,
        updated_at: row.updated_at,
        version: row.version,
    }
}

/// The class named in a path, or 404.
pub async fn find(state: &AppState, name: &str) -> Result<GpuClassRow> {
    db::gpu_classes::by_name(&state.db, name).await?.ok_or(Error::NotFound("GPU class"))
}

/// A rate of a GPU class from a point in time on.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    /// When the rate starts to apply. Past periods keep the prices they had.
    pub effective_from: DateTime<Utc>,
    /// Price per GPU-hour in micro-units of the platform currency.
    #[schema(minimum = 0, maximum = 1e12)]
    pub rate_micros_per_gpu_hour: i64,
}

impl From<RateRow> for Rate {
    fn from(r: RateRow) -> Self {
        Self { effective_from: r.effective_from, rate_micros_per_gpu_hour: r.rate_micros_per_gpu_hour }
    }
}

/// Adds a rate to the class `name`'s rate card, audited; the API and the portal call this.
pub async fn add_rate(state: &AppState, principal: &Principal, name: &str, body: &Rate) -> Result<Rate> {
    let class = find(state, name).await?;
    check_range("rate_micros_per_gpu_hour", body.rate_micros_per_gpu_hour, 0, MAX_RATE_MICROS)?;
    // A minute of slack for clock skew between client and server.
    if body.effective_from < Utc::now() - chrono::Duration::minutes(1) {
        return Err(FieldError::new("effective_from", "in_the_past", "rates cannot be changed retroactively").into());
    }
    let mut tx = state.db.begin().await?;
    let row = db::gpu_classes::add_rate(&mut tx, class.id, Some(body.effective_from), body.rate_micros_per_gpu_hour)
        .await
        .on_constraint("gpu_class_rates_pkey", || {
            Error::conflict("rate_exists", Some("effective_from"), "a rate already starts at this instant")
        })?;
    let rate = Rate::from(row);
    record(
        &mut tx,
        principal,
        "gpu_class.rate.create",
        "gpu_class_rate",
        &format!("{name}@{}", rate.effective_from.to_rfc3339()),
        None,
        None::<&()>,
        Some(&rate),
    )
    .await?;
    tx.commit().await?;
    Ok(rate)
}

/// `current` with the CPU and memory per GPU that were given, parsed as a job's are.
fn per_gpu(current: PerGpu, cpu: Option<&str>, memory: Option<&str>) -> Result<PerGpu> {
    let mut errors = Vec::new();
    let mut out = current;
    if let Some(cpu) = cpu {
        match workload::parse_cpu("cpu_per_gpu", cpu) {
            Ok(millis) => out.cpu_millis = Some(millis),
            Err(e) => errors.push(e),
        }
    }
    if let Some(memory) = memory {
        match workload::parse_memory("memory_per_gpu", memory) {
            Ok(mib) => out.memory_mib = Some(mib),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(Error::Validation(errors))
    }
}

/// Adds a GPU class with its first rate, audited.
pub async fn create(state: &AppState, principal: &Principal, body: &NewGpuClass) -> Result<GpuClassRow> {
    let name = GpuClassName::parse("name", &body.name)?;
    check_range("memory_mib", body.memory_mib, 1, MAX_MEMORY_MIB)?;
    let fraction = body.fraction_milli.unwrap_or(1000);
    check_range("fraction_milli", fraction, 1, 1000)?;
    if body.kind == GpuKind::Whole && fraction != 1000 {
        return Err(
            FieldError::new("fraction_milli", "invalid_value", "a whole GPU class has fraction_milli 1000").into()
        );
    }
    if body.kind != GpuKind::Whole && fraction == 1000 {
        return Err(FieldError::new(
            "fraction_milli",
            "invalid_value",
            "a MIG or time-sliced class is a fraction of a GPU: below 1000",
        )
        .into());
    }
    check_range("rate_micros_per_gpu_hour", body.rate_micros_per_gpu_hour, 0, MAX_RATE_MICROS)?;
    let description = DisplayText::parse("description", body.description.as_deref().unwrap_or(""), 1000)?;
    let per_gpu = per_gpu(PerGpu::default(), body.cpu_per_gpu.as_deref(), body.memory_per_gpu.as_deref())?;
    let mut tx = state.db.begin().await?;
    let id = db::gpu_classes::insert(
        &mut tx,
        name.as_str(),
        body.kind.as_str(),
        body.memory_mib as i32,
        fraction as i32,
        description.as_str(),
        per_gpu,
    )
    .await
    .on_constraint("gpu_classes_name_key", || {
        Error::conflict("gpu_class_exists", Some("name"), format!("GPU class {name} already exists"))
    })?;
    db::gpu_classes::add_rate(&mut tx, id, body.rate_effective_from, body.rate_micros_per_gpu_hour).await?;
    let row = db::gpu_classes::by_name(&mut *tx, name.as_str()).await?.ok_or(Error::NotFound("GPU class"))?;
    record(
        &mut tx,
        principal,
        "gpu_class.create",
        "gpu_class",
        name.as_str(),
        None,
        None::<&()>,
        Some(&view(row.clone(), &state.config.currency)),
    )
    .await?;
    tx.commit().await?;
    Ok(row)
}

/// Changes a GPU class's memory or description, audited.
pub async fn update(
    state: &AppState,
    principal: &Principal,
    name: &str,
    precondition: &Precondition,
    body: &GpuClassPatch,
) -> Result<GpuClassRow> {
    let before = find(state, name).await?;
    let memory = body.memory_mib.unwrap_or(i64::from(before.memory_mib));
    check_range("memory_mib", memory, 1, MAX_MEMORY_MIB)?;
    let description =
        DisplayText::parse("description", body.description.as_deref().unwrap_or(&before.description), 1000)?;
    let per_gpu = per_gpu(
        PerGpu { cpu_millis: before.cpu_millis_per_gpu, memory_mib: before.memory_mib_per_gpu },
        body.cpu_per_gpu.as_deref(),
        body.memory_per_gpu.as_deref(),
    )?;
    let mut tx = state.db.begin().await?;
    let version = db::gpu_classes::lock(&mut tx, before.id).await?.ok_or(Error::NotFound("GPU class"))?;
    precondition.check(version)?;
    db::gpu_classes::update(&mut tx, before.id, memory as i32, description.as_str(), per_gpu).await?;
    let after = db::gpu_classes::by_name(&mut *tx, name).await?.ok_or(Error::NotFound("GPU class"))?;
    let currency = &state.config.currency;
    record(
        &mut tx,
        principal,
        "gpu_class.update",
        "gpu_class",
        name,
        None,
        Some(&view(before, currency)),
        Some(&view(after.clone(), currency)),
    )
    .await?;
    tx.commit().await?;
    Ok(after)
}
