//! Two `fairway serve` processes on one database: exactly one schedules; when it is killed
//! the other takes over within the lease, and a leader that was paused past its lease finds
//! itself replaced when it resumes.

mod common;

use std::time::{Duration, Instant};

use common::{fresh_dir, Replica};
use fairway::db::{self, embedded::EmbeddedPostgres};

const TAKEOVER_LIMIT: Duration = Duration::from_secs(20);

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
