//! CI without secrets: a team trusts a CI issuer's ID tokens under a policy on their claims,
//! and a pipeline exchanges its job's ID token for a short-lived API token of the team
//! (`POST /api/v1/auth/token-exchange`). The tokens come from a real issuer on loopback (the
//! OpenID peer's CI issuer, signing with npm `jose`), fetched and verified as in production.

use fairway::config::CiIssuer;
use fairway_tests::{call, oidc::OidcPeer, TestApp, TestResponse};
use serde_json::{json, Value};

const GRANT: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ID_TOKEN: &str = "urn:ietf:params:oauth:token-type:id_token";

/// Team `ml` trusts `acme/train`'s main branch (policy `train-main`, member, default TTL);
/// team `cv` exists with no policy; `alice` is a member of `ml`, `vic` a viewer. The service
/// trusts the peer's CI issuer and `extra_issuers`.
struct Setup {
    app: TestApp,
    peer: OidcPeer,
    admin: String,
    alice: String,
    vic: String,
}

async fn setup() -> Setup {
    setup_with(&[]).await
}

async fn setup_with(extra_issuers: &[String]) -> Setup {
    let peer = OidcPeer::start(&[], &[]).await;
    let issuers: Vec<CiIssuer> = std::iter::once(peer.ci_issuer.clone())
        .chain(extra_issuers.iter().cloned())
        .map(|issuer| CiIssuer { issuer, algorithms: vec!["RS256".into()] })
        .collect();
    let app = TestApp::spawn_with(move |c| c.ci_issuers = issuers).await;
    let admin = app.admin().await;
    app.gpu_class(&admin, "h100").await;
    for team in ["ml", "cv"] {
        app.team(&admin, team, None).await;
        app.quota(&admin, team, "h100", 4, 0).await;
    }
    let alice = app.user(&admin, "alice", None).await;
    app.member(&admin, "ml", "alice", "member").await;
    let vic = app.user(&admin, "vic", None).await;
    app.member(&admin, "ml", "vic", "viewer").await;
    let s = Setup { app, peer, admin, alice, vic };
    let policy = json!({"name": "train-main", "issuer": s.peer.ci_issuer,
                        "conditions": {"repository": "acme/train", "ref": "refs/heads/main"}, "role": "member"});
    s.trust("ml", &policy).await.assert_status(201);
    s
}

fn job() -> Value {
    json!({"name": "ci-train", "gpu_class": "h100", "image": "registry.example/train:1", "command": ["python", "train.py"]})
}

impl Setup {
    async fn trust(&self, team: &str, policy: &Value) -> TestResponse {
        self.app.send(call("POST", &format!("/api/v1/teams/{team}/ci-trusts")).token(&self.admin).json(policy)).await
    }

    /// Exchanges `token` as a form, as OAuth clients send it.
    async fn exchange(&self, token: &str, team: Option<&str>) -> TestResponse {
        let mut form = vec![("grant_type", GRANT), ("subject_token", token), ("subject_token_type", ID_TOKEN)];
        if let Some(team) = team {
            form.push(("team", team));
        }
        let body = serde_urlencoded::to_string(&form).expect("form");
        self.app
            .send(
                call("POST", "/api/v1/auth/token-exchange").raw("application/x-www-form-urlencoded", body.into_bytes()),
            )
            .await
    }

    /// A token of the CI issuer, with `request` as `/test/ci/token` takes it.
    async fn ci_token(&self, request: Value) -> String {
        self.peer.ci_token(request).await
    }

    /// The API token an exchange of `token` yields.
    async fn exchanged(&self, token: &str, team: Option<&str>) -> Value {
        let r = self.exchange(token, team).await;
        r.assert_status(200);
        r.json()
    }

    /// Asserts that exchanging `token` is refused with 401 and a reason holding `words`.
    async fn refused(&self, token: &str, words: &str) {
        let r = self.exchange(token, None).await;
        let problem = r.assert_problem(401, "identity_refused");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(words), "expected {words:?} in {problem}");
    }
}

#[tokio::test]
async fn a_token_from_the_trusted_repository_exchanges_for_a_token_that_submits_to_its_team_and_no_other() {
    let s = setup().await;
    let token = s.ci_token(json!({})).await;
    let r = s.exchange(&token, Some("ml")).await;
    r.assert_status(200);
    assert_eq!(r.header("cache-control").as_deref(), Some("no-store"));
    let answer = r.json();
    assert_eq!(answer["token_type"], "Bearer");
    assert_eq!(answer["issued_token_type"], "urn:ietf:params:oauth:token-type:access_token");
    assert_eq!(
        (&answer["team"], &answer["role"], &answer["policy"]),
        (&json!("ml"), &json!("member"), &json!("train-main"))
    );
    let access = answer["access_token"].as_str().expect("access_token");
    assert!(access.starts_with("fwy_"), "{answer}");

    let me = s.app.send(call("GET", "/api/v1/me").token(access)).await;
    me.assert_status(200);
    assert_eq!(
        (&me.json()["kind"], &me.json()["name"], &me.json()["team"]),
        (&json!("token"), &json!("ci:train-main"), &json!("ml"))
    );
    let submitted = s.app.send(call("POST", "/api/v1/teams/ml/jobs").token(access).json(&job())).await;
    submitted.assert_status(201);
    assert!(submitted.json()["submitted_by"].as_str().unwrap_or_default().contains("ci:train-main"));
    s.app.send(call("GET", "/api/v1/teams/cv/jobs").token(access)).await.assert_problem(404, "not_found");
    s.app.send(call("POST", "/api/v1/teams/cv/jobs").token(access).json(&job())).await.assert_problem(404, "not_found");
    // A member token cannot manage the team's trust.
    let policy =
        json!({"name": "mine", "issuer": s.peer.ci_issuer, "conditions": {"repository": "*/*"}, "role": "member"});
    s.app.send(call("POST", "/api/v1/teams/ml/ci-trusts").token(access).json(&policy)).await.assert_status(403);

    // The team may be left out when only one team trusts the token, and JSON is taken too.
    let again = s
        .app
        .send(call("POST", "/api/v1/auth/token-exchange").json(&json!({
            "grant_type": GRANT, "subject_token": token, "subject_token_type": "urn:ietf:params:oauth:token-type:jwt"
        })))
        .await;
    again.assert_status(200);
    assert_eq!(again.json()["team"], "ml");
    assert_ne!(again.json()["access_token"], answer["access_token"], "each exchange mints its own token");
}

#[tokio::test]
async fn tokens_the_policy_does_not_trust_are_refused_with_the_reason() {
    let s = setup().await;
    let cases = [
        (json!({"claims": {"repository": "evil/train"}}), "no CI trust policy admits this token"),
        (json!({"claims": {"ref": "refs/heads/dev"}}), "no CI trust policy admits this token"),
        (json!({"audience": "someone-else"}), "another audience"),
        (json!({"expires_in": -120}), "expired"),
        (json!({"alg": "none"}), "signed with none"),
        (json!({"key": "foreign"}), "signing key is not one of the issuer's"),
        (json!({"issuer": "https://token.actions.githubusercontent.com"}), "not a CI issuer this service trusts"),
    ];
    for (request, words) in cases {
        let token = s.ci_token(request.clone()).await;
        s.refused(&token, words).await;
    }
    s.refused("not-a-jwt", "not a signed JWT").await;
    // A team with no policy for the issuer learns nothing more than a stranger.
    let good = s.ci_token(json!({})).await;
    let r = s.exchange(&good, Some("cv")).await;
    assert!(r.assert_problem(401, "identity_refused")["detail"].as_str().unwrap().contains("no CI trust policy"));
    let r = s.exchange(&good, Some("no-such-team")).await;
    assert!(r.assert_problem(401, "identity_refused")["detail"].as_str().unwrap().contains("no CI trust policy"));
    // Nothing was minted for any of them.
    let tokens = s.app.send(call("GET", "/api/v1/teams/ml/tokens").token(&s.admin)).await;
    assert_eq!(tokens.json()["items"].as_array().map(Vec::len), Some(0), "{}", tokens.json());
}

#[tokio::test]
async fn after_the_issuer_rotates_its_key_a_token_signed_with_the_new_one_still_exchanges() {
    let s = setup().await;
    s.exchanged(&s.ci_token(json!({})).await, None).await;
    let kid = s.peer.rotate_ci_key().await;
    let token = s.ci_token(json!({})).await;
    let header = token.split('.').next().and_then(|h| {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(h).ok()
    });
    let header: Value = serde_json::from_slice(&header.expect("a JWS header")).expect("JSON");
    assert_eq!(header["kid"], kid.as_str(), "signed with the new key, which Fairway has not seen yet");
    assert_eq!(s.exchanged(&token, None).await["policy"], "train-main");
}

#[tokio::test]
async fn the_exchanged_token_lives_as_long_as_the_policy_says_and_is_refused_once_expired() {
    let s = setup().await;
    let short = json!({"name": "eval", "issuer": s.peer.ci_issuer, "conditions": {"repository": "acme/eval"},
                       "role": "viewer", "token_ttl_seconds": 120});
    let created = s.trust("ml", &short).await;
    created.assert_status(201);
    assert_eq!(created.json()["token_ttl_seconds"], 120);
    let before = chrono::Utc::now();
    let answer = s.exchanged(&s.ci_token(json!({"claims": {"repository": "acme/eval"}})).await, None).await;
    assert_eq!((answer["expires_in"].as_i64(), &answer["role"]), (Some(120), &json!("viewer")));
    let access = answer["access_token"].as_str().unwrap();

    let listed = s.app.send(call("GET", "/api/v1/teams/ml/tokens").token(&s.admin)).await.json();
    let row = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "ci:eval")
        .expect("the token is listed")
        .clone();
    let expires: chrono::DateTime<chrono::Utc> = row["expires_at"].as_str().unwrap().parse().unwrap();
    let lives = (expires - before).num_seconds();
    assert!((119..=125).contains(&lives), "expires {lives} s after the exchange: {row}");
    assert_eq!(row["role"], "viewer");
    assert!(row.get("created_by").is_none(), "no person minted it: {row}");
    // A viewer token reads but does not submit.
    s.app.send(call("GET", "/api/v1/teams/ml/jobs").token(access)).await.assert_status(200);
    s.app.send(call("POST", "/api/v1/teams/ml/jobs").token(access).json(&job())).await.assert_status(403);

    // Two minutes later (aged here rather than waited for), it no longer works.
    sqlx::query("update api_tokens set expires_at = now() - interval '1 second' where name = 'ci:eval'")
        .execute(&s.app.pool)
        .await
        .unwrap();
    s.app.send(call("GET", "/api/v1/teams/ml/jobs").token(access)).await.assert_problem(401, "unauthenticated");
}

#[tokio::test]
async fn wildcard_ref_patterns_admit_every_release_branch_and_nothing_else() {
    let s = setup().await;
    let release = json!({"name": "release", "issuer": s.peer.ci_issuer, "role": "viewer",
                         "conditions": {"repository": "acme/train", "ref": "refs/heads/release/*"}});
    s.trust("ml", &release).await.assert_status(201);
    for branch in ["refs/heads/release/1.4", "refs/heads/release/2025/q1"] {
        let token = s.ci_token(json!({"claims": {"ref": branch}})).await;
        assert_eq!(s.exchanged(&token, None).await["policy"], "release", "{branch}");
    }
    for branch in ["refs/heads/feature/release/1", "refs/heads/releases", "refs/tags/release/1"] {
        s.refused(&s.ci_token(json!({"claims": {"ref": branch}})).await, "no CI trust policy admits").await;
    }
    // Main matches only `train-main`, which grants more.
    let main = s.exchanged(&s.ci_token(json!({})).await, None).await;
    assert_eq!((&main["policy"], &main["role"]), (&json!("train-main"), &json!("member")));
}

#[tokio::test]
async fn a_token_two_teams_trust_must_name_its_team() {
    let s = setup().await;
    let policy =
        json!({"name": "shared", "issuer": s.peer.ci_issuer, "conditions": {"repository": "acme/*"}, "role": "viewer"});
    s.trust("cv", &policy).await.assert_status(201);
    let token = s.ci_token(json!({})).await;
    let ambiguous = s.exchange(&token, None).await.assert_problem(422, "validation_failed");
    assert_eq!(ambiguous["field"], "team");
    assert_eq!(s.exchanged(&token, Some("cv")).await["team"], "cv");
    assert_eq!(s.exchanged(&token, Some("ml")).await["team"], "ml");
}

#[tokio::test]
async fn only_team_admins_create_and_delete_policies_and_a_bad_policy_names_its_field() {
    let s = setup().await;
    let good = json!({"name": "nightly", "issuer": s.peer.ci_issuer, "conditions": {"repository": "acme/train"}, "role": "viewer"});
    let as_member = s.app.send(call("POST", "/api/v1/teams/ml/ci-trusts").token(&s.alice).json(&good)).await;
    as_member.assert_problem(403, "forbidden");
    let listed = s.app.send(call("GET", "/api/v1/teams/ml/ci-trusts").token(&s.vic)).await;
    listed.assert_status(200);
    let items = listed.json()["items"].clone();
    assert_eq!(items.as_array().map(Vec::len), Some(1), "{items}");
    assert_eq!(items[0]["name"], "train-main");
    assert_eq!(items[0]["audience"], "fairway", "the default audience");
    assert_eq!(items[0]["token_ttl_seconds"], 900, "the default lifetime");
    assert_eq!(items[0]["conditions"]["ref"], "refs/heads/main");
    let one = s.app.send(call("GET", "/api/v1/teams/ml/ci-trusts/train-main").token(&s.alice)).await;
    assert_eq!(one.json()["created_by"], "user:admin");
    s.app.send(call("GET", "/api/v1/teams/ml/ci-trusts/nope").token(&s.alice)).await.assert_problem(404, "not_found");
    s.app.send(call("GET", "/api/v1/teams/ml/ci-trusts").token(&s.admin)).await.assert_status(200);
    s.app
        .send(call("DELETE", "/api/v1/teams/ml/ci-trusts/train-main").token(&s.alice))
        .await
        .assert_problem(403, "forbidden");

    let with = |change: Value| {
        let mut body = good.clone();
        for (k, v) in change.as_object().unwrap() {
            if v.is_null() {
                body.as_object_mut().unwrap().remove(k);
            } else {
                body[k] = v.clone();
            }
        }
        body
    };
    let cases = [
        (with(json!({"conditions": {}})), "conditions"),
        (with(json!({"conditions": null})), "conditions"),
        (with(json!({"issuer": "https://gitlab.example"})), "issuer"),
        (with(json!({"role": "admin"})), "role"),
        (with(json!({"role": "owner"})), "role"),
        (with(json!({"token_ttl_seconds": 30})), "token_ttl_seconds"),
        (with(json!({"token_ttl_seconds": 7200})), "token_ttl_seconds"),
        (with(json!({"conditions": {"aud": "fairway"}})), "conditions.aud"),
        (with(json!({"conditions": {"ref": "*"}})), "conditions.ref"),
        (with(json!({"conditions": {"ref": 1}})), "conditions.ref"),
        (with(json!({"name": "Nightly Build"})), "name"),
        (with(json!({"audience": ""})), "audience"),
        (with(json!({"colour": "blue"})), "colour"),
    ];
    for (body, field) in cases {
        let r = s.trust("ml", &body).await;
        let problem = r.assert_problem(422, "validation_failed");
        assert_eq!(problem["field"], field, "{body}: {problem}");
    }
    let unknown = s.trust("ml", &with(json!({"issuer": "https://gitlab.example"}))).await.json();
    assert!(unknown["detail"].as_str().unwrap().contains(&s.peer.ci_issuer), "lists the configured issuers: {unknown}");
    s.trust("ml", &good).await.assert_status(201);
    let twice = s.trust("ml", &good).await.assert_problem(409, "ci_trust_exists");
    assert_eq!(twice["field"], "name");
}

#[tokio::test]
async fn deleting_a_policy_shuts_its_pipelines_out_at_once() {
    let s = setup().await;
    let token = s.ci_token(json!({})).await;
    let access = s.exchanged(&token, None).await["access_token"].as_str().unwrap().to_owned();
    s.app.send(call("GET", "/api/v1/me").token(&access)).await.assert_status(200);
    s.app.send(call("DELETE", "/api/v1/teams/ml/ci-trusts/train-main").token(&s.admin)).await.assert_status(204);
    s.app.send(call("GET", "/api/v1/me").token(&access)).await.assert_problem(401, "unauthenticated");
    s.refused(&token, "no CI trust policy admits").await;
    s.app
        .send(call("DELETE", "/api/v1/teams/ml/ci-trusts/train-main").token(&s.admin))
        .await
        .assert_problem(404, "not_found");
}

#[tokio::test]
async fn the_audit_log_says_which_pipeline_came_in_under_which_policy_and_never_the_token() {
    let s = setup().await;
    let token = s.ci_token(json!({"claims": {"environment": "release-gate"}})).await;
    let access = s.exchanged(&token, None).await["access_token"].as_str().unwrap().to_owned();
    let log = s.app.send(call("GET", "/api/v1/teams/ml/audit-log?limit=200").token(&s.admin)).await;
    log.assert_status(200);
    let text = String::from_utf8_lossy(&log.body).into_owned();
    assert!(!text.contains(&access), "the audit log holds the secret");
    assert!(!text.contains(&token), "the audit log holds the ID token");
    let entries = log.json()["items"].as_array().cloned().unwrap_or_default();
    let exchange = entries.iter().find(|e| e["action"] == "token.exchange").unwrap_or_else(|| panic!("{text}"));
    assert_eq!(exchange["actor"], "ci:repo:acme/train:ref:refs/heads/main");
    let after = &exchange["after"];
    assert_eq!(after["issuer"], s.peer.ci_issuer.as_str());
    assert_eq!(after["subject"], "repo:acme/train:ref:refs/heads/main");
    assert_eq!(after["repository"], "acme/train");
    assert_eq!(after["ref"], "refs/heads/main");
    assert_eq!(after["environment"], "release-gate");
    assert_eq!(after["policy"], "train-main");
    assert!(after["jti"].is_string(), "{after}");
    assert_eq!(after["token"]["name"], "ci:train-main");
    let create = entries.iter().find(|e| e["action"] == "ci_trust.create").expect("the policy's creation");
    assert_eq!(create["actor"], "user:admin");
}

#[tokio::test]
async fn malformed_exchange_requests_are_400s_that_name_the_parameter() {
    let s = setup().await;
    let token = s.ci_token(json!({})).await;
    let form = |pairs: &[(&str, &str)]| serde_urlencoded::to_string(pairs).unwrap().into_bytes();
    let post = |content_type: &'static str, body: Vec<u8>| {
        s.app.send(call("POST", "/api/v1/auth/token-exchange").raw(content_type, body))
    };
    let base = [("grant_type", GRANT), ("subject_token", token.as_str()), ("subject_token_type", ID_TOKEN)];
    let without = |name: &str| -> Vec<(&str, &str)> { base.iter().copied().filter(|(n, _)| *n != name).collect() };
    let with = |name: &'static str, value: &'static str| -> Vec<(&str, &str)> {
        let mut pairs = without(name);
        pairs.push((name, value));
        pairs
    };
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (without("grant_type"), "grant_type"),
        (with("grant_type", "client_credentials"), "grant_type"),
        (without("subject_token"), "subject_token"),
        (without("subject_token_type"), "subject_token_type"),
        (with("subject_token_type", "urn:ietf:params:oauth:token-type:saml2"), "subject_token_type"),
        (with("requested_token_type", "urn:ietf:params:oauth:token-type:jwt"), "requested_token_type"),
        (with("team", "ML Team"), "team"),
        (with("team", "ml\u{0}"), "team"),
        (with("actor_token", "x"), "actor_token"),
        ([base.as_slice(), &[("grant_type", GRANT)]].concat(), "grant_type"),
    ];
    for (pairs, field) in cases {
        let r = post("application/x-www-form-urlencoded", form(&pairs)).await;
        let problem = r.assert_problem(400, "malformed_request");
        assert_eq!(problem["field"], field, "{pairs:?}: {problem}");
    }
    let r = post("text/plain", form(&base)).await;
    assert_eq!(r.assert_problem(400, "malformed_request")["field"], "Content-Type");
    let r = post("application/json", b"{\"grant_type\": 1}".to_vec()).await;
    assert_eq!(r.assert_problem(400, "malformed_request")["field"], "grant_type");
    post("application/json", b"{not json".to_vec()).await.assert_problem(400, "malformed_body");
    post("application/x-www-form-urlencoded", b"%FF%FE=%00".to_vec()).await.assert_status(400);
}

#[tokio::test]
async fn an_issuer_that_cannot_be_reached_is_a_502_and_no_token() {
    // A loopback port that nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let gone = format!("http://127.0.0.1:{port}/ci");
    let s = setup_with(std::slice::from_ref(&gone)).await;
    let policy = json!({"name": "gone", "issuer": gone, "conditions": {"repository": "acme/train"}, "role": "member"});
    s.trust("ml", &policy).await.assert_status(201);
    let token = s.ci_token(json!({"issuer": gone})).await;
    let problem = s.exchange(&token, None).await.assert_problem(502, "provider_unavailable");
    assert!(problem["detail"].as_str().unwrap().contains(&gone), "{problem}");
}
