//! Bad input gets a 4xx problem naming what is wrong, never a 5xx, and writes nothing.

use fairway_tests::{call, TestApp};
use serde_json::json;

async fn setup() -> (TestApp, String) {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.gpu_class(&admin, "h100").await;
    app.team(&admin, "ml", None).await;
    (app, admin)
}

#[tokio::test]
async fn unknown_fields_are_rejected_by_name() {
    let (app, admin) = setup().await;
    let r = app.send(call("POST", "/api/v1/teams").token(&admin).json(&json!({"name": "x", "colour": "red"}))).await;
    let doc = r.assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "colour");
    assert_eq!(doc["errors"][0]["code"], "unknown_field");
    let r = app
        .send(
            call("PUT", "/api/v1/teams/ml/quotas/h100")
                .token(&admin)
                .json(&json!({"reserved": 1, "burst": 0, "borrow": 3})),
        )
        .await;
    assert_eq!(r.assert_problem(422, "validation_failed")["field"], "borrow");
}

#[tokio::test]
async fn negative_and_absurd_quotas_name_the_field() {
    let (app, admin) = setup().await;
    let put = |body: serde_json::Value| app.send(call("PUT", "/api/v1/teams/ml/quotas/h100").token(&admin).json(&body));
    for (body, field, code) in [
        (json!({"reserved": -1, "burst": 0}), "reserved", "too_small"),
        (json!({"reserved": 1, "burst": -5}), "burst", "too_small"),
        (json!({"reserved": 1_000_000_000, "burst": 0}), "reserved", "too_large"),
        (json!({"reserved": 1, "burst": 1e30}), "burst", "invalid_value"),
        (json!({"reserved": 2, "burst": 0, "lendable": 3}), "lendable", "too_large"),
        (json!({"reserved": "many", "burst": 0}), "reserved", "invalid_value"),
    ] {
        let doc = put(body.clone()).await.assert_problem(422, "validation_failed");
        assert_eq!((doc["field"].as_str(), doc["errors"][0]["code"].as_str()), (Some(field), Some(code)), "{body}");
    }
    let quotas = app.send(call("GET", "/api/v1/teams/ml/quotas").token(&admin)).await;
    assert_eq!(quotas.json(), json!([]), "nothing was written");
}

#[tokio::test]
async fn names_with_control_characters_are_refused() {
    let (app, admin) = setup().await;
    for name in ["ml\u{0}evil", "ml\nx", "ml\u{1b}[31m"] {
        let doc = app
            .send(call("POST", "/api/v1/teams").token(&admin).json(&json!({"name": name})))
            .await
            .assert_problem(422, "validation_failed");
        assert_eq!(doc["field"], "name");
        assert_eq!(doc["errors"][0]["code"], "control_character");
    }
    let doc = app
        .send(call("PATCH", "/api/v1/teams/ml").token(&admin).json(&json!({"display_name": "ML\u{7}"})))
        .await
        .assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "display_name");
}

#[tokio::test]
async fn a_10_mb_body_is_413() {
    let (app, admin) = setup().await;
    let huge = format!("{{\"name\": \"{}\"}}", "a".repeat(10 * 1024 * 1024));
    let r = app.send(call("POST", "/api/v1/teams").token(&admin).raw("application/json", huge.into_bytes())).await;
    r.assert_problem(413, "payload_too_large");
    let r = app
        .send(
            call("POST", "/api/v1/teams")
                .token(&admin)
                .header("idempotency-key", "big")
                .raw("application/json", vec![b' '; 10 * 1024 * 1024]),
        )
        .await;
    r.assert_problem(413, "payload_too_large");
}

#[tokio::test]
async fn deeply_nested_json_is_a_client_error() {
    let (app, admin) = setup().await;
    let nested = format!("{{\"name\": {}1{}}}", "[".repeat(100_000), "]".repeat(100_000));
    let r = app.send(call("POST", "/api/v1/teams").token(&admin).raw("application/json", nested.into_bytes())).await;
    assert!(r.status.is_client_error(), "{}", r.status);
    assert_eq!(r.header("content-type").as_deref(), Some("application/problem+json"));
}

#[tokio::test]
async fn the_wrong_content_type_is_415_and_broken_json_is_400() {
    let (app, admin) = setup().await;
    let r = app.send(call("POST", "/api/v1/teams").token(&admin).raw("text/plain", b"{\"name\":\"x\"}".to_vec())).await;
    r.assert_problem(415, "unsupported_media_type");
    let r = app.send(call("POST", "/api/v1/teams").token(&admin).raw("application/json", b"{\"name\":".to_vec())).await;
    r.assert_problem(400, "malformed_body");
}

#[tokio::test]
async fn bad_query_parameters_and_unknown_routes_are_problems_too() {
    let (app, admin) = setup().await;
    let doc =
        app.send(call("GET", "/api/v1/teams?limit=0").token(&admin)).await.assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "limit");
    let doc = app
        .send(call("GET", "/api/v1/teams?cursor=%21%21").token(&admin))
        .await
        .assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "cursor");
    let doc =
        app.send(call("GET", "/api/v1/teams?colour=red").token(&admin)).await.assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "colour");
    app.send(call("GET", "/api/v1/nothing-here").token(&admin)).await.assert_problem(404, "not_found");
    let r = app.send(call("PATCH", "/api/v1/gpu-classes").token(&admin)).await;
    assert_eq!(r.status.as_u16(), 405);
}

#[tokio::test]
async fn a_bad_period_gpu_class_or_unknown_member_names_the_field() {
    let (app, admin) = setup().await;
    let doc = app
        .send(
            call("PUT", "/api/v1/teams/ml/budgets/2026-13")
                .token(&admin)
                .json(&json!({"unit": "money", "amount": 1, "enforcement": "hard"})),
        )
        .await
        .assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "period");
    let doc = app
        .send(call("PUT", "/api/v1/teams/ml/quotas/nope").token(&admin).json(&json!({"reserved": 1, "burst": 0})))
        .await
        .assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "gpu_class");
    let doc = app
        .send(call("PUT", "/api/v1/teams/ml/members/ghost").token(&admin).json(&json!({"role": "member"})))
        .await
        .assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "username");
    let doc = app
        .send(call("PUT", "/api/v1/teams/ml/members/admin").token(&admin).json(&json!({"role": "owner"})))
        .await
        .assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "role");
}

#[tokio::test]
async fn a_request_over_the_time_limit_is_answered_503_and_writes_nothing() {
    let app = TestApp::spawn_with(|c| c.request_timeout = std::time::Duration::from_millis(1)).await;
    let admin = fairway_tests::test_admin_token(&app).await;
    // Creating a user hashes a password with argon2id: far longer than a millisecond.
    let r = app
        .send(
            call("POST", "/api/v1/users")
                .token(&admin)
                .json(&json!({"username": "slow", "password": "a-long-enough-password"})),
        )
        .await;
    r.assert_problem(503, "request_timeout");
    let users: i64 =
        sqlx::query_scalar("select count(*) from users where username = 'slow'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(users, 0);
}

#[tokio::test]
async fn nul_and_invalid_utf8_anywhere_are_client_errors_that_name_where_they_are() {
    let (app, admin) = setup().await;
    let viewer = app.user(&admin, "vera", None).await;
    for token in [&admin, &viewer] {
        for path in
            ["/api/v1/teams/a%00b", "/api/v1/jobs/%ff", "/api/v1/teams/ml%FF/quotas", "/api/v1/teams?cursor=%00"]
        {
            let r = app.send(call("GET", path).token(token)).await;
            let doc = r.assert_problem(400, "malformed_request");
            let part = if path.contains('?') { "query" } else { "path" };
            assert_eq!(doc["field"], part, "{path}: {doc}");
        }
    }
    // No credential needed to reach this one.
    let r = app
        .send(call("POST", "/api/v1/auth/token").json(&json!({"username": "ad\u{0}min", "password": "x-x-x-x-x-x"})))
        .await;
    let doc = r.assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "username");
    assert_eq!(doc["errors"][0]["code"], "control_character");
    // Submissions, dry runs and cluster capacity keys.
    let job = json!({"name": "j", "gpu_class": "h1\u{0}00", "image": "registry.example/x:1", "command": ["true"]});
    for path in ["/api/v1/teams/ml/jobs", "/api/v1/teams/ml/jobs:dry-run"] {
        let r = app.send(call("POST", path).token(&admin).json(&job)).await;
        assert_eq!(r.assert_problem(422, "validation_failed")["field"], "gpu_class", "{path}");
    }
    let r = app
        .send(
            call("PUT", "/api/v1/clusters/c1")
                .token(&admin)
                .json(&json!({"backend": "sim", "capacity": {"h1\u{0}00": 4}})),
        )
        .await;
    assert_eq!(r.assert_problem(422, "validation_failed")["errors"][0]["code"], "control_character");
    // Nothing was written, and the service still answers.
    app.send(call("GET", "/api/v1/teams/ml").token(&admin)).await.assert_status(200);
}
