//! The trace face: where attention time goes in a PyTorch profiler trace, and what to do about it.
//!
//! The pipeline ([`analyze`]) reads kineto Chrome traces in one streaming pass ([`kineto`]), builds the CPU
//! op tree and ties every GPU kernel to the op that launched it ([`tree`]), finds fused (SDPA, flash-attn,
//! FlexAttention, varlen and paged serving kernels) and unfused attention with its mask, window, softcap and
//! ALiBi ([`attention`]), models each op against the device ([`perf`], through `sdpa_core::cost`), leaves out values outside physical bounds ([`plausible`]),
//! judges it against the best known rate ([`frontier`]), backward against forward ([`balance`]), decoding by
//! bytes and launch gaps ([`decode`]) and in [`findings`], with a [`replay`] per finding as a `BenchSpec`, and
//! collects everything in a [`TraceReport`] ([`report`], with a per-layer [`timeline`] of the calls), which
//! [`printers`] print as text, markdown, CSV and an HTML page; [`diff`] compares two reports
//! (`sdpa analyze --diff`). A directory of per-rank traces adds each rank's attention time, the imbalance
//! across ranks and the communication that attention kernels hide ([`ranks`]). [`tracelens`] reads
//! and writes the TraceLens-style directory contract.

pub mod analyze;
pub mod attention;
pub mod balance;
pub mod decode;
pub mod diff;
pub mod findings;
pub mod frontier;
pub mod kineto;
pub mod perf;
pub mod plausible;
pub mod printers;
pub mod ranks;
pub mod replay;
pub mod report;
pub mod timeline;
pub mod tracelens;
pub mod tree;

pub use analyze::{analyze_path, analyze_traces, Options};
pub use replay::Replay;
pub use report::TraceReport;
