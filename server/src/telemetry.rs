//! Logging and metrics. Logs are compact text locally and JSON lines in clusters
//! (`FAIRWAY_LOG_FORMAT=json`); metrics are Prometheus text at `/metrics`. The request
//! middleware that feeds them lives in `http::trace`.
//!
//! The metrics registry is a handful of counters and one histogram kept under a mutex: the
//! request rate of a control-plane API does not justify a metrics crate and its dependencies.

use std::{collections::BTreeMap, fmt::Write as _, sync::Mutex, time::Duration};

/// Installs the global tracing subscriber once (levels from `RUST_LOG`, else `default_filter`);
/// later calls are no-ops.
pub fn init(json: bool, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    use std::io::IsTerminal as _;
    // Colour only for a person at a terminal, never into files or log pipelines.
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = if json { builder.json().flatten_event(true).try_init() } else { builder.compact().try_init() };
}

/// Upper bounds of the HTTP latency histogram, in seconds.
const BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Request counters and latencies by route, and the control loop's figures.
/// Whether a rendering may name teams: only for a caller holding the metrics token, since a
/// team's existence must not leak to anyone else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tenants {
    /// Per-team series included.
    Named,
    /// Series that name a team left out.
    Hidden,
}

#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    latency: Mutex<BTreeMap<(String, String), Buckets>>,
    scheduler: Mutex<SchedulerMetrics>,
    budgets: Mutex<BudgetMetrics>,
}

/// What the metering pass reports of budgets.
#[derive(Default)]
struct BudgetMetrics {
    /// Per team: spent ÷ budget of the current period, in the budget's unit.
    spent_ratio: BTreeMap<String, f64>,
    /// Alerts raised since start, by team and threshold (percent).
    alerts: BTreeMap<(String, i32), u64>,
}

/// Upper bounds of the scheduling-cycle histogram, in seconds.
const CYCLE_BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];
/// Upper bounds of the admission-latency and queue-wait histograms, in seconds.
const WAIT_BUCKETS: [f64; 12] = [0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 14_400.0, 43_200.0, 86_400.0];

/// A histogram over fixed bounds.
#[derive(Default, Clone)]
struct Buckets {
    counts: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Buckets {
    fn observe(&mut self, bounds: &[f64], value: f64) {
        if self.counts.len() != bounds.len() {
            self.counts = vec![0; bounds.len()];
        }
        for (i, bound) in bounds.iter().enumerate() {
            if value <= *bound {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += value;
    }

    /// Writes the series of `name`; `labels` (e.g. `method="GET",`) go before `le`.
    fn render(&self, out: &mut String, name: &str, labels: &str, bounds: &[f64]) {
        for (i, bound) in bounds.iter().enumerate() {
            let n = self.counts.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{bound}\"}} {n}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {}", self.count);
        let labels = labels.trim_end_matches(',');
        let labels = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        let _ = writeln!(out, "{name}_sum{labels} {}", self.sum);
        let _ = writeln!(out, "{name}_count{labels} {}", self.count);
    }
}

/// What the control loop reports: gauges from the last cycle, counters since start.
#[derive(Default)]
struct SchedulerMetrics {
    leader: bool,
    pending: Vec<((String, String), u64)>,
    allocation: Vec<(String, u64, u64)>,
    cycles: Buckets,
    admission_latency: Buckets,
    queue_wait: Buckets,
    preemptions: BTreeMap<String, u64>,
    dispatch_errors: BTreeMap<(String, String), u64>,
    outcomes: BTreeMap<String, u64>,
}

impl Metrics {
    /// Records one finished request.
    pub fn observe(&self, method: &str, route: &str, status: u16, elapsed: Duration) {
        let key = (method.to_owned(), route.to_owned());
        if let Ok(mut requests) = self.requests.lock() {
            *requests.entry((key.0.clone(), key.1.clone(), status)).or_default() += 1;
        }
        if let Ok(mut latency) = self.latency.lock() {
            latency.entry(key).or_default().observe(&BUCKETS, elapsed.as_secs_f64());
        }
    }

    /// Records whether this process leads the control loop. A replica that stops leading
    /// withdraws the gauges only the leader keeps current (pending jobs, allocation, budget
    /// spend): exported stale, they would be summed with the new leader's by a dashboard.
    pub fn leader(&self, leading: bool) {
        if let Ok(mut m) = self.scheduler.lock() {
            m.leader = leading;
            if !leading {
                m.pending.clear();
                m.allocation.clear();
            }
        }
        if !leading {
            if let Ok(mut m) = self.budgets.lock() {
                m.spent_ratio.clear();
            }
        }
    }

    /// Declares the label values of the scheduler's counters, so each series exists (at 0)
    /// before its first event: `rate()` and alerts then see a zero, not a missing series.
    pub fn declare(&self, preemption_reasons: &[&str], outcomes: &[&str]) {
        if let Ok(mut m) = self.scheduler.lock() {
            for reason in preemption_reasons {
                m.preemptions.entry((*reason).to_owned()).or_default();
            }
            for outcome in outcomes {
                m.outcomes.entry((*outcome).to_owned()).or_default();
            }
        }
    }

    /// Records one scheduling cycle: its duration, the pending jobs and allocation after it,
    /// the admitted jobs' waits (since submission, and since they last entered the queue)
    /// and the preemptions by reason.
    pub fn cycle(
        &self,
        duration: Duration,
        pending: Vec<((String, String), u64)>,
        allocation: Vec<(String, u64, u64)>,
        admission_latencies: &[f64],
        queue_waits: &[f64],
        preemptions: &[&str],
    ) {
        if let Ok(mut m) = self.scheduler.lock() {
            m.cycles.observe(&CYCLE_BUCKETS, duration.as_secs_f64());
            m.pending = pending;
            m.allocation = allocation;
            for v in admission_latencies {
                m.admission_latency.observe(&WAIT_BUCKETS, *v);
            }
            for v in queue_waits {
                m.queue_wait.observe(&WAIT_BUCKETS, *v);
            }
            for r in preemptions {
                *m.preemptions.entry((*r).to_owned()).or_default() += 1;
            }
        }
    }

    /// Records every budgeted team's spent ratio for the current period (replacing the last).
    pub fn budgets(&self, spent_ratio: BTreeMap<String, f64>) {
        if let Ok(mut m) = self.budgets.lock() {
            m.spent_ratio = spent_ratio;
        }
    }

    /// Counts a budget alert.
    pub fn budget_alert(&self, team: &str, threshold: i32) {
        if let Ok(mut m) = self.budgets.lock() {
            *m.alerts.entry((team.to_owned(), threshold)).or_default() += 1;
        }
    }

    fn render_budgets(&self, out: &mut String) {
        let Ok(m) = self.budgets.lock() else { return };
        out.push_str("# HELP fairway_budget_spent_ratio Spend of the current period over its budget, per team.\n");
        out.push_str("# TYPE fairway_budget_spent_ratio gauge\n");
        for (team, ratio) in &m.spent_ratio {
            let _ = writeln!(out, "fairway_budget_spent_ratio{{team=\"{team}\"}} {ratio}");
        }
        out.push_str("# HELP fairway_budget_alerts_total Budget alerts raised, per team and threshold (percent).\n");
        out.push_str("# TYPE fairway_budget_alerts_total counter\n");
        for ((team, threshold), n) in &m.alerts {
            let _ = writeln!(out, "fairway_budget_alerts_total{{team=\"{team}\",threshold=\"{threshold}\"}} {n}");
        }
    }

    /// Counts a failed backend call.
    pub fn dispatch_error(&self, cluster: &str, kind: &str) {
        if let Ok(mut m) = self.scheduler.lock() {
            *m.dispatch_errors.entry((cluster.to_owned(), kind.to_owned())).or_default() += 1;
        }
    }

    /// Counts an ended attempt by outcome.
    pub fn outcome(&self, outcome: &str) {
        if let Ok(mut m) = self.scheduler.lock() {
            *m.outcomes.entry(outcome.to_owned()).or_default() += 1;
        }
    }

    fn render_scheduler(&self, out: &mut String, tenants: Tenants) {
        let Ok(m) = self.scheduler.lock() else { return };
        out.push_str("# HELP fairway_scheduler_leader Whether this process runs the scheduler (1) or stands by (0).\n");
        out.push_str("# TYPE fairway_scheduler_leader gauge\n");
        let _ = writeln!(out, "fairway_scheduler_leader {}", u8::from(m.leader));
        if tenants == Tenants::Named {
            out.push_str("# HELP fairway_pending_jobs Jobs waiting for admission, by team and GPU class.\n");
            out.push_str("# TYPE fairway_pending_jobs gauge\n");
            for ((team, class), n) in &m.pending {
                let _ = writeln!(out, "fairway_pending_jobs{{team=\"{team}\",gpu_class=\"{class}\"}} {n}");
            }
        }
        out.push_str("# HELP fairway_gpus_allocated GPUs held by admitted jobs, by GPU class.\n");
        out.push_str("# TYPE fairway_gpus_allocated gauge\n");
        for (class, allocated, _) in &m.allocation {
            let _ = writeln!(out, "fairway_gpus_allocated{{gpu_class=\"{class}\"}} {allocated}");
        }
        out.push_str("# HELP fairway_gpus_capacity GPUs the clusters offer, by GPU class.\n");
        out.push_str("# TYPE fairway_gpus_capacity gauge\n");
        for (class, _, capacity) in &m.allocation {
            let _ = writeln!(out, "fairway_gpus_capacity{{gpu_class=\"{class}\"}} {capacity}");
        }
        out.push_str("# HELP fairway_scheduling_cycle_duration_seconds Snapshot, engine and commit of one cycle.\n");
        out.push_str("# TYPE fairway_scheduling_cycle_duration_seconds histogram\n");
        m.cycles.render(out, "fairway_scheduling_cycle_duration_seconds", "", &CYCLE_BUCKETS);
        out.push_str("# HELP fairway_admission_latency_seconds Time from submission to first admission.\n");
        out.push_str("# TYPE fairway_admission_latency_seconds histogram\n");
        m.admission_latency.render(out, "fairway_admission_latency_seconds", "", &WAIT_BUCKETS);
        out.push_str(
            "# HELP fairway_queue_wait_seconds Time from entering the queue (or re-entering it) to admission.\n",
        );
        out.push_str("# TYPE fairway_queue_wait_seconds histogram\n");
        m.queue_wait.render(out, "fairway_queue_wait_seconds", "", &WAIT_BUCKETS);
        out.push_str("# HELP fairway_preemptions_total Jobs preempted, by reason.\n");
        out.push_str("# TYPE fairway_preemptions_total counter\n");
        for (reason, n) in &m.preemptions {
            let _ = writeln!(out, "fairway_preemptions_total{{reason=\"{reason}\"}} {n}");
        }
        out.push_str("# HELP fairway_dispatch_errors_total Failed backend calls, by cluster and kind.\n");
        out.push_str("# TYPE fairway_dispatch_errors_total counter\n");
        for ((cluster, kind), n) in &m.dispatch_errors {
            let _ = writeln!(out, "fairway_dispatch_errors_total{{cluster=\"{cluster}\",kind=\"{kind}\"}} {n}");
        }
        out.push_str("# HELP fairway_job_attempts_total Ended job attempts, by outcome.\n");
        out.push_str("# TYPE fairway_job_attempts_total counter\n");
        for (outcome, n) in &m.outcomes {
            let _ = writeln!(out, "fairway_job_attempts_total{{outcome=\"{outcome}\"}} {n}");
        }
    }

    /// The Prometheus text exposition. `pool` is (open, idle) database connections.
    pub fn render(&self, pool: (u32, usize), tenants: Tenants) -> String {
        let mut out = String::new();
        out.push_str("# HELP fairway_build_info The running build: 1, labelled with its version.\n");
        out.push_str("# TYPE fairway_build_info gauge\n");
        let _ = writeln!(out, "fairway_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
        render_process(&mut out);
        out.push_str("# HELP fairway_http_requests_total HTTP requests by method, route and status.\n");
        out.push_str("# TYPE fairway_http_requests_total counter\n");
        if let Ok(requests) = self.requests.lock() {
            for ((method, route, status), n) in requests.iter() {
                let _ = writeln!(
                    out,
                    "fairway_http_requests_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP fairway_http_request_duration_seconds HTTP request latency.\n");
        out.push_str("# TYPE fairway_http_request_duration_seconds histogram\n");
        if let Ok(latency) = self.latency.lock() {
            for ((method, route), h) in latency.iter() {
                let labels = format!("method=\"{method}\",route=\"{route}\",");
                h.render(&mut out, "fairway_http_request_duration_seconds", &labels, &BUCKETS);
            }
        }
        let (open, idle) = pool;
        out.push_str("# HELP fairway_db_connections Database pool connections by state.\n");
        out.push_str("# TYPE fairway_db_connections gauge\n");
        let _ = writeln!(out, "fairway_db_connections{{state=\"idle\"}} {idle}");
        let _ = writeln!(out, "fairway_db_connections{{state=\"in_use\"}} {}", (open as usize).saturating_sub(idle));
        self.render_scheduler(&mut out, tenants);
        if tenants == Tenants::Named {
            self.render_budgets(&mut out);
        }
        out
    }
}

/// The standard `process_*` metrics, read from `/proc/self` (Linux); any that cannot be read
/// are left out.
fn render_process(out: &mut String) {
    // Linux reports memory in pages and CPU time in USER_HZ ticks: 4 KiB and 100 on every
    // architecture Fairway is built for (x86-64, arm64).
    let page = 4096.0;
    let ticks = 100.0;
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after `pid (comm) `, numbered from 3 (state) as in proc(5).
    let fields: Vec<&str> = stat.rsplit_once(") ").map(|(_, rest)| rest.split(' ').collect()).unwrap_or_default();
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<f64>().ok());
    if let (Some(utime), Some(stime)) = (field(14), field(15)) {
        out.push_str("# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n");
        out.push_str("# TYPE process_cpu_seconds_total counter\n");
        let _ = writeln!(out, "process_cpu_seconds_total {}", (utime + stime) / ticks);
    }
    if let Some(rss) = field(24) {
        out.push_str("# HELP process_resident_memory_bytes Resident memory size in bytes.\n");
        out.push_str("# TYPE process_resident_memory_bytes gauge\n");
        let _ = writeln!(out, "process_resident_memory_bytes {}", rss * page);
    }
    if let Some(vsize) = field(23) {
        out.push_str("# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n");
        out.push_str("# TYPE process_virtual_memory_bytes gauge\n");
        let _ = writeln!(out, "process_virtual_memory_bytes {vsize}");
    }
    let boot = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("btime ").and_then(|v| v.trim().parse::<f64>().ok())));
    if let (Some(boot), Some(start)) = (boot, field(22)) {
        out.push_str("# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n");
        out.push_str("# TYPE process_start_time_seconds gauge\n");
        let _ = writeln!(out, "process_start_time_seconds {}", boot + start / ticks);
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        out.push_str("# HELP process_open_fds Number of open file descriptors.\n");
        out.push_str("# TYPE process_open_fds gauge\n");
        let _ = writeln!(out, "process_open_fds {}", fds.count());
    }
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
    fn declared_counters_are_zero_before_their_first_event_and_build_and_process_metrics_are_there() {
        let metrics = Metrics::default();
        metrics.declare(&["priority", "reclaim"], &["succeeded", "node_lost"]);
        let text = metrics.render((1, 1), Tenants::Hidden);
        for series in [
            "fairway_preemptions_total{reason=\"reclaim\"} 0",
            "fairway_job_attempts_total{outcome=\"node_lost\"} 0",
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
        metrics.cycle(Duration::from_millis(20), Vec::new(), Vec::new(), &[2.0], &[], &[]);
        let text = metrics.render((1, 1), Tenants::Named);
        let route = "method=\"GET\",route=\"/api/v1/teams\"";
        assert!(text.contains(&format!("fairway_http_request_duration_seconds_bucket{{{route},le=\"0.005\"}} 1")));
        assert!(text.contains(&format!("fairway_http_request_duration_seconds_bucket{{{route},le=\"0.05\"}} 2")));
        assert!(text.contains(&format!("fairway_http_request_duration_seconds_count{{{route}}} 2")));
        assert!(text.contains("fairway_admission_latency_seconds_bucket{le=\"1\"} 0"), "{text}");
        assert!(text.contains("fairway_admission_latency_seconds_bucket{le=\"5\"} 1"), "{text}");
        assert!(text.contains("fairway_scheduling_cycle_duration_seconds_count 1"), "{text}");
    }
}
