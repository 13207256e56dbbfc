//! Portal sessions: a random secret in an `HttpOnly`, `SameSite=Lax` cookie, its SHA-256 in
//! the database, and a per-session token every form must echo (CSRF). A form post is also
//! refused when the browser says it comes from another origin.

use axum::http::{header, HeaderMap, HeaderValue};
use base64::Engine as _;
use sha2::{Digest, Sha256};

use crate::{db, state::AppState};

/// How long a portal session lasts.
pub const SESSION_HOURS: i64 = 12;

/// The cookie's name. `__Host-` (which browsers accept only with `Secure`, no domain and
/// path `/`) when the service is reached over TLS.
pub fn cookie_name(secure: bool) -> &'static str {
    if secure {
        "__Host-fairway_session"
    } else {
        "fairway_session"
    }
}

/// Whether the request reached us over TLS (directly or through a proxy that says so).
pub fn is_secure(headers: &HeaderMap) -> bool {
    headers.get("x-forwarded-proto").and_then(|v| v.to_str().ok()) == Some("https")
}

/// A random token, URL-safe.
pub fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// What the database keeps of a session secret.
pub fn secret_hash(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

/// The `Set-Cookie` value for a new session (`None`: one that clears it).
pub fn set_cookie(secret: Option<&str>, secure: bool) -> HeaderValue {
    let name = cookie_name(secure);
    let secure_attr = if secure { "; Secure" } else { "" };
    let value = match secret {
        Some(s) => format!("{name}={s}; Path=/; HttpOnly; SameSite=Lax; Max-Age={}{secure_attr}", SESSION_HOURS * 3600),
        None => format!("{name}=; Path=/; HttpOnly; SameSite=Lax; Max-Age=0{secure_attr}"),
    };
    // Built only from a URL-safe token and fixed text: always a valid header value.
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("fairway_session=; Max-Age=0"))
}

/// The cookie that holds a sign-in's `state` while the person is at the provider.
const SIGN_IN_COOKIE: &str = "fairway_sign_in";

/// The `Set-Cookie` value that keeps a provider sign-in's `state` for ten minutes, seen only
/// under `/login/oidc/` (`None`: one that clears it). `SameSite=Lax` still sends it on the
/// provider's top-level redirect back.
pub fn sign_in_cookie(state: Option<&str>, secure: bool) -> HeaderValue {
    let secure_attr = if secure { "; Secure" } else { "" };
    let (value, age) = state.map_or(("", 0), |s| (s, 600));
    let cookie =
        format!("{SIGN_IN_COOKIE}={value}; Path=/login/oidc/; HttpOnly; SameSite=Lax; Max-Age={age}{secure_attr}");
    HeaderValue::from_str(&cookie).unwrap_or_else(|_| HeaderValue::from_static("fairway_sign_in=; Max-Age=0"))
}

/// The sign-in `state` the request's cookie holds.
pub fn sign_in_state_of(headers: &HeaderMap) -> Option<String> {
    cookie(headers, |name| name == SIGN_IN_COOKIE)
}

fn cookie(headers: &HeaderMap, wanted: impl Fn(&str) -> bool) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| wanted(name))
        .map(|(_, value)| value.to_owned())
        .filter(|v| !v.is_empty())
}

/// The session secret the request carries, under either cookie name.
pub fn secret_of(headers: &HeaderMap) -> Option<String> {
    cookie(headers, |name| name == cookie_name(true) || name == cookie_name(false))
}

/// The signed-in user of the request, if its session is live.
pub async fn user(state: &AppState, headers: &HeaderMap) -> Result<Option<db::web_sessions::SessionUser>, sqlx::Error> {
    match secret_of(headers) {
        Some(secret) => db::web_sessions::find(&state.db, &secret_hash(&secret)).await,
        None => Ok(None),
    }
}

/// Whether a form post may act for the session: its token matches (compared in constant
/// time) and, when the browser names the origin, it is this site.
pub fn form_allowed(headers: &HeaderMap, session_token: &str, form_token: &str) -> bool {
    let same_token = !session_token.is_empty()
        && session_token.len() == form_token.len()
        && session_token.bytes().zip(form_token.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0;
    same_token && same_origin(headers)
}

/// False when the browser says the request comes from another origin than this host.
pub fn same_origin(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    match headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        None => true,
        Some(origin) => {
            let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest);
            host.is_some_and(|h| h == origin_host)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn a_form_needs_the_sessions_token_and_no_foreign_origin() {
        let same = headers(&[("host", "fairway.example"), ("origin", "https://fairway.example")]);
        assert!(form_allowed(&same, "abc", "abc"));
        assert!(!form_allowed(&same, "abc", "abd"));
        assert!(!form_allowed(&same, "abc", ""));
        let foreign = headers(&[("host", "fairway.example"), ("origin", "https://evil.example")]);
        assert!(!form_allowed(&foreign, "abc", "abc"));
    }

    #[test]
    fn the_session_cookie_is_http_only_and_lax_and_secure_behind_tls() {
        let plain = set_cookie(Some("s3cret"), false);
        assert_eq!(plain.to_str().unwrap(), "fairway_session=s3cret; Path=/; HttpOnly; SameSite=Lax; Max-Age=43200");
        let tls = set_cookie(Some("s3cret"), true);
        assert!(tls.to_str().unwrap().starts_with("__Host-fairway_session=s3cret; Path=/; HttpOnly; SameSite=Lax"));
        assert!(tls.to_str().unwrap().ends_with("; Secure"));
        let cookies = headers(&[("cookie", "theme=dark; fairway_session=s3cret")]);
        assert_eq!(secret_of(&cookies).as_deref(), Some("s3cret"));
    }
}
