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
//! - `fa1`: FlashAttention-1 structure in SIMT arithmetic, f32/f16/bf16, fast variants for
//!   [`FA1_FAST_HEAD_DIMS`] and a generic variant for any D and Dv up to [`MAX_HEAD_DIM`].
//! - `fa2` with f32 inputs: the opt-in tensor-core path, `F32Math::Tf32` (one TF32 product) or
//!   `F32Math::SplitTf32` (three TF32 products, near-f32 accuracy); f16/bf16 FA-2 is its own module.
//!
//! All kernels: every mask kind, GQA by index, `Sq != Sk`, any strides (BHSD and BSHD), optional LSE.
//!
//! # For kernel authors (the machinery)
//! - A module is a `.cu` file in `kernels/`, registered with one line in [`modules::MODULES`] (a
//!   [`modules::ModuleSource`] built with `include_str!`). Shared headers are registered in
//!   [`modules::HEADERS`] and handed to NVRTC in memory (`#include "common.cuh"`).
//! - Entry points are `extern "C"`, named `{kernel}_{dtype}[_{headdim}]`, and take one
//!   [`params::AttnParams`] by value (`struct AttnParams` in `common.cuh`, same layout).
//! - [`device::Device::module`] compiles on first use for the device's own `sm_XY`, with the include dir
//!   from [`libs::include_dir`], caching the CUBIN on disk ([`cache`]); the compiler log is kept in the
//!   error ([`CudaError::Compile`]).
//! - [`launch::launch`] checks a [`launch::LaunchDims`] against the device (threads, grid, shared memory,
//!   opting in above 48 KB) and launches on the call's stream. A kernel implementation is a
//!   `fn run(call: &Call) -> Result<()>` over a [`call::Call`] (device, stream, spec, options, params with
//!   pointers), wired into [`backend::dispatch`].
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
pub mod buffer;
pub mod cache;
pub mod call;
pub mod device;
pub mod error;
pub mod fa1;
pub mod fa2;
pub mod launch;
pub mod libs;
pub mod modules;
pub mod nvrtc;
pub mod params;
pub mod splitkv;
pub mod tensor_map;
pub mod tf32;
pub mod unfused;

pub use backend::{dispatch, CudaBackend, CudaElement, L2Flush, FA1_FAST_HEAD_DIMS, MAX_HEAD_DIM};
pub use buffer::CudaBuffer;
pub use call::Call;
pub use device::{Device, DeviceInfo};
pub use error::CudaError;
pub use params::AttnParams;

/// Re-export of the cudarc version this crate is built against, so callers use the same types.
pub use cudarc;
