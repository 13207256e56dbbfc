//! Team webhooks and their delivery logs.

use axum::{extract::State, http::StatusCode, Extension, Json};

use super::{
    error::ApiError,
    extract::{ApiJson, ListQuery, Page, PageParams, PageRequest},
};
use crate::{
    auth::{policy::TeamAccess, Principal},
    db,
    domain::{FieldError, WebhookId},
    http::idempotency::WithheldOnReplay,
    ops::webhooks::{self, CreatedWebhookView, DeliveryView, NewWebhook, WebhookView},
    state::AppState,
};

/// Creates a webhook: the team's chosen events are POSTed to `url`, signed with the Standard
/// Webhooks scheme (`webhook-id`, `webhook-timestamp`, `webhook-signature`). The answer is the
/// only place the signing secret appears: an idempotent replay answers with `secret: null`.
#[utoipa::path(
    post, path = "/api/v1/teams/{team}/webhooks", tag = "webhooks", operation_id = "create_webhook",
    params(("team" = String, Path, description = "Team name"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    request_body = NewWebhook,
    responses((status = 201, body = CreatedWebhookView), (status = 422, body = super::error::Problem))
)]
pub async fn create_webhook(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    ApiJson(body): ApiJson<NewWebhook>,
) -> Result<(StatusCode, Extension<WithheldOnReplay>, Json<CreatedWebhookView>), ApiError> {
    let created = webhooks::create(&state, &principal, &access.team, &body).await?;
    Ok((StatusCode::CREATED, Extension(WithheldOnReplay(&["secret"])), Json(created)))
}

/// Lists the team's webhooks, without their secrets; callers other than team admins see only
/// the origin of each URL, since a URL may carry a credential.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/webhooks", tag = "webhooks", operation_id = "list_webhooks",
    params(("team" = String, Path, description = "Team name"), PageParams),
    responses((status = 200, body = Page<WebhookView>))
)]
pub async fn list_webhooks(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    ListQuery(params): ListQuery<PageParams>,
) -> Result<Json<Page<WebhookView>>, ApiError> {
    let page = PageRequest::parse(params)?;
    let after = match &page.after {
        Some(a) => Some(a.parse::<WebhookId>().map_err(|_| bad_cursor())?),
        None => None,
    };
    let rows = db::webhooks::list(&state.db, access.team.id, after, page.fetch()).await?;
    Ok(Json(page.page(rows, |w| w.id.to_string(), |w| WebhookView::for_role(w, access.role))))
}

/// Deletes a webhook with its delivery log; what it had pending is not sent.
#[utoipa::path(
    delete, path = "/api/v1/teams/{team}/webhooks/{webhook}", tag = "webhooks", operation_id = "delete_webhook",
    params(("team" = String, Path, description = "Team name"), ("webhook" = Uuid, Path, description = "Webhook id")),
    responses((status = 204), (status = 404, body = super::error::Problem))
)]
pub async fn delete_webhook(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    axum::extract::Path(path): axum::extract::Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let (_, webhook) = path;
    let webhook: WebhookId = webhook.parse().map_err(|_| ApiError::NotFound("webhook"))?;
    webhooks::delete(&state, &principal, &access.team, webhook).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A webhook's delivery log, newest first: each message with its state, attempts and the
/// latest attempt's answer.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/webhooks/{webhook}/deliveries", tag = "webhooks",
    operation_id = "list_webhook_deliveries",
    params(("team" = String, Path, description = "Team name"), ("webhook" = Uuid, Path, description = "Webhook id"),
           PageParams),
    responses((status = 200, body = Page<DeliveryView>), (status = 404, body = super::error::Problem))
)]
pub async fn list_webhook_deliveries(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    axum::extract::Path(path): axum::extract::Path<(String, String)>,
    ListQuery(params): ListQuery<PageParams>,
) -> Result<Json<Page<DeliveryView>>, ApiError> {
    let (_, webhook) = path;
    let webhook: WebhookId = webhook.parse().map_err(|_| ApiError::NotFound("webhook"))?;
    let page = PageRequest::parse(params)?;
    let before = match &page.after {
        Some(a) => Some(a.parse::<i64>().map_err(|_| bad_cursor())?),
        None => None,
    };
    if db::webhooks::get(&state.db, access.team.id, webhook).await?.is_none() {
        return Err(ApiError::NotFound("webhook"));
    }
    let rows = db::webhooks::deliveries(&state.db, access.team.id, webhook, before, page.fetch()).await?;
    Ok(Json(page.page(rows, |d| d.id.to_string(), DeliveryView::from)))
}

fn bad_cursor() -> ApiError {
    ApiError::field(FieldError::new("cursor", "invalid_value", "is not a cursor this API issued"))
}
