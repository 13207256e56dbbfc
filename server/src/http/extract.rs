//! Request extractors that enforce the API conventions: JSON bodies with unknown fields
//! rejected and the failing field named, `If-Match` preconditions, cursor pagination.

use axum::{
    body::Bytes,
    extract::{FromRequest, FromRequestParts, Request},
    http::{header, request::Parts, HeaderMap, HeaderValue},
};
use base64::Engine as _;
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{error::ApiError, objects_only::ObjectsOnly};
use crate::{domain::FieldError, ops::Precondition, state::AppState};

/// A JSON request body. Requires `Content-Type: application/json` (415 otherwise), respects
/// the body limit (413), and reports the JSON path of a bad or unknown field (422), or the
/// syntax error position (400).
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !is_json(req.headers()) {
            return Err(ApiError::UnsupportedMediaType);
        }
        parse_json(&body(req, state).await?).map(ApiJson)
    }
}

/// The request's body, within the body limit (413 above it).
pub async fn body<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|rejection| {
        if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge
        } else {
            ApiError::MalformedBody { field: None, detail: rejection.body_text() }
        }
    })
}

fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let mime = value.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json"))
}

/// Parses JSON, naming the failing field. Syntax errors are 400; wrong shapes, wrong
/// types and unknown fields are 422 with the field's JSON path.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // A NUL cannot be stored; name the field that carries one (see `http::hostile`).
    if super::hostile::json_has_nul(bytes) {
        if let Some(path) = serde_json::from_slice(bytes).ok().as_ref().and_then(super::hostile::nul_path) {
            let field = if path.is_empty() { "body".to_owned() } else { path };
            return Err(ApiError::field(FieldError::new(
                field,
                "control_character",
                "must not contain NUL characters",
            )));
        }
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(ObjectsOnly(&mut de)).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let field = if path == "." || path.is_empty() { None } else { Some(path) };
        match inner.classify() {
            serde_json::error::Category::Data => {
                let message = inner.to_string();
                // serde_json puts the position last; a key may hold the same words.
                let message = message.rsplit_once(" at line ").map_or(message.as_str(), |(m, _)| m).to_owned();
                let field_name = field.clone().unwrap_or_else(|| "body".into());
                let code = if message.starts_with("unknown field") {
                    "unknown_field"
                } else if message.starts_with("missing field") {
                    "missing_field"
                } else {
                    "invalid_value"
                };
                // serde reports an unknown or missing field at its parent's path; name the
                // field itself so the client sees exactly which key is wrong.
                let field_name = match (code, named_field(&message), &field) {
                    ("unknown_field" | "missing_field", Some(key), None) => key.to_owned(),
                    ("unknown_field" | "missing_field", Some(key), Some(path))
                        if path != key && !path.ends_with(&format!(".{key}")) =>
                    {
                        format!("{path}.{key}")
                    }
                    _ => field_name,
                };
                ApiError::field(FieldError::new(field_name, code, message))
            }
            _ => ApiError::MalformedBody { field, detail: format!("the body is not valid JSON: {inner}") },
        }
    })?;
    // Trailing data after the value is a syntax error too.
    de.end()
        .map_err(|e| ApiError::MalformedBody { field: None, detail: format!("the body is not valid JSON: {e}") })?;
    Ok(value)
}

/// The field serde's "unknown field `x`, expected ..." or "missing field `x`" names. A JSON key
/// may itself hold backticks, so the name runs to the last backtick before serde's own words.
fn named_field(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("unknown field `").or_else(|| message.strip_prefix("missing field `"))?;
    let end = rest
        .rfind("`, expected")
        .or_else(|| rest.rfind("`, there are no fields"))
        .or_else(|| rest.strip_suffix('`').map(str::len))?;
    Some(&rest[..end])
}

/// The entity tag of a resource at `version`.
pub fn etag(version: i64) -> HeaderValue {
    // Digits and quotes only: always a valid header value.
    HeaderValue::from_str(&format!("\"{version}\"")).unwrap_or(HeaderValue::from_static("\"0\""))
}

/// `If-Match`: the entity tags the client last read, checked by the use case before it
/// changes the object.
impl<S: Send + Sync> FromRequestParts<S> for Precondition {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let Some(value) = parts.headers.get(header::IF_MATCH) else { return Ok(Precondition::none()) };
        let text = value
            .to_str()
            .map_err(|_| ApiError::field(FieldError::new("If-Match", "invalid_value", "must be an entity tag")))?;
        Ok(Precondition::entity_tags(text.split(',').map(|t| t.trim().to_owned()).collect()))
    }
}

/// Query parameters of every list endpoint.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items per page, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    /// Opaque cursor from a previous page's `next_cursor`.
    pub cursor: Option<String>,
}

/// A validated page request.
#[derive(Debug, Clone)]
pub struct PageRequest {
    /// Items to return.
    pub limit: i64,
    /// The sort key after which this page starts.
    pub after: Option<String>,
}

impl PageRequest {
    /// Parses `limit` and `cursor`.
    pub fn parse(params: PageParams) -> Result<Self, ApiError> {
        let limit = params.limit.unwrap_or(50);
        crate::domain::check_range("limit", limit, 1, 200)?;
        let after = match params.cursor {
            None => None,
            Some(c) => Some(decode_cursor(&c).ok_or_else(|| {
                ApiError::field(FieldError::new("cursor", "invalid_value", "is not a cursor this API issued"))
            })?),
        };
        Ok(Self { limit, after })
    }

    /// Builds the page from up to `limit + 1` fetched rows: the extra row only says that a
    /// next page exists.
    pub fn page<T, R: Serialize>(
        &self,
        mut rows: Vec<T>,
        key: impl Fn(&T) -> String,
        view: impl Fn(T) -> R,
    ) -> Page<R> {
        let more = rows.len() as i64 > self.limit;
        rows.truncate(self.limit as usize);
        let next_cursor = if more { rows.last().map(|r| encode_cursor(&key(r))) } else { None };
        Page { items: rows.into_iter().map(view).collect(), next_cursor }
    }

    /// The cursor as the number a list keyed by a number issued; a cursor that is not one
    /// is a 422 naming `cursor`.
    pub fn after_number(&self) -> Result<Option<i64>, ApiError> {
        self.after
            .as_deref()
            .map(|c| {
                c.parse::<i64>().map_err(|_| {
                    ApiError::field(crate::domain::FieldError::new(
                        "cursor",
                        "invalid_value",
                        "is not a cursor this API issued",
                    ))
                })
            })
            .transpose()
    }

    /// How many rows to fetch: one more than the page holds.
    pub fn fetch(&self) -> i64 {
        self.limit + 1
    }
}

/// One page of a list.
#[derive(Debug, Serialize, ToSchema)]
pub struct Page<T> {
    /// The items of this page.
    pub items: Vec<T>,
    /// Pass as `cursor` to get the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// Query helper for extractors that reject unknown parameters with the field named.
pub fn query<T: DeserializeOwned>(uri: &axum::http::Uri) -> Result<T, ApiError> {
    let query = uri.query().unwrap_or_default();
    let deserializer = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let text = e.inner().to_string();
        // The path names the parameter whose value is wrong; an unknown or missing
        // parameter is named in the message instead.
        let field = match e.path().to_string() {
            path if path != "." && !path.is_empty() => path,
            _ => text.split('`').nth(1).unwrap_or("query").to_owned(),
        };
        ApiError::field(FieldError::new(field, "invalid_query", format!("Failed to deserialize query string: {text}")))
    })
}

fn encode_cursor(key: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(key.as_bytes())
}

fn decode_cursor(cursor: &str) -> Option<String> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(cursor).ok()?;
    String::from_utf8(bytes).ok()
}

/// Query parameters of a list, parsed with unknown parameters rejected.
pub struct ListQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ListQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        query(&parts.uri).map(ListQuery)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[expect(dead_code, reason = "fields exist to be deserialized")]
    struct Body {
        name: String,
        quota: Inner,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[expect(dead_code, reason = "fields exist to be deserialized")]
    struct Inner {
        reserved: u32,
    }

    fn field_of(err: ApiError) -> String {
        err.problem().field.unwrap_or_default()
    }

    #[test]
    fn unknown_fields_are_named_with_their_path() {
        let err = parse_json::<Body>(br#"{"name":"a","quota":{"reserved":1,"extra":2}}"#).unwrap_err();
        assert_eq!(field_of(err), "quota.extra");
        let err = parse_json::<Body>(br#"{"name":"a","nme":"b","quota":{"reserved":1}}"#).unwrap_err();
        assert_eq!(field_of(err), "nme");
        // A key with backticks in it is named whole, not cut at its first backtick.
        let err = parse_json::<Body>(br#"{"name":"a","a`b, expected `c`":1,"quota":{"reserved":1}}"#).unwrap_err();
        assert_eq!(field_of(err), "a`b, expected `c`");
        let err = parse_json::<Body>(br#"{"name":"a","quota":{"reserved":1,"`":2}}"#).unwrap_err();
        assert_eq!(field_of(err), "quota.`");
        let err = parse_json::<Body>(br#"{"name":"a","b at line 1 column 2":1}"#).unwrap_err();
        assert!(err.problem().detail.contains("unknown field `b at line 1 column 2`"), "{}", err.problem().detail);
    }

    #[test]
    fn wrong_types_and_negative_numbers_name_the_field() {
        let err = parse_json::<Body>(br#"{"name":"a","quota":{"reserved":-1}}"#).unwrap_err();
        assert_eq!(err.problem().code, "validation_failed");
        assert_eq!(field_of(err), "quota.reserved");
    }

    #[test]
    fn syntax_errors_are_bad_requests() {
        let err = parse_json::<Body>(b"{\"name\": ").unwrap_err();
        assert_eq!(err.problem().status, 400);
        let nested = "[".repeat(10_000) + &"]".repeat(10_000);
        let err = parse_json::<Body>(nested.as_bytes()).unwrap_err();
        assert!(err.problem().status < 500);
    }

    #[test]
    fn if_match_accepts_the_current_tag_and_star_only() {
        let m = Precondition::entity_tags(vec!["\"3\"".into()]);
        assert!(m.check(3).is_ok());
        assert!(matches!(m.check(4), Err(crate::ops::Error::PreconditionFailed)));
        assert!(Precondition::entity_tags(vec!["*".into()]).check(9).is_ok());
        assert!(Precondition::none().check(9).is_ok());
    }

    #[test]
    fn cursors_round_trip_and_garbage_is_refused() {
        let req = PageRequest::parse(PageParams { limit: Some(2), cursor: None }).unwrap();
        let page = req.page(vec!["a", "b", "c"], std::string::ToString::to_string, std::string::ToString::to_string);
        assert_eq!(page.items, vec!["a", "b"]);
        let next = PageRequest::parse(PageParams { limit: None, cursor: page.next_cursor }).unwrap();
        assert_eq!(next.after.as_deref(), Some("b"));
        assert!(PageRequest::parse(PageParams { limit: None, cursor: Some("!!".into()) }).is_err());
        assert!(PageRequest::parse(PageParams { limit: Some(0), cursor: None }).is_err());
    }
}

/// The client's address, for sign-in throttling: the connection's peer, or, when the
/// configuration trusts a proxy in front (`trust_forwarded_for`), the last `X-Forwarded-For`
/// entry, which that proxy appended. `unknown` when neither is known (requests sent to the
/// router in-process).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientAddress(pub String);

impl FromRequestParts<AppState> for ClientAddress {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        if state.config.trust_forwarded_for {
            let forwarded = parts.headers.get_all("x-forwarded-for").iter().next_back().and_then(|v| v.to_str().ok());
            if let Some(last) = forwarded.and_then(|v| v.rsplit(',').next()).map(str::trim).filter(|a| !a.is_empty()) {
                return Ok(Self(last.to_owned()));
            }
        }
        let peer = parts.extensions.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>();
        Ok(Self(peer.map_or_else(|| "unknown".to_owned(), |c| c.0.ip().to_string())))
    }
}
