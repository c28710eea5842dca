//! A quiet spell at or above the stall threshold at one hop: the stall as the analysis keeps
//! it, and how it lies against a span of seqs and against the hop beside it.

use crate::end::EndReason;

/// A quiet spell at or above the stall threshold at one hop: between the progress record
/// `after` (`None`: the stream's start at the hop) and the progress record `seq` (`None`: the
/// stream's end record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spell {
    pub(crate) after: Option<u64>,
    pub(crate) seq: Option<u64>,
    pub(crate) quiet_ns: u64,
    /// For a spell the stream ended in: its end reason.
    pub(crate) reason: Option<EndReason>,
    /// Whether the progress record `after` was visible (not hidden).
    pub(crate) after_visible: bool,
}

impl Spell {
    /// Whether the spell lies within the span from `after` to `seq`: it starts at or after
    /// `after` and ends at or before `seq` (an end spell counts for a span to the end, unless
    /// it began before `after`).
    pub(crate) fn within(&self, after: Option<u64>, seq: Option<u64>) -> bool {
        let starts = match (after, self.after) {
            (None, _) => true,
            (Some(_), None) => self.seq.is_none(), // a stream quiet from its start to its end
            (Some(p), Some(a)) => a >= p,
        };
        let ends = match (seq, self.seq) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(s), Some(b)) => b <= s,
        };
        starts && ends
    }

    /// Whether a hop that never numbered an event from `numbered` on (its end record's seq)
    /// was behind the hop of this spell when it froze: this hop had taken an event at or past
    /// it (`self.after`), of a kind the other hop records (visible, or hidden when
    /// `carries_hidden`).
    pub(crate) fn ahead_of(&self, numbered: u64, carries_hidden: bool) -> bool {
        self.after.is_some_and(|p| p >= numbered) && (self.after_visible || carries_hidden)
    }
}
