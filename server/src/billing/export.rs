//! Billing exports: one billing period of the ledger as CSV, JSON lines or FinOps FOCUS.
//!
//! An export is a header, one line per ledger row in id order, and a control record: the
//! row count, the totals and the SHA-256 of every byte before the control record. Nothing in
//! it depends on when it is made, so a closed period (whose rows can no longer change)
//! exports to the same bytes every time. Rows are read a page at a time and written as they
//! come ([`stream`]), so memory stays bounded however large the period.
//!
//! The FOCUS format follows the FinOps Open Cost and Usage Specification 1.1 column set; GPU
//! time travels exactly in the `x_GpuMilliMs` extension column beside the decimal GPU-hours.

use std::fmt::Write as _;

use chrono::{NaiveDate, SecondsFormat};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::budgets::period_bounds;
use crate::{
    db::billing::ExportRow,
    metering::{gpu_hours_decimal, micros_decimal, HOUR_MS},
};

/// An export format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, utoipa::ToSchema, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// Fairway's own columns, one row per ledger row.
    Csv,
    /// JSON lines: one object per ledger row, then `{"control": ...}`.
    Json,
    /// FinOps FOCUS 1.1 columns as CSV.
    Focus,
}

impl Format {
    /// The media type of the export.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Csv | Format::Focus => "text/csv; charset=utf-8",
            Format::Json => "application/x-ndjson",
        }
    }

    /// The file extension of the export.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Csv | Format::Focus => "csv",
            Format::Json => "jsonl",
        }
    }

    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Csv => "csv",
            Format::Json => "json",
            Format::Focus => "focus",
        }
    }
}

const CSV_COLUMNS: [&str; 26] = [
    "ledger_id",
    "kind",
    "corrects",
    "reason",
    "billing_period",
    "charge_start",
    "charge_end",
    "team_id",
    "team",
    "job_id",
    "job_name",
    "attempt",
    "gpu_class",
    "priority_class",
    "gpus",
    "fraction_milli",
    "borrowing",
    "duration_ms",
    "gpu_milli_ms",
    "gpu_hours",
    "rate_per_gpu_hour",
    "price_multiplier",
    "list_cost",
    "billed_cost",
    "currency",
    "labels",
];

/// FOCUS 1.1 columns, then Fairway's `x_` extension columns.
pub const FOCUS_COLUMNS: [&str; 45] = [
    "AvailabilityZone",
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "RegionId",
    "RegionName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "SkuId",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "Tags",
    "x_GpuMilliMs",
    "x_Gpus",
    "x_GpuFractionMilli",
    "x_LedgerId",
    "x_CorrectsLedgerId",
];

/// Writes an export piece by piece, hashing what it writes.
pub struct Exporter {
    format: Format,
    period: NaiveDate,
    hasher: Sha256,
    rows: u64,
    gpu_milli_ms: i128,
    list_cost_micros: i128,
    billed_cost_micros: i128,
    currency: String,
}

impl Exporter {
    /// An export of `period` in `format`; `currency` is the platform's.
    pub fn new(format: Format, period: NaiveDate, currency: &str) -> Self {
        Self {
            format,
            period,
            hasher: Sha256::new(),
            rows: 0,
            gpu_milli_ms: 0,
            list_cost_micros: 0,
            billed_cost_micros: 0,
            currency: currency.to_owned(),
        }
    }

    fn emit(&mut self, text: String) -> Vec<u8> {
        self.hasher.update(text.as_bytes());
        text.into_bytes()
    }

    /// The header line (none for JSON lines).
    pub fn header(&mut self) -> Vec<u8> {
        let line = match self.format {
            Format::Csv => format!("{}\r\n", CSV_COLUMNS.join(",")),
            Format::Focus => format!("{}\r\n", FOCUS_COLUMNS.join(",")),
            Format::Json => String::new(),
        };
        self.emit(line)
    }

    /// The lines of `rows`.
    pub fn rows(&mut self, rows: &[ExportRow]) -> Vec<u8> {
        let mut text = String::with_capacity(rows.len() * 512);
        for r in rows {
            self.rows += 1;
            self.gpu_milli_ms += i128::from(r.gpu_milli_ms);
            self.list_cost_micros += i128::from(r.list_cost_micros);
            self.billed_cost_micros += i128::from(r.billed_cost_micros);
            // The rows' own currency: a closed period's control record must not change with
            // the platform's setting.
            self.currency.clone_from(&r.currency);
            match self.format {
                Format::Csv => csv_line(&mut text, &native_fields(r)),
                Format::Focus => csv_line(&mut text, &focus_fields(r, self.period)),
                Format::Json => {
                    let _ = writeln!(text, "{}", native_json(r));
                }
            }
        }
        self.emit(text)
    }

    /// The control record, closing the export.
    pub fn control(mut self) -> Vec<u8> {
        let digest = self.hasher.finalize_reset();
        let sha256: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let control = json!({
            "period": super::period_name(self.period),
            "format": self.format.as_str(),
            "rows": self.rows,
            "gpu_milli_ms": self.gpu_milli_ms.to_string(),
            "gpu_hours": gpu_hours_decimal(i64::try_from(self.gpu_milli_ms).unwrap_or(i64::MAX)),
            "list_cost": micros_decimal(i64::try_from(self.list_cost_micros).unwrap_or(i64::MAX)),
            "billed_cost": micros_decimal(i64::try_from(self.billed_cost_micros).unwrap_or(i64::MAX)),
            "currency": self.currency,
            "sha256": sha256,
        });
        match self.format {
            Format::Json => format!("{}\n", json!({ "control": control })).into_bytes(),
            // One quoted field after the data, so a spreadsheet or CSV reader shows it as a
            // single last cell.
            Format::Csv | Format::Focus => {
                let mut line = String::new();
                csv_line(&mut line, &[format!("# control {control}")]);
                line.into_bytes()
            }
        }
    }
}

fn ts(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn native_fields(r: &ExportRow) -> Vec<String> {
    vec![
        r.id.to_string(),
        r.kind.clone(),
        r.corrects.map(|c| c.to_string()).unwrap_or_default(),
        text(r.reason.as_deref().unwrap_or("")),
        super::period_name(r.billing_period),
        ts(r.charge_start),
        ts(r.charge_end),
        r.team_id.to_string(),
        text(&r.team_name),
        r.job_id.map(|id| id.to_string()).unwrap_or_default(),
        text(r.job_name.as_deref().unwrap_or("")),
        r.attempt.map(|a| a.to_string()).unwrap_or_default(),
        r.gpu_class.clone(),
        r.priority_class.clone(),
        r.gpus.to_string(),
        r.fraction_milli.to_string(),
        r.borrowing.to_string(),
        r.duration_ms.to_string(),
        r.gpu_milli_ms.to_string(),
        gpu_hours_decimal(r.gpu_milli_ms),
        micros_decimal(r.rate_micros_per_gpu_hour),
        format!("{}.{:03}", r.price_multiplier_milli / 1000, r.price_multiplier_milli % 1000),
        micros_decimal(r.list_cost_micros),
        micros_decimal(r.billed_cost_micros),
        r.currency.clone(),
        text(&r.labels.to_string()),
    ]
}

fn native_json(r: &ExportRow) -> Value {
    json!({
        "ledger_id": r.id,
        "kind": r.kind,
        "corrects": r.corrects,
        "reason": r.reason,
        "billing_period": super::period_name(r.billing_period),
        "charge_start": ts(r.charge_start),
        "charge_end": ts(r.charge_end),
        "team_id": r.team_id,
        "team": r.team_name,
        "job_id": r.job_id,
        "job_name": r.job_name,
        "attempt": r.attempt,
        "gpu_class": r.gpu_class,
        "priority_class": r.priority_class,
        "gpus": r.gpus,
        "fraction_milli": r.fraction_milli,
        "borrowing": r.borrowing,
        "duration_ms": r.duration_ms,
        "gpu_milli_ms": r.gpu_milli_ms,
        "gpu_hours": gpu_hours_decimal(r.gpu_milli_ms),
        "rate_per_gpu_hour": micros_decimal(r.rate_micros_per_gpu_hour),
        "price_multiplier_milli": r.price_multiplier_milli,
        "list_cost": micros_decimal(r.list_cost_micros),
        "billed_cost": micros_decimal(r.billed_cost_micros),
        "currency": r.currency,
        "labels": r.labels,
    })
}

fn focus_fields(r: &ExportRow, period: NaiveDate) -> Vec<String> {
    let (period_start, period_end) = period_bounds(period);
    // A correction, or usage of a period already closed when it was booked.
    let correction = r.kind == "correction" || r.charge_start < period_start;
    // Pricing is per unit of the class (a MIG slice is one unit); consumption is in
    // physical GPU-hours.
    let pricing_quantity = gpu_hours_decimal(i64::from(r.gpus) * r.duration_ms * 1000);
    let contracted_price =
        crate::metering::cost_micros(1, HOUR_MS, r.rate_micros_per_gpu_hour, r.price_multiplier_milli);
    let mut tags = serde_json::Map::new();
    if let Value::Object(labels) = &r.labels {
        tags.extend(labels.clone());
    }
    tags.insert("fairway/priority-class".into(), Value::String(r.priority_class.clone()));
    tags.insert("fairway/borrowing".into(), Value::String(r.borrowing.to_string()));
    let reservation = r.kind == "reservation";
    let description = match (&r.job_name, r.attempt) {
        (Some(name), Some(attempt)) => format!("{} x {} for job {name} (attempt {attempt})", r.gpus, r.gpu_class),
        _ => format!("reserved quota of {} x {}", r.gpus, r.gpu_class),
    } + &r.reason.as_ref().map(|why| format!("; correction: {why}")).unwrap_or_default();
    let resource_id = match (r.job_id, r.attempt) {
        (Some(job), Some(attempt)) => format!("fairway:job/{job}/attempt/{attempt}"),
        _ => format!("fairway:quota/{}/{}", r.team_id, r.gpu_class),
    };
    let resource_name = r.job_name.clone().unwrap_or_else(|| format!("{} reserved {}", r.team_name, r.gpu_class));
    vec![
        String::new(),
        micros_decimal(r.billed_cost_micros),
        "fairway".into(),
        "Fairway GPU platform".into(),
        r.currency.clone(),
        ts(period_end),
        ts(period_start),
        // A reservation is capacity bought by the hour whether used or not.
        if reservation { "Purchase".into() } else { "Usage".into() },
        if correction { "Correction".into() } else { String::new() },
        text(&description),
        if reservation { "Recurring".into() } else { "Usage-Based".into() },
        ts(r.charge_end),
        ts(r.charge_start),
        String::new(),
        String::new(),
        // FOCUS: consumption is given for usage only.
        if reservation { String::new() } else { gpu_hours_decimal(r.gpu_milli_ms) },
        if reservation { String::new() } else { "GPU-Hours".into() },
        micros_decimal(r.billed_cost_micros),
        micros_decimal(contracted_price),
        micros_decimal(r.billed_cost_micros),
        "Fairway".into(),
        micros_decimal(r.list_cost_micros),
        micros_decimal(r.rate_micros_per_gpu_hour),
        "Standard".into(),
        pricing_quantity,
        "GPU-Hours".into(),
        "Fairway".into(),
        "Fairway".into(),
        String::new(),
        String::new(),
        resource_id,
        text(&resource_name),
        "GPU Job".into(),
        "AI and Machine Learning".into(),
        "Fairway GPU Jobs".into(),
        r.gpu_class.clone(),
        format!("{}:{}", r.gpu_class, r.rate_micros_per_gpu_hour),
        r.team_id.to_string(),
        text(&r.team_name),
        text(&Value::Object(tags).to_string()),
        r.gpu_milli_ms.to_string(),
        r.gpus.to_string(),
        r.fraction_milli.to_string(),
        r.id.to_string(),
        r.corrects.map(|c| c.to_string()).unwrap_or_default(),
    ]
}

/// User-supplied text made safe for spreadsheets: a leading `=`, `+`, `-`, `@`, tab or
/// carriage return would make a spreadsheet evaluate the cell as a formula (CSV injection),
/// so such text gets a leading apostrophe, as OWASP recommends.
fn text(s: &str) -> String {
    match s.chars().next() {
        Some('=' | '+' | '-' | '@' | '\t' | '\r') => format!("'{s}"),
        _ => s.to_owned(),
    }
}

/// Appends one RFC 4180 line: fields with a comma, quote or line break are quoted, quotes
/// doubled, lines end in CRLF.
fn csv_line(out: &mut String, fields: &[String]) {
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        if f.contains([',', '"', '\n', '\r']) {
            out.push('"');
            out.push_str(&f.replace('"', "\"\""));
            out.push('"');
        } else {
            out.push_str(f);
        }
    }
    out.push_str("\r\n");
}

/// Rows read per page.
pub const PAGE: i64 = 5_000;

/// Writes the export of `period` to `sink` page by page, reading in one repeatable-read
/// transaction so the rows and the control record describe one state of the ledger.
pub async fn write<F, Fut>(
    pool: &sqlx::PgPool,
    period: NaiveDate,
    format: Format,
    currency: &str,
    mut sink: F,
) -> Result<(), ExportError>
where
    F: FnMut(Vec<u8>) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut tx = pool.begin().await?;
    sqlx::query("set transaction isolation level repeatable read, read only").execute(&mut *tx).await?;
    let mut exporter = Exporter::new(format, period, currency);
    if !sink(exporter.header()).await {
        return Err(ExportError::Closed);
    }
    let mut after = 0;
    loop {
        let page = crate::db::billing::export_page(&mut tx, period, after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.id;
        if !sink(exporter.rows(&page)).await {
            return Err(ExportError::Closed);
        }
        if (page.len() as i64) < PAGE {
            break;
        }
    }
    tx.commit().await?;
    if !sink(exporter.control()).await {
        return Err(ExportError::Closed);
    }
    Ok(())
}

/// Why an export stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    /// The reader went away.
    #[error("the reader went away")]
    Closed,
}

/// The export as a stream of chunks for an HTTP body: a task writes pages into a small
/// channel, so at most a few pages are in memory while a slow client reads.
pub fn stream(
    pool: sqlx::PgPool,
    period: NaiveDate,
    format: Format,
    currency: String,
) -> impl futures_util::Stream<Item = Result<Vec<u8>, std::io::Error>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
    tokio::spawn(async move {
        let sink = |chunk: Vec<u8>| {
            let tx = tx.clone();
            async move { tx.send(Ok(chunk)).await.is_ok() }
        };
        if let Err(ExportError::Db(e)) = write(&pool, period, format, &currency, sink).await {
            tracing::error!(error = %e, "billing export failed midway");
            // The body ends with an error, so the client sees a broken transfer rather than
            // a short file that looks complete (it also lacks the control record).
            let _ = tx.send(Err(std::io::Error::other("the export failed"))).await;
        }
    });
    // Fused: a body wrapper (gzip) may poll once more after the end, which `unfold` forbids.
    futures_util::StreamExt::fuse(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{JobId, TeamId};
    use chrono::{DateTime, Utc};

    fn row(id: i64, job_name: &str) -> ExportRow {
        let start: DateTime<Utc> = "2026-11-05T10:00:00Z".parse().unwrap();
        ExportRow {
            id,
            kind: "usage".into(),
            corrects: None,
            reason: None,
            job_id: Some(JobId::from_u128(0)),
            attempt: Some(1),
            job_name: Some(job_name.into()),
            team_id: TeamId::from_u128(0),
            team_name: "ml".into(),
            gpu_class: "a100-80gb.mig-3g.40gb".into(),
            priority_class: "production".into(),
            gpus: 2,
            fraction_milli: 428,
            borrowing: false,
            charge_start: start,
            charge_end: start + chrono::Duration::minutes(30),
            duration_ms: 1_800_000,
            gpu_milli_ms: 2 * 428 * 1_800_000,
            rate_micros_per_gpu_hour: 1_000_000,
            price_multiplier_milli: 1000,
            list_cost_micros: 1_000_000,
            billed_cost_micros: 1_000_000,
            currency: "USD".into(),
            billing_period: NaiveDate::from_ymd_opt(2026, 11, 1).unwrap(),
            labels: json!({"project": "llama, v2"}),
        }
    }

    fn export(format: Format, rows: &[ExportRow]) -> String {
        let mut e = Exporter::new(format, NaiveDate::from_ymd_opt(2026, 11, 1).unwrap(), "USD");
        let mut bytes = e.header();
        bytes.extend(e.rows(rows));
        bytes.extend(e.control());
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn a_focus_export_has_the_focus_columns_and_one_line_per_row() {
        let text = export(Format::Focus, &[row(1, "train"), row(2, "eval")]);
        let lines: Vec<&str> = text.split("\r\n").collect();
        // The columns FOCUS 1.1 makes mandatory, written out here independently.
        let mandatory = [
            "BilledCost",
            "BillingAccountId",
            "BillingAccountName",
            "BillingCurrency",
            "BillingPeriodEnd",
            "BillingPeriodStart",
            "ChargeCategory",
            "ChargeClass",
            "ChargeDescription",
            "ChargePeriodEnd",
            "ChargePeriodStart",
            "ContractedCost",
            "EffectiveCost",
            "InvoiceIssuerName",
            "ListCost",
            "PricingQuantity",
            "PricingUnit",
            "ProviderName",
            "PublisherName",
            "ServiceCategory",
            "ServiceName",
        ];
        for column in mandatory {
            assert!(lines[0].split(',').any(|c| c == column), "{column}");
        }
        // Every data line has as many fields as the header, counting commas outside quotes.
        let fields = |line: &str| {
            let mut quoted = false;
            1 + line
                .chars()
                .filter(|c| {
                    if *c == '"' {
                        quoted = !quoted;
                    }
                    *c == ',' && !quoted
                })
                .count()
        };
        assert_eq!(fields(lines[1]), FOCUS_COLUMNS.len(), "{}", lines[1]);
        assert_eq!(fields(lines[2]), FOCUS_COLUMNS.len(), "{}", lines[2]);
        assert!(lines[1].contains("2026-11-01T00:00:00.000Z"), "{}", lines[1]);
        assert!(lines[1].contains(",GPU-Hours,"), "{}", lines[1]);
        assert!(lines[3].starts_with("\"# control {\"\"billed_cost\"\":"), "{}", lines[3]);
    }

    #[test]
    fn the_control_record_counts_the_rows_and_hashes_what_came_before() {
        let text = export(Format::Json, &[row(1, "a"), row(2, "b")]);
        let (data, control) = text.trim_end().rsplit_once('\n').unwrap();
        let control: Value = serde_json::from_str(control).unwrap();
        assert_eq!(control["control"]["rows"], 2);
        assert_eq!(control["control"]["billed_cost"], "2.000000");
        let digest = Sha256::digest(format!("{data}\n").as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(control["control"]["sha256"], hex.as_str());
    }

    #[test]
    fn user_text_cannot_become_a_spreadsheet_formula_or_break_a_csv_line() {
        let text = export(Format::Csv, &[row(1, "=HYPERLINK(\"http://x\")")]);
        let line = text.split("\r\n").nth(1).unwrap();
        assert!(line.contains("\"'=HYPERLINK(\"\"http://x\"\")\""), "{line}");
        assert!(line.contains("\"{\"\"project\"\":\"\"llama, v2\"\"}\""), "{line}");
    }
}
