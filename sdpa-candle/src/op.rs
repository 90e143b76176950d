//! The candle `CustomOp3` over Q, K and V; the explicit mask (if any) travels inside the op.

use crate::mask::PreparedMask;
use crate::plan::{dtype_of, operand_slice, plan, MaskPlan, Plan};
use candle_core::backend::BackendStorage;
use candle_core::{bail, CpuStorage, CustomOp3, Layout as CandleLayout, Result, Shape, Storage};
use sdpa_core::{Layout, RunOptions, Variants};

/// One attention call as a candle op. CustomOp3 has room for three tensors; the mask, already in the
/// backends' additive f32 form, is held by the op and read from its storage in the forward pass.
#[derive(Debug, Clone)]
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
        plan(dtype_of(dtype)?, self.order, self.scale, self.mask, &self.variants, self.run, l1, l2, l3)
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
        match (s1, s2, s3) {
            (CpuStorage::F32(q), CpuStorage::F32(k), CpuStorage::F32(v)) => crate::cpu::run(&plan, q, k, v, mask),
            (CpuStorage::F16(q), CpuStorage::F16(k), CpuStorage::F16(v)) => crate::cpu::run(&plan, q, k, v, mask),
            (CpuStorage::BF16(q), CpuStorage::BF16(k), CpuStorage::BF16(v)) => crate::cpu::run(&plan, q, k, v, mask),
            _ => bail!("sdpa: unsupported dtype {:?} (f32, f16 and bf16 are supported)", s1.dtype()),
        }
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
}
