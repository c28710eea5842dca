//! What the gate needs to know about an item: its size, whether a user sees it, and whether it
//! can absorb the item after it without losing anything.

use bytes::{Bytes, BytesMut};

/// How an event counts for progress, as a user sees it.
///
/// Gap counters measure time between *visible* events; a reasoning phase of hidden events is
/// alive but no user-visible progress, and control events (heartbeats, terminal frames) are
/// transport housekeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Output the user sees (a text delta, a tool-call delta).
    Visible,
    /// Output produced by the model that is not shown (a hidden reasoning delta).
    Hidden,
    /// Housekeeping that carries no model output (a heartbeat comment, an end frame).
    Control,
}

impl Kind {
    /// The lowercase name used in hop records and metric labels: `visible`, `hidden`, `control`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Visible => "visible",
            Kind::Hidden => "hidden",
            Kind::Control => "control",
        }
    }
}

/// One item a generator yields: a token delta, a tool-call delta, a control event.
///
/// The gate uses [`byte_len`](Chunk::byte_len) for its byte bound and counters,
/// [`kind`](Chunk::kind) for the gap counters, and [`merge`](Chunk::merge) for the
/// [`Coalesce`](crate::Policy::Coalesce) policy.
///
/// # Examples
///
/// A chunk type whose text deltas merge, and whose end marker never does:
///
/// ```
/// use streamgate::{Chunk, Kind};
///
/// enum Delta {
///     Text(String),
///     Finish,
/// }
///
/// impl Chunk for Delta {
///     fn byte_len(&self) -> usize {
///         match self {
///             Delta::Text(text) => text.len(),
///             Delta::Finish => 0,
///         }
///     }
///
///     fn kind(&self) -> Kind {
///         match self {
///             Delta::Text(_) => Kind::Visible,
///             Delta::Finish => Kind::Control,
///         }
///     }
///
///     fn merge(&mut self, next: Self) -> Result<(), Self> {
///         match (self, next) {
///             (Delta::Text(text), Delta::Text(more)) => {
///                 text.push_str(&more);
///                 Ok(())
///             }
///             (_, next) => Err(next),
///         }
///     }
/// }
///
/// let mut a = Delta::Text("Hel".into());
/// assert!(a.merge(Delta::Text("lo".into())).is_ok());
/// assert_eq!(a.byte_len(), 5);
/// assert!(a.merge(Delta::Finish).is_err());
/// ```
pub trait Chunk: Sized {
    /// The number of payload bytes this chunk holds, as counted against the gate's byte bound.
    fn byte_len(&self) -> usize;

    /// How this chunk counts for progress. Defaults to [`Kind::Visible`].
    fn kind(&self) -> Kind {
        Kind::Visible
    }

    /// Merges `next`, the chunk that follows `self`, into `self` without losing anything a
    /// consumer would see, or hands `next` back unchanged when the two cannot merge.
    ///
    /// A merge must not grow the byte length past the sum of the two lengths. The default never
    /// merges.
    fn merge(&mut self, next: Self) -> Result<(), Self> {
        Err(next)
    }
}

impl Chunk for Bytes {
    fn byte_len(&self) -> usize {
        self.len()
    }

    /// Concatenates the two buffers, in place when `self` is the only handle to its memory, so
    /// merging a run of chunks one by one costs time linear in their total length.
    fn merge(&mut self, next: Self) -> Result<(), Self> {
        if self.is_empty() {
            *self = next;
        } else if !next.is_empty() {
            let mut joined = std::mem::take(self)
                .try_into_mut()
                .unwrap_or_else(|shared| {
                    let mut copy = BytesMut::with_capacity(shared.len() + next.len());
                    copy.extend_from_slice(&shared);
                    copy
                });
            joined.extend_from_slice(&next);
            *self = joined.freeze();
        }
        Ok(())
    }
}

impl Chunk for String {
    fn byte_len(&self) -> usize {
        self.len()
    }

    /// Appends `next`.
    fn merge(&mut self, next: Self) -> Result<(), Self> {
        self.push_str(&next);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_merge_concatenates() {
        let mut a = Bytes::from_static(b"ab");
        a.merge(Bytes::from_static(b"cd")).unwrap();
        assert_eq!(a, "abcd");
        let mut empty = Bytes::new();
        empty.merge(Bytes::from_static(b"x")).unwrap();
        assert_eq!(empty, "x");
        assert_eq!(empty.byte_len(), 1);
        assert_eq!(empty.kind(), Kind::Visible);
    }

    #[test]
    fn string_merge_appends() {
        let mut a = String::from("t1 ");
        a.merge("t2 ".to_owned()).unwrap();
        assert_eq!(a, "t1 t2 ");
        assert_eq!(a.byte_len(), 6);
    }
}
