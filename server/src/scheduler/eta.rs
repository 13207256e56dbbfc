//! Expected starts: the cycle's waiting jobs played forward, as an interval.
//!
//! # The forecast
//!
//! Every running job gets an expected end from its runtime estimate ([`runtime`](super::runtime):
//! history of jobs like it, conditioned on how long it has already run, bounded by its
//! maximum runtime); victims of this cycle and jobs already stopping end when their grace
//! period does. Time then jumps from end to end. At each, the waiting jobs of the class that
//! freed GPUs are taken in this cycle's order, as the engine would rank them, and a job starts
//! when
//! - its team and every ancestor stay within reserved + burst, and a non-preemptible job
//!   within its team's reserved quota beside the team's other non-preemptible jobs: a job
//!   blocked by quota starts when its own team's jobs free that quota, which is as
//!   foreseeable as any end;
//! - the class has enough free GPUs (those held for waiting jobs count as free), and the GPUs
//!   held for the first blocked gang that may reserve at that instant
//!   ([`Snapshot::reserves`]: by expected service, only past the starvation bound), until the
//!   running jobs' maximum runtimes free enough for it, are used only by a job whose maximum
//!   runtime ends before then (EASY backfill), as in the engine; under FIFO the first job that does
//!   not fit blocks all behind it.
//!
//! A started job ends after its own estimated runtime. A waiting job may also preempt, as
//! planned at the start of the play: lower-priority preemptible jobs of its own team, and,
//! within its team's reserved quota, preemptible jobs of borrowing teams, become victims once
//! they have run the engine's minimum runtime, and their GPUs are free a grace period later;
//! if the job has not started by then, it starts then. Fair-share preemption is not played.
//!
//! The play runs three times, with every runtime at its p10, p50 and p90 estimate: the
//! earliest, expected and latest start as far as the running and waiting jobs go. Jobs that
//! arrive later are not foreseen, so a late arrival ranked ahead delays a start beyond that
//! interval, and the median is early. Once enough jobs have started, the interval and median
//! are instead the played median corrected by the errors past forecasts made
//! ([`forecast_errors`](super::forecast_errors)): see `fairway simulate --eta` for how each
//! fares against what really happened.
//!
//! Three waits cannot be foreseen and say so ([`Unforeseeable`]): a job larger than a quota
//! (it starts when the quota is raised), a job its hard budget cannot cover (when the budget
//! is raised or renewed) and a gang no cluster can hold (when GPUs are added).
//!
//! Topology and fragmentation are not played: the class is a pool of GPUs. The naive model
//! ([`naive`]), running jobs ending at their maximum runtime and no quotas, is kept to compare
//! against (`fairway simulate --eta`).

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque},
};

use super::{
    decision::{Decisions, PendingReason, Unforeseeable},
    preemption::Passed,
    quota::Ledger,
    snapshot::{ClassId, JobId, JobSpec, Policy, Snapshot, TeamId},
};

/// At each event, the most waiting jobs of a class looked at, in order, that do not start; a
/// job further back waits in the play for the ones ahead to start (so its estimate may be
/// late). Bounds a cycle's cost with tens of thousands of waiting jobs.
const SCAN_LIMIT: usize = 16;

/// No next item in a queue.
const END: usize = usize::MAX;

/// Kinds of events, in the order they apply at one instant: ends free GPUs first.
const ENDS: u8 = 0;
const RECLAIMS: u8 = 1;

/// Something holding GPUs in the play: a running job, a job admitted this cycle, or a job
/// started by the play.
#[derive(Debug, Clone)]
struct Holder {
    class: ClassId,
    milli: u64,
    team: TeamId,
    /// Counts against its team's quota (not a victim or a stopping job).
    quota: bool,
    /// Not preemptible: counts against its team's non-preemptible use too.
    firm: bool,
    /// When it ends in this play.
    end_ms: i64,
    /// When its maximum runtime ends: what the engine's reservations count on.
    max_end_ms: i64,
    /// Whether it still holds its GPUs.
    alive: bool,
}

/// A waiting job in the play.
///
/// What every scan reads of its spec is copied here: the play scans tens of thousands of
/// waiting jobs, and reading each from its spec was a cache miss apiece (a quarter of the
/// forecast with 50,000 waiting).
#[derive(Debug, Clone)]
struct Waiting<'a> {
    /// Index into `decisions.pending`.
    pending: usize,
    spec: &'a JobSpec,
    class: ClassId,
    team: TeamId,
    milli: u64,
    max_runtime_ms: i64,
    /// From when it may hold GPUs as a blocked gang ([`Snapshot::reserves_from`]).
    reserves_from: Option<i64>,
    preemptible: bool,
    /// Victims it reclaims and when, if it has not started by then.
    reclaim: Option<(i64, Vec<usize>)>,
}

/// Fills the expected starts (an interval) of the waiting jobs, or says why none can be
/// foreseen. `free` is, per class, the milli free after this cycle plus those held for
/// waiting jobs; `victims` the running jobs this cycle preempts.
pub fn forecast(s: &Snapshot, free: &[u64], victims: &BTreeSet<usize>, decisions: &mut Decisions) {
    let plays = 3;
    // A job's remaining runtime in each play.
    let runtimes = |job: &JobSpec, elapsed: i64| -> Vec<i64> { s.history.remaining(job, elapsed).to_vec() };
    // Hashed, not ordered: looked up once per waiting job, tens of thousands a cycle.
    let specs: HashMap<JobId, &JobSpec> = s.pending.iter().map(|j| (j.id, j)).collect();
    let grace = |j: &JobSpec| s.grace_ms(j);
    let preemptible = |j: &JobSpec| s.preemptible(j);
    let priority = |j: &JobSpec| s.priorities.get(usize::from(j.priority)).map_or(0, |p| p.priority);
    let mut ledger = Ledger::new(s);
    // The holders' ends in each play (holder × plays + play); the rest of a holder is the
    // same in every play, its `end_ms` the median end until a play sets its own.
    let mut holders: Vec<Holder> = Vec::new();
    let mut ends: Vec<i64> = Vec::new();
    let median = |v: &[i64]| {
        let mut v = v.to_vec();
        v.sort_unstable();
        v[v.len() / 2]
    };
    // Running jobs a within-reserved job may reclaim: (holder, running index).
    let mut reclaimable: Vec<(usize, usize)> = Vec::new();
    for (i, r) in s.running.iter().enumerate() {
        let leaving = r.terminating || victims.contains(&i);
        let end: Vec<i64> = if leaving {
            vec![s.now_ms + grace(&r.spec); plays]
        } else {
            runtimes(&r.spec, s.now_ms - r.started_ms).into_iter().map(|l| s.now_ms.saturating_add(l)).collect()
        };
        let quota = !leaving && (r.spec.team as usize) < s.teams.len();
        let firm = !preemptible(&r.spec);
        if quota {
            ledger.add_job(r.spec.team, r.spec.class, r.spec.total_milli(), firm, false);
            if !firm {
                reclaimable.push((holders.len(), i));
            }
        }
        holders.push(Holder {
            class: r.spec.class,
            milli: r.spec.total_milli(),
            team: r.spec.team,
            quota,
            firm,
            end_ms: median(end.as_slice()).max(s.now_ms),
            max_end_ms: r.started_ms.saturating_add(r.spec.max_runtime_ms).max(s.now_ms),
            alive: true,
        });
        ends.extend(end.into_iter().map(|e| e.max(s.now_ms)));
    }
    for a in &decisions.admissions {
        let Some(&job) = specs.get(&a.job) else { continue };
        let runtime = runtimes(job, 0);
        let quota = (job.team as usize) < s.teams.len();
        let firm = !preemptible(job);
        if quota {
            ledger.add_job(job.team, job.class, job.total_milli(), firm, false);
        }
        holders.push(Holder {
            class: job.class,
            milli: job.total_milli(),
            team: job.team,
            quota,
            firm,
            end_ms: s.now_ms.saturating_add(median(runtime.as_slice())),
            max_end_ms: s.now_ms.saturating_add(job.max_runtime_ms),
            alive: true,
        });
        ends.extend(runtime.into_iter().map(|r| s.now_ms.saturating_add(r)));
    }

    // The waiting jobs, in this cycle's order; those no forecast can place say why.
    let mut order: Vec<usize> = (0..decisions.pending.len()).collect();
    order.sort_by_key(|&i| decisions.pending[i].position);
    let mut waiting: Vec<Waiting> = Vec::new();
    // Each waiting job's runtime in each play (job × plays + play).
    let mut waiting_runtimes: Vec<i64> = Vec::new();
    for i in order {
        let p = &mut decisions.pending[i];
        let cause = match p.reason {
            PendingReason::NeverFits => Some(Unforeseeable::CapacityChange),
            PendingReason::DriverUnavailable => Some(Unforeseeable::DriverChange),
            PendingReason::ExceedsQuota { team } => Some(Unforeseeable::QuotaChange { team }),
            PendingReason::BudgetExhausted => Some(Unforeseeable::BudgetChange),
            _ => None,
        };
        if cause.is_some() {
            p.unforeseeable = cause;
            continue;
        }
        let Some(&spec) = specs.get(&p.job) else { continue };
        if usize::from(spec.class) >= s.classes.len() || (spec.team as usize) >= s.teams.len() {
            continue;
        }
        waiting.push(Waiting {
            pending: i,
            spec,
            class: spec.class,
            team: spec.team,
            milli: spec.total_milli(),
            max_runtime_ms: spec.max_runtime_ms,
            reserves_from: s.reserves_from(spec),
            preemptible: preemptible(spec),
            reclaim: None,
        });
        waiting_runtimes.extend(runtimes(spec, 0));
    }
    if waiting.is_empty() {
        return;
    }

    // Reclaim plans, made once at the start: a job within its team's reserved quota that
    // does not fit takes the cheapest victims in order of when they may be preempted.
    if s.config.policy != Policy::Fifo {
        let mut plans: Option<Plans> = None;
        let mut unclaimed_free: Vec<u64> = free.to_vec();
        for w in &mut waiting {
            let (job, n, c) = (w.spec, w.milli, usize::from(w.class));
            let have = unclaimed_free.get(c).copied().unwrap_or(0);
            if n <= have {
                continue;
            }
            let within = ledger.beyond_reserved(job.team, job.class, n).is_none();
            // Sorted once, when the first job needs a plan.
            let plans = plans.get_or_insert_with(|| Plans::new(s, &ledger, &holders, &reclaimable));
            // Within its preemption delay the job preempts no one before the delay ends.
            let delayed_until = s.preemption_delayed_until(job).unwrap_or(s.now_ms);
            let Some(chosen) = plans.take(s, &holders, job, n - have, within, priority) else { continue };
            let at = chosen
                .iter()
                .map(|&(gone, _, _, i)| gone.max(delayed_until.saturating_add(grace(&s.running[i].spec))))
                .max()
                .unwrap_or(s.now_ms);
            unclaimed_free[c] = 0;
            w.reclaim = Some((at, chosen.into_iter().map(|c| c.2).collect()));
        }
    }

    // Each waiting job's start in each play (job × plays + play).
    let mut starts: Vec<Option<i64>> = vec![None; waiting.len() * plays];
    for play in 0..plays {
        let mut holders = holders.clone();
        for (h, holder) in holders.iter_mut().enumerate() {
            holder.end_ms = ends[h * plays + play];
        }
        let runtimes = Runtimes { all: &waiting_runtimes, plays, play };
        let started = Play::new(s, free, ledger.clone(), holders, &waiting, runtimes).run();
        for (k, start) in started.into_iter().enumerate() {
            starts[k * plays + play] = start;
        }
    }
    let calibrator = s.forecast_errors.calibrator();
    for (k, w) in waiting.iter().enumerate() {
        // A play in which the job does not start sorts last.
        let mut v: Vec<Option<i64>> = starts[k * plays..(k + 1) * plays].to_vec();
        v.sort_unstable_by_key(|x| x.unwrap_or(i64::MAX));
        let Some(expected) = v[plays / 2] else { continue };
        let p = &mut decisions.pending[w.pending];
        p.played_start_ms = Some(expected);
        if let Some(waits) = calibrator.waits(w.spec.priority, expected - s.now_ms) {
            [p.earliest_start_ms, p.expected_start_ms, p.latest_start_ms] = waits.map(|w| Some(s.now_ms + w));
        } else {
            p.earliest_start_ms = v[0].or(Some(expected));
            p.expected_start_ms = Some(expected);
            p.latest_start_ms = v.iter().rev().flatten().next().copied().or(Some(expected));
        }
    }
}

/// A running job a reclaim plan may take: (when its GPUs are free, job id, holder, running
/// index), the order in which every plan takes them.
type Candidate = (i64, JobId, usize, usize);

/// Candidates in plan order; those taken by earlier plans are passed in one step.
struct Candidates {
    items: Vec<Candidate>,
    passed: Passed,
}

impl Candidates {
    fn new(items: Vec<Candidate>) -> Self {
        let passed = Passed::new(items.len());
        Candidates { items, passed }
    }
}

/// A plan's way through one list of candidates (none if the plan may take from no such
/// list), past those earlier plans took.
struct Walk<'c> {
    list: Option<&'c mut Candidates>,
    at: usize,
}

impl<'c> Walk<'c> {
    fn new(mut list: Option<&'c mut Candidates>) -> Self {
        let at = list.as_deref_mut().map_or(0, |l| l.passed.first_from(0));
        Walk { list, at }
    }

    /// The candidate the walk is at, if any is left.
    fn peek(&self) -> Option<Candidate> {
        self.list.as_deref().and_then(|l| l.items.get(self.at).copied())
    }

    /// Moves to the next candidate no earlier plan took.
    fn advance(&mut self) {
        if let Some(l) = self.list.as_deref_mut() {
            self.at = l.passed.first_from(self.at + 1);
        }
    }
}

/// No place in a list of candidates.
const NOWHERE: usize = usize::MAX;

/// The reclaim plans' candidates and what is left of them.
///
/// A plan walks its candidates in order until it frees enough: those of borrowing teams of
/// its class, if it is within its team's reserved quota, and lower-priority ones of its own
/// team. Each list is sorted once and holds only those a plan may take, so a plan passes over
/// no running job it could never take (a walk over the whole class for every plan was most of
/// a cycle once thousands of jobs run), and it passes those already taken in one step.
/// Merging a plan's two lists takes the same candidates in the same order as walking the
/// whole class sorted.
struct Plans {
    /// Per class, the candidates of borrowing teams.
    borrowers: BTreeMap<ClassId, Candidates>,
    /// Per class and team, the team's candidates.
    teams: BTreeMap<(ClassId, TeamId), Candidates>,
    /// Per class, the milli of borrowers' candidates no plan took yet.
    borrowers_left: BTreeMap<ClassId, u64>,
    /// Per class and team, the milli of the team's candidates no plan took yet.
    teams_left: BTreeMap<(ClassId, TeamId), u64>,
    /// By holder: its place in its team's list and in its class's borrowers' list
    /// ([`NOWHERE`] if it is in none: not a candidate, or its team does not borrow).
    places: Vec<(usize, usize)>,
}

impl Plans {
    /// `reclaimable`: (holder, running index) of the preemptible running jobs counted in
    /// their teams' quota.
    fn new(s: &Snapshot, ledger: &Ledger, holders: &[Holder], reclaimable: &[(usize, usize)]) -> Self {
        let mut all: Vec<Candidate> = Vec::new();
        for &(h, i) in reclaimable {
            let r = &s.running[i];
            let eligible = (r.started_ms + s.config.min_runtime_before_preemption_ms).max(s.now_ms);
            let gone = eligible.saturating_add(s.grace_ms(&r.spec));
            // A job expected to end before a plan could free it is no candidate.
            if gone < holders[h].end_ms {
                all.push((gone, r.spec.id, h, i));
            }
        }
        all.sort_unstable();
        let mut borrowers: BTreeMap<ClassId, Vec<Candidate>> = BTreeMap::new();
        let mut teams: BTreeMap<(ClassId, TeamId), Vec<Candidate>> = BTreeMap::new();
        let mut borrowers_left: BTreeMap<ClassId, u64> = BTreeMap::new();
        let mut teams_left: BTreeMap<(ClassId, TeamId), u64> = BTreeMap::new();
        let mut places = vec![(NOWHERE, NOWHERE); holders.len()];
        for c in all {
            let (class, team, milli) = (holders[c.2].class, holders[c.2].team, holders[c.2].milli);
            let list = teams.entry((class, team)).or_default();
            places[c.2].0 = list.len();
            list.push(c);
            *teams_left.entry((class, team)).or_default() += milli;
            // The ledger does not change while plans are made, so neither does who borrows.
            if ledger.borrowed(team, class) > 0 {
                let list = borrowers.entry(class).or_default();
                places[c.2].1 = list.len();
                list.push(c);
                *borrowers_left.entry(class).or_default() += milli;
            }
        }
        Plans {
            borrowers: borrowers.into_iter().map(|(k, v)| (k, Candidates::new(v))).collect(),
            teams: teams.into_iter().map(|(k, v)| (k, Candidates::new(v))).collect(),
            borrowers_left,
            teams_left,
            places,
        }
    }

    /// The victims that free at least
    /// `need` for `job`, no longer candidates for later plans; none if its candidates cannot
    /// free that much. `within`: the job is within its team's reserved quota.
    fn take(
        &mut self,
        s: &Snapshot,
        holders: &[Holder],
        job: &JobSpec,
        need: u64,
        within: bool,
        priority: impl Fn(&JobSpec) -> i32,
    ) -> Option<Vec<Candidate>> {
        let (class, team) = (job.class, job.team);
        // Without a walk: what the job could take at most. A team that borrows is in both
        // sums; its own work counts once.
        let own_left = self.teams_left.get(&(class, team)).copied().unwrap_or(0);
        let mut most = own_left;
        if within {
            let borrowers = self.borrowers_left.get(&class).copied().unwrap_or(0);
            let own_borrows = (self.teams.get(&(class, team)).and_then(|l| l.items.first()))
                .is_some_and(|c| self.places[c.2].1 != NOWHERE);
            most += if own_borrows { borrowers - own_left } else { borrowers };
        }
        if most < need {
            return None;
        }
        let mut own = Walk::new(self.teams.get_mut(&(class, team)));
        let mut others = Walk::new(if within { self.borrowers.get_mut(&class) } else { None });
        let mut freed = 0;
        let mut chosen = Vec::new();
        while freed < need {
            // Of its own team, only lower-priority work; of the borrowers, only other teams'.
            while own.peek().is_some_and(|c| priority(&s.running[c.3].spec) >= priority(job)) {
                own.advance();
            }
            while others.peek().is_some_and(|c| holders[c.2].team == team) {
                others.advance();
            }
            let next = match (own.peek(), others.peek()) {
                (Some(x), y) if y.is_none_or(|y| x <= y) => {
                    own.advance();
                    x
                }
                (_, Some(y)) => {
                    others.advance();
                    y
                }
                _ => break,
            };
            freed += holders[next.2].milli;
            chosen.push(next);
        }
        if freed < need {
            return None;
        }
        for &(_, _, h, _) in &chosen {
            let (holder_team, milli) = (holders[h].team, holders[h].milli);
            let (team_place, borrower_place) = self.places[h];
            if let Some(list) = self.teams.get_mut(&(class, holder_team)) {
                list.passed.leave(team_place);
            }
            if let Some(left) = self.teams_left.get_mut(&(class, holder_team)) {
                *left -= milli;
            }
            if borrower_place != NOWHERE {
                if let Some(list) = self.borrowers.get_mut(&class) {
                    list.passed.leave(borrower_place);
                }
                if let Some(left) = self.borrowers_left.get_mut(&class) {
                    *left -= milli;
                }
            }
        }
        Some(chosen)
    }
}

/// The waiting jobs' runtimes in the play under way.
#[derive(Debug, Clone, Copy)]
struct Runtimes<'w> {
    /// Job × plays + play.
    all: &'w [i64],
    plays: usize,
    play: usize,
}

/// One play of the forecast at one runtime quantile.
struct Play<'s, 'w> {
    s: &'s Snapshot,
    runtimes: Runtimes<'w>,
    free: Vec<u64>,
    ledger: Ledger,
    holders: Vec<Holder>,
    waiting: &'w [Waiting<'s>],
    /// (time, kind, holder or waiting index).
    events: BinaryHeap<Reverse<(i64, u8, usize)>>,
    /// Per queue (a class, or one for FIFO): waiting indices in order, linked.
    queues: Vec<Queue>,
    start: Vec<Option<i64>>,
    left: usize,
    /// Per class, the reservation of the scan under way: (waiting index, shadow time).
    reservations: Vec<Option<(usize, i64)>>,
    /// Per class, the last reservation's shadow time, kept across scans.
    shadows: Vec<Option<(usize, i64)>>,
}

/// A linked list over waiting jobs in cycle order, with the smallest demand from each
/// item on (a lower bound once items leave) so a scan stops when nothing behind can fit.
struct Queue {
    items: Vec<usize>,
    next: Vec<usize>,
    head: usize,
    min_need: Vec<u64>,
}

impl Queue {
    fn new(items: Vec<usize>, waiting: &[Waiting]) -> Self {
        let n = items.len();
        let mut min_need = vec![u64::MAX; n];
        let mut m = u64::MAX;
        for k in (0..n).rev() {
            m = m.min(waiting[items[k]].milli);
            min_need[k] = m;
        }
        let next = (1..=n).map(|k| if k == n { END } else { k }).collect();
        Queue { items, next, head: if n == 0 { END } else { 0 }, min_need }
    }

    /// Removes item `i`, which follows `prev` (or is the head when `prev` is [`END`]).
    fn unlink(&mut self, prev: usize, i: usize) {
        if prev == END {
            self.head = self.next[i];
        } else {
            self.next[prev] = self.next[i];
        }
    }
}

impl<'s, 'w> Play<'s, 'w> {
    fn new(
        s: &'s Snapshot,
        free: &[u64],
        ledger: Ledger,
        holders: Vec<Holder>,
        waiting: &'w [Waiting<'s>],
        runtimes: Runtimes<'w>,
    ) -> Self {
        let classes = s.classes.len();
        let fifo = s.config.policy == Policy::Fifo;
        let mut events = BinaryHeap::with_capacity(holders.len() + waiting.len());
        for (h, holder) in holders.iter().enumerate() {
            events.push(Reverse((holder.end_ms, ENDS, h)));
        }
        let mut items: Vec<Vec<usize>> = vec![Vec::new(); if fifo { 1 } else { classes }];
        for (k, w) in waiting.iter().enumerate() {
            items[if fifo { 0 } else { usize::from(w.class) }].push(k);
            if let Some((at, _)) = &w.reclaim {
                events.push(Reverse((*at, RECLAIMS, k)));
            }
        }
        let queues = items.into_iter().map(|i| Queue::new(i, waiting)).collect();
        let mut f = free.to_vec();
        f.resize(classes, 0);
        Play {
            s,
            runtimes,
            free: f,
            ledger,
            holders,
            waiting,
            events,
            queues,
            start: vec![None; waiting.len()],
            left: waiting.len(),
            reservations: vec![None; classes],
            shadows: vec![None; classes],
        }
    }

    fn run(mut self) -> Vec<Option<i64>> {
        let fifo = self.s.config.policy == Policy::Fifo;
        let mut dirty: BTreeSet<usize> = BTreeSet::new();
        while let Some(Reverse((t, kind, k))) = self.events.pop() {
            let class = if kind == ENDS { self.end(k, t) } else { self.reclaim(k, t) };
            if let Some(class) = class.filter(|&c| usize::from(c) < self.free.len()) {
                dirty.insert(if fifo { 0 } else { usize::from(class) });
            }
            if self.events.peek().is_some_and(|Reverse(e)| e.0 == t) {
                continue;
            }
            while let Some(queue) = dirty.pop_first() {
                self.scan(queue, t);
            }
            if self.left == 0 {
                break;
            }
        }
        self.start
    }

    /// A holder's GPUs and quota come back at `t`; the class, if it was still holding.
    fn end(&mut self, h: usize, t: i64) -> Option<ClassId> {
        let holder = &mut self.holders[h];
        if !holder.alive || holder.end_ms != t {
            return None;
        }
        holder.alive = false;
        let (class, milli, team, quota, firm) = (holder.class, holder.milli, holder.team, holder.quota, holder.firm);
        if let Some(f) = self.free.get_mut(usize::from(class)) {
            *f += milli;
        }
        if quota {
            self.ledger.add_job(team, class, milli, firm, true);
        }
        Some(class)
    }

    /// The time a waiting job's victims are gone: if it has not started, they end now and it
    /// starts on their GPUs.
    fn reclaim(&mut self, k: usize, t: i64) -> Option<ClassId> {
        if self.start[k].is_some() {
            return None;
        }
        let waiting = self.waiting;
        let w = &waiting[k];
        let victims = w.reclaim.as_ref().map(|r| r.1.clone()).unwrap_or_default();
        for h in victims {
            if self.holders[h].alive {
                self.holders[h].end_ms = t;
                self.end(h, t);
            }
        }
        let (c, n) = (usize::from(w.class), w.milli);
        // It stays linked in its queue until a scan passes it: unlinking here was a walk of
        // the queue for every reclaim, a quarter of the forecast with 35,000 plans at 10x.
        if self.free[c] >= n && self.ledger.over_limit(w.team, w.class, n).is_none() {
            self.begin(k, t);
        }
        Some(w.class)
    }

    /// Starts waiting job `k` at `t`.
    fn begin(&mut self, k: usize, t: i64) {
        let waiting = self.waiting;
        let w = &waiting[k];
        let (class, n) = (w.class, w.milli);
        self.free[usize::from(class)] -= n;
        self.ledger.add_job(w.team, class, n, !w.preemptible, false);
        let h = self.holders.len();
        let r = self.runtimes;
        let end = t.saturating_add(r.all[k * r.plays + r.play]);
        let max_end = t.saturating_add(w.max_runtime_ms);
        self.holders.push(Holder {
            class,
            milli: n,
            team: w.team,
            quota: true,
            firm: !w.preemptible,
            end_ms: end,
            max_end_ms: max_end,
            alive: true,
        });
        self.events.push(Reverse((end, ENDS, h)));
        self.start[k] = Some(t);
        self.left -= 1;
        if self.reservations[usize::from(class)].is_some_and(|r| r.0 == k) {
            self.reservations[usize::from(class)] = None;
        }
    }

    /// When the engine would expect a gang of `need` to fit in `class`: the running jobs'
    /// maximum runtimes freeing GPUs in order.
    fn shadow(&self, class: usize, need: u64, t: i64) -> i64 {
        let mut freed = self.free[class];
        if freed >= need {
            return t;
        }
        // Computed only when a gang first takes a class's reservation: a walk over the
        // holders is cheaper than keeping them sorted through every end of the play.
        let mut alive: Vec<(i64, u64)> = self
            .holders
            .iter()
            .filter(|h| h.alive && usize::from(h.class) == class)
            .map(|h| (h.max_end_ms, h.milli))
            .collect();
        alive.sort_unstable();
        for (max_end, milli) in alive {
            freed += milli;
            if freed >= need {
                return max_end.max(t);
            }
        }
        t
    }

    /// Starts what can start at `t` in one queue, in order (see the module docs).
    fn scan(&mut self, queue: usize, t: i64) {
        let s = self.s;
        let fifo = s.config.policy == Policy::Fifo;
        // Teams found over quota at this instant: (team, preemptible) → smallest demand.
        let mut over: BTreeMap<(TeamId, bool), u64> = BTreeMap::new();
        // The engine gives the first blocked gang in its order a reservation, afresh each
        // cycle; its shadow time is kept while the same gang holds it (ends only move it
        // earlier, so the kept one is the engine's or later).
        if !fifo {
            self.reservations[queue] = None;
        }
        let waiting = self.waiting;
        let (mut prev, mut i) = (END, self.queues[queue].head);
        let mut missed = 0;
        while i != END && missed < SCAN_LIMIT {
            let k = self.queues[queue].items[i];
            let next = self.queues[queue].next[i];
            if self.start[k].is_some() {
                // Started by its reclaim: unlinked as the scan passes, as if it had been then.
                self.queues[queue].unlink(prev, i);
                i = next;
                continue;
            }
            missed += 1;
            let w = &waiting[k];
            let (c, n) = (usize::from(w.class), w.milli);
            if !fifo && self.free[c] < self.queues[queue].min_need[i] {
                break;
            }
            let key = (w.team, w.preemptible);
            // Too large for what is free, or its team found over quota for as much: it cannot
            // start now (under FIFO, a job too large blocks the rest).
            let may_reserve = w.reserves_from.is_some_and(|from| t >= from);
            let could_reserve = self.reservations[c].is_none() && may_reserve;
            if (!fifo && n > self.free[c] && !could_reserve) || over.get(&key).is_some_and(|&m| n >= m) {
                prev = i;
                i = next;
                continue;
            }
            let quota_ok = fifo
                || (self.ledger.over_limit(w.team, w.class, n).is_none()
                    && (w.preemptible || self.ledger.firm_beyond_reserved(w.team, w.class, n).is_none()));
            if !quota_ok {
                let m = over.entry(key).or_insert(n);
                *m = (*m).min(n);
                prev = i;
                i = next;
                continue;
            }
            let fits = match self.reservations[c] {
                Some((holder, _)) if holder == k => n <= self.free[c],
                Some((holder, shadow)) => {
                    let held = self.waiting[holder].milli.min(self.free[c]);
                    n <= self.free[c] - held || (n <= self.free[c] && t.saturating_add(w.max_runtime_ms) <= shadow)
                }
                None => n <= self.free[c],
            };
            if fits {
                missed -= 1;
                self.begin(k, t);
                self.queues[queue].unlink(prev, i);
                i = next;
                continue;
            }
            if fifo {
                break;
            }
            if self.reservations[c].is_none() && may_reserve {
                let shadow = match self.shadows[c] {
                    Some((holder, shadow)) if holder == k && shadow >= t => shadow,
                    _ => self.shadow(c, n, t),
                };
                self.shadows[c] = Some((k, shadow));
                self.reservations[c] = Some((k, shadow));
            }
            prev = i;
            i = next;
        }
    }
}

/// The naive model: the queue played forward on the running jobs' maximum runtimes.
///
/// GPUs of a class are given back when jobs reach their maximum runtime (victims when their
/// grace period ends), and the waiting jobs of that class start in the order of this cycle,
/// each as soon as the class has enough free GPUs for it. A job that does not fit blocks
/// those behind it, as a reservation would. Topology and quotas are not replayed; jobs
/// blocked by quota, budget or size get none. `free` is as for [`forecast`].
pub fn naive(s: &Snapshot, free: &[u64], victims: &BTreeSet<usize>, decisions: &mut Decisions) {
    let classes = s.classes.len();
    let mut free: Vec<u64> = (0..classes).map(|c| free.get(c).copied().unwrap_or(0)).collect();
    let mut events: BinaryHeap<Reverse<(i64, ClassId, u64)>> = BinaryHeap::new();
    for (i, r) in s.running.iter().enumerate() {
        let end = if r.terminating || victims.contains(&i) {
            s.now_ms + s.grace_ms(&r.spec)
        } else {
            r.started_ms.saturating_add(r.spec.max_runtime_ms)
        };
        events.push(Reverse((end.max(s.now_ms), r.spec.class, r.spec.total_milli())));
    }
    let specs: BTreeMap<JobId, (ClassId, u64, i64)> =
        s.pending.iter().map(|j| (j.id, (j.class, j.total_milli(), j.max_runtime_ms))).collect();
    for a in &decisions.admissions {
        if let Some(&(class, milli, runtime)) = specs.get(&a.job) {
            events.push(Reverse((s.now_ms.saturating_add(runtime), class, milli)));
        }
    }
    // Per class, the waiting jobs in this cycle's order: (index into pending, milli, runtime).
    let mut queues: Vec<VecDeque<(usize, u64, i64)>> = vec![VecDeque::new(); classes];
    let mut order: Vec<usize> = (0..decisions.pending.len()).collect();
    order.sort_by_key(|&i| decisions.pending[i].position);
    for i in order {
        let p = &decisions.pending[i];
        let waits_for_capacity = matches!(
            p.reason,
            PendingReason::InsufficientCapacity
                | PendingReason::FairShareBehind { .. }
                | PendingReason::WaitingForReclaim
                | PendingReason::ReservedFor { .. }
                | PendingReason::NoTopologyFit { .. }
                | PendingReason::NoDriverFit
                | PendingReason::NoHostFit { .. }
                | PendingReason::PreemptionDelayed { .. }
                | PendingReason::BehindHeadOfLine { .. }
                | PendingReason::VictimsInMinimumRuntime { .. }
        );
        if let (true, Some(&(class, milli, runtime))) = (waits_for_capacity, specs.get(&p.job)) {
            if let Some(q) = queues.get_mut(usize::from(class)) {
                q.push_back((i, milli, runtime));
            }
        }
    }
    while let Some(Reverse((t, class, milli))) = events.pop() {
        let c = usize::from(class);
        if c >= classes {
            continue;
        }
        free[c] += milli;
        while let Some(&(i, need, runtime)) = queues[c].front() {
            if need > free[c] {
                break;
            }
            free[c] -= need;
            let p = &mut decisions.pending[i];
            p.expected_start_ms = Some(t);
            p.earliest_start_ms = Some(t);
            p.latest_start_ms = Some(t);
            events.push(Reverse((t.saturating_add(runtime), class, need)));
            queues[c].pop_front();
        }
        if queues.iter().all(VecDeque::is_empty) {
            break;
        }
    }
}
