//! Reading a job's log: the lines the control loop's collector kept (`control::logs`), never
//! the backend itself, so a log reads the same after its pod or cloud job is gone, and a
//! reader cannot reach a cluster through Fairway.
//!
//! A read names an attempt (by default the job's latest) and a replica (by default every
//! one, each line then prefixed with its replica). It gives the kept lines and ends, or with
//! `follow` goes on with each new line as it is kept until the attempt is over and its last
//! lines were given, as `kubectl logs -f` ends with its pod.

use std::time::Duration;

use futures_util::Stream;

use super::{Error, Result};
use crate::{
    control::feed::{Subscription, Wake},
    db::{self, jobs::JobRow, logs::LineRow},
    domain::{FieldError, JobId},
    state::AppState,
};

/// Lines read per query.
const PAGE: i64 = 1_000;

/// The longest a follower waits without reading, should a wake-up be missed.
const REREAD: Duration = Duration::from_secs(5);

/// Which part of a job's log to read, as the caller asked.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogRequest {
    /// The attempt, from 1; the job's latest when `None`.
    pub attempt: Option<i64>,
    /// One replica's lines, from 0; every replica's when `None`.
    pub replica: Option<i64>,
    /// Go on with new lines until the attempt is over.
    pub follow: bool,
    /// Start each line with the time the backend received it (RFC 3339).
    pub timestamps: bool,
}

/// A job's log being read: chunks of text, each one or more whole lines.
pub struct LogReader {
    state: AppState,
    job: JobId,
    attempt: i32,
    replica: Option<i32>,
    prefix: bool,
    timestamps: bool,
    follow: Option<Subscription>,
    after: i64,
    header: Option<String>,
    /// The caller asked for the latest attempt (none had started when it asked).
    latest: bool,
    done: bool,
}

/// Opens `job`'s log as `request` asks. `job` must already be known visible to the caller.
/// An attempt or replica the job does not have is a validation error naming the parameter.
pub async fn open(state: &AppState, job: JobId, request: LogRequest) -> Result<LogReader> {
    let row = db::jobs::get(&state.db, job).await?.ok_or(Error::NotFound("job"))?;
    let attempt = match request.attempt {
        None => row.attempt,
        Some(a) if a >= 1 && a <= i64::from(row.attempt) => a as i32,
        Some(_) => return Err(invalid("attempt", &format!("must be an attempt of the job, 1 to {}", row.attempt))),
    };
    let replica = match request.replica {
        None => None,
        Some(r) if r >= 0 && r < i64::from(row.replicas) => Some(r as i32),
        Some(_) => {
            return Err(invalid("replica", &format!("must be a replica of the job, 0 to {}", row.replicas - 1)));
        }
    };
    let header = dropped_header(state, job, attempt, replica).await?;
    Ok(LogReader {
        state: state.clone(),
        job,
        attempt,
        replica,
        prefix: replica.is_none() && row.replicas > 1,
        timestamps: request.timestamps,
        follow: request.follow.then(|| state.feed.subscribe(&state.db)),
        after: 0,
        header,
        latest: request.attempt.is_none(),
        done: false,
    })
}

fn invalid(field: &str, message: &str) -> Error {
    Error::Validation(vec![FieldError::new(field, "invalid", message)])
}

/// A first line saying how many older lines were let go, when any were.
async fn dropped_header(state: &AppState, job: JobId, attempt: i32, replica: Option<i32>) -> Result<Option<String>> {
    let cursors = db::logs::attempt_cursors(&state.db, job, attempt).await?;
    let dropped: i64 = cursors.iter().filter(|c| replica.is_none_or(|r| r == c.replica)).map(|c| c.dropped).sum();
    Ok((dropped > 0).then(|| {
        format!("[fairway: {dropped} earlier lines of this attempt are not kept; the newest of each replica are]\n")
    }))
}

impl LogReader {
    /// The log as a stream of text chunks. It ends after the kept lines, or when following,
    /// once the attempt is over and its last lines were given; also when the process drains
    /// for shutdown, or after an error (the last item).
    pub fn stream(self) -> impl Stream<Item = Result<String>> + Send + 'static {
        futures_util::stream::unfold(self, |mut r| async move {
            match r.next().await {
                Ok(Some(chunk)) => Some((Ok(chunk), r)),
                Ok(None) => None,
                Err(e) => {
                    r.done = true;
                    Some((Err(e), r))
                }
            }
        })
    }

    async fn next(&mut self) -> Result<Option<String>> {
        if let Some(header) = self.header.take() {
            return Ok(Some(header));
        }
        loop {
            if self.done {
                return Ok(None);
            }
            let rows = db::logs::lines(&self.state.db, self.job, self.attempt, self.replica, self.after, PAGE).await?;
            if let Some(last) = rows.last() {
                self.after = last.id;
                return Ok(Some(self.text(&rows)));
            }
            let Some(feed) = self.follow.as_mut() else { return Ok(None) };
            if feed.closing() {
                return Ok(None);
            }
            let job = db::jobs::get(&self.state.db, self.job).await?;
            // A job that has not run yet: follow its first attempt once it has one.
            if let Some(job) = job.as_ref().filter(|j| self.attempt == 0 && j.attempt > 0 && self.latest) {
                self.attempt = job.attempt;
                continue;
            }
            if attempt_over(&job, self.attempt) {
                // The collector keeps an attempt's last lines before its end is recorded: one
                // more read after seeing the end gives them all.
                self.follow = None;
                continue;
            }
            if feed.changed(REREAD).await == Wake::Closing {
                return Ok(None);
            }
        }
    }

    fn text(&self, rows: &[LineRow]) -> String {
        let mut text = String::new();
        for row in rows {
            if self.timestamps {
                text.push_str(&row.at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true));
                text.push(' ');
            }
            if self.prefix {
                text.push_str(&format!("[replica {}] ", row.replica));
            }
            text.push_str(&row.line);
            text.push('\n');
        }
        text
    }
}

/// Whether the attempt can write no more: the job moved on to a later attempt, ended, was
/// requeued (it holds no GPUs, yet has run), or was deleted.
fn attempt_over(job: &Option<JobRow>, attempt: i32) -> bool {
    job.as_ref()
        .is_none_or(|job| job.attempt > attempt || job.finished_at.is_some() || (attempt > 0 && !job.holds_gpus))
}
