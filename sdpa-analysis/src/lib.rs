//! sdpa-analysis: attention findings from PyTorch profiler traces.
pub mod attention;
pub mod error;
pub mod trace;
pub mod tree;

pub use error::{AnalysisError, Result};
