//! One request at one hop: a compact state, updated record by record, whose size does not grow
//! with healthy records.
//!
//! A healthy stream (seqs without holes, no stall, no hidden phase) is the fixed fields alone:
//! the run of seqs seen, the last progress and visible records, the end, and a sketch of its
//! short quiet spells. Holes in the seqs (a coalescing hop, dropped records), hidden phases and
//! stalls are *details*, kept in a box allocated only when a stream has one, and counted
//! against the timeline's detail budget. When the budget is spent, the stream remembers from
//! which seq on it knows less, and every answer that needs more says "unknown".
//!
//! After each stall that ends at a seq (at hops after the first), the stream also keeps a
//! *catch-up profile* (104 bytes, two details): the highest seq it recorded within 1, 1.5, 2,
//! 3, 4, 6, ... 768 times the stall threshold after the record that ended the stall, and how
//! soon its end record came. The hop before it asks it whether it was behind and caught up
//! (see `blame`). A stream keeps at most `MAX_SPELLS` stalls, so that judging one against the
//! stalls of the hops beside it stays cheap (a binary search while its stalls follow each
//! other in seq order, as they do unless a resume went back).

use crate::chunk::Kind;
use crate::end::EndReason;
use crate::probe::RecordKind;

use super::problems::{ProblemKind, ProblemLog};
use super::table::HopTable;

/// Idle time an end record may claim beyond what its hop's records show (a writer that reads
/// its clock twice).
const IDLE_SLACK_NS: u64 = 1_000_000;

/// Windows of the sketch of short quiet spells.
const SKETCH: usize = 8;

/// Steps of a catch-up profile: offsets of 1, 1.5, 2, 3, 4, 6, ... times the stall threshold,
/// the last 768 times it.
pub(super) const CATCH_UP_STEPS: usize = 20;
/// Details a catch-up profile counts for (it is about twice as large as a stall).
const CATCH_UP_DETAILS: u64 = 2;
/// Stalls kept per stream; later ones are counted, reported and not analysed, like those past
/// the detail budget.
pub(super) const MAX_SPELLS: usize = 256;

/// Offset `k` of a catch-up profile, for a stall threshold of `stall_ns`.
pub(super) fn catch_up_step(stall_ns: u64, k: usize) -> u64 {
    let octave = stall_ns.saturating_mul(1 << (k / 2));
    if k % 2 == 1 {
        octave.saturating_add(octave / 2)
    } else {
        octave
    }
}

/// Details (ranges of seqs, stalls) the timeline may still keep, over all streams.
#[derive(Debug, Clone)]
pub(super) struct Budget {
    pub(super) left: u64,
}

impl Budget {
    fn take(&mut self) -> bool {
        self.take_n(1)
    }

    fn take_n(&mut self, n: u64) -> bool {
        match self.left.checked_sub(n) {
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
    pub(super) reason: Option<EndReason>,
    /// Whether the progress record `after` was visible (not hidden).
    pub(super) after_visible: bool,
}

impl Spell {
    /// Whether the spell lies within the span from `after` to `seq`: it starts at or after
    /// `after` and ends at or before `seq` (an end spell counts for a span to the end, unless
    /// it began before `after`).
    pub(super) fn within(&self, after: Option<u64>, seq: Option<u64>) -> bool {
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
    pub(super) fn ahead_of(&self, numbered: u64, carries_hidden: bool) -> bool {
        self.after.is_some_and(|p| p >= numbered) && (self.after_visible || carries_hidden)
    }
}

/// What a stream recorded after the record that ended one of its stalls (a seq `from`, at
/// `t0` on its clock), in steps of [`catch_up_step`]: the highest seq it had recorded less
/// than each step's offset after `t0`, and the first step its end record came before.
#[derive(Debug, Clone)]
pub(super) struct CatchUp {
    /// The seq that ended the stall.
    pub(super) from: u64,
    t0: u64,
    /// Step `k` (below `next`): the highest seq recorded less than step `k`'s offset after
    /// `t0`, minus `from` (cut to `u32::MAX`: an underestimate).
    within: [u32; CATCH_UP_STEPS],
    /// The latest record's seq, minus `from`.
    last: u32,
    /// Steps below it are final; while open, the later ones are `last` so far.
    next: u8,
    /// The first step whose offset the segment's end record came before
    /// (`CATCH_UP_STEPS`: none, or no end yet).
    end_within: u8,
    /// That end record's reason.
    pub(super) reason: Option<EndReason>,
}

impl CatchUp {
    fn new(from: u64, t0: u64) -> Self {
        CatchUp {
            from,
            t0,
            within: [0; CATCH_UP_STEPS],
            last: 0,
            next: 0,
            end_within: CATCH_UP_STEPS as u8,
            reason: None,
        }
    }

    /// Takes a record at `t`: the steps it is past are final. `true` while steps are open.
    fn advance(&mut self, t: u64, stall_ns: u64) -> bool {
        let offset = t.saturating_sub(self.t0);
        while usize::from(self.next) < CATCH_UP_STEPS
            && offset >= catch_up_step(stall_ns, self.next.into())
        {
            self.within[usize::from(self.next)] = self.last;
            self.next += 1;
        }
        usize::from(self.next) < CATCH_UP_STEPS
    }

    fn record(&mut self, seq: u64) {
        let delta = u32::try_from(seq.saturating_sub(self.from)).unwrap_or(u32::MAX);
        self.last = self.last.max(delta);
    }

    /// No later record counts: the open steps keep what they have (exact at the segment's
    /// end, an underestimate otherwise).
    fn close(&mut self) {
        for k in usize::from(self.next)..CATCH_UP_STEPS {
            self.within[k] = self.last;
        }
        self.next = CATCH_UP_STEPS as u8;
    }

    /// The highest seq recorded less than step `k`'s offset after the stall ended (so far).
    pub(super) fn seq_within(&self, k: usize) -> u64 {
        let delta = if k < usize::from(self.next) {
            self.within[k]
        } else {
            self.last
        };
        self.from.saturating_add(u64::from(delta))
    }

    /// Whether the segment's end record came less than step `k`'s offset after the stall
    /// ended.
    pub(super) fn ended_within(&self, k: usize) -> bool {
        usize::from(self.end_within) <= k
    }
}

/// One record, as the state needs it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rec {
    pub(super) seq: u64,
    pub(super) t_ns: u64,
    pub(super) kind: RecordKind,
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
    /// The catch-up profiles of the stalls kept that ended at a seq (at hops after the first,
    /// while the budget lasts), in the order of `spells`; with `CATCHING_UP`, the last is open.
    catch_ups: Vec<CatchUp>,
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
const CATCHING_UP: u16 = 1 << 13; // the last catch-up profile is open
const END_SPELL: u16 = 1 << 14; // the current segment ended in a kept stall (the last spell)
const UNSORTED: u16 = 1 << 15; // a spell does not start at or after the one before ended

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
    /// The last end record's reason.
    reason: Option<EndReason>,
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
            reason: None,
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
                self.flags &= !(RECORD | PROGRESS | VISIBLE | LAST_VISIBLE | ENDED | END_SPELL);
                self.visible = 0;
                self.source = rec.source;
                cx.table.resumes = cx.table.resumes.saturating_add(1);
            } else {
                let (seq, end) = (rec.seq, self.last_seq);
                let (kind, what) = if matches!(rec.kind, RecordKind::End { .. }) && seq == end {
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
            let refused = if matches!(rec.kind, RecordKind::End { .. }) {
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
                    (_, RecordKind::End { .. }) => {
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
        if self.has(CATCHING_UP) {
            self.catch_up(rec, cx.stall_ns);
        }
        match rec.kind {
            RecordKind::End { reason, idle_ns } => self.end(rec, reason, idle_ns, cx),
            RecordKind::Event(kind) => self.event(rec, kind, cx),
        }
        self.source = rec.source;
        self.last_seq = rec.seq;
        self.last_t = rec.t_ns;
        self.flags |= RECORD;
        true
    }

    fn event(&mut self, rec: &Rec, kind: Kind, cx: &mut Ctx<'_>) {
        let (seq, t) = (rec.seq, rec.t_ns);
        if let Err(from) = self.cover(seq, cx.budget) {
            self.lose(from, cx);
        }
        if kind == Kind::Hidden {
            self.flags |= ANY_HIDDEN;
            if !self.extra().hidden.insert(seq, cx.budget) {
                self.lose(seq, cx);
            }
        }
        if kind == Kind::Control {
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
                    reason: None,
                    after_visible: self.has(LAST_VISIBLE),
                };
                // Only the hop before asks for a catch-up: the first hop has none.
                if self.spell(spell, cx) && self.hop > 0 {
                    self.open_catch_up(seq, t, cx.budget);
                }
            } else if quiet >= cx.stall_ns / 10 && cx.budget.take() {
                let spell = Spell {
                    after: Some(self.progress_seq),
                    seq: Some(seq),
                    quiet_ns: quiet,
                    reason: None,
                    after_visible: self.has(LAST_VISIBLE),
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
        let visible = kind == Kind::Visible;
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

    fn end(&mut self, rec: &Rec, reason: EndReason, idle: u64, cx: &mut Ctx<'_>) {
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
        if self.has(CATCHING_UP) {
            // The segment ends: so does the profile of its last stall.
            if let Some(catch_up) = self.extra.as_mut().and_then(|e| e.catch_ups.last_mut()) {
                if usize::from(catch_up.next) < CATCH_UP_STEPS {
                    catch_up.end_within = catch_up.next;
                    catch_up.reason = Some(reason);
                }
                catch_up.close();
            }
            self.flags &= !CATCHING_UP;
        }
        if idle >= cx.stall_ns {
            let spell = Spell {
                after: since,
                seq: None,
                quiet_ns: idle,
                reason: Some(reason),
                after_visible: since.is_some() && self.has(LAST_VISIBLE),
            };
            if self.spell(spell, cx) {
                self.flags |= END_SPELL;
            }
        }
        if self.has(LAST_VISIBLE) {
            cx.table.gap(self.visible, idle);
        }
        self.end_idle = idle;
        self.reason = Some(reason);
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

    /// Keeps a stall; `false` when the stream has `MAX_SPELLS` or the budget had no room.
    fn spell(&mut self, spell: Spell, cx: &mut Ctx<'_>) -> bool {
        cx.table.quiet_spells = cx.table.quiet_spells.saturating_add(1);
        let full = self.spells().len() >= MAX_SPELLS;
        if !full && cx.budget.take() {
            // Spells of one segment follow each other; a resume may go back.
            let sorted = self
                .spells()
                .last()
                .is_none_or(|last| last.seq.is_some_and(|b| spell.after >= Some(b)));
            if !sorted {
                self.flags |= UNSORTED;
            }
            self.extra().spells.push(spell);
            return true;
        }
        let after = spell.after.unwrap_or(0);
        cx.problem(ProblemKind::DetailLimit, || {
            let after = spell
                .after
                .map_or("the start".to_owned(), |s| format!("seq {s}"));
            if full {
                format!(
                    "a stall after {after} not analysed: {MAX_SPELLS} stalls are kept per stream"
                )
            } else {
                format!("a stall after {after} not analysed: the detail budget is spent")
            }
        });
        self.lose(after, cx);
        false
    }

    /// Takes `rec` into the open catch-up profile (its time first: the steps it is past are
    /// final without it).
    fn catch_up(&mut self, rec: &Rec, stall_ns: u64) {
        let Some(catch_up) = self.extra.as_mut().and_then(|e| e.catch_ups.last_mut()) else {
            self.flags &= !CATCHING_UP;
            return;
        };
        let open = catch_up.advance(rec.t_ns, stall_ns);
        if let RecordKind::Event(_) = rec.kind {
            catch_up.record(rec.seq);
        }
        if !open {
            catch_up.close();
            self.flags &= !CATCHING_UP;
        }
    }

    /// Starts the catch-up profile of a stall that ended at `seq`, at `t` (closing the one
    /// before: its open steps keep what they have, an underestimate). Without budget there is
    /// none, and what would need it is unknown.
    fn open_catch_up(&mut self, seq: u64, t: u64, budget: &mut Budget) {
        let was_open = self.has(CATCHING_UP);
        self.flags &= !CATCHING_UP;
        let extra = self.extra();
        if was_open {
            if let Some(last) = extra.catch_ups.last_mut() {
                last.close();
            }
        }
        if !budget.take_n(CATCH_UP_DETAILS) {
            return;
        }
        let mut catch_up = CatchUp::new(seq, t);
        catch_up.record(seq);
        extra.catch_ups.push(catch_up);
        self.flags |= CATCHING_UP;
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

    /// Whether a kept spell lies within the span from `after` to `seq` (see [`Spell::within`]).
    /// For the span a stream ended in, `behind` is its end record's seq and whether it carries
    /// hidden events: a spell that hop was behind (see [`Spell::ahead_of`]) does not count.
    /// `None` when spells past `lost_from` may be missing.
    pub(super) fn stalled_within(
        &self,
        after: Option<u64>,
        seq: Option<u64>,
        behind: Option<(u64, bool)>,
    ) -> Option<bool> {
        let excluded = |spell: &Spell| {
            behind.is_some_and(|(numbered, hidden)| spell.ahead_of(numbered, hidden))
        };
        let spells = self.spells();
        let found = if self.has(UNSORTED) {
            spells
                .iter()
                .any(|spell| spell.within(after, seq) && !excluded(spell))
        } else {
            // Sorted and disjoint: from the first spell starting at or after `after`, those
            // within the span come first.
            let first =
                spells.partition_point(|spell| spell.after.is_some() && spell.after < after);
            spells[first..]
                .iter()
                .take_while(|spell| spell.within(after, seq))
                .any(|spell| !excluded(spell))
        };
        if found {
            return Some(true);
        }
        let last = seq.unwrap_or(u64::MAX);
        if self.lost_at(last) {
            None
        } else {
            Some(false)
        }
    }

    /// For the stall the stream's last segment ended in: its end record's seq and whether the
    /// stream carries hidden events (what [`stalled_within`](Stream::stalled_within) takes).
    pub(super) fn behind(&self, spell: &Spell) -> Option<(u64, bool)> {
        let (numbered, last) = self.final_end()?;
        last.filter(|last| std::ptr::eq(*last, spell))
            .map(|_| (numbered, self.carries_hidden()))
    }

    /// Whether a kept stall here waited on `up`, a stall of the hop before: `up` lies within
    /// its span (and this hop was not behind it, for the stall it ended in). `None` when a
    /// stall that would may be missing (details lost).
    pub(super) fn waited_on(&self, up: &Spell) -> Option<bool> {
        let waits = |own: &Spell| {
            up.within(own.after, own.seq)
                && !self
                    .behind(own)
                    .is_some_and(|(numbered, hidden)| up.ahead_of(numbered, hidden))
        };
        let spells = self.spells();
        let waited = if self.has(UNSORTED) {
            spells.iter().any(waits)
        } else {
            // Sorted and disjoint: only the last spell starting at or before `up` can hold it,
            // or, for a stream quiet from its start to its end there, a stall to the end (the
            // last).
            let at = spells.partition_point(|own| own.after <= up.after);
            at.checked_sub(1).is_some_and(|at| waits(&spells[at]))
                || (up.after.is_none() && spells.last().is_some_and(waits))
        };
        if waited {
            Some(true)
        } else if self.lost_at(up.after.unwrap_or(u64::MAX)) {
            None
        } else {
            Some(false)
        }
    }

    /// The kept stall with the highest seq at or before `p` that ended at a seq.
    pub(super) fn latest_stall_by(&self, p: u64) -> Option<&Spell> {
        let spells = self.spells();
        if self.has(UNSORTED) {
            return spells
                .iter()
                .filter(|spell| spell.seq.is_some_and(|s| s <= p))
                .max_by_key(|spell| spell.seq);
        }
        // Sorted: the ones ending at a seq by `p` come first (a stall to the end is last).
        let at = spells.partition_point(|spell| spell.seq.is_some_and(|s| s <= p));
        at.checked_sub(1).map(|at| &spells[at])
    }

    /// The catch-up profile of the stall that ended at `seq`, if kept.
    pub(super) fn catch_up_after(&self, seq: u64) -> Option<&CatchUp> {
        let catch_ups = &self.extra.as_ref()?.catch_ups;
        if self.has(UNSORTED) {
            return catch_ups.iter().rev().find(|c| c.from == seq);
        }
        // In the order of the spells they follow: by seq.
        let at = catch_ups.partition_point(|c| c.from < seq);
        catch_ups.get(at).filter(|c| c.from == seq)
    }

    /// When the stream's last segment has ended: its end record's seq (one past the last
    /// event the hop numbered) and, if the stream ended in a stall, that stall.
    pub(super) fn final_end(&self) -> Option<(u64, Option<&Spell>)> {
        if !self.has(ENDED) {
            return None;
        }
        let spell = self.spells().last().filter(|_| self.has(END_SPELL));
        Some((self.last_seq, spell))
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
    /// `after+1..=seq` (`seq` `None`: to the end, the last end record's idle time included when
    /// below `stall_ns`, or when nothing else is known), and whether that is exact rather than
    /// an upper bound. Spells of a tenth of the threshold or more are kept exactly; shorter ones
    /// are bounded by the sketch's windows, exact (to the microsecond) while the windows are one
    /// seq wide.
    pub(super) fn quiet_within(
        &self,
        after: Option<u64>,
        seq: Option<u64>,
        stall_ns: u64,
    ) -> Option<(u64, bool)> {
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
        // A trailing stall here is one the other hop was behind (or it would have been passed
        // on): not a quiet over its span, unless nothing else is known.
        if seq.is_none()
            && self.has(HAD_END)
            && (self.end_idle < stall_ns || (known.is_none() && bound.is_none()))
        {
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
    fn detail_sizes() {
        // What the docs quote: a stall 48 bytes, a catch-up profile 104.
        assert_eq!(std::mem::size_of::<Spell>(), 48);
        assert_eq!(std::mem::size_of::<CatchUp>(), 104);
        assert_eq!(std::mem::size_of::<Stream>(), 144);
    }

    fn ctx_run(
        stream: &mut Stream,
        budget: &mut Budget,
        records: &[(u64, u64, Option<EndReason>)],
    ) {
        let mut table = HopTable::new(4);
        let mut problems = ProblemLog::new(4);
        for &(seq, t_ms, end) in records {
            let rec = Rec {
                seq,
                t_ns: t_ms * 1_000_000,
                kind: match end {
                    Some(reason) => RecordKind::End { reason, idle_ns: 0 },
                    None => RecordKind::Event(Kind::Visible),
                },
                source: 0,
            };
            let mut cx = Ctx {
                stall_ns: 1_000_000_000,
                budget,
                table: &mut table,
                problems: &mut problems,
                source: "s",
                line: None,
                request: "r",
                hop: "h",
            };
            assert!(stream.add(&rec, &mut cx), "{seq}");
        }
    }

    #[test]
    fn a_catch_up_profile_holds_the_highest_seq_within_each_step() {
        let mut budget = Budget { left: 100 };
        let mut stream = Stream::new(1, 0, false);
        // A stall from 4 to 5 (ending at 10 s), then 6..=9 at +0.2 s, 10..=20 at +1.1 s,
        // 21 at +2 s, 22 at +2.8 s and the end at +3.5 s.
        let mut records = vec![(4, 0, None), (5, 10_000, None)];
        records.extend((6..=9).map(|seq| (seq, 10_200, None)));
        records.extend((10..=20).map(|seq| (seq, 11_100, None)));
        records.push((21, 12_000, None));
        records.push((22, 12_800, None));
        records.push((23, 13_500, Some(EndReason::Cancelled)));
        ctx_run(&mut stream, &mut budget, &records);
        assert_eq!(
            budget.left, 93,
            "the stall, its profile and four notable quiets"
        );
        assert_eq!(stream.latest_stall_by(4), None);
        assert_eq!(stream.latest_stall_by(100).and_then(|s| s.seq), Some(5));
        let catch_up = stream.catch_up_after(5).expect("kept");
        // Steps: 1, 1.5, 2, 3, 4 s ...
        let within: Vec<u64> = (0..6).map(|k| catch_up.seq_within(k)).collect();
        // 21 came exactly 2 s after: not within 2 s.
        assert_eq!(within, [9, 20, 20, 22, 22, 22]);
        let ended: Vec<bool> = (0..6).map(|k| catch_up.ended_within(k)).collect();
        assert_eq!(ended, [false, false, false, false, true, true]);
        assert_eq!(catch_up.reason, Some(EndReason::Cancelled));
        assert_eq!(catch_up_step(1_000, 19), 768_000);
        assert_eq!(catch_up_step(u64::MAX, 19), u64::MAX);

        // The first hop keeps none (no hop before it asks). Each counts as two details; one
        // that does not fit is not kept.
        let mut first = Stream::new(0, 0, false);
        ctx_run(&mut first, &mut budget, &records[..2]);
        assert!(first.catch_up_after(5).is_none());
        let mut many = Stream::new(1, 0, false);
        let stalls: Vec<_> = (0..40).map(|seq| (seq, seq * 2_000, None)).collect();
        let mut budget = Budget { left: 3 * 39 - 1 };
        ctx_run(&mut many, &mut budget, &stalls);
        assert!((1..39).all(|seq| many.catch_up_after(seq).is_some()));
        assert!(many.catch_up_after(39).is_none() && many.catch_up_after(0).is_none());
        assert_eq!(budget.left, 1);
    }

    #[test]
    fn sorted_and_scanned_lookups_agree() {
        let mut rng = 0x1234_5678_u64;
        let mut next = |below: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % below
        };
        for _ in 0..200 {
            let mut stream = Stream::new(1, 0, false);
            let (mut seq, mut spells) = (next(3), Vec::new());
            for _ in 0..next(12) {
                let after = seq;
                seq += 1 + next(3);
                let end = next(8) == 0;
                spells.push(Spell {
                    after: Some(after),
                    seq: (!end).then_some(seq),
                    quiet_ns: 1,
                    reason: None,
                    after_visible: next(2) == 0,
                });
                if end {
                    break;
                }
                seq += next(3);
            }
            stream.extra().spells = spells;
            stream.flags |= ENDED | END_SPELL;
            stream.last_seq = seq + 1;
            for _ in 0..30 {
                let after = (next(4) > 0).then(|| next(seq + 2));
                let to = (next(4) > 0).then(|| after.unwrap_or(0) + 1 + next(6));
                let behind = (next(2) == 0).then(|| (next(seq + 2), next(2) == 0));
                let up = Spell {
                    after,
                    seq: to,
                    quiet_ns: 1,
                    reason: None,
                    after_visible: next(2) == 0,
                };
                let p = next(seq + 2);
                stream.flags &= !UNSORTED;
                let sorted = (
                    stream.stalled_within(after, to, behind),
                    stream.waited_on(&up),
                    stream.latest_stall_by(p).cloned(),
                );
                stream.flags |= UNSORTED;
                let scanned = (
                    stream.stalled_within(after, to, behind),
                    stream.waited_on(&up),
                    stream.latest_stall_by(p).cloned(),
                );
                assert_eq!(sorted, scanned, "{:?} {up:?} {p}", stream.spells());
            }
        }
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
                reason: None,
                after_visible: true,
            })
            .collect();
        assert_eq!(stream.stalled_within(Some(4), Some(5), None), Some(true));
        assert_eq!(stream.stalled_within(Some(3), Some(6), None), Some(true));
        assert_eq!(stream.stalled_within(Some(5), Some(9), None), Some(false));
        assert_eq!(stream.stalled_within(Some(4), Some(4), None), Some(false));
        assert_eq!(stream.stalled_within(None, Some(4), None), Some(false));
        // A span to the end: the end spells count, whatever came before.
        assert_eq!(stream.stalled_within(Some(10), None, None), Some(true));
        stream.extra().spells.truncate(2);
        assert_eq!(stream.stalled_within(Some(10), None, None), Some(false));
        assert_eq!(stream.stalled_within(Some(9), None, None), Some(true));
        // A span a hop ended in, behind this one: it never numbered 9 (its end record's seq is
        // 9), and 9 is a kind it records.
        assert_eq!(
            stream.stalled_within(Some(5), None, Some((9, false))),
            Some(false)
        );
        assert_eq!(
            stream.stalled_within(Some(5), None, Some((10, false))),
            Some(true)
        );
        stream.extra().spells[1].after_visible = false;
        assert_eq!(
            stream.stalled_within(Some(5), None, Some((9, false))),
            Some(true)
        );
        assert_eq!(
            stream.stalled_within(Some(5), None, Some((9, true))),
            Some(false)
        );
        // Spells past the budget are unknown.
        stream.flags |= LOST;
        stream.lost_from = 20;
        assert_eq!(stream.stalled_within(Some(10), None, None), None);
        assert_eq!(stream.stalled_within(Some(10), Some(19), None), Some(false));
    }

    #[test]
    fn the_sketch_widens_and_bounds_from_above() {
        let mut stream = Stream::new(0, 0, false);
        stream.sketch(1, 5_000_000);
        assert_eq!(
            stream.quiet_within(Some(0), Some(1), u64::MAX),
            Some((5_000_000, true))
        );
        assert_eq!(stream.quiet_within(Some(1), Some(2), u64::MAX), None);
        for seq in 2..100 {
            stream.sketch(seq, 1_000 * seq);
        }
        stream.sketch(u64::MAX, 7);
        assert_eq!(stream.shift, 61);
        let (longest, exact) = stream.quiet_within(Some(0), Some(1), u64::MAX).unwrap();
        assert!(longest >= 5_000_000 && !exact);
        stream.sketch(0, 9_000_000);
        assert_eq!(
            stream.quiet_within(Some(0), Some(1), u64::MAX),
            Some((9_000_000, false))
        );
    }
}
