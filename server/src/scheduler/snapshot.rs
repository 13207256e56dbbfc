//! What the engine decides from: inventory, teams and quotas, usage history, running and
//! pending jobs, and the time. Built by the control loop (from the database) or by the
//! simulator (from a trace); the engine never reads anything else.
//!
//! All GPU amounts are in *milli-units* of a GPU class: a whole GPU of the class is 1000.
//! A replica asks either for whole units (a multiple of 1000) on one node, or for a share
//! below 1000 of a single unit (time-slicing, GPU sharing). Quotas are in milli-units too.

use std::collections::BTreeMap;

pub use crate::domain::driver::DriverStack;

/// One unit of a GPU class, in milli-units.
pub const UNIT: u32 = 1000;

/// Index of a GPU class in [`Snapshot::classes`].
pub type ClassId = u16;
/// Index of a team in [`Snapshot::teams`].
pub type TeamId = u32;
/// Index of a node in [`Snapshot::nodes`].
pub type NodeId = u32;
/// A job's stable identifier (the database id's low bits, or a trace row number).
pub type JobId = u64;
/// Index of a priority class in [`Snapshot::priorities`].
pub type PriorityId = u8;

/// CPU and memory beside a node's GPUs: what a node has, what a replica asks for or takes.
/// GPUs are what the engine schedules, but a node whose CPUs or memory are spent cannot take
/// a replica however many GPUs it has free, and the GPUs it strands there are lost to
/// everyone: placement checks both, and [`fragmentation`](super::fragmentation) counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Host {
    /// CPU in thousandths of a core.
    pub cpu_millis: u32,
    /// Memory in MiB.
    pub memory_mib: u32,
}

impl Host {
    /// Whether `ask` fits in what this has.
    pub fn holds(&self, ask: &Host) -> bool {
        ask.cpu_millis <= self.cpu_millis && ask.memory_mib <= self.memory_mib
    }

    /// Whether it asks for nothing.
    pub fn is_empty(&self) -> bool {
        self.cpu_millis == 0 && self.memory_mib == 0
    }
}

/// A GPU class as the engine sees it.
#[derive(Debug, Clone)]
pub struct GpuClass {
    /// Its name, for explanations.
    pub name: String,
    /// Price of one unit-hour in micro-units of money (the rate card now).
    pub rate_micros_per_hour: i64,
    /// Share of a physical GPU one unit is, in thousandths (1000 for a whole GPU): what a
    /// GPU-hour budget counts.
    pub fraction_milli: u32,
}

/// A topology level a gang can ask to be kept within.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// One NVLink domain of one node.
    NvlinkDomain,
    /// One node.
    Node,
    /// One rack (leaf switch).
    Rack,
    /// One zone (spine).
    Zone,
}

/// How strongly a job wants its topology level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// Anywhere.
    Any,
    /// The whole gang within one domain of this level, or not at all.
    Required(Level),
    /// Within one domain of this level if possible, anywhere otherwise.
    Preferred(Level),
}

/// A node's GPUs of one class. An elastic pool (cloud batch) is a node with `elastic` set:
/// it has no topology and `units` is its maximum size.
#[derive(Debug, Clone)]
pub struct Node {
    /// For placements and explanations.
    pub name: String,
    /// The GPU class of every unit on the node.
    pub class: ClassId,
    /// How many units of the class the node has (at most 64).
    pub units: u8,
    /// Units per NVLink domain (units `0..d`, `d..2d`, ... form the domains); 0 = one domain.
    pub nvlink_domain_size: u8,
    /// Rack index; nodes without a rack each count as their own.
    pub rack: Option<u32>,
    /// Zone index.
    pub zone: Option<u32>,
    /// Index of the cluster it belongs to. A gang's replicas all lie in one cluster (a
    /// cluster runs a gang as one set of objects with one rendezvous), and an elastic gang's
    /// extra replicas join it there.
    pub cluster: u32,
    /// A cloud-batch pool without topology.
    pub elastic: bool,
    /// Spot capacity (a pool): only jobs that allow spot are placed on it.
    pub spot: bool,
    /// The driver stack it runs, as far as its cluster says: jobs that require a minimum
    /// are placed only where it holds.
    pub drivers: DriverStack,
    /// Its allocatable CPU and memory, where its cluster reports them; `None`: not limited
    /// (an elastic pool sizes its machines to the job).
    pub host: Option<Host>,
}

/// A team's quota for one class, in milli-units.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    /// Guaranteed.
    pub reserved: u64,
    /// How much beyond `reserved` the team may borrow.
    pub burst: u64,
    /// How much of its idle `reserved` others may borrow.
    pub lendable: u64,
}

/// A team in the tree.
#[derive(Debug, Clone)]
pub struct Team {
    /// For explanations.
    pub name: String,
    /// Parent team; `None` for a top-level team.
    pub parent: Option<TeamId>,
    /// Quotas by class; a missing class means zero reserved and zero burst.
    pub quotas: BTreeMap<ClassId, Quota>,
    /// Weight of the team in fair share, in thousandths (1000 = normal).
    pub fair_share_weight_milli: u32,
    /// Decayed past use of borrowed capacity in money (micro-units), already weighted by
    /// the priority classes' usage factors and decayed to `Snapshot::now_ms`.
    pub usage_history_micros: f64,
    /// Money left in a hard budget for the period (micro-units); `None` = no hard budget.
    /// It covers the team's whole subtree: a job must fit every hard budget from its team
    /// up to the root, and spends from each.
    pub hard_budget_left_micros: Option<i64>,
    /// Money left in a soft budget (covering the subtree too); only flags jobs that would
    /// exceed it.
    pub soft_budget_left_micros: Option<i64>,
    /// GPU time left in a hard budget counted in GPU-hours, in physical GPU-milliseconds ×
    /// 1000 (the ledger's unit); covers the subtree like the money budget.
    pub hard_budget_left_gpu_milli_ms: Option<i64>,
}

/// A priority class.
#[derive(Debug, Clone)]
pub struct PriorityClass {
    /// For explanations.
    pub name: String,
    /// Higher first.
    pub priority: i32,
    /// Whether its jobs may be preempted (and so run on borrowed capacity).
    pub preemptible: bool,
    /// Price multiplier in thousandths.
    pub price_multiplier_milli: u32,
    /// Fair-share usage factor in thousandths.
    pub usage_factor_milli: u32,
    /// Grace period given to a preempted job to checkpoint, in milliseconds.
    pub preemption_grace_ms: i64,
    /// How long a job of the class waits for capacity (jobs ending, nodes a cloud pool or an
    /// autoscaler adds) after it entered the queue before it may preempt anyone, in
    /// milliseconds; 0: it preempts at once. See [`Snapshot::preemption_delay_ms`].
    pub preemption_delay_ms: i64,
}

/// What a job asks for.
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub id: JobId,
    pub team: TeamId,
    pub class: ClassId,
    /// Replicas of the gang; all or none are placed.
    pub replicas: u16,
    /// Milli-units per replica: a multiple of 1000, or below 1000 for a share of one unit.
    pub milli_per_replica: u32,
    pub priority: PriorityId,
    pub topology: Topology,
    /// When it was submitted (ms since the epoch): the tie-breaker within a priority.
    pub submitted_ms: i64,
    /// When it last entered the queue (its submission, or its requeue after an attempt): its
    /// preemption delay runs from here.
    pub queued_ms: i64,
    /// Longest it may run; it is stopped then.
    pub max_runtime_ms: i64,
    /// The job tolerates spot capacity (interruptions requeue it).
    pub allow_spot: bool,
    /// Only nodes, never elastic cloud pools: a service's replica (cloud batch pools run
    /// batch jobs to completion and take no services).
    pub fixed_nodes_only: bool,
    /// What the job is for runtime history (a hash of its name, see
    /// [`runtime::kind_of`](super::runtime::kind_of)); `None` when it has none.
    pub kind: Option<super::runtime::KindId>,
    /// The runtime the job declares it expects (ms): the median of its runtime estimate.
    pub expected_runtime_ms: Option<i64>,
    /// Its own grace period to checkpoint when preempted (ms), overriding its priority
    /// class's; see [`Snapshot::grace_ms`].
    pub grace_ms: Option<i64>,
    /// Its own preemption delay (ms), overriding its priority class's; see
    /// [`Snapshot::preemption_delay_ms`].
    pub preemption_delay_ms: Option<i64>,
    /// How long it ran in its earlier attempts (ms), its current one not counted: with its
    /// GPUs, the service it has attained, which [`QueueOrder::ServiceIndex`] orders and
    /// preempts by.
    pub attained_ms: i64,
    /// The least driver and CUDA version its nodes must run; default: none.
    pub min_drivers: DriverStack,
    /// CPU and memory each replica needs beside its GPUs, on the replica's node.
    pub host: Host,
    /// An elastic gang's bounds; `None`: a fixed gang. A waiting elastic job's `replicas` is
    /// its minimum, placed all or nothing; a running one's is what it holds now, its
    /// placement listing them, extras last. An extra taken by a shrink that is still leaving
    /// is listed apart, as a running job of the same id with that one replica, `elastic` none
    /// and `terminating` set: it holds its GPUs until it has gone.
    pub elastic: Option<Elastic>,
}

/// The bounds of an elastic gang (torchrun's `--nnodes=MIN:MAX`, Kueue's elastic jobs, KAI's
/// semi-preemptible workloads): it starts with `min_replicas`, grows one replica at a time
/// into capacity no waiting job needs, up to `max_replicas`, and gives its extras (the
/// replicas beyond its minimum, last added first) back before it is itself preempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elastic {
    /// What it needs to run at all.
    pub min_replicas: u16,
    /// The most it can use.
    pub max_replicas: u16,
}

impl JobSpec {
    /// Total milli-units of the gang.
    pub fn total_milli(&self) -> u64 {
        u64::from(self.replicas) * u64::from(self.milli_per_replica)
    }
}

/// One replica's exact place: a node and, per unit used, the milli-units taken on it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReplicaPlacement {
    pub node: NodeId,
    /// (unit index on the node, milli-units taken).
    pub units: Vec<(u8, u32)>,
    /// The node's CPU and memory the replica takes.
    pub host: Host,
}

/// A job that holds GPUs now.
#[derive(Debug, Clone)]
pub struct RunningJob {
    pub spec: JobSpec,
    pub started_ms: i64,
    /// When it last reported a checkpoint; work before it survives a preemption.
    pub last_checkpoint_ms: Option<i64>,
    pub placement: Vec<ReplicaPlacement>,
    /// Already asked to stop (preempted or cancelled, within its grace period): its GPUs
    /// are still held but it is no victim candidate and is not counted as borrowing.
    pub terminating: bool,
}

/// Tunables of the engine.
#[derive(Debug, Clone)]
pub struct Config {
    /// Half-life of usage history in fair share.
    pub usage_half_life_ms: i64,
    /// A job runs at least this long before it can be preempted.
    pub min_runtime_before_preemption_ms: i64,
    /// Which policy decides.
    pub policy: Policy,
    /// Compute expected start times of pending jobs (the costliest part of a cycle).
    pub estimate_start_times: bool,
    /// How expected start times are computed.
    pub start_time_model: StartTimeModel,
    /// When the budgets' period ends (ms since the epoch): what a job may spend after it
    /// counts against the next period's budgets, so a job (a service's replica above all,
    /// which has no maximum runtime) commits this period's budgets only up to it. `None`:
    /// no bound (a trace replay, unit tests).
    pub budget_period_end_ms: Option<i64>,
    /// How a team's waiting jobs of one priority are ordered (Fairway's policy only; the
    /// baselines keep arrival order).
    pub queue_order: QueueOrder,
    /// Where replicas go on the nodes.
    pub placement: Placement,
}

/// Where a replica goes among the nodes that hold it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// The node with the fewest free units that still holds it (see
    /// [`inventory`](super::inventory)).
    #[default]
    BestFit,
    /// The node, and for a share the unit, where the expected fragmentation of the shapes
    /// that arrive grows least, as FGD does ([`fragmentation`](super::fragmentation)); the
    /// mix is the shapes of the snapshot's waiting and running jobs, each replica counted.
    Fragmentation,
}

/// How a team's waiting jobs of one priority are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueOrder {
    /// Oldest first.
    Arrival,
    /// Least expected service first, as Tiresias: by the Gittins index of the job's GPU-time
    /// ([`runtime::gittins_index`](super::runtime::gittins_index)), its runtime not known
    /// but its distribution estimated from history, given the time it has already run
    /// ([`JobSpec::attained_ms`]). A job that has waited `starvation_ms` since it last
    /// entered the queue goes before every job that has not, oldest first, so no job waits
    /// forever behind shorter ones.
    ///
    /// With `threshold_gpu_ms`, least attained service also preempts, as Tiresias's
    /// two-queue LAS does: a waiting job that has had less than that much GPU time may take
    /// the place of a running job of its own team and priority that has had at least that
    /// much (GPU-ms, GPUs × time over all its attempts), unless that job started after
    /// waiting past the starvation bound. See the [module docs](super) for why it cannot loop.
    ServiceIndex { starvation_ms: i64, threshold_gpu_ms: Option<i64> },
}

impl QueueOrder {
    /// Least expected service first, with least-attained-service preemption above
    /// [`DEFAULT_SERVICE_THRESHOLD_GPU_MS`].
    pub const SERVICE: QueueOrder = QueueOrder::ServiceIndex {
        starvation_ms: DEFAULT_STARVATION_MS,
        threshold_gpu_ms: Some(DEFAULT_SERVICE_THRESHOLD_GPU_MS),
    };
}

/// Whether `spec` had waited `starvation_ms` at `at_ms` since it last entered the queue: the
/// one rule behind ranking a starving job first, letting its next run alone, and the
/// reservations of selective backfill.
fn waited_past(spec: &JobSpec, starvation_ms: i64, at_ms: i64) -> bool {
    at_ms.saturating_sub(spec.queued_ms) >= starvation_ms
}

/// From when [`waited_past`] holds for `spec` (`i64::MAX` if only then, or never).
fn starved_from(spec: &JobSpec, starvation_ms: i64) -> i64 {
    spec.queued_ms.saturating_add(starvation_ms)
}

/// GPU-ms of `ms` of running with `spec`'s GPUs (whole GPUs of its class).
fn attained_gpu_ms(spec: &JobSpec, ms: i64) -> i64 {
    let milli = i64::try_from(spec.total_milli()).unwrap_or(i64::MAX);
    ms.saturating_mul(milli) / i64::from(UNIT)
}

/// The attained-service threshold of [`QueueOrder::ServiceIndex`] by default: one
/// GPU-hour. Lower thresholds preempt more often and lose more work to it (jobs checkpoint
/// now and then, not when told to stop); on the Alibaba replay 30 GPU-minutes lost twice the
/// work of one GPU-hour and waited longer, and 2 or 4 GPU-hours waited longer too (README,
/// "Replaying the Alibaba GPU trace").
pub const DEFAULT_SERVICE_THRESHOLD_GPU_MS: i64 = 3600 * 1000;

/// The starvation bound of [`QueueOrder::ServiceIndex`] by default.
pub const DEFAULT_STARVATION_MS: i64 = 4 * 3600 * 1000;

/// How the engine foresees when waiting jobs start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartTimeModel {
    /// The forecast of [`eta`](super::eta): runtimes from history, quotas, reservations and
    /// reclaim played forward with every runtime at its p10, p50 and p90, calibrated by past
    /// errors.
    #[default]
    QuantileForecast,
    /// The naive model: running jobs end at their maximum runtime, waiting jobs start in
    /// order per class as GPUs free up; no interval. Kept to compare against.
    MaxRuntime,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            usage_half_life_ms: 7 * 24 * 3600 * 1000,
            min_runtime_before_preemption_ms: 5 * 60 * 1000,
            policy: Policy::Fairway,
            estimate_start_times: true,
            start_time_model: StartTimeModel::QuantileForecast,
            budget_period_end_ms: None,
            queue_order: QueueOrder::Arrival,
            placement: Placement::BestFit,
        }
    }
}

/// The admission policy. The baselines exist so the simulator can compare in one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Reserved first, burst by cost-weighted fair share with history, gangs with
    /// reservations and backfill, preemption to reclaim and to restore fair share.
    Fairway,
    /// Strict first-in first-out over all teams, no quotas, no backfill, no preemption.
    Fifo,
    /// Kueue-like: reserved (nominal) first, then borrowing in submission order without
    /// usage history or fair-share preemption.
    QuotaNoHistory,
}

/// Everything the engine decides from.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The time of the decision, ms since the epoch.
    pub now_ms: i64,
    pub classes: Vec<GpuClass>,
    pub nodes: Vec<Node>,
    pub teams: Vec<Team>,
    pub priorities: Vec<PriorityClass>,
    pub running: Vec<RunningJob>,
    pub pending: Vec<JobSpec>,
    /// Runtimes of finished jobs, for the expected starts of waiting jobs (shared: a dry
    /// run copies the snapshot).
    pub history: std::sync::Arc<super::runtime::RuntimeHistory>,
    /// How wrong past forecasts were, to calibrate the expected starts (shared like
    /// `history`).
    pub forecast_errors: std::sync::Arc<super::forecast_errors::ForecastErrors>,
    pub config: Config,
}

impl Snapshot {
    /// `ms` of running from `from_ms`, cut at the end of the budgets' period: what of it
    /// this period's budgets pay for.
    pub fn within_budget_period(&self, from_ms: i64, ms: i64) -> i64 {
        match self.config.budget_period_end_ms {
            Some(end) => ms.min((end - from_ms).max(0)),
            None => ms,
        }
    }

    /// Whether `spec`'s priority class lets it be preempted (and so borrow); a job of an
    /// unknown class is not.
    pub fn preemptible(&self, spec: &JobSpec) -> bool {
        self.priorities.get(usize::from(spec.priority)).is_some_and(|p| p.preemptible)
    }

    /// How long `spec` has to checkpoint once told to stop: its own grace period, or its
    /// priority class's.
    pub fn grace_ms(&self, spec: &JobSpec) -> i64 {
        spec.grace_ms
            .unwrap_or_else(|| self.priorities.get(usize::from(spec.priority)).map_or(0, |p| p.preemption_grace_ms))
    }

    /// How long `spec` waits for capacity after it entered the queue before it may preempt:
    /// its own delay, or its priority class's.
    pub fn preemption_delay_ms(&self, spec: &JobSpec) -> i64 {
        spec.preemption_delay_ms
            .unwrap_or_else(|| self.priorities.get(usize::from(spec.priority)).map_or(0, |p| p.preemption_delay_ms))
    }

    /// The GPU time (GPU-ms, whole GPUs of its class) running job `r` has had over all its
    /// attempts, this one up to now included.
    pub fn attained_gpu_ms(&self, r: &RunningJob) -> i64 {
        attained_gpu_ms(&r.spec, r.spec.attained_ms.saturating_add((self.now_ms - r.started_ms).max(0)))
    }

    /// Whether waiting job `spec` has waited `starvation_ms` since it last entered the queue:
    /// [`QueueOrder::ServiceIndex`] then ranks it before every job that has not.
    pub fn starving(&self, spec: &JobSpec, starvation_ms: i64) -> bool {
        waited_past(spec, starvation_ms, self.now_ms)
    }

    /// Whether waiting job `spec`, blocked by capacity at `at_ms`, gets a reservation
    /// ([`backfill`](super::backfill)): under Fairway's policy, for a gang of two or more
    /// GPUs (a single GPU is served by whichever frees first); in arrival order at once (EASY
    /// backfill), by expected service only once it has waited past the starvation bound
    /// (selective reservation, as Srinivasan et al.'s). Held GPUs serve the gang at the cost
    /// of the short jobs the service order puts first; the starvation bound is what promises
    /// the gang its turn, and from then on its reservation keeps that turn from being taken.
    /// The engine asks at its clock, expected starts at each instant they play.
    pub fn reserves(&self, spec: &JobSpec, at_ms: i64) -> bool {
        self.reserves_from(spec).is_some_and(|from| at_ms >= from)
    }

    /// From when [`reserves`](Self::reserves) holds for `spec` (it holds from then on), or
    /// `None` if it never does.
    pub fn reserves_from(&self, spec: &JobSpec) -> Option<i64> {
        if self.config.policy != Policy::Fairway || spec.total_milli() < 2 * u64::from(UNIT) {
            return None;
        }
        Some(match self.config.queue_order {
            QueueOrder::ServiceIndex { starvation_ms, .. } => starved_from(spec, starvation_ms),
            QueueOrder::Arrival => i64::MIN,
        })
    }

    /// The threshold and starvation bound of least-attained-service preemption, when the
    /// policy (Fairway's) and the queue order use one.
    fn service_threshold(&self) -> Option<(i64, i64)> {
        match self.config.queue_order {
            QueueOrder::ServiceIndex { starvation_ms, threshold_gpu_ms: Some(t) }
                if self.config.policy == Policy::Fairway =>
            {
                Some((t, starvation_ms))
            }
            _ => None,
        }
    }

    /// Whether waiting job `spec` has had less GPU time than the threshold of
    /// [`QueueOrder::ServiceIndex`] over its earlier attempts: it may then take the place of
    /// a running job of its team and priority that [`Self::past_service_threshold`].
    pub fn below_service_threshold(&self, spec: &JobSpec) -> bool {
        self.service_threshold().is_some_and(|(t, _)| attained_gpu_ms(spec, spec.attained_ms) < t)
    }

    /// Whether waiting job `spec` has had at least the threshold's GPU time: it then ranks
    /// after the jobs of its priority below it (unless it waited past the starvation bound).
    pub fn past_service_threshold_waiting(&self, spec: &JobSpec) -> bool {
        self.service_threshold().is_some_and(|(t, _)| attained_gpu_ms(spec, spec.attained_ms) >= t)
    }

    /// Whether running job `r` has had at least the threshold's GPU time, and did not start
    /// after waiting past the starvation bound (a job the bound let through runs its
    /// attempt, or it could starve for ever, started and preempted in turn).
    pub fn past_service_threshold(&self, r: &RunningJob) -> bool {
        self.service_threshold().is_some_and(|(t, starvation_ms)| {
            self.attained_gpu_ms(r) >= t && !waited_past(&r.spec, starvation_ms, r.started_ms)
        })
    }

    /// Until when `spec` may not preempt (ms since the epoch), if that is still ahead.
    pub fn preemption_delayed_until(&self, spec: &JobSpec) -> Option<i64> {
        let until = spec.queued_ms.saturating_add(self.preemption_delay_ms(spec).max(0));
        (until > self.now_ms).then_some(until)
    }
}
