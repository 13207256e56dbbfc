//! Text the database cannot store is refused at the door, for every route at once.
//!
//! PostgreSQL `text` holds neither NUL characters nor invalid UTF-8. A path or query that
//! decodes to either, or a JSON body carrying `\u0000`, would otherwise travel to a query and
//! come back as a database error, a 500. Here it is a 400 (path, query) or 422 (a body field)
//! problem naming where the bad text is.

use axum::{extract::Request, middleware::Next, response::IntoResponse as _, response::Response};

use super::error::ApiError;

/// Refuses a request whose path or query decodes to a NUL or to invalid UTF-8.
pub async fn refuse_unstorable_text(request: Request, next: Next) -> Response {
    let uri = request.uri();
    for (part, raw) in [("path", uri.path()), ("query", uri.query().unwrap_or(""))] {
        if let Err(detail) = check(raw) {
            return ApiError::MalformedRequest { field: part.to_owned(), detail: format!("the {part} {detail}") }
                .into_response();
        }
    }
    next.run(request).await
}

/// Whether percent-encoded `raw` decodes to storable text; else what is wrong with it.
fn check(raw: &str) -> Result<(), &'static str> {
    let decoded = percent_decode(raw);
    if decoded.contains(&0) {
        return Err("contains a NUL character (%00)");
    }
    if std::str::from_utf8(&decoded).is_err() {
        return Err("is not valid UTF-8 once percent-decoded");
    }
    Ok(())
}

/// `raw` with each `%XX` replaced by its byte; a `%` not followed by two hex digits stays.
fn percent_decode(raw: &str) -> Vec<u8> {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push(u8::try_from(h * 16 + l).unwrap_or(0));
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    out
}

/// Whether a JSON text escapes a NUL character (`\u0000` after an odd run of backslashes).
/// Raw NUL bytes are not valid JSON at all, so this is the only way one can arrive.
pub fn json_has_nul(bytes: &[u8]) -> bool {
    let pattern = b"u0000";
    bytes
        .windows(pattern.len())
        .enumerate()
        .any(|(at, window)| window == pattern && bytes[..at].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 1)
}

/// The JSON path (`a.b[2]`) of the first string, or object key, holding a NUL.
pub fn nul_path(value: &serde_json::Value) -> Option<String> {
    nul_suffix(value).map(|mut path| {
        if path.starts_with('.') {
            path.remove(0);
        }
        path
    })
}

/// The path below `value` of its first NUL, each step with its separator (`.key`, `[2]`), so
/// that a string under an empty key (`env.`) is told apart from the map holding it (`env`).
fn nul_suffix(value: &serde_json::Value) -> Option<String> {
    use serde_json::Value;
    match value {
        Value::String(s) => s.contains('\0').then(String::new),
        Value::Array(items) => {
            items.iter().enumerate().find_map(|(i, v)| nul_suffix(v).map(|rest| format!("[{i}]{rest}")))
        }
        Value::Object(map) => map.iter().find_map(|(k, v)| {
            if k.contains('\0') {
                return Some(format!(".{}", k.replace('\0', "\\u0000")));
            }
            nul_suffix(v).map(|rest| format!(".{k}{rest}"))
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_and_invalid_utf8_are_found_through_percent_encoding() {
        assert!(check("/api/v1/teams/a%00b").is_err());
        assert!(check("/api/v1/jobs/%ff").is_err());
        assert!(check("/api/v1/jobs/%FF%FE").is_err());
        assert_eq!(check("/api/v1/teams/ml%2Dresearch"), Ok(()));
        assert_eq!(check("/api/v1/teams/caf%C3%A9"), Ok(()));
        assert_eq!(check("label=a%3Db&x=100%"), Ok(()), "a stray % is left as it is");
    }

    #[test]
    fn an_escaped_nul_is_found_and_named_but_an_escaped_backslash_is_not_one() {
        assert!(json_has_nul(br#"{"gpu_class": "h\u0000100"}"#));
        assert!(!json_has_nul(br#"{"note": "a literal \\u0000"}"#));
        assert!(json_has_nul(br#"{"note": "\\\u0000"}"#));
        let value: serde_json::Value =
            serde_json::from_str(r#"{"jobs": [{"name": "a"}, {"labels": {"k": "v\u0000"}}]}"#).unwrap();
        assert_eq!(nul_path(&value).as_deref(), Some("jobs[1].labels.k"));
        let empty_key: serde_json::Value = serde_json::from_str(r#"{"env": {"": "\u0000"}}"#).unwrap();
        assert_eq!(nul_path(&empty_key).as_deref(), Some("env."));
        let nul_key: serde_json::Value = serde_json::from_str(r#"{"env": {"A\u0000": "x"}}"#).unwrap();
        assert_eq!(nul_path(&nul_key).as_deref(), Some("env.A\\u0000"));
    }
}
