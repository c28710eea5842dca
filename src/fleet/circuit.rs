//! A circuit breaker: a replica (or a deployment) ejected after repeated failures, for a
//! cool-down that grows while it keeps failing, then given a single probe.

use std::time::Duration;

use tokio::time::Instant;

/// When a circuit opens and for how long: after `failures` failures in a row the replica (or
/// deployment) is ejected for `cooldown`; each failed probe doubles the cool-down, up to
/// `max_cooldown`, so a recovered replica is back within that.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use streamgate::fleet::CircuitOptions;
///
/// let options = CircuitOptions::default()
///     .failures(3)
///     .cooldown(Duration::from_secs(1))
///     .max_cooldown(Duration::from_secs(30));
/// assert_eq!(options, CircuitOptions::default());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitOptions {
    pub(crate) failures: u32,
    pub(crate) cooldown: Duration,
    pub(crate) max_cooldown: Duration,
}

impl CircuitOptions {
    /// Failures in a row that eject (zero counts as one). Default 3.
    pub fn failures(mut self, failures: u32) -> Self {
        self.failures = failures.max(1);
        self
    }

    /// The first cool-down. Default 1 s.
    pub fn cooldown(mut self, cooldown: Duration) -> Self {
        self.cooldown = cooldown;
        self
    }

    /// The longest cool-down, however often the probes fail. Default 30 s.
    pub fn max_cooldown(mut self, max_cooldown: Duration) -> Self {
        self.max_cooldown = max_cooldown;
        self
    }
}

impl Default for CircuitOptions {
    fn default() -> Self {
        CircuitOptions {
            failures: 3,
            cooldown: Duration::from_secs(1),
            max_cooldown: Duration::from_secs(30),
        }
    }
}

/// What a circuit lets through now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Closed: any request.
    Yes,
    /// Half-open: this request is the single probe.
    Probe,
    /// Open, or half-open with its probe out.
    No,
}

/// One circuit's state.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Circuit {
    state: State,
    /// The last failure, to pick the least recently failed when every replica is out.
    pub(crate) last_failure: Option<Instant>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed { failures: u32 },
    Open { until: Instant, cooldown: Duration },
    HalfOpen { cooldown: Duration, probing: bool },
}

impl Circuit {
    pub(crate) fn new() -> Self {
        Circuit {
            state: State::Closed { failures: 0 },
            last_failure: None,
        }
    }

    /// What it lets through at `now`, taking the probe when that is what it lets through.
    pub(crate) fn admit(&mut self, now: Instant) -> Admit {
        match self.state {
            State::Closed { .. } => Admit::Yes,
            State::Open { until, cooldown } if now >= until => {
                self.state = State::HalfOpen {
                    cooldown,
                    probing: true,
                };
                Admit::Probe
            }
            State::HalfOpen {
                cooldown,
                probing: false,
            } => {
                self.state = State::HalfOpen {
                    cooldown,
                    probing: true,
                };
                Admit::Probe
            }
            State::Open { .. } | State::HalfOpen { .. } => Admit::No,
        }
    }

    /// Whether it would let a request through at `now`, taking nothing.
    pub(crate) fn admits(&self, now: Instant) -> bool {
        match self.state {
            State::Closed { .. } => true,
            State::Open { until, .. } => now >= until,
            State::HalfOpen { probing, .. } => !probing,
        }
    }

    /// Whether it is ejected (open or half-open).
    pub(crate) fn is_open(&self) -> bool {
        !matches!(self.state, State::Closed { .. })
    }

    /// A request through it succeeded: closed.
    pub(crate) fn succeeded(&mut self) {
        self.state = State::Closed { failures: 0 };
    }

    /// A request through it failed at `now`: one more in a row, opening it at the threshold;
    /// a failed probe opens it again for twice as long. `hold` (a `Retry-After`) opens it at
    /// once for that long.
    pub(crate) fn failed(
        &mut self,
        now: Instant,
        hold: Option<Duration>,
        options: &CircuitOptions,
    ) {
        self.last_failure = Some(now);
        let open = |cooldown: Duration| State::Open {
            until: now.checked_add(cooldown).unwrap_or(now),
            cooldown,
        };
        self.state = match (self.state, hold) {
            (_, Some(hold)) => open(hold.min(options.max_cooldown)),
            (State::Closed { failures }, None) if failures + 1 >= options.failures => {
                open(options.cooldown.min(options.max_cooldown))
            }
            (State::Closed { failures }, None) => State::Closed {
                failures: failures + 1,
            },
            // A probe failed: open again, for twice as long.
            (State::HalfOpen { cooldown, .. }, None) => {
                open(cooldown.saturating_mul(2).min(options.max_cooldown))
            }
            // A stream that was in flight when the circuit opened failed since: it says nothing
            // new, and neither lengthens nor moves the cool-down.
            (open @ State::Open { .. }, None) => open,
        };
    }

    /// An active health check at `now`: a failed one counts as a failed request; a passed one
    /// closes the circuit unless it is cooling down (the check is then its probe), and resets
    /// the failures in a row of a closed one.
    pub(crate) fn checked(&mut self, now: Instant, healthy: bool, options: &CircuitOptions) {
        match self.state {
            _ if !healthy => self.failed(now, None, options),
            State::Open { until, .. } if now < until => {}
            _ => self.succeeded(),
        }
    }

    /// A probe ended without a verdict (its client left first): another may go.
    pub(crate) fn probe_abandoned(&mut self) {
        if let State::HalfOpen { cooldown, .. } = self.state {
            self.state = State::HalfOpen {
                cooldown,
                probing: false,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn failures_while_open_neither_double_nor_move_the_cool_down() {
        let options = CircuitOptions::default()
            .failures(1)
            .cooldown(Duration::from_secs(1));
        let mut circuit = Circuit::new();
        let now = Instant::now();
        circuit.failed(now, None, &options);
        let opened = circuit.state;
        // Six streams that were in flight on a replica that died fail after it.
        for _ in 0..6 {
            circuit.failed(now + Duration::from_millis(10), None, &options);
        }
        assert_eq!(circuit.state, opened);
        assert!(
            circuit.admits(now + Duration::from_millis(1001)),
            "probed after 1 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn it_opens_at_the_threshold_probes_once_and_backs_off_to_the_cap() {
        let options = CircuitOptions::default()
            .failures(2)
            .cooldown(Duration::from_secs(1))
            .max_cooldown(Duration::from_secs(4));
        let mut circuit = Circuit::new();
        let now = Instant::now();
        circuit.failed(now, None, &options);
        assert_eq!(circuit.admit(now), Admit::Yes, "one failure is not enough");
        circuit.failed(now, None, &options);
        assert_eq!(circuit.admit(now), Admit::No);
        let later = now + Duration::from_secs(1);
        assert_eq!(circuit.admit(later), Admit::Probe);
        assert_eq!(circuit.admit(later), Admit::No, "a single probe");
        // The probe fails: twice as long, then twice again, then the cap.
        let mut at = later;
        for cooldown in [2, 4, 4] {
            circuit.failed(at, None, &options);
            let opens = at + Duration::from_secs(cooldown);
            assert_eq!(circuit.admit(opens - Duration::from_millis(1)), Admit::No);
            assert_eq!(circuit.admit(opens), Admit::Probe, "after {cooldown} s");
            at = opens;
        }
        circuit.succeeded();
        assert_eq!(circuit.admit(at), Admit::Yes);
        assert!(!circuit.is_open());
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_opens_it_at_once_and_an_abandoned_probe_frees_the_slot() {
        let options = CircuitOptions::default();
        let mut circuit = Circuit::new();
        let now = Instant::now();
        circuit.failed(now, Some(Duration::from_secs(5)), &options);
        assert!(!circuit.admits(now + Duration::from_secs(4)));
        assert_eq!(circuit.admit(now + Duration::from_secs(5)), Admit::Probe);
        circuit.probe_abandoned();
        assert_eq!(circuit.admit(now + Duration::from_secs(5)), Admit::Probe);
        // A hold longer than the cap is the cap.
        circuit.failed(now, Some(Duration::from_secs(3600)), &options);
        assert!(circuit.admits(now + Duration::from_secs(30)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_passed_health_check_is_the_probe_once_the_cooldown_is_over() {
        let options = CircuitOptions::default().failures(2);
        let mut circuit = Circuit::new();
        let now = Instant::now();
        circuit.checked(now, false, &options);
        circuit.checked(now, false, &options);
        assert!(circuit.is_open(), "two failed checks");
        circuit.checked(now, true, &options);
        assert!(circuit.is_open(), "still cooling down");
        circuit.checked(now + Duration::from_secs(1), true, &options);
        assert!(
            !circuit.is_open(),
            "closed by the check after its cool-down"
        );
        circuit.checked(now, false, &options);
        circuit.checked(now, true, &options);
        circuit.checked(now, false, &options);
        assert!(
            !circuit.is_open(),
            "a passed check resets the failures in a row"
        );
    }
}
