//! The log collector: reads what running attempts wrote from their backends and keeps the
//! tail of every replica's log per attempt in the database, where the API serves it from
//! (`GET /jobs/{job}/logs`). Clusters delete finished pods and cloud logs expire; a failed
//! attempt's log must still be readable a week later, and readers must never reach a
//! backend themselves.
//!
//! - Every [`ControlConfig::log_interval`](super::ControlConfig::log_interval) the leader
//!   reads each running attempt's new lines ([`run`]).
//! - When an attempt ends, the reconciler reads its last lines before it records the end and
//!   deletes the object ([`collect`] with `last`), so a client that sees the job end finds
//!   its whole log; the replica's cursor is then complete.
//!
//! Each replica's cursor is the newest kept line's time and how many kept lines carry exactly
//! that time: backends filter by time, so the next read asks from that instant and skips the
//! lines it already has ([`fresh`]). A line is cut at [`LINE_BYTES`], and a replica keeps its
//! newest [`ControlConfig::log_tail_lines`](super::ControlConfig::log_tail_lines), counting
//! the ones it let go.

use std::{collections::HashMap, time::Duration};

use chrono::{DateTime, Utc};
use futures_util::{stream, StreamExt as _};

use super::{leader_tx, ControlError, Ctx};
use crate::{
    backends::{object_name, within, Backend, BackendError, LogLine, LogQuery},
    db::{
        self,
        logs::{Appended, Cursor, LogKey},
    },
    domain::JobId,
};

/// The longest line kept, in bytes; longer ones are cut at a character boundary and marked.
pub const LINE_BYTES: usize = 4096;

/// Lines asked of a backend in one read.
const PAGE: usize = 1_000;

/// Reads of an ended attempt's last lines, per replica: a replica that wrote faster than the
/// collector read still has its end kept, up to this many pages.
const LAST_PAGES: usize = 20;

/// Backend reads in flight at once per pass, for the pages after the first.
const CONCURRENT_READS: usize = 8;

/// Replicas whose first page one [`Backend::logs_many`] call asks for: the simulated cluster
/// answers them in one statement; a backend that reads them one by one does
/// [`crate::backends::LOG_READS_AT_ONCE`] at a time, each within [`READ_TIMEOUT`].
const ASKS_PER_CALL: usize = 256;

/// The longest one backend read may take: a slow log service must not hold up the
/// reconciler, which reads ended attempts' last lines before it records their ends.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// An attempt whose log to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub job_id: JobId,
    pub attempt: i32,
    pub replicas: i32,
    /// The attempt ended: read to the end and mark its replicas complete.
    pub last: bool,
}

/// What a pass read, per attempt.
#[derive(Debug, Default)]
pub struct Collected {
    /// Lines kept.
    pub lines: usize,
    /// Attempts of which a replica could not be read (the backend failed or timed out).
    pub failed: Vec<(JobId, i32)>,
}

/// Reads every running attempt's new lines, every log interval, until leadership is lost.
pub async fn run(ctx: Ctx, epoch: i64) {
    let mut tick = tokio::time::interval(ctx.config.log_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for (cluster, backend) in ctx.backends.iter() {
            let targets = match db::logs::running_attempts(&ctx.pool, cluster).await {
                Ok(running) => running
                    .into_iter()
                    .map(|r| Target { job_id: r.job_id, attempt: r.attempt, replicas: r.replicas, last: false })
                    .collect::<Vec<_>>(),
                Err(e) => {
                    tracing::warn!(cluster, error = %e, "cannot list running attempts for their logs");
                    continue;
                }
            };
            match collect(&ctx, epoch, backend.as_ref(), &targets).await {
                Ok(collected) if !collected.failed.is_empty() => {
                    tracing::debug!(cluster, failed = collected.failed.len(), "some logs could not be read");
                }
                Ok(_) => {}
                Err(ControlError::NotLeader) => return,
                Err(e) => tracing::warn!(cluster, error = %e, "collecting logs failed; the next pass reads again"),
            }
        }
    }
}

/// Reads the last lines of attempts whose objects finished, before the reconciler records
/// their ends and deletes the objects. Returns the attempts of which a replica could not be
/// read: the reconciler keeps those objects for one more pass, which reads again.
pub async fn read_last(
    ctx: &Ctx,
    epoch: i64,
    backend: &dyn Backend,
    ended: &[(JobId, i32)],
) -> Result<Vec<(JobId, i32)>, ControlError> {
    if ended.is_empty() {
        return Ok(Vec::new());
    }
    let jobs: Vec<JobId> = ended.iter().map(|e| e.0).collect();
    let replicas: HashMap<JobId, i32> = db::logs::replica_counts(&ctx.pool, &jobs).await?.into_iter().collect();
    let targets: Vec<Target> = ended
        .iter()
        .filter_map(|&(job_id, attempt)| {
            let replicas = *replicas.get(&job_id)?;
            Some(Target { job_id, attempt, replicas, last: true })
        })
        .collect();
    Ok(collect(ctx, epoch, backend, &targets).await?.failed)
}

/// Reads the targets' new lines from `backend` and keeps them. A replica whose read fails is
/// left for the next pass and its attempt reported in [`Collected::failed`]; a replica whose
/// cursor moved while it was read (another collector kept those lines) is read again.
pub async fn collect(
    ctx: &Ctx,
    epoch: i64,
    backend: &dyn Backend,
    targets: &[Target],
) -> Result<Collected, ControlError> {
    let mut collected = Collected::default();
    let last: HashMap<(JobId, i32), bool> = targets.iter().map(|t| ((t.job_id, t.attempt), t.last)).collect();
    let mut keys: Vec<LogKey> = targets
        .iter()
        .flat_map(|t| (0..t.replicas.max(1)).map(move |replica| (t.job_id, t.attempt, replica)))
        .collect();
    // A cursor that moved under a read is read once more; a third time it waits for the next pass.
    for _ in 0..2 {
        if keys.is_empty() {
            break;
        }
        let known: HashMap<LogKey, Cursor> = db::logs::cursors(&ctx.pool, &keys)
            .await?
            .into_iter()
            .map(|c| ((c.job_id, c.attempt, c.replica), c))
            .collect();
        let asks: Vec<(LogKey, Position, bool)> = keys
            .iter()
            .filter_map(|key| {
                let cursor = known.get(key);
                let from = cursor.map_or_else(Position::default, Position::of);
                let last = last.get(&(key.0, key.1)).copied().unwrap_or(false);
                (!cursor.is_some_and(|c| c.complete)).then_some((*key, from, last))
            })
            .collect();
        let reads = read_all(backend, asks).await;
        let mut tx = leader_tx(&ctx.pool, epoch).await?;
        let read_keys: Vec<LogKey> = reads.iter().map(|r| r.0).collect();
        let locked: HashMap<LogKey, Cursor> = db::logs::lock_cursors(&mut tx, &read_keys)
            .await?
            .into_iter()
            .map(|c| ((c.job_id, c.attempt, c.replica), c))
            .collect();
        let mut appended = Vec::new();
        let mut again = Vec::new();
        for (key, from, read) in reads {
            let (kept, to) = match read {
                Ok(read) => read,
                Err(e) => {
                    tracing::debug!(job = %key.0, attempt = key.1, replica = key.2, error = %e, "reading a log failed");
                    collected.failed.push((key.0, key.1));
                    continue;
                }
            };
            // Gone with its job, or moved by another collector since it was read.
            let Some(now) = locked.get(&key) else { continue };
            if now.complete {
                continue;
            }
            if Position::of(now) != from {
                again.push(key);
                continue;
            }
            collected.lines += kept.len();
            appended.push(Appended {
                key,
                lines: kept,
                read_to: to.at,
                read_at_to: to.count,
                complete: last.get(&(key.0, key.1)).copied().unwrap_or(false),
            });
        }
        db::logs::append(&mut tx, &appended, i64::from(ctx.config.log_tail_lines)).await?;
        tx.commit().await?;
        keys = again;
    }
    for key in keys {
        collected.failed.push((key.0, key.1));
    }
    collected.failed.sort_unstable();
    collected.failed.dedup();
    Ok(collected)
}

/// New lines of one replica and the position after them.
type Read = (Vec<(DateTime<Utc>, String)>, Position);

/// Reads each ask's replica's new lines after its position: the first page of every one
/// through [`Backend::logs_many`], [`ASKS_PER_CALL`] a call, then, for an ended attempt's
/// replica whose page came back full, more pages one by one (at most [`LAST_PAGES`]).
async fn read_all(
    backend: &dyn Backend,
    asks: Vec<(LogKey, Position, bool)>,
) -> Vec<(LogKey, Position, Result<Read, BackendError>)> {
    let mut firsts = Vec::with_capacity(asks.len());
    for chunk in asks.chunks(ASKS_PER_CALL) {
        let queries: Vec<LogQuery> = chunk.iter().map(|(key, from, _)| query(*key, from)).collect();
        firsts.extend(backend.logs_many(&queries, READ_TIMEOUT).await);
    }
    stream::iter(asks.into_iter().zip(firsts))
        .map(|((key, from, last), first)| async move {
            let read = match first {
                Ok(page) => read_on(backend, key, from.clone(), page, last).await,
                Err(e) => Err(e),
            };
            (key, from, read)
        })
        .buffer_unordered(CONCURRENT_READS)
        .collect()
        .await
}

/// The query for one replica's lines after `from`.
fn query(key: LogKey, from: &Position) -> LogQuery {
    let (job, attempt, replica) = key;
    LogQuery {
        object: object_name(job, attempt),
        replica: u32::try_from(replica).unwrap_or(0),
        since: from.at,
        limit: PAGE,
    }
}

/// One replica's new lines from its first `page`, read after `from`, and, for an ended
/// attempt (`last`) while the pages come back full, the pages after it.
async fn read_on(
    backend: &dyn Backend,
    key: LogKey,
    from: Position,
    mut page: Vec<LogLine>,
    last: bool,
) -> Result<Read, BackendError> {
    let mut query = query(key, &from);
    let mut lines = Vec::new();
    let mut position = from;
    for pages in 1.. {
        let full = page.len() >= query.limit;
        let (new, to) = fresh(&position, page);
        if new.is_empty() {
            break;
        }
        lines.extend(new);
        position = to;
        if !full || !last || pages >= LAST_PAGES {
            break;
        }
        query.since = position.at;
        page = within(READ_TIMEOUT, backend.logs(&query)).await?;
    }
    Ok((lines, position))
}

/// Where a replica's log was read to: the newest kept line's time and how many kept lines
/// carry exactly that time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Position {
    pub at: Option<DateTime<Utc>>,
    pub count: i32,
}

impl Position {
    fn of(cursor: &Cursor) -> Self {
        Self { at: cursor.read_to, count: cursor.read_at_to }
    }
}

/// The lines of a read that are new after `from`, made storable (cut at [`LINE_BYTES`], NUL
/// replaced: PostgreSQL text cannot hold it), and the position after them. A backend answers
/// from the cursor's instant (or, filtering by whole seconds, from before it), so lines older
/// than the instant are repeats, and so are as many lines at the instant as were kept.
pub fn fresh(from: &Position, mut lines: Vec<LogLine>) -> (Vec<(DateTime<Utc>, String)>, Position) {
    // Stable: lines of one instant keep the order the backend gave.
    lines.sort_by_key(|l| l.at);
    let mut to = from.clone();
    let mut skip = from.count;
    let mut kept = Vec::new();
    for line in lines {
        if let Some(at) = from.at {
            if line.at < at {
                continue;
            }
            if line.at == at && skip > 0 {
                skip -= 1;
                continue;
            }
        }
        if to.at == Some(line.at) {
            to.count += 1;
        } else {
            to = Position { at: Some(line.at), count: 1 };
        }
        kept.push((line.at, storable(line.text)));
    }
    (kept, to)
}

/// A line as the database keeps it.
fn storable(mut text: String) -> String {
    if text.contains('\0') {
        text = text.replace('\0', "\u{fffd}");
    }
    if text.len() > LINE_BYTES {
        let mut end = LINE_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(" [line cut at 4 KiB]");
    }
    text
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone as _;

    use super::*;

    fn at(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_780_000_000 + s, 0).unwrap()
    }

    fn line(s: i64, text: &str) -> LogLine {
        LogLine { at: at(s), text: text.into() }
    }

    fn texts(kept: &[(DateTime<Utc>, String)]) -> Vec<&str> {
        kept.iter().map(|(_, t)| t.as_str()).collect()
    }

    #[test]
    fn a_first_read_keeps_every_line_and_counts_those_at_the_newest_instant() {
        let (kept, to) = fresh(&Position::default(), vec![line(1, "a"), line(2, "b"), line(2, "c")]);
        assert_eq!(texts(&kept), ["a", "b", "c"]);
        assert_eq!(to, Position { at: Some(at(2)), count: 2 });
    }

    #[test]
    fn a_read_from_the_cursor_skips_the_lines_already_kept_at_its_instant() {
        let from = Position { at: Some(at(2)), count: 2 };
        // A backend filtering by whole seconds answers from second 2 again, and earlier.
        let (kept, to) = fresh(&from, vec![line(1, "a"), line(2, "b"), line(2, "c"), line(2, "d"), line(3, "e")]);
        assert_eq!(texts(&kept), ["d", "e"]);
        assert_eq!(to, Position { at: Some(at(3)), count: 1 });
    }

    #[test]
    fn new_lines_at_the_cursors_instant_add_to_its_count() {
        let from = Position { at: Some(at(2)), count: 1 };
        let (kept, to) = fresh(&from, vec![line(2, "b"), line(2, "c")]);
        assert_eq!(texts(&kept), ["c"]);
        assert_eq!(to, Position { at: Some(at(2)), count: 2 });
    }

    #[test]
    fn a_read_with_nothing_new_leaves_the_cursor_where_it_was() {
        let from = Position { at: Some(at(2)), count: 1 };
        let (kept, to) = fresh(&from, vec![line(1, "a"), line(2, "b")]);
        assert!(kept.is_empty());
        assert_eq!(to, from);
    }

    #[test]
    fn lines_out_of_order_are_kept_in_time_order() {
        let (kept, _) = fresh(&Position::default(), vec![line(3, "c"), line(1, "a"), line(2, "b")]);
        assert_eq!(texts(&kept), ["a", "b", "c"]);
    }

    #[test]
    fn a_long_line_is_cut_at_a_character_boundary_and_says_so() {
        let long = "é".repeat(LINE_BYTES);
        let (kept, _) = fresh(&Position::default(), vec![line(1, &long), line(2, "a\0b")]);
        assert!(kept[0].1.len() <= LINE_BYTES + 32);
        assert!(kept[0].1.ends_with("[line cut at 4 KiB]"), "{}", &kept[0].1[kept[0].1.len() - 40..]);
        assert!(kept[0].1.starts_with("éé"));
        assert_eq!(kept[1].1, "a\u{fffd}b");
    }
}
