//! Our own benchmark records (`sdpa bench` / `cargo xtask bench` JSON), read to replace the seed's 3-10x
//! Path A range with a measured unfused-vs-fused ratio on the same shape, dtype and mask.
//!
//! Record format (a JSON array; unknown fields ignored):
//! `{"backend": "cuda", "kernel": "fa2", "device": "NVIDIA H100 80GB HBM3", "dtype": "bf16",
//!   "shape": {"b":2,"hq":16,"hkv":8,"sq":1024,"sk":1024,"d":64,"dv":64}, "mask": "causal",
//!   "time_ms": {"median": 0.21, ...}, ...}`

use crate::error::{AnalysisError, Result};
use sdpa_core::{HardwareSpec, Shape};
use serde::Deserialize;
use std::path::Path;

/// One benchmark result record (the fields this crate reads).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct BenchRecord {
    /// `cpu`, `cuda`, `torch`, ...
    #[serde(default)]
    pub backend: String,
    /// `unfused`, `fa2`, ...
    #[serde(default)]
    pub kernel: String,
    /// Device name as the benchmark saw it.
    #[serde(default)]
    pub device: String,
    /// `bf16`, `f16`, `f32`.
    #[serde(default)]
    pub dtype: String,
    /// The shape.
    pub shape: Shape,
    /// `none`, `causal`, `causal-br` (or sdpa-core's serialized mask object).
    #[serde(default)]
    pub mask: serde_json::Value,
    /// Timing, milliseconds.
    pub time_ms: TimeMs,
}

/// Timing summary of a record, milliseconds.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct TimeMs {
    /// Median.
    pub median: f64,
}

impl BenchRecord {
    /// The mask as `none` / `causal` / `causal-br`.
    pub fn mask_label(&self) -> String {
        let raw = match &self.mask {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Object(o) => o.get("kind").and_then(|k| k.as_str()).unwrap_or("").to_string(),
            serde_json::Value::Null => "none".into(),
            other => other.to_string(),
        };
        match raw.to_ascii_lowercase().as_str() {
            "causal" | "causal_top_left" | "causal-tl" => "causal".into(),
            "causal-br" | "causal_bottom_right" => "causal-br".into(),
            "" | "none" => "none".into(),
            "bool" | "boolean" => "bool".into(),
            other => other.to_string(),
        }
    }
}

/// Reads one or more record files.
pub fn load(paths: &[impl AsRef<Path>]) -> Result<Vec<BenchRecord>> {
    let mut out = Vec::new();
    for p in paths {
        let p = p.as_ref();
        let text = std::fs::read_to_string(p).map_err(|e| AnalysisError::io(p, "cannot read benchmark results", e))?;
        let recs: Vec<BenchRecord> = serde_json::from_str(&text)
            .map_err(|e| AnalysisError::invalid(p, format!("not a JSON array of benchmark records: {e}")))?;
        out.extend(recs);
    }
    Ok(out)
}

/// A measured unfused / fused time ratio.
#[derive(Debug, Clone, PartialEq)]
pub struct MeasuredRatio {
    /// unfused median / best fused median.
    pub ratio: f64,
    /// The fused kernel that was fastest.
    pub fused_kernel: String,
    /// Device the records came from.
    pub device: String,
    /// Medians, ms (unfused, fused).
    pub times_ms: (f64, f64),
}

/// The ratio for this shape, dtype (`bf16`...) and mask label, preferring records from `device_key`'s GPU.
pub fn measured_ratio(
    records: &[BenchRecord],
    shape: &Shape,
    dtype: &str,
    mask: &str,
    device_key: Option<&str>,
) -> Option<MeasuredRatio> {
    let same = |r: &&BenchRecord| {
        r.shape == *shape && r.dtype.eq_ignore_ascii_case(dtype) && r.mask_label() == mask && r.time_ms.median > 0.0
    };
    let on_device = |r: &&BenchRecord| match device_key {
        Some(k) => HardwareSpec::find(&r.device).map(|h| h.key) == Some(k),
        None => true,
    };
    let pick = |filter_device: bool| -> Option<MeasuredRatio> {
        let cands: Vec<&BenchRecord> = records.iter().filter(same).filter(|r| !filter_device || on_device(r)).collect();
        let unfused = cands
            .iter()
            .filter(|r| r.kernel == "unfused")
            .min_by(|a, b| a.time_ms.median.total_cmp(&b.time_ms.median))?;
        let fused = cands
            .iter()
            .filter(|r| r.kernel != "unfused" && r.backend == unfused.backend)
            .min_by(|a, b| a.time_ms.median.total_cmp(&b.time_ms.median))?;
        Some(MeasuredRatio {
            ratio: unfused.time_ms.median / fused.time_ms.median,
            fused_kernel: fused.kernel.clone(),
            device: fused.device.clone(),
            times_ms: (unfused.time_ms.median, fused.time_ms.median),
        })
    };
    pick(true).or_else(|| pick(false))
}
