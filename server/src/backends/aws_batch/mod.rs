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
//!
//! The status mapping lives in [`status`].

pub mod status;

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use crate::domain::JobId;
use aws_sdk_batch::{
    error::ProvideErrorMetadata as _,
    types::{
        ContainerOverrides, ContainerProperties, JobDefinitionType, JobStatus, JobTimeout, KeyValuePair, KeyValuesPair,
        NodeOverrides, NodeProperties, NodePropertyOverride, NodeRangeProperty, ResourceRequirement, ResourceType,
    },
    Client,
};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use sha2::Digest as _;
use tokio::sync::Mutex;

use self::status::{BatchJob, STOP_REASON_PREFIX};
use super::{
    pools::{self, elastic_pool},
    Backend, BackendError, Gang, InventoryNode, ObjectStatus, Phase,
};

/// An `aws-batch` cluster's settings, from the clusters file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AwsBatchConfig {
    /// The Fairway cluster name.
    pub name: String,
    /// AWS region, e.g. `us-east-1`.
    pub region: String,
    /// Another endpoint for the Batch API (a VPC endpoint, or a test server).
    pub endpoint_url: Option<String>,
    /// Status is read at most this often (the Batch API is rate limited).
    #[serde(default = "default_poll_interval")]
    pub poll_interval_seconds: u64,
    /// The pools, one per job queue and GPU class.
    #[serde(rename = "pool")]
    pub pools: Vec<PoolConfig>,
}

fn default_poll_interval() -> u64 {
    5
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
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new(self.region.clone()))
            .http_client(http_client());
        if let Some(url) = &self.endpoint_url {
            loader = loader.endpoint_url(url);
        }
        Client::new(&loader.load().await)
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
    config: AwsBatchConfig,
    /// Job definition name → ARN, registered or found once per process.
    definitions: Mutex<HashMap<String, String>>,
    /// The last status read and when, reused within the poll interval.
    cache: Mutex<Option<(Instant, Vec<BatchJob>)>>,
    /// Jobs known to be collected, so they are not described again.
    collected: Mutex<HashSet<String>>,
    /// The queues were found as configured.
    verified: Mutex<bool>,
}

/// Tags every job carries.
const TAG_CLUSTER: &str = "fairway:cluster";
const TAG_TEAM: &str = "fairway:team";
const TAG_JOB: &str = "fairway:job-id";
const TAG_ATTEMPT: &str = "fairway:attempt";
const TAG_PRIORITY: &str = "fairway:priority-class";
const TAG_STOP: &str = "fairway:stop-requested";
const TAG_COLLECTED: &str = "fairway:collected";

impl AwsBatchBackend {
    /// A backend over `client`.
    pub fn new(client: Client, config: AwsBatchConfig) -> Self {
        Self {
            client,
            config,
            definitions: Mutex::default(),
            cache: Mutex::default(),
            collected: Mutex::default(),
            verified: Mutex::default(),
        }
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
    async fn definition(&self, gang: &Gang, pool: &PoolConfig, gpus: u32) -> Result<String, BackendError> {
        let replicas = gang.replicas.len() as i32;
        // The command travels as an override at submission, so jobs of one image and shape
        // share a definition however their command lines differ.
        let shape = format!(
            "{}\u{0}{gpus}\u{0}{}\u{0}{}\u{0}{replicas}",
            gang.image,
            gpus * pool.vcpus_per_gpu,
            gpus * pool.memory_mib_per_gpu
        );
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
                let container = ContainerProperties::builder()
                    .image(&gang.image)
                    .set_resource_requirements(Some(resources))
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
        let definition = self.definition(gang, pool, gpus).await?;
        let replicas = gang.replicas.len();
        let env: Vec<KeyValuePair> =
            gang.env().into_iter().map(|(k, v)| KeyValuePair::builder().name(k).value(v).build()).collect();
        let overrides = ContainerOverrides::builder()
            .set_environment(Some(env))
            .set_command((!gang.command.is_empty()).then(|| gang.command.clone()))
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

    async fn delete(&self, object: &str) -> Result<(), BackendError> {
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
