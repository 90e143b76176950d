//! `sdpa run`: one attention call on one backend, timed, optionally checked against the f64 reference.

use crate::backends::{open_backend, BACKENDS};
use anyhow::{bail, Context, Result};
use sdpa_core::check::check_output;
use sdpa_core::{
    AttentionSpec, BenchRecord, DType, F32Math, HostBackend, HostInputs, Kernel, Layout, Mask, RunOptions, Shape,
    TimeStats,
};
use std::time::Instant;

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
    /// Memory layout of Q, K, V and O: bhsd or bshd.
    #[arg(long, default_value = "bhsd")]
    layout: Layout,
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
    if args.reps == 0 {
        bail!("--reps must be at least 1");
    }
    let mut spec = AttentionSpec::new(args.shape, args.dtype).with_layout(args.layout).with_mask(args.mask);
    if let Some(s) = args.scale {
        spec = spec.with_scale(s);
    }
    spec.validate().with_context(|| format!("shape {}", args.shape))?;
    let backend = open_backend(&args.backend, args.threads)?;
    let opts = RunOptions { kernel: args.kernel, f32_math: args.f32_math, threads: args.threads, lse: args.check };
    let inputs = HostInputs::random(&spec, args.seed)?;

    let t = Instant::now();
    let first = backend.run_host(&spec, &opts, &inputs)?;
    let first_s = t.elapsed().as_secs_f64();
    let check = if args.check {
        let rows = args.check_rows.or_else(|| default_check_rows(&spec));
        Some(check_output(&spec, &inputs, &first.output, args.f32_math, rows)?)
    } else {
        None
    };
    // Keep the whole command to a few seconds on slow backends (the reference).
    let reps = if first_s > 0.5 { args.reps.min(3) } else { args.reps };
    let warmup = if first_s > 0.5 { 0 } else { args.warmup };
    let (times, kernel) = backend.time_host(&spec, &opts, &inputs, warmup, reps)?;
    let stats = TimeStats::from_samples(&times).context("no valid timing samples")?;

    let mut rec = BenchRecord::new(backend.name(), args.kernel.name(), &backend.device_name(), &spec, stats, check);
    if args.kernel == Kernel::Auto {
        rec.auto_chose = Some(kernel.name().to_string());
    }
    rec.threads = args.threads;
    if spec.dtype == DType::F32 {
        rec.f32_math = Some(args.f32_math.name().to_string());
    }
    rec.commit = git_commit();
    rec.date = Some(utc_now());
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rec)?);
    } else {
        print_human(&rec, &*backend);
    }
    if let Some(c) = &rec.check {
        if !c.pass {
            bail!(
                "check failed: relative error {:.3e} > tolerance {:.1e} ({} NaN mismatches)",
                c.rel_err,
                c.tolerance,
                c.nan_mismatches
            );
        }
    }
    Ok(())
}

/// Every row when the reference costs under ~2 GFLOP, otherwise 512 rows spread over the output.
fn default_check_rows(spec: &AttentionSpec) -> Option<usize> {
    let s = &spec.shape;
    let work = (s.b * s.hq * s.sq) as f64 * s.sk as f64 * (s.d + s.dv) as f64;
    (work > 2e9).then_some(512)
}

fn print_human(r: &BenchRecord, backend: &dyn HostBackend) {
    let s = &r.shape;
    println!(
        "{} {} on {}: {} B={} Hq={} Hkv={} Sq={} Sk={} D={} Dv={} mask={}",
        backend.name(),
        r.kernel,
        r.device,
        r.dtype,
        s.b,
        s.hq,
        s.hkv,
        s.sq,
        s.sk,
        s.d,
        s.dv,
        r.mask
    );
    println!(
        "  time {:.4} ms median (min {:.4}, max {:.4}, {} reps)  {:.3} TFLOP/s  {:.1} GB/s",
        r.time_ms.median, r.time_ms.min, r.time_ms.max, r.time_ms.reps, r.tflops, r.gbps
    );
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

/// The commit of the code that runs: the one this binary was built from (stamped by `build.rs`), or, for a
/// build outside a git checkout, the checkout the command runs in.
pub fn git_commit() -> Option<String> {
    if let Some(c) = option_env!("SDPA_BUILD_COMMIT") {
        return Some(c.to_string());
    }
    let out = std::process::Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Current UTC time as RFC 3339 (civil date from the Unix day count; no time-zone database needed).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's days-to-civil algorithm.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}
