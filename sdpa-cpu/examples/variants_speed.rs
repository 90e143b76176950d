//! What windows, softcap and ALiBi cost on the CPU, as ratios measured in one run:
//!
//! `RAYON_NUM_THREADS=2 cargo run --release -p sdpa-cpu --example variants_speed -- [S_BIG] [S_SMALL] [REPS] [dtypes]`
//!
//! (defaults 16384, 4096, 3, `f32,bf16`). For each dtype, B = 1, H = 16, D = 128, causal bottom-right:
//! full causal against a sliding window of W = 1024 keys (left 1023, so each row sees exactly 1024 keys, the
//! diagonal included) at `S_BIG`, and plain causal against softcap 50 and ALiBi (standard slopes) at
//! `S_SMALL`, the softcap also at scale 8 (logits of tens to hundreds: its worst case; the default scale
//! `1/√D` gives logits of a few units, as in models). Calls of a comparison alternate (A, B, A, B, ...) so a neighbour's load on a shared machine
//! hits both alike; each line gives the median and the best call, and the ratios of both. Last, decoding
//! (Sq = 1, Sk = 4·S_BIG, Hq = 32, Hkv = 8): full cache against the 1024-key window. Kernel `auto` (`fa2`
//! for the prefill shapes, `splitkv` for decoding; each line names it).

use sdpa_core::{
    Alibi, AttentionCost, AttentionSpec, DType, HostBuffer, HostInputs, Kernel, Mask, Operand, RunOptions, Shape,
    Window,
};
use sdpa_cpu::{attention, CpuElement};
use std::error::Error;
use std::time::Instant;

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: usize| args.get(i).map_or(Ok(default), |s| s.parse::<usize>());
    let (s_big, s_small, reps) = (arg(0, 16384)?, arg(1, 4096)?, arg(2, 3)?.max(1));
    let dtypes: Vec<DType> =
        args.get(3).map_or("f32,bf16", String::as_str).split(',').map(str::parse).collect::<Result<_, _>>()?;
    println!("threads {}, {} calls each, alternating", rayon::current_num_threads(), reps);
    for dtype in dtypes {
        let causal =
            |s: usize| AttentionSpec::new(Shape::new(1, 16, s, s, 128), dtype).with_mask(Mask::CausalBottomRight);
        let big = causal(s_big);
        compare(&big, &[("window 1023,0", big.clone().with_window(Window::left(1023)))], reps)?;
        let small = causal(s_small);
        compare(
            &small,
            &[
                ("softcap 50", small.clone().with_softcap(50.0)),
                ("alibi standard", small.clone().with_alibi(Alibi::Standard)),
            ],
            reps,
        )?;
        // The softcap's worst case: logits of tens to hundreds (scale 8 on unit-variance inputs), where no
        // score takes the cheap series.
        let hot = small.clone().with_scale(8.0);
        compare(&hot, &[("softcap 50 (scale 8)", hot.clone().with_softcap(50.0))], reps)?;
        // Decoding one token against a long cache (GQA 4:1): the split-KV streaming path reads the window only.
        let decode = AttentionSpec::new(Shape { b: 1, hq: 32, hkv: 8, sq: 1, sk: 4 * s_big, d: 128, dv: 128 }, dtype)
            .with_mask(Mask::CausalBottomRight);
        compare(&decode, &[("window 1023,0", decode.clone().with_window(Window::left(1023)))], 10 * reps)?;
    }
    Ok(())
}

/// Times `base` and each variant, alternating calls, and prints each against `base`.
fn compare(base: &AttentionSpec, variants: &[(&str, AttentionSpec)], reps: usize) -> Result<(), Box<dyn Error>> {
    let inputs = HostInputs::random(base, 1)?;
    let mut o = HostBuffer::poisoned(base.dtype, base.required_len(Operand::O)?);
    let specs: Vec<&AttentionSpec> = std::iter::once(base).chain(variants.iter().map(|(_, s)| s)).collect();
    // One untimed call of each (page faults, thread pool, scratch).
    for s in &specs {
        call(s, &inputs, &mut o)?;
    }
    let mut times = vec![Vec::with_capacity(reps); specs.len()];
    for _ in 0..reps {
        for (s, t) in specs.iter().zip(&mut times) {
            t.push(call(s, &inputs, &mut o)?.0);
        }
    }
    let stats = |t: &mut Vec<f64>| {
        t.sort_by(f64::total_cmp);
        (t[t.len() / 2], t[0])
    };
    let (base_med, base_min) = stats(&mut times[0]);
    let kernel = call(base, &inputs, &mut o)?.1;
    let label = format!("{kernel} {} {} causal-br", base.dtype, base.shape);
    let tflops = |s: &AttentionSpec, ms: f64| AttentionCost::of_spec(s).flops / ms / 1e6;
    println!(
        "{label} plain: median {base_med:9.1} ms, best {base_min:9.1} ms ({:.0} GFLOP/s on the work done)",
        tflops(base, base_min)
    );
    for ((name, s), t) in variants.iter().zip(&mut times[1..]) {
        let (med, min) = stats(t);
        println!(
            "{label} {name}: median {med:9.1} ms, best {min:9.1} ms ({:.0} GFLOP/s); plain / this = {:.2}x median, \
             {:.2}x best; this / plain = {:+.1} % median, {:+.1} % best",
            tflops(s, min),
            base_med / med,
            base_min / min,
            100.0 * (med / base_med - 1.0),
            100.0 * (min / base_min - 1.0),
        );
    }
    Ok(())
}

/// One call of `auto` through the slice entry (no copies): milliseconds and the kernel that ran.
fn call(spec: &AttentionSpec, inputs: &HostInputs, o: &mut HostBuffer) -> Result<(f64, Kernel), Box<dyn Error>> {
    type Timed = Result<(f64, Kernel), Box<dyn Error>>;
    fn run<T: CpuElement>(spec: &AttentionSpec, q: &[T], k: &[T], v: &[T], o: &mut [T]) -> Timed {
        let t0 = Instant::now();
        let kernel = attention(spec, &RunOptions::default(), q, k, v, None, o, None)?;
        Ok((t0.elapsed().as_secs_f64() * 1e3, kernel))
    }
    match (&inputs.q, &inputs.k, &inputs.v, o) {
        (HostBuffer::F32(q), HostBuffer::F32(k), HostBuffer::F32(v), HostBuffer::F32(o)) => run(spec, q, k, v, o),
        (HostBuffer::F16(q), HostBuffer::F16(k), HostBuffer::F16(v), HostBuffer::F16(o)) => run(spec, q, k, v, o),
        (HostBuffer::BF16(q), HostBuffer::BF16(k), HostBuffer::BF16(v), HostBuffer::BF16(o)) => run(spec, q, k, v, o),
        _ => Err("inputs and output differ in dtype".into()),
    }
}
