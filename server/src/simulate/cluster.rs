//! The cluster description of `fairway simulate --cluster PATH.toml`: GPU classes with their
//! rates, groups of identical nodes, the team tree with quotas, and priority classes.
//!
//! ```toml
//! [[classes]]
//! name = "h100"
//! rate_per_gpu_hour = 2.50            # dollars; held as integer micro-dollars
//!
//! [[nodes]]
//! name_prefix = "h100-"               # nodes are h100-0, h100-1, ...
//! count = 16
//! class = "h100"
//! gpus = 8
//! nvlink_domain_size = 8              # optional, 0 (default) = the whole node is one domain
//! nodes_per_rack = 4                  # optional; without it each node is its own rack
//!
//! [[teams]]
//! name = "research"
//! reserved = { h100 = 64 }            # GPUs; fractions allowed, held in milli-GPUs
//! burst = { h100 = 32 }
//!
//! [[teams]]
//! name = "vision"
//! parent = "research"
//! reserved = { h100 = 32 }
//! burst = { h100 = 32 }
//!
//! [[priority_classes]]                # optional; see `default_priorities`
//! name = "experiment"
//! priority = 100
//! preemptible = true
//! usage_factor_milli = 750
//! price_multiplier_milli = 800
//! grace_s = 30
//! delay_s = 0                         # optional: the preemption delay, default 0
//! ```

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
};

use serde::Deserialize;

use super::{traces::TraceError, Cluster};
use crate::scheduler::{ClassId, GpuClass, Node, PriorityClass, Quota, Team, TeamId, UNIT};

/// The file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Description {
    classes: Vec<ClassEntry>,
    nodes: Vec<NodeGroup>,
    teams: Vec<TeamEntry>,
    #[serde(default)]
    priority_classes: Vec<PriorityEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClassEntry {
    name: String,
    rate_per_gpu_hour: f64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeGroup {
    name_prefix: String,
    count: u32,
    class: String,
    gpus: u8,
    #[serde(default)]
    nvlink_domain_size: u8,
    nodes_per_rack: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TeamEntry {
    name: String,
    parent: Option<String>,
    #[serde(default)]
    reserved: BTreeMap<String, f64>,
    #[serde(default)]
    burst: BTreeMap<String, f64>,
    /// Defaults to all of `reserved`.
    lendable: Option<BTreeMap<String, f64>>,
    /// Fair-share weight; 1.0 is normal.
    #[serde(default = "one")]
    weight: f64,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PriorityEntry {
    name: String,
    priority: i32,
    preemptible: bool,
    usage_factor_milli: u32,
    price_multiplier_milli: u32,
    grace_s: u32,
    #[serde(default)]
    delay_s: u32,
}

/// Reads and checks a cluster description.
pub fn load_cluster(path: &Path) -> Result<Cluster, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Read { path: path.into(), source })?;
    parse_cluster(&text).map_err(|(line, message)| TraceError::Invalid { path: path.into(), line, message })
}

/// Parses a cluster description; an error carries its line (0 when it concerns the file as a
/// whole) and a message.
pub fn parse_cluster(text: &str) -> Result<Cluster, (usize, String)> {
    let description: Description = toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(0, |span| line_of(text, span.start));
        (line, e.message().to_owned())
    })?;
    build(description).map_err(|message| (0, message))
}

/// 1-based line number of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

fn build(description: Description) -> Result<Cluster, String> {
    let classes = build_classes(&description.classes)?;
    let class_ids: HashMap<&str, ClassId> =
        description.classes.iter().enumerate().map(|(i, c)| (c.name.as_str(), i as ClassId)).collect();
    let nodes = build_nodes(&description.nodes, &class_ids)?;
    let teams = build_teams(&description.teams, &class_ids)?;
    let priorities = if description.priority_classes.is_empty() {
        default_priorities()
    } else {
        build_priorities(&description.priority_classes)?
    };
    Ok(Cluster { classes, nodes, teams, priorities })
}

fn build_classes(entries: &[ClassEntry]) -> Result<Vec<GpuClass>, String> {
    if entries.is_empty() || entries.len() > usize::from(ClassId::MAX) {
        return Err(format!("between 1 and {} classes are needed", ClassId::MAX));
    }
    let mut seen = HashMap::new();
    entries
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if seen.insert(c.name.as_str(), i).is_some() {
                return Err(format!("classes[{i}]: class {:?} is defined twice", c.name));
            }
            if !(c.rate_per_gpu_hour.is_finite() && c.rate_per_gpu_hour >= 0.0) {
                return Err(format!("classes[{i}]: rate_per_gpu_hour must be a non-negative number"));
            }
            // Money is integer micro-units everywhere else; the rate is converted once here.
            let rate_micros_per_hour = (c.rate_per_gpu_hour * 1e6).round() as i64;
            Ok(GpuClass { name: c.name.clone(), rate_micros_per_hour, fraction_milli: 1000 })
        })
        .collect()
}

fn build_nodes(groups: &[NodeGroup], class_ids: &HashMap<&str, ClassId>) -> Result<Vec<Node>, String> {
    let mut nodes = Vec::new();
    // Racks are numbered across groups, so two groups never share a rack.
    let mut next_rack = 0u32;
    for (i, group) in groups.iter().enumerate() {
        let class = *class_ids
            .get(group.class.as_str())
            .ok_or_else(|| format!("nodes[{i}]: unknown class {:?}", group.class))?;
        if group.gpus == 0 || group.gpus > 64 {
            return Err(format!("nodes[{i}]: gpus must be between 1 and 64"));
        }
        if group.nvlink_domain_size != 0 && group.gpus % group.nvlink_domain_size != 0 {
            return Err(format!("nodes[{i}]: nvlink_domain_size must divide gpus"));
        }
        if group.nodes_per_rack == Some(0) {
            return Err(format!("nodes[{i}]: nodes_per_rack must be positive"));
        }
        for n in 0..group.count {
            let rack = group.nodes_per_rack.map(|per_rack| next_rack + n / per_rack);
            nodes.push(Node {
                name: format!("{}{n}", group.name_prefix),
                class,
                units: group.gpus,
                nvlink_domain_size: group.nvlink_domain_size,
                rack,
                zone: Some(0),
                elastic: false,
                spot: false,
                drivers: Default::default(),
                host: None,
                cluster: 0,
            });
        }
        if let Some(per_rack) = group.nodes_per_rack {
            next_rack += group.count.div_ceil(per_rack);
        }
    }
    if nodes.is_empty() {
        return Err("the cluster has no nodes".into());
    }
    // Racks of node groups without `nodes_per_rack` stay `None`: each such node is its own rack.
    Ok(nodes)
}

fn build_teams(entries: &[TeamEntry], class_ids: &HashMap<&str, ClassId>) -> Result<Vec<Team>, String> {
    let mut ids: HashMap<&str, TeamId> = HashMap::new();
    for (i, t) in entries.iter().enumerate() {
        if ids.insert(t.name.as_str(), i as TeamId).is_some() {
            return Err(format!("teams[{i}]: team {:?} is defined twice", t.name));
        }
    }
    let teams =
        entries.iter().enumerate().map(|(i, t)| build_team(i, t, &ids, class_ids)).collect::<Result<Vec<_>, _>>()?;
    check_acyclic(&teams)?;
    Ok(teams)
}

fn build_team(
    i: usize,
    entry: &TeamEntry,
    ids: &HashMap<&str, TeamId>,
    class_ids: &HashMap<&str, ClassId>,
) -> Result<Team, String> {
    let parent = match &entry.parent {
        None => None,
        Some(p) => Some(*ids.get(p.as_str()).ok_or_else(|| format!("teams[{i}]: unknown parent {p:?}"))?),
    };
    let reserved = milli_by_class(i, "reserved", &entry.reserved, class_ids)?;
    let burst = milli_by_class(i, "burst", &entry.burst, class_ids)?;
    let lendable = match &entry.lendable {
        Some(l) => milli_by_class(i, "lendable", l, class_ids)?,
        None => reserved.clone(),
    };
    let mut quotas = BTreeMap::new();
    for class in reserved.keys().chain(burst.keys()).chain(lendable.keys()) {
        let reserved = reserved.get(class).copied().unwrap_or(0);
        let quota = Quota {
            reserved,
            burst: burst.get(class).copied().unwrap_or(0),
            lendable: lendable.get(class).copied().unwrap_or(0).min(reserved),
        };
        quotas.insert(*class, quota);
    }
    if !(entry.weight.is_finite() && entry.weight > 0.0) {
        return Err(format!("teams[{i}]: weight must be positive"));
    }
    Ok(Team {
        name: entry.name.clone(),
        parent,
        quotas,
        fair_share_weight_milli: (entry.weight * 1000.0).round() as u32,
        usage_history_micros: 0.0,
        hard_budget_left_micros: None,
        soft_budget_left_micros: None,
        hard_budget_left_gpu_milli_ms: None,
    })
}

/// GPU counts by class name to milli-units by class id.
fn milli_by_class(
    i: usize,
    what: &str,
    gpus: &BTreeMap<String, f64>,
    class_ids: &HashMap<&str, ClassId>,
) -> Result<BTreeMap<ClassId, u64>, String> {
    gpus.iter()
        .map(|(name, &n)| {
            let class =
                *class_ids.get(name.as_str()).ok_or_else(|| format!("teams[{i}].{what}: unknown class {name:?}"))?;
            if !(n.is_finite() && n >= 0.0) {
                return Err(format!("teams[{i}].{what}.{name}: must be a non-negative number of GPUs"));
            }
            Ok((class, (n * f64::from(UNIT)).round() as u64))
        })
        .collect()
}

/// A parent chain that comes back to itself would make every quota check loop.
fn check_acyclic(teams: &[Team]) -> Result<(), String> {
    for (i, team) in teams.iter().enumerate() {
        let mut parent = team.parent;
        let mut steps = 0;
        while let Some(p) = parent {
            steps += 1;
            if steps > teams.len() {
                return Err(format!("team {:?} is its own ancestor", teams[i].name));
            }
            parent = teams[p as usize].parent;
        }
    }
    Ok(())
}

fn build_priorities(entries: &[PriorityEntry]) -> Result<Vec<PriorityClass>, String> {
    if entries.len() > usize::from(u8::MAX) {
        return Err("too many priority classes".into());
    }
    Ok(entries
        .iter()
        .map(|p| PriorityClass {
            name: p.name.clone(),
            priority: p.priority,
            preemptible: p.preemptible,
            price_multiplier_milli: p.price_multiplier_milli,
            usage_factor_milli: p.usage_factor_milli,
            preemption_grace_ms: i64::from(p.grace_s) * 1000,
            preemption_delay_ms: i64::from(p.delay_s) * 1000,
        })
        .collect())
}

/// The platform's built-in priority classes (the same as the database seeds them):
/// `serving` and `production` are never preempted; `experiment` and `scavenger` may be, and
/// count less in fair share. Each preempted job gets 30 s to checkpoint.
pub fn default_priorities() -> Vec<PriorityClass> {
    let class = |name: &str, priority, preemptible, usage_factor_milli, price_multiplier_milli| PriorityClass {
        name: name.into(),
        priority,
        preemptible,
        price_multiplier_milli,
        usage_factor_milli,
        preemption_grace_ms: 30_000,
        preemption_delay_ms: 0,
    };
    vec![
        class("serving", 1000, false, 1000, 1250),
        class("production", 500, false, 1000, 1000),
        class("experiment", 100, true, 750, 800),
        class("scavenger", 0, true, 250, 300),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
[[classes]]
name = "h100"
rate_per_gpu_hour = 2.5

[[classes]]
name = "t4"
rate_per_gpu_hour = 0.35

[[nodes]]
name_prefix = "h100-"
count = 5
class = "h100"
gpus = 8
nvlink_domain_size = 4
nodes_per_rack = 2

[[nodes]]
name_prefix = "t4-"
count = 3
class = "t4"
gpus = 1
nodes_per_rack = 4

[[teams]]
name = "research"
reserved = { h100 = 16 }
burst = { h100 = 8 }

[[teams]]
name = "vision"
parent = "research"
reserved = { h100 = 8, t4 = 0.5 }
burst = { t4 = 2 }
"#;

    #[test]
    fn a_description_becomes_classes_nodes_racks_and_a_team_tree() {
        let cluster = parse_cluster(EXAMPLE).unwrap();
        assert_eq!(cluster.classes[0].rate_micros_per_hour, 2_500_000);
        assert_eq!(cluster.classes[1].rate_micros_per_hour, 350_000);
        assert_eq!(cluster.nodes.len(), 8);
        assert_eq!(cluster.nodes[4].name, "h100-4");
        let racks: Vec<_> = cluster.nodes.iter().map(|n| n.rack).collect();
        assert_eq!(racks, [Some(0), Some(0), Some(1), Some(1), Some(2), Some(3), Some(3), Some(3)]);
        assert_eq!(cluster.teams[1].parent, Some(0));
        let vision_t4 = cluster.teams[1].quotas[&1];
        assert_eq!(vision_t4, Quota { reserved: 500, burst: 2000, lendable: 500 });
        assert_eq!(cluster.priorities.len(), 4);
    }

    #[test]
    fn an_unknown_class_is_named_in_the_error() {
        let text = EXAMPLE.replace("class = \"t4\"", "class = \"a100\"");
        let (_, message) = parse_cluster(&text).unwrap_err();
        assert!(message.contains("\"a100\""), "{message}");
    }

    #[test]
    fn a_syntax_error_carries_its_line() {
        let text = "[[classes]]\nname = \"h100\"\nrate_per_gpu_hour = =\n";
        let (line, _) = parse_cluster(text).unwrap_err();
        assert_eq!(line, 3);
    }

    #[test]
    fn a_team_that_is_its_own_ancestor_is_refused() {
        let text = EXAMPLE.replace("name = \"research\"\n", "name = \"research\"\nparent = \"vision\"\n");
        assert!(parse_cluster(&text).unwrap_err().1.contains("own ancestor"));
    }
}
