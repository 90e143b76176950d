//! `sdpa report FILES...`: markdown and a self-contained HTML page from benchmark result files.

use anyhow::{bail, Context, Result};
use sdpa_analysis::results::{page, write_report, Baseline, PeakChoice, ReportOptions, ResultsReport};
use sdpa_core::record::{parse_results, MeasuredPeak};
use sdpa_core::HardwareSpec;
use std::path::PathBuf;

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
    #[arg(long)]
    peak_gbps: Option<f64>,
    /// Page title.
    #[arg(long)]
    title: Option<String>,
    /// Exit non-zero when a record failed its reference check.
    #[arg(long)]
    strict: bool,
}

/// Expands directories into the `.json` files they hold (sorted), keeping files as given.
fn expand(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("cannot list {}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "json") && !f.to_string_lossy().ends_with(".spec.json"))
                .collect();
            v.sort();
            if v.is_empty() {
                bail!("{} holds no .json result files", p.display());
            }
            out.extend(v);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
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
    let mut files = Vec::new();
    for path in expand(&args.files)? {
        let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let name = path.display().to_string();
        files.push((name.clone(), parse_results(&text, &name)?));
    }
    let opts = ReportOptions { title: args.title.clone(), baselines, peak };
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
