//! Teams, quotas, GPU classes, priority classes, budgets and the audit log.

use fairway_tests::{call, TestApp};
use serde_json::json;

async fn setup() -> (TestApp, String) {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    app.gpu_class(&admin, "h100").await;
    (app, admin)
}

async fn put_quota(app: &TestApp, admin: &str, team: &str, reserved: i64, burst: i64) -> fairway_tests::TestResponse {
    app.send(
        call("PUT", &format!("/api/v1/teams/{team}/quotas/h100"))
            .token(admin)
            .json(&json!({"reserved": reserved, "burst": burst})),
    )
    .await
}

#[tokio::test]
async fn childrens_reserved_quota_never_exceeds_the_parents() {
    let (app, admin) = setup().await;
    app.team(&admin, "research", None).await;
    app.team(&admin, "vision", Some("research")).await;
    app.team(&admin, "speech", Some("research")).await;
    put_quota(&app, &admin, "research", 10, 0).await.assert_status(200);
    put_quota(&app, &admin, "vision", 6, 4).await.assert_status(200);
    let doc = put_quota(&app, &admin, "speech", 5, 0).await.assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "reserved");
    assert_eq!(doc["errors"][0]["code"], "exceeds_parent");
    put_quota(&app, &admin, "speech", 4, 0).await.assert_status(200);
    // Nor may the parent shrink below what its children reserve.
    let doc = put_quota(&app, &admin, "research", 9, 0).await.assert_problem(422, "validation_failed");
    assert_eq!(doc["errors"][0]["code"], "below_children");
    let r = app.send(call("DELETE", "/api/v1/teams/research/quotas/h100").token(&admin)).await;
    r.assert_problem(409, "children_reserve_quota");
    let q = app.send(call("GET", "/api/v1/teams/vision/quotas/h100").token(&admin)).await;
    q.assert_status(200);
    assert_eq!(q.json()["reserved"], 6);
    assert_eq!(q.json()["lendable"], 6, "lendable defaults to all of reserved");
}

#[tokio::test]
async fn reserving_more_than_the_known_capacity_is_a_warning_not_an_error() {
    let (app, admin) = setup().await;
    app.team(&admin, "ml", None).await;
    app.team(&admin, "cv", None).await;
    let cluster = json!({"backend": "sim", "capacity": {"h100": 16}});
    app.send(call("PUT", "/api/v1/clusters/sim-1").token(&admin).json(&cluster)).await.assert_status(201);
    let again = app.send(call("PUT", "/api/v1/clusters/sim-1").token(&admin).json(&cluster)).await;
    again.assert_status(200);
    assert_eq!(again.json()["capacity"]["h100"], 16);
    assert_eq!(again.json()["version"], 2);
    let r = put_quota(&app, &admin, "ml", 12, 0).await;
    r.assert_status(200);
    assert_eq!(r.json()["warnings"], json!([]));
    let r = put_quota(&app, &admin, "cv", 8, 0).await;
    r.assert_status(200);
    let warnings = r.json()["warnings"].clone();
    assert_eq!(warnings.as_array().unwrap().len(), 1, "{warnings}");
    assert!(warnings[0].as_str().unwrap().contains("20") && warnings[0].as_str().unwrap().contains("16"), "{warnings}");
}

#[tokio::test]
async fn updates_honour_if_match_and_answer_412_on_a_stale_etag() {
    let (app, admin) = setup().await;
    app.team(&admin, "ml", None).await;
    let r = app.send(call("GET", "/api/v1/teams/ml").token(&admin)).await;
    let etag = r.header("etag").unwrap();
    assert_eq!(etag, "\"1\"");
    let ok = app
        .send(
            call("PATCH", "/api/v1/teams/ml")
                .token(&admin)
                .header("if-match", &etag)
                .json(&json!({"display_name": "ML"})),
        )
        .await;
    ok.assert_status(200);
    assert_eq!(ok.header("etag").as_deref(), Some("\"2\""));
    let stale = app
        .send(
            call("PATCH", "/api/v1/teams/ml")
                .token(&admin)
                .header("if-match", &etag)
                .json(&json!({"display_name": "Nope"})),
        )
        .await;
    stale.assert_problem(412, "etag_mismatch");
    let now = app.send(call("GET", "/api/v1/teams/ml").token(&admin)).await;
    assert_eq!(now.json()["display_name"], "ML");

    let q = put_quota(&app, &admin, "ml", 2, 2).await;
    let qtag = q.header("etag").unwrap();
    let r = app
        .send(
            call("PUT", "/api/v1/teams/ml/quotas/h100")
                .token(&admin)
                .header("if-match", "\"99\"")
                .json(&json!({"reserved": 3, "burst": 0})),
        )
        .await;
    r.assert_problem(412, "etag_mismatch");
    let r = app
        .send(
            call("PUT", "/api/v1/teams/ml/quotas/h100")
                .token(&admin)
                .header("if-match", &qtag)
                .json(&json!({"reserved": 3, "burst": 0})),
        )
        .await;
    r.assert_status(200);
}

#[tokio::test]
async fn every_change_is_in_the_audit_log_with_who_and_before_and_after() {
    let (app, admin) = setup().await;
    app.team(&admin, "ml", None).await;
    put_quota(&app, &admin, "ml", 2, 1).await.assert_status(200);
    put_quota(&app, &admin, "ml", 4, 1).await.assert_status(200);
    let log = app.send(call("GET", "/api/v1/audit-log").token(&admin)).await;
    log.assert_status(200);
    let items = log.json()["items"].as_array().unwrap().clone();
    let latest = &items[0];
    assert_eq!(latest["action"], "quota.put");
    assert_eq!(latest["actor"], "user:admin");
    assert_eq!(latest["object_id"], "ml/h100");
    assert_eq!(latest["team"], "ml");
    assert_eq!(latest["before"]["reserved"], 2);
    assert_eq!(latest["after"]["reserved"], 4);
    let actions: Vec<_> = items.iter().map(|i| i["action"].as_str().unwrap().to_owned()).collect();
    // The admin's sign-in, first, is in the platform's log too.
    assert_eq!(actions, ["quota.put", "quota.put", "team.create", "gpu_class.create", "user.sign_in"]);
    // The team's own log shows only its changes.
    let team_log = app.send(call("GET", "/api/v1/teams/ml/audit-log").token(&admin)).await;
    assert_eq!(team_log.json()["items"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn a_refused_change_leaves_no_audit_record_and_no_row() {
    let (app, admin) = setup().await;
    app.team(&admin, "ml", None).await;
    app.send(call("POST", "/api/v1/teams").token(&admin).json(&json!({"name": "ml"})))
        .await
        .assert_problem(409, "team_exists");
    let entries: i64 = sqlx::query_scalar("select count(*) from audit_log where action = 'team.create'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(entries, 1);
}

#[tokio::test]
async fn lists_page_with_cursors_through_every_item_once() {
    let (app, admin) = setup().await;
    for i in 0..7 {
        app.team(&admin, &format!("team-{i}"), None).await;
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v1/teams?limit=3&cursor={c}"),
            None => "/api/v1/teams?limit=3".to_owned(),
        };
        let page = app.send(call("GET", &path).token(&admin)).await.json();
        pages += 1;
        seen.extend(page["items"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap().to_owned()));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(seen, (0..7).map(|i| format!("team-{i}")).collect::<Vec<_>>());
}

#[tokio::test]
async fn the_four_priority_classes_are_seeded() {
    let (app, admin) = setup().await;
    let r = app.send(call("GET", "/api/v1/priority-classes").token(&admin)).await;
    let names: Vec<_> = r.json().as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap().to_owned()).collect();
    assert_eq!(names, ["serving", "production", "experiment", "scavenger"]);
    let scavenger = &r.json()[3];
    assert_eq!(scavenger["preemptible"], true);
    assert!(scavenger["usage_factor_milli"].as_i64().unwrap() < 1000);
}

#[tokio::test]
async fn rates_are_effective_dated_and_cannot_change_the_past() {
    let (app, admin) = setup().await;
    let future = (chrono::Utc::now() + chrono::Duration::days(10)).to_rfc3339();
    let past = (chrono::Utc::now() - chrono::Duration::days(10)).to_rfc3339();
    app.send(
        call("POST", "/api/v1/gpu-classes/h100/rates")
            .token(&admin)
            .json(&json!({"effective_from": future, "rate_micros_per_gpu_hour": 2_000_000})),
    )
    .await
    .assert_status(201);
    let doc = app
        .send(
            call("POST", "/api/v1/gpu-classes/h100/rates")
                .token(&admin)
                .json(&json!({"effective_from": past, "rate_micros_per_gpu_hour": 1})),
        )
        .await
        .assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "effective_from");
    let class = app.send(call("GET", "/api/v1/gpu-classes/h100").token(&admin)).await.json();
    assert_eq!(class["rate_micros_per_gpu_hour"], 2_500_000, "the current rate holds until the new one starts");
    let rates = app.send(call("GET", "/api/v1/gpu-classes/h100/rates").token(&admin)).await.json();
    assert_eq!(rates.as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn gpu_classes_describe_whole_gpus_and_mig_slices_consistently() {
    let (app, admin) = setup().await;
    let mig = json!({"name": "a100-80gb.mig-3g.40gb", "kind": "mig", "memory_mib": 40960, "fraction_milli": 428, "rate_micros_per_gpu_hour": 900000});
    let r = app.send(call("POST", "/api/v1/gpu-classes").token(&admin).json(&mig)).await;
    r.assert_status(201);
    assert_eq!(r.json()["fraction_milli"], 428);
    assert_eq!(r.json()["rate_micros_per_gpu_hour"], 900000, "the first rate is in effect at once");
    assert_eq!(r.json()["currency"], "USD");
    let bad = json!({"name": "a100", "kind": "whole", "memory_mib": 81920, "fraction_milli": 500, "rate_micros_per_gpu_hour": 1});
    let doc = app
        .send(call("POST", "/api/v1/gpu-classes").token(&admin).json(&bad))
        .await
        .assert_problem(422, "validation_failed");
    assert_eq!(doc["field"], "fraction_milli");
    let dup = json!({"name": "h100", "kind": "whole", "memory_mib": 81920, "rate_micros_per_gpu_hour": 1});
    app.send(call("POST", "/api/v1/gpu-classes").token(&admin).json(&dup))
        .await
        .assert_problem(409, "gpu_class_exists");
}

#[tokio::test]
async fn budgets_are_set_per_month_and_listed_newest_first() {
    let (app, admin) = setup().await;
    app.team(&admin, "ml", None).await;
    for (period, amount) in [("2026-11", 100), ("2026-12", 200)] {
        app.send(
            call("PUT", &format!("/api/v1/teams/ml/budgets/{period}"))
                .token(&admin)
                .json(&json!({"unit": "money", "amount": amount, "enforcement": "hard"})),
        )
        .await
        .assert_status(200);
    }
    let list = app.send(call("GET", "/api/v1/teams/ml/budgets").token(&admin)).await.json();
    assert_eq!(list[0]["period"], "2026-12");
    assert_eq!(list[0]["currency"], "USD");
    assert_eq!(list[1]["amount"], 100);
    app.send(call("DELETE", "/api/v1/teams/ml/budgets/2026-11").token(&admin)).await.assert_status(204);
    let list = app.send(call("GET", "/api/v1/teams/ml/budgets").token(&admin)).await.json();
    assert_eq!(list.as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn a_team_with_child_teams_cannot_be_deleted() {
    let (app, admin) = setup().await;
    app.team(&admin, "research", None).await;
    app.team(&admin, "vision", Some("research")).await;
    app.send(call("DELETE", "/api/v1/teams/research").token(&admin)).await.assert_problem(409, "team_has_children");
    app.send(call("DELETE", "/api/v1/teams/vision").token(&admin)).await.assert_status(204);
    app.send(call("DELETE", "/api/v1/teams/research").token(&admin)).await.assert_status(204);
    app.send(call("GET", "/api/v1/teams/research").token(&admin)).await.assert_problem(404, "not_found");
}

#[tokio::test]
async fn readiness_and_metrics_report_real_state() {
    let (app, admin) = setup().await;
    app.send(call("GET", "/readyz")).await.assert_status(200);
    app.send(call("GET", "/api/v1/teams").token(&admin)).await.assert_status(200);
    let metrics = app.send(call("GET", "/metrics")).await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.contains("fairway_http_requests_total{method=\"GET\",route=\"/api/v1/teams\",status=\"200\"} 1"),
        "{text}"
    );
    app.pool.close().await;
    app.send(call("GET", "/readyz")).await.assert_status(503);
}

#[tokio::test]
async fn metrics_name_teams_only_to_a_scraper_with_the_metrics_token() {
    let app = TestApp::spawn_with(|c| c.metrics_token = Some(fairway::config::Secret::new("scrape-me-please"))).await;
    app.state.metrics.budget_alert("stealth-team", 50);
    let anonymous = app.send(call("GET", "/metrics")).await;
    anonymous.assert_status(200);
    let text = String::from_utf8_lossy(&anonymous.body).into_owned();
    assert!(!text.contains("stealth-team"), "{text}");
    assert!(text.contains("fairway_scheduler_leader"), "{text}");
    let wrong = app.send(call("GET", "/metrics").token("scrape-me-not")).await;
    assert!(!String::from_utf8_lossy(&wrong.body).contains("stealth-team"));
    let scraper = app.send(call("GET", "/metrics").token("scrape-me-please")).await;
    let text = String::from_utf8_lossy(&scraper.body).into_owned();
    assert!(text.contains("fairway_budget_alerts_total{team=\"stealth-team\",threshold=\"50\"} 1"), "{text}");
}
