//! The fair-share score that orders teams competing for burst capacity.
//!
//! For team `t`, with `b(t,c)` the milli-units of class `c` it holds beyond its reserved
//! quota, `r(c)` the class's rate per unit-hour, `H(t)` its decayed usage history in money
//! (already weighted by the priority classes' usage factors), `τ = half-life / ln 2` the mean
//! lifetime of the decay, and `w(t)` its weight:
//!
//! ```text
//! live(t)  = Σ_c b(t,c) / 1000 × r(c)          money per hour borrowed right now
//! past(t)  = H(t) / τ                          the history as an equivalent rate
//! score(t) = (live(t) + past(t)) / w(t)        lower goes first
//! ```
//!
//! Measuring in rate-card money makes the share cost-weighted across classes: an H100-hour
//! borrowed outweighs a T4-hour. Dividing the history by `τ` puts both terms in the same
//! unit: a team that has borrowed at a steady rate `x` for a long time has `H → x·τ`, so its
//! past term tends to `x` as well. Borrowed capacity is the dominant resource: reserved use
//! is guaranteed and never counts against a team.

use super::{
    quota::Ledger,
    snapshot::{ClassId, Snapshot, TeamId},
};

/// Money per hour a team borrows now, in micro-units.
pub fn live_value(snapshot: &Snapshot, ledger: &Ledger, team: TeamId) -> f64 {
    snapshot
        .classes
        .iter()
        .enumerate()
        .map(|(c, class)| ledger.borrowed(team, c as ClassId) as f64 / 1000.0 * class.rate_micros_per_hour as f64)
        .sum()
}

/// Money per hour `milli` units of `class` are worth.
pub fn value_of(snapshot: &Snapshot, class: ClassId, milli: u64) -> f64 {
    let rate = snapshot.classes.get(usize::from(class)).map_or(0, |c| c.rate_micros_per_hour);
    milli as f64 / 1000.0 * rate as f64
}

/// The team's fair-share score: lower is more deserving.
pub fn score(snapshot: &Snapshot, ledger: &Ledger, team: TeamId) -> f64 {
    score_with(snapshot, ledger, team, 0.0)
}

/// The team's score if its live borrowed value changed by `delta` (money per hour): what
/// fair-share preemption compares, so that it agrees with the ranking of the next cycle.
pub fn score_with(snapshot: &Snapshot, ledger: &Ledger, team: TeamId, delta: f64) -> f64 {
    let Some(t) = snapshot.teams.get(team as usize) else { return f64::MAX };
    let tau_hours = snapshot.config.usage_half_life_ms as f64 / 3_600_000.0 / std::f64::consts::LN_2;
    let past = if tau_hours > 0.0 { t.usage_history_micros.max(0.0) / tau_hours } else { 0.0 };
    let weight = f64::from(t.fair_share_weight_milli.max(1)) / 1000.0;
    ((live_value(snapshot, ledger, team) + delta).max(0.0) + past) / weight
}

/// Decays a usage history over `elapsed_ms`: what the control loop and the simulator use to
/// carry `usage_history_micros` from one cycle to the next.
pub fn decay(history: f64, elapsed_ms: i64, half_life_ms: i64) -> f64 {
    if half_life_ms <= 0 {
        return 0.0;
    }
    history * 0.5f64.powf(elapsed_ms.max(0) as f64 / half_life_ms as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn history_halves_every_half_life() {
        assert!((decay(100.0, 1000, 1000) - 50.0).abs() < 1e-9);
        assert!((decay(100.0, 3000, 1000) - 12.5).abs() < 1e-9);
        assert_eq!(decay(100.0, 5, 0), 0.0);
    }
}
