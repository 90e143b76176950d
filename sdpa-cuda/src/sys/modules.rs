//! The registry of kernel modules: every `.cu` file of `kernels/`, pulled into the binary with
//! `include_str!`, plus the shared headers ([`HEADERS`]: `common.cuh` and the headers one kernel family
//! shares with another).
//!
//! Adding a module is one line in [`MODULES`] (and a `pub const` for launch code to name it). A family's
//! module defines no entry points of its own: each is instantiated in a program of its own
//! ([`crate::sys::program`]); `unfused` and `l2_flush` define theirs and are compiled whole. Entry points are
//! `extern "C"` and named `{kernel}_{dtype}[_{headdim}][_{mask}]`, e.g. `fa2_bf16_128_causal`.

/// The shared device header: the [`crate::checked::params::AttnParams`] struct, dtype conversions, mask helpers.
pub const COMMON_CUH: &str = include_str!("../../kernels/common.cuh");

/// Headers every module may `#include "name"`: handed to NVRTC in memory (no files needed at run time)
/// and part of every cache key. A new shared header is one line here.
///
/// - `common.cuh`: [`crate::params::AttnParams`], dtype conversions, masks, the NaN repair of every kernel.
/// - `fa2_mma.cuh`: the f16/bf16 tensor-core steps of `fa2`, `fa1_mma` and `splitkv` (cp.async, ldmatrix,
///   mma.sync m16n8k16, online softmax, the split-KV scratch layout).
/// - `tf32_ops.cuh`: the f32 tensor-core helpers and epilogue of `tf32` and `tf32_wgmma`.
/// - `sm90_async.cuh`: sm_90 mbarriers, bulk and TMA copies, L2 policies (`splitkv`, `tf32_wgmma`, `fa3`).
/// - `fa3_wgmma.cuh`: f16/bf16 `wgmma` products and descriptors of `fa3`, and the `stmatrix` its epilogue and
///   FP8's transpose share.
/// - `fa3_fp8.cuh`: `fa3`'s E4M3 element, its k32 products, P's conversion, V's transpose in the kernel (short
///   calls) and the Vᵀ pre-pass (long ones).
/// - `splitkv_common.cuh`: split-KV's partials scratch, their merge, the packed GQA row map and the TMA
///   entries' parameter (`splitkv`, `splitkv_mla`).
pub const HEADERS: &[(&str, &str)] = &[
    ("common.cuh", COMMON_CUH),
    ("fa2_mma.cuh", include_str!("../../kernels/fa2_mma.cuh")),
    ("tf32_ops.cuh", include_str!("../../kernels/tf32_ops.cuh")),
    ("sm90_async.cuh", include_str!("../../kernels/sm90_async.cuh")),
    ("fa3_wgmma.cuh", include_str!("../../kernels/fa3_wgmma.cuh")),
    ("fa3_fp8.cuh", include_str!("../../kernels/fa3_fp8.cuh")),
    ("splitkv_common.cuh", include_str!("../../kernels/splitkv_common.cuh")),
];

/// One `.cu` source: a family of templates that its programs include, or a small module compiled whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModuleSource {
    /// Module name: the file stem, also the cache and error label.
    pub name: &'static str,
    /// CUDA C++ source (may `#include "common.cuh"`).
    pub source: &'static str,
    /// Extra NVRTC options for this module only (part of the cache key).
    pub extra_options: &'static [&'static str],
    /// Compiled for the architecture-specific target (`sm_90a`) on a device of compute capability 9.0, so
    /// that it may use `wgmma` and the other sm_90a-only instructions (see [`ModuleSource::arch_for`]).
    pub arch_specific: bool,
}

impl ModuleSource {
    /// A module with no extra options.
    pub const fn new(name: &'static str, source: &'static str) -> Self {
        ModuleSource { name, source, extra_options: &[], arch_specific: false }
    }

    /// The NVRTC architecture this module is compiled for on a device whose real architecture is `arch`
    /// ("sm_90"): "sm_90a" for an [`arch_specific`](Self::arch_specific) module there, `arch` otherwise.
    pub fn arch_for(&self, arch: &str) -> String {
        if self.arch_specific && arch == "sm_90" {
            "sm_90a".to_string()
        } else {
            arch.to_string()
        }
    }

    /// Whether this module's code for sm_90 may differ from its code for sm_80 by more than the back end:
    /// it is [`arch_specific`](Self::arch_specific), or its text or a project header it includes (through
    /// others too) tests `__CUDA_ARCH__`. The CI compile check builds the others for sm_80 only, since both
    /// targets see the same source and sm_90 would repeat the front end's work.
    pub fn branches_on_arch(&self) -> bool {
        fn mentions(text: &str, seen: &mut Vec<&'static str>) -> bool {
            text.contains("__CUDA_ARCH__")
                || included(text).any(|name| match HEADERS.iter().find(|(h, _)| *h == name) {
                    Some((h, body)) if !seen.contains(h) => {
                        seen.push(h);
                        mentions(body, seen)
                    }
                    _ => false,
                })
        }
        self.arch_specific || mentions(self.source, &mut Vec::new())
    }
}

/// The project headers a text includes: the names of its `#include "name"` lines.
fn included(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .filter_map(|line| line.trim_start().strip_prefix("#include")?.trim().strip_prefix('"')?.split('"').next())
}

/// The softmax (scale + mask + LSE) kernel of the unfused baseline.
pub const UNFUSED: ModuleSource = ModuleSource::new("unfused", include_str!("../../kernels/unfused.cu"));
/// FlashAttention-1 SIMT kernels.
pub const FA1: ModuleSource = ModuleSource::new("fa1", include_str!("../../kernels/fa1.cu"));
/// FlashAttention-1 on tensor cores, f16/bf16 (`crate::kernels::fa1`: warps split the keys of each K/V tile).
pub const FA1_MMA: ModuleSource = ModuleSource::new("fa1_mma", include_str!("../../kernels/fa1_mma.cu"));
/// f32 inputs on tensor cores: TF32 and split TF32.
pub const TF32: ModuleSource = ModuleSource::new("tf32", include_str!("../../kernels/tf32.cu"));

/// Plain TF32 at head dims up to 128 on Hopper's warpgroup MMA (`crate::kernels::tf32`; sm_90a, its entries trap
/// elsewhere).
pub const TF32_WGMMA: ModuleSource = ModuleSource {
    name: "tf32_wgmma",
    source: include_str!("../../kernels/tf32_wgmma.cu"),
    extra_options: &[],
    arch_specific: true,
};

/// The Hopper forward, f16/bf16: TMA, `wgmma`, warp specialisation (`crate::kernels::fa3`; sm_90a, its entries
/// trap elsewhere).
pub const FA3: ModuleSource =
    ModuleSource { name: "fa3", source: include_str!("../../kernels/fa3.cu"), extra_options: &[], arch_specific: true };

/// FlashAttention-2 on tensor cores, f16/bf16 (`crate::kernels::fa2`).
pub const FA2: ModuleSource = ModuleSource::new("fa2", include_str!("../../kernels/fa2.cu"));
/// Split-KV (flash-decoding), f16/bf16, its partials merged inside the same launch (`crate::kernels::splitkv`).
pub const SPLITKV: ModuleSource = ModuleSource::new("splitkv", include_str!("../../kernels/splitkv.cu"));
/// Split-KV decoding at MLA's head dims (576/512), f16/bf16, sm_90 (`crate::kernels::splitkv_mla`).
pub const SPLITKV_MLA: ModuleSource = ModuleSource::new("splitkv_mla", include_str!("../../kernels/splitkv_mla.cu"));

/// The backward pass on tensor cores, f16/bf16 (`crate::kernels::bwd`).
pub const BWD: ModuleSource = ModuleSource::new("bwd", include_str!("../../kernels/bwd.cu"));

/// The read pass of the clean L2 flush before timed calls (`crate::backend::L2Flush::Clean`).
pub const L2_FLUSH: ModuleSource = ModuleSource::new("l2_flush", include_str!("../../kernels/l2_flush.cu"));

/// The "write to cache" step of a paged KV cache (`crate::kernels::paged_append`).
pub const PAGED_APPEND: ModuleSource = ModuleSource::new("paged_append", include_str!("../../kernels/paged_append.cu"));

/// Strided 2- and 4-byte copies between head-dim widths: the pad-copy paths of `fa2`'s forward
/// (`crate::kernels::pad_copy`) and of the backward (`crate::kernels::bwd_pad`).
pub const PAD_COPY: ModuleSource = ModuleSource::new("pad_copy", include_str!("../../kernels/pad_copy.cu"));

/// Ring attention's merge, gradient accumulation and row gather (`crate::ring`).
pub const RING: ModuleSource = ModuleSource::new("ring", include_str!("../../kernels/ring.cu"));

/// Every module (the programs built from them are listed by [`crate::kernels::all_programs`]).
/// A new module adds one line here.
pub const MODULES: &[ModuleSource] = &[
    UNFUSED,
    FA1,
    FA1_MMA,
    TF32,
    TF32_WGMMA,
    FA2,
    FA3,
    SPLITKV,
    SPLITKV_MLA,
    L2_FLUSH,
    PAGED_APPEND,
    PAD_COPY,
    BWD,
    RING,
];

/// Looks a module up by name.
pub fn find(name: &str) -> Option<&'static ModuleSource> {
    MODULES.iter().find(|m| m.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_branches_are_found_through_included_headers() {
        // splitkv, splitkv_mla and bwd test the architecture in their own text, fa3 is arch-specific; the probe
        // below finds it only two headers down (splitkv_common.cuh -> sm90_async.cuh).
        assert!(SPLITKV.branches_on_arch() && SPLITKV_MLA.branches_on_arch());
        assert!(BWD.branches_on_arch() && FA3.branches_on_arch() && TF32_WGMMA.branches_on_arch());
        assert!(!FA2.branches_on_arch() && !FA1.branches_on_arch() && !TF32.branches_on_arch());
        let via_header = ModuleSource::new("probe", "#include \"splitkv_common.cuh\"\n");
        assert!(via_header.branches_on_arch());
        let plain = ModuleSource::new("probe", "  #include \"fa2_mma.cuh\"  // the steps\n");
        assert!(!plain.branches_on_arch());
        assert_eq!(included("#include <cuda_fp16.h>\n#include \"a.cuh\"").collect::<Vec<_>>(), ["a.cuh"]);
    }
}
