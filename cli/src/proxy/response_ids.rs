//! The upstreams' own ids of the Responses streams this instance registered: a client resumes
//! a response by the `id` its `response.created` named (`GET /v1/responses/{id}?stream=true`,
//! as the `openai` SDK does), which is the upstream's (llama.cpp's `resp_...`), not the
//! request id the registry knows the stream by.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// The most ids kept: the oldest go first (a stream older than the last 65,536 Responses
/// streams resumes by its request id only).
const KEPT: usize = 65_536;

/// Upstream response ids, each with the request id of its stream, in the order they came.
#[derive(Debug, Default)]
pub(super) struct ResponseIds {
    ids: Mutex<(HashMap<String, String>, VecDeque<String>)>,
}

impl ResponseIds {
    /// The stream `stream` answers as the response `response`.
    pub(super) fn remember(&self, response: &str, stream: &str) {
        if response == stream {
            return;
        }
        let mut ids = self
            .ids
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (by_response, order) = &mut *ids;
        if by_response
            .insert(response.to_owned(), stream.to_owned())
            .is_none()
        {
            order.push_back(response.to_owned());
        }
        while order.len() > KEPT {
            if let Some(oldest) = order.pop_front() {
                by_response.remove(&oldest);
            }
        }
    }

    /// The request id of the stream that answers as the response `id`, if one here does.
    pub(super) fn stream_of(&self, id: &str) -> Option<String> {
        let ids = self
            .ids
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        ids.0.get(id).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_names_its_stream_until_many_newer_ones_came() {
        let ids = ResponseIds::default();
        ids.remember("resp_1", "req-1");
        ids.remember("req-2", "req-2");
        assert_eq!(ids.stream_of("resp_1").as_deref(), Some("req-1"));
        assert_eq!(
            ids.stream_of("req-2"),
            None,
            "a request id is known as it is"
        );
        for n in 0..KEPT {
            ids.remember(&format!("resp_x{n}"), "req-x");
        }
        assert_eq!(ids.stream_of("resp_1"), None, "the oldest went");
        assert_eq!(ids.stream_of("resp_x0").as_deref(), Some("req-x"));
    }
}
