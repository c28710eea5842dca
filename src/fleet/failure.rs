//! What went wrong with one attempt before its first event reached the client, and what that
//! says about trying again and about the upstream's health.

use std::fmt;
use std::time::Duration;

/// What went wrong with one attempt (one request to one upstream) before its first event
/// reached the client: nothing has been delivered, so another attempt is invisible to it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamgate::fleet::{ErrorCode, Failure, Retry, Scope};
///
/// let limited = Failure::status(429, Some(Duration::from_secs(2)), None);
/// assert_eq!(limited.retry(), Retry::AnyReplica);
/// assert_eq!(limited.scope(), Scope::Deployment); // the replica's other models are fine
///
/// let silent = Failure::HeadersTimeout;
/// assert_eq!(silent.retry(), Retry::OtherReplica); // never the same silent replica again
/// assert_eq!(silent.scope(), Scope::Replica);
///
/// let too_long = Failure::status(400, None, Some(ErrorCode::ContextLength));
/// assert_eq!(too_long.retry(), Retry::ContextFallback);
/// assert_eq!(Failure::status(401, None, None).retry(), Retry::Never);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failure {
    /// Connecting failed: refused, unreachable, no such host.
    Connect,
    /// Connecting took longer than its limit.
    ConnectTimeout,
    /// The upstream's TLS certificate was not trusted, or the handshake failed: never a reason
    /// to fall back to plain text.
    Tls,
    /// The connection broke before the response's headers (a reset, a close).
    Reset,
    /// No response headers within the deadline: a silent upstream.
    HeadersTimeout,
    /// The headers came, but no first event within the time-to-first-token limit.
    FirstEventTimeout,
    /// An error status.
    Status {
        /// The HTTP status.
        status: u16,
        /// How long its `Retry-After` asked to wait, if it said.
        retry_after: Option<Duration>,
        /// What its body said of the request, if it said something the classification knows.
        code: Option<ErrorCode>,
    },
}

/// What an error body said was wrong with the request itself (its `error.code` or `error.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// `context_length_exceeded`: the prompt (with `max_tokens`) does not fit the model's
    /// context; a model with a larger one might serve it.
    ContextLength,
    /// `content_policy_violation`: the content was refused.
    ContentPolicy,
    /// `invalid_request_error` and its kind (`invalid_parameter`, ...): the request is malformed.
    InvalidRequest,
}

impl ErrorCode {
    /// The code an error body's `error.code` or `error.type` names, if it is one of these.
    ///
    /// ```
    /// use streamgate::fleet::ErrorCode;
    ///
    /// assert_eq!(ErrorCode::from_body("context_length_exceeded"), Some(ErrorCode::ContextLength));
    /// assert_eq!(ErrorCode::from_body("server_error"), None);
    /// ```
    pub fn from_body(code: &str) -> Option<ErrorCode> {
        Some(match code {
            "context_length_exceeded" | "string_above_max_length" => ErrorCode::ContextLength,
            "content_policy_violation" | "content_filter" => ErrorCode::ContentPolicy,
            "invalid_request_error" | "invalid_parameter" | "invalid_value" | "invalid_request" => {
                ErrorCode::InvalidRequest
            }
            _ => return None,
        })
    }
}

/// Whether, and where, another attempt could succeed where one failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Never: another attempt cannot fix it (the request is the problem); pass it on.
    Never,
    /// Only on a configured larger-context fallback model.
    ContextFallback,
    /// On another replica (or a fallback), never the same replica.
    OtherReplica,
    /// On another replica, or the same one after a backoff when it is the only one.
    AnyReplica,
}

/// Whom a failure counts against, for health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The replica: it is down, and so are all its models.
    Replica,
    /// The deployment (the model on that replica): its other models are not affected.
    Deployment,
    /// Nobody: the request was the problem.
    Request,
}

/// A failure's cause, as a closed set for counters and labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Cause {
    /// [`Failure::Connect`].
    Connect,
    /// [`Failure::ConnectTimeout`].
    ConnectTimeout,
    /// [`Failure::Tls`].
    Tls,
    /// [`Failure::Reset`].
    Reset,
    /// [`Failure::HeadersTimeout`].
    HeadersTimeout,
    /// [`Failure::FirstEventTimeout`].
    FirstEventTimeout,
    /// A 429.
    RateLimited,
    /// A 503.
    Unavailable,
    /// Another 5xx.
    ServerError,
    /// A 4xx but 429: the request's fault.
    RequestError,
}

impl Cause {
    /// Every cause, in the order of [`index`](Cause::index).
    pub const ALL: [Cause; 10] = [
        Cause::Connect,
        Cause::ConnectTimeout,
        Cause::Tls,
        Cause::Reset,
        Cause::HeadersTimeout,
        Cause::FirstEventTimeout,
        Cause::RateLimited,
        Cause::Unavailable,
        Cause::ServerError,
        Cause::RequestError,
    ];

    /// Its label: `connect`, `connect_timeout`, `tls`, `reset`, `headers_timeout`,
    /// `first_event_timeout`, `rate_limited`, `unavailable`, `server_error`, `request_error`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Cause::Connect => "connect",
            Cause::ConnectTimeout => "connect_timeout",
            Cause::Tls => "tls",
            Cause::Reset => "reset",
            Cause::HeadersTimeout => "headers_timeout",
            Cause::FirstEventTimeout => "first_event_timeout",
            Cause::RateLimited => "rate_limited",
            Cause::Unavailable => "unavailable",
            Cause::ServerError => "server_error",
            Cause::RequestError => "request_error",
        }
    }

    /// Its position in [`ALL`](Cause::ALL): an index into a table of counters.
    pub const fn index(self) -> usize {
        // Declared in the order of `ALL` (checked by a test).
        self as usize
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Failure {
    /// An error status with what its `Retry-After` and its body said.
    pub fn status(status: u16, retry_after: Option<Duration>, code: Option<ErrorCode>) -> Self {
        Failure::Status {
            status,
            retry_after,
            code,
        }
    }

    /// Whether, and where, another attempt could succeed.
    ///
    /// Connecting, a reset before the headers, a 429, a 503 and any other 5xx are worth
    /// another attempt, on the same replica after a backoff when it is the only one (a one-off
    /// fault); a silent upstream (no headers, or no first event, in time) and a TLS failure
    /// only elsewhere. A 4xx but 429 is the request's: never, except that a
    /// `context_length_exceeded` may go to a larger-context fallback. A body code that says
    /// the request itself is the problem wins over any status.
    pub fn retry(&self) -> Retry {
        match self {
            Failure::Connect | Failure::ConnectTimeout | Failure::Reset => Retry::AnyReplica,
            Failure::Tls | Failure::HeadersTimeout | Failure::FirstEventTimeout => {
                Retry::OtherReplica
            }
            Failure::Status { status, code, .. } => match (code, status) {
                (Some(ErrorCode::ContextLength), _) => Retry::ContextFallback,
                (Some(_), _) => Retry::Never,
                (None, 429) | (None, 500..=599) => Retry::AnyReplica,
                (None, _) => Retry::Never,
            },
        }
    }

    /// Whom the failure counts against: a replica that cannot be reached or says nothing is
    /// down for every model; an error status is its deployment's (a 429 or 503 from one
    /// model's rate limiter must not eject the replica's other models); the request's own
    /// faults count against nobody.
    pub fn scope(&self) -> Scope {
        match self {
            Failure::Connect
            | Failure::ConnectTimeout
            | Failure::Tls
            | Failure::Reset
            | Failure::HeadersTimeout => Scope::Replica,
            Failure::FirstEventTimeout => Scope::Deployment,
            Failure::Status { status, code, .. } => match (code, status) {
                (Some(_), _) => Scope::Request,
                (None, 429) | (None, 500..=599) => Scope::Deployment,
                (None, _) => Scope::Request,
            },
        }
    }

    /// Its cause, for counters.
    pub fn cause(&self) -> Cause {
        match self {
            Failure::Connect => Cause::Connect,
            Failure::ConnectTimeout => Cause::ConnectTimeout,
            Failure::Tls => Cause::Tls,
            Failure::Reset => Cause::Reset,
            Failure::HeadersTimeout => Cause::HeadersTimeout,
            Failure::FirstEventTimeout => Cause::FirstEventTimeout,
            Failure::Status { status: 429, .. } => Cause::RateLimited,
            Failure::Status { status: 503, .. } => Cause::Unavailable,
            Failure::Status {
                status: 500..=599, ..
            } => Cause::ServerError,
            Failure::Status { .. } => Cause::RequestError,
        }
    }

    /// How long the upstream asked to wait before another attempt, if it said.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Failure::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether it was a rate limit (429) or an overload (503): the replica must not see
    /// another attempt of this request within its spacing, unless `Retry-After` said sooner.
    pub fn is_throttle(&self) -> bool {
        matches!(
            self,
            Failure::Status {
                status: 429 | 503,
                ..
            }
        )
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Connect => f.write_str("the upstream could not be reached"),
            Failure::ConnectTimeout => f.write_str("connecting to the upstream timed out"),
            Failure::Tls => f.write_str("the upstream's certificate was not trusted"),
            Failure::Reset => f.write_str("the upstream closed the connection before answering"),
            Failure::HeadersTimeout => f.write_str("the upstream sent no response headers in time"),
            Failure::FirstEventTimeout => f.write_str("the upstream sent no first event in time"),
            Failure::Status { status, .. } => write!(f, "the upstream answered {status}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cause_has_its_own_index_and_label() {
        for (at, cause) in Cause::ALL.into_iter().enumerate() {
            assert_eq!(cause.index(), at);
        }
        let mut labels: Vec<_> = Cause::ALL.iter().map(|c| c.as_str()).collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Cause::ALL.len());
    }

    #[test]
    fn the_request_s_own_faults_are_never_retried_and_count_against_nobody() {
        for status in [400, 401, 403, 404, 408, 409, 413, 422] {
            let failure = Failure::status(status, None, None);
            assert_eq!(failure.retry(), Retry::Never, "{status}");
            assert_eq!(failure.scope(), Scope::Request, "{status}");
            assert_eq!(failure.cause(), Cause::RequestError, "{status}");
        }
        // A body that says the request is the problem wins over a status that would be
        // retried.
        let refused = Failure::status(500, None, Some(ErrorCode::ContentPolicy));
        assert_eq!(
            (refused.retry(), refused.scope()),
            (Retry::Never, Scope::Request)
        );
        let invalid = Failure::status(503, None, Some(ErrorCode::InvalidRequest));
        assert_eq!(invalid.retry(), Retry::Never);
        let long = Failure::status(400, None, Some(ErrorCode::ContextLength));
        assert_eq!(
            (long.retry(), long.scope()),
            (Retry::ContextFallback, Scope::Request)
        );
    }

    #[test]
    fn transient_faults_are_retried_and_counted_where_they_belong() {
        for status in [429, 500, 502, 503, 504] {
            let failure = Failure::status(status, None, None);
            assert_eq!(failure.retry(), Retry::AnyReplica, "{status}");
            assert_eq!(failure.scope(), Scope::Deployment, "{status}");
        }
        for failure in [Failure::Connect, Failure::ConnectTimeout, Failure::Reset] {
            assert_eq!(failure.retry(), Retry::AnyReplica, "{failure}");
            assert_eq!(failure.scope(), Scope::Replica, "{failure}");
        }
        for failure in [Failure::HeadersTimeout, Failure::Tls] {
            assert_eq!(failure.retry(), Retry::OtherReplica, "{failure}");
            assert_eq!(failure.scope(), Scope::Replica, "{failure}");
        }
        assert_eq!(Failure::FirstEventTimeout.retry(), Retry::OtherReplica);
        assert_eq!(Failure::FirstEventTimeout.scope(), Scope::Deployment);
        assert!(Failure::status(503, None, None).is_throttle());
        assert!(!Failure::status(500, None, None).is_throttle());
    }
}
