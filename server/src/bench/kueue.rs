//! `fairway bench kueue`: Kueue's baseline performance test replayed through the whole
//! platform, in real time.
//!
//! The workload is Kueue's own (kubernetes-sigs/kueue, `test/performance/scheduler/configs/
//! baseline`): 5 departments (Kueue's cohorts, closed pools) of 6 teams (its cluster queues),
//! each team with 20 GPUs reserved and 100 more it may borrow within its department; each team
//! submits 500 jobs: 350 small (1 GPU for 200 ms, priority 50, one every 100 ms), 100 medium
//! (5 GPUs for 500 ms, priority 100, every 500 ms) and 50 large (20 GPUs for 1 s, priority 200,
//! every 1.2 s). Higher priorities preempt lower ones within a team, and a team reclaims its
//! reserved quota from borrowers in its department.
//!
//! Everything is real but the GPUs: each job is a `POST` over HTTP with the team's CI token,
//! stored durably, admitted by the leader's scheduling cycles, dispatched through the outbox
//! to the simulated cluster, watched by the reconciler and ended there. Like Kueue's test,
//! placement is not the question: each department's GPUs are two 60-GPU nodes of one class,
//! and the simulated cluster starts a job the moment it is created.
//!
//! The report sets the figures beside Kueue's published means: drain time, quota usage
//! (GPU-seconds of quota held by admitted jobs ÷ (reserved GPUs × drain time), Kueue's
//! measure) and the mean time from submission to admission per class. It also shows the
//! GPU-seconds the jobs actually ran over the same span, which no scheduling overhead can
//! inflate.

use std::{io::Write, time::Duration};

use serde_json::json;

use super::platform::{client, departments_inventory, write_held, Options, Platform};
use crate::db;

const DEPARTMENTS: usize = 5;
const TEAMS_PER_DEPARTMENT: usize = 6;
const RESERVED: i32 = 20;
const BURST: i32 = 100;
const CLASS: &str = "kueue-gpu";
/// Gives up waiting for the queue to drain after this long.
const DRAIN_LIMIT: Duration = Duration::from_secs(900);

/// One kind of job of the workload.
struct Shape {
    priority_class: &'static str,
    priority: i32,
    count: u32,
    gpus: u32,
    runtime: Duration,
    every: Duration,
    /// Kueue's published mean seconds from creation to admission.
    kueue_admission_s: f64,
}

const SHAPES: [Shape; 3] = [
    Shape {
        priority_class: "kueue-large",
        priority: 200,
        count: 50,
        gpus: 20,
        runtime: Duration::from_millis(1000),
        every: Duration::from_millis(1200),
        kueue_admission_s: 16.5,
    },
    Shape {
        priority_class: "kueue-medium",
        priority: 100,
        count: 100,
        gpus: 5,
        runtime: Duration::from_millis(500),
        every: Duration::from_millis(500),
        kueue_admission_s: 76.8,
    },
    Shape {
        priority_class: "kueue-small",
        priority: 50,
        count: 350,
        gpus: 1,
        runtime: Duration::from_millis(200),
        every: Duration::from_millis(100),
        kueue_admission_s: 215.5,
    },
];

/// Kueue's published drain time, seconds.
const KUEUE_DRAIN_S: f64 = 351.0;
/// Kueue's published quota usage, percent.
const KUEUE_USAGE_PERCENT: f64 = 55.9;

/// The simulated cluster: two 60-GPU nodes per department, jobs start when created.
fn inventory() -> String {
    departments_inventory(CLASS, DEPARTMENTS, 2, 60)
}

/// Runs the replay and writes its report to `out`.
pub async fn report(out: &mut dyn Write) -> anyhow::Result<()> {
    let platform = Platform::start(Options {
        sim_inventory: Some(inventory()),
        control: true,
        tune: Some(|config| {
            // Kueue preempts at once; the default minimum runtime protects hours-long jobs.
            config.min_runtime_before_preemption = Duration::ZERO;
        }),
        ..Options::default()
    })
    .await?;
    let result = replay(&platform, out).await;
    platform.stop().await;
    result
}

async fn replay(platform: &Platform, out: &mut dyn Write) -> anyhow::Result<()> {
    for shape in &SHAPES {
        platform.priority_class(shape.priority_class, shape.priority, true).await?;
    }
    let teams = platform.departments(DEPARTMENTS, TEAMS_PER_DEPARTMENT, CLASS, (RESERVED, BURST)).await?;
    let total_jobs = teams.len() as u64 * SHAPES.iter().map(|s| u64::from(s.count)).sum::<u64>();
    writeln!(
        out,
        "Kueue's baseline replayed through Fairway in real time: {DEPARTMENTS} departments x {TEAMS_PER_DEPARTMENT} teams, \
         {total_jobs} jobs"
    )?;
    writeln!(out, "(HTTP submissions with CI tokens, durable PostgreSQL, the control loop, the simulated cluster).")?;
    out.flush()?;

    let http = client()?;
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let mut submitters = tokio::task::JoinSet::new();
    for (team, token) in &teams {
        for shape in &SHAPES {
            let (http, url, token) = (http.clone(), format!("{}/teams/{team}/jobs", platform.api), token.clone());
            let (class, count, gpus, runtime, every) =
                (shape.priority_class, shape.count, shape.gpus, shape.runtime, shape.every);
            submitters.spawn(async move {
                let mut late = Duration::ZERO;
                for i in 0..count {
                    let due = start + every * i;
                    tokio::time::sleep_until(due).await;
                    late = late.max(due.elapsed());
                    let body = json!({
                        "name": format!("{class}-{i}"),
                        "gpu_class": CLASS,
                        "gpus_per_replica": gpus,
                        "priority_class": class,
                        "max_runtime_seconds": 600,
                        "preemption_grace_seconds": 0,
                        "image": "registry.example/kueue-bench:1",
                        "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": format!("{}", runtime.as_secs_f64())},
                    });
                    let response = http.post(&url).bearer_auth(&token).json(&body).send().await?;
                    let status = response.status();
                    anyhow::ensure!(status.as_u16() == 201, "submission answered {status}: {}", response.text().await?);
                }
                anyhow::Ok(late)
            });
        }
    }
    let mut late = Duration::ZERO;
    while let Some(done) = submitters.join_next().await {
        late = late.max(done??);
    }
    let drained = platform.drain(DRAIN_LIMIT, Duration::from_millis(250)).await?;
    print_figures(platform, out, drained, late).await
}

async fn print_figures(platform: &Platform, out: &mut dyn Write, drained: bool, late: Duration) -> anyhow::Result<()> {
    let span = db::bench::workload_span(&platform.pool).await?;
    let classes = db::bench::class_figures(&platform.pool).await?;
    let reserved = (DEPARTMENTS * TEAMS_PER_DEPARTMENT) as f64 * f64::from(RESERVED);
    let percent = |gpu_seconds: f64| 100.0 * gpu_seconds / (reserved * span.drain_s).max(f64::MIN_POSITIVE);
    writeln!(out)?;
    if !drained {
        writeln!(out, "THE QUEUE DID NOT DRAIN within {} s; figures are for what finished.", DRAIN_LIMIT.as_secs())?;
    }
    writeln!(out, "{:<38} {:>10} {:>12}", "", "Fairway", "Kueue")?;
    writeln!(out, "{}", "-".repeat(62))?;
    writeln!(out, "{:<38} {:>8.1} s {:>10.1} s", "drain time", span.drain_s, KUEUE_DRAIN_S)?;
    writeln!(
        out,
        "{:<38} {:>8.1} % {:>10.1} %",
        "quota usage (held / reserved x time)",
        percent(span.gpu_seconds_held),
        KUEUE_USAGE_PERCENT
    )?;
    writeln!(out, "{:<38} {:>8.1} % {:>12}", "GPU time run / (reserved x time)", percent(span.gpu_seconds_run), "-")?;
    for shape in &SHAPES {
        let figures = classes.iter().find(|c| c.priority_class == shape.priority_class);
        let mean = figures.map_or(f64::NAN, |f| f.mean_admission_s);
        writeln!(
            out,
            "{:<38} {:>8.2} s {:>10.1} s",
            format!("mean submit -> admission, {}", shape.priority_class.trim_start_matches("kueue-")),
            mean,
            shape.kueue_admission_s
        )?;
    }
    writeln!(out)?;
    for f in &classes {
        writeln!(
            out,
            "{:<14} {:>6} jobs, {:>6} succeeded, {:>5} preemptions",
            f.priority_class, f.jobs, f.succeeded, f.preemptions
        )?;
    }
    writeln!(out, "latest submission behind its schedule: {:.0} ms", late.as_secs_f64() * 1e3)?;
    writeln!(out)?;
    writeln!(out, "where held time goes, mean ms per attempt that ran to its end:")?;
    write_held(out, &db::bench::held_breakdown(&platform.pool).await?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workload_is_kueues_baseline() {
        let per_team: u32 = SHAPES.iter().map(|s| s.count).sum();
        assert_eq!(per_team, 500);
        let gpu_seconds: f64 = SHAPES.iter().map(|s| f64::from(s.count * s.gpus) * s.runtime.as_secs_f64()).sum();
        assert!((gpu_seconds - 1320.0).abs() < 1e-9, "{gpu_seconds}");
        let last_arrival_ms: Vec<u128> = SHAPES.iter().map(|s| s.every.as_millis() * u128::from(s.count - 1)).collect();
        assert_eq!(last_arrival_ms, vec![58_800, 49_500, 34_900]);
    }

    #[test]
    fn the_inventory_gives_each_department_its_reserved_pool() {
        let config = crate::backends::sim::SimConfig::from_toml(&inventory()).expect("valid inventory");
        let gpus: u32 = config.inventory().iter().map(|n| u32::from(n.gpus)).sum();
        assert_eq!(gpus as usize, DEPARTMENTS * TEAMS_PER_DEPARTMENT * RESERVED as usize);
        assert_eq!(config.start_delay_ms, 0);
    }
}
