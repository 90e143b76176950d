//! What the CLI test files share: running the built `sdpa` binary in a directory, and a fresh scratch
//! directory per test named after the test file, so files running in parallel never meet.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Runs `sdpa ARGS` in `cwd` and returns its output (status, stdout, stderr).
pub fn sdpa(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sdpa")).args(args).current_dir(cwd).output().expect("the sdpa binary runs")
}

/// An empty directory `sdpa-<test file>-<pid>-<name>` under the system temp dir.
pub fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sdpa-{}-{}-{name}", env!("CARGO_CRATE_NAME"), std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}
