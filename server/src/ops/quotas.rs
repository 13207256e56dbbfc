//! Quotas per team per GPU class: `reserved` (guaranteed), `burst` (how many more the team
//! may borrow) and `lendable` (how much of `reserved` others may borrow while idle).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{audit::record, Error, Precondition, Result};
use crate::{
    auth::Principal,
    db::{self, quotas::QuotaRow, teams::TeamRow},
    domain::{check_range, FieldError, MAX_GPUS},
    state::AppState,
};

/// A quota to set.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaSpec {
    /// GPUs of the class the team is guaranteed.
    #[schema(minimum = 0, maximum = 100000)]
    pub reserved: i64,
    /// GPUs beyond `reserved` the team may borrow from idle capacity.
    #[schema(minimum = 0, maximum = 100000)]
    pub burst: i64,
    /// GPUs of `reserved` others may borrow while idle; absent means all of them.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 100000)]
    pub lendable: Option<i64>,
}

/// A team's quota for one GPU class.
#[derive(Serialize, ToSchema)]
pub struct QuotaView {
    pub gpu_class: String,
    pub reserved: i32,
    pub burst: i32,
    /// GPUs of `reserved` others may borrow while idle.
    pub lendable: i32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub version: i64,
}

impl From<QuotaRow> for QuotaView {
    fn from(r: QuotaRow) -> Self {
        Self {
            gpu_class: r.gpu_class,
            reserved: r.reserved,
            burst: r.burst,
            lendable: r.lendable.unwrap_or(r.reserved),
            created_at: r.created_at,
            updated_at: r.updated_at,
            version: r.version,
        }
    }
}

/// A quota as set, with warnings that did not stop it.
#[derive(Serialize, ToSchema)]
pub struct QuotaResult {
    #[serde(flatten)]
    pub quota: QuotaView,
    /// Things worth knowing, e.g. that reserved quota exceeds known capacity.
    pub warnings: Vec<String>,
}

/// Sets `team`'s quota for `class_name`, with its audit record: the API and the portal both
/// call this. Children's reserved quota never exceeds their parent's; reserving more than
/// the platform's known capacity is allowed and answered with a warning.
pub async fn set(
    state: &AppState,
    principal: &Principal,
    team: TeamRow,
    class_name: &str,
    spec: &QuotaSpec,
    precondition: &Precondition,
) -> Result<QuotaResult> {
    check_range("reserved", spec.reserved, 0, MAX_GPUS)?;
    check_range("burst", spec.burst, 0, MAX_GPUS)?;
    if let Some(lendable) = spec.lendable {
        check_range("lendable", lendable, 0, spec.reserved)
            .map_err(|e| FieldError::new("lendable", &e.code, format!("{} (it is part of reserved)", e.message)))?;
    }
    let class = super::gpu_classes::find(state, class_name).await.map_err(|_| {
        Error::field(FieldError::new("gpu_class", "not_found", format!("GPU class {class_name} does not exist")))
    })?;
    // Ranges are checked above, so the values fit in i32.
    let (reserved, burst, lendable) = (spec.reserved as i32, spec.burst as i32, spec.lendable.map(|l| l as i32));

    let mut tx = state.db.begin().await?;
    let ctx = db::quotas::context_for_update(&mut tx, team.id, team.parent_id, class.id).await?;
    if let Some(current) = &ctx.current {
        precondition.check(current.version)?;
    } else {
        precondition.check(0)?;
    }
    if let Some(parent) = &team.parent {
        let parent_reserved = i64::from(ctx.parent_reserved.unwrap_or(0));
        if ctx.siblings_reserved + i64::from(reserved) > parent_reserved {
            return Err(FieldError::new(
                "reserved",
                "exceeds_parent",
                format!(
                    "the children of {parent} would reserve {} {class_name} GPUs but {parent} reserves only {parent_reserved}",
                    ctx.siblings_reserved + i64::from(reserved)
                ),
            )
            .into());
        }
    }
    if ctx.children_reserved > i64::from(reserved) {
        return Err(FieldError::new(
            "reserved",
            "below_children",
            format!("the child teams of {} already reserve {} {class_name} GPUs", team.name, ctx.children_reserved),
        )
        .into());
    }
    let mut warnings = Vec::new();
    if team.parent.is_none() {
        if let Some(capacity) = db::clusters::known_capacity(&mut tx, class.id).await? {
            let total = ctx.other_roots_reserved + i64::from(reserved);
            if total > capacity {
                warnings.push(format!(
                    "teams reserve {total} {class_name} GPUs in total but the platform knows of only {capacity}"
                ));
            }
        }
    }
    let row = db::quotas::upsert(&mut tx, team.id, class.id, reserved, burst, lendable).await?;
    let object = format!("{}/{}", team.name, class_name);
    record(
        &mut tx,
        principal,
        "quota.put",
        "quota",
        &object,
        Some(team.id),
        ctx.current.map(QuotaView::from).as_ref(),
        Some(&QuotaView::from(row.clone())),
    )
    .await?;
    tx.commit().await?;
    Ok(QuotaResult { quota: QuotaView::from(row), warnings })
}

/// Removes `team`'s quota of the class `class_name`, audited; refused while its child teams
/// reserve GPUs of that class (their reservation must fit inside the parent's).
pub async fn delete(
    state: &AppState,
    principal: &Principal,
    team: &TeamRow,
    class_name: &str,
    precondition: &Precondition,
) -> Result<()> {
    let class = super::gpu_classes::find(state, class_name).await?;
    let mut tx = state.db.begin().await?;
    let ctx = db::quotas::context_for_update(&mut tx, team.id, team.parent_id, class.id).await?;
    let current = ctx.current.ok_or(Error::NotFound("quota"))?;
    precondition.check(current.version)?;
    if ctx.children_reserved > 0 {
        return Err(Error::conflict(
            "children_reserve_quota",
            None,
            format!("the child teams of {} reserve {class_name} GPUs", team.name),
        ));
    }
    db::quotas::delete(&mut tx, team.id, class.id).await?;
    let object = format!("{}/{}", team.name, class_name);
    record(
        &mut tx,
        principal,
        "quota.delete",
        "quota",
        &object,
        Some(team.id),
        Some(&QuotaView::from(current)),
        None::<&()>,
    )
    .await?;
    tx.commit().await?;
    Ok(())
}
