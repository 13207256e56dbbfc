//! The submit form and its dry-run preview.

use askama::Template;
use axum::{
    extract::{Path, Query, State},
    http::StatusCode,
    response::{IntoResponse, Redirect, Response},
};
use serde::Deserialize;

use super::{principal, render, signed_in, CurrentUser, PageError, PortalForm, SignedIn};
use crate::{
    db::{self, web_sessions::SessionUser},
    domain::{
        workload::{SecretEnv, Volume},
        TeamId, TeamRole,
    },
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
    /// Optional: empty leaves it to the template or the GPU class's default per GPU.
    #[serde(default)]
    pub cpu: String,
    #[serde(default)]
    pub memory: String,
    /// PersistentVolumeClaims, one `CLAIM:/PATH[:ro]` per line.
    #[serde(default)]
    pub volumes: String,
    /// Variables from Kubernetes Secrets, one `NAME=SECRET:KEY` per line.
    #[serde(default)]
    pub secret_env: String,
    /// The template the form was opened from (hidden): its fields the form does not show
    /// (environment, labels, topology, ...) are kept, and the job is labelled with it.
    #[serde(default)]
    pub template: String,
    /// The name to save the form under as a template (action `save_template`).
    #[serde(default)]
    pub save_as: String,
    /// Optional: a number of tasks submits the job as an array of that many tasks.
    #[serde(default)]
    pub array_count: String,
    /// Optional, with a task count: how many tasks may run at once.
    #[serde(default)]
    pub array_parallelism: String,
    #[serde(default)]
    action: String,
}

/// A template as the submit page offers it.
pub struct TemplateLine {
    pub name: String,
    pub summary: String,
    pub updated: String,
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
    /// Running elastic gangs that would give extra replicas back, in words.
    pub would_take_extras: Vec<String>,
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
    templates: Vec<TemplateLine>,
    /// A template just saved or deleted, in words.
    notice: Option<String>,
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
    super::team_at_least(state, user, name, TeamRole::Member).await
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
    let templates = db::templates::list(&state.db, team.id, None, 200)
        .await?
        .into_iter()
        .map(|t| {
            let spec = &t.spec.0;
            let number = |key: &str| spec.get(key).and_then(serde_json::Value::as_i64).unwrap_or(1);
            let text = |key: &str| spec.get(key).and_then(serde_json::Value::as_str).unwrap_or("-").to_owned();
            let gpus = number("replicas") * number("gpus_per_replica");
            let summary = format!("{gpus} × {} · {}", text("gpu_class"), text("image"));
            TemplateLine {
                name: t.name,
                summary,
                updated: format!("{} by {}", super::when(t.updated_at), t.updated_by),
            }
        })
        .collect();
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
        templates,
        notice: None,
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

/// `?template=NAME`: open the form filled from a template.
#[derive(Deserialize)]
pub struct FormQuery {
    template: Option<String>,
}

/// The submit form, empty or filled from a template.
pub async fn submit_form(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path(name): Path<String>,
    Query(query): Query<FormQuery>,
) -> Result<Response, PageError> {
    let team = submit_team(&state, &user, &name).await?;
    if let Some(template) = query.template.filter(|t| !t.is_empty()) {
        let template = ops::templates::get(&state, &team, &template).await?;
        let form = form_of(&template);
        return Ok(render(&submit_page(&state, &user, &team, form, Vec::new(), None).await?));
    }
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

/// The form as a template fills it: what the template leaves to the server's defaults shows
/// the defaults the empty form shows.
fn form_of(template: &db::templates::TemplateRow) -> SubmitForm {
    let spec = &template.spec.0;
    let text = |key: &str, default: &str| match spec.get(key) {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(serde_json::Value::Number(n)) => n.to_string(),
        _ => default.to_owned(),
    };
    let command = spec
        .get("command")
        .and_then(serde_json::Value::as_array)
        .map(|words| words.iter().filter_map(serde_json::Value::as_str).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    SubmitForm {
        name: text("name", ""),
        gpu_class: text("gpu_class", ""),
        replicas: text("replicas", "1"),
        gpus_per_replica: text("gpus_per_replica", "1"),
        priority_class: text("priority_class", "experiment"),
        max_runtime_seconds: text("max_runtime_seconds", ""),
        expected_runtime_seconds: text("expected_runtime_seconds", ""),
        image: text("image", ""),
        command,
        cpu: text("cpu", ""),
        memory: text("memory", ""),
        volumes: lines::<Volume>(spec, "volumes", Volume::line),
        secret_env: lines::<SecretEnv>(spec, "secret_env", SecretEnv::line),
        template: template.name.clone(),
        save_as: template.name.clone(),
        action: String::new(),
        array_count: String::new(),
        array_parallelism: String::new(),
    }
}

/// A template's list field as the form's lines, one per entry.
fn lines<T: serde::de::DeserializeOwned>(spec: &serde_json::Value, key: &str, line: fn(&T) -> String) -> String {
    let entries: Vec<T> = spec.get(key).and_then(|v| serde_json::from_value(v.clone()).ok()).unwrap_or_default();
    entries.iter().map(line).collect::<Vec<_>>().join("\n")
}

/// The form's job: its fields, over the template it was opened from if any. The fields that
/// are not numbers are named.
async fn spec_for(
    state: &AppState,
    team: &db::teams::TeamRow,
    form: &SubmitForm,
) -> Result<Result<ops::jobs::JobSpec, Vec<(String, String)>>, PageError> {
    let fields = match fields_of(form) {
        Ok(fields) => fields,
        Err(errors) => return Ok(Err(errors)),
    };
    if form.template.is_empty() {
        return Ok(serde_json::from_value(serde_json::Value::Object(fields))
            .map_err(|e| vec![("job".to_owned(), e.to_string())]));
    }
    match ops::templates::spec(state, team, &form.template, fields).await {
        Ok(spec) => Ok(Ok(spec)),
        Err(e) => field_errors(e).map(Err),
    }
}

/// The form's fields as the API's; the fields that are not numbers, named.
fn fields_of(form: &SubmitForm) -> Result<serde_json::Map<String, serde_json::Value>, Vec<(String, String)>> {
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
    // A form opened from a template may leave the runtime to it.
    let runtime = match form.max_runtime_seconds.trim() {
        "" if !form.template.is_empty() => Some(None),
        typed => number("max_runtime_seconds", typed).map(Some),
    };
    let expected = match form.expected_runtime_seconds.trim() {
        "" => Some(None),
        typed => number("expected_runtime_seconds", typed).map(Some),
    };
    // One entry per non-blank line; a line that is not of the form is named with its number.
    let mut entries = |field: &str, text: &str, form: &str, parse: fn(&str) -> Option<serde_json::Value>| {
        let mut out = Vec::new();
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            match parse(line) {
                Some(v) => out.push(v),
                None => errors.push((field.to_owned(), format!("line {} is not {form}", i + 1))),
            }
        }
        out
    };
    let volumes = entries("volumes", &form.volumes, "CLAIM:/PATH or CLAIM:/PATH:ro", |l| {
        Volume::parse_line(l).map(|v| serde_json::json!(v))
    });
    let secret_env = entries("secret_env", &form.secret_env, "NAME=SECRET:KEY", |l| {
        SecretEnv::parse_line(l).map(|v| serde_json::json!(v))
    });
    let (Some(replicas), Some(gpus_per_replica), Some(runtime), Some(expected)) = (replicas, gpus, runtime, expected)
    else {
        return Err(errors);
    };
    if !errors.is_empty() {
        return Err(errors);
    }
    let optional = |text: &str| (!text.trim().is_empty()).then(|| text.trim().to_owned());
    let mut fields = serde_json::json!({
        "name": form.name,
        "gpu_class": form.gpu_class,
        "replicas": replicas,
        "gpus_per_replica": gpus_per_replica,
        "priority_class": form.priority_class,
        "max_runtime_seconds": runtime,
        "expected_runtime_seconds": expected,
        "image": form.image,
        "command": form.command.split_whitespace().collect::<Vec<_>>(),
        "cpu": optional(&form.cpu),
        "memory": optional(&form.memory),
        // The form shows a template's lists in full, so what it holds replaces them.
        "volumes": volumes,
        "secret_env": secret_env,
    });
    // What the form leaves empty, the server (or the template) decides.
    if let serde_json::Value::Object(fields) = &mut fields {
        fields.retain(|_, v| !v.is_null());
        return Ok(std::mem::take(fields));
    }
    Ok(serde_json::Map::new())
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
    let spec = match spec_for(&state, &team, &form).await? {
        Ok(spec) => spec,
        Err(errors) => {
            let page = submit_page(&state, &user, &team, form, errors, None).await?;
            return Ok((StatusCode::UNPROCESSABLE_ENTITY, render(&page)).into_response());
        }
    };
    let version = crate::auth::CatalogueVersion(None);
    if form.action == "save_template" {
        let saved = ops::templates::save(
            &state,
            &principal(&user),
            &team,
            form.save_as.trim(),
            &ops::Precondition::none(),
            &spec,
            version,
        )
        .await;
        return match saved {
            Ok((template, _)) => {
                let form = SubmitForm { template: template.name.clone(), save_as: template.name.clone(), ..form };
                let mut page = submit_page(&state, &user, &team, form, Vec::new(), None).await?;
                page.notice = Some(format!("Saved as template “{}” (version {}).", template.name, template.version));
                Ok(render(&page))
            }
            Err(e) => {
                let page = submit_page(&state, &user, &team, form, field_errors(e)?, None).await?;
                Ok((StatusCode::UNPROCESSABLE_ENTITY, render(&page)).into_response())
            }
        };
    }
    if form.action == "preview" {
        let (errors, preview) = match ops::jobs::dry_run(&state, team.id, &spec, version).await {
            Ok(answer) => (Vec::new(), Some(preview_of(answer))),
            Err(e) => (field_errors(e)?, None),
        };
        return Ok(render(&submit_page(&state, &user, &team, form, errors, preview).await?));
    }
    if let Some(array) = array_of(&form) {
        let (count, parallelism) = match array {
            Ok(shape) => shape,
            Err(errors) => {
                let page = submit_page(&state, &user, &team, form, errors, None).await?;
                return Ok((StatusCode::UNPROCESSABLE_ENTITY, render(&page)).into_response());
            }
        };
        let array = ops::arrays::ArraySpec { count, parallelism, task: spec };
        return match ops::arrays::submit(&state, &team, &principal(&user).actor(), array, version).await {
            Ok(submitted) => {
                Ok(Redirect::to(&format!("/teams/{}/arrays/{}", team.name, submitted.array.id)).into_response())
            }
            Err(e) => {
                let errors = field_errors(e)?;
                let page = submit_page(&state, &user, &team, form, errors, None).await?;
                Ok((StatusCode::UNPROCESSABLE_ENTITY, render(&page)).into_response())
            }
        };
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

/// A form's errors: the field as the API names it, and what is wrong with it.
type FormErrors = Vec<(String, String)>;

/// The form's array, when it asks for one (a task count): the count and parallelism, or
/// the fields that are not numbers, named as the API names them.
fn array_of(form: &SubmitForm) -> Option<Result<(i64, Option<i64>), FormErrors>> {
    let count = form.array_count.trim();
    if count.is_empty() {
        return (!form.array_parallelism.trim().is_empty()).then(|| {
            Err(vec![("parallelism".to_owned(), "needs a number of tasks: it limits an array's tasks".to_owned())])
        });
    }
    let whole = |field: &str, text: &str| {
        text.parse::<i64>().map_err(|_| vec![(field.to_owned(), "must be a whole number".to_owned())])
    };
    Some(whole("count", count).and_then(|count| match form.array_parallelism.trim() {
        "" => Ok((count, None)),
        p => whole("parallelism", p).map(|p| (count, Some(p))),
    }))
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
        would_take_extras: answer
            .would_take_extras
            .into_iter()
            .map(|w| {
                let gang = w.gang.map_or_else(|| format!("of team {}", w.team), |g| g.to_string());
                format!(
                    "{} extra replicas ({} GPUs) of elastic gang {gang}, which runs on ({})",
                    w.replicas, w.gpus, w.reason
                )
            })
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
    let fragment = match spec_for(&state, &team, &form).await? {
        Err(errors) => incomplete(errors),
        Ok(spec) => match ops::jobs::dry_run(&state, team.id, &spec, crate::auth::CatalogueVersion(None)).await {
            Ok(answer) => PreviewFragment { preview: Some(preview_of(answer)), incomplete: None },
            Err(e) => incomplete(field_errors(e)?),
        },
    };
    Ok(render(&fragment))
}

/// Deletes a template of the team from the submit page, which answers.
pub async fn delete_template(
    State(state): State<AppState>,
    Path((name, template)): Path<(String, String)>,
    PortalForm { user, form: _ }: PortalForm<super::NoFields>,
) -> Result<Response, PageError> {
    let team = submit_team(&state, &user, &name).await?;
    ops::templates::delete(&state, &principal(&user), &team, &template, &ops::Precondition::none()).await?;
    Ok(Redirect::to(&format!("/teams/{}/jobs/new", team.name)).into_response())
}
