//! Right-sizing: from what a job's GPUs were seen to do (peak memory, SM activity), the
//! cheapest GPU class or MIG profile of the catalogue that would have held it, and what it
//! would have saved. A MIG profile that kills a job (too little memory) or starves it (too
//! little compute) is worse than waste, so both keep headroom.

/// Memory a recommendation keeps free above the peak seen: 10%.
pub const MEMORY_HEADROOM: f64 = 1.10;

/// Compute a recommendation keeps above the share of the GPU the job kept busy: 25%.
pub const COMPUTE_HEADROOM: f64 = 1.25;

/// A GPU class as the rule sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassOption {
    pub name: String,
    /// Memory of one unit (a GPU, or a MIG slice), MiB.
    pub memory_mib: i64,
    /// Share of a physical GPU one unit is, in thousandths.
    pub fraction_milli: i32,
    /// Price per unit-hour in force, micro-units; a class without a price is never offered.
    pub rate_micros_per_hour: Option<i64>,
}

/// What a job (or the jobs of one name) was seen to do on its class's units.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    /// Memory used on the fullest unit at its peak, MiB.
    pub peak_memory_mib: i64,
    /// SM activity on its units, mean over its life (ratio, 0–1).
    pub mean_sm_active: f64,
}

/// A cheaper class that would have held the job.
#[derive(Debug, Clone, PartialEq)]
pub struct Recommendation {
    pub class: String,
    pub memory_mib: i64,
    /// The candidate's price over the current class's, in thousandths: what a unit-hour
    /// costs there for each thousand it costs now.
    pub price_ratio_milli: i64,
}

impl Recommendation {
    /// What `cost_micros` spent on the current class would have cost less on the candidate.
    pub fn saving_of(&self, cost_micros: i64) -> i64 {
        let saved = i128::from(cost_micros) * i128::from(1000 - self.price_ratio_milli.min(1000)) / 1000;
        i64::try_from(saved).unwrap_or(i64::MAX)
    }
}

/// The cheapest class of `options` that holds what the job was seen to use on `current`:
/// memory at least the peak with [`MEMORY_HEADROOM`], and a share of a GPU at least the
/// share the job kept busy with [`COMPUTE_HEADROOM`], at a lower price per unit-hour. `None`
/// when nothing cheaper would hold it, or the current class has no price.
pub fn recommend(seen: &Seen, current: &ClassOption, options: &[ClassOption]) -> Option<Recommendation> {
    let current_rate = current.rate_micros_per_hour.filter(|r| *r > 0)?;
    let memory_needed = seen.peak_memory_mib as f64 * MEMORY_HEADROOM;
    // The busy share of a physical GPU: SM activity is measured on the current units.
    let compute_needed = seen.mean_sm_active.clamp(0.0, 1.0) * f64::from(current.fraction_milli) * COMPUTE_HEADROOM;
    options
        .iter()
        .filter(|o| o.name != current.name)
        .filter(|o| o.memory_mib as f64 >= memory_needed && f64::from(o.fraction_milli) >= compute_needed)
        .filter_map(|o| o.rate_micros_per_hour.filter(|r| *r < current_rate).map(|r| (o, r)))
        .min_by(|(a, ra), (b, rb)| ra.cmp(rb).then(b.memory_mib.cmp(&a.memory_mib)).then(a.name.cmp(&b.name)))
        .map(|(o, rate)| Recommendation {
            class: o.name.clone(),
            memory_mib: o.memory_mib,
            price_ratio_milli: i64::try_from(i128::from(rate) * 1000 / i128::from(current_rate)).unwrap_or(1000),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(name: &str, memory_mib: i64, fraction_milli: i32, rate: Option<i64>) -> ClassOption {
        ClassOption { name: name.into(), memory_mib, fraction_milli, rate_micros_per_hour: rate }
    }

    fn catalogue() -> Vec<ClassOption> {
        vec![
            class("h100-80gb", 81920, 1000, Some(4_000_000)),
            class("a100-80gb", 81920, 1000, Some(2_500_000)),
            class("a100-80gb.mig-3g.40gb", 40960, 428, Some(1_100_000)),
            class("a100-80gb.mig-1g.10gb", 10240, 142, Some(400_000)),
            class("l4-24gb", 24576, 1000, None),
        ]
    }

    #[test]
    fn a_job_using_9_gb_and_little_compute_of_an_h100_fits_a_1g_10gb_slice_at_a_tenth_of_the_price() {
        let seen = Seen { peak_memory_mib: 9216, mean_sm_active: 0.05 };
        let r = recommend(&seen, &catalogue()[0], &catalogue()).unwrap();
        assert_eq!(r.class, "a100-80gb.mig-1g.10gb");
        assert_eq!(r.price_ratio_milli, 100);
        assert_eq!(r.saving_of(8_000_000), 7_200_000, "90% of what it cost");
    }

    #[test]
    fn memory_and_compute_each_keep_their_headroom() {
        // 9.5 GB with 10% headroom needs more than a 1g.10gb slice has.
        let big = Seen { peak_memory_mib: 9500, mean_sm_active: 0.05 };
        assert_eq!(recommend(&big, &catalogue()[0], &catalogue()).unwrap().class, "a100-80gb.mig-3g.40gb");
        // 9 GB but half an H100 busy: a 1g slice (a seventh) would starve it, a 3g slice too.
        let busy = Seen { peak_memory_mib: 9216, mean_sm_active: 0.5 };
        assert_eq!(recommend(&busy, &catalogue()[0], &catalogue()).unwrap().class, "a100-80gb");
        // A full H100: nothing cheaper holds it.
        let full = Seen { peak_memory_mib: 78000, mean_sm_active: 0.95 };
        assert_eq!(recommend(&full, &catalogue()[1], &catalogue()), None);
    }

    #[test]
    fn classes_without_a_price_are_never_offered_and_an_unpriced_job_gets_no_advice() {
        let seen = Seen { peak_memory_mib: 1024, mean_sm_active: 0.01 };
        let unpriced = class("h100-80gb", 81920, 1000, None);
        assert_eq!(recommend(&seen, &unpriced, &catalogue()), None);
        let only_l4 = [catalogue()[0].clone(), catalogue()[4].clone()];
        assert_eq!(recommend(&seen, &catalogue()[0], &only_l4), None);
    }

    /// Right-sizing from what a real H200 reported while a job held 9 GiB and did matrix
    /// work for a while: NVML counts more than the 9 GiB the job asked for (the CUDA
    /// context's and the libraries' memory too), and the advice holds what was seen.
    #[test]
    fn a_job_that_held_9_gib_on_a_real_h200_is_advised_the_mig_slice_that_holds_what_the_gpu_saw() {
        use crate::domain::activity::h200;
        let samples = h200::samples();
        let peak = samples.iter().map(|s| s.fb_used_mib).max().unwrap();
        assert!(peak > 9 * 1024, "NVML saw {peak} MiB: more than the 9 GiB asked for");
        let sm: Vec<f64> = samples.iter().filter_map(|s| s.sm_active_pct).collect();
        let seen = Seen { peak_memory_mib: peak, mean_sm_active: sm.iter().sum::<f64>() / sm.len() as f64 / 100.0 };
        // H200 MIG profiles by their names' memory (GFD's `nvidia.com/mig-<profile>.memory`
        // is what a cluster reports), priced by their share of the GPU.
        let h200 = |name: &str, gb: i64, sevenths: i32| {
            class(name, gb * 1024, sevenths * 1000 / 7, Some(4_000_000 * i64::from(sevenths) / 7))
        };
        let options = [
            class("h200", h200::MEMORY_MIB, 1000, Some(4_000_000)),
            h200("h200.mig-1g.18gb", 18, 1),
            h200("h200.mig-2g.35gb", 35, 2),
            h200("h200.mig-3g.71gb", 71, 3),
        ];
        let r = recommend(&seen, &options[0], &options).unwrap();
        // 18 GB holds the memory with its headroom, but a seventh of the chip cannot give
        // the share the matrix work kept busy, with its 25%.
        assert!(seen.mean_sm_active * 1.25 > 1.0 / 7.0, "{seen:?}");
        assert_eq!(r.class, "h200.mig-2g.35gb");
        assert_eq!(r.price_ratio_milli, 285);
    }
}
