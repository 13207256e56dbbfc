//! Leadership of the control loop: the leader record with its epoch, renewed as a lease,
//! and the check every control-loop write makes first ([`check_epoch`]), so a leader that
//! lost its leadership while paused commits nothing.

use sqlx::PgConnection;

use super::Tx;

/// Records `holder` as leader with a new epoch; run on the connection holding the lock.
///
/// The row is first locked `for update`, the one lock [`check_epoch`]'s `for key share`
/// conflicts with: the takeover waits for the old leader's writes in flight, and a write that
/// begins after it waits for the new epoch and then sees it.
pub async fn take_leadership(conn: &mut PgConnection, holder: &str) -> Result<i64, sqlx::Error> {
    use sqlx::Connection as _;
    let mut tx = conn.begin().await?;
    sqlx::query!("select id from scheduler_leader where id = 1 for update").fetch_optional(&mut *tx).await?;
    let epoch = sqlx::query_scalar!(
        "insert into scheduler_leader (id, epoch, holder, backend_pid, acquired_at, heartbeat_at)
         values (1, 1, $1, pg_backend_pid(), now(), now())
         on conflict (id) do update
         set epoch = scheduler_leader.epoch + 1, holder = $1, backend_pid = pg_backend_pid(),
             acquired_at = now(), heartbeat_at = now()
         returning epoch",
        holder
    )
    .fetch_one(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(epoch)
}

/// Renews the lease; false when another leader took over. Touches no key column, so its row
/// lock (`for no key update`) does not wait for the leader's own cycles, which hold the row
/// `for key share`: a long cycle never delays the lease past its expiry.
pub async fn heartbeat(conn: &mut PgConnection, epoch: i64) -> Result<bool, sqlx::Error> {
    let r = sqlx::query!("update scheduler_leader set heartbeat_at = now() where id = 1 and epoch = $1", epoch)
        .execute(conn)
        .await?;
    Ok(r.rows_affected() == 1)
}

/// The current leader: holder, epoch, and how many seconds ago it last renewed its lease.
pub struct LeaderRow {
    pub holder: String,
    pub epoch: i64,
    pub backend_pid: i32,
    pub silent_seconds: f64,
}

/// The leader record, if any leader ever ran.
pub async fn leader(conn: &mut PgConnection) -> Result<Option<LeaderRow>, sqlx::Error> {
    sqlx::query_as!(
        LeaderRow,
        r#"select holder, epoch, backend_pid,
                  extract(epoch from now() - heartbeat_at)::float8 as "silent_seconds!"
           from scheduler_leader where id = 1"#
    )
    .fetch_optional(conn)
    .await
}

/// Ends every session of a leader whose lease ran out (it is paused or partitioned): its
/// advisory lock and any open transaction go with them.
pub async fn evict(conn: &mut PgConnection, holder: &str, backend_pid: i32) -> Result<u64, sqlx::Error> {
    let n = sqlx::query_scalar!(
        r#"select count(*) filter (where pg_terminate_backend(pid)) as "n!"
           from pg_stat_activity
           where pid <> pg_backend_pid() and (pid = $2 or application_name = $1)"#,
        holder,
        backend_pid
    )
    .fetch_one(conn)
    .await?;
    Ok(n as u64)
}

/// True when `epoch` is still the leader's. Takes a key-share lock on the leader row, so a
/// takeover (which locks it `for update` first) waits for this transaction, and this
/// transaction sees a takeover that committed first. The weakest lock that fences: the
/// leader's heartbeat does not conflict with it.
pub async fn check_epoch(tx: &mut Tx<'_>, epoch: i64) -> Result<bool, sqlx::Error> {
    let current = sqlx::query_scalar!("select epoch from scheduler_leader where id = 1 for key share")
        .fetch_optional(&mut **tx)
        .await?;
    Ok(current == Some(epoch))
}
