//! A hostile upstream on a raw tokio `TcpListener`: it answers every request with one
//! misbehaviour (a 50 MB line, invalid UTF-8, endless comments, a close mid-stream, events
//! numbered from anywhere, a short
//! `Content-Length`, error statuses, odd content types, no headers at all, slow headers, a
//! 20 KB head, a 1 GiB or endless body) and keeps what it was sent, so a test can check what
//! reached it.

#![allow(dead_code)] // each test uses a part

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How the upstream answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// A well-behaved stream: `chunks` chat chunks with content `c{i} `, then `[DONE]`
    /// (chunked), under this content type.
    Stream {
        chunks: u64,
        content_type: &'static str,
    },
    /// One event, then `data: ` and 50 MB with no line end.
    LongLine,
    /// A chunk whose content holds invalid UTF-8, then `[DONE]`.
    InvalidUtf8,
    /// One event, then a comment every 20 ms for ever.
    EndlessComments,
    /// Three events on a close-delimited body, then the connection closes: no `[DONE]`.
    AbruptClose,
    /// Three events numbered from `from` (`id:`) on a close-delimited body, then `[DONE]` if
    /// `done`, and the connection closes: whatever a resume asked for, as a store that lost
    /// track of its readers would answer it.
    Numbered { from: u64, done: bool },
    /// Three events on a body that declares 10,000 bytes, then the connection closes.
    ShortSse,
    /// `text/plain` declaring 1,000 bytes, 500 sent, then the connection closes.
    ShortPlain,
    /// 500 typed `text/event-stream`, with an error event as its body.
    Error500Sse,
    /// 500 with a JSON error body.
    Error500Json,
    /// [`Case::Error500Json`] after this many ms (a server that queued the request, then
    /// failed it).
    SlowError500(u64),
    /// 200 `application/json` (a fixed completion), whatever was asked.
    Json,
    /// Reads the request and never answers.
    NoHeaders,
    /// Answers as `Stream` (3 chunks) after this many ms.
    SlowHeaders(u64),
    /// `text/plain` of exactly this many bytes, declared in `Content-Length`.
    Plain(u64),
    /// `text/plain`, close-delimited, for ever.
    Endless,
    /// A response head of 20 KB (one long header), then [`Case::Json`]'s body.
    HugeHead,
}

/// The fixed body of [`Case::Json`].
pub const JSON_BODY: &str = r#"{"object":"list","data":[{"id":"m","object":"model","created":1,"owned_by":"x"}],"odd":"  spaced  "}"#;
/// The body of [`Case::Error500Sse`].
pub const ERROR_SSE_BODY: &str =
    "data: {\"error\":{\"message\":\"engine died\",\"type\":\"server_error\"}}\n\n";
/// The body of [`Case::Error500Json`].
pub const ERROR_JSON_BODY: &str =
    r#"{"error":{"message":"overloaded","type":"server_error","code":503}}"#;

/// A request as received: its head (request line and headers) and its body.
pub type Received = (String, Vec<u8>);

/// A running hostile upstream.
pub struct Hostile {
    pub addr: SocketAddr,
    /// Every request received: its head (request line and headers) and body.
    requests: Arc<Mutex<Vec<Received>>>,
    /// Connections whose answer could not be written to the end (the proxy closed them).
    closed: Arc<AtomicU64>,
}

impl Hostile {
    /// Starts answering every request as `case`.
    pub async fn start(case: Case) -> Hostile {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hostile = Hostile {
            addr: listener.local_addr().unwrap(),
            requests: Arc::default(),
            closed: Arc::default(),
        };
        let (requests, closed) = (hostile.requests.clone(), hostile.closed.clone());
        tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let (requests, closed) = (requests.clone(), closed.clone());
                tokio::spawn(async move {
                    if serve(socket, case, &requests).await.is_err() {
                        closed.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        hostile
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The requests received so far: head and body.
    pub fn requests(&self) -> Vec<Received> {
        self.requests.lock().unwrap().clone()
    }

    /// The value of header `name` in request `n` (case-insensitive).
    pub fn header(&self, n: usize, name: &str) -> Option<String> {
        let requests = self.requests();
        let (head, _) = requests.get(n)?;
        head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_owned())
        })
    }

    /// How many answers could not be written to the end (the reader closed the connection).
    pub fn closed(&self) -> u64 {
        self.closed.load(Ordering::SeqCst)
    }
}

/// One chat completion chunk carrying `content` (raw JSON text, escapes allowed).
pub fn chunk(content: &str) -> String {
    format!(
        r#"{{"id":"h1","object":"chat.completion.chunk","created":1,"model":"hostile","choices":[{{"index":0,"delta":{{"content":"{content}"}},"finish_reason":null}}]}}"#
    )
}

/// `data: <chunk>\n\n`.
fn event(content: &str) -> String {
    format!("data: {}\n\n", chunk(content))
}

/// One HTTP chunk of `data`.
fn http_chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

async fn serve(
    mut socket: TcpStream,
    case: Case,
    requests: &Mutex<Vec<Received>>,
) -> std::io::Result<()> {
    socket.set_nodelay(true)?;
    // Keep-alive: answer requests until the peer closes.
    let mut buffer = Vec::new();
    loop {
        let Some((head, body)) = read_request(&mut socket, &mut buffer).await? else {
            return Ok(());
        };
        requests.lock().unwrap().push((head, body));
        answer(&mut socket, case).await?;
        if !matches!(
            case,
            Case::Json
                | Case::Error500Json
                | Case::SlowError500(_)
                | Case::Error500Sse
                | Case::Plain(_)
        ) {
            return Ok(());
        }
    }
}

async fn read_request(
    socket: &mut TcpStream,
    buffer: &mut Vec<u8>,
) -> std::io::Result<Option<Received>> {
    let mut chunk = [0u8; 16 * 1024];
    let end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..end]).into_owned();
    buffer.drain(..end + 4);
    let length = head
        .lines()
        .find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim()
                .eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    while buffer.len() < length {
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = buffer.drain(..length).collect();
    Ok(Some((head, body)))
}

const SSE_CLOSE: &str =
    "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n";

async fn answer(socket: &mut TcpStream, case: Case) -> std::io::Result<()> {
    match case {
        Case::Stream {
            chunks,
            content_type,
        } => stream(socket, chunks, content_type).await,
        Case::SlowHeaders(ms) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            stream(socket, 3, "text/event-stream").await
        }
        Case::HugeHead => {
            let padding = "x".repeat(20_000);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Padding: {padding}\r\nContent-Length: {}\r\n\r\n",
                JSON_BODY.len()
            );
            socket.write_all(head.as_bytes()).await?;
            socket.write_all(JSON_BODY.as_bytes()).await
        }
        Case::LongLine => {
            socket.write_all(SSE_CLOSE.as_bytes()).await?;
            socket.write_all(event("c0 ").as_bytes()).await?;
            socket.write_all(b"data: ").await?;
            let piece = vec![b'a'; 64 * 1024];
            let mut sent = 0;
            while sent < 50_000_000 {
                socket.write_all(&piece).await?;
                sent += piece.len();
            }
            // Hold the line open: only the decoder's limit may end this.
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok(())
        }
        Case::InvalidUtf8 => {
            socket.write_all(SSE_CLOSE.as_bytes()).await?;
            let mut bad = event("c0 ").into_bytes();
            // Invalid UTF-8 inside the content string: `bad` then 0xFF 0xFE.
            let json = chunk("badXX");
            let (before, after) = json.split_once("XX").unwrap();
            bad.extend_from_slice(b"data: ");
            bad.extend_from_slice(before.as_bytes());
            bad.extend_from_slice(&[0xFF, 0xFE]);
            bad.extend_from_slice(after.as_bytes());
            bad.extend_from_slice(b"\n\ndata: [DONE]\n\n");
            socket.write_all(&bad).await?;
            socket.shutdown().await
        }
        Case::EndlessComments => {
            socket.write_all(SSE_CLOSE.as_bytes()).await?;
            socket.write_all(event("c0 ").as_bytes()).await?;
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                socket.write_all(b": still here\n\n").await?;
            }
        }
        Case::AbruptClose => {
            socket.write_all(SSE_CLOSE.as_bytes()).await?;
            for i in 0..3 {
                socket
                    .write_all(event(&format!("c{i} ")).as_bytes())
                    .await?;
            }
            socket.shutdown().await
        }
        Case::Numbered { from, done } => {
            socket.write_all(SSE_CLOSE.as_bytes()).await?;
            for i in 0..3 {
                let event = format!("id: {}\n{}", from + i, event(&format!("c{i} ")));
                socket.write_all(event.as_bytes()).await?;
            }
            if done {
                socket.write_all(b"data: [DONE]\n\n").await?;
            }
            socket.shutdown().await
        }
        Case::ShortSse => {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 10000\r\n\r\n";
            socket.write_all(head.as_bytes()).await?;
            for i in 0..3 {
                socket
                    .write_all(event(&format!("c{i} ")).as_bytes())
                    .await?;
            }
            socket.shutdown().await
        }
        Case::ShortPlain => {
            let head =
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\n";
            socket.write_all(head.as_bytes()).await?;
            socket.write_all(&[b'p'; 500]).await?;
            socket.shutdown().await
        }
        Case::Error500Sse => {
            let head = format!(
                "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\n\r\n",
                ERROR_SSE_BODY.len()
            );
            socket.write_all(head.as_bytes()).await?;
            socket.write_all(ERROR_SSE_BODY.as_bytes()).await
        }
        Case::SlowError500(ms) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Box::pin(answer(socket, Case::Error500Json)).await
        }
        Case::Error500Json => {
            let head = format!(
                "HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                ERROR_JSON_BODY.len()
            );
            socket.write_all(head.as_bytes()).await?;
            socket.write_all(ERROR_JSON_BODY.as_bytes()).await
        }
        Case::Json => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Upstream-Thing: kept\r\nContent-Length: {}\r\n\r\n",
                JSON_BODY.len()
            );
            socket.write_all(head.as_bytes()).await?;
            socket.write_all(JSON_BODY.as_bytes()).await
        }
        Case::NoHeaders => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(())
        }
        Case::Plain(bytes) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {bytes}\r\n\r\n"
            );
            socket.write_all(head.as_bytes()).await?;
            let piece = vec![b'x'; 1024 * 1024];
            let mut left = bytes;
            while left > 0 {
                let n = left.min(piece.len() as u64) as usize;
                socket.write_all(&piece[..n]).await?;
                left -= n as u64;
            }
            Ok(())
        }
        Case::Endless => {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n";
            socket.write_all(head.as_bytes()).await?;
            let piece = vec![b'e'; 64 * 1024];
            loop {
                socket.write_all(&piece).await?;
            }
        }
    }
}

/// A chunked SSE answer: `chunks` chunks, then `[DONE]`, one HTTP chunk per event.
async fn stream(socket: &mut TcpStream, chunks: u64, content_type: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    socket.write_all(head.as_bytes()).await?;
    for i in 0..chunks {
        socket
            .write_all(&http_chunk(event(&format!("c{i} ")).as_bytes()))
            .await?;
    }
    socket.write_all(&http_chunk(b"data: [DONE]\n\n")).await?;
    socket.write_all(b"0\r\n\r\n").await?;
    socket.shutdown().await
}
