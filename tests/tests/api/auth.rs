//! Signing in, access tokens and API tokens.

use fairway::auth::jwt::Claims;
use fairway_tests::{call, TestApp, TestResponse, ADMIN_PASSWORD, SIGNING_KEY, USER_PASSWORD};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

fn claims(offset_exp: i64, iss: &str, aud: &str, sub: &str) -> Claims {
    let now = chrono::Utc::now().timestamp();
    Claims {
        iss: iss.into(),
        aud: aud.into(),
        sub: sub.into(),
        iat: now,
        nbf: now,
        exp: now + offset_exp,
        jti: "test".into(),
    }
}

fn sign(claims: &Claims, key: &[u8]) -> String {
    sign_typed(claims, key, Some("at+jwt"))
}

fn sign_typed(claims: &Claims, key: &[u8], typ: Option<&str>) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.typ = typ.map(str::to_owned);
    header.kid = Some(fairway::auth::jwt::key_id(&SIGNING_KEY));
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_secret(key)).unwrap()
}

async fn admin_id(app: &TestApp) -> String {
    let row = fairway::db::users::by_username(&app.pool, "admin").await.unwrap().unwrap();
    row.id.to_string()
}

async fn me_status(app: &TestApp, token: &str) -> u16 {
    app.send(call("GET", "/api/v1/me").token(token)).await.status.as_u16()
}

#[tokio::test]
async fn signing_in_returns_a_short_lived_bearer_token_that_works() {
    let app = TestApp::spawn().await;
    let r = app
        .send(call("POST", "/api/v1/auth/token").json(&json!({"username": "admin", "password": ADMIN_PASSWORD})))
        .await;
    r.assert_status(200);
    let body = r.json();
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["expires_in"], 900);
    let token = body["access_token"].as_str().unwrap();
    let header = jsonwebtoken::decode_header(token).unwrap();
    assert_eq!(header.alg, Algorithm::HS256);
    assert_eq!(header.kid.as_deref(), Some(fairway::auth::jwt::key_id(&SIGNING_KEY).as_str()));
    assert_eq!(header.typ.as_deref(), Some("at+jwt"), "an access token says what it is (RFC 9068)");
    let me = app.send(call("GET", "/api/v1/me").token(token)).await;
    me.assert_status(200);
    assert_eq!(me.json()["name"], "admin");
    assert_eq!(me.json()["platform_role"], "platform-admin");
}

#[tokio::test]
async fn a_wrong_password_and_an_unknown_user_get_the_same_401() {
    let app = TestApp::spawn().await;
    let wrong = app
        .send(call("POST", "/api/v1/auth/token").json(&json!({"username": "admin", "password": "not-the-password"})))
        .await;
    let unknown = app
        .send(call("POST", "/api/v1/auth/token").json(&json!({"username": "nobody", "password": "not-the-password"})))
        .await;
    wrong.assert_problem(401, "invalid_credentials");
    unknown.assert_problem(401, "invalid_credentials");
    assert_eq!(wrong.body, unknown.body);
}

#[tokio::test]
async fn forged_expired_and_misaddressed_tokens_are_rejected_with_401() {
    let app = TestApp::spawn().await;
    let sub = admin_id(&app).await;
    let good = sign(&claims(600, "fairway", "fairway-api", &sub), &SIGNING_KEY);
    assert_eq!(me_status(&app, &good).await, 200, "the control token must work");

    let expired = sign(&claims(-120, "fairway", "fairway-api", &sub), &SIGNING_KEY);
    let wrong_aud = sign(&claims(600, "fairway", "someone-else", &sub), &SIGNING_KEY);
    let wrong_iss = sign(&claims(600, "evil", "fairway-api", &sub), &SIGNING_KEY);
    let wrong_key = sign(&claims(600, "fairway", "fairway-api", &sub), &[7; 32]);
    // Signed with the right key, but typed as a plain JWT or as an ID token.
    let plain_jwt = sign_typed(&claims(600, "fairway", "fairway-api", &sub), &SIGNING_KEY, Some("JWT"));
    let id_token = sign_typed(&claims(600, "fairway", "fairway-api", &sub), &SIGNING_KEY, Some("id+jwt"));
    let untyped = sign_typed(&claims(600, "fairway", "fairway-api", &sub), &SIGNING_KEY, None);
    let stripped = {
        let mut parts: Vec<&str> = good.split('.').collect();
        parts[2] = "";
        parts.join(".")
    };
    let alg_none = {
        use base64::Engine as _;
        let b64 = |v: &serde_json::Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let header = json!({"alg": "none", "typ": "JWT", "kid": fairway::auth::jwt::key_id(&SIGNING_KEY)});
        let payload = serde_json::to_value(claims(600, "fairway", "fairway-api", &sub)).unwrap();
        format!("{}.{}.", b64(&header), b64(&payload))
    };
    for (what, token) in [
        ("expired", &expired),
        ("wrong aud", &wrong_aud),
        ("wrong iss", &wrong_iss),
        ("wrong key", &wrong_key),
        ("typ JWT", &plain_jwt),
        ("typ id+jwt", &id_token),
        ("no typ", &untyped),
        ("stripped signature", &stripped),
        ("alg none", &alg_none),
    ] {
        let r = app.send(call("GET", "/api/v1/me").token(token)).await;
        assert_eq!(r.status.as_u16(), 401, "{what}");
        assert_eq!(r.header("www-authenticate").as_deref(), Some("Bearer realm=\"fairway\""), "{what}");
    }
}

#[tokio::test]
async fn an_api_token_is_shown_once_stored_as_a_hash_and_records_its_use() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    let (id, secret) = app.api_token(&admin, "ml", "member").await;
    assert!(secret.starts_with("fwy_") && secret.len() == 42, "{secret}");
    let me = app.send(call("GET", "/api/v1/me").token(&secret)).await;
    me.assert_status(200);
    assert_eq!(me.json()["team"], "ml");
    assert_eq!(me.json()["role"], "member");

    let list = app.send(call("GET", "/api/v1/teams/ml/tokens").token(&admin)).await;
    list.assert_status(200);
    let listed = &list.json()["items"][0];
    assert_eq!(listed["id"], id);
    assert!(listed.get("secret").is_none(), "the secret is never shown again");
    assert!(listed["last_used_at"].is_string(), "last use recorded: {listed}");
    assert_eq!(listed["prefix"], &secret[..8]);

    let stored: Vec<u8> = sqlx::query_scalar("select token_hash from api_tokens").fetch_one(&app.pool).await.unwrap();
    assert_eq!(stored.len(), 32);
    assert!(!String::from_utf8_lossy(&stored).contains(&secret[4..]));
}

#[tokio::test]
async fn a_revoked_api_token_fails_on_the_very_next_request() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    let (id, secret) = app.api_token(&admin, "ml", "member").await;
    assert_eq!(me_status(&app, &secret).await, 200);
    app.send(call("DELETE", &format!("/api/v1/teams/ml/tokens/{id}")).token(&admin)).await.assert_status(204);
    app.send(call("GET", "/api/v1/me").token(&secret)).await.assert_problem(401, "unauthenticated");
}

#[tokio::test]
async fn a_mistyped_api_token_is_rejected_by_its_checksum() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    let (_, secret) = app.api_token(&admin, "ml", "viewer").await;
    let mut typo = secret.into_bytes();
    typo[12] = if typo[12] == b'x' { b'y' } else { b'x' };
    let typo = String::from_utf8(typo).unwrap();
    assert_eq!(me_status(&app, &typo).await, 401);
}

#[tokio::test]
async fn api_tokens_need_a_future_expiry_within_a_year_and_cannot_be_admins() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    let mint = |body: serde_json::Value| app.send(call("POST", "/api/v1/teams/ml/tokens").token(&admin).json(&body));
    let past = (chrono::Utc::now() - chrono::Duration::days(1)).to_rfc3339();
    let far = (chrono::Utc::now() + chrono::Duration::days(400)).to_rfc3339();
    let soon = (chrono::Utc::now() + chrono::Duration::days(1)).to_rfc3339();
    let r = mint(json!({"name": "ci", "role": "member"})).await;
    assert_eq!(r.assert_problem(422, "validation_failed")["field"], "expires_at");
    let r = mint(json!({"name": "ci", "role": "member", "expires_at": past})).await;
    assert_eq!(r.assert_problem(422, "validation_failed")["errors"][0]["code"], "in_the_past");
    let r = mint(json!({"name": "ci", "role": "member", "expires_at": far})).await;
    assert_eq!(r.assert_problem(422, "validation_failed")["errors"][0]["code"], "too_far");
    let r = mint(json!({"name": "ci", "role": "admin", "expires_at": soon})).await;
    assert_eq!(r.assert_problem(422, "validation_failed")["field"], "role");
}

#[tokio::test]
async fn a_ci_token_cannot_see_another_teams_objects() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.team(&admin, "team-a", None).await;
    app.team(&admin, "team-b", None).await;
    let (_, token_b) = app.api_token(&admin, "team-b", "member").await;
    for path in [
        "/api/v1/teams/team-a",
        "/api/v1/teams/team-a/quotas",
        "/api/v1/teams/team-a/members",
        "/api/v1/teams/team-a/budgets",
    ] {
        app.send(call("GET", path).token(&token_b)).await.assert_problem(404, "not_found");
    }
    // A team that does not exist looks exactly the same.
    let missing = app.send(call("GET", "/api/v1/teams/no-such-team").token(&token_b)).await;
    let foreign = app.send(call("GET", "/api/v1/teams/team-a").token(&token_b)).await;
    assert_eq!(missing.body, foreign.body);
    let list = app.send(call("GET", "/api/v1/teams").token(&token_b)).await;
    let names: Vec<_> = list.json()["items"].as_array().unwrap().iter().map(|t| t["name"].clone()).collect();
    assert_eq!(names, vec![json!("team-b")]);
}

#[tokio::test]
async fn a_department_admin_administers_its_child_teams() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.team(&admin, "research", None).await;
    app.team(&admin, "vision", Some("research")).await;
    app.team(&admin, "other", None).await;
    let head = app.user(&admin, "head", None).await;
    app.member(&admin, "research", "head", "admin").await;
    app.send(call("GET", "/api/v1/teams/vision/tokens").token(&head)).await.assert_status(200);
    app.send(call("GET", "/api/v1/teams/other").token(&head)).await.assert_status(404);
    let list = app.send(call("GET", "/api/v1/teams").token(&head)).await;
    let names: Vec<_> = list.json()["items"].as_array().unwrap().iter().map(|t| t["name"].clone()).collect();
    assert_eq!(names, vec![json!("research"), json!("vision")]);
}

#[tokio::test]
async fn a_disabled_user_is_locked_out_at_once_including_live_access_tokens() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    let alice = app.user(&admin, "alice", None).await;
    assert_eq!(me_status(&app, &alice).await, 200);
    app.send(call("PATCH", "/api/v1/users/alice").token(&admin).json(&json!({"disabled": true})))
        .await
        .assert_status(200);
    assert_eq!(me_status(&app, &alice).await, 401);
    let r = app
        .send(
            call("POST", "/api/v1/auth/token")
                .json(&json!({"username": "alice", "password": fairway_tests::USER_PASSWORD})),
        )
        .await;
    r.assert_problem(401, "invalid_credentials");
}

#[tokio::test]
async fn a_platform_admin_cannot_demote_or_disable_themselves() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    let r = app.send(call("PATCH", "/api/v1/users/admin").token(&admin).json(&json!({"platform_role": null}))).await;
    assert_eq!(r.assert_problem(422, "validation_failed")["errors"][0]["code"], "self_demotion");
    let r = app.send(call("PATCH", "/api/v1/users/admin").token(&admin).json(&json!({"disabled": true}))).await;
    assert_eq!(r.assert_problem(422, "validation_failed")["field"], "disabled");
    assert_eq!(me_status(&app, &admin).await, 200);
}

#[tokio::test]
async fn users_change_their_own_password_with_the_current_one() {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    let alice = app.user(&admin, "alice", None).await;
    let change = |current: &str| {
        app.send(
            call("POST", "/api/v1/me/password")
                .token(&alice)
                .json(&json!({"current_password": current, "new_password": "a-brand-new-password"})),
        )
    };
    let r = change("wrong-password-123").await;
    assert_eq!(r.assert_problem(422, "validation_failed")["field"], "current_password");
    change(fairway_tests::USER_PASSWORD).await.assert_status(204);
    app.login("alice", "a-brand-new-password").await;
    let old = app
        .send(
            call("POST", "/api/v1/auth/token")
                .json(&json!({"username": "alice", "password": fairway_tests::USER_PASSWORD})),
        )
        .await;
    old.assert_status(401);
}

/// A password sign-in of `username` from the client at `address` (behind a trusted proxy).
async fn sign_in_from(app: &TestApp, username: &str, password: &str, address: &str) -> TestResponse {
    app.send(
        call("POST", "/api/v1/auth/token")
            .header("x-forwarded-for", address)
            .json(&json!({"username": username, "password": password})),
    )
    .await
}

#[tokio::test]
async fn a_burst_of_wrong_passwords_is_slowed_then_refused_while_the_user_signs_in_from_elsewhere() {
    let app = TestApp::spawn_with(|c| c.trust_forwarded_for = true).await;
    let admin = app.admin().await;
    app.user(&admin, "dana", None).await;
    let guesser = "198.51.100.7";
    for attempt in 1..=5 {
        let r = sign_in_from(&app, "dana", &format!("guess-{attempt}-xxxxxx"), guesser).await;
        r.assert_problem(401, "invalid_credentials");
    }
    // The sixth attempt comes before the first wait is over: refused unchecked.
    for attempt in 6..=12 {
        let r = sign_in_from(&app, "dana", &format!("guess-{attempt}-xxxxxx"), guesser).await;
        let problem = r.assert_problem(429, "too_many_attempts");
        let wait: u64 = r.header("retry-after").expect("Retry-After").parse().expect("seconds");
        assert!((1..=900).contains(&wait), "a bounded wait, not a lock-out: {wait} s");
        assert!(problem["detail"].as_str().unwrap().contains("try again"), "{problem}");
    }
    // Even the right password waits at the guesser's address...
    sign_in_from(&app, "dana", USER_PASSWORD, guesser).await.assert_problem(429, "too_many_attempts");
    // ...while dana, from her own address, signs in at once.
    sign_in_from(&app, "dana", USER_PASSWORD, "192.0.2.10").await.assert_status(200);
}

#[tokio::test]
async fn every_sign_in_and_wrong_password_is_in_the_platform_audit_log_and_a_throttled_attempt_is_not() {
    let app = TestApp::spawn_with(|c| c.trust_forwarded_for = true).await;
    let admin = app.admin().await;
    app.user(&admin, "dana", None).await;
    let guesser = "198.51.100.7";
    for attempt in 1..=8 {
        let r = sign_in_from(&app, "dana", &format!("guess-{attempt}-xxxxxx"), guesser).await;
        assert!(matches!(r.status.as_u16(), 401 | 429), "{}", r.status);
    }
    sign_in_from(&app, "dana", USER_PASSWORD, "192.0.2.10").await.assert_status(200);
    sign_in_from(&app, "nobody", "whatever-it-is", "192.0.2.11").await.assert_problem(401, "invalid_credentials");

    let log = app.send(call("GET", "/api/v1/audit-log?limit=200").token(&admin)).await;
    log.assert_status(200);
    let items = log.json()["items"].as_array().expect("items").clone();
    let of = |action: &str, name: &str| -> Vec<Value> {
        items.iter().filter(|i| i["action"] == action && i["object_id"] == name).cloned().collect()
    };
    // Five wrong passwords were checked; the three refused unchecked wrote nothing.
    let failed = of("user.sign_in_failed", "dana");
    assert_eq!(failed.len(), 5, "{items:?}");
    assert!(failed.iter().all(|f| f["actor"] == "anonymous" && f["after"]["address"] == guesser), "{failed:?}");
    assert_eq!(failed[0]["after"]["via"], "api");
    // The harness signed dana in once when it made her; then she did, from her address.
    let signed_in = of("user.sign_in", "dana");
    assert_eq!(signed_in.len(), 2, "{items:?}");
    assert_eq!(
        (signed_in[0]["actor"].as_str(), signed_in[0]["after"]["address"].as_str()),
        (Some("user:dana"), Some("192.0.2.10"))
    );
    // A name no user has is recorded as typed.
    assert_eq!(of("user.sign_in_failed", "nobody").len(), 1);
}

#[tokio::test]
async fn an_untrusted_x_forwarded_for_cannot_buy_a_guesser_fresh_attempts() {
    // The default trusts no proxy: the header is the client's own word and is ignored.
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.user(&admin, "erin", None).await;
    for attempt in 1..=5 {
        sign_in_from(&app, "erin", "wrong-password-x", &format!("203.0.113.{attempt}"))
            .await
            .assert_problem(401, "invalid_credentials");
    }
    sign_in_from(&app, "erin", "wrong-password-x", "203.0.113.99").await.assert_problem(429, "too_many_attempts");
}
