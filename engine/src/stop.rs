//! A request's stop sequences, found in the answer as it is made: text that may be the start
//! of one is held back until it is told apart, so a client never sees part of a stop
//! sequence, and never loses text that turned out not to be one.

/// The stop sequences of one answer, and the text held back while it may start one.
#[derive(Debug)]
pub struct Stops {
    stops: Vec<String>,
    held: String,
}

/// What the answer's text is once pushed.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// Text that is no part of a stop sequence: it may be sent.
    Text(String),
    /// A stop sequence: the text before it (to send), and the answer ends there.
    Stop(String),
}

impl Stops {
    /// The matcher of `stops` (none: every text passes at once).
    pub fn new(stops: Vec<String>) -> Self {
        Stops {
            stops,
            held: String::new(),
        }
    }

    /// Adds `text` to the answer.
    pub fn push(&mut self, text: &str) -> Found {
        if self.stops.is_empty() {
            return Found::Text(text.to_owned());
        }
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()))
            .min();
        if let Some(at) = first {
            self.held.truncate(at);
            return Found::Stop(std::mem::take(&mut self.held));
        }
        // The longest end of the held text that starts a stop sequence stays held.
        let keep = self
            .held
            .char_indices()
            .map(|(at, _)| at)
            .find(|&at| {
                let end = &self.held[at..];
                self.stops.iter().any(|stop| stop.starts_with(end))
            })
            .unwrap_or(self.held.len());
        let rest = self.held.split_off(keep);
        Found::Text(std::mem::replace(&mut self.held, rest))
    }

    /// The end of the answer without a stop sequence: the text still held back.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(text: &str) -> Found {
        Found::Text(text.to_owned())
    }

    #[test]
    fn the_start_of_a_stop_sequence_waits_until_it_is_told_apart() {
        let mut stops = Stops::new(vec!["END".into(), "\n\n".into()]);
        assert_eq!(stops.push("Hello E"), text("Hello "));
        assert_eq!(stops.push("N"), text(""));
        assert_eq!(
            stops.push("V is"),
            text("ENV is"),
            "not a stop: given back in full"
        );
        assert_eq!(stops.push(" \n"), text(" "));
        assert_eq!(stops.push("\nmore"), Found::Stop(String::new()));
        let mut stops = Stops::new(vec!["END".into()]);
        assert_eq!(stops.push("the EN"), text("the "));
        assert_eq!(
            stops.finish(),
            "EN",
            "the answer ended: what was held is text"
        );
    }

    #[test]
    fn the_earliest_stop_sequence_ends_the_answer_within_one_push() {
        let mut stops = Stops::new(vec!["b".into(), "cd".into()]);
        assert_eq!(stops.push("acdxb"), Found::Stop("a".into()));
        let mut none = Stops::new(Vec::new());
        assert_eq!(none.push("anything"), text("anything"));
        let mut wide = Stops::new(vec!["é!".into()]);
        assert_eq!(
            wide.push("café"),
            text("caf"),
            "held on a character boundary"
        );
        assert_eq!(wide.push("?"), text("é?"));
    }
}
