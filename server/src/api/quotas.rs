//! Quotas per team per GPU class: `reserved` (guaranteed), `burst` (how many more the team
//! may borrow) and `lendable` (how much of `reserved` others may borrow while idle).

use axum::{
    extract::{Path, State},
    http::{header, HeaderMap, StatusCode},
    Extension, Json,
};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{
    audit::record,
    error::ApiError,
    extract::{etag, ApiJson, IfMatch},
    gpu_classes,
};
use crate::{
    app::AppState,
    auth::{policy::TeamAccess, Principal},
    db::{self, quotas::QuotaRow},
    domain::{check_range, FieldError, MAX_GPUS},
};

/// A quota to set.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaSpec {
    /// GPUs of the class the team is guaranteed.
    pub reserved: i64,
    /// GPUs beyond `reserved` the team may borrow from idle capacity.
    pub burst: i64,
    /// GPUs of `reserved` others may borrow while idle; absent means all of them.
    #[serde(default)]
    pub lendable: Option<i64>,
}

/// A team's quota for one GPU class.
#[derive(Serialize, ToSchema)]
pub struct QuotaView {
    pub gpu_class: String,
    pub reserved: i32,
    pub burst: i32,
    /// GPUs of `reserved` others may borrow while idle.
    pub lendable: i32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub version: i64,
}

impl From<QuotaRow> for QuotaView {
    fn from(r: QuotaRow) -> Self {
        Self {
            gpu_class: r.gpu_class,
            reserved: r.reserved,
            burst: r.burst,
            lendable: r.lendable.unwrap_or(r.reserved),
            created_at: r.created_at,
            updated_at: r.updated_at,
            version: r.version,
        }
    }
}

/// A quota as set, with warnings that did not stop it.
#[derive(Serialize, ToSchema)]
pub struct QuotaResult {
    #[serde(flatten)]
    pub quota: QuotaView,
    /// Things worth knowing, e.g. that reserved quota exceeds known capacity.
    pub warnings: Vec<String>,
}

/// Lists a team's quotas.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/quotas", tag = "quotas", operation_id = "list_quotas",
    params(("team" = String, Path, description = "Team name")),
    responses((status = 200, body = Vec<QuotaView>))
)]
pub async fn list_quotas(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
) -> Result<Json<Vec<QuotaView>>, ApiError> {
    let rows = db::quotas::list(&state.db, access.team.id).await?;
    Ok(Json(rows.into_iter().map(QuotaView::from).collect()))
}

/// Reads a team's quota for one GPU class.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/quotas/{gpu_class}", tag = "quotas", operation_id = "get_quota",
    params(("team" = String, Path, description = "Team name"), ("gpu_class" = String, Path, description = "GPU class name")),
    responses((status = 200, body = QuotaView), (status = 404, body = super::error::Problem))
)]
pub async fn get_quota(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
) -> Result<(HeaderMap, Json<QuotaView>), ApiError> {
    let (_, class) = path;
    let class = gpu_classes::find(&state, &class).await?;
    let row = db::quotas::get(&state.db, access.team.id, class.id).await?.ok_or(ApiError::NotFound("quota"))?;
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag(row.version));
    Ok((headers, Json(QuotaView::from(row))))
}

/// Sets a team's quota for one GPU class. Children's reserved quota never exceeds their
/// parent's; reserving more than the platform's known capacity is allowed with a warning.
/// Honours `If-Match`.
#[utoipa::path(
    put, path = "/api/v1/teams/{team}/quotas/{gpu_class}", tag = "quotas", operation_id = "put_quota",
    params(("team" = String, Path, description = "Team name"), ("gpu_class" = String, Path, description = "GPU class name"),
           ("If-Match" = Option<String>, Header, description = "ETag from a previous read")),
    request_body = QuotaSpec,
    responses((status = 200, body = QuotaResult), (status = 412, body = super::error::Problem), (status = 422, body = super::error::Problem))
)]
pub async fn put_quota(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
    if_match: IfMatch,
    ApiJson(spec): ApiJson<QuotaSpec>,
) -> Result<(HeaderMap, Json<QuotaResult>), ApiError> {
    let (_, class_name) = path;
    let result = set(&state, &principal, access.team, &class_name, &spec, &if_match).await?;
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag(result.quota.version));
    Ok((headers, Json(result)))
}

/// Sets `team`'s quota for `class_name`, with its audit record: the API and the portal both
/// call this. Children's reserved quota never exceeds their parent's; reserving more than
/// the platform's known capacity is allowed and answered with a warning.
pub async fn set(
    state: &AppState,
    principal: &Principal,
    team: crate::db::teams::TeamRow,
    class_name: &str,
    spec: &QuotaSpec,
    if_match: &IfMatch,
) -> Result<QuotaResult, ApiError> {
    check_range("reserved", spec.reserved, 0, MAX_GPUS)?;
    check_range("burst", spec.burst, 0, MAX_GPUS)?;
    if let Some(lendable) = spec.lendable {
        check_range("lendable", lendable, 0, spec.reserved)
            .map_err(|e| FieldError::new("lendable", &e.code, format!("{} (it is part of reserved)", e.message)))?;
    }
    let class = gpu_classes::find(state, class_name).await.map_err(|_| {
        ApiError::field(FieldError::new("gpu_class", "not_found", format!("GPU class {class_name} does not exist")))
    })?;
    // Ranges are checked above, so the values fit in i32.
    let (reserved, burst, lendable) = (spec.reserved as i32, spec.burst as i32, spec.lendable.map(|l| l as i32));

    let mut tx = state.db.begin().await?;
    let ctx = db::quotas::context_for_update(&mut tx, team.id, team.parent_id, class.id).await?;
    if let Some(current) = &ctx.current {
        if_match.check(current.version)?;
    } else {
        if_match.check(0)?;
    }
    if let Some(parent) = &team.parent {
        let parent_reserved = i64::from(ctx.parent_reserved.unwrap_or(0));
        if ctx.siblings_reserved + i64::from(reserved) > parent_reserved {
            return Err(FieldError::new(
                "reserved",
                "exceeds_parent",
                format!(
                    "the children of {parent} would reserve {} {class_name} GPUs but {parent} reserves only {parent_reserved}",
                    ctx.siblings_reserved + i64::from(reserved)
                ),
            )
            .into());
        }
    }
    if ctx.children_reserved > i64::from(reserved) {
        return Err(FieldError::new(
            "reserved",
            "below_children",
            format!("the child teams of {} already reserve {} {class_name} GPUs", team.name, ctx.children_reserved),
        )
        .into());
    }
    let mut warnings = Vec::new();
    if team.parent.is_none() {
        if let Some(capacity) = db::clusters::known_capacity(&mut tx, class.id).await? {
            let total = ctx.other_roots_reserved + i64::from(reserved);
            if total > capacity {
                warnings.push(format!(
                    "teams reserve {total} {class_name} GPUs in total but the platform knows of only {capacity}"
                ));
            }
        }
    }
    let row = db::quotas::upsert(&mut tx, team.id, class.id, reserved, burst, lendable).await?;
    let object = format!("{}/{}", team.name, class_name);
    record(
        &mut tx,
        principal,
        "quota.put",
        "quota",
        &object,
        Some(team.id),
        ctx.current.map(QuotaView::from).as_ref(),
        Some(&QuotaView::from(row.clone())),
    )
    .await?;
    tx.commit().await?;
    Ok(QuotaResult { quota: QuotaView::from(row), warnings })
}

/// Removes a team's quota for one GPU class; refused while child teams reserve some.
#[utoipa::path(
    delete, path = "/api/v1/teams/{team}/quotas/{gpu_class}", tag = "quotas", operation_id = "delete_quota",
    params(("team" = String, Path, description = "Team name"), ("gpu_class" = String, Path, description = "GPU class name")),
    responses((status = 204), (status = 404, body = super::error::Problem), (status = 409, body = super::error::Problem))
)]
pub async fn delete_quota(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
    if_match: IfMatch,
) -> Result<StatusCode, ApiError> {
    let (_, class_name) = path;
    let class = gpu_classes::find(&state, &class_name).await?;
    let team = access.team;
    let mut tx = state.db.begin().await?;
    let ctx = db::quotas::context_for_update(&mut tx, team.id, team.parent_id, class.id).await?;
    let current = ctx.current.ok_or(ApiError::NotFound("quota"))?;
    if_match.check(current.version)?;
    if ctx.children_reserved > 0 {
        return Err(ApiError::conflict(
            "children_reserve_quota",
            None,
            format!("the child teams of {} reserve {class_name} GPUs", team.name),
        ));
    }
    db::quotas::delete(&mut tx, team.id, class.id).await?;
    let object = format!("{}/{}", team.name, class_name);
    record(
        &mut tx,
        &principal,
        "quota.delete",
        "quota",
        &object,
        Some(team.id),
        Some(&QuotaView::from(current)),
        None::<&()>,
    )
    .await?;
    tx.commit().await?;
    Ok(StatusCode::NO_CONTENT)
}
