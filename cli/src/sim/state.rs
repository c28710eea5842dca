//! The reference server's state, and a new generation's metadata.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::HeaderMap;
use metrics_exporter_prometheus::PrometheusHandle;
use streamgate::Group;
use streamgate::probe::{HopProbe, RecordSink};

use super::config::Config;
use super::delta::Delta;
use super::kv::KvPool;
use super::meta::Meta;
use super::stats::Stats;
use crate::flags::ResumeStore;

/// The reference server's state: its configuration, KV pool, counters, probes and streams.
pub struct Sim {
    pub(super) config: Config,
    pub(super) stats: Stats,
    pub(super) kv: Arc<KvPool>,
    /// Completion ids are this and a counter: with a shared store, it names the instance too.
    id_prefix: String,
    next_id: AtomicU64,
    pub(super) decode: HopProbe,
    pub(super) publish: HopProbe,
    pub(super) write: HopProbe,
    pub(super) sent: HopProbe,
    pub(super) prometheus: PrometheusHandle,
    /// Where hop records go (`--hop-records`), if anywhere: sync it before exiting.
    pub records: Option<RecordSink>,
    /// Every stream: shut down together on SIGINT/SIGTERM (give it to
    /// [`serving::serve_until`]).
    pub streams: Group,
    /// Every streamed generation by its request id: resumable, several readers at once, and
    /// the explicit stop of every generation running here.
    pub(super) store: streamgate::resume::Registry<Delta>,
}

impl fmt::Debug for Sim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sim")
            .field("addr", &self.config.addr)
            .field("kv", &self.kv)
            .field("stats", &self.stats)
            .field("streams", &self.streams.stats())
            .finish_non_exhaustive()
    }
}

impl Sim {
    /// The state for `config`: its probes (writing the records of `--hop-records` to
    /// `records`), its KV pool and its store.
    ///
    /// # Errors
    ///
    /// When the resume store's URL is malformed.
    pub(super) fn new(
        config: Config,
        prometheus: PrometheusHandle,
        records: Option<RecordSink>,
    ) -> Result<Self, String> {
        let store = config.resume.open(&config.gate)?;
        let id_prefix = match &config.resume.store {
            ResumeStore::Memory => "chatcmpl-".to_owned(),
            // Other instances name streams in the same Redis.
            ResumeStore::Redis(_) => {
                use std::hash::{BuildHasher, RandomState};
                format!("chatcmpl-{:x}-", RandomState::new().hash_one(0))
            }
        };
        let sample = config.hop_records_sample;
        Ok(Sim {
            stats: Stats::default(),
            kv: KvPool::new(config.kv_blocks),
            id_prefix,
            next_id: AtomicU64::new(0),
            decode: sample.hop(&records, "worker.decode"),
            publish: sample.hop(&records, "worker.publish"),
            write: sample.hop(&records, "worker.write"),
            sent: sample.hop(&records, "worker.sent"),
            prometheus,
            config,
            records,
            streams: Group::new(),
            store,
        })
    }

    /// A new generation's metadata; its stream is named `stream`, or by its completion id.
    pub(super) fn meta(
        &self,
        model: String,
        stream: Option<String>,
        headers: &HeaderMap,
    ) -> Arc<Meta> {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let id = format!("{}{n}", self.id_prefix);
        let request = headers
            .get("x-request-id")
            .and_then(|value| value.to_str().ok())
            .map_or_else(|| id.clone(), str::to_owned);
        let salt = self.config.token_salt.then(|| {
            use std::hash::{BuildHasher, RandomState};
            RandomState::new().hash_one(n)
        });
        Arc::new(Meta {
            stream: stream.unwrap_or_else(|| id.clone()),
            id,
            model,
            created,
            salt,
            request,
        })
    }
}
