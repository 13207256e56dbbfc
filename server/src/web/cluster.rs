//! The cluster view: every node's GPUs as cells, grouped by cluster, rack and NVLink
//! domain, coloured by whose job holds them; MIG slices drawn inside the physical GPU they
//! belong to; free capacity and fragmentation per class. Other teams' jobs are shown as taken, not named, unless the viewer
//! sees every team (platform admins and finance).

use crate::domain::TeamId;
use std::collections::{BTreeMap, HashMap, HashSet};

use crate::db::clusters::{HeldPlacement, NodeUnits};

/// One schedulable unit: a whole GPU or a MIG slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cell {
    /// `free`, `mine` or `taken`.
    pub state: &'static str,
    /// What the cell's tooltip says.
    pub label: String,
    /// The holding team's colour (0–7), for viewers who see every team.
    pub team_colour: Option<usize>,
}

/// A physical GPU: one cell for a whole GPU, its slices for a MIG-partitioned one.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub mig: bool,
    pub cells: Vec<Cell>,
}

/// A node and its GPUs, by NVLink domain (one domain when the node does not say).
#[derive(Debug, Clone)]
pub struct NodeView {
    pub name: String,
    pub classes: String,
    pub domains: Vec<Vec<Gpu>>,
}

/// A rack (or the nodes outside any rack).
#[derive(Debug, Clone)]
pub struct RackView {
    pub name: String,
    pub nodes: Vec<NodeView>,
}

/// A cluster.
#[derive(Debug, Clone)]
pub struct ClusterView {
    pub name: String,
    pub racks: Vec<RackView>,
}

/// Free capacity of one class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassFree {
    pub gpu_class: String,
    pub units: i64,
    pub used: i64,
    pub free: i64,
    /// The most free units on one node: the largest replica that fits now.
    pub largest_free_block: i64,
    /// Nodes with every unit of this class free: room for whole-node replicas.
    pub free_nodes: i64,
    /// Of the free units, the share (percent) on nodes already partly in use: capacity that
    /// small jobs can use but a whole-node replica cannot.
    pub fragmented_percent: i64,
}

/// A team's colour in the view's legend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeamColour {
    pub team: String,
    pub colour: usize,
}

/// The whole view: clusters, free capacity per class, and (for viewers who see every team)
/// which colour is which team.
#[derive(Debug, Clone)]
pub struct Layout {
    pub clusters: Vec<ClusterView>,
    pub classes: Vec<ClassFree>,
    pub teams: Vec<TeamColour>,
}

/// Colours a legend can tell apart; teams beyond them share colours in turn.
const COLOURS: usize = 8;

/// Who is looking: the teams whose jobs are theirs, and whether every team's names may show.
pub struct Viewer {
    pub teams: HashSet<TeamId>,
    pub sees_all: bool,
}

/// Lays out `nodes` with `held` placements for `viewer`. Pure.
pub fn layout(nodes: &[NodeUnits], held: &[HeldPlacement], viewer: &Viewer) -> Layout {
    // Teams holding GPUs, by name, each with its colour.
    let mut names: Vec<&str> = held.iter().map(|h| h.team.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    let colour_of: HashMap<&str, usize> = names.iter().enumerate().map(|(i, t)| (*t, i % COLOURS)).collect();
    let team_colour = |h: &HeldPlacement| viewer.sees_all.then(|| colour_of.get(h.team.as_str()).copied()).flatten();
    // (cluster, node, class, unit) → the cell's owner.
    let mut owners: HashMap<(&str, String, &str, u64), &HeldPlacement> = HashMap::new();
    for h in held {
        for replica in h.placement.as_array().into_iter().flatten() {
            let node = replica["node"].as_str().unwrap_or_default().to_owned();
            for unit in replica["gpus"].as_array().into_iter().flatten().filter_map(serde_json::Value::as_u64) {
                owners.insert((h.cluster.as_str(), node.clone(), h.gpu_class.as_str(), unit), h);
            }
        }
    }
    let cell = |n: &NodeUnits, unit: u64| match owners.get(&(
        n.cluster.as_str(),
        n.node.clone(),
        n.gpu_class.as_str(),
        unit,
    )) {
        None => Cell { state: "free", label: format!("{} #{unit}: free", n.gpu_class), team_colour: None },
        Some(h) if viewer.teams.contains(&h.team_id) => Cell {
            state: "mine",
            label: format!("{} #{unit}: {} ({})", n.gpu_class, h.job_name, h.team),
            team_colour: team_colour(h),
        },
        Some(h) if viewer.sees_all => {
            Cell { state: "taken", label: format!("{} #{unit}: {}", n.gpu_class, h.team), team_colour: team_colour(h) }
        }
        Some(_) => Cell {
            state: "taken",
            label: format!("{} #{unit}: in use by another team", n.gpu_class),
            team_colour: None,
        },
    };

    let mut classes: BTreeMap<String, ClassFree> = BTreeMap::new();
    let mut clusters: Vec<ClusterView> = Vec::new();
    // Rows come ordered by cluster, rack, node; a node may have several classes (MIG profiles).
    let mut i = 0;
    while i < nodes.len() {
        let first = &nodes[i];
        let mut j = i;
        while j < nodes.len() && nodes[j].cluster == first.cluster && nodes[j].node == first.node {
            j += 1;
        }
        let rows = &nodes[i..j];
        i = j;
        let mig: Vec<&NodeUnits> = rows.iter().filter(|r| r.kind == "mig").collect();
        let mut gpus: Vec<Gpu> = Vec::new();
        for r in rows.iter().filter(|r| r.kind != "mig") {
            gpus.extend((0..r.units.max(0) as u64).map(|u| Gpu { mig: false, cells: vec![cell(r, u)] }));
        }
        if !mig.is_empty() {
            // The physical GPUs the slices come from, and each profile's slices spread over
            // them evenly in unit order.
            let milli: i64 = mig.iter().map(|r| i64::from(r.units) * i64::from(r.fraction_milli)).sum();
            let physical = ((milli + 500) / 1000).max(1) as u64;
            for g in 0..physical {
                let mut cells = Vec::new();
                for r in &mig {
                    let units = r.units.max(0) as u64;
                    for u in (g * units / physical)..((g + 1) * units / physical) {
                        cells.push(cell(r, u));
                    }
                }
                gpus.push(Gpu { mig: true, cells });
            }
        }
        for r in rows {
            let entry = classes.entry(r.gpu_class.clone()).or_insert_with(|| ClassFree {
                gpu_class: r.gpu_class.clone(),
                units: 0,
                used: 0,
                free: 0,
                largest_free_block: 0,
                free_nodes: 0,
                fragmented_percent: 0,
            });
            let used = (0..r.units.max(0) as u64)
                .filter(|u| owners.contains_key(&(r.cluster.as_str(), r.node.clone(), r.gpu_class.as_str(), *u)))
                .count() as i64;
            let units = i64::from(r.units);
            entry.units += units;
            entry.used += used;
            entry.free += units - used;
            entry.largest_free_block = entry.largest_free_block.max(units - used);
            if used == 0 && units > 0 {
                entry.free_nodes += 1;
            } else {
                // Held for now in `fragmented_percent`: free units on partly used nodes.
                entry.fragmented_percent += units - used;
            }
        }
        let domain = match first.nvlink_domain_size {
            size if size > 0 => size as usize,
            _ => gpus.len().max(1),
        };
        let node = NodeView {
            name: first.node.clone(),
            classes: rows.iter().map(|r| format!("{} × {}", r.units, r.gpu_class)).collect::<Vec<_>>().join(", "),
            domains: gpus.chunks(domain).map(<[Gpu]>::to_vec).collect(),
        };
        let rack =
            first.rack.clone().unwrap_or_else(|| if first.elastic { "elastic pool".into() } else { "no rack".into() });
        if clusters.last().is_none_or(|c| c.name != first.cluster) {
            clusters.push(ClusterView { name: first.cluster.clone(), racks: Vec::new() });
        }
        if let Some(cluster) = clusters.last_mut() {
            match cluster.racks.last_mut() {
                Some(r) if r.name == rack => r.nodes.push(node),
                _ => cluster.racks.push(RackView { name: rack, nodes: vec![node] }),
            }
        }
    }
    let classes = classes
        .into_values()
        .map(|mut c| {
            c.fragmented_percent = if c.free > 0 { 100 * c.fragmented_percent / c.free } else { 0 };
            c
        })
        .collect();
    let teams = match viewer.sees_all {
        true => names.iter().map(|t| TeamColour { team: (*t).to_owned(), colour: colour_of[t] }).collect(),
        false => Vec::new(),
    };
    Layout { clusters, classes, teams }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, class: &str, kind: &str, fraction: i32, units: i32) -> NodeUnits {
        NodeUnits {
            cluster: "sim".into(),
            node: name.into(),
            rack: Some("rack-1".into()),
            gpu_class: class.into(),
            kind: kind.into(),
            fraction_milli: fraction,
            units,
            elastic: false,
            nvlink_domain_size: 0,
        }
    }

    #[test]
    fn slices_sit_inside_their_gpu_and_other_teams_stay_anonymous() {
        let nodes = vec![
            node("a100-mig", "mig-3g", "mig", 428, 4),
            node("a100-mig", "mig-1g", "mig", 142, 2),
            node("h100-1", "h100", "whole", 1000, 2),
        ];
        let mine = TeamId::from(uuid::Uuid::from_u128(1));
        let other = TeamId::from(uuid::Uuid::from_u128(2));
        let held = vec![
            HeldPlacement {
                cluster: "sim".into(),
                team_id: mine,
                team: "ml".into(),
                job_name: "train".into(),
                gpu_class: "mig-3g".into(),
                placement: serde_json::json!([{"node": "a100-mig", "gpus": [2]}]),
            },
            HeldPlacement {
                cluster: "sim".into(),
                team_id: other,
                team: "vision".into(),
                job_name: "secret".into(),
                gpu_class: "h100".into(),
                placement: serde_json::json!([{"node": "h100-1", "gpus": [0]}]),
            },
        ];
        let viewer = Viewer { teams: HashSet::from([mine]), sees_all: false };
        let Layout { clusters, classes: free, teams } = layout(&nodes, &held, &viewer);
        assert!(teams.is_empty(), "no team names for a viewer who does not see every team");
        let racks = &clusters[0].racks;
        let mig = &racks[0].nodes[0].domains[0];
        // 4 × 428 + 2 × 142 = 1,996 thousandths: two physical GPUs of 2 × 3g + 1 × 1g each.
        assert_eq!(mig.len(), 2);
        assert_eq!(mig[1].cells.len(), 3);
        assert_eq!(mig[1].cells[0].state, "mine");
        let h100 = &racks[0].nodes[1].domains[0];
        assert_eq!(h100[0].cells[0].label, "h100 #0: in use by another team");
        assert_eq!(h100[1].cells[0].state, "free");
        let h100_free = free.iter().find(|c| c.gpu_class == "h100").unwrap();
        assert_eq!((h100_free.units, h100_free.used, h100_free.free, h100_free.largest_free_block), (2, 1, 1, 1));
        // Its one free GPU sits on a node already in use: all of the free capacity is fragmented.
        assert_eq!((h100_free.free_nodes, h100_free.fragmented_percent), (0, 100));
    }

    #[test]
    fn gpus_are_drawn_in_their_nvlink_domains_and_fragmentation_counts_free_gpus_on_busy_nodes() {
        let mut busy = node("h100-1", "h100", "whole", 1000, 8);
        busy.nvlink_domain_size = 4;
        let mut idle = node("h100-2", "h100", "whole", 1000, 8);
        idle.nvlink_domain_size = 4;
        let held = vec![HeldPlacement {
            cluster: "sim".into(),
            team_id: TeamId::from_u128(2),
            team: "vision".into(),
            job_name: "train".into(),
            gpu_class: "h100".into(),
            placement: serde_json::json!([{"node": "h100-1", "gpus": [0, 1]}]),
        }];
        let viewer = Viewer { teams: HashSet::new(), sees_all: true };
        let Layout { clusters, classes: free, teams } = layout(&[busy, idle], &held, &viewer);
        let node = &clusters[0].racks[0].nodes[0];
        assert_eq!(node.domains.iter().map(Vec::len).collect::<Vec<_>>(), [4, 4]);
        assert_eq!(node.domains[0][0].cells[0].label, "h100 #0: vision");
        // An admin sees each team in its own colour, with the legend to read it.
        assert_eq!(node.domains[0][0].cells[0].team_colour, Some(0));
        assert_eq!(node.domains[0][2].cells[0].team_colour, None, "free");
        assert_eq!(teams, [TeamColour { team: "vision".into(), colour: 0 }]);
        let h100 = &free[0];
        // 14 free: 8 on the idle node, 6 stranded beside the job: 6 / 14 = 42%.
        assert_eq!((h100.free, h100.free_nodes, h100.largest_free_block, h100.fragmented_percent), (14, 1, 8, 42));
    }
}
