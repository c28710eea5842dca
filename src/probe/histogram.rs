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

// A bucket index fits in a byte, so a stream's unflushed batch stays small.
const _: () = assert!(BUCKETS <= 256);

/// A histogram of durations (a hop's gaps, buffer ages, times to first event): counts in
/// log-linear buckets at most 12.5% wide, from 1 µs to about 4.6 minutes, and the largest
/// duration recorded.
///
/// # Examples
///
/// Nine gaps of 10 ms and one of a second, read from a hop's counters:
///
/// ```
/// use std::time::{Duration, Instant};
/// use streamgate::probe::{HopProbe, Observation};
/// use streamgate::{EndReason, Kind};
///
/// let hop = HopProbe::new("client.recv");
/// let mut recorder = hop.recorder("req-1");
/// let start = Instant::now();
/// let ms = Duration::from_millis;
/// for seq in 0..10 {
///     let token = Observation::new(Some(seq), 3, Kind::Visible);
///     recorder.observe_at(token, start + ms(10 * seq));
/// }
/// // The last gap runs to the end: a second after the last token.
/// recorder.end_at(EndReason::Completed, start + ms(90 + 1_000));
///
/// let gaps = hop.snapshot().counters.gaps().clone();
/// assert_eq!((gaps.count(), gaps.max()), (10, ms(1_000)));
/// let p50 = gaps.quantile(0.5).unwrap();
/// assert!(p50 >= ms(10) && p50 <= ms(10) * 9 / 8); // the top of 10 ms's bucket
/// assert_eq!(gaps.quantile(0.99), Some(ms(1_000))); // never above the largest
/// let buckets: Vec<(Duration, u64)> = gaps.buckets().collect();
/// assert_eq!(buckets.len(), 2);
/// assert_eq!((buckets[0].1, buckets[1].1), (9, 1));
/// assert!(buckets[0].0 <= ms(10) && buckets[1].0 <= ms(1_000));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    max: u64,
}

impl Histogram {
    pub(crate) fn new() -> Self {
        Histogram {
            counts: Box::new([0; BUCKETS]),
            max: 0,
        }
    }

    /// Counts `ns`.
    #[cfg(any(test, feature = "timeline"))]
    pub(crate) fn record(&mut self, ns: u64) {
        let index = bucket(ns);
        self.counts[index] = self.counts[index].saturating_add(1);
        self.max = self.max.max(ns);
    }

    /// Adds `counts` (bucket index, durations in it) of durations at most `max` ns long.
    #[cfg(feature = "timeline")]
    pub(crate) fn add_counts(&mut self, counts: impl IntoIterator<Item = (usize, u64)>, max: u64) {
        for (index, count) in counts {
            let cell = &mut self.counts[index.min(BUCKETS - 1)];
            *cell = cell.saturating_add(count);
        }
        self.max = self.max.max(max);
    }

    /// How many durations were recorded.
    pub fn count(&self) -> u64 {
        self.counts
            .iter()
            .fold(0u64, |sum, &count| sum.saturating_add(count))
    }

    /// The largest duration recorded (zero when empty).
    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.max)
    }

    /// An upper bound on the `q` quantile (0.0 to 1.0): the top of the bucket that holds it,
    /// so within 12.5% of the true value from 1 µs up, and never above the largest duration
    /// recorded (which bounds the last bucket, from about 4.6 minutes on). `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0u64;
        for (index, &count) in self.counts.iter().enumerate() {
            seen = seen.saturating_add(count);
            if seen >= rank {
                let top = if index + 1 < BUCKETS {
                    lower_bound(index + 1)
                } else {
                    self.max
                };
                return Some(Duration::from_nanos(top.min(self.max)));
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
    max: AtomicU64,
}

impl AtomicHistogram {
    pub(crate) fn new() -> Self {
        AtomicHistogram {
            counts: Box::new(std::array::from_fn(|_| AtomicU64::new(0))),
            max: AtomicU64::new(0),
        }
    }

    pub(crate) fn record(&self, ns: u64) {
        self.counts[bucket(ns)].fetch_add(1, Ordering::Relaxed);
        self.max.fetch_max(ns, Ordering::Relaxed);
    }

    /// Adds `count` durations to bucket `index`.
    pub(crate) fn add(&self, index: usize, count: u64) {
        self.counts[index].fetch_add(count, Ordering::Relaxed);
    }

    /// Raises the largest duration recorded to `ns`.
    pub(crate) fn raise_max(&self, ns: u64) {
        self.max.fetch_max(ns, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Histogram {
        Histogram {
            counts: Box::new(std::array::from_fn(|i| {
                self.counts[i].load(Ordering::Relaxed)
            })),
            max: self.max.load(Ordering::Relaxed),
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
        assert_eq!(histogram.quantile(1.0), Some(Duration::from_millis(100)));
        assert_eq!(Histogram::new().quantile(0.5), None);
    }

    #[test]
    fn the_last_bucket_is_bounded_by_the_largest_duration() {
        let mut histogram = Histogram::new();
        // Ten minutes is past the last bucket's start (about 4.6 minutes).
        histogram.record(Duration::from_secs(600).as_nanos() as u64);
        assert_eq!(
            bucket(Duration::from_secs(600).as_nanos() as u64),
            BUCKETS - 1
        );
        assert_eq!(histogram.quantile(0.5), Some(Duration::from_secs(600)));
        let mut histogram = Histogram::new();
        for _ in 0..3 {
            histogram.record(Duration::from_secs(5).as_nanos() as u64);
        }
        assert_eq!(histogram.quantile(1.0), Some(Duration::from_secs(5)));
    }
}
