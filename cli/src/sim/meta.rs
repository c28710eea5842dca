//! What a stream is about: its format, its answer's id, model and creation time, its name,
//! and its token text (and which text is a stream's first tokens, to continue it).

use std::fmt;
use std::ops::Range;

use streamgate::openai::ChunkTemplate;

use super::format::Format;

/// What a stream is about: shared by all its chunks, so each chunk can encode itself.
#[derive(Debug)]
pub(super) struct Meta {
    /// The API it is streamed in.
    pub(super) format: Format,
    /// The answer's id (the chunks' `id`, the message's; of a Responses stream, its message
    /// item's, the response's being the stream's name): `chatcmpl-`, `msg_` or `resp_` and 32
    /// hex digits.
    pub(super) id: String,
    pub(super) model: String,
    pub(super) created: u64,
    /// The request id: the stream's name in the registry, the response's `x-request-id`, the
    /// resume and cancel paths' id and every hop record's `request`.
    pub(super) stream: String,
    /// With `--token-salt`, this generation's salt, so a regenerated stream shows (a
    /// continuation's is the salt of the text it continues).
    pub(super) salt: Option<u64>,
    /// Whether the stream continues an assistant message: its first chunk names no author.
    pub(super) continued: bool,
}

impl Meta {
    /// What every chunk of this stream repeats.
    pub(super) fn template(&self) -> ChunkTemplate<'_> {
        ChunkTemplate::new(&self.id, self.created, &self.model)
    }

    /// The bytes every event of this stream carries besides its text: the metadata and the
    /// JSON around it (more in a Responses event, which places its text by item and part and
    /// numbers itself).
    pub(super) fn chunk_overhead(&self) -> usize {
        let envelope = match self.format {
            Format::Chat | Format::Messages => 128,
            Format::Responses => 192,
        };
        envelope + self.id.len() + self.model.len()
    }

    /// The text of the tokens `tokens` (none: empty).
    pub(super) fn text(&self, tokens: Range<u64>) -> String {
        let mut text = String::new();
        for i in tokens {
            self.write_token(i, &mut text)
                .expect("a String takes any text");
        }
        text
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
        write_token(i, self.salt, out)
    }

    /// The length of token `i`'s text.
    pub(super) fn token_len(&self, i: u64) -> usize {
        let digits = |n: u64, base: u64| n.checked_ilog(base).map_or(1, |log| log as usize + 1);
        let salt = self.salt.map_or(0, |salt| 1 + digits(salt, 16));
        2 + digits(i, 10) + salt
    }
}

/// The answer sim streams for `max_tokens` tokens (without `--token-salt`), in every API:
/// token i's text is `t{i} `.
///
/// # Examples
///
/// ```
/// assert_eq!(streamgate_cli::sim::answer_text(3), "t0 t1 t2 ");
/// ```
pub fn answer_text(max_tokens: u64) -> String {
    let mut text = String::new();
    for i in 0..max_tokens {
        write_token(i, None, &mut text).expect("a String takes any text");
    }
    text
}

/// Writes token `i`'s text with `salt`: `t{i} `, or `t{i}.{salt} ` (the salt in hex).
fn write_token(i: u64, salt: Option<u64>, out: &mut impl fmt::Write) -> fmt::Result {
    match salt {
        Some(salt) => write!(out, "t{i}.{salt:x} "),
        None => write!(out, "t{i} "),
    }
}

/// How many of a stream's first tokens `text` is, exactly (`"t0 t1 t2 "`: 3; `""`: 0), and the
/// salt they carry: salted (`t0.{salt} ...`, one salt throughout) when `salted`, else plain.
/// `None` for any other text (a token cut short, a gap, another salt, other words).
pub(super) fn first_tokens(text: &str, salted: bool) -> Option<(u64, Option<u64>)> {
    let Some(body) = text.strip_suffix(' ') else {
        return text.is_empty().then_some((0, None));
    };
    let salt = match salted {
        // The first token says it: `t0.{salt}`; the comparison below checks its spelling.
        true => {
            let first = body.split(' ').next()?;
            Some(u64::from_str_radix(first.strip_prefix("t0.")?, 16).ok()?)
        }
        false => None,
    };
    let mut expected = String::new();
    let mut n = 0;
    for token in body.split(' ') {
        expected.clear();
        write_token(n, salt, &mut expected).expect("a String takes any text");
        if expected.strip_suffix(' ') != Some(token) {
            return None;
        }
        n += 1;
    }
    Some((n, salt))
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
                format: Format::Chat,
                id: "chatcmpl-0".into(),
                model: "m".into(),
                created: 0,
                stream: "chatcmpl-0".into(),
                salt,
                continued: false,
            };
            for i in [0, 1, 9, 10, 99, 100, 12_345, u64::MAX] {
                let text = meta.tokens(i, i).to_string();
                assert_eq!(meta.token_len(i), text.len(), "token {i}, salt {salt:?}");
                if let Some(next) = i.checked_add(1) {
                    assert_eq!(meta.text(i..next), text);
                }
            }
            // A stream's first tokens are known as such, with their salt.
            let salted = salt.is_some();
            for k in [0, 1, 3, 12] {
                let text = if k == 0 {
                    String::new()
                } else {
                    meta.tokens(0, k - 1).to_string()
                };
                let known = first_tokens(&text, salted);
                assert_eq!(known, Some((k, salt.filter(|_| k > 0))), "{text:?}");
                assert_eq!(first_tokens(&text, !salted), (k == 0).then_some((0, None)));
            }
        }
    }

    #[test]
    fn other_text_is_no_stream_s_first_tokens() {
        for text in [
            "t0",
            "t0 t1",
            "t1 ",
            "t0 t2 ",
            "t0  t1 ",
            " t0 ",
            "t00 ",
            "t0 t1 hello ",
            "hello",
        ] {
            assert_eq!(first_tokens(text, false), None, "{text:?}");
        }
        for text in ["t0.a t1.b ", "t0.A ", "t0.0a ", "t0.ff t1 ", "t0 ", "t0.x "] {
            assert_eq!(first_tokens(text, true), None, "{text:?}");
        }
        assert_eq!(first_tokens("t0.ff t1.ff ", true), Some((2, Some(0xff))));
    }
}
