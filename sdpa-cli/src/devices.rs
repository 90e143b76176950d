//! `sdpa devices`: what this machine can run.

use crate::backends::{open_backend, BACKENDS};
use anyhow::Result;
use serde::Serialize;

/// Flags of `sdpa devices`.
#[derive(Debug, clap::Args)]
pub struct DevicesArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct BackendStatus {
    name: &'static str,
    available: bool,
    device: Option<String>,
    /// Why the backend is unavailable.
    reason: Option<String>,
}

#[derive(Debug, Serialize)]
struct Devices {
    cpu_model: String,
    cpu_threads: usize,
    cpu_simd: Vec<&'static str>,
    /// The SIMD paths the CPU backend can run here, fastest first.
    cpu_simd_paths: Vec<&'static str>,
    /// The path it runs: the fastest, or what `SDPA_CPU_SIMD` forces (an error text when that is wrong).
    cpu_simd_path: String,
    /// Paths the CPU runs but the backend does not choose unless forced, each with why (`path: reason`).
    cpu_simd_passed_over: Vec<String>,
    /// Whether `SDPA_CPU_SIMD` chose it.
    cpu_simd_forced: bool,
    /// The AMX path: "ready", or why it cannot run here (the CPU, or the OS's tile permission).
    cpu_amx: String,
    backends: Vec<BackendStatus>,
}

pub fn run(args: DevicesArgs) -> Result<()> {
    let backends = BACKENDS
        .iter()
        .map(|&name| match open_backend(name, None, 1) {
            Ok(be) => BackendStatus { name, available: true, device: Some(be.device_name()), reason: None },
            Err(e) => BackendStatus { name, available: false, device: None, reason: Some(format!("{e:#}")) },
        })
        .collect();
    let d = Devices {
        cpu_model: sdpa_core::hardware::cpu_model(),
        cpu_threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_simd: cpu_simd_features(),
        cpu_simd_paths: sdpa_cpu::simd_paths(),
        cpu_simd_path: sdpa_cpu::SimdPath::chosen().map_or_else(|e| format!("error: {e}"), |p| p.name().to_string()),
        cpu_simd_forced: sdpa_cpu::SimdPath::forced(),
        cpu_simd_passed_over: sdpa_cpu::supported_paths()
            .into_iter()
            .filter_map(|p| p.passed_over().map(|why| format!("{}: {why}", p.name())))
            .collect(),
        cpu_amx: amx_line(),
        backends,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&d)?);
        return Ok(());
    }
    println!("cpu: {} ({} threads)", d.cpu_model, d.cpu_threads);
    println!("cpu simd: {}", if d.cpu_simd.is_empty() { "none detected".to_string() } else { d.cpu_simd.join(" ") });
    let how = if d.cpu_simd_forced { format!(" (forced by {})", sdpa_cpu::SIMD_ENV) } else { String::new() };
    println!("cpu backend simd path: {}{how}; paths here: {}", d.cpu_simd_path, d.cpu_simd_paths.join(", "));
    for p in sdpa_cpu::supported_paths() {
        if let Some(why) = p.passed_over() {
            println!("cpu simd path passed over: {p} ({why}; {}={p} forces it)", sdpa_cpu::SIMD_ENV);
        }
    }
    println!("cpu amx: {}", d.cpu_amx);
    for b in &d.backends {
        match (&b.device, &b.reason) {
            (Some(dev), _) => println!("backend {:<9} available: {dev}", b.name),
            (None, Some(why)) => println!("backend {:<9} unavailable: {why}", b.name),
            _ => {}
        }
    }
    Ok(())
}

/// The AMX path's state: ready (bf16 on tiles; f16 stays on AVX-512) or the reason it is not.
fn amx_line() -> String {
    match sdpa_cpu::amx_status() {
        Ok(()) => {
            let fp16 = if sdpa_cpu::has_amx_fp16() { "AMX-FP16 present, unused" } else { "no AMX-FP16" };
            format!("ready (bf16 on AMX tiles; f16 and f32 on AVX-512: {fp16})")
        }
        Err(why) => format!("unavailable: {why}"),
    }
}

/// SIMD features detected at run time (not compile time).
fn cpu_simd_features() -> Vec<&'static str> {
    let mut f = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx2") {
            f.push("avx2");
        }
        if is_x86_feature_detected!("fma") {
            f.push("fma");
        }
        if is_x86_feature_detected!("avx512f") {
            f.push("avx512f");
        }
        if is_x86_feature_detected!("avx512bf16") {
            f.push("avx512bf16");
        }
        if is_x86_feature_detected!("f16c") {
            f.push("f16c");
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            f.push("neon");
        }
    }
    f
}
