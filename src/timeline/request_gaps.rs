//! Each request's visible gaps at the hop slices measure them at (the path's last), by output
//! position bucket, in the histogram's buckets, kept sparse: a few buckets hold a stream's
//! gaps, whatever its length.

use std::collections::HashMap;
use std::sync::Arc;

use super::budget::DetailBudget;
use crate::probe::{Histogram, bucket};

/// One request's gaps: (position bucket, gap bucket, count), sorted, and the longest.
#[derive(Debug, Default)]
struct Gaps {
    counts: Vec<(u8, u8, u32)>,
    max: u64,
    /// A gap was not kept (the budget was spent): its p99 is not known.
    incomplete: bool,
}

/// Every request's gaps at one hop.
#[derive(Debug, Default)]
pub(super) struct RequestGaps {
    by_request: HashMap<Arc<str>, Gaps>,
}

impl RequestGaps {
    /// Counts a gap of `ns` of `request` in position bucket `position`; a pair of buckets new
    /// to the request is one detail of `budget` (none left: the request's gaps are incomplete
    /// from then on).
    pub(super) fn add(
        &mut self,
        request: &Arc<str>,
        position: u8,
        ns: u64,
        budget: &mut DetailBudget,
    ) {
        let gaps = self.by_request.entry(request.clone()).or_default();
        if gaps.incomplete {
            return;
        }
        // Buckets fit in a byte (checked where they are made).
        let key = (position, bucket(ns) as u8);
        match gaps.counts.binary_search_by_key(&key, |&(p, b, _)| (p, b)) {
            Ok(at) => gaps.counts[at].2 = gaps.counts[at].2.saturating_add(1),
            Err(at) if budget.take() => gaps.counts.insert(at, (key.0, key.1, 1)),
            Err(_) => {
                gaps.incomplete = true;
                return;
            }
        }
        gaps.max = gaps.max.max(ns);
    }

    /// Adds `request`'s gaps (those in position bucket `position`, when given) to `into`;
    /// false when some were not kept.
    pub(super) fn add_to(&self, request: &str, position: Option<u8>, into: &mut Histogram) -> bool {
        let Some(gaps) = self.by_request.get(request) else {
            return true;
        };
        let counts = gaps
            .counts
            .iter()
            .filter(|&&(p, _, _)| position.is_none_or(|position| p == position))
            .map(|&(_, index, count)| (usize::from(index), u64::from(count)));
        // The longest of the request's gaps bounds those of any position bucket.
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
        let mut budget = DetailBudget::new(3);
        let r: Arc<str> = "r".into();
        for _ in 0..98 {
            gaps.add(&r, 0, 20_000_000, &mut budget);
        }
        gaps.add(&r, 0, 2_000_000_000, &mut budget);
        gaps.add(&r, 1, 20_000_000, &mut budget);
        let mut histogram = Histogram::default();
        assert!(gaps.add_to("r", None, &mut histogram));
        assert_eq!(histogram.count(), 100);
        assert_eq!(histogram.max(), Duration::from_secs(2));
        assert!(histogram.quantile(0.5).unwrap() < Duration::from_millis(23));
        let mut second = Histogram::default();
        assert!(gaps.add_to("r", Some(1), &mut second));
        assert_eq!(second.count(), 1);
        assert!(second.quantile(1.0).unwrap() < Duration::from_millis(23));
        // A fourth pair of buckets is past the budget: the request's gaps are incomplete.
        gaps.add(&r, 0, 500_000, &mut budget);
        assert!(!gaps.add_to("r", None, &mut Histogram::default()));
        assert!(gaps.add_to("unknown", None, &mut Histogram::default()));
    }
}
