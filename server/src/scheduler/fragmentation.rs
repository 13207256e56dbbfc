//! Fragmentation as FGD measures it (Weng et al., "Beware of Fragmentation: Scheduling
//! GPU-Sharing Workloads with Fragmentation Gradient Descent", ATC '23): the free GPU capacity
//! of a node that the replicas which arrive could not use there, each shape weighted by how
//! often it arrives. [`Placement::Fragmentation`](super::Placement::Fragmentation) puts each
//! replica where this grows least; `fairway fragmentation` measures it for every placer.
//!
//! For one node and one shape, what cannot be used is:
//! - all of the node's free GPU capacity, when the shape does not fit there at all: too few
//!   units with room for it, or too little free CPU or memory beside them;
//! - otherwise the free capacity of the units too full for it (a share larger than what a
//!   unit has left; any partly used unit, for shapes of whole units).
//!
//! Topology extends this the same way. A gang that requires one NVLink domain is one shape of
//! all its units, which can use only the idle units of domains with enough of them: the rest
//! of the node's free capacity is lost to it, so breaking a node's last whole domain counts
//! as what it is. A gang that requires one node is one shape of all its units. (Racks and
//! zones span nodes, which a node's measure cannot see; a MIG profile is a class of its own,
//! measured by its own shapes.)
//!
//! Shapes without GPUs are left out: they change every node's measure alike, so they never
//! change where a replica goes, and Fairway does not place them.

use super::snapshot::{Host, Snapshot, UNIT};

/// A replica's shape: GPU milli-units on one node (a multiple of 1000, or a share below it)
/// and the CPU and memory beside them; for a gang that requires one node or one NVLink
/// domain, the whole gang's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shape {
    pub milli: u32,
    pub host: Host,
    /// Its whole units must lie in one NVLink domain of the node.
    pub one_domain: bool,
}

impl Shape {
    /// The shape of one replica of `spec`, or of the whole gang where it requires one node
    /// or one NVLink domain; and how many times it arrives with the job.
    pub fn of(spec: &super::snapshot::JobSpec) -> (Shape, f64) {
        use super::snapshot::{Level, Topology};
        match spec.topology {
            Topology::Required(level @ (Level::Node | Level::NvlinkDomain)) => {
                let n = u32::from(spec.replicas.max(1));
                let host = Host {
                    cpu_millis: spec.host.cpu_millis.saturating_mul(n),
                    memory_mib: spec.host.memory_mib.saturating_mul(n),
                };
                let one_domain = level == Level::NvlinkDomain && spec.milli_per_replica >= UNIT;
                (Shape { milli: spec.total_milli().min(u64::from(u32::MAX)) as u32, host, one_domain }, 1.0)
            }
            _ => {
                (Shape { milli: spec.milli_per_replica, host: spec.host, one_domain: false }, f64::from(spec.replicas))
            }
        }
    }
}

/// The shapes that arrive and how often, as shares summing to one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShapeMix {
    shapes: Vec<(Shape, f64)>,
}

impl ShapeMix {
    /// The mix of shapes counted `weight` times each (shapes repeat; shapes without GPUs and
    /// non-positive weights are left out).
    pub fn from_counts(counts: impl IntoIterator<Item = (Shape, f64)>) -> Self {
        let mut merged: std::collections::BTreeMap<Shape, f64> = std::collections::BTreeMap::new();
        for (shape, weight) in counts {
            if shape.milli > 0 && weight > 0.0 {
                *merged.entry(shape).or_default() += weight;
            }
        }
        let total: f64 = merged.values().sum();
        Self { shapes: merged.into_iter().map(|(s, w)| (s, w / total)).collect() }
    }

    /// Whether no shape arrives.
    pub fn is_empty(&self) -> bool {
        self.shapes.is_empty()
    }

    /// The node's expected fragmentation in milli-units: `free` milli per unit, in NVLink
    /// domains of `domain_size` units (0: one domain), `host` its free CPU and memory (`None`:
    /// not limited).
    pub fn expected(&self, free: &[u16], domain_size: u8, host: Option<Host>) -> f64 {
        self.shapes.iter().map(|&(shape, p)| p * f64::from(unusable(free, domain_size, host, shape))).sum()
    }

    /// Whether some shape must lie in one NVLink domain, so that where a node's free units
    /// are, not only how many, matters.
    pub fn has_domain_shapes(&self) -> bool {
        self.shapes.iter().any(|(shape, _)| shape.one_domain)
    }
}

/// The mix of each class (indexed by class) in a snapshot: the shapes of its waiting and
/// running jobs, each replica counted once.
pub fn mixes_of(s: &Snapshot) -> Vec<ShapeMix> {
    let mut counts: Vec<Vec<(Shape, f64)>> = vec![Vec::new(); s.classes.len()];
    let specs = s.pending.iter().chain(s.running.iter().map(|r| &r.spec));
    for spec in specs {
        if let Some(c) = counts.get_mut(usize::from(spec.class)) {
            c.push(Shape::of(spec));
        }
    }
    counts.into_iter().map(ShapeMix::from_counts).collect()
}

/// The free milli of a node (`free` per unit, in NVLink domains of `domain_size` units, 0 for
/// one; `host` free beside them) that one replica of `shape` could not use (see the module
/// doc).
pub fn unusable(free: &[u16], domain_size: u8, host: Option<Host>, shape: Shape) -> u32 {
    let total: u32 = free.iter().map(|&f| u32::from(f)).sum();
    if host.is_some_and(|h| !h.holds(&shape.host)) {
        return total;
    }
    let (per_unit, units_needed) =
        if shape.milli < UNIT { (shape.milli, 1) } else { (UNIT, (shape.milli / UNIT) as usize) };
    if shape.one_domain && shape.milli >= UNIT && domain_size > 0 {
        // Only the idle units of domains with enough of them are of use.
        let usable: u32 = free
            .chunks(usize::from(domain_size))
            .map(|domain| domain.iter().filter(|&&f| u32::from(f) == UNIT).count())
            .filter(|&idle| idle >= units_needed)
            .map(|idle| idle as u32 * UNIT)
            .sum();
        return total - usable;
    }
    let roomy = free.iter().filter(|&&f| u32::from(f) >= per_unit).count();
    if roomy < units_needed {
        return total;
    }
    free.iter().map(|&f| u32::from(f)).filter(|&f| f < per_unit).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(milli: u32, cpu_millis: u32) -> Shape {
        Shape { milli, host: Host { cpu_millis, memory_mib: 0 }, one_domain: false }
    }

    /// [`unusable`] on a node of one NVLink domain.
    fn unusable_flat(free: &[u16], host: Option<Host>, shape: Shape) -> u32 {
        unusable(free, 0, host, shape)
    }

    fn cpus(cpu_millis: u32) -> Option<Host> {
        Some(Host { cpu_millis, memory_mib: u32::MAX })
    }

    #[test]
    fn a_shape_that_fits_strands_only_the_units_too_full_for_it() {
        assert_eq!(unusable_flat(&[300, 1000], None, shape(500, 0)), 300);
        assert_eq!(unusable_flat(&[300, 1000], None, shape(1000, 0)), 300, "a partly used unit is lost to whole GPUs");
        assert_eq!(unusable_flat(&[1000, 1000], None, shape(2000, 0)), 0);
    }

    #[test]
    fn a_shape_that_does_not_fit_strands_everything_free_on_the_node() {
        assert_eq!(unusable_flat(&[500, 0], None, shape(1000, 0)), 500, "no whole unit");
        assert_eq!(unusable_flat(&[1000, 1000], None, shape(4000, 0)), 2000, "too few units");
        assert_eq!(unusable_flat(&[1000, 1000], cpus(4000), shape(1000, 8000)), 2000, "the CPUs ran out first");
        assert_eq!(unusable_flat(&[1000, 1000], cpus(8000), shape(1000, 8000)), 0);
    }

    #[test]
    fn a_gang_kept_within_one_nvlink_domain_can_use_only_domains_with_enough_idle_units() {
        let within = Shape { one_domain: true, ..shape(4000, 0) };
        // Two domains of four: one with two idle units, one whole.
        let free = [1000, 1000, 0, 0, 1000, 1000, 1000, 1000];
        assert_eq!(unusable(&free, 4, None, within), 2000, "the broken domain's two idle units are lost to it");
        assert_eq!(unusable(&free, 4, None, shape(4000, 0)), 0, "a gang that needs no domain uses any four");
        assert_eq!(unusable(&free, 4, None, Shape { one_domain: true, ..shape(2000, 0) }), 0);
        // No whole domain left: all of it is lost, though six units are idle.
        let broken = [1000, 1000, 1000, 0, 1000, 1000, 1000, 0];
        assert_eq!(unusable(&broken, 4, None, within), 6000);
        // A node of one domain is one domain.
        assert_eq!(unusable(&broken, 0, None, within), 0);
    }

    #[test]
    fn a_gang_that_requires_one_node_or_domain_is_one_shape_of_all_its_units() {
        use crate::scheduler::snapshot::{JobSpec, Level, Topology};
        let spec = |replicas, topology| JobSpec {
            host: Host { cpu_millis: 8000, memory_mib: 1024 },
            ..crate::scheduler::inventory::tests::job(replicas, 2000, topology)
        };
        let (one, n) = Shape::of(&spec(2, Topology::Required(Level::NvlinkDomain)));
        assert_eq!((one.milli, one.host.cpu_millis, one.one_domain, n), (4000, 16000, true, 1.0));
        let (node, _) = Shape::of(&spec(2, Topology::Required(Level::Node)));
        assert_eq!((node.milli, node.one_domain), (4000, false));
        let (anywhere, n) = Shape::of(&spec(3, Topology::Preferred(Level::Node)));
        assert_eq!((anywhere.milli, anywhere.one_domain, n), (2000, false, 3.0));
    }

    #[test]
    fn the_mix_weighs_each_shape_by_how_often_it_arrives_and_leaves_out_shapes_without_gpus() {
        let mix = ShapeMix::from_counts([(shape(500, 0), 1.0), (shape(1000, 0), 1.0), (shape(0, 4000), 5.0)]);
        // Had the CPU-only shape counted, an idle node would strand its GPUs for it.
        assert_eq!(mix.expected(&[1000, 1000], 0, None), 0.0);
        // Half a unit left: lost to whole GPUs (half the arrivals), usable by shares.
        assert_eq!(mix.expected(&[500, 1000], 0, None), 250.0);
    }
}
