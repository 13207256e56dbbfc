//! `fairway bench waits`: what one more job waits for when the platform is already full of
//! work, through the whole platform in real time.
//!
//! **A deep queue.** One team has 10,000 jobs pending: they ask for a class whose GPUs a job
//! of the same team holds for an hour, so none can start. The same team's quota of another
//! class is free. New jobs of that class arrive one every [`PROBE_EVERY`] and must not wait
//! for the 10,000 ahead of them: the scheduler reads, ranks and words every pending job each
//! cycle (and refreshes their positions and expected starts), and that work must not reach
//! the new job's wait. The baseline, in the same run on the same platform, is the same
//! arrivals before the backlog is submitted. (A Kueue ClusterQueue admits its head workload
//! once per cycle, so a deep queue makes every job in it wait for the ones ahead.)
//!
//! **A reclaim among thousands of running jobs.** One department's cluster of 8-GPU nodes is
//! full: a borrowing team runs one 1-GPU job per GPU, the last [`RECLAIMS`] of them on GPUs
//! the other team reserved and does not use. That team then submits 1-GPU jobs one at a
//! time; each takes its reserved GPU back by preempting one borrowed job. The report shows
//! the time from the submission to the preemption's decision, to the stop handed to the
//! cluster (the victim signalled), and to the new job's admission. The baseline is the same
//! reclaim on a tenth of the cluster.
//!
//! Everything is real but the GPUs: HTTP submissions with CI tokens, durable PostgreSQL, the
//! leader's cycles, dispatch through the outbox, the simulated cluster.

use std::{collections::BTreeMap, io::Write, sync::Arc, time::Duration};

use serde_json::json;

use super::platform::{client, departments_inventory, load_average, quantile, Options, Phase, Platform};
use crate::db;
use crate::domain::{JobId, JobState};

/// The queue's depth the issue names.
const BACKLOG: usize = 10_000;
/// New jobs measured, before and after the backlog.
const PROBES: usize = 120;
/// Between two new jobs: the probes span several refreshes of every pending job's position.
const PROBE_EVERY: Duration = Duration::from_millis(250);
/// GPUs of the class the backlog waits for, all held by one long job.
const BUSY_GPUS: u32 = 8;
const BUSY_CLASS: &str = "waits-busy";
const FREE_CLASS: &str = "waits-free";
/// Reclaims measured at each size, one after another.
const RECLAIMS: usize = 10;
const RECLAIM_CLASS: &str = "reclaim-gpu";
const GPUS_PER_NODE: usize = 8;
/// Requests in flight while a backlog or a cluster's jobs are submitted.
const SUBMITTERS: usize = 64;
/// How long any one wait of the benchmark may take before it gives up.
const PATIENCE: Duration = Duration::from_secs(300);

/// Goals of issue 24.
const GOAL_DEPTH_P50_S: f64 = 1.0;
const GOAL_DEPTH_P99_S: f64 = 5.0;
const GOAL_RECLAIM_S: f64 = 1.0;
/// KAI Scheduler's published scale test: the mean time to reclaim, Kubernetes binding
/// included.
const KAI_RECLAIM_S: f64 = 13.9;

/// Runs both measurements and writes the report to `out`.
pub async fn report(out: &mut dyn Write) -> anyhow::Result<()> {
    writeln!(out, "What one more job waits for on a busy platform (HTTP, durable PostgreSQL, the control loop,")?;
    writeln!(out, "the simulated cluster).")?;
    writeln!(out)?;
    writeln!(
        out,
        "A deep queue: {} new 1-GPU jobs, one every {} ms, with the same team's queue empty, then with {} of its \
         jobs pending for a class that is full.",
        PROBES,
        PROBE_EVERY.as_millis(),
        super::thousands(BACKLOG as u64)
    )?;
    out.flush()?;
    let depth = deep_queue().await?;
    writeln!(out, "{:<36} {:>14} {:>14} {:>10}", "submit -> admitted", "queue empty", "10,000 ahead", "goal")?;
    writeln!(out, "{}", "-".repeat(77))?;
    for (label, q, goal) in [("p50", 0.5, GOAL_DEPTH_P50_S), ("p90", 0.9, f64::NAN), ("p99", 0.99, GOAL_DEPTH_P99_S)] {
        let goal = if goal.is_nan() { String::new() } else { format!("<= {goal:.0} s") };
        writeln!(
            out,
            "{:<36} {:>12.3} s {:>12.3} s {:>10}",
            label,
            quantile(&depth.empty, q),
            quantile(&depth.deep, q),
            goal
        )?;
    }
    writeln!(out, "{:<36} {:>12.3} s {:>12.3} s", "max", quantile(&depth.empty, 1.0), quantile(&depth.deep, 1.0))?;
    writeln!(out, "{:<36} {:>14} {:>14}", "new jobs admitted", depth.empty.len(), depth.deep.len())?;
    let cycles = |p: &BTreeMap<String, Phase>| p.get("engine").map_or(0.0, |e| e.cycles);
    writeln!(
        out,
        "{:<36} {:>14} {:>14}",
        "scheduling cycles meanwhile",
        cycles(&depth.phases[0]),
        cycles(&depth.phases[1])
    )?;
    for phase in crate::telemetry::CYCLE_PHASES {
        let cell = |p: &BTreeMap<String, Phase>| {
            let p = p.get(phase).copied().unwrap_or_default();
            format!("{:.1} / <= {:.0}", 1e3 * p.seconds / p.cycles.max(1.0), 1e3 * p.p99_bound)
        };
        writeln!(
            out,
            "{:<36} {:>14} {:>14}",
            format!("cycle {phase}: mean ms / p99 bucket"),
            cell(&depth.phases[0]),
            cell(&depth.phases[1])
        )?;
    }
    writeln!(out)?;

    writeln!(
        out,
        "A reclaim: a team takes back one reserved GPU from a full cluster of 1-GPU jobs, {RECLAIMS} times at each size."
    )?;
    out.flush()?;
    let mut sizes = Vec::new();
    for nodes in [50, 500] {
        sizes.push(reclaim(nodes).await?);
    }
    write!(out, "{:<36}", "seconds from submission (median / max)")?;
    for size in &sizes {
        write!(out, " {:>20}", format!("{} running", super::thousands(size.running as u64)))?;
    }
    writeln!(out, " {:>10} {:>6}", "goal", "KAI")?;
    writeln!(out, "{}", "-".repeat(36 + 21 * sizes.len() + 18))?;
    let rows: [(&str, Pick, String, String); 3] = [
        ("to the preemption decided", |r| r.decided_s, String::new(), String::new()),
        (
            "to the victim signalled (stop sent)",
            |r| r.signalled_s,
            format!("<= {GOAL_RECLAIM_S:.0} s"),
            format!("{KAI_RECLAIM_S} s"),
        ),
        ("to the new job admitted", |r| r.admitted_s, String::new(), String::new()),
    ];
    for (label, pick, goal, kai) in rows {
        write!(out, "{label:<36}")?;
        for size in &sizes {
            let mut sample: Vec<f64> = size.reclaims.iter().filter_map(pick).collect();
            sample.sort_by(f64::total_cmp);
            let missing = size.reclaims.len() - sample.len();
            let cell = format!("{:.3} / {:.3}", quantile(&sample, 0.5), quantile(&sample, 1.0));
            write!(out, " {:>20}", if missing > 0 { format!("{cell} ({missing} never)") } else { cell })?;
        }
        writeln!(out, " {goal:>10} {kai:>6}")?;
    }
    write!(out, "{:<36}", "jobs preempted per reclaim")?;
    for size in &sizes {
        let victims: Vec<String> = size.reclaims.iter().map(|r| r.victims.to_string()).collect();
        write!(out, " {:>20}", victims.join(","))?;
    }
    writeln!(out)?;
    writeln!(out)?;
    writeln!(out, "load average (1, 5, 15 min) at the end: {}", load_average())?;
    Ok(())
}

/// Which of a reclaim's figures a row of the report shows.
type Pick = fn(&db::bench::Reclaim) -> Option<f64>;

/// The admission waits of the new jobs, in seconds, ascending.
struct DeepQueue {
    empty: Vec<f64>,
    deep: Vec<f64>,
    /// The scheduling cycles' phases while the new jobs arrived, without and with the backlog.
    phases: [BTreeMap<String, Phase>; 2],
}

/// The simulated cluster of the deep queue: one node of the full class, four of the free one.
fn depth_inventory() -> String {
    let mut toml = String::from("cluster = \"sim\"\nstart_delay_ms = 0\n");
    for class in [BUSY_CLASS, FREE_CLASS] {
        toml.push_str(&format!("\n[[class]]\nname = \"{class}\"\nkind = \"whole\"\nmemory_mib = 81920\n"));
    }
    toml.push_str(&format!("\n[[node]]\nname = \"busy-1\"\ngpu_class = \"{BUSY_CLASS}\"\ngpus = {BUSY_GPUS}\n"));
    for n in 1..=4 {
        toml.push_str(&format!("\n[[node]]\nname = \"free-{n}\"\ngpu_class = \"{FREE_CLASS}\"\ngpus = 8\n"));
    }
    toml
}

async fn deep_queue() -> anyhow::Result<DeepQueue> {
    let platform =
        Platform::start(Options { sim_inventory: Some(depth_inventory()), control: true, ..Options::default() })
            .await?;
    let result = measure_deep_queue(&platform).await;
    platform.stop().await;
    result
}

async fn measure_deep_queue(platform: &Platform) -> anyhow::Result<DeepQueue> {
    let team = platform.team("deep", None).await?;
    platform.quota(team, BUSY_CLASS, i32::try_from(BUSY_GPUS)?, 0).await?;
    platform.quota(team, FREE_CLASS, 32, 0).await?;
    let submit = Submitter {
        http: client()?,
        url: format!("{}/teams/deep/jobs", platform.api),
        token: platform.ci_token(team).await?,
    };

    submit.one(&job("holder", BUSY_CLASS, BUSY_GPUS, 3_600.0)).await?;
    until(platform, "the class's GPUs are held", || async move {
        Ok(db::bench::jobs_in_state(&platform.pool, JobState::Running, "holder").await? == 1)
    })
    .await?;

    let before = platform.cycle_phases(&submit.http).await?;
    probe(platform, &submit, "probe-empty-").await?;
    let empty_phases = platform.cycle_phases(&submit.http).await?.since(&before);
    let backlog: Vec<_> = (0..BACKLOG).map(|i| job(&format!("backlog-{i}"), BUSY_CLASS, 1, 60.0)).collect();
    submit.many(backlog).await?;
    until(platform, "every queued job has its reason", || async move {
        Ok(db::bench::pending_with_reason(&platform.pool, "backlog-").await? == BACKLOG as i64)
    })
    .await?;
    let before = platform.cycle_phases(&submit.http).await?;
    probe(platform, &submit, "probe-deep-").await?;
    let deep_phases = platform.cycle_phases(&submit.http).await?.since(&before);

    let mut empty = db::bench::admission_waits(&platform.pool, "probe-empty-").await?;
    let mut deep = db::bench::admission_waits(&platform.pool, "probe-deep-").await?;
    empty.sort_by(f64::total_cmp);
    deep.sort_by(f64::total_cmp);
    Ok(DeepQueue { empty, deep, phases: [empty_phases, deep_phases] })
}

/// Submits [`PROBES`] short jobs of the free class, one every [`PROBE_EVERY`], named
/// `prefix` and a number, and waits until all were admitted.
async fn probe(platform: &Platform, submit: &Submitter, prefix: &str) -> anyhow::Result<()> {
    let mut every = tokio::time::interval(PROBE_EVERY);
    for i in 0..PROBES {
        every.tick().await;
        submit.one(&job(&format!("{prefix}{i}"), FREE_CLASS, 1, 0.2)).await?;
    }
    until(platform, "the new jobs were admitted", || async move {
        Ok(db::bench::jobs_in_state(&platform.pool, JobState::Pending, prefix).await? == 0)
    })
    .await
}

/// What one reclaim measured, and how many jobs it preempted.
struct Reclaims {
    running: usize,
    reclaims: Vec<db::bench::Reclaim>,
}

async fn reclaim(nodes: usize) -> anyhow::Result<Reclaims> {
    let platform = Platform::start(Options {
        sim_inventory: Some(departments_inventory(RECLAIM_CLASS, 1, nodes, GPUS_PER_NODE)),
        control: true,
        tune: Some(|config| {
            // Measured is the reclaim itself, not the default protection of young jobs.
            config.min_runtime_before_preemption = Duration::ZERO;
        }),
        ..Options::default()
    })
    .await?;
    let result = measure_reclaims(&platform, nodes * GPUS_PER_NODE).await;
    platform.stop().await;
    result
}

async fn measure_reclaims(platform: &Platform, gpus: usize) -> anyhow::Result<Reclaims> {
    let department = platform.team("dept", None).await?;
    platform.quota(department, RECLAIM_CLASS, i32::try_from(gpus)?, 0).await?;
    let reclaims = i32::try_from(RECLAIMS)?;
    let owner = platform.team("owner", Some(department)).await?;
    platform.quota(owner, RECLAIM_CLASS, reclaims, 0).await?;
    let borrower = platform.team("borrower", Some(department)).await?;
    platform.quota(borrower, RECLAIM_CLASS, i32::try_from(gpus)? - reclaims, reclaims).await?;
    let http = client()?;
    let fill = Submitter {
        http: http.clone(),
        url: format!("{}/teams/borrower/jobs", platform.api),
        token: platform.ci_token(borrower).await?,
    };
    let owner =
        Submitter { http, url: format!("{}/teams/owner/jobs", platform.api), token: platform.ci_token(owner).await? };

    fill.many((0..gpus).map(|i| job(&format!("fill-{i}"), RECLAIM_CLASS, 1, 3_600.0)).collect()).await?;
    until(platform, "every GPU runs a job", || async move {
        Ok(db::bench::jobs_in_state(&platform.pool, JobState::Running, "fill-").await? == gpus as i64)
    })
    .await?;

    let mut measured = Vec::with_capacity(RECLAIMS);
    for i in 0..RECLAIMS {
        let id = owner.one(&job(&format!("reclaim-{i}"), RECLAIM_CLASS, 1, 3_600.0)).await?;
        until(platform, "the reclaim's victim was signalled and the job admitted", || async move {
            let r = db::bench::reclaim(&platform.pool, id).await?;
            Ok(r.signalled_s.is_some() && r.admitted_s.is_some())
        })
        .await?;
        measured.push(db::bench::reclaim(&platform.pool, id).await?);
    }
    Ok(Reclaims { running: gpus, reclaims: measured })
}

/// A job of `gpus` GPUs of `class` that runs `seconds` on the simulated cluster and may be
/// preempted at once.
fn job(name: &str, class: &str, gpus: u32, seconds: f64) -> serde_json::Value {
    json!({
        "name": name,
        "gpu_class": class,
        "gpus_per_replica": gpus,
        "max_runtime_seconds": 7_200,
        "preemption_grace_seconds": 0,
        "image": "registry.example/waits-bench:1",
        "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": format!("{seconds}")},
    })
}

/// Submits jobs of one team with its CI token.
struct Submitter {
    http: Arc<reqwest::Client>,
    url: String,
    token: String,
}

impl Submitter {
    /// Submits one job; its id.
    async fn one(&self, body: &serde_json::Value) -> anyhow::Result<JobId> {
        let response = self.http.post(&self.url).bearer_auth(&self.token).json(body).send().await?;
        let status = response.status();
        anyhow::ensure!(status.as_u16() == 201, "submission answered {status}: {}", response.text().await?);
        let created: serde_json::Value = response.json().await?;
        Ok(serde_json::from_value(created["id"].clone())?)
    }

    /// Submits `bodies` with [`SUBMITTERS`] requests in flight.
    async fn many(&self, bodies: Vec<serde_json::Value>) -> anyhow::Result<()> {
        let queue = Arc::new(std::sync::Mutex::new(bodies));
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..SUBMITTERS {
            let (queue, this) = (
                queue.clone(),
                Submitter { http: self.http.clone(), url: self.url.clone(), token: self.token.clone() },
            );
            workers.spawn(async move {
                loop {
                    let next = queue.lock().map_err(|_| anyhow::anyhow!("a submitter panicked"))?.pop();
                    let Some(body) = next else { return anyhow::Ok(()) };
                    this.one(&body).await?;
                }
            });
        }
        while let Some(done) = workers.join_next().await {
            done??;
        }
        Ok(())
    }
}

/// Polls `done` every 20 ms until it holds; an error naming `what` after [`PATIENCE`].
async fn until<F, Fut>(platform: &Platform, what: &str, mut done: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let began = std::time::Instant::now();
    while !done().await? {
        anyhow::ensure!(
            began.elapsed() < PATIENCE,
            "gave up after {} s waiting until {what} (on {})",
            PATIENCE.as_secs(),
            platform.api
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deep_queues_cluster_has_one_full_class_and_one_with_room_for_the_new_jobs() {
        let config = crate::backends::sim::SimConfig::from_toml(&depth_inventory()).expect("valid inventory");
        let nodes = config.inventory();
        let gpus =
            |class: &str| -> u32 { nodes.iter().filter(|n| n.gpu_class == class).map(|n| u32::from(n.gpus)).sum() };
        assert_eq!(gpus(BUSY_CLASS), BUSY_GPUS, "the one long job holds the whole class");
        assert!(gpus(FREE_CLASS) >= 32, "the new jobs' quota fits the free class");
    }
}
