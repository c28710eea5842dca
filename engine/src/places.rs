//! The places requests may hold in the engine: a slot of the KV cache, or one of the
//! `--queue` places of those that wait for a slot. A request takes one where it arrives, or
//! is refused (503) when every place is held; the engine loop gives it back when its sequence
//! frees its slot, or when it leaves the queue without one.

use std::sync::atomic::{AtomicU64, Ordering};

/// The places: `--parallel` slots and `--queue` waiting places.
#[derive(Debug)]
pub struct Places {
    held: AtomicU64,
    total: u64,
}

impl Places {
    /// `slots` slots and `queue` waiting places, none held.
    pub fn new(slots: u32, queue: usize) -> Self {
        Places {
            held: AtomicU64::new(0),
            total: u64::from(slots).saturating_add(queue as u64),
        }
    }

    /// Takes a place, or says how many are held (all of them).
    pub fn take(&self) -> Result<(), u64> {
        let total = self.total;
        self.held
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < total).then_some(n + 1)
            })
            .map(|_| ())
    }

    /// Gives a place back.
    pub fn give_back(&self) {
        self.held.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_is_a_slot_or_a_waiting_one_and_comes_back() {
        let places = Places::new(2, 1);
        assert!((0..3).all(|_| places.take().is_ok()));
        assert_eq!(places.take(), Err(3));
        places.give_back();
        assert!(places.take().is_ok());
        let no_queue = Places::new(1, 0);
        assert!(
            no_queue.take().is_ok(),
            "an idle server takes a request with --queue 0"
        );
        assert!(no_queue.take().is_err());
    }
}
