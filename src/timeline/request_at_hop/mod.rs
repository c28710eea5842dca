//! One request at one hop: a compact state, updated record by record, whose size does not grow
//! with healthy records.
//!
//! A healthy stream (seqs without holes, no stall, no hidden phase) is the fixed fields alone
//! ([`RequestAtHop`], 144 bytes): the run of seqs seen, the last progress and visible records,
//! the end, a sketch of its short quiet spells, and its [`Flags`](flags::Flags). Holes in the
//! seqs (a coalescing hop, dropped records: a [`RangeSet`](range_set::RangeSet)), hidden
//! phases and stalls ([`Spell`]s) are *details*, kept in a box allocated only when a stream has
//! one, and counted against the timeline's detail budget. When the budget is spent, the stream
//! remembers from which seq on it knows less, and every answer that needs more says "unknown".
//!
//! After each stall that ends at a seq (at hops after the first), the stream also keeps a
//! *catch-up profile* ([`CatchUp`](catch_up::CatchUp), 104 bytes, two details): the highest
//! seq it recorded within 1, 1.5, 2, 3, 4, 6, ... 768 times the stall threshold after the
//! record that ended the stall, and how soon its end record came. The hop before it asks it
//! whether it was behind and caught up (see `blame`). A stream keeps at most `MAX_SPELLS`
//! stalls, so that judging one against the stalls of the hops beside it stays cheap (a binary
//! search while its stalls follow each other in seq order, as they do unless a resume went
//! back).

mod catch_up;
mod flags;
mod range_set;
mod spell;
mod state;

pub(super) use self::catch_up::{CATCH_UP_STEPS, catch_up_step};
pub(super) use self::spell::Spell;
pub(super) use self::state::{Ctx, Rec, RequestAtHop};
