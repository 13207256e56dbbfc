//! `fairway bench export`: how fast finance gets a month out, and in how much memory.
//!
//! One billing period of a million ledger rows is exported through the API
//! (`GET /api/v1/billing/exports`, streamed over real HTTP and read to the end) in each
//! format, and in the same run PostgreSQL's own ceiling for the same rows: `COPY ... TO
//! STDOUT` read raw, with no formatting, hashing or HTTP. Peak memory is the process's
//! resident-set high-water mark during each export (Linux resets it on request through
//! `/proc/self/clear_refs`), beside the resident set before it: the server and the client
//! run in this one process, so the difference bounds what an export holds at once.

use std::{io::Write, time::Instant};

use anyhow::Context as _;
use sqlx::Connection as _;

use super::platform::{client, Options, Platform};
use crate::{billing::export::Format, db};

/// Rows in the exported period.
const ROWS: i64 = 1_000_000;

/// Runs the benchmark and writes its table to `out`.
pub async fn report(out: &mut dyn Write) -> anyhow::Result<()> {
    let platform = Platform::start(Options::default()).await?;
    let result = measure(&platform, out).await;
    platform.stop().await;
    result
}

async fn measure(platform: &Platform, out: &mut dyn Write) -> anyhow::Result<()> {
    let period = chrono::NaiveDate::from_ymd_opt(2026, 10, 1).context("a valid date")?;
    let seeded = Instant::now();
    let rows = db::bench::seed_ledger(&platform.pool, ROWS, period).await?;
    writeln!(
        out,
        "Exporting one billing period of {rows} ledger rows (seeded in {:.1} s).",
        seeded.elapsed().as_secs_f64()
    )?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<34} {:>9} {:>11} {:>9} {:>13} {:>13}",
        "export", "seconds", "rows/s", "MiB", "RSS before MiB", "peak RSS MiB"
    )?;
    writeln!(out, "{}", "-".repeat(94))?;
    out.flush()?;

    let before = rss_mib("VmRSS")?;
    reset_peak();
    let started = Instant::now();
    let mut conn = sqlx::PgConnection::connect_with(&platform.options).await?;
    let bytes = db::bench::copy_out_period(&mut conn, period).await?;
    conn.close().await?;
    line(out, "PostgreSQL COPY (raw CSV, baseline)", rows, started, bytes, before)?;

    let http = client()?;
    let token = platform.admin_token();
    for format in [Format::Csv, Format::Focus, Format::Json] {
        let before = rss_mib("VmRSS")?;
        reset_peak();
        let started = Instant::now();
        let url = format!("{}/billing/exports?period=2026-10&format={}", platform.api, format.as_str());
        let mut response = http.get(&url).bearer_auth(&token).send().await?;
        anyhow::ensure!(response.status().is_success(), "export answered {}", response.status());
        let mut bytes = 0u64;
        let mut tail = Vec::new();
        while let Some(chunk) = response.chunk().await? {
            bytes += chunk.len() as u64;
            tail = chunk.to_vec();
        }
        // The control record, as JSON or as one CSV field (quotes doubled).
        let text = String::from_utf8_lossy(&tail).replace("\"\"", "\"");
        anyhow::ensure!(
            text.contains(&format!("\"rows\":{rows}")),
            "the export's control record does not count {rows} rows"
        );
        line(out, &format!("API export, {}", format.as_str()), rows, started, bytes, before)?;
    }
    Ok(())
}

fn line(out: &mut dyn Write, what: &str, rows: u64, started: Instant, bytes: u64, before: f64) -> anyhow::Result<()> {
    let seconds = started.elapsed().as_secs_f64();
    writeln!(
        out,
        "{what:<34} {seconds:>9.2} {:>11.0} {:>9.0} {before:>13.1} {:>13.1}",
        rows as f64 / seconds,
        bytes as f64 / (1024.0 * 1024.0),
        rss_mib("VmHWM")?
    )?;
    out.flush()?;
    Ok(())
}

/// A line of `/proc/self/status` (`VmRSS`, `VmHWM`) in MiB.
fn rss_mib(key: &str) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim_start_matches(':').split_whitespace().next()?.parse().ok())
        .with_context(|| format!("no {key} in /proc/self/status"))?;
    Ok(kib / 1024.0)
}

/// Resets the resident-set high-water mark to the current resident set.
fn reset_peak() {
    // Best effort: without it the peak column shows the peak since start.
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}
