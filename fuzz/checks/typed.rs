//! What the checks of the formats whose events name their type (`anthropic.rs`,
//! `responses.rs`) share: reading an input as events, their round trip, and the merge of two.

// Each includer uses a part.
#![allow(dead_code, unused_imports)]

use std::fmt::Debug;

use serde_json::Value;
use streamgate::Chunk;
use streamgate::sse::SseEvent;

/// One format's events, as the checks need them.
pub trait Typed: Chunk + Clone + PartialEq + Debug + Into<SseEvent> {
    /// The event `sse` is, if it reads.
    fn read(sse: &SseEvent) -> Result<Self, Box<dyn std::error::Error>>;

    /// Its type, as its data's JSON names it.
    fn event_type(&self) -> &str;

    /// Whether it is of a type the format's module does not know.
    fn is_unknown(&self) -> bool;

    /// The events after which any event of the format may come: a stream's start, an item or
    /// block of each kind.
    fn preamble() -> Vec<Self>;

    /// What a client of the format's SDK gets from `events`.
    fn accumulate(events: &[Self]) -> Value;
}

/// What one input made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    /// Fewer than two events read.
    Single,
    /// Two events, of which the second merged into the first.
    Merged,
    /// Two events that stayed two.
    Refused,
}

/// The input is one event, or two cut at the first `0xFF`; each is its SSE `event:` up to the
/// first LF (none if empty), then its data. Reading never panics; each event read round-trips
/// ([`check_round_trip`]); two events either merge ([`check_merge`]) or stay as they were.
pub fn check_event<E: Typed>(input: &[u8]) -> Outcome {
    let mut parts = input.splitn(2, |&byte| byte == 0xFF);
    let first = parts.next().and_then(|part| read_stable::<E>(part, 7));
    let second = parts.next().and_then(|part| read_stable::<E>(part, 8));
    match (first, second) {
        (Some(first), Some(second)) if check_merge(&first, &second) => Outcome::Merged,
        (Some(_), Some(_)) => Outcome::Refused,
        _ => Outcome::Single,
    }
}

/// The SSE event an input part describes, with `id`.
pub fn sse_of(part: &[u8], id: u64) -> Option<SseEvent> {
    let text = String::from_utf8_lossy(part);
    let (kind, data) = text.split_once('\n').unwrap_or(("", &text));
    let event = SseEvent::data(data).with_id(id.to_string()).ok()?;
    match kind {
        "" => Some(event),
        kind => event.with_event(kind).ok(),
    }
}

/// Reads an input part as an event, checking its round trip.
fn read_stable<E: Typed>(part: &[u8], id: u64) -> Option<E> {
    let event = E::read(&sse_of(part, id)?).ok()?;
    check_round_trip(&event);
    Some(event)
}

/// What `input` reaches: the type of each event read (`unknown` for one of a type the module
/// does not know, `invalid` for a known type whose data is not that event), and whether two
/// events `merged` or were `refused`.
pub fn reach<E: Typed>(input: &[u8]) -> Vec<String> {
    let mut reached: Vec<String> = input
        .splitn(2, |&byte| byte == 0xFF)
        .filter_map(|part| sse_of(part, 0))
        .map(|sse| match E::read(&sse) {
            Ok(event) if event.is_unknown() => "unknown".to_owned(),
            Ok(event) => event.event_type().to_owned(),
            Err(_) => "invalid".to_owned(),
        })
        .collect();
    match check_event::<E>(input) {
        Outcome::Merged => reached.push("merged".to_owned()),
        Outcome::Refused => reached.push("refused".to_owned()),
        Outcome::Single => {}
    }
    reached
}

/// `event` encodes to an SSE event of its `byte_len`, of its type (`message` for an unknown
/// event that had none), that reads back as the same event and encodes the same again.
pub fn check_round_trip<E: Typed>(event: &E) {
    let sse: SseEvent = event.clone().into();
    assert_eq!(event.byte_len(), sse.byte_len(), "{event:?}");
    assert_eq!(sse.event_type(), event.event_type(), "{event:?}");
    let again = E::read(&sse).expect("an encoded event reads");
    assert_eq!(&again, event);
    assert_eq!(again.into(), sse);
}

/// Merges `next` into `first`: a refusal hands `next` back and leaves `first` as it was; a
/// merge is no longer than the two, round-trips, and accumulates (after the format's preamble)
/// to the same as the two. Returns whether they merged.
pub fn check_merge<E: Typed>(first: &E, next: &E) -> bool {
    let mut merged = first.clone();
    match merged.merge(next.clone()) {
        Ok(()) => {
            assert!(merged.byte_len() <= first.byte_len() + next.byte_len());
            check_round_trip(&merged);
            let mut apart = E::preamble();
            apart.extend([first.clone(), next.clone()]);
            let mut together = E::preamble();
            together.push(merged);
            assert_eq!(E::accumulate(&together), E::accumulate(&apart));
            true
        }
        Err(back) => {
            assert_eq!((&merged, &back), (first, next));
            false
        }
    }
}

/// The entry points of one format's checks, in its checks file (`anthropic.rs`,
/// `responses.rs`): `reach`, `check_event` (documented by the lines before the event type), and
/// [`Typed`] for the event type `$event`, whose data type `$data` has an `Unknown` variant, by
/// the file's own `preamble` and `accumulate`.
macro_rules! format_checks {
    ($(#[$doc:meta])* $event:ident, $data:ident) => {
        pub use typed::{Outcome, check_merge, check_round_trip};

        /// What an input reaches (see `typed::reach`).
        pub fn reach(input: &[u8]) -> Vec<String> {
            typed::reach::<$event>(input)
        }

        $(#[$doc])*
        pub fn check_event(input: &[u8]) -> Outcome {
            typed::check_event::<$event>(input)
        }

        impl typed::Typed for $event {
            fn read(sse: &SseEvent) -> Result<Self, Box<dyn std::error::Error>> {
                Ok($event::from_sse(sse)?)
            }

            fn is_unknown(&self) -> bool {
                matches!(self.data(), $data::Unknown(_))
            }

            fn event_type(&self) -> &str {
                self.data().event_type()
            }

            fn preamble() -> Vec<Self> {
                preamble()
            }

            fn accumulate(events: &[Self]) -> Value {
                accumulate(events)
            }
        }
    };
}

pub(crate) use format_checks;
