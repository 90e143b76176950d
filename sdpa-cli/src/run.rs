//! `sdpa run`: one attention call on one backend, timed, optionally checked against the f64 reference; with
//! `--pass bwd` or `fwd+bwd` its backward (the forward's O and LSE, a seeded dO, the three gradients checked).

use crate::backends::{open_backend, BACKENDS};
use crate::measure::{check_counts, measure, Measure, Repetitions};
use crate::serving::{default_layout, label, resolve, BatchArgs};
use crate::variants::{check_alignment, VariantArgs};
use anyhow::{bail, Context, Result};
use sdpa_core::backward::GradCheckReport;
use sdpa_core::{
    AttentionSpec, BackwardOptions, BenchRecord, DType, Descale, F32Math, HostBackend, HostInputs, Kernel, Layout,
    Mask, Pass, RunOptions, Shape,
};

/// Flags of `sdpa run` (shared by every backend).
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Backend: reference, cpu or cuda.
    #[arg(long, default_value = "reference")]
    backend: String,
    /// Kernel: unfused, fa1, fa2, splitkv, auto or fa3 (CUDA on sm_90 only; `auto` picks it there where measured faster).
    #[arg(long, default_value = "auto")]
    kernel: Kernel,
    /// Element type: f32, f16, bf16 or f8e4m3 (FP8 inputs with per-tensor descales and a bf16 output; cuda
    /// fa3 on sm_90 and the reference only).
    #[arg(long, default_value = "bf16")]
    dtype: DType,
    /// FP8 descale factors, `x` or `q,k,v` (value = stored × factor; f8e4m3 only). Default sqrt(3)/448 for all
    /// three: the random inputs spread over the E4M3 range.
    #[arg(long)]
    descale: Option<Descale>,
    /// B,Hq,Hkv,Sq,Sk,D[,Dv].
    #[arg(long, default_value = "1,8,8,512,512,64")]
    shape: Shape,
    /// none, causal (top-left, PyTorch is_causal) or causal-br (bottom-right, FlashAttention/KV cache).
    #[arg(long, default_value = "none")]
    mask: Mask,
    /// Memory layout of Q, K, V and O: bhsd or bshd (default bhsd; bshd, the packed `[total, H, D]`, for a
    /// ragged batch).
    #[arg(long)]
    layout: Option<Layout>,
    /// Per-sequence lengths and pages (a ragged batch; --shape's Sq/Sk then bound them, 0 = the longest).
    #[command(flatten)]
    batch: BatchArgs,
    /// Window, softcap, ALiBi and the diagonal they measure from.
    #[command(flatten)]
    variants: VariantArgs,
    /// Softmax scale (default 1/sqrt(D)).
    #[arg(long)]
    scale: Option<f64>,
    /// f32 multiplication on the GPU: exact, tf32 or split-tf32.
    #[arg(long, default_value = "exact")]
    f32_math: F32Math,
    /// What to time: fwd (the forward), bwd (the backward alone, after an untimed forward that writes O and
    /// the LSE) or fwd+bwd (both, a training step's attention).
    #[arg(long, default_value = "fwd")]
    pass: Pass,
    /// Backward: ask for a result independent of thread and atomic ordering (bitwise reproducible); the
    /// output says whether the run was.
    #[arg(long)]
    deterministic: bool,
    /// CPU worker threads (default: RAYON_NUM_THREADS or all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// GPUs to run one call across (ring attention over NCCL, the sequence cut in zigzag chunks; cuda
    /// only, f16/bf16, Sq = Sk, BHSD). 1 runs on GPU 0 alone.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    gpus: u32,
    /// Compare the output (the backward: dQ, dK and dV) with the f64 reference.
    #[arg(long)]
    check: bool,
    /// Rows to compare when checking (all rows when the shape is small enough).
    #[arg(long)]
    check_rows: Option<usize>,
    /// Untimed warm-up calls.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Timed calls (fewer when one call takes over a second).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: RunArgs) -> Result<()> {
    if !BACKENDS.contains(&args.backend.as_str()) {
        bail!("unknown backend `{}` (expected one of: {})", args.backend, BACKENDS.join(", "));
    }
    check_counts(Some(args.warmup), Some(args.reps), args.threads)?;
    let resolved = resolve(&args.batch.request(), &args.shape)?;
    let layout = default_layout(args.layout, resolved.is_some());
    let mut spec = match resolved {
        Some((shape, r)) => AttentionSpec::new(shape, args.dtype).with_ragged(r, layout),
        None => AttentionSpec::new(args.shape, args.dtype).with_layout(layout),
    }
    .with_mask(args.mask);
    if let Some(s) = args.scale {
        spec = spec.with_scale(s);
    }
    match (args.dtype, args.descale) {
        (DType::F8E4M3, d) => spec = spec.with_descale(d.unwrap_or_else(Descale::for_random_inputs)),
        (_, Some(_)) => bail!("--descale applies to --dtype f8e4m3 only"),
        (_, None) => {}
    }
    if let Some(v) = args.variants.variants()? {
        check_alignment(&args.mask, &v, "--window/--alibi")?;
        spec = spec.with_variants(v);
    }
    spec.validate().with_context(|| format!("shape {}{}", args.shape, label(&spec)))?;
    let backend = open_backend(&args.backend, args.threads, args.gpus as usize)?;
    let opts = RunOptions { kernel: args.kernel, f32_math: args.f32_math, threads: args.threads, lse: args.check };
    if args.deterministic && !args.pass.has_backward() {
        bail!("--deterministic is an option of the backward: add --pass bwd or --pass fwd+bwd");
    }
    // Refuse what the backend cannot run before the inputs exist (a huge head dim would be allocated first).
    if args.pass.has_backward() {
        backend.capabilities().check_backward(backend.name(), &spec, &opts)?;
    } else {
        backend.capabilities().check(backend.name(), &spec, &opts)?;
    }
    backend.check_host_memory(&spec, &opts)?;
    let inputs = HostInputs::random(&spec, args.seed)?;
    let how = Measure {
        check: args.check,
        check_rows: args.check_rows,
        reps: Repetitions::Fixed { warmup: args.warmup, reps: args.reps },
        since_process_start: true,
    };
    let (rec, grads) = if args.pass.has_backward() {
        let bwd = BackwardOptions { deterministic: args.deterministic, dq_accum: false };
        let m = crate::backward::measure_backward(&*backend, &spec, &opts, &bwd, args.pass, &inputs, &how, args.seed)?;
        (m.record, m.grads)
    } else {
        (measure(&*backend, &spec, &opts, &inputs, &how)?, None)
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rec)?);
    } else {
        print_human(&rec, grads.as_ref(), &*backend);
        for line in backend.timing_notes() {
            println!("  {line}");
        }
    }
    if let Some(why) = grads.as_ref().and_then(GradCheckReport::failure) {
        bail!("check failed: {why}");
    }
    if let Some(why) = rec.check.as_ref().and_then(|c| c.failure()) {
        bail!("check failed: {why}");
    }
    Ok(())
}

fn print_human(r: &BenchRecord, grads: Option<&GradCheckReport>, backend: &dyn HostBackend) {
    let s = &r.shape;
    let variants =
        if r.variants.is_plain() { String::new() } else { format!(" {}", r.variants.label(r.variants.diagonal)) };
    let layout = r.layout.as_deref().map(|l| format!(" {l}")).unwrap_or_default();
    let batch = r.ragged.as_ref().map(|b| format!(" [{}]", crate::serving::describe(b))).unwrap_or_default();
    let pass = match (r.pass, r.deterministic) {
        (Pass::Fwd, _) => String::new(),
        (p, Some(true)) => format!(" pass={p} (deterministic)"),
        (p, Some(false)) => format!(" pass={p} (not deterministic)"),
        (p, None) => format!(" pass={p}"),
    };
    println!(
        "{} {} on {}: {} {}{layout}{batch} mask={}{variants}{pass}",
        backend.name(),
        r.kernel,
        r.device,
        r.dtype,
        s.labelled(),
        r.mask
    );
    println!(
        "  time {:.4} ms median (min {:.4}, max {:.4}, {} reps)  {:.3} TFLOP/s  {:.1} GB/s",
        r.time_ms.median, r.time_ms.min, r.time_ms.max, r.time_ms.reps, r.tflops, r.gbps
    );
    if let Some(f) = &r.first_call {
        let setup = match f.cache {
            sdpa_core::KernelCache::Loaded => String::new(),
            cache => {
                let names: Vec<&str> = f.programs.iter().map(|p| p.program.as_str()).collect();
                format!(
                    ", of which {:.3} s kernel setup ({} cache: {})",
                    f.kernel_setup_s(),
                    cache.name(),
                    names.join(", ")
                )
            }
        };
        let since = f.since_process_start_s.map(|s| format!("; {s:.3} s after process start")).unwrap_or_default();
        println!("  first call {:.3} s{setup}{since}", f.seconds);
    }
    if let Some(bytes) = r.peak_mem_bytes {
        println!(
            "  peak memory of the first forward and backward: {:.1} MiB above the resident set before them",
            bytes as f64 / 1048576.0
        );
    }
    if let Some(g) = grads {
        println!("  {}", crate::backward::describe_grads(g));
    } else if let Some(c) = &r.check {
        println!(
            "  check {}: rel err {:.3e} (tolerance {:.1e}), max abs err {:.3e}, {} rows",
            if c.pass { "pass" } else { "FAIL" },
            c.rel_err,
            c.tolerance,
            c.max_abs_err,
            c.rows_checked
        );
    }
}
