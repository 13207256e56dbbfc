//! Two `fairway serve` processes on one database: exactly one schedules; when it is killed
//! the other takes over within the lease, and a leader that was paused past its lease finds
//! itself replaced when it resumes; a healthy leader busy with thousands of jobs keeps its
//! lease while a standby watches.

mod common;

use std::time::{Duration, Instant};

use common::{fresh_dir, platform::Platform, Replica};
use fairway::{
    bench::platform::LeaseWatcher,
    db::{self, embedded::EmbeddedPostgres},
};
use serde_json::json;

const TAKEOVER_LIMIT: Duration = Duration::from_secs(20);
/// The lease `Replica` gives every process.
const LEASE: Duration = Duration::from_secs(3);

/// The tests here time leadership: one at a time, so neither slows the other's leader.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits until exactly the replica `who` leads; returns how long that took.
async fn until_leader(replicas: &[&Replica], who: usize, limit: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let mut states = Vec::new();
        for r in replicas {
            states.push(r.leads().await);
        }
        let leaders = states.iter().filter(|s| **s == Some(true)).count();
        if states[who] == Some(true) && leaders == 1 {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < limit,
            "replica {who} did not become the only leader within {limit:?}: {states:?}\n{}",
            replicas.iter().map(|r| r.log()).collect::<Vec<_>>().join("\n---\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn epoch(pool: &sqlx::PgPool) -> i64 {
    sqlx::query_scalar("select epoch from scheduler_leader where id = 1").fetch_one(pool).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_replica_schedules_a_killed_leader_is_replaced_and_a_paused_one_is_deposed() {
    let _alone = ONE_AT_A_TIME.lock().await;
    let dir = fresh_dir("failover");
    let pg = EmbeddedPostgres::start(&dir.join("pg"), db::embedded::Tuning::THROWAWAY).await.unwrap();
    pg.create_database("fairway", None).await.unwrap();
    let url = pg.url("fairway");
    let pool = db::connect(pg.connect_options("fairway"), 2).await.unwrap();
    db::MIGRATOR.run(&pool).await.unwrap();

    let a = Replica::start(&dir, "a", &url);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let b = Replica::start(&dir, "b", &url);
    // Whoever won the race leads alone; name them by role.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (leader, standby) = loop {
        match (a.leads().await, b.leads().await) {
            (Some(true), Some(false)) => break (a, b),
            (Some(false), Some(true)) => break (b, a),
            states => {
                assert!(Instant::now() < deadline, "no single leader: {states:?}\n{}\n---\n{}", a.log(), b.log());
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let first_epoch = epoch(&pool).await;

    // A crash: SIGKILL closes its sessions, the lock goes with them.
    leader.signal(libc::SIGKILL);
    let took = until_leader(&[&standby], 0, TAKEOVER_LIMIT).await;
    println!("takeover after SIGKILL: {:.1} s", took.as_secs_f64());
    let second_epoch = epoch(&pool).await;
    assert!(second_epoch > first_epoch);
    drop(leader);

    // A pause: the paused leader keeps its connection and lock until its lease runs out and
    // the standby ends its sessions.
    let fresh = Replica::start(&dir, "c", &url);
    until_leader(&[&standby, &fresh], 0, Duration::from_secs(30)).await;
    standby.signal(libc::SIGSTOP);
    let took = until_leader(&[&fresh], 0, TAKEOVER_LIMIT).await;
    println!("takeover from a paused leader: {:.1} s", took.as_secs_f64());
    let third_epoch = epoch(&pool).await;
    assert!(third_epoch > second_epoch);
    standby.signal(libc::SIGCONT);
    // Resumed, it learns it lost: it stands by, and the leader row still names the new one.
    until_leader(&[&standby, &fresh], 1, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(standby.leads().await, Some(false));
    assert_eq!(epoch(&pool).await, third_epoch, "the resumed leader never took leadership back");
    pool.close().await;
    drop(standby);
    drop(fresh);
    pg.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_leader_busy_with_thousands_of_jobs_keeps_its_lease_while_a_standby_watches() {
    const JOBS: usize = 3_000;
    const SUBMITTERS: usize = 32;
    let _alone = ONE_AT_A_TIME.lock().await;
    let dir = fresh_dir("lease-under-load");
    let inventory = dir.join("inventory.toml");
    let mut toml = String::from(
        "cluster = \"sim\"\nstart_delay_ms = 0\n\n[[class]]\nname = \"load-gpu\"\nkind = \"whole\"\nmemory_mib = 81920\n",
    );
    for n in 0..10 {
        toml.push_str(&format!("\n[[node]]\nname = \"load-{n}\"\ngpu_class = \"load-gpu\"\ngpus = 50\n"));
    }
    std::fs::write(&inventory, toml).unwrap();
    let clusters = format!("[[cluster]]\nname = \"sim\"\nkind = \"sim\"\ninventory = \"{}\"\n", inventory.display());
    let platform = Platform::start("lease-under-load", &clusters, &[]).await;
    let leader = platform.server.as_ref().expect("started");
    until_leader(&[leader], 0, Duration::from_secs(30)).await;
    let env: Vec<(&str, &str)> = platform.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let standby = Replica::start_with(&platform.dir, "standby", &platform.url, &env);
    let deadline = Instant::now() + Duration::from_secs(30);
    while standby.leads().await != Some(false) {
        assert!(Instant::now() < deadline, "the standby did not start:\n{}", standby.log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    platform.team("load", "load-gpu", 500, 0).await;
    let first_epoch = epoch(&platform.pool).await;

    let watcher = LeaseWatcher::start(platform.pool.clone(), Duration::from_millis(100));
    let began = Instant::now();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut submitters = tokio::task::JoinSet::new();
    for _ in 0..SUBMITTERS {
        let (http, url, token, next) = (
            platform.http.clone(),
            format!("{}/api/v1/teams/load/jobs", platform.base()),
            platform.token.clone(),
            next.clone(),
        );
        submitters.spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= JOBS {
                    return;
                }
                let body = json!({"name": format!("load-{i}"), "gpu_class": "load-gpu", "gpus_per_replica": 1 + i % 2,
                                  "image": "registry.example/load:1", "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "0.5"}});
                let r = http.post(&url).bearer_auth(&token).json(&body).send().await.unwrap();
                assert_eq!(r.status().as_u16(), 201, "{}", r.text().await.unwrap());
            }
        });
    }
    while let Some(done) = submitters.join_next().await {
        done.unwrap();
    }
    let submitted_in = began.elapsed();
    platform
        .wait("every job to succeed", Duration::from_secs(300), || async {
            let done: i64 = sqlx::query_scalar("select count(*) from jobs where state = 'succeeded'")
                .fetch_one(&platform.pool)
                .await
                .unwrap();
            (done == JOBS as i64).then_some(())
        })
        .await;
    let drained_in = began.elapsed();
    let watch = watcher.finish().await.unwrap();
    println!(
        "{JOBS} jobs submitted in {:.1} s and drained in {:.1} s; {} samples of the leader row: epochs {:?}, \
         longest silence {:.2} s (lease {} s)",
        submitted_in.as_secs_f64(),
        drained_in.as_secs_f64(),
        watch.samples,
        watch.epochs,
        watch.longest_silence_s,
        LEASE.as_secs()
    );
    assert_eq!(watch.epochs.iter().copied().collect::<Vec<_>>(), vec![first_epoch], "no failover: {watch:?}");
    assert_eq!(watch.holders.len(), 1, "one holder throughout: {watch:?}");
    assert!(watch.longest_silence_s < LEASE.as_secs_f64(), "the heartbeat kept inside the lease under load: {watch:?}");
    assert_eq!(standby.leads().await, Some(false), "the standby still stands by");
    assert_eq!(leader.leads().await, Some(true));
    drop(standby);
    platform.stop().await;
}
