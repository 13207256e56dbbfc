//! `fairway simulate`: replays a job trace through the admission engine with a simulated
//! clock, and compares Fairway's policy with strict FIFO and quota-without-history on the same
//! trace; `fairway fragmentation` places the Alibaba placement-only pod lists.
//!
//! - [`traces`] loads the public traces (built in from `server/data/traces`) and the job trace CSV, and maps
//!   the Alibaba GPU v2023 trace to a [`Workload`]; [`cluster`] reads a cluster description.
//! - [`replay`] is the event-driven simulator: arrivals, completions and the exits of preempted
//!   jobs after their grace period are the events, and each distinct event time runs one
//!   [`schedule`](crate::scheduler::schedule) cycle.
//! - [`metrics`] turns a replay into utilisation, completion times, queueing delays,
//!   preemption losses and fairness; [`experiment`] runs the three policies at a contended
//!   load, measures each team's sharing anomaly and prints the tables.
//! - [`fragmentation`] compares Fairway's placement with plain best-fit, beside [`bound`], the
//!   fewest GPUs any placement could strand.
//! - [`calibration`] (`fairway simulate --eta`) measures expected starts against real ones.

pub mod bound;
pub mod calibration;
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

    /// An even sample of about `num / den` of a class's nodes, taken per node size so the
    /// sample has the class's mix of sizes whatever order the nodes are listed in: of the
    /// `n` nodes of one size, the `i`-th is kept when `round((i+1)·num/den) > round(i·num/den)`,
    /// which keeps `round(n·num/den)` of them, evenly spread. Indices in node order.
    pub fn sample_nodes(&self, class: ClassId, num: u128, den: u128) -> Vec<usize> {
        let den = den.max(1);
        let rounded = |i: u128| (2 * i * num + den) / (2 * den);
        let mut by_size: std::collections::BTreeMap<u8, Vec<usize>> = std::collections::BTreeMap::new();
        for (i, node) in self.nodes.iter().enumerate().filter(|(_, n)| n.class == class) {
            by_size.entry(node.units).or_default().push(i);
        }
        let mut kept: Vec<usize> = by_size
            .values()
            .flat_map(|nodes| {
                nodes.iter().enumerate().filter(|&(i, _)| rounded(i as u128 + 1) > rounded(i as u128)).map(|(_, &n)| n)
            })
            .collect();
        kept.sort_unstable();
        kept
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
    /// What it asked for beside its GPUs, where the trace says (an Alibaba pod's CPU and
    /// memory), as a label: the trace has no job names, and jobs started from one request
    /// template are most likely runs of one workload, as jobs of one name are. The replay's
    /// runtime history tells kinds apart by it ([`replay::trace_kind`]).
    pub template: Option<String>,
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
        let mut kept: Vec<usize> = (0..cluster.classes.len() as ClassId)
            .flat_map(|class| cluster.sample_nodes(class, 1, u128::from(k)))
            .collect();
        kept.sort_unstable();
        workload.cluster.nodes = kept.into_iter().map(|n| cluster.nodes[n].clone()).collect();
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
    /// A fixed compression factor instead of searching one.
    pub compress: Option<f64>,
    /// A fixed shrink factor (see [`Workload::shrunk`]) instead of searching one.
    pub shrink: Option<u32>,
    /// Where the public traces are read from.
    pub traces: traces::Traces,
    /// Measure expected starts instead ([`calibration`]), at the given load or the default.
    pub eta: bool,
    /// With `eta`, predict every this many jobs (by id) only, to save time.
    pub eta_every: u64,
}

/// `fairway simulate`: loads the workload, finds (or takes) the load, replays it under every
/// policy and prints the tables.
pub fn simulate_command(options: &SimulateOptions, out: &mut dyn Write) -> anyhow::Result<()> {
    if let Some(f) = options.compress {
        anyhow::ensure!(f.is_finite() && f > 0.0, "--compress must be a positive number, not {f}");
    }
    anyhow::ensure!(options.shrink != Some(0), "--shrink must be at least 1");
    let workload = load_workload(options)?;
    if options.eta {
        let shrink = options.shrink.unwrap_or(calibration::DEFAULT_SHRINK);
        let compression = options.compress.unwrap_or(calibration::DEFAULT_COMPRESSION);
        let loaded = workload.shrunk(shrink).compressed(compression);
        writeln!(out, "Replaying {} compressed {compression}x with expected starts", loaded.name)?;
        out.flush()?;
        let c = calibration::calibrate(&loaded, options.eta_every)?;
        write!(out, "{}", calibration::render(&c))?;
        return Ok(());
    }
    writeln!(
        out,
        "Replaying {} ({} jobs, {} GPUs) under {} policies",
        workload.name,
        workload.jobs.len(),
        workload.cluster.total_capacity_milli() as f64 / f64::from(UNIT),
        experiment::POLICIES.len()
    )?;
    let (shrink, compression, search) = match (options.shrink, options.compress) {
        (Some(k), Some(f)) => (k, f, None),
        (k, f) => {
            writeln!(
                out,
                "Searching the load (cluster shrink x arrival compression) for FIFO utilisation >= {:.0}%:",
                experiment::TARGET_UTILISATION * 100.0
            )?;
            let mut progress = |t: &experiment::LoadTried| {
                let _ = match t.fifo_utilisation {
                    Some(u) => {
                        writeln!(out, "  shrink {} x compress {}: FIFO {:.1}%", t.shrink, t.compression, u * 100.0)
                    }
                    None => writeln!(out, "  shrink {}: skipped, the whole trace fits the cluster at once", t.shrink),
                };
                let _ = out.flush();
            };
            let search = experiment::find_load(&workload, experiment::TARGET_UTILISATION, k, f, &mut progress)?;
            (search.shrink, search.compression, Some(search))
        }
    };
    let comparison = experiment::compare(&workload, shrink, compression)?;
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
        return Ok(traces::alibaba_workload(&options.traces)?);
    }
    let cluster_path = options.cluster.as_deref().context("a CSV trace needs --cluster PATH.toml")?;
    let cluster = cluster::load_cluster(cluster_path)?;
    let path = Path::new(&options.trace);
    let jobs = traces::load_job_trace(path, &cluster)?;
    let name = path.file_name().map_or_else(|| options.trace.clone(), |n| n.to_string_lossy().into_owned());
    Ok(Workload { name, cluster, jobs })
}

/// `fairway fragmentation`: the placement-only experiment's table.
pub fn fragmentation_command(traces: &traces::Traces, out: &mut dyn Write) -> anyhow::Result<()> {
    let report = fragmentation::run(traces)?;
    write!(out, "{}", fragmentation::render(&report))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_divides_arrival_times_from_the_first_arrival_and_keeps_durations() {
        let cluster = Cluster { classes: vec![], nodes: vec![], teams: vec![], priorities: vec![] };
        let job = |submit_ms| TraceJob {
            team: 0,
            class: 0,
            replicas: 1,
            milli_per_replica: 1000,
            priority: 0,
            submit_ms,
            duration_ms: 5000,
            max_runtime_ms: 7_200_000,
            template: None,
        };
        let w = Workload { name: "w".into(), cluster, jobs: vec![job(1000), job(5000), job(9000)] };
        let c = w.compressed(4.0);
        let submits: Vec<i64> = c.jobs.iter().map(|j| j.submit_ms).collect();
        assert_eq!(submits, [1000, 2000, 3000]);
        assert!(c.jobs.iter().all(|j| j.duration_ms == 5000));
    }

    #[test]
    fn shrinking_keeps_one_node_in_k_of_each_class_and_scales_quotas() {
        let nodes: Vec<traces::AlibabaNode> = (0..16)
            .map(|i| traces::AlibabaNode {
                name: format!("n{i}"),
                cpu_milli: 0,
                memory_mib: 0,
                gpus: if i % 2 == 0 { 8 } else { 2 },
                model: String::new(),
            })
            .collect();
        let cluster = traces::alibaba_cluster(&nodes, &[("a".into(), 3), ("b".into(), 1)]);
        let w = Workload { name: "w".into(), cluster, jobs: vec![] };
        let shrunk = w.shrunk(4);
        assert_eq!(shrunk.cluster.nodes.len(), 4);
        assert_eq!(shrunk.cluster.nodes.iter().filter(|n| n.units == 8).count(), 2, "the mix survives");
        let reserved: u64 = shrunk.cluster.teams.iter().map(|t| t.quotas[&0].reserved).sum();
        let capacity = shrunk.cluster.total_capacity_milli();
        assert_eq!(capacity, 20_000);
        assert!(reserved <= capacity * 8 / 10 && reserved + 2 >= capacity * 8 / 10, "{reserved}");
    }
}
