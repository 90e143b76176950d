//! `sdpa report FILES...`: markdown and a self-contained HTML page from benchmark result files.
//!
//! A file named on the command line must read; files found in a directory (walked recursively by the folder
//! rule of `bench/results/README.md`) that are not result files are reported on stderr and left out, unless
//! `--strict`.

use anyhow::{bail, Context, Result};
use sdpa_analysis::results::{page, write_report, Baseline, PeakChoice, ReportOptions, ResultsReport};
use sdpa_core::record::{parse_results, MeasuredPeak};
use sdpa_core::HardwareSpec;
use std::path::{Path, PathBuf};

/// Flags of `sdpa report`.
#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Result files (from `sdpa bench`, `sdpa run --json`, `bench/pytorch_sdpa.py`) or directories of them.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Write report.md, report.html and plots/*.svg into this directory (default: markdown on stdout).
    #[arg(long)]
    out_dir: Option<PathBuf>,
    /// Speedups against this: backend:kernel (e.g. pytorch:flash), backend:best or backend; repeat or
    /// comma-separate to give fallbacks (default: pytorch:best, cuda:unfused, cpu:unfused).
    #[arg(long, value_delimiter = ',')]
    baseline: Vec<String>,
    /// Efficiency against this hardware-table entry (e.g. h100-sxm, zen5-2c, or a driver's device name)
    /// instead of each record's own device.
    #[arg(long, conflicts_with_all = ["peak_tflops", "peak_gbps"])]
    device: Option<String>,
    /// Efficiency against measured ceilings: TFLOP/s for every dtype (767) or per dtype (bf16=767,f32=52).
    #[arg(long)]
    peak_tflops: Option<String>,
    /// Measured memory bandwidth in GB/s, with --peak-tflops.
    // Alone it would judge every row by bandwidth (compute-bound prefill included) and label it memory-bound,
    // which is wrong rather than useful: the roofline needs both ceilings, so clap refuses it alone.
    #[arg(long, requires = "peak_tflops")]
    peak_gbps: Option<f64>,
    /// Page title.
    #[arg(long)]
    title: Option<String>,
    /// Exit non-zero when a record failed its reference check, or when a file found in a directory is not
    /// a readable result file (by default it is reported and left out).
    #[arg(long)]
    strict: bool,
}

/// A file to read: named on the command line (it must read), or found in a directory (reported and left
/// out when it does not, unless --strict).
struct Input {
    path: PathBuf,
    named: bool,
}

/// Directories nest at most this deep (`bench/results/gpu/fa2-report/plots` is 4); a guard, not a limit
/// anyone meets.
const MAX_DEPTH: usize = 16;

/// Expands directories into the result files they hold, keeping files as given.
fn expand(paths: &[PathBuf]) -> Result<Vec<Input>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found = Vec::new();
            walk(p, 0, &mut found)?;
            if found.is_empty() {
                bail!("{} holds no .json result files", p.display());
            }
            out.extend(found.into_iter().map(|path| Input { path, named: false }));
        } else {
            out.push(Input { path: p.clone(), named: true });
        }
    }
    Ok(out)
}

/// The `.json` files under `dir`, sorted, subdirectories included, by the folder rule of
/// `bench/results/README.md`: `NAME-meta.json` beside `NAME.json` is that record's companion (machine,
/// ceilings, load), not a record; `*.spec.json` are sweep specs. Symbolic links to directories are not
/// followed (a link loop would never end).
fn walk(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) -> Result<()> {
    if depth > MAX_DEPTH {
        bail!("{}: directories nested more than {MAX_DEPTH} deep", dir.display());
    }
    let mut entries: Vec<std::fs::DirEntry> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|e| e.ok())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&p, depth + 1, out)?;
            continue;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.ends_with(".json") || name.ends_with(".spec.json") || !p.is_file() {
            continue;
        }
        let companion = name.strip_suffix("-meta.json").is_some_and(|stem| dir.join(format!("{stem}.json")).is_file());
        if !companion {
            out.push(p);
        }
    }
    Ok(())
}

pub fn run(args: ReportArgs) -> Result<()> {
    let peak = match (&args.device, &args.peak_tflops, args.peak_gbps) {
        (Some(d), _, _) => PeakChoice::Tabled(HardwareSpec::find(d).with_context(|| {
            let keys: Vec<&str> = sdpa_core::HARDWARE.iter().map(|h| h.key).collect();
            format!("unknown device `{d}` (table keys: {})", keys.join(", "))
        })?),
        (None, None, None) => PeakChoice::Auto,
        (None, t, g) => {
            let mut m = MeasuredPeak::default();
            if let Some(t) = t {
                m.set_tflops(t).map_err(anyhow::Error::msg)?;
            }
            if let Some(g) = g {
                if !(g.is_finite() && g > 0.0) {
                    bail!("--peak-gbps must be a positive number");
                }
                m.gbps = Some(g);
            }
            PeakChoice::Measured(m)
        }
    };
    let baselines = args.baseline.iter().map(|b| Baseline::parse(b)).collect::<Result<Vec<_>, _>>()?;
    let opts = ReportOptions { title: args.title.clone(), baselines, peak };
    let inputs = expand(&args.files)?;
    let mut files = Vec::new();
    let mut unreadable = 0usize;
    for input in &inputs {
        // A file is good when it parses and its records build a report on their own.
        let read = || -> Result<(String, sdpa_core::record::BenchFile)> {
            let path = &input.path;
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            let name = path.display().to_string();
            let file = parse_results(&text, &name)?;
            let one = [(name, file)];
            ResultsReport::build(&one, &opts).with_context(|| format!("{}", path.display()))?;
            let [one] = one;
            Ok(one)
        };
        match read() {
            Ok(f) => files.push(f),
            Err(e) if input.named || args.strict => return Err(e),
            Err(e) => {
                unreadable += 1;
                eprintln!("sdpa report: skipped {e:#}");
            }
        }
    }
    if files.is_empty() {
        bail!("none of the {} .json files found could be read as result files", inputs.len());
    }
    if unreadable > 0 {
        eprintln!("sdpa report: {unreadable} file(s) skipped, {} read", files.len());
    }
    let report = ResultsReport::build(&files, &opts)?;
    match &args.out_dir {
        Some(dir) => {
            let w = write_report(&report, dir)?;
            eprintln!(
                "sdpa report: {} configurations, {} plots: {} and {}",
                report.groups.len(),
                w.plots.len(),
                w.markdown.display(),
                w.html.display()
            );
        }
        None => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            out.write_all(page::markdown(&report, false).as_bytes())?;
        }
    }
    let failed = report.failed_checks();
    if failed > 0 {
        eprintln!("sdpa report: {failed} record(s) failed their reference check (marked FAIL)");
        if args.strict {
            bail!("{failed} record(s) failed their reference check");
        }
    }
    Ok(())
}
