//! Criterion benchmark: `sdpa_candle::sdpa` against candle's matmul + softmax_last_dim + matmul and against
//! `candle_nn::attention::flash_attn`, on the CPU issue's shapes (B=1; H=8 S=1024/2048 D=64; H=16 S=4096
//! D=128), causal and not, f32 and bf16.
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo bench -p sdpa-candle --bench cpu -- 'h8_s1024'
//! ```
//!
//! The figures recorded in bench/results/candle/candle-cpu.json come from the interleaved recorder
//! (`--bench record`), which repeats the contenders in turn so machine noise hits all of them alike.

mod common;

use common::{Bench, Contender, SHAPES};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sdpa_core::{AttentionCost, DType};
use std::hint::black_box;
use std::time::Duration;

fn threads() -> usize {
    std::env::var("RAYON_NUM_THREADS").ok().and_then(|s| s.parse().ok()).unwrap_or(2)
}

fn attention(c: &mut Criterion) {
    for (h, s, d) in SHAPES {
        for dtype in [DType::F32, DType::BF16] {
            for causal in [false, true] {
                let Ok(bench) = Bench::new(h, s, d, dtype, causal, threads(), &candle_core::Device::Cpu) else {
                    eprintln!("skipping h{h} s{s} d{d}: inputs could not be built");
                    continue;
                };
                let name = format!("h{h}_s{s}_d{d}_{dtype}_{}", if causal { "causal" } else { "none" });
                let mut g = c.benchmark_group(name);
                g.sample_size(10).warm_up_time(Duration::from_millis(200)).measurement_time(Duration::from_secs(2));
                let flops = AttentionCost::of_spec(&bench.spec).flops;
                g.throughput(Throughput::Elements(flops as u64));
                // candle's flash_attn takes ~10 s per call in bf16 at S = 1024 and grows with S²: only where
                // it finishes in reasonable time (the same limit as the recorder's default).
                let flash_limit = if dtype == DType::BF16 { 1024 } else { 2048 };
                for who in Contender::ALL.into_iter().filter(|&w| w != Contender::CandleFlash || s <= flash_limit) {
                    g.bench_function(BenchmarkId::from_parameter(who.name()), |b| {
                        b.iter(|| black_box(bench.run(who).map(|t| t.dims().len()).unwrap_or(0)))
                    });
                }
                g.finish();
            }
        }
    }
}

criterion_group!(benches, attention);
criterion_main!(benches);
