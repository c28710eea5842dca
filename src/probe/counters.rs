//! Gap counters: what a hop saw of every stream through it, and the batch of one stream's
//! counts not yet added to it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::histogram::{AtomicHistogram, BUCKETS, Histogram, bucket};
use crate::chunk::Kind;

/// Output position classes: which part of a response a gap fell in. Long outputs that freeze
/// late (KV pressure, a gateway buffer threshold) show up in the last classes.
pub const POSITION_CLASSES: [&str; 5] = ["0-63", "64-255", "256-1023", "1024-4095", "4096+"];

/// The position class of visible event number `position` (0-based).
fn position_class(position: u64) -> usize {
    match position {
        0..64 => 0,
        64..256 => 1,
        256..1024 => 2,
        1024..4096 => 3,
        _ => 4,
    }
}

// The scalar counters, by index: one array, so that batches and snapshots are one loop.
const VISIBLE_EVENTS: usize = 0;
const VISIBLE_BYTES: usize = 1;
const HIDDEN_EVENTS: usize = 2;
const HIDDEN_BYTES: usize = 3;
const CONTROL_EVENTS: usize = 4;
const CONTROL_BYTES: usize = 5;
const STALLS: usize = 6;
const STALLS_AT_END: usize = 7;
const MAX_GAP: usize = 8;
const MAX_QUIET: usize = 9;
const MAX_AGE: usize = 10;
const AGE_TOTAL: usize = 11;
const PEAK_WAITING: usize = 12;
const POS_GAPS: usize = 13;
const POS_TOTAL: usize = POS_GAPS + 5;
const POS_MAX: usize = POS_TOTAL + 5;
const POS_STALLS: usize = POS_MAX + 5;
const SCALARS: usize = POS_STALLS + 5;

/// Whether scalar `index` keeps a maximum rather than a sum.
fn is_max(index: usize) -> bool {
    matches!(index, MAX_GAP | MAX_QUIET | MAX_AGE | PEAK_WAITING)
        || (POS_MAX..POS_STALLS).contains(&index)
}

/// The most events a stream counts before its batch is added to the hop.
pub(crate) const FLUSH_EVERY: usize = 64;

/// What a hop saw: events and bytes by kind, the visible-gap histogram, its maximum, stalls,
/// gaps by output position, how long events waited in a gate, and how many waited.
///
/// A *gap* is the time between two consecutive visible events at this hop, on this hop's
/// monotonic clock, and, at a stream's end, the time from its last visible event to the end
/// (when no hidden event came after it).
/// A *quiet spell* is a time without any visible or hidden event; one at or above the hop's
/// stall threshold is a *stall*, including the one a stream ended in (a user who left after
/// 40 s of nothing). Hidden events (a reasoning phase) keep a stream alive: a long reasoning
/// phase is a long gap but not a stall. Control events (heartbeats, end frames) are counted
/// only.
///
/// # Examples
///
/// A stream that froze for two seconds at its fourth token, then went on:
///
/// ```
/// use std::time::{Duration, Instant};
/// use streamgate::probe::{HopProbe, Observation};
/// use streamgate::{EndReason, Kind};
///
/// let hop = HopProbe::new("client.recv"); // stalls from 1 s on
/// let mut recorder = hop.recorder("req-1");
/// let start = Instant::now();
/// let ms = Duration::from_millis;
/// for (seq, at) in [0, 20, 40, 2_040, 2_060].into_iter().enumerate() {
///     let token = Observation::new(Some(seq as u64), 3, Kind::Visible);
///     recorder.observe_at(token, start + ms(at));
/// }
/// recorder.end_at(EndReason::Completed, start + ms(2_060));
///
/// let counters = hop.snapshot().counters;
/// assert_eq!(counters.visible_events(), 5);
/// // Four gaps between the tokens, and the last one, to the end (zero here).
/// assert_eq!(counters.gaps().count(), 5);
/// assert_eq!(counters.max_gap(), ms(2_000));
/// assert_eq!((counters.stalls(), counters.stalls_at_end()), (1, 0));
/// // All of it early in the output: the first position class, 0-63.
/// let early = counters.by_position()[0];
/// assert_eq!((early.class, early.gaps, early.stalls), ("0-63", 5, 1));
/// assert_eq!(early.max, ms(2_000));
/// assert_eq!(counters.by_position()[1].gaps, 0);
/// ```
#[derive(Clone, PartialEq, Eq)]
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
    /// How many gaps ended at (or, for a stream's last gap, after) a visible event in this
    /// class.
    pub gaps: u64,
    /// Their sum.
    pub total: Duration,
    /// The longest.
    pub max: Duration,
    /// How many stalls ended in this class.
    pub stalls: u64,
}

impl Default for GapCounters {
    fn default() -> Self {
        GapCounters {
            scalars: [0; SCALARS],
            gaps: Histogram::default(),
            ages: Histogram::default(),
        }
    }
}

impl GapCounters {
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

    /// The visible gaps, each stream's last one (to its end, unless hidden events came after
    /// it) included.
    pub fn gaps(&self) -> &Histogram {
        &self.gaps
    }

    /// The longest gap.
    pub fn max_gap(&self) -> Duration {
        Duration::from_nanos(self.scalars[MAX_GAP])
    }

    /// Quiet spells at or above the hop's stall threshold, the ones streams ended in included.
    pub fn stalls(&self) -> u64 {
        self.scalars[STALLS]
    }

    /// Streams that ended in a stall: quiet for at least the stall threshold when they ended.
    pub fn stalls_at_end(&self) -> u64 {
        self.scalars[STALLS_AT_END]
    }

    /// The longest quiet spell (no visible or hidden event), a stream's last one included: a
    /// stream in a long hidden reasoning phase has long gaps but short quiet spells.
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
            .field("stalls_at_end", &self.stalls_at_end())
            .field("max_quiet", &self.max_quiet())
            .field("max_buffer_age", &self.max_buffer_age())
            .finish_non_exhaustive()
    }
}

/// One stream's counts since they were last added to its hop: sums and maxima of the batch,
/// and the histogram bucket of each gap and wait in it (a byte each), not a copy of the
/// totals. Filled with plain arithmetic; [`SharedCounters::add`] empties it.
#[derive(Clone)]
pub(crate) struct Batch {
    scalars: [u64; SCALARS],
    /// One more than [`FLUSH_EVERY`]: a stream's last gap, at its end.
    gap_buckets: [u8; FLUSH_EVERY + 1],
    age_buckets: [u8; FLUSH_EVERY],
    gaps: u8,
    ages: u8,
    events: u8,
}

impl Batch {
    pub(crate) fn new() -> Self {
        Batch {
            scalars: [0; SCALARS],
            gap_buckets: [0; FLUSH_EVERY + 1],
            age_buckets: [0; FLUSH_EVERY],
            gaps: 0,
            ages: 0,
            events: 0,
        }
    }

    /// Counts one event of `kind` and `bytes`; returns whether the batch is full.
    pub(crate) fn count_event(&mut self, kind: Kind, bytes: u64) -> bool {
        let (events, sum) = match kind {
            Kind::Visible => (VISIBLE_EVENTS, VISIBLE_BYTES),
            Kind::Hidden => (HIDDEN_EVENTS, HIDDEN_BYTES),
            Kind::Control => (CONTROL_EVENTS, CONTROL_BYTES),
        };
        self.add(events, 1);
        self.add(sum, bytes);
        self.events += 1;
        usize::from(self.events) >= FLUSH_EVERY
    }

    /// Records a visible gap of `ns` ending at (or, at the end, after) visible event number
    /// `position`.
    pub(crate) fn record_gap(&mut self, ns: u64, position: u64) {
        let class = position_class(position);
        self.gap_buckets[usize::from(self.gaps)] = bucket(ns) as u8;
        self.gaps += 1;
        self.max(MAX_GAP, ns);
        self.add(POS_GAPS + class, 1);
        self.add(POS_TOTAL + class, ns);
        self.max(POS_MAX + class, ns);
    }

    /// Records a quiet spell of `ns`, a stall or not, at visible position `position`, at the
    /// stream's end or not.
    pub(crate) fn record_quiet(&mut self, ns: u64, position: u64, stall: bool, at_end: bool) {
        self.max(MAX_QUIET, ns);
        if stall {
            self.add(STALLS, 1);
            self.add(POS_STALLS + position_class(position), 1);
            if at_end {
                self.add(STALLS_AT_END, 1);
            }
        }
    }

    /// Records that an event waited `ns` in a gate, with `waiting` events behind it.
    pub(crate) fn record_wait(&mut self, ns: u64, waiting: u64) {
        self.age_buckets[usize::from(self.ages)] = bucket(ns) as u8;
        self.ages += 1;
        self.add(AGE_TOTAL, ns);
        self.max(MAX_AGE, ns);
        self.max(PEAK_WAITING, waiting);
    }

    /// Whether nothing was counted since the last flush.
    pub(crate) fn is_empty(&self) -> bool {
        self.gaps == 0 && self.ages == 0 && self.scalars.iter().all(|value| *value == 0)
    }

    /// The histogram buckets of the batch's gaps.
    pub(crate) fn gap_buckets(&self) -> &[u8] {
        &self.gap_buckets[..usize::from(self.gaps)]
    }

    /// The histogram buckets of the batch's waits.
    pub(crate) fn age_buckets(&self) -> &[u8] {
        &self.age_buckets[..usize::from(self.ages)]
    }

    /// Events, bytes (visible, hidden, control) and stalls in the batch, for exporters.
    #[cfg(feature = "metrics")]
    pub(crate) fn sums(&self) -> ([u64; 3], [u64; 3], u64) {
        let s = &self.scalars;
        (
            [s[VISIBLE_EVENTS], s[HIDDEN_EVENTS], s[CONTROL_EVENTS]],
            [s[VISIBLE_BYTES], s[HIDDEN_BYTES], s[CONTROL_BYTES]],
            s[STALLS],
        )
    }

    fn add(&mut self, index: usize, value: u64) {
        self.scalars[index] = self.scalars[index].saturating_add(value);
    }

    fn max(&mut self, index: usize, value: u64) {
        self.scalars[index] = self.scalars[index].max(value);
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

    /// Adds a stream's batch and empties it: one atomic operation per non-zero scalar and per
    /// histogram bucket the batch's gaps and waits fell in.
    pub(crate) fn add(&self, batch: &mut Batch) {
        for (index, value) in batch.scalars.iter().enumerate() {
            if *value == 0 {
                continue;
            }
            if is_max(index) {
                self.scalars[index].fetch_max(*value, Ordering::Relaxed);
            } else {
                self.scalars[index].fetch_add(*value, Ordering::Relaxed);
            }
        }
        add_buckets(&self.gaps, batch.gap_buckets());
        add_buckets(&self.ages, batch.age_buckets());
        if batch.gaps > 0 {
            self.gaps.raise_max(batch.scalars[MAX_GAP]);
        }
        if batch.ages > 0 {
            self.ages.raise_max(batch.scalars[MAX_AGE]);
        }
        batch.scalars = [0; SCALARS];
        batch.gaps = 0;
        batch.ages = 0;
        batch.events = 0;
    }

    pub(crate) fn snapshot(&self) -> GapCounters {
        // Relaxed loads: a snapshot taken while streams flush may see part of a batch.
        let scalars = std::array::from_fn(|i| self.scalars[i].load(Ordering::Relaxed));
        GapCounters {
            scalars,
            gaps: self.gaps.snapshot(),
            ages: self.ages.snapshot(),
        }
    }
}

/// Adds `buckets` (a batch's bucket per gap or wait) to `histogram`, one atomic addition per
/// distinct bucket: a stream's gaps mostly fall in a few.
fn add_buckets(histogram: &AtomicHistogram, buckets: &[u8]) {
    per_bucket(buckets, |index, count| histogram.add(index, count));
}

/// Calls `each` once per distinct bucket in `buckets` (a batch's bucket per gap or wait), with
/// how many fell in it.
pub(crate) fn per_bucket(buckets: &[u8], mut each: impl FnMut(usize, u64)) {
    let mut counts = [0u8; BUCKETS];
    for &index in buckets {
        counts[usize::from(index)] += 1;
    }
    for &index in buckets {
        let count = std::mem::take(&mut counts[usize::from(index)]);
        if count > 0 {
            each(usize::from(index), u64::from(count));
        }
    }
}
