//! Hop counters through the `metrics` facade (feature `metrics`).
//!
//! Names follow Prometheus conventions, with units:
//! `streamgate_gap_seconds`, `streamgate_buffer_age_seconds` and
//! `streamgate_time_to_first_event_seconds` (histograms), `streamgate_events_total` and
//! `streamgate_bytes_total` (by `kind`), `streamgate_stalls_total`, and
//! `streamgate_streams_ended_total` (by `reason`); every one labelled by `hop`.

use std::time::Duration;

use metrics::{Counter, Histogram as MetricsHistogram, counter, histogram};

use super::counters::{GapCounters, Touched};
use super::histogram::{BUCKETS, lower_bound};

/// The metric handles of one hop, registered once when the hop is created.
pub(crate) struct HopMetrics {
    hop: String,
    gaps: MetricsHistogram,
    ages: MetricsHistogram,
    first_event: MetricsHistogram,
    events: [Counter; 3],
    bytes: [Counter; 3],
    stalls: Counter,
}

impl HopMetrics {
    pub(crate) fn new(hop: &str) -> Self {
        let hop = hop.to_owned();
        let kinds = ["visible", "hidden", "control"];
        HopMetrics {
            gaps: histogram!("streamgate_gap_seconds", "hop" => hop.clone()),
            ages: histogram!("streamgate_buffer_age_seconds", "hop" => hop.clone()),
            first_event: histogram!("streamgate_time_to_first_event_seconds", "hop" => hop.clone()),
            events: kinds.map(
                |kind| counter!("streamgate_events_total", "hop" => hop.clone(), "kind" => kind),
            ),
            bytes: kinds.map(
                |kind| counter!("streamgate_bytes_total", "hop" => hop.clone(), "kind" => kind),
            ),
            stalls: counter!("streamgate_stalls_total", "hop" => hop.clone()),
            hop,
        }
    }

    /// Exports the event, byte and stall counts `now` has beyond `before`.
    pub(crate) fn add_scalars(&self, now: &GapCounters, before: &GapCounters) {
        let events = [
            now.visible_events() - before.visible_events(),
            now.hidden_events() - before.hidden_events(),
            now.control_events() - before.control_events(),
        ];
        let bytes = [
            now.visible_bytes() - before.visible_bytes(),
            now.hidden_bytes() - before.hidden_bytes(),
            now.control_bytes() - before.control_bytes(),
        ];
        for (counter, delta) in self
            .events
            .iter()
            .zip(events)
            .chain(self.bytes.iter().zip(bytes))
        {
            if delta > 0 {
                counter.increment(delta);
            }
        }
        if now.stalls() > before.stalls() {
            self.stalls.increment(now.stalls() - before.stalls());
        }
    }

    /// Exports `count` more durations in a histogram bucket, at the bucket's midpoint.
    pub(crate) fn bucket(&self, bucket: Touched, count: u64) {
        let (histogram, index) = match bucket {
            Touched::Gap(index) => (&self.gaps, index),
            Touched::Age(index) => (&self.ages, index),
        };
        let low = lower_bound(index);
        let high = if index + 1 < BUCKETS {
            lower_bound(index + 1)
        } else {
            low
        };
        let mid = (low + (high - low) / 2) as f64 / 1e9;
        histogram.record_many(mid, usize::try_from(count).unwrap_or(usize::MAX));
    }

    pub(crate) fn first_event(&self, after: Duration) {
        self.first_event.record(after.as_secs_f64());
    }

    pub(crate) fn ended(&self, reason: &'static str) {
        counter!("streamgate_streams_ended_total", "hop" => self.hop.clone(), "reason" => reason)
            .increment(1);
    }
}
