//! Typed ids. Each entity's id is its own type, so a team id cannot be passed where a job id
//! is meant; on the wire and in PostgreSQL every one is a plain uuid.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Declares an id newtype over `Uuid`: stored as `uuid` (`sqlx(transparent)`, arrays
/// included), serialised as the bare uuid string, documented in OpenAPI as a uuid.
macro_rules! id_type {
    ($(#[doc = $doc:literal] $name:ident;)+) => {$(
        #[doc = $doc]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[derive(Serialize, Deserialize, sqlx::Type, utoipa::ToSchema)]
        #[serde(transparent)]
        #[sqlx(transparent)]
        #[schema(value_type = String, format = Uuid)]
        pub struct $name(Uuid);

        impl $name {
            /// A fresh random (v4) id.
            pub fn new() -> Self {
                Self(Uuid::new_v4())
            }

            /// The id with this numeric value: fixed ids for fixtures and tests.
            pub const fn from_u128(value: u128) -> Self {
                Self(Uuid::from_u128(value))
            }

            /// The uuid, for the places that speak uuids (manifests, labels, logs).
            pub const fn uuid(self) -> Uuid {
                self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl From<Uuid> for $name {
            fn from(id: Uuid) -> Self {
                Self(id)
            }
        }

        impl From<$name> for Uuid {
            fn from(id: $name) -> Self {
                id.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl FromStr for $name {
            type Err = uuid::Error;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::from_str(s).map(Self)
            }
        }
    )+};
}

id_type! {
    /// The id of a job.
    JobId;
    /// The id of a team.
    TeamId;
    /// The id of a GPU class.
    GpuClassId;
    /// The id of a user.
    UserId;
    /// The id of an API token.
    TokenId;
    /// The id of a cluster.
    ClusterId;
    /// The id of a team's webhook.
    WebhookId;
    /// The id of a team's CI trust policy.
    CiTrustId;
    /// The id of a job array.
    ArrayId;
    /// The id of an inference service.
    ServiceId;
    /// The id of an idle policy.
    IdlePolicyId;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_reads_and_writes_as_its_bare_uuid() {
        let uuid = Uuid::new_v4();
        let id = JobId::from(uuid);
        assert_eq!(id.to_string(), uuid.to_string());
        assert_eq!(serde_json::to_value(id).unwrap(), serde_json::json!(uuid.to_string()));
        assert_eq!(serde_json::from_value::<JobId>(serde_json::json!(uuid.to_string())).unwrap(), id);
        assert_eq!(uuid.to_string().parse::<JobId>().unwrap(), id);
        assert!("not-a-uuid".parse::<TeamId>().is_err());
    }
}
