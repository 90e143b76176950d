//! Errors of the CUDA backend. They reach callers as [`sdpa_core::SdpaError`]: a missing driver or GPU as
//! `DeviceUnavailable`, an allocation failure as `OutOfMemory`, everything else boxed into `Backend` with
//! one of the variants below as its source (so sdpa-core never names cudarc).

use cudarc::driver::DriverError;
use sdpa_core::SdpaError;

/// Backend name used in every error.
pub const BACKEND: &str = "cuda";

/// A failure inside the CUDA backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// A CUDA driver call failed.
    #[error("driver call {call} failed: {source}")]
    Driver {
        /// Which call, e.g. "cuLaunchKernel".
        call: &'static str,
        /// The driver's error code.
        #[source]
        source: DriverError,
    },
    /// A cuBLAS call failed.
    #[error("cuBLAS call {call} failed: {message}")]
    Cublas {
        /// Which call.
        call: &'static str,
        /// cuBLAS status, in words.
        message: String,
    },
    /// NVRTC rejected a kernel program; the compiler log is kept whole.
    #[error("NVRTC could not compile kernel program `{module}` for {arch}: {message}\n--- compiler log ---\n{log}")]
    Compile {
        /// The program: an instantiation's entry point, or a whole module's name (the `.cu` file stem).
        module: String,
        /// Target, e.g. "sm_90".
        arch: String,
        /// NVRTC status.
        message: String,
        /// The compiler's log.
        log: String,
    },
    /// A kernel entry point is missing from its program (a name typo or a wrong instantiation line).
    #[error("kernel `{function}` not found in program `{module}`")]
    MissingKernel {
        /// The program's name.
        module: String,
        /// Entry point name.
        function: String,
    },
    /// A launch configuration exceeds what the device allows.
    #[error("launch of `{function}` exceeds device limits: {what}")]
    LaunchLimits {
        /// Entry point name.
        function: String,
        /// Which limit, with the values.
        what: String,
    },
    /// A library the backend needs (libnvrtc, libcublas) could not be found or loaded.
    #[error("{0}")]
    Library(String),
}

impl CudaError {
    /// Wraps into the workspace error with the operation being performed.
    pub fn into_sdpa(self, context: impl Into<String>) -> SdpaError {
        SdpaError::Backend { backend: BACKEND, context: context.into(), source: Box::new(self) }
    }
}

/// Turns a driver error into the workspace error, recognising out-of-memory.
pub(crate) fn driver<'a>(
    call: &'static str,
    what: &'a str,
    bytes: usize,
) -> impl FnOnce(DriverError) -> SdpaError + 'a {
    move |e: DriverError| {
        if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            SdpaError::OutOfMemory { backend: BACKEND, bytes, what: what.to_string() }
        } else {
            CudaError::Driver { call, source: e }.into_sdpa(what.to_string())
        }
    }
}

/// Shorthand for driver errors where no allocation size applies.
pub(crate) fn drv<'a>(call: &'static str, what: &'a str) -> impl FnOnce(DriverError) -> SdpaError + 'a {
    driver(call, what, 0)
}

/// `DeviceUnavailable` with a reason.
pub(crate) fn unavailable(reason: impl Into<String>) -> SdpaError {
    SdpaError::DeviceUnavailable { backend: BACKEND, reason: reason.into() }
}

/// `Unsupported` with a description.
pub(crate) fn unsupported(what: impl Into<String>) -> SdpaError {
    SdpaError::Unsupported { backend: BACKEND, what: what.into() }
}
