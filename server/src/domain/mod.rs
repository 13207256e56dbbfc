//! Domain types: names, roles and constrained values, each parsed once at the edge so the
//! rest of the code can trust them ("parse, don't validate").

pub mod activity;
pub mod array;
mod budget;
pub mod ci_trust;
pub mod dependency;
pub mod driver;
pub mod gpu_health;
pub mod idle;
mod ids;
pub mod job;
mod names;
mod roles;
pub mod service;
pub mod sizing;
pub mod workload;

pub use budget::{BudgetPeriod, BudgetUnit, Enforcement, MAX_BUDGET_AMOUNT};
pub use ids::{
    ArrayId, CiTrustId, ClusterId, GpuClassId, IdlePolicyId, JobId, ServiceId, TeamId, TokenId, UserId, WebhookId,
};
pub use job::{
    BudgetShortfall, DriverWait, JobState, RetryCounter, TopologyLevel, TopologyMode, TopologyWish, WaitFigures,
    WaitedJob,
};
pub use names::{
    CiTrustName, ClusterName, DisplayText, GpuClassName, Password, PriorityClassName, TeamName, TemplateName, Username,
};
pub use roles::{PlatformRole, TeamRole};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The most GPUs of one class a quota may name. Far above any real fleet; it exists so a
/// typo such as `reserved: 1e9` is refused instead of poisoning capacity arithmetic.
pub const MAX_GPUS: i64 = 100_000;

/// One value that failed validation: which field, a stable code and a sentence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FieldError {
    /// JSON path of the failing field, e.g. `reserved` or `members[2].role`.
    pub field: String,
    /// Stable machine-readable reason, e.g. `too_long`.
    pub code: String,
    /// Human-readable explanation.
    pub message: String,
}

impl FieldError {
    /// A failure of `field` with a stable `code` and a human `message`.
    pub fn new(field: impl Into<String>, code: &str, message: impl Into<String>) -> Self {
        Self { field: field.into(), code: code.into(), message: message.into() }
    }

    /// The same failure reported under another field name.
    pub fn at(mut self, field: impl Into<String>) -> Self {
        self.field = field.into();
        self
    }
}

/// How a GPU class maps onto physical GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum GpuKind {
    /// A whole physical GPU.
    Whole,
    /// A MIG partition of a GPU.
    Mig,
    /// A time-sliced share of a GPU.
    TimeSlice,
}

impl GpuKind {
    /// The value stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            GpuKind::Whole => "whole",
            GpuKind::Mig => "mig",
            GpuKind::TimeSlice => "time-slice",
        }
    }

    /// Parses the stored value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "whole" => Some(GpuKind::Whole),
            "mig" => Some(GpuKind::Mig),
            "time-slice" => Some(GpuKind::TimeSlice),
            _ => None,
        }
    }
}

/// Checks that `value` lies in `min..=max`, naming `field` if not.
pub fn check_range(field: &str, value: i64, min: i64, max: i64) -> Result<(), FieldError> {
    if value < min {
        return Err(FieldError::new(field, "too_small", format!("must be at least {min}")));
    }
    if value > max {
        return Err(FieldError::new(field, "too_large", format!("must be at most {max}")));
    }
    Ok(())
}
