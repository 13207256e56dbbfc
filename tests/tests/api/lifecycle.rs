//! Jobs end to end through the real control loop: leader election, cycles, the outbox, the
//! dispatcher and the reconciler, on the built-in simulated cluster (its default inventory:
//! 64 H100 in two racks, 8 A100, a MIG-partitioned A100, an elastic L4 pool), against a
//! real PostgreSQL.

use std::time::Duration;

use fairway::{control, db, serve};
use fairway_tests::{call, TestApp};
use serde_json::{json, Value};

/// Starts the control loop of `app` with fast timings: 50 ms cycles, preemption allowed at
/// once, a simulated cluster running at 10× speed.
pub(crate) async fn start_control(app: &TestApp) {
    start_control_with(app, 0).await;
}

/// The same, with the engine's minimum runtime before a job may be preempted.
async fn start_control_with(app: &TestApp, min_runtime_before_preemption_ms: i64) {
    start_control_tuned(app, |c| c.engine.min_runtime_before_preemption_ms = min_runtime_before_preemption_ms).await;
}

/// The control loop of `app` with 50 ms cycles and reconciler passes, a simulated cluster
/// at 10× speed, and whatever else `tune` changes.
pub(crate) async fn start_control_tuned(app: &TestApp, tune: impl FnOnce(&mut control::ControlConfig)) {
    let mut state = app.state.clone();
    let mut config = (*state.config).clone();
    config.sim_speedup = Some(10.0);
    config.cycle_interval = Duration::from_millis(50);
    state.config = std::sync::Arc::new(config);
    let mut ctx = serve::control_context(&state).await.expect("control context");
    ctx.config.reconcile_interval = Duration::from_millis(50);
    tune(&mut ctx.config);
    let options = (*app.pool.connect_options()).clone();
    control::spawn(ctx, options, format!("test-{}", uuid::Uuid::new_v4().simple()));
}

/// Writes a simulated cluster's inventory, at 10× speed with the class `h100-80gb`, and
/// `nodes` (its `[[node]]` tables), into a fresh file; returns its path, for
/// `Config::sim_inventory`. The file may be rewritten while the service runs.
pub(crate) fn h100_inventory(nodes: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("fairway-inventory-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("inventory.toml");
    std::fs::write(&file, format!("{H100_CLASS}{nodes}")).unwrap();
    file
}

/// The head of [`h100_inventory`]'s file: the cluster and its one class.
pub(crate) const H100_CLASS: &str = r#"
cluster = "sim"
speedup = 10.0

[[class]]
name = "h100-80gb"
kind = "whole"
memory_mib = 81920
fraction_milli = 1000
"#;

pub(crate) async fn job(app: &TestApp, token: &str, id: &str) -> Value {
    let r = app.send(call("GET", &format!("/api/v1/jobs/{id}")).token(token)).await;
    r.assert_status(200);
    r.json()
}

/// Polls the job until `done` holds, failing with the job's last state after `within`.
pub(crate) async fn wait_for(
    app: &TestApp,
    token: &str,
    id: &str,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let j = job(app, token, id).await;
        if done(&j) {
            return j;
        }
        assert!(tokio::time::Instant::now() < deadline, "job {id} did not get there in time: {j:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(crate) async fn events(app: &TestApp, token: &str, id: &str) -> Vec<Value> {
    let r = app.send(call("GET", &format!("/api/v1/jobs/{id}/events")).token(token)).await;
    r.assert_status(200);
    r.json().as_array().cloned().unwrap_or_default()
}

pub(crate) fn kinds(events: &[Value]) -> Vec<String> {
    events.iter().map(|e| e["kind"].as_str().unwrap_or_default().to_owned()).collect()
}

pub(crate) async fn submit(app: &TestApp, token: &str, team: &str, body: Value) -> String {
    let r = app.send(call("POST", &format!("/api/v1/teams/{team}/jobs")).token(token).json(&body)).await;
    r.assert_status(201);
    r.json()["id"].as_str().expect("id").to_owned()
}

/// Waits until the control loop has written the simulated cluster's inventory (which
/// also creates its GPU classes).
pub(crate) async fn wait_for_inventory(app: &TestApp) {
    for _ in 0..200 {
        let n: i64 = sqlx::query_scalar("select count(*) from cluster_nodes").fetch_one(&app.pool).await.unwrap();
        if n > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the simulated cluster's inventory never arrived");
}

#[tokio::test]
async fn a_gang_job_goes_from_pending_to_succeeded_with_its_timeline_and_one_usage_interval() {
    let app = TestApp::spawn().await;
    start_control(&app).await;
    wait_for_inventory(&app).await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100-80gb", 16, 0).await;
    let (_, ci) = app.api_token(&admin, "ml", "member").await;
    let id = submit(
        &app,
        &ci,
        "ml",
        json!({"name": "train-llama", "gpu_class": "h100-80gb", "replicas": 2, "gpus_per_replica": 8,
               "image": "nvcr.io/nvidia/pytorch:24.05-py3", "topology": {"level": "rack", "mode": "required"},
               "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "5"}}),
    )
    .await;
    let done = wait_for(&app, &ci, &id, Duration::from_secs(30), |j| j["state"] == "succeeded").await;
    assert_eq!(done["exit_code"], 0);
    assert_eq!(done["attempt"], 1);
    assert_eq!(done["cluster"], "sim");
    let placement = done["placement"].as_array().expect("placement");
    assert_eq!(placement.len(), 2, "{done:#}");
    for replica in placement {
        assert_eq!(replica["gpus"].as_array().map(Vec::len), Some(8));
    }
    // Both replicas in one rack, as required: node names carry their rack.
    let racks: Vec<&str> = placement.iter().map(|r| &r["node"].as_str().unwrap()[..2]).collect();
    assert_eq!(racks[0], racks[1], "{placement:?}");
    let timeline = events(&app, &ci, &id).await;
    assert_eq!(kinds(&timeline), ["submitted", "admitted", "dispatched", "running", "succeeded"], "{timeline:#?}");
    assert_eq!(timeline[1]["reason"], "reserved");
    assert!(timeline[1]["message"].as_str().unwrap().contains("admitted on cluster sim"), "{:#}", timeline[1]);
    let intervals: Vec<(i32, bool)> =
        sqlx::query_as("select gpus, ended_at >= started_at from usage_intervals where job_id = $1::uuid")
            .bind(&id)
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(intervals, [(16, true)]);
    // The reconciler records the end before it removes the finished objects: wait for that.
    let mut objects: i64 = -1;
    for _ in 0..200 {
        objects = sqlx::query_scalar("select count(*) from sim_objects").fetch_one(&app.pool).await.unwrap();
        if objects == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(objects, 0, "finished objects are collected");
}

/// An 8-GPU experiment of the simulated cluster's `h100-80gb` that runs 3,000 s, checkpoints
/// every second and stops within a second when preempted.
fn sweep(i: usize) -> Value {
    json!({"name": format!("sweep-{i}"), "gpu_class": "h100-80gb", "gpus_per_replica": 8,
           "image": "research:latest", "priority_class": "experiment", "preemption_grace_seconds": 1,
           "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "3000", "FAIRWAY_SIM_CHECKPOINT_SECONDS": "1"}})
}

#[tokio::test]
async fn a_production_job_takes_free_gpus_beside_its_teams_experiments_instead_of_preempting_them() {
    let app = TestApp::spawn_with(|c| c.min_runtime_before_preemption = Duration::ZERO).await;
    start_control(&app).await;
    wait_for_inventory(&app).await;
    let admin = app.admin().await;
    app.team(&admin, "research", None).await;
    app.quota(&admin, "research", "h100-80gb", 16, 48).await;
    let (_, research) = app.api_token(&admin, "research", "member").await;
    // Two experiments fill research's reserved 16 GPUs; 48 more are free.
    let mut experiments = Vec::new();
    for i in 0..2 {
        experiments.push(submit(&app, &research, "research", sweep(i)).await);
    }
    for id in &experiments {
        let j = wait_for(&app, &research, id, Duration::from_secs(30), |j| j["state"] == "running").await;
        assert_eq!(j["borrowing"], false, "{j:#}");
    }
    let body = json!({"name": "nightly-eval", "gpu_class": "h100-80gb", "gpus_per_replica": 8, "image": "eval:1",
                      "priority_class": "production", "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "3000"}});
    let eval = submit(&app, &research, "research", body).await;
    let running = wait_for(&app, &research, &eval, Duration::from_secs(30), |j| j["state"] == "running").await;
    // It cannot be preempted, so it runs in the reserved quota and the experiments beside it
    // are what research borrows; the team now holds 24 of its reserved 16, billed as burst.
    assert_eq!(running["borrowing"], true, "{running:#}");
    let admitted = events(&app, &research, &eval).await.into_iter().find(|e| e["kind"] == "admitted").unwrap();
    assert!(
        admitted["message"].as_str().unwrap().contains(
            "its team now holds more than its reserved quota, so it is billed as burst, and the team's preemptible jobs give the capacity back if it is reclaimed"
        ),
        "{admitted:#}"
    );
    // No experiment stopped for GPUs that were free.
    for id in &experiments {
        let j = job(&app, &research, id).await;
        assert_eq!((j["state"].as_str(), j["preemptions"].as_i64()), (Some("running"), Some(0)), "{j:#}");
        let timeline = events(&app, &research, id).await;
        assert!(timeline.iter().all(|e| e["kind"] != "preempted"), "{timeline:#?}");
    }
}

#[tokio::test]
async fn a_borrowing_job_is_preempted_when_the_lender_claims_its_reserved_quota_and_requeues() {
    // The API's dry runs decide with the service's configuration, as the control loop does.
    let app = TestApp::spawn_with(|c| c.min_runtime_before_preemption = Duration::ZERO).await;
    start_control(&app).await;
    wait_for_inventory(&app).await;
    let admin = app.admin().await;
    app.team(&admin, "research", None).await;
    app.team(&admin, "prod", None).await;
    app.quota(&admin, "research", "h100-80gb", 0, 64).await;
    app.quota(&admin, "prod", "h100-80gb", 64, 0).await;
    let (_, research) = app.api_token(&admin, "research", "member").await;
    let (_, prod) = app.api_token(&admin, "prod", "member").await;
    let mut borrowers = Vec::new();
    for i in 0..8 {
        borrowers.push(submit(&app, &research, "research", sweep(i)).await);
    }
    for id in &borrowers {
        let j = wait_for(&app, &research, id, Duration::from_secs(30), |j| j["state"] == "running").await;
        assert_eq!(j["borrowing"], true, "{j:#}");
    }
    let body = json!({"name": "serve-model", "gpu_class": "h100-80gb", "gpus_per_replica": 8, "image": "prod:1",
                      "priority_class": "production", "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "3000"}});
    // A dry run first: the engine's answer on the same state, which the submission then
    // bears out. Other teams' jobs are described, not named.
    let r = app.send(call("POST", "/api/v1/teams/prod/jobs:dry-run").token(&prod).json(&body)).await;
    r.assert_status(200);
    let dry = r.json();
    assert_eq!(dry["fits_now"], false, "{dry:#}");
    assert_eq!(dry["reason"], "waiting_for_reclaim", "{dry:#}");
    assert_eq!(
        dry["would_preempt"],
        json!([{"team": "research", "job": null, "reason": "reclaim", "gpus": 8}]),
        "{dry:#}"
    );
    let claim = submit(&app, &prod, "prod", body).await;
    let admitted = wait_for(&app, &prod, &claim, Duration::from_secs(30), |j| j["state"] == "running").await;
    assert_eq!(admitted["borrowing"], false);
    // Exactly one borrower gave way, with the reason and the preemptor in its timeline, and
    // went back to the queue.
    let mut preempted = Vec::new();
    for id in &borrowers {
        let timeline = events(&app, &research, id).await;
        if let Some(e) = timeline.iter().find(|e| e["kind"] == "preempted") {
            assert_eq!(e["reason"], "reclaim");
            assert_eq!(e["data"]["by_job"], claim.as_str());
            assert_eq!(e["data"]["by_team"], "prod");
            assert!(e["message"].as_str().unwrap().contains("reclaims its reserved quota"), "{e:#}");
            assert!(kinds(&timeline).contains(&"requeued".to_owned()), "{timeline:#?}");
            preempted.push(id.clone());
        }
    }
    assert_eq!(preempted.len(), 1, "one 8-GPU borrower frees enough");
    let victim = job(&app, &research, &preempted[0]).await;
    assert_eq!(victim["state"], "pending", "{victim:#}");
    assert_eq!(victim["preemptions"], 1);
    assert!(victim["pending"]["reason"].as_str().is_some(), "{victim:#}");
    // The run it lost counts as service attained (what the service order and its
    // least-attained-service threshold rank by): more than nothing, less than its life.
    let (attained, lived): (i64, f64) = sqlx::query_as(
        "select attained_ms, extract(epoch from now() - submitted_at)::float8 * 1000 from jobs where id = $1::uuid",
    )
    .bind(&preempted[0])
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert!(attained > 0 && (attained as f64) < lived, "attained {attained} ms of {lived} ms since submission");
    assert!(db::decisions::quota_violations(&app.pool).await.unwrap().is_empty());
}

#[tokio::test]
async fn the_start_interval_a_dry_run_gives_brackets_when_the_job_it_described_then_starts() {
    let app = TestApp::spawn().await;
    start_control(&app).await;
    wait_for_inventory(&app).await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "a100-80gb", 8, 0).await;
    let (_, ci) = app.api_token(&admin, "ml", "member").await;
    // The first job takes the team's whole quota for 20 s (200 simulated seconds at 10×)
    // and says so; the second, described by a dry run, waits for it.
    let first = json!({"name": "first", "gpu_class": "a100-80gb", "gpus_per_replica": 8, "image": "x",
                       "expected_runtime_seconds": 20, "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "200"}});
    let first = submit(&app, &ci, "ml", first).await;
    wait_for(&app, &ci, &first, Duration::from_secs(30), |j| j["state"] == "running").await;
    let second = json!({"name": "second", "gpu_class": "a100-80gb", "gpus_per_replica": 8, "image": "x"});
    let r = app.send(call("POST", "/api/v1/teams/ml/jobs:dry-run").token(&ci).json(&second)).await;
    r.assert_status(200);
    let dry = r.json();
    assert_eq!((dry["fits_now"].as_bool(), dry["reason"].as_str()), (Some(false), Some("burst_limit")), "{dry:#}");
    let at = |key: &str| {
        let t = dry[key].as_str().unwrap_or_else(|| panic!("no {key}: {dry:#}"));
        chrono::DateTime::parse_from_rfc3339(t).unwrap().with_timezone(&chrono::Utc)
    };
    let (earliest, latest) = (at("earliest_start_at"), at("latest_start_at"));
    assert!(earliest <= at("expected_start_at") && at("expected_start_at") <= latest, "{dry:#}");
    let second = submit(&app, &ci, "ml", second).await;
    let started = wait_for(&app, &ci, &second, Duration::from_secs(90), |j| j["started_at"].is_string()).await;
    let started_at = chrono::DateTime::parse_from_rfc3339(started["started_at"].as_str().unwrap()).unwrap();
    assert!(
        earliest <= started_at && started_at <= latest,
        "started at {started_at}, outside the dry run's [{earliest}, {latest}]: {dry:#}"
    );
}

#[tokio::test]
async fn cancelling_a_running_job_stops_it_and_frees_its_gpus_for_the_next() {
    let app = TestApp::spawn().await;
    start_control(&app).await;
    wait_for_inventory(&app).await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "a100-80gb", 8, 0).await;
    let (_, ci) = app.api_token(&admin, "ml", "member").await;
    let body = |name: &str| {
        json!({"name": name, "gpu_class": "a100-80gb", "gpus_per_replica": 8, "image": "x",
               "preemption_grace_seconds": 1, "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "3000"}})
    };
    let first = submit(&app, &ci, "ml", body("first")).await;
    wait_for(&app, &ci, &first, Duration::from_secs(30), |j| j["state"] == "running").await;
    let second = submit(&app, &ci, "ml", body("second")).await;
    let waiting = wait_for(&app, &ci, &second, Duration::from_secs(10), |j| j["pending"]["reason"].is_string()).await;
    assert_eq!(waiting["state"], "pending");
    // Why it waits, with the numbers behind it.
    assert_eq!(waiting["pending"]["reason"], "burst_limit", "{waiting:#}");
    let message = waiting["pending"]["message"].as_str().unwrap();
    assert!(
        message.contains("team ml holds 8 of the 8 GPUs of a100-80gb its quota allows (8 reserved + 0 burst), and this job needs 8 more"),
        "{message}"
    );
    let mut figures = waiting["pending"]["figures"].clone();
    let interval = [figures["earliest_start_at"].take(), figures["latest_start_at"].take()];
    assert_eq!(
        figures,
        json!({"needs_gpus": 8.0, "free_gpus": 0.0, "team": "ml", "in_use_gpus": 8.0, "reserved_gpus": 8.0,
               "burst_gpus": 0.0, "earliest_start_at": null, "latest_start_at": null}),
        "{waiting:#}"
    );
    // It starts when the first job ends, which the forecast foresees as an interval around
    // its expected start (RFC 3339 times in UTC compare as strings).
    let pending = &waiting["pending"];
    assert_eq!(interval, [pending["earliest_start_at"].clone(), pending["latest_start_at"].clone()]);
    let [earliest, expected, latest] =
        ["earliest_start_at", "expected_start_at", "latest_start_at"].map(|k| pending[k].as_str().unwrap_or_default());
    assert!(!earliest.is_empty() && earliest <= expected && expected <= latest, "{waiting:#}");
    let r = app.send(call("POST", &format!("/api/v1/jobs/{first}/cancel")).token(&ci)).await;
    r.assert_status(200);
    assert_eq!(r.json()["state"], "cancelled");
    assert!(r.json()["stop_requested_at"].is_string());
    wait_for(&app, &ci, &second, Duration::from_secs(30), |j| j["state"] == "running").await;
    // The forecast it was given when it first waited is kept beside when it was admitted:
    // what the next forecasts are calibrated by. (The first job never waited.)
    let (started, waiting) = db::forecast::errors(&app.pool, 10).await.unwrap();
    assert_eq!(started.len(), 1, "{started:?}");
    assert!(waiting.is_empty(), "{waiting:?}");
    assert!(started[0].forecast_ms >= 0 && started[0].actual_ms >= 0, "{started:?}");
    assert_eq!(started[0].priority_class, "experiment", "errors are learnt per priority class");
    let cancelled = job(&app, &ci, &first).await;
    assert_eq!(cancelled["state"], "cancelled");
    assert!(cancelled["finished_at"].is_string(), "{cancelled:#}");
    assert_eq!(kinds(&events(&app, &ci, &first).await).last().map(String::as_str), Some("cancelled"));
    // The second job's timeline says when it waited and why, before it was admitted.
    let timeline = events(&app, &ci, &second).await;
    assert_eq!(&kinds(&timeline)[..2], ["submitted", "waiting"], "{timeline:#?}");
    assert_eq!(timeline[1]["reason"], "burst_limit", "{:#}", timeline[1]);
    assert!(timeline[1]["message"].as_str().unwrap().contains("needs 8 more"), "{:#}", timeline[1]);
    // Then, while the first job stopped, it may have waited for its GPUs (a reason change is
    // a new entry), and got them.
    let reasons: Vec<&str> =
        timeline.iter().filter(|e| e["kind"] == "waiting").filter_map(|e| e["reason"].as_str()).collect();
    assert!(reasons[1..].iter().all(|&r| r == "waiting_for_reclaim"), "{timeline:#?}");
    assert!(kinds(&timeline).contains(&"admitted".to_owned()), "{timeline:#?}");
    let r = app.send(call("POST", &format!("/api/v1/jobs/{first}/cancel")).token(&ci)).await;
    r.assert_status(200);
}

/// An app whose cycles the test runs itself, with its inventory synced and team `ml`
/// holding 8 reserved H100s; returns the control context and the admin's token.
async fn without_control_loop() -> (TestApp, control::Ctx, String) {
    let app = TestApp::spawn().await;
    let ctx = serve::control_context(&app.state).await.expect("control context");
    control::sync_inventory(&ctx).await.expect("inventory");
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100-80gb", 8, 0).await;
    (app, ctx, admin)
}

#[tokio::test]
async fn a_cycle_of_a_deposed_leader_commits_nothing() {
    let (app, ctx, admin) = without_control_loop().await;
    let id = submit(&app, &admin, "ml", json!({"name": "x", "gpu_class": "h100-80gb", "image": "x"})).await;
    let mut conn = app.pool.acquire().await.unwrap();
    let old = db::leader::take_leadership(&mut conn, "old").await.unwrap();
    let new = db::leader::take_leadership(&mut conn, "new").await.unwrap();
    assert!(new > old);
    let stale = control::cycle::run(&app.pool, old, &ctx.config).await;
    assert!(matches!(stale, Err(control::ControlError::NotLeader)), "{stale:?}");
    assert_eq!(job(&app, &admin, &id).await["state"], "pending");
    let outbox: i64 = sqlx::query_scalar("select count(*) from dispatch_outbox").fetch_one(&app.pool).await.unwrap();
    assert_eq!(outbox, 0, "nothing was queued for dispatch");
    let report = control::cycle::run(&app.pool, new, &ctx.config).await.expect("cycle of the leader");
    assert_eq!(report.admitted, 1);
    assert_eq!(job(&app, &admin, &id).await["state"], "admitted");
}

#[tokio::test]
async fn a_job_waiting_behind_one_that_declared_a_short_runtime_is_expected_to_start_sooner_than_behind_a_long_one() {
    let (app, ctx, admin) = without_control_loop().await;
    app.team(&admin, "cv", None).await;
    app.quota(&admin, "cv", "h100-80gb", 8, 0).await;
    // Each team's whole quota in one job, so the next job of the team waits for it to end.
    let body = |name: &str, expected: Value| {
        json!({"name": name, "gpu_class": "h100-80gb", "gpus_per_replica": 8, "image": "x",
               "max_runtime_seconds": 86_400, "expected_runtime_seconds": expected})
    };
    let mut conn = app.pool.acquire().await.unwrap();
    let epoch = db::leader::take_leadership(&mut conn, "test").await.unwrap();
    submit(&app, &admin, "ml", body("short", json!(600))).await;
    submit(&app, &admin, "cv", body("long", json!(36_000))).await;
    let report = control::cycle::run(&app.pool, epoch, &ctx.config).await.expect("cycle");
    assert_eq!(report.admitted, 2);
    // The jobs behind them declare nothing: their own runtime does not matter to when they start.
    let behind_short = submit(&app, &admin, "ml", body("next", Value::Null)).await;
    let behind_long = submit(&app, &admin, "cv", body("next", Value::Null)).await;
    let now = chrono::Utc::now();
    control::cycle::run(&app.pool, epoch, &ctx.config).await.expect("cycle");
    let expected_start = |job: Value| {
        assert_eq!(job["pending"]["reason"], "burst_limit", "{job:#}");
        let at = job["pending"]["expected_start_at"].as_str().unwrap_or_else(|| panic!("no expected start: {job:#}"));
        chrono::DateTime::parse_from_rfc3339(at).unwrap().with_timezone(&chrono::Utc) - now
    };
    let short = expected_start(job(&app, &admin, &behind_short).await);
    let long = expected_start(job(&app, &admin, &behind_long).await);
    // The declared runtimes are the medians the starts are forecast from: about 10 minutes
    // and 10 hours away, not the day the maximum runtimes would allow.
    assert!(short < long, "behind the short job in {short}, behind the long one in {long}");
    assert!((5..=15).contains(&short.num_minutes()), "behind the short job in {short}");
    assert!((9 * 60..=11 * 60).contains(&long.num_minutes()), "behind the long job in {long}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_submissions_from_fifty_teams_never_exceed_quota_nor_admit_twice() {
    let app = std::sync::Arc::new(TestApp::spawn().await);
    // The default minimum runtime: 50 teams competing for burst capacity must not churn.
    start_control_with(&app, fairway::scheduler::Config::default().min_runtime_before_preemption_ms).await;
    wait_for_inventory(&app).await;
    let admin = app.admin().await;
    let mut tokens = Vec::new();
    for t in 0..50 {
        let team = format!("team-{t:02}");
        app.team(&admin, &team, None).await;
        app.quota(&admin, &team, "h100-80gb", 1, 2).await;
        tokens.push((team.clone(), app.api_token(&admin, &team, "member").await.1));
    }
    // Watches the invariant while the load runs: every team within reserved + burst.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (pool, stop) = (app.pool.clone(), stop.clone());
        tokio::spawn(async move {
            let mut checks = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let violations = db::decisions::quota_violations(&pool).await.expect("invariant query");
                assert!(violations.is_empty(), "quota exceeded: {violations:?}");
                checks += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            checks
        })
    };
    let mut submitters = tokio::task::JoinSet::new();
    for (team, token) in tokens {
        let app = app.clone();
        submitters.spawn(async move {
            for i in 0..20 {
                let body = json!({"name": format!("{team}-{i}"), "gpu_class": "h100-80gb", "image": "x",
                                  "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "2"}});
                let r = app.send(call("POST", &format!("/api/v1/teams/{team}/jobs")).token(&token).json(&body)).await;
                r.assert_status(201);
            }
        });
    }
    while let Some(r) = submitters.join_next().await {
        r.expect("submitter");
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    loop {
        let done: i64 = sqlx::query_scalar("select count(*) from jobs where state = 'succeeded'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
        if done == 1000 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "only {done} of 1000 jobs finished");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let checks = watcher.await.expect("watcher");
    assert!(checks > 10, "the invariant was checked {checks} times");
    let twice: i64 = sqlx::query_scalar(
        "select count(*) from (select job_id, attempt from job_events where kind = 'admitted'
                               group by job_id, attempt having count(*) > 1) d",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(twice, 0, "no attempt is admitted twice");
    let attempts: i64 =
        sqlx::query_scalar("select count(*) from jobs where attempt <> 1").fetch_one(&app.pool).await.unwrap();
    assert_eq!(attempts, 0, "every job ran exactly once");
    let intervals: i64 = sqlx::query_scalar("select count(*) from usage_intervals where ended_at is not null")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(intervals, 1000, "one closed usage interval per job");
}

#[tokio::test]
async fn an_object_no_job_knows_is_stopped_and_removed_by_the_reconciler() {
    let app = TestApp::spawn().await;
    let ctx = serve::control_context(&app.state).await.expect("control context");
    control::sync_inventory(&ctx).await.expect("inventory");
    let backend = ctx.backends.get("sim").expect("sim backend").clone();
    let stranger = fairway::domain::JobId::new();
    let gang = fairway::backends::Gang {
        object: fairway::backends::object_name(stranger, 1),
        job_id: stranger,
        attempt: 1,
        team: "nobody".into(),
        job_name: "left behind".into(),
        gpu_class: "h100-80gb".into(),
        priority_class: "experiment".into(),
        image: "x".into(),
        command: Vec::new(),
        env: [("FAIRWAY_SIM_CHECKPOINT_SECONDS".to_owned(), "0".to_owned())].into(),
        labels: Default::default(),
        max_runtime: Duration::from_secs(3600),
        cpu_millis: None,
        memory_mib: None,
        workload: Default::default(),
        replicas: vec![fairway::backends::ReplicaSlot { node: "r1-h100-1".into(), gpus: vec![0] }],
        array: None,
        service: None,
        extra_of: None,
    };
    backend.submit(&gang).await.expect("submit");
    let mut conn = app.pool.acquire().await.unwrap();
    let epoch = db::leader::take_leadership(&mut conn, "test").await.unwrap();
    let first = control::reconcile::reconcile(&ctx, epoch, "sim", backend.as_ref()).await.expect("reconcile");
    assert_eq!(first.orphans, 1, "the live orphan is stopped");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        control::reconcile::reconcile(&ctx, epoch, "sim", backend.as_ref()).await.expect("reconcile");
        if backend.objects().await.expect("objects").is_empty() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the orphan was never removed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_schedulers_kept_copy_of_the_live_jobs_matches_a_full_read_after_every_kind_of_change() {
    use control::cycle::Refresh;
    use db::snapshot::{snapshot_rows, LiveJobs};
    let (app, ctx, admin) = without_control_loop().await;
    let mut conn = app.pool.acquire().await.unwrap();
    let epoch = db::leader::take_leadership(&mut conn, "test").await.unwrap();
    let body = |name: &str| json!({"name": name, "gpu_class": "h100-80gb", "gpus_per_replica": 8, "image": "x"});
    let mut live = LiveJobs::default();

    let first = submit(&app, &admin, "ml", body("first")).await;
    let report =
        control::cycle::run_with(&app.pool, epoch, &ctx.config, Refresh::All, &mut live, &mut Default::default())
            .await
            .unwrap();
    assert_eq!(report.admitted, 1);
    // What others change between two cycles: submissions, a cancellation, a start and a
    // checkpoint (the reconciler, the API).
    let second = submit(&app, &admin, "ml", body("second")).await;
    let third = submit(&app, &admin, "ml", body("third")).await;
    app.send(call("POST", &format!("/api/v1/jobs/{third}/cancel")).token(&admin)).await.assert_status(200);
    let first_id: fairway::domain::JobId = first.parse().unwrap();
    let started = chrono::Utc::now();
    let mut tx = app.pool.begin().await.unwrap();
    assert_eq!(db::attempts::mark_running(&mut tx, &[(first_id, 1, started)]).await.unwrap(), vec![(first_id, 1)]);
    assert!(db::jobs::checkpoint(&mut tx, first_id, started + chrono::Duration::seconds(1)).await.unwrap());
    tx.commit().await.unwrap();
    let report =
        control::cycle::run_with(&app.pool, epoch, &ctx.config, Refresh::Changed, &mut live, &mut Default::default())
            .await
            .unwrap();
    assert_eq!((report.admitted, report.pending), (0, 1), "the second waits for the first's GPUs");
    // The first is lost to a spot interruption and goes back to the queue.
    let mut tx = app.pool.begin().await.unwrap();
    let ended = control::reconcile::Ended {
        job_id: first_id,
        attempt: 1,
        outcome: fairway::backends::Outcome::Preempted,
        started_at: Some(started),
        ended_at: chrono::Utc::now(),
        object: "obj".into(),
        cause: None,
    };
    control::reconcile::end_attempts(&mut tx, &[ended], &ctx).await.unwrap();
    tx.commit().await.unwrap();

    let kept = snapshot_rows(&app.pool, 3600.0, &mut live).await.unwrap();
    let full = snapshot_rows(&app.pool, 3600.0, &mut LiveJobs::default()).await.unwrap();
    assert_eq!(kept.jobs, full.jobs);
    let states: Vec<(String, &str, i32)> =
        kept.jobs.iter().map(|j| (j.id.to_string(), j.state.as_str(), j.attempt)).collect();
    assert_eq!(states, vec![(first, "pending", 1), (second.clone(), "pending", 0)], "the cancelled job is gone");
    let second = kept.jobs.iter().find(|j| j.id.to_string() == second).unwrap();
    assert!(second.pending_reason.is_some(), "the reason the cycle recorded is in the copy");
}

#[tokio::test]
async fn a_job_preempted_after_its_run_ended_but_before_the_stop_reached_it_succeeds_and_is_not_run_again() {
    let (app, ctx, admin) = without_control_loop().await;
    let backend = ctx.backends.get("sim").expect("sim backend").clone();
    let mut conn = app.pool.acquire().await.unwrap();
    let epoch = db::leader::take_leadership(&mut conn, "test").await.unwrap();
    let id = submit(
        &app,
        &admin,
        "ml",
        json!({"name": "quick", "gpu_class": "h100-80gb", "image": "x", "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "0.01"}}),
    )
    .await;
    assert_eq!(control::cycle::run(&app.pool, epoch, &ctx.config).await.expect("cycle").admitted, 1);
    let mut cursor = control::dispatch::Cursor::default();
    assert_eq!(control::dispatch::dispatch_batch(&ctx, epoch, &mut cursor).await.expect("dispatch"), 1);
    // The run ends on the cluster before anyone has seen it end.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !backend
        .objects()
        .await
        .expect("objects")
        .iter()
        .any(|o| matches!(o.phase, fairway::backends::Phase::Finished { .. }))
    {
        assert!(tokio::time::Instant::now() < deadline, "the run never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A cycle that still saw it admitted preempts it, and the stop is delivered.
    let job_id: fairway::domain::JobId = id.parse().unwrap();
    let mut tx = app.pool.begin().await.unwrap();
    let row = db::decisions::PreemptRow {
        job_id,
        grace_ms: 0,
        reason: "priority".into(),
        message: "preempted for a job that needs the GPUs more".into(),
        data: json!({}),
    };
    assert_eq!(db::decisions::preempt(&mut tx, &[row]).await.unwrap(), vec![job_id]);
    tx.commit().await.unwrap();
    assert_eq!(control::dispatch::dispatch_batch(&ctx, epoch, &mut cursor).await.expect("dispatch"), 1);
    control::reconcile::reconcile(&ctx, epoch, "sim", backend.as_ref()).await.expect("reconcile");
    let done = job(&app, &admin, &id).await;
    assert_eq!((done["state"].as_str(), done["attempt"].as_i64()), (Some("succeeded"), Some(1)), "{done:#}");
    let timeline = events(&app, &admin, &id).await;
    assert!(kinds(&timeline).contains(&"preempted".to_owned()), "{timeline:#?}");
    assert!(!kinds(&timeline).contains(&"requeued".to_owned()), "{timeline:#?}");
    let last = timeline.last().expect("events");
    assert_eq!(last["kind"], "succeeded", "{timeline:#?}");
    assert!(last["message"].as_str().unwrap_or_default().contains("before the preemption"), "{last:#}");
}

#[tokio::test]
async fn a_queued_jobs_new_reason_waits_for_the_next_refresh_while_a_new_jobs_first_reason_is_recorded_at_once() {
    use control::cycle::Refresh;
    let (app, ctx, admin) = without_control_loop().await;
    let mut conn = app.pool.acquire().await.unwrap();
    let epoch = db::leader::take_leadership(&mut conn, "test").await.unwrap();
    let body = |name: &str| json!({"name": name, "gpu_class": "h100-80gb", "gpus_per_replica": 8, "image": "x"});
    let mut live = db::snapshot::LiveJobs::default();
    submit(&app, &admin, "ml", body("first")).await;
    let report =
        control::cycle::run_with(&app.pool, epoch, &ctx.config, Refresh::Changed, &mut live, &mut Default::default())
            .await
            .unwrap();
    assert_eq!(report.admitted, 1);
    let second = submit(&app, &admin, "ml", body("second")).await;
    control::cycle::run_with(&app.pool, epoch, &ctx.config, Refresh::Changed, &mut live, &mut Default::default())
        .await
        .unwrap();
    let reason = |job: Value| job["pending"]["reason"].as_str().map(str::to_owned);
    let waiting = |timeline: Vec<Value>| -> Vec<String> {
        timeline.iter().filter(|e| e["kind"] == "waiting").map(|e| e["reason"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(reason(job(&app, &admin, &second).await).as_deref(), Some("burst_limit"), "recorded at once");
    assert_eq!(waiting(events(&app, &admin, &second).await), ["burst_limit"]);
    // The leader last recorded another reason (as if the department had been full then).
    sqlx::query("update jobs set pending_reason = 'insufficient_capacity', version = version + 1 where id = $1::uuid")
        .bind(&second)
        .execute(&app.pool)
        .await
        .unwrap();
    control::cycle::run_with(&app.pool, epoch, &ctx.config, Refresh::Changed, &mut live, &mut Default::default())
        .await
        .unwrap();
    assert_eq!(
        reason(job(&app, &admin, &second).await).as_deref(),
        Some("insufficient_capacity"),
        "not between refreshes"
    );
    control::cycle::run_with(&app.pool, epoch, &ctx.config, Refresh::All, &mut live, &mut Default::default())
        .await
        .unwrap();
    assert_eq!(reason(job(&app, &admin, &second).await).as_deref(), Some("burst_limit"), "at the refresh");
    assert_eq!(
        waiting(events(&app, &admin, &second).await),
        ["burst_limit", "burst_limit"],
        "each recorded change is an event"
    );
}

#[tokio::test]
async fn with_the_service_order_a_teams_job_declared_to_take_a_minute_runs_before_its_earlier_job_declared_to_take_hours(
) {
    let app = TestApp::spawn().await;
    let mut state = app.state.clone();
    let mut config = (*state.config).clone();
    config.sim_speedup = Some(10.0);
    config.cycle_interval = Duration::from_millis(50);
    // What `FAIRWAY_QUEUE_ORDER=service` sets.
    config.queue_order = fairway::scheduler::QueueOrder::SERVICE;
    state.config = std::sync::Arc::new(config);
    let mut ctx = serve::control_context(&state).await.expect("control context");
    ctx.config.reconcile_interval = Duration::from_millis(50);
    control::spawn(ctx, (*app.pool.connect_options()).clone(), format!("test-{}", uuid::Uuid::new_v4().simple()));
    wait_for_inventory(&app).await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100-80gb", 8, 0).await;
    let (_, ci) = app.api_token(&admin, "ml", "member").await;
    let spec = |name: &str, max: u32, expected: u32, ran: &str| {
        json!({"name": name, "gpu_class": "h100-80gb", "replicas": 1, "gpus_per_replica": 8,
               "image": "nvcr.io/nvidia/pytorch:24.05-py3", "max_runtime_seconds": max,
               "expected_runtime_seconds": expected, "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": ran}})
    };
    // The team's 8 GPUs are busy for 200 simulated seconds (20 s here): long enough for both
    // jobs to be ranked while they wait, even on a loaded machine.
    let blocker = submit(&app, &ci, "ml", spec("blocker", 3600, 60, "200")).await;
    wait_for(&app, &ci, &blocker, Duration::from_secs(30), |j| j["state"] == "running").await;
    let long = submit(&app, &ci, "ml", spec("long", 36_000, 18_000, "30")).await;
    let short = submit(&app, &ci, "ml", spec("short", 3600, 60, "30")).await;
    // Both wait on the team's quota, the one declared to take a minute first (positions of
    // jobs already queued are refreshed each second: wait for the long one's to move).
    wait_for(&app, &ci, &long, Duration::from_secs(30), |j| j["pending"]["position"] == 2).await;
    let waiting = job(&app, &ci, &short).await;
    assert_eq!((&waiting["state"], &waiting["pending"]["position"]), (&json!("pending"), &json!(1)), "{waiting:#}");
    let short_done = wait_for(&app, &ci, &short, Duration::from_secs(90), |j| j["state"] == "succeeded").await;
    let long_done = wait_for(&app, &ci, &long, Duration::from_secs(60), |j| j["state"] == "succeeded").await;
    let at = |j: &Value| chrono::DateTime::parse_from_rfc3339(j["admitted_at"].as_str().expect("admitted")).unwrap();
    assert!(at(&short_done) < at(&long_done), "short {short_done:#}\nlong {long_done:#}");
    assert!(
        at(&long_done) >= chrono::DateTime::parse_from_rfc3339(short_done["finished_at"].as_str().unwrap()).unwrap(),
        "the long job waited for the team's quota the short one held"
    );
}

#[tokio::test]
async fn with_the_service_order_a_fresh_job_takes_the_place_of_its_teams_job_that_ran_past_the_service_threshold() {
    let app = TestApp::spawn().await;
    // What `FAIRWAY_QUEUE_ORDER=service` with `FAIRWAY_SERVICE_THRESHOLD_GPU_SECONDS=8` sets:
    // an 8-GPU job is past the threshold after one second.
    start_control_tuned(&app, |c| {
        c.engine.min_runtime_before_preemption_ms = 0;
        c.engine.queue_order = fairway::scheduler::QueueOrder::ServiceIndex {
            starvation_ms: fairway::scheduler::DEFAULT_STARVATION_MS,
            threshold_gpu_ms: Some(8_000),
        };
    })
    .await;
    wait_for_inventory(&app).await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100-80gb", 8, 0).await;
    let (_, ci) = app.api_token(&admin, "ml", "member").await;
    let spec = |name: &str, ran: &str| {
        json!({"name": name, "gpu_class": "h100-80gb", "replicas": 1, "gpus_per_replica": 8,
               "image": "nvcr.io/nvidia/pytorch:24.05-py3", "priority_class": "experiment",
               "preemption_grace_seconds": 1, "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": ran}})
    };
    // The team's 8 GPUs go to a job of hours; then the team's next experiment arrives.
    let long = submit(&app, &ci, "ml", spec("long", "36000")).await;
    wait_for(&app, &ci, &long, Duration::from_secs(30), |j| j["state"] == "running").await;
    let fresh = submit(&app, &ci, "ml", spec("fresh", "30")).await;
    // It does not wait for the long job's hours: the long job gives way and queues again.
    wait_for(&app, &ci, &fresh, Duration::from_secs(60), |j| j["state"] == "running").await;
    let timeline = events(&app, &ci, &long).await;
    let preempted = timeline.iter().find(|e| e["kind"] == "preempted").expect("the long job was preempted");
    assert_eq!(preempted["reason"], "least_service", "{preempted:#}");
    assert_eq!(preempted["data"]["by_job"], fresh.as_str(), "{preempted:#}");
    assert!(preempted["message"].as_str().unwrap_or_default().contains("less GPU time"), "{preempted:#}");
    let requeued = wait_for(&app, &ci, &long, Duration::from_secs(30), |j| j["state"] == "pending").await;
    assert_eq!(requeued["preemptions"], 1, "{requeued:#}");
    // It ran past the threshold and ranks after the team's jobs below it: the fresh job
    // finishes first, then it runs again.
    let fresh_done = wait_for(&app, &ci, &fresh, Duration::from_secs(60), |j| j["state"] == "succeeded").await;
    let again = wait_for(&app, &ci, &long, Duration::from_secs(60), |j| j["state"] == "running").await;
    let at = |j: &Value, field: &str| chrono::DateTime::parse_from_rfc3339(j[field].as_str().expect(field)).unwrap();
    assert!(at(&again, "admitted_at") >= at(&fresh_done, "finished_at"), "{again:#}\n{fresh_done:#}");
}
