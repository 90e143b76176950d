//! `sdpa`: run, benchmark and analyse scaled dot-product attention.
//!
//! Each subcommand lives in its own module; flags are parsed by clap into an args struct, validated into a
//! config, and results are plain data printed by separate human and JSON printers.

// The doc comments on flags are clap's `--help` text (`B,Hq,Hkv,Sq,Sk,D[,Dv]`, `bench-<date>.json`), written
// for a terminal, not for rustdoc's link and HTML syntax.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

mod analyze;
mod backends;
mod backward;
mod bench;
mod cache;
mod devices;
mod measure;
mod peak_memory;
mod report;
mod run;
mod serving;
mod variants;
mod warmup;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Scaled dot-product attention: fused CPU and CUDA kernels, benchmarks and trace analysis.
#[derive(Debug, Parser)]
#[command(name = "sdpa", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one attention call (forward, backward or both) on a backend, time it, and optionally check it
    /// against the f64 reference.
    Run(run::RunArgs),
    /// List the backends present, the CPU's SIMD features and the GPUs found (or why none).
    Devices(devices::DevicesArgs),
    /// Benchmark a sweep (flags, --preset or --spec) on every backend and kernel, checked against the
    /// reference, with PyTorch side by side when torch is importable; writes JSON records.
    Bench(Box<bench::BenchArgs>),
    /// Render benchmark result files as markdown and a self-contained HTML page with tables and SVG plots.
    Report(report::ReportArgs),
    /// Attention findings from a PyTorch profiler trace: fused/unfused attention, efficiency, what to do.
    Analyze(analyze::AnalyzeArgs),
    /// Compile ahead of time, for the GPU present, the kernel programs a preset, spec or shape list needs
    /// (or --all), in parallel, into the disk cache, so that no first call waits for NVRTC.
    Warmup(warmup::WarmupArgs),
    /// Show the compiled-kernel cache (directory, files, size bound), or empty it with --clear.
    Cache(cache::CacheArgs),
}

/// When `main` started: records report how long a user waited from process start to a first result.
static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Seconds since `main` started (`None` before it did, e.g. in unit tests).
pub fn process_age_s() -> Option<f64> {
    STARTED.get().map(|t| t.elapsed().as_secs_f64())
}

fn main() -> ExitCode {
    STARTED.get_or_init(std::time::Instant::now);
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are not errors; clap prints them and exits 0.
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::Devices(args) => devices::run(args),
        Command::Bench(args) => bench::run(*args),
        Command::Report(args) => report::run(args),
        Command::Analyze(args) => analyze::run(args),
        Command::Warmup(args) => warmup::run(args),
        Command::Cache(args) => cache::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("sdpa: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// A closed pipe (`sdpa ... | head`) is not an error.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().filter_map(|e| e.downcast_ref::<std::io::Error>()).any(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}
