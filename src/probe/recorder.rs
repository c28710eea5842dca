//! One stream's recorder at one hop.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::counters::Batch;
use super::hop::HopProbe;
use super::observe::Observation;
use super::record::{MAX_RECORD_REQUEST, RecordKind, monotonic_ns};
use super::sink::Pending;
use crate::chunk::Kind;
use crate::end::EndReason;

impl HopProbe {
    /// A recorder for one stream of request `request` through this hop. An id longer than
    /// [`MAX_RECORD_REQUEST`] bytes is cut (at a character boundary) before it is kept.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::probe::{HopProbe, MAX_RECORD_REQUEST};
    ///
    /// let hop = HopProbe::new("worker.decode");
    /// let recorder = hop.recorder("req-1");
    /// assert_eq!(recorder.request(), "req-1");
    /// assert_eq!(hop.snapshot().streams_started, 1);
    ///
    /// let hostile = "x".repeat(10_000);
    /// assert_eq!(hop.recorder(hostile).request().len(), MAX_RECORD_REQUEST);
    /// ```
    pub fn recorder(&self, request: impl Into<Arc<str>>) -> Recorder {
        self.inner.started.fetch_add(1, Ordering::Relaxed);
        let recorder = Recorder::new(self.clone(), bounded(request.into()));
        #[cfg(feature = "otel")]
        let recorder = if self.inner.otel.is_some() {
            recorder.traced(&opentelemetry::Context::current())
        } else {
            recorder
        };
        recorder
    }

    /// A recorder for one stream of request `request` through this hop, whose span (with
    /// [`otel`](HopProbe::otel)) continues the trace of `parent`: the context extracted from
    /// the incoming request ([`otel::extract`](crate::otel::extract)). At a hop without
    /// `otel`, the recorder only keeps `parent`, for
    /// [`otel_context`](Recorder::otel_context) to carry on upstream.
    ///
    /// # Examples
    ///
    /// ```
    /// use http::HeaderMap;
    /// use streamgate::probe::HopProbe;
    ///
    /// # let incoming = HeaderMap::new();
    /// let hop = HopProbe::new("gateway.recv");
    /// let parent = streamgate::otel::extract(&incoming);
    /// let recorder = hop.recorder_in("req-1", &parent);
    /// // The upstream request carries this stream's span (or the caller's trace).
    /// let mut upstream = HeaderMap::new();
    /// streamgate::otel::inject(&recorder.otel_context(), &mut upstream);
    /// // ... send it, then probe the upstream's events with this recorder:
    /// let events = futures_util::stream::empty::<streamgate::sse::SseFrame>();
    /// let probed = recorder.probe(events);
    /// # drop(probed);
    /// ```
    #[cfg(feature = "otel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
    pub fn recorder_in(
        &self,
        request: impl Into<Arc<str>>,
        parent: &opentelemetry::Context,
    ) -> Recorder {
        self.inner.started.fetch_add(1, Ordering::Relaxed);
        Recorder::new(self.clone(), bounded(request.into())).traced(parent)
    }
}

/// `request`, cut to at most [`MAX_RECORD_REQUEST`] bytes.
fn bounded(request: Arc<str>) -> Arc<str> {
    if request.len() <= MAX_RECORD_REQUEST {
        return request;
    }
    Arc::from(super::record::cut(&request, MAX_RECORD_REQUEST))
}

/// Records one stream's events at one hop: gaps, quiet spells and stalls, positions, waits,
/// its end, and (for sampled requests) hop records.
///
/// Owned by whoever sees the events (the [`Probed`](super::Probed) combinator, a generator's
/// decode loop); `observe` takes `&mut self`, one clock read, and touches only this recorder's
/// own batch: no lock, no atomic, no allocation (a sampled stream also queues its hop record:
/// a channel send, which never blocks). Every 64 events, at each stall and at the end, the
/// batch is added to the hop's aggregate. With `metrics`, each gap and wait is also recorded
/// into the exporter's histogram as it is measured (Prometheus: a clock read and a push into a
/// lock-free bucket, which allocates a block every 64 values), so a stream's end leaves only
/// counters to export. A recorder is under 1 KiB; with `otel`, a stream's span adds its own
/// (about 600 bytes with the SDK).
///
/// Its [`end`](Recorder::end) records why the stream ended and how long it had been quiet:
/// a stream frozen for 40 s and then abandoned is a stall of this hop, in its counters, its
/// metrics, its tracing events and its hop records. Dropping a recorder without `end` records
/// the end as `consumer_gone` (a response body dropped because its client left).
///
/// # Examples
///
/// A decode loop that records its own output, hidden reasoning first:
///
/// ```
/// use std::time::Duration;
/// use streamgate::probe::{HopProbe, Observation};
/// use streamgate::{EndReason, Kind};
///
/// let hop = HopProbe::new("worker.decode");
/// let mut recorder = hop.recorder("req-1");
/// for (text, kind) in [("hmm", Kind::Hidden), ("Hel", Kind::Visible), ("lo", Kind::Visible)] {
///     // No seq: the recorder numbers the events 0, 1, 2 itself.
///     recorder.observe(Observation::new(None, text.len() as u64, kind));
/// }
/// recorder.end(EndReason::Completed);
///
/// let summary = recorder.summary();
/// assert_eq!((summary.hidden_events, summary.visible_events), (1, 2));
/// assert!(summary.time_to_first_event.is_some());
/// assert_eq!(summary.stalls, 0);
/// let end = summary.end.expect("it ended");
/// assert_eq!((end.reason, end.stalled), (EndReason::Completed, false));
/// assert!(end.idle < Duration::from_secs(1));
///
/// // A recorder dropped before its end: the consumer went away.
/// drop(hop.recorder("req-2"));
/// assert_eq!(hop.snapshot().streams_ended[EndReason::ConsumerGone], 1);
/// ```
pub struct Recorder {
    hop: HopProbe,
    request: Arc<str>,
    // Times are nanoseconds on the process's monotonic clock (`monotonic_ns`): converted once
    // per event, then plain integer arithmetic.
    started: u64,
    last_visible: Option<u64>,
    /// The last visible or hidden event.
    last_progress: Option<u64>,
    /// Visible events so far: the output position of the next one.
    position: u64,
    next_seq: u64,
    summary: StreamSummary,
    /// Counts not yet added to the hop.
    batch: Batch,
    sampled: bool,
    ended: bool,
    /// Attributes set since the last record (its `attrs` text), for the next one.
    attrs: Option<Arc<str>>,
    #[cfg(feature = "metrics")]
    metrics: Arc<super::export::Handles>,
    #[cfg(feature = "tracing")]
    span: tracing::Span,
    /// The stream's OpenTelemetry span (or only its parent's context, at a hop without
    /// `otel`); `None` for a plain recorder at a hop without `otel`.
    #[cfg(feature = "otel")]
    otel: Option<crate::otel::StreamSpan>,
}

/// One stream at one hop, so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct StreamSummary {
    /// Visible events.
    pub visible_events: u64,
    /// Hidden events.
    pub hidden_events: u64,
    /// Control events.
    pub control_events: u64,
    /// The longest gap between visible events (or from the last one to the end).
    pub max_gap: Duration,
    /// The longest quiet spell (no visible or hidden event), the one at the end included.
    pub max_quiet: Duration,
    /// Quiet spells at or above the hop's stall threshold, the one at the end included.
    pub stalls: u64,
    /// Time from the recorder's creation to the first visible event, once there was one.
    pub time_to_first_event: Option<Duration>,
    /// How the stream ended, once it did.
    pub end: Option<StreamEnd>,
}

/// How a stream ended at a hop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamEnd {
    /// Why.
    pub reason: EndReason,
    /// How long the stream had been without a visible or hidden event (since it began at this
    /// hop, when it saw none).
    pub idle: Duration,
    /// Whether `idle` reached the stall threshold: the stream ended in a stall.
    pub stalled: bool,
}

impl Recorder {
    fn new(hop: HopProbe, request: Arc<str>) -> Self {
        let now = monotonic_ns(Instant::now());
        Recorder {
            sampled: hop.samples(&request),
            #[cfg(feature = "metrics")]
            metrics: hop.inner.metrics.handles(),
            #[cfg(feature = "tracing")]
            span: tracing::info_span!("streamgate.stream", request = %request, hop = %hop.name()),
            hop,
            request,
            started: now,
            last_visible: None,
            last_progress: None,
            position: 0,
            next_seq: 0,
            summary: StreamSummary::default(),
            batch: Batch::new(),
            ended: false,
            attrs: None,
            #[cfg(feature = "otel")]
            otel: None,
        }
    }

    /// Starts the stream's span (at a hop with `otel`) as a child of `parent`.
    #[cfg(feature = "otel")]
    fn traced(mut self, parent: &opentelemetry::Context) -> Self {
        use crate::otel::StreamSpan;
        self.otel = Some(match &self.hop.inner.otel {
            Some(otel) => StreamSpan::start(otel, &self.request, parent),
            None => StreamSpan::pass_through(parent),
        });
        self
    }

    /// Records one event, now.
    ///
    /// See [`Recorder`] for an example.
    pub fn observe(&mut self, event: Observation) {
        self.observe_at(event, Instant::now());
    }

    /// Records one event seen at `at` (for events whose time was taken elsewhere).
    ///
    /// # Examples
    ///
    /// Events timed where they were read (or in a test, on a made-up clock):
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use streamgate::probe::{HopProbe, Observation};
    /// use streamgate::{EndReason, Kind};
    ///
    /// let hop = HopProbe::new("client.recv");
    /// let mut recorder = hop.recorder("req-1");
    /// let start = Instant::now();
    /// let token = |seq| Observation::new(Some(seq), 3, Kind::Visible);
    /// recorder.observe_at(token(0), start + Duration::from_millis(300));
    /// recorder.observe_at(token(1), start + Duration::from_millis(350));
    /// let summary = recorder.summary();
    /// // From the recorder's creation (just before `start`) to the first token.
    /// assert!(summary.time_to_first_event.unwrap() >= Duration::from_millis(300));
    /// assert_eq!(summary.max_gap, Duration::from_millis(50));
    /// ```
    pub fn observe_at(&mut self, event: Observation, at: Instant) {
        if self.ended {
            return; // after its end, a stream has nothing more to record
        }
        let now = monotonic_ns(at);
        // A control event without a number of its own (a heartbeat between numbered events) is
        // counted but neither numbered nor written as a hop record: it must not take the seq
        // of the event after it.
        let seq = match (event.seq, event.kind) {
            (None, Kind::Control) => None,
            (seq, _) => {
                let seq = seq.unwrap_or(self.next_seq);
                self.next_seq = seq.saturating_add(1);
                Some(seq)
            }
        };
        let full = self.batch.count_event(event.kind, event.bytes);
        let summary = &mut self.summary;
        let count = match event.kind {
            Kind::Visible => &mut summary.visible_events,
            Kind::Hidden => &mut summary.hidden_events,
            Kind::Control => &mut summary.control_events,
        };
        *count = count.saturating_add(1);
        let mut stall = false;
        if event.kind != Kind::Control {
            if let Some(last) = self.last_progress.replace(now) {
                let quiet = now.saturating_sub(last);
                stall = quiet >= self.hop.inner.stall_ns;
                self.quiet(quiet, stall, false);
                #[cfg(feature = "tracing")]
                if stall {
                    tracing::warn!(parent: &self.span, seq, position = self.position,
                        quiet_ms = quiet / 1_000_000, "stall");
                }
                #[cfg(feature = "otel")]
                if let (true, Some(otel)) = (stall, &mut self.otel) {
                    otel.stall(Duration::from_nanos(quiet), self.position);
                }
            }
        }
        if event.kind == Kind::Visible {
            match self.last_visible {
                Some(last) => {
                    let gap = now.saturating_sub(last);
                    self.gap(gap);
                    #[cfg(feature = "otel")]
                    if let Some(otel) = &mut self.otel {
                        otel.gap(Duration::from_nanos(gap));
                    }
                }
                None => {
                    let first = Duration::from_nanos(now.saturating_sub(self.started));
                    self.summary.time_to_first_event = Some(first);
                    self.hop.inner.first_event.record(nanos(first));
                    #[cfg(feature = "metrics")]
                    self.metrics.first_event(first);
                    #[cfg(feature = "otel")]
                    if let Some(otel) = &mut self.otel {
                        otel.first_event(first);
                    }
                }
            }
            self.last_visible = Some(now);
            self.position = self.position.saturating_add(1);
        }
        if let Some(enqueued) = event.enqueued_at {
            let waited = nanos(at.saturating_duration_since(enqueued));
            self.batch.record_wait(waited, event.waiting);
            #[cfg(feature = "metrics")]
            self.metrics.age(waited);
        }
        if let Some(seq) = seq {
            self.record(seq, now, event.bytes, event.kind.into());
        }
        if stall || full {
            self.flush();
        }
    }

    /// Records the stream's end ([`EndReason::Completed`], or why it ended early), with how
    /// long it had been quiet, and adds its last counts to the hop. Later calls, and events
    /// after it, record nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::probe::{HopProbe, Observation};
    /// use streamgate::{EndReason, Kind};
    ///
    /// let hop = HopProbe::new("gateway.write");
    /// let mut recorder = hop.recorder("req-1");
    /// recorder.observe(Observation::new(Some(0), 4, Kind::Visible));
    /// recorder.end(EndReason::SlowConsumer);
    /// // The first end stands; nothing after it counts.
    /// recorder.end(EndReason::Completed);
    /// recorder.observe(Observation::new(Some(1), 4, Kind::Visible));
    /// drop(recorder);
    ///
    /// let snapshot = hop.snapshot();
    /// assert_eq!(snapshot.streams_ended.occurred(), [(EndReason::SlowConsumer, 1)]);
    /// assert_eq!(snapshot.counters.visible_events(), 1);
    /// ```
    pub fn end(&mut self, reason: EndReason) {
        self.end_at(reason, Instant::now());
    }

    /// Records the stream's end as seen at `at` (for ends whose time was taken elsewhere).
    ///
    /// # Examples
    ///
    /// A stream frozen for 40 s, then abandoned: it ended in a stall of this hop.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use streamgate::probe::{HopProbe, Observation};
    /// use streamgate::{EndReason, Kind};
    ///
    /// let hop = HopProbe::new("client.recv");
    /// let mut recorder = hop.recorder("req-1");
    /// let start = Instant::now();
    /// recorder.observe_at(Observation::new(Some(0), 3, Kind::Visible), start);
    /// recorder.end_at(EndReason::ConsumerGone, start + Duration::from_secs(40));
    ///
    /// let end = recorder.summary().end.unwrap();
    /// assert_eq!((end.idle, end.stalled), (Duration::from_secs(40), true));
    /// let counters = hop.snapshot().counters;
    /// assert_eq!((counters.stalls(), counters.stalls_at_end()), (1, 1));
    /// assert_eq!(counters.max_gap(), Duration::from_secs(40)); // the last gap, to the end
    /// ```
    pub fn end_at(&mut self, reason: EndReason, at: Instant) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let now = monotonic_ns(at);
        let idle = now.saturating_sub(self.last_progress.unwrap_or(self.started));
        let stalled = idle >= self.hop.inner.stall_ns;
        self.quiet(idle, stalled, true);
        // The last gap runs to the end when the last progress was visible (as the timeline
        // counts it): after a hidden phase, the time to the end is that phase's.
        if let (Some(last), true) = (self.last_visible, self.last_visible == self.last_progress) {
            self.gap(now.saturating_sub(last));
        }
        self.summary.end = Some(StreamEnd {
            reason,
            idle: Duration::from_nanos(idle),
            stalled,
        });
        self.record(
            self.next_seq,
            now,
            0,
            RecordKind::End {
                reason,
                idle_ns: idle,
            },
        );
        self.flush();
        self.hop.inner.ended.add(reason);
        #[cfg(feature = "metrics")]
        self.metrics.ended(reason, stalled);
        #[cfg(feature = "tracing")]
        {
            if stalled {
                tracing::warn!(parent: &self.span, reason = reason.as_str(), position = self.position,
                    idle_ms = idle / 1_000_000, "stream ended in a stall");
            }
            let summary = &self.summary;
            tracing::info!(parent: &self.span, reason = reason.as_str(),
                visible_events = summary.visible_events,
                hidden_events = summary.hidden_events,
                max_gap_ms = summary.max_gap.as_millis() as u64,
                stalls = summary.stalls,
                idle_ms = idle / 1_000_000,
                "stream ended");
        }
        #[cfg(feature = "otel")]
        if let Some(otel) = &mut self.otel {
            otel.end(&self.summary, self.position);
        }
    }

    /// Sets the stream's attributes at this hop (what serves it, where it runs: a proxy's
    /// `upstream`, `pool` and `model`), from the next record on: the next hop record carries
    /// them as its `attrs` (within [`MAX_RECORD_ATTRS`](super::MAX_RECORD_ATTRS) pairs and the
    /// key and value limits), and the diagnosis names them with a stall that began here.
    /// Set them again when they change (a failover to another upstream): each record stands
    /// for the attributes last set before it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::io::{self, Write};
    /// use std::sync::{Arc, Mutex};
    /// use streamgate::Kind;
    /// use streamgate::probe::{HopProbe, Observation, RecordSink};
    ///
    /// #[derive(Clone, Default)]
    /// struct Lines(Arc<Mutex<Vec<u8>>>);
    ///
    /// impl Write for Lines {
    ///     fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
    ///         self.0.lock().unwrap().write(bytes)
    ///     }
    ///     fn flush(&mut self) -> io::Result<()> {
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let lines = Lines::default();
    /// let sink = RecordSink::to_writer(lines.clone(), 1024)?;
    /// let hop = HopProbe::new("proxy.recv").records(sink.clone(), 1.0);
    /// let mut recorder = hop.recorder("req-1");
    /// recorder.attrs(&[("upstream", "http://10.0.0.1:8000")]);
    /// recorder.observe(Observation::new(Some(0), 5, Kind::Visible));
    /// recorder.observe(Observation::new(Some(1), 5, Kind::Visible));
    /// sink.sync();
    /// let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    /// let records: Vec<&str> = text.lines().collect();
    /// assert!(records[0].ends_with(r#""attrs":{"upstream":"http://10.0.0.1:8000"}}"#));
    /// assert!(!records[1].contains("attrs"), "once per change");
    /// # Ok::<(), io::Error>(())
    /// ```
    pub fn attrs(&mut self, attrs: &[(&str, &str)]) {
        self.attrs = Some(super::record::encode_attrs(attrs.iter().copied()).into());
    }

    /// This stream at this hop, so far.
    ///
    /// See [`Recorder`] for an example.
    pub fn summary(&self) -> &StreamSummary {
        &self.summary
    }

    /// The request id (cut to [`MAX_RECORD_REQUEST`] bytes).
    pub fn request(&self) -> &str {
        &self.request
    }

    /// The context to carry upstream ([`otel::inject`](crate::otel::inject)): this stream's
    /// span in its parent's context, at a hop with [`otel`](HopProbe::otel), so the
    /// upstream's spans are its children; at a hop without, the parent given to
    /// [`recorder_in`](HopProbe::recorder_in), so the caller's trace goes on; otherwise empty.
    ///
    /// # Examples
    ///
    /// ```
    /// use http::HeaderMap;
    /// use opentelemetry::metrics::MeterProvider as _;
    /// use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
    /// use opentelemetry_sdk::metrics::SdkMeterProvider;
    /// use opentelemetry_sdk::propagation::TraceContextPropagator;
    /// use opentelemetry_sdk::trace::SdkTracerProvider;
    /// use streamgate::otel::OtelHop;
    /// use streamgate::probe::HopProbe;
    ///
    /// opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    /// let mut incoming = HeaderMap::new();
    /// incoming.insert(
    ///     "traceparent",
    ///     "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".parse().unwrap(),
    /// );
    /// let parent = streamgate::otel::extract(&incoming);
    ///
    /// // At a hop that exports, the stream's own span, in the caller's trace.
    /// let tracers = SdkTracerProvider::builder().build();
    /// let meters = SdkMeterProvider::builder().build();
    /// let otel = OtelHop::new(tracers.tracer("streamgate"), &meters.meter("streamgate"));
    /// let hop = HopProbe::new("gateway.recv").otel(otel);
    /// let recorder = hop.recorder_in("req-1", &parent);
    /// let span = recorder.otel_context().span().span_context().clone();
    /// assert_eq!(span.trace_id(), parent.span().span_context().trace_id());
    /// assert_ne!(span.span_id(), parent.span().span_context().span_id());
    ///
    /// // At a hop that does not, the caller's context as it came.
    /// let plain = HopProbe::new("gateway.write").recorder_in("req-1", &parent);
    /// let mut upstream = HeaderMap::new();
    /// streamgate::otel::inject(&plain.otel_context(), &mut upstream);
    /// assert_eq!(upstream["traceparent"], incoming["traceparent"]);
    /// ```
    #[cfg(feature = "otel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
    pub fn otel_context(&self) -> opentelemetry::Context {
        self.otel
            .as_ref()
            .map_or_else(opentelemetry::Context::new, |otel| otel.context().clone())
    }

    /// Whether this stream writes hop records.
    pub fn is_sampled(&self) -> bool {
        self.sampled
    }

    fn quiet(&mut self, ns: u64, stall: bool, at_end: bool) {
        self.batch.record_quiet(ns, self.position, stall, at_end);
        let summary = &mut self.summary;
        summary.max_quiet = summary.max_quiet.max(Duration::from_nanos(ns));
        if stall {
            summary.stalls = summary.stalls.saturating_add(1);
        }
    }

    fn gap(&mut self, ns: u64) {
        self.batch.record_gap(ns, self.position);
        #[cfg(feature = "metrics")]
        self.metrics.gap(ns);
        let max = &mut self.summary.max_gap;
        *max = (*max).max(Duration::from_nanos(ns));
    }

    fn record(&mut self, seq: u64, t_ns: u64, bytes: u64, kind: RecordKind) {
        if !self.sampled {
            return;
        }
        if let Some((sink, _)) = &self.hop.inner.records {
            // Once per change: the records after it say nothing, meaning the same. A record
            // dropped on a full queue leaves them to the next one.
            let attrs = self.attrs.take();
            let queued = sink.send(Pending {
                request: self.request.clone(),
                hop: self.hop.inner.name.clone(),
                seq,
                t_ns,
                bytes,
                kind,
                busy_ns: 0,
                attrs: attrs.clone(),
            });
            if !queued {
                self.attrs = attrs;
            }
        }
    }

    fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        #[cfg(feature = "metrics")]
        self.metrics.export(&self.batch);
        self.hop.inner.counters.add(&mut self.batch);
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.end(EndReason::ConsumerGone);
    }
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder")
            .field("hop", &self.hop.name())
            .field("request", &self.request)
            .field("summary", &self.summary)
            .field("sampled", &self.sampled)
            .finish_non_exhaustive()
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
