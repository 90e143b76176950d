//! The benchmark result record: one per (backend, kernel, device, dtype, shape, mask, layout), written by
//! `sdpa run --json`, `sdpa bench`, the PyTorch timing scripts, and read by `sdpa report` and the analyzer.

use crate::backend::F32Math;
use crate::check::CheckReport;
use crate::cost::AttentionCost;
use crate::dtype::DType;
use crate::spec::{AttentionSpec, Layout, Shape};
use serde::{Deserialize, Serialize};

/// Median, min and max of repeated timings, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimeStats {
    /// Median over the timed repetitions.
    pub median: f64,
    /// Fastest repetition.
    pub min: f64,
    /// Slowest repetition.
    pub max: f64,
    /// Number of timed repetitions.
    #[serde(default)]
    pub reps: usize,
}

impl TimeStats {
    /// Statistics of `samples` (milliseconds); `None` when empty or any sample is not finite.
    pub fn from_samples(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() || samples.iter().any(|x| !x.is_finite()) {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 { s[n / 2] } else { 0.5 * (s[n / 2 - 1] + s[n / 2]) };
        Some(TimeStats { median, min: s[0], max: s[n - 1], reps: n })
    }
}

/// One benchmark result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchRecord {
    /// "reference", "cpu", "cuda", "pytorch", "candle", ...
    pub backend: String,
    /// Kernel that ran ("fa2", "unfused", "flash", "cudnn", "math", ...), or "auto" when the backend chose.
    pub kernel: String,
    /// For `auto`: the kernel the backend chose for this shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_chose: Option<String>,
    /// Device name.
    pub device: String,
    /// Element type.
    pub dtype: DType,
    /// Logical sizes.
    pub shape: Shape,
    /// Mask name: none, causal (top-left), causal-br, bool, additive.
    pub mask: String,
    /// bhsd or bshd (or "strided").
    #[serde(default)]
    pub layout: Option<String>,
    /// f32 multiplication mode when dtype is f32 ("exact", "tf32", "split-tf32").
    #[serde(default)]
    pub f32_math: Option<String>,
    /// CPU worker threads, when relevant.
    #[serde(default)]
    pub threads: Option<usize>,
    /// Timings.
    pub time_ms: TimeStats,
    /// FLOPs of the two products (exact causal count) / median time, in TFLOP/s.
    pub tflops: f64,
    /// Minimal bytes / median time, in GB/s.
    pub gbps: f64,
    /// Comparison with the f64 reference, when checked.
    #[serde(default)]
    pub check: Option<CheckReport>,
    /// Peak extra memory of the call in bytes, when measured.
    #[serde(default)]
    pub peak_mem_bytes: Option<u64>,
    /// Git commit of the code measured.
    #[serde(default)]
    pub commit: Option<String>,
    /// UTC date-time of the measurement (RFC 3339).
    #[serde(default)]
    pub date: Option<String>,
    /// Machine description (CPU model, host name, GPU).
    #[serde(default)]
    pub machine: Option<String>,
}

impl BenchRecord {
    /// A record for `spec` from timing samples; TFLOPS and GB/s come from the cost model.
    pub fn new(
        backend: &str,
        kernel: &str,
        device: &str,
        spec: &AttentionSpec,
        time_ms: TimeStats,
        check: Option<CheckReport>,
    ) -> Self {
        let cost = AttentionCost::of_spec(spec);
        BenchRecord {
            backend: backend.to_string(),
            kernel: kernel.to_string(),
            auto_chose: None,
            device: device.to_string(),
            dtype: spec.dtype,
            shape: spec.shape,
            mask: spec.mask.name().to_string(),
            layout: Some(spec.layout().map_or("strided", |l| l.name()).to_string()),
            f32_math: None,
            threads: None,
            time_ms,
            tflops: cost.tflops(time_ms.median),
            gbps: cost.gbps(time_ms.median),
            check,
            peak_mem_bytes: None,
            commit: None,
            date: None,
            machine: None,
        }
    }
}

/// A benchmark sweep as a file: `sdpa bench --spec FILE`, the presets under `bench/presets/`, and
/// `bench/pytorch_sdpa.py --spec FILE` all read it. The sweep is the cross product of every list; an empty
/// list takes the bench command's default (or its flag). A file holds one spec or a JSON array of specs,
/// whose sweeps are run one after the other.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct BenchSpec {
    /// Short name, e.g. the preset's.
    pub name: Option<String>,
    /// What the sweep is for, in words.
    pub description: Option<String>,
    /// Backends: "reference", "cpu", "cuda"; "pytorch" asks for the PyTorch script on the same shapes.
    pub backends: Vec<String>,
    /// Kernel names: "unfused", "fa1", "fa2", "splitkv", "auto".
    pub kernels: Vec<String>,
    /// Element types.
    pub dtypes: Vec<DType>,
    /// Logical sizes, `{b, hq, hkv, sq, sk, d, dv}`.
    pub shapes: Vec<Shape>,
    /// Mask names as in records: "none", "causal" (top-left), "causal-br" (bottom-right), "bool",
    /// "additive" (explicit full `[B, Hq, Sq, Sk]` masks with random contents).
    pub masks: Vec<String>,
    /// Memory layouts: "bhsd", "bshd".
    pub layouts: Vec<Layout>,
    /// f32 multiplication modes ("exact", "tf32", "split-tf32"); only f32 configurations use them.
    pub f32_math: Vec<F32Math>,
    /// Untimed calls before timing, when the spec wants a value other than the command's.
    pub warmup: Option<usize>,
    /// Largest number of timed calls.
    pub reps: Option<usize>,
    /// Time budget per configuration in seconds: fewer repetitions when one call is slow.
    pub max_time_s: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_even_and_odd_counts() {
        let t = TimeStats::from_samples(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((t.median, t.min, t.max, t.reps), (2.0, 1.0, 3.0, 3));
        assert_eq!(TimeStats::from_samples(&[4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert!(TimeStats::from_samples(&[]).is_none());
        assert!(TimeStats::from_samples(&[1.0, f64::NAN]).is_none());
    }

    #[test]
    fn records_round_trip_and_accept_minimal_foreign_records() {
        let spec = AttentionSpec::new(Shape::new(1, 8, 1024, 1024, 64), DType::BF16);
        let t = TimeStats::from_samples(&[1.0]).unwrap();
        let r = BenchRecord::new("cpu", "fa2", "test", &spec, t, None);
        let back: BenchRecord = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert!((r.tflops - 4.0 * 8.0 * 1024.0 * 1024.0 * 64.0 / 1e-3 / 1e12).abs() < 1e-9);
        // A record as a Python script writes it: fewer fields, check with only the four required keys.
        let py = r#"{"backend":"pytorch","kernel":"flash","device":"H100","dtype":"bf16",
            "shape":{"b":1,"hq":8,"hkv":8,"sq":1024,"sk":1024,"d":64,"dv":64},"mask":"causal",
            "time_ms":{"median":0.5,"min":0.4,"max":0.6},"tflops":1.0,"gbps":2.0,
            "check":{"max_abs_err":0.001,"rel_err":0.002,"tolerance":0.016,"pass":true}}"#;
        let r: BenchRecord = serde_json::from_str(py).unwrap();
        assert!(r.check.unwrap().pass);
    }

    #[test]
    fn bench_specs_take_defaults_for_missing_lists() {
        let text = r#"{"backends":["cpu"],"dtypes":["bf16"],"masks":["causal-br"],"layouts":["bshd"],
            "shapes":[{"b":1,"hq":8,"hkv":2,"sq":64,"sk":96,"d":64,"dv":64}]}"#;
        let s: BenchSpec = serde_json::from_str(text).unwrap();
        assert_eq!(s.shapes[0].hkv, 2);
        assert_eq!(s.layouts, vec![Layout::Bshd]);
        assert!(s.kernels.is_empty() && s.reps.is_none());
        assert!(serde_json::from_str::<BenchSpec>(r#"{"dtypes":["f64"]}"#).is_err());
    }
}
