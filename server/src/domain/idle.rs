//! Idle reclamation: a GPU a job holds but does not use is the costliest waste a platform
//! has, and allocation alone cannot see it. A job is idle while its GPUs' SM activity (DCGM,
//! the job's GPU-weighted mean) stays below a policy's threshold; after the policy's time it
//! is warned, and after the notice the policy acts: it stops the job, preempts it (it
//! requeues), or only notifies. Policies are set per team and priority class; the most
//! specific one governs a job, and one whose action is `exempt` opts its jobs out.
//!
//! The rule is pure ([`step`]); `control::utilisation` applies it after each read.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{FieldError, TeamId};

/// SM activity (percent) below which a job counts as idle where no policy says otherwise:
/// the idle GPU-hours a statement reports are counted against it.
pub const DEFAULT_IDLE_BELOW_SM_ACTIVE_PERCENT: f64 = 5.0;

/// Longest idle time or notice a policy may set: a week.
pub const MAX_POLICY_SECONDS: i32 = 7 * 86_400;

/// What a policy does once a job has been idle for its time and the notice has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IdleAction {
    /// Warn only: an event in the job's timeline (and its webhooks).
    Notify,
    /// Warn, then stop the job with its grace period: it ends cancelled, reason `idle`.
    Stop,
    /// Warn, then preempt it with its grace period: it requeues, reason `idle`.
    Preempt,
    /// Never: the jobs this policy governs are not warned nor reclaimed.
    Exempt,
}

impl IdleAction {
    /// Every action, for validation messages.
    pub const ALL: [IdleAction; 4] = [IdleAction::Notify, IdleAction::Stop, IdleAction::Preempt, IdleAction::Exempt];

    /// The value stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            IdleAction::Notify => "notify",
            IdleAction::Stop => "stop",
            IdleAction::Preempt => "preempt",
            IdleAction::Exempt => "exempt",
        }
    }

    /// Parses the stored value.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.as_str() == s)
    }

    /// Whether the action reclaims the GPUs (after the notice).
    pub fn reclaims(self) -> bool {
        matches!(self, IdleAction::Stop | IdleAction::Preempt)
    }
}

/// An idle policy: for the jobs of a team (or every team) in a priority class (or every
/// class).
#[derive(Debug, Clone, PartialEq)]
pub struct IdlePolicy {
    /// `None`: every team without a policy of its own.
    pub team_id: Option<TeamId>,
    /// `None`: every priority class.
    pub priority_class: Option<String>,
    /// A job is idle while its SM activity is below this, percent.
    pub below_sm_active_percent: f64,
    /// How long a job must stay idle before it is warned.
    pub idle_seconds: i32,
    /// How long after the warning the policy acts.
    pub notice_seconds: i32,
    pub action: IdleAction,
}

impl IdlePolicy {
    /// Checks the figures, naming the field at fault.
    pub fn validate(&self) -> Result<(), Vec<FieldError>> {
        let mut errors = Vec::new();
        let p = self.below_sm_active_percent;
        if !(p.is_finite() && p > 0.0 && p <= 100.0) {
            errors.push(FieldError::new(
                "below_sm_active_percent",
                "out_of_range",
                "must be a percentage above 0 and at most 100",
            ));
        }
        for (field, value, least) in
            [("idle_seconds", self.idle_seconds, 1), ("notice_seconds", self.notice_seconds, 0)]
        {
            if !(least..=MAX_POLICY_SECONDS).contains(&value) {
                errors.push(FieldError::new(
                    field,
                    "out_of_range",
                    format!("must be between {least} and {MAX_POLICY_SECONDS} seconds (a week)"),
                ));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }

    /// How specific the policy is: a team's own class beats the team's, which beats a
    /// class's for every team, which beats the platform's default.
    fn rank(&self) -> u8 {
        u8::from(self.team_id.is_some()) * 2 + u8::from(self.priority_class.is_some())
    }
}

/// The policy that governs a job of `team` in `priority_class`: the most specific of those
/// that match it.
pub fn governing<'a>(policies: &'a [IdlePolicy], team: TeamId, priority_class: &str) -> Option<&'a IdlePolicy> {
    policies
        .iter()
        .filter(|p| p.team_id.is_none_or(|t| t == team))
        .filter(|p| p.priority_class.as_deref().is_none_or(|c| c == priority_class))
        .max_by_key(|p| p.rank())
}

impl IdlePolicy {
    /// What it does to a job, in words: `SM activity below 10% for 30 min: warned, then
    /// stopped 10 min later`.
    pub fn summary(&self) -> String {
        let when = format!(
            "SM activity below {}% for {}",
            self.below_sm_active_percent,
            duration_words(i64::from(self.idle_seconds))
        );
        let notice = duration_words(i64::from(self.notice_seconds));
        match self.action {
            IdleAction::Notify => format!("{when}: warned"),
            IdleAction::Stop => format!("{when}: warned, then stopped {notice} later unless its GPUs get busy"),
            IdleAction::Preempt => format!("{when}: warned, then requeued {notice} later unless its GPUs get busy"),
            IdleAction::Exempt => "exempt: never warned nor reclaimed".to_owned(),
        }
    }
}

/// A duration in seconds, as people say it: `45 s`, `12 min`, `2 h 5 min`.
pub fn duration_words(seconds: i64) -> String {
    match seconds.max(0) {
        s if s < 120 => format!("{s} s"),
        s if s < 7_200 => format!("{} min", s / 60),
        s => format!("{} h {} min", s / 3_600, s % 3_600 / 60),
    }
}

/// An attempt's current idle stretch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stretch {
    pub started_at: DateTime<Utc>,
    pub warned_at: Option<DateTime<Utc>>,
    /// The policy acted on it already (a stop or preemption is under way).
    pub acted: bool,
}

/// What one read of a job's activity leads to.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    /// Busy, and not idle before: nothing.
    Busy,
    /// Busy again: the stretch ends, and a warning given is lifted.
    Ended { warned: bool },
    /// Idle: a stretch begins now.
    Began,
    /// Idle, and nothing is due yet (or nothing ever will be: no policy acts on the job).
    Continues,
    /// Idle for the policy's time: warn, saying when the policy will act (never for
    /// `notify`).
    Warn { act_at: Option<DateTime<Utc>> },
    /// Warned, and the notice has passed: act.
    Act(IdleAction),
}

/// The next step for a job whose SM activity reads `sm_active_percent` at `now`, under
/// `policy` (the governing one, if any), in `stretch` (its current idle stretch, if any).
pub fn step(
    policy: Option<&IdlePolicy>,
    stretch: Option<&Stretch>,
    sm_active_percent: f64,
    now: DateTime<Utc>,
) -> Step {
    let below = policy.map_or(DEFAULT_IDLE_BELOW_SM_ACTIVE_PERCENT, |p| p.below_sm_active_percent);
    let idle = sm_active_percent < below;
    let Some(stretch) = stretch else { return if idle { Step::Began } else { Step::Busy } };
    if !idle {
        return Step::Ended { warned: stretch.warned_at.is_some() };
    }
    let Some(policy) = policy.filter(|p| p.action != IdleAction::Exempt) else { return Step::Continues };
    let seconds = |s: i32| Duration::seconds(i64::from(s));
    match stretch.warned_at {
        _ if stretch.acted => Step::Continues,
        None if now >= stretch.started_at + seconds(policy.idle_seconds) => {
            Step::Warn { act_at: policy.action.reclaims().then(|| now + seconds(policy.notice_seconds)) }
        }
        Some(warned) if policy.action.reclaims() && now >= warned + seconds(policy.notice_seconds) => {
            Step::Act(policy.action)
        }
        _ => Step::Continues,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(team: Option<TeamId>, class: Option<&str>, action: IdleAction) -> IdlePolicy {
        IdlePolicy {
            team_id: team,
            priority_class: class.map(str::to_owned),
            below_sm_active_percent: 10.0,
            idle_seconds: 600,
            notice_seconds: 300,
            action,
        }
    }

    fn at(minute: i64) -> DateTime<Utc> {
        "2026-11-28T10:00:00Z".parse::<DateTime<Utc>>().unwrap() + Duration::minutes(minute)
    }

    #[test]
    fn idle_time_reads_in_the_unit_people_use() {
        assert_eq!(duration_words(45), "45 s");
        assert_eq!(duration_words(600), "10 min");
        assert_eq!(duration_words(7_500), "2 h 5 min");
    }

    #[test]
    fn a_policy_says_what_it_does_to_a_job_in_one_sentence() {
        let stop = IdlePolicy { idle_seconds: 1800, notice_seconds: 600, ..policy(None, None, IdleAction::Stop) };
        assert_eq!(
            stop.summary(),
            "SM activity below 10% for 30 min: warned, then stopped 10 min later unless its GPUs get busy"
        );
        let notify = IdlePolicy { below_sm_active_percent: 2.5, ..policy(None, None, IdleAction::Notify) };
        assert_eq!(notify.summary(), "SM activity below 2.5% for 10 min: warned");
        assert_eq!(policy(None, None, IdleAction::Exempt).summary(), "exempt: never warned nor reclaimed");
    }

    #[test]
    fn the_most_specific_policy_governs_and_an_exempt_one_opts_its_jobs_out() {
        let (ml, vision) = (TeamId::new(), TeamId::new());
        let policies = [
            policy(None, None, IdleAction::Notify),
            policy(None, Some("experiment"), IdleAction::Preempt),
            policy(Some(ml), None, IdleAction::Stop),
            policy(Some(ml), Some("production"), IdleAction::Exempt),
        ];
        let action = |team, class| governing(&policies, team, class).map(|p| p.action);
        assert_eq!(action(ml, "production"), Some(IdleAction::Exempt));
        assert_eq!(action(ml, "experiment"), Some(IdleAction::Stop), "the team's own beats the class's");
        assert_eq!(action(vision, "experiment"), Some(IdleAction::Preempt));
        assert_eq!(action(vision, "production"), Some(IdleAction::Notify));
        assert_eq!(governing(&[], ml, "experiment"), None);
    }

    #[test]
    fn an_idle_job_is_warned_after_the_policys_time_and_reclaimed_after_the_notice() {
        let p = policy(None, None, IdleAction::Preempt);
        assert_eq!(step(Some(&p), None, 50.0, at(0)), Step::Busy);
        assert_eq!(step(Some(&p), None, 2.0, at(0)), Step::Began);
        let mut s = Stretch { started_at: at(0), warned_at: None, acted: false };
        assert_eq!(step(Some(&p), Some(&s), 2.0, at(9)), Step::Continues);
        assert_eq!(step(Some(&p), Some(&s), 2.0, at(10)), Step::Warn { act_at: Some(at(15)) });
        s.warned_at = Some(at(10));
        assert_eq!(step(Some(&p), Some(&s), 2.0, at(14)), Step::Continues);
        assert_eq!(step(Some(&p), Some(&s), 2.0, at(15)), Step::Act(IdleAction::Preempt));
        s.acted = true;
        assert_eq!(step(Some(&p), Some(&s), 2.0, at(16)), Step::Continues, "acted once");
        // Busy again before the notice ends: the warning is lifted.
        let warned = Stretch { started_at: at(0), warned_at: Some(at(10)), acted: false };
        assert_eq!(step(Some(&p), Some(&warned), 10.0, at(12)), Step::Ended { warned: true });
    }

    #[test]
    fn a_notify_policy_warns_once_and_never_acts_and_without_a_policy_idle_time_is_only_counted() {
        let p = policy(None, None, IdleAction::Notify);
        let s = Stretch { started_at: at(0), warned_at: None, acted: false };
        assert_eq!(step(Some(&p), Some(&s), 2.0, at(10)), Step::Warn { act_at: None });
        let warned = Stretch { warned_at: Some(at(10)), ..s.clone() };
        assert_eq!(step(Some(&p), Some(&warned), 2.0, at(600)), Step::Continues);
        // No policy: idle below the default threshold, counted, never warned.
        assert_eq!(step(None, None, 4.0, at(0)), Step::Began);
        assert_eq!(step(None, Some(&s), 4.0, at(600)), Step::Continues);
        assert_eq!(step(None, Some(&s), 6.0, at(601)), Step::Ended { warned: false });
        let exempt = policy(None, None, IdleAction::Exempt);
        assert_eq!(step(Some(&exempt), Some(&s), 0.0, at(600)), Step::Continues);
    }

    #[test]
    fn a_policys_figures_are_checked_field_by_field() {
        let bad = IdlePolicy {
            below_sm_active_percent: 0.0,
            idle_seconds: 0,
            notice_seconds: MAX_POLICY_SECONDS + 1,
            ..policy(None, None, IdleAction::Stop)
        };
        let fields: Vec<String> = bad.validate().unwrap_err().into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["below_sm_active_percent", "idle_seconds", "notice_seconds"]);
        assert!(policy(None, None, IdleAction::Stop).validate().is_ok());
    }

    /// The idle rule over what a real H200 reported, sample by sample: one thread block
    /// spinning keeps GPU utilisation at 100% (a kernel runs at every instant) while under 1%
    /// of the chip works, and the rule, which reads SM activity, reclaims it as it does a
    /// GPU that only holds memory; dense matrix work never reads idle.
    #[test]
    fn a_real_gpu_at_100_percent_utilisation_with_one_block_spinning_is_idle_and_reclaimed() {
        use crate::domain::activity::h200;
        let spinning = h200::phase("one block spinning");
        let util = h200::median(spinning.iter().map(|s| s.gpu_util_pct).collect());
        let sm = h200::median(spinning.iter().filter_map(|s| s.sm_active_pct).collect());
        assert!(util >= 99.0 && sm < 1.0, "what the H200 said: utilisation {util}%, SM activity {sm}%");
        // A policy of 10% for 2 s with 1 s of notice, over each phase from its start.
        let p = IdlePolicy { idle_seconds: 2, notice_seconds: 1, ..policy(None, None, IdleAction::Stop) };
        let replay = |phase: &str, skip: usize| -> Vec<Step> {
            let mut stretch: Option<Stretch> = None;
            let mut steps = Vec::new();
            for s in h200::phase(phase).into_iter().skip(skip) {
                let Some(sm) = s.sm_active_pct else { continue };
                let now = at(0) + Duration::milliseconds((s.t_s * 1000.0) as i64);
                let step = step(Some(&p), stretch.as_ref(), sm, now);
                match step {
                    Step::Began => stretch = Some(Stretch { started_at: now, warned_at: None, acted: false }),
                    Step::Warn { .. } => stretch.as_mut().unwrap().warned_at = Some(now),
                    Step::Act(_) => stretch.as_mut().unwrap().acted = true,
                    Step::Ended { .. } => stretch = None,
                    Step::Busy | Step::Continues => {}
                }
                steps.push(step);
            }
            steps
        };
        for phase in ["idle, 9 GiB held", "one block spinning"] {
            let steps = replay(phase, 0);
            assert_eq!(
                steps.iter().filter(|s| matches!(s, Step::Act(IdleAction::Stop))).count(),
                1,
                "{phase}: {steps:?}"
            );
        }
        // Its first sample straddles the phase before it.
        let busy = replay("bf16 matmul continuously", 1);
        assert!(busy.iter().all(|s| *s == Step::Busy), "{busy:?}");
        // Work 2% of each second reads about that on average, as an exporter that averages
        // over its interval reports it: idle too.
        let sparse: Vec<f64> =
            h200::phase("bf16 matmul 2% of each second").iter().filter_map(|s| s.sm_active_pct).collect();
        let mean = sparse.iter().sum::<f64>() / sparse.len() as f64;
        assert!(mean < p.below_sm_active_percent, "{mean}");
    }
}
