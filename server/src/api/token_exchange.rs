//! `POST /api/v1/auth/token-exchange`: a CI pipeline's ID token for a short-lived API token
//! of a team that trusts it (RFC 8693 token exchange). Unauthenticated: the ID token is the
//! credential.

use axum::{
    extract::{FromRequest, Request, State},
    http::{header, HeaderMap, HeaderValue},
    Extension, Json,
};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::ApiError;
use crate::{
    domain::{TeamName, TeamRole},
    http::idempotency::WithheldOnReplay,
    ops::token_exchange,
    state::AppState,
};

/// RFC 8693's grant type.
pub const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
/// The subject token types accepted: a CI system's ID token is both.
pub const SUBJECT_TOKEN_TYPES: [&str; 2] =
    ["urn:ietf:params:oauth:token-type:id_token", "urn:ietf:params:oauth:token-type:jwt"];
/// What is issued: an access token (a Fairway API token).
pub const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";

/// A token exchange request (RFC 8693 §2.1), as a form (`application/x-www-form-urlencoded`)
/// or as JSON.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TokenExchangeRequest {
    /// `urn:ietf:params:oauth:grant-type:token-exchange`.
    #[schema(required = true, value_type = String, example = "urn:ietf:params:oauth:grant-type:token-exchange")]
    pub grant_type: Option<String>,
    /// The CI system's ID token for this job (GitHub Actions, GitLab CI `id_tokens:`, Buildkite
    /// `oidc request-token`), with the audience a trust policy of the team expects.
    #[schema(required = true, value_type = String)]
    pub subject_token: Option<String>,
    /// `urn:ietf:params:oauth:token-type:id_token` or `urn:ietf:params:oauth:token-type:jwt`.
    #[schema(required = true, value_type = String, example = "urn:ietf:params:oauth:token-type:id_token")]
    pub subject_token_type: Option<String>,
    /// If sent, `urn:ietf:params:oauth:token-type:access_token`: the only type issued.
    pub requested_token_type: Option<String>,
    /// The team to act for; may be left out when the policies of only one team admit the token.
    pub team: Option<String>,
}

/// An exchanged token (RFC 8693 §2.2.1), with the team, role and policy it was granted under.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenExchangeResponse {
    /// An API token (`fwy_...`) of the team: send it as `Authorization: Bearer <token>`.
    pub access_token: String,
    /// `urn:ietf:params:oauth:token-type:access_token`.
    pub issued_token_type: &'static str,
    /// `Bearer`.
    pub token_type: &'static str,
    /// Seconds until the token expires: the policy's `token_ttl_seconds`.
    pub expires_in: i64,
    /// The team the token acts for.
    pub team: String,
    /// Its role in the team.
    pub role: TeamRole,
    /// The trust policy that admitted the ID token; the token is named `ci:<policy>`.
    pub policy: String,
}

/// Exchanges a CI job's ID token for a short-lived API token of a team whose CI trust policy
/// admits it: the token's issuer must be a configured CI issuer, its signature, audience and
/// times must verify, and its claims must match every condition of the policy. The token is an
/// ordinary API token of the team (listed, revocable, audited) that expires after the
/// policy's TTL. Send the parameters as a form, as OAuth clients do, or as JSON.
#[utoipa::path(
    post, path = "/api/v1/auth/token-exchange", tag = "auth", operation_id = "exchange_token",
    request_body(
        description = "RFC 8693 token exchange parameters, with `team` as an extension",
        content(
            (TokenExchangeRequest = "application/x-www-form-urlencoded"),
            (TokenExchangeRequest = "application/json"),
        )
    ),
    responses(
        (status = 200, description = "Exchanged", body = TokenExchangeResponse),
        (status = 400, description = "A parameter is missing or wrong (`malformed_request`, `field` names it)",
         body = super::error::Problem),
        (status = 401, description = "The ID token was refused (`identity_refused`): not from a configured CI issuer, \
                                      expired, meant for another audience, signed with an unknown key or `none`, or \
                                      admitted by no trust policy; `detail` says which",
         body = super::error::Problem),
        (status = 422, description = "Trust policies of several teams admit the token: name one with `team`",
         body = super::error::Problem),
        (status = 502, description = "The CI issuer's keys could not be read (`provider_unavailable`)",
         body = super::error::Problem),
    ),
    security(())
)]
pub async fn exchange_token(
    State(state): State<AppState>,
    ExchangeForm(request): ExchangeForm,
) -> Result<(HeaderMap, Extension<WithheldOnReplay>, Json<TokenExchangeResponse>), ApiError> {
    let (subject_token, team) = request.parameters()?;
    let exchanged = token_exchange::exchange(&state, subject_token, team.as_ref()).await?;
    // RFC 6749 §5.1: an answer with a token is never cached.
    let mut headers = HeaderMap::new();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    Ok((
        headers,
        Extension(WithheldOnReplay(&["access_token"])),
        Json(TokenExchangeResponse {
            access_token: exchanged.access_token,
            issued_token_type: ACCESS_TOKEN_TYPE,
            token_type: "Bearer",
            expires_in: exchanged.expires_in,
            team: exchanged.team,
            role: exchanged.role,
            policy: exchanged.policy,
        }),
    ))
}

fn malformed(field: &str, detail: impl Into<String>) -> ApiError {
    ApiError::MalformedRequest { field: field.to_owned(), detail: detail.into() }
}

impl TokenExchangeRequest {
    /// The subject token and the team, once every parameter is as RFC 8693 wants it: each
    /// wrong one is a 400 that names it.
    pub fn parameters(&self) -> Result<(&str, Option<TeamName>), ApiError> {
        check(self)
    }
}

fn check(request: &TokenExchangeRequest) -> Result<(&str, Option<TeamName>), ApiError> {
    fn present(value: &Option<String>) -> Option<&str> {
        value.as_deref().filter(|v| !v.is_empty())
    }
    match present(&request.grant_type) {
        Some(GRANT_TYPE) => {}
        Some(_) => return Err(malformed("grant_type", format!("grant_type must be {GRANT_TYPE}"))),
        None => return Err(malformed("grant_type", format!("grant_type is required: {GRANT_TYPE}"))),
    }
    let subject_token = present(&request.subject_token)
        .ok_or_else(|| malformed("subject_token", "subject_token is required: the CI job's ID token"))?;
    match present(&request.subject_token_type) {
        Some(kind) if SUBJECT_TOKEN_TYPES.contains(&kind) => {}
        _ => {
            return Err(malformed(
                "subject_token_type",
                format!("subject_token_type must be {}", SUBJECT_TOKEN_TYPES.join(" or ")),
            ))
        }
    }
    if request.requested_token_type.as_deref().is_some_and(|t| t != ACCESS_TOKEN_TYPE) {
        return Err(malformed(
            "requested_token_type",
            format!("only {ACCESS_TOKEN_TYPE} is issued; leave requested_token_type out or ask for that"),
        ));
    }
    let team = match present(&request.team) {
        Some(team) => {
            Some(TeamName::parse("team", team).map_err(|e| malformed("team", format!("team {}", e.message)))?)
        }
        None => None,
    };
    Ok((subject_token, team))
}

/// The request's parameters, from a form or a JSON body. Anything wrong with the body itself
/// (its type, its syntax, a parameter twice or unknown) is a 400 that names what it can.
pub struct ExchangeForm(pub TokenExchangeRequest);

impl<S: Send + Sync> FromRequest<S> for ExchangeForm {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let mime = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
            .unwrap_or_default();
        let form = mime == "application/x-www-form-urlencoded";
        if !form && mime != "application/json" {
            return Err(malformed(
                "Content-Type",
                "send the parameters as application/x-www-form-urlencoded (RFC 8693) or application/json",
            ));
        }
        let bytes = super::extract::body(req, state).await?;
        let parsed = if form {
            serde_urlencoded::from_bytes::<TokenExchangeRequest>(&bytes).map_err(|e| {
                let text = e.to_string();
                // serde names an unknown or repeated parameter between backticks; a parameter
                // without a name is the body's fault.
                let field = text.split('`').nth(1).filter(|f| !f.is_empty()).unwrap_or("body");
                malformed(field, format!("the form is not a token exchange request: {text}"))
            })
        } else {
            super::extract::parse_json::<TokenExchangeRequest>(&bytes).map_err(|e| match e {
                ApiError::Validation(errors) => match errors.into_iter().next() {
                    Some(first) if !first.field.is_empty() => {
                        malformed(&first.field, format!("{}: {}", first.field, first.message))
                    }
                    // A key that is the empty string is named by the body.
                    Some(first) => malformed("body", first.message),
                    None => malformed("body", "the body is not a token exchange request"),
                },
                other => other,
            })
        }?;
        Ok(ExchangeForm(parsed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(pairs: &[(&str, &str)]) -> TokenExchangeRequest {
        serde_urlencoded::from_str(&serde_urlencoded::to_string(pairs).unwrap()).unwrap()
    }

    fn field(request: &TokenExchangeRequest) -> Option<String> {
        check(request).err().and_then(|e| e.problem().field)
    }

    #[test]
    fn each_wrong_parameter_is_named() {
        let good = [
            ("grant_type", GRANT_TYPE),
            ("subject_token", "a.b.c"),
            ("subject_token_type", SUBJECT_TOKEN_TYPES[0]),
            ("team", "vision"),
        ];
        let whole = request(&good);
        let (token, team) = check(&whole).unwrap();
        assert_eq!((token, team.map(|t| t.to_string())), ("a.b.c", Some("vision".to_owned())));
        let with = |name: &str, value: &str| {
            let mut pairs: Vec<(&str, &str)> = good.iter().copied().filter(|(n, _)| *n != name).collect();
            if !value.is_empty() {
                pairs.push((name, value));
            }
            let pairs: Vec<(String, String)> = pairs.into_iter().map(|(n, v)| (n.to_owned(), v.to_owned())).collect();
            serde_urlencoded::from_str::<TokenExchangeRequest>(&serde_urlencoded::to_string(&pairs).unwrap()).unwrap()
        };
        assert_eq!(field(&with("grant_type", "")).as_deref(), Some("grant_type"));
        assert_eq!(field(&with("grant_type", "client_credentials")).as_deref(), Some("grant_type"));
        assert_eq!(field(&with("subject_token", "")).as_deref(), Some("subject_token"));
        assert_eq!(field(&with("subject_token_type", "urn:x")).as_deref(), Some("subject_token_type"));
        assert_eq!(field(&with("team", "Not A Team")).as_deref(), Some("team"));
        assert_eq!(
            field(&with("requested_token_type", "urn:ietf:params:oauth:token-type:jwt")).as_deref(),
            Some("requested_token_type")
        );
        assert!(check(&with("team", "")).unwrap().1.is_none(), "the team may be left out");
        assert!(check(&with("subject_token_type", SUBJECT_TOKEN_TYPES[1])).is_ok());
    }
}
