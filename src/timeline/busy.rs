//! How long a hop's thread was busy within the gaps its records ended (`busy_ns`: a page's
//! long animation frames at `client.render`), kept per request for the stalls that name it.

use std::collections::HashMap;
use std::sync::Arc;

use super::budget::DetailBudget;

/// For each request: the hop, seq and busy time of each record that told one.
#[derive(Default)]
pub(super) struct Busy {
    by_request: HashMap<Arc<str>, Vec<(u8, u64, u64)>>,
}

impl Busy {
    /// The record of `request` at `hop` numbered `seq` says its hop was busy `busy_ns` within
    /// the gap it ended; one detail of `budget` (none left: not kept, and a stall it ended
    /// shows no busy time, never another record's).
    pub(super) fn note(
        &mut self,
        (request, hop, seq): (&Arc<str>, u8, u64),
        busy_ns: u64,
        budget: &mut DetailBudget,
    ) {
        if budget.take() {
            let told = self.by_request.entry(request.clone()).or_default();
            told.push((hop, seq, busy_ns));
        }
    }

    /// How long the hop was busy within the gap the record of `request` at `hop` numbered
    /// `seq` ended, if it told (the last record so numbered, when a resume numbered it again).
    pub(super) fn at(&self, request: &str, hop: u8, seq: u64) -> Option<u64> {
        let told = self.by_request.get(request)?;
        told.iter()
            .rev()
            .find(|&&(h, s, _)| h == hop && s == seq)
            .map(|&(_, _, busy)| busy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_time_belongs_to_its_record_only() {
        let mut busy = Busy::default();
        let mut budget = DetailBudget::new(2);
        let r: Arc<str> = "r".into();
        busy.note((&r, 5, 50), 2_000, &mut budget);
        busy.note((&r, 5, 50), 3_000, &mut budget);
        assert_eq!(busy.at("r", 5, 50), Some(3_000), "the later one");
        assert_eq!(busy.at("r", 5, 51), None);
        assert_eq!(busy.at("r", 4, 50), None);
        assert_eq!(busy.at("s", 5, 50), None);
        // Past the budget: not kept.
        busy.note((&r, 5, 60), 1_000, &mut budget);
        assert_eq!(busy.at("r", 5, 60), None);
    }
}
