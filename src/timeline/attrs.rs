//! The attributes hop records carry (`attrs`): each distinct set kept once, and, per request
//! and hop, from which seq on each set applies, so that a stall can name what served the
//! stream when it went quiet (the upstream a proxy read from, before a failover).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::budget::DetailBudget;

/// One set of attributes, sorted by key.
type Set = Arc<[(Box<str>, Box<str>)]>;

/// Where each set applies from in one stream at one hop: the seq of each record that changed
/// it, and the set it changed to (an index into the sets, or [`NOT_KEPT`]).
type Changes = Vec<(u64, u32)>;

/// The most distinct sets kept; a change to another is recorded as not kept.
const MAX_SETS: usize = 1 << 16;

/// What a change points at: a kept set, or none (past the limits: the attributes from there on
/// are not known).
const NOT_KEPT: u32 = u32::MAX;

/// Every request's attributes at every hop, as their records changed them.
#[derive(Default)]
pub(super) struct Attrs {
    sets: Vec<Set>,
    index: HashMap<Set, u32>,
    /// For each request and hop (its place on the path): the seq of each record that changed
    /// the attributes, and the set it changed them to, in the order the records came.
    changes: HashMap<(Box<str>, u8), Changes>,
}

impl Attrs {
    /// The record of `request` at `hop` numbered `seq` set its attributes to `attrs`; each change
    /// is one detail of `budget` (none left: the attributes are not known from there on).
    pub(super) fn change(
        &mut self,
        (request, hop, seq): (&str, u8, u64),
        attrs: &BTreeMap<Cow<'_, str>, Cow<'_, str>>,
        budget: &mut DetailBudget,
    ) {
        let set: Set = attrs
            .iter()
            .map(|(key, value)| (Box::from(&**key), Box::from(&**value)))
            .collect();
        let known = self.index.get(&set).copied();
        let key = (Box::from(request), hop);
        let last = self
            .changes
            .get(&key)
            .map(|changes| changes.last().copied());
        match last {
            // Unknown from an earlier change on: later ones cannot make it known again.
            Some(Some((_, NOT_KEPT))) => return,
            // The same set again: nothing changed.
            Some(Some((_, id))) if Some(id) == known => return,
            // Seqs that go back (a resumed stream numbered anew): which set applied when is
            // no longer told by the seq, so none is known.
            Some(Some((last, _))) if seq <= last => {
                self.changes.insert(key, vec![(0, NOT_KEPT)]);
                return;
            }
            _ => {}
        }
        let id = match known {
            Some(id) if budget.take() => id,
            None if budget.take() => self.intern(set),
            // A stream's first change past the budget leaves nothing behind (no entry says
            // the same as one not kept: nothing known).
            _ if last.is_none() => return,
            _ => NOT_KEPT,
        };
        self.changes.entry(key).or_default().push((seq, id));
    }

    /// Keeps `set`, new: its index, or [`NOT_KEPT`] past [`MAX_SETS`].
    fn intern(&mut self, set: Set) -> u32 {
        if self.sets.len() >= MAX_SETS {
            return NOT_KEPT;
        }
        let id = self.sets.len() as u32;
        self.sets.push(set.clone());
        self.index.insert(set, id);
        id
    }

    /// The attributes of `request` at `hop` when it recorded `after` (`None`: as its stream
    /// began there): the last change at or before it. Empty when none were recorded, or they
    /// were not kept.
    pub(super) fn at(&self, request: &str, hop: u8, after: Option<u64>) -> Vec<(String, String)> {
        let Some(changes) = self.changes.get(&(Box::from(request), hop)) else {
            return Vec::new();
        };
        let change = match after {
            None => changes.first(),
            Some(after) => changes.iter().rev().find(|(seq, _)| *seq <= after),
        };
        let set = change.and_then(|&(_, set)| self.sets.get(set as usize));
        set.map_or_else(Vec::new, |set| {
            set.iter()
                .map(|(key, value)| (key.to_string(), value.to_string()))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(
        pairs: &[(&'static str, &'static str)],
    ) -> BTreeMap<Cow<'static, str>, Cow<'static, str>> {
        pairs
            .iter()
            .map(|(k, v)| (Cow::Borrowed(*k), Cow::Borrowed(*v)))
            .collect()
    }

    #[test]
    fn a_stall_names_the_attributes_of_the_record_it_followed() {
        let mut attrs = Attrs::default();
        let mut budget = DetailBudget::new(2);
        attrs.change(("r", 0, 0), &set(&[("upstream", "a")]), &mut budget);
        attrs.change(("r", 0, 5), &set(&[("upstream", "b")]), &mut budget);
        assert_eq!(
            attrs.at("r", 0, None),
            [("upstream".to_owned(), "a".to_owned())]
        );
        assert_eq!(
            attrs.at("r", 0, Some(4)),
            [("upstream".to_owned(), "a".to_owned())]
        );
        assert_eq!(
            attrs.at("r", 0, Some(5)),
            [("upstream".to_owned(), "b".to_owned())]
        );
        assert!(attrs.at("r", 1, Some(5)).is_empty(), "another hop");
        assert!(attrs.at("s", 0, Some(5)).is_empty(), "another request");
        // The same set again costs nothing; the budget is spent: unknown from here on,
        // never the set before.
        attrs.change(("r", 0, 7), &set(&[("upstream", "b")]), &mut budget);
        assert_eq!(
            attrs.at("r", 0, Some(7)),
            [("upstream".to_owned(), "b".to_owned())]
        );
        attrs.change(("r", 0, 9), &set(&[("upstream", "c")]), &mut budget);
        attrs.change(("r", 0, 12), &set(&[("upstream", "d")]), &mut budget);
        assert!(attrs.at("r", 0, Some(9)).is_empty());
        assert!(attrs.at("r", 0, Some(20)).is_empty());
        assert_eq!(
            attrs.at("r", 0, Some(8)),
            [("upstream".to_owned(), "b".to_owned())]
        );
        assert_eq!(attrs.sets.len(), 2, "each set kept once");
        // Seqs that go back (a resumed stream): nothing known for that stream any more.
        let mut budget = DetailBudget::new(10);
        attrs.change(("s", 0, 10), &set(&[("upstream", "a")]), &mut budget);
        attrs.change(("s", 0, 6), &set(&[("upstream", "b")]), &mut budget);
        assert!(attrs.at("s", 0, Some(12)).is_empty());
        assert!(attrs.at("s", 0, None).is_empty());
        // Past the budget, a stream's first change leaves nothing behind.
        attrs.change(
            ("t", 0, 0),
            &set(&[("upstream", "a")]),
            &mut DetailBudget::new(0),
        );
        assert!(!attrs.changes.contains_key(&(Box::from("t"), 0)));
    }
}
