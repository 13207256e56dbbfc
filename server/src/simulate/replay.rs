//! The event-driven simulator. A simulated clock jumps from event to event; the events are
//! job arrivals, job completions, the exits of preempted jobs when their grace period ends,
//! and preemptible jobs passing the engine's minimum runtime (from then on they may be
//! victims, so a waiting job may preempt them: a control loop cycling every few seconds would
//! notice at once, and without this event the simulator would notice only at the next
//! arrival or completion).
//! At each distinct event time the simulator applies every event of that time, then runs one
//! engine cycle on a [`Snapshot`] of the state and applies its decisions:
//! - an admitted job takes the GPUs of its placement (checked against what is free: a bad
//!   placement is an engine bug and stops the replay) and completes after its remaining work;
//! - a preempted job keeps its GPUs for its grace period, then stops and goes back to the
//!   queue. It keeps the work of its last checkpoint (one every
//!   [`CHECKPOINT_INTERVAL_MS`] of runtime) and loses the rest; the whole run counts as
//!   service it attained ([`JobSpec::attained_ms`]), as the control loop counts it.
//!
//! Between events the simulator keeps each team's usage history up to date: the money value
//! of the capacity it holds beyond its reserved quota (per class, counting its descendants'
//! jobs, as quotas nest), weighted by its jobs' priority usage factors and decayed with the
//! engine's half-life.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap, HashSet},
    time::{Duration, Instant},
};

use super::{TraceJob, Workload};
use crate::scheduler::{
    runtime::kind_of, schedule, ClassId, Config, Decisions, JobId, JobSpec, KindId, PendingReason, Policy,
    PreemptReason, PriorityId, QueueOrder, ReplicaPlacement, RunningJob, Snapshot, StartTimeModel, Topology, UNIT,
};

/// Simulated jobs checkpoint after every this much runtime.
pub const CHECKPOINT_INTERVAL_MS: i64 = 30 * 60 * 1000;

/// What a job was told, at the first cycle it waited, about when it would start (only in a
/// replay that forecasts, see [`replay_with_forecasts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Prediction {
    /// When it was told.
    pub at_ms: i64,
    /// The forecast, as a waiting job is told it: earliest, expected and latest start,
    /// calibrated by the errors of the forecasts made for jobs that started before;
    /// `None` without one.
    pub forecast: Option<[i64; 3]>,
    /// The same play before calibration: its starts with every runtime at p10, p50 and p90.
    pub played: Option<[i64; 3]>,
    /// The forecast said no forecast can know (a quota, budget or capacity change).
    pub unforeseeable: bool,
    /// The naive model's start (running jobs end at their maximum runtimes).
    pub naive: Option<i64>,
}

/// What happened to one job.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobOutcome {
    /// When it was first started.
    pub first_start_ms: Option<i64>,
    /// When it finished its work.
    pub completion_ms: Option<i64>,
    /// How often it was preempted.
    pub preemptions: u32,
}

/// The record of one replay.
#[derive(Debug, Clone)]
pub struct ReplayOutcome {
    pub policy: Policy,
    /// By job id (the index in the workload).
    pub jobs: Vec<JobOutcome>,
    /// Allocated milli-units over time, as a step function: from each time on, that many.
    pub allocation: Vec<(i64, u64)>,
    /// Whether some job waited, as a step function: from each time on, whether one did.
    pub waiting: Vec<(i64, bool)>,
    /// Preemptions applied (victims that stopped before completing).
    pub preemptions: u64,
    /// Preemptions decided, by reason: priority, reclaim, fair share, least attained
    /// service. (A victim that
    /// completes within its grace period counts here but not in `preemptions`.)
    pub preemptions_by_reason: [u64; 4],
    /// The most times one job was preempted.
    pub max_preemptions_of_one_job: u32,
    /// Time jobs spent waiting, by the reason the engine gave (ms × jobs), indexed as
    /// [`PENDING_REASONS`]: where the queueing delay comes from.
    pub waiting_ms_by_reason: [u128; PENDING_REASONS.len()],
    /// Work lost to preemptions: milli-units × ms since the victims' last checkpoints.
    pub lost_milli_ms: u128,
    /// Engine cycles run.
    pub cycles: u64,
    /// Wall-clock time spent in the engine.
    pub engine_time: Duration,
    /// Why the replay ended before every job completed, if it did.
    pub stopped: Option<String>,
    /// By job id, what it was told at the first cycle it waited; empty unless the replay
    /// forecasts.
    pub predictions: Vec<Option<Prediction>>,
}

/// The pending reasons' codes, in the order of [`ReplayOutcome::waiting_ms_by_reason`].
pub const PENDING_REASONS: [&str; 16] = PendingReason::CODES;

fn reason_index(reason: &PendingReason) -> usize {
    reason.index()
}

/// The engine's decisions could not be applied: a bug in the engine.
#[derive(Debug, thiserror::Error)]
#[error("at t = {at_ms} ms, {policy:?}: {message}")]
pub struct BadDecision {
    pub at_ms: i64,
    pub policy: Policy,
    pub message: String,
}

/// Replays a workload under a policy.
pub fn replay(workload: &Workload, policy: Policy) -> Result<ReplayOutcome, BadDecision> {
    replay_ordered(workload, policy, Config::default().queue_order)
}

/// Replays a workload under a policy, ordering each team's waiting jobs by `order`.
pub fn replay_ordered(workload: &Workload, policy: Policy, order: QueueOrder) -> Result<ReplayOutcome, BadDecision> {
    let mut state = Replay::new(workload, policy);
    state.snapshot.config.queue_order = order;
    state.run()?;
    Ok(state.into_outcome())
}

/// Replays a workload under a policy as [`replay`] does, and records for every job that
/// waits at its arrival (every `every`-th job by id, to save time) what the forecasts and the
/// naive model said about its start ([`ReplayOutcome::predictions`]). The forecast learns
/// runtimes online: the engine's history holds the jobs that completed earlier in the
/// replay, nothing later. Forecasting changes no decision.
pub fn replay_with_forecasts(workload: &Workload, policy: Policy, every: u64) -> Result<ReplayOutcome, BadDecision> {
    let mut state = Replay::new(workload, policy);
    state.predictions = Some(vec![None; workload.jobs.len()]);
    state.predict_every = every.max(1);
    state.run()?;
    Ok(state.into_outcome())
}

/// A waiting job's (earliest, expected, latest) start, when it has one.
fn interval(p: &crate::scheduler::Pending) -> Option<[i64; 3]> {
    match (p.earliest_start_ms, p.expected_start_ms, p.latest_start_ms) {
        (Some(a), Some(b), Some(c)) => Some([a, b, c]),
        _ => None,
    }
}

/// A trace job's kind for runtime history: its priority class, shape and request template,
/// the labels a trace has (the Alibaba pods' names say nothing).
pub fn trace_kind(job: &TraceJob) -> KindId {
    let template = job.template.as_deref().unwrap_or("");
    kind_of(&format!("p{}:{}x{}:{template}", job.priority, job.replicas, job.milli_per_replica))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum EventKind {
    /// First, so that its GPUs are free for the cycle at the same time.
    Completion,
    /// A preempted job's grace period ends.
    Exit,
    Arrival,
    /// A preemptible job has run the minimum runtime: it may now be a victim.
    Eligible,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Event {
    at_ms: i64,
    kind: EventKind,
    job: JobId,
    /// Which run of the job a completion or exit belongs to: a stale one (the job was
    /// preempted, or completed within its grace period) is ignored.
    run: u32,
}

/// The current run of a started job.
#[derive(Debug, Clone, Copy)]
struct Run {
    started_ms: i64,
    /// Remaining work when it started.
    remaining_ms: i64,
    number: u32,
    /// Position in `snapshot.running`.
    index: usize,
}

struct Replay<'a> {
    workload: &'a Workload,
    policy: Policy,
    snapshot: Snapshot,
    /// Free milli-units per node and unit.
    free: Vec<Vec<u32>>,
    runs: Vec<Option<Run>>,
    /// Work left per job.
    remaining_ms: Vec<i64>,
    /// Per job, how long it ran in its attempts so far: the service it attained.
    attained_ms: Vec<i64>,
    run_counts: Vec<u32>,
    outcomes: Vec<JobOutcome>,
    events: BinaryHeap<Reverse<Event>>,
    /// Each team with its ancestors, for nested usage.
    lineage: Vec<Vec<usize>>,
    allocated_milli: u64,
    allocation: Vec<(i64, u64)>,
    waiting: Vec<(i64, bool)>,
    preemptions: u64,
    preemptions_by_reason: [u64; 4],
    /// Pending jobs per reason as of the last cycle, and their accumulated waiting.
    pending_by_reason: [u64; PENDING_REASONS.len()],
    waiting_ms_by_reason: [u128; PENDING_REASONS.len()],
    lost_milli_ms: u128,
    cycles: u64,
    engine_time: Duration,
    stopped: Option<String>,
    /// Predictions by job when the replay forecasts.
    predictions: Option<Vec<Option<Prediction>>>,
    /// The jobs to predict that arrived at the current instant (their cycle forecasts).
    arrived: Vec<JobId>,
    /// Predict every this many jobs by id.
    predict_every: u64,
}

impl<'a> Replay<'a> {
    fn new(workload: &'a Workload, policy: Policy) -> Self {
        let cluster = &workload.cluster;
        let snapshot = Snapshot {
            now_ms: workload.jobs.first().map_or(0, |j| j.submit_ms),
            classes: cluster.classes.clone(),
            nodes: cluster.nodes.clone(),
            teams: cluster.teams.clone(),
            priorities: cluster.priorities.clone(),
            running: Vec::new(),
            pending: Vec::new(),
            history: Default::default(),
            forecast_errors: Default::default(),
            config: Config { policy, estimate_start_times: false, ..Config::default() },
        };
        let free = cluster.nodes.iter().map(|n| vec![UNIT; usize::from(n.units)]).collect();
        let events = workload
            .jobs
            .iter()
            .enumerate()
            .map(|(id, j)| Reverse(Event { at_ms: j.submit_ms, kind: EventKind::Arrival, job: id as JobId, run: 0 }))
            .collect();
        let lineage = (0..cluster.teams.len())
            .map(|t| {
                let mut chain = vec![t];
                let mut parent = cluster.teams[t].parent;
                while let Some(p) = parent {
                    chain.push(p as usize);
                    parent = cluster.teams[p as usize].parent;
                }
                chain
            })
            .collect();
        let n = workload.jobs.len();
        Replay {
            workload,
            policy,
            snapshot,
            free,
            runs: vec![None; n],
            remaining_ms: workload.jobs.iter().map(|j| j.duration_ms).collect(),
            attained_ms: vec![0; n],
            run_counts: vec![0; n],
            outcomes: vec![JobOutcome::default(); n],
            events,
            lineage,
            allocated_milli: 0,
            allocation: Vec::new(),
            waiting: Vec::new(),
            preemptions: 0,
            preemptions_by_reason: [0; 4],
            pending_by_reason: [0; PENDING_REASONS.len()],
            waiting_ms_by_reason: [0; PENDING_REASONS.len()],
            lost_milli_ms: 0,
            cycles: 0,
            engine_time: Duration::ZERO,
            stopped: None,
            predictions: None,
            arrived: Vec::new(),
            predict_every: 1,
        }
    }

    fn run(&mut self) -> Result<(), BadDecision> {
        // A livelock guard: an engine that keeps preempting would otherwise never finish.
        let preemption_limit = 20 * self.workload.jobs.len() as u64 + 1000;
        while let Some(&Reverse(next)) = self.events.peek() {
            self.advance_to(next.at_ms);
            self.arrived.clear();
            while let Some(&Reverse(event)) = self.events.peek() {
                if event.at_ms != next.at_ms {
                    break;
                }
                self.events.pop();
                self.apply_event(event);
            }
            if self.snapshot.pending.is_empty() {
                self.pending_by_reason = [0; PENDING_REASONS.len()];
                self.note_waiting();
                continue;
            }
            let decisions = self.cycle();
            self.pending_by_reason = [0; PENDING_REASONS.len()];
            for pending in &decisions.pending {
                self.pending_by_reason[reason_index(&pending.reason)] += 1;
            }
            let acted = !decisions.admissions.is_empty() || !decisions.preemptions.is_empty();
            self.apply(&decisions)?;
            self.note_waiting();
            if !acted && self.events.is_empty() {
                self.stopped = Some(self.stuck_report(&decisions));
                break;
            }
            if self.preemptions > preemption_limit {
                self.stopped =
                    Some(format!("stopped after {} preemptions: the engine keeps preempting", self.preemptions));
                break;
            }
        }
        Ok(())
    }

    /// Moves the clock, accruing usage history for the time in between.
    fn advance_to(&mut self, to_ms: i64) {
        let elapsed = to_ms - self.snapshot.now_ms;
        if elapsed > 0 {
            self.accrue_usage(elapsed);
            for (total, &count) in self.waiting_ms_by_reason.iter_mut().zip(&self.pending_by_reason) {
                *total += u128::from(count) * elapsed as u128;
            }
        }
        self.snapshot.now_ms = to_ms;
    }

    /// Decays every team's usage history over `elapsed_ms` and adds what it borrowed then.
    ///
    /// With a constant borrowing rate `u` (money per ms) over the interval, the decayed
    /// integral is `H·d + u·(h/ln 2)·(1 − d)` with `d = 2^(−Δ/h)`: exact, so the result does
    /// not depend on how finely events cut the time.
    fn accrue_usage(&mut self, elapsed_ms: i64) {
        let half_life = self.snapshot.config.usage_half_life_ms.max(1) as f64;
        let decay = (-(elapsed_ms as f64) / half_life * std::f64::consts::LN_2).exp();
        let rates = self.borrowing_rates();
        let integral = half_life / std::f64::consts::LN_2 * (1.0 - decay);
        for (team, rate) in self.snapshot.teams.iter_mut().zip(rates) {
            team.usage_history_micros = team.usage_history_micros * decay + rate * integral;
        }
    }

    /// Money per ms each team is borrowing now: its capacity beyond reserved per class,
    /// priced at the class rate and weighted by the usage factors of the jobs holding it (pro
    /// rata, as a team's excess is not attributable to one job). Jobs within their grace
    /// period do not count, as the engine does not count them as borrowing.
    fn borrowing_rates(&self) -> Vec<f64> {
        let classes = self.snapshot.classes.len();
        // Per (team, class): held milli-units and held milli-units × usage factor (milli).
        let mut held = vec![(0u64, 0u64); self.snapshot.teams.len() * classes];
        for job in self.snapshot.running.iter().filter(|j| !j.terminating) {
            let spec = &job.spec;
            let factor = u64::from(self.snapshot.priorities[usize::from(spec.priority)].usage_factor_milli);
            for &team in &self.lineage[spec.team as usize] {
                let cell = &mut held[team * classes + usize::from(spec.class)];
                cell.0 += spec.total_milli();
                cell.1 += spec.total_milli() * factor;
            }
        }
        self.snapshot
            .teams
            .iter()
            .enumerate()
            .map(|(t, team)| {
                (0..classes)
                    .map(|c| {
                        let (milli, weighted) = held[t * classes + c];
                        let reserved = team.quotas.get(&(c as ClassId)).map_or(0, |q| q.reserved);
                        if milli <= reserved {
                            return 0.0;
                        }
                        let excess_units = (milli - reserved) as f64 / f64::from(UNIT);
                        let factor = weighted as f64 / milli as f64 / 1000.0;
                        let rate_per_ms = self.snapshot.classes[c].rate_micros_per_hour as f64 / 3_600_000.0;
                        excess_units * rate_per_ms * factor
                    })
                    .sum()
            })
            .collect()
    }

    fn apply_event(&mut self, event: Event) {
        match event.kind {
            EventKind::Arrival => {
                let spec = self.spec(event.job);
                self.wake_when_its_delay_ends(&spec);
                self.snapshot.pending.push(spec);
                if self.predictions.is_some() && event.job.is_multiple_of(self.predict_every) {
                    self.arrived.push(event.job);
                }
            }
            EventKind::Completion => {
                if self.current_run(event) {
                    // What the engine orders waiting jobs by and forecasts from.
                    let job = &self.workload.jobs[event.job as usize];
                    let history = std::sync::Arc::make_mut(&mut self.snapshot.history);
                    history.record(job.team, Some(trace_kind(job)), job.duration_ms);
                    self.stop(event.job);
                    self.remaining_ms[event.job as usize] = 0;
                    self.outcomes[event.job as usize].completion_ms = Some(event.at_ms);
                }
            }
            EventKind::Exit => {
                if self.current_run(event) {
                    self.exit_preempted(event.job);
                }
            }
            // Nothing changes but the time: the cycle that follows sees the job as a victim,
            // or lets a waiting job whose preemption delay has ended preempt.
            EventKind::Eligible => {}
        }
    }

    fn current_run(&self, event: Event) -> bool {
        self.runs[event.job as usize].is_some_and(|r| r.number == event.run)
    }

    /// A preempted job's grace period is over: it keeps its checkpointed work and requeues.
    fn exit_preempted(&mut self, job: JobId) {
        let Some(run) = self.runs[job as usize] else { return };
        let ran = self.snapshot.now_ms - run.started_ms;
        let saved = ran / CHECKPOINT_INTERVAL_MS * CHECKPOINT_INTERVAL_MS;
        let total_milli = self.workload.jobs[job as usize].total_milli();
        self.lost_milli_ms += u128::from(total_milli) * (ran - saved) as u128;
        self.remaining_ms[job as usize] = run.remaining_ms - saved;
        self.attained_ms[job as usize] += ran;
        self.outcomes[job as usize].preemptions += 1;
        self.preemptions += 1;
        self.stop(job);
        // Back in the queue now: its preemption delay runs anew.
        let spec = JobSpec { queued_ms: self.snapshot.now_ms, ..self.spec(job) };
        self.wake_when_its_delay_ends(&spec);
        self.snapshot.pending.push(spec);
    }

    /// A cycle when a job that has just entered the queue may first preempt: without one, it
    /// would wait for the next unrelated event past its preemption delay.
    fn wake_when_its_delay_ends(&mut self, spec: &JobSpec) {
        if let Some(at_ms) = self.snapshot.preemption_delayed_until(spec) {
            self.events.push(Reverse(Event { at_ms, kind: EventKind::Eligible, job: spec.id, run: 0 }));
        }
    }

    /// Frees a running job's GPUs and forgets its run.
    fn stop(&mut self, job: JobId) {
        let Some(run) = self.runs[job as usize].take() else { return };
        let removed = self.snapshot.running.swap_remove(run.index);
        if let Some(moved) = self.snapshot.running.get(run.index) {
            if let Some(r) = self.runs[moved.spec.id as usize].as_mut() {
                r.index = run.index;
            }
        }
        for replica in &removed.placement {
            for &(unit, milli) in &replica.units {
                self.free[replica.node as usize][usize::from(unit)] += milli;
            }
        }
        self.set_allocated(self.allocated_milli - removed.spec.total_milli());
    }

    /// Records whether a job waits from now on, for the idle capacity while jobs wait.
    fn note_waiting(&mut self) {
        let (now, waits) = (self.snapshot.now_ms, !self.snapshot.pending.is_empty());
        match self.waiting.last_mut() {
            Some(last) if last.0 == now => last.1 = waits,
            Some(last) if last.1 == waits => {}
            _ => self.waiting.push((now, waits)),
        }
    }

    fn set_allocated(&mut self, milli: u64) {
        self.allocated_milli = milli;
        let now = self.snapshot.now_ms;
        match self.allocation.last_mut() {
            Some(last) if last.0 == now => last.1 = milli,
            _ => self.allocation.push((now, milli)),
        }
    }

    fn spec(&self, job: JobId) -> JobSpec {
        let j: &TraceJob = &self.workload.jobs[job as usize];
        JobSpec {
            id: job,
            team: j.team,
            class: j.class,
            replicas: j.replicas,
            milli_per_replica: j.milli_per_replica,
            priority: j.priority,
            topology: Topology::Any,
            submitted_ms: j.submit_ms,
            queued_ms: j.submit_ms,
            max_runtime_ms: j.max_runtime_ms,
            allow_spot: false,
            fixed_nodes_only: false,
            kind: Some(trace_kind(j)),
            expected_runtime_ms: None,
            grace_ms: None,
            min_drivers: Default::default(),
            host: Default::default(),
            preemption_delay_ms: None,
            attained_ms: self.attained_ms[job as usize],
            elastic: None,
        }
    }

    fn cycle(&mut self) -> Decisions {
        let now = self.snapshot.now_ms;
        for job in &mut self.snapshot.running {
            let ran = now - job.started_ms;
            job.last_checkpoint_ms = (ran >= CHECKPOINT_INTERVAL_MS)
                .then(|| job.started_ms + ran / CHECKPOINT_INTERVAL_MS * CHECKPOINT_INTERVAL_MS);
        }
        let forecast = !self.arrived.is_empty();
        let started = Instant::now();
        let decisions = schedule(&self.snapshot);
        self.engine_time += started.elapsed();
        self.cycles += 1;
        if forecast {
            self.predict(&decisions);
        }
        decisions
    }

    /// Records what the jobs waiting for the first time were told, by the forecast in
    /// `decisions` and by the naive model on the same snapshot.
    fn predict(&mut self, decisions: &Decisions) {
        let now = self.snapshot.now_ms;
        let Some(predictions) = &self.predictions else { return };
        let new: Vec<usize> = decisions
            .pending
            .iter()
            .enumerate()
            .filter(|(_, p)| predictions[p.job as usize].is_none() && self.arrived.contains(&p.job))
            .map(|(i, _)| i)
            .collect();
        if new.is_empty() {
            return;
        }
        // The jobs predicted earlier that still wait count as censored errors.
        let waiting: Vec<(PriorityId, i64, i64)> = predictions
            .iter()
            .zip(&self.outcomes)
            .zip(&self.workload.jobs)
            .filter(|((_, o), _)| o.first_start_ms.is_none())
            .filter_map(|((p, _), job)| match p {
                Some(Prediction { at_ms, played: Some([_, played, _]), .. }) => {
                    Some((job.priority, played - at_ms, now - at_ms))
                }
                _ => None,
            })
            .collect();
        std::sync::Arc::make_mut(&mut self.snapshot.forecast_errors).set_waiting(waiting);
        // The same cycle again under each model: only the expected starts differ.
        let mut run = |model, calibrated: bool| {
            self.snapshot.config.estimate_start_times = true;
            self.snapshot.config.start_time_model = model;
            let errors = std::mem::take(&mut self.snapshot.forecast_errors);
            if calibrated {
                self.snapshot.forecast_errors = errors.clone();
            }
            let d = schedule(&self.snapshot);
            self.snapshot.forecast_errors = errors;
            self.snapshot.config.estimate_start_times = false;
            d
        };
        let naive = run(StartTimeModel::MaxRuntime, false);
        let played = run(StartTimeModel::QuantileForecast, false);
        let forecast = run(StartTimeModel::QuantileForecast, true);
        self.snapshot.config.start_time_model = StartTimeModel::default();
        let forecast: HashMap<JobId, &crate::scheduler::Pending> =
            forecast.pending.iter().map(|p| (p.job, p)).collect();
        let naive: HashMap<JobId, Option<i64>> = naive.pending.iter().map(|p| (p.job, p.expected_start_ms)).collect();
        let played: HashMap<JobId, Option<[i64; 3]>> = played.pending.iter().map(|p| (p.job, interval(p))).collect();
        let Some(predictions) = &mut self.predictions else { return };
        for i in new {
            let p = &decisions.pending[i];
            let f = forecast.get(&p.job);
            predictions[p.job as usize] = Some(Prediction {
                at_ms: now,
                forecast: f.copied().and_then(interval),
                played: played.get(&p.job).copied().flatten(),
                unforeseeable: f.is_some_and(|f| f.unforeseeable.is_some()),
                naive: naive.get(&p.job).copied().flatten(),
            });
        }
    }

    fn bad(&self, message: String) -> BadDecision {
        BadDecision { at_ms: self.snapshot.now_ms, policy: self.policy, message }
    }

    fn apply(&mut self, decisions: &Decisions) -> Result<(), BadDecision> {
        for preemption in &decisions.preemptions {
            let victim = preemption.victim;
            let run = self.runs.get(victim as usize).copied().flatten();
            let Some(run) = run else {
                return Err(self.bad(format!("preempts job {victim}, which is not running")));
            };
            let job = &mut self.snapshot.running[run.index];
            if job.terminating {
                return Err(self.bad(format!("preempts job {victim}, which is already terminating")));
            }
            job.terminating = true;
            let reason = match preemption.reason {
                PreemptReason::Priority => 0,
                PreemptReason::Reclaim => 1,
                PreemptReason::FairShare => 2,
                PreemptReason::LeastService => 3,
                PreemptReason::OwnTeam => {
                    return Err(self.bad(format!("preempts job {victim} as if it were an extra replica")));
                }
            };
            self.preemptions_by_reason[reason] += 1;
            let at_ms = self.snapshot.now_ms + preemption.grace_ms.max(0);
            self.events.push(Reverse(Event { at_ms, kind: EventKind::Exit, job: victim, run: run.number }));
        }
        if decisions.admissions.is_empty() {
            return Ok(());
        }
        let positions: HashMap<JobId, usize> =
            self.snapshot.pending.iter().enumerate().map(|(i, p)| (p.id, i)).collect();
        let mut admitted = HashSet::new();
        for admission in &decisions.admissions {
            let position = positions.get(&admission.job).copied();
            let Some(position) = position.filter(|_| !admitted.contains(&admission.job)) else {
                return Err(self.bad(format!("admits job {}, which is not pending", admission.job)));
            };
            let spec = self.snapshot.pending[position].clone();
            self.check_placement(&spec, &admission.placement)?;
            self.start(spec, admission.placement.clone());
            admitted.insert(admission.job);
        }
        self.snapshot.pending.retain(|p| !admitted.contains(&p.id));
        Ok(())
    }

    /// The placement has one entry per replica, each on one node of the job's class, with the
    /// replica's milli-units on free units: whole units for whole-GPU replicas, one unit for a
    /// share.
    fn check_placement(&self, spec: &JobSpec, placement: &[ReplicaPlacement]) -> Result<(), BadDecision> {
        if placement.len() != usize::from(spec.replicas) {
            return Err(self.bad(format!("job {}: {} replicas placed of {}", spec.id, placement.len(), spec.replicas)));
        }
        let mut taken: Vec<(u32, u8, u32)> = Vec::new();
        for replica in placement {
            let Some(node) = self.snapshot.nodes.get(replica.node as usize) else {
                return Err(self.bad(format!("job {}: no node {}", spec.id, replica.node)));
            };
            if node.class != spec.class {
                return Err(self.bad(format!("job {}: node {} is of another class", spec.id, node.name)));
            }
            let sum: u32 = replica.units.iter().map(|u| u.1).sum();
            let shape_ok = if spec.milli_per_replica < UNIT {
                replica.units.len() == 1
            } else {
                replica.units.iter().all(|u| u.1 == UNIT)
            };
            if sum != spec.milli_per_replica || !shape_ok {
                return Err(self.bad(format!("job {}: replica on {} takes {:?}", spec.id, node.name, replica.units)));
            }
            for &(unit, milli) in &replica.units {
                taken.push((replica.node, unit, milli));
            }
        }
        taken.sort_unstable();
        let mut i = 0;
        while i < taken.len() {
            let (node, unit) = (taken[i].0, taken[i].1);
            let mut milli = 0;
            while i < taken.len() && (taken[i].0, taken[i].1) == (node, unit) {
                milli += taken[i].2;
                i += 1;
            }
            let free = self.free[node as usize].get(usize::from(unit)).copied();
            if free.is_none_or(|f| f < milli) {
                let node = &self.snapshot.nodes[node as usize].name;
                return Err(
                    self.bad(format!("job {}: unit {unit} of {node} has {free:?} free, {milli} taken", spec.id))
                );
            }
        }
        Ok(())
    }

    fn start(&mut self, spec: JobSpec, placement: Vec<ReplicaPlacement>) {
        let now = self.snapshot.now_ms;
        let id = spec.id as usize;
        for replica in &placement {
            for &(unit, milli) in &replica.units {
                self.free[replica.node as usize][usize::from(unit)] -= milli;
            }
        }
        self.set_allocated(self.allocated_milli + spec.total_milli());
        self.run_counts[id] += 1;
        let run = Run { started_ms: now, remaining_ms: self.remaining_ms[id], number: self.run_counts[id], index: 0 };
        self.runs[id] = Some(Run { index: self.snapshot.running.len(), ..run });
        if self.outcomes[id].first_start_ms.is_none() {
            self.outcomes[id].first_start_ms = Some(now);
            // The forecast learns from its errors on the jobs it predicted, as the server's
            // does from the jobs its leader saw wait and start.
            if let Some(Prediction { at_ms, played: Some([_, played, _]), .. }) =
                self.predictions.as_ref().and_then(|p| p[id])
            {
                std::sync::Arc::make_mut(&mut self.snapshot.forecast_errors).record(
                    spec.priority,
                    played - at_ms,
                    now - at_ms,
                );
            }
        }
        let at_ms = now + self.remaining_ms[id];
        self.events.push(Reverse(Event { at_ms, kind: EventKind::Completion, job: spec.id, run: run.number }));
        let preemptible = self.snapshot.preemptible(&spec);
        let eligible_ms = now + self.snapshot.config.min_runtime_before_preemption_ms;
        if preemptible && eligible_ms < at_ms {
            self.events.push(Reverse(Event {
                at_ms: eligible_ms,
                kind: EventKind::Eligible,
                job: spec.id,
                run: run.number,
            }));
        }
        self.snapshot.running.push(RunningJob {
            spec,
            started_ms: now,
            last_checkpoint_ms: None,
            placement,
            terminating: false,
        });
    }

    fn stuck_report(&self, decisions: &Decisions) -> String {
        let first = decisions
            .pending
            .first()
            .map_or_else(String::new, |p| format!("; first: job {} ({})", p.job, p.reason.code()));
        let mut by_reason = [0usize; PENDING_REASONS.len()];
        decisions.pending.iter().for_each(|p| by_reason[reason_index(&p.reason)] += 1);
        let reasons: Vec<String> = PENDING_REASONS
            .iter()
            .zip(by_reason)
            .filter(|(_, n)| *n > 0)
            .map(|(code, n)| format!("{n} {code}"))
            .collect();
        format!(
            "{} jobs wait ({}), nothing is running or due and the engine admits nothing{first}",
            self.snapshot.pending.len(),
            reasons.join(", ")
        )
    }

    fn into_outcome(self) -> ReplayOutcome {
        let max_preemptions_of_one_job = self.outcomes.iter().map(|o| o.preemptions).max().unwrap_or(0);
        ReplayOutcome {
            max_preemptions_of_one_job,
            policy: self.policy,
            jobs: self.outcomes,
            allocation: self.allocation,
            waiting: self.waiting,
            preemptions: self.preemptions,
            preemptions_by_reason: self.preemptions_by_reason,
            waiting_ms_by_reason: self.waiting_ms_by_reason,
            lost_milli_ms: self.lost_milli_ms,
            cycles: self.cycles,
            engine_time: self.engine_time,
            stopped: self.stopped,
            predictions: self.predictions.unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::{
        cluster::parse_cluster,
        metrics::{summarize, Window},
    };

    const MINUTE: i64 = 60_000;

    /// A cluster of `gpus` one-GPU nodes and two teams reserving `reserved` GPUs each.
    fn workload(gpus: u32, reserved: u32, jobs: &[(i64, u32, u32, i64, u8)]) -> Workload {
        let toml = format!(
            "[[classes]]\nname = \"gpu\"\nrate_per_gpu_hour = 1.0\n\
             [[nodes]]\nname_prefix = \"n\"\ncount = {gpus}\nclass = \"gpu\"\ngpus = 1\nnodes_per_rack = 4\n\
             [[teams]]\nname = \"a\"\nreserved = {{ gpu = {reserved} }}\nburst = {{ gpu = {gpus} }}\n\
             [[teams]]\nname = \"b\"\nreserved = {{ gpu = {reserved} }}\nburst = {{ gpu = {gpus} }}\n"
        );
        let cluster = parse_cluster(&toml).unwrap();
        // (submit ms, team, milli, duration ms, priority)
        let jobs = jobs
            .iter()
            .map(|&(submit_ms, team, milli, duration_ms, priority)| TraceJob {
                team,
                class: 0,
                replicas: 1,
                milli_per_replica: milli,
                priority,
                submit_ms,
                duration_ms,
                max_runtime_ms: super::super::traces::max_runtime_ms(duration_ms),
                template: None,
            })
            .collect();
        Workload { name: "tiny".into(), cluster, jobs }
    }

    fn everything(w: &Workload) -> Window {
        Window { from_ms: 0, to_ms: w.jobs.iter().map(|j| j.submit_ms + j.duration_ms).sum::<i64>() + 1 }
    }

    #[test]
    fn fifo_on_a_one_gpu_cluster_runs_jobs_one_after_another_in_submission_order() {
        let w = workload(1, 0, &[(0, 0, 1000, 10_000, 2), (1, 1, 1000, 20_000, 2), (2, 0, 1000, 30_000, 2)]);
        let outcome = replay(&w, Policy::Fifo).unwrap();
        let starts: Vec<_> = outcome.jobs.iter().map(|o| o.first_start_ms).collect();
        let ends: Vec<_> = outcome.jobs.iter().map(|o| o.completion_ms).collect();
        assert_eq!(starts, [Some(0), Some(10_000), Some(30_000)]);
        assert_eq!(ends, [Some(10_000), Some(30_000), Some(60_000)]);
        let metrics = summarize(&w, &outcome, everything(&w));
        assert!((metrics.utilisation - 1.0).abs() < 1e-9, "the GPU is never idle: {}", metrics.utilisation);
        assert_eq!(metrics.preemptions, 0);
        assert_eq!(outcome.waiting, [(0, false), (1, true), (30_000, false)], "jobs 1 and 2 wait until job 2 starts");
        assert_eq!(metrics.idle_while_waiting, 0.0);
    }

    #[test]
    fn every_policy_completes_every_job_of_a_mixed_trace() {
        let mut jobs = Vec::new();
        for i in 0..40i64 {
            let team = (i % 2) as u32;
            let milli = if i % 3 == 0 { 500 } else { 1000 };
            jobs.push((i * 7 * MINUTE, team, milli, (10 + (i * 13) % 50) * MINUTE, 2 + (i % 2) as u8));
        }
        let w = workload(4, 2, &jobs);
        for policy in [Policy::Fairway, Policy::Fifo, Policy::QuotaNoHistory] {
            let outcome = replay(&w, policy).unwrap();
            assert_eq!(outcome.stopped, None, "{policy:?}");
            let metrics = summarize(&w, &outcome, everything(&w));
            assert_eq!(metrics.completed, 40, "{policy:?}");
            assert!(metrics.utilisation > 0.0 && metrics.utilisation <= 1.0, "{policy:?}: {}", metrics.utilisation);
            assert!(metrics.jain > 0.0 && metrics.jain <= 1.0);
            for (job, o) in w.jobs.iter().zip(&outcome.jobs) {
                let (start, end) = (o.first_start_ms.unwrap(), o.completion_ms.unwrap());
                assert!(start >= job.submit_ms && end >= start + job.duration_ms, "{policy:?}: {job:?} {o:?}");
            }
        }
    }

    #[test]
    fn a_team_reclaiming_its_reserved_gpu_preempts_a_borrower_which_requeues_from_its_checkpoint() {
        // Team a borrows both GPUs with preemptible experiments; 40 minutes in, team b asks
        // for the one GPU it reserves.
        let w = workload(
            2,
            1,
            &[(0, 0, 1000, 120 * MINUTE, 2), (0, 0, 1000, 120 * MINUTE, 2), (40 * MINUTE, 1, 1000, 10 * MINUTE, 1)],
        );
        let outcome = replay(&w, Policy::Fairway).unwrap();
        assert_eq!(outcome.preemptions, 1);
        let grace = 30_000;
        assert_eq!(outcome.jobs[2].first_start_ms, Some(40 * MINUTE + grace));
        let victim = outcome.jobs.iter().position(|o| o.preemptions == 1).unwrap();
        // It ran 40.5 minutes, kept the 30 of its checkpoint and lost 10.5.
        assert_eq!(outcome.lost_milli_ms, 1000 * (10 * MINUTE + grace) as u128);
        let end = outcome.jobs[victim].completion_ms.unwrap();
        let restart = 50 * MINUTE + grace;
        assert!(end >= restart + 90 * MINUTE, "it redoes 90 minutes after b's job: ended at {end}");
        assert!(outcome.jobs.iter().all(|o| o.completion_ms.is_some()));
    }

    #[test]
    fn a_preemption_delay_postpones_a_reclaim_and_one_that_outlasts_the_borrowers_jobs_preempts_no_one() {
        // As above: team b asks at 40 minutes for its reserved GPU; a's experiments end at 120.
        let jobs =
            [(0, 0, 1000, 120 * MINUTE, 2), (0, 0, 1000, 120 * MINUTE, 2), (40 * MINUTE, 1, 1000, 10 * MINUTE, 1)];
        let mut w = workload(2, 1, &jobs);
        // Ten minutes' delay: it preempts at 50 minutes, then waits the victim's grace.
        w.cluster.priorities[1].preemption_delay_ms = 10 * MINUTE;
        let outcome = replay(&w, Policy::Fairway).unwrap();
        assert_eq!(outcome.preemptions, 1);
        assert_eq!(outcome.jobs[2].first_start_ms, Some(50 * MINUTE + 30_000));
        // Ninety minutes' delay outlasts the experiments: b's job takes the GPU one of them
        // leaves at 120 minutes, and no work is lost.
        w.cluster.priorities[1].preemption_delay_ms = 90 * MINUTE;
        let outcome = replay(&w, Policy::Fairway).unwrap();
        assert_eq!(outcome.preemptions, 0);
        assert_eq!(outcome.jobs[2].first_start_ms, Some(120 * MINUTE));
        assert_eq!(outcome.lost_milli_ms, 0);
    }
}
