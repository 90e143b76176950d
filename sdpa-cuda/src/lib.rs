//! sdpa-cuda: the CUDA attention backend, kernels in `.cu` files compiled at run time by NVRTC through
//! cudarc.
//!
//! The crate builds and its tests pass on a machine with no CUDA at all: cudarc loads the driver, NVRTC
//! and cuBLAS at run time, and [`CudaBackend::new`] returns `SdpaError::DeviceUnavailable` ("no CUDA driver
//! found (libcuda.so not loadable)", "no GPU: ...") instead of panicking.
//!
//! ```no_run
//! use sdpa_core::{AttentionSpec, DType, HostBackend, HostInputs, Kernel, Mask, RunOptions, Shape};
//! use sdpa_cuda::CudaBackend;
//!
//! let gpu = match CudaBackend::new(0) {
//!     Ok(gpu) => gpu,
//!     Err(e) => { eprintln!("skipping: {e}"); return; }
//! };
//! let spec = AttentionSpec::new(Shape::new(1, 8, 1000, 1000, 128), DType::BF16).with_mask(Mask::CausalTopLeft);
//! let inputs = HostInputs::random(&spec, 0).unwrap();
//! let opts = RunOptions { kernel: Kernel::Fa1, ..Default::default() };
//! let run = gpu.run_host(&spec, &opts, &inputs).unwrap();
//! ```
//!
//! # Kernels
//! - `unfused`: cuBLAS Q·Kᵀ into f32 scores, a softmax kernel (scale, mask, LSE) writing P in the input
//!   dtype, cuBLAS P·V into O, the way eager PyTorch runs attention; f32 exact or TF32 (`F32Math::Tf32`).
//! - `fa1`: FlashAttention-1 structure, f32/f16/bf16: on tensor cores for f16/bf16 at D = Dv in
//!   [`fa1::FA1_MMA_HEAD_DIMS`], in SIMT arithmetic otherwise (fast variants for [`FA1_FAST_HEAD_DIMS`]
//!   and a generic variant for any D and Dv up to [`MAX_HEAD_DIM`]); f32 stays exact.
//! - `fa2`: FlashAttention-2 on tensor cores for f16/bf16 at any D and Dv from 1 to 256 (compiled
//!   head-dim classes, [`fa2::HEAD_DIM_CLASSES`], the extra columns zero-filled; rows that are not 16-byte
//!   aligned copied in narrower chunks, or, in prefill long enough to repay it, copied once into aligned
//!   scratch, [`kernels::pad_copy`]); with f32
//!   inputs the opt-in tensor-core path ([`tf32`]), `F32Math::Tf32` (one TF32 product) or
//!   `F32Math::SplitTf32` (three TF32 products, near-f32 accuracy).
//! - `splitkv`: flash-decoding on tensor cores for f16/bf16, the keys split across warps and blocks.
//! - `auto`: see [`kernels::policy`]; `fa2` and `splitkv` fall back to `fa1` where the tensor cores cannot run
//!   (head dims above 256, f32 without TF32).
//!
//! All kernels: every mask kind, GQA by index, `Sq != Sk`, any strides (BHSD and BSHD), optional LSE.
//!
//! # Variants (issue 22)
//! Sliding windows, logit softcap and ALiBi, exactly as `sdpa_core::reference` computes them, in `fa2`,
//! `splitkv`, `fa1` and `unfused` (the TF32 path refuses them with the reason; `auto` runs such f32 calls on
//! exact `fa1`, [`kernels::policy`]). Every call carries its key band (causal mask and window as one band,
//! `AttnParams::band_lo/band_hi`), softcap, ALiBi slopes (uploaded once per slope set and kept by the
//! device) and diagonal. The tensor-core kernels compile the variants into the instantiation
//! (`checked::params::Masking`: band, explicit mask, softcap, ALiBi bits): key tiles outside every row's band
//! are never loaded (fa2 and fa1m run from the band's first tile to its last; splitkv's splits share the
//! band's keys, so their count and length follow the window, not Sk), softcap and ALiBi are applied in
//! registers before the online max. The SIMT `fa1` and `unfused` read them at run time (f32 stays exact:
//! `tanhf` there, an `ex2`/`rcp` form with error 1e-6 in the tensor-core kernels).
//!
//! # Backward (issue 24)
//! `Backend::backward` (and [`CudaBackend::backward_on_stream`] for callers that own their device memory and
//! stream) runs FlashAttention-2's backward on tensor cores for f16/bf16 ([`kernels::bwd`]): Delta per row,
//! one block per key tile that walks the query tiles of its band for every query head of its group (dK/dV without
//! atomics), dQ added into an f32 accumulator with atomics and rounded by a last pass, or, with
//! `BackwardOptions::deterministic`, computed by a separate kernel per query tile (bitwise repeatable). Every head-dim
//! class, Dv != D, every mask, windows, softcap, ALiBi, GQA, both layouts and ragged (varlen) batches; head dims that
//! are not multiples of 8 (any D and Dv from 1 to 256) and misaligned views through zero-padded copies
//! ([`kernels::bwd_pad`]); f32 and paged KV caches are refused. `Backend::time_pass` times passes with device events.
//!
//! # Layout: three layers, then the backend
//! - [`sys`], library access: finding the CUDA libraries ([`libs`]), the kernel sources built in
//!   ([`modules`]), the programs made of them ([`program`]: one per kernel instantiation), NVRTC ([`nvrtc`]),
//!   images compiled or read on parallel threads ([`images`]) and the disk cache ([`cache`]).
//! - [`checked`], checked wrappers: one GPU and its limits ([`device`]), buffers ([`buffer`]), the
//!   parameter struct ([`params`]), TMA tensor maps ([`tensor_map`]), the one launch function ([`launch`])
//!   and the [`Call`] handed to a launcher.
//! - [`kernels`], the launchers, one per `.cu` family ([`unfused`], [`fa1`], [`fa2`], [`splitkv`], [`tf32`],
//!   [`kernels::bwd`]), and [`kernels::policy`]: which family runs a call (`auto` and the fallbacks), in one place.
//! - [`backend`]: [`CudaBackend`], the `sdpa_core::Backend` on top.
//!
//! The old flat paths (`sdpa_cuda::fa2`, `sdpa_cuda::modules`, ...) are re-exports of these modules.
//!
//! # For kernel authors (the machinery)
//! - A kernel family is a `.cu` file in `kernels/` holding templates and an entry macro
//!   (`FA2_ENTRY(NAME, T, D, tile..., MASK)`), registered with one line in [`modules::MODULES`] (a
//!   [`modules::ModuleSource`] built with `include_str!`). Shared headers are registered in
//!   [`modules::HEADERS`] and handed to NVRTC in memory (`#include "common.cuh"`).
//! - Each instantiation is its own NVRTC program ([`program::Program`]): the family's source included, plus
//!   the one macro line the launcher writes from the same table it plans launches with (so a tile is written
//!   once, in Rust); a call compiles about a second's worth, not the family. The launcher's `programs()`
//!   lists every instantiation it can ask for ([`kernels::all_programs`]: CI compiles all of them).
//! - Entry points are `extern "C"`, named `{kernel}_{dtype}[_{headdim}][_{mask}]`, and take one
//!   [`params::AttnParams`] by value (`struct AttnParams` in `common.cuh`, same layout).
//! - [`device::Device::prepare`] loads programs on first use for the device's own `sm_XY` (many at once on
//!   parallel threads, [`images`]), with the include dir from [`libs::include_dir`], caching each CUBIN on
//!   disk ([`cache`]); the compiler log is kept in the error ([`CudaError::Compile`]).
//!   [`CudaBackend::warm_up`] does it ahead of time for the calls a caller names.
//! - [`launch::launch`] checks a [`launch::LaunchDims`] against the device (threads, grid, shared memory,
//!   opting in above 48 KB) and launches on the call's stream. A kernel implementation is a
//!   `fn run(call: &Call) -> Result<()>` over a [`call::Call`] (device, stream, spec, options, params with
//!   pointers), wired into [`kernels::dispatch`] through a [`kernels::policy::Launcher`].
//! - [`CudaBackend::forward_on_stream`] runs on caller-owned `CudaSlice`/`CudaView` memory and a caller's
//!   stream (candle's).
//!
//! # NaN under a masked key
//! The fast paths multiply a masked key's `p = 0` by its value row (on the tensor cores, or in cuBLAS's
//! P·V for `unfused`), and the tensor-core kernels add an explicit mask to a score that may already be NaN.
//! So a NaN or inf in V at a key a row does not see, or a NaN in K under an explicit `-inf`, would reach that
//! row, where the reference and the CPU backend skip such keys. Every kernel therefore votes, after writing
//! its outputs, whether it wrote a non-finite value; only then are the affected rows recomputed without
//! their masked keys, one warp per row in exact f32 (`kernels/common.cuh`, `repair_nonfinite_rows`; for
//! `unfused` a small pass after cuBLAS). NaN in Q, or in a key or value a row sees, stays NaN as in the
//! reference. Rows with finite output pay only the vote; the recompute is far slower than the kernels and
//! runs only when the inputs hold NaN or inf.

pub mod backend;
pub mod checked;
pub mod error;
pub mod kernels;
pub mod ring;
pub mod sys;

// The modules by their names before the three layers had folders, so `sdpa_cuda::fa2::...`,
// `sdpa_cuda::modules::...` and the like keep working.
pub use checked::{buffer, call, device, launch, params, tensor_map};
pub use kernels::{fa1, fa2, splitkv, tf32, unfused};
pub use sys::{cache, images, libs, modules, nvrtc, program};

pub use backend::{CudaBackend, CudaElement, L2Flush, WarmedUp, FA1_FAST_HEAD_DIMS, MAX_HEAD_DIM};
pub use checked::buffer::CudaBuffer;
pub use checked::call::Call;
pub use checked::device::{Device, DeviceInfo};
pub use checked::params::AttnParams;
pub use error::CudaError;
pub use kernels::dispatch;
pub use ring::{RingBackend, RingProfile};

/// Re-export of the cudarc version this crate is built against, so callers use the same types.
pub use cudarc;
