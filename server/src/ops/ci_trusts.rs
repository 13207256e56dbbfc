//! A team's CI trust policies: which CI issuer's ID tokens, for which audience and with which
//! claims, the team exchanges for its own short-lived API tokens (see [`super::token_exchange`]).
//! Team admins create and delete them; anyone who can see the team may read them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{audit::record, Error, OnConstraint as _, Result};
use crate::{
    auth::Principal,
    db::{self, ci_trusts::CiTrustRow, teams::TeamRow},
    domain::{check_range, ci_trust::Conditions, CiTrustId, CiTrustName, FieldError, TeamRole},
    state::AppState,
};

/// The audience a policy expects when it names none: what the `fairway` client asks its CI
/// system for by default.
pub const DEFAULT_AUDIENCE: &str = "fairway";
/// How long an exchanged token lives when the policy says nothing: 15 minutes.
pub const DEFAULT_TOKEN_TTL_SECONDS: i64 = 900;
/// The shortest and longest lives a policy may give its tokens.
pub const TOKEN_TTL_SECONDS: (i64, i64) = (60, 3600);

/// A trust policy to create.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewCiTrust {
    /// The policy's name in the team: lowercase letters, digits, '-', '_' and '.', at most 63.
    /// Tokens exchanged under it are named `ci:<name>`.
    pub name: String,
    /// The CI issuer whose tokens it trusts, one of the server's `[[ci_issuers]]`, e.g.
    /// `https://token.actions.githubusercontent.com` or `https://gitlab.com`.
    pub issuer: String,
    /// The `aud` the tokens must carry [default: `fairway`, what the client asks for].
    #[serde(default = "default_audience")]
    pub audience: String,
    /// Claim name → pattern; every one must match a string claim of the token. A pattern is
    /// the exact value, `*` standing for any run of characters (`refs/heads/release/*`). At
    /// least one; `iss`, `aud`, `azp`, `exp`, `iat`, `nbf` and `jti` are checked by the policy
    /// itself and cannot be named.
    #[schema(example = json!({"repository": "acme/train", "ref": "refs/heads/main"}))]
    pub conditions: BTreeMap<String, String>,
    /// The role of the exchanged tokens in the team: `member` (submit and cancel jobs) or
    /// `viewer`. Not `admin`: a pipeline must not manage the team's members, tokens or
    /// trust policies.
    pub role: TeamRole,
    /// How long an exchanged token lives, 60 to 3600 seconds [default: 900].
    #[serde(default = "default_ttl")]
    #[schema(minimum = 60, maximum = 3600, default = 900)]
    pub token_ttl_seconds: i64,
}

fn default_audience() -> String {
    DEFAULT_AUDIENCE.to_owned()
}

fn default_ttl() -> i64 {
    DEFAULT_TOKEN_TTL_SECONDS
}

/// A stored trust policy.
#[derive(Debug, Serialize, ToSchema)]
pub struct CiTrustView {
    pub id: CiTrustId,
    pub name: String,
    pub issuer: String,
    pub audience: String,
    /// Claim name → pattern.
    pub conditions: BTreeMap<String, String>,
    /// The role of the tokens exchanged under it.
    pub role: TeamRole,
    pub token_ttl_seconds: i64,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
}

impl From<CiTrustRow> for CiTrustView {
    fn from(r: CiTrustRow) -> Self {
        Self {
            id: r.id,
            name: r.name,
            issuer: r.issuer,
            audience: r.audience,
            conditions: r.conditions.0,
            // The column's check holds it to the three roles; a viewer is the least it can be.
            role: TeamRole::parse(&r.role).unwrap_or(TeamRole::Viewer),
            token_ttl_seconds: i64::from(r.token_ttl_seconds),
            created_by: r.created_by,
            created_at: r.created_at,
        }
    }
}

/// The policy `name` of `team`; a name no policy could have is not found either.
pub async fn get(state: &AppState, team: &TeamRow, name: &str) -> Result<CiTrustRow> {
    let name = CiTrustName::parse("trust", name).map_err(|_| Error::NotFound("CI trust policy"))?;
    db::ci_trusts::get(&state.db, team.id, name.as_str()).await?.ok_or(Error::NotFound("CI trust policy"))
}

/// Creates a trust policy of `team` on behalf of `principal` (a person: a token cannot extend
/// trust), audited. Every field is checked and every wrong one named; the issuer must be one
/// the server is configured to trust.
pub async fn create(state: &AppState, principal: &Principal, team: &TeamRow, body: &NewCiTrust) -> Result<CiTrustView> {
    if !matches!(principal, Principal::User { .. }) {
        return Err(Error::Forbidden);
    }
    let (name, conditions) = check(state, body)?;
    let ttl = i32::try_from(body.token_ttl_seconds).map_err(|_| Error::internal("a checked TTL", "out of range"))?;
    let mut tx = state.db.begin().await?;
    let row = db::ci_trusts::insert(
        &mut tx,
        &db::ci_trusts::NewCiTrust {
            team_id: team.id,
            name: name.as_str(),
            issuer: &body.issuer,
            audience: &body.audience,
            conditions: conditions.as_map(),
            role: body.role.as_str(),
            token_ttl_seconds: ttl,
            created_by: &principal.actor(),
        },
    )
    .await
    .on_constraint("ci_trusts_team_id_name_key", || {
        Error::conflict("ci_trust_exists", Some("name"), format!("the team already has a CI trust policy named {name}"))
    })?;
    let view = CiTrustView::from(row);
    record(
        &mut tx,
        principal,
        "ci_trust.create",
        "ci_trust",
        &format!("{}/{name}", team.name),
        Some(team.id),
        None::<&()>,
        Some(&view),
    )
    .await?;
    tx.commit().await?;
    Ok(view)
}

/// Every field of `body`, checked: all failures at once.
fn check(state: &AppState, body: &NewCiTrust) -> Result<(CiTrustName, Conditions)> {
    let mut errors = Vec::new();
    let name = CiTrustName::parse("name", &body.name).map_err(|e| errors.push(e)).ok();
    if !state.config.ci_issuers.iter().any(|c| c.issuer == body.issuer) {
        let configured: Vec<&str> = state.config.ci_issuers.iter().map(|c| c.issuer.as_str()).collect();
        let message = if configured.is_empty() {
            "this server trusts no CI issuer: its configuration file names none under [[ci_issuers]]".to_owned()
        } else {
            format!("must be one of the CI issuers this server trusts: {}", configured.join(", "))
        };
        errors.push(FieldError::new("issuer", "unknown_issuer", message));
    }
    let audience = body.audience.trim();
    if audience.is_empty() || audience != body.audience || audience.chars().any(char::is_control) {
        errors.push(FieldError::new("audience", "invalid_value", "must be a non-empty value without spaces around it"));
    } else if audience.chars().count() > 200 {
        errors.push(FieldError::new("audience", "too_long", "must be at most 200 characters"));
    }
    let conditions = Conditions::parse("conditions", &body.conditions).map_err(|e| errors.extend(e)).ok();
    if body.role == TeamRole::Admin {
        errors.push(FieldError::new(
            "role",
            "invalid_value",
            "CI tokens may be member or viewer, not admin: a pipeline must not manage its team's members, tokens \
             or trust policies",
        ));
    }
    let (min, max) = TOKEN_TTL_SECONDS;
    if let Err(e) = check_range("token_ttl_seconds", body.token_ttl_seconds, min, max) {
        errors.push(e);
    }
    match (name, conditions) {
        (Some(name), Some(conditions)) if errors.is_empty() => Ok((name, conditions)),
        _ => Err(Error::Validation(errors)),
    }
}

/// Deletes `team`'s policy `name`, audited; the tokens exchanged under it that still live are
/// revoked with it, so deleting a policy shuts its pipelines out at once.
pub async fn delete(state: &AppState, principal: &Principal, team: &TeamRow, name: &str) -> Result<()> {
    let name = CiTrustName::parse("trust", name).map_err(|_| Error::NotFound("CI trust policy"))?;
    let mut tx = state.db.begin().await?;
    let before = db::ci_trusts::get_for_update(&mut tx, team.id, name.as_str())
        .await?
        .ok_or(Error::NotFound("CI trust policy"))?;
    let revoked = db::tokens::revoke_exchanged_under(&mut tx, team.id, before.id).await?;
    db::ci_trusts::delete(&mut tx, team.id, before.id).await?;
    let object = format!("{}/{name}", team.name);
    record(
        &mut tx,
        principal,
        "ci_trust.delete",
        "ci_trust",
        &object,
        Some(team.id),
        Some(&CiTrustView::from(before)),
        None::<&()>,
    )
    .await?;
    if revoked > 0 {
        let after = serde_json::json!({"revoked_tokens": revoked, "because": "their CI trust policy was deleted"});
        record(
            &mut tx,
            principal,
            "token.revoke",
            "api_token",
            &format!("{}/ci:{name}", team.name),
            Some(team.id),
            None::<&()>,
            Some(&after),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
