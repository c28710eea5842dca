//! A small HTTP/1.1 client, and the ways a simulated user reads a stream of any of the three
//! streaming APIs.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use futures_util::Stream;
use http_body_util::{BodyDataStream, BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Map, Value};
use streamgate::EndReason;
use streamgate::sse::SseEvent;

/// Any error of the client.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Sends `method path` with a JSON `body` (and `headers`) to `addr` on a new connection.
///
/// The connection lives as long as the response body: dropping the body closes the socket,
/// which is how a client disconnects.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: String,
) -> Result<Response<Incoming>, BoxError> {
    send(connect(addr).await?, addr, method, path, headers, body).await
}

/// A new connection to `addr`, with `TCP_NODELAY`.
async fn connect(addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Sends `method path` to `addr` on `stream` (see [`request`]).
async fn send(
    stream: tokio::net::TcpStream,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: String,
) -> Result<Response<Incoming>, BoxError> {
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut builder = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    Ok(sender
        .send_request(builder.body(Full::new(Bytes::from(body)))?)
        .await?)
}

/// A response body as a stream of byte chunks.
pub fn body_stream(
    response: Response<Incoming>,
) -> impl Stream<Item = Result<Bytes, hyper::Error>> {
    BodyDataStream::new(response.into_body())
}

/// An address given as `http://HOST:PORT`, `HOST:PORT` or `IP:PORT` (a host name is looked
/// up; the first address is taken).
pub fn address(value: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let host = value.strip_prefix("http://").unwrap_or(value);
    let host = host.trim_end_matches('/');
    if value.starts_with("https://") {
        return Err(format!(
            "`{value}`: https is not supported; give http://HOST:PORT"
        ));
    }
    host.to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| format!("`{value}` is not http://HOST:PORT"))
}

/// A whole response body as text.
pub async fn body_text(response: Response<Incoming>) -> Result<String, BoxError> {
    let bytes = response.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// How a client reads its stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reader {
    /// Reads every event as soon as it can.
    KeepsUp,
    /// Reads the first event, stops reading for this long, then reads the rest.
    Stops(Duration),
    /// Reads at about this many bytes per second.
    Rate(u64),
    /// Disconnects after this many events.
    DisconnectsAfter(u64),
    /// Disconnects after this many events, then resumes the stream where it left off
    /// (`GET /v1/chat/completions/{id}/stream` with `Last-Event-ID`) and reads the rest.
    Resumes(u64),
    /// Reads this many events, then neither reads nor closes for this long (a peer whose
    /// host went away: no FIN, no RST), then drops the connection.
    Vanishes(u64, Duration),
    /// Resets the connection (an RST: `SO_LINGER` 0, then close) after this many events.
    Resets(u64),
}

/// How one client's stream went.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Events read (data events, the end included).
    pub events: u64,
    /// The stream ended with its API's end (`data: [DONE]`, `message_stop`, ..).
    pub completed: bool,
    /// The client hung up on purpose (and did not come back): it disconnected, vanished or
    /// reset the connection.
    pub disconnected: bool,
    /// The client hung up and re-attached.
    pub resumed: bool,
    /// After a resume or a cut taken up, the first event's id was not the one after the last
    /// id read before it (an event lost or repeated across the resume).
    pub resume_mismatch: bool,
    /// The id of the first event of the last response read (`None`: it had no event with an
    /// id, such as a resume answered with an error frame).
    pub first_id_after_resume: Option<u64>,
    /// How many times the stream was cut before its end (a connection refused, reset or
    /// closed early, an upstream status 5xx on a resume) and taken up again at one of
    /// [`Chat::elsewhere`]'s addresses or its own.
    pub cuts_taken_up: u32,
    /// The answer's text: the text deltas of every event read, in order, across resumes.
    pub text: String,
    /// The reason the stream's terminal error frame gave (`slow_consumer`,
    /// `upstream_error`, ..: its `error.type`), when it ended with one.
    pub ended_by: Option<String>,
    /// What went wrong otherwise.
    pub error: Option<String>,
}

/// The streaming API a client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Api {
    /// OpenAI chat completions (`POST /v1/chat/completions`), ending with `data: [DONE]`.
    #[default]
    Chat,
    /// Anthropic Messages (`POST /v1/messages`), ending with `message_stop`.
    Messages,
    /// OpenAI Responses (`POST /v1/responses`), ending with `response.completed`.
    Responses,
}

impl Api {
    /// The path a stream is asked for at.
    pub fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Messages => "/v1/messages",
            Api::Responses => "/v1/responses",
        }
    }

    /// A streamed request body for `max_tokens` tokens of `model`, with the fields of
    /// `extra` (sampling, say) merged into it.
    pub fn body(self, model: &str, max_tokens: u64, extra: &Map<String, Value>) -> String {
        let ask = "Count from one to ten thousand.";
        let mut body = match self {
            Api::Chat | Api::Messages => serde_json::json!({
                "model": model,
                "messages": [{"role": "user", "content": ask}],
                "stream": true,
                "max_tokens": max_tokens,
            }),
            Api::Responses => serde_json::json!({
                "model": model,
                "input": ask,
                "stream": true,
                "max_output_tokens": max_tokens,
            }),
        };
        if let Value::Object(fields) = &mut body {
            fields.extend(extra.clone());
        }
        body.to_string()
    }

    /// The resume of the stream `id` after the event `after` (none: from its first): its
    /// path and headers.
    fn resume(self, id: &str, after: Option<u64>) -> (String, Vec<(&'static str, String)>) {
        let last_event = after
            .map(|after| ("last-event-id", after.to_string()))
            .into_iter()
            .collect();
        match self {
            Api::Chat => (format!("/v1/chat/completions/{id}/stream"), last_event),
            Api::Messages => (format!("/v1/messages/{id}/stream"), last_event),
            Api::Responses => match after {
                Some(after) => (
                    format!("/v1/responses/{id}?stream=true&starting_after={after}"),
                    Vec::new(),
                ),
                None => (format!("/v1/responses/{id}?stream=true"), Vec::new()),
            },
        }
    }

    /// Whether `event` ends a whole answer: by its `event:` type, or (a server that writes
    /// none) its data's `type`.
    fn ends(self, event: &SseEvent, data: Option<&Value>) -> bool {
        match self {
            Api::Chat => event.data_str() == Some("[DONE]"),
            Api::Messages => Self::typed(event, data) == Some("message_stop"),
            Api::Responses => matches!(
                Self::typed(event, data),
                Some("response.completed" | "response.incomplete")
            ),
        }
    }

    /// An event's type: its `event:` field, or (a server that writes none) its data's `type`.
    fn typed<'a>(event: &'a SseEvent, data: Option<&'a Value>) -> Option<&'a str> {
        event.event().or_else(|| data?.get("type")?.as_str())
    }

    /// The answer text `event` carries (its data parsed as `data`): a chat chunk's
    /// `delta.content`, a Messages `text_delta`, a Responses `output_text.delta`.
    fn text<'a>(self, event: &'a SseEvent, data: &'a Value) -> Option<&'a str> {
        match self {
            Api::Chat => data.pointer("/choices/0/delta/content")?.as_str(),
            Api::Messages => (Self::typed(event, Some(data)) == Some("content_block_delta"))
                .then(|| data.pointer("/delta/text")?.as_str())
                .flatten(),
            Api::Responses => (Self::typed(event, Some(data))
                == Some("response.output_text.delta"))
            .then(|| data.get("delta")?.as_str())
            .flatten(),
        }
    }

    /// What its answer ends with, for messages.
    fn end_name(self) -> &'static str {
        match self {
            Api::Chat => "data: [DONE]",
            Api::Messages => "message_stop",
            Api::Responses => "response.completed",
        }
    }
}

/// A streamed chat completion request body for `max_tokens` tokens of `model`.
pub fn chat_body(model: &str, max_tokens: u64) -> String {
    Api::Chat.body(model, max_tokens, &Map::new())
}

/// What a client asks for.
#[derive(Debug, Clone)]
pub struct Chat {
    /// The server (or proxy).
    pub addr: SocketAddr,
    /// Other addresses of the same service (another proxy instance, say): a stream whose
    /// connection is refused or cut before its end is asked for again (a refused request)
    /// or resumed (after the last event read) at these and `addr` in turn, up to
    /// [`TAKE_UP_TRIES`] times, [`TAKE_UP_PAUSE`] apart. None: a cut is an error.
    pub elsewhere: Vec<SocketAddr>,
    /// The API it speaks.
    pub api: Api,
    /// The `model` field (servers that serve one model ignore it).
    pub model: String,
    /// `max_tokens`.
    pub max_tokens: u64,
    /// Fields merged into each request's body (`temperature`, say).
    pub extra: Map<String, Value>,
}

/// How many times in a row a cut stream is taken up again ([`Chat::elsewhere`]).
pub const TAKE_UP_TRIES: u32 = 8;

/// How long a client waits before taking a cut stream up again.
pub const TAKE_UP_PAUSE: Duration = Duration::from_millis(500);

impl Chat {
    /// `max_tokens` tokens of a chat completion from the reference server (`sim`) at `addr`.
    pub fn sim(addr: SocketAddr, max_tokens: u64) -> Self {
        Chat {
            addr,
            elsewhere: Vec::new(),
            api: Api::Chat,
            model: "sim".into(),
            max_tokens,
            extra: Map::new(),
        }
    }

    /// The address of the `n`th try: `addr`, then each of `elsewhere` and `addr` in turn.
    fn at(&self, n: u32) -> SocketAddr {
        let all = 1 + self.elsewhere.len();
        match n as usize % all {
            0 => self.addr,
            i => self.elsewhere[i - 1],
        }
    }
}

/// How a response's reading ended.
enum Read {
    /// The stream is over for this client: its end, its terminal frame, an error, or the
    /// client leaving on purpose.
    Over,
    /// The client hung up to resume ([`Reader::Resumes`]).
    HungUp,
    /// The stream was cut before its end (the connection reset or closed early).
    Cut(String),
}

/// Streams one answer of `chat.api` as `reader` reads, recording each event at `recorder`
/// (the `client.recv` hop). The request carries `x-request-id: request_id`; a resume uses the
/// id the response's `x-request-id` names, by the API's resume path. A stream that ends
/// without the API's end (`data: [DONE]`, `message_stop`, `response.completed`; an error
/// event, a cut connection that could not be taken up again) is an error.
pub async fn stream_chat(
    chat: &Chat,
    request_id: &str,
    reader: Reader,
    recorder: &mut streamgate::probe::Recorder,
) -> Outcome {
    let mut outcome = Outcome::default();
    let mut stream_id = request_id.to_owned();
    let mut last_id = None;
    // Whether the server has the stream: it answered the request.
    let mut asked = false;
    // Tries that failed since the last response read, and every try's turn of address.
    let (mut failed, mut turn) = (0, 0);
    // What each try that did not end the stream came to, for the error.
    let mut trail = Vec::new();
    loop {
        let (method, path, headers, body) = if asked {
            let (path, headers) = chat.api.resume(&stream_id, last_id);
            ("GET", path, headers, String::new())
        } else {
            let headers = vec![("x-request-id", request_id.to_owned())];
            let body = chat.api.body(&chat.model, chat.max_tokens, &chat.extra);
            ("POST", chat.api.path().to_owned(), headers, body)
        };
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let addr = chat.at(turn);
        let response = async {
            let stream = connect(addr).await?;
            if matches!(reader, Reader::Resets(_)) {
                stream.set_zero_linger()?;
            }
            send(stream, addr, method, &path, &headers, body).await
        };
        let asked_for = match (asked, last_id) {
            (false, _) => format!("POST {addr}"),
            (true, None) => format!("GET {addr} (a resume from the start)"),
            (true, Some(id)) => format!("GET {addr} (a resume after event {id})"),
        };
        let what = match response.await {
            Ok(response) if response.status().is_success() => {
                // A resume, or a cut taken up: its events go on from `last_id`.
                let continuing = asked;
                asked = true;
                failed = 0;
                if let Some(id) = response.headers().get("x-request-id") {
                    stream_id = id.to_str().unwrap_or(request_id).to_owned();
                }
                let before = last_id;
                outcome.first_id_after_resume = None;
                // The body is dropped when `read` returns: the connection closes before a
                // resume.
                let read = read(
                    response,
                    (chat.api, reader),
                    recorder,
                    &mut outcome,
                    &mut last_id,
                );
                let read = read.await;
                let next = before.map_or(0, |id| id + 1);
                if continuing
                    && outcome
                        .first_id_after_resume
                        .is_some_and(|first| first != next)
                {
                    outcome.resume_mismatch = true;
                }
                match read {
                    Read::Over => break,
                    Read::HungUp if last_id.is_none() => {
                        outcome.error = Some("no event id to resume after".into());
                        break;
                    }
                    Read::HungUp => {
                        outcome.resumed = true;
                        continue;
                    }
                    Read::Cut(why) => {
                        // Taken up again when there is somewhere to take it up.
                        if !chat.elsewhere.is_empty() {
                            outcome.cuts_taken_up += 1;
                        }
                        format!("cut after {} events: {why}", outcome.events)
                    }
                }
            }
            // An earlier try's request reached the server, whose answer was lost: resume it.
            Ok(response) if response.status() == StatusCode::CONFLICT && turn > 0 && !asked => {
                asked = true;
                format!("status {}", response.status())
            }
            // A stream that never started (its server went before it did): asked for anew.
            Ok(response)
                if response.status() == StatusCode::NOT_FOUND && asked && outcome.events == 0 =>
            {
                asked = false;
                failed += 1;
                format!("status {}", response.status())
            }
            // A server that is going away, or not yet able to serve the stream.
            Ok(response) if response.status().is_server_error() => {
                failed += 1;
                format!("status {}", response.status())
            }
            Ok(response) => {
                trail.push(format!("{asked_for}: status {}", response.status()));
                break;
            }
            // A refused or failed connection, a request with no response.
            Err(error) => {
                failed += 1;
                error.to_string()
            }
        };
        trail.push(format!("{asked_for}: {what}"));
        if chat.elsewhere.is_empty() || failed > TAKE_UP_TRIES {
            break;
        }
        turn += 1;
        tokio::time::sleep(TAKE_UP_PAUSE).await;
    }
    if !outcome.completed && !outcome.disconnected && outcome.error.is_none() {
        outcome.error = Some(if trail.is_empty() {
            format!("the stream ended without {}", chat.api.end_name())
        } else {
            trail.join("; then ")
        });
    }
    // The user leaving is the consumer going; anything else cut the stream upstream of the
    // client.
    recorder.end(if outcome.completed {
        EndReason::Completed
    } else if outcome.disconnected {
        EndReason::ConsumerGone
    } else {
        EndReason::UpstreamError
    });
    outcome
}

/// Reads one response's events of `api` as `reader` reads, until the answer's end, the
/// stream's end, an error, or the reader hanging up.
async fn read(
    response: Response<Incoming>,
    (api, reader): (Api, Reader),
    recorder: &mut streamgate::probe::Recorder,
    outcome: &mut Outcome,
    last_id: &mut Option<u64>,
) -> Read {
    use futures_util::StreamExt;
    use streamgate::GateExt;

    let mut events = std::pin::pin!(body_stream(response).sse_events());
    let mut first = true;
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(error) => return Read::Cut(error.to_string()),
        };
        let Some(text) = event.data_str() else {
            continue;
        };
        let data = serde_json::from_str::<Value>(text).ok();
        if event.event_type() == "error" {
            // Why: `error.type` (chat completions, Messages), or a Responses error's `code`.
            outcome.ended_by = data
                .as_ref()
                .and_then(|data| {
                    data.pointer("/error/type")
                        .or_else(|| data.get("code"))?
                        .as_str()
                })
                .map(str::to_owned);
            outcome.error = Some(format!("error event: {text}"));
            return Read::Over;
        }
        // The event's id and kind as the server wrote them (the decoder reads a `:control`
        // or `:hidden` mark, and takes an unmarked `[DONE]` as control).
        let seq = event.id().and_then(|id| id.parse().ok());
        if first {
            outcome.first_id_after_resume = seq;
        }
        first = false;
        *last_id = seq.or(*last_id);
        let kind = streamgate::Chunk::kind(&event);
        recorder.observe(streamgate::probe::Observation::new(
            seq,
            text.len() as u64,
            kind,
        ));
        outcome.events += 1;
        if let Some(delta) = data.as_ref().and_then(|data| api.text(&event, data)) {
            outcome.text.push_str(delta);
        }
        if api.ends(&event, data.as_ref()) {
            outcome.completed = true;
            return Read::Over;
        }
        match reader {
            Reader::KeepsUp => {}
            Reader::Stops(pause) if outcome.events == 1 => tokio::time::sleep(pause).await,
            Reader::Stops(_) => {}
            Reader::Rate(bytes_per_second) => {
                let seconds = text.len() as f64 / bytes_per_second.max(1) as f64;
                tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
            }
            Reader::DisconnectsAfter(n) | Reader::Resets(n) if outcome.events >= n => {
                outcome.disconnected = true;
                return Read::Over;
            }
            Reader::Vanishes(n, hold) if outcome.events >= n => {
                outcome.disconnected = true;
                tokio::time::sleep(hold).await;
                return Read::Over;
            }
            Reader::Resumes(n) if !outcome.resumed && outcome.events >= n => return Read::HungUp,
            Reader::DisconnectsAfter(_)
            | Reader::Resets(_)
            | Reader::Vanishes(..)
            | Reader::Resumes(_) => {}
        }
    }
    Read::Cut(format!("the stream ended without {}", api.end_name()))
}
