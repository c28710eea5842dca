//! What the benchmarks share.

use tokio::runtime::Runtime;

/// A current-thread runtime and a 2-worker multi-thread runtime, named, each built once outside
/// the timed loops.
pub fn runtimes() -> [(&'static str, Runtime); 2] {
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    [("current_thread", current), ("multi_thread", multi)]
}
