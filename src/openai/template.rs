//! A stream's chunks written straight into a buffer, without an owned chunk per token.

use std::fmt;
use std::io;

use serde::{Serialize, Serializer};

/// The part every chunk of one stream repeats (`id`, `created`, `model`), borrowed: writes the
/// stream's chunks straight into a buffer, as a server that makes a chunk per token wants.
///
/// A chunk written here is byte for byte the encoding of the [`ChatCompletionChunk`] with the
/// same fields ([`to_json`](super::ChatCompletionChunk::to_json)); only no chunk is built, and the
/// content may be any [`Display`](fmt::Display), escaped as it is written (a run of tokens
/// need not be collected into a string first). Writing into a `Vec` with room for the chunk
/// allocates nothing.
///
/// [`ChatCompletionChunk`]: super::ChatCompletionChunk
///
/// # Examples
///
/// ```
/// use streamgate::openai::{ChatCompletionChunk, ChunkChoice, ChunkTemplate, Delta};
///
/// let stream = ChunkTemplate::new("chatcmpl-1", 1_700_000_000, "my-model");
/// let mut json = Vec::with_capacity(256);
/// stream.write_content(&mut json, Some("assistant"), "Hello")?;
/// assert_eq!(
///     String::from_utf8(json).unwrap(),
///     r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"my-model","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"logprobs":null,"finish_reason":null}]}"#
/// );
///
/// // The same bytes as the owned chunk's.
/// let mut json = Vec::new();
/// stream.write_finish(&mut json, "stop")?;
/// let finish = ChunkChoice {
///     finish_reason: Some("stop".to_owned()),
///     ..ChunkChoice::new(0, Delta::default())
/// };
/// let owned = ChatCompletionChunk::new("chatcmpl-1", 1_700_000_000, "my-model").with_choice(finish);
/// assert_eq!(json, owned.to_json().into_bytes());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkTemplate<'a> {
    id: &'a str,
    created: u64,
    model: &'a str,
}

impl<'a> ChunkTemplate<'a> {
    /// The chunks of completion `id`, created at `created` (Unix time, seconds) by `model`.
    pub fn new(id: &'a str, created: u64, model: &'a str) -> Self {
        ChunkTemplate { id, created, model }
    }

    /// Writes the chunk whose choice 0 adds `content` to the message (with the author `role`,
    /// `assistant`, in a stream's first chunk), not finished.
    ///
    /// # Errors
    ///
    /// If `out` fails, or `content`'s `Display` does.
    pub fn write_content<W, T>(&self, out: W, role: Option<&str>, content: &T) -> io::Result<()>
    where
        W: io::Write,
        T: fmt::Display + ?Sized,
    {
        let delta = DeltaRef {
            role,
            content: Some(Text(content)),
        };
        self.write(out, delta, None)
    }

    /// Writes the chunk that finishes choice 0 for `finish_reason` (`stop`, `length`, ...): an
    /// empty delta.
    ///
    /// # Errors
    ///
    /// If `out` fails.
    pub fn write_finish<W: io::Write>(&self, out: W, finish_reason: &str) -> io::Result<()> {
        let delta = DeltaRef::<str> {
            role: None,
            content: None,
        };
        self.write(out, delta, Some(finish_reason))
    }

    fn write<W, T>(
        &self,
        out: W,
        delta: DeltaRef<'_, T>,
        finish_reason: Option<&str>,
    ) -> io::Result<()>
    where
        W: io::Write,
        T: fmt::Display + ?Sized,
    {
        let chunk = ChunkRef {
            id: self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model,
            choices: [ChoiceRef {
                index: 0,
                delta,
                logprobs: (),
                finish_reason,
            }],
        };
        serde_json::to_writer(out, &chunk).map_err(io::Error::from)
    }
}

// The borrowed mirrors of `ChatCompletionChunk`, `ChunkChoice` and `Delta`: the same fields in
// the same order, with the same rules for what is left out (tests/openai.rs compares the bytes).

#[derive(Serialize)]
#[serde(bound(serialize = "T: fmt::Display"))]
struct ChunkRef<'a, T: ?Sized> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [ChoiceRef<'a, T>; 1],
}

#[derive(Serialize)]
#[serde(bound(serialize = "T: fmt::Display"))]
struct ChoiceRef<'a, T: ?Sized> {
    index: u32,
    delta: DeltaRef<'a, T>,
    /// Always encoded, as `null` (`()` encodes so).
    logprobs: (),
    finish_reason: Option<&'a str>,
}

#[derive(Serialize)]
#[serde(bound(serialize = "T: fmt::Display"))]
struct DeltaRef<'a, T: ?Sized> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<Text<'a, T>>,
}

/// Text written as a JSON string as it is displayed, never collected.
struct Text<'a, T: ?Sized>(&'a T);

impl<T: fmt::Display + ?Sized> Serialize for Text<'_, T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self.0)
    }
}
