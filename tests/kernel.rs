//! The kernel's part, over real sockets: what the listener sets on accepted sockets, a stopped
//! reader ended on time with the OS's default buffer sizes, a vanished client found by the user
//! timeout (its packets dropped in a network namespace the test creates, as root), and the time
//! events sat in the kernel, as a hop a diagnosis can name.
#![cfg(all(feature = "axum", feature = "io"))]

mod common;

use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::process::Command;
#[cfg(feature = "timeline")]
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use common::HANG;
use common::gate::Releases;
use streamgate::probe::HopProbe;
#[cfg(feature = "timeline")]
use streamgate::probe::RecordSink;
use streamgate::sse::SseEvent;
#[cfg(feature = "timeline")]
use streamgate::timeline::Timeline;
use streamgate::transport::{
    DEFAULT_KEEPALIVE, DEFAULT_NOTSENT_LOWAT, DEFAULT_USER_TIMEOUT, Departures, FrameWriter,
    ListenOptions, SseResponse, TunedListener,
};
use streamgate::{EndReason, Gate, GateExt, Policy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep, timeout};

/// An OpenAI-sized event (~150 bytes).
fn token(i: u64) -> SseEvent {
    SseEvent::data(format!(
        "{{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i} \"}},\"finish_reason\":null}}],\"pad\":\"{}\"}}",
        "x".repeat(20)
    ))
}

fn get_int(socket: &impl AsFd, level: libc::c_int, name: libc::c_int) -> libc::c_int {
    use std::os::fd::AsRawFd;
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: one live `c_int` and its size; the descriptor is borrowed from a live socket.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_fd().as_raw_fd(),
            level,
            name,
            (&raw mut value).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "getsockopt: {}", std::io::Error::last_os_error());
    value
}

#[tokio::test]
async fn accepted_sockets_carry_the_listener_options() {
    let listener =
        TunedListener::bind(([127, 0, 0, 1], 0).into(), ListenOptions::default()).unwrap();
    let _client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (accepted, _) = listener.accept().await.unwrap();
    let tcp = libc::IPPROTO_TCP;
    assert_eq!(get_int(&accepted, tcp, libc::TCP_NODELAY), 1);
    assert_eq!(
        get_int(&accepted, tcp, libc::TCP_NOTSENT_LOWAT),
        DEFAULT_NOTSENT_LOWAT as i32
    );
    assert_eq!(
        get_int(&accepted, tcp, libc::TCP_USER_TIMEOUT),
        DEFAULT_USER_TIMEOUT.as_millis() as i32
    );
    assert_eq!(get_int(&accepted, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
    assert_eq!(
        get_int(&accepted, tcp, libc::TCP_KEEPIDLE),
        DEFAULT_KEEPALIVE.as_secs() as i32
    );

    // `None` leaves the system's settings.
    let plain = ListenOptions::default().user_timeout(None).keepalive(None);
    let listener = TunedListener::bind(([127, 0, 0, 1], 0).into(), plain).unwrap();
    let _client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (accepted, _) = listener.accept().await.unwrap();
    assert_eq!(get_int(&accepted, tcp, libc::TCP_USER_TIMEOUT), 0);
    assert_eq!(get_int(&accepted, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 0);
}

/// Serves `/stream` on `addr`: each request gets a gate from `releases` with `policy`, whose
/// generator sends one token every `step` (or, with `stall_after`, that many tokens and then
/// nothing for a long while), with heartbeats every `heartbeat`.
async fn serve(
    addr: SocketAddr,
    options: ListenOptions,
    releases: &Releases,
    policy: Policy,
    step: Duration,
    stall_after: Option<u64>,
    heartbeat: Duration,
) -> SocketAddr {
    let gates = releases.clone();
    let app = Router::new().route(
        "/stream",
        get(move || {
            let consumer = gates
                .gate()
                .policy(policy)
                .spawn(move |_, mut tx| async move {
                    // Ticks in bursts when a step is shorter than the timer's millisecond.
                    let mut tick = tokio::time::interval(step);
                    for i in 0.. {
                        if stall_after == Some(i) {
                            sleep(Duration::from_secs(120)).await;
                        }
                        tick.tick().await;
                        tx.send(token(i)).await?;
                    }
                    Ok::<_, streamgate::SendError<SseEvent>>(())
                });
            async move { SseResponse::new(consumer.sse().heartbeat(heartbeat)) }
        }),
    );
    let listener = TunedListener::bind(addr, options).expect("bind");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Sends the request on `client`, reads until the first event, then stops reading.
async fn read_first_event(client: &mut TcpStream) {
    let addr = client.peer_addr().unwrap();
    let request = format!("GET /stream HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    client.write_all(request.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    // Byte by byte, so that nothing past the first event is taken from the kernel.
    while !seen.windows(5).any(|w| w == b"data:") || !seen.ends_with(b"\n\n") {
        timeout(HANG, client.read_exact(&mut byte))
            .await
            .expect("the first event comes")
            .unwrap();
        seen.push(byte[0]);
    }
}

/// A reader that stops after the first event of a generator at 2,000 tokens/s, on a listener
/// with `options` and a gate with `policy`: why and when its stream was released, counted from
/// the moment it stopped reading (`None`: not within `limit`).
async fn stopped_reader_released(
    options: ListenOptions,
    policy: Policy,
    limit: Duration,
) -> Option<(EndReason, Duration)> {
    let releases = Releases::default();
    let addr = serve(
        ([127, 0, 0, 1], 0).into(),
        options,
        &releases,
        policy,
        Duration::from_micros(500),
        None,
        Duration::from_secs(15),
    )
    .await;
    let mut client = TcpStream::connect(addr).await.unwrap();
    read_first_event(&mut client).await;
    let stopped = Instant::now();
    while releases.count() == 0 && stopped.elapsed() < limit {
        sleep(Duration::from_millis(20)).await;
    }
    let released = (releases.count() > 0).then(|| {
        let (reason, _, at) = releases.once_at();
        (reason, at - stopped)
    });
    drop(client);
    released
}

/// With `Disconnect { after: 2 s }`: when a stopped reader's stream was released as slow
/// (`None`: not within 6 s).
async fn stopped_reader_released_after(options: ListenOptions) -> Option<Duration> {
    const AFTER: Duration = Duration::from_secs(2);
    let policy = Policy::disconnect(AFTER);
    let (reason, after) = stopped_reader_released(options, policy, AFTER * 3).await?;
    assert_eq!(reason, EndReason::SlowConsumer);
    Some(after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_reader_meets_its_deadline_with_the_os_default_buffer_sizes() {
    // The listener's defaults: the kernel stops taking bytes after 16 KiB unsent, the gate
    // fills within a fraction of a second, and the policy's clock runs.
    let ended = stopped_reader_released_after(ListenOptions::default())
        .await
        .expect("a stopped reader is ended");
    eprintln!("a stopped reader ended {ended:?} after it stopped (deadline 2 s)");
    assert!(
        ended <= Duration::from_secs(3),
        "ended {ended:?} after the reader stopped, deadline 2 s"
    );
    // Without `TCP_NOTSENT_LOWAT` the kernel takes megabytes first: the same reader is not
    // even seen as slow yet.
    let os = ListenOptions::default().notsent_lowat(None);
    let ended = stopped_reader_released_after(os).await;
    assert!(
        ended.is_none_or(|ended| ended > Duration::from_secs(3)),
        "without the low-water mark the kernel hides the stopped reader ({ended:?})"
    );
}

/// A network namespace with a veth pair to the test's namespace, removed on drop.
struct Namespace {
    name: String,
    host: std::net::Ipv4Addr,
    peer: std::net::Ipv4Addr,
}

impl Namespace {
    /// Creates it, or says why not (not root, no `ip`).
    fn create(index: u8) -> Result<Namespace, String> {
        // SAFETY: `geteuid` has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        let pid = std::process::id();
        let name = format!("sg{pid}-{index}");
        let subnet = 100 + u32::from(index) + (pid % 50) * 2;
        let octet = u8::try_from(subnet % 250).unwrap();
        let namespace = Namespace {
            name,
            host: [10, 231, octet, 1].into(),
            peer: [10, 231, octet, 2].into(),
        };
        let (host_if, peer_if) = namespace.interfaces();
        let name = &namespace.name;
        let steps: [&[&str]; 6] = [
            &["netns", "add", name],
            &[
                "link", "add", &host_if, "type", "veth", "peer", "name", &peer_if, "netns", name,
            ],
            &[
                "addr",
                "add",
                &format!("{}/24", namespace.host),
                "dev",
                &host_if,
            ],
            &["link", "set", &host_if, "up"],
            &[
                "-n",
                name,
                "addr",
                "add",
                &format!("{}/24", namespace.peer),
                "dev",
                &peer_if,
            ],
            &["-n", name, "link", "set", &peer_if, "up"],
        ];
        for step in steps {
            namespace.ip(step)?;
        }
        Ok(namespace)
    }

    fn interfaces(&self) -> (String, String) {
        let tag = self.name.trim_start_matches("sg");
        (format!("sgh{tag}"), format!("sgp{tag}"))
    }

    fn ip(&self, args: &[&str]) -> Result<(), String> {
        let output = Command::new("ip")
            .args(args)
            .output()
            .map_err(|error| format!("ip: {error}"))?;
        if !output.status.success() {
            return Err(format!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(())
    }

    /// A client socket connected from inside the namespace to `addr`.
    fn connect(&self, addr: SocketAddr) -> TcpStream {
        let path = format!("/run/netns/{}", self.name);
        let socket = std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            let namespace = std::fs::File::open(path).expect("the namespace");
            // SAFETY: a valid namespace descriptor; only this short-lived thread moves.
            let rc = unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            std::net::TcpStream::connect_timeout(&addr, HANG).expect("connect from the namespace")
        })
        .join()
        .unwrap();
        socket.set_nonblocking(true).unwrap();
        TcpStream::from_std(socket).unwrap()
    }

    /// From now on every packet to or from the client is dropped: no FIN, no RST.
    fn vanish(&self) {
        let (_, peer_if) = self.interfaces();
        self.ip(&["-n", &self.name, "link", "set", &peer_if, "down"])
            .expect("link down");
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let (host_if, _) = self.interfaces();
        let _ = self.ip(&["link", "del", &host_if]);
        let _ = self.ip(&["netns", "del", &self.name]);
    }
}

/// A client in a namespace reads the first event, then vanishes during a long decode stall
/// (heartbeats every 200 ms): how long until its stream is released (`None`: not within
/// `wait`).
async fn vanished_client_released_after(
    index: u8,
    user_timeout: Option<Duration>,
    wait: Duration,
) -> Option<Option<Duration>> {
    let namespace = match Namespace::create(index) {
        Ok(namespace) => namespace,
        Err(why) => {
            eprintln!("SKIPPED: a vanished client needs a network namespace ({why})");
            return None;
        }
    };
    let releases = Releases::default();
    let options = ListenOptions::default().user_timeout(user_timeout);
    let addr = serve(
        (namespace.host, 0).into(),
        options,
        &releases,
        Policy::backpressure(),
        Duration::from_millis(1),
        Some(3),
        Duration::from_millis(200),
    )
    .await;
    let mut client = namespace.connect(addr);
    read_first_event(&mut client).await;
    namespace.vanish();
    let vanished = Instant::now();
    while releases.count() == 0 && vanished.elapsed() < wait {
        sleep(Duration::from_millis(20)).await;
    }
    let released = (releases.count() > 0).then(|| {
        let (reason, _, at) = releases.once_at();
        assert_eq!(reason, EndReason::ConsumerGone);
        at - vanished
    });
    drop(client);
    Some(released)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_client_is_released_within_a_heartbeat_and_the_user_timeout() {
    let user_timeout = Duration::from_secs(1);
    let Some(released) =
        vanished_client_released_after(0, Some(user_timeout), Duration::from_secs(10)).await
    else {
        return;
    };
    let released = released.expect("the vanished client's stream is released");
    eprintln!("a vanished client released {released:?} after it vanished (user timeout 1 s)");
    // One heartbeat interval, the user timeout, and the retransmission timer's granularity.
    assert!(
        released <= Duration::from_millis(200) + user_timeout + Duration::from_secs(1),
        "released {released:?} after the client vanished"
    );
    // Without a user timeout, Linux retransmits for minutes: the generator keeps its memory.
    let Some(released) = vanished_client_released_after(1, None, Duration::from_secs(5)).await
    else {
        return;
    };
    assert_eq!(released, None, "without a user timeout nothing notices");
}

#[cfg(feature = "timeline")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn departures_name_the_kernel_when_events_sit_in_it() {
    const EVENTS: u64 = 3_000;
    let listener =
        TunedListener::bind(([127, 0, 0, 1], 0).into(), ListenOptions::default()).unwrap();
    let mut client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (socket, _) = listener.accept().await.unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = RecordSink::to_writer(SharedBuffer(lines.clone()), 1 << 16).unwrap();
    let write = HopProbe::new("worker.write").records(sink.clone(), 1.0);
    let sent = HopProbe::new("worker.sent").records(sink.clone(), 1.0);
    let consumer = Gate::new().spawn(|_, mut tx| async move {
        for i in 0..EVENTS {
            tx.send(token(i)).await?;
        }
        Ok::<_, streamgate::SendError<SseEvent>>(())
    });
    let frames = consumer.sse().probe(&write, "r");
    let frames = Departures::new(frames, socket.send_queue(), sent.recorder("r"));
    let writer = tokio::spawn(async move {
        let mut socket = FrameWriter::new(socket);
        let written = socket.forward(frames, |_, _| {}).await.unwrap();
        (written, socket)
    });
    // The client reads nothing for a second: what the kernel took stays there, and the
    // stream, whose generator is long done, waits for it to leave.
    sleep(Duration::from_secs(1)).await;
    assert!(
        !writer.is_finished(),
        "the end waits for the last bytes to leave"
    );
    let mut buffer = vec![0u8; 1 << 16];
    let (mut frames_read, mut last) = (0, 0u8);
    while frames_read < EVENTS {
        let n = timeout(HANG, client.read(&mut buffer))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "the connection is open until every event is read");
        for &byte in &buffer[..n] {
            frames_read += u64::from(last == b'\n' && byte == b'\n');
            last = byte;
        }
    }
    let (written, _socket) = timeout(HANG, writer).await.unwrap().unwrap();
    assert_eq!(written, EVENTS);
    assert_eq!(write.snapshot().counters.visible_events(), EVENTS);
    let snapshot = sent.snapshot();
    assert_eq!(
        snapshot.counters.visible_events(),
        EVENTS,
        "every event's departure is recorded once the client drained them"
    );
    assert_eq!(
        snapshot.streams_ended.occurred(),
        [(EndReason::Completed, 1)]
    );
    sink.sync();
    let records = String::from_utf8(lines.lock().unwrap().clone()).unwrap();
    let mut timeline = Timeline::new(["worker.write", "worker.sent"], Duration::from_millis(500));
    timeline.add_lines("records", &records);
    let diagnosis = timeline.diagnose();
    assert!(diagnosis.problems.is_empty(), "{:?}", diagnosis.problems);
    // The freeze began in the kernel: events handed over on time sat there first. Later the
    // full socket held the writes back too (the write hop's stall at later events, which the
    // timeline counts as pushed back when the hop after it recorded the reader's stall).
    let first = diagnosis
        .stalls
        .iter()
        .min_by_key(|stall| stall.seq.unwrap_or(u64::MAX))
        .expect("the pause is a stall");
    assert_eq!(
        first.hop, "worker.sent",
        "the events were handed over on time and sat in the kernel: {:?}",
        diagnosis.stalls
    );
    assert!(
        first
            .upstream_gap
            .is_some_and(|gap| gap < Duration::from_millis(100))
    );
    assert!(first.gap >= Duration::from_millis(500), "{first:?}");
}

/// A writer into a shared buffer, for the record sink's thread.
#[cfg(feature = "timeline")]
struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

#[cfg(feature = "timeline")]
impl std::io::Write for SharedBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Whether the kernel has the zero-window fix of `TCP_USER_TIMEOUT` (Linux 5.11).
fn kernel_fails_zero_windows() -> Option<bool> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let mut parts = release.trim().split(['.', '-']);
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.parse().ok()?;
    Some((major, minor) >= (5, 11))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_user_timeout_ends_a_stopped_reader_on_kernels_with_the_zero_window_fix() {
    if kernel_fails_zero_windows() != Some(true) {
        eprintln!("SKIPPED: this kernel predates the zero-window fix of TCP_USER_TIMEOUT");
        return;
    }
    // A pause without limit, a reader that is alive (it acknowledges the window probes) but
    // stopped: the kernel fails the connection once its window has been zero for the user
    // timeout, as `ListenOptions` documents.
    let user_timeout = Duration::from_secs(1);
    let options = ListenOptions::default().user_timeout(Some(user_timeout));
    let policy = Policy::backpressure().max_pause(None);
    let (reason, after) = stopped_reader_released(options, policy, HANG)
        .await
        .expect("the connection fails");
    assert_eq!(reason, EndReason::ConsumerGone, "the connection failed");
    eprintln!("a stopped reader's connection failed {after:?} after it stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn departures_end_when_the_connection_can_no_longer_send() {
    const EVENTS: u64 = 1_000;
    // No low-water mark: every write completes, and what the client's window cannot take
    // stays unsent in the kernel.
    let options = ListenOptions::default().notsent_lowat(None);
    let listener = TunedListener::bind(([127, 0, 0, 1], 0).into(), options).unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (socket, _) = listener.accept().await.unwrap();
    let queue = socket.send_queue();
    let sent = HopProbe::new("worker.sent");
    let consumer = Gate::new().spawn(|_, mut tx| async move {
        for i in 0..EVENTS {
            tx.send(token(i)).await?;
        }
        Ok::<_, streamgate::SendError<SseEvent>>(())
    });
    let frames = Departures::new(consumer.sse(), queue.clone(), sent.recorder("r"));
    let writer = tokio::spawn(async move {
        let mut socket = FrameWriter::new(socket);
        let written = socket.forward(frames, |_, _| {}).await;
        (written, socket)
    });
    sleep(Duration::from_millis(300)).await;
    assert!(queue.unsent().unwrap() > 0, "the client's window is full");
    assert!(!writer.is_finished(), "the end waits for the unsent bytes");
    // Closed with unread bytes: the client's kernel resets the connection, and what is still
    // unsent will never leave.
    drop(client);
    let (written, _socket) = timeout(HANG, writer)
        .await
        .expect("the stream ends")
        .unwrap();
    assert_eq!(written.unwrap(), EVENTS, "every frame was written");
    let snapshot = sent.snapshot();
    assert!(snapshot.counters.visible_events() < EVENTS);
    assert_eq!(
        snapshot.streams_ended.occurred(),
        [(EndReason::ConsumerGone, 1)],
        "bytes that never left are not a completed stream"
    );
}
