//! The control loop: leader election, scheduling cycles, dispatch and reconciliation.
//!
//! Every replica runs [`leader::run`]; the one that leads runs, until it stops leading:
//!
//! - **cycles** ([`cycle`]) on every wake-up (`LISTEN fairway_schedule`: submissions,
//!   cancellations, finished jobs, quota changes) and on a timer;
//! - **dispatch workers** ([`dispatch`]) draining the outbox the cycles write, woken by
//!   `LISTEN fairway_dispatch` and a short timer (retries come due by time);
//! - the **reconciler** ([`reconcile`]) comparing every backend's objects with the jobs;
//! - an **inventory sync** writing what each backend offers into `cluster_nodes`;
//! - the **notifier** ([`notify`]) turning job events and budget alerts into signed webhook
//!   deliveries, and sending them.
//!
//! Every write checks the leader's epoch, so a process that lost leadership while paused
//! commits nothing.

pub mod arrays;
pub mod cycle;
pub mod dependencies;
pub mod dispatch;
pub mod feed;
pub mod forecast;
pub mod leader;
pub mod lifecycle;
pub mod logs;
pub mod meter;
pub mod notify;
pub mod reconcile;
pub mod services;
pub mod utilisation;
pub mod wake;
pub mod world;

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use sqlx::{postgres::PgListener, PgPool};
use tokio::sync::watch;

use crate::{
    backends::{Backend, BackendError},
    db::{self, inventory::NodeRow},
    scheduler,
    telemetry::Metrics,
};

/// Why a control-loop step failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Another process leads now; this one must stop writing.
    #[error("no longer the leader")]
    NotLeader,
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("backend: {0}")]
    Backend(#[from] BackendError),
    /// The engine's blocking task panicked or was cancelled; the cause is kept.
    #[error("the scheduling engine's task failed: {0}")]
    Engine(#[from] tokio::task::JoinError),
}

/// Timings of the control loop.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    /// A cycle runs at least this often, events or not.
    pub cycle_interval: Duration,
    /// The reconciler's period.
    pub reconcile_interval: Duration,
    /// How often the inventory is read from the backends.
    pub inventory_interval: Duration,
    /// A leader silent for this long is replaced.
    pub lease: Duration,
    /// Concurrent dispatch workers.
    pub dispatch_workers: usize,
    /// The engine's tunables.
    pub engine: scheduler::snapshot::Config,
    /// Check the quota invariant after every cycle and log any breach (tests turn it on).
    pub check_invariants: bool,
    /// How often running jobs' completed hours are booked and the rollups refreshed.
    pub metering_interval: Duration,
    /// How bookings are priced: the currency and the chargeback model.
    pub pricing: crate::metering::Pricing,
    /// How often running attempts' new log lines are read from the backends.
    pub log_interval: Duration,
    /// Lines of each replica's log kept per attempt.
    pub log_tail_lines: u32,
    /// How often the notifier looks for new job events and budget alerts, and how long an
    /// idle delivery worker waits before looking for due deliveries.
    pub notify_interval: Duration,
    /// Where jobs' GPU activity and GPUs' health are read from; `None` reads none.
    pub dcgm: Option<crate::backends::dcgm::DcgmSource>,
    /// How often it is read.
    pub utilisation_interval: Duration,
    /// The unit of the webhook retry schedule ([`notify::RETRY_AFTER`]): a second in
    /// production; tests shorten it so retries come due in milliseconds.
    pub webhook_retry_unit: Duration,
    /// How long a claimed webhook delivery is held: a process that dies mid-request leaves
    /// it to be sent again after this.
    pub webhook_lease: Duration,
}

impl Default for ControlConfig {
    fn default() -> Self {
        Self {
            cycle_interval: Duration::from_secs(2),
            reconcile_interval: Duration::from_millis(500),
            inventory_interval: Duration::from_secs(30),
            lease: Duration::from_secs(10),
            dispatch_workers: 16,
            engine: scheduler::snapshot::Config::default(),
            check_invariants: false,
            metering_interval: Duration::from_secs(60),
            pricing: crate::metering::Pricing::default(),
            log_interval: Duration::from_secs(2),
            log_tail_lines: 5_000,
            notify_interval: Duration::from_millis(500),
            dcgm: None,
            utilisation_interval: Duration::from_secs(15),
            webhook_retry_unit: Duration::from_secs(1),
            webhook_lease: Duration::from_secs(60),
        }
    }
}

/// The engine's tunables from the service configuration: what the control loop decides
/// with, and what a dry run must answer with so the two agree.
pub fn engine_config(config: &crate::config::Config) -> scheduler::snapshot::Config {
    scheduler::snapshot::Config {
        min_runtime_before_preemption_ms: config.min_runtime_before_preemption.as_millis() as i64,
        queue_order: config.queue_order,
        placement: config.placement,
        ..scheduler::snapshot::Config::default()
    }
}

/// What the control loop works with.
#[derive(Clone)]
pub struct Ctx {
    pub pool: PgPool,
    /// Backends by cluster name.
    pub backends: Arc<BTreeMap<String, Arc<dyn Backend>>>,
    pub metrics: Arc<Metrics>,
    pub config: ControlConfig,
    /// Asks the reconciler for a pass soon (the dispatcher does after creating objects;
    /// a cluster's watches do on every change they see).
    pub reconcile_soon: Arc<tokio::sync::Notify>,
    /// Asks for an inventory sync soon (a cluster's node watch does on every change).
    pub inventory_soon: Arc<tokio::sync::Notify>,
}

/// Starts leader election and, while leading, the loops. `options` must reach the same
/// database as the pool; `holder` names this process (its sessions carry it as their
/// application name, so a successor can end them).
pub fn spawn(ctx: Ctx, options: sqlx::postgres::PgConnectOptions, holder: String) -> tokio::task::JoinHandle<()> {
    let reasons = crate::scheduler::PreemptReason::ALL.map(crate::scheduler::PreemptReason::code);
    ctx.metrics.declare(&reasons, &crate::backends::Outcome::CODES);
    let (tx, mut rx) = watch::channel(None);
    tokio::spawn(leader::run(options, holder, ctx.config.lease, tx));
    tokio::spawn(async move {
        loop {
            let epoch = *rx.borrow_and_update();
            match epoch {
                Some(epoch) => {
                    ctx.metrics.leader(true);
                    tokio::select! {
                        () = lead(&ctx, epoch) => {}
                        _ = rx.changed() => {}
                    }
                    ctx.metrics.leader(false);
                }
                None => {
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
    })
}

/// Runs the leader's loops until one finds it no longer leads.
async fn lead(ctx: &Ctx, epoch: i64) {
    if let Err(e) = sync_inventory(ctx).await {
        tracing::warn!(error = %e, "inventory sync failed");
    }
    let mut workers = tokio::task::JoinSet::new();
    workers.spawn(cycles(ctx.clone(), epoch));
    workers.spawn(reconciler(ctx.clone(), epoch));
    workers.spawn(inventory(ctx.clone()));
    workers.spawn(meter::run(ctx.clone()));
    workers.spawn(logs::run(ctx.clone(), epoch));
    workers.spawn(notify::run(ctx.clone(), epoch));
    if let Some(source) = ctx.config.dcgm.clone() {
        workers.spawn(utilisation::run(ctx.clone(), epoch, source));
    }
    for _ in 0..ctx.config.dispatch_workers.max(1) {
        workers.spawn(dispatcher(ctx.clone(), epoch));
    }
    // Any loop returning means leadership is gone; the rest stop with the set.
    workers.join_next().await;
    workers.abort_all();
}

async fn listener(pool: &PgPool, channel: &str) -> Option<PgListener> {
    let mut l = PgListener::connect_with(pool).await.ok()?;
    l.listen(channel).await.ok()?;
    Some(l)
}

/// Waits for a notification on `listener` or for `timeout`, then drains what else arrived,
/// so a burst of submissions costs one cycle.
async fn wake(listener: &mut Option<PgListener>, timeout: Duration) {
    match listener {
        Some(l) => {
            if let Ok(Err(_)) = tokio::time::timeout(timeout, l.recv()).await {
                // The listener reconnects by itself; avoid a hot loop while it does.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            while l.next_buffered().is_some() {}
        }
        None => tokio::time::sleep(timeout).await,
    }
}

/// A transaction of the leader of `epoch`; fails with `NotLeader` once another took over.
pub async fn leader_tx(pool: &sqlx::PgPool, epoch: i64) -> Result<db::Tx<'static>, ControlError> {
    let mut tx = pool.begin().await?;
    if !db::leader::check_epoch(&mut tx, epoch).await? {
        return Err(ControlError::NotLeader);
    }
    Ok(tx)
}

/// How long every pending job's recorded position and expected start may lag behind the
/// scheduler's view, with `pending` jobs queued (see [`cycle::Refresh`]): a second, and
/// with thousands queued longer, so that refreshes write at most about 2,000 rows a
/// second; ten thousand rows take the database a tenth of a second, which would otherwise
/// hold back every tenth cycle. A job's first reason is recorded in the cycle that first
/// ranks it; a change of reason with the next refresh.
pub fn pending_refresh_interval(pending: usize) -> Duration {
    const ROWS_PER_SECOND: usize = 2_000;
    Duration::from_secs(1).max(Duration::from_millis((pending * 1000 / ROWS_PER_SECOND) as u64))
}

async fn cycles(ctx: Ctx, epoch: i64) {
    let mut events = listener(&ctx.pool, db::jobs::SCHEDULE_CHANNEL).await;
    let mut refreshed: Option<tokio::time::Instant> = None;
    let mut live = db::snapshot::LiveJobs::default();
    let mut forecast = forecast::ForecastInputs::default();
    let mut pending = 0;
    loop {
        let refresh = if refreshed.is_none_or(|at| at.elapsed() >= pending_refresh_interval(pending)) {
            cycle::Refresh::All
        } else {
            cycle::Refresh::Changed
        };
        match cycle::run_with(&ctx.pool, epoch, &ctx.config, refresh, &mut live, &mut forecast).await {
            Ok(report) => {
                if refresh == cycle::Refresh::All {
                    refreshed = Some(tokio::time::Instant::now());
                }
                pending = report.pending;
                if report.admitted + report.preempted > 0 {
                    tracing::info!(
                        admitted = report.admitted,
                        preempted = report.preempted,
                        pending = report.pending,
                        duration_ms = report.duration.as_millis() as u64,
                        passes_ms = report.passes.as_millis() as u64,
                        read_ms = report.read.as_millis() as u64,
                        engine_ms = report.engine.as_millis() as u64,
                        write_ms = report.write.as_millis() as u64,
                        "scheduling cycle"
                    );
                }
                ctx.metrics.pending_reasons(&report.pending_by_reason);
                ctx.metrics.cycle_phases([report.passes, report.read, report.engine, report.write]);
                ctx.metrics.cycle(
                    report.duration,
                    report.pending_by_team,
                    report.allocation,
                    &report.admission_latencies,
                    &report.queue_waits,
                    &report.preemption_reasons,
                );
                ctx.metrics.backfilled(report.backfills);
                if ctx.config.check_invariants {
                    match db::decisions::quota_violations(&ctx.pool).await {
                        Ok(v) if v.is_empty() => {}
                        Ok(v) => tracing::error!(violations = ?v, "quota invariant broken"),
                        Err(e) => tracing::warn!(error = %e, "cannot check the quota invariant"),
                    }
                }
            }
            Err(ControlError::NotLeader) => return,
            Err(e) => {
                tracing::warn!(error = %e, "scheduling cycle failed");
                // Start again from a full read rather than reason about what the failure left.
                live = db::snapshot::LiveJobs::default();
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        wake(&mut events, ctx.config.cycle_interval).await;
    }
}

async fn dispatcher(ctx: Ctx, epoch: i64) {
    let mut events = listener(&ctx.pool, db::outbox::DISPATCH_CHANNEL).await;
    let mut cursor = dispatch::Cursor::default();
    loop {
        match dispatch::dispatch_batch(&ctx, epoch, &mut cursor).await {
            Ok(0) => wake(&mut events, Duration::from_millis(250)).await,
            Ok(_) => {}
            Err(ControlError::NotLeader) => return,
            Err(e) => {
                tracing::warn!(error = %e, "dispatch failed");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Shortest time between two reconciler passes: changes that come close together are
/// handled in one pass, one transaction.
const RECONCILE_GAP: Duration = Duration::from_millis(5);

/// Runs reconciler passes: on its period, at the earliest change a backend announced, and
/// soon after the dispatcher created objects.
async fn reconciler(ctx: Ctx, epoch: i64) {
    loop {
        let mut next = tokio::time::Instant::now() + ctx.config.reconcile_interval;
        for (cluster, backend) in ctx.backends.iter() {
            match reconcile::reconcile(&ctx, epoch, cluster, backend.as_ref()).await {
                Ok(report) => {
                    if let Some(at) = report.next_change {
                        let wait = (at - chrono::Utc::now()).to_std().unwrap_or_default();
                        next = next.min(tokio::time::Instant::now() + wait);
                    }
                }
                Err(ControlError::NotLeader) => return,
                Err(e) => tracing::warn!(cluster, error = %e, "reconciliation failed"),
            }
            if let Err(e) = services::withdraw(&ctx.pool, cluster, backend.as_ref()).await {
                tracing::warn!(cluster, error = %e, "removing deleted services' endpoints failed");
            }
        }
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = ctx.reconcile_soon.notified() => {}
        }
        tokio::time::sleep(RECONCILE_GAP).await;
    }
}

/// Shortest time between two inventory syncs a watch asked for: a node that changes many
/// times in a burst (a rolling relabel) costs one sync.
const INVENTORY_GAP: Duration = Duration::from_millis(200);

async fn inventory(ctx: Ctx) {
    let mut tick = tokio::time::interval(ctx.config.inventory_interval);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = ctx.inventory_soon.notified() => tokio::time::sleep(INVENTORY_GAP).await,
        }
        if let Err(e) = sync_inventory(&ctx).await {
            tracing::warn!(error = %e, "inventory sync failed");
        }
    }
}

/// Writes every backend's inventory into `cluster_nodes` (and its capacity), creating the
/// cluster and any GPU class the backend declares that the catalogue lacks.
pub async fn sync_inventory(ctx: &Ctx) -> Result<(), ControlError> {
    // Every backend's GPU classes first: a cloud pool may offer a class only another cluster
    // declares, and its nodes must not be dropped for being of an unknown class.
    let mut tx = ctx.pool.begin().await?;
    for backend in ctx.backends.values() {
        for class in backend.declared_classes() {
            db::inventory::ensure_gpu_class(&mut tx, &class.name, &class.kind, class.memory_mib, class.fraction_milli)
                .await?;
        }
    }
    tx.commit().await?;
    // One unreachable cluster must not hold back the others' inventories.
    let mut first_error = None;
    for (cluster, backend) in ctx.backends.iter() {
        if let Err(e) = sync_cluster(ctx, cluster, backend.as_ref()).await {
            tracing::warn!(cluster, error = %e, "inventory sync of a cluster failed");
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Syncs one cluster's inventory (see [`sync_inventory`]).
pub(crate) async fn sync_cluster(ctx: &Ctx, cluster: &str, backend: &dyn Backend) -> Result<(), ControlError> {
    let nodes = backend.inventory().await?;
    tracing::debug!(cluster, nodes = nodes.len(), "inventory read");
    let mut tx = ctx.pool.begin().await?;
    for class in backend.declared_classes() {
        db::inventory::ensure_gpu_class(&mut tx, &class.name, &class.kind, class.memory_mib, class.fraction_milli)
            .await?;
    }
    let cluster_id = db::inventory::ensure_cluster(&mut tx, cluster, backend.kind()).await?;
    let classes: BTreeMap<String, crate::domain::GpuClassId> =
        db::inventory::class_ids(&mut tx).await?.into_iter().collect();
    let mut rows = Vec::new();
    for n in nodes {
        let Some(&gpu_class_id) = classes.get(&n.gpu_class) else {
            tracing::warn!(cluster, node = %n.name, class = %n.gpu_class, "node of an unknown GPU class ignored");
            continue;
        };
        rows.push(NodeRow {
            cluster_id,
            cluster: cluster.to_owned(),
            name: n.name,
            gpu_class_id,
            gpus: i32::from(n.gpus),
            nvlink_domain_size: i32::from(n.nvlink_domain_size),
            rack: n.rack,
            zone: n.zone,
            elastic: n.elastic,
            spot: n.spot,
            price_micros_per_gpu_hour: n.price_micros_per_gpu_hour,
            driver_version: n.driver_version,
            cuda_version: n.cuda_version,
            cpu_millis: n.cpu_millis.and_then(|c| i32::try_from(c).ok()),
            memory_mib: n.memory_mib.and_then(|m| i32::try_from(m).ok()),
        });
    }
    db::inventory::replace_nodes(&mut tx, cluster_id, &rows).await?;
    let faults: Vec<_> = backend.faults().await?.into_iter().map(|f| (f.node, f.since, f.why)).collect();
    db::inventory::replace_faults(&mut tx, cluster_id, &faults).await?;
    db::metering::record_capacity(&mut tx).await?;
    db::jobs::notify(&mut tx, db::jobs::SCHEDULE_CHANNEL).await?;
    tx.commit().await?;
    backend.sync_tenants(&tenants(&ctx.pool).await?).await?;
    Ok(())
}

/// Every team with a quota and its limits, for the backends' own fences.
async fn tenants(pool: &sqlx::PgPool) -> Result<Vec<crate::backends::Tenant>, ControlError> {
    let mut tenants: Vec<crate::backends::Tenant> = Vec::new();
    for row in db::quotas::team_limits(pool).await? {
        if tenants.last().is_none_or(|t| t.team != row.team) {
            tenants.push(crate::backends::Tenant { team: row.team.clone(), gpu_limits: BTreeMap::new() });
        }
        let tenant = tenants.last_mut().expect("pushed above");
        tenant.gpu_limits.insert(row.gpu_class, u32::try_from(row.limit).unwrap_or(0));
    }
    Ok(tenants)
}
