//! The array pass: where tasks an array's parallelism held back are released. Each
//! scheduling cycle, after the dependency pass and before the snapshot is read, one
//! transaction checks the leader's epoch and releases, for each array holding tasks, as
//! many as its parallelism has room for (the tasks under way count against it), lowest
//! index first, each with a `released` event. Released tasks join this cycle's snapshot.

use super::ControlError;
use crate::db::{self, jobs::NewEvent};

/// The reason a task held back by its array's parallelism shows.
pub const ARRAY_TASK_LIMIT: &str = "array_task_limit";

/// What a pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Released {
    pub released: usize,
    /// Tasks still held back.
    pub held: u64,
}

impl Released {
    /// The tasks left held, under their reason code: the part of the pending reasons gauge
    /// the engine does not see.
    pub fn pending_by_reason(&self) -> [(&'static str, u64); 1] {
        [(ARRAY_TASK_LIMIT, self.held)]
    }
}

/// Runs the pass as the leader of `epoch`; a cycle calls it when `db::snapshot::passes_due`
/// says it has something to do.
pub async fn release(pool: &sqlx::PgPool, epoch: i64) -> Result<Released, ControlError> {
    let mut tx = pool.begin().await?;
    if !db::leader::check_epoch(&mut tx, epoch).await? {
        return Err(ControlError::NotLeader);
    }
    let (released, held) = db::arrays::release(&mut tx).await?;
    let events: Vec<NewEvent> = released
        .iter()
        .map(|t| NewEvent {
            job_id: t.job_id,
            attempt: t.attempt,
            kind: "released",
            reason: None,
            message: format!(
                "released by its array: task {} of {} (at most {} at once)",
                t.index, t.task_count, t.parallelism
            ),
            data: None,
        })
        .collect();
    db::jobs::add_events(&mut tx, &events).await?;
    tx.commit().await?;
    Ok(Released { released: released.len(), held: u64::try_from(held).unwrap_or_default() })
}
