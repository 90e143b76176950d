//! The model and task of `04-train-lm` (also compiled into `tests/train.rs` through `#[path]`): a small
//! pre-norm transformer LM with random init, its attention either candle's own or `sdpa_candle::sdpa`, and
//! the synthetic look-back task. The example's docs say what the task is and why it is learnable.

use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor, Var, D};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use sdpa_candle::{sdpa, SdpaMask, SdpaOptions};

/// Sizes of the model.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub vocab: usize,
    pub d_model: usize,
    pub heads: usize,
    pub layers: usize,
    /// Hidden width of the MLP.
    pub ffn: usize,
    /// Positions the learned position table covers.
    pub max_seq: usize,
}

/// Which attention the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attention {
    /// candle's own: `[B, H, S, S]` scores, additive causal mask, `candle_nn::ops::softmax`, all kept for
    /// autograd (the composed softmax, since `softmax_last_dim` has no backward).
    Candle,
    /// One `sdpa_candle::sdpa` call on `[B, S, H, D]`, causal.
    Sdpa,
}

impl Attention {
    pub fn name(self) -> &'static str {
        match self {
            Attention::Candle => "candle",
            Attention::Sdpa => "sdpa",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "candle" => Ok(Attention::Candle),
            "sdpa" => Ok(Attention::Sdpa),
            other => bail!("unknown attention `{other}` (candle or sdpa)"),
        }
    }
}

/// splitmix64: one seeded stream for weights and data, so both runs start from bit-identical weights and
/// see the same batches whatever candle's device RNGs do.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

/// A `rows x cols` weight drawn N(0, std²).
pub fn weight(rng: &mut Rng, rows: usize, cols: usize, std: f64, dev: &Device) -> Result<Var> {
    let w: Vec<f32> = (0..rows * cols).map(|_| (rng.normal() * std) as f32).collect();
    Ok(Var::from_tensor(&Tensor::from_vec(w, (rows, cols), dev)?)?)
}

pub fn ones(n: usize, dev: &Device) -> Result<Var> {
    Ok(Var::from_tensor(&Tensor::ones(n, DType::F32, dev)?)?)
}

/// One pre-norm transformer block.
pub struct Block {
    pub norm1: Var,
    pub wq: Var,
    pub wk: Var,
    pub wv: Var,
    pub wo: Var,
    pub norm2: Var,
    pub w1: Var,
    pub w2: Var,
}

pub struct Model {
    pub cfg: Config,
    pub emb: Var,
    pub pos: Var,
    pub blocks: Vec<Block>,
    pub norm_f: Var,
    pub head: Var,
}

/// RMSNorm from candle ops that have a backward (`candle_nn::ops::rms_norm` has none).
pub fn rms_norm(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    Ok(x.broadcast_div(&(ms + 1e-5)?.sqrt()?)?.broadcast_mul(w)?)
}

/// `x · wᵀ` for `x` `[B, S, in]` and `w` `[out, in]`.
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    Ok(x.broadcast_matmul(&w.t()?)?)
}

impl Model {
    pub fn new(cfg: Config, seed: u64, dev: &Device) -> Result<Self> {
        let mut rng = Rng(seed);
        let d = cfg.d_model;
        let std = 1.0 / (d as f64).sqrt();
        let mut blocks = Vec::with_capacity(cfg.layers);
        for _ in 0..cfg.layers {
            blocks.push(Block {
                norm1: ones(d, dev)?,
                wq: weight(&mut rng, d, d, std, dev)?,
                wk: weight(&mut rng, d, d, std, dev)?,
                wv: weight(&mut rng, d, d, std, dev)?,
                // Residual branches start small (GPT-2's scaling), so the stack trains from step 0.
                wo: weight(&mut rng, d, d, std / (2.0 * cfg.layers as f64).sqrt(), dev)?,
                norm2: ones(d, dev)?,
                w1: weight(&mut rng, cfg.ffn, d, std, dev)?,
                w2: weight(&mut rng, d, cfg.ffn, 1.0 / (cfg.ffn as f64 * 2.0 * cfg.layers as f64).sqrt(), dev)?,
            });
        }
        Ok(Model {
            cfg,
            emb: weight(&mut rng, cfg.vocab, d, 1.0, dev)?,
            pos: weight(&mut rng, cfg.max_seq, d, 0.5, dev)?,
            blocks,
            norm_f: ones(d, dev)?,
            head: weight(&mut rng, cfg.vocab, d, std, dev)?,
        })
    }

    pub fn vars(&self) -> Vec<Var> {
        let mut v = vec![self.emb.clone(), self.pos.clone(), self.norm_f.clone(), self.head.clone()];
        for b in &self.blocks {
            v.extend([&b.norm1, &b.wq, &b.wk, &b.wv, &b.wo, &b.norm2, &b.w1, &b.w2].map(|x| x.clone()));
        }
        v
    }

    /// Causal self-attention of `h` `[B, S, d_model]`, in `dtype`, before the output projection.
    pub fn attention(&self, blk: &Block, h: &Tensor, how: &Run) -> Result<Tensor> {
        let (b, s, d) = h.dims3()?;
        let (nh, hd) = (self.cfg.heads, d / self.cfg.heads);
        let proj = |w: &Var| -> Result<Tensor> { Ok(linear(h, w)?.reshape((b, s, nh, hd))?.to_dtype(how.dtype)?) };
        let (q, k, v) = (proj(&blk.wq)?, proj(&blk.wk)?, proj(&blk.wv)?);
        let y = match &how.mask {
            // candle-transformers' way: BHSD copies, scores materialised, mask added, softmax, matmul.
            Some(mask) => {
                let bhsd = |t: Tensor| t.transpose(1, 2)?.contiguous();
                let (q, k, v) = (bhsd(q)?, bhsd(k)?, bhsd(v)?);
                let att = (q.matmul(&k.t()?)? * (1.0 / (hd as f64).sqrt()))?;
                let att = att.broadcast_add(&mask.narrow(0, 0, s)?.narrow(1, 0, s)?)?;
                let p = candle_nn::ops::softmax(&att, D::Minus1)?;
                p.matmul(&v)?.transpose(1, 2)?
            }
            None => sdpa(&q, &k, &v, &SdpaOptions::bshd().with_mask(SdpaMask::CausalTopLeft))?,
        };
        Ok(y.to_dtype(DType::F32)?.reshape((b, s, d))?)
    }

    /// Logits `[B, S, vocab]` of token ids `[B, S]`.
    pub fn forward(&self, tokens: &Tensor, how: &Run) -> Result<Tensor> {
        let (b, s) = tokens.dims2()?;
        let emb = self.emb.embedding(&tokens.flatten_all()?)?.reshape((b, s, self.cfg.d_model))?;
        let mut x = emb.broadcast_add(&self.pos.narrow(0, 0, s)?)?;
        for blk in &self.blocks {
            let a = self.attention(blk, &rms_norm(&x, &blk.norm1)?, how)?;
            x = (x + linear(&a, &blk.wo)?)?;
            let h = rms_norm(&x, &blk.norm2)?;
            x = (&x + linear(&linear(&h, &blk.w1)?.gelu_erf()?, &blk.w2)?)?;
        }
        linear(&rms_norm(&x, &self.norm_f)?, &self.head)
    }

    /// Mean cross-entropy over the predictable positions (`period - 1` onwards).
    pub fn loss(&self, batch: &Batch, how: &Run) -> Result<Tensor> {
        let logits = self.forward(&batch.inputs, how)?;
        let (b, s, v) = logits.dims3()?;
        let from = batch.period - 1;
        let logits = logits.narrow(1, from, s - from)?.reshape((b * (s - from), v))?;
        let targets = batch.targets.narrow(1, from, s - from)?.flatten_all()?;
        Ok(candle_nn::loss::cross_entropy(&logits, &targets)?)
    }
}

/// How attention runs: candle's (with its cached additive causal mask) or sdpa, in `dtype`.
pub struct Run {
    /// The additive causal mask `[max_seq, max_seq]` in `dtype` for candle's path, built once as
    /// candle-transformers' models cache theirs (so no step is charged for building it).
    pub mask: Option<Tensor>,
    /// Dtype of q, k, v and the attention math (the rest of the model is f32).
    pub dtype: DType,
}

impl Run {
    pub fn new(attention: Attention, max_seq: usize, dtype: DType, dev: &Device) -> Result<Self> {
        let mask = match attention {
            Attention::Sdpa => None,
            Attention::Candle => {
                let m: Vec<f32> = (0..max_seq * max_seq)
                    .map(|x| if x % max_seq > x / max_seq { f32::NEG_INFINITY } else { 0.0 })
                    .collect();
                Some(Tensor::from_vec(m, (max_seq, max_seq), dev)?.to_dtype(dtype)?)
            }
        };
        Ok(Run { mask, dtype })
    }
}

/// Token ids `[B, S]` and their next tokens.
pub struct Batch {
    pub inputs: Tensor,
    pub targets: Tensor,
    pub period: usize,
}

/// `batch` sequences of `seq + 1` tokens, each a random block of `period` ids below `alphabet` repeated.
pub fn batch(rng: &mut Rng, batch: usize, seq: usize, period: usize, alphabet: usize, dev: &Device) -> Result<Batch> {
    let mut ids = Vec::with_capacity(batch * (seq + 1));
    for _ in 0..batch {
        let block: Vec<u32> = (0..period).map(|_| (rng.next_u64() % alphabet as u64) as u32).collect();
        ids.extend((0..=seq).map(|i| block[i % period]));
    }
    let all = Tensor::from_vec(ids, (batch, seq + 1), dev)?;
    Ok(Batch { inputs: all.narrow(1, 0, seq)?, targets: all.narrow(1, 1, seq)?, period })
}

/// The data of a training run: batches of `seq` tokens repeating blocks of `period` ids below `alphabet`.
#[derive(Debug, Clone, Copy)]
pub struct Task {
    pub batch: usize,
    pub seq: usize,
    pub period: usize,
    pub alphabet: usize,
}

/// Trains a model of `cfg` from `seed` with AdamW (`lr`, weight decay 0.01) for `steps` steps; the loss of
/// every step. The same seed gives the same initial weights and batches for either attention.
pub fn train(cfg: Config, task: &Task, seed: u64, steps: usize, lr: f64, run: &Run, dev: &Device) -> Result<Vec<f32>> {
    let model = Model::new(cfg, seed, dev)?;
    let params = ParamsAdamW { lr, weight_decay: 0.01, ..Default::default() };
    let mut opt = AdamW::new(model.vars(), params)?;
    let mut data = Rng(seed ^ 0xda7a);
    let mut losses = Vec::with_capacity(steps);
    for _ in 0..steps {
        let b = batch(&mut data, task.batch, task.seq, task.period, task.alphabet, dev)?;
        let loss = model.loss(&b, run)?;
        opt.backward_step(&loss)?;
        losses.push(loss.to_scalar::<f32>()?);
    }
    Ok(losses)
}
