//! Opening a backend by name, for every subcommand that runs kernels.

use anyhow::{bail, Result};
use sdpa_core::{HostBackend, ReferenceBackend};

/// Backend names accepted on the command line.
pub const BACKENDS: [&str; 3] = ["reference", "cpu", "cuda"];

/// Opens `name`; `threads` applies to CPU backends (None = rayon's global pool / `RAYON_NUM_THREADS`);
/// `gpus` above 1 opens ring attention across that many GPUs (cuda only).
pub fn open_backend(name: &str, threads: Option<usize>, gpus: usize) -> Result<Box<dyn HostBackend>> {
    if gpus != 1 {
        if name != "cuda" {
            bail!("--gpus {gpus} needs the cuda backend (ring attention across GPUs), not `{name}`");
        }
        // Never panics without GPUs or NCCL: the error names what is missing.
        return Ok(Box::new(sdpa_cuda::RingBackend::new(gpus)?));
    }
    match name {
        "reference" => Ok(Box::new(ReferenceBackend)),
        "cpu" => Ok(Box::new(sdpa_cpu::CpuBackend::new(threads)?)),
        // Never panics without a GPU: a missing driver or device is an error naming the reason.
        "cuda" => Ok(Box::new(sdpa_cuda::CudaBackend::new(0)?)),
        other => bail!("unknown backend `{other}` (expected one of: {})", BACKENDS.join(", ")),
    }
}
