//! An adopted stream: one whose instance died, taken over here with what its log holds.

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::claim::Claim;
use crate::sse::SseFrame;

/// A running stream taken over from an instance that died (its pump's lease lapsed), from
/// [`Registry::adopt`](super::Registry::adopt): the request its first instance
/// [kept](Claim::keep_request), and the frames its log holds. Carry it on with a gate whose
/// events go on from [`next_event`](Adoption::next_event)
/// ([`Gate::first_id`](crate::Gate::first_id)) and
/// [`Registry::carry_on`](super::Registry::carry_on): its readers, on any instance, read on
/// from the log as if nothing happened.
///
/// While it is held the stream is this instance's (no other can adopt it); dropped without
/// being carried on, its lease lapses within two seconds, and another instance may adopt it.
///
/// # Examples
///
/// ```no_run
/// use streamgate::resume::{AdoptError, Registry};
/// use streamgate::{Gate, SendError};
///
/// # async fn orphaned(registry: Registry<String>) -> Result<(), Box<dyn std::error::Error>> {
/// match registry.adopt("req-1").await {
///     Ok(adoption) => {
///         // What the first instance kept, to ask a generator to go on from what was logged.
///         let (request, logged) = (adoption.request().clone(), adoption.frames().len());
///         let next = adoption.next_event();
///         let consumer = Gate::new().first_id(next).spawn(move |_, mut tx| async move {
///             let asked = String::from_utf8_lossy(&request).into_owned();
///             tx.send(format!("{asked}: carried on after {logged} frames")).await?;
///             Ok::<_, SendError<String>>(())
///         });
///         registry.carry_on(adoption, consumer).await?;
///     }
///     // A live pump, or nothing left to carry on: readers read the log as usual.
///     Err(AdoptError::Pumped | AdoptError::Finished) => {}
///     Err(other) => return Err(other.into()),
/// }
/// # Ok(())
/// # }
/// ```
#[must_use = "an adoption holds the stream until it is carried on or dropped"]
#[derive(Debug)]
pub struct Adoption {
    pub(crate) claim: Claim,
    pub(crate) request: Bytes,
    pub(crate) frames: Vec<SseFrame>,
    pub(crate) start: u64,
    pub(crate) next: u64,
    /// Each logged frame's entry id and size, for the pump that carries the stream on.
    pub(crate) logged: super::redis::Logged,
}

impl Adoption {
    /// The stream's id.
    pub fn id(&self) -> &str {
        self.claim.id()
    }

    /// What the stream's first instance [kept](Claim::keep_request) with it (empty when it
    /// kept nothing).
    pub fn request(&self) -> &Bytes {
        &self.request
    }

    /// The frames the log holds, oldest first: the events from [`start`](Adoption::start)
    /// (each with its [id](SseFrame::id)), and a terminal frame if one was logged.
    pub fn frames(&self) -> &[SseFrame] {
        &self.frames
    }

    /// The first event the log holds: 0 when it holds the whole stream so far, more when its
    /// bounds evicted the start.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// The id the carried-on stream's next event takes: the one after the last event logged.
    pub fn next_event(&self) -> u64 {
        self.next
    }

    /// The stream's stop signal, as [`Claim::stop_signal`]'s: cancelled by an explicit stop
    /// through any instance.
    pub fn stop_signal(&mut self) -> CancellationToken {
        self.claim.stop_signal()
    }
}
