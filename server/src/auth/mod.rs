//! Who is calling: users with passwords and short-lived JWT access tokens, and API tokens
//! for CI pipelines scoped to one team. What they may do is declared by [`policy`]; the
//! HTTP layer (`http::authorize`) authenticates requests and enforces it. Nothing here
//! knows of requests or of the shared state.

pub mod api_token;
pub mod jwt;
pub mod password;
pub mod policy;
pub mod throttle;

use crate::domain::{TeamId, TokenId, UserId};
use std::{
    collections::HashMap,
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use axum::http::{header, HeaderMap};

use crate::{
    db,
    domain::{PlatformRole, TeamRole},
};

/// An authenticated caller.
#[derive(Debug, Clone)]
pub enum Principal {
    /// A person, signed in with a password.
    User { id: UserId, username: String, platform_role: Option<PlatformRole> },
    /// A CI pipeline's API token: one team, one role.
    Token { id: TokenId, name: String, team_id: TeamId, team: String, role: TeamRole },
}

impl Principal {
    /// A stable key scoping idempotency records to this caller.
    pub fn key(&self) -> String {
        match self {
            Principal::User { id, .. } => format!("user:{id}"),
            Principal::Token { id, .. } => format!("token:{id}"),
        }
    }

    /// How the audit log names this caller.
    pub fn actor(&self) -> String {
        match self {
            Principal::User { username, .. } => format!("user:{username}"),
            Principal::Token { name, id, team, .. } => format!("token:{team}/{name} ({id})"),
        }
    }

    /// The caller's platform role, if any.
    pub fn platform_role(&self) -> Option<PlatformRole> {
        match self {
            Principal::User { platform_role, .. } => *platform_role,
            Principal::Token { .. } => None,
        }
    }

    /// True for platform admins.
    pub fn is_platform_admin(&self) -> bool {
        self.platform_role() == Some(PlatformRole::PlatformAdmin)
    }
}

/// Who a request comes from.
#[derive(Debug, Clone)]
pub struct Authenticated {
    pub principal: Principal,
    /// An API token's team, read together with the token.
    pub token_team: Option<db::teams::TeamRow>,
    /// The submission catalogue's version, read together with an API token.
    pub catalogue_version: Option<i64>,
}

/// The submission catalogue's version as of this request's authentication, when it was read
/// then (API tokens); handlers that validate against the catalogue use a cached copy of
/// that version instead of reading it again.
#[derive(Debug, Clone, Copy)]
pub struct CatalogueVersion(pub Option<i64>);

/// API tokens as last authenticated from the database, by hash: what a single-job
/// submission is authorised from without reading the token again. Nothing else trusts it,
/// and the submission's write checks what it took from here ([`db::jobs::WriteCheck`]), so
/// a revoked token or a changed catalogue is never acted on. Entries are read again after a
/// minute, which also keeps the token's last use current.
#[derive(Default)]
pub struct TokenCache(Mutex<HashMap<Vec<u8>, (Authenticated, Instant)>>);

/// How long a cached token is used before it is read again.
const TOKEN_CACHE_TTL: Duration = Duration::from_secs(60);
/// Tokens cached at most; the cache starts over when full.
const TOKEN_CACHE_ENTRIES: usize = 10_000;

impl TokenCache {
    /// The cached API token of the request's bearer credential, and what its write must check.
    pub fn get(&self, headers: &HeaderMap) -> Option<(Authenticated, db::jobs::WriteCheck)> {
        let hash = api_token::parse(bearer(headers)?)?;
        let entries = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let (auth, read_at) = entries.get(&hash)?;
        if read_at.elapsed() > TOKEN_CACHE_TTL {
            return None;
        }
        let check = db::jobs::WriteCheck {
            token_id: match auth.principal {
                Principal::Token { id, .. } => id,
                Principal::User { .. } => return None,
            },
            team_version: auth.token_team.as_ref()?.version,
            catalogue_version: auth.catalogue_version?,
        };
        Some((auth.clone(), check))
    }

    /// Keeps `auth`, just read from the database for the token whose hash is `hash`.
    pub fn put(&self, hash: Vec<u8>, auth: &Authenticated) {
        let mut entries = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= TOKEN_CACHE_ENTRIES {
            entries.clear();
        }
        entries.insert(hash, (auth.clone(), Instant::now()));
    }
}

/// The bearer credential of `headers`, if there is one.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let (scheme, credential) = headers.get(header::AUTHORIZATION)?.to_str().ok()?.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| credential.trim())
}
