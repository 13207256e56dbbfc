//! The fewest GPUs any placement could strand, given the pods that arrive: a bound that
//! `fairway fragmentation` prints beside every placer, so a goal that no placement can meet
//! shows as such in the same run.
//!
//! It comes from a relaxation that any real placement also satisfies, so what the relaxation
//! can pack is at least what any placement can: each GPU is on its own (a pod's whole GPUs
//! need not share a node, and CPU and memory are ignored), a GPU holds shares that sum to at
//! most one GPU, and pods may even be split across GPUs as the linear program's fractions
//! allow. What remains is the packing of shares, which no relaxation can wish away: a 0.81
//! share leaves 0.19 of its GPU, which only the few pods of 0.19 or less can use.
//!
//! Whole-GPU pods fill their GPUs exactly, so the relaxation places every one of them that
//! fits (no GPU holds more than a whole one's worth) and gives the rest of the GPUs to
//! shares. The shares are a linear program over patterns, the multisets of share sizes that
//! fit one GPU: `max Σ w_p x_p` subject to `Σ x_p ≤ GPUs left` and, for each size `i`,
//! `Σ a_ip x_p ≤ n_i` (how many shares of that size arrived). It is solved by the simplex
//! method on a dense tableau (tens of rows, thousands of patterns).

use std::collections::BTreeMap;

use crate::scheduler::UNIT;

/// Patterns beyond which no bound is computed (the lists here have a few thousand).
const MAX_PATTERNS: usize = 200_000;

/// The fewest milli-GPUs any placement of `asks` (each pod's GPU milli: a share below 1000,
/// or whole GPUs in multiples of 1000) on `gpus` GPUs could leave unallocated; `None` when
/// the shares have too many patterns to solve.
pub fn fewest_stranded_milli(asks: &[u32], gpus: u64) -> Option<f64> {
    let capacity = gpus as f64 * f64::from(UNIT);
    let whole_gpus: u64 = asks.iter().filter(|&&a| a >= UNIT).map(|&a| u64::from(a / UNIT)).sum();
    if whole_gpus >= gpus {
        return Some(0.0);
    }
    let mut shares: BTreeMap<u32, u32> = BTreeMap::new();
    for &a in asks.iter().filter(|&&a| a > 0 && a < UNIT) {
        *shares.entry(a).or_default() += 1;
    }
    let sizes: Vec<(u32, u32)> = shares.into_iter().collect();
    let patterns = patterns(&sizes)?;
    let left = (gpus - whole_gpus) as f64;
    let packed_shares = max_packed(&sizes, &patterns, left)?;
    Some((capacity - whole_gpus as f64 * f64::from(UNIT) - packed_shares).max(0.0))
}

/// Every non-empty multiset of share sizes that fits one GPU (counts per size, at most as
/// many as arrived); `None` past [`MAX_PATTERNS`].
fn patterns(sizes: &[(u32, u32)]) -> Option<Vec<Vec<u32>>> {
    fn walk(sizes: &[(u32, u32)], i: usize, room: u32, current: &mut Vec<u32>, out: &mut Vec<Vec<u32>>) -> bool {
        if i == sizes.len() {
            if current.iter().any(|&c| c > 0) {
                out.push(current.clone());
            }
            return out.len() <= MAX_PATTERNS;
        }
        let (size, arrived) = sizes[i];
        let most = (room / size).min(arrived);
        for count in 0..=most {
            current.push(count);
            let ok = walk(sizes, i + 1, room - count * size, current, out);
            current.pop();
            if !ok {
                return false;
            }
        }
        true
    }
    let mut out = Vec::new();
    walk(sizes, 0, UNIT, &mut Vec::new(), &mut out).then_some(out)
}

/// The linear program's optimum: the most share milli `gpus` GPUs can hold.
fn max_packed(sizes: &[(u32, u32)], patterns: &[Vec<u32>], gpus: f64) -> Option<f64> {
    // Rows: the GPUs, then one per size. Columns: the patterns.
    let mut rows: Vec<Vec<f64>> = Vec::with_capacity(sizes.len() + 1);
    rows.push(vec![1.0; patterns.len()]);
    for i in 0..sizes.len() {
        rows.push(patterns.iter().map(|p| f64::from(p[i])).collect());
    }
    let limits: Vec<f64> = std::iter::once(gpus).chain(sizes.iter().map(|&(_, n)| f64::from(n))).collect();
    let gains: Vec<f64> =
        patterns.iter().map(|p| p.iter().zip(sizes).map(|(&c, &(s, _))| f64::from(c * s)).sum()).collect();
    maximise(&rows, &limits, &gains)
}

/// `max gains·x` subject to `rows x ≤ limits`, `x ≥ 0`, for non-negative limits (so no slack
/// is ever negative and the origin is a start): the simplex method on a dense tableau,
/// entering the column of largest gain, Bland's rule (lowest index) once it has taken many
/// steps, so it cannot cycle. `None` if it does not finish within its step limit.
pub fn maximise(rows: &[Vec<f64>], limits: &[f64], gains: &[f64]) -> Option<f64> {
    const EPS: f64 = 1e-9;
    let (m, n) = (rows.len(), gains.len());
    let width = n + m + 1;
    // Row k < m: constraint k with its slack; row m: the objective (reduced gains, negated).
    let mut t = vec![0.0; (m + 1) * width];
    for (k, row) in rows.iter().enumerate() {
        t[k * width..k * width + n].copy_from_slice(row);
        t[k * width + n + k] = 1.0;
        t[k * width + width - 1] = limits[k];
    }
    for (j, &g) in gains.iter().enumerate() {
        t[m * width + j] = -g;
    }
    let mut basis: Vec<usize> = (n..n + m).collect();
    let steps_limit = 50 * (n + m) + 10_000;
    for step in 0..steps_limit {
        let objective = &t[m * width..m * width + width - 1];
        let entering = if step < 5 * (n + m) {
            objective.iter().enumerate().filter(|(_, &v)| v < -EPS).min_by(|a, b| a.1.total_cmp(b.1)).map(|(j, _)| j)
        } else {
            objective.iter().position(|&v| v < -EPS)
        };
        let Some(col) = entering else { return Some(t[m * width + width - 1]) };
        let leaving = (0..m).filter(|&k| t[k * width + col] > EPS).min_by(|&a, &b| {
            let ra = t[a * width + width - 1] / t[a * width + col];
            let rb = t[b * width + width - 1] / t[b * width + col];
            ra.total_cmp(&rb).then(basis[a].cmp(&basis[b]))
        });
        // Every gain is bounded by the GPUs row, so the program is never unbounded.
        let row = leaving?;
        let pivot = t[row * width + col];
        for v in &mut t[row * width..(row + 1) * width] {
            *v /= pivot;
        }
        let pivot_row: Vec<f64> = t[row * width..(row + 1) * width].to_vec();
        for k in (0..=m).filter(|&k| k != row) {
            let factor = t[k * width + col];
            if factor.abs() > 0.0 {
                for (v, p) in t[k * width..(k + 1) * width].iter_mut().zip(&pivot_row) {
                    *v -= factor * p;
                }
            }
        }
        basis[row] = col;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simplex_finds_a_textbook_optimum() {
        // max 3x + 5y, x ≤ 4, 2y ≤ 12, 3x + 2y ≤ 18: the optimum is 36 at (2, 6).
        let rows = vec![vec![1.0, 0.0], vec![0.0, 2.0], vec![3.0, 2.0]];
        let best = maximise(&rows, &[4.0, 12.0, 18.0], &[3.0, 5.0]).unwrap();
        assert!((best - 36.0).abs() < 1e-9, "{best}");
    }

    #[test]
    fn shares_that_pair_up_strand_nothing_and_a_large_share_strands_what_only_few_could_use() {
        // Four halves on two GPUs: nothing left over.
        assert_eq!(fewest_stranded_milli(&[500, 500, 500, 500], 2), Some(0.0));
        // Two 0.8 shares and one 0.2: at best one GPU is full, the other keeps 0.2 free.
        let left = fewest_stranded_milli(&[800, 800, 200], 2).unwrap();
        assert!((left - 200.0).abs() < 1e-6, "{left}");
        // Whole GPUs fill their GPUs exactly; what is left goes to shares.
        let left = fewest_stranded_milli(&[2000, 700, 700], 4).unwrap();
        assert!((left - 600.0).abs() < 1e-6, "{left}");
        // More whole GPUs than there are: nothing need be left.
        assert_eq!(fewest_stranded_milli(&[8000, 300], 4), Some(0.0));
    }

    #[test]
    fn no_placement_found_by_search_strands_less_than_the_bound() {
        // Every assignment of five shares to three GPUs, by brute force: the best leaves no
        // less than the bound says.
        let asks = [810, 470, 320, 650, 160];
        let mut best_left = f64::MAX;
        for code in 0..4u32.pow(asks.len() as u32) {
            let mut free = [UNIT; 3];
            let mut c = code;
            for &a in &asks {
                let gpu = (c % 4) as usize;
                c /= 4;
                if gpu < 3 && free[gpu] >= a {
                    free[gpu] -= a;
                }
            }
            best_left = best_left.min(free.iter().map(|&f| f64::from(f)).sum());
        }
        let bound = fewest_stranded_milli(&asks, 3).unwrap();
        assert!(bound <= best_left + 1e-6, "bound {bound} above a real placement's {best_left}");
        assert!(bound > 0.0, "0.81 and 0.65 cannot share a GPU, and nothing fills them both");
    }
}
