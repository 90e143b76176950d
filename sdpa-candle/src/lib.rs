//! sdpa-candle: one scaled dot-product attention call for candle models.
//!
//! Candle models compute attention as `softmax(q.matmul(kᵀ) · scale + mask).matmul(v)`, materialising the
//! `[B, H, Sq, Sk]` score matrix. [`sdpa`] replaces those lines with one call that runs sdpa's fused kernels
//! on candle's own storage: sdpa-cpu on the CPU and, with the `cuda` feature, sdpa-cuda on candle's CUDA
//! memory and stream. Q, K and V are read in place through their candle strides and start offsets (a
//! transposed or narrowed view costs no copy); the output is a new contiguous tensor in the same dims
//! order as the inputs.
//!
//! ```
//! use candle_core::{DType, Device, Tensor};
//! use sdpa_candle::{sdpa, SdpaMask, SdpaOptions};
//!
//! # fn main() -> candle_core::Result<()> {
//! let dev = Device::Cpu;
//! // [B, S, H, D] as projections produce them; 8 query heads share 2 kv heads (GQA).
//! let q = Tensor::randn(0f32, 1.0, (1, 7, 8, 32), &dev)?;
//! let k = Tensor::randn(0f32, 1.0, (1, 7, 2, 32), &dev)?;
//! let v = Tensor::randn(0f32, 1.0, (1, 7, 2, 32), &dev)?;
//! let opts = SdpaOptions::bshd().with_mask(SdpaMask::CausalTopLeft);
//! let o = sdpa(&q, &k, &v, &opts)?;
//! assert_eq!(o.dims(), &[1, 7, 8, 32]);
//!
//! // The same call on [B, H, S, D] views of the same storage: no copy, same numbers.
//! let t = |x: &Tensor| x.transpose(1, 2);
//! let o2 = sdpa(&t(&q)?, &t(&k)?, &t(&v)?, &SdpaOptions::bhsd().with_mask(SdpaMask::CausalTopLeft))?;
//! let diff = (o2.transpose(1, 2)? - &o)?.abs()?.max_all()?.to_scalar::<f32>()?;
//! assert!(diff < 1e-6);
//! # Ok(())
//! # }
//! ```
//!
//! Semantics are sdpa's (DESIGN.md): `scale` defaults to `1/sqrt(D)`; GQA when the query heads are a
//! multiple of the kv heads (query head `h` reads kv head `h / (Hq / Hkv)`, K and V never repeated);
//! `Dv` may differ from `D`; both causal alignments are named ([`SdpaMask::CausalTopLeft`],
//! [`SdpaMask::CausalBottomRight`]); a query row that sees no key is zeros (where candle's own
//! softmax gives NaN). Accumulation is in f32 for every dtype.
//!
//! Training: when Q, K or V is a `Var` (or depends on one), the call joins candle's autograd graph and
//! `backward()` runs sdpa's fused backward (sdpa-cpu's on the CPU, sdpa-cuda's on candle's CUDA stream),
//! which recomputes the probabilities from the forward's log-sum-exp instead of keeping a `[B, H, Sq, Sk]`
//! matrix: the graph holds O and `B·Hq·Sq` f32 LSE values per call. The same holds for [`sdpa_varlen`]; a
//! paged cache's backward is an error (training keeps no cache). Explicit masks and ALiBi slopes get no
//! gradient. [`SdpaOptions::deterministic_backward`] asks for gradients that are bitwise the same run to run.
//!
//! ```
//! use candle_core::{Device, Tensor, Var};
//! use sdpa_candle::{sdpa, SdpaMask, SdpaOptions};
//!
//! # fn main() -> candle_core::Result<()> {
//! let q = Var::randn(0f32, 1.0, (1, 7, 4, 16), &Device::Cpu)?;
//! let kv = Tensor::randn(0f32, 1.0, (1, 7, 2, 16), &Device::Cpu)?;
//! let o = sdpa(&q, &kv, &kv, &SdpaOptions::bshd().with_mask(SdpaMask::CausalTopLeft))?;
//! let grads = o.sqr()?.sum_all()?.backward()?;
//! assert_eq!(grads.get(&q).map(|g| g.dims().to_vec()), Some(vec![1, 7, 4, 16]));
//! # Ok(())
//! # }
//! ```
//!
//! What a view needs: rank 4, a contiguous last dim (stride 1). Anything else (a head dim that is not
//! the innermost in memory) is an error that says to call `.contiguous()`.
//!
//! Sliding windows, logit softcapping and ALiBi ([`SdpaOptions::window`], [`SdpaOptions::softcap`],
//! [`SdpaOptions::alibi`]) follow sdpa-core's one definition: the softcap applies to the scaled score, ALiBi
//! subtracts `slope_h · |j − diag(i)|`, a window keeps keys `diag(i) − left ..= diag(i) + right`, and the
//! diagonal `diag(i)` is named (by a causal mask, else by [`SdpaOptions::diagonal`]), never guessed. They
//! combine with each other, GQA, both dims orders, every dtype and explicit masks.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use sdpa_candle::{sdpa, SdpaMask, SdpaOptions, Window};
//!
//! # fn main() -> candle_core::Result<()> {
//! // A Gemma-2-style local layer: causal, 4 keys back, logits capped at 50.
//! let q = Tensor::randn(0f32, 1.0, (1, 9, 4, 16), &Device::Cpu)?;
//! let kv = Tensor::randn(0f32, 1.0, (1, 9, 2, 16), &Device::Cpu)?;
//! let opts =
//!     SdpaOptions::bshd().with_mask(SdpaMask::CausalTopLeft).with_window(Window::left(4)).with_softcap(50.0);
//! let o = sdpa(&q, &kv, &kv, &opts)?;
//! assert_eq!(o.dims(), &[1, 9, 4, 16]);
//! # Ok(())
//! # }
//! ```
//!
//! candle-flash-attn's functions exist under the same names, argument order and meaning ([`flash_attn`],
//! [`flash_attn_windowed`], [`flash_attn_alibi`], [`flash_attn_alibi_windowed`],
//! [`flash_attn_alibi_windowed_softcap`]: BSHD tensors, FlashAttention's bottom-right causal mask, windows
//! with `None` for unbounded), on the CPU and on CUDA, so moving a model over is a rename; [`flash`] says
//! how each argument maps onto sdpa's semantics.
//!
//! Serving (ragged batches and paged KV caches): [`sdpa_varlen`] runs sequences of different lengths packed
//! into `[total, H, D]` rows with cumulative offsets (`cu_seqlens`, as FlashAttention's varlen API), each
//! its own attention problem; [`sdpa_paged`] reads K/V from a paged cache `[num_pages, page_size, Hkv, D]`
//! through a block table, and [`append_to_pages`] writes new tokens' K/V into it first. The offsets and the
//! table are read to the host and checked before any kernel runs. candle-flash-attn's
//! [`flash_attn_varlen`] family and [`flash_attn_varlen_paged_windowed`] exist under their names too.
//!
//! ```
//! use candle_core::{Device, Tensor};
//! use sdpa_candle::{append_to_pages, sdpa_paged, sdpa_varlen, SdpaMask, SdpaOptions};
//!
//! # fn main() -> candle_core::Result<()> {
//! let dev = Device::Cpu;
//! let opts = SdpaOptions::bshd().with_mask(SdpaMask::CausalBottomRight);
//! // Two prompts of 3 and 5 tokens, packed: [8, Hq, D] queries, [8, Hkv, D] keys and values.
//! let (q, k, v) = (
//!     Tensor::randn(0f32, 1.0, (8, 4, 16), &dev)?,
//!     Tensor::randn(0f32, 1.0, (8, 2, 16), &dev)?,
//!     Tensor::randn(0f32, 1.0, (8, 2, 16), &dev)?,
//! );
//! let cu = Tensor::new(&[0u32, 3, 8], &dev)?;
//! let o = sdpa_varlen(&q, &k, &v, &cu, &cu, &opts)?;
//! assert_eq!(o.dims(), &[8, 4, 16]);
//!
//! // The same K/V in a cache of 6 pages of 4 slots: prompt 0 in page 5, prompt 1 in pages 2 and 0.
//! let k_pages = Tensor::zeros((6, 4, 2, 16), candle_core::DType::F32, &dev)?;
//! let v_pages = k_pages.zeros_like()?;
//! let table = Tensor::new(&[[5u32, u32::MAX], [2, 0]], &dev)?;
//! let empty = Tensor::new(&[0u32, 0], &dev)?;
//! append_to_pages(&k, &v, &k_pages, &v_pages, &table, &empty, &cu)?;
//! let lens = Tensor::new(&[3u32, 5], &dev)?;
//! let paged = sdpa_paged(&q, &k_pages, &v_pages, &cu, &table, &lens, &opts)?;
//! let diff = (paged - &o)?.abs()?.max_all()?.to_scalar::<f32>()?;
//! assert!(diff < 1e-6);
//! # Ok(())
//! # }
//! ```
//!
//! Servers that want the GPU kernels compiled at start-up rather than on the first request call
//! [`warmup`] with the shapes they will serve.
//!
//! CUDA (feature `cuda`): the same call on candle CUDA tensors runs sdpa-cuda on candle's own device memory
//! and stream; Q, K, V and the mask are read in place and the output is a new allocation candle owns. The
//! feature turns on candle-core's `cuda` feature, so building it needs nvcc and the CUDA libraries
//! (`../shared/tools/candle-cuda-setup.sh` prepares a machine without them). candle-core 0.11.1 and sdpa-cuda
//! share cudarc 0.19; candle's `dynamic-linking` wins over sdpa-cuda's `fallback-dynamic-loading` in the
//! feature union, and the workspace's pinned `cuda-13000` wins over candle's `cuda-version-from-build-system`,
//! so a CUDA build must use a CUDA 13.0 toolkit.

mod append;
mod backward;
mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod error;
pub mod flash;
mod mask;
mod op;
mod options;
mod plan;
mod serving;
mod tables;
mod warmup;

pub use append::append_to_pages;
pub use flash::{
    flash_attn, flash_attn_alibi, flash_attn_alibi_windowed, flash_attn_alibi_windowed_softcap, flash_attn_windowed,
};
pub use flash::{
    flash_attn_varlen, flash_attn_varlen_alibi, flash_attn_varlen_alibi_windowed,
    flash_attn_varlen_alibi_windowed_softcap, flash_attn_varlen_paged_windowed, flash_attn_varlen_windowed,
};
pub use options::{SdpaAlibi, SdpaMask, SdpaOptions};
pub use sdpa_core::{Diagonal, F32Math, Kernel, Layout, Window};
pub use serving::{sdpa_paged, sdpa_varlen};
pub use warmup::{warmup, AttentionShape};

use candle_core::{bail, Result, Tensor};
use mask::MaskMeaning;
use op::SdpaOp;
use plan::{dtype_of, MaskPlan, View};
use sdpa_core::Mask;

/// `softmax(Q·Kᵀ·scale + mask)·V` in one call, with the sliding window, softcap and ALiBi of `opts` when set
/// (see [`SdpaOptions`]).
///
/// `q` is `[B, Hq, Sq, D]`, `k` `[B, Hkv, Sk, D]`, `v` `[B, Hkv, Sk, Dv]` when `opts.layout` is
/// [`Layout::Bhsd`], or `[B, S, H, D]` each when it is [`Layout::Bshd`]; the result is `[B, Hq, Sq, Dv]` or
/// `[B, Sq, Hq, Dv]` accordingly, contiguous. All three share one dtype (f32, f16 or bf16) and one device.
/// Errors (shapes that do not fit together, a dtype or device mismatch, a strided head dim, a mask that
/// does not broadcast, a window or ALiBi without a named diagonal, ALiBi slopes not one per query head, a
/// variant the backend's kernels do not honour) are candle errors whose text starts with `sdpa:` and names the
/// offending values.
///
/// Gradients: when `q`, `k` or `v` tracks gradients (a `Var` or a tensor computed from one), the result
/// does too, and `backward()` computes dQ, dK and dV with sdpa's fused backward (in the inputs' dtype, with
/// their shapes; the mask gets none). Otherwise the call is plain inference and keeps nothing for autograd.
pub fn sdpa(q: &Tensor, k: &Tensor, v: &Tensor, opts: &SdpaOptions) -> Result<Tensor> {
    same_device_and_dtype(q, k, v)?;
    let qv = View::of("q", q.layout(), opts.layout)?;
    let kv = View::of("k", k.layout(), opts.layout)?;
    let full = [qv.b, qv.h, qv.s, kv.s];
    let explicit = |t: &Tensor, meaning| -> Result<(MaskPlan, Option<mask::PreparedMask>)> {
        let m = mask::prepare(t, meaning, full, q.device())?;
        Ok((MaskPlan::Explicit(m.desc), Some(m)))
    };
    let (mask, mask_tensor) = match &opts.mask {
        SdpaMask::None => (MaskPlan::Position(Mask::None), None),
        SdpaMask::CausalTopLeft => (MaskPlan::Position(Mask::CausalTopLeft), None),
        SdpaMask::CausalBottomRight => (MaskPlan::Position(Mask::CausalBottomRight), None),
        SdpaMask::Keep(t) => explicit(t, MaskMeaning::Keep)?,
        SdpaMask::Exclude(t) => explicit(t, MaskMeaning::Exclude)?,
        SdpaMask::Additive(t) => explicit(t, MaskMeaning::Additive)?,
    };
    let variants = opts.variants()?;
    let op = SdpaOp {
        order: opts.layout,
        scale: opts.scale,
        mask,
        mask_tensor,
        variants,
        run: opts.run(),
        ragged: None,
        saved: Default::default(),
        bwd: opts.backward(),
        descale: opts.descale,
    };
    // Validate before candle takes the storage locks, so every shape error surfaces here.
    op.plan(q.dtype(), q.layout(), k.layout(), v.layout())?;
    op.apply(q, k, v)
}

/// Q, K and V on one device, in one dtype sdpa computes on.
fn same_device_and_dtype(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<()> {
    for (name, t) in [("k", k), ("v", v)] {
        if !t.device().same_device(q.device()) {
            bail!("sdpa: q is on {:?} but {name} is on {:?}; q, k and v must share one device", q.device(), t.device());
        }
    }
    if q.dtype() != k.dtype() || q.dtype() != v.dtype() {
        bail!("sdpa: q, k and v must share one dtype, got q {:?}, k {:?}, v {:?}", q.dtype(), k.dtype(), v.dtype());
    }
    dtype_of(q.dtype())?;
    Ok(())
}
