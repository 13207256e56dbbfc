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

/// The inventory sync's transaction takes the catalogue version (its class upsert bumps it)
/// and then writes nodes pointing at the class; a quota change locks the class and then bumps
/// the catalogue version. Interleaved, both must commit: the quota change's lock must not
/// block the nodes' foreign-key checks, or PostgreSQL breaks a deadlock and the quota change
/// answers 500 (seen in CI in the Kubernetes suite).
#[tokio::test]
async fn a_quota_change_and_an_inventory_sync_interleaved_both_commit() {
    use fairway::db::{inventory, quotas};
    let pool = fresh_database().await;
    let mut setup = pool.begin().await.unwrap();
    let team = fairway::db::teams::insert(&mut setup, "alpha", None, "Alpha").await.unwrap();
    let class = inventory::ensure_gpu_class(&mut setup, "h100-80gb", "whole", 81_920, 1000).await.unwrap();
    let cluster = inventory::ensure_cluster(&mut setup, "sim", "sim").await.unwrap();
    setup.commit().await.unwrap();

    // The sync's first half: the class upsert, which bumps (and row-locks) the catalogue version.
    let mut sync = pool.begin().await.unwrap();
    inventory::ensure_gpu_class(&mut sync, "h100-80gb", "whole", 81_920, 1000).await.unwrap();
    // The quota change locks the class, then waits for the catalogue version.
    let mut change = pool.begin().await.unwrap();
    quotas::context_for_update(&mut change, team.id, None, class).await.unwrap();
    let quota = tokio::spawn(async move {
        quotas::upsert(&mut change, team.id, class, 8, 8, None).await?;
        change.commit().await
    });
    // Wait until the quota change is blocked on the catalogue version, not merely started.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let waiting =
        "select count(*) from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'";
    while sqlx::query_scalar::<_, i64>(waiting).fetch_one(&pool).await.unwrap() == 0 {
        assert!(std::time::Instant::now() < deadline, "the quota change never waited for the sync");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The sync's second half: nodes of the class, each checking its foreign key.
    let node = inventory::NodeRow {
        cluster_id: cluster,
        cluster: "sim".into(),
        name: "n0".into(),
        gpu_class_id: class,
        gpus: 8,
        nvlink_domain_size: 8,
        rack: None,
        zone: None,
        elastic: false,
        spot: false,
        price_micros_per_gpu_hour: None,
        driver_version: None,
        cuda_version: None,
        cpu_millis: None,
        memory_mib: None,
    };
    inventory::replace_nodes(&mut sync, cluster, &[node]).await.expect("the sync writes its nodes");
    sync.commit().await.expect("the sync commits");
    quota.await.unwrap().expect("the quota change commits");
    let set = quotas::get(&pool, team.id, class).await.unwrap().expect("the quota is set");
    assert_eq!((set.reserved, set.burst), (8, 8));
}
