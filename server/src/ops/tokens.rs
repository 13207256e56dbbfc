//! API tokens for CI pipelines, minted by team admins.

use crate::domain::TokenId;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{audit::record, Error, Result};
use crate::{
    auth::{api_token, Principal},
    db::{self, tokens::TokenRow},
    domain::{DisplayText, FieldError, TeamRole},
    state::AppState,
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
    pub id: TokenId,
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
    /// The secret. Store it now: it cannot be shown again. `null` in an idempotent replay,
    /// since secrets are never stored.
    #[schema(nullable)]
    pub secret: String,
}

/// Mints a token for `team` on behalf of a signed-in user, with its audit record: the API and
/// the portal both call this.
pub async fn mint(
    state: &AppState,
    principal: &Principal,
    team: &db::teams::TeamRow,
    body: &NewToken,
) -> Result<MintedTokenView> {
    let Principal::User { id: user_id, .. } = principal else {
        return Err(Error::Forbidden);
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
            created_by: Some(*user_id),
            expires_at: body.expires_at,
            ci_trust_id: None,
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

/// Revokes a token of `team`, with its audit record; revoking twice changes nothing.
pub async fn revoke(
    state: &AppState,
    principal: &Principal,
    team: &db::teams::TeamRow,
    token_id: TokenId,
) -> Result<()> {
    let mut tx = state.db.begin().await?;
    let before = db::tokens::get_for_update(&mut tx, team.id, token_id).await?.ok_or(Error::NotFound("token"))?;
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
