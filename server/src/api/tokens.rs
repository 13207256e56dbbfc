//! API tokens for CI pipelines, minted by team admins.

use axum::{extract::State, http::StatusCode, Extension, Json};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use super::{
    audit::record,
    error::ApiError,
    extract::{ApiJson, ListQuery, Page, PageParams, PageRequest},
};
use crate::{
    app::AppState,
    auth::{api_token, policy::TeamAccess, Principal},
    db::{self, tokens::TokenRow},
    domain::{DisplayText, FieldError, TeamRole},
};

/// Longest lifetime of an API token.
const MAX_TOKEN_DAYS: i64 = 366;

/// A token to mint.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewToken {
    /// What the token is for, e.g. `github-actions`.
    pub name: String,
    /// `member` (submit and cancel jobs) or `viewer` (read only). Tokens cannot be admins:
    /// a leaked token must not be able to mint more tokens or change membership.
    pub role: TeamRole,
    /// When the token stops working: in the future, at most a year away.
    pub expires_at: DateTime<Utc>,
}

/// A token, without its secret.
#[derive(Serialize, ToSchema)]
pub struct TokenView {
    pub id: Uuid,
    pub name: String,
    pub role: TeamRole,
    /// The first characters of the secret, to recognise it.
    pub prefix: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<DateTime<Utc>>,
}

impl From<TokenRow> for TokenView {
    fn from(r: TokenRow) -> Self {
        Self {
            id: r.id,
            name: r.name,
            role: TeamRole::parse(&r.role).unwrap_or(TeamRole::Viewer),
            prefix: r.display_prefix,
            created_by: r.created_by,
            created_at: r.created_at,
            expires_at: r.expires_at,
            last_used_at: r.last_used_at,
            revoked_at: r.revoked_at,
        }
    }
}

/// A freshly minted token: the only time its secret is shown.
#[derive(Serialize, ToSchema)]
pub struct MintedTokenView {
    #[serde(flatten)]
    pub token: TokenView,
    /// The secret. Store it now: it cannot be shown again.
    pub secret: String,
}

/// Mints an API token for the team.
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
) -> Result<(StatusCode, Json<MintedTokenView>), ApiError> {
    let minted = mint(&state, &principal, &access.team, &body).await?;
    Ok((StatusCode::CREATED, Json(minted)))
}

/// Mints a token for `team` on behalf of a signed-in user, with its audit record: the API and
/// the portal both call this.
pub async fn mint(
    state: &AppState,
    principal: &Principal,
    team: &db::teams::TeamRow,
    body: &NewToken,
) -> Result<MintedTokenView, ApiError> {
    let Principal::User { id: user_id, .. } = principal else {
        return Err(ApiError::Forbidden);
    };
    let name = DisplayText::parse("name", &body.name, 100)?;
    if name.as_str().is_empty() {
        return Err(FieldError::new("name", "empty", "must not be empty").into());
    }
    if body.role == TeamRole::Admin {
        return Err(FieldError::new("role", "invalid_value", "API tokens may be member or viewer, not admin").into());
    }
    let now = Utc::now();
    if body.expires_at <= now {
        return Err(FieldError::new("expires_at", "in_the_past", "must be in the future").into());
    }
    if body.expires_at > now + chrono::Duration::days(MAX_TOKEN_DAYS) {
        return Err(
            FieldError::new("expires_at", "too_far", format!("must be at most {MAX_TOKEN_DAYS} days away")).into()
        );
    }
    let minted = api_token::mint();
    let mut tx = state.db.begin().await?;
    let row = db::tokens::insert(
        &mut tx,
        &db::tokens::NewToken {
            team_id: team.id,
            name: name.as_str(),
            role: body.role.as_str(),
            token_hash: &minted.hash,
            display_prefix: &minted.display_prefix,
            created_by: *user_id,
            expires_at: body.expires_at,
        },
    )
    .await?;
    let object = format!("{}/{}", team.name, row.id);
    record(
        &mut tx,
        principal,
        "token.create",
        "api_token",
        &object,
        Some(team.id),
        None::<&()>,
        Some(&TokenView::from(row.clone())),
    )
    .await?;
    tx.commit().await?;
    Ok(MintedTokenView { token: TokenView::from(row), secret: minted.secret })
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
            a.parse::<Uuid>()
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
    let token_id: Uuid = token_id.parse().map_err(|_| ApiError::NotFound("token"))?;
    revoke(&state, &principal, &access.team, token_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Revokes a token of `team`, with its audit record; revoking twice changes nothing.
pub async fn revoke(
    state: &AppState,
    principal: &Principal,
    team: &db::teams::TeamRow,
    token_id: Uuid,
) -> Result<(), ApiError> {
    let mut tx = state.db.begin().await?;
    let before = db::tokens::get_for_update(&mut tx, team.id, token_id).await?.ok_or(ApiError::NotFound("token"))?;
    if before.revoked_at.is_none() {
        db::tokens::revoke(&mut tx, team.id, token_id).await?;
        let after = db::tokens::get_for_update(&mut tx, team.id, token_id).await?;
        let object = format!("{}/{}", team.name, token_id);
        record(
            &mut tx,
            principal,
            "token.revoke",
            "api_token",
            &object,
            Some(team.id),
            Some(&TokenView::from(before)),
            after.map(TokenView::from).as_ref(),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
