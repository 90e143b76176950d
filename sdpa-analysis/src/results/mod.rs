//! The results face: benchmark reports. `sdpa report FILES...` reads result files written by `sdpa bench`,
//! `sdpa run --json` and `bench/pytorch_sdpa.py` (through `sdpa_core::record::file`, the one reader), and
//! renders markdown and one self-contained HTML page with tables per shape (TFLOP/s, GB/s, efficiency
//! against a tabled or measured peak, speedup against a chosen baseline, the reference check; a backward table
//! against PyTorch's backward, [`backward`]) and SVG plots
//! (TFLOP/s against sequence length per kernel; a roofline per device). [`evidence`] lends the same records
//! to the trace face as evidence for its findings.
//!
//! Records are plain data; [`model`] derives the [`ResultsReport`], [`page`] prints it as markdown and HTML,
//! [`plots`] draws its SVG figures.
//!
//! ```
//! use sdpa_analysis::results::{page, ResultsReport, ReportOptions};
//! use sdpa_core::record::parse_results;
//! let text = r#"{"backend":"cpu","kernel":"fa2","device":"test","dtype":"f32",
//!   "shape":{"b":1,"hq":8,"hkv":8,"sq":512,"sk":512,"d":64,"dv":64},"mask":"none",
//!   "time_ms":{"median":2.0,"min":1.9,"max":2.5,"reps":10},"tflops":0.0,"gbps":0.0}"#;
//! let file = parse_results(text, "one.json").unwrap();
//! let report = ResultsReport::build(&[("one.json".to_string(), file)], &ReportOptions::default()).unwrap();
//! assert!(page::markdown(&report, false).contains("| cpu | fa2 |"));
//! ```

pub mod backward;
pub mod evidence;
pub mod model;
pub mod page;
pub mod plots;
pub mod serving;

pub use model::{Baseline, PeakChoice, ReportOptions, ResultsReport};

use std::path::Path;

/// What can go wrong reading results or building a report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// A result file could not be parsed (core's reader says which and why).
    #[error(transparent)]
    Parse(#[from] sdpa_core::SdpaError),
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
pub fn write_report(report: &ResultsReport, dir: &Path) -> Result<Written, ReportError> {
    let io = |p: &Path| {
        let path = p.display().to_string();
        move |source| ReportError::Io { path, source }
    };
    std::fs::create_dir_all(dir.join("plots")).map_err(io(&dir.join("plots")))?;
    let mut plots = Vec::new();
    for (rel, svg) in page::svg_files(report) {
        let p = dir.join(&rel);
        std::fs::write(&p, svg).map_err(io(&p))?;
        plots.push(p);
    }
    let md = dir.join("report.md");
    std::fs::write(&md, page::markdown(report, true)).map_err(io(&md))?;
    let html = dir.join("report.html");
    std::fs::write(&html, page::html(report)).map_err(io(&html))?;
    Ok(Written { markdown: md, html, plots })
}
