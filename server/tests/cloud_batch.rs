//! The `aws-batch` backend against moto's server (a faithful fake of AWS Batch, see
//! `common::moto`), beside the simulated on-premises cluster, through a real `fairway serve`
//! and real HTTP: bursts overflow into the cloud pool at its price, spot-tolerant jobs take
//! the spot pool and no other job does, failures map to outcomes, and killing Fairway during
//! dispatch never submits a job twice.

mod common;

use std::{collections::BTreeMap, time::Duration};

use common::{fresh_dir, moto::Moto, platform::Platform};
use serde_json::{json, Value};

const ON_DEMAND_QUEUE: &str = "fairway-p5-on-demand";
const SPOT_QUEUE: &str = "fairway-p5-spot";

/// One 8×H100 node on premises (the simulator) and an AWS account with an on-demand pool at
/// 6.50 per GPU-hour and a spot pool at 2.10, both of up to 16 H100.
async fn platform(test: &str, moto: &Moto) -> Platform {
    moto.queue(ON_DEMAND_QUEUE).await;
    moto.queue(SPOT_QUEUE).await;
    let dir = fresh_dir(&format!("cloud-{test}-sim"));
    let inventory = dir.join("sim.toml");
    std::fs::write(
        &inventory,
        r#"[[class]]
name = "h100-80gb"
kind = "whole"
memory_mib = 81920

[[node]]
name = "onprem-1"
gpu_class = "h100-80gb"
gpus = 8
rack = "r1"
"#,
    )
    .unwrap();
    let clusters = format!(
        r#"[[cluster]]
name = "onprem"
kind = "sim"
inventory = "{}"

[[cluster]]
name = "aws"
kind = "aws-batch"
region = "us-east-1"
endpoint_url = "{}"
poll_interval_seconds = 1
execution_role_arn = "arn:aws:iam::123456789012:role/fairway-batch-execution"

[[cluster.pool]]
name = "aws-h100"
job_queue = "{ON_DEMAND_QUEUE}"
instance_type = "p5.48xlarge"
gpu_class = "h100-80gb"
gpus_per_instance = 8
max_instances = 2
price_per_gpu_hour = 6.50

[[cluster.pool]]
name = "aws-h100-spot"
job_queue = "{SPOT_QUEUE}"
instance_type = "p5.48xlarge"
gpu_class = "h100-80gb"
gpus_per_instance = 8
max_instances = 2
price_per_gpu_hour = 2.10
spot = true
"#,
        inventory.display(),
        moto.url
    );
    let env =
        [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_EC2_METADATA_DISABLED", "true")];
    let p = Platform::start(test, &clusters, &env).await;
    p.team("ml", "h100-80gb", 8, 24).await;
    p
}

fn job(name: &str, allow_spot: bool, sim_seconds: u32) -> Value {
    json!({"name": name, "gpu_class": "h100-80gb", "replicas": 1, "gpus_per_replica": 8,
           "image": "nvcr.io/nvidia/pytorch:24.05-py3", "command": ["python", "train.py"],
           "priority_class": "experiment", "allow_spot": allow_spot,
           "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": sim_seconds.to_string()}})
}

fn placed_on(job: &Value) -> (String, String) {
    (
        job["cluster"].as_str().unwrap_or_default().to_owned(),
        job["placement"][0]["node"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_runs_in_the_cloud_pool_when_on_premises_is_full_and_spot_only_takes_spot_tolerant_jobs() {
    let dir = fresh_dir("cloud-burst");
    let moto = Moto::start(&dir, None).await;
    let p = platform("burst", &moto).await;
    // The team's reserved quota fills the only on-premises node.
    let onprem = p.submit("ml", job("onprem", false, 600)).await;
    let onprem = p.wait_state(&onprem, "running", Duration::from_secs(30)).await;
    assert_eq!(placed_on(&onprem), ("onprem".to_owned(), "onprem-1".to_owned()));
    // A burst that does not tolerate spot goes to the on-demand pool, and runs to success.
    let burst = p.submit("ml", job("burst", false, 600)).await;
    let burst = p.wait_state(&burst, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(placed_on(&burst), ("aws".to_owned(), "aws-h100".to_owned()));
    // A spot-tolerant one goes to the spot pool.
    let spot = p.submit("ml", job("spot", true, 600)).await;
    let spot = p.wait_state(&spot, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(placed_on(&spot), ("aws".to_owned(), "aws-h100-spot".to_owned()));
    // A gang of two 8-GPU replicas runs as one multi-node parallel job of two nodes.
    let mut gang = job("gang", false, 600);
    gang["replicas"] = json!(2);
    let gang = p.submit("ml", gang).await;
    let gang = p.wait_state(&gang, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(placed_on(&gang), ("aws".to_owned(), "aws-h100".to_owned()));
    let definitions = moto.client().await.describe_job_definitions().status("ACTIVE").send().await.unwrap();
    // (moto keeps a definition's type but does not echo its node properties back.)
    let shapes: Vec<String> =
        definitions.job_definitions().iter().map(|d| d.r#type().unwrap_or_default().to_owned()).collect();
    assert!(shapes.contains(&"multinode".to_owned()), "{shapes:?}");
    // One definition per shape, reused: the two single-replica jobs share theirs.
    assert_eq!(shapes.len(), 2, "{shapes:?}");
    // Each was submitted once, to its pool's queue, tagged for cost allocation.
    let on_demand = moto.jobs_by_name(ON_DEMAND_QUEUE).await;
    let spot_jobs = moto.jobs_by_name(SPOT_QUEUE).await;
    assert_eq!(on_demand.len(), 2, "{on_demand:?}");
    assert_eq!(spot_jobs.len(), 1, "{spot_jobs:?}");
    let client = moto.client().await;
    let id = client
        .list_jobs()
        .job_queue(SPOT_QUEUE)
        .filters(aws_sdk_batch::types::KeyValuesPair::builder().name("JOB_NAME").values("fw-*").build())
        .send()
        .await
        .unwrap()
        .job_summary_list()[0]
        .job_id()
        .unwrap()
        .to_owned();
    let described = client.describe_jobs().jobs(id).send().await.unwrap();
    let tags = described.jobs()[0].tags().cloned().unwrap_or_default();
    assert_eq!(tags.get("fairway:team").map(String::as_str), Some("ml"));
    assert_eq!(tags.get("fairway:job-id").map(String::as_str), spot["id"].as_str());
    assert_eq!(tags.get("fairway:priority-class").map(String::as_str), Some("experiment"));
    // The intervals of the cloud attempts carry their pool's price.
    let rates: BTreeMap<String, Option<i64>> = sqlx::query_as::<_, (String, Option<i64>)>(
        "select j.name, u.rate_micros_per_gpu_hour from usage_intervals u join jobs j on j.id = u.job_id",
    )
    .fetch_all(&p.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(rates["burst"], Some(6_500_000));
    assert_eq!(rates["spot"], Some(2_100_000));
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloud_job_with_cpu_memory_and_a_secret_reference_runs_and_its_definition_names_the_secret_not_its_value() {
    // (moto does not echo a job's resource overrides back; `replica_resources`'s unit test
    // holds their figures.)
    let dir = fresh_dir("cloud-spec");
    let moto = Moto::start(&dir, None).await;
    let p = platform("spec", &moto).await;
    let onprem = p.submit("ml", job("onprem", false, 600)).await;
    p.wait_state(&onprem, "running", Duration::from_secs(30)).await;
    let reference = "arn:aws:secretsmanager:us-east-1:123456789012:secret:fairway/ml/hf-AbCdEf";
    let mut asked = job("with-secret", false, 600);
    // Within one p5.48xlarge of the pool (4 vCPUs and 16 GiB per GPU, as configured).
    asked["cpu"] = json!("23.5");
    asked["memory"] = json!("100Gi");
    asked["cloud_secret_env"] = json!([{"name": "HF_TOKEN", "reference": reference}]);
    let id = p.submit("ml", asked).await;
    p.wait_state(&id, "succeeded", Duration::from_secs(30)).await;
    let client = moto.client().await;
    let definitions = client.describe_job_definitions().status("ACTIVE").send().await.unwrap();
    let roles: Vec<&str> = definitions
        .job_definitions()
        .iter()
        .filter_map(|d| d.container_properties())
        .filter(|c| !c.secrets().is_empty())
        .filter_map(|c| c.execution_role_arn())
        .collect();
    assert_eq!(roles, ["arn:aws:iam::123456789012:role/fairway-batch-execution"], "the role that reads it");
    let secrets: Vec<(String, String)> = definitions
        .job_definitions()
        .iter()
        .filter_map(|d| d.container_properties())
        .flat_map(|c| {
            c.secrets()
                .iter()
                .map(|s| (s.name().unwrap_or_default().to_owned(), s.value_from().unwrap_or_default().to_owned()))
        })
        .collect();
    assert_eq!(
        secrets,
        [("HF_TOKEN".to_owned(), reference.to_owned())],
        "the definition names the secret, not its value"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_cloud_job_reports_an_application_failure_and_its_gpu_time_is_billed_at_the_pool_price() {
    let dir = fresh_dir("cloud-fail");
    // Every job fails two seconds after it is submitted: two seconds of eight GPUs ran.
    let moto = Moto::start(&dir, Some(2)).await;
    let p = platform("fail", &moto).await;
    let onprem = p.submit("ml", job("onprem", false, 600)).await;
    p.wait_state(&onprem, "running", Duration::from_secs(30)).await;
    let burst = p.submit("ml", job("burst", false, 600)).await;
    let failed = p.wait_state(&burst, "failed", Duration::from_secs(60)).await;
    assert_eq!(placed_on(&failed), ("aws".to_owned(), "aws-h100".to_owned()));
    let events = p.events(&burst).await;
    assert!(events.iter().any(|(kind, reason)| kind == "failed" && reason.starts_with("app_failed")), "{events:?}");
    let (rate, gpu_milli_ms): (i64, i64) = sqlx::query_as(
        "select min(l.rate_micros_per_gpu_hour), sum(l.gpu_milli_ms)::int8 from usage_ledger l
         join jobs j on j.id = l.job_id where j.name = 'burst'",
    )
    .fetch_one(&p.pool)
    .await
    .unwrap();
    assert_eq!(rate, 6_500_000, "metered at the pool's price, not the rate card");
    // The service's own start and stop times: about two seconds of 8 GPUs.
    assert!((8 * 1000 * 1_500..=8 * 1000 * 4_000).contains(&gpu_milli_ms), "{gpu_milli_ms}");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_fairway_during_cloud_dispatch_twenty_times_never_submits_a_job_twice() {
    const KILLS: u64 = 20;
    let dir = fresh_dir("cloud-crash");
    let moto = Moto::start(&dir, None).await;
    let mut p = platform("crash", &moto).await;
    let mut rng = fairway::rng::SplitMix64(0x0a75_ba7c);
    let mut submitted = Vec::new();
    for round in 0..KILLS {
        // On premises stays busy, so every job of the round bursts into the cloud pools.
        for i in 0..3 {
            let id = p.submit("ml", job(&format!("r{round}-{i}"), i == 2, 600)).await;
            submitted.push(id);
        }
        tokio::time::sleep(Duration::from_millis(100 + rng.next_u64() % 900)).await;
        p.server.as_ref().unwrap().signal(libc::SIGKILL);
        p.restart();
        p.login().await;
    }
    // Every cloud job ends; none was submitted twice.
    p.wait("every cloud job to finish", Duration::from_secs(120), || {
        let p = &p;
        async move {
            let open: i64 = sqlx::query_scalar(
                "select count(*) from jobs where state not in ('succeeded', 'running') or
                 (state = 'running' and cluster_id <> (select id from clusters where name = 'onprem'))",
            )
            .fetch_one(&p.pool)
            .await
            .unwrap();
            (open == 0).then_some(())
        }
    })
    .await;
    let mut names = moto.jobs_by_name(ON_DEMAND_QUEUE).await;
    names.extend(moto.jobs_by_name(SPOT_QUEUE).await);
    assert!(names.values().all(|&n| n == 1), "a job submitted twice: {names:?}");
    let cloud: i64 =
        sqlx::query_scalar("select count(*) from jobs j join clusters c on c.id = j.cluster_id where c.name = 'aws'")
            .fetch_one(&p.pool)
            .await
            .unwrap();
    assert_eq!(names.len() as i64, cloud, "one AWS job per cloud attempt");
    let twice: i64 = sqlx::query_scalar(
        "select count(*) from (select job_id, attempt from job_events where kind = 'dispatched'
         group by 1, 2 having count(*) > 1) d",
    )
    .fetch_one(&p.pool)
    .await
    .unwrap();
    assert_eq!(twice, 0, "no attempt dispatched twice");
    println!("{} jobs, {} of them in the cloud, across {KILLS} kills", submitted.len(), names.len());
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_interruption_requeues_the_job_without_counting_as_a_failure() {
    let dir = fresh_dir("cloud-spot");
    // Jobs end three seconds after submission (as failures, unless interrupted first).
    let moto = Moto::start(&dir, Some(3)).await;
    let p = platform("spot", &moto).await;
    let onprem = p.submit("ml", job("onprem", false, 600)).await;
    p.wait_state(&onprem, "running", Duration::from_secs(30)).await;
    // No application retries: only an interruption that is not the job's fault may rerun it.
    let mut body = job("tolerant", true, 600);
    body["max_retries"] = json!(0);
    let id = p.submit("ml", body).await;
    // While its first attempt runs, the spot instance is reclaimed under it.
    let client = moto.client().await;
    let batch_job = p
        .wait("the first attempt in the spot queue", Duration::from_secs(30), || {
            let client = &client;
            async move {
                let filter = aws_sdk_batch::types::KeyValuesPair::builder().name("JOB_NAME").values("fw-*").build();
                let listed = client.list_jobs().job_queue(SPOT_QUEUE).filters(filter).send().await.ok()?;
                listed.job_summary_list().first().and_then(|j| j.job_id()).map(str::to_owned)
            }
        })
        .await;
    client
        .terminate_job()
        .job_id(batch_job)
        .reason("Host EC2 (instance i-0abc123def) terminated.")
        .send()
        .await
        .unwrap();
    // The second attempt runs and fails on its own: that is the job's one failure.
    let done = p.wait_state(&id, "failed", Duration::from_secs(60)).await;
    assert_eq!(done["attempt"], 2, "{done:#}");
    assert_eq!(done["preemptions"], 1, "{done:#}");
    let events = p.events(&id).await;
    assert!(events.contains(&("requeued".to_owned(), "preempted".to_owned())), "{events:?}");
    assert_eq!(events.iter().filter(|(kind, _)| kind == "failed").count(), 1, "{events:?}");
    assert_eq!(moto.jobs_by_name(SPOT_QUEUE).await.len(), 2, "one AWS job per attempt");
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_whose_queue_or_compute_environment_is_not_as_configured_is_not_offered() {
    use fairway::backends::{
        aws_batch::{AwsBatchBackend, AwsBatchConfig},
        Backend,
    };
    let dir = fresh_dir("cloud-config");
    let moto = Moto::start(&dir, None).await;
    moto.queue(ON_DEMAND_QUEUE).await;
    let config = |queue: &str, environment: &str| -> AwsBatchConfig {
        toml::from_str(&format!(
            "name = \"aws\"\nregion = \"us-east-1\"\nendpoint_url = \"{}\"\n\
             [[pool]]\nname = \"p\"\njob_queue = \"{queue}\"\ncompute_environment = \"{environment}\"\n\
             instance_type = \"p5.48xlarge\"\ngpu_class = \"h100-80gb\"\ngpus_per_instance = 8\n\
             max_instances = 2\nprice_per_gpu_hour = 6.5\n",
            moto.url
        ))
        .unwrap()
    };
    let backend = |c: AwsBatchConfig| async { AwsBatchBackend::new(moto.client().await, c) };
    let good = backend(config(ON_DEMAND_QUEUE, &format!("{ON_DEMAND_QUEUE}-env"))).await;
    assert_eq!(good.inventory().await.unwrap()[0].gpus, 16);
    let missing = backend(config("no-such-queue", "x")).await.inventory().await.unwrap_err().to_string();
    assert!(missing.contains("job queue no-such-queue does not exist"), "{missing}");
    let elsewhere = backend(config(ON_DEMAND_QUEUE, "other-env")).await.inventory().await.unwrap_err().to_string();
    assert!(elsewhere.contains("does not draw from compute environment other-env"), "{elsewhere}");
}

/// A backend of one on-demand pool on moto, reading logs from `log_group` (Batch's default
/// when `None`).
async fn logs_backend(moto: &Moto, log_group: Option<&str>) -> fairway::backends::aws_batch::AwsBatchBackend {
    use fairway::backends::aws_batch::{AwsBatchBackend, AwsBatchConfig};
    moto.queue(ON_DEMAND_QUEUE).await;
    let group = log_group.map(|g| format!("log_group = \"{g}\"\n")).unwrap_or_default();
    let config: AwsBatchConfig = toml::from_str(&format!(
        "name = \"aws\"\nregion = \"us-east-1\"\nendpoint_url = \"{}\"\n{group}\
         [[pool]]\nname = \"aws-h100\"\njob_queue = \"{ON_DEMAND_QUEUE}\"\ninstance_type = \"p5.48xlarge\"\n\
         gpu_class = \"h100-80gb\"\ngpus_per_instance = 8\nmax_instances = 2\nprice_per_gpu_hour = 6.5\n",
        moto.url
    ))
    .unwrap();
    AwsBatchBackend::new(moto.client().await, config).with_logs(moto.logs_client().await)
}

/// A gang of `replicas` 8-GPU replicas placed on the on-demand pool.
fn placed_gang(replicas: usize) -> fairway::backends::Gang {
    let job = fairway::domain::JobId::new();
    fairway::backends::Gang {
        object: fairway::backends::object_name(job, 1),
        job_id: job,
        attempt: 1,
        team: "ml".into(),
        job_name: "train".into(),
        gpu_class: "h100-80gb".into(),
        priority_class: "experiment".into(),
        image: "nvcr.io/nvidia/pytorch:24.05-py3".into(),
        command: vec!["python".into(), "train.py".into()],
        env: BTreeMap::new(),
        labels: BTreeMap::new(),
        max_runtime: Duration::from_secs(3600),
        cpu_millis: None,
        memory_mib: None,
        workload: Default::default(),
        replicas: (0..replicas)
            .map(|_| fairway::backends::ReplicaSlot { node: "aws-h100".into(), gpus: (0..8).collect() })
            .collect(),
        array: None,
        service: None,
        extra_of: None,
    }
}

fn log_query(
    object: &str,
    replica: u32,
    since: Option<chrono::DateTime<chrono::Utc>>,
    limit: usize,
) -> fairway::backends::LogQuery {
    fairway::backends::LogQuery { object: object.to_owned(), replica, since, limit }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloud_jobs_log_is_its_cloudwatch_stream_oldest_first_from_an_instant_and_at_most_a_limit() {
    use fairway::backends::Backend;
    let dir = fresh_dir("cloud-logs");
    let moto = Moto::start(&dir, None).await;
    let backend = logs_backend(&moto, None).await;
    let gang = placed_gang(1);
    // No job of that name: nothing to read, and no error.
    assert_eq!(backend.logs(&log_query(&gang.object, 0, None, 100)).await.unwrap(), vec![]);
    backend.submit(&gang).await.unwrap();
    let job = moto.job(ON_DEMAND_QUEUE, &gang.object).await;
    let stream = job.container().and_then(|c| c.log_stream_name()).expect("moto names the stream").to_owned();
    // The job is known but its stream does not exist yet: still nothing, and no error.
    assert_eq!(backend.logs(&log_query(&gang.object, 0, None, 100)).await.unwrap(), vec![]);
    // CloudWatch keeps what is at most 14 days old; its times have milliseconds.
    let ago = chrono::Utc::now() - chrono::Duration::minutes(10);
    let t0 = chrono::DateTime::from_timestamp_millis(ago.timestamp_millis()).unwrap();
    let at = |ms: i64| t0 + chrono::Duration::milliseconds(ms);
    moto.write_log("/aws/batch/job", &stream, &[(at(0), "loading data\n"), (at(1000), "epoch 1 loss 2.31")]).await;
    moto.write_log("/aws/batch/job", &stream, &[(at(2000), "epoch 2 loss 1.87"), (at(3500), "saved checkpoint")]).await;
    let read = |since, limit| {
        let (backend, query) = (&backend, log_query(&gang.object, 0, since, limit));
        async move { backend.logs(&query).await }
    };
    let all = read(None, 100).await.unwrap();
    let shown: Vec<(chrono::DateTime<chrono::Utc>, &str)> = all.iter().map(|l| (l.at, l.text.as_str())).collect();
    assert_eq!(
        shown,
        [
            (at(0), "loading data"),
            (at(1000), "epoch 1 loss 2.31"),
            (at(2000), "epoch 2 loss 1.87"),
            (at(3500), "saved checkpoint")
        ],
        "oldest first, with their times, without the newline"
    );
    let texts = |lines: Vec<fairway::backends::LogLine>| lines.into_iter().map(|l| l.text).collect::<Vec<_>>();
    assert_eq!(
        texts(read(Some(at(1000)), 100).await.unwrap()),
        ["epoch 1 loss 2.31", "epoch 2 loss 1.87", "saved checkpoint"],
        "a line written at the instant is included"
    );
    assert_eq!(texts(read(Some(at(1001)), 100).await.unwrap()), ["epoch 2 loss 1.87", "saved checkpoint"]);
    assert_eq!(texts(read(None, 2).await.unwrap()), ["loading data", "epoch 1 loss 2.31"]);
    assert_eq!(texts(read(Some(at(1500)), 1).await.unwrap()), ["epoch 2 loss 1.87"]);
    assert_eq!(read(Some(at(4000)), 100).await.unwrap(), vec![], "nothing written since");
    // A container job has one replica.
    assert_eq!(backend.logs(&log_query(&gang.object, 1, None, 100)).await.unwrap(), vec![]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_ranks_log_is_read_from_its_node_job_never_from_the_parent_jobs_stream() {
    use fairway::backends::Backend;
    let dir = fresh_dir("cloud-logs-gang");
    let moto = Moto::start(&dir, None).await;
    let backend = logs_backend(&moto, None).await;
    let gang = placed_gang(2);
    backend.submit(&gang).await.unwrap();
    let job = moto.job(ON_DEMAND_QUEUE, &gang.object).await;
    assert!(job.node_properties().is_some(), "a multi-node parallel job: {job:?}");
    // moto names a stream on the parent job, which no container of a real gang writes to, and
    // describes no node job `<id>#<rank>`: every rank reads as not started.
    let parent = job.container().and_then(|c| c.log_stream_name()).expect("moto names a stream").to_owned();
    moto.write_log("/aws/batch/job", &parent, &[(chrono::Utc::now(), "not any rank's line")]).await;
    for rank in 0..2 {
        assert_eq!(backend.logs(&log_query(&gang.object, rank, None, 100)).await.unwrap(), vec![], "rank {rank}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_log_group_is_named_in_the_job_definition_and_read_from() {
    use fairway::backends::Backend;
    let dir = fresh_dir("cloud-logs-group");
    let moto = Moto::start(&dir, None).await;
    let backend = logs_backend(&moto, Some("/fairway/jobs")).await;
    let gang = placed_gang(1);
    backend.submit(&gang).await.unwrap();
    let job = moto.job(ON_DEMAND_QUEUE, &gang.object).await;
    let definitions = moto
        .client()
        .await
        .describe_job_definitions()
        .job_definitions(job.job_definition().unwrap())
        .send()
        .await
        .unwrap();
    let logging = definitions.job_definitions()[0]
        .container_properties()
        .and_then(|c| c.log_configuration())
        .expect("a log configuration")
        .clone();
    assert_eq!(logging.log_driver(), Some(&aws_sdk_batch::types::LogDriver::Awslogs));
    assert_eq!(logging.options().and_then(|o| o.get("awslogs-group")).map(String::as_str), Some("/fairway/jobs"));
    let stream = job.container().and_then(|c| c.log_stream_name()).expect("moto names the stream").to_owned();
    let now = chrono::Utc::now();
    moto.write_log("/aws/batch/job", &stream, &[(now, "in the default group")]).await;
    moto.write_log("/fairway/jobs", &stream, &[(now, "in the configured group")]).await;
    let lines = backend.logs(&log_query(&gang.object, 0, None, 100)).await.unwrap();
    assert_eq!(lines.iter().map(|l| l.text.as_str()).collect::<Vec<_>>(), ["in the configured group"]);
}
