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
//! Shapes without GPUs are left out: they change every node's measure alike, so they never
//! change where a replica goes, and Fairway does not place them.

use super::snapshot::{Host, Snapshot, UNIT};

/// A replica's shape: GPU milli-units on one node (a multiple of 1000, or a share below it)
/// and the CPU and memory beside them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shape {
    pub milli: u32,
    pub host: Host,
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

    /// The node's expected fragmentation in milli-units: `free` milli per unit, `host` its free
    /// CPU and memory (`None`: not limited).
    pub fn expected(&self, free: &[u16], host: Option<Host>) -> f64 {
        self.shapes.iter().map(|&(shape, p)| p * f64::from(unusable(free, host, shape))).sum()
    }
}

/// The mix of each class (indexed by class) in a snapshot: the shapes of its waiting and
/// running jobs, each replica counted once.
pub fn mixes_of(s: &Snapshot) -> Vec<ShapeMix> {
    let mut counts: Vec<Vec<(Shape, f64)>> = vec![Vec::new(); s.classes.len()];
    let specs = s.pending.iter().chain(s.running.iter().map(|r| &r.spec));
    for spec in specs {
        if let Some(c) = counts.get_mut(usize::from(spec.class)) {
            c.push((Shape { milli: spec.milli_per_replica, host: spec.host }, f64::from(spec.replicas)));
        }
    }
    counts.into_iter().map(ShapeMix::from_counts).collect()
}

/// The free milli of a node (`free` per unit, `host` free beside them) that one replica of
/// `shape` could not use (see the module doc).
pub fn unusable(free: &[u16], host: Option<Host>, shape: Shape) -> u32 {
    let total: u32 = free.iter().map(|&f| u32::from(f)).sum();
    if host.is_some_and(|h| !h.holds(&shape.host)) {
        return total;
    }
    let (per_unit, units_needed) =
        if shape.milli < UNIT { (shape.milli, 1) } else { (UNIT, (shape.milli / UNIT) as usize) };
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
        Shape { milli, host: Host { cpu_millis, memory_mib: 0 } }
    }

    fn cpus(cpu_millis: u32) -> Option<Host> {
        Some(Host { cpu_millis, memory_mib: u32::MAX })
    }

    #[test]
    fn a_shape_that_fits_strands_only_the_units_too_full_for_it() {
        assert_eq!(unusable(&[300, 1000], None, shape(500, 0)), 300);
        assert_eq!(unusable(&[300, 1000], None, shape(1000, 0)), 300, "a partly used unit is lost to whole GPUs");
        assert_eq!(unusable(&[1000, 1000], None, shape(2000, 0)), 0);
    }

    #[test]
    fn a_shape_that_does_not_fit_strands_everything_free_on_the_node() {
        assert_eq!(unusable(&[500, 0], None, shape(1000, 0)), 500, "no whole unit");
        assert_eq!(unusable(&[1000, 1000], None, shape(4000, 0)), 2000, "too few units");
        assert_eq!(unusable(&[1000, 1000], cpus(4000), shape(1000, 8000)), 2000, "the CPUs ran out first");
        assert_eq!(unusable(&[1000, 1000], cpus(8000), shape(1000, 8000)), 0);
    }

    #[test]
    fn the_mix_weighs_each_shape_by_how_often_it_arrives_and_leaves_out_shapes_without_gpus() {
        let mix = ShapeMix::from_counts([(shape(500, 0), 1.0), (shape(1000, 0), 1.0), (shape(0, 4000), 5.0)]);
        // Had the CPU-only shape counted, an idle node would strand its GPUs for it.
        assert_eq!(mix.expected(&[1000, 1000], None), 0.0);
        // Half a unit left: lost to whole GPUs (half the arrivals), usable by shares.
        assert_eq!(mix.expected(&[500, 1000], None), 250.0);
    }
}
