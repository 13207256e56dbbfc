//! `fairway simulate`: replays a job trace through the admission engine with a simulated
//! clock, and compares Fairway's policy with strict FIFO and quota-without-history on the same
//! trace; `fairway fragmentation` places the Alibaba placement-only pod lists.
//!
//! - [`traces`] loads the public traces in `../shared/traces` and the job trace CSV, and maps
//!   the Alibaba GPU v2023 trace to a [`Workload`]; [`cluster`] reads a cluster description.
//! - [`replay`] is the event-driven simulator: arrivals, completions and the exits of preempted
//!   jobs after their grace period are the events, and each distinct event time runs one
//!   [`schedule`](crate::scheduler::schedule) cycle.
//! - [`metrics`] turns a replay into utilisation, completion times, queueing delays,
//!   preemption losses and fairness; [`experiment`] runs the three policies at a contended
//!   load, measures each team's sharing anomaly and prints the tables.
//! - [`fragmentation`] compares Fairway's placement with plain best-fit.

pub mod cluster;
pub mod experiment;
pub mod fragmentation;
pub mod metrics;
pub mod replay;
pub mod traces;

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::Context as _;

use crate::scheduler::{ClassId, GpuClass, Node, PriorityClass, PriorityId, Quota, Team, TeamId, UNIT};

/// What a replay runs on: the parts of a [`Snapshot`](crate::scheduler::Snapshot) that stay
/// the same for a whole replay (usage history aside, which the simulator keeps up to date).
#[derive(Debug, Clone)]
pub struct Cluster {
    pub classes: Vec<GpuClass>,
    pub nodes: Vec<Node>,
    pub teams: Vec<Team>,
    pub priorities: Vec<PriorityClass>,
}

impl Cluster {
    /// Milli-units of capacity of one class.
    pub fn capacity_milli(&self, class: ClassId) -> u64 {
        self.nodes.iter().filter(|n| n.class == class).map(|n| u64::from(n.units) * u64::from(UNIT)).sum()
    }

    /// Milli-units of capacity of every class together.
    pub fn total_capacity_milli(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.units) * u64::from(UNIT)).sum()
    }

    /// A team's reserved quota of a class, in milli-units.
    pub fn reserved_milli(&self, team: TeamId, class: ClassId) -> u64 {
        self.teams[team as usize].quotas.get(&class).map_or(0, |q| q.reserved)
    }
}

/// One job of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceJob {
    pub team: TeamId,
    pub class: ClassId,
    /// Replicas of the gang.
    pub replicas: u16,
    /// Milli-units per replica: a multiple of 1000, or below 1000 for a share of one unit.
    pub milli_per_replica: u32,
    pub priority: PriorityId,
    /// Submission time, ms from the start of the trace.
    pub submit_ms: i64,
    /// How long it runs once started (without preemptions).
    pub duration_ms: i64,
    /// The maximum runtime it declares (at least `duration_ms`).
    pub max_runtime_ms: i64,
}

impl TraceJob {
    /// Milli-units of the whole gang.
    pub fn total_milli(&self) -> u64 {
        u64::from(self.replicas) * u64::from(self.milli_per_replica)
    }
}

/// A trace on the cluster it runs on. A job's id in a replay is its index in `jobs`.
#[derive(Debug, Clone)]
pub struct Workload {
    /// For reports.
    pub name: String,
    pub cluster: Cluster,
    /// In submission order.
    pub jobs: Vec<TraceJob>,
}

impl Workload {
    /// The same jobs arriving `factor` times faster (submit times divided by it), with their
    /// durations unchanged: the way to replay a lightly loaded trace at a contended load.
    pub fn compressed(&self, factor: f64) -> Workload {
        let mut workload = self.clone();
        if factor > 0.0 && factor != 1.0 {
            let first = self.jobs.first().map_or(0, |j| j.submit_ms);
            for job in &mut workload.jobs {
                // Relative to the first arrival, so the replay starts where the trace does.
                job.submit_ms = first + ((job.submit_ms - first) as f64 / factor).round() as i64;
            }
        }
        workload
    }
}

impl Workload {
    /// The same jobs on a cluster shrunk to one node in `k` of each class (an even sample, so
    /// the mix of node sizes stays the cluster's), with every team's quotas scaled by the
    /// same ratio as its class's capacity: the other way to contend a lightly loaded trace,
    /// needed when the whole trace fits the cluster at once.
    pub fn shrunk(&self, k: u32) -> Workload {
        let mut workload = self.clone();
        if k <= 1 {
            return workload;
        }
        let cluster = &self.cluster;
        let mut nodes = Vec::new();
        for class in 0..cluster.classes.len() as ClassId {
            let of_class = cluster.nodes.iter().filter(|n| n.class == class);
            // Node i of the class is kept when ⌊(i+1)/k⌋ > ⌊i/k⌋: the last of every k.
            nodes.extend(of_class.enumerate().filter(|(i, _)| (i + 1) % k as usize == 0).map(|(_, n)| n.clone()));
        }
        nodes.sort_by_key(|n| cluster.nodes.iter().position(|m| m.name == n.name));
        workload.cluster.nodes = nodes;
        for class in 0..cluster.classes.len() as ClassId {
            let (old, new) = (cluster.capacity_milli(class), workload.cluster.capacity_milli(class));
            let scale = |milli: u64| (u128::from(milli) * u128::from(new) / u128::from(old.max(1))) as u64;
            for team in &mut workload.cluster.teams {
                if let Some(q) = team.quotas.get_mut(&class) {
                    *q = Quota { reserved: scale(q.reserved), burst: scale(q.burst), lendable: scale(q.lendable) };
                }
            }
        }
        workload.name = format!("{} on 1/{k} of its nodes", self.name);
        workload
    }
}

/// What `fairway simulate` was asked.
#[derive(Debug, Clone)]
pub struct SimulateOptions {
    /// `alibaba`, or the path of a job trace CSV.
    pub trace: String,
    /// Cluster description, for a CSV trace.
    pub cluster: Option<PathBuf>,
    /// A fixed compression factor instead of the search.
    pub compress: Option<f64>,
    /// Keep one node in this many (see [`Workload::shrunk`]); 1 keeps the whole cluster.
    pub shrink: u32,
    pub traces_dir: PathBuf,
}

/// `fairway simulate`: loads the workload, finds (or takes) the load, replays it under every
/// policy and prints the tables.
pub fn simulate_command(options: &SimulateOptions, out: &mut dyn Write) -> anyhow::Result<()> {
    anyhow::ensure!(options.shrink >= 1, "--shrink must be at least 1");
    let workload = load_workload(options)?.shrunk(options.shrink);
    writeln!(
        out,
        "Replaying {} ({} jobs, {} GPUs) under {} policies",
        workload.name,
        workload.jobs.len(),
        workload.cluster.total_capacity_milli() as f64 / f64::from(UNIT),
        experiment::POLICIES.len()
    )?;
    let search = match options.compress {
        Some(factor) if factor.is_finite() && factor > 0.0 => None,
        Some(factor) => anyhow::bail!("--compress must be a positive number, not {factor}"),
        None => {
            writeln!(out, "Searching the arrival compression factor for FIFO utilisation >= 70% ...")?;
            out.flush()?;
            let mut progress = |factor: f64, util: f64| {
                let _ = writeln!(out, "  {factor}x: FIFO utilisation {:.1}%", util * 100.0);
                let _ = out.flush();
            };
            Some(experiment::find_compression(&workload, experiment::TARGET_UTILISATION, &mut progress)?)
        }
    };
    let factor = search.as_ref().map_or(options.compress.unwrap_or(1.0), |s| s.factor);
    let comparison = experiment::compare(&workload, factor)?;
    writeln!(out)?;
    write!(out, "{}", experiment::render(&comparison, search.as_ref()))?;
    Ok(())
}

fn load_workload(options: &SimulateOptions) -> anyhow::Result<Workload> {
    if options.trace == "alibaba" {
        anyhow::ensure!(
            options.cluster.is_none(),
            "--cluster applies to a CSV trace; the Alibaba trace brings its own"
        );
        return Ok(traces::alibaba_workload(&options.traces_dir)?);
    }
    let cluster_path = options.cluster.as_deref().context("a CSV trace needs --cluster PATH.toml")?;
    let cluster = cluster::load_cluster(cluster_path)?;
    let path = Path::new(&options.trace);
    let jobs = traces::load_job_trace(path, &cluster)?;
    let name = path.file_name().map_or_else(|| options.trace.clone(), |n| n.to_string_lossy().into_owned());
    Ok(Workload { name, cluster, jobs })
}

/// `fairway fragmentation`: the placement-only experiment's table.
pub fn fragmentation_command(traces_dir: &Path, out: &mut dyn Write) -> anyhow::Result<()> {
    let rows = fragmentation::run(traces_dir)?;
    write!(out, "{}", fragmentation::render(&rows))?;
    Ok(())
}
