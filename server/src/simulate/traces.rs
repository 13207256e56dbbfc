//! Loaders for the public traces (built into the binary from `server/data/traces`, whose
//! README gives their source, citation and licence) and for the job trace CSV of
//! `fairway simulate`, and the mapping of the Alibaba GPU v2023 trace to a [`Workload`].
//!
//! The CSV files have no quoting, so a line is split on commas; a trailing empty field (an
//! empty last column) is an empty string. Every error names the file and the line.
//!
//! # The Alibaba trace as a workload
//!
//! The v2023 trace (Weng et al., "Beware of Fragmentation", ATC '23) has no tenants and one
//! row per pod. Mapped as follows:
//! - pods without GPUs and pods never scheduled are skipped;
//! - a pod is one replica: `num_gpu == 1` with `gpu_milli < 1000` asks for that share of one
//!   GPU, otherwise `num_gpu` whole GPUs on one node;
//! - submit = `creation_time`, duration = `deletion_time - scheduled_time` (at least 1 s), and
//!   the maximum runtime is the duration rounded up to whole hours, doubled;
//! - `Guaranteed` pods are `production` (non-preemptible), `LS` and `Burstable` are
//!   `experiment`, `BE` is `scavenger`;
//! - one GPU class `gpu` for every model at $2.00 per GPU-hour; the node list's GPU nodes with
//!   no NVLink split, racks of 16 consecutive nodes, one zone;
//! - the teams are the Helios Venus virtual clusters with a quota on the last day; their
//!   reserved quotas are proportional to it, scaled so they add up to 80% of the cluster
//!   (largest-remainder rounding in milli-GPUs), each may burst to the whole cluster and lends
//!   all of its reserved quota; a pod goes to a team with probability proportional to its
//!   quota, by the FNV-1a hash of the pod name (so the assignment is deterministic).

use std::{
    borrow::Cow,
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use super::{cluster::default_priorities, Cluster, TraceJob, Workload};
use crate::scheduler::{ClassId, GpuClass, Host, Node, PriorityId, Quota, Team, TeamId, UNIT};

/// Why a trace or cluster file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file cannot be read.
    #[error("{}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    /// A line (0 = the file as a whole) is not valid.
    #[error("{}:{line}: {message}", path.display())]
    Invalid { path: PathBuf, line: usize, message: String },
}

/// File names inside the traces directory.
pub mod files {
    /// GPU nodes of the Alibaba v2023 cluster.
    pub const ALIBABA_NODES: &str = "alibaba-gpu-v2023/openb_node_list_gpu_node.csv";
    /// Pods with times.
    pub const ALIBABA_PODS: &str = "alibaba-gpu-v2023/openb_pod_list_default.csv";
    /// Placement-only variants: 20% of the multi-GPU pods' weight in 2-8 GPU pods.
    pub const ALIBABA_MULTIGPU20: &str = "alibaba-gpu-v2023/openb_pod_list_multigpu20.csv";
    /// Placement-only variant with 50% multi-GPU pods.
    pub const ALIBABA_MULTIGPU50: &str = "alibaba-gpu-v2023/openb_pod_list_multigpu50.csv";
    /// Placement-only variant where every GPU pod asks for a share of one GPU.
    pub const ALIBABA_GPUSHARE100: &str = "alibaba-gpu-v2023/openb_pod_list_gpushare100.csv";
    /// Per-VC GPU quotas of the Helios Venus cluster, one row per day.
    pub const HELIOS_VENUS_QUOTAS: &str = "helios-venus/cluster_gpu_number.csv";
}

/// The traces built into the binary, by file name: unmodified copies of the files in
/// `server/data/traces`, so the commands that replay them work from any directory.
const EMBEDDED: &[(&str, &str)] = &[
    (files::ALIBABA_NODES, include_str!("../../data/traces/alibaba-gpu-v2023/openb_node_list_gpu_node.csv")),
    (files::ALIBABA_PODS, include_str!("../../data/traces/alibaba-gpu-v2023/openb_pod_list_default.csv")),
    (files::ALIBABA_MULTIGPU20, include_str!("../../data/traces/alibaba-gpu-v2023/openb_pod_list_multigpu20.csv")),
    (files::ALIBABA_MULTIGPU50, include_str!("../../data/traces/alibaba-gpu-v2023/openb_pod_list_multigpu50.csv")),
    (files::ALIBABA_GPUSHARE100, include_str!("../../data/traces/alibaba-gpu-v2023/openb_pod_list_gpushare100.csv")),
    (files::HELIOS_VENUS_QUOTAS, include_str!("../../data/traces/helios-venus/cluster_gpu_number.csv")),
];

/// Where the public traces are read from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Traces {
    /// The copies built into the binary.
    #[default]
    Embedded,
    /// A directory holding the same file names (`--traces-dir`).
    Dir(PathBuf),
}

impl Traces {
    /// The directory if one is given, else the built-in copies.
    pub fn from_dir(dir: Option<PathBuf>) -> Self {
        dir.map_or(Traces::Embedded, Traces::Dir)
    }

    fn csv(&self, file: &str) -> Result<Csv, TraceError> {
        match self {
            Traces::Dir(dir) => Csv::read(&dir.join(file)),
            Traces::Embedded => {
                let path = Path::new("(built in)").join(file);
                let text = EMBEDDED.iter().find(|(name, _)| *name == file).map(|(_, text)| *text).ok_or_else(|| {
                    TraceError::Read { path: path.clone(), source: std::io::ErrorKind::NotFound.into() }
                })?;
                Ok(Csv::parse(path, Cow::Borrowed(text)))
            }
        }
    }
}

/// A CSV file read whole.
struct Csv {
    path: PathBuf,
    text: Cow<'static, str>,
    header: Vec<String>,
}

/// One data line of a [`Csv`].
struct Record<'a> {
    csv: &'a Csv,
    /// 1-based line number in the file.
    line: usize,
    fields: Vec<&'a str>,
}

impl Csv {
    fn read(path: &Path) -> Result<Self, TraceError> {
        let text = std::fs::read_to_string(path).map_err(|source| TraceError::Read { path: path.into(), source })?;
        Ok(Self::parse(path.into(), Cow::Owned(text)))
    }

    fn parse(path: PathBuf, text: Cow<'static, str>) -> Self {
        let header = text.lines().next().unwrap_or("").trim_end_matches('\r');
        let header = header.split(',').map(|h| h.trim().to_owned()).collect();
        Self { path, header, text }
    }

    fn error(&self, line: usize, message: impl Into<String>) -> TraceError {
        TraceError::Invalid { path: self.path.clone(), line, message: message.into() }
    }

    /// Index of a required column.
    fn column(&self, name: &str) -> Result<usize, TraceError> {
        self.optional_column(name).ok_or_else(|| self.error(1, format!("no column {name:?} in the header")))
    }

    fn optional_column(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| h == name)
    }

    /// The data lines, skipping blank ones. A line may omit trailing empty fields, but may
    /// not have more fields than the header.
    fn records(&self) -> impl Iterator<Item = Result<Record<'_>, TraceError>> {
        self.text.lines().enumerate().skip(1).filter(|(_, l)| !l.trim().is_empty()).map(move |(i, l)| {
            let fields: Vec<&str> = l.trim_end_matches('\r').split(',').map(str::trim).collect();
            if fields.len() > self.header.len() {
                return Err(self.error(i + 1, format!("{} fields, the header has {}", fields.len(), self.header.len())));
            }
            Ok(Record { csv: self, line: i + 1, fields })
        })
    }
}

impl<'a> Record<'a> {
    fn get(&self, column: usize) -> &'a str {
        self.fields.get(column).copied().unwrap_or("")
    }

    fn error(&self, message: impl Into<String>) -> TraceError {
        self.csv.error(self.line, message)
    }

    fn parse<T: std::str::FromStr>(&self, column: usize) -> Result<T, TraceError> {
        let text = self.get(column);
        text.parse().map_err(|_| self.error(format!("{}: {text:?} is not a valid number", self.csv.header[column])))
    }

    /// An optional number: an empty field is `None`.
    fn parse_optional<T: std::str::FromStr>(&self, column: Option<usize>) -> Result<Option<T>, TraceError> {
        match column {
            Some(c) if !self.get(c).is_empty() => self.parse(c).map(Some),
            _ => Ok(None),
        }
    }
}

/// A GPU node of the Alibaba v2023 node list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlibabaNode {
    pub name: String,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    pub gpus: u8,
    /// GPU model, e.g. `V100M16`; empty on CPU-only nodes.
    pub model: String,
}

/// Reads the Alibaba v2023 GPU node list (`sn,cpu_milli,memory_mib,gpu,model`).
pub fn load_alibaba_nodes(traces: &Traces) -> Result<Vec<AlibabaNode>, TraceError> {
    let csv = traces.csv(files::ALIBABA_NODES)?;
    let [sn, cpu, mem, gpu, model] = ["sn", "cpu_milli", "memory_mib", "gpu", "model"].map(|c| csv.column(c));
    let (sn, cpu, mem, gpu, model) = (sn?, cpu?, mem?, gpu?, model?);
    csv.records()
        .map(|r| {
            let r = r?;
            let gpus: u8 = r.parse(gpu)?;
            if gpus > 64 {
                return Err(r.error(format!("{gpus} GPUs on one node, at most 64 are supported")));
            }
            Ok(AlibabaNode {
                name: r.get(sn).to_owned(),
                cpu_milli: r.parse(cpu)?,
                memory_mib: r.parse(mem)?,
                gpus,
                model: r.get(model).to_owned(),
            })
        })
        .collect()
}

/// A pod of an Alibaba v2023 pod list. The placement-only lists have no QoS and no times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlibabaPod {
    pub name: String,
    pub cpu_milli: u32,
    pub memory_mib: u64,
    /// Whole GPUs, or 1 with a share in `gpu_milli`.
    pub num_gpu: u32,
    /// GPU share in thousandths of one GPU (meaningful when `num_gpu == 1`).
    pub gpu_milli: u32,
    /// `LS`, `BE`, `Burstable` or `Guaranteed`.
    pub qos: Option<String>,
    /// Seconds from the start of the trace.
    pub creation_s: Option<i64>,
    pub deletion_s: Option<i64>,
    /// Empty for pods that were never scheduled.
    pub scheduled_s: Option<i64>,
}

impl AlibabaPod {
    /// What one replica of this pod asks for, in milli-GPUs: a share of one GPU, or whole GPUs.
    /// `None` for a pod without GPUs.
    pub fn milli_per_replica(&self) -> Option<u32> {
        match self.num_gpu {
            0 => None,
            1 if self.gpu_milli > 0 && self.gpu_milli < UNIT => Some(self.gpu_milli),
            n => Some(n * UNIT),
        }
    }
}

/// Reads the Alibaba v2023 pod list `file`: the full one (with `qos` and times) or a placement-only
/// variant (`name,cpu_milli,memory_mib,num_gpu,gpu_milli`).
pub fn load_alibaba_pods(traces: &Traces, file: &str) -> Result<Vec<AlibabaPod>, TraceError> {
    let csv = traces.csv(file)?;
    let name = csv.column("name")?;
    let cpu = csv.column("cpu_milli")?;
    let mem = csv.column("memory_mib")?;
    let num_gpu = csv.column("num_gpu")?;
    let gpu_milli = csv.column("gpu_milli")?;
    let qos = csv.optional_column("qos");
    let creation = csv.optional_column("creation_time");
    let deletion = csv.optional_column("deletion_time");
    let scheduled = csv.optional_column("scheduled_time");
    csv.records()
        .map(|r| {
            let r = r?;
            Ok(AlibabaPod {
                name: r.get(name).to_owned(),
                cpu_milli: r.parse(cpu)?,
                memory_mib: r.parse(mem)?,
                num_gpu: r.parse(num_gpu)?,
                gpu_milli: r.parse(gpu_milli)?,
                qos: qos.map(|c| r.get(c).to_owned()).filter(|q| !q.is_empty()),
                creation_s: r.parse_optional(creation)?,
                deletion_s: r.parse_optional(deletion)?,
                scheduled_s: r.parse_optional(scheduled)?,
            })
        })
        .collect()
}

/// Reads the Helios Venus quota table (`date`, one column per virtual cluster, `total`) and
/// returns the quotas of the last day, in GPUs, leaving out virtual clusters with none.
pub fn load_venus_quotas(traces: &Traces) -> Result<Vec<(String, u32)>, TraceError> {
    let csv = traces.csv(files::HELIOS_VENUS_QUOTAS)?;
    let vcs: Vec<usize> =
        (0..csv.header.len()).filter(|&c| csv.header[c] != "date" && csv.header[c] != "total").collect();
    let mut last = None;
    for r in csv.records() {
        let r = r?;
        let quotas = vcs.iter().map(|&c| r.parse::<u32>(c)).collect::<Result<Vec<_>, _>>()?;
        last = Some(quotas);
    }
    let last = last.ok_or_else(|| csv.error(0, "no data rows"))?;
    Ok(vcs.iter().zip(last).filter(|(_, q)| *q > 0).map(|(&c, q)| (csv.header[c].clone(), q)).collect())
}

/// Reads a job trace for `fairway simulate`:
/// `submit_s,team,gpu_class,replicas,gpus_per_replica,duration_s,priority_class`, with names
/// resolved against `cluster`. `gpus_per_replica` may be a fraction below one (`0.5` = half a
/// GPU); times may have up to three decimals. Jobs come back in submission order.
pub fn load_job_trace(path: &Path, cluster: &Cluster) -> Result<Vec<TraceJob>, TraceError> {
    let csv = Csv::read(path)?;
    let cols = ["submit_s", "team", "gpu_class", "replicas", "gpus_per_replica", "duration_s", "priority_class"]
        .map(|c| csv.column(c));
    let [submit, team, class, replicas, gpus, duration, priority] = cols;
    let (submit, team, class, replicas, gpus, duration, priority) =
        (submit?, team?, class?, replicas?, gpus?, duration?, priority?);
    let mut jobs = Vec::new();
    for r in csv.records() {
        let r = r?;
        let milli_per_replica = parse_milli(r.get(gpus)).ok_or_else(|| r.error("gpus_per_replica is not a number"))?;
        let unit = u64::from(UNIT);
        if milli_per_replica == 0 || (milli_per_replica > unit && milli_per_replica % unit != 0) {
            return Err(r.error("gpus_per_replica must be a whole number of GPUs or a fraction below one"));
        }
        let milli_per_replica = u32::try_from(milli_per_replica).map_err(|_| r.error("gpus_per_replica too large"))?;
        let replicas: u16 = r.parse(replicas)?;
        if replicas == 0 {
            return Err(r.error("replicas must be at least 1"));
        }
        let submit_ms = parse_milli(r.get(submit)).ok_or_else(|| r.error("submit_s is not a number"))?;
        let duration_ms = parse_milli(r.get(duration)).ok_or_else(|| r.error("duration_s is not a number"))?;
        if duration_ms == 0 {
            return Err(r.error("duration_s must be positive"));
        }
        jobs.push(TraceJob {
            team: lookup(&r, team, cluster.teams.iter().map(|t| t.name.as_str()))?,
            class: lookup(&r, class, cluster.classes.iter().map(|c| c.name.as_str()))?,
            replicas,
            milli_per_replica,
            priority: lookup(&r, priority, cluster.priorities.iter().map(|p| p.name.as_str()))?,
            submit_ms: i64::try_from(submit_ms).map_err(|_| r.error("submit_s too large"))?,
            duration_ms: i64::try_from(duration_ms).map_err(|_| r.error("duration_s too large"))?,
            max_runtime_ms: 0,
            template: None,
        });
    }
    for job in &mut jobs {
        job.max_runtime_ms = max_runtime_ms(job.duration_ms);
    }
    jobs.sort_by_key(|j| j.submit_ms);
    Ok(jobs)
}

/// The index of a name in a list, as the id type of that list.
fn lookup<'a, T: TryFrom<usize>>(
    r: &Record<'_>,
    column: usize,
    names: impl Iterator<Item = &'a str>,
) -> Result<T, TraceError> {
    let wanted = r.get(column);
    names
        .into_iter()
        .position(|n| n == wanted)
        .and_then(|i| T::try_from(i).ok())
        .ok_or_else(|| r.error(format!("{}: {wanted:?} is not in the cluster description", r.csv.header[column])))
}

/// A non-negative decimal with at most three decimals, times 1000, exactly (no floating point:
/// `0.1` GPUs must be 100 milli-GPUs, not 99).
fn parse_milli(text: &str) -> Option<u64> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.len() > 3 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: u64 = if whole.is_empty() { 0 } else { whole.parse().ok()? };
    let fraction: u64 = if fraction.is_empty() { 0 } else { format!("{fraction:0<3}").parse().ok()? };
    whole.checked_mul(1000)?.checked_add(fraction)
}

/// The maximum runtime a trace job declares: its duration rounded up to whole hours, doubled,
/// so it is always at least the actual runtime (as users over-ask in practice).
pub fn max_runtime_ms(duration_ms: i64) -> i64 {
    const HOUR_MS: i64 = 3_600_000;
    2 * ((duration_ms.max(1) + HOUR_MS - 1) / HOUR_MS * HOUR_MS)
}

/// Nodes per rack in the Alibaba cluster (the trace has no rack information).
const ALIBABA_NODES_PER_RACK: u32 = 16;
/// The Alibaba trace's one GPU class costs this per GPU-hour, in micro-dollars.
const ALIBABA_RATE_MICROS: i64 = 2_000_000;
/// Reserved quotas add up to this share of the cluster, in thousandths.
const RESERVED_SHARE_MILLI: u64 = 800;

/// Builds the Alibaba v2023 workload from a traces directory (see the module docs).
pub fn alibaba_workload(traces: &Traces) -> Result<Workload, TraceError> {
    let nodes = load_alibaba_nodes(traces)?;
    let pods = load_alibaba_pods(traces, files::ALIBABA_PODS)?;
    let quotas = load_venus_quotas(traces)?;
    if quotas.is_empty() {
        let path = PathBuf::from(files::HELIOS_VENUS_QUOTAS);
        return Err(TraceError::Invalid { path, line: 0, message: "no virtual cluster has a quota".into() });
    }
    let cluster = alibaba_cluster(&nodes, &quotas);
    let jobs = alibaba_jobs(&pods, &quotas);
    Ok(Workload { name: "alibaba-gpu-v2023".into(), cluster, jobs })
}

/// The GPU nodes as one class, racks of 16 consecutive nodes, and the Venus teams.
pub fn alibaba_cluster(nodes: &[AlibabaNode], quotas: &[(String, u32)]) -> Cluster {
    let nodes: Vec<Node> = nodes
        .iter()
        .filter(|n| n.gpus > 0)
        .enumerate()
        .map(|(i, n)| Node {
            name: n.name.clone(),
            class: 0,
            units: n.gpus,
            nvlink_domain_size: 0,
            rack: Some(i as u32 / ALIBABA_NODES_PER_RACK),
            zone: Some(0),
            elastic: false,
            spot: false,
            drivers: Default::default(),
            host: Some(Host { cpu_millis: n.cpu_milli, memory_mib: u32::try_from(n.memory_mib).unwrap_or(u32::MAX) }),
            cluster: 0,
        })
        .collect();
    let capacity: u64 = nodes.iter().map(|n| u64::from(n.units) * u64::from(UNIT)).sum();
    let weights: Vec<u64> = quotas.iter().map(|(_, q)| u64::from(*q)).collect();
    let reserved = apportion(capacity * RESERVED_SHARE_MILLI / 1000, &weights);
    let teams = quotas
        .iter()
        .zip(reserved)
        .map(|((name, _), reserved)| Team {
            name: name.clone(),
            parent: None,
            // May grow to the whole cluster, and lends everything it does not use.
            quotas: BTreeMap::from([(0, Quota { reserved, burst: capacity - reserved, lendable: reserved })]),
            fair_share_weight_milli: 1000,
            usage_history_micros: 0.0,
            hard_budget_left_micros: None,
            soft_budget_left_micros: None,
            hard_budget_left_gpu_milli_ms: None,
        })
        .collect();
    let classes =
        vec![GpuClass { name: "gpu".into(), rate_micros_per_hour: ALIBABA_RATE_MICROS, fraction_milli: 1000 }];
    Cluster { classes, nodes, teams, priorities: default_priorities() }
}

/// Splits `total` in proportion to `weights` by largest remainder (ties to the earlier entry),
/// so the parts add up to `total` exactly and the result is deterministic.
pub fn apportion(total: u64, weights: &[u64]) -> Vec<u64> {
    let sum: u64 = weights.iter().sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let exact: Vec<u128> = weights.iter().map(|&w| u128::from(total) * u128::from(w)).collect();
    let mut parts: Vec<u64> = exact.iter().map(|&e| (e / u128::from(sum)) as u64).collect();
    let left = total - parts.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(exact[i] % u128::from(sum)));
    for &i in order.iter().take(left as usize) {
        parts[i] += 1;
    }
    parts
}

/// The pods that ran on GPUs as jobs, in submission order (see the module docs).
pub fn alibaba_jobs(pods: &[AlibabaPod], quotas: &[(String, u32)]) -> Vec<TraceJob> {
    let cumulative: Vec<u64> = quotas
        .iter()
        .scan(0u64, |sum, (_, q)| {
            *sum += u64::from(*q);
            Some(*sum)
        })
        .collect();
    let mut jobs: Vec<TraceJob> = pods
        .iter()
        .filter_map(|pod| {
            let milli_per_replica = pod.milli_per_replica()?;
            let (submit, deletion, scheduled) = (pod.creation_s?, pod.deletion_s?, pod.scheduled_s?);
            let duration_ms = (deletion - scheduled).max(1) * 1000;
            Some(TraceJob {
                team: team_for(&pod.name, &cumulative),
                class: 0 as ClassId,
                replicas: 1,
                milli_per_replica,
                priority: alibaba_priority(pod.qos.as_deref()),
                submit_ms: submit * 1000,
                duration_ms,
                max_runtime_ms: max_runtime_ms(duration_ms),
                template: Some(format!("cpu={}m,memory={}Mi", pod.cpu_milli, pod.memory_mib)),
            })
        })
        .collect();
    jobs.sort_by_key(|j| j.submit_ms);
    jobs
}

/// Index in [`default_priorities`] for a QoS class: Guaranteed pods are production work,
/// best-effort pods scavenge, the rest are experiments.
fn alibaba_priority(qos: Option<&str>) -> PriorityId {
    match qos {
        Some("Guaranteed") => 1,
        Some("BE") => 3,
        _ => 2,
    }
}

/// A team drawn with probability proportional to its quota, by the pod name's hash.
fn team_for(name: &str, cumulative: &[u64]) -> TeamId {
    let total = cumulative.last().copied().unwrap_or(1);
    // FNV-1a's high bits barely change between names that differ in their last characters
    // (`openb-pod-0001`, `openb-pod-0002`), so they are mixed before multiply-shift maps the
    // hash onto [0, total) without modulo bias.
    let point = ((u128::from(fmix64(fnv1a(name.as_bytes()))) * u128::from(total)) >> 64) as u64;
    cumulative.iter().position(|&c| point < c).unwrap_or(0) as TeamId
}

/// MurmurHash3's 64-bit finaliser: every input bit flips each output bit with probability ½.
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// 64-bit FNV-1a.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn traces() -> Traces {
        Traces::Embedded
    }

    /// The source tree's copies, which `--traces-dir` would read.
    fn data_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/traces")
    }

    #[test]
    fn the_embedded_traces_are_the_published_files() {
        use sha2::Digest as _;
        let readme = std::fs::read_to_string(data_dir().join("README.md")).unwrap();
        for (file, text) in EMBEDDED {
            let digest: String = sha2::Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
            assert!(readme.contains(&format!("{digest}  {file}")), "{file} has sha256 {digest}, not the published one");
            assert_eq!(std::fs::read_to_string(data_dir().join(file)).unwrap(), *text, "{file} differs from its copy");
        }
        assert_eq!(EMBEDDED.len(), readme.matches(".csv\n").count(), "every listed file is built in");
    }

    #[test]
    fn a_traces_directory_is_read_instead_of_the_built_in_copies() {
        let dir = std::env::temp_dir().join(format!("fairway-traces-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("helios-venus")).unwrap();
        std::fs::write(dir.join(files::HELIOS_VENUS_QUOTAS), "date,vcA,vcB,total\n2020-09-28,8,0,8\n").unwrap();
        let quotas = load_venus_quotas(&Traces::from_dir(Some(dir.clone()))).unwrap();
        assert_eq!(quotas, [("vcA".to_owned(), 8)]);
        let missing = load_alibaba_nodes(&Traces::Dir(dir.clone())).unwrap_err();
        assert!(missing.to_string().contains(files::ALIBABA_NODES), "{missing}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_alibaba_node_list_has_1213_nodes_with_6212_gpus() {
        let nodes = load_alibaba_nodes(&traces()).unwrap();
        assert_eq!(nodes.len(), 1213);
        assert_eq!(nodes.iter().map(|n| u32::from(n.gpus)).sum::<u32>(), 6212);
        assert_eq!(
            nodes[0],
            AlibabaNode {
                name: "openb-node-0000".into(),
                cpu_milli: 64000,
                memory_mib: 262144,
                gpus: 2,
                model: "P100".into()
            }
        );
    }

    #[test]
    fn the_default_pod_list_has_8152_pods_with_the_published_mix() {
        let pods = load_alibaba_pods(&traces(), files::ALIBABA_PODS).unwrap();
        assert_eq!(pods.len(), 8152);
        let count = |f: &dyn Fn(&AlibabaPod) -> bool| pods.iter().filter(|p| f(p)).count();
        assert_eq!(count(&|p| p.num_gpu == 0), 1088);
        assert_eq!(count(&|p| p.num_gpu == 8), 44);
        assert_eq!(count(&|p| p.num_gpu == 1 && p.gpu_milli < 1000), 3078);
        assert_eq!(count(&|p| p.scheduled_s.is_none()), 897);
        assert_eq!(count(&|p| p.qos.as_deref() == Some("Guaranteed")), 7);
    }

    #[test]
    fn the_placement_only_lists_load_without_times() {
        for (file, rows) in
            [(files::ALIBABA_MULTIGPU20, 8324), (files::ALIBABA_MULTIGPU50, 9061), (files::ALIBABA_GPUSHARE100, 8152)]
        {
            let pods = load_alibaba_pods(&traces(), file).unwrap();
            assert_eq!(pods.len(), rows, "{file}");
        }
        let multigpu50 = load_alibaba_pods(&traces(), files::ALIBABA_MULTIGPU50).unwrap();
        assert_eq!(multigpu50.iter().filter(|p| p.num_gpu == 8).count(), 556);
        assert!(multigpu50.iter().all(|p| p.creation_s.is_none()));
    }

    #[test]
    fn the_venus_quotas_of_the_last_day_leave_out_empty_virtual_clusters() {
        let quotas = load_venus_quotas(&traces()).unwrap();
        assert_eq!(quotas.len(), 16);
        assert_eq!(quotas.iter().map(|(_, q)| q).sum::<u32>(), 1080);
        assert_eq!(quotas[0], ("vcEwI".to_owned(), 72));
    }

    #[test]
    fn the_alibaba_workload_has_6203_gpu_jobs_and_reserves_80_percent() {
        let workload = alibaba_workload(&traces()).unwrap();
        // 8,152 pods less 1,088 without GPUs and 861 GPU pods never scheduled.
        assert_eq!(workload.jobs.len(), 6203);
        let capacity: u64 = workload.cluster.nodes.iter().map(|n| u64::from(n.units) * 1000).sum();
        assert_eq!(capacity, 6_212_000);
        let reserved: u64 = workload.cluster.teams.iter().map(|t| t.quotas[&0].reserved).sum();
        assert_eq!(reserved, capacity * 8 / 10);
        assert!(workload.jobs.windows(2).all(|w| w[0].submit_ms <= w[1].submit_ms));
        assert!(workload.jobs.iter().all(|j| j.max_runtime_ms >= j.duration_ms));
        // Every team gets jobs in proportion to its quota, within 25%.
        let mut per_team = vec![0usize; workload.cluster.teams.len()];
        workload.jobs.iter().for_each(|j| per_team[j.team as usize] += 1);
        for (team, &count) in workload.cluster.teams.iter().zip(&per_team) {
            let expected = 6203.0 * team.quotas[&0].reserved as f64 / reserved as f64;
            assert!(
                (count as f64 - expected).abs() < 0.25 * expected,
                "{}: {count} jobs, {expected:.0} expected",
                team.name
            );
        }
    }

    #[test]
    fn apportioning_adds_up_exactly_and_favours_the_largest_remainder() {
        assert_eq!(apportion(10, &[1, 1, 1]), [4, 3, 3]);
        assert_eq!(apportion(100, &[1, 2, 7]), [10, 20, 70]);
        assert_eq!(apportion(7, &[0, 0]), [0, 0]);
    }

    #[test]
    fn decimal_gpu_counts_become_exact_milli_units() {
        assert_eq!(parse_milli("0.5"), Some(500));
        assert_eq!(parse_milli("0.1"), Some(100));
        assert_eq!(parse_milli("2"), Some(2000));
        assert_eq!(parse_milli(".25"), Some(250));
        assert_eq!(parse_milli("1.2345"), None);
        assert_eq!(parse_milli("x"), None);
        assert_eq!(parse_milli(""), None);
    }

    #[test]
    fn the_maximum_runtime_is_the_duration_in_whole_hours_doubled() {
        assert_eq!(max_runtime_ms(1), 7_200_000);
        assert_eq!(max_runtime_ms(3_600_000), 7_200_000);
        assert_eq!(max_runtime_ms(3_600_001), 14_400_000);
    }

    #[test]
    fn a_job_trace_resolves_names_and_reports_bad_lines() {
        let cluster = super::super::cluster::parse_cluster(
            "[[classes]]\nname = \"a100\"\nrate_per_gpu_hour = 1.0\n[[nodes]]\nname_prefix = \"n\"\ncount = 1\nclass = \"a100\"\ngpus = 4\n[[teams]]\nname = \"ml\"\nreserved = { a100 = 4 }\n",
        )
        .unwrap();
        let dir = std::env::temp_dir().join(format!("fairway-trace-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("jobs.csv");
        let header = "submit_s,team,gpu_class,replicas,gpus_per_replica,duration_s,priority_class\n";
        std::fs::write(&path, format!("{header}5,ml,a100,2,0.5,60,experiment\n0,ml,a100,1,2,1.5,production\n"))
            .unwrap();
        let jobs = load_job_trace(&path, &cluster).unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!((jobs[0].submit_ms, jobs[0].milli_per_replica, jobs[0].duration_ms), (0, 2000, 1500));
        assert_eq!((jobs[1].replicas, jobs[1].milli_per_replica, jobs[1].priority), (2, 500, 2));

        std::fs::write(&path, format!("{header}0,ml,a100,1,1,60,experiment\n1,nobody,a100,1,1,60,experiment\n"))
            .unwrap();
        let error = load_job_trace(&path, &cluster).unwrap_err().to_string();
        assert!(error.contains("jobs.csv:3:") && error.contains("\"nobody\""), "{error}");

        std::fs::write(&path, format!("{header}0,ml,a100,1,1.5,60,experiment\n")).unwrap();
        assert!(load_job_trace(&path, &cluster).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
