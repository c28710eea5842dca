//! A streamed completion: the upstream's SSE decoded, gated and sent on one chunk per event,
//! with heartbeats, an idle deadline, a terminal error frame for every upstream failure, a
//! replay log for resumes, and the upstream dropped the moment nobody can read it.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use axum::http::header::{self, HeaderMap};
use axum::response::Response;
use futures_util::StreamExt;
use serde_json::{Map, Value, json};
use streamgate::fleet::{Failure, Lease};
use streamgate::openai::{ChatCompletionChunk, ChunkChoice, Delta};
use streamgate::probe::{Observation, Recorder};
use streamgate::resume::{Claim, ClaimError};
use streamgate::sse::{DecodeError, SseEvent};
use streamgate::{Chunk, EndReason, GateExt, Kind, Sender};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Proxy;
use super::attempt::{self, Attempted, Events, Outcome, Refused, Started};
use super::body::Buffered;
use super::chunk::Relayed;
use super::config::InjectedStall;
use super::failover::{self, Carried, CarryOn, Delivered, FailoverMode, NotCarried};
use super::format::{Ending, Format, Indices, Parsed, Passed};
use super::kept;
use super::messages_seam::{Blocks, MessagesSeam};
use super::peek::{self, Peek};
use super::responses_seam::{Outline, ResponsesSeam};
use super::seam::Seam;
use super::stats::Verdict;
use super::url::UpstreamUrl;
use crate::flags::PolicyFlag;
use crate::hop_end::Following;
use crate::{resume, serving};
use streamgate::anthropic::MessagesData;

/// A completion request, its body read.
pub(super) struct StreamRequest {
    pub(super) path_and_query: String,
    pub(super) headers: HeaderMap,
    pub(super) body: Buffered,
    /// The request id (`x-request-id`), under which the stream is resumable.
    pub(super) id: String,
    /// The proxy made the id (the client sent none it could take): no other stream has it.
    pub(super) made: bool,
    /// Its API: chat completion chunks (which may coalesce), text completion chunks, Messages
    /// or Responses events.
    pub(super) format: Format,
    /// The body asks for a stream (`"stream": true`): the upstream's headers have a deadline,
    /// and the id is claimed before the upstream is asked.
    pub(super) asked: bool,
    /// The request's `model`: it picks the pool, and names a final chunk made before the
    /// upstream sent any.
    pub(super) model: Option<String>,
}

/// Sends `request` upstream (its attempts: [`attempt::run`]) and streams its answer: gated
/// SSE when an upstream answers 2xx `text/event-stream` (whatever the body asked), otherwise
/// the answer as it is (an error status with its body, or a non-SSE answer).
///
/// With `--resume-grace-ms` (resumes on), the stream is registered under its request id: a
/// request that asked for a stream claims the id before the upstream is asked, so a duplicate
/// (409) never starts upstream work; one that did not ask claims it when the answer turns out
/// to be a stream. Without a grace nothing is registered, and requests sharing an id are
/// served side by side.
pub(super) async fn relay(proxy: &Arc<Proxy>, request: StreamRequest) -> Response {
    let StreamRequest {
        path_and_query,
        mut headers,
        body,
        id,
        made,
        format,
        asked,
        model,
    } = request;
    let resumable = proxy.resumable();
    let mut claim = None;
    if resumable && asked {
        match proxy.store.claim(&id).await {
            Ok(held) => claim = Some(held),
            Err(refused) => return refused_claim(&id, &refused),
        }
    }
    // The client's `traceparent` goes upstream with its other headers; the proxy's streams
    // continue its trace (their spans, where the embedding application gives the hop one).
    let parent = streamgate::otel::extract(&headers);
    // The events are decoded here: they must arrive as they are.
    headers.remove(header::ACCEPT_ENCODING);
    // Each attempt sends the whole body (a fallback's with its model rewritten, so of another
    // length): hyper sends the length of the body it is given.
    headers.remove(header::CONTENT_LENGTH);
    // The stream's time to its first event counts from here, across its attempts.
    let recv = proxy.recv.recorder_in(id.as_str(), &parent);
    let request = Arc::new(Attempted {
        path_and_query,
        headers,
        body,
        asked,
        model,
    });
    if let Some(claim) = claim.as_mut() {
        // For another instance to carry the stream on, should this one die.
        claim.keep_request(kept::keep(&request, format));
    }
    let mut attempts: Attempting = Box::pin(attempt::run(proxy.clone(), request.clone()));
    let outcome = if asked {
        // The client hears from the proxy within one heartbeat interval. A server that queues
        // the request (llama.cpp with every slot busy) sends its headers only when it starts on
        // it, and retries take time: past that interval the stream is committed (200) and
        // heartbeats flow while the attempts go on; their failure, after it, becomes the
        // stream's terminal frame.
        // A stop (`/cancel`) meanwhile commits at once: the stream ends with its final chunk.
        let stop = claim.as_mut().map(Claim::stop_signal);
        let stopped = async {
            match &stop {
                Some(stop) => stop.cancelled().await,
                None => std::future::pending().await,
            }
        };
        let waited = tokio::select! {
            waited = tokio::time::timeout(proxy.config.gate.heartbeat, &mut attempts) => waited.ok(),
            () = stopped => None,
        };
        match waited {
            Some(outcome) => outcome,
            None => {
                let answer = Answer::Awaited(attempts);
                return start(proxy, (&id, made), format, request, claim, answer, recv).await;
            }
        }
    } else {
        attempts.await
    };
    match outcome {
        Outcome::Stream(started) => {
            if resumable && claim.is_none() {
                match proxy.store.claim(&id).await {
                    Ok(mut held) => {
                        held.keep_request(kept::keep(&request, format));
                        claim = Some(held);
                    }
                    // The upstream response is dropped: its connection closes, its work stops.
                    Err(refused) => return refused_claim(&id, &refused),
                }
            }
            start(
                proxy,
                (&id, made),
                format,
                request,
                claim,
                Answer::Now(started),
                recv,
            )
            .await
        }
        // An answer that is no stream.
        Outcome::Answer(response) => {
            proxy.stats.passed_through();
            response
        }
        // The last attempt's error (`500` even when typed `text/event-stream`).
        Outcome::Refused(refused) => {
            proxy.stats.gave_up(Some(refused.cause));
            refused.response
        }
        Outcome::GaveUp(gave_up) => {
            proxy.stats.gave_up(gave_up.cause);
            gave_up.response()
        }
    }
}

/// Starts the stream of `answer` (registered under `claim` when resumes are on) and answers
/// with its frames; `made`: the proxy made its id (the client sent none it could take).
async fn start(
    proxy: &Arc<Proxy>,
    (id, made): (&str, bool),
    format: Format,
    request: Arc<Attempted>,
    mut claim: Option<Claim>,
    answer: Answer,
    recv: Recorder,
) -> Response {
    // `/cancel` stops a registered stream through its claim's stop signal: the generator
    // ends it with a final chunk.
    let stop = claim
        .as_mut()
        .map_or_else(CancellationToken::new, Claim::stop_signal);
    // Claimed in the store, the id names this stream only; unclaimed (no resumes), only if the
    // proxy made it.
    let unique = claim.is_some() || made;
    let start = Start {
        id,
        format,
        request,
        stop,
        first_id: 0,
    };
    let consumer = start.spawn(proxy, answer, recv);
    // The gate's own ends (a slow reader cut off, a shutdown) in the API's error shape.
    let shape = format.error_shape();
    let Some(mut claim) = claim else {
        return proxy.sse_response(consumer.sse().error_shape(shape), id, unique);
    };
    claim.error_shape(shape);
    match proxy.store.register(claim, consumer).await {
        Ok(frames) => proxy.sse_response(frames, id, true),
        Err(failure) => resume::register_error(&failure),
    }
}

/// The stream `id` adopted from a proxy instance that died, `sent` what its log shows was
/// sent: carried on as a failover is, its events going on from there.
pub(super) fn adopted(
    proxy: &Arc<Proxy>,
    id: &str,
    format: Format,
    request: Arc<Attempted>,
    stop: CancellationToken,
    sent: Box<Sent>,
) -> streamgate::Consumer<Relayed> {
    let start = Start {
        id,
        format,
        request,
        stop,
        first_id: sent.next_id,
    };
    let recv = proxy.recv.recorder(id);
    start.spawn(proxy, Answer::Adopted(sent), recv)
}

/// An adopted stream that is only ended, its events going on from `next`: with the terminal
/// frame of `format` saying `why`, or (its end was logged) nothing more.
pub(super) fn ended(
    proxy: &Arc<Proxy>,
    (next, format): (u64, Format),
    why: Option<String>,
) -> streamgate::Consumer<Relayed> {
    let config = &proxy.config;
    config
        .gate
        .gate(&config.resume)
        .first_id(next)
        .spawn(move |_, mut tx| async move {
            if let Some(why) = why {
                let frame = format.own(format.error_frame(&why), next, &mut Indices::default());
                tx.send(Relayed::new(frame)).await?;
            }
            Ok::<_, streamgate::SendError<Relayed>>(())
        })
}

/// The answer to a request whose id could not be claimed.
fn refused_claim(id: &str, refused: &ClaimError) -> Response {
    resume::claim_error(&format!("x-request-id {id}"), id, refused)
}

/// A request's attempts, on their way.
type Attempting = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// The upstream's answer to a streamed request.
pub(super) enum Answer {
    /// Its first event came.
    Now(Started),
    /// Not within a heartbeat interval: the stream is committed, and the generator waits for
    /// the attempts.
    Awaited(Attempting),
    /// None here: the stream was adopted from a proxy instance that died, after what it had
    /// sent, and is carried on at once.
    Adopted(Box<Sent>),
}

/// What a stream's gate is started with.
struct Start<'a> {
    id: &'a str,
    format: Format,
    /// The request: its `model` names a final chunk made before the upstream sent any, and a
    /// stream that breaks is carried on with it.
    request: Arc<Attempted>,
    /// `/cancel`'s stop (resumes on): the generator ends the stream with a final chunk.
    stop: CancellationToken,
    /// The id of the stream's first event here (above 0 for an adopted stream).
    first_id: u64,
}

impl Start<'_> {
    /// Starts the gate whose generator reads the upstream's `answer`.
    fn spawn(
        self,
        proxy: &Arc<Proxy>,
        answer: Answer,
        recv: Recorder,
    ) -> streamgate::Consumer<Relayed> {
        let config = &proxy.config;
        let stop = self.stop;
        proxy.stats.start();
        let verdict = Arc::new(AtomicU8::new(Verdict::Gate as u8));
        let on_release = {
            let (proxy, verdict) = (proxy.clone(), verdict.clone());
            move |reason: EndReason, _| {
                let verdict = Verdict::from_u8(verdict.load(Ordering::SeqCst));
                proxy.stats.end(verdict.end_reason(reason));
            }
        };
        let pump = Pump {
            proxy: proxy.clone(),
            stop,
            verdict,
            format: self.format,
            id: self.id.to_owned(),
            request: self.request,
            merges: (config.gate.policy == PolicyFlag::Coalesce && self.format != Format::Text)
                .then_some(self.format),
            idle: config.upstream_idle,
            stall: config.stall,
        };
        config
            .gate
            .gate(&config.resume)
            .first_id(self.first_id)
            .group(&proxy.group)
            .on_release(on_release)
            // The generator owns the upstream body: when the stream ends early (the client left
            // and no grace holds it, a policy, a stop, shutdown) the gate drops it, hyper closes
            // the upstream connection, and the upstream server cancels its own generation.
            .spawn(move |_, tx| {
                // An end the gate made first (a stop, a failed resume store) is `proxy.recv`'s.
                let recv = Following::new(recv, tx.handle());
                pump.run(answer, recv, tx)
            })
    }
}

impl Verdict {
    fn from_u8(value: u8) -> Verdict {
        match value {
            1 => Verdict::UpstreamError,
            2 => Verdict::Stopped,
            _ => Verdict::Gate,
        }
    }
}

/// The generator of one stream: reads the upstream's events into the gate.
struct Pump {
    proxy: Arc<Proxy>,
    /// `/cancel`: stop reading, send a final chunk and `[DONE]`.
    stop: CancellationToken,
    verdict: Arc<AtomicU8>,
    format: Format,
    /// The request id: a final chunk made before the upstream sent any names it.
    id: String,
    /// The request, to carry the stream on when it breaks (and its `model`, for a final chunk
    /// made before the upstream sent any).
    request: Arc<Attempted>,
    /// Under `--policy coalesce`, the API whose rules its events merge by (text completions'
    /// never merge).
    merges: Option<Format>,
    /// `--upstream-idle-ms` (zero: none): the longest wait for the upstream's next event.
    idle: Duration,
    /// For tests and the demo: a stall before forwarding one event (`Config::stall`).
    stall: Option<InjectedStall>,
}

/// How the upstream's stream ended.
enum End {
    /// `data: [DONE]`, or a clean close after the final chunk (the proxy sends the `[DONE]`).
    Done,
    /// The upstream sent its own error frame (passed on).
    ErrorFrame,
    /// The upstream failed: the client gets a terminal error frame saying this.
    Failed(String),
    /// The upstream ended the stream with an error another replica could have avoided, and it
    /// was not carried on: the client gets that frame, as the upstream sent it.
    Upstream(SseEvent),
    /// Stopped through `/cancel`.
    Stopped,
}

/// How long a whole answer's upstream body is read past the answer's end, for its own end
/// (see `Upstream::read_to_end`).
const READ_TO_END: Duration = Duration::from_secs(1);

/// The upstream a stream reads: its events, and its lease on the replica, held until the
/// stream ends or breaks there.
struct Upstream {
    lease: Option<Lease<UpstreamUrl>>,
    events: Events,
}

impl Upstream {
    /// Names this upstream (its URL, its pool, and the model asked of it) and the request's
    /// `--record-header`s in the `proxy.recv` hop records from the next event on: a stall the
    /// diagnosis finds there names who served the stream when it went quiet, and `diagnose
    /// --by` slices by them.
    fn serves(&self, pump: &Pump, recv: &mut Recorder) {
        let Some(lease) = &self.lease else { return };
        let url = lease.replica().to_string();
        let model = lease.model();
        let pool = pump
            .proxy
            .fleet
            .pool_for(model)
            .map_or("", |pool| &pool.name);
        let mut attrs = vec![("upstream", url.as_str()), ("pool", pool), ("model", model)];
        for name in &pump.proxy.config.record_headers {
            let value = pump.request.headers.get(name).and_then(|v| v.to_str().ok());
            if let Some(value) = value {
                attrs.push((name.as_str(), value));
            }
        }
        recv.attrs(&attrs);
    }

    /// Lets go of the replica, and reads what follows the answer's end (the body's last
    /// chunk, sent when the upstream's own stream ends, which may be after its `[DONE]`) on a
    /// task of its own, for at most [`READ_TO_END`].
    fn read_to_end(self) {
        let Upstream { lease, mut events } = self;
        drop(lease);
        let rest = async move { while let Some(Ok(_)) = events.next().await {} };
        tokio::spawn(tokio::time::timeout(READ_TO_END, rest));
    }

    /// None yet (a stream adopted from a proxy instance that died).
    fn none() -> Upstream {
        Upstream {
            lease: None,
            events: Box::pin(futures_util::stream::empty()),
        }
    }

    /// The stream `started`, and its first event.
    fn of(started: Started) -> (Upstream, SseEvent) {
        let upstream = Upstream {
            lease: Some(started.lease),
            events: started.events,
        };
        (upstream, started.first)
    }
}

/// What a stream has sent its client so far.
#[derive(Default)]
pub(super) struct Sent {
    /// The next event's id (its position in the stream).
    pub(super) next_id: u64,
    /// The first chunk, whose envelope (id, model, ...) a final chunk after a stop repeats.
    pub(super) first: Option<String>,
    /// Whether a chunk said how the answer finished (a `finish_reason`, a Messages
    /// `stop_reason`), or its own end event came.
    pub(super) finished: bool,
    /// Whether the answer's own end event came (Messages, Responses).
    ended: bool,
    /// The answer so far, to continue it from.
    pub(super) delivered: Delivered,
    /// Once the stream was carried on elsewhere: the join of the carried-on events.
    seam: Option<Joining>,
    /// A Responses stream's item and content part, for the events that leave them out.
    indices: Indices,
    /// A Messages stream's blocks, where a carried-on stream's go on.
    blocks: Blocks,
    /// A Responses stream's items, where a carried-on stream's go on.
    outline: Outline,
    /// The kind of the last Messages or Responses event passed on, as its type says (what
    /// `proxy.recv` records it as).
    passed_kind: Option<Kind>,
    /// The visible events passed on (a stopped Messages answer's output tokens).
    visible: u64,
    /// How many times the stream was carried on.
    failovers: u32,
    /// When it first broke: every failover's attempts share one deadline from then.
    broke_at: Option<Instant>,
}

/// The seam of a stream carried on elsewhere, by its format's events.
#[derive(Debug)]
enum Joining {
    /// Chat and text completion chunks.
    Chunks(Seam),
    /// Anthropic Messages events.
    Messages(MessagesSeam),
    /// OpenAI Responses events.
    Responses(Box<ResponsesSeam>),
}

/// Why the proxy ends an answer itself.
#[derive(Debug, Clone, Copy)]
enum Closing {
    /// It was stopped (`/cancel`).
    Stopped,
    /// Every token it asked for was delivered before its stream broke.
    Length,
    /// It finished (a `stop_reason`, its text final) and broke before its own end event.
    Finished,
}

impl Sent {
    /// The id of the Responses answer the client was told (its `response.created`'s), once it was.
    pub(super) fn response_id(&self) -> Option<&str> {
        self.outline.response_id()
    }

    /// The client got an event of a Messages or Responses stream (`data`, as read, of `kind`,
    /// ending the answer as `ending` says): where a failover or the proxy's own end goes on
    /// from. A Messages `message_delta` with a `stop_reason` finishes the answer (its
    /// `message_stop` is all that is left). `carrying`: the answer is kept, to carry it on.
    pub(super) fn passed(
        &mut self,
        data: Option<&Parsed>,
        kind: Kind,
        ending: Option<Ending>,
        carrying: bool,
    ) {
        self.ended |= ending.is_some();
        self.finished |= ending.is_some();
        if kind == Kind::Visible {
            self.visible += 1;
        }
        match data {
            Some(Parsed::Messages(data)) => {
                self.blocks.saw(data);
                if let MessagesData::MessageDelta(delta) = data {
                    self.finished |= delta.delta.stop_reason.is_some();
                }
                if carrying {
                    self.delivered.add_messages(data);
                }
            }
            Some(Parsed::Responses(data)) => {
                self.outline.saw(data);
                self.finished |= self.outline.text_is_final();
                if carrying {
                    self.delivered.add_responses(data);
                }
            }
            None => {}
        }
    }
}

/// One wait for the upstream.
enum Read {
    /// Its next item (`None`: its end).
    Item(Option<Result<SseEvent, DecodeError>>),
    /// Nothing for `--upstream-idle-ms`.
    Stalled,
    /// None: the stream was adopted from a proxy instance that died.
    Orphaned,
}

/// What one read came to.
enum Step {
    /// An event (sent on, or dropped as invalid): the upstream is not idle.
    Heard,
    /// Nothing that counts (a `retry:` alone).
    Quiet,
    /// The stream ends.
    End(End),
    /// The upstream's stream broke: the failure, and what the client is told if it is not
    /// carried on (the upstream's own error frame, when it sent one).
    Broke(Failure, String, Option<SseEvent>),
}

impl Step {
    /// An event passed on, ending the stream as `end` says.
    fn ended(end: Option<End>) -> Step {
        end.map_or(Step::Heard, Step::End)
    }
}

impl Pump {
    async fn run(
        self,
        answer: Answer,
        mut recv: Following,
        mut tx: Sender<Relayed>,
    ) -> Result<(), &'static str> {
        // A new stream reads its first event first; an adopted one carries on at once.
        let begun = |started| {
            let (upstream, first) = Upstream::of(started);
            (upstream, Some(Ok(first)), Sent::default(), false)
        };
        let (mut upstream, mut pending, mut sent, mut orphaned) = match answer {
            Answer::Now(started) => begun(started),
            Answer::Awaited(attempts) => match self.awaited(attempts).await {
                Ok(started) => begun(started),
                Err(end) => return self.finish(end, recv, tx, Sent::default()).await,
            },
            Answer::Adopted(sent) => (Upstream::none(), None, *sent, true),
        };
        upstream.serves(&self, &mut recv);
        // The idle deadline: one timer, moved only when it fires (an event only reads the
        // clock), as the heartbeat's. It runs only while the upstream is awaited: a wait for
        // room in the gate (a slow client) is not the upstream's.
        let mut waiting_since = Instant::now();
        let mut idle = std::pin::pin!(tokio::time::sleep(self.idle));
        // One wait for the stop, polled again for each event (a new one per event would join
        // and leave the token's waiters, two locks, every time).
        let mut stopped = std::pin::pin!(self.stop.clone().cancelled_owned());
        let mut stall = self.stall;
        let end = loop {
            if let Some(injected) = stall.filter(|injected| injected.at == sent.next_id) {
                // An injected freeze before forwarding event n (a proxy-side stall), once.
                stall = None;
                tokio::select! {
                    () = tokio::time::sleep(injected.duration) => {}
                    () = &mut stopped => {}
                }
                waiting_since = Instant::now();
            }
            let read = match pending.take() {
                _ if std::mem::take(&mut orphaned) => Read::Orphaned,
                Some(item) => Read::Item(Some(item)),
                None => tokio::select! {
                    biased;
                    // A stop after the answer's own end event: nothing to add to it.
                    // (A Messages or Responses answer finished but for its end event gets it.)
                    () = &mut stopped => break match sent.finished && !self.format.ends_with_done() {
                        true => self.done(&mut sent, &mut tx).await?,
                        false => End::Stopped,
                    },
                    () = &mut idle, if !self.idle.is_zero() => {
                        let due = waiting_since + self.idle;
                        if Instant::now() < due {
                            idle.as_mut().reset(due);
                            continue;
                        }
                        Read::Stalled
                    }
                    item = upstream.events.next() => Read::Item(item),
                },
            };
            let step = match read {
                Read::Orphaned => Step::Broke(
                    Failure::Cut,
                    "the proxy instance that served the stream stopped".to_owned(),
                    None,
                ),
                Read::Stalled => Step::Broke(
                    Failure::Stalled,
                    format!(
                        "upstream stalled: no event for {} ms",
                        self.idle.as_millis()
                    ),
                    None,
                ),
                // Its final chunk came and it closed cleanly: the answer is whole, and the
                // client gets the `[DONE]` it waits for.
                Read::Item(None) if sent.finished => {
                    Step::End(self.done(&mut sent, &mut tx).await?)
                }
                Read::Item(None) => Step::Broke(
                    Failure::Cut,
                    format!(
                        "the upstream closed the stream before {}",
                        self.format.end_name()
                    ),
                    None,
                ),
                Read::Item(Some(Ok(event))) => {
                    let (arrived, before) = (std::time::Instant::now(), sent.next_id);
                    let (bytes, kind) = (event.byte_len() as u64, event.kind());
                    let step = self.forward(event, &mut sent, &mut tx).await?;
                    // `proxy.recv` records each event as it arrived, under the id the client
                    // gets it by (an upstream's own ids start again after a failover); one the
                    // proxy did not pass on (the seam's echo, an invalid one) or an end frame
                    // is counted, but no progress and no record.
                    let passed =
                        sent.next_id > before && matches!(step, Step::Heard | Step::End(_));
                    let kind = sent.passed_kind.take().unwrap_or(kind);
                    let seen = match passed {
                        true => Observation::new(Some(before), bytes, kind),
                        false => Observation::new(None, bytes, Kind::Control),
                    };
                    recv.observe_at(seen, arrived);
                    step
                }
                Read::Item(Some(Err(error))) => Step::Broke(Failure::Cut, describe(&error), None),
            };
            match step {
                Step::Heard => waiting_since = Instant::now(),
                Step::Quiet => {}
                Step::End(end) => break end,
                // A finish came: the answer is whole, however the upstream went after it.
                Step::Broke(..) if sent.finished => break self.done(&mut sent, &mut tx).await?,
                Step::Broke(failure, why, frame) => {
                    let broke = (failure, why, frame);
                    match self.carry_on(&mut upstream, broke, &mut sent).await {
                        Ok(Some(first)) => {
                            upstream.serves(&self, &mut recv);
                            pending = Some(Ok(first));
                            waiting_since = Instant::now();
                        }
                        Ok(None) => break self.whole(&mut sent, &mut tx).await?,
                        Err(end) => break end,
                    }
                }
            }
        };
        // The stream's count on its replica goes now. A whole answer's upstream is read to
        // its body's end, on a task of its own (its server then sees its stream complete, not
        // its client gone, and the connection can serve another request; read here, it would
        // be dropped with the stream by a client that hangs up at `[DONE]`); any other end
        // drops the connection now (an unfinished body closes it), which stops the upstream's
        // generation.
        match end {
            End::Done => upstream.read_to_end(),
            _ => drop(upstream),
        }
        self.finish(end, recv, tx, sent).await
    }

    /// Sends one upstream event on (its data, joined at the seam once carried on), or says
    /// that the stream ends or broke with it.
    async fn forward(
        &self,
        event: SseEvent,
        sent: &mut Sent,
        tx: &mut Sender<Relayed>,
    ) -> Result<Step, &'static str> {
        let gone = |_| "the stream ended";
        let Some(data) = event.data_str() else {
            // A `retry:` alone: the proxy's clients reconnect to the proxy.
            return Ok(Step::Quiet);
        };
        let carrying = self.proxy.config.failover != FailoverMode::Off;
        if event.event() == Some("error") {
            let error = serde_json::from_str::<Value>(data).unwrap_or(Value::Null);
            // The upstream's own end frame, passed on as the stream's end (unless another
            // replica carries the stream on).
            let frame = SseEvent::data(data)
                .with_event("error")
                .expect("a constant type");
            if carrying && peek::another_replica_could_avoid(&error) {
                let why = format!("the upstream ended the stream with an error: {data}");
                return Ok(Step::Broke(Failure::ErrorEvent, why, Some(frame)));
            }
            self.send_own(vec![frame], &mut sent.next_id, tx).await?;
            return Ok(Step::End(End::ErrorFrame));
        }
        if self.format.ends_with_done() && data.starts_with("[DONE]") {
            return Ok(Step::End(self.done(sent, tx).await?));
        }
        if !self.format.ends_with_done() {
            return self.forward_event(event, sent, tx).await;
        }
        let Some(peeked) = Peek::of(data) else {
            // Not JSON: an SDK would raise on it mid-answer. Dropped and counted; the stream
            // goes on whole.
            self.proxy.stats.invalid_event();
            return Ok(Step::Heard);
        };
        if carrying
            && peeked
                .error()
                .is_some_and(peek::another_replica_could_avoid)
        {
            let why = format!("the upstream sent an error mid-stream: {data}");
            return Ok(Step::Broke(Failure::ErrorEvent, why, None));
        }
        let joined = match sent.seam.as_mut() {
            Some(Joining::Chunks(seam)) => match seam.join(data) {
                // Nothing to say (a repeated role, the echo of the delivered text).
                None => return Ok(Step::Heard),
                joined => joined,
            },
            _ => None,
        };
        {
            // What the client gets: the chunk as it came, or as joined at the seam.
            let peek = match joined.as_deref() {
                Some(joined) => Peek::of(joined).unwrap_or_default(),
                None => peeked,
            };
            sent.finished |= peek.finishes();
            if carrying {
                sent.delivered.add(&peek);
            }
        }
        if sent.first.is_none() {
            sent.first = Some(data.to_owned());
        }
        let event = match joined {
            Some(joined) => SseEvent::data(joined),
            None => event,
        };
        let event = event
            .with_id(sent.next_id.to_string())
            .expect("a number is a valid id");
        tx.send(Relayed::merging(event, self.merges))
            .await
            .map_err(gone)?;
        sent.next_id += 1;
        Ok(Step::Heard)
    }

    /// Sends on one event of a format whose events are no chunks (Messages, Responses): as it
    /// came (a Responses event numbered, see [`format::numbered`]), or dropped and counted
    /// when it is not one the format's events can be; its end event finishes the answer.
    async fn forward_event(
        &self,
        event: SseEvent,
        sent: &mut Sent,
        tx: &mut Sender<Relayed>,
    ) -> Result<Step, &'static str> {
        let joined = match sent.seam.as_mut() {
            Some(Joining::Messages(seam)) => seam.join(event),
            Some(Joining::Responses(seam)) => seam.join(event),
            _ => return self.pass_event(event, sent, tx).await.map(Step::ended),
        };
        // Nothing to say (a second opening, the echo of the delivered text), or (the client's
        // open block or item closed first) several events.
        for event in joined {
            if let Some(end) = self.pass_event(event, sent, tx).await? {
                return Ok(Step::End(end));
            }
        }
        Ok(Step::Heard)
    }

    /// Sends on one event of a Messages or Responses stream (see [`Pump::forward_event`]); the
    /// stream's end when it ends it.
    async fn pass_event(
        &self,
        event: SseEvent,
        sent: &mut Sent,
        tx: &mut Sender<Relayed>,
    ) -> Result<Option<End>, &'static str> {
        let Some(passed) = self.format.pass(event, sent.next_id, &mut sent.indices) else {
            // An SDK would raise on it mid-answer: dropped and counted, as a chunk that is no
            // JSON is.
            self.proxy.stats.invalid_event();
            return Ok(None);
        };
        let Passed {
            event,
            kind,
            ending,
            data,
        } = passed;
        let carrying = self.proxy.config.failover != FailoverMode::Off;
        let opened = sent.response_id().is_some();
        sent.passed(data.as_ref(), kind, ending, carrying);
        if let (false, Some(response), true) = (opened, sent.response_id(), self.proxy.resumable())
        {
            // A client resumes the response by the id it was told.
            self.proxy.name_response(response, &self.id);
        }
        sent.passed_kind = Some(kind);
        if sent.first.is_none() {
            sent.first = event.data_str().map(str::to_owned);
        }
        let event = event
            .with_id(sent.next_id.to_string())
            .expect("a number is a valid id");
        tx.send(Relayed::merging(event, self.merges).counted_as(kind))
            .await
            .map_err(|_| "the stream ended")?;
        sent.next_id += 1;
        // The upstream's own end of an answer that failed: the stream ends there.
        Ok((ending == Some(Ending::Failed)).then_some(End::ErrorFrame))
    }

    /// Sends `[DONE]` where the format ends with it: the stream is complete. A Messages answer
    /// that said its `stop_reason`, or a Responses answer whose text was final, and that broke
    /// before its own end event gets the end (see [`Pump::closing`]).
    async fn done(&self, sent: &mut Sent, tx: &mut Sender<Relayed>) -> Result<End, &'static str> {
        if !self.format.ends_with_done() {
            if !sent.ended {
                let events = self.closing(sent, Closing::Finished);
                self.send_own(events, &mut sent.next_id, tx).await?;
            }
            // Its own end event came: nothing follows it.
            return Ok(End::Done);
        }
        let done = SseEvent::data("[DONE]").with_id(sent.next_id.to_string());
        let done = done.expect("a number is a valid id");
        tx.send(Relayed::new(done))
            .await
            .map_err(|_| "the stream ended")?;
        sent.next_id += 1;
        Ok(End::Done)
    }

    /// Ends a stream whose `max_tokens` were all delivered before it broke: its final chunk
    /// (`finish_reason: length`) and `[DONE]`; a Messages or Responses answer's own end (see
    /// [`Pump::closing`]: `max_tokens`, `max_output_tokens`).
    async fn whole(&self, sent: &mut Sent, tx: &mut Sender<Relayed>) -> Result<End, &'static str> {
        if !self.format.ends_with_done() {
            let events = self.closing(sent, Closing::Length);
            self.send_own(events, &mut sent.next_id, tx).await?;
            return Ok(End::Done);
        }
        let model = self.request.model.as_deref();
        let last = final_chunk(
            sent.first.as_deref(),
            &self.id,
            model,
            self.format == Format::Chat,
            "length",
        );
        let event = SseEvent::data(last).with_id(sent.next_id.to_string());
        tx.send(Relayed::new(event.expect("a number is a valid id")))
            .await
            .map_err(|_| "the stream ended")?;
        sent.next_id += 1;
        self.done(sent, tx).await
    }

    /// The upstream's stream broke (`failure`, which the client is told as `why` if it is not
    /// carried on): counted against its replica, dropped, and carried on elsewhere as
    /// `--failover` allows. The carried-on stream's first event; `None` when the answer was
    /// already whole; the stream's end when it is not carried on.
    async fn carry_on(
        &self,
        upstream: &mut Upstream,
        (failure, why, frame): (Failure, String, Option<SseEvent>),
        sent: &mut Sent,
    ) -> Result<Option<SseEvent>, End> {
        // The broken upstream goes now: its connection closes, its count on its replica ends.
        // None broke here when the stream was adopted from an instance that died: the model
        // asked goes on, on any replica.
        let (model, broke) = match upstream.lease.take() {
            Some(mut lease) => {
                lease.broke(&failure);
                (lease.model().to_owned(), Some(lease.index()))
            }
            None => (self.request.model.clone().unwrap_or_default(), None),
        };
        upstream.events = Box::pin(futures_util::stream::empty());
        let config = &self.proxy.config;
        let stats = &self.proxy.stats;
        let not_carried = |reason: NotCarried| {
            stats.failed_over(Carried::Refused);
            match (reason, &frame) {
                // The upstream's own error, as it said it.
                (_, Some(frame)) => End::Upstream(frame.clone()),
                (NotCarried::Off, None) => End::Failed(why.clone()),
                (reason, None) => End::Failed(format!("{why}; not carried on: {reason}")),
            }
        };
        let original = &self.request.body.bytes;
        // A Responses continuation goes on in the part the client has open.
        let text = match self.format {
            Format::Responses => sent.outline.holding(sent.delivered.text_len),
            _ => Some(sent.delivered.text.as_str()),
        };
        let text = text.map(str::to_owned);
        let how = (self.format, text.as_deref());
        let (bytes, carried, message) =
            match failover::carry_on(config.failover, original, how, &sent.delivered) {
                Ok(CarryOn::Whole) => {
                    stats.failed_over(Carried::Whole);
                    return Ok(None);
                }
                Ok(CarryOn::Restart(bytes)) => (bytes, Carried::Restarted, None),
                Ok(CarryOn::Continue { body, message }) => {
                    (body, Carried::Continued, Some(message))
                }
                Err(reason) => return Err(not_carried(reason)),
            };
        if sent.failovers >= config.failover_max {
            return Err(not_carried(NotCarried::Budget(config.failover_max)));
        }
        // The body names the requested model; each attempt's names the model it asks for.
        let named = self.request.model.clone().unwrap_or_default();
        let body = (named, bytes);
        let continuing = carried == Carried::Continued;
        let failed = |what: String| {
            stats.failed_over(Carried::Failed);
            End::Failed(format!("{why}; carrying it on failed: {what}"))
        };
        let since = *sent.broke_at.get_or_insert_with(Instant::now);
        loop {
            let fleet = &self.proxy.fleet;
            let Some(attempts) = fleet.carry_on(&model, broke, continuing, since) else {
                return Err(not_carried(NotCarried::NoUpstream));
            };
            if attempts.time_left().is_none() {
                return Err(not_carried(NotCarried::Deadline));
            }
            sent.failovers += 1;
            let request = self.request.clone();
            let outcome = tokio::select! {
                biased;
                () = self.stop.cancelled() => return Err(End::Stopped),
                outcome = attempt::run_with(&self.proxy, &request, body.clone(), attempts) => outcome,
            };
            match outcome {
                Outcome::Stream(started) => {
                    stats.failed_over(carried);
                    let (carried_on, first) = Upstream::of(started);
                    *upstream = carried_on;
                    // A continuation's server may echo the message sent, or the delivered text.
                    let delivered = &sent.delivered;
                    let echoes: Vec<&str> = match (&message, &text) {
                        (Some(message), Some(text)) => vec![message.as_str(), text.as_str()],
                        _ => Vec::new(),
                    };
                    let tokens = delivered.tokens;
                    sent.seam = Some(match self.format {
                        Format::Messages => {
                            Joining::Messages(MessagesSeam::new(&sent.blocks, &echoes, tokens))
                        }
                        Format::Responses => {
                            let seam = ResponsesSeam::new(&sent.outline, &echoes, tokens);
                            Joining::Responses(Box::new(seam))
                        }
                        _ => Joining::Chunks(Seam::new(sent.first.as_deref(), &echoes, tokens)),
                    });
                    return Ok(Some(first));
                }
                // A server that refuses a continuation for its assistant prefix does not take
                // one: its pool is not asked to continue again, the next one is asked now, and
                // its refusal is never the client's error (the original failure is).
                Outcome::Refused(refused) if continuing && refuses_prefill(&refused) => {
                    self.proxy.fleet.refused_prefill(&refused.model);
                    if sent.failovers >= config.failover_max {
                        return Err(failed(format!(
                            "`{}` refused the continuation ({})",
                            refused.model,
                            refused.response.status()
                        )));
                    }
                }
                Outcome::Refused(refused) => {
                    let status = refused.response.status();
                    return Err(failed(format!("the upstream answered {status}")));
                }
                Outcome::GaveUp(gave_up) => return Err(failed(gave_up.message)),
                Outcome::Answer(answer) => {
                    return Err(failed(format!(
                        "the upstream answered {} without a stream",
                        answer.status()
                    )));
                }
            }
        }
    }

    /// The upstream's stream, its first event come, once the attempts are over (a committed
    /// stream).
    async fn awaited(&self, attempts: Attempting) -> Result<Started, End> {
        let outcome = tokio::select! {
            biased;
            () = self.stop.cancelled() => return Err(End::Stopped),
            outcome = attempts => outcome,
        };
        match outcome {
            Outcome::Stream(started) => Ok(started),
            Outcome::GaveUp(gave_up) => {
                self.proxy.stats.gave_up(gave_up.cause);
                Err(End::Failed(gave_up.message))
            }
            Outcome::Answer(answer) => self.too_late(answer).await,
            Outcome::Refused(refused) => {
                self.proxy.stats.gave_up(Some(refused.cause));
                self.too_late(refused.response).await
            }
        }
    }

    /// An answer that came once the stream had started: too late for its status, the stream's
    /// terminal frame says what it was.
    async fn too_late(&self, answer: Response) -> Result<Started, End> {
        let status = answer.status();
        let body = prefix(answer.into_body(), ANSWER_PREFIX).await;
        Err(End::Failed(format!(
            "the upstream answered {status} after the stream had started: {body}"
        )))
    }

    /// The events that end a Messages or Responses answer the proxy ends itself, from what the
    /// client has: a stop's (`end_turn`; `incomplete`, `stopped`), one whose tokens were all
    /// delivered (`max_tokens`; `incomplete`, `max_output_tokens`), or one finished but for its
    /// end event (`message_stop`; `incomplete`, `interrupted`).
    fn closing(&self, sent: &Sent, closing: Closing) -> Vec<SseEvent> {
        let named = (
            self.id.as_str(),
            self.request.model.as_deref().unwrap_or(""),
        );
        let visible = sent.visible;
        match (self.format, closing) {
            (Format::Messages, Closing::Finished) => sent.blocks.stop(),
            (Format::Responses, Closing::Finished) => sent.outline.close(named, "interrupted"),
            (Format::Messages, Closing::Stopped) => sent.blocks.close(named, "end_turn", visible),
            (Format::Messages, Closing::Length) => sent.blocks.close(named, "max_tokens", visible),
            (Format::Responses, Closing::Stopped) => sent.outline.close(named, "stopped"),
            (Format::Responses, Closing::Length) => sent.outline.close(named, "max_output_tokens"),
            (Format::Chat | Format::Text, _) => Vec::new(),
        }
    }

    /// Sends `events` of the proxy's own, numbered from `next_id` on (a Responses event's
    /// `sequence_number` too).
    async fn send_own(
        &self,
        events: Vec<SseEvent>,
        next_id: &mut u64,
        tx: &mut Sender<Relayed>,
    ) -> Result<(), &'static str> {
        let mut indices = Indices::default();
        for event in events {
            let event = self.format.own(event, *next_id, &mut indices);
            // An error frame ends the stream: it is no event to resume after.
            let ends = event.event() == Some("error");
            let event = match ends {
                true => event,
                false => event
                    .with_id(next_id.to_string())
                    .expect("a number is a valid id"),
            };
            tx.send(Relayed::new(event))
                .await
                .map_err(|_| "the stream ended")?;
            if !ends {
                *next_id += 1;
            }
        }
        Ok(())
    }

    /// Ends the stream as `end` says, after what `sent` says was sent.
    async fn finish(
        &self,
        end: End,
        mut recv: Following,
        mut tx: Sender<Relayed>,
        sent: Sent,
    ) -> Result<(), &'static str> {
        let mut next_id = sent.next_id;
        match end {
            End::Done => recv.end(EndReason::Completed),
            End::ErrorFrame => {
                self.verdict
                    .store(Verdict::UpstreamError as u8, Ordering::SeqCst);
                recv.end(EndReason::UpstreamError);
            }
            End::Failed(message) => {
                self.verdict
                    .store(Verdict::UpstreamError as u8, Ordering::SeqCst);
                recv.end(EndReason::UpstreamError);
                let frame = self.format.error_frame(&message);
                self.send_own(vec![frame], &mut next_id, &mut tx).await?;
            }
            End::Upstream(frame) => {
                self.verdict
                    .store(Verdict::UpstreamError as u8, Ordering::SeqCst);
                recv.end(EndReason::UpstreamError);
                self.send_own(vec![frame], &mut next_id, &mut tx).await?;
            }
            End::Stopped => {
                self.verdict.store(Verdict::Stopped as u8, Ordering::SeqCst);
                recv.end(EndReason::Cancelled);
                let events = if self.format.ends_with_done() {
                    let model = self.request.model.as_deref();
                    let chat = self.format == Format::Chat;
                    let first = sent.first.as_deref();
                    let finish = final_chunk(first, &self.id, model, chat, "stop");
                    vec![SseEvent::data(finish), SseEvent::data("[DONE]")]
                } else {
                    self.closing(&sent, Closing::Stopped)
                };
                self.send_own(events, &mut next_id, &mut tx).await?;
            }
        }
        Ok(())
    }
}

/// Whether an upstream's refusal of a continuation is for its assistant prefix: a 400 or 422
/// whose body speaks of a prefill, the final assistant message or `continue_final_message` (a
/// prompt too long or a bad parameter is not).
fn refuses_prefill(refused: &Refused) -> bool {
    let status = refused.response.status();
    if status != StatusCode::BAD_REQUEST && status != StatusCode::UNPROCESSABLE_ENTITY {
        return false;
    }
    let said = String::from_utf8_lossy(&refused.said).to_ascii_lowercase();
    // Anthropic's API takes a prefill, but not one that ends in whitespace: a refusal of this
    // prefill, not of prefills.
    if said.contains("whitespace") {
        return false;
    }
    [
        "prefill",
        "assistant",
        "continue_final_message",
        "final message",
    ]
    .iter()
    .any(|words| said.contains(words))
}

/// The most of a late error answer's body a terminal frame quotes.
const ANSWER_PREFIX: usize = 4096;

/// The first `limit` bytes of `body` as text (what arrives of them within a second).
async fn prefix(body: Body, limit: usize) -> String {
    let (mut bytes, _) = attempt::read_prefix(body).await;
    bytes.truncate(limit);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// What the client is told when decoding the upstream failed.
fn describe(error: &DecodeError) -> String {
    match error {
        DecodeError::Upstream(cause) => {
            format!(
                "the upstream connection failed mid-stream: {}",
                serving::with_causes(&**cause)
            )
        }
        other => format!("the upstream sent a malformed stream: {other}"),
    }
}

/// The last chunk of a stream stopped on purpose (or whole): one choice that finishes with
/// `finish` (`stop`, or `length` for an answer all of whose `max_tokens` came) (a
/// `delta` for a chat completion, a `text` for a text one), in the envelope (`id`, `model`,
/// ...) of the stream's `first` chunk, without its `usage`. When there was none (stopped before
/// the upstream's first chunk), or it was not a chunk, a minimal one of the proxy's own: its id
/// the request id, its `model` the request's (empty when it named none).
fn final_chunk(
    first: Option<&str>,
    id: &str,
    model: Option<&str>,
    chat: bool,
    finish: &str,
) -> String {
    let created = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs())
    };
    let model = model.unwrap_or("");
    if chat {
        let mut chunk = first
            .and_then(|first| ChatCompletionChunk::parse(first.as_bytes()).ok())
            .unwrap_or_else(|| ChatCompletionChunk::new(id, created(), model));
        chunk.usage = None;
        chunk.choices = vec![ChunkChoice {
            finish_reason: Some(finish.to_owned()),
            ..ChunkChoice::new(0, Delta::default())
        }];
        return chunk.to_json();
    }
    // A text completion's chunk: the openai module has no type for it.
    let mut chunk = match first.and_then(|first| serde_json::from_str::<Value>(first).ok()) {
        Some(Value::Object(chunk)) => chunk,
        _ => Map::from_iter([
            ("id".to_owned(), json!(id)),
            ("object".to_owned(), json!("text_completion")),
            ("created".to_owned(), json!(created())),
            ("model".to_owned(), json!(model)),
        ]),
    };
    chunk.remove("usage");
    let choice = json!({"index": 0, "text": "", "logprobs": null, "finish_reason": finish});
    chunk.insert("choices".into(), json!([choice]));
    Value::Object(chunk).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_final_chunk_repeats_the_envelope() {
        let first = r#"{"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","system_fingerprint":"fp","choices":[{"index":0,"delta":{"role":"assistant","content":"a"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
        let chunk: Value =
            serde_json::from_str(&final_chunk(Some(first), "r1", Some("x"), true, "stop")).unwrap();
        assert_eq!(
            chunk,
            json!({
                "id": "c1", "object": "chat.completion.chunk", "created": 7, "model": "m",
                "system_fingerprint": "fp",
                "choices": [{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop"}],
            })
        );
        let text = r#"{"id":"c2","object":"text_completion","choices":[{"index":0,"text":"a"}]}"#;
        let chunk: Value =
            serde_json::from_str(&final_chunk(Some(text), "r1", None, false, "stop")).unwrap();
        assert_eq!(chunk["id"], "c2");
        assert_eq!(
            chunk["choices"],
            json!([{"index": 0, "text": "", "logprobs": null, "finish_reason": "stop"}])
        );
        // Stopped before the first chunk, or after one that was none: the proxy's own.
        for first in [None, Some("not json"), Some(r#"{"odd":1}"#)] {
            let chunk: Value =
                serde_json::from_str(&final_chunk(first, "r1", Some("m"), true, "stop")).unwrap();
            assert_eq!(chunk["id"], "r1", "{first:?}");
            assert_eq!(chunk["object"], "chat.completion.chunk");
            assert_eq!(chunk["model"], "m");
            assert_eq!(chunk["choices"][0]["finish_reason"], "stop");
            assert_eq!(chunk["choices"][0]["delta"], json!({}));
        }
        let chunk: Value =
            serde_json::from_str(&final_chunk(None, "r2", None, false, "stop")).unwrap();
        assert_eq!(chunk["id"], "r2");
        assert_eq!(chunk["object"], "text_completion");
        assert_eq!(chunk["model"], "");
        assert_eq!(chunk["choices"][0]["text"], "");
    }
}
