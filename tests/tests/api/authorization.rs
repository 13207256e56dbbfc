//! The authorization matrix: every route × every kind of caller, each cell as specified.
//!
//! The expectations are written out here, independently of the server's policy table, and
//! the test fails if the OpenAPI document lists a route this matrix does not cover.

use fairway::config::CiIssuer;
use fairway_tests::{call, TestApp, USER_PASSWORD};
use serde_json::{json, Value};

/// The callers, in the order of each row's expectations.
const CALLERS: [&str; 7] = ["anonymous", "viewer", "member", "admin-of-b", "token-of-b", "finance", "platform-admin"];

/// What a caller gets: `A` allowed (2xx), or an error status.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cell {
    A,
    E(u16),
}
use Cell::{A, E};

const U: Cell = E(401);
const F: Cell = E(403);
const N: Cell = E(404);

/// Public to all.
const PUBLIC: [Cell; 7] = [A, A, A, A, A, A, A];
/// Any signed-in caller.
const SIGNED_IN: [Cell; 7] = [U, A, A, A, A, A, A];
/// Platform admins only, for platform-wide objects.
const PLATFORM: [Cell; 7] = [U, F, F, F, F, F, A];
/// Readers of team A: its members, finance and platform admins; others do not see it.
const TEAM_READ: [Cell; 7] = [U, A, A, N, N, A, A];
/// Admins of team A (here only the platform admin); team members get 403, strangers 404.
const TEAM_ADMIN: [Cell; 7] = [U, F, F, N, N, F, A];
/// Members of team A and platform admins; its viewers and finance get 403, strangers 404.
const TEAM_MEMBER: [Cell; 7] = [U, F, A, N, N, F, A];
/// Finance and platform admins, for billing across all teams.
const FINANCE: [Cell; 7] = [U, F, F, F, F, A, A];

struct Row {
    method: &'static str,
    path: &'static str,
    cells: [Cell; 7],
    body: Option<Value>,
    /// A problem (status, code) that also counts as allowed: the caller got past
    /// authorization and the handler refused the request for the state of the object.
    allowed_problem: Option<(u16, &'static str)>,
}

fn row(method: &'static str, path: &'static str, cells: [Cell; 7], body: Option<Value>) -> Row {
    Row { method, path, cells, body, allowed_problem: None }
}

/// The CI issuer the matrix's service trusts: nothing is fetched from it, as no token it
/// signed is ever exchanged here.
const CI_ISSUER: &str = "https://token.actions.githubusercontent.com";

/// A job body every caller allowed to submit may send.
fn job_spec() -> Value {
    json!({"name": "matrix", "gpu_class": "h100", "image": "registry.example/train:1", "command": ["python", "train.py"]})
}

/// A service body every caller allowed to create one may send: one replica at the default
/// (non-preemptible) class, within team A's reserved quota.
fn service_spec(name: &str) -> Value {
    json!({"name": name, "replica": {"gpu_class": "h100", "image": "registry.example/serve:1"}})
}

fn matrix() -> Vec<Row> {
    let soon = (chrono::Utc::now() + chrono::Duration::days(7)).to_rfc3339();
    let later = (chrono::Utc::now() + chrono::Duration::days(30)).to_rfc3339();
    vec![
        row("GET", "/healthz", PUBLIC, None),
        row("GET", "/readyz", PUBLIC, None),
        row("GET", "/metrics", PUBLIC, None),
        row("POST", "/api/v1/auth/token", PUBLIC, Some(json!({"username": "viewer", "password": USER_PASSWORD}))),
        // Anyone may ask; a token no policy admits is refused by the handler, not the gate.
        Row {
            allowed_problem: Some((401, "identity_refused")),
            ..row(
                "POST",
                "/api/v1/auth/token-exchange",
                PUBLIC,
                Some(json!({
                    "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
                    "subject_token": "not.a.jwt",
                    "subject_token_type": "urn:ietf:params:oauth:token-type:id_token"
                })),
            )
        },
        row("GET", "/api/v1/me", SIGNED_IN, None),
        row(
            "POST",
            "/api/v1/me/password",
            [U, A, A, A, F, A, A],
            Some(json!({"current_password": USER_PASSWORD, "new_password": USER_PASSWORD})),
        ),
        row("GET", "/api/v1/users", PLATFORM, None),
        row("PATCH", "/api/v1/users/{username}", PLATFORM, Some(json!({"disabled": false}))),
        row("POST", "/api/v1/users", PLATFORM, Some(json!({"username": "newcomer", "password": USER_PASSWORD}))),
        row("GET", "/api/v1/teams", SIGNED_IN, None),
        row("POST", "/api/v1/teams", PLATFORM, Some(json!({"name": "team-c"}))),
        row("GET", "/api/v1/teams/{team}", TEAM_READ, None),
        row("PATCH", "/api/v1/teams/{team}", TEAM_ADMIN, Some(json!({"display_name": "Team A"}))),
        row("DELETE", "/api/v1/teams/{team}", TEAM_ADMIN, None),
        row("GET", "/api/v1/teams/{team}/members", TEAM_READ, None),
        row("PUT", "/api/v1/teams/{team}/members/{username}", TEAM_ADMIN, Some(json!({"role": "viewer"}))),
        row("DELETE", "/api/v1/teams/{team}/members/{username}", TEAM_ADMIN, None),
        row("GET", "/api/v1/teams/{team}/tokens", TEAM_ADMIN, None),
        row(
            "POST",
            "/api/v1/teams/{team}/tokens",
            TEAM_ADMIN,
            Some(json!({"name": "ci", "role": "member", "expires_at": soon})),
        ),
        row("DELETE", "/api/v1/teams/{team}/tokens/{token_id}", TEAM_ADMIN, None),
        row("GET", "/api/v1/teams/{team}/ci-trusts", TEAM_READ, None),
        row(
            "POST",
            "/api/v1/teams/{team}/ci-trusts",
            TEAM_ADMIN,
            Some(
                json!({"name": "release", "issuer": CI_ISSUER, "conditions": {"repository": "acme/train"}, "role": "member"}),
            ),
        ),
        row("GET", "/api/v1/teams/{team}/ci-trusts/{trust}", TEAM_READ, None),
        row("DELETE", "/api/v1/teams/{team}/ci-trusts/{trust}", TEAM_ADMIN, None),
        row("GET", "/api/v1/teams/{team}/webhooks", TEAM_READ, None),
        row(
            "POST",
            "/api/v1/teams/{team}/webhooks",
            TEAM_ADMIN,
            Some(json!({"url": "https://hooks.example.com/fairway", "events": ["job.failed"]})),
        ),
        row("DELETE", "/api/v1/teams/{team}/webhooks/{webhook}", TEAM_ADMIN, None),
        row("GET", "/api/v1/teams/{team}/webhooks/{webhook}/deliveries", TEAM_READ, None),
        row("GET", "/api/v1/teams/{team}/job-templates", TEAM_READ, None),
        row("GET", "/api/v1/teams/{team}/job-templates/{template}", TEAM_READ, None),
        row("PUT", "/api/v1/teams/{team}/job-templates/{template}", TEAM_MEMBER, Some(job_spec())),
        // The first allowed caller deletes it; the next finds it gone.
        Row {
            allowed_problem: Some((404, "not_found")),
            ..row("DELETE", "/api/v1/teams/{team}/job-templates/{template}", TEAM_MEMBER, None)
        },
        row(
            "POST",
            "/api/v1/teams/{team}/job-templates/{template}/jobs",
            TEAM_MEMBER,
            Some(json!({"name": "override"})),
        ),
        row("GET", "/api/v1/teams/{team}/quotas", TEAM_READ, None),
        row("GET", "/api/v1/teams/{team}/quotas/{gpu_class}", TEAM_READ, None),
        row("PUT", "/api/v1/teams/{team}/quotas/{gpu_class}", TEAM_ADMIN, Some(json!({"reserved": 2, "burst": 1}))),
        row("DELETE", "/api/v1/teams/{team}/quotas/{gpu_class}", TEAM_ADMIN, None),
        row("GET", "/api/v1/teams/{team}/budgets", TEAM_READ, None),
        row(
            "PUT",
            "/api/v1/teams/{team}/budgets/{period}",
            TEAM_ADMIN,
            Some(json!({"unit": "money", "amount": 5, "enforcement": "soft"})),
        ),
        row("DELETE", "/api/v1/teams/{team}/budgets/{period}", TEAM_ADMIN, None),
        row("GET", "/api/v1/teams/{team}/audit-log", TEAM_ADMIN, None),
        row("POST", "/api/v1/teams/{team}/jobs", TEAM_MEMBER, Some(job_spec())),
        row("GET", "/api/v1/teams/{team}/jobs", TEAM_READ, None),
        row("POST", "/api/v1/teams/{team}/jobs:batch", TEAM_MEMBER, Some(json!({"jobs": [job_spec(), job_spec()]}))),
        row("POST", "/api/v1/teams/{team}/jobs:dry-run", TEAM_MEMBER, Some(job_spec())),
        row("GET", "/api/v1/teams/{team}/queue", TEAM_READ, None),
        row("POST", "/api/v1/teams/{team}/arrays", TEAM_MEMBER, Some(json!({"count": 2, "task": job_spec()}))),
        row("GET", "/api/v1/teams/{team}/arrays", TEAM_READ, None),
        row("GET", "/api/v1/teams/{team}/arrays/{array}", TEAM_READ, None),
        row("GET", "/api/v1/teams/{team}/arrays/{array}/tasks", TEAM_READ, None),
        // Its tasks are pending: the first allowed cancel cancels them, the next finds none left.
        row("POST", "/api/v1/teams/{team}/arrays/{array}/cancel", TEAM_MEMBER, None),
        // The first allowed caller creates it; the next finds the name taken.
        Row {
            allowed_problem: Some((409, "service_exists")),
            ..row("POST", "/api/v1/teams/{team}/services", TEAM_MEMBER, Some(service_spec("web")))
        },
        row("GET", "/api/v1/teams/{team}/services", TEAM_READ, None),
        row("GET", "/api/v1/teams/{team}/services/{service}", TEAM_READ, None),
        row(
            "PATCH",
            "/api/v1/teams/{team}/services/{service}",
            TEAM_MEMBER,
            Some(json!({"image": "registry.example/serve:2"})),
        ),
        // The first allowed caller deletes it; the next finds it gone.
        Row {
            allowed_problem: Some((404, "not_found")),
            ..row("DELETE", "/api/v1/teams/{team}/services/{service}", TEAM_MEMBER, None)
        },
        row("GET", "/api/v1/jobs/{job}", TEAM_READ, None),
        // The job is pending: the first allowed cancel cancels it, the next finds it cancelled.
        row("POST", "/api/v1/jobs/{job}/cancel", TEAM_MEMBER, None),
        row("POST", "/api/v1/jobs/{job}/rerun", TEAM_MEMBER, None),
        row("GET", "/api/v1/jobs/{job}/events", TEAM_READ, None),
        row("GET", "/api/v1/jobs/{job}/events:stream", TEAM_READ, None),
        row("GET", "/api/v1/jobs/{job}/logs", TEAM_READ, None),
        row("GET", "/api/v1/jobs/{job}/utilisation", TEAM_READ, None),
        row("GET", "/api/v1/teams/{team}/events:stream", TEAM_READ, None),
        // Nothing runs in the harness, so an allowed caller learns that the job is not running.
        Row {
            allowed_problem: Some((409, "job_not_running")),
            ..row("POST", "/api/v1/jobs/{job}/checkpoint", TEAM_MEMBER, Some(json!({"step": 100})))
        },
        row("GET", "/api/v1/teams/{team}/usage", TEAM_READ, None),
        row("GET", "/api/v1/teams/{team}/statements/{period}", TEAM_READ, None),
        row("GET", "/api/v1/teams/{team}/budget-status", TEAM_READ, None),
        // Without `?period=` an allowed caller is told which parameter is missing.
        Row {
            allowed_problem: Some((422, "validation_failed")),
            ..row("GET", "/api/v1/billing/exports", FINANCE, None)
        },
        Row {
            allowed_problem: Some((422, "validation_failed")),
            ..row("GET", "/api/v1/billing/exports/control", FINANCE, None)
        },
        row("GET", "/api/v1/billing/periods", FINANCE, None),
        // Without `?period=` an allowed caller is told which parameter is missing.
        Row {
            allowed_problem: Some((422, "validation_failed")),
            ..row("GET", "/api/v1/billing/utilisation", FINANCE, None)
        },
        // Next month is not over yet: an allowed caller learns that it cannot be closed.
        Row {
            allowed_problem: Some((422, "validation_failed")),
            ..row("POST", "/api/v1/billing/periods/{period}/close", FINANCE, None)
        },
        row("GET", "/api/v1/gpu-classes", SIGNED_IN, None),
        row(
            "POST",
            "/api/v1/gpu-classes",
            PLATFORM,
            Some(json!({"name": "t4", "kind": "whole", "memory_mib": 16384, "rate_micros_per_gpu_hour": 350000})),
        ),
        row("GET", "/api/v1/gpu-classes/{gpu_class}", SIGNED_IN, None),
        row("PATCH", "/api/v1/gpu-classes/{gpu_class}", PLATFORM, Some(json!({"description": "Hopper"}))),
        row("GET", "/api/v1/gpu-classes/{gpu_class}/rates", SIGNED_IN, None),
        row(
            "POST",
            "/api/v1/gpu-classes/{gpu_class}/rates",
            PLATFORM,
            Some(json!({"effective_from": later, "rate_micros_per_gpu_hour": 2_000_000})),
        ),
        row("GET", "/api/v1/idle-policies", PLATFORM, None),
        row("GET", "/api/v1/teams/{team}/idle-policies", TEAM_READ, None),
        row(
            "PUT",
            "/api/v1/idle-policies",
            PLATFORM,
            Some(json!({"below_sm_active_percent": 5, "idle_seconds": 600, "action": "notify"})),
        ),
        // No policy has that id: an allowed caller learns just that.
        Row {
            allowed_problem: Some((404, "not_found")),
            ..row("DELETE", "/api/v1/idle-policies/{policy}", PLATFORM, None)
        },
        row("GET", "/api/v1/priority-classes", SIGNED_IN, None),
        row(
            "POST",
            "/api/v1/priority-classes",
            PLATFORM,
            Some(
                json!({"name": "batch", "priority": 50, "preemptible": true, "usage_factor_milli": 500, "price_multiplier_milli": 600}),
            ),
        ),
        row("GET", "/api/v1/priority-classes/{priority_class}", SIGNED_IN, None),
        row(
            "PUT",
            "/api/v1/priority-classes/{priority_class}",
            PLATFORM,
            Some(
                json!({"priority": 90, "preemptible": true, "usage_factor_milli": 700, "price_multiplier_milli": 800}),
            ),
        ),
        row("GET", "/api/v1/clusters", SIGNED_IN, None),
        row("PUT", "/api/v1/clusters/{cluster}", PLATFORM, Some(json!({"backend": "sim", "capacity": {"h100": 8}}))),
        Row {
            allowed_problem: Some((404, "not_found")),
            ..row("DELETE", "/api/v1/clusters/{cluster}/nodes/{node}/faults", PLATFORM, None)
        },
        row("GET", "/api/v1/audit-log", PLATFORM, None),
    ]
}

/// The service with its callers and the ids of the objects the routes' paths name.
struct Fixture {
    app: TestApp,
    /// A token per caller, in the order of [`CALLERS`].
    callers: Vec<Option<String>>,
    /// The id of team A's token.
    token_id: String,
    /// The id of a pending job of team A.
    job_id: String,
    /// The id of team A's webhook.
    webhook_id: String,
    /// The id of an array of team A.
    array_id: String,
}

/// Team A with a viewer, a member, a quota, a budget, a token, a webhook, a job template, a CI
/// trust policy and a pending job; team B with its own admin and a CI token; a finance user.
async fn fixture() -> Fixture {
    let app = TestApp::spawn_with(|c| {
        c.ci_issuers = vec![CiIssuer { issuer: CI_ISSUER.into(), algorithms: vec!["RS256".into()] }];
    })
    .await;
    let admin = app.admin().await;
    app.gpu_class(&admin, "h100").await;
    app.team(&admin, "team-a", None).await;
    app.team(&admin, "team-b", None).await;
    let viewer = app.user(&admin, "viewer", None).await;
    app.member(&admin, "team-a", "viewer", "viewer").await;
    let member = app.user(&admin, "member", None).await;
    app.member(&admin, "team-a", "member", "member").await;
    let admin_b = app.user(&admin, "admin-b", None).await;
    app.member(&admin, "team-b", "admin-b", "admin").await;
    let (_, token_b) = app.api_token(&admin, "team-b", "member").await;
    let finance = app.user(&admin, "finance", Some("finance")).await;
    app.send(call("PUT", "/api/v1/teams/team-a/quotas/h100").token(&admin).json(&json!({"reserved": 4, "burst": 2})))
        .await
        .assert_status(200);
    app.send(
        call("PUT", &format!("/api/v1/teams/team-a/budgets/{}", next_month()))
            .token(&admin)
            .json(&json!({"unit": "gpu-hours", "amount": 100, "enforcement": "hard"})),
    )
    .await
    .assert_status(200);
    let (token_a_id, _) = app.api_token(&admin, "team-a", "viewer").await;
    // A platform admin with the same password as the others, so one body fits every caller.
    let platform = app.user(&admin, "platform", Some("platform-admin")).await;
    // No cluster reports inventory, so the job is accepted without a capacity check.
    let job = app.send(call("POST", "/api/v1/teams/team-a/jobs").token(&admin).json(&job_spec())).await;
    job.assert_status(201);
    let job_id = job.json()["id"].as_str().expect("job id").to_owned();
    let webhook = app
        .send(
            call("POST", "/api/v1/teams/team-a/webhooks")
                .token(&admin)
                .json(&json!({"url": "https://hooks.example.com/a", "events": ["job.succeeded"]})),
        )
        .await;
    webhook.assert_status(201);
    let webhook_id = webhook.json()["id"].as_str().expect("webhook id").to_owned();
    app.send(call("PUT", "/api/v1/teams/team-a/job-templates/nightly").token(&admin).json(&job_spec()))
        .await
        .assert_status(201);
    app.send(call("POST", "/api/v1/teams/team-a/ci-trusts").token(&admin).json(&json!({
        "name": "deploy", "issuer": CI_ISSUER, "conditions": {"repository": "acme/train"}, "role": "member"
    })))
    .await
    .assert_status(201);
    let array = app
        .send(call("POST", "/api/v1/teams/team-a/arrays").token(&admin).json(&json!({"count": 3, "task": job_spec()})))
        .await;
    array.assert_status(201);
    let array_id = array.json()["id"].as_str().expect("array id").to_owned();
    app.send(call("POST", "/api/v1/teams/team-a/services").token(&admin).json(&service_spec("chat")))
        .await
        .assert_status(201);
    let callers = vec![None, Some(viewer), Some(member), Some(admin_b), Some(token_b), Some(finance), Some(platform)];
    Fixture { app, callers, token_id: token_a_id, job_id, webhook_id, array_id }
}

/// Next month, `YYYY-MM`: a budget period that exists for every caller, and a billing
/// period that is never over yet, whenever the test runs.
fn next_month() -> String {
    let soon = chrono::Utc::now() + chrono::Duration::days(32);
    soon.format("%Y-%m").to_string()
}

fn concrete(path: &str, fixture: &Fixture) -> String {
    path.replace("{team}", "team-a")
        .replace("{job}", &fixture.job_id)
        .replace("{username}", "member")
        .replace("{token_id}", &fixture.token_id)
        .replace("{webhook}", &fixture.webhook_id)
        .replace("{array}", &fixture.array_id)
        .replace("{template}", "nightly")
        .replace("{service}", "chat")
        .replace("{trust}", "deploy")
        .replace("{gpu_class}", "h100")
        .replace("{period}", &next_month())
        .replace("{priority_class}", "experiment")
        .replace("{cluster}", "sim-1")
        .replace("{node}", "rack1-node1")
        .replace("{policy}", "00000000-0000-0000-0000-000000000000")
}

#[tokio::test]
async fn every_route_answers_every_kind_of_caller_as_specified() {
    let rows = matrix();

    // The matrix covers exactly the routes the service documents.
    let documented: Vec<String> =
        fairway::api::documented_operations().into_iter().map(|(method, path)| format!("{method} {path}")).collect();
    for route in &documented {
        assert!(rows.iter().any(|r| format!("{} {}", r.method, r.path) == *route), "no matrix row for {route}");
    }
    assert_eq!(rows.len(), documented.len(), "the matrix lists routes the service does not have");

    // Reads share one fixture; each write gets its own, and its allowed callers go last so
    // a refused attempt never runs against state an allowed one changed.
    let shared = fixture().await;
    let mut failures = Vec::new();
    for row in &rows {
        let own = if row.method == "GET" { None } else { Some(fixture().await) };
        let fixture = own.as_ref().unwrap_or(&shared);
        let (app, callers) = (&fixture.app, &fixture.callers);
        let path = concrete(row.path, fixture);
        let mut order: Vec<usize> = (0..CALLERS.len()).collect();
        order.sort_by_key(|&i| row.cells[i] == A);
        for i in order {
            let mut c = call(row.method, &path).maybe_token(callers[i].as_deref());
            if let Some(body) = &row.body {
                c = c.json(body);
            }
            let r = app.send(c).await;
            // Only for a caller allowed in: a stranger's 404 must stay a 404.
            let allowed_problem = row.cells[i] == A
                && row
                    .allowed_problem
                    .is_some_and(|(status, code)| r.status.as_u16() == status && r.json()["code"] == code);
            let got = if r.status.is_success() || allowed_problem { A } else { E(r.status.as_u16()) };
            if got != row.cells[i] {
                failures.push(format!(
                    "{} {} as {}: expected {:?}, got {:?} {}",
                    row.method,
                    row.path,
                    CALLERS[i],
                    row.cells[i],
                    got,
                    String::from_utf8_lossy(&r.body)
                ));
            }
            if let E(status) = got {
                if status >= 400 {
                    assert_eq!(
                        r.header("content-type").as_deref(),
                        Some("application/problem+json"),
                        "{} {}",
                        row.method,
                        row.path
                    );
                }
            }
        }
        // A write's own database is done with: its connections go back to the server now,
        // not when the test ends (the app's background tasks would hold them till then), so
        // the matrix stays within the test server's connections beside the suites in parallel.
        if let Some(own) = own {
            own.app.pool.close().await;
        }
    }
    assert!(failures.is_empty(), "{} cells differ:\n{}", failures.len(), failures.join("\n"));
}
