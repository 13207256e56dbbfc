//! Inference services end to end through the real control loop on the simulated cluster: a
//! service of min 2 / max 4 replicas that keeps 2 running through replica failures, scales
//! to 4 when quota allows, keeps its minimum through a lender's reclaim, rolls to a new image
//! without exceeding the team's quota, runs out of restarts and says so, and is deleted;
//! what a request may say, and who may see a service.

use std::time::Duration;

use fairway_tests::{call, TestApp};
use serde_json::{json, Value};

use crate::lifecycle::{events, start_control, wait_for_inventory};

const WITHIN: Duration = Duration::from_secs(120);

/// A platform with the simulated cluster (64 H100 in eight nodes of 8) and team `ml` with
/// `reserved` and `burst` H100; a member's token.
async fn platform(app: &TestApp, reserved: i64, burst: i64) -> String {
    start_control(app).await;
    wait_for_inventory(app).await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100-80gb", reserved, burst).await;
    app.api_token(&admin, "ml", "member").await.1
}

/// A service of `min`..`max` replicas of 8 H100 each, serving until stopped.
fn service(name: &str, min: i64, max: i64, image: &str, env: Value) -> Value {
    let mut env = env;
    env["FAIRWAY_SIM_LOG_EVERY_SECONDS"] = json!("0");
    json!({"name": name, "min_replicas": min, "max_replicas": max,
           "replica": {"gpu_class": "h100-80gb", "gpus": 8, "image": image, "command": ["vllm", "serve"], "env": env}})
}

async fn create(app: &TestApp, token: &str, body: Value) -> Value {
    let r = app.send(call("POST", "/api/v1/teams/ml/services").token(token).json(&body)).await;
    r.assert_status(201);
    r.json()
}

/// Reads service `name`, checking that its counts and its replica jobs tell the same story
/// (they are read at one instant).
async fn read(app: &TestApp, token: &str, name: &str) -> Value {
    let r = app.send(call("GET", &format!("/api/v1/teams/ml/services/{name}")).token(token)).await;
    r.assert_status(200);
    let s = r.json();
    let running_jobs = replicas(&s, "running").len();
    assert_eq!(usize::try_from(running(&s)).ok(), Some(running_jobs), "counts agree with the replica jobs: {s:#}");
    s
}

async fn patch(app: &TestApp, token: &str, name: &str, body: Value) -> Value {
    let r = app.send(call("PATCH", &format!("/api/v1/teams/ml/services/{name}")).token(token).json(&body)).await;
    r.assert_status(200);
    r.json()
}

/// Polls the service until `done` holds, checking `each` on every read on the way.
async fn wait(
    app: &TestApp,
    token: &str,
    name: &str,
    done: impl Fn(&Value) -> bool,
    mut each: impl FnMut(&Value),
) -> Value {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let s = read(app, token, name).await;
        each(&s);
        if done(&s) {
            return s;
        }
        assert!(tokio::time::Instant::now() < deadline, "service {name} did not get there in time: {s:#}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn running(s: &Value) -> i64 {
    s["counts"]["running"].as_i64().unwrap_or_else(|| panic!("no running count: {s:#}"))
}

/// The replica jobs of `s` in `state`, as (slot, job id, revision).
fn replicas(s: &Value, state: &str) -> Vec<(i64, String, i64)> {
    let mut out: Vec<_> = s["replica_jobs"]
        .as_array()
        .unwrap_or_else(|| panic!("no replica jobs: {s:#}"))
        .iter()
        .filter(|j| j["state"] == state)
        .map(|j| {
            (
                j["service"]["slot"].as_i64().expect("slot"),
                j["id"].as_str().expect("id").to_owned(),
                j["service"]["revision"].as_i64().expect("revision"),
            )
        })
        .collect();
    out.sort();
    out
}

/// H100s team `ml`'s jobs hold now, read from the database the engine admits against.
async fn gpus_held(app: &TestApp) -> i64 {
    sqlx::query_scalar(
        "select coalesce(sum(j.replicas * j.gpus_per_replica), 0)::int8 from jobs j join teams t on t.id = j.team_id
         where t.name = 'ml' and j.holds_gpus",
    )
    .fetch_one(&app.pool)
    .await
    .expect("gpus held")
}

#[tokio::test]
async fn a_service_keeps_its_replicas_running_through_failures_each_restarted_on_its_own_budget() {
    let app = TestApp::spawn().await;
    let ml = platform(&app, 16, 0).await;
    // The first attempt of both replicas fails after the simulator's default run time.
    let created =
        create(&app, &ml, service("chat", 2, 4, "ghcr.io/acme/chat:1", json!({"FAIRWAY_SIM_FAIL_TASKS": "0,1"}))).await;
    assert_eq!((created["state"].as_str(), created["replicas"].as_i64()), (Some("starting"), Some(2)), "{created:#}");
    assert_eq!((created["restart_budget"].as_i64(), created["port"].as_i64()), (Some(5), Some(8000)));
    let ready = wait(
        &app,
        &ml,
        "chat",
        |s| s["state"] == "ready" && s["replica_jobs"].as_array().is_some_and(|r| r.iter().all(|j| j["attempt"] == 2)),
        |_| {},
    )
    .await;
    assert_eq!(running(&ready), 2, "{ready:#}");
    let live = replicas(&ready, "running");
    assert_eq!(live.iter().map(|r| r.0).collect::<Vec<_>>(), [0, 1], "one replica per slot: {ready:#}");
    for (_, id, _) in &live {
        let timeline = events(&app, &ml, id).await;
        let requeued = timeline.iter().find(|e| e["kind"] == "requeued").unwrap_or_else(|| panic!("{timeline:#?}"));
        let message = requeued["message"].as_str().unwrap_or_default();
        assert!(message.contains("retry 1 of 5"), "restarted on the service's budget: {message}");
    }
    // Reachable at the simulated cluster's address, on the service's port.
    let endpoints = ready["endpoints"].as_array().expect("endpoints");
    assert_eq!(endpoints.len(), 1, "{ready:#}");
    assert_eq!(endpoints[0]["address"], "chat.ml.sim.sim.fairway.internal:8000", "{ready:#}");
    // Each replica is a job with no maximum runtime, told its place.
    let job = &ready["replica_jobs"][0];
    assert_eq!((job["replicas"].as_i64(), job["gpus_per_replica"].as_i64()), (Some(1), Some(8)));
    assert_eq!(job["priority_class"], "production", "the minimum runs at the guaranteed class");
    assert_eq!(job["max_runtime_seconds"], i64::from(i32::MAX), "no maximum runtime");
    // Metered per replica like any job: each attempt an interval of its 8 GPUs, the failed
    // first one closed at its end, the serving second one open.
    for (_, id, _) in &live {
        let intervals: Vec<(i32, i32, bool)> = sqlx::query_as(
            "select attempt, gpus, ended_at is not null from usage_intervals where job_id = $1::uuid order by attempt",
        )
        .bind(id)
        .fetch_all(&app.pool)
        .await
        .unwrap();
        assert_eq!(intervals, [(1, 8, true), (2, 8, false)], "replica {id}");
    }
}

#[tokio::test]
async fn a_service_scales_to_four_on_burst_and_a_lenders_reclaim_takes_only_the_replicas_above_its_minimum() {
    let app = TestApp::spawn().await;
    // `ml` has 16 H100 reserved (its minimum of two 8-GPU replicas) and may borrow 16 more;
    // `research` holds the other 48 reserved, idle until it reclaims them.
    let ml = platform(&app, 16, 16).await;
    let admin = app.admin().await;
    app.team(&admin, "research", None).await;
    app.quota(&admin, "research", "h100-80gb", 48, 0).await;
    let research = app.api_token(&admin, "research", "member").await.1;
    create(&app, &ml, service("chat", 2, 4, "ghcr.io/acme/chat:1", json!({}))).await;
    let ready = wait(&app, &ml, "chat", |s| s["state"] == "ready", |_| {}).await;
    let minimum = replicas(&ready, "running");

    // Beyond the maximum is refused, naming the field.
    let r = app.send(call("PATCH", "/api/v1/teams/ml/services/chat").token(&ml).json(&json!({"replicas": 5}))).await;
    let problem = r.assert_problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["field"], "replicas", "{problem:#}");

    let scaled = patch(&app, &ml, "chat", json!({"replicas": 4})).await;
    assert_eq!((scaled["replicas"].as_i64(), scaled["state"].as_str()), (Some(4), Some("scaling")), "{scaled:#}");
    let four = wait(&app, &ml, "chat", |s| s["state"] == "ready", |_| {}).await;
    assert_eq!(running(&four), 4, "quota allows: all four run: {four:#}");
    let burst: Vec<_> =
        four["replica_jobs"].as_array().unwrap().iter().filter(|j| j["service"]["slot"].as_i64() >= Some(2)).collect();
    assert!(burst.iter().all(|j| j["priority_class"] == "experiment" && j["borrowing"] == true), "{four:#}");
    assert_eq!(gpus_held(&app).await, 32);

    // The lender wants all of its reserved quota back: 48 GPUs while 32 are free.
    let r = app
        .send(call("POST", "/api/v1/teams/research/jobs").token(&research).json(&json!({
        "name": "pretrain", "gpu_class": "h100-80gb", "replicas": 6, "gpus_per_replica": 8,
        "priority_class": "production", "image": "ghcr.io/research/train:1",
        "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "3600", "FAIRWAY_SIM_LOG_EVERY_SECONDS": "0"}})))
        .await;
    r.assert_status(201);
    let pretrain = r.json()["id"].as_str().expect("id").to_owned();
    let after = wait(
        &app,
        &ml,
        "chat",
        |s| s["counts"]["running"] == 2 && s["counts"]["stopping"] == 0 && s["counts"]["starting"] == 0,
        |s| assert!(running(s) >= 2, "never below its minimum: {s:#}"),
    )
    .await;
    crate::lifecycle::wait_for(&app, &research, &pretrain, WITHIN, |j| j["state"] == "running").await;
    assert_eq!(replicas(&after, "running"), minimum, "the minimum replicas kept running, untouched: {after:#}");
    let waiting: Vec<_> =
        after["replica_jobs"].as_array().unwrap().iter().filter(|j| j["state"] == "pending").collect();
    assert_eq!(waiting.len(), 2, "the two above the minimum wait to come back: {after:#}");
    assert!(waiting.iter().all(|j| j["preemptions"] == 1 && j["service"]["slot"].as_i64() >= Some(2)), "{after:#}");
    assert_eq!(after["state"], "scaling", "{after:#}");
}

#[tokio::test]
async fn a_rolling_update_replaces_every_replica_with_the_new_image_without_exceeding_the_quota() {
    let app = TestApp::spawn().await;
    // Exactly the two replicas' worth: no room for a new replica beside an old one.
    let ml = platform(&app, 16, 0).await;
    create(&app, &ml, service("chat", 2, 2, "ghcr.io/acme/chat:1", json!({}))).await;
    let before = wait(&app, &ml, "chat", |s| s["state"] == "ready", |_| {}).await;
    let old: Vec<String> = replicas(&before, "running").into_iter().map(|r| r.1).collect();

    let updated = patch(&app, &ml, "chat", json!({"image": "ghcr.io/acme/chat:2"})).await;
    assert_eq!((updated["revision"].as_i64(), updated["image"].as_str()), (Some(2), Some("ghcr.io/acme/chat:2")));
    // Sampled on every read, and checked again over the replicas' whole lives below.
    let (mut most, mut saw_rolling) = (0, false);
    let deadline = tokio::time::Instant::now() + WITHIN;
    let done = loop {
        let s = read(&app, &ml, "chat").await;
        most = most.max(gpus_held(&app).await);
        saw_rolling |= s["state"] == "rolling";
        if s["state"] == "ready" && s["counts"]["current"] == 2 {
            break s;
        }
        assert!(tokio::time::Instant::now() < deadline, "the update did not finish: {s:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(saw_rolling, "the service said it was rolling");
    let new = replicas(&done, "running");
    assert_eq!(new.iter().map(|r| (r.0, r.2)).collect::<Vec<_>>(), [(0, 2), (1, 2)], "{done:#}");
    assert!(new.iter().all(|r| !old.contains(&r.1)), "every replica is a new one");
    for job in done["replica_jobs"].as_array().unwrap().iter().filter(|j| j["state"] == "running") {
        assert_eq!(job["image"], "ghcr.io/acme/chat:2");
    }
    // From each replica's admission to its end, how many GPUs the service's replicas held
    // at that instant: the most is where some replica was admitted.
    let peak: i64 = sqlx::query_scalar(
        "select coalesce(max(n), 0)::int8 from (
             select (select sum(o.gpus_per_replica) from jobs o
                     where o.service_id = j.service_id and o.admitted_at <= j.admitted_at
                       and coalesce(o.finished_at, 'infinity') > j.admitted_at) as n
             from jobs j where j.service_id is not null and j.admitted_at is not null) x",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert!(
        peak <= 16 && most <= 16,
        "at most the 16 GPUs of the quota at once; saw {peak} over the lives, {most} sampled"
    );
    assert!(peak == 16, "both replicas ran at full size: {peak}");
    // With no room for a new replica beside an old one, each slot traded its old replica
    // for the new one: the new one withdrawn first, saying why, and started again after.
    let withdrawn: i64 = sqlx::query_scalar(
        "select count(*) from job_events where kind = 'cancelled' and message like 'no room within the quotas%'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(withdrawn, 2, "one withdrawn new replica per slot");
    for id in &old {
        let timeline = events(&app, &ml, id).await;
        assert!(
            timeline
                .iter()
                .any(|e| e["message"].as_str().unwrap_or_default().contains("replaced by a replica of revision 2")),
            "{timeline:#?}"
        );
    }
}

#[tokio::test]
async fn a_replica_out_of_restarts_leaves_the_service_degraded_until_it_is_changed_and_a_delete_stops_it() {
    let app = TestApp::spawn().await;
    let ml = platform(&app, 16, 0).await;
    let mut body = service(
        "flaky",
        1,
        1,
        "ghcr.io/acme/flaky:1",
        json!({"FAIRWAY_SIM_EXIT_CODE": "3", "FAIRWAY_SIM_RUNTIME_SECONDS": "5"}),
    );
    body["restart_budget"] = json!(1);
    create(&app, &ml, body).await;
    let degraded = wait(&app, &ml, "flaky", |s| s["state"] == "degraded", |_| {}).await;
    assert_eq!((degraded["counts"]["given_up"].as_i64(), running(&degraded)), (Some(1), 0), "{degraded:#}");
    let failed = replicas(&degraded, "failed");
    assert_eq!(failed.len(), 1, "one replica, failed after its one restart: {degraded:#}");
    let timeline = events(&app, &ml, &failed[0].1).await;
    assert!(timeline.iter().any(|e| e["message"].as_str().unwrap_or_default().contains("no retries left (1 used)")));

    // A change (here a new command) gives the slot a new replica, of the new revision.
    patch(&app, &ml, "flaky", json!({"command": ["serve", "--safe-mode"]})).await;
    let again = wait(
        &app,
        &ml,
        "flaky",
        |s| s["replica_jobs"].as_array().is_some_and(|r| r.iter().any(|j| j["service"]["revision"] == 2)),
        |_| {},
    )
    .await;
    let new =
        &again["replica_jobs"].as_array().unwrap().iter().find(|j| j["service"]["revision"] == 2).unwrap().clone();
    assert_ne!(new["id"], json!(failed[0].1), "a new replica job: {again:#}");
    assert_eq!(new["command"], json!(["serve", "--safe-mode"]), "{again:#}");

    // Deleted: its replicas stop, and the name is free again.
    let r = app.send(call("DELETE", "/api/v1/teams/ml/services/flaky").token(&ml)).await;
    r.assert_status(200);
    assert_eq!(r.json()["state"], "deleted");
    app.send(call("GET", "/api/v1/teams/ml/services/flaky").token(&ml)).await.assert_problem(404, "not_found");
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let live: i64 = sqlx::query_scalar(
            "select count(*) from jobs where service_id is not null and (state in ('pending', 'admitted', 'running') or holds_gpus)",
        )
        .fetch_one(&app.pool)
        .await
        .unwrap();
        if live == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{live} replicas still live after the delete");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    create(&app, &ml, service("flaky", 1, 1, "ghcr.io/acme/flaky:2", json!({}))).await;
}

#[tokio::test]
async fn a_service_request_that_cannot_be_met_is_refused_naming_the_field() {
    let app = TestApp::spawn().await;
    let ml = platform(&app, 16, 8).await;
    let refused = |body: Value| {
        let app = app.clone();
        let ml = ml.clone();
        async move {
            let r = app.send(call("POST", "/api/v1/teams/ml/services").token(&ml).json(&body)).await;
            let p = r.assert_problem(422, "validation_failed");
            p["errors"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| (e["field"].as_str().unwrap().to_owned(), e["code"].as_str().unwrap().to_owned()))
                .collect::<Vec<_>>()
        }
    };
    let base = service("chat", 1, 2, "ghcr.io/acme/chat:1", json!({}));
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    assert_eq!(refused(with("name", json!("7b-chat"))).await, [("name".into(), "invalid_format".into())]);
    assert_eq!(refused(with("max_replicas", json!(0))).await[0].0, "max_replicas");
    assert_eq!(refused(with("replicas", json!(3))).await, [("replicas".into(), "out_of_range".into())]);
    assert_eq!(refused(with("port", json!(70000))).await[0].0, "port");
    assert_eq!(
        refused(with("priority_class", json!("experiment"))).await,
        [("priority_class".into(), "preemptible".into())]
    );
    assert_eq!(
        refused(with("burst_priority_class", json!("production"))).await,
        [("burst_priority_class".into(), "not_preemptible".into())]
    );
    // Three 8-GPU replicas at the guaranteed class do not fit 16 reserved.
    let mut big = with("min_replicas", json!(3));
    big["max_replicas"] = json!(3);
    assert_eq!(refused(big).await[0].0, "min_replicas");
    let mut pool_only = base.clone();
    pool_only["replica"]["gpu_class"] = json!("l4-24gb");
    pool_only["replica"]["gpus"] = json!(1);
    let admin = app.admin().await;
    app.quota(&admin, "ml", "l4-24gb", 4, 0).await;
    assert_eq!(refused(pool_only).await, [("replica.gpu_class".into(), "cloud_pools_only".into())]);
    let mut unknown = base.clone();
    unknown["replica"]["max_runtime_seconds"] = json!(60);
    let r = app.send(call("POST", "/api/v1/teams/ml/services").token(&ml).json(&unknown)).await;
    let p = r.assert_problem(422, "validation_failed");
    assert_eq!(p["errors"][0]["code"], "unknown_field", "a replica has no maximum runtime to set: {p:#}");
    assert!(p["errors"][0]["field"].as_str().unwrap_or_default().ends_with("max_runtime_seconds"), "{p:#}");

    create(&app, &ml, base.clone()).await;
    app.send(call("POST", "/api/v1/teams/ml/services").token(&ml).json(&base))
        .await
        .assert_problem(409, "service_exists");

    // Another team neither sees nor changes it.
    app.team(&admin, "other", None).await;
    let other = app.api_token(&admin, "other", "member").await.1;
    app.send(call("GET", "/api/v1/teams/other/services/chat").token(&other)).await.assert_problem(404, "not_found");
    app.send(call("GET", "/api/v1/teams/ml/services/chat").token(&other)).await.assert_problem(404, "not_found");
    for (method, body) in [("PATCH", Some(json!({"replicas": 2}))), ("DELETE", None)] {
        let mut c = call(method, "/api/v1/teams/ml/services/chat").token(&other);
        if let Some(b) = &body {
            c = c.json(b);
        }
        app.send(c).await.assert_problem(404, "not_found");
        app.send({
            let mut c = call(method, "/api/v1/teams/other/services/chat").token(&other);
            if let Some(b) = &body {
                c = c.json(b);
            }
            c
        })
        .await
        .assert_problem(404, "not_found");
    }
    let still = read(&app, &ml, "chat").await;
    assert_eq!((still["replicas"].as_i64(), still["state"].as_str().is_some_and(|s| s != "deleted")), (Some(1), true));
    let list = app.send(call("GET", "/api/v1/teams/other/services").token(&other)).await;
    list.assert_status(200);
    assert_eq!(list.json()["items"], json!([]));

    // A hard budget too small for a day of the minimum refuses the service, on min_replicas;
    // one that holds it lets it in.
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    let budget = |amount: i64| {
        call("PUT", &format!("/api/v1/teams/ml/budgets/{month}"))
            .token(&admin)
            .json(&json!({"unit": "gpu-hours", "amount": amount, "enforcement": "hard"}))
    };
    app.send(budget(100)).await.assert_status(200);
    assert_eq!(refused(with("name", json!("chat-2"))).await, [("min_replicas".into(), "exceeds_budget".into())]);
    app.send(budget(100_000)).await.assert_status(200);
    create(&app, &ml, with("name", json!("chat-3"))).await;
}
