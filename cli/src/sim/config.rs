//! `streamgate sim`'s flags: the contract's, as `examples/README.md` lists them.

use std::net::SocketAddr;
use std::time::Duration;

use crate::flags;
use crate::serve::ServeFlags;

/// `streamgate sim`: the reference server's flags.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
Endpoints (examples/README.md, \"The reference server\", says the rest):
  POST /v1/chat/completions     OpenAI chat completions: a chunk per token, [DONE]
  POST /v1/messages             Anthropic Messages: a text_delta per token
  POST /v1/responses            OpenAI Responses: an output_text.delta per token
  GET  /v1/chat/completions/{id}/stream, /v1/messages/{id}/stream
                                resume after Last-Event-ID (or ?after=N)
  GET  /v1/responses/{id}?stream=true&starting_after=N
                                resume after sequence number N
  POST /v1/{chat/completions,messages,responses}/{id}/cancel
                                stop a stream
  GET  /v1/stream?max_tokens=N  the chat events for EventSource
  GET  /stats, /metrics
Token i's text is \"t{i} \" in every API; every event's id: is its place in its stream.\
")]
pub struct Config {
    #[command(flatten)]
    pub serve: ServeFlags,
    /// Simulated decode step: one token every MS ms.
    #[arg(long = "step-ms", value_name = "MS", default_value = "5", value_parser = flags::millis_or_zero)]
    pub step: Duration,
    /// Before token N (0-based) the worker stalls (for `--stall-ms`, which it needs).
    #[arg(long, value_name = "N", requires = "stall")]
    pub stall_at: Option<u64>,
    /// How long the stall at `--stall-at` lasts, in ms (a decode-side stall; needs
    /// `--stall-at`).
    #[arg(long = "stall-ms", value_name = "MS", requires = "stall_at", value_parser = flags::millis_or_zero)]
    pub stall: Option<Duration>,
    /// Size of the simulated KV pool (one block per 16 tokens held by a live generator; at
    /// least 1).
    #[arg(long, value_name = "N", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..))]
    pub kv_blocks: u64,
    /// Token text becomes `t{i}.{salt} ` with a random salt per stream, so a regenerated
    /// stream can be told from a resumed one.
    #[arg(long)]
    pub token_salt: bool,
    /// The process dies abruptly (SIGKILL to itself: no shutdown frames, no hop records
    /// flushed) once any generation has made N new tokens: one decode step after its Nth, or
    /// before its final chunk if N is all it was asked for (0: a step into the first
    /// generation); for failover tests.
    #[arg(long, value_name = "N")]
    pub die_after: Option<u64>,
}

impl Config {
    /// The reference server's defaults, listening on `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        let mut config = Self::parse_from::<_, &str>([]).expect("the defaults parse");
        config.serve.addr = addr;
        config
    }

    /// Parses the contract's flags (`["--step-ms", "5", "--policy", "coalesce"]`, without a
    /// program name).
    pub fn parse_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        flags::parse_from("sim", args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The defaults `examples/README.md` promises ("The reference server"), whatever the
    /// library's constants they are taken from become.
    #[test]
    fn the_defaults_are_the_contracts() {
        let config = Config::parse_from::<_, &str>([]).unwrap();
        let ms = Duration::from_millis;
        assert_eq!(config.serve.addr, "127.0.0.1:8000".parse().unwrap());
        assert_eq!(config.step, ms(5));
        assert_eq!((config.stall_at, config.stall), (None, None));
        assert_eq!(config.serve.gate.buffer_events, 64);
        assert_eq!(config.serve.gate.buffer_bytes, 65536);
        assert_eq!(config.serve.gate.policy, flags::PolicyFlag::Backpressure);
        assert_eq!(config.serve.gate.slow_deadline, ms(10_000));
        assert_eq!(config.serve.gate.heartbeat, ms(15_000));
        assert_eq!(config.kv_blocks, 4096);
        assert_eq!(config.serve.listen.sndbuf, None);
        assert_eq!(config.serve.listen.notsent_lowat, 16384);
        assert_eq!(config.serve.listen.user_timeout, ms(20_000));
        assert_eq!(config.serve.listen.header_timeout, ms(10_000));
        assert_eq!(config.serve.listen.idle_timeout, ms(120_000));
        assert_eq!(config.serve.listen.max_connections, None);
        assert_eq!(config.serve.resume.grace, Duration::ZERO);
        assert_eq!(config.serve.resume.replay_bytes, 1_048_576);
        assert_eq!(config.serve.resume.store, flags::ResumeStore::Memory);
        assert!(!config.token_salt);
        assert_eq!(config.serve.hop_records, None);
        assert_eq!(config.serve.hop_records_sample.share, 1.0);
        assert!(!config.serve.no_prefill);
        assert_eq!(config.die_after, None);
    }

    /// A flag that cannot mean anything, or only half of a pair, is refused at start, naming
    /// the flag.
    #[test]
    fn contradictory_and_absurd_flags_are_refused_naming_them() {
        let refused = |args: &[&str]| Config::parse_from(args).expect_err("refused").to_string();
        for (args, named) in [
            (&["--stall-ms", "100"][..], "--stall-at"),
            (&["--stall-at", "3"][..], "--stall-ms"),
            (&["--kv-blocks", "0"][..], "--kv-blocks"),
            (&["--resume-grace-ms", "86400001"][..], "--resume-grace-ms"),
        ] {
            let error = refused(args);
            assert!(error.contains(named), "{args:?}: {error}");
        }
        let config = Config::parse_from(["--stall-at", "3", "--stall-ms", "0"]).unwrap();
        assert_eq!(
            (config.stall_at, config.stall),
            (Some(3), Some(Duration::ZERO))
        );
    }
}
