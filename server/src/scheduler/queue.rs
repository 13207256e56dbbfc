//! The order in which a cycle considers pending jobs: strict FIFO for the baseline, or
//! reserved demand first and then burst by fair share, team heads re-ranked after every
//! decision (see the [module docs](super)).

use std::{
    cmp::{Ordering, Reverse},
    collections::{BTreeMap, BinaryHeap, VecDeque},
};

use super::{
    decision::PendingReason,
    engine::Cycle,
    fairshare,
    snapshot::{ClassId, JobId, JobSpec, Policy, QueueOrder, TeamId},
};

/// Each team's jobs left for the burst phase, in [`Cycle::wait_order`].
type Queues<'a> = BTreeMap<TeamId, VecDeque<&'a JobSpec>>;

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

impl<'a> Cycle<'a> {
    /// Strict FIFO: the oldest job first; the first that does not fit blocks all behind it.
    pub(super) fn fifo(&mut self) {
        let mut order: Vec<&JobSpec> = self.s.pending.iter().collect();
        order.sort_by_key(|j| (j.submitted_ms, j.id));
        let mut head: Option<JobId> = None;
        for job in order {
            self.position += 1;
            if !self.inv.could_ever_fit(job) || (job.team as usize) >= self.s.teams.len() {
                self.pend(job, PendingReason::NeverFits);
                continue;
            }
            if !self.inv.drivers_could_ever_fit(job) {
                self.pend(job, PendingReason::DriverUnavailable);
                continue;
            }
            if let Some(h) = head {
                self.pend(job, PendingReason::BehindHeadOfLine { job: h });
                continue;
            }
            match self.inv.find(job) {
                Some(placement) => self.admit(job, placement, false, None),
                None => {
                    head = Some(job.id);
                    self.pend(job, PendingReason::InsufficientCapacity);
                }
            }
        }
    }

    /// A head's rank with its team's usage as it is now.
    fn key(&self, job: &JobSpec) -> HeadKey {
        let within = self.guaranteed(job) || self.reserved_demand.contains(&job.team);
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

    /// Whether the job is part of its team's guaranteed demand, which phase one decides
    /// ahead of all burst: it fits its team's reserved quota, or, not preemptible, it fits
    /// beside the team's other non-preemptible jobs, so that the team's own experiments make
    /// room for it if nothing else does. Ranked with burst instead, such a job came after
    /// other teams' burst jobs, which took the GPUs its preemption had freed (or free ones
    /// it would have used), and it stopped a second experiment of its team for nothing.
    fn guaranteed(&self, job: &JobSpec) -> bool {
        let n = job.total_milli();
        self.ledger.beyond_reserved(job.team, job.class, n).is_none()
            || (!self.preemptible(job) && self.ledger.firm_beyond_reserved(job.team, job.class, n).is_none())
    }

    /// A job's place in the order of waiting jobs: priority first; then, under
    /// [`QueueOrder::ServiceIndex`] and Fairway's policy, the jobs that waited past the
    /// starvation bound since they last entered the queue, oldest first; then, with a
    /// least-attained-service threshold, the jobs below it before those past it (Tiresias's
    /// two queues: a job past it may be preempted for one below it, so it must not be ranked
    /// ahead of that job into the room its preemption made, or the two would take turns);
    /// then by Gittins index (least expected remaining GPU-time first); then age. Totally
    /// ordered (the job id last).
    fn wait_order(&self, job: &JobSpec) -> (Reverse<i32>, bool, bool, Reverse<u64>, i64, JobId) {
        let index = match self.s.config.queue_order {
            QueueOrder::ServiceIndex { starvation_ms, .. }
                if self.s.config.policy == Policy::Fairway && !self.s.starving(job, starvation_ms) =>
            {
                // A non-negative finite f64's bits order as the number does.
                Some(self.s.history.gittins_index(job).to_bits())
            }
            _ => None,
        };
        (
            Reverse(self.priority(job)),
            index.is_some(),
            self.yields_to_less_service(job),
            Reverse(index.unwrap_or(0)),
            job.submitted_ms,
            job.id,
        )
    }

    /// Whether waiting job `job`, once running, could be preempted for a job of its team and
    /// priority below the least-attained-service threshold: it is past the threshold, and
    /// not let through by the starvation bound (which protects its next run).
    pub(super) fn yields_to_less_service(&self, job: &JobSpec) -> bool {
        match self.s.config.queue_order {
            QueueOrder::ServiceIndex { starvation_ms, .. } => {
                !self.s.starving(job, starvation_ms) && self.s.past_service_threshold_waiting(job)
            }
            QueueOrder::Arrival => false,
        }
    }

    /// Reserved first, then burst by fair share.
    ///
    /// Phase one decides, in priority then age order across all teams, every job that fits
    /// within its team's reserved quota (and those that rules alone keep waiting): the
    /// guaranteed part never waits behind anyone's burst, including its own team's. Phase two
    /// hands out burst capacity: team heads (each team's queue by priority, then age)
    /// compete by fair-share score.
    pub(super) fn fair(&mut self) {
        let queues = self.reserved_first();
        self.burst_by_fair_share(queues);
    }

    /// Phase one of [`Self::fair`]: decides the jobs within reserved quota (and those rules
    /// alone keep waiting) in [`Self::wait_order`], then the non-preemptible jobs beyond it
    /// that are still [guaranteed](Self::guaranteed), and queues the rest per team, in that
    /// order, for phase two.
    ///
    /// The non-preemptible jobs come after every other team's reserved demand: the free GPUs
    /// such a job takes are billed as burst, and taken ahead of a reserved job, they made that
    /// job reclaim them from the team's experiments. On the synthetic benchmark's cycle of
    /// 50,000 pending jobs, deciding them in priority order with reserved demand preempted
    /// 3,942 jobs (3,394 by reclaim); after it, 2,726; ranked with burst, 2,810.
    fn reserved_first(&mut self) -> Queues<'a> {
        let mut order: Vec<&'a JobSpec> = self.s.pending.iter().collect();
        order.sort_by_cached_key(|j| self.wait_order(j));
        let mut queues: Queues<'a> = BTreeMap::new();
        let mut firm: Vec<&'a JobSpec> = Vec::new();
        // The first job deferred to phase two per (team, class), by priority and whether it
        // is below the least-attained-service threshold: the team's jobs it could preempt
        // (of lower priority, or of its priority and past the threshold) wait for phase two
        // too, or they would take room it then preempts them for, cycle after cycle.
        let mut deferred: BTreeMap<(TeamId, ClassId), (i32, bool)> = BTreeMap::new();
        for job in order {
            let in_turn = (job.team as usize) < self.s.teams.len()
                && !deferred.get(&(job.team, job.class)).is_some_and(|&(p, below)| self.could_take(p, below, job));
            let within = in_turn && self.ledger.beyond_reserved(job.team, job.class, job.total_milli()).is_none();
            if within || self.blocked_by_rules(job) {
                self.position += 1;
                self.consider(job);
                continue;
            }
            let priority = self.priority(job);
            deferred.entry((job.team, job.class)).or_insert((priority, self.s.below_service_threshold(job)));
            if in_turn && self.guaranteed(job) {
                firm.push(job);
                continue;
            }
            if (job.team as usize) < self.s.teams.len() && self.guaranteed(job) {
                // Reserved demand queued behind the team's own higher-priority burst job:
                // the team still ranks with reserved demand in phase two.
                self.reserved_demand.insert(job.team);
            }
            queues.entry(job.team).or_default().push_back(job);
        }
        for job in firm {
            self.position += 1;
            self.consider(job);
        }
        queues
    }

    /// Phase two of [`Self::fair`]: team heads compete by [`HeadKey`], and after each
    /// decision the team's next head is ranked with its new usage.
    fn burst_by_fair_share(&mut self, mut queues: Queues<'a>) {
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
    fn next_head(&mut self, queues: &mut Queues<'a>, team: TeamId) -> Option<&'a JobSpec> {
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
}
