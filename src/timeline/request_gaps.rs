//! Each request's visible gaps at the hop slices measure them at (the path's last), in the
//! histogram's buckets, kept sparse: a few buckets hold a stream's gaps, whatever its length.

use std::collections::HashMap;
use std::sync::Arc;

use super::budget::DetailBudget;
use crate::probe::{Histogram, bucket};

/// One request's gaps: (bucket, count) by bucket, and the longest.
#[derive(Debug, Default)]
struct Gaps {
    counts: Vec<(u8, u32)>,
    max: u64,
    /// A gap was not kept (the detail budget was spent): its p99 is not known.
    incomplete: bool,
}

/// Every request's gaps at one hop.
#[derive(Debug, Default)]
pub(super) struct RequestGaps {
    by_request: HashMap<Arc<str>, Gaps>,
}

impl RequestGaps {
    /// Counts a gap of `ns` of `request`; a bucket new to the request is one detail of
    /// `budget` (none left: the request's gaps are incomplete from then on).
    pub(super) fn add(&mut self, request: &Arc<str>, ns: u64, budget: &mut DetailBudget) {
        let gaps = self.by_request.entry(request.clone()).or_default();
        if gaps.incomplete {
            return;
        }
        // Buckets fit in a byte (checked where they are made).
        let index = bucket(ns) as u8;
        match gaps.counts.binary_search_by_key(&index, |&(b, _)| b) {
            Ok(at) => gaps.counts[at].1 = gaps.counts[at].1.saturating_add(1),
            Err(at) if budget.take() => gaps.counts.insert(at, (index, 1)),
            Err(_) => {
                gaps.incomplete = true;
                return;
            }
        }
        gaps.max = gaps.max.max(ns);
    }

    /// Adds `request`'s gaps to `into`; false when some were not kept.
    pub(super) fn add_to(&self, request: &str, into: &mut Histogram) -> bool {
        let Some(gaps) = self.by_request.get(request) else {
            return true;
        };
        let counts = gaps
            .counts
            .iter()
            .map(|&(index, count)| (usize::from(index), u64::from(count)));
        into.add_counts(counts, gaps.max);
        !gaps.incomplete
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_requests_gaps_add_up_in_a_histogram() {
        let mut gaps = RequestGaps::default();
        let mut budget = DetailBudget::new(2);
        let r: Arc<str> = "r".into();
        for _ in 0..98 {
            gaps.add(&r, 20_000_000, &mut budget);
        }
        gaps.add(&r, 2_000_000_000, &mut budget);
        let mut histogram = Histogram::default();
        assert!(gaps.add_to("r", &mut histogram));
        assert_eq!(histogram.count(), 99);
        assert_eq!(histogram.max(), Duration::from_secs(2));
        assert!(histogram.quantile(0.5).unwrap() < Duration::from_millis(23));
        // A third bucket is past the budget: the request's gaps are incomplete.
        gaps.add(&r, 500_000, &mut budget);
        assert!(!gaps.add_to("r", &mut Histogram::default()));
        assert!(gaps.add_to("unknown", &mut Histogram::default()));
    }
}
