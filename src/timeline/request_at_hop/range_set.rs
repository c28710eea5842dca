//! A set of seqs as sorted ranges, each range counted against the detail budget: the seqs a hop
//! recorded below its highest run (the holes lie between the ranges), and its hidden records.

use crate::timeline::budget::DetailBudget;

/// Sorted, disjoint, non-adjacent inclusive ranges of seqs.
#[derive(Debug, Clone, Default)]
pub(super) struct RangeSet {
    ranges: Vec<(u64, u64)>,
}

impl RangeSet {
    /// Adds `seq`; `false` when that needed a new range and the budget had none.
    pub(super) fn insert(&mut self, seq: u64, budget: &mut DetailBudget) -> bool {
        // ranges[..at] start at or below seq.
        let at = self.ranges.partition_point(|&(lo, _)| lo <= seq);
        if at > 0 {
            let (_, hi) = self.ranges[at - 1];
            if seq <= hi {
                return true;
            }
            if hi.checked_add(1) == Some(seq) {
                self.ranges[at - 1].1 = seq;
                if at < self.ranges.len() && seq.checked_add(1) == Some(self.ranges[at].0) {
                    self.ranges[at - 1].1 = self.ranges[at].1;
                    self.ranges.remove(at);
                    budget.give();
                }
                return true;
            }
        }
        if at < self.ranges.len() && seq.checked_add(1) == Some(self.ranges[at].0) {
            self.ranges[at].0 = seq;
            return true;
        }
        if !budget.take() {
            return false;
        }
        self.ranges.insert(at, (seq, seq));
        true
    }

    /// Adds a range above every range held (one detail, which the caller took).
    pub(super) fn push_highest(&mut self, range: (u64, u64)) {
        debug_assert!(self.ranges.last().is_none_or(|&(_, hi)| hi < range.0));
        self.ranges.push(range);
    }

    /// Whether a range holds `seq`.
    pub(super) fn contains(&self, seq: u64) -> bool {
        let at = self.ranges.partition_point(|&(lo, _)| lo <= seq);
        at > 0 && self.ranges[at - 1].1 >= seq
    }

    /// Whether a range meets `lo..=hi`.
    pub(super) fn meets(&self, lo: u64, hi: u64) -> bool {
        let at = self.ranges.partition_point(|&(_, end)| end < lo);
        at < self.ranges.len() && self.ranges[at].0 <= hi
    }

    /// The lowest seq held.
    pub(super) fn first(&self) -> Option<u64> {
        self.ranges.first().map(|&(lo, _)| lo)
    }

    /// Removes the highest range when it ends just below `seq`, and returns its start (its
    /// detail goes back to the caller).
    pub(super) fn pop_if_adjacent_below(&mut self, seq: u64) -> Option<u64> {
        match self.ranges.last() {
            Some(&(lo, hi)) if hi.checked_add(1) == Some(seq) => {
                self.ranges.pop();
                Some(lo)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_sets_merge_and_count_their_ranges() {
        let mut budget = DetailBudget::new(3);
        let mut set = RangeSet::default();
        for seq in [5, 7, 6, 1, u64::MAX, 2, 0] {
            assert!(set.insert(seq, &mut budget), "{seq}");
        }
        assert_eq!(set.ranges, vec![(0, 2), (5, 7), (u64::MAX, u64::MAX)]);
        assert_eq!(budget.left(), 0);
        assert!(!set.insert(10, &mut budget), "no budget for a new range");
        assert!(set.insert(8, &mut budget), "extending needs none");
        assert!(set.insert(4, &mut budget) && set.insert(3, &mut budget));
        assert_eq!(set.ranges, vec![(0, 8), (u64::MAX, u64::MAX)]);
        assert_eq!(budget.left(), 1, "the merge gave one back");
        assert!(set.contains(u64::MAX) && set.contains(0) && !set.contains(9));
        assert!(set.meets(9, u64::MAX) && set.meets(8, 8) && !set.meets(9, u64::MAX - 1));
    }
}
