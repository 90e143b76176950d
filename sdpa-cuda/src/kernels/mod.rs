//! Layer 3, the kernels' launchers: one module per kernel family in `sdpa-cuda/kernels/` (same name),
//! each choosing its variant (entry point, tile, grid, shared memory) for a [`crate::Call`] and launching
//! it, and [`policy`], which decides which family runs a call: what `auto` picks and where a requested
//! kernel falls back to another.
//!
//! - [`unfused`]: cuBLAS Q·Kᵀ, the softmax kernel, cuBLAS P·V.
//! - [`fa1`]: FlashAttention-1, tensor cores for f16/bf16 where it can, SIMT otherwise.
//! - [`fa2`]: FlashAttention-2 on tensor cores, f16/bf16.
//! - [`splitkv`]: flash-decoding on tensor cores, f16/bf16.
//! - [`tf32`]: f32 inputs on tensor cores (kernel `fa2` with TF32 or split-TF32 math).

pub mod fa1;
pub mod fa2;
pub mod policy;
pub mod splitkv;
pub mod tf32;
pub mod unfused;

use crate::checked::call::Call;
use policy::Launcher;
use sdpa_core::{Kernel, Result};

/// Runs the requested kernel on the launcher [`policy::choose`] picks (resolving `auto` and the
/// fallbacks); returns the kernel that ran.
pub fn dispatch(call: &Call<'_>) -> Result<Kernel> {
    let tensor_cores = policy::tensor_core_limit(call.spec, &call.params).is_none();
    let launcher = policy::choose(call.opts.kernel, call.spec, call.opts, tensor_cores)?;
    match launcher {
        Launcher::Unfused => unfused::run(call)?,
        Launcher::Fa1 => fa1::run(call)?,
        Launcher::Tf32 => tf32::run(call)?,
        Launcher::Fa2 => fa2::run(call)?,
        Launcher::SplitKv => splitkv::run(call)?,
    }
    Ok(launcher.kernel())
}
