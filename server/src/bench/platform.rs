//! A whole Fairway for an end-to-end benchmark: a durable embedded PostgreSQL (fsync on, as
//! `fairway serve` runs it) in a scratch directory, the HTTP service on a loopback port, and
//! optionally the control loop on a simulated cluster. Everything runs in this process, so
//! the figures are those of one machine doing all of it.

use crate::domain::{TeamId, UserId};
use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

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

/// The holder name of the benchmarked platform's leader.
pub const LEADER: &str = "fairway-bench-scheduler";

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
    /// With the control loop, a second one contends for leadership on its own connection,
    /// as a standby replica does, over the same clusters.
    pub standby: bool,
}

/// A running platform. [`Platform::stop`] removes everything it created (unless
/// `FAIRWAY_BENCH_KEEP` is set).
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
    standby: Option<tokio::task::JoinHandle<()>>,
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
        let control = state.config.scheduler.then(|| control::spawn(ctx.clone(), connect.clone(), LEADER.into()));
        let standby = if control.is_some() && options.standby {
            // Only once the first leads, so that the standby is the one that stands by.
            let began = std::time::Instant::now();
            loop {
                let mut conn = pool.acquire().await?;
                if db::leader::leader(&mut conn).await?.is_some_and(|l| l.holder == LEADER) {
                    break;
                }
                anyhow::ensure!(began.elapsed() < Duration::from_secs(30), "the benchmark's scheduler did not lead");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Some(control::spawn(ctx, connect.clone(), "fairway-bench-standby".into()))
        } else {
            None
        };
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let api = format!("http://{}/api/v1", listener.local_addr()?);
        let router = serve::app(state);
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, router).await {
                tracing::error!(error = %e, "benchmark server stopped");
            }
        });
        Ok(Self { api, pool, options: connect, admin, keys, server, control, standby, postgres, dir })
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
            preemption_delay_seconds: 0,
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

    /// Departments of teams under closed quota pools, as Kueue's cohorts: `dept-{d}` holds
    /// exactly its teams' reserved quota of `class` and nothing to lend; each team
    /// `dept-{d}-team-{t}` has `reserved` of it and may burst by `burst` within its department.
    /// Returns each team's name with a CI token of it, department by department.
    pub async fn departments(
        &self,
        departments: usize,
        teams_per_department: usize,
        class: &str,
        (reserved, burst): (i32, i32),
    ) -> anyhow::Result<Vec<(String, String)>> {
        let mut teams = Vec::with_capacity(departments * teams_per_department);
        for d in 1..=departments {
            let department = self.team(&format!("dept-{d}"), None).await?;
            self.quota(department, class, i32::try_from(teams_per_department)? * reserved, 0).await?;
            for t in 1..=teams_per_department {
                let name = format!("dept-{d}-team-{t}");
                let id = self.team(&name, Some(department)).await?;
                self.quota(id, class, reserved, burst).await?;
                teams.push((name, self.ci_token(id).await?));
            }
        }
        Ok(teams)
    }

    /// Waits until no job is left to run or end, polling every `every`; false if `limit`
    /// passed first.
    pub async fn drain(&self, limit: Duration, every: Duration) -> anyhow::Result<bool> {
        let began = std::time::Instant::now();
        while db::bench::live_jobs_remain(&self.pool).await? {
            if began.elapsed() > limit {
                return Ok(false);
            }
            tokio::time::sleep(every).await;
        }
        Ok(true)
    }

    /// The scheduling cycles' phase histograms as the service's `/metrics` shows them now.
    pub async fn cycle_phases(&self, http: &reqwest::Client) -> anyhow::Result<PhaseCounters> {
        let url = format!("{}/metrics", self.api.trim_end_matches("/api/v1"));
        Ok(PhaseCounters::parse(&http.get(&url).send().await?.error_for_status()?.text().await?))
    }

    /// An access token of the platform admin.
    pub fn admin_token(&self) -> String {
        self.keys.issue(self.admin, chrono::Utc::now().timestamp())
    }

    /// Stops the service and its control loop and ends its connections, leaving PostgreSQL
    /// running: what the database counted of the service's work is then all published
    /// (backends publish their counters when they exit). Returns a connection of its own.
    pub async fn quiesce(&mut self) -> anyhow::Result<sqlx::PgConnection> {
        for control in [self.control.take(), self.standby.take()].into_iter().flatten() {
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
        for control in [self.control, self.standby].into_iter().flatten() {
            control.abort();
        }
        self.server.abort();
        self.pool.close().await;
        self.postgres.stop().await;
        // Kept on request, for PostgreSQL's log (`postgres.log` beside its data) after a run
        // that went wrong.
        if std::env::var_os("FAIRWAY_BENCH_KEEP").is_some() {
            eprintln!("kept the benchmark's database and PostgreSQL log in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A simulated cluster of one whole-GPU `class` whose jobs start the moment they are
/// created: `departments` racks, `rack-{d}`, of `nodes_per_department` nodes of
/// `gpus_per_node` GPUs.
pub fn departments_inventory(
    class: &str,
    departments: usize,
    nodes_per_department: usize,
    gpus_per_node: usize,
) -> String {
    let mut toml = format!(
        "cluster = \"sim\"\nstart_delay_ms = 0\n\n[[class]]\nname = \"{class}\"\nkind = \"whole\"\nmemory_mib = 81920\n"
    );
    for d in 1..=departments {
        for n in 1..=nodes_per_department {
            toml.push_str(&format!(
                "\n[[node]]\nname = \"dept-{d}-node-{n}\"\ngpu_class = \"{class}\"\ngpus = {gpus_per_node}\nrack = \"rack-{d}\"\n"
            ));
        }
    }
    toml
}

/// Writes where held time goes, per priority class: the mean milliseconds of each step of an
/// attempt that ran to its end.
pub fn write_held(out: &mut dyn std::io::Write, rows: &[db::bench::HeldBreakdown]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<14} {:>18} {:>16} {:>8} {:>20}",
        "", "admitted->dispatch", "dispatch->start", "run", "end->GPUs released"
    )?;
    for b in rows {
        writeln!(
            out,
            "{:<14} {:>18.0} {:>16.0} {:>8.0} {:>20.0}",
            b.priority_class, b.to_dispatch_ms, b.to_start_ms, b.run_ms, b.to_release_ms
        )?;
    }
    Ok(())
}

/// The value at quantile `q` of an ascending sample (nearest rank); NaN when empty.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// One phase of the scheduling cycles over a stretch of time, from `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Phase {
    pub cycles: f64,
    pub seconds: f64,
    /// The smallest bucket bound at or below which 99% of the cycles' phase fell.
    pub p99_bound: f64,
}

/// The phases' histograms at one instant, cumulative since the service started: cycles,
/// seconds and buckets per phase. A scheduling cycle's phases
/// (`fairway_scheduling_cycle_phase_seconds`) go by their names, `read`; a reconciler
/// pass's (`fairway_reconcile_phase_seconds`) as `reconcile <name>`, `reconcile logs`.
#[derive(Debug, Clone, Default)]
pub struct PhaseCounters(BTreeMap<String, Counters>);

#[derive(Debug, Clone, Default)]
struct Counters {
    cycles: f64,
    seconds: f64,
    /// `(le, cumulative count)`, ascending.
    buckets: Vec<(f64, f64)>,
}

impl PhaseCounters {
    /// Reads the histograms from a `/metrics` text.
    pub fn parse(text: &str) -> Self {
        const NAMES: [(&str, &str); 2] =
            [("fairway_scheduling_cycle_phase_seconds", ""), ("fairway_reconcile_phase_seconds", "reconcile ")];
        let mut phases: BTreeMap<String, Counters> = BTreeMap::new();
        for line in text.lines() {
            let Some((rest, prefix)) = NAMES.iter().find_map(|(name, prefix)| Some((line.strip_prefix(name)?, prefix)))
            else {
                continue;
            };
            let Some((series, value)) = rest.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            let Some((kind, labels)) = series.split_once('{') else { continue };
            let labels: BTreeMap<&str, &str> = labels
                .trim_end_matches('}')
                .split(',')
                .filter_map(|pair| pair.split_once('='))
                .map(|(k, v)| (k, v.trim_matches('"')))
                .collect();
            let Some(phase) = labels.get("phase") else { continue };
            let entry = phases.entry(format!("{prefix}{phase}")).or_default();
            match kind {
                "_count" => entry.cycles = value,
                "_sum" => entry.seconds = value,
                "_bucket" => {
                    let le = labels.get("le").map_or(f64::INFINITY, |le| le.parse().unwrap_or(f64::INFINITY));
                    entry.buckets.push((le, value));
                }
                _ => {}
            }
        }
        for counters in phases.values_mut() {
            counters.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        Self(phases)
    }

    /// Each phase over the cycles that ran between `before` and these counters.
    pub fn since(&self, before: &Self) -> BTreeMap<String, Phase> {
        let empty = Counters::default();
        self.0
            .iter()
            .map(|(name, now)| {
                let then = before.0.get(name).unwrap_or(&empty);
                let cycles = now.cycles - then.cycles;
                let earlier = |le: f64| then.buckets.iter().find(|(b, _)| *b == le).map_or(0.0, |(_, n)| *n);
                let p99_bound = now
                    .buckets
                    .iter()
                    .find(|(le, n)| n - earlier(*le) >= cycles * 0.99)
                    .map_or(f64::INFINITY, |(le, _)| *le);
                (name.clone(), Phase { cycles, seconds: now.seconds - then.seconds, p99_bound })
            })
            .collect()
    }
}

/// What the leader row said over a stretch of time, sampled: whether leadership changed
/// hands, and the longest the leader went without renewing its lease.
#[derive(Debug, Clone, Default)]
pub struct LeaseWatch {
    /// Every epoch seen: one means no failover.
    pub epochs: std::collections::BTreeSet<i64>,
    /// Every holder seen.
    pub holders: std::collections::BTreeSet<String>,
    /// The longest time since a heartbeat that any sample saw, seconds.
    pub longest_silence_s: f64,
    pub samples: u32,
}

/// Samples the leader row in the background until [`LeaseWatcher::finish`].
pub struct LeaseWatcher {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<LeaseWatch>>,
}

impl LeaseWatcher {
    /// Starts sampling the leader row of `pool`'s database every `every`.
    pub fn start(pool: PgPool, every: Duration) -> Self {
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut watch = LeaseWatch::default();
            loop {
                let mut conn = pool.acquire().await?;
                if let Some(row) = db::leader::leader(&mut conn).await? {
                    watch.epochs.insert(row.epoch);
                    watch.holders.insert(row.holder);
                    watch.longest_silence_s = watch.longest_silence_s.max(row.silent_seconds);
                    watch.samples += 1;
                }
                drop(conn);
                tokio::select! {
                    _ = &mut stopped => return Ok(watch),
                    () = tokio::time::sleep(every) => {}
                }
            }
        });
        Self { stop, task }
    }

    /// Stops sampling; what the samples saw.
    pub async fn finish(self) -> anyhow::Result<LeaseWatch> {
        let _ = self.stop.send(());
        self.task.await?
    }
}

/// The machine's load averages over 1, 5 and 15 minutes, as `/proc/loadavg` says; for a
/// report to say how busy the machine was besides the benchmark.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map_or_else(|_| "unknown".into(), |l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
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
    pub fn of(sample: &[Duration]) -> Self {
        if sample.is_empty() {
            return Self::default();
        }
        let mut ms: Vec<f64> = sample.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        Self { p50: quantile(&ms, 0.50), p99: quantile(&ms, 0.99) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_the_nearest_rank_values() {
        let sample: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        let p = Percentiles::of(&sample);
        assert_eq!(p.p50, 50.0);
        assert_eq!(p.p99, 99.0);
        assert_eq!(Percentiles::of(&[]).p99, 0.0);
    }

    #[test]
    fn cycle_and_reconcile_phases_are_read_from_the_metrics_text_over_a_stretch_of_time() {
        let metrics = crate::telemetry::Metrics::default();
        let at_start = PhaseCounters::parse(&metrics.render((1, 1), crate::telemetry::Tenants::Hidden));
        for ms in [2, 3, 40] {
            metrics.cycle_phases([ms, ms, 1, ms * 2].map(Duration::from_millis));
        }
        metrics.reconcile_phases([5, 1_200, 30, 2].map(Duration::from_millis));
        let first = PhaseCounters::parse(&metrics.render((1, 1), crate::telemetry::Tenants::Hidden));
        let phases = first.since(&at_start);
        assert_eq!(
            phases.keys().collect::<Vec<_>>(),
            vec![
                "engine",
                "passes",
                "read",
                "reconcile cleanup",
                "reconcile list",
                "reconcile logs",
                "reconcile write",
                "write"
            ]
        );
        let logs = phases["reconcile logs"];
        assert_eq!((logs.cycles, logs.p99_bound), (1.0, 2.5), "one pass, its 1.2 s of logs in the 2.5 s bucket");
        let read = phases["read"];
        assert_eq!(read.cycles, 3.0);
        assert!((read.seconds - 0.045).abs() < 1e-9, "{read:?}");
        assert_eq!(read.p99_bound, 0.05, "the slowest read, 40 ms, is in the 50 ms bucket");
        assert_eq!(phases["engine"].p99_bound, 0.001);

        for _ in 0..2 {
            metrics.cycle_phases([2, 2, 1, 4].map(Duration::from_millis));
        }
        let later = PhaseCounters::parse(&metrics.render((1, 1), crate::telemetry::Tenants::Hidden)).since(&first);
        assert_eq!(later["read"].cycles, 2.0);
        assert_eq!(later["read"].p99_bound, 0.0025, "the 40 ms read came before this stretch");
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let sample: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&sample, 0.5), 50.0);
        assert_eq!(quantile(&sample, 0.99), 99.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn a_departments_inventory_has_its_racks_of_nodes() {
        let toml = departments_inventory("g", 3, 2, 50);
        let config = crate::backends::sim::SimConfig::from_toml(&toml).expect("valid inventory");
        let nodes = config.inventory();
        assert_eq!(nodes.len(), 6);
        assert!(nodes.iter().all(|n| n.gpus == 50));
        assert_eq!(config.start_delay_ms, 0);
    }
}
