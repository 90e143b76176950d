//! [`warmup`]: compile, when a server starts, the kernels its attention calls will run, instead of on
//! the first request. On the CPU nothing is compiled at run time and it returns at once; on a CUDA device
//! (feature `cuda`) the programs are compiled on parallel threads (or read from sdpa-cuda's disk cache) and
//! loaded on the device candle uses.

use crate::plan::dtype_of;
use crate::{SdpaMask, SdpaOptions};
use candle_core::{Device, Result};
use sdpa_core::{AttentionSpec, ExplicitMask, Mask, MaskValues, RunOptions, Shape};

/// The sizes of one attention call a model will make: what [`warmup`] compiles for. The kernel a call
/// runs depends on these, the dtype and the options (mask kind, variants, kernel, f32 math), not on the
/// values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    /// Batch size.
    pub batch: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads (a divisor of `q_heads`).
    pub kv_heads: usize,
    /// Query positions.
    pub q_len: usize,
    /// Key positions.
    pub kv_len: usize,
    /// Head dim of Q and K.
    pub head_dim: usize,
    /// Head dim of V and the output.
    pub v_head_dim: usize,
    /// Element type of Q, K and V.
    pub dtype: candle_core::DType,
}

impl AttentionShape {
    /// The spec `sdpa` would run for this shape with `opts` (an explicit mask as a full `[B, Hq, Sq, Sk]`
    /// mask: its kernel does not depend on how the mask broadcasts).
    fn spec(&self, opts: &SdpaOptions) -> Result<AttentionSpec> {
        let shape = Shape {
            b: self.batch,
            hq: self.q_heads,
            hkv: self.kv_heads,
            sq: self.q_len,
            sk: self.kv_len,
            d: self.head_dim,
            dv: self.v_head_dim,
        };
        let mask = match &opts.mask {
            SdpaMask::None => Mask::None,
            SdpaMask::CausalTopLeft => Mask::CausalTopLeft,
            SdpaMask::CausalBottomRight => Mask::CausalBottomRight,
            SdpaMask::Keep(_) | SdpaMask::Exclude(_) => Mask::Explicit(ExplicitMask::full(MaskValues::Boolean, &shape)),
            SdpaMask::Additive(_) => Mask::Explicit(ExplicitMask::full(MaskValues::Additive, &shape)),
        };
        let mut spec = AttentionSpec::new(shape, dtype_of(self.dtype)?)
            .with_layout(opts.layout)
            .with_mask(mask)
            .with_variants(opts.variants()?);
        spec.scale = opts.scale;
        spec.validate().map_err(crate::error::sdpa_err)?;
        Ok(spec)
    }
}

/// Compiles and loads now, for `device`, the kernels that [`crate::sdpa`] calls of these shapes and
/// options will run, so that the first such call does not wait for the compiler (a second or two per kernel
/// on a fresh machine; milliseconds once sdpa-cuda's disk cache holds them). Returns how many kernel
/// programs were loaded now (0 on the CPU, and for kernels already loaded). Shapes are checked as `sdpa`
/// checks them; an invalid one, or one the GPU cannot run, is an error naming it. The kernels are planned
/// for contiguous tensors (or views whose offsets keep 16-byte alignment): a call on a view with an odd
/// start offset may take another variant, compiled on its first call.
pub fn warmup(device: &Device, calls: &[(AttentionShape, SdpaOptions)]) -> Result<usize> {
    let mut specs = Vec::with_capacity(calls.len());
    for (shape, opts) in calls {
        let run = RunOptions { kernel: opts.kernel, f32_math: opts.f32_math, threads: opts.threads, lse: false };
        specs.push((shape.spec(opts)?, run));
    }
    match device {
        Device::Cpu => Ok(0),
        #[cfg(feature = "cuda")]
        Device::Cuda(d) => {
            let backend = crate::cuda::backend_for(d)?;
            let warmed = backend.warm_up(&specs).map_err(crate::error::sdpa_err)?;
            // A call the GPU cannot run would fail on the request; say so at start-up instead.
            if let Some((i, why)) = warmed.skipped.first() {
                candle_core::bail!("sdpa: warm-up call {i} ({:?}) cannot run on this GPU: {why}", calls[*i].0);
            }
            Ok(warmed.loads.len())
        }
        other => candle_core::bail!("sdpa: no backend for {other:?} (CPU, and CUDA with the `cuda` feature)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(q_heads: usize, kv_heads: usize) -> AttentionShape {
        AttentionShape {
            batch: 1,
            q_heads,
            kv_heads,
            q_len: 1,
            kv_len: 4096,
            head_dim: 128,
            v_head_dim: 128,
            dtype: candle_core::DType::BF16,
        }
    }

    #[test]
    fn the_cpu_compiles_nothing_and_bad_shapes_are_named() -> Result<()> {
        let opts = SdpaOptions::bhsd().with_mask(SdpaMask::CausalBottomRight);
        assert_eq!(warmup(&Device::Cpu, &[(shape(32, 8), opts.clone())])?, 0);
        let err = warmup(&Device::Cpu, &[(shape(32, 5), opts)]).expect_err("32 heads over 5 kv heads");
        assert!(err.to_string().contains("Hkv = 5"), "{err}");
        let spec = shape(32, 8).spec(&SdpaOptions::bshd())?;
        assert_eq!((spec.layout(), spec.mask.name()), (Some(sdpa_core::Layout::Bshd), "none"));
        Ok(())
    }

    #[test]
    fn the_variants_reach_the_warmed_spec_and_are_checked() -> Result<()> {
        use crate::SdpaAlibi;
        use sdpa_core::{Alibi, Diagonal, Window};
        let opts = SdpaOptions::bshd()
            .with_mask(SdpaMask::CausalBottomRight)
            .with_window(Window::left(4096))
            .with_softcap(50.0)
            .with_alibi(SdpaAlibi::Standard);
        assert_eq!(warmup(&Device::Cpu, &[(shape(32, 8), opts.clone())])?, 0);
        let spec = shape(32, 8).spec(&opts)?;
        assert_eq!(spec.variants.window, Some(Window::left(4096)));
        assert_eq!((spec.variants.softcap, spec.variants.alibi), (Some(50.0), Some(Alibi::Standard)));
        let three = opts.clone().with_alibi(SdpaAlibi::Slopes(vec![0.5; 3]));
        let err = warmup(&Device::Cpu, &[(shape(32, 8), three)]).expect_err("3 slopes for 32 heads");
        assert!(err.to_string().contains("3 ALiBi slopes"), "{err}");
        let unnamed = SdpaOptions::bshd().with_window(Window::left(16));
        assert!(warmup(&Device::Cpu, &[(shape(32, 8), unnamed.clone())]).is_err());
        assert_eq!(warmup(&Device::Cpu, &[(shape(32, 8), unnamed.with_diagonal(Diagonal::BottomRight))])?, 0);
        Ok(())
    }
}
