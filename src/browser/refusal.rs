//! Why a page's batch of records was refused, as counted and as answered.

use std::fmt;

use axum::http::StatusCode;

/// Why a batch of a page's records was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// Larger than [`MAX_POST_BYTES`](super::MAX_POST_BYTES): 413.
    TooLarge,
    /// Not a batch of the page's records (unreadable, JSON, fields, hops, kinds): 400.
    Malformed,
    /// No token of this process for this request id: 403.
    BadToken,
    /// A token older than [`TOKEN_LIFETIME`](super::TOKEN_LIFETIME): 403.
    Expired,
    /// Past the rate shared by every page: 429.
    RateLimited,
    /// The record sink's queue is full (its writer is behind): 503, and nothing of the batch
    /// is written.
    SinkFull,
}

impl Refusal {
    /// Every refusal.
    pub const ALL: [Refusal; 6] = [
        Refusal::TooLarge,
        Refusal::Malformed,
        Refusal::BadToken,
        Refusal::Expired,
        Refusal::RateLimited,
        Refusal::SinkFull,
    ];

    /// Its name in counters: `too_large`, `malformed`, `bad_token`, `expired`,
    /// `rate_limited`, `sink_full`.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::TooLarge => "too_large",
            Refusal::Malformed => "malformed",
            Refusal::BadToken => "bad_token",
            Refusal::Expired => "expired",
            Refusal::RateLimited => "rate_limited",
            Refusal::SinkFull => "sink_full",
        }
    }

    /// The HTTP status a refused batch is answered with.
    pub fn status(self) -> StatusCode {
        match self {
            Refusal::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Refusal::Malformed => StatusCode::BAD_REQUEST,
            Refusal::BadToken | Refusal::Expired => StatusCode::FORBIDDEN,
            Refusal::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            Refusal::SinkFull => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::TooLarge => "the batch is too large",
            Refusal::Malformed => "not a batch of a page's records",
            Refusal::BadToken => "no token of this server for this request",
            Refusal::Expired => "the token has expired",
            Refusal::RateLimited => "too many records: try later",
            Refusal::SinkFull => "the server's records are behind: try later",
        })
    }
}

/// A refused batch: why, and what was wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Why, as counted.
    pub refusal: Refusal,
    /// What was wrong, for the page's developer (a field, a hop, a kind).
    pub detail: String,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.detail.is_empty() {
            write!(f, "{}", self.refusal)
        } else {
            write!(f, "{}: {}", self.refusal, self.detail)
        }
    }
}

impl std::error::Error for Refused {}

impl From<Refusal> for Refused {
    fn from(refusal: Refusal) -> Self {
        Refused {
            refusal,
            detail: String::new(),
        }
    }
}
