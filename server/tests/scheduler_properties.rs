//! Properties of the admission engine, [`fairway::scheduler::schedule`], checked with proptest
//! over random small inventories, team trees with nested quotas, priority classes, running jobs
//! and pending job streams (the acceptance list of the engine's issue).
//!
//! Every generated snapshot is one a correct control loop could hand the engine: running jobs
//! are placed greedily on real units, within every quota of their team chain, non-preemptible
//! ones within reserved quota, and children reserve no more than their parent. Generation works
//! on "raw" numbers that are mapped onto a valid snapshot, so shrinking (which only makes the
//! raw numbers and lists smaller) always yields a valid, smaller counterexample; proptest
//! prints the minimal snapshot on failure.

use std::{
    collections::{BTreeMap, BTreeSet},
    ops::Range,
};

use fairway::scheduler::{
    schedule, Admission, ClassId, Config, Decisions, Elastic, GpuClass, Host, JobId, JobSpec, Level, Node,
    PendingReason, Placement, Policy, PreemptReason, PriorityClass, QueueOrder, Quota, ReplicaPlacement, RunningJob,
    RuntimeHistory, Snapshot, Team, TeamId, Topology, UNIT,
};
use proptest::{prelude::*, test_runner::TestCaseError};

/// Cases per property: thousands in total, each small enough for a debug build.
const CASES: u32 = 1_000;
/// The snapshots' clock: far enough from zero that every generated age fits before it.
const NOW_MS: i64 = 30 * 24 * 3_600_000;
/// How many cycles without arrivals may still preempt before that counts as a loop.
const MAX_CYCLES: usize = 20;
const HALF_UNIT: u64 = UNIT as u64 / 2;

// ---------------------------------------------------------------------------------------------
// Raw scenarios: plain numbers that `build` maps onto a valid snapshot.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct RawNode {
    class: u8,
    units: u8,
    nvlink_domain_size: u8,
    rack: Option<u32>,
    zone: u32,
    elastic: bool,
}

#[derive(Debug, Clone)]
struct RawTeam {
    /// Index of an earlier team (taken modulo the team's own index, so the tree has no cycle).
    parent: Option<usize>,
    /// Per class, in half units; clipped so children reserve no more than their parent and
    /// top-level teams no more than the cluster has.
    reserved: [u64; 3],
    burst: [u64; 3],
    /// Quarters of reserved that may be lent.
    lendable_quarters: u64,
    weight: usize,
    history: u32,
    hard_budget: u8,
    soft_budget: u8,
}

#[derive(Debug, Clone)]
struct RawJob {
    team: usize,
    class: u8,
    replicas: u16,
    milli: u32,
    priority: usize,
    topology: u8,
    /// Running: seconds since start. Pending: seconds since submission.
    age_s: i64,
    runtime_min: i64,
    checkpoint_s: Option<i64>,
    terminating: bool,
}

#[derive(Debug, Clone)]
struct RawPriority {
    priority: i32,
    preemptible: bool,
    grace_ms: i64,
    /// Jobs are up to 20 minutes old: a 10-minute delay holds back about half of them.
    delay_ms: i64,
}

#[derive(Debug, Clone)]
struct Raw {
    classes: u8,
    nodes: Vec<RawNode>,
    teams: Vec<RawTeam>,
    priorities: Vec<RawPriority>,
    running: Vec<RawJob>,
    pending: Vec<RawJob>,
    min_runtime_ms: i64,
    estimate_start_times: bool,
}

fn raw_node() -> impl Strategy<Value = RawNode> {
    (
        0u8..3,
        1u8..=8,
        prop::sample::select(vec![0u8, 1, 2, 4]),
        prop::option::weighted(0.8, 0u32..3),
        0u32..2,
        prop::bool::weighted(0.1),
    )
        .prop_map(|(class, units, nvlink_domain_size, rack, zone, elastic)| RawNode {
            class,
            units,
            nvlink_domain_size,
            rack,
            zone,
            elastic,
        })
}

fn raw_team() -> impl Strategy<Value = RawTeam> {
    (
        prop::option::weighted(0.4, 0usize..6),
        prop::array::uniform3(0u64..=12),
        prop::array::uniform3(0u64..=16),
        prop::sample::select(vec![4u64, 4, 4, 2, 0]),
        0usize..4,
        0u32..1_000,
        0u8..10,
        0u8..10,
    )
        .prop_map(|(parent, reserved, burst, lendable_quarters, weight, history, hard_budget, soft_budget)| {
            RawTeam { parent, reserved, burst, lendable_quarters, weight, history, hard_budget, soft_budget }
        })
}

fn raw_job() -> impl Strategy<Value = RawJob> {
    (
        (0usize..6, 0u8..3, 1u16..=3, prop::sample::select(vec![250u32, 500, 1000, 1000, 1000, 2000, 3000, 4000])),
        (0usize..4, 0u8..10, 0i64..1_200, 1i64..=600, prop::option::of(0i64..1_200), prop::bool::weighted(0.05)),
    )
        .prop_map(
            |((team, class, replicas, milli), (priority, topology, age_s, runtime_min, checkpoint_s, terminating))| {
                RawJob {
                    team,
                    class,
                    replicas,
                    milli,
                    priority,
                    topology,
                    age_s,
                    runtime_min,
                    checkpoint_s,
                    terminating,
                }
            },
        )
}

fn raw_priority() -> impl Strategy<Value = RawPriority> {
    (-1i32..=4, any::<bool>(), prop::sample::select(vec![0i64, 30_000]), prop::sample::select(vec![0i64, 0, 600_000]))
        .prop_map(|(priority, preemptible, grace_ms, delay_ms)| RawPriority {
            priority,
            preemptible,
            grace_ms,
            delay_ms,
        })
}

fn raw() -> impl Strategy<Value = Raw> {
    (
        // One class most of the time, so that jobs crowd each other.
        prop_oneof![3 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)],
        prop::collection::vec(raw_node(), 1..=12),
        prop::collection::vec(raw_team(), 1..=6),
        prop::collection::vec(raw_priority(), 1..=4),
        prop::collection::vec(raw_job(), 0..=24),
        prop::collection::vec(raw_job(), 0..=10),
        prop::sample::select(vec![0i64, 60_000, 300_000]),
        any::<bool>(),
    )
        .prop_map(|(classes, nodes, teams, priorities, running, pending, min_runtime_ms, estimate_start_times)| {
            Raw { classes, nodes, teams, priorities, running, pending, min_runtime_ms, estimate_start_times }
        })
}

/// Random valid snapshots decided by one of `policies`.
fn snapshots(policies: &[Policy]) -> impl Strategy<Value = Snapshot> {
    (raw(), prop::sample::select(policies.to_vec())).prop_map(|(raw, policy)| build(&raw, policy, false))
}

const ALL_POLICIES: [Policy; 3] = [Policy::Fairway, Policy::QuotaNoHistory, Policy::Fifo];
/// The policies that enforce quotas (FIFO, a baseline, ignores them by definition).
const QUOTA_POLICIES: [Policy; 2] = [Policy::Fairway, Policy::QuotaNoHistory];

/// The snapshot with CPUs scarce: each node (not pool) gives `cores` per GPU and 64 GiB per
/// GPU, and each waiting job's replica asks 2, 4, 8 or 12 cores and 16 GiB per GPU, so CPUs
/// and not GPUs often decide where a replica goes. Running jobs ask none (the snapshot placed
/// them by GPUs).
fn with_scarce_cpus(mut s: Snapshot, cores: u32) -> Snapshot {
    for n in s.nodes.iter_mut().filter(|n| !n.elastic) {
        let units = u32::from(n.units);
        n.host = Some(Host { cpu_millis: units * cores * 1000, memory_mib: units * 65_536 });
    }
    for (i, job) in s.pending.iter_mut().enumerate() {
        let gpus = job.milli_per_replica.div_ceil(UNIT);
        job.host = Host { cpu_millis: gpus * [2, 4, 8, 12][i % 4] * 1000, memory_mib: gpus * 16_384 };
    }
    s
}

/// Every admitted replica takes its job's CPU and memory, and no node gives more than it has.
fn check_host(s: &Snapshot, d: &Decisions) -> Result<(), TestCaseError> {
    let mut taken: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for a in &d.admissions {
        let spec = s.pending.iter().find(|j| j.id == a.job).expect("admitted jobs wait");
        for r in &a.placement {
            prop_assert_eq!(r.host, spec.host, "job {} replica on node {}", a.job, r.node);
            let t = taken.entry(r.node).or_default();
            t.0 += u64::from(r.host.cpu_millis);
            t.1 += u64::from(r.host.memory_mib);
        }
    }
    for (node, (cpu, memory)) in taken {
        if let Some(host) = s.nodes[node as usize].host {
            prop_assert!(
                cpu <= u64::from(host.cpu_millis) && memory <= u64::from(host.memory_mib),
                "node {node} gives {host:?} but was asked {cpu} millicores and {memory} MiB"
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Building a valid snapshot.
// ---------------------------------------------------------------------------------------------

/// Maps `raw` onto a valid snapshot. With `whole_units_only`, running jobs take whole units
/// only (see the reserved-quota property for why).
fn build(raw: &Raw, policy: Policy, whole_units_only: bool) -> Snapshot {
    let class_count = raw.classes.max(1);
    let classes: Vec<GpuClass> = [("h100", 4_000_000), ("a100", 2_500_000), ("t4", 500_000)]
        .iter()
        .take(usize::from(class_count))
        .map(|&(name, rate)| GpuClass { name: name.into(), rate_micros_per_hour: rate, fraction_milli: 1000 })
        .collect();
    let nodes: Vec<Node> = raw
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| Node {
            name: format!("n{i}"),
            class: ClassId::from(n.class % class_count),
            units: n.units,
            nvlink_domain_size: if n.elastic { 0 } else { n.nvlink_domain_size },
            // Each zone is a cluster of its own, and racks are numbered per zone, as
            // `control::world` numbers them per cluster; each cloud pool is a cluster.
            rack: if n.elastic { None } else { n.rack.map(|r| r * 2 + n.zone) },
            zone: if n.elastic { None } else { Some(n.zone) },
            elastic: n.elastic,
            // Every other elastic pool is spot capacity.
            spot: n.elastic && i % 2 == 1,
            drivers: Default::default(),
            host: None,
            cluster: if n.elastic { 2 + i as u32 } else { n.zone },
        })
        .collect();
    let mut capacity = vec![0u64; classes.len()];
    for node in &nodes {
        capacity[usize::from(node.class)] += u64::from(node.units) * u64::from(UNIT);
    }

    let mut teams: Vec<Team> = Vec::with_capacity(raw.teams.len());
    for (i, t) in raw.teams.iter().enumerate() {
        let parent = if i == 0 { None } else { t.parent.map(|p| (p % i) as TeamId) };
        let mut quotas = BTreeMap::new();
        for (c, &class_capacity) in capacity.iter().enumerate() {
            let class = c as ClassId;
            // What is left to reserve: the parent's reservation less its other children's, or
            // the cluster less the other top-level teams'.
            let taken: u64 = teams
                .iter()
                .filter(|other| other.parent == parent)
                .filter_map(|other| other.quotas.get(&class))
                .map(|q: &Quota| q.reserved)
                .sum();
            let ceiling = match parent {
                Some(p) => teams[p as usize].quotas.get(&class).map_or(0, |q| q.reserved),
                None => class_capacity,
            };
            let reserved = (t.reserved[c] * HALF_UNIT).min(ceiling.saturating_sub(taken));
            let burst = t.burst[c] * HALF_UNIT;
            if reserved + burst > 0 {
                quotas.insert(class, Quota { reserved, burst, lendable: reserved * t.lendable_quarters / 4 });
            }
        }
        teams.push(Team {
            name: format!("t{i}"),
            parent,
            quotas,
            fair_share_weight_milli: [500, 1_000, 1_000, 2_000][t.weight % 4],
            usage_history_micros: f64::from(t.history) * 1_000_000.0,
            hard_budget_left_micros: budget(t.hard_budget),
            soft_budget_left_micros: budget(t.soft_budget),
            hard_budget_left_gpu_milli_ms: None,
        });
    }
    let leaves: Vec<TeamId> =
        (0..teams.len() as TeamId).filter(|&t| !teams.iter().any(|other| other.parent == Some(t))).collect();

    let priorities: Vec<PriorityClass> = raw
        .priorities
        .iter()
        .enumerate()
        .map(|(i, p)| PriorityClass {
            name: format!("p{i}"),
            priority: p.priority,
            preemptible: p.preemptible,
            price_multiplier_milli: 1_000,
            usage_factor_milli: if p.preemptible { 500 } else { 1_000 },
            preemption_grace_ms: p.grace_ms,
            preemption_delay_ms: p.delay_ms,
        })
        .collect();

    let mut snapshot = Snapshot {
        now_ms: NOW_MS,
        classes,
        nodes,
        teams,
        priorities,
        running: Vec::new(),
        pending: Vec::new(),
        history: Default::default(),
        forecast_errors: Default::default(),
        config: Config {
            min_runtime_before_preemption_ms: raw.min_runtime_ms,
            policy,
            estimate_start_times: raw.estimate_start_times,
            // Both placements must keep every property; which one is drawn with the nodes.
            placement: if raw.nodes.len().is_multiple_of(2) { Placement::Fragmentation } else { Placement::BestFit },
            // Every other snapshot orders by expected service, with least-attained-service
            // preemption above a threshold low enough that jobs cross it between cycles.
            queue_order: if raw.teams.len().is_multiple_of(2) {
                QueueOrder::ServiceIndex { starvation_ms: 3_600_000, threshold_gpu_ms: Some(10 * 60_000) }
            } else {
                QueueOrder::Arrival
            },
            ..Config::default()
        },
    };

    // Running jobs: placed greedily, dropped when they do not fit on free units or in quota.
    let mut used = Occupancy::empty(&snapshot);
    let mut held = Ledger::default();
    for (i, r) in raw.running.iter().enumerate() {
        let mut spec = job_spec(&snapshot, &leaves, r, 1 + i as JobId);
        if whole_units_only && spec.milli_per_replica < UNIT {
            spec.milli_per_replica = UNIT;
        }
        // A running elastic gang may hold extras beyond its minimum.
        if let Some(e) = spec.elastic {
            spec.replicas = (e.min_replicas + (r.age_s % 3) as u16).min(e.max_replicas);
        }
        if !held.admits(&snapshot, &spec) {
            continue;
        }
        let Some(placement) = plan(&snapshot, &used, &spec) else { continue };
        used.take(&placement);
        held.add(&snapshot, &spec);
        let started_ms = NOW_MS - r.age_s * 1_000;
        snapshot.running.push(RunningJob {
            started_ms,
            last_checkpoint_ms: r.checkpoint_s.map(|s| (started_ms + s * 1_000).min(NOW_MS)),
            spec,
            placement,
            terminating: r.terminating,
        });
    }
    snapshot.pending =
        raw.pending.iter().enumerate().map(|(i, r)| job_spec(&snapshot, &leaves, r, 1_000 + i as JobId)).collect();
    snapshot
}

fn budget(choice: u8) -> Option<i64> {
    match choice {
        0 => Some(0),
        1 => Some(2_000_000),
        2 => Some(1_000_000_000_000),
        _ => None,
    }
}

fn job_spec(s: &Snapshot, leaves: &[TeamId], r: &RawJob, id: JobId) -> JobSpec {
    let topology = match r.topology {
        0 => Topology::Required(Level::NvlinkDomain),
        1 => Topology::Required(Level::Node),
        2 => Topology::Required(Level::Rack),
        3 => Topology::Required(Level::Zone),
        4 => Topology::Preferred(Level::Node),
        5 => Topology::Preferred(Level::Rack),
        _ => Topology::Any,
    };
    JobSpec {
        id,
        team: leaves[r.team % leaves.len()],
        class: ClassId::from(r.class) % s.classes.len() as ClassId,
        replicas: r.replicas,
        milli_per_replica: r.milli,
        priority: (r.priority % s.priorities.len()) as u8,
        topology,
        submitted_ms: NOW_MS - r.age_s * 1_000,
        // Requeued a little after submission now and then (a preempted job's delay runs anew).
        queued_ms: NOW_MS - r.age_s * 1_000 + (r.runtime_min % 3) * 100_000,
        max_runtime_ms: r.runtime_min * 60_000,
        allow_spot: r.age_s % 2 == 0,
        // Every fifth job is a service's replica: nodes only, never a cloud pool.
        fixed_nodes_only: r.age_s % 5 == 0,
        kind: None,
        expected_runtime_ms: None,
        grace_ms: None,
        // Every seventh job overrides its class's preemption delay: none.
        preemption_delay_ms: (r.runtime_min % 7 == 0).then_some(0),
        // Some jobs ran before: 0 to 12 minutes.
        attained_ms: (r.runtime_min % 5) * 3 * 60_000,
        // Every fourth job is an elastic gang, waiting at its minimum.
        elastic: (r.runtime_min % 4 == 1)
            .then(|| Elastic { min_replicas: r.replicas, max_replicas: r.replicas + 1 + (r.age_s % 3) as u16 }),
        min_drivers: Default::default(),
        host: Default::default(),
    }
}

// ---------------------------------------------------------------------------------------------
// Bookkeeping shared by the properties.
// ---------------------------------------------------------------------------------------------

/// `team` and all its ancestors.
fn chain(s: &Snapshot, team: TeamId) -> Vec<TeamId> {
    let mut chain = vec![team];
    while let Some(parent) = s.teams[*chain.last().unwrap() as usize].parent {
        chain.push(parent);
    }
    chain
}

fn quota(s: &Snapshot, team: TeamId, class: ClassId) -> Quota {
    s.teams[team as usize].quotas.get(&class).copied().unwrap_or_default()
}

fn preemptible(s: &Snapshot, job: &JobSpec) -> bool {
    s.priorities[usize::from(job.priority)].preemptible
}

/// Milli-units held per team (counting each job against its team and every ancestor) and
/// class: in total, and by non-preemptible ("firm") jobs.
#[derive(Debug, Default)]
struct Ledger {
    total: BTreeMap<(TeamId, ClassId), u64>,
    firm: BTreeMap<(TeamId, ClassId), u64>,
}

impl Ledger {
    fn of<'a>(s: &Snapshot, jobs: impl IntoIterator<Item = &'a JobSpec>) -> Self {
        let mut ledger = Ledger::default();
        for job in jobs {
            ledger.add(s, job);
        }
        ledger
    }

    fn add(&mut self, s: &Snapshot, job: &JobSpec) {
        for team in chain(s, job.team) {
            *self.total.entry((team, job.class)).or_default() += job.total_milli();
            if !preemptible(s, job) {
                *self.firm.entry((team, job.class)).or_default() += job.total_milli();
            }
        }
    }

    fn total(&self, team: TeamId, class: ClassId) -> u64 {
        self.total.get(&(team, class)).copied().unwrap_or(0)
    }

    fn firm(&self, team: TeamId, class: ClassId) -> u64 {
        self.firm.get(&(team, class)).copied().unwrap_or(0)
    }

    /// Whether `job` may be added: within reserved + burst along its chain and, if it is not
    /// preemptible, its chain's non-preemptible use within reserved.
    fn admits(&self, s: &Snapshot, job: &JobSpec) -> bool {
        chain(s, job.team).into_iter().all(|t| {
            let q = quota(s, t, job.class);
            self.total(t, job.class) + job.total_milli() <= q.reserved + q.burst
                && (preemptible(s, job) || self.firm(t, job.class) + job.total_milli() <= q.reserved)
        })
    }
}

/// Milli-units taken per node and unit.
#[derive(Debug, Clone)]
struct Occupancy(Vec<Vec<u32>>);

impl Occupancy {
    fn empty(s: &Snapshot) -> Self {
        Occupancy(s.nodes.iter().map(|n| vec![0; usize::from(n.units)]).collect())
    }

    fn take(&mut self, placement: &[ReplicaPlacement]) {
        for replica in placement {
            for &(unit, milli) in &replica.units {
                self.0[replica.node as usize][usize::from(unit)] += milli;
            }
        }
    }

    fn free(&self, node: usize, unit: usize) -> u32 {
        UNIT.saturating_sub(self.0[node][unit])
    }
}

/// A set of units a gang may be kept within: (node, unit range) pairs.
type Domain = Vec<(usize, Range<usize>)>;

/// The domains a job of `class` with `topology` may use. A required level confines the gang
/// to one domain of that level; an elastic pool has no topology, so it serves only jobs that
/// require none (a conservative reading: no property below depends on pools serving more).
fn domains(s: &Snapshot, class: ClassId, topology: Topology, allow_spot: bool, fixed_only: bool) -> Vec<Domain> {
    let of_class = || s.nodes.iter().enumerate().filter(move |(_, n)| n.class == class);
    let fixed = || of_class().filter(|(_, n)| !n.elastic);
    let whole = |(i, n): (usize, &Node)| (i, 0..usize::from(n.units));
    match topology {
        // A gang goes to the fixed nodes of one cluster, else into one spot pool (for jobs that
        // allow spot), else into one on-demand pool.
        Topology::Any | Topology::Preferred(_) => {
            let pools =
                |spot: bool| of_class().filter(move |(_, n)| n.elastic && n.spot == spot).map(|n| vec![whole(n)]);
            let mut clusters: BTreeMap<u32, Domain> = BTreeMap::new();
            for (i, n) in fixed() {
                clusters.entry(n.cluster).or_default().push(whole((i, n)));
            }
            let mut tiers: Vec<Domain> = clusters.into_values().collect();
            if fixed_only {
                return tiers;
            }
            if allow_spot {
                tiers.extend(pools(true));
            }
            tiers.extend(pools(false));
            tiers
        }
        Topology::Required(Level::NvlinkDomain) => fixed()
            .flat_map(|(i, n)| {
                let units = usize::from(n.units);
                let size = if n.nvlink_domain_size == 0 { units } else { usize::from(n.nvlink_domain_size) };
                (0..units).step_by(size).map(move |start| vec![(i, start..(start + size).min(units))])
            })
            .collect(),
        Topology::Required(Level::Node) => fixed().map(|node| vec![whole(node)]).collect(),
        Topology::Required(level) => {
            let mut groups: BTreeMap<(u32, usize), Domain> = BTreeMap::new();
            for (i, n) in fixed() {
                let key = match level {
                    Level::Rack => n.rack.map_or((1, i), |r| (0, r as usize)),
                    _ => n.zone.map_or((1, i), |z| (0, z as usize)),
                };
                groups.entry(key).or_default().push(whole((i, n)));
            }
            groups.into_values().collect()
        }
    }
}

/// A placement of `job` on the free units of `used` if one is easy to find: whole replicas on
/// the lowest free units of a node, shares best fit on distinct units. Where this finds one,
/// a correct engine finds one too (it may find more: shares of one gang on one unit, say).
fn plan(s: &Snapshot, used: &Occupancy, job: &JobSpec) -> Option<Vec<ReplicaPlacement>> {
    domains(s, job.class, job.topology, job.allow_spot, job.fixed_nodes_only)
        .into_iter()
        .find_map(|domain| plan_in(used, job, &domain))
}

fn plan_in(used: &Occupancy, job: &JobSpec, domain: &Domain) -> Option<Vec<ReplicaPlacement>> {
    let mut placement = Vec::with_capacity(usize::from(job.replicas));
    if job.milli_per_replica >= UNIT {
        let per_replica = (job.milli_per_replica / UNIT) as usize;
        for (node, range) in domain {
            let mut free = range.clone().filter(|&u| used.0[*node][u] == 0);
            while placement.len() < usize::from(job.replicas) {
                let units: Vec<(u8, u32)> = free.by_ref().take(per_replica).map(|u| (u as u8, UNIT)).collect();
                if units.len() < per_replica {
                    break;
                }
                placement.push(ReplicaPlacement { node: *node as u32, units, host: Default::default() });
            }
        }
    } else {
        let mut candidates: Vec<(u32, usize, usize)> = domain
            .iter()
            .flat_map(|(node, range)| range.clone().map(move |u| (*node, u)))
            .filter(|&(node, u)| used.free(node, u) >= job.milli_per_replica)
            .map(|(node, u)| (used.free(node, u), node, u))
            .collect();
        candidates.sort();
        placement.extend(candidates.into_iter().take(usize::from(job.replicas)).map(|(_, node, u)| ReplicaPlacement {
            node: node as u32,
            units: vec![(u as u8, job.milli_per_replica)],
            host: Default::default(),
        }));
    }
    (placement.len() == usize::from(job.replicas)).then_some(placement)
}

/// The state after a cycle's decisions take effect: admitted jobs run from now on; victims
/// (and jobs that were already terminating) have stopped, and victims are back in the queue
/// with their original submission time.
fn apply(s: &Snapshot, d: &Decisions) -> Snapshot {
    let victims: BTreeSet<JobId> = d.preemptions.iter().map(|p| p.victim).collect();
    let admitted: BTreeMap<JobId, &Admission> = d.admissions.iter().map(|a| (a.job, a)).collect();
    let mut next = s.clone();
    next.running = s.running.iter().filter(|r| !r.terminating && !victims.contains(&r.spec.id)).cloned().collect();
    // Elastic gangs lose their taken extras at once (as victims leave) and gain their growth.
    for r in &mut next.running {
        let mut taken: Vec<usize> =
            d.shrinks.iter().filter(|k| k.job == r.spec.id).map(|k| usize::from(k.replica)).collect();
        taken.sort_unstable_by(|a, b| b.cmp(a));
        for k in taken {
            r.placement.remove(k);
        }
        for g in d.growths.iter().filter(|g| g.job == r.spec.id) {
            r.placement.extend(g.placement.iter().cloned());
        }
        r.spec.replicas = r.placement.len() as u16;
    }
    next.running.extend(s.pending.iter().filter_map(|job| {
        admitted.get(&job.id).map(|a| RunningJob {
            spec: job.clone(),
            started_ms: s.now_ms,
            last_checkpoint_ms: None,
            placement: a.placement.clone(),
            terminating: false,
        })
    }));
    next.pending = s.pending.iter().filter(|job| !admitted.contains_key(&job.id)).cloned().collect();
    // A victim goes back to the queue now: its preemption delay runs anew.
    next.pending.extend(s.running.iter().filter(|r| victims.contains(&r.spec.id)).map(|r| JobSpec {
        queued_ms: s.now_ms,
        attained_ms: r.spec.attained_ms + (s.now_ms - r.started_ms),
        ..r.spec.clone()
    }));
    next
}

/// Every expected start is an interval `earliest <= expected <= latest`, none before now; a
/// job blocked by something no forecast knows (quota or budget changes, capacity) has none and
/// says so.
fn check_expected_starts(s: &Snapshot, d: &Decisions) -> Result<(), TestCaseError> {
    for p in &d.pending {
        let unforeseeable = matches!(
            p.reason,
            PendingReason::NeverFits | PendingReason::ExceedsQuota { .. } | PendingReason::BudgetExhausted
        );
        prop_assert_eq!(p.unforeseeable.is_some(), unforeseeable, "job {}: {:?}", p.job, p);
        match (p.earliest_start_ms, p.expected_start_ms, p.latest_start_ms) {
            (Some(a), Some(b), Some(c)) => {
                prop_assert!(s.now_ms <= a && a <= b && b <= c, "job {}: {:?}", p.job, p);
                prop_assert!(!unforeseeable);
            }
            (None, None, None) => {}
            _ => prop_assert!(false, "job {}: a partial interval {:?}", p.job, p),
        }
    }
    Ok(())
}

fn pending_by_id(s: &Snapshot) -> BTreeMap<JobId, &JobSpec> {
    s.pending.iter().map(|j| (j.id, j)).collect()
}

/// The maximum cost of `job` as the design defines it: GPUs × rate × max runtime × price
/// multiplier, in micro-units of money.
fn max_cost_micros(s: &Snapshot, job: &JobSpec) -> i128 {
    let rate = i128::from(s.classes[usize::from(job.class)].rate_micros_per_hour);
    let multiplier = i128::from(s.priorities[usize::from(job.priority)].price_multiplier_milli);
    i128::from(job.total_milli()) * rate * i128::from(job.max_runtime_ms) * multiplier / (1_000 * 3_600_000 * 1_000)
}

/// Units shared by everything that holds GPUs after the cycle: every running job (victims and
/// terminating jobs keep theirs until they have stopped) plus every admission.
fn occupancy_after(s: &Snapshot, d: &Decisions) -> Occupancy {
    let mut used = Occupancy::empty(s);
    for job in &s.running {
        used.take(&job.placement);
    }
    for admission in &d.admissions {
        used.take(&admission.placement);
    }
    for growth in &d.growths {
        used.take(&growth.placement);
    }
    used
}

// ---------------------------------------------------------------------------------------------
// The checks, one per property, so that several properties can reuse them.
// ---------------------------------------------------------------------------------------------

/// Each admitted replica is on an existing node of the job's class, on distinct existing
/// units, takes exactly its share (whole units for whole-GPU replicas, one unit for a share),
/// and a required topology level holds for the whole gang.
fn check_placements(s: &Snapshot, d: &Decisions) -> Result<(), TestCaseError> {
    let pending = pending_by_id(s);
    for a in &d.admissions {
        let Some(job) = pending.get(&a.job) else {
            return Err(TestCaseError::fail(format!("admitted job {} is not pending", a.job)));
        };
        prop_assert_eq!(a.placement.len(), usize::from(job.replicas), "job {} placed partially: {:?}", job.id, a);
        for replica in &a.placement {
            let node = s.nodes.get(replica.node as usize);
            prop_assert!(node.is_some(), "job {} placed on a node that does not exist: {:?}", job.id, replica);
            let node = node.unwrap();
            prop_assert_eq!(node.class, job.class, "job {} placed on a node of another class: {:?}", job.id, replica);
            prop_assert!(job.allow_spot || !node.spot, "job {} does not allow spot but runs on {}", job.id, node.name);
            prop_assert!(
                !(job.fixed_nodes_only && node.elastic),
                "job {} takes nodes only but runs in the cloud pool {}",
                job.id,
                node.name
            );
            prop_assert!(
                !node.elastic || a.placement.iter().all(|r| r.node == replica.node),
                "job {} is split across a cloud pool and other nodes: {:?}",
                job.id,
                a
            );

            let units: BTreeSet<u8> = replica.units.iter().map(|&(u, _)| u).collect();
            prop_assert_eq!(units.len(), replica.units.len(), "job {} uses a unit twice: {:?}", job.id, replica);
            prop_assert!(
                units.iter().all(|&u| u < node.units),
                "job {} on a unit beyond the node: {:?}",
                job.id,
                replica
            );
            let milli: u32 = replica.units.iter().map(|&(_, m)| m).sum();
            prop_assert_eq!(
                milli,
                job.milli_per_replica,
                "job {} replica takes the wrong amount: {:?}",
                job.id,
                replica
            );
            if job.milli_per_replica >= UNIT {
                prop_assert!(replica.units.iter().all(|&(_, m)| m == UNIT), "whole-GPU replica split: {:?}", replica);
            } else {
                prop_assert_eq!(replica.units.len(), 1, "a share spread over units: {:?}", replica);
            }
        }
        let clusters: BTreeSet<u32> = a.placement.iter().map(|r| s.nodes[r.node as usize].cluster).collect();
        prop_assert!(clusters.len() <= 1, "job {} spans clusters {:?}: {:?}", job.id, clusters, a);
        if let Topology::Required(level) = job.topology {
            let keys: BTreeSet<(usize, usize)> = a
                .placement
                .iter()
                .flat_map(|replica| {
                    let n = &s.nodes[replica.node as usize];
                    let node = replica.node as usize;
                    replica.units.iter().map(move |&(unit, _)| match level {
                        Level::NvlinkDomain => {
                            // Size 0 means the whole node is one domain.
                            (node, usize::from(unit).checked_div(usize::from(n.nvlink_domain_size)).unwrap_or(0))
                        }
                        Level::Node => (node, 0),
                        Level::Rack => n.rack.map_or((node, 1), |r| (r as usize, 0)),
                        Level::Zone => n.zone.map_or((node, 1), |z| (z as usize, 0)),
                    })
                })
                .collect();
            prop_assert!(keys.len() <= 1, "job {} requires one {:?} but spans {:?}: {:?}", job.id, level, keys, a);
        }
    }
    Ok(())
}

/// Elastic gangs grow only while running, up to their maximum, with whole replicas on nodes
/// of their class, and only in a class where no job is left waiting for what capacity cures.
fn check_growths(s: &Snapshot, d: &Decisions) -> Result<(), TestCaseError> {
    let pending = pending_by_id(s);
    for g in &d.growths {
        let Some(gang) = s.running.iter().find(|r| r.spec.id == g.job) else {
            return Err(TestCaseError::fail(format!("grows job {}, which is not running", g.job)));
        };
        let Some(e) = gang.spec.elastic else {
            return Err(TestCaseError::fail(format!("grows job {}, which is not elastic", g.job)));
        };
        prop_assert!(!gang.terminating, "grows job {}, which is stopping", g.job);
        let taken = d.shrinks.iter().filter(|k| k.job == g.job).count();
        prop_assert!(
            gang.placement.len() - taken + g.placement.len() <= usize::from(e.max_replicas),
            "job {} grows past its maximum {}: holds {}, grows {}",
            g.job,
            e.max_replicas,
            gang.placement.len(),
            g.placement.len()
        );
        prop_assert_eq!(g.borrowing.len(), g.placement.len(), "job {}: one borrowing flag per new replica", g.job);
        for replica in &g.placement {
            let node = &s.nodes[replica.node as usize];
            prop_assert_eq!(node.class, gang.spec.class, "job {} grows onto another class: {:?}", g.job, replica);
            let own = gang.placement.first().map(|r| s.nodes[r.node as usize].cluster);
            prop_assert_eq!(Some(node.cluster), own, "job {} grows into another cluster: {:?}", g.job, replica);
            prop_assert!(!node.elastic, "an extra of job {} goes to a cloud pool", g.job);
            prop_assert!(gang.spec.allow_spot || !node.spot, "job {} grows onto spot", g.job);
            prop_assert!(!(gang.spec.fixed_nodes_only && node.elastic), "job {} grows into a cloud pool", g.job);
            let milli: u32 = replica.units.iter().map(|&(_, m)| m).sum();
            prop_assert_eq!(milli, gang.spec.milli_per_replica, "job {} grows a wrong replica: {:?}", g.job, replica);
        }
        let blocked = d.pending.iter().any(|p| {
            pending.get(&p.job).is_some_and(|j| j.class == gang.spec.class)
                && !matches!(
                    p.reason,
                    PendingReason::NeverFits
                        | PendingReason::ExceedsQuota { .. }
                        | PendingReason::BudgetExhausted
                        | PendingReason::DriverUnavailable
                )
        });
        prop_assert!(!blocked, "job {} grows while a job of its class waits for capacity: {:#?}", g.job, d);
    }
    Ok(())
}

/// No unit holds more than a whole GPU: running jobs (victims included, as they keep their
/// GPUs through their grace period) plus admissions.
fn check_capacity(s: &Snapshot, d: &Decisions) -> Result<(), TestCaseError> {
    check_placements(s, d)?;
    check_growths(s, d)?;
    let used = occupancy_after(s, d);
    for (node, units) in used.0.iter().enumerate() {
        for (unit, &milli) in units.iter().enumerate() {
            prop_assert!(milli <= UNIT, "node {} unit {} holds {} milli; decisions: {:#?}", node, unit, milli, d);
        }
    }
    Ok(())
}

/// Every pending job is decided exactly once (admitted or left pending), nothing else is
/// decided, admitted gangs are whole, and expected starts are not in the past.
fn check_decided_once(s: &Snapshot, d: &Decisions) -> Result<(), TestCaseError> {
    check_placements(s, d)?;
    let pending: BTreeSet<JobId> = s.pending.iter().map(|j| j.id).collect();
    let mut seen = BTreeSet::new();
    for id in d.admissions.iter().map(|a| a.job).chain(d.pending.iter().map(|p| p.job)) {
        prop_assert!(pending.contains(&id), "job {} is decided but was not pending", id);
        prop_assert!(seen.insert(id), "job {} is decided twice: {:#?}", id, d);
    }
    prop_assert_eq!(seen.len(), pending.len(), "some pending jobs are not decided: {:?}", pending.difference(&seen));
    for p in &d.pending {
        if let Some(start) = p.expected_start_ms {
            prop_assert!(start >= s.now_ms, "job {} is expected to start in the past: {:?}", p.job, p);
        }
        prop_assert!(p.position >= 1, "positions are 1-based: {:?}", p);
    }
    Ok(())
}

/// After the cycle (admissions running, victims gone), no team or ancestor holds more than
/// reserved + burst of any class. Terminating jobs are leaving and count against no quota.
fn check_quotas(s: &Snapshot, d: &Decisions) -> Result<(), TestCaseError> {
    let after = apply(s, d);
    let ledger = Ledger::of(&after, after.running.iter().map(|r| &r.spec));
    for (&(team, class), &held) in &ledger.total {
        let q = quota(s, team, class);
        prop_assert!(
            held <= q.reserved + q.burst,
            "team {} holds {} milli of class {} with quota {:?}; decisions: {:#?}",
            team,
            held,
            class,
            q,
            d
        );
    }
    Ok(())
}

/// Non-preemptible jobs are admitted only within reserved quota: after the cycle, the
/// non-preemptible use of every team (and ancestor) is within its reserved quota. Their
/// team's preemptible jobs do not count against it: those borrow instead.
fn check_firm_within_reserved(s: &Snapshot, d: &Decisions) -> Result<(), TestCaseError> {
    let after = apply(s, d);
    let ledger = Ledger::of(&after, after.running.iter().map(|r| &r.spec));
    for (&(team, class), &held) in &ledger.firm {
        let q = quota(s, team, class);
        prop_assert!(
            held <= q.reserved,
            "team {} runs {} milli of non-preemptible jobs of class {} with reserved {}; decisions: {:#?}",
            team,
            held,
            class,
            q.reserved,
            d
        );
    }
    Ok(())
}

/// What a team is not billed for as burst stays within its reserved quota: at each team's own
/// level, the running jobs that stay, with this cycle's admissions and grown replicas not
/// marked as borrowing, fit the team's reserved quota. (A non-preemptible job admitted beside
/// its team's preemptible jobs may take the team past its reserved quota, and is then marked
/// borrowing: billed as burst, while the preemptible ones are what reclaim takes back.)
fn check_unborrowed_within_reserved(s: &Snapshot, d: &Decisions) -> Result<(), TestCaseError> {
    let victims: BTreeSet<JobId> = d.preemptions.iter().map(|p| p.victim).collect();
    // Per team and class: what the running jobs that stay hold, and what the cycle adds
    // without marking it borrowing.
    let mut held: BTreeMap<(TeamId, ClassId), (u64, u64)> = BTreeMap::new();
    for r in s.running.iter().filter(|r| !r.terminating && !victims.contains(&r.spec.id)) {
        let shrunk = d.shrinks.iter().filter(|k| k.job == r.spec.id).count();
        let replicas = r.placement.len().saturating_sub(shrunk) as u64;
        held.entry((r.spec.team, r.spec.class)).or_default().0 += replicas * u64::from(r.spec.milli_per_replica);
    }
    let pending = pending_by_id(s);
    for a in d.admissions.iter().filter(|a| !a.borrowing) {
        let job = pending[&a.job];
        held.entry((job.team, job.class)).or_default().1 += job.total_milli();
    }
    for g in &d.growths {
        let Some(r) = s.running.iter().find(|r| r.spec.id == g.job) else { continue };
        let unborrowed = g.borrowing.iter().filter(|&&b| !b).count() as u64;
        held.entry((r.spec.team, r.spec.class)).or_default().1 += unborrowed * u64::from(r.spec.milli_per_replica);
    }
    for (&(team, class), &(staying, added)) in &held {
        let reserved = quota(s, team, class).reserved;
        // Jobs that ran before the cycle may already hold more (a quota lowered, a reclaim
        // across the reserved line); then the cycle may add nothing unborrowed.
        prop_assert!(
            added == 0 || staying + added <= reserved,
            "team {} adds {} milli of class {} not marked borrowing beside {} with reserved {}; decisions: {:#?}",
            team,
            added,
            class,
            staying,
            reserved,
            d
        );
    }
    Ok(())
}

/// Only running, not yet terminating, preemptible jobs past the minimum runtime are preempted,
/// each once, for a pending job, with their class's grace period; a priority preemption is
/// within one team and for a higher priority. FIFO never preempts.
fn check_preemptions(s: &Snapshot, d: &Decisions) -> Result<(), TestCaseError> {
    if s.config.policy == Policy::Fifo {
        prop_assert!(d.preemptions.is_empty(), "FIFO preempts: {:?}", d.preemptions);
    }
    let running: BTreeMap<JobId, &RunningJob> = s.running.iter().map(|r| (r.spec.id, r)).collect();
    let pending = pending_by_id(s);
    let mut victims = BTreeSet::new();
    for p in &d.preemptions {
        prop_assert!(victims.insert(p.victim), "job {} preempted twice", p.victim);
        let Some(victim) = running.get(&p.victim) else {
            return Err(TestCaseError::fail(format!("preempted job {} is not running: {p:?}", p.victim)));
        };
        prop_assert!(!victim.terminating, "job {} is already terminating: {:?}", p.victim, p);
        let class = &s.priorities[usize::from(victim.spec.priority)];
        prop_assert!(class.preemptible, "non-preemptible job {} preempted: {:?}", p.victim, p);
        prop_assert!(
            victim.started_ms + s.config.min_runtime_before_preemption_ms <= s.now_ms,
            "job {} preempted before its minimum runtime (started {}, now {}): {:?}",
            p.victim,
            victim.started_ms,
            s.now_ms,
            p
        );
        prop_assert_eq!(p.grace_ms, class.preemption_grace_ms, "wrong grace for {:?}", p);
        let Some(beneficiary) = pending.get(&p.for_job) else {
            return Err(TestCaseError::fail(format!(
                "job {} preempted for a job that is not pending: {p:?}",
                p.victim
            )));
        };
        prop_assert!(
            s.preemption_delayed_until(beneficiary).is_none(),
            "job {} preempted for job {} within its preemption delay (until {:?}, now {}): {:?}",
            p.victim,
            p.for_job,
            s.preemption_delayed_until(beneficiary),
            s.now_ms,
            p
        );
        prop_assert!(p.reason != PreemptReason::OwnTeam, "a whole job preempted as if it were an extra: {:?}", p);
        if p.reason == PreemptReason::LeastService {
            prop_assert_eq!(beneficiary.team, victim.spec.team, "least service across teams: {:?}", p);
            prop_assert_eq!(
                s.priorities[usize::from(beneficiary.priority)].priority,
                class.priority,
                "least service across priorities: {:?}",
                p
            );
            prop_assert!(
                s.below_service_threshold(beneficiary) && s.past_service_threshold(victim),
                "least service for a job not below the threshold, or of a victim not past it: {:?}",
                p
            );
        }
        if p.reason == PreemptReason::Priority {
            prop_assert_eq!(beneficiary.team, victim.spec.team, "a priority preemption across teams: {:?}", p);
            prop_assert!(
                s.priorities[usize::from(beneficiary.priority)].priority > class.priority,
                "a priority preemption for a job of no higher priority: {:?}",
                p
            );
        }
    }
    // A shrink takes an extra of a running elastic gang, under the rules of a preemption.
    let mut taken = BTreeSet::new();
    for k in &d.shrinks {
        prop_assert!(taken.insert((k.job, k.replica)), "extra {:?} taken twice", k);
        prop_assert!(!victims.contains(&k.job), "the extras of preempted job {} are taken too: {:?}", k.job, k);
        let Some(gang) = running.get(&k.job) else {
            return Err(TestCaseError::fail(format!("shrinks job {}, which is not running: {k:?}", k.job)));
        };
        let min = gang.spec.elastic.map(|e| e.min_replicas);
        prop_assert!(
            min.is_some_and(|m| k.replica >= m && usize::from(k.replica) < gang.placement.len()),
            "takes replica {} of job {}, which is no extra of it (minimum {:?}, holds {})",
            k.replica,
            k.job,
            min,
            gang.placement.len()
        );
        prop_assert!(!gang.terminating, "shrinks job {}, which is already terminating", k.job);
        let class = &s.priorities[usize::from(gang.spec.priority)];
        prop_assert!(class.preemptible, "takes an extra of non-preemptible job {}: {:?}", k.job, k);
        let beneficiary = pending.get(&k.for_job);
        prop_assert!(beneficiary.is_some(), "an extra taken for job {}, which is not pending: {:?}", k.for_job, k);
        // Its own team takes it by priority, or, at the gang's priority or above, because it
        // grew into what that job waits for; another team only by reclaim or fair share.
        if let Some(b) = beneficiary {
            let (mine, theirs) = (s.priorities[usize::from(b.priority)].priority, class.priority);
            let allowed = match k.reason {
                PreemptReason::Priority => b.team == gang.spec.team && mine > theirs,
                PreemptReason::OwnTeam => b.team == gang.spec.team && mine >= theirs,
                PreemptReason::Reclaim | PreemptReason::FairShare => b.team != gang.spec.team,
                // An extra of the gang's own priority is taken as `OwnTeam` first.
                PreemptReason::LeastService => false,
            };
            prop_assert!(
                allowed,
                "an extra of job {} (priority {}) taken for job {} (priority {}): {:?}",
                k.job,
                theirs,
                b.id,
                mine,
                k
            );
        }
        prop_assert!(
            beneficiary.is_some_and(|b| s.preemption_delayed_until(b).is_none()),
            "an extra taken for job {} within its preemption delay: {:?}",
            k.for_job,
            k
        );
    }
    for w in &d.pending {
        if let PendingReason::PreemptionDelayed { until_ms, victims } = w.reason {
            let job = pending.get(&w.job).copied();
            prop_assert_eq!(
                job.and_then(|j| s.preemption_delayed_until(j)),
                Some(until_ms),
                "job {} says its preemption is delayed: {:?}",
                w.job,
                w
            );
            prop_assert!(victims > 0, "a delayed preemption of no one: {:?}", w);
        }
    }
    Ok(())
}

/// Hard budgets (each covering its team's subtree) are not overrun by this cycle's
/// admissions, and each admission states the maximum cost the design defines (to the
/// micro-unit, allowing for rounding).
fn check_budgets(s: &Snapshot, d: &Decisions) -> Result<(), TestCaseError> {
    let pending = pending_by_id(s);
    let mut spent: BTreeMap<TeamId, i128> = BTreeMap::new();
    for a in &d.admissions {
        let job = pending[&a.job];
        let expected = max_cost_micros(s, job);
        prop_assert!(
            (i128::from(a.max_cost_micros) - expected).abs() <= 1,
            "job {} max cost {} but GPUs × rate × runtime × multiplier is {}",
            job.id,
            a.max_cost_micros,
            expected
        );
        // A budget covers its team's whole subtree: the admission spends from the job's team
        // and from every ancestor.
        let mut at = Some(job.team);
        while let Some(t) = at {
            *spent.entry(t).or_default() += i128::from(a.max_cost_micros);
            at = s.teams[t as usize].parent;
        }
    }
    for (&team, &cost) in &spent {
        if let Some(left) = s.teams[team as usize].hard_budget_left_micros {
            prop_assert!(cost <= i128::from(left), "team {} admitted {} micros with {} left", team, cost, left);
        }
    }
    Ok(())
}

/// The reasons that may leave a job pending although it fits on free GPUs, within quota and
/// budget: the free GPUs are held for another job (a gang's reservation that the job cannot
/// backfill, or GPUs set aside while victims of a reclaim stop).
fn may_hold_back_a_fitting_job(reason: &PendingReason) -> bool {
    matches!(
        reason,
        PendingReason::ReservedFor { .. } | PendingReason::WaitingForReclaim | PendingReason::PreemptionDelayed { .. }
    )
}

/// Work conservation: a job left pending that fits on the GPUs still free after the cycle,
/// whose team chain has room for it, whose budget covers it, and which takes no one's unused
/// reserved quota, must be pending only because those GPUs are held for someone else.
///
/// "Room" is judged conservatively so that no reading of the rules the design leaves open
/// makes this fail:
/// - victims and terminating jobs still hold their GPUs and count against their team's quota;
/// - a non-preemptible job must fit within reserved counting all of its chain's use;
/// - the job must fit in free capacity beyond every other team's unused reserved quota (an
///   engine may keep idle reserved quota for its owner), that unused quota counted as large
///   as it can be (victims and terminating jobs gone, every level of the tree summed);
/// - every hard budget in its chain must cover its cost with margin, after what running jobs
///   may still spend and this cycle's admissions.
fn check_work_conserving(s: &Snapshot, d: &Decisions) -> Result<(), TestCaseError> {
    let used = occupancy_after(s, d);
    let pending = pending_by_id(s);
    let admitted: Vec<&JobSpec> = d.admissions.iter().map(|a| pending[&a.job]).collect();
    let ledger = Ledger::of(s, s.running.iter().map(|r| &r.spec).chain(admitted.iter().copied()));
    let victims: BTreeSet<JobId> = d.preemptions.iter().map(|p| p.victim).collect();
    let staying = Ledger::of(
        s,
        s.running
            .iter()
            .filter(|r| !r.terminating && !victims.contains(&r.spec.id))
            .map(|r| &r.spec)
            .chain(admitted.iter().copied()),
    );
    let mut committed: BTreeMap<TeamId, i128> = BTreeMap::new();
    for r in s.running.iter().filter(|r| !r.terminating) {
        let mut rest = r.spec.clone();
        rest.max_runtime_ms = (r.started_ms + r.spec.max_runtime_ms - s.now_ms).max(0);
        for t in chain(s, r.spec.team) {
            *committed.entry(t).or_default() += max_cost_micros(s, &rest);
        }
    }
    for a in &d.admissions {
        for t in chain(s, pending[&a.job].team) {
            *committed.entry(t).or_default() += i128::from(a.max_cost_micros);
        }
    }
    for p in &d.pending {
        let job = pending[&p.job];
        let teams = chain(s, job.team);
        let total = job.total_milli();
        let within_burst = teams.iter().all(|&t| {
            let q = quota(s, t, job.class);
            ledger.total(t, job.class) + total <= q.reserved + q.burst
        });
        let within_reserved =
            teams.iter().all(|&t| ledger.total(t, job.class) + total <= quota(s, t, job.class).reserved);
        if !within_burst || (!preemptible(s, job) && !within_reserved) {
            continue;
        }
        let free: u64 = s
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.class == job.class)
            .flat_map(|(i, n)| (0..usize::from(n.units)).map(move |u| (i, u)))
            .map(|(i, u)| u64::from(used.free(i, u)))
            .sum();
        let others_unused: u64 = (0..s.teams.len() as TeamId)
            .filter(|t| !teams.contains(t))
            .map(|t| quota(s, t, job.class).reserved.saturating_sub(staying.total(t, job.class)))
            .sum();
        if free < others_unused + total {
            continue;
        }
        let cost = max_cost_micros(s, job);
        let affordable = teams.iter().all(|&t| match s.teams[t as usize].hard_budget_left_micros {
            None => true,
            Some(left) => i128::from(left) - committed.get(&t).copied().unwrap_or(0) >= cost + cost / 100 + 1_000,
        });
        if !affordable {
            continue;
        }
        let Some(placement) = plan(s, &used, job) else { continue };
        // A job ranked earlier that preempted holds its future quota room in its team chain
        // for the rest of the cycle (so the room its victims free cannot be taken and force
        // another round); a job sharing that chain may wait behind it.
        let behind_a_preemptor = d.pending.iter().any(|w| {
            let Some(waiting) = s.pending.iter().find(|j| j.id == w.job) else { return false };
            matches!(w.reason, PendingReason::WaitingForReclaim | PendingReason::PreemptionDelayed { .. })
                && w.position < p.position
                && waiting.class == job.class
                && chain(s, waiting.team).iter().any(|t| teams.contains(t))
        });
        if behind_a_preemptor
            && matches!(p.reason, PendingReason::BurstLimit { .. } | PendingReason::ReservedQuotaExhausted { .. })
        {
            continue;
        }
        prop_assert!(
            may_hold_back_a_fitting_job(&p.reason),
            "job {} is left pending ({:?}) though it fits now without preemption, e.g. on {:?}, and its team \
             chain {:?} has room (held, quota: {:?}); decisions: {:#?}",
            job.id,
            p.reason,
            placement,
            teams,
            teams.iter().map(|&t| (t, ledger.total(t, job.class), quota(s, t, job.class))).collect::<Vec<_>>(),
            d
        );
    }
    Ok(())
}

/// Reorders `items` by a seeded Fisher-Yates shuffle (SplitMix64), reproducible from `seed`.
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed;
    for i in (1..items.len()).rev() {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        items.swap(i, (z % (i as u64 + 1)) as usize);
    }
}

// ---------------------------------------------------------------------------------------------
// Scenario for the reserved-quota guarantee.
// ---------------------------------------------------------------------------------------------

/// A snapshot where one leaf team asks for GPUs within its unused reserved quota while the
/// rest of the cluster is held by others, and the id of the asking job.
///
/// Everything running is past the minimum runtime and not terminating, there are no hard
/// budgets, and running jobs take whole units only: a share of a unit held within another
/// team's reserved quota would strand the rest of that unit, and no preemption may free it,
/// so with shares the promise could not be kept by any engine. The asking job wants whole
/// single-GPU replicas anywhere, so only capacity, not topology, decides whether it fits.
fn reserved_scenario(raw: &Raw, asker: usize, replicas: u16, priority: usize) -> Option<(Snapshot, JobId)> {
    let mut s = build(raw, Policy::Fairway, true);
    for team in &mut s.teams {
        team.hard_budget_left_micros = None;
    }
    for job in &mut s.running {
        job.terminating = false;
        job.started_ms = job.started_ms.min(s.now_ms - s.config.min_runtime_before_preemption_ms);
    }
    s.pending.clear();
    let leaves: Vec<(TeamId, ClassId)> = (0..s.teams.len() as TeamId)
        .filter(|&t| !s.teams.iter().any(|other| other.parent == Some(t)))
        .flat_map(|t| (0..s.classes.len() as ClassId).map(move |c| (t, c)))
        .filter(|&(t, c)| quota(&s, t, c).reserved >= u64::from(UNIT))
        .collect();
    if leaves.is_empty() {
        return None;
    }
    let (team, class) = leaves[asker % leaves.len()];
    // Reserved quota is guaranteed on the organisation's own nodes; cloud pools are burst
    // capacity, where a gang must fit one pool.
    if s.nodes.iter().any(|n| n.class == class && n.elastic) {
        return None;
    }
    let reserved = quota(&s, team, class).reserved;
    // Make room within the team's own reservation by dropping its jobs of the class, newest
    // first, until at least one GPU of it is unused.
    let held = |s: &Snapshot| -> u64 {
        s.running.iter().filter(|r| r.spec.team == team && r.spec.class == class).map(|r| r.spec.total_milli()).sum()
    };
    while reserved < held(&s) + u64::from(UNIT) {
        let last = s.running.iter().rposition(|r| r.spec.team == team && r.spec.class == class)?;
        s.running.remove(last);
    }
    let room = ((reserved - held(&s)) / u64::from(UNIT)) as u16;
    // The promise is kept from any state the engine itself produces, in which borrowers never
    // sit on capacity held back for another team's idle, unlendable reserved quota. (After an
    // admin lowers a team's `lendable` below what others borrow, reclaim may take a second
    // round; the module docs say so.)
    let usage = |t: TeamId| -> u64 {
        s.running
            .iter()
            .filter(|r| r.spec.class == class && chain(&s, r.spec.team).contains(&t))
            .map(|r| r.spec.total_milli())
            .sum()
    };
    let held_back: u64 = (0..s.teams.len() as TeamId)
        .filter(|&t| !chain(&s, team).contains(&t))
        .map(|t| {
            let q = quota(&s, t, class);
            q.reserved.saturating_sub(usage(t)).saturating_sub(q.lendable)
        })
        .sum();
    let capacity: u64 = s.nodes.iter().filter(|n| n.class == class).map(|n| u64::from(n.units) * u64::from(UNIT)).sum();
    let used: u64 = s.running.iter().filter(|r| r.spec.class == class).map(|r| r.spec.total_milli()).sum();
    if capacity.saturating_sub(used) < held_back {
        return None;
    }
    // A gang lies within one cluster, and what other teams hold within their own reserved
    // quota may leave no single cluster room for it: reserved quota is per class, across its
    // clusters. Where the class spans clusters, the asking job is one replica.
    let clusters: BTreeSet<u32> = s.nodes.iter().filter(|n| n.class == class).map(|n| n.cluster).collect();
    let replicas = if clusters.len() > 1 { 1 } else { replicas };
    let id = 10_000;
    s.pending.push(JobSpec {
        allow_spot: false,
        fixed_nodes_only: false,
        kind: None,
        expected_runtime_ms: None,
        grace_ms: None,
        id,
        team,
        class,
        replicas: replicas.clamp(1, room),
        milli_per_replica: UNIT,
        priority: (priority % s.priorities.len()) as u8,
        topology: Topology::Any,
        submitted_ms: s.now_ms,
        // It has waited out its preemption delay: the promise is one round from then on.
        queued_ms: s.now_ms - s.priorities[priority % s.priorities.len()].preemption_delay_ms,
        preemption_delay_ms: None,
        attained_ms: 0,
        max_runtime_ms: 3_600_000,
        min_drivers: Default::default(),
        host: Default::default(),
        elastic: None,
    });
    Some((s, id))
}

// ---------------------------------------------------------------------------------------------
// The properties.
// ---------------------------------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn admissions_never_put_more_on_a_gpu_than_it_has(s in snapshots(&ALL_POLICIES)) {
        let d = schedule(&s);
        check_capacity(&s, &d)?;
    }

    #[test]
    fn admissions_never_take_more_cpu_or_memory_than_a_node_gives(
        s in (snapshots(&ALL_POLICIES), 2u32..=12).prop_map(|(s, cores)| with_scarce_cpus(s, cores))
    ) {
        let d = schedule(&s);
        check_capacity(&s, &d)?;
        check_host(&s, &d)?;
    }

    #[test]
    fn no_team_or_ancestor_ends_a_cycle_above_reserved_plus_burst(s in snapshots(&QUOTA_POLICIES)) {
        let d = schedule(&s);
        check_quotas(&s, &d)?;
    }

    #[test]
    fn a_gang_is_admitted_whole_or_not_at_all_and_every_pending_job_is_decided_once(
        s in snapshots(&ALL_POLICIES)
    ) {
        let d = schedule(&s);
        check_decided_once(&s, &d)?;
    }

    #[test]
    fn non_preemptible_jobs_are_admitted_only_within_reserved_quota(s in snapshots(&QUOTA_POLICIES)) {
        let d = schedule(&s);
        check_firm_within_reserved(&s, &d)?;
    }

    #[test]
    fn what_a_team_is_not_billed_for_as_burst_stays_within_its_reserved_quota(s in snapshots(&QUOTA_POLICIES)) {
        let d = schedule(&s);
        check_unborrowed_within_reserved(&s, &d)?;
    }

    #[test]
    fn only_preemptible_running_jobs_past_their_minimum_runtime_are_preempted(s in snapshots(&ALL_POLICIES)) {
        let d = schedule(&s);
        check_preemptions(&s, &d)?;
    }

    #[test]
    fn admissions_stay_within_hard_budgets_and_state_their_maximum_cost(s in snapshots(&QUOTA_POLICIES)) {
        let d = schedule(&s);
        check_budgets(&s, &d)?;
    }

    #[test]
    fn a_team_asking_within_its_reserved_quota_is_admitted_after_one_preemption_round_or_two_if_a_gang_straddles(
        (s, job) in (raw(), any::<usize>(), 1u16..=4, any::<usize>()).prop_filter_map(
            "a leaf team with reserved quota",
            |(raw, asker, replicas, priority)| reserved_scenario(&raw, asker, replicas, priority),
        )
    ) {
        let first = schedule(&s);
        check_capacity(&s, &first)?;
        if !first.admissions.iter().any(|a| a.job == job) {
            let second_snapshot = apply(&s, &first);
            let second = schedule(&second_snapshot);
            check_capacity(&second_snapshot, &second)?;
            if !second.admissions.iter().any(|a| a.job == job) {
                // The one documented exception: to free enough, reclaim had to take a
                // borrowing team's gang across its reserved line (a gang cannot be split), and
                // that team's requeued job, now within its reserved quota, went first. Then a
                // second round must do it.
                let class = s.pending.iter().find(|j| j.id == job).map_or(0, |j| j.class);
                let usage = |snap: &Snapshot, t: TeamId| -> u64 {
                    snap.running
                        .iter()
                        .filter(|r| r.spec.class == class && chain(snap, r.spec.team).contains(&t))
                        .map(|r| r.spec.total_milli())
                        .sum()
                };
                let straddled = (0..s.teams.len() as TeamId).any(|t| {
                    let reserved = quota(&s, t, class).reserved;
                    usage(&s, t) > reserved && usage(&second_snapshot, t) < reserved
                });
                prop_assert!(
                    straddled,
                    "job {} within its team's reserved quota is still pending after one preemption round \
                     (no team was taken below its reserved quota); first cycle: {:#?}; second cycle: {:#?}",
                    job,
                    first,
                    second
                );
                let third_snapshot = apply(&second_snapshot, &second);
                let third = schedule(&third_snapshot);
                prop_assert!(
                    third.admissions.iter().any(|a| a.job == job),
                    "job {} within its team's reserved quota is still pending after two preemption rounds; \
                     first: {:#?}; second: {:#?}; third: {:#?}",
                    job,
                    first,
                    second,
                    third
                );
            }
        }
    }

    #[test]
    fn expected_starts_are_intervals_from_now_on_or_say_why_no_forecast_can_give_one(
        s in snapshots(&ALL_POLICIES),
    ) {
        let mut s = s;
        s.config.estimate_start_times = true;
        // Some history, so that estimates come from it and from its fallbacks alike.
        let mut history = RuntimeHistory::default();
        for (i, r) in s.running.iter().enumerate() {
            for k in 1..=6 {
                history.record(r.spec.team, None, r.spec.max_runtime_ms * k / 7 + i as i64);
            }
        }
        s.history = std::sync::Arc::new(history);
        let d = schedule(&s);
        check_expected_starts(&s, &d)?;
    }

    #[test]
    fn the_same_snapshot_always_gives_the_same_decisions(s in snapshots(&ALL_POLICIES)) {
        let first = schedule(&s);
        let second = schedule(&s.clone());
        prop_assert_eq!(first, second);
    }

    /// The cycle's walks over a team's own victims and over the GPUs held for waiting jobs are
    /// indexed (per team, per class); the exhaustive walks they replaced must decide the same.
    #[test]
    fn the_indexed_cycle_decides_exactly_as_the_exhaustive_one(s in snapshots(&ALL_POLICIES)) {
        prop_assert_eq!(schedule(&s), fairway::scheduler::engine::run_exhaustive(&s));
    }

    /// The engine documents every ordering as total (priority, age, then job id), so the order
    /// in which the control loop lists jobs must not matter either.
    #[test]
    fn the_order_of_running_and_pending_jobs_in_the_snapshot_does_not_change_the_decisions(
        s in snapshots(&ALL_POLICIES),
        seed in any::<u64>(),
    ) {
        let mut shuffled = s.clone();
        shuffle(&mut shuffled.pending, seed);
        shuffle(&mut shuffled.running, seed.rotate_left(17));
        prop_assert_eq!(schedule(&s), schedule(&shuffled));
    }

    #[test]
    fn without_new_arrivals_repeated_cycles_stop_preempting(
        s in snapshots(&ALL_POLICIES),
        advance in any::<bool>(),
    ) {
        // Either the clock stands still, or it moves past the minimum runtime every cycle so
        // that everything admitted becomes a candidate victim at once.
        let step = if advance { s.config.min_runtime_before_preemption_ms + 1 } else { 0 };
        let mut state = s;
        let mut history = Vec::new();
        let mut settled = false;
        for _ in 0..MAX_CYCLES {
            let d = schedule(&state);
            check_capacity(&state, &d)?;
            check_preemptions(&state, &d)?;
            if d.preemptions.is_empty() && d.shrinks.is_empty() {
                settled = true;
                break;
            }
            history.push(d.preemptions.iter().map(|p| (p.victim, p.for_job, p.reason)).collect::<Vec<_>>());
            state = apply(&state, &d);
            state.now_ms += step;
        }
        prop_assert!(
            settled,
            "still preempting after {} cycles; (victim, for job, reason) per cycle: {:?}",
            MAX_CYCLES,
            history
        );
    }

    #[test]
    fn a_job_that_fits_without_preemption_and_is_allowed_is_admitted(s in snapshots(&[Policy::Fairway])) {
        let d = schedule(&s);
        check_work_conserving(&s, &d)?;
    }
}
