//! Resumable streams in Redis Streams, so a client can resume through another instance of a
//! horizontally scaled server.
//!
//! The instance that runs a generator pumps its stream's encoded SSE frames into a Redis Stream;
//! subscribers on any instance read it from a position. Attachment, the explicit stop and the
//! logs live in Redis, so every instance sees them.
//!
//! ```text
//! generator -> gate -> sse -> pump --XADD--> [Redis Stream, bounded] --XRANGE, XREAD BLOCK-->
//!     subscriber (any instance) -> transport
//! ```
//!
//! Keys, for a stream `id` (`{id}` is a hash tag, so a cluster keeps them on one slot):
//!
//! - `streamgate:{id}:log`: the frames, a Redis Stream. Event `n` has the entry id `n-1`; the
//!   frames without an event id (the terminal `event: error` frame) and the end marker follow
//!   the last event as `n-2`, `n-3`. A `Last-Event-ID` of `n` reads the entries after `n-1`.
//! - `streamgate:{id}:meta`: a hash: `state` (`running` or `ended`), `start` (the first event id
//!   the log can replay), `stop` (set by an explicit stop).
//! - `streamgate:{id}:readers`: a sorted set of the attached subscribers, each scored by the
//!   expiry (Unix milliseconds) of a lease it renews while it lives.

mod keys;
mod pump;
mod registry;
mod subscriber;

pub use self::registry::{RedisRegistry, RegisterError};
pub use self::subscriber::RedisSubscriber;

use std::time::Duration;

/// How often a pump looks at its stream's readers and stop flag, and renews its keys' TTL.
const TICK: Duration = Duration::from_millis(100);
/// How long a subscriber's lease lasts; it renews it every [`LEASE_RENEWAL`].
const LEASE: Duration = Duration::from_secs(3);
const LEASE_RENEWAL: Duration = Duration::from_secs(1);
/// The TTL of a running stream's keys, renewed every tick: the keys of an instance that died
/// go away this long after it.
const RUNNING_TTL: Duration = Duration::from_secs(10);
/// The least a finished stream's keys are kept, so attached subscribers can read its tail.
const MIN_RETAIN: Duration = LEASE;
/// How long one `XREAD BLOCK` waits before a subscriber looks at its stream again.
const BLOCK: Duration = Duration::from_secs(1);
/// Entries read per `XRANGE`, and frames a subscriber holds before its reader waits.
const BATCH: usize = 64;
