//! What the examples share: a small HTTP/1.1 client over a fresh TCP connection.

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

/// The flags that configure a gate, shared by the servers: `--buffer-events`, `--buffer-bytes`,
/// `--policy`, `--slow-deadline-ms`, `--heartbeat-ms`.
#[derive(Debug, Clone)]
pub struct GateFlags {
    pub buffer_events: usize,
    pub buffer_bytes: usize,
    pub policy: String,
    pub slow_deadline: std::time::Duration,
    pub heartbeat: std::time::Duration,
}

impl Default for GateFlags {
    fn default() -> Self {
        GateFlags {
            buffer_events: 64,
            buffer_bytes: 65536,
            policy: "backpressure".into(),
            slow_deadline: std::time::Duration::from_millis(10_000),
            heartbeat: std::time::Duration::from_millis(15_000),
        }
    }
}

impl GateFlags {
    /// Takes `flag value` if it is one of these flags: `None` when it is not.
    pub fn parse(&mut self, flag: &str, value: &str) -> Option<Result<(), String>> {
        let positive = || match value.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{flag}: `{value}` is not a positive number")),
        };
        let parsed = match flag {
            "--buffer-events" => positive().map(|n| self.buffer_events = n as usize),
            "--buffer-bytes" => positive().map(|n| self.buffer_bytes = n as usize),
            "--slow-deadline-ms" => {
                positive().map(|n| self.slow_deadline = std::time::Duration::from_millis(n))
            }
            "--heartbeat-ms" => {
                positive().map(|n| self.heartbeat = std::time::Duration::from_millis(n))
            }
            "--policy" => match value {
                "backpressure" | "coalesce" | "disconnect" => {
                    self.policy = value.to_owned();
                    Ok(())
                }
                _ => Err(format!(
                    "--policy: `{value}` is not backpressure, coalesce or disconnect"
                )),
            },
            _ => return None,
        };
        Some(parsed)
    }

    /// A gate with these bounds and policy (`disconnect` ends a stream after the slow deadline).
    pub fn gate(&self) -> streamgate::Gate {
        let policy = match self.policy.as_str() {
            "coalesce" => streamgate::Policy::coalesce(),
            "disconnect" => streamgate::Policy::disconnect(self.slow_deadline),
            _ => streamgate::Policy::backpressure(),
        };
        streamgate::Gate::new()
            .max_events(self.buffer_events)
            .max_bytes(self.buffer_bytes)
            .policy(policy)
            .stamp_events(true)
    }
}
