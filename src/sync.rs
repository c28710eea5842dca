//! The synchronisation primitives the gate is built on: std's, or loom's when model-checking.
//!
//! Code in the buffer and the cancel/close paths names `crate::sync`, never `std::sync`, so the
//! same code runs under `RUSTFLAGS="--cfg loom" cargo test --lib`.

#[cfg(all(test, loom))]
pub(crate) use loom::sync::{
    Arc, Mutex, MutexGuard,
    atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
};
#[cfg(not(all(test, loom)))]
pub(crate) use std::sync::{
    Arc, Mutex, MutexGuard,
    atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
};

/// Locks `mutex`, ignoring poisoning. The only foreign code that runs under one of the crate's
/// locks is [`Chunk::merge`](crate::Chunk::merge); if it panics, the panic ends the stream as a
/// generator panic, and the state left behind is still memory-safe and bounded.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
