//! Benchmark reports: `sdpa report FILES...` reads result files written by `sdpa bench`, `sdpa run --json`
//! and `bench/pytorch_sdpa.py`, and renders markdown and one self-contained HTML page with tables per shape
//! (TFLOP/s, GB/s, efficiency against a tabled or measured peak, speedup against a chosen baseline, the
//! reference check) and SVG plots (TFLOP/s against sequence length per kernel; a roofline per device).
//!
//! Records are plain data; [`model`] derives the figures, [`render`] prints them, [`svg`] draws.
//!
//! ```
//! use sdpa_analysis::bench_report::{parse_results, render, Report, ReportOptions};
//! let text = r#"{"backend":"cpu","kernel":"fa2","device":"test","dtype":"f32",
//!   "shape":{"b":1,"hq":8,"hkv":8,"sq":512,"sk":512,"d":64,"dv":64},"mask":"none",
//!   "time_ms":{"median":2.0,"min":1.9,"max":2.5,"reps":10},"tflops":0.0,"gbps":0.0}"#;
//! let file = parse_results(text, "one.json").unwrap();
//! let report = Report::build(&[("one.json".to_string(), file)], &ReportOptions::default()).unwrap();
//! assert!(render::markdown(&report, false).contains("| cpu | fa2 |"));
//! ```

pub mod model;
pub mod render;
pub mod results;
pub mod svg;

pub use model::{Baseline, MeasuredPeak, PeakChoice, Report, ReportOptions};
pub use results::{parse_results, BenchFile, Skipped, BENCH_FORMAT};

use std::path::Path;

/// What can go wrong reading results or building a report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// A result file could not be parsed.
    #[error("{file}: not a benchmark result file: {detail}")]
    Parse {
        /// File name as given.
        file: String,
        /// What the parser said.
        detail: String,
    },
    /// A record holds impossible values.
    #[error("bad record: {0}")]
    Record(String),
    /// A report option is malformed.
    #[error("{0}")]
    Option(String),
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Files a report wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    /// `report.md`.
    pub markdown: std::path::PathBuf,
    /// `report.html`.
    pub html: std::path::PathBuf,
    /// The SVG files under `plots/`.
    pub plots: Vec<std::path::PathBuf>,
}

/// Writes `report.md`, `report.html` and `plots/*.svg` into `dir` (created when missing).
pub fn write_report(report: &Report, dir: &Path) -> Result<Written, ReportError> {
    let io = |p: &Path| {
        let path = p.display().to_string();
        move |source| ReportError::Io { path, source }
    };
    std::fs::create_dir_all(dir.join("plots")).map_err(io(&dir.join("plots")))?;
    let mut plots = Vec::new();
    for (rel, svg) in render::svg_files(report) {
        let p = dir.join(&rel);
        std::fs::write(&p, svg).map_err(io(&p))?;
        plots.push(p);
    }
    let md = dir.join("report.md");
    std::fs::write(&md, render::markdown(report, true)).map_err(io(&md))?;
    let html = dir.join("report.html");
    std::fs::write(&html, render::html(report)).map_err(io(&html))?;
    Ok(Written { markdown: md, html, plots })
}
