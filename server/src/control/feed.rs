//! Telling the open event streams (`GET /api/v1/jobs/{job}/events:stream`) that jobs' timelines
//! grew, and followed logs (`GET /api/v1/jobs/{job}/logs?follow=true`) that lines were kept.
//! Events and lines are written by whichever replica leads, dispatches or serves a cancel, so
//! a stream cannot learn of them from its own process. Rather than a `NOTIFY` per write (a
//! notifying transaction holds a global lock through its commit, and the cycle writes
//! thousands of events in one), one task per process reads the newest event id and the
//! newest log line id while any stream is open, every [`POLL`], and wakes every stream when
//! either moved; each stream then reads its own job's. An idle process reads nothing.
//!
//! The feed also ends the streams when the process drains for shutdown: a stream would
//! otherwise hold its connection, and the graceful shutdown with it, until its job ended.
//! Clients reconnect with the last event id they saw.

use std::{
    sync::{Arc, OnceLock},
    time::Duration,
};

use sqlx::PgPool;
use tokio::sync::watch;

use crate::db;

/// How often the newest event id is read while a stream is open: the longest a stream
/// waits to see an event, and one indexed read per process per interval.
pub const POLL: Duration = Duration::from_millis(250);

/// Wakes event streams when any job's timeline grew; cheap to clone.
#[derive(Clone)]
pub struct EventFeed {
    /// The newest event id and log line id seen; streams wait for them to change.
    newest: Arc<watch::Sender<(i64, i64)>>,
    /// Set once the process drains: streams end.
    closing: Arc<watch::Sender<bool>>,
    /// The polling task, started by the first stream (inside the runtime).
    started: Arc<OnceLock<()>>,
}

impl Default for EventFeed {
    fn default() -> Self {
        Self {
            newest: Arc::new(watch::Sender::new((0, 0))),
            closing: Arc::new(watch::Sender::new(false)),
            started: Arc::default(),
        }
    }
}

/// One stream's view of the feed.
pub struct Subscription {
    newest: watch::Receiver<(i64, i64)>,
    closing: watch::Receiver<bool>,
}

/// Why [`Subscription::changed`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Some job's timeline or log may have grown (or the wait timed out): read again.
    Read,
    /// The process is draining: end the stream.
    Closing,
}

impl EventFeed {
    /// Subscribes a stream, starting the polling task if this is the first.
    pub fn subscribe(&self, pool: &PgPool) -> Subscription {
        self.started.get_or_init(|| {
            tokio::spawn(poll(pool.clone(), self.newest.clone()));
        });
        Subscription { newest: self.newest.subscribe(), closing: self.closing.subscribe() }
    }

    /// Ends every stream, now and to come: the process is draining.
    pub fn close(&self) {
        self.closing.send_replace(true);
    }
}

impl Subscription {
    /// Waits until the newest event or log line id moves, the process drains, or `at_most` passes (a
    /// read then costs little and covers a poll that failed).
    pub async fn changed(&mut self, at_most: Duration) -> Wake {
        if *self.closing.borrow_and_update() {
            return Wake::Closing;
        }
        tokio::select! {
            _ = self.newest.changed() => Wake::Read,
            _ = self.closing.changed() => Wake::Closing,
            () = tokio::time::sleep(at_most) => Wake::Read,
        }
    }

    /// Whether the process is draining.
    pub fn closing(&self) -> bool {
        *self.closing.borrow()
    }
}

async fn poll(pool: PgPool, newest: Arc<watch::Sender<(i64, i64)>>) {
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if newest.receiver_count() == 0 {
            continue;
        }
        let read = async {
            Ok::<_, sqlx::Error>((db::jobs::newest_event_id(&pool).await?, db::logs::newest_line_id(&pool).await?))
        };
        match read.await {
            Ok(ids) => {
                newest.send_if_modified(|seen| std::mem::replace(seen, ids) != ids);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the newest job event or log line; streams wait for the next poll");
            }
        }
    }
}
