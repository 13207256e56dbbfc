//! Logging and metrics. Logs are compact text locally and JSON lines in clusters
//! (`FAIRWAY_LOG_FORMAT=json`); metrics are OpenMetrics text at `/metrics`, kept and encoded
//! by `prometheus-client` (the Prometheus project's Rust client). The request middleware that
//! feeds them lives in `http::trace`.

use std::{collections::BTreeMap, sync::atomic::AtomicU64, time::Duration};

use prometheus_client::{
    collector::Collector,
    encoding::{
        text::{encode_eof, encode_registry},
        DescriptorEncoder, EncodeLabelSet, EncodeMetric as _,
    },
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::Histogram,
        info::Info,
    },
    registry::Registry,
};

/// Installs the global tracing subscriber once (levels from `RUST_LOG`, else `default_filter`);
/// later calls are no-ops.
pub fn init(json: bool, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    use std::io::IsTerminal as _;
    // Colour only for a person at a terminal, never into files or log pipelines.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    // A log line that cannot be written (stderr on a full disk) is dropped. Left on, the
    // subscriber reports it with `eprintln!`, which panics when stderr fails too: every task
    // that logs, the scheduler's included, would die of a full disk.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .log_internal_errors(false);
    let _ = if json { builder.json().flatten_event(true).try_init() } else { builder.compact().try_init() };
}

/// Upper bounds of the HTTP latency histogram, in seconds.
const BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// Upper bounds of the scheduling-cycle histogram, in seconds.
const CYCLE_BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];
/// Upper bounds of the histogram of a cycle's phases, in seconds: finer
/// than the cycle's, since a phase of a few milliseconds is the healthy case.
const PHASE_BUCKETS: [f64; 13] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// The phases of a scheduling cycle, as labelled in `fairway_scheduling_cycle_phase_seconds`.
/// `passes`: releasing jobs whose dependencies are met and array tasks, starting and stopping
/// services' replicas; `read`: the snapshot; `engine`: the decisions; `write`: recording them.
pub const CYCLE_PHASES: [&str; 4] = ["passes", "read", "engine", "write"];
/// The phases of a reconciler pass over one cluster, as labelled in
/// `fairway_reconcile_phase_seconds`. `list`: the backend's objects and the jobs holding GPUs
/// there; `logs`: the last lines of ended attempts; `write`: recording starts and ends;
/// `cleanup`: stopping and deleting objects.
pub const RECONCILE_PHASES: [&str; 4] = ["list", "logs", "write", "cleanup"];
/// Upper bounds of the admission-latency and queue-wait histograms, in seconds.
const WAIT_BUCKETS: [f64; 12] = [0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14_400.0, 43_200.0, 86_400.0];

/// The media type of [`Metrics::render`]: OpenMetrics text, which Prometheus scrapes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether a rendering may name teams: only for a caller holding the metrics token, since a
/// team's existence must not leak to anyone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tenants {
    /// Per-team series included.
    Named,
    /// Series that name a team left out.
    Hidden,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    route: String,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    method: String,
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    gpu_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TeamClassLabels {
    team: String,
    gpu_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WaitLabels {
    gpu_class: String,
    priority_class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterKindLabels {
    cluster: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TeamLabels {
    team: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TeamThresholdLabels {
    team: String,
    threshold: i32,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// What idle policies do to jobs, the label values of `fairway_idle_actions_total`.
pub const IDLE_ACTIONS: [&str; 3] = ["warned", "stopped", "preempted"];

/// A job admitted in a cycle, for the wait histograms: how long it waited, and the labels
/// operators slice waits by.
#[derive(Debug, Clone)]
pub struct Waited {
    /// The job's GPU class.
    pub gpu_class: String,
    /// The job's priority class.
    pub priority_class: String,
    /// Seconds waited.
    pub seconds: f64,
}

/// Request counters and latencies by route, the control loop's figures, and budget spend, as
/// `prometheus-client` families in two registries: `public` for series that name no team,
/// `tenants` for those that do (rendered only for the metrics token's holder).
pub struct Metrics {
    public: Registry,
    tenants: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Histograms<RouteLabels>,
    db_connections: Family<StateLabels, Gauge>,
    leader: Gauge,
    pending: Family<TeamClassLabels, Gauge>,
    pending_reasons: Family<ReasonLabels, Gauge>,
    allocated: Family<ClassLabels, Gauge>,
    capacity: Family<ClassLabels, Gauge>,
    cycles: Histogram,
    cycle_phases: Histograms<PhaseLabels>,
    reconcile_phases: Histograms<PhaseLabels>,
    admission_latency: Histograms<WaitLabels>,
    queue_wait: Histograms<WaitLabels>,
    preemptions: Family<ReasonLabels, Counter>,
    backfills: Counter,
    dispatch_errors: Family<ClusterKindLabels, Counter>,
    outcomes: Family<OutcomeLabels, Counter>,
    webhook_attempts: Family<OutcomeLabels, Counter>,
    budget_spent_ratio: Family<TeamLabels, Gauge<f64, AtomicU64>>,
    budget_alerts: Family<TeamThresholdLabels, Counter>,
    sm_active: Family<TeamClassLabels, Gauge<f64, AtomicU64>>,
    idle_gpus: Family<TeamClassLabels, Gauge<f64, AtomicU64>>,
    idle_actions: Family<ActionLabels, Counter>,
    gpu_faults: Family<ClusterKindLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let latency: Histograms<RouteLabels> = Family::new_with_constructor(|| Histogram::new(BUCKETS));
        let waits = || -> Histograms<WaitLabels> { Family::new_with_constructor(|| Histogram::new(WAIT_BUCKETS)) };
        let m = Self {
            public: Registry::default(),
            tenants: Registry::default(),
            requests: Family::default(),
            latency,
            db_connections: Family::default(),
            leader: Gauge::default(),
            pending: Family::default(),
            pending_reasons: Family::default(),
            allocated: Family::default(),
            capacity: Family::default(),
            cycles: Histogram::new(CYCLE_BUCKETS),
            cycle_phases: Family::new_with_constructor(|| Histogram::new(PHASE_BUCKETS)),
            reconcile_phases: Family::new_with_constructor(|| Histogram::new(PHASE_BUCKETS)),
            admission_latency: waits(),
            queue_wait: waits(),
            preemptions: Family::default(),
            backfills: Counter::default(),
            dispatch_errors: Family::default(),
            outcomes: Family::default(),
            webhook_attempts: Family::default(),
            budget_spent_ratio: Family::default(),
            budget_alerts: Family::default(),
            sm_active: Family::default(),
            idle_gpus: Family::default(),
            idle_actions: Family::default(),
            gpu_faults: Family::default(),
        };
        m.registered()
    }
}

impl Metrics {
    fn registered(mut self) -> Self {
        let p = &mut self.public;
        p.register(
            "fairway_build",
            "The running build, labelled with its version",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        p.register_collector(Box::new(Process));
        p.register("fairway_http_requests", "HTTP requests by method, route and status", self.requests.clone());
        p.register("fairway_http_request_duration_seconds", "HTTP request latency", self.latency.clone());
        p.register("fairway_db_connections", "Database pool connections by state", self.db_connections.clone());
        p.register(
            "fairway_scheduler_leader",
            "Whether this process runs the scheduler (1) or stands by (0)",
            self.leader.clone(),
        );
        p.register(
            "fairway_pending_jobs_by_reason",
            "Jobs waiting for admission, by the reason the last cycle gave",
            self.pending_reasons.clone(),
        );
        p.register("fairway_gpus_allocated", "GPUs held by admitted jobs, by GPU class", self.allocated.clone());
        p.register("fairway_gpus_capacity", "GPUs the clusters offer, by GPU class", self.capacity.clone());
        p.register(
            "fairway_scheduling_cycle_duration_seconds",
            "Snapshot, engine and commit of one cycle",
            self.cycles.clone(),
        );
        p.register(
            "fairway_scheduling_cycle_phase_seconds",
            "One phase of a scheduling cycle: passes (releasing waiting jobs, services' replicas), read (the snapshot), engine (the decisions) or write (recording them)",
            self.cycle_phases.clone(),
        );
        p.register(
            "fairway_reconcile_phase_seconds",
            "One phase of a reconciler pass over one cluster: list (the backend's objects and the jobs holding GPUs there), logs (ended attempts' last lines), write (recording starts and ends) or cleanup (stopping and deleting objects)",
            self.reconcile_phases.clone(),
        );
        p.register(
            "fairway_admission_latency_seconds",
            "Time from submission to first admission, by GPU class and priority class",
            self.admission_latency.clone(),
        );
        p.register(
            "fairway_queue_wait_seconds",
            "Time from entering the queue (or re-entering it) to admission, by GPU class and priority class",
            self.queue_wait.clone(),
        );
        p.register("fairway_preemptions", "Jobs preempted, by reason", self.preemptions.clone());
        p.register(
            "fairway_backfills",
            "Jobs admitted on GPUs held for a blocked gang, which they end before the gang can start",
            self.backfills.clone(),
        );
        p.register(
            "fairway_dispatch_errors",
            "Failed backend calls, by cluster and kind",
            self.dispatch_errors.clone(),
        );
        p.register("fairway_job_attempts", "Ended job attempts, by outcome", self.outcomes.clone());
        p.register(
            "fairway_webhook_attempts",
            "Webhook delivery attempts, by outcome: delivered, retrying or failed",
            self.webhook_attempts.clone(),
        );
        p.register(
            "fairway_idle_actions",
            "What idle policies did to jobs whose GPUs stayed idle: warned, stopped or preempted",
            self.idle_actions.clone(),
        );
        p.register(
            "fairway_gpu_faults",
            "GPU faults DCGM's fields opened, by cluster and kind (xid, row_remap_failure)",
            self.gpu_faults.clone(),
        );
        let t = &mut self.tenants;
        t.register(
            "fairway_gpu_sm_active_ratio",
            "SM activity (DCGM) of running jobs' GPUs at the last read, weighted by GPUs, by team and GPU class",
            self.sm_active.clone(),
        );
        t.register(
            "fairway_gpus_idle",
            "GPUs held by running jobs whose GPUs are idle (SM activity below their idle policy's threshold), by team and GPU class",
            self.idle_gpus.clone(),
        );
        t.register("fairway_pending_jobs", "Jobs waiting for admission, by team and GPU class", self.pending.clone());
        t.register(
            "fairway_budget_spent_ratio",
            "Spend of the current period over its budget, per team",
            self.budget_spent_ratio.clone(),
        );
        t.register(
            "fairway_budget_alerts",
            "Budget alerts raised, per team and threshold (percent)",
            self.budget_alerts.clone(),
        );
        self
    }

    /// Records one finished request.
    pub fn observe(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let (method, route) = (method.to_owned(), route.to_owned());
        self.latency
            .get_or_create(&RouteLabels { method: method.clone(), route: route.clone() })
            .observe(elapsed.as_secs_f64());
        self.requests.get_or_create(&RequestLabels { method, route, status }).inc();
    }

    /// Records whether this process leads the control loop. A replica that stops leading
    /// withdraws the gauges only the leader keeps current (pending jobs, allocation, budget
    /// spend): exported stale, they would be summed with the new leader's by a dashboard.
    pub fn leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
        if !leading {
            self.pending.clear();
            self.pending_reasons.clear();
            self.allocated.clear();
            self.capacity.clear();
            self.budget_spent_ratio.clear();
            self.sm_active.clear();
            self.idle_gpus.clear();
        }
    }

    /// Declares the label values of the scheduler's counters, so each series exists (at 0)
    /// before its first event: `rate()` and alerts then see a zero, not a missing series.
    pub fn declare(&self, preemption_reasons: &[&str], outcomes: &[&str]) {
        // Creating the series is the point; the guard each call returns is dropped at once.
        for reason in preemption_reasons {
            drop(self.preemptions.get_or_create(&ReasonLabels { reason: (*reason).to_owned() }));
        }
        for outcome in outcomes {
            drop(self.outcomes.get_or_create(&OutcomeLabels { outcome: (*outcome).to_owned() }));
        }
        for phase in CYCLE_PHASES {
            drop(self.cycle_phases.get_or_create(&PhaseLabels { phase }));
        }
        for phase in RECONCILE_PHASES {
            drop(self.reconcile_phases.get_or_create(&PhaseLabels { phase }));
        }
        for outcome in ["delivered", "retrying", "failed"] {
            drop(self.webhook_attempts.get_or_create(&OutcomeLabels { outcome: outcome.to_owned() }));
        }
        for action in IDLE_ACTIONS {
            drop(self.idle_actions.get_or_create(&ActionLabels { action: action.to_owned() }));
        }
    }

    /// Sets the pending jobs per reason after a cycle: every reason of the fixed list, at 0
    /// when no job waits for it, so a dashboard sees each series throughout.
    pub fn pending_reasons(&self, by_reason: &[(&str, u64)]) {
        for &(reason, n) in by_reason {
            self.pending_reasons.get_or_create(&ReasonLabels { reason: reason.to_owned() }).set(gauge_value(n));
        }
    }

    /// Records how long each phase of a scheduling cycle took, in [`CYCLE_PHASES`]' order.
    pub fn cycle_phases(&self, took: [Duration; CYCLE_PHASES.len()]) {
        for (phase, took) in CYCLE_PHASES.into_iter().zip(took) {
            self.cycle_phases.get_or_create(&PhaseLabels { phase }).observe(took.as_secs_f64());
        }
    }

    /// Records how long each phase of a reconciler pass took, in [`RECONCILE_PHASES`]' order.
    pub fn reconcile_phases(&self, took: [Duration; RECONCILE_PHASES.len()]) {
        for (phase, took) in RECONCILE_PHASES.into_iter().zip(took) {
            self.reconcile_phases.get_or_create(&PhaseLabels { phase }).observe(took.as_secs_f64());
        }
    }

    /// Records one scheduling cycle: its duration, the pending jobs and allocation after it
    /// (replacing the last), the admitted jobs' waits (since submission, and since they last
    /// entered the queue) and the preemptions by reason.
    pub fn cycle(
        &self,
        duration: Duration,
        pending: Vec<((String, String), u64)>,
        allocation: Vec<(String, u64, u64)>,
        admission_latencies: &[Waited],
        queue_waits: &[Waited],
        preemptions: &[&str],
    ) {
        self.cycles.observe(duration.as_secs_f64());
        // Replaced whole: a team or class with nothing pending any more has no series.
        self.pending.clear();
        for ((team, gpu_class), n) in pending {
            self.pending.get_or_create(&TeamClassLabels { team, gpu_class }).set(gauge_value(n));
        }
        for (gpu_class, allocated, capacity) in allocation {
            let labels = ClassLabels { gpu_class };
            self.allocated.get_or_create(&labels).set(gauge_value(allocated));
            self.capacity.get_or_create(&labels).set(gauge_value(capacity));
        }
        for (family, waits) in [(&self.admission_latency, admission_latencies), (&self.queue_wait, queue_waits)] {
            for w in waits {
                let labels = WaitLabels { gpu_class: w.gpu_class.clone(), priority_class: w.priority_class.clone() };
                family.get_or_create(&labels).observe(w.seconds);
            }
        }
        for reason in preemptions {
            self.preemptions.get_or_create(&ReasonLabels { reason: (*reason).to_owned() }).inc();
        }
    }

    /// Counts jobs admitted on GPUs held for a blocked gang.
    pub fn backfilled(&self, jobs: usize) {
        self.backfills.inc_by(jobs as u64);
    }

    /// Records every budgeted team's spent ratio for the current period (replacing the last).
    pub fn budgets(&self, spent_ratio: BTreeMap<String, f64>) {
        self.budget_spent_ratio.clear();
        for (team, ratio) in spent_ratio {
            self.budget_spent_ratio.get_or_create(&TeamLabels { team }).set(ratio);
        }
    }

    /// Records what running jobs' GPUs did at the last read, per (team, GPU class): SM
    /// activity (ratio, GPU-weighted) and GPUs held idle; replaced whole, so a team or class
    /// with nothing running any more has no series.
    pub fn gpu_activity(&self, by_team_class: BTreeMap<(String, String), (f64, f64)>) {
        self.sm_active.clear();
        self.idle_gpus.clear();
        for ((team, gpu_class), (sm_active, idle)) in by_team_class {
            let labels = TeamClassLabels { team, gpu_class };
            self.sm_active.get_or_create(&labels).set(sm_active);
            self.idle_gpus.get_or_create(&labels).set(idle);
        }
    }

    /// Counts what idle policies did: one of [`IDLE_ACTIONS`].
    pub fn idle_action(&self, action: &str, jobs: usize) {
        self.idle_actions.get_or_create(&ActionLabels { action: action.to_owned() }).inc_by(jobs as u64);
    }

    /// Counts a GPU fault opened on `cluster` of `kind` (`xid` or `row_remap_failure`).
    pub fn gpu_fault(&self, cluster: &str, kind: &str) {
        self.gpu_faults.get_or_create(&ClusterKindLabels { cluster: cluster.to_owned(), kind: kind.to_owned() }).inc();
    }

    /// Counts a budget alert.
    pub fn budget_alert(&self, team: &str, threshold: i32) {
        self.budget_alerts.get_or_create(&TeamThresholdLabels { team: team.to_owned(), threshold }).inc();
    }

    /// Counts a failed backend call.
    pub fn dispatch_error(&self, cluster: &str, kind: &str) {
        self.dispatch_errors
            .get_or_create(&ClusterKindLabels { cluster: cluster.to_owned(), kind: kind.to_owned() })
            .inc();
    }

    /// Counts a webhook delivery attempt by outcome: `delivered`, `retrying` or `failed`.
    pub fn webhook_delivery(&self, outcome: &str) {
        self.webhook_attempts.get_or_create(&OutcomeLabels { outcome: outcome.to_owned() }).inc();
    }

    /// Counts an ended attempt by outcome.
    pub fn outcome(&self, outcome: &str) {
        self.outcomes.get_or_create(&OutcomeLabels { outcome: outcome.to_owned() }).inc();
    }

    /// The OpenMetrics text exposition ([`CONTENT_TYPE`]). `pool` is (open, idle) database
    /// connections.
    pub fn render(&self, pool: (u32, usize), tenants: Tenants) -> String {
        let (open, idle) = pool;
        self.db_connections.get_or_create(&StateLabels { state: "idle" }).set(gauge_value(idle));
        self.db_connections
            .get_or_create(&StateLabels { state: "in_use" })
            .set(gauge_value((open as usize).saturating_sub(idle)));
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode_registry(&mut out, &self.public);
        if tenants == Tenants::Named {
            let _ = encode_registry(&mut out, &self.tenants);
        }
        let _ = encode_eof(&mut out);
        out
    }
}

/// A count as a gauge value (gauges are signed).
fn gauge_value(n: impl TryInto<i64>) -> i64 {
    n.try_into().unwrap_or(i64::MAX)
}

/// The standard `process_*` metrics, read from `/proc/self` on each scrape (Linux); any that
/// cannot be read are left out.
#[derive(Debug)]
struct Process;

impl Collector for Process {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        // Linux reports memory in pages and CPU time in USER_HZ ticks: 4 KiB and 100 on every
        // architecture Fairway is built for (x86-64, arm64).
        let page = 4096.0;
        let ticks = 100.0;
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after `pid (comm) `, numbered from 3 (state) as in proc(5).
        let fields: Vec<&str> = stat.rsplit_once(") ").map(|(_, rest)| rest.split(' ').collect()).unwrap_or_default();
        let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<f64>().ok());
        if let (Some(utime), Some(stime)) = (field(14), field(15)) {
            let cpu = ConstCounter::new((utime + stime) / ticks);
            cpu.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                cpu.metric_type(),
            )?)?;
        }
        let mut gauge = |name: &str, help: &str, value: f64| -> std::fmt::Result {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
        };
        if let Some(rss) = field(24) {
            gauge("process_resident_memory_bytes", "Resident memory size in bytes", rss * page)?;
        }
        if let Some(vsize) = field(23) {
            gauge("process_virtual_memory_bytes", "Virtual memory size in bytes", vsize)?;
        }
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("btime ").and_then(|v| v.trim().parse::<f64>().ok())));
        if let (Some(boot), Some(start)) = (boot, field(22)) {
            gauge(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                boot + start / ticks,
            )?;
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            gauge("process_open_fds", "Number of open file descriptors", fds.count() as f64)?;
        }
        Ok(())
    }
}

/// The whole chain of `error`'s causes, outermost first, joined for one log line (or one
/// entry of a delivery log).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_that_name_a_team_are_rendered_only_for_the_token_holder() {
        let metrics = Metrics::default();
        metrics.budget_alert("secret-project", 80);
        let named = metrics.render((1, 1), Tenants::Named);
        assert!(named.contains("fairway_budget_alerts_total{team=\"secret-project\",threshold=\"80\"} 1"));
        let hidden = metrics.render((1, 1), Tenants::Hidden);
        assert!(!hidden.contains("secret-project") && !hidden.contains("team="), "{hidden}");
        assert!(hidden.contains("fairway_scheduler_leader"), "the rest is still there");
    }

    #[test]
    fn a_replica_that_stops_leading_withdraws_the_leaders_gauges_and_keeps_its_counters() {
        let metrics = Metrics::default();
        metrics.leader(true);
        let pending = vec![(("ml".to_owned(), "h100".to_owned()), 3)];
        metrics.cycle(Duration::from_millis(5), pending, vec![("h100".into(), 4, 8)], &[], &[], &["priority"]);
        metrics.budgets(BTreeMap::from([("ml".to_owned(), 0.5)]));
        let leading = metrics.render((1, 1), Tenants::Named);
        assert!(leading.contains("fairway_pending_jobs{team=\"ml\",gpu_class=\"h100\"} 3"), "{leading}");
        assert!(leading.contains("fairway_gpus_allocated{gpu_class=\"h100\"} 4"), "{leading}");
        assert!(leading.contains("fairway_budget_spent_ratio{team=\"ml\"} 0.5"), "{leading}");
        metrics.leader(false);
        let standing_by = metrics.render((1, 1), Tenants::Named);
        assert!(standing_by.contains("fairway_scheduler_leader 0"), "{standing_by}");
        for gone in [
            "fairway_pending_jobs{",
            "fairway_gpus_allocated{",
            "fairway_gpus_capacity{",
            "fairway_budget_spent_ratio{",
        ] {
            assert!(!standing_by.contains(gone), "{gone} is stale after leadership is lost:\n{standing_by}");
        }
        assert!(standing_by.contains("fairway_preemptions_total{reason=\"priority\"} 1"), "counters stay");
    }

    #[test]
    fn each_phase_of_a_cycle_and_of_a_reconciler_pass_is_its_own_series() {
        let metrics = Metrics::default();
        metrics.cycle_phases([1, 8, 2, 30].map(Duration::from_millis));
        metrics.reconcile_phases([40, 700, 3, 0].map(Duration::from_millis));
        let text = metrics.render((1, 1), Tenants::Hidden);
        for series in [
            "fairway_reconcile_phase_seconds_sum{phase=\"logs\"} 0.7",
            "fairway_reconcile_phase_seconds_bucket{le=\"0.05\",phase=\"list\"} 1",
            "fairway_reconcile_phase_seconds_count{phase=\"cleanup\"} 1",
            "fairway_scheduling_cycle_phase_seconds_sum{phase=\"read\"} 0.008",
            "fairway_scheduling_cycle_phase_seconds_sum{phase=\"engine\"} 0.002",
            "fairway_scheduling_cycle_phase_seconds_bucket{le=\"0.025\",phase=\"write\"} 0",
            "fairway_scheduling_cycle_phase_seconds_bucket{le=\"0.05\",phase=\"write\"} 1",
        ] {
            assert!(text.contains(series), "{series} missing:\n{text}");
        }
    }

    #[test]
    fn declared_counters_are_zero_before_their_first_event_and_build_and_process_metrics_are_there() {
        let metrics = Metrics::default();
        metrics.declare(&["priority", "reclaim"], &["succeeded", "node_lost"]);
        let text = metrics.render((1, 1), Tenants::Hidden);
        for series in [
            "fairway_preemptions_total{reason=\"reclaim\"} 0",
            "fairway_backfills_total 0",
            "fairway_job_attempts_total{outcome=\"node_lost\"} 0",
            "fairway_scheduling_cycle_phase_seconds_count{phase=\"write\"} 0",
            &format!("fairway_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION")),
        ] {
            assert!(text.contains(series), "{series} missing:\n{text}");
        }
        let value = |name: &str| -> f64 {
            let prefix = format!("{name} ");
            let line = text.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("{name} missing"));
            line[prefix.len()..].parse().unwrap()
        };
        assert!(value("process_cpu_seconds_total") >= 0.0);
        assert!(value("process_resident_memory_bytes") > 1e6, "a running test binary holds megabytes");
        assert!(value("process_open_fds") >= 3.0, "stdin, stdout and stderr at least");
        let started = value("process_start_time_seconds");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        assert!(started <= now + 1.0 && now - started < 3600.0, "started {started}, now {now}");
    }

    #[test]
    fn histograms_render_cumulative_buckets_with_their_labels() {
        let metrics = Metrics::default();
        metrics.observe("GET", "/api/v1/teams", 200, Duration::from_millis(30));
        metrics.observe("GET", "/api/v1/teams", 200, Duration::from_millis(3));
        let waited = Waited { gpu_class: "h100".into(), priority_class: "batch".into(), seconds: 2.0 };
        metrics.cycle(Duration::from_millis(20), Vec::new(), Vec::new(), &[waited], &[], &[]);
        let text = metrics.render((1, 1), Tenants::Named);
        let route = "method=\"GET\",route=\"/api/v1/teams\"";
        assert!(text.contains(&format!("fairway_http_request_duration_seconds_bucket{{le=\"0.005\",{route}}} 1")));
        assert!(text.contains(&format!("fairway_http_request_duration_seconds_bucket{{le=\"0.05\",{route}}} 2")));
        assert!(text.contains(&format!("fairway_http_request_duration_seconds_count{{{route}}} 2")));
        let wait = "gpu_class=\"h100\",priority_class=\"batch\"";
        assert!(text.contains(&format!("fairway_admission_latency_seconds_bucket{{le=\"1.0\",{wait}}} 0")), "{text}");
        assert!(text.contains(&format!("fairway_admission_latency_seconds_bucket{{le=\"5.0\",{wait}}} 1")), "{text}");
        assert!(text.contains("fairway_scheduling_cycle_duration_seconds_count 1"), "{text}");
    }
}
