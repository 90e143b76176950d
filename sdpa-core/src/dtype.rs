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
}

impl DType {
    /// All dtypes, in a stable order (for sweeps and tests).
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// Lowercase name as used on the command line and in result records.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }

    /// Unit roundoff of the format (half the distance from 1.0 to the next value).
    pub const fn unit_roundoff(self) -> f64 {
        match self {
            DType::F32 => 5.960_464_477_539_063e-8, // 2^-24
            DType::F16 => 4.882_812_5e-4,           // 2^-11
            DType::BF16 => 3.906_25e-3,             // 2^-8
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
            other => Err(format!("unknown dtype `{other}` (expected f32, f16 or bf16)")),
        }
    }
}
