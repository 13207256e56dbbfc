//! A team's job arrays and an array's page: its state, its tasks' counts, its tasks in index
//! order, and cancelling it whole.

use askama::Template;
use axum::{
    extract::{Path, RawQuery, State},
    response::{IntoResponse, Redirect, Response},
};
use serde::Deserialize;

use super::{principal, render, signed_in, when, CurrentUser, NoFields, PageError, PortalForm, SignedIn};
use crate::{
    db,
    domain::{array::TaskCounts, ArrayId, JobId, JobState, TeamRole},
    ops,
    state::AppState,
};

/// Tasks an array's page lists at once.
const TASKS_PER_PAGE: i64 = 100;
/// Arrays the list shows.
const ARRAYS_SHOWN: i64 = 100;

/// An array as its page and the list show it.
struct ArrayLine {
    id: ArrayId,
    name: String,
    state: &'static str,
    count: i32,
    /// `at most P at once`, when the array is limited.
    parallelism: Option<i32>,
    /// `3 running, 997 succeeded`: the counts that are not zero.
    counts: String,
    gpus: String,
    submitted: String,
    submitted_by: String,
}

impl ArrayLine {
    fn of(a: db::arrays::ArrayRow, c: &TaskCounts) -> Self {
        let parts: Vec<String> = [
            (c.pending - c.held, "waiting"),
            (c.held, "held by parallelism"),
            (c.admitted, "starting"),
            (c.running, "running"),
            (c.succeeded, "succeeded"),
            (c.failed, "failed"),
            (c.cancelled, "cancelled"),
            (c.preempted, "preempted"),
            // Of the cancelled, preempted or failed, those still giving their GPUs back.
            (c.stopping, "still stopping"),
        ]
        .into_iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        Self {
            id: a.id,
            state: c.state().as_str(),
            count: a.task_count,
            parallelism: a.parallelism,
            counts: parts.join(", "),
            gpus: format!("{} × {}", i64::from(a.replicas) * i64::from(a.gpus_per_replica), a.gpu_class),
            submitted: when(a.submitted_at),
            submitted_by: a.submitted_by,
            name: a.name,
        }
    }
}

#[derive(Template)]
#[template(path = "arrays.html")]
struct ArraysPage {
    signed_in: Option<SignedIn>,
    team: String,
    arrays: Vec<ArrayLine>,
}

/// A team's arrays, newest first, with their counts.
pub async fn team_arrays(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path(name): Path<String>,
) -> Result<Response, PageError> {
    let (team, _) = super::team_and_role(&state, &user, &name).await?;
    let rows = db::arrays::list(&state.db, team.id, None, ARRAYS_SHOWN).await?;
    let ids: Vec<ArrayId> = rows.iter().map(|a| a.id).collect();
    let counts: std::collections::HashMap<ArrayId, TaskCounts> =
        db::arrays::counts(&state.db, &ids).await?.into_iter().collect();
    let arrays = rows
        .into_iter()
        .map(|a| {
            let c = counts.get(&a.id).copied().unwrap_or_default();
            ArrayLine::of(a, &c)
        })
        .collect();
    Ok(render(&ArraysPage { signed_in: Some(signed_in(&user)), team: team.name, arrays }))
}

/// One task as the array's page lists it.
struct TaskLine {
    id: JobId,
    index: i32,
    state: String,
    attempt: i32,
    exit_code: String,
    /// Why it waits, while it does.
    reason: String,
}

#[derive(Template)]
#[template(path = "array.html")]
struct ArrayPage {
    signed_in: Option<SignedIn>,
    csrf: String,
    team: String,
    array: ArrayLine,
    priority_class: String,
    image: String,
    states: Vec<&'static str>,
    state: String,
    tasks: Vec<TaskLine>,
    /// The next page of tasks, from this index.
    more_from: Option<i32>,
    can_cancel: bool,
}

/// An array page's filter and page.
#[derive(Debug, Default, Deserialize)]
pub struct TasksQuery {
    #[serde(default)]
    state: String,
    /// Tasks from this index on (out of range: none).
    from: Option<i64>,
}

/// The array `id` of team `name` and the user's role in the team; not found for outsiders
/// and for another team's array.
async fn array_for(
    state: &AppState,
    user: &db::web_sessions::SessionUser,
    name: &str,
    id: &str,
) -> Result<(db::teams::TeamRow, TeamRole, db::arrays::ArrayRow), PageError> {
    let (team, role) = super::team_and_role(state, user, name).await?;
    let id: ArrayId = id.parse().map_err(|_| PageError::not_found())?;
    let array = db::arrays::get(&state.db, team.id, id).await?.ok_or_else(PageError::not_found)?;
    Ok((team, role, array))
}

/// An array: its state and counts, its tasks in index order (a hundred at a time, filtered
/// by state), cancel for members.
pub async fn array(
    State(state): State<AppState>,
    CurrentUser(user): CurrentUser,
    Path((name, id)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Result<Response, PageError> {
    let (team, role, array) = array_for(&state, &user, &name, &id).await?;
    let q: TasksQuery = serde_urlencoded::from_str(query.as_deref().unwrap_or_default()).unwrap_or_default();
    let filter = JobState::parse(&q.state);
    let from = i32::try_from(q.from.unwrap_or(0).max(0)).unwrap_or(i32::MAX);
    let counts = ops::arrays::counts_of(&state, array.id).await?;
    let mut rows = db::jobs::array_tasks(&state.db, array.id, filter, from, TASKS_PER_PAGE + 1).await?;
    let more_from = (rows.len() as i64 > TASKS_PER_PAGE).then(|| rows[TASKS_PER_PAGE as usize].array_index).flatten();
    rows.truncate(TASKS_PER_PAGE as usize);
    let tasks = rows
        .into_iter()
        .map(|t| TaskLine {
            id: t.id,
            index: t.array_index.unwrap_or_default(),
            state: t.state.to_string(),
            attempt: t.attempt,
            exit_code: t.exit_code.map(|c| c.to_string()).unwrap_or_default(),
            reason: if t.state == JobState::Pending { t.pending_message.unwrap_or_default() } else { String::new() },
        })
        .collect();
    let ended = !matches!(counts.state().as_str(), "pending" | "running");
    let page = ArrayPage {
        signed_in: Some(signed_in(&user)),
        csrf: user.csrf_token.clone(),
        team: team.name,
        priority_class: array.priority_class.clone(),
        image: array.image.clone(),
        array: ArrayLine::of(array, &counts),
        states: JobState::ALL.iter().map(|s| s.as_str()).collect(),
        state: if filter.is_some() { q.state } else { String::new() },
        tasks,
        more_from,
        can_cancel: role >= TeamRole::Member && !ended,
    };
    Ok(render(&page))
}

/// Cancels an array from its page.
pub async fn cancel_array(
    State(state): State<AppState>,
    Path((name, id)): Path<(String, String)>,
    PortalForm { user, .. }: PortalForm<NoFields>,
) -> Result<Response, PageError> {
    let (team, role, array) = array_for(&state, &user, &name, &id).await?;
    if role < TeamRole::Member {
        return Err(ops::Error::Forbidden.into());
    }
    ops::arrays::cancel(&state, &principal(&user).actor(), team.id, array.id).await?;
    Ok(Redirect::to(&format!("/teams/{}/arrays/{}", team.name, array.id)).into_response())
}
