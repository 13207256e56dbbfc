//! Preemption: which running jobs make room for a job that does not fit, and why.
//!
//! The rules (priority, reclaim, fair share) and why none of them can loop are in the
//! [module docs](super). This module finds the victims for one job: it takes candidates out
//! of the inventory and ledger tentatively, in the cycle's victim order, until the job fits,
//! then puts back those that turned out unnecessary and holds what the job will get.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    decision::{PendingReason, PreemptReason, Preemption},
    engine::Cycle,
    fairshare,
    quota::Ledger,
    snapshot::{ClassId, JobId, JobSpec, Policy, RunningJob, Snapshot, TeamId},
};

/// GPU-milliseconds of work a running job loses if stopped now: since its last checkpoint.
pub fn lost_work(now_ms: i64, r: &RunningJob) -> u64 {
    let since = r.last_checkpoint_ms.unwrap_or(r.started_ms).max(r.started_ms);
    let ms = (now_ms - since).max(0) as u64;
    ms.saturating_mul(r.spec.total_milli()) / 1000
}

/// Per class, the running jobs that may ever be victims in a cycle (preemptible, past the
/// minimum runtime, not stopping), least work lost first, then largest, then by job id; and
/// per class those still within the minimum runtime, soonest preemptible first (ties by job
/// id), which only explain a wait (`victims_in_minimum_runtime`). Sorted once per cycle, so
/// that every attempt walks the cheapest victims first without sorting.
pub(super) fn candidates(s: &Snapshot) -> (BTreeMap<ClassId, Vec<usize>>, BTreeMap<ClassId, Vec<usize>>) {
    let mut past: Vec<(ClassId, u64, u64, JobId, usize)> = Vec::new();
    let mut young: Vec<(ClassId, i64, JobId, usize)> = Vec::new();
    for (i, r) in s.running.iter().enumerate() {
        if r.terminating || !s.preemptible(&r.spec) {
            continue;
        }
        if s.now_ms - r.started_ms >= s.config.min_runtime_before_preemption_ms {
            past.push((r.spec.class, lost_work(s.now_ms, r), u64::MAX - r.spec.total_milli(), r.spec.id, i));
        } else {
            young.push((r.spec.class, r.started_ms, r.spec.id, i));
        }
    }
    past.sort_unstable();
    young.sort_unstable();
    let mut victim_order: BTreeMap<ClassId, Vec<usize>> = BTreeMap::new();
    for (class, _, _, _, i) in past {
        victim_order.entry(class).or_default().push(i);
    }
    let mut young_order: BTreeMap<ClassId, Vec<usize>> = BTreeMap::new();
    for (class, _, _, i) in young {
        young_order.entry(class).or_default().push(i);
    }
    (victim_order, young_order)
}

/// `order` (per class, as [`candidates`] gives it) split by the running jobs' teams, each
/// team's list in the class's order.
pub(super) fn by_team(s: &Snapshot, order: &BTreeMap<ClassId, Vec<usize>>) -> BTreeMap<(ClassId, TeamId), Vec<usize>> {
    let mut split: BTreeMap<(ClassId, TeamId), Vec<usize>> = BTreeMap::new();
    for (&class, indices) in order {
        for &i in indices {
            split.entry((class, s.running[i].spec.team)).or_default().push(i);
        }
    }
    split
}

/// The places in a class's victim order that victims chosen earlier in the cycle have left,
/// skipped in one step. Victims are taken cheapest first, so after thousands of them every
/// walk of the class began by passing them one by one (at 10×, 33,000 victims a cycle).
pub(super) struct Passed {
    /// Per place, a later (or the same) place to look at next; a place is its own while its
    /// job is no victim. The last entry stands past the end.
    next: Vec<u32>,
}

impl Passed {
    /// No place left yet in an order of `len` candidates.
    pub(super) fn new(len: usize) -> Self {
        Passed { next: (0..=len as u32).collect() }
    }

    /// The first place at or after `at` whose job is not a victim chosen earlier (the
    /// order's length when none is), shortening the way for the next look.
    pub(super) fn first_from(&mut self, at: usize) -> usize {
        let mut p = at.min(self.next.len() - 1);
        loop {
            let n = self.next[p] as usize;
            if n == p {
                return p;
            }
            let after = self.next[n];
            self.next[p] = after;
            p = after as usize;
        }
    }

    /// The job at place `at` became a victim: walks pass it from now on.
    pub(super) fn leave(&mut self, at: usize) {
        if at + 1 < self.next.len() {
            self.next[at] = at as u32 + 1;
        }
    }
}

/// What preemption can free at most for a job, kept per team and class as the cycle goes,
/// so that an attempt that must fall short by amount fails without a walk. A walk that
/// fails passes every candidate of the class twice; at 10× (500,000 pending) thousands of
/// attempts a cycle failed that way, nearly all of them short by amount.
///
/// Why the bound holds: a job's available GPUs grow by at most what its victims free (the
/// capacity held back for other teams' idle reserved quota only grows as usage falls). Its
/// own team gives at most its candidates. Another team gives nothing unless it borrows the
/// class when the walk starts (reclaim and fair share both take only from borrowers, and a
/// walk only lowers what a team borrows), and then at most what it borrows plus one job:
/// a victim that keeps within what its team borrows lowers that by its size, and a victim
/// larger than that (reclaim's second pass, which may cross a reserved line) leaves the team
/// borrowing nothing, so no further job of it may follow.
pub(super) struct Reach {
    teams: usize,
    classes: usize,
    /// Milli of each team's candidates not chosen as victims so far (team × classes + class).
    candidates: Vec<u64>,
    /// Each team's largest candidate, as at the start of the cycle (a bound stays a bound).
    largest: Vec<u64>,
    /// What each team's jobs can free for another team's job: nothing unless it borrows.
    for_others: Vec<u64>,
    /// Per class, `for_others` summed over every team.
    total: Vec<u64>,
}

impl Reach {
    /// The bound at the start of a cycle, from the candidates in victim order per class.
    pub(super) fn new(s: &Snapshot, order: &BTreeMap<ClassId, Vec<usize>>, ledger: &Ledger) -> Self {
        let (teams, classes) = (s.teams.len(), s.classes.len());
        let mut reach = Reach {
            teams,
            classes,
            candidates: vec![0; teams * classes],
            largest: vec![0; teams * classes],
            for_others: vec![0; teams * classes],
            total: vec![0; classes],
        };
        for (&class, indices) in order {
            for &i in indices {
                let r = &s.running[i];
                if let Some(k) = reach.slot(r.spec.team, class) {
                    reach.candidates[k] += r.spec.total_milli();
                    reach.largest[k] = reach.largest[k].max(r.spec.total_milli());
                }
            }
        }
        for team in 0..teams as TeamId {
            for class in 0..classes as ClassId {
                reach.refresh(ledger, team, class);
            }
        }
        reach
    }

    fn slot(&self, team: TeamId, class: ClassId) -> Option<usize> {
        ((team as usize) < self.teams && usize::from(class) < self.classes)
            .then(|| team as usize * self.classes + usize::from(class))
    }

    /// Brings the team's part of the class's total up to date after what it borrows changed.
    pub(super) fn refresh(&mut self, ledger: &Ledger, team: TeamId, class: ClassId) {
        let Some(k) = self.slot(team, class) else { return };
        let borrowed = ledger.borrowed(team, class);
        let now = if borrowed == 0 { 0 } else { self.candidates[k].min(borrowed.saturating_add(self.largest[k])) };
        let c = usize::from(class);
        self.total[c] = self.total[c] - self.for_others[k] + now;
        self.for_others[k] = now;
    }

    /// A candidate of the team was chosen as a victim: it can free nothing more.
    pub(super) fn chosen(&mut self, ledger: &Ledger, team: TeamId, class: ClassId, milli: u64) {
        let Some(k) = self.slot(team, class) else { return };
        self.candidates[k] = self.candidates[k].saturating_sub(milli);
        self.refresh(ledger, team, class);
    }

    /// The most victims can free for a job of `team` and `class`: its own team's
    /// candidates, and, when `other_teams` may be victims, what every other team's can.
    pub(super) fn most(&self, team: TeamId, class: ClassId, other_teams: bool) -> u64 {
        let Some(k) = self.slot(team, class) else { return 0 };
        let others = if other_teams { self.total[usize::from(class)] - self.for_others[k] } else { 0 };
        self.candidates[k] + others
    }
}

/// The burst demand at the start of a cycle: the borrowed value (money per hour) in use over
/// top-level teams, and the total fair-share weight of the teams that want burst (borrowing
/// now, or with a pending job beyond their reserved quota). Fair-share preemption splits the
/// first by the second to know what each team deserves (see [`Cycle::deserved`]).
pub(super) fn burst_demand(s: &Snapshot, ledger: &Ledger) -> (f64, f64) {
    let mut wants_burst: BTreeSet<TeamId> = BTreeSet::new();
    let mut burst_value = 0.0;
    for t in 0..s.teams.len() as TeamId {
        let live = fairshare::live_value(s, ledger, t);
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
    (burst_value, burst_weight)
}

/// A job asking for victims, with what every candidate is checked against: computed once
/// per attempt, before any candidate is taken out, so that each check compares the
/// candidate's team as it is left with the preemptor as it will be.
struct Preemptor<'j> {
    job: &'j JobSpec,
    /// The job's milli-units: what the victims must free.
    n: u64,
    /// Whether the job stays within its team's reserved quota (reclaim rather than fair share).
    within_reserved: bool,
    priority: i32,
    /// The job's team and its ancestors: levels a reclaim victim's team must not share.
    chain: Vec<TeamId>,
    /// The team's fair-share score after admitting the job.
    score_after: f64,
    /// The team's live borrowed value after admitting the job.
    live_after: f64,
    /// Whether victims may come from other teams at all (reclaim or fair share); if not,
    /// only the team's own lower-priority jobs may be.
    cross_team: bool,
    /// Whether the job has had less GPU time than the least-attained-service threshold, so
    /// that its team's jobs of its priority past it may be victims too.
    below_threshold: bool,
}

impl Cycle<'_> {
    /// Finds the victims that lose the least work and make room for `job`, or `None`. On
    /// success the job's future GPUs and quota are held for it (see [`Self::wait_for`]).
    ///
    /// Who may be a victim: a preemptible job past the minimum runtime, of the same class,
    /// not already stopping, and
    /// - of the same team with a strictly lower priority (priority preemption), or an
    ///   elastic gang's extra of the same team and no higher priority (`OwnTeam`), or of the
    ///   same team and priority past the least-attained-service threshold while `job` is
    ///   below it (`LeastService`), or
    /// - when `job` stays within its team's reserved quota: of a team borrowing at a level
    ///   `job`'s team does not share, while that team still borrows (reclaim), or
    /// - when `job` borrows (Fairway policy only): of a team whose fair-share score after
    ///   losing the victim is still at least `job`'s team's after admitting `job`, never
    ///   taking that team below its reserved quota (fair share).
    ///
    /// Candidates are walked once per pass in the cycle's victim order (least work lost,
    /// then largest, so the fewest victims); see the module docs for why none of the rules
    /// can loop.
    pub(super) fn try_preempt(
        &mut self,
        job: &JobSpec,
        within_reserved: bool,
        own_team_only: bool,
    ) -> Option<Vec<(usize, PreemptReason)>> {
        let below_threshold = self.s.below_service_threshold(job);
        let memo_key = (job.team, job.class, job.priority, within_reserved, own_team_only, below_threshold);
        if self.unpreemptable.get(&memo_key).is_some_and(|&m| m <= job.total_milli()) {
            return None;
        }
        let preemptor = self.preemptor(job, within_reserved, own_team_only);
        // Taken out of the cycle while it is walked, and put back unchanged. When no other
        // team's job may be a victim, the team's own list holds every candidate the walk can
        // take, in the same order: at 10,000 teams, passing over everyone else's was most of
        // a cycle.
        // A fair-share attempt whose team would end above its deserved burst may take no
        // other team's job either (`fair_share_allows`' second test fails for every one).
        let other_teams =
            preemptor.cross_team && (preemptor.within_reserved || preemptor.live_after <= self.deserved(job.team));
        // Short by amount whatever the walk takes (see `Reach`): fail as a walk would,
        // without one. The exhaustive cycle walks, so that it holds this bound to the walks.
        if !self.exhaustive
            && self.available(job).saturating_add(self.reach.most(job.team, job.class, other_teams)) < preemptor.n
        {
            self.give_up(&preemptor, &[], memo_key);
            return None;
        }
        let (mut chosen, fits) = if other_teams || self.exhaustive {
            let order = std::mem::take(self.victim_order.entry(job.class).or_default());
            let mut passed = if self.exhaustive { None } else { self.passed.remove(&job.class) };
            let found = self.choose_victims(&preemptor, &order, passed.as_mut());
            self.victim_order.insert(job.class, order);
            if let Some(passed) = passed {
                self.passed.insert(job.class, passed);
            }
            found
        } else {
            let key = (job.class, job.team);
            let order = self.team_victim_order.remove(&key).unwrap_or_default();
            let found = self.choose_victims(&preemptor, &order, None);
            if !order.is_empty() {
                self.team_victim_order.insert(key, order);
            }
            found
        };
        for &(index, _) in &chosen {
            self.victim[index] = false;
        }
        if !fits {
            self.give_up(&preemptor, &chosen, memo_key);
            return None;
        }
        self.drop_unneeded_victims(job, &mut chosen);
        self.hold_for_preemptor(job, &chosen);
        Some(chosen)
    }

    /// What every victim check of this attempt compares against, and whether other teams'
    /// jobs may be victims at all: only when the policy allows it, no equal or smaller
    /// attempt by a team scoring as high already failed this cycle, and some team outside
    /// the job's chain borrows the class (else there is nothing to reclaim or share).
    fn preemptor<'j>(&mut self, job: &'j JobSpec, within_reserved: bool, own_team_only: bool) -> Preemptor<'j> {
        let s = self.s;
        let n = job.total_milli();
        let priority = self.priority(job);
        let chain: Vec<TeamId> = self.ledger.chain(job.team).collect();
        let score_after = fairshare::score_with(s, &self.ledger, job.team, fairshare::value_of(s, job.class, n));
        let live_after = fairshare::live_value(s, &self.ledger, job.team) + fairshare::value_of(s, job.class, n);
        // A fair-share attempt fails for a team scoring at least as high asking at least as much.
        let known_to_fail = !within_reserved
            && self
                .fair_share_failures
                .get(&job.class)
                .is_some_and(|f| f.iter().any(|&(v, m)| score_after >= v && n >= m));
        let cross_team = !own_team_only
            && (within_reserved || s.config.policy == Policy::Fairway)
            && !known_to_fail
            && self.other_borrower(job.class, &chain);
        let below_threshold = s.below_service_threshold(job);
        Preemptor { job, n, within_reserved, priority, chain, score_after, live_after, cross_team, below_threshold }
    }

    /// Takes candidates out, in victim order, each one the rules allow for the job, until
    /// the job fits; returns them and whether it fits. They stay out of the inventory and
    /// ledger (and marked in `victim`), so every later check sees what is left.
    ///
    /// First without taking any team below its reserved quota; only if that cannot make
    /// room may reclaim take a borrowing team's gang across its reserved line (a gang
    /// cannot be split), since the reserved promise must hold.
    /// `passed`, given with a class's whole order, skips the victims chosen earlier at once.
    fn choose_victims(
        &mut self,
        p: &Preemptor<'_>,
        order: &[usize],
        mut passed: Option<&mut Passed>,
    ) -> (Vec<(usize, PreemptReason)>, bool) {
        let mut chosen: Vec<(usize, PreemptReason)> = Vec::new();
        for straddle in [false, true] {
            if straddle && !(p.cross_team && p.within_reserved) {
                break;
            }
            let mut at = 0;
            loop {
                if let Some(passed) = passed.as_deref_mut() {
                    at = passed.first_from(at);
                }
                let Some(&index) = order.get(at) else { break };
                at += 1;
                if self.victim[index] {
                    continue;
                }
                let Some(reason) = self.victim_reason(p, index, straddle) else { continue };
                self.take_out(index, true);
                self.victim[index] = true;
                chosen.push((index, reason));
                if self.fits_now(p.job) {
                    return (chosen, true);
                }
            }
        }
        (chosen, false)
    }

    /// Under which rule, if any, running job `index` may be a victim for the preemptor.
    /// `straddle` lets reclaim take a gang its team borrows only part of. Earlier victims
    /// are already out of the ledger, so every check sees what is left.
    fn victim_reason(&self, p: &Preemptor<'_>, index: usize, straddle: bool) -> Option<PreemptReason> {
        let r = &self.s.running[index];
        if r.spec.team == p.job.team {
            let priority = self.priority(&r.spec);
            if priority < p.priority {
                Some(PreemptReason::Priority)
            } else if self.yields_below(index) < p.priority {
                Some(PreemptReason::OwnTeam)
            } else {
                (priority == p.priority && p.below_threshold && self.s.past_service_threshold(r))
                    .then_some(PreemptReason::LeastService)
            }
        } else if !p.cross_team {
            None
        } else if p.within_reserved {
            let ok = self.reclaimable(p.job.class, &p.chain, r.spec.team)
                && (straddle || self.ledger.borrowed(r.spec.team, p.job.class) >= r.spec.total_milli());
            ok.then_some(PreemptReason::Reclaim)
        } else {
            self.fair_share_allows(p, &r.spec).then_some(PreemptReason::FairShare)
        }
    }

    /// Whether fair share lets a borrowing preemptor take `victim`: the victim's team loses
    /// only what it borrows, the preemptor stays within its deserved burst, the victim's team
    /// stays at or above its own, and the preemptor ends no higher than the victim's team in
    /// live borrowed value or score. This is what makes fair-share preemption terminate (see
    /// the module docs).
    fn fair_share_allows(&self, p: &Preemptor<'_>, victim: &JobSpec) -> bool {
        let s = self.s;
        let lost = fairshare::value_of(s, p.job.class, victim.total_milli());
        let their_live_after = fairshare::live_value(s, &self.ledger, victim.team) - lost;
        self.ledger.borrowed(victim.team, p.job.class) >= victim.total_milli()
            && p.live_after <= self.deserved(p.job.team)
            && their_live_after >= self.deserved(victim.team)
            && p.live_after <= their_live_after
            && p.score_after <= self.score_without(victim.team, p.job.class, victim.total_milli())
    }

    /// Puts back the candidates of an attempt that cannot make room, and remembers the
    /// failure: a later job of the same team, class and priority asking as much or more
    /// fails at once, and so does a fair-share attempt by any team scoring as high, instead
    /// of walking every candidate again.
    fn give_up(
        &mut self,
        p: &Preemptor<'_>,
        chosen: &[(usize, PreemptReason)],
        memo_key: (TeamId, ClassId, u8, bool, bool, bool),
    ) {
        for &(index, _) in chosen {
            self.take_out(index, false);
        }
        self.unpreemptable.insert(memo_key, p.n);
        if p.cross_team && !p.within_reserved {
            self.fair_share_failures.entry(p.job.class).or_default().push((p.score_after, p.n));
        }
    }

    /// Puts back victims that turned out unnecessary, most work lost first: a later, larger
    /// victim may have made room that an earlier, cheaper one was taken for. Victims that
    /// stay are left out of the inventory and ledger.
    fn drop_unneeded_victims(&mut self, job: &JobSpec, chosen: &mut Vec<(usize, PreemptReason)>) {
        // Marked, then removed in one pass: a large gang may walk thousands of candidates
        // and drop most of them, and removing each at once made this quadratic.
        let mut needed = vec![true; chosen.len()];
        for (i, &(index, _)) in chosen.iter().enumerate().rev() {
            self.take_out(index, false);
            if self.fits_now(job) {
                needed[i] = false;
            } else {
                self.take_out(index, true);
            }
        }
        let mut needed = needed.into_iter();
        chosen.retain(|_| needed.next().unwrap_or(true));
    }

    /// The cycle goes on as if the victims were gone and the job admitted, except that the
    /// victims keep their GPUs until they exit: with the victims back, the part of the job's
    /// future GPUs that is free now is held for it, and its quota counted, so nobody ranked
    /// later can take them or the room its victims make.
    fn hold_for_preemptor(&mut self, job: &JobSpec, chosen: &[(usize, PreemptReason)]) {
        let future = self.inv.find(job);
        for &(index, _) in chosen {
            self.inv.allocate(&self.s.running[index].placement);
            // The victims' quota stays out of the ledger: their teams may borrow no more.
            self.refresh_borrowing(self.s.running[index].spec.team, job.class);
        }
        if let Some(placement) = future {
            let held = self.inv.hold(&placement);
            self.push_claim(job.id, job.class, held);
        }
        self.claim_quota(job);
    }

    /// Makes room for `job` by preemption if the rules allow it (never under FIFO): tells its
    /// victims to stop, or, while the job is within its preemption delay, only holds the room
    /// they would free, telling no one to stop, so that capacity arriving in the meantime
    /// (jobs ending, nodes an autoscaler or a cloud pool adds) is taken instead. Returns
    /// whether victims were found, the job then waiting for them either way.
    ///
    /// Held room keeps jobs ranked after it, as a preemption would, so the job is not passed
    /// while it waits; the next cycle decides afresh, and admits the job wherever it then
    /// fits. A delay only withholds preemptions, so it adds no way to loop (module docs).
    pub(super) fn preempt(&mut self, job: &JobSpec, within_reserved: bool, own_team_only: bool) -> bool {
        if self.s.config.policy == Policy::Fifo {
            return false;
        }
        let Some(victims) = self.try_preempt(job, within_reserved, own_team_only) else { return false };
        match self.s.preemption_delayed_until(job) {
            Some(until_ms) => {
                let count = victims.len() as u32;
                for (index, _) in victims {
                    self.mark_victim(index);
                    // They keep running: their quota goes back into the ledger, which
                    // `try_preempt` left without it for jobs that will be gone.
                    let r = &self.s.running[index].spec;
                    if (r.team as usize) < self.s.teams.len() {
                        self.ledger.add(r.team, r.class, r.total_milli(), false);
                        self.refresh_borrowing(r.team, r.class);
                    }
                }
                self.largest_borrowers.remove(&job.class);
                self.borrowers.remove(&job.class);
                self.pend(job, PendingReason::PreemptionDelayed { until_ms, victims: count });
            }
            None => self.wait_for(job, victims),
        }
        true
    }

    /// Records the victims chosen for `job`, which waits for them to stop.
    fn wait_for(&mut self, job: &JobSpec, victims: Vec<(usize, PreemptReason)>) {
        for (index, reason) in victims {
            self.record_victim(job, index, reason);
        }
        self.pend(job, PendingReason::WaitingForReclaim);
    }

    /// Marks running job `index` as a victim for the rest of the cycle and tells it to stop,
    /// with its grace period to checkpoint (its own, or its priority class's).
    fn record_victim(&mut self, for_job: &JobSpec, index: usize, reason: PreemptReason) {
        let s = self.s;
        let r = &s.running[index];
        self.victims.insert(index);
        self.preempted.push(index);
        self.mark_victim(index);
        let grace_ms = s.grace_ms(&r.spec);
        self.decisions.preemptions.push(Preemption {
            victim: r.spec.id,
            for_job: for_job.id,
            reason,
            grace_ms,
            lost_work: lost_work(s.now_ms, r),
        });
    }

    /// Takes running job `index` out of every later walk of the cycle: it is spoken for.
    fn mark_victim(&mut self, index: usize) {
        let r = &self.s.running[index];
        self.victim[index] = true;
        self.reach.chosen(&self.ledger, r.spec.team, r.spec.class, r.spec.total_milli());
        if let (Some(passed), Some(&at)) = (self.passed.get_mut(&r.spec.class), self.place_in_order.get(index)) {
            passed.leave(at as usize);
        }
    }

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

    /// Whether the job passes its quota limit and fits in free capacity right now. Asked once
    /// per candidate victim taken out or put back, so placement is counted, not searched,
    /// where counting is exact ([`Inventory::can_place`](super::inventory::Inventory::can_place)):
    /// for a gang of hundreds of replicas a search each time is most of a cycle.
    fn fits_now(&mut self, job: &JobSpec) -> bool {
        let n = job.total_milli();
        // A non-preemptible job asks for victims only with room in its team's
        // non-preemptible use, which no victim changes: quota means reserved + burst here.
        self.ledger.over_limit(job.team, job.class, n).is_none() && self.available(job) >= n && self.inv.can_place(job)
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
    pub(super) fn reclaimable(&self, class: ClassId, chain: &[TeamId], victim_team: TeamId) -> bool {
        self.ledger.chain(victim_team).find(|t| !chain.contains(t)).is_some_and(|t| self.ledger.borrowed(t, class) > 0)
    }

    /// Whether a team outside `chain` borrows the class at some level.
    fn other_borrower(&mut self, class: ClassId, chain: &[TeamId]) -> bool {
        let classes = self.s.classes.len();
        if !self.exhaustive && usize::from(class) < classes {
            // The borrowing teams counted, less those of the chain: no pass over every team.
            let in_chain = chain
                .iter()
                .filter(|&&t| self.borrowing.get(t as usize * classes + usize::from(class)).copied().unwrap_or(false))
                .count();
            return self.borrowing_teams[usize::from(class)] > in_chain;
        }
        let ledger = &self.ledger;
        let teams = self.s.teams.len() as TeamId;
        let list = self
            .borrowers
            .entry(class)
            .or_insert_with(|| (0..teams).filter(|&t| ledger.borrowed(t, class) > 0).collect());
        list.iter().any(|t| !chain.contains(t))
    }

    /// The top-level team (other than `except`) borrowing the most of the class: whom a
    /// borrowing job that could not preempt is waiting behind under fair share.
    pub(super) fn largest_borrower(&mut self, class: ClassId, except: TeamId) -> Option<TeamId> {
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
}

#[cfg(test)]
mod tests {
    use super::Passed;

    #[test]
    fn a_walk_passes_every_place_a_victim_left_and_stops_at_the_end() {
        let mut passed = Passed::new(6);
        assert_eq!(passed.first_from(0), 0);
        for at in [0, 1, 2, 4] {
            passed.leave(at);
        }
        assert_eq!(passed.first_from(0), 3);
        assert_eq!(passed.first_from(4), 5);
        passed.leave(3);
        passed.leave(5);
        assert_eq!(passed.first_from(0), 6, "past the end once every place is left");
        assert_eq!(passed.first_from(9), 6);
    }
}
