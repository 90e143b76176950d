//! From records to report data: per-shape groups with recomputed TFLOPS and GB/s, efficiency against a
//! peak, speedup against a baseline, and the series the plots draw. Plain data; the printers render it.

use super::ReportError;
use sdpa_core::record::{BenchFile, MeasuredPeak, Skipped};
use sdpa_core::{
    AttentionCost, AttentionSpec, BenchRecord, Bound, DType, Descale, ExplicitMask, F32Math, HardwareSpec, Mask,
    MaskValues, Pass, Ragged, Shape, Variants,
};
use std::collections::BTreeMap;

/// What speedups are measured against: a backend's named kernel, or its fastest kernel in each group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Baseline {
    /// Backend name, e.g. "pytorch".
    pub backend: String,
    /// Kernel name; `None` means the fastest kernel of that backend in the group ("best").
    pub kernel: Option<String>,
}

impl Baseline {
    /// Parses `backend:kernel`, `backend:best` or `backend`.
    pub fn parse(s: &str) -> Result<Self, ReportError> {
        let s = s.trim();
        let (b, k) = s.split_once(':').unwrap_or((s, "best"));
        if b.is_empty() || k.is_empty() {
            return Err(ReportError::Option(format!("baseline `{s}` must be backend:kernel, backend:best or backend")));
        }
        let kernel = if k == "best" { None } else { Some(k.to_string()) };
        Ok(Baseline { backend: b.to_string(), kernel })
    }

    /// `backend:kernel` or `backend:best`.
    pub fn label(&self) -> String {
        format!("{}:{}", self.backend, self.kernel.as_deref().unwrap_or("best"))
    }

    /// The baselines tried in order when none is chosen: PyTorch's fastest backend, then our unfused
    /// kernels (the pattern eager models run).
    pub fn defaults() -> Vec<Baseline> {
        vec![
            Baseline { backend: "pytorch".into(), kernel: None },
            Baseline { backend: "cuda".into(), kernel: Some("unfused".into()) },
            Baseline { backend: "cpu".into(), kernel: Some("unfused".into()) },
        ]
    }
}

/// Which peak efficiencies divide by.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum PeakChoice {
    /// Each record's device looked up in the hardware table by name (no efficiency when not found).
    #[default]
    Auto,
    /// One table entry for every record (`--device h100-sxm`).
    Tabled(&'static HardwareSpec),
    /// Measured ceilings given on the command line.
    Measured(MeasuredPeak),
}

/// How to build a report.
#[derive(Debug, Clone, Default)]
pub struct ReportOptions {
    /// Title of the page.
    pub title: Option<String>,
    /// Baselines tried in order per group; empty means [`Baseline::defaults`].
    pub baselines: Vec<Baseline>,
    /// Peak for efficiency.
    pub peak: PeakChoice,
}

/// Where a file's records came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    /// File name as given.
    pub name: String,
    /// Records read.
    pub records: usize,
    /// Skipped configurations listed.
    pub skipped: usize,
    /// Machine, commit, date and command of the run, when the file says.
    pub machine: Option<String>,
    /// Git commit.
    pub commit: Option<String>,
    /// Date of the run.
    pub date: Option<String>,
    /// Command line.
    pub command: Option<String>,
}

/// One measured configuration with its derived figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The record as read.
    pub rec: BenchRecord,
    /// Index of the file it came from in [`ResultsReport::sources`] (ratios "measured in the same run" pair
    /// rows of one file).
    pub file: usize,
    /// `backend:kernel` (with the f32 math mode when it is not exact).
    pub series: String,
    /// FLOP/s in TFLOP/s, recomputed from the shape, mask, dtype and median time.
    pub tflops: f64,
    /// Minimal bytes over median time, GB/s.
    pub gbps: f64,
    /// FLOPs per minimal byte.
    pub intensity: f64,
    /// Roofline time over measured time against the chosen peak.
    pub efficiency: Option<f64>,
    /// Which resource bounds the roofline.
    pub bound: Option<Bound>,
    /// Baseline median over this median (above 1: faster than the baseline).
    pub speedup: Option<f64>,
}

/// The records of one configuration (platform, pass, dtype, mask, variants, shape, layout): records with
/// different variants or passes are never grouped, so every speedup compares calls with the same window,
/// softcap and ALiBi, and a backward only with a backward.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    /// "cpu" or the GPU's name.
    pub platform: String,
    /// What the rows timed: the forward, the backward, or both.
    pub pass: Pass,
    /// Element type.
    pub dtype: DType,
    /// FP8 inputs: the descale factors every row ran with (records with other factors form their own group);
    /// `None` for other dtypes and for FP8 records that do not carry them.
    pub descale: Option<Descale>,
    /// Mask name.
    pub mask: String,
    /// The variants as records carry them (plain attention when none is set).
    pub variants: Variants,
    /// Their label, `window 4096,0 tl · softcap 50` (empty for plain attention).
    pub variants_label: String,
    /// Logical sizes.
    pub shape: Shape,
    /// Layout name.
    pub layout: String,
    /// The ragged batch (lengths, pages) every row ran; `None` for dense calls. The shape's Sq/Sk are then
    /// its bounds.
    pub ragged: Option<Ragged>,
    /// Measured rows, in series order.
    pub rows: Vec<Row>,
    /// The baseline the speedups use (label and median ms), when one is present in the group.
    pub baseline: Option<(String, f64)>,
}

impl Group {
    /// A one-line title: `cpu · bf16 · causal · B=1 Hq=8 Hkv=8 Sq=512 Sk=512 D=64 · bhsd`, with the variants
    /// after the mask (`causal + window 4096,0 tl`), a pass other than the forward after the platform
    /// (`cpu · bwd · ...`) and FP8's descales after the dtype (`f8e4m3 descale 0.5,0.25,0.125`).
    pub fn title(&self) -> String {
        let batch = self.ragged.as_ref().map(|r| format!(" · {}", batch_label(r))).unwrap_or_default();
        let descale = self.descale.map(|d| format!(" {}", descale_label(&d))).unwrap_or_default();
        format!(
            "{} · {}{descale} · {} · {} · {}{batch}",
            platform_and_pass(&self.platform, self.pass),
            self.dtype,
            mask_and_variants(&self.mask, &self.variants_label),
            shape_label(&self.shape),
            self.layout
        )
    }
}

/// The platform, and the pass when it is not the forward: `NVIDIA H100 80GB HBM3 · bwd`. Titles and plot
/// families use it, so a backward never shares a line or a heading with a forward.
pub fn platform_and_pass(platform: &str, pass: Pass) -> String {
    match pass {
        Pass::Fwd => platform.to_string(),
        p => format!("{platform} · {p}"),
    }
}

/// `descale 0.5,0.25,0.125` (Q, K, V), or `descale 0.00387` when the three are equal: the form `--descale`
/// takes.
pub fn descale_label(d: &Descale) -> String {
    if d.q == d.k && d.k == d.v {
        format!("descale {}", d.q)
    } else {
        format!("descale {},{},{}", d.q, d.k, d.v)
    }
}

/// `causal`, or `causal + window 4096,0 tl · softcap 50` when variants are set.
pub fn mask_and_variants(mask: &str, variants_label: &str) -> String {
    if variants_label.is_empty() {
        mask.to_string()
    } else {
        format!("{mask} + {variants_label}")
    }
}

/// A record's variants label, with the diagonal it measures from (the record's, else its causal mask's).
pub fn variants_label(rec: &BenchRecord) -> String {
    let from_mask = rec.mask.parse::<Mask>().ok().and_then(|m| m.diagonal());
    rec.variants.label(rec.variants.diagonal.or(from_mask))
}

/// `varlen 16 seqs, 65536 q / 65536 k tokens` or `paged 16 (279 pages), 3 seqs, 3 q tokens, 4431 cached`.
pub fn batch_label(r: &Ragged) -> String {
    match &r.pages {
        None => format!("varlen {} seqs, {} q / {} k tokens", r.batch(), r.total_q(), r.total_k()),
        Some(p) => format!(
            "paged {} ({} pages), {} seqs, {} q tokens, {} cached",
            p.page_size,
            p.num_pages,
            r.batch(),
            r.total_q(),
            r.total_k()
        ),
    }
}

/// `B=1 Hq=8 Hkv=8 Sq=512 Sk=512 D=64` (and `Dv=` when it differs).
pub fn shape_label(s: &Shape) -> String {
    let dv = if s.dv != s.d { format!(" Dv={}", s.dv) } else { String::new() };
    format!("B={} Hq={} Hkv={} Sq={} Sk={} D={}{dv}", s.b, s.hq, s.hkv, s.sq, s.sk, s.d)
}

/// One line of [`ResultsReport::speedup_summary`].
#[derive(Debug, Clone, PartialEq)]
pub struct SpeedupSummary {
    /// "cpu" or the GPU's name.
    pub platform: String,
    /// The pass the ratios are of (ratios of different passes are never pooled).
    pub pass: Pass,
    /// Element type.
    pub dtype: DType,
    /// The variants' label (empty: plain attention): ratios of different variants are never pooled.
    pub variants: String,
    /// `backend:kernel`.
    pub series: String,
    /// The baseline(s) the ratios are against.
    pub baseline: String,
    /// Configurations with a ratio.
    pub configurations: usize,
    /// Median ratio.
    pub median: f64,
    /// Smallest ratio.
    pub min: f64,
    /// Largest ratio.
    pub max: f64,
}

/// One line of [`ResultsReport::variant_ratios`]: a call with variants against the same series on the same
/// configuration without them.
#[derive(Debug, Clone, PartialEq)]
pub struct VariantRatio {
    /// The group of the call with variants (its title names the configuration and the variants).
    pub group: usize,
    /// `backend:kernel`.
    pub series: String,
    /// Median of the call with variants, ms.
    pub median_ms: f64,
    /// Median of the same series without variants, ms.
    pub plain_ms: f64,
    /// `median_ms / plain_ms`: below 1 a window's saving, above 1 what the variant costs.
    pub time_ratio: f64,
    /// The group's speedup against its baseline (the same-variant baseline, e.g. PyTorch's Flex call).
    pub speedup: Option<f64>,
}

/// What a line plot's x axis is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XAxis {
    /// The sequence length Sk (shapes that differ only in it and the batch).
    SeqLen,
    /// The head dim D (shapes that differ only in it and the head counts: hidden size kept).
    HeadDim,
}

/// A TFLOPS-against-x plot (sequence length or head dim), x on a log2 scale.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqPlot {
    /// Title.
    pub title: String,
    /// The variants every point of the plot ran with (empty: plain attention); the legend names them.
    pub variants: String,
    /// The x axis.
    pub x: XAxis,
    /// Per series: (x, TFLOPS) sorted by x.
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

/// A roofline plot for one platform.
#[derive(Debug, Clone, PartialEq)]
pub struct RooflinePlot {
    /// Title.
    pub title: String,
    /// Compute ceilings (label, TFLOP/s) and the bandwidth (GB/s), when a peak is known.
    pub ceilings: Vec<(String, f64)>,
    /// Memory bandwidth for the sloped roof.
    pub gbps: Option<f64>,
    /// Points: (series, intensity, TFLOPS, label).
    pub points: Vec<(String, f64, f64, String)>,
}

/// Everything a report shows.
#[derive(Debug, Clone, PartialEq)]
pub struct ResultsReport {
    /// Page title.
    pub title: String,
    /// Input files.
    pub sources: Vec<Source>,
    /// Series in the order they first appear (plots give each one fixed colour).
    pub series: Vec<String>,
    /// Groups in a stable order.
    pub groups: Vec<Group>,
    /// Configurations that did not run.
    pub skipped: Vec<Skipped>,
    /// What the efficiency column divides by, in words.
    pub peak_note: String,
    /// TFLOPS against sequence length, then against head dim.
    pub seq_plots: Vec<SeqPlot>,
    /// One roofline per platform.
    pub rooflines: Vec<RooflinePlot>,
    /// Copy bandwidth (GB/s) measured per platform: by the run itself (its file's ceilings), else given
    /// with `--peak-gbps`; what paged decoding's GB/s is held against.
    pub measured_gbps: BTreeMap<String, f64>,
}

/// Parses a record's mask name back into a mask for the cost model (explicit masks cost every pair).
pub fn mask_of(name: &str, shape: &Shape) -> Option<Mask> {
    match name {
        "bool" => Some(Mask::Explicit(ExplicitMask::full(MaskValues::Boolean, shape))),
        "additive" => Some(Mask::Explicit(ExplicitMask::full(MaskValues::Additive, shape))),
        other => other.parse().ok(),
    }
}

/// The record's variants as a grouping key: plain attention is the empty string, others their JSON with the
/// diagonal written out (so a record that leaves a causal mask's diagonal implicit groups with one that names it).
fn variants_key(rec: &BenchRecord) -> String {
    if rec.variants.is_plain() {
        return String::new();
    }
    let mut v = rec.variants.clone();
    v.diagonal = v.diagonal.or_else(|| rec.mask.parse::<Mask>().ok().and_then(|m| m.diagonal()));
    serde_json::to_string(&v).unwrap_or_default()
}

/// The cost of the work the record's call did: its pass (forward, backward or both), its mask, and the pairs its
/// window leaves; `None` for a mask name the cost model does not know or variants that do not validate for the
/// shape.
pub(crate) fn cost_of(rec: &BenchRecord) -> Option<AttentionCost> {
    let mask = mask_of(&rec.mask, &rec.shape)?;
    if rec.ragged.is_none() && rec.variants.is_plain() && rec.pass == Pass::Fwd {
        return Some(AttentionCost::of(&rec.shape, &mask, rec.dtype));
    }
    let spec = AttentionSpec::new(rec.shape, rec.dtype);
    let spec = match &rec.ragged {
        // Each sequence's own band over its own lengths (the layout does not change the work).
        Some(r) => spec.with_ragged(r.clone(), sdpa_core::Layout::Bshd),
        None => spec,
    };
    let spec = spec.with_mask(mask).with_variants(rec.variants.clone());
    spec.validate().ok().map(|()| AttentionCost::of_pass(&spec, rec.pass))
}

/// True when a device name is a GPU's (so PyTorch CUDA records group with our CUDA records).
fn is_gpu_name(device: &str) -> bool {
    let d = device.to_ascii_lowercase();
    ["nvidia", "geforce", "tesla", "instinct", "radeon", "cuda"].iter().any(|w| d.contains(w))
}

/// "cpu" for CPU backends and CPU devices, else the GPU's name without the details our CUDA backend appends
/// in brackets ("NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)"), so PyTorch's records of the same GPU, which carry
/// the bare name, land on the same platform and are compared with ours.
pub fn platform_of(rec: &BenchRecord) -> String {
    let gpu = |name: &str| name.split(" (").next().unwrap_or(name).trim().to_string();
    match rec.backend.as_str() {
        "cpu" | "reference" => "cpu".to_string(),
        "cuda" => gpu(&rec.device),
        _ if is_gpu_name(&rec.device) => gpu(&rec.device),
        _ => "cpu".to_string(),
    }
}

fn series_of(rec: &BenchRecord) -> String {
    let name = match rec.f32_math.as_deref() {
        Some(m) if m != "exact" && rec.dtype == DType::F32 => format!("{}:{}({m})", rec.backend, rec.kernel),
        _ => format!("{}:{}", rec.backend, rec.kernel),
    };
    // A call spread over several GPUs (ring attention, PyTorch's context parallelism) does the same work as
    // the one-GPU call of its shape: the same group, its own row, so the two compare side by side.
    match rec.gpus {
        Some(n) if n > 1 => format!("{name} x{n} GPUs"),
        _ => name,
    }
}

/// Platform, pass, dtype rank, mask, variants (as JSON: exact, so two slope lists never merge), sizes, layout,
/// the ragged batch (as JSON; empty for dense calls, which sort first).
type GroupKey = (String, u8, u8, String, String, String, [usize; 7], String, String);

fn pass_rank(p: Pass) -> u8 {
    match p {
        Pass::Fwd => 0,
        Pass::Bwd => 1,
        Pass::FwdBwd => 2,
    }
}

/// A ragged batch as a grouping key: its lengths and page size (the pool's size is the runner's choice).
pub(crate) fn ragged_key(r: Option<&Ragged>) -> String {
    r.map(|r| {
        let page = r.pages.map_or(0, |p| p.page_size);
        format!("{page}:{:?}:{:?}", r.seqlens_q, r.seqlens_k)
    })
    .unwrap_or_default()
}

fn shape_key(s: &Shape) -> [usize; 7] {
    [s.b, s.hq, s.hkv, s.sq, s.sk, s.d, s.dv]
}

fn dtype_rank(d: DType) -> u8 {
    match d {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::BF16 => 2,
        DType::F8E4M3 => 3,
    }
}

impl ResultsReport {
    /// Builds a report from parsed files (each with the name it was read from).
    pub fn build(files: &[(String, BenchFile)], opts: &ReportOptions) -> Result<ResultsReport, ReportError> {
        let mut sources = Vec::new();
        let mut series: Vec<String> = Vec::new();
        let mut skipped = Vec::new();
        // Key order: platform, dtype, mask, then D, heads, lengths, batch: related shapes sit together.
        let mut groups: BTreeMap<GroupKey, Group> = BTreeMap::new();
        // Ceilings measured by the runs themselves, per platform (used when no peak was chosen).
        let mut measured: BTreeMap<String, MeasuredPeak> = BTreeMap::new();
        let mut measured_gbps: BTreeMap<String, f64> = BTreeMap::new();
        for (file_index, (name, file)) in files.iter().enumerate() {
            sources.push(Source {
                name: name.clone(),
                records: file.records.len(),
                skipped: file.skipped.len(),
                machine: file.machine.clone().or_else(|| file.records.iter().find_map(|r| r.machine.clone())),
                commit: file.commit.clone().or_else(|| file.records.iter().find_map(|r| r.commit.clone())),
                date: file.date.clone().or_else(|| file.records.iter().find_map(|r| r.date.clone())),
                command: file.command.clone(),
            });
            skipped.extend(file.skipped.iter().cloned());
            for rec in &file.records {
                let bw = file.ceilings.and_then(|m| m.gbps).or(match opts.peak {
                    PeakChoice::Measured(m) => m.gbps,
                    _ => None,
                });
                if let Some(bw) = bw {
                    measured_gbps.entry(platform_of(rec)).or_insert(bw);
                }
                let peak = match (&opts.peak, &file.ceilings) {
                    (PeakChoice::Auto, Some(m)) if m.tflops(rec.dtype).is_some() => {
                        measured.insert(platform_of(rec), *m);
                        PeakChoice::Measured(*m)
                    }
                    (p, _) => *p,
                };
                let row = derive_row(rec, file_index, &peak)?;
                if !series.contains(&row.series) {
                    series.push(row.series.clone());
                }
                let s = rec.shape;
                let layout = rec.layout.clone().unwrap_or_else(|| "bhsd".to_string());
                let label = variants_label(rec);
                let key: GroupKey = (
                    platform_of(rec),
                    pass_rank(rec.pass),
                    dtype_rank(rec.dtype),
                    rec.descale.map(|d| descale_label(&d)).unwrap_or_default(),
                    rec.mask.clone(),
                    variants_key(rec),
                    [s.d, s.dv, s.hq, s.hkv, s.sq, s.sk, s.b],
                    layout.clone(),
                    ragged_key(rec.ragged.as_ref()),
                );
                groups
                    .entry(key)
                    .or_insert_with(|| Group {
                        platform: platform_of(rec),
                        pass: rec.pass,
                        dtype: rec.dtype,
                        descale: rec.descale,
                        mask: rec.mask.clone(),
                        variants: rec.variants.clone(),
                        variants_label: label,
                        shape: s,
                        layout,
                        ragged: rec.ragged.clone(),
                        rows: Vec::new(),
                        baseline: None,
                    })
                    .rows
                    .push(row);
            }
        }
        let baselines = if opts.baselines.is_empty() { Baseline::defaults() } else { opts.baselines.clone() };
        let mut groups: Vec<Group> = groups.into_values().collect();
        for g in &mut groups {
            g.rows.sort_by_key(|r| series.iter().position(|s| *s == r.series));
            g.baseline = baselines.iter().find_map(|b| baseline_time(g, b).map(|t| (b.label(), t)));
            if let Some((_, base)) = g.baseline {
                for r in &mut g.rows {
                    r.speedup = Some(base / r.rec.time_ms.median);
                }
            }
        }
        let title = opts.title.clone().unwrap_or_else(|| "sdpa benchmark report".to_string());
        let mut seq_plots = seq_plots(&groups, &series);
        seq_plots.extend(head_dim_plots(&groups, &series));
        let rooflines = rooflines(&groups, &opts.peak, &measured);
        let mut note = peak_note(&opts.peak);
        let mut unknown: Vec<&str> = groups
            .iter()
            .filter(|g| g.rows.iter().all(|r| r.efficiency.is_none()))
            .map(|g| g.platform.as_str())
            .collect();
        unknown.dedup();
        if !unknown.is_empty() {
            note.push_str(&format!(
                "; no peak known for {} (pass --device KEY from the hardware table, or --peak-tflops/--peak-gbps)",
                unknown.join(", ")
            ));
        }
        for (platform, m) in &measured {
            note.push_str(&format!(
                "; on {platform}: the ceilings measured in the same run ({})",
                describe_measured(m)
            ));
        }
        Ok(ResultsReport {
            title,
            sources,
            series,
            groups,
            skipped,
            peak_note: note,
            seq_plots,
            rooflines,
            measured_gbps,
        })
    }

    /// Speedups against the baseline summarised per (platform, dtype, series): configurations, median, min
    /// and max, over the groups where the baseline ran (the seed reports' "ours vs PyTorch" line).
    pub fn speedup_summary(&self) -> Vec<SpeedupSummary> {
        // (platform, pass, dtype rank, variants, series index) -> (dtype, pass, ratios, baselines used).
        type Tally = BTreeMap<(String, u8, u8, String, usize), (DType, Pass, Vec<f64>, Vec<String>)>;
        let mut acc = Tally::new();
        for g in &self.groups {
            let Some((base, _)) = &g.baseline else { continue };
            // The baseline against itself is 1 by definition.
            for r in g.rows.iter().filter(|r| r.series != *base) {
                let (Some(sp), Some(idx)) = (r.speedup, self.series.iter().position(|s| *s == r.series)) else {
                    continue;
                };
                let key = (g.platform.clone(), pass_rank(g.pass), dtype_rank(g.dtype), g.variants_label.clone(), idx);
                let e = acc.entry(key).or_insert((g.dtype, g.pass, Vec::new(), Vec::new()));
                e.2.push(sp);
                if !e.3.contains(base) {
                    e.3.push(base.clone());
                }
            }
        }
        acc.into_iter()
            .map(|((platform, _, _, variants, idx), (dtype, pass, mut v, bases))| {
                v.sort_by(f64::total_cmp);
                let n = v.len();
                let median = if n % 2 == 1 { v[n / 2] } else { 0.5 * (v[n / 2 - 1] + v[n / 2]) };
                SpeedupSummary {
                    platform,
                    pass,
                    dtype,
                    variants,
                    series: self.series[idx].clone(),
                    baseline: bases.join(", "),
                    configurations: n,
                    median,
                    min: v[0],
                    max: v[n - 1],
                }
            })
            .collect()
    }

    /// Every call with variants against the same series, platform, dtype, mask, shape and layout without
    /// them (issue 22's "softcap <= 10 % over plain", "window >= 3.5x faster than full"), in group order.
    pub fn variant_ratios(&self) -> Vec<VariantRatio> {
        type Key = (String, u8, u8, String, [usize; 7], String);
        let key = |g: &Group| -> Key {
            (
                g.platform.clone(),
                pass_rank(g.pass),
                dtype_rank(g.dtype),
                g.mask.clone(),
                shape_key(&g.shape),
                g.layout.clone(),
            )
        };
        let plain: BTreeMap<Key, &Group> =
            self.groups.iter().filter(|g| g.variants.is_plain()).map(|g| (key(g), g)).collect();
        let mut out = Vec::new();
        for (i, g) in self.groups.iter().enumerate().filter(|(_, g)| !g.variants.is_plain()) {
            let Some(p) = plain.get(&key(g)) else { continue };
            for r in &g.rows {
                let base =
                    p.rows.iter().filter(|x| x.series == r.series).map(|x| x.rec.time_ms.median).min_by(f64::total_cmp);
                if let Some(plain_ms) = base.filter(|t| *t > 0.0) {
                    out.push(VariantRatio {
                        group: i,
                        series: r.series.clone(),
                        median_ms: r.rec.time_ms.median,
                        plain_ms,
                        time_ratio: r.rec.time_ms.median / plain_ms,
                        speedup: r.speedup,
                    });
                }
            }
        }
        out
    }

    /// Rows whose check against the reference failed.
    pub fn failed_checks(&self) -> usize {
        self.groups.iter().flat_map(|g| &g.rows).filter(|r| r.rec.check.as_ref().is_some_and(|c| !c.pass)).count()
    }
}

fn baseline_time(g: &Group, b: &Baseline) -> Option<f64> {
    g.rows
        .iter()
        .filter(|r| r.rec.backend == b.backend && b.kernel.as_ref().is_none_or(|k| *k == r.rec.kernel))
        .map(|r| r.rec.time_ms.median)
        .filter(|t| *t > 0.0)
        .min_by(f64::total_cmp)
}

fn peak_note(p: &PeakChoice) -> String {
    match p {
        PeakChoice::Auto => "efficiency = roofline time / measured time, against each device's entry in the \
                             built-in hardware table (datasheet dense peaks), where the device name matches one"
            .to_string(),
        PeakChoice::Tabled(hw) => format!(
            "efficiency = roofline time / measured time, against {} ({}; bf16 {} TFLOPS, f32 {} TFLOPS, {} GB/s)",
            hw.name, hw.source, hw.bf16_tflops, hw.fp32_tflops, hw.mem_bandwidth_gbs
        ),
        PeakChoice::Measured(m) => {
            format!("efficiency = roofline time / measured time, against measured ceilings: {}", describe_measured(m))
        }
    }
}

fn describe_measured(m: &MeasuredPeak) -> String {
    let mut parts = Vec::new();
    for (dt, v) in [("f32", m.f32_tflops), ("f16", m.f16_tflops), ("bf16", m.bf16_tflops)] {
        if let Some(v) = v {
            parts.push(format!("{dt} {v:.0} TFLOP/s"));
        }
    }
    if let Some(g) = m.gbps {
        parts.push(format!("{g:.0} GB/s"));
    }
    parts.join(", ")
}

fn hardware_for(rec: &BenchRecord, peak: &PeakChoice) -> Option<&'static HardwareSpec> {
    match peak {
        PeakChoice::Tabled(hw) => Some(hw),
        PeakChoice::Auto => HardwareSpec::find(&rec.device),
        PeakChoice::Measured(_) => None,
    }
}

fn derive_row(rec: &BenchRecord, file: usize, peak: &PeakChoice) -> Result<Row, ReportError> {
    let t = rec.time_ms.median;
    if !(t.is_finite() && t > 0.0) {
        return Err(ReportError::Record(format!(
            "{}:{} {} has a median time of {t} ms",
            rec.backend,
            rec.kernel,
            shape_label(&rec.shape)
        )));
    }
    let cost = cost_of(rec);
    let (tflops, gbps, intensity) = match cost {
        Some(c) => (c.tflops(t), c.gbps(t), c.arithmetic_intensity()),
        // An unknown mask name: trust the record's own figures.
        None => (rec.tflops, rec.gbps, if rec.gbps > 0.0 { rec.tflops * 1e3 / rec.gbps } else { 0.0 }),
    };
    let f32_math: F32Math = rec.f32_math.as_deref().and_then(|m| m.parse().ok()).unwrap_or_default();
    let (efficiency, bound) = match (peak, cost) {
        (PeakChoice::Measured(m), Some(c)) => {
            let compute = m.tflops(rec.dtype).map(|p| c.flops / (p * 1e12));
            let memory = m.gbps.map(|bw| c.bytes / (bw * 1e9));
            match (compute, memory) {
                (None, None) => (None, None),
                (cs, ms) => {
                    let (cs, ms) = (cs.unwrap_or(0.0), ms.unwrap_or(0.0));
                    let b = if cs >= ms { Bound::Compute } else { Bound::Memory };
                    (Some(cs.max(ms) / (t * 1e-3)), Some(b))
                }
            }
        }
        (_, Some(c)) => match hardware_for(rec, peak) {
            Some(hw) => {
                let r = c.roofline(hw, rec.dtype, f32_math);
                (Some(r.efficiency(t)), Some(r.bound))
            }
            None => (None, None),
        },
        (_, None) => (None, None),
    };
    Ok(Row {
        rec: rec.clone(),
        file,
        series: series_of(rec),
        tflops,
        gbps,
        intensity,
        efficiency,
        bound,
        speedup: None,
    })
}

fn seq_plots(groups: &[Group], order: &[String]) -> Vec<SeqPlot> {
    // Family: everything but the sequence length and batch (fa2bench keeps B·S fixed).
    // Family: everything but the sequence length and batch; the variants' label (window, softcap...) is
    // part of it, so a line never joins calls with different variants.
    type Family = (String, u8, String, String, [usize; 4], String, Option<usize>);
    let mut fams: BTreeMap<Family, Vec<&Row>> = BTreeMap::new();
    let mut titles: BTreeMap<Family, String> = BTreeMap::new();
    for g in groups.iter().filter(|g| g.ragged.is_none()) {
        let s = g.shape;
        let sq_mode = if s.sq == s.sk { None } else { Some(s.sq) };
        let key = (
            platform_and_pass(&g.platform, g.pass),
            dtype_rank(g.dtype),
            g.mask.clone(),
            g.variants_label.clone(),
            [s.hq, s.hkv, s.d, s.dv],
            g.layout.clone(),
            sq_mode,
        );
        let sq = sq_mode.map_or("Sq=Sk".to_string(), |q| format!("Sq={q}"));
        let dv = if s.dv != s.d { format!(" Dv={}", s.dv) } else { String::new() };
        titles.entry(key.clone()).or_insert_with(|| {
            format!(
                "{} · {} · {} · Hq={} Hkv={} D={}{dv} · {sq} · {}",
                platform_and_pass(&g.platform, g.pass),
                g.dtype,
                mask_and_variants(&g.mask, &g.variants_label),
                s.hq,
                s.hkv,
                s.d,
                g.layout
            )
        });
        fams.entry(key).or_default().extend(g.rows.iter());
    }
    let mut plots = Vec::new();
    for (key, rows) in fams {
        // Two batch sizes at the same length for the same series would make one line zig-zag: split by B.
        let mut seen = std::collections::HashSet::new();
        let clash = rows.iter().any(|r| !seen.insert((r.series.clone(), r.rec.shape.sk)))
            && rows.iter().map(|r| r.rec.shape.b).collect::<std::collections::HashSet<_>>().len() > 1;
        let mut parts: BTreeMap<Option<usize>, Vec<&Row>> = BTreeMap::new();
        for r in rows {
            parts.entry(clash.then_some(r.rec.shape.b)).or_default().push(r);
        }
        for (b, rows) in parts {
            let xs: std::collections::BTreeSet<usize> = rows.iter().map(|r| r.rec.shape.sk).collect();
            if xs.len() < 2 {
                continue;
            }
            let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
            for name in order {
                let mut pts: Vec<(f64, f64)> =
                    rows.iter().filter(|r| &r.series == name).map(|r| (r.rec.shape.sk as f64, r.tflops)).collect();
                if pts.is_empty() {
                    continue;
                }
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                series.push((name.clone(), pts));
            }
            let mut title = titles.get(&key).cloned().unwrap_or_default();
            if let Some(b) = b {
                title.push_str(&format!(" · B={b}"));
            }
            plots.push(SeqPlot { title, variants: key.3.clone(), x: XAxis::SeqLen, series });
        }
    }
    plots
}

/// TFLOPS against head dim: groups that differ only in D = Dv and the head counts (a head-dim sweep keeps the
/// hidden size, so H changes with D), at least three head dims, one line per series. Dv != D shapes and
/// families where a series has two rows at one head dim (two head counts) are left out.
fn head_dim_plots(groups: &[Group], order: &[String]) -> Vec<SeqPlot> {
    type Family = (String, u8, String, String, [usize; 3], String);
    let mut fams: BTreeMap<Family, Vec<&Row>> = BTreeMap::new();
    // A ragged group's Sq/Sk are bounds, not lengths: it has no place on a length or head-dim axis.
    for g in groups.iter().filter(|g| g.shape.d == g.shape.dv && g.ragged.is_none()) {
        let s = g.shape;
        let key = (
            platform_and_pass(&g.platform, g.pass),
            dtype_rank(g.dtype),
            g.mask.clone(),
            g.variants_label.clone(),
            [s.b, s.sq, s.sk],
            g.layout.clone(),
        );
        fams.entry(key).or_default().extend(g.rows.iter());
    }
    let mut plots = Vec::new();
    for ((platform, _, mask, variants, [b, sq, sk], layout), rows) in fams {
        let ds: std::collections::BTreeSet<usize> = rows.iter().map(|r| r.rec.shape.d).collect();
        let mut seen = std::collections::HashSet::new();
        if ds.len() < 3 || rows.iter().any(|r| !seen.insert((r.series.clone(), r.rec.shape.d))) {
            continue;
        }
        let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
        for name in order {
            let mut pts: Vec<(f64, f64)> =
                rows.iter().filter(|r| &r.series == name).map(|r| (r.rec.shape.d as f64, r.tflops)).collect();
            if !pts.is_empty() {
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                series.push((name.clone(), pts));
            }
        }
        let dtype = rows.first().map(|r| r.rec.dtype.to_string()).unwrap_or_default();
        let mask = mask_and_variants(&mask, &variants);
        let title = format!("{platform} · {dtype} · {mask} · B={b} Sq={sq} Sk={sk} · {layout}");
        plots.push(SeqPlot { title, variants, x: XAxis::HeadDim, series });
    }
    plots
}

fn rooflines(groups: &[Group], peak: &PeakChoice, measured: &BTreeMap<String, MeasuredPeak>) -> Vec<RooflinePlot> {
    let mut by_platform: BTreeMap<String, Vec<&Group>> = BTreeMap::new();
    for g in groups {
        by_platform.entry(g.platform.clone()).or_default().push(g);
    }
    let mut out = Vec::new();
    for (platform, gs) in by_platform {
        let mut dtypes: Vec<DType> = gs.iter().map(|g| g.dtype).collect();
        dtypes.sort_by_key(|d| dtype_rank(*d));
        dtypes.dedup();
        let peak = match (peak, measured.get(&platform)) {
            (PeakChoice::Auto, Some(m)) => &PeakChoice::Measured(*m),
            (p, _) => p,
        };
        let (ceilings, gbps): (Vec<(String, f64)>, Option<f64>) = match peak {
            PeakChoice::Measured(m) => {
                (dtypes.iter().filter_map(|d| m.tflops(*d).map(|p| (format!("{d} peak"), p))).collect(), m.gbps)
            }
            _ => {
                let hw = match peak {
                    PeakChoice::Tabled(hw) => Some(*hw),
                    _ => gs.iter().flat_map(|g| &g.rows).find_map(|r| HardwareSpec::find(&r.rec.device)),
                };
                match hw {
                    Some(hw) => (
                        dtypes
                            .iter()
                            .map(|d| (format!("{d} peak ({})", hw.key), hw.peak_tflops(*d, F32Math::Exact)))
                            .collect(),
                        Some(hw.mem_bandwidth_gbs),
                    ),
                    None => (Vec::new(), None),
                }
            }
        };
        let points = gs
            .iter()
            .flat_map(|g| g.rows.iter().map(move |r| (g, r)))
            .filter(|(_, r)| r.intensity > 0.0 && r.tflops > 0.0)
            .map(|(g, r)| {
                (r.series.clone(), r.intensity, r.tflops, format!("{} {}: {:.3} TFLOPS", r.series, g.title(), r.tflops))
            })
            .collect();
        out.push(RooflinePlot { title: format!("roofline · {platform}"), ceilings, gbps, points });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sdpa_core::{AttentionSpec, Shape, TimeStats};

    fn rec(backend: &str, device: &str) -> BenchRecord {
        let spec = AttentionSpec::new(Shape::new(1, 8, 512, 512, 64), DType::BF16);
        let t = TimeStats { median: 1.0, min: 1.0, max: 1.0, reps: 1 };
        BenchRecord::new(backend, "fa2", device, &spec, t, None)
    }

    /// Regression: on the H100 our CUDA records named the device "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)"
    /// and PyTorch's "NVIDIA H100 80GB HBM3", so the report put them on two platforms and never compared them.
    #[test]
    fn our_gpu_records_share_a_platform_with_pytorchs() {
        let ours = platform_of(&rec("cuda", "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)"));
        let torch = platform_of(&rec("pytorch", "NVIDIA H100 80GB HBM3"));
        assert_eq!(ours, torch);
        assert_eq!(platform_of(&rec("cpu", "AMD EPYC (avx512-bf16, 2 threads)")), "cpu");
        assert_eq!(platform_of(&rec("pytorch", "cpu")), "cpu");
    }

    /// A head-dim sweep (H = 2048 / D, one length) gives one TFLOPS-against-head-dim plot per platform, dtype
    /// and mask, with a point per head dim in order; the Dv != D shape stays out of it.
    #[test]
    fn a_head_dim_sweep_is_plotted_against_the_head_dim() {
        let mut file = BenchFile::new();
        for (d, dv, ms) in [(128, 128, 2.0), (32, 32, 1.0), (64, 64, 1.5), (192, 128, 3.0)] {
            let h = 2048 / d;
            let spec = AttentionSpec::new(Shape { dv, ..Shape::new(4, h, 4096, 4096, d) }, DType::BF16);
            let t = TimeStats { median: ms, min: ms, max: ms, reps: 3 };
            file.records.push(BenchRecord::new("cuda", "auto", "NVIDIA H100 80GB HBM3", &spec, t, None));
        }
        let r = ResultsReport::build(&[("h.json".into(), file)], &ReportOptions::default()).expect("report");
        let plots: Vec<&SeqPlot> = r.seq_plots.iter().filter(|p| p.x == XAxis::HeadDim).collect();
        assert_eq!(plots.len(), 1, "{:?}", r.seq_plots);
        let (_, pts) = &plots[0].series[0];
        assert_eq!(pts.iter().map(|p| p.0).collect::<Vec<_>>(), vec![32.0, 64.0, 128.0]);
        assert!(pts.iter().all(|p| p.1 > 0.0));
        assert!(plots[0].title.contains("Sq=4096"), "{}", plots[0].title);
        // No sequence-length plot: every shape has one length.
        assert!(r.seq_plots.iter().all(|p| p.x == XAxis::HeadDim));
        let svg = crate::results::plots::seq_plot(plots[0], &|_| 0);
        assert!(svg.contains("head dim (D)") && svg.contains("at D=128"), "{svg}");
    }

    /// FP8 records name their descales in the group's title, and records at other factors form their own group
    /// (the factors set the inputs' range and so the error each row reports); older FP8 records without them
    /// still group, untitled.
    #[test]
    fn fp8_groups_name_their_descales() {
        let mut file = BenchFile::new();
        let fp8 = AttentionSpec::new(Shape::new(1, 8, 512, 512, 64), DType::F8E4M3);
        let t = TimeStats { median: 1.0, min: 1.0, max: 1.0, reps: 1 };
        let at = |d: Descale| BenchRecord::new("cuda", "fa3", "H100", &fp8.clone().with_descale(d), t, None);
        let old = BenchRecord { descale: None, ..at(Descale::uniform(1.0)) };
        file.records.extend([at(Descale { q: 0.5, k: 0.25, v: 0.125 }), at(Descale::uniform(0.5)), old]);
        let r = ResultsReport::build(&[("f.json".into(), file)], &ReportOptions::default()).expect("report");
        let mut titles: Vec<String> = r.groups.iter().map(|g| g.title()).collect();
        titles.sort();
        assert_eq!(titles.len(), 3, "{titles:?}");
        assert!(titles.iter().any(|t| t.contains("f8e4m3 descale 0.5,0.25,0.125 · none")), "{titles:?}");
        assert!(titles.iter().any(|t| t.contains("f8e4m3 descale 0.5 · none")), "{titles:?}");
        assert!(titles.iter().any(|t| t.contains("· f8e4m3 · none")), "{titles:?}");
        // Other dtypes' titles are unchanged.
        assert!(!Group { descale: None, ..r.groups[0].clone() }.title().contains("descale"));
    }

    /// A ring call over two GPUs and the one-GPU call of the same shape land in one group as two rows (issue
    /// 26's records: before, both were `cuda:auto` and one hid the other).
    #[test]
    fn calls_over_several_gpus_are_their_own_series() {
        let mut file = BenchFile::new();
        let one = rec("cuda", "NVIDIA H100 80GB HBM3");
        let ring = BenchRecord { gpus: Some(2), ..one.clone() };
        file.records.extend([one, ring]);
        let r = ResultsReport::build(&[("r.json".into(), file)], &ReportOptions::default()).expect("report");
        assert_eq!(r.groups.len(), 1);
        let names: Vec<&str> = r.groups[0].rows.iter().map(|x| x.series.as_str()).collect();
        assert_eq!(names.len(), 2);
        assert!(names.contains(&"cuda:fa2") && names.contains(&"cuda:fa2 x2 GPUs"), "{names:?}");
    }
}
