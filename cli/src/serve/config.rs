//! The flags every server on the serving code takes (`streamgate sim`, and an engine built on
//! it): where it listens, its gates, its resume store, its hop records, whether it takes a
//! prefill.

use std::net::SocketAddr;

use crate::flags;

/// The serving code's flags, shared by every server built on it (flatten them into its own).
#[derive(Debug, Clone, clap::Args)]
pub struct ServeFlags {
    /// Where to listen (`127.0.0.1:0` picks a free port; the real one is printed).
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub addr: SocketAddr,
    #[command(flatten)]
    pub gate: flags::GateFlags,
    #[command(flatten)]
    pub listen: flags::ListenFlags,
    #[command(flatten)]
    pub resume: flags::ResumeFlags,
    /// Write a hop record (a JSON line) for every event of every request at the hops
    /// `worker.decode`, `worker.publish`, `worker.write`, `worker.sent`, and one of kind `end`
    /// per stream; flushed at exit.
    #[arg(long, value_name = "FILE")]
    pub hop_records: Option<String>,
    #[command(flatten)]
    pub hop_records_sample: flags::RecordSample,
    /// Refuse a request whose last message is the assistant's (HTTP 400 mentioning prefill),
    /// as some hosted models do, instead of continuing that message.
    #[arg(long)]
    pub no_prefill: bool,
}
