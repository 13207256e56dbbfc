//! Elastic gangs through the real control loop on the simulated cluster: a gang grows into
//! free GPUs as extra replicas (jobs of their own, `extra_of` naming it), gives extras back
//! before it would itself be preempted, ends them when it ends, and every replica is billed
//! for exactly what it ran.

use std::time::Duration;

use fairway_tests::{call, TestApp};
use serde_json::{json, Value};

use crate::{
    lifecycle::{h100_inventory, start_control, submit, wait_for, wait_for_inventory},
    portal::{body, csrf_in, sign_in},
};

/// One node of 8 GPUs.
const NODES: &str = r#"
[[node]]
name = "n1"
gpu_class = "h100-80gb"
gpus = 8
rack = "r1"
"#;

/// Team prod reserves the node and lends it; team research may borrow all of it.
async fn fleet() -> (TestApp, String, String) {
    // No minimum runtime before preemption, for dry runs as for the control loop.
    let app = TestApp::spawn_with(|c| {
        c.sim_inventory = Some(h100_inventory(NODES));
        c.min_runtime_before_preemption = Duration::ZERO;
    })
    .await;
    start_control(&app).await;
    wait_for_inventory(&app).await;
    let admin = app.admin().await;
    for (team, reserved, burst) in [("prod", 8, 0), ("research", 0, 8)] {
        app.team(&admin, team, None).await;
        app.quota(&admin, team, "h100-80gb", reserved, burst).await;
    }
    let (_, prod) = app.api_token(&admin, "prod", "member").await;
    let (_, research) = app.api_token(&admin, "research", "member").await;
    app.user(&admin, "rhea", None).await;
    app.member(&admin, "research", "rhea", "member").await;
    (app, prod, research)
}

/// The gang's extras, as the team's job list shows them.
async fn extras_of(app: &TestApp, token: &str, gang: &str) -> Vec<Value> {
    let r = app.send(call("GET", "/api/v1/teams/research/jobs?limit=100").token(token)).await;
    r.assert_status(200);
    r.json()["items"].as_array().unwrap().iter().filter(|j| j["extra_of"] == gang).cloned().collect()
}

async fn until_extras(app: &TestApp, token: &str, gang: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let extras = extras_of(app, token, gang).await;
        if done(&extras) {
            return extras;
        }
        assert!(tokio::time::Instant::now() < deadline, "the gang's extras did not get there in time: {extras:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn in_state<'a>(extras: &'a [Value], state: &str) -> Vec<&'a Value> {
    extras.iter().filter(|e| e["state"] == state).collect()
}

/// Research's experiment gang of 2 to 8 one-GPU replicas, submitted on the idle node.
async fn submit_gang(app: &TestApp, research: &str) -> String {
    submit(
        app,
        research,
        "research",
        json!({"name": "elastic-train", "gpu_class": "h100-80gb", "replicas": 2, "max_replicas": 8, "image": "x",
               "priority_class": "experiment", "preemption_grace_seconds": 1,
               "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "30000"}}),
    )
    .await
}

/// The event in which given-back extra `extra` was told to stop.
async fn shrunk_event(app: &TestApp, token: &str, extra: &str) -> Value {
    let events = app.send(call("GET", &format!("/api/v1/jobs/{extra}/events")).token(token)).await.json();
    let events = events["items"].as_array().or(events.as_array()).cloned().unwrap_or_default();
    events.iter().find(|e| e["reason"] == "shrunk").cloned().unwrap_or_else(|| panic!("{events:#?}"))
}

#[tokio::test]
async fn an_elastic_gang_grows_gives_its_extras_back_first_and_is_billed_for_what_each_replica_held() {
    let (app, prod, research) = fleet().await;
    let gang = submit_gang(&app, &research).await;
    let started = wait_for(&app, &research, &gang, Duration::from_secs(30), |j| j["state"] == "running").await;
    assert_eq!((started["replicas"].as_i64(), started["max_replicas"].as_i64()), (Some(2), Some(8)), "{started:#}");
    // It grows into the six free GPUs, each extra a job of its own naming the gang.
    let extras = until_extras(&app, &research, &gang, |e| in_state(e, "running").len() == 6).await;
    assert_eq!(extras.len(), 6, "{extras:#?}");
    for e in &extras {
        assert_eq!((e["replicas"].as_i64(), e["gpus_per_replica"].as_i64()), (Some(1), Some(1)), "{e:#}");
        assert_eq!((e["name"].as_str(), e["priority_class"].as_str()), (Some("elastic-train"), Some("experiment")));
    }
    // The portal says so on the gang's page, and an extra's page links to its gang.
    let cookie = sign_in(&app, "rhea").await;
    let page = body(&app.send(call("GET", &format!("/jobs/{gang}")).header("cookie", &cookie)).await);
    assert!(page.contains("2 to 8 replicas, 8 running now (6 of them extras"), "{page}");
    let extra = extras[0]["id"].as_str().unwrap();
    let page = body(&app.send(call("GET", &format!("/jobs/{extra}")).header("cookie", &cookie)).await);
    assert!(page.contains(&format!(r#"<a href="/jobs/{gang}">elastic gang {gang}</a>"#)), "{page}");
    // Team prod takes back 4 of its reserved GPUs: four extras are given back, the gang runs on.
    let reclaim = submit(
        &app,
        &prod,
        "prod",
        json!({"name": "serving-eval", "gpu_class": "h100-80gb", "gpus_per_replica": 4, "image": "x",
               "priority_class": "production", "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "30000"}}),
    )
    .await;
    wait_for(&app, &prod, &reclaim, Duration::from_secs(30), |j| j["state"] == "running").await;
    let extras = until_extras(&app, &research, &gang, |e| in_state(e, "cancelled").len() == 4).await;
    assert_eq!(in_state(&extras, "running").len(), 2, "{extras:#?}");
    let gang_now = app.send(call("GET", &format!("/api/v1/jobs/{gang}")).token(&research)).await.json();
    assert_eq!((gang_now["state"].as_str(), gang_now["preemptions"].as_i64()), (Some("running"), Some(0)));
    let shrunk = shrunk_event(&app, &research, in_state(&extras, "cancelled")[0]["id"].as_str().unwrap()).await;
    assert!(
        shrunk["message"].as_str().unwrap().contains(&format!("given back by elastic gang {gang} for job {reclaim}")),
        "{shrunk:#}"
    );
    // Cancelling the gang ends the extras it still has.
    app.send(call("POST", &format!("/api/v1/jobs/{gang}/cancel")).token(&research)).await.assert_status(200);
    wait_for(&app, &research, &gang, Duration::from_secs(30), |j| j["finished_at"].is_string()).await;
    let extras = until_extras(&app, &research, &gang, |e| e.iter().all(|x| x["finished_at"].is_string())).await;
    assert!(extras.iter().all(|e| e["state"] == "cancelled"), "{extras:#?}");
    // Every replica's bill is its GPUs for the time it held them, no more, no less.
    let family: Vec<uuid::Uuid> = std::iter::once(gang.as_str())
        .chain(extras.iter().map(|e| e["id"].as_str().unwrap()))
        .map(|id| id.parse().unwrap())
        .collect();
    let held: Vec<(uuid::Uuid, i64, i64)> = sqlx::query_as(
        // Metering counts whole milliseconds, each end truncated to one.
        "select i.job_id, i.gpus::int8 * 1000
                    * (floor(extract(epoch from i.ended_at) * 1000) - floor(extract(epoch from i.started_at) * 1000))::int8,
                coalesce((select sum(l.gpu_milli_ms) from usage_ledger l where l.job_id = i.job_id), 0)::int8
         from usage_intervals i where i.job_id = any($1) order by i.job_id",
    )
    .bind(&family)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(held.len(), 7, "the gang and its six extras each ran: {held:?}");
    for (job, interval, billed) in &held {
        assert!(*interval > 0, "{job} held nothing: {held:?}");
        assert_eq!(interval, billed, "job {job}'s bill differs from what it held");
    }
}

#[tokio::test]
async fn a_job_of_the_gangs_own_team_and_priority_gets_the_extras_it_needs_and_the_gang_runs_on() {
    let (app, _prod, research) = fleet().await;
    let gang = submit_gang(&app, &research).await;
    until_extras(&app, &research, &gang, |e| in_state(e, "running").len() == 6).await;
    // The gang holds all 8 GPUs research may use; research's next experiment does not wait
    // behind that growth. A dry run says so first, naming the gang.
    let sweep = json!({"name": "sweep", "gpu_class": "h100-80gb", "gpus_per_replica": 3, "image": "x",
                       "priority_class": "experiment", "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "30000"}});
    let r = app.send(call("POST", "/api/v1/teams/research/jobs:dry-run").token(&research).json(&sweep)).await;
    r.assert_status(200);
    let dry = r.json();
    assert_eq!((dry["fits_now"].as_bool(), dry["would_preempt"].clone()), (Some(false), json!([])), "{dry:#}");
    assert_eq!(
        dry["would_take_extras"],
        json!([{"team": "research", "gang": gang, "reason": "own_team", "replicas": 3, "gpus": 3}]),
        "{dry:#}"
    );
    // And so does the portal's preview of the same form.
    let cookie = sign_in(&app, "rhea").await;
    let page = body(&app.send(call("GET", "/teams/research/jobs/new").header("cookie", &cookie)).await);
    let form = format!(
        "csrf={}&name=sweep&gpu_class=h100-80gb&replicas=1&gpus_per_replica=3&priority_class=experiment\
         &max_runtime_seconds=3600&image=x&command=",
        csrf_in(&page)
    );
    let preview = app
        .send(
            call("POST", "/teams/research/jobs/preview")
                .header("cookie", &cookie)
                .raw("application/x-www-form-urlencoded", form.into_bytes()),
        )
        .await;
    preview.assert_status(200);
    let fragment = body(&preview);
    assert!(
        fragment.contains(&format!(
            "It would take back:</p><ul><li>3 extra replicas (3 GPUs) of elastic gang {gang}, which runs on (own_team)</li>"
        )),
        "{fragment}"
    );
    let sweep = submit(&app, &research, "research", sweep).await;
    wait_for(&app, &research, &sweep, Duration::from_secs(30), |j| j["state"] == "running").await;
    let extras = until_extras(&app, &research, &gang, |e| in_state(e, "cancelled").len() == 3).await;
    assert_eq!(in_state(&extras, "running").len(), 3, "only the three it needs: {extras:#?}");
    let gang_now = app.send(call("GET", &format!("/api/v1/jobs/{gang}")).token(&research)).await.json();
    assert_eq!((gang_now["state"].as_str(), gang_now["preemptions"].as_i64()), (Some("running"), Some(0)));
    let shrunk = shrunk_event(&app, &research, in_state(&extras, "cancelled")[0]["id"].as_str().unwrap()).await;
    assert!(
        shrunk["message"]
            .as_str()
            .unwrap()
            .contains(&format!("given back by elastic gang {gang} to job {sweep} of its own team research")),
        "{shrunk:#}"
    );
    assert_eq!(shrunk["data"]["rule"], "own_team", "{shrunk:#}");
}

#[tokio::test]
async fn max_replicas_below_replicas_or_above_1024_is_refused_naming_the_field() {
    let (app, _, research) = fleet().await;
    for max in [1, 1025] {
        let body = json!({"name": "x", "gpu_class": "h100-80gb", "replicas": 2, "max_replicas": max, "image": "x"});
        let r = app.send(call("POST", "/api/v1/teams/research/jobs").token(&research).json(&body)).await;
        let doc = r.assert_problem(422, "validation_failed");
        assert_eq!(doc["field"], "max_replicas", "{doc}");
    }
}
