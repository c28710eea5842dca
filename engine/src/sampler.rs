//! The sampling a request asks for, as a llama.cpp sampler chain: greedy at temperature 0,
//! else nucleus (`top_p`) and temperature before a seeded draw; with `ignore_eos`, the
//! end-of-generation tokens are never drawn. Defaults are OpenAI's (temperature 1, `top_p` 1,
//! a random seed).

use std::hash::{BuildHasher, RandomState};

use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::logit_bias::LlamaLogitBias;
use streamgate_cli::serve::Sampling;

/// The model's end-of-generation tokens, which `ignore_eos` takes out of every draw.
#[derive(Debug, Clone)]
pub struct EndTokens {
    vocab: i32,
    banned: Vec<LlamaLogitBias>,
}

impl EndTokens {
    /// The end-of-generation tokens of `vocab`.
    pub fn of(vocab: &llama_cpp_2::vocab::LlamaVocab<'_>) -> Self {
        let banned = vocab
            .tokens()
            .filter(|&token| vocab.is_eog(token))
            .map(|token| LlamaLogitBias::new(token, f32::NEG_INFINITY))
            .collect();
        EndTokens {
            vocab: vocab.n_tokens(),
            banned,
        }
    }
}

/// llama.cpp's seed that asks it for a random one (`LLAMA_DEFAULT_SEED`).
const RANDOM_SEED: u32 = u32::MAX;

/// The sampler chain for `sampling`, drawing no token of `ends` with `ignore_eos`.
pub fn sampler(sampling: &Sampling, ends: &EndTokens) -> LlamaSampler {
    let mut chain = Vec::with_capacity(4);
    if sampling.ignore_eos {
        chain.push(LlamaSampler::logit_bias(ends.vocab, &ends.banned));
    }
    let temperature = sampling.temperature.unwrap_or(1.0);
    if temperature <= 0.0 {
        chain.push(LlamaSampler::greedy());
    } else {
        let top_p = sampling.top_p.unwrap_or(1.0);
        if top_p < 1.0 {
            chain.push(LlamaSampler::top_p(top_p, 1));
        }
        chain.push(LlamaSampler::temp(temperature));
        chain.push(LlamaSampler::dist(seed(sampling.seed)));
    }
    LlamaSampler::chain_simple(chain)
}

/// The draw's seed: the request's (folded into 32 bits, never llama.cpp's "random"), or a
/// random one.
fn seed(asked: Option<u64>) -> u32 {
    match asked {
        Some(seed) => {
            let folded = (seed ^ (seed >> 32)) as u32;
            if folded == RANDOM_SEED {
                folded - 1
            } else {
                folded
            }
        }
        None => RandomState::new().hash_one(std::time::Instant::now()) as u32 & !1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_asked_for_is_kept_and_never_means_random() {
        assert_eq!(seed(Some(7)), 7);
        assert_eq!(seed(Some(7)), seed(Some(7)));
        assert_ne!(seed(Some(u64::from(u32::MAX))), RANDOM_SEED);
        assert_ne!(seed(Some(u64::MAX)), RANDOM_SEED);
        assert_ne!(seed(None), RANDOM_SEED);
    }
}
