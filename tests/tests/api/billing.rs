//! Metering and billing against a real PostgreSQL: the ledger matches ground truth to the
//! unit, is append-only, prices by the rate in force, and exports reconcile and repeat.
//!
//! Usage intervals are written here the way the reconciler writes them (open at the real
//! start, close at the real stop, book in the closing transaction), with start and end times
//! chosen by the test, so the truth is known exactly.

use chrono::{DateTime, Duration, TimeZone, Utc};
use fairway::domain::{GpuClassId, JobId, TeamId};
use fairway::{db, metering, rng::SplitMix64};
use fairway_tests::{call, csv_fields, TestApp};
use serde_json::{json, Value};
use sha2::Digest as _;

const H100_RATE: i64 = 2_500_000;
const MIG_RATE: i64 = 900_000;
const MIG_CLASSES: [(&str, i64); 3] = [("a100.mig-1g.10gb", 142), ("a100.mig-3g.40gb", 428), ("a100.mig-4g.40gb", 571)];

fn t(s: &str) -> DateTime<Utc> {
    s.parse().expect("a valid instant")
}

struct Setup {
    app: TestApp,
    admin: String,
    finance: String,
    teams: Vec<(String, TeamId)>,
    /// (name, id, fraction_milli)
    classes: Vec<(String, GpuClassId, i32)>,
}

/// Teams `ml` and `vision`, a finance user, an H100 class at $2.50 and three MIG classes
/// at $0.90 per slice-hour, with rates in force since 2026-01-01.
async fn setup() -> Setup {
    let app = TestApp::spawn().await;
    let admin = app.admin().await;
    let finance = app.user(&admin, "finn", Some("finance")).await;
    let mut teams = Vec::new();
    for name in ["ml", "vision"] {
        let team = app.team(&admin, name, None).await;
        teams.push((name.to_owned(), team["id"].as_str().expect("id").parse().expect("uuid")));
    }
    let since = "2026-01-01T00:00:00Z";
    let mut classes = Vec::new();
    for (name, kind, fraction, rate) in std::iter::once(("h100", "whole", 1000, H100_RATE))
        .chain(MIG_CLASSES.iter().map(|(n, f)| (*n, "mig", *f, MIG_RATE)))
    {
        let r = app
            .send(call("POST", "/api/v1/gpu-classes").token(&admin).json(&json!({
                "name": name, "kind": kind, "memory_mib": 10240, "fraction_milli": fraction,
                "rate_micros_per_gpu_hour": rate, "rate_effective_from": since,
            })))
            .await;
        r.assert_status(201);
        classes.push((name.to_owned(), r.json()["id"].as_str().expect("id").parse().expect("uuid"), fraction as i32));
    }
    Setup { app, admin, finance, teams, classes }
}

/// A job of `gpus` units of `class` in `team`, whose first attempt is admitted (as a cycle
/// would leave it), ready for its usage interval.
async fn admitted_job(s: &Setup, team: TeamId, class: GpuClassId, gpus: i32, name: &str) -> JobId {
    let job = db::jobs::NewJob {
        id: JobId::new(),
        name: name.into(),
        gpu_class_id: class,
        priority_class: "production".into(),
        replicas: 1,
        gpus_per_replica: gpus,
        max_runtime_seconds: 2_592_000,
        expected_runtime_seconds: None,
        image: "registry.example/train:1".into(),
        command: json!([]),
        env: json!({}),
        labels: json!({"project": "truth"}),
        topology_mode: "any".into(),
        topology_level: None,
        preemption_grace_seconds: None,
        max_retries: 0,
        allow_spot: false,
        cpu_millis: None,
        memory_mib: None,
        workload: Default::default(),
        depends_on: Vec::new(),
        if_dependency_fails: Default::default(),
        accepted_despite: Vec::new(),
        array: None,
        service: None,
        min_driver_version: None,
        min_cuda_version: None,
        preemption_delay_seconds: None,
        max_replicas: None,
    };
    let id = job.id;
    db::jobs::insert_many(&s.app.pool, team, "test", &[job]).await.expect("insert job");
    sqlx::query("update jobs set attempt = 1, state = 'running' where id = $1")
        .bind(id)
        .execute(&s.app.pool)
        .await
        .expect("admit");
    id
}

/// Opens and closes the attempt's interval and books it, in one transaction, as the
/// reconciler's `end_attempts` does.
async fn run_and_close(pool: &sqlx::PgPool, job: JobId, start: DateTime<Utc>, end: DateTime<Utc>) {
    let mut tx = pool.begin().await.expect("begin");
    db::attempts::open_intervals(&mut tx, &[(job, 1, start)]).await.expect("open");
    db::attempts::close_intervals(&mut tx, &[(job, 1, end)]).await.expect("close");
    metering::ledger::book(&mut tx, job, 1, None, &metering::Pricing::default()).await.expect("book");
    tx.commit().await.expect("commit");
}

async fn open(pool: &sqlx::PgPool, job: JobId, start: DateTime<Utc>) {
    let mut tx = pool.begin().await.expect("begin");
    db::attempts::open_intervals(&mut tx, &[(job, 1, start)]).await.expect("open");
    tx.commit().await.expect("commit");
}

/// Books a running attempt up to `until`, as the metering pass does each hour.
async fn book_until(pool: &sqlx::PgPool, job: JobId, until: DateTime<Utc>) -> u64 {
    let mut tx = pool.begin().await.expect("begin");
    let n = metering::ledger::book(&mut tx, job, 1, Some(until), &metering::Pricing::default()).await.expect("book");
    tx.commit().await.expect("commit");
    n
}

async fn scalar(pool: &sqlx::PgPool, sql: &str) -> i64 {
    sqlx::query_scalar::<_, Option<i64>>(sql)
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .unwrap_or(0)
}

/// Milliseconds of `[start, end)` that fall in October 2026.
fn in_october(start: DateTime<Utc>, end: DateTime<Utc>) -> i64 {
    let (from, to) = (t("2026-10-01T00:00:00Z"), t("2026-11-01T00:00:00Z"));
    (end.min(to) - start.max(from)).num_milliseconds().max(0)
}

async fn export(s: &Setup, period: &str, format: &str) -> String {
    let r = s
        .app
        .send(call("GET", &format!("/api/v1/billing/exports?period={period}&format={format}")).token(&s.finance))
        .await;
    r.assert_status(200);
    String::from_utf8(r.body.clone()).expect("UTF-8")
}

/// The control record served beside the export of `period` in `format`, checked against the
/// export's own bytes (`export`) first: its SHA-256 is that of the file.
async fn control(s: &Setup, period: &str, format: &str, export: &str) -> Value {
    let r = s
        .app
        .send(
            call("GET", &format!("/api/v1/billing/exports/control?period={period}&format={format}")).token(&s.finance),
        )
        .await;
    r.assert_status(200);
    let control = r.json();
    let digest = sha2::Sha256::digest(export.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(control["sha256"], hex.as_str(), "{control}");
    assert_eq!(control["period"], period);
    assert_eq!(control["format"], format);
    control
}

#[tokio::test]
async fn two_thousand_jobs_book_exactly_their_gpu_time_and_ledger_rollups_and_export_agree_to_the_unit() {
    let s = setup().await;
    let mut rng = SplitMix64(0x0b11_1e55);
    let mut truth_by_job: Vec<(JobId, i64)> = Vec::new();
    let mut truth_by_team = std::collections::HashMap::<TeamId, i64>::new();
    let mut october_truth = 0i64;
    let base = t("2026-10-01T00:00:00Z");
    for i in 0..2000 {
        let (_, team) = s.teams[i % s.teams.len()];
        let (_, class, fraction) = s.classes[(rng.next_u64() % s.classes.len() as u64) as usize].clone();
        let gpus = 1 + (rng.next_u64() % 8) as i32;
        // Starts anywhere in October (to the millisecond), runs up to 30 hours: across hours,
        // days, and for some across the month's end.
        let start = base + Duration::milliseconds((rng.next_u64() % (31 * 24 * 3_600_000)) as i64);
        let end = start + Duration::milliseconds(1 + (rng.next_u64() % (30 * 3_600_000)) as i64);
        let job = admitted_job(&s, team, class, gpus, &format!("job-{i}")).await;
        let gpu_time = i64::from(gpus) * i64::from(fraction) * (end - start).num_milliseconds();
        if i % 5 == 0 {
            // A long runner: booked hour by hour while it runs, then closed.
            open(&s.app.pool, job, start).await;
            let mut hour = t("2026-10-01T00:00:00Z") + Duration::hours(((start - base).num_hours()) + 1);
            while hour <= end {
                book_until(&s.app.pool, job, hour).await;
                hour += Duration::hours(7);
            }
            let mut tx = s.app.pool.begin().await.expect("begin");
            db::attempts::close_intervals(&mut tx, &[(job, 1, end)]).await.expect("close");
            metering::ledger::book(&mut tx, job, 1, None, &metering::Pricing::default()).await.expect("book");
            tx.commit().await.expect("commit");
        } else {
            run_and_close(&s.app.pool, job, start, end).await;
        }
        truth_by_job.push((job, gpu_time));
        *truth_by_team.entry(team).or_default() += gpu_time;
        october_truth += i64::from(gpus) * i64::from(fraction) * in_october(start, end);
    }
    let pool = &s.app.pool;
    let booked: std::collections::HashMap<JobId, i64> =
        sqlx::query_as("select job_id, sum(gpu_milli_ms)::int8 from usage_ledger group by job_id")
            .fetch_all(pool)
            .await
            .expect("booked per job")
            .into_iter()
            .collect();
    for (job, truth) in &truth_by_job {
        assert_eq!(booked.get(job), Some(truth), "job {job}");
    }
    for (team, truth) in &truth_by_team {
        let booked =
            scalar(pool, &format!("select sum(gpu_milli_ms)::int8 from usage_ledger where team_id = '{team}'")).await;
        assert_eq!(booked, *truth, "team {team}");
    }
    let ledger_total = scalar(pool, "select sum(gpu_milli_ms)::int8 from usage_ledger").await;
    assert_eq!(ledger_total, truth_by_team.values().sum::<i64>());
    assert_eq!(
        scalar(pool, "select count(*) from usage_ledger where charge_end - charge_start > interval '1 hour'").await,
        0
    );

    // Booking every attempt again writes nothing.
    for (job, _) in &truth_by_job {
        let mut tx = pool.begin().await.expect("begin");
        assert_eq!(
            metering::ledger::book(&mut tx, *job, 1, None, &metering::Pricing::default()).await.expect("book"),
            0
        );
        tx.commit().await.expect("commit");
    }
    assert_eq!(scalar(pool, "select sum(gpu_milli_ms)::int8 from usage_ledger").await, ledger_total);

    // Rollups, twice (the second must change nothing), equal the ledger; allocated + idle
    // is capacity for every class-hour.
    db::metering::roll_up(pool, t("2026-11-03T00:00:00Z")).await.expect("roll up");
    let rolled = scalar(pool, "select sum(gpu_milli_ms)::int8 from usage_rollups").await;
    let rollup_rows = scalar(pool, "select count(*) from usage_rollups").await;
    sqlx::query("insert into rollup_dirty_hours select distinct hour from usage_rollups").execute(pool).await.unwrap();
    db::metering::roll_up(pool, t("2026-11-03T00:00:00Z")).await.expect("roll up again");
    assert_eq!(scalar(pool, "select sum(gpu_milli_ms)::int8 from usage_rollups").await, rolled);
    assert_eq!(scalar(pool, "select count(*) from usage_rollups").await, rollup_rows);
    assert_eq!(rolled, ledger_total);
    let class_hours_allocated = scalar(pool, "select sum(allocated_milli_ms)::int8 from class_hours").await;
    assert_eq!(class_hours_allocated, ledger_total, "every booked millisecond is in a completed hour");
    assert_eq!(
        scalar(pool, "select count(*) from class_hours where allocated_milli_ms + idle_milli_ms <> capacity_milli_ms")
            .await,
        0
    );

    // The October export holds exactly October's GPU time, and its control record says so.
    let csv = export(&s, "2026-10", "csv").await;
    let lines: Vec<&str> = csv.lines().collect();
    let header: Vec<&str> = lines[0].split(',').collect();
    let column = header.iter().position(|c| *c == "gpu_milli_ms").expect("gpu_milli_ms column");
    let exported: i64 =
        lines[1..].iter().map(|l| l.split(',').nth(column).expect("field").parse::<i64>().expect("an integer")).sum();
    assert_eq!(exported, october_truth);
    let c = control(&s, "2026-10", "csv", &csv).await;
    assert_eq!(c["rows"].as_u64(), Some((lines.len() - 1) as u64));
    assert_eq!(c["gpu_milli_ms"], october_truth.to_string());
    let billed =
        scalar(pool, "select sum(billed_cost_micros)::int8 from usage_ledger where billing_period = '2026-10-01'")
            .await;
    assert_eq!(c["billed_cost"], metering::micros_decimal(billed));
    let rolled_october = scalar(
        pool,
        "select sum(gpu_milli_ms)::int8 from usage_rollups where hour >= '2026-10-01' and hour < '2026-11-01'",
    )
    .await;
    assert_eq!(rolled_october, october_truth);
}

#[tokio::test]
async fn a_rate_change_mid_month_bills_each_side_of_it_at_its_own_price() {
    let s = setup().await;
    let (_, h100, _) = s.classes[0].clone();
    // $4.00 from 2026-10-15 12:00: written directly, as the API refuses retroactive rates.
    sqlx::query(
        "insert into gpu_class_rates (gpu_class_id, effective_from, rate_micros_per_gpu_hour) values ($1, $2, 4000000)",
    )
    .bind(h100)
    .bind(t("2026-10-15T12:00:00Z"))
    .execute(&s.app.pool)
    .await
    .expect("rate");
    let job = admitted_job(&s, s.teams[0].1, h100, 2, "across-the-change").await;
    run_and_close(&s.app.pool, job, t("2026-10-15T10:30:00Z"), t("2026-10-15T14:00:00Z")).await;
    let before = scalar(
        &s.app.pool,
        &format!("select sum(billed_cost_micros)::int8 from usage_ledger where job_id = '{job}' and charge_start < '2026-10-15T12:00:00Z'"),
    )
    .await;
    let after = scalar(
        &s.app.pool,
        &format!("select sum(billed_cost_micros)::int8 from usage_ledger where job_id = '{job}' and charge_start >= '2026-10-15T12:00:00Z'"),
    )
    .await;
    // 2 GPUs × 1.5 h × $2.50 and 2 GPUs × 2 h × $4.00.
    assert_eq!((before, after), (7_500_000, 16_000_000));
    let statement = s.app.send(call("GET", "/api/v1/teams/ml/statements/2026-10").token(&s.admin)).await;
    statement.assert_status(200);
    assert_eq!(statement.json()["billed_cost"], "23.500000");
    assert_eq!(statement.json()["gpu_hours"], "7.000000000");
}

#[tokio::test]
async fn the_ledger_refuses_updates_deletes_and_truncation_even_from_its_owner() {
    let s = setup().await;
    let job = admitted_job(&s, s.teams[0].1, s.classes[0].1, 1, "kept").await;
    run_and_close(&s.app.pool, job, t("2026-10-02T00:00:00Z"), t("2026-10-02T00:30:00Z")).await;
    for sql in ["update usage_ledger set billed_cost_micros = 0", "delete from usage_ledger", "truncate usage_ledger"] {
        let e = sqlx::query(sql).execute(&s.app.pool).await.expect_err(sql);
        let code = e.as_database_error().and_then(sqlx::error::DatabaseError::code).map(std::borrow::Cow::into_owned);
        assert_eq!(code.as_deref(), Some("42501"), "{sql}: {e}");
    }
    assert_eq!(scalar(&s.app.pool, "select sum(duration_ms)::int8 from usage_ledger").await, 1_800_000);
}

#[tokio::test]
async fn an_end_reported_after_its_hour_was_booked_is_taken_back_by_a_correction() {
    let s = setup().await;
    let job = admitted_job(&s, s.teams[0].1, s.classes[0].1, 4, "late-news").await;
    open(&s.app.pool, job, t("2026-10-03T09:00:00Z")).await;
    // The metering pass booked 09:00–11:00 while it seemed to run...
    assert_eq!(book_until(&s.app.pool, job, t("2026-10-03T11:00:00Z")).await, 2);
    // ...but it had stopped at 10:15.
    let mut tx = s.app.pool.begin().await.unwrap();
    db::attempts::close_intervals(&mut tx, &[(job, 1, t("2026-10-03T10:15:00Z"))]).await.unwrap();
    metering::ledger::book(&mut tx, job, 1, None, &metering::Pricing::default()).await.unwrap();
    tx.commit().await.unwrap();
    let pool = &s.app.pool;
    assert_eq!(scalar(pool, "select sum(duration_ms)::int8 from usage_ledger").await, 75 * 60_000);
    assert_eq!(
        scalar(pool, "select count(*) from usage_ledger where kind = 'correction' and corrects is not null").await,
        1
    );
    // 4 GPUs × 1.25 h × $2.50.
    assert_eq!(scalar(pool, "select sum(billed_cost_micros)::int8 from usage_ledger").await, 12_500_000);
}

#[tokio::test]
async fn a_closed_period_re_exports_byte_for_byte_and_late_usage_lands_in_the_next_as_a_correction() {
    let s = setup().await;
    let (ml, h100) = (s.teams[0].1, s.classes[0].1);
    let early = admitted_job(&s, ml, h100, 2, "=cmd|' /C calc'!A0").await;
    run_and_close(&s.app.pool, early, t("2026-10-10T08:00:00Z"), t("2026-10-10T10:00:00Z")).await;
    let r = s.app.send(call("POST", "/api/v1/billing/periods/2026-10/close").token(&s.finance)).await;
    r.assert_status(200);
    assert_eq!(r.json()["closed"], true);
    s.app
        .send(call("POST", "/api/v1/billing/periods/2026-10/close").token(&s.finance))
        .await
        .assert_problem(409, "period_closed");
    let first = export(&s, "2026-10", "focus").await;
    // Usage of October reported only now.
    let late = admitted_job(&s, ml, h100, 1, "late").await;
    run_and_close(&s.app.pool, late, t("2026-10-20T00:00:00Z"), t("2026-10-20T01:00:00Z")).await;
    let again = export(&s, "2026-10", "focus").await;
    assert_eq!(first, again, "a closed period's export never changes");
    let c = control(&s, "2026-10", "focus", &again).await;
    assert_eq!(c["rows"], 2);
    assert_eq!(c["closed"], true);

    let november = export(&s, "2026-11", "focus").await;
    let lines: Vec<&str> = november.lines().collect();
    assert_eq!(lines.len(), 2, "the header and the correction, nothing else: {november}");
    assert_eq!(control(&s, "2026-11", "focus", &november).await["closed"], false);
    let header: Vec<&str> = lines[0].split(',').collect();
    let row = csv_fields(lines[1]);
    let field = |name: &str| {
        let i = header.iter().position(|c| *c == name).unwrap_or_else(|| panic!("no column {name}"));
        row[i].clone()
    };
    assert_eq!(field("ChargeClass"), "Correction");
    assert_eq!(field("ChargePeriodStart"), "2026-10-20T00:00:00.000Z");
    assert_eq!(field("BillingPeriodStart"), "2026-11-01T00:00:00.000Z");
    assert_eq!(field("BilledCost"), "2.500000");
    assert_eq!(field("ConsumedQuantity"), "1.000000000");
    assert_eq!(field("ConsumedUnit"), "GPU-Hours");
    assert_eq!(field("SubAccountName"), "ml");
    // A job name that a spreadsheet would run as a formula is written as text.
    assert!(first.contains(",'=cmd|' /C calc'!A0,"), "{first}");
}

#[tokio::test]
async fn a_team_sees_its_usage_by_class_and_only_its_own() {
    let s = setup().await;
    let (ml, vision) = (s.teams[0].1, s.teams[1].1);
    let a = admitted_job(&s, ml, s.classes[0].1, 2, "ml-h100").await;
    run_and_close(&s.app.pool, a, t("2026-10-05T00:00:00Z"), t("2026-10-05T03:00:00Z")).await;
    let b = admitted_job(&s, ml, s.classes[2].1, 3, "ml-mig").await;
    run_and_close(&s.app.pool, b, t("2026-10-05T00:00:00Z"), t("2026-10-05T01:00:00Z")).await;
    let c = admitted_job(&s, vision, s.classes[0].1, 8, "vision").await;
    run_and_close(&s.app.pool, c, t("2026-10-05T00:00:00Z"), t("2026-10-05T10:00:00Z")).await;
    let r = s
        .app
        .send(
            call("GET", "/api/v1/teams/ml/usage?from=2026-10-01T00:00:00Z&to=2026-11-01T00:00:00Z&group_by=gpu_class")
                .token(&s.admin),
        )
        .await;
    r.assert_status(200);
    let points = r.json()["points"].as_array().cloned().unwrap_or_default();
    let got: Vec<(String, String, String)> = points
        .iter()
        .map(|p| {
            (
                p["at"].as_str().unwrap_or_default().to_owned(),
                p["group"].as_str().unwrap_or_default().to_owned(),
                p["gpu_hours"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("2026-10-05T00:00:00Z".into(), "a100.mig-3g.40gb".into(), "1.284000000".into()),
            ("2026-10-05T00:00:00Z".into(), "h100".into(), "6.000000000".into()),
        ]
    );
    let bad = s.app.send(call("GET", "/api/v1/teams/ml/usage?step=week").token(&s.admin)).await;
    assert_eq!(bad.assert_problem(422, "validation_failed")["field"], "step");
    let bad = s.app.send(call("GET", "/api/v1/billing/exports?period=2026-13&format=csv").token(&s.finance)).await;
    assert_eq!(bad.assert_problem(422, "validation_failed")["field"], "period");
    let bad = s.app.send(call("GET", "/api/v1/billing/exports?period=2026-10&format=xml").token(&s.finance)).await;
    assert_eq!(bad.assert_problem(422, "validation_failed")["field"], "format");
}

#[tokio::test]
async fn a_hard_budget_is_what_admission_sees_and_soft_budgets_alert_once_per_threshold() {
    let s = setup().await;
    let (ml, h100) = (s.teams[0].1, s.classes[0].1);
    let now = Utc::now();
    let period = fairway::billing::budgets::period_of(now);
    let month = fairway::billing::period_name(period);
    s.app
        .send(
            call("PUT", &format!("/api/v1/teams/ml/budgets/{month}"))
                .token(&s.admin)
                .json(&json!({"unit": "money", "amount": 10_000_000, "enforcement": "hard"})),
        )
        .await
        .assert_status(200);
    // $6.25 spent this month: 50% crossed, 80% not.
    let start = Utc.from_utc_datetime(&period.and_hms_opt(0, 0, 0).unwrap());
    let job = admitted_job(&s, ml, h100, 1, "spender").await;
    run_and_close(&s.app.pool, job, start, start + Duration::minutes(150)).await;
    let left =
        fairway::billing::budgets::hard_left(&s.app.pool, now, metering::Chargeback::Usage).await.expect("budgets");
    assert_eq!(left.money_micros.get(&ml), Some(&3_750_000));
    assert_eq!(left.money_micros.get(&s.teams[1].1), None);
    // A GPU-hour budget of 3 for vision, which has used none: 3 GPU-hours left, exactly.
    s.app
        .send(
            call("PUT", &format!("/api/v1/teams/vision/budgets/{month}"))
                .token(&s.admin)
                .json(&json!({"unit": "gpu-hours", "amount": 3, "enforcement": "hard"})),
        )
        .await
        .assert_status(200);
    let left = fairway::billing::budgets::hard_left(&s.app.pool, now, metering::Chargeback::Usage).await.unwrap();
    assert_eq!(left.gpu_milli_ms.get(&s.teams[1].1), Some(&(3 * 1000 * 3_600_000)));
    let metrics = fairway::telemetry::Metrics::default();
    assert_eq!(
        fairway::billing::budgets::raise_alerts(&s.app.pool, now, metering::Chargeback::Usage, &metrics).await.unwrap(),
        1
    );
    assert_eq!(
        fairway::billing::budgets::raise_alerts(&s.app.pool, now, metering::Chargeback::Usage, &metrics).await.unwrap(),
        0
    );
    let status = s.app.send(call("GET", "/api/v1/teams/ml/budget-status").token(&s.admin)).await;
    status.assert_status(200);
    let status = status.json();
    assert_eq!(status["spent_to_date"], 6_250_000);
    assert_eq!(status["alerts"][0]["threshold"], 50);
    assert_eq!(status["alerts"].as_array().map(Vec::len), Some(1));
    assert!(metrics
        .render((0, 0), fairway::telemetry::Tenants::Named)
        .contains("fairway_budget_alerts_total{team=\"ml\",threshold=\"50\"} 1"));
    let audit = scalar(&s.app.pool, "select count(*) from audit_log where action = 'budget.alert'").await;
    assert_eq!(audit, 1);
}

#[tokio::test]
async fn under_reserved_plus_burst_a_team_pays_its_reservation_hourly_and_only_burst_use_on_top() {
    let s = setup().await;
    let (ml, h100) = (s.teams[0].1, s.classes[0].1);
    let pricing = metering::Pricing { currency: "USD".into(), chargeback: metering::Chargeback::ReservedPlusBurst };
    // 4 H100 reserved from 06:00, 2 from 07:30 (written as the quota API writes its history).
    for (at, reserved) in [("2026-10-07T06:00:00Z", 4), ("2026-10-07T07:30:00Z", 2)] {
        sqlx::query(
            "insert into quota_history (team_id, gpu_class_id, effective_from, reserved) values ($1, $2, $3, $4)",
        )
        .bind(ml)
        .bind(h100)
        .bind(t(at))
        .bind(reserved)
        .execute(&s.app.pool)
        .await
        .expect("quota history");
    }
    let (from, until) = (t("2026-10-07T00:00:00Z"), t("2026-10-07T09:00:00Z"));
    assert_eq!(metering::reservations::book(&s.app.pool, from, until, &pricing).await.expect("book"), 4);
    assert_eq!(metering::reservations::book(&s.app.pool, from, until, &pricing).await.expect("again"), 0);
    // 4 × 1.5 h + 2 × 1.5 h = 9 reserved GPU-hours at $2.50.
    let reserved_cost =
        scalar(&s.app.pool, "select sum(billed_cost_micros)::int8 from usage_ledger where kind = 'reservation'").await;
    assert_eq!(reserved_cost, 22_500_000);
    assert_eq!(
        scalar(&s.app.pool, "select sum(gpu_milli_ms)::int8 from usage_ledger where kind = 'reservation'").await,
        0
    );

    // An hour within the reservation costs nothing more; an hour on borrowed GPUs does.
    let within = admitted_job(&s, ml, h100, 2, "within").await;
    let borrowed = admitted_job(&s, ml, h100, 2, "borrowed").await;
    sqlx::query("update jobs set borrowing = true where id = $1").bind(borrowed).execute(&s.app.pool).await.unwrap();
    for job in [within, borrowed] {
        let mut tx = s.app.pool.begin().await.unwrap();
        db::attempts::open_intervals(&mut tx, &[(job, 1, t("2026-10-07T06:00:00Z"))]).await.unwrap();
        db::attempts::close_intervals(&mut tx, &[(job, 1, t("2026-10-07T07:00:00Z"))]).await.unwrap();
        metering::ledger::book(&mut tx, job, 1, None, &pricing).await.unwrap();
        tx.commit().await.unwrap();
    }
    let billed = |job: JobId| format!("select sum(billed_cost_micros)::int8 from usage_ledger where job_id = '{job}'");
    assert_eq!(scalar(&s.app.pool, &billed(within)).await, 0);
    assert_eq!(scalar(&s.app.pool, &billed(borrowed)).await, 5_000_000);
    let statement = s.app.send(call("GET", "/api/v1/teams/ml/statements/2026-10").token(&s.admin)).await;
    statement.assert_status(200);
    assert_eq!(statement.json()["billed_cost"], "27.500000");
    let focus = export(&s, "2026-10", "focus").await;
    let header: Vec<&str> = focus.lines().next().unwrap().split(',').collect();
    let category = header.iter().position(|c| *c == "ChargeCategory").unwrap();
    let purchases =
        focus.lines().filter(|l| csv_fields(l).get(category).map(String::as_str) == Some("Purchase")).count();
    assert_eq!(purchases, 4, "one line per reservation piece");
}

#[tokio::test]
async fn idle_capacity_is_reported_per_class_and_shared_out_to_teams_by_their_use() {
    let s = setup().await;
    let (ml, vision, h100) = (s.teams[0].1, s.teams[1].1, s.classes[0].1);
    // 8 H100 of capacity from before the hour; ml uses 3 for the hour, vision 1.
    sqlx::query("insert into capacity_history (gpu_class_id, effective_from, gpus) values ($1, $2, 8)")
        .bind(h100)
        .bind(t("2026-10-08T00:00:00Z"))
        .execute(&s.app.pool)
        .await
        .expect("capacity");
    for (team, gpus) in [(ml, 3), (vision, 1)] {
        let job = admitted_job(&s, team, h100, gpus, "busy").await;
        run_and_close(&s.app.pool, job, t("2026-10-08T10:00:00Z"), t("2026-10-08T11:00:00Z")).await;
    }
    db::metering::roll_up(&s.app.pool, t("2026-10-08T12:00:00Z")).await.expect("roll up");
    let r = s.app.send(call("GET", "/api/v1/billing/utilisation?period=2026-10").token(&s.finance)).await;
    r.assert_status(200);
    let h =
        r.json().as_array().cloned().unwrap_or_default().into_iter().find(|c| c["gpu_class"] == "h100").expect("h100");
    // Completed hours 00:00–12:00 of 8 GPUs: 96 GPU-hours, 4 allocated, 92 idle.
    assert_eq!(
        (h["capacity_gpu_hours"].as_str(), h["allocated_gpu_hours"].as_str(), h["idle_gpu_hours"].as_str()),
        (Some("96.000000000"), Some("4.000000000"), Some("92.000000000"))
    );
    // In the hour it ran, ml used 3 of the 4 allocated GPUs: 3/4 of that hour's 4 idle GPUs.
    let statement = s.app.send(call("GET", "/api/v1/teams/ml/statements/2026-10").token(&s.admin)).await.json();
    assert_eq!(statement["idle_share_gpu_hours"], "3.000000000");
    assert_eq!(statement["idle_share_cost"], "7.500000");
    assert_eq!(statement["billed_cost"], "7.500000");
}

#[tokio::test]
async fn idle_time_in_the_hour_a_rate_card_starts_is_priced_at_that_rate_not_at_zero() {
    let s = setup().await;
    let ml = s.teams[0].1;
    // A class whose only rate ($2.50) and whose capacity (8 GPUs) both start at 10:30.
    let r = s
        .app
        .send(call("POST", "/api/v1/gpu-classes").token(&s.admin).json(&json!({
            "name": "b200", "kind": "whole", "memory_mib": 10240, "fraction_milli": 1000,
            "rate_micros_per_gpu_hour": H100_RATE, "rate_effective_from": "2026-10-08T10:30:00Z",
        })))
        .await;
    r.assert_status(201);
    let b200: GpuClassId = r.json()["id"].as_str().expect("id").parse().expect("uuid");
    sqlx::query("insert into capacity_history (gpu_class_id, effective_from, gpus) values ($1, $2, 8)")
        .bind(b200)
        .bind(t("2026-10-08T10:30:00Z"))
        .execute(&s.app.pool)
        .await
        .expect("capacity");
    // ml uses 2 of them for the half hour: 1 GPU-hour allocated, 3 idle, all of it ml's share.
    let job = admitted_job(&s, ml, b200, 2, "first-half-hour").await;
    run_and_close(&s.app.pool, job, t("2026-10-08T10:30:00Z"), t("2026-10-08T11:00:00Z")).await;
    db::metering::roll_up(&s.app.pool, t("2026-10-08T12:00:00Z")).await.expect("roll up");
    let statement = s.app.send(call("GET", "/api/v1/teams/ml/statements/2026-10").token(&s.admin)).await.json();
    assert_eq!(statement["billed_cost"], "2.500000");
    assert_eq!(statement["idle_share_gpu_hours"], "3.000000000");
    assert_eq!(statement["idle_share_cost"], "7.500000", "3 idle GPU-hours at $2.50: {statement}");
}

#[tokio::test]
async fn reservation_charges_start_at_the_hour_the_model_is_switched_on_and_follow_each_completed_hour() {
    let s = setup().await;
    let (ml, h100) = (s.teams[0].1, s.classes[0].1);
    let pricing = metering::Pricing { currency: "USD".into(), chargeback: metering::Chargeback::ReservedPlusBurst };
    sqlx::query("insert into quota_history (team_id, gpu_class_id, effective_from, reserved) values ($1, $2, $3, 2)")
        .bind(ml)
        .bind(h100)
        .bind(t("2026-10-01T00:00:00Z"))
        .execute(&s.app.pool)
        .await
        .expect("quota history");
    // The metering pass as it runs: from `next_from` to the last completed hour.
    let pass = |now: &'static str| {
        let pool = s.app.pool.clone();
        let pricing = pricing.clone();
        async move {
            let now = t(now);
            let from = metering::reservations::next_from(&pool, now).await.expect("from");
            let hour = DateTime::from_timestamp_millis(metering::hour_floor(now.timestamp_millis())).unwrap();
            metering::reservations::book(&pool, from, hour, &pricing).await.expect("book")
        }
    };
    // Switched on at 10:20: nothing before 10:00 is ever billed, 10:00–11:00 once it is over.
    assert_eq!(pass("2026-10-07T10:20:00Z").await, 0);
    assert_eq!(pass("2026-10-07T10:59:00Z").await, 0);
    assert_eq!(pass("2026-10-07T11:01:00Z").await, 1);
    assert_eq!(pass("2026-10-07T11:30:00Z").await, 0);
    assert_eq!(pass("2026-10-07T13:00:05Z").await, 2);
    let rows: Vec<(DateTime<Utc>, i64)> = sqlx::query_as(
        "select charge_start, billed_cost_micros from usage_ledger where kind = 'reservation' order by 1",
    )
    .fetch_all(&s.app.pool)
    .await
    .unwrap();
    let hours: Vec<String> = rows.iter().map(|(at, _)| at.format("%H:%M").to_string()).collect();
    assert_eq!(hours, vec!["10:00", "11:00", "12:00"]);
    assert!(rows.iter().all(|(_, cost)| *cost == 5_000_000), "2 × $2.50 an hour: {rows:?}");
}

#[tokio::test]
async fn an_export_is_gzipped_for_a_client_that_accepts_it_and_inflates_to_the_same_bytes() {
    let s = setup().await;
    let (ml, h100) = (s.teams[0].1, s.classes[0].1);
    for i in 0..20 {
        let job = admitted_job(&s, ml, h100, 1, &format!("job-{i}")).await;
        let start = t("2026-10-10T08:00:00Z") + Duration::minutes(i);
        run_and_close(&s.app.pool, job, start, start + Duration::hours(1)).await;
    }
    let plain = export(&s, "2026-10", "focus").await;
    let path = "/api/v1/billing/exports?period=2026-10&format=focus";
    let r = s.app.send(call("GET", path).token(&s.finance).header("accept-encoding", "gzip")).await;
    r.assert_status(200);
    assert_eq!(r.header("content-encoding").as_deref(), Some("gzip"));
    let mut inflated = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&r.body[..]), &mut inflated).expect("gzip");
    assert_eq!(inflated, plain, "the compressed export is the same export");
    assert!(r.body.len() * 3 < plain.len(), "{} bytes gzipped from {}", r.body.len(), plain.len());
    // Without Accept-Encoding nothing changes.
    let r = s.app.send(call("GET", path).token(&s.finance)).await;
    assert_eq!(r.header("content-encoding"), None);
}

/// Runs `.ci/check-focus` (the FinOps Foundation's focus-validator from PyPI, FOCUS 1.1
/// rules) over `csv`; returns whether it passed, and what it printed.
fn focus_validator(name: &str, csv: &str) -> (bool, String) {
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}.csv", uuid::Uuid::new_v4()));
    std::fs::write(&path, csv).expect("write the export");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/check-focus");
    let out = std::process::Command::new("bash").arg(script).arg(&path).output().expect("run .ci/check-focus");
    let _ = std::fs::remove_file(&path);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[tokio::test]
async fn focus_exports_of_every_kind_of_row_pass_the_finops_foundations_focus_validator() {
    let s = setup().await;
    let (ml, h100) = (s.teams[0].1, s.classes[0].1);
    let mig = s.classes[1].1;
    let pricing = metering::Pricing { currency: "USD".into(), chargeback: metering::Chargeback::ReservedPlusBurst };
    // Reserved quota (hourly purchases), usage inside it and on borrowed GPUs, MIG slices.
    sqlx::query("insert into quota_history (team_id, gpu_class_id, effective_from, reserved) values ($1, $2, $3, 2)")
        .bind(ml)
        .bind(h100)
        .bind(t("2026-10-07T06:00:00Z"))
        .execute(&s.app.pool)
        .await
        .expect("quota history");
    metering::reservations::book(&s.app.pool, t("2026-10-07T00:00:00Z"), t("2026-10-07T09:00:00Z"), &pricing)
        .await
        .expect("book reservations");
    let within = admitted_job(&s, ml, h100, 2, "within").await;
    let borrowed = admitted_job(&s, ml, h100, 2, "=borrowed,\"quoted\"").await;
    sqlx::query("update jobs set borrowing = true where id = $1").bind(borrowed).execute(&s.app.pool).await.unwrap();
    let slices = admitted_job(&s, ml, mig, 3, "slices").await;
    for job in [within, borrowed, slices] {
        let mut tx = s.app.pool.begin().await.unwrap();
        db::attempts::open_intervals(&mut tx, &[(job, 1, t("2026-10-07T06:00:00Z"))]).await.unwrap();
        db::attempts::close_intervals(&mut tx, &[(job, 1, t("2026-10-07T07:30:00Z"))]).await.unwrap();
        metering::ledger::book(&mut tx, job, 1, None, &pricing).await.unwrap();
        tx.commit().await.unwrap();
    }
    // October closed, then October usage reported late: a correction in November.
    s.app.send(call("POST", "/api/v1/billing/periods/2026-10/close").token(&s.finance)).await.assert_status(200);
    let late = admitted_job(&s, ml, h100, 1, "late").await;
    run_and_close(&s.app.pool, late, t("2026-10-20T00:00:00Z"), t("2026-10-20T01:00:00Z")).await;

    let october = export(&s, "2026-10", "focus").await;
    let november = export(&s, "2026-11", "focus").await;
    for (period, csv, kinds) in
        [("2026-10", &october, ["Purchase", "Usage"]), ("2026-11", &november, ["Correction", "Usage"])]
    {
        for kind in kinds {
            assert!(csv.contains(&format!(",{kind},")), "{period} has {kind} rows:\n{csv}");
        }
        let (passed, report) = focus_validator(period, csv);
        assert!(passed, "{period} fails focus-validator:\n{report}");
        assert!(report.contains("rows pass all"), "{report}");
    }
    assert!(october.contains(",Slice-Hours,"), "MIG rows are priced per slice-hour:\n{october}");

    // The check can fail: a charge category FOCUS does not define is found.
    let broken = october.replacen(",Usage,", ",Use,", 1);
    let (passed, report) = focus_validator("broken", &broken);
    assert!(!passed, "a made-up ChargeCategory passed:\n{report}");
    assert!(report.contains("ChargeCategory_Enum failed"), "{report}");
}
