//! The attempts of one request before its first event: retries on other replicas or the same
//! one after a backoff, `Retry-After`, fallback models, within a bounded number and time.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::failure::{Failure, Retry};
use super::random::Random;

/// How many attempts a request may make, in how long, and how they are spaced.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamgate::fleet::AttemptOptions;
///
/// let options = AttemptOptions::default()
///     .max_attempts(3)
///     .deadline(Duration::from_secs(30))
///     .backoff(Duration::from_millis(100), Duration::from_secs(2))
///     .throttle_spacing(Duration::from_secs(1));
/// assert_eq!(options, AttemptOptions::default());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptOptions {
    pub(crate) max_attempts: u32,
    pub(crate) deadline: Duration,
    pub(crate) backoff: Duration,
    pub(crate) max_backoff: Duration,
    pub(crate) throttle_spacing: Duration,
}

impl AttemptOptions {
    /// The most attempts per request, the first included (zero counts as one). Default 3.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// The time from the first attempt after which no other is started. Default 30 s.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The wait before retrying the same replica, doubling with each retry up to `max`, with
    /// jitter (between half and all of it). Default 100 ms, up to 2 s.
    pub fn backoff(mut self, first: Duration, max: Duration) -> Self {
        self.backoff = first;
        self.max_backoff = max;
        self
    }

    /// The least time between two attempts of a request on a replica that answered 429 or
    /// 503, unless its `Retry-After` said sooner. Default 1 s.
    pub fn throttle_spacing(mut self, spacing: Duration) -> Self {
        self.throttle_spacing = spacing;
        self
    }
}

impl Default for AttemptOptions {
    fn default() -> Self {
        AttemptOptions {
            max_attempts: 3,
            deadline: Duration::from_secs(30),
            backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
            throttle_spacing: Duration::from_secs(1),
        }
    }
}

/// What to do after an attempt failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Try again on the same model, after `after`: pick with [`Attempts::avoid`] (the replica
    /// that failed is in it unless it may be tried again).
    Retry {
        /// How long to wait first.
        after: Duration,
    },
    /// Try the fallback model [`Attempts::model`] now names, after `after`, in its own pool.
    Fallback {
        /// How long to wait first.
        after: Duration,
    },
    /// No other attempt: pass the last failure on to the client.
    GiveUp,
}

/// The attempts of one request before its first event reached the client: nothing has been
/// delivered, so a retry is invisible to it. It says which model the next attempt asks for and
/// which replicas it avoids; after each failure, [`failed`](Attempts::failed) says whether and
/// when to try again, here or on a fallback.
///
/// - A failure that another attempt cannot fix ([`Retry::Never`]) gives up at once; a
///   `context_length_exceeded` goes only to a context fallback.
/// - Another replica is tried first; then a fallback; the same replica again only for a fault
///   worth retrying there ([`Retry::AnyReplica`]), after a backoff with jitter: once before the
///   fallback when it is its pool's only replica (a one-off 500 or reset), and as long as the
///   budget lasts when no fallback is left. Never a silent one.
/// - A replica that answered 429 or 503 is not asked again by this request within the throttle
///   spacing (spread over up to half as long again), unless its `Retry-After` said sooner; a `Retry-After` beyond the time left is not
///   waited for (a fallback is tried instead, or the request gives up).
/// - When the model's replicas are used up, the next fallback model is tried (in its own
///   pool, with every replica to pick from again); then the request gives up.
/// - Never more than `max_attempts` attempts, and none started after the deadline.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamgate::fleet::{AttemptOptions, Attempts, Failure, Next, Pool};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let pool = Pool::new(["http://10.0.0.1:8000", "http://10.0.0.2:8000"]);
/// let mut attempts = Attempts::new("big", AttemptOptions::default()).fallbacks(["small"]);
/// loop {
///     let Some(mut lease) = pool.pick(attempts.model(), attempts.avoid()) else {
///         break; // nothing left to try (`no_replica` says whether a fallback is)
///     };
///     // ... send the request to `lease.replica()`; here every replica resets.
///     let failure = Failure::Reset;
///     lease.failed(&failure);
///     match attempts.failed(lease.index(), &failure, pool.len()) {
///         Next::Retry { after } | Next::Fallback { after } => tokio::time::sleep(after).await,
///         Next::GiveUp => break,
///     }
/// }
/// assert_eq!(attempts.made(), 3, "two replicas of `big`, then one of `small`");
/// assert_eq!(attempts.model(), "small");
/// # }
/// ```
#[derive(Debug)]
pub struct Attempts {
    options: AttemptOptions,
    started: Instant,
    made: u32,
    /// The requested model, then its fallbacks, in order.
    models: Vec<Arc<str>>,
    /// The larger-context fallbacks, for a `context_length_exceeded`.
    context_models: Vec<Arc<str>>,
    /// Where the next attempt's model is in `models` (or in `context_models`, once switched).
    at: usize,
    on_context: bool,
    /// The replicas of the current model's pool not to pick again.
    avoid: Vec<usize>,
    /// Retries of the same replica so far, for the backoff.
    same: u32,
    random: Random,
}

impl Attempts {
    /// The attempts of a request for `model`.
    pub fn new(model: &str, options: AttemptOptions) -> Self {
        Attempts {
            options,
            started: Instant::now(),
            made: 0,
            models: vec![model.into()],
            context_models: Vec::new(),
            at: 0,
            on_context: false,
            avoid: Vec::new(),
            same: 0,
            random: Random::new(),
        }
    }

    /// The models to fall back to, in order, when `model`'s pool cannot serve the request.
    pub fn fallbacks<I, S>(mut self, models: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.models
            .extend(models.into_iter().map(|model| model.as_ref().into()));
        self
    }

    /// The larger-context models to try, in order, when an upstream says the request does not
    /// fit its context (and only then).
    pub fn context_fallbacks<I, S>(mut self, models: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.context_models = models.into_iter().map(|m| m.as_ref().into()).collect();
        self
    }

    /// Counts the deadline from `started` rather than from now: the attempts of each failover
    /// of one stream share one deadline, from its first.
    ///
    /// ```
    /// use std::time::Duration;
    /// use streamgate::fleet::{AttemptOptions, Attempts};
    /// use tokio::time::Instant;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let options = AttemptOptions::default().deadline(Duration::from_secs(30));
    /// let long_ago = Instant::now() - Duration::from_secs(31);
    /// assert_eq!(Attempts::new("m", options).started_at(long_ago).time_left(), None);
    /// # }
    /// ```
    pub fn started_at(mut self, started: Instant) -> Self {
        self.started = started;
        self
    }

    /// Not replica `replica` of the requested model's pool: it has just failed this request
    /// (a stream that broke there and continues elsewhere).
    ///
    /// ```
    /// use streamgate::fleet::{AttemptOptions, Attempts};
    ///
    /// let attempts = Attempts::new("m", AttemptOptions::default()).avoiding(1);
    /// assert_eq!(attempts.avoid(), [1]);
    /// ```
    pub fn avoiding(mut self, replica: usize) -> Self {
        self.avoid_replica(replica);
        self
    }

    /// The model the next attempt asks for.
    pub fn model(&self) -> &str {
        let models = if self.on_context {
            &self.context_models
        } else {
            &self.models
        };
        &models[self.at]
    }

    /// Whether the next attempt is on a fallback (not the requested model).
    pub fn is_fallback(&self) -> bool {
        self.on_context || self.at > 0
    }

    /// The replicas of the current model's pool the next attempt must not pick.
    pub fn avoid(&self) -> &[usize] {
        &self.avoid
    }

    /// The attempts that failed so far.
    pub fn made(&self) -> u32 {
        self.made
    }

    /// The attempt on replica `replica` of the current model's pool (of `replicas`) failed
    /// with `failure`: whether and when to try again, and where ([`avoid`](Attempts::avoid),
    /// [`model`](Attempts::model)).
    pub fn failed(&mut self, replica: usize, failure: &Failure, replicas: usize) -> Next {
        self.made = self.made.saturating_add(1);
        let Some(left) = self.time_left() else {
            return Next::GiveUp;
        };
        if self.made >= self.options.max_attempts {
            return Next::GiveUp;
        }
        match failure.retry() {
            Retry::Never => Next::GiveUp,
            Retry::ContextFallback => self.context_fallback(),
            Retry::OtherReplica => {
                self.avoid_replica(replica);
                self.other_or_fallback(replicas)
            }
            Retry::AnyReplica => {
                let others_left =
                    (0..replicas).any(|at| at != replica && !self.avoid.contains(&at));
                if others_left {
                    self.avoid_replica(replica);
                    return Next::Retry {
                        after: Duration::ZERO,
                    };
                }
                // No other replica: a one-off fault on a pool's only replica is worth one
                // retry there before a fallback; a throttle goes to a fallback first; without
                // a fallback, the same replica again.
                let once_here = replicas == 1 && self.same == 0 && !failure.is_throttle();
                if self.has_fallback() && !once_here {
                    self.avoid_replica(replica);
                    return self.fallback();
                }
                // After its backoff (a throttled one after its spacing or its `Retry-After`),
                // if that fits in the time left.
                // Spread over up to half as long again, so that the requests a throttle
                // refused together do not come back together.
                let after = match (failure.is_throttle(), failure.retry_after()) {
                    (true, Some(asked)) => self.spread(asked),
                    (true, None) => self.spread(self.options.throttle_spacing),
                    (false, _) => self.backoff(),
                };
                if after >= left {
                    self.avoid_replica(replica);
                    return self.other_or_fallback(replicas);
                }
                self.same += 1;
                Next::Retry { after }
            }
        }
    }

    /// No replica could be picked for the current model (every one avoided, or none): the
    /// next fallback, or give up.
    pub fn no_replica(&mut self) -> Next {
        if self.time_left().is_none() || self.made >= self.options.max_attempts {
            return Next::GiveUp;
        }
        self.fallback()
    }

    /// The time left before the deadline, `None` once it is past: no attempt is started then.
    pub fn time_left(&self) -> Option<Duration> {
        self.options
            .deadline
            .checked_sub(self.started.elapsed())
            .filter(|left| !left.is_zero())
    }

    fn avoid_replica(&mut self, replica: usize) {
        if !self.avoid.contains(&replica) {
            self.avoid.push(replica);
        }
    }

    /// Another replica of the pool of `replicas` if one is left, else the next fallback.
    fn other_or_fallback(&mut self, replicas: usize) -> Next {
        if (0..replicas).any(|at| !self.avoid.contains(&at)) {
            Next::Retry {
                after: Duration::ZERO,
            }
        } else {
            self.fallback()
        }
    }

    /// Whether a fallback model is left after the current one.
    fn has_fallback(&self) -> bool {
        let models = if self.on_context {
            self.context_models.len()
        } else {
            self.models.len()
        };
        self.at + 1 < models
    }

    fn fallback(&mut self) -> Next {
        if !self.has_fallback() {
            return Next::GiveUp;
        }
        self.at += 1;
        self.avoid.clear();
        self.same = 0;
        Next::Fallback {
            after: Duration::ZERO,
        }
    }

    fn context_fallback(&mut self) -> Next {
        if self.on_context {
            return self.fallback();
        }
        if self.context_models.is_empty() {
            return Next::GiveUp;
        }
        self.on_context = true;
        self.at = 0;
        self.avoid.clear();
        self.same = 0;
        Next::Fallback {
            after: Duration::ZERO,
        }
    }

    /// `wait`, and up to half as long again, at random.
    fn spread(&self, wait: Duration) -> Duration {
        let half = u64::try_from((wait / 2).as_nanos()).unwrap_or(u64::MAX);
        wait + Duration::from_nanos(self.random.below(half))
    }

    /// The next backoff: doubling from the first, up to the most, between half and all of it.
    fn backoff(&self) -> Duration {
        let doubled = self
            .options
            .backoff
            .saturating_mul(1u32 << self.same.min(16))
            .min(self.options.max_backoff);
        let half = doubled / 2;
        let jitter = self
            .random
            .below(u64::try_from(half.as_nanos()).unwrap_or(u64::MAX));
        half + Duration::from_nanos(jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::ErrorCode;

    #[tokio::test(start_paused = true)]
    async fn a_request_error_gives_up_at_once_and_a_context_error_goes_only_to_a_context_fallback()
    {
        let options = AttemptOptions::default();
        let mut attempts = Attempts::new("m", options).fallbacks(["n"]);
        let bad = Failure::status(400, None, None);
        assert_eq!(attempts.failed(0, &bad, 2), Next::GiveUp);
        let long = Failure::status(400, None, Some(ErrorCode::ContextLength));
        let mut attempts = Attempts::new("m", options).fallbacks(["n"]);
        assert_eq!(
            attempts.failed(0, &long, 2),
            Next::GiveUp,
            "no context fallback"
        );
        let mut attempts = Attempts::new("m", options)
            .fallbacks(["n"])
            .context_fallbacks(["m-128k"]);
        assert!(matches!(
            attempts.failed(0, &long, 2),
            Next::Fallback { .. }
        ));
        assert_eq!((attempts.model(), attempts.is_fallback()), ("m-128k", true));
    }

    #[tokio::test(start_paused = true)]
    async fn another_replica_first_then_the_same_after_a_backoff_never_a_silent_one() {
        let options = AttemptOptions::default().max_attempts(5);
        let mut attempts = Attempts::new("m", options);
        assert_eq!(
            attempts.failed(0, &Failure::status(500, None, None), 2),
            Next::Retry {
                after: Duration::ZERO
            }
        );
        assert_eq!(attempts.avoid(), [0]);
        // The other one fails too: it is the only one left, so again after a backoff.
        let Next::Retry { after } = attempts.failed(1, &Failure::Reset, 2) else {
            panic!("retried");
        };
        assert!(after >= Duration::from_millis(50) && after <= Duration::from_millis(100));
        assert_eq!(attempts.avoid(), [0], "1 may be tried again");
        let Next::Retry { after } = attempts.failed(1, &Failure::Reset, 2) else {
            panic!("retried");
        };
        assert!(after >= Duration::from_millis(100) && after <= Duration::from_millis(200));
        // A silent replica is never asked again: nothing is left.
        assert_eq!(
            attempts.failed(1, &Failure::HeadersTimeout, 2),
            Next::GiveUp
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_only_replica_waits_its_spacing_or_retry_after_within_the_budget() {
        let options = AttemptOptions::default().deadline(Duration::from_secs(10));
        let waits = |failure: &Failure| -> Vec<Duration> {
            (0..200)
                .map(
                    |_| match Attempts::new("m", options).failed(0, failure, 1) {
                        Next::Retry { after } => after,
                        other => panic!("{other:?}"),
                    },
                )
                .collect()
        };
        // The spacing, spread over up to half as long again: never sooner, never together.
        let limited = waits(&Failure::status(429, None, None));
        assert!(limited.iter().all(|after| *after >= Duration::from_secs(1)));
        assert!(
            limited
                .iter()
                .all(|after| *after < Duration::from_millis(1500))
        );
        assert!(
            limited
                .iter()
                .any(|after| *after > Duration::from_millis(1250))
        );
        assert!(
            limited
                .iter()
                .any(|after| *after < Duration::from_millis(1250))
        );
        let soon = waits(&Failure::status(429, Some(Duration::from_secs(3)), None));
        assert!(soon.iter().all(|after| *after >= Duration::from_secs(3)));
        assert!(
            soon.iter()
                .all(|after| *after < Duration::from_millis(4500))
        );
        // Asked to wait past the budget: a fallback instead, or give up.
        let late = Failure::status(503, Some(Duration::from_secs(60)), None);
        let mut attempts = Attempts::new("m", options).fallbacks(["n"]);
        assert!(matches!(
            attempts.failed(0, &late, 1),
            Next::Fallback { .. }
        ));
        assert_eq!((attempts.model(), attempts.avoid()), ("n", &[][..]));
        let mut attempts = Attempts::new("m", options);
        assert_eq!(attempts.failed(0, &late, 1), Next::GiveUp);
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_are_bounded_in_number_and_time() {
        let options = AttemptOptions::default()
            .max_attempts(2)
            .deadline(Duration::from_secs(5));
        let mut attempts = Attempts::new("m", options).fallbacks(["n", "o"]);
        assert!(matches!(
            attempts.failed(0, &Failure::Connect, 3),
            Next::Retry { .. }
        ));
        assert_eq!(
            attempts.failed(1, &Failure::Connect, 3),
            Next::GiveUp,
            "two attempts"
        );
        let mut attempts = Attempts::new("m", options.max_attempts(10)).fallbacks(["n"]);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(
            attempts.failed(0, &Failure::Connect, 3),
            Next::GiveUp,
            "past the deadline"
        );
        assert_eq!(attempts.no_replica(), Next::GiveUp);
        let mut attempts = Attempts::new("m", options.max_attempts(10)).fallbacks(["n"]);
        assert!(matches!(attempts.no_replica(), Next::Fallback { .. }));
        assert_eq!(attempts.no_replica(), Next::GiveUp, "no fallback left");
    }
}
