//! The frontier: the best known attention rate for a device, dtype, pass (forward or backward), head dim,
//! mask and sequence length, and a fused op's standing against it.
//!
//! Two tables, compiled in as data: published figures with their sources (`data/frontier_published.json`,
//! FlashAttention-3's paper on the H100) and the project's own measured records of PyTorch's flash, cuDNN and
//! memory-efficient backends and of our kernels (`data/frontier_measured.json`, derived from
//! `bench/results/gpu/*.json` by [`derive_measured`]; a test re-derives it so it cannot drift). A lookup
//! interpolates each series in log sequence length, holds its last value beyond its longest length (rates
//! plateau there) and never extrapolates below its shortest. The seed bands (`sdpa_core::expected_band`)
//! stay the fallback where no entry applies.
//!
//! The verdict compares the op's achieved TFLOP/s (same FLOP count as the sources: the causal mask's pairs,
//! backward 2.5x forward) with the best known rate: [`AT_FRONTIER`] or more is "at the frontier",
//! [`NEAR_FRONTIER`] or more "near", less "below".

use crate::trace::attention::{BatchLayout, Kind, Phase};
use crate::trace::perf::Band;
use sdpa_core::{BenchRecord, HardwareSpec, Pass};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// At least this fraction of the best known rate: at the frontier.
pub const AT_FRONTIER: f64 = 0.90;
/// At least this fraction: near the frontier.
pub const NEAR_FRONTIER: f64 = 0.70;

/// One kernel's rates over sequence length for one device, dtypes, pass, head dim and mask.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// Kernel as people name it (`FlashAttention-3`, `PyTorch cuDNN`).
    pub kernel: String,
    /// `fa3`, `cudnn`, `flash`, `efficient`, `ours`: ties a series to the backend an op ran.
    pub family: String,
    /// Hardware-table key (`h100-sxm`).
    pub device: String,
    /// `bf16`, `f16`.
    pub dtypes: Vec<String>,
    /// `fwd` or `bwd`.
    pub pass: String,
    /// Head dim (D = Dv).
    pub d: usize,
    /// `none` or `causal`.
    pub mask: String,
    /// (S, TFLOP/s), S ascending (Sq = Sk = S).
    pub points: Vec<(usize, f64)>,
    /// Where the figures come from.
    pub source: String,
}

#[derive(Deserialize)]
struct TableFile {
    series: Vec<Series>,
}

/// Both tables, parsed once.
pub fn table() -> &'static [Series] {
    static TABLE: OnceLock<Vec<Series>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut all = Vec::new();
        for text in
            [include_str!("../../data/frontier_published.json"), include_str!("../../data/frontier_measured.json")]
        {
            // The files are ours and tested; a broken one leaves its part of the table empty, never a panic.
            if let Ok(f) = serde_json::from_str::<TableFile>(text) {
                all.extend(f.series);
            }
        }
        all
    })
}

/// What an op is compared with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Query<'a> {
    /// Hardware-table key.
    pub device: &'a str,
    /// `bf16`, `f16`.
    pub dtype: &'a str,
    /// `fwd` or `bwd`.
    pub pass: &'a str,
    /// Head dim.
    pub d: usize,
    /// Causal.
    pub causal: bool,
    /// Sequence length.
    pub s: usize,
}

/// One series' rate at the query's length.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reference {
    /// Kernel.
    pub kernel: String,
    /// Its family (`fa3`, `cudnn`, ...).
    pub family: String,
    /// TFLOP/s at the query's length.
    pub tflops: f64,
    /// Where the figure comes from.
    pub source: String,
    /// How the rate was read: `at S = 2048`, `interpolated between S = 1024 and 2048`, `held from S = 16384`.
    pub how: String,
}

/// The rate of `s` on a series: interpolated in log S between its points, held beyond the last, `None` below
/// the first.
pub fn rate_at(points: &[(usize, f64)], s: usize) -> Option<(f64, String)> {
    let (&(s0, _), &(sl, rl)) = (points.first()?, points.last()?);
    if s < s0 {
        return None;
    }
    if s >= sl {
        let how = if s == sl { format!("at S = {sl}") } else { format!("held from S = {sl} (the longest listed)") };
        return Some((rl, how));
    }
    let w = points.windows(2).find(|w| w[0].0 <= s && s < w[1].0)?;
    let ((a, ra), (b, rb)) = (w[0], w[1]);
    if a == s {
        return Some((ra, format!("at S = {a}")));
    }
    let t = ((s as f64).ln() - (a as f64).ln()) / ((b as f64).ln() - (a as f64).ln());
    Some((ra + t * (rb - ra), format!("interpolated in log S between S = {a} and {b}")))
}

/// Every series that applies to `q`, each at `q.s`, fastest first.
pub fn references(q: &Query<'_>) -> Vec<Reference> {
    let mask = if q.causal { "causal" } else { "none" };
    let mut out: Vec<Reference> = table()
        .iter()
        .filter(|s| s.device == q.device && s.pass == q.pass && s.d == q.d && s.mask == mask)
        .filter(|s| s.dtypes.iter().any(|d| d == q.dtype))
        .filter_map(|s| {
            let (tflops, how) = rate_at(&s.points, q.s)?;
            Some(Reference {
                kernel: s.kernel.clone(),
                family: s.family.clone(),
                tflops,
                source: s.source.clone(),
                how,
            })
        })
        .collect();
    out.sort_by(|a, b| b.tflops.total_cmp(&a.tflops));
    out
}

/// `at_frontier`, `near` or `below`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// At least [`AT_FRONTIER`] of the best known rate.
    AtFrontier,
    /// At least [`NEAR_FRONTIER`].
    Near,
    /// Below that.
    Below,
}

impl Verdict {
    /// For people: `at the frontier`, `near the frontier`, `below the frontier`.
    pub fn words(self) -> &'static str {
        match self {
            Verdict::AtFrontier => "at the frontier",
            Verdict::Near => "near the frontier",
            Verdict::Below => "below the frontier",
        }
    }

    fn of(ratio: f64) -> Self {
        if ratio >= AT_FRONTIER {
            Verdict::AtFrontier
        } else if ratio >= NEAR_FRONTIER {
            Verdict::Near
        } else {
            Verdict::Below
        }
    }
}

/// A fused op judged against the best known rate for its device, dtype, pass, head dim, mask and length.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FrontierJudgement {
    /// The verdict.
    pub verdict: Verdict,
    /// Achieved TFLOP/s / best known TFLOP/s.
    pub ratio: f64,
    /// The op's achieved TFLOP/s.
    pub achieved_tflops: f64,
    /// The best known rate and where it comes from.
    pub best: Reference,
    /// The best known rate of the op's own implementation (published or measured), when listed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub same_kernel: Option<Reference>,
    /// The lookup: device, dtype, pass, D, mask and S compared at.
    pub compared_at: String,
    /// Mean time per call at the best known rate, µs.
    pub best_us: f64,
}

impl FrontierJudgement {
    /// `302.7 TFLOP/s = 82 % of the best known 371.0 (FlashAttention-3, ...)`.
    pub fn summary(&self) -> String {
        format!(
            "{:.1} TFLOP/s = {:.0} % of the best known {:.1} TFLOP/s ({}, {}; {})",
            self.achieved_tflops,
            self.ratio * 100.0,
            self.best.tflops,
            self.best.kernel,
            self.best.how,
            self.best.source
        )
    }
}

/// The finding of a fused op with a frontier entry: info when at or near the best known rate, Path B with the
/// gap, the time at stake and `checks` (what to look at) when below it.
pub fn finding(
    i: usize,
    op: &crate::trace::report::AttentionOp,
    fr: &FrontierJudgement,
    checks: &[String],
    replay: Option<crate::trace::replay::Replay>,
) -> crate::trace::findings::Finding {
    use crate::trace::findings::{rates, severity_for_share, shape_words, where_, Finding, Severity};
    let own = fr
        .same_kernel
        .as_ref()
        .filter(|r| r.kernel != fr.best.kernel)
        .map(|r| {
            format!(
                " Its own implementation's best known rate here: {:.1} TFLOP/s ({}; {}).",
                r.tflops, r.kernel, r.source
            )
        })
        .unwrap_or_default();
    let head = format!(
        "{} calls, {}: {:.1} µs per call, {}. Compared at {}: {}.{own}",
        op.count,
        shape_words(op),
        op.mean_us,
        rates(op),
        fr.compared_at,
        fr.summary()
    );
    let title_tail =
        format!("{:.0} % of the best known {:.0} TFLOP/s ({})", fr.ratio * 100.0, fr.best.tflops, fr.best.kernel);
    let who = format!("{} attention ({}) in {}", op.backend.name(), op.phase.name(), where_(op));
    if fr.verdict != Verdict::Below {
        return Finding {
            severity: Severity::Info,
            path: "-",
            title: format!("{who} is {}: {title_tail}", fr.verdict.words()),
            detail: format!(
                "{head} The best known rate is {:.2}x this one: that bounds what another kernel could gain on these \
                 calls ({:.1} µs at most), so look at the rest of the step first.{}",
                1.0 / fr.ratio.max(1e-9),
                op.total_us * (1.0 - fr.ratio).max(0.0),
                checks
                    .iter()
                    .filter(|c| c.starts_with("measured on this shape"))
                    .map(|c| format!(" Also {c}."))
                    .collect::<String>()
            ),
            time_us: Some(op.total_us),
            expected_speedup: None,
            replay,
            replay_note: None,
            op_index: Some(i),
        };
    }
    let saved = op.total_us * (1.0 - fr.ratio).max(0.0);
    Finding {
        severity: severity_for_share(op.share_of_gpu),
        path: "B",
        title: format!("{who} is below the frontier: {title_tail}"),
        detail: format!(
            "{head} Running at the best known rate would save about {saved:.1} µs ({:.2} % of GPU time). What to \
             check: {}.",
            op.share_of_gpu * (1.0 - fr.ratio).max(0.0) * 100.0,
            checks.join("; ")
        ),
        time_us: Some(op.total_us),
        expected_speedup: None,
        replay,
        replay_note: None,
        op_index: Some(i),
    }
}

/// The family of series an op's backend belongs to.
pub fn family_of(backend: crate::trace::attention::AttnBackend) -> Option<&'static str> {
    use crate::trace::attention::AttnBackend as B;
    match backend {
        B::Flash => Some("flash"),
        B::Cudnn => Some("cudnn"),
        B::Efficient => Some("efficient"),
        _ => None,
    }
}

/// The facts of a grouped op the frontier needs (all from the op's key and performance model).
#[derive(Debug, Clone, Copy)]
pub struct OpFacts<'a> {
    /// Fused or unfused.
    pub kind: Kind,
    /// Forward or backward.
    pub phase: Phase,
    /// Backend.
    pub backend: crate::trace::attention::AttnBackend,
    /// Shape.
    pub shape: sdpa_core::Shape,
    /// dtype label (`bf16`).
    pub dtype: &'a str,
    /// Mask label (`none`, `causal`, `causal-br`, ...).
    pub mask: &'a str,
    /// True when a window, softcap or ALiBi is applied.
    pub has_variants: bool,
    /// Dense, varlen or paged.
    pub layout: BatchLayout,
    /// Achieved TFLOP/s.
    pub tflops: f64,
    /// Mean µs per call.
    pub mean_us: f64,
}

/// The judgement of a dense self-attention op (Sq = Sk) with no variants against the frontier; `None` where no
/// entry applies (then the seed band judges it).
pub fn judge(f: &OpFacts<'_>, hw: Option<&HardwareSpec>) -> Option<FrontierJudgement> {
    let hw = hw?;
    let causal = match f.mask {
        "none" => false,
        // With Sq = Sk both diagonals are the same mask.
        "causal" | "causal-br" => true,
        _ => return None,
    };
    let s = f.shape;
    if f.kind != Kind::Fused || f.layout != BatchLayout::Dense || f.has_variants || s.sq != s.sk || s.d != s.dv {
        return None;
    }
    if f.tflops <= 0.0 || !f.tflops.is_finite() {
        return None;
    }
    let pass = match f.phase {
        Phase::Fwd => "fwd",
        Phase::Bwd => "bwd",
    };
    let q = Query { device: hw.key, dtype: f.dtype, pass, d: s.d, causal, s: s.sk };
    let refs = references(&q);
    let best = refs.first()?.clone();
    let family = family_of(f.backend);
    let same_kernel = family.and_then(|fam| refs.iter().find(|r| r.family == fam).cloned());
    let ratio = f.tflops / best.tflops;
    Some(FrontierJudgement {
        verdict: Verdict::of(ratio),
        ratio,
        achieved_tflops: f.tflops,
        best_us: f.mean_us * ratio,
        same_kernel,
        compared_at: format!(
            "{} {} {pass} D = {} {} S = {}",
            hw.key,
            f.dtype,
            s.d,
            if causal { "causal" } else { "non-causal" },
            s.sk
        ),
        best,
    })
}

/// The backward's own expected band on a device with published backward rates: from FlashAttention-2's rate
/// (low edge) to FlashAttention-3's (high edge) at the key length, as fractions of the device's 16-bit peak.
/// Published backward charts are non-causal at D = 128; the band is a fraction of peak, so it is applied to
/// other head dims and masks as a band (the frontier lookup stays exact).
pub fn backward_band(hw: Option<&HardwareSpec>, sk: usize) -> Option<Band> {
    let hw = hw?;
    let published = |family: &str| {
        table().iter().find(|s| {
            s.device == hw.key
                && s.pass == "bwd"
                && s.family == family
                && s.source.starts_with("FlashAttention-3 paper")
        })
    };
    let (lo_s, hi_s) = (published("flash")?, published("fa3")?);
    let (lo, _) = rate_at(&lo_s.points, sk)?;
    let (hi, how) = rate_at(&hi_s.points, sk)?;
    let peak = hw.bf16_tflops;
    if peak <= 0.0 {
        return None;
    }
    Some(Band {
        low: lo / peak,
        high: hi / peak,
        label: format!(
            "backward band: FlashAttention-2 {lo:.0} to FlashAttention-3 {hi:.0} TFLOP/s of {peak:.0} ({how}; {}, \
             D = {})",
            hi_s.source, hi_s.d
        ),
    })
}

/// The kernels whose records make up the measured table, with the names it gives them: PyTorch's fused
/// backends and our fused kernels (not the dispatcher's `default`, which is one of these, nor math or unfused).
fn measured_kernel(r: &BenchRecord) -> Option<(&'static str, &'static str)> {
    match (r.backend.as_str(), r.kernel.as_str()) {
        ("pytorch", "flash") => Some(("PyTorch flash (FlashAttention-2)", "flash")),
        ("pytorch", "cudnn") => Some(("PyTorch cuDNN", "cudnn")),
        ("pytorch", "efficient") => Some(("PyTorch memory-efficient", "efficient")),
        ("cuda", "fa2") => Some(("sdpa cuda fa2", "ours")),
        ("cuda", "fa3") => Some(("sdpa cuda fa3", "ours")),
        _ => None,
    }
}

/// The measured table from benchmark records: for each device, dtype, pass, D, mask and kernel, the fastest
/// record at each S (dense, Sq = Sk, D = Dv, no variants, checked records that passed, 16-bit dtypes), its
/// rate recomputed from the record's shape, mask, pass and median time with sdpa-core's cost model.
/// `files` pairs each file's name (for the source) with its records.
pub fn derive_measured(files: &[(String, Vec<BenchRecord>)]) -> Vec<Series> {
    /// Device, dtype, pass, D, mask, kernel.
    type Key = (String, String, String, usize, String, String);
    /// Best rate per S, the files it came from, the family.
    type Acc = (BTreeMap<usize, f64>, Vec<String>, &'static str);
    let mut acc: BTreeMap<Key, Acc> = BTreeMap::new();
    for (file, records) in files {
        for r in records {
            let Some((kernel, family)) = measured_kernel(r) else { continue };
            let Some(hw) = HardwareSpec::find(&r.device) else { continue };
            let dtype = r.dtype.name();
            let pass = match r.pass {
                Pass::Fwd => "fwd",
                Pass::Bwd => "bwd",
                Pass::FwdBwd => continue,
            };
            let s = &r.shape;
            let plain = r.ragged.is_none() && r.variants.is_plain() && s.sq == s.sk && s.d == s.dv;
            let mask = match r.mask.as_str() {
                "none" => "none",
                "causal" | "causal-br" => "causal",
                _ => continue,
            };
            let passed = r.check.as_ref().is_none_or(|c| c.pass);
            // A call spread over several GPUs (ring attention) reports the rate of all of them together.
            let one_gpu = r.gpus.is_none_or(|n| n <= 1);
            if !plain
                || !one_gpu
                || !passed
                || !(dtype == "bf16" || dtype == "f16")
                || r.time_ms.median.is_nan()
                || r.time_ms.median <= 0.0
            {
                continue;
            }
            // The rate from the record's own shape, mask and median, not its `tflops` field: one cost model for
            // every file, whatever its writer counted.
            let Ok(core_mask) = r.mask.parse::<sdpa_core::Mask>() else { continue };
            let spec = sdpa_core::AttentionSpec::new(*s, r.dtype).with_mask(core_mask);
            let tflops = sdpa_core::AttentionCost::of_pass(&spec, r.pass).tflops(r.time_ms.median);
            if !(tflops.is_finite() && tflops > 0.0) {
                continue;
            }
            let key =
                (hw.key.to_string(), dtype.to_string(), pass.to_string(), s.d, mask.to_string(), kernel.to_string());
            let e = acc.entry(key).or_insert_with(|| (BTreeMap::new(), Vec::new(), family));
            let t = (tflops * 10.0).round() / 10.0;
            let best = e.0.entry(s.sk).or_insert(t);
            *best = best.max(t);
            if !e.1.contains(file) {
                e.1.push(file.clone());
            }
        }
    }
    acc.into_iter()
        .map(|((device, dtype, pass, d, mask, kernel), (points, mut files, family))| {
            files.sort();
            Series {
                kernel,
                family: family.to_string(),
                device,
                dtypes: vec![dtype],
                pass,
                d,
                mask,
                points: points.into_iter().collect(),
                source: format!("measured by this project: bench/results/gpu/{{{}}}", files.join(",")),
            }
        })
        .collect()
}

/// The measured table as written to `data/frontier_measured.json`.
pub fn measured_json(series: &[Series]) -> String {
    let body: Vec<String> =
        series.iter().map(|s| serde_json::to_string(s).unwrap_or_default()).map(|line| format!("    {line}")).collect();
    format!(
        "{{\n  \"about\": \"Derived from bench/results/gpu/*.json by sdpa_analysis::trace::frontier::derive_measured; \
         regenerate with SDPA_WRITE_FRONTIER=1 cargo test -p sdpa-analysis --test frontier_table\",\n  \"series\": [\n{}\n  ]\n}}\n",
        body.join(",\n")
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn rates_interpolate_in_log_length_and_hold_beyond_the_last() {
        let pts = [(1024, 300.0), (4096, 500.0)];
        // 2048 is halfway between 1024 and 4096 in log2.
        assert!((rate_at(&pts, 2048).unwrap().0 - 400.0).abs() < 1e-9);
        assert_eq!(rate_at(&pts, 1024).unwrap().0, 300.0);
        assert_eq!(rate_at(&pts, 65536).unwrap().0, 500.0);
        assert!(rate_at(&pts, 65536).unwrap().1.contains("held"));
        assert!(rate_at(&pts, 512).is_none(), "never extrapolated below the shortest length");
    }

    #[test]
    fn published_table_parses_with_sources_and_ascending_points() {
        let published: TableFile = serde_json::from_str(include_str!("../../data/frontier_published.json")).unwrap();
        assert!(published.series.len() >= 14);
        for s in &published.series {
            assert!(s.source.contains("arXiv:2407.08608"), "{}", s.source);
            assert!(s.points.windows(2).all(|w| w[0].0 < w[1].0), "{s:?}");
        }
        // The issue's example: FlashAttention-3's causal D = 64 forward at S = 2048 on the H100.
        let q = Query { device: "h100-sxm", dtype: "bf16", pass: "fwd", d: 64, causal: true, s: 2048 };
        let refs = references(&q);
        let fa3 = refs.iter().find(|r| r.kernel == "FlashAttention-3").unwrap();
        assert_eq!(fa3.tflops, 371.0);
        assert!(refs[0].tflops >= 371.0, "the best is at least FlashAttention-3's");
        // FP8 rates apply to FP8 inputs only.
        let fp8 = Query { device: "h100-sxm", dtype: "Float8_e4m3fn", pass: "fwd", d: 256, causal: false, s: 16384 };
        assert_eq!(references(&fp8)[0].tflops, 1171.0);
        assert!(references(&Query { dtype: "bf16", ..fp8 }).iter().all(|r| r.tflops < 1000.0));
    }

    #[test]
    fn the_issue_example_is_near_not_below() {
        // cuDNN at D = 64 causal S = 2048 bf16 on the H100 at 30.6 % of its 989 TFLOP/s.
        let hw = HardwareSpec::find("h100-sxm").unwrap();
        let tflops = 0.306 * hw.bf16_tflops;
        let f = OpFacts {
            kind: Kind::Fused,
            phase: Phase::Fwd,
            backend: crate::trace::attention::AttnBackend::Cudnn,
            shape: sdpa_core::Shape { b: 2, hq: 16, hkv: 16, sq: 2048, sk: 2048, d: 64, dv: 64 },
            dtype: "bf16",
            mask: "causal",
            has_variants: false,
            layout: BatchLayout::Dense,
            tflops,
            mean_us: 100.0,
        };
        let j = judge(&f, Some(hw)).unwrap();
        assert_ne!(j.verdict, Verdict::Below, "{j:?}");
        assert!(j.best.tflops >= 371.0);
        assert_eq!(j.same_kernel.as_ref().map(|r| r.family.as_str()), Some("cudnn"));
        // Half that rate is below.
        let slow = judge(&OpFacts { tflops: tflops / 2.0, ..f }, Some(hw)).unwrap();
        assert_eq!(slow.verdict, Verdict::Below);
        // No entry for an explicit mask, a window, Sq != Sk, or an unknown device.
        assert!(judge(&OpFacts { mask: "explicit-additive[2,1,2048,2048]", ..f }, Some(hw)).is_none());
        assert!(judge(&OpFacts { has_variants: true, ..f }, Some(hw)).is_none());
        assert!(judge(&OpFacts { shape: sdpa_core::Shape { sq: 1, ..f.shape }, ..f }, Some(hw)).is_none());
        assert!(judge(&f, HardwareSpec::find("l4")).is_none());
    }

    #[test]
    fn backward_band_spans_the_published_fa2_to_fa3_rates() {
        let hw = HardwareSpec::find("h100-sxm");
        let b = backward_band(hw, 2048).unwrap();
        let peak = hw.unwrap().bf16_tflops;
        assert!((b.low - 291.0 / peak).abs() < 1e-9 && (b.high - 501.0 / peak).abs() < 1e-9, "{b:?}");
        assert!(backward_band(HardwareSpec::find("a100-80gb"), 2048).is_none());
    }
}
