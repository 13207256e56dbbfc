//! One admission cycle: its state, and the checks that admit a job or say why it waits.
//!
//! The order jobs are considered in is in `queue.rs`, victim search in `preemption.rs`,
//! reservations and backfill in `backfill.rs`, budget arithmetic in `budget.rs`; each adds
//! an `impl Cycle` block over the state defined here.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    backfill::Reservation,
    budget::budget_chain,
    decision::{Admission, Decisions, DriverFigures, Figures, Pending, PendingReason},
    inventory::Inventory,
    preemption::{self, Passed, Reach},
    quota::Ledger,
    snapshot::{
        ClassId, JobId, JobSpec, Placement, Policy, ReplicaPlacement, Snapshot, StartTimeModel, TeamId, Topology,
    },
};

pub use super::{
    budget::{cost_micros, gpu_time},
    preemption::lost_work,
};

/// The state of one cycle: what is free, used and promised so far. Created from the
/// snapshot, changed by every decision, dropped when the cycle's decisions are returned.
pub(super) struct Cycle<'a> {
    pub(super) s: &'a Snapshot,
    pub(super) inv: Inventory,
    pub(super) ledger: Ledger,
    /// Hard budget left per team after the committed cost of its running jobs.
    pub(super) hard_left: Vec<Option<i64>>,
    soft_left: Vec<Option<i64>>,
    /// GPU time left per team under a hard GPU-hour budget, after running jobs' remainder.
    pub(super) hard_gpu_left: Vec<Option<i64>>,
    /// Running jobs chosen as victims this cycle.
    pub(super) victims: BTreeSet<usize>,
    /// The running index of each of `decisions.preemptions`, in order.
    pub(super) preempted: Vec<usize>,
    /// The same, by running-job index, for the hot loops (also marks tentative victims).
    pub(super) victim: Vec<bool>,
    /// By running-job index, whether it is an elastic gang's extra replica ([`elastic`](super::elastic)):
    /// a job of its own team of the same priority may take it too.
    pub(super) extra: Vec<bool>,
    /// Per class, the running jobs that may ever be victims this cycle (preemptible, past
    /// the minimum runtime, not stopping), least work lost first, then largest.
    pub(super) victim_order: BTreeMap<ClassId, Vec<usize>>,
    /// Per class, the places in `victim_order` that this cycle's victims have left.
    pub(super) passed: BTreeMap<ClassId, Passed>,
    /// Each running job's place in its class's `victim_order` (`u32::MAX` if not there).
    pub(super) place_in_order: Vec<u32>,
    /// The same per class and team: all a walk may take when only the job's own team's
    /// jobs may be victims, without passing every other team's candidates.
    pub(super) team_victim_order: BTreeMap<(ClassId, TeamId), Vec<usize>>,
    /// Per class and team, the lowest [`Cycle::yields_below`] among its candidate victims at
    /// the start of the cycle (one below its priority for a job past the service threshold):
    /// a job of the team with a higher priority may make room by preemption.
    lowest_victim_priority: BTreeMap<(ClassId, TeamId), i32>,
    /// Per class, the preemptible running jobs not stopping that are still within the
    /// minimum runtime before preemption, soonest preemptible first: only what a wait for
    /// them is explained by, so a blocked job walks these few, not every running job.
    young: BTreeMap<ClassId, Vec<usize>>,
    /// The same per class and team, for a job that may take only its own team's jobs.
    team_young: BTreeMap<(ClassId, TeamId), Vec<usize>>,
    /// Milli per class held by jobs that were told to stop in earlier cycles and are not
    /// yet claimed by a job ranked earlier in this cycle.
    stopping_unclaimed: BTreeMap<ClassId, u64>,
    /// The largest borrower per class, valid until the next admission of that class.
    pub(super) largest_borrowers: BTreeMap<ClassId, Vec<TeamId>>,
    /// Teams with a job waiting for its victims, per class: the waiting job, its priority and
    /// whether it is below the least-attained-service threshold. The team's jobs it could
    /// preempt (see [`Cycle::could_take`]) wait behind it, so they cannot take the reserved
    /// room its victims free and be preempted for it in turn.
    waiting_in_team: BTreeMap<(TeamId, ClassId), (JobId, i32, bool)>,
    /// Every team (at any level) borrowing a class, valid until the class's usage changes:
    /// the exhaustive walks' list, rebuilt over every team after each admission.
    pub(super) borrowers: BTreeMap<ClassId, Vec<TeamId>>,
    /// Whether each team (team × class) borrows, as of the last admission or claim: kept
    /// for the levels an admission or a claim changes, instead of rebuilt over every team.
    pub(super) borrowing: Vec<bool>,
    /// Per class, how many teams `borrowing` marks.
    pub(super) borrowing_teams: Vec<usize>,
    /// The most preemption can free for a team's job, kept with `borrowing`.
    pub(super) reach: Reach,
    /// GPUs held for jobs waiting for their victims: (job, class, placement). Pushed only
    /// through [`Self::push_claim`], which keeps `claims_by_class` in step.
    pub(super) claims: Vec<(JobId, ClassId, Vec<ReplicaPlacement>)>,
    /// Per class, the first claim's job and the milli all its claims hold: what
    /// [`Self::held_for`] asks for every waiting job, kept as claims are made rather than
    /// summed over tens of thousands of claims each time.
    pub(super) claims_by_class: BTreeMap<ClassId, (JobId, u64)>,
    /// Walk every candidate of the class, as before the per-team and per-class indexes, to
    /// hold the indexed walks to it ([`run_exhaustive`]); false in every real cycle.
    pub(super) exhaustive: bool,
    /// Borrowed value (money per hour) in use at the start of the cycle, over top-level teams.
    pub(super) burst_value: f64,
    /// Total fair-share weight of the teams borrowing or waiting to borrow.
    pub(super) burst_weight: f64,
    /// Teams with reserved demand queued behind their own burst jobs in phase two.
    pub(super) reserved_demand: BTreeSet<TeamId>,
    /// Free milli per class promised to jobs waiting for stopping jobs.
    pub(super) claimed_free: BTreeMap<ClassId, u64>,
    /// Failed fair-share preemption attempts per class: (score after, milli). An attempt by
    /// a team whose score would be at least as high, for at least as much, fails too.
    pub(super) fair_share_failures: BTreeMap<ClassId, Vec<(f64, u64)>>,
    /// Jobs admitted this cycle: (end, class, job, placement), for reservations.
    pub(super) admitted_ends: Vec<(i64, ClassId, JobId, Vec<ReplicaPlacement>)>,
    pub(super) reservations: BTreeMap<ClassId, Reservation>,
    /// Shapes that found no placement this cycle; free space only shrinks within a cycle.
    /// Whether the job allows spot, and whether it may use cloud pools at all, are part of
    /// the shape: they change where the job may go.
    unplaceable: BTreeSet<(ClassId, u16, u32, TopologyKey, bool, bool)>,
    /// (team, class, priority, within reserved, own team only, below the service threshold)
    /// → smallest demand whose preemption failed.
    pub(super) unpreemptable: BTreeMap<(TeamId, ClassId, u8, bool, bool, bool), u64>,
    pub(super) decisions: Decisions,
    /// The queue position of the job being decided: one more for every job considered.
    pub(super) position: u32,
}

type TopologyKey = (u8, u8);

fn topology_key(t: Topology) -> TopologyKey {
    match t {
        Topology::Any => (0, 0),
        Topology::Required(l) => (1, l as u8),
        Topology::Preferred(l) => (2, l as u8),
    }
}

/// The priority a job of running job `index`'s own team must be above to take it: its own
/// priority, or, for an elastic gang's extra replica (`extra`), one less. An extra grew into
/// capacity that no waiting job could use then; once a job of its team of no lower priority
/// waits for that capacity, the extra gives it back rather than have the team's queue wait
/// behind its own gang's growth.
fn yields_below(s: &Snapshot, extra: &[bool], index: usize) -> i32 {
    let priority = s.priorities.get(usize::from(s.running[index].spec.priority)).map_or(0, |p| p.priority);
    if extra.get(index).copied().unwrap_or(false) {
        priority.saturating_sub(1)
    } else {
        priority
    }
}

/// Runs one cycle.
pub fn run(snapshot: &Snapshot) -> Decisions {
    run_with(snapshot, false)
}

/// Runs one cycle the way it ran before its walks were indexed: a job that may take only its
/// own team's jobs walks every candidate of its class (and every job of the class in its
/// minimum runtime), whether another team borrows is found by a pass over every team after
/// each admission, and the GPUs held for waiting jobs are summed claim by claim for every
/// waiting job. It decides exactly what [`run`] decides, in more time at scale; kept so that
/// tests and `fairway bench scheduler-10x` can check that.
pub fn run_exhaustive(snapshot: &Snapshot) -> Decisions {
    run_with(snapshot, true)
}

fn run_with(snapshot: &Snapshot, exhaustive: bool) -> Decisions {
    // Elastic gangs' extras are running jobs of their own to the cycle.
    let expanded = super::elastic::expand(snapshot);
    let snapshot = expanded.as_ref().map_or(snapshot, |e| &e.snapshot);
    let extras = expanded
        .as_ref()
        .map(|e| e.origins.iter().map(|o| matches!(o, super::elastic::Origin::Extra { .. })).collect());
    let mut cycle = Cycle::new(snapshot, extras);
    cycle.exhaustive = exhaustive;
    match snapshot.config.policy {
        Policy::Fifo => cycle.fifo(),
        Policy::Fairway | Policy::QuotaNoHistory => cycle.fair(),
    }
    cycle.grow();
    let mut decisions = std::mem::take(&mut cycle.decisions);
    if let Some(expanded) = &expanded {
        expanded.fold(&mut decisions, &cycle.preempted);
    }
    decisions.fragmentation = fragmentation(snapshot, &cycle.inv, &decisions);
    if snapshot.config.estimate_start_times {
        // GPUs held for waiting jobs are theirs to start on: count them as free.
        let mut held = vec![0u64; snapshot.classes.len()];
        let holds =
            cycle.claims.iter().map(|c| (c.1, &c.2)).chain(cycle.reservations.iter().map(|(c, r)| (*c, &r.held)));
        for (class, placement) in holds {
            if let Some(h) = held.get_mut(usize::from(class)) {
                *h += placement.iter().flat_map(|r| r.units.iter()).map(|&(_, m)| u64::from(m)).sum::<u64>();
            }
        }
        let free: Vec<u64> = (0..snapshot.classes.len())
            .map(|c| cycle.inv.free_milli(c as ClassId) + held.get(c).copied().unwrap_or(0))
            .collect();
        match snapshot.config.start_time_model {
            StartTimeModel::QuantileForecast => {
                super::eta::forecast(snapshot, &free, &cycle.victims, &mut decisions);
            }
            StartTimeModel::MaxRuntime => super::eta::naive(snapshot, &free, &cycle.victims, &mut decisions),
        }
    }
    decisions
}

impl<'a> Cycle<'a> {
    /// Starts a cycle from the snapshot: running jobs hold their GPUs, and those not stopping
    /// their quota and the budget they may still spend, so every check sees what is left.
    /// `extras` marks, by running index, the elastic gangs' extra replicas (`None`: none).
    fn new(s: &'a Snapshot, extras: Option<Vec<bool>>) -> Self {
        let extra = extras.unwrap_or_else(|| vec![false; s.running.len()]);
        let mut inv = Inventory::new(&s.nodes, s.classes.len());
        if s.config.placement == Placement::Fragmentation {
            inv.place_by_fragmentation(super::fragmentation::mixes_of(s));
        }
        let mut ledger = Ledger::new(s);
        let mut hard_left: Vec<Option<i64>> = s.teams.iter().map(|t| t.hard_budget_left_micros).collect();
        let mut soft_left: Vec<Option<i64>> = s.teams.iter().map(|t| t.soft_budget_left_micros).collect();
        let mut hard_gpu_left: Vec<Option<i64>> = s.teams.iter().map(|t| t.hard_budget_left_gpu_milli_ms).collect();
        for r in &s.running {
            inv.allocate(&r.placement);
            // A stopping job keeps its GPUs until it exits, but no longer its quota: like a
            // victim chosen in this cycle, it is leaving.
            if (r.spec.team as usize) < s.teams.len() && !r.terminating {
                ledger.add_job(r.spec.team, r.spec.class, r.spec.total_milli(), !s.preemptible(&r.spec), false);
                // A hard budget must also cover what running jobs may still spend.
                let remaining =
                    s.within_budget_period(s.now_ms, (r.started_ms + r.spec.max_runtime_ms - s.now_ms).max(0));
                let committed = if r.terminating { 0 } else { cost_micros(s, &r.spec, remaining) };
                let committed_time = if r.terminating { 0 } else { gpu_time(s, &r.spec, remaining) };
                for t in budget_chain(s, r.spec.team) {
                    for l in [&mut hard_left[t], &mut soft_left[t]].into_iter().flatten() {
                        *l = l.saturating_sub(committed);
                    }
                    if let Some(l) = &mut hard_gpu_left[t] {
                        *l = l.saturating_sub(committed_time);
                    }
                }
            }
        }
        let mut stopping_unclaimed: BTreeMap<ClassId, u64> = BTreeMap::new();
        for r in s.running.iter().filter(|r| r.terminating) {
            *stopping_unclaimed.entry(r.spec.class).or_default() += r.spec.total_milli();
        }
        let (burst_value, burst_weight) = preemption::burst_demand(s, &ledger);
        let (victim_order, young) = preemption::candidates(s);
        let classes = s.classes.len();
        let borrowing: Vec<bool> = (0..s.teams.len() * classes)
            .map(|i| ledger.borrowed((i / classes) as TeamId, (i % classes) as ClassId) > 0)
            .collect();
        let mut borrowing_teams = vec![0; classes];
        for (i, _) in borrowing.iter().enumerate().filter(|(_, &b)| b) {
            borrowing_teams[i % classes] += 1;
        }
        let reach = Reach::new(s, &victim_order, &ledger);
        let mut place_in_order = vec![u32::MAX; s.running.len()];
        for order in victim_order.values() {
            for (at, &i) in order.iter().enumerate() {
                place_in_order[i] = at as u32;
            }
        }
        let passed = victim_order.iter().map(|(&class, order)| (class, Passed::new(order.len()))).collect();
        let team_victim_order = preemption::by_team(s, &victim_order);
        // A job past the service threshold may yield to one of its own priority: counted as
        // one below it, which only keeps a job that might take it in rank order.
        let may_yield_below = |i: usize| {
            let below = yields_below(s, &extra, i);
            if s.past_service_threshold(&s.running[i]) {
                below.min(s.priorities.get(usize::from(s.running[i].spec.priority)).map_or(0, |p| p.priority) - 1)
            } else {
                below
            }
        };
        let lowest_victim_priority = team_victim_order
            .iter()
            .filter_map(|(&key, order)| order.iter().map(|&i| may_yield_below(i)).min().map(|p| (key, p)))
            .collect();
        let team_young = preemption::by_team(s, &young);
        Self {
            s,
            inv,
            ledger,
            hard_left,
            soft_left,
            hard_gpu_left,
            victims: BTreeSet::new(),
            preempted: Vec::new(),
            victim: vec![false; s.running.len()],
            extra,
            victim_order,
            passed,
            place_in_order,
            team_victim_order,
            lowest_victim_priority,
            young,
            team_young,
            stopping_unclaimed,
            largest_borrowers: BTreeMap::new(),
            claimed_free: BTreeMap::new(),
            claims: Vec::new(),
            claims_by_class: BTreeMap::new(),
            exhaustive: false,
            reserved_demand: BTreeSet::new(),
            burst_value,
            burst_weight,
            waiting_in_team: BTreeMap::new(),
            borrowers: BTreeMap::new(),
            borrowing,
            borrowing_teams,
            reach,
            fair_share_failures: BTreeMap::new(),
            admitted_ends: Vec::new(),
            reservations: BTreeMap::new(),
            unplaceable: BTreeSet::new(),
            unpreemptable: BTreeMap::new(),
            decisions: Decisions::default(),
            position: 0,
        }
    }

    /// A job of the same team may take running job `index` when its priority is above this:
    /// the running job's own priority, or, for an elastic gang's extra, one less, so that a
    /// job of the same priority may take it too (see [`yields_below`]).
    pub(super) fn yields_below(&self, index: usize) -> i32 {
        yields_below(self.s, &self.extra, index)
    }

    /// Whether a job of `job`'s team with priority `priority`, below the least-attained-service
    /// threshold or not (`below`), could preempt waiting job `job` once it ran: `job` has a
    /// lower priority, or the same and is past the threshold.
    pub(super) fn could_take(&self, priority: i32, below: bool, job: &JobSpec) -> bool {
        let mine = self.priority(job);
        mine < priority || (mine == priority && below && self.yields_to_less_service(job))
    }

    /// The job's priority value (higher goes first), from its priority class.
    pub(super) fn priority(&self, job: &JobSpec) -> i32 {
        self.s.priorities.get(usize::from(job.priority)).map_or(0, |p| p.priority)
    }

    /// Whether the job's priority class lets it be preempted (and so borrow).
    pub(super) fn preemptible(&self, job: &JobSpec) -> bool {
        self.s.preemptible(job)
    }

    /// Records that the job waits, at the current queue position, why, and the numbers
    /// behind the reason.
    pub(super) fn pend(&mut self, job: &JobSpec, reason: PendingReason) {
        let figures = self.figures(job, &reason);
        self.decisions.pending.push(Pending {
            job: job.id,
            position: self.position,
            reason,
            figures,
            expected_start_ms: None,
            earliest_start_ms: None,
            latest_start_ms: None,
            played_start_ms: None,
            unforeseeable: None,
        });
    }

    /// The numbers behind `reason` for `job`, as the cycle stands now.
    fn figures(&self, job: &JobSpec, reason: &PendingReason) -> Figures {
        let known_team = (job.team as usize) < self.s.teams.len();
        let free = if known_team { self.available(job) } else { self.inv.free_milli(job.class) };
        let quota = match *reason {
            PendingReason::BurstLimit { team } | PendingReason::ExceedsQuota { team } => {
                Some((self.ledger.quota(team, job.class), self.ledger.usage(team, job.class)))
            }
            // What counts against a non-preemptible job's limit: the team's other
            // non-preemptible jobs.
            PendingReason::ReservedQuotaExhausted { team } => {
                Some((self.ledger.quota(team, job.class), self.ledger.firm(team, job.class)))
            }
            _ => None,
        };
        let budget = match reason {
            PendingReason::BudgetExhausted => self.budget_shortfall(job),
            _ => None,
        };
        let drivers = matches!(reason, PendingReason::DriverUnavailable | PendingReason::NoDriverFit).then(|| {
            let (newest, free_meeting) = self.inv.driver_figures(job.class, &job.min_drivers);
            DriverFigures { required: job.min_drivers, newest, free_meeting }
        });
        Figures { needs: job.total_milli(), free, quota, budget, drivers }
    }

    /// True when the job cannot be admitted now whatever the order: it never fits, its
    /// budget is spent, it is not preemptible and its team's other non-preemptible jobs hold
    /// its reserved quota, its quota is exhausted and no lower-priority job of its own team
    /// could make room, or a higher-priority job of its team waits.
    ///
    /// A job over its quota that could preempt its own team's lower-priority jobs is not
    /// decided ahead of the ranking: its preemption holds quota its ancestors share with
    /// other teams, so it must come in rank order. Decided early, it could hold a parent's
    /// quota against a job ranked before it that had already preempted for that room, whose
    /// victim would then take the room back, and the two would take turns for ever.
    pub(super) fn blocked_by_rules(&self, job: &JobSpec) -> bool {
        let n = job.total_milli();
        (job.team as usize) >= self.s.teams.len()
            || !self.inv.could_ever_fit(job)
            || !self.inv.drivers_could_ever_fit(job)
            || !self.hard_budgets_cover(job)
            || self
                .waiting_in_team
                .get(&(job.team, job.class))
                .is_some_and(|&(_, p, below)| self.could_take(p, below, job))
            // No preemption lowers a team's non-preemptible use: beyond it, the job waits.
            || (!self.preemptible(job) && self.ledger.firm_beyond_reserved(job.team, job.class, n).is_some())
            || (self.ledger.over_limit(job.team, job.class, n).is_some() && !self.may_preempt_own_team(job))
    }

    /// Whether some running job of the job's own team and class had a lower priority and
    /// could be a victim when the cycle began (never under FIFO, which does not preempt).
    fn may_preempt_own_team(&self, job: &JobSpec) -> bool {
        self.s.config.policy != Policy::Fifo
            && self.lowest_victim_priority.get(&(job.class, job.team)).is_some_and(|&p| p < self.priority(job))
    }

    /// Decides one job: admits it, has it wait for victims or stopping jobs, or says why it
    /// waits. The checks run in the order of the module docs, the first failing one giving
    /// the reason.
    pub(super) fn consider(&mut self, job: &JobSpec) {
        let s = self.s;
        let n = job.total_milli();
        if (job.team as usize) >= s.teams.len() || !self.inv.could_ever_fit(job) {
            return self.pend(job, PendingReason::NeverFits);
        }
        if !self.inv.drivers_could_ever_fit(job) {
            return self.pend(job, PendingReason::DriverUnavailable);
        }
        if !self.hard_budgets_cover(job) {
            return self.pend(job, PendingReason::BudgetExhausted);
        }
        if let Some(&(waiting, priority, below)) = self.waiting_in_team.get(&(job.team, job.class)) {
            if self.could_take(priority, below, job) {
                return self.pend(job, PendingReason::ReservedFor { job: waiting });
            }
        }
        if !self.preemptible(job) {
            if let Some(team) = self.ledger.firm_beyond_reserved(job.team, job.class, n) {
                return self.firm_beyond_reserved(job, team);
            }
        }
        let over = self.ledger.over_limit(job.team, job.class, n);
        let beyond = self.ledger.beyond_reserved(job.team, job.class, n);
        if let Some(team) = over {
            return self.consider_over_quota(job, team, beyond);
        }
        let available = self.available(job);
        if available >= n {
            if let Some(placement) = self.place(job) {
                return self.admit(job, placement, beyond.is_some(), None);
            }
        }
        if let Some((placement, gang)) = self.backfill(job) {
            return self.admit(job, placement, beyond.is_some(), Some(gang));
        }
        if self.claim_stopping(job, available) {
            return self.pend(job, PendingReason::WaitingForReclaim);
        }
        if self.preempt(job, beyond.is_none(), false) {
            return;
        }
        let reason = self.capacity_reason(job, available, beyond);
        if !self.reservations.contains_key(&job.class) && s.reserves(job, s.now_ms) {
            self.reserve(job);
        }
        self.pend(job, reason);
    }

    /// Quota, not capacity, blocks the job: `over` is the team it would take above reserved +
    /// burst, `beyond` whether it would take its own team beyond its reserved quota. A team
    /// within its own reserved quota takes back what borrowing siblings hold; otherwise only
    /// the team's own lower-priority work can make room. Failing that, it waits with the
    /// quota reason.
    fn consider_over_quota(&mut self, job: &JobSpec, over: TeamId, beyond: Option<TeamId>) {
        if self.preempt(job, beyond.is_none(), beyond.is_some()) {
            return;
        }
        if let Some(team) = self.quota_too_small(job) {
            return self.pend(job, PendingReason::ExceedsQuota { team });
        }
        self.pend(job, PendingReason::BurstLimit { team: over });
    }

    /// A non-preemptible job that its team's other non-preemptible jobs leave no room for in
    /// `team`'s reserved quota waits: preempting anyone would not lower that use.
    fn firm_beyond_reserved(&mut self, job: &JobSpec, team: TeamId) {
        match self.quota_too_small(job) {
            Some(team) => self.pend(job, PendingReason::ExceedsQuota { team }),
            None => self.pend(job, PendingReason::ReservedQuotaExhausted { team }),
        }
    }

    /// When `job`, `available` short of what it needs, could take the rest from jobs still
    /// within the minimum runtime before preemption: its team's lower-priority jobs, or,
    /// `within_reserved`, jobs of teams borrowing at a level its team does not share (the
    /// priority and reclaim rules; fair share waits for no one). The time enough of them have
    /// run their minimum, or `None` when all of them would not do. Judged by amount, like
    /// [`Self::held_for`]: it explains a wait, it decides nothing.
    fn victims_in_minimum_runtime(&self, job: &JobSpec, available: u64, within_reserved: bool) -> Option<i64> {
        let s = self.s;
        if s.config.policy == Policy::Fifo || (job.team as usize) >= s.teams.len() {
            return None;
        }
        // Without reclaim only the team's own jobs may be taken: its own list has them in the
        // same order, and every other team's job would be passed over.
        let young = if within_reserved || self.exhaustive {
            self.young.get(&job.class)?
        } else {
            self.team_young.get(&(job.class, job.team))?
        };
        let min = s.config.min_runtime_before_preemption_ms;
        let chain: Vec<TeamId> = self.ledger.chain(job.team).collect();
        let priority = self.priority(job);
        let mut freed = available;
        for &i in young {
            let r = &s.running[i];
            let may = !self.victim[i]
                && if r.spec.team == job.team {
                    self.yields_below(i) < priority
                        || (self.priority(&r.spec) == priority
                            && s.below_service_threshold(job)
                            && s.past_service_threshold(r))
                } else {
                    within_reserved && self.reclaimable(job.class, &chain, r.spec.team)
                };
            if may {
                freed += r.spec.total_milli();
                if freed >= job.total_milli() {
                    return Some(r.started_ms.saturating_add(min));
                }
            }
        }
        None
    }

    /// GPUs of jobs already stopping go to the first jobs that need them: preempting more
    /// before they are gone would lose work for nothing. If the job's class has enough of
    /// them, with what is free, they are claimed for it, with its quota and the free part of
    /// its GPUs, against jobs ranked after it; returns whether it was.
    fn claim_stopping(&mut self, job: &JobSpec, available: u64) -> bool {
        let n = job.total_milli();
        let stopping = self.stopping_unclaimed.get(&job.class).copied().unwrap_or(0);
        if stopping > 0 && available + stopping >= n {
            self.stopping_unclaimed.insert(job.class, stopping - n.saturating_sub(available));
            *self.claimed_free.entry(job.class).or_default() += available.min(n);
            self.push_claim(job.id, job.class, Vec::new());
            self.claim_quota(job);
            return true;
        }
        false
    }

    /// Why a job within its quota still waits for capacity: GPUs held for another job, no
    /// placement with the topology it requires, a larger borrower under fair share, or simply
    /// not enough free GPUs.
    fn capacity_reason(&mut self, job: &JobSpec, available: u64, beyond: Option<TeamId>) -> PendingReason {
        if let Some(holder) = self.held_for(job) {
            PendingReason::ReservedFor { job: holder }
        } else if let (true, Topology::Required(level)) = (available >= job.total_milli(), job.topology) {
            PendingReason::NoTopologyFit { within: Some(level) }
        } else if available >= job.total_milli() && self.inv.fits_only_across_clusters(job) {
            PendingReason::NoTopologyFit { within: None }
        } else if available >= job.total_milli() && job.min_drivers.requires_any() {
            PendingReason::NoDriverFit
        } else if available >= job.total_milli() && !job.host.is_empty() && self.fits_by_gpus_alone(job) {
            PendingReason::NoHostFit { asks: job.host }
        } else if let Some(at_ms) = self.victims_in_minimum_runtime(job, available, beyond.is_none()) {
            PendingReason::VictimsInMinimumRuntime { at_ms }
        } else if beyond.is_some() {
            match self.largest_borrower(job.class, job.team) {
                Some(team) if self.s.config.policy == Policy::Fairway => PendingReason::FairShareBehind { team },
                _ => PendingReason::InsufficientCapacity,
            }
        } else {
            PendingReason::InsufficientCapacity
        }
    }

    /// Whether the job would be placed now if its replicas asked for no CPU or memory: then
    /// CPU or memory, not GPUs, keep it waiting.
    fn fits_by_gpus_alone(&mut self, job: &JobSpec) -> bool {
        let gpus_only = JobSpec { host: Default::default(), ..job.clone() };
        self.inv.can_place(&gpus_only)
    }

    /// The team whose quota is smaller than the whole job, so that it can never be admitted
    /// while quotas stay as they are: reserved + burst anywhere in the chain, or reserved of
    /// the team itself for a non-preemptible job.
    fn quota_too_small(&self, job: &JobSpec) -> Option<TeamId> {
        let n = job.total_milli();
        if !self.preemptible(job) && self.ledger.quota(job.team, job.class).reserved < n {
            return Some(job.team);
        }
        self.ledger.chain(job.team).find(|&t| {
            let q = self.ledger.quota(t, job.class);
            q.reserved.saturating_add(q.burst) < n
        })
    }

    /// Free capacity of the class this job may use: all free GPUs except those held back
    /// for other teams' idle, unlendable reserved quota.
    pub(super) fn available(&self, job: &JobSpec) -> u64 {
        let claimed = self.claimed_free.get(&job.class).copied().unwrap_or(0);
        self.inv
            .free_milli(job.class)
            .saturating_sub(self.ledger.held_back_for_others(job.team, job.class))
            .saturating_sub(claimed)
    }

    /// Brings `borrowing` up to date for `team` and its ancestors in `class`, after their
    /// usage changed.
    pub(super) fn refresh_borrowing(&mut self, team: TeamId, class: ClassId) {
        let (classes, c) = (self.s.classes.len(), usize::from(class));
        if c >= classes {
            return;
        }
        for t in self.ledger.chain(team) {
            self.reach.refresh(&self.ledger, t, class);
            let now = self.ledger.borrowed(t, class) > 0;
            if let Some(flag) = self.borrowing.get_mut(t as usize * classes + c) {
                if *flag != now {
                    *flag = now;
                    if now {
                        self.borrowing_teams[c] += 1;
                    } else {
                        self.borrowing_teams[c] -= 1;
                    }
                }
            }
        }
    }

    /// Records GPUs held for a waiting job (none when it waits for stopping jobs' GPUs).
    pub(super) fn push_claim(&mut self, job: JobId, class: ClassId, held: Vec<ReplicaPlacement>) {
        let milli: u64 = held.iter().flat_map(|r| r.units.iter()).map(|&(_, m)| u64::from(m)).sum();
        self.claims_by_class.entry(class).or_insert((job, 0)).1 += milli;
        self.claims.push((job, class, held));
    }

    /// Counts a waiting job's quota as used for the rest of the cycle, so jobs ranked after
    /// it cannot take the room its victims are making.
    pub(super) fn claim_quota(&mut self, job: &JobSpec) {
        if (job.team as usize) < self.s.teams.len() {
            self.ledger.add_job(job.team, job.class, job.total_milli(), !self.preemptible(job), false);
            self.largest_borrowers.remove(&job.class);
            self.borrowers.remove(&job.class);
            self.refresh_borrowing(job.team, job.class);
        }
        let priority = self.priority(job);
        let below = self.s.below_service_threshold(job);
        self.waiting_in_team.entry((job.team, job.class)).or_insert((job.id, priority, below));
    }

    /// Finds the job a placement in free capacity, remembering shapes that found none: free
    /// space only shrinks within a cycle, so the same shape cannot fit later either.
    fn place(&mut self, job: &JobSpec) -> Option<Vec<ReplicaPlacement>> {
        let shape = (
            job.class,
            job.replicas,
            job.milli_per_replica,
            topology_key(job.topology),
            job.allow_spot,
            job.fixed_nodes_only,
        );
        if self.unplaceable.contains(&shape) {
            return None;
        }
        let found = self.inv.find(job);
        if found.is_none() {
            self.unplaceable.insert(shape);
        }
        found
    }

    /// Admits the job on `placement`: allocates its GPUs, counts its quota, spends its
    /// maximum cost from every budget over its team, and notes when it ends for reservations.
    pub(super) fn admit(
        &mut self,
        job: &JobSpec,
        placement: Vec<ReplicaPlacement>,
        borrowing: bool,
        backfilled_ahead_of: Option<JobId>,
    ) {
        let (cost, exceeds_soft_budget) = self.take(job, &placement);
        let s = self.s;
        self.admitted_ends.push((s.now_ms.saturating_add(job.max_runtime_ms), job.class, job.id, placement.clone()));
        self.decisions.admissions.push(Admission {
            job: job.id,
            placement,
            borrowing,
            max_cost_micros: cost,
            exceeds_soft_budget,
            backfilled_ahead_of,
        });
    }

    /// Gives `job` the GPUs of `placement`: allocates them, counts its quota, and spends its
    /// maximum cost from every budget over its team. Returns that cost, and whether it goes
    /// past a soft budget.
    pub(super) fn take(&mut self, job: &JobSpec, placement: &[ReplicaPlacement]) -> (i64, bool) {
        let s = self.s;
        self.inv.allocate(placement);
        let n = job.total_milli();
        let budgeted_ms = s.within_budget_period(s.now_ms, job.max_runtime_ms);
        let cost = cost_micros(s, job, budgeted_ms);
        let mut exceeds_soft_budget = false;
        self.largest_borrowers.remove(&job.class);
        self.borrowers.remove(&job.class);
        if (job.team as usize) < s.teams.len() {
            self.ledger.add_job(job.team, job.class, n, !self.preemptible(job), false);
            self.refresh_borrowing(job.team, job.class);
            let time = gpu_time(s, job, budgeted_ms);
            for t in budget_chain(s, job.team) {
                if let Some(left) = &mut self.hard_left[t] {
                    *left = left.saturating_sub(cost);
                }
                if let Some(left) = &mut self.hard_gpu_left[t] {
                    *left = left.saturating_sub(time);
                }
                if let Some(left) = &mut self.soft_left[t] {
                    exceeds_soft_budget |= *left < cost;
                    *left = left.saturating_sub(cost);
                }
            }
        }
        (cost, exceeds_soft_budget)
    }
}

/// Free and stranded capacity per class, judged against the shapes of the waiting jobs.
fn fragmentation(s: &Snapshot, inv: &Inventory, d: &Decisions) -> Vec<super::decision::Fragmentation> {
    let still_waiting: BTreeSet<JobId> = d.pending.iter().map(|p| p.job).collect();
    (0..s.classes.len() as ClassId)
        .filter(|&c| inv.capacity_milli(c) > 0)
        .map(|class| {
            let waiting = s.pending.iter().filter(|j| j.class == class && still_waiting.contains(&j.id));
            let (mut whole, mut share, mut any) = (u8::MAX, u32::MAX, false);
            for j in waiting {
                any = true;
                if j.milli_per_replica >= super::snapshot::UNIT {
                    whole = whole.min((j.milli_per_replica / super::snapshot::UNIT).min(64) as u8);
                } else {
                    share = share.min(j.milli_per_replica);
                }
            }
            super::decision::Fragmentation {
                class,
                free_milli: inv.free_milli(class),
                stranded_milli: if any { inv.stranded_milli(class, whole, share) } else { 0 },
            }
        })
        .collect()
}
