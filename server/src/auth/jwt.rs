//! Short-lived access tokens: JWTs signed with HS256 (pinned: the algorithm in a token's
//! header is never trusted), carrying `iss`, `aud`, `sub`, `iat`, `nbf`, `exp` and a `jti`,
//! all required and validated. The header's `kid` names the signing key, so keys rotate by
//! adding a new current key and keeping the old one for verification until its tokens expire.

use crate::domain::UserId;
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use uuid::Uuid;

/// Clock skew tolerated on `exp` and `nbf`.
const LEEWAY_SECONDS: u64 = 5;

/// The `typ` of our access tokens (RFC 9068): a token signed with the same key for another
/// purpose is never taken for one.
const ACCESS_TOKEN_TYPE: &str = "at+jwt";

/// Claims of an access token.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    /// Issuer.
    pub iss: String,
    /// Audience.
    pub aud: String,
    /// The user's id.
    pub sub: String,
    /// Issued at (seconds since the epoch).
    pub iat: i64,
    /// Not before.
    pub nbf: i64,
    /// Expires at.
    pub exp: i64,
    /// Token id.
    pub jti: String,
}

/// The keys that sign and verify access tokens.
pub struct JwtKeys {
    kid: String,
    encoding: EncodingKey,
    decoding: Vec<(String, DecodingKey)>,
    issuer: String,
    audience: String,
    ttl: Duration,
}

impl std::fmt::Debug for JwtKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtKeys").field("kid", &self.kid).field("issuer", &self.issuer).finish_non_exhaustive()
    }
}

/// The key id of a secret: the first 8 bytes of its SHA-256, in hex. Stable across
/// restarts, reveals nothing usable about the key.
pub fn key_id(secret: &[u8]) -> String {
    sha2::Sha256::digest(secret)[..8].iter().map(|b| format!("{b:02x}")).collect()
}

impl JwtKeys {
    /// Keys signing with `current` and also accepting tokens signed with `previous`.
    pub fn new(current: &[u8], previous: &[Vec<u8>], issuer: &str, audience: &str, ttl: Duration) -> Self {
        let mut decoding = vec![(key_id(current), DecodingKey::from_secret(current))];
        decoding.extend(previous.iter().map(|k| (key_id(k), DecodingKey::from_secret(k))));
        Self {
            kid: key_id(current),
            encoding: EncodingKey::from_secret(current),
            decoding,
            issuer: issuer.into(),
            audience: audience.into(),
            ttl,
        }
    }

    /// Lifetime of issued tokens.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Issues a token for `user_id`, valid from `now` for the configured lifetime.
    pub fn issue(&self, user_id: UserId, now: i64) -> String {
        let claims = Claims {
            iss: self.issuer.clone(),
            aud: self.audience.clone(),
            sub: user_id.to_string(),
            iat: now,
            nbf: now,
            exp: now + self.ttl.as_secs() as i64,
            jti: Uuid::new_v4().to_string(),
        };
        let mut header = Header::new(Algorithm::HS256);
        header.typ = Some(ACCESS_TOKEN_TYPE.to_owned());
        header.kid = Some(self.kid.clone());
        // HMAC signing of a serializable struct cannot fail.
        jsonwebtoken::encode(&header, &claims, &self.encoding).expect("HS256 signing cannot fail")
    }

    /// Verifies type, signature, algorithm, key id, issuer, audience, expiry and not-before.
    pub fn verify(&self, token: &str) -> Option<Claims> {
        let header = jsonwebtoken::decode_header(token).ok()?;
        if header.alg != Algorithm::HS256 || !header.typ.is_some_and(|t| t.eq_ignore_ascii_case(ACCESS_TOKEN_TYPE)) {
            return None;
        }
        let kid = header.kid?;
        let (_, key) = self.decoding.iter().find(|(id, _)| *id == kid)?;
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "nbf", "iss", "aud", "sub"]);
        validation.validate_nbf = true;
        validation.leeway = LEEWAY_SECONDS;
        jsonwebtoken::decode::<Claims>(token, key, &validation).ok().map(|data| data.claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(secret: &[u8]) -> JwtKeys {
        JwtKeys::new(secret, &[], "fairway", "fairway-api", Duration::from_secs(900))
    }

    #[test]
    fn a_token_verifies_until_it_expires() {
        let k = keys(&[1; 32]);
        let now = chrono::Utc::now().timestamp();
        let user = UserId::new();
        let claims = k.verify(&k.issue(user, now)).unwrap();
        assert_eq!(claims.sub, user.to_string());
        assert!(k.verify(&k.issue(user, now - 1000)).is_none(), "expired");
        assert!(k.verify(&k.issue(user, now + 1000)).is_none(), "not yet valid");
    }

    #[test]
    fn a_signed_token_of_another_type_is_not_an_access_token() {
        let k = keys(&[1; 32]);
        let now = chrono::Utc::now().timestamp();
        let claims = k.verify(&k.issue(UserId::new(), now)).unwrap();
        for typ in [None, Some("JWT"), Some("id+jwt")] {
            let mut header = Header::new(Algorithm::HS256);
            header.typ = typ.map(str::to_owned);
            header.kid = Some(k.kid.clone());
            let token = jsonwebtoken::encode(&header, &claims, &k.encoding).unwrap();
            assert!(k.verify(&token).is_none(), "typ {typ:?} was accepted");
        }
    }

    #[test]
    fn tokens_of_a_previous_key_verify_after_rotation_and_unknown_keys_do_not() {
        let old = keys(&[1; 32]);
        let rotated = JwtKeys::new(&[2; 32], &[vec![1; 32]], "fairway", "fairway-api", Duration::from_secs(900));
        let now = chrono::Utc::now().timestamp();
        let token = old.issue(UserId::new(), now);
        assert!(rotated.verify(&token).is_some());
        assert!(keys(&[3; 32]).verify(&token).is_none());
    }
}
