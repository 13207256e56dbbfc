//! Job templates as a team uses them: saving a request by name, submitting it with only what
//! changes, editing it without overwriting a colleague, and never seeing another team's.

use fairway_tests::{call, TestApp, TestResponse};
use serde_json::{json, Value};

/// Team `ml` with a member (`alice`) and a viewer (`vic`); team `cv` with a member (`bob`);
/// GPU class `h100`, 8 reserved and 8 burst for each team.
struct Setup {
    app: TestApp,
    admin: String,
    alice: String,
    vic: String,
    bob: String,
}

async fn setup() -> Setup {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.gpu_class(&admin, "h100").await;
    for team in ["ml", "cv"] {
        app.team(&admin, team, None).await;
        app.quota(&admin, team, "h100", 8, 8).await;
    }
    let alice = app.user(&admin, "alice", None).await;
    app.member(&admin, "ml", "alice", "member").await;
    let vic = app.user(&admin, "vic", None).await;
    app.member(&admin, "ml", "vic", "viewer").await;
    let bob = app.user(&admin, "bob", None).await;
    app.member(&admin, "cv", "bob", "member").await;
    Setup { app, admin, alice, vic, bob }
}

fn nightly() -> Value {
    json!({"name": "nightly-eval", "gpu_class": "h100", "gpus_per_replica": 2, "image": "registry.example/eval:1",
           "command": ["python", "eval.py"], "env": {"SUITE": "full", "SEED": "1"}, "labels": {"project": "vision"},
           "max_runtime_seconds": 3600})
}

impl Setup {
    async fn put(&self, token: &str, team: &str, name: &str, body: &Value) -> TestResponse {
        self.app.send(call("PUT", &format!("/api/v1/teams/{team}/job-templates/{name}")).token(token).json(body)).await
    }

    async fn submit(&self, token: &str, team: &str, name: &str, overrides: &Value) -> TestResponse {
        let path = format!("/api/v1/teams/{team}/job-templates/{name}/jobs");
        self.app.send(call("POST", &path).token(token).json(overrides)).await
    }

    async fn get(&self, token: &str, path: &str) -> TestResponse {
        self.app.send(call("GET", path).token(token)).await
    }
}

#[tokio::test]
async fn a_saved_template_submits_a_job_with_only_what_changes() {
    let s = setup().await;
    let saved = s.put(&s.alice, "ml", "nightly", &nightly()).await;
    saved.assert_status(201);
    assert_eq!(saved.json()["name"], "nightly");
    assert_eq!(saved.json()["created_by"], "user:alice");
    assert_eq!(saved.header("etag").as_deref(), Some("\"1\""));

    let job =
        s.submit(&s.alice, "ml", "nightly", &json!({"image": "registry.example/eval:2", "env": {"SEED": "7"}})).await;
    job.assert_status(201);
    let job = job.json();
    assert_eq!(job["image"], "registry.example/eval:2", "the override wins");
    assert_eq!(job["gpus_per_replica"], 2, "the template's fields are kept");
    assert_eq!(job["command"], json!(["python", "eval.py"]));
    assert_eq!(job["env"], json!({"SUITE": "full", "SEED": "7"}), "env adds to the template's");
    assert_eq!(job["labels"], json!({"project": "vision", "fairway.dev/template": "nightly"}));
    assert_eq!(job["state"], "pending");

    // As saved, with an empty body; the job is the team's like any other.
    let plain = s.submit(&s.alice, "ml", "nightly", &json!({})).await;
    plain.assert_status(201);
    assert_eq!(plain.json()["image"], "registry.example/eval:1");
    let listed = s.get(&s.alice, "/api/v1/teams/ml/jobs?label=fairway.dev/template=nightly").await;
    listed.assert_status(200);
    assert_eq!(listed.json()["items"].as_array().map(Vec::len), Some(2));
}

#[tokio::test]
async fn saving_again_makes_a_new_version_and_if_match_stops_a_stale_edit() {
    let s = setup().await;
    s.put(&s.alice, "ml", "nightly", &nightly()).await.assert_status(201);
    let mut changed = nightly();
    changed["gpus_per_replica"] = json!(4);
    let second = s.put(&s.alice, "ml", "nightly", &changed).await;
    second.assert_status(200);
    assert_eq!(second.json()["version"], 2);
    assert_eq!(second.json()["spec"]["gpus_per_replica"], 4);

    // Someone who read version 1 cannot overwrite version 2.
    let stale = s
        .app
        .send(
            call("PUT", "/api/v1/teams/ml/job-templates/nightly")
                .token(&s.alice)
                .header("if-match", "\"1\"")
                .json(&nightly()),
        )
        .await;
    stale.assert_problem(412, "etag_mismatch");
    let read = s.get(&s.vic, "/api/v1/teams/ml/job-templates/nightly").await;
    read.assert_status(200);
    assert_eq!(read.json()["spec"]["gpus_per_replica"], 4, "the stale edit changed nothing");

    // `If-Match: "0"` creates only what does not exist yet.
    let fresh = call("PUT", "/api/v1/teams/ml/job-templates/nightly").token(&s.alice).header("if-match", "\"0\"");
    s.app.send(fresh.json(&nightly())).await.assert_problem(412, "etag_mismatch");

    // One template, in two versions: both saves are in the team's audit log.
    let listed = s.get(&s.alice, "/api/v1/teams/ml/job-templates").await;
    assert_eq!(listed.json()["items"].as_array().map(Vec::len), Some(1));
    let audit = s.get(&s.admin, "/api/v1/teams/ml/audit-log").await.json();
    let saves = audit["items"].as_array().expect("items").iter().filter(|e| e["action"] == "job_template.save").count();
    assert_eq!(saves, 2, "{audit}");
}

#[tokio::test]
async fn a_template_is_checked_as_a_job_would_be_and_the_wrong_field_is_named() {
    let s = setup().await;
    let mut bad = nightly();
    bad["gpu_class"] = json!("h200");
    s.put(&s.alice, "ml", "nightly", &bad).await.assert_problem(422, "validation_failed");
    let mut too_big = nightly();
    too_big["gpus_per_replica"] = json!(64);
    too_big["replicas"] = json!(2);
    let problem = s.put(&s.alice, "ml", "nightly", &too_big).await.assert_problem(422, "validation_failed");
    assert!(problem["errors"].as_array().is_some_and(|e| !e.is_empty()), "{problem}");
    let problem = s.put(&s.alice, "ml", "Nightly%20Eval", &nightly()).await.assert_problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["field"], "template");
    assert!(s.get(&s.alice, "/api/v1/teams/ml/job-templates").await.json()["items"]
        .as_array()
        .is_some_and(Vec::is_empty));

    // An override of the wrong type, or a field jobs do not have, is named; nothing is submitted.
    s.put(&s.alice, "ml", "nightly", &nightly()).await.assert_status(201);
    let problem =
        s.submit(&s.alice, "ml", "nightly", &json!({"replicas": "two"})).await.assert_problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["field"], "replicas");
    let problem =
        s.submit(&s.alice, "ml", "nightly", &json!({"gpus": 2})).await.assert_problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["field"], "gpus");
    let problem = s
        .submit(&s.alice, "ml", "nightly", &json!({"max_runtime_seconds": 0}))
        .await
        .assert_problem(422, "validation_failed");
    assert_eq!(problem["errors"][0]["field"], "max_runtime_seconds");
    s.submit(&s.alice, "ml", "nightly", &json!([1, 2])).await.assert_problem(422, "validation_failed");
    let jobs = s.get(&s.alice, "/api/v1/teams/ml/jobs").await.json();
    assert!(jobs["items"].as_array().is_some_and(Vec::is_empty), "{jobs}");
}

#[tokio::test]
async fn another_teams_templates_cannot_be_read_used_or_deleted() {
    let s = setup().await;
    s.put(&s.alice, "ml", "nightly", &nightly()).await.assert_status(201);
    s.get(&s.bob, "/api/v1/teams/ml/job-templates").await.assert_status(404);
    s.get(&s.bob, "/api/v1/teams/ml/job-templates/nightly").await.assert_status(404);
    s.submit(&s.bob, "ml", "nightly", &json!({})).await.assert_status(404);
    // Bob's own team has no template of that name.
    s.submit(&s.bob, "cv", "nightly", &json!({})).await.assert_problem(404, "not_found");
    s.app.send(call("DELETE", "/api/v1/teams/ml/job-templates/nightly").token(&s.bob)).await.assert_status(404);
    // A viewer reads but does not change or use.
    s.get(&s.vic, "/api/v1/teams/ml/job-templates/nightly").await.assert_status(200);
    s.submit(&s.vic, "ml", "nightly", &json!({})).await.assert_status(403);
    s.put(&s.vic, "ml", "nightly", &nightly()).await.assert_status(403);
    let listed = s.get(&s.bob, "/api/v1/teams/cv/job-templates").await;
    assert!(listed.json()["items"].as_array().is_some_and(Vec::is_empty));
}

#[tokio::test]
async fn a_deleted_template_is_gone_and_its_jobs_stay() {
    let s = setup().await;
    s.put(&s.alice, "ml", "nightly", &nightly()).await.assert_status(201);
    let job = s.submit(&s.alice, "ml", "nightly", &json!({})).await;
    job.assert_status(201);
    let id = job.json()["id"].as_str().expect("id").to_owned();
    s.app.send(call("DELETE", "/api/v1/teams/ml/job-templates/nightly").token(&s.alice)).await.assert_status(204);
    s.get(&s.alice, "/api/v1/teams/ml/job-templates/nightly").await.assert_status(404);
    s.submit(&s.alice, "ml", "nightly", &json!({})).await.assert_status(404);
    let kept = s.get(&s.alice, &format!("/api/v1/jobs/{id}")).await;
    kept.assert_status(200);
    assert_eq!(kept.json()["labels"]["fairway.dev/template"], "nightly");
}
