//! The portal in a real headless Chromium, against the real service on a loopback socket,
//! a real PostgreSQL and the control loop on the simulated cluster: sign in, see the team's
//! dashboard, preview and submit a job through the form, watch it run and finish, cancel
//! another, see a borrower preempted when the team claims its reserved quota, and, as
//! finance, download the month's FOCUS export and open the month's statements; as a platform
//! admin, create a team and give it a member. On a 390-pixel phone, what a waiting job's page
//! and the dashboard say about it (why it waits, its positions, its expected start and the
//! interval around it) and the cluster view's free capacity are in view. Screenshots of each page, at 1280 and 390
//! pixels wide, are saved under `target/portal-screenshots/` as test artefacts.

use std::{path::PathBuf, time::Duration};

use fairway::{control, serve};
use fairway_tests::{browser::Browser, call, TestApp, USER_PASSWORD};
use serde_json::json;

fn screenshots() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/portal-screenshots")
}

fn downloads() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../target/portal-downloads-{}", std::process::id()))
}

/// Serves the app on a loopback port with the control loop running at 10× speed; its base URL.
async fn serve(app: &TestApp) -> String {
    let mut state = app.state.clone();
    let mut config = (*state.config).clone();
    config.sim_speedup = Some(10.0);
    config.cycle_interval = Duration::from_millis(100);
    // Borrowed GPUs are reclaimed at once, so a preemption shows within the test.
    config.min_runtime_before_preemption = Duration::ZERO;
    state.config = std::sync::Arc::new(config);
    let mut ctx = serve::control_context(&state).await.expect("control context");
    ctx.config.reconcile_interval = Duration::from_millis(100);
    let options = (*app.pool.connect_options()).clone();
    control::spawn(ctx, options, format!("browser-{}", uuid::Uuid::new_v4().simple()));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let router = app.router.clone();
    tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });
    for _ in 0..200 {
        let n: i64 = sqlx::query_scalar("select count(*) from cluster_nodes").fetch_one(&app.pool).await.unwrap();
        if n > 0 {
            return base;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the simulated cluster's inventory never arrived");
}

async fn sign_in(browser: &Browser, base: &str, username: &str) {
    browser.open(&format!("{base}/login")).await;
    browser.fill("input[name=username]", username).await;
    browser.fill("input[name=password]", USER_PASSWORD).await;
    browser.click("button[type=submit]").await;
    let home = format!("{base}/");
    browser.wait_for_url_where(|url| url == home, &home, Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_submits_watches_cancels_and_sees_a_preemption_and_finance_downloads_an_export_in_a_real_browser() {
    let app = TestApp::spawn().await;
    let base = serve(&app).await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.send(call("PUT", "/api/v1/teams/ml/quotas/h100-80gb").token(&admin).json(&json!({"reserved": 16, "burst": 8})))
        .await
        .assert_status(200);
    app.user(&admin, "alice", None).await;
    app.member(&admin, "ml", "alice", "member").await;
    // A team that only borrows, where alice is a member too, to watch its job preempted.
    app.team(&admin, "research", None).await;
    app.send(
        call("PUT", "/api/v1/teams/research/quotas/h100-80gb").token(&admin).json(&json!({"reserved": 0, "burst": 64})),
    )
    .await
    .assert_status(200);
    app.member(&admin, "research", "alice", "member").await;
    app.user(&admin, "finn", Some("finance")).await;
    app.user(&admin, "ops", Some("platform-admin")).await;
    let dir = screenshots();

    let browser = Browser::start(1280, 900, &downloads()).await;
    sign_in(&browser, &base, "alice").await;
    assert!(browser.text().await.contains("ml"));
    browser.open(&format!("{base}/teams/ml")).await;
    let text = browser.text().await;
    assert!(text.contains("0 in use · 16 reserved · 8 burst"), "{text}");
    browser.screenshot(&dir, "dashboard-1280").await;

    // Preview, then submit, a job whose name is markup.
    browser.open(&format!("{base}/teams/ml/jobs/new")).await;
    browser.fill("input[name=name]", "<script>alert(1)</script>").await;
    browser.click("select[name=gpu_class] option[value='h100-80gb']").await;
    browser.fill("input[name=gpus_per_replica]", "8").await;
    browser.fill("input[name=max_runtime_seconds]", "600").await;
    browser.fill("input[name=image]", "registry.example/train:1").await;
    // The preview follows the typing, with no button pressed.
    let text = browser.wait_for_text_now("It would start at once on sim.", Duration::from_secs(20)).await;
    assert!(text.contains("It can cost at most"), "{text}");
    assert!(browser.url().await.ends_with("/teams/ml/jobs/new"), "no page load: the live preview answered");
    browser.fill("input[name=gpus_per_replica]", "lots").await;
    browser.wait_for_text_now("Preview when the form is complete: gpus_per_replica", Duration::from_secs(20)).await;
    browser.fill("input[name=gpus_per_replica]", "8").await;
    browser.wait_for_text_now("It would start at once on sim.", Duration::from_secs(20)).await;
    // The Preview button answers the same with a page load (it works without JavaScript).
    browser.click("button[value=preview]").await;
    let text = browser.wait_for_text_now("If you submitted it now", Duration::from_secs(20)).await;
    assert!(text.contains("It would start at once on sim."), "{text}");
    browser.screenshot(&dir, "submit-preview-1280").await;
    browser.click("button[value=submit]").await;
    let job_url = browser.wait_for_url(&format!("{base}/jobs/"), Duration::from_secs(20)).await;
    // The name is shown as text: no script ran (a dialog would fail the next command).
    assert!(browser.text().await.contains("<script>alert(1)</script>"));
    // A simulated minute at 10× speed: it is admitted, runs and succeeds, and the page says so
    // by itself (its script follows the timeline and the log, and reloads at the end).
    let text = browser.wait_for_text_now("finished: ", Duration::from_secs(60)).await;
    assert!(text.contains("succeeded"), "{text}");
    for step in ["submitted", "admitted", "dispatched", "running"] {
        assert!(text.contains(step), "timeline lacks {step}:\n{text}");
    }
    browser.screenshot(&dir, "job-succeeded-1280").await;

    // Another job, cancelled from its page.
    browser.open(&format!("{base}/teams/ml/jobs/new")).await;
    browser.fill("input[name=name]", "to-cancel").await;
    browser.click("select[name=gpu_class] option[value='h100-80gb']").await;
    browser.fill("input[name=image]", "registry.example/train:1").await;
    browser.click("button[value=submit]").await;
    browser.wait_for_url(&format!("{base}/jobs/"), Duration::from_secs(20)).await;
    browser.click("button.danger").await;
    let text = browser.wait_for_text("cancelled", Duration::from_secs(30)).await;
    assert!(text.contains("user:alice"), "{text}");
    // A cancelled job still stopping is followed live, and its page reloads itself once the
    // job has ended: wait for that, or the reload can land on top of the next navigation.
    browser.wait_for_absent("#timeline[data-live]", Duration::from_secs(30)).await;
    browser.screenshot(&dir, "job-cancelled-1280").await;

    // A job larger than the team's quota could never run: the form refuses it, naming the
    // limit, and nothing is queued.
    browser.open(&format!("{base}/teams/ml/jobs/new")).await;
    browser.fill("input[name=name]", "too-big").await;
    browser.click("select[name=gpu_class] option[value='h100-80gb']").await;
    browser.fill("input[name=replicas]", "4").await;
    browser.fill("input[name=gpus_per_replica]", "8").await;
    browser.fill("input[name=image]", "registry.example/train:1").await;
    browser.click("button[value=submit]").await;
    let text = browser.wait_for_text("so it could never run", Duration::from_secs(20)).await;
    assert!(text.contains("team ml may hold at most 24 (16 reserved + 8 burst)"), "{text}");
    browser.screenshot(&dir, "submit-refused-1280").await;
    // Asked to wait for a quota change (through the API), it waits, and says why, on its page
    // and the dashboard.
    let too_big = json!({"name": "too-big", "gpu_class": "h100-80gb", "replicas": 4, "gpus_per_replica": 8,
                         "image": "registry.example/train:1", "wait_for_quota": true});
    let r = app.send(call("POST", "/api/v1/teams/ml/jobs").token(&admin).json(&too_big)).await;
    r.assert_status(201);
    assert_eq!(r.json()["warnings"][0]["code"], "exceeds_quota");
    browser.open(&format!("{base}/jobs/{}", r.json()["id"].as_str().expect("id"))).await;
    let why = "more than team ml's quota allows at all";
    let text = browser.wait_for_text(why, Duration::from_secs(30)).await;
    assert!(text.contains("Why it waits") && text.contains("pending"), "{text}");
    browser.screenshot(&dir, "job-pending-1280").await;
    browser.open(&format!("{base}/teams/ml")).await;
    let text = browser.text().await;
    assert!(text.contains("too-big") && text.contains(why), "{text}");
    browser.screenshot(&dir, "dashboard-waiting-1280").await;
    browser.click("a[href^='/jobs/']").await;
    browser.wait_for_url(&format!("{base}/jobs/"), Duration::from_secs(20)).await;
    browser.click("button.danger").await;
    browser.wait_for_text("cancelled", Duration::from_secs(30)).await;

    // research borrows every H100; ml then claims its reserved quota, and a borrower gives
    // way. Its page says who took the GPUs and why.
    for i in 0..8 {
        app.send(call("POST", "/api/v1/teams/research/jobs").token(&admin).json(&json!({
            "name": format!("borrower-{i}"), "gpu_class": "h100-80gb", "gpus_per_replica": 8, "image": "r:1",
            "priority_class": "experiment", "preemption_grace_seconds": 1,
            "env": {"FAIRWAY_SIM_RUNTIME_SECONDS": "3000"},
        })))
        .await
        .assert_status(201);
    }
    let running = || async {
        sqlx::query_scalar::<_, i64>("select count(*) from jobs where name like 'borrower-%' and state = 'running'")
            .fetch_one(&app.pool)
            .await
            .unwrap()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while running().await < 8 {
        assert!(tokio::time::Instant::now() < deadline, "the borrowers never all ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // ml's idle reserved GPUs are what research borrows: its dashboard says they are lent.
    browser.open(&format!("{base}/teams/ml")).await;
    let text = browser.text().await;
    assert!(text.contains("0 in use · 16 reserved · 8 burst · 16 lent to others"), "{text}");
    assert!(browser.source().await.contains("<rect class=\"lent\""));
    browser.screenshot(&dir, "dashboard-lent-1280").await;
    browser.open(&format!("{base}/teams/ml/jobs/new")).await;
    browser.fill("input[name=name]", "claim").await;
    browser.click("select[name=gpu_class] option[value='h100-80gb']").await;
    browser.click("select[name=priority_class] option[value='production']").await;
    browser.fill("input[name=gpus_per_replica]", "8").await;
    browser.fill("input[name=image]", "serve:1").await;
    browser.click("button[value=submit]").await;
    browser.wait_for_url(&format!("{base}/jobs/"), Duration::from_secs(20)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let victim = loop {
        let v: Option<uuid::Uuid> =
            sqlx::query_scalar("select id from jobs where name like 'borrower-%' and preemptions > 0 limit 1")
                .fetch_optional(&app.pool)
                .await
                .unwrap();
        if let Some(v) = v {
            break v;
        }
        assert!(tokio::time::Instant::now() < deadline, "no borrower was preempted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    browser.open(&format!("{base}/jobs/{victim}")).await;
    let text = browser.wait_for_text("preempted", Duration::from_secs(10)).await;
    assert!(text.contains("team ml reclaims its reserved quota"), "{text}");
    browser.screenshot(&dir, "job-preempted-1280").await;
    // The cluster view: alice's claim and research's borrowers are hers, both teams being hers.
    browser.open(&format!("{base}/clusters")).await;
    assert!(browser.text().await.contains("Free capacity by class"));
    assert!(browser.source().await.contains("class=\"cell mine\""));
    browser.screenshot(&dir, "cluster-1280").await;
    drop(browser);

    // Finance downloads the month's FOCUS export from the billing page.
    let finance = Browser::start(1280, 900, &downloads()).await;
    sign_in(&finance, &base, "finn").await;
    finance.open(&format!("{base}/billing")).await;
    finance.screenshot(&dir, "billing-1280").await;
    finance.click("a[href$='/focus']").await;
    let month = chrono::Utc::now().format("%Y-%m");
    let file = downloads().join(format!("fairway-{month}-focus.csv"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !file.exists() {
        assert!(tokio::time::Instant::now() < deadline, "the export never arrived in {}", downloads().display());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let export = std::fs::read_to_string(&file).expect("the export");
    assert!(export.starts_with("AvailabilityZone,BilledCost,"), "{export}");
    assert!(export.contains(",ml,"), "the succeeded job's charge: {export}");
    // Data rows only: the control record travels beside the file, not as a last row.
    assert!(!export.contains("# control"), "{export}");
    let last = export.trim_end().lines().last().unwrap();
    assert!(last.contains(",GPU Job,"), "the last line is a charge: {last}");
    // Every team's statement for the month, and ml's.
    finance.open(&format!("{base}/billing/periods/{month}")).await;
    assert!(finance.text().await.contains(&format!("Statements for {month}")));
    finance.screenshot(&dir, "billing-period-1280").await;
    finance.click(&format!("a[href='/teams/ml/statements/{month}']")).await;
    finance.wait_for_url(&format!("{base}/teams/ml/statements/{month}"), Duration::from_secs(20)).await;
    finance.screenshot(&dir, "statement-1280").await;
    drop(finance);
    let _ = std::fs::remove_dir_all(downloads());

    // A platform admin creates a team from the admin page, gives alice a role in it, and
    // reads the audit log that recorded both.
    let ops = Browser::start(1280, 900, &downloads()).await;
    sign_in(&ops, &base, "ops").await;
    ops.click("a[href='/admin']").await;
    ops.wait_for_url(&format!("{base}/admin"), Duration::from_secs(20)).await;
    ops.fill("#teams input[name=name]", "vision").await;
    ops.fill("#teams input[name=display_name]", "Vision <b>research</b>").await;
    ops.click("#teams button[type=submit]").await;
    let text = ops.wait_for_text_now("Team vision created.", Duration::from_secs(20)).await;
    assert!(text.contains("Vision <b>research</b>"), "the display name is text: {text}");
    ops.screenshot(&dir, "admin-1280").await;
    ops.open(&format!("{base}/teams/vision/members")).await;
    ops.fill("input[name=username]", "alice").await;
    ops.click("select[name=role] option[value='viewer']").await;
    ops.click("form.filters button[type=submit]").await;
    ops.wait_for_text_now("alice is now viewer of vision.", Duration::from_secs(20)).await;
    ops.screenshot(&dir, "members-1280").await;
    for (page, shot) in
        [("/teams/ml/quotas", "quotas-1280"), ("/teams/ml/tokens", "tokens-1280"), ("/audit", "audit-1280")]
    {
        ops.open(&format!("{base}{page}")).await;
        ops.screenshot(&dir, shot).await;
    }
    let audit = ops.text().await;
    assert!(audit.contains("team.create") && audit.contains("member.put"), "{audit}");
    // A platform admin sees the cluster coloured by team, with the legend naming them.
    ops.open(&format!("{base}/clusters")).await;
    let source = ops.source().await;
    assert!(source.contains("class=\"cell taken team-"), "cells coloured by team");
    assert!(source.contains("research") && source.contains("ml"), "the legend names the teams");
    ops.screenshot(&dir, "cluster-admin-1280").await;
    drop(ops);

    // The same pages on a phone-sized window, with a job of ml waiting again.
    let waiting = app
        .send(call("POST", "/api/v1/teams/ml/jobs").token(&admin).json(&json!({
            "name": "waits-on-a-phone", "gpu_class": "h100-80gb", "replicas": 4, "gpus_per_replica": 8, "image": "r:1",
            "wait_for_quota": true,
        })))
        .await;
    waiting.assert_status(201);
    let waiting_url = format!("{base}/jobs/{}", waiting.json()["id"].as_str().expect("id"));
    let phone = Browser::start(390, 844, &downloads()).await;
    sign_in(&phone, &base, "alice").await;
    phone.open(&waiting_url).await;
    phone.wait_for_text(why, Duration::from_secs(30)).await;
    // The job's page says why it waits, where it stands and when it should start, all in
    // view without scrolling sideways.
    for label in ["Why it waits", "Position in team", "Position overall", "Expected start", why] {
        let shown = phone.shown(label).await;
        assert!(shown.iter().all(|s| s.viewport == 390.0), "laid out 390 pixels wide: {shown:?}");
        assert!(
            shown.iter().any(fairway_tests::browser::Shown::in_view),
            "{label} is not in view at 390 px: {shown:?}"
        );
    }
    phone.screenshot(&dir, "job-waiting-390").await;
    phone.open(&format!("{base}/teams/ml")).await;
    assert!(phone.text().await.contains("GPUs by class"));
    // Every column of the waiting jobs is there on a phone, each cell labelled by its column.
    for header in ["Position in team", "Position overall", "Job", "Why it waits", "Expected start"] {
        let cells = phone.column(header).await;
        assert!(!cells.is_empty(), "no {header} column at 390 px");
        for cell in &cells {
            assert!(cell.in_view(), "a {header} cell is not in view at 390 px: {cell:?}");
            assert_eq!(cell.label.as_deref(), Some(header), "{cell:?}");
        }
    }
    let reasons = phone.column("Why it waits").await;
    assert!(reasons.iter().any(|c| c.text.contains(why)), "{reasons:?}");
    phone.screenshot(&dir, "dashboard-390").await;
    // One more research job waits for research's running borrowers to free its quota: its
    // page on a phone gives the interval it should start in, in view.
    let behind = app
        .send(call("POST", "/api/v1/teams/research/jobs").token(&admin).json(&json!({
            "name": "behind-the-borrowers", "gpu_class": "h100-80gb", "gpus_per_replica": 8, "image": "r:1",
            "priority_class": "experiment",
        })))
        .await;
    behind.assert_status(201);
    phone.open(&format!("{base}/jobs/{}", behind.json()["id"].as_str().expect("id"))).await;
    phone.wait_for_text("(between ", Duration::from_secs(30)).await;
    let interval = phone.shown("(between ").await;
    assert!(interval.iter().any(fairway_tests::browser::Shown::in_view), "the start interval at 390 px: {interval:?}");
    phone.screenshot(&dir, "job-expected-390").await;
    phone.open(&job_url).await;
    phone.screenshot(&dir, "job-390").await;
    phone.open(&format!("{base}/clusters")).await;
    let free = phone.column("Free").await;
    assert!(!free.is_empty(), "no Free column at 390 px");
    for cell in &free {
        assert!(cell.in_view() && cell.label.as_deref() == Some("Free"), "the Free cell at 390 px: {cell:?}");
    }
    phone.screenshot(&dir, "cluster-390").await;
    phone.open(&format!("{base}/teams/ml/jobs/new")).await;
    phone.fill("input[name=name]", "phone").await;
    phone.fill("input[name=image]", "registry.example/train:1").await;
    phone.wait_for_text_now("If you submitted it now", Duration::from_secs(20)).await;
    phone.screenshot(&dir, "submit-390").await;
    // Saved as a template from the phone, it is listed with every column in view, and the
    // form opens filled from it.
    phone.fill("input[name=save_as]", "phone-eval").await;
    phone.click("button[value=save_template]").await;
    phone.wait_for_text_now("Saved as template “phone-eval” (version 1).", Duration::from_secs(20)).await;
    for header in ["Template", "Asks for", "Updated"] {
        let cells = phone.column(header).await;
        assert!(!cells.is_empty() && cells.iter().all(fairway_tests::browser::Shown::in_view), "{header}: {cells:?}");
    }
    phone.screenshot(&dir, "templates-390").await;
    phone.click("a[href='/teams/ml/jobs/new?template=phone-eval']").await;
    phone.wait_for_url(&format!("{base}/teams/ml/jobs/new?template=phone-eval"), Duration::from_secs(20)).await;
    assert!(phone.text().await.contains("From template phone-eval"));
    // The team's webhooks, which alice reads as a member.
    phone.open(&format!("{base}/teams/ml/webhooks")).await;
    phone.screenshot(&dir, "webhooks-390").await;
    drop(phone);
    let phone = Browser::start(390, 844, &downloads()).await;
    sign_in(&phone, &base, "finn").await;
    phone.open(&format!("{base}/billing")).await;
    assert!(phone.text().await.contains("Periods"));
    for header in ["Team", "Billed", "Budget this month", "Forecast"] {
        let cells = phone.column(header).await;
        assert!(!cells.is_empty() && cells.iter().all(fairway_tests::browser::Shown::in_view), "{header}: {cells:?}");
    }
    phone.screenshot(&dir, "billing-390").await;
}

/// Signing in through a real OpenID provider (npm `oidc-provider`) in a real Chromium: the
/// sign-in page's button, the provider's own login form, landing on the portal with the teams
/// and roles the provider's groups grant, and signing out of both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_signs_in_through_the_identity_provider_lands_on_their_teams_with_their_roles_and_signs_out_in_a_real_browser(
) {
    use fairway::{config::GroupGrant, domain::TeamRole};
    use fairway_tests::oidc::OidcPeer;

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("address"));
    let peer = OidcPeer::start(&[format!("{base}/login/oidc/corp/callback")], &[format!("{base}/login")]).await;
    let grant = |group: &str, team: &str, role| GroupGrant {
        group: group.into(),
        team: Some(team.into()),
        role: Some(role),
        platform_role: None,
    };
    let provider =
        peer.provider(vec![grant("ml-leads", "ml", TeamRole::Admin), grant("all-staff", "research", TeamRole::Viewer)]);
    let public = base.clone();
    let app = TestApp::spawn_with(move |c| {
        c.public_url = Some(public);
        c.oidc_providers = vec![provider];
    })
    .await;
    let admin = app.admin().await;
    app.team(&admin, "ml", None).await;
    app.team(&admin, "research", None).await;
    peer.set_groups("erin", &["ml-leads", "all-staff"]).await;
    let router = app.router.clone().into_make_service_with_connect_info::<std::net::SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, router).await.expect("serve") });

    let browser = Browser::start(1280, 900, &downloads()).await;
    browser.open(&format!("{base}/login")).await;
    browser.screenshot(&screenshots(), "sign-in-with-provider-1280").await;
    browser.click("a[href='/login/oidc/corp']").await;
    // The provider's own page.
    browser.wait_for_url(&peer.issuer, Duration::from_secs(20)).await;
    browser.fill("input[name=login]", "erin").await;
    browser.click("button[type=submit]").await;
    let home = format!("{base}/");
    browser.wait_for_url_where(|url| url == home, &home, Duration::from_secs(20)).await;
    let text = browser.text().await;
    assert!(text.contains("erin") && text.contains("ml") && text.contains("research"), "{text}");

    // Admin of ml, as the ml-leads group grants: its members page, which says where it came from.
    browser.open(&format!("{base}/teams/ml/members")).await;
    let text = browser.text().await;
    assert!(text.contains("groups at provider corp"), "{text}");
    browser.screenshot(&screenshots(), "members-from-provider-1280").await;
    // Only a viewer of research: its members page is not hers to manage.
    browser.open(&format!("{base}/teams/research/members")).await;
    assert!(browser.text().await.contains("Not allowed"));

    // Signing out ends the provider's session too, and comes back to Fairway's sign-in page.
    browser.open(&home).await;
    browser.click("form.signout button[type=submit]").await;
    let login = format!("{base}/login");
    browser.wait_for_url_where(|url| url.starts_with(&login), &login, Duration::from_secs(20)).await;
    browser.click("a[href='/login/oidc/corp']").await;
    browser.wait_for_url(&peer.issuer, Duration::from_secs(20)).await;
    // The provider asks who is signing in again: its session ended.
    assert!(!browser.find("input[name=login]").await.is_empty());
}
