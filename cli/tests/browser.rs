//! The page as a hop: the proxy (and sim) give each probed stream a token, take a page's
//! records only with it, and write them beside their own; in real headless Chromium, a page
//! whose handler blocks the main thread for 2 s is diagnosed at `client.render`, and a stall at
//! the proxy is diagnosed at the proxy, not the page.

mod common;
#[path = "common/proxy_setup.rs"]
mod setup;

use std::path::{Path, PathBuf};
use std::time::Duration;

// `setup` names the raw client `crate::client`.
use common as client;

use client::{HANG, RawResponse, stats};
use serde_json::Value;
use setup::{proxy_config, serve_proxy, start_proxy, start_sim, stream};
use streamgate::browser::{MAX_POST_RECORDS, RECORDS_PATH, SCRIPT_PATH, TOKEN_HEADER};
use streamgate::timeline::{Blame, Timeline};
use streamgate_cli::proxy::InjectedStall;
use tokio::time::{Instant, sleep};

/// A fresh directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("streamgate-browser-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A batch of `n` page records of `request`, with `token`, at `hop`.
fn batch(request: &str, token: &str, hop: &str, n: usize) -> String {
    let records: Vec<String> = (0..n)
        .map(|seq| {
            format!(
                r#"{{"hop":"{hop}","seq":{seq},"t_ns":{},"bytes":3,"kind":"visible"}}"#,
                seq * 1000
            )
        })
        .collect();
    format!(
        r#"{{"request":"{request}","token":"{token}","records":[{}]}}"#,
        records.join(",")
    )
}

async fn post(addr: std::net::SocketAddr, body: &str) -> u16 {
    RawResponse::post(addr, RECORDS_PATH, "", body)
        .await
        .status()
}

/// The records of `file` as JSON.
fn records(file: &Path) -> Vec<Value> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON hop record"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_writes_records_only_for_its_own_stream_with_its_token() {
    let dir = scratch("intake");
    let (sim, _) = start_sim(&["--step-ms", "1"]);
    let file = dir.join("proxy.jsonl");
    let proxy = start_proxy(
        &format!("http://{sim}"),
        &["--hop-records", file.to_str().unwrap()],
    );
    let script = RawResponse::get(proxy, SCRIPT_PATH, "").await;
    assert_eq!(script.status(), 200);
    assert!(
        script
            .header("content-type")
            .unwrap()
            .starts_with("text/javascript")
    );

    let mut mine = stream(proxy, "x-request-id: page-1\r\n", 3).await;
    let token = mine.header(TOKEN_HEADER).expect("a probed stream's token");
    assert!(
        mine.header("access-control-expose-headers")
            .unwrap()
            .contains(TOKEN_HEADER)
    );
    mine.rest().await;
    let mut theirs = stream(proxy, "x-request-id: page-2\r\n", 3).await;
    let their_token = theirs.header(TOKEN_HEADER).unwrap();
    assert_ne!(their_token, token);
    theirs.rest().await;

    assert_eq!(
        post(proxy, &batch("page-1", &token, "client.recv", 3)).await,
        204
    );
    assert_eq!(
        post(proxy, &batch("page-1", &token, "client.render", 3)).await,
        204
    );
    // Forged: no token, a made-up one, this page's token for another user's request, a hop
    // that is not the page's, too large.
    let no_token = r#"{"request":"page-1","records":[]}"#;
    assert_eq!(post(proxy, no_token).await, 400);
    assert_eq!(
        post(proxy, &batch("page-1", "0.0123", "client.recv", 1)).await,
        403
    );
    assert_eq!(
        post(proxy, &batch("page-2", &token, "client.recv", 1)).await,
        403
    );
    let other_hop = format!(
        r#"{{"request":"page-1","token":"{token}","records":[{{"hop":"proxy.write","seq":999999,"t_ns":1,"bytes":3,"kind":"visible"}}]}}"#
    );
    assert_eq!(post(proxy, &other_hop).await, 400);
    let oversized = format!(
        r#"{{"request":"page-1","token":"{token}","records":[],"pad":"{}"}}"#,
        "x".repeat(70 * 1024)
    );
    assert_eq!(post(proxy, &oversized).await, 413);
    let too_many = batch("page-1", &token, "client.recv", MAX_POST_RECORDS + 1);
    assert_eq!(post(proxy, &too_many).await, 400);
    // A flood: the rate every page shares (20,000 records a second, a burst of 40,000) holds.
    let full = batch("page-2", &their_token, "client.recv", MAX_POST_RECORDS);
    let mut flood = Vec::new();
    for _ in 0..400 {
        let status = post(proxy, &full).await;
        flood.push(status);
        if status == 429 {
            break;
        }
    }
    assert_eq!(
        flood.last(),
        Some(&429),
        "{} batches all taken",
        flood.len()
    );
    assert!(flood.iter().all(|&status| status == 204 || status == 429));

    let stats = stats(proxy).await;
    let refused = &stats["browser_refused"];
    assert_eq!(refused["malformed"], 3, "{stats}");
    assert_eq!(refused["bad_token"], 2, "{stats}");
    assert_eq!(refused["too_large"], 1, "{stats}");
    assert_eq!(refused["rate_limited"], 1, "{stats}");
    assert_eq!(stats["browser_batches"], flood.len() as u64 + 1, "{stats}");

    // What reached the sink: the page's two hops of its own stream, and the flood's taken
    // batches, nothing forged.
    let deadline = Instant::now() + HANG;
    let expected = 6 + (flood.len() - 1) * MAX_POST_RECORDS;
    let written = loop {
        let page: Vec<Value> = records(&file)
            .into_iter()
            .filter(|r| r["hop"].as_str().unwrap().starts_with("client."))
            .collect();
        if page.len() >= expected || Instant::now() > deadline {
            break page;
        }
        sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(written.len(), expected);
    let mine: Vec<&Value> = written
        .iter()
        .filter(|r| r["request"] == "page-1")
        .collect();
    assert_eq!(mine.len(), 6);
    assert!(mine.iter().all(|r| r["kind"] == "visible"));
    assert!(
        records(&file).iter().all(|r| r["seq"] != 999_999),
        "no forged proxy.write record"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_hop_records_the_page_is_told_there_is_nowhere_to_write() {
    let (sim, _) = start_sim(&["--step-ms", "1"]);
    let proxy = start_proxy(&format!("http://{sim}"), &[]);
    let mut response = stream(proxy, "", 2).await;
    assert_eq!(
        response.header(TOKEN_HEADER),
        None,
        "no token without a sink"
    );
    response.rest().await;
    assert_eq!(RawResponse::get(proxy, SCRIPT_PATH, "").await.status(), 200);
    let mut refused = RawResponse::post(proxy, RECORDS_PATH, "", "{}").await;
    assert_eq!(refused.status(), 404);
    assert!(refused.text().await.contains("--hop-records"));
}
