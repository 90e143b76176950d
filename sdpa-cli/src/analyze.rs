//! `sdpa analyze`: attention findings from a PyTorch profiler trace (or a TraceLens output directory), as text,
//! JSON, markdown, CSV or an HTML page; `--diff BEFORE AFTER` compares two analyses op by op.

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use sdpa_analysis::trace::diff::{self, TraceDiff};
use sdpa_analysis::trace::kineto::Progress;
use sdpa_analysis::trace::printers;
use sdpa_analysis::trace::tracelens;
use sdpa_analysis::{analyze_path, Options};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Flags of `sdpa analyze`.
#[derive(Debug, Args)]
pub struct AnalyzeArgs {
    /// Trace file (`.json` or `.json.gz`) or a directory of per-rank trace files.
    pub path: Option<PathBuf>,
    /// Print the report as one JSON object instead of the summary.
    #[arg(long)]
    pub json: bool,
    /// Write the findings markdown to FILE.
    #[arg(long, value_name = "FILE")]
    pub md: Option<PathBuf>,
    /// Write one CSV row per attention op to FILE.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// TraceLens-style directory: reads DIR/category_data/sdpa_fwd_ops.csv and
    /// DIR/metadata/sdpa_fwd_metadata.json (unless PATH is given, then the trace is analysed instead) and
    /// writes DIR/category_findings/sdpa_fwd_findings.md.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
    /// Device to judge efficiency against, overriding the trace (`h100-sxm`, `a100-80gb`, or a name).
    #[arg(long, value_name = "KEY")]
    pub device: Option<String>,
    /// Our benchmark results (`sdpa bench --out`, `sdpa run --json`, the PyTorch scripts): measured
    /// unfused-vs-fused speedups for Path A and the times measured on a trace's exact shape.
    #[arg(long, value_name = "FILE", num_args = 1..)]
    pub bench_results: Vec<PathBuf>,
    /// With a directory PATH: fail on the first trace file that cannot be read, instead of reporting it
    /// (on stderr and in the report) and analysing the others.
    #[arg(long)]
    pub strict: bool,
    /// Write one self-contained HTML page to FILE: the summary, a per-layer timeline of the attention calls,
    /// efficiency against sequence length with each op's expected band, and the findings with their replays
    /// (with --diff: the comparison and both timelines).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Compare two analyses: attention ops matched by module, pass, shape and dtype, with time and efficiency
    /// deltas, and the ops that appeared or disappeared. Each of BEFORE and AFTER is a trace file or a
    /// directory of per-rank traces; --json, --md and --html print the comparison.
    #[arg(long, num_args = 2, value_names = ["BEFORE", "AFTER"], conflicts_with_all = ["path", "output_dir", "csv"])]
    pub diff: Option<Vec<PathBuf>>,
}

/// Runs the command.
pub fn run(args: AnalyzeArgs) -> Result<()> {
    if let Some(d) = &args.device {
        if sdpa_core::HardwareSpec::find(d).is_none() {
            let keys: Vec<&str> = sdpa_core::HARDWARE.iter().map(|h| h.key).collect();
            bail!("--device `{d}` is not in the hardware table (known: {})", keys.join(", "));
        }
    }
    let bench = sdpa_analysis::results::evidence::load(&args.bench_results)?;
    let bar = progress_bar();
    if let Some(pair) = &args.diff {
        return run_diff(&args, pair, bench, &bar);
    }
    let progress = progress_of(&bar, None);
    let opts = Options { device: args.device.clone(), bench, progress, strict: args.strict };
    let report = match (&args.path, &args.output_dir) {
        (Some(p), _) => analyze_path(p, &opts)?,
        (None, Some(dir)) => tracelens::analyze_dir(dir, &opts)?,
        (None, None) => bail!("give a trace PATH, or --output-dir DIR for the TraceLens contract"),
    };
    bar.finish_and_clear();
    for u in &report.unreadable {
        eprintln!("sdpa: warning: {u} (left out of the report)");
    }
    if let Some(dir) = &args.output_dir {
        let out = tracelens::write_findings(dir, &report)?;
        eprintln!("sdpa: wrote {}", out.display());
        // The contract's backward category, when TraceLens wrote one (and no trace was given instead).
        if args.path.is_none() && tracelens::has_category(dir, "sdpa_bwd") {
            let bwd = tracelens::analyze_category(dir, "sdpa_bwd", &opts)?;
            let out = tracelens::write_category_findings(dir, "sdpa_bwd", &bwd)?;
            eprintln!("sdpa: wrote {}", out.display());
        }
    }
    if let Some(f) = &args.md {
        write(f, &printers::markdown::render(&report))?;
    }
    if let Some(f) = &args.csv {
        write(f, &printers::csv::render(&report))?;
    }
    if let Some(f) = &args.html {
        write(f, &printers::html::report(&report))?;
        eprintln!("sdpa: wrote {}", f.display());
    }
    print(args.json, &report, || printers::text::render(&report))
}

/// Prints `value` as JSON, or the text `text` makes, to stdout.
fn print<T: serde::Serialize>(json: bool, value: &T, text: impl FnOnce() -> String) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut stdout, value).context("writing JSON")?;
        writeln!(stdout)?;
    } else {
        stdout.write_all(text().as_bytes())?;
    }
    stdout.flush()?;
    Ok(())
}

/// (bytes read, file size) of each of the two inputs of `--diff`, read at the same time.
type BothRead = Arc<Mutex<[(u64, u64); 2]>>;

/// A progress bar on a terminal (large traces take seconds); hidden when stderr is piped.
fn progress_bar() -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(0);
    if let Ok(style) = ProgressStyle::with_template("{spinner} reading trace {bytes}/{total_bytes} {wide_bar} {eta}") {
        pb.set_style(style);
    }
    pb
}

/// The bytes read so far, as the parser reports them, into the bar. With `slot`, one of two inputs read at the
/// same time: the bar shows both together.
fn progress_of(bar: &ProgressBar, slot: Option<(usize, BothRead)>) -> Option<Progress> {
    if bar.is_hidden() {
        return None;
    }
    let pb = bar.clone();
    Some(Arc::new(move |done, total| match &slot {
        None => {
            pb.set_length(total);
            pb.set_position(done);
        }
        Some((i, both)) => {
            if let Ok(mut b) = both.lock() {
                b[*i] = (done, total);
                pb.set_length(b[0].1 + b[1].1);
                pb.set_position(b[0].0 + b[1].0);
            }
        }
    }))
}

/// `--diff BEFORE AFTER`: both inputs analysed at once (two threads), then compared.
fn run_diff(args: &AnalyzeArgs, pair: &[PathBuf], bench: Vec<sdpa_core::BenchRecord>, bar: &ProgressBar) -> Result<()> {
    let [before, after] = pair else { bail!("--diff takes two inputs: BEFORE AFTER") };
    let both: BothRead = Arc::new(Mutex::new([(0, 0); 2]));
    let opts = |i: usize| Options {
        device: args.device.clone(),
        bench: bench.clone(),
        progress: progress_of(bar, Some((i, both.clone()))),
        strict: args.strict,
    };
    let (ob, oa) = (opts(0), opts(1));
    let (rb, ra) = diff::analyze_both(before, after, [&ob, &oa])?;
    bar.finish_and_clear();
    for (side, r) in [("before", &rb), ("after", &ra)] {
        for u in &r.unreadable {
            eprintln!("sdpa: warning: {side}: {u} (left out of the report)");
        }
    }
    let d = TraceDiff::new(&rb, &ra);
    if let Some(f) = &args.md {
        write(f, &printers::diff::markdown(&d))?;
    }
    if let Some(f) = &args.html {
        write(f, &printers::html::diff(&d, &rb, &ra))?;
        eprintln!("sdpa: wrote {}", f.display());
    }
    print(args.json, &d, || printers::diff::text(&d))
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}
