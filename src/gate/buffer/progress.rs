//! The consumer's published progress: what it has yielded, and the flag of a sender that waits
//! for the room a take makes.

use crate::sync::{AtomicBool, AtomicU64, Ordering};

/// What the consumer has yielded, in total. Written only by the consumer, read by anyone: an
/// out-of-date read sees less delivered, which only makes the bounds stricter.
#[derive(Default)]
pub(crate) struct Progress {
    events: AtomicU64,
    bytes: AtomicU64,
    /// A sender waits for room: the consumer wakes it when it yields an event.
    sender_waits: AtomicBool,
}

impl Progress {
    /// The consumer's totals: events and bytes yielded.
    #[inline]
    pub(crate) fn totals(&self) -> (u64, u64) {
        (
            self.events.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }

    /// The events the consumer has yielded.
    pub(crate) fn takes(&self) -> u64 {
        self.events.load(Ordering::Relaxed)
    }

    /// The consumer has yielded an event of `len` bytes. Then it reads
    /// [`sender_waits`](Progress::sender_waits) to learn whether to wake a sender.
    #[inline]
    pub(crate) fn publish(&self, len: usize) {
        // Only the consumer writes these, so a load and a store would do for the bytes. The
        // event count is a read-modify-write: the consumer's half of the handshake with a
        // sender that waits for room, which raises its flag and then reads this count with a
        // read-modify-write too (`fresh_totals`). The two read-modify-writes are ordered: if the
        // sender's came first, this one acquires its flag; if this one came first, the sender
        // reads this take (and the bytes stored before it). So either the sender sees the room
        // or the consumer sees the flag and wakes it.
        let bytes = self.bytes.load(Ordering::Relaxed);
        self.bytes.store(bytes + len as u64, Ordering::Relaxed);
        self.events.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether a sender waits for room (read by the consumer after [`publish`](Progress::publish)).
    #[inline]
    pub(crate) fn sender_waits(&self) -> bool {
        self.sender_waits.load(Ordering::Relaxed)
    }

    /// A sender waits for room: raises its flag. It then reads the totals with
    /// [`fresh_totals`](Progress::fresh_totals).
    pub(crate) fn sender_waiting(&self) {
        self.sender_waits.store(true, Ordering::Relaxed);
    }

    /// The waiting sender is being woken: lowers its flag.
    pub(crate) fn sender_woken(&self) {
        self.sender_waits.store(false, Ordering::Relaxed);
    }

    /// The consumer's totals, read after raising the sender's flag: the event count through a
    /// read-modify-write, which sees its latest take (see [`publish`](Progress::publish)).
    pub(crate) fn fresh_totals(&self) -> (u64, u64) {
        let events = self.events.fetch_add(0, Ordering::AcqRel);
        let bytes = self.bytes.load(Ordering::Relaxed);
        (events, bytes)
    }
}
