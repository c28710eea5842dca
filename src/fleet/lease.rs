//! One replica's state in a pool, and the lease an attempt holds on it: a stream in flight,
//! counted until its end, and the verdict it reports.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::time::Instant;

use super::circuit::{Admit, Circuit, CircuitOptions};
use super::failure::{Cause, Failure, Scope};

/// One replica of a pool: where it is, its weight, its streams in flight, its counters and its
/// health (the replica's circuit, and one per model served there: a deployment).
pub(crate) struct Replica<R> {
    pub(crate) address: R,
    pub(crate) weight: u32,
    pub(crate) in_flight: AtomicUsize,
    pub(crate) picks: AtomicU64,
    pub(crate) failures: [AtomicU64; Cause::ALL.len()],
    pub(crate) circuits: CircuitOptions,
    health: Mutex<Health>,
}

#[derive(Debug)]
pub(crate) struct Health {
    pub(crate) replica: Circuit,
    pub(crate) deployments: HashMap<Arc<str>, Circuit>,
}

/// The most deployments a replica keeps a circuit for besides closed ones: the models named by
/// requests are the clients' to choose, so what is kept of them is bounded.
const MAX_DEPLOYMENTS: usize = 256;

impl Health {
    /// The circuit of `model` here, to count a failure in; `None` when as many deployments as
    /// are kept are already failing.
    fn failing(&mut self, model: &str) -> Option<&mut Circuit> {
        if !self.deployments.contains_key(model) {
            if self.deployments.len() >= MAX_DEPLOYMENTS {
                return None;
            }
            self.deployments.insert(model.into(), Circuit::new());
        }
        self.deployments.get_mut(model)
    }

    /// `model` here succeeded: closed, which is what a model without a circuit is.
    fn recovered(&mut self, model: &str) {
        self.deployments.remove(model);
    }
}

impl<R> Replica<R> {
    pub(crate) fn new(address: R, weight: u32, circuits: CircuitOptions) -> Self {
        Replica {
            address,
            weight: weight.max(1),
            in_flight: AtomicUsize::new(0),
            picks: AtomicU64::new(0),
            failures: Default::default(),
            circuits,
            health: Mutex::new(Health {
                replica: Circuit::new(),
                deployments: HashMap::new(),
            }),
        }
    }

    pub(crate) fn health(&self) -> MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether both its circuit and `model`'s would let a request through at `now`.
    pub(crate) fn admits(&self, model: &str, now: Instant) -> bool {
        let health = self.health();
        health.replica.admits(now)
            && health
                .deployments
                .get(model)
                .is_none_or(|deployment| deployment.admits(now))
    }

    /// When it (or `model` here) last failed.
    pub(crate) fn last_failure(&self, model: &str) -> Option<Instant> {
        let health = self.health();
        let deployment = health.deployments.get(model).and_then(|c| c.last_failure);
        health.replica.last_failure.max(deployment)
    }
}

/// Which of an attempt's circuits it is the single probe of.
#[derive(Debug, Clone, Copy, Default)]
struct Probes {
    replica: bool,
    deployment: bool,
}

/// An attempt's hold on a replica, from [`Pool::pick`](super::Pool::pick): it counts as a stream
/// in flight there until it is dropped, so keep it for as long as the stream lasts (move it
/// into the stream's generator) and the count returns to zero exactly when its streams end,
/// however they end. Report the attempt's verdict once: [`succeeded`](Lease::succeeded) when
/// its first event came (or its answer, for a request that streams nothing),
/// [`failed`](Lease::failed) otherwise.
///
/// # Examples
///
/// ```
/// use streamgate::fleet::{Failure, Pool};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let pool = Pool::new(["http://10.0.0.1:8000", "http://10.0.0.2:8000"]);
/// let mut lease = pool.pick("llama", &[]).expect("a replica");
/// assert_eq!(pool.stats()[lease.index()].in_flight, 1);
/// lease.failed(&Failure::Reset);
/// let index = lease.index();
/// drop(lease); // the attempt is over
/// assert_eq!(pool.stats()[index].in_flight, 0);
/// assert_eq!(pool.stats()[index].failures, 1);
/// # }
/// ```
#[must_use = "a lease counts a stream in flight until it is dropped"]
pub struct Lease<R> {
    replica: Arc<Replica<R>>,
    index: usize,
    model: Arc<str>,
    probes: Probes,
    reported: bool,
}

impl<R> Lease<R> {
    /// Takes a stream in flight on `replica` (the `index`th of its pool) for `model`, taking
    /// the probe of each circuit that is half-open; `None` if a circuit no longer admits it
    /// (its probe went to another attempt meanwhile). `force` takes it whatever its circuits
    /// say (every replica is out: the least recently failed is tried).
    pub(crate) fn take(
        replica: &Arc<Replica<R>>,
        index: usize,
        model: &str,
        now: Instant,
        force: bool,
    ) -> Option<Self> {
        let mut probes = Probes::default();
        if !force {
            let mut health = replica.health();
            let deployment_admits = health
                .deployments
                .get(model)
                .is_none_or(|deployment| deployment.admits(now));
            if !health.replica.admits(now) || !deployment_admits {
                return None;
            }
            probes.replica = health.replica.admit(now) == Admit::Probe;
            probes.deployment = health
                .deployments
                .get_mut(model)
                .is_some_and(|deployment| deployment.admit(now) == Admit::Probe);
        }
        replica.in_flight.fetch_add(1, Ordering::Relaxed);
        replica.picks.fetch_add(1, Ordering::Relaxed);
        Some(Lease {
            replica: replica.clone(),
            index,
            model: model.into(),
            probes,
            reported: false,
        })
    }

    /// The replica's position in its pool (what [`Attempts`](super::Attempts) avoids).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The replica, as the pool was given it (its address).
    pub fn replica(&self) -> &R {
        &self.replica.address
    }

    /// The model the attempt asked for.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The attempt worked (its first event came): the replica and the deployment are healthy.
    /// Only the first verdict counts.
    pub fn succeeded(&mut self) {
        if std::mem::replace(&mut self.reported, true) {
            return;
        }
        let mut health = self.replica.health();
        health.replica.succeeded();
        health.recovered(&self.model);
    }

    /// The attempt failed before its first event: counted by cause, and against the replica
    /// (every model) or the deployment as [`Failure::scope`] says; a failure that is the
    /// request's own proves the replica alive. A `Retry-After` on a 429 or 503 ejects the
    /// deployment for that long at once. Only the first verdict counts.
    pub fn failed(&mut self, failure: &Failure) {
        if std::mem::replace(&mut self.reported, true) {
            return;
        }
        self.replica.failures[failure.cause().index()].fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let options = self.replica.circuits;
        let mut health = self.replica.health();
        let hold = failure.retry_after().filter(|_| failure.is_throttle());
        match failure.scope() {
            Scope::Replica => {
                health.replica.failed(now, None, &options);
                // The replica failed, not the model: a probe of the model's circuit this
                // attempt held says nothing of it, and another may go.
                if self.probes.deployment {
                    if let Some(deployment) = health.deployments.get_mut(&*self.model) {
                        deployment.probe_abandoned();
                    }
                }
            }
            Scope::Deployment => {
                health.replica.succeeded();
                if let Some(deployment) = health.failing(&self.model) {
                    deployment.failed(now, hold, &options);
                }
            }
            Scope::Request => {
                health.replica.succeeded();
                health.recovered(&self.model);
            }
        }
    }

    /// The stream broke after its first event ([`Failure::Cut`], [`Failure::Stalled`],
    /// [`Failure::ErrorEvent`]): counted and held against the replica or the deployment as
    /// [`failed`](Lease::failed) does, whatever verdict its first event gave.
    ///
    /// ```
    /// use streamgate::fleet::{Failure, Pool};
    ///
    /// let pool = Pool::new(["http://10.0.0.1:8000"]);
    /// let mut lease = pool.pick("m", &[]).unwrap();
    /// lease.succeeded(); // its first event came
    /// lease.broke(&Failure::Cut); // then the replica died mid-answer
    /// drop(lease);
    /// assert_eq!(pool.stats()[0].failures, 1);
    /// ```
    pub fn broke(&mut self, failure: &Failure) {
        self.reported = false;
        self.failed(failure);
    }
}

impl<R> Drop for Lease<R> {
    fn drop(&mut self) {
        self.replica.in_flight.fetch_sub(1, Ordering::Relaxed);
        if self.reported || !(self.probes.replica || self.probes.deployment) {
            return;
        }
        // A probe that ended without a verdict (its client left first): another may go.
        let mut health = self.replica.health();
        if self.probes.replica {
            health.replica.probe_abandoned();
        }
        if let Some(deployment) = health.deployments.get_mut(&*self.model) {
            if self.probes.deployment {
                deployment.probe_abandoned();
            }
        }
    }
}

impl<R: fmt::Debug> fmt::Debug for Lease<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("replica", &self.replica.address)
            .field("index", &self.index)
            .field("model", &self.model)
            .field("reported", &self.reported)
            .finish_non_exhaustive()
    }
}
