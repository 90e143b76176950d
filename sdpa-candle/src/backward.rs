//! `bwd` of the sdpa op: dQ, dK and dV from candle's upstream gradient, through sdpa's fused backward
//! (sdpa-cpu's `attention_backward` on the CPU, sdpa-cuda's `backward_on_stream` on candle's CUDA stream).
//!
//! **The LSE is kept, not recomputed.** The backward recomputes the probabilities `P = exp(S − LSE)` tile by
//! tile and needs the forward's log-sum-exp rows for that. A forward whose inputs track gradients writes
//! them (`[B, Hq, Sq]` or `[Hq, total_q]` f32: `4·B·Hq·Sq` bytes, a `1/D` fraction of Q's size in f32) into the
//! op, and candle keeps the op, behind an `Arc`, in the graph node of the output until the backward runs:
//! the same thing FlashAttention's autograd function saves. Recomputing would cost a whole forward pass
//! (40% of the backward's FLOPs, which are 2.5x the forward's) to save memory that is already small; the
//! output O, which the backward needs as well (`Delta = rowsum(dO ∘ O)`), is the graph node itself, so
//! nothing else is kept.
//! A forward whose inputs track nothing (inference) keeps nothing and runs exactly as before.
//!
//! Where the gradients go: sdpa writes dQ through Q's strides (dK through K's, dV through V's). A fresh
//! buffer can take those strides when the input is dense in memory, either in the caller's dims order or
//! in the other one (a `[B, S, H, D]` projection seen as `[B, H, S, D]` through `transpose(1, 2)`, the
//! usual case); then the gradient is that buffer, presented in the caller's dims order, and the input is
//! read in place. Any other view (a head slice of a fused projection, a broadcast) is copied to a
//! contiguous tensor first, so its gradient is dense too; candle's own backward of the view (narrow,
//! broadcast) takes it from there.
//!
//! What has no gradient: the explicit mask (the op holds it, candle never sees it as an input) and ALiBi
//! slopes (constants, read to the host when the op was built). A paged KV cache refuses the backward:
//! training has no KV cache, and a page shared by sequences would need its gradient summed.

use crate::op::SdpaOp;
use crate::plan::Plan;
use candle_core::op::BackpropOp;
use candle_core::{bail, Result, Storage, Tensor};
use std::sync::Mutex;

/// The log-sum-exp rows one forward wrote, on the device it ran on.
pub(crate) enum SavedLse {
    /// On the host, from `cpu_fwd`.
    Cpu(Vec<f32>),
    /// On the GPU, from `cuda_fwd` (a device allocation candle's stream wrote).
    #[cfg(feature = "cuda")]
    Cuda(candle_core::cuda::cudarc::driver::CudaSlice<f32>),
}

/// Where a forward leaves its LSE for the backward: filled by `cpu_fwd` / `cuda_fwd` when `keep` is set
/// (the op's inputs track gradients), read (not taken: candle may run `backward()` more than once over
/// one graph) by `bwd`.
#[derive(Default)]
pub(crate) struct LseSlot {
    /// Whether the forward writes the LSE here.
    pub keep: bool,
    saved: Mutex<Option<SavedLse>>,
}

impl std::fmt::Debug for LseSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let filled = self.saved.lock().map(|s| s.is_some()).unwrap_or(false);
        f.debug_struct("LseSlot").field("keep", &self.keep).field("filled", &filled).finish()
    }
}

impl LseSlot {
    /// A slot the forward fills iff `keep`.
    pub(crate) fn new(keep: bool) -> Self {
        LseSlot { keep, saved: Mutex::new(None) }
    }

    /// Stores what a forward wrote.
    pub(crate) fn put(&self, lse: SavedLse) -> Result<()> {
        *self.saved.lock().map_err(|_| poisoned())? = Some(lse);
        Ok(())
    }

    /// Runs `f` on the saved LSE; an error if the forward kept none.
    fn with<R>(&self, f: impl FnOnce(&SavedLse) -> Result<R>) -> Result<R> {
        let guard = self.saved.lock().map_err(|_| poisoned())?;
        match &*guard {
            Some(lse) => f(lse),
            None => bail!(
                "sdpa: internal: the backward found no log-sum-exp from the forward (the forward's inputs tracked \
                 no gradient)"
            ),
        }
    }
}

fn poisoned() -> candle_core::Error {
    candle_core::Error::Msg("sdpa: the saved log-sum-exp's lock is poisoned".into())
}

/// An input as the backward reads it, and how its gradient buffer is laid out.
struct GradTarget {
    /// The tensor the kernel reads (the input itself, or its contiguous copy).
    read: Tensor,
    /// The two dims the input's memory order swaps relative to its dims order, if it does.
    swapped: Option<(usize, usize)>,
    /// Whether candle wants this gradient at all.
    wanted: bool,
}

impl GradTarget {
    /// Reads `t` in place when a dense buffer can take its strides (see the module docs), else a copy.
    fn of(t: &Tensor) -> Result<Self> {
        let wanted = t.track_op();
        // The heads and positions dims: (1, 2) of a dense `[B, ·, ·, D]`, (0, 1) of a packed `[·, ·, D]`.
        let swap = if t.rank() == 4 { (1, 2) } else { (0, 1) };
        if t.is_contiguous() {
            return Ok(GradTarget { read: t.clone(), swapped: None, wanted });
        }
        if t.transpose(swap.0, swap.1)?.is_contiguous() {
            return Ok(GradTarget { read: t.clone(), swapped: Some(swap), wanted });
        }
        Ok(GradTarget { read: t.detach().contiguous()?, swapped: None, wanted })
    }

    /// The gradient: `storage` (written through the read tensor's strides) in the input's dims order.
    fn gradient(&self, storage: Storage) -> Result<Option<Tensor>> {
        if !self.wanted {
            return Ok(None);
        }
        let dims = self.read.dims();
        Ok(Some(match self.swapped {
            None => Tensor::from_storage(storage, dims, BackpropOp::none(), false),
            Some((a, b)) => {
                let mut stored = dims.to_vec();
                stored.swap(a, b);
                Tensor::from_storage(storage, stored, BackpropOp::none(), false).transpose(a, b)?
            }
        }))
    }
}

/// The backward's inputs besides Q, K and V, checked against the plan.
pub(crate) struct BackwardInputs<'a> {
    /// The forward's output (candle's graph node: contiguous in the caller's dims order).
    pub o: &'a Tensor,
    /// The upstream gradient, made contiguous (it has O's strides then).
    pub d_o: Tensor,
    /// The forward's LSE.
    pub lse: &'a SavedLse,
}

/// `CustomOp3::bwd` of [`SdpaOp`].
pub(crate) fn backward(
    op: &SdpaOp,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    o: &Tensor,
    d_o: &Tensor,
) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    if op.block_table().is_some() {
        bail!(
            "sdpa: backward of a paged KV cache is not supported: training has no KV cache; compute the gradients \
             through sdpa_varlen (packed K/V) or sdpa instead"
        );
    }
    let (tq, tk, tv) = (GradTarget::of(q)?, GradTarget::of(k)?, GradTarget::of(v)?);
    if !(tq.wanted || tk.wanted || tv.wanted) {
        return Ok((None, None, None));
    }
    let plan = op.plan(q.dtype(), tq.read.layout(), tk.read.layout(), tv.read.layout())?;
    if o.dims() != plan.out_dims.as_slice() || !o.is_contiguous() || o.layout().start_offset() != 0 {
        bail!(
            "sdpa: internal: the forward's output {:?} is not the contiguous {:?} the op made",
            o.dims(),
            plan.out_dims
        );
    }
    if d_o.dims() != o.dims() || d_o.dtype() != o.dtype() {
        bail!(
            "sdpa: the gradient of the output is {:?} {:?}, but the output is {:?} {:?}",
            d_o.dtype(),
            d_o.dims(),
            o.dtype(),
            o.dims()
        );
    }
    // O's strides are the contiguous ones of the caller's order; dO must have them too.
    let d_o = d_o.detach().contiguous()?;
    let (dq, dk, dv) = op.saved.with(|lse| {
        let grads = BackwardInputs { o, d_o: d_o.clone(), lse };
        run(op, &plan, [&tq.read, &tk.read, &tv.read], &grads)
    })?;
    Ok((tq.gradient(dq)?, tk.gradient(dk)?, tv.gradient(dv)?))
}

/// The backward's run options: the forward's, but a kernel picked by hand binds the backward only when it
/// has one (`caps.backward`); otherwise the backend picks (`auto`), so a forward kernel without a backward
/// (a decoding kernel, say) does not stop training.
pub(crate) fn backward_run(caps: &sdpa_core::Capabilities, run: &sdpa_core::RunOptions) -> sdpa_core::RunOptions {
    let kernel = if caps.backward.contains(&run.kernel) { run.kernel } else { sdpa_core::Kernel::Auto };
    sdpa_core::RunOptions { kernel, ..*run }
}

/// Dispatches to the device the inputs live on.
fn run(op: &SdpaOp, plan: &Plan, qkv: [&Tensor; 3], g: &BackwardInputs) -> Result<(Storage, Storage, Storage)> {
    match (qkv[0].device(), g.lse) {
        (candle_core::Device::Cpu, SavedLse::Cpu(lse)) => crate::cpu::backward(op, plan, qkv, g, lse),
        #[cfg(feature = "cuda")]
        (candle_core::Device::Cuda(_), SavedLse::Cuda(lse)) => crate::cuda::backward(op, plan, qkv, g, lse),
        (dev, _) => bail!("sdpa: no backward on {dev:?} (the CPU and, with the `cuda` feature, CUDA have one)"),
    }
}
