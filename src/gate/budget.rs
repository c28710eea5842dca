//! The byte budget a group's gates share.
//!
//! A leaf: the group creates it, each member's buffer checks and counts against it, and neither
//! needs the other to do so.

use std::sync::atomic::{AtomicUsize, Ordering};

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

    /// Whether a gate holding `held` bytes may add `len` more: never past the budget (what a
    /// gate holds beyond its share stays held, so a share alone would not bound the sum), and
    /// for a gate over its fair share, not into the group's last share.
    pub(crate) fn admits(&self, held: usize, len: usize) -> bool {
        let after = self.used.load(Ordering::Relaxed).saturating_add(len);
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
