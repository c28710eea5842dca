//! The blame rule: for a stall seen at a hop, whether it began there, was passed on from
//! upstream, was pushed back from downstream, was a hidden phase the hop does not carry, or
//! cannot be told.

use super::request_at_hop::{CATCH_UP_STEPS, RequestAtHop, Spell, catch_up_step};
use crate::end::EndReason;

/// What a stall seen at a hop turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// It began at the hop; the hop before it (if any) was at most this quiet over the span,
    /// exactly or as an upper bound.
    Began(Option<(u64, bool)>),
    /// The hop before it was quiet as long: its own analysis reports it.
    PassedOn,
    /// The hop after it was behind and caught up as soon as the hop went on: back-pressure,
    /// which that hop's analysis reports (there or further down).
    PushedBack,
    /// The hop before it progressed with hidden events the hop does not carry: not a stall.
    Hidden,
    /// The data needed is missing: why.
    Unknown(String),
}

/// What every judgement needs besides the streams.
pub(super) struct Judge<'a> {
    pub(super) path: &'a [Box<str>],
    pub(super) stall_ns: u64,
    pub(super) reorder_window: usize,
}

/// Judges `spell`, seen at `stream` (hop `path[stream.hop]`), with `upstream` and
/// `downstream` the same request's streams at the hops just before and after it in the path,
/// if it has them. A stream whose records arrived out of order beyond the reorder window
/// decides nothing: its own stalls are unknown, and so is a verdict that would need it.
pub(super) fn judge(
    judge: &Judge<'_>,
    stream: &RequestAtHop,
    upstream: Option<&RequestAtHop>,
    downstream: Option<&RequestAtHop>,
    spell: &Spell,
) -> Verdict {
    if stream.disordered() {
        return Verdict::Unknown(disordered(judge, stream));
    }
    let verdict = from_upstream(judge, stream, upstream, spell);
    if matches!(verdict, Verdict::PassedOn | Verdict::Hidden) {
        return verdict;
    }
    // Began or unknown from upstream: the hop after it may show it was back-pressure.
    let Some(down) = downstream else {
        return verdict;
    };
    if down.disordered() {
        return match verdict {
            Verdict::Began(_) => Verdict::Unknown(disordered(judge, down)),
            other => other,
        };
    }
    match pushed_back(judge, down, spell) {
        Push::Yes => Verdict::PushedBack,
        Push::No => verdict,
        Push::Unknown(why) => match verdict {
            Verdict::Began(_) => Verdict::Unknown(why),
            other => other,
        },
    }
}

/// The rule's steps that look upstream.
fn from_upstream(
    judge: &Judge<'_>,
    stream: &RequestAtHop,
    upstream: Option<&RequestAtHop>,
    spell: &Spell,
) -> Verdict {
    // 1. The first hop of the path: nothing before it to blame.
    if stream.hop == 0 {
        return Verdict::Began(None);
    }
    let up_name = &judge.path[usize::from(stream.hop) - 1];
    // 2. No records of the request upstream.
    let Some(up) = upstream else {
        return Verdict::Unknown(format!("no records of this request at {up_name}"));
    };
    if up.disordered() {
        return Verdict::Unknown(disordered(judge, up));
    }
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
    // 4. Upstream was as quiet within the span: passed on. Not a stall upstream that began
    // after an event this hop never numbered, for a stall it ended in (its reader stopped
    // first: this hop was behind).
    match up.stalled_within(after, seq, stream.behind(spell)) {
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
    // 6. Upstream was regular: it began here, with upstream's gap over the span as evidence.
    // Without a progress record of upstream's within the span there is none to show.
    match up.quiet_within(after, seq, judge.stall_ns) {
        Some(gap) => Verdict::Began(Some(gap)),
        None => Verdict::Unknown(format!("no progress of {up_name} recorded within the span")),
    }
}

/// Whether a stall was back-pressure from the hop after it.
enum Push {
    Yes,
    No,
    Unknown(String),
}

/// Whether `spell`, a stall at `stream` (hop H) from `p` to `s`, was back-pressure from `down`
/// (hop D, the next in the path). Durations are compared, never times of different hops.
///
/// 1. D had a stall that ended at a seq `s_D <= p` (it had not yet taken `p`), and D received
///    `s` less than H's quiet `g` after it received `s_D` (for a stall H ended in: D's end
///    record, when that end came from upstream). D receives `s` no earlier than H sends it,
///    so D received `s_D` later than `g` before H sent `s`: after H took `p`. H froze while D
///    was behind, and went on as soon as D caught up. Only the latest such stall of D can show
///    it (an earlier one ended earlier), and its catch-up profile decides `d < g` with the
///    largest step at most `g`: never a catch-up that did not happen, but a `d` within a step
///    below `g` is not seen (the stall stays at H).
/// 2. D's stream ended in a stall, and its end record says it never numbered `p` (a visible
///    event, or D carries hidden ones): its reader stopped before taking `p` and left while H
///    was blocked.
///
/// Either is void when D has a stall that waited on this one (it had taken everything H had
/// sent when H froze, and was quiet through H's resume): H was not blocked on D then.
fn pushed_back(judge: &Judge<'_>, down: &RequestAtHop, spell: &Spell) -> Push {
    let Some(p) = spell.after else {
        // Quiet from the stream's start at H: D cannot have been behind it.
        return Push::No;
    };
    let down_name = &judge.path[usize::from(down.hop)];
    let mut unknown = None;
    if let Some(seq) = down.latest_stall_by(p).and_then(|stall| stall.seq) {
        match down.catch_up_after(seq) {
            Some(catch_up) => {
                let caught_up = (0..CATCH_UP_STEPS)
                    .rev()
                    .find(|&k| catch_up_step(judge.stall_ns, k) <= spell.quiet_ns)
                    .is_some_and(|k| match spell.seq {
                        Some(s) => catch_up.seq_within(k) >= s,
                        // An end that came from upstream (`completed`, a generator's or an upstream's
                        // error): that hop's end record is no earlier than the hop before it.
                        None => {
                            catch_up.ended_within(k)
                                && catch_up.reason.is_some_and(EndReason::is_from_generator)
                        }
                    });
                if caught_up {
                    return unless_waited(down, down_name, spell);
                }
            }
            None => {
                unknown = Some(format!(
                    "{down_name}'s catch-up after its stall to seq {seq} was not kept (the \
                     detail budget was spent)"
                ));
            }
        }
    }
    if let Some((end_seq, Some(_))) = down.final_end() {
        if end_seq <= p && (spell.after_visible || down.carries_hidden()) {
            return unless_waited(down, down_name, spell);
        }
    }
    if unknown.is_none() && down.lost_from().is_some_and(|from| from <= p) {
        unknown = Some(lost(down, down_name));
    }
    match unknown {
        Some(why) => Push::Unknown(why),
        None => Push::No,
    }
}

/// `Yes`, unless `down` has a stall that waited on `spell`.
fn unless_waited(down: &RequestAtHop, down_name: &str, spell: &Spell) -> Push {
    match down.waited_on(spell) {
        Some(false) => Push::Yes,
        Some(true) => Push::No,
        None => Push::Unknown(lost(down, down_name)),
    }
}

fn missing(up: &RequestAtHop, name: &str, seq: u64) -> String {
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

fn disordered(judge: &Judge<'_>, stream: &RequestAtHop) -> String {
    let name = &judge.path[usize::from(stream.hop)];
    format!(
        "records of this request at {name} arrived out of order beyond the reorder window of {} records",
        judge.reorder_window
    )
}

fn lost(stream: &RequestAtHop, name: &str) -> String {
    let from = stream.lost_from().unwrap_or(0);
    format!("{name}'s details from seq {from} on were not all kept (the detail budget was spent)")
}
