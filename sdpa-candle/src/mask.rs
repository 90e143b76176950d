//! Explicit mask tensors, brought into the one form every sdpa backend reads: additive f32 values,
//! contiguous over dims that are each 1 (broadcast) or the full size of `[B, Hq, Sq, Sk]`.
//!
//! The conversion is made of candle ops on the mask's own device, so a CUDA mask never visits the host.
//! It is skipped (no copy) when the mask already is contiguous f32 additive of a broadcastable shape.

use candle_core::{bail, DType, Device, Result, Tensor};
use sdpa_core::{ExplicitMask, MaskValues};

/// What a mask tensor's values mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MaskMeaning {
    /// Non-zero = the key takes part.
    Keep,
    /// Non-zero = the key is hidden.
    Exclude,
    /// Added to the scores.
    Additive,
}

/// A mask ready for the kernels: rank-4 contiguous f32 tensor and its description.
#[derive(Debug, Clone)]
pub(crate) struct PreparedMask {
    /// Additive f32 values, contiguous over `desc.dims`.
    pub tensor: Tensor,
    /// Dims and origin.
    pub desc: ExplicitMask,
}

/// Checks a mask tensor against the full `[B, Hq, Sq, Sk]` extent and converts it.
pub(crate) fn prepare(mask: &Tensor, meaning: MaskMeaning, full: [usize; 4], device: &Device) -> Result<PreparedMask> {
    if !mask.device().same_device(device) {
        bail!("sdpa: the mask is on {:?} but q is on {:?}; move the mask to q's device", mask.device(), device);
    }
    let rank = mask.rank();
    if !(1..=4).contains(&rank) {
        bail!(
            "sdpa: the mask must have rank 1 to 4 (broadcast to [B, Hq, Sq, Sk] = {full:?}), got shape {:?}",
            mask.dims()
        );
    }
    let mut m = mask.clone();
    for _ in rank..4 {
        m = m.unsqueeze(0)?;
    }
    let mut dims = [0usize; 4];
    dims.copy_from_slice(m.dims());
    for (i, (&got, &want)) in dims.iter().zip(full.iter()).enumerate() {
        if got != 1 && got != want {
            let axis = ["B", "Hq", "Sq", "Sk"][i];
            bail!(
                "sdpa: the mask of shape {:?} does not broadcast to [B, Hq, Sq, Sk] = {full:?}: dim {axis} is {got}, \
                 must be 1 or {want}",
                mask.dims()
            );
        }
    }
    let integer = matches!(m.dtype(), DType::U8 | DType::U32 | DType::I16 | DType::I32 | DType::I64);
    let float = matches!(m.dtype(), DType::F32 | DType::F16 | DType::BF16 | DType::F64);
    let (additive, values) = match meaning {
        MaskMeaning::Additive => {
            if !float {
                bail!(
                    "sdpa: an additive mask must be f32, f16, bf16 or f64, got {:?}; for a boolean mask use \
                     SdpaMask::Keep or SdpaMask::Exclude",
                    m.dtype()
                );
            }
            (m.to_dtype(DType::F32)?, MaskValues::Additive)
        }
        MaskMeaning::Keep | MaskMeaning::Exclude => {
            if !integer {
                bail!(
                    "sdpa: a boolean mask must be u8, u32, i16, i32 or i64, got {:?}; for a float mask use \
                     SdpaMask::Additive",
                    m.dtype()
                );
            }
            let zeros = Tensor::zeros(m.shape(), DType::F32, m.device())?;
            let hidden = Tensor::full(f32::NEG_INFINITY, m.shape(), m.device())?;
            let t = match meaning {
                MaskMeaning::Keep => m.where_cond(&zeros, &hidden)?,
                _ => m.where_cond(&hidden, &zeros)?,
            };
            (t, MaskValues::Boolean)
        }
    };
    // `contiguous` returns the tensor itself (no copy) when it already is; it ignores the strides of
    // size-1 dims, which the kernels never step along.
    let mut tensor = additive.contiguous()?;
    if tensor.layout().start_offset() != 0 {
        // A view into a larger f32 tensor: sdpa-cuda takes the mask as a whole device allocation, so give it
        // one (a fresh contiguous copy; rare, since candle models build their masks whole).
        tensor = tensor.affine(1.0, 0.0)?;
    }
    Ok(PreparedMask { tensor, desc: ExplicitMask { values, dims } })
}
