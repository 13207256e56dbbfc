//! Jobs: what may be asked for (validated against the team's catalogue: classes, priority
//! classes, capacity, the team's runtime limit), submission one at a time or in batches,
//! cancellation, and the engine's answer to "what if I submitted this now".

use crate::domain::TeamId;
use crate::domain::{GpuClassId, JobId};
use crate::metering::HOUR_MS;
use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{off_thread, Error, Result};
use crate::{
    auth::CatalogueVersion,
    backends::ReplicaSlot,
    control,
    db::{self, jobs::NewJob},
    domain::{
        check_range,
        dependency::{After, Dependency, IfDependencyFails, Standing, MAX_DEPENDENCIES},
        driver::{check_version, DriverStack},
        job::{self, check_command, check_env, check_grace, check_image, check_labels},
        workload::{self, CloudSecretEnv, SecretEnv, Volume, Workload},
        FieldError, JobState, TopologyLevel, TopologyMode, TopologyWish,
    },
    scheduler,
    state::AppState,
};

/// The most jobs one batch may submit.
pub const MAX_BATCH: usize = 1000;
/// Default maximum runtime when a job names none: a day, or the team's limit if lower.
const DEFAULT_MAX_RUNTIME_SECONDS: i32 = 86_400;

/// A job to submit.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// Free text shown to people.
    pub name: String,
    /// GPU class from the catalogue, e.g. `h100-80gb` or `a100-80gb.mig-3g.40gb`.
    pub gpu_class: String,
    /// Replicas of the gang (all or none run). Default 1.
    #[serde(default = "one")]
    #[schema(minimum = 1, maximum = 1024)]
    pub replicas: i64,
    /// Makes the job an elastic gang (torchrun's `--nnodes=MIN:MAX`): it starts with
    /// `replicas`, all or none, and grows one replica at a time, up to this many, into GPUs no
    /// waiting job needs; each replica beyond `replicas` (an extra) is a job of its own
    /// (`extra_of` names the gang), given back when a waiting job needs its GPUs, before the
    /// gang itself would be preempted, and billed for what it ran. At least `replicas`, at
    /// most 1,024. Default: a fixed gang.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1024)]
    pub max_replicas: Option<i64>,
    /// GPUs (units of the class) per replica, all on one node. Default 1.
    #[serde(default = "one")]
    #[schema(minimum = 1, maximum = 64)]
    pub gpus_per_replica: i64,
    /// Priority class. Default `experiment` (preemptible, may borrow burst capacity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class: Option<String>,
    /// Longest the job may run; at most the team's limit. Default a day (or the limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_runtime_seconds: Option<i64>,
    /// What the job expects to run, in seconds; the forecast of expected starts uses it as
    /// this job's median runtime instead of its team's history. At most max_runtime_seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub expected_runtime_seconds: Option<i64>,
    /// Container image.
    pub image: String,
    /// Command and arguments.
    #[serde(default)]
    pub command: Vec<String>,
    /// Environment variables (names starting with `FAIRWAY_` are the platform's, except the
    /// simulator's `FAIRWAY_SIM_*` hints).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Labels, Kubernetes style, for filtering and cost allocation.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Keep the gang within one domain of a topology level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<TopologyWish>,
    /// Seconds to checkpoint when preempted; default from the priority class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 86400)]
    pub preemption_grace_seconds: Option<i64>,
    /// Seconds the job waits for capacity to come (jobs ending, nodes an autoscaler or a cloud
    /// pool adds) after it entered the queue before it may preempt anyone, 0 to 86,400;
    /// default from the priority class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 86400)]
    pub preemption_delay_seconds: Option<i64>,
    /// Times to rerun the job after the application fails. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 100)]
    pub max_retries: Option<i64>,
    /// The job tolerates spot capacity: it may run on spot cloud pools (cheaper), and a spot
    /// interruption requeues it without counting as a failure. Default false.
    #[serde(default)]
    pub allow_spot: bool,
    /// Accept the job even though it can never run under the quotas and budgets as they are
    /// (larger than its team's reserved + burst, or, not preemptible, than its reserved; or
    /// costing more than a hard budget holds for the whole month): it waits for a quota or
    /// budget change, and the answer carries a warning. Default false: such a job is refused
    /// with 422 naming the limit.
    #[serde(default)]
    pub wait_for_quota: bool,
    /// Jobs this one waits for (Slurm's `--dependency`): it is not scheduled until each has
    /// succeeded, finished or failed as asked. At most 32, no job twice, each a job that
    /// already exists, of the team or its team tree, or in a batch (`POST /jobs:batch`)
    /// another job of the same batch by its index; a batch whose dependencies form a cycle
    /// is refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<DependencySpec>,
    /// What becomes of the job when a dependency can no longer be met (a job it waits to
    /// succeed failed, or one it waits to fail succeeded): `cancel` (default; the reason is
    /// `dependency_failed`, and jobs waiting for it to succeed follow) or `keep` (it stays
    /// pending, saying so, until cancelled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub if_dependency_fails: Option<IfDependencyFails>,
    /// CPU per replica: cores (`4`, `0.5`) or millicores (`500m`), at most 1024 cores.
    /// Default: the GPU class's CPU per GPU (4 cores unless an admin set it) times
    /// `gpus_per_replica`. Requested and limited alike on Kubernetes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "4")]
    pub cpu: Option<String>,
    /// Memory per replica: a whole number of `Mi`, `Gi` or `Ti` (`32Gi`), at most 16Ti.
    /// Default: the GPU class's memory per GPU (16Gi unless an admin set it) times
    /// `gpus_per_replica`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "32Gi")]
    pub memory: Option<String>,
    /// PersistentVolumeClaims of the team's namespace mounted into every replica (at most
    /// 16; Kubernetes clusters only: a cloud batch pool refuses the job).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// Environment variables from keys of Kubernetes Secrets of the team's namespace, by
    /// name only (`namespace/name` is refused). Kubernetes clusters only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secret_env: Vec<SecretEnv>,
    /// Environment variables from a cloud secret store: AWS Secrets Manager or SSM ARNs
    /// whose names start with `fairway/<team>/`, or Google Secret Manager versions whose ids
    /// start with `fairway_<team>_`. Read by AWS Batch and Google Cloud Batch pools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cloud_secret_env: Vec<CloudSecretEnv>,
    /// Secrets of the team's namespace with registry credentials for the image (at most 8).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<String>,
    /// Node labels each replica's node must carry (at most 16, Kubernetes label rules;
    /// `kubernetes.io/hostname` is the scheduler's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// The least NVIDIA driver version its nodes must run (`550.54`, compared number by
    /// number): it is placed only on nodes whose cluster reports at least that (GPU Feature
    /// Discovery's `nvidia.com/cuda.driver-version.full` on Kubernetes), never where the driver
    /// is unknown. Default: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "550.54")]
    pub min_driver_version: Option<String>,
    /// The least CUDA version its nodes' driver must support (`12.4`), as GFD's
    /// `nvidia.com/cuda.runtime-version.full` reports it. Default: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "12.4")]
    pub min_cuda_version: Option<String>,
}

impl JobSpec {
    /// The parts of the spec only its backend acts on.
    pub fn workload(&self) -> Workload {
        Workload {
            volumes: self.volumes.clone(),
            secret_env: self.secret_env.clone(),
            cloud_secret_env: self.cloud_secret_env.clone(),
            image_pull_secrets: self.image_pull_secrets.clone(),
            node_selector: self.node_selector.clone(),
        }
    }
}

/// One job a job waits for, and for what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DependencySpec {
    /// The job waited for: an existing job's id...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobId>,
    /// ...or, in a batch only, the index in the batch's `jobs` of the job of the same batch
    /// waited for. Exactly one of `job` and `batch_index`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 999)]
    pub batch_index: Option<i64>,
    /// `succeeded` (Slurm's afterok), `finished` (any final state: afterany) or `failed`
    /// (any final state but succeeded: failed, its time limit included, cancelled, or
    /// preempted out of retries; afternotok).
    pub after: After,
}

fn one() -> i64 {
    1
}

/// The catalogue a batch is validated against, read once per request.
struct Catalogue {
    classes: HashMap<String, (GpuClassId, db::jobs::ClassCapacity)>,
    priorities: Vec<String>,
    preemptible: Vec<String>,
    chain: Vec<db::jobs::ChainTeam>,
    max_runtime: i32,
    /// Whether a budget over the team may refuse or warn (see [`Budgets`]).
    budgeted: bool,
}

/// A job that passed validation, and what may still keep it from running as asked.
struct Validated {
    job: NewJob,
    /// Accepted despite these (`wait_for_quota`); the answer to the submission shows them.
    warnings: Vec<FieldError>,
}

impl Catalogue {
    async fn load(state: &AppState, team_id: TeamId, specs: &[JobSpec], version: CatalogueVersion) -> Result<Self> {
        let mut names: Vec<String> = specs.iter().map(|s| s.gpu_class.clone()).collect();
        names.sort_unstable();
        names.dedup();
        let key = (team_id, names);
        let cached = version.0.and_then(|v| state.catalogues.get(&key, v));
        let catalogue = match cached {
            Some(c) => c,
            None => {
                let c = db::jobs::submit_catalogue(&state.db, team_id, &key.1).await?.ok_or(Error::NotFound("team"))?;
                state.catalogues.put(key, c.clone());
                c
            }
        };
        Ok(Self {
            classes: catalogue.classes.into_iter().map(|(name, id, capacity)| (name, (id, capacity))).collect(),
            priorities: catalogue.priorities,
            preemptible: catalogue.preemptible,
            chain: catalogue.chain,
            max_runtime: catalogue.max_runtime,
            budgeted: catalogue.budgeted,
        })
    }

    /// The CPU (millicores) and memory (MiB) a replica of `gpus_per_replica` GPUs gets when
    /// its job names none: the class's default per GPU (else the platform's) times its GPUs,
    /// held to what one replica may ask for.
    fn host_defaults(cap: &db::jobs::ClassCapacity, gpus_per_replica: i64) -> (i32, i32) {
        let per_gpu_cpu = cap.cpu_millis_per_gpu.unwrap_or(workload::DEFAULT_CPU_MILLIS_PER_GPU);
        let per_gpu_memory = cap.memory_mib_per_gpu.unwrap_or(workload::DEFAULT_MEMORY_MIB_PER_GPU);
        // Both bounds are i32 values; gpus_per_replica is at most 64 once checked, and the
        // products are held to the bounds before narrowing.
        let per_replica = |per_gpu: i32, max: i64| (i64::from(per_gpu) * gpus_per_replica.clamp(0, 64)).min(max) as i32;
        (per_replica(per_gpu_cpu, workload::MAX_CPU_MILLIS), per_replica(per_gpu_memory, workload::MAX_MEMORY_MIB))
    }

    /// Why a job of `gpus` GPUs of `class` can never run under the quotas as they are: at
    /// some level of the team tree it is larger than reserved + burst (a team with no quota
    /// for the class at all is said so), or, not preemptible, larger than its team's
    /// reserved quota. The same rules the engine pends such a job with as `exceeds_quota`.
    fn quota_problems(
        &self,
        at: &dyn Fn(&str) -> String,
        spec: &JobSpec,
        class: GpuClassId,
        gpus: i64,
    ) -> Vec<FieldError> {
        let mut problems = Vec::new();
        let Some(own) = self.chain.first() else { return problems };
        let limit = |(reserved, burst): (i32, i32)| i64::from(reserved) + i64::from(burst);
        if let Some(team) = self.chain.iter().find(|t| limit(t.quota(class)) < gpus) {
            let (reserved, burst) = team.quota(class);
            let whose = if team.name == own.name {
                format!("team {}", team.name)
            } else {
                format!("team {}'s department {}", own.name, team.name)
            };
            problems.push(if reserved == 0 && burst == 0 {
                FieldError::new(
                    at("gpu_class"),
                    "no_quota",
                    format!("{whose} has no quota for GPU class {}, so the job could never run; a platform admin can grant one", spec.gpu_class),
                )
            } else {
                FieldError::new(
                    at("replicas"),
                    "exceeds_quota",
                    format!(
                        "the gang needs {gpus} GPUs of {} and {whose} may hold at most {} ({reserved} reserved + {burst} burst), so it could never run",
                        spec.gpu_class,
                        limit((reserved, burst))
                    ),
                )
            });
        }
        let priority = spec.priority_class.as_deref().unwrap_or("experiment");
        let (reserved, _) = own.quota(class);
        if problems.is_empty()
            && self.priorities.iter().any(|p| p == priority)
            && !self.preemptible.iter().any(|p| p == priority)
            && i64::from(reserved) < gpus
        {
            problems.push(FieldError::new(
                at("priority_class"),
                "exceeds_reserved_quota",
                format!(
                    "priority class {priority} cannot be preempted, so it runs only within reserved quota: the gang needs {gpus} GPUs of {} and team {} has {reserved} reserved",
                    spec.gpu_class, own.name
                ),
            ));
        }
        problems
    }

    /// Validates one spec, naming failing fields under `prefix`.
    fn validate(&self, prefix: &str, spec: &JobSpec) -> Result<Validated, Vec<FieldError>> {
        let at = |f: &str| format!("{prefix}{f}");
        let mut errors = Vec::new();
        let mut check = |r: Result<(), FieldError>| {
            if let Err(e) = r {
                errors.push(e);
            }
        };
        check(job::check_name(&at("name"), &spec.name));
        check(check_image(&at("image"), &spec.image));
        check(check_command(&at("command"), &spec.command));
        check(check_env(&at("env"), &spec.env));
        check(check_labels(&at("labels"), &spec.labels));
        let cpu = spec.cpu.as_deref().map(|c| workload::parse_cpu(&at("cpu"), c)).transpose();
        let memory = spec.memory.as_deref().map(|m| workload::parse_memory(&at("memory"), m)).transpose();
        check(cpu.clone().map(drop));
        check(memory.clone().map(drop));
        let min_driver = check_version(&at("min_driver_version"), spec.min_driver_version.as_deref());
        let min_cuda = check_version(&at("min_cuda_version"), spec.min_cuda_version.as_deref());
        check(min_driver.clone().map(drop));
        check(min_cuda.clone().map(drop));
        let workload = spec.workload();
        let team = self.chain.first().map_or("", |t| t.name.as_str());
        for e in workload::check(prefix, &workload, &spec.env, team) {
            check(Err(e));
        }
        check(check_range(&at("replicas"), spec.replicas, 1, 1024));
        if let Some(max) = spec.max_replicas {
            check(check_range(&at("max_replicas"), max, spec.replicas.clamp(1, 1024), 1024));
        }
        check(check_range(&at("gpus_per_replica"), spec.gpus_per_replica, 1, 64));
        if let Some(g) = spec.preemption_grace_seconds {
            check(check_grace(&at("preemption_grace_seconds"), g));
        }
        if let Some(d) = spec.preemption_delay_seconds {
            check(check_range(&at("preemption_delay_seconds"), d, 0, 86_400));
        }
        if let Some(r) = spec.max_retries {
            check(check_range(&at("max_retries"), r, 0, 100));
        }
        if spec.depends_on.len() > MAX_DEPENDENCIES {
            check(Err(FieldError::new(
                at("depends_on"),
                "too_many",
                format!("must name at most {MAX_DEPENDENCIES} jobs"),
            )));
        }
        for (i, d) in spec.depends_on.iter().enumerate() {
            match (d.job, d.batch_index) {
                (Some(_), Some(_)) | (None, None) => check(Err(FieldError::new(
                    at(&format!("depends_on[{i}]")),
                    "one_of",
                    "must name the job waited for by either `job` (its id) or `batch_index` (in a batch), not both",
                ))),
                (Some(job), None) if spec.depends_on[..i].iter().any(|e| e.job == Some(job)) => {
                    check(Err(FieldError::new(
                        at(&format!("depends_on[{i}].job")),
                        "duplicate",
                        format!("job {job} is named twice"),
                    )));
                }
                (None, Some(index)) if spec.depends_on[..i].iter().any(|e| e.batch_index == Some(index)) => {
                    check(Err(FieldError::new(
                        at(&format!("depends_on[{i}].batch_index")),
                        "duplicate",
                        format!("jobs[{index}] is named twice"),
                    )));
                }
                _ => {}
            }
        }
        let max_runtime =
            spec.max_runtime_seconds.unwrap_or(i64::from(DEFAULT_MAX_RUNTIME_SECONDS.min(self.max_runtime)));
        if max_runtime < 1 {
            check(Err(FieldError::new(at("max_runtime_seconds"), "too_small", "must be at least 1")));
        } else if max_runtime > i64::from(self.max_runtime) {
            check(Err(FieldError::new(
                at("max_runtime_seconds"),
                "exceeds_team_limit",
                format!("must be at most the team's limit of {} seconds", self.max_runtime),
            )));
        }
        if let Some(expected) = spec.expected_runtime_seconds {
            // Held to the maximum the job will have: the one it names, or the default. A
            // maximum that is itself wrong is reported alone; the team's limit bounds both.
            let max = if (1..=i64::from(self.max_runtime)).contains(&max_runtime) {
                max_runtime
            } else {
                i64::from(self.max_runtime)
            };
            check(job::check_expected_runtime(&at("expected_runtime_seconds"), expected, max));
        }
        let priority = spec.priority_class.clone().unwrap_or_else(|| "experiment".into());
        if !self.priorities.contains(&priority) {
            check(Err(FieldError::new(
                at("priority_class"),
                "not_found",
                format!("priority class {priority} does not exist; one of: {}", self.priorities.join(", ")),
            )));
        }
        let class = self.classes.get(&spec.gpu_class);
        match class {
            None => check(Err(FieldError::new(
                at("gpu_class"),
                "not_found",
                format!("GPU class {} does not exist", spec.gpu_class),
            ))),
            Some((_, cap)) if cap.inventory_known => {
                if cap.total_gpus == 0 {
                    check(Err(FieldError::new(
                        at("gpu_class"),
                        "no_capacity",
                        format!("no cluster offers GPU class {}", spec.gpu_class),
                    )));
                } else if spec.gpus_per_replica > i64::from(cap.largest_node) {
                    check(Err(FieldError::new(
                        at("gpus_per_replica"),
                        "never_fits",
                        format!("a replica must fit on one node, and the largest has {} GPUs", cap.largest_node),
                    )));
                } else if let Some((limit, within)) = [
                    (cap.total_gpus, "all clusters together have"),
                    (cap.largest_cluster, "runs within one cluster, and the largest has"),
                ]
                .into_iter()
                .find(|&(limit, _)| spec.replicas.saturating_mul(spec.gpus_per_replica) > limit)
                {
                    check(Err(FieldError::new(
                        at("replicas"),
                        "never_fits",
                        format!(
                            "the gang needs {} GPUs and {within} {limit}",
                            spec.replicas.saturating_mul(spec.gpus_per_replica)
                        ),
                    )));
                } else if let Some(TopologyWish { level, mode: TopologyMode::Required }) = spec.topology {
                    let largest = match level {
                        TopologyLevel::NvlinkDomain => i64::from(cap.largest_nvlink_domain),
                        TopologyLevel::Node => i64::from(cap.largest_node),
                        TopologyLevel::Rack => cap.largest_rack,
                        TopologyLevel::Zone => cap.largest_zone,
                    };
                    if spec.replicas.saturating_mul(spec.gpus_per_replica) > largest {
                        check(Err(FieldError::new(
                            at("topology"),
                            "never_fits",
                            format!(
                                "the gang needs {} GPUs within one {}, and the largest has {largest}",
                                spec.replicas.saturating_mul(spec.gpus_per_replica),
                                level.as_str()
                            ),
                        )));
                    }
                }
                // A replica's CPU and memory must fit beside its GPUs on one node; a class
                // default asked of nodes too small for it is the admin's to lower.
                let (cpu_default, memory_default) = Self::host_defaults(cap, spec.gpus_per_replica);
                let asked_cpu = cpu.clone().ok().flatten().unwrap_or(cpu_default);
                let asked_memory = memory.clone().ok().flatten().unwrap_or(memory_default);
                let host = [
                    ("cpu", asked_cpu, cap.largest_cpu_millis, workload::format_cpu as fn(i32) -> String),
                    ("memory", asked_memory, cap.largest_memory_mib, workload::format_memory),
                ];
                for (field, asked, largest, format) in host {
                    if let Some(largest) = largest.filter(|&l| asked > l) {
                        let whose =
                            if spec.cpu.is_none() && field == "cpu" || spec.memory.is_none() && field == "memory" {
                                format!(" (the default for {} GPUs of {})", spec.gpus_per_replica, spec.gpu_class)
                            } else {
                                String::new()
                            };
                        check(Err(FieldError::new(
                            at(field),
                            "never_fits",
                            format!(
                                "a replica asks for {}{whose} beside its GPUs, and the largest node of {} gives {}",
                                format(asked),
                                spec.gpu_class,
                                format(largest)
                            ),
                        )));
                    }
                }
            }
            Some(_) => {}
        }
        let mut warnings = Vec::new();
        if let (Some(&(class, _)), true) = (class, errors.is_empty()) {
            let problems = self.quota_problems(&at, spec, class, spec.replicas.saturating_mul(spec.gpus_per_replica));
            if spec.wait_for_quota {
                warnings = problems;
            } else {
                errors.extend(problems);
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let (mode, level) = match spec.topology {
            None => ("any", None),
            Some(TopologyWish { level, mode: TopologyMode::Required }) => ("required", Some(level.as_str().to_owned())),
            Some(TopologyWish { level, mode: TopologyMode::Preferred }) => {
                ("preferred", Some(level.as_str().to_owned()))
            }
        };
        let (cpu_default, memory_default) = class.map_or_else(
            || Self::host_defaults(&db::jobs::ClassCapacity::default(), spec.gpus_per_replica),
            |(_, cap)| Self::host_defaults(cap, spec.gpus_per_replica),
        );
        let job = NewJob {
            id: JobId::new(),
            name: spec.name.trim().to_owned(),
            gpu_class_id: class.map(|c| c.0).unwrap_or_default(),
            priority_class: priority,
            replicas: spec.replicas as i32,
            gpus_per_replica: spec.gpus_per_replica as i32,
            // Checked above: within `replicas` and 1,024.
            max_replicas: spec.max_replicas.map(|m| m as i32),
            max_runtime_seconds: max_runtime as i32,
            // Checked above: within 1 and the maximum runtime, an `i32`.
            expected_runtime_seconds: spec.expected_runtime_seconds.map(|e| e as i32),
            image: spec.image.clone(),
            command: serde_json::json!(spec.command),
            env: serde_json::json!(spec.env),
            labels: serde_json::json!(spec.labels),
            topology_mode: mode.to_owned(),
            topology_level: level,
            preemption_grace_seconds: spec.preemption_grace_seconds.map(|g| g as i32),
            // Checked above: within 0 and 86,400.
            preemption_delay_seconds: spec.preemption_delay_seconds.map(|d| d as i32),
            max_retries: spec.max_retries.unwrap_or(0) as i32,
            allow_spot: spec.allow_spot,
            cpu_millis: Some(cpu.ok().flatten().unwrap_or(cpu_default)),
            memory_mib: Some(memory.ok().flatten().unwrap_or(memory_default)),
            workload,
            min_driver_version: min_driver.ok().flatten(),
            min_cuda_version: min_cuda.ok().flatten(),
            // Jobs of the same batch are added once the batch has its ids (`submit_batch`).
            depends_on: spec.depends_on.iter().filter_map(|d| Some((d.job?, d.after))).collect(),
            if_dependency_fails: spec.if_dependency_fails.unwrap_or_default(),
            accepted_despite: Vec::new(),
            array: None,
            service: None,
        };
        Ok(Validated { job, warnings })
    }
}

/// The budgets over a submitting team this period, with what each has left, and the prices
/// of the classes its jobs ask for (read once per request, priced per class and priority).
struct Budgets {
    /// Nearest first, each with what it has left (in its own unit) after this period's spend.
    chain: Vec<(db::budgets::ChainBudget, i64)>,
    prices: HashMap<(GpuClassId, String), (i64, i32, i32)>,
}

impl Budgets {
    /// Reads them for `team_id`, if the catalogue says the team is `budgeted` at all: most
    /// teams are not, and their submissions then cost no read.
    async fn read(state: &AppState, team_id: TeamId, budgeted: bool) -> Result<Self> {
        let mut out = Self { chain: Vec::new(), prices: HashMap::new() };
        if !budgeted {
            return Ok(out);
        }
        let now = Utc::now();
        let chain = db::budgets::of_chain(&state.db, team_id, crate::billing::budgets::period_of(now)).await?;
        if chain.is_empty() {
            return Ok(out);
        }
        let teams: Vec<TeamId> = chain.iter().map(|b| b.team_id).collect();
        let spent = crate::billing::budgets::spend(&state.db, &teams, now, state.config.chargeback).await?;
        for b in chain {
            let s = spent.get(&b.team_id).copied().unwrap_or_default();
            let left = if b.unit == "gpu-hours" {
                b.amount.saturating_mul(1000 * HOUR_MS).saturating_sub(s.gpu_milli_ms)
            } else {
                b.amount.saturating_sub(s.cost_micros)
            };
            out.chain.push((b, left.max(0)));
        }
        Ok(out)
    }

    /// What the budgets say about `job` (fields named under `at`): refusals, for a hard
    /// budget smaller than the job's maximum cost (or GPU time) even unspent, so that it can
    /// never run this period; and warnings, for a hard budget whose remainder cannot cover it
    /// now (it waits) and a soft budget it would exceed (it runs, flagged).
    async fn problems(
        &mut self,
        state: &AppState,
        at: &str,
        job: &NewJob,
    ) -> Result<(Vec<FieldError>, Vec<FieldError>)> {
        let (mut refusals, mut warnings) = (Vec::new(), Vec::new());
        if self.chain.is_empty() {
            return Ok((refusals, warnings));
        }
        let key = (job.gpu_class_id, job.priority_class.clone());
        let (rate, fraction, multiplier) = match self.prices.get(&key) {
            Some(&p) => p,
            None => {
                let p = db::budgets::price_now(&state.db, job.gpu_class_id, &job.priority_class).await?;
                self.prices.insert(key, p);
                p
            }
        };
        let units = job.replicas.saturating_mul(job.gpus_per_replica);
        let ms = i64::from(job.max_runtime_seconds) * 1000;
        let cost = crate::metering::cost_micros(units, ms, rate, multiplier);
        let time = crate::metering::gpu_milli_ms(units, fraction, ms);
        let field = format!("{at}max_runtime_seconds");
        let currency = &state.config.currency;
        for (b, left) in &self.chain {
            let gpu_hours = b.unit == "gpu-hours";
            let (needs, amount, left) = if gpu_hours {
                (time, b.amount.saturating_mul(1000 * HOUR_MS), *left)
            } else {
                (cost, b.amount, *left)
            };
            let show = |v: i64| {
                if gpu_hours {
                    format!("{} GPU-hours", crate::metering::figures::gpu_hours(v))
                } else {
                    format!("{} {currency}", crate::metering::figures::cents(v))
                }
            };
            let what = if gpu_hours { "use up to" } else { "cost up to" };
            let team = &b.team;
            if b.enforcement == "hard" && needs > amount {
                refusals.push(FieldError::new(
                    &field,
                    "exceeds_budget",
                    format!(
                        "the job may {what} {} over its maximum runtime, more than team {team}'s hard budget of {} for this month: it could never start; shorten max_runtime_seconds, ask for fewer GPUs or a larger budget",
                        show(needs),
                        show(amount)
                    ),
                ));
            } else if b.enforcement == "hard" && needs > left {
                warnings.push(FieldError::new(
                    &field,
                    "budget_exhausted",
                    format!(
                        "the job may {what} {} and team {team}'s hard budget has {} left this month: it waits until running jobs end below it, the budget is raised or the next month begins",
                        show(needs),
                        show(left)
                    ),
                ));
            } else if b.enforcement == "soft" && needs > left {
                warnings.push(FieldError::new(
                    &field,
                    "exceeds_soft_budget",
                    format!(
                        "the job may {what} {} and team {team}'s soft budget has {} left this month: it runs, and its spend is flagged",
                        show(needs),
                        show(left)
                    ),
                ));
            }
        }
        Ok((refusals, warnings))
    }
}

/// A stored job and the warnings it was accepted with.
pub struct Submitted {
    pub job: db::jobs::JobRow,
    pub warnings: Vec<FieldError>,
}

/// The label a job run again carries: the id of the job it repeats.
pub const RERUN_OF_LABEL: &str = "fairway.dev/rerun-of";

/// Submits `job` of `team` again, as it was asked for (image, command, environment, labels,
/// resources, limits, the jobs it waits for that can still be met, an array task's index),
/// on behalf of `by`: what a person does after a failure they fixed
/// outside the job, or to repeat a run. It is checked as any new submission (quotas and
/// budgets as they are now), and its label [`RERUN_OF_LABEL`] names the job it repeats.
pub async fn rerun(
    state: &AppState,
    team: &db::teams::TeamRow,
    by: &str,
    job: &db::jobs::JobRow,
    version: CatalogueVersion,
) -> Result<Submitted> {
    // Stored from a validated spec: maps of strings, or the job could not have been stored.
    let strings =
        |v: &serde_json::Value| serde_json::from_value::<BTreeMap<String, String>>(v.clone()).unwrap_or_default();
    let mut labels = strings(&job.labels.0);
    labels.insert(RERUN_OF_LABEL.to_owned(), job.id.to_string());
    // The same jobs, waited for the same way, as Slurm keeps a requeued job's dependencies;
    // those that ended are resolved by the leader's next pass. One that can no longer be met
    // (the job it waited to succeed failed) would cancel the rerun at once: it is left out,
    // and the answer says so.
    let mut dropped = Vec::new();
    let mut depends_on = Vec::new();
    for d in db::dependencies::of_job(&state.db, job.id).await? {
        let rule = Dependency { after: d.after, state: d.state, holds_gpus: d.holds_gpus };
        if rule.standing() == Standing::Unmeetable {
            dropped.push(FieldError::new(
                "depends_on",
                "dependency_dropped",
                format!(
                    "job {} ({}) ended {} and job {} waited for it to {}: the rerun does not wait for it",
                    d.name,
                    d.job,
                    d.state,
                    job.id,
                    d.after.verb()
                ),
            ));
        } else {
            depends_on.push(DependencySpec { job: Some(d.job), batch_index: None, after: d.after });
        }
    }
    let spec = JobSpec {
        name: job.name.clone(),
        gpu_class: job.gpu_class.clone(),
        replicas: job.replicas.into(),
        max_replicas: job.max_replicas.map(i64::from),
        gpus_per_replica: job.gpus_per_replica.into(),
        priority_class: Some(job.priority_class.clone()),
        max_runtime_seconds: Some(job.max_runtime_seconds.into()),
        expected_runtime_seconds: job.expected_runtime_seconds.map(i64::from),
        image: job.image.clone(),
        command: job.command.0.clone(),
        env: strings(&job.env.0),
        labels,
        topology: job.topology(),
        preemption_grace_seconds: job.preemption_grace_seconds.map(i64::from),
        preemption_delay_seconds: job.preemption_delay_seconds.map(i64::from),
        max_retries: Some(job.max_retries.into()),
        allow_spot: job.allow_spot,
        wait_for_quota: false,
        depends_on,
        if_dependency_fails: Some(job.if_dependency_fails),
        cpu: job.cpu_millis.map(workload::format_cpu),
        memory: job.memory_mib.map(workload::format_memory),
        volumes: job.workload.0.volumes.clone(),
        secret_env: job.workload.0.secret_env.clone(),
        cloud_secret_env: job.workload.0.cloud_secret_env.clone(),
        image_pull_secrets: job.workload.0.image_pull_secrets.clone(),
        node_selector: job.workload.0.node_selector.clone(),
        min_driver_version: job.min_driver_version.clone(),
        min_cuda_version: job.min_cuda_version.clone(),
    };
    // An array task run again is no task of its array (which has its task at that index),
    // but it is told the same index: it was asked to do that shard's work.
    let told = match (job.array_id, job.array_index, job.array_task_count) {
        (Some(id), Some(index), Some(count)) => crate::domain::array::task_env(id, index, count),
        _ => Vec::new(),
    };
    let (mut new, mut warnings) = validated(state, team.id, "", &spec, version).await?;
    if let serde_json::Value::Object(env) = &mut new.env {
        env.extend(told.into_iter().map(|(k, v)| (k.to_owned(), serde_json::Value::String(v))));
    }
    warnings.extend(dropped);
    store(state, team, by, new, &spec.gpu_class, warnings, None).await
}

/// Checks `spec` as a submission of `team_id` is checked against the catalogue (classes,
/// priority classes, the team's runtime limit, the quotas of its team tree), storing nothing:
/// what a template must pass to be saved. Budgets are not asked: they change by the minute.
/// The warnings it would be accepted with (`wait_for_quota`).
pub async fn check(
    state: &AppState,
    team_id: TeamId,
    spec: &JobSpec,
    version: CatalogueVersion,
) -> Result<Vec<FieldError>> {
    let catalogue = Catalogue::load(state, team_id, std::slice::from_ref(spec), version).await?;
    let Validated { warnings, .. } = catalogue.validate("", spec).map_err(Error::Validation)?;
    let outside = outside_a_batch("", spec);
    if !outside.is_empty() {
        return Err(Error::Validation(outside));
    }
    Ok(warnings)
}

/// Validates `spec` against the catalogue and queues it for `team` on behalf of `by`; the
/// stored job. The API and the portal both submit through this. With a `check` (the caller
/// was authorised from cached credentials) nothing is stored unless the write finds it
/// still true: [`Error::CredentialsChanged`] otherwise.
pub async fn submit(
    state: &AppState,
    team: &db::teams::TeamRow,
    by: &str,
    spec: JobSpec,
    version: CatalogueVersion,
    check: Option<db::jobs::WriteCheck>,
) -> Result<Submitted> {
    let (job, warnings) = validated(state, team.id, "", &spec, version).await?;
    store(state, team, by, job, &spec.gpu_class, warnings, check).await
}

/// Stores a validated `job` of `team` (of GPU class `gpu_class`) through the group commit
/// and wakes the scheduler; the stored job with the `warnings` it was accepted with.
async fn store(
    state: &AppState,
    team: &db::teams::TeamRow,
    by: &str,
    job: NewJob,
    gpu_class: &str,
    warnings: Vec<FieldError>,
    check: Option<db::jobs::WriteCheck>,
) -> Result<Submitted> {
    let stored = state.submissions.submit(team.id, by, job.clone(), check).await?.ok_or(Error::CredentialsChanged)?;
    state.wake_scheduler();
    let job = db::jobs::JobRow::submitted(job, stored, team.id, &team.name, gpu_class, by);
    Ok(Submitted { job, warnings })
}

/// `spec` checked for `team_id` as a submission is, naming fields under `prefix`: against
/// the catalogue, the jobs it may wait for and the budgets over the team. The job to store
/// (with what it was accepted despite) and the warnings to answer with.
pub(super) async fn validated(
    state: &AppState,
    team_id: TeamId,
    prefix: &str,
    spec: &JobSpec,
    version: CatalogueVersion,
) -> Result<(NewJob, Vec<FieldError>)> {
    let catalogue = Catalogue::load(state, team_id, std::slice::from_ref(spec), version).await?;
    let Validated { job, mut warnings } = catalogue.validate(prefix, spec).map_err(Error::Validation)?;
    let outside = outside_a_batch(prefix, spec);
    if !outside.is_empty() {
        return Err(Error::Validation(outside));
    }
    let unseen = unseen_dependencies(state, team_id, prefix, spec).await?;
    if !unseen.is_empty() {
        return Err(Error::Validation(unseen));
    }
    let nowhere = needs_nodes_it_lacks(state, prefix, spec, &job).await?;
    if !nowhere.is_empty() {
        return Err(Error::Validation(nowhere));
    }
    warnings.extend(drivers_it_lacks(state, prefix, spec, &job).await?);
    let mut budgets = Budgets::read(state, team_id, catalogue.budgeted).await?;
    let (refusals, soft) = budgets.problems(state, prefix, &job).await?;
    if !refusals.is_empty() && !spec.wait_for_quota {
        return Err(Error::Validation(refusals));
    }
    warnings.extend(refusals.into_iter().chain(soft));
    let job = NewJob { accepted_despite: warnings.iter().map(|w| w.message.clone()).collect(), ..job };
    Ok((job, warnings))
}

/// A job that needs Kubernetes (claims, Kubernetes Secrets, pull secrets, a node selector)
/// runs on nodes only, never in a cloud batch pool: refused, naming the first such field,
/// when only pools offer its class. Costs a read only for such jobs.
async fn needs_nodes_it_lacks(state: &AppState, prefix: &str, spec: &JobSpec, job: &NewJob) -> Result<Vec<FieldError>> {
    let w = &job.workload;
    let field = [
        (!w.volumes.is_empty(), "volumes"),
        (!w.secret_env.is_empty(), "secret_env"),
        (!w.image_pull_secrets.is_empty(), "image_pull_secrets"),
        (!w.node_selector.is_empty(), "node_selector"),
    ]
    .into_iter()
    .find_map(|(asked, field)| asked.then_some(field));
    let Some(field) = field else { return Ok(Vec::new()) };
    let (nodes, pools) = db::inventory::class_nodes(&state.db, job.gpu_class_id).await?;
    if nodes > 0 || pools == 0 {
        return Ok(Vec::new());
    }
    Ok(vec![FieldError::new(
        format!("{prefix}{field}"),
        "cloud_pools_only",
        format!(
            "needs a Kubernetes cluster, and {} is offered only by cloud batch pools, which cannot honour it; leave it out or choose a class a Kubernetes cluster offers",
            spec.gpu_class
        ),
    )])
}

/// A warning when the GPUs of the job's class that run the driver stack it requires cannot
/// hold it now: it is accepted (nodes are upgraded while jobs wait), and waits, saying so.
async fn drivers_it_lacks(state: &AppState, prefix: &str, spec: &JobSpec, job: &NewJob) -> Result<Vec<FieldError>> {
    let min = DriverStack::read(job.min_driver_version.as_deref(), job.min_cuda_version.as_deref());
    if !min.requires_any() {
        return Ok(Vec::new());
    }
    let installed = db::inventory::class_drivers(&state.db, job.gpu_class_id).await?;
    let meeting: i64 = installed
        .iter()
        .filter(|(driver, cuda, _)| DriverStack::read(driver.as_deref(), cuda.as_deref()).meets(&min))
        .map(|(_, _, gpus)| gpus)
        .sum();
    let needs = i64::from(job.replicas) * i64::from(job.gpus_per_replica);
    // With no inventory reported yet, nothing is known to lack.
    if installed.is_empty() || meeting >= needs {
        return Ok(Vec::new());
    }
    let field = if min.driver.is_some() { "min_driver_version" } else { "min_cuda_version" };
    let newest = installed
        .iter()
        .filter_map(|(driver, _, _)| driver.as_deref())
        .max_by_key(|d| d.parse::<crate::domain::driver::Version>().ok())
        .map_or_else(
            || "its nodes do not say which driver they run".to_owned(),
            |d| format!("the newest driver there is {d}"),
        );
    Ok(vec![FieldError::new(
        format!("{prefix}{field}"),
        "no_node_meets",
        format!(
            "{meeting} GPUs of {} run {}, and the job needs {needs} ({newest}); it waits until enough nodes are upgraded",
            spec.gpu_class,
            min.as_minimum()
        ),
    )])
}

/// What the budgets over `team_id` say about `count` tasks of `job` run together, as
/// warnings named `count`: each task was checked as a job on its own (and refused when it
/// alone could never start); an array that together exceeds a hard budget runs tasks until
/// the budget holds the rest back, so it is accepted, saying so.
pub(super) async fn array_budget_warnings(
    state: &AppState,
    team_id: TeamId,
    spec: &JobSpec,
    job: &NewJob,
    count: i32,
    version: CatalogueVersion,
) -> Result<Vec<FieldError>> {
    let catalogue = Catalogue::load(state, team_id, std::slice::from_ref(spec), version).await?;
    let mut budgets = Budgets::read(state, team_id, catalogue.budgeted).await?;
    let whole = NewJob { replicas: job.replicas.saturating_mul(count), ..job.clone() };
    let (refusals, warnings) = budgets.problems(state, "", &whole).await?;
    let together = format!("its {count} tasks together may");
    Ok(refusals
        .into_iter()
        .map(|r| FieldError { code: "array_exceeds_budget".into(), ..r })
        .chain(warnings)
        .map(|w| FieldError {
            field: "count".into(),
            message: w.message.replacen("the job may", &together, 1).replacen(
                "it could never start",
                "tasks run until the budget holds the rest back",
                1,
            ),
            ..w
        })
        .collect())
}

/// The dependencies of `spec` that name no job a job of `team_id` may wait for, as field
/// errors under `prefix`: a job of another tenant reads exactly as one that does not exist.
async fn unseen_dependencies(
    state: &AppState,
    team_id: TeamId,
    prefix: &str,
    spec: &JobSpec,
) -> Result<Vec<FieldError>> {
    if spec.depends_on.is_empty() || spec.depends_on.len() > MAX_DEPENDENCIES {
        return Ok(Vec::new());
    }
    let ids: Vec<JobId> = spec.depends_on.iter().filter_map(|d| d.job).collect();
    let visible = db::dependencies::visible(&state.db, team_id, &ids).await?;
    Ok(spec
        .depends_on
        .iter()
        .enumerate()
        .filter_map(|(i, d)| Some((i, d.job?)))
        .filter(|(_, job)| !visible.contains(job))
        .map(|(i, job)| {
            FieldError::new(
                format!("{prefix}depends_on[{i}].job"),
                "not_found",
                format!("no job {job} that this team's jobs may wait for"),
            )
        })
        .collect())
}

/// A job submitted alone names no job of a batch: each `batch_index` of `spec`, refused.
fn outside_a_batch(prefix: &str, spec: &JobSpec) -> Vec<FieldError> {
    spec.depends_on
        .iter()
        .enumerate()
        .filter(|(_, d)| d.batch_index.is_some())
        .map(|(i, _)| {
            FieldError::new(
                format!("{prefix}depends_on[{i}].batch_index"),
                "only_in_batch",
                "names a job of the same batch, so only a batch (POST /jobs:batch) may use it; name an existing job by `job`",
            )
        })
        .collect()
}

/// The dependencies among the jobs of a batch (`batch_index`), checked: each names another
/// job of the batch, and together they let the jobs run in some order. Refusals are named
/// `jobs[i].depends_on[k].batch_index`.
fn batch_dependencies(specs: &[JobSpec]) -> Result<Vec<Vec<(usize, After)>>, Vec<FieldError>> {
    let mut errors = Vec::new();
    let mut edges: Vec<Vec<(usize, After)>> = vec![Vec::new(); specs.len()];
    for (i, spec) in specs.iter().enumerate() {
        for (k, d) in spec.depends_on.iter().enumerate() {
            let Some(index) = d.batch_index else { continue };
            let field = format!("jobs[{i}].depends_on[{k}].batch_index");
            match usize::try_from(index).ok().filter(|&x| x < specs.len()) {
                Some(x) if x == i => {
                    errors.push(FieldError::new(field, "itself", "a job cannot wait for itself"));
                }
                Some(x) => edges[i].push((x, d.after)),
                None => errors.push(FieldError::new(
                    field,
                    "out_of_range",
                    format!("must be the index of a job of this batch: 0 to {}", specs.len() - 1),
                )),
            }
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let plain: Vec<Vec<usize>> = edges.iter().map(|e| e.iter().map(|&(x, _)| x).collect()).collect();
    if let Some(cycle) = crate::domain::dependency::batch_cycle(&plain) {
        let (first, second) = (cycle[0], cycle[1]);
        let k = specs[first].depends_on.iter().position(|d| d.batch_index == Some(second as i64)).unwrap_or(0);
        let path: Vec<String> = cycle.iter().map(|i| format!("jobs[{i}]")).collect();
        return Err(vec![FieldError::new(
            format!("jobs[{first}].depends_on[{k}].batch_index"),
            "cycle",
            format!(
                "the batch's dependencies form a cycle ({}), so none of those jobs could ever start",
                path.join(" waits for ")
            ),
        )]);
    }
    Ok(edges)
}

/// Validates up to [`MAX_BATCH`] specs against the catalogue and queues them for `team`
/// on behalf of `by`, atomically: all are stored, or none (every invalid field of every job
/// is reported, as `jobs[i].field`). A job may wait for another of the batch by its index
/// (`batch_index`), as long as the batch's dependencies form no cycle. The stored jobs, in request order, and the warnings
/// each was accepted with (named `jobs[i].field` too).
pub async fn submit_batch(
    state: &AppState,
    team_id: TeamId,
    by: &str,
    specs: &[JobSpec],
    version: CatalogueVersion,
) -> Result<(Vec<NewJob>, Vec<Vec<FieldError>>)> {
    if specs.is_empty() || specs.len() > MAX_BATCH {
        return Err(Error::field(FieldError::new(
            "jobs",
            if specs.is_empty() { "too_few" } else { "too_many" },
            format!("must hold 1 to {MAX_BATCH} jobs"),
        )));
    }
    let catalogue = Catalogue::load(state, team_id, specs, version).await?;
    let mut budgets = Budgets::read(state, team_id, catalogue.budgeted).await?;
    let mut jobs = Vec::with_capacity(specs.len());
    let mut warnings = Vec::with_capacity(specs.len());
    let mut errors = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let at = format!("jobs[{i}].");
        errors.append(&mut unseen_dependencies(state, team_id, &at, spec).await?);
        match catalogue.validate(&at, spec) {
            Ok(mut v) => {
                errors.append(&mut needs_nodes_it_lacks(state, &at, spec, &v.job).await?);
                let (mut refusals, soft) = budgets.problems(state, &at, &v.job).await?;
                if spec.wait_for_quota {
                    v.warnings.append(&mut refusals);
                } else {
                    errors.append(&mut refusals);
                }
                v.warnings.extend(soft);
                v.job.accepted_despite = v.warnings.iter().map(|w| w.message.clone()).collect();
                jobs.push(v.job);
                warnings.push(v.warnings);
            }
            Err(mut e) => errors.append(&mut e),
        }
    }
    let edges = batch_dependencies(specs).unwrap_or_else(|mut e| {
        errors.append(&mut e);
        Vec::new()
    });
    if !errors.is_empty() {
        return Err(Error::Validation(errors));
    }
    // Now that every job has its id, the jobs of the batch it waits for join its list.
    let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
    for (job, waits_for) in jobs.iter_mut().zip(edges) {
        job.depends_on.extend(waits_for.into_iter().map(|(x, after)| (ids[x], after)));
    }
    db::jobs::insert_many(&state.db, team_id, by, &jobs).await?;
    state.wake_scheduler();
    Ok((jobs, warnings))
}

/// Cancels job `id` on behalf of `actor`: a job that holds GPUs is stopped with its grace
/// period, one that does not is cancelled at once; cancelling a cancelled job is harmless.
/// The API and the portal both cancel through this.
pub async fn cancel(state: &AppState, actor: &str, id: JobId) -> Result<()> {
    let mut tx = state.db.begin().await?;
    let locked = db::jobs::lock(&mut tx, id).await?.ok_or(Error::NotFound("job"))?;
    match locked.state {
        JobState::Cancelled => {}
        JobState::Succeeded | JobState::Failed => {
            return Err(Error::conflict("job_finished", None, format!("the job has already {}", locked.state)))
        }
        JobState::Preempted if !locked.holds_gpus => {
            return Err(Error::conflict("job_finished", None, "the job was preempted and is out of retries"))
        }
        _ => {
            let stop = locked.holds_gpus.then_some(locked.grace_ms);
            db::jobs::mark_cancelled(&mut tx, id, locked.attempt, stop).await?;
            let message = if locked.holds_gpus {
                format!("cancel requested by {actor}; stopping with a {} s grace period", locked.grace_ms / 1000)
            } else {
                format!("cancelled by {actor} before it ran")
            };
            let kind = if locked.holds_gpus { "cancel_requested" } else { "cancelled" };
            db::jobs::add_event(&mut tx, id, locked.attempt, kind, Some("user"), &message, None).await?;
        }
    }
    tx.commit().await?;
    Ok(())
}

/// A running job that would be preempted.
#[derive(Debug, Serialize, ToSchema)]
pub struct WouldPreempt {
    pub team: String,
    /// The job's id when it is the caller's team's; other teams' jobs are not named.
    pub job: Option<JobId>,
    /// `priority`, `reclaim` or `fair_share`.
    pub reason: String,
    pub gpus: i32,
}

/// Extra replicas of one running elastic gang that a job would take.
#[derive(Debug, Serialize, ToSchema)]
pub struct WouldTakeExtras {
    pub team: String,
    /// The gang's id when it is the caller's team's; other teams' jobs are not named.
    pub gang: Option<JobId>,
    /// `own_team` (a gang of the caller's team of no higher priority), `priority`,
    /// `reclaim` or `fair_share`.
    pub reason: String,
    /// How many extra replicas it gives back.
    pub replicas: i32,
    /// The GPUs they hold.
    pub gpus: i32,
}

/// Records that job `id` checkpointed at `at` (default now; not in the future), at training
/// step `step` if known: preemption then picks victims by the work they would lose.
pub async fn report_checkpoint(
    state: &AppState,
    id: JobId,
    at: Option<DateTime<Utc>>,
    step: Option<i64>,
) -> Result<()> {
    let now = Utc::now();
    let at = at.unwrap_or(now);
    if at > now + chrono::Duration::seconds(5) {
        return Err(Error::field(FieldError::new("at", "in_future", "must not be in the future")));
    }
    let mut tx = state.db.begin().await?;
    let locked = db::jobs::lock(&mut tx, id).await?.ok_or(Error::NotFound("job"))?;
    if !db::jobs::checkpoint(&mut tx, id, at).await? {
        return Err(Error::conflict("job_not_running", None, format!("the job is {}", locked.state)));
    }
    let message = match step {
        Some(step) => format!("checkpoint at step {step}"),
        None => "checkpoint".to_owned(),
    };
    db::jobs::add_event(
        &mut tx,
        id,
        locked.attempt,
        "checkpoint",
        None,
        &message,
        Some(serde_json::json!({"step": step, "at": at})),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// What would happen to a job submitted now.
#[derive(Debug, Serialize, ToSchema)]
pub struct DryRunResult {
    /// It would be admitted at once.
    pub fits_now: bool,
    /// Where, if so.
    pub placement: Option<Vec<ReplicaSlot>>,
    pub cluster: Option<String>,
    /// Running jobs it would preempt.
    pub would_preempt: Vec<WouldPreempt>,
    /// Running elastic gangs that would give extra replicas back to make room for it, and
    /// run on with the rest.
    pub would_take_extras: Vec<WouldTakeExtras>,
    /// Why it would wait, if it would.
    pub reason: Option<String>,
    pub message: Option<String>,
    pub position: Option<u32>,
    /// When it would be expected to start: the forecast's median (now, if it fits now).
    pub expected_start_at: Option<DateTime<Utc>>,
    /// The interval it would be expected to start in: with p10 runtimes of the jobs ahead
    /// and of the running jobs...
    pub earliest_start_at: Option<DateTime<Utc>>,
    /// ...and with their p90 runtimes.
    pub latest_start_at: Option<DateTime<Utc>>,
    /// Why no forecast can say when it would start, when none can: `quota_change`,
    /// `budget_change` or `capacity_change`.
    pub start_unforeseeable: Option<String>,
    /// The same, in a sentence.
    pub start_unforeseeable_message: Option<String>,
    /// Most it can cost: GPUs × rate × maximum runtime × the priority's multiplier, in
    /// micro-units of the platform currency.
    pub max_cost_micros: i64,
    pub currency: String,
}

/// The engine's answer for `spec` submitted by `team_id` now; changes nothing. The API and
/// the portal's preview both ask through this.
pub async fn dry_run(
    state: &AppState,
    team_id: TeamId,
    spec: &JobSpec,
    version: CatalogueVersion,
) -> Result<DryRunResult> {
    let catalogue = Catalogue::load(state, team_id, std::slice::from_ref(spec), version).await?;
    let Validated { job, .. } = catalogue.validate("", spec).map_err(Error::Validation)?;
    let engine = control::engine_config(&state.config);
    let pricing =
        crate::metering::Pricing { currency: state.config.currency.clone(), chargeback: state.config.chargeback };
    // The shared inputs, brought up to date if stale, then copied out (their contents are
    // shared), so that dry runs wait on each other only while they are read.
    let mut forecast = {
        let mut shared = state.forecast.lock().await;
        shared.refresh(&state.db).await?;
        shared.clone()
    };
    let world = control::cycle::world(&state.db, &engine, &pricing, &mut Default::default(), &mut forecast).await?;
    let proposed = world
        .proposed(team_id, &job)
        .ok_or_else(|| Error::internal("dry run", "the job does not map onto the snapshot"))?;
    let (world, answer) = off_thread(move || {
        let answer = scheduler::dry_run::dry_run(&world.snapshot, &proposed);
        (world, answer)
    })
    .await?;
    let (cluster, placement) = match answer.placement.as_ref().and_then(|p| world.stored_placement(p)) {
        Some((_, cluster, slots)) => (Some(cluster), Some(slots)),
        None => (None, None),
    };
    let would_preempt = answer
        .victims
        .iter()
        .filter_map(|v| {
            let victim = world.jobs.get(&v.victim)?;
            Some(WouldPreempt {
                job: (victim.team_id == team_id).then_some(victim.id),
                team: world.team_name_of(victim.team_id),
                reason: v.reason.code().to_owned(),
                gpus: victim.replicas * victim.gpus_per_replica,
            })
        })
        .collect();
    // Per gang (another team's gangs per team, unnamed), in the order the engine took them.
    let mut would_take_extras: Vec<WouldTakeExtras> = Vec::new();
    for k in &answer.shrinks {
        let Some(gang) = world.jobs.get(&k.job) else { continue };
        let (team, named, reason) =
            (world.team_name_of(gang.team_id), (gang.team_id == team_id).then_some(gang.id), k.reason.code());
        match would_take_extras.iter_mut().find(|w| (&w.team, w.gang, w.reason.as_str()) == (&team, named, reason)) {
            Some(w) => {
                w.replicas += 1;
                w.gpus += gang.gpus_per_replica;
            }
            None => would_take_extras.push(WouldTakeExtras {
                team,
                gang: named,
                reason: reason.to_owned(),
                replicas: 1,
                gpus: gang.gpus_per_replica,
            }),
        }
    }
    let (reason, message) = answer
        .reason
        .as_ref()
        .map(|(r, figures)| (r.code().to_owned(), world.pending_message(team_id, job.gpu_class_id, r, figures)))
        .unzip();
    Ok(DryRunResult {
        fits_now: placement.is_some(),
        placement,
        cluster,
        would_preempt,
        would_take_extras,
        reason,
        message,
        position: answer.position,
        expected_start_at: answer.expected_start_ms.and_then(|ms| Utc.timestamp_millis_opt(ms).single()),
        earliest_start_at: answer.earliest_start_ms.and_then(|ms| Utc.timestamp_millis_opt(ms).single()),
        latest_start_at: answer.latest_start_ms.and_then(|ms| Utc.timestamp_millis_opt(ms).single()),
        start_unforeseeable: answer.unforeseeable.map(|u| u.code().to_owned()),
        start_unforeseeable_message: answer.unforeseeable.map(|u| u.message(&|t| world.team_name(t))),
        max_cost_micros: answer.max_cost_micros,
        currency: state.config.currency.clone(),
    })
}
