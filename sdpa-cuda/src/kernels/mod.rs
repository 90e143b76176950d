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
use crate::checked::params::{mask_suffix, MASK_CAUSAL, MASK_EXPLICIT, MASK_NONE};
use crate::sys::program::Program;
use policy::Launcher;
use sdpa_core::{Kernel, Result};

/// The mask kinds every tensor-core family instantiates (`params::MASK_*`).
pub const MASK_KINDS: [i32; 3] = [MASK_NONE, MASK_CAUSAL, MASK_EXPLICIT];

/// The kernel-side constant of `mask_kind` under a family's prefix: `FA2_MASK_CAUSAL`, `TC_MASK_NONE`.
pub fn mask_const(family: &str, mask_kind: i32) -> String {
    format!("{family}_MASK_{}", mask_suffix(mask_kind).to_ascii_uppercase())
}

/// Every program any launch can ask for: each family's instantiations, the unfused path's module and the
/// L2 flush. The compile check (CI) builds all of them; `sdpa warmup --all` loads all of them.
pub fn all_programs() -> Vec<Program> {
    let mut all = vec![unfused::program(), crate::backend::l2_flush_program()];
    all.extend(fa1::programs());
    all.extend(fa2::programs());
    all.extend(splitkv::programs());
    all.extend(tf32::programs());
    all
}

/// The programs a call would launch on the launcher [`policy::choose`] picks (what a warm-up compiles):
/// the same planning as [`dispatch`], without launching.
pub fn programs_for(call: &Call<'_>) -> Result<Vec<Program>> {
    let tensor_cores = policy::tensor_core_limit(call.spec, &call.params).is_none();
    Ok(match policy::choose(call.opts.kernel, call.spec, call.opts, tensor_cores)? {
        Launcher::Unfused => vec![unfused::program()],
        Launcher::Fa1 => vec![fa1::plan(call)?.0],
        Launcher::Tf32 => vec![tf32::plan(call)?.program],
        Launcher::Fa2 => vec![fa2::plan(call)?.0],
        Launcher::SplitKv => vec![splitkv::plan(call)?.program],
    })
}

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
