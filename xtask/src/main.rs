//! Project chores, reached as `cargo xtask <task>` through `.cargo/config.toml`: `bench`, `gpu-bundle`, `tidy`.
//!
//! One module per task; tasks that measure write JSON.

use anyhow::{bail, Result};
use std::path::PathBuf;
use std::process::ExitCode;

mod bench;
mod gpu_bundle;
mod tidy;

const HELP: &str = "\
cargo xtask <task> [args]

tasks:
  help          this text
  bench         quick benchmark sweep (CPU, GPU when present, PyTorch when importable) + report in target/bench/
  gpu-bundle    release binaries + run-gpu.sh for the GPU machine, in gpu-bundle/
  tidy          checks that ARCHITECTURE.md's crate dependencies match the Cargo.toml files and that every
                module under a crate's src/ starts with a `//!` doc
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<()> {
    let Some((task, rest)) = args.split_first() else {
        print!("{HELP}");
        return Ok(());
    };
    match task.as_str() {
        "bench" => bench::run(rest),
        "gpu-bundle" => gpu_bundle::run(rest),
        "tidy" => tidy::run(rest),
        "help" | "--help" | "-h" => {
            print!("{HELP}");
            Ok(())
        }
        other => bail!("unknown task `{other}`\n{HELP}"),
    }
}

/// The repository root (the parent of this crate's directory).
pub fn project_root() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    dir.parent().map(PathBuf::from).unwrap_or(dir)
}
