//! The proxy's flags, and the upstream URL they name.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use axum::http::Uri;
use axum::http::uri::Authority;

use crate::flags;

/// What `streamgate proxy --help` teaches after the flags.
const LONG_HELP: &str = "\
What it does:
  Puts streamgate in front of any OpenAI-compatible server (vLLM, SGLang, llama.cpp, TGI,
  `streamgate sim`, ...) without changing it. A streamed POST /v1/chat/completions or
  /v1/completions (\"stream\": true) is decoded, gated and sent one HTTP chunk per event, with
  heartbeats, a slow-consumer policy, cancellation carried upstream the moment the client goes,
  resumable streams, hop probes, and a terminal error frame whenever the upstream fails. Any
  completion the upstream answers 2xx text/event-stream is gated, whatever its body asked.
  Every other request (non-streamed completions, /v1/models, /health, anything) passes
  through, its body streamed both ways, without the hop-by-hop headers: Upgrade and
  Connection are among them, so WebSocket (and other Upgrade) requests are not relayed as
  such. x-request-id goes both ways (one is made when the client sent none); traceparent goes
  upstream.

Limits:
  A completion request's body is read whole (--max-request-bytes, 413), within
  --body-timeout-ms (408), and all of them together within --max-buffered-bytes (503).
  --max-connections defaults to half of streamgate's default cap (three quarters of the file
  descriptor limit, at least 64 left over), since every proxied stream holds two sockets: its
  client's and its upstream's.

Request ids and resumes:
  Resumes and stops need --resume-grace-ms above 0. Without it no stream is registered,
  requests sharing an x-request-id (retries keep theirs) are served side by side, and the
  /stream and /cancel paths below pass through to the upstream. With it, a request whose id
  names a running or retained stream gets 409 before the upstream is asked. A resumable
  stream's id is its only credential: the proxy's ids are unguessable, a client's own are
  as secret as the client keeps them.

Example:
  streamgate proxy --upstream http://127.0.0.1:8000 --addr 0.0.0.0:8080

The proxy's own endpoints (they shadow the upstream's paths of the same name):
  GET  /metrics                                   Prometheus: hops proxy.recv, proxy.write
  GET  /stats                                     the proxy's stream counters (JSON)
  GET  /v1/chat/completions/{request_id}/stream   resume (Last-Event-ID: n, or ?after=n)
  POST /v1/chat/completions/{request_id}/cancel   stop a stream (final chunk, then [DONE])
  (the last two only with --resume-grace-ms above 0)

Only http:// upstreams (HTTP/1.1); https is not supported.";

/// The same, in short (`-h`).
const SHORT_HELP: &str = "\
Example: streamgate proxy --upstream http://127.0.0.1:8000 --addr 0.0.0.0:8080
(--help says what it does, and lists the proxy's own endpoints)";

/// `streamgate proxy`: the proxy's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = SHORT_HELP, after_long_help = LONG_HELP)]
pub struct Config {
    /// The OpenAI-compatible server to put the proxy in front of: `http://HOST:PORT[/PREFIX]`
    /// (a host name or an IP; http only).
    #[arg(long, value_name = "URL")]
    pub upstream: UpstreamUrl,
    /// Where to listen (`127.0.0.1:0` picks a free port; the real one is printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    #[command(flatten)]
    pub gate: flags::GateFlags,
    #[command(flatten)]
    pub listen: flags::ListenFlags,
    /// How long connecting to the upstream may take, in ms (then 504).
    #[arg(long = "connect-timeout-ms", value_name = "MS", default_value = "5000", value_parser = flags::millis)]
    pub connect_timeout: Duration,
    /// How long a streamed request waits for the upstream's response headers, in ms. Past one
    /// heartbeat interval the stream is committed (200) and heartbeats flow meanwhile; at the
    /// deadline it ends with an error frame (a 504 when the deadline comes first). Other
    /// requests wait as long as the upstream takes (a non-streamed completion has its headers
    /// only once it is done).
    #[arg(long = "upstream-headers-ms", value_name = "MS", default_value = "60000", value_parser = flags::millis)]
    pub upstream_headers: Duration,
    /// A stream whose upstream sends no event for this long (comments do not count) ends with
    /// an `upstream_error` frame ("upstream stalled") and the upstream is dropped; heartbeats
    /// keep the client's connection alive until then (0: wait for ever).
    #[arg(long = "upstream-idle-ms", value_name = "MS", default_value = "120000", value_parser = flags::millis_or_zero)]
    pub upstream_idle: Duration,
    /// The largest completion request body the proxy reads (413 above it). Only `POST
    /// /v1/chat/completions` and `/v1/completions` are read (their answers are gated when they
    /// stream); every other body streams through unread. 16 MiB, since a vision request carries
    /// its images base64-encoded in the body; `--max-buffered-bytes` bounds what all of them
    /// hold together.
    #[arg(long, value_name = "B", default_value_t = 16 * 1024 * 1024, value_parser = flags::positive)]
    pub max_request_bytes: usize,
    /// How long a completion request's body may take to arrive, in ms, from its headers on (408
    /// after it): a client that sends part of a body and stops does not hold its connection
    /// and its buffer for ever.
    #[arg(long = "body-timeout-ms", value_name = "MS", default_value = "30000", value_parser = flags::millis)]
    pub body_timeout: Duration,
    /// The most bytes of completion request bodies held in memory at once, across all requests
    /// (being read, or waiting to go upstream). A body that would pass it is refused with 503
    /// ("too many large requests in flight") at once, never queued.
    #[arg(long, value_name = "B", default_value_t = 64 * 1024 * 1024, value_parser = flags::positive)]
    pub max_buffered_bytes: usize,
    #[command(flatten)]
    pub resume: flags::ResumeFlags,
    /// For tests and the demo's diagnosis drill only, and no flag (a production proxy injects no
    /// faults): a stall before forwarding one event of every stream. Set it from code, after
    /// parsing.
    #[arg(skip)]
    pub stall: Option<InjectedStall>,
    /// Write a hop record (a JSON line) for every event of every stream at the hops
    /// `proxy.recv` (each upstream event as it arrives) and `proxy.write` (each frame handed
    /// to the client's connection), and one of kind `end` per stream; flushed at exit.
    #[arg(long, value_name = "FILE")]
    pub hop_records: Option<String>,
    #[command(flatten)]
    pub hop_records_sample: flags::RecordSample,
}

impl Config {
    /// The most connections the proxy accepts at once: `--max-connections`, or half of
    /// [`default_max_connections`](streamgate::transport::default_max_connections), since each
    /// proxied stream holds two descriptors, its client's socket and its upstream's.
    pub fn max_connections(&self) -> usize {
        self.listen
            .max_connections
            .unwrap_or_else(|| (streamgate::transport::default_max_connections() / 2).max(1))
    }

    /// The server with the connection protections these flags ask for
    /// (`--header-timeout-ms`, `--idle-timeout-ms`, [`max_connections`](Self::max_connections)).
    pub fn server(&self) -> streamgate::transport::Server {
        self.listen.server().max_connections(self.max_connections())
    }

    /// Parses the proxy's flags (`["--upstream", "http://127.0.0.1:8000"]`, without a program
    /// name).
    ///
    /// # Errors
    ///
    /// A flag that is missing, unknown or malformed, as clap reports it.
    pub fn parse_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        flags::parse_from("proxy", args)
    }
}

/// A stall the proxy injects before forwarding event `at` of every stream, once per stream: a
/// proxy-side freeze for tests and diagnosis drills ([`Config::stall`]; `streamgate sim`'s
/// `--stall-at` is the worker-side one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InjectedStall {
    /// The event it comes before (0-based).
    pub at: u64,
    /// How long it lasts (a stop ends it early).
    pub duration: Duration,
}

/// An upstream server: `http://HOST:PORT[/PREFIX]`. Every path the proxy forwards is appended
/// to the prefix (`http://gpu-1:8000/api` sends `/v1/models` to `/api/v1/models`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    authority: Authority,
    prefix: String,
}

impl UpstreamUrl {
    /// The upstream's `HOST:PORT`.
    pub fn authority(&self) -> &Authority {
        &self.authority
    }

    /// The path every forwarded path is appended to (empty, or `/PREFIX` without a trailing
    /// slash).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The absolute URI of `path_and_query` (which starts with `/`) at the upstream.
    ///
    /// # Errors
    ///
    /// If the joined URI is not valid (a path the client sent can always be joined).
    pub fn join(&self, path_and_query: &str) -> Result<Uri, axum::http::uri::InvalidUri> {
        format!("http://{}{}{}", self.authority, self.prefix, path_and_query).parse()
    }
}

impl FromStr for UpstreamUrl {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, String> {
        let problem = |why: &str| format!("`{value}` is not http://HOST:PORT[/PREFIX]: {why}");
        let with_scheme = if value.contains("://") {
            value.to_owned()
        } else {
            format!("http://{value}")
        };
        let uri: Uri = with_scheme.parse().map_err(|_| problem("not a URL"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => return Err(problem("https upstreams are not supported")),
            _ => return Err(problem("the scheme must be http")),
        }
        let authority = uri.authority().cloned().ok_or_else(|| problem("no host"))?;
        if authority.as_str().contains('@') {
            return Err(problem("credentials in the URL are not supported"));
        }
        if uri.query().is_some() {
            return Err(problem("a query is not supported"));
        }
        let authority = match authority.port_u16() {
            Some(_) => authority,
            None => format!("{}:80", authority.host())
                .parse()
                .map_err(|_| problem("not a host"))?,
        };
        Ok(UpstreamUrl {
            authority,
            prefix: uri.path().trim_end_matches('/').to_owned(),
        })
    }
}

impl fmt::Display for UpstreamUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.authority, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls() {
        let url: UpstreamUrl = "http://127.0.0.1:8000".parse().unwrap();
        assert_eq!(url.to_string(), "http://127.0.0.1:8000");
        assert_eq!(
            url.join("/v1/models?x=1").unwrap().to_string(),
            "http://127.0.0.1:8000/v1/models?x=1"
        );
        let url: UpstreamUrl = "http://gpu-1:8000/api/".parse().unwrap();
        assert_eq!(
            url.join("/v1/models").unwrap().to_string(),
            "http://gpu-1:8000/api/v1/models"
        );
        let url: UpstreamUrl = "localhost".parse().unwrap();
        assert_eq!(url.to_string(), "http://localhost:80");
        assert!(
            "https://a:1"
                .parse::<UpstreamUrl>()
                .unwrap_err()
                .contains("https")
        );
        assert!("ftp://a:1".parse::<UpstreamUrl>().is_err());
        assert!("http://a:1/x?y=1".parse::<UpstreamUrl>().is_err());
    }

    #[test]
    fn defaults_parse() {
        let config = Config::parse_from(["--upstream", "http://127.0.0.1:8000"]).unwrap();
        assert_eq!(config.addr.to_string(), "127.0.0.1:8080");
        assert_eq!(config.resume.store, flags::ResumeStore::Memory);
        assert_eq!(
            config.max_connections(),
            (streamgate::transport::default_max_connections() / 2).max(1),
            "half the library's default: two sockets per stream"
        );
        assert_eq!(config.body_timeout, Duration::from_secs(30));
        assert_eq!(config.max_buffered_bytes, 64 * 1024 * 1024);
        assert_eq!(config.stall, None);
        let given = Config::parse_from(["--upstream", "a:1", "--max-connections", "10"]).unwrap();
        assert_eq!(given.max_connections(), 10);
        assert!(
            Config::parse_from::<_, &str>([]).is_err(),
            "--upstream is required"
        );
        // Fault injection is no flag of the proxy's.
        for flag in ["--stall-at", "--stall-ms"] {
            let parsed = Config::parse_from(["--upstream", "a:1", flag, "1"]);
            assert!(parsed.is_err(), "{flag} was taken");
        }
    }
}
