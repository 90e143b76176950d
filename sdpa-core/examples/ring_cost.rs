//! The ring cost model's predictions (`sdpa_core::RingCost`) for a grid of sequence lengths and GPU counts:
//! per layer, the predicted speedup over one GPU, the scaling efficiency and the smallest fraction of a
//! transfer hidden under compute. The kernel rate and the link are arguments, so a run's measured figures go
//! in (`bench/results/gpu/ring.md` uses the single-GPU TFLOPS and NCCL rate measured on two H100s).
//!
//! `cargo run -p sdpa-core --example ring_cost -- [TFLOPS] [LINK_GBS] [LATENCY_US] [fwd|bwd]`
//! (defaults: 400 TFLOPS, `RingLink::NVLINK4`, fwd). B = 1, H = 32, D = 128, bf16.

use sdpa_core::{AttentionSpec, DType, Mask, RingCost, RingLink, Shape};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: f64| args.get(i).and_then(|a| a.parse::<f64>().ok()).unwrap_or(default);
    let tflops = num(0, 400.0);
    let d = RingLink::NVLINK4;
    let link = RingLink { gbs: num(1, d.gbs), latency_us: num(2, d.latency_us), hbm_gbs: d.hbm_gbs };
    let backward = args.get(3).is_some_and(|a| a == "bwd");
    println!(
        "kernel {tflops} TFLOPS, link {} GB/s + {} us per exchange, {}",
        link.gbs,
        link.latency_us,
        if backward { "backward" } else { "forward" }
    );
    println!("| S | mask | GPUs | step compute ms | step transfer ms | min hidden | speedup | efficiency |");
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for s in [8192, 16384, 32768, 65536, 131072, 262144, 1048576] {
        for mask in [Mask::CausalTopLeft, Mask::None] {
            for n in [2, 4, 8, 16] {
                let spec = AttentionSpec::new(Shape::new(1, 32, s, s, 128), DType::BF16).with_mask(mask);
                let Ok(c) = RingCost::predict(&spec, n, tflops, link, backward) else { continue };
                let hidden = c.hidden().into_iter().fold(1.0, f64::min);
                println!(
                    "| {s} | {} | {n} | {:.3} | {:.3} | {:.0} % | {:.2}x | {:.0} % |",
                    mask.name(),
                    c.compute_ms.get(1).copied().unwrap_or(0.0),
                    c.transfer_ms.first().copied().unwrap_or(0.0),
                    100.0 * hidden,
                    c.speedup(),
                    100.0 * c.efficiency()
                );
            }
        }
    }
}
