//! The portal's pages: one askama struct per page, handlers that authorize, read through
//! `db`, and render. User text is escaped by the templates.

use std::collections::BTreeMap;

use askama::Template;
use axum::{
    body::Bytes,
    extract::{Path, State},
    http::{header, HeaderMap, StatusCode},
    response::{Html, IntoResponse, Redirect, Response},
};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Deserialize;
use uuid::Uuid;

use super::session::{self, form_allowed, random_token, secret_hash, set_cookie};
use crate::{
    api::{self, error::ApiError},
    app::AppState,
    auth::{password, policy::team_role, Principal},
    db::{self, jobs::JobFilter, web_sessions::SessionUser},
    domain::{PlatformRole, TeamRole},
};

/// Who is signed in, as the page header shows it.
pub struct SignedIn {
    pub username: String,
    pub csrf: String,
}

/// A page that failed: a friendly message, never internal detail (that is logged).
pub struct PageError {
    status: StatusCode,
    title: &'static str,
    message: String,
}

impl PageError {
    fn not_found() -> Self {
        Self { status: StatusCode::NOT_FOUND, title: "Not found", message: "There is nothing here for you.".into() }
    }

    fn forbidden() -> Self {
        Self {
            status: StatusCode::FORBIDDEN,
            title: "Not allowed",
            message: "This form was not sent from a page of this site, or your session changed. Reload the page and \
                      try again."
                .into(),
        }
    }
}

impl From<sqlx::Error> for PageError {
    fn from(e: sqlx::Error) -> Self {
        ApiError::from(e).into()
    }
}

impl From<ApiError> for PageError {
    fn from(e: ApiError) -> Self {
        match e {
            ApiError::NotFound(_) => Self::not_found(),
            ApiError::Conflict { detail, .. } => {
                Self { status: StatusCode::CONFLICT, title: "That did not work", message: detail }
            }
            ApiError::Forbidden => Self {
                status: StatusCode::FORBIDDEN,
                title: "Not allowed",
                message: "Your role in this team does not allow that.".into(),
            },
            other => {
                tracing::error!(error = %other, "portal page failed");
                Self {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    title: "Something went wrong",
                    message: "The page could not be shown. Try again in a moment.".into(),
                }
            }
        }
    }
}

#[derive(Template)]
#[template(path = "error.html")]
struct ErrorPage {
    signed_in: Option<SignedIn>,
    title: &'static str,
    message: String,
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let page = ErrorPage { signed_in: None, title: self.title, message: self.message };
        (self.status, render(&page)).into_response()
    }
}

/// Renders a page; a template that cannot render is a bug, answered with a plain 500.
fn render(page: &impl Template) -> Response {
    match page.render() {
        Ok(html) => Html(html).into_response(),
        Err(e) => {
            tracing::error!(error = %e, "template failed");
            (StatusCode::INTERNAL_SERVER_ERROR, "The page could not be shown.").into_response()
        }
    }
}

fn principal(user: &SessionUser) -> Principal {
    Principal::User {
        id: user.user_id,
        username: user.username.clone(),
        platform_role: user.platform_role.as_deref().and_then(PlatformRole::parse),
    }
}

fn signed_in(user: &SessionUser) -> SignedIn {
    SignedIn { username: user.username.clone(), csrf: user.csrf_token.clone() }
}

fn when(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true).replace('T', " ")
}

/// The signed-in user, or a redirect to the sign-in page.
async fn require_user(state: &AppState, headers: &HeaderMap) -> Result<SessionUser, Response> {
    match session::user(state, headers).await {
        Ok(Some(user)) => Ok(user),
        Ok(None) => Err(Redirect::to("/login").into_response()),
        Err(e) => Err(PageError::from(e).into_response()),
    }
}

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    signed_in: Option<SignedIn>,
    error: Option<String>,
    username: String,
}

/// The sign-in form.
pub async fn login_form() -> Response {
    render(&LoginPage { signed_in: None, error: None, username: String::new() })
}

#[derive(Deserialize)]
struct LoginForm {
    username: String,
    password: String,
}

/// Signs in with a username and password and starts a session.
pub async fn login(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, PageError> {
    let Ok(form) = serde_urlencoded::from_bytes::<LoginForm>(&body) else {
        return Ok((StatusCode::BAD_REQUEST, login_page(None, "Enter a username and a password.")).into_response());
    };
    // A sign-in posted from another site is refused: it could sign a victim into an attacker's
    // account.
    if !session::same_origin(&headers) {
        return Err(PageError::forbidden());
    }
    let user = db::users::by_username(&state.db, &form.username).await?;
    let password = form.password.clone();
    let valid = match &user {
        Some(u) if !u.disabled => {
            let stored = u.password_hash.clone();
            api::off_thread(move || password::verify(&password, &stored)).await?
        }
        _ => {
            api::off_thread(move || password::verify_dummy(&password)).await?;
            false
        }
    };
    let Some(user) = user.filter(|_| valid) else {
        let page = login_page(Some(&form.username), "That username and password do not match.");
        return Ok((StatusCode::UNAUTHORIZED, page).into_response());
    };
    let secret = random_token();
    let expires = Utc::now() + chrono::Duration::hours(session::SESSION_HOURS);
    db::web_sessions::create(&state.db, &secret_hash(&secret), user.id, &random_token(), expires).await?;
    let mut response = Redirect::to("/").into_response();
    response.headers_mut().insert(header::SET_COOKIE, set_cookie(Some(&secret), session::is_secure(&headers)));
    Ok(response)
}

fn login_page(username: Option<&str>, error: &str) -> Response {
    render(&LoginPage { signed_in: None, error: Some(error.into()), username: username.unwrap_or_default().into() })
}

#[derive(Deserialize)]
struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

fn csrf_of(body: &Bytes) -> String {
    serde_urlencoded::from_bytes::<CsrfForm>(body).map(|f| f.csrf).unwrap_or_default()
}

/// Ends the session.
pub async fn logout(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, PageError> {
    let user = match require_user(&state, &headers).await {
        Ok(u) => u,
        Err(redirect) => return Ok(redirect),
    };
    if !form_allowed(&headers, &user.csrf_token, &csrf_of(&body)) {
        return Err(PageError::forbidden());
    }
    if let Some(secret) = session::secret_of(&headers) {
        db::web_sessions::delete(&state.db, &secret_hash(&secret)).await?;
    }
    let mut response = Redirect::to("/login").into_response();
    response.headers_mut().insert(header::SET_COOKIE, set_cookie(None, session::is_secure(&headers)));
    Ok(response)
}

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
}

/// The teams the user can see.
pub async fn home(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, PageError> {
    let user = match require_user(&state, &headers).await {
        Ok(u) => u,
        Err(redirect) => return Ok(redirect),
    };
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
    Ok(render(&HomePage { signed_in: Some(signed_in(&user)), teams, finance }))
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
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let user = match require_user(&state, &headers).await {
        Ok(u) => u,
        Err(redirect) => return Ok(redirect),
    };
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

/// One row of the job list.
pub struct JobListLine {
    pub id: Uuid,
    pub name: String,
    pub state: String,
    pub gpus: i64,
    pub gpu_class: String,
    pub submitted: String,
    pub submitted_by: String,
    pub exit_code: String,
}

#[derive(Template)]
#[template(path = "jobs.html")]
struct JobsPage {
    signed_in: Option<SignedIn>,
    team: String,
    states: Vec<&'static str>,
    classes: Vec<String>,
    state: String,
    gpu_class: String,
    notice: Option<String>,
    jobs: Vec<JobListLine>,
    newest_link: Option<String>,
    older_link: Option<String>,
}

/// The job list's filters and page, from the query string.
#[derive(Debug, Default, Deserialize)]
pub struct JobsQuery {
    #[serde(default)]
    state: String,
    #[serde(default)]
    gpu_class: String,
    /// Jobs submitted before this one (its sequence number): the next page.
    before: Option<i64>,
}

/// Jobs per page of the list.
const JOBS_PER_PAGE: i64 = 50;

/// A team's jobs, newest first, filtered by state and GPU class, fifty to a page.
pub async fn team_jobs(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Result<Response, PageError> {
    let user = match require_user(&state, &headers).await {
        Ok(u) => u,
        Err(redirect) => return Ok(redirect),
    };
    let team = db::teams::by_name(&state.db, &name).await?.ok_or_else(PageError::not_found)?;
    team_role(&state, &principal(&user), &team).await?.ok_or_else(PageError::not_found)?;
    let mut notice = None;
    let mut q: JobsQuery = match serde_urlencoded::from_str(query.as_deref().unwrap_or_default()) {
        Ok(q) => q,
        Err(_) => {
            notice = Some("The filters in the address were not understood; showing every job.".to_owned());
            JobsQuery::default()
        }
    };
    if !q.state.is_empty() && crate::domain::JobState::parse(&q.state).is_none() {
        notice = Some(format!("There is no state \"{}\"; showing every state.", q.state));
        q.state.clear();
    }
    let classes: Vec<String> = db::quotas::list(&state.db, team.id).await?.into_iter().map(|q| q.gpu_class).collect();
    let filter = JobFilter {
        state: (!q.state.is_empty()).then(|| q.state.clone()),
        gpu_class: (!q.gpu_class.is_empty()).then(|| q.gpu_class.clone()),
        labels: None,
        before_seq: q.before,
    };
    let mut rows = db::jobs::list(&state.db, team.id, &filter, JOBS_PER_PAGE + 1).await?;
    let more = rows.len() as i64 > JOBS_PER_PAGE;
    rows.truncate(JOBS_PER_PAGE as usize);
    let link = |before: Option<i64>| {
        let mut params = form_urlencoded::Serializer::new(String::new());
        if !q.state.is_empty() {
            params.append_pair("state", &q.state);
        }
        if !q.gpu_class.is_empty() {
            params.append_pair("gpu_class", &q.gpu_class);
        }
        if let Some(b) = before {
            params.append_pair("before", &b.to_string());
        }
        let query = params.finish();
        if query.is_empty() {
            format!("/teams/{}/jobs", team.name)
        } else {
            format!("/teams/{}/jobs?{query}", team.name)
        }
    };
    let older_link = rows.last().filter(|_| more).map(|last| link(Some(last.seq)));
    let newest_link = q.before.map(|_| link(None));
    let jobs = rows
        .into_iter()
        .map(|j| JobListLine {
            id: j.id,
            gpus: i64::from(j.replicas) * i64::from(j.gpus_per_replica),
            name: j.name,
            state: j.state,
            gpu_class: j.gpu_class,
            submitted: when(j.submitted_at),
            submitted_by: j.submitted_by,
            exit_code: j.exit_code.map(|c| c.to_string()).unwrap_or_default(),
        })
        .collect();
    let page = JobsPage {
        signed_in: Some(signed_in(&user)),
        team: team.name.clone(),
        states: crate::domain::JobState::ALL.iter().map(|s| s.as_str()).collect(),
        classes,
        state: q.state,
        gpu_class: q.gpu_class,
        notice,
        jobs,
        newest_link,
        older_link,
    };
    Ok(render(&page))
}

/// A token as the tokens page lists it.
pub struct TokenLine {
    pub id: Uuid,
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

/// The team, when the user administers it (team admins and platform admins).
async fn administered_team(state: &AppState, user: &SessionUser, name: &str) -> Result<db::teams::TeamRow, PageError> {
    let team = db::teams::by_name(&state.db, name).await?.ok_or_else(PageError::not_found)?;
    let role = team_role(state, &principal(user), &team).await?.ok_or_else(PageError::not_found)?;
    if role < TeamRole::Admin {
        return Err(PageError::not_found());
    }
    Ok(team)
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
            last_used: t.last_used_at.map(when).unwrap_or_else(|| "never".into()),
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
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let user = match require_user(&state, &headers).await {
        Ok(u) => u,
        Err(redirect) => return Ok(redirect),
    };
    let team = administered_team(&state, &user, &name).await?;
    tokens_page(&state, &user, &team, None, None, String::new()).await
}

#[derive(Deserialize)]
struct NewTokenForm {
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
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, PageError> {
    let user = match require_user(&state, &headers).await {
        Ok(u) => u,
        Err(redirect) => return Ok(redirect),
    };
    if !form_allowed(&headers, &user.csrf_token, &csrf_of(&body)) {
        return Err(PageError::forbidden());
    }
    let team = administered_team(&state, &user, &name).await?;
    let form: NewTokenForm = serde_urlencoded::from_bytes(&body).map_err(|_| PageError::forbidden())?;
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
        api::tokens::NewToken { name: form.name.clone(), role, expires_at: Utc::now() + chrono::Duration::days(days) };
    match api::tokens::mint(&state, &principal(&user), &team, &request).await {
        Ok(minted) => {
            let line = MintedLine { name: minted.token.name, secret: minted.secret };
            tokens_page(&state, &user, &team, Some(line), None, String::new()).await
        }
        Err(ApiError::Validation(errors)) => {
            let error = errors.iter().map(|e| format!("{}: {}", e.field, e.message)).collect::<Vec<_>>().join("; ");
            tokens_page(&state, &user, &team, None, Some(error), form.name).await
        }
        Err(e) => Err(e.into()),
    }
}

/// Revokes a token from its row's button.
pub async fn revoke_token(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((name, token)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, PageError> {
    let user = match require_user(&state, &headers).await {
        Ok(u) => u,
        Err(redirect) => return Ok(redirect),
    };
    if !form_allowed(&headers, &user.csrf_token, &csrf_of(&body)) {
        return Err(PageError::forbidden());
    }
    let team = administered_team(&state, &user, &name).await?;
    let token: Uuid = token.parse().map_err(|_| PageError::not_found())?;
    api::tokens::revoke(&state, &principal(&user), &team, token).await?;
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
    headers: HeaderMap,
    Path(name): Path<String>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Result<Response, PageError> {
    let user = match require_user(&state, &headers).await {
        Ok(u) => u,
        Err(redirect) => return Ok(redirect),
    };
    let team = administered_team(&state, &user, &name).await?;
    audit_page(&state, &user, Some(&team), query).await
}

/// The whole platform's audit log, for platform admins.
pub async fn audit(
    State(state): State<AppState>,
    headers: HeaderMap,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Result<Response, PageError> {
    let user = match require_user(&state, &headers).await {
        Ok(u) => u,
        Err(redirect) => return Ok(redirect),
    };
    if principal(&user).platform_role() != Some(PlatformRole::PlatformAdmin) {
        return Err(PageError::not_found());
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
}

/// The team, when the user is a platform admin (quotas are theirs to set).
async fn quota_team(state: &AppState, user: &SessionUser, name: &str) -> Result<db::teams::TeamRow, PageError> {
    if principal(user).platform_role() != Some(PlatformRole::PlatformAdmin) {
        return Err(PageError::not_found());
    }
    db::teams::by_name(&state.db, name).await?.ok_or_else(PageError::not_found)
}

async fn quotas_page(
    state: &AppState,
    user: &SessionUser,
    team: &db::teams::TeamRow,
    warnings: Vec<String>,
    error: Option<String>,
) -> Result<Response, PageError> {
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
    }))
}

/// A team's quotas, for platform admins to set.
pub async fn team_quotas(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let user = match require_user(&state, &headers).await {
        Ok(u) => u,
        Err(redirect) => return Ok(redirect),
    };
    let team = quota_team(&state, &user, &name).await?;
    quotas_page(&state, &user, &team, Vec::new(), None).await
}

#[derive(Deserialize)]
struct QuotaForm {
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
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, PageError> {
    let user = match require_user(&state, &headers).await {
        Ok(u) => u,
        Err(redirect) => return Ok(redirect),
    };
    if !form_allowed(&headers, &user.csrf_token, &csrf_of(&body)) {
        return Err(PageError::forbidden());
    }
    let team = quota_team(&state, &user, &name).await?;
    let form: QuotaForm = serde_urlencoded::from_bytes(&body).map_err(|_| PageError::forbidden())?;
    let number = |field: &str, text: &str| -> Result<i64, String> {
        text.trim().parse::<i64>().map_err(|_| format!("{field}: a whole number of GPUs"))
    };
    let parsed = (|| -> Result<(api::quotas::QuotaSpec, i64), String> {
        let lendable = match form.lendable.trim() {
            "" => None,
            text => Some(number("lendable", text)?),
        };
        let spec = api::quotas::QuotaSpec {
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
    let if_match = api::extract::IfMatch::version(version);
    match api::quotas::set(&state, &principal(&user), team.clone(), &form.gpu_class, &spec, &if_match).await {
        Ok(result) => quotas_page(&state, &user, &team, result.warnings, None).await,
        Err(ApiError::Validation(errors)) => {
            let error = errors.iter().map(|e| format!("{}: {}", e.field, e.message)).collect::<Vec<_>>().join("; ");
            quotas_page(&state, &user, &team, Vec::new(), Some(error)).await
        }
        Err(ApiError::PreconditionFailed) => {
            let error = "Someone changed this quota since the page was shown; here it is as it is now.".to_owned();
            quotas_page(&state, &user, &team, Vec::new(), Some(error)).await
        }
        Err(e) => Err(e.into()),
    }
}

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
    pub id: Uuid,
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
    headers: HeaderMap,
    Path((name, period)): Path<(String, String)>,
) -> Result<Response, PageError> {
    let user = match require_user(&state, &headers).await {
        Ok(u) => u,
        Err(redirect) => return Ok(redirect),
    };
    let team = db::teams::by_name(&state.db, &name).await?.ok_or_else(PageError::not_found)?;
    team_role(&state, &principal(&user), &team).await?.ok_or_else(PageError::not_found)?;
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

/// A job as its page shows it.
pub struct JobDetail {
    pub id: Uuid,
    pub name: String,
    pub team: String,
    pub state: String,
    pub gpus: i64,
    pub gpu_class: String,
    pub priority_class: String,
    pub submitted: String,
    pub submitted_by: String,
    pub waiting: Option<String>,
    pub placement: Option<String>,
}

/// One entry of the timeline.
pub struct EventLine {
    pub at: String,
    pub kind: String,
    pub reason: Option<String>,
    pub message: String,
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    signed_in: Option<SignedIn>,
    csrf: String,
    job: JobDetail,
    events: Vec<EventLine>,
    can_cancel: bool,
}

/// The job and the user's role in its team; not found when the user may not see it.
async fn job_for(state: &AppState, user: &SessionUser, id: &str) -> Result<(db::jobs::JobRow, TeamRole), PageError> {
    let id: Uuid = id.parse().map_err(|_| PageError::not_found())?;
    let job = db::jobs::get(&state.db, id).await?.ok_or_else(PageError::not_found)?;
    let team = db::teams::by_id(&state.db, job.team_id).await?.ok_or_else(PageError::not_found)?;
    let role = team_role(state, &principal(user), &team).await?.ok_or_else(PageError::not_found)?;
    Ok((job, role))
}

/// A job: its state, why it waits, where it runs, its timeline; cancel for members.
pub async fn job(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let user = match require_user(&state, &headers).await {
        Ok(u) => u,
        Err(redirect) => return Ok(redirect),
    };
    let (job, role) = job_for(&state, &user, &id).await?;
    let events = db::jobs::events(&state.db, job.id, 0, 500)
        .await?
        .into_iter()
        .map(|e| EventLine { at: when(e.at), kind: e.kind, reason: e.reason, message: e.message })
        .collect();
    let finished = matches!(job.state.as_str(), "succeeded" | "failed" | "cancelled");
    // "node (GPUs 0,1,2)" per replica, from the stored placement.
    let placement = job.placement.as_ref().and_then(|p| p.0.as_array().cloned()).map(|slots| {
        slots
            .iter()
            .map(|slot| {
                let gpus: Vec<String> = slot["gpus"].as_array().into_iter().flatten().map(|g| g.to_string()).collect();
                format!("{} (GPUs {})", slot["node"].as_str().unwrap_or("?"), gpus.join(","))
            })
            .collect::<Vec<_>>()
            .join(", ")
    });
    let detail = JobDetail {
        id: job.id,
        gpus: i64::from(job.replicas) * i64::from(job.gpus_per_replica),
        waiting: (job.state == "pending").then(|| job.pending_message.clone()).flatten(),
        // Where it runs now; a requeued job's last placement is history, in the timeline.
        placement: job
            .cluster
            .as_ref()
            .filter(|_| job.holds_gpus)
            .map(|c| format!("{c}: {}", placement.unwrap_or_default())),
        submitted: when(job.submitted_at),
        name: job.name,
        team: job.team,
        state: job.state,
        gpu_class: job.gpu_class,
        priority_class: job.priority_class,
        submitted_by: job.submitted_by,
    };
    let page = JobPage {
        csrf: user.csrf_token.clone(),
        signed_in: Some(signed_in(&user)),
        job: detail,
        events,
        can_cancel: role >= TeamRole::Member && !finished,
    };
    Ok(render(&page))
}

/// Cancels a job from its page.
pub async fn cancel(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, PageError> {
    let user = match require_user(&state, &headers).await {
        Ok(u) => u,
        Err(redirect) => return Ok(redirect),
    };
    if !form_allowed(&headers, &user.csrf_token, &csrf_of(&body)) {
        return Err(PageError::forbidden());
    }
    let (job, role) = job_for(&state, &user, &id).await?;
    if role < TeamRole::Member {
        return Err(ApiError::Forbidden.into());
    }
    api::jobs::cancel(&state, &principal(&user).actor(), job.id).await?;
    Ok(Redirect::to(&format!("/jobs/{}", job.id)).into_response())
}

/// The submit form's fields, as typed.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SubmitForm {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub gpu_class: String,
    #[serde(default)]
    pub replicas: String,
    #[serde(default)]
    pub gpus_per_replica: String,
    #[serde(default)]
    pub priority_class: String,
    #[serde(default)]
    pub max_runtime_seconds: String,
    #[serde(default)]
    pub image: String,
    #[serde(default)]
    pub command: String,
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    action: String,
}

/// What submitting now would do, in words.
pub struct PreviewView {
    pub fits_now: bool,
    pub cluster: Option<String>,
    pub reason: String,
    pub position: Option<u32>,
    pub expected_start: String,
    pub max_cost: String,
    pub would_preempt: Vec<String>,
}

#[derive(Template)]
#[template(path = "submit.html")]
struct SubmitPage {
    signed_in: Option<SignedIn>,
    csrf: String,
    team: String,
    classes: Vec<String>,
    priorities: Vec<String>,
    form: SubmitForm,
    errors: Vec<(String, String)>,
    preview: Option<PreviewView>,
}

/// The team of a submit page, checked: members and above only.
async fn submit_team(state: &AppState, user: &SessionUser, name: &str) -> Result<db::teams::TeamRow, PageError> {
    let team = db::teams::by_name(&state.db, name).await?.ok_or_else(PageError::not_found)?;
    let role = team_role(state, &principal(user), &team).await?.ok_or_else(PageError::not_found)?;
    if role < TeamRole::Member {
        return Err(ApiError::Forbidden.into());
    }
    Ok(team)
}

async fn submit_page(
    state: &AppState,
    user: &SessionUser,
    team: &str,
    form: SubmitForm,
    errors: Vec<(String, String)>,
    preview: Option<PreviewView>,
) -> Result<SubmitPage, PageError> {
    let classes = db::gpu_classes::list(&state.db, None, 500).await?.into_iter().map(|c| c.name).collect();
    let priorities = db::priority_classes::list(&state.db).await?.into_iter().map(|p| p.name).collect();
    Ok(SubmitPage {
        signed_in: Some(signed_in(user)),
        csrf: user.csrf_token.clone(),
        team: team.to_owned(),
        classes,
        priorities,
        form,
        errors,
        preview,
    })
}

/// The submit form.
pub async fn submit_form(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let user = match require_user(&state, &headers).await {
        Ok(u) => u,
        Err(redirect) => return Ok(redirect),
    };
    let team = submit_team(&state, &user, &name).await?;
    let form = SubmitForm {
        replicas: "1".into(),
        gpus_per_replica: "1".into(),
        priority_class: "experiment".into(),
        max_runtime_seconds: "3600".into(),
        ..SubmitForm::default()
    };
    Ok(render(&submit_page(&state, &user, &team.name, form, Vec::new(), None).await?))
}

/// The form as the API's job spec; the fields that are not numbers, named.
fn spec_of(form: &SubmitForm) -> Result<api::jobs::JobSpec, Vec<(String, String)>> {
    let mut errors = Vec::new();
    let mut number = |field: &str, value: &str| match value.trim().parse::<i64>() {
        Ok(n) => Some(n),
        Err(_) => {
            errors.push((field.to_owned(), "must be a whole number".to_owned()));
            None
        }
    };
    let replicas = number("replicas", &form.replicas);
    let gpus = number("gpus_per_replica", &form.gpus_per_replica);
    let runtime = number("max_runtime_seconds", &form.max_runtime_seconds);
    let (Some(replicas), Some(gpus_per_replica), Some(runtime)) = (replicas, gpus, runtime) else {
        return Err(errors);
    };
    let spec = serde_json::json!({
        "name": form.name,
        "gpu_class": form.gpu_class,
        "replicas": replicas,
        "gpus_per_replica": gpus_per_replica,
        "priority_class": form.priority_class,
        "max_runtime_seconds": runtime,
        "image": form.image,
        "command": form.command.split_whitespace().collect::<Vec<_>>(),
    });
    serde_json::from_value(spec).map_err(|e| vec![("job".to_owned(), e.to_string())])
}

fn field_errors(e: ApiError) -> Result<Vec<(String, String)>, PageError> {
    match e {
        ApiError::Validation(errors) => Ok(errors.into_iter().map(|e| (e.field, e.message)).collect()),
        other => Err(other.into()),
    }
}

/// Previews the job through the engine, or submits it.
pub async fn submit(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Result<Response, PageError> {
    let user = match require_user(&state, &headers).await {
        Ok(u) => u,
        Err(redirect) => return Ok(redirect),
    };
    let form: SubmitForm = serde_urlencoded::from_bytes(&body).unwrap_or_default();
    if !form_allowed(&headers, &user.csrf_token, &form.csrf) {
        return Err(PageError::forbidden());
    }
    let team = submit_team(&state, &user, &name).await?;
    let spec = match spec_of(&form) {
        Ok(spec) => spec,
        Err(errors) => {
            let page = submit_page(&state, &user, &team.name, form, errors, None).await?;
            return Ok((StatusCode::UNPROCESSABLE_ENTITY, render(&page)).into_response());
        }
    };
    let version = crate::auth::CatalogueVersion(None);
    if form.action == "preview" {
        let (errors, preview) = match api::jobs::dry_run(&state, team.id, &spec, version).await {
            Ok(answer) => (Vec::new(), Some(preview_of(answer))),
            Err(e) => (field_errors(e)?, None),
        };
        return Ok(render(&submit_page(&state, &user, &team.name, form, errors, preview).await?));
    }
    match api::jobs::submit(&state, &team, &principal(&user).actor(), spec, version).await {
        Ok(job) => Ok(Redirect::to(&format!("/jobs/{}", job.id)).into_response()),
        Err(e) => {
            let errors = field_errors(e)?;
            let page = submit_page(&state, &user, &team.name, form, errors, None).await?;
            Ok((StatusCode::UNPROCESSABLE_ENTITY, render(&page)).into_response())
        }
    }
}

fn preview_of(answer: api::jobs::DryRunResult) -> PreviewView {
    PreviewView {
        fits_now: answer.fits_now,
        cluster: answer.cluster,
        reason: answer.message.unwrap_or_default(),
        position: answer.position,
        expected_start: answer.expected_start_at.map(when).unwrap_or_else(|| "not foreseeable".into()),
        max_cost: format!("{} {}", crate::metering::micros_decimal(answer.max_cost_micros), answer.currency),
        would_preempt: answer
            .would_preempt
            .into_iter()
            .map(|v| format!("{} GPUs of team {} ({})", v.gpus, v.team, v.reason))
            .collect(),
    }
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
}

#[derive(Template)]
#[template(path = "billing.html")]
struct BillingPage {
    signed_in: Option<SignedIn>,
    periods: Vec<PeriodLine>,
    /// The charted days, in words.
    window: String,
    by_team: super::charts::StackedBars,
    by_class: super::charts::StackedBars,
    costs: Vec<CostLine>,
}

/// The user, when finance or a platform admin; others get "not found".
async fn require_finance(state: &AppState, headers: &HeaderMap) -> Result<SessionUser, Response> {
    let user = require_user(state, headers).await?;
    match principal(&user).platform_role() {
        Some(_) => Ok(user),
        None => Err(PageError::not_found().into_response()),
    }
}

/// Finance's page: every billing period with its totals and its exports.
pub async fn billing(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, PageError> {
    let user = match require_finance(&state, &headers).await {
        Ok(u) => u,
        Err(response) => return Ok(response),
    };
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
    let top = cost.values().map(|c| c.1).max().unwrap_or(0).max(1);
    let costs = cost
        .into_iter()
        .map(|(team, (gpu_hours, micros))| CostLine {
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
        by_team: super::charts::stacked(&by_team, hours),
        by_class: super::charts::stacked(&by_class, hours),
        costs,
    }))
}

/// Days the billing page charts: the last 30, today included.
fn usage_window() -> (chrono::NaiveDate, chrono::NaiveDate) {
    let today = Utc::now().date_naive();
    (today - chrono::Days::new(29), today + chrono::Days::new(1))
}

/// What the billing page's charts show, as CSV: one row per day, team and GPU class.
pub async fn billing_usage_csv(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, PageError> {
    if let Err(response) = require_finance(&state, &headers).await {
        return Ok(response);
    }
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
    headers: HeaderMap,
    Path((period, format)): Path<(String, String)>,
) -> Result<Response, PageError> {
    if let Err(response) = require_finance(&state, &headers).await {
        return Ok(response);
    }
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

#[derive(Template)]
#[template(path = "cluster.html")]
struct ClusterPage {
    signed_in: Option<SignedIn>,
    clusters: Vec<super::cluster::ClusterView>,
    classes: Vec<super::cluster::ClassFree>,
}

/// Every cluster's nodes and GPUs, coloured by whose jobs hold them.
pub async fn clusters(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, PageError> {
    let user = match require_user(&state, &headers).await {
        Ok(u) => u,
        Err(redirect) => return Ok(redirect),
    };
    let sees_all = principal(&user).platform_role().is_some();
    let teams = db::teams::list_visible_to_user(&state.db, user.user_id, None, 10_000).await?;
    let viewer = super::cluster::Viewer { teams: teams.into_iter().map(|t| t.id).collect(), sees_all };
    let nodes = db::clusters::layout(&state.db).await?;
    let held = db::clusters::held_placements(&state.db).await?;
    let (clusters, classes) = super::cluster::layout(&nodes, &held, &viewer);
    Ok(render(&ClusterPage { signed_in: Some(signed_in(&user)), clusters, classes }))
}

/// The portal's "not found" page, for paths that are no page.
pub fn not_found_page() -> Response {
    PageError::not_found().into_response()
}

/// The portal's stylesheet, from the binary.
pub async fn stylesheet() -> Response {
    const CSS: &str = include_str!("../../../web/static/portal.css");
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8"), (header::CACHE_CONTROL, "max-age=3600")], CSS).into_response()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::audit_changes;

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
