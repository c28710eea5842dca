//! What a stream is about: its format, its answer's id, model and creation time, its name, and
//! whether it continues an assistant message.

use streamgate::openai::ChunkTemplate;

use super::format::Format;

/// What a stream is about: shared by all its chunks, so each chunk can encode itself.
#[derive(Debug)]
pub struct Meta {
    /// The API it is streamed in.
    pub format: Format,
    /// The answer's id (the chunks' `id`, the message's; of a Responses stream, its message
    /// item's, the response's being the stream's name): `chatcmpl-`, `msg_` or `resp_` and 32
    /// hex digits.
    pub id: String,
    pub model: String,
    pub created: u64,
    /// The request id: the stream's name in the registry, the response's `x-request-id`, the
    /// resume and cancel paths' id and every hop record's `request`.
    pub stream: String,
    /// Whether the stream continues an assistant message: its first chunk names no author.
    pub continued: bool,
}

impl Meta {
    /// What every chunk of this stream repeats.
    pub(super) fn template(&self) -> ChunkTemplate<'_> {
        ChunkTemplate::new(&self.id, self.created, &self.model)
    }

    /// The bytes every event of this stream carries besides its text: the metadata and the
    /// JSON around it (more in a Responses event, which places its text by item and part and
    /// numbers itself).
    pub(super) fn chunk_overhead(&self) -> usize {
        let envelope = match self.format {
            Format::Chat | Format::Messages => 128,
            Format::Responses => 192,
        };
        envelope + self.id.len() + self.model.len()
    }
}
