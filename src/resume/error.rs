//! What can go wrong with a registry: a claim refused, an attach refused, the store failing.

use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// The store the replay logs live in failed: the Redis of a [`Registry::redis`] did not answer
/// or refused a command. Its [`source`](Error::source) is the store's own error.
///
/// [`Registry::redis`]: super::Registry
#[derive(Clone)]
pub struct StoreError {
    source: Arc<dyn Error + Send + Sync + 'static>,
}

impl StoreError {
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn new(source: impl Error + Send + Sync + 'static) -> Self {
        StoreError {
            source: Arc::new(source),
        }
    }
}

impl fmt::Debug for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreError")
            .field("source", &self.source.to_string())
            .finish()
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the resume store failed")
    }
}

impl Error for StoreError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.source)
    }
}

/// Why a new stream could not claim its id ([`Registry::claim`](super::Registry::claim)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ClaimError {
    /// A stream with this id runs (here or, in Redis, on any instance), or is being started
    /// under a claim (an HTTP server answers 409).
    Running,
    /// A stream with this id finished and is retained for replay (409: the client can resume
    /// it instead).
    Retained,
    /// The store failed (503).
    Unavailable(StoreError),
}

impl fmt::Display for ClaimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClaimError::Running => f.write_str("a stream with this id is running"),
            ClaimError::Retained => {
                f.write_str("a stream with this id finished and is retained for its replay")
            }
            ClaimError::Unavailable(error) => fmt::Display::fmt(error, f),
        }
    }
}

impl Error for ClaimError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            ClaimError::Unavailable(error) => Some(error),
            _ => None,
        }
    }
}

/// Why a claimed stream could not be registered ([`Registry::register`](super::Registry::register)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RegisterError {
    /// The claim was made by another registry: it holds no id here.
    ForeignClaim,
    /// The store failed (503).
    Unavailable(StoreError),
}

impl fmt::Display for RegisterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegisterError::ForeignClaim => f.write_str("the claim was made by another registry"),
            RegisterError::Unavailable(error) => fmt::Display::fmt(error, f),
        }
    }
}

impl Error for RegisterError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            RegisterError::Unavailable(error) => Some(error),
            RegisterError::ForeignClaim => None,
        }
    }
}

/// Why a subscriber could not attach, or a stop found no stream.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AttachError {
    /// No stream has this id: it never existed, or it ended and its retention ran out (an HTTP
    /// server answers 404).
    Unknown,
    /// The log no longer holds the position asked for: it starts at `oldest` (409).
    Gone {
        /// The first event id the log can still replay.
        oldest: u64,
    },
    /// The stream has ended and has nothing after the position asked for: the client had
    /// everything (an HTTP server answers 204, which also stops an `EventSource` from
    /// reconnecting).
    Finished,
    /// The store failed (503).
    Unavailable(StoreError),
}

impl fmt::Display for AttachError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttachError::Unknown => f.write_str("no stream has this id"),
            AttachError::Gone { oldest } => write!(
                f,
                "the replay log no longer holds that position; it starts at event {oldest}"
            ),
            AttachError::Finished => {
                f.write_str("the stream has ended; nothing follows that position")
            }
            AttachError::Unavailable(error) => fmt::Display::fmt(error, f),
        }
    }
}

impl Error for AttachError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            AttachError::Unavailable(error) => Some(error),
            _ => None,
        }
    }
}

/// Why a stream could not be adopted (`Registry::adopt`, feature `redis`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AdoptError {
    /// No stream has this id (it never existed, or its keys expired).
    Unknown,
    /// A pump holds it: this process (a memory store's streams all run here), or an instance
    /// whose lease on it is valid. Ask again once the lease may have lapsed.
    Pumped,
    /// The stream has ended: nothing is left to carry on (its log replays as usual).
    Finished,
    /// The store failed.
    Unavailable(StoreError),
}

impl fmt::Display for AdoptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdoptError::Unknown => f.write_str("no stream has this id"),
            AdoptError::Pumped => f.write_str("the stream's pump is alive"),
            AdoptError::Finished => f.write_str("the stream has ended"),
            AdoptError::Unavailable(error) => fmt::Display::fmt(error, f),
        }
    }
}

impl Error for AdoptError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            AdoptError::Unavailable(error) => Some(error),
            _ => None,
        }
    }
}
