//! The tail of a stream's log that its pump keeps in memory for the readers on its own
//! instance, so a reader that keeps up is fed what the pump has just appended without reading
//! it back from Redis.

use std::collections::VecDeque;

use super::keys::EntryId;
use crate::sse::SseFrame;

/// The frames the pump appended to the log (each once Redis has it) that a reader on this
/// instance may still need, oldest first.
pub(crate) struct Tail {
    frames: VecDeque<(EntryId, SseFrame)>,
    /// The entry right before the first one held (`None`: the log's start): a reader that has
    /// it, or one held, reads on from here.
    before: Option<EntryId>,
    /// The pump runs: once it stopped, readers here read the rest of the log from Redis.
    open: bool,
    /// The pump stopped because Redis failed it: readers here end saying so.
    failed: bool,
}

/// What a reader finds in the tail after the entry it has.
pub(crate) enum Found {
    /// The entries that follow it, oldest first.
    Frames(Vec<(EntryId, SseFrame)>),
    /// Nothing follows it yet: the pump appends next what it needs.
    Nothing,
    /// It needs entries the tail does not hold (older ones, or the pump stopped): Redis has
    /// them.
    Elsewhere,
    /// The pump stopped because Redis failed it (past the outage window).
    Failed,
}

impl Tail {
    /// An empty tail of a log whose last entry is `before` (`None`: a log with no entry).
    pub(crate) fn new(before: Option<EntryId>) -> Self {
        Tail {
            frames: VecDeque::new(),
            before,
            open: true,
            failed: false,
        }
    }

    /// The pump appended `frame` as the entry `id` (after every entry held).
    pub(crate) fn push(&mut self, id: EntryId, frame: SseFrame) {
        debug_assert!(self.frames.back().is_none_or(|(last, _)| *last < id));
        self.frames.push_back((id, frame));
    }

    /// At most `max` entries after `last` (the entry the reader has; `None`: none).
    pub(crate) fn after(&self, last: Option<EntryId>, max: usize) -> Found {
        if self.failed {
            return Found::Failed;
        }
        if !self.open || last < self.before {
            return Found::Elsewhere;
        }
        // Entry ids increase: the first one past `last`.
        let from = self.frames.partition_point(|(id, _)| Some(*id) <= last);
        if from == self.frames.len() {
            return Found::Nothing;
        }
        Found::Frames(self.frames.range(from..).take(max).cloned().collect())
    }

    /// Forgets the entries no reader here needs any more: every one up to the event before
    /// `next` (the position of the slowest reader here: it has every entry up to event
    /// `next - 1`, but not what may follow that event); every one, with `None` (no reader
    /// here).
    pub(crate) fn trim(&mut self, next: Option<u64>) {
        while let Some(&(id, _)) = self.frames.front() {
            let passed = next.is_none_or(|next| id.1 == 1 && id.0 < next);
            if !passed {
                break;
            }
            self.frames.pop_front();
            self.before = Some(id);
        }
    }

    /// The pump stopped: readers here read on from Redis, or end at once if Redis `failed` it.
    pub(crate) fn close(&mut self, failed: bool) {
        self.open = false;
        self.failed = failed;
        self.frames.clear();
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::{Found, Tail};
    use crate::chunk::Kind;
    use crate::sse::SseFrame;

    fn frame(event: u64) -> SseFrame {
        SseFrame::new(
            Bytes::from(format!("id: {event}\n\n")),
            Kind::Visible,
            Some(event),
        )
    }

    fn ids(found: Found) -> Option<Vec<(u64, u64)>> {
        match found {
            Found::Frames(frames) => Some(frames.into_iter().map(|(id, _)| id).collect()),
            Found::Nothing => Some(Vec::new()),
            Found::Elsewhere | Found::Failed => None,
        }
    }

    #[test]
    fn a_reader_that_keeps_up_is_fed_from_the_tail_and_an_older_one_from_redis() {
        let mut tail = Tail::new(None);
        for event in 0..4 {
            tail.push((event, 1), frame(event));
        }
        assert_eq!(
            ids(tail.after(None, 64)),
            Some(vec![(0, 1), (1, 1), (2, 1), (3, 1)])
        );
        assert_eq!(ids(tail.after(Some((1, 1)), 1)), Some(vec![(2, 1)]));
        assert_eq!(ids(tail.after(Some((3, 1)), 64)), Some(vec![]));
        // The slowest reader here has events 0 and 1.
        tail.trim(Some(2));
        assert_eq!(
            ids(tail.after(Some((1, 1)), 64)),
            Some(vec![(2, 1), (3, 1)])
        );
        assert_eq!(
            ids(tail.after(Some((0, 1)), 64)),
            None,
            "event 1 is only in Redis"
        );
        assert_eq!(ids(tail.after(None, 64)), None);
    }

    #[test]
    fn what_follows_the_last_event_stays_until_a_reader_has_it() {
        let mut tail = Tail::new(Some((4, 1)));
        tail.push((5, 1), frame(5));
        // The terminal frame follows event 5.
        tail.push(
            (5, 2),
            SseFrame::new(Bytes::from_static(b"event: error\n\n"), Kind::Control, None),
        );
        tail.trim(Some(6));
        assert_eq!(ids(tail.after(Some((5, 1)), 64)), Some(vec![(5, 2)]));
        tail.trim(None);
        assert_eq!(ids(tail.after(Some((5, 2)), 64)), Some(vec![]));
        tail.close(false);
        assert_eq!(
            ids(tail.after(Some((5, 2)), 64)),
            None,
            "a stopped pump's readers read Redis"
        );
        tail.close(true);
        assert!(matches!(tail.after(Some((5, 2)), 64), Found::Failed));
    }
}
