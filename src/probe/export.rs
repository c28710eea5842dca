//! Hop counters through the `metrics` facade (feature `metrics`).
//!
//! The names, units and labels are listed in the `probe` module's documentation.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use metrics::{Counter, Histogram as MetricsHistogram, Unit, counter, histogram};

use super::counters::Batch;
use crate::end::EndReason;

/// Bucket boundaries, in seconds, for the crate's histograms: from 100 µs to 10 minutes.
///
/// # Examples
///
/// A Prometheus exporter (`metrics-exporter-prometheus`) with these buckets, so that a 5 s
/// stall shows in the `le="5"` bucket rather than in a short window's summary:
///
/// ```
/// use std::time::{Duration, Instant};
/// use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
/// use streamgate::probe::{HopProbe, METRIC_BUCKETS, Observation, describe_metrics};
/// use streamgate::{EndReason, Kind};
///
/// let recorder = PrometheusBuilder::new()
///     .set_buckets_for_metric(Matcher::Prefix("streamgate_".into()), &METRIC_BUCKETS)?
///     .build_recorder();
/// let handle = recorder.handle();
/// // Here a local recorder; an application installs one (see below).
/// metrics::with_local_recorder(&recorder, || {
///     describe_metrics();
///     let hop = HopProbe::new("client.recv");
///     let mut stream = hop.recorder("req-1");
///     let start = Instant::now();
///     let token = |seq| Observation::new(Some(seq), 3, Kind::Visible);
///     stream.observe_at(token(0), start);
///     stream.observe_at(token(1), start + Duration::from_secs(5)); // a 5 s stall
///     stream.end_at(EndReason::Completed, start + Duration::from_secs(5));
/// });
///
/// let page = handle.render();
/// assert!(page.contains("# HELP streamgate_gap_seconds"));
/// assert!(page.contains(r#"streamgate_gap_seconds_bucket{hop="client.recv",le="2"} 1"#));
/// assert!(page.contains(r#"streamgate_gap_seconds_bucket{hop="client.recv",le="5"} 2"#));
/// assert!(page.contains(r#"streamgate_stalls_total{hop="client.recv"} 1"#));
/// # Ok::<(), metrics_exporter_prometheus::BuildError>(())
/// ```
///
/// An installed exporter keeps each histogram sample until an upkeep folds it into its
/// bucket; without its HTTP listener (which runs the upkeep), run it yourself:
///
/// ```no_run
/// # use std::time::Duration;
/// # use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
/// # use streamgate::probe::{METRIC_BUCKETS, describe_metrics};
/// # #[tokio::main]
/// # async fn main() -> Result<(), metrics_exporter_prometheus::BuildError> {
/// let handle = PrometheusBuilder::new()
///     .set_buckets_for_metric(Matcher::Prefix("streamgate_".into()), &METRIC_BUCKETS)?
///     .install_recorder()?;
/// describe_metrics();
/// tokio::spawn(async move {
///     loop {
///         tokio::time::sleep(Duration::from_secs(1)).await;
///         handle.run_upkeep();
///     }
/// });
/// # Ok(())
/// # }
/// ```
pub const METRIC_BUCKETS: [f64; 22] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0,
    5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Describes every metric of the crate (unit and help text) to the recorder in effect: call it
/// once after installing the recorder, so that an exporter writes `# HELP` lines.
///
/// See [`METRIC_BUCKETS`] for an example.
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_histogram};
    describe_histogram!(
        "streamgate_gap_seconds",
        Unit::Seconds,
        "Time between consecutive visible events at a hop, and from a stream's last visible event to its end"
    );
    describe_histogram!(
        "streamgate_buffer_age_seconds",
        Unit::Seconds,
        "How long events waited in a gate before the hop took them"
    );
    describe_histogram!(
        "streamgate_time_to_first_event_seconds",
        Unit::Seconds,
        "Time from a stream's start at a hop to its first visible event"
    );
    describe_counter!(
        "streamgate_events_total",
        Unit::Count,
        "Events seen at a hop, by kind"
    );
    describe_counter!(
        "streamgate_bytes_total",
        Unit::Bytes,
        "Bytes of events seen at a hop, by kind"
    );
    describe_counter!(
        "streamgate_stalls_total",
        Unit::Count,
        "Quiet spells at or above a hop's stall threshold, the ones streams ended in included"
    );
    describe_counter!(
        "streamgate_streams_ended_total",
        Unit::Count,
        "Streams ended at a hop, by end reason and whether they ended in a stall"
    );
    describe_counter!(
        "streamgate_hop_records_total",
        Unit::Count,
        "Hop records written, dropped (queue full) or failed (write error)"
    );
}

/// One hop's metric handles, looked up again when the recorder in effect changes.
pub(crate) struct HopMetrics {
    hop: Arc<str>,
    /// The recorder the handles belong to (its address), and the handles.
    current: RwLock<(usize, Arc<Handles>)>,
}

impl HopMetrics {
    pub(crate) fn new(hop: Arc<str>) -> Self {
        let handles = Arc::new(Handles::new(&hop));
        HopMetrics {
            current: RwLock::new((recorder_address(), handles)),
            hop,
        }
    }

    /// The handles for a stream starting now: the same as the last stream's unless the
    /// recorder in effect changed since.
    pub(crate) fn handles(&self) -> Arc<Handles> {
        let address = recorder_address();
        {
            let current = self.current.read().unwrap_or_else(PoisonError::into_inner);
            if current.0 == address {
                return current.1.clone();
            }
        }
        let handles = Arc::new(Handles::new(&self.hop));
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = (address, handles.clone());
        handles
    }
}

/// Which recorder `metrics` uses here and now (the global one, a local one, or its no-op), by
/// address.
fn recorder_address() -> usize {
    metrics::with_recorder(|recorder| std::ptr::from_ref(recorder).cast::<()>() as usize)
}

/// The handles of one hop's metrics, registered with one recorder.
pub(crate) struct Handles {
    gaps: MetricsHistogram,
    ages: MetricsHistogram,
    first_event: MetricsHistogram,
    events: [Counter; 3],
    bytes: [Counter; 3],
    stalls: Counter,
    /// By [`EndReason::index`], then not stalled / stalled.
    ended: [[Counter; 2]; EndReason::ALL.len()],
}

const KINDS: [&str; 3] = ["visible", "hidden", "control"];
const STALLED: [&str; 2] = ["false", "true"];

impl Handles {
    fn new(hop: &Arc<str>) -> Self {
        let label = || hop.to_string();
        Handles {
            gaps: histogram!("streamgate_gap_seconds", "hop" => label()),
            ages: histogram!("streamgate_buffer_age_seconds", "hop" => label()),
            first_event: histogram!("streamgate_time_to_first_event_seconds", "hop" => label()),
            events: KINDS
                .map(|kind| counter!("streamgate_events_total", "hop" => label(), "kind" => kind)),
            bytes: KINDS
                .map(|kind| counter!("streamgate_bytes_total", "hop" => label(), "kind" => kind)),
            stalls: counter!("streamgate_stalls_total", "hop" => label()),
            ended: EndReason::ALL
                .map(|reason| STALLED.map(|stalled| ended(label(), reason, stalled))),
        }
    }

    /// Exports a stream's batch of counts (before it is added to the hop and emptied); its
    /// gaps and waits went to the histograms as they were measured.
    pub(crate) fn export(&self, batch: &Batch) {
        let (events, bytes, stalls) = batch.sums();
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
        if stalls > 0 {
            self.stalls.increment(stalls);
        }
    }

    /// Records one gap as it is measured. A histogram takes one value per call (the facade's
    /// `record_many` repeats `record`: Prometheus's reads the clock and pushes once per value),
    /// so recording a batch's gaps at a flush costs as much as recording each here, but the
    /// stream's last flush, at its end, would pay for up to 64 of them on the path that drops
    /// the stream (a client's disconnect, before the generator's release).
    pub(crate) fn gap(&self, ns: u64) {
        self.gaps.record(ns as f64 / 1e9);
    }

    /// Records how long one event waited in the gate, as it is measured.
    pub(crate) fn age(&self, ns: u64) {
        self.ages.record(ns as f64 / 1e9);
    }

    pub(crate) fn first_event(&self, after: Duration) {
        self.first_event.record(after.as_secs_f64());
    }

    pub(crate) fn ended(&self, reason: EndReason, stalled: bool) {
        self.ended[reason.index()][usize::from(stalled)].increment(1);
    }
}

fn ended(hop: String, reason: EndReason, stalled: &'static str) -> Counter {
    counter!("streamgate_streams_ended_total", "hop" => hop, "reason" => reason.as_str(), "stalled" => stalled)
}

/// Exports hop-record counts, from the record writer's thread.
pub(crate) fn records(outcome: &'static str, count: u64) {
    if count > 0 {
        counter!("streamgate_hop_records_total", "outcome" => outcome).increment(count);
    }
}
