//! Contract tests of the `gcp-batch` backend: Google Cloud Batch has no emulator, so a fake
//! server (`common::gcp_fake`) keeps jobs and drives their states, and every request Fairway
//! sends and every answer the fake gives is validated against the schemas of Google's
//! official discovery document. A real `fairway serve` runs beside the simulated on-premises
//! cluster, over real HTTP.

mod common;

use std::time::Duration;

use common::{
    fresh_dir,
    gcp_fake::{self, Direction, GcpFake},
    platform::Platform,
};
use serde_json::{json, Value};

/// One 8×H100 node on premises (the simulator); in Google Cloud a standard pool at 7.20 and
/// a spot pool at 2.40 per GPU-hour, two 8-GPU VMs each.
async fn platform(test: &str, fake: &GcpFake) -> Platform {
    let dir = fresh_dir(&format!("gcp-{test}-files"));
    let inventory = dir.join("sim.toml");
    std::fs::write(
        &inventory,
        "[[class]]\nname = \"h100-80gb\"\nkind = \"whole\"\nmemory_mib = 81920\n\n\
         [[node]]\nname = \"onprem-1\"\ngpu_class = \"h100-80gb\"\ngpus = 8\nrack = \"r1\"\n",
    )
    .unwrap();
    let token = dir.join("token");
    std::fs::write(&token, &fake.token).unwrap();
    let clusters = format!(
        r#"[[cluster]]
name = "onprem"
kind = "sim"
inventory = "{}"

[[cluster]]
name = "gcp"
kind = "gcp-batch"
project = "ml-platform"
location = "us-central1"
endpoint = "{}"
access_token_file = "{}"
poll_interval_seconds = 1

[[cluster.pool]]
name = "gcp-h100"
machine_type = "a3-highgpu-8g"
accelerator_type = "nvidia-h100-80gb"
gpu_class = "h100-80gb"
gpus_per_instance = 8
max_instances = 2
price_per_gpu_hour = 7.20

[[cluster.pool]]
name = "gcp-h100-spot"
machine_type = "a3-highgpu-8g"
accelerator_type = "nvidia-h100-80gb"
gpu_class = "h100-80gb"
gpus_per_instance = 8
max_instances = 2
price_per_gpu_hour = 2.40
spot = true
"#,
        inventory.display(),
        fake.url,
        token.display()
    );
    let p = Platform::start(test, &clusters, &[]).await;
    p.team("ml", "h100-80gb", 8, 32).await;
    // Fill the on-premises node, so what follows bursts into the cloud.
    let onprem = p.submit("ml", job("onprem", 1, false)).await;
    p.wait_state(&onprem, "running", Duration::from_secs(30)).await;
    p
}

fn job(name: &str, replicas: u32, allow_spot: bool) -> Value {
    json!({"name": name, "gpu_class": "h100-80gb", "replicas": replicas, "gpus_per_replica": 8,
           "image": "nvcr.io/nvidia/pytorch:24.05-py3", "command": ["torchrun", "--nnodes=2", "train.py"],
           "priority_class": "experiment", "allow_spot": allow_spot, "max_runtime_seconds": 7200,
           "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "600", "LR": "0.1"}})
}

/// The fake's id of a Fairway job's current attempt.
async fn cloud_job(p: &Platform, fake: &GcpFake, id: &str, attempt: i64) -> String {
    p.wait(&format!("attempt {attempt} of {id} in Google Cloud"), Duration::from_secs(30), || async move {
        fake.jobs()
            .into_iter()
            .find(|(_, j)| {
                j["labels"]["fairway-job-id"] == id
                    && j["labels"]["fairway-attempt"].as_str().and_then(|a| a.parse::<i64>().ok()) == Some(attempt)
            })
            .map(|(k, _)| k)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_bursting_to_google_cloud_is_one_job_with_a_task_per_replica_billed_at_the_pool_price() {
    let fake = GcpFake::start("ml-platform", "us-central1").await;
    let p = platform("burst", &fake).await;
    let mut llama = job("llama", 2, false);
    llama["cpu"] = json!("48");
    llama["memory"] = json!("400Gi");
    llama["cloud_secret_env"] =
        json!([{"name": "HF_TOKEN", "reference": "projects/ml-platform/secrets/fairway_ml_hf/versions/latest"}]);
    let id = p.submit("ml", llama).await;
    let cloud = cloud_job(&p, &fake, &id, 1).await;
    let sent = &fake.jobs()[&cloud];
    let group = &sent["taskGroups"][0];
    assert_eq!(group["taskCount"], "2");
    assert_eq!(group["parallelism"], "2");
    assert_eq!(group["taskCountPerNode"], "1");
    assert_eq!(group["requireHostsFile"], true);
    let container = &group["taskSpec"]["runnables"][0]["container"];
    assert_eq!(container["imageUri"], "nvcr.io/nvidia/pytorch:24.05-py3");
    assert_eq!(container["entrypoint"], "torchrun");
    assert_eq!(group["taskSpec"]["maxRunDuration"], "7200s");
    assert_eq!(group["taskSpec"]["environment"]["variables"]["FAIRWAY_JOB_ID"], id.as_str());
    assert_eq!(group["taskSpec"]["environment"]["variables"]["LR"], "0.1");
    // Each task asks its VM for the replica's CPU and memory, and reads its secret by reference.
    assert_eq!(group["taskSpec"]["computeResource"], json!({"cpuMilli": "48000", "memoryMib": "409600"}));
    assert_eq!(
        group["taskSpec"]["environment"]["secretVariables"],
        json!({"HF_TOKEN": "projects/ml-platform/secrets/fairway_ml_hf/versions/latest"})
    );
    let policy = &sent["allocationPolicy"]["instances"][0]["policy"];
    assert_eq!(policy["machineType"], "a3-highgpu-8g");
    assert_eq!(policy["provisioningModel"], "STANDARD");
    assert_eq!(policy["accelerators"][0], json!({"type": "nvidia-h100-80gb", "count": "8"}));
    assert_eq!(sent["labels"]["fairway-team"], "ml");
    assert_eq!(sent["labels"]["fairway-priority-class"], "experiment");
    // The service runs it, then it succeeds: Fairway follows, from the service's own times.
    fake.drive(&cloud, "SCHEDULED", None);
    fake.drive(&cloud, "RUNNING", None);
    p.wait_state(&id, "running", Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    fake.drive(&cloud, "SUCCEEDED", Some(0));
    let done = p.wait_state(&id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(done["cluster"], "gcp");
    assert_eq!(done["placement"][0]["node"], "gcp-h100");
    // Finished jobs are deleted from the service.
    p.wait("the finished job to be deleted", Duration::from_secs(30), || async {
        (!fake.jobs().contains_key(&cloud)).then_some(())
    })
    .await;
    let (rate, gpu_milli_ms): (i64, i64) = sqlx::query_as(
        "select min(l.rate_micros_per_gpu_hour), sum(l.gpu_milli_ms)::int8 from usage_ledger l
         join jobs j on j.id = l.job_id where j.name = 'llama'",
    )
    .fetch_one(&p.pool)
    .await
    .unwrap();
    assert_eq!(rate, 7_200_000, "metered at the pool's price");
    assert!(gpu_milli_ms >= 16 * 1000 * 1000, "at least a second of 16 GPUs: {gpu_milli_ms}");
    assert_eq!(fake.violations(), Vec::<String>::new());
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_mounts_a_claim_waits_for_a_node_rather_than_burst_into_a_google_cloud_pool() {
    let fake = GcpFake::start("ml-platform", "us-central1").await;
    let p = platform("claim", &fake).await;
    // The node is full; a claim can be mounted only on Kubernetes (here: the node), never in
    // a Cloud Batch pool, so the job waits for the node while an ordinary job bursts.
    let mut asked = job("with-claim", 1, false);
    asked["volumes"] = json!([{"claim": "datasets", "mount_path": "/data"}]);
    let id = p.submit("ml", asked).await;
    let plain = p.submit("ml", job("plain", 1, false)).await;
    cloud_job(&p, &fake, &plain, 1).await;
    let waiting = p
        .wait("the claim's job decided", Duration::from_secs(30), || async {
            let j = p.job(&id).await;
            j["pending"]["reason"].as_str().is_some().then_some(j)
        })
        .await;
    assert_eq!(waiting["state"], "pending", "{waiting:#}");
    assert!(
        fake.jobs().values().all(|j| j["labels"]["fairway-job-id"] != id.as_str()),
        "nothing of it was created in Google Cloud"
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spot_preemption_in_google_cloud_requeues_the_job_without_counting_as_a_failure() {
    let fake = GcpFake::start("ml-platform", "us-central1").await;
    let p = platform("spot", &fake).await;
    let mut body = job("tolerant", 1, true);
    body["max_retries"] = json!(0);
    let id = p.submit("ml", body).await;
    let first = cloud_job(&p, &fake, &id, 1).await;
    assert_eq!(fake.jobs()[&first]["allocationPolicy"]["instances"][0]["policy"]["provisioningModel"], "SPOT");
    fake.drive(&first, "RUNNING", None);
    p.wait_state(&id, "running", Duration::from_secs(30)).await;
    // Google takes the spot VM back: exit code 50001.
    fake.drive(&first, "FAILED", Some(50001));
    let second = cloud_job(&p, &fake, &id, 2).await;
    fake.drive(&second, "RUNNING", None);
    fake.drive(&second, "SUCCEEDED", Some(0));
    let done = p.wait_state(&id, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(done["attempt"], 2);
    assert_eq!(done["preemptions"], 1);
    let events = p.events(&id).await;
    assert!(events.contains(&("requeued".to_owned(), "preempted".to_owned())), "{events:?}");
    assert_eq!(fake.violations(), Vec::<String>::new());
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_cloud_job_cancels_it_in_google_cloud_and_killing_fairway_never_creates_one_twice() {
    let fake = GcpFake::start("ml-platform", "us-central1").await;
    let mut p = platform("cancel", &fake).await;
    let id = p.submit("ml", job("to-cancel", 1, false)).await;
    let cloud = cloud_job(&p, &fake, &id, 1).await;
    fake.drive(&cloud, "RUNNING", None);
    p.wait_state(&id, "running", Duration::from_secs(30)).await;
    p.ok(reqwest::Method::POST, &format!("/api/v1/jobs/{id}/cancel"), Some(json!({}))).await;
    p.wait_state(&id, "cancelled", Duration::from_secs(30)).await;
    // Killed while creating jobs, restarted: each attempt is created once.
    let mut submitted = Vec::new();
    for round in 0..5 {
        submitted.push(p.submit("ml", job(&format!("k{round}"), 1, round % 2 == 0)).await);
        tokio::time::sleep(Duration::from_millis(150 * (round + 1))).await;
        p.server.as_ref().unwrap().signal(libc::SIGKILL);
        p.restart();
        p.login().await;
    }
    for id in &submitted {
        let cloud = cloud_job(&p, &fake, id, 1).await;
        fake.drive(&cloud, "RUNNING", None);
        fake.drive(&cloud, "SUCCEEDED", Some(0));
    }
    for id in &submitted {
        p.wait_state(id, "succeeded", Duration::from_secs(30)).await;
    }
    let creates = fake.creates();
    let mut ids: Vec<&String> = creates.iter().map(|(job, _)| job).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), creates.len(), "a job id created twice: {creates:?}");
    assert_eq!(creates.len(), submitted.len() + 1);
    assert_eq!(fake.violations(), Vec::<String>::new());
    p.stop().await;
}

/// The contract checks can fail: wrong types, unknown fields, values outside an enum and
/// output-only fields in a request are each caught.
#[test]
fn the_contract_check_catches_bodies_that_break_googles_schema() {
    let doc = gcp_fake::discovery();
    let ok = json!({"taskGroups": [{"taskCount": "2", "taskSpec": {"maxRunDuration": "60s",
        "runnables": [{"container": {"imageUri": "x"}}]}}]});
    assert_eq!(gcp_fake::validate(&doc, "Job", &ok, Direction::Request), Vec::<String>::new());
    let bad = json!({
        "taskGroups": [{"taskCount": 2, "taskSpec": {"maxRunDuration": "an hour", "runnabels": []}}],
        "allocationPolicy": {"instances": [{"policy": {"provisioningModel": "CHEAP"}}]},
        "status": {"state": "RUNNING"},
    });
    let errors = gcp_fake::validate(&doc, "Job", &bad, Direction::Request);
    let has = |needle: &str| errors.iter().any(|e| e.contains(needle));
    assert!(has("Job.taskGroups[0].taskCount: expected a string"), "{errors:#?}");
    assert!(has("maxRunDuration: \"an hour\" is not a duration"), "{errors:#?}");
    assert!(has("taskSpec.runnabels: no such field"), "{errors:#?}");
    assert!(has("provisioningModel: \"CHEAP\" is not one of"), "{errors:#?}");
    assert!(has("Job.status: output-only field sent in a request"), "{errors:#?}");
}

/// A backend of one pool on the fake, Batch and Cloud Logging alike.
fn logs_backend(fake: &GcpFake, test: &str) -> fairway::backends::gcp_batch::GcpBatchBackend {
    let dir = fresh_dir(&format!("gcp-{test}-files"));
    let token = dir.join("token");
    std::fs::write(&token, &fake.token).unwrap();
    let config: fairway::backends::gcp_batch::GcpBatchConfig = toml::from_str(&format!(
        "name = \"gcp\"\nproject = \"ml-platform\"\nlocation = \"us-central1\"\nendpoint = \"{url}\"\n\
         logging_endpoint = \"{url}\"\naccess_token_file = \"{}\"\n\
         [[pool]]\nname = \"gcp-h100\"\nmachine_type = \"a3-highgpu-8g\"\naccelerator_type = \"nvidia-h100-80gb\"\n\
         gpu_class = \"h100-80gb\"\ngpus_per_instance = 8\nmax_instances = 2\nprice_per_gpu_hour = 7.2\n",
        token.display(),
        url = fake.url,
    ))
    .unwrap();
    fairway::backends::gcp_batch::GcpBatchBackend::new(config)
}

/// A gang of `replicas` 8-GPU replicas placed on the pool.
fn placed_gang(replicas: usize) -> fairway::backends::Gang {
    let job = fairway::domain::JobId::new();
    fairway::backends::Gang {
        object: fairway::backends::object_name(job, 1),
        job_id: job,
        attempt: 1,
        team: "ml".into(),
        job_name: "llama".into(),
        gpu_class: "h100-80gb".into(),
        priority_class: "experiment".into(),
        image: "nvcr.io/nvidia/pytorch:24.05-py3".into(),
        command: vec!["torchrun".into(), "train.py".into()],
        env: Default::default(),
        labels: Default::default(),
        max_runtime: Duration::from_secs(3600),
        cpu_millis: None,
        memory_mib: None,
        workload: Default::default(),
        replicas: (0..replicas)
            .map(|_| fairway::backends::ReplicaSlot { node: "gcp-h100".into(), gpus: (0..8).collect() })
            .collect(),
        array: None,
        service: None,
        extra_of: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloud_tasks_log_is_read_from_cloud_logging_by_job_uid_and_task_index_oldest_first_from_an_instant() {
    use fairway::backends::{Backend, LogLine, LogQuery};
    let fake = GcpFake::start("ml-platform", "us-central1").await;
    let backend = logs_backend(&fake, "logs");
    let gang = placed_gang(2);
    let query = |replica, since, limit| LogQuery { object: gang.object.clone(), replica, since, limit };
    // No job of that name: nothing to read, and no error.
    assert_eq!(backend.logs(&query(0, None, 100)).await.unwrap(), vec![]);
    backend.submit(&gang).await.unwrap();
    let uid = fake.jobs()[&gang.object]["uid"].as_str().unwrap().to_owned();
    // Started, nothing written yet.
    assert_eq!(backend.logs(&query(0, None, 100)).await.unwrap(), vec![]);
    let t0: chrono::DateTime<chrono::Utc> = "2026-03-01T10:00:00.000000250Z".parse().unwrap();
    let at = |ms: i64| t0 + chrono::Duration::milliseconds(ms);
    // Written out of order across the ranks, and another job's task 0 beside them.
    fake.write_log(&uid, 0, at(2000), "rank 0 epoch 2");
    fake.write_log(&uid, 1, at(500), "rank 1 starting");
    fake.write_log(&uid, 0, at(0), "rank 0 starting\n");
    fake.write_log("another-job-uid", 0, at(100), "not this job");
    fake.write_log(&uid, 0, at(1000), r#"{"message": "rank 0 epoch 1", "loss": 2.31}"#);
    fake.write_log(&uid, 0, at(3000), "rank 0 done");
    let texts = |lines: Vec<LogLine>| lines.into_iter().map(|l| l.text).collect::<Vec<_>>();
    let all = backend.logs(&query(0, None, 100)).await.unwrap();
    assert_eq!(
        all.iter().map(|l| (l.at, l.text.as_str())).collect::<Vec<_>>(),
        [
            (at(0), "rank 0 starting"),
            (at(1000), "rank 0 epoch 1"),
            (at(2000), "rank 0 epoch 2"),
            (at(3000), "rank 0 done")
        ],
        "oldest first, with their times, a JSON line by its message"
    );
    assert_eq!(texts(backend.logs(&query(1, None, 100)).await.unwrap()), ["rank 1 starting"]);
    assert_eq!(
        texts(backend.logs(&query(0, Some(at(1000)), 100)).await.unwrap()),
        ["rank 0 epoch 1", "rank 0 epoch 2", "rank 0 done"],
        "a line written at the instant is included, to the nanosecond"
    );
    let just_after = at(1000) + chrono::Duration::nanoseconds(1);
    assert_eq!(texts(backend.logs(&query(0, Some(just_after), 100)).await.unwrap()), ["rank 0 epoch 2", "rank 0 done"]);
    assert_eq!(texts(backend.logs(&query(0, None, 2)).await.unwrap()), ["rank 0 starting", "rank 0 epoch 1"]);
    assert_eq!(backend.logs(&query(0, Some(at(4000)), 100)).await.unwrap(), vec![], "nothing written since");
    assert_eq!(backend.logs(&query(2, None, 100)).await.unwrap(), vec![], "no third task");
    // What Fairway asked: the task log of this project, this job by its uid, one task.
    let requests = fake.log_requests();
    let last = requests.last().unwrap();
    assert_eq!(last["resourceNames"], json!(["projects/ml-platform"]));
    assert_eq!(last["orderBy"], "timestamp asc");
    assert_eq!(last["pageSize"], 100);
    let filter = last["filter"].as_str().unwrap();
    assert!(filter.contains(r#"logName="projects/ml-platform/logs/batch_task_logs""#), "{filter}");
    assert!(filter.contains(&format!(r#"labels.job_uid="{uid}""#)), "{filter}");
    assert!(filter.contains("-group0-2(/|$)"), "{filter}");
    // The job's uid was read once, then remembered, so the finished job's late lines are still
    // found after Fairway deleted the job.
    backend.delete(&gang.object).await.unwrap();
    assert!(!fake.jobs().contains_key(&gang.object));
    fake.write_log(&uid, 1, at(4000), "rank 1 late line");
    assert_eq!(texts(backend.logs(&query(1, Some(at(4000)), 100)).await.unwrap()), ["rank 1 late line"]);
    assert_eq!(fake.violations(), Vec::<String>::new());
}

/// The logging contract is checked as the Batch one is: a request or answer that breaks
/// Google's `ListLogEntries` schemas is caught.
#[test]
fn the_contract_check_catches_log_listings_that_break_googles_schema() {
    let doc = gcp_fake::logging_discovery();
    let ok = json!({"resourceNames": ["projects/p"], "filter": "logName=\"x\"", "orderBy": "timestamp asc",
                    "pageSize": 10});
    assert_eq!(gcp_fake::validate(&doc, "ListLogEntriesRequest", &ok, Direction::Request), Vec::<String>::new());
    let bad = json!({"resourceNames": "projects/p", "pageSize": "10", "order": "timestamp asc"});
    let errors = gcp_fake::validate(&doc, "ListLogEntriesRequest", &bad, Direction::Request);
    let has = |needle: &str| errors.iter().any(|e| e.contains(needle));
    assert!(has("ListLogEntriesRequest.resourceNames: expected an array"), "{errors:#?}");
    assert!(has("ListLogEntriesRequest.pageSize: expected an integer"), "{errors:#?}");
    assert!(has("ListLogEntriesRequest.order: no such field"), "{errors:#?}");
    let answer = json!({"entries": [{"timestamp": "yesterday", "textPayload": "x", "severity": "LOUD"}]});
    let errors = gcp_fake::validate(&doc, "ListLogEntriesResponse", &answer, Direction::Response);
    assert!(errors.iter().any(|e| e.contains("timestamp: \"yesterday\" is not an RFC 3339 time")), "{errors:#?}");
    assert!(errors.iter().any(|e| e.contains("severity: \"LOUD\" is not one of")), "{errors:#?}");
}
