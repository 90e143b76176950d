//! `sdpa bench`: a sweep of shapes x dtypes x masks x variants x layouts x passes x backends x kernels, each
//! configuration warmed up, timed many times (device events on the GPU, through the backend's `time_host`, or
//! `time_pass_host` for a backward pass), checked against the f64 reference (the backward: dQ, dK, dV), and
//! written as one JSON record; PyTorch's SDPA (forward or backward) on the same shapes in the same invocation
//! when torch is importable (`bench/pytorch_sdpa.py`).

pub mod plan;
mod presets;
mod pytorch;

use crate::backends::open_backend;
use crate::measure::{check_counts, measure, provenance, Measure, Repetitions};
use crate::serving::BatchArgs;
use crate::variants::VariantArgs;
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use plan::{Case, Config, InputsKey, Overrides, Plan};
use sdpa_core::record::{BenchFile, Skipped};
use sdpa_core::{BackwardOptions, BenchRecord, DType, F32Math, HostBackend, HostInputs, Layout, Pass, WarmUp};
use std::collections::HashMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// The flags that choose a sweep's configurations, shared by `sdpa bench` and `sdpa warmup`. List flags
/// take comma-separated values; `--shape` takes one shape per flag (or several separated by `;`). Flags
/// given override the same list in the preset or spec file.
#[derive(Debug, Clone, clap::Args)]
pub struct SweepArgs {
    /// Named sweep: quick (default), fa2bench, decode, seed, headdims, variants, serving, backward (files
    /// under bench/presets/).
    #[arg(long, conflicts_with = "spec")]
    preset: Option<String>,
    /// JSON spec file: {backends, kernels, dtypes, shapes:[{b,hq,hkv,sq,sk,d,dv}], masks, layouts}, an array
    /// of them, or a replay spec written by `sdpa analyze`.
    #[arg(long)]
    spec: Option<PathBuf>,
    /// Only the preset's or spec's sweeps whose name contains one of these (e.g. `cuda`, `cpu`).
    #[arg(long, value_delimiter = ',', allow_hyphen_values = true)]
    sweeps: Vec<String>,
    /// Backends: reference, cpu, cuda (and pytorch to require the PyTorch comparison).
    #[arg(long, value_delimiter = ',')]
    backend: Vec<String>,
    /// Kernels: unfused, fa1, fa2, splitkv, auto, fa3 (CUDA on sm_90 only).
    #[arg(long, value_delimiter = ',')]
    kernel: Vec<String>,
    /// Element types: f32, f16, bf16, f8e4m3 (FP8 inputs with the default descales; fa3 on sm_90 and the reference).
    #[arg(long, value_delimiter = ',')]
    dtype: Vec<DType>,
    /// B,Hq,Hkv,Sq,Sk,D[,Dv]; repeat the flag for several shapes.
    #[arg(long)]
    shape: Vec<String>,
    /// Masks: none, causal (top-left), causal-br (bottom-right), bool, additive (explicit, random).
    #[arg(long, value_delimiter = ',')]
    mask: Vec<String>,
    /// Layouts: bhsd, bshd.
    #[arg(long, value_delimiter = ',')]
    layout: Vec<Layout>,
    /// f32 multiplication modes on the GPU: exact, tf32, split-tf32.
    #[arg(long, value_delimiter = ',')]
    f32_math: Vec<F32Math>,
    /// Passes: fwd (the forward), bwd (the backward alone, after an untimed forward), fwd+bwd (both).
    #[arg(long, value_delimiter = ',')]
    pass: Vec<Pass>,
    /// One set of variants (window, softcap, ALiBi) in place of the spec's `variants` list.
    #[command(flatten)]
    variants: VariantArgs,
    /// One ragged batch (per-sequence lengths, pages) in place of the spec's `batches` list.
    #[command(flatten)]
    batch: BatchArgs,
}

impl SweepArgs {
    /// The configurations: the spec file's, else the preset's (`quick` by default), with the flags' lists
    /// in place of the same lists there.
    pub fn plan(&self) -> Result<Plan> {
        let (sweeps, source) = match (&self.spec, &self.preset) {
            (Some(path), _) => (plan::read_spec_file(path)?, path.display().to_string()),
            (None, Some(name)) => (presets::preset(name)?, format!("preset {name}")),
            (None, None) => (presets::preset("quick")?, "preset quick".to_string()),
        };
        let sweeps = if self.sweeps.is_empty() {
            sweeps
        } else {
            let names: Vec<String> = sweeps.iter().filter_map(|s| s.name.clone()).collect();
            let kept: Vec<_> = sweeps
                .into_iter()
                .filter(|s| s.name.as_deref().is_some_and(|n| self.sweeps.iter().any(|w| n.contains(w.as_str()))))
                .collect();
            if kept.is_empty() {
                bail!("--sweeps {} matches none of {source}'s sweeps ({})", self.sweeps.join(","), names.join(", "));
            }
            kept
        };
        let over = Overrides {
            backends: self.backend.iter().map(|b| b.trim().to_ascii_lowercase()).filter(|b| !b.is_empty()).collect(),
            kernels: self.kernel.clone(),
            dtypes: self.dtype.clone(),
            shapes: plan::parse_shapes(&self.shape)?,
            masks: self.mask.clone(),
            layouts: self.layout.clone(),
            f32_math: self.f32_math.clone(),
            variants: self.variants.variants()?.into_iter().collect(),
            batches: Some(self.batch.request()).filter(|r| !r.is_dense()).into_iter().collect(),
            passes: self.pass.clone(),
        };
        plan::build(&sweeps, &over, &source, self.spec.is_some())
    }
}

/// Flags of `sdpa bench`. List flags take comma-separated values; `--shape` takes one shape per flag (or
/// several separated by `;`). Flags given override the same list in the preset or spec file.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Which configurations.
    #[command(flatten)]
    pub sweep: SweepArgs,
    /// CPU worker threads (default: RAYON_NUM_THREADS or all cores); also passed to PyTorch.
    #[arg(long)]
    threads: Option<usize>,
    /// GPUs each cuda configuration runs across (ring attention over NCCL; records carry `gpus`); 1 runs
    /// on GPU 0 alone. Other backends refuse more than 1.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    gpus: u32,
    /// Backward passes: ask for results independent of thread and atomic ordering (records say whether
    /// each run was).
    #[arg(long)]
    deterministic: bool,
    /// Untimed calls before timing (default 3, or the preset's).
    #[arg(long)]
    warmup: Option<usize>,
    /// Most timed calls per configuration (default 20, or the preset's).
    #[arg(long)]
    reps: Option<usize>,
    /// Time budget per configuration in seconds; slow configurations get fewer repetitions (default 2).
    #[arg(long)]
    max_time: Option<f64>,
    /// Rows compared with the reference (default: all rows of small shapes, a spread sample of big ones).
    #[arg(long)]
    check_rows: Option<usize>,
    /// Do not compare with the reference.
    #[arg(long)]
    no_check: bool,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Output file (default: target/bench/bench-<date>.json).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also time PyTorch on the same shapes; an error if torch cannot be imported.
    #[arg(long, conflicts_with = "no_pytorch")]
    with_pytorch: bool,
    /// Never run PyTorch (by default it runs when `python3 -c "import torch"` works).
    #[arg(long)]
    no_pytorch: bool,
    /// Python interpreter for the PyTorch script.
    #[arg(long, default_value = "python3")]
    python: String,
    /// The PyTorch script (default: bench/pytorch_sdpa.py of this repository).
    #[arg(long)]
    pytorch_script: Option<PathBuf>,
    /// PyTorch kernels: default, math, flash, efficient, cudnn, unfused (default: all).
    #[arg(long)]
    pytorch_kernels: Option<String>,
    /// Print the configurations and exit without running them.
    #[arg(long)]
    dry_run: bool,
    /// No per-configuration lines.
    #[arg(long)]
    quiet: bool,
}

/// Everything the timing loop needs, validated.
struct Settings {
    warmup: usize,
    reps: usize,
    max_time_s: f64,
    check: bool,
    check_rows: Option<usize>,
    threads: Option<usize>,
    gpus: usize,
    seed: u64,
    bwd: BackwardOptions,
}

pub fn run(args: BenchArgs) -> Result<()> {
    check_counts(args.warmup, args.reps, args.threads)?;
    if let Some(t) = args.max_time {
        if !(t.is_finite() && t > 0.0) {
            bail!("--max-time must be a positive number of seconds");
        }
    }
    let plan = args.sweep.plan()?;
    // PyTorch on the same shapes, in the same invocation; --no-pytorch wins over a spec that names it.
    let mode = if args.no_pytorch {
        pytorch::Mode::Off
    } else if args.with_pytorch || plan.pytorch_requested {
        pytorch::Mode::Required
    } else {
        pytorch::Mode::Auto
    };
    if !args.dry_run && !args.quiet {
        eprintln!("sdpa bench: {}: {} configurations", plan.source, plan.configs.len());
    }
    if args.dry_run {
        // Written through one locked handle with errors returned, so `| head` ends quietly (a closed pipe
        // is not an error) instead of panicking in println!.
        use std::io::Write;
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        writeln!(out, "# {}: {} configurations", plan.source, plan.configs.len())?;
        for c in &plan.configs {
            writeln!(out, "{}", describe(c))?;
        }
        if mode != pytorch::Mode::Off {
            for (dev, case, _) in &plan.pytorch_cases {
                writeln!(out, "pytorch ({dev}) {}", describe_case(case))?;
            }
        }
        out.flush()?;
        return Ok(());
    }
    let settings = Settings {
        warmup: args.warmup.unwrap_or(3),
        reps: args.reps.unwrap_or(20),
        max_time_s: args.max_time.unwrap_or(2.0),
        check: !args.no_check,
        check_rows: args.check_rows,
        threads: args.threads,
        gpus: args.gpus as usize,
        seed: args.seed,
        bwd: BackwardOptions { deterministic: args.deterministic, dq_accum: false },
    };
    let out_path = args.out.clone().unwrap_or_else(default_out);
    if let Some(dir) = out_path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }

    let mut file = BenchFile::new();
    file.command = Some(command_line());
    file.machine = Some(provenance::machine());
    file.commit = provenance::commit();
    file.date = Some(provenance::utc_now());
    let explicit_timing = (args.warmup, args.reps, args.max_time);
    let opened = sweep(&plan, &settings, explicit_timing, &mut file, &out_path, args.quiet)?;
    let py = pytorch::Request {
        mode,
        python: &args.python,
        script: args.pytorch_script.as_deref(),
        kernels: args.pytorch_kernels.as_deref(),
        threads: args.threads,
        warmup: args.warmup,
        reps: args.reps,
        max_time_s: args.max_time,
        check: settings.check,
        seed: settings.seed,
        out_path: &out_path,
    };
    let cuda_ok = opened.get("cuda").is_some_and(|ok| *ok);
    let cases: Vec<(String, Case, plan::Timing)> =
        plan.pytorch_cases.iter().filter(|(dev, _, _)| dev != "cuda" || cuda_ok).cloned().collect();
    let py_result = pytorch::run(&py, &cases, &mut file);

    write_file(&out_path, &file)?;
    print_summary(&file, &out_path);
    py_result?;
    let failed_checks = file.records.iter().filter(|r| r.check.as_ref().is_some_and(|c| !c.pass)).count();
    let failed_runs = file.skipped.iter().filter(|s| s.failed).count();
    if failed_checks + failed_runs > 0 {
        bail!(
            "{failed_checks} configuration(s) failed the reference check and {failed_runs} failed to run (records kept in {})",
            out_path.display()
        );
    }
    Ok(())
}

fn default_out() -> PathBuf {
    let stamp: String = provenance::utc_now().chars().filter(|c| c.is_ascii_alphanumeric()).collect();
    PathBuf::from("target").join("bench").join(format!("bench-{stamp}.json"))
}

fn command_line() -> String {
    let mut v: Vec<String> = std::env::args().collect();
    if let Some(first) = v.first_mut() {
        *first = "sdpa".to_string();
    }
    v.join(" ")
}

fn describe_case(c: &Case) -> String {
    let s = c.shape;
    let variants = c.variants_label();
    let variants = if variants.is_empty() { variants } else { format!(" [{variants}]") };
    let batch = c.ragged.as_ref().map(|r| format!(" [{}]", crate::serving::describe(r))).unwrap_or_default();
    let pass = if c.pass == Pass::Fwd { String::new() } else { format!(" {}", c.pass) };
    format!("{} {}{variants} {} {}{batch}{pass}", c.dtype, c.mask.name(), c.layout.name(), s.labelled())
}

fn describe(c: &Config) -> String {
    let fm = if c.case.dtype == DType::F32 && c.f32_math != F32Math::Exact {
        format!(" ({})", c.f32_math.name())
    } else {
        String::new()
    };
    format!("{} {}{fm} {}", c.backend, c.kernel, describe_case(&c.case))
}

fn skipped(c: &Config, reason: String, failed: bool) -> Skipped {
    Skipped {
        backend: c.backend.clone(),
        kernel: c.kernel.name().to_string(),
        dtype: c.case.dtype,
        shape: c.case.shape,
        mask: c.case.mask.name().to_string(),
        layout: Some(c.case.layout.name().to_string()),
        variants: c.case.spec().recorded_variants(),
        // Skipped entries carry no lengths or pass of their own: the reason names the batch and the pass.
        reason: {
            let reason = match &c.case.ragged {
                Some(r) => format!("{reason} [{}]", crate::serving::describe(r)),
                None => reason,
            };
            match c.case.pass {
                Pass::Fwd => reason,
                p => format!("[{p}] {reason}"),
            }
        },
        failed,
    }
}

/// Compiles (or reads from the disk cache) every kernel program the plan's configurations on `backend`
/// need, on parallel threads, before anything is timed; `None` for backends with nothing to compile. A
/// failure is reported and left to the configurations' own first calls.
fn warm_up(
    be: &dyn HostBackend,
    plan: &Plan,
    backend: &str,
    threads: Option<usize>,
    say: &dyn Fn(String),
) -> Option<WarmUp> {
    let calls = plan.calls(backend, threads);
    let t = std::time::Instant::now();
    match be.prepare_kernels(&calls) {
        Ok(programs) if programs.is_empty() => None,
        Ok(programs) => {
            // The first calls' records then say the programs were already loaded.
            be.program_loads();
            let w = WarmUp { backend: backend.to_string(), seconds: t.elapsed().as_secs_f64(), programs };
            say(format!(
                "{backend}: {} kernel programs ready in {:.1} s ({} compiled, {} from the disk cache)",
                w.programs.len(),
                w.seconds,
                w.compiled(),
                w.programs.len() - w.compiled()
            ));
            Some(w)
        }
        Err(e) => {
            say(format!("{backend}: kernel warm-up failed ({e}); each configuration compiles on its first call"));
            None
        }
    }
}

enum Outcome {
    /// The record, and a backward's three gradient checks.
    Done(Box<BenchRecord>, Option<sdpa_core::backward::GradCheckReport>),
    Skip(String),
    Fail(String),
}

/// Runs every configuration; returns which backends could be opened.
///
/// The result file is rewritten after every configuration, so a sweep killed half-way (or stopped by a
/// failure outside the measurement) keeps every record it finished.
fn sweep(
    plan: &Plan,
    st: &Settings,
    explicit: (Option<usize>, Option<usize>, Option<f64>),
    file: &mut BenchFile,
    out_path: &Path,
    quiet: bool,
) -> Result<HashMap<String, bool>> {
    let pb = if std::io::stderr().is_terminal() {
        let pb = ProgressBar::new(plan.configs.len() as u64);
        if let Ok(style) = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:32} {pos}/{len} {wide_msg}")
        {
            pb.set_style(style);
        }
        pb
    } else {
        ProgressBar::hidden()
    };
    let say = |line: String| {
        if quiet {
        } else if pb.is_hidden() {
            println!("{line}");
        } else {
            pb.println(line);
        }
    };
    let mut backends: HashMap<String, std::result::Result<Box<dyn HostBackend>, String>> = HashMap::new();
    let mut inputs: Option<(InputsKey, std::result::Result<HostInputs, String>)> = None;
    for c in &plan.configs {
        pb.set_message(describe(c));
        if !backends.contains_key(&c.backend) {
            let opened = open_backend(&c.backend, st.threads, st.gpus).map_err(|e| format!("{e:#}"));
            if let Ok(be) = &opened {
                if let Some(w) = warm_up(&**be, plan, &c.backend, st.threads, &say) {
                    file.warm_ups.push(w);
                }
            }
            backends.insert(c.backend.clone(), opened);
        }
        let Some(be) = backends.get(&c.backend) else { continue };
        let be = match be {
            Ok(be) => be,
            Err(why) => {
                file.skipped.push(skipped(c, format!("backend {} unavailable: {why}", c.backend), false));
                pb.inc(1);
                continue;
            }
        };
        // What the backend cannot run is skipped before its inputs are built (they may be huge).
        let opts = c.opts(st.threads);
        let fits = if c.case.pass.has_backward() {
            be.capabilities().check_backward(be.name(), &c.case.spec(), &opts)
        } else {
            be.capabilities().check(be.name(), &c.case.spec(), &opts)
        };
        if let Err(e) = fits.and_then(|()| be.check_host_memory(&c.case.spec(), &opts)) {
            say(format!("{}: skipped: {e}", describe(c)));
            file.skipped.push(skipped(c, e.to_string(), false));
            pb.inc(1);
            continue;
        }
        if inputs.as_ref().is_none_or(|(key, _)| *key != c.case.inputs_key()) {
            // Free the previous case's inputs before making the next ones (variants share them).
            drop(inputs.take());
            let made = HostInputs::random(&c.case.spec(), st.seed).map_err(|e| format!("{e:#}"));
            inputs = Some((c.case.inputs_key(), made));
        }
        let Some((_, made)) = inputs.as_ref() else { continue };
        let inp = match made {
            Ok(i) => i,
            Err(why) => {
                say(format!("{}: skipped: cannot build inputs: {why}", describe(c)));
                file.skipped.push(skipped(c, format!("cannot build inputs: {why}"), true));
                pb.inc(1);
                continue;
            }
        };
        match run_one(&**be, c, inp, st, explicit) {
            Outcome::Done(rec, grads) => {
                let check = match grads {
                    Some(g) => crate::backward::describe_grads(&g),
                    None => rec.check.as_ref().map_or("not checked".to_string(), |k| match k.failure() {
                        None => format!("check pass (rel err {:.1e}, tol {:.0e})", k.rel_err, k.tolerance),
                        Some(why) => format!("check FAIL: {why}"),
                    }),
                };
                say(format!(
                    "{}: {:.4} ms (min {:.4}, {} reps)  {:.3} TFLOP/s  {:.1} GB/s  {check}",
                    describe(c),
                    rec.time_ms.median,
                    rec.time_ms.min,
                    rec.time_ms.reps,
                    rec.tflops,
                    rec.gbps
                ));
                for line in be.timing_notes() {
                    say(format!("  {line}"));
                }
                file.records.push(*rec);
            }
            Outcome::Skip(why) => {
                say(format!("{}: skipped: {why}", describe(c)));
                file.skipped.push(skipped(c, why, false));
            }
            Outcome::Fail(why) => {
                say(format!("{}: FAILED: {why}", describe(c)));
                file.skipped.push(skipped(c, why, true));
            }
        }
        pb.inc(1);
        write_file(out_path, file)?;
    }
    pb.finish_and_clear();
    Ok(backends.into_iter().map(|(k, v)| (k, v.is_ok())).collect())
}

fn run_one(
    be: &dyn HostBackend,
    c: &Config,
    inp: &HostInputs,
    st: &Settings,
    explicit: (Option<usize>, Option<usize>, Option<f64>),
) -> Outcome {
    let spec = c.case.spec();
    let opts = c.opts(st.threads);
    // Flags beat the spec's per-sweep values, which beat the defaults.
    let reps = Repetitions::Budget {
        warmup: explicit.0.or(c.warmup).unwrap_or(st.warmup),
        max_reps: explicit.1.or(c.reps).unwrap_or(st.reps).max(1),
        budget_s: explicit.2.or(c.max_time_s).unwrap_or(st.max_time_s),
    };
    let how = Measure { check: st.check, check_rows: st.check_rows, reps, since_process_start: false };
    let measured = if c.case.pass.has_backward() {
        crate::backward::measure_backward(be, &spec, &opts, &st.bwd, c.case.pass, inp, &how, st.seed)
            .map(|m| (m.record, m.grads))
    } else {
        measure(be, &spec, &opts, inp, &how).map(|rec| (rec, None))
    };
    match measured {
        Ok((rec, grads)) => Outcome::Done(Box::new(rec), grads),
        Err(e) if e.is_unavailable() => Outcome::Skip(format!("{e:#}")),
        Err(e) => Outcome::Fail(format!("{e:#}")),
    }
}

/// Writes the file through a temporary name and a rename, so a reader (or a kill mid-write) never sees a
/// torn file.
fn write_file(path: &Path, file: &BenchFile) -> Result<()> {
    let text = serde_json::to_string_pretty(file)? + "\n";
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".partial");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot move {} to {}", tmp.display(), path.display()))
}

fn print_summary(file: &BenchFile, out: &Path) {
    let mut reasons: Vec<(String, usize)> = Vec::new();
    for s in &file.skipped {
        let key = if s.failed { format!("FAILED: {}", s.reason) } else { s.reason.clone() };
        match reasons.iter_mut().find(|r| r.0 == key) {
            Some(r) => r.1 += 1,
            None => reasons.push((key, 1)),
        }
    }
    eprintln!(
        "sdpa bench: {} records, {} not run, written to {}",
        file.records.len(),
        file.skipped.len(),
        out.display()
    );
    for (why, n) in reasons {
        eprintln!("  {n} not run: {why}");
    }
}
