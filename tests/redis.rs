//! `resume::RedisRegistry` on a real `redis-server` (started here on a free port; the test says
//! SKIPPED and passes when it is not installed): a reader on another instance probes the same
//! end reason as the stream's own instance. (The reference server's instances sharing one Redis
//! are `cli/tests/sim_redis.rs`.)
#![cfg(feature = "redis")]

mod common;

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of this test's own, killed when dropped.
struct RedisServer {
    port: u16,
    dir: std::path::PathBuf,
    child: Child,
}

impl RedisServer {
    /// Starts one on a free port, or `None` (having said so) when it is not installed.
    fn start(test: &str) -> Option<RedisServer> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let dir = std::env::temp_dir().join(format!("streamgate-redis-{test}-{port}"));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        match RedisServer::spawn(port, &dir) {
            Some(child) => Some(RedisServer { port, dir, child }),
            None => {
                println!("SKIPPED: redis-server not installed");
                None
            }
        }
    }

    fn spawn(port: u16, dir: &std::path::Path) -> Option<Child> {
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .spawn()
            .ok()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(child)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_on_another_instance_probes_the_same_end_reason() {
    use futures_util::StreamExt;
    use streamgate::probe::HopProbe;
    use streamgate::resume::{RedisRegistry, ResumeOptions};
    use streamgate::sse::SseEvent;
    use streamgate::{Gate, GateExt};

    let Some(redis) = RedisServer::start("end-reason") else {
        return;
    };
    let (here, there) = (
        RedisRegistry::new(&redis.url(), ResumeOptions::default()).unwrap(),
        RedisRegistry::new(&redis.url(), ResumeOptions::default()).unwrap(),
    );
    let consumer = Gate::new().spawn(|_, mut tx| async move {
        tx.send(SseEvent::data("a")).await.ok();
        Err(std::io::Error::other("the decode loop failed"))
    });
    let first = here.register("failing", consumer).await.unwrap();
    let hop = HopProbe::new("client.recv");
    // The reader on the other instance sees the event, the terminal frame, and the end.
    let reader = there.attach("failing", None).await.unwrap();
    let frames: Vec<_> = tokio::time::timeout(common::HANG, reader.probe(&hop, "r").collect())
        .await
        .expect("the stream ends");
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert_eq!(frames[1].end_reason(), Some("generator_error"));
    assert_eq!(hop.snapshot().streams_ended, [("generator_error", 1)]);
    drop(first);
}
