//! The echo: the continued message a server may stream back before its new text, taken off.
//! Such a server (llama.cpp: its first delta is the whole prefix glued to the first new token)
//! is recognised by what arrives, not by who it is: a continuation's text is held while it
//! could still be that echo (of the assistant message sent, or of the delivered text alone;
//! whitespace may differ, as a server tokenises the text anew), and passed on from where the
//! echo ends. Text held when the continuation ends is the start of an echo, and is dropped.

/// What a carried-on stream's text could still be the echo of: nothing once it is settled.
#[derive(Debug, Default)]
pub(super) struct Echo {
    held: Option<Held>,
}

/// The carried-on text so far, held, and how far it matches each text it could echo.
#[derive(Debug)]
struct Held {
    held: String,
    candidates: Vec<Candidate>,
}

/// A text the carried-on one could begin by repeating, and how much of it was matched.
#[derive(Debug)]
struct Candidate {
    text: Vec<char>,
    /// Chars of `text` matched so far.
    at: usize,
}

/// How a candidate took one more held char.
enum Took {
    /// It matches so far.
    Matches,
    /// The echo ended before this char.
    Ended,
    /// It is no echo of this candidate.
    Differs,
}

impl Candidate {
    /// The next held char `c`: matched exactly, or, as re-tokenising may change whitespace, an
    /// extra whitespace in the echo skipped, or whitespace of the candidate skipped.
    fn take(&mut self, c: char) -> Took {
        if self.at < self.text.len() && self.text[self.at] == c {
            self.at += 1;
            return Took::Matches;
        }
        if c.is_whitespace() && self.at < self.text.len() {
            return Took::Matches;
        }
        while self.at < self.text.len() && self.text[self.at].is_whitespace() {
            self.at += 1;
        }
        if self.at == self.text.len() {
            return Took::Ended;
        }
        if self.text[self.at] == c {
            self.at += 1;
            return Took::Matches;
        }
        Took::Differs
    }
}

impl Echo {
    /// The echo a carried-on text may begin with: one of `echoes` (none: a restart, whose text
    /// is all new).
    pub(super) fn new(echoes: &[&str]) -> Self {
        let candidates: Vec<Candidate> = echoes
            .iter()
            .filter(|echo| !echo.trim().is_empty())
            .map(|echo| Candidate {
                text: echo.chars().collect(),
                at: 0,
            })
            .collect();
        Echo {
            held: (!candidates.is_empty()).then(|| Held {
                held: String::new(),
                candidates,
            }),
        }
    }

    /// What of `text` is new: all of it once the echo is settled; else what follows the echo
    /// where it ended, all that was held when it is no echo, nothing while it still could be.
    /// Each char is looked at once.
    pub(super) fn past(&mut self, text: &str) -> String {
        let Some(echo) = self.held.as_mut() else {
            return text.to_owned();
        };
        let start = echo.held.len();
        echo.held.push_str(text);
        for (offset, c) in text.char_indices() {
            let mut ended = false;
            echo.candidates
                .retain_mut(|candidate| match candidate.take(c) {
                    Took::Matches => true,
                    Took::Ended => {
                        ended = true;
                        true
                    }
                    Took::Differs => false,
                });
            if ended {
                // The echo is what came before this char.
                let new = echo.held[start + offset..].to_owned();
                self.held = None;
                return new;
            }
            if echo.candidates.is_empty() {
                // No echo: everything held is new text.
                let held = std::mem::take(&mut echo.held);
                self.held = None;
                return held;
            }
        }
        String::new()
    }
}
