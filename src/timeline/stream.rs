//! One request at one hop: a compact state, updated record by record, whose size does not grow
//! with healthy records.
//!
//! A healthy stream (seqs without holes, no stall, no hidden phase) is the fixed fields alone:
//! the run of seqs seen, the last progress and visible records, the end, and a sketch of its
//! short quiet spells. Holes in the seqs (a coalescing hop, dropped records), hidden phases and
//! stalls are *details*, kept in a box allocated only when a stream has one, and counted
//! against the timeline's detail budget. When the budget is spent, the stream remembers from
//! which seq on it knows less, and every answer that needs more says "unknown".

use crate::probe::RecordKind;

use super::problems::{ProblemKind, ProblemLog};
use super::table::HopTable;

/// No end reason.
pub(super) const NO_REASON: u16 = u16::MAX;

/// Idle time an end record may claim beyond what its hop's records show (a writer that reads
/// its clock twice).
const IDLE_SLACK_NS: u64 = 1_000_000;

/// Windows of the sketch of short quiet spells.
const SKETCH: usize = 8;

/// Details (ranges of seqs, stalls) the timeline may still keep, over all streams.
#[derive(Debug, Clone)]
pub(super) struct Budget {
    pub(super) left: u64,
}

impl Budget {
    fn take(&mut self) -> bool {
        match self.left.checked_sub(1) {
            Some(left) => {
                self.left = left;
                true
            }
            None => false,
        }
    }

    fn give(&mut self) {
        self.left = self.left.saturating_add(1);
    }
}

/// A quiet spell at or above the stall threshold at one hop: between the progress record
/// `after` (`None`: the stream's start at the hop) and the progress record `seq` (`None`: the
/// stream's end record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Spell {
    pub(super) after: Option<u64>,
    pub(super) seq: Option<u64>,
    pub(super) quiet_ns: u64,
    /// For a spell the stream ended in: its end reason.
    pub(super) reason: u16,
}

/// One record, as the state needs it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rec {
    pub(super) seq: u64,
    pub(super) t_ns: u64,
    pub(super) kind: RecordKind,
    /// For an end record: the interned reason and the idle time.
    pub(super) end: Option<(u16, u64)>,
    /// The interned source it came from.
    pub(super) source: u16,
}

/// What a record is checked and counted against.
pub(super) struct Ctx<'a> {
    pub(super) stall_ns: u64,
    pub(super) budget: &'a mut Budget,
    pub(super) table: &'a mut HopTable,
    pub(super) problems: &'a mut ProblemLog,
    pub(super) source: &'a str,
    pub(super) line: Option<u64>,
    pub(super) request: &'a str,
    pub(super) hop: &'a str,
}

impl Ctx<'_> {
    fn problem(&mut self, kind: ProblemKind, message: impl FnOnce() -> String) {
        let (request, hop) = (self.request, self.hop);
        self.problems.add(kind, self.source, self.line, || {
            format!("request `{request}` at {hop}: {}", message())
        });
    }
}

/// Sorted, disjoint, non-adjacent inclusive ranges of seqs.
#[derive(Debug, Clone, Default)]
pub(super) struct RangeSet {
    ranges: Vec<(u64, u64)>,
}

impl RangeSet {
    /// Adds `seq`; `false` when that needed a new range and the budget had none.
    fn insert(&mut self, seq: u64, budget: &mut Budget) -> bool {
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

    /// Adds a range above every range held (one detail).
    fn push_highest(&mut self, range: (u64, u64)) {
        debug_assert!(self.ranges.last().is_none_or(|&(_, hi)| hi < range.0));
        self.ranges.push(range);
    }

    fn contains(&self, seq: u64) -> bool {
        let at = self.ranges.partition_point(|&(lo, _)| lo <= seq);
        at > 0 && self.ranges[at - 1].1 >= seq
    }

    /// Whether a range meets `lo..=hi`.
    fn meets(&self, lo: u64, hi: u64) -> bool {
        let at = self.ranges.partition_point(|&(_, end)| end < lo);
        at < self.ranges.len() && self.ranges[at].0 <= hi
    }

    fn first(&self) -> Option<u64> {
        self.ranges.first().map(|&(lo, _)| lo)
    }

    fn pop_if_adjacent_below(&mut self, seq: u64) -> Option<u64> {
        match self.ranges.last() {
            Some(&(lo, hi)) if hi.checked_add(1) == Some(seq) => {
                self.ranges.pop();
                Some(lo)
            }
            _ => None,
        }
    }
}

/// A stream's details: only streams that have one allocate this.
#[derive(Debug, Clone, Default)]
struct Extra {
    /// Covered seqs below the stream's highest run.
    earlier: RangeSet,
    /// Seqs of hidden records.
    hidden: RangeSet,
    /// Quiet spells at or above the threshold.
    spells: Vec<Spell>,
    /// Quiet spells below the threshold but at or above a tenth of it, kept exactly so that
    /// the sketch only ever bounds shorter ones.
    notable: Vec<Spell>,
}

// Flags.
const RECORD: u16 = 1; // the current segment has a record
const COVERED: u16 = 1 << 1; // `run` holds seqs
const PROGRESS: u16 = 1 << 2; // the current segment has a progress record
const VISIBLE: u16 = 1 << 3; // the current segment has a visible record
const LAST_VISIBLE: u16 = 1 << 4; // the last progress record was visible
const ENDED: u16 = 1 << 5; // the current segment has ended
const HAD_END: u16 = 1 << 6; // some segment had an end record
const LOST: u16 = 1 << 7; // details from `lost_from` on were not all kept
const SKETCHED: u16 = 1 << 8; // the sketch holds something
const SKETCH_BELOW: u16 = 1 << 9; // a quiet below the sketch's base went into its first window
const WINDOWED: u16 = 1 << 10; // read under a --since window
const ANY_HIDDEN: u16 = 1 << 11; // some segment had a hidden record
const ANY_VISIBLE: u16 = 1 << 12; // some segment had a visible record

/// One request at one hop.
#[derive(Debug, Clone)]
pub(super) struct Stream {
    /// The hop's index in the path.
    pub(super) hop: u8,
    /// The sketch's window width: `1 << shift` seqs.
    shift: u8,
    flags: u16,
    /// The interned source of the current segment.
    source: u16,
    /// The last end record's interned reason.
    reason: u16,
    /// Visible events seen in the current segment: the output position of the next.
    visible: u32,
    /// The current segment's last record.
    last_seq: u64,
    last_t: u64,
    /// The highest run of consecutive seqs seen.
    run: (u64, u64),
    /// The current segment's last progress record.
    progress_seq: u64,
    progress_t: u64,
    /// The current segment's last visible record's time.
    visible_t: u64,
    /// The highest seq of a visible record (with `ANY_VISIBLE`).
    visible_seq: u64,
    /// The last end record's idle time (cut to what the records allow).
    end_idle: u64,
    /// With `LOST`: the first seq about which details may be missing.
    lost_from: u64,
    /// The sketch: window `i` holds 1 + the longest short quiet spell (in µs, rounded up)
    /// ending at a seq in `base + i << shift ..`, or 0.
    base: u64,
    sketch: [u32; SKETCH],
    extra: Option<Box<Extra>>,
}

impl Stream {
    pub(super) fn new(hop: u8, source: u16, windowed: bool) -> Self {
        Stream {
            hop,
            shift: 0,
            flags: if windowed { WINDOWED } else { 0 },
            source,
            reason: NO_REASON,
            visible: 0,
            last_seq: 0,
            last_t: 0,
            run: (0, 0),
            progress_seq: 0,
            progress_t: 0,
            visible_t: 0,
            visible_seq: 0,
            end_idle: 0,
            lost_from: u64::MAX,
            base: 0,
            sketch: [0; SKETCH],
            extra: None,
        }
    }

    fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }

    fn set(&mut self, flag: u16, on: bool) {
        if on {
            self.flags |= flag;
        } else {
            self.flags &= !flag;
        }
    }

    fn extra(&mut self) -> &mut Extra {
        self.extra.get_or_insert_with(Default::default)
    }

    /// Checks `rec` against the stream and takes it in, or reports why not. Returns whether it
    /// was taken.
    pub(super) fn add(&mut self, rec: &Rec, cx: &mut Ctx<'_>) -> bool {
        if self.has(ENDED) {
            // Records after an end: a resumed stream (a new subscriber, in another process or
            // later on this one's clock) starts a new segment. Anything else is stray.
            if rec.source != self.source || rec.t_ns > self.last_t {
                self.flags &= !(RECORD | PROGRESS | VISIBLE | LAST_VISIBLE | ENDED);
                self.visible = 0;
                self.source = rec.source;
                cx.table.resumes = cx.table.resumes.saturating_add(1);
            } else {
                let (seq, end) = (rec.seq, self.last_seq);
                let (kind, what) = if rec.kind == RecordKind::End && seq == end {
                    (ProblemKind::Duplicate, "a second end record")
                } else {
                    (ProblemKind::AfterEnd, "a record")
                };
                cx.problem(kind, || {
                    format!("{what} (seq {seq}) after the end record (seq {end}), no later and from the same source")
                });
                return false;
            }
        }
        if self.has(RECORD) {
            let (seq, last) = (rec.seq, self.last_seq);
            let refused = if rec.kind == RecordKind::End {
                // One past the last seq, which saturates at u64::MAX.
                let past = seq > last || (seq == u64::MAX && last == u64::MAX);
                (!past).then_some(ProblemKind::OutOfOrder)
            } else if seq == last {
                Some(ProblemKind::Duplicate)
            } else {
                (seq < last).then_some(ProblemKind::OutOfOrder)
            };
            if let Some(kind) = refused {
                cx.problem(kind, || match (kind, rec.kind) {
                    (_, RecordKind::End) => {
                        format!("end record at seq {seq}, not past the last seq {last}")
                    }
                    (ProblemKind::Duplicate, _) => format!("seq {seq} recorded twice"),
                    _ => format!("seq {seq} after seq {last}"),
                });
                return false;
            }
            let (t, last_t) = (rec.t_ns, self.last_t);
            if t < last_t {
                cx.problem(ProblemKind::TimeBackwards, || {
                    format!("t_ns {t} at seq {seq} is before t_ns {last_t} at seq {last}")
                });
                return false;
            }
        }
        match rec.end {
            Some((reason, idle)) => self.end(rec, reason, idle, cx),
            None => self.event(rec, cx),
        }
        self.source = rec.source;
        self.last_seq = rec.seq;
        self.last_t = rec.t_ns;
        self.flags |= RECORD;
        true
    }

    fn event(&mut self, rec: &Rec, cx: &mut Ctx<'_>) {
        let (seq, t) = (rec.seq, rec.t_ns);
        if let Err(from) = self.cover(seq, cx.budget) {
            self.lose(from, cx);
        }
        if rec.kind == RecordKind::Hidden {
            self.flags |= ANY_HIDDEN;
            if !self.extra().hidden.insert(seq, cx.budget) {
                self.lose(seq, cx);
            }
        }
        if !matches!(rec.kind, RecordKind::Visible | RecordKind::Hidden) {
            return;
        }
        if self.has(PROGRESS) {
            // t >= the last record's time >= the last progress record's time.
            let quiet = t.saturating_sub(self.progress_t);
            if quiet >= cx.stall_ns {
                let spell = Spell {
                    after: Some(self.progress_seq),
                    seq: Some(seq),
                    quiet_ns: quiet,
                    reason: NO_REASON,
                };
                self.spell(spell, cx);
            } else if quiet >= cx.stall_ns / 10 && cx.budget.take() {
                let spell = Spell {
                    after: Some(self.progress_seq),
                    seq: Some(seq),
                    quiet_ns: quiet,
                    reason: NO_REASON,
                };
                self.extra().notable.push(spell);
            } else {
                // Short (or no budget left to keep it exactly).
                self.sketch(seq, quiet);
            }
        }
        self.progress_seq = seq;
        self.progress_t = t;
        self.flags |= PROGRESS;
        let visible = rec.kind == RecordKind::Visible;
        if visible {
            if self.has(VISIBLE) {
                cx.table.gap(self.visible, t.saturating_sub(self.visible_t));
            }
            self.visible_t = t;
            if !self.has(ANY_VISIBLE) || seq > self.visible_seq {
                self.visible_seq = seq;
            }
            self.flags |= ANY_VISIBLE;
            self.visible = self.visible.saturating_add(1);
            self.flags |= VISIBLE;
        }
        self.set(LAST_VISIBLE, visible);
    }

    fn end(&mut self, rec: &Rec, reason: u16, idle: u64, cx: &mut Ctx<'_>) {
        // The idle time runs on the hop's clock: since the last progress record, or since the
        // stream began there, which is after the clock's start.
        let (bound, since) = if self.has(PROGRESS) {
            (
                rec.t_ns.saturating_sub(self.progress_t),
                Some(self.progress_seq),
            )
        } else {
            (rec.t_ns, None)
        };
        if idle > bound.saturating_add(IDLE_SLACK_NS) {
            cx.problem(ProblemKind::BadIdle, || match since {
                Some(seq) => format!(
                    "end record idle {idle} ns, but seq {seq}'s record is only {bound} ns before it: cut to that"
                ),
                None => format!(
                    "end record idle {idle} ns, longer than its clock has run ({bound} ns): cut to that"
                ),
            });
        }
        let idle = idle.min(bound);
        if idle >= cx.stall_ns {
            let spell = Spell {
                after: since,
                seq: None,
                quiet_ns: idle,
                reason,
            };
            self.spell(spell, cx);
        }
        if self.has(LAST_VISIBLE) {
            cx.table.gap(self.visible, idle);
        }
        self.end_idle = idle;
        self.reason = reason;
        self.flags |= ENDED | HAD_END;
    }

    /// Adds `seq` to the seqs seen; `Err(from)` when a hole could not be kept and what is known
    /// of seqs from `from` on is incomplete.
    fn cover(&mut self, seq: u64, budget: &mut Budget) -> Result<(), u64> {
        if !self.has(COVERED) {
            self.run = (seq, seq);
            self.flags |= COVERED;
            return Ok(());
        }
        let (lo, hi) = self.run;
        if seq >= lo {
            if seq <= hi {
                return Ok(());
            }
            if hi.checked_add(1) == Some(seq) {
                self.run.1 = seq;
                return Ok(());
            }
            // A hole: the run below it becomes a detail.
            if !budget.take() {
                return Err(hi.saturating_add(1));
            }
            self.extra().earlier.push_highest((lo, hi));
            self.run = (seq, seq);
            return Ok(());
        }
        if seq.checked_add(1) == Some(lo) {
            self.run.0 = seq;
            if let Some(extra) = &mut self.extra {
                if let Some(below) = extra.earlier.pop_if_adjacent_below(seq) {
                    self.run.0 = below;
                    budget.give();
                }
            }
            return Ok(());
        }
        if self.extra().earlier.insert(seq, budget) {
            Ok(())
        } else {
            Err(seq)
        }
    }

    fn spell(&mut self, spell: Spell, cx: &mut Ctx<'_>) {
        cx.table.quiet_spells = cx.table.quiet_spells.saturating_add(1);
        if cx.budget.take() {
            self.extra().spells.push(spell);
            return;
        }
        let after = spell.after.unwrap_or(0);
        cx.problem(ProblemKind::DetailLimit, || {
            let after = spell
                .after
                .map_or("the start".to_owned(), |s| format!("seq {s}"));
            format!("a stall after {after} not analysed: the detail budget is spent")
        });
        self.lose(after, cx);
    }

    /// Notes that details from `from` on are not all kept (reported once per stream).
    fn lose(&mut self, from: u64, cx: &mut Ctx<'_>) {
        if !self.has(LOST) {
            cx.problem(ProblemKind::DetailLimit, || {
                format!("details from seq {from} on not all kept (detail budget spent): what needs them is unknown")
            });
        }
        self.flags |= LOST;
        self.lost_from = self.lost_from.min(from);
    }

    fn sketch(&mut self, seq: u64, quiet_ns: u64) {
        if !self.has(SKETCHED) {
            self.base = seq;
            self.flags |= SKETCHED;
        }
        if seq < self.base {
            self.flags |= SKETCH_BELOW;
        }
        let offset = seq.saturating_sub(self.base);
        // Widen the windows until the seq fits: shift stops at 61 at the latest, where any
        // u64 offset fits.
        while offset >> self.shift >= SKETCH as u64 {
            for i in 0..SKETCH / 2 {
                self.sketch[i] = self.sketch[2 * i].max(self.sketch[2 * i + 1]);
            }
            self.sketch[SKETCH / 2..].fill(0);
            self.shift += 1;
        }
        let micros = quiet_ns.div_ceil(1000).saturating_add(1);
        let value = u32::try_from(micros).unwrap_or(u32::MAX);
        let cell = &mut self.sketch[(offset >> self.shift) as usize];
        *cell = (*cell).max(value);
    }

    // ---- Questions blame asks.

    /// The quiet spells at or above the threshold that were kept.
    pub(super) fn spells(&self) -> &[Spell] {
        self.extra.as_ref().map_or(&[], |extra| &extra.spells)
    }

    /// Whether the hop recorded `seq`: `None` when that is not known (details lost).
    pub(super) fn covers(&self, seq: u64) -> Option<bool> {
        let known = self.has(COVERED)
            && ((self.run.0..=self.run.1).contains(&seq)
                || self.extra.as_ref().is_some_and(|e| e.earlier.contains(seq)));
        if known {
            Some(true)
        } else if self.lost_at(seq) {
            None
        } else {
            Some(false)
        }
    }

    /// The lowest seq recorded.
    pub(super) fn first_seq(&self) -> Option<u64> {
        if !self.has(COVERED) {
            return None;
        }
        let earlier = self.extra.as_ref().and_then(|e| e.earlier.first());
        Some(earlier.unwrap_or(self.run.0))
    }

    /// Whether details from `seq` on may be missing.
    fn lost_at(&self, seq: u64) -> bool {
        self.has(LOST) && seq >= self.lost_from
    }

    /// The first seq from which details may be missing.
    pub(super) fn lost_from(&self) -> Option<u64> {
        self.has(LOST).then_some(self.lost_from)
    }

    pub(super) fn had_end(&self) -> bool {
        self.has(HAD_END)
    }

    pub(super) fn windowed(&self) -> bool {
        self.has(WINDOWED)
    }

    /// Whether the hop recorded a hidden event of the request (it carries hidden events).
    pub(super) fn carries_hidden(&self) -> bool {
        self.has(ANY_HIDDEN)
    }

    /// Whether the hop recorded a visible event after `after` (`None`: at all).
    pub(super) fn visible_after(&self, after: Option<u64>) -> bool {
        self.has(ANY_VISIBLE) && after.is_none_or(|p| self.visible_seq > p)
    }

    /// Whether a kept spell lies within the span from `after` to `seq`: it starts at or after
    /// `after` and ends at or before `seq` (an end spell counts for a span to the end, unless
    /// it began before `after`). `None` when spells past `lost_from` may be missing.
    pub(super) fn stalled_within(&self, after: Option<u64>, seq: Option<u64>) -> Option<bool> {
        let within = |spell: &Spell| {
            let starts = match (after, spell.after) {
                (None, _) => true,
                (Some(_), None) => spell.seq.is_none(), // a stream quiet from its start to its end
                (Some(p), Some(a)) => a >= p,
            };
            let ends = match (seq, spell.seq) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(s), Some(b)) => b <= s,
            };
            starts && ends
        };
        if self.spells().iter().any(within) {
            return Some(true);
        }
        let last = seq.unwrap_or(u64::MAX);
        if self.lost_at(last) {
            None
        } else {
            Some(false)
        }
    }

    /// Whether the hop has a hidden record strictly between `after` and `seq` (`None` for
    /// either end: open). `None` when that is not known.
    pub(super) fn hidden_between(&self, after: Option<u64>, seq: Option<u64>) -> Option<bool> {
        let lo = match after {
            None => Some(0),
            Some(p) => p.checked_add(1),
        };
        let hi = match seq {
            None => Some(u64::MAX),
            Some(s) => s.checked_sub(1),
        };
        let (Some(lo), Some(hi)) = (lo, hi) else {
            return Some(false);
        };
        if lo > hi {
            return Some(false);
        }
        if self.extra.as_ref().is_some_and(|e| e.hidden.meets(lo, hi)) {
            return Some(true);
        }
        if self.lost_at(hi) { None } else { Some(false) }
    }

    /// The hop's longest quiet spell below the threshold that ended at a seq in
    /// `after+1..=seq` (`seq` `None`: to the end, the last end record's idle time included), and
    /// whether that is exact rather than an upper bound. Spells of a tenth of the threshold or
    /// more are kept exactly; shorter ones are bounded by the sketch's windows, exact (to the
    /// microsecond) while the windows are one seq wide.
    pub(super) fn quiet_within(&self, after: Option<u64>, seq: Option<u64>) -> Option<(u64, bool)> {
        let max = |a: Option<u64>, b: u64| Some(a.map_or(b, |a| a.max(b)));
        let mut known: Option<u64> = None; // exact values
        let mut bound: Option<u64> = None; // the sketch's, an upper bound
        let mut bound_exact = true;
        let from = match after {
            None => Some(0),
            Some(p) => p.checked_add(1),
        };
        let to = seq.unwrap_or(u64::MAX);
        if let Some(from) = from.filter(|&from| from <= to) {
            if let Some(extra) = &self.extra {
                for spell in &extra.notable {
                    if spell.seq.is_some_and(|b| (from..=to).contains(&b)) {
                        known = max(known, spell.quiet_ns);
                    }
                }
            }
            if self.has(SKETCHED) {
                let first = (from.saturating_sub(self.base) >> self.shift) as usize;
                let last = ((to.saturating_sub(self.base) >> self.shift) as usize).min(SKETCH - 1);
                if first < SKETCH {
                    for &cell in &self.sketch[first..=last] {
                        if cell > 0 {
                            bound = max(bound, u64::from(cell - 1).saturating_mul(1000));
                            bound_exact &= cell < u32::MAX;
                        }
                    }
                }
                bound_exact &= self.shift == 0 && !self.has(SKETCH_BELOW);
            }
        }
        if seq.is_none() && self.has(HAD_END) {
            known = max(known, self.end_idle);
        }
        match (known, bound) {
            (None, None) => None,
            (Some(known), None) => Some((known, true)),
            // Every sketched spell is at most the bound: the known one is the longest.
            (Some(known), Some(bound)) if known >= bound => Some((known, true)),
            (_, Some(bound)) => Some((bound, bound_exact)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_healthy_stream_is_its_fixed_fields() {
        // The size the docs quote (a request at a hop: about 150 bytes).
        assert!(
            std::mem::size_of::<Stream>() <= 160,
            "{}",
            std::mem::size_of::<Stream>()
        );
        let mut budget = Budget { left: 0 };
        let mut stream = Stream::new(0, 0, false);
        for seq in 0..10_000 {
            stream.cover(seq, &mut budget).unwrap();
            stream.sketch(seq, seq);
        }
        assert!(stream.extra.is_none(), "no detail for contiguous seqs");
    }

    #[test]
    fn range_sets_merge_and_count_their_ranges() {
        let mut budget = Budget { left: 3 };
        let mut set = RangeSet::default();
        for seq in [5, 7, 6, 1, u64::MAX, 2, 0] {
            assert!(set.insert(seq, &mut budget), "{seq}");
        }
        assert_eq!(set.ranges, vec![(0, 2), (5, 7), (u64::MAX, u64::MAX)]);
        assert_eq!(budget.left, 0);
        assert!(!set.insert(10, &mut budget), "no budget for a new range");
        assert!(set.insert(8, &mut budget), "extending needs none");
        assert!(set.insert(4, &mut budget) && set.insert(3, &mut budget));
        assert_eq!(set.ranges, vec![(0, 8), (u64::MAX, u64::MAX)]);
        assert_eq!(budget.left, 1, "the merge gave one back");
        assert!(set.contains(u64::MAX) && set.contains(0) && !set.contains(9));
        assert!(set.meets(9, u64::MAX) && set.meets(8, 8) && !set.meets(9, u64::MAX - 1));
    }

    #[test]
    fn spells_within_a_span_start_and_end_inside_it() {
        let mut stream = Stream::new(1, 0, false);
        let spells = [
            (Some(4), Some(5)),
            (Some(9), None),
            (None, None), // a segment without progress, quiet from its start to its end
        ];
        stream.extra().spells = spells
            .iter()
            .map(|&(after, seq)| Spell {
                after,
                seq,
                quiet_ns: 1,
                reason: NO_REASON,
            })
            .collect();
        assert_eq!(stream.stalled_within(Some(4), Some(5)), Some(true));
        assert_eq!(stream.stalled_within(Some(3), Some(6)), Some(true));
        assert_eq!(stream.stalled_within(Some(5), Some(9)), Some(false));
        assert_eq!(stream.stalled_within(Some(4), Some(4)), Some(false));
        assert_eq!(stream.stalled_within(None, Some(4)), Some(false));
        // A span to the end: the end spells count, whatever came before.
        assert_eq!(stream.stalled_within(Some(10), None), Some(true));
        stream.extra().spells.truncate(2);
        assert_eq!(stream.stalled_within(Some(10), None), Some(false));
        assert_eq!(stream.stalled_within(Some(9), None), Some(true));
        // Spells past the budget are unknown.
        stream.flags |= LOST;
        stream.lost_from = 20;
        assert_eq!(stream.stalled_within(Some(10), None), None);
        assert_eq!(stream.stalled_within(Some(10), Some(19)), Some(false));
    }

    #[test]
    fn the_sketch_widens_and_bounds_from_above() {
        let mut stream = Stream::new(0, 0, false);
        stream.sketch(1, 5_000_000);
        assert_eq!(
            stream.quiet_within(Some(0), Some(1)),
            Some((5_000_000, true))
        );
        assert_eq!(stream.quiet_within(Some(1), Some(2)), None);
        for seq in 2..100 {
            stream.sketch(seq, 1_000 * seq);
        }
        stream.sketch(u64::MAX, 7);
        assert_eq!(stream.shift, 61);
        let (longest, exact) = stream.quiet_within(Some(0), Some(1)).unwrap();
        assert!(longest >= 5_000_000 && !exact);
        stream.sketch(0, 9_000_000);
        assert_eq!(
            stream.quiet_within(Some(0), Some(1)),
            Some((9_000_000, false))
        );
    }
}
