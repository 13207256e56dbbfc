//! Billing exports: one billing period of the ledger as CSV, JSON lines or FinOps FOCUS.
//!
//! An export is a header and one line per ledger row in id order, nothing else: a FOCUS or
//! CSV reader sees data rows only. Its [`Control`] record (the row count, the totals and the
//! SHA-256 of every byte) travels beside it: the API serves it at
//! `/api/v1/billing/exports/control`, the CLI writes it to `<file>.control.json`. Nothing in
//! an export depends on when it is made, so a closed period (whose rows can no longer change)
//! exports to the same bytes, and the same control record, every time. Rows are read a page
//! at a time and written as they come ([`stream`]), so memory stays bounded however large the
//! period.
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
    /// JSON lines: one object per ledger row.
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

/// FOCUS 1.1 columns, then Fairway's `x_` extension columns. `BillingAccountType` and
/// `SubAccountType` are left out: FOCUS asks for them only where a provider has more than one
/// kind of account, and Fairway has one of each (the organisation, its teams).
pub const FOCUS_COLUMNS: [&str; 55] = [
    "AvailabilityZone",
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "CapacityReservationId",
    "CapacityReservationStatus",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountQuantity",
    "CommitmentDiscountStatus",
    "CommitmentDiscountType",
    "CommitmentDiscountUnit",
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
    "ServiceSubcategory",
    "SkuId",
    "SkuMeter",
    "SkuPriceDetails",
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

/// What a reader checks an export against: it counts and sums the rows and hashes every
/// byte of the file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Control {
    /// The billing period, `YYYY-MM`.
    pub period: String,
    /// `csv`, `json` or `focus`.
    pub format: String,
    /// Data rows (ledger rows), not counting the header.
    pub rows: u64,
    /// Sum of the rows' GPU time, in thousandths of a GPU times milliseconds (a decimal string:
    /// exact at any size).
    pub gpu_milli_ms: String,
    /// The same in GPU-hours.
    pub gpu_hours: String,
    /// Sum of the rows' list cost.
    pub list_cost: String,
    /// Sum of the rows' billed cost.
    pub billed_cost: String,
    /// ISO 4217 code of the costs.
    pub currency: String,
    /// SHA-256 of the whole file, lowercase hex.
    pub sha256: String,
}

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

    /// The control record of everything written.
    pub fn control(self) -> Control {
        let digest = self.hasher.finalize();
        let total = |sum: i128| i64::try_from(sum).unwrap_or(i64::MAX);
        Control {
            period: super::period_name(self.period),
            format: self.format.as_str().to_owned(),
            rows: self.rows,
            gpu_milli_ms: self.gpu_milli_ms.to_string(),
            gpu_hours: gpu_hours_decimal(total(self.gpu_milli_ms)),
            list_cost: micros_decimal(total(self.list_cost_micros)),
            billed_cost: micros_decimal(total(self.billed_cost_micros)),
            currency: self.currency,
            sha256: digest.iter().map(|b| format!("{b:02x}")).collect(),
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
    let reservation = r.kind == "reservation";
    // Pricing is per unit of the class: a whole GPU, or a slice of one (a MIG profile or a
    // time-slice share), so a slice's price and quantity are in slice-hours. Consumption is
    // always in physical GPU-hours (a slice counts as its fraction of the GPU).
    let whole = r.fraction_milli == 1000;
    let pricing_unit = if whole { "GPU-Hours" } else { "Slice-Hours" };
    let pricing_quantity = gpu_hours_decimal(i64::from(r.gpus) * r.duration_ms * 1000);
    let contracted_price =
        crate::metering::cost_micros(1, HOUR_MS, r.rate_micros_per_gpu_hour, r.price_multiplier_milli);
    let mut tags = serde_json::Map::new();
    if let Value::Object(labels) = &r.labels {
        tags.extend(labels.clone());
    }
    tags.insert("fairway/priority-class".into(), Value::String(r.priority_class.clone()));
    tags.insert("fairway/borrowing".into(), Value::String(r.borrowing.to_string()));
    let description = match (&r.job_name, r.attempt) {
        (Some(name), Some(attempt)) => format!("{} x {} for job {name} (attempt {attempt})", r.gpus, r.gpu_class),
        _ => format!("reserved quota of {} x {}", r.gpus, r.gpu_class),
    } + &r.reason.as_ref().map(|why| format!("; correction: {why}")).unwrap_or_default();
    let resource_id = match (r.job_id, r.attempt) {
        (Some(job), Some(attempt)) => format!("fairway:job/{job}/attempt/{attempt}"),
        _ => format!("fairway:quota/{}/{}", r.team_id, r.gpu_class),
    };
    let resource_name = r.job_name.clone().unwrap_or_else(|| format!("{} reserved {}", r.team_name, r.gpu_class));
    // A team's reserved quota is guaranteed capacity: its hourly charge is the reservation,
    // and usage inside it (not borrowing) consumes it.
    let (capacity_reservation, capacity_status) = if reservation {
        (format!("fairway:quota/{}/{}", r.team_id, r.gpu_class), "")
    } else if !r.borrowing {
        (format!("fairway:quota/{}/{}", r.team_id, r.gpu_class), "Used")
    } else {
        (String::new(), "")
    };
    let sku_meter = match (reservation, whole) {
        (true, _) => "Reserved GPU Time",
        (false, true) => "GPU Time",
        (false, false) => "GPU Slice Time",
    };
    let sku_price_details = json!({
        "GpuClass": r.gpu_class,
        "GpuFraction": format!("{}.{:03}", r.fraction_milli / 1000, r.fraction_milli % 1000),
    });
    let mut fields: std::collections::HashMap<&str, String> = [
        ("BilledCost", micros_decimal(r.billed_cost_micros)),
        ("BillingAccountId", "fairway".into()),
        ("BillingAccountName", "Fairway GPU platform".into()),
        ("BillingCurrency", r.currency.clone()),
        ("BillingPeriodEnd", ts(period_end)),
        ("BillingPeriodStart", ts(period_start)),
        ("CapacityReservationId", capacity_reservation),
        ("CapacityReservationStatus", capacity_status.into()),
        // A reservation is capacity bought by the hour whether used or not.
        ("ChargeCategory", if reservation { "Purchase".into() } else { "Usage".into() }),
        ("ChargeClass", if correction { "Correction".into() } else { String::new() }),
        ("ChargeDescription", text(&description)),
        ("ChargeFrequency", if reservation { "Recurring".into() } else { "Usage-Based".into() }),
        ("ChargePeriodEnd", ts(r.charge_end)),
        ("ChargePeriodStart", ts(r.charge_start)),
        // FOCUS: consumption is given for usage only.
        ("ConsumedQuantity", if reservation { String::new() } else { gpu_hours_decimal(r.gpu_milli_ms) }),
        ("ConsumedUnit", if reservation { String::new() } else { "GPU-Hours".into() }),
        ("ContractedCost", micros_decimal(r.billed_cost_micros)),
        ("ContractedUnitPrice", micros_decimal(contracted_price)),
        ("EffectiveCost", micros_decimal(r.billed_cost_micros)),
        ("InvoiceIssuerName", "Fairway".into()),
        ("ListCost", micros_decimal(r.list_cost_micros)),
        ("ListUnitPrice", micros_decimal(r.rate_micros_per_gpu_hour)),
        ("PricingCategory", "Standard".into()),
        ("PricingQuantity", pricing_quantity),
        ("PricingUnit", pricing_unit.into()),
        ("ProviderName", "Fairway".into()),
        ("PublisherName", "Fairway".into()),
        ("ResourceId", resource_id),
        ("ResourceName", text(&resource_name)),
        ("ResourceType", "GPU Job".into()),
        ("ServiceCategory", "AI and Machine Learning".into()),
        ("ServiceName", "Fairway GPU Jobs".into()),
        ("ServiceSubcategory", "Machine Learning".into()),
        ("SkuId", r.gpu_class.clone()),
        ("SkuMeter", sku_meter.into()),
        ("SkuPriceDetails", sku_price_details.to_string()),
        ("SkuPriceId", format!("{}:{}", r.gpu_class, r.rate_micros_per_gpu_hour)),
        ("SubAccountId", r.team_id.to_string()),
        ("SubAccountName", text(&r.team_name)),
        ("Tags", text(&Value::Object(tags).to_string())),
        ("x_GpuMilliMs", r.gpu_milli_ms.to_string()),
        ("x_Gpus", r.gpus.to_string()),
        ("x_GpuFractionMilli", r.fraction_milli.to_string()),
        ("x_LedgerId", r.id.to_string()),
        ("x_CorrectsLedgerId", r.corrects.map(|c| c.to_string()).unwrap_or_default()),
    ]
    .into_iter()
    .collect();
    // Columns not named above (availability zone, region, commitment discounts) are null.
    let row = FOCUS_COLUMNS.iter().map(|column| fields.remove(column).unwrap_or_default()).collect();
    debug_assert!(fields.is_empty(), "values for columns the header lacks: {:?}", fields.keys());
    row
}

/// User-supplied text made safe for spreadsheets: a leading `=`, `+`, `-`, `@`, tab or
/// carriage return would make a spreadsheet evaluate the cell as a formula (CSV injection),
/// so such text gets a leading apostrophe, as OWASP recommends. Text that already starts with
/// an apostrophe gets one too, so a reader takes the text back exactly by dropping one
/// leading apostrophe where there is one: `=x` and `'=x` stay two different names.
fn text(s: &str) -> String {
    match s.chars().next() {
        Some('=' | '+' | '-' | '@' | '\t' | '\r' | '\'') => format!("'{s}"),
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

/// The fields of one line as [`csv_line`] writes it (RFC 4180: quoted fields may hold
/// commas and doubled quotes): how a consumer, and the tests, read an export back.
pub fn csv_fields(line: &str) -> Vec<String> {
    let (mut fields, mut field, mut quoted) = (Vec::new(), String::new(), false);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            '"' => quoted = !quoted,
            ',' if !quoted => fields.push(std::mem::take(&mut field)),
            c => field.push(c),
        }
    }
    fields.push(field);
    fields
}

/// Rows read per page.
pub const PAGE: i64 = 5_000;

/// Writes the export of `period` to `sink` page by page, reading in one repeatable-read
/// transaction so the rows and the control record describe one state of the ledger; returns
/// the control record.
pub async fn write<F, Fut>(
    pool: &sqlx::PgPool,
    period: NaiveDate,
    format: Format,
    currency: &str,
    mut sink: F,
) -> Result<Control, ExportError>
where
    F: FnMut(Vec<u8>) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut tx = crate::db::read_snapshot(pool).await?;
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
    Ok(exporter.control())
}

/// The control record of the export of `period` as it would be written now, without keeping
/// its bytes. For a closed period it is the record of every download.
pub async fn control(
    pool: &sqlx::PgPool,
    period: NaiveDate,
    format: Format,
    currency: &str,
) -> Result<Control, ExportError> {
    write(pool, period, format, currency, |_| std::future::ready(true)).await
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
            // a short file that looks complete (and its control record would not match).
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

    fn export_with_control(format: Format, rows: &[ExportRow]) -> (String, Control) {
        let mut e = Exporter::new(format, NaiveDate::from_ymd_opt(2026, 11, 1).unwrap(), "USD");
        let mut bytes = e.header();
        bytes.extend(e.rows(rows));
        (String::from_utf8(bytes).unwrap(), e.control())
    }

    fn export(format: Format, rows: &[ExportRow]) -> String {
        export_with_control(format, rows).0
    }

    fn mig_row(id: i64) -> ExportRow {
        ExportRow { gpu_class: "a100-80gb.mig-3g.40gb".into(), fraction_milli: 428, ..row(id, "mig") }
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
        // Every data line has as many fields as the header.
        let fields = |line: &str| csv_fields(line).len();
        assert_eq!(fields(lines[1]), FOCUS_COLUMNS.len(), "{}", lines[1]);
        assert_eq!(fields(lines[2]), FOCUS_COLUMNS.len(), "{}", lines[2]);
        assert!(lines[1].contains("2026-11-01T00:00:00.000Z"), "{}", lines[1]);
        assert!(lines[1].contains(",GPU-Hours,"), "{}", lines[1]);
        // Data rows and nothing else: the control record travels beside the file.
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(lines[3], "");
    }

    /// The value of `column` in the first data row of a FOCUS export.
    fn focus_value(text: &str, column: &str) -> String {
        let at = FOCUS_COLUMNS.iter().position(|c| *c == column).unwrap();
        let line = text.split("\r\n").nth(1).unwrap();
        csv_fields(line).swap_remove(at)
    }

    #[test]
    fn a_mig_row_is_priced_in_slice_hours_and_consumes_its_fraction_of_gpu_hours() {
        let text = export(Format::Focus, &[mig_row(1)]);
        // Two 3g.40gb slices for half an hour: one slice-hour priced, 0.428 GPU-hours used.
        assert_eq!(focus_value(&text, "PricingUnit"), "Slice-Hours");
        assert_eq!(focus_value(&text, "PricingQuantity"), "1.000000000");
        assert_eq!(focus_value(&text, "ConsumedUnit"), "GPU-Hours");
        assert_eq!(focus_value(&text, "ConsumedQuantity"), "0.428000000");
        assert_eq!(focus_value(&text, "SkuMeter"), "GPU Slice Time");
        let details: Value = serde_json::from_str(&focus_value(&text, "SkuPriceDetails")).unwrap();
        assert_eq!(details, json!({"GpuClass": "a100-80gb.mig-3g.40gb", "GpuFraction": "0.428"}));
        let whole = ExportRow { fraction_milli: 1000, gpu_milli_ms: 2 * 1000 * 1_800_000, ..row(2, "whole") };
        let whole = export(Format::Focus, &[whole]);
        assert_eq!(focus_value(&whole, "PricingUnit"), "GPU-Hours");
        assert_eq!(focus_value(&whole, "PricingQuantity"), focus_value(&whole, "ConsumedQuantity"));
        assert_eq!(focus_value(&whole, "SkuMeter"), "GPU Time");
    }

    #[test]
    fn the_control_record_counts_the_rows_and_hashes_the_whole_file() {
        for format in [Format::Csv, Format::Json, Format::Focus] {
            let (text, control) = export_with_control(format, &[row(1, "a"), row(2, "b")]);
            assert_eq!(control.rows, 2);
            assert_eq!(control.billed_cost, "2.000000");
            assert_eq!(control.gpu_milli_ms, (2 * 2 * 428 * 1_800_000_i64).to_string());
            assert_eq!(control.format, format.as_str());
            let digest = Sha256::digest(text.as_bytes());
            let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(control.sha256, hex);
        }
    }

    #[test]
    fn user_text_cannot_become_a_spreadsheet_formula_or_break_a_csv_line() {
        let text = export(Format::Csv, &[row(1, "=HYPERLINK(\"http://x\")")]);
        let line = text.split("\r\n").nth(1).unwrap();
        assert!(line.contains("\"'=HYPERLINK(\"\"http://x\"\")\""), "{line}");
        assert!(line.contains("\"{\"\"project\"\":\"\"llama, v2\"\"}\""), "{line}");
        let quoted = export(Format::Csv, &[row(1, "'=x")]);
        assert!(quoted.split("\r\n").nth(1).unwrap().contains(",''=x,"), "{quoted}");
    }
}
