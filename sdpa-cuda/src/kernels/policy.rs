//! Which kernel family runs a call: what `auto` picks, and where a requested kernel falls back to another.
//! Pure functions of the spec, the options and the call's parameters (pointers and strides), so the whole
//! choice is unit-tested without a GPU; [`super::dispatch`] runs what [`choose`] returns. The variant
//! inside a family (tile, entry point, load path) stays with its launcher.
//!
//! The rules, in order:
//! - `auto` ([`resolve_auto`]): where `fa2` takes the call ([`tensor_core_limit`] is `None`: f16/bf16, D
//!   and Dv from 1 to 256, a positive scale, element-aligned base pointers; rows that are not 16-byte
//!   aligned take the padded instantiations' narrow copies, issue 21), `splitkv` for decoding
//!   (`group·Sq <= 64` and `Sk >= `[`AUTO_SPLITKV_MIN_KEYS`]) where `splitkv` takes it too
//!   ([`splitkv_limit`]), and `fa2` otherwise; elsewhere `fa2` for f32 inputs
//!   with TF32 or split-TF32 math (the tensor-core f32 path) and `fa1` for the rest.
//! - f32 math applies to f32 inputs only; f16/bf16 calls ignore it.
//! - `fa2` with f32 inputs runs the TF32 launcher ([`Launcher::Tf32`]) with TF32 or split-TF32 math, and
//!   is unsupported with exact math; `fa1` with f32 inputs runs exact math only.
//! - `fa2` and `splitkv` asked for a call the tensor-core kernels cannot take run `fa1` instead, and the
//!   call reports `fa1` as the kernel that ran; `splitkv` asked for head dims only `fa2` takes runs `fa2`.
//! - Variants (windows, softcap, ALiBi): every family honours them except the f32 tensor-core path (TF32
//!   and split TF32, [`tf32_refuses`]): `fa2` asked for it with variants is refused with the reason, and
//!   `auto` runs such f32 calls on `fa1` with exact f32 math instead (more accurate than asked, never
//!   less).
//! - Ragged batches and paged KV caches (issue 23, [`choose_ragged`]) run on the tensor-core kernels only: `auto`
//!   takes `splitkv` when every sequence is decoding-like (`group·Sq_b <= 64`) and the longest has
//!   `Sk_b >= `[`AUTO_SPLITKV_MIN_KEYS`], `fa3` for ragged prefill with packed K/V where it takes the call on this
//!   device ([`fa3_may_take_ragged`]), `fa2` otherwise; `fa3` asked for by name refuses what it cannot take;
//!   `fa1`, `unfused` and the f32 paths refuse them with the kernel to use instead ([`refuse_ragged`]), and calls
//!   the tensor cores cannot take are refused rather than sent to `fa1`.
//! - Head dims above 256 (issue 21): `auto` runs dense f16/bf16 calls with D or Dv above 256 on the wide-head
//!   path ([`Launcher::Wide`], [`super::wide`]: query slabs of tensor-core GEMMs around unfused's softmax,
//!   reported as kernel `unfused`) instead of the SIMT `fa1`; `fa2` and `splitkv` asked for such calls still
//!   fall back to `fa1`. MLA decoding (D = 576, Dv = 512) is the exception: where `splitkv`'s MLA path takes the
//!   call on this device ([`TensorCores::mla`], [`super::splitkv_mla::refuses`]), `splitkv` asked by name runs
//!   it, and `auto` does too with at most [`super::splitkv_mla::AUTO_MAX_ROWS`] rows per kv head; ragged and
//!   paged calls at these head dims likewise ([`choose_ragged`]), which nothing else runs.
//! - `fa3` (the Hopper forward, [`super::fa3`]): unless `SDPA_AUTO_FA3=0` ([`auto_fa3_enabled`]), `auto` picks it for
//!   a dense f16/bf16 call that `fa2` would run when `fa3` takes it on this device ([`TensorCores::fa3`], decided by
//!   the dispatcher, which knows the device) and it was measured faster than `fa2` ([`fa3_measured_faster`]), variant
//!   calls (windows, softcap, ALiBi) under the same rule. Asked for by name, what it cannot take (head dims, masks,
//!   paged caches whose page size its key tiles do not fit, f8e4m3 ragged batches, devices other than sm_90) is refused
//!   with the reason, never sent elsewhere.

use crate::checked::params::AttnParams;
use crate::error::unsupported;
use sdpa_core::{AttentionSpec, DType, F32Math, Kernel, Result, RunOptions, Serving};
use std::fmt;

/// Head dims (D = Dv) whose `fa2` and `splitkv` tiles (and splitkv's sm_90 copy paths) were chosen by
/// measurement; both kernels take every multiple of 8 up to 256 through head-dim classes
/// (`fa2::HEAD_DIM_CLASSES`).
pub const FA2_HEAD_DIMS: [usize; 4] = [64, 96, 128, 256];

/// Fewest keys for which `auto` picks `splitkv`. Below it one `fa2` launch is as fast (issue 4's tiny
/// shapes such as B=1, H=1, S=64, where the launch is all there is; Sq = 1 with Sk <= 512 measured in
/// `bench/results/gpu/fa2.md`).
pub const AUTO_SPLITKV_MIN_KEYS: usize = 1024;

/// The launcher a call runs on: one per kernel family in [`crate::kernels`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// [`crate::kernels::unfused`].
    Unfused,
    /// [`crate::kernels::fa1`].
    Fa1,
    /// [`crate::kernels::tf32`]: f32 inputs on tensor cores, reported as kernel `fa2`.
    Tf32,
    /// [`crate::kernels::fa2`].
    Fa2,
    /// [`crate::kernels::splitkv`].
    SplitKv,
    /// [`crate::kernels::splitkv_mla`]: decoding at MLA's 576/512 on sm_90, reported as kernel `splitkv`.
    SplitKvMla,
    /// [`crate::kernels::fa3`].
    Fa3,
    /// [`crate::kernels::wide`]: head dims above 256 in query slabs; the unfused structure, reported as
    /// kernel `unfused`.
    Wide,
}

impl Launcher {
    /// The kernel a call on this launcher reports as run.
    pub fn kernel(self) -> Kernel {
        match self {
            Launcher::Unfused | Launcher::Wide => Kernel::Unfused,
            Launcher::Fa1 => Kernel::Fa1,
            Launcher::Tf32 | Launcher::Fa2 => Kernel::Fa2,
            Launcher::SplitKv | Launcher::SplitKvMla => Kernel::SplitKv,
            Launcher::Fa3 => Kernel::Fa3,
        }
    }
}

/// Why the tensor-core kernels (`fa2`, `splitkv`) cannot take a call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TensorCoreLimit {
    /// They take f16 and bf16 only.
    DType(DType),
    /// The tensor-core kernels take D and Dv from 1 to 256.
    HeadDims {
        /// Head dim of Q and K.
        d: usize,
        /// Head dim of V and O.
        dv: usize,
    },
    /// The running max is taken before scaling, so the scale must be positive.
    Scale(f64),
    /// A base pointer is not a multiple of 2 bytes, or a paged KV cache's rows are not 16-byte aligned
    /// (its block-table loads copy whole 16-byte chunks): D, Dv, base pointers and strides multiples of 8
    /// elements.
    Unaligned,
    /// The kernel's tile needs more shared memory per block than the device gives.
    SharedMemory {
        /// Bytes the tile needs.
        needed: usize,
        /// Bytes the device allows a block.
        available: usize,
    },
}

impl fmt::Display for TensorCoreLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TensorCoreLimit::DType(dt) => write!(f, "dtype {dt} (tensor-core fa2 takes f16 and bf16)"),
            TensorCoreLimit::HeadDims { d, dv } => {
                write!(f, "head dims D = {d}, Dv = {dv} (the tensor-core kernels take 1 to 256)")
            }
            TensorCoreLimit::Scale(s) => write!(f, "scale {s} (the tensor-core kernels need a positive scale)"),
            TensorCoreLimit::SharedMemory { needed, available } => {
                write!(f, "{needed} bytes of shared memory per block, the device allows {available}")
            }
            TensorCoreLimit::Unaligned => f.write_str(
                "operands not aligned (base pointers must be 2-byte aligned; a paged KV cache needs D, Dv, base \
                     pointers and strides that are multiples of 8 elements)",
            ),
        }
    }
}

/// Why the tensor-core `fa2` cannot run this call, or `None` when it can: f16/bf16, D and Dv from 1 to 256
/// (its head-dim classes, [`super::fa2::head_dim_classes`]), a positive scale (the running max is taken
/// before scaling) and element-aligned base pointers. Rows that are not whole 16-byte chunks starting
/// 16-byte aligned (head dims that are not multiples of 8, views with odd strides or offsets) run the padded
/// instantiations with 8-, 4- or 2-byte copies chosen per call (issue 21), except in a paged KV cache, whose
/// rows must be 16-byte aligned.
pub fn tensor_core_limit(spec: &AttentionSpec, params: &AttnParams) -> Option<TensorCoreLimit> {
    let s = spec.shape;
    if !matches!(spec.dtype, DType::F16 | DType::BF16) {
        return Some(TensorCoreLimit::DType(spec.dtype));
    }
    if super::fa2::head_dim_classes(s.d, s.dv).is_none() {
        return Some(TensorCoreLimit::HeadDims { d: s.d, dv: s.dv });
    }
    if spec.scale() <= 0.0 {
        return Some(TensorCoreLimit::Scale(spec.scale()));
    }
    let paged = matches!(Serving::of(spec), Some(Serving::Paged));
    if !params.qkvo_aligned_2_bytes() || (paged && !params.rows_16_byte_aligned(s.d, s.dv)) {
        return Some(TensorCoreLimit::Unaligned);
    }
    None
}

/// The backward's launcher for a requested kernel: `auto` and `fa2` run the tensor-core backward
/// ([`super::bwd`]); the other kernels have no backward of their own.
pub fn choose_backward(requested: Kernel) -> Result<()> {
    match requested {
        Kernel::Auto | Kernel::Fa2 => Ok(()),
        k => Err(unsupported(format!(
            "the backward pass of kernel {k} (the CUDA backward is fa2's; ask for fa2 or auto)"
        ))),
    }
}

/// Why `splitkv` cannot run this call on a device allowing `smem_optin` bytes of shared memory per block:
/// what stops `fa2` ([`tensor_core_limit`]), head dims it has no class for ([`super::splitkv::HeadDims`]:
/// the same as `fa2`'s, both at the larger class), or a class whose `cp.async` tile (the path every device
/// has) needs more shared memory than the device gives a block (D = 96..256 on a 99 KB part, 256 on an
/// A100). `fa2` runs such calls instead.
pub fn splitkv_limit(spec: &AttentionSpec, params: &AttnParams, smem_optin: usize) -> Option<TensorCoreLimit> {
    let s = spec.shape;
    tensor_core_limit(spec, params).or_else(|| {
        let Some(hd) = super::splitkv::HeadDims::of(s.d, s.dv) else {
            return Some(TensorCoreLimit::HeadDims { d: s.d, dv: s.dv });
        };
        let tile = super::splitkv::tile_for(hd.d, super::splitkv::SplitKvLoad::CpAsync)?;
        let needed = tile.smem_bytes(hd.d);
        (needed > smem_optin).then_some(TensorCoreLimit::SharedMemory { needed, available: smem_optin })
    })
}

/// Which tensor-core kernels take a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorCores {
    /// `fa2` does ([`tensor_core_limit`] is `None`).
    pub fa2: bool,
    /// `splitkv` does ([`splitkv_limit`] is `None`).
    pub splitkv: bool,
    /// `fa3` does on this device (compute capability 9.0 and [`super::fa3::plan`] accepts the call); false
    /// where no device is known ([`TensorCores::of`]).
    pub fa3: bool,
    /// `splitkv`'s MLA path does on this device ([`super::splitkv_mla::refuses`] is `None`); false where no
    /// device is known.
    pub mla: bool,
}

impl TensorCores {
    /// The verdicts for `spec` with `params`' pointers and strides on a device allowing `smem_optin` bytes
    /// of shared memory per block.
    pub fn of(spec: &AttentionSpec, params: &AttnParams, smem_optin: usize) -> Self {
        TensorCores {
            fa2: tensor_core_limit(spec, params).is_none(),
            splitkv: splitkv_limit(spec, params, smem_optin).is_none(),
            fa3: false,
            mla: false,
        }
    }

    /// The same verdicts with `fa3`'s for the device (whether [`super::fa3::plan`] accepts the call there).
    pub fn with_fa3(self, fa3: bool) -> Self {
        TensorCores { fa3, ..self }
    }

    /// The same verdicts with the MLA path's for the device.
    pub fn with_mla(self, mla: bool) -> Self {
        TensorCores { mla, ..self }
    }
}

/// Why the f32 tensor-core path (TF32 and split TF32) cannot run `spec`, or `None`: it implements no
/// variant (windows, softcap, ALiBi; issue 22 left it plain), and its classes end at head dim 256 (any D
/// and Dv up to there, equal or not: [`super::tf32::padded_head_dim`]).
pub fn tf32_refuses(spec: &AttentionSpec) -> Option<String> {
    let s = spec.shape;
    if super::tf32::padded_head_dim(s.d.max(s.dv)).is_none() {
        return Some(format!(
            "the TF32 kernels take head dims up to 256 (got D = {}, Dv = {}); run f32 with exact math (fa1)",
            s.d, s.dv
        ));
    }
    let kinds = spec.variants.kinds();
    (!kinds.is_empty()).then(|| {
        let names: Vec<&str> = kinds.iter().map(|v| v.name()).collect();
        format!(
            "the TF32 kernels do not implement {} (f32 math tf32/split-tf32); run f32 with exact math (fa1) or \
             kernel unfused",
            names.join(", ")
        )
    })
}

/// What `auto` runs when the tensor-core kernels cannot take the call: the tensor-core f32 path (kernel
/// `fa2`) when TF32 or split TF32 was asked for and it takes the call ([`tf32_refuses`]), `fa1` otherwise.
pub fn foundation_auto(spec: &AttentionSpec, opts: &RunOptions) -> Kernel {
    match (spec.dtype, opts.f32_math) {
        (DType::F32, F32Math::Tf32 | F32Math::SplitTf32) if tf32_refuses(spec).is_none() => Kernel::Fa2,
        _ => Kernel::Fa1,
    }
}

/// Whether `fa3` is measured faster than `fa2` for a call it takes (`bench/results/gpu/fa3.md`: the
/// fa2bench grid on the H100, S = Sq = Sk from 512 to 16k, D = 64 and 128, causal and not; session 8's last
/// call: `fa3` 1.07-1.95x `fa2` except at D = 64 causal below 2k keys, 0.90x at 512 and 0.98x at 1k, bf16
/// and f16; sessions 10-17 level at 512 and ahead from 1k there; since session 20's staged epilogue ahead
/// everywhere, D = 64 causal included: 1.106 / 1.157x at 512 / 1k in bf16 and 1.103 / 1.153x in f16, the
/// rest of the grid 1.25-2.04x): at least [`AUTO_FA3_MIN_ROWS`] query rows and keys and at least
/// [`AUTO_FA3_MIN_TILES`] query tiles of 128 rows over the batch and heads (every measured point had 2048
/// or more); or a query chunk over a long cache (at least
/// 128 query rows and [`AUTO_FA3_CHUNK_MIN_KEYS`] keys, any tile count: chunked prefill and speculative
/// verification, where session 10 measured `fa3` 1.50-2.28x `fa2` at Sq = 128 and 256 over 8192 keys, bf16,
/// D = 128, GQA 8, causal bottom-right, B = 1 and 4, with as few as 32 tiles). Shorter or smaller calls
/// (decoding-like rows, a few keys) were not measured against `fa2` and stay there. Variant calls
/// (windows, softcap, ALiBi) follow the same rule: at D = 128, causal, S = 4k and 16k, `fa3` ran each of
/// window 1024, softcap 30 and ALiBi 1.51-1.63x `fa2` (`bench/results/gpu/fa3.md`, session 10).
pub fn fa3_measured_faster(spec: &AttentionSpec) -> bool {
    if spec.ragged.is_some() {
        return fa3_may_take_ragged(spec);
    }
    let s = spec.shape;
    let tiles = s.sq.div_ceil(128).saturating_mul(s.b).saturating_mul(s.hq);
    let prefill = s.sq >= AUTO_FA3_MIN_ROWS && s.sk >= AUTO_FA3_MIN_ROWS && tiles >= AUTO_FA3_MIN_TILES;
    let chunk = s.sq >= 128 && s.sk >= AUTO_FA3_CHUNK_MIN_KEYS;
    fa3_head_dims_pay(spec) && (prefill || chunk)
}

/// Fewest keys for which `auto` picks `fa3` for a query chunk of at least 128 rows whatever its tile count
/// ([`fa3_measured_faster`]): the measured cache length (8192; shorter caches were not timed).
pub const AUTO_FA3_CHUNK_MIN_KEYS: usize = 8192;

/// Whether `auto` may send the ragged `spec` to `fa3` (after [`choose_ragged`] gave `splitkv` the decoding it takes):
/// packed K/V at head dims where dense `fa3` pays ([`fa3_head_dims_pay`]), and prefill: some sequence not decoding-like
/// ([`ragged_decoding_like`]; a batch of decoding steps over caches too short for `splitkv` stays on `fa2`, as dense
/// decoding-like calls do, [`fa3_measured_faster`]). Session 10 timed it against `fa2`'s ragged entries on the H100
/// (bf16, D = 128; `bench/results/gpu/fa3.md`, "Ragged batches"): 1.16-1.56x on a 16-sequence serving batch, 1.80x on
/// GQA chunked prefill. Paged caches, which `fa3` takes asked for by name, stay on `fa2` and `splitkv`: with 16-slot
/// pages `fa3` ran 0.75x `fa2` (a key tile arrives as eight boxes).
pub fn fa3_may_take_ragged(spec: &AttentionSpec) -> bool {
    Serving::of(spec) == Some(Serving::Varlen) && fa3_head_dims_pay(spec) && !ragged_decoding_like(spec)
}

/// Whether `fa3` was measured faster than `fa2` at the call's head dims and key count. Issue 21's head-dim
/// grid (16k tokens, S = 1k..16k; bench/results/gpu/fa3.md, Head dims): fa3 ran 0.70-0.88x fa2 at D = 32
/// (a class-64 tile half empty, where fa2 has a class 32) and 0.88-0.94x at D = 40 below 2k keys; 1.18x and
/// more from D = 72 to 256 and at 192/128. Ring attention's steps ask this too.
pub fn fa3_head_dims_pay(spec: &AttentionSpec) -> bool {
    let s = spec.shape;
    let width = s.d.max(s.dv);
    width > 32 && (width >= 64 || s.sk >= AUTO_FA3_NARROW_MIN_KEYS)
}

/// Fewest keys for which `auto` picks `fa3` at head dims 33..63 (padded into the class 64).
pub const AUTO_FA3_NARROW_MIN_KEYS: usize = 2048;

/// Fewest query rows and keys for which `auto` picks `fa3` over `fa2`: the shortest length of the measured
/// grid (there `fa3` ran 1.10x `fa2` at D = 64 causal, 1.35-1.65x elsewhere; session 20, bf16 and f16).
pub const AUTO_FA3_MIN_ROWS: usize = 512;
/// Fewest query tiles (128 rows of one head) for which `auto` picks `fa3`: a wave of the H100's 132
/// multiprocessors, rounded down (the measured calls had 16x that).
pub const AUTO_FA3_MIN_TILES: usize = 128;

/// Whether `auto` may pick `fa3`: yes unless `SDPA_AUTO_FA3=0` (a switch for measuring `auto` without it).
/// On by default since the whole GPU suite passed with `auto` taking `fa3` on the H100 (every test binary
/// of `run-gpu.sh tests`, session 7's verification call; bench/results/gpu/fa3.md).
pub fn auto_fa3_enabled() -> bool {
    std::env::var_os("SDPA_AUTO_FA3").is_none_or(|v| v != "0")
}

/// Whether the MLA path may run (`splitkv_mla`): yes unless `SDPA_SPLITKV_MLA=0`, a switch for measuring the
/// `wide` path it replaced at 576/512 and for testing `wide` there on a GPU that has both.
pub fn mla_enabled() -> bool {
    std::env::var_os("SDPA_SPLITKV_MLA").is_none_or(|v| v != "0")
}

/// What `auto` runs: for f16/bf16 calls `fa2` takes, `splitkv` when few query rows share each kv head
/// (decoding: `group·Sq <= 64`, where `fa2`'s 64-128-row tiles would be mostly empty and too few blocks
/// fill the GPU), the keys are long enough to split ([`AUTO_SPLITKV_MIN_KEYS`]) and `splitkv` takes the
/// head dims; `fa3` where it takes the call on this device and is measured faster than `fa2`
/// ([`fa3_measured_faster`]); `fa2` otherwise; everything else as [`foundation_auto`] decides.
pub fn resolve_auto(spec: &AttentionSpec, opts: &RunOptions, tc: TensorCores) -> Kernel {
    if !tc.fa2 {
        return foundation_auto(spec, opts);
    }
    let s = spec.shape;
    if tc.splitkv && s.group_size() * s.sq <= 64 && s.sk >= AUTO_SPLITKV_MIN_KEYS {
        Kernel::SplitKv
    } else if tc.fa3 && fa3_measured_faster(spec) {
        Kernel::Fa3
    } else {
        Kernel::Fa2
    }
}

/// `Err` with the reason when kernel family `kernel` (`fa1`, `unfused`, `fa2` with f32 inputs) is asked to
/// run a ragged batch or a paged cache, which only the f16/bf16 tensor-core kernels implement; `Ok` for a
/// dense call. The launchers check it too, so that no path reaches a kernel that would read a ragged
/// batch's packed rows as a dense batch.
pub fn refuse_ragged(kernel: &str, spec: &AttentionSpec) -> Result<()> {
    let Some(serving) = Serving::of(spec) else { return Ok(()) };
    let what = match serving {
        Serving::Varlen => "ragged (varlen) batches",
        Serving::Paged => "paged KV caches",
    };
    Err(unsupported(format!(
        "{kernel} does not run {what} on CUDA: run f16/bf16 on kernel fa2 (prefill) or splitkv (decoding), or \
         kernel auto{}",
        if spec.dtype == DType::F32 { "; f32 ragged calls have no CUDA kernel: cast them to f16/bf16" } else { "" }
    )))
}

/// Whether every sequence of a ragged call is decoding-like (`group·Sq_b <= 64`: `fa2`'s 64-128-row tiles,
/// and `fa3`'s 128-row ones, would be mostly empty) and the longest has at least [`AUTO_SPLITKV_MIN_KEYS`]
/// keys to split.
pub fn ragged_decoding(spec: &AttentionSpec) -> bool {
    ragged_decoding_like(spec) && spec.ragged.as_ref().is_some_and(|r| r.max_k() >= AUTO_SPLITKV_MIN_KEYS)
}

/// Whether every sequence of a ragged call is decoding-like (`group·Sq_b <= 64`), whatever its keys; `false`
/// for a dense call.
pub fn ragged_decoding_like(spec: &AttentionSpec) -> bool {
    let Some(r) = &spec.ragged else { return false };
    let g = spec.shape.group_size();
    r.seqlens_q.iter().all(|&q| g.saturating_mul(q) <= 64)
}

/// The launcher of a ragged call (see the module docs): only the tensor-core kernels run them, so f32
/// inputs, `fa1`, `unfused` and calls the tensor cores cannot take are errors naming what to use instead.
pub fn choose_ragged(requested: Kernel, spec: &AttentionSpec, tc: TensorCores) -> Result<Launcher> {
    match requested {
        // Asked for by name: `fa3` refuses what it cannot take (page sizes its key tiles do not fit, f8e4m3)
        // with the reason.
        Kernel::Fa3 => return Ok(Launcher::Fa3),
        Kernel::Fa1 | Kernel::Unfused => refuse_ragged(requested.name(), spec)?,
        _ if spec.dtype == DType::F32 => refuse_ragged(&format!("{requested} with f32 inputs"), spec)?,
        _ => {}
    }
    // MLA decoding (576/512) in a serving layout: splitkv's MLA path where it takes the call on this device, at
    // any row count (no other kernel runs ragged calls at these head dims; the dispatcher returns the path's
    // own reason when it refuses one).
    if tc.mla && matches!(requested, Kernel::Auto | Kernel::SplitKv) {
        return Ok(Launcher::SplitKvMla);
    }
    if !tc.fa2 {
        return Err(unsupported(
            "ragged batches and paged KV caches run on the tensor-core kernels only (fa2, splitkv), which cannot \
             take this call: they need f16/bf16, D and Dv from 1 to 256, a positive scale, element-aligned \
             pointers and (paged caches) 16-byte aligned rows; at D = 576, Dv = 512 splitkv's MLA path takes \
             decoding on sm_90 (kernel splitkv or auto, no explicit mask, softcap or ALiBi, pages of 8, 16 or a \
             multiple of 32 slots)",
        ));
    }
    Ok(match requested {
        Kernel::Auto if tc.splitkv && ragged_decoding(spec) => Launcher::SplitKv,
        // `tc.fa3`: the dispatcher found that fa3 takes the call on this device and `auto` may send it
        // there ([`fa3_may_take_ragged`]).
        Kernel::Auto if tc.fa3 => Launcher::Fa3,
        Kernel::SplitKv if tc.splitkv => Launcher::SplitKv,
        _ => Launcher::Fa2,
    })
}

/// The launcher for a call asking for kernel `requested` (`auto` resolved by [`resolve_auto`]); `tc` says
/// which tensor-core kernels take the call. Unsupported combinations (f32 math the kernel does not run)
/// are errors; see the module docs for the rules.
pub fn choose(requested: Kernel, spec: &AttentionSpec, opts: &RunOptions, tc: TensorCores) -> Result<Launcher> {
    // FP8 inputs run on `fa3` only (which refuses, with the reason, a GPU or call it cannot take).
    if spec.dtype == DType::F8E4M3 {
        return match requested {
            Kernel::Auto | Kernel::Fa3 => Ok(Launcher::Fa3),
            k => Err(unsupported(format!(
                "kernel {k} does not take f8e4m3 inputs: fa3 (Hopper, sm_90) is the FP8 path (or auto)"
            ))),
        };
    }
    if spec.ragged.is_some() {
        return choose_ragged(requested, spec, tc);
    }
    // MLA decoding (576/512): the fused split-KV path where it takes the call, for `auto` at decoding's
    // row counts and for `splitkv` asked for by name; the rest of these head dims runs on `wide`.
    if tc.mla && (requested == Kernel::SplitKv || requested == Kernel::Auto && super::splitkv_mla::auto_takes(spec)) {
        return Ok(Launcher::SplitKvMla);
    }
    if requested == Kernel::Auto && !tc.fa2 && super::wide::takes(spec) {
        return Ok(Launcher::Wide);
    }
    let kernel = match requested {
        Kernel::Auto => resolve_auto(spec, opts, tc),
        k => k,
    };
    // `auto` sends f32 calls with variants to exact `fa1` whatever the f32 math (the TF32 path refuses them).
    let auto_exact = requested == Kernel::Auto && kernel == Kernel::Fa1;
    let f32_math = if spec.dtype == DType::F32 && !auto_exact { opts.f32_math } else { F32Math::Exact };
    Ok(match (kernel, f32_math) {
        (Kernel::Unfused, _) => Launcher::Unfused,
        // Asked for by name (or chosen by `resolve_auto` above): what it cannot take it refuses with the
        // reason (no fallback).
        (Kernel::Fa3, _) => Launcher::Fa3,
        (Kernel::Fa1, F32Math::Exact) => Launcher::Fa1,
        (Kernel::Fa1, m) => {
            return Err(unsupported(format!(
                "fa1 is SIMT and runs f32 exactly; f32 math {} runs on kernel fa2 (tensor cores) or unfused",
                m.name()
            )))
        }
        (Kernel::Fa2, F32Math::Tf32 | F32Math::SplitTf32) => match tf32_refuses(spec) {
            Some(why) => return Err(unsupported(format!("fa2 with f32 inputs: {why}"))),
            None => Launcher::Tf32,
        },
        (Kernel::Fa2, _) if spec.dtype == DType::F32 => {
            return Err(unsupported(
                "fa2 with f32 inputs runs on tensor cores: choose f32 math tf32 or split-tf32 (fa1 is exact f32)",
            ))
        }
        // The fallback: what the tensor-core kernels cannot take runs on the generic fused `fa1` path.
        (Kernel::Fa2 | Kernel::SplitKv, _) if !tc.fa2 => Launcher::Fa1,
        (Kernel::Fa2, _) => Launcher::Fa2,
        // Head dims only `fa2` has tensor-core code for: it runs, and reports itself.
        (Kernel::SplitKv, _) if !tc.splitkv => Launcher::Fa2,
        (Kernel::SplitKv, _) => Launcher::SplitKv,
        (Kernel::Auto, _) => return Err(unsupported("auto resolved to itself")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sdpa_core::{Mask, Shape};

    /// The H100's opt-in shared memory per block.
    const H100_OPTIN: usize = 227 * 1024;

    /// Parameters of `spec` with every operand at a 256-byte aligned address.
    fn params(spec: &AttentionSpec) -> AttnParams {
        AttnParams::new(spec, 256, 512, 768, 1024, 0, 0).expect("params")
    }

    /// The launcher `auto` or `kernel` gives a spec, with the tensor-core verdict from its parameters.
    fn pick(kernel: Kernel, spec: &AttentionSpec, math: F32Math) -> Result<Launcher> {
        let opts = RunOptions { kernel, f32_math: math, ..Default::default() };
        choose(kernel, spec, &opts, TensorCores::of(spec, &params(spec), H100_OPTIN))
    }

    fn gqa(b: usize, hq: usize, hkv: usize, sq: usize, sk: usize, d: usize, dtype: DType) -> AttentionSpec {
        AttentionSpec::new(Shape { hkv, ..Shape::new(b, hq, sq, sk, d) }, dtype)
    }

    /// FP8 inputs go to fa3 (asked for or through auto) and nowhere else: every other kernel refuses them
    /// with the reason.
    #[test]
    fn fp8_calls_run_on_fa3_only() {
        let spec = gqa(1, 8, 2, 300, 300, 128, DType::F8E4M3);
        for k in [Kernel::Auto, Kernel::Fa3] {
            assert_eq!(pick(k, &spec, F32Math::Exact).expect("fa3"), Launcher::Fa3, "{k}");
        }
        for k in [Kernel::Fa2, Kernel::Fa1, Kernel::Unfused, Kernel::SplitKv] {
            let e = pick(k, &spec, F32Math::Exact).expect_err("refused");
            assert!(e.to_string().contains("f8e4m3"), "{k}: {e}");
        }
    }

    /// Variant calls never reach the TF32 launcher: `fa2` asked for with TF32 math refuses them with the
    /// reason, `auto` runs them on exact `fa1`; every other family takes them (f16/bf16 as for plain calls).
    #[test]
    fn variant_calls_never_reach_the_tf32_kernels() {
        use sdpa_core::{Alibi, Diagonal, Window};
        let base = gqa(1, 8, 2, 300, 300, 128, DType::F32);
        let variant_specs = [
            base.clone().with_mask(Mask::CausalBottomRight).with_window(Window::left(64)),
            base.clone().with_softcap(50.0),
            base.clone().with_alibi(Alibi::Standard).with_diagonal(Diagonal::TopLeft),
        ];
        for spec in &variant_specs {
            assert!(tf32_refuses(spec).is_some());
            for math in [F32Math::Tf32, F32Math::SplitTf32] {
                let err = pick(Kernel::Fa2, spec, math).expect_err("fa2 with TF32 refuses variants");
                assert!(err.to_string().contains("TF32"), "{err}");
                assert_eq!(pick(Kernel::Auto, spec, math).expect("auto"), Launcher::Fa1);
                assert_eq!(pick(Kernel::Unfused, spec, math).expect("unfused"), Launcher::Unfused);
            }
            assert_eq!(pick(Kernel::Fa1, spec, F32Math::Exact).expect("fa1"), Launcher::Fa1);
            // The same variants in bf16 run where plain calls run.
            let half = AttentionSpec { dtype: DType::BF16, ..spec.clone() };
            assert_eq!(pick(Kernel::Auto, &half, F32Math::Tf32).expect("auto"), Launcher::Fa2);
            assert_eq!(pick(Kernel::SplitKv, &half, F32Math::Exact).expect("splitkv"), Launcher::SplitKv);
        }
        // Plain f32 calls still take the TF32 path.
        assert_eq!(pick(Kernel::Auto, &base, F32Math::Tf32).expect("auto"), Launcher::Tf32);
        assert!(tf32_refuses(&base).is_none());
        // Whatever is asked, no variant call picks the TF32 launcher.
        for spec in &variant_specs {
            for kernel in [Kernel::Auto, Kernel::Fa1, Kernel::Fa2, Kernel::SplitKv, Kernel::Unfused] {
                for math in [F32Math::Exact, F32Math::Tf32, F32Math::SplitTf32] {
                    assert_ne!(pick(kernel, spec, math).ok(), Some(Launcher::Tf32), "{kernel} {math:?}");
                }
            }
        }
    }

    fn ragged(q: Vec<usize>, k: Vec<usize>, hq: usize, hkv: usize, dtype: DType) -> AttentionSpec {
        let r = sdpa_core::Ragged::new(q, k);
        let shape = Shape { b: r.batch(), hq, hkv, sq: r.max_q().max(1), sk: r.max_k().max(1), d: 128, dv: 128 };
        AttentionSpec::new(shape, dtype).with_ragged(r, sdpa_core::Layout::Bshd)
    }

    /// Ragged calls: `auto` decodes on splitkv only when every sequence is decoding-like and the longest is
    /// long enough, prefills on fa2; fa1, unfused, f32 and calls the tensor cores cannot take are refused
    /// with the reason and what to use, never sent to fa1.
    #[test]
    fn ragged_calls_run_on_the_tensor_core_kernels_or_are_refused() {
        let auto = |spec: &AttentionSpec| pick(Kernel::Auto, spec, F32Math::Exact);
        // Decoding: group 4 x 1..16 rows per kv head <= 64; the longest has AUTO_SPLITKV_MIN_KEYS keys.
        let k = vec![100, AUTO_SPLITKV_MIN_KEYS, 7, 0];
        let decode = ragged(vec![1, 16, 0, 3], k.clone(), 32, 8, DType::BF16);
        assert_eq!(auto(&decode).expect("auto"), Launcher::SplitKv);
        let paged = AttentionSpec { ragged: decode.ragged.clone().map(|r| r.paged(16, 0)), ..decode.clone() };
        assert_eq!(auto(&paged).expect("auto"), Launcher::SplitKv);
        // One sequence with 17 rows (group·Sq = 68), or keys one short: fa2.
        assert_eq!(auto(&ragged(vec![1, 17, 0, 3], k, 32, 8, DType::BF16)).expect("auto"), Launcher::Fa2);
        let short = ragged(vec![1, 1], vec![AUTO_SPLITKV_MIN_KEYS - 1, 5], 32, 8, DType::F16);
        assert_eq!(auto(&short).expect("auto"), Launcher::Fa2);
        // Prefill (chunked included).
        let prefill = ragged(vec![512, 0, 64], vec![512, 9, 4096], 16, 16, DType::BF16);
        assert_eq!(auto(&prefill).expect("auto"), Launcher::Fa2);
        assert_eq!(pick(Kernel::Fa2, &prefill, F32Math::Exact).expect("fa2"), Launcher::Fa2);
        assert_eq!(pick(Kernel::SplitKv, &decode, F32Math::Exact).expect("splitkv"), Launcher::SplitKv);
        // fa1 and unfused refuse, naming themselves and what runs ragged calls.
        for kernel in [Kernel::Fa1, Kernel::Unfused] {
            let e = pick(kernel, &prefill, F32Math::Exact).expect_err("refused").to_string();
            assert!(e.contains(kernel.name()) && e.contains("ragged") && e.contains("fa2"), "{e}");
        }
        // f32: every kernel, every f32 math.
        let f32_spec = ragged(vec![64, 3], vec![64, 70], 8, 8, DType::F32);
        for kernel in [Kernel::Auto, Kernel::Fa2, Kernel::SplitKv, Kernel::Fa1, Kernel::Unfused] {
            for math in [F32Math::Exact, F32Math::Tf32, F32Math::SplitTf32] {
                let e = pick(kernel, &f32_spec, math).expect_err("refused").to_string();
                assert!(e.contains("f16/bf16"), "{kernel} {math:?}: {e}");
            }
        }
        // A head dim that is not a multiple of 8 runs packed K/V (narrow copies, issue 21); in a paged
        // cache (whose block-table loads copy whole 16-byte chunks) it is refused, not sent to fa1.
        let odd = AttentionSpec { shape: Shape { d: 36, dv: 36, ..prefill.shape }, ..prefill.clone() };
        assert_eq!(pick(Kernel::Fa2, &odd, F32Math::Exact).expect("fa2"), Launcher::Fa2);
        let odd_paged = AttentionSpec { shape: Shape { d: 36, dv: 36, ..paged.shape }, ..paged.clone() };
        for kernel in [Kernel::Auto, Kernel::Fa2, Kernel::SplitKv] {
            let e = pick(kernel, &odd_paged, F32Math::Exact).expect_err("refused").to_string();
            assert!(e.contains("tensor-core"), "{e}");
        }
        assert!(refuse_ragged("fa1", &gqa(1, 8, 8, 64, 64, 64, DType::BF16)).is_ok(), "dense calls pass");
    }

    /// Ragged calls and `fa3`: asked for by name it is the launcher (and refuses there what it cannot take);
    /// `auto` sends ragged prefill to it only when the dispatcher found that it takes the call (`tc.fa3`),
    /// never decoding-like calls (splitkv's), and [`fa3_may_take_ragged`] says yes only for packed K/V and
    /// head dims where fa3 pays.
    #[test]
    fn ragged_prefill_goes_to_fa3_where_it_takes_the_call() {
        let auto = |spec: &AttentionSpec, fa3: bool| {
            let opts = RunOptions { kernel: Kernel::Auto, ..Default::default() };
            let tc = TensorCores::of(spec, &params(spec), H100_OPTIN).with_fa3(fa3);
            choose(Kernel::Auto, spec, &opts, tc).expect("auto")
        };
        let prefill = ragged(vec![512, 0, 64], vec![512, 9, 4096], 16, 4, DType::BF16);
        assert_eq!(auto(&prefill, true), Launcher::Fa3);
        assert_eq!(auto(&prefill, false), Launcher::Fa2);
        let decode = ragged(vec![1, 16, 0, 3], vec![100, AUTO_SPLITKV_MIN_KEYS, 7, 0], 32, 8, DType::BF16);
        assert_eq!(auto(&decode, true), Launcher::SplitKv, "decoding stays on splitkv");
        for spec in [&prefill, &decode] {
            assert_eq!(pick(Kernel::Fa3, spec, F32Math::Exact).expect("fa3 by name"), Launcher::Fa3);
        }
        assert!(fa3_may_take_ragged(&prefill));
        let paged = AttentionSpec { ragged: prefill.ragged.clone().map(|r| r.paged(16, 0)), ..prefill.clone() };
        assert!(!fa3_may_take_ragged(&paged), "auto keeps paged caches on fa2 and splitkv");
        let narrow = AttentionSpec { shape: Shape { d: 32, dv: 32, ..prefill.shape }, ..prefill.clone() };
        assert!(!fa3_may_take_ragged(&narrow), "D = 32 ran slower on fa3 (dense)");
        assert!(!fa3_may_take_ragged(&gqa(1, 8, 8, 4096, 4096, 128, DType::BF16)), "dense: not this rule");
    }

    /// Regression: `fa3_may_take_ragged` asked only for packed K/V and head dims, so a batch of decoding
    /// steps over caches too short for `splitkv` (every `group·Sq_b <= 64`, longest `Sk_b < 1024`) went to
    /// `fa3` under `auto`: not prefill, and not measured (its 128-row tiles hold a row or a few). It stays on
    /// `fa2`, as dense decoding-like calls do; one sequence with more rows makes the batch prefill.
    #[test]
    fn short_ragged_decoding_stays_on_fa2() {
        let auto = |spec: &AttentionSpec| {
            let opts = RunOptions { kernel: Kernel::Auto, ..Default::default() };
            let fa3 = fa3_may_take_ragged(spec);
            let tc = TensorCores::of(spec, &params(spec), H100_OPTIN).with_fa3(fa3);
            choose(Kernel::Auto, spec, &opts, tc).expect("auto")
        };
        let decode = ragged(vec![1, 4, 0, 2], vec![100, 700, 7, 0], 32, 8, DType::BF16);
        assert!(ragged_decoding_like(&decode) && !ragged_decoding(&decode));
        assert!(!fa3_may_take_ragged(&decode));
        assert_eq!(auto(&decode), Launcher::Fa2);
        let mixed = ragged(vec![1, 4, 0, 64], vec![100, 700, 7, 64], 32, 8, DType::BF16);
        assert!(!ragged_decoding_like(&mixed) && fa3_may_take_ragged(&mixed));
        assert_eq!(auto(&mixed), Launcher::Fa3);
        assert!(!ragged_decoding_like(&gqa(1, 8, 8, 1, 4096, 128, DType::BF16)), "dense: not this rule");
    }

    #[test]
    fn auto_takes_splitkv_for_long_decoding_and_fa2_for_the_rest_on_tensor_cores() {
        let auto = |spec: &AttentionSpec| pick(Kernel::Auto, spec, F32Math::Exact).expect("auto");
        // Decoding: group 4 x Sq 1 rows per kv head, 32k keys.
        assert_eq!(auto(&gqa(1, 32, 8, 1, 32768, 128, DType::BF16)), Launcher::SplitKv);
        // At the thresholds: group·Sq = 64 and Sk = AUTO_SPLITKV_MIN_KEYS still split; one more row or one
        // key fewer does not.
        assert_eq!(auto(&gqa(1, 8, 1, 8, AUTO_SPLITKV_MIN_KEYS, 64, DType::F16)), Launcher::SplitKv);
        assert_eq!(auto(&gqa(1, 8, 1, 9, AUTO_SPLITKV_MIN_KEYS, 64, DType::F16)), Launcher::Fa2);
        assert_eq!(auto(&gqa(1, 8, 1, 8, AUTO_SPLITKV_MIN_KEYS - 1, 64, DType::F16)), Launcher::Fa2);
        // Prefill.
        assert_eq!(auto(&gqa(2, 16, 16, 4096, 4096, 128, DType::BF16)), Launcher::Fa2);
    }

    #[test]
    fn auto_takes_fa3_where_it_runs_and_was_measured_faster() {
        let opts = RunOptions { kernel: Kernel::Auto, ..Default::default() };
        let auto = |spec: &AttentionSpec, fa3: bool| {
            let tc = TensorCores::of(spec, &params(spec), H100_OPTIN).with_fa3(fa3);
            choose(Kernel::Auto, spec, &opts, tc).expect("auto")
        };
        let prefill = gqa(2, 16, 16, 4096, 4096, 128, DType::BF16);
        assert_eq!(auto(&prefill, true), Launcher::Fa3);
        // Not on this device (or a call fa3 refuses): fa2, as before.
        assert_eq!(auto(&prefill, false), Launcher::Fa2);
        // Decoding still splits the keys.
        assert_eq!(auto(&gqa(1, 32, 8, 1, 32768, 128, DType::BF16), true), Launcher::SplitKv);
        // Below the measured lengths, or fewer query tiles than a wave: fa2.
        let short = |d, n| gqa(8, 16, 16, n, n, d, DType::F16);
        assert_eq!(auto(&short(128, AUTO_FA3_MIN_ROWS), true), Launcher::Fa3);
        assert_eq!(auto(&short(128, AUTO_FA3_MIN_ROWS - 1), true), Launcher::Fa2);
        assert_eq!(auto(&short(64, AUTO_FA3_MIN_ROWS), true), Launcher::Fa3);
        let one_head = gqa(1, 1, 1, 512, 512, 64, DType::BF16);
        assert_eq!(auto(&one_head, true), Launcher::Fa2);
        let wave = gqa(1, 32, 8, 512, 512, 64, DType::BF16); // 4 tiles x 32 heads = 128
        assert_eq!(auto(&wave, true), Launcher::Fa3);
        // A query chunk over a long cache (chunked prefill): fa3 from 128 rows over 8192 keys, however few
        // tiles (32 here); shorter caches or chunks stay on fa2.
        let chunk = |sq, sk| gqa(1, 32, 4, sq, sk, 128, DType::BF16).with_mask(Mask::CausalBottomRight);
        assert_eq!(auto(&chunk(128, AUTO_FA3_CHUNK_MIN_KEYS), true), Launcher::Fa3);
        assert_eq!(auto(&chunk(256, 4 * AUTO_FA3_CHUNK_MIN_KEYS), true), Launcher::Fa3);
        assert_eq!(auto(&chunk(128, AUTO_FA3_CHUNK_MIN_KEYS - 1), true), Launcher::Fa2);
        assert_eq!(auto(&chunk(127, AUTO_FA3_CHUNK_MIN_KEYS), true), Launcher::Fa2);
        // Causal at D = 64 from the grid's shortest length (fa3 1.10x fa2 at 512 since session 20), as at
        // D = 128; below it, fa2.
        let causal_at = |d, n| short(d, n).with_mask(Mask::CausalTopLeft);
        assert_eq!(auto(&causal_at(64, AUTO_FA3_MIN_ROWS - 1), true), Launcher::Fa2);
        assert_eq!(auto(&causal_at(64, AUTO_FA3_MIN_ROWS), true), Launcher::Fa3);
        // Head dims 33..63 keep their own, longer threshold under a causal mask too.
        assert_eq!(auto(&causal_at(40, 1024), true), Launcher::Fa2);
        assert_eq!(auto(&causal_at(40, AUTO_FA3_NARROW_MIN_KEYS), true), Launcher::Fa3);
        assert_eq!(auto(&causal_at(128, 512), true), Launcher::Fa3);
        // A mask: causal runs on fa3 too (fa3 refusing explicit masks shows in `tc.fa3`).
        let causal = prefill.clone().with_mask(Mask::CausalBottomRight);
        assert_eq!(auto(&causal, true), Launcher::Fa3);
        // Variants (windows, softcap, ALiBi): the same rule as plain calls.
        let windowed = prefill.clone().with_window(sdpa_core::variants::Window::left(1024));
        let capped = prefill.clone().with_softcap(30.0);
        for v in [&windowed, &capped] {
            assert_eq!(auto(v, true), Launcher::Fa3);
        }
        // Head dims (issue 21's grid): fa2 at D <= 32 and at D 33..63 below 2k keys, fa3 above.
        let dims = |d, dv, n| AttentionSpec::new(Shape { dv, ..Shape::new(2, 16, n, n, d) }, DType::BF16);
        assert_eq!(auto(&dims(32, 32, 4096), true), Launcher::Fa2);
        assert_eq!(auto(&dims(40, 40, AUTO_FA3_NARROW_MIN_KEYS - 1), true), Launcher::Fa2);
        assert_eq!(auto(&dims(40, 40, AUTO_FA3_NARROW_MIN_KEYS), true), Launcher::Fa3);
        assert_eq!(auto(&dims(256, 256, 1024), true), Launcher::Fa3);
        assert_eq!(auto(&dims(192, 128, 1024), true), Launcher::Fa3);
    }

    #[test]
    fn auto_outside_the_tensor_core_kernels_is_fa1_or_the_tf32_path() {
        let decoding = |d, dtype| gqa(1, 32, 8, 1, 32768, d, dtype);
        // f32: exact on fa1; TF32 and split TF32 on the tensor-core f32 path (kernel fa2).
        assert_eq!(pick(Kernel::Auto, &decoding(128, DType::F32), F32Math::Exact).expect("auto"), Launcher::Fa1);
        for math in [F32Math::Tf32, F32Math::SplitTf32] {
            let l = pick(Kernel::Auto, &decoding(128, DType::F32), math).expect("auto");
            assert_eq!((l, l.kernel()), (Launcher::Tf32, Kernel::Fa2));
        }
        // f16/bf16 above 256 run `wide` (cuBLAS slabs), whatever the f32 math says; head-dim classes decode on
        // splitkv.
        assert_eq!(pick(Kernel::Auto, &decoding(264, DType::BF16), F32Math::Tf32).expect("auto"), Launcher::Wide);
        // Head dims that are not multiples of 8 decode on splitkv too (issue 21), and f32 with TF32 takes
        // its path at any D and Dv up to 256, unequal included; above, exact fa1.
        assert_eq!(pick(Kernel::Auto, &decoding(36, DType::BF16), F32Math::Tf32).expect("auto"), Launcher::SplitKv);
        let mla_odd = AttentionSpec::new(Shape { dv: 31, ..Shape::new(1, 8, 128, 2048, 65) }, DType::F32);
        assert_eq!(pick(Kernel::Auto, &mla_odd, F32Math::Tf32).expect("auto"), Launcher::Tf32);
        assert_eq!(pick(Kernel::Auto, &decoding(264, DType::F32), F32Math::Tf32).expect("auto"), Launcher::Fa1);
        assert!(pick(Kernel::Fa2, &decoding(264, DType::F32), F32Math::Tf32).is_err());
        assert_eq!(pick(Kernel::Auto, &decoding(80, DType::BF16), F32Math::Tf32).expect("auto"), Launcher::SplitKv);
        // Were splitkv to refuse a call fa2 takes, fa2 runs it (decoding included).
        let spec = decoding(80, DType::BF16);
        let only_fa2 = TensorCores { fa2: true, splitkv: false, fa3: false, mla: false };
        let opts = RunOptions { kernel: Kernel::SplitKv, ..Default::default() };
        assert_eq!(choose(Kernel::SplitKv, &spec, &opts, only_fa2).expect("choice"), Launcher::Fa2);
        assert_eq!(choose(Kernel::Auto, &spec, &opts, only_fa2).expect("choice"), Launcher::Fa2);
        let negative = decoding(128, DType::F16).with_scale(-0.5);
        assert_eq!(pick(Kernel::Auto, &negative, F32Math::Exact).expect("auto"), Launcher::Fa1);
    }

    /// Head dims above 256 in f16/bf16: `auto` runs the wide-head path (reported as `unfused`), prefill and
    /// MLA decoding alike, any mask; f32 and the kernels asked for by name keep their rules.
    #[test]
    fn auto_runs_head_dims_above_256_on_the_wide_path() {
        let mla = AttentionSpec::new(Shape { dv: 512, ..gqa(8, 128, 1, 1, 4096, 576, DType::BF16).shape }, DType::BF16);
        let prefill = gqa(2, 4, 4, 4096, 4096, 512, DType::F16).with_mask(Mask::CausalBottomRight);
        for spec in [mla, prefill.clone(), gqa(1, 8, 2, 100, 300, 4096, DType::BF16)] {
            let l = pick(Kernel::Auto, &spec, F32Math::Exact).expect("auto");
            assert_eq!((l, l.kernel()), (Launcher::Wide, Kernel::Unfused), "{spec:?}");
        }
        assert_eq!(pick(Kernel::Fa2, &prefill, F32Math::Exact).expect("fa2"), Launcher::Fa1);
        assert_eq!(pick(Kernel::Unfused, &prefill, F32Math::Exact).expect("unfused"), Launcher::Unfused);
        let f32_spec = gqa(1, 4, 4, 64, 64, 512, DType::F32);
        assert_eq!(pick(Kernel::Auto, &f32_spec, F32Math::Exact).expect("auto"), Launcher::Fa1);
        assert_eq!(
            pick(Kernel::Auto, &gqa(1, 4, 4, 64, 64, 256, DType::BF16), F32Math::Exact).expect("auto"),
            Launcher::Fa2
        );
    }

    /// MLA decoding (576/512) on a device where the fused MLA path takes it: `auto` at decoding's row counts
    /// and `splitkv` by name run it (reported as `splitkv`); more rows per kv head, and devices where it
    /// refuses, keep `wide`.
    #[test]
    fn mla_decoding_takes_the_fused_path_where_the_device_has_it() {
        let mla = |hq, sq| {
            AttentionSpec::new(Shape { dv: 512, ..gqa(8, hq, 1, sq, 4096, 576, DType::BF16).shape }, DType::BF16)
        };
        let choose_on = |kernel, spec: &AttentionSpec, mla_ok: bool| {
            let opts = RunOptions { kernel, ..Default::default() };
            let tc = TensorCores::of(spec, &params(spec), H100_OPTIN).with_mla(mla_ok);
            choose(kernel, spec, &opts, tc).expect("choice")
        };
        for (hq, sq) in [(16, 1), (128, 1), (16, 4), (32, 4)] {
            let l = choose_on(Kernel::Auto, &mla(hq, sq), true);
            assert_eq!((l, l.kernel()), (Launcher::SplitKvMla, Kernel::SplitKv), "{hq} heads, Sq = {sq}");
            assert_eq!(choose_on(Kernel::SplitKv, &mla(hq, sq), true), Launcher::SplitKvMla);
            assert_eq!(choose_on(Kernel::Auto, &mla(hq, sq), false), Launcher::Wide);
        }
        // Ragged and paged MLA decoding take it too; without it (another GPU) they are refused with the reason.
        let paged = mla(16, 1)
            .with_ragged(sdpa_core::Ragged::new(vec![1; 8], vec![4096; 8]).paged(64, 0), sdpa_core::Layout::Bshd);
        assert_eq!(choose_on(Kernel::Auto, &paged, true), Launcher::SplitKvMla);
        let opts = RunOptions::default();
        let tc = TensorCores::of(&paged, &params(&paged), H100_OPTIN);
        assert!(choose(Kernel::Auto, &paged, &opts, tc).is_err_and(|e| e.to_string().contains("MLA path")));
        // A ragged batch past AUTO_MAX_ROWS (128 heads x 2 speculative rows) still takes it: nothing else would.
        let wide_rows =
            mla(128, 1).with_ragged(sdpa_core::Ragged::new(vec![2, 1], vec![900, 4096]), sdpa_core::Layout::Bshd);
        assert_eq!(choose_on(Kernel::Auto, &wide_rows, true), Launcher::SplitKvMla);
        // 128 heads with 4 speculative rows: 512 rows per kv head, past AUTO_MAX_ROWS.
        assert_eq!(choose_on(Kernel::Auto, &mla(128, 4), true), Launcher::Wide);
        assert_eq!(choose_on(Kernel::SplitKv, &mla(128, 4), true), Launcher::SplitKvMla);
        assert_eq!(choose_on(Kernel::Unfused, &mla(16, 1), true), Launcher::Unfused);
    }

    #[test]
    fn fa2_and_splitkv_fall_back_to_fa1_where_the_tensor_cores_cannot_run() {
        let ok = gqa(1, 8, 8, 128, 2048, 128, DType::BF16);
        for (kernel, launcher) in [(Kernel::Fa2, Launcher::Fa2), (Kernel::SplitKv, Launcher::SplitKv)] {
            assert_eq!(pick(kernel, &ok, F32Math::Exact).expect("choice"), launcher);
            for spec in [
                gqa(1, 8, 8, 128, 2048, 264, DType::BF16), // head dim above 256
                AttentionSpec::new(Shape { dv: 260, ..Shape::new(1, 8, 128, 2048, 128) }, DType::F16), // Dv
                ok.clone().with_scale(0.0),                // scale
            ] {
                assert_eq!(pick(kernel, &spec, F32Math::Exact).expect("choice"), Launcher::Fa1, "{spec:?}");
            }
            // Head-dim classes (D = 80, D != Dv) and head dims that are not multiples of 8 (issue 21): the
            // kernel asked for runs.
            for spec in [
                gqa(1, 8, 8, 128, 2048, 80, DType::BF16),
                AttentionSpec::new(Shape { dv: 128, ..Shape::new(1, 8, 128, 2048, 192) }, DType::F16),
                gqa(1, 8, 8, 128, 2048, 36, DType::BF16),
                gqa(1, 8, 8, 128, 2048, 1, DType::F16),
                AttentionSpec::new(Shape { dv: 31, ..Shape::new(1, 8, 128, 2048, 65) }, DType::BF16),
            ] {
                assert_eq!(pick(kernel, &spec, F32Math::Exact).expect("choice"), launcher, "{spec:?}");
            }
            // Operands that are not 16-byte aligned (a pointer 8 bytes off, odd strides) run the narrow copies;
            // a pointer that is not even element-aligned falls back.
            let p = AttnParams { k: 520, ..params(&ok) };
            assert_eq!(tensor_core_limit(&ok, &p), None);
            let p = AttnParams { q_stride: [2048 * 8 * 127, 2048 * 127, 127], ..params(&ok) };
            assert_eq!(tensor_core_limit(&ok, &p), None);
            let p = AttnParams { k: 521, ..params(&ok) };
            assert_eq!(tensor_core_limit(&ok, &p), Some(TensorCoreLimit::Unaligned));
            let opts = RunOptions { kernel, ..Default::default() };
            let none = TensorCores { fa2: false, splitkv: false, fa3: false, mla: false };
            assert_eq!(choose(kernel, &ok, &opts, none).expect("choice"), Launcher::Fa1);
        }
        // splitkv with f32 inputs runs fa1 (exact), whatever the f32 math.
        let f32_spec = gqa(1, 8, 8, 1, 4096, 128, DType::F32);
        assert_eq!(pick(Kernel::SplitKv, &f32_spec, F32Math::Tf32).expect("choice"), Launcher::Fa1);
    }

    #[test]
    fn f32_math_picks_the_f32_launcher_or_is_unsupported() {
        let spec = gqa(1, 8, 8, 256, 256, 64, DType::F32).with_mask(Mask::CausalTopLeft);
        assert_eq!(pick(Kernel::Fa1, &spec, F32Math::Exact).expect("fa1"), Launcher::Fa1);
        assert!(pick(Kernel::Fa1, &spec, F32Math::Tf32).is_err());
        assert!(pick(Kernel::Fa1, &spec, F32Math::SplitTf32).is_err());
        assert_eq!(pick(Kernel::Fa2, &spec, F32Math::SplitTf32).expect("fa2"), Launcher::Tf32);
        assert!(pick(Kernel::Fa2, &spec, F32Math::Exact).is_err());
        for math in [F32Math::Exact, F32Math::Tf32] {
            assert_eq!(pick(Kernel::Unfused, &spec, math).expect("unfused"), Launcher::Unfused);
        }
        // f16/bf16 ignore the f32 math.
        let half = gqa(1, 8, 8, 256, 256, 64, DType::F16);
        assert_eq!(pick(Kernel::Fa1, &half, F32Math::Tf32).expect("fa1"), Launcher::Fa1);
        assert_eq!(pick(Kernel::Fa2, &half, F32Math::Tf32).expect("fa2"), Launcher::Fa2);
    }

    #[test]
    fn tensor_core_limits_name_the_first_reason() {
        let spec = gqa(1, 8, 8, 64, 64, 64, DType::F32);
        assert_eq!(tensor_core_limit(&spec, &params(&spec)), Some(TensorCoreLimit::DType(DType::F32)));
        let spec = gqa(1, 8, 8, 64, 64, 40, DType::BF16);
        assert_eq!(tensor_core_limit(&spec, &params(&spec)), None);
        assert_eq!(splitkv_limit(&spec, &params(&spec), H100_OPTIN), None);
        // splitkv's cp.async tile at class 256 (169 KB) fits the H100, not an A100 (163 KB) nor a 99 KB part;
        // class 64 fits all three.
        let big = gqa(1, 8, 8, 1, 4096, 248, DType::BF16);
        assert_eq!(splitkv_limit(&big, &params(&big), H100_OPTIN), None);
        for optin in [163 * 1024, 99 * 1024] {
            assert!(
                matches!(splitkv_limit(&big, &params(&big), optin), Some(TensorCoreLimit::SharedMemory { .. })),
                "{optin}"
            );
            let tc = TensorCores::of(&big, &params(&big), optin);
            let opts = RunOptions { kernel: Kernel::Auto, ..Default::default() };
            assert_eq!(choose(Kernel::Auto, &big, &opts, tc).expect("auto"), Launcher::Fa2);
            let all_but_fa3 = TensorCores { fa2: true, splitkv: true, fa3: false, mla: false };
            assert_eq!(TensorCores::of(&spec, &params(&spec), optin), all_but_fa3);
        }
        let spec = gqa(1, 8, 8, 64, 64, 44, DType::BF16);
        assert_eq!(tensor_core_limit(&spec, &params(&spec)), None);
        let spec = gqa(1, 8, 8, 64, 64, 300, DType::BF16);
        assert_eq!(tensor_core_limit(&spec, &params(&spec)), Some(TensorCoreLimit::HeadDims { d: 300, dv: 300 }));
        let spec = gqa(1, 8, 8, 64, 64, 256, DType::BF16);
        assert_eq!(tensor_core_limit(&spec, &params(&spec)), None);
        let p = AttnParams { q_stride: [256 * 64, 64, 4], ..params(&spec) };
        assert_eq!(tensor_core_limit(&spec, &p), None, "narrow copies take rows 4 elements apart");
        let p = AttnParams { o: 1025, ..params(&spec) };
        assert_eq!(tensor_core_limit(&spec, &p), Some(TensorCoreLimit::Unaligned));
    }
}
