//! The byte budget a group's gates share.
//!
//! A leaf: the group creates it, each member's buffer checks and counts against it, and neither
//! needs the other to do so.

use crate::sync::{AtomicUsize, Ordering};

/// The bytes a group's buffers may hold together, and what they hold now.
///
/// Not the timeline's detail budget: this one bounds memory, in bytes, across streams.
pub(crate) struct ByteBudget {
    limit: usize,
    used: AtomicUsize,
    gates: AtomicUsize,
}

impl ByteBudget {
    /// A budget of `limit` bytes (0 is taken as 1), with no gate and nothing held.
    pub(crate) fn new(limit: usize) -> Self {
        ByteBudget {
            limit: limit.max(1),
            used: AtomicUsize::new(0),
            gates: AtomicUsize::new(0),
        }
    }

    /// Whether a gate holding `held` bytes may add `len` more, as the group holds now: a hint
    /// (another gate may take the room first); [`reserve`](ByteBudget::reserve) decides.
    pub(crate) fn admits(&self, held: usize, len: usize) -> bool {
        self.allows(self.used.load(Ordering::Relaxed), held, len)
    }

    /// Counts `len` bytes more held by a gate that holds `held`, if the budget allows them;
    /// returns whether it did. One atomic step, so two gates that race for the last room
    /// cannot both take it.
    pub(crate) fn reserve(&self, held: usize, len: usize) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                self.allows(used, held, len).then(|| used + len)
            })
            .is_ok()
    }

    /// Whether a gate holding `held` bytes may add `len` more while the group holds `used`:
    /// never past the budget (what a gate holds beyond its share stays held, so a share alone
    /// would not bound the sum), and for a gate over its fair share, not into the group's last
    /// share.
    fn allows(&self, used: usize, held: usize, len: usize) -> bool {
        let after = used.saturating_add(len);
        if after > self.limit {
            return false;
        }
        let share = self.limit / self.gates.load(Ordering::Relaxed).max(1);
        held.saturating_add(len) <= share || after <= self.limit - share
    }

    /// Counts `bytes` more held.
    pub(crate) fn add(&self, bytes: usize) {
        if bytes > 0 {
            self.used.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Counts `bytes` no longer held.
    pub(crate) fn sub(&self, bytes: usize) {
        if bytes > 0 {
            self.used.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    /// A gate joined: the fair share shrinks.
    pub(crate) fn join(&self) {
        self.gates.fetch_add(1, Ordering::Relaxed);
    }

    /// A gate left: the fair share grows.
    pub(crate) fn leave(&self) {
        self.gates.fetch_sub(1, Ordering::Relaxed);
    }

    /// The bytes the budget allows.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// The bytes held now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::ByteBudget;

    #[test]
    fn a_reservation_never_passes_the_budget() {
        let budget = ByteBudget::new(4);
        budget.join();
        assert!(budget.reserve(0, 3));
        assert!(!budget.reserve(3, 2), "3 + 2 bytes would pass the budget");
        assert_eq!(budget.used(), 3);
        budget.sub(3);
        assert!(budget.reserve(0, 4));
    }

    #[test]
    fn a_gate_over_its_share_leaves_the_last_share_to_the_others() {
        // Two gates: a share is 4 bytes of 8.
        let budget = ByteBudget::new(8);
        budget.join();
        budget.join();
        assert!(budget.reserve(0, 4));
        assert!(
            !budget.reserve(4, 1),
            "5 held by one gate would eat the last share"
        );
        assert!(budget.reserve(0, 4), "the other gate's share is its own");
    }
}
