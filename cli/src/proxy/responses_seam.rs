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
/// it got whole, and the item it has open.
#[derive(Debug, Default)]
pub(super) struct Outline {
    response: Option<Response>,
    /// The items done, in order, as their `output_item.done` gave them.
    done: Vec<Value>,
    /// How many items were added.
    items: u64,
    open: Option<OpenItem>,
}

/// An output item the client has open: where it is, what it is, and its parts so far.
#[derive(Debug)]
struct OpenItem {
    index: u64,
    id: Option<String>,
    kind: String,
    /// The item as its `output_item.added` gave it (a function call's name and call id, ..),
    /// its `arguments` as their deltas gave them.
    item: Value,
    parts: Vec<Part>,
}

/// A content part of the open item: its index and type, its text (or refusal) so far, and how
/// far it is done.
#[derive(Debug)]
struct Part {
    index: u64,
    kind: String,
    text: Capped,
    /// Its `output_text.done` (or `refusal.done`) came: its text is final.
    text_done: bool,
    /// Its `content_part.done` came.
    done: bool,
}

/// Text kept up to [`MAX_DELIVERED`] bytes: past that, none is added any more (it is no longer
/// all of it, and says so).
#[derive(Debug, Default)]
struct Capped {
    text: String,
    cut: bool,
}

impl Capped {
    fn push(&mut self, more: &str) {
        self.cut |= self.text.len() + more.len() > MAX_DELIVERED;
        if !self.cut {
            self.text.push_str(more);
        }
    }
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
                self.open = Some(OpenItem {
                    index,
                    id: item.id.clone(),
                    kind: item.kind.clone(),
                    item: serde_json::to_value(item).unwrap_or(Value::Null),
                    parts: Vec::new(),
                });
            }
            ResponsesData::OutputItemDone(done) => {
                self.open = None;
                self.done
                    .push(serde_json::to_value(&done.item).unwrap_or(Value::Null));
            }
            ResponsesData::ContentPartAdded(added) => {
                if let Some(open) = self.open.as_mut() {
                    let kind = added.part.as_ref().and_then(|part| part.get("type"));
                    open.parts.push(Part {
                        index: added.content_index.unwrap_or(open.parts.len() as u64),
                        kind: kind
                            .and_then(Value::as_str)
                            .unwrap_or("output_text")
                            .to_owned(),
                        text: Capped::default(),
                        text_done: false,
                        done: false,
                    });
                }
            }
            ResponsesData::ContentPartDone(done) => {
                if let Some(part) = self.part(done.content_index) {
                    part.done = true;
                }
            }
            ResponsesData::OutputTextDelta(delta) | ResponsesData::RefusalDelta(delta) => {
                if let Some(part) = self.part(delta.content_index) {
                    part.text.push(&delta.delta);
                }
            }
            ResponsesData::OutputTextDone(done) | ResponsesData::RefusalDone(done) => {
                if let Some(part) = self.part(done.content_index) {
                    part.text_done = true;
                }
            }
            ResponsesData::FunctionCallArgumentsDelta(delta) => {
                if let Some(Value::Object(item)) = self.open.as_mut().map(|open| &mut open.item) {
                    let arguments = item.entry("arguments").or_insert_with(|| json!(""));
                    if let Value::String(arguments) = arguments {
                        arguments.push_str(&delta.delta);
                    }
                }
            }
            _ => {}
        }
    }

    /// The open item's part `index` (its last, when the event named none).
    fn part(&mut self, index: Option<u64>) -> Option<&mut Part> {
        let parts = &mut self.open.as_mut()?.parts;
        match index {
            Some(index) => parts.iter_mut().find(|part| part.index == index),
            None => parts.last_mut(),
        }
    }

    /// The id of the response the stream opened, once it did.
    pub(super) fn response_id(&self) -> Option<&str> {
        self.response.as_ref()?.id.as_deref()
    }

    /// The client's text (`len` bytes of it) when it is all in the one part of the message
    /// item it has open, that part still going on: the one place a continuation's text can go
    /// on in.
    pub(super) fn holding(&self, len: usize) -> Option<&str> {
        let open = self.open.as_ref().filter(|open| open.kind == "message")?;
        let [part] = open.parts.as_slice() else {
            return None;
        };
        let going_on = part.index == 0 && !part.text_done && !part.done;
        let all = !part.text.cut && part.text.text.len() == len;
        (going_on && part.kind == "output_text" && all).then_some(part.text.text.as_str())
    }

    /// Whether the text of the part the client has open is final (its `output_text.done`
    /// came): the answer's text is whole, and a break after it is no failure to carry on.
    pub(super) fn text_is_final(&self) -> bool {
        self.open.as_ref().is_some_and(|open| {
            !open.parts.is_empty() && open.parts.iter().all(|part| part.text_done)
        })
    }

    /// The events that end the answer when the proxy ends it itself (a stop, every token asked
    /// for delivered before the stream broke, a break after the text was final): the open
    /// parts' and item's `.done` events not sent yet, then `response.incomplete`
    /// (`incomplete_details.reason` `reason`) whose output is what the client has; before
    /// them, when no `response.created` came, one of the proxy's own, named by the request
    /// `id` and its `model`, as the SDKs need one.
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
        events.extend(self.close_open());
        response["status"] = json!("incomplete");
        response["incomplete_details"] = json!({"reason": reason});
        response["output"] = Value::Array(self.output());
        let incomplete = json!({"type": "response.incomplete", "response": response});
        events.push(typed("response.incomplete", incomplete));
        events
    }

    /// The `.done` events the open item's parts and the item itself have not had yet.
    fn close_open(&self) -> Vec<SseEvent> {
        let mut events = Vec::new();
        let Some(open) = &self.open else {
            return events;
        };
        for part in &open.parts {
            let place = json!({"item_id": open.id, "output_index": open.index,
                "content_index": part.index});
            if !part.text_done {
                let (kind, field) = part.fields();
                let kind = format!("response.{kind}.done");
                let mut done = json!({"type": kind, field: part.text.text});
                merge(&mut done, &place);
                events.push(typed(&kind, done));
            }
            if !part.done {
                let mut done = json!({"type": "response.content_part.done", "part": part.value()});
                merge(&mut done, &place);
                events.push(typed("response.content_part.done", done));
            }
        }
        let done = json!({"type": "response.output_item.done", "output_index": open.index,
            "item": open.value()});
        events.push(typed("response.output_item.done", done));
        events
    }

    /// The output the client has: the items done, then the open one as it stands (`status`
    /// `incomplete`).
    fn output(&self) -> Vec<Value> {
        let mut output = self.done.clone();
        output.extend(self.open.as_ref().map(OpenItem::value));
        output
    }
}

impl OpenItem {
    /// The item as it stands: as added, `status` `incomplete`, its parts with their text.
    fn value(&self) -> Value {
        let mut item = self.item.clone();
        item["status"] = json!("incomplete");
        if !self.parts.is_empty() {
            item["content"] = self.parts.iter().map(Part::value).collect();
        }
        item
    }
}

impl Part {
    /// Its events' name and the field its text is in: `output_text`, `text`; `refusal`,
    /// `refusal`.
    fn fields(&self) -> (&'static str, &'static str) {
        match self.kind.as_str() {
            "refusal" => ("refusal", "refusal"),
            _ => ("output_text", "text"),
        }
    }

    /// The part as it stands.
    fn value(&self) -> Value {
        let (_, field) = self.fields();
        let mut part = json!({"type": self.kind, field: self.text.text});
        if field == "text" {
            part["annotations"] = json!([]);
        }
        part
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
    /// The items the client got whole (and its open one, once the seam closed it).
    done: Vec<Value>,
    /// The client's open item: its id and type, the `.done` events it still needs and the item
    /// as it stands, for when the carried-on stream's first item is of another type.
    open: Option<(Option<String>, String, Vec<SseEvent>, Value)>,
    /// Whether the carried-on stream's item 0 goes on in the client's open item (until its
    /// first item shows another type).
    going_on: bool,
    /// Whether it goes on in the client's open part, the open item's one part, 0.
    part_open: bool,
    /// The carried-on stream's item `k` is the client's `base + k`.
    base: u64,
    /// How many items the client has.
    items: u64,
    /// The text of the open part: the client's, then what the carried-on stream added.
    text: Capped,
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
        let open = outline.open.as_ref();
        let part_open = open.is_some_and(|open| match open.parts.as_slice() {
            [part] => part.index == 0 && !part.text_done && !part.done,
            _ => false,
        });
        let mut text = Capped::default();
        if let (true, Some(open)) = (part_open, open) {
            text.push(&open.parts[0].text.text);
        }
        ResponsesSeam {
            response: outline.response.clone(),
            done: outline.done.clone(),
            open: open.map(|open| {
                let closing = outline.close_open();
                (open.id.clone(), open.kind.clone(), closing, open.value())
            }),
            going_on: open.is_some(),
            part_open,
            base: open.map_or(outline.items, |open| open.index),
            items: outline.items,
            text,
            echo: Echo::new(echoes),
            tokens,
            theirs: Place::default(),
        }
    }

    /// The events to send on for the carried-on `event`: none (it is dropped), it (joined), or
    /// the client's open item closed and it (its first item is of another type). One the
    /// format does not read goes on as it came (the proxy's reading of it decides).
    pub(super) fn join(&mut self, event: SseEvent) -> Vec<SseEvent> {
        let Ok(parsed) = ResponsesEvent::from_sse(&event) else {
            return vec![event];
        };
        let mut before = Vec::new();
        let mut data = parsed.into_data();
        match &mut data {
            ResponsesData::Created(_) | ResponsesData::InProgress(_) | ResponsesData::Queued(_)
                if self.response.is_some() =>
            {
                return Vec::new();
            }
            ResponsesData::OutputItemAdded(added) => {
                let theirs = &mut self.theirs;
                let index = added.output_index.unwrap_or(theirs.items);
                (theirs.item, theirs.items) = (index, theirs.items.max(index.saturating_add(1)));
                (theirs.part, theirs.parts) = (0, 0);
                if index == 0 && self.going_on {
                    match self.open.take() {
                        // The client's open item goes on.
                        Some(open) if open.1 == added.item.kind => {
                            self.open = Some(open);
                            return Vec::new();
                        }
                        // Another type: the client's item is closed as it stands, and the
                        // carried-on stream's items come after the client's.
                        Some((_, _, closing, item)) => {
                            before = closing;
                            self.done.push(item);
                            (self.going_on, self.part_open) = (false, false);
                            self.base = self.items;
                        }
                        None => self.going_on = false,
                    }
                }
                self.place(&mut added.output_index, None);
            }
            ResponsesData::OutputItemDone(done) => {
                if self.place(&mut done.output_index, None) {
                    self.whole_item(&mut done.item);
                }
            }
            ResponsesData::ContentPartAdded(added) => {
                let theirs = &mut self.theirs;
                let index = added.content_index.unwrap_or(theirs.parts);
                (theirs.part, theirs.parts) = (index, theirs.parts.max(index.saturating_add(1)));
                if self.is_open_part(added.output_index, added.content_index) {
                    return Vec::new();
                }
                added.content_index = Some(index);
                self.place(&mut added.output_index, Some(&mut added.item_id));
            }
            ResponsesData::ContentPartDone(done) => {
                let open = self.is_open_part(done.output_index, done.content_index);
                self.place(&mut done.output_index, Some(&mut done.item_id));
                if let (true, Some(part)) = (open, done.part.as_mut()) {
                    part.insert("text".to_owned(), json!(self.text.text));
                }
            }
            ResponsesData::OutputTextDelta(delta) => {
                let open = self.is_open_part(delta.output_index, delta.content_index);
                self.place(&mut delta.output_index, Some(&mut delta.item_id));
                let new = self.echo.past(&delta.delta);
                if new.is_empty() {
                    // The echo of the delivered text, or held while it could be.
                    return Vec::new();
                }
                if open {
                    self.text.push(&new);
                }
                if new != delta.delta {
                    delta.delta = new;
                    // The padding was the server's for its own text.
                    delta.obfuscation = None;
                }
            }
            ResponsesData::OutputTextDone(done) => {
                let open = self.is_open_part(done.output_index, done.content_index);
                self.place(&mut done.output_index, Some(&mut done.item_id));
                if open {
                    done.extra.insert("text".to_owned(), json!(self.text.text));
                }
            }
            ResponsesData::RefusalDelta(delta)
            | ResponsesData::FunctionCallArgumentsDelta(delta)
            | ResponsesData::ReasoningSummaryTextDelta(delta)
            | ResponsesData::ReasoningTextDelta(delta) => {
                self.place(&mut delta.output_index, Some(&mut delta.item_id));
            }
            ResponsesData::RefusalDone(done)
            | ResponsesData::FunctionCallArgumentsDone(done)
            | ResponsesData::ReasoningSummaryTextDone(done)
            | ResponsesData::ReasoningTextDone(done) => {
                self.place(&mut done.output_index, Some(&mut done.item_id));
            }
            ResponsesData::ReasoningSummaryPartAdded(part)
            | ResponsesData::ReasoningSummaryPartDone(part) => {
                self.place(&mut part.output_index, Some(&mut part.item_id));
            }
            ResponsesData::Completed(end)
            | ResponsesData::Incomplete(end)
            | ResponsesData::Failed(end) => self.whole_response(&mut end.response),
            ResponsesData::Unknown(_) => return vec![self.place_unknown(event)],
            _ => return vec![event],
        }
        before.push(ResponsesEvent::new(data).into());
        before
    }

    /// Whether the carried-on stream's item `output_index` part `content_index` is the part
    /// the client has open.
    fn is_open_part(&self, output_index: Option<u64>, content_index: Option<u64>) -> bool {
        let item = output_index.unwrap_or(self.theirs.item);
        let part = content_index.unwrap_or(self.theirs.part);
        self.going_on && self.part_open && item == 0 && part == 0
    }

    /// Moves the carried-on stream's item `output_index` to the client's, and (its item 0
    /// going on in the client's open one) its `item_id` to the client's. Whether it is that
    /// item.
    fn place(&self, output_index: &mut Option<u64>, item_id: Option<&mut Option<String>>) -> bool {
        let index = output_index.unwrap_or(self.theirs.item);
        *output_index = Some(self.base.saturating_add(index));
        let first = index == 0 && self.going_on;
        if let (true, Some(item_id), Some((Some(id), ..))) = (first, item_id, &self.open) {
            *item_id = Some(id.clone());
        }
        first
    }

    /// An event of a type the crate does not know (a tool call's progress, an annotation),
    /// moved as the others: its `output_index`, and its `item_id` when it is in the client's
    /// open item.
    fn place_unknown(&self, event: SseEvent) -> SseEvent {
        let fields = event
            .data_str()
            .and_then(|data| serde_json::from_str::<serde_json::Map<String, Value>>(data).ok());
        let Some(mut fields) = fields.filter(|fields| fields.contains_key("output_index")) else {
            return event;
        };
        let mut index = fields.get("output_index").and_then(Value::as_u64);
        let mut item_id = fields
            .get("item_id")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let had_id = item_id.is_some();
        self.place(&mut index, had_id.then_some(&mut item_id));
        fields.insert("output_index".to_owned(), json!(index));
        if had_id {
            fields.insert("item_id".to_owned(), json!(item_id));
        }
        let moved = SseEvent::data(Value::Object(fields).to_string());
        match event.event() {
            Some(name) => moved.with_event(name).expect("a decoded type"),
            None => moved,
        }
    }

    /// The carried-on stream's item 0, whole, as the client's open item: its id, and its first
    /// part's text all the text.
    fn whole_item(&self, item: &mut Item) {
        if let Some((Some(id), ..)) = &self.open {
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
            part.insert("text".to_owned(), json!(self.text.text));
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
            if let (true, Some(first)) = (self.going_on, items.first_mut()) {
                if let Ok(mut item) = serde_json::from_value::<Item>(first.clone()) {
                    self.whole_item(&mut item);
                    *first = serde_json::to_value(item).unwrap_or(Value::Null);
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

    /// The one event a join sent on.
    fn one(mut joined: Vec<SseEvent>) -> SseEvent {
        assert_eq!(joined.len(), 1, "{joined:?}");
        joined.pop().unwrap()
    }

    /// The types of `events`.
    fn types(events: &[SseEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| e.event().unwrap().to_owned())
            .collect()
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
        assert_eq!(outline.holding(3), Some("t0 "));
        assert_eq!(outline.holding(6), None, "text elsewhere too");
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
                seam.join(event(data)).is_empty(),
                "the client has its opening"
            );
        }
        // The echo of the delivered text, glued to the new.
        let delta = json!({"type": "response.output_text.delta", "item_id": "msg_2", "delta": "t0 t1 ", "obfuscation": "xx"});
        let delta = read(&one(seam.join(event(delta))));
        assert_eq!(
            (&delta["delta"], &delta["item_id"], &delta["output_index"]),
            (&json!("t1 "), &json!("msg_1"), &json!(0))
        );
        assert!(delta.get("obfuscation").is_none());
        let done = json!({"type": "response.output_text.done", "item_id": "msg_2", "text": "t1 "});
        assert_eq!(
            read(&one(seam.join(event(done))))["text"],
            "t0 t1 ",
            "the whole text"
        );
        let part = json!({"type": "response.content_part.done", "item_id": "msg_2",
            "part": {"type": "output_text", "text": "t1 "}});
        assert_eq!(read(&one(seam.join(event(part))))["part"]["text"], "t0 t1 ");
        let item = json!({"type": "message", "id": "msg_2", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "t1 ", "annotations": []}]});
        let done = json!({"type": "response.output_item.done", "item": item});
        let done = read(&one(seam.join(event(done))));
        assert_eq!(
            (&done["item"]["id"], &done["item"]["content"][0]["text"]),
            (&json!("msg_1"), &json!("t0 t1 "))
        );
        let completed = json!({"type": "response.completed", "response": {"id": "resp_2", "status": "completed",
            "output": [item], "usage": {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6}}});
        let completed = read(&one(seam.join(event(completed))));
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

    #[test]
    fn a_first_item_of_another_type_closes_the_clients_and_comes_after_it() {
        // A restart of a reasoning model: nothing visible yet, the client's message open.
        let mut seam = ResponsesSeam::new(&outline(""), &[], 0);
        let reasoning = json!({"type": "response.output_item.added", "output_index": 0,
            "item": {"type": "reasoning", "id": "rs_2", "summary": []}});
        let joined = seam.join(event(reasoning));
        assert_eq!(
            types(&joined),
            [
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added"
            ]
        );
        assert_eq!(read(&joined[2])["item"]["id"], "msg_1");
        assert_eq!(read(&joined[3])["output_index"], 1, "after the client's");
        let message = json!({"type": "response.output_item.added", "output_index": 1,
            "item": {"type": "message", "id": "msg_2", "role": "assistant", "content": []}});
        assert_eq!(read(&one(seam.join(event(message))))["output_index"], 2);
        let delta = json!({"type": "response.output_text.delta", "item_id": "msg_2",
            "output_index": 1, "content_index": 0, "delta": "Hi"});
        let delta = read(&one(seam.join(event(delta))));
        assert_eq!(
            (&delta["item_id"], &delta["output_index"]),
            (&json!("msg_2"), &json!(2))
        );
        // A type the crate does not know is moved too.
        let unknown = json!({"type": "response.output_text.annotation.added", "item_id": "msg_2",
            "output_index": 1, "content_index": 0, "annotation": {}});
        assert_eq!(read(&one(seam.join(event(unknown))))["output_index"], 2);
        let completed = json!({"type": "response.completed", "response": {"id": "resp_2",
            "output": [{"type": "reasoning", "id": "rs_2"}, {"type": "message", "id": "msg_2"}]}});
        let output = read(&one(seam.join(event(completed))))["response"]["output"].clone();
        let ids: Vec<_> = output
            .as_array()
            .unwrap()
            .iter()
            .map(|item| item["id"].clone())
            .collect();
        assert_eq!(ids, [json!("msg_1"), json!("rs_2"), json!("msg_2")]);
    }

    #[test]
    fn a_restart_goes_on_from_each_opening_the_client_has() {
        // Only the response: the carried-on item and part pass, under their own ids.
        let mut created = Outline::default();
        let data = json!({"type": "response.created", "response": {"id": "resp_1", "output": []}});
        created.saw(ResponsesEvent::from_sse(&event(data)).unwrap().data());
        let mut seam = ResponsesSeam::new(&created, &[], 0);
        let item = json!({"type": "response.output_item.added", "item": {"type": "message", "id": "msg_2"}});
        assert_eq!(read(&one(seam.join(event(item))))["output_index"], 0);
        let part = json!({"type": "response.content_part.added", "item_id": "msg_2", "part": {"type": "output_text"}});
        assert_eq!(read(&one(seam.join(event(part))))["content_index"], 0);
        // The item open, no part yet: the item goes on, its part passes under the client's id.
        let mut item_open = created;
        let data = json!({"type": "response.output_item.added", "output_index": 0,
            "item": {"type": "message", "id": "msg_1"}});
        item_open.saw(ResponsesEvent::from_sse(&event(data)).unwrap().data());
        let mut seam = ResponsesSeam::new(&item_open, &[], 0);
        let item = json!({"type": "response.output_item.added", "item": {"type": "message", "id": "msg_2"}});
        assert!(seam.join(event(item)).is_empty());
        let part = json!({"type": "response.content_part.added", "item_id": "msg_2", "part": {"type": "output_text"}});
        assert_eq!(read(&one(seam.join(event(part))))["item_id"], "msg_1");
        // The part open too: both go on (see the continuation's test).
        let mut seam = ResponsesSeam::new(&outline(""), &[], 0);
        let item = json!({"type": "response.output_item.added", "item": {"type": "message", "id": "msg_2"}});
        let part = json!({"type": "response.content_part.added", "item_id": "msg_2", "part": {"type": "output_text"}});
        assert!(seam.join(event(item)).is_empty() && seam.join(event(part)).is_empty());
    }

    #[test]
    fn the_outline_closes_every_open_part_at_its_own_index_and_type() {
        let mut outline = outline("t0 ");
        for data in [
            json!({"type": "response.output_text.done", "item_id": "msg_1", "output_index": 0,
                "content_index": 0, "text": "t0 "}),
            json!({"type": "response.content_part.done", "item_id": "msg_1", "output_index": 0,
                "content_index": 0, "part": {"type": "output_text", "text": "t0 "}}),
            json!({"type": "response.content_part.added", "item_id": "msg_1", "output_index": 0,
                "content_index": 1, "part": {"type": "refusal", "refusal": ""}}),
            json!({"type": "response.refusal.delta", "item_id": "msg_1", "output_index": 0,
                "content_index": 1, "delta": "no"}),
        ] {
            outline.saw(ResponsesEvent::from_sse(&event(data)).unwrap().data());
        }
        assert_eq!(outline.holding(3), None, "the text part is done");
        let events = outline.close(("r", "m"), "stopped");
        assert_eq!(
            types(&events),
            [
                "response.refusal.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.incomplete"
            ]
        );
        let done = read(&events[0]);
        assert_eq!(
            (&done["content_index"], &done["refusal"]),
            (&json!(1), &json!("no"))
        );
        let content = read(&events[3])["response"]["output"][0]["content"].clone();
        assert_eq!(content[0]["text"], "t0 ");
        assert_eq!(content[1], json!({"type": "refusal", "refusal": "no"}));
    }
}
