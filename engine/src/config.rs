//! `streamgate-llama`'s flags: the serving code's (as `streamgate sim` takes them) and the
//! engine's (the model, its context, the slots, the threads, the batch, the queue).

use std::path::PathBuf;

use streamgate_cli::serve::ServeFlags;

/// `streamgate-llama`: a continuous-batching server for a GGUF model on llama.cpp.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "streamgate-llama",
    version,
    after_help = "\
Endpoints, as streamgate sim serves them (examples/README.md, \"The reference server\"):
  POST /v1/chat/completions, /v1/messages, /v1/responses   streamed or whole answers
  GET  /v1/chat/completions/{id}/stream, /v1/messages/{id}/stream, /v1/responses/{id}?stream=true
                                resume after Last-Event-ID (or ?after=N, starting_after=N)
  POST /v1/{chat/completions,messages,responses}/{id}/cancel   stop a stream
  GET  /stats, /metrics"
)]
pub struct Config {
    #[command(flatten)]
    pub serve: ServeFlags,
    /// The GGUF model file.
    #[arg(short = 'm', long, value_name = "FILE")]
    pub model: PathBuf,
    /// The model's name in answers whose request named none (as llama-server's `--alias`;
    /// default: the file's name without `.gguf`).
    #[arg(short = 'a', long, value_name = "NAME")]
    pub alias: Option<String>,
    /// The KV cache's size in tokens (16 or more), shared equally by the slots: each sequence
    /// holds at most N / `--parallel` tokens, its prompt and its answer (as llama-server's
    /// `-c`).
    #[arg(short = 'c', long = "ctx-size", value_name = "N", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(16..))]
    pub ctx_size: u32,
    /// The sequences decoded together (1 to 256), each in its own slot of the KV cache (as
    /// llama-server's `-np`, which is `--np` here).
    #[arg(long = "parallel", visible_alias = "np", value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub parallel: u32,
    /// The threads llama.cpp decodes with (default: every core).
    #[arg(short = 't', long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub threads: Option<u32>,
    /// The most tokens one decode step takes (16 or more, and at least `--parallel`): one per
    /// decoding sequence, the rest from prompts (a long prompt is taken in steps of this many
    /// tokens, between which the others decode).
    #[arg(short = 'b', long = "batch-size", value_name = "N", default_value_t = 512, value_parser = clap::value_parser!(u32).range(16..))]
    pub batch_size: u32,
    /// Requests that wait for a slot (their streams start at once, with heartbeats); one more
    /// is refused with 503 and `Retry-After: 1`.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub queue: usize,
}

impl Config {
    /// Each sequence's share of the KV cache, in tokens.
    pub fn slot_tokens(&self) -> u32 {
        self.ctx_size / self.parallel
    }

    /// The model's name in answers whose request named none.
    pub fn model_name(&self) -> String {
        self.alias.clone().unwrap_or_else(|| {
            let stem = self.model.file_stem().unwrap_or(self.model.as_os_str());
            stem.to_string_lossy().into_owned()
        })
    }

    /// The threads to decode with.
    pub fn threads(&self) -> i32 {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        self.threads.unwrap_or(cores).min(i32::MAX as u32) as i32
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn the_defaults_and_what_is_refused() {
        let config = Config::try_parse_from(["streamgate-llama", "-m", "m.gguf"]).unwrap();
        assert_eq!(
            (config.ctx_size, config.parallel, config.batch_size),
            (4096, 4, 512)
        );
        assert_eq!(config.slot_tokens(), 1024);
        assert_eq!(config.serve.addr, "127.0.0.1:8000".parse().unwrap());
        assert_eq!(config.model_name(), "m");
        for args in [
            &["--parallel", "0"][..],
            &["-c", "8"],
            &["-b", "0"],
            &["-t", "0"],
            &["--parallel", "257"],
        ] {
            let all = ["streamgate-llama", "-m", "m.gguf"].iter().chain(args);
            assert!(Config::try_parse_from(all).is_err(), "{args:?}");
        }
        assert!(
            Config::try_parse_from(["streamgate-llama"]).is_err(),
            "no model"
        );
    }
}
