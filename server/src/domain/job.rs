//! What a job is: its states, its topology wish, and the checks on the parts of a job spec
//! that need no catalogue (names, image, command, environment, labels). Checks against the
//! catalogue (classes, priority classes, capacity, team limits) live with the handler.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{check_range, FieldError};

/// Where a job is in its life.
// Stored as text (`jobs.state`, checked by `jobs_state_check`): reading a value this build
// does not know fails the read; it never becomes another state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema, sqlx::Type)]
#[serde(rename_all = "snake_case")]
#[sqlx(type_name = "text", rename_all = "snake_case")]
pub enum JobState {
    /// Waiting for admission.
    Pending,
    /// Admitted with a placement; being created on its cluster.
    Admitted,
    /// Every replica runs.
    Running,
    /// Every replica exited 0.
    Succeeded,
    /// Failed and out of retries.
    Failed,
    /// Cancelled by a user.
    Cancelled,
    /// Preempted: stopping to give its GPUs to another job (it then requeues), or out of
    /// preemption retries.
    Preempted,
}

impl JobState {
    /// Every state, for validation messages.
    pub const ALL: [JobState; 7] = [
        JobState::Pending,
        JobState::Admitted,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Preempted,
    ];

    /// The value stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "pending",
            JobState::Admitted => "admitted",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Preempted => "preempted",
        }
    }

    /// Parses the stored value.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == s)
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A job's retry budgets, one per kind of failure that requeues it: each counts the
/// requeues it has paid for (a column of `jobs` of the same name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryCounter {
    /// Preempted by the scheduler or the provider.
    Preemptions,
    /// The cluster had no capacity for the placement.
    CapacityRetries,
    /// A node of the job was lost.
    NodeLostRetries,
    /// The application failed (counted against the job's own `max_retries`).
    AppRetries,
}

impl RetryCounter {
    /// The `jobs` column that holds this counter.
    pub fn column(self) -> &'static str {
        match self {
            RetryCounter::Preemptions => "preemptions",
            RetryCounter::CapacityRetries => "capacity_retries",
            RetryCounter::NodeLostRetries => "node_lost_retries",
            RetryCounter::AppRetries => "app_retries",
        }
    }
}

/// A topology level a gang can ask to be kept within.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyLevel {
    NvlinkDomain,
    Node,
    Rack,
    Zone,
}

impl TopologyLevel {
    /// The value stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            TopologyLevel::NvlinkDomain => "nvlink-domain",
            TopologyLevel::Node => "node",
            TopologyLevel::Rack => "rack",
            TopologyLevel::Zone => "zone",
        }
    }

    /// Parses the stored value.
    pub fn parse(s: &str) -> Option<Self> {
        [TopologyLevel::NvlinkDomain, TopologyLevel::Node, TopologyLevel::Rack, TopologyLevel::Zone]
            .into_iter()
            .find(|l| l.as_str() == s)
    }
}

/// Whether the level is a must or a wish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TopologyMode {
    /// The whole gang within one domain of the level, or it waits.
    Required,
    /// Within one domain if possible, anywhere otherwise.
    Preferred,
}

/// A gang's topology wish.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TopologyWish {
    pub level: TopologyLevel,
    pub mode: TopologyMode,
}

/// Longest job name.
pub const MAX_JOB_NAME: usize = 200;
const MAX_IMAGE: usize = 512;
const MAX_COMMAND_ARGS: usize = 256;
const MAX_ARG_BYTES: usize = 4096;
const MAX_ENV: usize = 256;
const MAX_ENV_VALUE_BYTES: usize = 32 * 1024;
const MAX_LABELS: usize = 64;

/// Environment variables the platform sets itself (rank, world size, rendezvous): a job may
/// not set them, except the simulator's hints.
const RESERVED_ENV_PREFIX: &str = "FAIRWAY_";
const SIM_HINT_PREFIX: &str = "FAIRWAY_SIM_";
/// Variables the NVIDIA container runtime and device plugin act on.
pub const DEVICE_ENV_PREFIX: &str = "NVIDIA_";

/// Checks a job's name: free text shown to people, 1 to 200 characters, no control
/// characters. Markup is allowed and always escaped where shown.
pub fn check_name(field: &str, name: &str) -> Result<(), FieldError> {
    if name.trim().is_empty() {
        return Err(FieldError::new(field, "empty", "must not be empty"));
    }
    if name.chars().count() > MAX_JOB_NAME {
        return Err(FieldError::new(field, "too_long", format!("must be at most {MAX_JOB_NAME} characters")));
    }
    if name.chars().any(char::is_control) {
        return Err(FieldError::new(field, "control_character", "must not contain control characters"));
    }
    Ok(())
}

/// Checks a container image reference: non-empty, no whitespace or control characters.
pub fn check_image(field: &str, image: &str) -> Result<(), FieldError> {
    if image.is_empty() {
        return Err(FieldError::new(field, "empty", "must not be empty"));
    }
    if image.len() > MAX_IMAGE {
        return Err(FieldError::new(field, "too_long", format!("must be at most {MAX_IMAGE} bytes")));
    }
    if image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(FieldError::new(field, "invalid_characters", "must not contain whitespace or control characters"));
    }
    Ok(())
}

/// Checks the command's arguments.
pub fn check_command(field: &str, command: &[String]) -> Result<(), FieldError> {
    if command.len() > MAX_COMMAND_ARGS {
        return Err(FieldError::new(field, "too_many", format!("must have at most {MAX_COMMAND_ARGS} arguments")));
    }
    for (i, arg) in command.iter().enumerate() {
        if arg.len() > MAX_ARG_BYTES {
            return Err(FieldError::new(
                format!("{field}[{i}]"),
                "too_long",
                format!("must be at most {MAX_ARG_BYTES} bytes"),
            ));
        }
        if arg.contains('\0') {
            return Err(FieldError::new(format!("{field}[{i}]"), "control_character", "must not contain NUL"));
        }
    }
    Ok(())
}

/// Checks environment variables: POSIX names, bounded values, nothing the platform sets.
pub fn check_env(field: &str, env: &BTreeMap<String, String>) -> Result<(), FieldError> {
    if env.len() > MAX_ENV {
        return Err(FieldError::new(field, "too_many", format!("must have at most {MAX_ENV} variables")));
    }
    for (key, value) in env {
        let at = format!("{field}.{key}");
        let mut chars = key.chars();
        let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid || key.len() > 128 {
            return Err(FieldError::new(
                at,
                "invalid_name",
                "must be a letter or underscore followed by letters, digits or underscores (at most 128)",
            ));
        }
        if key.starts_with(RESERVED_ENV_PREFIX) && !key.starts_with(SIM_HINT_PREFIX) {
            return Err(FieldError::new(at, "reserved", "names starting with FAIRWAY_ are set by the platform"));
        }
        // The NVIDIA container runtime reads these to pick the devices a container sees:
        // `NVIDIA_VISIBLE_DEVICES=all` would expose every GPU of the node, unmetered.
        if key.starts_with(DEVICE_ENV_PREFIX) {
            return Err(FieldError::new(
                at,
                "reserved",
                "names starting with NVIDIA_ select GPU devices and are set by the platform",
            ));
        }
        if value.len() > MAX_ENV_VALUE_BYTES {
            return Err(FieldError::new(at, "too_long", format!("must be at most {MAX_ENV_VALUE_BYTES} bytes")));
        }
        if value.contains('\0') {
            return Err(FieldError::new(at, "control_character", "must not contain NUL"));
        }
    }
    Ok(())
}

/// Checks labels the way Kubernetes does, since they travel to backend objects: keys of
/// 1 to 63 characters (an optional DNS prefix and `/` before), values of at most 63, both
/// of letters, digits, `-`, `_` and `.`, starting and ending alphanumeric.
pub fn check_labels(field: &str, labels: &BTreeMap<String, String>) -> Result<(), FieldError> {
    if labels.len() > MAX_LABELS {
        return Err(FieldError::new(field, "too_many", format!("must have at most {MAX_LABELS} labels")));
    }
    let segment = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && s.as_bytes()[0].is_ascii_alphanumeric()
            && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
    };
    // A prefix is a DNS subdomain: lower-case letters, digits and '-' between dots. The
    // Kubernetes backend would drop a label whose prefix is not, so it is refused here.
    let dns_label = |s: &str| {
        !s.is_empty()
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    };
    for (key, value) in labels {
        let at = format!("{field}.{key}");
        let name = key.rsplit_once('/').map_or(key.as_str(), |(prefix, name)| {
            if prefix.len() > 253 || !prefix.split('.').all(dns_label) {
                ""
            } else {
                name
            }
        });
        if !segment(name) {
            return Err(FieldError::new(
                at,
                "invalid_name",
                "must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            ));
        }
        if !value.is_empty() && !segment(value) {
            return Err(FieldError::new(
                at,
                "invalid_value",
                "must be empty or at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            ));
        }
    }
    Ok(())
}

/// Checks a preemption grace period in seconds.
pub fn check_grace(field: &str, seconds: i64) -> Result<(), FieldError> {
    check_range(field, seconds, 0, 86_400)
}

/// Checks the runtime a job declares it expects, in seconds, against the job's maximum
/// runtime: a job stopped at its maximum cannot be expected to run longer, and a declared
/// runtime of nothing would forecast every job behind it to start at once.
pub fn check_expected_runtime(field: &str, seconds: i64, max_runtime_seconds: i64) -> Result<(), FieldError> {
    if seconds < 1 {
        return Err(FieldError::new(field, "too_small", "must be at least 1"));
    }
    if seconds > max_runtime_seconds {
        return Err(FieldError::new(
            field,
            "exceeds_max_runtime",
            format!("must be at most the job's max_runtime_seconds, {max_runtime_seconds}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn states_round_trip_through_their_stored_names() {
        for s in JobState::ALL {
            assert_eq!(JobState::parse(s.as_str()), Some(s));
        }
        assert_eq!(JobState::parse("queued"), None);
    }

    #[test]
    fn job_names_may_hold_markup_but_not_control_characters() {
        assert!(check_name("name", "<script>alert(1)</script>").is_ok());
        assert_eq!(check_name("name", "a\nb").unwrap_err().code, "control_character");
        assert_eq!(check_name("name", "  ").unwrap_err().code, "empty");
        assert_eq!(check_name("name", &"x".repeat(201)).unwrap_err().code, "too_long");
    }

    #[test]
    fn platform_environment_variables_cannot_be_set_but_simulator_hints_can() {
        assert!(check_env("env", &map(&[("LR", "0.1"), ("FAIRWAY_SIM_RUNTIME_SECONDS", "3")])).is_ok());
        let err = check_env("env", &map(&[("FAIRWAY_JOB_ID", "x")])).unwrap_err();
        assert_eq!((err.field.as_str(), err.code.as_str()), ("env.FAIRWAY_JOB_ID", "reserved"));
        let err = check_env("env", &map(&[("NVIDIA_VISIBLE_DEVICES", "all")])).unwrap_err();
        assert_eq!((err.field.as_str(), err.code.as_str()), ("env.NVIDIA_VISIBLE_DEVICES", "reserved"));
        assert_eq!(check_env("env", &map(&[("1BAD", "x")])).unwrap_err().code, "invalid_name");
    }

    #[test]
    fn labels_follow_kubernetes_rules_and_name_the_bad_key() {
        assert!(check_labels("labels", &map(&[("team.example.com/project", "llm-7b"), ("run", "")])).is_ok());
        let err = check_labels("labels", &map(&[("bad key", "x")])).unwrap_err();
        assert_eq!(err.field, "labels.bad key");
        assert_eq!(check_labels("labels", &map(&[("ok", "-no")])).unwrap_err().code, "invalid_value");
        // A prefix is a DNS subdomain, as Kubernetes requires: no capitals, no '_'.
        for key in ["Team.example.com/project", "team_x.example.com/project", "-team.example.com/p", "/p"] {
            let err = check_labels("labels", &map(&[(key, "x")])).unwrap_err();
            assert_eq!((err.field, err.code.as_str()), (format!("labels.{key}"), "invalid_name"), "{key}");
        }
    }

    #[test]
    fn an_expected_runtime_is_positive_and_at_most_the_maximum_runtime() {
        assert!(check_expected_runtime("expected_runtime_seconds", 1, 3600).is_ok());
        assert!(check_expected_runtime("expected_runtime_seconds", 3600, 3600).is_ok());
        assert_eq!(check_expected_runtime("expected_runtime_seconds", 0, 3600).unwrap_err().code, "too_small");
        assert_eq!(check_expected_runtime("expected_runtime_seconds", -5, 3600).unwrap_err().code, "too_small");
        let e = check_expected_runtime("expected_runtime_seconds", 3601, 3600).unwrap_err();
        assert_eq!((e.field.as_str(), e.code.as_str()), ("expected_runtime_seconds", "exceeds_max_runtime"));
        assert!(e.message.contains("3600"), "{}", e.message);
    }

    #[test]
    fn images_with_whitespace_are_refused() {
        assert!(check_image("image", "nvcr.io/nvidia/pytorch:24.05-py3").is_ok());
        assert_eq!(check_image("image", "a b").unwrap_err().code, "invalid_characters");
        assert_eq!(check_image("image", "").unwrap_err().code, "empty");
    }
}

/// The numbers behind a waiting job's reason, as the scheduling cycle that gave the reason
/// saw them. GPU amounts are units of the job's GPU class (a MIG slice is one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WaitFigures {
    /// What the job asks for.
    pub needs_gpus: f64,
    /// What is free to it now: free GPUs of its class, less those held back for other teams'
    /// reserved quota and those promised to jobs ahead of it.
    pub free_gpus: f64,
    /// The team the reason names: whose quota, budget or borrowing blocks the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// For a quota reason: what that team (with its sub-teams) holds of the class, waiting
    /// jobs' claims included, and its quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_use_gpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_gpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst_gpus: Option<f64>,
    /// For a budget reason: the hard budget that cannot cover the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetShortfall>,
    /// The job this one waits for or behind (`reserved_for_gang`, `behind_head_of_line`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocking_job: Option<super::JobId>,
    /// The interval it is expected to start in (p10 to p90 of the forecast, calibrated by
    /// how wrong past forecasts were), around `expected_start_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub earliest_start_at: Option<chrono::DateTime<chrono::Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_start_at: Option<chrono::DateTime<chrono::Utc>>,
    /// What its start waits for that no forecast can know, when that is what it waits for:
    /// `quota_change`, `budget_change`, `capacity_change` or `driver_change`. It then has no
    /// expected start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unforeseeable: Option<String>,
    /// For `victims_in_minimum_runtime`: when enough of the jobs it may preempt have run the
    /// minimum runtime before preemption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub victims_preemptible_at: Option<chrono::DateTime<chrono::Utc>>,
    /// For `preemption_delayed`: when its preemption delay ends and it preempts, if no
    /// capacity has come by then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempts_at: Option<chrono::DateTime<chrono::Utc>>,
    /// For `preemption_delayed`: how many running jobs it would preempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub would_preempt_jobs: Option<u32>,
    /// For `waiting_for_dependencies` and `dependency_failed`: the jobs it still waits for,
    /// or the one that can no longer end as it waits for, with their states.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_for: Vec<WaitedJob>,
    /// For `driver_unavailable` and `no_driver_fit`: what the job requires and what the
    /// nodes of its class run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drivers: Option<DriverWait>,
}

/// The driver stack a waiting job requires beside what the nodes of its class run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct DriverWait {
    /// The least driver version it accepts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_driver_version: Option<String>,
    /// The least CUDA version it accepts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_cuda_version: Option<String>,
    /// The newest driver any node of its class runs; null where none says.
    pub newest_driver_version: Option<String>,
    /// The newest CUDA version any node of its class supports; null where none says.
    pub newest_cuda_version: Option<String>,
    /// Free GPUs of its class on nodes that run what it requires.
    pub free_gpus_meeting: f64,
}

/// A job another waits for, as a waiting job's figures name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WaitedJob {
    pub job: super::JobId,
    pub name: String,
    pub state: JobState,
}

/// A hard budget smaller than a job's maximum cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BudgetShortfall {
    /// What the budget counts.
    pub unit: super::BudgetUnit,
    /// The job's maximum cost (micro-units of money) or GPU time (thousandths of a GPU-hour).
    pub needs: i64,
    /// What the budget has left this period after the running jobs' remainder, in the same unit.
    pub left: i64,
}
