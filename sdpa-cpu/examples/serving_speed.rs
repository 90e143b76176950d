//! What ragged batches and paged caches cost on the CPU, as ratios measured in one run:
//!
//! `RAYON_NUM_THREADS=2 cargo run --release -p sdpa-cpu --example serving_speed -- [REPS] [dtypes]`
//!
//! (defaults 5, `bf16,f32`). Calls of a comparison alternate (A, B, A, B, ...) so a neighbour's load on a
//! shared machine hits both alike; each line gives the median and the best call.
//!
//! - **Varlen prefill**: 8 sequences of 64..1024 tokens (Sq_b = Sk_b, packed BSHD), Hq = 16, Hkv = 4,
//!   D = 128, no mask and causal bottom-right, kernel `auto` (fa2), in GFLOP/s of the work done
//!   (`AttentionCost::of_spec`: each sequence's own band). Two anchors of the same work per row:
//!   (a) **per-sequence dense**: each sequence as its own dense `B = 1` BSHD call (`sequence_as_dense`,
//!   what a server without varlen runs), the eight times summed; (b) **dense batch**: one dense call of
//!   B = 8 sequences of the mean length (equal total tokens; its GFLOP/s, not its time, is compared, as
//!   its work differs slightly). The ratio is varlen GFLOP/s ÷ anchor GFLOP/s.
//! - **Paged decoding**: B = 8, Hq = 32, Hkv = 8, D = 128, one query per sequence, cache lengths
//!   512..8192, pages of 16 slots in shuffled order (NHD), kernel `auto` (splitkv); GB/s of K and V read
//!   against the machine's read bandwidth measured in the same run (`support/readbw.rs`: the same threads
//!   summing a 1 GiB buffer, one pass right before each call; the best pass is the ceiling), and against
//!   the same lengths packed (varlen decode, no pages) in both layouts; NHD and HND pages (the two stride
//!   choices of a paged cache).

#[path = "support/readbw.rs"]
mod readbw;

use sdpa_core::{
    sequence_as_dense, AttentionCost, AttentionSpec, Backend, DType, HostBuffer, HostInputs, Kernel, Layout, Mask,
    Operand, Ragged, RunOptions, Shape,
};
use sdpa_cpu::{attention_ragged, CpuElement};
use std::error::Error;
use std::time::Instant;

const PREFILL_LENS: [usize; 8] = [64, 1024, 192, 768, 320, 640, 448, 512];
const DECODE_LENS: [usize; 8] = [512, 8192, 1024, 6144, 2048, 4096, 3072, 7168];

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let reps = args.first().map_or(Ok(5), |s| s.parse::<usize>())?.max(1);
    let dtypes: Vec<DType> =
        args.get(1).map_or("bf16,f32", String::as_str).split(',').map(str::parse).collect::<Result<_, _>>()?;
    let device = sdpa_cpu::CpuBackend::new(None)?.device_name();
    println!("{device}; threads {}, {reps} calls each, alternating", rayon::current_num_threads());
    for &dtype in &dtypes {
        for mask in [Mask::None, Mask::CausalBottomRight] {
            prefill(dtype, mask, reps)?;
        }
    }
    let buf = readbw::buffer(1 << 30);
    for &dtype in &dtypes {
        decode(dtype, &buf, 4 * reps)?;
    }
    Ok(())
}

/// A ragged spec of `lens_q`/`lens_k` over Hq, Hkv, D = 128 in BSHD.
fn ragged(dtype: DType, hq: usize, hkv: usize, r: Ragged) -> AttentionSpec {
    let shape = Shape { b: r.batch(), hq, hkv, sq: r.max_q().max(1), sk: r.max_k().max(1), d: 128, dv: 128 };
    AttentionSpec::new(shape, dtype).with_ragged(r, Layout::Bshd)
}

/// Best and median of a list of milliseconds.
fn stats(t: &mut [f64]) -> (f64, f64) {
    t.sort_by(f64::total_cmp);
    (t[0], t[t.len() / 2])
}

fn prefill(dtype: DType, mask: Mask, reps: usize) -> Result<(), Box<dyn Error>> {
    let lens = PREFILL_LENS.to_vec();
    let spec = ragged(dtype, 16, 4, Ragged::new(lens.clone(), lens.clone())).with_mask(mask);
    let inputs = HostInputs::random(&spec, 1)?;
    let mut call_v = Call::new(&spec, inputs.clone())?;
    // (a) Each sequence alone, dense BSHD.
    let mut singles = Vec::new();
    for b in 0..lens.len() {
        if let Some((s, i)) = sequence_as_dense(&spec, &inputs, b)? {
            let s = s.with_layout(Layout::Bshd);
            // Same values, relaid as BSHD (the gathered inputs are BHSD).
            let i = relay(&s, &i)?;
            singles.push(Call::new(&s, i)?);
        }
    }
    // (b) One dense batch of the mean length.
    let mean = lens.iter().sum::<usize>() / lens.len();
    let dense = AttentionSpec::new(Shape { b: lens.len(), hq: 16, hkv: 4, sq: mean, sk: mean, d: 128, dv: 128 }, dtype)
        .with_layout(Layout::Bshd)
        .with_mask(mask);
    let mut call_d = Call::new(&dense, HostInputs::random(&dense, 2)?)?;
    let (mut tv, mut ts, mut td) = (Vec::new(), Vec::new(), Vec::new());
    let mut kernel = Kernel::Auto;
    for rep in 0..=reps {
        let v = call_v.run()?;
        let s: f64 = singles.iter_mut().map(Call::run).sum::<Result<f64, _>>()?;
        let d = call_d.run()?;
        kernel = call_v.kernel;
        // The first round warms pages, pools and scratch.
        if rep > 0 {
            tv.push(v);
            ts.push(s);
            td.push(d);
        }
    }
    let gf = |s: &AttentionSpec, ms: f64| AttentionCost::of_spec(s).flops / ms / 1e6;
    let ((v_min, v_med), (s_min, s_med), (d_min, d_med)) = (stats(&mut tv), stats(&mut ts), stats(&mut td));
    let work = AttentionCost::of_spec(&spec).flops;
    println!(
        "prefill {kernel} {dtype} {} lens {lens:?} Hq 16 Hkv 4 D 128 ({:.1} GFLOP): varlen best {v_min:.1} ms \
         ({:.0} GFLOP/s), median {v_med:.1} ms",
        mask.name(),
        work / 1e9,
        gf(&spec, v_min)
    );
    println!(
        "  (a) per-sequence dense calls summed: best {s_min:.1} ms, median {s_med:.1} ms; varlen / dense \
         GFLOP/s = {:.3}x best, {:.3}x median",
        s_min / v_min,
        s_med / v_med
    );
    println!(
        "  (b) dense batch B=8 of the mean length {mean}: best {d_min:.1} ms ({:.0} GFLOP/s), median {d_med:.1} \
         ms; varlen / dense GFLOP/s = {:.3}x best, {:.3}x median",
        gf(&dense, d_min),
        gf(&spec, v_min) / gf(&dense, d_min),
        gf(&spec, v_med) / gf(&dense, d_med)
    );
    Ok(())
}

fn decode(dtype: DType, buf: &[f32], reps: usize) -> Result<(), Box<dyn Error>> {
    let lens = DECODE_LENS.to_vec();
    let ones = vec![1; lens.len()];
    let spec = |r: Ragged, layout: Layout| {
        let shape = Shape { b: r.batch(), hq: 32, hkv: 8, sq: 1, sk: r.max_k(), d: 128, dv: 128 };
        AttentionSpec::new(shape, dtype).with_ragged(r, layout).with_mask(Mask::CausalBottomRight)
    };
    let paged = Ragged::new(ones.clone(), lens.clone()).paged(16, 0);
    // Pages NHD ([page, slot, Hkv, D], vLLM's), HND ([page, Hkv, slot, D], FlashInfer's), and packed in
    // both layouts (BHSD packed is `[Hkv, total_k, D]`: each head one contiguous stream, as dense BHSD).
    let cases = [
        ("paged NHD", spec(paged.clone(), Layout::Bshd)),
        ("paged HND", spec(paged, Layout::Bhsd)),
        ("packed BSHD", spec(Ragged::new(ones.clone(), lens.clone()), Layout::Bshd)),
        ("packed BHSD", spec(Ragged::new(ones.clone(), lens.clone()), Layout::Bhsd)),
        ("paged HND, pages of 256", spec(Ragged::new(ones, lens.clone()).paged(256, 0), Layout::Bhsd)),
    ];
    let mut calls = Vec::new();
    for (n, (_, s)) in cases.iter().enumerate() {
        calls.push(Call::new(s, HostInputs::random(s, 3 + n as u64)?)?);
    }
    // The HND cache again with its pages in order (sequence after sequence): what scattering costs.
    let mut in_order = calls[1].inputs.clone();
    let in_order_spec = cases[1].1.clone();
    if let Some(t) = in_order.block_table.as_mut() {
        let max_pages = t.len() / lens.len();
        let mut next = 0u32;
        for (b, &len) in lens.iter().enumerate() {
            for c in 0..len.div_ceil(16) {
                t[b * max_pages + c] = next;
                next += 1;
            }
        }
    }
    calls.push(Call::new(&in_order_spec, in_order)?);
    let names: Vec<&str> = cases.iter().map(|c| c.0).chain(["paged HND, pages in order"]).collect();
    let threads = rayon::current_num_threads();
    let mut times = vec![Vec::new(); calls.len()];
    let mut fractions = vec![Vec::new(); calls.len()];
    let mut passes = Vec::new();
    let bytes = (lens.iter().sum::<usize>() * 8 * 256 * dtype.size_bytes()) as f64;
    for rep in 0..=reps {
        for (n, c) in calls.iter_mut().enumerate() {
            // A ceiling pass right before each call: a call and its pass see the same background load.
            let ceil = readbw::read_gbps(buf, threads, rep % 2 == 1);
            let t = c.run()?;
            // The first round warms pages, pools and scratch.
            if rep > 0 {
                passes.push(ceil);
                fractions[n].push(bytes / t / 1e6 / ceil);
                times[n].push(t);
            }
        }
    }
    let ceil = passes.iter().copied().fold(0.0, f64::max);
    let gbps = |ms: f64| bytes / ms / 1e6;
    println!(
        "decode {dtype} lens {lens:?} Hq 32 Hkv 8 D 128, pages of 16 in shuffled order ({:.0} MB of K/V); read \
         ceiling {ceil:.1} GB/s (best of {} passes)",
        bytes / 1e6,
        passes.len()
    );
    for ((name, c), (t, f)) in names.iter().zip(&calls).zip(times.iter_mut().zip(&mut fractions)) {
        let (min, med) = stats(t);
        f.sort_by(f64::total_cmp);
        println!(
            "  {} {name}: best {min:.2} ms = {:.1} GB/s ({:.0} % of the ceiling), median {med:.2} ms = {:.1} GB/s; \
             median of (call / the pass right before it) {:.0} %",
            c.kernel,
            gbps(min),
            100.0 * gbps(min) / ceil,
            gbps(med),
            100.0 * f[f.len() / 2]
        );
    }
    Ok(())
}

/// Dense BHSD inputs of `spec`'s shape relaid into `spec`'s strides.
fn relay(spec: &AttentionSpec, bhsd: &HostInputs) -> Result<HostInputs, Box<dyn Error>> {
    let from = spec.clone().with_layout(Layout::Bhsd);
    let move_op = |op: Operand, src: &HostBuffer| -> Result<HostBuffer, Box<dyn Error>> {
        let [_, heads, rows, dim] = spec.extent(op);
        let mut out = HostBuffer::poisoned(spec.dtype, spec.required_len(op)?);
        let (a, b) = (from.strides(op), spec.strides(op));
        for h in 0..heads {
            for i in 0..rows {
                for c in 0..dim {
                    out.set_f32(b.offset(0, h, i) + c, src.get_f32(a.offset(0, h, i) + c));
                }
            }
        }
        Ok(out)
    };
    Ok(HostInputs {
        q: move_op(Operand::Q, &bhsd.q)?,
        k: move_op(Operand::K, &bhsd.k)?,
        v: move_op(Operand::V, &bhsd.v)?,
        mask: None,
        block_table: None,
    })
}

/// One timed call of `auto` through the slice entry, on fixed inputs and a reused output.
struct Call {
    spec: AttentionSpec,
    inputs: HostInputs,
    o: HostBuffer,
    kernel: Kernel,
}

impl Call {
    fn new(spec: &AttentionSpec, inputs: HostInputs) -> Result<Self, Box<dyn Error>> {
        let o = HostBuffer::poisoned(spec.dtype, spec.required_len(Operand::O)?);
        Ok(Call { spec: spec.clone(), inputs, o, kernel: Kernel::Auto })
    }

    /// Milliseconds of one call.
    fn run(&mut self) -> Result<f64, Box<dyn Error>> {
        fn go<T: CpuElement>(s: &AttentionSpec, t: Option<&[u32]>, q: &[T], k: &[T], v: &[T], o: &mut [T]) -> R {
            let t0 = Instant::now();
            let kernel = attention_ragged(s, &RunOptions::default(), q, k, v, t, o, None)?;
            Ok((t0.elapsed().as_secs_f64() * 1e3, kernel))
        }
        type R = Result<(f64, Kernel), Box<dyn Error>>;
        let (s, t) = (&self.spec, self.inputs.block_table.as_deref());
        let (ms, kernel) = match (&self.inputs.q, &self.inputs.k, &self.inputs.v, &mut self.o) {
            (HostBuffer::F32(q), HostBuffer::F32(k), HostBuffer::F32(v), HostBuffer::F32(o)) => go(s, t, q, k, v, o),
            (HostBuffer::F16(q), HostBuffer::F16(k), HostBuffer::F16(v), HostBuffer::F16(o)) => go(s, t, q, k, v, o),
            (HostBuffer::BF16(q), HostBuffer::BF16(k), HostBuffer::BF16(v), HostBuffer::BF16(o)) => {
                go(s, t, q, k, v, o)
            }
            _ => Err("inputs and output differ in dtype".into()),
        }?;
        self.kernel = kernel;
        Ok(ms)
    }
}
