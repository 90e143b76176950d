//! Quick timing of one shape on every kernel: `cargo run --release -p sdpa-cpu --example perf -- B,Hq,Hkv,Sq,Sk,D [mask] [dtype] [threads]`.
//! The full benchmark (with PyTorch side by side and JSON records) is `benches/attention.rs` and
//! `bench/cpu/`; this is for quick looks while tuning.

#[path = "support/fma.rs"]
mod fma;

use sdpa_core::{AttentionCost, AttentionSpec, DType, HostBackend, HostInputs, Kernel, Mask, RunOptions, Shape};
use sdpa_cpu::{CpuBackend, SimdPath};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let shape: Shape = args.first().map_or("1,8,8,1024,1024,64", String::as_str).parse()?;
    let mask: Mask = args.get(1).map_or("none", String::as_str).parse()?;
    let dtype: DType = args.get(2).map_or("f32", String::as_str).parse()?;
    let threads: usize = args.get(3).map_or(Ok(2), |s| s.parse())?;
    let path: SimdPath = args.get(4).map_or(Ok(SimdPath::detect()), |s| s.parse())?;
    let spec = AttentionSpec::new(shape, dtype).with_mask(mask);
    let inputs = HostInputs::random(&spec, 1)?;
    let cpu = CpuBackend::with_simd(path, Some(threads))?;
    let cost = AttentionCost::of_spec(&spec);
    let kernels: Vec<Kernel> = match std::env::var("KERNELS") {
        Ok(k) => k.split(',').filter_map(|x| x.parse().ok()).collect(),
        Err(_) => vec![Kernel::Fa2, Kernel::SplitKv, Kernel::Unfused],
    };
    for kernel in kernels {
        let peak0 = fma::peak_gflops();
        let opts = RunOptions { kernel, ..Default::default() };
        let cpu0 = fma::cpu_seconds();
        let reps = std::env::var("REPS").ok().and_then(|r| r.parse().ok()).unwrap_or(5);
        let (mut t, k) = cpu.time_host(&spec, &opts, &inputs, 1, reps)?;
        let cpu_s = (fma::cpu_seconds() - cpu0) / 6.0;
        t.sort_by(f64::total_cmp);
        let med = t[t.len() / 2];
        println!(
            "{:8} {k:8} {shape} {} {dtype}: {med:8.3} ms  {:7.1} GFLOP/s  {:6.1} GB/s | per CPU-second: {:7.1} GFLOP/s",
            path.name(),
            mask.name(),
            cost.flops / med / 1e6,
            cost.bytes / med / 1e6,
            cost.flops / cpu_s / 1e9,
        );
        let peak = (peak0 + fma::peak_gflops()) / 2.0;
        let best = t[0];
        println!(
            "    min {best:.3} ms = {:.1} GFLOP/s; single-thread FMA peak (min of trials, same run) {peak:.1} GFLOP/s: kernel at {:.0} % of {threads} x that",
            cost.flops / best / 1e6,
            100.0 * cost.flops / best / 1e6 / peak / threads as f64
        );
    }
    Ok(())
}
