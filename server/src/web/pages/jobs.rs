//! A team's job list and a job's page.

use crate::domain::JobId;
use askama::Template;
use axum::{
    extract::{Path, RawQuery, State},
    response::{
        sse::{Event as SseEvent, KeepAlive, Sse},
        IntoResponse, Redirect, Response,
    },
};
use chrono::Utc;
use futures_util::StreamExt as _;
use serde::Deserialize;

use super::{principal, render, signed_in, when, CurrentUser, NoFields, PageError, PortalForm, SignedIn};
use crate::{
    auth::policy::team_role,
    db::{self, jobs::JobFilter, web_sessions::SessionUser},
    domain::{workload, JobState, TeamRole},
    ops,
    state::AppState,
    web::figures,
};

/// One row of the job list.
pub struct JobListLine {
    pub id: JobId,
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
    CurrentUser(user): CurrentUser,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, PageError> {
    let (team, _) = super::team_and_role(&state, &user, &name).await?;
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
        state: crate::domain::JobState::parse(&q.state),
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
            state: j.state.to_string(),
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

/// A job as its page shows it.
pub struct JobDetail {
    pub id: JobId,
    pub name: String,
    pub team: String,
    pub state: String,
    pub gpus: i64,
    pub gpu_class: String,
    pub priority_class: String,
    pub submitted: String,
    pub submitted_by: String,
    /// The runtime it declared it expects, with its maximum, when it declared one.
    pub expected_runtime: Option<String>,
    /// Why it waits, its positions and expected start, while it is pending.
    pub waiting: Option<super::Wait>,
    pub placement: Option<String>,
    /// Billed so far and GPU time, e.g. `12.50 USD for 5.00 GPU-hours`.
    pub cost: String,
    /// What it costs per hour while it runs.
    pub burn: Option<String>,
    /// What its GPUs did (DCGM), now and over the attempt, once sampled.
    pub activity: Option<String>,
    /// A cheaper class or MIG profile that would have held it, in words.
    pub right_sizing: Option<String>,
    /// The array it is a task of: its id, this task's index and the task count.
    pub array: Option<(crate::domain::ArrayId, i32, i32)>,
    /// The service it is a replica of: its name, this replica's slot and revision.
    pub service: Option<(String, i32, i32)>,
    /// An elastic gang: its bounds and what it holds now, in words.
    pub elastic: Option<String>,
    /// The elastic gang it is an extra replica of.
    pub extra_of: Option<crate::domain::JobId>,
    /// CPU and memory per replica, e.g. `8 CPUs and 64Gi of memory per replica`.
    pub resources: Option<String>,
    /// What each replica mounts and reads, one line each: claims, secret references (names
    /// only: Fairway has no values), pull secrets and node labels.
    pub volumes: Vec<String>,
    pub secrets: Vec<String>,
    pub pull_secrets: Option<String>,
    pub node_selector: Option<String>,
    /// The driver stack it requires, in words (`driver ≥ 550.54 and CUDA ≥ 12.4`).
    pub requires_drivers: Option<String>,
}

/// One entry of the timeline.
pub struct EventLine {
    pub at: String,
    pub kind: String,
    pub reason: Option<String>,
    /// What happened, with the jobs it names shown by name.
    pub message: Vec<super::Mention>,
}

#[derive(Template)]
#[template(path = "job.html")]
struct JobPage {
    signed_in: Option<SignedIn>,
    csrf: String,
    job: JobDetail,
    events: Vec<EventLine>,
    can_cancel: bool,
    /// Members may run it again.
    can_rerun: bool,
    /// The end of its latest attempt's log, once it has one.
    log: Option<LogTail>,
    /// It may still change: the page's script follows its timeline (after `last_event`) and
    /// its log, and reloads once it ended. Without the script the page is as it was loaded.
    live: bool,
    last_event: i64,
    /// The jobs it waits for, and the jobs that wait for it: its place in a chain.
    depends_on: Vec<ChainLink>,
    dependents: Vec<ChainLink>,
}

/// A job in a dependency chain, linked from the job page.
struct ChainLink {
    id: JobId,
    name: String,
    /// `succeeded`, `finished` or `failed`: what is waited for.
    after: &'static str,
    state: String,
}

/// The last lines of an attempt's log, as the page shows them.
struct LogTail {
    attempt: i32,
    /// Prefixed `[replica N] ` when the job has several.
    lines: Vec<String>,
    /// More lines were written than shown.
    cut: bool,
}

/// Lines of the log the job page shows.
const LOG_LINES: i64 = 200;

/// The job and the user's role in its team; not found when the user may not see it.
async fn job_for(state: &AppState, user: &SessionUser, id: &str) -> Result<(db::jobs::JobRow, TeamRole), PageError> {
    let id: JobId = id.parse().map_err(|_| PageError::not_found())?;
    let job = db::jobs::get(&state.db, id).await?.ok_or_else(PageError::not_found)?;
    let team = db::teams::by_id(&state.db, job.team_id).await?.ok_or_else(PageError::not_found)?;
    let role = team_role(&state.db, &principal(user), &team).await?.ok_or_else(PageError::not_found)?;
    Ok((job, role))
}

/// The job, for a change only its team's members may make: forbidden to viewers.
async fn member_job_for(state: &AppState, user: &SessionUser, id: &str) -> Result<db::jobs::JobRow, PageError> {
    let (job, role) = job_for(state, user, id).await?;
    if role < TeamRole::Member {
        return Err(PageError::from(ops::Error::Forbidden));
    }
    Ok(job)
}

/// A job: its state, why it waits, where it runs, its timeline; cancel for members.
pub async fn job(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let (job, role) = job_for(&state, &user, &id).await?;
    let events = db::jobs::events(&state.db, job.id, 0, 500).await?;
    let last_event = events.last().map_or(0, |e| e.id);
    // Events beyond the first 500 are not shown; following from the 500th would skip them.
    let all_shown = events.len() < 500;
    let texts = events.iter().map(|e| e.message.as_str()).chain(job.pending_message.as_deref());
    let names = super::mentioned_jobs(&state, job.team_id, texts).await?;
    let events = events
        .into_iter()
        .map(|e| EventLine {
            at: when(e.at),
            kind: e.kind,
            reason: e.reason,
            message: super::mentions(&e.message, &names),
        })
        .collect();
    let finished = matches!(job.state, JobState::Succeeded | JobState::Failed | JobState::Cancelled);
    let live = job.finished_at.is_none() && all_shown;
    let spend = crate::billing::budgets::job_cost(&state.db, job.id, Utc::now(), state.config.chargeback).await?;
    let currency = &state.config.currency;
    let cost = format!(
        "{} for {} GPU-hours",
        figures::money(spend.cost_micros, currency),
        figures::gpu_hours(spend.gpu_milli_ms)
    );
    let burn = (spend.burn_gpu_milli_ms_per_hour > 0)
        .then(|| format!("{} per hour", figures::money(spend.burn_micros_per_hour, currency)));
    let waiting = match job.state {
        JobState::Pending => Some(super::Wait::new(
            job.pending_message.as_deref(),
            db::jobs::team_position(&state.db, job.team_id, job.id).await?,
            job.queue_position,
            super::Starts::of(job.expected_start_at, job.pending_figures.as_ref().map(|f| &f.0)),
            &names,
        )),
        _ => None,
    };
    // "node (GPUs 0,1,2)" per replica, from the stored placement.
    let placement = job.placement.as_ref().and_then(|p| p.0.as_array().cloned()).map(|slots| {
        slots
            .iter()
            .map(|slot| {
                let gpus: Vec<String> =
                    slot["gpus"].as_array().into_iter().flatten().map(std::string::ToString::to_string).collect();
                format!("{} (GPUs {})", slot["node"].as_str().unwrap_or("?"), gpus.join(","))
            })
            .collect::<Vec<_>>()
            .join(", ")
    });
    let activity = ops::utilisation::of_job(&state, job.id).await?;
    let right_sizing = activity.recommendation.as_ref().map(|r| r.message.clone());
    let gib = |mib: i64| format!("{:.1} GiB", mib as f64 / 1024.0);
    let activity = activity.now.zip(activity.attempt_mean).map(|(now, mean)| {
        format!(
            "SM {}%, tensor cores {}%, utilisation {}%, memory {} of {} (last sample); \
             over the attempt SM {}% on average, memory at most {}",
            now.sm_active_percent,
            now.tensor_active_percent,
            now.gpu_util_percent,
            gib(now.memory_used_mib),
            gib(now.memory_total_mib),
            mean.sm_active_percent,
            gib(mean.memory_used_mib)
        )
    });
    let elastic = match job.max_replicas {
        Some(max) => {
            let extras = db::jobs::running_extras(&state.db, job.id).await?;
            let held = if job.holds_gpus { i64::from(job.replicas) + extras } else { 0 };
            Some(format!(
                "{} to {max} replicas, {held} running now ({extras} of them extras, each a job of its own in the team's list)",
                job.replicas
            ))
        }
        None => None,
    };
    let detail = JobDetail {
        id: job.id,
        elastic,
        extra_of: job.extra_of,
        activity,
        right_sizing,
        gpus: i64::from(job.replicas) * i64::from(job.gpus_per_replica),
        waiting,
        // Where it runs now; a requeued job's last placement is history, in the timeline.
        placement: job
            .cluster
            .as_ref()
            .filter(|_| job.holds_gpus)
            .map(|c| format!("{c}: {}", placement.unwrap_or_default())),
        submitted: when(job.submitted_at),
        expected_runtime: job
            .expected_runtime_seconds
            .map(|e| format!("{e} seconds (at most {})", job.max_runtime_seconds)),
        cost,
        burn,
        array: match (job.array_id, job.array_index, job.array_task_count) {
            (Some(id), Some(index), Some(count)) => Some((id, index, count)),
            _ => None,
        },
        service: match (&job.service, job.service_slot, job.service_revision) {
            (Some(name), Some(slot), Some(revision)) => Some((name.clone(), slot, revision)),
            _ => None,
        },
        resources: match (job.cpu_millis, job.memory_mib) {
            (Some(cpu), Some(memory)) => Some(format!(
                "{} CPU and {} of memory per replica",
                workload::format_cpu(cpu),
                workload::format_memory(memory)
            )),
            _ => None,
        },
        volumes: job
            .workload
            .0
            .volumes
            .iter()
            .map(|v| format!("{} at {}{}", v.claim, v.mount_path, if v.read_only { ", read-only" } else { "" }))
            .collect(),
        secrets: job
            .workload
            .0
            .secret_env
            .iter()
            .map(|s| format!("{} from Secret {}, key {}", s.name, s.secret, s.key))
            .chain(job.workload.0.cloud_secret_env.iter().map(|s| format!("{} from {}", s.name, s.reference)))
            .collect(),
        pull_secrets: (!job.workload.0.image_pull_secrets.is_empty())
            .then(|| job.workload.0.image_pull_secrets.join(", ")),
        node_selector: (!job.workload.0.node_selector.is_empty()).then(|| {
            job.workload.0.node_selector.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ")
        }),
        requires_drivers: Some(
            crate::domain::driver::DriverStack::read(
                job.min_driver_version.as_deref(),
                job.min_cuda_version.as_deref(),
            )
            .as_minimum(),
        )
        .filter(|words| !words.is_empty()),
        name: job.name,
        team: job.team,
        state: job.state.to_string(),
        gpu_class: job.gpu_class,
        priority_class: job.priority_class,
        submitted_by: job.submitted_by,
    };
    let tail = db::logs::tail(&state.db, job.id, job.attempt, LOG_LINES + 1).await?;
    let log = (!tail.is_empty()).then(|| LogTail {
        attempt: job.attempt,
        cut: tail.len() as i64 > LOG_LINES,
        lines: tail
            .iter()
            .skip(usize::from(tail.len() as i64 > LOG_LINES))
            .map(|l| if job.replicas > 1 { format!("[replica {}] {}", l.replica, l.line) } else { l.line.clone() })
            .collect(),
    });
    let depends_on = db::dependencies::of_job(&state.db, job.id)
        .await?
        .into_iter()
        .map(|d| ChainLink { id: d.job, name: d.name, after: d.after.as_str(), state: d.state.to_string() })
        .collect();
    let dependents = db::dependencies::dependents(&state.db, job.team_id, job.id)
        .await?
        .into_iter()
        .map(|d| ChainLink { id: d.job, name: d.name, after: d.after.as_str(), state: d.state.to_string() })
        .collect();
    let page = JobPage {
        depends_on,
        dependents,
        csrf: user.csrf_token.clone(),
        signed_in: Some(signed_in(&user)),
        job: detail,
        log,
        live,
        last_event,
        events,
        can_cancel: role >= TeamRole::Member && !finished,
        can_rerun: role >= TeamRole::Member,
    };
    Ok(render(&page))
}

/// Where a job page's script resumes its timeline.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveQuery {
    after: Option<i64>,
}

/// A job's timeline as it grows, for its page's script: a server-sent event stream of frames
/// `job_event` (the event as the page shows it) and a last frame `end` once the job ended,
/// from the same follower as the API's `events:stream`, under the portal's session.
pub async fn job_live(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path(id): Path<String>,
    axum::extract::Query(query): axum::extract::Query<LiveQuery>,
) -> Result<Response, PageError> {
    let (job, _) = job_for(&state, &user, &id).await?;
    let frames = ops::timeline::follow(&state, job.id, query.after.unwrap_or(0).max(0)).map(|item| {
        Ok::<_, std::convert::Infallible>(match item {
            Ok(ops::timeline::Followed::Event(e)) => {
                let data =
                    serde_json::json!({"at": when(e.at), "kind": e.kind, "reason": e.reason, "message": e.message});
                SseEvent::default().id(e.id.to_string()).event("job_event").data(data.to_string())
            }
            Ok(ops::timeline::Followed::End(_)) => SseEvent::default().event("end").data("{}"),
            // The script reconnects after the last id it saw.
            Err(_) => SseEvent::default().comment("interrupted"),
        })
    });
    Ok(Sse::new(frames).keep_alive(KeepAlive::default()).into_response())
}

/// A job's latest attempt's log as plain text, followed until the attempt is over: what its
/// page's script shows as it grows.
pub async fn job_log(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path(id): Path<String>,
) -> Result<Response, PageError> {
    let (job, _) = job_for(&state, &user, &id).await?;
    let request = ops::logs::LogRequest { follow: true, ..ops::logs::LogRequest::default() };
    let reader = ops::logs::open(&state, job.id, request).await?;
    Ok(crate::http::text_stream(reader.stream()))
}

/// Cancels a job from its page.
pub async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
    PortalForm { user, .. }: PortalForm<NoFields>,
) -> Result<Response, PageError> {
    let job = member_job_for(&state, &user, &id).await?;
    ops::jobs::cancel(&state, &principal(&user).actor(), job.id).await?;
    Ok(Redirect::to(&format!("/jobs/{}", job.id)).into_response())
}

/// Runs a job again from its page and shows the new one.
pub async fn rerun(
    State(state): State<AppState>,
    Path(id): Path<String>,
    PortalForm { user, .. }: PortalForm<NoFields>,
) -> Result<Response, PageError> {
    let job = member_job_for(&state, &user, &id).await?;
    let team = db::teams::by_id(&state.db, job.team_id).await?.ok_or_else(PageError::not_found)?;
    let version = crate::auth::CatalogueVersion(None);
    let again = ops::jobs::rerun(&state, &team, &principal(&user).actor(), &job, version).await?;
    Ok(Redirect::to(&format!("/jobs/{}", again.job.id)).into_response())
}
