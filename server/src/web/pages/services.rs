//! A team's inference services: the list with a form to create one, and a service's page
//! with its replicas, its endpoints, and forms to scale it, roll it to a new image and
//! delete it (members and above).

use askama::Template;
use axum::{
    extract::{Path, State},
    response::{IntoResponse, Redirect, Response},
};
use serde::Deserialize;

use super::{form_error, principal, render, signed_in, when, CurrentUser, NoFields, PageError, PortalForm, SignedIn};
use crate::{
    auth::CatalogueVersion,
    db::{self, teams::TeamRow, web_sessions::SessionUser},
    domain::{JobId, JobState, TeamRole},
    ops::{
        self,
        services::{ReplicaSpec, ServiceSpec, ServiceUpdate, Status},
        Precondition,
    },
    state::AppState,
};

/// Services the list shows.
const SERVICES_SHOWN: i64 = 200;

/// A service as the list and its page show it.
struct ServiceLine {
    name: String,
    state: &'static str,
    /// `2 of 4 running revision 3, 2 waiting`.
    replicas: String,
    /// `2 to 4`.
    range: String,
    revision: i32,
    image: String,
    /// `8 × h100-80gb`.
    each: String,
    endpoints: Vec<(String, String)>,
    version: i64,
}

impl ServiceLine {
    fn of(s: &Status) -> Self {
        let c = s.counts;
        let r = &s.service;
        let mut parts = vec![format!("{} of {} running revision {}", c.current, r.replicas, r.revision)];
        for (n, what) in [
            (c.running - c.current, "running an older revision"),
            (c.starting, "starting"),
            (c.waiting, "waiting"),
            (c.stopping, "stopping"),
            (c.given_up, "out of restarts"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        Self {
            name: r.name.clone(),
            state: state_word(s.state),
            replicas: parts.join(", "),
            range: format!("{} to {}", r.min_replicas, r.max_replicas),
            revision: r.revision,
            image: r.template.0.image.clone(),
            each: format!("{} × {}", r.template.0.gpus, r.gpu_class),
            endpoints: s.endpoints.iter().map(|e| (e.cluster.clone(), e.address.clone())).collect(),
            version: r.version,
        }
    }
}

fn state_word(state: crate::domain::service::ServiceState) -> &'static str {
    use crate::domain::service::ServiceState as S;
    match state {
        S::Starting => "starting",
        S::Ready => "ready",
        S::Scaling => "scaling",
        S::Rolling => "rolling",
        S::Degraded => "degraded",
        S::Deleted => "deleted",
    }
}

/// The create form, as typed.
#[derive(Debug, Default, Deserialize)]
pub struct CreateForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    gpu_class: String,
    #[serde(default)]
    gpus: String,
    #[serde(default)]
    image: String,
    #[serde(default)]
    min_replicas: String,
    #[serde(default)]
    max_replicas: String,
    #[serde(default)]
    port: String,
}

#[derive(Template)]
#[template(path = "services.html")]
struct ServicesPage {
    signed_in: Option<SignedIn>,
    csrf: String,
    team: String,
    services: Vec<ServiceLine>,
    can_create: bool,
    classes: Vec<String>,
    form: CreateForm,
    error: Option<String>,
}

async fn services_page(
    state: &AppState,
    user: &SessionUser,
    team: &TeamRow,
    role: TeamRole,
    form: CreateForm,
    error: Option<String>,
) -> Result<Response, PageError> {
    let statuses = ops::services::list(state, team.id, None, SERVICES_SHOWN).await?;
    let classes = db::quotas::list(&state.db, team.id).await?.into_iter().map(|q| q.gpu_class).collect();
    Ok(render(&ServicesPage {
        signed_in: Some(signed_in(user)),
        csrf: user.csrf_token.clone(),
        team: team.name.clone(),
        services: statuses.iter().map(ServiceLine::of).collect(),
        can_create: role >= TeamRole::Member,
        classes,
        form,
        error,
    }))
}

/// A team's services with their state, and the create form for members.
pub async fn team_services(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let (team, role) = super::team_and_role(&state, &user, &name).await?;
    let form = CreateForm { gpus: "1".into(), min_replicas: "1".into(), ..CreateForm::default() };
    services_page(&state, &user, &team, role, form, None).await
}

/// A number a form field holds: empty is `None`; anything else that is not a number is
/// passed on as a value the use case refuses by name (`-1`).
fn number(text: &str) -> Option<i64> {
    let t = text.trim();
    (!t.is_empty()).then(|| t.parse().unwrap_or(-1))
}

/// Creates a service from the list's form.
pub async fn create_service(
    State(state): State<AppState>,
    Path(name): Path<String>,
    PortalForm { user, form }: PortalForm<CreateForm>,
) -> Result<Response, PageError> {
    let (team, role) = super::team_and_role(&state, &user, &name).await?;
    if role < TeamRole::Member {
        return Err(ops::Error::Forbidden.into());
    }
    let spec = ServiceSpec {
        name: form.name.trim().to_owned(),
        min_replicas: number(&form.min_replicas).unwrap_or(1),
        max_replicas: number(&form.max_replicas),
        replicas: None,
        port: number(&form.port),
        restart_budget: None,
        priority_class: None,
        burst_priority_class: None,
        replica: ReplicaSpec {
            gpu_class: form.gpu_class.trim().to_owned(),
            gpus: number(&form.gpus).unwrap_or(1),
            image: form.image.trim().to_owned(),
            command: Vec::new(),
            env: Default::default(),
            labels: Default::default(),
            preemption_grace_seconds: None,
            cpu: None,
            memory: None,
            volumes: Vec::new(),
            secret_env: Vec::new(),
            image_pull_secrets: Vec::new(),
            node_selector: Default::default(),
            min_driver_version: None,
            min_cuda_version: None,
        },
    };
    match ops::services::create(&state, &principal(&user), &team, spec, CatalogueVersion(None)).await {
        Ok(row) => Ok(Redirect::to(&format!("/teams/{}/services/{}", team.name, row.name)).into_response()),
        Err(e) => {
            let error = Some(form_error(e)?);
            services_page(&state, &user, &team, role, form, error).await
        }
    }
}

/// One replica as the service's page lists it.
struct ReplicaLine {
    id: JobId,
    slot: i32,
    revision: i32,
    state: String,
    attempt: i32,
    cluster: String,
    /// Why it waits, or how it ended.
    note: String,
}

#[derive(Template)]
#[template(path = "service.html")]
struct ServicePage {
    signed_in: Option<SignedIn>,
    csrf: String,
    team: String,
    service: ServiceLine,
    min_replicas: i32,
    max_replicas: i32,
    replicas_asked: i32,
    port: i32,
    priority_class: String,
    burst_priority_class: String,
    restart_budget: i32,
    created: String,
    created_by: String,
    replicas: Vec<ReplicaLine>,
    can_change: bool,
    ok: Option<String>,
    error: Option<String>,
}

async fn service_page(
    state: &AppState,
    user: &SessionUser,
    team: &TeamRow,
    role: TeamRole,
    name: &str,
    ok: Option<String>,
    error: Option<String>,
) -> Result<Response, PageError> {
    let status = ops::services::status(state, team.id, name).await?;
    let replicas = status
        .replicas
        .iter()
        .map(|j| ReplicaLine {
            id: j.id,
            slot: j.service_slot.unwrap_or_default(),
            revision: j.service_revision.unwrap_or_default(),
            state: j.state.to_string(),
            attempt: j.attempt,
            cluster: j.cluster.clone().unwrap_or_default(),
            note: match j.state {
                JobState::Pending => j.pending_message.clone().unwrap_or_default(),
                JobState::Failed => j.exit_code.map(|c| format!("exit code {c}")).unwrap_or_default(),
                _ => String::new(),
            },
        })
        .collect();
    let s = &status.service;
    let t = &s.template.0;
    let page = ServicePage {
        signed_in: Some(signed_in(user)),
        csrf: user.csrf_token.clone(),
        team: team.name.clone(),
        min_replicas: s.min_replicas,
        max_replicas: s.max_replicas,
        replicas_asked: s.replicas,
        port: s.port,
        priority_class: t.priority_class.clone(),
        burst_priority_class: t.burst_priority_class.clone(),
        restart_budget: t.restart_budget,
        created: when(s.created_at),
        created_by: s.created_by.clone(),
        service: ServiceLine::of(&status),
        replicas,
        can_change: role >= TeamRole::Member,
        ok,
        error,
    };
    Ok(render(&page))
}

/// A service: its state, replicas and endpoints; scale, update and delete for members.
pub async fn service(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path((name, service)): Path<(String, String)>,
) -> Result<Response, PageError> {
    let (team, role) = super::team_and_role(&state, &user, &name).await?;
    service_page(&state, &user, &team, role, &service, None, None).await
}

/// The scale and update forms, as typed: the version the page was shown at, and what
/// changes.
#[derive(Debug, Default, Deserialize)]
pub struct ChangeForm {
    #[serde(default)]
    version: String,
    #[serde(default)]
    replicas: Option<String>,
    #[serde(default)]
    image: Option<String>,
}

/// Scales a service or rolls it to a new image from its page.
pub async fn change_service(
    State(state): State<AppState>,
    Path((name, service)): Path<(String, String)>,
    PortalForm { user, form }: PortalForm<ChangeForm>,
) -> Result<Response, PageError> {
    let (team, role) = super::team_and_role(&state, &user, &name).await?;
    if role < TeamRole::Member {
        return Err(ops::Error::Forbidden.into());
    }
    let update = ServiceUpdate {
        replicas: form.replicas.as_deref().and_then(number),
        image: form.image.as_deref().map(str::trim).filter(|i| !i.is_empty()).map(str::to_owned),
        ..ServiceUpdate::default()
    };
    let said = match (&update.replicas, &update.image) {
        (Some(n), _) => format!("Scaling {service} to {n} replicas."),
        (None, Some(image)) => format!("Rolling {service} to {image}, one replica at a time."),
        (None, None) => String::new(),
    };
    let precondition = form.version.trim().parse().map_or_else(|_| Precondition::none(), Precondition::version);
    let done = ops::services::update(
        &state,
        &principal(&user),
        &team,
        &service,
        update,
        &precondition,
        CatalogueVersion(None),
    )
    .await;
    match done {
        Ok(_) => service_page(&state, &user, &team, role, &service, Some(said), None).await,
        Err(e) => {
            let error = Some(form_error(e)?);
            service_page(&state, &user, &team, role, &service, None, error).await
        }
    }
}

/// Deletes a service from its page.
pub async fn delete_service(
    State(state): State<AppState>,
    Path((name, service)): Path<(String, String)>,
    PortalForm { user, .. }: PortalForm<NoFields>,
) -> Result<Response, PageError> {
    let (team, role) = super::team_and_role(&state, &user, &name).await?;
    if role < TeamRole::Member {
        return Err(ops::Error::Forbidden.into());
    }
    ops::services::delete(&state, &principal(&user), &team, &service).await?;
    Ok(Redirect::to(&format!("/teams/{}/services", team.name)).into_response())
}
