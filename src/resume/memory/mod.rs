//! The memory store: replay logs in this process.
//!
//! ```text
//! generator -> gate -> pump -> [replay log, bounded] -> reader 1 -> sse -> subscriber
//!                                                    -> reader 2 ...
//! ```
//!
//! A stream's pump moves the gate's events into its log as the log's bounds, the readers'
//! read-ahead and lag limits, the stop and the grace allow (`stream.rs`); each reader reads the
//! log at its own position (`reader.rs`).

mod log;
mod pump;
mod reader;
mod stream;

use std::collections::HashMap;

use self::pump::pump;
use self::reader::Reader;
use self::stream::{Registered, Streams};
use super::aliases::Aliases;
use super::claim::{Claim, Claims};
use super::error::AttachError;
use super::options::ResumeOptions;
use super::stats::{Counters, RegistryStats};
use super::subscriber::Subscriber;
use crate::chunk::Chunk;
use crate::ext::GateExt;
use crate::gate::Consumer;
use crate::sse::SseEvent;
use crate::sync::{Arc, Mutex, lock};

/// Replay logs in this process, by stream id.
pub(crate) struct Memory<C> {
    options: ResumeOptions,
    streams: Arc<Streams<C>>,
    counters: Arc<Counters>,
    /// The streams' second names.
    aliases: Aliases,
}

impl<C> Memory<C>
where
    C: Chunk + Clone + Into<SseEvent> + Send + Sync + 'static,
{
    pub(crate) fn new(options: ResumeOptions) -> Self {
        Memory {
            options,
            streams: Arc::new(Mutex::new(HashMap::new())),
            counters: Arc::new(Counters::default()),
            aliases: Aliases::default(),
        }
    }

    /// Whether a stream is registered under `id` (running, or retained after its end).
    pub(crate) fn contains(&self, id: &str) -> bool {
        lock(&self.streams).contains_key(id)
    }

    /// Registers the stream of `consumer` under its claim's id; its first subscriber reads
    /// from the stream's first event. A stream retained under the id (which a claim makes
    /// impossible, short of a foreign one) is replaced.
    ///
    /// # Panics
    ///
    /// If called outside a tokio runtime.
    pub(crate) fn register(&self, claim: Claim, consumer: Consumer<C>) -> Subscriber {
        let id: Arc<str> = claim.id().into();
        let entry = Arc::new(Registered::new(
            id.clone(),
            (consumer.handle(), claim.shape, claim.generation()),
            &self.options,
            self.counters.clone(),
        ));
        lock(&self.streams).insert(id.clone(), entry.clone());
        let first = Reader::attached(entry.clone(), 0, self.options.max_lag, false)
            .expect("an unchecked attach succeeds")
            .sse()
            .error_shape(entry.shape);
        claim.registered(consumer.handle());
        tokio::spawn(pump(
            entry,
            consumer,
            self.streams.clone(),
            self.options.retain,
            claim,
        ));
        Subscriber::new(id, first)
    }

    /// A subscriber of the stream `id` after the event `after`.
    pub(crate) fn attach(&self, id: &str, after: Option<u64>) -> Result<Subscriber, AttachError> {
        let entry = lock(&self.streams)
            .get(id)
            .cloned()
            .ok_or(AttachError::Unknown)?;
        let next = after.map_or(0, |after| after.saturating_add(1));
        let reader = Reader::attached(entry.clone(), next, self.options.max_lag, true)?;
        self.counters.resumed();
        Ok(Subscriber::new(
            entry.id.clone(),
            reader.sse().error_shape(entry.shape).starting_at(next),
        ))
    }

    /// `alias` names the stream `id`, claimed (`claims`) or registered, while it is kept;
    /// nothing, with no such stream.
    pub(crate) fn alias(&self, claims: &Claims, alias: &str, id: &str) {
        if let Some(generation) = self.generation(claims, id) {
            self.aliases.alias(alias, id, generation);
        }
    }

    /// The id of the stream `alias` names: the stream it was given to, claimed or registered
    /// (not one claimed later under the same id).
    pub(crate) fn resolve(&self, claims: &Claims, alias: &str) -> Option<String> {
        let (id, generation) = self.aliases.resolve(alias)?;
        (self.generation(claims, &id) == Some(generation)).then_some(id)
    }

    /// The generation of the stream `id`: its claim's while it is held, then (retained) its
    /// registered entry's.
    fn generation(&self, claims: &Claims, id: &str) -> Option<u64> {
        claims
            .generation(id)
            .or_else(|| lock(&self.streams).get(id).map(|entry| entry.generation))
    }

    /// From now on the log of `id` takes every event at once (a stopped stream's last events
    /// wait for no slow reader and no resume).
    pub(crate) fn stop_waiting(&self, id: &str) {
        if let Some(entry) = lock(&self.streams).get(id).cloned() {
            entry.stop_waiting();
        }
    }

    /// What the store holds now, and what happened so far.
    pub(crate) fn stats(&self) -> RegistryStats {
        let streams = lock(&self.streams);
        let (mut detached, mut log_bytes) = (0, 0);
        for entry in streams.values() {
            let state = lock(&entry.state);
            log_bytes += state.log.bytes();
            if state.attached() == 0 && state.end.is_none() && !state.expired {
                detached += 1;
            }
        }
        self.counters.stats(streams.len(), detached, log_bytes)
    }
}
