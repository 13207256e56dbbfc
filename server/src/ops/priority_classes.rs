//! Priority classes: priority, preemptibility, fair-share usage factor, price multiplier.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{audit::record, Error, Precondition, Result};
use crate::{
    auth::Principal,
    db::{self, priority_classes::PriorityClassRow},
    domain::{check_range, DisplayText, PriorityClassName},
    state::AppState,
};

/// A priority class as written by an admin.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PriorityClassSpec {
    /// Higher runs first; -1,000,000 to 1,000,000.
    #[schema(minimum = -1000000, maximum = 1000000)]
    pub priority: i64,
    /// Whether jobs of this class may be preempted.
    pub preemptible: bool,
    /// Weight of this class's usage in fair share, in thousandths (1000 = counted in full).
    #[schema(minimum = 0, maximum = 10000)]
    pub usage_factor_milli: i64,
    /// Multiplier on the rate card, in thousandths (1000 = list price).
    #[schema(minimum = 0, maximum = 100000)]
    pub price_multiplier_milli: i64,
    /// How long a job of this class waits for capacity (jobs ending, nodes an autoscaler or a
    /// cloud pool adds) after it entered the queue before it may preempt anyone; 0 to 86,400,
    /// default 0: it preempts at once. A job may set its own.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 86400)]
    pub preemption_delay_seconds: i64,
    #[serde(default)]
    pub description: Option<String>,
}

/// A new priority class.
#[derive(Deserialize, ToSchema)]
#[serde(from = "NewPriorityClassFields")]
pub struct NewPriorityClass {
    pub name: String,
    // For the schema only: read through `NewPriorityClassFields`.
    #[serde(flatten)]
    pub spec: PriorityClassSpec,
}

/// A new priority class as sent, every field at one level. serde's `flatten` would buffer the
/// fields, losing the path of a bad one (every error named `body`) and letting unknown fields
/// pass.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewPriorityClassFields {
    name: String,
    priority: i64,
    preemptible: bool,
    usage_factor_milli: i64,
    price_multiplier_milli: i64,
    #[serde(default)]
    preemption_delay_seconds: i64,
    #[serde(default)]
    description: Option<String>,
}

impl From<NewPriorityClassFields> for NewPriorityClass {
    fn from(f: NewPriorityClassFields) -> Self {
        Self {
            name: f.name,
            spec: PriorityClassSpec {
                priority: f.priority,
                preemptible: f.preemptible,
                usage_factor_milli: f.usage_factor_milli,
                price_multiplier_milli: f.price_multiplier_milli,
                preemption_delay_seconds: f.preemption_delay_seconds,
                description: f.description,
            },
        }
    }
}

/// A priority class.
#[derive(Serialize, ToSchema)]
pub struct PriorityClassView {
    pub name: String,
    pub priority: i32,
    pub preemptible: bool,
    pub usage_factor_milli: i32,
    pub price_multiplier_milli: i32,
    /// How long its jobs wait for capacity before they may preempt anyone.
    pub preemption_delay_seconds: i32,
    pub description: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub version: i64,
}

impl From<PriorityClassRow> for PriorityClassView {
    fn from(r: PriorityClassRow) -> Self {
        Self {
            name: r.name,
            priority: r.priority,
            preemptible: r.preemptible,
            usage_factor_milli: r.usage_factor_milli,
            price_multiplier_milli: r.price_multiplier_milli,
            preemption_delay_seconds: r.preemption_delay_seconds,
            description: r.description,
            created_at: r.created_at,
            updated_at: r.updated_at,
            version: r.version,
        }
    }
}

fn validated(name: &str, spec: &PriorityClassSpec) -> Result<PriorityClassRow> {
    check_range("priority", spec.priority, -1_000_000, 1_000_000)?;
    check_range("usage_factor_milli", spec.usage_factor_milli, 0, 10_000)?;
    check_range("price_multiplier_milli", spec.price_multiplier_milli, 0, 100_000)?;
    check_range("preemption_delay_seconds", spec.preemption_delay_seconds, 0, 86_400)?;
    let description = DisplayText::parse("description", spec.description.as_deref().unwrap_or(""), 1000)?;
    let now = Utc::now();
    Ok(PriorityClassRow {
        name: name.to_owned(),
        priority: spec.priority as i32,
        preemptible: spec.preemptible,
        usage_factor_milli: spec.usage_factor_milli as i32,
        price_multiplier_milli: spec.price_multiplier_milli as i32,
        preemption_delay_seconds: spec.preemption_delay_seconds as i32,
        description: description.as_str().to_owned(),
        created_at: now,
        updated_at: now,
        version: 0,
    })
}

/// Adds a priority class, audited; the API and the portal's admin page call this.
pub async fn create(state: &AppState, principal: &Principal, body: &NewPriorityClass) -> Result<PriorityClassRow> {
    let name = PriorityClassName::parse("name", &body.name)?;
    let wanted = validated(name.as_str(), &body.spec)?;
    let mut tx = state.db.begin().await?;
    if db::priority_classes::get_for_update(&mut tx, name.as_str()).await?.is_some() {
        return Err(Error::conflict(
            "priority_class_exists",
            Some("name"),
            format!("priority class {name} already exists"),
        ));
    }
    let row = db::priority_classes::upsert(&mut tx, &wanted).await?;
    record(
        &mut tx,
        principal,
        "priority_class.create",
        "priority_class",
        name.as_str(),
        None,
        None::<&()>,
        Some(&PriorityClassView::from(row.clone())),
    )
    .await?;
    tx.commit().await?;
    Ok(row)
}

/// Replaces the settings of the priority class `name` when `if_match` allows, audited.
pub async fn put(
    state: &AppState,
    principal: &Principal,
    name: &str,
    spec: &PriorityClassSpec,
    precondition: &Precondition,
) -> Result<PriorityClassRow> {
    let mut tx = state.db.begin().await?;
    let before = db::priority_classes::get_for_update(&mut tx, name).await?.ok_or(Error::NotFound("priority class"))?;
    precondition.check(before.version)?;
    let wanted = validated(name, spec)?;
    let row = db::priority_classes::upsert(&mut tx, &wanted).await?;
    record(
        &mut tx,
        principal,
        "priority_class.update",
        "priority_class",
        name,
        None,
        Some(&PriorityClassView::from(before)),
        Some(&PriorityClassView::from(row.clone())),
    )
    .await?;
    tx.commit().await?;
    Ok(row)
}
