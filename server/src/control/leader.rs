//! Leader election: exactly one scheduler across any number of replicas.
//!
//! The leader holds a session-level PostgreSQL advisory lock on a dedicated connection and
//! the `scheduler_leader` row's epoch, which it bumps on taking over and renews (a
//! heartbeat) every fifth of the lease. A crashed leader's connection closes, the lock goes
//! with it and a standby takes over at its next try. A *paused* leader (stopped, swapped out,
//! partitioned) keeps its connection and lock; once its heartbeat is older than the lease, a
//! standby ends every session of that leader (`pg_terminate_backend`, matched by the
//! application name each process sets), which releases the lock and rolls back whatever it
//! had open, and takes over with a new epoch. Should the old leader resume, every write it
//! attempts checks the epoch first and fails: it commits nothing.

use std::time::Duration;

use sqlx::{postgres::PgConnectOptions, Connection as _, PgConnection};
use tokio::sync::watch;

use crate::db;

/// The advisory lock key: "fairway\0" as a big-endian integer.
const LOCK_KEY: i64 = 0x6661_6972_7761_7900;

/// Publishes `Some(epoch)` while this process leads and `None` otherwise, until the
/// receiving side is gone.
pub async fn run(options: PgConnectOptions, holder: String, lease: Duration, leading: watch::Sender<Option<i64>>) {
    let tick = lease / 5;
    // Contends for as long as the scheduler that receives the answer exists.
    while !leading.is_closed() {
        match PgConnection::connect_with(&options.clone().application_name(&holder)).await {
            Ok(mut conn) => {
                if let Err(e) = contend(&mut conn, &holder, lease, &leading).await {
                    tracing::warn!(error = %e, "leader election connection failed");
                }
                let _ = leading.send(None);
                let _ = conn.close().await;
            }
            Err(e) => tracing::warn!(error = %e, "cannot connect for leader election"),
        }
        tokio::time::sleep(tick).await;
    }
}

async fn contend(
    conn: &mut PgConnection,
    holder: &str,
    lease: Duration,
    leading: &watch::Sender<Option<i64>>,
) -> Result<(), sqlx::Error> {
    let tick = lease / 5;
    loop {
        let locked = sqlx::query_scalar!("select pg_try_advisory_lock($1)", LOCK_KEY).fetch_one(&mut *conn).await?;
        if locked == Some(true) {
            let epoch = db::leader::take_leadership(conn, holder).await?;
            tracing::info!(epoch, holder, "leading the scheduler");
            let _ = leading.send(Some(epoch));
            loop {
                tokio::time::sleep(tick).await;
                if leading.is_closed() {
                    // The scheduler stopped: closing the connection gives the lock up.
                    return Ok(());
                }
                if !db::leader::heartbeat(conn, epoch).await? {
                    tracing::warn!(epoch, "another scheduler took over; standing by");
                    return Ok(());
                }
            }
        }
        if let Some(current) = db::leader::leader(conn).await? {
            if current.holder != holder && current.silent_seconds > lease.as_secs_f64() {
                let ended = db::leader::evict(conn, &current.holder, current.backend_pid).await?;
                tracing::warn!(
                    stale = %current.holder,
                    silent_seconds = current.silent_seconds,
                    sessions = ended,
                    "the leader stopped renewing its lease; ending its sessions to take over"
                );
                continue;
            }
        }
        tokio::time::sleep(tick).await;
        if leading.is_closed() {
            return Ok(());
        }
    }
}
