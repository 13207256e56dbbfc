//! moto's server, a faithful fake of AWS Batch (see ../shared/peers/CLOUD_BATCH.md): one per
//! test, on a free loopback port, without Docker (jobs end at once: SUCCEEDED, or FAILED after
//! `MOTO_SIMPLE_BATCH_FAIL_AFTER` seconds). `.ci/install-moto` installs it into a cached
//! virtualenv; `FAIRWAY_MOTO_SERVER` may name the executable instead.
//!
//! The same server is CloudWatch Logs. Without Docker no container runs, so nothing writes
//! there: moto's Batch names a job's log stream in `DescribeJobs`
//! (`<definition>/default/<job id>`, on the job itself even for a multi-node parallel job,
//! whose node jobs `<job id>#<rank>` it does not describe) but creates neither the group nor
//! the stream; [`Moto::write_log`] plays the container.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use aws_sdk_batch::{
    types::{CeState, CeType, ComputeEnvironmentOrder, JqState},
    Client,
};

use super::free_port;

/// The account moto answers for.
pub const ACCOUNT: &str = "123456789012";

/// A running moto server.
pub struct Moto {
    pub url: String,
    child: Child,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn executable() -> PathBuf {
    if let Some(path) = std::env::var_os("FAIRWAY_MOTO_SERVER") {
        return PathBuf::from(path);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_owned();
    let out = Command::new("bash")
        .arg(root.join(".ci/install-moto"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run .ci/install-moto");
    assert!(out.status.success(), ".ci/install-moto failed; see its output above");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).lines().last().expect("moto_server path").trim())
}

impl Moto {
    /// Starts a server; `fail_after` makes every job fail that many seconds after submission.
    pub async fn start(dir: &Path, fail_after: Option<u32>) -> Self {
        let port = free_port();
        let log = std::fs::File::create(dir.join(format!("moto-{port}.log"))).expect("log");
        let mut cmd = Command::new(executable());
        cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        if let Some(seconds) = fail_after {
            cmd.env("MOTO_SIMPLE_BATCH_FAIL_AFTER", seconds.to_string());
        }
        let child = cmd.spawn().expect("start moto_server");
        let moto = Moto { url: format!("http://127.0.0.1:{port}"), child };
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let started = Instant::now();
        loop {
            let config = http
                .post(format!("{}/moto-api/config", moto.url))
                .json(&serde_json::json!({"batch": {"use_docker": false}}))
                .send()
                .await;
            if config.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "moto_server did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        moto
    }

    /// A Batch client of this server, with the static credentials moto accepts.
    pub async fn client(&self) -> Client {
        let config = aws_sdk_batch::Config::builder()
            .behavior_version(aws_sdk_batch::config::BehaviorVersion::latest())
            .region(aws_sdk_batch::config::Region::new("us-east-1"))
            .endpoint_url(&self.url)
            .credentials_provider(aws_sdk_batch::config::Credentials::new("testing", "testing", None, None, "tests"))
            .http_client(fairway::backends::aws_batch::http_client())
            .build();
        Client::from_conf(config)
    }

    /// A CloudWatch Logs client of this server, with the same credentials.
    pub async fn logs_client(&self) -> aws_sdk_cloudwatchlogs::Client {
        let config = aws_sdk_cloudwatchlogs::Config::builder()
            .behavior_version(aws_sdk_cloudwatchlogs::config::BehaviorVersion::latest())
            .region(aws_sdk_cloudwatchlogs::config::Region::new("us-east-1"))
            .endpoint_url(&self.url)
            .credentials_provider(aws_sdk_cloudwatchlogs::config::Credentials::new(
                "testing", "testing", None, None, "tests",
            ))
            .http_client(fairway::backends::aws_batch::http_client())
            .build();
        aws_sdk_cloudwatchlogs::Client::from_conf(config)
    }

    /// Writes `lines` (time, text) to a log stream as a container's log driver would,
    /// creating the group and the stream when missing.
    pub async fn write_log(&self, group: &str, stream: &str, lines: &[(chrono::DateTime<chrono::Utc>, &str)]) {
        let logs = self.logs_client().await;
        // Made once per test: "already exists" means an earlier call made it.
        let _ = logs.create_log_group().log_group_name(group).send().await;
        let _ = logs.create_log_stream().log_group_name(group).log_stream_name(stream).send().await;
        let events: Vec<_> = lines
            .iter()
            .map(|(at, text)| {
                aws_sdk_cloudwatchlogs::types::InputLogEvent::builder()
                    .timestamp(at.timestamp_millis())
                    .message(*text)
                    .build()
                    .expect("a log event")
            })
            .collect();
        let put = logs
            .put_log_events()
            .log_group_name(group)
            .log_stream_name(stream)
            .set_log_events(Some(events))
            .send()
            .await
            .expect("put log events");
        // Events too old (14 days) or too far ahead are refused one by one, not as an error.
        assert!(put.rejected_log_events_info().is_none(), "events refused: {put:?}");
    }

    /// The one job named `name` in `queue`, described.
    pub async fn job(&self, queue: &str, name: &str) -> aws_sdk_batch::types::JobDetail {
        let client = self.client().await;
        let filter = aws_sdk_batch::types::KeyValuesPair::builder().name("JOB_NAME").values(name).build();
        let listed = client.list_jobs().job_queue(queue).filters(filter).send().await.expect("list jobs");
        let [summary] = listed.job_summary_list() else {
            panic!("not one job {name} in {queue}: {listed:?}");
        };
        let described = client.describe_jobs().jobs(summary.job_id().unwrap()).send().await.expect("describe");
        described.jobs()[0].clone()
    }

    /// The IAM service role, an unmanaged compute environment and a job queue named `queue`.
    pub async fn queue(&self, queue: &str) {
        let role = format!("{queue}-role");
        // IAM's query API, as the SDK would send it; moto routes it by the credential scope.
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let auth = "AWS4-HMAC-SHA256 Credential=testing/20261123/us-east-1/iam/aws4_request, \
                    SignedHeaders=host, Signature=0";
        let created = http
            .post(&self.url)
            .header("Authorization", auth)
            .form(&[
                ("Action", "CreateRole"),
                ("Version", "2010-05-08"),
                ("RoleName", role.as_str()),
                ("AssumeRolePolicyDocument", r#"{"Version":"2012-10-17","Statement":[]}"#),
            ])
            .send()
            .await
            .expect("create role");
        assert!(created.status().is_success(), "create role: {}", created.text().await.unwrap_or_default());
        let client = self.client().await;
        let environment = format!("{queue}-env");
        client
            .create_compute_environment()
            .compute_environment_name(&environment)
            .r#type(CeType::Unmanaged)
            .state(CeState::Enabled)
            .service_role(format!("arn:aws:iam::{ACCOUNT}:role/{role}"))
            .send()
            .await
            .expect("create compute environment");
        let order = ComputeEnvironmentOrder::builder().order(1).compute_environment(&environment).build();
        client
            .create_job_queue()
            .job_queue_name(queue)
            .state(JqState::Enabled)
            .priority(1)
            .compute_environment_order(order)
            .send()
            .await
            .expect("create job queue");
    }

    /// How many jobs of each name the queue holds, finished ones included.
    pub async fn jobs_by_name(&self, queue: &str) -> std::collections::BTreeMap<String, usize> {
        let client = self.client().await;
        let filter = aws_sdk_batch::types::KeyValuesPair::builder().name("JOB_NAME").values("fw-*").build();
        let listed = client.list_jobs().job_queue(queue).filters(filter).send().await.expect("list jobs");
        let mut names = std::collections::BTreeMap::new();
        for job in listed.job_summary_list() {
            *names.entry(job.job_name().unwrap_or_default().to_owned()).or_default() += 1;
        }
        names
    }
}
