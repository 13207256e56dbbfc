//! API tokens for CI pipelines, minted by team admins.

use crate::domain::TokenId;
use axum::{extract::State, http::StatusCode, Extension, Json};

use super::{
    error::ApiError,
    extract::{ApiJson, ListQuery, Page, PageParams, PageRequest},
};
use crate::{
    auth::{policy::TeamAccess, Principal},
    db::{self},
    domain::FieldError,
    http::idempotency::WithheldOnReplay,
    ops::tokens::{self, MintedTokenView, NewToken, TokenView},
    state::AppState,
};

/// Mints an API token for the team. The answer is the only place its secret ever appears:
/// an idempotent replay (same `Idempotency-Key`) answers with `secret: null`; if the first
/// answer was lost, revoke that token and mint another.
#[utoipa::path(
    post, path = "/api/v1/teams/{team}/tokens", tag = "tokens", operation_id = "create_token",
    params(("team" = String, Path, description = "Team name"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    request_body = NewToken,
    responses((status = 201, body = MintedTokenView), (status = 422, body = super::error::Problem))
)]
pub async fn create_token(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    ApiJson(body): ApiJson<NewToken>,
) -> Result<(StatusCode, Extension<WithheldOnReplay>, Json<MintedTokenView>), ApiError> {
    let minted = tokens::mint(&state, &principal, &access.team, &body).await?;
    Ok((StatusCode::CREATED, Extension(WithheldOnReplay(&["secret"])), Json(minted)))
}

/// Lists the team's tokens, revoked and expired ones included.
#[utoipa::path(
    get, path = "/api/v1/teams/{team}/tokens", tag = "tokens", operation_id = "list_tokens",
    params(("team" = String, Path, description = "Team name"), PageParams),
    responses((status = 200, body = Page<TokenView>))
)]
pub async fn list_tokens(
    State(state): State<AppState>,
    Extension(access): Extension<TeamAccess>,
    ListQuery(params): ListQuery<PageParams>,
) -> Result<Json<Page<TokenView>>, ApiError> {
    let page = PageRequest::parse(params)?;
    let after = match &page.after {
        Some(a) => Some(
            a.parse::<TokenId>()
                .map_err(|_| FieldError::new("cursor", "invalid_value", "is not a cursor this API issued"))?,
        ),
        None => None,
    };
    let rows = db::tokens::list(&state.db, access.team.id, after, page.fetch()).await?;
    Ok(Json(page.page(rows, |t| t.id.to_string(), TokenView::from)))
}

/// Revokes a token: it fails on the very next request.
#[utoipa::path(
    delete, path = "/api/v1/teams/{team}/tokens/{token_id}", tag = "tokens", operation_id = "revoke_token",
    params(("team" = String, Path, description = "Team name"), ("token_id" = Uuid, Path, description = "Token id")),
    responses((status = 204), (status = 404, body = super::error::Problem))
)]
pub async fn revoke_token(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<TeamAccess>,
    axum::extract::Path(path): axum::extract::Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let (_, token_id) = path;
    let token_id: TokenId = token_id.parse().map_err(|_| ApiError::NotFound("token"))?;
    tokens::revoke(&state, &principal, &access.team, token_id).await?;
    Ok(StatusCode::NO_CONTENT)
}
