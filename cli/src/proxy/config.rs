//! The proxy's flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::http::HeaderName;
use streamgate::fleet::AttemptOptions;

use super::failover::FailoverMode;
use super::routes::Routes;
use super::url::UpstreamUrl;
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

A fleet:
  streamgate proxy --upstream http://10.0.0.1:8000 --upstream http://10.0.0.2:8000
  streamgate proxy --config fleet.toml --fallbacks fallbacks.json
  Upstreams speak HTTP/1.1, plain or over TLS (https://: the system's roots and --upstream-ca).
  A request goes to the replica with the fewest streams in flight (of two drawn at random, by
  weight). Before its first event reaches the client it is retried on a connect failure, a
  reset, a 429, a 5xx or no headers in time (another replica; the same one after a backoff;
  then a fallback model), Retry-After honoured, at most --max-attempts times; never a 4xx.
  A replica that keeps failing is ejected for a cool-down (growing, capped at 30 s), then
  given one probe request.
  A stream that breaks after its first event (cut, stalled, an overload in band) is carried
  on elsewhere (--failover continue): another replica or a fallback continues the answer
  from the text the client has, and the client sees one stream.";

/// The same, in short (`-h`).
const SHORT_HELP: &str = "\
Example: streamgate proxy --upstream http://127.0.0.1:8000 --addr 0.0.0.0:8080
(--help says what it does, and lists the proxy's own endpoints)";

/// `streamgate proxy`: the proxy's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = SHORT_HELP, after_long_help = LONG_HELP)]
pub struct Config {
    /// An OpenAI-compatible server to put the proxy in front of:
    /// `http[s]://HOST[:PORT][/PREFIX]`. Give it several times for replicas serving the same
    /// models: one pool, balanced by streams in flight, with retries on another replica.
    #[arg(long, value_name = "URL", required_unless_present = "config")]
    pub upstream: Vec<UpstreamUrl>,
    /// A fleet described in TOML instead of `--upstream`: pools, the models each serves (names
    /// or globs), their replicas and weights, health checks, circuits, fallbacks and attempts
    /// (a commented example: cli/examples/fleet.toml).
    #[arg(long, value_name = "FILE", conflicts_with = "upstream")]
    pub config: Option<PathBuf>,
    /// Model fallbacks, as JSON: a requested model to the model (or list of models) to try
    /// when its pool cannot serve the request (`{"big": ["medium", "small"]}`).
    #[arg(long, value_name = "FILE")]
    pub fallbacks: Option<PathBuf>,
    /// More root certificates (PEM) to trust for `https://` upstreams, besides the system's:
    /// the CA of a private fleet.
    #[arg(long = "upstream-ca", value_name = "FILE")]
    pub upstream_ca: Option<PathBuf>,
    /// The most attempts per request, the first included (another replica, the same one
    /// after a backoff, a fallback), all before its first event reaches the client [default:
    /// 3, or the config's `[attempts] max`].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: Option<u32>,
    /// A stream whose first event does not come within this long after its headers moves to
    /// another replica or a fallback (nothing has reached the client yet); 0: no limit but
    /// `--upstream-idle-ms`.
    #[arg(long = "first-token-ms", value_name = "MS", default_value = "0", value_parser = flags::millis_or_zero)]
    pub first_token: Duration,
    /// When a stream breaks after its first event (the upstream is cut, stalls past
    /// `--upstream-idle-ms`, or ends it with an overload or internal error): `continue` asks
    /// another replica (or a fallback) to continue the answer from the text the client has, so
    /// the client sees one whole stream; `restart` only sends the request again while nothing
    /// visible has reached the client; `off` ends the stream with an error event.
    #[arg(long, value_enum, value_name = "MODE", default_value_t = FailoverMode::Continue)]
    pub failover: FailoverMode,
    /// The most failovers per stream (each with the attempts of `--max-attempts`).
    #[arg(long = "failover-max", value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub failover_max: u32,
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
    /// How long each attempt of a streamed request waits for the upstream's response headers,
    /// in ms (then another replica is tried; none left: a 504, or the terminal frame of a
    /// committed stream). Past one heartbeat interval the stream is committed (200) and
    /// heartbeats flow meanwhile. Other requests wait as long as the upstream takes (a
    /// non-streamed completion has its headers only once it is done).
    #[arg(long = "upstream-headers-ms", value_name = "MS", default_value = "60000", value_parser = flags::millis)]
    pub upstream_headers: Duration,
    /// A stream whose upstream sends no event for this long (comments do not count) has its
    /// upstream dropped, and is carried on elsewhere as `--failover` says, or ends with an
    /// `upstream_error` frame ("upstream stalled"); heartbeats keep the client's connection
    /// alive meanwhile (0: wait for ever).
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
    /// A request header whose value `proxy.recv`'s hop records carry as an attribute under
    /// its name, for `diagnose --by NAME` (a client version, a region); repeatable, up to 5
    /// (beside `upstream`, `pool` and `model`, which they always carry).
    #[arg(long = "record-header", value_name = "NAME", value_parser = record_header)]
    pub record_headers: Vec<HeaderName>,
}

/// A header name for `--record-header`, lowercase as HTTP/2 and hop records spell it: not one
/// of the attributes the proxy sets, nor a name `diagnose --by` reserves.
fn record_header(name: &str) -> Result<HeaderName, String> {
    let name = name.to_ascii_lowercase();
    if ["upstream", "pool", "model", "position", "length"].contains(&name.as_str()) {
        return Err(format!(
            "`{name}` is an attribute of its own (upstream, pool, model) or a slice key (position, length)"
        ));
    }
    HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("`{name}` is not a header name"))
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

    /// The fleet these flags describe: one pool of the `--upstream`s serving every model, or
    /// the `--config` file's; with the `--fallbacks` file's fallbacks, and `--max-attempts`
    /// over the file's.
    ///
    /// # Errors
    ///
    /// A file that cannot be read or parsed, or a fleet that cannot serve (no pool, an empty
    /// one, a fallback no pool serves, a fallback cycle), naming what is wrong.
    pub fn routes(&self) -> Result<Routes, String> {
        let mut routes = match &self.config {
            Some(path) => Routes::from_toml(path, AttemptOptions::default())?,
            None => Routes::of_upstreams(&self.upstream, AttemptOptions::default()).check()?,
        };
        if let Some(path) = &self.fallbacks {
            routes = routes.with_fallbacks_file(path)?;
        }
        if let Some(max) = self.max_attempts {
            routes.attempts = routes.attempts.max_attempts(max);
        }
        Ok(routes)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse() {
        let config = Config::parse_from(["--upstream", "http://127.0.0.1:8000"]).unwrap();
        assert_eq!(config.upstream.len(), 1);
        assert_eq!(config.routes().unwrap().pools[0].upstreams.len(), 1);
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
            "--upstream (or --config) is required"
        );
        let two = Config::parse_from(["--upstream", "a:1", "--upstream", "https://b/v1"]).unwrap();
        let routes = two.routes().unwrap();
        assert_eq!(routes.pools[0].upstreams.len(), 2);
        assert_eq!(routes.attempts, AttemptOptions::default());
        let more = Config::parse_from(["--upstream", "a:1", "--max-attempts", "5"]).unwrap();
        assert_eq!(
            more.routes().unwrap().attempts,
            AttemptOptions::default().max_attempts(5)
        );
        assert!(Config::parse_from(["--upstream", "a:1", "--max-attempts", "0"]).is_err());
        assert!(Config::parse_from(["--upstream", "a:1", "--config", "f.toml"]).is_err());
        let missing = Config::parse_from(["--config", "/nonexistent/fleet.toml"]).unwrap();
        assert!(
            missing
                .routes()
                .unwrap_err()
                .contains("/nonexistent/fleet.toml")
        );
        // Fault injection is no flag of the proxy's.
        for flag in ["--stall-at", "--stall-ms"] {
            let parsed = Config::parse_from(["--upstream", "a:1", flag, "1"]);
            assert!(parsed.is_err(), "{flag} was taken");
        }
    }
}
