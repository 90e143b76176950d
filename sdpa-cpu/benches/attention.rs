//! Criterion benchmarks of the CPU kernels on the shapes (B = 1): prefill (H=8, S=1024/2048,
//! D=64; H=16, S=4096, D=128), causal and not, f32 and bf16, and decoding (Hq=Hkv=32, Sq=1, Sk=4096,
//! D=128). Throughput is reported in FLOPs (elements = FLOPs of the cost model).
//!
//! `cargo bench -p sdpa-cpu --bench attention` (filter with a name, e.g. `-- fa2/f32`); threads from
//! `SDPA_BENCH_THREADS` (default 2). The side-by-side comparison with PyTorch is `bench/cpu/`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use sdpa_core::{
    AttentionCost, AttentionSpec, Backend, DType, ForwardArgs, HostBuffer, HostInputs, Kernel, Mask, Operand,
    RunOptions, Shape,
};
use sdpa_cpu::CpuBackend;
use std::time::Duration;

fn threads() -> usize {
    std::env::var("SDPA_BENCH_THREADS").ok().and_then(|s| s.parse().ok()).unwrap_or(2)
}

fn bench_case(c: &mut Criterion, group: &str, shape: Shape, mask: Mask, dtype: DType, kernels: &[Kernel]) {
    let Ok(cpu) = CpuBackend::new(Some(threads())) else { return };
    let spec = AttentionSpec::new(shape, dtype).with_mask(mask);
    let Ok(inputs) = HostInputs::random(&spec, 1) else { return };
    let Ok(o_len) = spec.required_len(Operand::O) else { return };
    let mut o = HostBuffer::zeros(dtype, o_len);
    let cost = AttentionCost::of_spec(&spec);
    let mut g = c.benchmark_group(format!("{group}/{dtype}"));
    g.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    g.throughput(Throughput::Elements(cost.flops as u64));
    for &kernel in kernels {
        let opts = RunOptions { kernel, ..Default::default() };
        let id = BenchmarkId::new(kernel.name(), format!("{shape}/{}", mask.name()));
        g.bench_function(id, |b| {
            b.iter(|| {
                let args = ForwardArgs {
                    q: &inputs.q,
                    k: &inputs.k,
                    v: &inputs.v,
                    mask: None,
                    o: &mut o,
                    lse: None,
                    block_table: None,
                };
                cpu.forward(&spec, &opts, args).map(|_| ())
            })
        });
    }
    g.finish();
}

fn prefill(c: &mut Criterion) {
    let shapes =
        [Shape::new(1, 8, 1024, 1024, 64), Shape::new(1, 8, 2048, 2048, 64), Shape::new(1, 16, 4096, 4096, 128)];
    for dtype in [DType::F32, DType::BF16] {
        for shape in shapes {
            for mask in [Mask::None, Mask::CausalTopLeft] {
                let kernels: &[Kernel] =
                    if shape.sq <= 1024 { &[Kernel::Fa2, Kernel::Unfused] } else { &[Kernel::Fa2] };
                bench_case(c, "prefill", shape, mask, dtype, kernels);
            }
        }
    }
}

fn decode(c: &mut Criterion) {
    let shape = Shape::new(1, 32, 1, 4096, 128);
    for dtype in [DType::F32, DType::BF16] {
        bench_case(c, "decode", shape, Mask::None, dtype, &[Kernel::Fa2, Kernel::SplitKv, Kernel::Unfused]);
    }
}

criterion_group!(benches, prefill, decode);
criterion_main!(benches);
