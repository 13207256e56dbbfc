//! A team's job templates, and submitting a job from one.

use axum::{
    extract::{Path, State},
    http::{header, HeaderMap, StatusCode},
    Extension, Json,
};
use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::{
    error::ApiError,
    extract::{etag, ApiJson, ListQuery, Page, PageParams, PageRequest},
    jobs::{with_etag, JobView},
};
use crate::{
    auth::{policy::TeamAccess, CatalogueVersion, Principal},
    db,
    ops::{
        jobs::JobSpec,
        templates::{self, TemplateView},
        Precondition,
    },
    state::AppState,
};

/// Lists the team's job templates in name order.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/job-templates", tag = "job-templates", operation_id = "list_job_templates",
    params(("team" = String, Path, description = "Team name"), PageParams),
    responses((status = 200, body = Page<TemplateView>))
)]
pub async fn list_job_templates(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    ListQuery(params): ListQuery<PageParams>,
) -> Result<Json<Page<TemplateView>>, ApiError> {
    let page = PageRequest::parse(params)?;
    let rows = db::templates::list(&state.db, access.team.id, page.after.as_deref(), page.fetch()).await?;
    Ok(Json(page.page(rows, |t| t.name.clone(), TemplateView::from)))
}

/// A job template, with its version as the `ETag`.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/job-templates/{template}", tag = "job-templates",
    operation_id = "get_job_template",
    params(("team" = String, Path, description = "Team name"), ("template" = String, Path, description = "Template name")),
    responses((status = 200, body = TemplateView), (status = 404, body = super::error::Problem))
)]
pub async fn get_job_template(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
) -> Result<(HeaderMap, Json<TemplateView>), ApiError> {
    let (_, name) = path;
    let row = templates::get(&state, &access.team, &name).await?;
    Ok(tagged(TemplateView::from(row)))
}

/// Saves a job request as a template of the team, by name: created (201), or replacing the
/// template of that name (200; send `If-Match` to replace only the version you read). The
/// request is checked as a submission of it would be (catalogue, limits, quotas); budgets
/// are checked when a job is submitted from it.
#[utoipa::path(
    put, path = "/api/v1/teams/{team}/job-templates/{template}", tag = "job-templates",
    operation_id = "put_job_template",
    params(("team" = String, Path, description = "Team name"),
           ("template" = String, Path, description = "Template name: lowercase letters, digits, '-', '_' and '.', at most 63"),
           ("If-Match" = Option<String>, Header, description = "ETag from a previous read; `\"0\"`: only if none exists")),
    request_body = JobSpec,
    responses((status = 200, body = TemplateView), (status = 201, body = TemplateView),
              (status = 412, body = super::error::Problem), (status = 422, body = super::error::Problem))
)]
pub async fn put_job_template(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Extension(version): Extension<CatalogueVersion>,
    Path(path): Path<(String, String)>,
    if_match: Precondition,
    ApiJson(spec): ApiJson<JobSpec>,
) -> Result<(StatusCode, HeaderMap, Json<TemplateView>), ApiError> {
    let (_, name) = path;
    let (view, created) = templates::save(&state, &principal, &access.team, &name, &if_match, &spec, version).await?;
    let (headers, body) = tagged(view);
    Ok((if created { StatusCode::CREATED } else { StatusCode::OK }, headers, body))
}

/// Deletes a job template; jobs submitted from it are not touched.
#[utoipa::path(
    delete, path = "/api/v1/teams/{team}/job-templates/{template}", tag = "job-templates",
    operation_id = "delete_job_template",
    params(("team" = String, Path, description = "Team name"), ("template" = String, Path, description = "Template name"),
           ("If-Match" = Option<String>, Header, description = "ETag from a previous read")),
    responses((status = 204), (status = 404, body = super::error::Problem), (status = 412, body = super::error::Problem))
)]
pub async fn delete_job_template(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Path(path): Path<(String, String)>,
    if_match: Precondition,
) -> Result<StatusCode, ApiError> {
    let (_, name) = path;
    templates::delete(&state, &principal, &access.team, &name, &if_match).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// What changes from the template: any of the job's fields (`env` and `labels` add to the
/// template's); `{}` submits it as saved. Checked as the job it makes, field by field.
#[derive(Deserialize)]
pub struct Overrides(Map<String, Value>);

impl utoipa::PartialSchema for Overrides {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .description(Some(
                "Any of the job's fields (see JobSpec) to change from the template; `env` and `labels` add to the \
                 template's. `{}` submits it as saved.",
            ))
            .additional_properties(Some(utoipa::openapi::schema::AdditionalProperties::FreeForm(true)))
            .into()
    }
}

impl ToSchema for Overrides {}

/// Submits a job from a template: its fields, with the body's over them. The job carries the
/// label `fairway.dev/template` with the template's name, and is checked as any submission.
/// Send an `Idempotency-Key` so a retried request cannot submit twice.
#[utoipa::path(
    post, path = "/api/v1/teams/{team}/job-templates/{template}/jobs", tag = "job-templates",
    operation_id = "create_job_from_template",
    params(("team" = String, Path, description = "Team name"), ("template" = String, Path, description = "Template name"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    request_body = Overrides,
    responses((status = 201, body = JobView), (status = 404, body = super::error::Problem),
              (status = 422, body = super::error::Problem))
)]
pub async fn create_job_from_template(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    Extension(version): Extension<CatalogueVersion>,
    check: Option<Extension<db::jobs::WriteCheck>>,
    Path(path): Path<(String, String)>,
    ApiJson(Overrides(overrides)): ApiJson<Overrides>,
) -> Result<(StatusCode, HeaderMap, Json<JobView>), ApiError> {
    let (_, name) = path;
    let check = check.map(|Extension(c)| c);
    let submitted =
        templates::submit(&state, &access.team, &principal.actor(), &name, overrides, version, check).await?;
    let (headers, body) = with_etag(JobView { warnings: submitted.warnings, ..submitted.job.into() });
    Ok((StatusCode::CREATED, headers, body))
}

fn tagged(view: TemplateView) -> (HeaderMap, Json<TemplateView>) {
    let mut headers = HeaderMap::new();
    headers.insert(header::ETAG, etag(view.version));
    (headers, Json(view))
}
