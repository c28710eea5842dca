//! Send, Sync and Unpin of every public type, asserted so a change cannot silently lose them.

use streamgate::{
    CancelError, Consumer, EndReason, Event, Gate, GateError, GateHandle, GateStats, Kind, Policy,
    SendError, Sender,
};

fn send<T: Send>() {}
fn sync<T: Sync>() {}
fn unpin<T: Unpin>() {}

/// A chunk type that is `Send` but not `Sync`.
struct NotSync(std::cell::Cell<u8>);

impl streamgate::Chunk for NotSync {
    fn byte_len(&self) -> usize {
        1
    }
}

#[test]
fn public_types_are_send_sync_unpin() {
    send::<Consumer<String>>();
    sync::<Consumer<String>>();
    unpin::<Consumer<String>>();
    // A `Send` chunk is enough for both halves to cross threads; the consumer holds its batch
    // of chunks itself, so it is `Sync` when they are.
    send::<Consumer<NotSync>>();
    unpin::<Consumer<NotSync>>();
    send::<Sender<NotSync>>();
    sync::<Sender<NotSync>>();
    unpin::<Sender<String>>();

    send::<GateHandle>();
    sync::<GateHandle>();
    unpin::<GateHandle>();
    send::<GateError>();
    sync::<GateError>();
    send::<CancelError>();
    sync::<CancelError>();
    send::<Gate>();
    unpin::<Gate>();
    send::<Event<String>>();
    sync::<Event<String>>();
    send::<SendError<String>>();
    send::<GateStats>();
    sync::<GateStats>();
    send::<EndReason>();
    send::<Policy>();
    send::<Kind>();
    let _ = NotSync(std::cell::Cell::new(0)).0;
}

#[test]
fn resumable_streams_cross_threads() {
    use streamgate::resume::{
        AttachError, Claim, ClaimError, RegisterError, Registry, RegistryStats, ResumeOptions,
        StoreError, Subscriber,
    };
    send::<Registry<String>>();
    sync::<Registry<String>>();
    unpin::<Registry<String>>();
    send::<Subscriber>();
    sync::<Subscriber>();
    unpin::<Subscriber>();
    send::<Claim>();
    sync::<Claim>();
    send::<AttachError>();
    sync::<AttachError>();
    send::<ClaimError>();
    send::<RegisterError>();
    send::<StoreError>();
    sync::<StoreError>();
    send::<ResumeOptions>();
    send::<RegistryStats>();
}

#[cfg(feature = "openai")]
#[test]
fn openai_chunks_cross_threads() {
    use streamgate::openai::{ChatCompletionChunk, ChatEvent, ParseError};
    send::<ChatCompletionChunk>();
    sync::<ChatCompletionChunk>();
    send::<ChatEvent>();
    sync::<ChatEvent>();
    send::<ParseError>();
    sync::<ParseError>();
}

#[cfg(feature = "anthropic")]
#[test]
fn anthropic_events_cross_threads() {
    use streamgate::anthropic::{MessagesData, MessagesEvent, ParseError, UnknownEvent};
    send::<MessagesEvent>();
    sync::<MessagesEvent>();
    send::<MessagesData>();
    sync::<MessagesData>();
    send::<UnknownEvent>();
    sync::<UnknownEvent>();
    send::<ParseError>();
    sync::<ParseError>();
}

#[cfg(feature = "responses")]
#[test]
fn responses_events_cross_threads() {
    use streamgate::responses::{ResponsesData, ResponsesEvent};
    send::<ResponsesEvent>();
    sync::<ResponsesEvent>();
    send::<ResponsesData>();
    sync::<ResponsesData>();
}

#[test]
fn probes_cross_threads() {
    use streamgate::probe::{
        HopProbe, HopRecord, HopSnapshot, RecordSink, Recorder, StreamSummary,
    };
    send::<HopProbe>();
    sync::<HopProbe>();
    // A recorder lives in one task (a decode loop, a response body) that may move threads.
    send::<Recorder>();
    unpin::<Recorder>();
    send::<RecordSink>();
    sync::<RecordSink>();
    send::<HopSnapshot>();
    send::<StreamSummary>();
    send::<HopRecord>();
}

#[cfg(feature = "timeline")]
#[test]
fn the_timeline_crosses_threads() {
    use streamgate::timeline::{Diagnosis, Timeline};
    send::<Timeline>();
    sync::<Timeline>();
    send::<Diagnosis>();
    sync::<Diagnosis>();
}
