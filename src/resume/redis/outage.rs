//! Riding out Redis being away: a pump or a reader whose call failed for want of Redis (a
//! restart, a failover, a dropped connection) tries again, waiting longer each time, until the
//! registry's outage window has passed since the first failure; past it, the failure stands.

use std::time::Duration;

use redis::{RedisError, RedisResult, RetryMethod};
use tokio::time::Instant;

/// The first wait after a failure; it doubles each try, up to [`LONGEST_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(25);
const LONGEST_WAIT: Duration = Duration::from_millis(500);

/// One caller's outage: when it began, the next wait, and whether its last call went through
/// only after Redis had been away.
pub(crate) struct Outage {
    window: Duration,
    since: Option<Instant>,
    wait: Duration,
    recovered: bool,
    /// Since when the stream has been found missing right after an outage.
    missing_since: Option<Instant>,
    /// How many connections the instance had made when this caller's call last went through.
    made: Option<u64>,
}

/// How often a reader looks again for a stream missing right after an outage.
const MISSING_WAIT: Duration = Duration::from_millis(50);

impl Outage {
    /// No outage yet, one that may last up to `window`.
    pub(crate) fn new(window: Duration) -> Self {
        Outage {
            window,
            since: None,
            wait: FIRST_WAIT,
            recovered: false,
            missing_since: None,
            made: None,
        }
    }

    /// After `error`: how long to wait before trying again; `None` when the error is not Redis
    /// being away (a refused command, a script error) or the window has passed.
    pub(crate) fn retry(&mut self, error: &RedisError) -> Option<Duration> {
        if !away(error) {
            return None;
        }
        self.wait_within_window()
    }

    /// The next wait, if the window since the outage began has time left.
    fn wait_within_window(&mut self) -> Option<Duration> {
        let since = *self.since.get_or_insert_with(Instant::now);
        let left = self
            .window
            .checked_sub(since.elapsed())
            .filter(|left| !left.is_zero())?;
        let wait = self.wait.min(left);
        self.wait = (self.wait * 2).min(LONGEST_WAIT);
        Some(wait)
    }

    /// A call went through: the outage, if there was one, is over.
    pub(crate) fn over(&mut self) {
        self.recovered = self.since.is_some();
        self.since = None;
        self.wait = FIRST_WAIT;
    }

    /// Whether the last call went through only after Redis had been away, for this caller or
    /// for the instance's connection (which had made `made` connections by then, more than
    /// when this caller's call last went through: Redis restarted between two of its calls): a
    /// stream it finds missing was lost with Redis (it came back empty), not ended or taken
    /// away meanwhile.
    pub(crate) fn recovered(&self, made: u64) -> bool {
        self.recovered || self.made.is_some_and(|before| before != made)
    }

    /// The caller's call went through, and found its stream, with the instance's connection
    /// at `made` connections.
    pub(crate) fn went_through(&mut self, made: u64) {
        self.made = Some(made);
    }

    /// After a stream was found missing: how long to wait before looking again, if it was
    /// found so right after an outage (its pump may be about to give it back) and has been
    /// missing for less than the window; `None` otherwise (it is gone).
    pub(crate) fn retry_missing(&mut self, made: u64) -> Option<Duration> {
        if self.missing_since.is_none() && !self.recovered(made) {
            return None;
        }
        let since = *self.missing_since.get_or_insert_with(Instant::now);
        let left = self
            .window
            .checked_sub(since.elapsed())
            .filter(|left| !left.is_zero())?;
        Some(MISSING_WAIT.min(left))
    }

    /// The stream was found (again).
    pub(crate) fn found(&mut self) {
        self.missing_since = None;
    }

    /// Runs `call` until it goes through, trying again while Redis is away (at most the
    /// window); its last error, otherwise.
    pub(crate) async fn ride<T, F, Fut>(&mut self, mut call: F) -> RedisResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        loop {
            match call().await {
                Ok(value) => {
                    self.over();
                    return Ok(value);
                }
                Err(error) => match self.retry(&error) {
                    Some(wait) => tokio::time::sleep(wait).await,
                    None => return Err(error),
                },
            }
        }
    }
}

/// Whether `error` says Redis is away for now rather than that it refused the command: the
/// connection failed, was refused, dropped or timed out, or Redis is loading, has no master or
/// is a replica that cannot take writes (a failover under way).
pub(crate) fn away(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.is_unrecoverable_error()
        || matches!(error.retry_method(), RetryMethod::WaitAndRetry)
        || error.code() == Some("READONLY")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use redis::{ErrorKind, RedisError};

    use super::Outage;

    fn dropped() -> RedisError {
        let io = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        RedisError::from(io)
    }

    #[tokio::test(start_paused = true)]
    async fn an_outage_is_ridden_out_for_its_window_and_no_longer() {
        let mut outage = Outage::new(Duration::from_secs(1));
        let waits: Vec<Duration> = (0..3).map(|_| outage.retry(&dropped()).unwrap()).collect();
        assert_eq!(waits, [25, 50, 100].map(Duration::from_millis));
        tokio::time::advance(Duration::from_millis(990)).await;
        assert_eq!(
            outage.retry(&dropped()),
            Some(Duration::from_millis(10)),
            "what is left"
        );
        tokio::time::advance(Duration::from_millis(10)).await;
        assert_eq!(outage.retry(&dropped()), None, "past the window");
        outage.over();
        assert_eq!(
            outage.retry(&dropped()),
            Some(Duration::from_millis(25)),
            "a new outage"
        );
    }

    #[test]
    fn a_refused_command_is_not_an_outage() {
        let refused = RedisError::from((ErrorKind::Client, "refused"));
        assert_eq!(Outage::new(Duration::from_secs(1)).retry(&refused), None);
    }
}
