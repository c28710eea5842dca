//! A small HTTP/1.1 client, and the ways a simulated user reads a stream of any of the three
//! streaming APIs.

use std::net::SocketAddr;

use bytes::Bytes;
use futures_util::Stream;
use http_body_util::{BodyDataStream, BodyExt, Full};
use hyper::Response;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use streamgate::EndReason;

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
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
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
    Stops(std::time::Duration),
    /// Reads at about this many bytes per second.
    Rate(u64),
    /// Disconnects after this many events.
    DisconnectsAfter(u64),
    /// Disconnects after this many events, then resumes the stream where it left off
    /// (`GET /v1/chat/completions/{id}/stream` with `Last-Event-ID`) and reads the rest.
    Resumes(u64),
}

/// How one client's stream went.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Events read (data events, the end included).
    pub events: u64,
    /// The stream ended with its API's end (`data: [DONE]`, `message_stop`, ..).
    pub completed: bool,
    /// The client hung up on purpose (and did not come back).
    pub disconnected: bool,
    /// The client hung up and re-attached.
    pub resumed: bool,
    /// After the resume, the first event's id was not the one after the last id read before
    /// it (an event lost or repeated across the resume).
    pub resume_mismatch: bool,
    /// The id of the first event read after the resume.
    pub first_id_after_resume: Option<u64>,
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

    /// A streamed request body for `max_tokens` tokens of `model`.
    pub fn body(self, model: &str, max_tokens: u64) -> String {
        let ask = "Count from one to ten thousand.";
        let body = match self {
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
        body.to_string()
    }

    /// The resume of the stream `id` after the event `after`: its path and headers.
    fn resume(self, id: &str, after: u64) -> (String, Vec<(&'static str, String)>) {
        let last_event = vec![("last-event-id", after.to_string())];
        match self {
            Api::Chat => (format!("/v1/chat/completions/{id}/stream"), last_event),
            Api::Messages => (format!("/v1/messages/{id}/stream"), last_event),
            Api::Responses => (
                format!("/v1/responses/{id}?stream=true&starting_after={after}"),
                Vec::new(),
            ),
        }
    }

    /// Whether `event` ends a whole answer: by its `event:` type, or (a server that writes
    /// none) its data's `type`.
    fn ends(self, event: &streamgate::sse::SseEvent) -> bool {
        let data = event.data_str().unwrap_or("");
        if self == Api::Chat {
            return data == "[DONE]";
        }
        let typed = match event.event() {
            Some(kind) => kind.to_owned(),
            None => serde_json::from_str::<serde_json::Value>(data)
                .ok()
                .and_then(|data| Some(data.get("type")?.as_str()?.to_owned()))
                .unwrap_or_default(),
        };
        match self {
            Api::Chat => false,
            Api::Messages => typed == "message_stop",
            Api::Responses => {
                matches!(typed.as_str(), "response.completed" | "response.incomplete")
            }
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
    Api::Chat.body(model, max_tokens)
}

/// What a client asks for.
#[derive(Debug, Clone)]
pub struct Chat {
    /// The server (or proxy).
    pub addr: SocketAddr,
    /// The API it speaks.
    pub api: Api,
    /// The `model` field (servers that serve one model ignore it).
    pub model: String,
    /// `max_tokens`.
    pub max_tokens: u64,
}

impl Chat {
    /// `max_tokens` tokens of a chat completion from the reference server (`sim`) at `addr`.
    pub fn sim(addr: SocketAddr, max_tokens: u64) -> Self {
        Chat {
            addr,
            api: Api::Chat,
            model: "sim".into(),
            max_tokens,
        }
    }
}

/// Streams one answer of `chat.api` as `reader` reads, recording each event at `recorder`
/// (the `client.recv` hop). The request carries `x-request-id: request_id`; a resume uses the
/// id the response's `x-request-id` names, by the API's resume path. A stream that ends
/// without the API's end (`data: [DONE]`, `message_stop`, `response.completed`; an error
/// event, a cut connection) is an error.
pub async fn stream_chat(
    chat: &Chat,
    request_id: &str,
    reader: Reader,
    recorder: &mut streamgate::probe::Recorder,
) -> Outcome {
    let mut outcome = Outcome::default();
    let headers = [("x-request-id", request_id)];
    let body = chat.api.body(&chat.model, chat.max_tokens);
    let mut next = request(chat.addr, "POST", chat.api.path(), &headers, body).await;
    let mut last_id = None;
    loop {
        let response = match next {
            Ok(response) if response.status().is_success() => response,
            Ok(response) => {
                outcome.error = Some(format!("status {}", response.status()));
                break;
            }
            Err(error) => {
                outcome.error = Some(error.to_string());
                break;
            }
        };
        let stream_id = response
            .headers()
            .get("x-request-id")
            .and_then(|id| id.to_str().ok())
            .unwrap_or(request_id)
            .to_owned();
        let resuming = outcome.resumed;
        let before = last_id;
        // The body is dropped when `read` returns: the connection closes before a resume.
        let hang_up = read(
            response,
            (chat.api, reader),
            recorder,
            &mut outcome,
            &mut last_id,
        )
        .await;
        if resuming && before.map(|id| id + 1) != outcome.first_id_after_resume {
            outcome.resume_mismatch = true;
        }
        if !hang_up || outcome.resumed {
            break;
        }
        // Come back for the events after the last one read.
        outcome.resumed = true;
        let Some(after) = last_id else {
            outcome.error = Some("no event id to resume after".into());
            break;
        };
        let (path, headers) = chat.api.resume(&stream_id, after);
        let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        next = request(chat.addr, "GET", &path, &headers, String::new()).await;
    }
    if !outcome.completed && !outcome.disconnected && outcome.error.is_none() {
        let end = chat.api.end_name();
        outcome.error = Some(format!("the stream ended without {end}"));
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
/// stream's end, an error, or the reader hanging up: whether it hung up to resume.
async fn read(
    response: Response<Incoming>,
    (api, reader): (Api, Reader),
    recorder: &mut streamgate::probe::Recorder,
    outcome: &mut Outcome,
    last_id: &mut Option<u64>,
) -> bool {
    use futures_util::StreamExt;
    use streamgate::GateExt;

    let mut events = std::pin::pin!(body_stream(response).sse_events());
    let mut first = true;
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                outcome.error = Some(error.to_string());
                return false;
            }
        };
        let Some(data) = event.data_str() else {
            continue;
        };
        if event.event_type() == "error" {
            outcome.error = Some(format!("error event: {data}"));
            return false;
        }
        // The event's id and kind as the server wrote them (the decoder reads a `:control`
        // or `:hidden` mark, and takes an unmarked `[DONE]` as control).
        let seq = event.id().and_then(|id| id.parse().ok());
        if first && outcome.resumed {
            outcome.first_id_after_resume = seq;
        }
        first = false;
        *last_id = seq.or(*last_id);
        let kind = streamgate::Chunk::kind(&event);
        recorder.observe(streamgate::probe::Observation::new(
            seq,
            data.len() as u64,
            kind,
        ));
        outcome.events += 1;
        if api.ends(&event) {
            outcome.completed = true;
            return false;
        }
        match reader {
            Reader::KeepsUp => {}
            Reader::Stops(pause) if outcome.events == 1 => tokio::time::sleep(pause).await,
            Reader::Stops(_) => {}
            Reader::Rate(bytes_per_second) => {
                let seconds = data.len() as f64 / bytes_per_second.max(1) as f64;
                tokio::time::sleep(std::time::Duration::from_secs_f64(seconds)).await;
            }
            Reader::DisconnectsAfter(n) if outcome.events >= n => {
                outcome.disconnected = true;
                return false;
            }
            Reader::Resumes(n) if !outcome.resumed && outcome.events >= n => return true,
            Reader::DisconnectsAfter(_) | Reader::Resumes(_) => {}
        }
    }
    false
}
