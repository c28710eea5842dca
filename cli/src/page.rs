//! The page's hops in `sim` and the proxy: the probe script and the intake of its records
//! (routes), the probe's counters in `/stats`, and the example page.

use axum::Router;
use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Map, Value, json};
use streamgate::browser::{BrowserProbe, RECORDS_PATH, Refusal, SCRIPT_PATH, script};

/// The example page (`examples/browser/index.html`): a chat completion streamed in the OpenAI
/// JS style through the probe.
pub const EXAMPLE_PAGE: &str = include_str!("../../examples/browser/index.html");

/// Where `sim` serves [`EXAMPLE_PAGE`] (the proxy passes it through).
pub const EXAMPLE_PATH: &str = "/browser";

/// The probe's routes: with `probe`, its script and its intake; without (no `--hop-records`),
/// the script, and `404` for records, which would have nowhere to go.
pub fn routes<S: Clone + Send + Sync + 'static>(probe: Option<&BrowserProbe>) -> Router<S> {
    match probe {
        Some(probe) => probe.router(),
        None => Router::new()
            .route(SCRIPT_PATH, get(script))
            .route(RECORDS_PATH, post(no_records)),
    }
}

async fn no_records() -> Response {
    (
        StatusCode::NOT_FOUND,
        "this server writes no hop records (--hop-records)",
    )
        .into_response()
}

/// `GET /browser`: the example page.
pub async fn example() -> Html<&'static str> {
    Html(EXAMPLE_PAGE)
}

/// The probe's counters as `/stats` fields: `browser_tokens`, `browser_batches`,
/// `browser_records` and `browser_refused` (by reason), all 0 without a probe.
pub fn stats_fields(probe: Option<&BrowserProbe>, fields: &mut Map<String, Value>) {
    let stats = probe.map(BrowserProbe::stats).unwrap_or_default();
    fields.insert("browser_tokens".into(), json!(stats.tokens));
    fields.insert("browser_batches".into(), json!(stats.batches));
    fields.insert("browser_records".into(), json!(stats.records));
    let refused: Map<String, Value> = Refusal::ALL
        .iter()
        .map(|&refusal| (refusal.as_str().to_owned(), json!(stats.refused(refusal))))
        .collect();
    fields.insert("browser_refused".into(), Value::Object(refused));
}
