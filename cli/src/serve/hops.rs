//! A generation's two hops at its worker: `worker.decode` (a token made) and
//! `worker.publish` (handed to the gate), each following the gate's end.

use streamgate::probe::HopProbe;
use streamgate::{EndReason, GateHandle};

use super::meta::Meta;
use crate::hop_end::Following;

/// One generation's recorders at `worker.decode` and `worker.publish`. Each records how the
/// stream ended; if the generation stops for the gate's end (its send refused, or the
/// generation dropped), as the gate ended it.
///
/// A worker observes an event at `decode` when the step that made its text has ended, and at
/// `publish` when the gate took it (a paused generation's event is published later than it
/// was decoded: the gap between the two is the reader's).
pub struct Hops {
    pub decode: Following,
    pub publish: Following,
}

impl Hops {
    /// The recorders of `meta`'s stream at `decode` and `publish`, following `gate`; their
    /// first records carry the attributes `model` and `api` (what `diagnose --by` slices by).
    pub(super) fn new(
        decode: &HopProbe,
        publish: &HopProbe,
        meta: &Meta,
        gate: GateHandle,
    ) -> Self {
        let stream = meta.stream.as_str();
        let mut hops = Hops {
            decode: Following::new(decode.recorder(stream), gate.clone()),
            publish: Following::new(publish.recorder(stream), gate),
        };
        let attrs = [("model", meta.model.as_str()), ("api", meta.format.name())];
        hops.decode.attrs(&attrs);
        hops.publish.attrs(&attrs);
        hops
    }

    /// Records the stream's end at both hops.
    pub fn end(&mut self, reason: EndReason) {
        self.decode.end(reason);
        self.publish.end(reason);
    }
}
