//! A pool: the replicas that serve the same models, and the pick of one for each attempt.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::circuit::CircuitOptions;
use super::failure::Cause;
use super::lease::{Lease, Replica};
use super::random::Random;

/// The replicas that serve the same models, balanced for streams: each attempt gets the replica
/// with the fewest streams in flight for its weight, of two drawn at random among those whose
/// health admits the model (power of two choices, ties broken at random); a stream counts as in
/// flight until its [`Lease`] is dropped, so a long stream weighs for as long as it lasts.
///
/// Health is kept per replica and per deployment (a model on a replica): a replica that cannot
/// be reached, resets or says nothing is ejected for every model, an error status only for its
/// model (see [`Failure::scope`](super::Failure::scope)); an ejected one gets a single probe
/// once its cool-down is over and rejoins when it succeeds ([`CircuitOptions`]). When every
/// replica not to be avoided is ejected, the pick is the one that failed longest ago rather
/// than none.
///
/// # Examples
///
/// ```
/// use streamgate::fleet::{Failure, Pool};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let pool = Pool::weighted([("http://10.0.0.1:8000", 1), ("http://10.0.0.2:8000", 3)]);
/// let first = pool.pick("llama", &[]).unwrap();
/// // Avoid the replica that just failed this request.
/// let second = pool.pick("llama", &[first.index()]).unwrap();
/// assert_ne!(first.index(), second.index());
/// assert_eq!(pool.stats().iter().map(|s| s.in_flight).sum::<usize>(), 2);
/// assert!(pool.pick("llama", &[0, 1]).is_none(), "nothing left to try");
/// # }
/// ```
pub struct Pool<R> {
    replicas: Vec<Arc<Replica<R>>>,
    random: Random,
}

/// One replica's counts, from [`Pool::stats`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplicaStats {
    /// Its weight.
    pub weight: u32,
    /// Streams (attempts) in flight there now.
    pub in_flight: usize,
    /// Attempts given to it so far.
    pub picks: u64,
    /// Attempts that failed there so far.
    pub failures: u64,
    /// Of those, by cause, in the order of [`Cause::ALL`].
    pub failures_by_cause: [u64; Cause::ALL.len()],
    /// Whether the replica is ejected now (for every model).
    pub ejected: bool,
    /// The models ejected there now (their deployments), sorted.
    pub ejected_models: Vec<String>,
}

impl<R: Send + Sync + 'static> Pool<R> {
    /// A pool of `replicas`, each of weight 1, with the default circuits.
    pub fn new(replicas: impl IntoIterator<Item = R>) -> Self {
        Pool::weighted(replicas.into_iter().map(|replica| (replica, 1)))
    }

    /// A pool of `replicas` with their weights (0 counts as 1): a replica of weight 3 gets
    /// three times the streams of one of weight 1 when both keep up.
    pub fn weighted(replicas: impl IntoIterator<Item = (R, u32)>) -> Self {
        Pool::with_circuits(replicas, CircuitOptions::default())
    }

    /// A pool of weighted `replicas` whose circuits open and close as `circuits` says.
    pub fn with_circuits(
        replicas: impl IntoIterator<Item = (R, u32)>,
        circuits: CircuitOptions,
    ) -> Self {
        Pool {
            replicas: replicas
                .into_iter()
                .map(|(address, weight)| Arc::new(Replica::new(address, weight, circuits)))
                .collect(),
            random: Random::new(),
        }
    }

    /// How many replicas the pool has.
    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    /// Whether the pool has no replica.
    pub fn is_empty(&self) -> bool {
        self.replicas.is_empty()
    }

    /// The replicas, as they were given, in pool order.
    pub fn replicas(&self) -> impl Iterator<Item = &R> + '_ {
        self.replicas.iter().map(|replica| &replica.address)
    }

    /// A replica for an attempt of `model`, not one of `avoid` (the replicas this request
    /// already tried and may not try again), taking a stream in flight there; `None` when every
    /// replica is to be avoided.
    pub fn pick(&self, model: &str, avoid: &[usize]) -> Option<Lease<R>> {
        let now = Instant::now();
        let mut candidates: Vec<usize> = (0..self.replicas.len())
            .filter(|at| !avoid.contains(at) && self.replicas[*at].admits(model, now))
            .collect();
        // A circuit may give its probe to another attempt between the look and the take.
        while !candidates.is_empty() {
            let chosen = self.choose(&candidates);
            match Lease::take(&self.replicas[chosen], chosen, model, now, false) {
                Some(lease) => return Some(lease),
                None => candidates.retain(|at| *at != chosen),
            }
        }
        // Every replica left is ejected: the one that failed longest ago.
        let eldest = (0..self.replicas.len())
            .filter(|at| !avoid.contains(at))
            .min_by_key(|at| self.replicas[*at].last_failure(model))?;
        Lease::take(&self.replicas[eldest], eldest, model, now, true)
    }

    /// Of `candidates` (not empty), the lighter loaded of two drawn by weight.
    fn choose(&self, candidates: &[usize]) -> usize {
        let first = self.draw(candidates, None);
        if candidates.len() == 1 {
            return first;
        }
        let second = self.draw(candidates, Some(first));
        let (a, b) = (&self.replicas[first], &self.replicas[second]);
        // Streams per unit of weight, compared without dividing.
        let load_a = a.in_flight.load(Ordering::Relaxed) as u64 * u64::from(b.weight);
        let load_b = b.in_flight.load(Ordering::Relaxed) as u64 * u64::from(a.weight);
        match load_a.cmp(&load_b) {
            std::cmp::Ordering::Less => first,
            std::cmp::Ordering::Greater => second,
            std::cmp::Ordering::Equal if self.random.below(2) == 0 => first,
            std::cmp::Ordering::Equal => second,
        }
    }

    /// One of `candidates` at random by weight, not `except`.
    fn draw(&self, candidates: &[usize], except: Option<usize>) -> usize {
        let weight = |at: &usize| u64::from(self.replicas[*at].weight);
        let total: u64 = candidates
            .iter()
            .filter(|at| Some(**at) != except)
            .map(weight)
            .sum();
        let mut left = self.random.below(total);
        for at in candidates.iter().filter(|at| Some(**at) != except) {
            match left.checked_sub(weight(at)) {
                Some(rest) => left = rest,
                None => return *at,
            }
        }
        candidates[0]
    }

    /// Reports an active health check of the replica at `index` (a `GET` of its health path,
    /// say): a failed check counts against the replica for every model as a failed attempt
    /// would (not in its failure counts: no request failed), a passed one brings an ejected
    /// replica back once its cool-down is over, as a successful probe would. An `index` out of
    /// the pool is ignored.
    ///
    /// # Examples
    ///
    /// ```
    /// use streamgate::fleet::{CircuitOptions, Pool};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let pool = Pool::with_circuits([("a", 1), ("b", 1)], CircuitOptions::default().failures(1));
    /// pool.checked(0, false);
    /// assert!(pool.stats()[0].ejected);
    /// assert_eq!(pool.pick("m", &[]).unwrap().index(), 1, "a is out");
    /// # }
    /// ```
    pub fn checked(&self, index: usize, healthy: bool) {
        if let Some(replica) = self.replicas.get(index) {
            let options = replica.circuits;
            replica
                .health()
                .replica
                .checked(Instant::now(), healthy, &options);
        }
    }

    /// Every replica's counts, in pool order.
    pub fn stats(&self) -> Vec<ReplicaStats> {
        self.replicas
            .iter()
            .map(|replica| {
                let failures_by_cause =
                    std::array::from_fn(|at| replica.failures[at].load(Ordering::Relaxed));
                let health = replica.health();
                let mut ejected_models: Vec<String> = health
                    .deployments
                    .iter()
                    .filter(|(_, circuit)| circuit.is_open())
                    .map(|(model, _)| model.to_string())
                    .collect();
                ejected_models.sort_unstable();
                ReplicaStats {
                    weight: replica.weight,
                    in_flight: replica.in_flight.load(Ordering::Relaxed),
                    picks: replica.picks.load(Ordering::Relaxed),
                    failures: failures_by_cause.iter().sum(),
                    failures_by_cause,
                    ejected: health.replica.is_open(),
                    ejected_models,
                }
            })
            .collect()
    }
}

impl<R: fmt::Debug> fmt::Debug for Pool<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.replicas.iter().map(|replica| &replica.address))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::fleet::Failure;

    #[tokio::test(start_paused = true)]
    async fn a_dead_replica_is_out_for_every_model_a_rate_limit_only_for_its_own() {
        let circuits = CircuitOptions::default().failures(1);
        let pool = Pool::with_circuits([("a", 1), ("b", 1)], circuits);
        let mut dead = pool.pick("m", &[1]).unwrap();
        dead.failed(&Failure::Connect);
        drop(dead);
        for _ in 0..20 {
            let lease = pool.pick("other", &[]).unwrap();
            assert_eq!(lease.index(), 1, "the dead replica is out for every model");
        }
        let mut limited = pool.pick("m", &[0]).unwrap();
        limited.failed(&Failure::status(429, None, None));
        drop(limited);
        // `b` is out for `m` only; `a` is out for all: `m` goes to the one that failed longest
        // ago, `other` still to `b`.
        assert_eq!(pool.pick("other", &[]).unwrap().index(), 1);
        assert_eq!(pool.pick("m", &[]).unwrap().index(), 0);
        let stats = pool.stats();
        assert!(stats[0].ejected && stats[0].ejected_models.is_empty());
        assert!(!stats[1].ejected && stats[1].ejected_models == ["m"]);
        assert_eq!(stats[0].failures_by_cause[Cause::Connect.index()], 1);
        assert_eq!(stats[1].failures_by_cause[Cause::RateLimited.index()], 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_ejected_replica_gets_one_probe_after_its_cooldown_and_rejoins_on_success() {
        let circuits = CircuitOptions::default()
            .failures(1)
            .cooldown(Duration::from_secs(2));
        let pool = Pool::with_circuits([("a", 1), ("b", 1)], circuits);
        pool.pick("m", &[1]).unwrap().failed(&Failure::Reset);
        tokio::time::advance(Duration::from_secs(2)).await;
        // The first pick that draws `a` takes its probe; until it reports, nobody else gets it.
        let mut probe = loop {
            let lease = pool.pick("m", &[1]).unwrap();
            if lease.index() == 0 {
                break lease;
            }
        };
        assert_eq!(
            pool.pick("m", &[1]).map(|l| l.index()),
            Some(0),
            "forced: all out"
        );
        for _ in 0..20 {
            assert_eq!(pool.pick("m", &[]).unwrap().index(), 1, "the probe is out");
        }
        probe.succeeded();
        drop(probe);
        let picks: Vec<usize> = (0..40)
            .map(|_| pool.pick("m", &[]).unwrap().index())
            .collect();
        assert!(picks.contains(&0), "rejoined");
    }

    #[tokio::test(start_paused = true)]
    async fn a_model_probe_that_fails_with_its_replica_frees_the_probe() {
        let circuits = CircuitOptions::default()
            .failures(1)
            .cooldown(Duration::from_secs(1));
        let pool = Pool::with_circuits([("a", 1), ("b", 1)], circuits);
        // `m` is ejected on `a` (a 503), then its cool-down ends: its next pick there probes it.
        pool.pick("m", &[1])
            .unwrap()
            .failed(&Failure::status(503, None, None));
        tokio::time::advance(Duration::from_secs(1)).await;
        let mut probe = pool.pick("m", &[1]).unwrap();
        assert_eq!(probe.index(), 0);
        // The probe dies with the whole replica (a reset): the replica is out, and once it is
        // back, `m` may be probed there again.
        probe.failed(&Failure::Reset);
        drop(probe);
        tokio::time::advance(Duration::from_secs(2)).await;
        let mut again = pool.pick("m", &[1]).expect("the replica's probe");
        again.succeeded();
        drop(again);
        let picks: Vec<usize> = (0..40)
            .map(|_| pool.pick("m", &[]).unwrap().index())
            .collect();
        assert!(picks.contains(&0), "`m` is back on `a`: {picks:?}");
        assert!(pool.stats()[0].ejected_models.is_empty());
    }

    #[tokio::test]
    async fn the_fewest_in_flight_per_weight_wins_and_counts_return_to_zero() {
        let pool = Pool::weighted([("a", 1), ("b", 1), ("c", 2)]);
        let mut held = Vec::new();
        for _ in 0..400 {
            held.push(pool.pick("m", &[]).unwrap());
        }
        let stats = pool.stats();
        let loads: Vec<usize> = stats.iter().map(|s| s.in_flight).collect();
        // Two choices keep the load close to the weights: c holds about twice a or b.
        assert!(
            loads[2] > loads[0] + 50 && loads[2] > loads[1] + 50,
            "{loads:?}"
        );
        assert!(loads[0].abs_diff(loads[1]) <= 20, "{loads:?}");
        drop(held);
        assert!(pool.stats().iter().all(|s| s.in_flight == 0));
        assert!(Pool::<&str>::new([]).pick("m", &[]).is_none());
    }
}
