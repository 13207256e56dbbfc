//! The web portal through the router: signing in, a team's dashboard with why jobs wait, the
//! job list, a job's page, cancelling, a team's webhooks and their delivery logs, and what a
//! cross-site form post or a stranger gets.
//! (The real-browser test is `tests/browser.rs`.)

use fairway_tests::{call, csv_fields, TestApp, TestResponse, USER_PASSWORD};
use serde_json::json;

const FORM: &str = "application/x-www-form-urlencoded";

struct Portal {
    app: TestApp,
    job_id: String,
}

/// Team `ml` with member alice; a stranger bob; a job with a hostile name waiting for a
/// reason the scheduler recorded.
async fn setup() -> Portal {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.gpu_class(&admin, "h100").await;
    app.team(&admin, "ml", None).await;
    app.send(call("PUT", "/api/v1/teams/ml/quotas/h100").token(&admin).json(&json!({"reserved": 8, "burst": 4})))
        .await
        .assert_status(200);
    let alice = app.user(&admin, "alice", None).await;
    app.member(&admin, "ml", "alice", "member").await;
    app.user(&admin, "bob", None).await;
    let job = app
        .send(call("POST", "/api/v1/teams/ml/jobs").token(&alice).json(&json!({
            "name": "<script>alert(1)</script>", "gpu_class": "h100", "gpus_per_replica": 4, "image": "train:1",
        })))
        .await;
    job.assert_status(201);
    let job_id = job.json()["id"].as_str().expect("id").to_owned();
    // What a scheduling cycle records for a waiting job.
    sqlx::query(
        "update jobs set pending_reason = 'insufficient_capacity', pending_message = 'not enough free GPUs of this class',
                         queue_position = 1 where id = $1::uuid",
    )
    .bind(&job_id)
    .execute(&app.pool)
    .await
    .expect("record the reason");
    Portal { app, job_id }
}

/// Books a 30-minute piece of the hostile job on 4 H100s (2 GPU-hours of the ledger's unit)
/// from `start` (SQL), billed `billed_micros`, in this month.
async fn book(p: &Portal, start: &str, billed_micros: i64) {
    let insert = format!(
        "insert into usage_ledger (kind, job_id, attempt, job_name, team_id, team_name, gpu_class_id, gpu_class,
                                   priority_class, gpus, fraction_milli, borrowing, charge_start, charge_end,
                                   duration_ms, gpu_milli_ms, rate_micros_per_gpu_hour, price_multiplier_milli,
                                   list_cost_micros, billed_cost_micros, currency, billing_period)
         select 'usage', j.id, 1, j.name, j.team_id, 'ml', j.gpu_class_id, 'h100', 'experiment', 4, 1000, false,
                {start}, {start} + interval '30 minutes', 1800000, 7200000000, 2500000, 800, $2, $2, 'USD',
                date_trunc('month', now())::date
         from jobs j where j.id = $1::uuid"
    );
    sqlx::query(&insert).bind(&p.job_id).bind(billed_micros).execute(&p.app.pool).await.expect("a booked piece");
}

/// Books a 30-minute piece of job `job_id` (any team's) `minutes` after this month began,
/// billed `billed_micros`: a ledger row of this month's billing period.
async fn book_piece(app: &TestApp, job_id: &str, minutes: i64, billed_micros: i64) {
    sqlx::query(
        "insert into usage_ledger (kind, job_id, attempt, job_name, team_id, team_name, gpu_class_id, gpu_class,
                                   priority_class, gpus, fraction_milli, borrowing, charge_start, charge_end,
                                   duration_ms, gpu_milli_ms, rate_micros_per_gpu_hour, price_multiplier_milli,
                                   list_cost_micros, billed_cost_micros, currency, billing_period)
         select 'usage', j.id, 1, j.name, j.team_id, t.name, j.gpu_class_id, 'h100', 'experiment', 4, 1000, false,
                date_trunc('month', now()) + make_interval(mins => $2::int),
                date_trunc('month', now()) + make_interval(mins => $2::int + 30), 1800000, 7200000000, 2500000, 1000,
                $3, $3, 'USD', date_trunc('month', now())::date
         from jobs j join teams t on t.id = j.team_id where j.id = $1::uuid",
    )
    .bind(job_id)
    .bind(minutes)
    .bind(billed_micros)
    .execute(&app.pool)
    .await
    .expect("a booked piece");
}

/// Micro-units to the cent, half away from zero, with the currency: written here again, not
/// taken from the service, so the test checks the pages' arithmetic.
fn to_the_cent(micros: i64) -> String {
    let cents = (micros.abs() + 5_000) / 10_000 * micros.signum();
    format!("{}.{:02} USD", cents / 100, (cents % 100).abs())
}

/// A decimal such as `1.005000` in micro-units, exactly.
fn micros_of(decimal: &str) -> i64 {
    let (whole, frac) = decimal.split_once('.').unwrap_or((decimal, ""));
    let frac = format!("{frac:0<6}");
    whole.parse::<i64>().expect("whole part") * 1_000_000 + frac[..6].parse::<i64>().expect("fraction")
}

/// The text of the first cell of class `billed` after `marker` in `page`.
fn billed_after(page: &str, marker: &str) -> String {
    let from = page.find(marker).unwrap_or_else(|| panic!("no {marker:?} in:\n{page}"));
    let rest = &page[from..];
    let cell = rest.find("class=\"billed\">").unwrap_or_else(|| panic!("no billed cell after {marker:?}")) + 15;
    rest[cell..].split('<').next().expect("the cell's text").to_owned()
}

/// Sets ml's money budget for `month` (`YYYY-MM`) through the API.
async fn set_budget(p: &Portal, admin: &str, month: &str, micros: i64, enforcement: &str) {
    p.app
        .send(
            call("PUT", &format!("/api/v1/teams/ml/budgets/{month}"))
                .token(admin)
                .json(&json!({"unit": "money", "amount": micros, "enforcement": enforcement})),
        )
        .await
        .assert_status(200);
}

pub(crate) fn body(r: &TestResponse) -> String {
    String::from_utf8(r.body.clone()).expect("UTF-8 page")
}

/// Signs in through the form; the session cookie (`name=value`).
pub(crate) async fn sign_in(app: &TestApp, username: &str) -> String {
    let form = format!("username={username}&password={USER_PASSWORD}");
    let r = app.send(call("POST", "/login").raw(FORM, form.into_bytes())).await;
    assert_eq!(r.status.as_u16(), 303, "{}", body(&r));
    let cookie = r.header("set-cookie").expect("a session cookie");
    cookie.split(';').next().expect("name=value").to_owned()
}

/// The CSRF token a page's forms carry.
pub(crate) fn csrf_in(page: &str) -> String {
    let start = page.find("name=\"csrf\" value=\"").expect("a CSRF field") + "name=\"csrf\" value=\"".len();
    page[start..].split('"').next().expect("its value").to_owned()
}

#[tokio::test]
async fn signing_in_sets_an_http_only_lax_cookie_and_the_dashboard_says_why_a_job_waits() {
    let p = setup().await;
    let form = format!("username=alice&password={USER_PASSWORD}");
    let r = p.app.send(call("POST", "/login").raw(FORM, form.into_bytes())).await;
    let cookie = r.header("set-cookie").expect("a session cookie");
    assert!(cookie.starts_with("fairway_session="), "{cookie}");
    assert!(cookie.contains("; HttpOnly") && cookie.contains("; SameSite=Lax"), "{cookie}");

    let session = sign_in(&p.app, "alice").await;
    let r = p.app.send(call("GET", "/teams/ml").header("cookie", &session)).await;
    r.assert_status(200);
    let csp = r.header("content-security-policy").expect("a CSP");
    assert!(csp.starts_with("default-src 'self'"), "{csp}");
    let page = body(&r);
    assert!(page.contains("not enough free GPUs of this class"), "{page}");
    assert!(page.contains("0 in use · 8 reserved · 4 burst"), "{page}");
    assert!(!page.contains("Budget this month"), "no budget, no budget box");
    // The job's name is text, never markup.
    assert!(page.contains("&#60;script&#62;alert(1)&#60;/script&#62;") || page.contains("&lt;script&gt;"), "{page}");
    assert!(!page.contains("<script>alert(1)"), "{page}");

    let r = p.app.send(call("GET", &format!("/jobs/{}", p.job_id)).header("cookie", &session)).await;
    r.assert_status(200);
    let page = body(&r);
    assert!(!page.contains("<script>alert(1)"), "{page}");
    assert!(page.contains("submitted by user:alice"), "{page}");
}

#[tokio::test]
async fn a_wrong_password_gets_a_plain_answer_and_no_session() {
    let p = setup().await;
    let r = p.app.send(call("POST", "/login").raw(FORM, b"username=alice&password=wrong-password-1".to_vec())).await;
    assert_eq!(r.status.as_u16(), 401);
    assert!(r.header("set-cookie").is_none());
    assert!(body(&r).contains("That username and password do not match."));
    // Without a session every page sends the browser to sign in.
    let r = p.app.send(call("GET", "/teams/ml")).await;
    assert_eq!((r.status.as_u16(), r.header("location").as_deref()), (303, Some("/login")));
}

#[tokio::test]
async fn a_cross_site_cancel_with_a_valid_session_cookie_is_refused() {
    let p = setup().await;
    let session = sign_in(&p.app, "alice").await;
    let cancel = format!("/jobs/{}/cancel", p.job_id);
    let state = |app: &TestApp| {
        let id = p.job_id.clone();
        let pool = app.pool.clone();
        async move {
            sqlx::query_scalar::<_, String>("select state from jobs where id = $1::uuid")
                .bind(id)
                .fetch_one(&pool)
                .await
                .expect("state")
        }
    };
    // A forged form: the cookie rides along, the token does not.
    let r = p.app.send(call("POST", &cancel).header("cookie", &session).raw(FORM, b"csrf=guess".to_vec())).await;
    assert_eq!(r.status.as_u16(), 403);
    let page = p.app.send(call("GET", &format!("/jobs/{}", p.job_id)).header("cookie", &session)).await;
    let token = csrf_in(&body(&page));
    // The right token from another origin is refused too.
    let r = p
        .app
        .send(
            call("POST", &cancel)
                .header("cookie", &session)
                .header("host", "fairway.example")
                .header("origin", "https://evil.example")
                .raw(FORM, format!("csrf={token}").into_bytes()),
        )
        .await;
    assert_eq!(r.status.as_u16(), 403);
    assert_eq!(state(&p.app).await, "pending");
    // From the job's own page it works.
    let r = p
        .app
        .send(
            call("POST", &cancel)
                .header("cookie", &session)
                .header("host", "fairway.example")
                .header("origin", "https://fairway.example")
                .raw(FORM, format!("csrf={token}").into_bytes()),
        )
        .await;
    assert_eq!(r.status.as_u16(), 303, "{}", body(&r));
    assert_eq!(state(&p.app).await, "cancelled");
}

#[tokio::test]
async fn a_stranger_sees_no_page_of_another_team() {
    let p = setup().await;
    let session = sign_in(&p.app, "bob").await;
    for path in ["/teams/ml".to_owned(), format!("/jobs/{}", p.job_id)] {
        let r = p.app.send(call("GET", &path).header("cookie", &session)).await;
        assert_eq!(r.status.as_u16(), 404, "{path}");
        assert!(!body(&r).contains("alert(1)"), "{path}");
    }
    let home = p.app.send(call("GET", "/").header("cookie", &session)).await;
    assert!(body(&home).contains("You are not a member of any team yet."));
}

#[tokio::test]
async fn a_member_refused_by_role_gets_403_on_the_portal_as_on_the_api_and_a_stranger_404() {
    let p = setup().await;
    let alice = p.app.login("alice", fairway_tests::USER_PASSWORD).await;
    let alice_session = sign_in(&p.app, "alice").await;
    let bob_session = sign_in(&p.app, "bob").await;
    // The members page is where members are managed: the API's counterpart is adding one.
    let add_member = call("PUT", "/api/v1/teams/ml/members/bob").token(&alice).json(&json!({"role": "viewer"}));
    p.app.send(add_member).await.assert_problem(403, "forbidden");
    for (page, api) in [
        ("/teams/ml/members", None),
        ("/teams/ml/tokens", Some("/api/v1/teams/ml/tokens")),
        ("/teams/ml/audit", Some("/api/v1/teams/ml/audit-log")),
        ("/teams/ml/quotas", None),
    ] {
        if let Some(api) = api {
            p.app.send(call("GET", api).token(&alice)).await.assert_problem(403, "forbidden");
        }
        let refused = p.app.send(call("GET", page).header("cookie", &alice_session)).await;
        assert_eq!(refused.status.as_u16(), 403, "{page}");
        assert!(body(&refused).contains("Your role in this team does not allow that."), "{page}");
        p.app.send(call("GET", page).header("cookie", &bob_session)).await.assert_status(404);
    }
}

#[tokio::test]
async fn a_member_previews_a_job_through_the_engine_then_submits_it_from_the_form() {
    let p = setup().await;
    let session = sign_in(&p.app, "alice").await;
    let r = p.app.send(call("GET", "/teams/ml/jobs/new").header("cookie", &session)).await;
    r.assert_status(200);
    let token = csrf_in(&body(&r));
    let form = |action: &str, replicas: &str| {
        format!(
            "csrf={token}&action={action}&name=sweep+%3Cb%3E1%3C%2Fb%3E&gpu_class=h100&replicas={replicas}&gpus_per_replica=2\
             &priority_class=production&max_runtime_seconds=7200&image=train%3A2&command=python+train.py"
        )
    };
    // A number that is not one is named, and nothing is queued.
    let r = p
        .app
        .send(
            call("POST", "/teams/ml/jobs/new").header("cookie", &session).raw(FORM, form("submit", "two").into_bytes()),
        )
        .await;
    assert_eq!(r.status.as_u16(), 422);
    assert!(body(&r).contains("<code>replicas</code>: must be a whole number"), "{}", body(&r));
    // The preview is the engine's answer: what it would cost at most (2 × 2 GPUs × 2 h at
    // $2.50, production at list price) and why it would wait (no cluster reports GPUs here).
    let r = p
        .app
        .send(
            call("POST", "/teams/ml/jobs/new").header("cookie", &session).raw(FORM, form("preview", "2").into_bytes()),
        )
        .await;
    r.assert_status(200);
    let page = body(&r);
    assert!(page.contains("If you submitted it now"), "{page}");
    assert!(page.contains("It can cost at most 20.00 USD."), "{page}");
    let before: i64 = sqlx::query_scalar("select count(*) from jobs").fetch_one(&p.app.pool).await.unwrap();
    assert_eq!(before, 1, "a preview queues nothing");
    let r = p
        .app
        .send(call("POST", "/teams/ml/jobs/new").header("cookie", &session).raw(FORM, form("submit", "2").into_bytes()))
        .await;
    assert_eq!(r.status.as_u16(), 303, "{}", body(&r));
    let location = r.header("location").expect("to the job's page");
    let page = body(&p.app.send(call("GET", &location).header("cookie", &session)).await);
    assert!(page.contains("sweep &#60;b&#62;1&#60;/b&#62;") || page.contains("sweep &lt;b&gt;1&lt;/b&gt;"), "{page}");
    assert!(page.contains("4 × h100"), "{page}");
}

#[tokio::test]
async fn a_member_saves_the_form_as_a_template_and_submits_from_it_keeping_what_the_form_does_not_show() {
    let p = setup().await;
    let admin = p.app.admin().await;
    // A template saved through the API with an environment the form has no field for.
    p.app
        .send(call("PUT", "/api/v1/teams/ml/job-templates/nightly").token(&admin).json(&json!({
            "name": "nightly-eval", "gpu_class": "h100", "gpus_per_replica": 2, "image": "eval:1",
            "env": {"SUITE": "full"}, "labels": {"project": "vision"}})))
        .await
        .assert_status(201);
    let session = sign_in(&p.app, "alice").await;
    let r = p.app.send(call("GET", "/teams/ml/jobs/new").header("cookie", &session)).await;
    let page = body(&r);
    assert!(page.contains("href=\"/teams/ml/jobs/new?template=nightly\""), "the form lists the template: {page}");
    let token = csrf_in(&page);

    // Opened from it, the form is filled with its fields.
    let r = p.app.send(call("GET", "/teams/ml/jobs/new?template=nightly").header("cookie", &session)).await;
    r.assert_status(200);
    let page = body(&r);
    assert!(page.contains("name=\"template\" value=\"nightly\""), "{page}");
    assert!(page.contains("name=\"image\" required value=\"eval:1\""), "{page}");
    assert!(page.contains("name=\"gpus_per_replica\" inputmode=\"numeric\" value=\"2\""), "{page}");

    // Submitted with the image changed: the template's environment and labels are kept.
    let form = format!(
        "csrf={token}&action=submit&template=nightly&name=nightly-eval&gpu_class=h100&replicas=1&gpus_per_replica=2\
         &priority_class=experiment&max_runtime_seconds=&expected_runtime_seconds=&image=eval%3A2&command="
    );
    let r = post_form(&p.app, &session, "/teams/ml/jobs/new", form.clone()).await;
    assert_eq!(r.status.as_u16(), 303, "{}", body(&r));
    let job_id = r.header("location").expect("to the job's page").trim_start_matches("/jobs/").to_owned();
    let job = p.app.send(call("GET", &format!("/api/v1/jobs/{job_id}")).token(&admin)).await.json();
    assert_eq!(job["image"], "eval:2");
    assert_eq!(job["env"], json!({"SUITE": "full"}));
    assert_eq!(job["labels"], json!({"project": "vision", "fairway.dev/template": "nightly"}));

    // Saved under a new name from the form: a template the API reads, with the kept fields.
    let save = form.replace("action=submit", "action=save_template") + "&save_as=nightly-v2";
    let r = post_form(&p.app, &session, "/teams/ml/jobs/new", save).await;
    r.assert_status(200);
    assert!(body(&r).contains("Saved as template “nightly-v2” (version 1)."), "{}", body(&r));
    let saved = p.app.send(call("GET", "/api/v1/teams/ml/job-templates/nightly-v2").token(&admin)).await;
    saved.assert_status(200);
    assert_eq!(saved.json()["spec"]["image"], "eval:2");
    assert_eq!(saved.json()["spec"]["env"], json!({"SUITE": "full"}));
    assert_eq!(saved.json()["created_by"], "user:alice");

    // A name that cannot be one is shown back, and nothing is saved.
    let bad = form.replace("action=submit", "action=save_template") + "&save_as=Nightly+V3";
    let r = post_form(&p.app, &session, "/teams/ml/jobs/new", bad).await;
    assert_eq!(r.status.as_u16(), 422);
    assert!(body(&r).contains("<code>template</code>: may contain only lowercase letters"), "{}", body(&r));

    // Deleted from the page; a stranger cannot open the form from another team's template.
    let r = post_form(&p.app, &session, "/teams/ml/templates/nightly/delete", format!("csrf={token}")).await;
    assert_eq!(r.status.as_u16(), 303, "{}", body(&r));
    p.app.send(call("GET", "/api/v1/teams/ml/job-templates/nightly").token(&admin)).await.assert_status(404);
    let bob = sign_in(&p.app, "bob").await;
    let r = p.app.send(call("GET", "/teams/ml/jobs/new?template=nightly-v2").header("cookie", &bob)).await;
    r.assert_status(404);
}

#[tokio::test]
async fn the_submit_form_offers_first_and_selects_a_class_the_team_has_quota_for_and_refuses_one_it_has_none_for() {
    let p = setup().await;
    let admin = p.app.admin().await;
    // Sorted by name, a100 would come first, and the team has no quota for it.
    p.app.gpu_class(&admin, "a100").await;
    let session = sign_in(&p.app, "alice").await;
    let page = body(&p.app.send(call("GET", "/teams/ml/jobs/new").header("cookie", &session)).await);
    assert!(page.contains("<option value=\"h100\" selected>"), "{page}");
    assert!(page.find("value=\"h100\"") < page.find("value=\"a100\""), "usable classes first: {page}");
    let token = csrf_in(&page);
    let form = format!(
        "csrf={token}&action=submit&name=elsewhere&gpu_class=a100&replicas=1&gpus_per_replica=1\
         &priority_class=experiment&max_runtime_seconds=3600&image=train%3A2&command="
    );
    let r =
        p.app.send(call("POST", "/teams/ml/jobs/new").header("cookie", &session).raw(FORM, form.into_bytes())).await;
    assert_eq!(r.status.as_u16(), 422);
    assert!(body(&r).contains("team ml has no quota for GPU class a100"), "{}", body(&r));
    let jobs: i64 = sqlx::query_scalar("select count(*) from jobs").fetch_one(&p.app.pool).await.unwrap();
    assert_eq!(jobs, 1, "nothing more is queued");
}

#[tokio::test]
async fn the_live_preview_answers_with_the_engines_verdict_as_a_fragment_and_names_what_is_incomplete() {
    let p = setup().await;
    let session = sign_in(&p.app, "alice").await;
    let page = body(&p.app.send(call("GET", "/teams/ml/jobs/new").header("cookie", &session)).await);
    assert!(page.contains("<script src=\"/static/preview.js\" defer></script>"), "{page}");
    let token = csrf_in(&page);
    let preview = |gpus: &str| {
        let form = format!(
            "csrf={token}&name=live&gpu_class=h100&replicas=1&gpus_per_replica={gpus}&priority_class=production\
             &max_runtime_seconds=3600&image=train%3A2&command="
        );
        call("POST", "/teams/ml/jobs/preview").header("cookie", &session).raw(FORM, form.into_bytes())
    };
    let r = p.app.send(preview("4")).await;
    r.assert_status(200);
    let fragment = body(&r);
    assert!(fragment.contains("If you submitted it now") && fragment.contains("It can cost at most 10.00 USD."));
    assert!(!fragment.contains("<html"), "a fragment, not a page: {fragment}");
    let half = body(&p.app.send(preview("")).await);
    assert!(half.contains("Preview when the form is complete: gpus_per_replica: must be a whole number"), "{half}");
    let jobs: i64 = sqlx::query_scalar("select count(*) from jobs").fetch_one(&p.app.pool).await.unwrap();
    assert_eq!(jobs, 1, "previews queue nothing");
    // The script is served from here, so the CSP allows it.
    let script = p.app.send(call("GET", "/static/preview.js")).await;
    script.assert_status(200);
    assert!(script.header("content-type").is_some_and(|t| t.starts_with("text/javascript")));
}

#[tokio::test]
async fn a_member_declares_an_expected_runtime_on_the_form_the_preview_checks_it_and_the_job_page_shows_it() {
    let p = setup().await;
    let session = sign_in(&p.app, "alice").await;
    let page = body(&p.app.send(call("GET", "/teams/ml/jobs/new").header("cookie", &session)).await);
    assert!(page.contains("name=\"expected_runtime_seconds\""), "{page}");
    let token = csrf_in(&page);
    let form = |action: &str, expected: &str| {
        format!(
            "csrf={token}&action={action}&name=timed&gpu_class=h100&replicas=1&gpus_per_replica=1\
             &priority_class=production&max_runtime_seconds=7200&expected_runtime_seconds={expected}&image=train%3A2&command="
        )
    };
    let send = |path: &'static str, form: String| {
        p.app.send(call("POST", path).header("cookie", &session).raw(FORM, form.into_bytes()))
    };
    // The live preview holds it to the maximum runtime, as a submission would.
    let fragment = body(&send("/teams/ml/jobs/preview", form("preview", "7201")).await);
    assert!(fragment.contains("expected_runtime_seconds: must be at most"), "{fragment}");
    let fragment = body(&send("/teams/ml/jobs/preview", form("preview", "soon")).await);
    assert!(fragment.contains("expected_runtime_seconds: must be a whole number"), "{fragment}");
    let fragment = body(&send("/teams/ml/jobs/preview", form("preview", "1800")).await);
    assert!(fragment.contains("If you submitted it now"), "{fragment}");
    let r = send("/teams/ml/jobs/new", form("submit", "1800")).await;
    assert_eq!(r.status.as_u16(), 303, "{}", body(&r));
    let page = body(&p.app.send(call("GET", &r.header("location").unwrap()).header("cookie", &session)).await);
    assert!(
        page.contains("<dt>Expected runtime</dt><dd class=\"expected-runtime\">1800 seconds (at most 7200)</dd>"),
        "{page}"
    );
    // Left empty, the job declares none, and its page says nothing of it.
    let r = send("/teams/ml/jobs/new", form("submit", "")).await;
    assert_eq!(r.status.as_u16(), 303, "{}", body(&r));
    let page = body(&p.app.send(call("GET", &r.header("location").unwrap()).header("cookie", &session)).await);
    assert!(!page.contains("Expected runtime"), "{page}");
}

#[tokio::test]
async fn a_member_asks_for_cpu_memory_a_claim_and_a_secret_on_the_form_and_the_job_page_shows_them_by_name() {
    let p = setup().await;
    let session = sign_in(&p.app, "alice").await;
    let page = body(&p.app.send(call("GET", "/teams/ml/jobs/new").header("cookie", &session)).await);
    assert!(page.contains("name=\"volumes\"") && page.contains("name=\"secret_env\""), "{page}");
    let token = csrf_in(&page);
    let form = |volumes: &str, secrets: &str| {
        format!(
            "csrf={token}&action=submit&name=mounted&gpu_class=h100&replicas=1&gpus_per_replica=2\
             &priority_class=production&max_runtime_seconds=7200&image=train%3A2&command=&cpu=12&memory=96Gi\
             &volumes={volumes}&secret_env={secrets}"
        )
    };
    // A line not of the form, and a claim of another namespace, are named.
    let r = post_form(&p.app, &session, "/teams/ml/jobs/new", form("datasets", "")).await;
    let page = body(&r);
    assert!(page.contains("<code>volumes</code>: line 1 is not CLAIM:/PATH or CLAIM:/PATH:ro"), "{page}");
    let r = post_form(&p.app, &session, "/teams/ml/jobs/new", form("other%2Fdata%3A%2Fdata", "")).await;
    let page = body(&r);
    assert!(
        page.contains("<code>volumes[0].claim</code>: must name an object of the team&#39;s own namespace"),
        "{page}"
    );
    let r = post_form(
        &p.app,
        &session,
        "/teams/ml/jobs/new",
        form("datasets%3A%2Fdata%3Aro%0D%0Ascratch%3A%2Fscratch", "HF_TOKEN%3Dhf%3Atoken"),
    )
    .await;
    assert_eq!(r.status.as_u16(), 303, "{}", body(&r));
    let page = body(&p.app.send(call("GET", &r.header("location").unwrap()).header("cookie", &session)).await);
    for shown in [
        "<dd class=\"resources\">12 CPU and 96Gi of memory per replica</dd>",
        "<div>datasets at /data, read-only</div><div>scratch at /scratch</div>",
        "<div>HF_TOKEN from Secret hf, key token</div>",
    ] {
        assert!(page.contains(shown), "{shown}\n{page}");
    }
}

#[tokio::test]
async fn an_unknown_page_is_a_friendly_page_and_an_unknown_api_path_a_problem() {
    let p = setup().await;
    let r = p.app.send(call("GET", "/no/such/page")).await;
    assert_eq!(r.status.as_u16(), 404);
    assert!(body(&r).contains("There is nothing here for you."), "{}", body(&r));
    let r = p.app.send(call("GET", "/api/v1/no-such-thing")).await;
    r.assert_problem(404, "not_found");
}

#[tokio::test]
async fn the_dashboard_shows_this_months_budget_spent_and_forecast() {
    let p = setup().await;
    let admin = p.app.admin().await;
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    set_budget(&p, &admin, &month, 1_000_000_000, "soft").await;
    let session = sign_in(&p.app, "alice").await;
    let page = body(&p.app.send(call("GET", "/teams/ml").header("cookie", &session)).await);
    assert!(page.contains("Budget this month"), "{page}");
    assert!(page.contains("0.00 USD of 1000.00 USD spent (soft)"), "{page}");
}

#[tokio::test]
async fn the_job_list_pages_fifty_at_a_time_filters_by_state_and_escapes_names() {
    let p = setup().await;
    let alice = p.app.login("alice", USER_PASSWORD).await;
    // 60 more jobs: 61 in all, the hostile one first.
    let jobs: Vec<serde_json::Value> = (0..60)
        .map(|i| json!({"name": format!("sweep-{i:02}"), "gpu_class": "h100", "gpus_per_replica": 1, "image": "train:1"}))
        .collect();
    p.app
        .send(call("POST", "/api/v1/teams/ml/jobs:batch").token(&alice).json(&json!({"jobs": jobs})))
        .await
        .assert_status(201);
    sqlx::query("update jobs set state = 'failed', exit_code = 3 where name = 'sweep-07'")
        .execute(&p.app.pool)
        .await
        .unwrap();
    let session = sign_in(&p.app, "alice").await;
    let first = body(&p.app.send(call("GET", "/teams/ml/jobs").header("cookie", &session)).await);
    assert_eq!(first.matches("<tr><td data-label=\"Job\"><a href=\"/jobs/").count(), 50, "{first}");
    assert!(first.contains("sweep-59"), "newest first");
    assert!(!first.contains("sweep-09"), "the eleventh newest is not on the first page");
    let older = first.split("rel=\"next\" href=\"").nth(1).expect("an older page").split('"').next().unwrap();
    let older = older.replace("&amp;", "&");
    let second = body(&p.app.send(call("GET", &older).header("cookie", &session)).await);
    assert_eq!(second.matches("<tr><td data-label=\"Job\"><a href=\"/jobs/").count(), 11, "{second}");
    assert!(second.contains("&#60;script&#62;alert(1)&#60;/script&#62;"), "the name is text: {second}");
    assert!(!second.contains("<script>alert(1)"));
    assert!(!second.contains("rel=\"next\""), "nothing older");
    let failed = body(&p.app.send(call("GET", "/teams/ml/jobs?state=failed").header("cookie", &session)).await);
    assert_eq!(failed.matches("<tr><td data-label=\"Job\"><a href=\"/jobs/").count(), 1, "{failed}");
    assert!(failed.contains("sweep-07") && failed.contains("<td data-label=\"Exit\">3</td>"), "{failed}");
    let unknown = body(&p.app.send(call("GET", "/teams/ml/jobs?state=lost&before=x").header("cookie", &session)).await);
    assert!(unknown.contains("were not understood"), "{unknown}");
    // A stranger gets no list.
    let bob = sign_in(&p.app, "bob").await;
    p.app.send(call("GET", "/teams/ml/jobs").header("cookie", &bob)).await.assert_status(404);
}

#[tokio::test]
async fn finance_sees_usage_per_day_by_team_and_class_as_svg_and_downloads_the_same_as_csv() {
    let p = setup().await;
    let admin = p.app.admin().await;
    p.app.user(&admin, "fin", Some("finance")).await;
    // Two GPU-hours of ml on h100 this morning, billed 5 USD.
    let today = chrono::Utc::now().date_naive();
    sqlx::query(
        "insert into usage_rollups (hour, team_id, gpu_class_id, priority_class, gpu_milli_ms, billed_cost_micros)
         select $1::date::timestamp at time zone 'UTC', t.id, c.id, 'production', 7200000000, 5000000
         from teams t, gpu_classes c where t.name = 'ml' and c.name = 'h100'",
    )
    .bind(today)
    .execute(&p.app.pool)
    .await
    .unwrap();
    let session = sign_in(&p.app, "fin").await;
    let page = body(&p.app.send(call("GET", "/billing").header("cookie", &session)).await);
    assert!(page.contains(&format!("<title>ml: 2.00 GPU-hours on {today}</title>")), "{page}");
    assert!(page.contains(&format!("<title>h100: 2.00 GPU-hours on {today}</title>")), "{page}");
    assert_eq!(page.matches("<rect class=\"series-").count(), 2, "one bar in each chart");
    assert!(page.contains("<td data-label=\"Budget this month\" class=\"muted\">none</td>"), "no budget yet: {page}");
    // A hard budget of 4 USD this month, and 5 USD booked: spent beyond it, and said so.
    let month = today.format("%Y-%m").to_string();
    set_budget(&p, &admin, &month, 4_000_000, "hard").await;
    book(&p, "date_trunc('hour', now())", 5_000_000).await;
    let page = body(&p.app.send(call("GET", "/billing").header("cookie", &session)).await);
    assert!(
        page.contains("<td data-label=\"GPU-hours\">2.00</td><td data-label=\"Billed\" class=\"billed\">5.00 USD</td>"),
        "{page}"
    );
    assert!(page.contains("<td data-label=\"Budget this month\">4.00 USD (hard)</td>"), "{page}");
    assert!(page.contains("5.00 USD<svg") && page.contains("aria-label=\"100% of the budget spent\""), "{page}");
    assert!(page.contains("<td data-label=\"Forecast\" class=\"error\">5.00 USD (over)</td>"), "{page}");
    let csv = p.app.send(call("GET", "/billing/usage.csv").header("cookie", &session)).await;
    csv.assert_status(200);
    assert!(csv.header("content-type").unwrap().starts_with("text/csv"));
    let text = body(&csv);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "day,team,gpu_class,gpu_hours,billed_cost,currency");
    assert_eq!(lines.len(), 2, "{text}");
    assert!(lines[1].starts_with(&format!("{today},ml,h100,2.")), "{text}");
    assert!(lines[1].ends_with(",5.000000,USD"), "{text}");
    // This month's statements: every team, with its cost and a link to its statement.
    assert!(page.contains(&format!("href=\"/billing/periods/{month}\"")), "{page}");
    let period = body(&p.app.send(call("GET", &format!("/billing/periods/{month}")).header("cookie", &session)).await);
    assert!(
        period.contains(
            "<tr><td data-label=\"Team\">ml</td><td data-label=\"GPU-hours\">2.00</td><td data-label=\"Billed\" class=\"billed\">5.00 USD</td>"
        ),
        "{period}"
    );
    assert!(period.contains(&format!("href=\"/teams/ml/statements/{month}\"")), "{period}");
    assert!(period.contains(&format!("href=\"/billing/exports/{month}/focus\"")), "{period}");
    let statement = p.app.send(call("GET", &format!("/teams/ml/statements/{month}")).header("cookie", &session)).await;
    statement.assert_status(200);
    // A team member is not finance.
    let alice = sign_in(&p.app, "alice").await;
    p.app.send(call("GET", "/billing/usage.csv").header("cookie", &alice)).await.assert_status(403);
    p.app.send(call("GET", &format!("/billing/periods/{month}")).header("cookie", &alice)).await.assert_status(403);
}

#[tokio::test]
async fn a_team_admin_creates_a_token_whose_secret_shows_once_and_works_then_revokes_it() {
    let p = setup().await;
    let admin = p.app.admin().await;
    p.app.user(&admin, "carol", None).await;
    p.app.member(&admin, "ml", "carol", "admin").await;
    let session = sign_in(&p.app, "carol").await;
    let page = body(&p.app.send(call("GET", "/teams/ml/tokens").header("cookie", &session)).await);
    let csrf = csrf_in(&page);
    let form = format!("csrf={csrf}&name=github-actions&role=member&days=30");
    let created =
        p.app.send(call("POST", "/teams/ml/tokens").header("cookie", &session).raw(FORM, form.into_bytes())).await;
    created.assert_status(200);
    let created = body(&created);
    let secret =
        created.split("<code id=\"secret\">").nth(1).expect("the secret").split('<').next().unwrap().to_owned();
    assert!(created.contains("shown only this once"), "{created}");
    // The secret works on the API, for this team.
    p.app.send(call("GET", "/api/v1/teams/ml/jobs").token(&secret)).await.assert_status(200);
    // It is never shown again.
    let later = body(&p.app.send(call("GET", "/teams/ml/tokens").header("cookie", &session)).await);
    assert!(!later.contains(&secret));
    assert!(later.contains("github-actions"));
    // Bad input gets a plain sentence, not a token.
    let form = format!("csrf={csrf}&name=x&role=member&days=1000");
    let refused = body(
        &p.app.send(call("POST", "/teams/ml/tokens").header("cookie", &session).raw(FORM, form.into_bytes())).await,
    );
    assert!(refused.contains("Valid for: a number of days from 1 to 366."), "{refused}");
    // Revoked from its row: the API refuses it at once.
    let id = later.split("/teams/ml/tokens/").nth(1).expect("a revoke form").split('/').next().unwrap().to_owned();
    let revoke = p
        .app
        .send(
            call("POST", &format!("/teams/ml/tokens/{id}/revoke"))
                .header("cookie", &session)
                .raw(FORM, format!("csrf={csrf}").into_bytes()),
        )
        .await;
    assert_eq!(revoke.status.as_u16(), 303);
    p.app.send(call("GET", "/api/v1/teams/ml/jobs").token(&secret)).await.assert_status(401);
    // Without the form's token, nothing happens; a member who is not an admin sees no page.
    let forged = p
        .app
        .send(
            call("POST", "/teams/ml/tokens")
                .header("cookie", &session)
                .raw(FORM, b"name=evil&role=member&days=3".to_vec()),
        )
        .await;
    assert_eq!(forged.status.as_u16(), 403);
    let alice = sign_in(&p.app, "alice").await;
    p.app.send(call("GET", "/teams/ml/tokens").header("cookie", &alice)).await.assert_status(403);
}

#[tokio::test]
async fn admins_read_the_audit_log_with_what_each_change_changed_and_others_do_not() {
    let p = setup().await;
    let admin = p.app.admin().await;
    p.app
        .send(call("PUT", "/api/v1/teams/ml/quotas/h100").token(&admin).json(&json!({"reserved": 12, "burst": 4})))
        .await
        .assert_status(200);
    p.app.user(&admin, "carol", None).await;
    p.app.member(&admin, "ml", "carol", "admin").await;
    let carol = sign_in(&p.app, "carol").await;
    let page = body(&p.app.send(call("GET", "/teams/ml/audit").header("cookie", &carol)).await);
    assert!(page.contains("<td data-label=\"Action\">quota.put</td>"), "{page}");
    assert!(page.contains("reserved: 8 → 12"), "{page}");
    // Team admins see their team's log; the platform log is for platform admins only.
    p.app.send(call("GET", "/audit").header("cookie", &carol)).await.assert_status(403);
    let alice = sign_in(&p.app, "alice").await;
    p.app.send(call("GET", "/teams/ml/audit").header("cookie", &alice)).await.assert_status(403);
}

#[tokio::test]
async fn a_platform_admin_sets_a_quota_from_the_portal_and_is_warned_when_reserved_exceeds_capacity() {
    let p = setup().await;
    let admin = p.app.admin().await;
    p.app.user(&admin, "ops", Some("platform-admin")).await;
    // The platform knows of 64 H100.
    p.app
        .send(
            call("PUT", "/api/v1/clusters/sim-1")
                .token(&admin)
                .json(&json!({"backend": "sim", "capacity": {"h100": 64}})),
        )
        .await
        .assert_status(201);
    let session = sign_in(&p.app, "ops").await;
    let page = body(&p.app.send(call("GET", "/teams/ml/quotas").header("cookie", &session)).await);
    let csrf = csrf_in(&page);
    assert!(page.contains("value=\"8\""), "the current reserved quota: {page}");
    // Reserve far more than any cluster offers: saved, with the warning.
    let form = format!("csrf={csrf}&gpu_class=h100&reserved=5000&burst=4&lendable=&version=1");
    let saved = body(
        &p.app.send(call("POST", "/teams/ml/quotas").header("cookie", &session).raw(FORM, form.into_bytes())).await,
    );
    assert!(saved.contains("teams reserve 5000 h100 GPUs in total but the platform knows of only 64"), "{saved}");
    let quota = p.app.send(call("GET", "/api/v1/teams/ml/quotas/h100").token(&admin)).await.json();
    assert_eq!(quota["reserved"], 5000);
    // A stale form (version 1 again) changes nothing and says why.
    let form = format!("csrf={csrf}&gpu_class=h100&reserved=1&burst=0&lendable=&version=1");
    let stale = body(
        &p.app.send(call("POST", "/teams/ml/quotas").header("cookie", &session).raw(FORM, form.into_bytes())).await,
    );
    assert!(stale.contains("Someone changed this quota"), "{stale}");
    // Bad input names the field.
    let form = format!("csrf={csrf}&gpu_class=h100&reserved=lots&burst=0&lendable=&version=2");
    let bad = body(
        &p.app.send(call("POST", "/teams/ml/quotas").header("cookie", &session).raw(FORM, form.into_bytes())).await,
    );
    assert!(bad.contains("reserved: a whole number of GPUs"), "{bad}");
    assert_eq!(p.app.send(call("GET", "/api/v1/teams/ml/quotas/h100").token(&admin)).await.json()["reserved"], 5000);
    // Team members, even admins of the team, do not set quotas.
    let alice = sign_in(&p.app, "alice").await;
    p.app.send(call("GET", "/teams/ml/quotas").header("cookie", &alice)).await.assert_status(403);
}

#[tokio::test]
async fn a_member_reads_the_teams_statement_with_its_budget_and_a_stranger_does_not() {
    let p = setup().await;
    let admin = p.app.admin().await;
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    set_budget(&p, &admin, &month, 2_000_000_000, "hard").await;
    let session = sign_in(&p.app, "alice").await;
    let dashboard = body(&p.app.send(call("GET", "/teams/ml").header("cookie", &session)).await);
    assert!(dashboard.contains(&format!("/teams/ml/statements/{month}")), "the dashboard links it");
    let page =
        body(&p.app.send(call("GET", &format!("/teams/ml/statements/{month}")).header("cookie", &session)).await);
    assert!(page.contains(&format!("statement for {month}")), "{page}");
    assert!(page.contains("The period is open"), "{page}");
    assert!(page.contains("Budget: 2000.00 USD (hard)."), "{page}");
    assert!(page.contains("Spent to date, running jobs included: 0.00 USD"), "{page}");
    assert!(page.contains("No usage in this period."), "{page}");
    p.app.send(call("GET", "/teams/ml/statements/2026-13").header("cookie", &session)).await.assert_status(404);
    let bob = sign_in(&p.app, "bob").await;
    p.app.send(call("GET", &format!("/teams/ml/statements/{month}")).header("cookie", &bob)).await.assert_status(404);
}

/// Posts a form as the signed-in `session`; the page that answers.
pub(crate) async fn post_form(app: &TestApp, session: &str, path: &str, form: String) -> TestResponse {
    app.send(call("POST", path).header("cookie", session).raw(FORM, form.into_bytes())).await
}

/// carol's role in ml, as the API says.
async fn carols_role(app: &TestApp, admin: &str) -> Option<serde_json::Value> {
    let members = app.send(call("GET", "/api/v1/teams/ml/members").token(admin)).await.json();
    members["items"].as_array().expect("items").iter().find(|m| m["username"] == "carol").map(|m| m["role"].clone())
}

#[tokio::test]
async fn a_team_admin_adds_a_member_changes_their_role_and_removes_them_and_a_member_cannot() {
    let p = setup().await;
    let admin = p.app.admin().await;
    p.app.user(&admin, "carol", None).await;
    p.app.member(&admin, "ml", "bob", "admin").await;
    let bob = sign_in(&p.app, "bob").await;
    let page = body(&p.app.send(call("GET", "/teams/ml/members").header("cookie", &bob)).await);
    assert!(page.contains("alice"), "{page}");
    let csrf = csrf_in(&page);

    let added = post_form(&p.app, &bob, "/teams/ml/members", format!("csrf={csrf}&username=carol&role=viewer")).await;
    added.assert_status(200);
    assert!(body(&added).contains("carol is now viewer of ml."), "{}", body(&added));
    assert_eq!(carols_role(&p.app, &admin).await, Some(json!("viewer")));
    post_form(&p.app, &bob, "/teams/ml/members", format!("csrf={csrf}&username=carol&role=member"))
        .await
        .assert_status(200);
    assert_eq!(carols_role(&p.app, &admin).await, Some(json!("member")));

    // Bad input names the field and changes nothing.
    let unknown =
        post_form(&p.app, &bob, "/teams/ml/members", format!("csrf={csrf}&username=nobody&role=member")).await;
    assert!(body(&unknown).contains("username: user nobody does not exist"), "{}", body(&unknown));
    let bad_role = post_form(&p.app, &bob, "/teams/ml/members", format!("csrf={csrf}&username=carol&role=owner")).await;
    assert!(body(&bad_role).contains("role: admin, member or viewer."), "{}", body(&bad_role));
    assert_eq!(carols_role(&p.app, &admin).await, Some(json!("member")));

    let removed = post_form(&p.app, &bob, "/teams/ml/members/carol/remove", format!("csrf={csrf}")).await;
    assert_eq!(removed.status.as_u16(), 303);
    assert_eq!(carols_role(&p.app, &admin).await, None);
    // The change is in the team's audit log, by bob.
    let audit = body(&p.app.send(call("GET", "/teams/ml/audit").header("cookie", &bob)).await);
    assert!(audit.contains("member.delete") && audit.contains("user:bob"), "{audit}");

    // A member (not an admin) sees no members page and cannot post to it.
    let alice = sign_in(&p.app, "alice").await;
    p.app.send(call("GET", "/teams/ml/members").header("cookie", &alice)).await.assert_status(403);
    let alice_csrf = csrf_in(&body(&p.app.send(call("GET", "/teams/ml").header("cookie", &alice)).await));
    let refused =
        post_form(&p.app, &alice, "/teams/ml/members", format!("csrf={alice_csrf}&username=carol&role=admin")).await;
    refused.assert_status(403);
    assert_eq!(carols_role(&p.app, &admin).await, None);
}

#[tokio::test]
async fn a_platform_admin_creates_a_team_schedules_a_price_and_edits_a_priority_class_from_the_admin_page() {
    let p = setup().await;
    let admin = p.app.admin().await;
    p.app.user(&admin, "ops", Some("platform-admin")).await;
    let ops = sign_in(&p.app, "ops").await;
    let home = body(&p.app.send(call("GET", "/").header("cookie", &ops)).await);
    assert!(home.contains("href=\"/admin\""), "{home}");
    let page = body(&p.app.send(call("GET", "/admin").header("cookie", &ops)).await);
    let csrf = csrf_in(&page);
    assert!(page.contains("<td data-label=\"GPU class\">h100</td>"), "the rate card lists h100: {page}");

    // A team under ml, and a name that is not a DNS label.
    let created =
        post_form(&p.app, &ops, "/admin/teams", format!("csrf={csrf}&name=ml-vision&parent=ml&display_name=Vision"))
            .await;
    assert!(body(&created).contains("Team ml-vision created."), "{}", body(&created));
    let team = p.app.send(call("GET", "/api/v1/teams/ml-vision").token(&admin)).await.json();
    assert_eq!((team["parent"].as_str(), team["display_name"].as_str()), (Some("ml"), Some("Vision")));
    let bad =
        post_form(&p.app, &ops, "/admin/teams", format!("csrf={csrf}&name=Not+A+Label&parent=&display_name=")).await;
    bad.assert_status(200);
    let bad = body(&bad);
    assert!(bad.contains("name: ") && bad.contains("value=\"Not A Label\""), "field named, input kept: {bad}");
    let taken = post_form(&p.app, &ops, "/admin/teams", format!("csrf={csrf}&name=ml&parent=&display_name=")).await;
    assert!(body(&taken).contains("team ml already exists"), "{}", body(&taken));

    // A price from a later date shows as scheduled; the price now is unchanged.
    let priced = post_form(
        &p.app,
        &ops,
        "/admin/rates",
        format!("csrf={csrf}&gpu_class=h100&price=3.25&effective_from=2099-01-01T00%3A00"),
    )
    .await;
    let priced = body(&priced);
    assert!(priced.contains("h100: 3.25 USD per GPU-hour from 2099-01-01 00:00:00Z."), "{priced}");
    assert!(priced.contains("3.25 USD from 2099-01-01 00:00:00Z"), "{priced}");
    let rates = p.app.send(call("GET", "/api/v1/gpu-classes/h100/rates").token(&admin)).await.json();
    assert_eq!(rates.as_array().expect("rates").last().expect("the new rate")["rate_micros_per_gpu_hour"], 3_250_000);
    let past = post_form(
        &p.app,
        &ops,
        "/admin/rates",
        format!("csrf={csrf}&gpu_class=h100&price=1&effective_from=2001-01-01T00%3A00"),
    )
    .await;
    assert!(body(&past).contains("effective_from: rates cannot be changed retroactively"), "{}", body(&past));
    let words =
        post_form(&p.app, &ops, "/admin/rates", format!("csrf={csrf}&gpu_class=h100&price=cheap&effective_from="))
            .await;
    assert!(body(&words).contains("price: a price per GPU-hour such as 2.75"), "{}", body(&words));

    // Edit a priority class with its row's version; a stale version changes nothing.
    let before = p.app.send(call("GET", "/api/v1/priority-classes/experiment").token(&admin)).await;
    let version = before.header("etag").expect("etag").trim_matches('"').to_owned();
    let form = |v: &str| {
        format!(
            "csrf={csrf}&name=experiment&priority=150&preemptible=on&usage_factor=0.5&price_multiplier=0.8&preemption_delay=90&description=cheap&version={v}"
        )
    };
    let saved = post_form(&p.app, &ops, "/admin/priority-classes", form(&version)).await;
    assert!(body(&saved).contains("Priority class experiment saved."), "{}", body(&saved));
    let after = p.app.send(call("GET", "/api/v1/priority-classes/experiment").token(&admin)).await.json();
    assert_eq!(
        (&after["priority"], &after["usage_factor_milli"], &after["price_multiplier_milli"], &after["preemptible"]),
        (&json!(150), &json!(500), &json!(800), &json!(true))
    );
    assert_eq!(after["preemption_delay_seconds"], 90);
    assert!(body(&saved).contains(r#"name="preemption_delay" type="number" min="0" max="86400" size="6" value="90""#));
    let stale = post_form(&p.app, &ops, "/admin/priority-classes", form(&version)).await;
    assert!(body(&stale).contains("Someone changed this since the page was shown"), "{}", body(&stale));
    // A new class, not preemptible (the box unticked).
    let new = format!("csrf={csrf}&name=urgent&priority=900&usage_factor=2&price_multiplier=1.5&description=&version=");
    post_form(&p.app, &ops, "/admin/priority-classes", new).await.assert_status(200);
    let urgent = p.app.send(call("GET", "/api/v1/priority-classes/urgent").token(&admin)).await.json();
    assert_eq!((&urgent["preemptible"], &urgent["price_multiplier_milli"]), (&json!(false), &json!(1500)));
    // Left empty, the preemption delay is none; words are refused, naming the field.
    assert_eq!(urgent["preemption_delay_seconds"], 0);
    let words = format!(
        "csrf={csrf}&name=later&priority=1&usage_factor=1&price_multiplier=1&preemption_delay=soon&description=&version="
    );
    let refused = post_form(&p.app, &ops, "/admin/priority-classes", words).await;
    assert!(body(&refused).contains("preemption_delay: whole seconds, such as 0 or 120"), "{}", body(&refused));

    // Nobody else has an admin page, and a form posted without its token does nothing.
    let alice = sign_in(&p.app, "alice").await;
    p.app.send(call("GET", "/admin").header("cookie", &alice)).await.assert_status(403);
    let forged = post_form(&p.app, &ops, "/admin/teams", "name=forged".to_owned()).await;
    forged.assert_status(403);
    p.app.send(call("GET", "/api/v1/teams/forged").token(&admin)).await.assert_status(404);
}

#[tokio::test]
async fn a_jobs_page_shows_its_cost_so_far_booked_and_running() {
    let p = setup().await;
    // Two GPU-hours booked (5 USD), and a second attempt on 4 GPUs running for an hour.
    book(&p, "date_trunc('hour', now()) - interval '2 hours'", 5_000_000).await;
    sqlx::query(
        "insert into usage_intervals (job_id, attempt, team_id, gpu_class_id, priority_class, gpus, fraction_milli, started_at)
         select id, 2, team_id, gpu_class_id, 'experiment', 4, 1000, now() - interval '1 hour' from jobs where id = $1::uuid",
    )
    .bind(&p.job_id)
    .execute(&p.app.pool)
    .await
    .expect("a running attempt");
    let session = sign_in(&p.app, "alice").await;
    let page = body(&p.app.send(call("GET", &format!("/jobs/{}", p.job_id)).header("cookie", &session)).await);
    // 5 USD booked + about an hour of 4 GPUs at 2.50 × 0.8: 13 USD and a little, 6 GPU-hours.
    let cost = page.split("<dd class=\"cost\">").nth(1).expect("a cost").split("</dd>").next().unwrap();
    assert!(cost.starts_with("13.0") && cost.contains(" USD for 6.00 GPU-hours"), "{cost}");
    assert!(cost.ends_with("; now 8.00 USD per hour"), "{cost}");
}

#[tokio::test]
async fn a_hostile_job_name_is_text_on_every_page_that_shows_it() {
    let p = setup().await;
    let admin = p.app.admin().await;
    p.app.user(&admin, "ops", Some("platform-admin")).await;
    // The hostile job runs on a node (so the cluster view names it in a tooltip) and has a
    // booked piece (so the statement lists it among the costliest jobs).
    sqlx::query(
        "with c as (insert into clusters (id, name, backend) values (gen_random_uuid(), 'sim-1', 'sim') returning id),
              n as (insert into cluster_nodes (cluster_id, name, gpu_class_id, gpus)
                    select c.id, 'node-1', g.id, 8 from c, gpu_classes g where g.name = 'h100' returning cluster_id)
         update jobs set state = 'running', holds_gpus = true, attempt = 1, cluster_id = (select cluster_id from n),
                         placement = '[{\"node\": \"node-1\", \"gpus\": [0, 1, 2, 3]}]', started_at = now(),
                         admitted_at = now()
         where id = $1::uuid",
    )
    .bind(&p.job_id)
    .execute(&p.app.pool)
    .await
    .expect("the job runs");
    book(&p, "date_trunc('hour', now())", 5_000_000).await;
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    let alice = sign_in(&p.app, "alice").await;
    let ops = sign_in(&p.app, "ops").await;
    // (who, page, whether the page names the job: a platform admin outside the team sees
    // the cluster coloured by team, not other teams' job names).
    let pages = [
        (&alice, "/teams/ml".to_owned(), true),
        (&alice, "/teams/ml/jobs".to_owned(), true),
        (&alice, format!("/jobs/{}", p.job_id), true),
        (&alice, "/clusters".to_owned(), true),
        (&alice, format!("/teams/ml/statements/{month}"), true),
        (&ops, "/clusters".to_owned(), false),
        (&ops, "/teams/ml".to_owned(), true),
    ];
    for (session, path, names_it) in pages {
        let r = p.app.send(call("GET", &path).header("cookie", session)).await;
        r.assert_status(200);
        let page = body(&r);
        assert!(!page.contains("<script>alert(1)"), "{path} shows the name as markup:\n{page}");
        let shown = page.contains("&#60;script&#62;alert(1)&#60;/script&#62;");
        assert_eq!(shown, names_it, "{path} names the job: {shown}\n{page}");
    }
}

#[tokio::test]
async fn the_billing_page_the_period_page_a_statement_and_the_focus_export_agree_to_the_cent() {
    let p = setup().await;
    let admin = p.app.admin().await;
    p.app.user(&admin, "fin", Some("finance")).await;
    p.app.team(&admin, "vision", None).await;
    p.app
        .send(call("PUT", "/api/v1/teams/vision/quotas/h100").token(&admin).json(&json!({"reserved": 4, "burst": 0})))
        .await
        .assert_status(200);
    let vision_job = p
        .app
        .send(call("POST", "/api/v1/teams/vision/jobs").token(&admin).json(&json!({
            "name": "segment", "gpu_class": "h100", "gpus_per_replica": 1, "image": "seg:1",
        })))
        .await;
    vision_job.assert_status(201);
    let vision_job = vision_job.json()["id"].as_str().expect("id").to_owned();
    // Three pieces of 1.005 USD for ml: each alone rounds to 1.01, together they are 3.015,
    // which is 3.02 to the cent, not 3.03. And two pieces for vision.
    for minutes in [0, 30, 60] {
        book_piece(&p.app, &p.job_id, minutes, 1_005_000).await;
    }
    book_piece(&p.app, &vision_job, 0, 2_500_000).await;
    book_piece(&p.app, &vision_job, 30, 1_234_567).await;
    let month = chrono::Utc::now().format("%Y-%m").to_string();

    // The FOCUS export, in full precision: the truth the pages must agree with.
    let finance = p.app.login("fin", USER_PASSWORD).await;
    let export =
        p.app.send(call("GET", &format!("/api/v1/billing/exports?period={month}&format=focus")).token(&finance)).await;
    export.assert_status(200);
    let export = body(&export);
    let mut lines = export.lines();
    let header = csv_fields(lines.next().expect("a header"));
    let column = |name: &str| header.iter().position(|c| c == name).expect(name);
    let (billed, team) = (column("BilledCost"), column("SubAccountName"));
    let mut by_team = std::collections::BTreeMap::<String, i64>::new();
    for line in lines {
        let fields = csv_fields(line);
        *by_team.entry(fields[team].clone()).or_default() += micros_of(&fields[billed]);
    }
    assert_eq!(by_team.get("ml"), Some(&3_015_000), "{export}");
    assert_eq!(by_team.get("vision"), Some(&3_734_567), "{export}");
    let all: i64 = by_team.values().sum();
    let (ml, vision, all) = (to_the_cent(by_team["ml"]), to_the_cent(by_team["vision"]), to_the_cent(all));
    assert_eq!((ml.as_str(), vision.as_str(), all.as_str()), ("3.02 USD", "3.73 USD", "6.75 USD"));

    let session = sign_in(&p.app, "fin").await;
    // The billing page: each team's line, their sum, and the period's line say the same.
    let page = body(&p.app.send(call("GET", "/billing").header("cookie", &session)).await);
    assert_eq!(billed_after(&page, &format!("href=\"/teams/ml/statements/{month}\">ml</a>")), ml);
    assert_eq!(billed_after(&page, &format!("href=\"/teams/vision/statements/{month}\">vision</a>")), vision);
    assert_eq!(billed_after(&page, "All teams"), all);
    assert_eq!(billed_after(&page, &format!("data-period=\"{month}\"")), all);
    // The period's page: the same lines and total.
    let period = body(&p.app.send(call("GET", &format!("/billing/periods/{month}")).header("cookie", &session)).await);
    assert_eq!(billed_after(&period, "<td data-label=\"Team\">ml</td>"), ml);
    assert_eq!(billed_after(&period, "<td data-label=\"Team\">vision</td>"), vision);
    assert_eq!(billed_after(&period, "All teams"), all);
    // Each team's statement: its total.
    for (name, total) in [("ml", &ml), ("vision", &vision)] {
        let statement = body(
            &p.app.send(call("GET", &format!("/teams/{name}/statements/{month}")).header("cookie", &session)).await,
        );
        assert_eq!(&billed_after(&statement, "<tr class=\"total\">"), total, "{name}: {statement}");
    }
    // The API's statement keeps the export's precision.
    let api = p.app.send(call("GET", &format!("/api/v1/teams/ml/statements/{month}")).token(&admin)).await.json();
    assert_eq!(api["billed_cost"], "3.015000");
}

#[tokio::test]
async fn a_waiting_jobs_page_and_the_dashboard_show_its_reason_its_positions_in_team_and_overall_and_its_expected_start(
) {
    let p = setup().await;
    let alice = p.app.login("alice", USER_PASSWORD).await;
    // A second waiting job of ml, ahead of the first in the whole queue (position 1 of the
    // team) while another team's jobs stand between: overall 3 and 7, in the team 1 and 2.
    let second = p
        .app
        .send(call("POST", "/api/v1/teams/ml/jobs").token(&alice).json(&json!({
            "name": "second", "gpu_class": "h100", "gpus_per_replica": 1, "image": "train:1",
        })))
        .await;
    second.assert_status(201);
    let second = second.json()["id"].as_str().expect("id").to_owned();
    let held_for = format!("GPUs are held for job {second}, an earlier gang that would otherwise starve");
    for (id, position, message) in
        [(&p.job_id, 7, held_for.as_str()), (&second, 3, "not enough free GPUs of this class")]
    {
        sqlx::query(
            "update jobs set pending_reason = 'x', pending_message = $3, queue_position = $2,
                             expected_start_at = '2031-05-06T07:08:00Z' where id = $1::uuid",
        )
        .bind(id)
        .bind(position)
        .bind(message)
        .execute(&p.app.pool)
        .await
        .expect("a scheduling cycle's record");
    }
    let session = sign_in(&p.app, "alice").await;
    let page = body(&p.app.send(call("GET", &format!("/jobs/{}", p.job_id)).header("cookie", &session)).await);
    assert!(page.contains("<dt>Position in team</dt><dd class=\"team-position\">2</dd>"), "{page}");
    assert!(page.contains("<dt>Position overall</dt><dd class=\"overall-position\">7</dd>"), "{page}");
    assert!(page.contains("<dd class=\"expected-start\">2031-05-06 07:08:00Z</dd>"), "{page}");
    // The job the reason names is named, and linked, not shown as a uuid.
    assert!(
        page.contains(&format!(
            "<dd class=\"reason\">GPUs are held for job <a href=\"/jobs/{second}\">second</a>, an earlier gang"
        )),
        "{page}"
    );
    assert!(!page.contains(&format!("job {second}")), "{page}");
    let dashboard = body(&p.app.send(call("GET", "/teams/ml").header("cookie", &session)).await);
    let rows: Vec<&str> = dashboard.split("<td data-label=\"Position in team\">").skip(1).collect();
    assert_eq!(rows.len(), 2, "{dashboard}");
    assert!(rows[0].starts_with("1</td><td data-label=\"Position overall\">3</td>") && rows[0].contains(">second</a>"));
    assert!(rows[1].starts_with("2</td><td data-label=\"Position overall\">7</td>"), "{dashboard}");
    assert!(rows[1].contains("<td data-label=\"Expected start\">2031-05-06 07:08:00Z</td>"), "{dashboard}");
}

#[tokio::test]
async fn run_again_on_a_jobs_page_submits_the_same_job_and_shows_the_new_one() {
    let p = setup().await;
    let session = sign_in(&p.app, "alice").await;
    let page = p.app.send(call("GET", &format!("/jobs/{}", p.job_id)).header("cookie", &session)).await;
    let html = body(&page);
    assert!(html.contains(&format!("action=\"/jobs/{}/rerun\"", p.job_id)), "a member sees Run again: {html}");
    let token = csrf_in(&html);
    let r = p
        .app
        .send(
            call("POST", &format!("/jobs/{}/rerun", p.job_id))
                .header("cookie", &session)
                .raw(FORM, format!("csrf={token}").into_bytes()),
        )
        .await;
    assert_eq!(r.status.as_u16(), 303, "{}", body(&r));
    let location = r.header("location").expect("to the new job");
    let again = location.strip_prefix("/jobs/").expect("a job page").to_owned();
    assert_ne!(again, p.job_id);
    let (name, by, rerun_of): (String, String, String) =
        sqlx::query_as("select name, submitted_by, labels->>'fairway.dev/rerun-of' from jobs where id = $1::uuid")
            .bind(&again)
            .fetch_one(&p.app.pool)
            .await
            .unwrap();
    let original: String = sqlx::query_scalar("select name from jobs where id = $1::uuid")
        .bind(&p.job_id)
        .fetch_one(&p.app.pool)
        .await
        .unwrap();
    assert_eq!((name, by, rerun_of), (original, "user:alice".to_owned(), p.job_id.clone()));
}

/// A urlencoded form body of `fields`, in order (a field may repeat, as ticked checkboxes do).
pub(crate) fn form_of(fields: &[(&str, &str)]) -> String {
    let mut url = reqwest::Url::parse("http://form.invalid/").expect("a URL");
    url.query_pairs_mut().extend_pairs(fields);
    url.query().unwrap_or_default().to_owned()
}

/// The webhooks the API lists for team `team`, as the admin sees them.
async fn listed_webhooks(app: &TestApp, admin: &str, team: &str) -> Vec<serde_json::Value> {
    let r = app.send(call("GET", &format!("/api/v1/teams/{team}/webhooks")).token(admin)).await;
    r.assert_status(200);
    r.json()["items"].as_array().expect("items").clone()
}

/// The text of the secret a page shows once.
fn shown_secret(page: &str) -> Option<String> {
    Some(page.split("<code id=\"secret\">").nth(1)?.split('<').next()?.to_owned())
}

#[tokio::test]
async fn a_team_admin_creates_a_webhook_from_the_portal_sees_its_secret_once_and_the_api_lists_it_then_deletes_it() {
    let p = setup().await;
    let admin = p.app.admin().await;
    p.app.user(&admin, "carol", None).await;
    p.app.member(&admin, "ml", "carol", "admin").await;
    let carol = sign_in(&p.app, "carol").await;
    let dashboard = body(&p.app.send(call("GET", "/teams/ml").header("cookie", &carol)).await);
    assert!(dashboard.contains("<a href=\"/teams/ml/webhooks\">Webhooks</a>"), "{dashboard}");
    let page = body(&p.app.send(call("GET", "/teams/ml/webhooks").header("cookie", &carol)).await);
    assert!(page.contains("No webhook yet."), "{page}");
    for event in fairway::control::notify::EVENT_TYPES {
        assert!(page.contains(&format!("name=\"events\" value=\"{event}\"")), "no checkbox for {event}: {page}");
    }
    let csrf = csrf_in(&page);

    let url = "https://hooks.slack.example.com/services/T000/B000/XXXX";
    let form = form_of(&[
        ("csrf", &csrf),
        ("url", url),
        ("events", "job.failed"),
        ("events", "job.succeeded"),
        ("format", "slack"),
    ]);
    let created = post_form(&p.app, &carol, "/teams/ml/webhooks", form).await;
    created.assert_status(200);
    let created = body(&created);
    let secret = shown_secret(&created).unwrap_or_else(|| panic!("no secret shown: {created}"));
    assert!(secret.starts_with("whsec_"), "{secret}");
    assert!(created.contains("shown only this once"), "{created}");

    // The API lists it as it was made, without the secret.
    let listed = listed_webhooks(&p.app, &admin, "ml").await;
    assert_eq!(listed.len(), 1, "{listed:#?}");
    assert_eq!(listed[0]["url"], url);
    assert_eq!(listed[0]["events"], json!(["job.failed", "job.succeeded"]));
    assert_eq!(listed[0]["format"], "slack");
    assert_eq!(listed[0]["created_by"], "carol");
    assert!(!listed[0].to_string().contains(&secret));
    let id = listed[0]["id"].as_str().expect("id").to_owned();

    // The list shows it whole to its admin, linked to its log; the secret never again.
    let later = body(&p.app.send(call("GET", "/teams/ml/webhooks").header("cookie", &carol)).await);
    assert!(!later.contains(&secret), "{later}");
    assert!(later.contains(&format!("<a href=\"/teams/ml/webhooks/{id}\"><code>{url}</code></a>")), "{later}");
    assert!(later.contains("job.failed, job.succeeded") && later.contains("by carol"), "{later}");
    let log = body(&p.app.send(call("GET", &format!("/teams/ml/webhooks/{id}")).header("cookie", &carol)).await);
    assert!(log.contains(url) && log.contains("No delivery yet."), "{log}");

    // Deleted from its row: gone from the API and the page, and the change is audited.
    let deleted = post_form(&p.app, &carol, &format!("/teams/ml/webhooks/{id}/delete"), format!("csrf={csrf}")).await;
    assert_eq!(
        (deleted.status.as_u16(), deleted.header("location").as_deref()),
        (303, Some("/teams/ml/webhooks")),
        "{}",
        body(&deleted)
    );
    assert!(listed_webhooks(&p.app, &admin, "ml").await.is_empty());
    let after = body(&p.app.send(call("GET", "/teams/ml/webhooks").header("cookie", &carol)).await);
    assert!(after.contains("No webhook yet."), "{after}");
    p.app.send(call("GET", &format!("/teams/ml/webhooks/{id}")).header("cookie", &carol)).await.assert_status(404);
    let audit = body(&p.app.send(call("GET", "/teams/ml/audit").header("cookie", &carol)).await);
    assert!(audit.contains("webhook.create") && audit.contains("webhook.delete"), "{audit}");

    // Without the form's token nothing is created.
    let forged =
        post_form(&p.app, &carol, "/teams/ml/webhooks", form_of(&[("url", url), ("events", "job.failed")])).await;
    forged.assert_status(403);
    assert!(listed_webhooks(&p.app, &admin, "ml").await.is_empty());
}

#[tokio::test]
async fn a_webhooks_delivery_log_page_shows_the_delivery_the_notifier_made_newest_first() {
    let (app, admin, token) = crate::webhooks::platform().await;
    let (base, receiver) = crate::webhooks::Receiver::start().await;
    let (hook, _) = crate::webhooks::webhook(
        &app,
        &admin,
        "ml",
        json!({"url": format!("{base}/portal"), "events": ["job.failed", "job.succeeded"]}),
    )
    .await;
    app.user(&admin, "vera", None).await;
    app.member(&admin, "ml", "vera", "viewer").await;
    let vera = sign_in(&app, "vera").await;
    let page = format!("/teams/ml/webhooks/{hook}");
    let empty = body(&app.send(call("GET", &page).header("cookie", &vera)).await);
    assert!(empty.contains("No delivery yet."), "{empty}");

    let failing = crate::lifecycle::submit(&app, &token, "ml", crate::webhooks::job("breaks", 3)).await;
    crate::lifecycle::wait_for(&app, &token, &failing, std::time::Duration::from_secs(30), |j| {
        j["finished_at"].is_string()
    })
    .await;
    let got = receiver.wait("portal", |got| !got.is_empty()).await;
    let message_id = got[0].id.clone();
    // The receiver answered; the log records it once the notifier has written its answer.
    let shown = loop {
        let shown = body(&app.send(call("GET", &page).header("cookie", &vera)).await);
        if shown.contains("class=\"state\">delivered<") {
            break shown;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(shown.contains("<td data-label=\"Event\">job.failed</td>"), "{shown}");
    assert!(shown.contains(&format!("<code>{message_id}</code>")), "{shown}");
    assert!(shown.contains("<td data-label=\"Attempts\">1</td>"), "{shown}");
    assert!(shown.contains("<td data-label=\"Last HTTP status\">200</td>"), "{shown}");
    assert!(shown.contains("delivered 20"), "the delivery's time: {shown}");

    // A second message comes first in the log.
    let passing = crate::lifecycle::submit(&app, &token, "ml", crate::webhooks::job("works", 0)).await;
    crate::lifecycle::wait_for(&app, &token, &passing, std::time::Duration::from_secs(30), |j| {
        j["finished_at"].is_string()
    })
    .await;
    let shown = loop {
        let shown = body(&app.send(call("GET", &page).header("cookie", &vera)).await);
        if shown.matches("class=\"state\">delivered<").count() == 2 {
            break shown;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let newer = shown.find("job.succeeded</td>").unwrap_or_else(|| panic!("no job.succeeded row: {shown}"));
    let older = shown.find("job.failed</td>").expect("the job.failed row");
    assert!(newer < older, "newest first: {shown}");
}

#[tokio::test]
async fn a_viewer_sees_only_the_origin_of_a_webhooks_url_and_no_form_to_create_or_delete_one() {
    let p = setup().await;
    let admin = p.app.admin().await;
    let r =
        p.app
            .send(call("POST", "/api/v1/teams/ml/webhooks").token(&admin).json(
                &json!({"url": "https://hooks.slack.example.com/services/T000/B000/XXXX", "events": ["job.failed"]}),
            ))
            .await;
    r.assert_status(201);
    let id = r.json()["id"].as_str().expect("id").to_owned();
    p.app.user(&admin, "vera", None).await;
    p.app.member(&admin, "ml", "vera", "viewer").await;
    let vera = sign_in(&p.app, "vera").await;

    let dashboard = body(&p.app.send(call("GET", "/teams/ml").header("cookie", &vera)).await);
    assert!(dashboard.contains("<a href=\"/teams/ml/webhooks\">Webhooks</a>"), "{dashboard}");
    for path in ["/teams/ml/webhooks".to_owned(), format!("/teams/ml/webhooks/{id}")] {
        let page = p.app.send(call("GET", &path).header("cookie", &vera)).await;
        page.assert_status(200);
        let page = body(&page);
        assert!(page.contains("<code>https://hooks.slack.example.com/…</code>"), "{path}: {page}");
        assert!(!page.contains("/services/T000"), "{path}: {page}");
        assert!(!page.contains("action=\"/teams/ml/webhooks\""), "{path}: a create form: {page}");
        assert!(!page.contains("/delete\""), "{path}: a delete button: {page}");
    }
    // Posting anyway is refused for her role, and changes nothing.
    let csrf = csrf_in(&body(&p.app.send(call("GET", "/teams/ml/webhooks").header("cookie", &vera)).await));
    let create = form_of(&[("csrf", &csrf), ("url", "https://evil.example.com/"), ("events", "job.failed")]);
    let refused = post_form(&p.app, &vera, "/teams/ml/webhooks", create).await;
    refused.assert_status(403);
    assert!(body(&refused).contains("Your role in this team does not allow that."));
    post_form(&p.app, &vera, &format!("/teams/ml/webhooks/{id}/delete"), format!("csrf={csrf}"))
        .await
        .assert_status(403);
    assert_eq!(listed_webhooks(&p.app, &admin, "ml").await.len(), 1);
}

#[tokio::test]
async fn a_user_of_another_team_gets_the_not_found_page_for_a_teams_webhooks_and_its_delivery_log() {
    let p = setup().await;
    let admin = p.app.admin().await;
    p.app.team(&admin, "other", None).await;
    p.app.member(&admin, "other", "bob", "admin").await;
    let hook = |team: &'static str, url: &'static str| {
        let app = &p.app;
        let admin = admin.clone();
        async move {
            let r = app
                .send(
                    call("POST", &format!("/api/v1/teams/{team}/webhooks"))
                        .token(&admin)
                        .json(&json!({"url": url, "events": ["job.failed"]})),
                )
                .await;
            r.assert_status(201);
            r.json()["id"].as_str().expect("id").to_owned()
        }
    };
    let ml_hook = hook("ml", "https://hooks.example.com/ml-secret-path").await;
    let other_hook = hook("other", "https://hooks.example.com/other-secret-path").await;
    let bob = sign_in(&p.app, "bob").await;
    let bob_csrf = csrf_in(&body(&p.app.send(call("GET", "/teams/other/webhooks").header("cookie", &bob)).await));
    for path in ["/teams/ml/webhooks".to_owned(), format!("/teams/ml/webhooks/{ml_hook}")] {
        let r = p.app.send(call("GET", &path).header("cookie", &bob)).await;
        assert_eq!(r.status.as_u16(), 404, "{path}");
        let page = body(&r);
        assert!(page.contains("There is nothing here for you."), "{path}: {page}");
        assert!(!page.contains("hooks.example.com"), "{path}: {page}");
    }
    // Nor can bob create or delete one of ml's, even as an admin of his own team.
    let create = form_of(&[("csrf", &bob_csrf), ("url", "https://evil.example.com/"), ("events", "job.failed")]);
    post_form(&p.app, &bob, "/teams/ml/webhooks", create).await.assert_status(404);
    post_form(&p.app, &bob, &format!("/teams/ml/webhooks/{ml_hook}/delete"), format!("csrf={bob_csrf}"))
        .await
        .assert_status(404);
    // His own team's pages do not reach ml's webhook either.
    p.app
        .send(call("GET", &format!("/teams/other/webhooks/{ml_hook}")).header("cookie", &bob))
        .await
        .assert_status(404);
    post_form(&p.app, &bob, &format!("/teams/other/webhooks/{ml_hook}/delete"), format!("csrf={bob_csrf}"))
        .await
        .assert_status(404);
    assert_eq!(listed_webhooks(&p.app, &admin, "ml").await.len(), 1);
    // And a member of ml does not reach other's webhook through ml's pages, nor a made-up id.
    let alice = sign_in(&p.app, "alice").await;
    for path in [format!("/teams/ml/webhooks/{other_hook}"), "/teams/ml/webhooks/not-a-webhook".to_owned()] {
        let r = p.app.send(call("GET", &path).header("cookie", &alice)).await;
        assert_eq!(r.status.as_u16(), 404, "{path}");
        assert!(!body(&r).contains("other-secret-path"), "{path}");
    }
}

#[tokio::test]
async fn a_bad_url_on_the_webhook_form_is_shown_back_in_words_with_what_was_typed_and_nothing_is_created() {
    let p = setup().await;
    let admin = p.app.admin().await;
    p.app.user(&admin, "carol", None).await;
    p.app.member(&admin, "ml", "carol", "admin").await;
    let carol = sign_in(&p.app, "carol").await;
    let csrf = csrf_in(&body(&p.app.send(call("GET", "/teams/ml/webhooks").header("cookie", &carol)).await));

    for (typed, words) in
        [("not a url", "url: is not a URL"), ("ftp://hooks.example.com/drop", "url: must be an http or https URL")]
    {
        let form =
            form_of(&[("csrf", &csrf), ("url", typed), ("events", "job.failed"), ("events", "budget.threshold")]);
        let r = post_form(&p.app, &carol, "/teams/ml/webhooks", form).await;
        r.assert_status(200);
        let page = body(&r);
        assert!(page.contains(&format!("<p class=\"notice\">{words}")), "{typed}: {page}");
        assert!(page.contains(&format!("value=\"{typed}\"")), "{typed} kept: {page}");
        for ticked in ["job.failed", "budget.threshold"] {
            assert!(page.contains(&format!("value=\"{ticked}\" checked")), "{typed}: {ticked} kept: {page}");
        }
        assert!(!page.contains("value=\"job.succeeded\" checked"), "{page}");
        assert!(shown_secret(&page).is_none(), "{page}");
    }
    // No event ticked is said in words too.
    let r = post_form(
        &p.app,
        &carol,
        "/teams/ml/webhooks",
        form_of(&[("csrf", &csrf), ("url", "https://ok.example.com/")]),
    )
    .await;
    assert!(body(&r).contains("events: must name at least one event type"), "{}", body(&r));
    assert!(listed_webhooks(&p.app, &admin, "ml").await.is_empty());
}

#[tokio::test]
async fn an_arrays_page_shows_its_counts_and_tasks_by_index_a_task_links_back_and_a_member_cancels_it_whole() {
    let p = setup().await;
    let alice = p.app.login("alice", USER_PASSWORD).await;
    let r = p
        .app
        .send(call("POST", "/api/v1/teams/ml/arrays").token(&alice).json(&json!({
            "count": 3, "parallelism": 1,
            "task": {"name": "<b>sweep</b>", "gpu_class": "h100", "image": "sweep:1"},
        })))
        .await;
    r.assert_status(201);
    let id = r.json()["id"].as_str().expect("id").to_owned();
    let session = sign_in(&p.app, "alice").await;
    let list = body(&p.app.send(call("GET", "/teams/ml/arrays").header("cookie", &session)).await);
    assert!(list.contains(&format!("href=\"/teams/ml/arrays/{id}\"")), "{list}");
    assert!(list.contains("&#60;b&#62;sweep&#60;/b&#62;") && !list.contains("<b>sweep"), "names are text: {list}");
    assert!(list.contains("3, at most 1 at once: 1 waiting, 2 held by parallelism"), "{list}");
    let page = body(&p.app.send(call("GET", &format!("/teams/ml/arrays/{id}")).header("cookie", &session)).await);
    assert!(page.contains("<dd class=\"state\">pending</dd>"), "{page}");
    let rows: Vec<&str> = page.split("<td data-label=\"Index\">").skip(1).collect();
    assert_eq!(rows.len(), 3, "{page}");
    assert!(rows[2].contains("held by its array&#39;s parallelism: at most 1 of its 3 tasks"), "{}", rows[2]);
    // A task's page says which task of which array it is.
    let task: String = sqlx::query_scalar("select id::text from jobs where array_id = $1::uuid and array_index = 1")
        .bind(&id)
        .fetch_one(&p.app.pool)
        .await
        .unwrap();
    let task_page = body(&p.app.send(call("GET", &format!("/jobs/{task}")).header("cookie", &session)).await);
    assert!(task_page.contains(&format!("<a href=\"/teams/ml/arrays/{id}\">task 1 of 3</a>")), "{task_page}");
    // A stranger sees nothing of it.
    let bob = sign_in(&p.app, "bob").await;
    let r = p.app.send(call("GET", &format!("/teams/ml/arrays/{id}")).header("cookie", &bob)).await;
    assert_eq!(r.status.as_u16(), 404);
    // A member cancels it whole from its page.
    let token = csrf_in(&page);
    let r = p
        .app
        .send(
            call("POST", &format!("/teams/ml/arrays/{id}/cancel"))
                .header("cookie", &session)
                .raw(FORM, format!("csrf={token}").into_bytes()),
        )
        .await;
    assert_eq!(r.status.as_u16(), 303, "{}", body(&r));
    let after = body(&p.app.send(call("GET", &format!("/teams/ml/arrays/{id}")).header("cookie", &session)).await);
    assert!(after.contains("<dd class=\"state\">cancelled</dd>") && after.contains("3 cancelled"), "{after}");
    assert!(!after.contains("/cancel\""), "no cancel button once it ended: {after}");
}

#[tokio::test]
async fn the_submit_form_submits_an_array_when_given_a_task_count_and_names_a_count_that_is_wrong() {
    let p = setup().await;
    let session = sign_in(&p.app, "alice").await;
    let r = p.app.send(call("GET", "/teams/ml/jobs/new").header("cookie", &session)).await;
    let token = csrf_in(&body(&r));
    assert!(body(&r).contains("name=\"array_count\""), "the form offers a task count");
    let form = |count: &str, parallelism: &str| {
        format!(
            "csrf={token}&action=submit&name=sweep&gpu_class=h100&replicas=1&gpus_per_replica=1&priority_class=experiment\
             &max_runtime_seconds=600&image=sweep%3A1&array_count={count}&array_parallelism={parallelism}"
        )
    };
    let send = |text: String| {
        p.app.send(call("POST", "/teams/ml/jobs/new").header("cookie", &session).raw(FORM, text.into_bytes()))
    };
    let r = send(form("many", "")).await;
    assert_eq!(r.status.as_u16(), 422);
    assert!(body(&r).contains("<code>count</code>: must be a whole number"), "{}", body(&r));
    let r = send(form("4", "5")).await;
    assert_eq!(r.status.as_u16(), 422);
    assert!(body(&r).contains("<code>parallelism</code>: must be at most the task count (4)"), "{}", body(&r));
    let before: i64 = sqlx::query_scalar("select count(*) from jobs").fetch_one(&p.app.pool).await.unwrap();
    assert_eq!(before, 1, "a refused array stores no task");
    let r = send(form("4", "2")).await;
    assert_eq!(r.status.as_u16(), 303, "{}", body(&r));
    let location = r.header("location").expect("to the array's page");
    assert!(location.starts_with("/teams/ml/arrays/"), "{location}");
    let page = body(&p.app.send(call("GET", &location).header("cookie", &session)).await);
    assert!(page.contains("4, at most 2 at once"), "{page}");
    let tasks: i64 = sqlx::query_scalar("select count(*) from jobs where array_id is not null")
        .fetch_one(&p.app.pool)
        .await
        .unwrap();
    assert_eq!(tasks, 4);
}

#[tokio::test]
async fn a_member_creates_scales_rolls_and_deletes_a_service_from_the_portal_and_a_stranger_sees_none_of_it() {
    let p = setup().await;
    let session = sign_in(&p.app, "alice").await;
    let list = body(&p.app.send(call("GET", "/teams/ml/services").header("cookie", &session)).await);
    assert!(list.contains("No services yet.") && list.contains("<option value=\"h100\""), "{list}");
    let csrf = csrf_in(&list);
    // A name that is no DNS label is refused in words, with what was typed kept.
    let bad = form_of(&[
        ("csrf", &csrf),
        ("name", "Chat Bot"),
        ("gpu_class", "h100"),
        ("gpus", "2"),
        ("image", "serve:1"),
        ("min_replicas", "1"),
        ("max_replicas", "2"),
    ]);
    let r = post_form(&p.app, &session, "/teams/ml/services", bad).await;
    assert!(body(&r).contains("name: may contain only lowercase letters"), "{}", body(&r));
    assert!(body(&r).contains("value=\"serve:1\""), "the form keeps what was typed");
    let good = form_of(&[
        ("csrf", &csrf),
        ("name", "chat"),
        ("gpu_class", "h100"),
        ("gpus", "2"),
        ("image", "serve:1"),
        ("min_replicas", "1"),
        ("max_replicas", "2"),
        ("port", ""),
    ]);
    let r = post_form(&p.app, &session, "/teams/ml/services", good).await;
    assert_eq!(
        (r.status.as_u16(), r.header("location").as_deref()),
        (303, Some("/teams/ml/services/chat")),
        "{}",
        body(&r)
    );
    let page = body(&p.app.send(call("GET", "/teams/ml/services/chat").header("cookie", &session)).await);
    assert!(page.contains("<dd class=\"state\">starting</dd>"), "{page}");
    assert!(page.contains("1 to 2: the first 1 at production (never preempted)"), "{page}");
    assert!(page.contains("2 × h100, image <code class=\"image\">serve:1</code>, revision 1, port 8000"), "{page}");

    // Scale within the range, then beyond it (refused, naming the field).
    let csrf = csrf_in(&page);
    let scale = |n: &str| form_of(&[("csrf", &csrf), ("version", "1"), ("replicas", n)]);
    let r = post_form(&p.app, &session, "/teams/ml/services/chat/change", scale("2")).await;
    assert!(body(&r).contains("Scaling chat to 2 replicas."), "{}", body(&r));
    let r = post_form(&p.app, &session, "/teams/ml/services/chat/change", scale("3")).await;
    assert!(
        body(&r).contains("Someone changed this since the page was shown"),
        "a stale form is refused: {}",
        body(&r)
    );
    let stale_free = form_of(&[("csrf", &csrf), ("version", "2"), ("replicas", "3")]);
    let r = post_form(&p.app, &session, "/teams/ml/services/chat/change", stale_free).await;
    assert!(body(&r).contains("replicas: must be between min_replicas (1) and max_replicas (2)"), "{}", body(&r));
    // A new image starts a rolling update: revision 2.
    let roll = form_of(&[("csrf", &csrf), ("version", "2"), ("image", "serve:2")]);
    let r = post_form(&p.app, &session, "/teams/ml/services/chat/change", roll).await;
    let after = body(&r);
    assert!(after.contains("Rolling chat to serve:2, one replica at a time."), "{after}");
    assert!(after.contains("<code class=\"image\">serve:2</code>, revision 2"), "{after}");
    let api = p.app.login("alice", USER_PASSWORD).await;
    let service = p.app.send(call("GET", "/api/v1/teams/ml/services/chat").token(&api)).await.json();
    assert_eq!((service["replicas"].as_i64(), service["revision"].as_i64()), (Some(2), Some(2)), "{service:#}");

    // A stranger sees nothing of it.
    let bob = sign_in(&p.app, "bob").await;
    let r = p.app.send(call("GET", "/teams/ml/services/chat").header("cookie", &bob)).await;
    assert_eq!(r.status.as_u16(), 404);
    // Deleted from its page: gone from the list.
    let r = post_form(&p.app, &session, "/teams/ml/services/chat/delete", form_of(&[("csrf", &csrf)])).await;
    assert_eq!((r.status.as_u16(), r.header("location").as_deref()), (303, Some("/teams/ml/services")));
    let list = body(&p.app.send(call("GET", "/teams/ml/services").header("cookie", &session)).await);
    assert!(list.contains("No services yet."), "{list}");
}
