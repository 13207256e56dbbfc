//! Reservations and EASY backfill: how a gang blocked by capacity holds GPUs against a
//! stream of smaller jobs without leaving them idle (see the [module docs](super)).

use super::{
    engine::Cycle,
    snapshot::{JobId, JobSpec, ReplicaPlacement},
};

/// A blocked gang's hold on the future. By `shadow_ms` the running jobs' maximum runtimes
/// will have freed GPUs where the gang can be placed; of those, the ones free now are held.
/// Other jobs run anywhere else, and on the held GPUs only if they end before `shadow_ms`
/// (EASY backfill), so a large gang cannot starve behind a stream of small ones.
#[derive(Debug, Clone)]
pub(super) struct Reservation {
    pub(super) job: JobId,
    pub(super) shadow_ms: i64,
    /// Exactly what is held now (released to let a short job backfill).
    pub(super) held: Vec<ReplicaPlacement>,
}

impl Cycle<'_> {
    /// Gives a blocked gang its reservation: replays the running and just-admitted jobs of
    /// its class ending in order of their maximum runtimes until the gang can be placed, and
    /// holds the GPUs of that placement that are free now. Which gangs get one is
    /// [`Snapshot::reserves`](super::Snapshot::reserves).
    pub(super) fn reserve(&mut self, job: &JobSpec) {
        let s = self.s;
        let mut ends: Vec<(i64, JobId, &[ReplicaPlacement])> = s
            .running
            .iter()
            .enumerate()
            .filter(|(_, r)| r.spec.class == job.class)
            .map(|(i, r)| {
                let end = if r.terminating || self.victims.contains(&i) {
                    s.now_ms + s.grace_ms(&r.spec)
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
    pub(super) fn backfill(&mut self, job: &JobSpec) -> Option<(Vec<ReplicaPlacement>, JobId)> {
        let reservation = self.reservations.get(&job.class)?;
        let gang = reservation.job;
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
        found.map(|placement| (placement, gang))
    }

    /// The waiting job whose held GPUs keep `job` from fitting, if that is what blocks it:
    /// judged by amount (held plus available covers the job), which is cheap enough to ask
    /// for every waiting job; the code only explains, it decides nothing.
    pub(super) fn held_for(&self, job: &JobSpec) -> Option<JobId> {
        let mut holder = None;
        let mut held = self.claimed_free.get(&job.class).copied().unwrap_or(0);
        if self.exhaustive {
            for (id, _, placement) in self.claims.iter().filter(|c| c.1 == job.class) {
                holder.get_or_insert(*id);
                held += placement.iter().flat_map(|r| r.units.iter()).map(|&(_, m)| u64::from(m)).sum::<u64>();
            }
        } else if let Some(&(first, milli)) = self.claims_by_class.get(&job.class) {
            holder = Some(first);
            held += milli;
        }
        if let Some(r) = self.reservations.get(&job.class) {
            holder.get_or_insert(r.job);
            held += r.held.iter().flat_map(|p| p.units.iter()).map(|&(_, m)| u64::from(m)).sum::<u64>();
        }
        let holder = holder?;
        (self.available(job) + held >= job.total_milli()).then_some(holder)
    }
}
