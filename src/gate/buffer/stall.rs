//! The slow-consumer clock: when a consumer that does not drain the buffer has held the
//! generator up for longer than the policy allows.

use tokio::time::Instant as Clock;

use super::progress::Progress;
use crate::gate::policy::Deadline;

/// Armed when a chunk finds the buffer full (or a finished generator leaves events waiting),
/// disarmed when a chunk is admitted; the gate's task holds a timer for it and asks
/// [`expire`](StallClock::expire) when it fires.
///
/// Times here are tokio's (`Clock`), so the gate's timers agree with them when a test pauses
/// time.
pub(crate) struct StallClock {
    /// The policy's limit; `None`: the clock never runs.
    deadline: Option<Deadline>,
    running: Option<Stall>,
    /// When the consumer last took an event while a sender waited for room.
    last_take: Option<Clock>,
    /// The gate's task holds a timer for the clock: a re-armed clock needs no wake-up.
    watched: bool,
}

/// A running clock.
#[derive(Clone, Copy)]
struct Stall {
    since: Clock,
    /// The consumer's take count when the clock started.
    takes: u64,
}

impl StallClock {
    /// A stopped clock with the policy's `deadline`.
    pub(crate) fn new(deadline: Option<Deadline>) -> Self {
        StallClock {
            deadline,
            running: None,
            last_take: None,
            watched: false,
        }
    }

    /// Starts the clock now unless it runs or the policy has none; returns whether the gate's
    /// task must be woken to set a timer for it (it holds none yet).
    pub(crate) fn start(&mut self, progress: &Progress) -> bool {
        if self.running.is_some() || self.deadline.is_none() {
            return false;
        }
        self.running = Some(Stall {
            since: Clock::now(),
            takes: progress.takes(),
        });
        !self.watched
    }

    /// Stops the clock: a chunk was admitted, or the stream ended.
    pub(crate) fn stop(&mut self) {
        self.running = None;
    }

    /// The consumer took an event at `at` while a sender waited: where a clock that forgives a
    /// take restarts.
    pub(crate) fn took(&mut self, at: Clock) {
        self.last_take = Some(at);
    }

    /// When the clock runs out, if it runs, for the gate's task, which then holds a timer for
    /// it (or none, if it does not run).
    pub(crate) fn watch(&mut self) -> Option<Clock> {
        let deadline = match (self.running, self.deadline) {
            (Some(stall), Some(deadline)) => stall.since.checked_add(deadline.limit),
            // A deadline too far away to represent is no deadline at all.
            _ => None,
        };
        self.watched = deadline.is_some();
        deadline
    }

    /// Whether the clock runs and has run out at `now`.
    pub(crate) fn is_due(&self, now: Clock) -> bool {
        let (Some(stall), Some(deadline)) = (self.running, self.deadline) else {
            return false;
        };
        stall
            .since
            .checked_add(deadline.limit)
            .is_some_and(|at| now >= at)
    }

    /// The clock is due at `now` ([`is_due`](StallClock::is_due)): whether the consumer is to
    /// blame, so the stream ends as a slow consumer. It is not when it has `caught_up` (the
    /// clock stops), nor, when the policy forgives a take (or the generator has `finished`),
    /// when it took something within the limit (the clock restarts at that take).
    pub(crate) fn expire(
        &mut self,
        now: Clock,
        caught_up: bool,
        finished: bool,
        progress: &Progress,
    ) -> bool {
        let (Some(stall), Some(deadline)) = (self.running, self.deadline) else {
            return false;
        };
        if caught_up {
            // The consumer is not the slow one.
            self.running = None;
            return false;
        }
        let takes = progress.takes();
        // A generator that finished waits for its consumer on every policy's terms: the
        // consumer must take something within the limit.
        if (deadline.restarts_on_take || finished) && takes != stall.takes {
            // The clock restarts at the last take, when it is known (a sender was waiting),
            // so a reader that took one event and stopped is ended on time.
            let since = self.last_take.filter(|&at| at > stall.since).unwrap_or(now);
            self.running = Some(Stall { since, takes });
            if since.checked_add(deadline.limit).is_none_or(|at| now < at) {
                return false;
            }
        }
        true
    }
}
