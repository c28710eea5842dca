//! Streams of a proxy instance that died, carried on here (`--resume-store redis://`): each
//! stream keeps its request in the store, and a client that resumes through this instance
//! starts a watcher that adopts the stream once its pump's lease lapsed, rebuilds what was
//! sent from the replay log, and carries it on upstream as a failover does.
//!
//! ```text
//! instance A: claim(keep request) -> pump --XADD--> [log in Redis] <-- reader on B <-- client
//!   (dies: its pump's lease lapses)                       ^
//! instance B: watcher --adopt--> log read -> Sent -> carry on upstream -> pump (from event n)
//! ```

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use streamgate::GateExt;
use streamgate::resume::{AdoptError, Adoption};
use streamgate::sse::SseFrame;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::Proxy;
use super::format::Format;
use super::kept::kept;
use super::peek::Peek;
use super::stream::{self, Sent};
use crate::flags::ResumeStore;

/// How often a watcher asks whether the stream's pump lease lapsed.
const POLL: Duration = Duration::from_millis(250);

/// Watches the stream `id`, which a client reads through this instance, while the guard
/// lives: once its pump's lease lapses (the instance that pumped it died) and this instance
/// wins its adoption, carries it on here. Nothing with a memory store, whose streams all run
/// in this process.
pub(super) fn watch(proxy: &Arc<Proxy>, id: &str) -> Option<DropGuard> {
    if !matches!(proxy.config.resume.store, ResumeStore::Redis(_)) {
        return None;
    }
    let cancel = CancellationToken::new();
    let (proxy, id, watching) = (proxy.clone(), id.to_owned(), cancel.clone());
    tokio::spawn(async move {
        tokio::select! {
            () = watching.cancelled() => {}
            () = adopt_when_orphaned(&proxy, &id) => {}
        }
    });
    Some(cancel.drop_guard())
}

/// Asks every [`POLL`] to adopt the stream `id` until it ended: again after an adoption, in
/// case the pump that carries it on stops too.
async fn adopt_when_orphaned(proxy: &Arc<Proxy>, id: &str) {
    loop {
        match proxy.store.adopt(id).await {
            Ok(adoption) => carry_on(proxy, adoption).await,
            // A live pump (or a store that did not answer this time): ask again.
            Err(AdoptError::Pumped | AdoptError::Unavailable(_)) => {}
            Err(_) => return,
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Carries the adopted stream on: from what its log holds, as a failover after its last
/// logged event; a stream whose log already shows its end is only ended.
async fn carry_on(proxy: &Arc<Proxy>, mut adoption: Adoption) {
    let next = adoption.next_event();
    let stop = adoption.stop_signal();
    let kept = kept(adoption.request());
    let format = kept.as_ref().map(|(_, format)| *format);
    let consumer = match (logged(adoption.frames(), format).await, kept) {
        (Logged::Sent(sent), Some((request, format))) if adoption.start() == 0 => {
            // Named again, should the name given where it began not have reached the store.
            if let Some(response) = sent.response_id() {
                proxy.name_response(response, adoption.id());
            }
            stream::adopted(proxy, adoption.id(), format, Arc::new(request), stop, sent)
        }
        // Its end was logged, the pump gone before the end marker: its readers get the end.
        (Logged::Ended, _) => stream::ended(proxy, (next, Format::Chat), None),
        (Logged::Sent(_), kept) => {
            let why = match kept {
                Some(_) => format!(
                    "the proxy instance that served the stream stopped, and the replay log no \
                     longer holds the answer's start (it starts at event {})",
                    adoption.start()
                ),
                None => "the proxy instance that served the stream stopped, and the stream \
                         kept no request to carry it on with"
                    .to_owned(),
            };
            // A stream that kept no request is a chat completion's as far as anyone knows.
            stream::ended(proxy, (next, format.unwrap_or(Format::Chat)), Some(why))
        }
    };
    if let Err(failure) = proxy.store.carry_on(adoption, consumer).await {
        eprintln!("proxy: carrying an adopted stream on: {failure}");
    }
}

/// What a stream's replay log shows.
enum Logged {
    /// What was sent, to carry on from.
    Sent(Box<Sent>),
    /// Its end: `[DONE]`, or a terminal frame.
    Ended,
}

/// What the stream (of `format`, when it kept its request) sent, rebuilt from its logged frames
/// (the proxy's own encoding of each event it sent).
async fn logged(frames: &[SseFrame], format: Option<Format>) -> Logged {
    let bytes = frames
        .iter()
        .map(|frame| Ok::<_, Infallible>(frame.bytes().clone()));
    let mut events = futures_util::stream::iter(bytes).sse_events();
    let mut sent = Sent::default();
    while let Some(Ok(event)) = events.next().await {
        let Some(data) = event.data_str() else {
            continue;
        };
        let own_end = format.is_some_and(|format| format.ends(&event));
        if own_end || event.event() == Some("error") || data.starts_with("[DONE]") {
            return Logged::Ended;
        }
        match format {
            Some(format @ (Format::Messages | Format::Responses)) => {
                let read = format.read(&event);
                let kind = streamgate::Chunk::kind(&event);
                sent.passed(read.as_ref(), kind, None, true);
            }
            _ => {
                if let Some(peek) = Peek::of(data) {
                    sent.finished |= peek.finishes();
                    sent.delivered.add(&peek);
                }
            }
        }
        if sent.first.is_none() {
            sent.first = Some(data.to_owned());
        }
        let id = event.id().and_then(|id| id.parse::<u64>().ok());
        sent.next_id = id.map_or(sent.next_id + 1, |id| id + 1);
    }
    Logged::Sent(Box::new(sent))
}
