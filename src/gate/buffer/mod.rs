//! The bounded buffer between a generator and its consumer.
//!
//! A single-producer, single-consumer queue bounded by events *and* bytes, with in-place merging
//! for the `Coalesce` policy, event ids counted at `send`, a set-once end, and the state of the
//! slow-consumer clock that the gate's task keeps.
//!
//! One mutex guards the queue, the wakers, the end and the per-stream counters: a send takes it
//! once. The consumer takes it only when its own batch is empty, and then swaps *every* waiting
//! chunk into its batch at once, so a consumer that is behind drains a run of events per lock.
//! The batch stays counted against the bounds until the consumer has yielded it, so what the
//! gate holds never exceeds them; the consumer publishes its progress through two counters it
//! alone writes, which keeps the stats exact per event and lets it wake a sender that waits for
//! room the moment it yields an event.
//!
//! No foreign code runs under the lock except [`Chunk::merge`](crate::Chunk::merge). Built on
//! [`crate::sync`] so the same code is model-checked under loom.
//!
//! - `shared`: the [`Buffer`] itself, the lock and the wakers, and what each side does under it;
//! - `queue`: the chunks the gate holds (waiting, or lent to the consumer) and the ids they get;
//! - `progress`: the consumer's published progress, and its handshake with a waiting sender;
//! - `stall`: the slow-consumer clock;
//! - `end_state`: the producer's finish and the set-once end.

mod end_state;
mod progress;
mod queue;
mod shared;
mod stall;

pub(crate) use self::queue::Batch;
pub(crate) use self::shared::{Buffer, Config, Refused};
