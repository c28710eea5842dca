//! One stream's recorder at one hop.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::counters::{GapCounters, Touched};
use super::hop::HopProbe;
use super::observe::Observation;
use super::record::{Pending, monotonic_ns};
use crate::chunk::Kind;

/// Events between two additions of a stream's counts to its hop's aggregate.
const FLUSH_EVERY: usize = 64;

/// Records one stream's events at one hop: gaps, stalls, positions, waits, and (for sampled
/// requests) hop records.
///
/// Owned by whoever sees the events (the [`Probed`](super::Probed) combinator, a generator's
/// decode loop); `observe` takes `&mut self`, one clock read, and touches only this recorder's
/// own counters: no lock, no atomic, no allocation. Every 64 events, at each stall and at the
/// end, the counts are added to the hop's aggregate. Dropping a recorder without
/// [`end`](Recorder::end) counts the stream as ended `dropped`.
pub struct Recorder {
    hop: HopProbe,
    request: Arc<str>,
    // Times are nanoseconds on the process's monotonic clock (`monotonic_ns`): converted once
    // per event, then plain integer arithmetic.
    started: u64,
    last_visible: Option<u64>,
    last_alive: Option<u64>,
    /// Visible events so far: the output position of the next one.
    position: u64,
    next_seq: u64,
    counters: GapCounters,
    /// What the hop's aggregate already has of `counters`.
    flushed: GapCounters,
    /// Events since the last flush, and the histogram buckets they touched.
    unflushed: usize,
    touched: [Touched; 2 * FLUSH_EVERY],
    touched_len: usize,
    sampled: bool,
    first_event: Option<Duration>,
    ended: bool,
    #[cfg(feature = "tracing")]
    span: tracing::Span,
}

impl Recorder {
    pub(crate) fn new(hop: HopProbe, request: Arc<str>) -> Self {
        let now = monotonic_ns(Instant::now());
        Recorder {
            sampled: hop.samples(&request),
            #[cfg(feature = "tracing")]
            span: tracing::info_span!("streamgate.stream", request = %request, hop = %hop.name()),
            hop,
            request,
            started: now,
            last_visible: None,
            last_alive: None,
            position: 0,
            next_seq: 0,
            counters: GapCounters::default(),
            flushed: GapCounters::default(),
            unflushed: 0,
            touched: [Touched::Gap(0); 2 * FLUSH_EVERY],
            touched_len: 0,
            first_event: None,
            ended: false,
        }
    }

    /// Records one event, now.
    pub fn observe(&mut self, event: Observation) {
        self.observe_at(event, Instant::now());
    }

    /// Records one event seen at `now` (for events whose time was taken elsewhere).
    pub fn observe_at(&mut self, event: Observation, at: Instant) {
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
        self.counters.count_event(event.kind, event.bytes);
        let mut stall = false;
        if event.kind == Kind::Visible {
            match self.last_visible {
                Some(last) => {
                    let gap = now.saturating_sub(last);
                    stall = gap >= self.hop.inner.stall_ns;
                    let touched = self.counters.record_gap(gap, self.position, stall);
                    self.touch(touched);
                    #[cfg(feature = "tracing")]
                    if stall {
                        tracing::warn!(parent: &self.span, seq, position = self.position,
                            gap_ms = gap / 1_000_000, "stall");
                    }
                }
                None => {
                    let first = Duration::from_nanos(now.saturating_sub(self.started));
                    self.first_event = Some(first);
                    self.hop.inner.first_event.record(nanos(first));
                    #[cfg(feature = "metrics")]
                    self.hop.inner.metrics.first_event(first);
                }
            }
            self.last_visible = Some(now);
            self.position += 1;
        }
        if event.kind != Kind::Control {
            if let Some(last) = self.last_alive.replace(now) {
                self.counters.record_quiet(now.saturating_sub(last));
            }
        }
        if let Some(enqueued) = event.enqueued_at {
            let waited = nanos(at.saturating_duration_since(enqueued));
            let touched = self.counters.record_wait(waited, event.waiting);
            self.touch(touched);
        }
        if let (true, Some(seq)) = (self.sampled, seq) {
            if let Some((sink, _)) = &self.hop.inner.records {
                sink.send(Pending {
                    request: self.request.clone(),
                    hop: self.hop.inner.name.clone(),
                    seq,
                    t_ns: now,
                    bytes: event.bytes,
                    kind: event.kind,
                });
            }
        }
        self.unflushed += 1;
        if stall || self.unflushed >= FLUSH_EVERY {
            self.flush();
        }
    }

    /// Records the stream's end (`completed`, or why it ended early) and adds its last counts
    /// to the hop. Later calls do nothing.
    pub fn end(&mut self, reason: &'static str) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        self.flush();
        self.hop.count_end(reason);
        #[cfg(feature = "metrics")]
        self.hop.inner.metrics.ended(reason);
        #[cfg(feature = "tracing")]
        tracing::info!(parent: &self.span, reason,
            visible_events = self.counters.visible_events(),
            hidden_events = self.counters.hidden_events(),
            max_gap_ms = self.counters.max_gap().as_millis() as u64,
            stalls = self.counters.stalls(),
            "stream ended");
    }

    /// This stream's counters at this hop.
    pub fn counters(&self) -> &GapCounters {
        &self.counters
    }

    /// Time from the recorder's creation to the first visible event, once there was one.
    pub fn time_to_first_event(&self) -> Option<Duration> {
        self.first_event
    }

    /// The request id.
    pub fn request(&self) -> &str {
        &self.request
    }

    /// Whether this stream writes hop records.
    pub fn is_sampled(&self) -> bool {
        self.sampled
    }

    fn touch(&mut self, bucket: Touched) {
        self.touched[self.touched_len] = bucket;
        self.touched_len += 1;
    }

    fn flush(&mut self) {
        if self.unflushed == 0 {
            return;
        }
        let touched = &self.touched[..self.touched_len];
        #[cfg(feature = "metrics")]
        let metrics = &self.hop.inner.metrics;
        #[cfg(feature = "metrics")]
        metrics.add_scalars(&self.counters, &self.flushed);
        self.counters.flush(
            &mut self.flushed,
            &self.hop.inner.counters,
            touched,
            |_bucket, _delta| {
                #[cfg(feature = "metrics")]
                metrics.bucket(_bucket, _delta);
            },
        );
        self.unflushed = 0;
        self.touched_len = 0;
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.end("dropped");
    }
}

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder")
            .field("hop", &self.hop.name())
            .field("request", &self.request)
            .field("counters", &self.counters)
            .field("sampled", &self.sampled)
            .finish_non_exhaustive()
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
