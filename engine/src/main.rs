//! `streamgate-llama`: an inference server for a GGUF model, built on llama.cpp (through the
//! `llama-cpp-2` crate) and on `streamgate`'s serving code, the same that `streamgate sim`
//! serves: OpenAI chat completions, Anthropic Messages and OpenAI Responses, streamed (one
//! event per run of text, flushed, with heartbeats) or whole, with request ids, resume,
//! cancel, `/stats`, `/metrics` and hop records.
//!
//! ```text
//! streamgate-llama -m model.gguf --addr 127.0.0.1:8080 [-c 4096] [--parallel 4] [-b 512]
//! ```
//!
//! One engine loop (its own thread, which owns llama.cpp's context) decodes every running
//! sequence in one `llama_decode` per step, continuous batching: a new request's prompt is
//! read in the steps between the others' tokens. Each event goes to its stream's gate
//! ([`streamgate::Gate::channel`]) with `try_send`, which never waits: a gate that is full
//! (its client reads slowly, or not at all) leaves its sequence out of the next steps, its KV
//! cells kept, while the others go on, and the gate's slow-consumer policy decides when it
//! ends; an end of any kind (the client gone, the policy, `POST .../cancel`, a shutdown, the
//! answer done) removes the sequence's cells from llama.cpp's memory at once, and its release
//! hook counts them (`kv_cells_freed`). `/stats` has the engine's count of cells in use and
//! llama.cpp's (`kv_cells_in_use`, `kv_cells_llama`), the sequences running and paused, the
//! requests waiting for a slot.
//!
//! - `config`: the flags; `model`: the GGUF file, its chat template and the context.
//! - `template`: the model's chat template (Jinja, through minijinja), a conversation as its
//!   prompt; `worker`: each request's prompt made and checked, its gate, its hand-over.
//! - `engine`: the loop; `sequence`: one request in it; `sampler`: its sampling;
//!   `utf8`, `stop`: its text as whole characters, cut at its stop sequences.
//! - `stats`: the engine's counters in `/stats`.

mod config;
mod engine;
mod model;
mod places;
mod sampler;
mod sequence;
mod stats;
mod stop;
mod template;
mod utf8;
mod worker;

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use tokio::sync::mpsc;

use self::config::Config;
use self::engine::{Engine, Limits};
use self::model::Model;
use self::places::Places;
use self::stats::EngineStats;
use self::worker::Llama;

/// The smallest slot worth serving: a prompt and a few tokens of answer.
const MIN_SLOT_TOKENS: u32 = 16;

fn main() -> ExitCode {
    let config = Config::parse();
    match start(&config) {
        Ok(llama) => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime");
            let serve = config.serve.clone();
            runtime.block_on(streamgate_cli::serve::run(
                "streamgate-llama",
                serve,
                Arc::new(llama),
            ))
        }
        Err(error) => {
            eprintln!("streamgate-llama: {error}");
            ExitCode::from(2)
        }
    }
}

/// Loads the model, starts the engine loop on its own thread, and gives its worker.
fn start(config: &Config) -> Result<Llama, String> {
    if config.slot_tokens() < MIN_SLOT_TOKENS {
        return Err(format!(
            "--ctx-size {} shared by --parallel {} leaves {} tokens per sequence; at least \
             {MIN_SLOT_TOKENS} are needed",
            config.ctx_size,
            config.parallel,
            config.slot_tokens()
        ));
    }
    if config.batch_size < config.parallel {
        return Err(format!(
            "--batch-size {} is less than --parallel {}: a step must take a token of every \
             running sequence",
            config.batch_size, config.parallel
        ));
    }
    let model = Model::load(&config.model)?;
    let template = model.template()?;
    let ctx = model.context(config)?;
    let limits = Limits {
        batch_size: config.batch_size,
        slots: config.parallel,
        slot_tokens: config.slot_tokens(),
    };
    let stats = Arc::new(EngineStats::default());
    let places = Arc::new(Places::new(config.parallel, config.queue));
    let (requests, incoming) = mpsc::unbounded_channel();
    let engine = Engine::new(
        model.model,
        ctx,
        limits,
        incoming,
        places.clone(),
        stats.clone(),
    );
    let thread = std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || {
            // The loop's own runtime: it waits on gates and requests only when it has no
            // step to decode, and a step blocks nothing but this thread.
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a tokio runtime");
            runtime.block_on(engine.run());
        })
        .map_err(|error| format!("starting the engine thread: {error}"))?;
    // A server whose engine died answers nothing: it exits, for its supervisor to restart it
    // (the panic's message is on stderr; every open stream ended with an error frame as the
    // loop's senders were dropped).
    std::thread::spawn(move || {
        if thread.join().is_err() {
            eprintln!("streamgate-llama: the engine loop panicked; exiting");
            std::process::exit(70);
        }
    });
    let slot_tokens = config.slot_tokens();
    Ok(Llama::new(
        model.model,
        config.model_name(),
        template,
        slot_tokens,
        places,
        requests,
        stats,
    ))
}
