//! sim's deterministic answer: token i's text is `t{i} ` (`t{i}.{salt} ` salted), so a client
//! checks order and loss; which text is an answer's first tokens, to continue it.

use crate::serve::text::write_token;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::text::Text;

    #[test]
    fn a_stream_s_first_tokens_are_known_as_such_with_their_salt() {
        for salt in [None, Some(0), Some(0xf), Some(0x10), Some(u64::MAX)] {
            let salted = salt.is_some();
            for k in [0, 1, 3, 12] {
                let text = Text::numbered(0..k, salt).to_string();
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
