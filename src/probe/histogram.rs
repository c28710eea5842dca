//! A log-linear histogram of durations, from a microsecond to minutes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Sub-buckets per power of two: 8, so a bucket is at most 12.5% wide.
const SUB_BITS: u32 = 3;
/// Durations under 2^10 ns (~1 µs) share the first bucket.
const MIN_EXP: u32 = 10;
/// Durations from 2^38 ns (~4.6 min) on share the last bucket.
const MAX_EXP: u32 = 38;
/// The number of buckets.
pub(crate) const BUCKETS: usize = 2 + ((MAX_EXP - MIN_EXP) << SUB_BITS) as usize;

/// The bucket of a duration of `ns` nanoseconds.
pub(crate) fn bucket(ns: u64) -> usize {
    if ns < 1 << MIN_EXP {
        return 0;
    }
    let exp = 63 - ns.leading_zeros();
    if exp >= MAX_EXP {
        return BUCKETS - 1;
    }
    let sub = (ns >> (exp - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    1 + (((exp - MIN_EXP) << SUB_BITS) as usize) + sub as usize
}

/// The smallest duration, in nanoseconds, that falls in bucket `index`.
pub(crate) fn lower_bound(index: usize) -> u64 {
    match index {
        0 => 0,
        i if i >= BUCKETS - 1 => 1 << MAX_EXP,
        i => {
            let j = (i - 1) as u32;
            let exp = MIN_EXP + (j >> SUB_BITS);
            let sub = u64::from(j & ((1 << SUB_BITS) - 1));
            (1 << exp) + (sub << (exp - SUB_BITS))
        }
    }
}

/// A histogram owned by one writer: plain counts.
#[derive(Clone, PartialEq, Eq)]
pub struct Histogram {
    counts: Box<[u64; BUCKETS]>,
}

impl Histogram {
    pub(crate) fn new() -> Self {
        Histogram {
            counts: Box::new([0; BUCKETS]),
        }
    }

    /// Counts `ns`; returns the bucket it fell in.
    pub(crate) fn record(&mut self, ns: u64) -> usize {
        let index = bucket(ns);
        self.counts[index] += 1;
        index
    }

    /// Adds what bucket `index` of `self` has beyond `before` (an earlier copy) to `into`, and
    /// brings `before` up to date; returns the increase.
    pub(crate) fn sync_bucket(
        &self,
        before: &mut Histogram,
        index: usize,
        into: &AtomicHistogram,
    ) -> u64 {
        let delta = self.counts[index] - before.counts[index];
        if delta > 0 {
            into.counts[index].fetch_add(delta, Ordering::Relaxed);
            before.counts[index] = self.counts[index];
        }
        delta
    }

    /// How many durations were recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// An upper bound on the `q` quantile (0.0 to 1.0): the top of the bucket that holds it,
    /// so within 12.5% of the true value from 1 µs up. `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (index, &count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                let top = if index + 1 < BUCKETS {
                    lower_bound(index + 1)
                } else {
                    u64::MAX
                };
                return Some(Duration::from_nanos(top));
            }
        }
        None
    }

    /// The non-empty buckets: the smallest duration each holds, and its count.
    pub fn buckets(&self) -> impl Iterator<Item = (Duration, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, count)| **count > 0)
            .map(|(index, &count)| (Duration::from_nanos(lower_bound(index)), count))
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram::new()
    }
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("count", &self.count())
            .field("p50", &self.quantile(0.5))
            .field("p99", &self.quantile(0.99))
            .finish()
    }
}

/// A histogram shared by many writers (a hop's aggregate): atomic counts.
pub(crate) struct AtomicHistogram {
    counts: Box<[AtomicU64; BUCKETS]>,
}

impl AtomicHistogram {
    pub(crate) fn new() -> Self {
        AtomicHistogram {
            counts: Box::new(std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }

    pub(crate) fn record(&self, ns: u64) {
        self.counts[bucket(ns)].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Histogram {
        Histogram {
            counts: Box::new(std::array::from_fn(|i| {
                self.counts[i].load(Ordering::Relaxed)
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_narrow() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1023), 0);
        assert_eq!(bucket(1024), 1);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        for index in 1..BUCKETS - 1 {
            let (low, high) = (lower_bound(index), lower_bound(index + 1));
            assert_eq!(bucket(low), index);
            assert_eq!(bucket(high - 1), index);
            assert!(
                (high - low) * 8 <= low,
                "bucket {index} is at most 12.5% wide"
            );
        }
    }

    #[test]
    fn quantiles_bound_the_true_value() {
        let mut histogram = Histogram::new();
        for ms in 1..=100u64 {
            histogram.record(ms * 1_000_000);
        }
        let p50 = histogram.quantile(0.5).unwrap();
        assert!(p50 >= Duration::from_millis(50) && p50 <= Duration::from_micros(56_250));
        let p99 = histogram.quantile(0.99).unwrap();
        assert!(p99 >= Duration::from_millis(99) && p99 <= Duration::from_micros(111_375));
        assert_eq!(Histogram::new().quantile(0.5), None);
    }
}
