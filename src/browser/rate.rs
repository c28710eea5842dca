//! The rate at which pages may write records: a token bucket shared by every page.

use std::sync::Mutex;
use std::time::Instant;

/// Records a second, with a burst of two seconds' worth.
#[derive(Debug)]
pub(super) struct Rate {
    per_second: f64,
    state: Mutex<(f64, Instant)>,
}

impl Rate {
    pub(super) fn new(per_second: u32) -> Self {
        let per_second = f64::from(per_second);
        Rate {
            per_second,
            state: Mutex::new((2.0 * per_second, Instant::now())),
        }
    }

    /// Takes room for `records` now, or none when there is not enough.
    pub(super) fn take(&self, records: usize) -> bool {
        self.take_at(records, Instant::now())
    }

    fn take_at(&self, records: usize, now: Instant) -> bool {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (room, since) = &mut *state;
        let elapsed = now.saturating_duration_since(*since).as_secs_f64();
        *room = (*room + elapsed * self.per_second).min(2.0 * self.per_second);
        *since = now.max(*since);
        let wanted = records as f64;
        if wanted > *room {
            return false;
        }
        *room -= wanted;
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_flood_is_held_to_the_rate() {
        let rate = Rate::new(100);
        let start = Instant::now();
        assert!(rate.take_at(150, start), "within the burst");
        assert!(rate.take_at(50, start));
        assert!(!rate.take_at(1, start), "the burst is spent");
        assert!(!rate.take_at(60, start + Duration::from_millis(500)));
        assert!(rate.take_at(50, start + Duration::from_millis(500)));
        // Idle for long: the room is back to the burst, no more.
        assert!(!rate.take_at(201, start + Duration::from_secs(60)));
        assert!(rate.take_at(200, start + Duration::from_secs(60)));
    }
}
