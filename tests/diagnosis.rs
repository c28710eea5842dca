//! Diagnosis end to end with the crate's own hops: a worker, a gateway and a client over real
//! sockets on 127.0.0.1, every hop probed and writing hop records, then the timeline.
//!
//! worker.publish (the generator hands an event to its gate) -> worker.write (the worker's SSE
//! frames) -> gateway.recv (decoded upstream events) -> gateway.write (the gateway's frames) ->
//! client.recv (decoded at the client).

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyDataStream, Full};
use hyper_util::rt::TokioIo;
use streamgate::EndReason;
use streamgate::probe::{HopProbe, Observation, RecordSink};
use streamgate::sse::SseEvent;
use streamgate::timeline::{Blame, Diagnosis, Timeline};
use streamgate::transport::{ListenOptions, SseResponse, TunedListener};
use streamgate::{Chunk, Gate, GateExt, Kind, Policy};

const PATH: [&str; 5] = [
    "worker.publish",
    "worker.write",
    "gateway.recv",
    "gateway.write",
    "client.recv",
];
const PUBLISH: usize = 0;
const WRITE: usize = 1;
const RECV: usize = 2;
const GATEWAY_WRITE: usize = 3;
const CLIENT: usize = 4;
const STALL: Duration = Duration::from_millis(600);

/// A writer the test reads back: every hop's records, in one place.
#[derive(Clone, Default)]
struct Records(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Records {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What the worker generates: (pause before it, kind) per event, and each event's size.
struct Script {
    steps: Vec<(Duration, Kind)>,
    bytes: usize,
    then: Then,
}

/// What the generator does after its steps.
#[derive(Clone, Copy, PartialEq)]
enum Then {
    Completes,
    Fails,
    /// Freezes for good (until the stream is dropped).
    Hangs,
}

/// How the gateway forwards.
#[derive(Clone, Copy, Default)]
struct Forwarding {
    /// Sleep this long before reading upstream event `n` (an injected freeze).
    freeze: Option<(usize, Duration)>,
    /// Pass hidden events on (a gateway that filters reasoning does not).
    drop_hidden: bool,
}

struct Hops {
    records: Records,
    sink: RecordSink,
    probes: [HopProbe; 5],
}

impl Hops {
    fn new() -> Arc<Hops> {
        let records = Records::default();
        let sink = RecordSink::to_writer(records.clone(), 1 << 16).unwrap();
        let probes = PATH.map(|hop| {
            HopProbe::new(hop)
                .stall_threshold(STALL)
                .records(sink.clone(), 1.0)
        });
        Arc::new(Hops {
            records,
            sink,
            probes,
        })
    }

    /// Every record written so far, as the timeline reads them.
    fn diagnose(&self) -> Diagnosis {
        self.sink.sync();
        let text = String::from_utf8(self.records.0.lock().unwrap().clone()).unwrap();
        self.diagnose_lines(&text)
    }

    fn diagnose_lines(&self, text: &str) -> Diagnosis {
        let mut timeline = Timeline::new(PATH, STALL);
        timeline.add_lines("records", text);
        timeline.diagnose()
    }

    fn lines(&self) -> String {
        self.sink.sync();
        String::from_utf8(self.records.0.lock().unwrap().clone()).unwrap()
    }

    /// Waits until hop `hop` has seen `streams` streams end (a hang detector).
    async fn until_ended(&self, hop: usize, streams: u64) {
        let deadline = tokio::time::Instant::now() + common::HANG;
        loop {
            let snapshot = self.probes[hop].snapshot();
            let ended = snapshot.streams_ended.total();
            if ended >= streams {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "{snapshot:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until every hop has ended `streams` streams.
    async fn until_all_ended(&self, streams: u64) {
        for hop in 0..PATH.len() {
            self.until_ended(hop, streams).await;
        }
    }
}

async fn serve(app: Router) -> SocketAddr {
    let listener =
        TunedListener::bind(([127, 0, 0, 1], 0).into(), ListenOptions::default()).expect("bind");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// The worker: generates the script as SSE text events with ids, probed at `worker.publish`
/// (by hand, as a decode loop would) and `worker.write` (its frames). Its gate coalesces text
/// events under a slow reader.
async fn worker(hops: Arc<Hops>, script: Script) -> SocketAddr {
    let app = Router::new()
        .route("/stream", post(worker_stream))
        .with_state((hops, Arc::new(script)));
    serve(app).await
}

async fn worker_stream(
    State((hops, script)): State<(Arc<Hops>, Arc<Script>)>,
    request: axum::http::HeaderMap,
) -> Response {
    let id = request_id(&request);
    let mut publish = hops.probes[PUBLISH].recorder(id.as_str());
    let policy = Policy::coalesce().max_pause(Some(Duration::from_secs(30)));
    let events = Gate::new()
        .max_events(4)
        .policy(policy)
        .spawn(move |_, mut tx| async move {
            for (n, (pause, kind)) in script.steps.iter().enumerate() {
                tokio::time::sleep(*pause).await;
                let text = format!("{n:<width$}", width = script.bytes);
                let event = match kind {
                    Kind::Hidden => SseEvent::text(text).hidden(),
                    _ => SseEvent::text(text),
                };
                tx.send(event).await?;
                publish.observe(Observation::new(Some(n as u64), script.bytes as u64, *kind));
            }
            match script.then {
                Then::Completes => publish.end(EndReason::Completed),
                Then::Fails => {
                    publish.end(EndReason::GeneratorError);
                    return Err("the decode loop failed".into());
                }
                Then::Hangs => std::future::pending().await,
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        });
    let frames = events.sse().probe(&hops.probes[WRITE], id);
    SseResponse::new(frames).into_response()
}

fn request_id(headers: &axum::http::HeaderMap) -> String {
    headers
        .get("x-request-id")
        .and_then(|value| value.to_str().ok())
        .unwrap_or("none")
        .to_owned()
}

/// A streaming POST to `addr`: the response body as byte chunks (the connection lives as long
/// as the stream).
async fn post_stream(
    addr: SocketAddr,
    request: &str,
) -> impl futures_util::Stream<Item = Result<Bytes, hyper::Error>> + Send + 'static {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = hyper::Request::post("/stream")
        .header("host", addr.to_string())
        .header("x-request-id", request)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert!(response.status().is_success());
    BodyDataStream::new(response.into_body())
}

/// The gateway: decodes the worker's stream (`gateway.recv`), gates it and encodes it again
/// (`gateway.write`).
async fn gateway(hops: Arc<Hops>, upstream: SocketAddr, forwarding: Forwarding) -> SocketAddr {
    let app = Router::new()
        .route("/stream", post(gateway_stream))
        .with_state((hops, upstream, forwarding));
    serve(app).await
}

async fn gateway_stream(
    State((hops, upstream, forwarding)): State<(Arc<Hops>, SocketAddr, Forwarding)>,
    request: axum::http::HeaderMap,
) -> Response {
    let id = request_id(&request);
    let events = post_stream(upstream, &id)
        .await
        .sse_events()
        .probe(&hops.probes[RECV], id.as_str());
    let gated = Gate::new()
        .max_events(4)
        .spawn(move |_, mut tx| async move {
            let mut events = std::pin::pin!(events);
            for n in 0.. {
                if let Some((at, pause)) = forwarding.freeze {
                    if at == n {
                        tokio::time::sleep(pause).await;
                    }
                }
                let Some(event) = events.next().await else {
                    break;
                };
                let event = event?;
                if forwarding.drop_hidden && event.kind() == Kind::Hidden {
                    continue;
                }
                if tx.send(event).await.is_err() {
                    break;
                }
            }
            Ok::<(), streamgate::sse::DecodeError>(())
        });
    let frames = gated.sse().probe(&hops.probes[GATEWAY_WRITE], id);
    SseResponse::new(frames).into_response()
}

/// How the client reads.
#[derive(Clone, Copy)]
enum Client {
    /// Reads everything.
    ReadsAll,
    /// Reads `n` events, then leaves after waiting `patience` for the next one.
    LeavesAfterWaiting(usize, Duration),
    /// Reads `n` events, pauses `pause`, then reads the rest.
    Pauses(usize, Duration),
}

/// Streams request `id` through `addr` as `client` reads, probed at `client.recv`; returns the
/// visible events read.
async fn client(hops: &Hops, addr: SocketAddr, id: &str, client: Client) -> usize {
    let mut events = std::pin::pin!(
        post_stream(addr, id)
            .await
            .sse_events()
            .probe(&hops.probes[CLIENT], id)
    );
    let mut read = 0;
    loop {
        let next = match client {
            Client::LeavesAfterWaiting(n, patience) if read == n => {
                match tokio::time::timeout(patience, events.next()).await {
                    Ok(next) => next,
                    Err(_) => return read, // the user leaves: the body is dropped
                }
            }
            _ => events.next().await,
        };
        let Some(event) = next else { return read };
        if event.is_ok_and(|event| event.kind() == Kind::Visible) {
            read += 1;
        }
        if let Client::Pauses(n, pause) = client {
            if read == n {
                tokio::time::sleep(pause).await;
            }
        }
    }
}

fn quick(n: usize) -> Vec<(Duration, Kind)> {
    vec![(Duration::from_millis(2), Kind::Visible); n]
}

fn script(steps: Vec<(Duration, Kind)>) -> Script {
    Script {
        steps,
        bytes: 8,
        then: Then::Completes,
    }
}

/// The stalls that began somewhere (not the unknown ones).
fn began(diagnosis: &Diagnosis) -> Vec<(&str, Option<u64>)> {
    diagnosis
        .stalls
        .iter()
        .filter(|stall| stall.blame == Blame::Began)
        .map(|stall| (stall.hop.as_str(), stall.seq))
        .collect()
}

#[tokio::test]
async fn a_freeze_that_ends_with_the_client_leaving_is_named_where_it_began() {
    let hops = Hops::new();
    let upstream = worker(hops.clone(), script(quick(12))).await;
    // The gateway freezes before reading upstream event 5; the user gives up after 1.5 s.
    let forwarding = Forwarding {
        freeze: Some((5, Duration::from_secs(3))),
        ..Forwarding::default()
    };
    let addr = gateway(hops.clone(), upstream, forwarding).await;
    let read = client(
        &hops,
        addr,
        "left",
        Client::LeavesAfterWaiting(5, Duration::from_millis(1500)),
    )
    .await;
    assert_eq!(read, 5);
    // The gateway notices its client left when it next writes (after the freeze).
    hops.until_ended(RECV, 1).await;
    let diagnosis = hops.diagnose();
    assert!(diagnosis.problems.is_empty(), "{}", diagnosis.report());
    let stall = diagnosis
        .stalls
        .iter()
        .find(|stall| stall.hop == "gateway.recv")
        .unwrap_or_else(|| panic!("{}", diagnosis.report()));
    assert_eq!(stall.blame, Blame::Began, "{}", diagnosis.report());
    assert_eq!(stall.after, Some(4));
    // Nothing downstream is blamed for what the gateway's read froze, and the worker is clean.
    assert_eq!(
        began(&diagnosis),
        [("gateway.recv", stall.seq)],
        "{}",
        diagnosis.report()
    );
    // The client's own end says it left in a stall.
    let client = hops.probes[CLIENT].snapshot();
    assert_eq!(
        client.streams_ended.occurred(),
        [(EndReason::ConsumerGone, 1)]
    );
    assert_eq!(client.counters.stalls_at_end(), 1);
}

#[tokio::test]
async fn a_freeze_in_the_generator_is_named_at_the_first_hop() {
    let hops = Hops::new();
    let mut steps = quick(10);
    steps[6].0 = Duration::from_millis(1500);
    let upstream = worker(hops.clone(), script(steps)).await;
    let addr = gateway(hops.clone(), upstream, Forwarding::default()).await;
    assert_eq!(client(&hops, addr, "slow-step", Client::ReadsAll).await, 10);
    hops.until_all_ended(1).await;
    let diagnosis = hops.diagnose();
    assert!(diagnosis.problems.is_empty(), "{}", diagnosis.report());
    assert_eq!(
        began(&diagnosis),
        [("worker.publish", Some(6))],
        "{}",
        diagnosis.report()
    );
    // Every hop after it saw the same stall, passed on.
    for hop in &hops.probes {
        assert_eq!(hop.snapshot().counters.stalls(), 1, "{}", hop.name());
    }
}

fn reasoning() -> Script {
    // Three visible events, two seconds of hidden reasoning (a delta every 200 ms), then the
    // answer.
    let mut steps = quick(3);
    steps.extend(vec![(Duration::from_millis(200), Kind::Hidden); 10]);
    steps.extend(quick(5));
    script(steps)
}

#[tokio::test]
async fn a_reasoning_phase_is_never_a_stall_at_any_hop() {
    let hops = Hops::new();
    let upstream = worker(hops.clone(), reasoning()).await;
    let addr = gateway(hops.clone(), upstream, Forwarding::default()).await;
    assert_eq!(client(&hops, addr, "thinks", Client::ReadsAll).await, 8);
    hops.until_all_ended(1).await;
    // The hidden kind survived every hop, through SSE twice.
    for hop in &hops.probes {
        let counters = hop.snapshot().counters;
        assert_eq!(counters.hidden_events(), 10, "{}", hop.name());
        assert_eq!(counters.stalls(), 0, "{}", hop.name());
        assert!(
            counters.max_gap() >= Duration::from_secs(2),
            "{}",
            hop.name()
        );
    }
    let diagnosis = hops.diagnose();
    assert!(diagnosis.problems.is_empty(), "{}", diagnosis.report());
    assert!(diagnosis.stalls.is_empty(), "{}", diagnosis.report());
}

#[tokio::test]
async fn a_reasoning_phase_a_gateway_filters_out_is_not_blamed_on_it() {
    let hops = Hops::new();
    let upstream = worker(hops.clone(), reasoning()).await;
    let forwarding = Forwarding {
        drop_hidden: true,
        ..Forwarding::default()
    };
    let addr = gateway(hops.clone(), upstream, forwarding).await;
    assert_eq!(client(&hops, addr, "filtered", Client::ReadsAll).await, 8);
    hops.until_all_ended(1).await;
    // Downstream of the filter, two seconds without any event: a stall on those hops' own
    // clocks...
    assert_eq!(hops.probes[GATEWAY_WRITE].snapshot().counters.stalls(), 1);
    assert_eq!(hops.probes[CLIENT].snapshot().counters.stalls(), 1);
    // ...which the timeline sees was a reasoning phase upstream, not a freeze of the gateway.
    let diagnosis = hops.diagnose();
    assert!(diagnosis.problems.is_empty(), "{}", diagnosis.report());
    assert!(began(&diagnosis).is_empty(), "{}", diagnosis.report());
}

#[tokio::test]
async fn a_missing_upstream_record_makes_the_blame_unknown_not_wrong() {
    let hops = Hops::new();
    let mut steps = quick(10);
    steps[6].0 = Duration::from_millis(1500);
    let upstream = worker(hops.clone(), script(steps)).await;
    let addr = gateway(hops.clone(), upstream, Forwarding::default()).await;
    assert_eq!(client(&hops, addr, "dropped", Client::ReadsAll).await, 10);
    hops.until_all_ended(1).await;
    // The write hop's record of event 5 never reached the file (as when a full queue drops it).
    let lines: String = hops
        .lines()
        .lines()
        .filter(|line| !(line.contains(r#""hop":"worker.write""#) && line.contains(r#""seq":5,"#)))
        .map(|line| format!("{line}\n"))
        .collect();
    let diagnosis = hops.diagnose_lines(&lines);
    // The generator's stall is still found where it began ...
    assert_eq!(
        began(&diagnosis),
        [("worker.publish", Some(6))],
        "{}",
        diagnosis.report()
    );
    // ... and the gateway's view of it, from 5 to 6, cannot be checked against the write hop:
    // unknown, saying why, never blamed on the gateway.
    let unknown: Vec<_> = diagnosis
        .stalls
        .iter()
        .filter(|stall| matches!(stall.blame, Blame::Unknown(_)))
        .collect();
    assert_eq!(unknown.len(), 1, "{}", diagnosis.report());
    assert_eq!(unknown[0].hop, "gateway.recv");
    let Blame::Unknown(why) = &unknown[0].blame else {
        unreachable!()
    };
    assert!(why.contains("worker.write") && why.contains('5'), "{why}");
}

#[tokio::test]
async fn coalesced_events_line_up_by_id() {
    let hops = Hops::new();
    // 300 events of 8 KiB: far more than the sockets hold while the client does not read.
    let steps = vec![(Duration::from_millis(1), Kind::Visible); 300];
    let script = Script {
        bytes: 8192,
        ..script(steps)
    };
    let upstream = worker(hops.clone(), script).await;
    let addr = gateway(hops.clone(), upstream, Forwarding::default()).await;
    // The client pauses after 5 events: the gateway's gate fills and stops reading upstream,
    // the worker's socket fills, and the worker's gate (4 events) coalesces meanwhile.
    let read = client(
        &hops,
        addr,
        "coalesced",
        Client::Pauses(5, Duration::from_millis(1200)),
    )
    .await;
    assert!(read < 300, "some events were merged: {read}");
    hops.until_all_ended(1).await;
    assert_eq!(
        hops.probes[PUBLISH].snapshot().counters.visible_events(),
        300
    );
    let written = hops.probes[WRITE].snapshot().counters.visible_events();
    assert_eq!(
        written, read as u64,
        "every hop after the gate saw the merged events"
    );
    let diagnosis = hops.diagnose();
    // The merged events are recorded under their last ids, which the generator's hop has: no
    // problem, no unknown blame. The client's pause froze every hop before it in turn, each at
    // a later event (the buffers between them held the difference): those are back-pressure,
    // and the stall is named once, where it began: the client.
    assert!(diagnosis.problems.is_empty(), "{}", diagnosis.report());
    assert_eq!(
        began(&diagnosis),
        [("client.recv", Some(5))],
        "{}",
        diagnosis.report()
    );
    assert_eq!(diagnosis.stalls.len(), 1, "{}", diagnosis.report());
    for (hop, summary) in PATH.iter().zip(&diagnosis.hops).take(CLIENT) {
        assert_eq!(
            summary.quiet_spells,
            1,
            "{hop} froze too: {}",
            diagnosis.report()
        );
    }
}

#[tokio::test]
async fn a_generator_frozen_for_good_is_named_by_the_end_records_alone() {
    let hops = Hops::new();
    // Five events, then the generator never produces again; the user leaves after 1.5 s.
    let script = Script {
        then: Then::Hangs,
        ..script(quick(5))
    };
    let upstream = worker(hops.clone(), script).await;
    let addr = gateway(hops.clone(), upstream, Forwarding::default()).await;
    let leaves = Client::LeavesAfterWaiting(5, Duration::from_millis(1500));
    assert_eq!(client(&hops, addr, "frozen", leaves).await, 5);
    // The client's leaving closes the gateway's upstream connection, which drops the worker's
    // response body and, with it, the generator.
    hops.until_all_ended(1).await;
    for hop in &hops.probes {
        let snapshot = hop.snapshot();
        assert_eq!(snapshot.counters.stalls_at_end(), 1, "{}", hop.name());
        assert_eq!(
            snapshot.streams_ended.occurred(),
            [(EndReason::ConsumerGone, 1)],
            "{}",
            hop.name()
        );
    }
    let diagnosis = hops.diagnose();
    assert!(diagnosis.problems.is_empty(), "{}", diagnosis.report());
    assert_eq!(
        began(&diagnosis),
        [("worker.publish", None)],
        "{}",
        diagnosis.report()
    );
    let stall = &diagnosis.stalls[0];
    assert_eq!(
        (stall.after, stall.end_reason),
        (Some(4), Some(EndReason::ConsumerGone))
    );
}

#[tokio::test]
async fn an_upstream_error_ends_the_stream_at_every_hop_never_completed() {
    let hops = Hops::new();
    let script = Script {
        then: Then::Fails,
        ..script(quick(3))
    };
    let upstream = worker(hops.clone(), script).await;
    let addr = gateway(hops.clone(), upstream, Forwarding::default()).await;
    assert_eq!(client(&hops, addr, "fails", Client::ReadsAll).await, 3);
    hops.until_all_ended(1).await;
    let ends: Vec<_> = hops
        .probes
        .iter()
        .map(|hop| hop.snapshot().streams_ended.occurred())
        .collect();
    assert_eq!(
        ends,
        [
            [(EndReason::GeneratorError, 1)],
            [(EndReason::GeneratorError, 1)],
            [(EndReason::UpstreamError, 1)],
            [(EndReason::UpstreamError, 1)],
            [(EndReason::UpstreamError, 1)],
        ]
    );
    // The end frames carry no event id of their own: nothing is recorded twice.
    let diagnosis = hops.diagnose();
    assert!(diagnosis.problems.is_empty(), "{}", diagnosis.report());
    assert!(diagnosis.stalls.is_empty(), "{}", diagnosis.report());
}
