//! GPU classes: the catalogue of schedulable GPU capacity and its rate card.

use axum::{
    extract::{Path, State},
    http::{header, HeaderMap, StatusCode},
    Extension, Json,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::{
    audit::record,
    error::{ApiError, OnConstraint as _},
    extract::{etag, ApiJson, IfMatch, ListQuery, Page, PageParams, PageRequest},
};
use crate::{
    app::AppState,
    auth::Principal,
    db::{
        self,
        gpu_classes::{GpuClassRow, RateRow},
    },
    domain::{check_range, DisplayText, FieldError, GpuClassName, GpuKind},
};

/// Largest GPU memory accepted, in MiB (16 TiB: well beyond any device).
const MAX_MEMORY_MIB: i64 = 16 * 1024 * 1024;
/// Largest rate, in micro-units per GPU-hour (a million currency units).
const MAX_RATE_MICROS: i64 = 1_000_000_000_000;

/// A new GPU class.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewGpuClass {
    /// e.g. `h100-80gb` or `a100-80gb.mig-3g.40gb`.
    pub name: String,
    pub kind: GpuKind,
    /// GPU memory of one unit of this class, in MiB.
    pub memory_mib: i64,
    /// Share of one physical GPU in thousandths; must be 1000 for `whole`. Defaults to 1000.
    #[serde(default)]
    pub fraction_milli: Option<i64>,
    /// Price per GPU-hour in micro-units of the platform currency.
    pub rate_micros_per_gpu_hour: i64,
    /// When the first rate applies; defaults to now.
    #[serde(default)]
    pub rate_effective_from: Option<DateTime<Utc>>,
    #[serde(default)]
    pub description: Option<String>,
}

/// Changes to a GPU class. Its kind and fraction are fixed once created.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GpuClassPatch {
    pub memory_mib: Option<i64>,
    pub description: Option<String>,
}

/// A GPU class.
#[derive(Serialize, ToSchema)]
pub struct GpuClassView {
    pub id: Uuid,
    pub name: String,
    pub kind: GpuKind,
    pub memory_mib: i32,
    /// Share of one physical GPU in thousandths.
    pub fraction_milli: i32,
    pub description: String,
    /// The rate in effect now, in micro-units per GPU-hour; absent before the first rate starts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_micros_per_gpu_hour: Option<i64>,
    /// ISO 4217 currency of the rate.
    pub currency: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub version: i64,
}

fn view(row: GpuClassRow, currency: &str) -> GpuClassView {
    GpuClassView {
        id: row.id,
        name: row.name,
        kind: GpuKind::parse(&row.kind).unwrap_or(GpuKind::Whole),
        memory_mib: row.memory_mib,
        fraction_milli: row.fraction_milli,
        description: row.description,
        rate_micros_per_gpu_hour: row.rate_micros_per_gpu_hour,
        currency: currency.to_owned(),
        created_at: row.created_at,
        updated_at: row.updated_at,
        version: row.version,
    }
}

fn with_etag(row: GpuClassRow, currency: &str) -> (HeaderMap, Json<GpuClassView>) {
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag(row.version));
    (headers, Json(view(row, currency)))
}

/// The class named in a path, or 404.
pub async fn find(state: &AppState, name: &str) -> Result<GpuClassRow, ApiError> {
    db::gpu_classes::by_name(&state.db, name).await?.ok_or(ApiError::NotFound("GPU class"))
}

/// Adds a GPU class with its first rate.
#[utoipa::path(
    post, path = "/api/v1/gpu-classes", tag = "gpu-classes", operation_id = "create_gpu_class",
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    request_body = NewGpuClass,
    responses((status = 201, body = GpuClassView), (status = 409, body = super::error::Problem), (status = 422, body = super::error::Problem))
)]
pub async fn create_gpu_class(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    ApiJson(body): ApiJson<NewGpuClass>,
) -> Result<(StatusCode, HeaderMap, Json<GpuClassView>), ApiError> {
    let name = GpuClassName::parse("name", &body.name)?;
    check_range("memory_mib", body.memory_mib, 1, MAX_MEMORY_MIB)?;
    let fraction = body.fraction_milli.unwrap_or(1000);
    check_range("fraction_milli", fraction, 1, 1000)?;
    if body.kind == GpuKind::Whole && fraction != 1000 {
        return Err(
            FieldError::new("fraction_milli", "invalid_value", "a whole GPU class has fraction_milli 1000").into()
        );
    }
    if body.kind != GpuKind::Whole && fraction == 1000 {
        return Err(FieldError::new(
            "fraction_milli",
            "invalid_value",
            "a MIG or time-sliced class is a fraction of a GPU: below 1000",
        )
        .into());
    }
    check_range("rate_micros_per_gpu_hour", body.rate_micros_per_gpu_hour, 0, MAX_RATE_MICROS)?;
    let description = DisplayText::parse("description", body.description.as_deref().unwrap_or(""), 1000)?;
    let mut tx = state.db.begin().await?;
    let id = db::gpu_classes::insert(
        &mut tx,
        name.as_str(),
        body.kind.as_str(),
        body.memory_mib as i32,
        fraction as i32,
        description.as_str(),
    )
    .await
    .on_constraint("gpu_classes_name_key", || {
        ApiError::conflict("gpu_class_exists", Some("name"), format!("GPU class {name} already exists"))
    })?;
    db::gpu_classes::add_rate(&mut tx, id, body.rate_effective_from, body.rate_micros_per_gpu_hour).await?;
    let row = db::gpu_classes::by_name(&mut *tx, name.as_str()).await?.ok_or(ApiError::NotFound("GPU class"))?;
    record(
        &mut tx,
        &principal,
        "gpu_class.create",
        "gpu_class",
        name.as_str(),
        None,
        None::<&()>,
        Some(&view(row.clone(), &state.config.currency)),
    )
    .await?;
    tx.commit().await?;
    let (headers, json) = with_etag(row, &state.config.currency);
    Ok((StatusCode::CREATED, headers, json))
}

/// Lists GPU classes.
#[utoipa::path(
    get, path = "/api/v1/gpu-classes", tag = "gpu-classes", operation_id = "list_gpu_classes",
    params(PageParams),
    responses((status = 200, body = Page<GpuClassView>))
)]
pub async fn list_gpu_classes(
    State(state): State<AppState>,
    ListQuery(params): ListQuery<PageParams>,
) -> Result<Json<Page<GpuClassView>>, ApiError> {
    let page = PageRequest::parse(params)?;
    let rows = db::gpu_classes::list(&state.db, page.after.as_deref(), page.fetch()).await?;
    let currency = state.config.currency.clone();
    Ok(Json(page.page(rows, |c| c.name.clone(), |r| view(r, &currency))))
}

/// Reads a GPU class.
#[utoipa::path(
    get, path = "/api/v1/gpu-classes/{gpu_class}", tag = "gpu-classes", operation_id = "get_gpu_class",
    params(("gpu_class" = String, Path, description = "GPU class name")),
    responses((status = 200, body = GpuClassView), (status = 404, body = super::error::Problem))
)]
pub async fn get_gpu_class(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<(HeaderMap, Json<GpuClassView>), ApiError> {
    Ok(with_etag(find(&state, &name).await?, &state.config.currency))
}

/// Changes a GPU class's memory or description. Honours `If-Match`.
#[utoipa::path(
    patch, path = "/api/v1/gpu-classes/{gpu_class}", tag = "gpu-classes", operation_id = "update_gpu_class",
    params(("gpu_class" = String, Path, description = "GPU class name"),
           ("If-Match" = Option<String>, Header, description = "ETag from a previous read")),
    request_body = GpuClassPatch,
    responses((status = 200, body = GpuClassView), (status = 412, body = super::error::Problem))
)]
pub async fn update_gpu_class(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    if_match: IfMatch,
    ApiJson(body): ApiJson<GpuClassPatch>,
) -> Result<(HeaderMap, Json<GpuClassView>), ApiError> {
    let before = find(&state, &name).await?;
    let memory = body.memory_mib.unwrap_or(i64::from(before.memory_mib));
    check_range("memory_mib", memory, 1, MAX_MEMORY_MIB)?;
    let description =
        DisplayText::parse("description", body.description.as_deref().unwrap_or(&before.description), 1000)?;
    let mut tx = state.db.begin().await?;
    let version = db::gpu_classes::lock(&mut tx, before.id).await?.ok_or(ApiError::NotFound("GPU class"))?;
    if_match.check(version)?;
    db::gpu_classes::update(&mut tx, before.id, memory as i32, description.as_str()).await?;
    let after = db::gpu_classes::by_name(&mut *tx, &name).await?.ok_or(ApiError::NotFound("GPU class"))?;
    let currency = &state.config.currency;
    record(
        &mut tx,
        &principal,
        "gpu_class.update",
        "gpu_class",
        &name,
        None,
        Some(&view(before, currency)),
        Some(&view(after.clone(), currency)),
    )
    .await?;
    tx.commit().await?;
    Ok(with_etag(after, currency))
}

/// A rate of a GPU class from a point in time on.
#[derive(Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rate {
    /// When the rate starts to apply. Past periods keep the prices they had.
    pub effective_from: DateTime<Utc>,
    /// Price per GPU-hour in micro-units of the platform currency.
    pub rate_micros_per_gpu_hour: i64,
}

impl From<RateRow> for Rate {
    fn from(r: RateRow) -> Self {
        Self { effective_from: r.effective_from, rate_micros_per_gpu_hour: r.rate_micros_per_gpu_hour }
    }
}

/// The rate history of a GPU class, oldest first.
#[utoipa::path(
    get, path = "/api/v1/gpu-classes/{gpu_class}/rates", tag = "gpu-classes", operation_id = "list_gpu_class_rates",
    params(("gpu_class" = String, Path, description = "GPU class name")),
    responses((status = 200, body = Vec<Rate>))
)]
pub async fn list_gpu_class_rates(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<Vec<Rate>>, ApiError> {
    let class = find(&state, &name).await?;
    let rows = db::gpu_classes::rates(&state.db, class.id).await?;
    Ok(Json(rows.into_iter().map(Rate::from).collect()))
}

/// Adds a rate from a future point in time (or from now). Rates already in effect are
/// never changed, so past periods keep their prices.
#[utoipa::path(
    post, path = "/api/v1/gpu-classes/{gpu_class}/rates", tag = "gpu-classes", operation_id = "create_gpu_class_rate",
    params(("gpu_class" = String, Path, description = "GPU class name"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    request_body = Rate,
    responses((status = 201, body = Rate), (status = 409, body = super::error::Problem), (status = 422, body = super::error::Problem))
)]
pub async fn create_gpu_class_rate(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<Rate>,
) -> Result<(StatusCode, Json<Rate>), ApiError> {
    Ok((StatusCode::CREATED, Json(add_rate(&state, &principal, &name, &body).await?)))
}

/// Adds a rate to the class `name`'s rate card, audited; the API and the portal call this.
pub async fn add_rate(state: &AppState, principal: &Principal, name: &str, body: &Rate) -> Result<Rate, ApiError> {
    let class = find(state, name).await?;
    check_range("rate_micros_per_gpu_hour", body.rate_micros_per_gpu_hour, 0, MAX_RATE_MICROS)?;
    // A minute of slack for clock skew between client and server.
    if body.effective_from < Utc::now() - chrono::Duration::minutes(1) {
        return Err(FieldError::new("effective_from", "in_the_past", "rates cannot be changed retroactively").into());
    }
    let mut tx = state.db.begin().await?;
    let row = db::gpu_classes::add_rate(&mut tx, class.id, Some(body.effective_from), body.rate_micros_per_gpu_hour)
        .await
        .on_constraint("gpu_class_rates_pkey", || {
            ApiError::conflict("rate_exists", Some("effective_from"), "a rate already starts at this instant")
        })?;
    let rate = Rate::from(row);
    record(
        &mut tx,
        principal,
        "gpu_class.rate.create",
        "gpu_class_rate",
        &format!("{name}@{}", rate.effective_from.to_rfc3339()),
        None,
        None::<&()>,
        Some(&rate),
    )
    .await?;
    tx.commit().await?;
    Ok(rate)
}
