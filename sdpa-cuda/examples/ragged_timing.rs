//! Times `fa2` on a ragged batch against dense calls doing the same work, in one process (issue 23's speed
//! case): bf16, Hq = Hkv = 16, D = 128, 16 sequences of 128 to 8192 tokens (65536 in all, lengths off the
//! tiles included), not causal and causal bottom-right. "The same work" two ways:
//! - `dense L`: one dense B = 1 call whose length L gives the same number of (query, key) pairs as the
//!   batch (non-causal: L² = Σ s²; causal: L(L+1)/2 = Σ s(s+1)/2, L rounded to a multiple of 64);
//! - `per-seq`: the 16 sequences as 16 dense B = 1 calls, one after another (what a server without varlen
//!   support runs); their times add up.
//!
//! TFLOPS are 4·pairs·D·Hq over the median device-event time (L2 flushed before each call,
//! `AttentionCost::of_spec`, which counts each sequence's own band); the ratio column is the ragged call's
//! TFLOPS over that line's. The ragged call is checked on a few rows against the f64 reference.
//! Optional: page sizes (comma-separated) also time the batch read from a paged cache of each page size.
//!
//!     cargo run --release -p sdpa-cuda --example ragged_timing -- [reps] [page sizes, e.g. 16,256]

use sdpa_core::check::check_output;
use sdpa_core::{
    AttentionCost, AttentionSpec, DType, F32Math, HostBackend, HostInputs, Kernel, Layout, Mask, Ragged, RunOptions,
    Shape,
};
use sdpa_cuda::CudaBackend;

/// The batch: 16 sequences, 65536 tokens, the longest 8192, interleaved long and short.
const LENGTHS: [usize; 16] =
    [8192, 143, 6144, 1000, 8192, 2048, 4096, 777, 7168, 128, 6144, 3072, 8192, 1024, 5120, 4096];
const H: usize = 16;
const D: usize = 128;

fn median_ms(
    gpu: &CudaBackend,
    spec: &AttentionSpec,
    inputs: &HostInputs,
    reps: usize,
) -> Result<f64, sdpa_core::SdpaError> {
    let opts = RunOptions { kernel: Kernel::Fa2, f32_math: F32Math::Exact, threads: None, lse: false };
    let (mut t, ran) = gpu.time_host(spec, &opts, inputs, 2, reps)?;
    assert_eq!(ran, Kernel::Fa2, "fa2 must run");
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

fn dense(s: usize, mask: Mask) -> AttentionSpec {
    AttentionSpec::new(Shape { b: 1, hq: H, hkv: H, sq: s, sk: s, d: D, dv: D }, DType::BF16).with_mask(mask)
}

fn tflops(spec: &AttentionSpec, ms: f64) -> f64 {
    AttentionCost::of_spec(spec).flops / (ms * 1e-3) / 1e12
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let reps: usize = args.get(1).map_or(Ok(10), |x| x.parse())?;
    let pages: Vec<usize> = match args.get(2) {
        Some(x) => x.split(',').map(|p| p.trim().parse()).collect::<Result<_, _>>()?,
        None => Vec::new(),
    };
    let gpu = CudaBackend::new(0)?;
    let total: usize = LENGTHS.iter().sum();
    let longest = LENGTHS.iter().copied().max().unwrap_or(1);
    let shape = Shape { b: LENGTHS.len(), hq: H, hkv: H, sq: longest, sk: longest, d: D, dv: D };
    println!(
        "{} bf16 Hq=Hkv={H} D={D}, {} sequences, {total} tokens ({}..{longest}), fa2, median of {reps}",
        gpu.device_name(),
        LENGTHS.len(),
        LENGTHS.iter().min().unwrap_or(&0)
    );
    println!("{:<12} {:<22} {:>9} {:>8} {:>13}  check", "mask", "call", "ms", "TFLOPS", "ragged/this");
    for mask in [Mask::None, Mask::CausalBottomRight] {
        let ragged = |r: Ragged| AttentionSpec::new(shape, DType::BF16).with_ragged(r, Layout::Bshd).with_mask(mask);
        let mut calls = vec![("ragged varlen".to_string(), ragged(Ragged::new(LENGTHS.to_vec(), LENGTHS.to_vec())))];
        for &p in &pages {
            calls.push((
                format!("ragged paged {p}"),
                ragged(Ragged::new(LENGTHS.to_vec(), LENGTHS.to_vec()).paged(p, 0)),
            ));
        }
        let pairs: f64 =
            LENGTHS.iter().map(|&s| if mask == Mask::None { (s * s) as f64 } else { (s * (s + 1) / 2) as f64 }).sum();
        let l = if mask == Mask::None { pairs.sqrt() } else { ((8.0 * pairs + 1.0).sqrt() - 1.0) / 2.0 };
        let l = ((l / 64.0).round() as usize * 64).max(64);
        let mut ragged_tf = 0.0;
        for (n, (name, spec)) in calls.iter().enumerate() {
            let inputs = HostInputs::random(spec, 1)?;
            let ms = median_ms(&gpu, spec, &inputs, reps)?;
            let tf = tflops(spec, ms);
            if n == 0 {
                ragged_tf = tf;
            }
            let opts = RunOptions { kernel: Kernel::Fa2, f32_math: F32Math::Exact, threads: None, lse: true };
            let run = gpu.run_host(spec, &opts, &inputs)?;
            let r = check_output(spec, &inputs, &run.output, F32Math::Exact, Some(24))?;
            let verdict = if r.pass { format!("ok ({:.1e})", r.rel_err) } else { format!("FAIL {r:?}") };
            println!("{:<12} {name:<22} {ms:>9.3} {tf:>8.1} {:>12.3}x  {verdict}", mask.name(), ragged_tf / tf);
        }
        // One dense call with the same pairs.
        let spec = dense(l, mask);
        let inputs = HostInputs::random(&spec, 2)?;
        let ms = median_ms(&gpu, &spec, &inputs, reps)?;
        let tf = tflops(&spec, ms);
        println!("{:<12} {:<22} {ms:>9.3} {tf:>8.1} {:>12.3}x", mask.name(), format!("dense L={l}"), ragged_tf / tf);
        // The sequences one call each.
        let (mut ms_sum, mut flops) = (0.0, 0.0);
        for &s in &LENGTHS {
            let spec = dense(s, mask);
            let inputs = HostInputs::random(&spec, 3)?;
            ms_sum += median_ms(&gpu, &spec, &inputs, reps)?;
            flops += AttentionCost::of_spec(&spec).flops;
        }
        let tf = flops / (ms_sum * 1e-3) / 1e12;
        println!("{:<12} {:<22} {ms_sum:>9.3} {tf:>8.1} {:>12.3}x", mask.name(), "per-seq (16 calls)", ragged_tf / tf);
    }
    Ok(())
}
