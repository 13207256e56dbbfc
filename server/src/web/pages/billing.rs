//! Finance's billing page, its downloads, and a team's monthly statement.

use crate::domain::JobId;
use crate::domain::TeamId;
use std::collections::BTreeMap;

use askama::Template;
use axum::{
    extract::{Path, State},
    http::header,
    response::{IntoResponse, Response},
};
use chrono::Utc;

use super::{principal, render, signed_in, when, CurrentUser, PageError, SignedIn};
use crate::{
    db,
    db::web_sessions::SessionUser,
    state::AppState,
    web::{charts, figures},
};

/// A statement line as the page shows it.
pub struct StatementRow {
    pub gpu_class: String,
    pub priority_class: String,
    pub gpu_hours: String,
    pub list: String,
    pub billed: String,
}

/// One of the costliest jobs.
pub struct TopJobLine {
    pub id: JobId,
    pub name: String,
    pub gpu_hours: String,
    pub billed: String,
}

#[derive(Template)]
#[template(path = "statement.html")]
struct StatementPage {
    signed_in: Option<SignedIn>,
    team: String,
    period: String,
    previous: Option<String>,
    closed: bool,
    lines: Vec<StatementRow>,
    total_gpu_hours: String,
    total_list: String,
    total_billed: String,
    budget: Option<String>,
    spent: Option<String>,
    forecast: String,
    idle_gpu_hours: String,
    idle_cost: String,
    idle_hours: String,
    idle_billed: String,
    idle_jobs: Vec<TopJobLine>,
    /// "Of 12.50 GPU-hours with measured activity, 3.10 were effective (25%)", once any were.
    effective: Option<String>,
    /// One sentence per job name a cheaper class would have held.
    right_sizing: Vec<String>,
    top_jobs: Vec<TopJobLine>,
}

/// A team's monthly statement: usage and cost by class and priority class, its budget, its
/// costliest jobs and its share of idle capacity.
pub async fn statement(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path((name, period)): Path<(String, String)>,
) -> Result<Response, PageError> {
    let (team, _) = super::team_and_role(&state, &user, &name).await?;
    let period = crate::domain::BudgetPeriod::parse("period", &period).map_err(|_| PageError::not_found())?;
    let first_day = period.first_day();
    let s = crate::billing::statement::statement(&state.db, team.id, first_day, Utc::now(), state.config.chargeback)
        .await?;
    let currency = state.config.currency.as_str();
    let money = |micros: i64| figures::money(micros, currency);
    let hours = figures::gpu_hours;
    let unit = s.budget.as_ref().map_or("money".to_owned(), |b| b.0.clone());
    let in_unit = |unit: &str, amount: i64| figures::in_budget_unit(unit, amount, currency);
    let page = StatementPage {
        signed_in: Some(signed_in(&user)),
        team: team.name.clone(),
        period: crate::billing::period_name(first_day),
        previous: first_day.pred_opt().map(crate::billing::period_name),
        closed: s.closed,
        lines: s
            .lines
            .iter()
            .map(|l| StatementRow {
                gpu_class: l.gpu_class.clone(),
                priority_class: l.priority_class.clone(),
                gpu_hours: hours(l.gpu_milli_ms),
                list: money(l.list_cost_micros),
                billed: money(l.billed_cost_micros),
            })
            .collect(),
        total_gpu_hours: hours(s.gpu_milli_ms),
        total_list: money(s.list_cost_micros),
        total_billed: money(s.billed_cost_micros),
        budget: s
            .budget
            .as_ref()
            .map(|(unit, amount, enforcement)| format!("{} ({enforcement})", in_unit(unit, *amount))),
        spent: s.spent_to_date.map(|v| in_unit(&unit, v)),
        forecast: s.forecast.map(|v| in_unit(&unit, v)).unwrap_or_default(),
        idle_gpu_hours: hours(s.idle_share_gpu_milli_ms),
        idle_cost: money(s.idle_share_cost_micros),
        idle_hours: hours(s.idle_gpu_milli_ms),
        idle_billed: money(s.idle_cost_micros),
        effective: (s.measured_gpu_milli_ms > 0).then(|| {
            format!(
                "Of {} GPU-hours whose activity was measured, {} were effective (their mean SM activity): {}%.",
                hours(s.measured_gpu_milli_ms),
                hours(s.effective_gpu_milli_ms),
                (s.effective_gpu_milli_ms as f64 * 100.0 / s.measured_gpu_milli_ms as f64).round()
            )
        }),
        right_sizing: s
            .right_sizing
            .iter()
            .map(|a| {
                format!(
                    "{} ({} job{} on {}): at most {:.1} GiB of memory and {:.1}% SM activity; {} would have held {} at {}% of the price, {} less this month.",
                    a.job_name,
                    a.jobs,
                    if a.jobs == 1 { "" } else { "s" },
                    a.gpu_class,
                    a.seen.peak_memory_mib as f64 / 1024.0,
                    a.seen.mean_sm_active * 100.0,
                    a.recommendation.class,
                    if a.jobs == 1 { "it" } else { "them" },
                    (a.recommendation.price_ratio_milli + 5) / 10,
                    money(a.saving_micros)
                )
            })
            .collect(),
        idle_jobs: s
            .idle_jobs
            .iter()
            .map(|j| TopJobLine {
                id: j.job_id,
                name: j.job_name.clone(),
                gpu_hours: hours(j.idle_gpu_milli_ms),
                billed: money(j.idle_cost_micros),
            })
            .collect(),
        top_jobs: s
            .top_jobs
            .iter()
            .map(|j| TopJobLine {
                id: j.job_id,
                name: j.job_name.clone(),
                gpu_hours: hours(j.gpu_milli_ms),
                billed: money(j.billed_cost_micros),
            })
            .collect(),
    };
    Ok(render(&page))
}

/// A billing period's line: the sums of its teams' lines ([`db::billing::period_by_team`]).
pub struct PeriodLine {
    pub period: String,
    pub status: String,
    pub rows: i64,
    pub gpu_hours: String,
    pub billed: String,
}

/// A team's cost in the current billing period.
pub struct CostLine {
    pub team: String,
    pub gpu_hours: String,
    pub billed: String,
    /// Of the costliest team's.
    pub percent: i64,
    /// This month's budget and what is spent of it, when the team has one.
    pub budget: Option<BudgetUse>,
}

/// A team's budget this month beside its spend.
pub struct BudgetUse {
    pub amount: String,
    pub spent: String,
    pub forecast: String,
    /// Spent, in percent of the budget (capped at 100 for the bar).
    pub percent: i64,
    pub over: bool,
}

#[derive(Template)]
#[template(path = "billing.html")]
struct BillingPage {
    signed_in: Option<SignedIn>,
    periods: Vec<PeriodLine>,
    /// The charted days, in words.
    window: String,
    by_team: charts::StackedBars,
    by_class: charts::StackedBars,
    /// The current billing period, `YYYY-MM`, whose per-team costs are shown.
    current: String,
    costs: Vec<CostLine>,
    /// The current period's totals: the sums of `costs`, as its line in `periods` shows them.
    total: PeriodLine,
}

/// Billing is finance's and platform admins'; anyone else is told their role does not allow
/// it, as the API does.
fn require_finance(user: &SessionUser) -> Result<(), PageError> {
    principal(user).platform_role().map(|_| ()).ok_or_else(|| crate::ops::Error::Forbidden.into())
}

/// A period's line from its teams' lines: the one place a period's totals are summed, so the
/// per-team table, the period's line and its page cannot disagree.
fn period_line(
    period: chrono::NaiveDate,
    status: String,
    teams: &[db::billing::TeamPeriodTotal],
    currency: &str,
) -> PeriodLine {
    PeriodLine {
        period: crate::billing::period_name(period),
        status,
        rows: teams.iter().map(|t| t.rows).sum(),
        gpu_hours: figures::gpu_hours(teams.iter().map(|t| t.gpu_milli_ms).sum()),
        billed: figures::money(teams.iter().map(|t| t.billed_cost_micros).sum(), currency),
    }
}

/// Finance's page: usage over the last 30 days, the current period's cost per team with
/// budgets, and every billing period with its totals and its exports. Every total is a sum
/// of the ledger's rows of a billing period, as statements and exports are.
pub async fn billing(State(state): State<AppState>, CurrentUser(user): CurrentUser) -> Result<Response, PageError> {
    require_finance(&user)?;
    let currency = state.config.currency.as_str();
    let closed = db::metering::closed_periods(&state.db).await?;
    let mut periods: Vec<chrono::NaiveDate> = closed.iter().map(|c| c.0).collect();
    let current = crate::billing::budgets::period_of(Utc::now());
    if !periods.contains(&current) {
        periods.insert(0, current);
    }
    let mut lines = Vec::new();
    let mut current_teams = Vec::new();
    for period in periods {
        let teams = db::billing::period_by_team(&state.db, period).await?;
        let status = match closed.iter().find(|c| c.0 == period) {
            Some((_, at, by)) => format!("closed {} by {by}", when(*at)),
            None => "open".into(),
        };
        lines.push(period_line(period, status, &teams, currency));
        if period == current {
            current_teams = teams;
        }
    }
    let total = period_line(current, String::new(), &current_teams, currency);
    let (from, to) = usage_window();
    let usage = db::billing::daily_usage(&state.db, from, to).await?;
    let hours = |v: f64| format!("{v:.2} GPU-hours");
    let mut by_team: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    let mut by_class: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    // Every day of the window gets its bar, busy or not.
    let mut day = from;
    while day < to {
        by_team.entry(day.to_string()).or_default();
        by_class.entry(day.to_string()).or_default();
        day = day.succ_opt().unwrap_or(to);
    }
    for u in &usage {
        let gpu_hours = u.gpu_milli_ms as f64 / 3_600_000_000.0;
        *by_team.entry(u.day.to_string()).or_default().entry(u.team.clone()).or_default() += gpu_hours;
        *by_class.entry(u.day.to_string()).or_default().entry(u.gpu_class.clone()).or_default() += gpu_hours;
    }
    let mut budgets = budget_uses(&state).await?;
    let top = current_teams.iter().map(|t| t.billed_cost_micros).max().unwrap_or(0).max(1);
    let costs = current_teams
        .iter()
        .map(|t| CostLine {
            budget: budgets.remove(&t.team),
            team: t.team.clone(),
            gpu_hours: figures::gpu_hours(t.gpu_milli_ms),
            billed: figures::money(t.billed_cost_micros, currency),
            percent: (100 * i128::from(t.billed_cost_micros.max(0)) / i128::from(top)) as i64,
        })
        .collect();
    Ok(render(&BillingPage {
        signed_in: Some(signed_in(&user)),
        periods: lines,
        window: format!("{from} to {}", to.pred_opt().unwrap_or(to)),
        by_team: charts::stacked(&by_team, hours),
        by_class: charts::stacked(&by_class, hours),
        current: crate::billing::period_name(current),
        costs,
        total,
    }))
}

/// Every budget of this month, by team name, with what its team has spent and the forecast
/// at the month's end (running jobs included).
async fn budget_uses(state: &AppState) -> Result<BTreeMap<String, BudgetUse>, PageError> {
    let now = Utc::now();
    let budgets = db::billing::budgets_of(&state.db, crate::billing::budgets::period_of(now)).await?;
    let teams: Vec<TeamId> = budgets.iter().map(|b| b.team_id).collect();
    let spend = crate::billing::budgets::spend(&state.db, &teams, now, state.config.chargeback).await?;
    let end = crate::billing::budgets::period_bounds(crate::billing::budgets::period_of(now)).1;
    let currency = &state.config.currency;
    Ok(budgets
        .into_iter()
        .map(|b| {
            let s = spend.get(&b.team_id).copied().unwrap_or_default();
            let (spent, forecast) = (s.in_unit(&b.unit), s.forecast_in_unit(&b.unit, now, end));
            let show = |amount: i64| figures::in_budget_unit(&b.unit, amount, currency);
            let percent = if b.amount > 0 { (100 * i128::from(spent) / i128::from(b.amount)) as i64 } else { 100 };
            let line = BudgetUse {
                amount: format!("{} ({})", show(b.amount), b.enforcement),
                spent: show(spent),
                forecast: show(forecast),
                percent: percent.min(100),
                over: forecast > b.amount,
            };
            (b.team, line)
        })
        .collect())
}

/// Days the billing page charts: the last 30, today included.
fn usage_window() -> (chrono::NaiveDate, chrono::NaiveDate) {
    let today = Utc::now().date_naive();
    (today - chrono::Days::new(29), today + chrono::Days::new(1))
}

/// What the billing page's charts show, as CSV: one row per day, team and GPU class.
pub async fn billing_usage_csv(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
) -> Result<Response, PageError> {
    require_finance(&user)?;
    let (from, to) = usage_window();
    let usage = db::billing::daily_usage(&state.db, from, to).await?;
    let mut csv = String::from("day,team,gpu_class,gpu_hours,billed_cost,currency\r\n");
    for u in usage {
        // Team and class names are DNS-style labels: nothing in them needs quoting.
        csv.push_str(&format!(
            "{},{},{},{},{},{}\r\n",
            u.day,
            u.team,
            u.gpu_class,
            crate::metering::gpu_hours_decimal(u.gpu_milli_ms),
            crate::metering::micros_decimal(u.billed_cost_micros),
            state.config.currency
        ));
    }
    let disposition = format!("attachment; filename=\"fairway-usage-{from}-{}.csv\"", to.pred_opt().unwrap_or(to));
    Ok((
        [(header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()), (header::CONTENT_DISPOSITION, disposition)],
        csv,
    )
        .into_response())
}

/// A billing export, downloaded from the billing page.
pub async fn billing_export(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path((period, format)): Path<(String, String)>,
) -> Result<Response, PageError> {
    require_finance(&user)?;
    let period = crate::domain::BudgetPeriod::parse("period", &period).map_err(|_| PageError::not_found())?;
    let format = match format.as_str() {
        "csv" => crate::billing::export::Format::Csv,
        "json" => crate::billing::export::Format::Json,
        "focus" => crate::billing::export::Format::Focus,
        _ => return Err(PageError::not_found()),
    };
    let name = format!("fairway-{period}-{}.{}", format.as_str(), format.extension());
    let stream =
        crate::billing::export::stream(state.db.clone(), period.first_day(), format, state.config.currency.clone());
    let disposition = format!("attachment; filename=\"{name}\"");
    Ok((
        [(header::CONTENT_TYPE, format.content_type().to_owned()), (header::CONTENT_DISPOSITION, disposition)],
        axum::body::Body::from_stream(stream),
    )
        .into_response())
}

/// A team's line in a period's statements.
pub struct TeamStatementLine {
    pub team: String,
    pub gpu_hours: String,
    pub billed: String,
}

#[derive(Template)]
#[template(path = "period.html")]
struct PeriodPage {
    signed_in: Option<SignedIn>,
    period: String,
    status: String,
    teams: Vec<TeamStatementLine>,
    total_gpu_hours: String,
    total_billed: String,
}

/// One billing period for finance: every team's usage and cost, each linking to the team's
/// statement, and the period's exports.
pub async fn billing_period(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path(period): Path<String>,
) -> Result<Response, PageError> {
    require_finance(&user)?;
    let period = crate::domain::BudgetPeriod::parse("period", &period).map_err(|_| PageError::not_found())?;
    let first_day = period.first_day();
    let teams = db::billing::period_by_team(&state.db, first_day).await?;
    let currency = state.config.currency.as_str();
    let closed = db::metering::closed_periods(&state.db).await?;
    let status = match closed.iter().find(|c| c.0 == first_day) {
        Some((_, at, by)) => format!("closed {} by {by}", when(*at)),
        None => "open: figures change until the period is closed".into(),
    };
    let total = period_line(first_day, String::new(), &teams, currency);
    Ok(render(&PeriodPage {
        signed_in: Some(signed_in(&user)),
        period: crate::billing::period_name(first_day),
        status,
        teams: teams
            .iter()
            .map(|t| TeamStatementLine {
                team: t.team.clone(),
                gpu_hours: figures::gpu_hours(t.gpu_milli_ms),
                billed: figures::money(t.billed_cost_micros, currency),
            })
            .collect(),
        total_gpu_hours: total.gpu_hours,
        total_billed: total.billed,
    }))
}
