//! A raw HTTP/1.1 client over a real TCP socket: it sees exactly the bytes and the chunking the
//! server sends, and can stop reading or vanish whenever a test says. Shared by the library's
//! tests and the command's (`cli/tests/common`, which includes this file by its path).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A hang detector, not a timing assertion.
pub const HANG: Duration = Duration::from_secs(20);

/// A response being read: its head, and its chunked body read one HTTP chunk at a time.
pub struct RawResponse {
    pub stream: TcpStream,
    pub head: String,
    buffer: Vec<u8>,
    /// Body bytes already de-chunked and not yet taken as frames.
    body: Vec<u8>,
    ended: bool,
}

impl RawResponse {
    /// Sends `request` (a full HTTP/1.1 request) to `addr` and reads the response head.
    pub async fn send(addr: SocketAddr, request: &str) -> RawResponse {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(request.as_bytes())
            .await
            .expect("write request");
        let mut response = RawResponse {
            stream,
            head: String::new(),
            buffer: Vec::new(),
            body: Vec::new(),
            ended: false,
        };
        let end = loop {
            if let Some(at) = find(&response.buffer, b"\r\n\r\n") {
                break at;
            }
            assert!(response.fill().await, "connection closed before the head");
        };
        response.head = String::from_utf8(response.buffer[..end].to_vec()).unwrap();
        response.buffer.drain(..end + 4);
        response
    }

    /// `GET path` with extra header lines (each ending in `\r\n`).
    pub async fn get(addr: SocketAddr, path: &str, headers: &str) -> RawResponse {
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}\r\n");
        RawResponse::send(addr, &request).await
    }

    /// `POST path` with a JSON body.
    pub async fn post_json(addr: SocketAddr, path: &str, body: &str) -> RawResponse {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        RawResponse::send(addr, &request).await
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

    /// Reads more bytes from the socket; false at EOF.
    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).await.unwrap_or(0);
        self.buffer.extend_from_slice(&chunk[..n]);
        n > 0
    }

    /// The next HTTP chunk of a chunked body, or `None` at its end (the zero-size chunk) or EOF.
    pub async fn next_chunk(&mut self) -> Option<Vec<u8>> {
        if self.ended {
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
                        self.ended = true;
                        return None;
                    }
                    return Some(data);
                }
            }
            if !self.fill().await {
                self.ended = true;
                return None;
            }
        }
    }

    /// The next SSE frame (up to and including its blank line), from however many chunks.
    /// A heartbeat (an empty comment line, `:\n`, which ends no event) is a frame of its own.
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

    /// Reads the whole non-chunked body (`Content-Length`).
    pub async fn body_text(&mut self) -> String {
        let length: usize = self
            .header("content-length")
            .expect("length")
            .parse()
            .unwrap();
        while self.buffer.len() < length {
            assert!(self.fill().await, "body cut short");
        }
        String::from_utf8(self.buffer[..length].to_vec()).unwrap()
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The server's `GET /stats` as JSON.
pub async fn stats(addr: SocketAddr) -> serde_json::Value {
    let mut response = RawResponse::get(addr, "/stats", "").await;
    serde_json::from_str(&response.body_text().await).expect("JSON stats")
}

/// Polls `/stats` until `done` holds; fails the test (naming `what`) if it never does.
pub async fn wait_for(
    addr: SocketAddr,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + HANG;
    loop {
        let stats = stats(addr).await;
        if done(&stats) {
            return stats;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {stats}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
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
