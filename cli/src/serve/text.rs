//! A run of an answer's text as a worker hands it to the gate: numbered tokens whose text is a
//! function of their number (sim's, written only when encoded), or text decoded from a model's
//! tokens.

use std::fmt;
use std::ops::Range;

/// A run of an answer's text, and how many tokens made it.
///
/// # Examples
///
/// ```
/// use streamgate_cli::serve::Text;
///
/// let mut run = Text::numbered(0..2, None);
/// assert_eq!(run.to_string(), "t0 t1 ");
/// assert!(run.merge(Text::numbered(2..3, None)).is_ok());
/// assert_eq!((run.to_string().as_str(), run.tokens()), ("t0 t1 t2 ", 3));
///
/// let mut decoded = Text::decoded("Hel".into(), 1);
/// assert!(decoded.merge(Text::decoded("lo".into(), 1)).is_ok());
/// assert_eq!((decoded.len(), decoded.tokens()), (5, 2));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Text {
    /// Tokens `tokens` of the deterministic answer: token i's text is `t{i} `, or
    /// `t{i}.{salt} ` (the salt in hex) with a salt. The text is written only when displayed,
    /// so a worker allocates nothing per token; `len` is its length in bytes.
    Numbered {
        tokens: Range<u64>,
        salt: Option<u64>,
        len: usize,
    },
    /// Text decoded from `tokens` of a model's tokens (whole UTF-8 characters: a token that
    /// ends inside one hands its bytes to the next run).
    Decoded { text: String, tokens: u64 },
}

impl Text {
    /// Tokens `tokens` of the deterministic answer, salted with `salt`.
    pub fn numbered(tokens: Range<u64>, salt: Option<u64>) -> Self {
        let len = tokens.clone().map(|i| token_len(i, salt)).sum();
        Text::Numbered { tokens, salt, len }
    }

    /// `text`, decoded from `tokens` tokens.
    pub fn decoded(text: String, tokens: u64) -> Self {
        Text::Decoded { text, tokens }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Text::Numbered { len, .. } => *len,
            Text::Decoded { text, .. } => text.len(),
        }
    }

    /// Whether it holds no text.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many tokens made it.
    pub fn tokens(&self) -> u64 {
        match self {
            Text::Numbered { tokens, .. } => tokens.end - tokens.start,
            Text::Decoded { tokens, .. } => *tokens,
        }
    }

    /// Appends `next`, the run that follows this one: numbered tokens join when they follow
    /// on with the same salt, decoded text always. Anything else is handed back.
    pub fn merge(&mut self, next: Text) -> Result<(), Text> {
        match (self, next) {
            (
                Text::Numbered { tokens, salt, len },
                Text::Numbered {
                    tokens: more,
                    salt: next_salt,
                    len: more_len,
                },
            ) if more.start == tokens.end && next_salt == *salt => {
                tokens.end = more.end;
                *len += more_len;
                Ok(())
            }
            (
                Text::Decoded { text, tokens },
                Text::Decoded {
                    text: more,
                    tokens: more_tokens,
                },
            ) => {
                text.push_str(&more);
                *tokens += more_tokens;
                Ok(())
            }
            (_, next) => Err(next),
        }
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Text::Numbered { tokens, salt, .. } => {
                tokens.clone().try_for_each(|i| write_token(i, *salt, f))
            }
            Text::Decoded { text, .. } => f.write_str(text),
        }
    }
}

/// Writes numbered token `i`'s text with `salt`: `t{i} `, or `t{i}.{salt} ` (the salt in hex).
pub fn write_token(i: u64, salt: Option<u64>, out: &mut impl fmt::Write) -> fmt::Result {
    match salt {
        Some(salt) => write!(out, "t{i}.{salt:x} "),
        None => write!(out, "t{i} "),
    }
}

/// The length of numbered token `i`'s text with `salt`.
pub fn token_len(i: u64, salt: Option<u64>) -> usize {
    let digits = |n: u64, base: u64| n.checked_ilog(base).map_or(1, |log| log as usize + 1);
    let salt = salt.map_or(0, |salt| 1 + digits(salt, 16));
    2 + digits(i, 10) + salt
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tokens_length_is_the_length_of_its_text() {
        for salt in [None, Some(0), Some(0xf), Some(0x10), Some(u64::MAX)] {
            for i in [0, 1, 9, 10, 99, 100, 12_345, u64::MAX - 1] {
                let text = Text::numbered(i..i + 1, salt);
                assert_eq!(
                    text.len(),
                    text.to_string().len(),
                    "token {i}, salt {salt:?}"
                );
                assert_eq!(token_len(i, salt), text.len());
            }
        }
    }

    #[test]
    fn runs_join_only_where_they_follow_on() {
        let mut run = Text::numbered(3..5, Some(7));
        assert_eq!(
            run.merge(Text::numbered(6..7, Some(7))),
            Err(Text::numbered(6..7, Some(7)))
        );
        assert!(
            run.merge(Text::numbered(5..6, None)).is_err(),
            "another salt"
        );
        assert!(run.merge(Text::decoded("x".into(), 1)).is_err());
        run.merge(Text::numbered(5..7, Some(7))).unwrap();
        assert_eq!(run, Text::numbered(3..7, Some(7)));
        assert_eq!(run.to_string(), "t3.7 t4.7 t5.7 t6.7 ");
        let mut empty = Text::numbered(0..0, None);
        assert!(empty.is_empty() && empty.tokens() == 0);
        empty.merge(Text::numbered(0..1, None)).unwrap();
        assert_eq!(empty.to_string(), "t0 ");
    }
}
