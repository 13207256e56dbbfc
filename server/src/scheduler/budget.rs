//! Budgets: what a job may cost in money and GPU time, and whether the hard budgets over
//! its team still cover it. Costs are exact integer arithmetic on the rate card, so the same
//! snapshot always gives the same answer.

use super::{
    decision::Shortfall,
    engine::Cycle,
    snapshot::{JobSpec, Snapshot, TeamId},
};

/// GPU time of `spec` for `ms` milliseconds in the ledger's unit (physical GPUs in
/// thousandths × milliseconds), for GPU-hour budgets.
pub fn gpu_time(snapshot: &Snapshot, spec: &JobSpec, ms: i64) -> i64 {
    let fraction = snapshot.classes.get(usize::from(spec.class)).map_or(1000, |c| i128::from(c.fraction_milli));
    let time = i128::from(spec.total_milli()) * fraction * i128::from(ms.max(0)) / 1000;
    i64::try_from(time).unwrap_or(i64::MAX)
}

/// Maximum cost of running `spec` for `ms` milliseconds, in micro-units of money:
/// units × rate per unit-hour × hours × price multiplier. Exact integer arithmetic.
pub fn cost_micros(snapshot: &Snapshot, spec: &JobSpec, ms: i64) -> i64 {
    let rate = snapshot.classes.get(usize::from(spec.class)).map_or(0, |c| i128::from(c.rate_micros_per_hour));
    let mult =
        snapshot.priorities.get(usize::from(spec.priority)).map_or(1000, |p| i128::from(p.price_multiplier_milli));
    let cost = i128::from(spec.total_milli()) * rate * i128::from(ms.max(0)) * mult / (1000 * 3_600_000 * 1000);
    i64::try_from(cost).unwrap_or(i64::MAX)
}

/// `team` and its ancestors, as indices: the budgets a job of `team` spends from. Bounded
/// by the number of teams, so a malformed tree cannot loop.
pub(super) fn budget_chain(s: &Snapshot, team: TeamId) -> impl Iterator<Item = usize> + '_ {
    std::iter::successors(Some(team), move |&t| s.teams.get(t as usize).and_then(|x| x.parent))
        .take(s.teams.len())
        .map(|t| t as usize)
        .filter(move |&t| t < s.teams.len())
}

impl Cycle<'_> {
    /// The first hard budget over the job's team, nearest first, that cannot cover its
    /// maximum cost (money) or GPU time within the budgets' period; `None` when all of them
    /// can.
    pub(super) fn budget_shortfall(&self, job: &JobSpec) -> Option<Shortfall> {
        let ms = self.s.within_budget_period(self.s.now_ms, job.max_runtime_ms);
        let cost = cost_micros(self.s, job, ms);
        let time = gpu_time(self.s, job, ms);
        budget_chain(self.s, job.team).find_map(|t| {
            let team = t as TeamId;
            match (self.hard_left[t], self.hard_gpu_left[t]) {
                (Some(left), _) if left < cost => Some(Shortfall { team, gpu_time: false, needs: cost, left }),
                (_, Some(left)) if left < time => Some(Shortfall { team, gpu_time: true, needs: time, left }),
                _ => None,
            }
        })
    }

    /// Whether every hard budget over the job's team (its own and its ancestors': a
    /// department's budget covers its whole subtree), in money and in GPU-hours, still covers
    /// the job's maximum cost and GPU time.
    pub(super) fn hard_budgets_cover(&self, job: &JobSpec) -> bool {
        let ms = self.s.within_budget_period(self.s.now_ms, job.max_runtime_ms);
        let cost = cost_micros(self.s, job, ms);
        let time = gpu_time(self.s, job, ms);
        budget_chain(self.s, job.team).all(|t| {
            self.hard_left[t].is_none_or(|left| left >= cost) && self.hard_gpu_left[t].is_none_or(|left| left >= time)
        })
    }
}
