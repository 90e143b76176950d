//! `sdpa run`: one attention call on one backend, timed, optionally checked against the f64 reference.

use crate::backends::{open_backend, BACKENDS};
use crate::measure::{check_counts, measure, Measure, Repetitions};
use crate::serving::{default_layout, label, resolve, BatchArgs};
use crate::variants::{check_alignment, VariantArgs};
use anyhow::{bail, Context, Result};
use sdpa_core::{
    AttentionSpec, BenchRecord, DType, F32Math, HostBackend, HostInputs, Kernel, Layout, Mask, RunOptions, Shape,
};

/// Flags of `sdpa run` (shared by every backend).
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Backend: reference, cpu or cuda.
    #[arg(long, default_value = "reference")]
    backend: String,
    /// Kernel: unfused, fa1, fa2, splitkv or auto.
    #[arg(long, default_value = "auto")]
    kernel: Kernel,
    /// Element type: f32, f16 or bf16.
    #[arg(long, default_value = "bf16")]
    dtype: DType,
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
    /// CPU worker threads (default: RAYON_NUM_THREADS or all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Compare the output with the f64 reference.
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
    if let Some(v) = args.variants.variants()? {
        check_alignment(&args.mask, &v, "--window/--alibi")?;
        spec = spec.with_variants(v);
    }
    spec.validate().with_context(|| format!("shape {}{}", args.shape, label(&spec)))?;
    let backend = open_backend(&args.backend, args.threads)?;
    let opts = RunOptions { kernel: args.kernel, f32_math: args.f32_math, threads: args.threads, lse: args.check };
    // Refuse what the backend cannot run before the inputs exist (a huge head dim would be allocated first).
    backend.capabilities().check(backend.name(), &spec, &opts)?;
    backend.check_host_memory(&spec, &opts)?;
    let inputs = HostInputs::random(&spec, args.seed)?;
    let how = Measure {
        check: args.check,
        check_rows: args.check_rows,
        reps: Repetitions::Fixed { warmup: args.warmup, reps: args.reps },
        since_process_start: true,
    };
    let rec = measure(&*backend, &spec, &opts, &inputs, &how)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rec)?);
    } else {
        print_human(&rec, &*backend);
    }
    if let Some(why) = rec.check.as_ref().and_then(|c| c.failure()) {
        bail!("check failed: {why}");
    }
    Ok(())
}

fn print_human(r: &BenchRecord, backend: &dyn HostBackend) {
    let s = &r.shape;
    let variants =
        if r.variants.is_plain() { String::new() } else { format!(" {}", r.variants.label(r.variants.diagonal)) };
    let layout = r.layout.as_deref().map(|l| format!(" {l}")).unwrap_or_default();
    let batch = r.ragged.as_ref().map(|b| format!(" [{}]", crate::serving::describe(b))).unwrap_or_default();
    println!(
        "{} {} on {}: {} {}{layout}{batch} mask={}{variants}",
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
    if let Some(c) = &r.check {
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
