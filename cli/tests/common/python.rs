//! The real Python SDKs as the tests run them: a script of `tests/clients/` as a child process,
//! skipped (loudly) when its package is not installed.

use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use tokio::process::Command;

/// Runs `python3 tests/clients/SCRIPT ARGS` as a child process (killed if it takes over a
/// minute), if the Python `module` is installed; `None` (the test says SKIPPED) when it is not.
pub async fn python(test: &str, module: &str, script: &str, args: Vec<String>) -> Option<Output> {
    if !installed(test, module).await {
        return None;
    }
    let path = format!("{}/tests/clients/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut command = vec![path];
    command.extend(args);
    let output = tokio::time::timeout(Duration::from_secs(60), run(command))
        .await
        .expect("the SDK finished in time")
        .expect("python3 runs");
    assert!(
        output.status.success(),
        "the SDK failed: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Some(output)
}

/// Whether the Python `module` is installed; when it is not, `test` says SKIPPED.
pub async fn installed(test: &str, module: &str) -> bool {
    let import = vec!["-c".to_owned(), format!("import {module}")];
    let installed = run(import)
        .await
        .is_ok_and(|output| output.status.success());
    if !installed {
        eprintln!(
            "\n*** SKIPPED {test}: the {module} Python package is not installed \
             (`python3 -m pip install {module}`) ***\n"
        );
    }
    installed
}

/// `python3 ARGS`, killed when the future is dropped.
async fn run(args: Vec<String>) -> std::io::Result<Output> {
    Command::new("python3")
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
}

/// The JSON lines a script printed.
pub fn lines(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}
