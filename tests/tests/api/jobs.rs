//! The jobs API as a team sees it: submitting one job or a batch, validation that names the
//! field, reading and listing jobs, the queue, cancelling, checkpoints and dry runs. No
//! control loop runs here, so every job stays where the API alone puts it.

use fairway::domain::{GpuClassId, JobId, TeamId};
use fairway_tests::{call, TestApp, TestResponse};
use serde_json::{json, Value};
use uuid::Uuid;

/// Team `ml` with a member (`alice`) and a CI token; team `cv` with a member (`bob`) and a
/// CI token; GPU classes `h100` and `a100`, of which each team has 16 reserved and 16 burst.
/// No cluster reports inventory.
struct Setup {
    app: TestApp,
    admin: String,
    alice: String,
    ml_ci: String,
    ml_ci_id: String,
    bob: String,
    cv_ci: String,
}

async fn setup() -> Setup {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.gpu_class(&admin, "h100").await;
    app.gpu_class(&admin, "a100").await;
    app.team(&admin, "ml", None).await;
    app.team(&admin, "cv", None).await;
    for (team, class) in [("ml", "h100"), ("ml", "a100"), ("cv", "h100"), ("cv", "a100")] {
        app.quota(&admin, team, class, 16, 16).await;
    }
    let alice = app.user(&admin, "alice", None).await;
    app.member(&admin, "ml", "alice", "member").await;
    let bob = app.user(&admin, "bob", None).await;
    app.member(&admin, "cv", "bob", "member").await;
    let (ml_ci_id, ml_ci) = app.api_token(&admin, "ml", "member").await;
    let (_, cv_ci) = app.api_token(&admin, "cv", "member").await;
    Setup { app, admin, alice, ml_ci, ml_ci_id, bob, cv_ci }
}

/// The smallest valid job: one GPU of `h100`.
fn spec(name: &str) -> Value {
    json!({"name": name, "gpu_class": "h100", "image": "registry.example/train:1"})
}

/// `spec(name)` with some fields replaced or added.
fn spec_with(name: &str, changes: Value) -> Value {
    let mut body = spec(name);
    for (key, value) in changes.as_object().expect("changes are an object") {
        body[key] = value.clone();
    }
    body
}

impl Setup {
    async fn submit(&self, token: &str, team: &str, body: &Value) -> TestResponse {
        self.app.send(call("POST", &format!("/api/v1/teams/{team}/jobs")).token(token).json(body)).await
    }

    /// Submits a valid job to `ml` as alice; returns its id.
    async fn submit_ok(&self, body: &Value) -> String {
        let r = self.submit(&self.alice, "ml", body).await;
        r.assert_status(201);
        r.json()["id"].as_str().expect("id").to_owned()
    }

    async fn get(&self, token: &str, path: &str) -> TestResponse {
        self.app.send(call("GET", path).token(token)).await
    }

    async fn post(&self, token: &str, path: &str) -> TestResponse {
        self.app.send(call("POST", path).token(token)).await
    }

    /// Ids of `ml`'s jobs listed with `query`, as one page of up to 200.
    async fn list_ids(&self, query: &str) -> Vec<String> {
        let r = self.get(&self.alice, &format!("/api/v1/teams/ml/jobs?limit=200&{query}")).await;
        r.assert_status(200);
        let page = r.json();
        assert!(page.get("next_cursor").is_none(), "{page}");
        ids(&page["items"])
    }

    async fn job_count(&self) -> i64 {
        sqlx::query_scalar("select count(*) from jobs").fetch_one(&self.app.pool).await.expect("count jobs")
    }
}

fn ids(items: &Value) -> Vec<String> {
    items.as_array().expect("array").iter().map(|j| j["id"].as_str().expect("id").to_owned()).collect()
}

/// Asserts a 422 whose first failing field and code are these.
#[track_caller]
fn assert_field(r: &TestResponse, field: &str, code: &str) {
    let doc = r.assert_problem(422, "validation_failed");
    assert_eq!((doc["field"].as_str(), doc["errors"][0]["code"].as_str()), (Some(field), Some(code)), "{doc}");
}

/// Reports one cluster with two 8-GPU `h100` nodes in different racks, as an inventory
/// sync would.
async fn two_nodes_of_eight(app: &TestApp) {
    nodes_of_eight(app, &[("sim-1", "node-1", "rack-1"), ("sim-1", "node-2", "rack-2")]).await;
}

/// H100 nodes of 8 GPUs, each `(cluster, node, rack)`, written as an inventory sync writes
/// them: the nodes and, from them, the per-class capacity submissions are validated against.
async fn nodes_of_eight(app: &TestApp, nodes: &[(&str, &str, &str)]) {
    let mut tx = app.pool.begin().await.expect("begin");
    let class = fairway::db::gpu_classes::by_name(&mut *tx, "h100").await.expect("read class").expect("h100");
    let clusters: std::collections::BTreeSet<&str> = nodes.iter().map(|n| n.0).collect();
    for name in clusters {
        let cluster = fairway::db::inventory::ensure_cluster(&mut tx, name, "sim").await.expect("cluster");
        let rows: Vec<_> = nodes
            .iter()
            .filter(|n| n.0 == name)
            .map(|&(_, node, rack)| fairway::db::inventory::NodeRow {
                cluster_id: cluster,
                cluster: name.into(),
                name: node.into(),
                gpu_class_id: class.id,
                gpus: 8,
                nvlink_domain_size: 0,
                rack: Some(rack.into()),
                zone: Some("zone-1".into()),
                elastic: false,
                spot: false,
                price_micros_per_gpu_hour: None,
                driver_version: None,
                cuda_version: None,
                cpu_millis: None,
                memory_mib: None,
            })
            .collect();
        fairway::db::inventory::replace_nodes(&mut tx, cluster, &rows).await.expect("nodes");
    }
    tx.commit().await.expect("commit");
}

#[tokio::test]
async fn a_ci_token_submits_a_job_and_reads_it_back_pending_with_its_fields() {
    let s = setup().await;
    let body = json!({
        "name": "llama fine-tune",
        "gpu_class": "h100",
        "replicas": 2,
        "gpus_per_replica": 4,
        "priority_class": "production",
        "max_runtime_seconds": 3600,
        "image": "registry.example/train:1",
        "command": ["python", "train.py", "--epochs", "3"],
        "env": {"EPOCHS": "3"},
        "labels": {"project": "llm"},
        "topology": {"level": "node", "mode": "preferred"},
        "preemption_grace_seconds": 60,
        "preemption_delay_seconds": 120,
        "max_retries": 2
    });
    let created = s.submit(&s.ml_ci, "ml", &body).await;
    created.assert_status(201);
    assert_eq!(created.header("etag").as_deref(), Some("\"1\""));
    let job = created.json();
    let id = job["id"].as_str().unwrap().to_owned();
    let read = s.get(&s.ml_ci, &format!("/api/v1/jobs/{id}")).await;
    read.assert_status(200);
    assert_eq!(read.json(), job, "reading the job shows what the submission answered");
    for (field, value) in [
        ("team", json!("ml")),
        ("name", json!("llama fine-tune")),
        ("gpu_class", json!("h100")),
        ("priority_class", json!("production")),
        ("replicas", json!(2)),
        ("gpus_per_replica", json!(4)),
        ("max_runtime_seconds", json!(3600)),
        ("image", json!("registry.example/train:1")),
        ("command", json!(["python", "train.py", "--epochs", "3"])),
        ("env", json!({"EPOCHS": "3"})),
        ("labels", json!({"project": "llm"})),
        ("topology", json!({"level": "node", "mode": "preferred"})),
        ("preemption_grace_seconds", json!(60)),
        ("preemption_delay_seconds", json!(120)),
        ("max_retries", json!(2)),
        ("state", json!("pending")),
        ("attempt", json!(0)),
        ("cluster", Value::Null),
        ("placement", Value::Null),
        ("borrowing", json!(false)),
        // No scheduling cycle has looked at it yet.
        (
            "pending",
            json!({"reason": null, "message": null, "position": null, "expected_start_at": null, "figures": null,
                   "earliest_start_at": null, "latest_start_at": null}),
        ),
        ("exit_code", Value::Null),
        ("preemptions", json!(0)),
        ("submitted_by", json!(format!("token:ml/ci ({})", s.ml_ci_id))),
        ("admitted_at", Value::Null),
        ("started_at", Value::Null),
        ("finished_at", Value::Null),
        ("version", json!(1)),
    ] {
        assert_eq!(job[field], value, "{field} in {job}");
    }
}

#[tokio::test]
async fn a_job_that_names_only_what_it_must_gets_the_defaults() {
    let s = setup().await;
    let r = s.submit(&s.alice, "ml", &spec("minimal")).await;
    r.assert_status(201);
    let job = r.json();
    for (field, value) in [
        ("replicas", json!(1)),
        ("gpus_per_replica", json!(1)),
        ("priority_class", json!("experiment")),
        ("max_runtime_seconds", json!(86_400)),
        ("command", json!([])),
        ("env", json!({})),
        ("labels", json!({})),
        ("topology", Value::Null),
        ("preemption_grace_seconds", Value::Null),
        ("preemption_delay_seconds", Value::Null),
        ("max_retries", json!(0)),
        ("submitted_by", json!("user:alice")),
    ] {
        assert_eq!(job[field], value, "{field} in {job}");
    }
}

#[tokio::test]
async fn repeating_a_submission_with_the_same_idempotency_key_returns_the_same_job_and_creates_one() {
    let s = setup().await;
    let send = |key: &'static str| {
        s.app.send(
            call("POST", "/api/v1/teams/ml/jobs").token(&s.ml_ci).header("idempotency-key", key).json(&spec("once")),
        )
    };
    let first = send("submit-1").await;
    first.assert_status(201);
    let again = send("submit-1").await;
    again.assert_status(201);
    assert_eq!(again.header("idempotent-replayed").as_deref(), Some("true"));
    assert_eq!(again.json()["id"], first.json()["id"]);
    assert_eq!(s.job_count().await, 1);
    // Another key is another submission.
    let other = send("submit-2").await;
    other.assert_status(201);
    assert_ne!(other.json()["id"], first.json()["id"]);
    assert_eq!(s.job_count().await, 2);
}

#[tokio::test]
async fn an_invalid_job_is_refused_naming_the_field_and_nothing_is_queued() {
    let s = setup().await;
    for (changes, field, code) in [
        (json!({"gpu_class": "b200"}), "gpu_class", "not_found"),
        (json!({"priority_class": "urgent"}), "priority_class", "not_found"),
        // Teams may run jobs for at most a week unless a platform admin allows more.
        (json!({"max_runtime_seconds": 604_801}), "max_runtime_seconds", "exceeds_team_limit"),
        (json!({"max_runtime_seconds": 0}), "max_runtime_seconds", "too_small"),
        (json!({"env": {"FAIRWAY_JOB_ID": "mine"}}), "env.FAIRWAY_JOB_ID", "reserved"),
        (json!({"colour": "red"}), "colour", "unknown_field"),
        (json!({"replicas": 0}), "replicas", "too_small"),
        (json!({"gpus_per_replica": 65}), "gpus_per_replica", "too_large"),
        (json!({"name": "  "}), "name", "empty"),
        (json!({"image": "train 1"}), "image", "invalid_characters"),
    ] {
        let r = s.submit(&s.alice, "ml", &spec_with("bad", changes.clone())).await;
        let doc = r.assert_problem(422, "validation_failed");
        assert_eq!((doc["field"].as_str(), doc["errors"][0]["code"].as_str()), (Some(field), Some(code)), "{changes}");
    }
    assert_eq!(s.job_count().await, 0);
    // The limit itself is allowed.
    s.submit(&s.alice, "ml", &spec_with("a week", json!({"max_runtime_seconds": 604_800}))).await.assert_status(201);
}

#[tokio::test]
async fn a_job_that_declares_its_expected_runtime_reads_it_back_and_one_that_does_not_reads_null() {
    let s = setup().await;
    let declared = spec_with("declared", json!({"max_runtime_seconds": 3600, "expected_runtime_seconds": 1800}));
    let created = s.submit(&s.alice, "ml", &declared).await;
    created.assert_status(201);
    assert_eq!(created.json()["expected_runtime_seconds"], 1800, "{}", created.json());
    let id = created.json()["id"].as_str().unwrap().to_owned();
    let read = s.get(&s.alice, &format!("/api/v1/jobs/{id}")).await;
    read.assert_status(200);
    assert_eq!(read.json()["expected_runtime_seconds"], 1800);
    // Its maximum itself is allowed.
    let whole =
        s.submit_ok(&spec_with("whole", json!({"max_runtime_seconds": 600, "expected_runtime_seconds": 600}))).await;
    let undeclared = s.submit_ok(&spec("undeclared")).await;
    let r = s.get(&s.alice, "/api/v1/teams/ml/jobs?limit=10").await;
    r.assert_status(200);
    let listed: Vec<(String, Value)> = r.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| (j["id"].as_str().unwrap().to_owned(), j["expected_runtime_seconds"].clone()))
        .collect();
    assert_eq!(listed, [(undeclared, Value::Null), (whole, json!(600)), (id, json!(1800))]);
}

#[tokio::test]
async fn an_expected_runtime_of_nothing_or_longer_than_the_maximum_runtime_is_refused_naming_the_field() {
    let s = setup().await;
    for (changes, code) in [
        (json!({"expected_runtime_seconds": 0}), "too_small"),
        (json!({"expected_runtime_seconds": -60}), "too_small"),
        (json!({"max_runtime_seconds": 3600, "expected_runtime_seconds": 3601}), "exceeds_max_runtime"),
        // With no maximum named, the default one (a day) bounds it.
        (json!({"expected_runtime_seconds": 86_401}), "exceeds_max_runtime"),
    ] {
        let r = s.submit(&s.alice, "ml", &spec_with("bad", changes.clone())).await;
        let doc = r.assert_problem(422, "validation_failed");
        assert_eq!(
            (doc["field"].as_str(), doc["errors"][0]["code"].as_str()),
            (Some("expected_runtime_seconds"), Some(code)),
            "{changes}: {doc}"
        );
        // A dry run of it is refused alike.
        let r = s
            .app
            .send(
                call("POST", "/api/v1/teams/ml/jobs:dry-run").token(&s.alice).json(&spec_with("bad", changes.clone())),
            )
            .await;
        assert_field(&r, "expected_runtime_seconds", code);
    }
    // In a batch, the job is named.
    let batch = json!({"jobs": [spec("fine"), spec_with("bad", json!({"max_runtime_seconds": 60, "expected_runtime_seconds": 61}))]});
    let r = s.app.send(call("POST", "/api/v1/teams/ml/jobs:batch").token(&s.alice).json(&batch)).await;
    assert_field(&r, "jobs[1].expected_runtime_seconds", "exceeds_max_runtime");
    assert_eq!(s.job_count().await, 0);
}

#[tokio::test]
async fn a_job_more_than_any_placement_could_ever_give_is_refused_at_submission() {
    let s = setup().await;
    two_nodes_of_eight(&s.app).await;
    for (changes, field) in [
        // A replica must fit on one node.
        (json!({"gpus_per_replica": 16}), "gpus_per_replica"),
        // 24 GPUs, and all clusters together have 16.
        (json!({"replicas": 3, "gpus_per_replica": 8}), "replicas"),
        // 16 GPUs fit in the fleet, but not within one node.
        (json!({"replicas": 2, "gpus_per_replica": 8, "topology": {"level": "node", "mode": "required"}}), "topology"),
        (json!({"replicas": 2, "gpus_per_replica": 8, "topology": {"level": "rack", "mode": "required"}}), "topology"),
    ] {
        let r = s.submit(&s.alice, "ml", &spec_with("huge", changes.clone())).await;
        let doc = r.assert_problem(422, "validation_failed");
        assert_eq!(
            (doc["field"].as_str(), doc["errors"][0]["code"].as_str()),
            (Some(field), Some("never_fits")),
            "{changes}"
        );
    }
    // A class no cluster offers, once clusters report what they have.
    let r = s.submit(&s.alice, "ml", &spec_with("elsewhere", json!({"gpu_class": "a100"}))).await;
    assert_field(&r, "gpu_class", "no_capacity");
    assert_eq!(s.job_count().await, 0);
    // What the fleet can give is accepted: the whole fleet, or a whole node kept within it.
    for changes in [
        json!({"replicas": 2, "gpus_per_replica": 8}),
        json!({"replicas": 2, "gpus_per_replica": 8, "topology": {"level": "zone", "mode": "required"}}),
        json!({"replicas": 2, "gpus_per_replica": 8, "topology": {"level": "node", "mode": "preferred"}}),
        json!({"replicas": 1, "gpus_per_replica": 8, "topology": {"level": "node", "mode": "required"}}),
    ] {
        s.submit(&s.alice, "ml", &spec_with("fits", changes)).await.assert_status(201);
    }
    assert_eq!(s.job_count().await, 4);
}

#[tokio::test]
async fn a_gang_larger_than_any_one_cluster_is_refused_though_all_clusters_together_hold_it() {
    let s = setup().await;
    nodes_of_eight(&s.app, &[("east", "node-1", "rack-1"), ("west", "node-1", "rack-1")]).await;
    let r = s.submit(&s.alice, "ml", &spec_with("both", json!({"replicas": 2, "gpus_per_replica": 8}))).await;
    assert_field(&r, "replicas", "never_fits");
    let message = r.json()["errors"][0]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("needs 16 GPUs and runs within one cluster, and the largest has 8"), "{message}");
    assert_eq!(s.job_count().await, 0);
    // One cluster's worth is accepted, and so are two jobs of it.
    for name in ["east-sized", "west-sized"] {
        s.submit(&s.alice, "ml", &spec_with(name, json!({"replicas": 1, "gpus_per_replica": 8})))
            .await
            .assert_status(201);
    }
    assert_eq!(s.job_count().await, 2);
}

#[tokio::test]
async fn a_job_larger_than_its_teams_quota_is_refused_with_the_limit_and_the_numbers() {
    let s = setup().await;
    s.app.quota(&s.admin, "ml", "h100", 2, 2).await;
    let r = s.submit(&s.ml_ci, "ml", &spec_with("too-big", json!({"replicas": 3, "gpus_per_replica": 2}))).await;
    assert_field(&r, "replicas", "exceeds_quota");
    let message = r.json()["errors"][0]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("needs 6 GPUs of h100"), "{message}");
    assert!(message.contains("team ml may hold at most 4 (2 reserved + 2 burst)"), "{message}");
    // Exactly the limit is accepted: it can run once the team's other jobs have ended.
    s.submit(&s.ml_ci, "ml", &spec_with("at-limit", json!({"replicas": 2, "gpus_per_replica": 2})))
        .await
        .assert_status(201);
    assert_eq!(s.job_count().await, 1);
}

#[tokio::test]
async fn a_job_of_a_class_its_team_has_no_quota_for_is_refused_naming_the_class() {
    let s = setup().await;
    s.app.gpu_class(&s.admin, "l4").await;
    let r = s.submit(&s.alice, "ml", &spec_with("no-quota", json!({"gpu_class": "l4"}))).await;
    assert_field(&r, "gpu_class", "no_quota");
    let message = r.json()["errors"][0]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("team ml has no quota for GPU class l4"), "{message}");
    assert_eq!(s.job_count().await, 0);
}

#[tokio::test]
async fn a_job_larger_than_its_departments_quota_is_refused_naming_the_department() {
    let s = setup().await;
    s.app.team(&s.admin, "vision", Some("cv")).await;
    s.app.member(&s.admin, "vision", "bob", "member").await;
    s.app.quota(&s.admin, "cv", "h100", 4, 0).await;
    s.app.quota(&s.admin, "vision", "h100", 4, 8).await;
    let r = s.submit(&s.bob, "vision", &spec_with("wide", json!({"replicas": 6}))).await;
    assert_field(&r, "replicas", "exceeds_quota");
    let message = r.json()["errors"][0]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("team vision's department cv may hold at most 4 (4 reserved + 0 burst)"), "{message}");
}

#[tokio::test]
async fn a_job_that_cannot_be_preempted_must_fit_the_reserved_quota_and_is_refused_naming_the_priority_class() {
    let s = setup().await;
    s.app.quota(&s.admin, "ml", "h100", 2, 6).await;
    let production = |replicas: i64| spec_with("prod", json!({"priority_class": "production", "replicas": replicas}));
    let r = s.submit(&s.alice, "ml", &production(3)).await;
    assert_field(&r, "priority_class", "exceeds_reserved_quota");
    let message = r.json()["errors"][0]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("needs 3 GPUs of h100 and team ml has 2 reserved"), "{message}");
    // A preemptible job of the same size may borrow, so it is accepted.
    s.submit(&s.alice, "ml", &spec_with("exp", json!({"replicas": 3}))).await.assert_status(201);
    s.submit(&s.alice, "ml", &production(2)).await.assert_status(201);
}

#[tokio::test]
async fn a_job_no_hard_budget_could_ever_cover_is_refused_with_the_numbers_and_one_a_budget_holds_back_is_accepted_with_a_warning(
) {
    let s = setup().await;
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    let budget = |unit: &str, amount: i64, enforcement: &str| {
        call("PUT", &format!("/api/v1/teams/ml/budgets/{month}"))
            .token(&s.admin)
            .json(&json!({"unit": unit, "amount": amount, "enforcement": enforcement}))
    };
    s.app.send(budget("money", 10_000_000, "hard")).await.assert_status(200);
    // One H100 at 2.50 USD per GPU-hour, as an experiment (0.8×): 2.00 USD an hour at most.
    let hours = |name: &str, hours: i64, wait: bool| {
        spec_with(
            name,
            json!({"priority_class": "experiment", "max_runtime_seconds": hours * 3600, "wait_for_quota": wait}),
        )
    };
    let r = s.submit(&s.ml_ci, "ml", &hours("ten-hours", 10, false)).await;
    assert_field(&r, "max_runtime_seconds", "exceeds_budget");
    let message = r.json()["errors"][0]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("may cost up to 20.00 USD"), "{message}");
    assert!(message.contains("team ml's hard budget of 10.00 USD for this month"), "{message}");
    assert_eq!(s.job_count().await, 0);
    // Exactly the budget fits: it can start.
    let r = s.submit(&s.ml_ci, "ml", &hours("five-hours", 5, false)).await;
    r.assert_status(201);
    assert!(r.json().get("warnings").is_none(), "{}", r.json());
    // Asked to wait for a change, it is accepted, with the refusal as a warning.
    let r = s.submit(&s.ml_ci, "ml", &hours("ten-hours", 10, true)).await;
    r.assert_status(201);
    assert_eq!(r.json()["warnings"][0]["code"], "exceeds_budget", "{}", r.json());
    // Its timeline keeps what it was accepted despite, for the job page and the API alike.
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let events = s.get(&s.ml_ci, &format!("/api/v1/jobs/{id}/events")).await.json();
    let submitted = events[0]["message"].as_str().unwrap_or_default().to_owned();
    assert!(submitted.contains("accepted despite: the job may cost up to 20.00 USD"), "{events}");
    // In a batch the refused job is named by its index, and nothing is stored.
    let batch = json!({"jobs": [hours("ok", 1, false), hours("long", 100, false)]});
    let r = s.app.send(call("POST", "/api/v1/teams/ml/jobs:batch").token(&s.ml_ci).json(&batch)).await;
    assert_field(&r, "jobs[1].max_runtime_seconds", "exceeds_budget");
    assert_eq!(s.job_count().await, 2);
    // A soft budget the job would exceed lets it in, and says so.
    s.app.send(budget("money", 5_000_000, "soft")).await.assert_status(200);
    let r = s.submit(&s.ml_ci, "ml", &hours("over-soft", 5, false)).await;
    r.assert_status(201);
    let warning = &r.json()["warnings"][0];
    assert_eq!(
        (warning["code"].as_str(), warning["field"].as_str()),
        (Some("exceeds_soft_budget"), Some("max_runtime_seconds"))
    );
    assert!(warning["message"].as_str().unwrap().contains("soft budget has 5.00 USD left this month"), "{warning}");
    // A GPU-hour budget is held to the job's GPU time.
    s.app.send(budget("gpu-hours", 2, "hard")).await.assert_status(200);
    let r = s.submit(&s.ml_ci, "ml", &hours("three-hours", 3, false)).await;
    assert_field(&r, "max_runtime_seconds", "exceeds_budget");
    let message = r.json()["errors"][0]["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("may use up to 3.00 GPU-hours") && message.contains("hard budget of 2.00 GPU-hours"),
        "{message}"
    );
}

#[tokio::test]
async fn a_job_that_asks_to_wait_for_a_quota_change_is_accepted_with_a_warning_and_a_raised_quota_lets_jobs_in() {
    let s = setup().await;
    s.app.quota(&s.admin, "ml", "h100", 1, 1).await;
    let big = |wait: bool| spec_with("big", json!({"replicas": 4, "wait_for_quota": wait}));
    // The CI token's catalogue is cached from this submission on.
    assert_field(&s.submit(&s.ml_ci, "ml", &big(false)).await, "replicas", "exceeds_quota");
    let r = s.submit(&s.ml_ci, "ml", &big(true)).await;
    r.assert_status(201);
    let warnings = r.json()["warnings"].clone();
    assert_eq!(warnings[0]["code"], "exceeds_quota", "{warnings}");
    assert_eq!(warnings[0]["field"], "replicas", "{warnings}");
    assert_eq!(warnings.as_array().unwrap().len(), 1, "{warnings}");
    // Reading the job back carries no warnings: they belong to the answer to the submission.
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let read = s.get(&s.ml_ci, &format!("/api/v1/jobs/{id}")).await;
    assert!(read.json().get("warnings").is_none(), "{}", read.json());
    // A quota change reaches the very next submission through the same cached token.
    s.app.quota(&s.admin, "ml", "h100", 2, 2).await;
    let r = s.submit(&s.ml_ci, "ml", &big(false)).await;
    r.assert_status(201);
    assert!(r.json().get("warnings").is_none(), "{}", r.json());
    // In a batch, the refused job is named by its index and nothing is stored.
    let batch = json!({"jobs": [spec("ok-0"), spec_with("huge-1", json!({"replicas": 5}))]});
    let r = s.app.send(call("POST", "/api/v1/teams/ml/jobs:batch").token(&s.ml_ci).json(&batch)).await;
    assert_field(&r, "jobs[1].replicas", "exceeds_quota");
    assert_eq!(s.job_count().await, 2);
    let batch = json!({"jobs": [spec("ok-0"), spec_with("huge-1", json!({"replicas": 5, "wait_for_quota": true}))]});
    let r = s.app.send(call("POST", "/api/v1/teams/ml/jobs:batch").token(&s.ml_ci).json(&batch)).await;
    r.assert_status(201);
    let jobs = r.json()["jobs"].clone();
    assert!(jobs[0].get("warnings").is_none(), "{jobs}");
    assert_eq!(jobs[1]["warnings"][0]["field"], "jobs[1].replicas", "{jobs}");
    assert_eq!(s.job_count().await, 4);
}

#[tokio::test]
async fn a_batch_of_three_jobs_is_submitted_together() {
    let s = setup().await;
    let batch = json!({"jobs": [spec("sweep-1"), spec("sweep-2"), spec("sweep-3")]});
    let r = s.app.send(call("POST", "/api/v1/teams/ml/jobs:batch").token(&s.ml_ci).json(&batch)).await;
    r.assert_status(201);
    let result = r.json();
    assert_eq!(result["count"], 3);
    let names: Vec<&str> = result["jobs"].as_array().unwrap().iter().map(|j| j["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["sweep-1", "sweep-2", "sweep-3"], "in request order");
    assert!(result["jobs"].as_array().unwrap().iter().all(|j| j["state"] == "pending"), "{result}");
    let mut submitted = ids(&result["jobs"]);
    let mut listed = s.list_ids("").await;
    submitted.sort();
    listed.sort();
    assert_eq!(listed, submitted);
}

#[tokio::test]
async fn a_batch_with_one_invalid_job_names_it_and_submits_none() {
    let s = setup().await;
    let batch =
        json!({"jobs": [spec("ok-0"), spec("ok-1"), spec_with("bad-2", json!({"gpu_class": "b200"})), spec("ok-3")]});
    let r = s.app.send(call("POST", "/api/v1/teams/ml/jobs:batch").token(&s.alice).json(&batch)).await;
    assert_field(&r, "jobs[2].gpu_class", "not_found");
    assert_eq!(r.json()["errors"].as_array().unwrap().len(), 1, "only job 2 is wrong");
    assert_eq!(s.list_ids("").await, Vec::<String>::new());
    assert_eq!(s.job_count().await, 0);
    // Every invalid field of every job is reported.
    let batch = json!({"jobs": [spec_with("bad-0", json!({"replicas": 0})), spec("ok-1"), spec_with("bad-2", json!({"priority_class": "urgent"}))]});
    let r = s.app.send(call("POST", "/api/v1/teams/ml/jobs:batch").token(&s.alice).json(&batch)).await;
    let doc = r.assert_problem(422, "validation_failed");
    let fields: Vec<&str> = doc["errors"].as_array().unwrap().iter().map(|e| e["field"].as_str().unwrap()).collect();
    assert_eq!(fields, ["jobs[0].replicas", "jobs[2].priority_class"]);
    assert_eq!(s.job_count().await, 0);
}

#[tokio::test]
async fn a_batch_holds_1_to_1000_jobs() {
    let s = setup().await;
    let send = |n: usize| {
        let batch = json!({"jobs": (0..n).map(|i| spec(&format!("job-{i}"))).collect::<Vec<_>>()});
        s.app.send(call("POST", "/api/v1/teams/ml/jobs:batch").token(&s.alice).json(&batch))
    };
    assert_field(&send(1001).await, "jobs", "too_many");
    assert_field(&send(0).await, "jobs", "too_few");
    assert_eq!(s.job_count().await, 0);
    let r = send(1000).await;
    r.assert_status(201);
    assert_eq!(r.json()["count"], 1000);
    assert_eq!(s.job_count().await, 1000);
}

#[tokio::test]
async fn the_job_list_filters_by_state_gpu_class_and_labels() {
    let s = setup().await;
    let a = s.submit_ok(&spec_with("a", json!({"labels": {"project": "llm"}}))).await;
    let b = s.submit_ok(&spec_with("b", json!({"gpu_class": "a100", "labels": {"project": "vision"}}))).await;
    let c = s.submit_ok(&spec_with("c", json!({"labels": {"project": "llm", "owner": "alice"}}))).await;
    s.post(&s.alice, &format!("/api/v1/jobs/{b}/cancel")).await.assert_status(200);
    // Another team's job never shows.
    s.submit(&s.bob, "cv", &spec_with("theirs", json!({"labels": {"project": "llm"}}))).await.assert_status(201);

    assert_eq!(s.list_ids("").await, [c.as_str(), b.as_str(), a.as_str()]);
    assert_eq!(s.list_ids("state=pending").await, [c.as_str(), a.as_str()]);
    assert_eq!(s.list_ids("state=cancelled").await, [b.as_str()]);
    assert_eq!(s.list_ids("state=running").await, Vec::<String>::new());
    assert_eq!(s.list_ids("gpu_class=a100").await, [b.as_str()]);
    assert_eq!(s.list_ids("gpu_class=h100").await, [c.as_str(), a.as_str()]);
    assert_eq!(s.list_ids("label=project=llm").await, [c.as_str(), a.as_str()]);
    assert_eq!(s.list_ids("label=project=llm,owner=alice").await, [c.as_str()]);
    assert_eq!(s.list_ids("label=project=audio").await, Vec::<String>::new());
    assert_eq!(s.list_ids("state=pending&gpu_class=a100").await, Vec::<String>::new());
}

#[tokio::test]
async fn paging_through_the_job_list_returns_every_job_exactly_once_newest_first() {
    let s = setup().await;
    let mut submitted = Vec::new();
    for i in 0..7 {
        submitted.push(s.submit_ok(&spec(&format!("job-{i}"))).await);
    }
    let mut seen = Vec::new();
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            None => "/api/v1/teams/ml/jobs?limit=3".to_owned(),
            Some(c) => format!("/api/v1/teams/ml/jobs?limit=3&cursor={c}"),
        };
        let r = s.get(&s.alice, &path).await;
        r.assert_status(200);
        let page = r.json();
        let items = ids(&page["items"]);
        pages.push(items.len());
        seen.extend(items);
        match page.get("next_cursor") {
            Some(c) => cursor = Some(c.as_str().unwrap().to_owned()),
            None => break,
        }
        assert!(pages.len() < 10, "paging does not end");
    }
    assert_eq!(pages, [3, 3, 1]);
    submitted.reverse();
    assert_eq!(seen, submitted);
}

#[tokio::test]
async fn listing_jobs_by_an_unknown_state_is_422_naming_state() {
    let s = setup().await;
    let r = s.get(&s.alice, "/api/v1/teams/ml/jobs?state=bogus").await;
    assert_field(&r, "state", "invalid_value");
    let r = s.get(&s.alice, "/api/v1/teams/ml/jobs?label=project").await;
    assert_field(&r, "label", "invalid_value");
}

#[tokio::test]
async fn another_teams_callers_get_404_for_a_job_its_events_cancel_and_checkpoint() {
    let s = setup().await;
    let id = s.submit_ok(&spec("private")).await;
    for token in [&s.bob, &s.cv_ci] {
        s.get(token, &format!("/api/v1/jobs/{id}")).await.assert_problem(404, "not_found");
        s.get(token, &format!("/api/v1/jobs/{id}/events")).await.assert_problem(404, "not_found");
        s.post(token, &format!("/api/v1/jobs/{id}/cancel")).await.assert_problem(404, "not_found");
        let r = s.app.send(call("POST", &format!("/api/v1/jobs/{id}/checkpoint")).token(token).json(&json!({}))).await;
        r.assert_problem(404, "not_found");
        s.get(token, "/api/v1/teams/ml/jobs").await.assert_problem(404, "not_found");
        s.get(token, "/api/v1/teams/ml/queue").await.assert_problem(404, "not_found");
        s.submit(token, "ml", &spec("intruder")).await.assert_problem(404, "not_found");
    }
    // The attempts changed nothing.
    let job = s.get(&s.alice, &format!("/api/v1/jobs/{id}")).await.json();
    assert_eq!((job["state"].as_str(), job["version"].as_i64()), (Some("pending"), Some(1)));
    assert_eq!(s.job_count().await, 1);
}

#[tokio::test]
async fn a_job_that_does_not_exist_or_a_malformed_id_is_404() {
    let s = setup().await;
    for id in [Uuid::new_v4().to_string(), "not-a-uuid".to_owned()] {
        s.get(&s.admin, &format!("/api/v1/jobs/{id}")).await.assert_problem(404, "not_found");
        s.get(&s.admin, &format!("/api/v1/jobs/{id}/events")).await.assert_problem(404, "not_found");
        s.post(&s.admin, &format!("/api/v1/jobs/{id}/cancel")).await.assert_problem(404, "not_found");
        s.get(&s.alice, &format!("/api/v1/jobs/{id}")).await.assert_problem(404, "not_found");
    }
}

#[tokio::test]
async fn cancelling_a_pending_job_cancels_it_at_once_and_again_is_harmless() {
    let s = setup().await;
    let id = s.submit_ok(&spec("doomed")).await;
    let other = s.submit_ok(&spec("survivor")).await;
    let r = s.post(&s.ml_ci, &format!("/api/v1/jobs/{id}/cancel")).await;
    r.assert_status(200);
    assert_eq!(r.header("etag").as_deref(), Some("\"2\""));
    let job = r.json();
    assert_eq!(job["state"], "cancelled");
    assert_eq!(job["pending"], Value::Null);
    assert_eq!(job["version"], 2);
    assert!(job["finished_at"].is_string(), "{job}");
    assert_eq!(job["stop_requested_at"], Value::Null, "nothing ran, so nothing is asked to stop");

    let events = s.get(&s.alice, &format!("/api/v1/jobs/{id}/events")).await;
    events.assert_status(200);
    let timeline: Vec<(String, i64)> = events
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["kind"].as_str().unwrap().to_owned(), e["attempt"].as_i64().unwrap()))
        .collect();
    assert_eq!(timeline, [("submitted".to_owned(), 0), ("cancelled".to_owned(), 0)]);

    // Again: the same answer, and nothing new happens.
    let again = s.post(&s.alice, &format!("/api/v1/jobs/{id}/cancel")).await;
    again.assert_status(200);
    assert_eq!(again.json(), job);
    let events = s.get(&s.alice, &format!("/api/v1/jobs/{id}/events")).await.json();
    assert_eq!(events.as_array().unwrap().len(), 2, "{events}");

    let queue = s.get(&s.alice, "/api/v1/teams/ml/queue").await;
    queue.assert_status(200);
    assert_eq!(ids(&queue.json()), [other]);
}

#[tokio::test]
async fn reporting_a_checkpoint_of_a_job_that_is_not_running_is_409() {
    let s = setup().await;
    let id = s.submit_ok(&spec("waiting")).await;
    let r = s
        .app
        .send(call("POST", &format!("/api/v1/jobs/{id}/checkpoint")).token(&s.ml_ci).json(&json!({"step": 1200})))
        .await;
    let doc = r.assert_problem(409, "job_not_running");
    assert_eq!(doc["detail"], "the job is pending");
    let job = s.get(&s.alice, &format!("/api/v1/jobs/{id}")).await.json();
    assert_eq!((job["last_checkpoint_at"].clone(), job["version"].clone()), (Value::Null, json!(1)));
    let events = s.get(&s.alice, &format!("/api/v1/jobs/{id}/events")).await.json();
    assert_eq!(events.as_array().unwrap().len(), 1, "only the submission: {events}");
}

#[tokio::test]
async fn the_queue_lists_the_teams_pending_jobs_only() {
    let s = setup().await;
    let first = s.submit_ok(&spec_with("first", json!({"replicas": 2, "gpus_per_replica": 4}))).await;
    let cancelled = s.submit_ok(&spec("cancelled")).await;
    let third = s.submit_ok(&spec_with("third", json!({"gpu_class": "a100", "priority_class": "production"}))).await;
    s.post(&s.alice, &format!("/api/v1/jobs/{cancelled}/cancel")).await.assert_status(200);
    let theirs = s.submit(&s.bob, "cv", &spec("theirs")).await.json()["id"].as_str().unwrap().to_owned();

    let r = s.get(&s.ml_ci, "/api/v1/teams/ml/queue").await;
    r.assert_status(200);
    let queue = r.json();
    assert_eq!(ids(&queue), [first.as_str(), third.as_str()], "submission order while no cycle has ranked them");
    let entry = &queue[0];
    for (field, value) in [
        ("name", json!("first")),
        ("gpu_class", json!("h100")),
        ("priority_class", json!("experiment")),
        ("gpus", json!(8)),
        ("position", Value::Null),
        ("reason", Value::Null),
    ] {
        assert_eq!(entry[field], value, "{field} in {entry}");
    }
    assert_eq!((queue[1]["gpu_class"].as_str(), queue[1]["gpus"].as_i64()), (Some("a100"), Some(1)));

    let r = s.get(&s.bob, "/api/v1/teams/cv/queue").await;
    r.assert_status(200);
    assert_eq!(ids(&r.json()), [theirs]);
}

#[tokio::test]
async fn a_dry_run_with_no_inventory_says_the_job_would_not_fit_and_writes_nothing() {
    let s = setup().await;
    s.submit_ok(&spec("already queued")).await;
    let r = s.app.send(call("POST", "/api/v1/teams/ml/jobs:dry-run").token(&s.ml_ci).json(&spec("what if"))).await;
    r.assert_status(200);
    let answer = r.json();
    assert_eq!(answer["fits_now"], false);
    assert_eq!(answer["reason"], "never_fits");
    assert!(answer["message"].is_string(), "{answer}");
    assert_eq!((answer["placement"].clone(), answer["cluster"].clone()), (Value::Null, Value::Null));
    assert_eq!(answer["would_preempt"], json!([]));
    // One GPU at 2.50 an hour for the default day, at the experiment class's 0.8 multiplier.
    assert_eq!((answer["max_cost_micros"].as_i64(), answer["currency"].as_str()), (Some(48_000_000), Some("USD")));
    assert_eq!(s.job_count().await, 1);
    let events: i64 =
        sqlx::query_scalar("select count(*) from job_events").fetch_one(&s.app.pool).await.expect("count events");
    assert_eq!(events, 1);
    // It validates like a submission.
    let r = s
        .app
        .send(
            call("POST", "/api/v1/teams/ml/jobs:dry-run")
                .token(&s.ml_ci)
                .json(&spec_with("what if", json!({"gpu_class": "b200"}))),
        )
        .await;
    assert_field(&r, "gpu_class", "not_found");
}

#[tokio::test]
async fn a_job_without_a_runtime_gets_the_teams_limit_when_that_is_under_a_day() {
    let s = setup().await;
    // The team's limit has no API yet; a platform admin sets it in the database.
    sqlx::query("update teams set max_runtime_seconds = 3600 where name = 'ml'")
        .execute(&s.app.pool)
        .await
        .expect("set the limit");
    let r = s.submit(&s.alice, "ml", &spec("short")).await;
    r.assert_status(201);
    assert_eq!(r.json()["max_runtime_seconds"], 3600);
    let r = s.submit(&s.alice, "ml", &spec_with("long", json!({"max_runtime_seconds": 3601}))).await;
    assert_field(&r, "max_runtime_seconds", "exceeds_team_limit");
    // Another team keeps the default.
    let r = s.submit(&s.bob, "cv", &spec("theirs")).await;
    r.assert_status(201);
    assert_eq!(r.json()["max_runtime_seconds"], 86_400);
}

#[tokio::test]
async fn an_absurd_replica_count_is_422_not_a_crash_when_clusters_report_inventory() {
    let s = setup().await;
    two_nodes_of_eight(&s.app).await;
    let r = s.submit(&s.alice, "ml", &spec_with("absurd", json!({"replicas": i64::MAX, "gpus_per_replica": 2}))).await;
    assert_field(&r, "replicas", "too_large");
    assert_eq!(s.job_count().await, 0);
}

#[tokio::test]
async fn a_ci_token_revoked_by_another_replica_cannot_submit_even_right_after_a_served_submission() {
    let s = setup().await;
    s.submit(&s.ml_ci, "ml", &spec("before")).await.assert_status(201);
    // Revoked in the database directly, as another replica would: nothing tells this one.
    sqlx::query("update api_tokens set revoked_at = now() where id::text = $1")
        .bind(&s.ml_ci_id)
        .execute(&s.app.pool)
        .await
        .expect("revoke");
    s.submit(&s.ml_ci, "ml", &spec("after")).await.assert_status(401);
    // An invalid job tells a revoked token nothing more.
    s.submit(&s.ml_ci, "ml", &spec_with("bad", json!({"gpu_class": "b200"}))).await.assert_status(401);
    assert_eq!(s.job_count().await, 1);
}

#[tokio::test]
async fn a_ci_token_that_expired_since_its_last_submission_cannot_submit() {
    let s = setup().await;
    s.submit(&s.ml_ci, "ml", &spec("before")).await.assert_status(201);
    sqlx::query("update api_tokens set expires_at = now() - interval '1 second' where id::text = $1")
        .bind(&s.ml_ci_id)
        .execute(&s.app.pool)
        .await
        .expect("expire");
    s.submit(&s.ml_ci, "ml", &spec("after")).await.assert_status(401);
    assert_eq!(s.job_count().await, 1);
}

#[tokio::test]
async fn a_ci_pipeline_keeps_submitting_when_its_team_is_edited_between_submissions() {
    let s = setup().await;
    s.submit(&s.ml_ci, "ml", &spec("before")).await.assert_status(201);
    s.app
        .send(call("PATCH", "/api/v1/teams/ml").token(&s.admin).json(&json!({"display_name": "Machine learning"})))
        .await
        .assert_status(200);
    let r = s.submit(&s.ml_ci, "ml", &spec("after")).await;
    r.assert_status(201);
    assert_eq!(r.json()["team"], "ml");
    assert_eq!(s.job_count().await, 2);
}

#[tokio::test]
async fn concurrent_single_job_submissions_each_get_their_own_job_back_and_each_job_one_event() {
    let s = setup().await;
    let mut requests = tokio::task::JoinSet::new();
    for i in 0..200 {
        let (app, token, team) = match i % 2 {
            0 => (s.app.clone(), s.ml_ci.clone(), "ml"),
            _ => (s.app.clone(), s.cv_ci.clone(), "cv"),
        };
        requests.spawn(async move {
            let name = format!("{team}-{i}");
            let r =
                app.send(call("POST", &format!("/api/v1/teams/{team}/jobs")).token(&token).json(&spec(&name))).await;
            (name, team, r)
        });
    }
    let mut ids = std::collections::BTreeSet::new();
    while let Some(done) = requests.join_next().await {
        let (name, team, r) = done.expect("request task");
        r.assert_status(201);
        let job = r.json();
        assert_eq!((job["name"].as_str(), job["team"].as_str()), (Some(name.as_str()), Some(team)), "{job}");
        let id: Uuid = job["id"].as_str().expect("id").parse().expect("uuid");
        let stored: (String, String) =
            sqlx::query_as("select j.name, t.name from jobs j join teams t on t.id = j.team_id where j.id = $1")
                .bind(id)
                .fetch_one(&s.app.pool)
                .await
                .expect("the answered job is stored");
        assert_eq!(stored, (name, team.to_owned()));
        assert!(ids.insert(id), "job {id} answered twice");
    }
    assert_eq!(ids.len(), 200);
    assert_eq!(s.job_count().await, 200);
    let events: Vec<(i64,)> = sqlx::query_as(
        "select count(*) from jobs j left join job_events e on e.job_id = j.id and e.kind = 'submitted' group by j.id",
    )
    .fetch_all(&s.app.pool)
    .await
    .expect("events");
    assert!(events.iter().all(|&(n,)| n == 1), "every job has exactly one submitted event: {events:?}");
}

#[tokio::test]
async fn a_submission_the_database_refuses_fails_alone_not_the_submissions_written_with_it() {
    let s = setup().await;
    let queue = fairway::db::group_commit::SubmissionQueue::new(s.app.pool.clone());
    let (ml, h100): (TeamId, GpuClassId) =
        sqlx::query_as("select t.id, c.id from teams t, gpu_classes c where t.name = 'ml' and c.name = 'h100'")
            .fetch_one(&s.app.pool)
            .await
            .expect("ids");
    let mut writes = tokio::task::JoinSet::new();
    for i in 0..50 {
        let queue = queue.clone();
        // One job names a team that does not exist: the database refuses that row.
        let team = if i == 25 { TeamId::new() } else { ml };
        let job = fairway::db::jobs::NewJob {
            id: JobId::new(),
            name: format!("job-{i}"),
            gpu_class_id: h100,
            priority_class: "production".into(),
            replicas: 1,
            gpus_per_replica: 1,
            max_runtime_seconds: 3600,
            expected_runtime_seconds: None,
            image: "registry.example/train:1".into(),
            command: json!([]),
            env: json!({}),
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
        };
        writes.spawn(async move { (i, job.id, queue.submit(team, "test", job, None).await) });
    }
    while let Some(done) = writes.join_next().await {
        let (i, id, result) = done.expect("write task");
        match i {
            25 => assert!(result.is_err(), "the job of a missing team is refused"),
            _ => assert_eq!(result.expect("stored").map(|s| s.id), Some(id), "job {i}"),
        }
    }
    assert_eq!(s.job_count().await, 49);
}

#[tokio::test]
async fn a_ci_pipeline_is_validated_against_the_catalogue_as_it_is_now_never_a_stale_copy() {
    let s = setup().await;
    // The first submission reads the catalogue; later ones with the same token reuse it
    // while nothing changes.
    s.submit(&s.ml_ci, "ml", &spec_with("a", json!({"max_runtime_seconds": 7200}))).await.assert_status(201);
    s.submit(&s.ml_ci, "ml", &spec_with("b", json!({"max_runtime_seconds": 7200}))).await.assert_status(201);
    // The team's limit drops: the very next submission is held to it.
    sqlx::query("update teams set max_runtime_seconds = 3600 where name = 'ml'")
        .execute(&s.app.pool)
        .await
        .expect("set the limit");
    let r = s.submit(&s.ml_ci, "ml", &spec_with("c", json!({"max_runtime_seconds": 7200}))).await;
    assert_field(&r, "max_runtime_seconds", "exceeds_team_limit");
    // A new priority class can be used at once.
    let r = s.submit(&s.ml_ci, "ml", &spec_with("d", json!({"priority_class": "batch"}))).await;
    assert_field(&r, "priority_class", "not_found");
    s.app
        .send(call("POST", "/api/v1/priority-classes").token(&s.admin).json(&json!({
            "name": "batch", "priority": 50, "preemptible": true, "usage_factor_milli": 1000, "price_multiplier_milli": 1000,
        })))
        .await
        .assert_status(201);
    s.submit(&s.ml_ci, "ml", &spec_with("e", json!({"priority_class": "batch"}))).await.assert_status(201);
}

#[tokio::test]
async fn a_job_row_with_a_state_this_build_does_not_know_fails_the_read_loudly() {
    let s = setup().await;
    let id = s.submit_ok(&spec("from-a-newer-build")).await;
    // A newer build (or a hand edit) stored a state this one does not know.
    sqlx::query("alter table jobs drop constraint jobs_state_check").execute(&s.app.pool).await.unwrap();
    sqlx::query("update jobs set state = 'paused' where id = $1::uuid").bind(&id).execute(&s.app.pool).await.unwrap();

    let err = fairway::db::jobs::get(&s.app.pool, id.parse().unwrap()).await.unwrap_err();
    let message = err.to_string();
    assert!(message.contains("paused"), "the error names the value: {message}");
    assert!(message.contains("JobState"), "and the type it was read as: {message}");

    let r = s.app.send(call("GET", &format!("/api/v1/jobs/{id}")).token(&s.alice)).await;
    r.assert_problem(500, "internal_error");
    let list = s.app.send(call("GET", "/api/v1/teams/ml/jobs").token(&s.alice)).await;
    list.assert_problem(500, "internal_error");
    assert!(!String::from_utf8_lossy(&list.body).contains("pending"), "never shown as pending");
}

#[tokio::test]
async fn reading_an_unchanged_job_with_its_etag_answers_304_and_any_change_answers_200() {
    let s = setup().await;
    let id = s.submit_ok(&spec("polled")).await;
    let path = format!("/api/v1/jobs/{id}");
    let first = s.get(&s.ml_ci, &path).await;
    first.assert_status(200);
    let tag = first.header("etag").expect("a job read carries an ETag");
    let conditional = |tag: &str| call("GET", &path).token(&s.ml_ci).header("if-none-match", tag);

    let unchanged = s.app.send(conditional(&tag)).await;
    unchanged.assert_status(304);
    assert!(unchanged.body.is_empty(), "a 304 has no body");
    assert_eq!(unchanged.header("etag"), Some(tag.clone()));
    s.app.send(call("GET", &path).token(&s.ml_ci).header("if-none-match", "\"999\", *")).await.assert_status(304);

    // The scheduler records why the job waits without bumping its version: still a change.
    sqlx::query("update jobs set pending_reason = 'quota_exhausted', queue_position = 3 where id = $1")
        .bind(id.parse::<JobId>().unwrap())
        .execute(&s.app.pool)
        .await
        .unwrap();
    let moved = s.app.send(conditional(&tag)).await;
    moved.assert_status(200);
    assert_eq!(moved.json()["pending"]["position"], 3);
    let waiting_tag = moved.header("etag").expect("etag");
    assert_ne!(waiting_tag, tag);
    s.app.send(conditional(&waiting_tag)).await.assert_status(304);

    s.post(&s.ml_ci, &format!("/api/v1/jobs/{id}/cancel")).await.assert_status(200);
    let cancelled = s.app.send(conditional(&waiting_tag)).await;
    cancelled.assert_status(200);
    assert_eq!(cancelled.json()["state"], "cancelled");
    // Lists carry no entity tag, so the header changes nothing there.
    s.app
        .send(call("GET", "/api/v1/teams/ml/jobs").token(&s.ml_ci).header("if-none-match", "*"))
        .await
        .assert_status(200);
}

#[tokio::test]
async fn running_a_job_again_submits_what_it_asked_for_labelled_with_the_job_it_repeats() {
    let s = setup().await;
    let asked = spec_with(
        "train",
        json!({"replicas": 2, "gpus_per_replica": 4, "priority_class": "production", "max_runtime_seconds": 7200,
               "expected_runtime_seconds": 600, "command": ["python", "train.py"], "env": {"SEED": "7"},
               "labels": {"project": "llm"}, "topology": {"level": "rack", "mode": "preferred"},
               "preemption_grace_seconds": 45, "preemption_delay_seconds": 300, "max_retries": 2, "allow_spot": true}),
    );
    let r = s.submit(&s.ml_ci, "ml", &asked).await;
    r.assert_status(201);
    let first = r.json();
    let id = first["id"].as_str().unwrap().to_owned();
    let rerun = format!("/api/v1/jobs/{id}/rerun");
    let r = s.app.send(call("POST", &rerun).token(&s.alice).header("idempotency-key", "rerun-1")).await;
    r.assert_status(201);
    let again = r.json();
    assert_ne!(again["id"], first["id"]);
    assert_eq!(again["submitted_by"], "user:alice");
    assert_eq!(again["state"], "pending");
    for field in [
        "name",
        "gpu_class",
        "priority_class",
        "replicas",
        "gpus_per_replica",
        "max_runtime_seconds",
        "expected_runtime_seconds",
        "image",
        "command",
        "env",
        "topology",
        "preemption_grace_seconds",
        "preemption_delay_seconds",
        "max_retries",
        "allow_spot",
    ] {
        assert_eq!(again[field], first[field], "{field}");
    }
    assert_eq!(again["labels"], json!({"project": "llm", "fairway.dev/rerun-of": id}));
    // A retried request runs it again once.
    let r = s.app.send(call("POST", &rerun).token(&s.alice).header("idempotency-key", "rerun-1")).await;
    r.assert_status(201);
    assert_eq!(r.json()["id"], again["id"]);
    // Another team's member cannot see it, so cannot run it.
    s.app.send(call("POST", &rerun).token(&s.cv_ci)).await.assert_problem(404, "not_found");
    // The runs of a job are found by its label.
    let r = s
        .app
        .send(call("GET", &format!("/api/v1/teams/ml/jobs?label=fairway.dev/rerun-of%3D{id}")).token(&s.ml_ci))
        .await;
    r.assert_status(200);
    assert_eq!(ids(&r.json()["items"]), [again["id"].as_str().unwrap()]);
}
