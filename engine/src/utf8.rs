//! A model's token pieces as whole UTF-8 characters: a token may end inside a character (an
//! emoji, a CJK character, an accented letter split by byte-level BPE), and an event must
//! never carry half of one.

/// The bytes of an answer's tokens, handed out as whole characters.
#[derive(Debug, Default)]
pub struct Utf8Pieces {
    /// The start of a character whose other bytes have not come yet (at most 3 bytes).
    pending: Vec<u8>,
}

impl Utf8Pieces {
    /// Adds one token's `bytes`; returns the text that is whole now (empty while a character
    /// is still cut). Bytes that can never be UTF-8 come out as U+FFFD, as a lossy decoder
    /// would write them, so nothing is dropped silently.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut text = String::new();
        let mut rest = &self.pending[..];
        loop {
            match std::str::from_utf8(rest) {
                Ok(whole) => {
                    text.push_str(whole);
                    rest = &[];
                    break;
                }
                Err(error) => {
                    let (valid, after) = rest.split_at(error.valid_up_to());
                    text.push_str(std::str::from_utf8(valid).expect("checked"));
                    match error.error_len() {
                        // A character cut at the end: the next token may finish it.
                        None => {
                            rest = after;
                            break;
                        }
                        Some(invalid) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[invalid..];
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        text
    }

    /// The end of the answer: a character still cut, as U+FFFD (empty when none is).
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.pending);
        String::from_utf8_lossy(&rest).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_cut_between_tokens_comes_out_whole() {
        let text = "a🐍é漢 z";
        let bytes = text.as_bytes();
        // Every way of cutting the bytes in pieces of 1 to 4 gives the text back, and no piece
        // handed out ends inside a character.
        for size in 1..=4 {
            let mut pieces = Utf8Pieces::default();
            let mut out = String::new();
            for piece in bytes.chunks(size) {
                out.push_str(&pieces.push(piece));
            }
            out.push_str(&pieces.finish());
            assert_eq!(out, text, "pieces of {size}");
        }
        let mut pieces = Utf8Pieces::default();
        assert_eq!(pieces.push(&bytes[..2]), "a");
        assert_eq!(pieces.push(&bytes[2..4]), "");
        assert_eq!(pieces.push(&bytes[4..5]), "🐍");
    }

    #[test]
    fn bytes_that_are_no_utf8_are_replaced_not_dropped() {
        let mut pieces = Utf8Pieces::default();
        assert_eq!(pieces.push(b"a\xffb"), "a\u{fffd}b");
        assert_eq!(
            pieces.push(b"\xf0\x9f"),
            "",
            "the start of a character waits"
        );
        assert_eq!(
            pieces.push(b"x"),
            "\u{fffd}x",
            "a start that is not followed"
        );
        assert_eq!(pieces.push(b"\xe6\xbc"), "");
        assert_eq!(pieces.finish(), "\u{fffd}", "cut at the end of the answer");
        assert_eq!(pieces.finish(), "");
    }
}
