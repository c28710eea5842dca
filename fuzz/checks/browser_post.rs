//! The properties the `browser_post` fuzz target checks, shared with `tests/fuzz_corpus.rs`:
//! a page's batch of records (`POST /streamgate/hop-records`) as `BrowserProbe::take` reads it.

// Each includer (a fuzz target, a test file) uses a part.
#![allow(dead_code)]

use std::sync::OnceLock;

use streamgate::browser::{BrowserProbe, MAX_POST_BYTES, MAX_POST_RECORDS, Refusal};
use streamgate::probe::RecordSink;

/// One probe for every input (a sink is a thread), with no rate to meet.
fn probe() -> &'static BrowserProbe {
    static PROBE: OnceLock<BrowserProbe> = OnceLock::new();
    PROBE.get_or_init(|| {
        let sink = RecordSink::to_writer(std::io::sink(), 1 << 16).expect("a writer thread");
        BrowserProbe::with_rate(sink, 1.0, u32::MAX)
    })
}

/// What taking `data` did, as written (with its own token: never one of this process's), and
/// with the token of its `request` put in (when it names one): each outcome's name.
pub fn check(data: &[u8]) -> (&'static str, Option<&'static str>) {
    let probe = probe();
    let own = probe.take(data);
    // A token of this process cannot be guessed: no batch is taken with its own.
    let own = match own {
        Ok(n) => panic!("taken with a made-up token: {n} records"),
        Err(refused) => refused.refusal,
    };
    assert_ne!(own, Refusal::RateLimited);
    if data.len() > MAX_POST_BYTES {
        assert_eq!(own, Refusal::TooLarge);
    }
    let tokened = with_token(probe, data).map(|body| match probe.take(&body) {
        Ok(n) => {
            // Taken: every record, within the batch limit, and the body parses with them.
            let value: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
            assert_eq!(value["records"].as_array().map(Vec::len), Some(n));
            assert!(n <= MAX_POST_RECORDS);
            assert!(body.len() <= MAX_POST_BYTES);
            // Its own token was refused for the token, not the body; or the body was too
            // large as written, and the same JSON written again (without its spaces or
            // repeated keys) is not.
            assert!(
                matches!(
                    own,
                    Refusal::BadToken | Refusal::Expired | Refusal::Malformed
                ) || (own == Refusal::TooLarge && data.len() > MAX_POST_BYTES),
                "{own:?}"
            );
            "taken"
        }
        Err(refused) => {
            // With the right token, only the body is refused.
            assert!(
                matches!(refused.refusal, Refusal::Malformed | Refusal::TooLarge),
                "{refused}"
            );
            name(refused.refusal)
        }
    });
    (name(own), tokened)
}

/// `data` with this process's token for its `request`, when it is a JSON object naming one.
fn with_token(probe: &BrowserProbe, data: &[u8]) -> Option<Vec<u8>> {
    let mut value: serde_json::Value = serde_json::from_slice(data).ok()?;
    let request = value.get("request")?.as_str()?.to_owned();
    let token = probe.token(&request)?;
    value.as_object_mut()?.insert("token".into(), token.into());
    serde_json::to_vec(&value).ok()
}

fn name(refusal: Refusal) -> &'static str {
    refusal.as_str()
}

/// What `data` reaches: its outcome as written and with a token, and why it was malformed.
pub fn reach(data: &[u8]) -> Vec<String> {
    let (own, tokened) = check(data);
    let mut reached = vec![format!("own {own}")];
    if let Some(tokened) = tokened {
        reached.push(format!("tokened {tokened}"));
    }
    if let Some(body) = with_token(probe(), data) {
        if let Err(refused) = probe().take(&body) {
            for (needle, label) in [
                ("hop `", "another hop"),
                ("unknown kind", "unknown kind"),
                ("needs `reason`", "end without reason"),
                ("unknown end reason", "unknown end reason"),
                ("only to end records", "reason on an event"),
                ("only to client.render", "busy at recv"),
                ("request id of", "request id length"),
                ("records (at most", "too many records"),
            ] {
                if refused.detail.contains(needle) {
                    reached.push(label.to_owned());
                }
            }
        }
    }
    reached
}
