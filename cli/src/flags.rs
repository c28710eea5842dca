//! The flags `sim` and `proxy` share: the gate's, the resume store's, and the listener's.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, ValueEnum};
use streamgate::browser::BrowserProbe;
use streamgate::probe::{HopProbe, RecordSink};
use streamgate::resume::{DEFAULT_LOG_BYTES, DEFAULT_LOG_EVENTS, Registry, ResumeOptions};
use streamgate::transport::{
    DEFAULT_HEADER_READ_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_NOTSENT_LOWAT, DEFAULT_USER_TIMEOUT,
    ListenOptions, Server,
};
use streamgate::{DEFAULT_MAX_BYTES, DEFAULT_MAX_EVENTS};

/// Parses the flags of `A` from `args` (without a program name), as the command `name`.
///
/// # Errors
///
/// A flag that is missing, unknown or malformed, as clap reports it.
pub fn parse_from<A, I, T>(name: &'static str, args: I) -> Result<A, clap::Error>
where
    A: Args,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let program = std::iter::once(OsString::from(name));
    let mut matches = A::augment_args(clap::Command::new(name))
        .try_get_matches_from(program.chain(args.into_iter().map(Into::into)))?;
    A::from_arg_matches_mut(&mut matches)
}

/// The slow-consumer policy, as a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyFlag {
    /// A full buffer pauses the generator (up to `--slow-deadline-ms`, then the stream ends).
    Backpressure,
    /// A full buffer merges events losslessly where they can merge, else pauses.
    Coalesce,
    /// A consumer that takes nothing from a full buffer for `--slow-deadline-ms` is cut off.
    Disconnect,
}

/// The gate between a generator (or an upstream) and one client. The bounds' defaults are the
/// library's ([`DEFAULT_MAX_EVENTS`], [`DEFAULT_MAX_BYTES`]); the policy's and the deadlines'
/// are the command's ([`Default`] gives them all).
#[derive(Debug, Clone, Args)]
pub struct GateFlags {
    /// Bounded buffer between generator and transport, in events.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_EVENTS, value_parser = positive)]
    pub buffer_events: usize,
    /// The same buffer's byte bound.
    #[arg(long, value_name = "B", default_value_t = DEFAULT_MAX_BYTES, value_parser = positive)]
    pub buffer_bytes: usize,
    /// Slow-consumer policy.
    #[arg(long, value_enum, value_name = "P", default_value_t = PolicyFlag::Backpressure)]
    pub policy: PolicyFlag,
    /// How long the consumer may be stalled before the policy ends the stream, in ms.
    #[arg(long = "slow-deadline-ms", value_name = "MS", default_value = "10000", value_parser = millis)]
    pub slow_deadline: Duration,
    /// An SSE comment is sent when no event was written for this long, in ms.
    #[arg(long = "heartbeat-ms", value_name = "MS", default_value = "15000", value_parser = millis)]
    pub heartbeat: Duration,
}

/// A positive count (events, bytes, requests).
pub fn positive(value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("`{value}` is not a positive number")),
    }
}

/// Which share of requests `--hop-records` writes.
#[derive(Debug, Clone, Copy, Args)]
pub struct RecordSample {
    /// The share of requests (0 to 1) whose events `--hop-records` writes, chosen by request
    /// id so that every hop writes the same requests' records (0.01: one in a hundred).
    #[arg(long = "hop-records-sample", value_name = "SHARE", default_value_t = 1.0, value_parser = share)]
    pub share: f64,
}

impl RecordSample {
    /// The hop `name`, writing the records of this share of requests to `records`, if any.
    pub fn hop(&self, records: &Option<RecordSink>, name: &str) -> HopProbe {
        match records {
            Some(sink) => HopProbe::new(name).records(sink.clone(), self.share),
            None => HopProbe::new(name),
        }
    }

    /// The page's hops, taking the records of the same share of requests into `records`, if
    /// any.
    pub fn browser(&self, records: &Option<RecordSink>) -> Option<BrowserProbe> {
        records
            .as_ref()
            .map(|sink| BrowserProbe::new(sink.clone(), self.share))
    }
}

/// A share from 0 to 1.
pub fn share(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(share) if (0.0..=1.0).contains(&share) => Ok(share),
        _ => Err(format!("`{value}` is not a share from 0 to 1")),
    }
}

/// A positive number of milliseconds.
pub fn millis(value: &str) -> Result<Duration, String> {
    match value.parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(format!(
            "`{value}` is not a positive number of milliseconds"
        )),
    }
}

/// `duration` as a flag's number of milliseconds: a default taken from the library's constants.
pub fn millis_text(duration: Duration) -> String {
    duration.as_millis().to_string()
}

/// A number of milliseconds, 0 included.
pub fn millis_or_zero(value: &str) -> Result<Duration, String> {
    value
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| format!("`{value}` is not a number of milliseconds"))
}

impl Default for GateFlags {
    /// The flags' defaults (as given no flag).
    fn default() -> Self {
        parse_from::<Self, _, &str>("gate", []).expect("the defaults parse")
    }
}

impl GateFlags {
    /// A gate with these bounds and policy: the slow deadline ends a stream whose consumer
    /// took nothing from a full buffer for that long (`disconnect`), or whose generator was
    /// paused that long (`backpressure`, `coalesce`). With a `resume` grace, a detached stream
    /// waits at a full replay log for its grace: the registry's lag limit, not the gate's
    /// pause limit, ends a slow reader (and `disconnect` pauses as `backpressure` does).
    pub fn gate(&self, resume: &ResumeFlags) -> streamgate::Gate {
        let pause = resume.grace.is_zero().then_some(self.slow_deadline);
        let policy = match (self.policy, pause) {
            (PolicyFlag::Coalesce, _) => streamgate::Policy::coalesce().max_pause(pause),
            (PolicyFlag::Disconnect, Some(_)) => streamgate::Policy::disconnect(self.slow_deadline),
            _ => streamgate::Policy::backpressure().max_pause(pause),
        };
        streamgate::Gate::new()
            .max_events(self.buffer_events)
            .max_bytes(self.buffer_bytes)
            .policy(policy)
            .stamp_events(true)
    }
}

/// Where a stream lives for a resume, and how long it waits for one.
#[derive(Debug, Clone, Args)]
pub struct ResumeFlags {
    /// How long a stream whose client disconnected goes on into its replay log (generating,
    /// or reading its upstream), waiting for a resume, before it is cancelled (0: a disconnect
    /// cancels it at once; at most a day).
    #[arg(long = "resume-grace-ms", value_name = "MS", default_value = "0", value_parser = up_to_a_day)]
    pub grace: Duration,
    /// Per-stream replay log bound, in bytes; a full log pauses a detached stream.
    #[arg(long, value_name = "B", default_value_t = DEFAULT_LOG_BYTES, value_parser = positive)]
    pub replay_bytes: usize,
    /// Where replay logs live: `memory`, or `redis://HOST:PORT` (Redis Streams, so another
    /// instance can serve the resume; needs a `--resume-grace-ms`).
    #[arg(long = "resume-store", value_name = "URL", default_value = "memory", value_parser = resume_store)]
    pub store: ResumeStore,
    /// How long a Redis store rides out Redis being away (a restart, a failover, a dropped
    /// connection): its streams pause and go on when it is back; past this they end with a
    /// `resume_store_error` frame (at most a day).
    #[arg(long = "resume-store-outage-ms", value_name = "MS", default_value = "10000", value_parser = up_to_a_day)]
    pub outage: Duration,
}

/// The longest `--resume-grace-ms`: a day. A grace is how long a detached stream keeps its
/// generator and replay log for a client that may come back; past a day nobody is coming back,
/// and a larger number is a typo that would hold the stream's memory (and, in Redis, its keys'
/// TTL) for as long.
pub const MAX_RESUME_GRACE: Duration = Duration::from_secs(24 * 60 * 60);

/// `--resume-grace-ms`, `--resume-store-outage-ms`: a number of milliseconds from 0 to
/// [`MAX_RESUME_GRACE`] (a day).
fn up_to_a_day(value: &str) -> Result<Duration, String> {
    let grace = millis_or_zero(value)?;
    if grace > MAX_RESUME_GRACE {
        return Err(format!(
            "`{value}` is more than a day ({} ms)",
            MAX_RESUME_GRACE.as_millis()
        ));
    }
    Ok(grace)
}

/// Where replay logs live (`--resume-store`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeStore {
    /// In this process.
    Memory,
    /// In Redis Streams at this URL.
    Redis(String),
}

/// `--resume-store`: `memory` or `redis://HOST:PORT`.
fn resume_store(value: &str) -> Result<ResumeStore, String> {
    match value {
        "memory" => Ok(ResumeStore::Memory),
        url if url.starts_with("redis://") => Ok(ResumeStore::Redis(url.to_owned())),
        _ => Err(format!("`{value}`: `memory` or `redis://HOST:PORT`")),
    }
}

impl ResumeFlags {
    /// Opens the store of replay logs for streams gated by `gate`: a disconnect detaches, the
    /// grace (0: cancel at once) keeps the stream for a resume, and a finished stream stays
    /// replayable as long; a reader may fall behind by the gate's buffer, for its slow
    /// deadline.
    ///
    /// # Errors
    ///
    /// When the store is Redis and there is no grace (a shared store is for resumes through
    /// another instance, and without a grace a disconnect cancels the stream at once), or the
    /// Redis URL is malformed.
    pub fn open<C>(&self, gate: &GateFlags) -> Result<Registry<C>, String>
    where
        C: streamgate::Chunk + Clone + Into<streamgate::sse::SseEvent> + Send + Sync + 'static,
    {
        let options = ResumeOptions::default()
            .grace(self.grace)
            .retain(self.grace)
            .log_bounds(DEFAULT_LOG_EVENTS, self.replay_bytes)
            .read_ahead(gate.buffer_events)
            .max_lag(gate.slow_deadline)
            .outage(self.outage);
        match &self.store {
            ResumeStore::Memory => Ok(Registry::memory(options)),
            ResumeStore::Redis(url) if self.grace.is_zero() => Err(format!(
                "--resume-store {url} needs --resume-grace-ms above 0: without a grace a \
                 disconnect cancels the stream at once, so no other instance could resume it"
            )),
            ResumeStore::Redis(url) => Registry::redis(url, options).map_err(|error| {
                let cause = std::error::Error::source(&error).map(ToString::to_string);
                format!(
                    "--resume-store: {}",
                    cause.unwrap_or_else(|| error.to_string())
                )
            }),
        }
    }
}

/// The listening socket and what each accepted connection gets: kernel settings that let the
/// gate see slow and vanished readers, and protections against clients that hold connections
/// without using them. Every default is the library's ([`DEFAULT_NOTSENT_LOWAT`],
/// [`DEFAULT_USER_TIMEOUT`], [`DEFAULT_HEADER_READ_TIMEOUT`], [`DEFAULT_IDLE_TIMEOUT`]).
#[derive(Debug, Clone, Args)]
pub struct ListenFlags {
    /// SO_SNDBUF for accepted connections (bounds what the kernel holds for a stopped reader;
    /// the OS default when absent).
    #[arg(long, value_name = "B", value_parser = clap::value_parser!(u32).range(1..))]
    pub sndbuf: Option<u32>,
    /// TCP_NOTSENT_LOWAT for accepted connections: the socket takes no more bytes while this
    /// many are unsent (0 leaves the OS setting).
    #[arg(long = "notsent-lowat", value_name = "B", default_value_t = DEFAULT_NOTSENT_LOWAT)]
    pub notsent_lowat: u32,
    /// TCP_USER_TIMEOUT for accepted connections: unacknowledged data older than this fails
    /// the connection, so a client that vanished is let go (0 leaves the OS setting).
    #[arg(long = "user-timeout-ms", value_name = "MS", default_value = millis_text(DEFAULT_USER_TIMEOUT), value_parser = millis_or_zero)]
    pub user_timeout: Duration,
    /// A client must send a whole request head within this many ms of its first byte, however
    /// slowly it trickles (slowloris).
    #[arg(long = "header-timeout-ms", value_name = "MS", default_value = millis_text(DEFAULT_HEADER_READ_TIMEOUT), value_parser = millis)]
    pub header_timeout: Duration,
    /// A connection with no request in flight for this many ms is closed (an open stream is
    /// never idle).
    #[arg(long = "idle-timeout-ms", value_name = "MS", default_value = millis_text(DEFAULT_IDLE_TIMEOUT), value_parser = millis)]
    pub idle_timeout: Duration,
    /// The most connections open at once; more wait in the listen backlog (default: three
    /// quarters of the process's file descriptor limit).
    #[arg(long, value_name = "N", value_parser = positive)]
    pub max_connections: Option<usize>,
}

impl Default for ListenFlags {
    /// The flags' defaults (as given no flag): the library's kernel settings and protections.
    fn default() -> Self {
        parse_from::<Self, _, &str>("listen", []).expect("the defaults parse")
    }
}

impl ListenFlags {
    /// The listener's socket options.
    pub fn options(&self) -> ListenOptions {
        ListenOptions::default()
            .send_buffer(self.sndbuf)
            .notsent_lowat((self.notsent_lowat > 0).then_some(self.notsent_lowat))
            .user_timeout((!self.user_timeout.is_zero()).then_some(self.user_timeout))
    }

    /// The server's protections.
    pub fn server(&self) -> Server {
        let server = Server::new()
            .header_read_timeout(self.header_timeout)
            .idle_timeout(self.idle_timeout);
        match self.max_connections {
            Some(n) => server.max_connections(n),
            None => server,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        gate: GateFlags,
        #[command(flatten)]
        resume: ResumeFlags,
        #[command(flatten)]
        listen: ListenFlags,
        #[command(flatten)]
        sample: RecordSample,
    }

    #[test]
    fn hop_records_are_written_for_every_request_unless_a_share_is_given() {
        assert_eq!(Flags::parse_from(["test"]).sample.share, 1.0);
        let flags = Flags::parse_from(["test", "--hop-records-sample", "0.01"]);
        assert_eq!(flags.sample.share, 0.01);
        for bad in ["1.5", "-0.1", "some"] {
            let parsed = Flags::try_parse_from(["test", "--hop-records-sample", bad]);
            assert!(parsed.is_err(), "{bad} was taken");
        }
    }

    #[test]
    fn the_flags_defaults_are_the_crates() {
        let flags = Flags::parse_from(["test"]);
        assert_eq!(flags.gate.buffer_events, DEFAULT_MAX_EVENTS);
        assert_eq!(flags.gate.buffer_bytes, DEFAULT_MAX_BYTES);
        assert_eq!(flags.resume.replay_bytes, DEFAULT_LOG_BYTES);
        assert_eq!(flags.listen.notsent_lowat, DEFAULT_NOTSENT_LOWAT);
        assert_eq!(flags.listen.user_timeout, DEFAULT_USER_TIMEOUT);
        assert_eq!(flags.listen.header_timeout, DEFAULT_HEADER_READ_TIMEOUT);
        assert_eq!(flags.listen.idle_timeout, DEFAULT_IDLE_TIMEOUT);
        // The command's own.
        assert_eq!(flags.gate.policy, PolicyFlag::Backpressure);
        assert_eq!(flags.gate.slow_deadline, Duration::from_secs(10));
        assert_eq!(flags.gate.heartbeat, Duration::from_secs(15));
        assert!(flags.resume.grace.is_zero());
        assert_eq!(flags.resume.store, ResumeStore::Memory);
        assert_eq!(flags.resume.outage, streamgate::resume::DEFAULT_OUTAGE);
        assert_eq!(flags.listen.sndbuf, None);
        assert_eq!(flags.listen.max_connections, None);
        // `Default` is parsing no flag.
        let (gate, listen) = (GateFlags::default(), ListenFlags::default());
        assert_eq!(format!("{gate:?}"), format!("{:?}", flags.gate));
        assert_eq!(format!("{listen:?}"), format!("{:?}", flags.listen));
    }

    #[test]
    fn an_absurd_grace_and_a_shared_store_without_one_are_refused() {
        let day = MAX_RESUME_GRACE.as_millis().to_string();
        assert_eq!(
            Flags::parse_from(["test", "--resume-grace-ms", &day])
                .resume
                .grace,
            MAX_RESUME_GRACE
        );
        let more = (MAX_RESUME_GRACE.as_millis() + 1).to_string();
        for flag in ["--resume-grace-ms", "--resume-store-outage-ms"] {
            for absurd in [more.as_str(), "99999999999999999", "1.5"] {
                let parsed = Flags::try_parse_from(["test", flag, absurd]);
                let error = parsed.err().expect(absurd).to_string();
                assert!(error.contains(flag), "{error}");
            }
        }
        let store = ["test", "--resume-store", "redis://127.0.0.1:1"];
        let flags = Flags::parse_from(store);
        let refused = flags.resume.open::<String>(&flags.gate).err().unwrap();
        assert!(
            refused.contains("--resume-store") && refused.contains("--resume-grace-ms"),
            "{refused}"
        );
    }

    #[test]
    fn zero_leaves_the_os_setting() {
        let flags = Flags::parse_from(["test", "--notsent-lowat", "0", "--user-timeout-ms", "0"]);
        assert_eq!(flags.listen.notsent_lowat, 0);
        assert!(flags.listen.user_timeout.is_zero());
        assert!(Flags::try_parse_from(["test", "--buffer-events", "0"]).is_err());
        assert!(Flags::try_parse_from(["test", "--idle-timeout-ms", "0"]).is_err());
    }
}
