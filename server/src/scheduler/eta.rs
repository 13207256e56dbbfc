//! Expected start times: the queue played forward on the running jobs' maximum runtimes.
//!
//! A class-level model: GPUs of a class are given back when jobs reach their maximum
//! runtime (victims when their grace period ends), and the waiting jobs of that class start
//! in the order of this cycle, each as soon as the class has enough free GPUs for it. A job
//! that does not fit blocks those behind it, as a reservation would. Topology and quotas
//! are not replayed, so the estimate is the earliest plausible start, not a promise; jobs
//! blocked by quota, budget or size get none.

use std::{cmp::Reverse, collections::BTreeSet, collections::BinaryHeap, collections::VecDeque};

use super::{
    decision::{Decisions, PendingReason},
    inventory::Inventory,
    snapshot::{ClassId, JobId, Snapshot},
};

/// Fills `expected_start_ms` of the pending jobs that wait for capacity.
/// `held` is, per class, milli held for waiting jobs (free for this purpose).
pub fn estimate(s: &Snapshot, inv: &Inventory, held: &[u64], victims: &BTreeSet<usize>, decisions: &mut Decisions) {
    let classes = s.classes.len();
    let mut free: Vec<u64> =
        (0..classes).map(|c| inv.free_milli(c as ClassId) + held.get(c).copied().unwrap_or(0)).collect();
    let mut events: BinaryHeap<Reverse<(i64, ClassId, u64)>> = BinaryHeap::new();
    for (i, r) in s.running.iter().enumerate() {
        let end = if r.terminating || victims.contains(&i) {
            s.now_ms + s.priorities.get(usize::from(r.spec.priority)).map_or(0, |p| p.preemption_grace_ms)
        } else {
            r.started_ms.saturating_add(r.spec.max_runtime_ms)
        };
        events.push(Reverse((end.max(s.now_ms), r.spec.class, r.spec.total_milli())));
    }
    let specs: std::collections::BTreeMap<JobId, (ClassId, u64, i64)> =
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
                | PendingReason::NoTopologyFit
                | PendingReason::BehindHeadOfLine { .. }
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
            decisions.pending[i].expected_start_ms = Some(t);
            events.push(Reverse((t.saturating_add(runtime), class, need)));
            queues[c].pop_front();
        }
        if queues.iter().all(VecDeque::is_empty) {
            break;
        }
    }
}
