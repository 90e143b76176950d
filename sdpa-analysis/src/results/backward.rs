//! The backward's table (issue 24): every backward and forward + backward record of ours with its time and
//! TFLOP/s over the pass's work (`AttentionCost::of_pass`), against PyTorch's backward of the same
//! configuration measured in the same file (its FLASH_ATTENTION kernel, which on the CPU is the fused CPU
//! kernel; CUDNN_ATTENTION; and the fastest PyTorch record of any kernel), with the gradients' check (the
//! worst of dQ, dK and dV, as records carry it), whether the backward was deterministic, and the peak memory
//! the call added where it was measured.
//!
//! "Same file" because a ratio is only meaningful between calls timed side by side: `sdpa bench` writes its
//! records and PyTorch's into one file.

use super::model::{Group, ResultsReport, Row};
use sdpa_core::check::CheckReport;
use sdpa_core::{DType, Pass};
use std::collections::BTreeMap;

/// PyTorch's kernels the backward is held against, each a column of the table: (record kernel, label).
pub const PYTORCH_BACKWARDS: [(&str, &str); 2] = [("flash", "flash"), ("cudnn", "cuDNN")];

/// One line of [`ResultsReport::backward_rows`].
#[derive(Debug, Clone, PartialEq)]
pub struct BackwardRow {
    /// The group of the record (its title names the configuration and the pass).
    pub group: usize,
    /// `backend:kernel`.
    pub series: String,
    /// `bwd` or `fwd+bwd`.
    pub pass: Pass,
    /// Median, ms.
    pub median_ms: f64,
    /// TFLOP/s over the pass's work.
    pub tflops: f64,
    /// Per [`PYTORCH_BACKWARDS`] kernel: its median over ours (above 1: ours is faster), when it ran on the
    /// same configuration in the same file.
    pub vs: Vec<Option<f64>>,
    /// The fastest PyTorch record of the configuration in the same file: its median over ours, and its kernel.
    pub vs_best: Option<(f64, String)>,
    /// The gradients' check (the worst of dQ, dK, dV).
    pub check: Option<CheckReport>,
    /// Whether the backward was deterministic, as the backend reported it.
    pub deterministic: Option<bool>,
    /// Peak memory the call added, bytes, when measured (host backends: the resident set's rise).
    pub peak_mem_bytes: Option<u64>,
}

/// One line of [`ResultsReport::backward_summary`]: the bar (median and worst ratio over a grid).
#[derive(Debug, Clone, PartialEq)]
pub struct BackwardSummary {
    /// "cpu" or the GPU's name.
    pub platform: String,
    /// `bwd` or `fwd+bwd`.
    pub pass: Pass,
    /// Element type.
    pub dtype: DType,
    /// `backend:kernel`.
    pub series: String,
    /// The PyTorch kernel the ratios are against.
    pub against: String,
    /// Configurations with a ratio.
    pub configurations: usize,
    /// Median ratio (PyTorch's median over ours).
    pub median: f64,
    /// Smallest ratio.
    pub min: f64,
}

impl ResultsReport {
    /// Every backward or forward + backward record of ours (not PyTorch's), in group order.
    pub fn backward_rows(&self) -> Vec<BackwardRow> {
        let mut out = Vec::new();
        for (i, g) in self.groups.iter().enumerate().filter(|(_, g)| g.pass != Pass::Fwd) {
            for row in g.rows.iter().filter(|r| r.rec.backend != "pytorch") {
                let t = row.rec.time_ms.median;
                out.push(BackwardRow {
                    group: i,
                    series: row.series.clone(),
                    pass: g.pass,
                    median_ms: t,
                    tflops: row.tflops,
                    vs: PYTORCH_BACKWARDS
                        .iter()
                        .map(|(k, _)| pytorch_median(g, row, Some(k)).map(|(p, _)| p / t))
                        .collect(),
                    vs_best: pytorch_median(g, row, None).map(|(p, k)| (p / t, k)),
                    check: row.rec.check,
                    deterministic: row.rec.deterministic,
                    peak_mem_bytes: row.rec.peak_mem_bytes,
                });
            }
        }
        out
    }

    /// The ratios of [`Self::backward_rows`] against each [`PYTORCH_BACKWARDS`] kernel, summarised per
    /// (platform, pass, dtype, series): how many configurations, the median and the smallest.
    pub fn backward_summary(&self) -> Vec<BackwardSummary> {
        type Key = (String, u8, u8, String, usize);
        let mut acc: BTreeMap<Key, (Pass, DType, Vec<f64>)> = BTreeMap::new();
        for r in self.backward_rows() {
            let Some(g) = self.groups.get(r.group) else { continue };
            for (k, ratio) in r.vs.iter().enumerate() {
                let Some(x) = ratio else { continue };
                let key = (g.platform.clone(), r.pass as u8, g.dtype as u8, r.series.clone(), k);
                acc.entry(key).or_insert((r.pass, g.dtype, Vec::new())).2.push(*x);
            }
        }
        acc.into_iter()
            .map(|((platform, _, _, series, k), (pass, dtype, mut v))| {
                v.sort_by(f64::total_cmp);
                let n = v.len();
                let median = if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) };
                BackwardSummary {
                    platform,
                    pass,
                    dtype,
                    series,
                    against: format!("pytorch:{}", PYTORCH_BACKWARDS[k].0),
                    configurations: n,
                    median,
                    min: v[0],
                }
            })
            .collect()
    }
}

/// The median of PyTorch's `kernel` (the fastest PyTorch kernel when `None`) in `g`, from `row`'s file.
fn pytorch_median(g: &Group, row: &Row, kernel: Option<&str>) -> Option<(f64, String)> {
    g.rows
        .iter()
        .filter(|x| x.rec.backend == "pytorch" && x.file == row.file && x.rec.time_ms.median > 0.0)
        .filter(|x| kernel.is_none_or(|k| x.rec.kernel == k))
        .min_by(|a, b| a.rec.time_ms.median.total_cmp(&b.rec.time_ms.median))
        .map(|x| (x.rec.time_ms.median, x.rec.kernel.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::ReportOptions;
    use sdpa_core::record::BenchFile;
    use sdpa_core::{AttentionSpec, BenchRecord, Shape, TimeStats};

    fn rec(backend: &str, kernel: &str, pass: Pass, ms: f64) -> BenchRecord {
        let spec = AttentionSpec::new(Shape::new(2, 16, 1024, 1024, 128), DType::BF16);
        let t = TimeStats { median: ms, min: ms, max: ms, reps: 3 };
        BenchRecord::new(backend, kernel, "NVIDIA H100 80GB HBM3", &spec, t, None).with_pass(&spec, pass)
    }

    /// Ratios pair a backward with PyTorch's backward of the same file, never with a forward or with
    /// another file's run; forward + backward rows have their own ratios.
    #[test]
    fn backward_ratios_pair_the_same_pass_in_the_same_file() {
        let mut run = BenchFile::new();
        run.records = vec![
            rec("cuda", "fa2", Pass::Fwd, 1.0),
            rec("cuda", "fa2", Pass::Bwd, 2.0),
            rec("cuda", "fa2", Pass::FwdBwd, 3.0),
            rec("pytorch", "flash", Pass::Fwd, 0.5),
            rec("pytorch", "flash", Pass::Bwd, 3.0),
            rec("pytorch", "cudnn", Pass::Bwd, 1.0),
            rec("pytorch", "flash", Pass::FwdBwd, 6.0),
        ];
        let mut other = BenchFile::new();
        other.records = vec![rec("pytorch", "cudnn", Pass::FwdBwd, 0.1)];
        let files = [("run.json".to_string(), run), ("other.json".to_string(), other)];
        let r = ResultsReport::build(&files, &ReportOptions::default()).expect("report");
        let rows = r.backward_rows();
        assert_eq!(rows.len(), 2, "{rows:?}");
        let bwd = rows.iter().find(|x| x.pass == Pass::Bwd).expect("bwd row");
        assert_eq!(bwd.vs, vec![Some(1.5), Some(0.5)]);
        assert_eq!(bwd.vs_best, Some((0.5, "cudnn".to_string())));
        // TFLOP/s of the backward's work: 2.5x the forward's FLOPs in 2x the time.
        let fwd = &r.groups.iter().find(|g| g.pass == Pass::Fwd).expect("fwd group").rows[0];
        assert!((bwd.tflops / fwd.tflops - 1.25).abs() < 1e-9, "{} vs {}", bwd.tflops, fwd.tflops);
        let both = rows.iter().find(|x| x.pass == Pass::FwdBwd).expect("fwd+bwd row");
        // The other file's cuDNN record is not a ratio of this run.
        assert_eq!(both.vs, vec![Some(2.0), None]);
        assert!(r.groups[bwd.group].title().contains("· bwd ·"), "{}", r.groups[bwd.group].title());
        let s = r.backward_summary();
        assert_eq!(s.len(), 3, "{s:?}");
        assert!(s.iter().any(|x| x.pass == Pass::Bwd && x.against == "pytorch:cudnn" && x.median == 0.5));
    }
}
