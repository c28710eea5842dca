//! Request ids: which client `x-request-id` may name a stream, and unguessable ids for the
//! requests that bring none.
//!
//! An id names a stream everywhere (the response's `x-request-id`, the resume and cancel paths,
//! every hop record), so anyone who knows it can read or stop the stream: a server's own ids
//! must not be guessable from another client's, and a client's must be safe in a header, a URL
//! path and a Redis key.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

use axum::http::HeaderMap;

/// The request id header, carried both ways.
pub const HEADER: &str = "x-request-id";

/// The longest id a client may give, in bytes.
pub const MAX_LEN: usize = 128;

/// Whether `id` may name a stream: 1 to [`MAX_LEN`] bytes of `A-Z a-z 0-9 . _ : -`.
pub fn is_valid(id: &str) -> bool {
    (1..=MAX_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// The client's `x-request-id`, if it [is valid](is_valid).
pub fn from_client(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(HEADER)
        .and_then(|value| value.to_str().ok())
        .filter(|id| is_valid(id))
}

/// A server's own ids: `{prefix}` and 32 hex digits, each drawn from a keyed hash (SipHash with
/// this process's random keys) of a counter, so none tells another.
#[derive(Debug)]
pub struct RequestIds {
    prefix: &'static str,
    keys: RandomState,
    next: AtomicU64,
}

impl RequestIds {
    /// Ids starting with `prefix` (`chatcmpl-`), with keys of their own.
    pub fn new(prefix: &'static str) -> Self {
        RequestIds {
            prefix,
            keys: RandomState::new(),
            next: AtomicU64::new(0),
        }
    }

    /// A new id, never given before by these ids, and [valid](is_valid) for a prefix of at
    /// most 96 bytes of the valid characters.
    pub fn next_id(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let (high, low) = (self.keys.hash_one((n, 0)), self.keys.hash_one((n, 1)));
        format!("{}{high:016x}{low:016x}", self.prefix)
    }

    /// A random number, as unguessable as the ids (a token salt, say).
    pub fn random(&self) -> u64 {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.keys.hash_one((n, 2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_valid_id_is_short_and_safe() {
        for id in ["a", "req-1", "A.b_c:d-9", &"x".repeat(MAX_LEN)] {
            assert!(is_valid(id), "{id}");
        }
        for id in [
            "",
            "has space",
            "a/b",
            "a%2F",
            "é",
            "a\"b",
            &"x".repeat(MAX_LEN + 1),
        ] {
            assert!(!is_valid(id), "{id}");
        }
        let mut headers = HeaderMap::new();
        headers.insert(HEADER, "tab/1".parse().unwrap());
        assert_eq!(from_client(&headers), None);
        headers.insert(HEADER, "tab-1".parse().unwrap());
        assert_eq!(from_client(&headers), Some("tab-1"));
    }

    #[test]
    fn own_ids_are_valid_and_distinct() {
        let ids = RequestIds::new("chatcmpl-");
        let (a, b) = (ids.next_id(), ids.next_id());
        assert_ne!(a, b);
        for id in [&a, &b] {
            assert!(is_valid(id) && id.len() == "chatcmpl-".len() + 32, "{id}");
        }
        // Other keys, other ids for the same counter.
        assert_ne!(RequestIds::new("chatcmpl-").next_id(), a);
        assert_ne!(ids.random(), ids.random());
    }
}
