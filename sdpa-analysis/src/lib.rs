//! sdpa-analysis: where attention time goes in a PyTorch profiler trace, and what to do about it.
//!
//! Reads kineto Chrome traces (`.json` or `.json.gz`, one file or a directory of per-rank files) in one
//! streaming pass ([`trace`]), builds the CPU op tree and ties every GPU kernel to the op that launched it
//! ([`tree`]), finds fused attention (SDPA and its backends, flash-attn, backward ops) and unfused eager
//! attention (matmul, scale, mask, softmax, matmul) ([`attention`]), models each op against the device
//! ([`perf`], using `sdpa_core::cost`), and writes findings with Path A / Path B advice and a replay
//! ([`findings`], [`replay`]). Renderers in [`render`] print the [`report::Report`] as text, markdown and
//! CSV; it serialises to JSON with serde. [`tracelens`] reads and writes the TraceLens-style directory
//! contract.
//!
//! **sdpa-analysis never launches a kernel**: it only reads traces and benchmark records.
//!
//! ```no_run
//! use sdpa_analysis::{analyze_path, Options};
//!
//! let report = analyze_path("trace.json.gz".as_ref(), &Options::default())?;
//! println!("attention: {:.1} % of GPU time", report.summary.attention_share * 100.0);
//! for f in &report.findings {
//!     println!("[{}] {}", f.severity.name(), f.title);
//! }
//! # Ok::<(), sdpa_analysis::AnalysisError>(())
//! ```
//!
//! Replays use [`replay::ReplaySpec`], the JSON file `sdpa bench --spec` reads.

pub mod analyze;
pub mod attention;
pub mod bench_report;
pub mod bench_results;
pub mod error;
pub mod findings;
pub mod perf;
pub mod render;
pub mod replay;
pub mod report;
pub mod trace;
pub mod tracelens;
pub mod tree;

pub use analyze::{analyze_path, analyze_traces, Options};
pub use error::{AnalysisError, Result};
pub use replay::{Replay, ReplaySpec};
pub use report::Report;
