//! Sliding windows and logit softcapping as Gemma 2 and Mistral run them, with random activations (nothing
//! downloaded): the attention of
//!
//! - a Gemma-2-style pair of layers, one local (causal, `sliding_window` keys back) and one global (causal),
//!   both with the logit softcap 50, on a prefill of `--seq` tokens; head counts of Gemma 2 2B (8 query
//!   heads sharing 4 kv heads, head dim 256, scale `256^-1/2`);
//! - a Mistral-style windowed layer (16 query heads sharing 4 kv heads, head dim 128: Mistral 7B's head dim
//!   and grouping at half its heads) on a prefill, then decoding `--steps` tokens one at a time against its
//!   KV cache.
//!
//! Each call runs once with candle's own attention, written the way candle-transformers' `gemma2.rs` and
//! `mistral.rs` write it (BHSD, K/V repeated per query head, `q·kᵀ·scale`, `cap · tanh(· / cap)`, an
//! additive window mask built once per call, `softmax_last_dim`, `·v`), and once with sdpa: the Gemma layers
//! through the candle-flash-attn-named `flash_attn_alibi_windowed_softcap` (a migration from
//! candle-flash-attn is a rename), the Mistral layer through `sdpa` with `SdpaOptions`. Both are measured
//! against candle's attention computed in f32 from the same rounded inputs; then both are timed and a table
//! printed.
//!
//! The defaults are scaled down so that the example runs in seconds on a 2-core CPU: `--seq 2048` with a
//! window of 512 keys (Gemma 2 and Mistral use 4096 at contexts of 8192 and more). `--full` takes the real
//! window 4096 at `--seq 8192` (minutes on a small CPU; meant for a GPU).
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release -p sdpa-candle --example 02-gemma2-mistral
//! cargo run --release -p sdpa-candle --features cuda --example 02-gemma2-mistral -- --device cuda --dtype bf16 --full
//! ```
//!
//! candle-transformers' Mistral adds no mask when decoding one token, so once its cache is longer than the
//! window it attends to keys the window excludes; the candle path here applies the window in decoding too,
//! so that both paths compute the same thing.

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::ops;
use sdpa_candle::{flash_attn_alibi_windowed_softcap, sdpa, SdpaMask, SdpaOptions, Window};

mod common;
use common::{rel_l2, time_pair, tolerance};

/// Attention sizes of one layer.
#[derive(Debug, Clone, Copy)]
struct Heads {
    q: usize,
    kv: usize,
    dim: usize,
}

/// Gemma 2 2B: 8 query heads over 4 kv heads, head dim 256 (and `query_pre_attn_scalar` 256).
const GEMMA2: Heads = Heads { q: 8, kv: 4, dim: 256 };
/// Mistral 7B's head dim and grouping (4 query heads per kv head) at half its 32 heads.
const MISTRAL: Heads = Heads { q: 16, kv: 4, dim: 128 };
/// Gemma 2's `attn_logit_softcapping`.
const SOFTCAP: f64 = 50.0;

struct Args {
    device: String,
    dtype: DType,
    seq: usize,
    window: usize,
    steps: usize,
    reps: usize,
}

fn parse_args() -> Result<Args> {
    let mut a = Args { device: "cpu".into(), dtype: DType::F32, seq: 2048, window: 512, steps: 4, reps: 3 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--device" => a.device = val()?,
            "--dtype" => a.dtype = common::dtype(&val()?)?,
            "--seq" => a.seq = val()?.parse().context("--seq")?,
            "--window" => a.window = val()?.parse().context("--window")?,
            "--steps" => a.steps = val()?.parse().context("--steps")?,
            "--reps" => a.reps = val()?.parse().context("--reps")?,
            "--full" => (a.seq, a.window) = (8192, 4096),
            other => bail!(
                "unknown flag `{other}` (--device cpu|cuda, --dtype f32|f16|bf16, --seq, --window, --steps, --reps, \
                 --full)"
            ),
        }
    }
    if a.reps == 0 || a.seq == 0 {
        bail!("--seq and --reps must be at least 1");
    }
    Ok(a)
}

/// Random `[1, S, H, D]` activations in `dtype`, as projections reshape them (BSHD).
fn bshd(s: usize, h: usize, d: usize, dtype: DType, dev: &Device) -> Result<Tensor> {
    Ok(Tensor::randn(0f32, 1.0, (1, s, h, d), dev)?.to_dtype(dtype)?)
}

/// candle-transformers' window mask: key `j` hidden from query `i` (at absolute position `i + offset`) when
/// `j > i + offset` or `j + window < i + offset`; `[Sq, Sk]` additive in `dtype`.
fn window_mask(sq: usize, sk: usize, window: Option<usize>, dtype: DType, dev: &Device) -> Result<Tensor> {
    let offset = sk - sq;
    let mask: Vec<f32> = (0..sq * sk)
        .map(|x| {
            let (i, j) = (x / sk + offset, x % sk);
            if j > i || window.is_some_and(|w| j + w < i) {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Ok(Tensor::from_vec(mask, (sq, sk), dev)?.to_dtype(dtype)?)
}

/// Candle's own attention on BSHD `q`, `k`, `v`, as candle-transformers' Gemma 2 and Mistral compute it
/// (their tensors are BHSD, hence the transposes and copies), in `dtype`. Returns BSHD.
fn candle_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    softcap: Option<f64>,
    window: Option<usize>,
    dtype: DType,
) -> Result<Tensor> {
    let to = |t: &Tensor| -> Result<Tensor> { Ok(t.transpose(1, 2)?.contiguous()?.to_dtype(dtype)?) };
    let (q, k, v) = (to(q)?, to(k)?, to(v)?);
    let (b, hq, sq, _) = q.dims4()?;
    let (_, hkv, sk, d) = k.dims4()?;
    // candle_transformers::utils::repeat_kv.
    let repeat = |t: Tensor| -> Result<Tensor> {
        let n = hq / hkv;
        Ok(Tensor::cat(&vec![&t; n], 2)?.reshape((b, hq, sk, d))?)
    };
    let (k, v) = (repeat(k)?, repeat(v)?);
    let mut att = (q.matmul(&k.t()?)? * scale)?;
    if let Some(cap) = softcap {
        att = ((att / cap)?.tanh()? * cap)?;
    }
    let mask = window_mask(sq, sk, window, dtype, q.device())?;
    let att = ops::softmax_last_dim(&att.broadcast_add(&mask)?)?;
    Ok(att.matmul(&v)?.transpose(1, 2)?)
}

/// One row of the table.
struct Row {
    name: String,
    err_sdpa: f64,
    err_candle: f64,
    ms_candle: f64,
    ms_sdpa: f64,
}

/// Checks one call both ways against candle's f32 attention, then times both. `ours` is the sdpa call,
/// `theirs(dtype)` candle's attention computed in `dtype`.
fn measure(
    name: String,
    args: &Args,
    dev: &Device,
    ours: impl Fn() -> Result<Tensor>,
    theirs: impl Fn(DType) -> Result<Tensor>,
) -> Result<Row> {
    let exact = theirs(DType::F32)?;
    let err_sdpa = rel_l2(&ours()?, &exact)?;
    let err_candle = rel_l2(&theirs(args.dtype)?, &exact)?;
    let (ms_candle, ms_sdpa) = time_pair(dev, args.reps, || theirs(args.dtype), &ours)?;
    Ok(Row { name, err_sdpa, err_candle, ms_candle, ms_sdpa })
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let dev = common::device(&args.device)?;
    let (s, w, dt) = (args.seq, args.window, args.dtype);
    let mut rows = Vec::new();

    // Gemma 2: the local and the global layer of a pair, softcap 50, through candle-flash-attn's names.
    let g = GEMMA2;
    let (q, k, v) = (bshd(s, g.q, g.dim, dt, &dev)?, bshd(s, g.kv, g.dim, dt, &dev)?, bshd(s, g.kv, g.dim, dt, &dev)?);
    let scale = 1.0 / (g.dim as f64).sqrt();
    for (name, left) in
        [(format!("Gemma 2 local  (window {w}, softcap 50)"), Some(w)), ("Gemma 2 global (softcap 50)".into(), None)]
    {
        rows.push(measure(
            name,
            &args,
            &dev,
            || Ok(flash_attn_alibi_windowed_softcap(&q, &k, &v, None, scale as f32, left, Some(0), SOFTCAP as f32)?),
            |dtype| candle_attention(&q, &k, &v, scale, Some(SOFTCAP), left, dtype),
        )?);
    }

    // Mistral: a windowed prefill, then decoding against the KV cache (BSHD, appended along the sequence).
    let m = MISTRAL;
    let scale = 1.0 / (m.dim as f64).sqrt();
    let opts = SdpaOptions::bshd().with_mask(SdpaMask::CausalBottomRight).with_window(Window::left(w));
    let (q, mut k, mut v) =
        (bshd(s, m.q, m.dim, dt, &dev)?, bshd(s, m.kv, m.dim, dt, &dev)?, bshd(s, m.kv, m.dim, dt, &dev)?);
    rows.push(measure(
        format!("Mistral prefill (window {w})"),
        &args,
        &dev,
        || Ok(sdpa(&q, &k, &v, &opts)?),
        |dtype| candle_attention(&q, &k, &v, scale, None, Some(w), dtype),
    )?);
    let (mut worst_sdpa, mut worst_candle) = (0f64, 0f64);
    for _ in 0..args.steps {
        let q1 = bshd(1, m.q, m.dim, dt, &dev)?;
        k = Tensor::cat(&[&k, &bshd(1, m.kv, m.dim, dt, &dev)?], 1)?;
        v = Tensor::cat(&[&v, &bshd(1, m.kv, m.dim, dt, &dev)?], 1)?;
        let exact = candle_attention(&q1, &k, &v, scale, None, Some(w), DType::F32)?;
        worst_sdpa = worst_sdpa.max(rel_l2(&sdpa(&q1, &k, &v, &opts)?, &exact)?);
        worst_candle = worst_candle.max(rel_l2(&candle_attention(&q1, &k, &v, scale, None, Some(w), dt)?, &exact)?);
    }
    let q1 = bshd(1, m.q, m.dim, dt, &dev)?;
    let (ms_candle, ms_sdpa) = time_pair(
        &dev,
        args.reps.max(5),
        || candle_attention(&q1, &k, &v, scale, None, Some(w), dt),
        || Ok(sdpa(&q1, &k, &v, &opts)?),
    )?;
    let cache = k.dim(1)?;
    rows.push(Row {
        name: format!("Mistral decode (cache {cache}, window {w})"),
        err_sdpa: worst_sdpa,
        err_candle: worst_candle,
        ms_candle,
        ms_sdpa,
    });

    println!(
        "Gemma 2 / Mistral attention: seq {s}, window {w}, {} decode steps, {dt:?} on {:?}; Gemma {}/{} heads D={}, \
         Mistral {}/{} heads D={}",
        args.steps, dev, g.q, g.kv, g.dim, m.q, m.kv, m.dim
    );
    println!("relative L2 error against candle's attention in f32; median of {} interleaved runs (ms)\n", args.reps);
    println!("| call | sdpa error | candle error | candle ms | sdpa ms | speedup |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for r in &rows {
        println!(
            "| {} | {:.2e} | {:.2e} | {:.2} | {:.2} | {:.2}x |",
            r.name,
            r.err_sdpa,
            r.err_candle,
            r.ms_candle,
            r.ms_sdpa,
            r.ms_candle / r.ms_sdpa
        );
    }
    // The bar: within the dtype's tolerance, or at most candle's own error.
    let tol = tolerance(dt);
    if let Some(r) = rows.iter().find(|r| r.err_sdpa > tol.max(r.err_candle)) {
        bail!(
            "{}: sdpa's error {:.2e} exceeds both the tolerance {tol:.1e} and candle's own {:.2e}",
            r.name,
            r.err_sdpa,
            r.err_candle
        );
    }
    Ok(())
}
