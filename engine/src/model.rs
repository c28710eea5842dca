//! The model: a GGUF file loaded into llama.cpp (checked first, so that a file that is no
//! model is named as such), its chat template, and a context for the engine loop.

use std::io::Read;
use std::num::NonZeroU32;
use std::path::Path;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::token::LlamaToken;

use crate::config::Config;
use crate::template::ChatTemplate;

/// A loaded model, which lives as long as the process, and llama.cpp's backend.
pub struct Model {
    pub backend: &'static LlamaBackend,
    pub model: &'static LlamaModel,
}

impl Model {
    /// Loads the GGUF model at `path`.
    ///
    /// # Errors
    ///
    /// A file that cannot be read, is no GGUF file, that llama.cpp cannot load, or a model
    /// that is not a transformer (a recurrent or hybrid one).
    pub fn load(path: &Path) -> Result<Self, String> {
        let shown = path.display();
        let mut magic = [0; 4];
        std::fs::File::open(path)
            .and_then(|mut file| file.read_exact(&mut magic))
            .map_err(|error| format!("{shown}: {error}"))?;
        if &magic != b"GGUF" {
            return Err(format!(
                "{shown}: not a GGUF model file (it does not start with the bytes `GGUF`)"
            ));
        }
        let mut backend =
            LlamaBackend::init().map_err(|error| format!("llama.cpp's backend: {error}"))?;
        backend.void_logs();
        let backend: &'static LlamaBackend = Box::leak(Box::new(backend));
        let model = LlamaModel::load_from_file(backend, path, &LlamaModelParams::default())
            .map_err(|error| {
                format!(
                    "{shown}: llama.cpp could not load it (a truncated or damaged file, or a \
                     model whose architecture this llama.cpp does not know): {error}"
                )
            })?;
        if model.is_recurrent() || model.is_hybrid() {
            // Its memory is a state per sequence, not cells by position: the engine's count
            // of cells, a step's fillers and a slot's move would not hold.
            return Err(format!(
                "{shown}: a recurrent or hybrid model (Mamba, RWKV, ...): streamgate-llama \
                 serves transformer models, whose memory is a KV cache"
            ));
        }
        Ok(Model {
            backend,
            model: Box::leak(Box::new(model)),
        })
    }

    /// The model's chat template.
    ///
    /// # Errors
    ///
    /// A model with none (a base model), or one minijinja cannot read.
    pub fn template(&self) -> Result<ChatTemplate, String> {
        let source = self
            .model
            .chat_template(None)
            .ok()
            .and_then(|template| template.to_string().ok())
            .ok_or("the model has no chat template (a base model?): it cannot answer a chat")?;
        let vocab = self.model.vocab();
        // A model may have no BOS or EOS token (llama.cpp's -1): its text is then empty.
        let text = |token: LlamaToken| match (0..vocab.n_tokens()).contains(&token.0) {
            true => String::from_utf8_lossy(&vocab.token_to_piece(token, true, None)).into_owned(),
            false => String::new(),
        };
        ChatTemplate::new(source, text(vocab.bos()), text(vocab.eos()))
    }

    /// The engine loop's context: `--parallel` sequences, each in a KV stream of its own of
    /// `--ctx-size` / `--parallel` cells (as llama-server with an explicit `-np`), steps of
    /// `--batch-size` tokens, `--threads` threads. A stream per sequence, not one cache for
    /// all: each sequence's attention then reads its own cells only, so a step's cost does not
    /// grow with the others' contexts and an answer does not depend on what is decoded beside
    /// it (eight concurrent greedy streams give the texts of eight sequential ones; with one
    /// cache they did not, and 8 sequences' steps took 19% longer).
    ///
    /// # Errors
    ///
    /// When llama.cpp cannot make it (not enough memory for the KV cache, say).
    pub fn context(&self, config: &Config) -> Result<LlamaContext<'static>, String> {
        let threads = config.threads();
        let params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(config.ctx_size))
            .with_n_seq_max(config.parallel)
            .with_kv_unified(false)
            // A step's tokens, and a filler for each slot but one (see the engine's steps).
            .with_n_batch(config.batch_size + config.parallel)
            .with_n_ubatch(config.batch_size.min(512))
            .with_n_threads(threads)
            .with_n_threads_batch(threads);
        self.model
            .new_context(self.backend, params)
            .map_err(|error| format!("llama.cpp could not make the context: {error}"))
    }
}
