//! ID token verification by the book (OpenID Connect Core 1.0 §3.1.3.7): the signature with a
//! key of the issuer's JWKS chosen by `kid`, an algorithm from the configured list only (never
//! `none`, never a symmetric one: the JWKS is public), then issuer, audience (and `azp` when
//! there are several), expiry, issue time and, for sign-ins, the nonce. Pure: the keys come in.

use jsonwebtoken::{
    jwk::{AlgorithmParameters, Jwk, JwkSet},
    Algorithm, DecodingKey, Validation,
};
use serde_json::{Map, Value};

/// Clock skew tolerated on `exp`, `nbf` and `iat`.
const LEEWAY_SECONDS: u64 = 30;

/// What a token must say to be accepted.
#[derive(Debug, Clone)]
pub struct Expected<'a> {
    /// The issuer, exactly.
    pub issuer: &'a str,
    /// Our client id (sign-in) or the audience a trust policy names (CI).
    pub audience: &'a str,
    /// The signature algorithms the configuration allows.
    pub algorithms: &'a [Algorithm],
    /// The nonce sent with the authorization request, for sign-ins.
    pub nonce: Option<&'a str>,
}

/// Why a token was refused. The words are for the audit log and the person signing in; none
/// carries the token itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Not a JWS in compact form, or its header or claims are not JSON.
    #[error("the token is not a signed JWT")]
    Malformed,
    /// `alg` is `none`, symmetric, or not in the configured list.
    #[error("the token is signed with {0}, which is not allowed")]
    Algorithm(String),
    /// No key of the issuer's JWKS has the token's `kid` (after reading the JWKS again).
    #[error("the token's signing key is not one of the issuer's")]
    UnknownKey,
    /// The signature does not verify.
    #[error("the token's signature does not verify")]
    Signature,
    /// `iss` is not the expected issuer.
    #[error("the token was issued by another issuer")]
    Issuer,
    /// `aud` does not hold the expected audience, or `azp` names another party.
    #[error("the token is meant for another audience")]
    Audience,
    /// `exp` has passed.
    #[error("the token has expired")]
    Expired,
    /// `nbf` or `iat` is in the future.
    #[error("the token is not valid yet")]
    NotYetValid,
    /// The nonce is missing or not the one this sign-in sent.
    #[error("the token's nonce is not this sign-in's")]
    Nonce,
    /// A claim the specification requires is missing or of the wrong type.
    #[error("the token lacks the claim {0}")]
    MissingClaim(&'static str),
}

/// The `kid` and `alg` of a token's header, read without trusting anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The key id, if the token names one.
    pub kid: Option<String>,
    /// The algorithm the token says it is signed with.
    pub alg: Algorithm,
}

/// Reads the header, refusing `none` and algorithms outside `allowed` before any key is looked
/// at. `alg: none` is refused here by name: `jsonwebtoken` has no such algorithm at all.
pub fn header(token: &str, allowed: &[Algorithm]) -> Result<Header, Refusal> {
    use base64::Engine as _;
    let encoded = token.split('.').next().ok_or(Refusal::Malformed)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(encoded).map_err(|_| Refusal::Malformed)?;
    let raw: Map<String, Value> = serde_json::from_slice(&bytes).map_err(|_| Refusal::Malformed)?;
    let alg_name = raw.get("alg").and_then(Value::as_str).ok_or(Refusal::Malformed)?;
    let parsed =
        jsonwebtoken::decode_header(token).map_err(|_| Refusal::Algorithm(alg_name.chars().take(16).collect()))?;
    let symmetric = matches!(parsed.alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512);
    if symmetric || !allowed.contains(&parsed.alg) {
        return Err(Refusal::Algorithm(format!("{:?}", parsed.alg)));
    }
    Ok(Header { kid: parsed.kid, alg: parsed.alg })
}

/// The key of `keys` that verifies a token with `header`: the one with its `kid`, or, when the
/// token names none, the only signing key of the right type. `None`: read the JWKS again.
pub fn key_for(keys: &JwkSet, header: &Header) -> Option<DecodingKey> {
    let usable = |jwk: &&Jwk| fits(jwk, header.alg);
    let jwk = match &header.kid {
        Some(kid) => keys.keys.iter().filter(usable).find(|k| k.common.key_id.as_deref() == Some(kid.as_str()))?,
        None => {
            let mut candidates = keys.keys.iter().filter(usable);
            let only = candidates.next()?;
            if candidates.next().is_some() {
                return None;
            }
            only
        }
    };
    DecodingKey::from_jwk(jwk).ok()
}

/// Whether `jwk` may verify `alg`: an asymmetric key of the algorithm's family, meant for
/// signatures, and for that algorithm when it names one.
fn fits(jwk: &Jwk, alg: Algorithm) -> bool {
    use jsonwebtoken::jwk::PublicKeyUse;
    let family = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => {
            matches!(
                alg,
                Algorithm::RS256
                    | Algorithm::RS384
                    | Algorithm::RS512
                    | Algorithm::PS256
                    | Algorithm::PS384
                    | Algorithm::PS512
            )
        }
        AlgorithmParameters::EllipticCurve(_) => matches!(alg, Algorithm::ES256 | Algorithm::ES384),
        AlgorithmParameters::OctetKeyPair(_) => alg == Algorithm::EdDSA,
        AlgorithmParameters::OctetKey(_) => false,
    };
    let for_signing = !matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption));
    let same_alg = jwk.common.key_algorithm.is_none_or(|k| format!("{k:?}") == format!("{alg:?}"));
    family && for_signing && same_alg
}

/// Verifies `token`'s signature with `key` and its claims against `expected`; its claims.
pub fn claims(
    token: &str,
    header: &Header,
    key: &DecodingKey,
    expected: &Expected<'_>,
) -> Result<Map<String, Value>, Refusal> {
    let mut validation = Validation::new(header.alg);
    // Checked below, in order, so that each refusal says what is wrong.
    validation.validate_exp = false;
    validation.validate_aud = false;
    validation.required_spec_claims.clear();
    let data = jsonwebtoken::decode::<Map<String, Value>>(token, key, &validation).map_err(|e| {
        use jsonwebtoken::errors::ErrorKind;
        match e.kind() {
            ErrorKind::InvalidSignature => Refusal::Signature,
            ErrorKind::InvalidAlgorithm => Refusal::Algorithm(format!("{:?}", header.alg)),
            _ => Refusal::Malformed,
        }
    })?;
    let claims = data.claims;
    check(&claims, expected, chrono::Utc::now().timestamp())?;
    Ok(claims)
}

/// The claim checks after the signature, at `now` (seconds since the epoch).
fn check(claims: &Map<String, Value>, expected: &Expected<'_>, now: i64) -> Result<(), Refusal> {
    let leeway = LEEWAY_SECONDS as i64;
    let number = |name: &'static str| claims.get(name).and_then(Value::as_i64).ok_or(Refusal::MissingClaim(name));
    let iss = claims.get("iss").and_then(Value::as_str).ok_or(Refusal::MissingClaim("iss"))?;
    if iss != expected.issuer {
        return Err(Refusal::Issuer);
    }
    claims.get("sub").and_then(Value::as_str).filter(|s| !s.is_empty()).ok_or(Refusal::MissingClaim("sub"))?;
    let audiences: Vec<&str> = match claims.get("aud") {
        Some(Value::String(one)) => vec![one.as_str()],
        Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).collect(),
        _ => return Err(Refusal::MissingClaim("aud")),
    };
    if !audiences.contains(&expected.audience) {
        return Err(Refusal::Audience);
    }
    // With several audiences, the authorized party must be us (Core §3.1.3.7, 4–5).
    let azp = claims.get("azp").and_then(Value::as_str);
    if (audiences.len() > 1 && azp.is_none()) || azp.is_some_and(|p| p != expected.audience) {
        return Err(Refusal::Audience);
    }
    if number("exp")? + leeway <= now {
        return Err(Refusal::Expired);
    }
    if number("iat")? - leeway > now || claims.get("nbf").and_then(Value::as_i64).is_some_and(|nbf| nbf - leeway > now)
    {
        return Err(Refusal::NotYetValid);
    }
    if let Some(nonce) = expected.nonce {
        let sent = claims.get("nonce").and_then(Value::as_str).ok_or(Refusal::Nonce)?;
        if !constant_time_eq(sent.as_bytes(), nonce.as_bytes()) {
            return Err(Refusal::Nonce);
        }
    }
    Ok(())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;
    use jsonwebtoken::{EncodingKey, Header as JwtHeader};
    use serde_json::json;

    const ISSUER: &str = "https://idp.example";

    fn jwks() -> JwkSet {
        serde_json::from_value(json!({"keys": [{
            "kty": "RSA", "kid": "k1", "use": "sig", "alg": "RS256",
            "n": include_str!("testdata/key.n").trim(), "e": "AQAB"
        }]}))
        .unwrap()
    }

    fn base_claims() -> Map<String, Value> {
        let now = chrono::Utc::now().timestamp();
        json!({"iss": ISSUER, "sub": "alice", "aud": "fairway", "iat": now, "exp": now + 300, "nonce": "n-1"})
            .as_object()
            .unwrap()
            .clone()
    }

    fn sign(claims: &Map<String, Value>, key: &[u8], kid: Option<&str>) -> String {
        let mut header = JwtHeader::new(Algorithm::RS256);
        header.kid = kid.map(str::to_owned);
        jsonwebtoken::encode(&header, claims, &EncodingKey::from_rsa_der(key)).unwrap()
    }

    fn verify(token: &str) -> Result<Map<String, Value>, Refusal> {
        let expected =
            Expected { issuer: ISSUER, audience: "fairway", algorithms: &[Algorithm::RS256], nonce: Some("n-1") };
        let header = header(token, expected.algorithms)?;
        let key = key_for(&jwks(), &header).ok_or(Refusal::UnknownKey)?;
        claims(token, &header, &key, &expected)
    }

    fn with(change: impl FnOnce(&mut Map<String, Value>)) -> String {
        let mut claims = base_claims();
        change(&mut claims);
        sign(&claims, include_bytes!("testdata/key.der"), Some("k1"))
    }

    #[test]
    fn a_token_signed_by_the_issuers_key_for_us_verifies() {
        let claims = verify(&with(|_| {})).unwrap();
        assert_eq!(claims["sub"], "alice");
        let no_kid = sign(&base_claims(), include_bytes!("testdata/key.der"), None);
        assert!(verify(&no_kid).is_ok(), "the only key of the set is used when the token names none");
    }

    #[test]
    fn wrong_issuer_audience_expiry_and_nonce_are_each_refused_by_name() {
        assert_eq!(verify(&with(|c| _ = c.insert("iss".into(), json!("https://evil.example")))), Err(Refusal::Issuer));
        assert_eq!(verify(&with(|c| _ = c.insert("aud".into(), json!("someone-else")))), Err(Refusal::Audience));
        assert_eq!(
            verify(&with(|c| _ = c.insert("aud".into(), json!(["fairway", "other"])))),
            Err(Refusal::Audience),
            "several audiences need azp naming us"
        );
        assert!(verify(&with(|c| {
            c.insert("aud".into(), json!(["fairway", "other"]));
            c.insert("azp".into(), json!("fairway"));
        }))
        .is_ok());
        let now = chrono::Utc::now().timestamp();
        assert_eq!(verify(&with(|c| _ = c.insert("exp".into(), json!(now - 120)))), Err(Refusal::Expired));
        assert_eq!(verify(&with(|c| _ = c.insert("iat".into(), json!(now + 600)))), Err(Refusal::NotYetValid));
        assert_eq!(verify(&with(|c| _ = c.insert("nonce".into(), json!("n-2")))), Err(Refusal::Nonce));
        assert_eq!(verify(&with(|c| _ = c.remove("nonce"))), Err(Refusal::Nonce));
        assert_eq!(verify(&with(|c| _ = c.remove("exp"))), Err(Refusal::MissingClaim("exp")));
    }

    #[test]
    fn alg_none_symmetric_algorithms_and_unlisted_ones_are_refused_before_any_key() {
        let b64 = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let unsigned = format!("{}.{}.", b64(json!({"alg": "none"})), b64(Value::Object(base_claims())));
        assert_eq!(verify(&unsigned), Err(Refusal::Algorithm("none".into())));
        // HS256 keyed with the public modulus: the classic confusion attack.
        let mut header = JwtHeader::new(Algorithm::HS256);
        header.kid = Some("k1".into());
        let hs =
            jsonwebtoken::encode(&header, &base_claims(), &EncodingKey::from_secret(include_bytes!("testdata/key.n")))
                .unwrap();
        assert_eq!(verify(&hs), Err(Refusal::Algorithm("HS256".into())));
        let token = with(|_| {});
        assert_eq!(header_of(&token, &[Algorithm::ES256]), Err(Refusal::Algorithm("RS256".into())));
    }

    fn header_of(token: &str, allowed: &[Algorithm]) -> Result<Header, Refusal> {
        header(token, allowed)
    }

    #[test]
    fn a_key_the_jwks_does_not_hold_and_a_forged_signature_are_refused() {
        let foreign = sign(&base_claims(), include_bytes!("testdata/other.der"), Some("k2"));
        assert_eq!(verify(&foreign), Err(Refusal::UnknownKey));
        let posing = sign(&base_claims(), include_bytes!("testdata/other.der"), Some("k1"));
        assert_eq!(verify(&posing), Err(Refusal::Signature));
        assert_eq!(verify("not.a.jwt"), Err(Refusal::Malformed));
    }
}
