//! Signing people in through an OpenID provider: the authorization code flow with PKCE,
//! `state` tied to the browser and taken once, the ID token verified with the `nonce`, the
//! user found by the provider's subject (or created on first sign-in), and the provider's
//! groups applied to teams and roles, every change audited.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};
use sha2::{Digest as _, Sha256};

use super::{Error, Result};
use crate::{
    config::OidcProvider,
    db::{self, audit::Change, identities::PendingSignIn, users::UserRow, Tx},
    domain::{PlatformRole, TeamRole, Username},
    idp::{self, Attempt, Expected},
    state::AppState,
};

/// How long a person has to come back from the provider.
const SIGN_IN_MINUTES: i64 = 10;

/// Where a provider's memberships say they came from.
pub fn source(provider: &str) -> String {
    format!("oidc:{provider}")
}

/// The redirect URI of `provider`, registered with it.
pub fn redirect_uri(state: &AppState, provider: &str) -> String {
    format!("{}/login/oidc/{provider}/callback", state.config.public_url())
}

/// A sign-in begun: where to send the browser, and the state to keep in its cookie.
#[derive(Debug)]
pub struct Begun {
    /// The provider's authorization request.
    pub redirect: String,
    /// The `state`, which only this browser holds besides the provider.
    pub state: String,
}

fn provider<'a>(state: &'a AppState, id: &str) -> Result<&'a OidcProvider> {
    state.config.oidc_provider(id).ok_or(Error::NotFound("identity provider"))
}

fn algorithms(provider: &OidcProvider) -> Vec<jsonwebtoken::Algorithm> {
    provider.algorithms.iter().filter_map(|a| idp::algorithm(a)).collect()
}

fn hash(state: &str) -> Vec<u8> {
    Sha256::digest(state.as_bytes()).to_vec()
}

/// Begins a sign-in through provider `id`.
pub async fn begin(state: &AppState, id: &str) -> Result<Begun> {
    let provider = provider(state, id)?;
    let issuer = state.issuers.get(&provider.issuer).ok_or(Error::NotFound("identity provider"))?;
    let metadata = issuer.metadata().await?;
    let endpoint = metadata.authorization_endpoint.as_deref().ok_or_else(|| Error::ProviderUnavailable {
        reason: format!("the identity provider {} names no authorization endpoint", provider.issuer),
    })?;
    let attempt = Attempt::new();
    let pending = PendingSignIn {
        provider: provider.id.clone(),
        nonce: attempt.nonce.clone(),
        verifier: attempt.verifier.clone(),
    };
    let expires = chrono::Utc::now() + chrono::Duration::minutes(SIGN_IN_MINUTES);
    db::identities::begin(&state.db, &hash(&attempt.state), &pending, expires).await?;
    let redirect = redirect_uri(state, &provider.id);
    let client =
        idp::Client { id: &provider.client_id, secret: provider.client_secret.expose(), redirect_uri: &redirect };
    Ok(Begun {
        redirect: attempt.authorization_url(endpoint, &client, &provider.scopes.join(" ")),
        state: attempt.state,
    })
}

/// Where to send a browser whose session began at provider `id` so the provider ends its
/// session too, and the provider's name; `None` when it offers no RP-initiated logout (or
/// cannot be reached: Fairway's own session is over either way).
pub async fn end_session(state: &AppState, id: &str, id_token: &str) -> Option<(String, String)> {
    let provider = state.config.oidc_provider(id)?;
    let metadata = state.issuers.get(&provider.issuer)?.metadata().await.ok()?;
    let endpoint = metadata.end_session_endpoint.as_deref()?;
    let back = format!("{}/login", state.config.public_url());
    Some((provider.display_name.clone(), idp::end_session_url(endpoint, id_token, &provider.client_id, &back)))
}

/// What the provider sent the browser back with.
#[derive(Debug, Default, serde::Deserialize)]
pub struct Answer {
    /// The authorization code.
    pub code: Option<String>,
    /// The state sent with the request.
    pub state: Option<String>,
    /// The provider's refusal (`access_denied`, ...).
    pub error: Option<String>,
    /// Its words for the refusal.
    pub error_description: Option<String>,
}

/// A finished sign-in.
#[derive(Debug)]
pub struct SignedIn {
    /// The user, created on a first sign-in.
    pub user: UserRow,
    /// The ID token, kept with the session for RP-initiated logout.
    pub id_token: String,
}

/// Finishes a sign-in through provider `id` with the provider's `answer`, in the browser
/// whose cookie holds `browser_state`. Every refusal is audited (`user.sign_in_failed`, with
/// the reason), as is the sign-in itself and each membership it changes.
pub async fn finish(
    state: &AppState,
    id: &str,
    answer: &Answer,
    browser_state: Option<&str>,
    client: &str,
) -> Result<SignedIn> {
    let provider = provider(state, id)?;
    match verified_claims(state, provider, answer, browser_state).await {
        Ok((claims, id_token)) => {
            let user = sign_in(state, provider, &claims, client).await?;
            Ok(SignedIn { user, id_token })
        }
        Err(error @ (Error::IdentityRefused { .. } | Error::ProviderUnavailable { .. })) => {
            let mut tx = state.db.begin().await?;
            let reason = error.to_string();
            audit(
                &mut tx,
                "anonymous",
                "user.sign_in_failed",
                "",
                None,
                json!({"via": source(id), "address": client, "reason": reason}),
            )
            .await?;
            tx.commit().await?;
            Err(error)
        }
        Err(other) => Err(other),
    }
}

fn refused(reason: impl Into<String>) -> Error {
    Error::IdentityRefused { reason: reason.into() }
}

async fn verified_claims(
    state: &AppState,
    provider: &OidcProvider,
    answer: &Answer,
    browser_state: Option<&str>,
) -> Result<(Map<String, Value>, String)> {
    let returned =
        answer.state.as_deref().filter(|s| !s.is_empty()).ok_or_else(|| refused("the answer carries no state"))?;
    // The state must be the one this browser started with: an answer carried into another
    // browser (login CSRF) is refused, and each state is taken once.
    if browser_state != Some(returned) {
        return Err(refused("the answer does not belong to a sign-in begun in this browser"));
    }
    let pending = db::identities::take(&state.db, &hash(returned))
        .await?
        .filter(|p| p.provider == provider.id)
        .ok_or_else(|| refused("this sign-in was already used or has expired"))?;
    if let Some(error) = &answer.error {
        let words = answer.error_description.as_deref().map(|d| format!(": {d}")).unwrap_or_default();
        return Err(refused(format!("the identity provider answered {error}{words}")));
    }
    let code = answer.code.as_deref().filter(|c| !c.is_empty()).ok_or_else(|| refused("the answer carries no code"))?;
    let issuer = state.issuers.get(&provider.issuer).ok_or(Error::NotFound("identity provider"))?;
    let redirect = redirect_uri(state, &provider.id);
    let client =
        idp::Client { id: &provider.client_id, secret: provider.client_secret.expose(), redirect_uri: &redirect };
    let id_token = issuer.redeem(&client, code, &pending.verifier).await?;
    let algorithms = algorithms(provider);
    let expected = Expected {
        issuer: &provider.issuer,
        audience: &provider.client_id,
        algorithms: &algorithms,
        nonce: Some(&pending.nonce),
    };
    let claims = issuer.verify(&id_token, &expected).await?;
    Ok((claims, id_token))
}

/// The user for `claims` (created and linked on a first sign-in), with the provider's group
/// grants applied, in one transaction.
async fn sign_in(
    state: &AppState,
    provider: &OidcProvider,
    claims: &Map<String, Value>,
    client: &str,
) -> Result<UserRow> {
    let subject = claims.get("sub").and_then(Value::as_str).unwrap_or_default();
    let via = source(&provider.id);
    let mut tx = state.db.begin().await?;
    let user = match db::identities::user_for_update(&mut tx, &provider.id, subject).await? {
        Some(user) => {
            db::identities::touch(&mut tx, &provider.id, subject).await?;
            user
        }
        None => create_user(&mut tx, provider, claims).await?,
    };
    if user.disabled {
        drop(tx);
        return Err(refused(format!("the account {} is disabled", user.username)));
    }
    let actor = format!("user:{}", user.username);
    let groups = groups(claims, &provider.groups_claim);
    apply_groups(&mut tx, state, provider, &user, &groups, &actor).await?;
    let user = apply_platform_role(&mut tx, provider, user, &groups, &actor).await?;
    audit(
        &mut tx,
        &actor,
        "user.sign_in",
        &user.username,
        None,
        json!({"via": via, "address": client, "groups": groups}),
    )
    .await?;
    tx.commit().await?;
    Ok(user)
}

/// The groups claim as a list: an array of strings, or one string.
fn groups(claims: &Map<String, Value>, claim: &str) -> Vec<String> {
    match claims.get(claim) {
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).map(str::to_owned).collect(),
        Some(Value::String(one)) => vec![one.clone()],
        _ => Vec::new(),
    }
}

/// A username for a first sign-in: the configured claim, else the email's local part, else
/// the subject, made to fit Fairway's rules; another user's name is never taken over.
async fn create_user(tx: &mut Tx<'_>, provider: &OidcProvider, claims: &Map<String, Value>) -> Result<UserRow> {
    let subject = claims.get("sub").and_then(Value::as_str).unwrap_or_default();
    let claimed = |name: &str| claims.get(name).and_then(Value::as_str).filter(|v| !v.is_empty());
    let wanted = claimed(&provider.username_claim)
        .or_else(|| claimed("email").map(|e| e.split('@').next().unwrap_or(e)))
        .unwrap_or(subject);
    let base = fitted(wanted);
    let tag: String = Sha256::digest(subject.as_bytes())[..4].iter().map(|b| format!("{b:02x}")).collect();
    let candidates = [base.clone(), format!("{base}.{}", provider.id), format!("{base}.{}-{tag}", provider.id)];
    for candidate in candidates {
        let Ok(name) = Username::parse("username", &fitted(&candidate)) else { continue };
        if db::users::by_username_in(tx, name.as_str()).await?.is_some() {
            continue;
        }
        // People who sign in through a provider have no password: `!` is no argon2 hash, so
        // no password ever matches it.
        let user = db::users::insert(tx, name.as_str(), "!", None).await?;
        db::identities::link(tx, &provider.id, subject, user.id).await?;
        let after = json!({"username": user.username, "via": source(&provider.id)});
        audit(tx, &source(&provider.id), "user.create", &user.username, None, after).await?;
        return Ok(user);
    }
    Err(Error::conflict("username_taken", None, format!("no free username for {wanted:?}; ask a platform admin")))
}

/// `wanted` in Fairway's username alphabet: lowercase, other characters as `-`, no separator
/// at either end, at most 64 characters.
fn fitted(wanted: &str) -> String {
    let mapped: String = wanted
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_lowercase() || c.is_ascii_digit() || "-._".contains(c) { c } else { '-' })
        .take(64)
        .collect();
    mapped.trim_matches(|c| "-._".contains(c)).to_owned()
}

/// Makes the user's provider-granted memberships exactly what `groups` grant: new ones added,
/// roles changed, and those the provider no longer asserts removed. Memberships an admin made
/// by hand are never touched.
async fn apply_groups(
    tx: &mut Tx<'_>,
    state: &AppState,
    provider: &OidcProvider,
    user: &UserRow,
    groups: &[String],
    actor: &str,
) -> Result<()> {
    let via = source(&provider.id);
    // The strongest role each team is granted.
    let mut wanted: BTreeMap<&str, TeamRole> = BTreeMap::new();
    for grant in provider.groups.iter().filter(|g| groups.contains(&g.group)) {
        if let (Some(team), Some(role)) = (&grant.team, grant.role) {
            let entry = wanted.entry(team.as_str()).or_insert(role);
            *entry = (*entry).max(role);
        }
    }
    let held = db::members::held_for_update(tx, user.id).await?;
    for membership in held.iter().filter(|m| m.source.as_deref() == Some(via.as_str())) {
        if !wanted.contains_key(membership.team.as_str()) {
            db::members::delete(tx, membership.team_id, user.id).await?;
            let before = json!({"username": user.username, "role": membership.role, "source": via});
            audit_member(tx, actor, "member.remove", &membership.team, membership.team_id, Some(before), None).await?;
        }
    }
    for (team_name, role) in wanted {
        let Some(team) = db::teams::by_name(&state.db, team_name).await? else {
            tracing::warn!(provider = %provider.id, team = team_name, "a group grant names a team that does not exist");
            continue;
        };
        let before = held.iter().find(|m| m.team_id == team.id);
        if db::members::grant(tx, team.id, user.id, role.as_str(), &via).await? {
            let before = before.map(|m| json!({"username": user.username, "role": m.role, "source": m.source}));
            let after = json!({"username": user.username, "role": role.as_str(), "source": via});
            let action = if before.is_some() { "member.update" } else { "member.add" };
            audit_member(tx, actor, action, team_name, team.id, before, Some(after)).await?;
        }
    }
    Ok(())
}

/// When the provider grants platform roles at all, the user's platform role is the one its
/// groups grant (platform admin over finance), or none.
async fn apply_platform_role(
    tx: &mut Tx<'_>,
    provider: &OidcProvider,
    user: UserRow,
    groups: &[String],
    actor: &str,
) -> Result<UserRow> {
    let grants: Vec<PlatformRole> = provider.groups.iter().filter_map(|g| g.platform_role).collect();
    if grants.is_empty() {
        return Ok(user);
    }
    let granted: Vec<PlatformRole> =
        provider.groups.iter().filter(|g| groups.contains(&g.group)).filter_map(|g| g.platform_role).collect();
    let role = [PlatformRole::PlatformAdmin, PlatformRole::Finance].into_iter().find(|r| granted.contains(r));
    let role = role.map(PlatformRole::as_str);
    if user.platform_role.as_deref() == role {
        return Ok(user);
    }
    let updated = db::users::update(tx, user.id, role, user.disabled, None).await?;
    let before = json!({"platform_role": user.platform_role});
    let after = json!({"platform_role": role, "source": source(&provider.id)});
    record(tx, actor, "user.update", "user", &user.username, None, Some(before), Some(after)).await?;
    Ok(updated)
}

async fn audit(
    tx: &mut Tx<'_>,
    actor: &str,
    action: &str,
    username: &str,
    team_id: Option<crate::domain::TeamId>,
    after: Value,
) -> Result<()> {
    record(tx, actor, action, "user", username, team_id, None, Some(after)).await
}

async fn audit_member(
    tx: &mut Tx<'_>,
    actor: &str,
    action: &str,
    team: &str,
    team_id: crate::domain::TeamId,
    before: Option<Value>,
    after: Option<Value>,
) -> Result<()> {
    record(tx, actor, action, "member", team, Some(team_id), before, after).await
}

#[allow(clippy::too_many_arguments)]
async fn record(
    tx: &mut Tx<'_>,
    actor: &str,
    action: &str,
    object_type: &str,
    object_id: &str,
    team_id: Option<crate::domain::TeamId>,
    before: Option<Value>,
    after: Option<Value>,
) -> Result<()> {
    db::audit::record(tx, Change { actor, action, object_type, object_id, team_id, before, after }).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claimed_name_is_fitted_to_fairways_username_rules() {
        assert_eq!(fitted("Alice"), "alice");
        assert_eq!(fitted("jean-luc.picard"), "jean-luc.picard");
        assert_eq!(fitted("Zoë O'Brien"), "zo--o-brien");
        assert_eq!(fitted("_admin_"), "admin");
        assert_eq!(fitted(&"x".repeat(100)).len(), 64);
    }

    #[test]
    fn groups_are_read_from_an_array_or_a_single_string() {
        let claims = json!({"groups": ["a", "b", 3], "team": "ml"}).as_object().unwrap().clone();
        assert_eq!(groups(&claims, "groups"), ["a", "b"]);
        assert_eq!(groups(&claims, "team"), ["ml"]);
        assert!(groups(&claims, "missing").is_empty());
    }
}
