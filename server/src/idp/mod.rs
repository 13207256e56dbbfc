//! The OpenID providers Fairway trusts, over HTTP: discovery, the JWKS (read again when a
//! token names a key it does not hold, so providers rotate keys freely), the authorization
//! code flow with PKCE, and RP-initiated logout. People sign in through providers with a
//! client registered for Fairway; CI systems (GitHub Actions, GitLab CI, Buildkite) are
//! issuers whose ID tokens [`Issuer::verify`] checks for a trust policy.
//!
//! Only configured issuers are ever fetched: a token's `iss` selects among them and never
//! names a URL to fetch.

pub mod verify;

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use base64::Engine as _;
use jsonwebtoken::{jwk::JwkSet, Algorithm};
use serde::Deserialize;
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};
pub use verify::{Expected, Refusal};

/// How long a request to a provider may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Discovery documents are read again this often.
const METADATA_TTL: Duration = Duration::from_secs(3600);
/// A JWKS is read again for an unknown key at most this often: tokens naming made-up keys
/// cannot turn Fairway into a flood against the provider.
const JWKS_REREAD_FLOOR: Duration = Duration::from_secs(1);

/// Why a provider could not be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Discovery, the JWKS or the token endpoint could not be read or made no sense.
    #[error("the identity provider {issuer} could not be used: {reason}")]
    Provider {
        /// The provider's issuer.
        issuer: String,
        /// What went wrong, without secrets.
        reason: String,
    },
    /// The token endpoint refused the code (RFC 6749 §5.2: a replayed or expired code, a
    /// PKCE verifier that does not match).
    #[error("the identity provider refused the code ({0})")]
    Grant(String),
    /// The token was refused.
    #[error(transparent)]
    Refused(#[from] Refusal),
}

/// What discovery says about a provider (OpenID Connect Discovery 1.0 §3).
#[derive(Debug, Clone, Deserialize)]
pub struct Metadata {
    /// The issuer, equal to the one configured.
    pub issuer: String,
    /// Where people are sent to sign in (absent for CI issuers).
    pub authorization_endpoint: Option<String>,
    /// Where codes are redeemed.
    pub token_endpoint: Option<String>,
    /// The provider's public keys.
    pub jwks_uri: String,
    /// RP-initiated logout, where the provider offers it.
    pub end_session_endpoint: Option<String>,
}

#[derive(Default)]
struct Cached {
    metadata: Option<(Arc<Metadata>, Instant)>,
    jwks: Option<(Arc<JwkSet>, Instant)>,
}

/// One trusted issuer, its discovery document and keys cached.
pub struct Issuer {
    issuer: String,
    http: reqwest::Client,
    cache: tokio::sync::Mutex<Cached>,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer").field("issuer", &self.issuer).finish_non_exhaustive()
    }
}

/// The issuers of the configuration, by issuer URL.
#[derive(Debug, Default)]
pub struct Directory(HashMap<String, Arc<Issuer>>);

impl Directory {
    /// A directory of `issuers`; nothing is fetched until a token or a sign-in needs it, so a
    /// provider that is down does not keep the service from starting.
    pub fn new<'a>(issuers: impl IntoIterator<Item = &'a str>) -> Self {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap_or_default();
        Self(
            issuers
                .into_iter()
                .map(|iss| {
                    let issuer = Issuer { issuer: iss.to_owned(), http: http.clone(), cache: Default::default() };
                    (iss.to_owned(), Arc::new(issuer))
                })
                .collect(),
        )
    }

    /// The configured issuer `iss`, if it is one.
    pub fn get(&self, iss: &str) -> Option<&Arc<Issuer>> {
        self.0.get(iss)
    }
}

/// The `iss` a token claims, read without verifying anything: only to pick which configured
/// issuer verifies it.
pub fn claimed_issuer(token: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).ok()?;
    let claims: Map<String, Value> = serde_json::from_slice(&bytes).ok()?;
    claims.get("iss")?.as_str().map(str::to_owned)
}

impl Issuer {
    /// The issuer URL.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    fn failed(&self, reason: impl std::fmt::Display) -> Error {
        Error::Provider { issuer: self.issuer.clone(), reason: reason.to_string() }
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, Error> {
        let response = self.http.get(url).send().await.map_err(|e| self.failed(format!("{url}: {e}")))?;
        if !response.status().is_success() {
            return Err(self.failed(format!("{url} answered {}", response.status())));
        }
        response.json().await.map_err(|e| self.failed(format!("{url}: {e}")))
    }

    /// The provider's discovery document, read at most every hour.
    pub async fn metadata(&self) -> Result<Arc<Metadata>, Error> {
        let mut cache = self.cache.lock().await;
        self.metadata_locked(&mut cache).await
    }

    async fn metadata_locked(&self, cache: &mut Cached) -> Result<Arc<Metadata>, Error> {
        if let Some((metadata, read)) = &cache.metadata {
            if read.elapsed() < METADATA_TTL {
                return Ok(metadata.clone());
            }
        }
        let url = format!("{}/.well-known/openid-configuration", self.issuer.trim_end_matches('/'));
        let metadata: Metadata = self.get_json(&url).await?;
        // Discovery §4.3: the document must name the issuer it was read for.
        if metadata.issuer != self.issuer {
            return Err(self.failed(format!("discovery names the issuer {:?}", metadata.issuer)));
        }
        let metadata = Arc::new(metadata);
        cache.metadata = Some((metadata.clone(), Instant::now()));
        Ok(metadata)
    }

    /// Verifies `token` as this issuer's (see [`verify`]), reading the JWKS again once when
    /// the token names a key it does not hold.
    pub async fn verify(&self, token: &str, expected: &Expected<'_>) -> Result<Map<String, Value>, Error> {
        let header = verify::header(token, expected.algorithms)?;
        let mut cache = self.cache.lock().await;
        let key = match cache.jwks.as_ref().and_then(|(keys, _)| verify::key_for(keys, &header)) {
            Some(key) => key,
            None => {
                if let Some(wait) =
                    cache.jwks.as_ref().and_then(|(_, read)| JWKS_REREAD_FLOOR.checked_sub(read.elapsed()))
                {
                    tokio::time::sleep(wait).await;
                }
                let metadata = self.metadata_locked(&mut cache).await?;
                let keys: JwkSet = self.get_json(&metadata.jwks_uri).await?;
                let keys = Arc::new(keys);
                cache.jwks = Some((keys.clone(), Instant::now()));
                verify::key_for(&keys, &header).ok_or(Refusal::UnknownKey)?
            }
        };
        drop(cache);
        Ok(verify::claims(token, &header, &key, expected)?)
    }

    /// Redeems an authorization code at the token endpoint (client_secret_basic, with the
    /// PKCE verifier) for the ID token.
    pub async fn redeem(&self, client: &Client<'_>, code: &str, verifier: &str) -> Result<String, Error> {
        let metadata = self.metadata().await?;
        let endpoint =
            metadata.token_endpoint.as_deref().ok_or_else(|| self.failed("discovery names no token endpoint"))?;
        // RFC 6749 §2.3.1: both halves form-encoded before they are joined and encoded.
        let encode = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        let basic = base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{}",
            encode(client.id),
            encode(client.secret)
        ));
        let form = [
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", client.redirect_uri),
            ("code_verifier", verifier),
        ];
        let response = self
            .http
            .post(endpoint)
            .header(reqwest::header::AUTHORIZATION, format!("Basic {basic}"))
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(serde_urlencoded::to_string(form).unwrap_or_default())
            .send()
            .await
            .map_err(|e| self.failed(format!("token endpoint: {e}")))?;
        let status = response.status();
        let body: Map<String, Value> =
            response.json().await.map_err(|e| self.failed(format!("token endpoint: {e}")))?;
        if !status.is_success() {
            let error = body.get("error").and_then(Value::as_str).unwrap_or("unknown");
            if status.is_client_error() && error == "invalid_grant" {
                return Err(Error::Grant(error.to_owned()));
            }
            return Err(self.failed(format!("the token endpoint answered {status} ({error})")));
        }
        body.get("id_token")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| self.failed("the token endpoint returned no ID token"))
    }
}

/// Fairway as a provider's client.
#[derive(Debug, Clone, Copy)]
pub struct Client<'a> {
    /// The client id.
    pub id: &'a str,
    /// The client secret.
    pub secret: &'a str,
    /// Where the provider sends people back with a code.
    pub redirect_uri: &'a str,
}

/// What one sign-in sends and must find again: `state` ties the answer to this browser,
/// `nonce` the ID token to this request, the PKCE verifier the code to this client.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The `state` parameter.
    pub state: String,
    /// The `nonce` parameter.
    pub nonce: String,
    /// The PKCE code verifier (RFC 7636), 43 characters.
    pub verifier: String,
}

impl Attempt {
    /// Fresh random values, 256 bits each.
    pub fn new() -> Self {
        let random = || base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>());
        Self { state: random(), nonce: random(), verifier: random() }
    }

    /// The S256 code challenge of the verifier.
    pub fn challenge(&self) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(self.verifier.as_bytes()))
    }

    /// The authorization request to send the browser to.
    pub fn authorization_url(&self, endpoint: &str, client: &Client<'_>, scopes: &str) -> String {
        let query = serde_urlencoded::to_string([
            ("response_type", "code"),
            ("client_id", client.id),
            ("redirect_uri", client.redirect_uri),
            ("scope", scopes),
            ("state", &self.state),
            ("nonce", &self.nonce),
            ("code_challenge", &self.challenge()),
            ("code_challenge_method", "S256"),
        ])
        .unwrap_or_default();
        let joiner = if endpoint.contains('?') { '&' } else { '?' };
        format!("{endpoint}{joiner}{query}")
    }
}

impl Default for Attempt {
    fn default() -> Self {
        Self::new()
    }
}

/// RP-initiated logout (OpenID Connect RP-Initiated Logout 1.0 §2): where to send the browser
/// so the provider ends its session too, and then back to `post_logout`.
pub fn end_session_url(endpoint: &str, id_token_hint: &str, client_id: &str, post_logout: &str) -> String {
    let query = serde_urlencoded::to_string([
        ("id_token_hint", id_token_hint),
        ("client_id", client_id),
        ("post_logout_redirect_uri", post_logout),
    ])
    .unwrap_or_default();
    let joiner = if endpoint.contains('?') { '&' } else { '?' };
    format!("{endpoint}{joiner}{query}")
}

/// The algorithm named `name` as configuration spells it (`RS256`, `ES256`, `EdDSA`, ...);
/// symmetric algorithms are not offered: a provider's keys are public.
pub fn algorithm(name: &str) -> Option<Algorithm> {
    let alg: Algorithm = name.parse().ok()?;
    (!matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512)).then_some(alg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pkce_challenge_is_rfc_7636s_example() {
        let attempt = Attempt {
            state: String::new(),
            nonce: String::new(),
            verifier: "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk".into(),
        };
        assert_eq!(attempt.challenge(), "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
    }

    #[test]
    fn the_authorization_request_carries_state_nonce_and_the_s256_challenge() {
        let attempt = Attempt::new();
        let client = Client { id: "fairway", secret: "s", redirect_uri: "https://f.example/login/oidc/corp/callback" };
        let url = attempt.authorization_url("https://idp.example/auth", &client, "openid groups");
        let query: HashMap<String, String> =
            form_urlencoded::parse(url.split_once('?').unwrap().1.as_bytes()).into_owned().collect();
        assert_eq!(query["state"], attempt.state);
        assert_eq!(query["nonce"], attempt.nonce);
        assert_eq!(query["code_challenge"], attempt.challenge());
        assert_eq!(query["code_challenge_method"], "S256");
        assert_eq!(query["redirect_uri"], client.redirect_uri);
        assert_ne!(attempt.state, attempt.nonce);
    }

    #[test]
    fn only_asymmetric_algorithms_can_be_configured() {
        assert_eq!(algorithm("RS256"), Some(Algorithm::RS256));
        assert_eq!(algorithm("EdDSA"), Some(Algorithm::EdDSA));
        assert_eq!(algorithm("HS256"), None);
        assert_eq!(algorithm("none"), None);
    }
}
