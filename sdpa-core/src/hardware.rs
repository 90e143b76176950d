//! Built-in hardware table: peak dense rates and memory bandwidth, for rooflines and efficiency.
//!
//! Figures are the vendors' dense (no sparsity) peaks at boost clock; tensor-core f16/bf16 rates are with
//! f32 accumulation, which is what attention kernels use. Measured ceilings on a real machine are lower
//! (the lent H100 SXM measured 767 TFLOPS bf16 GEMM and 3.0 TB/s copy, `../shared/ANCHORS.md`); reports
//! name which one they divide by. [`cpu_model`] names the host CPU that records are stamped with.

use crate::backend::F32Math;
use crate::dtype::DType;
use serde::Serialize;

/// Peak rates of one device.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HardwareSpec {
    /// Canonical name.
    pub name: &'static str,
    /// Short key for the command line (`--device h100-sxm`).
    pub key: &'static str,
    /// Dense f16 tensor TFLOP/s with f32 accumulation.
    pub f16_tflops: f64,
    /// Dense bf16 tensor TFLOP/s with f32 accumulation.
    pub bf16_tflops: f64,
    /// Dense TF32 tensor TFLOP/s.
    pub tf32_tflops: f64,
    /// f32 TFLOP/s without tensor cores (vector FMA).
    pub fp32_tflops: f64,
    /// Memory bandwidth, GB/s (10^9 bytes per second).
    pub mem_bandwidth_gbs: f64,
    /// Where the figures come from.
    pub source: &'static str,
}

impl HardwareSpec {
    /// Peak TFLOP/s that applies to a dtype (FP8: its inputs' products); f32 uses the tensor-core TF32 rate when the kernel multiplies
    /// in TF32, and a third of it for split TF32 (three products per f32 product).
    pub fn peak_tflops(&self, dtype: DType, f32_math: F32Math) -> f64 {
        match (dtype, f32_math) {
            (DType::F16, _) => self.f16_tflops,
            (DType::BF16, _) => self.bf16_tflops,
            (DType::F32, F32Math::Exact) => self.fp32_tflops,
            (DType::F32, F32Math::Tf32) => self.tf32_tflops,
            (DType::F32, F32Math::SplitTf32) => self.tf32_tflops / 3.0,
            // Dense FP8 runs at twice the bf16 rate on every GPU with FP8 tensor cores (Ada, Hopper); no
            // backend runs FP8 on a GPU without them.
            (DType::F8E4M3, _) => 2.0 * self.bf16_tflops,
        }
    }

    /// Finds a device by a name as reported by drivers and profilers (`deviceProperties` in a PyTorch
    /// trace, `nvidia-smi`), or by its table key. Case-insensitive; `None` when nothing matches.
    pub fn find(name: &str) -> Option<&'static HardwareSpec> {
        let n = name.to_ascii_lowercase();
        if let Some(hw) = HARDWARE.iter().find(|h| h.key == n) {
            return Some(hw);
        }
        let words: Vec<&str> = n.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| !w.is_empty()).collect();
        let has = |w: &str| words.contains(&w);
        let key = if n.contains("h100") {
            if n.contains("pcie") {
                "h100-pcie"
            } else {
                "h100-sxm"
            }
        } else if n.contains("h200") {
            "h200"
        } else if n.contains("a100") {
            if n.contains("40gb") || n.contains("40 gb") {
                "a100-40gb"
            } else {
                "a100-80gb"
            }
        } else if has("l4") {
            "l4"
        } else if has("3060") {
            "rtx3060"
        } else if has("4090") {
            "rtx4090"
        } else if n.contains("mi300x") {
            "mi300x"
        } else {
            return None;
        };
        HARDWARE.iter().find(|h| h.key == key)
    }
}

/// The built-in table.
pub static HARDWARE: &[HardwareSpec] = &[
    // NVIDIA H100 Tensor Core GPU datasheet (SXM5 column): FP16/BF16 1,979 TFLOPS with sparsity (989.4
    // dense), TF32 989 with sparsity (494.7 dense), FP32 67, HBM3 3.35 TB/s.
    HardwareSpec {
        name: "NVIDIA H100 SXM5 80GB",
        key: "h100-sxm",
        f16_tflops: 989.4,
        bf16_tflops: 989.4,
        tf32_tflops: 494.7,
        fp32_tflops: 66.9,
        mem_bandwidth_gbs: 3350.0,
        source: "NVIDIA H100 datasheet, SXM column (dense = half the sparsity figure)",
    },
    // Same datasheet, PCIe column: FP16/BF16 1,513 sparse (756.5 dense), TF32 756 sparse (378 dense),
    // FP32 51, HBM2e 2.0 TB/s.
    HardwareSpec {
        name: "NVIDIA H100 PCIe 80GB",
        key: "h100-pcie",
        f16_tflops: 756.5,
        bf16_tflops: 756.5,
        tf32_tflops: 378.0,
        fp32_tflops: 51.2,
        mem_bandwidth_gbs: 2000.0,
        source: "NVIDIA H100 datasheet, PCIe column (dense = half the sparsity figure)",
    },
    // NVIDIA H200 datasheet (SXM): same compute as H100 SXM, HBM3e 4.8 TB/s.
    HardwareSpec {
        name: "NVIDIA H200 SXM 141GB",
        key: "h200",
        f16_tflops: 989.4,
        bf16_tflops: 989.4,
        tf32_tflops: 494.7,
        fp32_tflops: 66.9,
        mem_bandwidth_gbs: 4800.0,
        source: "NVIDIA H200 datasheet, SXM column (dense = half the sparsity figure)",
    },
    // NVIDIA A100 datasheet: FP16/BF16 312 dense, TF32 156 dense, FP32 19.5; A100 40GB HBM2 1,555 GB/s.
    HardwareSpec {
        name: "NVIDIA A100 40GB",
        key: "a100-40gb",
        f16_tflops: 312.0,
        bf16_tflops: 312.0,
        tf32_tflops: 156.0,
        fp32_tflops: 19.5,
        mem_bandwidth_gbs: 1555.0,
        source: "NVIDIA A100 datasheet, 40GB SXM column",
    },
    // Same datasheet, A100 80GB SXM: HBM2e 2,039 GB/s.
    HardwareSpec {
        name: "NVIDIA A100 80GB",
        key: "a100-80gb",
        f16_tflops: 312.0,
        bf16_tflops: 312.0,
        tf32_tflops: 156.0,
        fp32_tflops: 19.5,
        mem_bandwidth_gbs: 2039.0,
        source: "NVIDIA A100 datasheet, 80GB SXM column",
    },
    // NVIDIA L4 datasheet: FP16/BF16 242 with sparsity (121 dense), TF32 120 sparse (60 dense), FP32 30.3,
    // GDDR6 300 GB/s.
    HardwareSpec {
        name: "NVIDIA L4",
        key: "l4",
        f16_tflops: 121.0,
        bf16_tflops: 121.0,
        tf32_tflops: 60.0,
        fp32_tflops: 30.3,
        mem_bandwidth_gbs: 300.0,
        source: "NVIDIA L4 datasheet (dense = half the sparsity figure)",
    },
    // NVIDIA Ampere GA102 whitepaper, GeForce rates scaled to the RTX 3060 (28 SMs, 1.777 GHz boost):
    // tensor FP16/BF16 with FP32 accumulate 512 FLOP/clk/SM dense = 25.5 TFLOPS, TF32 12.7, FP32 12.7,
    // GDDR6 360 GB/s.
    HardwareSpec {
        name: "NVIDIA GeForce RTX 3060",
        key: "rtx3060",
        f16_tflops: 25.5,
        bf16_tflops: 25.5,
        tf32_tflops: 12.7,
        fp32_tflops: 12.7,
        mem_bandwidth_gbs: 360.0,
        source: "NVIDIA Ampere GA102 whitepaper, GeForce tensor rates scaled to 28 SMs",
    },
    // NVIDIA Ada Lovelace whitepaper, RTX 4090 column: FP16/BF16 tensor with FP32 accumulate 165.2 dense,
    // TF32 82.6 dense, FP32 82.6, GDDR6X 1,008 GB/s.
    HardwareSpec {
        name: "NVIDIA GeForce RTX 4090",
        key: "rtx4090",
        f16_tflops: 165.2,
        bf16_tflops: 165.2,
        tf32_tflops: 82.6,
        fp32_tflops: 82.6,
        mem_bandwidth_gbs: 1008.0,
        source: "NVIDIA Ada Lovelace architecture whitepaper, RTX 4090 column",
    },
    // AMD Instinct MI300X datasheet: FP16/BF16 1,307.4 dense, TF32 653.7 dense, FP32 matrix/vector 163.4,
    // HBM3 5.3 TB/s.
    HardwareSpec {
        name: "AMD Instinct MI300X",
        key: "mi300x",
        f16_tflops: 1307.4,
        bf16_tflops: 1307.4,
        tf32_tflops: 653.7,
        fp32_tflops: 163.4,
        mem_bandwidth_gbs: 5300.0,
        source: "AMD Instinct MI300X datasheet",
    },
    // The development machine's 2 vCPUs (AMD EPYC Zen 5, AVX-512), measured: fp32 FMA peak 465 GFLOP/s,
    // bf16 dot products (avx512_bf16) at twice that, memory read 47 GB/s (../shared/ANCHORS.md).
    HardwareSpec {
        name: "AMD EPYC Zen 5, 2 vCPUs (development machine)",
        key: "zen5-2c",
        f16_tflops: 0.465,
        bf16_tflops: 0.93,
        tf32_tflops: 0.465,
        fp32_tflops: 0.465,
        mem_bandwidth_gbs: 47.0,
        source: "measured on the development machine (ANCHORS.md)",
    },
];

/// The host CPU's model name from `/proc/cpuinfo` (Linux), or the architecture name where there is none.
/// The one definition every record, `sdpa devices` and the CPU backend's device name use.
pub fn cpu_model() -> String {
    let from_proc = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .filter(|v| !v.is_empty())
    });
    from_proc.unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_names_as_drivers_report_them() {
        let k = |n: &str| HardwareSpec::find(n).map(|h| h.key);
        assert_eq!(k("NVIDIA H100 80GB HBM3"), Some("h100-sxm"));
        assert_eq!(k("NVIDIA H100 PCIe"), Some("h100-pcie"));
        assert_eq!(k("NVIDIA H200"), Some("h200"));
        assert_eq!(k("NVIDIA A100-SXM4-40GB"), Some("a100-40gb"));
        assert_eq!(k("NVIDIA A100-SXM4-80GB"), Some("a100-80gb"));
        assert_eq!(k("NVIDIA L4"), Some("l4"));
        assert_eq!(k("NVIDIA L40S"), None); // not an L4
        assert_eq!(k("NVIDIA GeForce RTX 3060"), Some("rtx3060"));
        assert_eq!(k("NVIDIA GeForce RTX 4090"), Some("rtx4090"));
        assert_eq!(k("AMD Instinct MI300X"), Some("mi300x"));
        assert_eq!(k("h100-pcie"), Some("h100-pcie"));
        assert_eq!(k("Tesla T4"), None);
    }

    #[test]
    fn peaks_follow_dtype_and_f32_math() {
        let h = HardwareSpec::find("h100-sxm").unwrap();
        assert_eq!(h.peak_tflops(DType::BF16, F32Math::Exact), 989.4);
        assert_eq!(h.peak_tflops(DType::F32, F32Math::Exact), 66.9);
        assert_eq!(h.peak_tflops(DType::F32, F32Math::Tf32), 494.7);
        for hw in HARDWARE {
            assert!(hw.bf16_tflops >= hw.fp32_tflops && hw.mem_bandwidth_gbs > 0.0, "{}", hw.name);
        }
    }
}
