//! The one error type of sdpa-analysis. Every variant names the file it is about; parse errors also say
//! where in the file (byte offset of the decompressed JSON, line and column) things went wrong.

use std::path::PathBuf;

/// Result alias of this crate.
pub type Result<T, E = AnalysisError> = std::result::Result<T, E>;

/// Everything that can go wrong while reading and analysing a trace.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AnalysisError {
    /// The file could not be opened or read (missing, permissions, a directory with no traces).
    #[error("{path}: {what}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done, e.g. "cannot open".
        what: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// The gzip stream is damaged or cut short.
    #[error("{path}: corrupt or truncated gzip data after {offset} decompressed bytes")]
    Gzip {
        /// The file.
        path: PathBuf,
        /// Decompressed bytes read before the failure.
        offset: u64,
        /// flate2's error.
        #[source]
        source: std::io::Error,
    },

    /// The JSON is malformed, truncated or not a trace.
    #[error("{path}: invalid trace JSON at byte {offset} (line {line}, column {column}): {message}")]
    Json {
        /// The file.
        path: PathBuf,
        /// Byte offset in the (decompressed) JSON where the parser stopped.
        offset: u64,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message.
        message: String,
    },

    /// The input parsed but cannot be used (no events, an unreadable TraceLens CSV, a bad bench record).
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the offending value.
        message: String,
    },
}

impl AnalysisError {
    pub(crate) fn io(path: impl Into<PathBuf>, what: impl Into<String>, source: std::io::Error) -> Self {
        AnalysisError::Io { path: path.into(), what: what.into(), source }
    }

    #[allow(dead_code)] // used by the TraceLens and bench-record readers
    pub(crate) fn invalid(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        AnalysisError::Invalid { path: path.into(), message: message.into() }
    }
}

impl From<AnalysisError> for sdpa_core::SdpaError {
    /// Callers that work in `SdpaError` get the analysis error as a boxed source.
    fn from(e: AnalysisError) -> Self {
        sdpa_core::SdpaError::Backend { backend: "analysis", context: "trace analysis".into(), source: Box::new(e) }
    }
}
