//! `Idempotency-Key` on creates.

use std::sync::Arc;

use fairway_tests::{call, TestApp, USER_PASSWORD};
use serde_json::json;

#[tokio::test]
async fn the_same_create_sent_100_times_20_at_once_makes_one_object_and_identical_responses() {
    let app = Arc::new(TestApp::spawn().await);
    let admin = Arc::new(app.admin().await);
    let mut responses = Vec::new();
    for _ in 0..5 {
        let wave: Vec<_> = (0..20)
            .map(|_| {
                let (app, admin) = (app.clone(), admin.clone());
                tokio::spawn(async move {
                    app.send(
                        call("POST", "/api/v1/teams")
                            .token(&admin)
                            .header("idempotency-key", "create-ml-1")
                            .json(&json!({"name": "ml", "display_name": "ML"})),
                    )
                    .await
                })
            })
            .collect();
        for task in wave {
            responses.push(task.await.unwrap());
        }
    }
    assert_eq!(responses.len(), 100);
    let first = &responses[0];
    first.assert_status(201);
    for r in &responses {
        assert_eq!((r.status, &r.body), (first.status, &first.body));
    }
    let replayed = responses.iter().filter(|r| r.header("idempotent-replayed").is_some()).count();
    assert_eq!(replayed, 99, "exactly one request ran the create");
    let teams: i64 = sqlx::query_scalar("select count(*) from teams").fetch_one(&app.pool).await.unwrap();
    assert_eq!(teams, 1);
}

#[tokio::test]
async fn reusing_a_key_with_another_body_is_422() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    let send = |name: &'static str| {
        app.send(
            call("POST", "/api/v1/teams").token(&admin).header("idempotency-key", "k1").json(&json!({"name": name})),
        )
    };
    send("ml").await.assert_status(201);
    let doc = send("vision").await.assert_problem(422, "idempotency_key_reused");
    assert_eq!(doc["field"], "Idempotency-Key");
    let teams: i64 = sqlx::query_scalar("select count(*) from teams").fetch_one(&app.pool).await.unwrap();
    assert_eq!(teams, 1);
}

#[tokio::test]
async fn a_repeat_while_the_first_request_is_in_flight_is_409() {
    // No waiting for the first request: a repeat that finds it running answers at once.
    let app = Arc::new(TestApp::spawn_with(|c| c.idempotency_wait = std::time::Duration::ZERO).await);
    let admin = Arc::new(app.admin().await);
    // Creating a user hashes its password with argon2id, which keeps the first request in
    // flight long enough for the second to arrive.
    let send = || {
        let (app, admin) = (app.clone(), admin.clone());
        tokio::spawn(async move {
            app.send(
                call("POST", "/api/v1/users")
                    .token(&admin)
                    .header("idempotency-key", "user-1")
                    .json(&json!({"username": "alice", "password": USER_PASSWORD})),
            )
            .await
        })
    };
    // Twenty at once: one runs; those that arrive while it runs get 409, and any that arrive
    // after it finished get its response replayed.
    let tasks: Vec<_> = (0..20).map(|_| send()).collect();
    let mut responses = Vec::new();
    for task in tasks {
        responses.push(task.await.unwrap());
    }
    let ran: Vec<_> =
        responses.iter().filter(|r| r.status == 201 && r.header("idempotent-replayed").is_none()).collect();
    assert_eq!(ran.len(), 1, "exactly one request created the user");
    let conflicts: Vec<_> = responses.iter().filter(|r| r.status == 409).collect();
    assert!(!conflicts.is_empty(), "some repeats arrived while the first was hashing its password");
    for r in &conflicts {
        r.assert_problem(409, "idempotency_in_flight");
    }
    for r in responses.iter().filter(|r| r.status != 409) {
        assert_eq!((r.status, &r.body), (ran[0].status, &ran[0].body));
    }
    let users: i64 =
        sqlx::query_scalar("select count(*) from users where username = 'alice'").fetch_one(&app.pool).await.unwrap();
    assert_eq!(users, 1);
    // Once the first has finished, the repeat gets its response.
    let again = app
        .send(
            call("POST", "/api/v1/users")
                .token(&admin)
                .header("idempotency-key", "user-1")
                .json(&json!({"username": "alice", "password": USER_PASSWORD})),
        )
        .await;
    again.assert_status(201);
    assert_eq!(again.header("idempotent-replayed").as_deref(), Some("true"));
}

#[tokio::test]
async fn keys_are_scoped_per_caller() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    let other = app.user(&admin, "other-admin", Some("platform-admin")).await;
    let r1 = app
        .send(
            call("POST", "/api/v1/teams").token(&admin).header("idempotency-key", "same").json(&json!({"name": "one"})),
        )
        .await;
    let r2 = app
        .send(
            call("POST", "/api/v1/teams").token(&other).header("idempotency-key", "same").json(&json!({"name": "two"})),
        )
        .await;
    r1.assert_status(201);
    r2.assert_status(201);
    assert_ne!(r1.json()["id"], r2.json()["id"]);
}

#[tokio::test]
async fn a_failed_create_replays_its_error_for_the_same_key() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    let send = || {
        app.send(
            call("POST", "/api/v1/teams")
                .token(&admin)
                .header("idempotency-key", "bad")
                .json(&json!({"name": "Bad Name"})),
        )
    };
    let first = send().await;
    first.assert_problem(422, "validation_failed");
    let second = send().await;
    assert_eq!((second.status, &second.body), (first.status, &first.body));
}

#[tokio::test]
async fn a_token_minted_with_an_idempotency_key_never_has_its_secret_stored_or_replayed() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    let expires = (chrono::Utc::now() + chrono::Duration::days(30)).to_rfc3339();
    let mint = || {
        call("POST", "/api/v1/teams/ml/tokens")
            .token(&admin)
            .header("idempotency-key", "mint-ci-1")
            .json(&json!({"name": "ci", "role": "member", "expires_at": expires}))
    };
    let first = app.send(mint()).await;
    first.assert_status(201);
    let secret = first.json()["secret"].as_str().expect("the first answer shows the secret").to_owned();
    assert!(secret.starts_with("fwy_"), "{secret}");

    let again = app.send(mint()).await;
    again.assert_status(201);
    assert_eq!(again.header("idempotent-replayed").as_deref(), Some("true"));
    let replayed = again.json();
    assert_eq!(replayed["secret"], serde_json::Value::Null, "{replayed}");
    assert_eq!(replayed["id"], first.json()["id"], "the same token, not a second one");

    let stored: Vec<Vec<u8>> = sqlx::query_scalar("select response_body from idempotency_keys where key = 'mint-ci-1'")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(stored.len(), 1);
    let needle = secret.as_bytes();
    assert!(!stored[0].windows(needle.len()).any(|w| w == needle), "the secret is not at rest");
    // The secret still works: it was withheld from the store, not changed.
    app.send(call("GET", "/api/v1/me").token(&secret)).await.assert_status(200);
}
