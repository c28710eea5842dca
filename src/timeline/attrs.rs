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
        let key = (Box::from(request), hop);
        let changes = self.changes.entry(key).or_default();
        if changes.last().is_some_and(|(_, set)| *set == NOT_KEPT) {
            // Unknown from an earlier change on: later ones cannot make it known again.
            return;
        }
        let set = if budget.take() {
            let set: Set = attrs
                .iter()
                .map(|(key, value)| (Box::from(&**key), Box::from(&**value)))
                .collect();
            match self.index.get(&set) {
                Some(&id) => id,
                None if self.sets.len() < MAX_SETS => {
                    let id = self.sets.len() as u32;
                    self.sets.push(set.clone());
                    self.index.insert(set, id);
                    id
                }
                None => NOT_KEPT,
            }
        } else {
            NOT_KEPT
        };
        changes.push((seq, set));
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
        // The budget is spent: unknown from here on, never the set before.
        attrs.change(("r", 0, 9), &set(&[("upstream", "c")]), &mut budget);
        attrs.change(("r", 0, 12), &set(&[("upstream", "d")]), &mut budget);
        assert!(attrs.at("r", 0, Some(9)).is_empty());
        assert!(attrs.at("r", 0, Some(20)).is_empty());
        assert_eq!(
            attrs.at("r", 0, Some(8)),
            [("upstream".to_owned(), "b".to_owned())]
        );
        assert_eq!(attrs.sets.len(), 2, "each set kept once");
    }
}
