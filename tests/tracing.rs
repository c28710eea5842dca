//! The `tracing` export: a span per probed stream with its request id, an event per stall and
//! one at the end with its reason.
#![cfg(feature = "tracing")]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use streamgate::probe::{HopProbe, Observation};
use streamgate::{EndReason, Kind};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Collects each span's and event's fields as `name=value` text.
#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<String>>>);

struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", field.name(), value));
    }
}

impl Subscriber for Collect {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut fields = Fields(format!("span {} ", span.metadata().name()));
        span.record(&mut fields);
        self.0.lock().unwrap().push(fields.0);
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(format!("event {} ", event.metadata().level()));
        event.record(&mut fields);
        self.0.lock().unwrap().push(fields.0);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

#[test]
fn a_span_per_stream_and_events_for_stalls_and_the_end() {
    let collect = Collect::default();
    tracing::subscriber::with_default(collect.clone(), || {
        let hop = HopProbe::new("gateway.write").stall_threshold(Duration::from_millis(500));
        let mut recorder = hop.recorder("req-9");
        let start = Instant::now();
        for (seq, ms) in [(0, 0), (1, 5), (2, 905), (3, 910)] {
            let at = start + Duration::from_millis(ms);
            recorder.observe_at(Observation::new(Some(seq), 3, Kind::Visible), at);
        }
        // Then 600 ms of nothing, and the policy ends the stream: a stall it ended in.
        recorder.end_at(EndReason::SlowConsumer, start + Duration::from_millis(1510));
    });
    let lines = collect.0.lock().unwrap().clone();
    assert_eq!(lines.len(), 4, "{lines:#?}");
    assert!(lines[0].starts_with("span streamgate.stream request=req-9 hop=gateway.write"));
    assert!(lines[1].starts_with("event WARN"));
    assert!(lines[1].contains("message=stall") && lines[1].contains("seq=2"));
    assert!(lines[1].contains("quiet_ms=900"));
    assert!(lines[2].starts_with("event WARN"));
    assert!(lines[2].contains("message=stream ended in a stall"));
    assert!(lines[2].contains("reason=\"slow_consumer\"") && lines[2].contains("idle_ms=600"));
    assert!(lines[3].starts_with("event INFO"));
    assert!(lines[3].contains("reason=\"slow_consumer\""));
    assert!(lines[3].contains("stalls=2"));
}
