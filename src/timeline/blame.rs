//! The blame rule: for a stall seen at a hop, whether it began there, was passed on from
//! upstream, was a hidden phase the hop does not carry, or cannot be told.

use super::stream::{Spell, Stream};

/// What a stall seen at a hop turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// It began at the hop; the hop before it (if any) was at most this quiet over the span,
    /// exactly or as an upper bound.
    Began(Option<(u64, bool)>),
    /// The hop before it was quiet as long: its own analysis reports it.
    PassedOn,
    /// The hop before it progressed with hidden events the hop does not carry: not a stall.
    Hidden,
    /// The data needed is missing: why.
    Unknown(String),
}

/// Judges `spell`, seen at `stream` (hop `path[stream.hop]`), with `upstream` the same
/// request's stream at the hop before it in the path, if it has one.
pub(super) fn judge(
    path: &[Box<str>],
    stream: &Stream,
    upstream: Option<&Stream>,
    spell: &Spell,
) -> Verdict {
    // 1. The first hop of the path: nothing before it to blame.
    if stream.hop == 0 {
        return Verdict::Began(None);
    }
    let up_name = &path[usize::from(stream.hop) - 1];
    // 2. No records of the request upstream.
    let Some(up) = upstream else {
        return Verdict::Unknown(format!("no records of this request at {up_name}"));
    };
    let (after, seq) = (spell.after, spell.seq);
    // 3. The span's ends must be known upstream.
    for end in [after, seq].into_iter().flatten() {
        match up.covers(end) {
            Some(true) => {}
            Some(false) => return Verdict::Unknown(missing(up, up_name, end)),
            None => return Verdict::Unknown(lost(up, up_name)),
        }
    }
    if seq.is_none() && !up.had_end() {
        return Verdict::Unknown(format!("no end record at {up_name}"));
    }
    // 4. Upstream was as quiet within the span: passed on.
    match up.stalled_within(after, seq) {
        Some(true) => return Verdict::PassedOn,
        Some(false) => {}
        None => return Verdict::Unknown(lost(up, up_name)),
    }
    // 5. Upstream progressed with hidden events this hop does not carry (it recorded none of
    // this request). A span to the end must not hold visible events upstream either: visible
    // events this hop never received are not a phase it does not carry.
    if !stream.carries_hidden() && (seq.is_some() || !up.visible_after(after)) {
        match up.hidden_between(after, seq) {
            Some(true) => return Verdict::Hidden,
            Some(false) => {}
            None => return Verdict::Unknown(lost(up, up_name)),
        }
    }
    // 6. Upstream was regular: it began here.
    Verdict::Began(up.quiet_within(after, seq))
}

fn missing(up: &Stream, name: &str, seq: u64) -> String {
    let mut why = format!("no record of seq {seq} at {name}");
    match up.first_seq() {
        Some(first) if seq < first && up.windowed() => {
            why.push_str(&format!(
                " (its records start at seq {first}: before the --since window there?)"
            ));
        }
        Some(first) if seq < first => {
            why.push_str(&format!(" (its records start at seq {first})"));
        }
        _ => why.push_str(" (a dropped record, or a hop that filtered it)"),
    }
    why
}

fn lost(up: &Stream, name: &str) -> String {
    let from = up.lost_from().unwrap_or(0);
    format!("{name}'s details from seq {from} on were not all kept (the detail budget was spent)")
}
