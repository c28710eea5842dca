//! Model checks of the buffer and the cancel/close paths, run with
//! `RUSTFLAGS="--cfg loom" cargo test --lib --release gate::tests`.

mod loom_buffer;
