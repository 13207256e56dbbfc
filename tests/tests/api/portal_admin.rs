//! The portal's platform-admin forms for users and team budgets: what a platform admin does
//! there, what the API then shows, how a refused form reads, and what anyone else gets.

use chrono::{Datelike, Months, Utc};
use fairway_tests::{call, TestApp, USER_PASSWORD};
use serde_json::{json, Value};

use crate::portal::{body, csrf_in, form_of, post_form, sign_in};

/// Team `ml` with member alice, a stranger bob, and a second platform admin `ops` signed in
/// to the portal; the admin's API token and ops's session.
async fn setup() -> (TestApp, String, String) {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.gpu_class(&admin, "h100").await;
    app.team(&admin, "ml", None).await;
    app.user(&admin, "alice", None).await;
    app.member(&admin, "ml", "alice", "member").await;
    app.user(&admin, "bob", None).await;
    app.user(&admin, "ops", Some("platform-admin")).await;
    let ops = sign_in(&app, "ops").await;
    (app, admin, ops)
}

/// Whether `username` can sign in through the portal's form with the tests' password.
async fn can_sign_in(app: &TestApp, username: &str) -> bool {
    let form = form_of(&[("username", username), ("password", USER_PASSWORD)]);
    let r = app.send(call("POST", "/login").raw("application/x-www-form-urlencoded", form.into_bytes())).await;
    r.status.as_u16() == 303
}

/// The user `username` as the API lists them.
async fn api_user(app: &TestApp, admin: &str, username: &str) -> Option<Value> {
    let users = app.send(call("GET", "/api/v1/users?limit=200").token(admin)).await.json();
    let items = users["items"].as_array().expect("a page of users").clone();
    items.into_iter().find(|u| u["username"] == username)
}

/// ml's budgets as the API lists them.
async fn ml_budgets(app: &TestApp, admin: &str) -> Vec<Value> {
    let r = app.send(call("GET", "/api/v1/teams/ml/budgets").token(admin)).await;
    r.assert_status(200);
    r.json().as_array().expect("a list of budgets").clone()
}

/// The CSRF token of the signed-in `session`, from a page it may see.
async fn csrf_of(app: &TestApp, session: &str, path: &str) -> String {
    csrf_in(&body(&app.send(call("GET", path).header("cookie", session)).await))
}

#[tokio::test]
async fn a_platform_admin_creates_a_user_from_the_users_page_and_that_user_signs_in() {
    let (app, admin, ops) = setup().await;
    let admin_page = body(&app.send(call("GET", "/admin").header("cookie", &ops)).await);
    assert!(admin_page.contains("href=\"/admin/users\""), "the admin page links the users page: {admin_page}");
    let page = app.send(call("GET", "/admin/users").header("cookie", &ops)).await;
    page.assert_status(200);
    let page = body(&page);
    assert!(page.contains("alice") && page.contains("ops (you)"), "{page}");
    // Each user's teams, with the role in each.
    assert!(page.contains("<td data-label=\"Teams\">ml (member)</td>"), "alice's team: {page}");
    assert!(page.contains("<td data-label=\"Teams\">none</td>"), "bob has none: {page}");
    let csrf = csrf_in(&page);

    let form =
        form_of(&[("csrf", &csrf), ("username", "dana"), ("password", USER_PASSWORD), ("platform_role", "finance")]);
    let created = post_form(&app, &ops, "/admin/users", form).await;
    created.assert_status(200);
    let created = body(&created);
    assert!(created.contains("User dana created."), "{created}");
    assert!(!created.contains(USER_PASSWORD), "the password is never shown back");
    assert!(created.contains("<td data-label=\"User\">dana</td>"), "the list shows dana: {created}");

    let dana = api_user(&app, &admin, "dana").await.expect("the API lists dana");
    assert_eq!((&dana["platform_role"], &dana["disabled"]), (&json!("finance"), &json!(false)));
    let session = sign_in(&app, "dana").await;
    // As finance, dana opens the billing page.
    app.send(call("GET", "/billing").header("cookie", &session)).await.assert_status(200);
}

#[tokio::test]
async fn disabling_a_user_from_the_users_page_stops_their_sign_in_and_enabling_restores_it() {
    let (app, admin, ops) = setup().await;
    let alice = sign_in(&app, "alice").await;
    let csrf = csrf_of(&app, &ops, "/admin/users").await;

    let disabled = post_form(&app, &ops, "/admin/users/alice", form_of(&[("csrf", &csrf), ("disabled", "true")])).await;
    assert!(body(&disabled).contains("alice: platform role none, disabled: cannot sign in."), "{}", body(&disabled));
    assert!(!can_sign_in(&app, "alice").await, "a disabled user cannot sign in");
    let home = app.send(call("GET", "/").header("cookie", &alice)).await;
    assert_eq!(home.status.as_u16(), 303, "her open session ends too");
    assert_eq!(api_user(&app, &admin, "alice").await.expect("alice")["disabled"], json!(true));

    let enabled = post_form(&app, &ops, "/admin/users/alice", form_of(&[("csrf", &csrf), ("disabled", "false")])).await;
    assert!(body(&enabled).contains("alice: platform role none, may sign in."), "{}", body(&enabled));
    assert!(can_sign_in(&app, "alice").await, "enabled again, she signs in");

    // The role form gives and takes a platform role.
    let form = form_of(&[("csrf", &csrf), ("platform_role", "finance")]);
    let promoted = post_form(&app, &ops, "/admin/users/alice", form).await;
    assert!(body(&promoted).contains("alice: platform role finance, may sign in."), "{}", body(&promoted));
    assert_eq!(api_user(&app, &admin, "alice").await.expect("alice")["platform_role"], json!("finance"));
    post_form(&app, &ops, "/admin/users/alice", form_of(&[("csrf", &csrf), ("platform_role", "none")]))
        .await
        .assert_status(200);
    assert_eq!(api_user(&app, &admin, "alice").await.expect("alice").get("platform_role"), None);

    // An admin cannot lock themself out: both refusals are said in words and change nothing.
    let own = post_form(&app, &ops, "/admin/users/ops", form_of(&[("csrf", &csrf), ("disabled", "true")])).await;
    assert!(body(&own).contains("disabled: you cannot disable yourself"), "{}", body(&own));
    let form = form_of(&[("csrf", &csrf), ("platform_role", "none")]);
    let demoted = post_form(&app, &ops, "/admin/users/ops", form).await;
    assert!(
        body(&demoted).contains("platform_role: you cannot remove your own platform-admin role"),
        "{}",
        body(&demoted)
    );
    let me = api_user(&app, &admin, "ops").await.expect("ops");
    assert_eq!((&me["platform_role"], &me["disabled"]), (&json!("platform-admin"), &json!(false)));
    app.send(call("GET", "/admin/users").header("cookie", &ops)).await.assert_status(200);
}

#[tokio::test]
async fn a_bad_username_a_short_password_or_a_taken_name_is_shown_back_naming_the_field_and_nothing_is_created() {
    let (app, admin, ops) = setup().await;
    let csrf = csrf_of(&app, &ops, "/admin/users").await;
    let create = |username: &str, password: &str, role: &str| {
        form_of(&[("csrf", &csrf), ("username", username), ("password", password), ("platform_role", role)])
    };
    let before = app.send(call("GET", "/api/v1/users?limit=200").token(&admin)).await.json();

    let bad = post_form(&app, &ops, "/admin/users", create("Not A Name", "a-long-enough-secret", "none")).await;
    bad.assert_status(200);
    let bad = body(&bad);
    assert!(bad.contains("username: ") && bad.contains("value=\"Not A Name\""), "field named, input kept: {bad}");
    assert!(!bad.contains("a-long-enough-secret"), "the password typed is not sent back: {bad}");

    let short = body(&post_form(&app, &ops, "/admin/users", create("erin", "short", "finance")).await);
    assert!(short.contains("password: must be at least 12 characters"), "{short}");
    assert!(short.contains("value=\"erin\"") && short.contains("value=\"finance\" selected"), "input kept: {short}");

    let taken = body(&post_form(&app, &ops, "/admin/users", create("alice", "a-long-enough-secret", "none")).await);
    assert!(taken.contains("username: user alice already exists"), "{taken}");

    let role = body(&post_form(&app, &ops, "/admin/users", create("erin", "a-long-enough-secret", "owner")).await);
    assert!(role.contains("platform_role: none, platform-admin or finance"), "{role}");

    let after = app.send(call("GET", "/api/v1/users?limit=200").token(&admin)).await.json();
    assert_eq!(before, after, "no user was created");
}

#[tokio::test]
async fn a_team_member_is_refused_the_users_page_and_every_admin_form_and_nothing_changes() {
    let (app, admin, ops) = setup().await;
    // A budget already set, which the member's posts must leave alone.
    let csrf = csrf_of(&app, &ops, "/teams/ml/quotas").await;
    let set = form_of(&[
        ("csrf", &csrf),
        ("period", "2099-01"),
        ("unit", "gpu-hours"),
        ("amount", "400"),
        ("enforcement", "soft"),
    ]);
    post_form(&app, &ops, "/teams/ml/budgets", set).await.assert_status(200);
    let budgets = ml_budgets(&app, &admin).await;
    let users = app.send(call("GET", "/api/v1/users?limit=200").token(&admin)).await.json();

    let alice = sign_in(&app, "alice").await;
    app.send(call("GET", "/admin/users").header("cookie", &alice)).await.assert_status(403);
    app.send(call("GET", "/teams/ml/quotas").header("cookie", &alice)).await.assert_status(403);
    let csrf = csrf_of(&app, &alice, "/teams/ml").await;
    let posts = [
        ("/admin/users", form_of(&[("csrf", &csrf), ("username", "mallory"), ("password", USER_PASSWORD)])),
        ("/admin/users/bob", form_of(&[("csrf", &csrf), ("disabled", "true")])),
        ("/admin/users/alice", form_of(&[("csrf", &csrf), ("platform_role", "platform-admin")])),
        (
            "/teams/ml/budgets",
            form_of(&[
                ("csrf", &csrf),
                ("period", "2099-01"),
                ("unit", "money"),
                ("amount", "1"),
                ("enforcement", "hard"),
            ]),
        ),
        ("/teams/ml/budgets/2099-01/delete", form_of(&[("csrf", &csrf), ("version", "1")])),
    ];
    for (path, form) in posts {
        let refused = post_form(&app, &alice, path, form).await;
        assert_eq!(refused.status.as_u16(), 403, "{path}: {}", body(&refused));
    }
    // A user outside the team does not learn its budgets exist.
    let bob = sign_in(&app, "bob").await;
    let bob_csrf = csrf_of(&app, &bob, "/").await;
    let form = form_of(&[("csrf", &bob_csrf), ("version", "1")]);
    post_form(&app, &bob, "/teams/ml/budgets/2099-01/delete", form).await.assert_status(404);

    assert_eq!(ml_budgets(&app, &admin).await, budgets, "the budget is as it was");
    let after = app.send(call("GET", "/api/v1/users?limit=200").token(&admin)).await.json();
    assert_eq!(after, users, "no user created or changed");
    assert!(can_sign_in(&app, "bob").await);
}

#[tokio::test]
async fn a_platform_admin_sets_a_hard_money_budget_for_next_month_on_the_quotas_page_and_removes_it() {
    let (app, admin, ops) = setup().await;
    let today = Utc::now().date_naive();
    let next = today.with_day(1).and_then(|d| d.checked_add_months(Months::new(1))).expect("next month");
    let month = next.format("%Y-%m").to_string();
    let page = body(&app.send(call("GET", "/teams/ml/quotas").header("cookie", &ops)).await);
    assert!(page.contains("No budget set.") && page.contains(&format!("value=\"{month}\"")), "{page}");
    let csrf = csrf_in(&page);
    let budget = |period: &str, unit: &str, amount: &str| {
        form_of(&[("csrf", &csrf), ("period", period), ("unit", unit), ("amount", amount), ("enforcement", "hard")])
    };

    let set = post_form(&app, &ops, "/teams/ml/budgets", budget(&month, "money", "1500.50")).await;
    set.assert_status(200);
    let set = body(&set);
    assert!(set.contains(&format!("Budget of ml for {month}: 1500.50 USD, hard.")), "{set}");
    assert!(set.contains("<td data-label=\"Amount\">1500.50 USD</td>"), "{set}");
    let budgets = ml_budgets(&app, &admin).await;
    assert_eq!(budgets.len(), 1, "{budgets:?}");
    assert_eq!(
        (&budgets[0]["period"], &budgets[0]["unit"], &budgets[0]["amount"], &budgets[0]["enforcement"]),
        (&json!(month), &json!("money"), &json!(1_500_500_000_i64), &json!("hard"))
    );

    // Bad input names the field, keeps what was typed, and changes nothing.
    let period = body(&post_form(&app, &ops, "/teams/ml/budgets", budget("2026-13", "money", "10")).await);
    assert!(period.contains("period: must be a month written YYYY-MM"), "{period}");
    assert!(period.contains("value=\"2026-13\""), "{period}");
    let amount = body(&post_form(&app, &ops, "/teams/ml/budgets", budget(&month, "money", "1,500")).await);
    assert!(amount.contains("amount: an amount of money such as 1500 or 1500.50"), "{amount}");
    assert!(amount.contains("value=\"1,500\""), "{amount}");
    let hours = body(&post_form(&app, &ops, "/teams/ml/budgets", budget(&month, "gpu-hours", "2.5")).await);
    assert!(hours.contains("amount: a whole number of GPU-hours such as 400"), "{hours}");
    assert_eq!(ml_budgets(&app, &admin).await, budgets);

    // A stale Remove button leaves the budget; the current one removes it.
    let version = budgets[0]["version"].to_string();
    let delete = format!("/teams/ml/budgets/{month}/delete");
    let stale = post_form(&app, &ops, &delete, form_of(&[("csrf", &csrf), ("version", "99")])).await;
    assert!(body(&stale).contains("Someone changed this since the page was shown"), "{}", body(&stale));
    assert_eq!(ml_budgets(&app, &admin).await.len(), 1);
    let removed = post_form(&app, &ops, &delete, form_of(&[("csrf", &csrf), ("version", &version)])).await;
    assert!(body(&removed).contains(&format!("Budget of ml for {month} removed.")), "{}", body(&removed));
    assert!(ml_budgets(&app, &admin).await.is_empty());
}

#[tokio::test]
async fn a_platform_admin_sets_and_removes_an_idle_policy_from_the_admin_page_and_a_bad_one_names_its_field() {
    let (app, admin, ops) = setup().await;
    let csrf = csrf_of(&app, &ops, "/admin").await;
    let policy = |percent: &str| {
        form_of(&[
            ("csrf", &csrf),
            ("team", "ml"),
            ("priority_class", "experiment"),
            ("below_sm_active_percent", percent),
            ("idle_minutes", "30"),
            ("notice_minutes", "10"),
            ("action", "preempt"),
        ])
    };
    let saved = body(&post_form(&app, &ops, "/admin/idle-policies", policy("5")).await);
    assert!(saved.contains("Idle policy saved."), "{saved}");
    assert!(saved.contains("team ml, experiment jobs"), "{saved}");
    assert!(saved.contains("SM activity below 5% for 1800 s: warn, then preempt 600 s later"), "{saved}");
    let listed = app.send(call("GET", "/api/v1/idle-policies").token(&admin)).await.json();
    assert_eq!(listed[0]["action"], "preempt", "the API shows what the form set: {listed}");
    assert_eq!((listed[0]["idle_seconds"].as_i64(), listed[0]["notice_seconds"].as_i64()), (Some(1800), Some(600)));

    let refused = body(&post_form(&app, &ops, "/admin/idle-policies", policy("150")).await);
    assert!(refused.contains("below_sm_active_percent"), "{refused}");

    let id = listed[0]["id"].as_str().unwrap();
    let removed =
        body(&post_form(&app, &ops, "/admin/idle-policies", form_of(&[("csrf", &csrf), ("delete", id)])).await);
    assert!(removed.contains("Idle policy removed."), "{removed}");
    let listed = app.send(call("GET", "/api/v1/idle-policies").token(&admin)).await.json();
    assert_eq!(listed, json!([]));

    // A team member is refused, as the API refuses them.
    let alice = sign_in(&app, "alice").await;
    let alice_csrf = csrf_of(&app, &alice, "/teams/ml").await;
    let form = form_of(&[
        ("csrf", &alice_csrf),
        ("below_sm_active_percent", "5"),
        ("idle_minutes", "1"),
        ("notice_minutes", "0"),
        ("action", "stop"),
    ]);
    post_form(&app, &alice, "/admin/idle-policies", form).await.assert_status(403);
}
