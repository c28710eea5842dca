//! Streams' second names in a memory store: a client resumes a stream by the name it was told
//! (an upstream's own response id) as well as by the stream's id. See
//! [`Registry::alias`](super::Registry::alias).

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The most names a memory store keeps: the oldest go first (a stream named longer ago is
/// found by its id only).
pub const MAX_ALIASES: usize = 65_536;

/// Names, each with the id and claim generation of the stream it names, in the order they came.
#[derive(Debug, Default)]
pub(crate) struct Aliases {
    names: Mutex<Names>,
}

/// The stream (id, claim generation) of each name, and the names from oldest to newest.
type Names = (HashMap<String, (String, u64)>, VecDeque<String>);

impl Aliases {
    /// `alias` names the stream `id` of the claim `generation` (a name given again names the
    /// later stream, and counts as new for eviction).
    pub(crate) fn alias(&self, alias: &str, id: &str, generation: u64) {
        let mut names = self.names();
        let (by_alias, order) = &mut *names;
        if by_alias
            .insert(alias.to_owned(), (id.to_owned(), generation))
            .is_some()
        {
            order.retain(|name| name != alias);
        }
        order.push_back(alias.to_owned());
        while order.len() > MAX_ALIASES {
            if let Some(oldest) = order.pop_front() {
                by_alias.remove(&oldest);
            }
        }
    }

    /// The id and claim generation of the stream `alias` names, if it names one.
    pub(crate) fn resolve(&self, alias: &str) -> Option<(String, u64)> {
        self.names().0.get(alias).cloned()
    }

    /// The names (no code panics while holding them: a poisoned lock's are whole).
    fn names(&self) -> MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_names_its_stream_until_many_newer_ones_came() {
        let aliases = Aliases::default();
        aliases.alias("resp_1", "req-1", 7);
        assert_eq!(aliases.resolve("resp_1"), Some(("req-1".to_owned(), 7)));
        assert_eq!(aliases.resolve("req-1"), None, "an id is no name");
        for n in 0..MAX_ALIASES {
            aliases.alias(&format!("resp_x{n}"), "req-x", 8);
        }
        assert_eq!(aliases.resolve("resp_1"), None, "the oldest went");
        aliases.alias("resp_x0", "req-y", 9);
        aliases.alias("resp_new", "req-z", 10);
        assert_eq!(
            aliases.resolve("resp_x0"),
            Some(("req-y".to_owned(), 9)),
            "named anew"
        );
        assert_eq!(aliases.resolve("resp_x1"), None, "now the oldest");
    }
}
