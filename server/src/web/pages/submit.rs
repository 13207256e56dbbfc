//! The submit form and its dry-run preview.

use askama::Template;
use axum::{
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Redirect, Response},
};
use serde::Deserialize;

use super::{principal, render, signed_in, CurrentUser, PageError, PortalForm, SignedIn};
use crate::{
    auth::policy::team_role,
    db::{self, web_sessions::SessionUser},
    domain::{TeamId, TeamRole},
    ops,
    state::AppState,
};

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
    /// Optional: empty declares none.
    #[serde(default)]
    pub expected_runtime_seconds: String,
    #[serde(default)]
    pub image: String,
    #[serde(default)]
    pub command: String,
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
    /// Shown by the live preview only.
    incomplete: Option<String>,
}

/// The live preview's answer: the part of the submit page that says what submitting now
/// would do.
#[derive(Template)]
#[template(path = "preview.html")]
struct PreviewFragment {
    preview: Option<PreviewView>,
    incomplete: Option<String>,
}

/// The team of a submit page, checked: members and above only.
async fn submit_team(state: &AppState, user: &SessionUser, name: &str) -> Result<db::teams::TeamRow, PageError> {
    let team = db::teams::by_name(&state.db, name).await?.ok_or_else(PageError::not_found)?;
    let role = team_role(&state.db, &principal(user), &team).await?.ok_or_else(PageError::not_found)?;
    if role < TeamRole::Member {
        return Err(PageError::from(ops::Error::Forbidden));
    }
    Ok(team)
}

async fn submit_page(
    state: &AppState,
    user: &SessionUser,
    team: &db::teams::TeamRow,
    form: SubmitForm,
    errors: Vec<(String, String)>,
    preview: Option<PreviewView>,
) -> Result<SubmitPage, PageError> {
    let classes = usable_classes_first(state, team.id).await?;
    let priorities = db::priority_classes::list(&state.db).await?.into_iter().map(|p| p.name).collect();
    Ok(SubmitPage {
        signed_in: Some(signed_in(user)),
        csrf: user.csrf_token.clone(),
        team: team.name.clone(),
        classes,
        priorities,
        form,
        errors,
        preview,
        incomplete: None,
    })
}

/// Every GPU class, those the team has quota for first (in name order): a team cannot run
/// a job of a class it has no quota for, so the form offers, and defaults to, one it can.
async fn usable_classes_first(state: &AppState, team: TeamId) -> Result<Vec<String>, PageError> {
    let all = db::gpu_classes::list(&state.db, None, 500).await?.into_iter().map(|c| c.name);
    let usable: Vec<String> = db::quotas::list(&state.db, team)
        .await?
        .into_iter()
        .filter(|q| q.reserved + q.burst > 0)
        .map(|q| q.gpu_class)
        .collect();
    let (mut first, rest): (Vec<String>, Vec<String>) = all.partition(|c| usable.contains(c));
    first.extend(rest);
    Ok(first)
}

/// The submit form.
pub async fn submit_form(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let team = submit_team(&state, &user, &name).await?;
    let form = SubmitForm {
        replicas: "1".into(),
        gpus_per_replica: "1".into(),
        priority_class: "experiment".into(),
        max_runtime_seconds: "3600".into(),
        ..SubmitForm::default()
    };
    let mut page = submit_page(&state, &user, &team, form, Vec::new(), None).await?;
    // The first class offered is one the team has quota for, when it has any.
    page.form.gpu_class = page.classes.first().cloned().unwrap_or_default();
    Ok(render(&page))
}

/// The form as the API's job spec; the fields that are not numbers, named.
fn spec_of(form: &SubmitForm) -> Result<ops::jobs::JobSpec, Vec<(String, String)>> {
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
    let expected = match form.expected_runtime_seconds.trim() {
        "" => Some(None),
        typed => number("expected_runtime_seconds", typed).map(Some),
    };
    let (Some(replicas), Some(gpus_per_replica), Some(runtime), Some(expected)) = (replicas, gpus, runtime, expected)
    else {
        return Err(errors);
    };
    let spec = serde_json::json!({
        "name": form.name,
        "gpu_class": form.gpu_class,
        "replicas": replicas,
        "gpus_per_replica": gpus_per_replica,
        "priority_class": form.priority_class,
        "max_runtime_seconds": runtime,
        "expected_runtime_seconds": expected,
        "image": form.image,
        "command": form.command.split_whitespace().collect::<Vec<_>>(),
    });
    serde_json::from_value(spec).map_err(|e| vec![("job".to_owned(), e.to_string())])
}

fn field_errors(e: ops::Error) -> Result<Vec<(String, String)>, PageError> {
    match e {
        ops::Error::Validation(errors) => Ok(errors.into_iter().map(|e| (e.field, e.message)).collect()),
        other => Err(other.into()),
    }
}

/// Previews the job through the engine, or submits it.
pub async fn submit(
    State(state): State<AppState>,
    Path(name): Path<String>,
    PortalForm { user, form }: PortalForm<SubmitForm>,
) -> Result<Response, PageError> {
    let team = submit_team(&state, &user, &name).await?;
    let spec = match spec_of(&form) {
        Ok(spec) => spec,
        Err(errors) => {
            let page = submit_page(&state, &user, &team, form, errors, None).await?;
            return Ok((StatusCode::UNPROCESSABLE_ENTITY, render(&page)).into_response());
        }
    };
    let version = crate::auth::CatalogueVersion(None);
    if form.action == "preview" {
        let (errors, preview) = match ops::jobs::dry_run(&state, team.id, &spec, version).await {
            Ok(answer) => (Vec::new(), Some(preview_of(answer))),
            Err(e) => (field_errors(e)?, None),
        };
        return Ok(render(&submit_page(&state, &user, &team, form, errors, preview).await?));
    }
    match ops::jobs::submit(&state, &team, &principal(&user).actor(), spec, version, None).await {
        Ok(submitted) => Ok(Redirect::to(&format!("/jobs/{}", submitted.job.id)).into_response()),
        Err(e) => {
            let errors = field_errors(e)?;
            let page = submit_page(&state, &user, &team, form, errors, None).await?;
            Ok((StatusCode::UNPROCESSABLE_ENTITY, render(&page)).into_response())
        }
    }
}

fn preview_of(answer: ops::jobs::DryRunResult) -> PreviewView {
    PreviewView {
        fits_now: answer.fits_now,
        cluster: answer.cluster,
        reason: answer.message.unwrap_or_default(),
        position: answer.position,
        expected_start: super::Starts {
            earliest: answer.earliest_start_at,
            expected: answer.expected_start_at,
            latest: answer.latest_start_at,
        }
        .describe()
        .or(answer.start_unforeseeable_message)
        .unwrap_or_else(|| "not foreseeable".into()),
        max_cost: crate::web::figures::money(answer.max_cost_micros, &answer.currency),
        would_preempt: answer
            .would_preempt
            .into_iter()
            .map(|v| format!("{} GPUs of team {} ({})", v.gpus, v.team, v.reason))
            .collect(),
    }
}

/// The live preview: what submitting the form as it stands would do, as a fragment of the
/// submit page. A form not yet valid gets the fields still wrong, in a line.
pub async fn preview(
    State(state): State<AppState>,
    Path(name): Path<String>,
    PortalForm { user, form }: PortalForm<SubmitForm>,
) -> Result<Response, PageError> {
    let team = submit_team(&state, &user, &name).await?;
    let incomplete = |errors: Vec<(String, String)>| {
        let words: Vec<String> = errors.into_iter().map(|(field, message)| format!("{field}: {message}")).collect();
        PreviewFragment { preview: None, incomplete: Some(words.join("; ")) }
    };
    let fragment = match spec_of(&form) {
        Err(errors) => incomplete(errors),
        Ok(spec) => match ops::jobs::dry_run(&state, team.id, &spec, crate::auth::CatalogueVersion(None)).await {
            Ok(answer) => PreviewFragment { preview: Some(preview_of(answer)), incomplete: None },
            Err(e) => incomplete(field_errors(e)?),
        },
    };
    Ok(render(&fragment))
}
