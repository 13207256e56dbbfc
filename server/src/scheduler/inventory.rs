//! Free GPU state and gang placement.
//!
//! Every node holds units of one GPU class; each unit has 1000 milli free when idle. A
//! replica takes whole units on one node, or a share (< 1000) of one unit. Placement is
//! best-fit at every level: the node with the fewest free whole units that still holds the
//! replica, the NVLink domain with the fewest free units within it, the partially used unit
//! with the least room for a share. Packing this way keeps large free blocks (whole nodes,
//! whole domains) for the gangs that need them.
//!
//! Per class, nodes are bucketed by their free whole units, so finding the best-fit node is
//! a walk over at most 65 buckets, not over every node.
//!
//! A gang is placed in one tier of capacity, tried in order: the organisation's own nodes
//! (already paid for), then elastic cloud pools, spot ones first for jobs that allow spot
//! (cheaper, and interruptions requeue them), then on-demand ones. A cloud gang lies within
//! one pool: it is one job of one queue at one price. Jobs that do not allow spot never land
//! on spot pools. Reserved quota is guaranteed on the organisation's own nodes; cloud pools
//! are burst capacity.
//!
//! A node that reports its CPU and memory ([`Host`]) takes a replica only where the replica's
//! CPU and memory fit beside its GPUs. With [`Placement::Fragmentation`] a replica goes to the
//! node (and, for a share, the unit) where the expected fragmentation of the arriving shapes
//! grows least ([`super::fragmentation`]), instead of best-fit; best-fit breaks its ties.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::fragmentation::ShapeMix;
use super::snapshot::{ClassId, DriverStack, Host, JobSpec, Level, Node, NodeId, ReplicaPlacement, Topology, UNIT};

const UNIT_U16: u16 = UNIT as u16;

/// A tier of capacity a gang is placed within (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    OnPrem,
    Spot,
    OnDemand,
}

impl Tier {
    fn admits(self, node: &NodeState) -> bool {
        match self {
            Tier::OnPrem => !node.elastic,
            Tier::Spot => node.elastic && node.spot,
            Tier::OnDemand => node.elastic && !node.spot,
        }
    }
}

#[derive(Debug, Clone)]
struct NodeState {
    class: ClassId,
    elastic: bool,
    spot: bool,
    drivers: DriverStack,
    /// Free CPU and memory; `None`: not limited.
    host_free: Option<Host>,
    /// Free milli per unit.
    free: Vec<u16>,
    free_whole: u8,
    domain_size: u8,
    rack: u64,
    zone: u64,
    cluster: u32,
}

impl NodeState {
    fn domain_of(&self, unit: usize) -> usize {
        if self.domain_size == 0 {
            0
        } else {
            unit / usize::from(self.domain_size)
        }
    }
}

#[derive(Debug, Clone, Default)]
struct ClassIndex {
    /// Nodes by their count of free whole units.
    buckets: Vec<BTreeSet<NodeId>>,
    /// Partially used units: (free milli, node, unit).
    partial: BTreeSet<(u16, NodeId, u8)>,
    /// Free milli over all units of the class.
    free_milli: u64,
    /// Capacity in milli.
    capacity_milli: u64,
    /// Most units on one node.
    max_node_units: u8,
    /// Whether any node of the class is an elastic pool (else one tier holds everything).
    has_elastic: bool,
    /// Free whole units per rack, per zone and per cluster.
    rack_free: BTreeMap<u64, u32>,
    zone_free: BTreeMap<u64, u32>,
    cluster_free: BTreeMap<u32, u32>,
    /// Capacity in milli per cluster: a gang lies within one.
    cluster_capacity: BTreeMap<u32, u64>,
    /// The kinds of node of the class: units and CPU and memory (`None`: not limited), for
    /// whether a replica could ever fit one.
    node_kinds: BTreeSet<(u8, Option<Host>)>,
    /// Whether any node of the class reports its CPU and memory.
    has_host_limits: bool,
    /// The shapes that arrive, under [`Placement::Fragmentation`].
    mix: Option<ShapeMix>,
}

/// The free GPUs of every node, with the indexes placement needs.
#[derive(Debug, Clone)]
pub struct Inventory {
    nodes: Vec<NodeState>,
    classes: Vec<ClassIndex>,
    /// Expected fragmentation by a node's class, free CPU and memory, NVLink domain size and
    /// free units in a canonical order (see [`Inventory::node_fragmentation`]): nodes alike
    /// (idle ones above all) are measured once.
    fragmentation_memo: HashMap<(ClassId, Option<Host>, u8, Vec<u16>), f64>,
}

impl Inventory {
    /// An idle inventory of `nodes` for `class_count` classes.
    pub fn new(nodes: &[Node], class_count: usize) -> Self {
        let mut classes = vec![ClassIndex::default(); class_count];
        for c in &mut classes {
            c.buckets = vec![BTreeSet::new(); 65];
        }
        let mut states = Vec::with_capacity(nodes.len());
        for (i, n) in nodes.iter().enumerate() {
            let units = n.units.min(64);
            // Nodes without a rack or zone are their own; keys above u32 keep them apart.
            let rack = n.rack.map_or(u64::from(u32::MAX) + 1 + i as u64, u64::from);
            let zone = n.zone.map_or(u64::from(u32::MAX) + 1 + i as u64, u64::from);
            let state = NodeState {
                class: n.class,
                elastic: n.elastic,
                spot: n.spot,
                drivers: n.drivers,
                host_free: if n.elastic { None } else { n.host },
                free: vec![UNIT_U16; usize::from(units)],
                free_whole: units,
                domain_size: if n.elastic { 0 } else { n.nvlink_domain_size },
                rack,
                zone,
                cluster: n.cluster,
            };
            if let Some(c) = classes.get_mut(usize::from(n.class)) {
                c.buckets[usize::from(units)].insert(i as NodeId);
                c.free_milli += u64::from(units) * u64::from(UNIT);
                c.capacity_milli += u64::from(units) * u64::from(UNIT);
                c.max_node_units = c.max_node_units.max(units);
                c.has_elastic |= n.elastic;
                *c.rack_free.entry(rack).or_default() += u32::from(units);
                *c.zone_free.entry(zone).or_default() += u32::from(units);
                *c.cluster_free.entry(n.cluster).or_default() += u32::from(units);
                *c.cluster_capacity.entry(n.cluster).or_default() += u64::from(units) * u64::from(UNIT);
                c.node_kinds.insert((units, state.host_free));
                c.has_host_limits |= state.host_free.is_some();
            }
            states.push(state);
        }
        Self { nodes: states, classes, fragmentation_memo: HashMap::new() }
    }

    /// Places by expected fragmentation of the shapes in each class's mix (indexed by class;
    /// a class whose mix is empty stays best-fit): [`Placement::Fragmentation`].
    pub fn place_by_fragmentation(&mut self, mixes: Vec<ShapeMix>) {
        for (class, mix) in self.classes.iter_mut().zip(mixes) {
            class.mix = Some(mix).filter(|m| !m.is_empty());
        }
        self.fragmentation_memo.clear();
    }

    /// Free milli-units of a class.
    pub fn free_milli(&self, class: ClassId) -> u64 {
        self.classes.get(usize::from(class)).map_or(0, |c| c.free_milli)
    }

    /// Capacity of a class in milli-units.
    pub fn capacity_milli(&self, class: ClassId) -> u64 {
        self.classes.get(usize::from(class)).map_or(0, |c| c.capacity_milli)
    }

    /// True when an idle cluster could hold the job at all: its replicas on nodes of the
    /// class, all in one cluster (ignoring topology domains other than the node a replica
    /// must fit on and the cluster a gang lies in).
    pub fn could_ever_fit(&self, job: &JobSpec) -> bool {
        let Some(c) = self.classes.get(usize::from(job.class)) else { return false };
        let per_replica_units = job.milli_per_replica.div_ceil(UNIT);
        job.milli_per_replica > 0
            && job.replicas > 0
            && per_replica_units <= u32::from(c.max_node_units)
            && job.total_milli() <= c.cluster_capacity.values().copied().max().unwrap_or(0)
            && (job.host.is_empty()
                || c.node_kinds.iter().any(|&(units, host)| {
                    u32::from(units) >= per_replica_units && host.is_none_or(|h| h.holds(&job.host))
                }))
    }

    /// Whether some nodes of the job's class run the driver stack it requires, enough of them
    /// to hold it when idle (always, for a job that requires none). When not, no amount of
    /// waiting for other jobs helps: only a driver upgrade does.
    pub fn drivers_could_ever_fit(&self, job: &JobSpec) -> bool {
        if !job.min_drivers.requires_any() {
            return true;
        }
        let per_replica_units = job.milli_per_replica.div_ceil(UNIT);
        let (mut capacity, mut largest) = (0u64, 0u32);
        for n in self.nodes.iter().filter(|n| n.class == job.class && n.drivers.meets(&job.min_drivers)) {
            capacity += n.free.len() as u64 * u64::from(UNIT);
            largest = largest.max(n.free.len() as u32);
        }
        per_replica_units <= largest && job.total_milli() <= capacity
    }

    /// The newest driver and the newest CUDA version any node of `class` runs, and the free
    /// milli-units on nodes of the class that meet `min`: the figures behind a driver reason.
    pub fn driver_figures(&self, class: ClassId, min: &DriverStack) -> (DriverStack, u64) {
        let mut newest = DriverStack::default();
        let mut free = 0u64;
        for n in self.nodes.iter().filter(|n| n.class == class) {
            newest.driver = newest.driver.max(n.drivers.driver);
            newest.cuda = newest.cuda.max(n.drivers.cuda);
            if n.drivers.meets(min) {
                free += n.free.iter().map(|&f| u64::from(f)).sum::<u64>();
            }
        }
        (newest, free)
    }

    /// A node's free milli over its units, and its free CPU and memory (`None`: not limited).
    pub fn node_free(&self, node: NodeId) -> (u32, Option<Host>) {
        self.nodes.get(node as usize).map_or((0, None), |n| (n.free.iter().map(|&f| u32::from(f)).sum(), n.host_free))
    }

    /// Free milli of one unit.
    pub fn unit_free(&self, node: NodeId, unit: u8) -> u32 {
        self.nodes.get(node as usize).and_then(|n| n.free.get(usize::from(unit))).map_or(0, |&f| u32::from(f))
    }

    /// Takes, of each unit in `placement`, what is free of it now, up to what the placement
    /// asks; returns exactly what was taken, so that releasing it restores the inventory.
    ///
    /// Each replica is taken before the next is looked at: replicas sharing a unit (shares
    /// of one GPU) or a node's CPU and memory must not each count what the other takes, or
    /// more would be held than was free and releasing it would give back more than there is.
    pub fn hold(&mut self, placement: &[ReplicaPlacement]) -> Vec<ReplicaPlacement> {
        let mut held = Vec::new();
        for replica in placement {
            let units: Vec<(u8, u32)> = replica
                .units
                .iter()
                .map(|&(unit, milli)| (unit, milli.min(self.unit_free(replica.node, unit))))
                .filter(|&(_, milli)| milli > 0)
                .collect();
            if !units.is_empty() {
                let host = match self.nodes.get(replica.node as usize).and_then(|n| n.host_free) {
                    Some(free) => Host {
                        cpu_millis: replica.host.cpu_millis.min(free.cpu_millis),
                        memory_mib: replica.host.memory_mib.min(free.memory_mib),
                    },
                    None => replica.host,
                };
                let taken = ReplicaPlacement { node: replica.node, units, host };
                self.allocate(std::slice::from_ref(&taken));
                held.push(taken);
            }
        }
        held
    }

    /// Takes the GPUs of a placement (of a running job, or one just decided).
    pub fn allocate(&mut self, placement: &[ReplicaPlacement]) {
        for replica in placement {
            for &(unit, milli) in &replica.units {
                self.change(replica.node, unit, -(milli as i32));
            }
            self.change_host(replica.node, &replica.host, false);
        }
    }

    /// Gives back the GPUs of a placement.
    pub fn release(&mut self, placement: &[ReplicaPlacement]) {
        for replica in placement {
            for &(unit, milli) in &replica.units {
                self.change(replica.node, unit, milli as i32);
            }
            self.change_host(replica.node, &replica.host, true);
        }
    }

    /// Takes (or gives back) a replica's CPU and memory on a node that counts them. Taking
    /// more than is free leaves none: a placement that does not match the inventory must not
    /// wrap around.
    fn change_host(&mut self, node: NodeId, host: &Host, give_back: bool) {
        let Some(free) = self.nodes.get_mut(node as usize).and_then(|n| n.host_free.as_mut()) else { return };
        if give_back {
            free.cpu_millis = free.cpu_millis.saturating_add(host.cpu_millis);
            free.memory_mib = free.memory_mib.saturating_add(host.memory_mib);
        } else {
            free.cpu_millis = free.cpu_millis.saturating_sub(host.cpu_millis);
            free.memory_mib = free.memory_mib.saturating_sub(host.memory_mib);
        }
    }

    /// Whether the node's free CPU and memory hold a replica of `job`.
    fn host_fits(&self, node: NodeId, job: &JobSpec) -> bool {
        self.nodes[node as usize].host_free.is_none_or(|free| free.holds(&job.host))
    }

    /// Adds `delta` milli to a unit's free amount, keeping every index current. Amounts
    /// outside the unit's range are clamped: a placement that does not match the inventory
    /// (a node that shrank) must not corrupt it.
    fn change(&mut self, node: NodeId, unit: u8, delta: i32) {
        let Some(state) = self.nodes.get_mut(node as usize) else { return };
        let Some(slot) = state.free.get(usize::from(unit)).copied() else { return };
        let new = (i32::from(slot) + delta).clamp(0, i32::from(UNIT_U16)) as u16;
        if new == slot {
            return;
        }
        let class = &mut self.classes[usize::from(state.class)];
        let was_whole = slot == UNIT_U16;
        let is_whole = new == UNIT_U16;
        if slot > 0 && !was_whole {
            class.partial.remove(&(slot, node, unit));
        }
        if new > 0 && !is_whole {
            class.partial.insert((new, node, unit));
        }
        if was_whole != is_whole {
            class.buckets[usize::from(state.free_whole)].remove(&node);
            let (rack, zone, cluster) = (state.rack, state.zone, state.cluster);
            if is_whole {
                state.free_whole += 1;
                *class.rack_free.entry(rack).or_default() += 1;
                *class.zone_free.entry(zone).or_default() += 1;
                *class.cluster_free.entry(cluster).or_default() += 1;
            } else {
                state.free_whole -= 1;
                if let Some(r) = class.rack_free.get_mut(&rack) {
                    *r -= 1;
                }
                if let Some(z) = class.zone_free.get_mut(&zone) {
                    *z -= 1;
                }
                if let Some(c) = class.cluster_free.get_mut(&cluster) {
                    *c -= 1;
                }
            }
            class.buckets[usize::from(state.free_whole)].insert(node);
        }
        class.free_milli = (class.free_milli as i64 + i64::from(new) - i64::from(slot)) as u64;
        state.free[usize::from(unit)] = new;
    }

    /// Whether [`Self::find`] would place the whole gang, answered by counting where that
    /// is exact, so that a check repeated for every candidate victim does not place a large
    /// gang replica by replica each time.
    ///
    /// Counting is exact for whole-GPU replicas anywhere (or preferring a domain, which falls
    /// back to anywhere) in a class without cloud pools: best-fit puts each replica on some
    /// node with at least `w` free whole units (`w` per replica), taking `w` of them, so each
    /// placement lowers `Σ floor(free whole units / w)` over the class's nodes by exactly one,
    /// and the gang is placed iff that sum covers its replicas. Everything else (shares,
    /// required topology, cloud pools and their tiers) asks `find`.
    pub fn can_place(&mut self, job: &JobSpec) -> bool {
        match self.whole_replica_slots(job) {
            Some(slots) => slots >= u64::from(job.replicas),
            None => self.find(job).is_some(),
        }
    }

    /// How many replicas of `job` the class's nodes hold now, when counting answers
    /// [`Self::can_place`] exactly (see there); `None` otherwise.
    fn whole_replica_slots(&self, job: &JobSpec) -> Option<u64> {
        let class = self.classes.get(usize::from(job.class))?;
        let counted = !class.has_elastic
            && (job.host.is_empty() || !class.has_host_limits)
            && !job.min_drivers.requires_any()
            && job.milli_per_replica >= UNIT
            && job.milli_per_replica.is_multiple_of(UNIT)
            && !matches!(job.topology, Topology::Required(_))
            && (job.replicas == 1 || class.cluster_free.len() <= 1);
        if !counted {
            return None;
        }
        let w = (job.milli_per_replica / UNIT) as usize;
        // Buckets above the largest node are always empty: not walked.
        let buckets = class.buckets.iter().enumerate().take(usize::from(class.max_node_units) + 1).skip(w);
        Some(buckets.map(|(free, nodes)| (free / w) as u64 * nodes.len() as u64).sum())
    }

    /// Finds a placement for the whole gang without taking it, or `None`.
    pub fn find(&mut self, job: &JobSpec) -> Option<Vec<ReplicaPlacement>> {
        if self.free_milli(job.class) < job.total_milli() {
            return None;
        }
        let has_elastic = self.classes.get(usize::from(job.class)).is_some_and(|c| c.has_elastic);
        let own = if has_elastic { Some(Tier::OnPrem) } else { None };
        let found = match job.topology {
            Topology::Any => self.find_in_one_cluster(job, own),
            Topology::Required(level) => self.find_within(job, level, own),
            Topology::Preferred(level) => {
                self.find_within(job, level, own).or_else(|| self.find_in_one_cluster(job, own))
            }
        };
        if found.is_some() || !has_elastic || job.fixed_nodes_only {
            return found;
        }
        // A cloud gang is one job of one pool (one queue, one price): never split across pools.
        let pools: &[Tier] = if job.allow_spot { &[Tier::Spot, Tier::OnDemand] } else { &[Tier::OnDemand] };
        pools.iter().find_map(|&tier| self.find_in_one_pool(job, tier))
    }

    /// The gang anywhere within one cluster: the fullest cluster of the class that holds it
    /// (best-fit, as everywhere else), or anywhere when the class lies in one cluster or the
    /// job has one replica. Racks and zones lie within a cluster, so a gang kept within one
    /// of them needs nothing more.
    fn find_in_one_cluster(&mut self, job: &JobSpec, tier: Option<Tier>) -> Option<Vec<ReplicaPlacement>> {
        let class = self.classes.get(usize::from(job.class))?;
        if job.replicas <= 1 || class.cluster_free.len() <= 1 {
            return self.place_replicas(job, None, tier);
        }
        // Shares may all fit on partly used units: no whole unit is required of a cluster.
        let whole_needed = if job.milli_per_replica >= UNIT { (job.total_milli() / u64::from(UNIT)) as u32 } else { 0 };
        let mut clusters: Vec<(u32, u32)> =
            class.cluster_free.iter().filter(|(_, &free)| free >= whole_needed).map(|(&c, &free)| (free, c)).collect();
        clusters.sort_unstable();
        clusters.into_iter().find_map(|(_, cluster)| self.place_replicas(job, Some(Within::Cluster(cluster)), tier))
    }

    /// Whether the gang would be placed now but for keeping it within one cluster: then the
    /// split of the class over clusters, not a lack of GPUs, keeps it waiting.
    pub fn fits_only_across_clusters(&mut self, job: &JobSpec) -> bool {
        let spans = self.classes.get(usize::from(job.class)).is_some_and(|c| c.cluster_free.len() > 1);
        if !spans || job.replicas <= 1 || matches!(job.topology, Topology::Required(_)) {
            return false;
        }
        let own = self.classes[usize::from(job.class)].has_elastic.then_some(Tier::OnPrem);
        self.place_replicas(job, None, own).is_some()
    }

    /// Where one more replica of a running gang goes: a node of the cluster that runs
    /// `beside` (a node the gang holds), never a cloud pool; `None` when none holds it.
    pub fn find_beside(&mut self, job: &JobSpec, beside: NodeId) -> Option<Vec<ReplicaPlacement>> {
        let cluster = self.nodes.get(beside as usize)?.cluster;
        if self.free_milli(job.class) < job.total_milli() {
            return None;
        }
        self.place_replicas(job, Some(Within::Cluster(cluster)), Some(Tier::OnPrem))
    }

    /// The whole gang in the fullest pool of `tier` that holds it.
    fn find_in_one_pool(&mut self, job: &JobSpec, tier: Tier) -> Option<Vec<ReplicaPlacement>> {
        let class = self.classes.get(usize::from(job.class))?;
        // Shares may all fit on partly used units: no whole unit is required of a pool.
        let whole_needed =
            if job.milli_per_replica >= UNIT { (job.total_milli() / u64::from(UNIT)).min(64) as usize } else { 0 };
        let candidates: Vec<NodeId> = class
            .buckets
            .iter()
            .skip(whole_needed)
            .flat_map(|b| b.iter().copied())
            .filter(|&n| tier.admits(&self.nodes[n as usize]) && self.nodes[n as usize].drivers.meets(&job.min_drivers))
            .collect();
        candidates.into_iter().find_map(|node| self.place_on_node(job, node, false))
    }

    /// Places replicas one by one, best-fit, optionally within one rack or zone and one tier,
    /// taking each tentatively so the next sees it; everything is given back before returning.
    fn place_replicas(
        &mut self,
        job: &JobSpec,
        within: Option<Within>,
        tier: Option<Tier>,
    ) -> Option<Vec<ReplicaPlacement>> {
        let mut placed: Vec<ReplicaPlacement> = Vec::with_capacity(usize::from(job.replicas));
        for _ in 0..job.replicas {
            match self.best_replica(job, within, tier) {
                Some(r) => {
                    self.allocate(std::slice::from_ref(&r));
                    placed.push(r);
                }
                None => {
                    self.release(&placed);
                    return None;
                }
            }
        }
        self.release(&placed);
        Some(placed)
    }

    /// Places the gang inside one domain of `level`, choosing the fullest domain that holds it.
    fn find_within(&mut self, job: &JobSpec, level: Level, tier: Option<Tier>) -> Option<Vec<ReplicaPlacement>> {
        // Shares may all fit on partly used units: no whole unit is required of a domain.
        let whole_needed = if job.milli_per_replica >= UNIT { (job.total_milli() / u64::from(UNIT)) as u32 } else { 0 };
        match level {
            Level::Node | Level::NvlinkDomain => {
                let class = self.classes.get(usize::from(job.class))?;
                let candidates: Vec<NodeId> = class
                    .buckets
                    .iter()
                    .skip(whole_needed.min(64) as usize)
                    .flat_map(|b| b.iter().copied())
                    .filter(|&n| {
                        let node = &self.nodes[n as usize];
                        tier.is_none_or(|t| t.admits(node)) && node.drivers.meets(&job.min_drivers)
                    })
                    .collect();
                for node in candidates {
                    if let Some(p) = self.place_on_node(job, node, level == Level::NvlinkDomain) {
                        return Some(p);
                    }
                }
                None
            }
            Level::Rack | Level::Zone => {
                let class = self.classes.get(usize::from(job.class))?;
                let map = if level == Level::Rack { &class.rack_free } else { &class.zone_free };
                let mut domains: Vec<(u32, u64)> =
                    map.iter().filter(|(_, &free)| free >= whole_needed).map(|(&k, &free)| (free, k)).collect();
                domains.sort_unstable();
                for (_, key) in domains {
                    let within = if level == Level::Rack { Within::Rack(key) } else { Within::Zone(key) };
                    if let Some(p) = self.place_replicas(job, Some(within), tier) {
                        return Some(p);
                    }
                }
                None
            }
        }
    }

    /// All replicas on one node (and, if asked, one NVLink domain of it).
    fn place_on_node(&mut self, job: &JobSpec, node: NodeId, one_domain: bool) -> Option<Vec<ReplicaPlacement>> {
        let state = &self.nodes[node as usize];
        if state.class != job.class || !state.drivers.meets(&job.min_drivers) {
            return None;
        }
        let domains: Vec<Option<usize>> = if one_domain && state.domain_size > 0 {
            let count = state.free.len().div_ceil(usize::from(state.domain_size));
            // Fullest domain first: best-fit inside the node.
            let mut d: Vec<(usize, usize)> = (0..count)
                .map(|d| {
                    let free =
                        (0..state.free.len()).filter(|&u| state.domain_of(u) == d && state.free[u] == UNIT_U16).count();
                    (free, d)
                })
                .collect();
            d.sort_unstable();
            d.into_iter().map(|(_, d)| Some(d)).collect()
        } else {
            vec![None]
        };
        for domain in domains {
            let mut placed = Vec::with_capacity(usize::from(job.replicas));
            let mut ok = true;
            for _ in 0..job.replicas {
                match self.replica_on_node(node, job, domain) {
                    Some(r) => {
                        self.allocate(std::slice::from_ref(&r));
                        placed.push(r);
                    }
                    None => {
                        ok = false;
                        break;
                    }
                }
            }
            self.release(&placed);
            if ok {
                return Some(placed);
            }
        }
        None
    }

    /// The best place for one replica of the job, optionally within a rack or zone, on a node
    /// that runs the driver stack it requires.
    fn best_replica(&mut self, job: &JobSpec, within: Option<Within>, tier: Option<Tier>) -> Option<ReplicaPlacement> {
        let milli = job.milli_per_replica;
        let index = self.classes.get(usize::from(job.class))?;
        let allowed = |node: NodeId| {
            let state = &self.nodes[node as usize];
            within.is_none_or(|f| f.contains(state))
                && tier.is_none_or(|t| t.admits(state))
                && state.drivers.meets(&job.min_drivers)
                && state.host_free.is_none_or(|free| free.holds(&job.host))
        };
        if index.mix.is_some() {
            let candidates: Vec<NodeId> = if milli < UNIT {
                // Every node with a unit that holds the share: partly used ones and those with
                // an idle unit.
                let partial = index.partial.range((milli as u16, 0, 0)..).map(|&(_, node, _)| node);
                let idle = index.buckets.iter().skip(1).flat_map(|b| b.iter().copied());
                partial.chain(idle).filter(|&n| allowed(n)).collect::<BTreeSet<_>>().into_iter().collect()
            } else {
                let whole = (milli / UNIT) as usize;
                index.buckets.iter().skip(whole).flat_map(|b| b.iter().copied()).filter(|&n| allowed(n)).collect()
            };
            return self.least_fragmenting(job, candidates);
        }
        if milli < UNIT {
            // A share: the partially used unit with the least room that fits, so whole
            // units stay whole for whole-GPU jobs.
            let share = milli as u16;
            if let Some(&(_, node, unit)) = index.partial.range((share, 0, 0)..).find(|&&(_, node, _)| allowed(node)) {
                return Some(ReplicaPlacement { node, units: vec![(unit, milli)], host: job.host });
            }
        }
        let whole = milli.div_ceil(UNIT) as usize;
        for bucket in index.buckets.iter().skip(whole.max(1)) {
            for &node in bucket {
                if !allowed(node) {
                    continue;
                }
                if let Some(r) = self.replica_on_node(node, job, None) {
                    return Some(r);
                }
            }
        }
        None
    }

    /// One replica of `job` on `node`: whole units packed into the fullest NVLink domain that
    /// holds them, or a share of a unit; `None` when they or its CPU and memory do not fit.
    fn replica_on_node(&self, node: NodeId, job: &JobSpec, domain: Option<usize>) -> Option<ReplicaPlacement> {
        let milli = job.milli_per_replica;
        if !self.host_fits(node, job) {
            return None;
        }
        let host = job.host;
        let state = &self.nodes[node as usize];
        let in_domain = |u: usize| domain.is_none_or(|d| state.domain_of(u) == d);
        if milli < UNIT {
            let share = milli as u16;
            // Best-fit among the node's units with room.
            let unit = (0..state.free.len())
                .filter(|&u| in_domain(u) && state.free[u] >= share)
                .min_by_key(|&u| (state.free[u], u))?;
            return Some(ReplicaPlacement { node, units: vec![(unit as u8, milli)], host });
        }
        let whole = (milli / UNIT) as usize;
        let free: Vec<usize> = (0..state.free.len()).filter(|&u| in_domain(u) && state.free[u] == UNIT_U16).collect();
        if free.len() < whole {
            return None;
        }
        let units: Vec<usize> = if state.domain_size == 0 || domain.is_some() {
            free.into_iter().take(whole).collect()
        } else {
            // Prefer one NVLink domain: the fullest one that still holds the replica.
            let mut by_domain: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
            for u in free.iter().copied() {
                by_domain.entry(state.domain_of(u)).or_default().push(u);
            }
            match by_domain.values().filter(|v| v.len() >= whole).min_by_key(|v| v.len()) {
                Some(v) => v.iter().copied().take(whole).collect(),
                None => free.into_iter().take(whole).collect(),
            }
        };
        Some(ReplicaPlacement { node, units: units.into_iter().map(|u| (u as u8, UNIT)).collect(), host })
    }

    /// Among `candidates`, the replica placement that least increases the expected
    /// fragmentation of its node (for a share, each distinct free amount of a unit that holds
    /// it is tried); ties go to the node left with the least free milli, then the lower index.
    fn least_fragmenting(&mut self, job: &JobSpec, candidates: Vec<NodeId>) -> Option<ReplicaPlacement> {
        // (growth, node's free milli after, node, the placement)
        let mut best: Option<(f64, u32, NodeId, ReplicaPlacement)> = None;
        for node in candidates {
            let state = &self.nodes[node as usize];
            let node_free: u32 = state.free.iter().map(|&f| u32::from(f)).sum();
            let mut options: Vec<ReplicaPlacement> = Vec::new();
            if job.milli_per_replica < UNIT {
                let mut seen: Vec<u16> = Vec::new();
                for (u, &f) in state.free.iter().enumerate() {
                    if u32::from(f) >= job.milli_per_replica && !seen.contains(&f) {
                        seen.push(f);
                        options.push(ReplicaPlacement {
                            node,
                            units: vec![(u as u8, job.milli_per_replica)],
                            host: job.host,
                        });
                    }
                }
            } else if let Some(r) = self.replica_on_node(node, job, None) {
                options.push(r);
            }
            if options.is_empty() {
                continue;
            }
            let before = self.node_fragmentation(node);
            for option in options {
                self.allocate(std::slice::from_ref(&option));
                let after = self.node_fragmentation(node);
                self.release(std::slice::from_ref(&option));
                let growth = after - before;
                let key = (growth, node_free - job.milli_per_replica, node);
                let better = best
                    .as_ref()
                    .is_none_or(|b| key.0 < b.0 - 1e-9 || ((key.0 - b.0).abs() <= 1e-9 && (key.1, key.2) < (b.1, b.2)));
                if better {
                    best = Some((key.0, key.1, key.2, option));
                }
            }
        }
        best.map(|b| b.3)
    }

    /// The expected fragmentation of a node under its class's mix (0 without one). Its free
    /// units are measured in a canonical order that keeps what the measure can see: sorted
    /// within each NVLink domain and the domains sorted where a shape must lie in one domain,
    /// all of them sorted otherwise.
    fn node_fragmentation(&mut self, node: NodeId) -> f64 {
        let state = &self.nodes[node as usize];
        let Some(mix) = self.classes.get(usize::from(state.class)).and_then(|c| c.mix.as_ref()) else { return 0.0 };
        let domain_size = if mix.has_domain_shapes() { state.domain_size } else { 0 };
        let units = if domain_size > 0 {
            let mut domains: Vec<Vec<u16>> = state
                .free
                .chunks(usize::from(domain_size))
                .map(|d| {
                    let mut d = d.to_vec();
                    d.sort_unstable();
                    d
                })
                .collect();
            // A last, shorter domain stays last, so the units chunk the same way again.
            domains.sort_unstable_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
            domains.concat()
        } else {
            let mut units = state.free.clone();
            units.sort_unstable();
            units
        };
        let key = (state.class, state.host_free, domain_size, units);
        if let Some(&f) = self.fragmentation_memo.get(&key) {
            return f;
        }
        let f = mix.expected(&key.3, domain_size, key.1);
        self.fragmentation_memo.insert(key, f);
        f
    }

    /// The expected fragmentation of the whole class under `mix` (FGD's measure of a node
    /// set: free milli the arriving shapes could not use, weighted by how often each
    /// arrives); over the class's free milli, it is the fragmentation ratio.
    pub fn fragmentation(&self, class: ClassId, mix: &ShapeMix) -> f64 {
        self.nodes
            .iter()
            .filter(|n| n.class == class && !n.elastic)
            .map(|n| mix.expected(&n.free, n.domain_size, n.host_free))
            .sum()
    }

    /// Free milli-units that no replica of the given shapes could use: units on nodes whose
    /// free space is too small for the smallest whole-GPU shape, plus partial units too small
    /// for the smallest share (`u8::MAX` / `u32::MAX` when no job of that kind waits). The
    /// fragmentation measure of a placement policy.
    pub fn stranded_milli(&self, class: ClassId, smallest_whole_units: u8, smallest_share_milli: u32) -> u64 {
        let mut stranded = 0u64;
        for state in self.nodes.iter().filter(|n| n.class == class) {
            for &free in &state.free {
                let usable = if free == UNIT_U16 {
                    state.free_whole >= smallest_whole_units || u32::from(free) >= smallest_share_milli
                } else {
                    u32::from(free) >= smallest_share_milli
                };
                if !usable {
                    stranded += u64::from(free);
                }
            }
        }
        stranded
    }
}

/// Restricts placement to one rack, zone or cluster.
#[derive(Debug, Clone, Copy)]
enum Within {
    Rack(u64),
    Zone(u64),
    Cluster(u32),
}

impl Within {
    fn contains(self, node: &NodeState) -> bool {
        match self {
            Within::Rack(rack) => node.rack == rack,
            Within::Zone(zone) => node.zone == zone,
            Within::Cluster(cluster) => node.cluster == cluster,
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::scheduler::snapshot::Topology;

    fn node(name: &str, units: u8, rack: u32) -> Node {
        Node {
            name: name.into(),
            class: 0,
            units,
            nvlink_domain_size: 4,
            rack: Some(rack),
            zone: Some(0),
            elastic: false,
            spot: false,
            drivers: Default::default(),
            host: None,
            cluster: 0,
        }
    }

    /// A job of `replicas` × `milli` with `topology` and nothing else asked: for the
    /// scheduler's unit tests.
    pub(in crate::scheduler) fn job(replicas: u16, milli: u32, topology: Topology) -> JobSpec {
        JobSpec {
            id: 1,
            team: 0,
            class: 0,
            replicas,
            milli_per_replica: milli,
            priority: 0,
            topology,
            submitted_ms: 0,
            queued_ms: 0,
            max_runtime_ms: 1,
            allow_spot: false,
            fixed_nodes_only: false,
            kind: None,
            expected_runtime_ms: None,
            grace_ms: None,
            min_drivers: Default::default(),
            host: Default::default(),
            preemption_delay_ms: None,
            attained_ms: 0,
            elastic: None,
        }
    }

    #[test]
    fn holding_replicas_that_share_a_unit_and_a_nodes_cpus_takes_no_more_than_is_free_and_gives_it_all_back() {
        // One GPU with 600 milli free and 10 cores free; three replicas of 250 milli and 4
        // cores each: 500 milli of the unit and 8 cores go to the first two, the third gets
        // the last 100 milli and 2 cores.
        let mut n = node("n", 1, 0);
        n.host = Some(Host { cpu_millis: 14_000, memory_mib: 1_000 });
        let mut inv = Inventory::new(&[n], 1);
        let busy = ReplicaPlacement { node: 0, units: vec![(0, 400)], host: Host { cpu_millis: 4_000, memory_mib: 0 } };
        inv.allocate(std::slice::from_ref(&busy));
        let ask = ReplicaPlacement { node: 0, units: vec![(0, 250)], host: Host { cpu_millis: 4_000, memory_mib: 0 } };
        let before = inv.node_free(0);
        let held = inv.hold(&[ask.clone(), ask.clone(), ask]);
        let units: u32 = held.iter().flat_map(|r| r.units.iter()).map(|u| u.1).sum();
        let cpu: u32 = held.iter().map(|r| r.host.cpu_millis).sum();
        assert_eq!((units, cpu), (600, 10_000), "{held:?}");
        assert_eq!(inv.node_free(0), (0, Some(Host { cpu_millis: 0, memory_mib: 1_000 })));
        inv.release(&held);
        assert_eq!(inv.node_free(0), before, "releasing what was held restores the node exactly");
    }

    fn pool(name: &str, units: u8, spot: bool) -> Node {
        Node { elastic: true, spot, rack: None, zone: None, nvlink_domain_size: 0, ..node(name, units, 0) }
    }

    #[test]
    fn gangs_use_own_nodes_first_then_spot_pools_only_if_they_allow_spot_then_on_demand_pools() {
        // An on-demand pool (0), a spot pool (1) and one own node (2), 8 GPUs each.
        let nodes = [pool("on-demand", 8, false), pool("spot", 8, true), node("own", 8, 0)];
        let mut inv = Inventory::new(&nodes, 1);
        let tolerant = JobSpec { allow_spot: true, ..job(1, 8000, Topology::Any) };
        assert_eq!(inv.find(&job(1, 8000, Topology::Any)).unwrap()[0].node, 2, "own node first");
        assert_eq!(inv.find(&tolerant).unwrap()[0].node, 2, "own node first, spot or not");
        inv.allocate(&inv.clone().find(&job(1, 8000, Topology::Any)).unwrap());
        assert_eq!(inv.find(&tolerant).unwrap()[0].node, 1, "then the spot pool for a spot-tolerant job");
        assert_eq!(inv.find(&job(1, 8000, Topology::Any)).unwrap()[0].node, 0, "never spot for the others");
        // With the on-demand pool full too, a job that refuses spot waits.
        inv.allocate(&[ReplicaPlacement {
            node: 0,
            units: (0..8).map(|u| (u, 1000)).collect(),
            host: Default::default(),
        }]);
        assert!(inv.find(&job(1, 8000, Topology::Any)).is_none());
        assert_eq!(inv.find(&tolerant).unwrap()[0].node, 1);
    }

    #[test]
    fn a_service_replica_takes_own_nodes_only_never_a_cloud_pool() {
        let nodes = [pool("on-demand", 8, false), node("own", 8, 0)];
        let mut inv = Inventory::new(&nodes, 1);
        let replica = JobSpec { fixed_nodes_only: true, ..job(1, 4000, Topology::Any) };
        assert_eq!(inv.find(&replica).unwrap()[0].node, 1);
        inv.allocate(&[ReplicaPlacement {
            node: 1,
            units: (0..8).map(|u| (u, 1000)).collect(),
            host: Default::default(),
        }]);
        assert!(inv.find(&replica).is_none(), "the own node is full: it waits rather than go to the pool");
        assert_eq!(inv.find(&job(1, 4000, Topology::Any)).unwrap()[0].node, 0, "a batch job takes the pool");
    }

    #[test]
    fn a_cloud_gang_lies_within_one_pool() {
        // Two on-demand pools with 8 free GPUs each: a gang of 2 × 8 fits neither alone.
        let nodes = [pool("a", 8, false), pool("b", 8, false), node("own", 8, 0)];
        let mut inv = Inventory::new(&nodes, 1);
        inv.allocate(&[ReplicaPlacement {
            node: 2,
            units: (0..8).map(|u| (u, 1000)).collect(),
            host: Default::default(),
        }]);
        assert!(inv.find(&job(2, 8000, Topology::Any)).is_none(), "never split across pools");
        let one = inv.find(&job(1, 8000, Topology::Any)).unwrap();
        assert!(one[0].node < 2);
        let big = [pool("big", 16, false)];
        let p = Inventory::new(&big, 1).find(&job(2, 8000, Topology::Any)).unwrap();
        assert!(p.iter().all(|r| r.node == 0));
    }

    #[test]
    fn a_gang_of_shares_fits_on_the_partly_used_units_of_a_cloud_pool() {
        let mut inv = Inventory::new(&[pool("on-demand", 2, false)], 1);
        inv.allocate(&[
            ReplicaPlacement { node: 0, units: vec![(0, 250)], host: Default::default() },
            ReplicaPlacement { node: 0, units: vec![(1, 250)], host: Default::default() },
        ]);
        let placement = inv.find(&job(2, 500, Topology::Any)).expect("750 free on each unit");
        assert_eq!(placement.len(), 2);
        assert!(inv.find(&job(2, 800, Topology::Any)).is_none(), "but not 800 on either");
    }

    #[test]
    fn a_single_gpu_goes_to_the_fullest_node_that_fits() {
        let mut inv = Inventory::new(&[node("a", 8, 0), node("b", 8, 0)], 1);
        inv.allocate(&[ReplicaPlacement {
            node: 1,
            units: vec![(0, 1000), (1, 1000), (2, 1000)],
            host: Default::default(),
        }]);
        let p = inv.find(&job(1, 1000, Topology::Any)).unwrap();
        assert_eq!(p[0].node, 1, "packs onto the busier node, keeping node a whole");
        // Within node b, the replica goes to the partly used NVLink domain (units 0..4).
        assert_eq!(p[0].units, vec![(3, 1000)]);
    }

    #[test]
    fn shares_fill_partly_used_units_before_whole_ones() {
        let mut inv = Inventory::new(&[node("a", 2, 0)], 1);
        inv.allocate(&[ReplicaPlacement { node: 0, units: vec![(1, 600)], host: Default::default() }]);
        let p = inv.find(&job(1, 300, Topology::Any)).unwrap();
        assert_eq!(p[0].units, vec![(1, 300)]);
    }

    #[test]
    fn a_gang_lies_within_one_cluster_and_waits_while_none_holds_it_whole() {
        let in_cluster = |name: &str, cluster: u32| Node { cluster, ..node(name, 8, cluster) };
        let gang = |topology| job(2, 8000, topology);
        // 16 GPUs free, but 8 in each cluster: no placement, however the gang asks.
        let mut split = Inventory::new(&[in_cluster("a", 0), in_cluster("b", 1)], 1);
        assert!(!split.could_ever_fit(&gang(Topology::Any)), "no cluster is large enough");
        for topology in [Topology::Any, Topology::Preferred(Level::Node), Topology::Preferred(Level::Rack)] {
            assert_eq!(split.find(&gang(topology)), None, "{topology:?}");
            assert!(!split.can_place(&gang(topology)), "{topology:?}: counting must agree");
        }
        // A cluster that holds it takes it whole, though the other's node is the fuller one.
        let mut inv = Inventory::new(&[in_cluster("a", 0), in_cluster("b", 1), in_cluster("c", 1)], 1);
        inv.allocate(&[ReplicaPlacement {
            node: 0,
            units: (0..4).map(|u| (u, 1000)).collect(),
            host: Host::default(),
        }]);
        let half = |replicas| job(replicas, 4000, Topology::Any);
        assert_eq!(inv.find(&half(1)).unwrap()[0].node, 0, "a single replica still goes best-fit, anywhere");
        let p = inv.find(&half(2)).expect("cluster 1 holds it");
        assert!(p.iter().all(|r| r.node != 0), "best-fit alone would have put one replica on node a: {p:?}");
        assert!(inv.can_place(&half(2)));
        inv.allocate(&[ReplicaPlacement { node: 1, units: vec![(0, 1000)], host: Host::default() }]);
        inv.allocate(&[ReplicaPlacement { node: 2, units: vec![(0, 1000)], host: Host::default() }]);
        assert!(inv.could_ever_fit(&gang(Topology::Any)));
        assert_eq!(inv.find(&gang(Topology::Any)), None, "4 + 7 + 7 whole GPUs free, but 16 in no cluster");
        // A share gang too: its replicas are never split between clusters.
        let mut shares = Inventory::new(&[in_cluster("a", 0), Node { units: 1, ..in_cluster("b", 1) }], 1);
        assert_eq!(
            shares.find(&job(9, 600, Topology::Any)),
            None,
            "nine shares of 0.6 fit both clusters together, not one"
        );
        let p = shares.find(&job(8, 600, Topology::Any)).expect("cluster 0 holds eight");
        assert!(p.iter().all(|r| r.node == 0), "{p:?}");
    }

    #[test]
    fn one_more_replica_of_a_running_gang_goes_to_its_cluster_and_never_to_a_cloud_pool() {
        let in_cluster = |name: &str, cluster: u32| Node { cluster, ..node(name, 8, cluster) };
        let mut inv =
            Inventory::new(&[in_cluster("a", 0), in_cluster("b", 1), Node { cluster: 2, ..pool("p", 8, false) }], 1);
        // Cluster 1's node is the fuller one, but the gang runs on cluster 0.
        inv.allocate(&[ReplicaPlacement { node: 1, units: vec![(0, 1000)], host: Host::default() }]);
        let extra = job(1, 4000, Topology::Any);
        assert_eq!(inv.find(&extra).unwrap()[0].node, 1, "best-fit alone would go to cluster 1");
        assert_eq!(inv.find_beside(&extra, 0).unwrap()[0].node, 0);
        inv.allocate(&[ReplicaPlacement {
            node: 0,
            units: (0..8).map(|u| (u, 1000)).collect(),
            host: Host::default(),
        }]);
        assert_eq!(inv.find_beside(&extra, 0), None, "its cluster is full: it does not grow elsewhere");
        assert_eq!(inv.find_beside(&extra, 2), None, "nor on a cloud pool");
    }

    #[test]
    fn by_fragmentation_a_gpu_leaves_alone_the_last_whole_nvlink_domain_a_waiting_gang_needs() {
        use crate::scheduler::fragmentation::{Shape, ShapeMix};
        // Node a: domains of four, one whole and one used; node b: two idle units in each.
        // Both have four GPUs free, so neither best-fit nor a measure blind to domains tells
        // them apart, and the tie goes to node a, breaking its whole domain.
        let mut inv = Inventory::new(&[node("a", 8, 0), node("b", 8, 0)], 1);
        let used = |node: u32, units: &[u8]| ReplicaPlacement {
            node,
            units: units.iter().map(|&u| (u, 1000)).collect(),
            host: Host::default(),
        };
        inv.allocate(&[used(0, &[4, 5, 6, 7]), used(1, &[2, 3, 6, 7])]);
        let one = job(1, 1000, Topology::Any);
        let gang_shape = |one_domain| Shape { milli: 4000, host: Host::default(), one_domain };
        let mix = |one_domain| ShapeMix::from_counts([(gang_shape(one_domain), 1.0)]);
        inv.place_by_fragmentation(vec![mix(false)]);
        assert_eq!(inv.find(&one).unwrap()[0].node, 0, "blind to domains: a tie, to the lower index");
        // Gangs that must lie in one NVLink domain arrive: node b's domains are of no use to
        // them already, node a's whole one is.
        inv.place_by_fragmentation(vec![mix(true)]);
        assert_eq!(inv.find(&one).unwrap()[0].node, 1);
    }

    #[test]
    fn a_gang_is_placed_whole_or_not_at_all_and_finding_takes_nothing() {
        let mut inv = Inventory::new(&[node("a", 4, 0), node("b", 4, 0)], 1);
        assert!(inv.find(&job(3, 4000, Topology::Any)).is_none());
        assert_eq!(inv.free_milli(0), 8000);
        let p = inv.find(&job(2, 4000, Topology::Any)).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(inv.free_milli(0), 8000);
    }

    #[test]
    fn required_topology_keeps_the_gang_in_one_domain() {
        let mut inv = Inventory::new(&[node("a", 8, 0), node("b", 8, 1)], 1);
        inv.allocate(&[ReplicaPlacement {
            node: 0,
            units: (0..5).map(|u| (u, 1000)).collect(),
            host: Default::default(),
        }]);
        inv.allocate(&[ReplicaPlacement {
            node: 1,
            units: (0..5).map(|u| (u, 1000)).collect(),
            host: Default::default(),
        }]);
        // Six GPUs are free in total but at most three per node and rack.
        assert!(inv.find(&job(2, 2000, Topology::Required(Level::Node))).is_none());
        assert!(inv.find(&job(2, 2000, Topology::Required(Level::Rack))).is_none());
        assert!(inv.find(&job(2, 2000, Topology::Preferred(Level::Node))).is_some());
        assert!(inv.find(&job(1, 3000, Topology::Required(Level::Node))).is_some());
    }

    #[test]
    fn counting_whole_gpu_slots_answers_exactly_what_placing_the_gang_answers() {
        let mut rng = crate::rng::SplitMix64(24);
        let topologies = [
            Topology::Any,
            Topology::Preferred(Level::Rack),
            Topology::Preferred(Level::Node),
            Topology::Preferred(Level::NvlinkDomain),
            Topology::Required(Level::Node),
            Topology::Required(Level::Rack),
        ];
        let mut counted = 0;
        for _ in 0..300 {
            let mut nodes: Vec<Node> = (0..rng.between(1, 12))
                .map(|i| Node {
                    units: [4, 8, 8, 16][rng.index(4)],
                    nvlink_domain_size: [0, 4, 8][rng.index(3)],
                    ..node(&format!("n{i}"), 8, rng.below(3) as u32)
                })
                .collect();
            if rng.chance(10) {
                nodes.push(pool("pool", 16, false));
            }
            let mut inv = Inventory::new(&nodes, 1);
            // Some whole units and some shares taken, at random.
            for (i, n) in nodes.iter().enumerate() {
                for unit in 0..n.units {
                    match rng.below(4) {
                        0 => inv.allocate(&[ReplicaPlacement {
                            node: i as NodeId,
                            units: vec![(unit, 1000)],
                            host: Default::default(),
                        }]),
                        1 => inv.allocate(&[ReplicaPlacement {
                            node: i as NodeId,
                            units: vec![(unit, 300)],
                            host: Default::default(),
                        }]),
                        _ => {}
                    }
                }
            }
            for _ in 0..20 {
                let milli = [1000, 1000, 2000, 4000, 8000, 16000, 500][rng.index(7)];
                let j = job(rng.between(1, 10) as u16, milli, topologies[rng.index(topologies.len())]);
                let expected = inv.clone().find(&j).is_some();
                counted += usize::from(inv.whole_replica_slots(&j).is_some());
                assert_eq!(inv.can_place(&j), expected, "{j:?} on {nodes:?}");
            }
        }
        assert!(counted > 1_000, "the counted path was exercised {counted} times");
    }

    #[test]
    fn release_restores_exactly_what_allocate_took() {
        let mut inv = Inventory::new(&[node("a", 8, 0)], 1);
        let p = inv.find(&job(3, 500, Topology::Any)).unwrap();
        inv.allocate(&p);
        assert_eq!(inv.free_milli(0), 8000 - 1500);
        inv.release(&p);
        assert_eq!(inv.free_milli(0), 8000);
        assert!(inv.find(&job(1, 8000, Topology::Required(Level::Node))).is_some());
    }
}
