//! The leader row's locks, on a real PostgreSQL: the leader's heartbeat must not queue behind
//! its own scheduling cycles (a long cycle would otherwise let the lease run out and a standby
//! depose a healthy leader), while a takeover must still wait for the old leader's writes in
//! flight and fence every later one.

use std::time::Duration;

use fairway::db::leader;
use fairway_tests::fresh_database;

#[tokio::test]
async fn the_heartbeat_passes_an_open_cycle_while_a_takeover_waits_for_it_and_fences_what_follows() {
    let pool = fresh_database().await;
    let mut leader_conn = pool.acquire().await.unwrap();
    let epoch = leader::take_leadership(&mut leader_conn, "first").await.unwrap();

    // A scheduling cycle's transaction, open as long as its writes take.
    let mut cycle = pool.begin().await.unwrap();
    assert!(leader::check_epoch(&mut cycle, epoch).await.unwrap());

    // The lease is renewed meanwhile (a generous bound: only a lock wait could reach it).
    let renewed = tokio::time::timeout(Duration::from_secs(20), leader::heartbeat(&mut leader_conn, epoch))
        .await
        .expect("the heartbeat waited for the cycle's transaction")
        .unwrap();
    assert!(renewed);

    // A takeover waits for the cycle.
    let takeover_pool = pool.clone();
    let takeover = tokio::spawn(async move {
        let mut conn = takeover_pool.acquire().await.unwrap();
        leader::take_leadership(&mut conn, "second").await.unwrap()
    });
    let mut waited = false;
    for _ in 0..1000 {
        let blocked: i64 = sqlx::query_scalar(
            "select count(*) from pg_stat_activity
             where datname = current_database() and wait_event_type = 'Lock' and query like '%for update%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        if blocked > 0 {
            waited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(waited, "the takeover never waited on the leader row");
    assert!(!takeover.is_finished());
    cycle.commit().await.unwrap();
    let new_epoch =
        tokio::time::timeout(Duration::from_secs(20), takeover).await.expect("the takeover finished").unwrap();
    assert_eq!(new_epoch, epoch + 1);

    // Whatever the old leader writes from now on is fenced off, heartbeat included.
    let mut late = pool.begin().await.unwrap();
    assert!(!leader::check_epoch(&mut late, epoch).await.unwrap());
    assert!(!leader::heartbeat(&mut leader_conn, epoch).await.unwrap());
}

/// A burst into a table whose statistics predate it: the planner takes each flag of `jobs`
/// for true of half the rows and scans the table for the passes' probes. The cycle sees
/// that the statistics are stale and gathers them, after which they are not.
#[tokio::test]
async fn a_burst_of_jobs_makes_the_statistics_stale_and_gathering_them_makes_them_current() {
    let pool = fresh_database().await;
    let mut tx = pool.begin().await.unwrap();
    let team = fairway::db::teams::insert(&mut tx, "burst", None, "Burst").await.unwrap();
    let class = fairway::db::inventory::ensure_gpu_class(&mut tx, "h100-80gb", "whole", 81_920, 1000).await.unwrap();
    tx.commit().await.unwrap();
    fairway::db::snapshot::analyze_jobs(&pool).await.unwrap();
    let due = fairway::db::snapshot::passes_due(&pool).await.unwrap();
    assert!(!due.jobs_statistics_stale, "an empty, just analysed table is current: {due:?}");

    let today = chrono::Utc::now().date_naive();
    let burst = 2 * fairway::db::snapshot::STALE_AFTER_ROWS;
    fairway::db::bench::seed_portal(&pool, team.id, class, burst, today, 1, today).await.unwrap();
    // A backend reports its changed rows to the statistics collector within a second or so
    // of its transaction; wait for the report rather than guess its delay.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !fairway::db::snapshot::passes_due(&pool).await.unwrap().jobs_statistics_stale {
        assert!(std::time::Instant::now() < deadline, "{burst} new jobs never made the statistics stale");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    fairway::db::snapshot::analyze_jobs(&pool).await.unwrap();
    let due = fairway::db::snapshot::passes_due(&pool).await.unwrap();
    assert!(!due.jobs_statistics_stale, "just analysed: {due:?}");
}
