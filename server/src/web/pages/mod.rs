//! The portal's pages: one askama struct per page, handlers that authorize, read through
//! `db`, and render. User text is escaped by the templates.
//!
//! Every page handler takes a [`CurrentUser`] (no session: the browser is sent to sign in)
//! and every form handler a [`PortalForm`], which also checks the form's CSRF token and
//! origin, so no handler can forget either.

mod arrays;
mod auth;
mod billing;
mod clusters;
mod jobs;
mod members;
mod platform_admin;
mod services;
mod submit;
mod team;
mod team_admin;
mod users;
mod webhooks;

use askama::Template;
use axum::{
    body::Bytes,
    extract::{FromRequest, FromRequestParts, Request},
    http::{header, request::Parts, StatusCode},
    response::{Html, IntoResponse, Redirect, Response},
};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::{de::DeserializeOwned, Deserialize};
use std::collections::HashMap;

pub use arrays::{array, cancel_array, team_arrays};
pub use auth::{login, login_form, logout, oidc_begin, oidc_callback};
pub use billing::{billing, billing_export, billing_period, billing_usage_csv, statement};
pub use clusters::{clear_faults, clusters};
pub use jobs::{cancel, job, job_live, job_log, rerun, team_jobs};
pub use members::{remove_member, set_member, team_members};
pub use platform_admin::{admin, create_team, save_idle_policy, save_priority_class, set_rate};
pub use services::{change_service, create_service, delete_service, service, team_services};
pub use submit::{delete_template, preview, submit, submit_form};
pub use team::{home, team};
pub use team_admin::{
    audit, audit_changes, create_token, delete_budget, revoke_token, set_budget, set_quota, team_audit, team_quotas,
    team_tokens,
};
pub use users::{change_user, create_user, users};
pub use webhooks::{create_webhook, delete_webhook, team_webhooks, webhook};

use super::session::{self, form_allowed};
use crate::{
    auth::{policy::team_role, Principal},
    db::{self, web_sessions::SessionUser},
    domain::{JobId, PlatformRole, TeamId, TeamRole},
    ops,
    state::AppState,
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
        ops::Error::from(e).into()
    }
}

/// Every use-case error as the page a person sees; server-side causes are logged here, once.
impl From<ops::Error> for PageError {
    fn from(e: ops::Error) -> Self {
        let refused = |status, message: String| Self { status, title: "That did not work", message };
        match e {
            ops::Error::NotFound(_) => Self::not_found(),
            ops::Error::Forbidden => Self {
                status: StatusCode::FORBIDDEN,
                title: "Not allowed",
                message: "Your role in this team does not allow that.".into(),
            },
            ops::Error::InvalidCredentials => {
                refused(StatusCode::UNAUTHORIZED, "That username and password do not match.".into())
            }
            ops::Error::Validation(errors) => refused(StatusCode::UNPROCESSABLE_ENTITY, in_words(&errors)),
            ops::Error::Conflict { detail, .. } => refused(StatusCode::CONFLICT, detail),
            ops::Error::Throttled { retry_after } => refused(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "Too many failed sign-ins for this username from here. Try again in {} seconds.",
                    retry_after.as_secs().max(1)
                ),
            ),
            ops::Error::IdentityRefused { reason } => Self {
                status: StatusCode::UNAUTHORIZED,
                title: "Sign-in refused",
                message: format!("The sign-in was refused: {reason}. Start again from the sign-in page."),
            },
            ops::Error::ProviderUnavailable { reason } => {
                tracing::warn!(%reason, "portal sign-in failed: identity provider unavailable");
                Self {
                    status: StatusCode::BAD_GATEWAY,
                    title: "Sign-in unavailable",
                    message: "The identity provider cannot be reached right now. Try again in a moment.".into(),
                }
            }
            ops::Error::PreconditionFailed => refused(
                StatusCode::CONFLICT,
                "Someone changed this since the page was shown. Reload the page and try again.".into(),
            ),
            ops::Error::Unavailable(cause) => {
                tracing::warn!(error = %ops::error::chain(&cause), "portal page failed: database unavailable");
                Self {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    title: "Briefly unavailable",
                    message: "The service is briefly unavailable. Nothing was changed; try again in a moment.".into(),
                }
            }
            // The portal never authorises from cached credentials; seeing this is a bug.
            internal @ (ops::Error::CredentialsChanged | ops::Error::Internal { .. }) => {
                tracing::error!(error = %ops::error::chain(&internal), "portal page failed");
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

/// The signed-in user of a portal request. Without a live session the request is answered
/// with a redirect to the sign-in page.
pub struct CurrentUser(pub SessionUser);

impl FromRequestParts<AppState> for CurrentUser {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        match session::user(state, &parts.headers).await {
            Ok(Some(user)) => Ok(Self(user)),
            Ok(None) => Err(Redirect::to("/login").into_response()),
            Err(e) => Err(PageError::from(e).into_response()),
        }
    }
}

/// A form posted by the signed-in user from one of our pages: its `csrf` field matches the
/// session's token and the browser does not name another origin. Anything else is refused
/// before the handler runs. Fields the form lacks take their defaults.
pub struct PortalForm<T> {
    pub user: SessionUser,
    pub form: T,
}

/// A form with nothing in it but its CSRF token (sign-out, cancel, revoke).
#[derive(Deserialize)]
pub struct NoFields {}

#[derive(Deserialize)]
struct CsrfField {
    #[serde(default)]
    csrf: String,
}

/// Whether a form body decodes to a NUL anywhere (PostgreSQL text cannot hold one).
pub fn form_has_nul(body: &[u8]) -> bool {
    form_urlencoded::parse(body).any(|(k, v)| k.contains('\0') || v.contains('\0'))
}

impl<T: DeserializeOwned> FromRequest<AppState> for PortalForm<T> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &AppState) -> Result<Self, Response> {
        let (mut parts, body) = request.into_parts();
        let CurrentUser(user) = CurrentUser::from_request_parts(&mut parts, state).await?;
        let body = Bytes::from_request(Request::from_parts(parts.clone(), body), state)
            .await
            .map_err(IntoResponse::into_response)?;
        let token = serde_urlencoded::from_bytes::<CsrfField>(&body).map(|f| f.csrf).unwrap_or_default();
        if !form_allowed(&parts.headers, &user.csrf_token, &token) {
            return Err(PageError::forbidden().into_response());
        }
        if form_has_nul(&body) {
            return Err(PageError {
                status: StatusCode::BAD_REQUEST,
                title: "That did not work",
                message: "The form holds a NUL character, which cannot be stored. Remove it and try again.".into(),
            }
            .into_response());
        }
        let form = serde_urlencoded::from_bytes(&body).map_err(|_| {
            PageError {
                status: StatusCode::BAD_REQUEST,
                title: "That did not work",
                message: "The form was not understood. Reload the page and try again.".into(),
            }
            .into_response()
        })?;
        Ok(Self { user, form })
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

/// Why a pending job waits, where it stands and when it may start, as every page shows it.
pub struct Wait {
    /// The scheduler's sentence, with the jobs it names shown by name.
    pub reason: Vec<Mention>,
    /// Its place among its team's pending jobs, 1 first.
    pub team_position: String,
    /// Its place in the whole queue, every team's pending jobs together.
    pub overall_position: String,
    /// When the scheduler expects it to start.
    pub expected_start: String,
}

impl Wait {
    /// From what the scheduler stored: its sentence (`None` before the first cycle that saw
    /// the job), the job's place in its team's queue and in the whole queue, and its expected
    /// start; `names` names the jobs the sentence may mention.
    pub fn new(
        message: Option<&str>,
        team_position: Option<i64>,
        overall_position: Option<i32>,
        starts: Starts,
        names: &HashMap<JobId, String>,
    ) -> Self {
        let not_yet = || "not known yet".to_owned();
        Self {
            reason: mentions(message.unwrap_or("waiting for the next scheduling cycle"), names),
            team_position: team_position.map_or_else(not_yet, |p| p.to_string()),
            overall_position: overall_position.map_or_else(not_yet, |p| p.to_string()),
            expected_start: starts.describe().unwrap_or_else(|| "not foreseeable".into()),
        }
    }
}

/// A waiting job's expected start and the interval around it, as stored.
#[derive(Debug, Clone, Copy, Default)]
pub struct Starts {
    pub earliest: Option<DateTime<Utc>>,
    pub expected: Option<DateTime<Utc>>,
    pub latest: Option<DateTime<Utc>>,
}

impl Starts {
    /// From a stored expected start and the figures that carry its interval.
    pub fn of(expected: Option<DateTime<Utc>>, figures: Option<&crate::domain::WaitFigures>) -> Self {
        Self {
            earliest: figures.and_then(|f| f.earliest_start_at),
            expected,
            latest: figures.and_then(|f| f.latest_start_at),
        }
    }

    /// "in 12 min (between 4 min and 40 min)"; `None` when no start is foreseen.
    pub fn describe(self) -> Option<String> {
        match (self.earliest, self.expected, self.latest) {
            (Some(a), Some(b), Some(c)) if a != c => Some(format!("{} (between {} and {})", when(b), when(a), when(c))),
            (_, Some(b), _) => Some(when(b)),
            _ => None,
        }
    }
}

/// A piece of a sentence: text, or a job named and linked to its page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mention {
    pub text: String,
    pub job: Option<JobId>,
}

/// The job ids written out in `text`.
fn job_ids_in(text: &str) -> Vec<(usize, JobId)> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i + 36 <= bytes.len() {
        let found = text.get(i..i + 36).and_then(|s| s.parse::<JobId>().ok()).filter(|_| {
            // Only the hyphenated form, whole: not the middle of a longer hex run.
            let word = |b: u8| b.is_ascii_alphanumeric() || b == b'-';
            bytes[i + 8] == b'-' && !(i > 0 && word(bytes[i - 1])) && !bytes.get(i + 36).is_some_and(|b| word(*b))
        });
        match found {
            Some(id) => {
                out.push((i, id));
                i += 36;
            }
            None => i += 1,
        }
    }
    out
}

/// `text` with every job id in it replaced by the job's name, linked (`job <name>`), when
/// `names` has it, and by "a job" otherwise (another team's, whose name is not ours to show).
pub fn mentions(text: &str, names: &HashMap<JobId, String>) -> Vec<Mention> {
    let mut out = Vec::new();
    let mut rest = 0;
    for (at, id) in job_ids_in(text) {
        let before = &text[rest..at];
        match names.get(&id) {
            Some(name) => {
                out.push(Mention { text: before.to_owned(), job: None });
                out.push(Mention { text: name.clone(), job: Some(id) });
            }
            None => {
                let before = before.strip_suffix("job ").unwrap_or(before);
                out.push(Mention { text: format!("{before}a job"), job: None });
            }
        }
        rest = at + 36;
    }
    out.push(Mention { text: text[rest..].to_owned(), job: None });
    out.retain(|m| !m.text.is_empty());
    out
}

/// The names of the jobs of team `team` that `texts` mention by id.
async fn mentioned_jobs<'a>(
    state: &AppState,
    team: TeamId,
    texts: impl Iterator<Item = &'a str>,
) -> Result<HashMap<JobId, String>, PageError> {
    let mut ids: Vec<JobId> = texts.flat_map(|t| job_ids_in(t).into_iter().map(|(_, id)| id)).collect();
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    Ok(db::jobs::names(&state.db, &ids)
        .await?
        .into_iter()
        .filter(|j| j.team_id == team)
        .map(|j| (j.id, j.name))
        .collect())
}

/// Validation errors as one sentence: `field: message; field: message`.
fn in_words(errors: &[crate::domain::FieldError]) -> String {
    errors.iter().map(|e| format!("{}: {}", e.field, e.message)).collect::<Vec<_>>().join("; ")
}

/// The team `name` and the user's role in it; to someone with none the team does not exist.
pub(super) async fn team_and_role(
    state: &AppState,
    user: &SessionUser,
    name: &str,
) -> Result<(db::teams::TeamRow, TeamRole), PageError> {
    let team = db::teams::by_name(&state.db, name).await?.ok_or_else(PageError::not_found)?;
    let role = team_role(&state.db, &principal(user), &team).await?.ok_or_else(PageError::not_found)?;
    Ok((team, role))
}

/// The team `name`, when the user's role in it is at least `least`. Outsiders do not learn
/// the team exists; a member whose role falls short is told so, as the API (403) does.
pub(super) async fn team_at_least(
    state: &AppState,
    user: &SessionUser,
    name: &str,
    least: TeamRole,
) -> Result<db::teams::TeamRow, PageError> {
    let (team, role) = team_and_role(state, user, name).await?;
    if role < least {
        return Err(ops::Error::Forbidden.into());
    }
    Ok(team)
}

/// The team, when the user administers it (team admins and platform admins).
pub(super) async fn administered_team(
    state: &AppState,
    user: &SessionUser,
    name: &str,
) -> Result<db::teams::TeamRow, PageError> {
    team_at_least(state, user, name, TeamRole::Admin).await
}

/// What a refused change says beside its form: the fields that are wrong, the conflict, or
/// that someone else changed the object first. Anything else is a failed page.
fn form_error(e: ops::Error) -> Result<String, PageError> {
    match e {
        ops::Error::Validation(errors) => Ok(in_words(&errors)),
        ops::Error::Conflict { detail, .. } => Ok(detail),
        ops::Error::NotFound(what) => Ok(format!("There is no such {what}.")),
        ops::Error::PreconditionFailed => {
            Ok("Someone changed this since the page was shown; here it is as it is now.".to_owned())
        }
        other => Err(other.into()),
    }
}

/// The portal's "not found" page, for paths that are no page.
pub fn not_found_page() -> Response {
    PageError::not_found().into_response()
}

/// The portal's stylesheet, from the binary.
pub async fn stylesheet() -> Response {
    const CSS: &str = include_str!("../../../../web/static/portal.css");
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8"), (header::CACHE_CONTROL, "max-age=3600")], CSS).into_response()
}

/// The job page's script (its timeline and log as they grow), from the binary. The page
/// works without it.
pub async fn job_script() -> Response {
    const JS: &str = include_str!("../../../../web/static/job-live.js");
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8"), (header::CACHE_CONTROL, "max-age=3600")], JS)
        .into_response()
}

/// The submit form's live preview script, from the binary. The portal works without it.
pub async fn preview_script() -> Response {
    const JS: &str = include_str!("../../../../web/static/preview.js");
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8"), (header::CACHE_CONTROL, "max-age=3600")], JS)
        .into_response()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::{mentions, Mention};
    use crate::domain::JobId;

    fn text(t: &str) -> Mention {
        Mention { text: t.to_owned(), job: None }
    }

    #[test]
    fn a_reason_names_a_job_of_the_team_by_its_linked_name_and_another_teams_job_as_a_job() {
        let ours = JobId::from_u128(0x1234);
        let theirs = JobId::from_u128(0x5678);
        let names = HashMap::from([(ours, "train-llm".to_owned())]);
        assert_eq!(
            mentions(&format!("job {ours} at the head of the queue is waiting"), &names),
            vec![
                text("job "),
                Mention { text: "train-llm".into(), job: Some(ours) },
                text(" at the head of the queue is waiting")
            ]
        );
        assert_eq!(
            mentions(&format!("preempted for job {theirs} of team ml: team ml reclaims its reserved quota"), &names),
            vec![text("preempted for a job"), text(" of team ml: team ml reclaims its reserved quota")]
        );
        let plain = "the job is larger than team ml's quota for this GPU class allows";
        assert_eq!(mentions(plain, &names), vec![text(plain)]);
        // No id in a page's sentence is left as a raw uuid.
        let shown: String =
            mentions(&format!("held for job {theirs}, then {ours}"), &names).into_iter().map(|m| m.text).collect();
        assert!(!shown.contains(&theirs.to_string()) && !shown.contains(&ours.to_string()), "{shown}");
    }
}
