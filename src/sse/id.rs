//! Event ids as the crate writes them: the event's id, and its kind when it is not visible.

use std::fmt;

use crate::chunk::Kind;

/// An SSE event id as this crate writes it ([`EncodeSse::with_ids`](super::EncodeSse::with_ids)):
/// the event's id ([`Event::id`](crate::Event::id)) in decimal, followed by `h` for a hidden
/// event or `c` for a control one.
///
/// The suffix carries the event's kind across a hop that decodes the stream (a gateway): the
/// decoder marks an event whose id ends in `h` hidden and one ending in `c` control, so the
/// gateway's own probes, gate and encoder see each event under the same id and kind as the
/// hop that encoded it. Clients ignore it; a reconnecting client sends the id back as
/// `Last-Event-ID`, which [`parse`](EventId::parse) reads.
///
/// # Examples
///
/// ```
/// use streamgate::Kind;
/// use streamgate::sse::EventId;
///
/// assert_eq!(EventId::new(41, Kind::Visible).to_string(), "41");
/// assert_eq!(EventId::new(42, Kind::Hidden).to_string(), "42h");
/// let id = EventId::parse("43c").unwrap();
/// assert_eq!((id.seq(), id.kind()), (43, Kind::Control));
/// assert_eq!(EventId::parse("+43"), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventId {
    seq: u64,
    kind: Kind,
}

impl EventId {
    /// The id of event `seq`, of `kind`.
    pub fn new(seq: u64, kind: Kind) -> Self {
        EventId { seq, kind }
    }

    /// Reads an id written by this crate (or a plain decimal one, as visible): ASCII digits
    /// that fit a `u64`, then at most one `h` or `c`. Anything else is `None`.
    pub fn parse(text: &str) -> Option<EventId> {
        let (digits, kind) = match text.as_bytes().last()? {
            b'h' => (&text[..text.len() - 1], Kind::Hidden),
            b'c' => (&text[..text.len() - 1], Kind::Control),
            _ => (text, Kind::Visible),
        };
        if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
            return None;
        }
        Some(EventId {
            seq: digits.parse().ok()?,
            kind,
        })
    }

    /// The event's id: the position of its (last) chunk in the generator's output.
    pub fn seq(self) -> u64 {
        self.seq
    }

    /// How the event counts for progress.
    pub fn kind(self) -> Kind {
        self.kind
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Kind::Visible => write!(f, "{}", self.seq),
            Kind::Hidden => write!(f, "{}h", self.seq),
            Kind::Control => write!(f, "{}c", self.seq),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_refuse_anything_else() {
        for kind in [Kind::Visible, Kind::Hidden, Kind::Control] {
            for seq in [0, 7, u64::MAX] {
                let id = EventId::new(seq, kind);
                assert_eq!(EventId::parse(&id.to_string()), Some(id));
            }
        }
        for bad in [
            "",
            "h",
            "c",
            "1hh",
            "1x",
            "-1",
            "+1",
            " 1",
            "1 ",
            "18446744073709551616",
            "٣",
        ] {
            assert_eq!(EventId::parse(bad), None, "{bad:?}");
        }
    }
}
