//! The server's side of the engine: each generation's prompt made and checked where the
//! request arrives (its chat template, its tokens, the slot it must fit), its gate made, and
//! the request handed to the engine loop, or refused before any work starts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use llama_cpp_2::model::LlamaModel;
use serde_json::{Map, Value};
use streamgate::Consumer;
use streamgate_cli::serve::{Delta, Host, Job, Refusal, Worker};
use tokio::sync::mpsc;

use crate::places::Places;
use crate::sequence::Admission;
use crate::stats::EngineStats;
use crate::template::ChatTemplate;

/// How long a release waits for the engine to let go of a sequence (a channel gate's stop
/// grace): longer than any step, so that its hook always sees the cells freed.
const RELEASE_WAITS: Duration = Duration::from_secs(3600);

/// The engine as the serving code's worker.
pub struct Llama {
    model: &'static LlamaModel,
    /// Its name in answers whose request named none.
    name: String,
    template: ChatTemplate,
    /// The most tokens a sequence holds: its prompt and its answer.
    slot_tokens: u32,
    /// The places a request may take: a slot, or a waiting one.
    places: Arc<Places>,
    engine: mpsc::UnboundedSender<Admission>,
    stats: Arc<EngineStats>,
}

impl Llama {
    /// The worker of the engine loop fed by `engine`.
    pub fn new(
        model: &'static LlamaModel,
        name: String,
        template: ChatTemplate,
        slot_tokens: u32,
        places: Arc<Places>,
        engine: mpsc::UnboundedSender<Admission>,
        stats: Arc<EngineStats>,
    ) -> Self {
        Llama {
            model,
            name,
            template,
            slot_tokens,
            places,
            engine,
            stats,
        }
    }

    /// The prompt's tokens for `job`, checked against a slot.
    fn prompt(&self, job: &Job) -> Result<Vec<llama_cpp_2::token::LlamaToken>, Refusal> {
        let invalid = |code, message| Refusal::Invalid { code, message };
        let request = &job.request;
        let text = self
            .template
            .prompt(&request.conversation, request.continues)
            .map_err(|error| invalid("invalid_prompt", error))?;
        let vocab = self.model.vocab();
        // The template may have written the BOS token already (as `bos_token`).
        let bos = self.template.bos();
        let add_bos = vocab.should_add_bos() && (bos.is_empty() || !text.starts_with(bos));
        let tokens = vocab.tokenize(text.as_bytes(), add_bos, true);
        if tokens.is_empty() {
            return Err(invalid("invalid_prompt", "the prompt is empty".into()));
        }
        if tokens.len() >= self.slot_tokens as usize {
            let message = format!(
                "This model's context holds {} tokens per sequence; the prompt has {} (at least \
                 one must be left for the answer). Shorten the conversation.",
                self.slot_tokens,
                tokens.len()
            );
            return Err(invalid("context_length_exceeded", message));
        }
        Ok(tokens)
    }

    /// Takes a place (a slot, or a waiting one), or says every one is held.
    fn take_place(&self) -> Result<(), Refusal> {
        self.places.take().map_err(|held| Refusal::Busy {
            code: "queue_full",
            message: format!(
                "every slot is busy and every place to wait for one is taken ({held} requests \
                 held); retry shortly"
            ),
        })
    }
}

impl Worker for Llama {
    /// Makes and checks the prompt, then hands the request to the engine loop, which gives it
    /// a slot when one is free (its stream starts now, with heartbeats meanwhile).
    fn start(&self, host: &Arc<Host>, job: Job) -> Result<Consumer<Delta>, Refusal> {
        if job.skip > 0 {
            return Err(Refusal::Invalid {
                code: "cannot_regenerate",
                message: "a model does not make the same answer twice: name the stream with \
                          `id=` to resume it instead"
                    .into(),
            });
        }
        if self.engine.is_closed() {
            return Err(Refusal::Busy {
                code: "engine_stopped",
                message: "the engine loop has stopped".into(),
            });
        }
        let prompt = self.prompt(&job)?;
        let room = u64::from(self.slot_tokens) - prompt.len() as u64;
        let max_tokens = job.request.max_tokens.map_or(room, |asked| asked.min(room));
        self.take_place()?;
        let freed = Arc::new(AtomicU64::new(0));
        let on_release = {
            let (freed, stats) = (freed.clone(), self.stats.clone());
            // The engine has freed the sequence's cells and dropped its sender by now.
            move |_, _: &_| {
                let cells = freed.load(Ordering::SeqCst);
                stats.kv_cells_freed.fetch_add(cells, Ordering::Relaxed);
            }
        };
        // The engine drops a sequence's sender at its next settle, after at most one step,
        // having freed its cells: the release waits for that however long a step takes.
        let (tx, consumer) = host.gate(0, on_release).stop_grace(RELEASE_WAITS).channel();
        let admission = Admission {
            hops: host.hops(&job.meta, tx.handle()),
            host: host.clone(),
            ended: Box::pin(tx.closed_owned()),
            stopped: Box::pin(job.stop.clone().cancelled_owned()),
            meta: job.meta,
            prompt,
            max_tokens,
            sampling: job.request.sampling,
            stop: job.stop,
            tx,
            freed,
        };
        if let Err(lost) = self.engine.send(admission) {
            // The loop stopped since the check above: the dropped sender ends the stream
            // as a generator error, which the client sees.
            self.places.give_back();
            drop(lost);
        }
        Ok(consumer)
    }

    fn model(&self) -> &str {
        &self.name
    }

    fn stats(&self, fields: &mut Map<String, Value>) {
        self.stats.fields(fields);
    }
}
