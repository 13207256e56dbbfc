//! A CI pipeline's ID token exchanged for a short-lived API token of a team (RFC 8693 token
//! exchange): the token is verified with the configured CI issuer it claims to come from,
//! against the audience of each trust policy that trusts that issuer, and the policies whose
//! conditions its claims match admit it. The API token minted is an ordinary row of
//! `api_tokens` with a short expiry, so authentication, revocation, `last_used_at` and the
//! audit log treat it as any other.
//!
//! A token's `jti` is not held to one exchange: GitLab CI gives a job one ID token for its
//! whole run, and a job runs `fairway` several times (submit, then wait, then logs). Each
//! exchange is audited with the `jti`, and what it yields lives minutes.

use std::collections::BTreeSet;

use chrono::Utc;
use serde::Serialize;
use serde_json::{json, Map, Value};

use super::{tokens::TokenView, Error, Result};
use crate::{
    auth::api_token,
    db::{self, audit::Change, ci_trusts::CiTrustRow},
    domain::{ci_trust, TeamName, TeamRole},
    idp::{self, Expected, Refusal},
    state::AppState,
};

/// The sentence for a token no trust policy admits. The same whatever the reason (no policy
/// for the team named, none for the issuer, claims that match none), so that a refusal does
/// not tell a stranger which teams or policies exist.
const NOT_ADMITTED: &str = "no CI trust policy admits this token";

/// What an exchange yields.
#[derive(Debug)]
pub struct Exchanged {
    /// The API token's secret: shown once, never stored.
    pub access_token: String,
    /// Seconds until it expires: the policy's TTL.
    pub expires_in: i64,
    /// Its team.
    pub team: String,
    /// Its role in the team.
    pub role: TeamRole,
    /// The trust policy that admitted the ID token.
    pub policy: String,
}

/// What the audit log keeps of an exchange: who came in (issuer, subject, repository, ref, the
/// token's `jti`), under which policy, and the API token they got (never its secret).
#[derive(Serialize)]
struct Audited<'a> {
    issuer: &'a str,
    subject: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    repository: Option<String>,
    #[serde(rename = "ref", skip_serializing_if = "Option::is_none")]
    git_ref: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    environment: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    jti: Option<String>,
    policy: &'a str,
    /// The claims the policy's conditions name, as the token had them.
    claims: Map<String, Value>,
    token: TokenView,
}

fn refused(reason: impl Into<String>) -> Error {
    Error::IdentityRefused { reason: reason.into() }
}

/// Exchanges `subject_token`, a CI system's ID token, for an API token of `team` (or of the
/// one team whose policies admit it, when no team is named). Refused
/// ([`Error::IdentityRefused`], with why) when its issuer is not a configured CI issuer, when
/// it does not verify (signature, algorithm, audience, expiry, ...) or when no policy admits
/// it; [`Error::ProviderUnavailable`] when the issuer's keys cannot be read.
pub async fn exchange(state: &AppState, subject_token: &str, team: Option<&TeamName>) -> Result<Exchanged> {
    let outcome = admit(state, subject_token, team).await;
    match &outcome {
        Err(Error::IdentityRefused { reason }) => tracing::info!(reason = %reason, "token exchange refused"),
        Err(Error::ProviderUnavailable { reason }) => tracing::warn!(reason = %reason, "token exchange failed"),
        _ => {}
    }
    let (trust, claims) = outcome?;
    mint(state, &trust, &claims).await
}

/// The policy that admits `subject_token`, and the token's verified claims.
async fn admit(
    state: &AppState,
    subject_token: &str,
    team: Option<&TeamName>,
) -> Result<(CiTrustRow, Map<String, Value>)> {
    // The unverified `iss` only picks among configured issuers; it never names a URL to fetch.
    let iss = idp::claimed_issuer(subject_token).ok_or_else(|| refused(Refusal::Malformed.to_string()))?;
    let configured = state.config.ci_issuers.iter().find(|c| c.issuer == iss);
    let (Some(configured), Some(issuer)) = (configured, state.issuers.get(&iss)) else {
        return Err(refused("the token's issuer is not a CI issuer this service trusts"));
    };
    let algorithms: Vec<_> = configured.algorithms.iter().filter_map(|a| idp::algorithm(a)).collect();
    let candidates = db::ci_trusts::for_issuer(&state.db, &iss, team.map(TeamName::as_str)).await?;
    if candidates.is_empty() {
        return Err(refused(NOT_ADMITTED));
    }
    // Verified once per audience the candidates expect; a token carries one audience (or
    // several with `azp` naming one), so all but one of these refuse it for its audience.
    let audiences: BTreeSet<&str> = candidates.iter().map(|c| c.audience.as_str()).collect();
    let mut verified = None;
    let mut admitted: Vec<&CiTrustRow> = Vec::new();
    for audience in audiences {
        let expected = Expected { issuer: &iss, audience, algorithms: &algorithms, nonce: None };
        match issuer.verify(subject_token, &expected).await {
            Ok(claims) => {
                admitted.extend(
                    candidates.iter().filter(|c| c.audience == audience && ci_trust::admits(&c.conditions.0, &claims)),
                );
                verified.get_or_insert(claims);
            }
            Err(idp::Error::Refused(Refusal::Audience)) => {}
            Err(other) => return Err(other.into()),
        }
    }
    let Some(claims) = verified else {
        return Err(refused(Refusal::Audience.to_string()));
    };
    let teams: BTreeSet<_> = admitted.iter().map(|c| c.team_id).collect();
    if teams.len() > 1 {
        return Err(Error::field(crate::domain::FieldError::new(
            "team",
            "ambiguous",
            "trust policies of several teams admit this token: name the team to act for",
        )));
    }
    // Each admitting policy grants what it says on its own; the token gets the most any of
    // them grants, and the first such policy by name is the one it is exchanged under.
    let chosen = admitted
        .into_iter()
        .max_by(|a, b| {
            let role = |c: &CiTrustRow| TeamRole::parse(&c.role).unwrap_or(TeamRole::Viewer);
            role(a).cmp(&role(b)).then_with(|| b.name.cmp(&a.name))
        })
        .ok_or_else(|| refused(NOT_ADMITTED))?;
    Ok((chosen.clone(), claims))
}

/// Mints the API token `trust` grants to the pipeline `claims` describe, with its audit entry.
async fn mint(state: &AppState, trust: &CiTrustRow, claims: &Map<String, Value>) -> Result<Exchanged> {
    // The column's check holds the role to the three; a viewer is the least it can be.
    let role = TeamRole::parse(&trust.role).unwrap_or(TeamRole::Viewer);
    let ttl = i64::from(trust.token_ttl_seconds);
    let name = format!("ci:{}", trust.name);
    let minted = api_token::mint();
    let mut tx = state.db.begin().await?;
    let row = db::tokens::insert(
        &mut tx,
        &db::tokens::NewToken {
            team_id: trust.team_id,
            name: &name,
            role: role.as_str(),
            token_hash: &minted.hash,
            display_prefix: &minted.display_prefix,
            created_by: None,
            expires_at: Utc::now() + chrono::Duration::seconds(ttl),
            ci_trust_id: Some(trust.id),
        },
    )
    .await?;
    let text = |name: &str| claim_text(claims, name);
    let subject = text("sub").unwrap_or_default();
    let audited = Audited {
        issuer: &trust.issuer,
        subject: subject.clone(),
        // GitHub names the repository, GitLab the project, Buildkite the pipeline.
        repository: text("repository")
            .or_else(|| text("project_path"))
            .or_else(|| Some(format!("{}/{}", text("organization_slug")?, text("pipeline_slug")?))),
        git_ref: text("ref").or_else(|| text("build_branch")),
        environment: text("environment"),
        jti: text("jti"),
        policy: &trust.name,
        claims: trust.conditions.0.keys().map(|k| (k.clone(), text(k).map_or(Value::Null, Value::from))).collect(),
        token: TokenView::from(row.clone()),
    };
    db::audit::record(
        &mut tx,
        Change {
            actor: &format!("ci:{subject}"),
            action: "token.exchange",
            object_type: "api_token",
            object_id: &format!("{}/{}", trust.team_name, row.id),
            team_id: Some(trust.team_id),
            before: None,
            after: Some(serde_json::to_value(&audited).unwrap_or_else(|_| json!({}))),
        },
    )
    .await?;
    tx.commit().await?;
    tracing::info!(team.name = %trust.team_name, ci.policy = %trust.name, ci.subject = %subject, "CI token exchanged");
    Ok(Exchanged {
        access_token: minted.secret,
        expires_in: ttl,
        team: trust.team_name.clone(),
        role,
        policy: trust.name.clone(),
    })
}

/// A string claim as the audit log may keep it: printable, at most 200 characters. The issuer
/// signed it, but its values come from whoever named the repository or the branch.
fn claim_text(claims: &Map<String, Value>, name: &str) -> Option<String> {
    let value = claims.get(name)?.as_str()?;
    Some(value.chars().filter(|c| !c.is_control()).take(200).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_kept_printable_and_short() {
        let claims: Map<String, Value> = serde_json::from_value(json!({
            "ref": "refs/heads/a\u{0}b\nc", "long": "x".repeat(500), "n": 7
        }))
        .unwrap();
        assert_eq!(claim_text(&claims, "ref").as_deref(), Some("refs/heads/abc"));
        assert_eq!(claim_text(&claims, "long").map(|s| s.len()), Some(200));
        assert_eq!(claim_text(&claims, "n"), None);
        assert_eq!(claim_text(&claims, "missing"), None);
    }
}
