//! The smaller defects of the hardening review (issue 20, point 5), each as a user meets it:
//! errors that name the right field, bodies that must be objects, honest status codes,
//! headers with limits, HSTS behind TLS, and a connection that says it closes.

use std::{net::SocketAddr, time::Duration};

use fairway_tests::{call, TestApp};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

async fn setup() -> (TestApp, String) {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.gpu_class(&admin, "h100").await;
    app.team(&admin, "ml", None).await;
    (app, admin)
}

#[tokio::test]
async fn a_bad_priority_class_names_the_field_that_is_wrong_and_refuses_unknown_ones() {
    let (app, admin) = setup().await;
    let valid = json!({"name": "urgent", "priority": 500, "preemptible": false,
                       "usage_factor_milli": 1000, "price_multiplier_milli": 1500});
    let mut wrong_type = valid.clone();
    wrong_type["priority"] = json!("high");
    let doc = app
        .send(call("POST", "/api/v1/priority-classes").token(&admin).json(&wrong_type))
        .await
        .assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "priority", "{doc}");
    let mut unknown = valid.clone();
    unknown["colour"] = json!("red");
    let doc = app
        .send(call("POST", "/api/v1/priority-classes").token(&admin).json(&unknown))
        .await
        .assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "colour", "{doc}");
    let mut missing = valid.clone();
    missing.as_object_mut().unwrap().remove("preemptible");
    let doc = app
        .send(call("POST", "/api/v1/priority-classes").token(&admin).json(&missing))
        .await
        .assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "preemptible", "{doc}");
    // Nothing of the refused ones was stored; the valid one is.
    app.send(call("GET", "/api/v1/priority-classes/urgent").token(&admin)).await.assert_problem(404, "not_found");
    app.send(call("POST", "/api/v1/priority-classes").token(&admin).json(&valid)).await.assert_status(201);
}

#[tokio::test]
async fn a_body_sent_as_a_json_array_is_refused_at_any_depth_and_records_nothing() {
    let (app, admin) = setup().await;
    app.send(call("PUT", "/api/v1/teams/ml/quotas/h100").token(&admin).json(&json!({"reserved": 8, "burst": 0})))
        .await
        .assert_status(200);
    let job = app
        .send(call("POST", "/api/v1/teams/ml/jobs").token(&admin).json(&json!({
            "name": "train", "gpu_class": "h100", "image": "train:1"})))
        .await;
    job.assert_status(201);
    let id = job.json()["id"].as_str().unwrap().to_owned();

    // A checkpoint's fields in declaration order would read as `step: 42`.
    let doc = app
        .send(call("POST", &format!("/api/v1/jobs/{id}/checkpoint")).token(&admin).json(&json!([null, 42])))
        .await
        .assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "body", "{doc}");
    assert!(doc["errors"][0]["message"].as_str().unwrap().contains("expected a JSON object"), "{doc}");
    // A whole job as an array, and a job of a batch as one.
    app.send(call("POST", "/api/v1/teams/ml/jobs").token(&admin).json(&json!(["train", "h100", 1, 1])))
        .await
        .assert_problem(422, "validation_failed");
    let doc = app
        .send(call("POST", "/api/v1/teams/ml/jobs:batch").token(&admin).json(&json!({"jobs": [
            {"name": "a", "gpu_class": "h100", "image": "x"}, ["b", "h100"]]})))
        .await
        .assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "jobs[1]", "{doc}");
    let jobs = app.send(call("GET", "/api/v1/teams/ml/jobs").token(&admin)).await.json();
    assert_eq!(jobs["items"].as_array().unwrap().len(), 1, "{jobs}");
    let events = app.send(call("GET", &format!("/api/v1/jobs/{id}/events")).token(&admin)).await.json();
    assert!(!events.to_string().contains("checkpoint"), "{events}");
}

#[tokio::test]
async fn a_wrong_method_is_a_405_problem_that_says_so_and_lists_the_allowed_ones() {
    let (app, admin) = setup().await;
    let r = app.send(call("PATCH", "/api/v1/gpu-classes").token(&admin)).await;
    let doc = r.assert_problem(405, "method_not_allowed");
    assert_eq!(doc["title"], "Method not allowed");
    let allow = r.header("allow").expect("an Allow header");
    assert!(allow.contains("GET") && allow.contains("POST"), "{allow}");
}

#[tokio::test]
async fn headers_above_sixteen_kib_are_refused_with_431_and_below_it_served() {
    let (app, admin) = setup().await;
    let filler = "x".repeat(12 * 1024);
    app.send(call("GET", "/api/v1/me").token(&admin).header("x-filler", &filler)).await.assert_status(200);
    let filler = "x".repeat(20 * 1024);
    let r = app.send(call("GET", "/api/v1/me").token(&admin).header("x-filler", &filler)).await;
    let doc = r.assert_problem(431, "headers_too_large");
    assert!(doc["detail"].as_str().unwrap().contains("16 KiB"), "{doc}");
    // Unauthenticated or not, the limit comes first.
    app.send(call("GET", "/api/v1/me").header("x-filler", &filler)).await.assert_problem(431, "headers_too_large");
}

#[tokio::test]
async fn hsts_is_sent_when_a_proxy_says_the_client_used_https_and_not_otherwise() {
    let (app, admin) = setup().await;
    let tls = app.send(call("GET", "/api/v1/me").token(&admin).header("x-forwarded-proto", "https")).await;
    tls.assert_status(200);
    assert_eq!(tls.header("strict-transport-security").as_deref(), Some("max-age=63072000"));
    let page = app.send(call("GET", "/login").header("x-forwarded-proto", "https")).await;
    assert!(page.header("strict-transport-security").is_some(), "portal pages too");
    let plain = app.send(call("GET", "/api/v1/me").token(&admin).header("x-forwarded-proto", "http")).await;
    assert_eq!(plain.header("strict-transport-security"), None);
    let direct = app.send(call("GET", "/api/v1/me").token(&admin)).await;
    assert_eq!(direct.header("strict-transport-security"), None);
}

/// Writes `head` and `body` on a fresh connection and reads until the server closes it or
/// goes quiet for two seconds; returns what was read and whether the connection closed.
async fn exchange(addr: SocketAddr, head: &str, body: &[u8]) -> (String, bool) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut read = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return (String::from_utf8_lossy(&read).into_owned(), true),
            Ok(Ok(n)) => read.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&read).into_owned(), false),
        }
    }
}

#[tokio::test]
async fn an_early_refusal_of_an_unread_body_says_connection_close_and_a_served_request_keeps_alive() {
    let (app, admin) = setup().await;
    app.user(&admin, "vic", None).await;
    app.member(&admin, "ml", "vic", "viewer").await;
    let viewer = app.login("vic", fairway_tests::USER_PASSWORD).await;
    // On a real socket: what hyper does with the connection is part of the behaviour.
    let addr = app.listen().await;

    // A viewer uploads a large job: refused (403) before the body is read. Only part of the
    // promised body is sent, as a client mid-upload would have.
    let head = format!(
        "POST /api/v1/teams/ml/jobs HTTP/1.1\r\nhost: fairway\r\nauthorization: Bearer {viewer}\r\n\
         content-type: application/json\r\ncontent-length: 100000\r\n\r\n"
    );
    let (response, closed) = exchange(addr, &head, &[b' '; 1000]).await;
    assert!(response.starts_with("HTTP/1.1 403"), "{response}");
    assert!(response.to_ascii_lowercase().contains("\r\nconnection: close\r\n"), "{response}");
    assert!(closed, "the server said it closes the connection, and does");

    // A request that is served in full leaves the connection open for the next one.
    let head = format!("GET /api/v1/me HTTP/1.1\r\nhost: fairway\r\nauthorization: Bearer {viewer}\r\n\r\n");
    let (response, closed) = exchange(addr, &head, b"").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(!response.to_ascii_lowercase().contains("connection: close"), "{response}");
    assert!(!closed, "a served request keeps the connection alive");
}

#[tokio::test]
async fn a_transaction_a_deadlock_rolled_back_answers_503_with_retry_after_not_500() {
    use axum::response::IntoResponse as _;
    let pool = fairway_tests::fresh_database().await;
    sqlx::raw_sql("create table pair (id int primary key, v int); insert into pair values (1, 0), (2, 0)")
        .execute(&pool)
        .await
        .unwrap();
    // Two transactions take the two rows in opposite orders: PostgreSQL rolls one back.
    let bump = "update pair set v = v + 1 where id = $1";
    let mut first = pool.begin().await.unwrap();
    let mut second = pool.begin().await.unwrap();
    sqlx::query(bump).bind(1).execute(&mut *first).await.unwrap();
    sqlx::query(bump).bind(2).execute(&mut *second).await.unwrap();
    let waiting = tokio::spawn(async move {
        sqlx::query(bump).bind(2).execute(&mut *first).await?;
        first.commit().await
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let locks = "select count(*) from pg_stat_activity where datname = current_database() and wait_event_type = 'Lock'";
    while sqlx::query_scalar::<_, i64>(locks).fetch_one(&pool).await.unwrap() == 0 {
        assert!(std::time::Instant::now() < deadline, "the first transaction never waited for the second");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let closing = async {
        sqlx::query(bump).bind(1).execute(&mut *second).await?;
        second.commit().await
    }
    .await;
    let outcomes = [waiting.await.unwrap(), closing];
    let failed: Vec<sqlx::Error> = outcomes.into_iter().filter_map(Result::err).collect();
    assert_eq!(failed.len(), 1, "exactly one of the two is rolled back: {failed:?}");
    let error = failed.into_iter().next().unwrap();
    assert_eq!(
        error.as_database_error().and_then(sqlx::error::DatabaseError::code).as_deref(),
        Some("40P01"),
        "{error}"
    );

    let answer = fairway::http::error::ApiError::from(fairway::ops::Error::from(error)).into_response();
    assert_eq!(answer.status(), 503, "worth retrying, and nothing half-written");
    assert_eq!(answer.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    let total: i64 = sqlx::query_scalar("select sum(v)::int8 from pair").fetch_one(&pool).await.unwrap();
    assert_eq!(total, 2, "the survivor's two updates, none of the rolled back one's");
}
