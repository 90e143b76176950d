//! sdpa-analysis: reads what attention did, from two inputs, and says what it means.
//!
//! The crate has two faces, side by side, each with its own model and printers:
//!
//! - [`trace`]: PyTorch profiler traces. Reads kineto Chrome traces (`.json` or `.json.gz`, one file or a
//!   directory of per-rank files) in one streaming pass, ties GPU kernels to the ops that launched them,
//!   finds fused and unfused attention, models each op against the device and the best known rate for it,
//!   writes findings with Path A / Path B advice and a replay ([`trace::TraceReport`], printed by
//!   [`trace::printers`] as text, markdown, CSV or an HTML page), and compares two runs op by op
//!   ([`trace::diff`]). `sdpa analyze`, `sdpa analyze --diff`.
//! - [`results`]: benchmark records (the file format and its reader live in `sdpa_core::record`). Builds
//!   the tables and plots of `sdpa report` ([`results::ResultsReport`], printed by [`results::page`] and
//!   [`results::plots`]), and lends records to the trace face as evidence ([`results::evidence`]).
//!
//! Both faces' pages draw with the same HTML, markdown and SVG pieces ([`render`]).
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
//! Replays use [`sdpa_core::BenchSpec`], the JSON file `sdpa bench --spec` reads.
//!
//! # Where this differs from TraceLens (ANCHORS.md, its known gaps on real traces)
//!
//! - Unfused eager attention is found as attention (matmul -> scale/mask/cast -> softmax -> dropout ->
//!   matmul, with B, H, Sq, Sk, D, and GQA through `repeat_kv`), not split into "GEMM" and "other".
//! - cuDNN's SDPA kernels are attention, and flash-style: the report says flash attention is in use rather
//!   than recommending a migration to it.
//! - Bytes use the real element size (fp32 = 4, fp8 = 1); causal FLOPs count the unmasked pairs exactly
//!   for either alignment and any Sq, Sk (no op is dropped for Sq != Sk).
//! - Backward SDPA ops get the module of their forward call (autograd sequence numbers).
//! - One streaming pass with bounded buffers: `bench/results/analyze/analyze.md` measures 32x less time and 50x
//!   less memory than TraceLens on a 209 MB trace.
//!
//! # Limits
//!
//! - The backward of unfused chains (`BmmBackward0`, `SoftmaxBackward0`, ...) is matched through autograd
//!   sequence numbers; no recorded fixture has an eager training step, so that path is tested on
//!   hand-built traces only.
//! - An explicit mask's values are not in a trace: whether an eager model's additive mask is causal is
//!   reported as unknown.
//! - GPU time is the sum of kernel, copy and set durations; kernels overlapping on several streams count
//!   each.
//! - Attention kernels replayed from a CUDA graph have no shapes (the SDPA op ran at capture time).
//! - Varlen and paged calls: a trace records tensor dims and scalars, never tensor values, so each
//!   sequence's length is unknown unless all are equal; their work is then a stated bound
//!   (`trace::attention::ragged`). FlashAttention's `flash_attn_with_kvcache` and FlashInfer's ops show only
//!   their kernels (no shapes); an FP8 KV cache is costed at the query's element size.
//! - Many ranks: a rank's number comes from the trace's `distributedInfo`. A NCCL kernel's time includes the
//!   time it waits for its peer, so "under attention" says how much of that span overlapped attention kernels,
//!   not how much transfer was hidden; attention kernels are those whose names the analyzer knows.
//! - Implementations are read from kernel names only: a build that renames its kernels (another namespace)
//!   reads as `unknown`.

pub mod error;
pub mod render;
pub mod results;
pub mod trace;

pub use error::{AnalysisError, Result};
pub use trace::{analyze_path, analyze_traces, Options, Replay, TraceReport};
