//! `streamgate`: put it in front of any OpenAI-compatible server (`proxy`), find where a
//! freeze began (`diagnose`), drive a server with misbehaving clients (`loadgen`), or run the
//! reference server (`sim`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use streamgate_cli::{diagnose, loadgen, proxy, sim};

/// Streams of LLM tokens that do not freeze, and the hop to blame when they do.
#[derive(Parser)]
#[command(name = "streamgate", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Put streamgate in front of an OpenAI-compatible server (vLLM, SGLang, llama.cpp, TGI, ...).
    Proxy(proxy::Config),
    /// Name the hop where each stall began, from hop records.
    Diagnose(diagnose::Args),
    /// Drive an OpenAI-compatible endpoint with many streams and misbehaving readers.
    Loadgen(loadgen::Args),
    /// The reference server: chat completions, Anthropic Messages and OpenAI Responses streams
    /// over a simulated decode loop.
    Sim(sim::Config),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime")
    };
    match cli.command {
        Command::Proxy(config) => runtime().block_on(proxy::run(config)),
        Command::Diagnose(args) => diagnose::main(args),
        Command::Loadgen(args) => runtime().block_on(loadgen::main(args)),
        Command::Sim(config) => runtime().block_on(sim::run(config)),
    }
}
