//! `serde::Serialize` for the probe snapshots (feature `serde`): plain numbers, durations in
//! nanoseconds, histograms as their non-empty buckets plus p50/p99, end counts as an object of
//! the reasons that occurred.

use serde::ser::{Serialize, SerializeMap, SerializeStruct, Serializer};

use super::counters::GapCounters;
use super::histogram::Histogram;
use super::hop::HopSnapshot;
use crate::end::EndCounts;

fn nanos(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

impl Serialize for Histogram {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let buckets: Vec<(u64, u64)> = self.buckets().map(|(low, n)| (nanos(low), n)).collect();
        let mut out = serializer.serialize_struct("Histogram", 5)?;
        out.serialize_field("count", &self.count())?;
        out.serialize_field("max_ns", &nanos(self.max()))?;
        out.serialize_field("p50_ns", &self.quantile(0.5).map(nanos))?;
        out.serialize_field("p99_ns", &self.quantile(0.99).map(nanos))?;
        out.serialize_field("buckets", &buckets)?;
        out.end()
    }
}

impl Serialize for GapCounters {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct Positions<'a>(&'a GapCounters);
        impl Serialize for Positions<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(Some(5))?;
                for class in self.0.by_position() {
                    map.serialize_entry(
                        class.class,
                        &[
                            class.gaps,
                            nanos(class.total),
                            nanos(class.max),
                            class.stalls,
                        ],
                    )?;
                }
                map.end()
            }
        }
        let mut out = serializer.serialize_struct("GapCounters", 15)?;
        out.serialize_field("visible_events", &self.visible_events())?;
        out.serialize_field("visible_bytes", &self.visible_bytes())?;
        out.serialize_field("hidden_events", &self.hidden_events())?;
        out.serialize_field("hidden_bytes", &self.hidden_bytes())?;
        out.serialize_field("control_events", &self.control_events())?;
        out.serialize_field("control_bytes", &self.control_bytes())?;
        out.serialize_field("gaps", self.gaps())?;
        out.serialize_field("max_gap_ns", &nanos(self.max_gap()))?;
        out.serialize_field("stalls", &self.stalls())?;
        out.serialize_field("stalls_at_end", &self.stalls_at_end())?;
        out.serialize_field("max_quiet_ns", &nanos(self.max_quiet()))?;
        // Per class: [gaps, total_ns, max_ns, stalls].
        out.serialize_field("by_position", &Positions(self))?;
        out.serialize_field("buffer_age", self.buffer_age())?;
        out.serialize_field("max_buffer_age_ns", &nanos(self.max_buffer_age()))?;
        out.serialize_field("peak_waiting", &self.peak_waiting())?;
        out.end()
    }
}

impl Serialize for EndCounts {
    /// `{"completed": 3, "consumer_gone": 1}`: the reasons with a count above zero.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let occurred = self.occurred();
        let mut out = serializer.serialize_map(Some(occurred.len()))?;
        for (reason, n) in occurred {
            out.serialize_entry(reason.as_str(), &n)?;
        }
        out.end()
    }
}

impl Serialize for HopSnapshot {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut out = serializer.serialize_struct("HopSnapshot", 5)?;
        out.serialize_field("hop", &self.hop)?;
        out.serialize_field("streams_started", &self.streams_started)?;
        out.serialize_field("streams_ended", &self.streams_ended)?;
        out.serialize_field("counters", &self.counters)?;
        out.serialize_field("time_to_first_event", &self.time_to_first_event)?;
        out.end()
    }
}
