//! The flags that configure a gate, shared by `sim` and `proxy`.

use std::time::Duration;

use clap::{Args, ValueEnum};

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

/// The gate between a generator (or an upstream) and one client.
#[derive(Debug, Clone, Args)]
pub struct GateFlags {
    /// Bounded buffer between generator and transport, in events.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = crate::flags::positive)]
    pub buffer_events: usize,
    /// The same buffer's byte bound.
    #[arg(long, value_name = "B", default_value_t = 65536, value_parser = crate::flags::positive)]
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

/// A positive number of milliseconds.
pub fn millis(value: &str) -> Result<Duration, String> {
    match value.parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(format!(
            "`{value}` is not a positive number of milliseconds"
        )),
    }
}

/// A number of milliseconds, 0 included.
pub fn millis_or_zero(value: &str) -> Result<Duration, String> {
    value
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| format!("`{value}` is not a number of milliseconds"))
}

impl Default for GateFlags {
    fn default() -> Self {
        GateFlags {
            buffer_events: 64,
            buffer_bytes: 65536,
            policy: PolicyFlag::Backpressure,
            slow_deadline: Duration::from_millis(10_000),
            heartbeat: Duration::from_millis(15_000),
        }
    }
}

impl GateFlags {
    /// A gate with these bounds and policy: the slow deadline ends a stream whose consumer
    /// took nothing from a full buffer for that long (`disconnect`), or whose generator was
    /// paused that long (`backpressure`, `coalesce`).
    pub fn gate(&self) -> streamgate::Gate {
        let pause = Some(self.slow_deadline);
        let policy = match self.policy {
            PolicyFlag::Coalesce => streamgate::Policy::Coalesce { max_pause: pause },
            PolicyFlag::Disconnect => streamgate::Policy::disconnect(self.slow_deadline),
            PolicyFlag::Backpressure => streamgate::Policy::Backpressure { max_pause: pause },
        };
        streamgate::Gate::new()
            .max_events(self.buffer_events)
            .max_bytes(self.buffer_bytes)
            .policy(policy)
            .stamp_events(true)
    }
}
