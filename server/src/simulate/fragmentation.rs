//! `fairway fragmentation`: the FGD paper's experiment (Weng et al., ATC '23). Pods of each
//! list are placed on the Alibaba v2023 GPU nodes until the first pod that does not fit; at
//! that point, GPUs allocated (milli-GPUs / 1000) and GPUs stranded (capacity − allocated:
//! free capacity the next pod could not use) measure how well a placement policy avoids
//! fragmentation.
//!
//! Two arrival orders:
//! - **listed**: the list's own order, starting over from the top if it runs out before a pod
//!   fails. The multi-GPU variants only append their extra pods after the default list's
//!   8,152, so in this order they fail exactly where the default list does.
//! - **sampled**: as FGD does, pods drawn uniformly with replacement from the list (so the
//!   variants' shape mixes matter), by a fixed-seed generator; the table shows the mean over
//!   [`SAMPLED_RUNS`] seeds.
//!
//! Only GPUs are modelled, as Fairway schedules GPUs: pods without GPUs are skipped, and
//! CPU and memory are not checked. A pod is one replica (its GPUs on one node; a share of one
//! GPU when `num_gpu == 1` and `gpu_milli < 1000`), as in [`super::traces`].
//!
//! Policies:
//! - **Fairway**: the engine's own placement ([`Inventory::find`]), exactly what an admission
//!   would choose for the pod.
//! - **Best-fit**: a whole-GPU pod goes to the node whose free GPU capacity after placing it
//!   is the smallest; a share goes to the GPU with the least free capacity that still holds
//!   it, among equally free GPUs to the one on the node with the least free capacity. Other
//!   ties go to the lower node (and GPU) index.

use std::fmt::Write as _;

use super::traces::{self, files, AlibabaPod, TraceError, Traces};
use crate::{
    rng::SplitMix64,
    scheduler::{inventory::Inventory, JobSpec, Node, Topology, UNIT},
};

/// A placement policy under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placer {
    Fairway,
    BestFit,
    /// Fragmentation gradient descent (FGD): the placement that least increases the expected
    /// fragmentation of the node, given the shapes that arrive ([`Fgd`]).
    Fgd,
}

impl Placer {
    /// The name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Placer::Fairway => "Fairway",
            Placer::BestFit => "best-fit",
            Placer::Fgd => "FGD",
        }
    }

    /// Every placer, in the table's order.
    pub const ALL: [Placer; 3] = [Placer::Fairway, Placer::BestFit, Placer::Fgd];
}

/// The order pods arrive in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// The list's order, cycling.
    Listed,
    /// Drawn with replacement by a generator seeded with this.
    Sampled(u64),
}

/// When a run stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// At the first pod that does not fit.
    FirstFailure,
    /// FGD's measure: once the pods that arrived ask for the cluster's whole capacity, pods
    /// that do not fit skipped (they do not run).
    ArrivedCapacity,
}

/// Seeds averaged in the sampled order.
pub const SAMPLED_RUNS: u64 = 10;

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct FragmentationRow {
    pub workload: String,
    /// `listed` or `sampled`.
    pub order: &'static str,
    pub until: Until,
    pub placer: Placer,
    /// GPU pods placed before the first failure (a mean for the sampled order).
    pub pods_placed: f64,
    /// GPU pods in the list.
    pub gpu_pods: usize,
    pub allocated_gpus: f64,
    pub stranded_gpus: f64,
}

/// The pod lists of the experiment, by name.
pub const WORKLOADS: [(&str, &str); 4] = [
    ("default", files::ALIBABA_PODS),
    ("multigpu20", files::ALIBABA_MULTIGPU20),
    ("multigpu50", files::ALIBABA_MULTIGPU50),
    ("gpushare100", files::ALIBABA_GPUSHARE100),
];

/// Runs every workload in both orders under every placer on the Alibaba GPU nodes, until the
/// first failure; then, sampled, as FGD measures: until the arrivals ask for the capacity.
pub fn run(traces: &Traces) -> Result<Vec<FragmentationRow>, TraceError> {
    let nodes = traces::load_alibaba_nodes(traces)?;
    let cluster = traces::alibaba_cluster(&nodes, &[("all".into(), 1)]);
    let mut rows = Vec::new();
    for (name, file) in WORKLOADS {
        let pods = traces::load_alibaba_pods(traces, file)?;
        for placer in Placer::ALL {
            let outcome = place(&cluster.nodes, &pods, placer, Order::Listed, Until::FirstFailure);
            rows.push(outcome.row(name, "listed", Until::FirstFailure, placer));
        }
        for until in [Until::FirstFailure, Until::ArrivedCapacity] {
            for placer in Placer::ALL {
                let runs: Vec<Outcome> = (0..SAMPLED_RUNS)
                    .map(|seed| place(&cluster.nodes, &pods, placer, Order::Sampled(seed), until))
                    .collect();
                rows.push(Outcome::mean(&runs).row(name, "sampled", until, placer));
            }
        }
    }
    Ok(rows)
}

/// What one placement run ended with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub pods_placed: f64,
    pub gpu_pods: usize,
    pub allocated_milli: f64,
    pub capacity_milli: f64,
}

impl Outcome {
    fn mean(runs: &[Outcome]) -> Outcome {
        let n = runs.len().max(1) as f64;
        Outcome {
            pods_placed: runs.iter().map(|r| r.pods_placed).sum::<f64>() / n,
            gpu_pods: runs.first().map_or(0, |r| r.gpu_pods),
            allocated_milli: runs.iter().map(|r| r.allocated_milli).sum::<f64>() / n,
            capacity_milli: runs.first().map_or(0.0, |r| r.capacity_milli),
        }
    }

    fn row(&self, workload: &str, order: &'static str, until: Until, placer: Placer) -> FragmentationRow {
        FragmentationRow {
            workload: workload.into(),
            order,
            until,
            placer,
            pods_placed: self.pods_placed,
            gpu_pods: self.gpu_pods,
            allocated_gpus: self.allocated_milli / f64::from(UNIT),
            stranded_gpus: (self.capacity_milli - self.allocated_milli) / f64::from(UNIT),
        }
    }
}

/// Places GPU pods in the given order until one does not fit. A list without GPU pods, or one
/// whose pods all fit forever (impossible: each takes capacity), ends at once.
pub fn place_until_failure(nodes: &[Node], pods: &[AlibabaPod], placer: Placer, order: Order) -> Outcome {
    place(nodes, pods, placer, order, Until::FirstFailure)
}

/// Places GPU pods in the given order until `until`: the first that does not fit, or the
/// arrivals asking for the whole capacity (those that do not fit skipped). `pods_placed`
/// counts the pods that run.
pub fn place(nodes: &[Node], pods: &[AlibabaPod], placer: Placer, order: Order, until: Until) -> Outcome {
    let requests: Vec<u32> = pods.iter().filter_map(AlibabaPod::milli_per_replica).collect();
    let capacity: u64 = nodes.iter().map(|n| u64::from(n.units) * u64::from(UNIT)).sum();
    let mut state: Box<dyn Place> = match placer {
        Placer::Fairway => Box::new(FairwayPlacer::new(nodes)),
        Placer::BestFit => Box::new(BestFit::new(nodes)),
        Placer::Fgd => Box::new(Fgd::new(nodes, &requests)),
    };
    let mut allocated = 0u64;
    let mut placed = 0usize;
    let (mut arrived, mut asked) = (0usize, 0u64);
    let mut rng = SplitMix64(match order {
        Order::Sampled(seed) => seed,
        Order::Listed => 0,
    });
    while !requests.is_empty() {
        let next = match order {
            Order::Listed => arrived % requests.len(),
            Order::Sampled(_) => rng.index(requests.len()),
        };
        let milli = requests[next];
        arrived += 1;
        asked += u64::from(milli);
        if until == Until::ArrivedCapacity && asked > capacity {
            break;
        }
        if state.place(milli) {
            allocated += u64::from(milli);
            placed += 1;
        } else if until == Until::FirstFailure {
            break;
        }
    }
    Outcome {
        pods_placed: placed as f64,
        gpu_pods: requests.len(),
        allocated_milli: allocated as f64,
        capacity_milli: capacity as f64,
    }
}

/// A placement policy with its free-GPU state.
trait Place {
    /// Places one replica of `milli` milli-GPUs; false when it does not fit.
    fn place(&mut self, milli: u32) -> bool;
}

/// The engine's inventory, placing as an admission does.
struct FairwayPlacer {
    inventory: Inventory,
}

impl FairwayPlacer {
    fn new(nodes: &[Node]) -> Self {
        Self { inventory: Inventory::new(nodes, 1) }
    }
}

impl Place for FairwayPlacer {
    fn place(&mut self, milli: u32) -> bool {
        let job = JobSpec {
            id: 0,
            team: 0,
            class: 0,
            replicas: 1,
            milli_per_replica: milli,
            priority: 0,
            topology: Topology::Any,
            submitted_ms: 0,
            max_runtime_ms: 1,
            allow_spot: false,
            fixed_nodes_only: false,
            kind: None,
            expected_runtime_ms: None,
            grace_ms: None,
            min_drivers: Default::default(),
        };
        match self.inventory.find(&job) {
            Some(placement) => {
                self.inventory.allocate(&placement);
                true
            }
            None => false,
        }
    }
}

/// Plain best-fit over free milli-GPUs per GPU.
struct BestFit {
    free: Vec<Vec<u32>>,
}

impl BestFit {
    fn new(nodes: &[Node]) -> Self {
        Self { free: nodes.iter().map(|n| vec![UNIT; usize::from(n.units)]).collect() }
    }
}

impl Place for BestFit {
    fn place(&mut self, milli: u32) -> bool {
        if milli < UNIT {
            // The GPU with the least free capacity that still holds the share; among equally
            // free GPUs (idle ones, typically), the one on the node with the least free.
            let best = self
                .free
                .iter()
                .enumerate()
                .flat_map(|(n, units)| {
                    let node_free: u32 = units.iter().sum();
                    units.iter().enumerate().map(move |(u, &f)| (f, node_free, n, u))
                })
                .filter(|&(f, _, _, _)| f >= milli)
                .min();
            let Some((_, _, n, u)) = best else { return false };
            self.free[n][u] -= milli;
            return true;
        }
        let whole = (milli / UNIT) as usize;
        // The node left with the least free capacity once the pod's whole GPUs are taken.
        let best = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, units)| units.iter().filter(|&&f| f == UNIT).count() >= whole)
            .map(|(n, units)| (units.iter().sum::<u32>() - milli, n))
            .min();
        let Some((_, n)) = best else { return false };
        for unit in self.free[n].iter_mut().filter(|f| **f == UNIT).take(whole) {
            *unit = 0;
        }
        true
    }
}

/// Fragmentation gradient descent (Weng et al., "Beware of Fragmentation", ATC '23), GPUs
/// only. A node's fragmentation for a task shape is the free capacity that shape cannot use
/// there: all of it when the shape fits nowhere on the node; otherwise the free capacity of
/// the GPUs too full for it (a share larger than what a GPU has left; any partly used GPU,
/// for whole-GPU shapes). Its expected fragmentation weighs each shape by how often it
/// arrives. Each pod goes where that expectation grows least (for a share, to the GPU where
/// it does), ties to the fuller node, then the lower index.
struct Fgd {
    free: Vec<Vec<u32>>,
    /// The arriving shapes (milli-GPUs per replica) and their frequencies.
    shapes: Vec<(u32, f64)>,
    /// A node's expected fragmentation by its free capacity per GPU, sorted: nodes alike
    /// (idle ones, typically) are measured once.
    memo: std::collections::HashMap<Vec<u32>, f64>,
}

impl Fgd {
    fn new(nodes: &[Node], requests: &[u32]) -> Self {
        let mut counts: std::collections::BTreeMap<u32, usize> = std::collections::BTreeMap::new();
        for &r in requests {
            *counts.entry(r).or_default() += 1;
        }
        let n = requests.len().max(1) as f64;
        Self {
            free: nodes.iter().map(|n| vec![UNIT; usize::from(n.units)]).collect(),
            shapes: counts.into_iter().map(|(milli, count)| (milli, count as f64 / n)).collect(),
            memo: std::collections::HashMap::new(),
        }
    }

    /// The free capacity of a node with GPUs `free` that a task of `milli` cannot use.
    fn fragmentation(free: &[u32], milli: u32) -> u32 {
        let total: u32 = free.iter().sum();
        if milli < UNIT {
            if free.iter().all(|&f| f < milli) {
                return total;
            }
            return free.iter().filter(|&&f| f < milli).sum();
        }
        let idle = free.iter().filter(|&&f| f == UNIT).count() as u32;
        if idle < milli / UNIT {
            return total;
        }
        free.iter().filter(|&&f| f < UNIT).sum()
    }

    /// The expected fragmentation of a node with GPUs `free`.
    fn expected(&mut self, free: &[u32]) -> f64 {
        let mut key = free.to_vec();
        key.sort_unstable();
        if let Some(&f) = self.memo.get(&key) {
            return f;
        }
        let f = self.shapes.iter().map(|&(milli, p)| p * f64::from(Self::fragmentation(&key, milli))).sum();
        self.memo.insert(key, f);
        f
    }
}

impl Place for Fgd {
    fn place(&mut self, milli: u32) -> bool {
        // (growth of the expected fragmentation, node's free capacity after, node, GPU).
        let mut best: Option<(f64, u32, usize, usize)> = None;
        for n in 0..self.free.len() {
            let units = self.free[n].clone();
            let node_free: u32 = units.iter().sum();
            if node_free < milli {
                continue;
            }
            let before = self.expected(&units);
            // The candidates: for a share, one GPU per distinct free capacity that holds it;
            // for whole GPUs, the node's idle ones.
            let mut candidates: Vec<usize> = Vec::new();
            if milli < UNIT {
                let mut seen = Vec::new();
                for (u, &f) in units.iter().enumerate() {
                    if f >= milli && !seen.contains(&f) {
                        seen.push(f);
                        candidates.push(u);
                    }
                }
            } else if units.iter().filter(|&&f| f == UNIT).count() >= (milli / UNIT) as usize {
                candidates.push(usize::MAX);
            }
            for u in candidates {
                let mut after = units.clone();
                if u == usize::MAX {
                    for unit in after.iter_mut().filter(|f| **f == UNIT).take((milli / UNIT) as usize) {
                        *unit = 0;
                    }
                } else {
                    after[u] -= milli;
                }
                let growth = self.expected(&after) - before;
                let key = (growth, node_free - milli, n, u);
                let better = best.is_none_or(|b| {
                    key.0 < b.0 - 1e-9 || ((key.0 - b.0).abs() <= 1e-9 && (key.1, key.2, key.3) < (b.1, b.2, b.3))
                });
                if better {
                    best = Some(key);
                }
            }
        }
        let Some((_, _, n, u)) = best else { return false };
        if u == usize::MAX {
            for unit in self.free[n].iter_mut().filter(|f| **f == UNIT).take((milli / UNIT) as usize) {
                *unit = 0;
            }
        } else {
            self.free[n][u] -= milli;
        }
        true
    }
}

/// Formats the tables: until the first failure, then until the arrivals ask for the capacity.
pub fn render(rows: &[FragmentationRow]) -> String {
    let mut out = String::new();
    for (until, title) in [
        (Until::FirstFailure, "Pods placed until the first failure"),
        (
            Until::ArrivedCapacity,
            "Pods arriving until they ask for the whole capacity, those that do not fit skipped (FGD's measure)",
        ),
    ] {
        if !out.is_empty() {
            out.push('\n');
        }
        let _ = writeln!(out, "{title} (GPU pods only; sampled = mean of {SAMPLED_RUNS} seeds)");
        render_table(&mut out, rows.iter().filter(|r| r.until == until));
    }
    out
}

fn render_table<'a>(out: &mut String, rows: impl Iterator<Item = &'a FragmentationRow>) {
    let _ = writeln!(
        out,
        "| workload | order | policy | GPUs allocated | GPUs stranded | pods placed | GPU pods in list |"
    );
    let _ = writeln!(out, "|---|---|---|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {} |",
            r.workload,
            r.order,
            r.placer.name(),
            r.allocated_gpus,
            r.stranded_gpus,
            r.pods_placed,
            r.gpu_pods
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(units: &[u8]) -> Vec<Node> {
        units
            .iter()
            .enumerate()
            .map(|(i, &u)| Node {
                name: format!("n{i}"),
                class: 0,
                units: u,
                nvlink_domain_size: 0,
                rack: Some(0),
                zone: Some(0),
                elastic: false,
                spot: false,
                drivers: Default::default(),
            })
            .collect()
    }

    fn pod(num_gpu: u32, gpu_milli: u32) -> AlibabaPod {
        AlibabaPod {
            name: String::new(),
            cpu_milli: 0,
            memory_mib: 0,
            num_gpu,
            gpu_milli,
            qos: None,
            creation_s: None,
            deletion_s: None,
            scheduled_s: None,
        }
    }

    #[test]
    fn best_fit_puts_a_gpu_on_the_fullest_node_and_a_share_on_the_fullest_gpu() {
        let mut bf = BestFit::new(&nodes(&[4, 2]));
        assert!(bf.place(1000));
        assert_eq!(bf.free[1], [0, 1000], "the 2-GPU node is left with less");
        assert!(bf.place(300));
        assert_eq!(bf.free[1], [0, 700], "among idle GPUs, the one on the fuller node");
        assert!(bf.place(600));
        assert_eq!(bf.free[1], [0, 100], "the share joins the partly used GPU");
        assert!(bf.place(500));
        assert_eq!(bf.free[0], [500, 1000, 1000, 1000]);
        assert!(!bf.place(8000));
    }

    #[test]
    fn fgd_keeps_whole_gpus_whole_where_best_fit_splits_them() {
        // Shares of 0.5 and whole GPUs arrive alike. Best-fit puts the second share beside
        // the first only by luck of the index; FGD measures: a share on an idle GPU of a node
        // whose other GPU is partly used leaves nothing a whole GPU can take.
        let requests = [500, 1000];
        let mut fgd = Fgd::new(&nodes(&[2, 2]), &requests);
        assert!(fgd.place(500));
        assert!(fgd.place(500));
        assert_eq!(fgd.free.iter().filter(|n| n.contains(&UNIT)).count(), 2, "{:?}", fgd.free);
        assert!(fgd.free.iter().any(|n| n.contains(&0)), "the two shares share a GPU: {:?}", fgd.free);
        // The expected fragmentation of an idle 2-GPU node is nothing; of one with half a
        // GPU left, that half for the whole-GPU shape (half the arrivals): 250.
        assert_eq!(fgd.expected(&[UNIT, UNIT]), 0.0);
        assert_eq!(fgd.expected(&[500, UNIT]), 250.0);
        assert_eq!(Fgd::fragmentation(&[500, 0], 1000), 500, "no whole GPU: all of it");
        assert_eq!(Fgd::fragmentation(&[300, 1000], 500), 300);
    }

    #[test]
    fn placement_stops_at_the_first_pod_that_does_not_fit() {
        let pods = [pod(1, 500), pod(2, 1000), pod(0, 0), pod(4, 1000), pod(1, 500)];
        for placer in Placer::ALL {
            let outcome = place_until_failure(&nodes(&[2, 2]), &pods, placer, Order::Listed);
            // The share and the 2-GPU pod fit; the 4-GPU pod fits on no node.
            assert_eq!((outcome.pods_placed, outcome.gpu_pods), (2.0, 4), "{placer:?}");
            let row = outcome.row("t", "listed", Until::FirstFailure, placer);
            assert_eq!((row.allocated_gpus, row.stranded_gpus), (2.5, 1.5));
        }
    }

    #[test]
    fn fgds_measure_skips_what_does_not_fit_until_the_arrivals_ask_for_the_capacity() {
        // 4 GPUs; a whole GPU, then 4 (does not fit: skipped), then whole GPUs: the arrivals
        // ask for 1 + 4 = 5 > 4 after the second, so only the first runs.
        let pods = [pod(1, 1000), pod(4, 1000), pod(1, 1000)];
        let outcome = place(&nodes(&[2, 2]), &pods, Placer::BestFit, Order::Listed, Until::ArrivedCapacity);
        assert_eq!(outcome.pods_placed, 1.0);
        // Shares only: 8 of 0.5 ask for 4 GPUs and all fit.
        let shares = place(&nodes(&[2, 2]), &[pod(1, 500)], Placer::Fgd, Order::Listed, Until::ArrivedCapacity);
        assert_eq!((shares.pods_placed, shares.allocated_milli), (8.0, 4000.0));
    }

    #[test]
    fn a_list_that_runs_out_starts_over_until_a_pod_fails() {
        let outcome = place_until_failure(&nodes(&[2]), &[pod(1, 600)], Placer::BestFit, Order::Listed);
        // Three shares of 0.6: one per GPU, the third finds 0.4 free on each.
        assert_eq!(outcome.pods_placed, 2.0);
    }

    #[test]
    fn the_sampled_order_is_reproducible_and_draws_every_shape() {
        let pods = [pod(1, 200), pod(1, 1000), pod(2, 1000)];
        let run = |seed| place_until_failure(&nodes(&[8; 4]), &pods, Placer::Fairway, Order::Sampled(seed));
        assert_eq!(run(7), run(7));
        let mut rng = SplitMix64(3);
        let mut seen = [0; 3];
        (0..300).for_each(|_| seen[rng.index(3)] += 1);
        assert!(seen.iter().all(|&n| n > 70), "{seen:?}");
    }
}
