//! A catch-up profile: what a hop recorded in the steps of time after one of its stalls ended,
//! so that the hop before it can ask whether it was behind and caught up (see `blame`).

use crate::end::EndReason;

/// Steps of a catch-up profile: offsets of 1, 1.5, 2, 3, 4, 6, ... times the stall threshold,
/// the last 768 times it.
pub(crate) const CATCH_UP_STEPS: usize = 20;
/// Details a catch-up profile counts for (it is about twice as large as a stall).
pub(super) const CATCH_UP_DETAILS: u64 = 2;

/// Offset `k` of a catch-up profile, for a stall threshold of `stall_ns`.
pub(crate) fn catch_up_step(stall_ns: u64, k: usize) -> u64 {
    let octave = stall_ns.saturating_mul(1 << (k / 2));
    if k % 2 == 1 {
        octave.saturating_add(octave / 2)
    } else {
        octave
    }
}

/// What a stream recorded after the record that ended one of its stalls (a seq `from`, at
/// `t0` on its clock), in steps of [`catch_up_step`]: the highest seq it had recorded less
/// than each step's offset after `t0`, and the first step its end record came before.
#[derive(Debug, Clone)]
pub(crate) struct CatchUp {
    /// The seq that ended the stall.
    pub(crate) from: u64,
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
    pub(crate) reason: Option<EndReason>,
}

impl CatchUp {
    pub(super) fn new(from: u64, t0: u64) -> Self {
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
    pub(super) fn advance(&mut self, t: u64, stall_ns: u64) -> bool {
        let offset = t.saturating_sub(self.t0);
        while usize::from(self.next) < CATCH_UP_STEPS
            && offset >= catch_up_step(stall_ns, self.next.into())
        {
            self.within[usize::from(self.next)] = self.last;
            self.next += 1;
        }
        usize::from(self.next) < CATCH_UP_STEPS
    }

    /// Takes an event record's seq.
    pub(super) fn record(&mut self, seq: u64) {
        let delta = u32::try_from(seq.saturating_sub(self.from)).unwrap_or(u32::MAX);
        self.last = self.last.max(delta);
    }

    /// No later record counts: the open steps keep what they have (exact at the segment's
    /// end, an underestimate otherwise).
    pub(super) fn close(&mut self) {
        for k in usize::from(self.next)..CATCH_UP_STEPS {
            self.within[k] = self.last;
        }
        self.next = CATCH_UP_STEPS as u8;
    }

    /// The segment ended, with `reason`: if a step was still open, the end record came before
    /// its offset; no later record counts.
    pub(super) fn end(&mut self, reason: EndReason) {
        if usize::from(self.next) < CATCH_UP_STEPS {
            self.end_within = self.next;
            self.reason = Some(reason);
        }
        self.close();
    }

    /// The highest seq recorded less than step `k`'s offset after the stall ended (so far).
    pub(crate) fn seq_within(&self, k: usize) -> u64 {
        let delta = if k < usize::from(self.next) {
            self.within[k]
        } else {
            self.last
        };
        self.from.saturating_add(u64::from(delta))
    }

    /// Whether the segment's end record came less than step `k`'s offset after the stall
    /// ended.
    pub(crate) fn ended_within(&self, k: usize) -> bool {
        usize::from(self.end_within) <= k
    }
}
