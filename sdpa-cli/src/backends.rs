//! Opening a backend by name, for every subcommand that runs kernels.

use anyhow::{bail, Result};
use sdpa_core::{HostBackend, ReferenceBackend};

/// Backend names accepted on the command line.
pub const BACKENDS: [&str; 3] = ["reference", "cpu", "cuda"];

/// Opens `name`; `threads` applies to CPU backends (None = rayon's global pool / `RAYON_NUM_THREADS`).
pub fn open_backend(name: &str, threads: Option<usize>) -> Result<Box<dyn HostBackend>> {
    match name {
        "reference" => Ok(Box::new(ReferenceBackend)),
        "cpu" => {
            let _ = threads;
            bail!("backend cpu is not built yet")
        }
        "cuda" => bail!("backend cuda is not built yet"),
        other => bail!("unknown backend `{other}` (expected one of: {})", BACKENDS.join(", ")),
    }
}
