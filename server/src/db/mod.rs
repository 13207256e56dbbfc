//! All SQL of the service. Every query is checked at compile time against the schema
//! (`.sqlx/` holds the offline data so builds need no database). Tenant-owned rows are read
//! with their team as an explicit argument.

pub mod arrays;
pub mod attempts;
pub mod audit;
pub mod bench;
pub mod billing;
pub mod budgets;
pub mod ci_trusts;
pub mod clusters;
pub mod decisions;
pub mod dependencies;
pub mod embedded;
pub mod forecast;
pub mod gpu_classes;
pub mod group_commit;
pub mod health;
pub mod idempotency;
pub mod identities;
pub mod idle;
pub mod inventory;
pub mod jobs;
pub mod leader;
pub mod logs;
pub mod members;
pub mod metering;
pub mod outbox;
pub mod priority_classes;
pub mod quotas;
pub mod schema;
pub mod services;
pub mod sim;
pub mod snapshot;
pub mod teams;
pub mod templates;
pub mod tokens;
pub mod users;
pub mod utilisation;
pub mod web_sessions;
pub mod webhooks;

use std::time::Duration;

use sqlx::{migrate::Migrator, postgres::PgPoolOptions, PgPool, Postgres, Transaction};

/// The schema migrations, embedded in the binary; each has an `up` and a `down`.
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// A transaction on the service's database.
pub type Tx<'a> = Transaction<'a, Postgres>;

/// Opens a read-only transaction that sees the database at one instant (repeatable read):
/// what a caller reads in several statements agrees, as if read in one.
pub async fn read_snapshot(pool: &PgPool) -> Result<Tx<'static>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query!("set transaction isolation level repeatable read, read only").execute(&mut *tx).await?;
    Ok(tx)
}

/// Opens a connection pool.
pub async fn connect(options: sqlx::postgres::PgConnectOptions, max_connections: u32) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(5))
        // No ping on every checkout: that doubled the round trips of a submission. A
        // connection the database dropped fails its next query with an I/O error instead
        // (503 to an API client, a retry in the control loop) and leaves the pool.
        .test_before_acquire(false)
        .connect_with(options)
        .await
}

/// True when the database answers a trivial query.
pub async fn ping(pool: &PgPool) -> bool {
    sqlx::query!("select 1 as one").fetch_one(pool).await.is_ok()
}

/// True when `error` means the database cannot serve right now (connection refused or lost,
/// pool exhausted or closed, server starting or shutting down, out of disk, memory or
/// connections) or rolled the transaction back whole because of a concurrent one (a deadlock
/// or a serialization failure), as opposed to a query that failed: the first is a 503 worth
/// retrying, with nothing half-written, the second a bug.
pub fn is_unavailable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_) | sqlx::Error::Tls(_) => true,
        sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(e) => e.code().is_some_and(|code| {
            // Class 08: connection exception; class 53: insufficient resources (disk full,
            // out of memory, too many connections); 57P01-03: admin or crash shutdown,
            // cannot connect now; 40001 and 40P01: serialization failure and deadlock, the
            // transaction rolled back and the same request will go through.
            code.starts_with("08")
                || code.starts_with("53")
                || matches!(&*code, "57P01" | "57P02" | "57P03" | "40001" | "40P01")
        }),
        _ => false,
    }
}
