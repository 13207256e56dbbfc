//! What every request and use case shares: the database, the keys, the configuration, the
//! metrics, and the in-memory caches in front of the database. Built once by `serve` (and
//! by tests and benchmarks); knows nothing of HTTP.

use crate::domain::TeamId;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use sqlx::PgPool;

use crate::{
    auth::{jwt::JwtKeys, TokenCache},
    config::{decode_signing_key, Config},
    control,
    db::{self, jobs::SubmitCatalogue},
    telemetry::Metrics,
};

/// State shared by every request.
#[derive(Clone)]
pub struct AppState {
    /// The database pool.
    pub db: PgPool,
    /// Access-token keys.
    pub keys: Arc<JwtKeys>,
    /// The effective configuration.
    pub config: Arc<Config>,
    /// Request metrics.
    pub metrics: Arc<Metrics>,
    /// Wakes the scheduler after submissions.
    pub wake: control::wake::SchedulerWake,
    /// Submission catalogues in memory, checked against the version read at authentication.
    pub catalogues: Arc<CatalogueCache>,
    /// API tokens as last read, for single-job submissions.
    pub tokens: Arc<TokenCache>,
    /// Single-job submissions, committed in groups.
    pub submissions: db::group_commit::SubmissionQueue,
    /// Password sign-in failures, for throttling guesses.
    pub sign_in_throttle: Arc<crate::auth::throttle::SignInThrottle>,
    /// What dry runs forecast expected starts from, read at most every
    /// [`control::forecast::REFRESH`] as the leader reads its own: a form's live preview
    /// asks for a dry run at every change.
    pub forecast: Arc<tokio::sync::Mutex<control::forecast::ForecastInputs>>,
    /// Wakes open event streams when jobs' timelines grow, and ends them at shutdown.
    pub feed: control::feed::EventFeed,
    /// The configured OpenID providers and CI issuers, their discovery and keys cached.
    pub issuers: Arc<crate::idp::Directory>,
}

impl AppState {
    /// State over `db` with keys from `config`.
    pub fn new(db: PgPool, config: Config, signing_key: &[u8]) -> anyhow::Result<Self> {
        let previous = config
            .previous_signing_keys
            .iter()
            .map(|k| decode_signing_key("FAIRWAY_PREVIOUS_SIGNING_KEYS", k))
            .collect::<Result<Vec<_>, _>>()?;
        let keys =
            JwtKeys::new(signing_key, &previous, &config.jwt_issuer, &config.jwt_audience, config.access_token_ttl);
        let issuers = crate::idp::Directory::new(
            config
                .oidc_providers
                .iter()
                .map(|p| p.issuer.as_str())
                .chain(config.ci_issuers.iter().map(|c| c.issuer.as_str())),
        );
        Ok(Self {
            issuers: Arc::new(issuers),
            tokens: Arc::default(),
            submissions: db::group_commit::SubmissionQueue::new(db.clone()),
            db,
            keys: Arc::new(keys),
            config: Arc::new(config),
            metrics: Arc::default(),
            wake: control::wake::SchedulerWake::default(),
            catalogues: Arc::default(),
            sign_in_throttle: Arc::default(),
            forecast: Arc::default(),
            feed: control::feed::EventFeed::default(),
        })
    }

    /// Asks for a scheduling cycle soon, without waiting for it.
    pub fn wake_scheduler(&self) {
        self.wake.poke(&self.db);
    }
}

/// Catalogues read for submissions, by team and asked-for classes, each with the version it
/// was read at. A request whose authentication saw the same version uses the copy: the
/// version is bumped in the transaction of every change, so the copy is exactly current.
#[derive(Default)]
pub struct CatalogueCache(Mutex<HashMap<CatalogueKey, SubmitCatalogue>>);

/// A team and the sorted, distinct GPU class names a submission asks for.
pub type CatalogueKey = (TeamId, Vec<String>);

/// Entries kept before the cache starts over (one per team and set of classes in use).
const CATALOGUE_CACHE_ENTRIES: usize = 4096;

impl CatalogueCache {
    /// The copy for `key`, if one was read at exactly `version`.
    pub fn get(&self, key: &CatalogueKey, version: i64) -> Option<SubmitCatalogue> {
        let cache = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        cache.get(key).filter(|c| c.version == version).cloned()
    }

    /// Keeps `catalogue` for `key`; the cache starts over when full.
    pub fn put(&self, key: CatalogueKey, catalogue: SubmitCatalogue) {
        let mut cache = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= CATALOGUE_CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(key, catalogue);
    }
}
