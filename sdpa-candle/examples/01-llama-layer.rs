//! A small Llama-style decoder layer in candle (random weights, nothing downloaded): RMSNorm, rotary
//! embeddings, grouped-query causal attention, SwiGLU MLP. It runs once with candle's own attention
//! (the matmul + softmax_last_dim + matmul that candle-transformers' models write) and once with
//! `sdpa_candle::sdpa`, checks that the two outputs agree, and times both.
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release -p sdpa-candle --example 01-llama-layer -- --seq 1024 --dtype f32
//! cargo run --release -p sdpa-candle --features cuda --example 01-llama-layer -- --device cuda --dtype bf16
//! ```
//!
//! The sdpa path needs no transpose at all: projections reshape to `[B, S, H, D]`, rotary embeddings run on
//! that order (`rope_thd`), and `sdpa` reads it with `Layout::Bshd`; K and V stay at their kv heads.

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{ops, rotary_emb, Linear};
use sdpa_candle::{sdpa, SdpaMask, SdpaOptions};

mod common;
use common::{rel_l2, time_pair, tolerance};

/// Sizes of the layer (a scaled-down Llama: 16 query heads sharing 4 kv heads).
#[derive(Debug, Clone, Copy)]
struct Config {
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    intermediate: usize,
    eps: f32,
    rope_theta: f32,
}

const CONFIG: Config =
    Config { hidden: 1024, heads: 16, kv_heads: 4, head_dim: 64, intermediate: 2816, eps: 1e-5, rope_theta: 10000.0 };

/// Which attention the layer runs.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Attention {
    /// candle-transformers' way: BHSD copies, K/V repeated per query head, scores materialised.
    Candle,
    /// The same, computed in f32 from the same (rounded) q, k, v: the yardstick both are measured by.
    CandleF32,
    /// One `sdpa_candle::sdpa` call on BSHD tensors.
    Sdpa,
}

struct Layer {
    cfg: Config,
    attn_norm: Tensor,
    mlp_norm: Tensor,
    wq: Linear,
    wk: Linear,
    wv: Linear,
    wo: Linear,
    gate: Linear,
    up: Linear,
    down: Linear,
    cos: Tensor,
    sin: Tensor,
    /// Additive causal mask `[max_seq, max_seq]` in the model's dtype, built once as candle-transformers'
    /// models cache theirs (so the candle path is not charged for building it).
    causal: Tensor,
}

fn linear(out_dim: usize, in_dim: usize, dtype: DType, dev: &Device) -> Result<Linear> {
    // Scaled like a trained layer so activations stay O(1).
    let w = (Tensor::randn(0f32, 1.0, (out_dim, in_dim), dev)? / (in_dim as f64).sqrt())?.to_dtype(dtype)?;
    Ok(Linear::new(w, None))
}

impl Layer {
    fn new(cfg: Config, max_seq: usize, dtype: DType, dev: &Device) -> Result<Self> {
        let (h, hd) = (cfg.hidden, cfg.head_dim);
        let norm = |seed: f64| -> Result<Tensor> { Ok((Tensor::rand(0.8f32, 1.2, h, dev)? * seed)?.to_dtype(dtype)?) };
        // Rotary tables [max_seq, head_dim / 2], as candle-transformers' Llama builds them.
        let inv: Vec<f32> = (0..hd).step_by(2).map(|i| 1.0 / cfg.rope_theta.powf(i as f32 / hd as f32)).collect();
        let inv = Tensor::from_vec(inv, (1, hd / 2), dev)?;
        let pos = Tensor::arange(0u32, max_seq as u32, dev)?.to_dtype(DType::F32)?.reshape((max_seq, 1))?;
        let freqs = pos.matmul(&inv)?;
        let mask: Vec<f32> =
            (0..max_seq * max_seq).map(|x| if x % max_seq > x / max_seq { f32::NEG_INFINITY } else { 0.0 }).collect();
        let causal = Tensor::from_vec(mask, (max_seq, max_seq), dev)?.to_dtype(dtype)?;
        Ok(Layer {
            cfg,
            attn_norm: norm(1.0)?,
            mlp_norm: norm(1.0)?,
            wq: linear(cfg.heads * hd, h, dtype, dev)?,
            wk: linear(cfg.kv_heads * hd, h, dtype, dev)?,
            wv: linear(cfg.kv_heads * hd, h, dtype, dev)?,
            wo: linear(h, cfg.heads * hd, dtype, dev)?,
            gate: linear(cfg.intermediate, h, dtype, dev)?,
            up: linear(cfg.intermediate, h, dtype, dev)?,
            down: linear(h, cfg.intermediate, dtype, dev)?,
            cos: freqs.cos()?.to_dtype(dtype)?,
            sin: freqs.sin()?.to_dtype(dtype)?,
            causal,
        })
    }

    /// Self-attention of the normalised input `x` `[B, S, hidden]`, before the output projection.
    fn attention(&self, x: &Tensor, how: Attention) -> Result<Tensor> {
        let c = self.cfg;
        let (b, s, _) = x.dims3()?;
        let q = self.wq.forward(x)?.reshape((b, s, c.heads, c.head_dim))?;
        let k = self.wk.forward(x)?.reshape((b, s, c.kv_heads, c.head_dim))?;
        let v = self.wv.forward(x)?.reshape((b, s, c.kv_heads, c.head_dim))?;
        let (cos, sin) = (self.cos.narrow(0, 0, s)?, self.sin.narrow(0, 0, s)?);
        let y = match how {
            Attention::Candle | Attention::CandleF32 => {
                let bhsd = |t: Tensor| t.transpose(1, 2)?.contiguous();
                let q = rotary_emb::rope(&bhsd(q)?, &cos, &sin)?;
                let k = rotary_emb::rope(&bhsd(k)?, &cos, &sin)?;
                let v = bhsd(v)?;
                let (q, k, v) = if how == Attention::CandleF32 {
                    (q.to_dtype(DType::F32)?, k.to_dtype(DType::F32)?, v.to_dtype(DType::F32)?)
                } else {
                    (q, k, v)
                };
                let repeat = |t: Tensor| -> candle_core::Result<Tensor> {
                    let g = c.heads / c.kv_heads;
                    Tensor::cat(&vec![&t; g], 2)?.reshape((b, c.heads, s, c.head_dim))
                };
                let (k, v) = (repeat(k)?, repeat(v)?);
                let scale = 1.0 / (c.head_dim as f64).sqrt();
                let att = (q.matmul(&k.t()?)? * scale)?;
                let mask = self.causal.narrow(0, 0, s)?.narrow(1, 0, s)?.to_dtype(att.dtype())?;
                let att = ops::softmax_last_dim(&att.broadcast_add(&mask)?)?;
                att.matmul(&v)?.transpose(1, 2)?
            }
            Attention::Sdpa => {
                let q = rotary_emb::rope_thd(&q.contiguous()?, &cos, &sin)?;
                let k = rotary_emb::rope_thd(&k.contiguous()?, &cos, &sin)?;
                let opts = SdpaOptions::bshd().with_mask(SdpaMask::CausalTopLeft);
                sdpa(&q, &k, &v, &opts)?
            }
        };
        Ok(y.reshape((b, s, c.heads * c.head_dim))?)
    }

    fn forward(&self, x: &Tensor, how: Attention) -> Result<Tensor> {
        let h = ops::rms_norm(x, &self.attn_norm, self.cfg.eps)?;
        let x = (x + self.wo.forward(&self.attention(&h, how)?.to_dtype(x.dtype())?)?)?;
        let h = ops::rms_norm(&x, &self.mlp_norm, self.cfg.eps)?;
        let mlp = self.down.forward(&(ops::silu(&self.gate.forward(&h)?)? * self.up.forward(&h)?)?)?;
        Ok((x + mlp)?)
    }
}

struct Args {
    device: String,
    dtype: DType,
    seq: usize,
    batch: usize,
    reps: usize,
}

fn parse_args() -> Result<Args> {
    let mut a = Args { device: "cpu".into(), dtype: DType::F32, seq: 512, batch: 1, reps: 5 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--device" => a.device = val()?,
            "--dtype" => a.dtype = common::dtype(&val()?)?,
            "--seq" => a.seq = val()?.parse().context("--seq")?,
            "--batch" => a.batch = val()?.parse().context("--batch")?,
            "--reps" => a.reps = val()?.parse().context("--reps")?,
            other => bail!("unknown flag `{other}` (--device cpu|cuda, --dtype, --seq, --batch, --reps)"),
        }
    }
    if a.reps == 0 || a.seq == 0 || a.batch == 0 {
        bail!("--seq, --batch and --reps must be at least 1");
    }
    Ok(a)
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let dev = common::device(&args.device)?;
    let cfg = CONFIG;
    let layer = Layer::new(cfg, args.seq, args.dtype, &dev)?;
    let x = Tensor::randn(0f32, 1.0, (args.batch, args.seq, cfg.hidden), &dev)?.to_dtype(args.dtype)?;

    // Both paths against candle's attention computed in f32 from the same rounded q, k, v.
    let h = ops::rms_norm(&x, &layer.attn_norm, cfg.eps)?;
    let att_exact = layer.attention(&h, Attention::CandleF32)?;
    let layer_exact = layer.forward(&x, Attention::CandleF32)?;
    let err = |how| -> Result<(f64, f64)> {
        Ok((rel_l2(&layer.attention(&h, how)?, &att_exact)?, rel_l2(&layer.forward(&x, how)?, &layer_exact)?))
    };
    let (ours_att, ours_layer) = err(Attention::Sdpa)?;
    let (theirs_att, theirs_layer) = err(Attention::Candle)?;
    // The bar: within the dtype's tolerance, or at most candle's own error.
    let tol = tolerance(args.dtype);
    println!(
        "Llama-style layer: hidden {}, {} query heads / {} kv heads, head dim {}, MLP {}; batch {}, seq {}, {:?} on {:?}",
        cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.intermediate, args.batch, args.seq, args.dtype, dev
    );
    println!("relative L2 error against candle's attention in f32 (tolerance {tol:.1e}):");
    println!("  attention output: sdpa {ours_att:.2e}, candle {theirs_att:.2e}");
    println!("  layer output:     sdpa {ours_layer:.2e}, candle {theirs_layer:.2e}");
    if ours_att > tol.max(theirs_att) || ours_layer > tol.max(theirs_layer) {
        bail!("sdpa's output is further from the f32 attention than both the tolerance and candle's own path");
    }

    let (att_candle, att_sdpa) =
        time_pair(&dev, args.reps, || layer.attention(&h, Attention::Candle), || layer.attention(&h, Attention::Sdpa))?;
    let (layer_candle, layer_sdpa) =
        time_pair(&dev, args.reps, || layer.forward(&x, Attention::Candle), || layer.forward(&x, Attention::Sdpa))?;
    println!("median of {} interleaved runs after a warm-up (ms):", args.reps);
    println!("  attention (q/k/v projections + rope + attention): candle {att_candle:9.2}  sdpa {att_sdpa:9.2}  speedup {:.2}x", att_candle / att_sdpa);
    println!("  whole layer:                                      candle {layer_candle:9.2}  sdpa {layer_sdpa:9.2}  speedup {:.2}x", layer_candle / layer_sdpa);
    Ok(())
}
