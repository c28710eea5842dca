//! What the examples share: a small HTTP/1.1 client, the gate flags, client reader
//! behaviours, the SVG plot, and (feature `axum`) the servers' plumbing.

#[cfg(feature = "axum")]
pub mod server;

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

    /// A gate with these bounds and policy: the slow deadline ends a stream whose consumer
    /// took nothing from a full buffer for that long (`disconnect`), or whose generator was
    /// paused that long (`backpressure`, `coalesce`).
    pub fn gate(&self) -> streamgate::Gate {
        let pause = Some(self.slow_deadline);
        let policy = match self.policy.as_str() {
            "coalesce" => streamgate::Policy::Coalesce { max_pause: pause },
            "disconnect" => streamgate::Policy::disconnect(self.slow_deadline),
            _ => streamgate::Policy::Backpressure { max_pause: pause },
        };
        streamgate::Gate::new()
            .max_events(self.buffer_events)
            .max_bytes(self.buffer_bytes)
            .policy(policy)
            .stamp_events(true)
    }
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

/// Draws, per hop, the longest gap (points) and the mean gap (line), in ms, at each output
/// position, as an SVG: bounded by the timeline's position limit, however many requests.
#[cfg(feature = "timeline")]
pub fn plot(
    diagnosis: &streamgate::timeline::Diagnosis,
    file: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;

    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let positions = diagnosis
        .hops
        .iter()
        .map(|h| h.by_position.len() as u64)
        .max()
        .unwrap_or(0)
        .max(1);
    // Gaps run from microseconds to minutes: a log scale shows a 5 ms cadence and a 30 s
    // freeze on one chart.
    let gaps = || {
        diagnosis
            .hops
            .iter()
            .flat_map(|h| h.by_position.iter())
            .filter(|p| p.count > 0)
    };
    let max_ms = gaps().map(|p| ms(p.max)).fold(1.0, f64::max) * 1.5;
    let min_ms = gaps()
        .map(|p| ms(p.mean).min(ms(p.max)))
        .filter(|ms| *ms > 0.0)
        .fold(max_ms, f64::min)
        .min(1.0)
        / 1.5;
    let root = SVGBackend::new(file, (1000, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "gap by output position, per hop (points: longest, line: mean)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0u64..positions, (min_ms..max_ms).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("output position (visible event)")
        .y_desc("gap (ms, log scale)")
        .draw()?;
    for (index, hop) in diagnosis.hops.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        let gaps = || {
            hop.by_position
                .iter()
                .enumerate()
                .filter(|(_, gap)| gap.count > 0)
                .map(|(position, gap)| (position as u64, gap))
        };
        let floor = |ms: f64| ms.max(min_ms);
        chart
            .draw_series(
                gaps()
                    .map(|(position, gap)| Circle::new((position, ms(gap.max)), 2, color.filled())),
            )?
            .label(hop.hop.as_str())
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
        chart.draw_series(LineSeries::new(
            gaps().map(|(position, gap)| (position, floor(ms(gap.mean)))),
            color.stroke_width(1),
        ))?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    root.present()?;
    Ok(())
}
