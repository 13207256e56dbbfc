//! The teams a user sees and a team's dashboard.

use crate::domain::JobId;
use crate::domain::TeamId;
use std::collections::BTreeMap;

use askama::Template;
use axum::{
    extract::{Path, State},
    response::Response,
};
use chrono::Utc;

use super::{principal, render, signed_in, when, CurrentUser, PageError, SignedIn};
use crate::{
    db::{self, jobs::JobFilter},
    domain::{JobState, PlatformRole, TeamRole},
    state::AppState,
    web::figures,
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

/// Where a team stands against its reserved GPUs of one class now. One value per class,
/// computed once from one count of GPUs in use, so a quota bar cannot say that the team
/// borrows and lends the same class at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Its jobs hold more than its reserved GPUs: this many beyond them are borrowed.
    Borrowing(i64),
    /// Its jobs hold fewer than its reserved GPUs, and other teams' borrowers hold this many
    /// of the idle ones.
    Lending(i64),
    /// Neither borrowing nor lending.
    Within,
}

impl Standing {
    /// The standing of a team with `reserved` GPUs of a class, `in_use` of them held by its
    /// jobs, and `lent` of its idle reserved GPUs held by others (as [`lent_to_others`]
    /// estimates). A team beyond its reservation has none idle to lend; one within lends at
    /// most what it leaves idle.
    pub fn of(reserved: i64, in_use: i64, lent: i64) -> Self {
        let idle = (reserved - in_use).max(0);
        if in_use > reserved {
            Self::Borrowing(in_use - reserved)
        } else if lent.min(idle) > 0 {
            Self::Lending(lent.min(idle))
        } else {
            Self::Within
        }
    }

    /// GPUs borrowed beyond the reservation (0 unless borrowing).
    pub fn borrowed(self) -> i64 {
        match self {
            Self::Borrowing(n) => n,
            Self::Lending(_) | Self::Within => 0,
        }
    }

    /// Idle reserved GPUs others hold (0 unless lending).
    pub fn lent(self) -> i64 {
        match self {
            Self::Lending(n) => n,
            Self::Borrowing(_) | Self::Within => 0,
        }
    }
}

/// A class's quota and use.
pub struct QuotaLine {
    pub gpu_class: String,
    pub reserved: i32,
    pub burst: i32,
    pub in_use: i64,
    /// GPUs its jobs hold beyond its reservation ([`Standing::borrowed`]).
    pub borrowed: i64,
    /// Its idle reserved GPUs that other teams' borrowers hold ([`Standing::lent`]). Both
    /// come from one [`Standing`], so at least one of the two is 0.
    pub lent: i64,
    pub limit: i64,
    pub reserved_percent: i64,
    pub used_percent: i64,
    /// Where the lent segment starts and how wide it is, in percent of the bar.
    pub lent_x: i64,
    pub lent_percent: i64,
}

/// A running job.
pub struct RunningLine {
    pub id: JobId,
    pub name: String,
    pub gpus: i64,
    pub gpu_class: String,
    pub state: String,
    pub since: String,
}

/// A waiting job.
pub struct PendingLine {
    pub id: JobId,
    pub name: String,
    pub gpus: i64,
    pub gpu_class: String,
    pub wait: super::Wait,
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
    /// Per priority class, what happens to the team's jobs whose GPUs stay idle.
    idle_policies: Vec<(String, String)>,
}

/// A team's dashboard: quota and use per class, what runs, what waits and why.
pub async fn team(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let (team, role) = super::team_and_role(&state, &user, &name).await?;
    let quotas = db::quotas::list(&state.db, team.id).await?;
    let mut jobs = Vec::new();
    for s in [JobState::Running, JobState::Admitted] {
        let filter = JobFilter { state: Some(s), ..JobFilter::default() };
        jobs.extend(db::jobs::list(&state.db, team.id, &filter, 500).await?);
    }
    let gpus = |j: &db::jobs::JobRow| i64::from(j.replicas) * i64::from(j.gpus_per_replica);
    let mut in_use: BTreeMap<&str, i64> = BTreeMap::new();
    for j in &jobs {
        *in_use.entry(j.gpu_class.as_str()).or_default() += gpus(j);
    }
    let lent = lent_to_others(&db::quotas::lending(&state.db, team.id).await?, team.id);
    let quotas = quotas
        .iter()
        .map(|q| {
            let used = in_use.get(q.gpu_class.as_str()).copied().unwrap_or(0);
            let standing = Standing::of(i64::from(q.reserved), used, lent.get(&q.gpu_class).copied().unwrap_or(0));
            let limit = (i64::from(q.reserved) + i64::from(q.burst)).max(used).max(1);
            QuotaLine {
                gpu_class: q.gpu_class.clone(),
                reserved: q.reserved,
                burst: q.burst,
                in_use: used,
                borrowed: standing.borrowed(),
                lent: standing.lent(),
                limit,
                reserved_percent: 100 * i64::from(q.reserved) / limit,
                used_percent: 100 * used / limit,
                lent_x: 100 * used / limit,
                lent_percent: 100 * standing.lent() / limit,
            }
        })
        .collect();
    let mut running: Vec<RunningLine> = jobs
        .iter()
        .map(|j| RunningLine {
            id: j.id,
            name: j.name.clone(),
            gpus: gpus(j),
            gpu_class: j.gpu_class.clone(),
            state: j.state.to_string(),
            since: j.started_at.or(j.admitted_at).map(when).unwrap_or_default(),
        })
        .collect();
    running.sort_by(|a, b| a.name.cmp(&b.name));
    // The team's queue in admission order: a job's place in it is its position in the team.
    let queue = db::jobs::queue(&state.db, team.id, 500).await?;
    let mentioned =
        super::mentioned_jobs(&state, team.id, queue.iter().filter_map(|j| j.pending_message.as_deref())).await?;
    let pending = queue
        .into_iter()
        .enumerate()
        .map(|(i, j)| PendingLine {
            id: j.id,
            name: j.name,
            gpus: i64::from(j.gpus),
            gpu_class: j.gpu_class,
            wait: super::Wait::new(
                j.pending_message.as_deref(),
                Some(i as i64 + 1),
                j.queue_position,
                super::Starts::of(j.expected_start_at, j.pending_figures.as_ref().map(|f| &f.0)),
                &mentioned,
            ),
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
        idle_policies: crate::ops::idle_policies::governing_for_team(&state, team.id)
            .await?
            .into_iter()
            .map(|g| (g.priority_class, g.summary))
            .collect(),
    };
    Ok(render(&page))
}

/// The team's budget this month: spent so far (running jobs included) and the forecast at
/// the month's end, in the budget's unit.
async fn budget_line(state: &AppState, team_id: TeamId) -> Result<Option<BudgetLine>, PageError> {
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
    let show = |amount: i64| figures::in_budget_unit(&budget.unit, amount, &state.config.currency);
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

/// GPUs of `team`'s idle reserved quota that other teams' borrowers hold now, per class.
///
/// The engine pools borrowing: a borrower is not tied to one lender. So borrowers are
/// counted against unreserved capacity first (nobody's to lend), and what remains is shared
/// among the teams with idle, lendable reserved quota in proportion to how much each has.
pub fn lent_to_others(rows: &[db::quotas::ClassLending], team: TeamId) -> BTreeMap<String, i64> {
    let mut by_class: BTreeMap<&str, Vec<&db::quotas::ClassLending>> = BTreeMap::new();
    for row in rows {
        by_class.entry(row.gpu_class.as_str()).or_default().push(row);
    }
    let idle = |r: &db::quotas::ClassLending| r.lendable.min(r.reserved - r.own_in_use).max(0);
    by_class
        .into_iter()
        .filter_map(|(class, quotas)| {
            let mine = quotas.iter().find(|r| r.team_id == team)?;
            let reserved: i64 = quotas.iter().map(|r| r.reserved).sum();
            let unreserved = (mine.class_capacity - reserved).max(0);
            let from_reserved = (mine.class_borrowed - unreserved).max(0);
            let lendable: i64 = quotas.iter().map(|r| idle(r)).sum();
            let lent = match lendable {
                0 => 0,
                all => (i128::from(from_reserved) * i128::from(idle(mine)) / i128::from(all)) as i64,
            };
            Some((class.to_owned(), lent.min(idle(mine))))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::domain::TeamId;
    use uuid::Uuid;

    use super::{lent_to_others, Standing};
    use crate::db::quotas::ClassLending;

    fn quota(team: u128, reserved: i64, lendable: i64, own: i64) -> ClassLending {
        ClassLending {
            team_id: TeamId::from_u128(team),
            gpu_class: "h100".into(),
            reserved,
            lendable,
            own_in_use: own,
            class_borrowed: 24,
            class_capacity: 64,
        }
    }

    #[test]
    fn borrowers_use_unreserved_gpus_first_then_idle_reserved_ones_pro_rata() {
        // 64 GPUs, 56 reserved: 8 unreserved. 24 borrowed: 16 come from idle reserved quota.
        // Team 1 has 32 reserved and uses 8 (24 idle); team 2 has 24 reserved, uses 16, lends
        // at most 4 (4 idle and lendable). 16 × 24 / 28 = 13 from team 1, 16 × 4 / 28 = 2 from 2.
        let rows = [quota(1, 32, 32, 8), quota(2, 24, 4, 16)];
        assert_eq!(lent_to_others(&rows, TeamId::from(Uuid::from_u128(1)))["h100"], 13);
        assert_eq!(lent_to_others(&rows, TeamId::from(Uuid::from_u128(2)))["h100"], 2);
        // Nothing borrowed beyond the unreserved GPUs: nothing lent.
        let calm: Vec<ClassLending> = rows.iter().cloned().map(|r| ClassLending { class_borrowed: 8, ..r }).collect();
        assert_eq!(lent_to_others(&calm, TeamId::from(Uuid::from_u128(1)))["h100"], 0);
        // A team using all its reserved quota lends nothing.
        let busy = [quota(1, 32, 32, 32), quota(2, 24, 24, 0)];
        assert_eq!(lent_to_others(&busy, TeamId::from(Uuid::from_u128(1)))["h100"], 0);
        assert_eq!(lent_to_others(&busy, TeamId::from(Uuid::from_u128(2)))["h100"], 16);
    }

    #[test]
    fn a_quota_bar_says_borrowing_or_lending_never_both() {
        // 4 reserved, 6 held (2 of them on borrowed GPUs) while the lending estimate, from
        // another count, still finds 2 idle: the team borrows, and lends nothing.
        assert_eq!(Standing::of(4, 6, 2), Standing::Borrowing(2));
        assert_eq!((Standing::of(4, 6, 2).borrowed(), Standing::of(4, 6, 2).lent()), (2, 0));
        // 16 reserved, none used, all 16 held by borrowers: it lends 16.
        assert_eq!(Standing::of(16, 0, 16), Standing::Lending(16));
        // It cannot lend more than it leaves idle.
        assert_eq!(Standing::of(16, 10, 16), Standing::Lending(6));
        assert_eq!(Standing::of(16, 16, 3), Standing::Within);
        assert_eq!(Standing::of(16, 2, 0), Standing::Within);
        for reserved in 0..6 {
            for used in 0..8 {
                for lent in 0..8 {
                    let s = Standing::of(reserved, used, lent);
                    assert!(s.borrowed() == 0 || s.lent() == 0, "{s:?}");
                }
            }
        }
    }
}
