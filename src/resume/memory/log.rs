//! The replay log: a stream's recent events, bounded by events and bytes.

use std::collections::VecDeque;

use crate::chunk::Chunk;
use crate::gate::Event;

/// A stream's recent events, oldest first, within `max_events` and `max_bytes` (one event
/// larger than the byte bound is held alone, so nothing deadlocks).
#[derive(Debug)]
pub(crate) struct ReplayLog<C> {
    events: VecDeque<Event<C>>,
    bytes: usize,
    max_events: usize,
    max_bytes: usize,
    /// Ids below this were evicted: a position before it can no longer be replayed.
    start: u64,
}

/// What the log holds for a subscriber that needs the event with id `next` (or the first one
/// after it).
#[derive(Debug)]
pub(crate) enum Lookup<C> {
    /// The first event whose ids reach `next`.
    Event(Event<C>),
    /// Nothing yet.
    Nothing,
    /// `next` was evicted: the log starts at this id.
    Behind(u64),
}

impl<C: Chunk + Clone> ReplayLog<C> {
    pub(crate) fn new(max_events: usize, max_bytes: usize) -> Self {
        ReplayLog {
            events: VecDeque::new(),
            bytes: 0,
            max_events: max_events.max(1),
            max_bytes: max_bytes.max(1),
            start: 0,
        }
    }

    /// Whether `event` can be appended without evicting.
    pub(crate) fn fits(&self, event: &Event<C>) -> bool {
        self.events.is_empty()
            || (self.events.len() < self.max_events
                && self.bytes.saturating_add(event.chunk().byte_len()) <= self.max_bytes)
    }

    pub(crate) fn push(&mut self, event: Event<C>) {
        self.bytes += event.chunk().byte_len();
        self.events.push_back(event);
    }

    /// The id after the oldest event's last, once it would be evicted; `None` when empty.
    pub(crate) fn oldest_end(&self) -> Option<u64> {
        self.events
            .front()
            .map(|event| event.id().saturating_add(1))
    }

    /// Drops the oldest event.
    pub(crate) fn evict(&mut self) {
        if let Some(event) = self.events.pop_front() {
            self.bytes -= event.chunk().byte_len();
            self.start = event.id().saturating_add(1);
        }
    }

    /// Drops every event (the stream will not be replayed again).
    pub(crate) fn clear(&mut self) {
        if let Some(end) = self.events.back().map(|event| event.id().saturating_add(1)) {
            self.start = end;
        }
        self.events.clear();
        self.bytes = 0;
    }

    /// The id after the newest event (the next one the log expects).
    pub(crate) fn end(&self) -> u64 {
        self.events
            .back()
            .map_or(self.start, |event| event.id().saturating_add(1))
    }

    /// The first id the log can still replay.
    pub(crate) fn start(&self) -> u64 {
        self.start
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn lookup(&self, next: u64) -> Lookup<C> {
        if next < self.start {
            return Lookup::Behind(self.start);
        }
        // Ids increase along the log: the first event reaching `next`.
        let at = self.events.partition_point(|event| event.id() < next);
        match self.events.get(at) {
            Some(event) => Lookup::Event(event.clone()),
            None => Lookup::Nothing,
        }
    }
}
