//! The state of one request at one hop, updated record by record: its fixed fields, the sketch
//! of its short quiet spells, and the questions the blame rule asks it.

use crate::chunk::Kind;
use crate::end::EndReason;
use crate::probe::RecordKind;
use crate::timeline::budget::DetailBudget;
use crate::timeline::problems::{ProblemKind, ProblemLog};
use crate::timeline::table::HopTable;

use super::catch_up::{CATCH_UP_DETAILS, CatchUp};
use super::flags::{Flag, Flags};
use super::range_set::RangeSet;
use super::spell::Spell;

/// Idle time an end record may claim beyond what its hop's records show (a writer that reads
/// its clock twice).
const IDLE_SLACK_NS: u64 = 1_000_000;

/// Windows of the sketch of short quiet spells.
const SKETCH: usize = 8;

/// Stalls kept per stream; later ones are counted, reported and not analysed, like those past
/// the detail budget.
const MAX_SPELLS: usize = 256;

/// One record, as the state needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rec {
    pub(crate) seq: u64,
    pub(crate) t_ns: u64,
    pub(crate) kind: RecordKind,
    /// The interned source it came from.
    pub(crate) source: u16,
}

/// What a record is checked and counted against.
pub(crate) struct Ctx<'a> {
    pub(crate) stall_ns: u64,
    pub(crate) budget: &'a mut DetailBudget,
    pub(crate) table: &'a mut HopTable,
    pub(crate) problems: &'a mut ProblemLog,
    pub(crate) source: &'a str,
    pub(crate) line: Option<u64>,
    pub(crate) request: &'a str,
    pub(crate) hop: &'a str,
    /// Whether the record is read under a window of its hop's clock.
    pub(crate) windowed: bool,
    /// The reorder window, in records (for what a record out of order beyond it says).
    pub(crate) reorder_window: usize,
}

impl Ctx<'_> {
    fn problem(&mut self, kind: ProblemKind, message: impl FnOnce() -> String) {
        let (request, hop) = (self.request, self.hop);
        self.problems.add(kind, self.source, self.line, || {
            format!("request `{request}` at {hop}: {}", message())
        });
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
    /// while the budget lasts), in the order of `spells`; with [`Flag::CatchingUp`], the last
    /// is open.
    catch_ups: Vec<CatchUp>,
}

/// One request at one hop: 144 bytes however many records it has, and its details, if any
/// (see the [module](super)).
#[derive(Debug, Clone)]
pub(crate) struct RequestAtHop {
    /// The hop's index in the path.
    pub(crate) hop: u8,
    /// The sketch's window width: `1 << shift` seqs.
    shift: u8,
    flags: Flags,
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
    /// The highest seq of a visible record (with [`Flag::AnyVisible`]).
    visible_seq: u64,
    /// The last end record's idle time (cut to what the records allow).
    end_idle: u64,
    /// With [`Flag::Lost`]: the first seq about which details may be missing.
    lost_from: u64,
    /// The sketch: window `i` holds 1 + the longest short quiet spell (in µs, rounded up)
    /// ending at a seq in `base + i << shift ..`, or 0.
    base: u64,
    sketch: [u32; SKETCH],
    extra: Option<Box<Extra>>,
}

impl RequestAtHop {
    pub(crate) fn new(hop: u8, source: u16) -> Self {
        RequestAtHop {
            hop,
            shift: 0,
            flags: Flags::default(),
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

    fn extra(&mut self) -> &mut Extra {
        self.extra.get_or_insert_with(Default::default)
    }

    /// Checks `rec` against the stream and takes it in, or reports why not. Returns whether it
    /// was taken.
    pub(crate) fn add(&mut self, rec: &Rec, cx: &mut Ctx<'_>) -> bool {
        if self.flags.has(Flag::Ended) {
            // Records after an end: a resumed stream (a new subscriber, in another process or
            // later on this one's clock) starts a new segment. Anything else is stray.
            if rec.source != self.source || rec.t_ns > self.last_t {
                self.flags.remove_all(&Flag::SEGMENT);
                self.visible = 0;
                self.source = rec.source;
                cx.table.resumes = cx.table.resumes.saturating_add(1);
            } else if rec.seq < self.last_seq
                && !matches!(rec.kind, RecordKind::End { .. })
                && self.covers(rec.seq) != Some(true)
            {
                // An event of the segment that ended, new, arriving after its end record.
                self.disorder(rec.seq, cx);
                return false;
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
        if self.flags.has(Flag::Record) {
            let (seq, last) = (rec.seq, self.last_seq);
            if let RecordKind::End { .. } = rec.kind {
                // One past the last seq, which saturates at u64::MAX. One that is not came
                // late (a segment's end beyond the window, after a resume's records were taken
                // as its events): nothing taken from the stream here is sure any more.
                if seq <= last && !(seq == u64::MAX && last == u64::MAX) {
                    self.disorder(seq, cx);
                    return false;
                }
            } else if seq == last || (seq < last && self.covers(seq) == Some(true)) {
                cx.problem(ProblemKind::Duplicate, || {
                    format!("seq {seq} recorded twice")
                });
                return false;
            } else if seq < last {
                self.disorder(seq, cx);
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
        if self.flags.has(Flag::CatchingUp) {
            self.catch_up(rec, cx.stall_ns);
        }
        match rec.kind {
            RecordKind::End { reason, idle_ns } => self.end(rec, reason, idle_ns, cx),
            RecordKind::Event(kind) => self.event(rec, kind, cx),
        }
        self.source = rec.source;
        self.last_seq = rec.seq;
        self.last_t = rec.t_ns;
        self.flags.insert(Flag::Record);
        if cx.windowed {
            self.flags.insert(Flag::Windowed);
        }
        true
    }

    fn event(&mut self, rec: &Rec, kind: Kind, cx: &mut Ctx<'_>) {
        let (seq, t) = (rec.seq, rec.t_ns);
        if let Err(from) = self.cover(seq, cx.budget) {
            self.lose(from, cx);
        }
        if kind == Kind::Hidden {
            self.flags.insert(Flag::AnyHidden);
            if !self.extra().hidden.insert(seq, cx.budget) {
                self.lose(seq, cx);
            }
        }
        if kind == Kind::Control {
            return;
        }
        if self.flags.has(Flag::Progress) {
            // t >= the last record's time >= the last progress record's time.
            let quiet = t.saturating_sub(self.progress_t);
            if quiet >= cx.stall_ns {
                let spell = Spell {
                    after: Some(self.progress_seq),
                    seq: Some(seq),
                    quiet_ns: quiet,
                    reason: None,
                    after_visible: self.flags.has(Flag::LastVisible),
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
                    after_visible: self.flags.has(Flag::LastVisible),
                };
                self.extra().notable.push(spell);
            } else {
                // Short (or no budget left to keep it exactly).
                self.sketch(seq, quiet);
            }
        }
        self.progress_seq = seq;
        self.progress_t = t;
        self.flags.insert(Flag::Progress);
        let visible = kind == Kind::Visible;
        if visible {
            if self.flags.has(Flag::Visible) {
                cx.table.gap(self.visible, t.saturating_sub(self.visible_t));
            }
            self.visible_t = t;
            if !self.flags.has(Flag::AnyVisible) || seq > self.visible_seq {
                self.visible_seq = seq;
            }
            self.flags.insert(Flag::AnyVisible);
            self.visible = self.visible.saturating_add(1);
            self.flags.insert(Flag::Visible);
        }
        self.flags.set(Flag::LastVisible, visible);
    }

    fn end(&mut self, rec: &Rec, reason: EndReason, idle: u64, cx: &mut Ctx<'_>) {
        // The idle time runs on the hop's clock: since the last progress record, or since the
        // stream began there, which is after the clock's start.
        let (bound, since) = if self.flags.has(Flag::Progress) {
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
        if self.flags.has(Flag::CatchingUp) {
            // The segment ends: so does the profile of its last stall.
            if let Some(catch_up) = self.extra.as_mut().and_then(|e| e.catch_ups.last_mut()) {
                catch_up.end(reason);
            }
            self.flags.remove(Flag::CatchingUp);
        }
        if idle >= cx.stall_ns {
            let spell = Spell {
                after: since,
                seq: None,
                quiet_ns: idle,
                reason: Some(reason),
                after_visible: since.is_some() && self.flags.has(Flag::LastVisible),
            };
            if self.spell(spell, cx) {
                self.flags.insert(Flag::EndSpell);
            }
        }
        if self.flags.has(Flag::LastVisible) {
            cx.table.gap(self.visible, idle);
        }
        self.end_idle = idle;
        self.reason = Some(reason);
        self.flags.insert(Flag::Ended);
        self.flags.insert(Flag::HadEnd);
    }

    /// Adds `seq` to the seqs seen; `Err(from)` when a hole could not be kept and what is known
    /// of seqs from `from` on is incomplete.
    fn cover(&mut self, seq: u64, budget: &mut DetailBudget) -> Result<(), u64> {
        if !self.flags.has(Flag::Covered) {
            self.run = (seq, seq);
            self.flags.insert(Flag::Covered);
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
                self.flags.insert(Flag::Unsorted);
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
            self.flags.remove(Flag::CatchingUp);
            return;
        };
        let open = catch_up.advance(rec.t_ns, stall_ns);
        if let RecordKind::Event(_) = rec.kind {
            catch_up.record(rec.seq);
        }
        if !open {
            catch_up.close();
            self.flags.remove(Flag::CatchingUp);
        }
    }

    /// Starts the catch-up profile of a stall that ended at `seq`, at `t` (closing the one
    /// before: its open steps keep what they have, an underestimate). Without budget there is
    /// none, and what would need it is unknown.
    fn open_catch_up(&mut self, seq: u64, t: u64, budget: &mut DetailBudget) {
        let was_open = self.flags.has(Flag::CatchingUp);
        self.flags.remove(Flag::CatchingUp);
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
        self.flags.insert(Flag::CatchingUp);
    }

    /// Notes that event `seq` came after a later record had been taken: it arrived out of order
    /// beyond the reorder window, and what this stream's records show is not the stream.
    fn disorder(&mut self, seq: u64, cx: &mut Ctx<'_>) {
        let (last, window) = (self.last_seq, cx.reorder_window);
        cx.problem(ProblemKind::OutOfOrder, || {
            format!(
                "seq {seq} after seq {last}: out of order beyond the reorder window of {window} records"
            )
        });
        self.flags.insert(Flag::Disordered);
    }

    /// Notes that details from `from` on are not all kept (reported once per stream).
    fn lose(&mut self, from: u64, cx: &mut Ctx<'_>) {
        if !self.flags.has(Flag::Lost) {
            cx.problem(ProblemKind::DetailLimit, || {
                format!("details from seq {from} on not all kept (detail budget spent): what needs them is unknown")
            });
        }
        self.flags.insert(Flag::Lost);
        self.lost_from = self.lost_from.min(from);
    }

    fn sketch(&mut self, seq: u64, quiet_ns: u64) {
        if !self.flags.has(Flag::Sketched) {
            self.base = seq;
            self.flags.insert(Flag::Sketched);
        }
        if seq < self.base {
            self.flags.insert(Flag::SketchBelow);
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
    pub(crate) fn spells(&self) -> &[Spell] {
        self.extra.as_ref().map_or(&[], |extra| &extra.spells)
    }

    /// Whether the hop recorded `seq`: `None` when that is not known (details lost).
    pub(crate) fn covers(&self, seq: u64) -> Option<bool> {
        let known = self.flags.has(Flag::Covered)
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

    /// Visible events recorded: the stream's output length at the hop.
    pub(crate) fn visible(&self) -> u32 {
        self.visible
    }

    /// The last record's seq (its end's, one past its last event, when it ended).
    pub(crate) fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The lowest seq recorded.
    pub(crate) fn first_seq(&self) -> Option<u64> {
        if !self.flags.has(Flag::Covered) {
            return None;
        }
        let earlier = self.extra.as_ref().and_then(|e| e.earlier.first());
        Some(earlier.unwrap_or(self.run.0))
    }

    /// Whether details from `seq` on may be missing.
    fn lost_at(&self, seq: u64) -> bool {
        self.flags.has(Flag::Lost) && seq >= self.lost_from
    }

    /// The first seq from which details may be missing.
    pub(crate) fn lost_from(&self) -> Option<u64> {
        self.flags.has(Flag::Lost).then_some(self.lost_from)
    }

    pub(crate) fn had_end(&self) -> bool {
        self.flags.has(Flag::HadEnd)
    }

    pub(crate) fn windowed(&self) -> bool {
        self.flags.has(Flag::Windowed)
    }

    /// Whether a record arrived out of order beyond the reorder window (and was not taken).
    pub(crate) fn disordered(&self) -> bool {
        self.flags.has(Flag::Disordered)
    }

    /// Whether the hop recorded a hidden event of the request (it carries hidden events).
    pub(crate) fn carries_hidden(&self) -> bool {
        self.flags.has(Flag::AnyHidden)
    }

    /// Whether the hop recorded a visible event after `after` (`None`: at all).
    pub(crate) fn visible_after(&self, after: Option<u64>) -> bool {
        self.flags.has(Flag::AnyVisible) && after.is_none_or(|p| self.visible_seq > p)
    }

    /// Whether a kept spell lies within the span from `after` to `seq` (see [`Spell::within`]).
    /// For the span a stream ended in, `behind` is its end record's seq and whether it carries
    /// hidden events: a spell that hop was behind (see [`Spell::ahead_of`]) does not count.
    /// `None` when spells past `lost_from` may be missing.
    pub(crate) fn stalled_within(
        &self,
        after: Option<u64>,
        seq: Option<u64>,
        behind: Option<(u64, bool)>,
    ) -> Option<bool> {
        let excluded = |spell: &Spell| {
            behind.is_some_and(|(numbered, hidden)| spell.ahead_of(numbered, hidden))
        };
        let spells = self.spells();
        let found = if self.flags.has(Flag::Unsorted) {
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
    /// stream carries hidden events (what [`stalled_within`](RequestAtHop::stalled_within) takes).
    pub(crate) fn behind(&self, spell: &Spell) -> Option<(u64, bool)> {
        let (numbered, last) = self.final_end()?;
        last.filter(|last| std::ptr::eq(*last, spell))
            .map(|_| (numbered, self.carries_hidden()))
    }

    /// Whether a kept stall here waited on `up`, a stall of the hop before: `up` lies within
    /// its span (and this hop was not behind it, for the stall it ended in). `None` when a
    /// stall that would may be missing (details lost).
    pub(crate) fn waited_on(&self, up: &Spell) -> Option<bool> {
        let waits = |own: &Spell| {
            up.within(own.after, own.seq)
                && !self
                    .behind(own)
                    .is_some_and(|(numbered, hidden)| up.ahead_of(numbered, hidden))
        };
        let spells = self.spells();
        let waited = if self.flags.has(Flag::Unsorted) {
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
    pub(crate) fn latest_stall_by(&self, p: u64) -> Option<&Spell> {
        let spells = self.spells();
        if self.flags.has(Flag::Unsorted) {
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
    pub(crate) fn catch_up_after(&self, seq: u64) -> Option<&CatchUp> {
        let catch_ups = &self.extra.as_ref()?.catch_ups;
        if self.flags.has(Flag::Unsorted) {
            return catch_ups.iter().rev().find(|c| c.from == seq);
        }
        // In the order of the spells they follow: by seq.
        let at = catch_ups.partition_point(|c| c.from < seq);
        catch_ups.get(at).filter(|c| c.from == seq)
    }

    /// When the stream's last segment has ended: its end record's seq (one past the last
    /// event the hop numbered) and, if the stream ended in a stall, that stall.
    pub(crate) fn final_end(&self) -> Option<(u64, Option<&Spell>)> {
        if !self.flags.has(Flag::Ended) {
            return None;
        }
        let spell = self
            .spells()
            .last()
            .filter(|_| self.flags.has(Flag::EndSpell));
        Some((self.last_seq, spell))
    }

    /// Whether the hop has a hidden record strictly between `after` and `seq` (`None` for
    /// either end: open). `None` when that is not known.
    pub(crate) fn hidden_between(&self, after: Option<u64>, seq: Option<u64>) -> Option<bool> {
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
    pub(crate) fn quiet_within(
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
            if self.flags.has(Flag::Sketched) {
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
                bound_exact &= self.shift == 0 && !self.flags.has(Flag::SketchBelow);
            }
        }
        // A trailing stall here is one the other hop was behind (or it would have been passed
        // on): not a quiet over its span, unless nothing else is known.
        if seq.is_none()
            && self.flags.has(Flag::HadEnd)
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
    use super::super::catch_up::catch_up_step;
    use super::*;

    #[test]
    fn a_healthy_stream_is_its_fixed_fields() {
        // The size the docs quote (a request at a hop: about 150 bytes).
        assert!(
            std::mem::size_of::<RequestAtHop>() <= 160,
            "{}",
            std::mem::size_of::<RequestAtHop>()
        );
        let mut budget = DetailBudget::new(0);
        let mut stream = RequestAtHop::new(0, 0);
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
        assert_eq!(std::mem::size_of::<RequestAtHop>(), 144);
    }

    fn ctx_run(
        stream: &mut RequestAtHop,
        budget: &mut DetailBudget,
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
                windowed: false,
                reorder_window: 0,
            };
            assert!(stream.add(&rec, &mut cx), "{seq}");
        }
    }

    #[test]
    fn a_catch_up_profile_holds_the_highest_seq_within_each_step() {
        let mut budget = DetailBudget::new(100);
        let mut stream = RequestAtHop::new(1, 0);
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
            budget.left(),
            93,
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
        let mut first = RequestAtHop::new(0, 0);
        ctx_run(&mut first, &mut budget, &records[..2]);
        assert!(first.catch_up_after(5).is_none());
        let mut many = RequestAtHop::new(1, 0);
        let stalls: Vec<_> = (0..40).map(|seq| (seq, seq * 2_000, None)).collect();
        let mut budget = DetailBudget::new(3 * 39 - 1);
        ctx_run(&mut many, &mut budget, &stalls);
        assert!((1..39).all(|seq| many.catch_up_after(seq).is_some()));
        assert!(many.catch_up_after(39).is_none() && many.catch_up_after(0).is_none());
        assert_eq!(budget.left(), 1);
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
            let mut stream = RequestAtHop::new(1, 0);
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
            stream.flags.insert(Flag::Ended);
            stream.flags.insert(Flag::EndSpell);
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
                stream.flags.remove(Flag::Unsorted);
                let sorted = (
                    stream.stalled_within(after, to, behind),
                    stream.waited_on(&up),
                    stream.latest_stall_by(p).cloned(),
                );
                stream.flags.insert(Flag::Unsorted);
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
    fn spells_within_a_span_start_and_end_inside_it() {
        let mut stream = RequestAtHop::new(1, 0);
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
        stream.flags.insert(Flag::Lost);
        stream.lost_from = 20;
        assert_eq!(stream.stalled_within(Some(10), None, None), None);
        assert_eq!(stream.stalled_within(Some(10), Some(19), None), Some(false));
    }

    #[test]
    fn the_sketch_widens_and_bounds_from_above() {
        let mut stream = RequestAtHop::new(0, 0);
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
