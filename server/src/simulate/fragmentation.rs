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
}

impl Placer {
    /// The name in the table.
    pub fn name(self) -> &'static str {
        match self {
            Placer::Fairway => "Fairway",
            Placer::BestFit => "best-fit",
        }
    }
}

/// The order pods arrive in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// The list's order, cycling.
    Listed,
    /// Drawn with replacement by a generator seeded with this.
    Sampled(u64),
}

/// Seeds averaged in the sampled order.
pub const SAMPLED_RUNS: u64 = 10;

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct FragmentationRow {
    pub workload: String,
    /// `listed` or `sampled`.
    pub order: &'static str,
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

/// Runs every workload in both orders under both placers on the Alibaba GPU nodes.
pub fn run(traces: &Traces) -> Result<Vec<FragmentationRow>, TraceError> {
    let nodes = traces::load_alibaba_nodes(traces)?;
    let cluster = traces::alibaba_cluster(&nodes, &[("all".into(), 1)]);
    let mut rows = Vec::new();
    for (name, file) in WORKLOADS {
        let pods = traces::load_alibaba_pods(traces, file)?;
        for placer in [Placer::Fairway, Placer::BestFit] {
            let outcome = place_until_failure(&cluster.nodes, &pods, placer, Order::Listed);
            rows.push(outcome.row(name, "listed", placer));
        }
        for placer in [Placer::Fairway, Placer::BestFit] {
            let runs: Vec<Outcome> = (0..SAMPLED_RUNS)
                .map(|seed| place_until_failure(&cluster.nodes, &pods, placer, Order::Sampled(seed)))
                .collect();
            rows.push(Outcome::mean(&runs).row(name, "sampled", placer));
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

    fn row(&self, workload: &str, order: &'static str, placer: Placer) -> FragmentationRow {
        FragmentationRow {
            workload: workload.into(),
            order,
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
    let requests: Vec<u32> = pods.iter().filter_map(AlibabaPod::milli_per_replica).collect();
    let capacity: u64 = nodes.iter().map(|n| u64::from(n.units) * u64::from(UNIT)).sum();
    let mut state: Box<dyn Place> = match placer {
        Placer::Fairway => Box::new(FairwayPlacer::new(nodes)),
        Placer::BestFit => Box::new(BestFit::new(nodes)),
    };
    let mut allocated = 0u64;
    let mut placed = 0usize;
    let mut rng = SplitMix64(match order {
        Order::Sampled(seed) => seed,
        Order::Listed => 0,
    });
    while !requests.is_empty() {
        let next = match order {
            Order::Listed => placed % requests.len(),
            Order::Sampled(_) => rng.index(requests.len()),
        };
        let milli = requests[next];
        if !state.place(milli) {
            break;
        }
        allocated += u64::from(milli);
        placed += 1;
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

/// Formats the table.
pub fn render(rows: &[FragmentationRow]) -> String {
    let mut out = String::new();
    let _ =
        writeln!(out, "Pods placed until the first failure (GPU pods only; sampled = mean of {SAMPLED_RUNS} seeds)");
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
    out
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
    fn placement_stops_at_the_first_pod_that_does_not_fit() {
        let pods = [pod(1, 500), pod(2, 1000), pod(0, 0), pod(4, 1000), pod(1, 500)];
        for placer in [Placer::Fairway, Placer::BestFit] {
            let outcome = place_until_failure(&nodes(&[2, 2]), &pods, placer, Order::Listed);
            // The share and the 2-GPU pod fit; the 4-GPU pod fits on no node.
            assert_eq!((outcome.pods_placed, outcome.gpu_pods), (2.0, 4), "{placer:?}");
            let row = outcome.row("t", "listed", placer);
            assert_eq!((row.allocated_gpus, row.stranded_gpus), (2.5, 1.5));
        }
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
