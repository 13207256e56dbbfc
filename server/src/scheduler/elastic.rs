//! Elastic gangs: a job with a minimum and a maximum number of replicas ([`Elastic`]).
//!
//! It is admitted at its minimum, all or nothing, like any gang. After every other decision
//! of a cycle it grows, one replica at a time, into capacity no one else is promised: only in
//! a class where no job waits (but for reasons no capacity can cure: it can never fit, is
//! larger than its quota, is over a hard budget or needs a driver no node runs), within its
//! team's quota and hard budgets as an admission would be (within reserved quota only for a
//! class that cannot be preempted), on GPUs neither held for a waiting job nor reserved for a
//! gang, in the gang's own cluster (an extra joins the gang's rendezvous there) and never on a
//! cloud pool. Growth never takes what a waiting job could have had.
//!
//! Its extras (the replicas beyond its minimum) are preemption candidates of their own, each
//! a one-replica running job that loses no work (the gang goes on without it), so they are
//! always taken before any whole job, under the same rules (priority, reclaim, fair share) as
//! any victim, and one more: a waiting job of the gang's own team whose priority is not below
//! the gang's may take them too ([`PreemptReason::OwnTeam`](super::PreemptReason::OwnTeam)),
//! since they hold capacity that no waiting job wanted when they grew, and the team's queue
//! must not wait behind its own gang's growth. A job shrinks before it is preempted. A taken
//! extra is a [`Shrink`], not a preemption: the job keeps running on the rest. Extras of a
//! class that cannot be preempted are never taken, as such a job is never preempted; it grows
//! only within reserved quota.
//!
//! Nothing here adds a way to loop: growth happens only into capacity no waiting job can use,
//! so no preemption takes back what a growth just took for a job that was waiting when it
//! grew; a shrink requeues nothing; and a gang never takes from a job (it grows, it does not
//! preempt), so an extra given to its own team's job stays given.
//!
//! The cycle sees each elastic gang with extras as its base (its minimum, the replicas it was
//! admitted with) and one running job per extra ([`expand`]); the decisions about extras are
//! turned back into shrinks at the end ([`Expanded::fold`]).

use std::collections::{BTreeMap, BTreeSet};

use super::{
    decision::{Decisions, Growth, PendingReason, Shrink},
    engine::Cycle,
    snapshot::{ClassId, JobSpec, NodeId, Policy, ReplicaPlacement, RunningJob, Snapshot, Topology},
};

/// Where a running job of the expanded snapshot comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    /// A running job as it is (a fixed gang, or an elastic one without extras), or an elastic
    /// gang's base: running job `0` of the snapshot.
    Job(usize),
    /// Replica `replica` of running job `of`, one of its extras.
    Extra { of: usize, replica: u16 },
}

/// The snapshot as the cycle sees it, when some running elastic gang has extras.
pub(super) struct Expanded {
    pub(super) snapshot: Snapshot,
    /// Per running job of `snapshot`, where it comes from.
    pub(super) origins: Vec<Origin>,
}

/// Splits every running elastic gang that has extras into its base and one running job per
/// extra, or `None` when none has (the snapshot is then used as it is, uncopied).
pub(super) fn expand(s: &Snapshot) -> Option<Expanded> {
    let extras =
        |r: &RunningJob| r.spec.elastic.map_or(0, |e| r.placement.len().saturating_sub(usize::from(e.min_replicas)));
    if !s.running.iter().any(|r| extras(r) > 0) {
        return None;
    }
    let mut running = Vec::with_capacity(s.running.len());
    let mut origins = Vec::with_capacity(s.running.len());
    for (i, r) in s.running.iter().enumerate() {
        let n = extras(r);
        if n == 0 {
            running.push(r.clone());
            origins.push(Origin::Job(i));
            continue;
        }
        let min = r.placement.len() - n;
        let mut base = r.clone();
        base.spec.replicas = min as u16;
        base.placement.truncate(min);
        running.push(base);
        origins.push(Origin::Job(i));
        // Last added first: victims of equal cost are taken in the order they are listed.
        for (k, replica) in r.placement.iter().enumerate().skip(min).rev() {
            // An extra loses nothing when taken: the gang goes on without it.
            running.push(RunningJob {
                spec: JobSpec { replicas: 1, elastic: None, ..r.spec.clone() },
                started_ms: r.started_ms,
                last_checkpoint_ms: Some(s.now_ms),
                placement: vec![replica.clone()],
                terminating: r.terminating,
            });
            origins.push(Origin::Extra { of: i, replica: k as u16 });
        }
    }
    Some(Expanded { snapshot: Snapshot { running, ..s.clone() }, origins })
}

impl Expanded {
    /// Turns the cycle's preemptions of extras into shrinks (`preempted` is the expanded
    /// running index of each preemption, in order). An extra of a gang that is itself
    /// preempted goes with it.
    pub(super) fn fold(&self, decisions: &mut Decisions, preempted: &[usize]) {
        let whole: BTreeSet<usize> = preempted
            .iter()
            .filter_map(|&i| match self.origins[i] {
                Origin::Job(o) => Some(o),
                Origin::Extra { .. } => None,
            })
            .collect();
        let mut kept = Vec::with_capacity(decisions.preemptions.len());
        for (p, &i) in std::mem::take(&mut decisions.preemptions).into_iter().zip(preempted) {
            match self.origins[i] {
                Origin::Job(_) => kept.push(p),
                Origin::Extra { of, replica } => {
                    if !whole.contains(&of) {
                        decisions.shrinks.push(Shrink {
                            job: p.victim,
                            replica,
                            for_job: p.for_job,
                            reason: p.reason,
                            grace_ms: p.grace_ms,
                        });
                    }
                }
            }
        }
        decisions.preemptions = kept;
    }
}

/// Reasons that no capacity can cure: a job waiting for one of them does not hold growth back.
fn capacity_cannot_help(reason: &PendingReason) -> bool {
    matches!(
        reason,
        PendingReason::NeverFits
            | PendingReason::ExceedsQuota { .. }
            | PendingReason::BudgetExhausted
            | PendingReason::DriverUnavailable
    )
}

impl Cycle<'_> {
    /// Grows the running elastic gangs into what is left (module docs), round by round: each
    /// round gives every gang that can grow one replica, higher priority first, then the gang
    /// with the fewest extras, then by job id.
    pub(super) fn grow(&mut self) {
        let s = self.s;
        if s.config.policy == Policy::Fifo {
            return;
        }
        let class_of: BTreeMap<u64, ClassId> = s.pending.iter().map(|j| (j.id, j.class)).collect();
        let waiting: BTreeSet<ClassId> = self
            .decisions
            .pending
            .iter()
            .filter(|p| !capacity_cannot_help(&p.reason))
            .filter_map(|p| class_of.get(&p.job).copied())
            .collect();
        // Per gang: its index, and how many replicas it holds now (its base's and extras').
        let mut holds: BTreeMap<u64, (usize, u16)> = BTreeMap::new();
        for (i, r) in s.running.iter().enumerate() {
            if r.terminating || self.victim[i] {
                continue;
            }
            if r.spec.elastic.is_some() {
                holds.entry(r.spec.id).or_insert((i, 0)).1 += r.spec.replicas;
            } else if let Some(entry) = holds.get_mut(&r.spec.id) {
                // One of its extras (they follow their base).
                entry.1 += 1;
            }
        }
        let mut gangs: Vec<(usize, u16)> = holds
            .into_values()
            .filter(|&(i, n)| {
                let r = &s.running[i];
                r.spec.elastic.is_some_and(|e| n < e.max_replicas) && !waiting.contains(&r.spec.class)
            })
            .collect();
        let mut grown: BTreeMap<u64, (Vec<ReplicaPlacement>, Vec<bool>)> = BTreeMap::new();
        while !gangs.is_empty() {
            gangs
                .sort_by_key(|&(i, n)| (std::cmp::Reverse(self.priority(&s.running[i].spec)), n, s.running[i].spec.id));
            let mut still = Vec::with_capacity(gangs.len());
            for (i, n) in std::mem::take(&mut gangs) {
                let r = &s.running[i];
                let left_ms = r.started_ms.saturating_add(r.spec.max_runtime_ms).saturating_sub(s.now_ms).max(0);
                let extra = JobSpec {
                    replicas: 1,
                    elastic: None,
                    topology: Topology::Any,
                    max_runtime_ms: left_ms,
                    ..r.spec.clone()
                };
                let Some(beside) = r.placement.first().map(|p| p.node) else { continue };
                let Some(placement) = self.place_extra(&extra, beside) else { continue };
                let borrowing = self.ledger.beyond_reserved(extra.team, extra.class, extra.total_milli()).is_some();
                self.take(&extra, &placement);
                let entry = grown.entry(r.spec.id).or_default();
                entry.1.extend(placement.iter().map(|_| borrowing));
                entry.0.extend(placement);
                if r.spec.elastic.is_some_and(|e| n + 1 < e.max_replicas) {
                    still.push((i, n + 1));
                }
            }
            gangs = still;
        }
        self.decisions.growths.extend(grown.into_iter().map(|(job, (placement, borrowing))| Growth {
            job,
            placement,
            borrowing,
        }));
    }

    /// Where one more replica of a gang may go, by its team's quota and budgets and the GPUs
    /// no one else is promised, in the cluster of `beside` (a node the gang holds), so that
    /// it can join the gang's rendezvous; `None` when nowhere.
    fn place_extra(&mut self, extra: &JobSpec, beside: NodeId) -> Option<Vec<ReplicaPlacement>> {
        let n = extra.total_milli();
        if (extra.team as usize) >= self.s.teams.len()
            || self.ledger.over_limit(extra.team, extra.class, n).is_some()
            || (!self.preemptible(extra) && self.ledger.firm_beyond_reserved(extra.team, extra.class, n).is_some())
            || !self.hard_budgets_cover(extra)
            || self.available(extra) < n
        {
            return None;
        }
        self.inv.find_beside(extra, beside)
    }
}
