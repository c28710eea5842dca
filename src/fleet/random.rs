//! A small random source for picks and jitter: xorshift64*, seeded per process.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

/// A shared random source: each draw advances one atomic state (no lock).
#[derive(Debug)]
pub(crate) struct Random(AtomicU64);

impl Random {
    /// A source seeded from the process's random hasher keys.
    pub(crate) fn new() -> Self {
        Random::seeded(RandomState::new().hash_one(0x5eed_u64))
    }

    /// A source that draws the same numbers for the same `seed` (tests).
    pub(crate) fn seeded(seed: u64) -> Self {
        Random(AtomicU64::new(seed | 1))
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub(crate) fn below(&self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let step = |mut x: u64| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x
        };
        let previous = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |x| Some(step(x)))
            .unwrap_or_else(|x| x);
        step(previous).wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}
