//! A whole Fairway for an end-to-end benchmark: a durable embedded PostgreSQL (fsync on, as
//! `fairway serve` runs it) in a scratch directory, the HTTP service on a loopback port, and
//! optionally the control loop on a simulated cluster. Everything runs in this process, so
//! the figures are those of one machine doing all of it.

use crate::domain::{TeamId, UserId};
use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context as _;
use sqlx::PgPool;
use uuid::Uuid;

use crate::{
    auth::api_token,
    config::{Config, Secret},
    control,
    db::{
        self,
        embedded::{EmbeddedPostgres, Tuning},
    },
    serve,
    state::AppState,
};

/// How to run the platform under test.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The simulated cluster (TOML); the built-in inventory when `None`. Its nodes are
    /// always synced into the catalogue, so submissions validate against them.
    pub sim_inventory: Option<String>,
    /// Run the control loop (scheduling, dispatch, reconciliation); off measures the API alone.
    pub control: bool,
    /// Changes to the service configuration (timings, preemption rules).
    pub tune: Option<fn(&mut Config)>,
    /// Loads `pg_stat_statements` into the database, to show where its time goes.
    pub statement_stats: bool,
}

/// A running platform. [`Platform::stop`] removes everything it created.
pub struct Platform {
    /// `http://127.0.0.1:<port>/api/v1`.
    pub api: String,
    /// The service's own pool, for seeding and for reading results.
    pub pool: PgPool,
    /// How to open more connections to the same database.
    pub options: sqlx::postgres::PgConnectOptions,
    /// The platform admin's id, for what seeding records as its author.
    pub admin: UserId,
    keys: std::sync::Arc<crate::auth::jwt::JwtKeys>,
    server: tokio::task::JoinHandle<()>,
    control: Option<tokio::task::JoinHandle<()>>,
    postgres: EmbeddedPostgres,
    dir: PathBuf,
}

impl Platform {
    /// Starts PostgreSQL, migrates, and serves the API on a free loopback port.
    pub async fn start(options: Options) -> anyhow::Result<Self> {
        let dir =
            std::env::temp_dir().join(format!("fairway-bench-{}-{:08x}", std::process::id(), rand::random::<u32>()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let tuning = Tuning { statement_stats: options.statement_stats, ..Tuning::DURABLE };
        let postgres = EmbeddedPostgres::start(&dir.join("postgres"), tuning).await?;
        postgres.create_database("fairway", None).await?;
        let connect = postgres.connect_options("fairway").application_name("fairway-bench");
        let pool = db::connect(connect.clone(), 20).await?;
        db::MIGRATOR.run(&pool).await.context("applying migrations")?;
        if options.statement_stats {
            db::bench::track_statements(&pool).await.context("creating pg_stat_statements")?;
        }

        let mut config = Config {
            data_dir: dir.clone(),
            admin_password: Some(Secret::new(format!("bench-{}", Uuid::new_v4()))),
            scheduler: options.control,
            ..Config::default()
        };
        if let Some(inventory) = &options.sim_inventory {
            let path = dir.join("inventory.toml");
            std::fs::write(&path, inventory)?;
            config.sim_inventory = Some(path);
        }
        if let Some(tune) = options.tune {
            tune(&mut config);
        }
        serve::bootstrap_admin(&pool, &config).await?;
        let admin = db::users::by_username(&pool, "admin").await?.context("the admin was not created")?.id;
        let key: [u8; 32] = rand::random();
        let state = AppState::new(pool.clone(), config, &key)?;
        let keys = state.keys.clone();
        let ctx = serve::control_context(&state).await?;
        control::sync_inventory(&ctx).await.context("reading the simulated inventory")?;
        let control =
            state.config.scheduler.then(|| control::spawn(ctx, connect.clone(), "fairway-bench-scheduler".into()));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let api = format!("http://{}/api/v1", listener.local_addr()?);
        let router = serve::app(state);
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::error!(error = %e, "benchmark server stopped");
            }
        });
        Ok(Self { api, pool, options: connect, admin, keys, server, control, postgres, dir })
    }

    /// A new top-level or child team; its id.
    pub async fn team(&self, name: &str, parent: Option<TeamId>) -> anyhow::Result<TeamId> {
        let mut tx = self.pool.begin().await?;
        let team = db::teams::insert(&mut tx, name, parent, "benchmark team").await?;
        tx.commit().await?;
        Ok(team.id)
    }

    /// Sets a team's quota of `class`.
    pub async fn quota(&self, team: TeamId, class: &str, reserved: i32, burst: i32) -> anyhow::Result<()> {
        let class = db::gpu_classes::by_name(&self.pool, class).await?.with_context(|| format!("no class {class}"))?;
        let mut tx = self.pool.begin().await?;
        db::quotas::upsert(&mut tx, team, class.id, reserved, burst, None).await?;
        tx.commit().await?;
        Ok(())
    }

    /// A priority class.
    pub async fn priority_class(&self, name: &str, priority: i32, preemptible: bool) -> anyhow::Result<()> {
        let mut tx = self.pool.begin().await?;
        let row = db::priority_classes::PriorityClassRow {
            name: name.into(),
            priority,
            preemptible,
            usage_factor_milli: 1000,
            price_multiplier_milli: 1000,
            description: "benchmark".into(),
            created_at: chrono::Utc::now(),
            updated_at: chrono::Utc::now(),
            version: 1,
        };
        db::priority_classes::upsert(&mut tx, &row).await?;
        tx.commit().await?;
        Ok(())
    }

    /// A team-scoped API token with the `member` role, as a CI pipeline holds.
    pub async fn ci_token(&self, team: TeamId) -> anyhow::Result<String> {
        let minted = api_token::mint();
        let mut tx = self.pool.begin().await?;
        db::tokens::insert(
            &mut tx,
            &db::tokens::NewToken {
                team_id: team,
                name: "bench-ci",
                role: "member",
                token_hash: &minted.hash,
                display_prefix: &minted.display_prefix,
                created_by: Some(self.admin),
                expires_at: chrono::Utc::now() + chrono::Duration::days(1),
                ci_trust_id: None,
            },
        )
        .await?;
        tx.commit().await?;
        Ok(minted.secret)
    }

    /// An access token of the platform admin.
    pub fn admin_token(&self) -> String {
        self.keys.issue(self.admin, chrono::Utc::now().timestamp())
    }

    /// Stops the service and its control loop and ends its connections, leaving PostgreSQL
    /// running: what the database counted of the service's work is then all published
    /// (backends publish their counters when they exit). Returns a connection of its own.
    pub async fn quiesce(&mut self) -> anyhow::Result<sqlx::PgConnection> {
        if let Some(control) = self.control.take() {
            control.abort();
        }
        self.server.abort();
        self.pool.close().await;
        let mut conn =
            sqlx::Connection::connect_with(&self.options.clone().application_name("fairway-bench-reader")).await?;
        let begun = std::time::Instant::now();
        // The control loop's tasks die with the pool, but a listener of theirs may reconnect
        // before it notices: ended again until none is left. (The leader's own connection
        // stays: it only renews the lease, and publishes that within a second.)
        while db::bench::end_service_backends(&mut conn).await? > 0 {
            if begun.elapsed() > Duration::from_secs(30) {
                tracing::warn!("the service kept reconnecting: the database's counters may miss its last second");
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(conn)
    }

    /// Stops the service and PostgreSQL and removes the scratch directory.
    pub async fn stop(self) {
        if let Some(control) = self.control {
            control.abort();
        }
        self.server.abort();
        self.pool.close().await;
        self.postgres.stop().await;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An HTTP client for many concurrent requests to one host.
pub fn client() -> anyhow::Result<Arc<reqwest::Client>> {
    Ok(Arc::new(reqwest::Client::builder().pool_max_idle_per_host(1024).timeout(Duration::from_secs(60)).build()?))
}

/// Latency percentiles of a sample, in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
}

impl Percentiles {
    /// The percentiles of `sample` (sorted in place); zeros when empty.
    pub fn of(sample: &mut [Duration]) -> Self {
        if sample.is_empty() {
            return Self::default();
        }
        sample.sort_unstable();
        let at = |q: f64| {
            let i = ((sample.len() as f64 * q).ceil() as usize).clamp(1, sample.len()) - 1;
            sample[i].as_secs_f64() * 1e3
        };
        Self { p50: at(0.50), p99: at(0.99) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_the_nearest_rank_values() {
        let mut sample: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let p = Percentiles::of(&mut sample);
        assert_eq!(p.p50, 50.0);
        assert_eq!(p.p99, 99.0);
        assert_eq!(Percentiles::of(&mut []).p99, 0.0);
    }
}
