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
