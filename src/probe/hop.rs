//! A named hop: the aggregate counters of every stream observed there.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::counters::{GapCounters, SharedCounters};
use super::histogram::{AtomicHistogram, Histogram};
use super::sink::RecordSink;
use crate::end::{EndCounters, EndCounts};

/// The default stall threshold: a visible gap of one second.
pub const DEFAULT_STALL: Duration = Duration::from_secs(1);

/// A named boundary where events are observed (`worker.publish`, `gateway.recv`,
/// `gateway.write`, `client.recv`, …), with the aggregate counters of every stream seen there.
///
/// Create one per hop per process and clone it freely; each stream gets its own
/// [`Recorder`](super::Recorder) from [`recorder`](HopProbe::recorder) (or the
/// [`GateExt::probe`](crate::GateExt::probe) combinator). Recording an event takes one clock
/// read and plain arithmetic on the stream's own batch: no lock, no allocation. Streams add
/// their batches to the hop's atomics every 64 events, at each stall and at their end.
///
/// # Examples
///
/// ```
/// use streamgate::probe::HopProbe;
/// use streamgate::{EndReason, Kind, probe::Observation};
///
/// let hop = HopProbe::new("worker.publish");
/// let mut recorder = hop.recorder("req-1");
/// for seq in 0..3 {
///     recorder.observe(Observation::new(Some(seq), 4, Kind::Visible));
/// }
/// recorder.end(EndReason::Completed);
/// let snapshot = hop.snapshot();
/// assert_eq!(snapshot.counters.visible_events(), 3);
/// // Two gaps between the events, and the last one: from the third event to the end.
/// assert_eq!(snapshot.counters.gaps().count(), 3);
/// assert_eq!(snapshot.streams_ended[EndReason::Completed], 1);
/// assert_eq!(snapshot.streams_ended.total(), 1);
/// ```
#[derive(Clone)]
pub struct HopProbe {
    pub(crate) inner: Arc<Hop>,
}

pub(crate) struct Hop {
    pub(crate) name: Arc<str>,
    pub(crate) stall_ns: u64,
    pub(crate) counters: SharedCounters,
    pub(crate) first_event: AtomicHistogram,
    pub(crate) started: AtomicU64,
    pub(crate) ended: EndCounters,
    pub(crate) records: Option<(RecordSink, u64)>,
    #[cfg(feature = "metrics")]
    pub(crate) metrics: super::export::HopMetrics,
    /// The hop's OpenTelemetry tracer and instruments, with its attributes.
    #[cfg(feature = "otel")]
    pub(crate) otel: Option<crate::otel::HopOtel>,
}

impl HopProbe {
    /// A hop named `name`, with the default stall threshold ([`DEFAULT_STALL`]) and no hop
    /// records.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::probe::{DEFAULT_STALL, HopProbe};
    ///
    /// let hop = HopProbe::new("gateway.recv");
    /// assert_eq!(hop.name(), "gateway.recv");
    /// assert_eq!(hop.stall(), DEFAULT_STALL);
    /// assert_eq!(hop.snapshot().streams_started, 0);
    /// ```
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        HopProbe::build(name.into(), DEFAULT_STALL, None)
    }

    fn build(name: Arc<str>, stall: Duration, records: Option<(RecordSink, u64)>) -> Self {
        HopProbe {
            inner: Arc::new(Hop {
                #[cfg(feature = "metrics")]
                metrics: super::export::HopMetrics::new(name.clone()),
                name,
                stall_ns: u64::try_from(stall.as_nanos()).unwrap_or(u64::MAX),
                counters: SharedCounters::new(),
                first_event: AtomicHistogram::new(),
                started: AtomicU64::new(0),
                ended: EndCounters::new(),
                records,
                #[cfg(feature = "otel")]
                otel: None,
            }),
        }
    }

    /// The same hop, also exporting to OpenTelemetry through `otel`: a span per stream (its
    /// request id, gap summary and end reason), the GenAI time-to-first-token and
    /// per-chunk histograms, and a counter of ends by reason (see [`otel`](crate::otel)).
    ///
    /// A stream's span is a child of the context its recorder is made in: the one given to
    /// [`recorder_in`](HopProbe::recorder_in), or [`Context::current`] for
    /// [`recorder`](HopProbe::recorder) and [`GateExt::probe`](crate::GateExt::probe).
    ///
    /// [`Context::current`]: opentelemetry::Context::current
    ///
    /// # Examples
    ///
    /// ```
    /// use opentelemetry::metrics::MeterProvider as _;
    /// use opentelemetry::trace::TracerProvider as _;
    /// use opentelemetry_sdk::metrics::SdkMeterProvider;
    /// use opentelemetry_sdk::trace::SdkTracerProvider;
    /// use streamgate::otel::OtelHop;
    /// use streamgate::probe::HopProbe;
    ///
    /// let tracers = SdkTracerProvider::builder().build();
    /// let meters = SdkMeterProvider::builder().build();
    /// let otel = OtelHop::new(tracers.tracer("streamgate"), &meters.meter("streamgate"));
    /// let hop = HopProbe::new("worker.publish").otel(otel);
    /// let mut recorder = hop.recorder("req-1"); // its span starts here
    /// recorder.end(streamgate::EndReason::Completed); // and ends here
    /// ```
    #[cfg(feature = "otel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
    pub fn otel(self, otel: crate::otel::OtelHop) -> Self {
        let records = self.inner.records.clone();
        let mut probe = HopProbe::build(self.inner.name.clone(), self.stall(), records);
        let hop = Arc::get_mut(&mut probe.inner).expect("a hop just built");
        hop.otel = Some(otel.bind(&hop.name));
        probe
    }

    /// `self` with `from`'s OpenTelemetry export (the builders make a new hop).
    #[cfg(feature = "otel")]
    fn with_otel_of(mut self, from: &HopProbe) -> Self {
        let hop = Arc::get_mut(&mut self.inner).expect("a hop just built");
        hop.otel = from.inner.otel.clone();
        self
    }

    /// The same hop with a different stall threshold: a quiet spell (no visible or hidden
    /// event) at or above it is a stall.
    /// Call before creating recorders; existing clones keep the old settings.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use streamgate::probe::{HopProbe, Observation};
    /// use streamgate::{EndReason, Kind};
    ///
    /// let hop = HopProbe::new("client.recv").stall_threshold(Duration::from_millis(250));
    /// let mut recorder = hop.recorder("req-1");
    /// let start = Instant::now();
    /// let token = |seq| Observation::new(Some(seq), 4, Kind::Visible);
    /// recorder.observe_at(token(0), start);
    /// recorder.observe_at(token(1), start + Duration::from_millis(100)); // a gap
    /// recorder.observe_at(token(2), start + Duration::from_millis(400)); // a stall
    /// recorder.end_at(EndReason::Completed, start + Duration::from_millis(400));
    /// assert_eq!(hop.snapshot().counters.stalls(), 1);
    /// ```
    pub fn stall_threshold(self, stall: Duration) -> Self {
        let records = self.inner.records.clone();
        let probe = HopProbe::build(self.inner.name.clone(), stall, records);
        #[cfg(feature = "otel")]
        let probe = probe.with_otel_of(&self);
        probe
    }

    /// The same hop, also writing a [`HopRecord`](super::HopRecord) per event for a sampled
    /// share (`0.0` to `1.0`) of requests. The choice is a hash of the request id, so every hop
    /// in every process that uses the same rate records the same requests.
    ///
    /// # Examples
    ///
    /// Every request's records, into a file:
    ///
    /// ```
    /// use streamgate::probe::{HopProbe, Observation, RecordSink};
    /// use streamgate::{EndReason, Kind};
    ///
    /// # let dir = std::env::temp_dir().join(format!("streamgate-doc-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir)?;
    /// let path = dir.join("hops.jsonl");
    /// # let _ = std::fs::remove_file(&path);
    /// let sink = RecordSink::to_file(&path)?;
    /// let hop = HopProbe::new("worker.publish").records(sink.clone(), 1.0);
    /// let mut recorder = hop.recorder("req-1");
    /// assert!(recorder.is_sampled());
    /// recorder.observe(Observation::new(Some(0), 5, Kind::Visible));
    /// recorder.end(EndReason::Completed);
    /// sink.sync(); // wait until the writer thread wrote them
    ///
    /// let text = std::fs::read_to_string(&path)?;
    /// let lines: Vec<&str> = text.lines().collect();
    /// assert_eq!(lines.len(), 2); // the event, then the end
    /// assert!(lines[0].starts_with(r#"{"request":"req-1","hop":"worker.publish","seq":0,"#));
    /// assert!(lines[1].contains(r#""kind":"end","reason":"completed""#));
    /// assert_eq!(sink.written(), 2);
    /// # std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn records(self, sink: RecordSink, sample: f64) -> Self {
        let stall = Duration::from_nanos(self.inner.stall_ns);
        let threshold = sample_threshold(sample);
        let probe = HopProbe::build(self.inner.name.clone(), stall, Some((sink, threshold)));
        #[cfg(feature = "otel")]
        let probe = probe.with_otel_of(&self);
        probe
    }

    /// The hop's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The stall threshold.
    pub fn stall(&self) -> Duration {
        Duration::from_nanos(self.inner.stall_ns)
    }

    /// The counters of every stream through this hop so far (live streams up to their last
    /// batch of 64 events or stall).
    ///
    /// # Examples
    ///
    /// A live stream's events show once its batch is added, at the latest at its end:
    ///
    /// ```
    /// use streamgate::probe::{HopProbe, Observation};
    /// use streamgate::{EndReason, Kind};
    ///
    /// let hop = HopProbe::new("gateway.write");
    /// let mut recorder = hop.recorder("req-1");
    /// for seq in 0..3 {
    ///     recorder.observe(Observation::new(Some(seq), 4, Kind::Visible));
    /// }
    /// let live = hop.snapshot();
    /// assert_eq!((live.streams_started, live.streams_ended.total()), (1, 0));
    /// assert_eq!(live.counters.visible_events(), 0); // still in the stream's batch
    ///
    /// recorder.end(EndReason::ConsumerGone);
    /// let ended = hop.snapshot();
    /// assert_eq!(ended.counters.visible_events(), 3);
    /// assert_eq!(ended.counters.visible_bytes(), 12);
    /// assert_eq!(ended.streams_ended[EndReason::ConsumerGone], 1);
    /// assert_eq!(ended.time_to_first_event.count(), 1);
    /// ```
    pub fn snapshot(&self) -> HopSnapshot {
        let hop = &self.inner;
        HopSnapshot {
            hop: hop.name.to_string(),
            streams_started: hop.started.load(Ordering::Relaxed),
            streams_ended: hop.ended.snapshot(),
            counters: hop.counters.snapshot(),
            time_to_first_event: hop.first_event.snapshot(),
        }
    }

    /// Whether `request` is in the sample that writes hop records.
    pub(crate) fn samples(&self, request: &str) -> bool {
        self.inner
            .records
            .as_ref()
            .is_some_and(|(_, threshold)| in_sample(request, *threshold))
    }
}

/// The hash threshold of a sampled share (`0.0` to `1.0`) of requests.
pub(crate) fn sample_threshold(share: f64) -> u64 {
    (share.clamp(0.0, 1.0) * u64::MAX as f64) as u64
}

/// Whether `request` is in the sample of `threshold` ([`sample_threshold`]): the same choice in
/// every hop and process.
pub(crate) fn in_sample(request: &str, threshold: u64) -> bool {
    threshold > 0 && stable_hash(request) <= threshold
}

/// A stable hash, the same in every process and version: FNV-1a, then a 64-bit finalizer
/// (murmur3's `fmix64`) so that similar ids (`req-1`, `req-2`) spread over the whole range.
fn stable_hash(text: &str) -> u64 {
    let mut hash = text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

impl fmt::Debug for HopProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HopProbe")
            .field("name", &self.inner.name)
            .field("stall", &self.stall())
            .field("records", &self.inner.records.is_some())
            .finish()
    }
}

/// What a hop saw of every stream through it: a plain struct.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HopSnapshot {
    /// The hop's name.
    pub hop: String,
    /// Streams that got a recorder here.
    pub streams_started: u64,
    /// Streams that ended, by end reason.
    pub streams_ended: EndCounts,
    /// Events, gaps, stalls (and streams that ended in one), positions, buffer ages.
    pub counters: GapCounters,
    /// Time from a stream's start at this hop to its first visible event.
    pub time_to_first_event: Histogram,
}
