//! Where admitted jobs run. One trait, [`Backend`], shaped so that Kubernetes, AWS Batch,
//! Google Cloud Batch and the built-in simulator all fit it: create a gang already placed by
//! the engine, stop it with a grace period, list our objects with their status, report the
//! inventory. Outcomes are normalised into [`Outcome`], each with its own retry policy.
//!
//! Every call is idempotent, because the dispatcher and the reconciler retry after crashes:
//! an object's name derives from the job id and attempt ([`object_name`]), so a repeated
//! `submit` finds the object it created before; `stop` and `delete` of an object that is
//! already gone succeed.

pub mod aws_batch;
pub mod clusters;
pub mod dcgm;
pub mod gcp_batch;
pub mod kubernetes;
pub mod pools;
pub mod sim;

use std::{collections::BTreeMap, time::Duration};

use futures_util::StreamExt as _;

use crate::domain::JobId;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The backend object name of one attempt of a job: stable across retries, unique per
/// attempt, a valid DNS label (Kubernetes), job name (AWS Batch) and job id (Cloud Batch).
pub fn object_name(job: JobId, attempt: i32) -> String {
    format!("fw-{}-{attempt}", job.uuid().simple())
}

/// One replica's place, as the engine chose it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReplicaSlot {
    /// Node name as the backend reported it in its inventory.
    pub node: String,
    /// Unit indices on the node (GPU or MIG slice ordinals).
    pub gpus: Vec<u8>,
}

/// A gang placed by the engine, ready to create.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Gang {
    /// The object name ([`object_name`]).
    pub object: String,
    pub job_id: JobId,
    pub attempt: i32,
    pub team: String,
    pub job_name: String,
    pub gpu_class: String,
    pub priority_class: String,
    pub image: String,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    /// The backend stops the job after this long (and reports it failed).
    pub max_runtime: Duration,
    /// CPU (millicores) and memory (MiB) each replica asks for; `None` (a job from before
    /// they were asked for): the backend's own default.
    pub cpu_millis: Option<i32>,
    pub memory_mib: Option<i32>,
    /// Volumes, secret references, image pull secrets and node selector, as validated
    /// (absent from a simulated object stored before they existed).
    #[serde(default)]
    pub workload: crate::domain::workload::Workload,
    /// One entry per replica.
    pub replicas: Vec<ReplicaSlot>,
    /// The array it is a task of, when it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<ArrayTaskEnv>,
    /// The service it is a replica of, when it is one: it has no maximum runtime, and the
    /// backend makes it reachable at the service's endpoint ([`Backend::endpoint`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceBinding>,
    /// The elastic gang it is an extra replica of, when it is one: it joins that gang's
    /// rendezvous rather than starting one of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_of: Option<ElasticBinding>,
}

/// The elastic gang an extra replica belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElasticBinding {
    /// The gang's job.
    pub job_id: JobId,
    /// The object of the gang's current attempt ([`object_name`]), whose rendezvous it joins.
    pub object: String,
}

/// A replica's place in its service, which its environment tells it and its backend's
/// endpoint routes to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceBinding {
    pub id: crate::domain::ServiceId,
    /// The service's name, a DNS-1035 label.
    pub name: String,
    pub slot: i32,
    pub revision: i32,
    /// The port replicas listen on and the endpoint serves.
    pub port: i32,
}

/// A task's place in its array, which its environment tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayTaskEnv {
    pub id: crate::domain::ArrayId,
    pub index: i32,
    pub count: i32,
}

/// How an object ended, normalised across backends. Each has its own retry policy
/// ([`Outcome::retry`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// Every replica exited 0 of its own accord: before any stop we asked for reached it. (An
    /// exit 0 in answer to our stop is [`Outcome::Stopped`]: a job that checkpoints on
    /// SIGTERM and exits 0 still has work left.)
    Succeeded,
    /// The application failed: a non-zero exit, out of memory, an image that cannot be
    /// pulled, the maximum runtime exceeded.
    AppFailed {
        /// The first failing replica's exit code, when it had one.
        exit_code: Option<i32>,
        /// Short machine reason, e.g. `Error`, `OOMKilled`, `DeadlineExceeded`.
        reason: String,
    },
    /// The provider took the capacity back (a spot interruption); not the job's fault.
    Preempted,
    /// The backend could not find capacity for the placement.
    CapacityUnavailable,
    /// A node of the gang disappeared or the object vanished.
    NodeLost,
    /// Stopped because we asked (cancel, our own preemption).
    Stopped,
}

impl Outcome {
    /// Every outcome's [`Outcome::code`], for metrics that show each from the start.
    pub const CODES: [&'static str; 6] =
        ["succeeded", "app_failed", "preempted", "capacity_unavailable", "node_lost", "stopped"];

    /// Stable code for events and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::AppFailed { .. } => "app_failed",
            Outcome::Preempted => "preempted",
            Outcome::CapacityUnavailable => "capacity_unavailable",
            Outcome::NodeLost => "node_lost",
            Outcome::Stopped => "stopped",
        }
    }

    /// What happens to the job after this outcome, given how often it already happened.
    pub fn retry(&self) -> Retry {
        match self {
            Outcome::Succeeded | Outcome::Stopped => Retry::Never,
            // The job's own `max_retries` decides: the platform cannot know if it helps.
            Outcome::AppFailed { .. } => Retry::JobBudget,
            // Not the job's fault: requeue, with a generous budget so a job that is
            // interrupted forever still ends.
            Outcome::Preempted => Retry::Budget(100),
            Outcome::CapacityUnavailable => Retry::Budget(10),
            Outcome::NodeLost => Retry::Budget(3),
        }
    }
}

/// A retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// The job is finished.
    Never,
    /// Requeue up to the job's `max_retries`.
    JobBudget,
    /// Requeue up to this many times.
    Budget(i32),
}

/// Where an object is in its life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    /// Created, not yet running on every replica.
    Pending,
    /// Every replica runs.
    Running { started_at: DateTime<Utc> },
    /// Over.
    Finished { started_at: Option<DateTime<Utc>>, ended_at: DateTime<Utc>, outcome: Outcome },
}

/// One of our objects on a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectStatus {
    pub object: String,
    pub job_id: JobId,
    pub attempt: i32,
    pub phase: Phase,
    /// We asked it to stop.
    pub stop_requested: bool,
    /// When its phase changes next, where the backend knows ahead (the simulator does; a
    /// real cluster reports changes through its watch instead): the reconciler looks again
    /// then rather than at its next period.
    pub next_change: Option<DateTime<Utc>>,
}

/// A node (or an elastic pool) and its GPUs of one class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InventoryNode {
    pub name: String,
    pub gpu_class: String,
    pub gpus: u8,
    /// GPUs per NVLink domain; 0 = the node is one domain.
    pub nvlink_domain_size: u8,
    pub rack: Option<String>,
    pub zone: Option<String>,
    /// A cloud pool without topology; `gpus` is its maximum size.
    pub elastic: bool,
    /// Spot capacity: only jobs that allow spot are placed on it.
    pub spot: bool,
    /// The pool's own price per GPU-hour in micro-units, which jobs on it are metered at
    /// instead of the rate card; `None` for the rate card.
    pub price_micros_per_gpu_hour: Option<i64>,
    /// The NVIDIA driver's version its GPUs run (`550.54.15`), as the cluster reports it;
    /// `None` where it does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// The CUDA version that driver supports (`12.4`); `None` where the cluster does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_version: Option<String>,
    /// The CPU (thousandths of a core) the node gives to replicas (Kubernetes' allocatable);
    /// `None` where the cluster does not say, and for cloud pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u32>,
    /// Its memory for replicas in MiB; `None` where the cluster does not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u32>,
}

impl Gang {
    /// The environment every replica gets: the user's variables without the device-selecting
    /// ones (refused at submission; a row from before that rule is still not obeyed), then
    /// the platform's, which win where names clash. Backends add their rendezvous variables.
    pub fn env(&self) -> BTreeMap<String, String> {
        let mut env: BTreeMap<String, String> = self
            .env
            .iter()
            .filter(|(k, _)| !k.starts_with(crate::domain::job::DEVICE_ENV_PREFIX))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (k, v) in [
            ("FAIRWAY_JOB_ID", self.job_id.to_string()),
            ("FAIRWAY_JOB_NAME", self.job_name.clone()),
            ("FAIRWAY_TEAM", self.team.clone()),
            ("FAIRWAY_ATTEMPT", self.attempt.to_string()),
            ("FAIRWAY_WORLD_SIZE", self.replicas.len().to_string()),
        ] {
            env.insert(k.into(), v);
        }
        if let Some(a) = self.array {
            for (k, v) in crate::domain::array::task_env(a.id, a.index, a.count) {
                env.insert(k.into(), v);
            }
        }
        if let Some(s) = &self.service {
            for (k, v) in crate::domain::service::replica_env(&s.name, s.slot, s.revision, s.port) {
                env.insert(k.into(), v);
            }
        }
        if let Some(e) = &self.extra_of {
            env.insert("FAIRWAY_ELASTIC_GANG".into(), e.job_id.to_string());
        }
        env
    }

    /// For a cloud pool: the pool the gang was placed in and the GPUs each replica takes,
    /// refused when a replica would not fit one instance of `gpus_per_instance` GPUs.
    pub fn pool_shape(&self, cluster: &str, gpus_per_instance: u32, instance: &str) -> Result<u32, BackendError> {
        let gpus = self.replicas.iter().map(|r| r.gpus.len() as u32).max().unwrap_or(0);
        if gpus == 0 || gpus > gpus_per_instance {
            return Err(BackendError::Rejected(format!(
                "cluster {cluster}: a replica of {gpus} GPUs does not fit one {instance} ({gpus_per_instance} GPUs)"
            )));
        }
        Ok(gpus)
    }

    /// The node (for a cloud backend, the pool) the first replica was placed on.
    pub fn first_node(&self) -> &str {
        self.replicas.first().map(|r| r.node.as_str()).unwrap_or_default()
    }
}

impl InventoryNode {
    /// An elastic cloud pool: `gpus` at most (the engine's limit is 64), no topology, its own
    /// price per GPU-hour.
    pub fn pool(name: &str, gpu_class: &str, gpus: u32, spot: bool, price_per_gpu_hour: f64) -> Self {
        Self {
            name: name.to_owned(),
            gpu_class: gpu_class.to_owned(),
            gpus: gpus.min(64) as u8,
            nvlink_domain_size: 0,
            rack: None,
            zone: None,
            elastic: true,
            spot,
            price_micros_per_gpu_hour: Some((price_per_gpu_hour * 1_000_000.0).round() as i64),
            driver_version: None,
            cuda_version: None,
            cpu_millis: None,
            memory_mib: None,
        }
    }
}

/// A GPU class a backend knows the shape of (the simulator's inventory declares them, a
/// Kubernetes cluster's GPU Feature Discovery labels describe them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassDecl {
    pub name: String,
    /// `whole`, `mig` or `time-slice`.
    pub kind: String,
    pub memory_mib: i32,
    pub fraction_milli: i32,
}

/// A node whose GPUs report a fault: it offers nothing until the fault clears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFault {
    pub node: String,
    /// When the fault began, as the node reports it.
    pub since: DateTime<Utc>,
    /// What is wrong, in the reporter's words.
    pub why: String,
}

/// A team's GPU limits on the platform (reserved + burst per GPU class), for backends that
/// fence tenants themselves (a Kubernetes namespace with a quota).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    pub team: String,
    /// GPU class → the most GPUs the team may hold.
    pub gpu_limits: BTreeMap<String, u32>,
}

/// One line an application wrote to its standard output or error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// When the backend received it.
    pub at: DateTime<Utc>,
    /// The line without its newline; may be long, the collector caps what it keeps.
    pub text: String,
}

/// Which part of one replica's log to read ([`Backend::logs`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogQuery {
    /// The object ([`object_name`]).
    pub object: String,
    /// The replica's rank in the gang, from 0.
    pub replica: u32,
    /// Lines at or after this instant; from the start when `None`. A backend whose filter is
    /// coarser (whole seconds) may give earlier lines too: the collector drops what it has.
    pub since: Option<DateTime<Utc>>,
    /// At most this many lines, the oldest first.
    pub limit: usize,
}

/// `call`'s answer, or a transient failure when it takes longer than `limit`: a backend that
/// hangs must not hold up the caller.
pub async fn within<T>(
    limit: Duration,
    call: impl std::future::Future<Output = Result<T, BackendError>>,
) -> Result<T, BackendError> {
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|_| Err(BackendError::Transient(format!("no answer within {} s", limit.as_secs()))))
}

/// Reads [`Backend::logs_many`] has in flight at once when the backend reads one log per call.
pub const LOG_READS_AT_ONCE: usize = 8;

/// A failed backend call. Cloned where one failed call answers for many objects.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BackendError {
    /// Worth retrying: the backend is unreachable, throttling or briefly unavailable.
    #[error("backend unavailable: {0}")]
    Transient(String),
    /// The backend has no capacity for this placement now.
    #[error("no capacity: {0}")]
    CapacityUnavailable(String),
    /// The request can never succeed as sent (an invalid spec, a forbidden field).
    #[error("rejected: {0}")]
    Rejected(String),
}

impl From<sqlx::Error> for BackendError {
    fn from(e: sqlx::Error) -> Self {
        BackendError::Transient(e.to_string())
    }
}

/// A place jobs run.
#[async_trait::async_trait]
pub trait Backend: Send + Sync {
    /// `sim`, `kubernetes`, `aws-batch` or `gcp-batch`.
    fn kind(&self) -> &'static str;

    /// GPU classes the backend can describe; missing ones are added to the catalogue.
    fn declared_classes(&self) -> Vec<ClassDecl> {
        Vec::new()
    }

    /// The nodes and pools the backend offers now.
    async fn inventory(&self) -> Result<Vec<InventoryNode>, BackendError>;

    /// Nodes whose GPUs report a fault now, for the cluster view: they are out of
    /// [`Backend::inventory`] already. Backends that learn of no faults report none.
    async fn faults(&self) -> Result<Vec<NodeFault>, BackendError> {
        Ok(Vec::new())
    }

    /// Brings the backend's per-team fences in line with the platform's limits. Called with
    /// every team that has a quota, at each inventory sync; backends without fences ignore it.
    async fn sync_tenants(&self, _tenants: &[Tenant]) -> Result<(), BackendError> {
        Ok(())
    }

    /// Creates the gang's object, or does nothing when an object of that name exists. A
    /// service's replica is also made reachable at [`Backend::endpoint`].
    async fn submit(&self, gang: &Gang) -> Result<(), BackendError>;

    /// Submits several gangs as [`Backend::submit`] does each, one answer per gang in their
    /// order; one by one, each given `each_within` to answer, unless the backend can create
    /// many in one call. The dispatcher hands a batch's creates of one cluster at once.
    async fn submit_many(&self, gangs: &[Gang], each_within: Duration) -> Vec<Result<(), BackendError>> {
        let mut answers = Vec::with_capacity(gangs.len());
        for gang in gangs {
            answers.push(within(each_within, self.submit(gang)).await);
        }
        answers
    }

    /// Where the service `gang` is a replica of can be reached on this backend, or why it
    /// cannot run here. Backends that run batch jobs to completion (cloud batch pools) take
    /// no services.
    fn endpoint(&self, team: &str, service: &ServiceBinding) -> Result<String, BackendError> {
        let _ = (team, service);
        Err(BackendError::Rejected(format!(
            "{} clusters do not take services: they run batch jobs to completion; a service's replicas run on Kubernetes or simulated clusters",
            self.kind()
        )))
    }

    /// Removes what made service `service` of `team` reachable (its endpoint), once it is
    /// deleted and its replicas have ended. Succeeds when there is nothing to remove.
    async fn withdraw(&self, team: &str, service: &str) -> Result<(), BackendError> {
        let _ = (team, service);
        Ok(())
    }

    /// Asks the object to stop: SIGTERM, then a kill after `grace`. Succeeds when the object
    /// does not exist or is already stopping.
    async fn stop(&self, object: &str, grace: Duration) -> Result<(), BackendError>;

    /// Every object of ours the backend holds, finished ones included until deleted.
    async fn objects(&self) -> Result<Vec<ObjectStatus>, BackendError>;

    /// Removes a finished or unknown object for good. Succeeds when it is already gone.
    async fn delete(&self, object: &str) -> Result<(), BackendError>;

    /// The lines one replica of an object wrote, as [`LogQuery`] asks, oldest first. Empty
    /// when the replica has not started or its log is gone; the collector
    /// (`control::logs`) keeps what it read, so nothing here needs to last.
    async fn logs(&self, query: &LogQuery) -> Result<Vec<LogLine>, BackendError>;

    /// Answers several [`LogQuery`]s, one answer per query in their order, as
    /// [`Backend::logs`] answers each; a few at a time, each given `each_within` to answer,
    /// unless the backend can read many in one call. The reconciler reads the last lines of
    /// every attempt that ended in a pass, thousands after a burst of short jobs. A slow
    /// read fails alone: a log service that answers slowly (or throttles) still makes
    /// progress with every call.
    async fn logs_many(&self, queries: &[LogQuery], each_within: Duration) -> Vec<Result<Vec<LogLine>, BackendError>> {
        // The reads made before they are streamed: a closure inside the stream would make
        // the future's `Send` bound depend on a higher-ranked lifetime the compiler cannot prove.
        let reads: Vec<_> = queries.iter().map(|query| within(each_within, self.logs(query))).collect();
        futures_util::stream::iter(reads).buffered(LOG_READS_AT_ONCE).collect().await
    }

    /// Removes several objects, as [`Backend::delete`] does each; backends that can remove
    /// many in one call do.
    async fn delete_all(&self, objects: &[String]) -> Result<(), BackendError> {
        for object in objects {
            self.delete(object).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_of_outcome_codes_names_every_outcome_once() {
        let every = [
            Outcome::Succeeded,
            Outcome::AppFailed { exit_code: Some(1), reason: "Error".into() },
            Outcome::Preempted,
            Outcome::CapacityUnavailable,
            Outcome::NodeLost,
            Outcome::Stopped,
        ];
        let codes: Vec<&str> = every.iter().map(Outcome::code).collect();
        assert_eq!(codes, Outcome::CODES);
    }

    #[test]
    fn object_names_are_stable_per_attempt_and_valid_dns_labels() {
        let id = JobId::from(uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef));
        assert_eq!(object_name(id, 2), object_name(id, 2));
        assert_ne!(object_name(id, 1), object_name(id, 2));
        let name = object_name(id, 1000);
        assert!(name.len() <= 63, "{name}");
        assert!(name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'));
    }

    #[test]
    fn only_outcomes_that_are_not_the_jobs_fault_requeue_on_a_platform_budget() {
        assert_eq!(Outcome::Succeeded.retry(), Retry::Never);
        assert_eq!(Outcome::Stopped.retry(), Retry::Never);
        assert_eq!(Outcome::AppFailed { exit_code: Some(1), reason: "Error".into() }.retry(), Retry::JobBudget);
        assert!(matches!(Outcome::Preempted.retry(), Retry::Budget(n) if n > 10));
        assert!(matches!(Outcome::NodeLost.retry(), Retry::Budget(n) if n >= 1));
    }
}
