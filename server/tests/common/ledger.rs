//! What must hold after any crash, however it came: every job ran exactly once, nothing was
//! dispatched twice or left behind, and the ledger books exactly each run.

use sqlx::PgPool;

pub async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// The GPU-milliseconds (in thousandths of a GPU) a simulated job's run is worth: GPUs ×
/// 1000 × its `FAIRWAY_SIM_RUNTIME_SECONDS` in wall milliseconds at a speed-up of 10.
const TRUTH: &str =
    "j.replicas::int8 * j.gpus_per_replica * 1000 * ((j.env ->> 'FAIRWAY_SIM_RUNTIME_SECONDS')::int8 * 100)";

/// Asserts that all `submitted` jobs (simulated, speed-up 10) succeeded in one attempt each,
/// with one closed usage interval, no attempt dispatched twice, no orphan, an empty outbox,
/// and a ledger that holds exactly each run, to the millisecond, and books nothing more when
/// every end is replayed. Returns the checks it made, in words.
pub async fn assert_every_job_ran_once_and_was_booked_exactly(pool: &PgPool, submitted: i64) -> Vec<String> {
    assert_eq!(count(pool, "select count(*) from jobs").await, submitted, "jobs stored");
    assert_eq!(count(pool, "select count(*) from jobs where state = 'succeeded'").await, submitted, "jobs done");
    assert_eq!(count(pool, "select count(*) from jobs where attempt <> 1").await, 0, "no job was admitted twice");
    assert_eq!(
        count(pool, "select count(*) from usage_intervals where ended_at is not null").await,
        submitted,
        "one closed usage interval per job: each ran exactly once"
    );
    assert_eq!(count(pool, "select count(*) from usage_intervals where ended_at is null").await, 0);
    assert_eq!(
        count(
            pool,
            "select count(*) from (select job_id, attempt from job_events where kind = 'dispatched'
                                   group by 1, 2 having count(*) > 1) d"
        )
        .await,
        0,
        "no attempt was dispatched twice"
    );
    assert_eq!(count(pool, "select count(*) from job_events where kind = 'orphan_removed'").await, 0);
    assert_eq!(count(pool, "select count(*) from dispatch_outbox where done_at is null").await, 0);
    assert_eq!(count(pool, "select count(*) from sim_objects").await, 0, "no backend object left");
    let wrong = count(
        pool,
        &format!(
            "select count(*) from jobs j
             left join (select job_id, sum(gpu_milli_ms) as booked from usage_ledger group by job_id) l on l.job_id = j.id
             where coalesce(l.booked, 0) <> {TRUTH}"
        ),
    )
    .await;
    assert_eq!(wrong, 0, "jobs whose ledger differs from their run");
    let booked = count(pool, "select sum(gpu_milli_ms)::int8 from usage_ledger").await;
    assert_eq!(booked, count(pool, &format!("select sum({TRUTH})::int8 from jobs j")).await);
    // Replaying every end books nothing more.
    let jobs: Vec<fairway::domain::JobId> = sqlx::query_scalar("select id from jobs").fetch_all(pool).await.unwrap();
    for id in jobs {
        let mut tx = pool.begin().await.unwrap();
        let more = fairway::metering::ledger::book(&mut tx, id, 1, None, &fairway::metering::Pricing::default())
            .await
            .unwrap();
        assert_eq!(more, 0, "replaying the end of {id} booked more");
        tx.commit().await.unwrap();
    }
    assert_eq!(count(pool, "select sum(gpu_milli_ms)::int8 from usage_ledger").await, booked);
    vec![
        format!("{submitted} jobs succeeded, each in one attempt with one closed usage interval"),
        "no attempt dispatched twice, no orphan removed, outbox empty, no backend object left".into(),
        format!("ledger equals every job's run to the millisecond ({booked} GPU-milli-ms in all)"),
        "replaying every job's end books nothing more".into(),
    ]
}
