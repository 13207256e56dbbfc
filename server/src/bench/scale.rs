//! `fairway bench scale`: a large organisation's burst of jobs through the whole platform, in
//! real time, and where the database's time goes.
//!
//! The workload follows Kueue's large-scale performance test (kubernetes-sigs/kueue,
//! `test/performance/scheduler/configs/large-scale`: cohorts of 100 cluster queues, each with
//! 20 GPUs of nominal quota and 100 it may borrow, small, medium and large workloads of 1, 5
//! and 20 GPUs running 50, 100 and 200 ms at priorities 50, 100 and 200) at the size issue 24
//! names: 1,000 teams in 10 closed departments, 50 jobs per team (35 small, 10 medium,
//! 5 large), 50,000 jobs in all. Each team submits its jobs in [`BURSTS`] bursts of ten,
//! [`BURST_EVERY`] apart; within a burst the teams start one after another over
//! [`BURST_SPREAD`], so arrivals come in waves of 10,000 jobs, as CI pipelines fire after a
//! merge.
//!
//! Everything is real but the GPUs: each job is a `POST` over HTTP with its team's CI token,
//! stored durably, admitted by the leader's cycles, dispatched through the outbox to the
//! simulated cluster (jobs start the moment they are created), watched by the reconciler and
//! ended there. Placement is not the question: each department's GPUs are nodes of 50 GPUs of
//! one class holding exactly its teams' reserved quota.
//!
//! The same workload at a tenth of the size (10 teams per department, 5,000 jobs, arriving
//! over the same time) runs first in the same invocation: the baseline that shows what grows
//! with scale. PostgreSQL loads `pg_stat_statements`, and the report shows, per job, the
//! transactions, WAL and rows the database wrote, per table, and the statements that took its
//! time. A second control loop contends for leadership throughout, as a standby replica
//! does, and the report shows whether leadership changed hands and the longest the leader
//! went without renewing its lease.

use std::{
    collections::BTreeMap,
    io::Write,
    time::{Duration, Instant},
};

use serde_json::json;

use super::platform::{
    client, departments_inventory, load_average, quantile, write_held, LeaseWatch, LeaseWatcher, Options, Percentiles,
    Phase, Platform,
};
use crate::db::{self, bench::Activity};

/// Closed departments (Kueue's cohorts).
const DEPARTMENTS: usize = 10;
/// Each team's reserved GPUs (Kueue's nominal quota).
const RESERVED: i32 = 20;
/// Each team's burst GPUs (Kueue's borrowing limit).
const BURST: i32 = 100;
/// GPUs per node (the simulated cluster allows 64 at most); each department has as many nodes
/// as hold exactly its teams' reserved quota.
const GPUS_PER_NODE: usize = 50;
const CLASS: &str = "scale-gpu";
/// Bursts each team submits in.
const BURSTS: u32 = 5;
/// Time between the starts of two bursts.
const BURST_EVERY: Duration = Duration::from_secs(6);
/// Within a burst, the teams start one after another over this long.
const BURST_SPREAD: Duration = Duration::from_secs(2);
/// Gives up waiting for the queue to drain after this long.
const DRAIN_LIMIT: Duration = Duration::from_secs(600);
/// The goals of issue 24 for the full size.
const GOAL_DRAIN_S: f64 = 30.0;
const GOAL_ADMISSIONS_PER_S: f64 = 2_000.0;

/// One kind of job of the workload.
struct Shape {
    priority_class: &'static str,
    priority: i32,
    gpus: u32,
    runtime: Duration,
}

const SHAPES: [Shape; 3] = [
    Shape { priority_class: "scale-large", priority: 200, gpus: 20, runtime: Duration::from_millis(200) },
    Shape { priority_class: "scale-medium", priority: 100, gpus: 5, runtime: Duration::from_millis(100) },
    Shape { priority_class: "scale-small", priority: 50, gpus: 1, runtime: Duration::from_millis(50) },
];

/// The shapes of one team's burst of ten jobs, in the order it submits them (indices into
/// [`SHAPES`]): 7 small, 2 medium, 1 large.
const BURST_ORDER: [usize; 10] = [2, 2, 1, 2, 2, 0, 2, 2, 1, 2];

/// One size of the workload.
#[derive(Debug, Clone, Copy)]
pub struct Size {
    /// Teams in each of the [`DEPARTMENTS`] departments.
    pub teams_per_department: usize,
}

impl Size {
    /// The size issue 24 names: 1,000 teams, 50,000 jobs.
    pub const FULL: Self = Self { teams_per_department: 100 };
    /// The baseline: a tenth of the teams and jobs over the same time.
    pub const TENTH: Self = Self { teams_per_department: 10 };

    fn teams(self) -> usize {
        DEPARTMENTS * self.teams_per_department
    }

    fn jobs(self) -> usize {
        self.teams() * BURSTS as usize * BURST_ORDER.len()
    }
}

/// The simulated cluster: per department, nodes of [`GPUS_PER_NODE`] that hold its teams'
/// reserved quota; jobs start when created.
fn inventory(size: Size) -> String {
    departments_inventory(
        CLASS,
        DEPARTMENTS,
        size.teams_per_department * RESERVED as usize / GPUS_PER_NODE,
        GPUS_PER_NODE,
    )
}

/// Runs the baseline and the full size and writes the report to `out`.
pub async fn report(out: &mut dyn Write) -> anyhow::Result<()> {
    writeln!(
        out,
        "A large organisation's burst through Fairway in real time: {DEPARTMENTS} closed departments, \
         each team {RESERVED} GPUs reserved + {BURST} burst, 50 jobs per team (35 x 1 GPU 50 ms, 10 x 5 GPUs 100 ms, \
         5 x 20 GPUs 200 ms) in {BURSTS} bursts {} s apart.",
        BURST_EVERY.as_secs()
    )?;
    writeln!(out, "(HTTP submissions with CI tokens, durable PostgreSQL, the control loop, the simulated cluster.)")?;
    out.flush()?;
    let mut runs = Vec::new();
    for size in [Size::TENTH, Size::FULL] {
        writeln!(out, "running {} teams, {} jobs ...", size.teams(), size.jobs())?;
        out.flush()?;
        runs.push(run(size).await?);
    }
    print(&runs, out)
}

/// What one size measured.
struct Run {
    size: Size,
    drained: bool,
    failed_submissions: usize,
    arrival_s: f64,
    submit: Percentiles,
    drain_s: f64,
    admitted: usize,
    admission_waits: Vec<f64>,
    per_second: Vec<(i64, i64)>,
    phases: BTreeMap<String, Phase>,
    activity: Activity,
    statements: Vec<db::bench::StatementTime>,
    held: Vec<db::bench::HeldBreakdown>,
    /// The leader row while the jobs arrived and drained, with a standby contending.
    lease: LeaseWatch,
}

async fn run(size: Size) -> anyhow::Result<Run> {
    let mut platform = Platform::start(Options {
        sim_inventory: Some(inventory(size)),
        control: true,
        tune: Some(|config| {
            // Kueue preempts at once; the default minimum runtime protects hours-long jobs.
            config.min_runtime_before_preemption = Duration::ZERO;
        }),
        statement_stats: true,
        standby: true,
    })
    .await?;
    let result = measure(&mut platform, size).await;
    platform.stop().await;
    result
}

async fn measure(platform: &mut Platform, size: Size) -> anyhow::Result<Run> {
    for shape in &SHAPES {
        platform.priority_class(shape.priority_class, shape.priority, true).await?;
    }
    let teams = platform.departments(DEPARTMENTS, size.teams_per_department, CLASS, (RESERVED, BURST)).await?;
    let http = client()?;
    let before = platform.cycle_phases(&http).await?;
    db::bench::reset_activity(&platform.pool).await?;
    let lease = LeaseWatcher::start(platform.pool.clone(), Duration::from_millis(250));

    let start = tokio::time::Instant::now() + Duration::from_millis(500);
    let team_count = teams.len() as u32;
    let mut submitters = tokio::task::JoinSet::new();
    for (i, (team, token)) in teams.into_iter().enumerate() {
        let (http, url) = (http.clone(), format!("{}/teams/{team}/jobs", platform.api));
        let offset = BURST_SPREAD * u32::try_from(i)? / team_count;
        submitters.spawn(async move {
            let mut latencies = Vec::with_capacity(BURSTS as usize * BURST_ORDER.len());
            let mut failed = 0usize;
            for burst in 0..BURSTS {
                tokio::time::sleep_until(start + BURST_EVERY * burst + offset).await;
                for (k, &shape) in BURST_ORDER.iter().enumerate() {
                    let shape = &SHAPES[shape];
                    let body = json!({
                        "name": format!("{}-{burst}-{k}", shape.priority_class),
                        "gpu_class": CLASS,
                        "gpus_per_replica": shape.gpus,
                        "priority_class": shape.priority_class,
                        "max_runtime_seconds": 600,
                        "preemption_grace_seconds": 0,
                        "image": "registry.example/scale-bench:1",
                        "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": format!("{}", shape.runtime.as_secs_f64())},
                    });
                    let sent = Instant::now();
                    let response = http.post(&url).bearer_auth(&token).json(&body).send().await;
                    latencies.push(sent.elapsed());
                    match response {
                        Ok(r) if r.status().as_u16() == 201 => {}
                        Ok(r) => {
                            failed += 1;
                            tracing::warn!(status = %r.status(), "a benchmark submission was refused");
                        }
                        Err(e) => {
                            failed += 1;
                            tracing::warn!(error = %e, "a benchmark submission failed");
                        }
                    }
                }
            }
            (latencies, failed, Instant::now())
        });
    }
    let mut latencies = Vec::new();
    let mut failed_submissions = 0;
    let mut last_sent = Instant::now();
    let first_due = start.into_std();
    while let Some(done) = submitters.join_next().await {
        let (l, f, at) = done?;
        latencies.extend(l);
        failed_submissions += f;
        last_sent = last_sent.max(at);
    }
    let arrival_s = last_sent.saturating_duration_since(first_due).as_secs_f64();
    let drained = platform.drain(DRAIN_LIMIT, Duration::from_millis(100)).await?;
    let phases = platform.cycle_phases(&http).await?.since(&before);
    let lease = lease.finish().await?;
    let span = db::bench::workload_span(&platform.pool).await?;
    let mut admission_waits = db::bench::admission_waits(&platform.pool, "").await?;
    admission_waits.sort_by(f64::total_cmp);
    let per_second = db::bench::admissions_per_second(&platform.pool).await?;
    let held = db::bench::held_breakdown(&platform.pool).await?;
    let mut conn = platform.quiesce().await?;
    let activity = db::bench::activity(&mut conn).await?;
    let statements = db::bench::statement_times(&mut conn).await?;
    Ok(Run {
        size,
        drained,
        failed_submissions,
        arrival_s,
        submit: Percentiles::of(&latencies),
        drain_s: span.drain_s,
        admitted: admission_waits.len(),
        admission_waits,
        per_second,
        phases,
        activity,
        statements,
        held,
        lease,
    })
}

impl Run {
    fn jobs(&self) -> f64 {
        self.size.jobs() as f64
    }

    /// Admissions per second from the first second with one to the last.
    fn sustained_admissions(&self) -> f64 {
        match (self.per_second.first(), self.per_second.last()) {
            (Some(first), Some(last)) => self.admitted as f64 / (last.0 - first.0 + 1) as f64,
            _ => 0.0,
        }
    }

    fn peak_admissions(&self) -> i64 {
        self.per_second.iter().map(|(_, n)| *n).max().unwrap_or(0)
    }

    fn phase(&self, name: &str) -> Phase {
        self.phases.get(name).copied().unwrap_or_default()
    }

    fn cycles(&self) -> f64 {
        self.phase("engine").cycles
    }

    fn statements(&self) -> f64 {
        self.statements.iter().map(|s| s.calls as f64).sum()
    }

    fn rows_written(&self) -> f64 {
        self.activity.tables.iter().map(|t| t.written() as f64).sum()
    }
}

fn print(runs: &[Run], out: &mut dyn Write) -> anyhow::Result<()> {
    writeln!(out)?;
    for run in runs {
        if !run.drained {
            writeln!(out, "THE QUEUE DID NOT DRAIN within {} s at {} jobs.", DRAIN_LIMIT.as_secs(), run.size.jobs())?;
        }
        if run.failed_submissions > 0 {
            writeln!(out, "{} submissions failed at {} jobs (see the log).", run.failed_submissions, run.size.jobs())?;
        }
    }
    let header = |out: &mut dyn Write| -> std::io::Result<()> {
        write!(out, "{:<44}", "")?;
        for run in runs {
            write!(out, " {:>16}", format!("{} jobs", super::thousands(run.size.jobs() as u64)))?;
        }
        writeln!(out, " {:>14}", "goal (full)")?;
        writeln!(out, "{}", "-".repeat(44 + 17 * runs.len() + 15))
    };
    let row = |out: &mut dyn Write, what: &str, value: &dyn Fn(&Run) -> String, goal: &str| -> std::io::Result<()> {
        write!(out, "{what:<44}")?;
        for run in runs {
            write!(out, " {:>16}", value(run))?;
        }
        writeln!(out, " {goal:>14}")
    };
    header(out)?;
    row(out, "teams", &|r| r.size.teams().to_string(), "")?;
    row(out, "arrivals: first to last submission", &|r| format!("{:.1} s", r.arrival_s), "")?;
    row(out, "submission p50 / p99 (client)", &|r| format!("{:.0} / {:.0} ms", r.submit.p50, r.submit.p99), "")?;
    row(
        out,
        "drain: first submission to last end",
        &|r| format!("{:.1} s", r.drain_s),
        &format!("<= {GOAL_DRAIN_S:.0} s"),
    )?;
    row(out, "behind the last submission", &|r| format!("{:.1} s", r.drain_s - r.arrival_s), "")?;
    row(
        out,
        "admissions persisted / s, sustained",
        &|r| format!("{:.0}", r.sustained_admissions()),
        &format!(">= {GOAL_ADMISSIONS_PER_S:.0}"),
    )?;
    row(out, "admissions in the busiest second", &|r| r.peak_admissions().to_string(), "")?;
    for (label, q) in
        [("submit -> admitted p50", 0.5), ("submit -> admitted p90", 0.9), ("submit -> admitted p99", 0.99)]
    {
        row(out, label, &|r| format!("{:.2} s", quantile(&r.admission_waits, q)), "")?;
    }
    row(out, "scheduling cycles", &|r| format!("{:.0}", r.cycles()), "")?;
    for phase in crate::telemetry::CYCLE_PHASES {
        row(
            out,
            &format!("cycle {phase}: mean ms / p99 bucket"),
            &|r| {
                let p = r.phase(phase);
                format!("{:.1} / <= {}", 1e3 * p.seconds / p.cycles.max(1.0), bound_ms(p.p99_bound))
            },
            "",
        )?;
    }
    row(out, "reconciler passes", &|r| format!("{:.0}", r.phase("reconcile list").cycles), "")?;
    for phase in crate::telemetry::RECONCILE_PHASES {
        row(
            out,
            &format!("reconcile {phase}: mean ms / p99 bucket"),
            &|r| {
                let p = r.phase(&format!("reconcile {phase}"));
                format!("{:.1} / <= {}", 1e3 * p.seconds / p.cycles.max(1.0), bound_ms(p.p99_bound))
            },
            "",
        )?;
    }
    row(
        out,
        "leadership changes (a standby contends)",
        &|r| format!("{}", r.lease.epochs.len().saturating_sub(1)),
        "0",
    )?;
    row(
        out,
        "longest time without a heartbeat",
        &|r| format!("{:.2} s", r.lease.longest_silence_s),
        &format!("< {} s lease", crate::config::Config::default().leader_lease.as_secs()),
    )?;
    row(out, "database: commits per job", &|r| format!("{:.2}", r.activity.commits as f64 / r.jobs()), "")?;
    row(out, "database: statements per job", &|r| format!("{:.1}", r.statements() / r.jobs()), "")?;
    row(out, "database: statements per cycle", &|r| format!("{:.0}", r.statements() / r.cycles().max(1.0)), "")?;
    row(out, "database: rows written per job", &|r| format!("{:.1}", r.rows_written() / r.jobs()), "")?;
    row(out, "database: WAL per job", &|r| format!("{:.1} KiB", r.activity.wal_bytes / 1024.0 / r.jobs()), "")?;

    let Some(full) = runs.last() else { return Ok(()) };
    let jobs = full.jobs();
    writeln!(out)?;
    writeln!(out, "rows written per job, by table ({} jobs):", super::thousands(jobs as u64))?;
    writeln!(out, "{:<28} {:>9} {:>9} {:>9} {:>9} {:>9}", "table", "inserted", "updated", "(HOT)", "deleted", "total")?;
    for t in &full.activity.tables {
        let per = |n: i64| n as f64 / jobs;
        writeln!(
            out,
            "{:<28} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2}",
            t.table,
            per(t.inserted),
            per(t.updated),
            per(t.hot_updated),
            per(t.deleted),
            per(t.written())
        )?;
    }
    let total_ms: f64 = full.statements.iter().map(|s| s.total_ms).sum();
    writeln!(out)?;
    writeln!(out, "where the database's time went ({:.1} s of statements), the top ten:", total_ms / 1e3)?;
    writeln!(out, "{:>6} {:>10} {:>12} {:>9}  statement", "share", "calls/job", "mean ms", "rows/call")?;
    for s in full.statements.iter().take(10) {
        writeln!(
            out,
            "{:>5.1}% {:>10.2} {:>12.3} {:>9.1}  {}",
            100.0 * s.total_ms / total_ms.max(f64::MIN_POSITIVE),
            s.calls as f64 / jobs,
            s.total_ms / (s.calls.max(1) as f64),
            s.rows as f64 / (s.calls.max(1) as f64),
            one_line(&s.query, 90)
        )?;
    }
    writeln!(out)?;
    writeln!(out, "where held time goes at {} jobs, mean ms per attempt that ran to its end:", full.size.jobs())?;
    write_held(out, &full.held)?;
    writeln!(out)?;
    writeln!(out, "load average (1, 5, 15 min) at the end: {}", load_average())?;
    Ok(())
}

/// A bucket bound in milliseconds, `inf` past the last.
fn bound_ms(seconds: f64) -> String {
    if seconds.is_finite() {
        format!("{}", seconds * 1e3)
    } else {
        "inf".into()
    }
}

/// A statement's text on one line, whitespace collapsed, cut to `width` characters.
fn one_line(query: &str, width: usize) -> String {
    let flat = query.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= width {
        flat
    } else {
        format!("{}...", flat.chars().take(width - 3).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_size_is_a_thousand_teams_submitting_fifty_thousand_jobs() {
        assert_eq!(Size::FULL.teams(), 1_000);
        assert_eq!(Size::FULL.jobs(), 50_000);
        assert_eq!(Size::TENTH.jobs(), 5_000);
        let per_team: Vec<usize> =
            (0..SHAPES.len()).map(|s| BURSTS as usize * BURST_ORDER.iter().filter(|&&b| b == s).count()).collect();
        assert_eq!(per_team, vec![5, 10, 35], "large, medium, small per team");
    }

    #[test]
    fn each_departments_nodes_hold_exactly_its_teams_reserved_quota_and_the_largest_job() {
        for size in [Size::TENTH, Size::FULL] {
            let config = crate::backends::sim::SimConfig::from_toml(&inventory(size)).expect("valid inventory");
            let nodes = config.inventory();
            let gpus: usize = nodes.iter().map(|n| usize::from(n.gpus)).sum();
            assert_eq!(gpus, size.teams() * RESERVED as usize);
            assert!(nodes.iter().all(|n| u32::from(n.gpus) >= SHAPES[0].gpus), "a large job fits one node");
        }
    }
}
