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
