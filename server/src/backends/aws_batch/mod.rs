//! The `aws-batch` backend: elastic GPU pools backed by AWS Batch job queues. Each pool
//! offers one GPU class as capacity without topology (its instances' GPUs times its maximum
//! instance count), at its own price, on-demand or spot. An admitted gang becomes one Batch
//! job: a container job for one replica, a multi-node parallel job for more.
//!
//! - Job definitions are registered once per image and shape (their name is a hash of both)
//!   and reused.
//! - Submission is idempotent: the job's name is the object name (derived from the job id and
//!   attempt), and a retried dispatch that finds a job of that name in the queue submits
//!   nothing.
//! - Every job carries tags for cost allocation (team, job id, priority class).
//! - Status comes from `ListJobs` + `DescribeJobs`, at most once per `poll_interval_seconds`;
//!   AWS Batch keeps finished jobs for days, so a job Fairway is done with is tagged
//!   `fairway:collected` and skipped from then on.
//! - Logs are what the container wrote to CloudWatch Logs: the log group `log_group`, the
//!   stream `DescribeJobs` names for the job (for a multi-node parallel job, the stream of
//!   node job `<job id>#<rank>`), read with `GetLogEvents`.
//!
//! Configuration (one `[[cluster]]` of the clusters file):
//!
//! ```toml
//! [[cluster]]
//! name = "aws"
//! kind = "aws-batch"
//! region = "us-east-1"
//! # endpoint_url = "http://127.0.0.1:5000"  # another endpoint for Batch (and Logs, unless
//! #                                        # logs_endpoint_url is set): a test server
//! poll_interval_seconds = 5                 # status is read at most this often
//! log_group = "/aws/batch/job"              # where containers write; another group must
//! #                                        # exist, and job definitions name it
//! [[cluster.pool]]
//! name = "aws-h100"
//! job_queue = "fairway-p5"
//! instance_type = "p5.48xlarge"
//! gpu_class = "h100-80gb"
//! gpus_per_instance = 8
//! max_instances = 2
//! price_per_gpu_hour = 6.50
//! ```
//!
//! The status mapping lives in [`status`].

pub mod status;

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use crate::domain::{workload::CloudSecretStore, JobId};
use aws_sdk_batch::{
    error::ProvideErrorMetadata as _,
    types::{
        ContainerOverrides, ContainerProperties, JobDefinitionType, JobStatus, JobTimeout, KeyValuePair, KeyValuesPair,
        LogConfiguration, LogDriver, NodeOverrides, NodeProperties, NodePropertyOverride, NodeRangeProperty,
        ResourceRequirement, ResourceType, Secret,
    },
    Client,
};
use aws_sdk_cloudwatchlogs::operation::get_log_events::GetLogEventsError;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use sha2::Digest as _;
use tokio::sync::{Mutex, OnceCell};

use self::status::{BatchJob, STOP_REASON_PREFIX};
use super::{
    pools::{self, elastic_pool},
    Backend, BackendError, Gang, InventoryNode, LogLine, LogQuery, ObjectStatus, Phase,
};

/// An `aws-batch` cluster's settings, from the clusters file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsBatchConfig {
    /// The Fairway cluster name.
    pub name: String,
    /// AWS region, e.g. `us-east-1`.
    pub region: String,
    /// Another endpoint for the Batch API (a VPC endpoint, or a test server); also for the
    /// CloudWatch Logs API unless `logs_endpoint_url` is set (a test server such as moto
    /// serves every service on one endpoint).
    pub endpoint_url: Option<String>,
    /// Another endpoint for the CloudWatch Logs API (its own VPC endpoint).
    pub logs_endpoint_url: Option<String>,
    /// Status is read at most this often (the Batch API is rate limited).
    #[serde(default = "default_poll_interval")]
    pub poll_interval_seconds: u64,
    /// The CloudWatch Logs group the jobs' containers write to. AWS Batch's own default,
    /// `/aws/batch/job`, needs nothing more; any other group must exist, and the job
    /// definitions Fairway registers then name it (`awslogs-group`).
    #[serde(default = "default_log_group")]
    pub log_group: String,
    /// The IAM role the Batch agent takes to read a job's secrets from Secrets Manager or
    /// SSM Parameter Store (`executionRoleArn` of the definitions of jobs that name any);
    /// without it, a job naming a secret is refused at dispatch.
    pub execution_role_arn: Option<String>,
    /// The pools, one per job queue and GPU class.
    #[serde(rename = "pool")]
    pub pools: Vec<PoolConfig>,
}

fn default_poll_interval() -> u64 {
    5
}

/// Where AWS Batch sends a container's output when its job definition names no log group.
pub const DEFAULT_LOG_GROUP: &str = "/aws/batch/job";

fn default_log_group() -> String {
    DEFAULT_LOG_GROUP.into()
}

/// One elastic pool: a job queue whose compute environments launch one instance type.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// The pool's name; the engine sees it as a node of the cluster.
    pub name: String,
    pub job_queue: String,
    /// The compute environment the queue must draw from (checked when the pool is first
    /// offered); any when unset.
    pub compute_environment: Option<String>,
    /// The instance type the queue's compute environments launch, e.g. `p5.48xlarge`.
    pub instance_type: String,
    pub gpu_class: String,
    pub gpus_per_instance: u32,
    /// At most this many instances run for Fairway at once.
    pub max_instances: u32,
    /// Price per GPU-hour in the platform currency; jobs in this pool are metered at it.
    pub price_per_gpu_hour: f64,
    /// Spot capacity: only jobs that allow spot run here, and an interruption requeues them.
    #[serde(default)]
    pub spot: bool,
    /// vCPUs and memory a replica gets per GPU it holds.
    #[serde(default = "default_vcpus_per_gpu")]
    pub vcpus_per_gpu: u32,
    #[serde(default = "default_memory_per_gpu")]
    pub memory_mib_per_gpu: u32,
    /// The NVIDIA driver its instances' image runs, e.g. `550.90.07`; jobs that require a
    /// minimum run here only when this meets it.
    #[serde(default)]
    pub driver_version: Option<String>,
    /// The CUDA version that driver supports, e.g. `12.4`.
    #[serde(default)]
    pub cuda_version: Option<String>,
}

fn default_vcpus_per_gpu() -> u32 {
    4
}
fn default_memory_per_gpu() -> u32 {
    16_384
}

elastic_pool!(PoolConfig);

impl AwsBatchConfig {
    /// Checks what the engine and the service would refuse later.
    pub fn validate(&self) -> Result<(), String> {
        pools::validate(&self.name, &self.pools)
    }

    /// A Batch client for this cluster: the default AWS credential chain (environment,
    /// profile, web identity, instance metadata), TLS by rustls.
    pub async fn client(&self) -> Client {
        Client::new(&self.sdk_config(self.endpoint_url.as_deref()).await)
    }

    /// A CloudWatch Logs client for this cluster, reached as the Batch client is, at
    /// `logs_endpoint_url`, else `endpoint_url`, else AWS's own endpoint.
    pub async fn logs_client(&self) -> aws_sdk_cloudwatchlogs::Client {
        let endpoint = self.logs_endpoint_url.as_deref().or(self.endpoint_url.as_deref());
        aws_sdk_cloudwatchlogs::Client::new(&self.sdk_config(endpoint).await)
    }

    async fn sdk_config(&self, endpoint_url: Option<&str>) -> aws_config::SdkConfig {
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(self.region.clone()))
            .http_client(http_client());
        if let Some(url) = endpoint_url {
            loader = loader.endpoint_url(url);
        }
        loader.load().await
    }
}

/// The HTTP client of every AWS call: rustls with the `ring` provider, as the rest of the
/// service uses (the SDK's default would build a second crypto library).
pub fn http_client() -> aws_sdk_batch::config::SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
            aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https()
}

/// The backend of one AWS Batch account and region.
pub struct AwsBatchBackend {
    client: Client,
    /// CloudWatch Logs: given ([`AwsBatchBackend::with_logs`]), or made from the config at
    /// the first read of a log, so a cluster whose logs are never read never loads it.
    logs: OnceCell<aws_sdk_cloudwatchlogs::Client>,
    config: AwsBatchConfig,
    /// Job definition name → ARN, registered or found once per process.
    definitions: Mutex<HashMap<String, String>>,
    /// The last status read and when, reused within the poll interval.
    cache: Mutex<Option<(Instant, Vec<BatchJob>)>>,
    /// Jobs known to be collected, so they are not described again.
    collected: Mutex<HashSet<String>>,
    /// The queues were found as configured.
    verified: Mutex<bool>,
    /// (object, replica) → its log stream, once `DescribeJobs` named one: a stream never
    /// changes, so the collector's repeated reads cost one `GetLogEvents` each. Dropped when
    /// the object is deleted.
    streams: Mutex<HashMap<(String, u32), String>>,
}

/// Tags every job carries.
const TAG_CLUSTER: &str = "fairway:cluster";
const TAG_TEAM: &str = "fairway:team";
const TAG_JOB: &str = "fairway:job-id";
const TAG_ATTEMPT: &str = "fairway:attempt";
const TAG_PRIORITY: &str = "fairway:priority-class";
const TAG_STOP: &str = "fairway:stop-requested";
const TAG_COLLECTED: &str = "fairway:collected";

/// `GetLogEvents` answers at most this many events a call.
const MAX_LOG_EVENTS_PER_PAGE: usize = 10_000;
/// Empty pages one read follows at most; the collector asks again later.
const MAX_LOG_PAGES: usize = 5;

impl AwsBatchBackend {
    /// A backend over `client`; logs are read with [`AwsBatchConfig::logs_client`].
    pub fn new(client: Client, config: AwsBatchConfig) -> Self {
        Self {
            client,
            logs: OnceCell::new(),
            config,
            definitions: Mutex::default(),
            cache: Mutex::default(),
            collected: Mutex::default(),
            verified: Mutex::default(),
            streams: Mutex::default(),
        }
    }

    /// The same backend reading logs through `logs` (a client with other credentials, as a
    /// test server's).
    #[must_use]
    pub fn with_logs(self, logs: aws_sdk_cloudwatchlogs::Client) -> Self {
        Self { logs: OnceCell::new_with(Some(logs)), ..self }
    }

    async fn logs_client(&self) -> &aws_sdk_cloudwatchlogs::Client {
        self.logs.get_or_init(|| self.config.logs_client()).await
    }

    /// Checks once that every pool's queue exists, is enabled and valid, and draws from the
    /// configured compute environment: a pool that cannot run jobs is not offered.
    async fn verify(&self) -> Result<(), BackendError> {
        let mut verified = self.verified.lock().await;
        if *verified {
            return Ok(());
        }
        let queues = self
            .client
            .describe_job_queues()
            .set_job_queues(Some(self.queues().into_iter().map(str::to_owned).collect()))
            .send()
            .await
            .map_err(|e| sdk_error(&self.config.name, "describe job queues", e))?;
        for pool in &self.config.pools {
            let bad =
                |why: String| BackendError::Rejected(format!("cluster {} pool {}: {why}", self.config.name, pool.name));
            let queue = queues
                .job_queues()
                .iter()
                .find(|q| q.job_queue_name() == Some(pool.job_queue.as_str()))
                .ok_or_else(|| bad(format!("job queue {} does not exist", pool.job_queue)))?;
            let state = queue.state().map(|s| s.as_str().to_owned()).unwrap_or_default();
            let status = queue.status().map(|s| s.as_str().to_owned()).unwrap_or_default();
            if state != "ENABLED" || !matches!(status.as_str(), "VALID" | "UPDATING" | "CREATING" | "") {
                return Err(bad(format!("job queue {} is {state} and {status}", pool.job_queue)));
            }
            if let Some(wanted) = &pool.compute_environment {
                let attached = queue.compute_environment_order().iter().any(|o| {
                    let ce = o.compute_environment().unwrap_or_default();
                    ce == wanted || ce.ends_with(&format!("/{wanted}"))
                });
                if !attached {
                    return Err(bad(format!(
                        "job queue {} does not draw from compute environment {wanted}",
                        pool.job_queue
                    )));
                }
            }
        }
        *verified = true;
        Ok(())
    }

    fn pool(&self, name: &str) -> Result<&PoolConfig, BackendError> {
        self.config
            .pools
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| BackendError::Rejected(format!("cluster {}: no pool {name}", self.config.name)))
    }

    fn queues(&self) -> Vec<&str> {
        let mut queues: Vec<&str> = self.config.pools.iter().map(|p| p.job_queue.as_str()).collect();
        queues.sort_unstable();
        queues.dedup();
        queues
    }

    /// The job definition for the gang's image and shape: found by name, else registered.
    async fn definition(
        &self,
        gang: &Gang,
        pool: &PoolConfig,
        gpus: u32,
        secrets: &[(String, String)],
    ) -> Result<String, BackendError> {
        let replicas = gang.replicas.len() as i32;
        // The command travels as an override at submission, so jobs of one image and shape
        // share a definition however their command lines differ.
        let mut shape = format!(
            "{}\u{0}{gpus}\u{0}{}\u{0}{}\u{0}{replicas}",
            gang.image,
            gpus * pool.vcpus_per_gpu,
            gpus * pool.memory_mib_per_gpu
        );
        // Batch's default group leaves the definition as it always was (and its name with it).
        let log_group = (self.config.log_group != DEFAULT_LOG_GROUP).then_some(self.config.log_group.as_str());
        if let Some(group) = log_group {
            shape.push('\u{0}');
            shape.push_str(group);
        }
        // Secrets live in the definition (Batch has no override for them); a job without
        // any keeps the definition it always had.
        for (name, reference) in secrets {
            shape.push_str(&format!("\u{0}secret\u{0}{name}\u{0}{reference}"));
        }
        // Only a definition that names secrets needs the role that reads them.
        let execution_role = if secrets.is_empty() {
            None
        } else {
            let role = self.config.execution_role_arn.as_deref().ok_or_else(|| {
                BackendError::Rejected(format!(
                    "cluster {}: the job reads secrets, and the cluster has no execution_role_arn for Batch to read them with",
                    self.config.name
                ))
            })?;
            shape.push_str(&format!("\u{0}role\u{0}{role}"));
            Some(role)
        };
        let digest: String =
            sha2::Sha256::digest(shape.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect();
        let name = format!("fairway-{digest}");
        if let Some(arn) = self.definitions.lock().await.get(&name) {
            return Ok(arn.clone());
        }
        let found = self
            .client
            .describe_job_definitions()
            .job_definition_name(&name)
            .status("ACTIVE")
            .send()
            .await
            .map_err(|e| sdk_error(&self.config.name, "describe job definitions", e))?;
        let latest = found.job_definitions().iter().max_by_key(|d| d.revision().unwrap_or(0));
        let arn = match latest.and_then(|d| d.job_definition_arn()) {
            Some(arn) => arn.to_owned(),
            None => {
                let resources = vec![
                    ResourceRequirement::builder().r#type(ResourceType::Gpu).value(gpus.to_string()).build(),
                    ResourceRequirement::builder()
                        .r#type(ResourceType::Vcpu)
                        .value((gpus * pool.vcpus_per_gpu).max(1).to_string())
                        .build(),
                    ResourceRequirement::builder()
                        .r#type(ResourceType::Memory)
                        .value((gpus * pool.memory_mib_per_gpu).max(512).to_string())
                        .build(),
                ];
                let logging = log_group.map(|group| {
                    LogConfiguration::builder().log_driver(LogDriver::Awslogs).options("awslogs-group", group).build()
                });
                // References only: the Batch agent reads each value when the container starts.
                let secrets: Vec<Secret> = secrets
                    .iter()
                    .map(|(name, reference)| Secret::builder().name(name).value_from(reference).build())
                    .collect();
                let container = ContainerProperties::builder()
                    .image(&gang.image)
                    .set_resource_requirements(Some(resources))
                    .set_log_configuration(logging)
                    .set_secrets((!secrets.is_empty()).then_some(secrets))
                    .set_execution_role_arn(execution_role.map(str::to_owned))
                    .build();
                let request = self.client.register_job_definition().job_definition_name(&name);
                let request = if replicas > 1 {
                    let range = NodeRangeProperty::builder().target_nodes("0:").container(container).build();
                    let nodes =
                        NodeProperties::builder().num_nodes(replicas).main_node(0).node_range_properties(range).build();
                    request.r#type(JobDefinitionType::Multinode).node_properties(nodes)
                } else {
                    request.r#type(JobDefinitionType::Container).container_properties(container)
                };
                let registered =
                    request.send().await.map_err(|e| sdk_error(&self.config.name, "register job definition", e))?;
                registered.job_definition_arn().map(str::to_owned).ok_or_else(|| {
                    BackendError::Transient(format!("cluster {}: no ARN for job definition {name}", self.config.name))
                })?
            }
        };
        self.definitions.lock().await.insert(name, arn.clone());
        Ok(arn)
    }

    /// Our jobs of one name in a queue, finished ones included.
    async fn named(&self, queue: &str, name: &str) -> Result<Vec<String>, BackendError> {
        let filter = KeyValuesPair::builder().name("JOB_NAME").values(name).build();
        let listed = self
            .client
            .list_jobs()
            .job_queue(queue)
            .filters(filter)
            .send()
            .await
            .map_err(|e| sdk_error(&self.config.name, "list jobs", e))?;
        Ok(listed
            .job_summary_list()
            .iter()
            .filter(|j| j.job_name() == Some(name))
            .filter_map(|j| j.job_id().map(str::to_owned))
            .collect())
    }

    /// Every job of ours in every queue, described, collected ones left out.
    async fn read_all(&self) -> Result<Vec<BatchJob>, BackendError> {
        let mut ids = Vec::new();
        for queue in self.queues() {
            let mut token = None;
            loop {
                let filter = KeyValuesPair::builder().name("JOB_NAME").values("fw-*").build();
                let page = self
                    .client
                    .list_jobs()
                    .job_queue(queue)
                    .filters(filter)
                    .set_next_token(token)
                    .send()
                    .await
                    .map_err(|e| sdk_error(&self.config.name, "list jobs", e))?;
                ids.extend(page.job_summary_list().iter().filter_map(|j| j.job_id().map(str::to_owned)));
                token = page.next_token().map(str::to_owned);
                if token.is_none() {
                    break;
                }
            }
        }
        let mut collected = self.collected.lock().await;
        // Forget collected jobs the service no longer lists, so the set stays bounded.
        let listed: HashSet<&String> = ids.iter().collect();
        collected.retain(|id| listed.contains(id));
        ids.retain(|id| !collected.contains(id));
        drop(collected);
        let mut jobs = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(100) {
            let described = self
                .client
                .describe_jobs()
                .set_jobs(Some(chunk.to_vec()))
                .send()
                .await
                .map_err(|e| sdk_error(&self.config.name, "describe jobs", e))?;
            for detail in described.jobs() {
                let job = batch_job(detail);
                if job.tags.get(TAG_CLUSTER) != Some(&self.config.name) {
                    continue;
                }
                if job.tags.contains_key(TAG_COLLECTED) {
                    self.collected.lock().await.insert(job.id.clone());
                    continue;
                }
                jobs.push(job);
            }
        }
        Ok(jobs)
    }

    async fn jobs(&self) -> Result<Vec<BatchJob>, BackendError> {
        let mut cache = self.cache.lock().await;
        let fresh = Duration::from_secs(self.config.poll_interval_seconds);
        if let Some((at, jobs)) = cache.as_ref() {
            if at.elapsed() < fresh {
                return Ok(jobs.clone());
            }
        }
        let jobs = self.read_all().await?;
        *cache = Some((Instant::now(), jobs.clone()));
        Ok(jobs)
    }

    async fn forget_cache(&self) {
        *self.cache.lock().await = None;
    }

    /// Our jobs of one object name across the queues.
    async fn find(&self, object: &str) -> Result<Vec<String>, BackendError> {
        let mut ids = Vec::new();
        for queue in self.queues() {
            ids.extend(self.named(queue, object).await?);
        }
        Ok(ids)
    }

    async fn tag(&self, job_id: &str, key: &str, value: &str) -> Result<(), BackendError> {
        let arn = self.job_arn(job_id).await?;
        self.client
            .tag_resource()
            .resource_arn(arn)
            .tags(key, value)
            .send()
            .await
            .map(drop)
            .map_err(|e| sdk_error(&self.config.name, "tag job", e))
    }

    async fn job_arn(&self, job_id: &str) -> Result<String, BackendError> {
        let described = self
            .client
            .describe_jobs()
            .jobs(job_id)
            .send()
            .await
            .map_err(|e| sdk_error(&self.config.name, "describe job", e))?;
        described
            .jobs()
            .first()
            .and_then(|j| j.job_arn())
            .map(str::to_owned)
            .ok_or_else(|| BackendError::Transient(format!("cluster {}: job {job_id} not described", self.config.name)))
    }

    /// The log stream of one replica of an object, once the service has named one.
    async fn log_stream(&self, object: &str, replica: u32) -> Result<Option<String>, BackendError> {
        let key = (object.to_owned(), replica);
        if let Some(stream) = self.streams.lock().await.get(&key) {
            return Ok(Some(stream.clone()));
        }
        let ids = self.find(object).await?;
        if ids.is_empty() {
            return Ok(None);
        }
        let described = self
            .client
            .describe_jobs()
            .set_jobs(Some(ids))
            .send()
            .await
            .map_err(|e| sdk_error(&self.config.name, "describe jobs", e))?;
        // One job per object name; should a resubmission have made two, the newest is the
        // one running.
        let Some(job) = described.jobs().iter().max_by_key(|j| j.created_at().unwrap_or(0)) else {
            return Ok(None);
        };
        let multinode = job.node_properties().is_some();
        let Some(holder) = stream_holder(job.job_id().unwrap_or_default(), multinode, replica) else {
            return Ok(None);
        };
        let detail = if multinode {
            let described = self
                .client
                .describe_jobs()
                .jobs(&holder)
                .send()
                .await
                .map_err(|e| sdk_error(&self.config.name, "describe node job", e))?;
            described.jobs().first().cloned()
        } else {
            Some(job.clone())
        };
        let stream = detail
            .as_ref()
            .and_then(aws_sdk_batch::types::JobDetail::container)
            .and_then(aws_sdk_batch::types::ContainerDetail::log_stream_name)
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        if let Some(stream) = &stream {
            self.streams.lock().await.insert(key, stream.clone());
        }
        Ok(stream)
    }
}

/// The job whose description names a replica's log stream: the job itself for a container
/// job (which has only replica 0), node job `<job id>#<rank>` for a multi-node parallel job.
fn stream_holder(job_id: &str, multinode: bool, replica: u32) -> Option<String> {
    match (multinode, replica) {
        (true, rank) => Some(format!("{job_id}#{rank}")),
        (false, 0) => Some(job_id.to_owned()),
        (false, _) => None,
    }
}

/// The vCPUs and memory a replica of `gang` asks Batch for, as overrides of its definition
/// (which has the pool's figures per GPU): `None` for a job from before it named them.
/// Batch on EC2 schedules whole vCPUs, so millicores round up; refused when one instance of
/// the pool could not hold it.
fn replica_resources(
    gang: &Gang,
    pool: &PoolConfig,
    gpus: u32,
    cluster: &str,
) -> Result<Option<Vec<ResourceRequirement>>, BackendError> {
    let (Some(millis), Some(mib)) = (gang.cpu_millis, gang.memory_mib) else { return Ok(None) };
    let vcpus = u32::try_from(millis).unwrap_or(0).div_ceil(1000).max(1);
    let mib = u32::try_from(mib).unwrap_or(0).max(1);
    let (most_vcpus, most_mib) =
        (pool.vcpus_per_gpu * pool.gpus_per_instance, pool.memory_mib_per_gpu * pool.gpus_per_instance);
    if vcpus > most_vcpus || mib > most_mib {
        return Err(BackendError::Rejected(format!(
            "cluster {cluster}: a replica asks for {vcpus} vCPUs and {mib} MiB, and one {} of pool {} has {most_vcpus} vCPUs and {most_mib} MiB",
            pool.instance_type, pool.name
        )));
    }
    Ok(Some(vec![
        ResourceRequirement::builder().r#type(ResourceType::Gpu).value(gpus.to_string()).build(),
        ResourceRequirement::builder().r#type(ResourceType::Vcpu).value(vcpus.to_string()).build(),
        ResourceRequirement::builder().r#type(ResourceType::Memory).value(mib.to_string()).build(),
    ]))
}

fn millis(ms: Option<i64>) -> Option<DateTime<Utc>> {
    ms.filter(|ms| *ms > 0).and_then(DateTime::from_timestamp_millis)
}

fn batch_job(d: &aws_sdk_batch::types::JobDetail) -> BatchJob {
    let container = d.container();
    BatchJob {
        id: d.job_id().unwrap_or_default().to_owned(),
        name: d.job_name().unwrap_or_default().to_owned(),
        status: d.status().map(JobStatus::as_str).unwrap_or_default().to_owned(),
        status_reason: d.status_reason().map(str::to_owned),
        started_at: millis(d.started_at()),
        stopped_at: millis(d.stopped_at()),
        exit_code: container.and_then(aws_sdk_batch::types::ContainerDetail::exit_code),
        container_reason: container.and_then(|c| c.reason()).map(str::to_owned),
        attempt_reasons: d.attempts().iter().filter_map(|a| a.status_reason()).map(str::to_owned).collect(),
        tags: d.tags().cloned().unwrap_or_default(),
    }
}

/// Maps an SDK failure: a request the service refuses as invalid can never succeed;
/// throttling, server errors and network trouble are worth retrying.
fn sdk_error<E, R>(cluster: &str, what: &str, e: aws_sdk_batch::error::SdkError<E, R>) -> BackendError
where
    E: aws_sdk_batch::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: std::fmt::Debug,
{
    let code = e.code().unwrap_or_default().to_owned();
    let message = e.message().map_or_else(|| aws_sdk_batch::error::DisplayErrorContext(&e).to_string(), str::to_owned);
    let text = format!("cluster {cluster}: {what}: {code} {message}");
    let throttled = code.contains("Throttl") || code.contains("TooManyRequests");
    match (&e, code.as_str()) {
        (aws_sdk_batch::error::SdkError::ServiceError(_), "ClientException") if !throttled => {
            BackendError::Rejected(text)
        }
        _ => BackendError::Transient(text),
    }
}

#[async_trait::async_trait]
impl Backend for AwsBatchBackend {
    fn kind(&self) -> &'static str {
        "aws-batch"
    }

    async fn inventory(&self) -> Result<Vec<InventoryNode>, BackendError> {
        self.verify().await?;
        Ok(pools::inventory(&self.config.pools))
    }

    async fn submit(&self, gang: &Gang) -> Result<(), BackendError> {
        let pool = self.pool(gang.first_node())?;
        let instance = format!("{} instance", pool.instance_type);
        let gpus = gang.pool_shape(&self.config.name, pool.gpus_per_instance, &instance)?;
        // A retried dispatch finds the job it submitted before.
        if !self.named(&pool.job_queue, &gang.object).await?.is_empty() {
            return Ok(());
        }
        let secrets = pools::cloud_secrets(gang, &self.config.name, "AWS Batch", CloudSecretStore::Aws)?;
        let resources = replica_resources(gang, pool, gpus, &self.config.name)?;
        let definition = self.definition(gang, pool, gpus, &secrets).await?;
        let replicas = gang.replicas.len();
        let env: Vec<KeyValuePair> =
            gang.env().into_iter().map(|(k, v)| KeyValuePair::builder().name(k).value(v).build()).collect();
        let overrides = ContainerOverrides::builder()
            .set_environment(Some(env))
            .set_command((!gang.command.is_empty()).then(|| gang.command.clone()))
            .set_resource_requirements(resources)
            .build();
        let timeout = JobTimeout::builder()
            .attempt_duration_seconds(gang.max_runtime.as_secs().clamp(60, i32::MAX as u64) as i32)
            .build();
        let mut request = self
            .client
            .submit_job()
            .job_name(&gang.object)
            .job_queue(&pool.job_queue)
            .job_definition(definition)
            .timeout(timeout)
            .propagate_tags(true)
            .tags(TAG_CLUSTER, &self.config.name)
            .tags(TAG_TEAM, &gang.team)
            .tags(TAG_JOB, gang.job_id.to_string())
            .tags(TAG_ATTEMPT, gang.attempt.to_string())
            .tags(TAG_PRIORITY, &gang.priority_class);
        request = if replicas > 1 {
            let node = NodePropertyOverride::builder().target_nodes("0:").container_overrides(overrides).build();
            request.node_overrides(
                NodeOverrides::builder().num_nodes(replicas as i32).node_property_overrides(node).build(),
            )
        } else {
            request.container_overrides(overrides)
        };
        if let Err(e) = request.send().await {
            let error = sdk_error(&self.config.name, "submit job", e);
            if matches!(error, BackendError::Rejected(_)) {
                // The definition may have been deregistered: look it up again next time.
                self.definitions.lock().await.clear();
            }
            return Err(error);
        }
        self.forget_cache().await;
        Ok(())
    }

    async fn stop(&self, object: &str, _grace: Duration) -> Result<(), BackendError> {
        // AWS Batch sends SIGTERM and kills after the task's stop timeout (30 s by default);
        // the grace period cannot be chosen per call.
        for id in self.find(object).await? {
            self.client
                .terminate_job()
                .job_id(&id)
                .reason(format!("{STOP_REASON_PREFIX} stopped by the platform"))
                .send()
                .await
                .map_err(|e| sdk_error(&self.config.name, "terminate job", e))?;
            // Marked only once asked: a marker without the ask would keep the stop from being
            // sent again.
            self.tag(&id, TAG_STOP, &Utc::now().to_rfc3339()).await?;
        }
        self.forget_cache().await;
        Ok(())
    }

    async fn objects(&self) -> Result<Vec<ObjectStatus>, BackendError> {
        let now = Utc::now();
        let jobs = self.jobs().await?;
        Ok(jobs
            .iter()
            .filter_map(|job| {
                let job_id = job.tags.get(TAG_JOB).and_then(|v| v.parse::<JobId>().ok())?;
                let attempt = job.tags.get(TAG_ATTEMPT).and_then(|v| v.parse::<i32>().ok())?;
                let phase = status::phase(job, now);
                let next_change = matches!(phase, Phase::Pending | Phase::Running { .. })
                    .then(|| now + chrono::Duration::seconds(self.config.poll_interval_seconds as i64));
                Some(ObjectStatus {
                    object: job.name.clone(),
                    job_id,
                    attempt,
                    phase,
                    stop_requested: job.tags.contains_key(TAG_STOP),
                    next_change,
                })
            })
            .collect())
    }

    async fn logs(&self, query: &LogQuery) -> Result<Vec<LogLine>, BackendError> {
        if query.limit == 0 {
            return Ok(Vec::new());
        }
        let Some(stream) = self.log_stream(&query.object, query.replica).await? else {
            return Ok(Vec::new());
        };
        let logs = self.logs_client().await;
        let wanted = i32::try_from(query.limit.min(MAX_LOG_EVENTS_PER_PAGE)).unwrap_or(i32::MAX);
        let mut token: Option<String> = None;
        // A page holds at most 1 MB (a short page is fine: the collector asks again from its
        // last line), but may also be empty with events after it: follow the forward token
        // past empty pages, a few at most, until the stream's end (the token comes back
        // unchanged).
        for _ in 0..MAX_LOG_PAGES {
            let page = logs
                .get_log_events()
                .log_group_name(&self.config.log_group)
                .log_stream_name(&stream)
                .start_from_head(true)
                .set_start_time(query.since.map(|t| t.timestamp_millis()))
                .limit(wanted)
                .set_next_token(token.clone())
                .send()
                .await;
            let page = match page {
                Ok(page) => page,
                // The stream (or the group) does not exist yet, or no longer.
                Err(e) if e.as_service_error().is_some_and(GetLogEventsError::is_resource_not_found_exception) => {
                    return Ok(Vec::new());
                }
                Err(e) => return Err(sdk_error(&self.config.name, "get log events", e)),
            };
            if !page.events().is_empty() {
                let mut lines: Vec<LogLine> = page
                    .events()
                    .iter()
                    .filter_map(|event| {
                        Some(LogLine {
                            at: DateTime::from_timestamp_millis(event.timestamp()?)?,
                            text: event.message().unwrap_or_default().trim_end_matches(['\n', '\r']).to_owned(),
                        })
                    })
                    .collect();
                lines.truncate(query.limit);
                return Ok(lines);
            }
            let next = page.next_forward_token().map(str::to_owned);
            if next.is_none() || next == token {
                break;
            }
            token = next;
        }
        Ok(Vec::new())
    }

    async fn delete(&self, object: &str) -> Result<(), BackendError> {
        self.streams.lock().await.retain(|(o, _), _| o != object);
        // Batch jobs cannot be deleted: a finished one is marked as done with, a live one
        // (an orphan) terminated first.
        for id in self.find(object).await? {
            self.client
                .terminate_job()
                .job_id(&id)
                .reason(format!("{STOP_REASON_PREFIX} collected"))
                .send()
                .await
                .map_err(|e| sdk_error(&self.config.name, "terminate job", e))?;
            self.tag(&id, TAG_COLLECTED, "true").await?;
            self.collected.lock().await.insert(id);
        }
        self.forget_cache().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_jobs_only_replica_reads_the_jobs_stream_and_a_gang_rank_reads_its_node_jobs() {
        assert_eq!(stream_holder("abc", false, 0).as_deref(), Some("abc"));
        assert_eq!(stream_holder("abc", false, 1), None, "a container job has one replica");
        assert_eq!(stream_holder("abc", true, 0).as_deref(), Some("abc#0"));
        assert_eq!(stream_holder("abc", true, 3).as_deref(), Some("abc#3"));
    }

    #[test]
    fn a_replica_asks_batch_for_its_cpu_in_whole_vcpus_and_its_memory_and_more_than_an_instance_is_refused() {
        let pool: PoolConfig = toml::from_str(
            "name = \"p5\"\njob_queue = \"q\"\ninstance_type = \"p5.48xlarge\"\ngpu_class = \"h100-80gb\"
             gpus_per_instance = 8\nmax_instances = 1\nprice_per_gpu_hour = 3.0\nvcpus_per_gpu = 24\nmemory_mib_per_gpu = 200000",
        )
        .unwrap();
        let gang = |cpu_millis, memory_mib| Gang {
            object: "fw-1-1".into(),
            job_id: JobId::from_u128(1),
            attempt: 1,
            team: "ml".into(),
            job_name: "train".into(),
            gpu_class: "h100-80gb".into(),
            priority_class: "experiment".into(),
            image: "img:1".into(),
            command: Vec::new(),
            env: Default::default(),
            labels: Default::default(),
            max_runtime: Duration::from_secs(60),
            cpu_millis,
            memory_mib,
            workload: Default::default(),
            replicas: Vec::new(),
            array: None,
            service: None,
            extra_of: None,
        };
        let asked = replica_resources(&gang(Some(2500), Some(32768)), &pool, 2, "aws").unwrap().unwrap();
        let figures: Vec<(String, String)> = asked
            .iter()
            .map(|r| {
                (
                    r.r#type().map(|t| t.as_str().to_owned()).unwrap_or_default(),
                    r.value().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        assert_eq!(
            figures,
            [("GPU".into(), "2".into()), ("VCPU".into(), "3".into()), ("MEMORY".into(), "32768".into())]
        );
        assert!(replica_resources(&gang(None, None), &pool, 2, "aws").unwrap().is_none(), "the definition's figures");
        match replica_resources(&gang(Some(193_000), Some(1024)), &pool, 8, "aws") {
            Err(BackendError::Rejected(m)) => assert!(m.contains("193 vCPUs") && m.contains("192 vCPUs"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_log_group_is_batchs_default_unless_configured() {
        let base = "name = \"aws\"\nregion = \"us-east-1\"\npool = []\n";
        let default: AwsBatchConfig = toml::from_str(base).unwrap();
        assert_eq!(default.log_group, "/aws/batch/job");
        let custom: AwsBatchConfig = toml::from_str(&format!("log_group = \"/fairway/jobs\"\n{base}")).unwrap();
        assert_eq!(custom.log_group, "/fairway/jobs");
    }
}
