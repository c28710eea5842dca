//! A raw HTTP/1.1 client over a real TCP socket: it sees exactly the bytes, the chunking and the
//! connection's end that the server sends, and can stop reading or hang up whenever a test says.
//! Shared by the library's tests and the command's (`cli/tests/common` and the proxy's tests
//! include this file by its path).

#![allow(dead_code)] // each test binary uses a part

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A hang detector, not a timing assertion.
pub const HANG: Duration = Duration::from_secs(20);

/// How a body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyEnd {
    /// The last chunk (chunked) or the declared length (`Content-Length`).
    Complete,
    /// The connection closed (or failed) before the body's end.
    Cut,
}

/// A response being read: its head, then its body.
pub struct RawResponse {
    pub stream: TcpStream,
    pub head: String,
    buffer: Vec<u8>,
    /// Body bytes de-chunked and not yet taken as frames.
    body: Vec<u8>,
    ended: Option<BodyEnd>,
}

impl RawResponse {
    /// Sends `request` (a whole HTTP/1.1 request) to `addr` and reads the response head.
    pub async fn send(addr: SocketAddr, request: impl AsRef<[u8]>) -> RawResponse {
        let stream = TcpStream::connect(addr).await.expect("connect");
        RawResponse::send_on(stream, request.as_ref()).await
    }

    /// The same on a socket whose receive buffer is `bytes` (a reader the kernel cannot
    /// cover for).
    pub async fn send_small(addr: SocketAddr, request: &[u8], bytes: u32) -> RawResponse {
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(bytes).unwrap();
        let stream = socket.connect(addr).await.expect("connect");
        RawResponse::send_on(stream, request).await
    }

    async fn send_on(mut stream: TcpStream, request: &[u8]) -> RawResponse {
        stream.set_nodelay(true).unwrap();
        stream.write_all(request).await.expect("write the request");
        let mut response = RawResponse {
            stream,
            head: String::new(),
            buffer: Vec::new(),
            body: Vec::new(),
            ended: None,
        };
        let end = loop {
            if let Some(at) = find(&response.buffer, b"\r\n\r\n") {
                break at;
            }
            let filled = tokio::time::timeout(HANG, response.fill())
                .await
                .expect("a response head in time");
            assert!(filled, "connection closed before the head");
        };
        response.head = String::from_utf8(response.buffer[..end].to_vec()).unwrap();
        response.buffer.drain(..end + 4);
        response
    }

    /// `POST path` with a JSON `body` and extra header lines (each ending in `\r\n`).
    pub async fn post(addr: SocketAddr, path: &str, headers: &str, body: &str) -> RawResponse {
        RawResponse::send(addr, &post_request(addr, path, headers, body)).await
    }

    /// `POST path` with a JSON `body` and no extra header.
    pub async fn post_json(addr: SocketAddr, path: &str, body: &str) -> RawResponse {
        RawResponse::post(addr, path, "", body).await
    }

    /// `GET path` with extra header lines (each ending in `\r\n`).
    pub async fn get(addr: SocketAddr, path: &str, headers: &str) -> RawResponse {
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}\r\n");
        RawResponse::send(addr, request).await
    }

    /// The status code.
    pub fn status(&self) -> u16 {
        self.head.split(' ').nth(1).unwrap().parse().unwrap()
    }

    /// The value of header `name` (case-insensitive), if present.
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.eq_ignore_ascii_case(name)
                .then(|| value.trim().to_owned())
        })
    }

    /// Reads more bytes from the socket; false at EOF or on an error.
    async fn fill(&mut self) -> bool {
        let mut chunk = vec![0u8; 256 * 1024];
        let n = self.stream.read(&mut chunk).await.unwrap_or(0);
        self.buffer.extend_from_slice(&chunk[..n]);
        n > 0
    }

    /// The next HTTP chunk of a chunked body, or `None` at its end (the last chunk, or a
    /// connection closed before it: see [`ended`](RawResponse::ended)).
    pub async fn next_chunk(&mut self) -> Option<Vec<u8>> {
        if self.ended.is_some() {
            return None;
        }
        loop {
            if let Some(line_end) = find(&self.buffer, b"\r\n") {
                let size_text = std::str::from_utf8(&self.buffer[..line_end]).unwrap();
                let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
                    .expect("chunk size");
                if self.buffer.len() >= line_end + 2 + size + 2 {
                    let data = self.buffer[line_end + 2..line_end + 2 + size].to_vec();
                    self.buffer.drain(..line_end + 2 + size + 2);
                    if size == 0 {
                        self.ended = Some(BodyEnd::Complete);
                        return None;
                    }
                    return Some(data);
                }
            }
            if !self.fill().await {
                self.ended = Some(BodyEnd::Cut);
                return None;
            }
        }
    }

    /// How the body ended, once it has.
    pub fn ended(&self) -> Option<BodyEnd> {
        self.ended
    }

    /// The next SSE frame (up to and including its blank line) of a chunked body. A heartbeat
    /// (an empty comment line, `:\n`, which ends no event) is a frame of its own.
    pub async fn next_frame(&mut self) -> Option<String> {
        loop {
            if self.body.starts_with(b":\n") {
                self.body.drain(..2);
                return Some(":\n".into());
            }
            if let Some(at) = find(&self.body, b"\n\n") {
                let frame = self.body.drain(..at + 2).collect::<Vec<_>>();
                return Some(String::from_utf8(frame).unwrap());
            }
            let chunk = self.next_chunk().await?;
            self.body.extend_from_slice(&chunk);
        }
    }

    /// The next frame, failing the test if it does not come.
    pub async fn expect_frame(&mut self) -> String {
        tokio::time::timeout(HANG, self.next_frame())
            .await
            .expect("a frame in time")
            .expect("a frame before the end")
    }

    /// The next frame that is not a heartbeat.
    pub async fn expect_event(&mut self) -> String {
        loop {
            let frame = self.expect_frame().await;
            if !is_heartbeat(&frame) {
                return frame;
            }
        }
    }

    /// Every remaining frame until the body ends.
    pub async fn rest(&mut self) -> Vec<String> {
        let mut frames = Vec::new();
        while let Some(frame) = tokio::time::timeout(HANG, self.next_frame())
            .await
            .expect("the body ends in time")
        {
            frames.push(frame);
        }
        frames
    }

    /// The whole body of a chunked response, and how it ended.
    pub async fn chunked_body(&mut self) -> (Vec<u8>, BodyEnd) {
        let mut body = std::mem::take(&mut self.body);
        while let Some(chunk) = tokio::time::timeout(HANG, self.next_chunk())
            .await
            .expect("the body ends in time")
        {
            body.extend_from_slice(&chunk);
        }
        (body, self.ended.unwrap())
    }

    /// The body of a `Content-Length` response as far as it came, and how it ended.
    pub async fn sized_body(&mut self) -> (Vec<u8>, BodyEnd) {
        let length: usize = self
            .header("content-length")
            .expect("a content-length")
            .parse()
            .unwrap();
        while self.buffer.len() < length {
            let filled = tokio::time::timeout(HANG, self.fill())
                .await
                .expect("the body in time");
            if !filled {
                return (std::mem::take(&mut self.buffer), BodyEnd::Cut);
            }
        }
        (self.buffer.drain(..length).collect(), BodyEnd::Complete)
    }

    /// The body as text, whatever its framing.
    pub async fn text(&mut self) -> String {
        let (body, end) = if self.header("content-length").is_some() {
            self.sized_body().await
        } else {
            self.chunked_body().await
        };
        assert_eq!(end, BodyEnd::Complete, "the body was cut");
        String::from_utf8(body).unwrap()
    }

    /// Reads and discards up to `limit` body bytes (the head's framing bytes included);
    /// returns how many came before the connection ended or the limit was reached. Reads in
    /// large pieces and keeps nothing.
    pub async fn drain(&mut self, limit: u64) -> u64 {
        let mut total = self.buffer.len() as u64;
        self.buffer.clear();
        let mut chunk = vec![0u8; 1024 * 1024];
        while total < limit {
            let n = tokio::time::timeout(HANG, self.stream.read(&mut chunk))
                .await
                .expect("body bytes in time")
                .unwrap_or(0);
            if n == 0 {
                break;
            }
            total += n as u64;
        }
        total
    }
}

/// A whole `POST` request.
pub fn post_request(addr: SocketAddr, path: &str, headers: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A heartbeat frame (an SSE comment alone).
pub fn is_heartbeat(frame: &str) -> bool {
    frame
        .lines()
        .filter(|line| !line.is_empty())
        .all(|line| line.starts_with(':'))
}

/// The frame's `data:` value (one line), if any.
pub fn data(frame: &str) -> Option<&str> {
    frame.lines().find_map(|line| {
        line.strip_prefix("data: ")
            .or_else(|| line.strip_prefix("data:"))
    })
}

/// The frame's `id:`, if any.
pub fn id(frame: &str) -> Option<u64> {
    frame
        .lines()
        .find_map(|line| line.strip_prefix("id: "))
        .and_then(|id| id.parse().ok())
}

/// The content a chat chunk frame adds (`choices[0].delta.content`).
pub fn content(frame: &str) -> Option<String> {
    let json: serde_json::Value = serde_json::from_str(data(frame)?).ok()?;
    json["choices"][0]["delta"]["content"]
        .as_str()
        .map(str::to_owned)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A server's `GET /stats` as JSON.
pub async fn stats(addr: SocketAddr) -> serde_json::Value {
    let mut response = RawResponse::get(addr, "/stats", "").await;
    serde_json::from_str(&response.text().await).expect("JSON stats")
}

/// Polls `/stats` until `done` holds; fails the test (naming `what`) if it never does.
pub async fn wait_for(
    addr: SocketAddr,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    wait_for_within(addr, what, HANG, done).await
}

/// Polls `/stats` until `done` holds; fails the test (naming `what`) if it does not within
/// `limit`.
pub async fn wait_for_within(
    addr: SocketAddr,
    what: &str,
    limit: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let stats = stats(addr).await;
        if done(&stats) {
            return stats;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {stats}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls `addr`'s `/metrics` until it counts a stream ended at `hop` for `reason`
/// (`streamgate_streams_ended_total`, stalled or not); fails the test if it never does.
pub async fn wait_for_end_metric(addr: SocketAddr, hop: &str, reason: &str) {
    let deadline = tokio::time::Instant::now() + HANG;
    let (hop, reason) = (format!("hop=\"{hop}\""), format!("reason=\"{reason}\""));
    loop {
        let page = RawResponse::get(addr, "/metrics", "").await.text().await;
        let ended = page
            .lines()
            .filter(|line| line.starts_with("streamgate_streams_ended_total{"))
            .filter(|line| line.contains(&hop) && line.contains(&reason))
            .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>();
        if ended >= 1.0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{hop} {reason}: {page}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// This process's resident memory, in bytes (`VmRSS`).
pub fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kib * 1024
}

/// Asserts the headers every SSE response of this crate carries.
pub fn assert_sse_headers(response: &RawResponse) {
    assert_eq!(
        response.header("content-type").as_deref(),
        Some("text/event-stream")
    );
    assert_eq!(
        response.header("cache-control").as_deref(),
        Some("no-cache")
    );
    assert_eq!(response.header("x-accel-buffering").as_deref(), Some("no"));
    assert_eq!(response.header("content-length"), None);
}
