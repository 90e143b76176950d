//! The candle `CustomOp3` over Q, K and V; the explicit mask (if any) travels inside the op.

use crate::backward::{LseSlot, SavedLse};
use crate::mask::PreparedMask;
use crate::plan::{dtype_of, operand_slice, plan, plan_ragged, MaskPlan, Plan, RaggedPlan};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp3, Layout as CandleLayout, Result, Shape, Storage, Tensor};
use sdpa_core::backward::BackwardOptions;
use sdpa_core::{Descale, Layout, RunOptions, Variants};

/// One attention call as a candle op. CustomOp3 has room for three tensors; the mask, already in the
/// backends' additive f32 form, is held by the op and read from its storage in the forward pass.
///
/// A ragged call's integer tables travel inside the op too, as host values: its offsets and lengths (in
/// the `Ragged` of [`RaggedPlan`]) and a paged cache's block table. They were read to the host and
/// checked there when the op was built (offsets increasing from 0, every page a sequence uses inside the
/// pool), because they decide the work and the addresses; a kernel handed an unchecked device table could
/// only clamp a bad entry, never report it. The CUDA path uploads the checked copy (one small copy on
/// candle's stream, the same size as the table the caller made), so what the kernel reads is exactly what
/// was checked, even if the caller's tensor changes later.
///
/// When the inputs track gradients, the op also carries the forward's log-sum-exp to its `bwd`
/// (`backward.rs` says why it is kept rather than recomputed).
#[derive(Debug)]
pub(crate) struct SdpaOp {
    /// Dims order of Q, K, V and O.
    pub order: Layout,
    /// Explicit scale or `None` for `1/sqrt(D)`.
    pub scale: Option<f64>,
    /// Position mask, or the description of the explicit one.
    pub mask: MaskPlan,
    /// The explicit mask's values.
    pub mask_tensor: Option<PreparedMask>,
    /// Sliding window, softcap and ALiBi (slopes already on the host).
    pub variants: Variants,
    /// Kernel, threads, f32 math.
    pub run: RunOptions,
    /// The ragged batch (and paged cache) of a varlen call; `None` for a dense one.
    pub ragged: Option<RaggedPlan>,
    /// The forward's LSE, kept for the backward when the inputs track gradients.
    pub saved: LseSlot,
    /// Options of the backward (deterministic or not).
    pub bwd: BackwardOptions,
    /// FP8 descale factors (f8e4m3 inputs only; the spec refuses them with any other dtype).
    pub descale: Option<Descale>,
}

impl SdpaOp {
    /// Validates the call for these layouts and this candle dtype.
    pub(crate) fn plan(
        &self,
        dtype: candle_core::DType,
        l1: &CandleLayout,
        l2: &CandleLayout,
        l3: &CandleLayout,
    ) -> Result<Plan> {
        let dtype = dtype_of(dtype)?;
        let mut p = match (&self.ragged, self.mask) {
            (None, mask) => plan(dtype, self.order, self.scale, mask, &self.variants, self.run, l1, l2, l3),
            (Some(r), MaskPlan::Position(mask)) => {
                plan_ragged(dtype, self.order, self.scale, mask, &self.variants, self.run, r, l1, l2, l3)
            }
            (Some(_), MaskPlan::Explicit(_)) => bail!(
                "sdpa: an explicit mask does not combine with a ragged batch; use a causal mask or a window, which \
                 apply per sequence"
            ),
        }?;
        if let Some(d) = self.descale {
            p.spec.descale = Some(d);
            p.spec.validate().map_err(crate::error::sdpa_err)?;
        }
        Ok(p)
    }

    /// Runs the op on Q, K, V. When any of them tracks gradients the op goes into candle's graph with its
    /// backward and keeps the forward's LSE for it (a paged call keeps none: its backward refuses, so that
    /// the refusal is an error at `backward()` rather than gradients silently missing); otherwise it runs
    /// as plain inference.
    pub(crate) fn apply(mut self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        if !(q.track_op() || k.track_op() || v.track_op()) {
            return q.apply_op3_no_bwd(k, v, &self);
        }
        self.saved = LseSlot::new(self.block_table().is_none());
        self.run.lse = self.saved.keep;
        q.apply_op3(k, v, self)
    }

    /// The checked block table of a paged call.
    pub(crate) fn block_table(&self) -> Option<&[u32]> {
        self.ragged.as_ref().and_then(|r| r.block_table.as_deref())
    }

    /// Elements of the prepared mask.
    pub(crate) fn mask_len(&self) -> Result<usize> {
        match &self.mask_tensor {
            Some(m) => m.desc.len().map_err(crate::error::sdpa_err),
            None => Ok(0),
        }
    }
}

fn same_dtypes(a: candle_core::DType, b: candle_core::DType, c: candle_core::DType) -> Result<()> {
    if a != b || a != c {
        bail!("sdpa: q, k and v must share one dtype, got q {a:?}, k {b:?}, v {c:?}");
    }
    Ok(())
}

impl CustomOp3 for SdpaOp {
    fn name(&self) -> &'static str {
        "sdpa"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &CandleLayout,
        s2: &CpuStorage,
        l2: &CandleLayout,
        s3: &CpuStorage,
        l3: &CandleLayout,
    ) -> Result<(CpuStorage, Shape)> {
        same_dtypes(s1.dtype(), s2.dtype(), s3.dtype())?;
        let plan = self.plan(s1.dtype(), l1, l2, l3)?;
        let mask_len = self.mask_len()?;
        let guard = self.mask_tensor.as_ref().map(|m| m.tensor.storage_and_layout());
        let mask = match &guard {
            None => None,
            Some((storage, layout)) => match &**storage {
                Storage::Cpu(CpuStorage::F32(data)) => {
                    Some(operand_slice("mask", data, layout.start_offset(), mask_len)?)
                }
                other => bail!("sdpa: internal: the prepared mask should be f32 on the CPU, found {:?}", other.dtype()),
            },
        };
        let table = self.block_table();
        let mut lse = match self.saved.keep {
            true => Some(vec![f32::NAN; plan.spec.lse_len().map_err(crate::error::sdpa_err)?]),
            false => None,
        };
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(q), CpuStorage::F32(k), CpuStorage::F32(v)) => {
                crate::cpu::run(&plan, q, k, v, mask, table, lse.as_deref_mut())
            }
            (CpuStorage::F16(q), CpuStorage::F16(k), CpuStorage::F16(v)) => {
                crate::cpu::run(&plan, q, k, v, mask, table, lse.as_deref_mut())
            }
            (CpuStorage::BF16(q), CpuStorage::BF16(k), CpuStorage::BF16(v)) => {
                crate::cpu::run(&plan, q, k, v, mask, table, lse.as_deref_mut())
            }
            // sdpa-cpu refuses FP8 (no FP8 arithmetic on the CPU): its error says why and where FP8 runs.
            (CpuStorage::F8E4M3(_), _, _) => {
                use sdpa_core::Backend as _;
                let cpu = sdpa_cpu::CpuBackend::new(None).map_err(crate::error::sdpa_err)?;
                cpu.capabilities().check(cpu.name(), &plan.spec, &plan.run).map_err(crate::error::sdpa_err)?;
                bail!("sdpa: f8e4m3 inputs run on the CUDA backend only (fa3 on sm_90)")
            }
            _ => bail!("sdpa: unsupported dtype {:?} (f32, f16 and bf16 are supported)", s1.dtype()),
        }?;
        if let Some(lse) = lse {
            self.saved.put(SavedLse::Cpu(lse))?;
        }
        Ok(out)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &CandleLayout,
        s2: &candle_core::CudaStorage,
        l2: &CandleLayout,
        s3: &candle_core::CudaStorage,
        l3: &CandleLayout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        same_dtypes(s1.dtype(), s2.dtype(), s3.dtype())?;
        let plan = self.plan(s1.dtype(), l1, l2, l3)?;
        crate::cuda::run(self, &plan, s1, s2, s3)
    }

    /// dQ, dK, dV through sdpa's fused backward (`backward.rs`); the mask gets none.
    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        d_o: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        crate::backward::backward(self, q, k, v, o, d_o)
    }
}
