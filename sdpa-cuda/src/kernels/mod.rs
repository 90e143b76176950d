//! Layer 3, the kernels' launchers: one module per kernel family in `sdpa-cuda/kernels/` (same name),
//! each choosing its variant (entry point, tile, grid, shared memory) for a [`crate::Call`] and launching
//! it, and [`policy`], which decides which family runs a call: what `auto` picks and where a requested
//! kernel falls back to another.
//!
//! - [`unfused`]: cuBLAS Q·Kᵀ, the softmax kernel, cuBLAS P·V.
//! - [`fa1`]: FlashAttention-1, tensor cores for f16/bf16 where it can, SIMT otherwise.
//! - [`fa2`]: FlashAttention-2 on tensor cores, f16/bf16 ([`pad_copy`]: its odd head dims through aligned
//!   scratch).
//! - [`fa3`]: the Hopper forward (sm_90a: TMA, `wgmma`, warp specialisation), f16/bf16.
//! - [`splitkv`]: flash-decoding on tensor cores, f16/bf16 ([`splitkv_mla`]: at MLA's 576/512 on sm_90).
//! - [`tf32`]: f32 inputs on tensor cores (kernel `fa2` with TF32 or split-TF32 math).
//! - [`bwd`]: the backward pass on tensor cores, f16/bf16 ([`bwd_pad`]: its odd head dims and misaligned
//!   views through aligned scratch, with [`pad_copy`]'s pieces).
//! - [`wide`]: f16/bf16 at head dims above 256, query slabs of cuBLAS products around unfused's softmax.

pub mod bwd;
pub mod bwd_pad;
pub mod fa1;
pub mod fa2;
pub mod fa3;
pub mod pad_copy;
pub mod paged_append;
pub mod policy;
pub mod splitkv;
pub mod splitkv_mla;
pub mod tf32;
pub mod unfused;
pub mod wide;

use crate::checked::call::Call;
use crate::checked::params::{mask_suffix, MASK_CAUSAL, MASK_EXPLICIT, MASK_NONE};
use crate::sys::program::Program;
use policy::Launcher;
use sdpa_core::{Kernel, Result};

/// The plain mask kinds (`params::MASK_*`); the tf32 family instantiates these only, the others every
/// [`Masking`](crate::checked::params::Masking).
pub const MASK_KINDS: [i32; 3] = [MASK_NONE, MASK_CAUSAL, MASK_EXPLICIT];

/// The kernel-side constant of `mask_kind` under a family's prefix: `FA2_MASK_CAUSAL`, `TC_MASK_NONE`.
pub fn mask_const(family: &str, mask_kind: i32) -> String {
    format!("{family}_MASK_{}", mask_suffix(mask_kind).to_ascii_uppercase())
}

/// The read pass of the clean L2 flush before timed calls (`crate::backend::L2Flush::Clean`):
/// `kernels/l2_flush.cu`, compiled whole.
pub fn l2_flush_program() -> Program {
    Program::whole(&crate::sys::modules::L2_FLUSH)
}

/// Every program any launch can ask for: each family's instantiations, the unfused path's module and the
/// L2 flush. The compile check (CI) builds all of them; `sdpa warmup --all` loads all of them.
pub fn all_programs() -> Vec<Program> {
    let mut all = vec![
        unfused::program(),
        l2_flush_program(),
        paged_append::program(),
        pad_copy::program(),
        crate::ring::kernels::program(),
    ];
    all.extend(fa1::programs());
    all.extend(fa2::programs());
    all.extend(fa3::programs());
    all.extend(splitkv::programs());
    all.extend(splitkv_mla::programs());
    all.extend(tf32::programs());
    all.extend(bwd::programs());
    all
}

/// What the CI compile check (`tests/nvrtc_compile.rs`) builds: every plain program, and the variant programs
/// ([`Masking::variants`](crate::checked::params::Masking::variants), names with `band`) of one dtype and head-dim
/// class per family (bf16 at exactly 128: every tile and load path of fa2, splitkv and fa1m). The variant code is the
/// same template code in every class and dtype, and all of them would multiply the check's time (11 maskings instead of
/// 3); the GPU tests compile and run the others they reach. `fa2`'s ragged programs ([`is_fa2_ragged`]) enter once more
/// narrowly: bf16 at exactly 128 on the full-grid tile (the tiles differ in constants only). The backward's programs
/// enter as [`bwd::compile_check_programs`] lists them (six of them), `fa3`'s as one per head-dim class
/// ([`fa3::compile_check_programs`]: within a class they differ in constants and dtype only).
pub fn compile_check_programs() -> Vec<Program> {
    let bwd_check = bwd::compile_check_programs();
    let fa3_check = fa3::compile_check_programs();
    all_programs()
        .into_iter()
        .filter(|p| {
            if p.module.name == crate::sys::modules::BWD.name {
                bwd_check.contains(p)
            } else if p.module.name == crate::sys::modules::FA3.name {
                fa3_check.contains(p)
            } else if is_fa2_ragged(p) {
                p.name.starts_with("fa2_bf16_128_")
            } else {
                !p.name.contains("_band") || p.name.contains("_bf16_128_")
            }
        })
        .collect()
}

/// Whether a program is one of `fa2`'s ragged-batch instantiations ([`fa2::Serve`]: names end `_varlen` or
/// `_paged`).
pub fn is_fa2_ragged(p: &Program) -> bool {
    p.module.name == crate::sys::modules::FA2.name && (p.name.ends_with("_varlen") || p.name.ends_with("_paged"))
}

/// `fa3`'s plan of the call when `auto` may pick `fa3` and `fa3` takes the call on its device, else `None`
/// (only planned when `auto` may pick it: f16/bf16 with the default kernel, unless `SDPA_AUTO_FA3=0`;
/// [`fa3::plan`] checks the device, the spec and the operands' tensor maps). Dispatch hands the plan on to
/// [`fa3::run`], so a call `auto` sends to `fa3` is planned once.
fn auto_fa3_plan(call: &Call<'_>) -> Option<fa3::Plan> {
    let candidate = call.opts.kernel == Kernel::Auto
        && policy::auto_fa3_enabled()
        && policy::fa3_measured_faster(call.spec)
        && call.dev.info().compute_capability == (9, 0)
        && fa3::refuses(call.spec).is_none();
    candidate.then(|| fa3::plan(call).ok()).flatten()
}

/// Whether `splitkv`'s MLA path takes the call on its device ([`splitkv_mla::refuses`]), unless
/// `SDPA_SPLITKV_MLA=0` ([`policy::mla_enabled`]). A ragged call at its head dims asking for `auto` or `splitkv`
/// that it refuses is an error with its reason here: no other kernel runs those, and the policy's refusal would
/// only list the conditions.
fn mla_takes(call: &Call<'_>, optin: usize) -> Result<bool> {
    let s = call.spec.shape;
    let why = if policy::mla_enabled() {
        splitkv_mla::refuses(call.spec, &call.params, call.dev.info().compute_capability, optin)
    } else {
        Some("SDPA_SPLITKV_MLA=0 turns splitkv's MLA path off".to_string())
    };
    let Some(why) = why else { return Ok(true) };
    let only_mla = call.spec.ragged.is_some()
        && (s.d, s.dv) == (splitkv_mla::MLA_D, splitkv_mla::MLA_DV)
        && matches!(call.opts.kernel, Kernel::Auto | Kernel::SplitKv);
    if only_mla {
        return Err(crate::error::unsupported(format!(
            "ragged batches at D = {}, Dv = {} run on splitkv's MLA path only, which cannot take this call: {why}",
            s.d, s.dv
        )));
    }
    Ok(false)
}

/// The programs a call would launch on the launcher [`policy::choose`] picks (what a warm-up compiles):
/// the same planning as [`dispatch`], without launching.
pub fn programs_for(call: &Call<'_>) -> Result<Vec<Program>> {
    let optin = call.dev.info().smem_per_block_optin.max(0) as usize;
    let fa3_plan = auto_fa3_plan(call);
    let tc = policy::TensorCores::of(call.spec, &call.params, optin)
        .with_fa3(fa3_plan.is_some())
        .with_mla(mla_takes(call, optin)?);
    Ok(match policy::choose(call.opts.kernel, call.spec, call.opts, tc)? {
        Launcher::Unfused | Launcher::Wide => vec![unfused::program()],
        Launcher::Fa1 => vec![fa1::plan(call)?.0],
        Launcher::Tf32 => vec![tf32::plan(call)?.program],
        Launcher::Fa2 => match pad_copy::programs_for(call, pad_copy::Mode::from_env())? {
            Some(programs) => programs,
            None => vec![fa2::plan(call)?.program],
        },
        Launcher::SplitKv => vec![splitkv::plan(call)?.program],
        Launcher::SplitKvMla => splitkv_mla::plan(call)?.programs(),
        Launcher::Fa3 => fa3::programs_for(call, fa3_plan)?,
    })
}

/// Runs the requested kernel on the launcher [`policy::choose`] picks (resolving `auto` and the
/// fallbacks); returns the kernel that ran.
pub fn dispatch(call: &Call<'_>) -> Result<Kernel> {
    let optin = call.dev.info().smem_per_block_optin.max(0) as usize;
    let fa3_plan = auto_fa3_plan(call);
    let tc = policy::TensorCores::of(call.spec, &call.params, optin)
        .with_fa3(fa3_plan.is_some())
        .with_mla(mla_takes(call, optin)?);
    let launcher = policy::choose(call.opts.kernel, call.spec, call.opts, tc)?;
    match launcher {
        Launcher::Unfused => unfused::run(call)?,
        Launcher::Wide => wide::run(call)?,
        Launcher::Fa1 => fa1::run(call)?,
        Launcher::Tf32 => tf32::run(call)?,
        Launcher::Fa2 => fa2::run(call)?,
        Launcher::SplitKv => splitkv::run(call)?,
        Launcher::SplitKvMla => splitkv_mla::run(call)?,
        Launcher::Fa3 => fa3::run(call, fa3_plan)?,
    }
    Ok(launcher.kernel())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checked::params::Masking;
    use crate::sys::modules::MODULES;
    use sdpa_core::DType;

    /// Every registered module is built by some program (a module missing from [`all_programs`] would
    /// never be compiled by CI), and no two programs share a name (the cache and the device key on it).
    #[test]
    fn every_module_has_programs_and_names_are_unique() {
        let all = all_programs();
        for m in MODULES {
            assert!(all.iter().any(|p| p.module.name == m.name), "module {} has no program", m.name);
        }
        let mut names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len(), "two programs share a name");
        assert!(all.iter().all(|p| p.is_whole() || p.instantiation.contains(&format!("({},", p.name))));
    }

    /// The compile check builds every plain program and the variant programs of bf16 at D = 128 only (and
    /// each family's there: fa2's three tiles, splitkv's three load paths, fa1m).
    #[test]
    fn the_compile_check_takes_plain_programs_everywhere_and_variants_once_per_family() {
        let all = all_programs();
        let check = compile_check_programs();
        let is_bwd = |p: &Program| p.module.name == crate::sys::modules::BWD.name;
        let is_fa3 = |p: &Program| p.module.name == crate::sys::modules::FA3.name;
        let plain =
            all.iter().filter(|p| !p.name.contains("_band") && !is_fa2_ragged(p) && !is_bwd(p) && !is_fa3(p)).count();
        let bwd = check.iter().filter(|p| is_bwd(p)).count();
        let fa3: Vec<Program> = check.iter().filter(|p| is_fa3(p)).cloned().collect();
        assert_eq!(fa3, fa3::compile_check_programs());
        assert_eq!(bwd, bwd::compile_check_programs().len());
        let splitkv_ragged = |p: &Program| p.name.starts_with("splitkv_ragged_");
        // fa3's (its variant entries among them) are counted above.
        let dense = |p: &&Program| !is_fa2_ragged(p) && !splitkv_ragged(p) && !is_fa3(p);
        let variants: Vec<&str> =
            check.iter().filter(dense).filter(|p| p.name.contains("_band")).map(|p| p.name.as_str()).collect();
        let ragged: Vec<&str> = check.iter().filter(|p| is_fa2_ragged(p)).map(|p| p.name.as_str()).collect();
        // splitkv's ragged programs are all variant programs (their band is per sequence): bf16 at 128 with
        // the four variant maskings without an explicit mask, on its two ring depths.
        let skv: Vec<&str> = check.iter().filter(|p| splitkv_ragged(p)).map(|p| p.name.as_str()).collect();
        assert_eq!(skv.len(), 4 * 2, "{skv:?}");
        assert_eq!(check.len() - variants.len() - ragged.len() - skv.len() - bwd - fa3.len(), plain);
        let per = Masking::variants().len();
        assert_eq!(variants.len(), per * (3 + 3 + 1), "{variants:?}");
        for name in ["fa2_bf16_128_band_softcap_alibi", "splitkv_tma_bf16_128_explicit_band", "fa1m_bf16_128_band"] {
            assert!(variants.contains(&name), "{name} missing");
        }
        // Ragged: one tile, packed and paged, the maskings without an explicit mask (2 plain + 4 variants).
        assert_eq!(ragged.len(), 2 * 6, "{ragged:?}");
        for name in ["fa2_bf16_128_causal_varlen", "fa2_bf16_128_band_softcap_alibi_paged"] {
            assert!(ragged.contains(&name), "{name} missing");
        }
    }

    /// What the launchers can pick, over the grids and devices they plan for, is among [`all_programs`]
    /// (what CI compiles and `warm_up_all` loads).
    #[test]
    fn every_variant_a_launcher_picks_is_listed() {
        let all = all_programs();
        let listed = |p: &Program| assert!(all.contains(p), "{} is launched but not listed", p.name);
        for dtype in [DType::F16, DType::BF16] {
            for mask in Masking::all() {
                let grids = [
                    (4096, 32, 4, 227 * 1024),
                    (4096, 32, 4, 163 * 1024),
                    (4096, 32, 4, 99 * 1024),
                    (64, 1, 1, 227 * 1024),
                    (64, 1, 1, 99 * 1024),
                ];
                let head_dims = [(64, 64), (40, 40), (80, 80), (96, 96), (128, 128), (160, 160), (200, 200)];
                for (d, dv) in head_dims.into_iter().chain([(256, 256), (192, 128), (184, 128), (64, 128)]) {
                    let dims = fa2::HeadDims::of(d, dv).expect("classes");
                    for (sq, hq, b, optin) in grids {
                        let blocks = |bm: usize| usize::div_ceil(sq, bm) * hq * b;
                        let (tile, prefix) = fa2::choose_tile(dims.d, dims.dv, &blocks, 132, optin).expect("a tile");
                        assert!(tile.smem_bytes(dims.d, dims.dv) <= optin, "{prefix} {dims:?} at {optin}: {tile:?}");
                        listed(&fa2::program(prefix, dtype, dims, tile, mask, fa2::Serve::Dense));
                        if mask.kind != crate::checked::params::MASK_EXPLICIT {
                            for serve in fa2::Serve::RAGGED {
                                listed(&fa2::program(prefix, dtype, dims, tile, mask, serve));
                            }
                        }
                    }
                }
                for (d, dv) in [(64, 64), (96, 96), (128, 128), (256, 256), (80, 80), (32, 32), (192, 128), (224, 224)]
                {
                    let hd = splitkv::HeadDims::of(d, dv).expect("a class");
                    for load in [splitkv::SplitKvLoad::CpAsync, splitkv::SplitKvLoad::Bulk, splitkv::SplitKvLoad::Tma] {
                        if hd.pad && load != splitkv::SplitKvLoad::CpAsync {
                            continue;
                        }
                        if let Some(tile) = splitkv::tile_for(hd.d, load) {
                            listed(&splitkv::program(dtype, hd, tile, mask));
                        }
                    }
                }
                for d in fa1::FA1_MMA_HEAD_DIMS {
                    listed(&fa1::mma_program(dtype, d, fa1::mma_tile_for(d).expect("a tile"), mask));
                }
            }
        }
        for split in [false, true] {
            for dp in [16, 32, 64, 128, 256] {
                for &mask in &MASK_KINDS {
                    for optin in [227 * 1024, 163 * 1024, 99 * 1024] {
                        let (tile, suffix) = tf32::choose_tile(dp, split, mask, optin);
                        listed(&tf32::program(split, dp, suffix, tile, mask));
                    }
                }
            }
        }
    }
}
