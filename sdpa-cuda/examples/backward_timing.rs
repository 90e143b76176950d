//! Times the tensor-core backward on the fa2bench grid (issue 24's speed case): bf16, batch x seqlen = 16k,
//! hidden 2048 (H = 16 at D = 128, H = 32 at D = 64), S = 512 .. 16k, causal and not, BSHD. Device-event
//! times of the backward alone (`Backend::time_pass` with `Pass::Bwd`, L2 flushed before each call), the
//! median of `reps`, TFLOPS on the backward's work (`AttentionCost::of_pass`). The forward runs first on the
//! same buffers so that O and the LSE are real. One JSON line per point on stdout after the table's line
//! (`bench/studies/backward/torch_bwd.py` prints PyTorch's on the same grid; `join.py` puts them side by
//! side):
//!
//!     cargo run --release -p sdpa-cuda --example backward_timing -- [reps] [deterministic] [tiles]
//!
//! `tiles`: other main-kernel tiles to time beside the default, `D:bm,kw,cw,mt,min_blocks[,s]` separated by `;`
//! (each run through `SDPA_BWD_TILE`, its lines named `sdpa:{tile}`). `SDPA_BWD_POINTS=D:S[:causal],...` times
//! only those points (for a profiler).

use sdpa_core::{
    AttentionCost, AttentionSpec, Backend, BackwardOptions, DType, HostBuffer, Kernel, Layout, Mask, Pass, PassBuffers,
    RunOptions, Shape,
};
use sdpa_cuda::CudaBackend;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let reps: usize = args.get(1).map_or(Ok(10), |x| x.parse())?;
    let deterministic = args.get(2).is_some_and(|x| x == "deterministic");
    // (head dim, tile) pairs: the default (None) at both head dims, then the tiles asked for.
    let mut variants: Vec<(Option<usize>, Option<String>)> = vec![(None, None)];
    for t in args.get(3).map(|x| x.split(';').filter(|t| !t.is_empty()).collect::<Vec<_>>()).unwrap_or_default() {
        let (d, tile) = t.split_once(':').ok_or("a tile is D:bm,kw,cw,mt,min_blocks")?;
        variants.push((Some(d.parse()?), Some(tile.to_string())));
    }
    let points: Vec<String> = std::env::var("SDPA_BWD_POINTS")
        .map(|v| v.split(',').map(|p| p.trim().to_string()).filter(|p| !p.is_empty()).collect())
        .unwrap_or_default();
    let gpu = CudaBackend::new(0)?;
    const TOKENS: usize = 16384;
    const HIDDEN: usize = 2048;
    let dtype = DType::BF16;
    // Every point has TOKENS x HIDDEN elements per operand: one set of buffers serves the whole grid.
    let n = TOKENS * HIDDEN;
    let up = |seed: u64| gpu.upload(&HostBuffer::random(dtype, n, seed));
    let lse_len = TOKENS * (HIDDEN / 64);
    let mut bufs = PassBuffers {
        q: up(1)?,
        k: up(2)?,
        v: up(3)?,
        mask: None,
        block_table: None,
        o: up(4)?,
        lse: gpu.upload(&HostBuffer::zeros(DType::F32, lse_len))?,
        d_o: up(5)?,
        dq: up(6)?,
        dk: up(7)?,
        dv: up(8)?,
        dq_accum: None,
    };
    let opts = RunOptions { kernel: Kernel::Auto, lse: true, ..Default::default() };
    let bwd = BackwardOptions { deterministic, dq_accum: false };
    println!("{} bf16 BSHD, B*S = 16k, hidden 2048, backward median of {reps}", gpu.device_name());
    println!("{:>4} {:>3} {:>6} {:>7} {:>9} {:>8}", "D", "H", "S", "causal", "bwd ms", "TFLOPS");
    let mut lines = Vec::new();
    for (only_d, tile) in &variants {
        match tile {
            Some(t) => std::env::set_var("SDPA_BWD_TILE", format!("{}:{t}", only_d.unwrap_or(0))),
            None => std::env::remove_var("SDPA_BWD_TILE"),
        }
        let name = tile.as_ref().map_or("sdpa".to_string(), |t| format!("sdpa:{t}"));
        for d in [64usize, 128] {
            if only_d.is_some_and(|x| x != d) {
                continue;
            }
            let h = HIDDEN / d;
            for s in [512usize, 1024, 2048, 4096, 8192, 16384] {
                for causal in [false, true] {
                    if !points.is_empty() && !points.iter().any(|p| *p == format!("{d}:{s}:{causal}")) {
                        continue;
                    }
                    let shape = Shape { b: TOKENS / s, hq: h, hkv: h, sq: s, sk: s, d, dv: d };
                    let mask = if causal { Mask::CausalTopLeft } else { Mask::None };
                    let spec = AttentionSpec::new(shape, dtype).with_layout(Layout::Bshd).with_mask(mask);
                    gpu.forward(&spec, &opts, bufs.fwd_args())?;
                    let mut t = match gpu.time_pass(&spec, &opts, &bwd, &mut bufs, Pass::Bwd, 3, reps) {
                        Ok(t) => t,
                        Err(e) => {
                            println!("{name} D={d} S={s} causal={causal}: {e}");
                            continue;
                        }
                    };
                    t.sort_by(f64::total_cmp);
                    let ms = t[t.len() / 2];
                    let tflops = AttentionCost::of_pass(&spec, Pass::Bwd).flops / (ms * 1e-3) / 1e12;
                    println!("{d:>4} {h:>3} {s:>6} {causal:>7} {ms:>9.3} {tflops:>8.1}  {name}");
                    lines.push(format!(
                    "{{\"impl\":\"{name}\",\"d\":{d},\"h\":{h},\"s\":{s},\"causal\":{causal},\"ms\":{ms},\"tflops\":{tflops}}}"
                ));
                }
            }
        }
    }
    for l in lines {
        println!("{l}");
    }
    Ok(())
}
