//! `fairway bench submit`: how fast CI pipelines can submit jobs.
//!
//! At each concurrency level, that many clients submit jobs for a fixed time, each waiting
//! for its answer before sending the next (closed loop), through real HTTP with team-scoped
//! CI tokens: authentication, validation against the catalogue, the job and its `submitted`
//! event written and committed durably (fsync on), the scheduler woken. In the same run and
//! at the same concurrency, the raw PostgreSQL ceiling: the same job row inserted alone in its
//! own durable transaction from as many connections, with no HTTP and no validation. The
//! table shows both and their ratio. Then the batch form, 1,000 jobs per request.

use crate::domain::{GpuClassId, TeamId};
use std::{
    io::Write,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use serde_json::json;
use sqlx::Connection as _;

use super::platform::{client, Options, Percentiles, Platform};
use crate::db;

/// Concurrency levels of the single-job table.
const LEVELS: [usize; 5] = [1, 4, 16, 64, 128];
/// Concurrency levels of the batch table.
const BATCH_LEVELS: [usize; 3] = [1, 2, 4];
/// Jobs per batch request.
const BATCH: usize = 1_000;
/// Teams the clients submit for, in turn.
const TEAMS: usize = 16;
/// How long each level runs.
const LEVEL_TIME: Duration = Duration::from_secs(5);
/// The submitted class: one node of the built-in inventory holds any of these jobs.
const CLASS: &str = "h100-80gb";

/// What one level measured.
struct Level {
    per_second: f64,
    latency: Percentiles,
}

/// Runs the benchmark and writes its tables to `out`.
pub async fn report(out: &mut dyn Write) -> anyhow::Result<()> {
    let platform = Platform::start(Options::default()).await?;
    let result = measure(&platform, out).await;
    platform.stop().await;
    result
}

async fn measure(platform: &Platform, out: &mut dyn Write) -> anyhow::Result<()> {
    let mut teams = Vec::new();
    for i in 0..TEAMS {
        let id = platform.team(&format!("team-{i:02}"), None).await?;
        platform.quota(id, CLASS, 8, 8).await?;
        teams.push((format!("team-{i:02}"), id, platform.ci_token(id).await?));
    }
    let class = db::gpu_classes::by_name(&platform.pool, CLASS).await?.context("the class exists")?.id;
    let http = client()?;

    writeln!(out, "Submitting jobs: durable POST /api/v1/teams/{{team}}/jobs over HTTP with CI tokens, against")?;
    writeln!(
        out,
        "the raw PostgreSQL ceiling (the same job row, one INSERT per durable transaction), {} s per level.",
        LEVEL_TIME.as_secs()
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:>11} | {:>10} {:>8} {:>8} | {:>10} {:>8} {:>8} | {:>9}",
        "concurrency", "API jobs/s", "p50 ms", "p99 ms", "raw rows/s", "p50 ms", "p99 ms", "API / raw"
    )?;
    writeln!(out, "{}", "-".repeat(88))?;
    for &clients in &LEVELS {
        let api = api_level(&http, &platform.api, &teams, clients, 1).await?;
        let raw = raw_level(platform, &teams, class, clients).await?;
        writeln!(
            out,
            "{:>11} | {:>10.0} {:>8.2} {:>8.2} | {:>10.0} {:>8.2} {:>8.2} | {:>8.0}%",
            clients,
            api.per_second,
            api.latency.p50,
            api.latency.p99,
            raw.per_second,
            raw.latency.p50,
            raw.latency.p99,
            100.0 * api.per_second / raw.per_second.max(f64::MIN_POSITIVE)
        )?;
        out.flush()?;
    }
    writeln!(out)?;
    writeln!(out, "Batches: POST /api/v1/teams/{{team}}/jobs:batch, {BATCH} jobs per request, all or none.")?;
    writeln!(out)?;
    writeln!(out, "{:>11} | {:>10} | {:>14} {:>14}", "concurrency", "jobs/s", "p50 ms/request", "p99 ms/request")?;
    writeln!(out, "{}", "-".repeat(56))?;
    for &clients in &BATCH_LEVELS {
        let level = api_level(&http, &platform.api, &teams, clients, BATCH).await?;
        writeln!(
            out,
            "{:>11} | {:>10.0} | {:>14.1} {:>14.1}",
            clients, level.per_second, level.latency.p50, level.latency.p99
        )?;
        out.flush()?;
    }
    Ok(())
}

/// `clients` closed-loop clients submitting `per_request` jobs per request for
/// [`LEVEL_TIME`]; jobs per second and per-request latency. Any answer but 201 fails the run.
async fn api_level(
    http: &Arc<reqwest::Client>,
    api: &str,
    teams: &[(String, TeamId, String)],
    clients: usize,
    per_request: usize,
) -> anyhow::Result<Level> {
    let started = Instant::now();
    let deadline = started + LEVEL_TIME;
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let (team, _, token) = teams[c % teams.len()].clone();
        let http = http.clone();
        let url = match per_request {
            1 => format!("{api}/teams/{team}/jobs"),
            _ => format!("{api}/teams/{team}/jobs:batch"),
        };
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut n = 0u64;
            while Instant::now() < deadline {
                let body = match per_request {
                    1 => job(c, n),
                    _ => json!({ "jobs": (0..per_request as u64).map(|i| job(c, n * 10_000 + i)).collect::<Vec<_>>() }),
                };
                let sent = Instant::now();
                let response = http.post(&url).bearer_auth(&token).json(&body).send().await?;
                let status = response.status();
                let text = response.text().await?;
                anyhow::ensure!(status.as_u16() == 201, "submission answered {status}: {text}");
                latencies.push(sent.elapsed());
                n += 1;
            }
            anyhow::Ok(latencies)
        });
    }
    let mut latencies = Vec::new();
    while let Some(done) = tasks.join_next().await {
        latencies.extend(done??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    let jobs = (latencies.len() * per_request) as f64;
    Ok(Level { per_second: jobs / elapsed, latency: Percentiles::of(&latencies) })
}

/// A small job as a CI pipeline submits it.
fn job(client: usize, n: u64) -> serde_json::Value {
    json!({
        "name": format!("ci-{client}-{n}"),
        "gpu_class": CLASS,
        "gpus_per_replica": 1,
        "priority_class": "experiment",
        "max_runtime_seconds": 3600,
        "image": "registry.example/train:1",
        "command": ["python", "train.py"],
        "labels": {"pipeline": "bench"},
    })
}

/// `clients` connections each inserting the bare job row in its own transaction for
/// [`LEVEL_TIME`], for the teams in turn as the API clients do.
async fn raw_level(
    platform: &Platform,
    teams: &[(String, TeamId, String)],
    class: GpuClassId,
    clients: usize,
) -> anyhow::Result<Level> {
    let started = Instant::now();
    let deadline = started + LEVEL_TIME;
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..clients {
        let (options, team) = (platform.options.clone(), teams[c % teams.len()].1);
        tasks.spawn(async move {
            let mut conn = sqlx::PgConnection::connect_with(&options).await?;
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let sent = Instant::now();
                db::bench::insert_bare_job(&mut conn, team, class).await?;
                latencies.push(sent.elapsed());
            }
            conn.close().await?;
            anyhow::Ok(latencies)
        });
    }
    let mut latencies = Vec::new();
    while let Some(done) = tasks.join_next().await {
        latencies.extend(done??);
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok(Level { per_second: latencies.len() as f64 / elapsed, latency: Percentiles::of(&latencies) })
}
