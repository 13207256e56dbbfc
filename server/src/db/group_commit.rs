//! Group commit of single-job submissions.
//!
//! Every submission must be durable before it is answered, and a commit costs a statement,
//! a round trip and a WAL flush. CI pipelines submit one job per request, many at once: on
//! their own, those requests spend most of the database's time on commits. Here requests
//! that arrive while earlier ones are being written queue up, and the next write stores the
//! whole queue in one statement (one commit). A request alone is written at once, so a quiet
//! service answers as fast as before; a busy one answers more requests with fewer commits.
//!
//! No request waits for a timer and none is answered before its row is committed. One
//! failing row does not fail the others: a group the database refuses is written again one
//! job at a time, and each request gets its own answer. A group whose outcome is unknown (the
//! connection failed) is not written again: that could store its jobs twice.

use crate::domain::{JobId, TeamId};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use sqlx::PgPool;
use tokio::sync::oneshot;

use super::jobs::{insert_submissions, NewJob, Stored, Submission, WriteCheck};

/// Writes in flight at once. One: while it runs, the next group gathers. Measured with
/// `fairway bench submit` on 2 cores, two writers split the groups: 4 clients got 2,326
/// jobs/s against 2,553 with one.
const MAX_WRITERS: usize = 1;
/// Jobs per statement: bounds a group's size so one write stays short.
const MAX_GROUP: usize = 256;

/// Single-job submissions, written in groups. Cheap to clone; clones share the queue.
#[derive(Clone)]
pub struct SubmissionQueue {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    queue: Mutex<Queue>,
}

#[derive(Default)]
struct Queue {
    waiting: Vec<Waiting>,
    /// Writer tasks running; each drains the queue until it finds it empty.
    writers: usize,
}

/// A submission waiting for its write.
struct Waiting {
    team_id: TeamId,
    submitted_by: String,
    job: NewJob,
    check: Option<WriteCheck>,
    reply: oneshot::Sender<Result<Option<Stored>, sqlx::Error>>,
}

impl Waiting {
    fn submission(&self) -> Submission<'_> {
        Submission { team_id: self.team_id, submitted_by: &self.submitted_by, job: &self.job, check: self.check }
    }

    /// Answers with the row stored for this job, if any: a job left out for its failed
    /// check is `None`; one left out without a check is an error.
    fn answer(self, stored: Option<Stored>) {
        let answer = match (stored, self.check) {
            (Some(s), _) => Ok(Some(s)),
            (None, Some(_)) => Ok(None),
            (None, None) => Err(sqlx::Error::RowNotFound),
        };
        let _ = self.reply.send(answer);
    }
}

impl SubmissionQueue {
    /// A queue writing to `pool`.
    pub fn new(pool: PgPool) -> Self {
        Self { inner: Arc::new(Inner { pool, queue: Mutex::default() }) }
    }

    /// Stores `job` for `team_id` with its `submitted` event; returns once it is committed,
    /// or `None` when `check` failed and nothing was stored. The write runs in its own task:
    /// a caller that stops waiting does not stop it.
    pub async fn submit(
        &self,
        team_id: TeamId,
        submitted_by: &str,
        job: NewJob,
        check: Option<WriteCheck>,
    ) -> Result<Option<Stored>, sqlx::Error> {
        let (answer, answered) = oneshot::channel();
        let start_writer = {
            let mut queue = self.inner.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.waiting.push(Waiting { team_id, submitted_by: submitted_by.to_owned(), job, check, reply: answer });
            let start = queue.writers < MAX_WRITERS;
            queue.writers += usize::from(start);
            start
        };
        if start_writer {
            tokio::spawn(write_queue(self.inner.clone()));
        }
        answered.await.unwrap_or(Err(sqlx::Error::WorkerCrashed))
    }
}

/// Writes groups until the queue is empty. The writer count drops under the same lock that
/// finds the queue empty, so a submission queued later always starts or finds a writer.
async fn write_queue(inner: Arc<Inner>) {
    loop {
        let group: Vec<Waiting> = {
            let mut queue = inner.queue.lock().unwrap_or_else(PoisonError::into_inner);
            if queue.waiting.is_empty() {
                queue.writers -= 1;
                return;
            }
            let n = queue.waiting.len().min(MAX_GROUP);
            queue.waiting.drain(..n).collect()
        };
        write_group(&inner.pool, group).await;
    }
}

/// Stores `group` in one statement and answers each submission; when the database refuses
/// the group, stores its jobs one by one so each gets its own outcome.
async fn write_group(pool: &PgPool, group: Vec<Waiting>) {
    let submissions: Vec<Submission> = group.iter().map(Waiting::submission).collect();
    let result = insert_submissions(pool, &submissions).await;
    drop(submissions);
    match result {
        Ok(stored) => {
            let mut stored: HashMap<JobId, Stored> = stored.into_iter().map(|s| (s.id, s)).collect();
            for w in group {
                let stored = stored.remove(&w.job.id);
                w.answer(stored);
            }
        }
        Err(e) if group.len() == 1 => {
            let _ = group.into_iter().next().map(|w| w.reply.send(Err(e)));
        }
        // The database refused the statement, so nothing of it was stored: each job is tried
        // on its own.
        Err(sqlx::Error::Database(_)) => {
            for w in group {
                match insert_submissions(pool, &[w.submission()]).await {
                    Ok(stored) => {
                        let stored = stored.into_iter().next();
                        w.answer(stored);
                    }
                    Err(e) => {
                        let _ = w.reply.send(Err(e));
                    }
                }
            }
        }
        // The statement may or may not have committed (the connection failed on the way):
        // writing the jobs again could store them twice, so each request gets the failure.
        Err(e) => {
            let message = e.to_string();
            for w in group {
                let _ = w.reply.send(Err(sqlx::Error::Io(std::io::Error::other(message.clone()))));
            }
        }
    }
}
