//! The admission engine: a pure, deterministic function from a [`Snapshot`] (inventory,
//! teams and quotas, usage history, running and pending jobs, the time) to [`Decisions`]
//! (admissions with exact placements, preemptions with victims and reasons, and for every
//! waiting job a reason, a position and an expected start). No database, no I/O, no clock:
//! the control loop and `fairway simulate` drive it. The same snapshot always gives the same
//! decisions: every ordering is total, every map ordered.
//!
//! # A cycle
//!
//! 1. **Ranking.** Each team's queue is ordered by priority, then age; or, with
//!    [`QueueOrder::ServiceIndex`], jobs that waited past the starvation bound since they
//!    last entered the queue first (oldest first), then jobs below the
//!    least-attained-service threshold before those past it, then least expected remaining
//!    GPU-time first by the Gittins index of the runtime's distribution as history
//!    estimates it, given how long the job has already run
//!    ([`runtime::RuntimeHistory::gittins_index`]), then age. Team heads compete:
//!    a head that fits within its team's reserved quota (at every level of the team tree)
//!    goes before any head that needs to borrow, and a non-preemptible one that fits beside
//!    its team's other non-preemptible jobs (its team's experiments make room for it) goes
//!    between the two; among borrowers the lowest fair-share
//!    score goes first (see [`fairshare`] for the formula: cost-weighted borrowed capacity
//!    plus decayed history, per unit of weight). After each decision the team's next head
//!    is re-ranked with its new usage.
//! 2. **Checks**, in order, each giving the pending reason when it fails: the gang can
//!    ever fit (`never_fits`); the hard budgets of the team and its ancestors cover the job's maximum cost
//!    (`budget_exhausted`); a non-preemptible job fits its team's reserved quota beside the
//!    team's other non-preemptible jobs (`reserved_quota_exhausted`; its preemptible jobs do
//!    not count, so whatever the team holds beyond its reserved quota is held by jobs that
//!    can give it back); the team and its ancestors stay within reserved + burst
//!    (`burst_limit`); the job ends before a starving gang's reservation
//!    (`reserved_for:<job>`).
//! 3. **Placement** of the whole gang ([`inventory`]): best-fit packing, topology required
//!    or preferred, never partial. Capacity held back for other teams' idle, unlendable
//!    reserved quota is not touched ([`quota`]).
//! 4. **Preemption** when it does not fit (below), else a **reservation**: the first gang of
//!    a class blocked by capacity gets a shadow time (when enough GPUs return by maximum
//!    runtimes) and later jobs backfill only if they end before it, so no gang starves.
//!    By expected service ([`QueueOrder::ServiceIndex`]) a gang reserves only once it has
//!    waited past the starvation bound, which then also ranks it first: until then the
//!    order's short jobs may use what it would hold (selective reservation).
//! 5. **Growth** of running elastic gangs into what no waiting job can use ([`elastic`]);
//!    their extras are the first victims of step 4, taken as shrinks, and a waiting job of
//!    the gang's own team of no lower priority may take them too.
//! 6. **Expected starts** ([`eta`]) by playing the queue forward on runtimes estimated from
//!    history ([`runtime`]), as an interval.
//!
//! # Preemption, and why it cannot loop
//!
//! Only preemptible jobs past the minimum runtime are victims, cheapest first by work lost
//! since their last checkpoint × GPUs, then the fewest; a victim gets its priority class's
//! grace period and goes back to the queue. A job preempts only in one of four ways:
//!
//! - **Priority**, within its own team: the victim has a strictly lower priority. A
//!   requeued victim can never preempt its preemptor back (it would need a strictly higher
//!   priority), and priorities are finite, so chains end.
//! - **Least attained service** ([`QueueOrder::ServiceIndex`] with a threshold, Fairway
//!   policy only), within its own team and priority: the preemptor has had less GPU time
//!   than the threshold over its attempts, the victim at least that much (and did not
//!   start after waiting past the starvation bound). Attained service only grows, so a
//!   requeued victim stays past the threshold: it can never take its preemptor's place by
//!   this rule, nor by priority (equal), reclaim or fair share (same team); and it ranks
//!   after every job of its priority below the threshold, so it is not admitted ahead of
//!   its preemptor into the room it was stopped for. A job is a preemptor by this rule only
//!   while below the threshold and a victim only once past it, so at a standing clock each
//!   job takes part at most on one side; as time passes the threshold, not a loop, lets
//!   jobs that crossed it be taken, each at most once per run past the minimum runtime.
//! - **Reclaim**: the preemptor stays within its team's reserved quota; the victim's team
//!   borrows at a level the preemptor's team does not share, and loses at most what it
//!   borrows. So after the preemption the victim's team still holds at least its reserved
//!   quota: none of its jobs can be within reserved *and* short of GPUs, so it can never
//!   reclaim back; and the preemptor, being within reserved, is not borrowing, so it is
//!   never a reclaim victim. This is how reserved quota is kept in one preemption round:
//!   borrowed capacity always suffices, because reserved quotas fit in the cluster. (From
//!   a state where borrowers sit on capacity held back for another team's idle, unlendable
//!   reserved quota, which only an admin lowering `lendable` creates, it may take two.)
//! - **Fair share** (Fairway policy only): the preemptor borrows; its team's borrowed value
//!   after admission stays within its *deserved* burst (the borrowed value in use, split by
//!   weight among the teams that want burst), the victim team stays at or above its own
//!   deserved burst after losing the victim (and at or above its reserved quota), the
//!   preemptor's live borrowed value after admission is not above the victim team's after
//!   the loss, and neither is its fair-share score (so the next cycle ranks the preemptor
//!   first and the freed GPUs go where they were freed for). Both teams' new live values are
//!   then strictly below the victim team's old one (the victim frees something) and no other
//!   team changes, so the multiset of live borrowed values, sorted in descending order,
//!   strictly decreases lexicographically with every such preemption. It takes finitely many
//!   values, so with no new arrivals preemption stops. Only teams below their deserved share
//!   take from teams above it: fair share is restored, not churned between near-equal teams.
//!
//! Reclaim may take a borrowing team's last victim across its reserved line (a gang cannot
//! be split), but only when no choice of victims within the line makes room, and only for a
//! job within its own reserved quota, which is therefore never borrowing: the reclaimer is
//! never a reclaim victim, and each reclaim strictly lowers the total borrowed. The price:
//! the team taken below its line may have a requeued job that now fits its own reserved
//! quota and, being older or of higher priority, goes first; the reclaimer then gets its
//! GPUs in a second round. Property tests check both the one-round rule and this exception.
//!
//! A job that preempts holds its future GPUs and its quota for the rest of the cycle, so a
//! job ranked after it cannot take the room its victims make and force another round.
//! A job whose victims are still stopping waits for them (`waiting_for_reclaim`) instead of
//! choosing more.
//!
//! **Preemption delay.** A job within its preemption delay (its own, or its priority
//! class's, counted from when it last entered the queue) chooses its victims as above but
//! tells none of them to stop: it holds the room they would free, as a preemptor does, and
//! waits (`preemption_delayed`) for capacity to come without evicting anyone: jobs ending,
//! nodes an autoscaler or a cloud pool adds. Whatever fits it in a later cycle admits it;
//! only once the delay has passed does it preempt. A delay only withholds preemptions, so
//! none of the arguments above change.
//!
//! For the same reason preemption happens in rank order. Jobs that rules alone keep waiting
//! are decided before the ranking, but a job over its quota that could preempt its own
//! team's lower-priority jobs is ranked like any other: decided early, its preemption could
//! hold a parent's quota against a job ranked before it that had already preempted for that
//! room; that job's victim would take the room back, and the two would take turns for ever
//! (found by the property test, whose seed is kept in its regressions file).

mod backfill;
mod budget;
pub mod decision;
pub mod dry_run;
mod elastic;
pub mod engine;
pub mod eta;
pub mod fairshare;
pub mod forecast_errors;
pub mod fragmentation;
pub mod inventory;
mod preemption;
mod queue;
pub mod quota;
pub mod runtime;
pub mod snapshot;

#[cfg(test)]
mod tests;

pub use decision::{
    Admission, Decisions, Fragmentation, Growth, Pending, PendingReason, PreemptReason, Preemption, Shrink,
    Unforeseeable,
};
pub use forecast_errors::ForecastErrors;
pub use runtime::{KindId, RuntimeHistory};
pub use snapshot::*;

/// Runs one admission cycle over a snapshot.
pub fn schedule(snapshot: &Snapshot) -> Decisions {
    engine::run(snapshot)
}
