//! Signing in with a username and a password: one rule for the API's access tokens and the
//! portal's sessions.

use std::time::Instant;

use super::{off_thread, Error, Result};
use crate::{
    auth::password,
    db::{self, users::UserRow},
    state::AppState,
};

/// The enabled user `username` whose password is `password`, or
/// [`Error::InvalidCredentials`]. An unknown or disabled user costs the same hashing time as
/// a wrong password, so the answer's timing does not tell which usernames exist.
///
/// Guessing is throttled per username at the `client` address and per address (see
/// [`crate::auth::throttle`]): an attempt that comes too early is [`Error::Throttled`]
/// without the password being checked.
pub async fn verify(state: &AppState, username: &str, password: String, client: &str) -> Result<UserRow> {
    let throttle = &state.sign_in_throttle;
    throttle.check(username, client, Instant::now()).map_err(|retry_after| Error::Throttled { retry_after })?;
    let verdict = check_password(state, username, password).await;
    match &verdict {
        Ok(_) => throttle.succeeded(username, client),
        Err(Error::InvalidCredentials) => throttle.failed(username, client, Instant::now()),
        Err(_) => {}
    }
    verdict
}

async fn check_password(state: &AppState, username: &str, password: String) -> Result<UserRow> {
    let user = db::users::by_username(&state.db, username).await?;
    match user {
        Some(user) if !user.disabled => {
            let stored = user.password_hash.clone();
            let ok = off_thread(move || password::verify(&password, &stored)).await?;
            ok.then_some(user).ok_or(Error::InvalidCredentials)
        }
        _ => {
            off_thread(move || password::verify_dummy(&password)).await?;
            Err(Error::InvalidCredentials)
        }
    }
}
