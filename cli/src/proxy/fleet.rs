//! The fleet at run time: the pools of [`Routes`] with their replicas' health and counts, the
//! attempts a request for a model may make, the active health checks, and the per-upstream
//! figures of `/stats` and `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Method};
use serde_json::{Map, Value, json};
use streamgate::fleet::{AttemptOptions, Attempts, Cause, Pool};
use tokio::time::Instant;
use wildmatch::WildMatch;

use super::routes::Routes;
use super::upstream::Upstream;
use super::url::UpstreamUrl;

/// The fleet: its pools, in the order a model is matched against them, and its fallbacks.
#[derive(Debug)]
pub(super) struct Fleet {
    pools: Vec<FleetPool>,
    fallbacks: BTreeMap<String, Vec<String>>,
    context_fallbacks: BTreeMap<String, Vec<String>>,
    attempts: AttemptOptions,
}

/// One pool: its name, the models it serves, its replicas.
#[derive(Debug)]
pub(super) struct FleetPool {
    pub(super) name: String,
    models: Vec<WildMatch>,
    pub(super) replicas: Pool<UpstreamUrl>,
    /// An active health check: the path to `GET` on every replica, and how often.
    health: Option<(String, Duration)>,
    /// Its servers continue a final assistant message: configured (`prefill`), and false
    /// once one answered a continuation with 400.
    prefill: AtomicBool,
}

impl Fleet {
    /// The fleet `routes` describe (checked when they were made).
    pub(super) fn new(routes: Routes) -> Self {
        let pools = routes
            .pools
            .into_iter()
            .map(|pool| FleetPool {
                models: pool
                    .models
                    .iter()
                    .map(|model| WildMatch::new(model))
                    .collect(),
                replicas: Pool::with_circuits(pool.upstreams, pool.circuits),
                health: pool.health,
                prefill: AtomicBool::new(pool.prefill),
                name: pool.name,
            })
            .collect();
        Fleet {
            pools,
            fallbacks: routes.fallbacks,
            context_fallbacks: routes.context_fallbacks,
            attempts: routes.attempts,
        }
    }

    /// The pool that serves `model`: the first whose models match it.
    pub(super) fn pool_for(&self, model: &str) -> Option<&FleetPool> {
        self.pools
            .iter()
            .find(|pool| pool.models.iter().any(|pattern| pattern.matches(model)))
    }

    /// The pool of requests that name no model (`/v1/models`, `/health`, everything passed
    /// through): the first.
    pub(super) fn first_pool(&self) -> &FleetPool {
        &self.pools[0]
    }

    /// The attempts of a request for `model`, with its fallbacks.
    pub(super) fn attempts(&self, model: &str) -> Attempts {
        let none = Vec::new();
        Attempts::new(model, self.attempts)
            .fallbacks(self.fallbacks.get(model).unwrap_or(&none))
            .context_fallbacks(self.context_fallbacks.get(model).unwrap_or(&none))
    }

    /// The attempts that carry on a stream of `model` that broke on replica `broke` of its
    /// pool (`None`: one adopted from a proxy instance that died, which broke on none): that
    /// model on another replica, then its fallbacks; for a continuation
    /// (`continuing`), only on pools that continue a final assistant message; within the
    /// deadline of the attempts, counted from the stream's first failover (`since`). `None`
    /// when no upstream is left (the broken replica was its pool's only one, and no fallback
    /// is).
    pub(super) fn carry_on(
        &self,
        model: &str,
        broke: Option<usize>,
        continuing: bool,
        since: Instant,
    ) -> Option<Attempts> {
        let none = Vec::new();
        let fallbacks = self.fallbacks.get(model).unwrap_or(&none);
        let least = if broke.is_some() { 2 } else { 1 };
        let others = self
            .pool_for(model)
            .is_some_and(|pool| pool.replicas.len() >= least);
        let mut models = others
            .then_some(model)
            .into_iter()
            .chain(fallbacks.iter().map(String::as_str))
            .filter(|model| {
                let pool = self.pool_for(model);
                !continuing || pool.is_some_and(|pool| pool.prefill.load(Ordering::Relaxed))
            });
        let first = models.next()?;
        let attempts = Attempts::new(first, self.attempts)
            .started_at(since)
            .fallbacks(models);
        Some(match broke {
            Some(broke) if first == model => attempts.avoiding(broke),
            _ => attempts,
        })
    }

    /// A server of `model`'s pool refused to continue a final assistant message (a 400 to a
    /// continuation): the pool is not asked to continue again.
    pub(super) fn refused_prefill(&self, model: &str) {
        if let Some(pool) = self.pool_for(model) {
            pool.prefill.store(false, Ordering::Relaxed);
        }
    }

    /// Every upstream, one line each: `pool url (weight w)`.
    pub(super) fn describe(&self) -> String {
        let mut lines = String::new();
        for pool in &self.pools {
            let stats = pool.replicas.stats();
            for (url, stats) in pool.replicas.replicas().zip(stats) {
                let _ = write!(
                    lines,
                    "\n  pool {}: {url} (weight {})",
                    pool.name, stats.weight
                );
            }
        }
        lines
    }

    /// Starts the active health checks of the pools that ask for them: one task per pool,
    /// which ends once the fleet is dropped.
    pub(super) fn check_health(fleet: &Arc<Fleet>, upstream: &Upstream) {
        for (at, pool) in fleet.pools.iter().enumerate() {
            if let Some((path, interval)) = pool.health.clone() {
                let (fleet, upstream) = (Arc::downgrade(fleet), upstream.clone());
                tokio::spawn(check_pool(fleet, at, upstream, path, interval));
            }
        }
    }

    /// `/stats`' `upstreams`: for every upstream its pool, URL, weight, streams in flight,
    /// picks, failed attempts (by cause) and whether it (or which of its models) is ejected.
    pub(super) fn stats(&self) -> Value {
        let mut upstreams = Vec::new();
        for pool in &self.pools {
            for (url, stats) in pool.replicas.replicas().zip(pool.replicas.stats()) {
                let by_cause: Map<String, Value> = Cause::ALL
                    .iter()
                    .map(|cause| {
                        let count = stats.failures_by_cause[cause.index()];
                        (cause.as_str().to_owned(), count.into())
                    })
                    .collect();
                upstreams.push(json!({
                    "pool": pool.name,
                    "url": url.to_string(),
                    "weight": stats.weight,
                    "in_flight": stats.in_flight,
                    "picks": stats.picks,
                    "failures": stats.failures,
                    "failures_by_cause": by_cause,
                    "ejected": stats.ejected,
                    "ejected_models": stats.ejected_models,
                }));
            }
        }
        Value::Array(upstreams)
    }

    /// The per-upstream series, in Prometheus' text format: streams in flight, picks, failed
    /// attempts by cause, and whether each is ejected.
    pub(super) fn metrics(&self) -> String {
        let mut text = String::new();
        let series = [
            (
                "streamgate_proxy_upstream_in_flight",
                "gauge",
                "Streams in flight on each upstream (counted until their end)",
            ),
            (
                "streamgate_proxy_upstream_picks_total",
                "counter",
                "Attempts given to each upstream",
            ),
            (
                "streamgate_proxy_upstream_attempt_failures_total",
                "counter",
                "Attempts that failed at each upstream before their first event, by cause",
            ),
            (
                "streamgate_proxy_upstream_ejected",
                "gauge",
                "1 while an upstream is ejected for every model (its circuit open)",
            ),
        ];
        for (name, kind, help) in series {
            let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for pool in &self.pools {
                for (url, stats) in pool.replicas.replicas().zip(pool.replicas.stats()) {
                    let labels = format!(
                        "pool=\"{}\",upstream=\"{}\"",
                        escape(&pool.name),
                        escape(&url.to_string())
                    );
                    match name {
                        "streamgate_proxy_upstream_in_flight" => {
                            let _ = writeln!(text, "{name}{{{labels}}} {}", stats.in_flight);
                        }
                        "streamgate_proxy_upstream_picks_total" => {
                            let _ = writeln!(text, "{name}{{{labels}}} {}", stats.picks);
                        }
                        "streamgate_proxy_upstream_ejected" => {
                            let _ =
                                writeln!(text, "{name}{{{labels}}} {}", u8::from(stats.ejected));
                        }
                        _ => {
                            for cause in Cause::ALL {
                                let count = stats.failures_by_cause[cause.index()];
                                let cause = cause.as_str();
                                let _ =
                                    writeln!(text, "{name}{{{labels},cause=\"{cause}\"}} {count}");
                            }
                        }
                    }
                }
            }
        }
        text
    }
}

/// A label value as Prometheus' text format writes it.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Every `interval`, `GET path` on each replica of pool `at`: healthy when it answers 2xx within
/// the interval (or 10 s, the lesser).
async fn check_pool(
    fleet: Weak<Fleet>,
    at: usize,
    upstream: Upstream,
    path: String,
    interval: Duration,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let limit = interval.min(Duration::from_secs(10));
    loop {
        ticks.tick().await;
        let Some(fleet) = fleet.upgrade() else {
            return;
        };
        let pool = &fleet.pools[at].replicas;
        let urls: Vec<UpstreamUrl> = pool.replicas().cloned().collect();
        let headers = HeaderMap::new();
        for (index, url) in urls.iter().enumerate() {
            let answer = upstream.send(url, Method::GET, &path, &headers, Body::empty());
            let healthy = matches!(
                tokio::time::timeout(limit, answer).await,
                Ok(Ok(response)) if response.status().is_success()
            );
            pool.checked(index, healthy);
        }
    }
}
