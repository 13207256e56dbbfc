//! `fairway bench portal`: how long the portal's pages take with 10,000 jobs in the database.
//!
//! A signed-in platform admin (who sees every page) loads each page over real HTTP, first
//! with a nearly empty database (ten jobs: the baseline, in the same run), then after seeding
//! ten thousand jobs of one team with their timelines, a month of its ledger and thirty days
//! of hourly usage roll-ups for every team. Each page is loaded 40 times one after another;
//! the figures are client-side milliseconds over loopback, so they bound the server's time
//! from above. The stylesheet (no database) is the HTTP floor.

use std::{
    io::Write,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use chrono::{Datelike as _, Utc};

use super::platform::{Options, Percentiles, Platform};
use crate::{db, web::session};

/// Jobs seeded before the second measurement.
const JOBS: i64 = 10_000;
/// Jobs in the baseline.
const BASELINE_JOBS: i64 = 10;
/// Loads of each page per measurement.
const LOADS: usize = 40;
/// The goal for a page, server time.
const GOAL_MS: f64 = 100.0;

/// Runs the benchmark and writes its table to `out`.
pub async fn report(out: &mut dyn Write) -> anyhow::Result<()> {
    let platform = Platform::start(Options::default()).await?;
    let result = measure(&platform, out).await;
    platform.stop().await;
    result
}

async fn measure(platform: &Platform, out: &mut dyn Write) -> anyhow::Result<()> {
    let base = platform.api.trim_end_matches("/api/v1").to_owned();
    let team = platform.team("ml", None).await?;
    let class = db::gpu_classes::list(&platform.pool, None, 1).await?.into_iter().next().context("a GPU class")?;
    platform.quota(team, &class.name, 64, 32).await?;
    for other in 0..9 {
        platform.team(&format!("team-{other}"), None).await?;
    }
    let secret = session::random_token();
    let expires = Utc::now() + chrono::Duration::hours(1);
    db::web_sessions::create(&platform.pool, &session::secret_hash(&secret), platform.admin, "bench", expires, None)
        .await?;
    let cookie = format!("{}={secret}", session::cookie_name(false));
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;

    let now = Utc::now();
    let period = now.date_naive().with_day(1).context("the first of the month")?;
    let hours = (now - period.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc()).num_hours().max(1);
    let month = period.format("%Y-%m").to_string();
    let seed =
        |jobs: i64| db::bench::seed_portal(&platform.pool, team, class.id, jobs, period, hours, now.date_naive());

    seed(BASELINE_JOBS).await?;
    let job = db::bench::a_job_of(&platform.pool, team).await?;
    let pages = [
        "/static/portal.css (no database: the HTTP floor)".to_owned(),
        "/".to_owned(),
        "/teams/ml".to_owned(),
        "/teams/ml/jobs".to_owned(),
        "/teams/ml/jobs?state=failed".to_owned(),
        format!("/jobs/{job}"),
        "/teams/ml/jobs/new".to_owned(),
        "/clusters".to_owned(),
        "/billing".to_owned(),
        format!("/billing/periods/{month}"),
        format!("/teams/ml/statements/{month}"),
        "/admin".to_owned(),
        "/teams/ml/audit".to_owned(),
    ];
    let mut baseline = Vec::new();
    for page in &pages {
        baseline.push(time_page(&http, &base, &cookie, page).await?);
    }
    let seeded = Instant::now();
    seed(JOBS - BASELINE_JOBS).await?;
    sqlx::query("analyze").execute(&platform.pool).await?;
    writeln!(
        out,
        "Portal pages as a platform admin, {LOADS} loads each, milliseconds over loopback HTTP \
         (seeded {JOBS} jobs in {:.1} s).",
        seeded.elapsed().as_secs_f64()
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<52} {:>10} {:>10} {:>11} {:>11} {:>6}",
        "page",
        format!("p50 @{BASELINE_JOBS}"),
        format!("p99 @{BASELINE_JOBS}"),
        format!("p50 @{}k", JOBS / 1000),
        format!("p99 @{}k", JOBS / 1000),
        "goal"
    )?;
    writeln!(out, "{}", "-".repeat(105))?;
    for (page, before) in pages.iter().zip(baseline) {
        let after = time_page(&http, &base, &cookie, page).await?;
        let verdict = if after.p99 <= GOAL_MS { "met" } else { "MISSED" };
        writeln!(
            out,
            "{page:<52} {:>10.1} {:>10.1} {:>11.1} {:>11.1} {verdict:>6}",
            before.p50, before.p99, after.p50, after.p99
        )?;
        out.flush()?;
    }
    writeln!(out)?;
    writeln!(out, "goal: every page's p99 at {}k jobs within {GOAL_MS:.0} ms", JOBS / 1000)?;
    Ok(())
}

/// Loads `page` [`LOADS`] times (after one warm-up load) and checks it rendered.
async fn time_page(http: &reqwest::Client, base: &str, cookie: &str, page: &str) -> anyhow::Result<Percentiles> {
    let path = page.split_whitespace().next().unwrap_or(page);
    let url = format!("{base}{path}");
    let mut sample = Vec::with_capacity(LOADS);
    for i in 0..=LOADS {
        let started = Instant::now();
        let response = http.get(&url).header(reqwest::header::COOKIE, cookie).send().await?;
        let status = response.status();
        let body = response.bytes().await?;
        anyhow::ensure!(status.is_success(), "{path} answered {status}: {}", String::from_utf8_lossy(&body));
        if i > 0 {
            sample.push(started.elapsed());
        }
    }
    Ok(Percentiles::of(&sample))
}
