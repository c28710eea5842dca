//! The detail budget: how many details (holes in a hop's seqs, hidden phases, stalls, quiet
//! spells of a tenth of the threshold or more, catch-up profiles) the timeline may still keep,
//! over all requests and hops.

/// Details the timeline may still keep, over all requests and hops. A detail that does not fit
/// is not kept, and what would need it is "unknown".
#[derive(Debug, Clone)]
pub(super) struct DetailBudget {
    max: u64,
    left: u64,
}

impl DetailBudget {
    /// A budget of `max` details, none used.
    pub(super) fn new(max: u64) -> Self {
        DetailBudget { max, left: max }
    }

    /// Sets the budget to `max` details, keeping those already used (none left when they are
    /// `max` or more).
    pub(super) fn set_max(&mut self, max: u64) {
        let used = self.max.saturating_sub(self.left);
        self.max = max;
        self.left = max.saturating_sub(used);
    }

    /// The details that may still be kept.
    pub(super) fn left(&self) -> u64 {
        self.left
    }

    /// Takes one detail; `false` when none is left.
    pub(super) fn take(&mut self) -> bool {
        self.take_n(1)
    }

    /// Takes `n` details at once; `false` (taking none) when fewer are left.
    pub(super) fn take_n(&mut self, n: u64) -> bool {
        match self.left.checked_sub(n) {
            Some(left) => {
                self.left = left;
                true
            }
            None => false,
        }
    }

    /// Gives one detail back (two ranges merged into one).
    pub(super) fn give(&mut self) {
        self.left = self.left.saturating_add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_maximum_keeps_what_was_used() {
        let mut budget = DetailBudget::new(10);
        assert!(budget.take_n(4) && budget.take());
        assert!(!budget.take_n(6), "five left");
        assert_eq!(budget.left(), 5);
        budget.set_max(20);
        assert_eq!(budget.left(), 15);
        budget.set_max(3);
        assert_eq!(budget.left(), 0);
        assert!(!budget.take());
        budget.give();
        assert_eq!(budget.left(), 1);
    }
}
