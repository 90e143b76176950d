//! Host buffers in f32/f16/bf16, seeded random inputs for tests and benches, and poisoned outputs.
//!
//! A buffer is flat; the spec's strides say where each logical element lives.

use crate::dtype::DType;
use crate::error::{Result, SdpaError};
use crate::fp8::{e4m3_to_f32, f32_to_e4m3};
use crate::memory::{check_host, try_filled, OperandBytes};
use crate::spec::{AttentionSpec, Mask, MaskValues, Operand};
use half::{bf16, f16};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A flat host buffer of one dtype.
#[derive(Debug, Clone, PartialEq)]
pub enum HostBuffer {
    /// f32 elements.
    F32(Vec<f32>),
    /// f16 elements.
    F16(Vec<f16>),
    /// bf16 elements.
    BF16(Vec<bf16>),
    /// FP8 E4M3 codes (`crate::fp8`), stored values before their tensor's descale factor.
    F8E4M3(Vec<u8>),
}

impl HostBuffer {
    /// Zero-filled buffer.
    pub fn zeros(dtype: DType, len: usize) -> Self {
        Self::filled(dtype, len, 0.0)
    }

    /// NaN-filled buffer: outputs are poisoned with it before a kernel runs, so an element the kernel
    /// never writes shows up as a mismatch against the reference.
    pub fn poisoned(dtype: DType, len: usize) -> Self {
        Self::filled(dtype, len, f32::NAN)
    }

    fn filled(dtype: DType, len: usize, x: f32) -> Self {
        match dtype {
            DType::F32 => HostBuffer::F32(vec![x; len]),
            DType::F16 => HostBuffer::F16(vec![f16::from_f32(x); len]),
            DType::BF16 => HostBuffer::BF16(vec![bf16::from_f32(x); len]),
            DType::F8E4M3 => HostBuffer::F8E4M3(vec![f32_to_e4m3(x); len]),
        }
    }

    /// Standard-normal-like random values (uniform with unit variance), reproducible from `seed`.
    /// Never zeros: zeros hide unwritten outputs and wrong indexing.
    pub fn random(dtype: DType, len: usize, seed: u64) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let amp = 3f32.sqrt();
        let vals: Vec<f32> = (0..len).map(|_| rng.gen_range(-amp..amp)).collect();
        Self::from_f32(dtype, &vals)
    }

    /// [`HostBuffer::random`] (the same values for the same seed) reserved fallibly and written straight in
    /// `dtype`, with no f32 copy on the side: the form for sizes a user chose.
    pub fn try_random(dtype: DType, len: usize, seed: u64, what: &str) -> Result<Self> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let amp = 3f32.sqrt();
        let mut next = || rng.gen_range(-amp..amp);
        Ok(match dtype {
            DType::F32 => {
                let mut v = try_filled(len, 0f32, what)?;
                v.iter_mut().for_each(|x| *x = next());
                HostBuffer::F32(v)
            }
            DType::F16 => {
                let mut v = try_filled(len, f16::ZERO, what)?;
                v.iter_mut().for_each(|x| *x = f16::from_f32(next()));
                HostBuffer::F16(v)
            }
            DType::BF16 => {
                let mut v = try_filled(len, bf16::ZERO, what)?;
                v.iter_mut().for_each(|x| *x = bf16::from_f32(next()));
                HostBuffer::BF16(v)
            }
            DType::F8E4M3 => return Self::try_random_e4m3(len, seed, 1.0, what),
        })
    }

    /// The draws of [`HostBuffer::try_random`] quantized to E4M3 with a descale factor: element = the code
    /// nearest to `draw / descale`, so that `stored × descale` approximates the draw (a descale of
    /// `sqrt(3) / 448` spreads the draws over the whole E4M3 range, as a per-tensor quantizer does).
    pub fn try_random_e4m3(len: usize, seed: u64, descale: f32, what: &str) -> Result<Self> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let amp = 3f32.sqrt();
        let mut v = try_filled(len, 0u8, what)?;
        v.iter_mut().for_each(|x| *x = f32_to_e4m3(rng.gen_range(-amp..amp) / descale));
        Ok(HostBuffer::F8E4M3(v))
    }

    /// Rounds f32 values into a buffer of `dtype`.
    pub fn from_f32(dtype: DType, vals: &[f32]) -> Self {
        match dtype {
            DType::F32 => HostBuffer::F32(vals.to_vec()),
            DType::F16 => HostBuffer::F16(vals.iter().map(|&x| f16::from_f32(x)).collect()),
            DType::BF16 => HostBuffer::BF16(vals.iter().map(|&x| bf16::from_f32(x)).collect()),
            DType::F8E4M3 => HostBuffer::F8E4M3(vals.iter().map(|&x| f32_to_e4m3(x)).collect()),
        }
    }

    /// Rounds f64 values into a buffer of `dtype` (one rounding, through f32 for the half types is exact
    /// enough: the f32 step is far finer than the half step).
    pub fn from_f64(dtype: DType, vals: &[f64]) -> Self {
        match dtype {
            DType::F32 => HostBuffer::F32(vals.iter().map(|&x| x as f32).collect()),
            DType::F16 => HostBuffer::F16(vals.iter().map(|&x| f16::from_f64(x)).collect()),
            DType::BF16 => HostBuffer::BF16(vals.iter().map(|&x| bf16::from_f64(x)).collect()),
            // Through f32: every E4M3 midpoint is exact in f32, so the double rounding cannot change a tie.
            DType::F8E4M3 => HostBuffer::F8E4M3(vals.iter().map(|&x| f32_to_e4m3(x as f32)).collect()),
        }
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        match self {
            HostBuffer::F32(_) => DType::F32,
            HostBuffer::F16(_) => DType::F16,
            HostBuffer::BF16(_) => DType::BF16,
            HostBuffer::F8E4M3(_) => DType::F8E4M3,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostBuffer::F32(v) => v.len(),
            HostBuffer::F16(v) => v.len(),
            HostBuffer::BF16(v) => v.len(),
            HostBuffer::F8E4M3(v) => v.len(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` widened to f64. Panics if `i` is out of range (an internal indexing bug, never input).
    #[inline]
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            HostBuffer::F32(v) => v[i] as f64,
            HostBuffer::F16(v) => v[i].to_f64(),
            HostBuffer::BF16(v) => v[i].to_f64(),
            HostBuffer::F8E4M3(v) => f64::from(e4m3_to_f32(v[i])),
        }
    }

    /// Element `i` widened to f32.
    #[inline]
    pub fn get_f32(&self, i: usize) -> f32 {
        match self {
            HostBuffer::F32(v) => v[i],
            HostBuffer::F16(v) => v[i].to_f32(),
            HostBuffer::BF16(v) => v[i].to_f32(),
            HostBuffer::F8E4M3(v) => e4m3_to_f32(v[i]),
        }
    }

    /// All elements widened to f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        (0..self.len()).map(|i| self.get_f32(i)).collect()
    }

    /// Sets element `i` from an f32, rounding to the buffer's dtype.
    #[inline]
    pub fn set_f32(&mut self, i: usize, x: f32) {
        match self {
            HostBuffer::F32(v) => v[i] = x,
            HostBuffer::F16(v) => v[i] = f16::from_f32(x),
            HostBuffer::BF16(v) => v[i] = bf16::from_f32(x),
            HostBuffer::F8E4M3(v) => v[i] = f32_to_e4m3(x),
        }
    }

    /// Size in bytes.
    pub fn size_bytes(&self) -> usize {
        self.len() * self.dtype().size_bytes()
    }

    /// Raw little-endian bytes (for device uploads and files).
    pub fn as_bytes(&self) -> &[u8] {
        fn bytes<T>(v: &[T]) -> &[u8] {
            // SAFETY: f32, f16 and bf16 are plain-old-data without padding; the slice covers exactly
            // `size_of_val(v)` initialised bytes and u8 has alignment 1.
            unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
        }
        match self {
            HostBuffer::F32(v) => bytes(v),
            HostBuffer::F16(v) => bytes(v),
            HostBuffer::BF16(v) => bytes(v),
            HostBuffer::F8E4M3(v) => v,
        }
    }

    pub(crate) fn expect_dtype(&self, name: &'static str, expected: DType) -> Result<()> {
        if self.dtype() != expected {
            return Err(SdpaError::DTypeMismatch { name, expected, found: self.dtype() });
        }
        Ok(())
    }
}

/// Converts a boolean mask (`true` = the key takes part) to the additive f32 form every backend takes.
pub fn mask_from_bool(keep: &[bool]) -> Vec<f32> {
    keep.iter().map(|&k| if k { 0.0 } else { f32::NEG_INFINITY }).collect()
}

/// Q, K, V (and an explicit mask as additive f32) on the host.
#[derive(Debug, Clone)]
pub struct HostInputs {
    /// Queries, laid out by the spec's `q_strides`.
    pub q: HostBuffer,
    /// Keys.
    pub k: HostBuffer,
    /// Values.
    pub v: HostBuffer,
    /// Explicit mask as additive f32 values over the mask's `dims`; `None` unless the spec's mask is
    /// explicit.
    pub mask: Option<Vec<f32>>,
    /// The block table `[B, max_pages]` of a paged KV cache (`crate::ragged`); `None` unless K/V are paged.
    pub block_table: Option<Vec<u32>>,
}

impl HostInputs {
    /// Seeded random inputs sized for `spec` (which must be valid). Explicit boolean masks drop about a
    /// fifth of the keys at random; additive masks add values in [-2, 2) and drop a tenth of the keys.
    ///
    /// The bytes they need are compared with what the host has before anything is allocated
    /// ([`SdpaError::InsufficientMemory`] when they cannot fit), and every buffer is reserved fallibly.
    pub fn random(spec: &AttentionSpec, seed: u64) -> Result<Self> {
        spec.validate()?;
        let bytes = OperandBytes::of(spec)?;
        check_host(
            bytes.inputs(),
            &format!("the inputs (Q, K, V{}) of shape {}", if bytes.mask > 0 { ", mask" } else { "" }, spec.shape),
        )?;
        let random = |op: Operand, seed: u64, descale: f32, what: &str| -> Result<HostBuffer> {
            let len = spec.required_len(op)?;
            match spec.dtype {
                // FP8: the same draws, quantized with the spec's descale factors.
                DType::F8E4M3 => HostBuffer::try_random_e4m3(len, seed, descale, what),
                dt => HostBuffer::try_random(dt, len, seed, what),
            }
        };
        let ds = spec.descales();
        let q = random(Operand::Q, seed, ds.q, "Q")?;
        let k = random(Operand::K, seed.wrapping_add(1), ds.k, "K")?;
        let v = random(Operand::V, seed.wrapping_add(2), ds.v, "V")?;
        let mask = match &spec.mask {
            Mask::Explicit(m) => {
                let mut rng = ChaCha8Rng::seed_from_u64(seed.wrapping_add(3));
                let mut mask = try_filled(m.len()?, 0f32, "the mask")?;
                match m.values {
                    // The same draws as building a keep-list and converting it with `mask_from_bool`.
                    MaskValues::Boolean => {
                        mask.iter_mut().for_each(|x| *x = if rng.gen_bool(0.8) { 0.0 } else { f32::NEG_INFINITY })
                    }
                    MaskValues::Additive => mask.iter_mut().for_each(|x| {
                        *x = if rng.gen_bool(0.1) { f32::NEG_INFINITY } else { rng.gen_range(-2.0..2.0) }
                    }),
                }
                Some(mask)
            }
            _ => None,
        };
        // Pages in a seeded shuffled order: no kernel may assume a sequence's pages are neighbours.
        let block_table = match spec.ragged.as_ref().and_then(|r| r.pages.map(|_| r)) {
            Some(r) => Some(r.shuffled_block_table(seed.wrapping_add(4))?),
            None => None,
        };
        Ok(HostInputs { q, k, v, mask, block_table })
    }

    /// Checks dtypes and lengths against `spec`.
    pub fn check(&self, spec: &AttentionSpec) -> Result<()> {
        self.q.expect_dtype("q", spec.dtype)?;
        self.k.expect_dtype("k", spec.dtype)?;
        self.v.expect_dtype("v", spec.dtype)?;
        let o = spec.required_len(Operand::O)?;
        spec.check_lengths(self.q.len(), self.k.len(), self.v.len(), o, self.mask.as_ref().map(Vec::len))?;
        match &spec.ragged {
            Some(r) => r.check_block_table(self.block_table.as_deref()),
            None if self.block_table.is_some() => {
                Err(SdpaError::invalid("a block table was given but the batch is dense (no paged KV cache)"))
            }
            None => Ok(()),
        }
    }
}

/// The result of a forward call on the host.
#[derive(Debug, Clone)]
pub struct HostOutput {
    /// Output, laid out by the spec's `o_strides`.
    pub o: HostBuffer,
    /// Log-sum-exp per query row, `[B, Hq, Sq]` contiguous, when requested.
    pub lse: Option<Vec<f32>>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Shape;

    #[test]
    fn random_is_seeded_nonzero_and_rounded() {
        let a = HostBuffer::random(DType::BF16, 1000, 7);
        let b = HostBuffer::random(DType::BF16, 1000, 7);
        let c = HostBuffer::random(DType::BF16, 1000, 8);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let vals = a.to_f32_vec();
        assert!(vals.iter().filter(|&&x| x == 0.0).count() < 5);
        let var = vals.iter().map(|x| (x * x) as f64).sum::<f64>() / 1000.0;
        assert!((0.8..1.2).contains(&var), "variance {var}");
    }

    #[test]
    fn poison_is_nan_in_every_dtype() {
        for dt in DType::ALL {
            let p = HostBuffer::poisoned(dt, 3);
            assert!((0..3).all(|i| p.get_f64(i).is_nan()));
            assert_eq!(p.as_bytes().len(), 3 * dt.size_bytes());
        }
    }

    #[test]
    fn inputs_match_the_spec() {
        let spec = AttentionSpec::new(Shape { b: 1, hq: 4, hkv: 2, sq: 3, sk: 7, d: 5, dv: 6 }, DType::F16);
        let inp = HostInputs::random(&spec, 1).unwrap();
        assert!(inp.check(&spec).is_ok());
        assert_eq!(inp.v.len(), 2 * 7 * 6);
        let other = AttentionSpec::new(spec.shape, DType::F32);
        assert!(matches!(inp.check(&other), Err(SdpaError::DTypeMismatch { .. })));
    }
}
