//! A server's state (its flags, worker, counters, probes, store and streams), and a new
//! generation's metadata.

use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use metrics_exporter_prometheus::PrometheusHandle;
use streamgate::Group;
use streamgate::browser::BrowserProbe;
use streamgate::probe::{HopProbe, RecordSink};

use super::config::ServeFlags;
use super::delta::Delta;
use super::format::Format;
use super::host::Host;
use super::meta::Meta;
use super::request::Request;
use super::worker::Worker;
use crate::request_id::RequestIds;

/// A server's state: its flags, worker, counters, probes and streams.
pub struct Server {
    pub(super) config: ServeFlags,
    pub(super) worker: Arc<dyn Worker>,
    /// What the worker's generations get from the server (their gates, hops and counts).
    pub(super) host: Arc<Host>,
    /// Answer ids per format (`chatcmpl-`, `msg_` or `resp_` and 32 hex digits, by
    /// [`Format::index`]), unguessable: a stream a client gave no id is named by its answer's.
    ids: [RequestIds; 3],
    pub(super) write: HopProbe,
    pub(super) sent: HopProbe,
    /// The page's hops (`client.recv`, `client.render`), with `--hop-records`.
    pub(super) browser: Option<BrowserProbe>,
    pub(super) prometheus: PrometheusHandle,
    /// Where hop records go (`--hop-records`), if anywhere: sync it before exiting.
    pub records: Option<RecordSink>,
    /// Every streamed generation by its request id: resumable, several readers at once, and
    /// the explicit stop of every generation running here.
    pub(super) store: streamgate::resume::Registry<Delta>,
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.config.addr)
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// The state for `config` and `worker`: its probes (writing the records of
    /// `--hop-records` to `records`) and its store.
    ///
    /// # Errors
    ///
    /// When the resume store's URL is malformed.
    pub(super) fn new(
        config: ServeFlags,
        worker: Arc<dyn Worker>,
        prometheus: PrometheusHandle,
        records: Option<RecordSink>,
    ) -> Result<Self, String> {
        let store = config.resume.open(&config.gate)?;
        let sample = config.hop_records_sample;
        let host = Host::new(
            config.gate.clone(),
            config.resume.clone(),
            sample.hop(&records, "worker.decode"),
            sample.hop(&records, "worker.publish"),
        );
        Ok(Server {
            worker,
            host: Arc::new(host),
            ids: Format::ALL.map(|format| RequestIds::new(format.id_prefix())),
            write: sample.hop(&records, "worker.write"),
            sent: sample.hop(&records, "worker.sent"),
            browser: sample.browser(&records),
            prometheus,
            config,
            records,
            store,
        })
    }

    /// A new generation's metadata for `request`, streamed in `format`: its model is the one
    /// the request named (else the worker's), its stream is named `stream` (a valid request
    /// id) or by its answer's id, and it continues an assistant message when the request does.
    pub(super) fn meta(
        &self,
        format: Format,
        request: &Request,
        stream: Option<&str>,
    ) -> Arc<Meta> {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let id = self.ids[format.index()].next_id();
        Arc::new(Meta {
            format,
            stream: stream.map_or_else(|| id.clone(), str::to_owned),
            id,
            model: (request.model.as_deref())
                .unwrap_or(self.worker.model())
                .to_owned(),
            created,
            continued: request.continues,
        })
    }

    /// Every stream: shut down together on SIGINT/SIGTERM (give it to
    /// [`serving::serve_until`](crate::serving::serve_until)).
    pub fn streams(&self) -> &Group {
        &self.host.streams
    }
}
