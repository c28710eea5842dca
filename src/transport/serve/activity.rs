//! What a connection is doing: how many requests it has in flight and since when it is idle,
//! whether a request head is being read and since when, and what is due when its timer fires.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::timeouts::{Timeouts, later};

/// The most often a connection that is busy looks whether it has become idle.
const BUSY_RECHECK: Duration = Duration::from_millis(10);

/// `head` when no request head has begun.
const NO_HEAD: u64 = u64::MAX;

/// What is due when a connection's timer fires.
pub(super) enum Due {
    /// Nothing before this instant.
    Later(Instant),
    /// Idle for the idle timeout: close gracefully.
    Idle,
    /// A request head took too long: drop the connection.
    HeaderTimeout,
    /// Asked to close, the connection is still open with nothing in flight: drop it.
    Unanswered,
}

/// What a connection is doing, shared by its task, its socket and its requests' bodies (which
/// may be polled on other tasks, over HTTP/2). Times are nanoseconds since `start`.
#[derive(Debug)]
pub(super) struct Activity {
    /// When the connection was accepted.
    start: Instant,
    /// Requests whose response body has not been dropped.
    in_flight: AtomicUsize,
    /// When a request last left, or `start`.
    idle_since: AtomicU64,
    /// When the first byte of the request head being read arrived, or [`NO_HEAD`]. Written
    /// on the connection's task only (by its socket and at each request's start).
    head: AtomicU64,
}

impl Activity {
    /// A connection accepted now, idle.
    pub(super) fn new() -> Self {
        Activity {
            start: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            head: AtomicU64::new(NO_HEAD),
        }
    }

    /// When the connection was accepted.
    pub(super) fn start(&self) -> Instant {
        self.start
    }

    fn now(&self) -> u64 {
        let elapsed = self.start.elapsed().as_nanos();
        // `NO_HEAD` is never a time: 584 years.
        u64::try_from(elapsed)
            .unwrap_or(NO_HEAD - 1)
            .min(NO_HEAD - 1)
    }

    /// The instant `nanos` after the start.
    pub(super) fn at(&self, nanos: u64) -> Instant {
        later(self.start, Duration::from_nanos(nanos))
    }

    /// A request's head has been read: it is in flight, and the next head's time starts with
    /// its first byte.
    pub(super) fn request_began(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.no_head();
    }

    /// A request's response body has been dropped.
    pub(super) fn request_ended(&self) {
        // Stored before the release, so whoever sees the count at zero sees this time.
        self.idle_since.fetch_max(self.now(), Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Release);
    }

    /// Bytes arrived that may begin a request head: they do while no request is in flight and
    /// no head is being read already.
    pub(super) fn head_began(&self) {
        if self.in_flight.load(Ordering::Relaxed) == 0
            && self.head.load(Ordering::Relaxed) == NO_HEAD
        {
            self.head.store(self.now(), Ordering::Relaxed);
        }
    }

    /// No request head is being read (HTTP/2 has none to time).
    pub(super) fn no_head(&self) {
        self.head.store(NO_HEAD, Ordering::Relaxed);
    }

    /// When the request head being read began (nanoseconds since the start), if one is.
    pub(super) fn head(&self) -> Option<u64> {
        let head = self.head.load(Ordering::Relaxed);
        (head != NO_HEAD).then_some(head)
    }

    /// What is due at `now`, for a connection with these `timeouts`, asked to close at
    /// `closing` if it was.
    pub(super) fn due(&self, now: Instant, timeouts: Timeouts, closing: Option<Instant>) -> Due {
        // Acquire: the `idle_since` stored before the last request's release is seen.
        let busy = self.in_flight.load(Ordering::Acquire) > 0;
        if let Some(since) = closing {
            // A request in flight is never cut: look again later.
            let due = later(since, timeouts.header_read);
            return match (busy, due <= now) {
                (false, true) => Due::Unanswered,
                (true, true) => Due::Later(later(now, timeouts.header_read.max(BUSY_RECHECK))),
                (_, false) => Due::Later(due),
            };
        }
        if busy {
            // Once a request leaves, the idle deadline counts from then: looking again after
            // `idle` is early enough to close on time.
            return Due::Later(later(now, timeouts.idle.max(BUSY_RECHECK)));
        }
        if let Some(head) = self.head() {
            let due = later(self.at(head), timeouts.header_read);
            return if due <= now {
                Due::HeaderTimeout
            } else {
                Due::Later(due)
            };
        }
        let due = later(
            self.at(self.idle_since.load(Ordering::Relaxed)),
            timeouts.idle,
        );
        if due <= now {
            Due::Idle
        } else {
            Due::Later(due)
        }
    }
}
