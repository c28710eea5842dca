//! How often a Redis store's pumps and readers look, how long their leases and keys live,
//! and how much a reader takes at a time.

use std::time::Duration;

/// How often a pump looks at its stream's readers and stop flag; how often a reader on another
/// instance writes its position when it moved.
pub(super) const TICK: Duration = Duration::from_millis(100);
/// How long a reader's lease lasts; it renews it every [`LEASE_RENEWAL`].
pub(super) const LEASE: Duration = Duration::from_secs(3);
pub(super) const LEASE_RENEWAL: Duration = Duration::from_secs(1);
/// How long a pump's lease on its stream lasts; it renews it every [`RENEWAL`]. A stream whose
/// pump's lease lapsed (its instance died) can be adopted by another instance.
pub(super) const PUMP_LEASE: Duration = Duration::from_secs(2);
/// How often a pump renews its lease and its keys' TTL: a few times per lease, so a pump a
/// little late to its look keeps both.
pub(super) const RENEWAL: Duration = Duration::from_millis(500);
/// The TTL of a running (or claimed) stream's keys, renewed while it runs: the keys of an
/// instance that died go away this long after it.
pub(super) const RUNNING_TTL: Duration = Duration::from_secs(10);
/// How long a stream's second name's own key is kept beyond the retention, from when it was
/// given (the stream's meta key says it has the name while the stream is kept; past either,
/// the name resolves to nothing).
pub(super) const ALIAS_TTL: Duration = Duration::from_secs(60 * 60);
/// The least a finished stream's keys are kept, so attached readers can read its tail.
pub(super) const MIN_RETAIN: Duration = LEASE;
/// How long one `XREAD BLOCK` waits before a reader looks at its stream again.
pub(super) const BLOCK: Duration = Duration::from_secs(1);
/// Entries read per `XRANGE`, and frames a reader holds before it waits for its subscriber.
pub(super) const BATCH: usize = 64;
