//! `streamgate sim`'s flags: the contract's, as `examples/README.md` lists them.

use std::net::SocketAddr;
use std::time::Duration;

use crate::flags;

/// `streamgate sim`: the reference server's flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Config {
    /// Where to listen (`127.0.0.1:0` picks a free port; the real one is printed).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub addr: SocketAddr,
    /// Simulated decode step: one token every MS ms.
    #[arg(long = "step-ms", value_name = "MS", default_value = "5", value_parser = flags::millis_or_zero)]
    pub step: Duration,
    /// Before token N (0-based) the worker stalls (for `--stall-ms`).
    #[arg(long, value_name = "N")]
    pub stall_at: Option<u64>,
    /// How long the stall at `--stall-at` lasts, in ms (a decode-side stall).
    #[arg(long = "stall-ms", value_name = "MS", default_value = "0", value_parser = flags::millis_or_zero)]
    pub stall: Duration,
    #[command(flatten)]
    pub gate: flags::GateFlags,
    /// Size of the simulated KV pool (one block per 16 tokens held by a live generator).
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub kv_blocks: u64,
    #[command(flatten)]
    pub listen: flags::ListenFlags,
    #[command(flatten)]
    pub resume: flags::ResumeFlags,
    /// Token text becomes `t{i}.{salt} ` with a random salt per stream, so a regenerated
    /// stream can be told from a resumed one.
    #[arg(long)]
    pub token_salt: bool,
    /// Write a hop record (a JSON line) for every event of every request at the hops
    /// `worker.decode`, `worker.publish`, `worker.write`, `worker.sent`, and one of kind `end`
    /// per stream; flushed at exit.
    #[arg(long, value_name = "FILE")]
    pub hop_records: Option<String>,
    #[command(flatten)]
    pub hop_records_sample: flags::RecordSample,
}

impl Config {
    /// The reference server's defaults, listening on `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        let mut config = Self::parse_from::<_, &str>([]).expect("the defaults parse");
        config.addr = addr;
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
