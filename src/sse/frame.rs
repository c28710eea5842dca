//! An encoded frame on its way to the transport.

use bytes::Bytes;

use crate::chunk::{Chunk, Kind};
use crate::end::EndReason;
use crate::probe::{Observation, Observed, Seen};

/// One encoded SSE frame: the bytes a transport writes in one go, with what the probes need to
/// know about it (its kind, the event id when it carries an event, and the end reason when it
/// is a stream's terminal frame).
///
/// [`GateExt::sse`](crate::GateExt::sse) makes them from a gate's events; a gateway that
/// relays already encoded bytes makes its own with [`new`](SseFrame::new).
///
/// # Examples
///
/// ```
/// use bytes::Bytes;
/// use streamgate::sse::SseFrame;
/// use streamgate::{EndReason, Kind};
///
/// let frame = SseFrame::new(Bytes::from_static(b"id: 3\ndata: hi\n\n"), Kind::Visible, Some(3));
/// assert_eq!((frame.kind(), frame.id(), frame.end_reason()), (Kind::Visible, Some(3), None));
/// assert_eq!(&frame.bytes()[..], b"id: 3\ndata: hi\n\n");
///
/// // The last frame of a stream that its upstream cut off.
/// let error = Bytes::from_static(b"event: error\ndata: {\"error\":{}}\n\n");
/// let last = SseFrame::new(error, Kind::Control, None).ending(EndReason::UpstreamError);
/// assert_eq!(last.end_reason(), Some(EndReason::UpstreamError));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseFrame {
    bytes: Bytes,
    kind: Kind,
    id: Option<u64>,
    end: Option<EndReason>,
}

/// The frame of a heartbeat: one empty comment line, without the blank line that would end an
/// event. A blank line after a stream's first `id:` is an event of its own to decoders that
/// dispatch on the last event id as WHATWG's older text did: the OpenAI Python SDK's decoder
/// does, and raises on the empty data. A comment line alone changes nothing for any decoder,
/// and the next event's lines follow it.
const HEARTBEAT: &[u8] = b":\n";

impl SseFrame {
    /// A frame of already encoded bytes, which a transport writes as they are (nothing checks
    /// them): `kind` says how they count for progress, `id` is the event id they carry, if any.
    ///
    /// See [`SseFrame`] for an example.
    pub fn new(bytes: Bytes, kind: Kind, id: Option<u64>) -> Self {
        SseFrame {
            bytes,
            kind,
            id,
            end: None,
        }
    }

    /// The same frame, as the terminal frame of a stream that ended for `reason`: a probe
    /// records the end with it.
    pub fn ending(mut self, reason: EndReason) -> Self {
        self.end = Some(reason);
        self
    }

    /// Why the stream ended, when this is its terminal frame.
    pub fn end_reason(&self) -> Option<EndReason> {
        self.end
    }

    /// A heartbeat: an empty SSE comment line (`:` and a newline, no blank line after it), a
    /// control frame.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::Kind;
    /// use streamgate::sse::SseFrame;
    ///
    /// let beat = SseFrame::heartbeat();
    /// assert_eq!(&beat.bytes()[..], b":\n");
    /// assert_eq!((beat.kind(), beat.id()), (Kind::Control, None));
    /// ```
    pub fn heartbeat() -> Self {
        SseFrame::new(Bytes::from_static(HEARTBEAT), Kind::Control, None)
    }

    /// The encoded bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// Takes the encoded bytes out.
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// How the frame counts for progress.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The id of the event this frame carries: the event's own numeric SSE id when it has one
    /// (an upstream's, kept by a gateway), otherwise [`Event::id`](crate::Event::id); `None`
    /// for heartbeats and end frames.
    pub fn id(&self) -> Option<u64> {
        self.id
    }
}

impl Chunk for SseFrame {
    fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    fn kind(&self) -> Kind {
        self.kind
    }
}

impl Observed for SseFrame {
    /// Every frame is an event for the probe; a terminal frame also ends the stream, with its
    /// reason, so a probe on the frames names the same end as one on the gate's events.
    fn observed(&self) -> Seen {
        let event = Observation::new(self.id, self.bytes.len() as u64, self.kind);
        match self.end {
            Some(reason) => Seen::Last(event, reason),
            None => Seen::Event(event),
        }
    }
}
