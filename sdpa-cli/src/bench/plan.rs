//! The sweep: flags, a preset or a spec file turned into a validated list of configurations, ordered so
//! that configurations sharing inputs (same dtype, shape, mask, layout; the variants and the pass do not
//! change the inputs) run one after the other.

use super::presets;
use crate::measure::{MAX_REPS, MAX_WARMUP};
use anyhow::{bail, Context, Result};
use sdpa_core::record::BenchSpec;
use sdpa_core::{
    AttentionSpec, DType, Descale, ExplicitMask, F32Math, Kernel, Layout, Mask, MaskValues, Pass, Ragged,
    RaggedRequest, RunOptions, Shape, Variants,
};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// Most configurations one `sdpa bench` invocation plans (a sweep beyond it is surely a mistake, and
/// splitting it keeps each result file readable).
pub const MAX_CONFIGS: usize = 100_000;

/// Backends the sweep can run itself (PyTorch runs through its script).
pub const RUST_BACKENDS: [&str; 3] = ["reference", "cpu", "cuda"];

/// The pseudo-backend that asks for the PyTorch script.
pub const PYTORCH: &str = "pytorch";

/// List overrides from the command line; an empty list keeps the preset's or spec's.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub backends: Vec<String>,
    pub kernels: Vec<String>,
    pub dtypes: Vec<DType>,
    pub shapes: Vec<Shape>,
    pub masks: Vec<String>,
    pub layouts: Vec<Layout>,
    pub f32_math: Vec<F32Math>,
    pub variants: Vec<Variants>,
    /// Ragged batches (`--seqlens-q/-k`, `--page-size`) in place of the spec's `batches`.
    pub batches: Vec<RaggedRequest>,
    /// Passes (`--pass`) in place of the spec's `passes`.
    pub passes: Vec<Pass>,
}

/// What a case's random inputs depend on.
pub type InputsKey = (DType, Shape, Mask, Layout, Option<Ragged>);

/// The problem one configuration solves, shared by every backend and kernel that run it (and by PyTorch).
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub dtype: DType,
    pub shape: Shape,
    pub mask: Mask,
    pub layout: Layout,
    /// Window, softcap, ALiBi (plain attention when none is set).
    pub variants: Variants,
    /// The ragged batch (lengths, pages) resolved against `shape`, whose Sq/Sk are then its bounds; `None`
    /// for a dense batch.
    pub ragged: Option<Ragged>,
    /// What is timed: the forward, the backward, or both.
    pub pass: Pass,
}

// Validated variants hold no NaN (a softcap is finite and positive, slopes are finite), so equality is total.
impl Eq for Case {}

impl std::hash::Hash for Case {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (self.dtype, self.shape, self.mask, self.layout, &self.ragged, self.pass).hash(h);
        let v = &self.variants;
        (v.window, v.softcap.map(f64::to_bits), v.diagonal).hash(h);
        match &v.alibi {
            None => 0u8.hash(h),
            Some(sdpa_core::Alibi::Standard) => 1u8.hash(h),
            Some(sdpa_core::Alibi::Slopes(s)) => (2u8, s.iter().map(|x| x.to_bits()).collect::<Vec<_>>()).hash(h),
        }
    }
}

impl Case {
    /// The attention spec of the case.
    pub fn spec(&self) -> AttentionSpec {
        let spec = AttentionSpec::new(self.shape, self.dtype);
        let spec = match &self.ragged {
            Some(r) => spec.with_ragged(r.clone(), self.layout),
            None => spec.with_layout(self.layout),
        }
        .with_mask(self.mask)
        .with_variants(self.variants.clone());
        // FP8 cases: the random inputs spread over the E4M3 range (Descale::for_random_inputs).
        if self.dtype == DType::F8E4M3 {
            spec.with_descale(Descale::for_random_inputs())
        } else {
            spec
        }
    }

    /// What the random inputs depend on: cases that differ only in their variants or pass share them.
    pub fn inputs_key(&self) -> InputsKey {
        (self.dtype, self.shape, self.mask, self.layout, self.ragged.clone())
    }

    /// `window 4096,0 tl · softcap 50`, or empty for plain attention.
    pub fn variants_label(&self) -> String {
        crate::variants::label(&self.mask, &self.variants)
    }
}

/// A sweep's own timing values (warm-up, repetitions, budget), when its spec gives them.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Timing {
    pub warmup: Option<usize>,
    pub reps: Option<usize>,
    pub max_time_s: Option<f64>,
}

/// One thing to time.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub case: Case,
    pub backend: String,
    pub kernel: Kernel,
    pub f32_math: F32Math,
    /// Per-sweep timing overrides from the spec.
    pub warmup: Option<usize>,
    pub reps: Option<usize>,
    pub max_time_s: Option<f64>,
}

impl Config {
    /// The options a call of this configuration runs with (`threads`: the sweep's CPU workers).
    pub fn opts(&self, threads: Option<usize>) -> RunOptions {
        RunOptions { kernel: self.kernel, f32_math: self.f32_math, threads, lse: false }
    }
}

/// The whole plan.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Configurations, grouped by case.
    pub configs: Vec<Config>,
    /// Cases the PyTorch script should time, with the devices they ran on ("cpu", "cuda").
    pub pytorch_cases: Vec<(String, Case, Timing)>,
    /// "pytorch" appeared among the backends.
    pub pytorch_requested: bool,
    /// Name of the preset or spec file.
    pub source: String,
}

impl Plan {
    /// The spec and options of every configuration on `backend`, in plan order: what a kernel warm-up
    /// prepares.
    pub fn calls(&self, backend: &str, threads: Option<usize>) -> Vec<(AttentionSpec, RunOptions)> {
        self.configs.iter().filter(|c| c.backend == backend).map(|c| (c.case.spec(), c.opts(threads))).collect()
    }
}

/// Parses a mask name as records use it; explicit masks are full `[B, Hq, Sq, Sk]` with random contents.
pub fn parse_mask(name: &str, shape: &Shape) -> Result<Mask> {
    match name.trim().to_ascii_lowercase().as_str() {
        "bool" | "boolean" => Ok(Mask::Explicit(ExplicitMask::full(MaskValues::Boolean, shape))),
        "additive" => Ok(Mask::Explicit(ExplicitMask::full(MaskValues::Additive, shape))),
        other => other.parse().map_err(|e: String| anyhow::anyhow!(e)),
    }
}

/// Splits `--shape` values: each may hold several shapes separated by `;` or whitespace.
pub fn parse_shapes(values: &[String]) -> Result<Vec<Shape>> {
    let mut out = Vec::new();
    for v in values {
        for part in v.split(|c: char| c == ';' || c.is_whitespace()).filter(|p| !p.is_empty()) {
            out.push(part.parse::<Shape>().map_err(|e| anyhow::anyhow!(e))?);
        }
    }
    Ok(out)
}

/// Reads a spec file: a [`BenchSpec`], an array of them, or what `sdpa analyze` writes for replays (a
/// `{command, spec}` replay, an array of those, or a findings JSON whose findings carry replays).
pub fn read_spec_file(path: &Path) -> Result<Vec<BenchSpec>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read spec file {}", path.display()))?;
    parse_spec_text(&text).with_context(|| format!("spec file {}", path.display()))
}

/// See [`read_spec_file`].
pub fn parse_spec_text(text: &str) -> Result<Vec<BenchSpec>> {
    let value: serde_json::Value = serde_json::from_str(text).context("not JSON")?;
    let mut out = Vec::new();
    collect_specs(value, &mut out)?;
    if out.is_empty() {
        bail!("no benchmark spec found (expected an object with `shapes`, or an array of them)");
    }
    Ok(out)
}

fn collect_specs(value: serde_json::Value, out: &mut Vec<BenchSpec>) -> Result<()> {
    use serde_json::Value;
    match value {
        Value::Array(items) => {
            for (i, v) in items.into_iter().enumerate() {
                collect_specs(v, out).with_context(|| format!("item {i}"))?;
            }
            Ok(())
        }
        Value::Object(mut map) => {
            // A findings report: every finding's replay.
            if let Some(Value::Array(findings)) = map.remove("findings") {
                for f in findings {
                    // Findings without a shape to replay (attention's share of time, say) carry null.
                    if let Some(r) = f.get("replay").filter(|r| !r.is_null()).cloned() {
                        collect_specs(r, out)?;
                    }
                }
                return Ok(());
            }
            // A replay: `{command, spec}`.
            if let Some(spec) = map.remove("spec") {
                return collect_specs(spec, out);
            }
            // A spec; `BenchSpec` itself reads the singular keys of older replay files.
            let spec: BenchSpec = serde_json::from_value(Value::Object(map))?;
            out.push(spec);
            Ok(())
        }
        _ => bail!("expected a JSON object or array"),
    }
}

fn pick<T: Clone>(over: &[T], spec: &[T], default: &[T]) -> Vec<T> {
    if !over.is_empty() {
        over.to_vec()
    } else if !spec.is_empty() {
        spec.to_vec()
    } else {
        default.to_vec()
    }
}

/// Builds the plan from sweeps (a preset's or a spec file's) and command-line overrides.
pub fn build(sweeps: &[BenchSpec], over: &Overrides, source: &str, from_file: bool) -> Result<Plan> {
    let mut plan = Plan { source: source.to_string(), ..Default::default() };
    let quick = presets::quick_defaults();
    // Membership tests by hash, so planning stays linear in the number of configurations.
    let mut pytorch_seen: HashSet<(String, Case)> = HashSet::new();
    let mut planned: usize = 0;
    for (i, sw) in sweeps.iter().enumerate() {
        let name = sw.name.clone().unwrap_or_else(|| format!("sweep {}", i + 1));
        let ctx = || format!("{source}: {name}");
        let backends = pick(&over.backends, &sw.backends, &quick.backends);
        let kernels = pick(&over.kernels, &sw.kernels, &quick.kernels);
        let dtypes = pick(&over.dtypes, &sw.dtypes, &quick.dtypes);
        // A spec file without shapes is a mistake (an empty or truncated file), not a request for the
        // quick preset's: only presets and flags fill shapes in.
        if from_file && over.shapes.is_empty() && sw.shapes.is_empty() {
            bail!("{}: no shapes (give `shapes` in the spec or --shape)", ctx());
        }
        if sw.reps == Some(0) {
            bail!("{}: `reps` must be at least 1", ctx());
        }
        if let Some(t) = sw.max_time_s.filter(|t| !(t.is_finite() && *t > 0.0)) {
            bail!("{}: `max_time_s` must be a positive number of seconds, got {t}", ctx());
        }
        if let Some(n) = sw.reps.filter(|n| *n > MAX_REPS) {
            bail!("{}: `reps` {n} is above the limit of {MAX_REPS}", ctx());
        }
        if let Some(n) = sw.warmup.filter(|n| *n > MAX_WARMUP) {
            bail!("{}: `warmup` {n} is above the limit of {MAX_WARMUP}", ctx());
        }
        let shapes = pick(&over.shapes, &sw.shapes, &quick.shapes);
        let masks = pick(&over.masks, &sw.masks, &["none".to_string()]);
        // No layout named: each case takes its default (BHSD dense, BSHD ragged).
        let layouts: Vec<Option<Layout>> = pick(&over.layouts, &sw.layouts, &[]).into_iter().map(Some).collect();
        let layouts = if layouts.is_empty() { vec![None] } else { layouts };
        let batches = pick(&over.batches, &sw.batches, &[RaggedRequest::default()]);
        let f32_math = pick(&over.f32_math, &sw.f32_math, &[F32Math::Exact]);
        let variants = pick(&over.variants, &sw.variants, &[Variants::default()]);
        let passes = pick(&over.passes, &sw.passes, &[Pass::Fwd]);
        for b in &backends {
            if b != PYTORCH && !RUST_BACKENDS.contains(&b.as_str()) {
                bail!("{}: unknown backend `{b}` (expected reference, cpu, cuda or pytorch)", ctx());
            }
        }
        let kernels: Vec<Kernel> = kernels
            .iter()
            .map(|k| k.parse::<Kernel>().map_err(|e| anyhow::anyhow!("{}: {e}", ctx())))
            .collect::<Result<_>>()?;
        if shapes.is_empty() || dtypes.is_empty() || kernels.is_empty() {
            bail!("{}: the sweep is empty (no shapes, dtypes or kernels)", ctx());
        }
        // The sweep's size before expanding it, so a huge cross product is refused in constant time.
        let f32_count = if dtypes.contains(&DType::F32) { f32_math.len().max(1) } else { 1 };
        let size = [
            dtypes.len(),
            shapes.len(),
            masks.len(),
            variants.len(),
            layouts.len(),
            batches.len(),
            passes.len(),
            backends.len(),
            kernels.len(),
            f32_count,
        ]
        .iter()
        .try_fold(1usize, |a, &x| a.checked_mul(x))
        .and_then(|n| n.checked_add(planned))
        .filter(|n| *n <= MAX_CONFIGS)
        .ok_or_else(|| anyhow::anyhow!("{}: the sweep has more than {MAX_CONFIGS} configurations; split it", ctx()))?;
        planned = size;
        plan.pytorch_requested |= backends.iter().any(|b| b == PYTORCH);
        let timing = Timing { warmup: sw.warmup, reps: sw.reps, max_time_s: sw.max_time_s };
        for &dtype in &dtypes {
            for &given in &shapes {
                for req in &batches {
                    let resolved = crate::serving::resolve(req, &given).with_context(ctx)?;
                    let (shape, ragged) = match resolved {
                        Some((shape, r)) => (shape, Some(r)),
                        None => (given, None),
                    };
                    for m in &masks {
                        let mask = parse_mask(m, &shape).with_context(ctx)?;
                        for v in &variants {
                            let what = format!("{}: variants {}", ctx(), crate::variants::label(&mask, v));
                            crate::variants::check_alignment(&mask, v, &what)?;
                            for &asked in &layouts {
                                let layout = crate::serving::default_layout(asked, ragged.is_some());
                                for &pass in &passes {
                                    let case = Case {
                                        dtype,
                                        shape,
                                        mask,
                                        layout,
                                        variants: v.clone(),
                                        ragged: ragged.clone(),
                                        pass,
                                    };
                                    case.spec().validate().with_context(|| format!("{}: shape {shape}", ctx()))?;
                                    plan_case(
                                        &mut plan,
                                        &mut pytorch_seen,
                                        case,
                                        &backends,
                                        &kernels,
                                        &f32_math,
                                        sw,
                                        timing,
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    // Same inputs next to each other, so one set serves every backend, kernel and variant; within them the
    // same case together. (Stable sort by first appearance.)
    let mut inputs_order: HashMap<InputsKey, usize> = HashMap::new();
    let mut order: HashMap<Case, usize> = HashMap::new();
    for c in &plan.configs {
        let next = inputs_order.len();
        inputs_order.entry(c.case.inputs_key()).or_insert(next);
        let next = order.len();
        order.entry(c.case.clone()).or_insert(next);
    }
    plan.configs.sort_by_cached_key(|c| (inputs_order.get(&c.case.inputs_key()).copied(), order.get(&c.case).copied()));
    // Identical requests (overlapping sweeps) run once.
    let mut seen = HashSet::new();
    plan.configs.retain(|c| seen.insert((c.case.clone(), c.backend.clone(), c.kernel, c.f32_math)));
    Ok(plan)
}

/// Adds one case's configurations (every Rust backend x kernel x f32 mode) and its PyTorch case.
#[allow(clippy::too_many_arguments)]
fn plan_case(
    plan: &mut Plan,
    pytorch_seen: &mut HashSet<(String, Case)>,
    case: Case,
    backends: &[String],
    kernels: &[Kernel],
    f32_math: &[F32Math],
    sw: &BenchSpec,
    timing: Timing,
) {
    // PyTorch's SDPA takes no f8e4m3 inputs, and bench/pytorch_sdpa.py rejects the dtype for its whole spec:
    // one FP8 case would cost every case of its device the comparison.
    let torch_takes = case.dtype != DType::F8E4M3;
    for b in backends.iter().filter(|b| *b != PYTORCH) {
        let device = if b == "cuda" { "cuda" } else { "cpu" };
        if torch_takes && b != "reference" && pytorch_seen.insert((device.to_string(), case.clone())) {
            plan.pytorch_cases.push((device.to_string(), case.clone(), timing));
        }
        for &kernel in kernels {
            let maths: &[F32Math] = if case.dtype == DType::F32 { f32_math } else { &[F32Math::Exact] };
            for &fm in maths {
                plan.configs.push(Config {
                    case: case.clone(),
                    backend: b.clone(),
                    kernel,
                    f32_math: fm,
                    warmup: sw.warmup,
                    reps: sw.reps,
                    max_time_s: sw.max_time_s,
                });
            }
        }
    }
    let only_pytorch = backends.iter().all(|b| b == PYTORCH);
    let any_device = ["cpu", "cuda"].iter().any(|d| pytorch_seen.contains(&(d.to_string(), case.clone())));
    if torch_takes && only_pytorch && !any_device && pytorch_seen.insert(("cpu".to_string(), case.clone())) {
        plan.pytorch_cases.push(("cpu".to_string(), case, timing));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sdpa_core::Window;

    /// Variants multiply the sweep like any list; the configurations of one set of inputs stay together (the
    /// sweep builds inputs once for all of them), and PyTorch gets every case with its variants.
    #[test]
    fn variants_are_swept_next_to_the_inputs_they_share() {
        let win = Variants { window: Some(Window::left(4)), ..Default::default() };
        let cap = Variants { softcap: Some(30.0), ..Default::default() };
        let spec = BenchSpec {
            backends: vec!["reference".into(), "cpu".into()],
            kernels: vec!["unfused".into()],
            dtypes: vec![DType::F32],
            shapes: vec![Shape::new(1, 2, 16, 16, 8), Shape::new(1, 2, 32, 32, 8)],
            masks: vec!["causal".into()],
            variants: vec![Variants::default(), win.clone(), cap.clone()],
            ..Default::default()
        };
        let plan = build(std::slice::from_ref(&spec), &Overrides::default(), "t", true).expect("plan");
        assert_eq!(plan.configs.len(), 2 * 3 * 2);
        // Inputs change only where the shape does: once in the whole plan.
        let changes = plan.configs.windows(2).filter(|w| w[0].case.inputs_key() != w[1].case.inputs_key()).count();
        assert_eq!(changes, 1);
        let cases: Vec<&Variants> = plan.pytorch_cases.iter().map(|(_, c, _)| &c.variants).collect();
        assert_eq!(cases, vec![&Variants::default(), &win, &cap, &Variants::default(), &win, &cap]);
        // The flags' variants replace the spec's list.
        let over = Overrides { variants: vec![cap.clone()], ..Default::default() };
        let plan = build(std::slice::from_ref(&spec), &over, "t", true).expect("plan");
        assert!(plan.configs.iter().all(|c| c.case.variants == cap) && plan.configs.len() == 4);
        // Identical cases from overlapping sweeps run once; the same case with other variants does not merge.
        let plan = build(&[spec.clone(), spec], &Overrides::default(), "t", true).expect("plan");
        assert_eq!(plan.configs.len(), 12);
    }

    /// Regression: f8e4m3 cases were handed to bench/pytorch_sdpa.py, which rejects the dtype for its whole
    /// spec, so one FP8 case failed the PyTorch comparison (and the bench) for every case of its device.
    #[test]
    fn fp8_cases_are_not_sent_to_pytorch() {
        let spec = BenchSpec {
            backends: vec!["cuda".into(), "pytorch".into()],
            kernels: vec!["auto".into()],
            dtypes: vec![DType::BF16, DType::F8E4M3],
            shapes: vec![Shape::new(1, 2, 64, 64, 64)],
            ..Default::default()
        };
        let plan = build(std::slice::from_ref(&spec), &Overrides::default(), "t", true).expect("plan");
        assert_eq!(plan.configs.len(), 2, "our backend times both dtypes");
        let torch: Vec<DType> = plan.pytorch_cases.iter().map(|(_, c, _)| c.dtype).collect();
        assert_eq!(torch, vec![DType::BF16]);
        // Asked of PyTorch alone, an FP8 case is not sent either.
        let only = BenchSpec { backends: vec!["pytorch".into()], dtypes: vec![DType::F8E4M3], ..spec };
        let plan = build(&[only], &Overrides::default(), "t", true).expect("plan");
        assert!(plan.pytorch_cases.is_empty());
    }

    /// Passes multiply the sweep and share the inputs of their case; the flag's list replaces the spec's,
    /// and a spec without passes times the forward.
    #[test]
    fn passes_are_swept_on_shared_inputs() {
        let spec = BenchSpec {
            backends: vec!["reference".into()],
            kernels: vec!["auto".into()],
            dtypes: vec![DType::F32],
            shapes: vec![Shape::new(1, 2, 16, 16, 8)],
            passes: vec![Pass::Bwd, Pass::FwdBwd],
            ..Default::default()
        };
        let plan = build(std::slice::from_ref(&spec), &Overrides::default(), "t", true).expect("plan");
        let passes: Vec<Pass> = plan.configs.iter().map(|c| c.case.pass).collect();
        assert_eq!(passes, vec![Pass::Bwd, Pass::FwdBwd]);
        assert_eq!(plan.configs[0].case.inputs_key(), plan.configs[1].case.inputs_key());
        let over = Overrides { passes: vec![Pass::Fwd], ..Default::default() };
        let plan = build(std::slice::from_ref(&spec), &over, "t", true).expect("plan");
        assert!(plan.configs.iter().all(|c| c.case.pass == Pass::Fwd) && plan.configs.len() == 1);
        let plain = BenchSpec { passes: Vec::new(), ..spec };
        let plan = build(&[plain], &Overrides::default(), "t", true).expect("plan");
        assert!(plan.configs.iter().all(|c| c.case.pass == Pass::Fwd));
    }
}
