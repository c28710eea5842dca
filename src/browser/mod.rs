//! The user's screen as a hop: a script for the page that records when each event was
//! received and painted, and the intake that takes its records for the streams a server gave.
//!
//! A stall can begin after every server hop stayed regular: the page received each event on
//! time, but its main thread was busy (parsing, rendering, a slow handler) and the user saw
//! nothing. [`SCRIPT`], an ES module with no dependencies that a server serves at
//! [`SCRIPT_PATH`], records two hops per event id in the page:
//!
//! - [`CLIENT_RECV`]: the event was parsed from the network;
//! - [`CLIENT_RENDER`]: the app's handler for it returned and the next frame was painted, with
//!   the long animation frames (or long tasks) that overlapped the gap before it as the
//!   record's `busy_ns`.
//!
//! It never records payload text. It wraps the two ways pages read streams: `probedFetch`, a
//! drop-in `fetch` (the OpenAI JS SDK takes one as its `fetch` option), and `probeEventSource`.
//! Records go in batches to [`RECORDS_PATH`], where a [`BrowserProbe`] takes them into the
//! server's [`RecordSink`] beside its own hops' records, in the same JSON lines, so the
//! `timeline` analysis (and `streamgate diagnose`) can name `client.render` as the hop a
//! stall began at.
//!
//! # What a page may write
//!
//! A server gives each stream it probes a token in the response header [`TOKEN_HEADER`]
//! ([`BrowserProbe::tag`]), beside the stream's `x-request-id`: a keyed hash of the request id
//! and the time, good for [`TOKEN_LIFETIME`] on the process that gave it (keys are the
//! process's own: a batch posted to another instance, or after a restart, is refused as
//! [`Refusal::BadToken`]). Tag only a stream whose id is its own: one the server made, or
//! claimed so that no other stream runs under it; a client that may choose any id could
//! otherwise get a token for another's. Whoever holds a stream's token may write its page's
//! records within the shared rate (it is the page's own telemetry, not a secret of the
//! stream's, which whoever knows the id may read by resuming it). A batch is taken only
//! with its request's token, only for the page's two hops, at most [`MAX_POST_BYTES`] and
//! [`MAX_POST_RECORDS`] records, within a rate shared by every page
//! ([`DEFAULT_RECORD_RATE`] records a second, with a burst of two seconds' worth): nobody can
//! write records for another user's request, or other hops' records, or flood the sink. A
//! refused batch is counted by its [`Refusal`] and answered with its status; a batch is taken
//! whole or not at all (a sink whose queue is full refuses it whole, as
//! [`Refusal::SinkFull`]). Only requests in the sample of the server's other hops get a token,
//! so the page records the same requests as they do.
//!
//! # Examples
//!
//! An axum app that streams, tags its responses and takes the page's records:
//!
//! ```
//! use axum::Router;
//! use axum::http::HeaderMap;
//! use axum::routing::post;
//! use streamgate::browser::{BrowserProbe, SCRIPT_PATH};
//! use streamgate::probe::RecordSink;
//!
//! # fn main() -> std::io::Result<()> {
//! let sink = RecordSink::to_writer(std::io::sink(), 1024)?;
//! let probe = BrowserProbe::new(sink, 1.0);
//! let tagger = probe.clone();
//! let app: Router = Router::new()
//!     .route(
//!         "/v1/chat/completions",
//!         post(move || {
//!             let probe = tagger.clone();
//!             async move {
//!                 let mut headers = HeaderMap::new();
//!                 headers.insert("x-request-id", "req-1".parse().unwrap());
//!                 probe.tag("req-1", &mut headers);
//!                 (headers, "data: {}\n\n")
//!             }
//!         }),
//!     )
//!     .merge(probe.router());
//! # let _ = (app, SCRIPT_PATH);
//! # Ok(())
//! # }
//! ```

mod post;
mod rate;
mod refusal;
mod token;

use std::fmt;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use axum::http::StatusCode;
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post as post_route};
use futures_core::Stream;

use crate::probe::{Pending, RecordSink, in_sample, sample_threshold};

use self::rate::Rate;
use self::token::Tokens;

pub use self::post::{CLIENT_RECV, CLIENT_RENDER, MAX_POST_BYTES, MAX_POST_RECORDS};
pub use self::refusal::{Refusal, Refused};
pub use self::token::TOKEN_LIFETIME;

/// The probe script: an ES module with no dependencies, readable as it is served.
pub const SCRIPT: &str = include_str!("probe.js");
/// Where a server serves [`SCRIPT`].
pub const SCRIPT_PATH: &str = "/streamgate/probe.js";
/// Where a page posts its records.
pub const RECORDS_PATH: &str = "/streamgate/hop-records";
/// The response header that gives a page the token of its stream.
pub const TOKEN_HEADER: &str = "x-streamgate-probe";
/// Records a second taken from every page together, by default.
pub const DEFAULT_RECORD_RATE: u32 = 20_000;

/// What the intake has taken and refused so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct BrowserStats {
    /// Tokens given (streams a page may record).
    pub tokens: u64,
    /// Batches taken.
    pub batches: u64,
    /// Records taken into the sink.
    pub records: u64,
    refused: [u64; Refusal::ALL.len()],
}

impl BrowserStats {
    /// Batches refused for `refusal`.
    ///
    /// See [`BrowserProbe::take`] for an example.
    pub fn refused(&self, refusal: Refusal) -> u64 {
        self.refused[index(refusal)]
    }
}

/// `refusal`'s place in [`Refusal::ALL`], where its count is kept.
fn index(refusal: Refusal) -> usize {
    Refusal::ALL
        .iter()
        .position(|&r| r == refusal)
        .unwrap_or_default()
}

/// The intake of a page's records: tokens for the streams it probes, and the batches posted
/// at [`RECORDS_PATH`], checked and written to a [`RecordSink`]. Cloning shares it.
///
/// See the [module](self) for what it takes, and an example.
#[derive(Clone)]
pub struct BrowserProbe {
    inner: Arc<Inner>,
}

struct Inner {
    sink: RecordSink,
    threshold: u64,
    tokens: Tokens,
    rate: Rate,
    given: AtomicU64,
    batches: AtomicU64,
    records: AtomicU64,
    refused: [AtomicU64; Refusal::ALL.len()],
}

impl BrowserProbe {
    /// Takes records into `sink` for the `sample` share (`0.0` to `1.0`) of requests: give the
    /// share the server's other hops record ([`HopProbe::records`](crate::probe::HopProbe::records)),
    /// so the page records the same requests.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::browser::BrowserProbe;
    /// use streamgate::probe::RecordSink;
    ///
    /// let sink = RecordSink::to_writer(std::io::sink(), 1024)?;
    /// let probe = BrowserProbe::new(sink, 0.0);
    /// assert_eq!(probe.token("req-1"), None, "no request is in an empty sample");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn new(sink: RecordSink, sample: f64) -> Self {
        Self::with_rate(sink, sample, DEFAULT_RECORD_RATE)
    }

    /// As [`new`](BrowserProbe::new), taking at most `per_second` records a second from every
    /// page together (default [`DEFAULT_RECORD_RATE`]), with a burst of two seconds' worth.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::browser::{BrowserProbe, Refusal};
    /// use streamgate::probe::RecordSink;
    ///
    /// let sink = RecordSink::to_writer(std::io::sink(), 1024)?;
    /// let probe = BrowserProbe::with_rate(sink, 1.0, 1);
    /// let token = probe.token("r").unwrap();
    /// let batch = |n: usize| {
    ///     let record = r#"{"hop":"client.recv","seq":0,"t_ns":0,"bytes":1,"kind":"visible"}"#;
    ///     let records = vec![record; n].join(",");
    ///     format!(r#"{{"request":"r","token":"{token}","records":[{records}]}}"#)
    /// };
    /// assert_eq!(probe.take(batch(2).as_bytes()), Ok(2));
    /// let refused = probe.take(batch(1).as_bytes()).unwrap_err();
    /// assert_eq!(refused.refusal, Refusal::RateLimited);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn with_rate(sink: RecordSink, sample: f64, per_second: u32) -> Self {
        BrowserProbe {
            inner: Arc::new(Inner {
                sink,
                threshold: sample_threshold(sample),
                tokens: Tokens::new(),
                rate: Rate::new(per_second),
                given: AtomicU64::new(0),
                batches: AtomicU64::new(0),
                records: AtomicU64::new(0),
                refused: Default::default(),
            }),
        }
    }

    /// The token a page needs to write records of `request`, when it is in the sample.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::browser::BrowserProbe;
    /// use streamgate::probe::RecordSink;
    ///
    /// let probe = BrowserProbe::new(RecordSink::to_writer(std::io::sink(), 1024)?, 1.0);
    /// let token = probe.token("req-1").unwrap();
    /// assert_ne!(probe.token("req-2").unwrap(), token);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn token(&self, request: &str) -> Option<String> {
        if !in_sample(request, self.inner.threshold) {
            return None;
        }
        self.inner.given.fetch_add(1, Ordering::Relaxed);
        Some(self.inner.tokens.give(request))
    }

    /// Gives the page of `request`'s response its token, in [`TOKEN_HEADER`] (when it is in the
    /// sample), and lets a page of another origin read that header and `x-request-id`
    /// (`Access-Control-Expose-Headers`).
    ///
    /// # Examples
    ///
    /// ```
    /// use axum::http::HeaderMap;
    /// use streamgate::browser::{BrowserProbe, TOKEN_HEADER};
    /// use streamgate::probe::RecordSink;
    ///
    /// let probe = BrowserProbe::new(RecordSink::to_writer(std::io::sink(), 1024)?, 1.0);
    /// let mut headers = HeaderMap::new();
    /// probe.tag("req-1", &mut headers);
    /// assert!(headers.contains_key(TOKEN_HEADER));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn tag(&self, request: &str, headers: &mut HeaderMap) {
        let Some(token) = self.token(request) else {
            return;
        };
        if let Ok(token) = HeaderValue::from_str(&token) {
            headers.insert(TOKEN_HEADER, token);
            // Beside any the app exposes itself.
            headers.append(
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static("x-request-id, x-streamgate-probe"),
            );
        }
    }

    /// Takes a batch posted by a page (the body of a `POST` at [`RECORDS_PATH`]): its records
    /// are written to the sink, and their number returned; or it is refused whole, and counted.
    ///
    /// # Errors
    ///
    /// [`Refused`], with the [`Refusal`] counted and a detail for the page's developer.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::browser::{BrowserProbe, Refusal};
    /// use streamgate::probe::RecordSink;
    ///
    /// let probe = BrowserProbe::new(RecordSink::to_writer(std::io::sink(), 1024)?, 1.0);
    /// let token = probe.token("req-1").unwrap();
    /// let batch = |request: &str| {
    ///     format!(
    ///         r#"{{"request":"{request}","token":"{token}","records":[
    ///             {{"hop":"client.recv","seq":0,"t_ns":5,"bytes":3,"kind":"visible"}},
    ///             {{"hop":"client.render","seq":0,"t_ns":9,"bytes":3,"kind":"visible"}}]}}"#
    ///     )
    /// };
    /// assert_eq!(probe.take(batch("req-1").as_bytes()), Ok(2));
    /// // Another user's request, with this page's token.
    /// let refused = probe.take(batch("req-2").as_bytes()).unwrap_err();
    /// assert_eq!(refused.refusal, Refusal::BadToken);
    /// assert_eq!(probe.stats().refused(Refusal::BadToken), 1);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn take(&self, body: &[u8]) -> Result<usize, Refused> {
        let taken = self.take_batch(body);
        if let Err(refused) = &taken {
            self.count(refused.refusal);
        }
        taken
    }

    fn take_batch(&self, body: &[u8]) -> Result<usize, Refused> {
        if body.len() > MAX_POST_BYTES {
            return Err(Refusal::TooLarge.into());
        }
        let post = post::parse(body).map_err(|malformed| Refused {
            refusal: Refusal::Malformed,
            detail: malformed.to_string(),
        })?;
        self.inner.tokens.check(&post.request, &post.token)?;
        if !self.inner.rate.take(post.records.len()) {
            return Err(Refusal::RateLimited.into());
        }
        let request: Arc<str> = post.request.into();
        let (recv, render): (Arc<str>, Arc<str>) = (CLIENT_RECV.into(), CLIENT_RENDER.into());
        let count = post.records.len();
        let records = post
            .records
            .into_iter()
            .map(|record| Pending {
                request: request.clone(),
                hop: if record.render { &render } else { &recv }.clone(),
                seq: record.seq,
                t_ns: record.t_ns,
                bytes: record.bytes,
                kind: record.kind,
                busy_ns: record.busy_ns,
                attrs: None,
            })
            .collect();
        if !self.inner.sink.send_all(records) {
            return Err(Refusal::SinkFull.into());
        }
        self.inner.batches.fetch_add(1, Ordering::Relaxed);
        self.inner
            .records
            .fetch_add(count as u64, Ordering::Relaxed);
        Ok(count)
    }

    fn count(&self, refusal: Refusal) {
        self.inner.refused[index(refusal)].fetch_add(1, Ordering::Relaxed);
    }

    /// What it has taken and refused so far.
    ///
    /// See [`take`](BrowserProbe::take) for an example.
    pub fn stats(&self) -> BrowserStats {
        let inner = &self.inner;
        BrowserStats {
            tokens: inner.given.load(Ordering::Relaxed),
            batches: inner.batches.load(Ordering::Relaxed),
            records: inner.records.load(Ordering::Relaxed),
            refused: std::array::from_fn(|n| inner.refused[n].load(Ordering::Relaxed)),
        }
    }

    /// Routes for any axum app: `GET` [`SCRIPT_PATH`] serves [`SCRIPT`], `POST`
    /// [`RECORDS_PATH`] [takes](BrowserProbe::take) a batch (204, or the refusal's status and
    /// why, as text). See the [module](self) for an example.
    pub fn router<S: Clone + Send + Sync + 'static>(&self) -> Router<S> {
        let probe = self.clone();
        Router::new().route(SCRIPT_PATH, get(script)).route(
            RECORDS_PATH,
            post_route(move |body: Body| {
                let probe = probe.clone();
                async move { probe.answer(body).await }
            }),
        )
    }

    async fn answer(&self, body: Body) -> Response {
        let taken = match read(body).await {
            Ok(body) => self.take(&body),
            Err(refused) => {
                self.count(refused.refusal);
                Err(refused)
            }
        };
        match taken {
            Ok(_) => StatusCode::NO_CONTENT.into_response(),
            Err(refused) => (refused.refusal.status(), refused.to_string()).into_response(),
        }
    }
}

/// Serves [`SCRIPT`]: JavaScript, revalidated on every load (a new version of the server may
/// bring a new script). [`BrowserProbe::router`] routes it; a server that takes no records
/// may serve it alone.
///
/// # Examples
///
/// ```
/// use axum::Router;
/// use axum::routing::get;
/// use streamgate::browser::{SCRIPT_PATH, script};
///
/// let app: Router = Router::new().route(SCRIPT_PATH, get(script));
/// # let _ = app;
/// ```
pub async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        SCRIPT,
    )
        .into_response()
}

/// The body, up to [`MAX_POST_BYTES`], read as it comes (a longer one is refused before it
/// is all read).
async fn read(body: Body) -> Result<Vec<u8>, Refused> {
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    while let Some(chunk) = poll_fn(|cx| Pin::new(&mut stream).poll_next(cx)).await {
        let chunk = chunk.map_err(|error| Refused {
            refusal: Refusal::Malformed,
            detail: format!("the body could not be read: {error}"),
        })?;
        if bytes.len() + chunk.len() > MAX_POST_BYTES {
            return Err(Refusal::TooLarge.into());
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

impl fmt::Debug for BrowserProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BrowserProbe")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}
