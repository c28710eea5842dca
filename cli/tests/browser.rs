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

use client::{HANG, RawResponse, chromium, stats};
use serde_json::Value;
use setup::{proxy_config, serve_proxy, start_proxy, start_sim, stream};
use streamgate::browser::{MAX_POST_RECORDS, RECORDS_PATH, SCRIPT_PATH, TOKEN_HEADER};
use streamgate::timeline::{Blame, Diagnosis, Timeline};
use streamgate_cli::proxy::InjectedStall;
use tokio::time::{Instant, sleep};

/// The path from sim's worker to the user's screen.
const PATH: [&str; 6] = [
    "worker.publish",
    "worker.write",
    "proxy.recv",
    "proxy.write",
    "client.recv",
    "client.render",
];

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
    // With resumes, the proxy claims each id: a client's own id names its stream alone.
    let proxy = start_proxy(
        &format!("http://{sim}"),
        &[
            "--hop-records",
            file.to_str().unwrap(),
            "--resume-grace-ms",
            "1000",
        ],
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
    // A flood, 16 pages at once: the rate every page shares (20,000 records a second, a burst
    // of 40,000) holds.
    let full = std::sync::Arc::new(batch(
        "page-2",
        &their_token,
        "client.recv",
        MAX_POST_RECORDS,
    ));
    let posters: Vec<_> = (0..16)
        .map(|_| {
            let full = full.clone();
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..40 {
                    statuses.push(post(proxy, &full).await);
                }
                statuses
            })
        })
        .collect();
    let mut flood = Vec::new();
    for poster in posters {
        flood.extend(poster.await.unwrap());
    }
    let taken = flood.iter().filter(|&&status| status == 204).count();
    let limited = flood.iter().filter(|&&status| status == 429).count();
    assert_eq!(taken + limited, flood.len(), "{flood:?}");
    assert!(
        limited > 0 && taken >= 40_000 / MAX_POST_RECORDS,
        "{taken} taken, {limited} refused"
    );

    let stats = stats(proxy).await;
    let refused = &stats["browser_refused"];
    assert_eq!(refused["malformed"], 3, "{stats}");
    assert_eq!(refused["bad_token"], 2, "{stats}");
    assert_eq!(refused["too_large"], 1, "{stats}");
    assert_eq!(refused["rate_limited"], limited as u64, "{stats}");
    assert_eq!(stats["browser_batches"], taken as u64 + 2, "{stats}");

    // What reached the sink: the page's two hops of its own stream, and the flood's taken
    // batches, nothing forged.
    let deadline = Instant::now() + HANG;
    let expected = 6 + taken * MAX_POST_RECORDS;
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
async fn without_resumes_only_an_id_the_proxy_made_gets_a_token() {
    let dir = scratch("unclaimed");
    let (sim, _) = start_sim(&["--step-ms", "1"]);
    let file = dir.join("proxy.jsonl");
    let proxy = start_proxy(
        &format!("http://{sim}"),
        &["--hop-records", file.to_str().unwrap()],
    );
    // Nothing claims a client's id here: another client may send the same one.
    let mut chosen = stream(proxy, "x-request-id: victim-1\r\n", 2).await;
    assert_eq!(chosen.header(TOKEN_HEADER), None);
    chosen.rest().await;
    let mut made = stream(proxy, "", 2).await;
    assert!(made.header("x-request-id").unwrap().starts_with("sg-"));
    assert!(made.header(TOKEN_HEADER).is_some());
    made.rest().await;
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

/// sim (a token every 20 ms) behind the proxy (with `stall`, if any), both writing hop records
/// into a scratch directory named `name`; the example page opened through the proxy with
/// `query` in `browser`, until its stream has ended at `client.render`; the diagnosis of every
/// record.
async fn browse(
    browser: &Path,
    name: &str,
    stall: Option<InjectedStall>,
    query: &str,
) -> Diagnosis {
    let dir = scratch(name);
    let (sim_file, proxy_file) = (dir.join("sim.jsonl"), dir.join("proxy.jsonl"));
    let (sim, sim_state) = start_sim(&[
        "--step-ms",
        "20",
        "--hop-records",
        sim_file.to_str().unwrap(),
    ]);
    let mut config = proxy_config(
        &format!("http://{sim}"),
        &["--hop-records", proxy_file.to_str().unwrap()],
    );
    config.stall = stall;
    let (proxy, proxy_state, _) = serve_proxy(config, None);
    let url = format!("http://{proxy}/browser?{query}");
    let page = chromium::open(browser, &url, &dir);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !records(&proxy_file)
        .iter()
        .any(|r| r["hop"] == "client.render" && r["kind"] == "end")
    {
        assert!(
            Instant::now() < deadline,
            "the page's stream never ended at client.render"
        );
        sleep(Duration::from_millis(50)).await;
    }
    drop(page);
    for sink in [&sim_state.records, &proxy_state.records] {
        sink.as_ref().unwrap().sync();
    }
    let mut timeline = Timeline::new(PATH, Duration::from_secs(1));
    for file in [&sim_file, &proxy_file] {
        let name = file.display().to_string();
        timeline
            .read(&name, std::fs::File::open(file).unwrap())
            .unwrap();
    }
    timeline.diagnose()
}

/// The stalls that began somewhere, as (hop, after, seq).
fn began(diagnosis: &Diagnosis) -> Vec<(&str, Option<u64>, Option<u64>)> {
    diagnosis
        .stalls
        .iter()
        .filter(|stall| stall.blame == Blame::Began)
        .map(|stall| (stall.hop.as_str(), stall.after, stall.seq))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_whose_handler_blocks_for_2_s_is_diagnosed_at_client_render() {
    let Some(browser) = chromium::installed("the page's render stall in Chromium") else {
        return;
    };
    // Event 50's handler holds the main thread for 2 s; every server hop stays regular.
    let query = "max_tokens=100&block_at=50&block_ms=2000";
    let diagnosis = browse(&browser, "render", None, query).await;
    let report = format!("{diagnosis:#?}");
    assert_eq!(
        began(&diagnosis),
        [("client.render", Some(49), Some(50))],
        "{report}"
    );
    let stall = diagnosis
        .stalls
        .iter()
        .find(|s| s.blame == Blame::Began)
        .unwrap();
    assert!(stall.gap >= Duration::from_millis(1900), "{report}");
    let busy = stall.busy.expect("the long frame the browser reported");
    assert!(
        busy >= Duration::from_millis(1900) && busy <= stall.gap + Duration::from_millis(100),
        "{report}"
    );
    // Receipt froze too (the page parses on the same thread), behind the render: pushed back.
    let recv = &diagnosis.hops[4];
    assert_eq!((recv.began, recv.pushed_back), (0, 1), "{report}");
    assert!(
        diagnosis
            .problems
            .examples
            .iter()
            .all(|p| p.message.contains("not on the path")),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_at_the_proxy_is_diagnosed_at_the_proxy_not_the_page() {
    let Some(browser) = chromium::installed("a proxy stall seen from Chromium") else {
        return;
    };
    let stall = InjectedStall {
        at: 50,
        duration: Duration::from_secs(2),
    };
    let diagnosis = browse(&browser, "proxy-stall", Some(stall), "max_tokens=100").await;
    let report = format!("{diagnosis:#?}");
    let began = began(&diagnosis);
    assert_eq!(began.len(), 1, "{report}");
    // The proxy waits before it reads the event it stalls at: it began where the proxy reads.
    assert_eq!(began[0].0, "proxy.recv", "{report}");
    // The page saw the freeze, passed on from the proxy.
    for hop in &diagnosis.hops[4..] {
        assert_eq!((hop.began, hop.passed_on), (0, 1), "{}: {report}", hop.hop);
    }
}
