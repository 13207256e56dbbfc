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
//! job at a time, and each request gets its own answer.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use sqlx::PgPool;
use tokio::sync::oneshot;
use uuid::Uuid;

use super::jobs::{insert_submissions, NewJob, Stored, Submission};

/// Writes in flight at once. Two keep a 2-core database busy while the next group gathers;
/// more would only split groups and add commits.
const MAX_WRITERS: usize = 2;
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
    team_id: Uuid,
    submitted_by: String,
    job: NewJob,
    answer: oneshot::Sender<Result<Stored, sqlx::Error>>,
}

impl SubmissionQueue {
    /// A queue writing to `pool`.
    pub fn new(pool: PgPool) -> Self {
        Self { inner: Arc::new(Inner { pool, queue: Mutex::default() }) }
    }

    /// Stores `job` for `team_id` with its `submitted` event; returns once it is committed.
    /// The write runs in its own task: a caller that stops waiting does not stop it.
    pub async fn submit(&self, team_id: Uuid, submitted_by: &str, job: NewJob) -> Result<Stored, sqlx::Error> {
        let (answer, answered) = oneshot::channel();
        let start_writer = {
            let mut queue = self.inner.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.waiting.push(Waiting { team_id, submitted_by: submitted_by.to_owned(), job, answer });
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
    let submissions: Vec<Submission> =
        group.iter().map(|w| Submission { team_id: w.team_id, submitted_by: &w.submitted_by, job: &w.job }).collect();
    let result = insert_submissions(pool, &submissions).await;
    drop(submissions);
    match result {
        Ok(stored) => {
            let mut stored: HashMap<Uuid, Stored> = stored.into_iter().map(|s| (s.id, s)).collect();
            for w in group {
                let _ = w.answer.send(stored.remove(&w.job.id).ok_or(sqlx::Error::RowNotFound));
            }
        }
        Err(e) if group.len() == 1 => {
            let _ = group.into_iter().next().map(|w| w.answer.send(Err(e)));
        }
        Err(_) => {
            for w in group {
                let one = Submission { team_id: w.team_id, submitted_by: &w.submitted_by, job: &w.job };
                let result = insert_submissions(pool, &[one])
                    .await
                    .and_then(|stored| stored.into_iter().next().ok_or(sqlx::Error::RowNotFound));
                let _ = w.answer.send(result);
            }
        }
    }
}
