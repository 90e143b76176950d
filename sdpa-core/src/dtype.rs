//! Element types of Q, K, V and O. Accumulation is always f32 (f64 in the reference).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Element type of the attention inputs and output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BF16,
    /// OCP FP8 E4M3 (`e4m3fn`: 4-bit exponent with bias 7, 3-bit mantissa, no infinities, NaN = `S.1111.111`,
    /// largest finite 448). An input type only: Q, K and V are stored in it with one f32 descale factor per
    /// tensor (`value = stored × descale`, [`crate::fp8::Descale`]); O is written in bf16
    /// ([`DType::output`]), LSE in f32 as always. See [`crate::fp8`].
    F8E4M3,
}

impl DType {
    /// The dtypes that serve as inputs and output alike, in a stable order (for sweeps and tests). FP8
    /// ([`DType::F8E4M3`]) is left out: it is an input type with its own output dtype, which a backend
    /// claims separately.
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// Element type of O (and of the tensors a backward pass returns) for inputs of this dtype: the dtype
    /// itself, except FP8 inputs, whose output is bf16. Why bf16: O is a weighted mean of V rows whose
    /// magnitude the caller chose through V's descale, so it needs range (bf16 has f32's exponent), and the
    /// next layer of an FP8 model reads activations in bf16; f16 could overflow past 65504 for large descales.
    pub const fn output(self) -> DType {
        match self {
            DType::F8E4M3 => DType::BF16,
            other => other,
        }
    }

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F8E4M3 => 1,
        }
    }

    /// Lowercase name as used on the command line and in result records.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F8E4M3 => "f8e4m3",
        }
    }

    /// Unit roundoff of the format (half the distance from 1.0 to the next value).
    pub const fn unit_roundoff(self) -> f64 {
        match self {
            DType::F32 => 5.960_464_477_539_063e-8, // 2^-24
            DType::F16 => 4.882_812_5e-4,           // 2^-11
            DType::BF16 => 3.906_25e-3,             // 2^-8
            DType::F8E4M3 => 6.25e-2,               // 2^-4 (normal range; subnormals lose more)
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" | "float" => Ok(DType::F32),
            "f16" | "fp16" | "float16" | "half" => Ok(DType::F16),
            "bf16" | "bfloat16" => Ok(DType::BF16),
            "f8e4m3" | "fp8" | "e4m3" | "float8_e4m3fn" => Ok(DType::F8E4M3),
            other => Err(format!("unknown dtype `{other}` (expected f32, f16, bf16 or f8e4m3)")),
        }
    }
}
