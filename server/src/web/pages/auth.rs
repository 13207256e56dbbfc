//! Signing in and out: with a password, or through an OpenID provider (the authorization
//! code flow with PKCE; `state` in a short-lived cookie of its own, so an answer is taken
//! only in the browser that began the sign-in), and out again, at the provider too when the
//! session began there and it offers RP-initiated logout.

use askama::Template;
use axum::{
    body::Bytes,
    extract::{Path, Query, State},
    http::{header, HeaderMap, StatusCode},
    response::{IntoResponse, Redirect, Response},
};
use chrono::Utc;
use serde::Deserialize;

use super::{render, NoFields, PageError, PortalForm, SignedIn};
use crate::{
    db,
    http::extract::ClientAddress,
    ops,
    state::AppState,
    web::session::{self, random_token, secret_hash, set_cookie},
};

#[derive(Template)]
#[template(path = "login.html")]
struct LoginPage {
    signed_in: Option<SignedIn>,
    error: Option<String>,
    username: String,
    /// Each provider's id and what its button names.
    providers: Vec<(String, String)>,
    /// Whether the password form is offered.
    password: bool,
}

impl LoginPage {
    fn new(state: &AppState, error: Option<String>, username: &str) -> Self {
        let providers = state.config.oidc_providers.iter().map(|p| (p.id.clone(), p.display_name.clone())).collect();
        Self { signed_in: None, error, username: username.into(), providers, password: state.config.password_sign_in }
    }
}

/// The sign-in page: a button per provider, and the password form unless it is turned off.
pub async fn login_form(State(state): State<AppState>) -> Response {
    render(&LoginPage::new(&state, None, ""))
}

#[derive(Deserialize)]
struct LoginForm {
    username: String,
    password: String,
}

/// Signs in with a username and password and starts a session.
pub async fn login(
    State(state): State<AppState>,
    client: ClientAddress,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, PageError> {
    let form = (!super::form_has_nul(&body)).then(|| serde_urlencoded::from_bytes::<LoginForm>(&body).ok()).flatten();
    let Some(form) = form else {
        return Ok(
            (StatusCode::BAD_REQUEST, login_page(&state, None, "Enter a username and a password.")).into_response()
        );
    };
    // A sign-in posted from another site is refused: it could sign a victim into an attacker's
    // account.
    if !session::same_origin(&headers) {
        return Err(PageError::forbidden());
    }
    let user =
        match ops::sign_in::verify(&state, &form.username, form.password.clone(), &client.0, ops::sign_in::Via::Portal)
            .await
        {
            Ok(user) => user,
            Err(ops::Error::InvalidCredentials) => {
                let page = login_page(&state, Some(&form.username), "That username and password do not match.");
                return Ok((StatusCode::UNAUTHORIZED, page).into_response());
            }
            Err(other) => return Err(other.into()),
        };
    start_session(&state, &headers, user.id, None).await
}

/// A new session for `user` (begun through `provider` with its ID token, if so), and the
/// way home.
async fn start_session(
    state: &AppState,
    headers: &HeaderMap,
    user: crate::domain::UserId,
    provider: Option<(&str, &str)>,
) -> Result<Response, PageError> {
    let secret = random_token();
    let expires = Utc::now() + chrono::Duration::hours(session::SESSION_HOURS);
    db::web_sessions::create(&state.db, &secret_hash(&secret), user, &random_token(), expires, provider).await?;
    let mut response = Redirect::to("/").into_response();
    response.headers_mut().append(header::SET_COOKIE, set_cookie(Some(&secret), session::is_secure(headers)));
    Ok(response)
}

fn login_page(state: &AppState, username: Option<&str>, error: &str) -> Response {
    render(&LoginPage::new(state, Some(error.into()), username.unwrap_or_default()))
}

/// Begins a sign-in through provider `provider`: the browser goes to the provider, holding
/// the sign-in's `state` in a cookie that only `/login/oidc/` sees.
pub async fn oidc_begin(
    State(state): State<AppState>,
    Path(provider): Path<String>,
    headers: HeaderMap,
) -> Result<Response, PageError> {
    let begun = ops::single_sign_on::begin(&state, &provider).await?;
    let mut response = Redirect::to(&begun.redirect).into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, session::sign_in_cookie(Some(&begun.state), session::is_secure(&headers)));
    Ok(response)
}

/// Where the provider sends the browser back: the sign-in is finished (or refused, with
/// why) and a session begins.
pub async fn oidc_callback(
    State(state): State<AppState>,
    Path(provider): Path<String>,
    client: ClientAddress,
    headers: HeaderMap,
    Query(answer): Query<ops::single_sign_on::Answer>,
) -> Result<Response, PageError> {
    let browser_state = session::sign_in_state_of(&headers);
    let signed_in = ops::single_sign_on::finish(&state, &provider, &answer, browser_state.as_deref(), &client.0).await;
    let secure = session::is_secure(&headers);
    let mut response = match signed_in {
        Ok(done) => start_session(&state, &headers, done.user.id, Some((&provider, &done.id_token))).await?,
        Err(ops::Error::IdentityRefused { reason }) => {
            let page = login_page(&state, None, &format!("The sign-in was refused: {reason}."));
            (StatusCode::UNAUTHORIZED, page).into_response()
        }
        Err(other) => return Err(other.into()),
    };
    response.headers_mut().append(header::SET_COOKIE, session::sign_in_cookie(None, secure));
    Ok(response)
}

#[derive(Template)]
#[template(path = "signed_out.html")]
struct SignedOutPage {
    signed_in: Option<SignedIn>,
    provider: String,
    provider_logout: String,
}

/// Ends the session.
pub async fn logout(
    State(state): State<AppState>,
    headers: HeaderMap,
    _: PortalForm<NoFields>,
) -> Result<Response, PageError> {
    let ended = match session::secret_of(&headers) {
        Some(secret) => db::web_sessions::delete(&state.db, &secret_hash(&secret)).await?,
        None => None,
    };
    // A session begun at a provider ends there too, where it offers RP-initiated logout. A
    // page carries the browser on: browsers hold a form's redirects to `form-action 'self'`.
    let at_provider = match &ended {
        Some((id, id_token)) => ops::single_sign_on::end_session(&state, id, id_token).await,
        None => None,
    };
    let mut response = match at_provider {
        Some((provider, provider_logout)) => render(&SignedOutPage { signed_in: None, provider, provider_logout }),
        None => Redirect::to("/login").into_response(),
    };
    response.headers_mut().insert(header::SET_COOKIE, set_cookie(None, session::is_secure(&headers)));
    Ok(response)
}
