//! Model checks of the buffer, the cancel/close paths, the gate's task and the release, run
//! with `RUSTFLAGS="--cfg loom" cargo test --lib --release gate::tests`.

mod loom_buffer;
mod loom_end;
