//! Our own benchmark records (`sdpa bench`, `cargo xtask bench`, `sdpa run --json`, the PyTorch scripts),
//! read to replace the seed's 3-10x Path A range with a measured unfused-vs-fused ratio on the same shape,
//! dtype and mask, and to quote what our benchmarks measured on a trace's exact shape.
//!
//! The records are sdpa-core's [`BenchRecord`], read by the same liberal reader as `sdpa report`
//! ([`sdpa_core::record::parse_results`]): a bench file, a JSON array of records, one record, or JSON lines.

use crate::error::{AnalysisError, Result};
use sdpa_core::record::parse_results;
use sdpa_core::{BenchRecord, HardwareSpec, Mask, Shape, Variants};
use std::path::Path;

/// A record's mask as the analyzer labels a trace's mask: `none`, `causal` (top-left), `causal-br`,
/// `bool`, `additive`. Accepts the spellings the PyTorch scripts and older records used.
pub fn mask_label(raw: &str) -> String {
    match raw.to_ascii_lowercase().as_str() {
        "causal" | "causal_top_left" | "causal-tl" => "causal".into(),
        "causal-br" | "causal_bottom_right" => "causal-br".into(),
        "" | "none" => "none".into(),
        "bool" | "boolean" => "bool".into(),
        other => other.to_string(),
    }
}

/// True when `r` ran this shape's forward in this dtype (`bf16`, `f16`, `f32`, any case) under this mask label,
/// as plain attention (a windowed or softcapped record measured other work, a backward record another pass).
pub fn same_problem(r: &BenchRecord, shape: &Shape, dtype: &str, mask: &str) -> bool {
    same_problem_with(r, shape, dtype, mask, &Variants::default())
}

/// [`same_problem`] for a call with these variants (compared with the diagonal written out on both sides, as
/// records carry it). Traces' attention ops are forward calls: backward records are never evidence for them.
pub fn same_problem_with(r: &BenchRecord, shape: &Shape, dtype: &str, mask: &str, variants: &Variants) -> bool {
    let written = |v: &Variants| {
        let mut v = v.clone();
        if !v.is_plain() {
            v.diagonal = v.diagonal.or_else(|| mask_label(mask).parse::<Mask>().ok().and_then(|m| m.diagonal()));
        } else {
            v.diagonal = None;
        }
        v
    };
    r.shape == *shape
        && r.pass == sdpa_core::Pass::Fwd
        && r.dtype.name().eq_ignore_ascii_case(dtype)
        && mask_label(&r.mask) == mask
        && written(&r.variants) == written(variants)
        && r.time_ms.median > 0.0
}

/// Reads one or more result files (records only; configurations a file lists as skipped are dropped).
pub fn load(paths: &[impl AsRef<Path>]) -> Result<Vec<BenchRecord>> {
    let mut out = Vec::new();
    for p in paths {
        let p = p.as_ref();
        let text = std::fs::read_to_string(p).map_err(|e| AnalysisError::io(p, "cannot read benchmark results", e))?;
        let file = parse_results(&text, &p.display().to_string())
            .map_err(|e| AnalysisError::invalid(p, format!("not a benchmark result file: {e}")))?;
        out.extend(file.records);
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
    let same = |r: &&BenchRecord| same_problem(r, shape, dtype, mask);
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

#[cfg(test)]
mod tests {
    use super::*;
    use sdpa_core::{AttentionSpec, DType, Mask, TimeStats, Window};

    /// A windowed record did other work than the plain call on the same shape: it is evidence only for a call
    /// with the same window, whether or not the causal mask's diagonal is written out.
    #[test]
    fn variant_records_are_evidence_only_for_the_same_variants() {
        let shape = Shape::new(1, 8, 4096, 4096, 128);
        let t = TimeStats { median: 1.0, min: 1.0, max: 1.0, reps: 1 };
        let spec = AttentionSpec::new(shape, DType::BF16).with_mask(Mask::CausalTopLeft);
        let plain = BenchRecord::new("cuda", "fa2", "H100", &spec, t, None);
        let windowed = BenchRecord::new("cuda", "fa2", "H100", &spec.with_window(Window::left(1024)), t, None);
        assert!(same_problem(&plain, &shape, "bf16", "causal"));
        assert!(!same_problem(&windowed, &shape, "bf16", "causal"));
        let asked = Variants { window: Some(Window::left(1024)), ..Default::default() };
        assert!(same_problem_with(&windowed, &shape, "bf16", "causal", &asked));
        assert!(!same_problem_with(&plain, &shape, "bf16", "causal", &asked));
        let other = Variants { window: Some(Window::left(512)), ..Default::default() };
        assert!(!same_problem_with(&windowed, &shape, "bf16", "causal", &other));
    }
}
