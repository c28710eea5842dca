//! A subscriber of a stream in Redis, on any instance.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures_core::{FusedStream, Stream};
use redis::RedisResult;
use redis::aio::MultiplexedConnection;
use tokio::sync::mpsc;

use super::keys::{Entries, Entry, EntryId, Keys, format_id, millis, parse_entry, parse_id};
use super::registry::Store;
use super::{BATCH, BLOCK, LEASE_RENEWAL};
use crate::end::EndReason;
use crate::gate::GateError;
use crate::sse::{SseFrame, end_frame, error_frame};
use crate::sync::Arc;

/// One reader of a stream kept in Redis, from a [`RedisRegistry`](super::RedisRegistry): the
/// frames after its position, from the log then live, then the stream's end, ready for the
/// transport (`.heartbeat()`, `.probe()` and the transports take it).
///
/// A stream that did not complete ends with its terminal `event: error` frame, as
/// [`EncodeSse`](crate::sse::EncodeSse) writes it; so does a subscriber that fell behind what
/// the log evicted (`slow_consumer`), or whose Redis failed or lost the stream
/// (`resume_store_error`).
///
/// Dropping it detaches it (its lease is removed): the stream goes on; when nobody is attached
/// on any instance, its grace starts.
///
/// # Examples
///
/// ```no_run
/// use futures_util::StreamExt;
/// use streamgate::resume::{RedisRegistry, ResumeOptions};
///
/// # async fn resume() -> Result<(), Box<dyn std::error::Error>> {
/// let registry = RedisRegistry::new("redis://127.0.0.1:6379", ResumeOptions::default())?;
/// let mut subscriber = registry.attach("req-1", Some(41)).await?;
/// while let Some(frame) = subscriber.next().await {
///     // Write `frame.bytes()` to the client.
/// }
/// # Ok(())
/// # }
/// ```
#[must_use = "streams do nothing unless polled"]
pub struct RedisSubscriber {
    id: Arc<str>,
    frames: mpsc::Receiver<SseFrame>,
    done: bool,
}

impl RedisSubscriber {
    /// Takes a lease on the stream `id` and starts reading it after `after`.
    pub(crate) async fn attach(
        store: Arc<Store>,
        id: Arc<str>,
        after: Option<u64>,
    ) -> RedisResult<Self> {
        let keys = Keys::new(&id);
        let connection = store.dedicated().await?;
        let reader = store.reader();
        store.lease(&keys, &reader).await?;
        let (tx, frames) = mpsc::channel(BATCH);
        // The entry of event `after`: the reader goes on after it.
        let last = after.map(|after| (after, 1));
        tokio::spawn(run(store, keys, reader, connection, last, tx));
        Ok(RedisSubscriber {
            id,
            frames,
            done: false,
        })
    }

    /// The stream's id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// The subscriber's task: renews its lease while it reads the log into `tx`, until the end or
/// the subscriber's drop; then gives the lease up.
async fn run(
    store: Arc<Store>,
    keys: Keys,
    reader: String,
    mut connection: MultiplexedConnection,
    last: Option<EntryId>,
    tx: mpsc::Sender<SseFrame>,
) {
    let renew = async {
        loop {
            tokio::time::sleep(LEASE_RENEWAL).await;
            // A failing Redis ends the read too, which says so.
            let _ = store.lease(&keys, &reader).await;
        }
    };
    let end = tokio::select! {
        () = tx.closed() => None,
        () = renew => None,
        end = read(&mut connection, &keys, last, &tx) => end,
    };
    if let Some(frame) = end {
        // Nobody may read it any more: then there is nothing to say.
        let _ = tx.send(frame).await;
    }
    let _ = store.release(&keys, &reader).await;
}

/// Sends the frames of the entries after `last` until the end marker (`None`), or returns the
/// terminal frame of a read that cannot go on.
async fn read(
    connection: &mut MultiplexedConnection,
    keys: &Keys,
    mut last: Option<EntryId>,
    tx: &mpsc::Sender<SseFrame>,
) -> Option<SseFrame> {
    let failed = || {
        let frame = error_frame("resume_store_error", "the resume store failed");
        Some(frame.ending(EndReason::UpstreamError))
    };
    loop {
        let from = last.map_or_else(|| "-".to_owned(), |id| format!("({}", format_id(id)));
        // The log's start and its next entries, at one instant.
        let snapshot: RedisResult<(Option<u64>, Entries)> = redis::pipe()
            .atomic()
            .hget(&keys.meta, "start")
            .cmd("XRANGE")
            .arg(&keys.log)
            .arg(from)
            .arg("+")
            .arg("COUNT")
            .arg(BATCH)
            .query_async(connection)
            .await;
        let Ok((start, entries)) = snapshot else {
            return failed();
        };
        let Some(start) = start else {
            let frame = error_frame(
                "resume_store_error",
                "the stream is no longer in the resume store",
            );
            return Some(frame.ending(EndReason::UpstreamError));
        };
        let next = last.map_or(0, |(event, _)| event.saturating_add(1));
        if next < start {
            let why = format!(
                "behind: the replay log starts at event {start}, this subscriber was at {next}"
            );
            return Some(end_frame(&GateError::new(
                EndReason::SlowConsumer,
                Some(why.into()),
            )));
        }
        if entries.is_empty() {
            // Until something comes (or a while, to look at the stream again).
            let wait = redis::cmd("XREAD")
                .arg("BLOCK")
                .arg(millis(BLOCK))
                .arg("COUNT")
                .arg(1)
                .arg("STREAMS")
                .arg(&keys.log)
                .arg(format_id(last.unwrap_or((0, 0))))
                .query_async::<redis::Value>(connection)
                .await;
            if wait.is_err() {
                return failed();
            }
            continue;
        }
        for (id, fields) in entries {
            let id = parse_id(&id);
            match id.and_then(|id| parse_entry(id, &fields)) {
                Some(Entry::Frame(frame)) => {
                    if tx.send(frame).await.is_err() {
                        return None;
                    }
                }
                Some(Entry::End) => return None,
                None => return failed(),
            }
            last = id;
        }
    }
}

impl Stream for RedisSubscriber {
    type Item = SseFrame;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<SseFrame>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        let frame = ready!(this.frames.poll_recv(cx));
        this.done = frame.is_none();
        Poll::Ready(frame)
    }
}

impl FusedStream for RedisSubscriber {
    fn is_terminated(&self) -> bool {
        self.done
    }
}

impl fmt::Debug for RedisSubscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisSubscriber")
            .field("id", &self.id)
            .field("done", &self.done)
            .finish()
    }
}
