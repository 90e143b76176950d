//! `sdpa analyze`: attention findings from a PyTorch profiler trace (or a TraceLens output directory).

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use sdpa_analysis::trace::printers;
use sdpa_analysis::trace::tracelens;
use sdpa_analysis::{analyze_path, Options};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

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
    // A progress bar on a terminal (large traces take seconds); nothing when stderr is piped.
    let bar = if std::io::stderr().is_terminal() {
        let pb = ProgressBar::new(0);
        if let Ok(style) =
            ProgressStyle::with_template("{spinner} reading trace {bytes}/{total_bytes} {wide_bar} {eta}")
        {
            pb.set_style(style);
        }
        pb
    } else {
        ProgressBar::hidden()
    };
    let progress: Option<sdpa_analysis::trace::kineto::Progress> = if bar.is_hidden() {
        None
    } else {
        let pb = bar.clone();
        Some(std::sync::Arc::new(move |done, total| {
            pb.set_length(total);
            pb.set_position(done);
        }))
    };
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
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut stdout, &report).context("writing JSON")?;
        writeln!(stdout)?;
    } else {
        stdout.write_all(printers::text::render(&report).as_bytes())?;
    }
    stdout.flush()?;
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}
