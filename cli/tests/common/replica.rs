//! `streamgate sim` as a child process: a replica that a test can kill (SIGKILL), freeze
//! (SIGSTOP: it still accepts connections, through the kernel's backlog, and answers nothing)
//! and start again on its port; and `streamgate proxy` as one, an instance of the proxy to
//! kill the same way.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::HANG;

/// A `streamgate sim` (or `streamgate proxy`) process; killed when dropped.
pub struct Replica {
    /// `sim` or `proxy`.
    command: &'static str,
    flags: Vec<String>,
    addr: SocketAddr,
    child: Option<Child>,
    /// What the current process printed (stdout and stderr, line by line).
    output: Arc<Mutex<String>>,
}

impl Replica {
    /// Starts `streamgate sim --addr 127.0.0.1:0 FLAGS` and returns once it has printed its
    /// `listening on` line (its port is open).
    pub async fn start(flags: &[&str]) -> Replica {
        Replica::of("sim", flags).await
    }

    /// Starts `streamgate proxy --addr 127.0.0.1:0 FLAGS`, as [`start`](Replica::start) does.
    pub async fn proxy(flags: &[&str]) -> Replica {
        Replica::of("proxy", flags).await
    }

    async fn of(command: &'static str, flags: &[&str]) -> Replica {
        let flags: Vec<String> = flags.iter().map(|flag| flag.to_string()).collect();
        let (child, addr, output) = spawn(command, "127.0.0.1:0", &flags)
            .await
            .unwrap_or_else(|output| panic!("streamgate {command} did not start:\n{output}"));
        Replica {
            command,
            flags,
            addr,
            child: Some(child),
            output,
        }
    }

    /// Where it listens (the same port across restarts).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, for `--upstream`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The running process's id (`None` once killed).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref()?.id()
    }

    /// Whether the process ended by itself (its `--die-after`): it has exited, and was not
    /// killed here.
    pub fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|child| child.try_wait().is_ok_and(|status| status.is_some()))
    }

    /// Whether a process is running (not yet killed).
    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the process with SIGKILL and reaps it: once this returns its connections are closed
    /// and connecting to its port is refused. Nothing if it is not running.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Kills the process if it runs, then starts `streamgate sim` again with the same flags on
    /// the same port, retrying while the port is still taken (for at most [`HANG`]); returns once
    /// it listens.
    pub async fn restart(&mut self) {
        self.kill().await;
        let addr = self.addr.to_string();
        let deadline = Instant::now() + HANG;
        loop {
            match spawn(self.command, &addr, &self.flags).await {
                Ok((child, _, output)) => {
                    self.child = Some(child);
                    self.output = output;
                    return;
                }
                Err(output) if output.contains("in use") && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(output) => panic!(
                    "streamgate {} did not start again on {addr}:\n{output}",
                    self.command
                ),
            }
        }
    }

    /// Freezes the process (SIGSTOP) and returns once the kernel says it is stopped:
    /// connections are still accepted (into the listening socket's backlog), nothing is read or
    /// answered, streams stop mid-way.
    pub async fn pause(&self) {
        self.signal("-STOP");
        let stat = format!("/proc/{}/stat", self.pid().expect("a running replica"));
        let deadline = Instant::now() + HANG;
        // The state is the field after the command's parenthesis: `T` once stopped.
        while !std::fs::read_to_string(&stat).is_ok_and(|stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
        }) {
            assert!(Instant::now() < deadline, "the replica never stopped");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Lets a paused process go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Asks the process to stop (SIGTERM), as a rolling restart does: it ends its streams with
    /// their `shutdown` frame and exits.
    pub fn terminate(&self) {
        self.signal("-TERM");
    }

    /// Its `GET /stats`.
    pub async fn stats(&self) -> serde_json::Value {
        super::stats(self.addr).await
    }

    /// What the current process printed so far.
    pub fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    /// Sends `signal` (`kill`'s spelling) to the running process.
    fn signal(&self, signal: &str) {
        let pid = self.pid().expect("a running replica");
        let status = std::process::Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill {signal} {pid}: {status}");
    }
}

/// Starts `streamgate COMMAND --addr ADDR FLAGS` and reads its `listening on` line: the
/// process, its address and what it prints; or, if it exits first (or says nothing within
/// [`HANG`]), what it printed.
async fn spawn(
    command: &str,
    addr: &str,
    flags: &[String],
) -> Result<(Child, SocketAddr, Arc<Mutex<String>>), String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_streamgate"))
        .args([command, "--addr", addr])
        .args(flags)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the streamgate binary runs");
    let output = Arc::new(Mutex::new(String::new()));
    let stderr = child.stderr.take().expect("piped");
    let stderr = tokio::spawn(keep(BufReader::new(stderr), output.clone()));
    let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    let read = tokio::time::timeout(HANG, stdout.read_line(&mut line)).await;
    output.lock().unwrap().push_str(&line);
    let listening = line
        .trim()
        .strip_prefix("listening on http://")
        .and_then(|addr| addr.parse().ok());
    match (read, listening) {
        (Ok(Ok(_)), Some(addr)) => {
            // Keep reading: a full pipe would block the replica's next print.
            tokio::spawn(keep(stdout, output.clone()));
            Ok((child, addr, output))
        }
        _ => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            let _ = stderr.await;
            Err(output.lock().unwrap().clone())
        }
    }
}

/// Appends every line `from` gives to `output`, until its end.
async fn keep(from: BufReader<impl AsyncRead + Unpin>, output: Arc<Mutex<String>>) {
    let mut lines = from.lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let mut output = output.lock().unwrap();
        output.push_str(&line);
        output.push('\n');
    }
}
