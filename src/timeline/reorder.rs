//! The reorder window: the last records read, across all sources, held back so that the
//! records of each request at each hop reach its state in seq order even when their lines did
//! not arrive in it (a log shipper, several writers to one file, merged rotations).
//!
//! The window holds the last `max` records read, in read order. Each stream (a request at a
//! hop, from one source) keeps its pending records sorted by seq, ties by time. When the window
//! is full, the record that arrived first leaves it, and its stream releases, in seq order,
//! every pending record from the same source with a seq (and time) up to its own. So a record
//! is put back in its place when it arrives at most `max` records after the record it belongs
//! before; one that arrives later finds its stream past it (see `RequestAtHop::add`).
//!
//! Records of one stream from different sources are not ordered against each other: a stream
//! resumed through another instance (its own clock, its seqs possibly replaying the last few
//! of the first subscriber's) is taken in the order its records leave the window, as before.

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use crate::probe::RecordKind;

/// Where a pending record belongs: its stream, its place in it, and when it arrived (which
/// tells apart records that agree on everything else).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key {
    pub(super) request: Arc<str>,
    pub(super) hop: u8,
    pub(super) source: u16,
    pub(super) seq: u64,
    pub(super) t_ns: u64,
    arrival: u64,
}

impl Key {
    /// The place of record `seq` at `t_ns` of `request` at `hop`, from `source`.
    pub(super) fn new(request: Arc<str>, hop: u8, source: u16, seq: u64, t_ns: u64) -> Self {
        Key {
            request,
            hop,
            source,
            seq,
            t_ns,
            arrival: 0,
        }
    }
}

/// The rest of a pending record: what taking it needs besides its key.
#[derive(Debug)]
pub(super) struct Pending {
    pub(super) kind: RecordKind,
    /// Its 1-based line in its source, for problems found when it is taken.
    pub(super) line: Option<u64>,
    /// Whether it was read under a window of its hop's clock.
    pub(super) windowed: bool,
    /// How long the hop's thread was busy within the gap it ended (0: not told).
    pub(super) busy_ns: u64,
    /// The attributes it sets, if any.
    pub(super) attrs: Option<BTreeMap<Cow<'static, str>, Cow<'static, str>>>,
}

/// The last records read, pending until they leave the window (see the [module](self)).
#[derive(Debug)]
pub(super) struct Reorder {
    max: usize,
    arrivals: u64,
    /// Every record in the window, in read order (some released already, early).
    window: VecDeque<Key>,
    pending: BTreeMap<Key, Pending>,
    /// While a record that left the window releases its stream: the last key released.
    releasing: Option<Key>,
}

impl Reorder {
    /// A window of `max` records (0: each record is released as it is read).
    pub(super) fn new(max: usize) -> Self {
        Reorder {
            max,
            arrivals: 0,
            window: VecDeque::new(),
            pending: BTreeMap::new(),
            releasing: None,
        }
    }

    pub(super) fn set_max(&mut self, max: usize) {
        self.max = max;
    }

    pub(super) fn max(&self) -> usize {
        self.max
    }

    /// Puts a record in the window; [`release`](Reorder::release) then hands out what leaves.
    pub(super) fn push(&mut self, mut key: Key, pending: Pending) {
        key.arrival = self.arrivals;
        self.arrivals = self.arrivals.saturating_add(1);
        self.window.push_back(key.clone());
        self.pending.insert(key, pending);
    }

    /// The next record released, in its stream's order: from the records that left the window
    /// (all of them, with `flush`: when the analysis needs every record read).
    pub(super) fn release(&mut self, flush: bool) -> Option<(Key, Pending)> {
        loop {
            if let Some(upto) = &self.releasing {
                let from = Key {
                    seq: 0,
                    t_ns: 0,
                    arrival: 0,
                    ..upto.clone()
                };
                if let Some(key) = self.pending.range(from..=upto.clone()).next() {
                    let key = key.0.clone();
                    return self.pending.remove_entry(&key);
                }
                self.releasing = None;
            }
            if self.window.len() <= self.max && !flush {
                return None;
            }
            let oldest = self.window.pop_front()?;
            // Every pending record of its stream up to it, whenever it arrived.
            self.releasing = Some(Key {
                arrival: u64::MAX,
                ..oldest
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::Kind;

    fn pending() -> Pending {
        Pending {
            kind: RecordKind::Event(Kind::Visible),
            line: None,
            windowed: false,
            busy_ns: 0,
            attrs: None,
        }
    }

    fn released(reorder: &mut Reorder, flush: bool) -> Vec<(u16, u64)> {
        std::iter::from_fn(|| reorder.release(flush))
            .map(|(key, _)| (key.source, key.seq))
            .collect()
    }

    #[test]
    fn a_record_within_the_window_is_put_back_in_its_place() {
        let r: Arc<str> = "r".into();
        let mut reorder = Reorder::new(2);
        // Read as 1, 2, 0, 3, 4 at one hop: 0 arrives two records after 1, within the window.
        let mut push = |seq: u64| {
            reorder.push(Key::new(r.clone(), 0, 0, seq, seq), pending());
            released(&mut reorder, false)
        };
        assert_eq!(push(1), []);
        assert_eq!(push(2), []);
        // 1 leaves, with 0 before it.
        assert_eq!(push(0), [(0, 0), (0, 1)]);
        assert_eq!(push(3), [(0, 2)]);
        assert_eq!(push(4), [], "0 leaves, released already");
        assert_eq!(released(&mut reorder, true), [(0, 3), (0, 4)]);
        assert!(reorder.pending.is_empty() && reorder.window.is_empty());
    }

    #[test]
    fn streams_and_sources_are_ordered_apart() {
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut reorder = Reorder::new(8);
        // A resume through another source replays seqs 1 and 2: not mixed with the first.
        for (request, source, seq) in [(&a, 0, 1), (&b, 0, 0), (&a, 1, 1), (&a, 0, 2), (&a, 1, 0)] {
            reorder.push(Key::new(request.clone(), 0, source, seq, 0), pending());
        }
        assert_eq!(
            released(&mut reorder, true),
            [(0, 1), (0, 0), (1, 0), (1, 1), (0, 2)]
        );
        // No window: each record as it is read.
        let mut reorder = Reorder::new(0);
        for seq in [3, 1] {
            reorder.push(Key::new(a.clone(), 0, 0, seq, 0), pending());
            assert_eq!(released(&mut reorder, false), [(0, seq)]);
        }
    }
}
