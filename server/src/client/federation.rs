//! CI without a stored secret: when no Fairway token is configured, the client takes the CI
//! job's own ID token and exchanges it at the server (`POST /api/v1/auth/token-exchange`) for
//! a short-lived API token of the team whose CI trust policy admits it.
//!
//! The ID token comes from the first of:
//! - `FAIRWAY_ID_TOKEN`: GitLab CI's `id_tokens:` (name the token `FAIRWAY_ID_TOKEN`), or any
//!   CI system that can put a token in a variable (Buildkite: `buildkite-agent oidc
//!   request-token`);
//! - GitHub Actions' `ACTIONS_ID_TOKEN_REQUEST_URL` and `ACTIONS_ID_TOKEN_REQUEST_TOKEN`
//!   (there when the workflow has `permissions: id-token: write`), asked for a token with the
//!   audience `FAIRWAY_ID_TOKEN_AUDIENCE` (default `fairway`).

use std::time::Duration;

use reqwest::{header, Method, StatusCode, Url};
use serde_json::Value;

use super::http::{self, Api, Error, Repeat};

/// The variable holding a ready ID token.
pub const ID_TOKEN: &str = "FAIRWAY_ID_TOKEN";
/// The variable naming the audience to ask GitHub Actions for.
pub const AUDIENCE: &str = "FAIRWAY_ID_TOKEN_AUDIENCE";
/// GitHub Actions' ID token endpoint and the bearer token it wants.
pub const GITHUB_URL: &str = "ACTIONS_ID_TOKEN_REQUEST_URL";
/// See [`GITHUB_URL`].
pub const GITHUB_TOKEN: &str = "ACTIONS_ID_TOKEN_REQUEST_TOKEN";
/// The audience asked for when nothing names one: what trust policies expect by default.
pub const DEFAULT_AUDIENCE: &str = "fairway";

/// Every variable read here, so tests can run the client with none of them.
pub const VARIABLES: &[&str] = &[ID_TOKEN, AUDIENCE, GITHUB_URL, GITHUB_TOKEN];

/// How long GitHub's endpoint may take.
const GITHUB_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the CI job's ID token comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A variable holds it.
    Variable(String),
    /// GitHub Actions hands it out on request.
    GitHub {
        /// `ACTIONS_ID_TOKEN_REQUEST_URL`.
        url: String,
        /// `ACTIONS_ID_TOKEN_REQUEST_TOKEN`.
        request_token: String,
        /// The audience to ask for.
        audience: String,
    },
}

/// The ID token's source in this environment, read through `var`; `None` outside a CI job
/// that offers one.
pub fn source(var: impl Fn(&str) -> Option<String>) -> Option<Source> {
    let present = |name: &str| var(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
    if let Some(token) = present(ID_TOKEN) {
        return Some(Source::Variable(token));
    }
    let (url, request_token) = (present(GITHUB_URL)?, present(GITHUB_TOKEN)?);
    let audience = present(AUDIENCE).unwrap_or_else(|| DEFAULT_AUDIENCE.to_owned());
    Some(Source::GitHub { url, request_token, audience })
}

/// GitHub's endpoint with the audience asked for: the URL it gives already has a query.
pub fn github_url(url: &str, audience: &str) -> Result<Url, Error> {
    let mut url = Url::parse(url).map_err(|e| Error::Usage(format!("{GITHUB_URL} is not a URL: {e}")))?;
    url.query_pairs_mut().append_pair("audience", audience);
    Ok(url)
}

/// The CI job's ID token, from `source`.
pub async fn id_token(source: Source) -> Result<String, Error> {
    let (url, request_token, audience) = match source {
        Source::Variable(token) => return Ok(token),
        Source::GitHub { url, request_token, audience } => (url, request_token, audience),
    };
    let url = github_url(&url, &audience)?;
    let http = reqwest::Client::builder()
        .user_agent(concat!("fairway/", env!("CARGO_PKG_VERSION")))
        .timeout(GITHUB_TIMEOUT)
        .build()
        .map_err(|e| Error::Unavailable(format!("cannot set up HTTP: {e}")))?;
    let response = http
        .get(url)
        .header(header::AUTHORIZATION, format!("bearer {request_token}"))
        .send()
        .await
        .map_err(|e| Error::Unavailable(format!("GitHub Actions' ID token endpoint ({GITHUB_URL}) failed: {e}")))?;
    let status = response.status();
    if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
        return Err(Error::Unauthenticated(format!(
            "GitHub Actions refused to give this job an ID token ({}): does the workflow grant `permissions: id-token: write`?",
            status.as_u16()
        )));
    }
    if !status.is_success() {
        return Err(Error::Unavailable(format!("GitHub Actions' ID token endpoint answered {}", status.as_u16())));
    }
    let body: Value = response
        .json()
        .await
        .map_err(|e| Error::Unavailable(format!("GitHub Actions' ID token endpoint answered no JSON: {e}")))?;
    body.get("value")
        .and_then(Value::as_str)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
        .ok_or_else(|| Error::Unavailable("GitHub Actions' ID token endpoint answered no token".to_owned()))
}

/// A Fairway token the server exchanged an ID token for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchanged {
    /// The API token.
    pub token: String,
    /// Its team.
    pub team: String,
}

/// Exchanges `id_token` at the server of `api` (which sends no token of its own) for an API
/// token of `team`, or of the one team whose policies admit it when none is named.
pub async fn exchange(api: &Api, id_token: &str, team: Option<&str>) -> Result<Exchanged, Error> {
    let mut form = vec![
        ("grant_type", "urn:ietf:params:oauth:grant-type:token-exchange"),
        ("subject_token", id_token),
        ("subject_token_type", "urn:ietf:params:oauth:token-type:id_token"),
    ];
    if let Some(team) = team {
        form.push(("team", team));
    }
    let body = serde_urlencoded::to_string(&form).map_err(|e| Error::Usage(e.to_string()))?;
    let url = api.url(&["auth", "token-exchange"]);
    let build = || {
        api.request(Method::POST, url.clone())
            .timeout(Duration::from_secs(30))
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(body.clone())
    };
    // A repeat only mints another short-lived token: harmless.
    let answer = match api.send(build, Repeat::Safe).await {
        Ok(response) => http::json(response).await?,
        Err(Error::NotAllowed { problem, .. }) => {
            return Err(Error::Unauthenticated(format!(
                "the server refused this CI job's ID token: {} (check the team's CI trust policy: its issuer, \
                 audience and conditions, and {AUDIENCE})",
                problem.detail
            )))
        }
        Err(other) => return Err(other),
    };
    let field = |name: &str| answer.get(name).and_then(Value::as_str).map(str::to_owned);
    match (field("access_token"), field("team")) {
        (Some(token), Some(team)) => Ok(Exchanged { token, team }),
        _ => Err(Error::Unavailable(format!("the server's exchange answer names no token and team: {answer}"))),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<&str, &str> = pairs.iter().copied().collect();
        move |name: &str| map.get(name).map(|v| (*v).to_owned())
    }

    #[test]
    fn a_token_in_the_variable_comes_first_then_github_actions() {
        let both = env(&[(ID_TOKEN, "eyJ.a.b"), (GITHUB_URL, "https://gh/x?api-version=2.0"), (GITHUB_TOKEN, "rt")]);
        assert_eq!(source(both), Some(Source::Variable("eyJ.a.b".to_owned())));
        let github = env(&[(ID_TOKEN, " "), (GITHUB_URL, "https://gh/x?api-version=2.0"), (GITHUB_TOKEN, "rt")]);
        assert_eq!(
            source(github),
            Some(Source::GitHub {
                url: "https://gh/x?api-version=2.0".to_owned(),
                request_token: "rt".to_owned(),
                audience: DEFAULT_AUDIENCE.to_owned()
            })
        );
        let named = env(&[(GITHUB_URL, "https://gh/x"), (GITHUB_TOKEN, "rt"), (AUDIENCE, "https://fairway.example")]);
        assert!(
            matches!(source(named), Some(Source::GitHub { audience, .. }) if audience == "https://fairway.example")
        );
        assert_eq!(source(env(&[(GITHUB_URL, "https://gh/x")])), None, "GitHub's URL is no use without its token");
        assert_eq!(source(env(&[])), None);
    }

    #[test]
    fn the_audience_joins_the_query_github_already_gives() {
        assert_eq!(
            github_url("https://gh.example/idtoken?api-version=2.0", "https://f.example/a b").unwrap().as_str(),
            "https://gh.example/idtoken?api-version=2.0&audience=https%3A%2F%2Ff.example%2Fa+b"
        );
        assert_eq!(
            github_url("https://gh.example/t", "fairway").unwrap().as_str(),
            "https://gh.example/t?audience=fairway"
        );
        assert!(github_url("not a url", "fairway").is_err());
    }
}
