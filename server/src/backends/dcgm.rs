//! What the GPUs did, from NVIDIA's DCGM as `dcgm-exporter` publishes it and a Prometheus
//! server keeps it. Allocation (what quotas and bills count) says a job holds a GPU; these
//! fields say whether it used it: SM activity and tensor-core activity are the truth,
//! "GPU utilisation" only says a kernel was resident, however little of the GPU it kept busy.
//!
//! Platform teams already run dcgm-exporter and Prometheus, so Fairway reads them rather than
//! run an agent: one instant query per pass over Prometheus's HTTP API
//! (`/api/v1/query`), the series of our pods picked by the pod label dcgm-exporter adds on
//! Kubernetes (`pod`; `exported_pod` where a scrape's own labels took the name). The
//! simulated cluster publishes the same names and labels (`backends::sim::dcgm_exposition`),
//! so the whole path runs without a GPU.

use std::{collections::BTreeMap, time::Duration};

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::BackendError;
pub use crate::domain::activity::ReplicaActivity;
use crate::domain::{gpu_health, JobId};

/// GPU utilisation, percent: the share of the last interval in which any kernel ran.
pub const GPU_UTIL: &str = "DCGM_FI_DEV_GPU_UTIL";
/// Ratio (0–1) of cycles in which a streaming multiprocessor had a warp resident: how much of
/// the GPU the work kept busy.
pub const SM_ACTIVE: &str = "DCGM_FI_PROF_SM_ACTIVE";
/// Ratio (0–1) of cycles in which the tensor cores were busy.
pub const TENSOR_ACTIVE: &str = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE";
/// Framebuffer memory used, MiB.
pub const FB_USED: &str = "DCGM_FI_DEV_FB_USED";
/// Framebuffer memory free, MiB.
pub const FB_FREE: &str = "DCGM_FI_DEV_FB_FREE";

/// Every field the reader asks for.
pub const FIELDS: [&str; 5] = [GPU_UTIL, SM_ACTIVE, TENSOR_ACTIVE, FB_USED, FB_FREE];

/// The label dcgm-exporter puts the GPU's ordinal in; with the host it names one GPU.
pub const GPU_LABEL: &str = "gpu";
/// The label dcgm-exporter puts the node's name in.
pub const HOST_LABEL: &str = "Hostname";

/// The job, attempt and replica a pod of ours runs: pods are named
/// `<object>-<rank>`, and objects `fw-<job id, 32 hex digits>-<attempt>`
/// (`backends::object_name`, `kubernetes::manifest::pod_name`).
pub fn replica_of_pod(pod: &str) -> Option<(JobId, i32, i32)> {
    let rest = pod.strip_prefix("fw-")?;
    let (hex, tail) = (rest.get(..32)?, rest.get(32..)?);
    let mut numbers = tail.strip_prefix('-')?.split('-');
    let attempt = numbers.next()?.parse::<i32>().ok().filter(|a| *a >= 1)?;
    let replica = numbers.next()?.parse::<i32>().ok().filter(|r| *r >= 0)?;
    if numbers.next().is_some() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((JobId::from(uuid::Uuid::parse_str(hex).ok()?), attempt, replica))
}

/// The job and attempt a backend object of ours is: `fw-<job id, 32 hex digits>-<attempt>`
/// (`backends::object_name`), as a cloud batch pool names its jobs.
pub fn attempt_of_object(object: &str) -> Option<(JobId, i32)> {
    let rest = object.strip_prefix("fw-")?;
    let (hex, tail) = (rest.get(..32)?, rest.get(32..)?);
    let attempt = tail.strip_prefix('-')?.parse::<i32>().ok().filter(|a| *a >= 1)?;
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((JobId::from(uuid::Uuid::parse_str(hex).ok()?), attempt))
}

/// Which labels of a DCGM series name the replica of ours whose GPU it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeriesLabels {
    /// The pod's name, as dcgm-exporter adds it on Kubernetes (`pod`; `exported_pod` where
    /// a scrape's own labels took the name).
    pub pod: String,
    /// Where the GPUs of a cloud batch pool's instances are read, the label a scrape's
    /// relabelling puts the batch job's name in (`fw-<job>-<attempt>`), from the instance's
    /// or the job's tags.
    pub object: Option<String>,
    /// With `object`, the label holding the replica's index (a multi-node job's node
    /// index); a series without it is replica 0.
    pub replica: Option<String>,
}

impl SeriesLabels {
    /// Pods named in `pod`, and nothing else.
    pub fn pods(pod: &str) -> Self {
        Self { pod: pod.to_owned(), object: None, replica: None }
    }

    /// The job, attempt and replica a series' labels name, if ours.
    fn replica_of(&self, labels: &Value) -> Option<(JobId, i32, i32)> {
        if let Some(key) = labels[self.pod.as_str()].as_str().and_then(replica_of_pod) {
            return Some(key);
        }
        let (job, attempt) = labels[self.object.as_deref()?].as_str().and_then(attempt_of_object)?;
        let replica = match self.replica.as_deref().and_then(|l| labels[l].as_str()) {
            Some(index) => index.parse::<i32>().ok().filter(|r| *r >= 0)?,
            None => 0,
        };
        Some((job, attempt, replica))
    }
}

/// The PromQL instant query for every field of our replicas' GPUs: pods, and the cloud
/// pools' jobs where a label names them.
pub fn query(labels: &SeriesLabels) -> String {
    let fields = FIELDS.join("|");
    let pods = format!(r#"{{__name__=~"{fields}",{}=~"fw-.+"}}"#, labels.pod);
    match &labels.object {
        Some(object) => format!(r#"{pods} or {{__name__=~"{fields}",{object}=~"fw-.+"}}"#),
        None => pods,
    }
}

/// One GPU's fields, as read.
#[derive(Default)]
struct Gpu {
    fields: BTreeMap<&'static str, f64>,
}

/// A replica's GPUs by (host, ordinal).
type ReplicaGpus = BTreeMap<(String, String), Gpu>;

/// The replicas an instant query's answer (`/api/v1/query`'s JSON) describes. Series of
/// pods that are not ours, and values that are not numbers, are skipped; an answer that is
/// not a successful vector is an error, in words.
pub fn activity(answer: &Value, names: &SeriesLabels) -> Result<Vec<ReplicaActivity>, String> {
    if answer["status"] != "success" {
        return Err(format!("Prometheus answered {}: {}", answer["status"], answer["error"]));
    }
    if answer["data"]["resultType"] != "vector" {
        return Err(format!("expected a vector, Prometheus answered {}", answer["data"]["resultType"]));
    }
    let rows = answer["data"]["result"].as_array().ok_or("the answer has no result list")?;
    let mut replicas: BTreeMap<(JobId, i32, i32), ReplicaGpus> = BTreeMap::new();
    for row in rows {
        let labels = &row["metric"];
        let Some(field) = labels["__name__"].as_str().and_then(|n| FIELDS.iter().find(|f| **f == n)) else { continue };
        let Some(key) = names.replica_of(labels) else { continue };
        let Some(value) = row["value"][1].as_str().and_then(|v| v.parse::<f64>().ok()).filter(|v| v.is_finite()) else {
            continue;
        };
        let gpu = (
            labels[HOST_LABEL].as_str().unwrap_or_default().to_owned(),
            labels[GPU_LABEL].as_str().unwrap_or_default().to_owned(),
        );
        replicas.entry(key).or_default().entry(gpu).or_default().fields.insert(field, value);
    }
    Ok(replicas
        .into_iter()
        .filter_map(|((job_id, attempt, replica), gpus)| {
            let n = gpus.len();
            let mean = |field: &str| {
                gpus.values().map(|g| g.fields.get(field).copied().unwrap_or(0.0)).sum::<f64>() / n as f64
            };
            let fullest = gpus.values().max_by(|a, b| {
                let used = |g: &Gpu| g.fields.get(FB_USED).copied().unwrap_or(0.0);
                used(a).total_cmp(&used(b))
            })?;
            let used = fullest.fields.get(FB_USED).copied().unwrap_or(0.0);
            let free = fullest.fields.get(FB_FREE).copied().unwrap_or(0.0);
            Some(ReplicaActivity {
                job_id,
                attempt,
                replica,
                gpus: i32::try_from(n).unwrap_or(i32::MAX),
                gpu_util_pct: mean(GPU_UTIL).clamp(0.0, 100.0),
                sm_active: mean(SM_ACTIVE).clamp(0.0, 1.0),
                tensor_active: mean(TENSOR_ACTIVE).clamp(0.0, 1.0),
                fb_used_mib: used.max(0.0).round() as i64,
                fb_total_mib: (used + free).max(0.0).round() as i64,
            })
        })
        .collect())
}

/// One GPU's health field as Prometheus kept it over the window asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthRead {
    /// The node, from dcgm-exporter's `Hostname` label.
    pub host: String,
    /// The GPU's ordinal on the node, from the `gpu` label.
    pub gpu: String,
    /// One of [`crate::domain::gpu_health::FIELDS`].
    pub field: &'static str,
    /// The latest value.
    pub value: f64,
    /// The first sample of the window's last run of that value: when the GPU first reported
    /// it, to the scrape (or the window's start, for a value older than the window).
    pub since: DateTime<Utc>,
}

/// A series' samples: (when, value).
type Samples = Vec<(DateTime<Utc>, f64)>;

/// The PromQL range query for every GPU's health fields over the last `window_seconds`:
/// every GPU, held by a pod of ours or not, since an idle GPU that failed must not be given
/// to the next gang.
pub fn health_query(window_seconds: u64) -> String {
    format!(r#"{{__name__=~"{}"}}[{window_seconds}s]"#, gpu_health::FIELDS.join("|"))
}

/// The health reads a range query's answer (`/api/v1/query`'s JSON, a matrix) describes, one
/// per GPU and field. Series without a host or a GPU, and samples that are not numbers, are
/// skipped; an answer that is not a successful matrix is an error, in words.
pub fn health(answer: &Value) -> Result<Vec<HealthRead>, String> {
    if answer["status"] != "success" {
        return Err(format!("Prometheus answered {}: {}", answer["status"], answer["error"]));
    }
    if answer["data"]["resultType"] != "matrix" {
        return Err(format!("expected a matrix, Prometheus answered {}", answer["data"]["resultType"]));
    }
    let rows = answer["data"]["result"].as_array().ok_or("the answer has no result list")?;
    // One GPU may have several series in the window: dcgm-exporter adds the pod's labels
    // while a pod holds it, and a MIG-partitioned GPU is listed per profile. Their samples
    // are one history.
    let mut samples: BTreeMap<(String, String, &'static str), Samples> = BTreeMap::new();
    for row in rows {
        let labels = &row["metric"];
        let Some(field) = labels["__name__"].as_str().and_then(|n| gpu_health::FIELDS.iter().find(|f| **f == n)) else {
            continue;
        };
        let (Some(host), Some(gpu)) = (labels[HOST_LABEL].as_str(), labels[GPU_LABEL].as_str()) else { continue };
        let history = samples.entry((host.to_owned(), gpu.to_owned(), *field)).or_default();
        history.extend(row["values"].as_array().into_iter().flatten().filter_map(|pair| {
            let at = pair[0].as_f64()?;
            let value = pair[1].as_str()?.parse::<f64>().ok().filter(|v| v.is_finite())?;
            Some((DateTime::from_timestamp_millis((at * 1000.0).round() as i64)?, value))
        }));
    }
    let mut reads = Vec::new();
    for ((host, gpu, field), mut history) in samples {
        // At one instant, the highest value: a fault on any series of the GPU is its fault.
        history.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.total_cmp(&a.1)));
        history.dedup_by(|later, earlier| later.0 == earlier.0);
        let Some(&(_, value)) = history.last() else { continue };
        let run = history.iter().rev().take_while(|(_, v)| *v == value).count();
        let since = history[history.len() - run].0;
        reads.push(HealthRead { host, gpu, field, value, since });
    }
    Ok(reads)
}

/// A Prometheus server that scrapes dcgm-exporter (or the simulated cluster's exporter).
#[derive(Debug, Clone)]
pub struct PrometheusSource {
    /// The server's base URL, e.g. `http://prometheus:9090`.
    url: String,
    /// The labels that name our replicas.
    labels: SeriesLabels,
    http: reqwest::Client,
}

impl PrometheusSource {
    /// A source at `url` whose series name our replicas in `labels`.
    pub fn new(url: &str, labels: SeriesLabels) -> Result<Self, BackendError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| BackendError::Rejected(format!("an HTTP client for Prometheus: {e}")))?;
        Ok(Self { url: url.trim_end_matches('/').to_owned(), labels, http })
    }

    /// The latest sample of every replica of ours that Prometheus holds.
    pub async fn read(&self) -> Result<Vec<ReplicaActivity>, BackendError> {
        let answer = self.query(&query(&self.labels)).await?;
        activity(&answer, &self.labels).map_err(BackendError::Transient)
    }

    /// Every GPU's health fields over the last `window`.
    pub async fn read_health(&self, window: Duration) -> Result<Vec<HealthRead>, BackendError> {
        let answer = self.query(&health_query(window.as_secs().max(1))).await?;
        health(&answer).map_err(BackendError::Transient)
    }

    /// Prometheus's answer to `promql` at this instant (`/api/v1/query`), as JSON.
    async fn query(&self, promql: &str) -> Result<Value, BackendError> {
        let unreachable = |e: reqwest::Error| BackendError::Transient(format!("Prometheus at {}: {e}", self.url));
        self.http
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", promql)])
            .send()
            .await
            .map_err(unreachable)?
            .json()
            .await
            .map_err(unreachable)
    }
}

/// One sample of a text exposition (Prometheus's text format, as dcgm-exporter serves it):
/// its labels, with the metric's name under `__name__`, and its value.
pub type ExposedSample = (BTreeMap<String, String>, f64);

/// The samples of a text exposition. Comments, and lines that are not a sample, are skipped;
/// a label value's escapes (`\\`, `\"`, `\n`) are read.
pub fn parse_exposition(text: &str) -> Vec<ExposedSample> {
    text.lines().filter_map(|line| parse_sample(line.trim())).collect()
}

fn parse_sample(line: &str) -> Option<ExposedSample> {
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let mut labels = BTreeMap::from([("__name__".to_owned(), line[..name_end].to_owned())]);
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices();
        loop {
            let (start, c) = chars.next()?;
            if c == '}' {
                rest = &inner[start + 1..];
                break;
            }
            if c == ',' || c.is_whitespace() {
                continue;
            }
            let eq = start + inner[start..].find('=')?;
            let key = inner[start..eq].trim().to_owned();
            // Skip to the opening quote, then read to the closing one.
            while chars.next()?.0 < eq + 1 {}
            let mut value = String::new();
            loop {
                match chars.next()?.1 {
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    '"' => break,
                    other => value.push(other),
                }
            }
            labels.insert(key, value);
        }
    }
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    Some((labels, value))
}

/// The answers a Prometheus server would give for one scrape of `samples` taken at `at`: an
/// instant vector (for [`activity`]) and a one-sample matrix (for [`health`]).
fn as_answers(samples: &[ExposedSample], at: DateTime<Utc>) -> (Value, Value) {
    let seconds = at.timestamp_millis() as f64 / 1000.0;
    let vector: Vec<Value> = samples
        .iter()
        .map(|(labels, value)| serde_json::json!({"metric": labels, "value": [seconds, value.to_string()]}))
        .collect();
    let matrix: Vec<Value> = samples
        .iter()
        .filter(|(labels, _)| labels.get("__name__").is_some_and(|n| gpu_health::FIELDS.contains(&n.as_str())))
        .map(|(labels, value)| serde_json::json!({"metric": labels, "values": [[seconds, value.to_string()]]}))
        .collect();
    (
        serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": vector}}),
        serde_json::json!({"status": "success", "data": {"resultType": "matrix", "result": matrix}}),
    )
}

/// dcgm-exporter endpoints read directly, without a Prometheus server: each scrape is read
/// as Prometheus would answer for that instant. Without history, a health fault begins at
/// the scrape that first showed it.
#[derive(Debug, Clone)]
pub struct ExporterSource {
    urls: Vec<String>,
    labels: SeriesLabels,
    http: reqwest::Client,
}

impl ExporterSource {
    /// A source that scrapes `urls` (each an exporter's `/metrics`); our replicas are named
    /// in `labels`.
    pub fn new(urls: &[String], labels: SeriesLabels) -> Result<Self, BackendError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| BackendError::Rejected(format!("an HTTP client for dcgm-exporter: {e}")))?;
        Ok(Self { urls: urls.to_vec(), labels, http })
    }

    /// One scrape of every endpoint: its samples, and when it was taken. An endpoint that
    /// does not answer fails the read (a node whose exporter is down says nothing of its
    /// GPUs, and must not read as idle).
    async fn scrape(&self) -> Result<(Vec<ExposedSample>, DateTime<Utc>), BackendError> {
        let at = Utc::now();
        let mut samples = Vec::new();
        for url in &self.urls {
            let failed = |e: reqwest::Error| BackendError::Transient(format!("dcgm-exporter at {url}: {e}"));
            let text = self.http.get(url).send().await.and_then(reqwest::Response::error_for_status).map_err(failed)?;
            samples.extend(parse_exposition(&text.text().await.map_err(failed)?));
        }
        Ok((samples, at))
    }
}

/// Where GPU activity and health are read from.
#[derive(Debug, Clone)]
pub enum DcgmSource {
    /// A Prometheus server that keeps dcgm-exporter's series.
    Prometheus(PrometheusSource),
    /// dcgm-exporter endpoints, scraped at each read.
    Exporters(ExporterSource),
}

impl DcgmSource {
    /// The latest sample of every replica of ours.
    pub async fn read(&self) -> Result<Vec<ReplicaActivity>, BackendError> {
        match self {
            Self::Prometheus(p) => p.read().await,
            Self::Exporters(e) => {
                let (samples, at) = e.scrape().await?;
                activity(&as_answers(&samples, at).0, &e.labels).map_err(BackendError::Transient)
            }
        }
    }

    /// Every GPU's health fields over the last `window` (an exporter has only its latest).
    pub async fn read_health(&self, window: Duration) -> Result<Vec<HealthRead>, BackendError> {
        match self {
            Self::Prometheus(p) => p.read_health(window).await,
            Self::Exporters(e) => {
                let (samples, at) = e.scrape().await?;
                health(&as_answers(&samples, at).1).map_err(BackendError::Transient)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const JOB: &str = "0190c0de0000700080000000000000aa";

    fn series(name: &str, pod: &str, host: &str, gpu: &str, value: &str) -> Value {
        json!({"metric": {"__name__": name, "pod": pod, "namespace": "team-ml", "Hostname": host, "gpu": gpu,
                          "UUID": format!("GPU-{host}-{gpu}"), "modelName": "NVIDIA H100 80GB HBM3"},
               "value": [1_764_300_000.0, value]})
    }

    fn answer(result: Vec<Value>) -> Value {
        json!({"status": "success", "data": {"resultType": "vector", "result": result}})
    }

    #[test]
    fn a_pod_name_gives_the_job_its_attempt_and_its_rank_and_anything_else_is_not_ours() {
        let (job, attempt, replica) = replica_of_pod(&format!("fw-{JOB}-3-12")).unwrap();
        assert_eq!((job.to_string().replace('-', ""), attempt, replica), (JOB.to_owned(), 3, 12));
        for other in [
            "prometheus-0".to_owned(),
            format!("fw-{JOB}-3"),
            format!("fw-{JOB}-0-1"),
            format!("fw-{JOB}-1-2-3"),
            format!("fw-{}-1-0", "z".repeat(32)),
            format!("fw-svc-{JOB}-1-0"),
        ] {
            assert_eq!(replica_of_pod(&other), None, "{other}");
        }
    }

    #[test]
    fn a_replica_reads_as_the_mean_of_its_gpus_and_the_memory_of_its_fullest() {
        let pod = format!("fw-{JOB}-1-0");
        let read = activity(
            &answer(vec![
                series(SM_ACTIVE, &pod, "n1", "0", "0.02"),
                series(SM_ACTIVE, &pod, "n1", "1", "0.04"),
                series(GPU_UTIL, &pod, "n1", "0", "10"),
                series(GPU_UTIL, &pod, "n1", "1", "30"),
                series(TENSOR_ACTIVE, &pod, "n1", "0", "0"),
                series(TENSOR_ACTIVE, &pod, "n1", "1", "0.01"),
                series(FB_USED, &pod, "n1", "0", "9216"),
                series(FB_FREE, &pod, "n1", "0", "72704"),
                series(FB_USED, &pod, "n1", "1", "1024"),
                series(FB_FREE, &pod, "n1", "1", "80896"),
                // Another pod's series, and a GPU no pod holds, are not this replica's.
                series(SM_ACTIVE, "prometheus-0", "n1", "2", "0.9"),
                json!({"metric": {"__name__": SM_ACTIVE, "Hostname": "n1", "gpu": "3"}, "value": [0, "0.5"]}),
                series(SM_ACTIVE, &pod, "n1", "1", "NaN"),
            ]),
            &SeriesLabels::pods("pod"),
        )
        .unwrap();
        assert_eq!(read.len(), 1, "{read:?}");
        let r = &read[0];
        assert_eq!((r.attempt, r.replica, r.gpus), (1, 0, 2));
        assert!((r.sm_active - 0.03).abs() < 1e-9, "{r:?}");
        assert!((r.gpu_util_pct - 20.0).abs() < 1e-9, "{r:?}");
        assert!((r.tensor_active - 0.005).abs() < 1e-9, "{r:?}");
        assert_eq!((r.fb_used_mib, r.fb_total_mib), (9216, 81920));
    }

    #[test]
    fn a_failed_query_is_an_error_that_says_what_prometheus_said() {
        let failed = json!({"status": "error", "errorType": "bad_data", "error": "parse error"});
        assert!(activity(&failed, &SeriesLabels::pods("pod")).unwrap_err().contains("parse error"));
        let matrix = json!({"status": "success", "data": {"resultType": "matrix", "result": []}});
        assert!(activity(&matrix, &SeriesLabels::pods("pod")).unwrap_err().contains("vector"));
    }

    #[test]
    fn a_gpus_health_is_its_latest_value_since_the_first_sample_of_that_value() {
        let sample = |at: f64, v: &str| json!([at, v]);
        let answer = json!({"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"__name__": gpu_health::XID_ERRORS, "Hostname": "n1", "gpu": "3", "UUID": "GPU-x"},
             "values": [sample(85.0, "0"), sample(100.0, "0"), sample(115.0, "79"), sample(130.0, "79")]},
            // The same GPU while a pod held it: one history with the series above, and at one
            // instant the fault wins.
            {"metric": {"__name__": gpu_health::XID_ERRORS, "Hostname": "n1", "gpu": "3", "UUID": "GPU-x", "pod": "p"},
             "values": [sample(70.0, "0"), sample(85.0, "0"), sample(100.0, "79")]},
            {"metric": {"__name__": gpu_health::ROW_REMAP_FAILURE, "Hostname": "n1", "gpu": "0"},
             "values": [sample(100.0, "0"), sample(115.5, "0")]},
            // No host, another field, and no samples: skipped.
            {"metric": {"__name__": gpu_health::XID_ERRORS, "gpu": "1"}, "values": [sample(100.0, "79")]},
            {"metric": {"__name__": SM_ACTIVE, "Hostname": "n1", "gpu": "1"}, "values": [sample(100.0, "1")]},
            {"metric": {"__name__": gpu_health::XID_ERRORS, "Hostname": "n2", "gpu": "0"}, "values": []},
        ]}});
        let reads = health(&answer).unwrap();
        let at = |s: f64| DateTime::from_timestamp_millis((s * 1000.0) as i64).unwrap();
        assert_eq!(
            reads,
            vec![
                HealthRead {
                    host: "n1".into(),
                    gpu: "0".into(),
                    field: gpu_health::ROW_REMAP_FAILURE,
                    value: 0.0,
                    since: at(100.0)
                },
                HealthRead {
                    host: "n1".into(),
                    gpu: "3".into(),
                    field: gpu_health::XID_ERRORS,
                    value: 79.0,
                    since: at(100.0)
                },
            ]
        );
        assert!(health(&json!({"status": "success", "data": {"resultType": "vector", "result": []}}))
            .unwrap_err()
            .contains("matrix"));
        let q = health_query(60);
        assert!(
            q.contains(gpu_health::XID_ERRORS) && q.contains(gpu_health::ROW_REMAP_FAILURE) && q.ends_with("[60s]"),
            "{q}"
        );
    }

    #[test]
    fn an_exporters_text_reads_as_prometheus_would_answer_for_it() {
        let pod = format!("fw-{JOB}-1-0");
        let text = format!(
            "# HELP DCGM_FI_PROF_SM_ACTIVE ratio\n# TYPE DCGM_FI_PROF_SM_ACTIVE gauge\n\
             DCGM_FI_PROF_SM_ACTIVE{{gpu=\"0\",UUID=\"GPU-1\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"n1\",pod=\"{pod}\"}} 0.25\n\
             DCGM_FI_DEV_FB_USED{{gpu=\"0\",Hostname=\"n1\",pod=\"{pod}\"}} 9216\n\
             DCGM_FI_DEV_FB_FREE{{gpu=\"0\",Hostname=\"n1\",pod=\"{pod}\"}} 72704\n\
             DCGM_FI_DEV_XID_ERRORS{{gpu=\"1\",Hostname=\"n1\",note=\"a \\\"quoted\\\" \\\\ value\"}} 79 1764300000000\n\
             not a sample\n"
        );
        let samples = parse_exposition(&text);
        assert_eq!(samples.len(), 4, "{samples:?}");
        assert_eq!(samples[3].0["note"], r#"a "quoted" \ value"#);
        assert_eq!(samples[3].1, 79.0);
        let at = DateTime::from_timestamp(1_764_300_000, 0).unwrap();
        let (vector, matrix) = as_answers(&samples, at);
        let read = activity(&vector, &SeriesLabels::pods("pod")).unwrap();
        assert_eq!(read.len(), 1);
        assert!((read[0].sm_active - 0.25).abs() < 1e-9);
        assert_eq!((read[0].fb_used_mib, read[0].fb_total_mib), (9216, 81920));
        let faults = health(&matrix).unwrap();
        assert_eq!(faults.len(), 1);
        assert_eq!((faults[0].gpu.as_str(), faults[0].value, faults[0].since), ("1", 79.0, at));
    }

    #[test]
    fn the_query_names_every_field_and_only_our_pods_by_the_configured_label() {
        let q = query(&SeriesLabels::pods("exported_pod"));
        for field in FIELDS {
            assert!(q.contains(field), "{q}");
        }
        assert!(q.contains(r#"exported_pod=~"fw-.+""#), "{q}");
        assert!(!q.contains(" or "), "{q}");
        let cloud = SeriesLabels { object: Some("batch_job".into()), ..SeriesLabels::pods("pod") };
        assert!(query(&cloud).ends_with(r#" or {__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_PROF_SM_ACTIVE|DCGM_FI_PROF_PIPE_TENSOR_ACTIVE|DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_FREE",batch_job=~"fw-.+"}"#), "{}", query(&cloud));
    }

    #[test]
    fn a_cloud_pools_series_names_its_replica_by_the_batch_jobs_name_and_node_index() {
        let names = SeriesLabels {
            pod: "pod".into(),
            object: Some("batch_job".into()),
            replica: Some("batch_node_index".into()),
        };
        let job = JobId::from(uuid::Uuid::parse_str(JOB).unwrap());
        let series = |labels: Value| {
            let mut metric = labels;
            metric["__name__"] = json!(SM_ACTIVE);
            metric["Hostname"] = json!("ip-10-0-0-1");
            metric["gpu"] = json!("0");
            json!({"metric": metric, "value": [0, "0.5"]})
        };
        let read = activity(
            &answer(vec![
                series(json!({"batch_job": format!("fw-{JOB}-2"), "batch_node_index": "3"})),
                series(json!({"batch_job": format!("fw-{JOB}-2")})),
                // Not ours, or not an index: skipped.
                series(json!({"batch_job": "nightly-etl"})),
                series(json!({"batch_job": format!("fw-{JOB}-2"), "batch_node_index": "x"})),
            ]),
            &names,
        )
        .unwrap();
        let keys: Vec<_> = read.iter().map(|r| (r.job_id, r.attempt, r.replica)).collect();
        assert_eq!(keys, [(job, 2, 0), (job, 2, 3)]);
        assert_eq!(attempt_of_object(&format!("fw-{JOB}-0")), None);
        assert_eq!(attempt_of_object(&format!("fw-{JOB}-1-0")), None);
    }
}
