//! The simulated cluster backend against a real PostgreSQL: its objects live in
//! `sim_objects`, and every call is idempotent as the dispatcher and reconciler need.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use fairway::backends::{
    object_name,
    sim::{SimBackend, SimConfig, CHECKPOINT_HINT, RUNTIME_HINT},
    Backend, BackendError, Gang, ObjectStatus, Outcome, Phase, ReplicaSlot,
};

/// A one-replica H100 gang on the default inventory's first node, with these hints.
fn gang(env: &[(&str, &str)]) -> Gang {
    let job_id = fairway::domain::JobId::new();
    Gang {
        object: object_name(job_id, 1),
        job_id,
        attempt: 1,
        team: "research".into(),
        job_name: "train".into(),
        gpu_class: "h100-80gb".into(),
        priority_class: "standard".into(),
        image: "registry.example/train:1".into(),
        command: vec!["python".into(), "train.py".into()],
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

/// The default simulated cluster with some settings changed.
fn config(change: impl FnOnce(&mut SimConfig)) -> SimConfig {
    let mut config = SimConfig::default();
    change(&mut config);
    config
}

async fn backend(config: SimConfig) -> SimBackend {
    SimBackend::new(fairway_tests::fresh_database().await, config)
}

/// Polls `objects()` until `done` holds for the object, or fails after ten seconds.
async fn wait_for(backend: &SimBackend, object: &str, done: impl Fn(&ObjectStatus) -> bool) -> ObjectStatus {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let objects = backend.objects().await.unwrap();
        let status = objects.iter().find(|o| o.object == object).expect("the object is listed").clone();
        if done(&status) {
            return status;
        }
        assert!(Instant::now() < deadline, "gave up waiting; last status {status:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn submitting_the_same_gang_twice_leaves_one_object() {
    // A start delay long enough that the phase cannot change while the test looks.
    let sim = backend(config(|c| c.start_delay_ms = 600_000)).await;
    let g = gang(&[]);
    sim.submit(&g).await.unwrap();
    sim.submit(&g).await.unwrap();
    let objects = sim.objects().await.unwrap();
    assert_eq!(objects.len(), 1, "{objects:?}");
    assert_eq!((objects[0].object.as_str(), objects[0].job_id, objects[0].attempt), (g.object.as_str(), g.job_id, 1));
    assert_eq!(objects[0].phase, Phase::Pending);
    assert!(!objects[0].stop_requested);
    // The object is in the database, not in the backend value: a restarted service sees it.
    let restarted = SimBackend::new(sim.pool.clone(), sim.config.clone());
    assert_eq!(restarted.objects().await.unwrap(), objects);
}

#[tokio::test]
async fn a_submitted_object_starts_after_the_delay_and_succeeds_at_the_end_of_its_run() {
    let sim = backend(config(|c| c.start_delay_ms = 50)).await;
    let g = gang(&[(RUNTIME_HINT, "0.3")]);
    let submitted = chrono::Utc::now();
    sim.submit(&g).await.unwrap();
    let done = wait_for(&sim, &g.object, |s| matches!(s.phase, Phase::Finished { .. })).await;
    let Phase::Finished { started_at: Some(started_at), ended_at, outcome } = done.phase else {
        panic!("expected a finished run, got {done:?}")
    };
    assert_eq!(outcome, Outcome::Succeeded);
    assert!(started_at >= submitted + chrono::TimeDelta::milliseconds(49), "{submitted} .. {started_at}");
    assert_eq!(ended_at - started_at, chrono::TimeDelta::milliseconds(300));
}

#[tokio::test]
async fn a_stopped_object_reports_the_request_and_finishes_stopped_after_its_checkpoint() {
    let sim = backend(config(|c| c.start_delay_ms = 0)).await;
    let g = gang(&[(RUNTIME_HINT, "3600"), (CHECKPOINT_HINT, "0.05")]);
    sim.submit(&g).await.unwrap();
    let running = wait_for(&sim, &g.object, |s| matches!(s.phase, Phase::Running { .. })).await;
    assert!(!running.stop_requested);

    sim.stop(&g.object, Duration::from_secs(30)).await.unwrap();
    // A repeated request (a retried outbox entry) is harmless.
    sim.stop(&g.object, Duration::from_secs(30)).await.unwrap();
    let stopping = sim.objects().await.unwrap().into_iter().find(|o| o.object == g.object).unwrap();
    assert!(stopping.stop_requested, "{stopping:?}");

    let done = wait_for(&sim, &g.object, |s| matches!(s.phase, Phase::Finished { .. })).await;
    assert!(done.stop_requested);
    match done.phase {
        Phase::Finished { started_at: Some(started_at), ended_at, outcome: Outcome::Stopped } => {
            assert!(ended_at > started_at, "{started_at} .. {ended_at}");
        }
        other => panic!("expected a stop after the start, got {other:?}"),
    }
}

#[tokio::test]
async fn a_stop_keeps_the_first_requests_grace() {
    // The application would need an hour to checkpoint: the grace decides when it ends.
    let sim = backend(config(|c| c.start_delay_ms = 0)).await;
    let g = gang(&[(RUNTIME_HINT, "3600"), (CHECKPOINT_HINT, "3600")]);
    sim.submit(&g).await.unwrap();
    sim.stop(&g.object, Duration::from_millis(100)).await.unwrap();
    sim.stop(&g.object, Duration::from_secs(3600)).await.unwrap();
    let done = wait_for(&sim, &g.object, |s| matches!(s.phase, Phase::Finished { .. })).await;
    assert!(matches!(done.phase, Phase::Finished { outcome: Outcome::Stopped, .. }), "{done:?}");
}

#[tokio::test]
async fn delete_removes_the_object_and_deleting_again_is_ok() {
    let sim = backend(SimConfig::default()).await;
    let g = gang(&[]);
    sim.submit(&g).await.unwrap();
    assert_eq!(sim.objects().await.unwrap().len(), 1);
    sim.delete(&g.object).await.unwrap();
    assert!(sim.objects().await.unwrap().is_empty());
    sim.delete(&g.object).await.unwrap();
    // Stopping an object that is gone succeeds too.
    sim.stop(&g.object, Duration::from_secs(1)).await.unwrap();
    assert!(sim.objects().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_gang_placed_on_an_unknown_node_is_rejected_and_nothing_is_created() {
    let sim = backend(SimConfig::default()).await;
    let mut g = gang(&[]);
    g.replicas = vec![ReplicaSlot { node: "r9-h100-9".into(), gpus: vec![0] }];
    match sim.submit(&g).await {
        Err(BackendError::Rejected(message)) => assert!(message.contains("r9-h100-9"), "{message}"),
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert!(sim.objects().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_batch_of_gangs_creates_each_one_it_accepts_and_refuses_the_misplaced_one_alone() {
    let sim = backend(config(|c| c.start_delay_ms = 600_000)).await;
    let (first, second) = (gang(&[]), gang(&[]));
    let mut misplaced = gang(&[]);
    misplaced.replicas = vec![ReplicaSlot { node: "r9-h100-9".into(), gpus: vec![0] }];
    let batch = [first.clone(), misplaced, second.clone(), first.clone()];
    let answers = sim.submit_many(&batch, Duration::from_secs(10)).await;
    assert_eq!(answers.len(), 4, "one answer per gang: {answers:?}");
    assert!(answers[0].is_ok() && answers[2].is_ok() && answers[3].is_ok(), "{answers:?}");
    assert!(matches!(&answers[1], Err(BackendError::Rejected(m)) if m.contains("r9-h100-9")), "{answers:?}");
    let mut listed: Vec<String> = sim.objects().await.unwrap().into_iter().map(|o| o.object).collect();
    listed.sort();
    let mut expected = vec![first.object, second.object];
    expected.sort();
    assert_eq!(listed, expected, "the same gang twice in a batch is one object");
}

#[tokio::test]
async fn logs_of_many_objects_come_back_one_answer_per_query_in_order() {
    use fairway::backends::LogQuery;
    let sim = backend(config(|c| c.start_delay_ms = 0)).await;
    let quick = gang(&[(RUNTIME_HINT, "0.2"), ("FAIRWAY_SIM_LOG_EVERY_SECONDS", "0.05")]);
    sim.submit(&quick).await.unwrap();
    wait_for(&sim, &quick.object, |s| matches!(s.phase, Phase::Finished { .. })).await;
    let ask = |object: &str, limit: usize| LogQuery { object: object.into(), replica: 0, since: None, limit };
    let queries = [ask(&quick.object, 1_000), ask("fw-missing-1", 1_000), ask(&quick.object, 2)];
    let answers = sim.logs_many(&queries, Duration::from_secs(10)).await;
    assert_eq!(answers.len(), 3);
    let whole = answers[0].as_ref().unwrap();
    assert_eq!(whole, &sim.logs(&queries[0]).await.unwrap(), "as one query at a time answers");
    assert!(whole.len() > 3, "a line every 50 ms of a 200 ms run, and the opening and closing lines: {whole:?}");
    assert!(answers[1].as_ref().unwrap().is_empty(), "an object that does not exist has no lines");
    assert_eq!(answers[2].as_ref().unwrap()[..], whole[..2], "each query's own limit");
}

#[tokio::test]
async fn two_simulated_clusters_on_one_database_see_only_their_own_objects() {
    let a = backend(SimConfig::default()).await;
    let b = SimBackend::new(a.pool.clone(), config(|c| c.cluster = "sim-b".into()));
    let g = gang(&[]);
    a.submit(&g).await.unwrap();
    assert!(b.objects().await.unwrap().is_empty());
    b.delete(&g.object).await.unwrap();
    b.stop(&g.object, Duration::ZERO).await.unwrap();
    let objects = a.objects().await.unwrap();
    assert_eq!(objects.len(), 1);
    assert!(!objects[0].stop_requested, "another cluster's stop does not reach it");
}
