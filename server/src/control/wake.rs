//! Waking the scheduler from request handlers. A submission commits first, then pokes; one
//! task per process turns pokes into `NOTIFY`s, and pokes that arrive while one is being
//! sent are folded into the next, so a burst of a thousand submissions costs a handful of
//! notifications and no submission waits for one.
//!
//! A poke lost to a crash between the commit and the notification delays the job until
//! the next timed cycle, never longer.

use std::sync::{Arc, OnceLock};

use sqlx::PgPool;
use tokio::sync::Notify;

use crate::db;

/// Pokes the scheduler; cheap to clone and to call.
#[derive(Clone, Default)]
pub struct SchedulerWake {
    poked: Arc<Notify>,
    /// The notifying task, started by the first poke (inside the runtime).
    started: Arc<OnceLock<()>>,
}

impl SchedulerWake {
    /// Asks for a scheduling cycle soon; returns at once.
    pub fn poke(&self, pool: &PgPool) {
        self.started.get_or_init(|| {
            tokio::spawn(notify_loop(pool.clone(), self.poked.clone()));
        });
        self.poked.notify_one();
    }
}

async fn notify_loop(pool: PgPool, poked: Arc<Notify>) {
    loop {
        poked.notified().await;
        if let Err(e) = db::jobs::wake_scheduler(&pool).await {
            tracing::warn!(error = %e, "cannot wake the scheduler; the next timed cycle will see the work");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
}
