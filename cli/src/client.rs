//! A small HTTP/1.1 client, and the ways a simulated user reads a chat completion stream.

use std::net::SocketAddr;

use bytes::Bytes;
use futures_util::Stream;
use http_body_util::{BodyDataStream, BodyExt, Full};
use hyper::Response;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;

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
}

/// How one client's stream went.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Events read (data events, `[DONE]` included).
    pub events: u64,
    /// The stream ended with `data: [DONE]`.
    pub completed: bool,
    /// The client hung up on purpose.
    pub disconnected: bool,
    /// What went wrong otherwise.
    pub error: Option<String>,
}

/// A chat completion request body for `max_tokens` tokens, streamed.
pub fn chat_body(max_tokens: u64) -> String {
    format!(
        r#"{{"model":"sim","messages":[{{"role":"user","content":"hi"}}],"stream":true,"max_tokens":{max_tokens}}}"#
    )
}

/// Streams one chat completion from `addr` as `reader` reads, recording each event at
/// `recorder` (the `client.recv` hop).
pub async fn stream_chat(
    addr: SocketAddr,
    request_id: &str,
    max_tokens: u64,
    reader: Reader,
    recorder: &mut streamgate::probe::Recorder,
) -> Outcome {
    use futures_util::StreamExt;
    use streamgate::GateExt;

    let mut outcome = Outcome::default();
    let headers = [("x-request-id", request_id)];
    let path = "/v1/chat/completions";
    let response = match request(addr, "POST", path, &headers, chat_body(max_tokens)).await {
        Ok(response) if response.status().is_success() => response,
        Ok(response) => {
            outcome.error = Some(format!("status {}", response.status()));
            return outcome;
        }
        Err(error) => {
            outcome.error = Some(error.to_string());
            return outcome;
        }
    };
    let mut events = std::pin::pin!(body_stream(response).sse_events());
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(error) => {
                outcome.error = Some(error.to_string());
                break;
            }
        };
        let Some(data) = event.data_str() else {
            continue;
        };
        // The event's id and kind as the server wrote them (the decoder reads a `: control`
        // or `: hidden` mark, and takes an unmarked `[DONE]` as control).
        let done = data == "[DONE]";
        let seq = event.id().and_then(|id| id.parse().ok());
        let kind = streamgate::Chunk::kind(&event);
        recorder.observe(streamgate::probe::Observation::new(
            seq,
            data.len() as u64,
            kind,
        ));
        outcome.events += 1;
        if done {
            outcome.completed = true;
            break;
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
                break;
            }
            Reader::DisconnectsAfter(_) => {}
        }
    }
    // The crate's end reasons (`streamgate::probe::END_REASONS`): the user leaving is the
    // consumer going; anything else cut the stream upstream of the client.
    recorder.end(if outcome.completed {
        "completed"
    } else if outcome.disconnected {
        "consumer_gone"
    } else {
        "upstream_error"
    });
    outcome
}
