//! The Redis store: resumable streams in Redis Streams, so a client can resume (and stop) a
//! stream through any instance of a horizontally scaled server.
//!
//! The instance that runs a generator pumps its stream's encoded SSE frames into a Redis Stream
//! (`pump.rs`), its appends and looks grouped with every other pump's into one script call
//! (`batcher.rs`); readers on any instance read it from a position (`reader.rs`), those on the
//! pump's own instance from the tail it keeps in memory while it holds what they need
//! (`tail.rs`). Claims, attachment, positions, the explicit stop and the logs live in Redis, so
//! every instance sees them.
//!
//! ```text
//! generator -> gate -> sse -> pump -> batcher --XADD--> [Redis Stream, bounded]
//!                               |                           |
//!                               +-> tail (in memory)        +--XRANGE, XREAD BLOCK--+
//!                                     |                                             |
//!                                     reader (the pump's instance)   reader (any instance)
//!                                                   -> subscriber -> transport
//! ```
//!
//! Keys, for a stream `id` (`{id}` is a hash tag, so a cluster keeps them on one slot):
//!
//! - `streamgate:{id}:log`: the frames, a Redis Stream. Event `n` has the entry id `n-1`; the
//!   frames without an event id (the terminal `event: error` frame) and the end marker follow
//!   the last event as `n-2`, `n-3`. A `Last-Event-ID` of `n` reads the entries after `n-1`.
//! - `streamgate:{id}:meta`: a hash: `state` (`claimed`, `running` or `ended`), `claim` (the
//!   name of the claim whose pump runs the stream), `held` (while `claimed`: the claim's lease,
//!   its expiry in Unix milliseconds, renewed every 500 ms; once lapsed, another claim takes
//!   the id), `pump` (the pump's lease: its expiry in Unix milliseconds, renewed every fifth
//!   look), `request` (what the claim kept for an adopter),
//!   `start` (the first event id the log can replay), `end` (once ended: the id after the last
//!   event), `stop` (set by an explicit stop), `looks` (the pump's looks so far), and an
//!   `alias:{name}` field for each second name the stream was given (`Registry::alias`).
//! - `streamgate:{id}:readers`: a sorted set of the attached readers, each scored by the expiry
//!   (Unix milliseconds) of a lease it renews while it lives.
//! - `streamgate:{id}:positions`: a hash of the next event id each reader on another instance
//!   than the pump needs (the pump knows its own instance's readers' positions in memory).
//! - `streamgate:{id}:cut`: the readers on other instances that the pump cut off for holding
//!   the log back past their lag limit.
//! - `streamgate:alias:{name}`: the id of the stream last given the second name `name`, kept
//!   for the retention and an hour from then; it names the stream only while that stream's
//!   meta key has the name's field.
//!
//! A running stream whose pump's lease lapsed (its instance died) can be adopted by another
//! instance (`adopt.rs`): one atomic step makes it the claim's and the lease its own, and its
//! pump carries the stream on after the last logged event. Every append and the end are one
//! script that writes only while `claim` is the pump's own: the old pump, were it only stalled
//! (or its append still in flight), writes nothing once the stream was adopted, and stops at
//! its next look. (A stream missing from Redis altogether is made again by its pump only right
//! after an outage, see `outage.rs`.) Leases are on Redis's clock (`TIME`).
//!
//! Every key has a TTL: a running stream's are renewed by its pump every fifth look (a claimed
//! one's by its claim), so the keys of an instance that died go away 10 s after it; a finished
//! stream's last the retention (at least 3 s, so attached readers read its end). Redis away is
//! ridden out for the outage window (`outage.rs`): the stream pauses, and a Redis back empty
//! gets it again from its pump's next append. Past the window, a reader ends with an
//! `event: error` frame of type `resume_store_error` (a blocked read waits at most 2 s for an
//! answer), never a hang, and the pump cancels the generator as `ResumeStoreError` (nobody
//! can read what it makes). The shared connection (`connection.rs`) is made again at its next
//! use, and at once when it is found cut at its first use after Redis restarted.

mod adopt;
mod batcher;
mod claim;
mod connection;
mod keys;
mod logs;
mod outage;
mod pump;
mod reader;
mod shared;
mod tail;
mod timing;

pub(crate) use self::logs::RedisLogs;
pub(crate) use self::pump::Logged;
