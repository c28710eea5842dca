//! What a stream is about: its completion's id, model and creation time, its name, and its
//! token text.

use std::fmt;

use streamgate::openai::ChunkTemplate;

/// What a stream is about: shared by all its chunks, so each chunk can encode itself.
#[derive(Debug)]
pub(super) struct Meta {
    pub(super) id: String,
    pub(super) model: String,
    pub(super) created: u64,
    /// The stream's name in the registry (the response's `x-request-id`).
    pub(super) stream: String,
    /// With `--token-salt`, this generation's salt, so a regenerated stream shows.
    pub(super) salt: Option<u64>,
    /// The id the probes record: the client's `x-request-id`, so every hop of the path records
    /// the same request, or else the completion id.
    pub(super) request: String,
}

impl Meta {
    /// What every chunk of this stream repeats.
    pub(super) fn template(&self) -> ChunkTemplate<'_> {
        ChunkTemplate::new(&self.id, self.created, &self.model)
    }

    /// The bytes every chunk of this stream carries besides its text: the metadata and the
    /// JSON around it.
    pub(super) fn chunk_overhead(&self) -> usize {
        const ENVELOPE: usize = 128;
        ENVELOPE + self.id.len() + self.model.len()
    }

    /// The text of tokens `from..=to`, written out only when displayed.
    pub(super) fn tokens(&self, from: u64, to: u64) -> Tokens<'_> {
        Tokens {
            meta: self,
            from,
            to,
        }
    }

    /// Writes token `i`'s text: `t{i} `, or `t{i}.{salt} ` with `--token-salt`.
    fn write_token(&self, i: u64, out: &mut impl fmt::Write) -> fmt::Result {
        match self.salt {
            Some(salt) => write!(out, "t{i}.{salt:x} "),
            None => write!(out, "t{i} "),
        }
    }

    /// The length of token `i`'s text.
    pub(super) fn token_len(&self, i: u64) -> usize {
        let digits = |n: u64, base: u64| n.checked_ilog(base).map_or(1, |log| log as usize + 1);
        let salt = self.salt.map_or(0, |salt| 1 + digits(salt, 16));
        2 + digits(i, 10) + salt
    }
}

/// The text of a run of tokens, displayed (into a chunk's JSON string, say) without being
/// collected first.
pub(super) struct Tokens<'a> {
    meta: &'a Meta,
    from: u64,
    to: u64,
}

impl fmt::Display for Tokens<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (self.from..=self.to).try_for_each(|i| self.meta.write_token(i, f))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tokens_length_is_the_length_of_its_text() {
        for salt in [None, Some(0), Some(0xf), Some(0x10), Some(u64::MAX)] {
            let meta = Meta {
                id: "chatcmpl-0".into(),
                model: "m".into(),
                created: 0,
                stream: "chatcmpl-0".into(),
                salt,
                request: "chatcmpl-0".into(),
            };
            for i in [0, 1, 9, 10, 99, 100, 12_345, u64::MAX] {
                let text = meta.tokens(i, i).to_string();
                assert_eq!(meta.token_len(i), text.len(), "token {i}, salt {salt:?}");
            }
        }
    }
}
