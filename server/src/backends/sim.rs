//! The simulated GPU cluster: the platform's built-in default cluster, and the backend every
//! test and demo runs against. It behaves like a real cluster seen from outside: objects are
//! created, start after a short delay, run for a while and end with an outcome; they can be
//! stopped with a grace period and deleted. Nothing runs: an object's whole timeline is fixed
//! when it is created and its phase at any moment is computed from it ([`phase_at`]).
//!
//! The objects live in table `sim_objects` (see [`crate::db::sim`]) so that the simulation
//! survives a restart of the service, as a real cluster would.
//!
//! # Configuration
//!
//! ```toml
//! cluster = "sim"                # optional: the cluster name objects are filed under
//! speedup = 1.0                  # optional: run, checkpoint and maximum runtimes are divided by it
//! default_runtime_seconds = 60   # optional: run time of a job without a hint
//! start_delay_ms = 200           # optional: real time from creation to start (not scaled)
//!
//! [[class]]                      # GPU classes the inventory uses (the control loop creates
//! name = "h100-80gb"             # missing ones in the catalogue)
//! kind = "whole"                 # whole | mig | time-slice
//! memory_mib = 81920
//! fraction_milli = 1000          # optional for whole GPUs; share of a GPU in thousandths
//!
//! [[node]]
//! name = "rack1-node1"
//! gpu_class = "h100-80gb"
//! gpus = 8                       # 1..=64
//! nvlink_domain_size = 8         # optional, default 0 = the whole node is one domain
//! rack = "rack-1"                # optional
//! zone = "zone-a"                # optional
//! driver_version = "550.90.07"   # optional: the NVIDIA driver its GPUs run
//! cuda_version = "12.4"          # optional: the CUDA version that driver supports
//! cpus = 96                      # optional: cores it gives replicas beside its GPUs
//! memory_gib = 1024              # optional: memory it gives them; both are counted by placement
//!
//! [[pool]]                       # an elastic cloud pool without topology
//! name = "cloud-h100"
//! gpu_class = "h100-80gb"
//! max_gpus = 32                  # 1..=64
//! spot = false                   # optional: spot capacity, only for jobs that allow spot
//! price_per_gpu_hour = 6.5       # optional: metered at this price instead of the rate card
//! driver_version = "550.90.07"   # optional, as for a node: its instances' driver
//! cuda_version = "12.4"          # optional
//! ```
//!
//! A cluster whose inventory is a file ([`SimBackend::following`]) follows it while it runs:
//! nodes added to the file join at the next inventory read, as an autoscaler's nodes join a
//! real cluster, and nodes taken out of it leave.
//!
//! A node that declares `cpus` or `memory_gib` must have one entry (one class): the engine
//! holds each class's GPUs of a node apart, so a split node would offer them twice.
//!
//! A MIG-partitioned node is several `[[node]]` entries with the same name, one per MIG
//! class. The built-in inventory (`sim_default.toml`, [`SimConfig::default`]) has two racks
//! of four 8×H100 nodes, a whole 8×A100 node, an 8×A100 node split into 16 3g.40gb and 8
//! 1g.10gb MIG slices, and an elastic pool of up to 32 L4.
//!
//! # What a job does
//!
//! The job's environment steers the simulation, so tests and demos can ask for any outcome:
//!
//! | variable | meaning | default |
//! | --- | --- | --- |
//! | `FAIRWAY_SIM_RUNTIME_SECONDS` | run time until the application exits | `default_runtime_seconds` |
//! | `FAIRWAY_SIM_EXIT_CODE` | its exit code (0 = success) | 0 |
//! | `FAIRWAY_SIM_LOSE_NODE_AFTER_SECONDS` | a node of the gang disappears after this long | never |
//! | `FAIRWAY_SIM_CHECKPOINT_SECONDS` | time to checkpoint and exit after SIGTERM | 1 |
//! | `FAIRWAY_SIM_LOG_EVERY_SECONDS` | a progress line per replica this often (0: none) | 10 |
//! | `FAIRWAY_SIM_FAIL_MESSAGE` | the error a failing job prints before a non-zero exit | a CUDA error |
//! | `FAIRWAY_SIM_FAIL_TASKS` | array tasks (indices) or service replicas (slots), comma-separated, whose first attempt exits 1 | none |
//! | `FAIRWAY_SIM_GPU_UTIL` | its GPUs' utilisation while it runs, percent | 90 |
//! | `FAIRWAY_SIM_SM_ACTIVE` | its GPUs' SM activity, percent | 0.9 × the utilisation |
//! | `FAIRWAY_SIM_TENSOR_ACTIVE` | its GPUs' tensor-core activity, percent | 0.5 × the utilisation |
//! | `FAIRWAY_SIM_GPU_MEMORY_MIB` | memory used on each of its GPUs, MiB | 70% of the class's memory |
//! | `FAIRWAY_SIM_XID` | an XID the first GPU of its first replica reports in its first attempt (`DCGM_FI_DEV_XID_ERRORS`); the job hangs on, as a gang whose GPU failed does | none |
//! | `FAIRWAY_SIM_XID_AFTER_SECONDS` | when, after its start | 0 |
//!
//! The cluster publishes what its GPUs do as NVIDIA's dcgm-exporter does, with the same
//! field names and labels ([`dcgm_exposition`], served on `FAIRWAY_SIM_DCGM_LISTEN`), so a
//! Prometheus server can scrape it and Fairway read job activity from there as it would on
//! a real cluster.
//!
//! Each replica writes a log as a training job does ([`log_lines`]): where it runs and from
//! which step, a progress line (step, loss, throughput) every `FAIRWAY_SIM_LOG_EVERY_SECONDS`,
//! what it does on SIGTERM, and how it ends (a traceback with the failure message before a
//! non-zero exit). Like the phase, the log is a function of the stored object and the clock.
//!
//! Every duration (these and the job's maximum runtime) is divided by `speedup`; the start
//! delay and a stop's grace period are real time.

use std::{
    collections::{BTreeSet, HashMap},
    path::{Path, PathBuf},
    str::FromStr,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use chrono::{DateTime, TimeDelta, Utc};
use serde::Deserialize;
use sqlx::PgPool;

use super::{Backend, BackendError, ClassDecl, Gang, InventoryNode, LogLine, LogQuery, ObjectStatus, Outcome, Phase};
use crate::{
    db::{
        self,
        sim::{NewSimObject, SimObjectRow},
    },
    domain::{GpuClassName, GpuKind},
};

/// The built-in inventory, used by [`SimConfig::default`].
pub const DEFAULT_INVENTORY: &str = include_str!("sim_default.toml");

/// Run time of a job, in (unscaled) seconds.
pub const RUNTIME_HINT: &str = "FAIRWAY_SIM_RUNTIME_SECONDS";
/// Exit code of a job at the end of its run time.
pub const EXIT_CODE_HINT: &str = "FAIRWAY_SIM_EXIT_CODE";
/// Seconds after the start when a node of the gang is lost.
pub const LOSE_NODE_HINT: &str = "FAIRWAY_SIM_LOSE_NODE_AFTER_SECONDS";
/// Seconds a job takes to checkpoint and exit after SIGTERM.
pub const CHECKPOINT_HINT: &str = "FAIRWAY_SIM_CHECKPOINT_SECONDS";
/// Seconds between two progress lines of a replica's log; 0 for none.
pub const LOG_EVERY_HINT: &str = "FAIRWAY_SIM_LOG_EVERY_SECONDS";
/// The error a job that exits non-zero prints last.
pub const FAIL_MESSAGE_HINT: &str = "FAIRWAY_SIM_FAIL_MESSAGE";
/// Array tasks whose first attempt fails: a retry of one then runs as the others do.
pub const FAIL_TASKS_HINT: &str = "FAIRWAY_SIM_FAIL_TASKS";
/// Utilisation of a job's GPUs while it runs, percent.
pub const GPU_UTIL_HINT: &str = "FAIRWAY_SIM_GPU_UTIL";
/// SM activity of a job's GPUs, percent.
pub const SM_ACTIVE_HINT: &str = "FAIRWAY_SIM_SM_ACTIVE";
/// Tensor-core activity of a job's GPUs, percent.
pub const TENSOR_ACTIVE_HINT: &str = "FAIRWAY_SIM_TENSOR_ACTIVE";
/// Memory a job uses on each of its GPUs, MiB.
pub const GPU_MEMORY_HINT: &str = "FAIRWAY_SIM_GPU_MEMORY_MIB";
/// The label the simulated cloud pool's GPUs carry their batch job's name in
/// (`fw-<job>-<attempt>`), as a cloud scrape's relabelling would set it from the job's tags;
/// they carry no pod labels.
pub const POOL_OBJECT_LABEL: &str = "batch_job";
/// The label with the replica's index (a multi-node job's node index) on those GPUs.
pub const POOL_REPLICA_LABEL: &str = "batch_node_index";
/// An XID the first GPU of the job's first replica reports while its first attempt runs, as
/// DCGM does.
pub const XID_HINT: &str = "FAIRWAY_SIM_XID";
/// Seconds after the start when that GPU reports the XID; 0 by default.
pub const XID_AFTER_HINT: &str = "FAIRWAY_SIM_XID_AFTER_SECONDS";
const DEFAULT_GPU_UTIL_PCT: f64 = 90.0;

const DEFAULT_LOG_EVERY_SECONDS: f64 = 10.0;
const DEFAULT_FAIL_MESSAGE: &str = "CUDA error: an illegal memory access was encountered";

const DEFAULT_CHECKPOINT_SECONDS: f64 = 1.0;
const MAX_GPUS_PER_NODE: u32 = 64;

/// A simulated cluster's settings and inventory. Build it with [`SimConfig::from_toml`],
/// [`SimConfig::load`] or [`SimConfig::default`]; deserializing it validates it the same way.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "SimConfigFile")]
pub struct SimConfig {
    /// The cluster name the objects are filed under in `sim_objects`.
    pub cluster: String,
    /// Simulated durations are divided by this; must be positive and finite.
    pub speedup: f64,
    /// Run time of a job without a runtime hint, before the speed-up.
    pub default_runtime_seconds: f64,
    /// Real time from an object's creation to its start.
    pub start_delay_ms: u64,
    classes: Vec<SimGpuClass>,
    inventory: Vec<InventoryNode>,
}

/// A GPU class the simulated inventory uses.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimGpuClass {
    pub name: String,
    pub kind: GpuKind,
    pub memory_mib: i32,
    /// Share of one physical GPU in thousandths: 1000 for a whole GPU.
    #[serde(default = "whole_gpu")]
    pub fraction_milli: i32,
}

fn whole_gpu() -> i32 {
    1000
}

/// The configuration file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SimConfigFile {
    #[serde(default = "default_cluster")]
    cluster: String,
    #[serde(default = "default_speedup")]
    speedup: f64,
    #[serde(default = "default_runtime_seconds")]
    default_runtime_seconds: f64,
    #[serde(default = "default_start_delay_ms")]
    start_delay_ms: u64,
    #[serde(default)]
    class: Vec<SimGpuClass>,
    #[serde(default)]
    node: Vec<NodeEntry>,
    #[serde(default)]
    pool: Vec<PoolEntry>,
}

fn default_cluster() -> String {
    "sim".into()
}
fn default_speedup() -> f64 {
    1.0
}
fn default_runtime_seconds() -> f64 {
    60.0
}
fn default_start_delay_ms() -> u64 {
    200
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeEntry {
    name: String,
    gpu_class: String,
    gpus: u32,
    #[serde(default)]
    nvlink_domain_size: u32,
    rack: Option<String>,
    zone: Option<String>,
    driver_version: Option<String>,
    cuda_version: Option<String>,
    /// Cores the node gives to replicas beside its GPUs (decimals allowed); none: not counted.
    cpus: Option<f64>,
    /// Memory it gives to replicas, in GiB; none: not counted.
    memory_gib: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolEntry {
    name: String,
    gpu_class: String,
    max_gpus: u32,
    #[serde(default)]
    spot: bool,
    price_per_gpu_hour: Option<f64>,
    driver_version: Option<String>,
    cuda_version: Option<String>,
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SimConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    /// A key has a bad value, is unknown or is missing.
    #[error("{key}: {message}")]
    Invalid {
        /// Where, e.g. `node[3].gpus` (indices count from 0), or `line N` for a syntax error.
        key: String,
        message: String,
    },
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> SimConfigError {
    SimConfigError::Invalid { key: key.into(), message: message.into() }
}

impl SimConfig {
    /// Parses and validates a configuration.
    pub fn from_toml(text: &str) -> Result<Self, SimConfigError> {
        let file: SimConfigFile = serde_path_to_error::deserialize(toml::Deserializer::new(text)).map_err(|err| {
            let path = err.path().to_string();
            let inner = err.into_inner();
            // Some TOML syntax errors carry no words, only their position.
            let message = match inner.message().trim() {
                "" => "not valid TOML".to_owned(),
                words => words.to_owned(),
            };
            let line = inner.span().map(|span| line_of(text, span.start));
            // serde reports a missing key at its parent's path: name the key itself.
            let missing = message.starts_with("missing field").then(|| message.split('`').nth(1)).flatten();
            let key = match (missing, path.as_str()) {
                (Some(key), "." | "") => key.to_owned(),
                (Some(key), parent) => format!("{parent}.{key}"),
                (None, "." | "") => line.map_or_else(|| "configuration".to_owned(), |l| format!("line {l}")),
                (None, path) => path.to_owned(),
            };
            let message = match line {
                Some(line) if !key.starts_with("line ") => format!("{message} (line {line})"),
                _ => message,
            };
            invalid(key, message)
        })?;
        Self::try_from(file)
    }

    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Self, SimConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| SimConfigError::Read { path: path.to_owned(), source })?;
        Self::from_toml(&text)
    }

    /// The GPU classes the inventory uses.
    pub fn classes(&self) -> &[SimGpuClass] {
        &self.classes
    }

    /// The nodes and pools, one entry per node and GPU class.
    pub fn inventory(&self) -> &[InventoryNode] {
        &self.inventory
    }
}

impl Default for SimConfig {
    /// The built-in cluster.
    fn default() -> Self {
        // Cannot fail: the embedded inventory is a constant, and a unit test parses it.
        Self::from_toml(DEFAULT_INVENTORY).expect("the embedded default inventory is valid")
    }
}

impl TryFrom<SimConfigFile> for SimConfig {
    type Error = SimConfigError;

    fn try_from(file: SimConfigFile) -> Result<Self, SimConfigError> {
        if file.cluster.trim().is_empty() {
            return Err(invalid("cluster", "must not be empty"));
        }
        if !(file.speedup.is_finite() && file.speedup > 0.0) {
            return Err(invalid("speedup", "must be a positive number"));
        }
        if !(file.default_runtime_seconds.is_finite() && file.default_runtime_seconds >= 0.0) {
            return Err(invalid("default_runtime_seconds", "must be a non-negative number"));
        }
        let classes = check_classes(&file.class)?;
        let mut inventory = Vec::with_capacity(file.node.len() + file.pool.len());
        // A node name may repeat (a MIG-partitioned node has an entry per profile), but a
        // node offers each class once.
        let mut seen = BTreeSet::new();
        for (i, node) in file.node.iter().enumerate() {
            let key = |field: &str| format!("node[{i}].{field}");
            check_name(&key("name"), &node.name)?;
            let class = classes.get(node.gpu_class.as_str()).ok_or_else(|| {
                invalid(key("gpu_class"), format!("class {:?} is not declared in a [[class]]", node.gpu_class))
            })?;
            let gpus = check_gpus(&key("gpus"), node.gpus)?;
            if node.nvlink_domain_size != 0 && u32::from(gpus) % node.nvlink_domain_size != 0 {
                return Err(invalid(key("nvlink_domain_size"), "must divide gpus (or be 0: the whole node)"));
            }
            if !seen.insert((node.name.as_str(), class.name.as_str())) {
                return Err(invalid(key("name"), format!("node {:?} lists class {:?} twice", node.name, class.name)));
            }
            inventory.push(InventoryNode {
                name: node.name.clone(),
                gpu_class: class.name.clone(),
                gpus,
                // Checked above: it divides gpus, which is at most 64.
                nvlink_domain_size: node.nvlink_domain_size as u8,
                rack: node.rack.clone(),
                zone: node.zone.clone(),
                elastic: false,
                spot: false,
                price_micros_per_gpu_hour: None,
                driver_version: check_version(&key("driver_version"), &node.driver_version)?,
                cuda_version: check_version(&key("cuda_version"), &node.cuda_version)?,
                cpu_millis: match node.cpus {
                    Some(c) if c.is_finite() && (0.0..=1_000_000.0).contains(&c) => Some((c * 1000.0).round() as u32),
                    Some(_) => return Err(invalid(key("cpus"), "must be a number of cores from 0 to 1000000")),
                    None => None,
                },
                memory_mib: match node.memory_gib {
                    Some(g) if g <= 1024 * 1024 => Some(g * 1024),
                    Some(_) => return Err(invalid(key("memory_gib"), "must be at most 1048576 (1 PiB)")),
                    None => None,
                },
            });
        }
        // A node's CPU and memory belong to one class's entry: the engine holds each class's
        // GPUs of a node apart, so a node split across classes would offer them twice.
        for (i, node) in file.node.iter().enumerate() {
            let split = file.node.iter().filter(|n| n.name == node.name).count() > 1;
            if split && (node.cpus.is_some() || node.memory_gib.is_some()) {
                return Err(invalid(
                    format!("node[{i}].cpus"),
                    format!(
                        "node {:?} lists several classes: cpus and memory_gib apply to one-class nodes only",
                        node.name
                    ),
                ));
            }
        }
        for (i, pool) in file.pool.iter().enumerate() {
            let key = |field: &str| format!("pool[{i}].{field}");
            check_name(&key("name"), &pool.name)?;
            let class = classes.get(pool.gpu_class.as_str()).ok_or_else(|| {
                invalid(key("gpu_class"), format!("class {:?} is not declared in a [[class]]", pool.gpu_class))
            })?;
            let gpus = check_gpus(&key("max_gpus"), pool.max_gpus)?;
            if !seen.insert((pool.name.as_str(), class.name.as_str())) {
                return Err(invalid(key("name"), format!("{:?} offers class {:?} twice", pool.name, class.name)));
            }
            let price = match pool.price_per_gpu_hour {
                Some(p) if p.is_finite() && (0.0..1e6).contains(&p) => Some((p * 1_000_000.0).round() as i64),
                Some(_) => return Err(invalid(key("price_per_gpu_hour"), "must be a price from 0 to 1000000")),
                None => None,
            };
            inventory.push(InventoryNode {
                name: pool.name.clone(),
                gpu_class: class.name.clone(),
                gpus,
                nvlink_domain_size: 0,
                rack: None,
                zone: None,
                elastic: true,
                spot: pool.spot,
                price_micros_per_gpu_hour: price,
                driver_version: check_version(&key("driver_version"), &pool.driver_version)?,
                cuda_version: check_version(&key("cuda_version"), &pool.cuda_version)?,
                cpu_millis: None,
                memory_mib: None,
            });
        }
        Ok(Self {
            cluster: file.cluster,
            speedup: file.speedup,
            default_runtime_seconds: file.default_runtime_seconds,
            start_delay_ms: file.start_delay_ms,
            classes: file.class,
            inventory,
        })
    }
}

/// Checks the classes; returns them by name.
fn check_classes(classes: &[SimGpuClass]) -> Result<HashMap<&str, &SimGpuClass>, SimConfigError> {
    let mut by_name = HashMap::new();
    for (i, class) in classes.iter().enumerate() {
        let key = |field: &str| format!("class[{i}].{field}");
        GpuClassName::parse("name", &class.name).map_err(|e| invalid(key("name"), e.message))?;
        if class.memory_mib <= 0 {
            return Err(invalid(key("memory_mib"), "must be positive"));
        }
        if !(1..=1000).contains(&class.fraction_milli) {
            return Err(invalid(key("fraction_milli"), "must be between 1 and 1000"));
        }
        // The catalogue's rule: a whole GPU is exactly one GPU, anything else a fraction.
        if (class.kind == GpuKind::Whole) != (class.fraction_milli == 1000) {
            return Err(invalid(key("fraction_milli"), "is 1000 for a whole GPU and below 1000 otherwise"));
        }
        if by_name.insert(class.name.as_str(), class).is_some() {
            return Err(invalid(key("name"), format!("class {:?} is declared twice", class.name)));
        }
    }
    Ok(by_name)
}

fn check_name(key: &str, name: &str) -> Result<(), SimConfigError> {
    if name.trim().is_empty() || name.chars().any(char::is_control) {
        return Err(invalid(key, "must be a non-empty name without control characters"));
    }
    Ok(())
}

fn check_gpus(key: &str, gpus: u32) -> Result<u8, SimConfigError> {
    match u8::try_from(gpus) {
        Ok(n) if (1..=MAX_GPUS_PER_NODE).contains(&gpus) => Ok(n),
        _ => Err(invalid(key, format!("must be between 1 and {MAX_GPUS_PER_NODE}"))),
    }
}

/// A driver or CUDA version as written, refused unless it reads as one.
fn check_version(key: &str, version: &Option<String>) -> Result<Option<String>, SimConfigError> {
    match version {
        Some(v) => match v.parse::<crate::domain::driver::Version>() {
            Ok(_) => Ok(Some(v.clone())),
            Err(e) => Err(invalid(key, e.to_string())),
        },
        None => Ok(None),
    }
}

/// 1-based line number of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1
}

/// The simulated cluster behind the [`Backend`] trait.
#[derive(Debug, Clone)]
pub struct SimBackend {
    pub pool: PgPool,
    /// The configuration it started with; its nodes may since have changed (see
    /// [`SimBackend::following`]).
    pub config: SimConfig,
    /// The nodes it has now.
    nodes: Arc<LiveNodes>,
}

/// A simulated cluster's nodes, re-read from its inventory file whenever the file changes,
/// as nodes join a real cluster when an autoscaler adds them or leave when they are removed.
#[derive(Debug, Default)]
struct LiveNodes {
    /// The file followed; `None`: the nodes never change.
    path: Option<PathBuf>,
    /// The file's modification time when last read, and the nodes read then.
    read: Mutex<(Option<SystemTime>, Option<Vec<InventoryNode>>)>,
}

impl SimBackend {
    /// A simulated cluster keeping its objects in `pool`.
    pub fn new(pool: PgPool, config: SimConfig) -> Self {
        Self { pool, config, nodes: Arc::default() }
    }

    /// The same, following its inventory file at `path`: nodes added to the file join the
    /// cluster at its next inventory read, and nodes taken out leave it. A file that no longer
    /// reads as a valid configuration is ignored, with a warning, until it does again.
    pub fn following(mut self, path: PathBuf) -> Self {
        let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        self.nodes = Arc::new(LiveNodes { path: Some(path), read: Mutex::new((modified, None)) });
        self
    }

    /// Its configuration with the nodes it has now.
    fn current(&self) -> SimConfig {
        let Some(path) = &self.nodes.path else { return self.config.clone() };
        let mut read = self.nodes.read.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        if modified.is_some() && modified != read.0 {
            read.0 = modified;
            match SimConfig::load(path) {
                Ok(changed) => read.1 = Some(changed.inventory),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "the changed sim inventory is not valid; its nodes stay as they were");
                }
            }
        }
        match &read.1 {
            Some(nodes) => SimConfig { inventory: nodes.clone(), ..self.config.clone() },
            None => self.config.clone(),
        }
    }
}

#[async_trait::async_trait]
impl Backend for SimBackend {
    fn kind(&self) -> &'static str {
        "sim"
    }

    /// A name in the simulated cluster's own domain: nothing listens there, but it is where
    /// a real cluster's Service would be, one per service and cluster.
    fn endpoint(&self, team: &str, service: &super::ServiceBinding) -> Result<String, BackendError> {
        Ok(format!("{}.{team}.{}.sim.fairway.internal:{}", service.name, self.config.cluster, service.port))
    }

    fn declared_classes(&self) -> Vec<ClassDecl> {
        self.config
            .classes
            .iter()
            .map(|c| ClassDecl {
                name: c.name.clone(),
                kind: c.kind.as_str().to_owned(),
                memory_mib: c.memory_mib,
                fraction_milli: c.fraction_milli,
            })
            .collect()
    }

    async fn inventory(&self) -> Result<Vec<InventoryNode>, BackendError> {
        Ok(self.current().inventory)
    }

    async fn submit(&self, gang: &Gang) -> Result<(), BackendError> {
        let object = plan_object(gang, &self.current(), Utc::now())?;
        let created = db::sim::insert_many(&self.pool, std::slice::from_ref(&object)).await? > 0;
        tracing::debug!(
            object = %gang.object,
            job.id = %gang.job_id,
            created,
            run_ms = object.run_ms,
            "sim object submitted"
        );
        Ok(())
    }

    async fn submit_many(&self, gangs: &[Gang], each_within: Duration) -> Vec<Result<(), BackendError>> {
        let now = Utc::now();
        // Each gang's refusal, if the plan refused it; the others are created together.
        let mut objects: Vec<NewSimObject> = Vec::with_capacity(gangs.len());
        let mut refused: Vec<Option<BackendError>> = Vec::with_capacity(gangs.len());
        let config = self.current();
        for gang in gangs {
            match plan_object(gang, &config, now) {
                Ok(object) => {
                    objects.push(object);
                    refused.push(None);
                }
                Err(e) => refused.push(Some(e)),
            }
        }
        let inserted = if objects.is_empty() {
            Ok(0)
        } else {
            super::within(each_within, async { Ok(db::sim::insert_many(&self.pool, &objects).await?) }).await
        };
        tracing::debug!(asked = gangs.len(), planned = objects.len(), inserted = ?inserted, "sim objects submitted");
        refused
            .into_iter()
            .map(|refused| match (refused, &inserted) {
                (Some(refused), _) => Err(refused),
                (None, Ok(_)) => Ok(()),
                (None, Err(e)) => Err(e.clone()),
            })
            .collect()
    }

    async fn stop(&self, object: &str, grace: Duration) -> Result<(), BackendError> {
        let grace_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
        let found = db::sim::request_stop(&self.pool, &self.config.cluster, object, Utc::now(), grace_ms).await?;
        tracing::debug!(object, found, grace_ms, "sim object stop requested");
        Ok(())
    }

    async fn objects(&self) -> Result<Vec<ObjectStatus>, BackendError> {
        let now = Utc::now();
        let rows = db::sim::list(&self.pool, &self.config.cluster).await?;
        Ok(rows
            .into_iter()
            .map(|row| {
                let (phase, stop_requested) = phase_at(&row, now);
                let next_change = match phase {
                    Phase::Finished { .. } => None,
                    _ => next_change(&row, now),
                };
                ObjectStatus {
                    object: row.name,
                    job_id: row.job_id,
                    attempt: row.attempt,
                    phase,
                    stop_requested,
                    next_change,
                }
            })
            .collect())
    }

    async fn logs(&self, query: &LogQuery) -> Result<Vec<LogLine>, BackendError> {
        let Some((row, spec)) = db::sim::find(&self.pool, &self.config.cluster, &query.object).await? else {
            return Ok(Vec::new());
        };
        let Some(log) = SimLog::of(&row, &spec, query.replica) else { return Ok(Vec::new()) };
        Ok(log_lines(&row, &log, Utc::now(), query.since, query.limit))
    }

    async fn logs_many(&self, queries: &[LogQuery], each_within: Duration) -> Vec<Result<Vec<LogLine>, BackendError>> {
        let names: Vec<&str> = queries.iter().map(|q| q.object.as_str()).collect();
        let found = super::within(each_within, async {
            Ok(db::sim::find_many(&self.pool, &self.config.cluster, &names).await?)
        });
        let found = match found.await {
            Ok(found) => found,
            Err(e) => return queries.iter().map(|_| Err(e.clone())).collect(),
        };
        let by_name: HashMap<&str, &(db::sim::SimObjectRow, serde_json::Value)> =
            found.iter().map(|found| (found.0.name.as_str(), found)).collect();
        let now = Utc::now();
        queries
            .iter()
            .map(|query| {
                let Some((row, spec)) = by_name.get(query.object.as_str()) else { return Ok(Vec::new()) };
                let Some(log) = SimLog::of(row, spec, query.replica) else { return Ok(Vec::new()) };
                Ok(log_lines(row, &log, now, query.since, query.limit))
            })
            .collect()
    }

    async fn delete(&self, object: &str) -> Result<(), BackendError> {
        let found = db::sim::delete(&self.pool, &self.config.cluster, object).await?;
        tracing::debug!(object, found, "sim object deleted");
        Ok(())
    }

    async fn delete_all(&self, objects: &[String]) -> Result<(), BackendError> {
        let deleted = db::sim::delete_all(&self.pool, &self.config.cluster, objects).await?;
        tracing::debug!(asked = objects.len(), deleted, "sim objects deleted");
        Ok(())
    }
}

/// The object `gang` becomes when submitted at `now`: its placement checked against the
/// inventory, its hints read and every duration scaled, so that the stored row alone decides
/// its future ([`phase_at`]).
pub fn plan_object(gang: &Gang, config: &SimConfig, now: DateTime<Utc>) -> Result<NewSimObject, BackendError> {
    if !(config.speedup.is_finite() && config.speedup > 0.0) {
        return Err(BackendError::Rejected(format!("the sim speedup {} is not a positive number", config.speedup)));
    }
    xid_hint(gang, config.speedup)?;
    check_placement(gang, config)?;
    let runtime_hint = duration_hint(gang, RUNTIME_HINT)?;
    let runtime = runtime_hint.unwrap_or(config.default_runtime_seconds);
    let mut exit_code = hint::<i32>(gang, EXIT_CODE_HINT)?.unwrap_or(0);
    if exit_code == 0 && gang.attempt <= 1 && fails_as_task(gang)? {
        exit_code = 1;
    }
    // A service's replica serves until it is stopped, unless it was told to end (or named
    // to fail, after the default run time).
    let serves = gang.service.is_some() && exit_code == 0 && runtime_hint.is_none();
    let lose_node_after = duration_hint(gang, LOSE_NODE_HINT)?;
    let checkpoint = duration_hint(gang, CHECKPOINT_HINT)?.unwrap_or(DEFAULT_CHECKPOINT_SECONDS);
    GpuActivity::of(gang, 0)?;
    let log_every = duration_hint(gang, LOG_EVERY_HINT)?.unwrap_or(DEFAULT_LOG_EVERY_SECONDS);
    let scale = |seconds: f64| scaled_ms(seconds, config.speedup);
    let deadline_ms = gang.service.is_none().then(|| scale(gang.max_runtime.as_secs_f64()));
    let start_delay_ms = i64::try_from(config.start_delay_ms).unwrap_or(i64::MAX);
    let gang_json = serde_json::to_value(gang)
        .map_err(|e| BackendError::Rejected(format!("the gang cannot be stored as JSON: {e}")))?;
    let spec = serde_json::json!({
        "gang": gang_json,
        "speedup": config.speedup,
        "start_delay_ms": start_delay_ms,
        "deadline_ms": deadline_ms,
        // At least a millisecond apart: a speed-up must not turn a log into a flood.
        "log_every_ms": if log_every > 0.0 { scaled_ms(log_every, config.speedup).max(1) } else { 0 },
        "fail_message": gang.env.get(FAIL_MESSAGE_HINT).map_or(DEFAULT_FAIL_MESSAGE, String::as_str),
    });
    Ok(NewSimObject {
        name: gang.object.clone(),
        cluster: config.cluster.clone(),
        job_id: gang.job_id,
        attempt: gang.attempt,
        spec,
        created_at: now,
        // Uncapped: `phase_at` ends the run at the deadline when that comes first, and must
        // be able to tell the two apart.
        run_ms: if serves { SERVES_FOR_MS } else { scale(runtime) },
        exit_code,
        lost_after_ms: lose_node_after.map(scale),
        checkpoint_ms: scale(checkpoint),
    })
}

/// What a running job's GPUs do, from its environment (the `FAIRWAY_SIM_GPU_*` hints).
#[derive(Debug, Clone, Copy, PartialEq)]
struct GpuActivity {
    util_pct: f64,
    sm_pct: f64,
    tensor_pct: f64,
    memory_mib: i64,
}

impl GpuActivity {
    /// The gang's activity on GPUs of `memory_mib`; a hint out of range is refused.
    fn of(gang: &Gang, memory_mib: i64) -> Result<Self, BackendError> {
        let percent = |name: &str| match hint::<f64>(gang, name)? {
            Some(p) if !(0.0..=100.0).contains(&p) => {
                Err(BackendError::Rejected(format!("{name} must be a percentage between 0 and 100")))
            }
            other => Ok(other),
        };
        let util_pct = percent(GPU_UTIL_HINT)?.unwrap_or(DEFAULT_GPU_UTIL_PCT);
        let memory = match hint::<i64>(gang, GPU_MEMORY_HINT)? {
            Some(m) if m < 0 => return Err(BackendError::Rejected(format!("{GPU_MEMORY_HINT} must not be negative"))),
            Some(m) => m,
            None => memory_mib * 7 / 10,
        };
        Ok(Self {
            util_pct,
            sm_pct: percent(SM_ACTIVE_HINT)?.unwrap_or(util_pct * 0.9),
            tensor_pct: percent(TENSOR_ACTIVE_HINT)?.unwrap_or(util_pct * 0.5),
            memory_mib: if memory_mib > 0 { memory.min(memory_mib) } else { memory },
        })
    }
}

/// The simulated clusters' GPUs as dcgm-exporter publishes them at `now`, in Prometheus's
/// text format: each field of [`super::dcgm::FIELDS`] for every GPU of the inventories'
/// nodes (and of the cloud pools' GPUs in use), with dcgm-exporter's labels; a GPU a
/// running replica holds on a node also carries the pod's `namespace` (the team), `pod` and
/// `container`, as the exporter adds on Kubernetes, and one of a cloud pool its batch job's
/// name and node index ([`POOL_OBJECT_LABEL`], [`POOL_REPLICA_LABEL`]), as a cloud scrape's
/// relabelling sets them from tags.
pub async fn dcgm_exposition(clusters: &[SimBackend], now: DateTime<Utc>) -> Result<String, BackendError> {
    use std::fmt::Write as _;

    use super::dcgm::{FB_FREE, FB_USED, GPU_UTIL, SM_ACTIVE, TENSOR_ACTIVE};
    use crate::domain::gpu_health::{ROW_REMAP_FAILURE, XID_ERRORS};
    /// One GPU: its node, class, unit, memory, UUID and what holds it.
    struct SimGpu {
        node: String,
        class: String,
        unit: u8,
        memory_mib: i64,
        uuid: String,
        held: Option<(String, String, GpuActivity)>,
        /// The last XID it reported: 0 for none, as DCGM has it.
        xid: u32,
        /// Of an elastic cloud pool: labelled by batch job, not by pod.
        pool: bool,
    }
    let mut gpus = Vec::new();
    for backend in clusters {
        let config = &backend.current();
        let rows = db::sim::list(&backend.pool, &config.cluster).await?;
        let started: HashMap<&str, DateTime<Utc>> = rows
            .iter()
            .filter_map(|r| match phase_at(r, now) {
                (Phase::Running { started_at }, false) => Some((r.name.as_str(), started_at)),
                _ => None,
            })
            .collect();
        let running: Vec<&str> = started.keys().copied().collect();
        let memory_of =
            |class: &str| config.classes.iter().find(|c| c.name == class).map_or(0, |c| i64::from(c.memory_mib));
        // (node, unit) → (pod, team, activity)
        let mut held: HashMap<(String, u8), (String, String, GpuActivity)> = HashMap::new();
        // (node, unit) → the XID it reports
        let mut xids: HashMap<(String, u8), u32> = HashMap::new();
        for (row, spec) in db::sim::find_many(&backend.pool, &config.cluster, &running).await? {
            let Ok(gang) = serde_json::from_value::<Gang>(spec["gang"].clone()) else { continue };
            let Ok(activity) = GpuActivity::of(&gang, memory_of(&gang.gpu_class)) else { continue };
            // Its first attempt's: the retry, elsewhere, runs on healthy GPUs.
            if let (Ok(Some((xid, after_ms))), Some(first), Some(&started_at), true) = (
                xid_hint(&gang, config.speedup),
                gang.replicas.first(),
                started.get(row.name.as_str()),
                gang.attempt <= 1,
            ) {
                if let (Some(&unit), true) = (first.gpus.first(), (now - started_at).num_milliseconds() >= after_ms) {
                    xids.insert((first.node.clone(), unit), xid);
                }
            }
            for (rank, slot) in gang.replicas.iter().enumerate() {
                for unit in &slot.gpus {
                    let pod = format!("{}-{rank}", gang.object);
                    held.insert((slot.node.clone(), *unit), (pod, gang.team.clone(), activity));
                }
            }
        }
        let mut units: BTreeSet<(String, String, u8)> = config
            .inventory
            .iter()
            .filter(|n| !n.elastic)
            .flat_map(|n| (0..n.gpus).map(move |u| (n.name.clone(), n.gpu_class.clone(), u)))
            .collect();
        for (node, unit) in held.keys() {
            if let Some(n) = config.inventory.iter().find(|n| &n.name == node && n.elastic) {
                units.insert((node.clone(), n.gpu_class.clone(), *unit));
            }
        }
        for (node, class, unit) in units {
            let pool = config.inventory.iter().any(|n| n.name == node && n.elastic);
            gpus.push(SimGpu {
                pool,
                memory_mib: memory_of(&class),
                uuid: gpu_uuid(&config.cluster, &node, unit),
                held: held.get(&(node.clone(), unit)).cloned(),
                xid: xids.get(&(node.clone(), unit)).copied().unwrap_or(0),
                node,
                class,
                unit,
            });
        }
    }
    let fields: [(&str, &str); 7] = [
        (GPU_UTIL, "GPU utilization (in %)."),
        (SM_ACTIVE, "The ratio of cycles an SM has at least 1 warp assigned (in %)."),
        (TENSOR_ACTIVE, "Ratio of cycles the tensor (HMMA) pipe is active (in %)."),
        (FB_USED, "Framebuffer memory used (in MiB)."),
        (FB_FREE, "Framebuffer memory free (in MiB)."),
        (XID_ERRORS, "Value of the last XID error encountered."),
        (ROW_REMAP_FAILURE, "Whether remapping of rows has failed."),
    ];
    let mut out = String::new();
    for (field, help) in fields {
        let _ = writeln!(out, "# HELP {field} {help}\n# TYPE {field} gauge");
        for gpu in &gpus {
            let activity = gpu.held.as_ref().map(|(_, _, a)| a);
            let value = match (field, activity) {
                (GPU_UTIL, Some(a)) => a.util_pct,
                // Ratios to six places, as the exporter prints them.
                (SM_ACTIVE, Some(a)) => (a.sm_pct * 1e4).round() / 1e6,
                (TENSOR_ACTIVE, Some(a)) => (a.tensor_pct * 1e4).round() / 1e6,
                (FB_USED, Some(a)) => a.memory_mib as f64,
                (FB_FREE, Some(a)) => (gpu.memory_mib - a.memory_mib).max(0) as f64,
                (FB_FREE, None) => gpu.memory_mib as f64,
                (XID_ERRORS, _) => f64::from(gpu.xid),
                _ => 0.0,
            };
            let mut labels = format!(
                "gpu=\"{unit}\",UUID=\"{uuid}\",device=\"nvidia{unit}\",modelName=\"{}\",Hostname=\"{}\"",
                label_value(&gpu.class),
                label_value(&gpu.node),
                unit = gpu.unit,
                uuid = gpu.uuid,
            );
            match (&gpu.held, gpu.pool) {
                (Some((pod, _, _)), true) => {
                    if let Some((object, rank)) = pod.rsplit_once('-') {
                        let _ = write!(labels, ",{POOL_OBJECT_LABEL}=\"{object}\",{POOL_REPLICA_LABEL}=\"{rank}\"");
                    }
                }
                (Some((pod, team, _)), false) => {
                    let _ = write!(labels, ",container=\"main\",namespace=\"{}\",pod=\"{pod}\"", label_value(team));
                }
                (None, _) => {}
            }
            let _ = writeln!(out, "{field}{{{labels}}} {value}");
        }
    }
    Ok(out)
}

/// Serves [`dcgm_exposition`] of `clusters` at `/metrics` on `listener`, as dcgm-exporter
/// does on each node, until the process ends.
pub async fn serve_dcgm_exporter(clusters: Vec<SimBackend>, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    use axum::{http::StatusCode, response::IntoResponse, routing::get};
    let clusters = std::sync::Arc::new(clusters);
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let clusters = clusters.clone();
            async move {
                match dcgm_exposition(&clusters, Utc::now()).await {
                    Ok(text) => {
                        ([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
                    }
                    Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
                }
            }
        }),
    );
    axum::serve(listener, app).await
}

/// A label value in the text format: backslash, double quote and newline escaped.
fn label_value(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// A stable GPU UUID for a simulated unit, in NVIDIA's `GPU-` form.
fn gpu_uuid(cluster: &str, node: &str, unit: u8) -> String {
    // FNV-1a over the name: stable across restarts and builds, unlike `DefaultHasher`.
    let hash = |seed: u64| {
        format!("{cluster}/{node}/{unit}").bytes().fold(seed, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
    };
    let (a, b) = (hash(0xcbf2_9ce4_8422_2325), hash(0x8422_2325_cbf2_9ce4));
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

/// Every replica must sit on units the inventory has, of the gang's class.
fn check_placement(gang: &Gang, config: &SimConfig) -> Result<(), BackendError> {
    if gang.replicas.is_empty() {
        return Err(BackendError::Rejected("the gang has no replicas".into()));
    }
    let mut taken = BTreeSet::new();
    for (i, replica) in gang.replicas.iter().enumerate() {
        let node =
            config.inventory.iter().find(|n| n.name == replica.node && n.gpu_class == gang.gpu_class).ok_or_else(
                || {
                    BackendError::Rejected(format!(
                        "replica {i}: cluster {} has no node {:?} with {} GPUs",
                        config.cluster, replica.node, gang.gpu_class
                    ))
                },
            )?;
        if replica.gpus.is_empty() {
            return Err(BackendError::Rejected(format!("replica {i}: no GPUs")));
        }
        for &unit in &replica.gpus {
            if unit >= node.gpus {
                return Err(BackendError::Rejected(format!(
                    "replica {i}: node {:?} has {} {} units, there is no unit {unit}",
                    node.name, node.gpus, gang.gpu_class
                )));
            }
            if !taken.insert((node.name.as_str(), unit)) {
                return Err(BackendError::Rejected(format!(
                    "replica {i}: unit {unit} of node {:?} is placed twice",
                    node.name
                )));
            }
        }
    }
    Ok(())
}

/// How long a service's replica "runs" in the simulator when nothing ends it: a century,
/// which no test or demo outlives, and far from any overflow of the instants it is added to.
const SERVES_FOR_MS: i64 = 100 * 365 * 24 * 3600 * 1000;

/// Whether the gang is an array task or a service's replica whose index or slot
/// [`FAIL_TASKS_HINT`] names; a list that does not parse rejects the gang, whatever it is.
fn fails_as_task(gang: &Gang) -> Result<bool, BackendError> {
    let Some(list) = gang.env.get(FAIL_TASKS_HINT) else { return Ok(false) };
    let mut named = false;
    for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let index: i32 = item
            .parse()
            .map_err(|_| BackendError::Rejected(format!("{FAIL_TASKS_HINT}={list:?} is not a list of task indices")))?;
        named |= gang.array.is_some_and(|a| a.index == index);
        named |= gang.service.as_ref().is_some_and(|s| s.slot == index);
    }
    Ok(named)
}

/// The XID the gang's first GPU reports, and how long after its start (scaled), from
/// [`XID_HINT`] and [`XID_AFTER_HINT`].
fn xid_hint(gang: &Gang, speedup: f64) -> Result<Option<(u32, i64)>, BackendError> {
    let after = duration_hint(gang, XID_AFTER_HINT)?.unwrap_or(0.0);
    Ok(hint::<u32>(gang, XID_HINT)?.map(|xid| (xid, scaled_ms(after, speedup))))
}

/// A hint from the gang's environment; a value that does not parse rejects the gang.
fn hint<T: FromStr>(gang: &Gang, name: &str) -> Result<Option<T>, BackendError> {
    gang.env
        .get(name)
        .map(|value| {
            value.trim().parse::<T>().map_err(|_| BackendError::Rejected(format!("{name}={value:?} is not valid")))
        })
        .transpose()
}

/// A duration hint in seconds: a non-negative, finite number.
fn duration_hint(gang: &Gang, name: &str) -> Result<Option<f64>, BackendError> {
    match hint::<f64>(gang, name)? {
        Some(seconds) if !(seconds.is_finite() && seconds >= 0.0) => {
            Err(BackendError::Rejected(format!("{name} must be a non-negative number of seconds")))
        }
        other => Ok(other),
    }
}

/// Simulated seconds as real milliseconds; huge values saturate (and then never come).
fn scaled_ms(seconds: f64, speedup: f64) -> i64 {
    (seconds * 1000.0 / speedup).round() as i64
}

/// `base` plus `ms`; `None` when that is beyond the representable future (never).
fn after(base: DateTime<Utc>, ms: i64) -> Option<DateTime<Utc>> {
    base.checked_add_signed(TimeDelta::try_milliseconds(ms)?)
}

/// Where the object is at `now`, and whether it was asked to stop.
///
/// It starts `start_delay_ms` after creation and then ends at the first of: its natural end
/// (`run_ms`: success, or the exit code's failure), its deadline (`deadline_ms`: failed with
/// `DeadlineExceeded`), the loss of a node (`lost_after_ms`), or a stop (the stop request
/// plus the shorter of the checkpoint time and the grace period: the application exits once
/// checkpointed and is killed at the end of the grace). A stop requested before the start
/// ends the object at once: it never starts and has nothing to checkpoint. On equal times
/// the earlier-listed end wins.
pub fn phase_at(row: &SimObjectRow, now: DateTime<Utc>) -> (Phase, bool) {
    let stop_requested = row.stop_requested_at.is_some();
    let start = after(row.created_at, row.start_delay_ms);
    if let Some(stop_at) = row.stop_requested_at {
        if start.is_none_or(|start| stop_at < start) {
            let phase = if now >= stop_at {
                Phase::Finished { started_at: None, ended_at: stop_at, outcome: Outcome::Stopped }
            } else {
                Phase::Pending
            };
            return (phase, stop_requested);
        }
    }
    let Some(start) = start.filter(|start| now >= *start) else {
        return (Phase::Pending, stop_requested);
    };
    let natural = if row.exit_code == 0 {
        Outcome::Succeeded
    } else {
        Outcome::AppFailed { exit_code: Some(row.exit_code), reason: "Error".into() }
    };
    let ends = [
        (after(start, row.run_ms), natural),
        (
            row.deadline_ms.and_then(|ms| after(start, ms)),
            Outcome::AppFailed { exit_code: None, reason: "DeadlineExceeded".into() },
        ),
        (row.lost_after_ms.and_then(|ms| after(start, ms)), Outcome::NodeLost),
        (row.stop_requested_at.and_then(|at| after(at, row.checkpoint_ms.min(row.grace_ms))), Outcome::Stopped),
    ];
    let first_end = ends.into_iter().filter_map(|(at, outcome)| Some((at?, outcome))).reduce(|first, next| {
        if next.0 < first.0 {
            next
        } else {
            first
        }
    });
    match first_end {
        Some((ended_at, outcome)) if now >= ended_at => {
            (Phase::Finished { started_at: Some(start), ended_at, outcome }, stop_requested)
        }
        _ => (Phase::Running { started_at: start }, stop_requested),
    }
}

/// The first instant after `now` at which [`phase_at`] may answer differently: the start,
/// a stop request, or the first of the possible ends; none once the object is over.
pub fn next_change(row: &SimObjectRow, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let start = after(row.created_at, row.start_delay_ms);
    let stopped_before_start = row.stop_requested_at.filter(|at| start.is_none_or(|start| *at < start));
    let ends = start.into_iter().flat_map(|start| {
        [
            after(start, row.run_ms),
            row.deadline_ms.and_then(|ms| after(start, ms)),
            row.lost_after_ms.and_then(|ms| after(start, ms)),
            row.stop_requested_at.and_then(|at| after(at, row.checkpoint_ms.min(row.grace_ms))),
        ]
    });
    let first_end = ends.flatten().chain(stopped_before_start).min();
    [start, row.stop_requested_at, first_end]
        .into_iter()
        .flatten()
        .filter(|at| *at > now && first_end.is_none_or(|end| *at <= end))
        .min()
}

/// What one replica's log is made of, from the object's stored spec.
#[derive(Debug, Clone, PartialEq)]
pub struct SimLog {
    pub job_name: String,
    pub attempt: i32,
    pub replica: u32,
    pub world_size: usize,
    pub node: String,
    pub gpus: Vec<u8>,
    /// Real milliseconds between progress lines; 0 for none.
    pub every_ms: i64,
    /// Simulated seconds per real millisecond times 1000: the speed-up, for step numbers.
    pub speedup: f64,
    pub fail_message: String,
    /// An array task's index and its array's task count, which it prints after its first
    /// line, as a script that shards its work by index does.
    pub array_task: Option<(i32, i32)>,
}

impl SimLog {
    /// Replica `replica`'s log of an object created from `spec`; `None` when the gang has no
    /// such replica.
    pub fn of(row: &SimObjectRow, spec: &serde_json::Value, replica: u32) -> Option<Self> {
        let gang: Gang = serde_json::from_value(spec.get("gang")?.clone()).ok()?;
        let slot = gang.replicas.get(usize::try_from(replica).ok()?)?;
        Some(Self {
            job_name: gang.job_name.clone(),
            attempt: row.attempt,
            replica,
            world_size: gang.replicas.len(),
            node: slot.node.clone(),
            gpus: slot.gpus.clone(),
            array_task: gang.array.map(|a| (a.index, a.count)),
            every_ms: spec.get("log_every_ms").and_then(serde_json::Value::as_i64).unwrap_or(0),
            speedup: spec.get("speedup").and_then(serde_json::Value::as_f64).unwrap_or(1.0),
            fail_message: spec
                .get("fail_message")
                .and_then(serde_json::Value::as_str)
                .unwrap_or(DEFAULT_FAIL_MESSAGE)
                .to_owned(),
        })
    }
}

/// The lines one replica of the object has written by `now`, from `since` on (every line
/// when `None`), the oldest first, at most `limit`: its start, a progress line every
/// `every_ms`, a SIGTERM and a checkpoint when it was stopped, and its end. Nothing before it
/// starts; a replica that lost its node or hit its deadline just stops writing.
pub fn log_lines(
    row: &SimObjectRow,
    log: &SimLog,
    now: DateTime<Utc>,
    since: Option<DateTime<Utc>>,
    limit: usize,
) -> Vec<LogLine> {
    let (phase, _) = phase_at(row, now);
    let (start, end, outcome) = match phase {
        Phase::Pending | Phase::Finished { started_at: None, .. } => return Vec::new(),
        Phase::Running { started_at } => (started_at, now, None),
        Phase::Finished { started_at: Some(started_at), ended_at, outcome } => (started_at, ended_at, Some(outcome)),
    };
    let rank = log.replica;
    let line = |at: DateTime<Utc>, text: String| LogLine { at, text };
    let gpus: Vec<String> = log.gpus.iter().map(u8::to_string).collect();
    let mut head = Vec::from([
        line(
            start,
            format!(
                "[rank {rank}/{}] {} attempt {} on {} GPUs [{}]",
                log.world_size,
                log.job_name,
                log.attempt,
                log.node,
                gpus.join(",")
            ),
        ),
        line(
            start,
            if log.attempt > 1 {
                format!("[rank {rank}] resuming from the last checkpoint")
            } else {
                format!("[rank {rank}] no checkpoint found, starting from step 0")
            },
        ),
    ]);
    if let Some((index, count)) = log.array_task {
        head.insert(1, line(start, format!("[rank {rank}] array task {index} of {count}")));
    }
    let running = outcome.is_none();
    let stop = row.stop_requested_at.filter(|at| *at >= start && *at <= end);
    let mut tail = Vec::new();
    if let Some(at) = stop {
        tail.push(line(at, format!("[rank {rank}] received SIGTERM, saving a checkpoint")));
    }
    let steps_at = |at: DateTime<Utc>| ((at - start).num_milliseconds().max(0) as f64 * log.speedup / 100.0) as u64;
    match outcome {
        Some(Outcome::Succeeded) => {
            tail.push(line(end, format!("[rank {rank}] finished: {} steps", steps_at(end))));
        }
        Some(Outcome::AppFailed { exit_code: Some(code), .. }) => {
            if rank == 0 {
                tail.extend([
                    line(end, "Traceback (most recent call last):".into()),
                    line(end, "  File \"train.py\", line 214, in <module>".into()),
                    line(end, "    loss.backward()".into()),
                    line(end, format!("RuntimeError: {}", log.fail_message)),
                ]);
            } else {
                tail.push(line(end, format!("[rank {rank}] rank 0 failed, leaving the process group")));
            }
            tail.push(line(end, format!("[rank {rank}] exit code {code}")));
        }
        Some(Outcome::Stopped) if stop.is_some() && after(stop.unwrap_or(end), row.checkpoint_ms) == Some(end) => {
            tail.push(line(end, format!("[rank {rank}] checkpoint saved at step {}, exiting", steps_at(end))));
        }
        _ => {}
    }
    let mut lines = Vec::new();
    lines.append(&mut head);
    if log.every_ms > 0 {
        // Only the progress lines from `since` on: a long run's log is not rebuilt per read.
        let first = since.map_or(1, |since| {
            let ms = (since - start).num_milliseconds();
            (ms.max(0) + log.every_ms - 1) / log.every_ms
        });
        for k in first.max(1).. {
            let Some(at) = after(start, k * log.every_ms).filter(|at| *at < end || (running && *at <= end)) else {
                break;
            };
            // Shared by the ranks, varied by the step: a curve that looks like training.
            let seconds = (k * log.every_ms) as f64 * log.speedup / 1000.0;
            let wobble = ((k as f64 * 12.9898).sin() * 43_758.545).fract() * 0.02;
            let loss = 0.3 + 2.2 * (-seconds / 600.0).exp() + wobble;
            let throughput = 1_850.0 + 60.0 * (k as f64 * 0.7).sin();
            lines.push(line(
                at,
                format!("[rank {rank}] step {} loss {loss:.4} {throughput:.0} samples/s", steps_at(at)),
            ));
            if lines.len() >= limit + 2 {
                break;
            }
        }
    }
    lines.append(&mut tail);
    lines.sort_by_key(|l| l.at);
    lines.into_iter().filter(|l| since.is_none_or(|since| l.at >= since)).take(limit).collect()
}

#[cfg(test)]
mod tests {
    use crate::domain::JobId;
    use std::collections::BTreeMap;

    use super::*;
    use crate::backends::ReplicaSlot;

    #[tokio::test]
    async fn a_cluster_following_its_inventory_file_gains_the_nodes_written_into_it_and_keeps_them_through_a_broken_edit(
    ) {
        let dir = std::env::temp_dir().join(format!("fairway-follow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("inventory.toml");
        let class = "[[class]]\nname = \"h100\"\nkind = \"whole\"\nmemory_mib = 81920\n";
        let node = |n: &str| format!("[[node]]\nname = \"{n}\"\ngpu_class = \"h100\"\ngpus = 8\n");
        let write = |text: String, second: u64| {
            std::fs::write(&path, text).unwrap();
            // Set apart from the last write whatever the file system's clock resolution.
            let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + second);
            std::fs::File::options().write(true).open(&path).unwrap().set_modified(at).unwrap();
        };
        write(format!("{class}{}", node("n1")), 0);
        let pool = PgPool::connect_lazy("postgres://unused@localhost/unused").unwrap();
        let backend = SimBackend::new(pool, SimConfig::load(&path).unwrap()).following(path.clone());
        let names = |nodes: Vec<InventoryNode>| nodes.into_iter().map(|n| n.name).collect::<Vec<_>>();
        assert_eq!(names(backend.inventory().await.unwrap()), ["n1"]);
        write(format!("{class}{}{}", node("n1"), node("n2")), 1);
        assert_eq!(names(backend.inventory().await.unwrap()), ["n1", "n2"]);
        // A broken edit changes nothing until the file reads again.
        write(format!("{class}{}gpus = 'many'\n", node("n3")), 2);
        assert_eq!(names(backend.inventory().await.unwrap()), ["n1", "n2"]);
        write(format!("{class}{}", node("n3")), 3);
        assert_eq!(names(backend.inventory().await.unwrap()), ["n3"]);
        // Without a file to follow, the nodes stay those it started with.
        let fixed =
            SimBackend::new(PgPool::connect_lazy("postgres://unused@localhost/unused").unwrap(), SimConfig::default());
        assert_eq!(backend.config.inventory().len(), 1);
        assert!(!fixed.inventory().await.unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap()
    }

    fn ms(n: i64) -> TimeDelta {
        TimeDelta::milliseconds(n)
    }

    /// An object created at `t0` that starts after 200 ms and succeeds after 10 s.
    fn row() -> SimObjectRow {
        SimObjectRow {
            name: "fw-x-1".into(),
            job_id: JobId::from_u128(0),
            attempt: 1,
            created_at: t0(),
            start_delay_ms: 200,
            run_ms: 10_000,
            exit_code: 0,
            deadline_ms: Some(3_600_000),
            lost_after_ms: None,
            stop_requested_at: None,
            grace_ms: 0,
            checkpoint_ms: 1_000,
        }
    }

    fn gang(env: &[(&str, &str)]) -> Gang {
        Gang {
            object: "fw-x-1".into(),
            job_id: JobId::from_u128(0),
            attempt: 1,
            team: "research".into(),
            job_name: "train".into(),
            gpu_class: "h100-80gb".into(),
            priority_class: "standard".into(),
            image: "busybox".into(),
            command: vec![],
            env: env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            labels: BTreeMap::new(),
            max_runtime: Duration::from_secs(3600),
            cpu_millis: None,
            memory_mib: None,
            workload: Default::default(),
            replicas: vec![ReplicaSlot { node: "r1-h100-1".into(), gpus: vec![0, 1, 2, 3] }],
            array: None,
            service: None,
            extra_of: None,
        }
    }

    fn rejected_message(result: Result<NewSimObject, BackendError>) -> String {
        match result {
            Err(BackendError::Rejected(message)) => message,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    #[test]
    fn the_default_inventory_has_two_h100_racks_a_whole_and_a_mig_a100_node_and_an_l4_pool() {
        let config = SimConfig::default();
        assert_eq!(config.cluster, "sim");
        assert_eq!(config.speedup, 1.0);
        let inv = config.inventory();
        let of = |class: &str| inv.iter().filter(|n| n.gpu_class == class).collect::<Vec<_>>();

        let h100 = of("h100-80gb");
        assert_eq!(h100.len(), 8);
        assert_eq!(h100.iter().map(|n| u32::from(n.gpus)).sum::<u32>(), 64);
        assert!(h100.iter().all(|n| n.nvlink_domain_size == 8 && !n.elastic && n.zone.as_deref() == Some("zone-a")));
        let racks: BTreeSet<_> = h100.iter().filter_map(|n| n.rack.as_deref()).collect();
        assert_eq!(racks, BTreeSet::from(["rack-1", "rack-2"]));
        assert!(h100.iter().any(|n| n.name == "r1-h100-1") && h100.iter().any(|n| n.name == "r2-h100-4"));

        let a100 = of("a100-80gb");
        assert_eq!(a100.len(), 1);
        assert_eq!((a100[0].name.as_str(), a100[0].gpus), ("a100-1", 8));
        let mig3 = of("a100-80gb.mig-3g.40gb");
        let mig1 = of("a100-80gb.mig-1g.10gb");
        assert_eq!((mig3.len(), mig3[0].name.as_str(), mig3[0].gpus), (1, "a100-2", 16));
        assert_eq!((mig1.len(), mig1[0].name.as_str(), mig1[0].gpus), (1, "a100-2", 8));

        let l4 = of("l4-24gb");
        assert_eq!(l4.len(), 1);
        assert!(l4[0].elastic && l4[0].gpus == 32 && l4[0].rack.is_none() && l4[0].zone.is_none());
        assert_eq!(l4[0].name, "cloud-l4");

        let class = |name: &str| config.classes().iter().find(|c| c.name == name).cloned().unwrap();
        assert_eq!((class("h100-80gb").kind, class("h100-80gb").memory_mib), (GpuKind::Whole, 81920));
        assert_eq!(class("a100-80gb").memory_mib, 81920);
        let c = class("a100-80gb.mig-3g.40gb");
        assert_eq!((c.kind, c.memory_mib, c.fraction_milli), (GpuKind::Mig, 40960, 428));
        let c = class("a100-80gb.mig-1g.10gb");
        assert_eq!((c.kind, c.memory_mib, c.fraction_milli), (GpuKind::Mig, 10240, 142));
        assert_eq!(class("l4-24gb").memory_mib, 24576);
        // Every class an entry uses is declared, and every declared class is used.
        let used: BTreeSet<_> = inv.iter().map(|n| n.gpu_class.as_str()).collect();
        let declared: BTreeSet<_> = config.classes().iter().map(|c| c.name.as_str()).collect();
        assert_eq!(used, declared);
    }

    #[test]
    fn settings_default_when_absent_and_can_be_set() {
        let config = SimConfig::from_toml(
            "cluster = \"sim-b\"\nspeedup = 60\ndefault_runtime_seconds = 5\nstart_delay_ms = 0\n\
             [[class]]\nname = \"h100-80gb\"\nkind = \"whole\"\nmemory_mib = 81920\n",
        )
        .unwrap();
        assert_eq!((config.cluster.as_str(), config.speedup, config.default_runtime_seconds), ("sim-b", 60.0, 5.0));
        assert_eq!(config.start_delay_ms, 0);
        assert_eq!(config.classes()[0].fraction_milli, 1000);
        let empty = SimConfig::from_toml("").unwrap();
        assert_eq!((empty.cluster.as_str(), empty.speedup, empty.default_runtime_seconds), ("sim", 1.0, 60.0));
        assert_eq!(empty.start_delay_ms, 200);
    }

    #[track_caller]
    fn error_key(text: &str) -> (String, String) {
        match SimConfig::from_toml(text) {
            Err(SimConfigError::Invalid { key, message }) => (key, message),
            other => panic!("expected an invalid configuration, got {other:?}"),
        }
    }

    const CLASS: &str = "[[class]]\nname = \"h100-80gb\"\nkind = \"whole\"\nmemory_mib = 81920\n";

    #[test]
    fn a_bad_configuration_names_the_key_at_fault() {
        assert_eq!(error_key("speedup = 0").0, "speedup");
        assert_eq!(error_key("speedup = \"fast\"").0, "speedup");
        assert_eq!(error_key("speeedup = 2").0, "speeedup");
        let node = |extra: &str| format!("{CLASS}[[node]]\nname = \"n1\"\ngpu_class = \"h100-80gb\"\n{extra}");
        assert_eq!(error_key(&node("gpus = 65")).0, "node[0].gpus");
        assert_eq!(error_key(&node("gpus = 0")).0, "node[0].gpus");
        assert_eq!(error_key(&node("gpus = -1")).0, "node[0].gpus");
        assert_eq!(error_key(&node("gpus = 8\ngpuz = 1")).0, "node[0].gpuz");
        assert_eq!(error_key(&node("")).0, "node[0].gpus", "a missing key is named too");
        assert_eq!(error_key(&node("gpus = 8\nnvlink_domain_size = 3")).0, "node[0].nvlink_domain_size");
        let twice = format!("{}[[node]]\nname = \"n1\"\ngpu_class = \"h100-80gb\"\ngpus = 4\n", node("gpus = 8\n"));
        assert_eq!(error_key(&twice).0, "node[1].name");
        let undeclared = "[[node]]\nname = \"n1\"\ngpu_class = \"h200\"\ngpus = 8\n";
        let (key, message) = error_key(undeclared);
        assert_eq!(key, "node[0].gpu_class");
        assert!(message.contains("h200"), "{message}");
        let pool = |max: u32| format!("{CLASS}[[pool]]\nname = \"p\"\ngpu_class = \"h100-80gb\"\nmax_gpus = {max}\n");
        assert_eq!(error_key(&pool(65)).0, "pool[0].max_gpus");
        assert_eq!(error_key("[[class]]\nname = \"x\"\nkind = \"mig\"\nmemory_mib = 1\n").0, "class[0].fraction_milli");
        assert_eq!(error_key("[[class]]\nname = \"x\"\nkind = \"whole-ish\"\nmemory_mib = 1\n").0, "class[0].kind");
        let (key, _) = error_key("cluster = \"unterminated\n");
        assert_eq!(key, "line 1");
        assert_eq!(error_key("speedup = 2\nname =").0, "line 2");
        assert_eq!(
            error_key("speedup = 2\nname =").1,
            "not valid TOML",
            "a syntax error without words still says what"
        );
    }

    #[test]
    fn a_node_may_repeat_with_another_class_as_a_mig_partitioned_node_does() {
        let text = "[[class]]\nname = \"a.mig-3g\"\nkind = \"mig\"\nmemory_mib = 40960\nfraction_milli = 428\n\
                    [[class]]\nname = \"a.mig-1g\"\nkind = \"mig\"\nmemory_mib = 10240\nfraction_milli = 142\n\
                    [[node]]\nname = \"a\"\ngpu_class = \"a.mig-3g\"\ngpus = 16\n\
                    [[node]]\nname = \"a\"\ngpu_class = \"a.mig-1g\"\ngpus = 8\n";
        let config = SimConfig::from_toml(text).unwrap();
        assert_eq!(config.inventory().len(), 2);
    }

    #[test]
    fn a_node_may_declare_the_cpus_and_memory_it_gives_replicas_when_it_has_one_class() {
        let node =
            |extra: &str| format!("{CLASS}[[node]]\nname = \"n1\"\ngpu_class = \"h100-80gb\"\ngpus = 8\n{extra}");
        let config = SimConfig::from_toml(&node("cpus = 96.5\nmemory_gib = 1024")).unwrap();
        let n = &config.inventory()[0];
        assert_eq!((n.cpu_millis, n.memory_mib), (Some(96_500), Some(1024 * 1024)));
        let plain = SimConfig::from_toml(&node("")).unwrap();
        assert_eq!((plain.inventory()[0].cpu_millis, plain.inventory()[0].memory_mib), (None, None));
        assert_eq!(error_key(&node("cpus = -1")).0, "node[0].cpus");
        let split = "[[class]]\nname = \"a.mig-3g\"\nkind = \"mig\"\nmemory_mib = 40960\nfraction_milli = 428\n\
                     [[class]]\nname = \"a.mig-1g\"\nkind = \"mig\"\nmemory_mib = 10240\nfraction_milli = 142\n\
                     [[node]]\nname = \"a\"\ngpu_class = \"a.mig-3g\"\ngpus = 16\ncpus = 64\n\
                     [[node]]\nname = \"a\"\ngpu_class = \"a.mig-1g\"\ngpus = 8\n";
        let (key, message) = error_key(split);
        assert_eq!(key, "node[0].cpus");
        assert!(message.contains("one-class nodes only"), "{message}");
    }

    #[test]
    fn the_next_change_is_the_start_then_the_end_then_none() {
        let row = row();
        let start = t0() + ms(row.start_delay_ms);
        let end = start + ms(row.run_ms);
        assert_eq!(next_change(&row, t0()), Some(start));
        assert_eq!(next_change(&row, start), Some(end));
        assert_eq!(next_change(&row, end), None);
        let stopped = SimObjectRow { stop_requested_at: Some(start + ms(10)), grace_ms: 5, ..row };
        assert_eq!(next_change(&stopped, start), Some(start + ms(10)));
        assert_eq!(next_change(&stopped, start + ms(10)), Some(start + ms(15)));
    }

    #[test]
    fn an_object_is_pending_then_running_then_succeeded() {
        let r = row();
        let start = t0() + ms(200);
        assert_eq!(phase_at(&r, t0()), (Phase::Pending, false));
        assert_eq!(phase_at(&r, start - ms(1)).0, Phase::Pending);
        assert_eq!(phase_at(&r, start).0, Phase::Running { started_at: start });
        assert_eq!(phase_at(&r, start + ms(9_999)).0, Phase::Running { started_at: start });
        let done =
            Phase::Finished { started_at: Some(start), ended_at: start + ms(10_000), outcome: Outcome::Succeeded };
        assert_eq!(phase_at(&r, start + ms(10_000)), (done.clone(), false));
        assert_eq!(phase_at(&r, start + ms(999_999)).0, done);
    }

    #[test]
    fn a_non_zero_exit_code_fails_the_application_with_that_code() {
        let r = SimObjectRow { exit_code: 3, ..row() };
        let start = t0() + ms(200);
        assert_eq!(
            phase_at(&r, start + ms(20_000)).0,
            Phase::Finished {
                started_at: Some(start),
                ended_at: start + ms(10_000),
                outcome: Outcome::AppFailed { exit_code: Some(3), reason: "Error".into() },
            }
        );
    }

    #[test]
    fn a_run_longer_than_the_deadline_fails_at_the_deadline() {
        let r = SimObjectRow { deadline_ms: Some(4_000), ..row() };
        let start = t0() + ms(200);
        assert_eq!(phase_at(&r, start + ms(3_999)).0, Phase::Running { started_at: start });
        assert_eq!(
            phase_at(&r, start + ms(4_000)).0,
            Phase::Finished {
                started_at: Some(start),
                ended_at: start + ms(4_000),
                outcome: Outcome::AppFailed { exit_code: None, reason: "DeadlineExceeded".into() },
            }
        );
        // A run that ends exactly at the deadline made it.
        let r = SimObjectRow { deadline_ms: Some(10_000), ..row() };
        assert!(matches!(phase_at(&r, start + ms(10_000)).0, Phase::Finished { outcome: Outcome::Succeeded, .. }));
    }

    #[test]
    fn a_lost_node_ends_the_object_when_it_comes_before_the_natural_end() {
        let start = t0() + ms(200);
        let r = SimObjectRow { lost_after_ms: Some(2_500), ..row() };
        assert_eq!(
            phase_at(&r, start + ms(2_500)).0,
            Phase::Finished { started_at: Some(start), ended_at: start + ms(2_500), outcome: Outcome::NodeLost }
        );
        let r = SimObjectRow { lost_after_ms: Some(20_000), ..row() };
        assert!(matches!(phase_at(&r, start + ms(30_000)).0, Phase::Finished { outcome: Outcome::Succeeded, .. }));
    }

    #[test]
    fn a_stop_ends_at_the_checkpoint_when_it_is_shorter_than_the_grace() {
        let start = t0() + ms(200);
        let stop_at = start + ms(3_000);
        let r = SimObjectRow { stop_requested_at: Some(stop_at), grace_ms: 30_000, checkpoint_ms: 1_000, ..row() };
        assert_eq!(phase_at(&r, stop_at + ms(999)), (Phase::Running { started_at: start }, true));
        assert_eq!(
            phase_at(&r, stop_at + ms(1_000)),
            (
                Phase::Finished { started_at: Some(start), ended_at: stop_at + ms(1_000), outcome: Outcome::Stopped },
                true
            )
        );
    }

    #[test]
    fn a_stop_kills_at_the_grace_when_the_checkpoint_takes_longer() {
        let start = t0() + ms(200);
        let stop_at = start + ms(3_000);
        let r = SimObjectRow { stop_requested_at: Some(stop_at), grace_ms: 500, checkpoint_ms: 5_000, ..row() };
        assert_eq!(
            phase_at(&r, stop_at + ms(500)).0,
            Phase::Finished { started_at: Some(start), ended_at: stop_at + ms(500), outcome: Outcome::Stopped }
        );
    }

    #[test]
    fn a_stop_after_the_natural_end_changes_nothing_but_the_flag() {
        let start = t0() + ms(200);
        let r = SimObjectRow { stop_requested_at: Some(start + ms(60_000)), grace_ms: 0, ..row() };
        assert_eq!(
            phase_at(&r, start + ms(70_000)),
            (
                Phase::Finished { started_at: Some(start), ended_at: start + ms(10_000), outcome: Outcome::Succeeded },
                true
            )
        );
    }

    #[test]
    fn a_stop_before_the_start_ends_the_object_at_once_and_it_never_starts() {
        let stop_at = t0() + ms(100);
        let r = SimObjectRow { stop_requested_at: Some(stop_at), grace_ms: 30_000, checkpoint_ms: 5_000, ..row() };
        let done = Phase::Finished { started_at: None, ended_at: stop_at, outcome: Outcome::Stopped };
        assert_eq!(phase_at(&r, stop_at), (done.clone(), true));
        // Even long after the start would have been.
        assert_eq!(phase_at(&r, t0() + ms(60_000)).0, done);
    }

    #[test]
    fn the_array_tasks_the_fail_hint_names_fail_their_first_attempt_only() {
        let config = SimConfig::default();
        let task = |index: i32, attempt: i32| {
            let mut g = gang(&[(FAIL_TASKS_HINT, "3, 7")]);
            g.array =
                Some(crate::backends::ArrayTaskEnv { id: crate::domain::ArrayId::from_u128(1), index, count: 10 });
            g.attempt = attempt;
            plan_object(&g, &config, t0()).unwrap().exit_code
        };
        assert_eq!((task(3, 1), task(7, 1), task(4, 1)), (1, 1, 0));
        assert_eq!(task(3, 2), 0, "the retry runs as the other tasks do");
        // Not an array task: nothing to fail; a list that does not parse is refused.
        assert_eq!(plan_object(&gang(&[(FAIL_TASKS_HINT, "3")]), &config, t0()).unwrap().exit_code, 0);
        let message = rejected_message(plan_object(&gang(&[(FAIL_TASKS_HINT, "three")]), &config, t0()));
        assert!(message.contains(FAIL_TASKS_HINT), "{message}");
    }

    #[test]
    fn speedup_divides_run_checkpoint_node_loss_and_deadline_but_not_the_start_delay() {
        let config = SimConfig { speedup: 10.0, start_delay_ms: 250, ..SimConfig::default() };
        let mut g =
            gang(&[(RUNTIME_HINT, "60"), (CHECKPOINT_HINT, "2.5"), (LOSE_NODE_HINT, "30"), (EXIT_CODE_HINT, "7")]);
        g.max_runtime = Duration::from_secs(3600);
        let object = plan_object(&g, &config, t0()).unwrap();
        assert_eq!((object.run_ms, object.checkpoint_ms, object.lost_after_ms), (6_000, 250, Some(3_000)));
        assert_eq!(object.exit_code, 7);
        assert_eq!(object.spec["deadline_ms"], 360_000);
        assert_eq!(object.spec["start_delay_ms"], 250);
        assert_eq!(object.spec["gang"]["object"], "fw-x-1");
        assert_eq!((object.name.as_str(), object.cluster.as_str(), object.created_at), ("fw-x-1", "sim", t0()));

        let plain = plan_object(&gang(&[]), &SimConfig { speedup: 2.0, ..SimConfig::default() }, t0()).unwrap();
        assert_eq!((plain.run_ms, plain.checkpoint_ms, plain.lost_after_ms, plain.exit_code), (30_000, 500, None, 0));
    }

    #[test]
    fn a_simulated_object_records_the_replicas_cpu_memory_volumes_and_secret_references() {
        use crate::domain::workload::{SecretEnv, Volume, Workload};
        let mut g = gang(&[]);
        g.cpu_millis = Some(8000);
        g.memory_mib = Some(65536);
        g.workload = Workload {
            volumes: vec![Volume { claim: "data".into(), mount_path: "/data".into(), read_only: true }],
            secret_env: vec![SecretEnv { name: "HF_TOKEN".into(), secret: "hf".into(), key: "token".into() }],
            ..Workload::default()
        };
        let object = plan_object(&g, &SimConfig::default(), t0()).unwrap();
        let recorded = &object.spec["gang"];
        assert_eq!((recorded["cpu_millis"].as_i64(), recorded["memory_mib"].as_i64()), (Some(8000), Some(65536)));
        assert_eq!(recorded["workload"]["volumes"][0]["claim"], "data");
        assert_eq!(recorded["workload"]["secret_env"][0]["secret"], "hf");
        // And it reads back as the gang it was, as the simulator's log reader reads it.
        let back: Gang = serde_json::from_value(recorded.clone()).unwrap();
        assert_eq!(back.workload, g.workload);
        // An object stored before these fields existed still reads.
        let mut old = recorded.clone();
        for field in ["cpu_millis", "memory_mib", "workload"] {
            old.as_object_mut().unwrap().remove(field);
        }
        let old: Gang = serde_json::from_value(old).unwrap();
        assert_eq!((old.cpu_millis, old.workload), (None, Workload::default()));
    }

    #[test]
    fn a_run_capped_by_the_maximum_runtime_ends_as_deadline_exceeded() {
        let mut g = gang(&[(RUNTIME_HINT, "120")]);
        g.max_runtime = Duration::from_secs(60);
        let object = plan_object(&g, &SimConfig { start_delay_ms: 0, ..SimConfig::default() }, t0()).unwrap();
        let r = SimObjectRow {
            created_at: object.created_at,
            start_delay_ms: 0,
            run_ms: object.run_ms,
            exit_code: object.exit_code,
            deadline_ms: object.spec["deadline_ms"].as_i64(),
            lost_after_ms: object.lost_after_ms,
            checkpoint_ms: object.checkpoint_ms,
            ..row()
        };
        assert_eq!(
            phase_at(&r, t0() + ms(200_000)).0,
            Phase::Finished {
                started_at: Some(t0()),
                ended_at: t0() + ms(60_000),
                outcome: Outcome::AppFailed { exit_code: None, reason: "DeadlineExceeded".into() },
            }
        );
    }

    #[test]
    fn a_malformed_hint_rejects_the_gang_naming_the_variable() {
        let config = SimConfig::default();
        for (name, value) in [
            (RUNTIME_HINT, "soon"),
            (RUNTIME_HINT, "-1"),
            (RUNTIME_HINT, "NaN"),
            (EXIT_CODE_HINT, "1.5"),
            (LOSE_NODE_HINT, "inf"),
            (CHECKPOINT_HINT, ""),
        ] {
            let message = rejected_message(plan_object(&gang(&[(name, value)]), &config, t0()));
            assert!(message.contains(name), "{name}={value}: {message}");
        }
    }

    #[test]
    fn a_placement_outside_the_inventory_is_rejected() {
        let config = SimConfig::default();
        let with = |class: &str, node: &str, gpus: Vec<u8>| {
            let mut g = gang(&[]);
            g.gpu_class = class.into();
            g.replicas = vec![ReplicaSlot { node: node.into(), gpus }];
            plan_object(&g, &config, t0())
        };
        assert!(with("h100-80gb", "r1-h100-1", vec![7]).is_ok());
        assert!(with("a100-80gb.mig-3g.40gb", "a100-2", vec![15]).is_ok());
        assert!(with("l4-24gb", "cloud-l4", vec![31]).is_ok());
        assert!(rejected_message(with("h100-80gb", "r9-h100-1", vec![0])).contains("r9-h100-1"));
        assert!(rejected_message(with("a100-80gb", "r1-h100-1", vec![0])).contains("a100-80gb"));
        assert!(rejected_message(with("h100-80gb", "r1-h100-1", vec![8])).contains("unit 8"));
        assert!(rejected_message(with("a100-80gb.mig-1g.10gb", "a100-2", vec![8])).contains("unit 8"));
        assert!(rejected_message(with("h100-80gb", "r1-h100-1", vec![])).contains("no GPUs"));
        let mut g = gang(&[]);
        g.replicas = vec![
            ReplicaSlot { node: "r1-h100-1".into(), gpus: vec![0, 1] },
            ReplicaSlot { node: "r1-h100-1".into(), gpus: vec![1, 2] },
        ];
        assert!(rejected_message(plan_object(&g, &config, t0())).contains("placed twice"));
        g.replicas.clear();
        assert!(rejected_message(plan_object(&g, &config, t0())).contains("no replicas"));
    }

    fn log(replica: u32, every_ms: i64) -> SimLog {
        SimLog {
            job_name: "train".into(),
            attempt: 1,
            replica,
            world_size: 2,
            node: "r1-h100-1".into(),
            gpus: vec![0, 1],
            every_ms,
            speedup: 1.0,
            fail_message: "CUDA out of memory".into(),
            array_task: None,
        }
    }

    fn texts(lines: &[LogLine]) -> Vec<&str> {
        lines.iter().map(|l| l.text.as_str()).collect()
    }

    #[test]
    fn a_replica_writes_nothing_before_it_starts_then_its_start_and_a_line_per_interval() {
        assert!(log_lines(&row(), &log(0, 1_000), t0() + ms(100), None, 100).is_empty());
        let lines = log_lines(&row(), &log(0, 1_000), t0() + ms(3_200), None, 100);
        assert_eq!(lines.len(), 5, "{:?}", texts(&lines));
        assert_eq!(lines[0].text, "[rank 0/2] train attempt 1 on r1-h100-1 GPUs [0,1]");
        assert_eq!(lines[0].at, t0() + ms(200));
        assert!(lines[2].text.starts_with("[rank 0] step 10 loss "), "{}", lines[2].text);
        assert_eq!(lines[4].at, t0() + ms(3_200));
        assert!(lines.windows(2).all(|w| w[0].at <= w[1].at));
    }

    #[test]
    fn a_successful_run_ends_with_its_step_count() {
        let lines = log_lines(&row(), &log(1, 0), t0() + ms(60_000), None, 100);
        assert_eq!(texts(&lines).last(), Some(&"[rank 1] finished: 100 steps"));
        assert_eq!(lines.last().unwrap().at, t0() + ms(10_200));
    }

    #[test]
    fn a_failing_run_prints_a_traceback_with_its_message_and_exit_code_on_rank_zero() {
        let failing = SimObjectRow { exit_code: 3, ..row() };
        let lines = log_lines(&failing, &log(0, 1_000), t0() + ms(60_000), None, 100);
        let end: Vec<&str> = texts(&lines).into_iter().rev().take(3).collect();
        assert_eq!(end, ["[rank 0] exit code 3", "RuntimeError: CUDA out of memory", "    loss.backward()"]);
        let other = log_lines(&failing, &log(1, 1_000), t0() + ms(60_000), None, 100);
        assert_eq!(texts(&other).last(), Some(&"[rank 1] exit code 3"));
        assert!(!texts(&other).iter().any(|t| t.starts_with("RuntimeError")));
    }

    #[test]
    fn a_stopped_run_says_it_checkpoints_and_exits() {
        let stopped = SimObjectRow { stop_requested_at: Some(t0() + ms(5_200)), grace_ms: 30_000, ..row() };
        let lines = log_lines(&stopped, &log(0, 0), t0() + ms(60_000), None, 100);
        assert_eq!(
            texts(&lines)[2..],
            ["[rank 0] received SIGTERM, saving a checkpoint", "[rank 0] checkpoint saved at step 60, exiting"]
        );
    }

    #[test]
    fn a_read_from_an_instant_gets_the_lines_from_it_on_and_at_most_the_limit() {
        let all = log_lines(&row(), &log(0, 500), t0() + ms(60_000), None, 1_000);
        let since = all[7].at;
        let later = log_lines(&row(), &log(0, 500), t0() + ms(60_000), Some(since), 1_000);
        assert_eq!(later, all[7..]);
        let capped = log_lines(&row(), &log(0, 500), t0() + ms(60_000), Some(since), 3);
        assert_eq!(capped, all[7..10]);
    }

    #[test]
    fn the_log_hints_are_stored_scaled_and_checked() {
        let config = SimConfig { speedup: 10.0, ..SimConfig::default() };
        let object =
            plan_object(&gang(&[(LOG_EVERY_HINT, "30"), (FAIL_MESSAGE_HINT, "NCCL timeout")]), &config, t0()).unwrap();
        assert_eq!(object.spec["log_every_ms"], 3_000);
        assert_eq!(object.spec["fail_message"], "NCCL timeout");
        let message = rejected_message(plan_object(&gang(&[(LOG_EVERY_HINT, "-1")]), &config, t0()));
        assert!(message.contains(LOG_EVERY_HINT), "{message}");
    }
}
