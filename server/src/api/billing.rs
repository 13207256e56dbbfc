//! Billing for finance (exports, periods) and for teams (usage over time, statements,
//! budget status).

use crate::domain::JobId;
use axum::{
    body::Body,
    extract::{Path, State},
    http::{header, HeaderValue},
    response::{IntoResponse, Response},
    Extension, Json,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{error::ApiError, extract::ListQuery};
use crate::ops;
use crate::{
    auth::{policy::TeamAccess, Principal},
    billing::{
        self,
        budgets::{period_bounds, period_of},
        export::Format,
    },
    db,
    domain::{BudgetPeriod, FieldError},
    metering::{gpu_hours_decimal, micros_decimal},
    state::AppState,
};

/// What to export.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ExportParams {
    /// The billing period, `YYYY-MM`.
    pub period: String,
    /// `csv` (Fairway's columns), `json` (JSON lines) or `focus` (FinOps FOCUS 1.1 as CSV).
    pub format: Format,
}

/// Exports one billing period of the ledger. The body streams a header and one line per
/// ledger row, nothing else; its control record (row count, totals, SHA-256 of the file) is
/// at `/api/v1/billing/exports/control`. A closed period exports to the same bytes every time.
#[utoipa::path(
    get, path = "/api/v1/billing/exports", tag = "billing", operation_id = "export_billing",
    params(ExportParams),
    responses((status = 200, description = "The export", content_type = "text/csv"),
              (status = 422, body = super::error::Problem))
)]
pub async fn export_billing(
    State(state): State<AppState>,
    ListQuery(params): ListQuery<ExportParams>,
) -> Result<Response, ApiError> {
    let period = BudgetPeriod::parse("period", &params.period)?.first_day();
    let closed = db::metering::period_closed(&state.db, period).await?;
    let name =
        format!("fairway-{}-{}.{}", billing::period_name(period), params.format.as_str(), params.format.extension());
    let body = Body::from_stream(billing::export::stream(
        state.db.clone(),
        period,
        params.format,
        state.config.currency.clone(),
    ));
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(params.format.content_type()));
    if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename=\"{name}\"")) {
        headers.insert(header::CONTENT_DISPOSITION, v);
    }
    headers.insert("x-billing-period-closed", HeaderValue::from_static(if closed { "true" } else { "false" }));
    Ok(response)
}

/// The control record of an export: its row count, totals and the SHA-256 of the file
/// `GET /api/v1/billing/exports` serves for the same period and format. A closed period's
/// describes every download of it; an open period's, the export as it is at this moment.
#[utoipa::path(
    get, path = "/api/v1/billing/exports/control", tag = "billing", operation_id = "get_export_control",
    params(ExportParams),
    responses((status = 200, body = ops::billing::ExportControl), (status = 422, body = super::error::Problem))
)]
pub async fn get_export_control(
    State(state): State<AppState>,
    ListQuery(params): ListQuery<ExportParams>,
) -> Result<Json<ops::billing::ExportControl>, ApiError> {
    Ok(Json(ops::billing::export_control(&state, &params.period, params.format).await?))
}

/// A billing period and whether it is closed.
#[derive(Serialize, ToSchema)]
pub struct PeriodView {
    /// `YYYY-MM`.
    pub period: String,
    pub closed: bool,
    pub closed_at: Option<DateTime<Utc>>,
    pub closed_by: Option<String>,
    /// Ledger rows billed in the period so far.
    pub rows: i64,
    /// GPU time billed, in GPU-hours (exact in `gpu_milli_ms`).
    pub gpu_hours: String,
    pub gpu_milli_ms: i64,
    /// Money billed, decimal in the platform currency.
    pub billed_cost: String,
    pub currency: String,
}

async fn period_view(state: &AppState, period: chrono::NaiveDate) -> Result<PeriodView, ApiError> {
    let closed = db::metering::closed_periods(&state.db).await?.into_iter().find(|(p, _, _)| *p == period);
    let (rows, gpu, cost) = db::billing::period_totals(&state.db, period).await?;
    Ok(PeriodView {
        period: billing::period_name(period),
        closed: closed.is_some(),
        closed_at: closed.as_ref().map(|c| c.1),
        closed_by: closed.map(|c| c.2),
        rows,
        gpu_hours: gpu_hours_decimal(gpu),
        gpu_milli_ms: gpu,
        billed_cost: micros_decimal(cost),
        currency: state.config.currency.clone(),
    })
}

/// Lists the closed billing periods, newest first, and the current one.
#[utoipa::path(
    get, path = "/api/v1/billing/periods", tag = "billing", operation_id = "list_billing_periods",
    responses((status = 200, body = Vec<PeriodView>))
)]
pub async fn list_billing_periods(State(state): State<AppState>) -> Result<Json<Vec<PeriodView>>, ApiError> {
    let mut periods: Vec<chrono::NaiveDate> =
        db::metering::closed_periods(&state.db).await?.into_iter().map(|(p, _, _)| p).collect();
    let current = period_of(Utc::now());
    if !periods.contains(&current) {
        periods.insert(0, current);
    }
    let mut out = Vec::with_capacity(periods.len());
    for p in periods {
        out.push(period_view(&state, p).await?);
    }
    Ok(Json(out))
}

/// Closes a billing period: from then on its export never changes, and usage booked late
/// for it lands in the next open period as a correction. Periods close in order, once
/// they are over.
#[utoipa::path(
    post, path = "/api/v1/billing/periods/{period}/close", tag = "billing", operation_id = "close_billing_period",
    params(("period" = String, Path, description = "Month, YYYY-MM")),
    responses((status = 200, body = PeriodView), (status = 409, body = super::error::Problem),
              (status = 422, body = super::error::Problem))
)]
pub async fn close_billing_period(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(period): Path<String>,
) -> Result<Json<PeriodView>, ApiError> {
    let period = ops::billing::close_period(&state, &principal, &period).await?;
    Ok(Json(period_view(&state, period).await?))
}

/// What usage to show.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageParams {
    /// Start (RFC 3339), inclusive; default: the start of the current month.
    pub from: Option<DateTime<Utc>>,
    /// End (RFC 3339), exclusive; default: now. At most 366 days after `from`.
    pub to: Option<DateTime<Utc>>,
    /// Bucket size: `hour`, `day` (default) or `month`, in UTC.
    pub step: Option<String>,
    /// `gpu_class`, `priority_class`, `label:<key>`, or none for totals.
    pub group_by: Option<String>,
}

/// One bucket of a team's usage.
#[derive(Serialize, ToSchema)]
pub struct UsagePoint {
    pub at: DateTime<Utc>,
    /// The group's value (class, priority class or label value); empty without grouping.
    pub group: String,
    pub gpu_hours: String,
    pub gpu_milli_ms: i64,
    pub cost: String,
    pub cost_micros: i64,
}

/// A team's usage and cost over time, from the ledger.
#[derive(Serialize, ToSchema)]
pub struct UsageView {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub step: String,
    pub group_by: Option<String>,
    pub currency: String,
    pub points: Vec<UsagePoint>,
}

/// A team's booked usage and cost over time, by class, priority class or label.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/usage", tag = "billing", operation_id = "get_team_usage",
    params(("team" = String, Path, description = "Team name"), UsageParams),
    responses((status = 200, body = UsageView), (status = 422, body = super::error::Problem))
)]
pub async fn get_team_usage(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    ListQuery(params): ListQuery<UsageParams>,
) -> Result<Json<UsageView>, ApiError> {
    let now = Utc::now();
    let from = params.from.unwrap_or_else(|| period_bounds(period_of(now)).0);
    let to = params.to.unwrap_or(now);
    let mut errors = Vec::new();
    if to <= from {
        errors.push(FieldError::new("to", "before_from", "must be after `from`"));
    } else if to - from > chrono::Duration::days(366) {
        errors.push(FieldError::new("to", "too_far", "at most 366 days after `from`"));
    }
    let step = params.step.clone().unwrap_or_else(|| "day".into());
    if !matches!(step.as_str(), "hour" | "day" | "month") {
        errors.push(FieldError::new("step", "invalid_value", "one of hour, day, month"));
    }
    let (group, label) = match params.group_by.as_deref() {
        None => ("none", ""),
        Some(g @ ("gpu_class" | "priority_class")) => (g, ""),
        Some(g) => match g.strip_prefix("label:") {
            Some(key) if !key.is_empty() => ("label", key),
            _ => {
                errors.push(FieldError::new(
                    "group_by",
                    "invalid_value",
                    "one of gpu_class, priority_class, label:<key>",
                ));
                ("none", "")
            }
        },
    };
    if !errors.is_empty() {
        return Err(ApiError::Validation(errors));
    }
    let rows = db::billing::usage(&state.db, access.team.id, from, to, &step, group, label).await?;
    Ok(Json(UsageView {
        from,
        to,
        step,
        group_by: params.group_by,
        currency: state.config.currency.clone(),
        points: rows
            .into_iter()
            .map(|r| UsagePoint {
                at: r.bucket,
                group: r.group,
                gpu_hours: gpu_hours_decimal(r.gpu_milli_ms),
                gpu_milli_ms: r.gpu_milli_ms,
                cost: micros_decimal(r.billed_cost_micros),
                cost_micros: r.billed_cost_micros,
            })
            .collect(),
    }))
}

/// A line of a statement.
#[derive(Serialize, ToSchema)]
pub struct StatementLineView {
    pub gpu_class: String,
    pub priority_class: String,
    pub gpu_hours: String,
    pub gpu_milli_ms: i64,
    pub list_cost: String,
    pub billed_cost: String,
}

/// A costly job on a statement.
#[derive(Serialize, ToSchema)]
pub struct TopJobView {
    pub job_id: JobId,
    pub name: String,
    pub gpu_hours: String,
    pub billed_cost: String,
}

/// A team's statement for one month.
#[derive(Serialize, ToSchema)]
pub struct StatementView {
    pub team: String,
    pub period: String,
    /// Closed periods no longer change.
    pub closed: bool,
    pub currency: String,
    pub lines: Vec<StatementLineView>,
    pub gpu_hours: String,
    pub list_cost: String,
    pub billed_cost: String,
    /// The month's budget: unit, amount, enforcement.
    pub budget: Option<BudgetSummary>,
    /// The current month only: spend so far (running jobs included) and the forecast at the
    /// month's end, in the budget's unit (micro-units of money without a budget).
    pub spent_to_date: Option<i64>,
    pub forecast: Option<i64>,
    pub top_jobs: Vec<TopJobView>,
    /// The team's pro-rata share of idle capacity in the period (idle time of each completed
    /// class-hour × the team's share of that hour's use), and its cost at the rate card.
    /// Reported for showback; not part of `billed_cost`.
    pub idle_share_gpu_hours: String,
    pub idle_share_cost: String,
    /// GPU time the team's jobs held while their GPUs were idle (SM activity below their
    /// idle policy's threshold, or 5% without one; read from DCGM), and what it cost at what
    /// each job was billed. Part of `billed_cost`: the jobs held the GPUs.
    pub idle_gpu_hours: String,
    pub idle_cost: String,
    /// Those jobs, costliest first.
    pub idle_jobs: Vec<IdleJobView>,
    /// Allocated against effective: the billed GPU-hours whose activity was measured (DCGM),
    /// and those hours weighted by each job's mean SM activity.
    pub measured_gpu_hours: String,
    pub effective_gpu_hours: String,
    /// The team's recurring jobs (by name and class) that a cheaper class or MIG profile
    /// would have held (their peak memory with 10% to spare, their SM activity with 25%),
    /// with what they would have saved in the period; largest saving first.
    pub right_sizing: Vec<RightSizingView>,
}

/// Right-sizing advice for the jobs of one name on one class.
#[derive(Serialize, ToSchema)]
pub struct RightSizingView {
    pub job_name: String,
    pub gpu_class: String,
    /// Jobs of that name and class billed in the period whose activity was measured.
    pub jobs: i64,
    /// The most memory any of their GPUs used, MiB.
    pub peak_memory_mib: i64,
    /// Their mean SM activity, percent.
    pub mean_sm_active_percent: f64,
    /// The class or MIG profile that would have held them.
    pub recommended_class: String,
    pub recommended_memory_mib: i64,
    /// Its price per unit-hour as a percentage of the current class's.
    pub price_percent: i64,
    /// What they were billed in the period would have been this much less.
    pub saving: String,
}

/// A job that held GPUs idle, on a statement.
#[derive(Serialize, ToSchema)]
pub struct IdleJobView {
    pub job_id: JobId,
    pub name: String,
    pub idle_gpu_hours: String,
    pub idle_cost: String,
}

/// A budget as a statement shows it.
#[derive(Serialize, ToSchema)]
pub struct BudgetSummary {
    pub unit: String,
    pub amount: i64,
    pub enforcement: String,
}

/// A team's monthly statement: usage by class and priority class, cost, budget, top jobs.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/statements/{period}", tag = "billing", operation_id = "get_team_statement",
    params(("team" = String, Path, description = "Team name"), ("period" = String, Path, description = "Month, YYYY-MM")),
    responses((status = 200, body = StatementView), (status = 422, body = super::error::Problem))
)]
pub async fn get_team_statement(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
) -> Result<Json<StatementView>, ApiError> {
    let (_, period) = path;
    let period = BudgetPeriod::parse("period", &period)?.first_day();
    let s =
        billing::statement::statement(&state.db, access.team.id, period, Utc::now(), state.config.chargeback).await?;
    Ok(Json(StatementView {
        team: access.team.name.clone(),
        period: billing::period_name(period),
        closed: s.closed,
        currency: state.config.currency.clone(),
        gpu_hours: gpu_hours_decimal(s.gpu_milli_ms),
        list_cost: micros_decimal(s.list_cost_micros),
        billed_cost: micros_decimal(s.billed_cost_micros),
        lines: s
            .lines
            .into_iter()
            .map(|l| StatementLineView {
                gpu_class: l.gpu_class,
                priority_class: l.priority_class,
                gpu_hours: gpu_hours_decimal(l.gpu_milli_ms),
                gpu_milli_ms: l.gpu_milli_ms,
                list_cost: micros_decimal(l.list_cost_micros),
                billed_cost: micros_decimal(l.billed_cost_micros),
            })
            .collect(),
        budget: s.budget.map(|(unit, amount, enforcement)| BudgetSummary { unit, amount, enforcement }),
        spent_to_date: s.spent_to_date,
        forecast: s.forecast,
        idle_share_gpu_hours: gpu_hours_decimal(s.idle_share_gpu_milli_ms),
        idle_share_cost: micros_decimal(s.idle_share_cost_micros),
        idle_gpu_hours: gpu_hours_decimal(s.idle_gpu_milli_ms),
        idle_cost: micros_decimal(s.idle_cost_micros),
        right_sizing: s
            .right_sizing
            .iter()
            .map(|a| RightSizingView {
                job_name: a.job_name.clone(),
                gpu_class: a.gpu_class.clone(),
                jobs: a.jobs,
                peak_memory_mib: a.seen.peak_memory_mib,
                mean_sm_active_percent: (a.seen.mean_sm_active * 1000.0).round() / 10.0,
                recommended_class: a.recommendation.class.clone(),
                recommended_memory_mib: a.recommendation.memory_mib,
                price_percent: (a.recommendation.price_ratio_milli + 5) / 10,
                saving: micros_decimal(a.saving_micros),
            })
            .collect(),
        measured_gpu_hours: gpu_hours_decimal(s.measured_gpu_milli_ms),
        effective_gpu_hours: gpu_hours_decimal(s.effective_gpu_milli_ms),
        idle_jobs: s
            .idle_jobs
            .into_iter()
            .map(|j| IdleJobView {
                job_id: j.job_id,
                name: j.job_name,
                idle_gpu_hours: gpu_hours_decimal(j.idle_gpu_milli_ms),
                idle_cost: micros_decimal(j.idle_cost_micros),
            })
            .collect(),
        top_jobs: s
            .top_jobs
            .into_iter()
            .map(|j| TopJobView {
                job_id: j.job_id,
                name: j.job_name,
                gpu_hours: gpu_hours_decimal(j.gpu_milli_ms),
                billed_cost: micros_decimal(j.billed_cost_micros),
            })
            .collect(),
    }))
}

/// A raised budget alert.
#[derive(Serialize, ToSchema)]
pub struct AlertView {
    /// 50, 80 or 100 (percent of the budget).
    pub threshold: i32,
    pub spent: i64,
    pub amount: i64,
    pub unit: String,
    pub raised_at: DateTime<Utc>,
}

/// Where a team stands against this month's budget.
#[derive(Serialize, ToSchema)]
pub struct BudgetStatusView {
    pub period: String,
    pub budget: Option<BudgetSummary>,
    /// Spend so far, running jobs included, in the budget's unit (micro-units of money
    /// without a budget).
    pub spent_to_date: i64,
    /// At the current burn, at the month's end.
    pub forecast: i64,
    pub alerts: Vec<AlertView>,
}

/// A team's spend to date against this month's budget, the forecast and raised alerts.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/budget-status", tag = "billing", operation_id = "get_team_budget_status",
    params(("team" = String, Path, description = "Team name")),
    responses((status = 200, body = BudgetStatusView))
)]
pub async fn get_team_budget_status(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
) -> Result<Json<BudgetStatusView>, ApiError> {
    let now = Utc::now();
    let period = period_of(now);
    let s = billing::statement::statement(&state.db, access.team.id, period, now, state.config.chargeback).await?;
    let alerts = db::billing::alerts(&state.db, access.team.id, period).await?;
    Ok(Json(BudgetStatusView {
        period: billing::period_name(period),
        budget: s.budget.map(|(unit, amount, enforcement)| BudgetSummary { unit, amount, enforcement }),
        spent_to_date: s.spent_to_date.unwrap_or(0),
        forecast: s.forecast.unwrap_or(0),
        alerts: alerts
            .into_iter()
            .map(|a| AlertView {
                threshold: a.threshold,
                spent: a.spent,
                amount: a.amount,
                unit: a.unit,
                raised_at: a.raised_at,
            })
            .collect(),
    }))
}

/// Which period's utilisation to show.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UtilisationParams {
    /// The month, `YYYY-MM`.
    pub period: String,
}

/// One GPU class's capacity and use over a period.
#[derive(Serialize, ToSchema)]
pub struct ClassUtilisationView {
    pub gpu_class: String,
    /// GPU-hours the class's capacity offered (physical GPUs; exact values in `*_milli_ms`).
    pub capacity_gpu_hours: String,
    pub allocated_gpu_hours: String,
    pub idle_gpu_hours: String,
    pub capacity_milli_ms: i64,
    pub allocated_milli_ms: i64,
    pub idle_milli_ms: i64,
    /// Allocated ÷ capacity, percent with one decimal; absent without capacity.
    pub utilisation_percent: Option<f64>,
}

/// Capacity, allocated and idle GPU time per class over a period's completed hours.
#[utoipa::path(
    get, path = "/api/v1/billing/utilisation", tag = "billing", operation_id = "get_billing_utilisation",
    params(UtilisationParams),
    responses((status = 200, body = Vec<ClassUtilisationView>), (status = 422, body = super::error::Problem))
)]
pub async fn get_billing_utilisation(
    State(state): State<AppState>,
    ListQuery(params): ListQuery<UtilisationParams>,
) -> Result<Json<Vec<ClassUtilisationView>>, ApiError> {
    let period = BudgetPeriod::parse("period", &params.period)?.first_day();
    let (from, to) = period_bounds(period);
    let rows = db::billing::class_utilisation(&state.db, from, to).await?;
    Ok(Json(
        rows.into_iter()
            .map(|r| ClassUtilisationView {
                utilisation_percent: (r.capacity_milli_ms > 0)
                    .then(|| (1000 * i128::from(r.allocated_milli_ms) / i128::from(r.capacity_milli_ms)) as f64 / 10.0),
                capacity_gpu_hours: gpu_hours_decimal(r.capacity_milli_ms),
                allocated_gpu_hours: gpu_hours_decimal(r.allocated_milli_ms),
                idle_gpu_hours: gpu_hours_decimal(r.idle_milli_ms),
                gpu_class: r.gpu_class,
                capacity_milli_ms: r.capacity_milli_ms,
                allocated_milli_ms: r.allocated_milli_ms,
                idle_milli_ms: r.idle_milli_ms,
            })
            .collect(),
    ))
}
