//! Idle policies (`domain::idle`): what the platform does with jobs whose GPUs stay idle, per
//! team and priority class. Platform admins set them; each change is audited.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{audit::record, Error, Result};
use crate::{
    auth::Principal,
    db::{self, idle::PolicyRow},
    domain::{
        idle::{governing, IdleAction, IdlePolicy, DEFAULT_IDLE_BELOW_SM_ACTIVE_PERCENT},
        FieldError, IdlePolicyId, TeamId,
    },
    state::AppState,
};

/// An idle policy as an admin writes it. Its scope is its team and priority class: setting
/// a policy for a scope that has one replaces it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IdlePolicySpec {
    /// The team whose jobs it governs; absent for every team without a policy of its own.
    #[serde(default)]
    pub team: Option<String>,
    /// The priority class whose jobs it governs; absent for every class.
    #[serde(default)]
    pub priority_class: Option<String>,
    /// A job is idle while its GPUs' SM activity (DCGM, weighted by GPUs over its replicas)
    /// stays below this percentage.
    #[schema(minimum = 0, maximum = 100)]
    pub below_sm_active_percent: f64,
    /// How long a job must stay idle before it is warned, seconds (1 to 604,800).
    #[schema(minimum = 1, maximum = 604800)]
    pub idle_seconds: i64,
    /// How long after the warning the policy acts, seconds (0 to 604,800).
    #[schema(minimum = 0, maximum = 604800)]
    #[serde(default)]
    pub notice_seconds: i64,
    /// `notify` (warn only), `stop` (the job ends cancelled), `preempt` (the job requeues) or
    /// `exempt` (its jobs are never warned nor reclaimed).
    pub action: IdleAction,
}

/// An idle policy.
#[derive(Debug, Serialize, ToSchema)]
pub struct IdlePolicyView {
    #[schema(value_type = uuid::Uuid)]
    pub id: IdlePolicyId,
    pub team: Option<String>,
    pub priority_class: Option<String>,
    pub below_sm_active_percent: f64,
    pub idle_seconds: i32,
    pub notice_seconds: i32,
    pub action: IdleAction,
    pub updated_at: DateTime<Utc>,
}

impl From<PolicyRow> for IdlePolicyView {
    fn from(r: PolicyRow) -> Self {
        Self {
            id: r.id,
            team: r.team,
            priority_class: r.policy.priority_class,
            below_sm_active_percent: r.policy.below_sm_active_percent,
            idle_seconds: r.policy.idle_seconds,
            notice_seconds: r.policy.notice_seconds,
            action: r.policy.action,
            updated_at: r.updated_at,
        }
    }
}

/// The idle policy that governs a team's jobs of one priority class.
#[derive(Debug, Serialize, ToSchema)]
pub struct GoverningPolicy {
    pub priority_class: String,
    /// The policy: the team's own for the class, else the team's own, else the platform's for
    /// the class, else the platform's; null where none governs.
    pub policy: Option<IdlePolicyView>,
    /// What happens to the team's idle jobs of the class, in words.
    pub summary: String,
}

/// For each priority class, the idle policy that governs team `team_id`'s jobs of it. Where
/// none does, idle time is still counted (below the default SM activity), never acted on.
pub async fn governing_for_team(state: &AppState, team_id: TeamId) -> Result<Vec<GoverningPolicy>> {
    let rows = db::idle::policies(&state.db).await?;
    let policies: Vec<IdlePolicy> = rows.iter().map(|r| r.policy.clone()).collect();
    let classes = db::priority_classes::list(&state.db).await?;
    Ok(classes
        .into_iter()
        .map(|class| {
            let found = governing(&policies, team_id, &class.name)
                .and_then(|p| policies.iter().position(|q| std::ptr::eq(p, q)))
                .map(|i| &rows[i]);
            let summary = match found {
                Some(row) => {
                    let whose = match &row.team {
                        Some(team) => format!("team {team}'s policy"),
                        None => "the platform's policy".to_owned(),
                    };
                    format!("{} ({whose})", row.policy.summary())
                }
                None => format!(
                    "no policy: idle time (SM activity below {DEFAULT_IDLE_BELOW_SM_ACTIVE_PERCENT}%) is counted on statements, never acted on"
                ),
            };
            GoverningPolicy {
                priority_class: class.name,
                policy: found.cloned().map(Into::into),
                summary,
            }
        })
        .collect())
}

/// Every idle policy.
pub async fn list(state: &AppState) -> Result<Vec<IdlePolicyView>> {
    Ok(db::idle::policies(&state.db).await?.into_iter().map(Into::into).collect())
}

/// Sets the policy of the spec's scope, replacing the one there; audited.
pub async fn set(state: &AppState, principal: &Principal, spec: &IdlePolicySpec) -> Result<IdlePolicyView> {
    let team_id = match &spec.team {
        Some(name) => Some(
            db::teams::by_name(&state.db, name)
                .await?
                .ok_or_else(|| FieldError::new("team", "not_found", format!("there is no team {name}")))?
                .id,
        ),
        None => None,
    };
    if let Some(class) = &spec.priority_class {
        if db::priority_classes::by_name(&state.db, class).await?.is_none() {
            return Err(
                FieldError::new("priority_class", "not_found", format!("there is no priority class {class}")).into()
            );
        }
    }
    let seconds = |field: &str, value: i64| {
        i32::try_from(value)
            .map_err(|_| FieldError::new(field, "out_of_range", "must be at most 604800 seconds (a week)"))
    };
    let policy = IdlePolicy {
        team_id,
        priority_class: spec.priority_class.clone(),
        below_sm_active_percent: spec.below_sm_active_percent,
        idle_seconds: seconds("idle_seconds", spec.idle_seconds)?,
        notice_seconds: seconds("notice_seconds", spec.notice_seconds)?,
        action: spec.action,
    };
    policy.validate()?;
    let mut tx = state.db.begin().await?;
    let id = db::idle::upsert_policy(&mut tx, &policy).await?;
    let view = IdlePolicyView {
        id,
        team: spec.team.clone(),
        priority_class: policy.priority_class,
        below_sm_active_percent: policy.below_sm_active_percent,
        idle_seconds: policy.idle_seconds,
        notice_seconds: policy.notice_seconds,
        action: policy.action,
        updated_at: Utc::now(),
    };
    record(&mut tx, principal, "idle_policy.set", "idle_policy", &id.to_string(), team_id, None::<&()>, Some(&view))
        .await?;
    tx.commit().await?;
    Ok(view)
}

/// Removes a policy; audited.
pub async fn delete(state: &AppState, principal: &Principal, id: IdlePolicyId) -> Result<()> {
    let mut tx = state.db.begin().await?;
    if !db::idle::delete_policy(&mut tx, id).await? {
        return Err(Error::NotFound("idle policy"));
    }
    record(&mut tx, principal, "idle_policy.delete", "idle_policy", &id.to_string(), None, None::<&()>, None::<&()>)
        .await?;
    tx.commit().await?;
    Ok(())
}
