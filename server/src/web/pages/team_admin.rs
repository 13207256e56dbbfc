//! What a team's admins (and platform admins) manage besides members: its API tokens, its
//! audit log and the platform's audit log, and (platform admins only) its quotas and monthly
//! budgets.

use crate::domain::TokenId;
use askama::Template;
use axum::{
    extract::{Path, RawQuery, State},
    response::{IntoResponse, Redirect, Response},
};
use chrono::{Datelike, Months, Utc};
use serde::Deserialize;

use super::{
    administered_team, form_error, in_words,
    platform_admin::{decimal_units, Outcome},
    principal, render, signed_in, when, CurrentUser, NoFields, PageError, PortalForm, SignedIn,
};
use crate::{
    db::{self, web_sessions::SessionUser},
    domain::{BudgetPeriod, BudgetUnit, Enforcement, PlatformRole, TeamRole},
    ops,
    state::AppState,
    web::figures,
};

/// A token as the tokens page lists it.
pub struct TokenLine {
    pub id: TokenId,
    pub name: String,
    pub role: String,
    pub prefix: String,
    pub created: String,
    pub expires: String,
    pub last_used: String,
    pub revoked: bool,
}

/// A token just created: its secret, shown this once.
pub struct MintedLine {
    pub name: String,
    pub secret: String,
}

#[derive(Template)]
#[template(path = "tokens.html")]
struct TokensPage {
    signed_in: Option<SignedIn>,
    csrf: String,
    team: String,
    tokens: Vec<TokenLine>,
    minted: Option<MintedLine>,
    error: Option<String>,
    form_name: String,
}

async fn tokens_page(
    state: &AppState,
    user: &SessionUser,
    team: &db::teams::TeamRow,
    minted: Option<MintedLine>,
    error: Option<String>,
    form_name: String,
) -> Result<Response, PageError> {
    let rows = db::tokens::list(&state.db, team.id, None, 200).await?;
    let tokens = rows
        .into_iter()
        .map(|t| TokenLine {
            id: t.id,
            name: t.name,
            role: t.role,
            prefix: t.display_prefix,
            created: when(t.created_at),
            expires: when(t.expires_at),
            last_used: t.last_used_at.map_or_else(|| "never".into(), when),
            revoked: t.revoked_at.is_some(),
        })
        .collect();
    Ok(render(&TokensPage {
        signed_in: Some(signed_in(user)),
        csrf: user.csrf_token.clone(),
        team: team.name.clone(),
        tokens,
        minted,
        error,
        form_name,
    }))
}

/// A team's API tokens, for its admins.
pub async fn team_tokens(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let team = administered_team(&state, &user, &name).await?;
    tokens_page(&state, &user, &team, None, None, String::new()).await
}

/// The new-token form, as typed.
#[derive(Deserialize)]
pub struct NewTokenForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    role: String,
    #[serde(default)]
    days: String,
}

/// Creates a token from the form; the page that answers shows its secret once.
pub async fn create_token(
    State(state): State<AppState>,
    Path(name): Path<String>,
    PortalForm { user, form }: PortalForm<NewTokenForm>,
) -> Result<Response, PageError> {
    let team = administered_team(&state, &user, &name).await?;
    let days = match form.days.trim().parse::<i64>() {
        Ok(d) if (1..=366).contains(&d) => d,
        _ => {
            let error = Some("Valid for: a number of days from 1 to 366.".to_owned());
            return tokens_page(&state, &user, &team, None, error, form.name).await;
        }
    };
    let Some(role) = TeamRole::parse(&form.role) else {
        let error = Some("Role: member or viewer.".to_owned());
        return tokens_page(&state, &user, &team, None, error, form.name).await;
    };
    let request =
        ops::tokens::NewToken { name: form.name.clone(), role, expires_at: Utc::now() + chrono::Duration::days(days) };
    match ops::tokens::mint(&state, &principal(&user), &team, &request).await {
        Ok(minted) => {
            let line = MintedLine { name: minted.token.name, secret: minted.secret };
            tokens_page(&state, &user, &team, Some(line), None, String::new()).await
        }
        Err(ops::Error::Validation(errors)) => {
            let error = in_words(&errors);
            tokens_page(&state, &user, &team, None, Some(error), form.name).await
        }
        Err(e) => Err(e.into()),
    }
}

/// Revokes a token from its row's button.
pub async fn revoke_token(
    State(state): State<AppState>,
    Path((name, token)): Path<(String, String)>,
    PortalForm { user, .. }: PortalForm<NoFields>,
) -> Result<Response, PageError> {
    let team = administered_team(&state, &user, &name).await?;
    let token: TokenId = token.parse().map_err(|_| PageError::not_found())?;
    ops::tokens::revoke(&state, &principal(&user), &team, token).await?;
    Ok(Redirect::to(&format!("/teams/{}/tokens", team.name)).into_response())
}

/// One audit entry as the page shows it.
pub struct AuditLine {
    pub at: String,
    pub actor: String,
    pub action: String,
    pub object: String,
    pub changes: Vec<String>,
}

#[derive(Template)]
#[template(path = "audit.html")]
struct AuditPage {
    signed_in: Option<SignedIn>,
    team: Option<String>,
    entries: Vec<AuditLine>,
    older_link: Option<String>,
}

/// What a change changed, field by field: `reserved: 8 → 12`, `+ name: ci`, `- burst: 4`.
/// Secrets never reach the audit log, so every value may be shown.
pub fn audit_changes(before: Option<&serde_json::Value>, after: Option<&serde_json::Value>) -> Vec<String> {
    let empty = serde_json::Map::new();
    let fields = |v: Option<&serde_json::Value>| v.and_then(|v| v.as_object()).unwrap_or(&empty).clone();
    let (before, after) = (fields(before), fields(after));
    let show = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter_map(|k| match (before.get(k), after.get(k)) {
            (Some(b), Some(a)) if a != b => Some(format!("{k}: {} → {}", show(b), show(a))),
            (None, Some(a)) => Some(format!("+ {k}: {}", show(a))),
            (Some(b), None) => Some(format!("- {k}: {}", show(b))),
            _ => None,
        })
        .collect()
}

#[derive(Deserialize, Default)]
struct AuditQuery {
    before: Option<i64>,
}

async fn audit_page(
    state: &AppState,
    user: &SessionUser,
    team: Option<&db::teams::TeamRow>,
    raw_query: Option<String>,
) -> Result<Response, PageError> {
    const PER_PAGE: i64 = 100;
    let q: AuditQuery = serde_urlencoded::from_str(raw_query.as_deref().unwrap_or_default()).unwrap_or_default();
    let mut rows = db::audit::list(&state.db, team.map(|t| t.id), q.before, PER_PAGE + 1).await?;
    let more = rows.len() as i64 > PER_PAGE;
    rows.truncate(PER_PAGE as usize);
    let base = match team {
        Some(t) => format!("/teams/{}/audit", t.name),
        None => "/audit".to_owned(),
    };
    let older_link = rows.last().filter(|_| more).map(|last| format!("{base}?before={}", last.id));
    let entries = rows
        .into_iter()
        .map(|r| AuditLine {
            at: when(r.at),
            changes: audit_changes(r.before.as_ref(), r.after.as_ref()),
            actor: r.actor,
            action: r.action,
            object: format!("{} {}", r.object_type, r.object_id),
        })
        .collect();
    Ok(render(&AuditPage { signed_in: Some(signed_in(user)), team: team.map(|t| t.name.clone()), entries, older_link }))
}

/// A team's audit log, for its admins.
pub async fn team_audit(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, PageError> {
    let team = administered_team(&state, &user, &name).await?;
    audit_page(&state, &user, Some(&team), query).await
}

/// The whole platform's audit log, for platform admins.
pub async fn audit(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    RawQuery(query): RawQuery,
) -> Result<Response, PageError> {
    if principal(&user).platform_role() != Some(PlatformRole::PlatformAdmin) {
        return Err(ops::Error::Forbidden.into());
    }
    audit_page(&state, &user, None, query).await
}

/// A quota row of the quotas page.
pub struct QuotaRowLine {
    pub gpu_class: String,
    pub reserved: i32,
    pub burst: i32,
    pub lendable: String,
    pub version: i64,
}

/// A month's budget of the quotas page.
pub struct BudgetLine {
    /// `YYYY-MM`.
    pub period: String,
    /// In its unit, as every page writes it: `1500.50 USD`, `400 GPU-hours`.
    pub amount: String,
    pub enforcement: String,
    /// Sent back by the row's Remove button, so a budget changed meanwhile is not removed.
    pub version: i64,
}

#[derive(Template)]
#[template(path = "quotas.html")]
struct QuotasPage {
    signed_in: Option<SignedIn>,
    csrf: String,
    team: String,
    quotas: Vec<QuotaRowLine>,
    /// Classes the team has no quota of yet.
    unset: Vec<String>,
    warnings: Vec<String>,
    error: Option<String>,
    currency: String,
    budgets: Vec<BudgetLine>,
    /// What the last budget form did, shown in the budgets section.
    budget_outcome: Outcome,
    budget_form: BudgetForm,
}

/// The team, when the user is a platform admin (quotas are theirs to set). Its members are
/// told their role does not allow it; to anyone else the team does not exist.
async fn quota_team(state: &AppState, user: &SessionUser, name: &str) -> Result<db::teams::TeamRow, PageError> {
    let team = db::teams::by_name(&state.db, name).await?.ok_or_else(PageError::not_found)?;
    if principal(user).platform_role() != Some(PlatformRole::PlatformAdmin) {
        crate::auth::policy::team_role(&state.db, &principal(user), &team).await?.ok_or_else(PageError::not_found)?;
        return Err(ops::Error::Forbidden.into());
    }
    Ok(team)
}

async fn quotas_page(
    state: &AppState,
    user: &SessionUser,
    team: &db::teams::TeamRow,
    warnings: Vec<String>,
    error: Option<String>,
) -> Result<Response, PageError> {
    quotas_and_budgets_page(state, user, team, warnings, error, Outcome::default(), BudgetForm::default()).await
}

/// The quotas page with the budget form's outcome and what it kept of what was typed.
async fn quotas_and_budgets_page(
    state: &AppState,
    user: &SessionUser,
    team: &db::teams::TeamRow,
    warnings: Vec<String>,
    error: Option<String>,
    budget_outcome: Outcome,
    budget_form: BudgetForm,
) -> Result<Response, PageError> {
    let currency = &state.config.currency;
    let budgets = db::budgets::list(&state.db, team.id)
        .await?
        .into_iter()
        .map(|b| BudgetLine {
            period: BudgetPeriod::from_date(b.period).to_string(),
            amount: figures::in_budget_unit(&b.unit, b.amount, currency),
            enforcement: b.enforcement,
            version: b.version,
        })
        .collect();
    let rows = db::quotas::list(&state.db, team.id).await?;
    let all = db::gpu_classes::list(&state.db, None, 1000).await?;
    let unset = all.into_iter().map(|c| c.name).filter(|c| !rows.iter().any(|q| &q.gpu_class == c)).collect();
    let quotas = rows
        .into_iter()
        .map(|q| QuotaRowLine {
            gpu_class: q.gpu_class,
            reserved: q.reserved,
            burst: q.burst,
            lendable: q.lendable.map(|l| l.to_string()).unwrap_or_default(),
            version: q.version,
        })
        .collect();
    Ok(render(&QuotasPage {
        signed_in: Some(signed_in(user)),
        csrf: user.csrf_token.clone(),
        team: team.name.clone(),
        quotas,
        unset,
        warnings,
        error,
        currency: currency.clone(),
        budgets,
        budget_outcome,
        budget_form,
    }))
}

/// A team's quotas and budgets, for platform admins to set.
pub async fn team_quotas(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let team = quota_team(&state, &user, &name).await?;
    quotas_page(&state, &user, &team, Vec::new(), None).await
}

/// A quota row's form, as typed.
#[derive(Deserialize)]
pub struct QuotaForm {
    #[serde(default)]
    gpu_class: String,
    #[serde(default)]
    reserved: String,
    #[serde(default)]
    burst: String,
    #[serde(default)]
    lendable: String,
    #[serde(default)]
    version: String,
}

/// Sets one quota from its row's form; the page that answers shows any warning, such as
/// reserving more than the platform's capacity.
pub async fn set_quota(
    State(state): State<AppState>,
    Path(name): Path<String>,
    PortalForm { user, form }: PortalForm<QuotaForm>,
) -> Result<Response, PageError> {
    let team = quota_team(&state, &user, &name).await?;
    let number = |field: &str, text: &str| -> Result<i64, String> {
        text.trim().parse::<i64>().map_err(|_| format!("{field}: a whole number of GPUs"))
    };
    let parsed = (|| -> Result<(ops::quotas::QuotaSpec, i64), String> {
        let lendable = match form.lendable.trim() {
            "" => None,
            text => Some(number("lendable", text)?),
        };
        let spec = ops::quotas::QuotaSpec {
            reserved: number("reserved", &form.reserved)?,
            burst: number("burst", &form.burst)?,
            lendable,
        };
        Ok((spec, number("version", &form.version).unwrap_or(0)))
    })();
    let (spec, version) = match parsed {
        Ok(p) => p,
        Err(error) => return quotas_page(&state, &user, &team, Vec::new(), Some(error)).await,
    };
    let if_match = ops::Precondition::version(version);
    match ops::quotas::set(&state, &principal(&user), team.clone(), &form.gpu_class, &spec, &if_match).await {
        Ok(result) => quotas_page(&state, &user, &team, result.warnings, None).await,
        Err(ops::Error::Validation(errors)) => {
            let error = in_words(&errors);
            quotas_page(&state, &user, &team, Vec::new(), Some(error)).await
        }
        Err(ops::Error::PreconditionFailed) => {
            let error = "Someone changed this quota since the page was shown; here it is as it is now.".to_owned();
            quotas_page(&state, &user, &team, Vec::new(), Some(error)).await
        }
        Err(e) => Err(e.into()),
    }
}

/// The budget form, as typed.
#[derive(Debug, Clone, Deserialize)]
pub struct BudgetForm {
    /// `YYYY-MM`.
    #[serde(default)]
    pub period: String,
    /// `money` or `gpu-hours`.
    #[serde(default)]
    pub unit: String,
    /// Money as people write it (`1500`, `1500.50`), or whole GPU-hours.
    #[serde(default)]
    pub amount: String,
    /// `hard` or `soft`.
    #[serde(default)]
    pub enforcement: String,
}

impl Default for BudgetForm {
    /// An empty form for next month: budgets are mostly set ahead of the month they bound.
    fn default() -> Self {
        let today = Utc::now().date_naive();
        let next = today.with_day(1).and_then(|d| d.checked_add_months(Months::new(1))).unwrap_or(today);
        Self {
            period: BudgetPeriod::from_date(next).to_string(),
            unit: "money".to_owned(),
            amount: String::new(),
            enforcement: "hard".to_owned(),
        }
    }
}

/// A budget's amount as typed, in the unit's integer: micro-units for money (exact, from
/// up to six decimals), whole GPU-hours otherwise. The error names the field in words.
fn budget_amount(unit: BudgetUnit, text: &str) -> Result<i64, &'static str> {
    match unit {
        BudgetUnit::Money => decimal_units(text, 6).ok_or("amount: an amount of money such as 1500 or 1500.50"),
        BudgetUnit::GpuHours => decimal_units(text, 0).ok_or("amount: a whole number of GPU-hours such as 400"),
    }
}

/// Sets the team's budget for a month from the form; a refusal names the field and keeps
/// what was typed.
pub async fn set_budget(
    State(state): State<AppState>,
    Path(name): Path<String>,
    PortalForm { user, form }: PortalForm<BudgetForm>,
) -> Result<Response, PageError> {
    let team = quota_team(&state, &user, &name).await?;
    let parsed = (|| -> Result<ops::budgets::BudgetSpec, &'static str> {
        let unit = BudgetUnit::parse(form.unit.trim()).ok_or("unit: money or gpu-hours")?;
        let enforcement = Enforcement::parse(form.enforcement.trim()).ok_or("enforcement: hard or soft")?;
        Ok(ops::budgets::BudgetSpec { unit, amount: budget_amount(unit, &form.amount)?, enforcement })
    })();
    let error = |message: String| Outcome { section: "budgets", ok: None, error: Some(message) };
    let spec = match parsed {
        Ok(spec) => spec,
        Err(message) => {
            return quotas_and_budgets_page(&state, &user, &team, Vec::new(), None, error(message.to_owned()), form)
                .await
        }
    };
    // The form states the whole budget of its month, so it replaces whatever is there, as a
    // PUT without If-Match does: there is no version a person could have read.
    let (outcome, kept) = match ops::budgets::put(
        &state,
        &principal(&user),
        &team,
        form.period.trim(),
        &ops::Precondition::none(),
        &spec,
    )
    .await
    {
        Ok(row) => {
            let amount = figures::in_budget_unit(&row.unit, row.amount, &state.config.currency);
            let period = BudgetPeriod::from_date(row.period);
            let ok = format!("Budget of {} for {period}: {amount}, {}.", team.name, row.enforcement);
            (Outcome { section: "budgets", ok: Some(ok), error: None }, BudgetForm::default())
        }
        Err(e) => (error(form_error(e)?), form),
    };
    quotas_and_budgets_page(&state, &user, &team, Vec::new(), None, outcome, kept).await
}

/// The Remove button of a budget's row.
#[derive(Debug, Default, Deserialize)]
pub struct BudgetDeleteForm {
    #[serde(default)]
    pub version: String,
}

/// Removes the team's budget for a month, unless it changed since the page was shown.
pub async fn delete_budget(
    State(state): State<AppState>,
    Path((name, period)): Path<(String, String)>,
    PortalForm { user, form }: PortalForm<BudgetDeleteForm>,
) -> Result<Response, PageError> {
    let team = quota_team(&state, &user, &name).await?;
    let if_match = ops::Precondition::version(form.version.trim().parse().unwrap_or(-1));
    let outcome = match ops::budgets::delete(&state, &principal(&user), &team, &period, &if_match).await {
        Ok(()) => Outcome {
            section: "budgets",
            ok: Some(format!("Budget of {} for {period} removed.", team.name)),
            error: None,
        },
        Err(e) => Outcome { section: "budgets", ok: None, error: Some(form_error(e)?) },
    };
    quotas_and_budgets_page(&state, &user, &team, Vec::new(), None, outcome, BudgetForm::default()).await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{audit_changes, budget_amount};
    use crate::domain::BudgetUnit;

    #[test]
    fn a_budget_amount_is_read_exactly_money_to_the_micro_unit_and_gpu_hours_whole() {
        assert_eq!(budget_amount(BudgetUnit::Money, "1500"), Ok(1_500_000_000));
        assert_eq!(budget_amount(BudgetUnit::Money, " 1500.50 "), Ok(1_500_500_000));
        assert_eq!(budget_amount(BudgetUnit::Money, "0.000001"), Ok(1));
        assert!(budget_amount(BudgetUnit::Money, "1,500").is_err());
        assert!(budget_amount(BudgetUnit::Money, "-5").is_err());
        assert_eq!(budget_amount(BudgetUnit::GpuHours, "400"), Ok(400));
        assert!(budget_amount(BudgetUnit::GpuHours, "400.5").is_err());
        assert!(budget_amount(BudgetUnit::GpuHours, "").is_err());
    }

    #[test]
    fn an_audit_entry_says_field_by_field_what_changed() {
        let before = json!({"reserved": 8, "burst": 4, "lendable": null});
        let after = json!({"reserved": 12, "burst": 4, "name": "ci"});
        assert_eq!(
            audit_changes(Some(&before), Some(&after)),
            ["- lendable: null", "+ name: ci", "reserved: 8 → 12"].map(String::from)
        );
        assert_eq!(audit_changes(None, Some(&json!({"role": "member"}))), ["+ role: member"]);
        assert!(audit_changes(Some(&after), Some(&after)).is_empty());
    }
}
