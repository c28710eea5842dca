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
//!
//! # Cost
//!
//! The records themselves stay in the window, a ring in read order; a stream is a small index
//! (found by one hash of its request, hop and source when a record arrives) holding the
//! places (seq, time, arrival number) of its pending records. A record that comes in order (the common case, its
//! seq and time at least those of its stream's last pending record) is appended to its
//! stream's queue; one out of order is inserted there when few need moving, or else put in the
//! stream's ordered set of strays, so that no input makes a record cost more than a logarithm.
//! Releasing takes the smaller of the queue's front and the strays' first. A stream's entry
//! lives while a record of it is in the window (every pending record is): its slot is then
//! reused, so the state is the window plus one small entry per stream with records in it.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
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

/// A stream: a request at a hop, from one source.
type Name = (Arc<str>, u8, u16);

/// A record in the window, in read order (its arrival number is its place there).
#[derive(Debug)]
struct Slot {
    seq: u64,
    t_ns: u64,
    /// Its request and the rest of it, until its stream releases it (perhaps before it leaves
    /// the window).
    record: Option<(Arc<str>, Pending)>,
    /// Its stream's index in `Reorder::streams`.
    stream: u32,
    source: u16,
    hop: u8,
}

/// A stream's pending records, by arrival number, and how many of its records are in the
/// window (its entry is freed when none is).
#[derive(Debug, Default)]
struct Stream {
    name: Option<Name>,
    /// (seq, t_ns, arrival), sorted: the records that came in order, and those out of order
    /// that were put in their place cheaply (their places here, so that neither putting one in
    /// nor releasing looks into the window but to take the record).
    queue: VecDeque<(u64, u64, u64)>,
    /// (seq, t_ns, arrival) of the other records out of order.
    strays: BTreeSet<(u64, u64, u64)>,
    in_window: usize,
}

/// At most this many records are moved to put one out of order in its stream's queue; past it,
/// the record is a stray.
const MAX_SHIFT: usize = 32;
/// A freed stream's queue keeps at most this capacity for the stream its slot serves next.
const KEEP_CAPACITY: usize = 64;

/// The last records read, pending until they leave the window (see the [module](self)).
#[derive(Debug)]
pub(super) struct Reorder {
    max: usize,
    arrivals: u64,
    /// Every record in the window, in read order (some released already, early): the one at
    /// `i` arrived as number `arrivals - window.len() + i`.
    window: VecDeque<Slot>,
    /// The streams with records in the window: their index in `streams`.
    pending: HashMap<Name, u32>,
    streams: Vec<Stream>,
    /// The entries of `streams` free for reuse.
    free: Vec<u32>,
    /// While a record that left the window releases its stream: its arrival number and slot.
    releasing: Option<(u64, Slot)>,
}

/// The slot of the record that arrived as number `arrival`: in the window or leaving it.
fn slot_of<'a>(
    window: &'a mut VecDeque<Slot>,
    releasing: &'a mut Option<(u64, Slot)>,
    arrivals: u64,
    arrival: u64,
) -> &'a mut Slot {
    match releasing {
        Some((leaving, slot)) if *leaving == arrival => slot,
        _ => {
            let first = arrivals.wrapping_sub(window.len() as u64);
            &mut window[arrival.wrapping_sub(first) as usize]
        }
    }
}

impl Reorder {
    /// A window of `max` records (0: each record is released as it is read).
    pub(super) fn new(max: usize) -> Self {
        Reorder {
            max,
            arrivals: 0,
            window: VecDeque::new(),
            pending: HashMap::new(),
            streams: Vec::new(),
            free: Vec::new(),
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
    pub(super) fn push(&mut self, key: Key, pending: Pending) {
        let arrival = self.arrivals;
        let (seq, t_ns) = (key.seq, key.t_ns);
        let index = match self
            .pending
            .entry((key.request.clone(), key.hop, key.source))
        {
            Entry::Occupied(entry) => *entry.get(),
            Entry::Vacant(entry) => {
                let index = match self.free.pop() {
                    Some(index) => index,
                    None => {
                        self.streams.push(Stream::default());
                        (self.streams.len() - 1) as u32
                    }
                };
                self.streams[index as usize].name = Some(entry.key().clone());
                entry.insert(index);
                index
            }
        };
        let stream = &mut self.streams[index as usize];
        match stream.queue.back() {
            Some(&(last_seq, last_t_ns, _)) if (last_seq, last_t_ns) > (seq, t_ns) => {
                // Out of order: after every record at or before it (those that came first).
                let at = stream
                    .queue
                    .partition_point(|&(s, t, _)| (s, t) <= (seq, t_ns));
                if at.min(stream.queue.len() - at) <= MAX_SHIFT {
                    stream.queue.insert(at, (seq, t_ns, arrival));
                } else {
                    stream.strays.insert((seq, t_ns, arrival));
                }
            }
            _ => stream.queue.push_back((seq, t_ns, arrival)),
        }
        stream.in_window += 1;
        let len = self.window.len();
        if len == self.window.capacity() {
            // Double, but to no more than the window holds: its records are most of its cost.
            let want = len
                .saturating_mul(2)
                .max(8)
                .min(self.max.saturating_add(1))
                .max(len + 1);
            self.window.reserve_exact(want - len);
        }
        self.window.push_back(Slot {
            seq,
            t_ns,
            record: Some((key.request, pending)),
            stream: index,
            source: key.source,
            hop: key.hop,
        });
        self.arrivals = arrival.wrapping_add(1);
    }

    /// The next record released, in its stream's order: from the records that left the window
    /// (all of them, with `flush`: when the analysis needs every record read).
    pub(super) fn release(&mut self, flush: bool) -> Option<(Key, Pending)> {
        loop {
            if let Some(record) = self.release_one() {
                return Some(record);
            }
            if self.window.len() <= self.max && !flush {
                return None;
            }
            let Some(slot) = self.window.pop_front() else {
                if flush {
                    // Nothing pending: let go of the streams' entries until the next records.
                    self.streams = Vec::new();
                    self.free = Vec::new();
                }
                return None;
            };
            // Every pending record of its stream up to it, whenever it arrived.
            let arrival = self
                .arrivals
                .wrapping_sub(self.window.len() as u64)
                .wrapping_sub(1);
            self.releasing = Some((arrival, slot));
        }
    }

    /// The next pending record of the leaving record's stream up to it, if any; else the
    /// leaving record is done with (and its stream's entry freed if it has none left in the
    /// window).
    fn release_one(&mut self) -> Option<(Key, Pending)> {
        let Reorder {
            arrivals,
            window,
            pending,
            streams,
            free,
            releasing,
            ..
        } = self;
        let (index, upto) = match releasing {
            Some((_, slot)) => (slot.stream, (slot.seq, slot.t_ns)),
            None => return None,
        };
        let stream = &mut streams[index as usize];
        let next = match (stream.queue.front().copied(), stream.strays.first()) {
            (Some(queued), Some(&stray)) if stray < queued => Some((stray, true)),
            (Some(queued), _) => Some((queued, false)),
            (None, Some(&stray)) => Some((stray, true)),
            (None, None) => None,
        };
        if let Some(((seq, t_ns, at), stray)) = next {
            if (seq, t_ns) <= upto {
                if stray {
                    stream.strays.pop_first();
                } else {
                    stream.queue.pop_front();
                }
                let slot = slot_of(window, releasing, *arrivals, at);
                let (request, pending) = slot.record.take()?;
                let key = Key {
                    request,
                    hop: slot.hop,
                    source: slot.source,
                    seq,
                    t_ns,
                    arrival: at,
                };
                return Some((key, pending));
            }
        }
        *releasing = None;
        stream.in_window -= 1;
        if stream.in_window == 0 {
            // Every pending record is in the window: none is left.
            debug_assert!(stream.queue.is_empty() && stream.strays.is_empty());
            if let Some(name) = stream.name.take() {
                pending.remove(&name);
            }
            stream.queue.clear();
            if stream.queue.capacity() > KEEP_CAPACITY {
                stream.queue = VecDeque::new();
            }
            stream.strays = BTreeSet::new();
            free.push(index);
        }
        None
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

    /// The window as it was first written (one ordered map over every pending record), to
    /// check that the streams release the same records in the same order.
    fn reference(max: usize, records: &[(Key, bool)]) -> Vec<(u16, u64, u64, u64)> {
        let mut window: VecDeque<Key> = VecDeque::new();
        let mut pending: BTreeSet<Key> = BTreeSet::new();
        let mut out = Vec::new();
        let mut leave = |window: &mut VecDeque<Key>, pending: &mut BTreeSet<Key>| {
            let oldest = window.pop_front().unwrap();
            let from = Key {
                seq: 0,
                t_ns: 0,
                arrival: 0,
                ..oldest.clone()
            };
            let upto = Key {
                arrival: u64::MAX,
                ..oldest
            };
            let taken: Vec<Key> = pending.range(from..=upto).cloned().collect();
            for key in taken {
                pending.remove(&key);
                out.push((key.source, key.seq, key.t_ns, key.arrival));
            }
        };
        for (arrival, (key, flush)) in records.iter().enumerate() {
            let key = Key {
                arrival: arrival as u64,
                ..key.clone()
            };
            window.push_back(key.clone());
            pending.insert(key);
            while window.len() > max || (*flush && !window.is_empty()) {
                leave(&mut window, &mut pending);
            }
        }
        while !window.is_empty() {
            leave(&mut window, &mut pending);
        }
        out
    }

    fn through(max: usize, records: &[(Key, bool)]) -> Vec<(u16, u64, u64, u64)> {
        let mut reorder = Reorder::new(max);
        let mut out = Vec::new();
        for (key, flush) in records {
            reorder.push(key.clone(), pending());
            while let Some((key, _)) = reorder.release(*flush) {
                out.push((key.source, key.seq, key.t_ns, key.arrival));
            }
        }
        while let Some((key, _)) = reorder.release(true) {
            out.push((key.source, key.seq, key.t_ns, key.arrival));
        }
        assert!(reorder.pending.is_empty() && reorder.window.is_empty());
        out
    }

    #[test]
    fn streams_release_as_one_ordered_map_would() {
        let requests: Vec<Arc<str>> = (0..5).map(|i| format!("r{i}").into()).collect();
        // A small generator, the same on every run.
        let mut state: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for round in 0..200 {
            let max = [0, 1, 3, 16, 100, 1000][round % 6];
            let streams = 1 + next(12);
            let mut seqs = vec![0u64; streams as usize];
            let records: Vec<(Key, bool)> = (0..2000)
                .map(|_| {
                    let stream = next(streams) as usize;
                    // Mostly in order; sometimes far back, a duplicate or a tie on seq.
                    let seq = match next(10) {
                        0 => next(seqs[stream] + 1),
                        1 => seqs[stream],
                        _ => {
                            seqs[stream] += 1;
                            seqs[stream]
                        }
                    };
                    let key = Key::new(
                        requests[stream % 5].clone(),
                        (stream / 5) as u8 % 2,
                        (stream / 10) as u16,
                        seq,
                        next(4),
                    );
                    (key, next(500) == 0)
                })
                .collect();
            assert_eq!(
                through(max, &records),
                reference(max, &records),
                "round {round}"
            );
        }
        // One stream read backwards, and shuffled: out of order beyond the cheap inserts.
        let r = &requests[0];
        let backwards: Vec<(Key, bool)> = (0..3000u64)
            .rev()
            .map(|seq| (Key::new(r.clone(), 0, 0, seq, 0), false))
            .collect();
        assert_eq!(through(1000, &backwards), reference(1000, &backwards));
        let shuffled: Vec<(Key, bool)> = (0..5000u64)
            .map(|_| (Key::new(r.clone(), 0, 0, next(4000), next(3)), false))
            .collect();
        assert_eq!(through(700, &shuffled), reference(700, &shuffled));
    }
}
