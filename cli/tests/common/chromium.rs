//! Real headless Chromium (Debian's `chromium` package, or `$CHROMIUM`), opening one page and
//! killed when dropped; a test without it says SKIPPED.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::{Child, Command};

/// The browser to run: `$CHROMIUM`, or `chromium` on the `PATH`; `None` (and a loud SKIPPED
/// naming `test`) without one.
pub fn installed(test: &str) -> Option<PathBuf> {
    let binary = std::env::var_os("CHROMIUM").map(PathBuf::from).or_else(|| {
        std::env::var_os("PATH")?
            .to_str()?
            .split(':')
            .map(|dir| Path::new(dir).join("chromium"))
            .find(|path| path.is_file())
    });
    if binary.is_none() {
        eprintln!(
            "SKIPPED: {test}: no Chromium (`apt-get install chromium`, or set CHROMIUM); \
             `bash .ci/run` installs it as root"
        );
    }
    binary
}

/// Headless Chromium showing `url`, with a profile of its own under `dir`: it runs until
/// dropped.
pub fn open(binary: &Path, url: &str, dir: &Path) -> Child {
    Command::new(binary)
        .args([
            "--headless=new",
            // As root, in a container: no sandbox, no GPU, no small /dev/shm.
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("Chromium starts")
}
