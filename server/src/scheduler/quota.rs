//! Quota accounting on the team tree.
//!
//! A job counts against its team and every ancestor. At each level it must stay within
//! `reserved + burst`. What a team holds beyond its `reserved` is borrowed. Idle reserved
//! quota is lent out only up to `lendable`: the rest is *held back* for its owner, and no
//! other team may take it, so the owner can always get its reserved quota without waiting.
//! A department holds back at least what its sub-teams hold back: a sub-team that lends
//! nothing keeps its reserved quota from teams outside its department too, whatever the
//! department itself lends. (Without that, capacity a sibling could not touch went to an
//! outside borrower, the sibling reclaimed it, and the two took turns preempting each other.)
//!
//! Non-preemptible ("firm") use is also kept apart, at each team's own level: a
//! non-preemptible job must fit its team's reserved quota beside the team's other
//! non-preemptible jobs, not beside its preemptible ones. Those fill the rest of the reserved
//! quota and borrow beyond it, so what a team borrows is always held by jobs that can give it
//! back (reclaim still takes it in one round), and a non-preemptible job never preempts its
//! team's experiments only to bring the team's total under its reserved quota when free GPUs
//! would have done.

use super::snapshot::{ClassId, Quota, Snapshot, TeamId};

/// Usage per team per class (including descendants) and the held-back sums.
#[derive(Debug, Clone)]
pub struct Ledger {
    classes: usize,
    parent: Vec<Option<TeamId>>,
    quota: Vec<Quota>,
    usage: Vec<u64>,
    /// Milli-units each team's own non-preemptible jobs hold, per class (not summed up the
    /// tree: only a team's own level is checked, see [`Self::firm_beyond_reserved`]).
    firm: Vec<u64>,
    /// Held-back milli of all children of a group (a team, or the virtual root at index
    /// `teams`) per class.
    held_back_children: Vec<u64>,
}

impl Ledger {
    /// An empty ledger for the snapshot's teams.
    pub fn new(snapshot: &Snapshot) -> Self {
        let classes = snapshot.classes.len();
        let teams = snapshot.teams.len();
        let mut quota = vec![Quota::default(); teams * classes];
        for (t, team) in snapshot.teams.iter().enumerate() {
            for (&c, q) in &team.quotas {
                if usize::from(c) < classes {
                    let mut q = *q;
                    q.lendable = q.lendable.min(q.reserved);
                    quota[t * classes + usize::from(c)] = q;
                }
            }
        }
        // A parent outside the tree (or a cycle) is treated as top level so a bad snapshot
        // cannot make accounting loop.
        let parent: Vec<Option<TeamId>> = snapshot
            .teams
            .iter()
            .enumerate()
            .map(|(t, team)| team.parent.filter(|&p| (p as usize) < teams && p as usize != t))
            .collect();
        Self::from_parts(classes, parent, quota)
    }

    /// A ledger with no usage over teams with these parents and quotas (`classes` per team).
    fn from_parts(classes: usize, parent: Vec<Option<TeamId>>, quota: Vec<Quota>) -> Self {
        let teams = parent.len();
        let mut ledger = Self {
            classes,
            parent,
            quota,
            usage: vec![0; teams * classes],
            firm: vec![0; teams * classes],
            held_back_children: vec![0; (teams + 1) * classes],
        };
        ledger.break_cycles();
        ledger.held_back_children = ledger.held_back_sums();
        ledger
    }

    /// The held-back sums computed from scratch for the current usage: what [`Self::add`]
    /// keeps up to date one change at a time.
    fn held_back_sums(&self) -> Vec<u64> {
        let (teams, classes) = (self.parent.len(), self.classes);
        let mut scratch = self.clone();
        scratch.held_back_children = vec![0; (teams + 1) * classes];
        // Sub-teams before their departments: a department's held-back sum reads its
        // sub-teams' (see `held_back`).
        let mut order: Vec<TeamId> = (0..teams as TeamId).collect();
        order.sort_by_key(|&t| std::cmp::Reverse(self.chain(t).count()));
        for t in order {
            for c in 0..classes {
                let hb = scratch.held_back(t, c as ClassId);
                scratch.held_back_children[self.group(t) * classes + c] += hb;
            }
        }
        scratch.held_back_children
    }

    fn break_cycles(&mut self) {
        let n = self.parent.len();
        for t in 0..n {
            let mut seen = 0;
            let mut cur = self.parent[t];
            while let Some(p) = cur {
                seen += 1;
                if seen > n {
                    self.parent[t] = None;
                    break;
                }
                cur = self.parent[p as usize];
            }
        }
    }

    fn group(&self, team: TeamId) -> usize {
        self.parent[team as usize].map_or(self.parent.len(), |p| p as usize)
    }

    /// The team and its ancestors, nearest first.
    pub fn chain(&self, team: TeamId) -> impl Iterator<Item = TeamId> + '_ {
        std::iter::successors(Some(team), move |&t| self.parent.get(t as usize).copied().flatten())
    }

    /// The quota of a team for a class.
    pub fn quota(&self, team: TeamId, class: ClassId) -> Quota {
        self.quota.get(team as usize * self.classes + usize::from(class)).copied().unwrap_or_default()
    }

    /// Milli-units a team (with its descendants) holds of a class.
    pub fn usage(&self, team: TeamId, class: ClassId) -> u64 {
        self.usage.get(team as usize * self.classes + usize::from(class)).copied().unwrap_or(0)
    }

    /// What a team holds beyond its reserved quota.
    pub fn borrowed(&self, team: TeamId, class: ClassId) -> u64 {
        self.usage(team, class).saturating_sub(self.quota(team, class).reserved)
    }

    /// Idle reserved quota the team does not lend, and at least what its sub-teams hold
    /// back (see the module docs).
    fn held_back(&self, team: TeamId, class: ClassId) -> u64 {
        let q = self.quota(team, class);
        let idle = q.reserved.saturating_sub(self.usage(team, class));
        let own = idle.saturating_sub(q.lendable);
        let children = self.held_back_children.get(team as usize * self.classes + usize::from(class)).copied();
        own.max(children.unwrap_or(0))
    }

    /// The first team in the chain that `milli` more would push above reserved + burst.
    pub fn over_limit(&self, team: TeamId, class: ClassId, milli: u64) -> Option<TeamId> {
        self.chain(team).find(|&t| {
            let q = self.quota(t, class);
            self.usage(t, class) + milli > q.reserved.saturating_add(q.burst)
        })
    }

    /// `Some(team)` when `milli` more would push the team above its own reserved quota.
    ///
    /// Only the team's own level counts: children's reserved quotas never exceed their
    /// parent's (the API enforces it), so a team within its own reserved quota is entitled to
    /// it even while its department borrows; what the department holds beyond that is held
    /// by borrowing siblings, which reclaim can take back.
    pub fn beyond_reserved(&self, team: TeamId, class: ClassId, milli: u64) -> Option<TeamId> {
        (self.usage(team, class) + milli > self.quota(team, class).reserved).then_some(team)
    }

    /// `Some(team)` when a non-preemptible job of `milli` would take the team's
    /// non-preemptible use above its own reserved quota: the one limit such a job has beyond
    /// [`Self::over_limit`]. Its preemptible use does not count: whatever of it a
    /// non-preemptible job pushes past the reserved quota is borrowed, and preemptible, so
    /// reclaim can still take it back. As with [`Self::beyond_reserved`], children's reserved
    /// quotas sum to no more than their parent's, so the team's own level is the only one
    /// to check.
    pub fn firm_beyond_reserved(&self, team: TeamId, class: ClassId, milli: u64) -> Option<TeamId> {
        (self.firm(team, class) + milli > self.quota(team, class).reserved).then_some(team)
    }

    /// Milli-units the team's own non-preemptible jobs hold of a class.
    pub fn firm(&self, team: TeamId, class: ClassId) -> u64 {
        self.firm.get(team as usize * self.classes + usize::from(class)).copied().unwrap_or(0)
    }

    /// Records `milli` more (or less, when `release`) held by a job of `team`: like
    /// [`Self::add`], and counted as the team's non-preemptible use when the job is `firm`.
    pub fn add_job(&mut self, team: TeamId, class: ClassId, milli: u64, firm: bool, release: bool) {
        self.add(team, class, milli, release);
        if firm {
            if let Some(slot) = self.firm.get_mut(team as usize * self.classes + usize::from(class)) {
                *slot = if release { slot.saturating_sub(milli) } else { *slot + milli };
            }
        }
    }

    /// Capacity held back for other teams that a job of `team` must leave alone: at every
    /// level of its chain, the held-back quota of its siblings.
    pub fn held_back_for_others(&self, team: TeamId, class: ClassId) -> u64 {
        let c = usize::from(class);
        self.chain(team)
            .map(|t| {
                let g = self.group(t);
                self.held_back_children[g * self.classes + c].saturating_sub(self.held_back(t, class))
            })
            .sum()
    }

    /// Records `milli` more (or less, when `release`) held by `team` and its ancestors.
    pub fn add(&mut self, team: TeamId, class: ClassId, milli: u64, release: bool) {
        let c = usize::from(class);
        // From the team up, one level at a time: a level's held-back amount before the
        // change (its usage and its sub-teams' sum both as they were), its usage, then its new
        // amount into its department's sum. The department's own amount before is read
        // before that sum moves, and its new amount after, as its turn comes. One pass
        // without collecting the chain: tentative victims call this thousands of times a
        // cycle.
        let mut at = team;
        let mut before = self.held_back(at, class);
        loop {
            let parent = self.parent.get(at as usize).copied().flatten();
            let parent_before = parent.map(|p| self.held_back(p, class));
            let slot = &mut self.usage[at as usize * self.classes + c];
            *slot = if release { slot.saturating_sub(milli) } else { *slot + milli };
            let after = self.held_back(at, class);
            let g = self.group(at);
            let sum = &mut self.held_back_children[g * self.classes + c];
            *sum = (*sum + after).saturating_sub(before);
            match (parent, parent_before) {
                (Some(p), Some(b)) => (at, before) = (p, b),
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    #[test]
    fn held_back_sums_kept_one_change_at_a_time_equal_the_sums_computed_from_scratch() {
        for seed in 0..200u64 {
            let mut rng = SplitMix64(0x1ed6e5 ^ seed);
            let classes = 1 + (rng.next_u64() % 3) as usize;
            let teams = 1 + (rng.next_u64() % 12) as usize;
            // Parents only among earlier teams: trees up to several levels deep.
            let parent: Vec<Option<TeamId>> = (0..teams)
                .map(|t| (t > 0 && !rng.next_u64().is_multiple_of(3)).then(|| (rng.next_u64() % t as u64) as TeamId))
                .collect();
            let quota: Vec<Quota> = (0..teams * classes)
                .map(|_| {
                    let reserved = rng.next_u64() % 5 * 1000;
                    Quota { reserved, burst: rng.next_u64() % 5 * 1000, lendable: rng.next_u64() % (reserved + 1) }
                })
                .collect();
            let mut ledger = Ledger::from_parts(classes, parent, quota);
            let mut held: Vec<(TeamId, ClassId, u64)> = Vec::new();
            for step in 0..40 {
                if !held.is_empty() && rng.next_u64().is_multiple_of(3) {
                    let (team, class, milli) = held.swap_remove((rng.next_u64() % held.len() as u64) as usize);
                    ledger.add(team, class, milli, true);
                } else {
                    let (team, class) =
                        ((rng.next_u64() % teams as u64) as TeamId, (rng.next_u64() % classes as u64) as ClassId);
                    let milli = 250 * (1 + rng.next_u64() % 8);
                    ledger.add(team, class, milli, false);
                    held.push((team, class, milli));
                }
                assert_eq!(ledger.held_back_children, ledger.held_back_sums(), "seed {seed}, step {step}");
            }
        }
    }
}
