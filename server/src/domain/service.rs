//! Inference services: what one may be (its name, its size, its port), the replica template
//! every replica is made from, and the pure rules the leader's service pass follows: which
//! replicas to start and stop for the size asked and the current revision (a rolling update
//! one replica at a time), and the state a service shows.
//!
//! A service is `replicas` independent replicas (not a gang), each a job of one replica in
//! a slot `0..replicas`. Slots below `min_replicas` run at a non-preemptible priority class,
//! so they are admitted only within the team's reserved quota and never preempted; slots
//! above it run at a preemptible class, may borrow burst capacity, and are the first victims
//! (a replica keeps no progress: it loses no work when stopped).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::{check_range, workload::Workload, FieldError, GpuClassId, JobId, JobState};

/// The most replicas a service may have.
pub const MAX_REPLICAS: i64 = 64;
/// The longest service name: the Kubernetes Service is `fw-svc-<name>`, a DNS label of at
/// most 63 characters.
pub const MAX_NAME: usize = 50;
/// Restarts each replica gets after the application fails, when the service names none.
pub const DEFAULT_RESTART_BUDGET: i32 = 5;
/// The most restarts a replica may be given.
pub const MAX_RESTART_BUDGET: i64 = 1000;
/// The port replicas listen on when the service names none.
pub const DEFAULT_PORT: i64 = 8000;
/// A replica's "maximum runtime": none. Stored as the largest the column holds, which the
/// engine's budgets and forecasts read as "never ends on its own".
pub const NO_MAXIMUM_RUNTIME_SECONDS: i32 = i32::MAX;

/// The variables a replica learns its place from.
pub const SERVICE_ENV: &str = "FAIRWAY_SERVICE";
/// The replica's slot, 0 to replicas - 1.
pub const REPLICA_ENV: &str = "FAIRWAY_SERVICE_REPLICA";
/// The service's revision the replica runs.
pub const REVISION_ENV: &str = "FAIRWAY_SERVICE_REVISION";
/// The port to listen on, as most serving frameworks read it.
pub const PORT_ENV: &str = "PORT";

/// A service's name: a DNS-1035 label (lowercase letters, digits and `-`, starting with a
/// letter), unique among the team's live services.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct ServiceName(String);

impl ServiceName {
    /// Parses `value`, reporting a failure against `field`.
    pub fn parse(field: &str, value: &str) -> Result<Self, FieldError> {
        super::names::check_name(field, value, MAX_NAME, b"-")?;
        if !value.as_bytes()[0].is_ascii_lowercase() {
            return Err(FieldError::new(field, "invalid_format", "must start with a lowercase letter"));
        }
        Ok(Self(value.to_owned()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The variables that tell replica `slot` of service `name` at `revision` its place.
pub fn replica_env(name: &str, slot: i32, revision: i32, port: i32) -> Vec<(&'static str, String)> {
    vec![
        (SERVICE_ENV, name.to_owned()),
        (REPLICA_ENV, slot.to_string()),
        (REVISION_ENV, revision.to_string()),
        (PORT_ENV, port.to_string()),
    ]
}

/// Checks a service's sizes and port, naming `min_replicas`, `max_replicas`, `replicas` and
/// `port`.
pub fn check_size(min: i64, max: i64, replicas: i64) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let min_ok = check_range("min_replicas", min, 1, MAX_REPLICAS).map_err(|e| errors.push(e)).is_ok();
    let max_ok = check_range("max_replicas", max, 1, MAX_REPLICAS).map_err(|e| errors.push(e)).is_ok();
    if min_ok && max_ok && max < min {
        errors.push(FieldError::new("max_replicas", "too_small", format!("must be at least min_replicas ({min})")));
    } else if min_ok && max_ok && !(min..=max).contains(&replicas) {
        errors.push(FieldError::new(
            "replicas",
            "out_of_range",
            format!("must be between min_replicas ({min}) and max_replicas ({max})"),
        ));
    }
    errors
}

/// What every replica of a service is made from, validated when the service was created or
/// updated: a job of one replica with no maximum runtime.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Template {
    pub gpu_class_id: GpuClassId,
    pub gpus: i32,
    pub image: String,
    pub command: Vec<String>,
    /// Variables, an object of strings.
    pub env: Value,
    /// Labels, an object of strings.
    pub labels: Value,
    pub cpu_millis: Option<i32>,
    pub memory_mib: Option<i32>,
    pub workload: Workload,
    pub preemption_grace_seconds: Option<i32>,
    /// The non-preemptible class of the replicas below `min_replicas`.
    pub priority_class: String,
    /// The preemptible class of the replicas above it.
    pub burst_priority_class: String,
    /// Restarts each replica gets after the application fails (its job's `max_retries`).
    pub restart_budget: i32,
    /// The driver stack each replica's node must run at least (a job's minimums); absent
    /// from templates stored before services could ask.
    #[serde(default)]
    pub min_driver_version: Option<String>,
    #[serde(default)]
    pub min_cuda_version: Option<String>,
}

impl Template {
    /// The priority class of the replica in `slot` of a service of at least `min` replicas.
    pub fn priority_of(&self, slot: i32, min: i32) -> &str {
        if slot < min {
            &self.priority_class
        } else {
            &self.burst_priority_class
        }
    }
}

/// The pending reasons (the engine's codes) that mean there is no room for a replica beside
/// the one it replaces, and that stopping that one makes: its team's quota is used, the
/// cluster's GPUs are, or a hard budget (which the running replica commits to) is. A rolling
/// update trades the old replica for the new one only for these: never while the engine is
/// already making room (reclaiming, holding GPUs for a gang, waiting out a minimum runtime),
/// nor when the replica alone exceeds its quota (stopping the old one would not help).
pub const NO_ROOM_REASONS: [&str; 5] =
    ["burst_limit", "reserved_quota_exhausted", "insufficient_capacity", "fair_share", "budget_exhausted"];

/// Where one replica job is, as the service pass sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Pending: not yet decided by a cycle, or waiting while the engine makes room.
    Queued,
    /// Pending for want of room (one of [`NO_ROOM_REASONS`]).
    Blocked,
    /// Admitted, being created.
    Starting,
    /// Running.
    Running,
    /// Preempted and still giving its GPUs back: it requeues.
    Requeuing,
    /// Cancelled and still giving its GPUs back: it does not come back.
    Stopping,
    /// Over: cancelled (`counts_against_budget` false), or failed, succeeded or preempted
    /// for good (true).
    Ended { counts_against_budget: bool },
}

impl Phase {
    /// The phase of a job in `state`, holding GPUs or not, with the pending reason it shows.
    pub fn of(state: JobState, holds_gpus: bool, reason: Option<&str>) -> Self {
        match state {
            JobState::Pending if reason.is_some_and(|r| NO_ROOM_REASONS.contains(&r)) => Phase::Blocked,
            JobState::Pending => Phase::Queued,
            JobState::Admitted => Phase::Starting,
            JobState::Running => Phase::Running,
            JobState::Preempted if holds_gpus => Phase::Requeuing,
            JobState::Cancelled if holds_gpus => Phase::Stopping,
            JobState::Cancelled => Phase::Ended { counts_against_budget: false },
            JobState::Succeeded | JobState::Failed | JobState::Preempted => {
                Phase::Ended { counts_against_budget: true }
            }
        }
    }

    /// Whether the replica holds its slot: it runs, or will.
    pub fn is_live(self) -> bool {
        matches!(self, Phase::Queued | Phase::Blocked | Phase::Starting | Phase::Running | Phase::Requeuing)
    }
}

/// One replica job of a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replica {
    pub job: JobId,
    pub slot: i32,
    pub revision: i32,
    /// Runs at the service's guaranteed (non-preemptible) class, as the minimum's slots do.
    pub guaranteed: bool,
    pub phase: Phase,
    /// Ended at or after the service's last change (of size, minimum or revision).
    pub since_change: bool,
}

/// What a service asks for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// Replicas wanted (0 once deleted).
    pub replicas: i32,
    /// Slots below it run at the guaranteed class.
    pub min: i32,
    pub revision: i32,
}

impl Target {
    /// Whether `r` runs what its slot should: the current revision, at its slot's class. A
    /// replica that does not is replaced as a rolling update replaces one.
    pub fn is_current(&self, r: &Replica) -> bool {
        r.revision == self.revision && r.guaranteed == (r.slot < self.min)
    }
}

/// What the pass does for one service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Slots to start a replica of the current revision in.
    pub start: Vec<i32>,
    /// Replica jobs to stop, each with why.
    pub stop: Vec<(JobId, StopWhy)>,
}

/// Why the pass stops a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopWhy {
    /// Its slot is beyond the size asked.
    ScaledDown,
    /// A replica of the current revision took its place, or will once it has stopped: `by`,
    /// which must still be live when the stop is made.
    Replaced { by: JobId },
    /// A replica of the current revision that found no room beside the one it replaces:
    /// withdrawn, so that the old one stops first and a new one starts after it.
    NoRoom,
}

/// The replicas to start and stop so that `target` holds, given the service's replica jobs:
/// - a slot beyond the size asked loses its replica;
/// - an empty slot gets one of the current revision, unless a replica of it ended for good
///   since the last change (its restart budget is spent: the slot stays empty until the
///   service is changed again);
/// - a slot whose replica still gives its GPUs back waits for it to finish before it gets
///   a new one, so that a slot never holds GPUs twice;
/// - a rolling update replaces one slot at a time: once every replica of the current
///   revision runs and none stops, the lowest slot still on an older one gets a new
///   replica beside it (the engine admits it only within the quotas); the old one stops
///   when the new one runs. When the new one cannot start for want of room, both stop (the
///   new one has held nothing) and the slot starts over once the old one has stopped: the
///   update never holds more GPUs than the quotas allow, not even during a grace period.
pub fn plan(target: Target, replicas: &[Replica]) -> Plan {
    let mut plan = Plan::default();
    let live: Vec<&Replica> = replicas.iter().filter(|r| r.phase.is_live()).collect();
    for r in live.iter().filter(|r| r.slot >= target.replicas) {
        plan.stop.push((r.job, StopWhy::ScaledDown));
    }
    let mut rolling = false;
    for slot in 0..target.replicas {
        let mut here: Vec<&&Replica> = live.iter().filter(|r| r.slot == slot).collect();
        if here.is_empty() {
            // A replica still giving its GPUs back keeps its successor waiting, so that the
            // two never hold GPUs at once.
            let stopping = replicas.iter().any(|r| r.slot == slot && r.phase == Phase::Stopping);
            if !stopping && !spent(target, slot, replicas) {
                plan.start.push(slot);
            }
            continue;
        }
        // The replica that keeps the slot: a current one first, the furthest along.
        here.sort_by_key(|r| (!target.is_current(r), std::cmp::Reverse(rank(r.phase)), r.job));
        let keep = here[0];
        let current = target.is_current(keep);
        let mut no_room = false;
        for r in &here[1..] {
            if target.is_current(r) || !current || keep.phase == Phase::Running {
                plan.stop.push((r.job, StopWhy::Replaced { by: keep.job }));
            } else if keep.phase == Phase::Blocked {
                plan.stop.push((r.job, StopWhy::Replaced { by: keep.job }));
                no_room = true;
            } else {
                rolling = true;
            }
        }
        if no_room {
            plan.stop.push((keep.job, StopWhy::NoRoom));
        }
    }
    let current_all_running =
        live.iter().filter(|r| r.slot < target.replicas && target.is_current(r)).all(|r| r.phase == Phase::Running);
    let anything_stopping = replicas.iter().any(|r| r.phase == Phase::Stopping);
    if !rolling && plan.start.is_empty() && plan.stop.is_empty() && current_all_running && !anything_stopping {
        // A new replica that ran out of restarts since the change halts the roll (as a
        // Deployment's rollout stalls on a crashing pod): the service reads `degraded`, the old
        // replicas serving on, until the next change.
        let halted = (0..target.replicas).any(|slot| spent(target, slot, replicas));
        let next = (0..target.replicas).find(|&slot| {
            let here: Vec<_> = live.iter().filter(|r| r.slot == slot).collect();
            !here.is_empty() && here.iter().all(|r| !target.is_current(r))
        });
        plan.start.extend(next.filter(|_| !halted));
    }
    plan
}

/// Whether a current replica in `slot` (of the current revision and class) ended for good
/// since the service's last change: its restarts are spent, and the slot gets no new one
/// until the service changes again. An old replica that ends is simply replaced.
fn spent(target: Target, slot: i32, replicas: &[Replica]) -> bool {
    replicas.iter().any(|r| {
        r.slot == slot
            && r.since_change
            && target.is_current(r)
            && r.phase == Phase::Ended { counts_against_budget: true }
    })
}

/// How far along a live replica is, to choose which keeps a slot.
fn rank(phase: Phase) -> u8 {
    match phase {
        Phase::Running => 5,
        Phase::Starting => 4,
        Phase::Requeuing => 3,
        Phase::Blocked => 2,
        Phase::Queued => 1,
        Phase::Stopping | Phase::Ended { .. } => 0,
    }
}

/// Where a service is, from its replicas: what a person reads first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ServiceState {
    /// Fewer than `min_replicas` replicas of it run yet.
    Starting,
    /// Every replica asked for runs the current revision.
    Ready,
    /// At least `min_replicas` run, and replicas are being added or removed.
    Scaling,
    /// Replicas of an older revision (or of the wrong class for their slot, after the
    /// minimum changed) are being replaced.
    Rolling,
    /// A replica ended for good since the last change (its restarts spent, or preempted or
    /// its node lost more often than the platform retries): its slot stays empty, or on its
    /// old revision, until the service is changed again.
    Degraded,
    /// Deleted: its replicas stop, its bills remain.
    Deleted,
}

/// A service's replicas per phase.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ReplicaCounts {
    /// Running, any revision.
    pub running: i32,
    /// Running the current revision.
    pub current: i32,
    /// Admitted and being created, or preempted and requeuing.
    pub starting: i32,
    /// Waiting in the queue.
    pub waiting: i32,
    /// Asked to stop, still giving their GPUs back.
    pub stopping: i32,
    /// Slots left empty: a replica's restart budget is spent.
    pub given_up: i32,
}

/// The counts and the state of a service asking for `target`, `deleted` or not.
pub fn summary(target: Target, deleted: bool, replicas: &[Replica]) -> (ReplicaCounts, ServiceState) {
    let mut c = ReplicaCounts::default();
    for r in replicas {
        match r.phase {
            Phase::Running => {
                c.running += 1;
                if target.is_current(r) {
                    c.current += 1;
                }
            }
            Phase::Starting | Phase::Requeuing => c.starting += 1,
            Phase::Queued | Phase::Blocked => c.waiting += 1,
            Phase::Stopping => c.stopping += 1,
            Phase::Ended { .. } => {}
        }
    }
    c.given_up = (0..target.replicas)
        .filter(|&slot| {
            spent(target, slot, replicas)
                && !replicas.iter().any(|r| r.slot == slot && r.phase.is_live() && target.is_current(r))
        })
        .count() as i32;
    let old_live = replicas.iter().any(|r| r.phase.is_live() && r.slot < target.replicas && !target.is_current(r));
    let surplus = replicas.iter().any(|r| r.phase.is_live() && r.slot >= target.replicas);
    let state = if deleted {
        ServiceState::Deleted
    } else if c.given_up > 0 {
        ServiceState::Degraded
    } else if old_live {
        ServiceState::Rolling
    } else if c.running < target.min {
        ServiceState::Starting
    } else if c.current != target.replicas || surplus {
        ServiceState::Scaling
    } else {
        ServiceState::Ready
    };
    (c, state)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replica at the burst class (the targets below have no minimum, unless they say).
    fn r(n: u128, slot: i32, revision: i32, phase: Phase) -> Replica {
        Replica {
            job: JobId::from(uuid::Uuid::from_u128(n)),
            slot,
            revision,
            guaranteed: false,
            phase,
            since_change: true,
        }
    }
    /// A replica at the guaranteed class.
    fn g(n: u128, slot: i32, revision: i32, phase: Phase) -> Replica {
        Replica { guaranteed: true, ..r(n, slot, revision, phase) }
    }
    fn job(n: u128) -> JobId {
        JobId::from(uuid::Uuid::from_u128(n))
    }
    const FAILED: Phase = Phase::Ended { counts_against_budget: true };
    const CANCELLED: Phase = Phase::Ended { counts_against_budget: false };

    #[test]
    fn a_new_service_starts_a_replica_in_every_slot() {
        let p = plan(Target { replicas: 3, min: 0, revision: 1 }, &[]);
        assert_eq!(p, Plan { start: vec![0, 1, 2], stop: vec![] });
    }

    #[test]
    fn scaling_down_stops_the_highest_slots_and_scaling_up_fills_new_ones() {
        let live = [r(1, 0, 1, Phase::Running), r(2, 1, 1, Phase::Running), r(3, 2, 1, Phase::Blocked)];
        let down = plan(Target { replicas: 2, min: 0, revision: 1 }, &live);
        assert_eq!(down, Plan { start: vec![], stop: vec![(job(3), StopWhy::ScaledDown)] });
        let up = plan(Target { replicas: 4, min: 0, revision: 1 }, &live);
        assert_eq!(up, Plan { start: vec![3], stop: vec![] });
    }

    #[test]
    fn a_slot_whose_replica_was_cancelled_is_refilled_but_one_out_of_restarts_stays_empty() {
        let cancelled = [r(1, 0, 1, CANCELLED), r(2, 1, 1, Phase::Running)];
        assert_eq!(plan(Target { replicas: 2, min: 0, revision: 1 }, &cancelled).start, vec![0]);
        let failed = [r(1, 0, 1, FAILED), r(2, 1, 1, Phase::Running)];
        assert_eq!(plan(Target { replicas: 2, min: 0, revision: 1 }, &failed), Plan::default());
        let (counts, state) = summary(Target { replicas: 2, min: 0, revision: 1 }, false, &failed);
        assert_eq!((counts.given_up, state), (1, ServiceState::Degraded));
        // A change after the failure (scale or update) gives the slot a new replica.
        let before_change = [Replica { since_change: false, ..failed[0] }, failed[1]];
        assert_eq!(plan(Target { replicas: 2, min: 0, revision: 1 }, &before_change).start, vec![0]);
    }

    #[test]
    fn a_rolling_update_replaces_one_slot_at_a_time_and_waits_for_the_new_replica() {
        let target = Target { replicas: 2, min: 0, revision: 2 };
        let old = [r(1, 0, 1, Phase::Running), r(2, 1, 1, Phase::Running)];
        // First step: a new replica beside the lowest old one; nothing stops yet.
        assert_eq!(plan(target, &old), Plan { start: vec![0], stop: vec![] });
        let (_, state) = summary(target, false, &old);
        assert_eq!(state, ServiceState::Rolling);
        // While it is queued, nothing else happens.
        let queued = [old[0], old[1], r(3, 0, 2, Phase::Queued)];
        assert_eq!(plan(target, &queued), Plan::default());
        // Once it runs, the old one in its slot stops; the next slot waits for that plan.
        let running = [old[0], old[1], r(3, 0, 2, Phase::Running)];
        assert_eq!(
            plan(target, &running),
            Plan { start: vec![], stop: vec![(job(1), StopWhy::Replaced { by: job(3) })] }
        );
        // The second slot waits for the first's old replica to stop, then rolls.
        let stopping = [r(1, 0, 1, Phase::Stopping), old[1], r(3, 0, 2, Phase::Running)];
        assert_eq!(plan(target, &stopping), Plan::default());
        let next = [r(1, 0, 1, CANCELLED), old[1], r(3, 0, 2, Phase::Running)];
        assert_eq!(plan(target, &next), Plan { start: vec![1], stop: vec![] });
        let done = [r(3, 0, 2, Phase::Running), r(4, 1, 2, Phase::Running)];
        assert_eq!(plan(target, &done), Plan::default());
        assert_eq!(summary(target, false, &done).1, ServiceState::Ready);
    }

    #[test]
    fn a_new_replica_that_cannot_start_for_want_of_room_makes_the_old_one_give_way() {
        let target = Target { replicas: 2, min: 0, revision: 2 };
        let blocked = [r(1, 0, 1, Phase::Running), r(2, 1, 1, Phase::Running), r(3, 0, 2, Phase::Blocked)];
        let both =
            Plan { start: vec![], stop: vec![(job(1), StopWhy::Replaced { by: job(3) }), (job(3), StopWhy::NoRoom)] };
        assert_eq!(plan(target, &blocked), both);
        // The slot waits while the old one stops; the other slot does not roll meanwhile.
        let stopping = [r(1, 0, 1, Phase::Stopping), r(2, 1, 1, Phase::Running), r(3, 0, 2, CANCELLED)];
        assert_eq!(plan(target, &stopping), Plan::default());
        // Once it has stopped, the slot gets its new replica.
        let stopped = [r(1, 0, 1, CANCELLED), r(2, 1, 1, Phase::Running), r(3, 0, 2, CANCELLED)];
        assert_eq!(plan(target, &stopped).start, vec![0]);
    }

    #[test]
    fn an_old_replica_that_fails_during_a_roll_comes_back_at_the_new_revision() {
        let target = Target { replicas: 2, min: 0, revision: 2 };
        let lost = [r(1, 0, 1, CANCELLED), r(2, 1, 1, Phase::Running)];
        assert_eq!(plan(target, &lost).start, vec![0]);
        // Failed for good, not cancelled: still not the new revision's failure.
        let failed = [r(1, 0, 1, FAILED), r(2, 1, 1, Phase::Running)];
        assert_eq!(plan(target, &failed).start, vec![0]);
        assert_ne!(summary(target, false, &failed).1, ServiceState::Degraded);
    }

    #[test]
    fn states_read_in_order_of_what_matters() {
        let t = Target { replicas: 3, min: 2, revision: 1 };
        let starting = [g(1, 0, 1, Phase::Running), g(2, 1, 1, Phase::Queued), r(3, 2, 1, Phase::Queued)];
        assert_eq!(summary(t, false, &starting).1, ServiceState::Starting);
        let scaling = [g(1, 0, 1, Phase::Running), g(2, 1, 1, Phase::Running), r(3, 2, 1, Phase::Blocked)];
        let (counts, state) = summary(t, false, &scaling);
        assert_eq!(state, ServiceState::Scaling);
        assert_eq!((counts.running, counts.current, counts.waiting), (2, 2, 1));
        assert_eq!(summary(t, true, &scaling).1, ServiceState::Deleted);
    }

    #[test]
    fn raising_the_minimum_replaces_the_replica_whose_slot_now_needs_the_guaranteed_class() {
        // Slot 1 ran at the burst class under a minimum of 1; the minimum is now 2.
        let t = Target { replicas: 2, min: 2, revision: 1 };
        let before = [g(1, 0, 1, Phase::Running), r(2, 1, 1, Phase::Running)];
        assert_eq!(plan(t, &before), Plan { start: vec![1], stop: vec![] });
        assert_eq!(summary(t, false, &before).1, ServiceState::Rolling);
        let replaced = [g(1, 0, 1, Phase::Running), r(2, 1, 1, Phase::Running), g(3, 1, 1, Phase::Running)];
        assert_eq!(plan(t, &replaced), Plan { start: vec![], stop: vec![(job(2), StopWhy::Replaced { by: job(3) })] });
    }

    #[test]
    fn a_new_revision_that_keeps_failing_leaves_the_old_replica_serving_and_the_service_degraded() {
        let t = Target { replicas: 2, min: 0, revision: 2 };
        let failed = [r(1, 0, 1, Phase::Running), r(2, 1, 1, Phase::Running), r(3, 0, 2, FAILED)];
        assert_eq!(plan(t, &failed), Plan::default(), "not tried again until the next change");
        let (counts, state) = summary(t, false, &failed);
        assert_eq!((counts.given_up, state), (1, ServiceState::Degraded));
    }

    #[test]
    fn a_new_replica_waiting_while_the_engine_makes_room_does_not_make_the_old_one_give_way() {
        let t = Target { replicas: 1, min: 0, revision: 2 };
        let reclaiming = Phase::of(JobState::Pending, false, Some("waiting_for_reclaim"));
        assert_eq!(reclaiming, Phase::Queued);
        assert_eq!(Phase::of(JobState::Pending, false, Some("reserved_quota_exhausted")), Phase::Blocked);
        assert_eq!(Phase::of(JobState::Pending, false, Some("budget_exhausted")), Phase::Blocked);
        assert_eq!(Phase::of(JobState::Pending, false, Some("exceeds_quota")), Phase::Queued);
        assert_eq!(plan(t, &[r(1, 0, 1, Phase::Running), r(2, 0, 2, reclaiming)]), Plan::default());
    }

    #[test]
    fn sizes_are_checked_against_each_other() {
        assert!(check_size(2, 4, 3).is_empty());
        assert_eq!(check_size(0, 4, 3)[0].field, "min_replicas");
        assert_eq!(check_size(3, 2, 3)[0].field, "max_replicas");
        assert_eq!(check_size(2, 4, 5)[0].field, "replicas");
        assert_eq!(check_size(2, 65, 3)[0].field, "max_replicas");
    }

    #[test]
    fn names_are_dns_labels_that_start_with_a_letter() {
        assert!(ServiceName::parse("name", "llama-chat").is_ok());
        assert_eq!(ServiceName::parse("name", "7b-chat").unwrap_err().code, "invalid_format");
        assert_eq!(ServiceName::parse("name", "Chat").unwrap_err().code, "invalid_characters");
        assert_eq!(ServiceName::parse("name", &"a".repeat(51)).unwrap_err().code, "too_long");
    }

    #[test]
    fn the_minimum_runs_at_the_guaranteed_class_and_the_rest_at_the_burst_class() {
        let t = Template {
            gpu_class_id: GpuClassId::from(uuid::Uuid::nil()),
            gpus: 1,
            image: "i".into(),
            command: vec![],
            env: Value::Null,
            labels: Value::Null,
            cpu_millis: None,
            memory_mib: None,
            workload: Workload::default(),
            preemption_grace_seconds: None,
            priority_class: "production".into(),
            burst_priority_class: "experiment".into(),
            restart_budget: 5,
            min_driver_version: None,
            min_cuda_version: None,
        };
        assert_eq!(
            [t.priority_of(0, 2), t.priority_of(1, 2), t.priority_of(2, 2)],
            ["production", "production", "experiment"]
        );
    }
}
