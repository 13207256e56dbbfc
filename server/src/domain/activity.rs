//! What a replica's GPUs did at one read of NVIDIA DCGM: what `backends::dcgm` reads and
//! `db::utilisation` records.

use super::JobId;

/// One replica's GPUs, as last sampled: means over its GPUs, memory of its fullest.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaActivity {
    pub job_id: JobId,
    pub attempt: i32,
    pub replica: i32,
    /// GPUs of the replica that reported.
    pub gpus: i32,
    /// Percent, 0–100.
    pub gpu_util_pct: f64,
    /// Ratio, 0–1.
    pub sm_active: f64,
    /// Ratio, 0–1.
    pub tensor_active: f64,
    /// Memory used on the replica's fullest GPU, MiB.
    pub fb_used_mib: i64,
    /// That GPU's memory (used + free), MiB.
    pub fb_total_mib: i64,
}

/// What a real NVIDIA H200 reported through NVML while it ran known work
/// (`server/data/gpu/h200/activity.csv`, captured by `server/data/gpu/capture.py`; its
/// README says how): the replay the idle and right-sizing rules are checked against.
#[cfg(test)]
pub(crate) mod h200 {
    /// One 100 ms sample.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Sample {
        /// Seconds since the capture began.
        pub t_s: f64,
        pub phase: String,
        pub gpu_util_pct: f64,
        pub fb_used_mib: i64,
        /// `None` for the first sample, which has no earlier one to measure against.
        pub sm_active_pct: Option<f64>,
        pub tensor_active_pct: Option<f64>,
    }

    /// Memory of the H200 it ran on, MiB, as NVML reported it.
    pub const MEMORY_MIB: i64 = 143_771;

    /// Every sample, in order.
    pub fn samples() -> Vec<Sample> {
        include_str!("../../data/gpu/h200/activity.csv")
            .lines()
            .skip(1)
            .map(|line| {
                // A phase with commas in it is quoted; the other fields are numbers.
                let mut fields: Vec<String> = Vec::new();
                let mut quoted = false;
                let mut field = String::new();
                for c in line.chars() {
                    match c {
                        '"' => quoted = !quoted,
                        ',' if !quoted => fields.push(std::mem::take(&mut field)),
                        c => field.push(c),
                    }
                }
                fields.push(field);
                let number = |s: &str| (!s.is_empty()).then(|| s.parse::<f64>().expect("a number"));
                Sample {
                    t_s: fields[0].parse().expect("t_s"),
                    phase: fields[1].clone(),
                    gpu_util_pct: fields[2].parse().expect("gpu_util_pct"),
                    fb_used_mib: fields[4].parse().expect("fb_used_mib"),
                    sm_active_pct: number(&fields[5]),
                    tensor_active_pct: number(&fields[6]),
                }
            })
            .collect()
    }

    /// The samples of one phase.
    pub fn phase(name: &str) -> Vec<Sample> {
        samples().into_iter().filter(|s| s.phase == name).collect()
    }

    /// The median of some values.
    pub fn median(mut values: Vec<f64>) -> f64 {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    }
}
