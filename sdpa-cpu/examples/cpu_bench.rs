//! Times the CPU kernels on one shape and prints result records (sdpa-core's `BenchRecord`, a JSON array)
//! on stdout: the runner `bench/cpu/pytorch_cpu_sdpa.py` calls between its PyTorch timings so both sides
//! are measured in the same run.
//!
//! `cargo run --release -p sdpa-cpu --example cpu_bench -- --shape 1,8,8,1024,1024,64 --mask causal
//!  --dtype f32 --kernels fa2,unfused --threads 2 --reps 10 [--check 64] [--peak-mem] [--fma-peak] [--read-bw]`
//!
//! `--fma-peak` and `--read-bw` only measure a ceiling and print it as JSON: the f32 FMA rate at the vector
//! width of the SIMD path the backend runs (`SDPA_CPU_SIMD` or the fastest: 512-bit for AVX-512, 256-bit for
//! AVX2), on one thread and on `--threads` threads at once, and the read bandwidth of `--threads` threads streaming 1 GiB with 512-bit loads (best of 3 plain and
//! 3 software-prefetching passes).

#[path = "support/fma.rs"]
mod fma;
#[path = "support/readbw.rs"]
mod readbw;

use sdpa_core::check::check_output;
use sdpa_core::record::{BenchRecord, TimeStats};
use sdpa_core::{AttentionSpec, DType, F32Math, HostBackend, HostInputs, Kernel, Layout, Mask, RunOptions, Shape};
use sdpa_cpu::CpuBackend;
use std::error::Error;

struct Args {
    shape: Shape,
    mask: Mask,
    dtype: DType,
    layout: Layout,
    kernels: Vec<Kernel>,
    threads: usize,
    warmup: usize,
    reps: usize,
    check: Option<usize>,
    peak_mem: bool,
    fma_peak: bool,
    read_bw: bool,
}

fn parse() -> Result<Args, Box<dyn Error>> {
    let mut a = Args {
        shape: "1,8,8,1024,1024,64".parse()?,
        mask: Mask::None,
        dtype: DType::F32,
        layout: Layout::Bhsd,
        kernels: vec![Kernel::Fa2],
        threads: 2,
        warmup: 2,
        reps: 10,
        check: None,
        peak_mem: false,
        fma_peak: false,
        read_bw: false,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut it = argv.iter();
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--shape" => a.shape = val()?.parse()?,
            "--mask" => a.mask = val()?.parse()?,
            "--dtype" => a.dtype = val()?.parse()?,
            "--layout" => a.layout = val()?.parse()?,
            "--kernels" => a.kernels = val()?.split(',').map(str::parse).collect::<Result<_, _>>()?,
            "--threads" => a.threads = val()?.parse()?,
            "--warmup" => a.warmup = val()?.parse()?,
            "--reps" => a.reps = val()?.parse()?,
            "--check" => a.check = Some(val()?.parse()?),
            "--peak-mem" => a.peak_mem = true,
            "--fma-peak" => a.fma_peak = true,
            "--read-bw" => a.read_bw = true,
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    Ok(a)
}

fn main() -> Result<(), Box<dyn Error>> {
    let a = parse()?;
    if a.read_bw {
        let buf = readbw::buffer(1 << 30);
        let pass = |prefetch| (0..3).map(|_| readbw::read_gbps(&buf, a.threads, prefetch)).fold(0.0, f64::max);
        let (plain, prefetch) = (pass(false), pass(true));
        println!("{{\"read_gbps\": {:.2}, \"plain\": {plain:.2}, \"prefetch\": {prefetch:.2}}}", plain.max(prefetch));
        return Ok(());
    }
    if a.fma_peak {
        let path = sdpa_cpu::SimdPath::chosen()?;
        let Some(width) = fma::Width::of_path(path.name()) else {
            // The scalar path has no vector width to probe: no ceiling, not an error.
            println!("{{\"fma_peak_gflops_1t\": null, \"simd\": \"{path}\"}}");
            return Ok(());
        };
        let all = fma::peak_gflops_threads(width, a.threads, 100);
        println!(
            "{{\"fma_peak_gflops_1t\": {:.2}, \"fma_peak_gflops_threads\": {all:.2}, \"threads\": {}, \"simd\": \"{path}\", \"fma_bits\": {}}}",
            fma_peak_gflops(width),
            a.threads,
            if width == fma::Width::W512 { 512 } else { 256 },
        );
        return Ok(());
    }
    let spec = AttentionSpec::new(a.shape, a.dtype).with_layout(a.layout).with_mask(a.mask);
    let inputs = HostInputs::random(&spec, 1)?;
    let cpu = CpuBackend::new(Some(a.threads))?;
    let device = cpu.device_name();
    let base_rss = peak_rss_bytes();
    let mut records = Vec::new();
    for &kernel in &a.kernels {
        let opts = RunOptions { kernel, ..Default::default() };
        let (times, ran) = cpu.time_host(&spec, &opts, &inputs, a.warmup, a.reps)?;
        let stats = TimeStats::from_samples(&times).ok_or("no timing samples")?;
        let check = match a.check {
            Some(rows) => {
                let run = cpu.run_host(&spec, &opts, &inputs)?;
                Some(check_output(&spec, &inputs, &run.output, F32Math::Exact, Some(rows))?)
            }
            None => None,
        };
        let mut r = BenchRecord::new("cpu", ran.name(), &device, &spec, stats, check);
        r.threads = Some(a.threads);
        r.f32_math = Some(F32Math::Exact.name().to_string());
        if a.peak_mem {
            // Peak resident memory of the whole process (inputs, output, the timed call's scratch).
            r.peak_mem_bytes = peak_rss_bytes();
        }
        r.machine = Some(sdpa_core::hardware::cpu_model());
        records.push(r);
    }
    let _ = base_rss;
    println!("{}", serde_json::to_string(&records)?);
    Ok(())
}

/// Peak resident set size of this process (`VmHWM`, Linux), in bytes.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Single-thread f32 FMA rate per CPU-second right now: 12 independent FMA chains of `width` (512-bit for
/// the AVX-512 paths, 256-bit for AVX2), 1.2e9 FMAs. The machine's real ceiling, measured in the same run
/// as the kernels.
fn fma_peak_gflops(width: fma::Width) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        let (rounds, flops) = (100_000_000u64, if width == fma::Width::W512 { 384.0 } else { 192.0 });
        if width == fma::Width::W512 && is_x86_feature_detected!("avx512f") {
            let c0 = thread_cpu_seconds();
            // SAFETY: AVX-512F is present (checked above).
            let x = unsafe { fma::fma_loop(rounds) };
            let t = thread_cpu_seconds() - c0;
            std::hint::black_box(x);
            return rounds as f64 * flops / t / 1e9;
        }
        if width == fma::Width::W256 && is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            let c0 = thread_cpu_seconds();
            // SAFETY: AVX2 and FMA are present (checked above).
            let x = unsafe { fma::fma_loop_256(rounds) };
            let t = thread_cpu_seconds() - c0;
            std::hint::black_box(x);
            return rounds as f64 * flops / t / 1e9;
        }
    }
    let _ = width;
    f64::NAN
}

/// CPU time of the calling thread (Linux `/proc/thread-self/schedstat`).
fn thread_cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse::<f64>().ok()))
        .map_or(0.0, |ns| ns * 1e-9)
}
