//! One generation behind its gate: the simulated decode loop, from its first KV block to its
//! release.

use std::sync::Arc;
use std::time::Duration;

use streamgate::probe::Observation;
use streamgate::{BoxError, Consumer, EndReason, Kind, Sender};
use tokio_util::sync::CancellationToken;

use super::delta::{Delta, FinishReason};
use super::kv::{KvBlocks, KvFull};
use super::meta::Meta;
use super::state::Sim;

/// Starts one generation of tokens `from..max_tokens` for `meta`'s stream, gated as
/// configured, that `stop` (an explicit stop under the stream's name) ends with a final chunk
/// and `[DONE]`. Its first KV block is taken here: when every block is held by other streams,
/// nothing starts.
pub(super) fn generate(
    sim: &Arc<Sim>,
    meta: Arc<Meta>,
    from: u64,
    max_tokens: u64,
    stop: CancellationToken,
) -> Result<Consumer<Delta>, KvFull> {
    let mut blocks = sim.kv.holding();
    if from < max_tokens {
        blocks
            .room_for(0)
            .inspect_err(|_| sim.stats.refused_kv_full())?;
    }
    sim.stats.streams.start();
    let on_release = {
        let sim = sim.clone();
        // The generator, and the KV blocks it holds, are gone by now.
        move |reason: EndReason, gate: streamgate::GateStats| sim.stats.released(reason, &gate)
    };
    let worker = Worker {
        sim: sim.clone(),
        meta,
        from,
        max_tokens,
        stop,
        blocks,
    };
    let config = &sim.config;
    Ok(config
        .gate
        .gate(&config.resume)
        // Token i is event i, whether the generation starts at 0 or resumes later.
        .first_id(from)
        .group(&sim.streams)
        .on_release(on_release)
        .spawn(move |_, tx| worker.run(tx)))
}

/// The generator of one stream: decodes a token every `--step-ms`, holding a KV block per 16.
struct Worker {
    sim: Arc<Sim>,
    meta: Arc<Meta>,
    from: u64,
    max_tokens: u64,
    /// The explicit stop (`POST .../cancel`): finish with `stop`.
    stop: CancellationToken,
    /// Given back when the worker is dropped (every end), or at once when the pool runs out.
    blocks: KvBlocks,
}

impl Worker {
    async fn run(mut self, mut tx: Sender<Delta>) -> Result<(), BoxError> {
        let config = &self.sim.config;
        let mut decode = self.sim.decode.recorder(self.meta.request.as_str());
        let mut publish = self.sim.publish.recorder(self.meta.request.as_str());
        let gone = |_| "the stream ended";
        let mut finish = FinishReason::Length;
        for i in self.from..self.max_tokens {
            if config.stall_at == Some(i) {
                self.pause(config.stall).await;
            }
            if !config.step.is_zero() {
                self.pause(config.step).await;
            }
            if self.stop.is_cancelled() {
                finish = FinishReason::Stop;
                break;
            }
            if let Err(full) = self.blocks.room_for(i - self.from) {
                decode.end(EndReason::GeneratorError);
                publish.end(EndReason::GeneratorError);
                // Other streams hold the rest of the pool: this one stops, gives its blocks
                // back at once, and says why before the gate's end.
                let blocks = self.blocks.give_back();
                self.sim.stats.kv_exhausted();
                let message = format!(
                    "{full}: the generation stopped after {} tokens and gave back the blocks \
                     it held ({blocks})",
                    i - self.from
                );
                let error = Delta::Error {
                    message: message.clone(),
                    code: "kv_cache_exhausted",
                };
                let _ = tx.send(error).await;
                return Err(message.into());
            }
            self.sim.stats.generated();
            let len = self.meta.token_len(i);
            let observed = Observation::new(Some(i), len as u64, Kind::Visible);
            decode.observe(observed);
            let token = Delta::Text {
                meta: self.meta.clone(),
                from: i,
                to: i,
                len,
            };
            tx.send(token).await.map_err(gone)?;
            publish.observe(observed);
        }
        // A stop asked for is the stream cancelled; a recorder dropped on the way out (the
        // gate ended first) is its consumer gone.
        let ended = match finish {
            FinishReason::Stop => EndReason::Cancelled,
            FinishReason::Length => EndReason::Completed,
        };
        decode.end(ended);
        publish.end(ended);
        let meta = self.meta.clone();
        tx.send(Delta::Finish {
            meta,
            reason: finish,
        })
        .await
        .map_err(gone)?;
        tx.send(Delta::Done).await.map_err(gone)?;
        Ok(())
    }

    /// Waits `duration`, or until the stream is stopped.
    async fn pause(&self, duration: Duration) {
        tokio::select! {
            () = tokio::time::sleep(duration) => {}
            () = self.stop.cancelled() => {}
        }
    }
}
