//! The reference server, `streamgate sim`, as an example: the same flags and endpoints (the
//! interface in `examples/README.md`, "The reference server"), runnable from the repository
//! without installing the command.
//!
//! `cargo run --release --example serve -- --addr 127.0.0.1:0 [flags]`

use std::process::ExitCode;

use streamgate_cli::sim;

#[tokio::main]
async fn main() -> ExitCode {
    match sim::Config::parse_from(std::env::args_os().skip(1)) {
        Ok(config) => sim::run(config).await,
        Err(error) => {
            // `--help` prints and succeeds; a bad flag prints and exits with 2.
            let _ = error.print();
            ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2))
        }
    }
}
