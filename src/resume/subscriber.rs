//! A subscriber: one connection reading a registered stream at its own position.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures_core::{FusedStream, Stream};
use tokio::task::coop;

use super::entry::Entry;
use super::registry::{AttachError, Shared};
use crate::chunk::Chunk;
use crate::gate::{Event, GateError};
use crate::sync::Arc;

/// One reader of a registered stream: the events after its position, from the replay log then
/// live, then the stream's end, with the same items as a gate's
/// [`Consumer`](crate::Consumer) (so `.sse()`, `.probe()` and the transports take it).
///
/// Dropping it detaches it: the stream goes on (see [`Registry`](super::Registry)); the last
/// subscriber to leave starts the grace.
pub struct Subscriber<C>
where
    C: Chunk + Clone + Send + Sync + 'static,
{
    entry: Arc<Entry<C>>,
    shared: Arc<Shared<C>>,
    /// This subscriber's key in the entry, which keeps its position.
    key: u64,
    done: bool,
}

impl<C> Subscriber<C>
where
    C: Chunk + Clone + Send + Sync + 'static,
{
    /// Attaches to `entry` at `next` (`check`: unless it expired or no longer holds `next`).
    pub(crate) fn attached(
        entry: Arc<Entry<C>>,
        next: u64,
        shared: Arc<Shared<C>>,
        check: bool,
    ) -> Result<Self, AttachError> {
        let key = entry.attach(next, shared.options.max_lag, check)?;
        Ok(Subscriber {
            entry,
            shared,
            key,
            done: false,
        })
    }

    /// How long this subscriber may keep a full replay log from taking the next event (and,
    /// through the gate, the generator from making it) before it is cut off and falls behind,
    /// instead of the registry's [`max_lag`](super::ResumeOptions::max_lag).
    #[must_use]
    pub fn with_max_lag(self, max_lag: Duration) -> Self {
        self.entry.set_max_lag(self.key, max_lag);
        self
    }

    /// The stream's id.
    pub fn id(&self) -> &str {
        &self.entry.id
    }

    /// The id of the next event this subscriber will read.
    pub fn position(&self) -> u64 {
        self.entry.position(self.key).unwrap_or(0)
    }
}

impl<C> Stream for Subscriber<C>
where
    C: Chunk + Clone + Send + Sync + 'static,
{
    type Item = Result<Event<C>, GateError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let progress = ready!(coop::poll_proceed(cx));
        let item = ready!(this.entry.read(this.key, cx));
        progress.made_progress();
        if !matches!(item, Some(Ok(_))) {
            this.done = true;
        }
        Poll::Ready(item)
    }
}

impl<C> FusedStream for Subscriber<C>
where
    C: Chunk + Clone + Send + Sync + 'static,
{
    fn is_terminated(&self) -> bool {
        self.done
    }
}

impl<C> Drop for Subscriber<C>
where
    C: Chunk + Clone + Send + Sync + 'static,
{
    fn drop(&mut self) {
        self.entry.detach(self.key, &self.shared);
    }
}

impl<C> fmt::Debug for Subscriber<C>
where
    C: Chunk + Clone + Send + Sync + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscriber")
            .field("id", &self.entry.id)
            .field("key", &self.key)
            .field("done", &self.done)
            .finish()
    }
}
