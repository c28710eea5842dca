//! An encoded frame on its way to the transport.

use bytes::Bytes;

use crate::chunk::{Chunk, Kind};
use crate::probe::{Observation, Observed, Seen};

/// One encoded SSE frame: the bytes a transport writes in one go, with what the probes need to
/// know about it (its kind, and the event id when it carries an event).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    bytes: Bytes,
    kind: Kind,
    id: Option<u64>,
}

/// The frame of a heartbeat: one empty comment.
const HEARTBEAT: &[u8] = b":\n\n";

impl Frame {
    /// A frame of already encoded bytes.
    pub fn new(bytes: Bytes, kind: Kind, id: Option<u64>) -> Self {
        Frame { bytes, kind, id }
    }

    /// A heartbeat: an empty SSE comment, a control frame.
    pub fn heartbeat() -> Self {
        Frame::new(Bytes::from_static(HEARTBEAT), Kind::Control, None)
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

    /// The id of the event this frame carries ([`Event::id`](crate::Event::id), or the
    /// event's own numeric SSE id); `None` for heartbeats and end frames.
    pub fn id(&self) -> Option<u64> {
        self.id
    }
}

impl Chunk for Frame {
    fn byte_len(&self) -> usize {
        self.bytes.len()
    }

    fn kind(&self) -> Kind {
        self.kind
    }
}

impl Observed for Frame {
    /// Every frame is an event for the probe (a terminal error frame a control one); the
    /// stream's end reason is seen where the gate's stream is probed.
    fn observed(&self) -> Seen {
        Seen::Event(Observation::new(
            self.id,
            self.bytes.len() as u64,
            self.kind,
        ))
    }
}
