//! The reference server's state, and a new generation's metadata.

use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use metrics_exporter_prometheus::PrometheusHandle;
use streamgate::Group;
use streamgate::browser::BrowserProbe;
use streamgate::probe::{HopProbe, RecordSink};

use super::config::Config;
use super::delta::Delta;
use super::format::Format;
use super::kv::KvPool;
use super::meta::Meta;
use super::request::Start;
use super::stats::Stats;
use crate::request_id::RequestIds;

/// The reference server's state: its configuration, KV pool, counters, probes and streams.
pub struct Sim {
    pub(super) config: Config,
    pub(super) stats: Stats,
    pub(super) kv: Arc<KvPool>,
    /// Answer ids per format (`chatcmpl-`, `msg_` or `resp_` and 32 hex digits, by
    /// [`Format::index`]), unguessable: a stream a client gave no id is named by its answer's.
    ids: [RequestIds; 3],
    pub(super) decode: HopProbe,
    pub(super) publish: HopProbe,
    pub(super) write: HopProbe,
    pub(super) sent: HopProbe,
    /// The page's hops (`client.recv`, `client.render`), with `--hop-records`.
    pub(super) browser: Option<BrowserProbe>,
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
        let sample = config.hop_records_sample;
        Ok(Sim {
            stats: Stats::default(),
            kv: KvPool::new(config.kv_blocks),
            ids: Format::ALL.map(|format| RequestIds::new(format.id_prefix())),
            decode: sample.hop(&records, "worker.decode"),
            publish: sample.hop(&records, "worker.publish"),
            write: sample.hop(&records, "worker.write"),
            sent: sample.hop(&records, "worker.sent"),
            browser: sample.browser(&records),
            prometheus,
            config,
            records,
            streams: Group::new(),
            store,
        })
    }

    /// A new generation's metadata, streamed in `format`, starting at `start`; its stream is
    /// named `stream` (a valid request id), or by its answer's id.
    pub(super) fn meta(
        &self,
        format: Format,
        model: String,
        stream: Option<&str>,
        start: Start,
    ) -> Arc<Meta> {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let ids = &self.ids[format.index()];
        let id = ids.next_id();
        let salt = match start {
            // The text it continues says it.
            Start::Continue {
                salt: Some(salt), ..
            } => Some(salt),
            _ => self.config.token_salt.then(|| ids.random()),
        };
        Arc::new(Meta {
            format,
            stream: stream.map_or_else(|| id.clone(), str::to_owned),
            id,
            model,
            created,
            salt,
            continued: matches!(start, Start::Continue { .. }),
        })
    }
}
