//! A `redis-server` of a test's own on a free port of 127.0.0.1 (Debian's package), killed and
//! its directory removed when dropped; a test says SKIPPED and passes when none is installed.
//! Shared by the library's Redis test and the command's (`cli/tests` include it by its path).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `redis-server`.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Child,
}

impl RedisServer {
    /// Starts one on a free port for `test`, or `None` (having said so) when it is not
    /// installed.
    pub fn start(test: &str) -> Option<RedisServer> {
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

    fn spawn(port: u16, dir: &Path) -> Option<Child> {
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

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills it (Redis dying under its clients).
    pub fn kill(&mut self) {
        self.child.kill().expect("kill redis-server");
        self.child.wait().expect("reap redis-server");
    }

    /// A new process on the same port (with nothing of the old one's data).
    pub fn restart(&mut self) {
        self.child = RedisServer::spawn(self.port, &self.dir).expect("redis-server restarts");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
