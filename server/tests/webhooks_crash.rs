//! Killing the server with SIGKILL at random points while it delivers webhooks, 20 times:
//! after a last restart every job's notification has arrived, every signature verifies, and
//! a notification that arrived more than once carries the same `webhook-id` and the same body
//! each time.

mod common;

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{extract::State, http::HeaderMap, http::StatusCode};
use base64::{engine::general_purpose::STANDARD as BASE64, Engine as _};
use common::{fresh_dir, ledger::count, Replica};
use fairway::{
    db::{self, embedded::EmbeddedPostgres, jobs::NewJob},
    rng::SplitMix64,
};
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

const KILLS: usize = 20;
const JOBS_PER_ROUND: usize = 6;
/// How long the receiver holds each request before answering: long enough that most kills
/// land while some delivery is in flight.
const HOLD: Duration = Duration::from_millis(400);

/// One request the receiver got: `webhook-id`, `webhook-timestamp`, `webhook-signature`, body.
type Received = (String, String, String, String);

#[derive(Clone, Default)]
struct Receiver {
    got: Arc<Mutex<Vec<Received>>>,
}

/// Records the request before holding it, as a receiver that had done its work when the
/// sender died would have.
async fn receive(State(receiver): State<Receiver>, headers: HeaderMap, body: String) -> StatusCode {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    receiver.got.lock().unwrap().push((
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
        body,
    ));
    tokio::time::sleep(HOLD).await;
    StatusCode::OK
}

fn verifies(secret_bytes: &[u8], (id, timestamp, signature, body): &Received) -> bool {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret_bytes).unwrap();
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    let expected = BASE64.encode(mac.finalize().into_bytes());
    signature.split(' ').any(|s| s.strip_prefix("v1,") == Some(expected.as_str()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_webhook_delivery_twenty_times_loses_no_notification_and_duplicates_share_their_id() {
    let receiver = Receiver::default();
    let app = axum::Router::new().route("/hook", axum::routing::post(receive)).with_state(receiver.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook_url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let dir = fresh_dir("webhooks-crash");
    let pg = EmbeddedPostgres::start(&dir.join("pg"), db::embedded::Tuning::THROWAWAY).await.unwrap();
    pg.create_database("fairway", None).await.unwrap();
    let url = pg.url("fairway");
    let pool = db::connect(pg.connect_options("fairway"), 4).await.unwrap();
    db::MIGRATOR.run(&pool).await.unwrap();
    // A lease of a second: a delivery the kill interrupted is sent again a second after the
    // next leader starts, not a minute.
    let env = [
        ("FAIRWAY_SIM_SPEEDUP", "10"),
        ("FAIRWAY_CYCLE_INTERVAL_MS", "50"),
        ("FAIRWAY_WEBHOOK_LEASE_MS", "1000"),
        ("FAIRWAY_WEBHOOK_RETRY_UNIT_MS", "10"),
    ];

    let first = Replica::start_with(&dir, "first", &url, &env);
    let deadline = Instant::now() + Duration::from_secs(60);
    while count(&pool, "select count(*) from cluster_nodes").await == 0 {
        assert!(Instant::now() < deadline, "no inventory:\n{}", first.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(first);
    let secret_bytes: Vec<u8> = (0u8..32).map(|i| i.wrapping_mul(37).wrapping_add(11)).collect();
    let secret = format!("whsec_{}", BASE64.encode(&secret_bytes));
    let mut tx = pool.begin().await.unwrap();
    let team = db::teams::insert(&mut tx, "ml", None, "").await.unwrap();
    let class = db::gpu_classes::by_name(&mut *tx, "h100-80gb").await.unwrap().expect("h100 class");
    db::quotas::upsert(&mut tx, team.id, class.id, 64, 0, None).await.unwrap();
    db::webhooks::insert(
        &mut tx,
        &db::webhooks::NewWebhook {
            team_id: team.id,
            url: &hook_url,
            secret: &secret,
            events: &["job.succeeded".to_owned()],
            format: "standard",
            created_by: None,
        },
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let mut rng = SplitMix64(0x5eed_400c);
    let mut jobs = Vec::new();
    for round in 0..KILLS {
        let round_jobs: Vec<NewJob> = (0..JOBS_PER_ROUND)
            .map(|i| NewJob {
                id: fairway::domain::JobId::new(),
                name: format!("r{round}-{i}"),
                gpu_class_id: class.id,
                priority_class: "production".into(),
                replicas: 1,
                gpus_per_replica: 1,
                max_runtime_seconds: 3600,
                expected_runtime_seconds: None,
                image: "x".into(),
                command: json!([]),
                // One to three simulated seconds: the jobs end, and their notifications go
                // out, spread over the round.
                env: json!({"FAIRWAY_SIM_RUNTIME_SECONDS": (1 + i % 3).to_string()}),
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
        db::jobs::insert_many(&pool, team.id, "crash-test", &round_jobs).await.unwrap();
        jobs.extend(round_jobs.iter().map(|j| j.id.to_string()));
        let server = Replica::start_with(&dir, "server", &url, &env);
        tokio::time::sleep(Duration::from_millis(800 + rng.next_u64() % 1700)).await;
        server.signal(libc::SIGKILL);
        drop(server);
    }

    let at_last_kill = receiver.got.lock().unwrap().len();
    let last = Replica::start_with(&dir, "last", &url, &env);
    let restarted = Instant::now();
    loop {
        let done = count(&pool, "select count(*) from jobs where state = 'succeeded'").await;
        let delivered = count(&pool, "select count(*) from webhook_deliveries where state = 'delivered'").await;
        if done == jobs.len() as i64 && delivered == jobs.len() as i64 {
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(60),
            "60 s after the last restart: {done} of {} jobs done, {delivered} notifications delivered\n{}",
            jobs.len(),
            last.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(last);

    let got = receiver.got.lock().unwrap().clone();
    let mut by_id: BTreeMap<&str, Vec<&Received>> = BTreeMap::new();
    for r in &got {
        assert!(verifies(&secret_bytes, r), "a signature does not verify: {r:?}");
        by_id.entry(r.0.as_str()).or_default().push(r);
    }
    let mut notified = Vec::new();
    for (id, copies) in &by_id {
        assert!(copies.iter().all(|c| c.3 == copies[0].3), "copies of {id} differ: {copies:#?}");
        let body: Value = serde_json::from_str(&copies[0].3).unwrap();
        assert_eq!(body["type"], "job.succeeded");
        notified.push(body["data"]["job"].as_str().unwrap().to_owned());
    }
    notified.sort();
    jobs.sort();
    assert_eq!(notified, jobs, "one message per job, each job's own");
    let duplicates = got.len() - by_id.len();
    println!(
        "{} notifications, {at_last_kill} requests before the last restart, {} requests in all: {duplicates} duplicates",
        jobs.len(),
        got.len()
    );
    assert!(duplicates > 0, "no kill landed mid-delivery: the test proves nothing");
    pool.close().await;
    pg.stop().await;
}
