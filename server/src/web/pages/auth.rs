//! Signing in and out.

use askama::Template;
use axum::{
    body::Bytes,
    extract::State,
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
}

/// The sign-in form.
pub async fn login_form() -> Response {
    render(&LoginPage { signed_in: None, error: None, username: String::new() })
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
        return Ok((StatusCode::BAD_REQUEST, login_page(None, "Enter a username and a password.")).into_response());
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
                let page = login_page(Some(&form.username), "That username and password do not match.");
                return Ok((StatusCode::UNAUTHORIZED, page).into_response());
            }
            Err(other) => return Err(other.into()),
        };
    let secret = random_token();
    let expires = Utc::now() + chrono::Duration::hours(session::SESSION_HOURS);
    db::web_sessions::create(&state.db, &secret_hash(&secret), user.id, &random_token(), expires).await?;
    let mut response = Redirect::to("/").into_response();
    response.headers_mut().insert(header::SET_COOKIE, set_cookie(Some(&secret), session::is_secure(&headers)));
    Ok(response)
}

fn login_page(username: Option<&str>, error: &str) -> Response {
    render(&LoginPage { signed_in: None, error: Some(error.into()), username: username.unwrap_or_default().into() })
}

/// Ends the session.
pub async fn logout(
    State(state): State<AppState>,
    headers: HeaderMap,
    _: PortalForm<NoFields>,
) -> Result<Response, PageError> {
    if let Some(secret) = session::secret_of(&headers) {
        db::web_sessions::delete(&state.db, &secret_hash(&secret)).await?;
    }
    let mut response = Redirect::to("/login").into_response();
    response.headers_mut().insert(header::SET_COOKIE, set_cookie(None, session::is_secure(&headers)));
    Ok(response)
}
