//! The teams a user sees and a team's dashboard.

use std::collections::BTreeMap;

use askama::Template;
use axum::{
    extract::{Path, State},
    response::Response,
};
use chrono::Utc;
use uuid::Uuid;

use super::{principal, render, signed_in, when, CurrentUser, PageError, SignedIn};
use crate::{
    app::AppState,
    auth::policy::team_role,
    db::{self, jobs::JobFilter},
    domain::{PlatformRole, TeamRole},
};

/// A team in the list.
pub struct TeamLink {
    pub name: String,
    pub display_name: String,
}

#[derive(Template)]
#[template(path = "home.html")]
struct HomePage {
    signed_in: Option<SignedIn>,
    teams: Vec<TeamLink>,
    /// Finance or a platform admin: the billing page is theirs.
    finance: bool,
    /// A platform admin: the admin page is theirs.
    platform_admin: bool,
}

/// The teams the user can see.
pub async fn home(State(state): State<AppState>, CurrentUser(user): CurrentUser) -> Result<Response, PageError> {
    let finance = principal(&user).platform_role().is_some();
    let rows = match finance {
        true => db::teams::list_all(&state.db, None, 500).await?,
        false => db::teams::list_visible_to_user(&state.db, user.user_id, None, 500).await?,
    };
    let teams = rows
        .into_iter()
        .map(|t| TeamLink {
            display_name: if t.display_name.is_empty() { t.name.clone() } else { t.display_name },
            name: t.name,
        })
        .collect();
    let platform_admin = principal(&user).platform_role() == Some(PlatformRole::PlatformAdmin);
    Ok(render(&HomePage { signed_in: Some(signed_in(&user)), teams, finance, platform_admin }))
}

/// A class's quota and use.
pub struct QuotaLine {
    pub gpu_class: String,
    pub reserved: i32,
    pub burst: i32,
    pub in_use: i64,
    pub limit: i64,
    pub reserved_percent: i64,
    pub used_percent: i64,
}

/// A running job.
pub struct RunningLine {
    pub id: Uuid,
    pub name: String,
    pub gpus: i64,
    pub gpu_class: String,
    pub state: String,
    pub since: String,
}

/// A waiting job.
pub struct PendingLine {
    pub id: Uuid,
    pub name: String,
    pub gpus: i64,
    pub gpu_class: String,
    pub position: String,
    pub reason: String,
    pub expected_start: String,
}

/// This month's budget as the dashboard shows it.
pub struct BudgetLine {
    pub spent: String,
    pub amount: String,
    pub forecast: String,
    pub enforcement: String,
    pub spent_percent: i64,
    pub forecast_percent: i64,
}

#[derive(Template)]
#[template(path = "team.html")]
struct TeamPage {
    signed_in: Option<SignedIn>,
    team: String,
    can_submit: bool,
    /// Team admins manage its API tokens.
    can_admin: bool,
    /// Platform admins set its quotas.
    can_set_quotas: bool,
    /// This month, as its statement's address names it.
    statement_period: String,
    budget: Option<BudgetLine>,
    quotas: Vec<QuotaLine>,
    running: Vec<RunningLine>,
    pending: Vec<PendingLine>,
}

/// A team's dashboard: quota and use per class, what runs, what waits and why.
pub async fn team(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let team = db::teams::by_name(&state.db, &name).await?.ok_or_else(PageError::not_found)?;
    let role = team_role(&state, &principal(&user), &team).await?.ok_or_else(PageError::not_found)?;
    let quotas = db::quotas::list(&state.db, team.id).await?;
    let mut jobs = Vec::new();
    for s in ["running", "admitted", "pending"] {
        let filter = JobFilter { state: Some(s.into()), ..JobFilter::default() };
        jobs.extend(db::jobs::list(&state.db, team.id, &filter, 500).await?);
    }
    let gpus = |j: &db::jobs::JobRow| i64::from(j.replicas) * i64::from(j.gpus_per_replica);
    let mut in_use: BTreeMap<&str, i64> = BTreeMap::new();
    for j in jobs.iter().filter(|j| j.state != "pending") {
        *in_use.entry(j.gpu_class.as_str()).or_default() += gpus(j);
    }
    let quotas = quotas
        .iter()
        .map(|q| {
            let used = in_use.get(q.gpu_class.as_str()).copied().unwrap_or(0);
            let limit = (i64::from(q.reserved) + i64::from(q.burst)).max(used).max(1);
            QuotaLine {
                gpu_class: q.gpu_class.clone(),
                reserved: q.reserved,
                burst: q.burst,
                in_use: used,
                limit,
                reserved_percent: 100 * i64::from(q.reserved) / limit,
                used_percent: 100 * used / limit,
            }
        })
        .collect();
    let mut running: Vec<RunningLine> = jobs
        .iter()
        .filter(|j| j.state != "pending")
        .map(|j| RunningLine {
            id: j.id,
            name: j.name.clone(),
            gpus: gpus(j),
            gpu_class: j.gpu_class.clone(),
            state: j.state.clone(),
            since: j.started_at.or(j.admitted_at).map(when).unwrap_or_default(),
        })
        .collect();
    running.sort_by(|a, b| a.name.cmp(&b.name));
    let mut waiting: Vec<&db::jobs::JobRow> = jobs.iter().filter(|j| j.state == "pending").collect();
    waiting.sort_by_key(|j| (j.queue_position.unwrap_or(i32::MAX), j.seq));
    let pending = waiting
        .into_iter()
        .map(|j| PendingLine {
            id: j.id,
            name: j.name.clone(),
            gpus: gpus(j),
            gpu_class: j.gpu_class.clone(),
            position: j.queue_position.map(|p| p.to_string()).unwrap_or_else(|| "–".into()),
            reason: j.pending_message.clone().unwrap_or_else(|| "waiting for the next scheduling cycle".into()),
            expected_start: j.expected_start_at.map(when).unwrap_or_else(|| "not foreseeable".into()),
        })
        .collect();
    let can_submit = role >= TeamRole::Member;
    let can_admin = role >= TeamRole::Admin;
    let can_set_quotas = principal(&user).platform_role() == Some(PlatformRole::PlatformAdmin);
    let budget = budget_line(&state, team.id).await?;
    let page = TeamPage {
        signed_in: Some(signed_in(&user)),
        team: team.name,
        can_submit,
        can_admin,
        can_set_quotas,
        statement_period: crate::billing::period_name(crate::billing::budgets::period_of(Utc::now())),
        budget,
        quotas,
        running,
        pending,
    };
    Ok(render(&page))
}

/// The team's budget this month: spent so far (running jobs included) and the forecast at
/// the month's end, in the budget's unit.
async fn budget_line(state: &AppState, team_id: Uuid) -> Result<Option<BudgetLine>, PageError> {
    let now = Utc::now();
    let period = crate::billing::budgets::period_of(now);
    let Some(budget) = db::budgets::list(&state.db, team_id).await?.into_iter().find(|b| b.period == period) else {
        return Ok(None);
    };
    let spend = crate::billing::budgets::spend(&state.db, &[team_id], now, state.config.chargeback)
        .await?
        .remove(&team_id)
        .unwrap_or_default();
    let end = crate::billing::budgets::period_bounds(period).1;
    let (spent, forecast) = (spend.in_unit(&budget.unit), spend.forecast_in_unit(&budget.unit, now, end));
    let show = |amount: i64| match budget.unit.as_str() {
        "gpu-hours" => format!("{amount} GPU-hours"),
        _ => format!("{} {}", crate::metering::micros_decimal(amount), state.config.currency),
    };
    let percent = |x: i64| if budget.amount > 0 { (100 * i128::from(x) / i128::from(budget.amount)) as i64 } else { 0 };
    Ok(Some(BudgetLine {
        spent: show(spent),
        amount: show(budget.amount),
        forecast: show(forecast),
        enforcement: budget.enforcement,
        spent_percent: percent(spent).min(100),
        forecast_percent: percent(forecast).min(100),
    }))
}
