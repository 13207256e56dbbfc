//! The `gcp-batch` backend: elastic GPU pools on Google Cloud Batch, over its REST API (the
//! v1 `jobs` resource). Each pool is a machine type with attached accelerators, standard or
//! spot, offering one GPU class as capacity without topology at its own price. An admitted
//! gang becomes one Batch job whose task group has one task per replica, one per VM.
//!
//! - The job id is the object name (derived from the job id and attempt) and the request id
//!   a UUID derived from it, so a retried create is answered `ALREADY_EXISTS` (or deduplicated)
//!   instead of running twice.
//! - Labels carry the cluster, team, job id, attempt and priority class for cost allocation.
//! - Status comes from listing the cluster's jobs by label, at most once per poll interval.
//! - Logs are what the tasks wrote to Cloud Logging (the job asks for `CLOUD_LOGGING`): log
//!   `projects/{project}/logs/batch_task_logs`, the entries labelled with the job's `uid` as
//!   `job_uid` and with a `task_id` naming the task index (the replica's rank), listed with
//!   `entries:list` oldest first.
//!
//! Configuration (one `[[cluster]]` of the clusters file):
//!
//! ```toml
//! [[cluster]]
//! name = "gcp"
//! kind = "gcp-batch"
//! project = "ml-platform"
//! location = "us-central1"
//! # endpoint = "https://batch.googleapis.com"            # the Batch API's root URL
//! # logging_endpoint = "https://logging.googleapis.com"  # the Cloud Logging API's root URL
//! # access_token_file = "/var/run/secrets/gcp/token"     # else the metadata server
//! poll_interval_seconds = 5                              # status is read at most this often
//! [[cluster.pool]]
//! name = "gcp-h100"
//! machine_type = "a3-highgpu-8g"
//! accelerator_type = "nvidia-h100-80gb"
//! gpu_class = "h100-80gb"
//! gpus_per_instance = 8
//! max_instances = 2
//! price_per_gpu_hour = 7.20
//! ```
//!
//! Its tests are contract tests: a fake server that keeps state, validating every request
//! against the schemas of Google's discovery document (`server/tests/gcp_batch.rs`).

pub mod status;

use std::{
    collections::{HashMap, VecDeque},
    path::PathBuf,
    time::{Duration, Instant},
};

use crate::domain::{workload::CloudSecretStore, JobId};
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::Mutex;
use uuid::Uuid;

use super::{
    pools::{self, elastic_pool},
    Backend, BackendError, Gang, InventoryNode, LogLine, LogQuery, ObjectStatus, Phase,
};

/// A `gcp-batch` cluster's settings, from the clusters file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcpBatchConfig {
    /// The Fairway cluster name.
    pub name: String,
    pub project: String,
    /// The region jobs run in, e.g. `us-central1`.
    pub location: String,
    /// The Batch API's root URL.
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// The Cloud Logging API's root URL, where the tasks' output is read; the same token is
    /// sent (it needs `logging.logEntries.list`, e.g. the Logs Viewer role).
    #[serde(default = "default_logging_endpoint")]
    pub logging_endpoint: String,
    /// A file holding an OAuth access token, re-read on every call (kept fresh by a
    /// sidecar); without it, tokens come from the metadata server of the VM or pod
    /// (workload identity).
    pub access_token_file: Option<PathBuf>,
    /// Status is read at most this often.
    #[serde(default = "default_poll_interval")]
    pub poll_interval_seconds: u64,
    #[serde(rename = "pool")]
    pub pools: Vec<GcpPoolConfig>,
}

fn default_endpoint() -> String {
    "https://batch.googleapis.com".into()
}
fn default_logging_endpoint() -> String {
    "https://logging.googleapis.com".into()
}
fn default_poll_interval() -> u64 {
    5
}

/// One elastic pool: a machine type with accelerators, standard or spot.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcpPoolConfig {
    pub name: String,
    /// e.g. `a3-highgpu-8g`.
    pub machine_type: String,
    /// e.g. `nvidia-h100-80gb`.
    pub accelerator_type: String,
    pub gpu_class: String,
    pub gpus_per_instance: u32,
    pub max_instances: u32,
    /// Price per GPU-hour in the platform currency.
    pub price_per_gpu_hour: f64,
    /// Spot VMs (`provisioningModel: SPOT`).
    #[serde(default)]
    pub spot: bool,
    /// The NVIDIA driver its instances' image runs, e.g. `550.90.07`; jobs that require a
    /// minimum run here only when this meets it.
    #[serde(default)]
    pub driver_version: Option<String>,
    /// The CUDA version that driver supports, e.g. `12.4`.
    #[serde(default)]
    pub cuda_version: Option<String>,
}

elastic_pool!(GcpPoolConfig);

impl GcpBatchConfig {
    /// Checks what the engine and the service would refuse later.
    pub fn validate(&self) -> Result<(), String> {
        pools::validate(&self.name, &self.pools)
    }
}

/// The backend of one Google Cloud project and region.
pub struct GcpBatchBackend {
    http: reqwest::Client,
    config: GcpBatchConfig,
    token: Mutex<Option<(String, Instant)>>,
    cache: Mutex<Option<(Instant, Vec<Value>)>>,
    /// Object → its Batch job's `uid`, which its log entries carry. Kept past the job's
    /// deletion (Cloud Logging keeps the lines, and late ones still arrive), for the
    /// [`UIDS_REMEMBERED`] most recent objects.
    uids: Mutex<Uids>,
}

/// Object → job uid, with the order they were learnt in, oldest first.
#[derive(Default)]
struct Uids {
    by_object: HashMap<String, String>,
    learnt: VecDeque<String>,
}

/// How many objects' job uids are kept.
const UIDS_REMEMBERED: usize = 4096;
/// Cloud Logging answers at most this many entries a page.
const MAX_LOG_ENTRIES_PER_PAGE: usize = 1000;
/// Empty pages one read follows at most (a page may be empty while the search goes on).
const MAX_LOG_PAGES: usize = 5;
/// The log Batch writes its tasks' standard output and error to.
const TASK_LOG: &str = "batch_task_logs";

const LABEL_CLUSTER: &str = "fairway-cluster";
const LABEL_TEAM: &str = "fairway-team";
const LABEL_JOB: &str = "fairway-job-id";
const LABEL_ATTEMPT: &str = "fairway-attempt";
const LABEL_PRIORITY: &str = "fairway-priority-class";
const METADATA_TOKEN_URL: &str =
    "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token";

/// Google's label values: lowercase letters, digits, `-` and `_`, at most 63 characters.
fn label_value(v: &str) -> String {
    v.chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .take(63)
        .collect()
}

/// The request id of an object's create: the same for every retry of it.
pub fn request_id(object: &str) -> Uuid {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(object.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

impl GcpBatchBackend {
    /// A backend over the REST API.
    pub fn new(config: GcpBatchConfig) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("an HTTP client with the default TLS settings");
        Self { http, config, token: Mutex::default(), cache: Mutex::default(), uids: Mutex::default() }
    }

    fn jobs_url(&self) -> String {
        format!(
            "{}/v1/projects/{}/locations/{}/jobs",
            self.config.endpoint.trim_end_matches('/'),
            self.config.project,
            self.config.location
        )
    }

    fn transient(&self, what: &str, e: impl std::fmt::Display) -> BackendError {
        BackendError::Transient(format!("cluster {}: {what}: {e}", self.config.name))
    }

    /// An access token: from the token file, or the metadata server (cached until shortly
    /// before it expires).
    async fn token(&self) -> Result<String, BackendError> {
        if let Some(path) = &self.config.access_token_file {
            let token = tokio::fs::read_to_string(path).await.map_err(|e| self.transient("read access token", e))?;
            return Ok(token.trim().to_owned());
        }
        let mut cached = self.token.lock().await;
        if let Some((token, until)) = cached.as_ref() {
            if Instant::now() < *until {
                return Ok(token.clone());
            }
        }
        let answer: Value = self
            .http
            .get(METADATA_TOKEN_URL)
            .header("Metadata-Flavor", "Google")
            .send()
            .await
            .and_then(reqwest::Response::error_for_status)
            .map_err(|e| self.transient("metadata server token", e))?
            .json()
            .await
            .map_err(|e| self.transient("metadata server token", e))?;
        let token = answer["access_token"].as_str().unwrap_or_default().to_owned();
        let lifetime = answer["expires_in"].as_u64().unwrap_or(300).saturating_sub(60);
        *cached = Some((token.clone(), Instant::now() + Duration::from_secs(lifetime)));
        Ok(token)
    }

    /// Sends a request and maps the answer to the retry classes. `accepted` lists the
    /// non-2xx answers that mean success for this call (a 404 on a delete, a 409 on a
    /// create); any other answer is an error, so an error body is never read as a result.
    async fn call(
        &self,
        what: &str,
        request: reqwest::RequestBuilder,
        accepted: &[u16],
    ) -> Result<(u16, Value), BackendError> {
        let token = self.token().await?;
        let response = request.bearer_auth(token).send().await.map_err(|e| self.transient(what, e))?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        let google = body["error"]["status"].as_str().unwrap_or_default();
        let message = format!(
            "cluster {}: {what}: {status} {google} {}",
            self.config.name,
            body["error"]["message"].as_str().unwrap_or_default()
        );
        if (200..300).contains(&status) || accepted.contains(&status) {
            return Ok((status, body));
        }
        match status {
            // The token expired or was revoked: fetch a new one and try again.
            401 => {
                *self.token.lock().await = None;
                Err(BackendError::Transient(message))
            }
            // Quota exhausted for the region: no capacity there now.
            403 | 429 if google == "RESOURCE_EXHAUSTED" && message.contains("quota") => {
                Err(BackendError::CapacityUnavailable(message))
            }
            400 | 403 | 404 => Err(BackendError::Rejected(message)),
            _ => Err(BackendError::Transient(message)),
        }
    }

    /// The create body of a gang on a pool.
    pub fn job_body(&self, gang: &Gang, pool: &GcpPoolConfig, gpus: u32, secrets: &[(String, String)]) -> Value {
        let replicas = gang.replicas.len();
        let env = gang.env();
        // References only: Batch reads each Secret Manager version when the task starts.
        let mut environment = json!({ "variables": env });
        if !secrets.is_empty() {
            let secrets: serde_json::Map<String, Value> =
                secrets.iter().map(|(name, reference)| (name.clone(), json!(reference))).collect();
            environment["secretVariables"] = Value::Object(secrets);
        }
        let mut container = json!({ "imageUri": gang.image });
        if let Some((entrypoint, args)) = gang.command.split_first() {
            container["entrypoint"] = json!(entrypoint);
            container["commands"] = json!(args);
        }
        // What one task (replica) needs of its VM; a job from before it was asked for asks
        // for nothing, and Batch's defaults apply.
        let mut compute = json!({});
        if let Some(millis) = gang.cpu_millis {
            compute["cpuMilli"] = json!(millis.to_string());
        }
        if let Some(mib) = gang.memory_mib {
            compute["memoryMib"] = json!(mib.to_string());
        }
        json!({
            "taskGroups": [{
                // int64 fields travel as strings in Google's JSON mapping.
                "taskCount": replicas.to_string(),
                "parallelism": replicas.to_string(),
                "taskCountPerNode": "1",
                // Ranks find each other through /etc/hosts (BATCH_TASK_INDEX is the rank).
                "requireHostsFile": replicas > 1,
                "taskSpec": {
                    "runnables": [{ "container": container }],
                    "environment": environment,
                    "maxRunDuration": format!("{}s", gang.max_runtime.as_secs().max(1)),
                    "maxRetryCount": 0,
                    "computeResource": compute,
                },
            }],
            "allocationPolicy": {
                "instances": [{
                    "policy": {
                        "machineType": pool.machine_type,
                        "provisioningModel": if pool.spot { "SPOT" } else { "STANDARD" },
                        "accelerators": [{ "type": pool.accelerator_type, "count": gpus.to_string() }],
                    },
                    "installGpuDrivers": true,
                }],
            },
            "labels": {
                LABEL_CLUSTER: label_value(&self.config.name),
                LABEL_TEAM: label_value(&gang.team),
                LABEL_JOB: gang.job_id.to_string(),
                LABEL_ATTEMPT: gang.attempt.to_string(),
                LABEL_PRIORITY: label_value(&gang.priority_class),
            },
            "logsPolicy": { "destination": "CLOUD_LOGGING" },
        })
    }

    async fn list(&self) -> Result<Vec<Value>, BackendError> {
        let filter = format!("labels.{LABEL_CLUSTER}=\"{}\"", label_value(&self.config.name));
        let mut jobs = Vec::new();
        let mut page: Option<String> = None;
        loop {
            let mut query = vec![("filter", filter.clone()), ("pageSize", "100".to_owned())];
            if let Some(token) = &page {
                query.push(("pageToken", token.clone()));
            }
            let (_, body) = self.call("list jobs", self.http.get(self.jobs_url()).query(&query), &[]).await?;
            jobs.extend(body["jobs"].as_array().cloned().unwrap_or_default());
            page = body["nextPageToken"].as_str().filter(|t| !t.is_empty()).map(str::to_owned);
            if page.is_none() {
                return Ok(jobs);
            }
        }
    }

    async fn forget_cache(&self) {
        *self.cache.lock().await = None;
    }

    /// The `uid` of an object's Batch job: remembered, else from the last listing, else read;
    /// `None` when there is no such job.
    async fn job_uid(&self, object: &str) -> Result<Option<String>, BackendError> {
        if let Some(uid) = self.uids.lock().await.by_object.get(object) {
            return Ok(Some(uid.clone()));
        }
        let suffix = format!("/jobs/{object}");
        let listed = self.cache.lock().await.as_ref().and_then(|(_, jobs)| {
            jobs.iter()
                .find(|j| j["name"].as_str().is_some_and(|n| n.ends_with(&suffix)))
                .and_then(|j| j["uid"].as_str())
                .map(str::to_owned)
        });
        let uid = match listed {
            Some(uid) => uid,
            None => {
                let url = format!("{}/{object}", self.jobs_url());
                let (status, job) = self.call("get job", self.http.get(url), &[404]).await?;
                match job["uid"].as_str() {
                    Some(uid) if status != 404 && !uid.is_empty() => uid.to_owned(),
                    _ => return Ok(None),
                }
            }
        };
        let mut uids = self.uids.lock().await;
        if uids.by_object.insert(object.to_owned(), uid.clone()).is_none() {
            uids.learnt.push_back(object.to_owned());
            while uids.learnt.len() > UIDS_REMEMBERED {
                if let Some(oldest) = uids.learnt.pop_front() {
                    uids.by_object.remove(&oldest);
                }
            }
        }
        Ok(Some(uid))
    }

    /// The `entries:list` body reading one task's lines of a job, oldest first.
    fn log_request(&self, job_uid: &str, query: &LogQuery) -> Value {
        json!({
            "resourceNames": [format!("projects/{}", self.config.project)],
            "filter": log_filter(&self.config.project, job_uid, query),
            "orderBy": "timestamp asc",
            "pageSize": query.limit.min(MAX_LOG_ENTRIES_PER_PAGE),
        })
    }
}

/// The Logging query selecting one task's entries of a job's task log, at or after `since`.
/// The task is told by its `task_id` label, `task/<job uid>-group0-<index>/0/0`, matched up
/// to the index only: what follows it is the service's to change, and an older form of the
/// label had neither the `task/` prefix nor the suffix.
fn log_filter(project: &str, job_uid: &str, query: &LogQuery) -> String {
    let mut filter = format!(
        "logName=\"projects/{project}/logs/{TASK_LOG}\" AND labels.job_uid=\"{}\" AND \
         labels.task_id=~\"^(task/)?{}-group0-{}(/|$)\"",
        quoted(job_uid),
        quoted(&regex_escape(job_uid)),
        query.replica
    );
    if let Some(since) = query.since {
        filter.push_str(&format!(" AND timestamp>=\"{}\"", since.to_rfc3339_opts(SecondsFormat::Nanos, true)));
    }
    filter
}

/// A value for a quoted string of the Logging query language.
fn quoted(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"")
}

/// A literal inside a regular expression (RE2) of the Logging query language.
fn regex_escape(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// One entry of `entries:list` as a line: its time and its text (`textPayload`, else
/// `jsonPayload.message`, else the JSON payload itself).
fn log_line(entry: &Value) -> Option<LogLine> {
    let at = entry["timestamp"].as_str()?.parse::<DateTime<Utc>>().ok()?;
    let text = match (&entry["textPayload"], &entry["jsonPayload"]) {
        (Value::String(text), _) => text.clone(),
        (_, Value::Object(payload)) => match payload.get("message") {
            Some(Value::String(message)) => message.clone(),
            _ => Value::Object(payload.clone()).to_string(),
        },
        _ => String::new(),
    };
    Some(LogLine { at, text: text.trim_end_matches(['\n', '\r']).to_owned() })
}

#[async_trait::async_trait]
impl Backend for GcpBatchBackend {
    fn kind(&self) -> &'static str {
        "gcp-batch"
    }

    async fn inventory(&self) -> Result<Vec<InventoryNode>, BackendError> {
        Ok(pools::inventory(&self.config.pools))
    }

    async fn submit(&self, gang: &Gang) -> Result<(), BackendError> {
        let pool_name = gang.first_node();
        let pool = self
            .config
            .pools
            .iter()
            .find(|p| p.name == pool_name)
            .ok_or_else(|| BackendError::Rejected(format!("cluster {}: no pool {pool_name}", self.config.name)))?;
        let gpus = gang.pool_shape(&self.config.name, pool.gpus_per_instance, &format!("{} VM", pool.machine_type))?;
        let secrets = pools::cloud_secrets(gang, &self.config.name, "Google Cloud Batch", CloudSecretStore::Gcp)?;
        let body = self.job_body(gang, pool, gpus, &secrets);
        let request = self
            .http
            .post(self.jobs_url())
            .query(&[("jobId", gang.object.as_str()), ("requestId", &request_id(&gang.object).to_string())])
            .json(&body);
        // 409: a retried create of a job that exists; it is the one we created before.
        self.call("create job", request, &[409]).await?;
        self.forget_cache().await;
        Ok(())
    }

    async fn stop(&self, object: &str, _grace: Duration) -> Result<(), BackendError> {
        // Batch stops the VMs; the grace period cannot be chosen per call.
        let url = format!("{}/{object}:cancel", self.jobs_url());
        let body = json!({ "requestId": request_id(&format!("{object}:cancel")).to_string() });
        // 404: gone already; 400: already finished or cancelling (FAILED_PRECONDITION).
        match self.call("cancel job", self.http.post(url).json(&body), &[404]).await {
            Err(BackendError::Rejected(m)) if m.contains("FAILED_PRECONDITION") => {}
            other => {
                other?;
            }
        }
        self.forget_cache().await;
        Ok(())
    }

    async fn objects(&self) -> Result<Vec<ObjectStatus>, BackendError> {
        let jobs = {
            let mut cache = self.cache.lock().await;
            match cache.as_ref() {
                Some((at, jobs)) if at.elapsed() < Duration::from_secs(self.config.poll_interval_seconds) => {
                    jobs.clone()
                }
                _ => {
                    let jobs = self.list().await?;
                    *cache = Some((Instant::now(), jobs.clone()));
                    jobs
                }
            }
        };
        let now = Utc::now();
        Ok(jobs
            .iter()
            .filter(|job| job["status"]["state"] != "DELETION_IN_PROGRESS")
            .filter_map(|job| {
                let object = job["name"].as_str()?.rsplit('/').next()?.to_owned();
                let job_id = job["labels"][LABEL_JOB].as_str().and_then(|v| v.parse::<JobId>().ok())?;
                let attempt = job["labels"][LABEL_ATTEMPT].as_str().and_then(|v| v.parse::<i32>().ok())?;
                let (phase, stop_requested) = status::phase(job, now);
                let next_change = matches!(phase, Phase::Pending | Phase::Running { .. })
                    .then(|| now + chrono::Duration::seconds(self.config.poll_interval_seconds as i64));
                Some(ObjectStatus { object, job_id, attempt, phase, stop_requested, next_change })
            })
            .collect())
    }

    async fn logs(&self, query: &LogQuery) -> Result<Vec<LogLine>, BackendError> {
        if query.limit == 0 {
            return Ok(Vec::new());
        }
        let Some(uid) = self.job_uid(&query.object).await? else {
            return Ok(Vec::new());
        };
        let url = format!("{}/v2/entries:list", self.config.logging_endpoint.trim_end_matches('/'));
        let mut body = self.log_request(&uid, query);
        // A short page is fine (the collector asks again from its last line), but a page may
        // also be empty while the search goes on: follow the token past empty pages, a few.
        for _ in 0..MAX_LOG_PAGES {
            let (_, answer) = self.call("list log entries", self.http.post(&url).json(&body), &[]).await?;
            let mut lines: Vec<LogLine> = answer["entries"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .filter_map(log_line)
                .collect();
            if !lines.is_empty() {
                lines.truncate(query.limit);
                return Ok(lines);
            }
            match answer["nextPageToken"].as_str().filter(|t| !t.is_empty()) {
                Some(token) => body["pageToken"] = json!(token),
                None => break,
            }
        }
        Ok(Vec::new())
    }

    async fn delete(&self, object: &str) -> Result<(), BackendError> {
        let url = format!("{}/{object}", self.jobs_url());
        let request_id = request_id(&format!("{object}:delete")).to_string();
        self.call("delete job", self.http.delete(url).query(&[("requestId", request_id)]), &[404]).await?;
        self.forget_cache().await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_follow_googles_rules_and_request_ids_are_stable_per_object() {
        assert_eq!(label_value("Vision.Team"), "vision_team");
        assert_eq!(label_value(&"x".repeat(80)).len(), 63);
        assert_eq!(request_id("fw-1-1"), request_id("fw-1-1"));
        assert_ne!(request_id("fw-1-1"), request_id("fw-1-2"));
    }

    #[test]
    fn the_log_filter_names_the_task_log_the_job_and_the_task_index_and_bounds_the_time() {
        let query = LogQuery {
            object: "fw-1-1".into(),
            replica: 1,
            since: Some("2026-03-01T10:00:00.123456789Z".parse().unwrap()),
            limit: 10,
        };
        assert_eq!(
            log_filter("ml", "fw-1-1-ab12", &query),
            "logName=\"projects/ml/logs/batch_task_logs\" AND labels.job_uid=\"fw-1-1-ab12\" AND \
             labels.task_id=~\"^(task/)?fw-1-1-ab12-group0-1(/|$)\" AND timestamp>=\"2026-03-01T10:00:00.123456789Z\""
        );
        let from_start = log_filter("ml", "a.b", &LogQuery { since: None, ..query });
        assert!(from_start.ends_with(r#"labels.task_id=~"^(task/)?a\\.b-group0-1(/|$)""#), "{from_start}");
        assert_eq!(quoted(r#"say "hi"\"#), r#"say \"hi\"\\"#);
    }

    #[test]
    fn a_log_entrys_text_is_its_text_payload_else_its_json_message() {
        let at = "2026-03-01T10:00:00.5Z";
        let text = log_line(&json!({"timestamp": at, "textPayload": "epoch 1\n"})).unwrap();
        assert_eq!((text.at.to_rfc3339(), text.text.as_str()), ("2026-03-01T10:00:00.500+00:00".into(), "epoch 1"));
        let message = log_line(&json!({"timestamp": at, "jsonPayload": {"message": "structured"}})).unwrap();
        assert_eq!(message.text, "structured");
        let other = log_line(&json!({"timestamp": at, "jsonPayload": {"loss": 1.5}})).unwrap();
        assert_eq!(other.text, r#"{"loss":1.5}"#);
        assert!(log_line(&json!({"textPayload": "no time"})).is_none());
    }
}
