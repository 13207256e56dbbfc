//! Following timelines as they grow: one job's, what a CI client waiting on its job reads
//! instead of polling it, or every job's of a team, what a dashboard or a team's own tooling
//! watches.
//!
//! A job's follower gets every event after the one it names, in order, then each new one as
//! it is written, and last the job itself once it has ended and every event before its end
//! was given. Reading the events before the job, and again after seeing it ended, means an
//! end committed between the two reads cannot be reported before the events it committed
//! with. A team's follower gets its jobs' events after the one it names (by default, from
//! now on) until it leaves.

use std::{collections::VecDeque, time::Duration};

use futures_util::Stream;

use super::Result;
use crate::{
    control::feed::{Subscription, Wake},
    db::{self, jobs::EventRow, jobs::JobRow},
    domain::{JobId, TeamId},
    state::AppState,
};

/// Events read per query: a long timeline reaches a new follower in pages.
const PAGE: i64 = 500;

/// The longest a follower waits without reading, should a wake-up be missed.
const REREAD: Duration = Duration::from_secs(5);

/// What a follower is told.
#[derive(Debug)]
pub enum Followed {
    /// The next event of the timeline.
    Event(EventRow),
    /// The job has ended (succeeded, failed, cancelled, or preempted out of retries) and every
    /// event was given: the last item.
    End(Box<JobRow>),
}

/// Whose timeline is followed.
#[derive(Debug, Clone, Copy)]
enum Scope {
    Job(JobId),
    Team(TeamId),
}

struct Follower {
    state: AppState,
    scope: Scope,
    after: i64,
    ready: VecDeque<Followed>,
    feed: Subscription,
    done: bool,
}

/// The events of `job` after event id `after`, then those written later, then the job once
/// it has ended. The stream also ends, without [`Followed::End`], when the process drains
/// for shutdown or after an error (the last item); the follower resumes elsewhere from the
/// last event id it saw. `job` must already be known visible to the caller.
pub fn follow(state: &AppState, job: JobId, after: i64) -> impl Stream<Item = Result<Followed>> + Send + 'static {
    stream(Follower::new(state, Scope::Job(job), after))
}

/// The events of every job of `team` after event id `after` (`None`: those written from now
/// on), as they are written. It never ends by itself: only when the process drains or after
/// an error, as [`follow`]. `team` must already be known visible to the caller.
pub async fn follow_team(
    state: &AppState,
    team: TeamId,
    after: Option<i64>,
) -> Result<impl Stream<Item = Result<Followed>> + Send + 'static> {
    let after = match after {
        Some(after) => after,
        None => db::jobs::newest_event_id(&state.db).await?,
    };
    Ok(stream(Follower::new(state, Scope::Team(team), after)))
}

fn stream(follower: Follower) -> impl Stream<Item = Result<Followed>> + Send + 'static {
    futures_util::stream::unfold(follower, |mut f| async move {
        match f.next().await {
            Ok(Some(item)) => Some((Ok(item), f)),
            Ok(None) => None,
            Err(e) => {
                f.done = true;
                f.ready.clear();
                Some((Err(e), f))
            }
        }
    })
}

impl Follower {
    fn new(state: &AppState, scope: Scope, after: i64) -> Self {
        let feed = state.feed.subscribe(&state.db);
        Self { state: state.clone(), scope, after, ready: VecDeque::new(), feed, done: false }
    }

    async fn next(&mut self) -> Result<Option<Followed>> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Ok(Some(item));
            }
            if self.done || self.feed.closing() {
                return Ok(None);
            }
            if self.read_events().await? {
                continue;
            }
            // A team's timeline never ends; a job's ends with the job.
            if let Scope::Job(job) = self.scope {
                match db::jobs::get(&self.state.db, job).await? {
                    Some(job) if job.finished_at.is_some() => {
                        // Its end committed with its last events: take any that came in between.
                        if !self.read_events().await? {
                            self.ready.push_back(Followed::End(Box::new(job)));
                            self.done = true;
                        }
                        continue;
                    }
                    // Deleted with its team: nothing more will come.
                    None => return Ok(None),
                    Some(_) => {}
                }
            }
            if self.feed.changed(REREAD).await == Wake::Closing {
                return Ok(None);
            }
        }
    }

    /// Queues the next page of events; whether there were any.
    async fn read_events(&mut self) -> Result<bool> {
        let rows = match self.scope {
            Scope::Job(job) => db::jobs::events(&self.state.db, job, self.after, PAGE).await?,
            Scope::Team(team) => db::jobs::team_events(&self.state.db, team, self.after, PAGE).await?,
        };
        let Some(last) = rows.last() else { return Ok(false) };
        self.after = last.id;
        self.ready.extend(rows.into_iter().map(Followed::Event));
        Ok(true)
    }
}
