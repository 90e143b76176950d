//! `sdpa warmup`: compile ahead of time, for the GPU present, the kernel programs that a preset, a spec
//! file or a list of shapes needs (or every program, `--all`), on parallel threads, into the disk cache; a
//! later process (a server's first request, a benchmark) then loads them in milliseconds.

use crate::bench::SweepArgs;
use anyhow::{bail, Result};
use sdpa_core::{ImageOrigin, ProgramLoad};
use sdpa_cuda::CudaBackend;
use serde::Serialize;

/// Flags of `sdpa warmup`.
#[derive(Debug, clap::Args)]
pub struct WarmupArgs {
    /// Which configurations (the `cuda` ones are warmed up), as `sdpa bench` takes them.
    #[command(flatten)]
    sweep: SweepArgs,
    /// Every program of every kernel family instead of a sweep's: thousands since the variants and the serving
    /// layouts (17 s on the H100 host's 16 cores was measured before them, for about a sixth as many).
    #[arg(long, conflicts_with_all = ["preset", "spec", "sweeps", "backend", "kernel", "dtype", "shape", "mask", "layout", "f32_math", "window", "softcap", "alibi", "alibi_slopes", "diagonal", "seqlens_q", "seqlens_k", "page_size"])]
    all: bool,
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    device: String,
    /// Configurations planned (0 with `--all`).
    configurations: usize,
    /// Programs those configurations need, loaded now or already in the cache.
    programs: usize,
    compiled: usize,
    from_disk_cache: usize,
    compile_threads: usize,
    seconds: f64,
    cache_dir: Option<String>,
    loads: Vec<ProgramLoad>,
    /// Configurations this GPU cannot run, with the reason.
    skipped: Vec<String>,
}

pub fn run(args: WarmupArgs) -> Result<()> {
    // The point of a warm-up is the images left on disk for later processes.
    if sdpa_cuda::cache::dir().is_none() {
        bail!(
            "the kernel cache is off (SDPA_CUDA_CACHE=off, or no HOME): a warm-up would be lost when this process \
             exits"
        );
    }
    let gpu = CudaBackend::new(args.device)?;
    let t = std::time::Instant::now();
    let mut skipped = Vec::new();
    let (configurations, loads) = if args.all {
        (0, gpu.warm_up_all()?)
    } else {
        let plan = args.sweep.plan()?;
        let calls = plan.calls("cuda", None);
        if calls.is_empty() {
            bail!("{} has no cuda configurations (add --backend cuda)", plan.source);
        }
        let warmed = gpu.warm_up(&calls)?;
        for (i, why) in &warmed.skipped {
            let (spec, opts) = &calls[*i];
            let v = crate::variants::label(&spec.mask, &spec.variants);
            let v = if v.is_empty() { v } else { format!(" [{v}]") };
            skipped.push(format!(
                "{} {} {}{v} {}{}: {why}",
                opts.kernel,
                spec.dtype,
                spec.mask.name(),
                spec.shape.labelled(),
                crate::serving::label(spec)
            ));
        }
        if skipped.len() == calls.len() {
            bail!("none of the {} cuda configurations can run on this GPU:\n{}", calls.len(), skipped.join("\n"));
        }
        (calls.len(), warmed.loads)
    };
    let compiled = loads.iter().filter(|l| l.origin == ImageOrigin::Compiled).count();
    let report = Report {
        device: sdpa_core::Backend::device_name(&gpu),
        configurations,
        programs: loads.len(),
        compiled,
        from_disk_cache: loads.len() - compiled,
        compile_threads: sdpa_cuda::images::compile_threads()?,
        seconds: t.elapsed().as_secs_f64(),
        cache_dir: sdpa_cuda::cache::dir().map(|d| d.display().to_string()),
        loads,
        skipped,
    };
    let usage = sdpa_cuda::cache::usage();
    if usage.bytes > usage.bound.bytes / 10 * 9 {
        eprintln!(
            "sdpa warmup: the kernel cache holds {} of its {} bound: older images are being evicted (raise \
             SDPA_CUDA_CACHE_MAX)",
            sdpa_core::memory::human_bytes(usage.bytes),
            sdpa_core::memory::human_bytes(usage.bound.bytes)
        );
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    for s in &report.skipped {
        eprintln!("sdpa warmup: left out (cannot run on this GPU): {s}");
    }
    for l in &report.loads {
        let how = match l.origin {
            ImageOrigin::Compiled => "compiled",
            ImageOrigin::DiskCache => "disk cache",
        };
        println!("{:<32} {how:<10} {:>7.2} s  load {:>6.3} s", l.program, l.image_s, l.load_s);
    }
    println!(
        "{}: {} programs ready in {:.1} s ({} compiled on up to {} threads, {} from the disk cache{})",
        report.device,
        report.programs,
        report.seconds,
        report.compiled,
        report.compile_threads,
        report.from_disk_cache,
        report.cache_dir.as_ref().map(|d| format!(" {d}")).unwrap_or_default()
    );
    Ok(())
}
