//! Signing in to the portal through a real OpenID provider (npm `oidc-provider`, started on
//! loopback by `fairway_tests::oidc`), over real HTTP: the code flow with PKCE, users created
//! on first sign-in, provider groups mapped to teams and roles at every sign-in, sign-ins
//! that must be refused, and RP-initiated logout.

use std::collections::BTreeMap;

use fairway::{
    config::GroupGrant,
    domain::{PlatformRole, TeamRole},
};
use fairway_tests::{call, oidc, oidc::OidcPeer, TestApp};
use reqwest::{header, redirect, StatusCode};
use serde_json::Value;

/// The service on a real socket with provider `corp` (the peer) configured, its group grants
/// `grants` as `(group, team, role)`, and `ops` granting platform admin.
struct Sso {
    app: TestApp,
    peer: OidcPeer,
    base: String,
}

async fn sso(grants: &[(&str, &str, TeamRole)]) -> Sso {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let peer = OidcPeer::start(&[format!("{base}/login/oidc/corp/callback")], &[format!("{base}/login")]).await;
    let mut groups: Vec<GroupGrant> = grants
        .iter()
        .map(|(group, team, role)| GroupGrant {
            group: (*group).into(),
            team: Some((*team).into()),
            role: Some(*role),
            platform_role: None,
        })
        .collect();
    groups.push(GroupGrant {
        group: "ops".into(),
        team: None,
        role: None,
        platform_role: Some(PlatformRole::PlatformAdmin),
    });
    let provider = peer.provider(groups);
    let public = base.clone();
    let app = TestApp::spawn_with(move |c| {
        c.public_url = Some(public);
        c.oidc_providers = vec![provider];
    })
    .await;
    let service = app.router.clone().into_make_service_with_connect_info::<std::net::SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await.expect("serve") });
    Sso { app, peer, base }
}

/// A browser stand-in: no redirects followed, cookies kept by name.
#[derive(Default)]
struct Browser {
    cookies: BTreeMap<String, String>,
}

impl Browser {
    fn client() -> reqwest::Client {
        reqwest::Client::builder().redirect(redirect::Policy::none()).build().expect("client")
    }

    async fn get(&mut self, url: &str) -> reqwest::Response {
        let cookie = self.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ");
        let response = Self::client().get(url).header(header::COOKIE, cookie).send().await.expect("GET");
        self.keep(&response);
        response
    }

    async fn post_form(&mut self, url: &str, form: &[(&str, &str)]) -> reqwest::Response {
        let cookie = self.cookies.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("; ");
        let response = Self::client()
            .post(url)
            .header(header::COOKIE, cookie)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(serde_urlencoded::to_string(form).unwrap())
            .send()
            .await
            .expect("POST");
        self.keep(&response);
        response
    }

    fn keep(&mut self, response: &reqwest::Response) {
        for set in response.headers().get_all(header::SET_COOKIE) {
            let pair = set.to_str().unwrap().split(';').next().unwrap();
            let (name, value) = pair.split_once('=').unwrap();
            if value.is_empty() {
                self.cookies.remove(name);
            } else {
                self.cookies.insert(name.into(), value.into());
            }
        }
    }
}

fn location(response: &reqwest::Response) -> String {
    response.headers().get(header::LOCATION).expect("a redirect").to_str().unwrap().to_owned()
}

impl Sso {
    /// Begins a sign-in in `browser` and signs in at the provider as `account`: the callback
    /// URL the provider sends the browser back to, not yet visited.
    async fn to_provider_and_back(&self, browser: &mut Browser, account: &str) -> String {
        let begun = browser.get(&format!("{}/login/oidc/corp", self.base)).await;
        assert_eq!(begun.status(), StatusCode::SEE_OTHER);
        assert!(browser.cookies.contains_key("fairway_sign_in"), "the sign-in's state is kept in a cookie");
        oidc::authorize_as(&location(&begun), account, &format!("{}/login/oidc/corp/callback", self.base)).await
    }

    /// A whole sign-in as `account`; the browser holds the session afterwards.
    async fn sign_in(&self, account: &str) -> Browser {
        let mut browser = Browser::default();
        let callback = self.to_provider_and_back(&mut browser, account).await;
        let landed = browser.get(&callback).await;
        assert_eq!(landed.status(), StatusCode::SEE_OTHER, "{}", landed.text().await.unwrap());
        assert_eq!(location(&landed), "/");
        assert!(browser.cookies.contains_key("fairway_session"));
        assert!(!browser.cookies.contains_key("fairway_sign_in"), "the sign-in cookie is cleared");
        browser
    }

    async fn members(&self, admin: &str, team: &str) -> Vec<Value> {
        let r = self.app.send(call("GET", &format!("/api/v1/teams/{team}/members")).token(admin)).await;
        r.assert_status(200);
        r.json()["items"].as_array().expect("items").clone()
    }

    async fn user(&self, admin: &str, username: &str) -> Value {
        let r = self.app.send(call("GET", "/api/v1/users?limit=200").token(admin)).await;
        r.assert_status(200);
        r.json()["items"].as_array().unwrap().iter().find(|u| u["username"] == username).expect("the user").clone()
    }

    async fn audit_actions(&self, admin: &str) -> Vec<String> {
        let r = self.app.send(call("GET", "/api/v1/audit-log?limit=200").token(admin)).await;
        r.assert_status(200);
        r.json()["items"].as_array().unwrap().iter().map(|e| e["action"].as_str().unwrap().to_owned()).collect()
    }
}

fn member<'a>(members: &'a [Value], username: &str) -> Option<&'a Value> {
    members.iter().find(|m| m["username"] == username)
}

#[tokio::test]
async fn signing_in_through_the_provider_creates_the_user_and_grants_what_its_groups_map_to() {
    let sso = sso(&[("ml-admins", "ml", TeamRole::Admin), ("research-readers", "research", TeamRole::Viewer)]).await;
    let admin = sso.app.admin().await;
    sso.app.team(&admin, "ml", None).await;
    sso.app.team(&admin, "research", None).await;
    sso.peer.set_groups("alice", &["ml-admins", "research-readers", "unmapped"]).await;

    let mut browser = sso.sign_in("alice").await;
    let home = browser.get(&format!("{}/", sso.base)).await.text().await.unwrap();
    assert!(home.contains("alice"), "the portal shows who is signed in");
    assert!(home.contains("/teams/ml") && home.contains("/teams/research"), "both teams are listed: {home}");

    let ml = sso.members(&admin, "ml").await;
    let alice = member(&ml, "alice").expect("alice is a member of ml");
    assert_eq!(alice["role"], "admin");
    assert_eq!(alice["source"], "oidc:corp", "the API says the provider granted it");
    assert_eq!(member(&sso.members(&admin, "research").await, "alice").unwrap()["role"], "viewer");
    // She administers ml in the portal: its members page says where memberships came from.
    let page = browser.get(&format!("{}/teams/ml/members", sso.base)).await;
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.text().await.unwrap().contains("provider corp"));

    let actions = sso.audit_actions(&admin).await;
    for action in ["user.create", "member.add", "user.sign_in"] {
        assert!(actions.iter().any(|a| a == action), "{action} is audited: {actions:?}");
    }
    // She has no password: the password sign-in cannot be used for her account.
    let r = sso
        .app
        .send(call("POST", "/api/v1/auth/token").json(&serde_json::json!({"username": "alice", "password": "!"})))
        .await;
    r.assert_status(401);
}

#[tokio::test]
async fn a_group_removed_at_the_provider_removes_the_membership_at_the_next_sign_in_and_leaves_hand_made_ones() {
    let sso = sso(&[("ml-users", "ml", TeamRole::Member), ("vision-users", "vision", TeamRole::Member)]).await;
    let admin = sso.app.admin().await;
    for team in ["ml", "vision", "infra"] {
        sso.app.team(&admin, team, None).await;
    }
    sso.peer.set_groups("bob", &["ml-users", "vision-users", "ops"]).await;
    let mut bob = sso.sign_in("bob").await;
    // As a platform admin he sees how each user signs in.
    let users_page = bob.get(&format!("{}/admin/users", sso.base)).await.text().await.unwrap();
    assert!(users_page.contains("through corp") && users_page.contains("with a password"), "{users_page}");
    assert!(member(&sso.members(&admin, "vision").await, "bob").is_some());
    assert_eq!(
        sso.user(&admin, "bob").await["platform_role"],
        "platform-admin",
        "the ops group makes him a platform admin"
    );
    // An admin gives him infra by hand; it is not the provider's to take away.
    sso.app.member(&admin, "infra", "bob", "viewer").await;

    sso.peer.set_groups("bob", &["ml-users"]).await;
    sso.sign_in("bob").await;
    assert!(member(&sso.members(&admin, "vision").await, "bob").is_none(), "vision was removed");
    assert_eq!(member(&sso.members(&admin, "ml").await, "bob").unwrap()["role"], "member", "ml stays");
    let infra = sso.members(&admin, "infra").await;
    assert!(member(&infra, "bob").unwrap().get("source").is_none(), "the hand-made membership stays, made by hand");
    assert!(sso.user(&admin, "bob").await["platform_role"].is_null(), "leaving ops takes the platform role away");
    let actions = sso.audit_actions(&admin).await;
    assert!(actions.iter().any(|a| a == "member.remove"), "{actions:?}");
    let ids: i64 = sqlx::query_scalar("select count(*) from user_identities").fetch_one(&sso.app.pool).await.unwrap();
    assert_eq!(ids, 1, "the second sign-in found the same user by subject");
}

#[tokio::test]
async fn an_answer_without_this_browsers_state_a_replayed_answer_and_a_replayed_code_are_refused() {
    let sso = sso(&[]).await;
    let admin = sso.app.admin().await;

    // No state at all.
    let mut browser = Browser::default();
    let callback = sso.to_provider_and_back(&mut browser, "carol").await;
    let without_state: String = {
        let (path, query) = callback.split_once('?').unwrap();
        let kept: Vec<(String, String)> =
            form_urlencoded::parse(query.as_bytes()).into_owned().filter(|(k, _)| k != "state").collect();
        format!("{path}?{}", serde_urlencoded::to_string(&kept).unwrap())
    };
    let mut probe = Browser { cookies: browser.cookies.clone() };
    let r = probe.get(&without_state).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.text().await.unwrap().contains("carries no state"));

    // The answer carried into another browser (one that began no sign-in, or its own).
    let mut other = Browser::default();
    let r = other.get(&callback).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.text().await.unwrap().contains("not belong to a sign-in begun in this browser"));
    let mut attacker = Browser::default();
    let _ = sso.to_provider_and_back(&mut attacker, "mallory").await;
    assert_eq!(attacker.get(&callback).await.status(), StatusCode::UNAUTHORIZED, "a wrong state is refused");

    // The right browser signs in once; the same answer again is refused.
    let first = browser.get(&callback).await;
    assert_eq!(first.status(), StatusCode::SEE_OTHER);
    let mut again = Browser { cookies: browser.cookies.clone() };
    again.cookies.insert("fairway_sign_in".into(), form_state(&callback));
    let replay = again.get(&callback).await;
    assert_eq!(replay.status(), StatusCode::UNAUTHORIZED);
    assert!(replay.text().await.unwrap().contains("already used or has expired"));

    // The code alone, replayed under a fresh sign-in's state: the provider refuses it, and so
    // do we (a refusal, not a provider failure).
    let mut fresh = Browser::default();
    let fresh_callback = sso.to_provider_and_back(&mut fresh, "carol").await;
    let code = form_value(&callback, "code");
    let forged = fresh_callback.replace(&form_value(&fresh_callback, "code"), &code);
    let r = fresh.get(&forged).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.text().await.unwrap().contains("refused the code"));

    let failures: i64 = sqlx::query_scalar("select count(*) from audit_log where action = 'user.sign_in_failed'")
        .fetch_one(&sso.app.pool)
        .await
        .unwrap();
    assert!(failures >= 4, "each refusal is audited, saw {failures}");
    let users = sso.app.send(call("GET", "/api/v1/users").token(&admin)).await.json();
    let names: Vec<&str> = users["items"].as_array().unwrap().iter().filter_map(|u| u["username"].as_str()).collect();
    assert!(names.contains(&"carol") && !names.contains(&"mallory"), "{names:?}");
}

fn form_value(url: &str, key: &str) -> String {
    let query = url.split_once('?').unwrap().1;
    form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == key).map(|(_, v)| v.into_owned()).unwrap()
}

fn form_state(url: &str) -> String {
    form_value(url, "state")
}

#[tokio::test]
async fn signing_out_of_a_provider_session_ends_it_at_the_provider_too() {
    let sso = sso(&[]).await;
    let mut browser = sso.sign_in("dave").await;
    let page = browser.get(&format!("{}/", sso.base)).await.text().await.unwrap();
    let csrf = page.split("name=\"csrf\" value=\"").nth(1).and_then(|s| s.split('"').next()).expect("csrf").to_owned();
    let out = browser.post_form(&format!("{}/logout", sso.base), &[("csrf", &csrf)]).await;
    assert_eq!(out.status(), StatusCode::OK);
    assert!(!browser.cookies.contains_key("fairway_session"), "Fairway's session cookie is cleared");
    let text = out.text().await.unwrap();
    let end_session = text
        .split("id=\"provider-logout\" href=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("a link")
        .replace("&#38;", "&")
        .replace("&amp;", "&");
    assert!(end_session.starts_with(&sso.peer.issuer), "{end_session} in {text}");
    assert!(end_session.contains("id_token_hint="), "{end_session}");
    assert_eq!(form_value(&end_session, "post_logout_redirect_uri"), format!("{}/login", sso.base));
    // Fairway's own session is over.
    let home = browser.get(&format!("{}/", sso.base)).await;
    assert_eq!(home.status(), StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn with_password_sign_in_turned_off_only_the_provider_signs_people_in() {
    let app = TestApp::spawn_with(|c| c.password_sign_in = false).await;
    let r = app
        .send(
            call("POST", "/api/v1/auth/token")
                .json(&serde_json::json!({"username": "admin", "password": fairway_tests::ADMIN_PASSWORD})),
        )
        .await;
    let problem = r.assert_problem(401, "identity_refused");
    assert!(problem["detail"].as_str().unwrap().contains("password sign-in is turned off"), "{problem}");
    let page = app.send(call("GET", "/login")).await;
    page.assert_status(200);
    assert!(!String::from_utf8_lossy(&page.body).contains("type=\"password\""), "no password form is offered");
}

#[tokio::test]
async fn an_id_token_whose_nonce_is_not_this_sign_ins_is_refused_and_creates_no_user() {
    let sso = sso(&[]).await;
    let mut browser = Browser::default();
    let callback = sso.to_provider_and_back(&mut browser, "frank").await;
    // The token the provider issues carries the nonce this sign-in sent; the sign-in now
    // expects another one, as it would for a token injected from another sign-in.
    sqlx::query("update oidc_sign_ins set nonce = 'another-sign-ins-nonce'").execute(&sso.app.pool).await.unwrap();
    let r = browser.get(&callback).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.text().await.unwrap().contains("nonce is not this sign-in"));
    let users: i64 = sqlx::query_scalar("select count(*) from users where username = 'frank'")
        .fetch_one(&sso.app.pool)
        .await
        .unwrap();
    assert_eq!(users, 0);
}
