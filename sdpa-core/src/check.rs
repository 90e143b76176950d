//! Comparing a backend's output with the f64 reference, and the per-dtype tolerances (the one place they
//! are stated).

use crate::backend::F32Math;
use crate::dtype::DType;
use crate::error::Result;
use crate::reference::reference_row_in;
use crate::spec::AttentionSpec;
use crate::tensor::{HostInputs, HostOutput};
use serde::{Deserialize, Serialize};

/// Largest relative L2 error `‖out − ref‖ / ‖ref‖` accepted for a dtype and f32 math mode.
///
/// - f32, exact: 1e-5 (f32 accumulation over long rows stays well under it).
/// - f32, TF32 tensor cores: 2e-3 (10-bit mantissa products; typically 3e-4).
/// - f32, split TF32: 2e-6. It claims the accuracy of exact f32 (PyTorch's f32 SDPA measures 5-7e-7 on the
///   H100); the kernel measures 2-7e-7 up to Sk = 8191 (`bench/results/gpu/tf32.md`), so a regression shows.
/// - f16: 2e-3 and bf16: 1.6e-2 — about four output roundings; inputs are the same rounded values the
///   reference reads, so this covers rounding P to the half type before P·V plus the output rounding.
///   Backend test suites additionally hold fused kernels to at most twice their own unfused kernel's error
///   in the same dtype.
/// - f8e4m3 inputs (bf16 output): 8e-2. The reference reads the same stored E4M3 values (times their
///   descales), so input quantization is no error here; what remains is P rounded to E4M3 before P·V (3-bit
///   mantissa: relative error at most 2⁻⁴ per element, about 2⁻⁴/√3 = 3.6e-2 RMS, which the relative L2
///   error of O inherits for random V) and the bf16 output rounding (2⁻⁸): twice the P term plus the
///   output term, rounded up. Against bf16 inputs, FP8's own input quantization adds the same order again
///   (the FP8 tests state that figure beside it).
pub fn tolerance(dtype: DType, f32_math: F32Math) -> f64 {
    match (dtype, f32_math) {
        (DType::F32, F32Math::Exact) => 1e-5,
        (DType::F32, F32Math::Tf32) => 2e-3,
        (DType::F32, F32Math::SplitTf32) => 2e-6,
        (DType::F16, _) => 2e-3,
        (DType::BF16, _) => 1.6e-2,
        (DType::F8E4M3, _) => 8e-2,
    }
}

/// How far an output is from the reference.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CheckReport {
    /// Largest absolute difference over the checked elements (NaN when not recorded; `null` in JSON).
    #[serde(deserialize_with = "crate::record::f64_or_nan")]
    pub max_abs_err: f64,
    /// Relative L2 error `‖out − ref‖ / ‖ref‖`.
    #[serde(deserialize_with = "crate::record::f64_or_nan")]
    pub rel_err: f64,
    /// The tolerance on `rel_err` for this dtype.
    #[serde(deserialize_with = "crate::record::f64_or_nan")]
    pub tolerance: f64,
    /// Elements that are NaN on one side only (unwritten outputs stay NaN from the poison).
    #[serde(default)]
    pub nan_mismatches: usize,
    /// Largest LSE difference over rows with a finite reference LSE, when LSE was produced.
    #[serde(default)]
    pub lse_max_abs_err: Option<f64>,
    /// Query rows compared.
    #[serde(default)]
    pub rows_checked: usize,
    /// `rel_err <= tolerance`, no NaN mismatch, LSE (when present) within `1e-3 + tolerance·|lse|`.
    pub pass: bool,
}

impl CheckReport {
    /// What failed, in words, or `None` when the check passed: NaN/inf mismatches and LSE errors are named
    /// as such instead of reading as a relative error that is within tolerance.
    pub fn failure(&self) -> Option<String> {
        if self.pass {
            return None;
        }
        let mut why = Vec::new();
        if self.nan_mismatches > 0 {
            why.push(format!(
                "{} output elements are NaN where the reference is a number, or the reverse",
                self.nan_mismatches
            ));
        }
        if self.rel_err.is_nan() || self.rel_err > self.tolerance {
            why.push(format!("relative error {:.3e} > tolerance {:.1e}", self.rel_err, self.tolerance));
        }
        if let Some(e) = self.lse_max_abs_err {
            if why.is_empty() {
                why.push(format!("log-sum-exp off by up to {e:.3e}"));
            }
        }
        if why.is_empty() {
            why.push(format!("relative error {:.3e} (tolerance {:.1e})", self.rel_err, self.tolerance));
        }
        Some(why.join("; "))
    }
}

/// Compares `out` with the reference on all rows, or on `max_rows` rows spread evenly (first and last
/// included) when the full reference would be too slow.
pub fn check_output(
    spec: &AttentionSpec,
    inputs: &HostInputs,
    out: &HostOutput,
    f32_math: F32Math,
    max_rows: Option<usize>,
) -> Result<CheckReport> {
    spec.validate()?;
    inputs.check(spec)?;
    let s = spec.shape;
    let total = spec.lse_len()?;
    let n = max_rows.map_or(total, |m| m.clamp(1, total));
    let rows = spread(n, total);

    let mut diff2 = 0.0;
    let mut ref2 = 0.0;
    let mut max_abs: f64 = 0.0;
    let mut nan_mismatches = 0;
    let mut lse_err: Option<f64> = None;
    let mut lse_ok = true;
    let tol = tolerance(spec.dtype, f32_math);
    let mut want = vec![0.0f64; s.dv];
    let seqs = spec.seqs();
    for &row in &rows {
        let (b, h, i) = spec.row_coords(row);
        let seq = &seqs[b];
        let want_lse = reference_row_in(spec, inputs, seq, b, h, i, &mut want);
        let off = spec.o_offset(seq, b, h, i);
        for (c, &w) in want.iter().enumerate() {
            let got = out.o.get_f64(off + c);
            if got.is_nan() != w.is_nan() {
                nan_mismatches += 1;
                continue;
            }
            if w.is_nan() {
                continue;
            }
            let d = got - w;
            diff2 += d * d;
            ref2 += w * w;
            max_abs = max_abs.max(d.abs());
        }
        if let Some(lse) = &out.lse {
            let got = lse[row] as f64;
            if want_lse.is_finite() {
                let e = (got - want_lse).abs();
                lse_err = Some(lse_err.unwrap_or(0.0).max(e));
                lse_ok &= e <= 1e-3 + tol * want_lse.abs();
            } else {
                // -inf must stay -inf; NaN must stay NaN.
                let same = (want_lse.is_nan() && got.is_nan()) || got == want_lse;
                lse_ok &= same;
                if !same {
                    nan_mismatches += 1;
                }
            }
        }
    }
    let rel_err = if ref2 > 0.0 { (diff2 / ref2).sqrt() } else { diff2.sqrt() };
    Ok(CheckReport {
        max_abs_err: max_abs,
        rel_err,
        tolerance: tol,
        nan_mismatches,
        lse_max_abs_err: lse_err,
        rows_checked: rows.len(),
        pass: rel_err <= tol && nan_mismatches == 0 && lse_ok,
    })
}

/// `n` evenly spread indices of `0..total`, first and last included (all of them when `n >= total`): the
/// rows a sampled check compares.
pub(crate) fn spread(n: usize, total: usize) -> Vec<usize> {
    let n = n.min(total);
    if n == total {
        return (0..total).collect();
    }
    (0..n).map(|k| k * (total - 1) / (n - 1).max(1)).collect()
}

#[cfg(test)]
mod tests {

    /// Regression (issue 19): a failure caused only by NaN mismatches read "relative error 0.000e0 >
    /// tolerance 2.0e-3 (128 NaN mismatches)", which says the opposite of what happened.
    #[test]
    fn a_failed_check_says_what_failed() {
        let base = CheckReport {
            max_abs_err: 0.0,
            rel_err: 0.0,
            tolerance: 2e-3,
            nan_mismatches: 0,
            lse_max_abs_err: None,
            rows_checked: 4,
            pass: true,
        };
        assert_eq!(base.failure(), None);
        let nan = CheckReport { nan_mismatches: 128, pass: false, ..base };
        let why = nan.failure().unwrap();
        assert!(why.starts_with("128 output elements are NaN") && !why.contains("relative error"), "{why}");
        let rel = CheckReport { rel_err: 2.26e-2, pass: false, ..base };
        assert_eq!(rel.failure().unwrap(), "relative error 2.260e-2 > tolerance 2.0e-3");
        let lse = CheckReport { lse_max_abs_err: Some(0.5), pass: false, ..base };
        assert!(lse.failure().unwrap().contains("log-sum-exp"));
    }
    use super::*;
    use crate::backend::{HostBackend, RunOptions};
    use crate::reference::ReferenceBackend;
    use crate::spec::{Mask, Shape};
    use crate::tensor::HostBuffer;

    #[test]
    fn the_reference_passes_its_own_check_and_poison_fails_it() {
        for dt in DType::ALL {
            let spec = AttentionSpec::new(Shape { b: 1, hq: 2, hkv: 1, sq: 9, sk: 13, d: 16, dv: 16 }, dt)
                .with_mask(Mask::CausalTopLeft);
            let inp = HostInputs::random(&spec, 1).unwrap();
            let run = ReferenceBackend.run_host(&spec, &RunOptions { lse: true, ..Default::default() }, &inp).unwrap();
            let rep = check_output(&spec, &inp, &run.output, F32Math::Exact, None).unwrap();
            assert!(rep.pass, "{dt}: {rep:?}");
            assert!(rep.rel_err <= dt.unit_roundoff() * 2.0, "{dt}: {rep:?}");

            // One element left unwritten (still poisoned) must fail.
            let mut bad = run.output.clone();
            bad.o.set_f32(5, f32::NAN);
            assert!(!check_output(&spec, &inp, &bad, F32Math::Exact, None).unwrap().pass);

            // A wrong value must fail too.
            let mut wrong = run.output.clone();
            let x = wrong.o.get_f32(7);
            wrong.o.set_f32(7, x + 0.5);
            assert!(!check_output(&spec, &inp, &wrong, F32Math::Exact, None).unwrap().pass);
        }
    }

    #[test]
    fn sampling_rows_includes_the_last_one() {
        let spec = AttentionSpec::new(Shape::new(1, 1, 100, 10, 4), DType::F32);
        let inp = HostInputs::random(&spec, 2).unwrap();
        let mut o = HostBuffer::zeros(DType::F32, 400);
        let r = crate::reference::reference_attention(&spec, &inp).unwrap();
        for (i, &x) in r.o.iter().enumerate().take(396) {
            o.set_f32(i, x as f32);
        }
        // Only the last row is wrong (zeros); a sample of 5 rows must still see it.
        let rep = check_output(&spec, &inp, &HostOutput { o, lse: None }, F32Math::Exact, Some(5)).unwrap();
        assert_eq!(rep.rows_checked, 5);
        assert!(!rep.pass);
    }
}
