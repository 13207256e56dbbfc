//! `fairway fragmentation`: the FGD paper's experiment (Weng et al., ATC '23). Each pod list
//! is placed in order on the Alibaba v2023 GPU nodes until the first pod that does not fit;
//! at that point, GPUs allocated (milli-GPUs / 1000) and GPUs stranded (capacity − allocated:
//! free capacity no longer usable for the workload's next pod) measure how well a placement
//! policy avoids fragmentation.
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
//!   it. Ties go to the lower node (and GPU) index.

use std::{fmt::Write as _, path::Path};

use super::traces::{self, files, AlibabaPod, TraceError};
use crate::scheduler::{inventory::Inventory, JobSpec, Node, Topology, UNIT};

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

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct FragmentationRow {
    pub workload: String,
    pub placer: Placer,
    /// GPU pods placed before the first failure.
    pub pods_placed: usize,
    /// GPU pods in the list.
    pub gpu_pods: usize,
    pub allocated_gpus: f64,
    pub stranded_gpus: f64,
    /// False when every pod was placed (nothing failed).
    pub failed: bool,
}

/// The pod lists of the experiment, by name.
pub const WORKLOADS: [(&str, &str); 4] = [
    ("default", files::ALIBABA_PODS),
    ("multigpu20", files::ALIBABA_MULTIGPU20),
    ("multigpu50", files::ALIBABA_MULTIGPU50),
    ("gpushare100", files::ALIBABA_GPUSHARE100),
];

/// Runs every workload under both placers on the Alibaba GPU nodes.
pub fn run(traces_dir: &Path) -> Result<Vec<FragmentationRow>, TraceError> {
    let nodes = traces::load_alibaba_nodes(&traces_dir.join(files::ALIBABA_NODES))?;
    let cluster = traces::alibaba_cluster(&nodes, &[("all".into(), 1)]);
    let mut rows = Vec::new();
    for (name, file) in WORKLOADS {
        let pods = traces::load_alibaba_pods(&traces_dir.join(file))?;
        for placer in [Placer::Fairway, Placer::BestFit] {
            rows.push(place_until_failure(name, &cluster.nodes, &pods, placer));
        }
    }
    Ok(rows)
}

/// Places the GPU pods in order until one does not fit.
pub fn place_until_failure(workload: &str, nodes: &[Node], pods: &[AlibabaPod], placer: Placer) -> FragmentationRow {
    let requests: Vec<u32> = pods.iter().filter_map(AlibabaPod::milli_per_replica).collect();
    let capacity: u64 = nodes.iter().map(|n| u64::from(n.units) * u64::from(UNIT)).sum();
    let mut state: Box<dyn Place> = match placer {
        Placer::Fairway => Box::new(FairwayPlacer::new(nodes)),
        Placer::BestFit => Box::new(BestFit::new(nodes)),
    };
    let mut allocated = 0u64;
    let mut placed = 0;
    for &milli in &requests {
        if !state.place(milli) {
            break;
        }
        allocated += u64::from(milli);
        placed += 1;
    }
    FragmentationRow {
        workload: workload.into(),
        placer,
        pods_placed: placed,
        gpu_pods: requests.len(),
        allocated_gpus: allocated as f64 / f64::from(UNIT),
        stranded_gpus: (capacity - allocated) as f64 / f64::from(UNIT),
        failed: placed < requests.len(),
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
            // The GPU with the least free capacity that still holds the share.
            let best = self
                .free
                .iter()
                .enumerate()
                .flat_map(|(n, units)| units.iter().enumerate().map(move |(u, &f)| (f, n, u)))
                .filter(|&(f, _, _)| f >= milli)
                .min();
            let Some((_, n, u)) = best else { return false };
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
    let _ = writeln!(out, "| workload | policy | GPUs allocated | GPUs stranded | pods placed |");
    let _ = writeln!(out, "|---|---|---:|---:|---:|");
    for r in rows {
        let placed = if r.failed {
            format!("{} of {}", r.pods_placed, r.gpu_pods)
        } else {
            format!("{} of {} (all)", r.pods_placed, r.gpu_pods)
        };
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} | {placed} |",
            r.workload,
            r.placer.name(),
            r.allocated_gpus,
            r.stranded_gpus
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
        assert_eq!(bf.free[0], [700, 1000, 1000, 1000], "among equally free GPUs, the first");
        assert!(bf.place(600));
        assert_eq!(bf.free[0], [100, 1000, 1000, 1000], "the share joins the partly used GPU");
        assert!(!bf.place(8000));
    }

    #[test]
    fn placement_stops_at_the_first_pod_that_does_not_fit() {
        let pods = [pod(1, 500), pod(2, 1000), pod(0, 0), pod(4, 1000), pod(1, 500)];
        for placer in [Placer::Fairway, Placer::BestFit] {
            let row = place_until_failure("t", &nodes(&[2, 2]), &pods, placer);
            // The share and the 2-GPU pod fit; the 4-GPU pod fits on no node.
            assert_eq!((row.pods_placed, row.gpu_pods, row.failed), (2, 4, true), "{placer:?}");
            assert_eq!(row.allocated_gpus, 2.5);
            assert_eq!(row.stranded_gpus, 1.5);
        }
    }
}
