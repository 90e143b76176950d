//! The one error type of sdpa-core, shared by every backend through [`SdpaError::Backend`].

use crate::dtype::DType;

/// Result alias used across the workspace's libraries.
pub type Result<T, E = SdpaError> = std::result::Result<T, E>;

/// Everything that can go wrong when describing or running attention.
///
/// "Invalid input" (the caller described something impossible) and "unsupported" (the request is valid but
/// this backend or device cannot run it) are different variants, so callers can fall back on the second
/// and must fix the first.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SdpaError {
    /// The spec or the buffers handed with it describe something impossible.
    #[error("invalid attention spec: {0}")]
    InvalidSpec(String),

    /// A size computation overflowed `usize` (or the 32-bit index range a kernel needs).
    #[error("size overflow while computing {what}")]
    SizeOverflow {
        /// What was being computed, e.g. "length of Q".
        what: String,
    },

    /// A buffer is shorter than the spec's strides require.
    #[error("buffer {name} has {len} elements but the spec needs at least {needed}")]
    BufferTooShort {
        /// Which buffer: "q", "k", "v", "o", "mask", "lse".
        name: &'static str,
        /// Elements present.
        len: usize,
        /// Elements the strides and shape address.
        needed: usize,
    },

    /// A buffer has a different dtype than the spec.
    #[error("buffer {name} is {found} but the spec says {expected}")]
    DTypeMismatch {
        /// Which buffer.
        name: &'static str,
        /// The spec's dtype.
        expected: DType,
        /// The buffer's dtype.
        found: DType,
    },

    /// Valid request that this backend, kernel or device does not support.
    #[error("{backend}: unsupported: {what}")]
    Unsupported {
        /// Backend name, e.g. "cuda".
        backend: &'static str,
        /// What is not supported, with the offending value.
        what: String,
    },

    /// The backend's device is missing or unusable (no driver, no GPU, ...).
    #[error("{backend}: device unavailable: {reason}")]
    DeviceUnavailable {
        /// Backend name.
        backend: &'static str,
        /// Why, in words a user can act on.
        reason: String,
    },

    /// The device ran out of memory for this request.
    #[error("{backend}: out of memory allocating {bytes} bytes for {what}")]
    OutOfMemory {
        /// Backend name.
        backend: &'static str,
        /// Bytes requested.
        bytes: usize,
        /// What the allocation was for.
        what: String,
    },

    /// The request needs more memory than the machine has available (checked before allocating, or an
    /// allocation the allocator refused).
    #[error(
        "not enough memory for {what}: needs {}, {place} has {} available",
        crate::memory::human_bytes(*needed),
        crate::memory::human_bytes(*available)
    )]
    InsufficientMemory {
        /// What the memory is for, e.g. "the inputs Q, K, V".
        what: String,
        /// Bytes needed.
        needed: u64,
        /// Bytes available (0 when unknown).
        available: u64,
        /// "the host" or the GPU's name.
        place: &'static str,
    },

    /// A benchmark result file could not be read as one.
    #[error("{file}: not a benchmark result file: {detail}")]
    ResultFile {
        /// File name as given.
        file: String,
        /// What the parser said.
        detail: String,
    },

    /// Any other backend failure, with the backend's own error as the source.
    #[error("{backend}: {context}")]
    Backend {
        /// Backend name.
        backend: &'static str,
        /// What was being done.
        context: String,
        /// The backend's error (cudarc, NVRTC log, ...); core never names its type.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl SdpaError {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        SdpaError::InvalidSpec(msg.into())
    }

    pub(crate) fn overflow(what: impl Into<String>) -> Self {
        SdpaError::SizeOverflow { what: what.into() }
    }
}
