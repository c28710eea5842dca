//! Gap counters: what one hop saw of one stream, or of every stream through it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::histogram::{AtomicHistogram, Histogram};
use crate::chunk::Kind;

/// A histogram bucket a record touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Touched {
    Gap(usize),
    Age(usize),
}

/// Output position classes: which part of a response a gap fell in. Long outputs that freeze
/// late (KV pressure, a gateway buffer threshold) show up in the last classes.
pub const POSITION_CLASSES: [&str; 5] = ["0-63", "64-255", "256-1023", "1024-4095", "4096+"];

/// The position class of visible event number `position` (0-based).
pub(crate) fn position_class(position: u64) -> usize {
    match position {
        0..64 => 0,
        64..256 => 1,
        256..1024 => 2,
        1024..4096 => 3,
        _ => 4,
    }
}

// The scalar counters, by index: one array, so that merging and snapshots are one loop.
const VISIBLE_EVENTS: usize = 0;
const VISIBLE_BYTES: usize = 1;
const HIDDEN_EVENTS: usize = 2;
const HIDDEN_BYTES: usize = 3;
const CONTROL_EVENTS: usize = 4;
const CONTROL_BYTES: usize = 5;
const STALLS: usize = 6;
const MAX_GAP: usize = 7;
const MAX_QUIET: usize = 8;
const MAX_AGE: usize = 9;
const AGE_TOTAL: usize = 10;
const PEAK_WAITING: usize = 11;
const POS_GAPS: usize = 12;
const POS_TOTAL: usize = POS_GAPS + 5;
const POS_MAX: usize = POS_TOTAL + 5;
const POS_STALLS: usize = POS_MAX + 5;
const SCALARS: usize = POS_STALLS + 5;

/// Whether scalar `index` keeps a maximum rather than a sum.
fn is_max(index: usize) -> bool {
    matches!(index, MAX_GAP | MAX_QUIET | MAX_AGE | PEAK_WAITING)
        || (POS_MAX..POS_STALLS).contains(&index)
}

/// What a hop saw: events and bytes by kind, the visible-gap histogram, its maximum, stalls,
/// gaps by output position, how long events waited in a gate, and how many waited.
///
/// A *gap* is the time between two consecutive visible events at this hop, on this hop's
/// monotonic clock. Hidden events (a reasoning phase) keep a stream alive without being
/// progress: they are counted, and they end a *quiet* spell, but they are not gaps. Control
/// events (heartbeats, end frames) are counted only.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct GapCounters {
    scalars: [u64; SCALARS],
    gaps: Histogram,
    ages: Histogram,
}

/// The gaps that fell in one output position class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PositionGaps {
    /// The class, e.g. `"256-1023"`.
    pub class: &'static str,
    /// How many gaps ended at a visible event in this class.
    pub gaps: u64,
    /// Their sum.
    pub total: Duration,
    /// The longest.
    pub max: Duration,
    /// How many were stalls.
    pub stalls: u64,
}

impl GapCounters {
    /// Counts one event of `kind` and `bytes`.
    pub(crate) fn count_event(&mut self, kind: Kind, bytes: u64) {
        let (events, sum) = match kind {
            Kind::Visible => (VISIBLE_EVENTS, VISIBLE_BYTES),
            Kind::Hidden => (HIDDEN_EVENTS, HIDDEN_BYTES),
            Kind::Control => (CONTROL_EVENTS, CONTROL_BYTES),
        };
        self.scalars[events] += 1;
        self.scalars[sum] += bytes;
    }

    /// Records a visible gap of `ns` ending at visible event number `position`; returns the
    /// histogram bucket it touched.
    pub(crate) fn record_gap(&mut self, ns: u64, position: u64, stall: bool) -> Touched {
        let class = position_class(position);
        let bucket = self.gaps.record(ns);
        self.max(MAX_GAP, ns);
        self.scalars[POS_GAPS + class] += 1;
        self.scalars[POS_TOTAL + class] += ns;
        self.max(POS_MAX + class, ns);
        if stall {
            self.scalars[STALLS] += 1;
            self.scalars[POS_STALLS + class] += 1;
        }
        Touched::Gap(bucket)
    }

    /// Records a quiet spell (no visible or hidden event between two that were) of `ns`.
    pub(crate) fn record_quiet(&mut self, ns: u64) {
        self.max(MAX_QUIET, ns);
    }

    /// Records that an event waited `ns` in a gate, with `waiting` events behind it; returns
    /// the histogram bucket it touched.
    pub(crate) fn record_wait(&mut self, ns: u64, waiting: u64) -> Touched {
        let bucket = self.ages.record(ns);
        self.scalars[AGE_TOTAL] += ns;
        self.max(MAX_AGE, ns);
        self.max(PEAK_WAITING, waiting);
        Touched::Age(bucket)
    }

    fn max(&mut self, index: usize, value: u64) {
        self.scalars[index] = self.scalars[index].max(value);
    }

    /// Adds what `self` has beyond `before` (an earlier copy of it) to `shared`, and brings
    /// `before` up to date. Only the histogram buckets in `touched` can have changed, so a
    /// flush costs the buckets touched, not the whole histograms; `export` is told each
    /// bucket's increase.
    pub(crate) fn flush(
        &self,
        before: &mut GapCounters,
        shared: &SharedCounters,
        touched: &[Touched],
        mut export: impl FnMut(Touched, u64),
    ) {
        for (index, (now, then)) in self.scalars.iter().zip(before.scalars.iter()).enumerate() {
            if now == then {
                continue;
            }
            if is_max(index) {
                shared.scalars[index].fetch_max(*now, Ordering::Relaxed);
            } else {
                shared.scalars[index].fetch_add(now - then, Ordering::Relaxed);
            }
        }
        before.scalars = self.scalars;
        for &bucket in touched {
            let delta = match bucket {
                Touched::Gap(i) => self.gaps.sync_bucket(&mut before.gaps, i, &shared.gaps),
                Touched::Age(i) => self.ages.sync_bucket(&mut before.ages, i, &shared.ages),
            };
            if delta > 0 {
                export(bucket, delta);
            }
        }
    }

    /// Visible events.
    pub fn visible_events(&self) -> u64 {
        self.scalars[VISIBLE_EVENTS]
    }

    /// Bytes of visible events.
    pub fn visible_bytes(&self) -> u64 {
        self.scalars[VISIBLE_BYTES]
    }

    /// Hidden events (output the user does not see, such as reasoning).
    pub fn hidden_events(&self) -> u64 {
        self.scalars[HIDDEN_EVENTS]
    }

    /// Bytes of hidden events.
    pub fn hidden_bytes(&self) -> u64 {
        self.scalars[HIDDEN_BYTES]
    }

    /// Control events (heartbeats, end frames).
    pub fn control_events(&self) -> u64 {
        self.scalars[CONTROL_EVENTS]
    }

    /// Bytes of control events.
    pub fn control_bytes(&self) -> u64 {
        self.scalars[CONTROL_BYTES]
    }

    /// The gaps between consecutive visible events (and, when the hop's stall threshold is
    /// reached, the stalls among them).
    pub fn gaps(&self) -> &Histogram {
        &self.gaps
    }

    /// The longest gap.
    pub fn max_gap(&self) -> Duration {
        Duration::from_nanos(self.scalars[MAX_GAP])
    }

    /// Gaps at or above the hop's stall threshold.
    pub fn stalls(&self) -> u64 {
        self.scalars[STALLS]
    }

    /// The longest time between two events that were visible or hidden: a stream in a long
    /// hidden reasoning phase has long gaps but short quiet spells.
    pub fn max_quiet(&self) -> Duration {
        Duration::from_nanos(self.scalars[MAX_QUIET])
    }

    /// Gaps by output position class (see [`POSITION_CLASSES`]).
    pub fn by_position(&self) -> [PositionGaps; 5] {
        std::array::from_fn(|class| PositionGaps {
            class: POSITION_CLASSES[class],
            gaps: self.scalars[POS_GAPS + class],
            total: Duration::from_nanos(self.scalars[POS_TOTAL + class]),
            max: Duration::from_nanos(self.scalars[POS_MAX + class]),
            stalls: self.scalars[POS_STALLS + class],
        })
    }

    /// How long events waited in the gate before this hop took them (when the gate stamps its
    /// events: [`Gate::stamp_events`](crate::Gate::stamp_events)).
    pub fn buffer_age(&self) -> &Histogram {
        &self.ages
    }

    /// The longest wait in the gate.
    pub fn max_buffer_age(&self) -> Duration {
        Duration::from_nanos(self.scalars[MAX_AGE])
    }

    /// The most events ever waiting in the gate when this hop took one.
    pub fn peak_waiting(&self) -> u64 {
        self.scalars[PEAK_WAITING]
    }
}

impl std::fmt::Debug for GapCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GapCounters")
            .field("visible_events", &self.visible_events())
            .field("hidden_events", &self.hidden_events())
            .field("control_events", &self.control_events())
            .field("gaps", &self.gaps)
            .field("max_gap", &self.max_gap())
            .field("stalls", &self.stalls())
            .field("max_quiet", &self.max_quiet())
            .field("max_buffer_age", &self.max_buffer_age())
            .finish_non_exhaustive()
    }
}

/// The same counters shared by every stream through a hop: atomics, added to in batches.
pub(crate) struct SharedCounters {
    scalars: [AtomicU64; SCALARS],
    gaps: AtomicHistogram,
    ages: AtomicHistogram,
}

impl SharedCounters {
    pub(crate) fn new() -> Self {
        SharedCounters {
            scalars: std::array::from_fn(|_| AtomicU64::new(0)),
            gaps: AtomicHistogram::new(),
            ages: AtomicHistogram::new(),
        }
    }

    pub(crate) fn snapshot(&self) -> GapCounters {
        GapCounters {
            scalars: std::array::from_fn(|i| self.scalars[i].load(Ordering::Relaxed)),
            gaps: self.gaps.snapshot(),
            ages: self.ages.snapshot(),
        }
    }
}
