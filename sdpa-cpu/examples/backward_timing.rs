//! The CPU backward's speed beside its forward, on a few shapes: a table of milliseconds and GFLOP/s
//! (the cost model's FLOPs: forward `2·pairs·(D + Dv)`, backward `2·pairs·(3D + 2Dv)`, causal pairs only),
//! the backward's GFLOP/s as a fraction of the forward's, the backward against the machine's FMA peak
//! measured in the same run, and the same rates per CPU-second of the process (what a shared machine's
//! other jobs disturb least).
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release -p sdpa-cpu --example backward_timing -- \
//!     [--threads N] [--reps N] [--dtypes f32,bf16] [--masks none,causal] [B,Hq,Hkv,Sq,Sk,D[,Dv] ...]
//! ```
//!
//! Defaults: shapes `1,8,8,1024,1024,64` and `1,16,16,2048,2048,128`, dtypes f32 and bf16, masks none and
//! causal, 2 threads, 5 repetitions (median shown). `SDPA_CPU_SIMD` forces a SIMD path as for every call.

#[path = "support/fma.rs"]
mod fma;

use sdpa_core::backward::{BackwardOptions, GradInputs, Pass};
use sdpa_core::{AttentionCost, AttentionSpec, DType, HostBackend, HostInputs, Mask, RunOptions, Shape};
use sdpa_cpu::CpuBackend;

struct Args {
    threads: usize,
    reps: usize,
    dtypes: Vec<DType>,
    masks: Vec<Mask>,
    shapes: Vec<Shape>,
}

fn list<T: std::str::FromStr<Err = String>>(s: &str) -> Result<Vec<T>, String> {
    s.split(',').map(str::parse).collect()
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        threads: 2,
        reps: 5,
        dtypes: vec![DType::F32, DType::BF16],
        masks: vec![Mask::None, Mask::CausalTopLeft],
        shapes: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{x} needs a value"));
        match x.as_str() {
            "--threads" => a.threads = value()?.parse().map_err(|e| format!("--threads: {e}"))?,
            "--reps" => a.reps = value()?.parse().map_err(|e| format!("--reps: {e}"))?,
            "--dtypes" => a.dtypes = list(&value()?)?,
            "--masks" => a.masks = list(&value()?)?,
            shape => a.shapes.push(shape.parse()?),
        }
    }
    if a.shapes.is_empty() {
        a.shapes = vec!["1,8,8,1024,1024,64".parse()?, "1,16,16,2048,2048,128".parse()?];
    }
    Ok(a)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = parse()?;
    let cpu = CpuBackend::new(Some(a.threads))?;
    let peak = fma::peak_gflops() * a.threads as f64;
    println!("# {} ; FMA peak {peak:.0} GFLOP/s ({} threads, measured now)", cpu.device_name(), a.threads);
    println!(
        "| shape | mask | dtype | fwd ms | fwd GFLOP/s | bwd ms | bwd GFLOP/s | bwd/fwd GFLOP/s | bwd/fwd time | bwd % peak \
         | fwd GFLOP/CPU-s | bwd GFLOP/CPU-s | bwd/fwd per CPU-s |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let opts = RunOptions::default();
    let bwd = BackwardOptions::default();
    for &shape in &a.shapes {
        for &mask in &a.masks {
            for &dtype in &a.dtypes {
                let spec = AttentionSpec::new(shape, dtype).with_mask(mask);
                let inputs = HostInputs::random(&spec, 1)?;
                let grads = GradInputs::from_forward(&spec, &cpu, &opts, &inputs, 2)?;
                // The median wall time, and the CPU seconds per call (the setup call, warm-up and reps):
                // on a shared machine other jobs stretch the first much more than the second.
                let median = |pass: Pass| -> Result<(f64, f64), Box<dyn std::error::Error>> {
                    let cpu0 = fma::cpu_seconds();
                    let (mut t, _) = cpu.time_pass_host(&spec, &opts, &bwd, &inputs, &grads, pass, 1, a.reps)?;
                    let cpu_s = (fma::cpu_seconds() - cpu0) / (a.reps + 2) as f64;
                    t.sort_by(f64::total_cmp);
                    Ok((t[t.len() / 2], cpu_s))
                };
                let ((fwd, fwd_cpu), (bwd_ms, bwd_cpu)) = (median(Pass::Fwd)?, median(Pass::Bwd)?);
                let (ff, bf) = (AttentionCost::of_spec(&spec).flops, AttentionCost::backward_of_spec(&spec).flops);
                let (fg, bg) = (ff / fwd / 1e6, bf / bwd_ms / 1e6);
                let (fc, bc) = (ff / fwd_cpu / 1e9, bf / bwd_cpu / 1e9);
                println!(
                    "| {shape} | {} | {dtype} | {fwd:.2} | {fg:.1} | {bwd_ms:.2} | {bg:.1} | {:.2} | {:.2} | {:.0} % | {fc:.1} | {bc:.1} | {:.2} |",
                    mask.name(),
                    bg / fg,
                    bwd_ms / fwd,
                    100.0 * bg / peak,
                    bc / fc
                );
            }
        }
    }
    Ok(())
}
