//! What the test files of sdpa-analysis share.

#![allow(clippy::unwrap_used, dead_code)] // tests: a failed unwrap is a failed test; not every file uses all

use sdpa_analysis::{analyze_path, Options, TraceReport};
use std::path::{Path, PathBuf};

/// Copies a fixture directory to a scratch place (analyses of the TraceLens contract write into it).
pub fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let to = dst.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &to);
        } else {
            std::fs::copy(e.path(), to).unwrap();
        }
    }
}

/// One op with a kernel under it, on an H100.
pub fn op_with_kernel(name: &str, args: &str, kernel: &str, kernel_us: f64) -> String {
    format!(
        r#"{{"ph": "X", "cat": "cpu_op", "name": "{name}", "pid": 1, "tid": 1, "ts": 100, "dur": 50, "args": {args}}},
           {{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 110, "dur": 5, "args": {{"correlation": 1}}}},
           {{"ph": "X", "cat": "kernel", "name": "{kernel}", "pid": 0, "tid": 7, "ts": 200, "dur": {kernel_us}, "args": {{"correlation": 1}}}}"#
    )
}

/// Writes a trace of these events (a JSON list body) recorded on an H100 to a scratch file named after `test`.
pub fn write_trace(test: &str, events: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sdpa-syn-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("t.json");
    let doc = format!(
        r#"{{"deviceProperties": [{{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}}], "traceEvents": [{events}]}}"#
    );
    std::fs::write(&p, doc).unwrap();
    p
}

/// Analyses [`write_trace`]'s trace.
pub fn analyze(test: &str, events: &str) -> TraceReport {
    analyze_path(&write_trace(test, events), &Options::default()).unwrap()
}
