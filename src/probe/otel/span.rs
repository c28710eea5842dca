//! `StreamSpan`: one stream's span at one hop, and its share of the hop's measurements.

use std::fmt;
use std::time::Duration;

use opentelemetry::trace::{Status, TraceContextExt};
use opentelemetry::{Context, KeyValue};

use super::hop::HopOtel;
use crate::end::EndReason;
use crate::probe::StreamSummary;

/// One stream's span at one hop: opened by [`start`](StreamSpan::start), ended by
/// [`end`](StreamSpan::end) (or when dropped). Between the two, the per-event calls record
/// into the hop's histograms with its prebuilt attribute set and touch the span only on a
/// stall.
///
/// At a hop that does not export ([`pass_through`](StreamSpan::pass_through)) it only keeps
/// the parent's context, so a gateway still carries its caller's trace upstream.
pub(crate) struct StreamSpan {
    /// `None` at a hop that does not export: no span, no measurements.
    hop: Option<HopOtel>,
    /// The parent's context with this stream's span: what a child (an upstream request) is
    /// started in, and where the span is reached for its attributes and end.
    cx: Context,
    ended: bool,
}

impl StreamSpan {
    /// Opens the span of request `request` (already cut to the probe's bound) at hop `hop`, a
    /// child of `parent`'s span (a new trace if `parent` has none).
    pub(crate) fn start(hop: &HopOtel, request: &str, parent: &Context) -> Self {
        let request = KeyValue::new("streamgate.request_id", request.to_owned());
        let span = hop.start_span(request, parent);
        StreamSpan {
            hop: Some(hop.clone()),
            cx: parent.with_span(span),
            ended: false,
        }
    }

    /// No span: only `parent`'s context, for [`context`](StreamSpan::context).
    pub(crate) fn pass_through(parent: &Context) -> Self {
        StreamSpan {
            hop: None,
            cx: parent.clone(),
            ended: false,
        }
    }

    /// The first visible event came `after` the span's start.
    pub(crate) fn first_event(&mut self, after: Duration) {
        if let Some(hop) = &self.hop {
            hop.first_event(after.as_secs_f64());
        }
    }

    /// A gap between two visible events.
    pub(crate) fn gap(&mut self, gap: Duration) {
        if let Some(hop) = &self.hop {
            hop.gap(gap.as_secs_f64());
        }
    }

    /// A quiet spell (no visible or hidden event) at or above the hop's stall threshold,
    /// ended by the event at output `position`.
    pub(crate) fn stall(&mut self, quiet: Duration, position: u64) {
        if self.hop.is_some() {
            self.stall_event(quiet, position, false);
        }
    }

    fn stall_event(&self, quiet: Duration, position: u64, at_end: bool) {
        self.cx.span().add_event(
            "stall",
            vec![
                KeyValue::new("streamgate.quiet", quiet.as_secs_f64()),
                KeyValue::new("streamgate.position", saturating_i64(position)),
                KeyValue::new("streamgate.at_end", at_end),
            ],
        );
    }

    /// Ends the span with the stream's summary and end reason (`completed`, or why it ended
    /// early, which sets the span's status to error). Later calls do nothing.
    pub(crate) fn end(&mut self, summary: &StreamSummary, position: u64) {
        let (Some(hop), Some(end)) = (&self.hop, summary.end) else {
            return;
        };
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let reason = end.reason;
        if end.stalled {
            self.stall_event(end.idle, position, true);
        }
        let span = self.cx.span();
        let mut attributes = vec![
            KeyValue::new("streamgate.end_reason", reason.as_str()),
            KeyValue::new(
                "streamgate.events.visible",
                saturating_i64(summary.visible_events),
            ),
            KeyValue::new(
                "streamgate.events.hidden",
                saturating_i64(summary.hidden_events),
            ),
            KeyValue::new("streamgate.gap.max", summary.max_gap.as_secs_f64()),
            KeyValue::new("streamgate.stalls", saturating_i64(summary.stalls)),
            KeyValue::new("streamgate.idle.trailing", end.idle.as_secs_f64()),
        ];
        if let Some(first) = summary.time_to_first_event {
            attributes.push(KeyValue::new(
                "streamgate.time_to_first_event",
                first.as_secs_f64(),
            ));
        }
        if reason != EndReason::Completed {
            attributes.push(KeyValue::new("error.type", reason.as_str()));
            span.set_status(Status::error(reason.as_str()));
        }
        span.set_attributes(attributes);
        span.end();
        hop.ended(reason);
    }

    /// The parent's context with this stream's span in it (or, passing through, the parent's
    /// alone): inject it into an upstream request so the upstream's spans are this span's
    /// children.
    pub(crate) fn context(&self) -> &Context {
        &self.cx
    }
}

impl fmt::Debug for StreamSpan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamSpan")
            .field("span", self.cx.span().span_context())
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
