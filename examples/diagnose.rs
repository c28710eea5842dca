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

use plotters::prelude::*;
use streamgate::timeline::{Diagnosis, Timeline};

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
        if let Err(error) = plot(&diagnosis, file) {
            eprintln!("diagnose: plotting {file}: {error}");
            return ExitCode::FAILURE;
        }
        if !args.json {
            println!("  gap by output position written to {file}");
        }
    }
    ExitCode::SUCCESS
}

/// Gap (ms) at each output position, one colour per hop.
fn plot(diagnosis: &Diagnosis, file: &str) -> Result<(), Box<dyn std::error::Error>> {
    let max_position = diagnosis
        .hops
        .iter()
        .flat_map(|h| h.gaps.iter().map(|g| g.0))
        .max()
        .unwrap_or(0)
        + 1;
    let max_ms = diagnosis
        .hops
        .iter()
        .map(|h| h.max.as_secs_f64() * 1e3)
        .fold(1.0, f64::max)
        * 1.1;
    let root = SVGBackend::new(file, (1000, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("gap by output position, per hop", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0u64..max_position, 0f64..max_ms)?;
    chart
        .configure_mesh()
        .x_desc("output position (visible event)")
        .y_desc("gap (ms)")
        .draw()?;
    for (index, hop) in diagnosis.hops.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        chart
            .draw_series(hop.gaps.iter().map(|&(position, gap)| {
                Circle::new((position, gap.as_secs_f64() * 1e3), 2, color.filled())
            }))?
            .label(hop.hop.as_str())
            .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    root.present()?;
    Ok(())
}
