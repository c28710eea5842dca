//! A reader of a stream in memory: one subscriber's position, yielding the gate's items.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures_core::Stream;
use tokio::task::coop;

use super::stream::Registered;
use crate::chunk::Chunk;
use crate::gate::{Event, GateError};
use crate::resume::error::AttachError;
use crate::sync::Arc;

/// One reader of a stream in memory: the events after its position, from the replay log then
/// live, then the stream's end, with the same items as a gate's [`Consumer`](crate::Consumer)
/// (the registry encodes them as SSE frames for its subscriber).
///
/// Dropping it detaches it: the stream goes on; the last reader to leave starts the grace.
pub(crate) struct Reader<C>
where
    C: Chunk + Clone + Send + Sync + 'static,
{
    entry: Arc<Registered<C>>,
    /// This reader's key in the stream, which keeps its position.
    key: u64,
    done: bool,
}

impl<C> Reader<C>
where
    C: Chunk + Clone + Send + Sync + 'static,
{
    /// Attaches to `entry` at `next` (`check`: unless it expired or no longer holds `next`),
    /// with `max_lag` to hold a full log for.
    pub(crate) fn attached(
        entry: Arc<Registered<C>>,
        next: u64,
        max_lag: std::time::Duration,
        check: bool,
    ) -> Result<Self, AttachError> {
        let key = entry.attach(next, max_lag, check)?;
        Ok(Reader {
            entry,
            key,
            done: false,
        })
    }
}

impl<C> Stream for Reader<C>
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

impl<C> Drop for Reader<C>
where
    C: Chunk + Clone + Send + Sync + 'static,
{
    fn drop(&mut self) {
        self.entry.detach(self.key);
    }
}
