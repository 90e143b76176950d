//! The CPU backward's speed beside its forward, on a few shapes: a table of milliseconds and GFLOP/s
//! (the cost model's FLOPs: forward `2·pairs·(D + Dv)`, backward `2·pairs·(3D + 2Dv)`, causal pairs only),
//! the backward's GFLOP/s as a fraction of the forward's, and both against the machine's FMA peak measured
//! in the same run.
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
        "| shape | mask | dtype | fwd ms | fwd GFLOP/s | bwd ms | bwd GFLOP/s | bwd/fwd GFLOP/s | bwd/fwd time | bwd % peak |"
    );
    println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let opts = RunOptions::default();
    let bwd = BackwardOptions::default();
    for &shape in &a.shapes {
        for &mask in &a.masks {
            for &dtype in &a.dtypes {
                let spec = AttentionSpec::new(shape, dtype).with_mask(mask);
                let inputs = HostInputs::random(&spec, 1)?;
                let grads = GradInputs::from_forward(&spec, &cpu, &opts, &inputs, 2)?;
                let median = |pass: Pass| -> Result<f64, Box<dyn std::error::Error>> {
                    let (mut t, _) = cpu.time_pass_host(&spec, &opts, &bwd, &inputs, &grads, pass, 1, a.reps)?;
                    t.sort_by(f64::total_cmp);
                    Ok(t[t.len() / 2])
                };
                let (fwd, bwd_ms) = (median(Pass::Fwd)?, median(Pass::Bwd)?);
                let fg = AttentionCost::of_spec(&spec).flops / fwd / 1e6;
                let bg = AttentionCost::backward_of_spec(&spec).flops / bwd_ms / 1e6;
                println!(
                    "| {shape} | {} | {dtype} | {fwd:.2} | {fg:.1} | {bwd_ms:.2} | {bg:.1} | {:.2} | {:.2} | {:.0} % |",
                    mask.name(),
                    bg / fg,
                    bwd_ms / fwd,
                    100.0 * bg / peak
                );
            }
        }
    }
    Ok(())
}
