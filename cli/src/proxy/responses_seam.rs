//! The seam of an OpenAI Responses stream carried on elsewhere: the carried-on stream's events
//! joined onto the client's, so that it sees one response. No second `response.created` (or
//! `in_progress`, `queued`); the carried-on stream's first output item goes on in the item the
//! client has open (its `output_item.added` and first `content_part.added` dropped, its events
//! under the client's item id, its text losing the echo a server may send first, see [`Echo`]),
//! and its other items come after the client's; the `.done` events and the final response carry
//! the whole text (the client's and the carried-on), the final response is the client's (its
//! `id`, the items it already had) and its `usage` counts the delivered tokens as output. The
//! client's items ([`Outline`]) also say how the proxy ends an answer itself.

use serde_json::{Value, json};
use streamgate::responses::{Item, Response, ResponsesData, ResponsesEvent};
use streamgate::sse::SseEvent;

use super::echo::Echo;
use super::failover::MAX_DELIVERED;
use super::format::typed;

/// What a client has of a Responses answer: the response its stream opened, the output items
/// it got whole, the item and part it has open and that part's text.
#[derive(Debug, Default)]
pub(super) struct Outline {
    response: Option<Response>,
    /// The items done, in order, as their `output_item.done` gave them.
    done: Vec<Value>,
    /// How many items were added.
    items: u64,
    /// The item added and not done: its index, id and type.
    open_item: Option<(u64, Option<String>, String)>,
    /// The part of the open item added and not done.
    open_part: Option<u64>,
    /// The text of the open part (kept up to [`MAX_DELIVERED`] bytes).
    part_text: String,
}

impl Outline {
    /// The client got `data` (numbered: its indices are there).
    pub(super) fn saw(&mut self, data: &ResponsesData) {
        match data {
            ResponsesData::Created(event)
            | ResponsesData::InProgress(event)
            | ResponsesData::Queued(event)
                if self.response.is_none() =>
            {
                self.response = Some(event.response.clone());
            }
            ResponsesData::OutputItemAdded(added) => {
                let index = added.output_index.unwrap_or(self.items);
                self.items = self.items.max(index.saturating_add(1));
                let item = &added.item;
                self.open_item = Some((index, item.id.clone(), item.kind.clone()));
                (self.open_part, self.part_text) = (None, String::new());
            }
            ResponsesData::OutputItemDone(done) => {
                if self.open_item.as_ref().map(|(index, ..)| Some(*index))
                    == Some(done.output_index)
                {
                    (self.open_item, self.open_part) = (None, None);
                }
                self.done
                    .push(serde_json::to_value(&done.item).unwrap_or(Value::Null));
            }
            ResponsesData::ContentPartAdded(added) => {
                (self.open_part, self.part_text) = (added.content_index, String::new());
            }
            ResponsesData::ContentPartDone(done) if self.open_part == done.content_index => {
                self.open_part = None;
            }
            ResponsesData::OutputTextDelta(delta)
                if self.part_text.len() + delta.delta.len() <= MAX_DELIVERED =>
            {
                self.part_text.push_str(&delta.delta);
            }
            _ => {}
        }
    }

    /// Whether the client's text is all in the part it has open, the first of a message item
    /// it has open: the one place a continuation's text can go on in.
    pub(super) fn holds(&self, text: &str) -> bool {
        let message = matches!(&self.open_item, Some((.., kind)) if kind == "message");
        message && self.open_part == Some(0) && self.part_text == text
    }

    /// The events that end the answer when the proxy ends it itself (a stop, or every token
    /// asked for delivered before the stream broke): the open part's and item's `.done`
    /// events, then `response.incomplete` (`incomplete_details.reason` `reason`) whose output
    /// is what the client has; before them, when no `response.created` came, one of the
    /// proxy's own, named by the request `id` and its `model`, as the SDKs need one.
    pub(super) fn close(&self, (id, model): (&str, &str), reason: &str) -> Vec<SseEvent> {
        let mut events = Vec::new();
        let mut response = match &self.response {
            Some(response) => serde_json::to_value(response).unwrap_or_else(|_| json!({})),
            None => {
                let response = json!({"id": id, "object": "response",
                    "status": "in_progress", "model": model, "output": []});
                let created = json!({"type": "response.created", "response": response});
                events.push(typed("response.created", created));
                response
            }
        };
        if let Some((index, item_id, _)) = &self.open_item {
            let place = json!({"item_id": item_id, "output_index": index, "content_index": 0});
            if self.open_part.is_some() {
                let mut done = json!({"type": "response.output_text.done", "text": self.part_text,
                    "logprobs": []});
                merge(&mut done, &place);
                events.push(typed("response.output_text.done", done));
                let mut done = json!({"type": "response.content_part.done",
                    "part": {"type": "output_text", "text": self.part_text, "annotations": []}});
                merge(&mut done, &place);
                events.push(typed("response.content_part.done", done));
            }
            let item = self.output().pop().unwrap_or(Value::Null);
            let done = json!({"type": "response.output_item.done", "output_index": index,
                "item": item});
            events.push(typed("response.output_item.done", done));
        }
        response["status"] = json!("incomplete");
        response["incomplete_details"] = json!({"reason": reason});
        response["output"] = Value::Array(self.output());
        let incomplete = json!({"type": "response.incomplete", "response": response});
        events.push(typed("response.incomplete", incomplete));
        events
    }

    /// The output the client has: the items done, then the open one with the text it got
    /// (`status` `incomplete`).
    fn output(&self) -> Vec<Value> {
        let mut output = self.done.clone();
        if let Some((_, id, kind)) = &self.open_item {
            let mut item = json!({"type": kind, "id": id, "status": "incomplete"});
            if kind == "message" {
                item["role"] = json!("assistant");
                let text =
                    json!({"type": "output_text", "text": self.part_text, "annotations": []});
                item["content"] = json!(self.open_part.map(|_| vec![text]).unwrap_or_default());
            }
            output.push(item);
        }
        output
    }
}

/// `fields`' fields set in `object`.
fn merge(object: &mut Value, fields: &Value) {
    if let (Value::Object(object), Value::Object(fields)) = (object, fields) {
        object.extend(fields.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
}

/// The join of one carried-on Responses stream (a restart or a continuation) onto the
/// client's.
#[derive(Debug)]
pub(super) struct ResponsesSeam {
    /// The client's response, when its stream opened one.
    response: Option<Response>,
    /// The items the client got whole.
    done: Vec<Value>,
    /// The item the carried-on stream's item 0 goes on in: its index and id (`None`: it is
    /// a new item, after the client's).
    open: Option<(u64, Option<String>)>,
    /// Whether the client has the open item's first part open.
    part_open: bool,
    /// The carried-on stream's item `k` is the client's `base + k`.
    base: u64,
    /// The text of the open part: the client's, then what the carried-on stream added.
    text: String,
    echo: Echo,
    /// The delivered tokens, moved from the final usage's input to its output.
    tokens: u64,
    /// Where the carried-on stream is, by its own numbers, for the events that leave them out
    /// (llama.cpp's): its current item and part, and how many of each it added.
    theirs: Place,
}

/// A stream's current item and part, and how many items (and parts of the current item) it
/// added.
#[derive(Debug, Default)]
struct Place {
    item: u64,
    items: u64,
    part: u64,
    parts: u64,
}

impl ResponsesSeam {
    /// The join onto a client that has `outline` and `tokens` tokens of the answer; the
    /// carried-on text may begin by repeating one of `echoes` (none for a restart).
    pub(super) fn new(outline: &Outline, echoes: &[&str], tokens: u64) -> Self {
        let open = outline
            .open_item
            .as_ref()
            .map(|(index, id, _)| (*index, id.clone()));
        ResponsesSeam {
            response: outline.response.clone(),
            done: outline.done.clone(),
            base: open.as_ref().map_or(outline.items, |(index, _)| *index),
            part_open: open.is_some() && outline.open_part == Some(0),
            open,
            text: outline.part_text.clone(),
            echo: Echo::new(echoes),
            tokens,
            theirs: Place::default(),
        }
    }

    /// The event to send on for the carried-on `event`; `None` to drop it. One the format
    /// does not read goes on as it came (the proxy's reading of it decides).
    pub(super) fn join(&mut self, event: SseEvent) -> Option<SseEvent> {
        let Ok(parsed) = ResponsesEvent::from_sse(&event) else {
            return Some(event);
        };
        let mut data = parsed.into_data();
        let going_on = self.open.is_some();
        match &mut data {
            ResponsesData::Created(_) | ResponsesData::InProgress(_) | ResponsesData::Queued(_)
                if self.response.is_some() =>
            {
                return None;
            }
            ResponsesData::OutputItemAdded(added) => {
                let theirs = &mut self.theirs;
                let index = added.output_index.unwrap_or(theirs.items);
                (theirs.item, theirs.items) = (index, theirs.items.max(index.saturating_add(1)));
                (theirs.part, theirs.parts) = (0, 0);
                if index == 0 && going_on {
                    return None;
                }
                self.place(&mut added.output_index, None);
            }
            ResponsesData::OutputItemDone(done) => {
                let first = self.place(&mut done.output_index, None);
                if first {
                    self.whole_item(&mut done.item);
                }
            }
            ResponsesData::ContentPartAdded(added) => {
                let theirs = &mut self.theirs;
                let index = added.content_index.unwrap_or(theirs.parts);
                (theirs.part, theirs.parts) = (index, theirs.parts.max(index.saturating_add(1)));
                if self.is_open_part(added.output_index, added.content_index) {
                    return None;
                }
                added.content_index = Some(index);
                self.place(&mut added.output_index, Some(&mut added.item_id));
            }
            ResponsesData::ReasoningSummaryPartAdded(part)
            | ResponsesData::ReasoningSummaryPartDone(part) => {
                self.place(&mut part.output_index, Some(&mut part.item_id));
            }
            ResponsesData::ContentPartDone(done) => {
                let open = self.is_open_part(done.output_index, done.content_index);
                self.place(&mut done.output_index, Some(&mut done.item_id));
                if let (true, Some(part)) = (open, done.part.as_mut()) {
                    part.insert("text".to_owned(), json!(self.text));
                }
            }
            ResponsesData::OutputTextDelta(delta)
                if self.is_open_part(delta.output_index, delta.content_index) =>
            {
                self.place(&mut delta.output_index, Some(&mut delta.item_id));
                let new = self.echo.past(&delta.delta);
                if new.is_empty() {
                    // The echo of the delivered text, or held while it could be.
                    return None;
                }
                if self.text.len() + new.len() <= MAX_DELIVERED {
                    self.text.push_str(&new);
                }
                delta.delta = new;
                // The padding was the server's for its own text.
                delta.obfuscation = None;
            }
            ResponsesData::OutputTextDone(done)
                if self.is_open_part(done.output_index, done.content_index) =>
            {
                self.place(&mut done.output_index, Some(&mut done.item_id));
                done.extra.insert("text".to_owned(), json!(self.text));
            }
            ResponsesData::OutputTextDelta(delta)
            | ResponsesData::RefusalDelta(delta)
            | ResponsesData::FunctionCallArgumentsDelta(delta)
            | ResponsesData::ReasoningSummaryTextDelta(delta)
            | ResponsesData::ReasoningTextDelta(delta) => {
                self.place(&mut delta.output_index, Some(&mut delta.item_id));
            }
            ResponsesData::OutputTextDone(done)
            | ResponsesData::RefusalDone(done)
            | ResponsesData::FunctionCallArgumentsDone(done)
            | ResponsesData::ReasoningSummaryTextDone(done)
            | ResponsesData::ReasoningTextDone(done) => {
                self.place(&mut done.output_index, Some(&mut done.item_id));
            }
            ResponsesData::Completed(end)
            | ResponsesData::Incomplete(end)
            | ResponsesData::Failed(end) => self.whole_response(&mut end.response),
            _ => return Some(event),
        }
        Some(ResponsesEvent::new(data).into())
    }

    /// Whether the carried-on stream's item `output_index` part `content_index` is the part
    /// the client has open.
    fn is_open_part(&self, output_index: Option<u64>, content_index: Option<u64>) -> bool {
        let item = output_index.unwrap_or(self.theirs.item);
        self.part_open && item == 0 && content_index.unwrap_or(self.theirs.part) == 0
    }

    /// Moves the carried-on stream's item `output_index` to the client's, and (its item 0
    /// going on in the client's open one) its `item_id` to the client's. Whether it is that
    /// item.
    fn place(&self, output_index: &mut Option<u64>, item_id: Option<&mut Option<String>>) -> bool {
        let index = output_index.unwrap_or(self.theirs.item);
        *output_index = Some(self.base.saturating_add(index));
        let first = index == 0 && self.open.is_some();
        if let (true, Some(item_id), Some((_, Some(id)))) = (first, item_id, &self.open) {
            *item_id = Some(id.clone());
        }
        first
    }

    /// The carried-on stream's item 0, whole, as the client's open item: its id, and its first
    /// part's text all the text.
    fn whole_item(&self, item: &mut Item) {
        if let Some((_, Some(id))) = &self.open {
            item.id = Some(id.clone());
        }
        if !self.part_open {
            return;
        }
        if let Some(Value::Object(part)) = item
            .extra
            .get_mut("content")
            .and_then(|content| content.get_mut(0))
        {
            part.insert("text".to_owned(), json!(self.text));
        }
    }

    /// The final response as the client's: its id, the items it had done before the
    /// carried-on stream's (whose first goes on in its open one), the usage counting the
    /// delivered tokens as output.
    fn whole_response(&self, response: &mut Response) {
        if let Some(id) = self.response.as_ref().and_then(|r| r.id.clone()) {
            response.id = Some(id);
        }
        if let Some(Value::Array(output)) = response.extra.get_mut("output") {
            let mut items = std::mem::take(output);
            if let Some(first) = items.first_mut() {
                if let Ok(mut item) = serde_json::from_value::<Item>(first.clone()) {
                    if self.open.is_some() {
                        self.whole_item(&mut item);
                        *first = serde_json::to_value(item).unwrap_or(Value::Null);
                    }
                }
            }
            *output = self.done.iter().cloned().chain(items).collect();
        }
        if let (Some(Value::Object(usage)), true) =
            (response.extra.get_mut("usage"), self.tokens > 0)
        {
            let get = |usage: &serde_json::Map<String, Value>, key: &str| {
                usage.get(key).and_then(Value::as_u64)
            };
            let output = get(usage, "output_tokens").unwrap_or(0) + self.tokens;
            usage.insert("output_tokens".to_owned(), output.into());
            if let Some(input) = get(usage, "input_tokens") {
                let input = input.saturating_sub(self.tokens);
                usage.insert("input_tokens".to_owned(), input.into());
                usage.insert("total_tokens".to_owned(), (input + output).into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(data: Value) -> SseEvent {
        let kind = data["type"].as_str().unwrap().to_owned();
        typed(&kind, data)
    }

    fn read(event: &SseEvent) -> Value {
        serde_json::from_str(event.data_str().unwrap()).unwrap()
    }

    /// A client that got a response begun, its message item and part open, and `text`.
    fn outline(text: &str) -> Outline {
        let mut outline = Outline::default();
        for data in [
            json!({"type": "response.created", "response": {"id": "resp_1", "created_at": 7,
                "status": "in_progress", "output": []}, "sequence_number": 0}),
            json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "message",
                "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []}, "sequence_number": 1}),
            json!({"type": "response.content_part.added", "item_id": "msg_1", "output_index": 0,
                "content_index": 0, "part": {"type": "output_text", "text": ""}, "sequence_number": 2}),
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
                "content_index": 0, "delta": text, "sequence_number": 3}),
        ] {
            outline.saw(ResponsesEvent::from_sse(&event(data)).unwrap().data());
        }
        outline
    }

    #[test]
    fn a_continuation_goes_on_in_the_open_part_as_one_response() {
        let outline = outline("t0 ");
        assert!(outline.holds("t0 "));
        assert!(!outline.holds("t0 t1 "), "text elsewhere too");
        let mut seam = ResponsesSeam::new(&outline, &["t0 "], 1);
        // llama.cpp's continuation: its own ids, no indices, no sequence numbers.
        let theirs = [
            json!({"type": "response.created", "response": {"id": "resp_2", "status": "in_progress", "output": []}}),
            json!({"type": "response.in_progress", "response": {"id": "resp_2", "status": "in_progress", "output": []}}),
            json!({"type": "response.output_item.added", "item": {"type": "message", "id": "msg_2",
                "role": "assistant", "status": "in_progress", "content": []}}),
            json!({"type": "response.content_part.added", "item_id": "msg_2", "part": {"type": "output_text", "text": ""}}),
        ];
        for data in theirs {
            assert!(
                seam.join(event(data)).is_none(),
                "the client has its opening"
            );
        }
        // The echo of the delivered text, glued to the new.
        let delta = json!({"type": "response.output_text.delta", "item_id": "msg_2", "delta": "t0 t1 ", "obfuscation": "xx"});
        let delta = read(&seam.join(event(delta)).unwrap());
        assert_eq!(
            (&delta["delta"], &delta["item_id"], &delta["output_index"]),
            (&json!("t1 "), &json!("msg_1"), &json!(0))
        );
        assert!(delta.get("obfuscation").is_none());
        let done = json!({"type": "response.output_text.done", "item_id": "msg_2", "text": "t1 "});
        assert_eq!(
            read(&seam.join(event(done)).unwrap())["text"],
            "t0 t1 ",
            "the whole text"
        );
        let part = json!({"type": "response.content_part.done", "item_id": "msg_2",
            "part": {"type": "output_text", "text": "t1 "}});
        assert_eq!(
            read(&seam.join(event(part)).unwrap())["part"]["text"],
            "t0 t1 "
        );
        let item = json!({"type": "message", "id": "msg_2", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "t1 ", "annotations": []}]});
        let done = json!({"type": "response.output_item.done", "item": item});
        let done = read(&seam.join(event(done)).unwrap());
        assert_eq!(
            (&done["item"]["id"], &done["item"]["content"][0]["text"]),
            (&json!("msg_1"), &json!("t0 t1 "))
        );
        let completed = json!({"type": "response.completed", "response": {"id": "resp_2", "status": "completed",
            "output": [item], "usage": {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6}}});
        let completed = read(&seam.join(event(completed)).unwrap());
        let response = &completed["response"];
        assert_eq!(response["id"], "resp_1", "the client's response");
        assert_eq!(response["output"][0]["id"], "msg_1");
        assert_eq!(response["output"][0]["content"][0]["text"], "t0 t1 ");
        assert_eq!(
            response["usage"],
            json!({"input_tokens": 4, "output_tokens": 2, "total_tokens": 6})
        );
    }

    #[test]
    fn the_proxys_own_end_carries_what_the_client_has() {
        let outline = outline("t0 t1 ");
        let events = outline.close(("r", "m"), "stopped");
        let types: Vec<_> = events
            .iter()
            .map(|e| e.event().unwrap().to_owned())
            .collect();
        assert_eq!(
            types,
            [
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.incomplete"
            ]
        );
        assert_eq!(read(&events[0])["text"], "t0 t1 ");
        let incomplete = read(&events[3]);
        let response = &incomplete["response"];
        assert_eq!(
            (&response["id"], &response["status"]),
            (&json!("resp_1"), &json!("incomplete"))
        );
        assert_eq!(response["incomplete_details"]["reason"], "stopped");
        assert_eq!(response["output"][0]["content"][0]["text"], "t0 t1 ");
        // Before any event: an opening of the proxy's own first.
        let opened = Outline::default().close(("r", "m"), "stopped");
        assert_eq!(opened[0].event(), Some("response.created"));
        assert_eq!(read(&opened[0])["response"]["id"], "r");
    }
}
