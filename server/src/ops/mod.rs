//! The use cases: what a team, an admin, finance or a CI pipeline can do, one function each,
//! called alike by the REST API, the portal and the command-line client. Each takes the
//! shared [`AppState`](crate::state::AppState), the caller and parsed input, enforces the
//! product's rules (what a job may ask for, the quota tree, who may change what), writes
//! through `db` in one transaction with its audit entry, and answers with [`Error`] when it
//! cannot. Nothing here knows HTTP or HTML.

pub mod arrays;
pub mod audit;
pub mod billing;
pub mod budgets;
pub mod ci_trusts;
pub mod clusters;
pub mod error;
pub mod gpu_classes;
pub mod idle_policies;
pub mod jobs;
pub mod logs;
pub mod priority_classes;
pub mod quotas;
pub mod services;
pub mod sign_in;
pub mod single_sign_on;
pub mod teams;
pub mod templates;
pub mod timeline;
pub mod token_exchange;
pub mod tokens;
pub mod users;
pub mod utilisation;
pub mod webhooks;

pub use error::{Error, OnConstraint, Result};

/// Runs CPU-heavy work (argon2 takes tens of milliseconds) on the blocking pool so it never
/// stalls the async workers serving other requests.
pub async fn off_thread<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(|e| Error::internal("running blocking work", e))
}

/// What the caller believes the object's version is: checked before a change so that two
/// people editing the same object cannot overwrite each other unknowingly. The API reads it
/// from `If-Match`, the portal from the version its form was rendered with.
#[derive(Debug, Clone, Default)]
pub struct Precondition(Option<Vec<String>>);

impl Precondition {
    /// No precondition: the change applies to whatever version is current.
    pub fn none() -> Self {
        Self(None)
    }

    /// The object must still be at `version` (0: it must not exist yet).
    pub fn version(version: i64) -> Self {
        Self(Some(vec![format!("\"{version}\"")]))
    }

    /// The entity tags of an `If-Match` header (`*` matches any version).
    pub fn entity_tags(tags: Vec<String>) -> Self {
        Self(Some(tags))
    }

    /// Fails with [`Error::PreconditionFailed`] unless the precondition holds for `version`.
    pub fn check(&self, version: i64) -> Result<()> {
        match &self.0 {
            None => Ok(()),
            Some(tags) if tags.iter().any(|t| t == "*") => Ok(()),
            Some(tags) => {
                let current = format!("\"{version}\"");
                if tags.iter().any(|t| t.trim_start_matches("W/") == current) {
                    Ok(())
                } else {
                    Err(Error::PreconditionFailed)
                }
            }
        }
    }
}
