//! Names the hop where each stall began, from hop records written by several processes.
//!
//! `cargo run --example diagnose -- --path HOP1,HOP2,... [--stall-ms MS] [--json] [--plot FILE.svg] FILES...`
//!
//! FILES are hop-record JSON lines (any number of hops per file). Each hop's gaps are computed
//! on its own clock; a stall (a visible gap of at least `--stall-ms`, default 1000) is blamed on
//! the first hop in `--path` order where it appears while the hop before was regular. The
//! report is for people; `--json` prints one JSON object instead. `--plot` draws the gap at
//! each output position, per hop, as an SVG. Bad lines are reported and skipped.

use std::process::ExitCode;
use std::time::Duration;

use streamgate::timeline::Timeline;

#[allow(dead_code)] // each example uses a part
#[path = "common/mod.rs"]
mod common;

struct Args {
    path: Vec<String>,
    stall: Duration,
    json: bool,
    plot: Option<String>,
    files: Vec<String>,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut parsed = Args {
        path: Vec::new(),
        stall: Duration::from_secs(1),
        json: false,
        plot: None,
        files: Vec::new(),
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--path" => {
                let hops = args
                    .next()
                    .ok_or("--path needs a comma-separated list of hops")?;
                parsed.path = hops
                    .split(',')
                    .map(str::trim)
                    .filter(|h| !h.is_empty())
                    .map(String::from)
                    .collect();
            }
            "--stall-ms" => {
                let ms = args.next().and_then(|ms| ms.parse::<u64>().ok());
                parsed.stall = Duration::from_millis(
                    ms.filter(|ms| *ms > 0)
                        .ok_or("--stall-ms needs a positive number")?,
                );
            }
            "--json" => parsed.json = true,
            "--plot" => parsed.plot = Some(args.next().ok_or("--plot needs a file name")?),
            flag if flag.starts_with("--") => return Err(format!("unknown flag {flag}")),
            file => parsed.files.push(file.to_owned()),
        }
    }
    if parsed.path.is_empty() {
        return Err("--path is required".into());
    }
    if parsed.files.is_empty() {
        return Err("no hop-record files given".into());
    }
    Ok(parsed)
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(error) => {
            eprintln!("diagnose: {error}");
            eprintln!(
                "usage: diagnose --path HOP1,HOP2,... [--stall-ms MS] [--json] [--plot FILE.svg] FILES..."
            );
            return ExitCode::from(2);
        }
    };
    let mut timeline = Timeline::new(args.path.iter().cloned(), args.stall);
    let mut read = 0;
    for file in &args.files {
        match std::fs::read(file) {
            Ok(bytes) => {
                timeline.add_lines(file, &String::from_utf8_lossy(&bytes));
                read += 1;
            }
            Err(error) => eprintln!("diagnose: {file}: {error}"),
        }
    }
    if read == 0 {
        return ExitCode::FAILURE;
    }
    let diagnosis = timeline.diagnose();
    if args.json {
        println!("{}", diagnosis.to_json());
    } else {
        print!("{}", diagnosis.report());
    }
    if let Some(file) = &args.plot {
        if let Err(error) = common::plot(&diagnosis, file) {
            eprintln!("diagnose: plotting {file}: {error}");
            return ExitCode::FAILURE;
        }
        if !args.json {
            println!("  gap by output position written to {file}");
        }
    }
    ExitCode::SUCCESS
}
