//! Interleaved recorder for bench/results/candle/candle-cpu.json: for each configuration, checks every contender
//! against the f64 reference (64 sampled rows), then times them in turn for several rounds (the order
//! rotating each round) so that noise from other work on the machine falls on all of them alike, and
//! writes one sdpa `BenchRecord` per contender and configuration with median, min and max.
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo bench -p sdpa-candle --bench record -- --rounds 5
//! ```
//! Flags: `--rounds N` (default 5), `--out PATH` (default bench/results/candle/candle-cpu.json, or candle-cuda.json
//! with `--device cuda`), `--max-seq S` (skip larger shapes), `--dtype f32|bf16` (default both),
//! `--device cpu|cuda` (cuda needs the `cuda` feature; candle's flash_attn is CPU-only and is left out),
//! `--flash-max-seq S` (default 2048; 1024 for bf16): candle's flash_attn is timed only up to this length,
//! because its bf16 path takes about 10 s per call already at S = 1024 and the 4096 shape would run for
//! hours.

mod common;

use anyhow::{bail, Context, Result};
use candle_core::Device;
use common::{Bench, Contender, SHAPES};
use sdpa_core::check::check_output;
use sdpa_core::{BenchRecord, DType, F32Math, HostBuffer, HostOutput, TimeStats};
use std::path::PathBuf;
use std::time::Instant;

fn host(t: &candle_core::Tensor, dtype: DType) -> Result<HostBuffer> {
    let flat = t.flatten_all()?;
    Ok(match dtype {
        DType::F32 => HostBuffer::F32(flat.to_vec1()?),
        DType::F16 => HostBuffer::F16(flat.to_vec1()?),
        DType::BF16 => HostBuffer::BF16(flat.to_vec1()?),
        DType::F8E4M3 => HostBuffer::from_f32(DType::F8E4M3, &flat.to_dtype(candle_core::DType::F32)?.to_vec1()?),
    })
}

fn sh(cmd: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(cmd).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn main() -> Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = None;
    let mut device_name = "cpu".to_string();
    let mut rounds = 5usize;
    let mut max_seq = usize::MAX;
    let mut flash_max_seq = 2048usize;
    let mut dtypes = vec![DType::F32, DType::BF16];
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--rounds" => rounds = it.next().context("--rounds N")?.parse()?,
            "--out" => out = Some(PathBuf::from(it.next().context("--out PATH")?)),
            "--device" => device_name = it.next().context("--device cpu|cuda")?,
            "--max-seq" => max_seq = it.next().context("--max-seq S")?.parse()?,
            "--flash-max-seq" => flash_max_seq = it.next().context("--flash-max-seq S")?.parse()?,
            "--dtype" => dtypes = vec![it.next().context("--dtype")?.parse().map_err(anyhow::Error::msg)?],
            "--bench" => {}
            other => bail!("unknown flag `{other}`"),
        }
    }
    let threads: usize = std::env::var("RAYON_NUM_THREADS").ok().and_then(|s| s.parse().ok()).unwrap_or(2);
    let (dev, device, contenders, out) = match device_name.as_str() {
        "cpu" => (
            Device::Cpu,
            sdpa_core::hardware::cpu_model(),
            Contender::ALL.to_vec(),
            out.unwrap_or(root.join("bench/results/candle/candle-cpu.json")),
        ),
        "cuda" => {
            let dev = Device::new_cuda(0).context("opening CUDA device 0 (build with --features cuda)")?;
            let name = sh("nvidia-smi", &["--query-gpu=name", "--format=csv,noheader"]).unwrap_or("CUDA GPU 0".into());
            let who = vec![Contender::Sdpa, Contender::CandleUnfused];
            (dev, name, who, out.unwrap_or(root.join("bench/results/candle/candle-cuda.json")))
        }
        other => bail!("unknown device `{other}` (cpu or cuda)"),
    };
    let commit = sh("git", &["rev-parse", "--short=12", "HEAD"]);
    let date = sh("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]);
    let mut records = Vec::new();
    let mut table = Vec::new();
    for (h, s, d) in SHAPES {
        if s > max_seq {
            continue;
        }
        for &dtype in &dtypes {
            for causal in [false, true] {
                let bench = Bench::new(h, s, d, dtype, causal, threads, &dev)?;
                let flash_limit = if dtype == DType::BF16 { flash_max_seq.min(1024) } else { flash_max_seq };
                let contenders: Vec<Contender> =
                    contenders.iter().copied().filter(|&c| c != Contender::CandleFlash || s <= flash_limit).collect();
                let mut checks = Vec::new();
                for &who in &contenders {
                    let o = bench.run(who).with_context(|| format!("{} on h{h} s{s}", who.name()))?;
                    // candle's flash_attn returns f32 whatever the input dtype: rounded here, outside the timing.
                    let o = o.to_device(&Device::Cpu)?.to_dtype(bench.q.dtype())?;
                    let got = HostOutput { o: host(&o, dtype)?, lse: None };
                    checks.push(check_output(&bench.spec, &bench.inputs, &got, F32Math::Exact, Some(64))?);
                }
                let n = contenders.len();
                let mut samples = vec![Vec::new(); n];
                for r in 0..rounds {
                    for i in 0..n {
                        let idx = (i + r) % n;
                        dev.synchronize()?;
                        let t = Instant::now();
                        std::hint::black_box(bench.run(contenders[idx])?);
                        dev.synchronize()?;
                        samples[idx].push(t.elapsed().as_secs_f64() * 1e3);
                    }
                }
                let mut medians = Vec::new();
                for (i, who) in contenders.iter().enumerate() {
                    let stats = TimeStats::from_samples(&samples[i]).context("no timing samples")?;
                    medians.push(stats.median);
                    let (backend, kernel) = match who {
                        Contender::Sdpa => ("sdpa-candle", "auto"),
                        Contender::CandleUnfused => ("candle", "unfused"),
                        Contender::CandleFlash => ("candle", "flash_attn"),
                    };
                    let mut rec = BenchRecord::new(backend, kernel, &device, &bench.spec, stats, Some(checks[i]));
                    if *who == Contender::CandleFlash {
                        rec.layout = Some("bshd".into());
                    }
                    rec.threads = dev.is_cpu().then_some(threads);
                    rec.f32_math = (dtype == DType::F32).then(|| "exact".into());
                    rec.commit = commit.clone();
                    rec.date = date.clone();
                    rec.machine =
                        Some(if dev.is_cpu() { format!("{device}, {threads} threads") } else { device.clone() });
                    records.push(rec);
                }
                let (flash_ms, flash_ratio, flash_err) = match (medians.get(2), checks.get(2)) {
                    (Some(m), Some(c)) => {
                        (format!("{m:.2}"), format!("{:.2}x", m / medians[0]), format!("{:.1e}", c.rel_err))
                    }
                    _ => ("-".into(), "-".into(), "-".into()),
                };
                let line = format!(
                    "| {h} | {s} | {d} | {} | {dtype} | {:.2} | {:.2} | {flash_ms} | {:.2}x | {flash_ratio} | {:.1e} / {:.1e} / {flash_err} |",
                    if causal { "causal" } else { "none" },
                    medians[0],
                    medians[1],
                    medians[1] / medians[0],
                    checks[0].rel_err,
                    checks[1].rel_err,
                );
                println!("{line}");
                table.push(line);
            }
        }
    }
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&records)? + "\n")
        .with_context(|| format!("writing {}", out.display()))?;
    println!("\n| H | S | D | mask | dtype | sdpa-candle ms | candle unfused ms | candle flash_attn ms | unfused / sdpa | flash_attn / sdpa | rel. error sdpa / unfused / flash |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for l in &table {
        println!("{l}");
    }
    println!("\nwrote {} records to {}", records.len(), out.display());
    Ok(())
}
