//! One admission cycle: rank, check quota and budget, place, preempt, reserve, explain.

use std::{
    cmp::Ordering,
    collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque},
};

use super::{
    decision::{Admission, Decisions, Pending, PendingReason, PreemptReason, Preemption},
    fairshare,
    inventory::Inventory,
    quota::Ledger,
    snapshot::{ClassId, JobId, JobSpec, Policy, ReplicaPlacement, Snapshot, TeamId, Topology},
};

/// Maximum cost of running `spec` for `ms` milliseconds, in micro-units of money:
/// units × rate per unit-hour × hours × price multiplier. Exact integer arithmetic.
/// GPU time of `spec` for `ms` milliseconds in the ledger's unit (physical GPUs in
/// thousandths × milliseconds), for GPU-hour budgets.
pub fn gpu_time(snapshot: &Snapshot, spec: &JobSpec, ms: i64) -> i64 {
    let fraction = snapshot.classes.get(usize::from(spec.class)).map_or(1000, |c| i128::from(c.fraction_milli));
    let time = i128::from(spec.total_milli()) * fraction * i128::from(ms.max(0)) / 1000;
    i64::try_from(time).unwrap_or(i64::MAX)
}

pub fn cost_micros(snapshot: &Snapshot, spec: &JobSpec, ms: i64) -> i64 {
    let rate = snapshot.classes.get(usize::from(spec.class)).map_or(0, |c| i128::from(c.rate_micros_per_hour));
    let mult =
        snapshot.priorities.get(usize::from(spec.priority)).map_or(1000, |p| i128::from(p.price_multiplier_milli));
    let cost = i128::from(spec.total_milli()) * rate * i128::from(ms.max(0)) * mult / (1000 * 3_600_000 * 1000);
    i64::try_from(cost).unwrap_or(i64::MAX)
}

/// `team` and its ancestors, as indices: the budgets a job of `team` spends from. Bounded
/// by the number of teams, so a malformed tree cannot loop.
fn budget_chain(s: &Snapshot, team: TeamId) -> impl Iterator<Item = usize> + '_ {
    std::iter::successors(Some(team), move |&t| s.teams.get(t as usize).and_then(|x| x.parent))
        .take(s.teams.len())
        .map(|t| t as usize)
        .filter(move |&t| t < s.teams.len())
}

/// Orders team heads: reserved demand first (by priority, then age), then burst demand by
/// fair-share score (then priority, then age). Totally ordered, so cycles are deterministic.
#[derive(Debug, Clone, Copy)]
struct HeadKey {
    tier: u8,
    score: f64,
    priority: i32,
    submitted: i64,
    job: JobId,
    team: TeamId,
}

impl PartialEq for HeadKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for HeadKey {}
impl PartialOrd for HeadKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for HeadKey {
    /// Reversed: `BinaryHeap` pops the greatest, and the best head must be the greatest.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.tier.cmp(&self.tier))
            .then_with(|| other.score.total_cmp(&self.score))
            .then_with(|| self.priority.cmp(&other.priority))
            .then_with(|| other.submitted.cmp(&self.submitted))
            .then_with(|| other.job.cmp(&self.job))
            .then_with(|| other.team.cmp(&self.team))
    }
}

/// A blocked gang's hold on the future. By `shadow_ms` the running jobs' maximum runtimes
/// will have freed GPUs where the gang can be placed; of those, the ones free now are held.
/// Other jobs run anywhere else, and on the held GPUs only if they end before `shadow_ms`
/// (EASY backfill), so a large gang cannot starve behind a stream of small ones.
#[derive(Debug, Clone)]
struct Reservation {
    job: JobId,
    shadow_ms: i64,
    /// Exactly what is held now (released to let a short job backfill).
    held: Vec<ReplicaPlacement>,
}

struct Cycle<'a> {
    s: &'a Snapshot,
    inv: Inventory,
    ledger: Ledger,
    /// Hard budget left per team after the committed cost of its running jobs.
    hard_left: Vec<Option<i64>>,
    soft_left: Vec<Option<i64>>,
    /// GPU time left per team under a hard GPU-hour budget, after running jobs' remainder.
    hard_gpu_left: Vec<Option<i64>>,
    /// Running jobs chosen as victims this cycle.
    victims: BTreeSet<usize>,
    /// The same, by running-job index, for the hot loops (also marks tentative victims).
    victim: Vec<bool>,
    /// Per class, the running jobs that may ever be victims this cycle (preemptible, past
    /// the minimum runtime, not stopping), least work lost first, then largest.
    victim_order: BTreeMap<ClassId, Vec<usize>>,
    /// Milli per class held by jobs that were told to stop in earlier cycles and are not
    /// yet claimed by a job ranked earlier in this cycle.
    stopping_unclaimed: BTreeMap<ClassId, u64>,
    /// The largest borrower per class, valid until the next admission of that class.
    largest_borrowers: BTreeMap<ClassId, Vec<TeamId>>,
    /// Teams with a job waiting for its victims, per class: the waiting job and its priority.
    /// The team's lower-priority jobs of the class wait behind it, so they cannot take the
    /// reserved room its victims free and be preempted for it in turn.
    waiting_in_team: BTreeMap<(TeamId, ClassId), (JobId, i32)>,
    /// Every team (at any level) borrowing a class, valid until the class's usage changes.
    borrowers: BTreeMap<ClassId, Vec<TeamId>>,
    /// GPUs held for jobs waiting for their victims: (job, class, placement).
    claims: Vec<(JobId, ClassId, Vec<ReplicaPlacement>)>,
    /// Borrowed value (money per hour) in use at the start of the cycle, over top-level teams.
    burst_value: f64,
    /// Total fair-share weight of the teams borrowing or waiting to borrow.
    burst_weight: f64,
    /// Teams with reserved demand queued behind their own burst jobs in phase two.
    reserved_demand: BTreeSet<TeamId>,
    /// Free milli per class promised to jobs waiting for stopping jobs.
    claimed_free: BTreeMap<ClassId, u64>,
    /// Failed fair-share preemption attempts per class: (score after, milli). An attempt by
    /// a team whose score would be at least as high, for at least as much, fails too.
    fair_share_failures: BTreeMap<ClassId, Vec<(f64, u64)>>,
    /// Jobs admitted this cycle: (end, class, job, placement), for reservations.
    admitted_ends: Vec<(i64, ClassId, JobId, Vec<ReplicaPlacement>)>,
    reservations: BTreeMap<ClassId, Reservation>,
    /// Shapes that found no placement this cycle; free space only shrinks within a cycle.
    /// Whether the job allows spot is part of the shape: it widens where the job may go.
    unplaceable: BTreeSet<(ClassId, u16, u32, TopologyKey, bool)>,
    /// (team, class, priority, within reserved) → smallest demand whose preemption failed.
    unpreemptable: BTreeMap<(TeamId, ClassId, u8, bool, bool), u64>,
    decisions: Decisions,
    position: u32,
}

type TopologyKey = (u8, u8);

fn topology_key(t: Topology) -> TopologyKey {
    match t {
        Topology::Any => (0, 0),
        Topology::Required(l) => (1, l as u8),
        Topology::Preferred(l) => (2, l as u8),
    }
}

/// Runs one cycle.
pub fn run(snapshot: &Snapshot) -> Decisions {
    let mut cycle = Cycle::new(snapshot);
    match snapshot.config.policy {
        Policy::Fifo => cycle.fifo(),
        Policy::Fairway | Policy::QuotaNoHistory => cycle.fair(),
    }
    let mut decisions = std::mem::take(&mut cycle.decisions);
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
        super::eta::estimate(snapshot, &cycle.inv, &held, &cycle.victims, &mut decisions);
    }
    decisions
}

impl<'a> Cycle<'a> {
    fn new(s: &'a Snapshot) -> Self {
        let mut inv = Inventory::new(&s.nodes, s.classes.len());
        let mut ledger = Ledger::new(s);
        let mut hard_left: Vec<Option<i64>> = s.teams.iter().map(|t| t.hard_budget_left_micros).collect();
        let mut soft_left: Vec<Option<i64>> = s.teams.iter().map(|t| t.soft_budget_left_micros).collect();
        let mut hard_gpu_left: Vec<Option<i64>> = s.teams.iter().map(|t| t.hard_budget_left_gpu_milli_ms).collect();
        for r in &s.running {
            inv.allocate(&r.placement);
            // A stopping job keeps its GPUs until it exits, but no longer its quota: like a
            // victim chosen in this cycle, it is leaving.
            if (r.spec.team as usize) < s.teams.len() && !r.terminating {
                ledger.add(r.spec.team, r.spec.class, r.spec.total_milli(), false);
                // A hard budget must also cover what running jobs may still spend.
                let remaining = (r.started_ms + r.spec.max_runtime_ms - s.now_ms).max(0);
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
        // Who wants burst: teams borrowing now, and teams with a job beyond their reserved.
        let mut wants_burst: BTreeSet<TeamId> = BTreeSet::new();
        let mut burst_value = 0.0;
        for t in 0..s.teams.len() as TeamId {
            let live = fairshare::live_value(s, &ledger, t);
            if live > 0.0 {
                wants_burst.insert(t);
                if s.teams[t as usize].parent.is_none() {
                    burst_value += live;
                }
            }
        }
        for j in &s.pending {
            if (j.team as usize) < s.teams.len() && ledger.beyond_reserved(j.team, j.class, j.total_milli()).is_some() {
                wants_burst.insert(j.team);
            }
        }
        let burst_weight: f64 =
            wants_burst.iter().map(|&t| f64::from(s.teams[t as usize].fair_share_weight_milli.max(1))).sum();
        let mut victim_order: BTreeMap<ClassId, Vec<usize>> = BTreeMap::new();
        let mut keyed: Vec<(ClassId, u64, u64, JobId, usize)> = s
            .running
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                !r.terminating
                    && s.priorities.get(usize::from(r.spec.priority)).is_some_and(|p| p.preemptible)
                    && s.now_ms - r.started_ms >= s.config.min_runtime_before_preemption_ms
            })
            .map(|(i, r)| (r.spec.class, lost_work(s.now_ms, r), u64::MAX - r.spec.total_milli(), r.spec.id, i))
            .collect();
        keyed.sort_unstable();
        for (class, _, _, _, i) in keyed {
            victim_order.entry(class).or_default().push(i);
        }
        Self {
            s,
            inv,
            ledger,
            hard_left,
            soft_left,
            hard_gpu_left,
            victims: BTreeSet::new(),
            victim: vec![false; s.running.len()],
            victim_order,
            stopping_unclaimed,
            largest_borrowers: BTreeMap::new(),
            claimed_free: BTreeMap::new(),
            claims: Vec::new(),
            reserved_demand: BTreeSet::new(),
            burst_value,
            burst_weight,
            waiting_in_team: BTreeMap::new(),
            borrowers: BTreeMap::new(),
            fair_share_failures: BTreeMap::new(),
            admitted_ends: Vec::new(),
            reservations: BTreeMap::new(),
            unplaceable: BTreeSet::new(),
            unpreemptable: BTreeMap::new(),
            decisions: Decisions::default(),
            position: 0,
        }
    }

    fn priority(&self, job: &JobSpec) -> i32 {
        self.s.priorities.get(usize::from(job.priority)).map_or(0, |p| p.priority)
    }

    fn preemptible(&self, job: &JobSpec) -> bool {
        self.s.priorities.get(usize::from(job.priority)).is_some_and(|p| p.preemptible)
    }

    fn pend(&mut self, job: &JobSpec, reason: PendingReason) {
        self.decisions.pending.push(Pending { job: job.id, position: self.position, reason, expected_start_ms: None });
    }

    /// Strict FIFO: the oldest job first; the first that does not fit blocks all behind it.
    fn fifo(&mut self) {
        let mut order: Vec<&JobSpec> = self.s.pending.iter().collect();
        order.sort_by_key(|j| (j.submitted_ms, j.id));
        let mut head: Option<JobId> = None;
        for job in order {
            self.position += 1;
            if !self.inv.could_ever_fit(job) || (job.team as usize) >= self.s.teams.len() {
                self.pend(job, PendingReason::NeverFits);
                continue;
            }
            if let Some(h) = head {
                self.pend(job, PendingReason::BehindHeadOfLine { job: h });
                continue;
            }
            match self.inv.find(job) {
                Some(placement) => self.admit(job, placement, false),
                None => {
                    head = Some(job.id);
                    self.pend(job, PendingReason::InsufficientCapacity);
                }
            }
        }
    }

    fn key(&self, job: &JobSpec) -> HeadKey {
        let within = self.ledger.beyond_reserved(job.team, job.class, job.total_milli()).is_none()
            || self.reserved_demand.contains(&job.team);
        let score = if within || self.s.config.policy != Policy::Fairway {
            0.0
        } else {
            fairshare::score(self.s, &self.ledger, job.team)
        };
        HeadKey {
            tier: u8::from(!within),
            score,
            priority: self.priority(job),
            submitted: job.submitted_ms,
            job: job.id,
            team: job.team,
        }
    }

    /// Reserved first, then burst by fair share.
    ///
    /// Phase one decides, in priority then age order across all teams, every job that fits
    /// within its team's reserved quota (and those that rules alone keep waiting): the
    /// guaranteed part never waits behind anyone's burst, including its own team's. Phase two
    /// hands out burst capacity: team heads (each team's queue by priority, then age)
    /// compete by fair-share score.
    fn fair(&mut self) {
        let mut order: Vec<&'a JobSpec> = self.s.pending.iter().collect();
        order.sort_by(|a, b| {
            self.priority(b).cmp(&self.priority(a)).then(a.submitted_ms.cmp(&b.submitted_ms)).then(a.id.cmp(&b.id))
        });
        let mut queues: BTreeMap<TeamId, VecDeque<&'a JobSpec>> = BTreeMap::new();
        // Highest priority deferred to phase two per (team, class): the team's lower-priority
        // jobs wait for phase two too, or they would take room the higher-priority job then
        // preempts them for, cycle after cycle.
        let mut deferred: BTreeMap<(TeamId, ClassId), i32> = BTreeMap::new();
        for job in order {
            let within = (job.team as usize) < self.s.teams.len()
                && self.ledger.beyond_reserved(job.team, job.class, job.total_milli()).is_none()
                && deferred.get(&(job.team, job.class)).is_none_or(|&p| self.priority(job) >= p);
            if within || self.blocked_by_rules(job) {
                self.position += 1;
                self.consider(job);
            } else {
                let priority = self.priority(job);
                deferred.entry((job.team, job.class)).or_insert(priority);
                if (job.team as usize) < self.s.teams.len()
                    && self.ledger.beyond_reserved(job.team, job.class, job.total_milli()).is_none()
                {
                    // Reserved demand queued behind the team's own higher-priority burst job:
                    // the team still ranks with reserved demand in phase two.
                    self.reserved_demand.insert(job.team);
                }
                queues.entry(job.team).or_default().push_back(job);
            }
        }
        // Jobs that quota, budget or size alone keep waiting are decided as soon as they
        // reach the head of their team's queue, so they never hide the team's next job
        // (which may fit within reserved quota) from the ranking.
        let teams: Vec<TeamId> = queues.keys().copied().collect();
        let mut heap: BinaryHeap<HeadKey> = BinaryHeap::new();
        for team in teams {
            if let Some(head) = self.next_head(&mut queues, team) {
                heap.push(self.key(head));
            }
        }
        while let Some(top) = heap.pop() {
            let Some(job) = queues.get(&top.team).and_then(|q| q.front()).copied() else { continue };
            // Keys only grow stale by getting worse (usage rises within a cycle): re-rank
            // a head whose fresh key no longer beats the rest.
            let fresh = self.key(job);
            if let Some(next) = heap.peek() {
                if fresh.cmp(next) == Ordering::Less {
                    heap.push(fresh);
                    continue;
                }
            }
            if let Some(q) = queues.get_mut(&top.team) {
                q.pop_front();
            }
            self.position += 1;
            self.consider(job);
            if let Some(next) = self.next_head(&mut queues, top.team) {
                heap.push(self.key(next));
            }
        }
    }

    /// The team's next job that the ranking must decide, after deciding at once those that
    /// quota, budget or size alone keep waiting (their outcome does not depend on the order).
    fn next_head(&mut self, queues: &mut BTreeMap<TeamId, VecDeque<&'a JobSpec>>, team: TeamId) -> Option<&'a JobSpec> {
        loop {
            let job = queues.get(&team)?.front().copied()?;
            if !self.blocked_by_rules(job) {
                return Some(job);
            }
            if let Some(q) = queues.get_mut(&team) {
                q.pop_front();
            }
            self.position += 1;
            self.consider(job);
        }
    }

    /// Whether every hard budget over the job's team (its own and its ancestors': a
    /// department's budget covers its whole subtree), in money and in GPU-hours, still covers
    /// the job's maximum cost and GPU time.
    fn hard_budgets_cover(&self, job: &JobSpec) -> bool {
        let cost = cost_micros(self.s, job, job.max_runtime_ms);
        let time = gpu_time(self.s, job, job.max_runtime_ms);
        budget_chain(self.s, job.team).all(|t| {
            self.hard_left[t].is_none_or(|left| left >= cost) && self.hard_gpu_left[t].is_none_or(|left| left >= time)
        })
    }

    /// True when the job cannot be admitted now whatever the order: it never fits, its
    /// budget is spent, its quota is exhausted, or a higher-priority job of its team waits.
    fn blocked_by_rules(&self, job: &JobSpec) -> bool {
        let n = job.total_milli();
        (job.team as usize) >= self.s.teams.len()
            || !self.inv.could_ever_fit(job)
            || !self.hard_budgets_cover(job)
            || self.waiting_in_team.get(&(job.team, job.class)).is_some_and(|&(_, p)| self.priority(job) < p)
            || self.ledger.over_limit(job.team, job.class, n).is_some()
            || (!self.preemptible(job) && self.ledger.beyond_reserved(job.team, job.class, n).is_some())
    }

    fn consider(&mut self, job: &JobSpec) {
        let s = self.s;
        let n = job.total_milli();
        if (job.team as usize) >= s.teams.len() || !self.inv.could_ever_fit(job) {
            return self.pend(job, PendingReason::NeverFits);
        }
        if !self.hard_budgets_cover(job) {
            return self.pend(job, PendingReason::BudgetExhausted);
        }
        if let Some(&(waiting, priority)) = self.waiting_in_team.get(&(job.team, job.class)) {
            if self.priority(job) < priority {
                return self.pend(job, PendingReason::ReservedFor { job: waiting });
            }
        }
        let over = self.ledger.over_limit(job.team, job.class, n);
        let beyond = self.ledger.beyond_reserved(job.team, job.class, n);
        let non_preemptible = !self.preemptible(job);
        if over.is_some() || (beyond.is_some() && non_preemptible) {
            // Quota, not capacity, blocks it. A team within its own reserved quota takes
            // back what borrowing siblings hold; otherwise only the team's own lower-priority
            // work can make room.
            if s.config.policy != Policy::Fifo {
                if let Some(victims) = self.try_preempt(job, beyond.is_none(), beyond.is_some()) {
                    return self.wait_for(job, victims);
                }
            }
            if let Some(team) = self.quota_too_small(job) {
                return self.pend(job, PendingReason::ExceedsQuota { team });
            }
            return match (beyond, over) {
                (Some(team), _) if non_preemptible => self.pend(job, PendingReason::ReservedQuotaExhausted { team }),
                (_, Some(team)) => self.pend(job, PendingReason::BurstLimit { team }),
                (_, None) => self.pend(job, PendingReason::InsufficientCapacity),
            };
        }
        let available = self.available(job);
        if available >= n {
            if let Some(placement) = self.place(job) {
                return self.admit(job, placement, beyond.is_some());
            }
        }
        if let Some(placement) = self.backfill(job) {
            return self.admit(job, placement, beyond.is_some());
        }
        // It does not fit now. GPUs of jobs already stopping go to the first jobs that need
        // them: preempting more before they are gone would lose work for nothing.
        let stopping = self.stopping_unclaimed.get(&job.class).copied().unwrap_or(0);
        if stopping > 0 && available + stopping >= n {
            self.stopping_unclaimed.insert(job.class, stopping - n.saturating_sub(available));
            // Hold its quota and the free part of its GPUs against jobs ranked after it.
            *self.claimed_free.entry(job.class).or_default() += available.min(n);
            self.claims.push((job.id, job.class, Vec::new()));
            self.claim_quota(job);
            return self.pend(job, PendingReason::WaitingForReclaim);
        }
        if s.config.policy != Policy::Fifo {
            if let Some(victims) = self.try_preempt(job, beyond.is_none(), false) {
                return self.wait_for(job, victims);
            }
        }
        let reason = if let Some(holder) = self.held_for(job) {
            PendingReason::ReservedFor { job: holder }
        } else if available >= n && matches!(job.topology, Topology::Required(_)) {
            PendingReason::NoTopologyFit
        } else if beyond.is_some() {
            match self.largest_borrower(job.class, job.team) {
                Some(team) if s.config.policy == Policy::Fairway => PendingReason::FairShareBehind { team },
                _ => PendingReason::InsufficientCapacity,
            }
        } else {
            PendingReason::InsufficientCapacity
        };
        if s.config.policy == Policy::Fairway
            && job.total_milli() >= 2 * u64::from(super::snapshot::UNIT)
            && !self.reservations.contains_key(&job.class)
        {
            self.reserve(job);
        }
        self.pend(job, reason)
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
    fn available(&self, job: &JobSpec) -> u64 {
        let claimed = self.claimed_free.get(&job.class).copied().unwrap_or(0);
        self.inv
            .free_milli(job.class)
            .saturating_sub(self.ledger.held_back_for_others(job.team, job.class))
            .saturating_sub(claimed)
    }

    /// Counts a waiting job's quota as used for the rest of the cycle, so jobs ranked after
    /// it cannot take the room its victims are making.
    fn claim_quota(&mut self, job: &JobSpec) {
        if (job.team as usize) < self.s.teams.len() {
            self.ledger.add(job.team, job.class, job.total_milli(), false);
            self.largest_borrowers.remove(&job.class);
            self.borrowers.remove(&job.class);
        }
        let priority = self.priority(job);
        self.waiting_in_team.entry((job.team, job.class)).or_insert((job.id, priority));
    }

    /// The waiting job whose held GPUs keep `job` from fitting, if that is what blocks it:
    /// judged by amount (held plus available covers the job), which is cheap enough to ask
    /// for every waiting job; the code only explains, it decides nothing.
    fn held_for(&self, job: &JobSpec) -> Option<JobId> {
        let claims = self.claims.iter().filter(|c| c.1 == job.class);
        let mut holder = None;
        let mut held = self.claimed_free.get(&job.class).copied().unwrap_or(0);
        for (id, _, placement) in claims {
            holder.get_or_insert(*id);
            held += placement.iter().flat_map(|r| r.units.iter()).map(|&(_, m)| u64::from(m)).sum::<u64>();
        }
        if let Some(r) = self.reservations.get(&job.class) {
            holder.get_or_insert(r.job);
            held += r.held.iter().flat_map(|p| p.units.iter()).map(|&(_, m)| u64::from(m)).sum::<u64>();
        }
        let holder = holder?;
        (self.available(job) + held >= job.total_milli()).then_some(holder)
    }

    /// The burst a team deserves: the borrowed value in use across the platform at the
    /// start of the cycle, split among the teams that want burst (borrowing or waiting to)
    /// by weight. Fair-share preemption only lifts teams up to it and only takes from teams
    /// above it, so it restores fair share instead of churning between near-equal teams.
    fn deserved(&self, team: TeamId) -> f64 {
        let weight = self.s.teams.get(team as usize).map_or(0.0, |t| f64::from(t.fair_share_weight_milli.max(1)));
        if self.burst_weight <= 0.0 {
            return 0.0;
        }
        self.burst_value * weight / self.burst_weight
    }

    /// A team's fair-share score after losing `milli` of a class.
    fn score_without(&self, team: TeamId, class: ClassId, milli: u64) -> f64 {
        fairshare::score_with(self.s, &self.ledger, team, -fairshare::value_of(self.s, class, milli))
    }

    /// Whether `victim_team` borrows the class at a level `chain` (the preemptor's) does not
    /// share: the capacity it holds there is someone else's reserved quota.
    fn reclaimable(&self, class: ClassId, chain: &[TeamId], victim_team: TeamId) -> bool {
        self.ledger.chain(victim_team).find(|t| !chain.contains(t)).is_some_and(|t| self.ledger.borrowed(t, class) > 0)
    }

    /// Whether a team outside `chain` borrows the class at some level.
    fn other_borrower(&mut self, class: ClassId, chain: &[TeamId]) -> bool {
        let ledger = &self.ledger;
        let teams = self.s.teams.len() as TeamId;
        let list = self
            .borrowers
            .entry(class)
            .or_insert_with(|| (0..teams).filter(|&t| ledger.borrowed(t, class) > 0).collect());
        list.iter().any(|t| !chain.contains(t))
    }

    /// Records the victims chosen for `job`, which waits for them to stop.
    fn wait_for(&mut self, job: &JobSpec, victims: Vec<(usize, PreemptReason)>) {
        for (index, reason) in victims {
            self.record_victim(job, index, reason);
        }
        self.pend(job, PendingReason::WaitingForReclaim)
    }

    fn place(&mut self, job: &JobSpec) -> Option<Vec<ReplicaPlacement>> {
        let shape = (job.class, job.replicas, job.milli_per_replica, topology_key(job.topology), job.allow_spot);
        if self.unplaceable.contains(&shape) {
            return None;
        }
        let found = self.inv.find(job);
        if found.is_none() {
            self.unplaceable.insert(shape);
        }
        found
    }

    fn admit(&mut self, job: &JobSpec, placement: Vec<ReplicaPlacement>, borrowing: bool) {
        let s = self.s;
        self.inv.allocate(&placement);
        let n = job.total_milli();
        let cost = cost_micros(s, job, job.max_runtime_ms);
        let mut exceeds_soft_budget = false;
        self.largest_borrowers.remove(&job.class);
        self.borrowers.remove(&job.class);
        if (job.team as usize) < s.teams.len() {
            self.ledger.add(job.team, job.class, n, false);
            let time = gpu_time(s, job, job.max_runtime_ms);
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
        self.admitted_ends.push((s.now_ms.saturating_add(job.max_runtime_ms), job.class, job.id, placement.clone()));
        self.decisions.admissions.push(Admission {
            job: job.id,
            placement,
            borrowing,
            max_cost_micros: cost,
            exceeds_soft_budget,
        });
    }

    /// The top-level team (other than `except`) borrowing the most of the class.
    fn largest_borrower(&mut self, class: ClassId, except: TeamId) -> Option<TeamId> {
        let ledger = &self.ledger;
        let teams = &self.s.teams;
        // The two largest suffice: one of them is not `except`.
        let top = self.largest_borrowers.entry(class).or_insert_with(|| {
            let mut borrowers: Vec<(u64, TeamId)> = (0..teams.len() as TeamId)
                .filter(|&t| teams[t as usize].parent.is_none())
                .map(|t| (ledger.borrowed(t, class), t))
                .filter(|&(b, _)| b > 0)
                .collect();
            borrowers.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
            borrowers.into_iter().take(2).map(|(_, t)| t).collect()
        });
        top.iter().copied().find(|&t| t != except)
    }

    /// Gives a blocked gang its reservation: replays the running and just-admitted jobs of
    /// its class ending in order of their maximum runtimes until the gang can be placed, and
    /// holds the GPUs of that placement that are free now. Only gangs of two or more GPUs get
    /// one: a single GPU is served by whichever frees first and cannot starve.
    fn reserve(&mut self, job: &JobSpec) {
        let s = self.s;
        let mut ends: Vec<(i64, JobId, &[ReplicaPlacement])> = s
            .running
            .iter()
            .enumerate()
            .filter(|(_, r)| r.spec.class == job.class)
            .map(|(i, r)| {
                let end = if r.terminating || self.victims.contains(&i) {
                    s.now_ms + s.priorities.get(usize::from(r.spec.priority)).map_or(0, |p| p.preemption_grace_ms)
                } else {
                    r.started_ms.saturating_add(r.spec.max_runtime_ms)
                };
                (end.max(s.now_ms), r.spec.id, r.placement.as_slice())
            })
            .chain(self.admitted_ends.iter().filter(|e| e.1 == job.class).map(|e| (e.0, e.2, e.3.as_slice())))
            .collect();
        // Ties broken by job id: the replay, and so the held GPUs, must not depend on the
        // order the snapshot lists running jobs in.
        ends.sort_by_key(|e| (e.0, e.1));
        let mut future = self.inv.clone();
        let held_back = self.ledger.held_back_for_others(job.team, job.class);
        for (end, _, placement) in ends {
            future.release(placement);
            if future.free_milli(job.class).saturating_sub(held_back) < job.total_milli() {
                continue;
            }
            if let Some(at_shadow) = future.find(job) {
                let held = self.inv.hold(&at_shadow);
                self.reservations.insert(job.class, Reservation { job: job.id, shadow_ms: end, held });
                return;
            }
        }
    }

    /// Places a job on GPUs held by its class's reservation, if it ends before the reserved
    /// gang can start (EASY backfill).
    fn backfill(&mut self, job: &JobSpec) -> Option<Vec<ReplicaPlacement>> {
        let reservation = self.reservations.get(&job.class)?;
        if self.s.now_ms.saturating_add(job.max_runtime_ms) > reservation.shadow_ms {
            return None;
        }
        let held = reservation.held.clone();
        self.inv.release(&held);
        let found = if self.available(job) >= job.total_milli() { self.inv.find(job) } else { None };
        if let Some(placement) = &found {
            // The backfilled job takes part of the held GPUs until it ends; hold the rest.
            self.inv.allocate(placement);
            let rest = self.inv.hold(&held);
            self.inv.release(placement);
            if let Some(r) = self.reservations.get_mut(&job.class) {
                r.held = rest;
            }
        } else {
            self.inv.allocate(&held);
        }
        found
    }

    fn record_victim(&mut self, for_job: &JobSpec, index: usize, reason: PreemptReason) {
        let s = self.s;
        let r = &s.running[index];
        self.victims.insert(index);
        self.victim[index] = true;
        let grace_ms = s.priorities.get(usize::from(r.spec.priority)).map_or(0, |p| p.preemption_grace_ms);
        self.decisions.preemptions.push(Preemption {
            victim: r.spec.id,
            for_job: for_job.id,
            reason,
            grace_ms,
            lost_work: lost_work(s.now_ms, r),
        });
    }

    /// Finds the victims that lose the least work and make room for `job`, or `None`. On
    /// success the job's future GPUs and quota are held for it (see [`Self::wait_for`]).
    ///
    /// Who may be a victim: a preemptible job past the minimum runtime, of the same class,
    /// not already stopping, and
    /// - of the same team with a strictly lower priority (priority preemption), or
    /// - when `job` stays within its team's reserved quota: of a team borrowing at a level
    ///   `job`'s team does not share, while that team still borrows (reclaim), or
    /// - when `job` borrows (Fairway policy only): of a team whose fair-share score after
    ///   losing the victim is still at least `job`'s team's after admitting `job`, never
    ///   taking that team below its reserved quota (fair share).
    ///
    /// Candidates are walked once per pass in the cycle's victim order (least work lost,
    /// then largest, so the fewest victims); see the module docs for why none of the three
    /// can loop.
    fn try_preempt(
        &mut self,
        job: &JobSpec,
        within_reserved: bool,
        own_team_only: bool,
    ) -> Option<Vec<(usize, PreemptReason)>> {
        let s = self.s;
        let n = job.total_milli();
        let memo_key = (job.team, job.class, job.priority, within_reserved, own_team_only);
        if self.unpreemptable.get(&memo_key).is_some_and(|&m| m <= n) {
            return None;
        }
        let my_priority = self.priority(job);
        let my_chain: Vec<TeamId> = self.ledger.chain(job.team).collect();
        let my_score_after = fairshare::score_with(s, &self.ledger, job.team, fairshare::value_of(s, job.class, n));
        let my_live_after = fairshare::live_value(s, &self.ledger, job.team) + fairshare::value_of(s, job.class, n);
        // A fair-share attempt fails for a team scoring at least as high asking at least as much.
        let known_to_fail = !within_reserved
            && self
                .fair_share_failures
                .get(&job.class)
                .is_some_and(|f| f.iter().any(|&(v, m)| my_score_after >= v && n >= m));
        let cross_team = !own_team_only
            && (within_reserved || s.config.policy == Policy::Fairway)
            && !known_to_fail
            && self.other_borrower(job.class, &my_chain);
        let order = std::mem::take(self.victim_order.entry(job.class).or_default());
        let mut chosen: Vec<(usize, PreemptReason)> = Vec::new();
        let mut fits = false;
        // First without taking any team below its reserved quota; only if that cannot make
        // room may reclaim take a borrowing team's gang across its reserved line (a gang
        // cannot be split), since the reserved promise must hold.
        'passes: for straddle in [false, true] {
            if straddle && !(cross_team && within_reserved) {
                break;
            }
            for &index in &order {
                if self.victim[index] {
                    continue;
                }
                let r = &s.running[index];
                // Earlier victims are already out of the ledger, so every check sees what
                // is left.
                let reason = if r.spec.team == job.team {
                    (self.priority(&r.spec) < my_priority).then_some(PreemptReason::Priority)
                } else if !cross_team {
                    None
                } else if within_reserved {
                    let ok = self.reclaimable(job.class, &my_chain, r.spec.team)
                        && (straddle || self.ledger.borrowed(r.spec.team, job.class) >= r.spec.total_milli());
                    ok.then_some(PreemptReason::Reclaim)
                } else {
                    let lost = fairshare::value_of(s, job.class, r.spec.total_milli());
                    let their_live_after = fairshare::live_value(s, &self.ledger, r.spec.team) - lost;
                    let ok = self.ledger.borrowed(r.spec.team, job.class) >= r.spec.total_milli()
                        && my_live_after <= self.deserved(job.team)
                        && their_live_after >= self.deserved(r.spec.team)
                        && my_live_after <= their_live_after
                        && my_score_after <= self.score_without(r.spec.team, job.class, r.spec.total_milli());
                    ok.then_some(PreemptReason::FairShare)
                };
                let Some(reason) = reason else { continue };
                self.take_out(index, true);
                self.victim[index] = true;
                chosen.push((index, reason));
                if self.fits_now(job) {
                    fits = true;
                    break 'passes;
                }
            }
        }
        self.victim_order.insert(job.class, order);
        for &(index, _) in &chosen {
            self.victim[index] = false;
        }
        if !fits {
            for &(index, _) in &chosen {
                self.take_out(index, false);
            }
            self.unpreemptable.insert(memo_key, n);
            if cross_team && !within_reserved {
                self.fair_share_failures.entry(job.class).or_default().push((my_score_after, n));
            }
            return None;
        }
        // Drop victims that turned out unnecessary, most work lost first.
        let mut i = chosen.len();
        while i > 0 {
            i -= 1;
            let (index, _) = chosen[i];
            self.take_out(index, false);
            if self.fits_now(job) {
                chosen.retain(|&(x, _)| x != index);
            } else {
                self.take_out(index, true);
            }
        }
        // The cycle goes on as if the victims were gone and the job admitted, except that the
        // victims keep their GPUs until they exit: with the victims back, the part of the
        // job's future GPUs that is free now is held for it, and its quota counted, so nobody
        // ranked later can take them or the room its victims make.
        let future = self.inv.find(job);
        for &(index, _) in &chosen {
            self.inv.allocate(&s.running[index].placement);
        }
        if let Some(placement) = future {
            let held = self.inv.hold(&placement);
            self.claims.push((job.id, job.class, held));
        }
        self.claim_quota(job);
        Some(chosen)
    }
}

impl Cycle<'_> {
    /// Tentatively removes (or puts back) a running job's GPUs and quota use.
    fn take_out(&mut self, index: usize, out: bool) {
        let r = &self.s.running[index];
        if out {
            self.inv.release(&r.placement);
        } else {
            self.inv.allocate(&r.placement);
        }
        if (r.spec.team as usize) < self.s.teams.len() {
            self.ledger.add(r.spec.team, r.spec.class, r.spec.total_milli(), out);
        }
    }

    /// Whether the job passes its quota limit and fits in free capacity right now.
    fn fits_now(&mut self, job: &JobSpec) -> bool {
        let n = job.total_milli();
        self.ledger.over_limit(job.team, job.class, n).is_none()
            && (self.preemptible(job) || self.ledger.beyond_reserved(job.team, job.class, n).is_none())
            && self.available(job) >= n
            && self.inv.find(job).is_some()
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

/// GPU-milliseconds of work a running job loses if stopped now: since its last checkpoint.
pub fn lost_work(now_ms: i64, r: &super::snapshot::RunningJob) -> u64 {
    let since = r.last_checkpoint_ms.unwrap_or(r.started_ms).max(r.started_ms);
    let ms = (now_ms - since).max(0) as u64;
    ms.saturating_mul(r.spec.total_milli()) / 1000
}
