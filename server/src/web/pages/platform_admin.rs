//! The platform admins' page: teams, the rate card, the priority classes and the idle
//! policies, each with the form that changes it. Every change goes through the same API functions (and audit log)
//! as the REST API.

use askama::Template;
use axum::{extract::State, response::Response};
use chrono::{NaiveDateTime, TimeZone, Utc};
use serde::Deserialize;

use super::{form_error, principal, render, signed_in, when, CurrentUser, PageError, PortalForm, SignedIn};
use crate::{
    db::{self, web_sessions::SessionUser},
    domain::{idle::IdleAction, PlatformRole},
    ops::{self, Precondition},
    state::AppState,
};

/// A team of the teams table.
pub struct TeamLine {
    pub name: String,
    pub parent: String,
    pub display_name: String,
}

/// A GPU class of the rate card.
pub struct RateLine {
    pub gpu_class: String,
    pub kind: String,
    pub memory: String,
    /// Price per GPU-hour now, in the platform currency.
    pub now: String,
    /// Prices already scheduled to start later, in words.
    pub upcoming: Vec<String>,
}

/// A priority class row, editable.
pub struct PriorityLine {
    pub name: String,
    pub priority: i32,
    pub preemptible: bool,
    pub usage_factor: String,
    pub price_multiplier: String,
    /// Seconds its jobs wait for capacity before they may preempt.
    pub preemption_delay: i32,
    pub description: String,
    pub version: i64,
}

/// An idle policy row, with what people read it by.
pub struct IdleLine {
    pub id: String,
    pub scope: String,
    pub rule: String,
}

/// Which form the page answers, so its message shows beside it.
#[derive(Default)]
pub struct Outcome {
    pub section: &'static str,
    pub ok: Option<String>,
    pub error: Option<String>,
}

#[derive(Template)]
#[template(path = "platform.html")]
struct PlatformPage {
    signed_in: Option<SignedIn>,
    csrf: String,
    currency: String,
    teams: Vec<TeamLine>,
    rates: Vec<RateLine>,
    priorities: Vec<PriorityLine>,
    idle_policies: Vec<IdleLine>,
    /// Priority class names, for the idle policy form.
    class_names: Vec<String>,
    outcome: Outcome,
    team_form: NewTeamForm,
}

/// Platform admins only; anyone else is told their role does not allow it, as the API does.
pub(super) fn require_platform_admin(user: &SessionUser) -> Result<(), PageError> {
    match principal(user).platform_role() {
        Some(PlatformRole::PlatformAdmin) => Ok(()),
        _ => Err(ops::Error::Forbidden.into()),
    }
}

/// Thousandths as a decimal: 1500 → "1.5".
fn milli_decimal(milli: i32) -> String {
    let text = format!("{}.{:03}", milli / 1000, (milli % 1000).abs());
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// A price in micro-units as people write it: `3.25`, `0.125`, `4.00`.
fn price_decimal(micros: i64) -> String {
    let text = crate::metering::micros_decimal(micros);
    let (whole, frac) = text.split_once('.').unwrap_or((&text, ""));
    let frac = frac.trim_end_matches('0');
    format!("{whole}.{frac:0<2}")
}

/// A non-negative decimal with at most `places` decimals, in units of 10^-places:
/// `decimal_units("3.5", 6) == Some(3_500_000)`.
pub(super) fn decimal_units(text: &str, places: u32) -> Option<i64> {
    let text = text.trim();
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() && frac.is_empty()
        || !whole.chars().all(|c| c.is_ascii_digit())
        || !frac.chars().all(|c| c.is_ascii_digit())
        || frac.len() > places as usize
    {
        return None;
    }
    let scale = 10i64.pow(places);
    let whole: i64 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
    let frac: i64 =
        if frac.is_empty() { 0 } else { format!("{frac:0<width$}", width = places as usize).parse().ok()? };
    whole.checked_mul(scale)?.checked_add(frac)
}

async fn platform_page(
    state: &AppState,
    user: &SessionUser,
    outcome: Outcome,
    team_form: NewTeamForm,
) -> Result<Response, PageError> {
    let now = Utc::now();
    let currency = state.config.currency.clone();
    let money = |micros: i64| format!("{} {currency}", price_decimal(micros));
    let teams = db::teams::list_all(&state.db, None, 1000)
        .await?
        .into_iter()
        .map(|t| TeamLine { name: t.name, parent: t.parent.unwrap_or_default(), display_name: t.display_name })
        .collect();
    let mut rates = Vec::new();
    for class in db::gpu_classes::list(&state.db, None, 1000).await? {
        let upcoming = db::gpu_classes::rates(&state.db, class.id)
            .await?
            .into_iter()
            .filter(|r| r.effective_from > now)
            .map(|r| format!("{} from {}", money(r.rate_micros_per_gpu_hour), when(r.effective_from)))
            .collect();
        rates.push(RateLine {
            now: class.rate_micros_per_gpu_hour.map_or_else(|| "no price yet".into(), &money),
            memory: format!("{} GiB", class.memory_mib / 1024),
            gpu_class: class.name,
            kind: class.kind,
            upcoming,
        });
    }
    let idle_policies = ops::idle_policies::list(state)
        .await?
        .into_iter()
        .map(|p| IdleLine {
            id: p.id.to_string(),
            scope: format!(
                "{}, {}",
                p.team.map_or_else(|| "every team".to_owned(), |t| format!("team {t}")),
                p.priority_class.map_or_else(|| "every class".to_owned(), |c| format!("{c} jobs"))
            ),
            rule: match p.action {
                IdleAction::Exempt => "exempt: never warned nor reclaimed".to_owned(),
                action => format!(
                    "SM activity below {}% for {} s: warn{}",
                    p.below_sm_active_percent,
                    p.idle_seconds,
                    match action {
                        IdleAction::Stop => format!(", then stop {} s later", p.notice_seconds),
                        IdleAction::Preempt => format!(", then preempt {} s later", p.notice_seconds),
                        _ => String::new(),
                    }
                ),
            },
        })
        .collect();
    let priority_rows = db::priority_classes::list(&state.db).await?;
    let class_names = priority_rows.iter().map(|p| p.name.clone()).collect();
    let priorities = priority_rows
        .into_iter()
        .map(|p| PriorityLine {
            name: p.name,
            priority: p.priority,
            preemptible: p.preemptible,
            usage_factor: milli_decimal(p.usage_factor_milli),
            price_multiplier: milli_decimal(p.price_multiplier_milli),
            preemption_delay: p.preemption_delay_seconds,
            description: p.description,
            version: p.version,
        })
        .collect();
    Ok(render(&PlatformPage {
        signed_in: Some(signed_in(user)),
        csrf: user.csrf_token.clone(),
        currency: state.config.currency.clone(),
        teams,
        rates,
        priorities,
        idle_policies,
        class_names,
        outcome,
        team_form,
    }))
}

/// The platform admins' page.
pub async fn admin(State(state): State<AppState>, CurrentUser(user): CurrentUser) -> Result<Response, PageError> {
    require_platform_admin(&user)?;
    platform_page(&state, &user, Outcome::default(), NewTeamForm::default()).await
}

/// The new-team form, as typed.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct NewTeamForm {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub parent: String,
    #[serde(default)]
    pub display_name: String,
}

/// Creates a team.
pub async fn create_team(
    State(state): State<AppState>,
    PortalForm { user, form }: PortalForm<NewTeamForm>,
) -> Result<Response, PageError> {
    require_platform_admin(&user)?;
    let request = ops::teams::NewTeam {
        name: form.name.trim().to_owned(),
        parent: Some(form.parent.trim().to_owned()).filter(|p| !p.is_empty()),
        display_name: Some(form.display_name.trim().to_owned()),
    };
    let (outcome, kept) = match ops::teams::create(&state, &principal(&user), &request).await {
        Ok(team) => (
            Outcome { section: "teams", ok: Some(format!("Team {} created.", team.name)), error: None },
            NewTeamForm::default(),
        ),
        Err(e) => (Outcome { section: "teams", ok: None, error: Some(form_error(e)?) }, form),
    };
    platform_page(&state, &user, outcome, kept).await
}

/// The new-rate form, as typed.
#[derive(Debug, Default, Deserialize)]
pub struct RateForm {
    #[serde(default)]
    pub gpu_class: String,
    #[serde(default)]
    pub price: String,
    /// `YYYY-MM-DDTHH:MM` in UTC, as a `datetime-local` input sends it; empty: now.
    #[serde(default)]
    pub effective_from: String,
}

/// Adds a price to a class's rate card, from now or from a later time.
pub async fn set_rate(
    State(state): State<AppState>,
    PortalForm { user, form }: PortalForm<RateForm>,
) -> Result<Response, PageError> {
    require_platform_admin(&user)?;
    let error = |message: &str| Outcome { section: "rates", ok: None, error: Some(message.to_owned()) };
    let outcome = match (decimal_units(&form.price, 6), effective_from(&form.effective_from)) {
        (None, _) => error("price: a price per GPU-hour such as 2.75"),
        (_, None) => error("effective_from: a date and time such as 2026-12-01T00:00 (UTC), or empty for now"),
        (Some(micros), Some(from)) => {
            let rate = ops::gpu_classes::Rate { effective_from: from, rate_micros_per_gpu_hour: micros };
            match ops::gpu_classes::add_rate(&state, &principal(&user), &form.gpu_class, &rate).await {
                Ok(_) => Outcome {
                    section: "rates",
                    ok: Some(format!(
                        "{}: {} {} per GPU-hour from {}.",
                        form.gpu_class,
                        price_decimal(micros),
                        state.config.currency,
                        when(from)
                    )),
                    error: None,
                },
                Err(e) => error(&form_error(e)?),
            }
        }
    };
    platform_page(&state, &user, outcome, NewTeamForm::default()).await
}

/// The form's start time: empty means now.
fn effective_from(text: &str) -> Option<chrono::DateTime<Utc>> {
    let text = text.trim();
    if text.is_empty() {
        return Some(Utc::now());
    }
    let naive = NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M")
        .or_else(|_| NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S"))
        .ok()?;
    Some(Utc.from_utc_datetime(&naive))
}

/// A priority class's form, as typed: a new one (no version) or a row's edit.
#[derive(Debug, Default, Deserialize)]
pub struct PriorityForm {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub priority: String,
    /// A checkbox: present when ticked.
    #[serde(default)]
    pub preemptible: Option<String>,
    #[serde(default)]
    pub usage_factor: String,
    #[serde(default)]
    pub price_multiplier: String,
    /// Seconds; empty means 0.
    #[serde(default)]
    pub preemption_delay: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub version: String,
}

/// Adds a priority class, or saves a row's changes (optimistically locked by its version).
pub async fn save_priority_class(
    State(state): State<AppState>,
    PortalForm { user, form }: PortalForm<PriorityForm>,
) -> Result<Response, PageError> {
    require_platform_admin(&user)?;
    let error = |message: String| Outcome { section: "priorities", ok: None, error: Some(message) };
    let spec = (|| -> Result<ops::priority_classes::PriorityClassSpec, String> {
        Ok(ops::priority_classes::PriorityClassSpec {
            priority: form.priority.trim().parse().map_err(|_| "priority: a whole number".to_owned())?,
            preemptible: form.preemptible.is_some(),
            usage_factor_milli: decimal_units(&form.usage_factor, 3)
                .ok_or("usage_factor: a factor such as 1 or 0.5")?,
            price_multiplier_milli: decimal_units(&form.price_multiplier, 3)
                .ok_or("price_multiplier: a multiplier such as 1 or 0.6")?,
            preemption_delay_seconds: match form.preemption_delay.trim() {
                "" => 0,
                seconds => {
                    seconds.parse().map_err(|_| "preemption_delay: whole seconds, such as 0 or 120".to_owned())?
                }
            },
            description: Some(form.description.trim().to_owned()),
        })
    })();
    let spec = match spec {
        Ok(spec) => spec,
        Err(message) => return platform_page(&state, &user, error(message), NewTeamForm::default()).await,
    };
    let principal = principal(&user);
    let result = match form.version.trim() {
        "" => {
            let new = ops::priority_classes::NewPriorityClass { name: form.name.trim().to_owned(), spec };
            ops::priority_classes::create(&state, &principal, &new).await
        }
        version => {
            let if_match = Precondition::version(version.parse().unwrap_or(-1));
            ops::priority_classes::put(&state, &principal, &form.name, &spec, &if_match).await
        }
    };
    let outcome = match result {
        Ok(row) => {
            Outcome { section: "priorities", ok: Some(format!("Priority class {} saved.", row.name)), error: None }
        }
        Err(e) => error(form_error(e)?),
    };
    platform_page(&state, &user, outcome, NewTeamForm::default()).await
}

/// The idle policy form, as typed: a new or replaced policy, or (with `delete`) a removal.
#[derive(Debug, Default, Deserialize)]
pub struct IdlePolicyForm {
    #[serde(default)]
    pub team: String,
    #[serde(default)]
    pub priority_class: String,
    #[serde(default)]
    pub below_sm_active_percent: String,
    #[serde(default)]
    pub idle_minutes: String,
    #[serde(default)]
    pub notice_minutes: String,
    #[serde(default)]
    pub action: String,
    /// The id of a policy to remove.
    #[serde(default)]
    pub delete: String,
}

/// Sets an idle policy for its scope, or removes one.
pub async fn save_idle_policy(
    State(state): State<AppState>,
    PortalForm { user, form }: PortalForm<IdlePolicyForm>,
) -> Result<Response, PageError> {
    require_platform_admin(&user)?;
    let error = |message: String| Outcome { section: "idle", ok: None, error: Some(message) };
    let principal = principal(&user);
    if !form.delete.trim().is_empty() {
        let outcome = match form.delete.trim().parse::<crate::domain::IdlePolicyId>() {
            Err(_) => error("no such idle policy".into()),
            Ok(id) => match ops::idle_policies::delete(&state, &principal, id).await {
                Ok(()) => Outcome { section: "idle", ok: Some("Idle policy removed.".into()), error: None },
                Err(e) => error(form_error(e)?),
            },
        };
        return platform_page(&state, &user, outcome, NewTeamForm::default()).await;
    }
    let minutes = |field: &str, text: &str| -> Result<i64, String> {
        text.trim().parse::<i64>().ok().filter(|m| *m >= 0).map(|m| m * 60).ok_or(format!("{field}: whole minutes"))
    };
    let spec = (|| -> Result<ops::idle_policies::IdlePolicySpec, String> {
        Ok(ops::idle_policies::IdlePolicySpec {
            team: Some(form.team.trim().to_owned()).filter(|t| !t.is_empty()),
            priority_class: Some(form.priority_class.trim().to_owned()).filter(|c| !c.is_empty()),
            below_sm_active_percent: form
                .below_sm_active_percent
                .trim()
                .parse()
                .map_err(|_| "below_sm_active_percent: a percentage such as 5".to_owned())?,
            idle_seconds: minutes("idle_minutes", &form.idle_minutes)?,
            notice_seconds: minutes("notice_minutes", &form.notice_minutes)?,
            action: IdleAction::parse(form.action.trim())
                .ok_or("action: notify, stop, preempt or exempt".to_owned())?,
        })
    })();
    let outcome = match spec {
        Err(message) => error(message),
        Ok(spec) => match ops::idle_policies::set(&state, &principal, &spec).await {
            Ok(_) => Outcome { section: "idle", ok: Some("Idle policy saved.".into()), error: None },
            Err(e) => error(form_error(e)?),
        },
    };
    platform_page(&state, &user, outcome, NewTeamForm::default()).await
}

#[cfg(test)]
mod tests {
    use super::{decimal_units, milli_decimal, price_decimal};

    #[test]
    fn prices_and_factors_are_read_as_exact_decimals() {
        assert_eq!(decimal_units("2.75", 6), Some(2_750_000));
        assert_eq!(decimal_units("3", 6), Some(3_000_000));
        assert_eq!(decimal_units(".5", 3), Some(500));
        assert_eq!(decimal_units("0.0000001", 6), None);
        assert_eq!(decimal_units("-1", 6), None);
        assert_eq!(decimal_units("1e3", 6), None);
        assert_eq!(decimal_units("", 6), None);
        assert_eq!(decimal_units(".", 6), None);
        assert_eq!(milli_decimal(1500), "1.5");
        assert_eq!(milli_decimal(1000), "1");
        assert_eq!(milli_decimal(250), "0.25");
        assert_eq!(price_decimal(3_250_000), "3.25");
        assert_eq!(price_decimal(4_000_000), "4.00");
        assert_eq!(price_decimal(125_000), "0.125");
    }
}
