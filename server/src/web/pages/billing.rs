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
use crate::{auth::policy::team_role, db, db::web_sessions::SessionUser, state::AppState, web::charts};

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
    top_jobs: Vec<TopJobLine>,
}

/// A team's monthly statement: usage and cost by class and priority class, its budget, its
/// costliest jobs and its share of idle capacity.
pub async fn statement(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path((name, period)): Path<(String, String)>,
) -> Result<Response, PageError> {
    let team = db::teams::by_name(&state.db, &name).await?.ok_or_else(PageError::not_found)?;
    team_role(&state.db, &principal(&user), &team).await?.ok_or_else(PageError::not_found)?;
    let period = crate::domain::BudgetPeriod::parse("period", &period).map_err(|_| PageError::not_found())?;
    let first_day = period.first_day();
    let s = crate::billing::statement::statement(&state.db, team.id, first_day, Utc::now(), state.config.chargeback)
        .await?;
    let currency = &state.config.currency;
    let money = |micros: i64| format!("{} {currency}", crate::metering::micros_decimal(micros));
    let hours = crate::metering::gpu_hours_decimal;
    let in_unit = |unit: &str, amount: i64| match unit {
        "gpu-hours" => format!("{amount} GPU-hours"),
        _ => money(amount),
    };
    let unit = s.budget.as_ref().map_or("money".to_owned(), |b| b.0.clone());
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

/// A billing period's line.
pub struct PeriodLine {
    pub period: String,
    pub status: String,
    pub rows: i64,
    pub gpu_hours: String,
    pub billed: String,
}

/// A team's cost over the charted days.
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
    costs: Vec<CostLine>,
}

/// Billing is finance's and platform admins'; anyone else is told their role does not allow
/// it, as the API does.
fn require_finance(user: &SessionUser) -> Result<(), PageError> {
    principal(user).platform_role().map(|_| ()).ok_or_else(|| crate::ops::Error::Forbidden.into())
}

/// Finance's page: every billing period with its totals and its exports.
pub async fn billing(State(state): State<AppState>, CurrentUser(user): CurrentUser) -> Result<Response, PageError> {
    require_finance(&user)?;
    let closed = db::metering::closed_periods(&state.db).await?;
    let mut periods: Vec<chrono::NaiveDate> = closed.iter().map(|c| c.0).collect();
    let current = crate::billing::budgets::period_of(Utc::now());
    if !periods.contains(&current) {
        periods.insert(0, current);
    }
    let mut lines = Vec::new();
    for period in periods {
        let (rows, gpu, cost) = db::billing::period_totals(&state.db, period).await?;
        let status = match closed.iter().find(|c| c.0 == period) {
            Some((_, at, by)) => format!("closed {} by {by}", when(*at)),
            None => "open".into(),
        };
        lines.push(PeriodLine {
            period: crate::billing::period_name(period),
            status,
            rows,
            gpu_hours: crate::metering::gpu_hours_decimal(gpu),
            billed: format!("{} {}", crate::metering::micros_decimal(cost), state.config.currency),
        });
    }
    let (from, to) = usage_window();
    let usage = db::billing::daily_usage(&state.db, from, to).await?;
    let currency = state.config.currency.clone();
    let hours = |v: f64| format!("{v:.1} GPU-hours");
    let mut by_team: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    let mut by_class: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    let mut cost: BTreeMap<String, (f64, i64)> = BTreeMap::new();
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
        let team = cost.entry(u.team.clone()).or_default();
        team.0 += gpu_hours;
        team.1 += u.billed_cost_micros;
    }
    let budgets = budget_uses(&state).await?;
    for team in budgets.keys() {
        cost.entry(team.clone()).or_default();
    }
    let top = cost.values().map(|c| c.1).max().unwrap_or(0).max(1);
    let mut budgets = budgets;
    let costs = cost
        .into_iter()
        .map(|(team, (gpu_hours, micros))| CostLine {
            budget: budgets.remove(&team),
            team,
            gpu_hours: format!("{gpu_hours:.1}"),
            billed: format!("{} {currency}", crate::metering::micros_decimal(micros)),
            percent: (100 * i128::from(micros) / i128::from(top)) as i64,
        })
        .collect();
    Ok(render(&BillingPage {
        signed_in: Some(signed_in(&user)),
        periods: lines,
        window: format!("{from} to {}", to.pred_opt().unwrap_or(to)),
        by_team: charts::stacked(&by_team, hours),
        by_class: charts::stacked(&by_class, hours),
        costs,
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
            let show = |amount: i64| match b.unit.as_str() {
                "gpu-hours" => format!("{amount} GPU-hours"),
                _ => format!("{} {currency}", crate::metering::micros_decimal(amount)),
            };
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
    let (_, end) = crate::billing::budgets::period_bounds(first_day);
    let usage = db::billing::daily_usage(&state.db, first_day, end.date_naive()).await?;
    let mut by_team: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    // Every team has a statement, used or not.
    for team in db::teams::list_all(&state.db, None, 10_000).await? {
        by_team.entry(team.name).or_default();
    }
    for u in &usage {
        let line = by_team.entry(u.team.clone()).or_default();
        line.0 += u.gpu_milli_ms;
        line.1 += u.billed_cost_micros;
    }
    let currency = &state.config.currency;
    let money = |micros: i64| format!("{} {currency}", crate::metering::micros_decimal(micros));
    let (total_gpu, total_cost) = by_team.values().fold((0, 0), |acc, l| (acc.0 + l.0, acc.1 + l.1));
    let closed = db::metering::closed_periods(&state.db).await?;
    let status = match closed.iter().find(|c| c.0 == first_day) {
        Some((_, at, by)) => format!("closed {} by {by}", when(*at)),
        None => "open: figures change until the period is closed".into(),
    };
    Ok(render(&PeriodPage {
        signed_in: Some(signed_in(&user)),
        period: crate::billing::period_name(first_day),
        status,
        teams: by_team
            .into_iter()
            .map(|(team, (gpu, cost))| TeamStatementLine {
                team,
                gpu_hours: crate::metering::gpu_hours_decimal(gpu),
                billed: money(cost),
            })
            .collect(),
        total_gpu_hours: crate::metering::gpu_hours_decimal(total_gpu),
        total_billed: money(total_cost),
    }))
}
