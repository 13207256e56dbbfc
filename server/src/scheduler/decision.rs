//! What the engine decides: admissions with exact placements, preemptions with their
//! victims and reasons, and for every job left waiting a reason, a position and an
//! expected start.

use super::snapshot::{JobId, Quota, ReplicaPlacement, TeamId};

/// A job admitted now, with where each replica runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    pub job: JobId,
    pub placement: Vec<ReplicaPlacement>,
    /// True when part of the job runs on capacity borrowed beyond its team's reserved quota
    /// (it may be preempted to give that capacity back).
    pub borrowing: bool,
    /// Its maximum cost in micro-units of money (GPUs × rate × max runtime × multiplier).
    pub max_cost_micros: i64,
    /// The soft budget this job would exceed, if any (admitted anyway, flagged).
    pub exceeds_soft_budget: bool,
    /// The blocked gang whose held GPUs this job runs on, when it was backfilled: it ends
    /// (by its maximum runtime) before that gang is expected to fit.
    pub backfilled_ahead_of: Option<JobId>,
}

/// Why a running job is preempted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PreemptReason {
    /// A higher-priority job of the same team needs the GPUs.
    Priority,
    /// Its team was borrowing; the lender reclaims its reserved quota.
    Reclaim,
    /// Its team holds more borrowed capacity than fair share allows.
    FairShare,
    /// An elastic gang's extra replica, given back to a waiting job of its own team of no
    /// lower priority: it grew into capacity no waiting job could use, and that is no longer
    /// so. Only ever a [`Shrink`]'s reason: it never preempts a whole job.
    OwnTeam,
    /// Least attained service ([`QueueOrder::ServiceIndex`](super::QueueOrder::ServiceIndex)
    /// with a threshold): a job of the same team and priority that has had less than the
    /// threshold's GPU time takes the place of this one, which has had more.
    LeastService,
}

impl PreemptReason {
    /// Every reason a whole job is preempted for, for metrics that show each from the start
    /// ([`PreemptReason::OwnTeam`] only takes extras).
    pub const ALL: [PreemptReason; 4] =
        [PreemptReason::Priority, PreemptReason::Reclaim, PreemptReason::FairShare, PreemptReason::LeastService];

    /// Stable code.
    pub fn code(self) -> &'static str {
        match self {
            PreemptReason::Priority => "priority",
            PreemptReason::Reclaim => "reclaim",
            PreemptReason::FairShare => "fair_share",
            PreemptReason::OwnTeam => "own_team",
            PreemptReason::LeastService => "least_service",
        }
    }
}

/// A running job told to stop, and for whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemption {
    pub victim: JobId,
    /// The pending job the GPUs go to.
    pub for_job: JobId,
    pub reason: PreemptReason,
    /// How long the victim has to checkpoint before it is killed.
    pub grace_ms: i64,
    /// Work lost: GPU-milliseconds (milli-units × ms / 1000) since its last checkpoint.
    pub lost_work: u64,
}

/// Why a job is still waiting: the first rule that blocks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PendingReason {
    /// No GPU class capacity at all can ever hold it (larger than any placement).
    NeverFits,
    /// Its team (or an ancestor) is at reserved + burst for the class.
    BurstLimit { team: TeamId },
    /// The job alone is larger than that team's reserved + burst (or, non-preemptible, its
    /// reserved): it waits until the quota is raised.
    ExceedsQuota { team: TeamId },
    /// A non-preemptible job needs reserved quota the team's other non-preemptible jobs have
    /// used up (its preemptible jobs do not count: they borrow instead).
    ReservedQuotaExhausted { team: TeamId },
    /// Its team's hard budget cannot cover the job's maximum cost.
    BudgetExhausted,
    /// Enough GPUs, but not within one domain of the topology level the job requires
    /// (`within`), or, for `None`, not within one cluster: a gang runs within one.
    NoTopologyFit { within: Option<super::snapshot::Level> },
    /// Not enough free GPUs for a job that must borrow, and fair share takes nothing back:
    /// `team`, the largest borrower, holds no more burst than its share.
    FairShareBehind { team: TeamId },
    /// Not enough free GPUs and nothing it may preempt.
    InsufficientCapacity,
    /// Victims were told to stop; the job starts when they have.
    WaitingForReclaim,
    /// GPUs are held for an earlier gang that would otherwise starve.
    ReservedFor { job: JobId },
    /// Strict FIFO: an earlier job is blocked at the head of the queue.
    BehindHeadOfLine { job: JobId },
    /// Not enough free GPUs, but jobs it may preempt (its team's lower-priority work, or,
    /// within its reserved quota, borrowers of it) free enough once they have run the
    /// minimum runtime before preemption, which enough of them have at `at_ms`.
    VictimsInMinimumRuntime { at_ms: i64 },
    /// No node of its class runs the driver or CUDA version it requires (or enough of them
    /// to hold it): it starts only once nodes are upgraded.
    DriverUnavailable,
    /// Enough GPUs are free, but not on nodes that run the driver or CUDA version it requires.
    NoDriverFit,
    /// Enough GPUs are free, and a placement by GPUs alone exists, but no node with free GPUs
    /// also has the CPU and memory each replica asks beside them (`asks`).
    NoHostFit { asks: super::snapshot::Host },
    /// Preempting `victims` running jobs would make room, but the job is within its
    /// preemption delay: it waits for capacity to come without preempting until `until_ms`,
    /// the room those jobs hold kept for it meanwhile.
    PreemptionDelayed { until_ms: i64, victims: u32 },
}

impl PendingReason {
    /// Every code, in a fixed order: the taxonomy a gauge per reason shows from the start.
    pub const CODES: [&'static str; 16] = [
        "never_fits",
        "burst_limit",
        "exceeds_quota",
        "reserved_quota_exhausted",
        "budget_exhausted",
        "no_topology_fit",
        "fair_share",
        "insufficient_capacity",
        "waiting_for_reclaim",
        "reserved_for_gang",
        "behind_head_of_line",
        "victims_in_minimum_runtime",
        "driver_unavailable",
        "no_driver_fit",
        "no_cpu_memory_fit",
        "preemption_delayed",
    ];

    /// Its place in [`PendingReason::CODES`].
    pub fn index(&self) -> usize {
        match self {
            PendingReason::NeverFits => 0,
            PendingReason::BurstLimit { .. } => 1,
            PendingReason::ExceedsQuota { .. } => 2,
            PendingReason::ReservedQuotaExhausted { .. } => 3,
            PendingReason::BudgetExhausted => 4,
            PendingReason::NoTopologyFit { .. } => 5,
            PendingReason::FairShareBehind { .. } => 6,
            PendingReason::InsufficientCapacity => 7,
            PendingReason::WaitingForReclaim => 8,
            PendingReason::ReservedFor { .. } => 9,
            PendingReason::BehindHeadOfLine { .. } => 10,
            PendingReason::VictimsInMinimumRuntime { .. } => 11,
            PendingReason::DriverUnavailable => 12,
            PendingReason::NoDriverFit => 13,
            PendingReason::NoHostFit { .. } => 14,
            PendingReason::PreemptionDelayed { .. } => 15,
        }
    }

    /// Stable machine-readable code, one of [`PendingReason::CODES`]. The team or job a
    /// reason names is in its sentence and figures, never in the code, so clients can match
    /// codes exactly.
    pub fn code(&self) -> &'static str {
        Self::CODES[self.index()]
    }
}

/// The numbers behind a waiting job's reason, as the cycle saw them when it decided.
/// GPU amounts are milli-units of the job's class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Figures {
    /// What the job asks for: replicas × per-replica share.
    pub needs: u64,
    /// Free capacity of the class the job may use: free GPUs, less those held back for other
    /// teams' unlent reserved quota and those promised to jobs ranked before it.
    pub free: u64,
    /// For a quota reason: the quota of the team the reason names, and what that team (with
    /// its sub-teams) holds of the class, claims of waiting jobs included.
    pub quota: Option<(Quota, u64)>,
    /// For a budget reason: the hard budget that cannot cover the job.
    pub budget: Option<Shortfall>,
    /// For a driver reason: what the job requires and what the class's nodes run.
    pub drivers: Option<DriverFigures>,
}

/// The driver stack a job requires beside what its class's nodes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverFigures {
    /// The least driver and CUDA version the job accepts.
    pub required: super::snapshot::DriverStack,
    /// The newest driver and the newest CUDA version any node of its class runs (each
    /// unknown where no node says).
    pub newest: super::snapshot::DriverStack,
    /// Free milli-units of the class on nodes that meet the requirement.
    pub free_meeting: u64,
}

/// A hard budget smaller than a job's maximum cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shortfall {
    /// The team whose budget it is (the job's own, or a department above it).
    pub team: TeamId,
    /// True for a GPU-hour budget (amounts in physical GPU-milliseconds × 1000), false for
    /// money (micro-units).
    pub gpu_time: bool,
    /// The job's maximum cost or GPU time.
    pub needs: i64,
    /// What the budget has left this period, after the running jobs' remainder.
    pub left: i64,
}

/// Replicas added to a running elastic gang, in capacity no one else is promised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Growth {
    pub job: JobId,
    /// Where each new replica runs, after those it has.
    pub placement: Vec<ReplicaPlacement>,
    /// Per new replica, whether it runs on capacity borrowed beyond its team's reserved quota.
    pub borrowing: Vec<bool>,
}

/// One extra replica of a running elastic gang taken for a waiting job: the gang goes on
/// without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shrink {
    pub job: JobId,
    /// Its place among the gang's replicas (an extra: at or past its minimum).
    pub replica: u16,
    /// The pending job the GPUs go to.
    pub for_job: JobId,
    /// The rule that lets that job take it, as for a preemption.
    pub reason: PreemptReason,
    /// How long the replica has to leave.
    pub grace_ms: i64,
}

/// A job left waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub job: JobId,
    /// 1-based rank in the admission order of this cycle.
    pub position: u32,
    pub reason: PendingReason,
    /// The numbers behind the reason.
    pub figures: Figures,
    /// When it is expected to start: the median of the forecast (see [`eta`](super::eta));
    /// `None` when it cannot be foreseen (`unforeseeable` says why) or was not estimated.
    pub expected_start_ms: Option<i64>,
    /// The early end of the interval it is expected to start in (p10); with
    /// `expected_start_ms` and `latest_start_ms`, `earliest <= expected <= latest`.
    pub earliest_start_ms: Option<i64>,
    /// The late end of that interval (p90).
    pub latest_start_ms: Option<i64>,
    /// The play's own median start, before calibration by past errors (see
    /// [`forecast_errors`](super::forecast_errors)): what the errors are measured against.
    pub played_start_ms: Option<i64>,
    /// Why no forecast can say when it starts, when none can.
    pub unforeseeable: Option<Unforeseeable>,
}

/// What a job's start waits for that no forecast can know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unforeseeable {
    /// The job is larger than a quota of its team (or an ancestor): it starts only once an
    /// admin raises that quota.
    QuotaChange { team: TeamId },
    /// A hard budget cannot cover it: it starts only once the budget is raised or renewed.
    BudgetChange,
    /// No cluster can hold the gang: it starts only once capacity is added.
    CapacityChange,
    /// No node of its class runs the driver stack it requires: it starts only once nodes
    /// are upgraded.
    DriverChange,
}

impl Unforeseeable {
    /// Stable code.
    pub fn code(self) -> &'static str {
        match self {
            Unforeseeable::QuotaChange { .. } => "quota_change",
            Unforeseeable::BudgetChange => "budget_change",
            Unforeseeable::CapacityChange => "capacity_change",
            Unforeseeable::DriverChange => "driver_change",
        }
    }

    /// A sentence for people.
    pub fn message(self, team_name: &dyn Fn(TeamId) -> String) -> String {
        match self {
            Unforeseeable::QuotaChange { team } => {
                format!("it starts only after team {}'s quota for this GPU class is raised", team_name(team))
            }
            Unforeseeable::BudgetChange => "it starts only after the team's hard budget is raised or renewed".into(),
            Unforeseeable::CapacityChange => "it starts only after GPUs of this class are added".into(),
            Unforeseeable::DriverChange => {
                "it starts only after nodes of this class are upgraded to the driver it requires".into()
            }
        }
    }
}

/// How fragmented a class's free capacity is after the cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fragmentation {
    pub class: super::snapshot::ClassId,
    /// Free milli-units (GPUs held for waiting jobs count as taken).
    pub free_milli: u64,
    /// Free milli-units that no replica of the waiting jobs' shapes could use: too few free
    /// units on a node for the smallest whole-GPU replica, too little on a unit for the
    /// smallest share. Zero when nothing of the class waits.
    pub stranded_milli: u64,
}

/// Everything one cycle decides.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decisions {
    pub admissions: Vec<Admission>,
    pub preemptions: Vec<Preemption>,
    /// Elastic gangs grown this cycle.
    pub growths: Vec<Growth>,
    /// Extras taken from elastic gangs this cycle, before any whole job was preempted.
    pub shrinks: Vec<Shrink>,
    pub pending: Vec<Pending>,
    /// Per class with capacity: free and stranded capacity after the cycle.
    pub fragmentation: Vec<Fragmentation>,
}
