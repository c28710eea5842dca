//! Streams' second names in a memory store: a client resumes a stream by the name it was told
//! (an upstream's own response id) as well as by the stream's id. See
//! [`Registry::alias`](super::Registry::alias).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The most names a memory store keeps: the oldest go first (a stream named longer ago is
/// found by its id only).
pub const MAX_ALIASES: usize = 65_536;

/// Names, each with the id of the stream it names, in the order they came.
#[derive(Debug, Default)]
pub(crate) struct Aliases {
    names: Mutex<(HashMap<String, String>, VecDeque<String>)>,
}

impl Aliases {
    /// `alias` names the stream `id` (a name given again names the later stream; the store
    /// checks that the stream still has the name).
    pub(crate) fn alias(&self, alias: &str, id: &str) {
        let mut names = self.names();
        let (by_alias, order) = &mut *names;
        if by_alias.insert(alias.to_owned(), id.to_owned()).is_none() {
            order.push_back(alias.to_owned());
        }
        while order.len() > MAX_ALIASES {
            if let Some(oldest) = order.pop_front() {
                by_alias.remove(&oldest);
            }
        }
    }

    /// The id of the stream `alias` names, if it names one.
    pub(crate) fn resolve(&self, alias: &str) -> Option<String> {
        self.names().0.get(alias).cloned()
    }

    /// The names (no code panics while holding them: a poisoned lock's are whole).
    fn names(&self) -> MutexGuard<'_, (HashMap<String, String>, VecDeque<String>)> {
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_names_its_stream_until_many_newer_ones_came() {
        let aliases = Aliases::default();
        aliases.alias("resp_1", "req-1");
        assert_eq!(aliases.resolve("resp_1").as_deref(), Some("req-1"));
        assert_eq!(aliases.resolve("req-1"), None, "an id is no name");
        for n in 0..MAX_ALIASES {
            aliases.alias(&format!("resp_x{n}"), "req-x");
        }
        assert_eq!(aliases.resolve("resp_1"), None, "the oldest went");
        assert_eq!(aliases.resolve("resp_x0").as_deref(), Some("req-x"));
        aliases.alias("resp_x0", "req-y");
        assert_eq!(aliases.resolve("resp_x0").as_deref(), Some("req-y"));
    }
}
