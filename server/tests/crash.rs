//! Killing the server with SIGKILL at random points while it dispatches, 100 times: after a
//! last restart every admitted job ends with exactly one backend object per attempt, none
//! orphaned, every job runs exactly once, and the ledger books exactly each run.

mod common;

use std::time::{Duration, Instant};

use common::{fresh_dir, ledger::count, Replica};
use fairway::{
    db::{self, embedded::EmbeddedPostgres, jobs::NewJob},
    rng::SplitMix64,
};
use serde_json::json;

const KILLS: usize = 100;
const JOBS_PER_ROUND: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_dispatch_a_hundred_times_leaves_one_object_per_attempt_and_no_orphans() {
    let dir = fresh_dir("crash");
    let pg = EmbeddedPostgres::start(&dir.join("pg"), db::embedded::Tuning::THROWAWAY).await.unwrap();
    pg.create_database("fairway", None).await.unwrap();
    let url = pg.url("fairway");
    let pool = db::connect(pg.connect_options("fairway"), 4).await.unwrap();
    db::MIGRATOR.run(&pool).await.unwrap();
    let env = [("FAIRWAY_SIM_SPEEDUP", "10"), ("FAIRWAY_CYCLE_INTERVAL_MS", "50")];

    // A first start writes the simulated inventory (and its GPU classes).
    let first = Replica::start_with(&dir, "first", &url, &env);
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(&pool, "select count(*) from cluster_nodes").await == 0 {
        assert!(Instant::now() < deadline, "no inventory:\n{}", first.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(first);
    let mut tx = pool.begin().await.unwrap();
    let team = db::teams::insert(&mut tx, "ml", None, "").await.unwrap();
    let class = db::gpu_classes::by_name(&mut *tx, "h100-80gb").await.unwrap().expect("h100 class");
    db::quotas::upsert(&mut tx, team.id, class.id, 64, 0, None).await.unwrap();
    tx.commit().await.unwrap();

    let mut rng = SplitMix64(0x5eed_c4a5);
    let mut submitted = 0;
    for round in 0..KILLS {
        // One simulated second is 100 ms. The last round's jobs outlast the longest time
        // before its kill (1.5 s), so the last restart always has work in flight to finish.
        let runtime = if round + 1 == KILLS { "30" } else { "10" };
        let jobs: Vec<NewJob> = (0..JOBS_PER_ROUND)
            .map(|i| NewJob {
                id: fairway::domain::JobId::new(),
                name: format!("r{round}-{i}"),
                gpu_class_id: class.id,
                priority_class: "production".into(),
                replicas: 1 + (i % 2) as i32,
                gpus_per_replica: 1 + (i % 4) as i32,
                max_runtime_seconds: 3600,
                expected_runtime_seconds: None,
                image: "x".into(),
                command: json!([]),
                env: json!({"FAIRWAY_SIM_RUNTIME_SECONDS": runtime}),
                labels: json!({}),
                topology_mode: "any".into(),
                topology_level: None,
                preemption_grace_seconds: None,
                max_retries: 0,
                allow_spot: false,
                cpu_millis: None,
                memory_mib: None,
                workload: Default::default(),
                depends_on: Vec::new(),
                if_dependency_fails: Default::default(),
                accepted_despite: Vec::new(),
                array: None,
                service: None,
                min_driver_version: None,
                min_cuda_version: None,
                preemption_delay_seconds: None,
                max_replicas: None,
            })
            .collect();
        db::jobs::insert_many(&pool, team.id, "crash-test", &jobs).await.unwrap();
        submitted += jobs.len();
        let server = Replica::start_with(&dir, "server", &url, &env);
        // Startup takes a few hundred milliseconds; the kill lands anywhere from before the
        // first cycle to well into dispatch and reconciliation.
        tokio::time::sleep(Duration::from_millis(200 + rng.next_u64() % 1300)).await;
        server.signal(libc::SIGKILL);
        drop(server);
    }

    let unfinished = count(&pool, "select count(*) from jobs where state <> 'succeeded'").await;
    let last = Replica::start_with(&dir, "last", &url, &env);
    let restarted = Instant::now();
    loop {
        let done = count(&pool, "select count(*) from jobs where state = 'succeeded'").await;
        let objects = count(&pool, "select count(*) from sim_objects").await;
        if done == submitted as i64 && objects == 0 {
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(60),
            "60 s after the last restart: {done} of {submitted} jobs done, {objects} objects left\n{}",
            last.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "{unfinished} of {submitted} jobs were unfinished at the last kill; all done {:.1} s after the restart",
        restarted.elapsed().as_secs_f64()
    );
    assert!(unfinished > 0, "the last kill should leave work in flight");
    common::ledger::assert_every_job_ran_once_and_was_booked_exactly(&pool, submitted as i64).await;
    drop(last);
    pool.close().await;
    pg.stop().await;
}
