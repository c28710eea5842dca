//! The seam of an Anthropic Messages stream carried on elsewhere: the carried-on stream's events
//! joined onto the client's, so that it sees one message. No second `message_start`; the
//! carried-on stream's first block goes on in the block the client has open (its
//! `content_block_start` dropped, its text losing the echo a server may send first, see
//! [`Echo`]), and its other blocks come after the client's, their indices moved on; the final
//! `message_delta`'s `usage` counts the delivered tokens as the answer's output, not its input.
//! The client's blocks ([`Blocks`]) also say how the proxy ends an answer itself.

use serde_json::json;
use streamgate::anthropic::{Delta, MessagesData, MessagesEvent};
use streamgate::sse::SseEvent;

use super::echo::Echo;
use super::format::typed;

/// The blocks of a Messages answer the client has: whether its `message_start` came, how many
/// blocks began, and the one open (begun, not stopped).
#[derive(Debug, Default)]
pub(super) struct Blocks {
    started: bool,
    begun: u64,
    /// The open block: its index and type (`text`, `tool_use`, `thinking`, ..).
    open: Option<(u64, String)>,
}

impl Blocks {
    /// The client got `data`.
    pub(super) fn saw(&mut self, data: &MessagesData) {
        match data {
            MessagesData::MessageStart(_) => self.started = true,
            MessagesData::ContentBlockStart(start) => {
                self.begun = self.begun.max(start.index.saturating_add(1));
                self.open = Some((start.index, start.content_block.kind.clone()));
            }
            MessagesData::ContentBlockStop(stop) if self.open() == Some(stop.index) => {
                self.open = None;
            }
            _ => {}
        }
    }

    /// The block the client has open, if any.
    fn open(&self) -> Option<u64> {
        self.open.as_ref().map(|(index, _)| *index)
    }

    /// The open block's `content_block_stop` and a `message_stop`: the end of an answer that
    /// said its `stop_reason` and broke before its `message_stop`.
    pub(super) fn stop(&self) -> Vec<SseEvent> {
        let mut events: Vec<SseEvent> = self.open().map(block_stop).into_iter().collect();
        events.push(MessagesEvent::new(MessagesData::message_stop()).into());
        events
    }

    /// The events that end the answer when the proxy ends it itself (a stop, or every token
    /// asked for delivered before the stream broke), with `stop_reason` and `output_tokens`:
    /// the open block's `content_block_stop`, a `message_delta`, a `message_stop`; before them,
    /// when no `message_start` came, one of the proxy's own, named by the request `id` and its
    /// `model`, as the SDKs need one.
    pub(super) fn close(
        &self,
        (id, model): (&str, &str),
        stop_reason: &str,
        output_tokens: u64,
    ) -> Vec<SseEvent> {
        let mut events = Vec::new();
        if !self.started {
            let message = json!({
                "id": id, "type": "message", "role": "assistant", "content": [],
                "model": model, "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            });
            events.push(typed(
                "message_start",
                json!({"type": "message_start", "message": message}),
            ));
        }
        events.extend(self.open().map(block_stop));
        let delta = json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": null},
            "usage": {"output_tokens": output_tokens},
        });
        events.push(typed("message_delta", delta));
        events.push(MessagesEvent::new(MessagesData::message_stop()).into());
        events
    }
}

/// The `content_block_stop` of block `index`.
fn block_stop(index: u64) -> SseEvent {
    typed(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": index}),
    )
}

/// The join of one carried-on Messages stream (a restart or a continuation) onto the client's.
#[derive(Debug)]
pub(super) struct MessagesSeam {
    /// The client already has its `message_start`.
    started: bool,
    /// The client's open block, its index and type: the carried-on stream's block 0 goes on in
    /// it when it is of that type, else it is stopped first and every carried-on block comes
    /// after the client's.
    open: Option<(u64, String)>,
    /// The carried-on stream's block `k` is the client's `base + k`.
    base: u64,
    /// How many blocks the client began.
    begun: u64,
    echo: Echo,
    /// The delivered tokens, moved from the final usage's input to its output.
    tokens: u64,
}

impl MessagesSeam {
    /// The join onto a client that has `blocks` and `tokens` tokens of the answer; the
    /// carried-on text may begin by repeating one of `echoes` (none for a restart).
    pub(super) fn new(blocks: &Blocks, echoes: &[&str], tokens: u64) -> Self {
        MessagesSeam {
            started: blocks.started,
            open: blocks.open.clone(),
            base: blocks.open().unwrap_or(blocks.begun),
            begun: blocks.begun,
            echo: Echo::new(echoes),
            tokens,
        }
    }

    /// The events to send on for the carried-on `event`: none (it is dropped), it (joined), or
    /// the client's open block's stop and it (its first block is of another type); a seam's
    /// join allocates only after a failover. One the
    /// format does not read goes on as it came (the proxy's reading of it decides).
    pub(super) fn join(&mut self, event: SseEvent) -> Vec<SseEvent> {
        let mut before = None;
        let Ok(parsed) = MessagesEvent::from_sse(&event) else {
            return vec![event];
        };
        let mut data = parsed.into_data();
        match &data {
            // The carried-on stream's first block.
            MessagesData::ContentBlockStart(start) if start.index == 0 => match self.open.take() {
                // The block the client has open goes on.
                Some((_, kind)) if kind == start.content_block.kind => return Vec::new(),
                // Another kind of block: the open one stops, and the carried-on stream's
                // blocks come after it.
                Some((index, _)) => {
                    before = Some(block_stop(index));
                    self.base = self.begun;
                }
                None => {}
            },
            _ => {}
        }
        let base = self.base;
        let moved = |index: &mut u64| {
            let client = base.saturating_add(*index);
            std::mem::replace(index, client) != client
        };
        let changed = match &mut data {
            MessagesData::MessageStart(_) if self.started => return Vec::new(),
            MessagesData::ContentBlockStart(start) => moved(&mut start.index),
            MessagesData::ContentBlockStop(stop) => moved(&mut stop.index),
            MessagesData::ContentBlockDelta(delta) => {
                let mut changed = moved(&mut delta.index);
                if let Delta::Text { text, .. } = &mut delta.delta {
                    let new = self.echo.past(text);
                    if new.is_empty() {
                        // The echo of the delivered text, or held while it could be.
                        return Vec::new();
                    }
                    if new != *text {
                        *text = new;
                        changed = true;
                    }
                }
                changed
            }
            MessagesData::MessageDelta(delta) => match delta.usage.as_mut() {
                Some(usage) if self.tokens > 0 => {
                    let output = usage.output_tokens.unwrap_or(0);
                    usage.output_tokens = Some(output.saturating_add(self.tokens));
                    if let Some(input) = usage.input_tokens.as_mut() {
                        *input = input.saturating_sub(self.tokens);
                    }
                    true
                }
                _ => false,
            },
            _ => false,
        };
        let event = match changed {
            true => MessagesEvent::new(data).into(),
            false => event,
        };
        before.into_iter().chain([event]).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn event(data: &str) -> SseEvent {
        let kind: Value = serde_json::from_str(data).unwrap();
        SseEvent::data(data)
            .with_event(kind["type"].as_str().unwrap())
            .unwrap()
    }

    /// The data of the one event a join sent on (none: `None`).
    fn data(mut joined: Vec<SseEvent>) -> Option<Value> {
        assert!(joined.len() <= 1, "{joined:?}");
        Some(serde_json::from_str(joined.pop()?.data_str()?).unwrap())
    }

    /// What a client had before its stream broke: a message begun and its text block open.
    fn open_text_block() -> Blocks {
        let mut blocks = Blocks::default();
        for data in [
            r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","usage":{"input_tokens":3,"output_tokens":0}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"t0 "}}"#,
        ] {
            blocks.saw(MessagesEvent::from_sse(&event(data)).unwrap().data());
        }
        blocks
    }

    #[test]
    fn a_continuation_goes_on_in_the_open_block_without_a_second_message_start() {
        let blocks = open_text_block();
        assert_eq!(blocks.open(), Some(0));
        let mut seam = MessagesSeam::new(&blocks, &["t0 "], 1);
        let start = r#"{"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","content":[],"model":"m","usage":{"input_tokens":4,"output_tokens":0}}}"#;
        assert!(data(seam.join(event(start))).is_none());
        let block =
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#;
        assert!(data(seam.join(event(block))).is_none());
        // llama.cpp echoes the prefix glued to the new text first.
        let echo = r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"t0 t1 "}}"#;
        let joined = data(seam.join(event(echo))).unwrap();
        assert_eq!(joined["delta"]["text"], "t1 ");
        assert_eq!(joined["index"], 0);
        let stop = r#"{"type":"content_block_stop","index":0}"#;
        assert_eq!(data(seam.join(event(stop))).unwrap()["index"], 0);
        // A second block of the continuation comes after the client's first.
        let tool = r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}"#;
        assert_eq!(data(seam.join(event(tool))).unwrap()["index"], 1);
        let last = r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"input_tokens":4,"output_tokens":2}}"#;
        let usage = data(seam.join(event(last))).unwrap()["usage"].clone();
        assert_eq!(
            (
                usage["input_tokens"].as_u64(),
                usage["output_tokens"].as_u64()
            ),
            (Some(3), Some(3))
        );
        let stop = event(r#"{"type":"message_stop"}"#);
        assert_eq!(seam.join(stop.clone()), [stop], "as it came");
    }

    #[test]
    fn blocks_after_a_closed_one_come_after_it() {
        let mut blocks = open_text_block();
        let stop = event(r#"{"type":"content_block_stop","index":0}"#);
        blocks.saw(MessagesEvent::from_sse(&stop).unwrap().data());
        assert_eq!(blocks.open(), None);
        let mut seam = MessagesSeam::new(&blocks, &[], 1);
        let block =
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#;
        assert_eq!(
            data(seam.join(event(block))).unwrap()["index"],
            1,
            "a new block"
        );
        let delta = r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"more"}}"#;
        let joined = data(seam.join(event(delta))).unwrap();
        assert_eq!(
            (&joined["index"], &joined["delta"]["text"]),
            (&1.into(), &"more".into())
        );
        // What the format does not read goes on as it came.
        let garbage = SseEvent::data("not json")
            .with_event("content_block_delta")
            .unwrap();
        assert_eq!(seam.join(garbage.clone()), [garbage]);
    }

    #[test]
    fn a_first_block_of_another_type_stops_the_open_one_and_comes_after_it() {
        let mut seam = MessagesSeam::new(&open_text_block(), &["t0 "], 1);
        let tool = r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}"#;
        let mut joined = seam.join(event(tool));
        let start = joined.pop();
        let stop = data(joined).unwrap();
        assert_eq!(
            (&stop["type"], &stop["index"]),
            (&"content_block_stop".into(), &0.into())
        );
        assert_eq!(data(start.into_iter().collect()).unwrap()["index"], 1);
        let input = r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{}"}}"#;
        assert_eq!(data(seam.join(event(input))).unwrap()["index"], 1);
    }

    #[test]
    fn the_proxys_own_end_stops_the_open_block() {
        let blocks = open_text_block();
        let types = |events: Vec<SseEvent>| -> Vec<String> {
            events
                .iter()
                .map(|e| e.event().unwrap().to_owned())
                .collect()
        };
        assert_eq!(
            types(blocks.close(("r", "m"), "end_turn", 1)),
            ["content_block_stop", "message_delta", "message_stop"]
        );
        assert_eq!(types(blocks.stop()), ["content_block_stop", "message_stop"]);
        // Before any event: an opening of the proxy's own first.
        let opened = types(Blocks::default().close(("r", "m"), "end_turn", 0));
        assert_eq!(opened, ["message_start", "message_delta", "message_stop"]);
    }
}
