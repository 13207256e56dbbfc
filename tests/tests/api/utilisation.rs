//! What jobs' GPUs did, read as on a real cluster: the simulated cluster publishes its GPUs'
//! DCGM fields as dcgm-exporter does, a real Prometheus server scrapes them, and the leader
//! reads them from Prometheus's HTTP API.

use std::time::Duration;

use fairway::backends::sim::{serve_dcgm_exporter, SimBackend, SimConfig};
use fairway_tests::{
    call,
    prometheus::{Prometheus, Target},
    TestApp,
};
use serde_json::{json, Value};

use crate::lifecycle::{events, kinds, start_control, submit, wait_for, wait_for_inventory};

/// The service reading GPU activity from a real Prometheus that scrapes the simulated
/// cluster's dcgm-exporter, with its control loop running; returns both and an HTTP client.
async fn with_dcgm() -> (TestApp, Prometheus, reqwest::Client) {
    with_dcgm_and(|_| {}).await
}

/// The same, with more configuration.
async fn with_dcgm_and(more: impl FnOnce(&mut fairway::config::Config)) -> (TestApp, Prometheus, reqwest::Client) {
    let exporter = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let prometheus = Prometheus::start(&[Target { job: "dcgm", addr: exporter.local_addr().unwrap(), token: None }]);
    let app = TestApp::spawn_with(|c| {
        c.prometheus_url = Some(prometheus.url.clone());
        c.utilisation_interval = Duration::from_millis(300);
        c.metrics_token = Some(fairway::config::Secret::new("scrape"));
        more(c);
    })
    .await;
    tokio::spawn(serve_dcgm_exporter(vec![SimBackend::new(app.pool.clone(), SimConfig::default())], exporter));
    start_control(&app).await;
    wait_for_inventory(&app).await;
    let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(5)).build().unwrap();
    prometheus.wait_until_up(&http, &["dcgm"]).await;
    (app, prometheus, http)
}

/// A job whose GPUs stay at 2% utilisation (SM activity 1.8%) for long; of the production
/// class, which is billed at the list price.
fn idle_job(name: &str, replicas: i64, gpus: i64) -> Value {
    json!({"name": name, "gpu_class": "h100-80gb", "replicas": replicas, "gpus_per_replica": gpus, "image": "x",
           "priority_class": "production",
           "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "3000", "FAIRWAY_SIM_GPU_UTIL": "2",
                   "FAIRWAY_SIM_GPU_MEMORY_MIB": "9216"}})
}

async fn utilisation(app: &TestApp, token: &str, id: &str) -> Value {
    let r = app.send(call("GET", &format!("/api/v1/jobs/{id}/utilisation")).token(token)).await;
    r.assert_status(200);
    r.json()
}

/// Waits until the job's activity has been sampled at least `samples` times on every replica.
async fn sampled(app: &TestApp, token: &str, id: &str, replicas: usize, samples: i64) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let u = utilisation(app, token, id).await;
        let rows = u["replicas"].as_array().cloned().unwrap_or_default();
        if rows.len() == replicas && rows.iter().all(|r| r["samples"].as_i64().unwrap_or(0) >= samples) {
            return u;
        }
        assert!(tokio::time::Instant::now() < deadline, "the job's activity was never sampled: {u:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_jobs_gpu_activity_comes_from_dcgm_through_a_real_prometheus_per_replica_and_for_the_job() {
    let (app, prometheus, http) = with_dcgm().await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.team(&admin, "vision", None).await;
    app.quota(&admin, "ml", "h100-80gb", 8, 0).await;
    let (_, ci) = app.api_token(&admin, "ml", "member").await;
    let (_, other) = app.api_token(&admin, "vision", "member").await;
    let idle = submit(&app, &ci, "ml", idle_job("notebook", 2, 2)).await;
    let busy = submit(
        &app,
        &ci,
        "ml",
        json!({"name": "train", "gpu_class": "h100-80gb", "image": "x", "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "3000"}}),
    )
    .await;
    for id in [&idle, &busy] {
        wait_for(&app, &ci, id, Duration::from_secs(30), |j| j["state"] == "running").await;
    }
    // Prometheus holds the fields under dcgm-exporter's names, with the pod and its team's
    // namespace on the GPUs a replica holds.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let held = loop {
        let series = prometheus.query(&http, "DCGM_FI_PROF_SM_ACTIVE{namespace=\"ml\"}").await;
        let held: Vec<_> =
            series.iter().filter(|(_, v)| v.parse::<f64>().is_ok_and(|v| (v - 0.018).abs() < 1e-9)).cloned().collect();
        if held.len() == 4 {
            break held;
        }
        assert!(tokio::time::Instant::now() < deadline, "the idle job's four GPUs were never scraped: {series:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(held.iter().all(|(labels, _)| labels["pod"].as_str().is_some_and(|p| p.starts_with("fw-"))), "{held:?}");

    let u = sampled(&app, &ci, &idle, 2, 2).await;
    assert_eq!(u["measured"], true);
    assert_eq!(u["attempt"], 1);
    let expected = json!({"gpu_util_percent": 2.0, "sm_active_percent": 1.8, "tensor_active_percent": 1.0,
                          "memory_used_mib": 9216, "memory_total_mib": 81920});
    assert_eq!(u["now"], expected, "{u:#}");
    assert_eq!(u["attempt_mean"], expected, "a constant activity has itself as its mean: {u:#}");
    for (rank, replica) in u["replicas"].as_array().unwrap().iter().enumerate() {
        assert_eq!(replica["replica"], rank);
        assert_eq!(replica["gpus"], 2, "{replica:#}");
        assert_eq!(replica["now"], expected, "{replica:#}");
    }

    let u = sampled(&app, &ci, &busy, 1, 1).await;
    assert_eq!(
        u["now"],
        json!({"gpu_util_percent": 90.0, "sm_active_percent": 81.0, "tensor_active_percent": 45.0,
               "memory_used_mib": 57344, "memory_total_mib": 81920}),
        "a job that says nothing is busy: {u:#}"
    );

    // Another team's member does not learn that the job exists.
    app.send(call("GET", &format!("/api/v1/jobs/{idle}/utilisation")).token(&other))
        .await
        .assert_problem(404, "not_found");
}

#[tokio::test]
async fn without_a_prometheus_server_a_job_says_its_activity_is_not_measured() {
    let app = TestApp::spawn().await;
    start_control(&app).await;
    wait_for_inventory(&app).await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100-80gb", 8, 0).await;
    let id = submit(&app, &admin, "ml", json!({"name": "x", "gpu_class": "h100-80gb", "image": "x"})).await;
    wait_for(&app, &admin, &id, Duration::from_secs(30), |j| j["state"] == "running").await;
    let u = utilisation(&app, &admin, &id).await;
    assert_eq!(u["measured"], false, "{u:#}");
    assert_eq!((u["now"].clone(), u["replicas"].clone()), (Value::Null, json!([])), "{u:#}");
}

#[tokio::test]
async fn a_job_idle_past_its_policy_is_warned_then_stopped_and_its_statement_prices_the_idle_gpu_hours() {
    let (app, _prometheus, _http) = with_dcgm().await;
    let admin = app.admin().await;
    for team in ["ml", "vision"] {
        app.team(&admin, team, None).await;
        app.quota(&admin, team, "h100-80gb", 8, 0).await;
    }
    // $3,600 per GPU-hour: a GPU-second is a dollar, so seconds of idle time have a price.
    sqlx::query(
        "insert into gpu_class_rates (gpu_class_id, effective_from, rate_micros_per_gpu_hour)
         select id, '2026-01-01', 3600000000 from gpu_classes where name = 'h100-80gb'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let policy = app
        .send(call("PUT", "/api/v1/idle-policies").token(&admin).json(&json!({
            "team": "ml", "below_sm_active_percent": 10, "idle_seconds": 2, "notice_seconds": 2, "action": "stop"})))
        .await;
    policy.assert_status(200);
    assert_eq!(policy.json()["team"], "ml");
    // Only platform admins set them.
    let (_, member) = app.api_token(&admin, "ml", "member").await;
    app.send(call("PUT", "/api/v1/idle-policies").token(&member).json(&json!({
        "below_sm_active_percent": 10, "idle_seconds": 2, "action": "exempt"})))
        .await
        .assert_status(403);
    // Out of range and unknown fields name the field.
    let bad = app
        .send(call("PUT", "/api/v1/idle-policies").token(&admin).json(&json!({
            "below_sm_active_percent": 0, "idle_seconds": 2, "action": "stop"})))
        .await;
    assert_eq!(bad.assert_problem(422, "validation_failed")["errors"][0]["field"], "below_sm_active_percent");

    let governed = submit(&app, &admin, "ml", idle_job("forgotten-notebook", 1, 4)).await;
    let ungoverned = submit(&app, &admin, "vision", idle_job("also-idle", 1, 4)).await;
    let stopped = wait_for(&app, &admin, &governed, Duration::from_secs(60), |j| {
        j["state"] == "cancelled" && j["finished_at"].is_string()
    })
    .await;
    assert_eq!(stopped["attempt"], 1, "stopped, not requeued: {stopped:#}");
    let timeline = events(&app, &admin, &governed).await;
    let order = kinds(&timeline);
    let at = |kind: &str| order.iter().position(|k| k == kind).unwrap_or_else(|| panic!("no {kind}: {timeline:#?}"));
    assert!(
        at("running") < at("idle") && at("idle") < at("cancel_requested") && at("cancel_requested") < at("cancelled")
    );
    let warning = &timeline[at("idle")];
    assert_eq!(warning["reason"], "idle");
    let message = warning["message"].as_str().unwrap();
    assert!(
        message.contains("SM activity 1.8%") && message.contains("below the 10% of team ml's idle policy"),
        "{message}"
    );
    assert!(message.contains("it will be stopped at"), "{message}");
    assert_eq!(timeline[at("cancel_requested")]["reason"], "idle");

    // Without a policy the same idleness is counted, never acted on.
    let other = crate::lifecycle::job(&app, &admin, &ungoverned).await;
    assert_eq!(other["state"], "running", "{other:#}");
    assert!(!kinds(&events(&app, &admin, &ungoverned).await).contains(&"idle".to_owned()));

    // Operators see it per team and class, and what the policies did.
    let metrics = app.send(call("GET", "/metrics").header("authorization", "Bearer scrape")).await;
    let text = String::from_utf8(metrics.body.clone()).unwrap();
    let line = |prefix: &str| text.lines().find(|l| l.starts_with(prefix)).map(str::to_owned);
    assert_eq!(
        line("fairway_gpus_idle{team=\"vision\",gpu_class=\"h100-80gb\"}").as_deref(),
        Some("fairway_gpus_idle{team=\"vision\",gpu_class=\"h100-80gb\"} 4.0"),
        "{text}"
    );
    assert!(line("fairway_gpu_sm_active_ratio{team=\"vision\",gpu_class=\"h100-80gb\"} 0.018").is_some(), "{text}");
    assert_eq!(
        line("fairway_idle_actions_total{action=\"stopped\"}").as_deref(),
        Some("fairway_idle_actions_total{action=\"stopped\"} 1"),
        "{text}"
    );
    let period = chrono::Utc::now().format("%Y-%m").to_string();
    let statement = app.send(call("GET", &format!("/api/v1/teams/ml/statements/{period}")).token(&admin)).await;
    statement.assert_status(200);
    let s = statement.json();
    let idle_jobs = s["idle_jobs"].as_array().unwrap();
    assert_eq!(idle_jobs.len(), 1, "{s:#}");
    assert_eq!(idle_jobs[0]["job_id"], governed.as_str());
    let number = |v: &Value| v.as_str().unwrap().parse::<f64>().unwrap();
    let (hours, cost) = (number(&s["idle_gpu_hours"]), number(&s["idle_cost"]));
    // Four GPUs idle from the first read to the stop: at least the policy's 2 + 2 s.
    assert!(hours >= 4.0 * 4.0 / 3600.0, "{s:#}");
    assert!(cost > 0.0 && cost <= number(&s["billed_cost"]), "priced, and part of what was billed: {s:#}");
    // The job billed a dollar per GPU-second, so its idle time costs as many dollars as seconds.
    assert!((cost - hours * 3600.0).abs() < 0.01, "{s:#}");
    // The portal says the same: the job page its activity, the statement its idle cost.
    app.user(&admin, "alice", None).await;
    for team in ["ml", "vision"] {
        app.member(&admin, team, "alice", "viewer").await;
    }
    let session = crate::portal::sign_in(&app, "alice").await;
    let page = |path: String| {
        let (app, session) = (&app, &session);
        async move { crate::portal::body(&app.send(call("GET", &path).header("cookie", session)).await) }
    };
    let job_page = page(format!("/jobs/{ungoverned}")).await;
    assert!(job_page.contains("SM 1.8%, tensor cores 1%, utilisation 2%, memory 9.0 GiB of 80.0 GiB"), "{job_page}");
    let statement_page = page(format!("/teams/ml/statements/{period}")).await;
    let idle_section = &statement_page[statement_page.find("Idle GPUs").expect("an idle section")..];
    assert!(idle_section.contains("forgotten-notebook"), "{statement_page}");
    // Allocated against effective: every billed hour was measured, at 1.8% SM activity.
    assert_eq!(s["measured_gpu_hours"], s["gpu_hours"], "{s:#}");
    let (measured, effective) = (number(&s["measured_gpu_hours"]), number(&s["effective_gpu_hours"]));
    assert!(measured > 0.0 && (effective - measured * 0.018).abs() < 1e-6, "{s:#}");
}

#[tokio::test]
async fn a_job_that_used_9_gb_of_an_80_gb_gpu_is_advised_a_1g_10gb_mig_slice_with_what_it_would_save() {
    let (app, _prometheus, _http) = with_dcgm().await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100-80gb", 8, 0).await;
    // An H100 at $4.00 an hour, an A100 1g.10gb slice at $0.40; other classes have no price
    // and are never offered.
    for (class, rate) in [("h100-80gb", 4_000_000), ("a100-80gb.mig-1g.10gb", 400_000)] {
        sqlx::query(
            "insert into gpu_class_rates (gpu_class_id, effective_from, rate_micros_per_gpu_hour)
             select id, '2026-01-01', $2 from gpu_classes where name = $1",
        )
        .bind(class)
        .bind(rate)
        .execute(&app.pool)
        .await
        .unwrap();
    }
    let id = submit(&app, &admin, "ml", idle_job("embeddings", 1, 2)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let advice = loop {
        let u = utilisation(&app, &admin, &id).await;
        if !u["recommendation"].is_null() {
            break u["recommendation"].clone();
        }
        assert!(tokio::time::Instant::now() < deadline, "no advice came: {u:#}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(advice["gpu_class"], "a100-80gb.mig-1g.10gb", "{advice:#}");
    assert_eq!((advice["memory_mib"].as_i64(), advice["price_percent"].as_i64()), (Some(10240), Some(10)));
    let message = advice["message"].as_str().unwrap();
    assert!(message.contains("at most 9.0 GiB of memory and 1.8% of its GPUs' SMs on h100-80gb"), "{message}");
    assert!(message.contains("at 10% of the price"), "{message}");
    assert!(advice["saving"].as_str().unwrap().parse::<f64>().unwrap() > 0.0, "{advice:#}");

    // Ended, its statement advises the job name with what the month's bill would have saved.
    app.send(call("POST", &format!("/api/v1/jobs/{id}/cancel")).token(&admin)).await.assert_status(200);
    wait_for(&app, &admin, &id, Duration::from_secs(30), |j| j["finished_at"].is_string()).await;
    let period = chrono::Utc::now().format("%Y-%m").to_string();
    let s = app.send(call("GET", &format!("/api/v1/teams/ml/statements/{period}")).token(&admin)).await.json();
    let advice = &s["right_sizing"][0];
    assert_eq!(advice["job_name"], "embeddings", "{s:#}");
    assert_eq!(advice["recommended_class"], "a100-80gb.mig-1g.10gb", "{s:#}");
    assert_eq!((advice["jobs"].as_i64(), advice["peak_memory_mib"].as_i64()), (Some(1), Some(9216)), "{s:#}");
    let micros = |v: &Value| (v.as_str().unwrap().parse::<f64>().unwrap() * 1e6).round() as i64;
    let billed = micros(&s["billed_cost"]);
    assert!(billed > 0, "{s:#}");
    assert_eq!(micros(&advice["saving"]), billed * 9 / 10, "90% of what it was billed: {s:#}");
}

#[tokio::test]
async fn a_team_sees_which_idle_policy_governs_each_of_its_priority_classes_in_the_api_and_on_its_page() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.team(&admin, "vision", None).await;
    let (_, ml) = app.api_token(&admin, "ml", "viewer").await;
    let (_, vision) = app.api_token(&admin, "vision", "viewer").await;
    let governing = |token: String, team: &'static str| {
        let app = &app;
        async move {
            let r = app.send(call("GET", &format!("/api/v1/teams/{team}/idle-policies")).token(&token)).await;
            r.assert_status(200);
            let by_class: std::collections::BTreeMap<String, Value> = r
                .json()
                .as_array()
                .unwrap()
                .iter()
                .map(|g| (g["priority_class"].as_str().unwrap().to_owned(), g.clone()))
                .collect();
            by_class
        }
    };
    let none = governing(ml.clone(), "ml").await;
    assert_eq!(
        none["experiment"]["summary"],
        "no policy: idle time (SM activity below 5%) is counted on statements, never acted on"
    );
    assert!(none["experiment"]["policy"].is_null());
    for spec in [
        json!({"below_sm_active_percent": 5, "idle_seconds": 1800, "action": "notify"}),
        json!({"team": "ml", "priority_class": "experiment", "below_sm_active_percent": 10, "idle_seconds": 1800,
               "notice_seconds": 600, "action": "stop"}),
    ] {
        app.send(call("PUT", "/api/v1/idle-policies").token(&admin).json(&spec)).await.assert_status(200);
    }
    let ml_policies = governing(ml.clone(), "ml").await;
    let stop = "SM activity below 10% for 30 min: warned, then stopped 10 min later unless its GPUs get busy (team ml's policy)";
    assert_eq!(ml_policies["experiment"]["summary"], stop);
    assert_eq!(ml_policies["experiment"]["policy"]["team"], "ml");
    assert_eq!(ml_policies["production"]["summary"], "SM activity below 5% for 30 min: warned (the platform's policy)");
    // Another team's classes fall to the platform's policy; its member cannot read ml's.
    let vision_policies = governing(vision.clone(), "vision").await;
    assert_eq!(
        vision_policies["experiment"]["summary"],
        "SM activity below 5% for 30 min: warned (the platform's policy)"
    );
    let r = app.send(call("GET", "/api/v1/teams/ml/idle-policies").token(&vision)).await;
    assert_eq!(r.status.as_u16(), 404, "another team's policies are not there for it");
    // The team's page says the same.
    app.user(&admin, "alice", None).await;
    app.member(&admin, "ml", "alice", "member").await;
    let alice = crate::portal::sign_in(&app, "alice").await;
    let r = app.send(call("GET", "/teams/ml").header("cookie", &alice)).await;
    r.assert_status(200);
    let page = crate::portal::body(&r);
    assert!(page.contains("<h2>Idle GPUs</h2>"), "{page}");
    assert!(page.contains(&format!("<strong>experiment</strong>: {}", stop.replace('\'', "&#39;"))), "{page}");
}

/// The clusters as the API lists them, by name.
async fn cluster(app: &TestApp, token: &str) -> Value {
    let r = app.send(call("GET", "/api/v1/clusters").token(token)).await;
    r.assert_status(200);
    r.json()[0].clone()
}

#[tokio::test]
async fn a_gpu_whose_dcgm_fields_report_xid_79_takes_its_node_out_and_its_gang_requeues_elsewhere_billed_to_the_fault()
{
    let (app, _prometheus, _http) = with_dcgm().await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100-80gb", 16, 0).await;
    let whole_node = |name: &str, xid: Option<&str>| {
        let mut env = json!({"FAIRWAY_SIM_RUNTIME_SECONDS": "3000"});
        if let Some(xid) = xid {
            env["FAIRWAY_SIM_XID"] = json!(xid);
            env["FAIRWAY_SIM_XID_AFTER_SECONDS"] = json!("2");
        }
        json!({"name": name, "gpu_class": "h100-80gb", "replicas": 1, "gpus_per_replica": 8, "image": "x", "env": env})
    };
    let before = cluster(&app, &admin).await;
    let capacity = |c: &Value| c["capacity"]["h100-80gb"].as_i64().unwrap();
    let gang = submit(&app, &admin, "ml", whole_node("pretrain", Some("79"))).await;
    let bystander = submit(&app, &admin, "ml", whole_node("eval", None)).await;
    let first = wait_for(&app, &admin, &gang, Duration::from_secs(60), |j| j["state"] == "running").await;
    let node = first["placement"][0]["node"].as_str().unwrap().to_owned();
    let gpu = first["placement"][0]["gpus"][0].as_i64().unwrap();
    let started: chrono::DateTime<chrono::Utc> = first["started_at"].as_str().unwrap().parse().unwrap();

    // Two seconds in, the gang's first GPU reports XID 79 through dcgm-exporter's series in
    // Prometheus; the gang hangs on as far as its cluster says, yet it is requeued elsewhere.
    let again =
        wait_for(&app, &admin, &gang, Duration::from_secs(60), |j| j["attempt"] == 2 && j["state"] == "running").await;
    assert_ne!(again["placement"][0]["node"], node.as_str(), "the faulty node is excluded: {again:#}");
    let (since, opened_at): (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("select since, opened_at from gpu_faults where node = $1")
            .bind(&node)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    // The fault began at the first scrape that showed it (Prometheus scrapes every second).
    let after_start = (since - started).num_milliseconds();
    assert!((2_000..4_000).contains(&after_start), "the fault began {after_start} ms after the start");
    assert!(opened_at - since < chrono::TimeDelta::seconds(30), "out of the inventory within 30 s");
    let timeline = events(&app, &admin, &gang).await;
    let requeued = timeline.iter().find(|e| e["kind"] == "requeued").unwrap_or_else(|| panic!("{timeline:#?}"));
    assert_eq!(requeued["reason"], "node_lost");
    let message = requeued["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("node {node}, GPU {gpu}: XID 79 (GPU has fallen off the bus)")),
        "the timeline says which GPU failed and how: {message}"
    );
    let requeued_at: chrono::DateTime<chrono::Utc> = requeued["at"].as_str().unwrap().parse().unwrap();
    assert!(requeued_at - since < chrono::TimeDelta::seconds(60), "requeued {} after the fault", requeued_at - since);
    // Its first attempt is billed to the fault, not to when Fairway noticed it.
    let ended: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("select ended_at from usage_intervals where job_id = $1::uuid and attempt = 1")
            .bind(&gang)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(ended, since, "billing ends at the fault");
    // A gang on another node runs on, untouched.
    let other = crate::lifecycle::job(&app, &admin, &bystander).await;
    assert_eq!((other["state"].as_str(), other["attempt"].as_i64()), (Some("running"), Some(1)), "{other:#}");

    // The cluster view says which node is out, since when, why, and that a person clears it.
    let out = cluster(&app, &admin).await;
    let unhealthy = out["unhealthy_nodes"].as_array().unwrap();
    let listed = unhealthy.iter().find(|n| n["node"] == node.as_str()).unwrap_or_else(|| panic!("{out:#}"));
    assert_eq!(listed["source"], "dcgm");
    assert_eq!(listed["why"], format!("GPU {gpu}: XID 79 (GPU has fallen off the bus)"));
    assert_eq!(capacity(&out), capacity(&before) - 8, "its 8 GPUs are out of the capacity: {out:#}");
    let metrics = app.send(call("GET", "/metrics").header("authorization", "Bearer scrape")).await;
    let text = String::from_utf8(metrics.body.clone()).unwrap();
    assert!(
        text.lines().any(|l| l.starts_with("fairway_gpu_faults_total{") && l.contains("kind=\"xid\"} 1")),
        "{text}"
    );
    // Another GPU of the node fails while it is out: recorded too, so clearing the first
    // does not bring back a node whose other GPU failed.
    let mut tx = app.pool.begin().await.unwrap();
    let double_bit = (node.clone(), "5".to_owned(), chrono::Utc::now(), "XID 48 (double-bit ECC error)".to_owned());
    let opened = fairway::db::health::open_faults(&mut tx, &[double_bit]).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(opened.len(), 1, "{opened:?}");
    let listed = cluster(&app, &admin).await["unhealthy_nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == node.as_str())
        .cloned()
        .unwrap();
    assert_eq!(
        listed["why"],
        format!("GPU {gpu}: XID 79 (GPU has fallen off the bus); GPU 5: XID 48 (double-bit ECC error)")
    );

    // Sticky: once the failed attempt's object is gone, its GPU reads 0 again, and the node
    // still stays out until a platform admin clears it.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let read: Option<f64> = sqlx::query_scalar(
            "select value from gpu_health_reads where host = $1 and gpu = $2 and field = 'DCGM_FI_DEV_XID_ERRORS'",
        )
        .bind(&node)
        .bind(gpu.to_string())
        .fetch_optional(&app.pool)
        .await
        .unwrap();
        if read == Some(0.0) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the GPU never read 0 again: {read:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let in_inventory = |node: String| {
        let pool = app.pool.clone();
        async move {
            sqlx::query_scalar::<_, bool>("select exists (select 1 from cluster_nodes where name = $1)")
                .bind(node)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    assert!(!in_inventory(node.clone()).await, "a cleared gauge does not clear the fault");

    // The portal's cluster page lists it too, with a Clear button for platform admins only.
    let cluster_name = out["name"].as_str().unwrap();
    app.user(&admin, "ops", Some("platform-admin")).await;
    app.user(&admin, "alice", None).await;
    app.member(&admin, "ml", "alice", "viewer").await;
    let clear_form = format!("action=\"/clusters/{cluster_name}/nodes/{node}/clear-faults\"");
    for (user, may_clear) in [("ops", true), ("alice", false)] {
        let session = crate::portal::sign_in(&app, user).await;
        let page = crate::portal::body(&app.send(call("GET", "/clusters").header("cookie", &session)).await);
        assert!(page.contains("XID 79 (GPU has fallen off the bus)"), "{user}: {page}");
        assert_eq!(page.contains(&clear_form), may_clear, "{user}: {page}");
    }
    let path = format!("/api/v1/clusters/{cluster_name}/nodes/{node}/faults");
    let (_, member) = app.api_token(&admin, "ml", "member").await;
    app.send(call("DELETE", &path).token(&member)).await.assert_status(403);
    let cleared = app.send(call("DELETE", &path).token(&admin)).await;
    cleared.assert_status(200);
    let gpus = cleared.json()["gpus"].clone();
    assert_eq!(gpus[0]["why"], "XID 79 (GPU has fallen off the bus)", "{gpus:#}");
    assert_eq!((gpus[1]["gpu"].as_str(), gpus[1]["why"].as_str()), (Some("5"), Some("XID 48 (double-bit ECC error)")));
    app.send(call("DELETE", &path).token(&admin)).await.assert_problem(404, "not_found");
    let audited: i64 = sqlx::query_scalar("select count(*) from audit_log where action = 'gpu_fault.clear'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(audited, 1);
    // Cleared, the node offers its GPUs again at the next health read, and the gauge at 0
    // opens nothing.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !in_inventory(node.clone()).await {
        assert!(tokio::time::Instant::now() < deadline, "the cleared node never came back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(capacity(&cluster(&app, &admin).await), capacity(&before));
    let faults: i64 = sqlx::query_scalar("select count(*) from gpu_faults").fetch_one(&app.pool).await.unwrap();
    assert_eq!(faults, 0);
}

#[tokio::test]
async fn without_a_prometheus_server_activity_and_faults_are_read_straight_from_dcgm_exporter() {
    let exporter = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/metrics", exporter.local_addr().unwrap());
    let app = TestApp::spawn_with(|c| {
        c.dcgm_exporter_urls = vec![url];
        c.utilisation_interval = Duration::from_millis(300);
    })
    .await;
    tokio::spawn(serve_dcgm_exporter(vec![SimBackend::new(app.pool.clone(), SimConfig::default())], exporter));
    start_control(&app).await;
    wait_for_inventory(&app).await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "h100-80gb", 16, 0).await;
    let idle = submit(&app, &admin, "ml", idle_job("notebook", 1, 2)).await;
    wait_for(&app, &admin, &idle, Duration::from_secs(30), |j| j["state"] == "running").await;
    let u = sampled(&app, &admin, &idle, 1, 2).await;
    assert_eq!(u["measured"], true);
    assert_eq!(u["now"]["sm_active_percent"], 1.8, "{u:#}");
    assert_eq!(u["now"]["memory_used_mib"], 9216, "{u:#}");
    // An XID read from the exporter takes the node out, from the scrape that first showed it.
    let mut failing = idle_job("hangs", 1, 8);
    failing["env"]["FAIRWAY_SIM_XID"] = json!("48");
    let failing = submit(&app, &admin, "ml", failing).await;
    let again =
        wait_for(&app, &admin, &failing, Duration::from_secs(60), |j| j["attempt"] == 2 && j["state"] == "running")
            .await;
    let unhealthy = cluster(&app, &admin).await["unhealthy_nodes"].clone();
    let listed = unhealthy.as_array().and_then(|n| n.first()).cloned().unwrap_or_default();
    assert!(listed["why"].as_str().is_some_and(|w| w.ends_with("XID 48 (double-bit ECC error)")), "{unhealthy:#}");
    assert_ne!(again["placement"][0]["node"], listed["node"], "{again:#}");
}

#[tokio::test]
async fn a_cloud_pool_jobs_activity_is_read_by_the_batch_job_label_a_scrape_sets_from_its_tags() {
    use fairway::backends::sim::{POOL_OBJECT_LABEL, POOL_REPLICA_LABEL};
    let (app, prometheus, http) = with_dcgm_and(|c| {
        c.dcgm_object_label = Some(POOL_OBJECT_LABEL.into());
        c.dcgm_replica_label = Some(POOL_REPLICA_LABEL.into());
    })
    .await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.quota(&admin, "ml", "l4-24gb", 8, 0).await;
    let job = submit(
        &app,
        &admin,
        "ml",
        json!({"name": "embed", "gpu_class": "l4-24gb", "replicas": 2, "gpus_per_replica": 1, "image": "x",
               "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "3000", "FAIRWAY_SIM_GPU_UTIL": "40",
                       "FAIRWAY_SIM_GPU_MEMORY_MIB": "4096"}}),
    )
    .await;
    wait_for(&app, &admin, &job, Duration::from_secs(30), |j| j["state"] == "running").await;
    // Prometheus keeps the pool's GPUs under the batch job's name and node index, no pod.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let series = prometheus.query(&http, &format!("DCGM_FI_DEV_GPU_UTIL{{{POOL_OBJECT_LABEL}=~\"fw-.+\"}}")).await;
        if series.len() == 2 {
            assert!(series.iter().all(|(labels, _)| labels.get("pod").is_none()), "{series:?}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the pool's GPUs were never scraped: {series:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let u = sampled(&app, &admin, &job, 2, 1).await;
    assert_eq!(u["measured"], true);
    assert_eq!(u["now"]["gpu_util_percent"], 40.0, "{u:#}");
    assert_eq!(u["now"]["memory_used_mib"], 4096, "{u:#}");
    let ranks: Vec<i64> = u["replicas"].as_array().unwrap().iter().map(|r| r["replica"].as_i64().unwrap()).collect();
    assert_eq!(ranks, [0, 1]);
}
