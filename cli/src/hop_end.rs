//! A generator's hop recorder that follows its gate: dropped before it recorded the stream's
//! end (the gate ended the stream, and the generator stopped or was dropped for it), it records
//! the end the gate ended the stream with (a failed resume store, a stop, a slow consumer)
//! rather than taking every such end for the consumer gone.

use std::ops::{Deref, DerefMut};

use streamgate::probe::Recorder;
use streamgate::{EndReason, GateHandle};

/// A [`Recorder`] whose end, when none was recorded, is its gate's.
pub struct Following {
    recorder: Recorder,
    gate: GateHandle,
}

impl Following {
    /// `recorder`, following `gate` (a generator's: `Sender::handle`).
    pub fn new(recorder: Recorder, gate: GateHandle) -> Self {
        Following { recorder, gate }
    }
}

impl Deref for Following {
    type Target = Recorder;

    fn deref(&self) -> &Recorder {
        &self.recorder
    }
}

impl DerefMut for Following {
    fn deref_mut(&mut self) -> &mut Recorder {
        &mut self.recorder
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        // A no-op for a recorder that recorded its end.
        let reason = self.gate.end_reason().unwrap_or(EndReason::ConsumerGone);
        self.recorder.end(reason);
    }
}
