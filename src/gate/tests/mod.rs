//! Model checks of the buffer, the cancel/close paths, the gate's task, the release, the
//! slow-consumer clock and a group's byte budget, run with
//! `RUSTFLAGS="--cfg loom" cargo test --lib --release gate::tests`.

mod loom_budget;
mod loom_buffer;
mod loom_clock;
mod loom_end;
