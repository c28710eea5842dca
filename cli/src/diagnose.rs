//! Names the hop where each stall began, from hop records written by several processes.
//!
//! ```text
//! streamgate diagnose --path HOP1,HOP2,... [--stall-ms MS] [--json] [--plot FILE.svg] \
//!     [--request ID] [--since DURATION] [--max-requests N] [--by KEY[,KEY]] INPUT...
//! ```
//!
//! INPUTs are hop-record files (JSON lines, any hops per file), directories (every file in
//! them whose name has `.json` or `.log` in it, oldest first, so a hop's rotated logs are read
//! in the order they were written), or
//! `-` for standard input. The input is streamed: memory holds a small state per request and
//! hop, never the records.
//!
//! Each hop's quiet spells are measured on its own clock; a stall (a quiet spell of at least
//! `--stall-ms`, default 1000, the time a stream ended in included) is blamed on the hop in
//! `--path` order where it began, or reported as unknown, with why, when a record that would
//! decide it is missing (see `streamgate::timeline`). The report is for people; `--json`
//! prints one JSON object instead. `--plot` draws the longest and mean gap at each output
//! position, per hop, as an SVG; with `--by` naming an attribute, a second chart splits the
//! last hop's gaps by it: each value's gap p99 per output position bucket. Bad input is reported (the first examples, and counts by
//! kind) and skipped.
//!
//! `--by KEY[,KEY]` slices the requests by an attribute their records carry (the proxy's
//! `upstream`, `pool`, `model` and `--record-header`s, sim's `model` and `api`), by `position`
//! or by `length`, or by pairs of two keys: per value, its requests, stalled requests, stall
//! rate, gap p99 at the last hop of `--path` and the hops its stalls began at, the values whose
//! stall rate stands out first (see `streamgate::timeline::Timeline::slice_by`).
//!
//! `--request ID` analyses one request. `--since DURATION` (`500ms`, `90s`, `10m`, `2h`)
//! analyses the last DURATION of each hop's clock in each file: hop records carry per-process
//! monotonic times, which share no origin with each other or with wall-clock time, so the
//! window ends at the latest record of that hop in that file (found in a first pass; not
//! possible on standard input).
//!
//! Exit status: 0 no stalls found, 1 stalls found (unknown ones included), 2 a usage error, no
//! readable input, no record of a hop on `--path` taken (a misspelt hop, a `--request` with no
//! records: the report still says what was read), or output (the report, the plot) that could
//! not be written. Other problems in the input (bad lines, duplicates) do not change it: the
//! report lists them. A closed standard output (`|
//! head`) ends it quietly.

use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use streamgate::probe::DEFAULT_STALL;
use streamgate::timeline::{By, MAX_SLICE_KEYS, ProblemKind, Timeline};

/// `streamgate diagnose`: names the hop where each stall began.
#[derive(Debug, Clone, clap::Args)]
#[command(
    after_help = "Exit status: 0 no stalls found; 1 stalls found (unknown ones included); \
2 a usage error, no readable input, no record of a hop on --path (a misspelt hop), or output that \
could not be written."
)]
pub struct Args {
    /// The hops in order from the generator to the client, comma-separated
    /// (e.g. `worker.publish,worker.write,proxy.recv,proxy.write,client.recv`).
    #[arg(
        long,
        value_name = "HOP1,HOP2,...",
        required = true,
        value_delimiter = ','
    )]
    pub path: Vec<String>,
    /// A quiet spell of at least this many ms is a stall.
    #[arg(long = "stall-ms", value_name = "MS", default_value = crate::flags::millis_text(DEFAULT_STALL), value_parser = crate::flags::millis)]
    pub stall: Duration,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    pub json: bool,
    /// Draw the longest and mean gap at each output position, per hop, as an SVG; with `--by`
    /// naming an attribute, also its values' gap p99 by output position.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<String>,
    /// Analyse this request only.
    #[arg(long, value_name = "ID")]
    pub request: Option<String>,
    /// Analyse the last DURATION (`500ms`, `90s`, `10m`, `2h`) of each hop's clock in each file.
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub since: Option<Duration>,
    /// The most requests held at once (bounds memory on hostile input).
    #[arg(long, value_name = "N", value_parser = crate::flags::positive)]
    pub max_requests: Option<usize>,
    /// Slice the requests by an attribute their records carry (`pool`, `upstream`, `model`, a
    /// `--record-header`), `position` (output position) or `length` (output length); two
    /// keys, comma-separated, slice by pairs (`length,pool`: requests of similar length across
    /// pools). Per value: requests, stalled ones, the stall rate, the gap p99 at the last hop,
    /// and the hops the stalls began at; the rates that stand out first.
    #[arg(long, value_name = "KEY[,KEY]", value_delimiter = ',', value_parser = clap::value_parser!(By))]
    pub by: Vec<By>,
    /// Hop-record files (JSON lines), directories (every file named `*.json*` or `*.log*`,
    /// oldest first), or `-` for stdin.
    #[arg(value_name = "INPUT", required = true)]
    pub inputs: Vec<String>,
}

impl Args {
    /// Parses the flags (without a program name).
    pub fn parse_from<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        crate::flags::parse_from("diagnose", args)
    }

    /// What the flags cannot say by themselves.
    fn check(&mut self) -> Result<(), String> {
        self.path = self
            .path
            .iter()
            .map(|hop| hop.trim().to_owned())
            .filter(|hop| !hop.is_empty())
            .collect();
        if self.path.is_empty() {
            return Err("--path names no hop".into());
        }
        if self.path.len() > streamgate::timeline::MAX_PATH {
            return Err(format!(
                "--path has at most {} hops",
                streamgate::timeline::MAX_PATH
            ));
        }
        for (i, hop) in self.path.iter().enumerate() {
            if self.path[..i].contains(hop) {
                return Err(format!("--path names {hop} twice"));
            }
        }
        if self.by.len() > MAX_SLICE_KEYS {
            return Err(format!("--by takes at most {MAX_SLICE_KEYS} keys"));
        }
        for (i, key) in self.by.iter().enumerate() {
            if self.by[..i].contains(key) {
                return Err(format!("--by names {key} twice"));
            }
        }
        if self.inputs.is_empty() {
            return Err("no input given (files, directories, - for stdin)".into());
        }
        let stdin = self.inputs.iter().filter(|i| *i == "-").count();
        if stdin > 1 {
            return Err("- (stdin) given twice".into());
        }
        if stdin == 1 && self.since.is_some() {
            return Err("--since reads its input twice (to find where each hop's clock ends): it cannot read stdin".into());
        }
        Ok(())
    }
}

/// `500ms`, `90s`, `10m`, `2h`.
fn duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration like 500ms, 90s, 10m, 2h"))?;
    let unit_ms = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(format!("`{text}` needs a unit: ms, s, m or h")),
    };
    Ok(Duration::from_millis(number.saturating_mul(unit_ms)))
}

/// One input to read.
enum Input {
    Stdin,
    File(PathBuf),
}

impl Input {
    fn name(&self) -> String {
        match self {
            Input::Stdin => "-".into(),
            Input::File(path) => path.display().to_string(),
        }
    }
}

/// Whether a file in a directory holds hop records by its name: `.json` or `.log` in it
/// (`hops.jsonl`, `hops.jsonl.1`, `worker.log`), so the plot or a README beside them is not read.
fn holds_records(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.contains(".json") || name.contains(".log"))
}

/// The record files of a directory, oldest first (then by name).
fn directory(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        // Follows symlinks; subdirectories are not read.
        if let Ok(meta) = std::fs::metadata(&path) {
            if meta.is_file() && holds_records(&path) {
                let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                files.push((modified, path));
            }
        }
    }
    files.sort();
    Ok(files.into_iter().map(|(_, path)| path).collect())
}

/// Runs the command with `args` (without the program name), reading `-` from `stdin`, the
/// report to `out` and messages to `err`; returns the exit status.
pub fn run(mut args: Args, stdin: impl Read, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    if let Err(error) = args.check() {
        let _ = writeln!(err, "diagnose: {error}");
        return 2;
    }
    let mut timeline = Timeline::new(args.path.iter().cloned(), args.stall);
    if let Some(id) = &args.request {
        timeline = timeline.request(id.clone());
    }
    if !args.by.is_empty() {
        timeline = timeline.slice_by(args.by.iter().cloned());
    }
    // The plot split by the first attribute of --by: that attribute by output position, a
    // slicing of its own unless --by is just that.
    let split = args.plot.as_ref().and_then(|_| {
        let key = args.by.iter().find(|by| matches!(by, By::Attr(_)))?;
        Some([By::Position, key.clone()])
    });
    let split_own = split.as_ref().is_some_and(|split| args.by != split[..]);
    if let (Some(split), true) = (&split, split_own) {
        timeline = timeline.slice_by(split.iter().cloned());
    }
    if let Some(n) = args.max_requests {
        timeline = timeline.max_requests(n);
    }
    let mut inputs = Vec::new();
    for input in &args.inputs {
        if input == "-" {
            inputs.push(Input::Stdin);
            continue;
        }
        let path = PathBuf::from(input);
        if path.is_dir() {
            match directory(&path) {
                Ok(files) => inputs.extend(files.into_iter().map(Input::File)),
                Err(error) => {
                    let _ = writeln!(err, "diagnose: {input}: {error}");
                    timeline.add_problem(ProblemKind::Unreadable, input, &error.to_string());
                }
            }
        } else {
            inputs.push(Input::File(path));
        }
    }
    let mut read = 0;
    let mut stdin = Some(stdin);
    for input in &inputs {
        let name = input.name();
        let result = match input {
            Input::Stdin => match stdin.take() {
                Some(stdin) => timeline.read(&name, stdin),
                None => continue,
            },
            Input::File(path) => match File::open(path) {
                Ok(file) => match args.since {
                    Some(window) => timeline.read_last(&name, file, window),
                    None => timeline.read(&name, file),
                },
                Err(error) => {
                    timeline.add_problem(ProblemKind::Unreadable, &name, &error.to_string());
                    Err(error)
                }
            },
        };
        match result {
            Ok(()) => read += 1,
            Err(error) => {
                let _ = writeln!(err, "diagnose: {name}: {error}");
            }
        }
    }
    if read == 0 {
        let _ = writeln!(err, "diagnose: no readable input");
        return 2;
    }
    let mut diagnosis = timeline.diagnose();
    let split = match (&split, split_own) {
        (Some(_), true) => diagnosis.slices.pop(),
        (Some(_), false) => diagnosis.slices.first().cloned(),
        (None, _) => None,
    };
    let missing: Vec<&str> = diagnosis
        .hops
        .iter()
        .filter(|hop| hop.records == 0)
        .map(|hop| hop.hop.as_str())
        .collect();
    let status = if !missing.is_empty() {
        // A hop with nothing analysed is no clean bill of health (a misspelt hop on --path, a
        // wrong --request): the verdicts next to it were reached without it.
        let _ = writeln!(
            err,
            "diagnose: no record of {} on --path was taken (a misspelt hop? see the problems below)",
            missing.join(", ")
        );
        2
    } else if diagnosis.has_stalls() {
        1
    } else {
        0
    };
    let mut out = BufWriter::new(out);
    let mut written = if args.json {
        diagnosis.write_json(&mut out).and_then(|()| writeln!(out))
    } else {
        diagnosis.write_report(&mut out)
    };
    if let (Ok(()), Some(file)) = (&written, &args.plot) {
        if let Err(error) = crate::plot::plot(&diagnosis, split.as_ref(), file) {
            let _ = writeln!(err, "diagnose: plotting {file}: {error}");
            return 2;
        }
        if !args.json {
            written = writeln!(out, "gap by output position written to {file}");
        }
    }
    match written.and_then(|()| out.flush()) {
        Ok(()) => status,
        // A reader that stopped early (`| head`) wanted no more.
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => status,
        Err(error) => {
            let _ = writeln!(err, "diagnose: writing the report: {error}");
            2
        }
    }
}

/// Runs `diagnose` on the process's standard streams.
pub fn main(args: Args) -> ExitCode {
    let status = run(
        args,
        io::stdin().lock(),
        &mut io::stdout().lock(),
        &mut io::stderr().lock(),
    );
    ExitCode::from(status)
}
