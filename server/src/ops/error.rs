//! The use cases' one error type: what can go wrong when a team, an admin or a pipeline asks
//! for something, whichever face it asked through. The API renders it as a problem document,
//! the portal as a page; neither needs to know more than its variant.

use crate::domain::FieldError;

/// A boxed cause, kept so that the log shows the whole chain.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Everything a use case can answer instead of success.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The thing named does not exist, or the caller must not learn that it does.
    #[error("{0} not found")]
    NotFound(&'static str),
    /// The caller may see the thing but not do this to it.
    #[error("forbidden")]
    Forbidden,
    /// A username and password that do not match.
    #[error("invalid username or password")]
    InvalidCredentials,
    /// The request names fields that are wrong, each with why.
    #[error("validation failed")]
    Validation(Vec<FieldError>),
    /// The request is well formed but conflicts with the current state.
    #[error("{detail}")]
    Conflict {
        /// Stable machine-readable code, e.g. `team_exists`.
        code: &'static str,
        /// A sentence for people.
        detail: String,
        /// The field at fault, if one is.
        field: Option<String>,
    },
    /// Too many wrong passwords from this address: the caller may try again after the wait.
    #[error("too many failed sign-ins; try again in {} s", retry_after.as_secs().max(1))]
    Throttled {
        /// How long until the next attempt is considered.
        retry_after: std::time::Duration,
    },
    /// An identity provider's or CI issuer's token, or the answer of a sign-in, was refused:
    /// the reason says what was wrong with it (expired, another audience, a replayed
    /// sign-in, no trust policy admits it), never the token.
    #[error("{reason}")]
    IdentityRefused {
        /// A sentence for people.
        reason: String,
    },
    /// An identity provider or CI issuer could not be reached or answered nonsense: the
    /// request may succeed later.
    #[error("{reason}")]
    ProviderUnavailable {
        /// What failed, without secrets.
        reason: String,
    },
    /// The object changed since the caller read it (a stale `If-Match` or form version).
    #[error("the resource changed since it was read")]
    PreconditionFailed,
    /// A submission authorised from cached credentials found them changed when it was
    /// written, and stored nothing; the caller authenticates again from the database.
    #[error("the credentials changed since they were cached")]
    CredentialsChanged,
    /// The database cannot be reached (connection refused or lost, pool exhausted, server
    /// shutting down): the request may succeed if retried.
    #[error("the database is unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// Our fault: a bug or a failure the caller cannot fix. The cause is kept for the log.
    #[error("{context}")]
    Internal {
        /// What we were doing.
        context: &'static str,
        /// Why it failed.
        #[source]
        source: BoxError,
    },
}

/// The result of a use case.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// One failing field.
    pub fn field(error: FieldError) -> Self {
        Error::Validation(vec![error])
    }

    /// A conflict with the current state, e.g. a duplicate name.
    pub fn conflict(code: &'static str, field: Option<&str>, detail: impl Into<String>) -> Self {
        Error::Conflict { code, detail: detail.into(), field: field.map(str::to_owned) }
    }

    /// An internal failure while doing `context`, caused by `source`.
    pub fn internal(context: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Internal { context, source: source.into() }
    }
}

impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        if crate::db::is_unavailable(&error) {
            Error::Unavailable(error)
        } else {
            Error::Internal { context: "database query failed", source: Box::new(error) }
        }
    }
}

/// A provider that failed is [`Error::ProviderUnavailable`], a token it refused
/// [`Error::IdentityRefused`].
impl From<crate::idp::Error> for Error {
    fn from(error: crate::idp::Error) -> Self {
        match error {
            refused @ crate::idp::Error::Grant(_) => Error::IdentityRefused { reason: refused.to_string() },
            crate::idp::Error::Refused(refusal) => Error::IdentityRefused { reason: refusal.to_string() },
            provider @ crate::idp::Error::Provider { .. } => {
                Error::ProviderUnavailable { reason: provider.to_string() }
            }
        }
    }
}

/// The scheduler's view could not be built: a database that cannot be reached stays
/// [`Error::Unavailable`] (a dry run during an outage is a 503, not a 500).
impl From<crate::control::ControlError> for Error {
    fn from(error: crate::control::ControlError) -> Self {
        match error {
            crate::control::ControlError::Db(e) => e.into(),
            other => Error::internal("building the scheduler's view", other),
        }
    }
}

impl From<Vec<FieldError>> for Error {
    fn from(errors: Vec<FieldError>) -> Self {
        Error::Validation(errors)
    }
}

impl From<FieldError> for Error {
    fn from(error: FieldError) -> Self {
        Error::field(error)
    }
}

/// Maps a named constraint violation to a client error where it happens.
pub trait OnConstraint<T> {
    /// Replaces a violation of `constraint` with `error`; other errors pass through.
    fn on_constraint<E: From<sqlx::Error>>(
        self,
        constraint: &str,
        error: impl FnOnce() -> E,
    ) -> std::result::Result<T, E>;
}

impl<T> OnConstraint<T> for std::result::Result<T, sqlx::Error> {
    fn on_constraint<E: From<sqlx::Error>>(
        self,
        constraint: &str,
        error: impl FnOnce() -> E,
    ) -> std::result::Result<T, E> {
        self.map_err(|e| match e.as_database_error().and_then(|d| d.constraint()) {
            Some(c) if c == constraint => error(),
            _ => E::from(e),
        })
    }
}

pub use crate::telemetry::error_chain as chain;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::ControlError;

    #[test]
    fn a_database_that_cannot_be_reached_is_unavailable_and_a_failed_query_is_internal() {
        assert!(matches!(Error::from(sqlx::Error::PoolTimedOut), Error::Unavailable(_)));
        assert!(matches!(Error::from(sqlx::Error::PoolClosed), Error::Unavailable(_)));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(matches!(Error::from(sqlx::Error::Io(refused)), Error::Unavailable(_)));
        assert!(matches!(Error::from(sqlx::Error::RowNotFound), Error::Internal { .. }));
        // Through the control loop's error, as a dry run meets it.
        assert!(matches!(Error::from(ControlError::Db(sqlx::Error::PoolTimedOut)), Error::Unavailable(_)));
    }

    #[test]
    fn an_internal_error_keeps_its_whole_cause_chain() {
        let error = Error::from(sqlx::Error::RowNotFound);
        let text = chain(&error);
        assert!(text.starts_with("database query failed: "), "{text}");
        assert!(text.contains("no rows returned"), "{text}");
    }
}
