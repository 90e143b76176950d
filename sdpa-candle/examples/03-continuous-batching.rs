//! Continuous batching over a paged KV cache, the way a serving engine runs a decoder: requests arrive at
//! different steps with prompts of different lengths, generate a few tokens each and leave; their K/V live
//! in fixed-size pages handed out by a free-list allocator, so a request's pages are wherever the pool had
//! room (shuffled by the churn), and pages come back the moment a request finishes.
//!
//! Every step:
//!
//! 1. admits the requests that arrived (when the pool can hold their whole life) and **prefills** them in
//!    one ragged call, [`sdpa_varlen`] over their packed prompts (each prompt causal on its own);
//! 2. writes the prompts' K/V into their pages with [`append_to_pages`];
//! 3. **decodes** one token for every running request in one paged call, [`sdpa_paged`] (each query reads
//!    its own pages through the block table; the new token's K/V is appended first);
//! 4. frees the pages of the requests that are done.
//!
//! The model is a small decoder with random weights (nothing downloaded): token embeddings, `--layers`
//! attention layers (8 query heads sharing 2 kv heads, head dim 64; no positional encoding, no MLP), and
//! the embeddings again as the output head; the next token is the argmax. Every attention output of every
//! step is checked against dense per-request attention computed by candle's own ops (matmul, softmax,
//! matmul in f32, bottom-right causal mask) on that request's K/V gathered back out of the pages, which
//! also checks the appends. Each step prints its batch and the largest error; the run fails if an error
//! exceeds sdpa's tolerance for the dtype.
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release -p sdpa-candle --example 03-continuous-batching
//! cargo run --release -p sdpa-candle --features cuda --example 03-continuous-batching -- --device cuda --dtype bf16
//! ```

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use sdpa_candle::{append_to_pages, sdpa_paged, sdpa_varlen, SdpaMask, SdpaOptions};

#[allow(dead_code)] // `time_pair` is for the timed examples
mod common;
use common::{rel_l2, tolerance};

/// Query heads, kv heads, head dim.
const HQ: usize = 8;
const HKV: usize = 2;
const HEAD_DIM: usize = 64;
const HIDDEN: usize = HQ * HEAD_DIM;
const VOCAB: usize = 1000;

struct Args {
    device: String,
    dtype: DType,
    layers: usize,
    page_size: usize,
    pages: usize,
}

fn parse_args() -> Result<Args> {
    let mut a = Args { device: "cpu".into(), dtype: DType::F32, layers: 2, page_size: 16, pages: 8 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--device" => a.device = val()?,
            "--dtype" => a.dtype = common::dtype(&val()?)?,
            "--layers" => a.layers = val()?.parse().context("--layers")?,
            "--page-size" => a.page_size = val()?.parse().context("--page-size")?,
            "--pages" => a.pages = val()?.parse().context("--pages")?,
            other => bail!(
                "unknown flag `{other}` (--device cpu|cuda, --dtype f32|f16|bf16, --layers, --page-size, --pages)"
            ),
        }
    }
    if a.layers == 0 || a.page_size == 0 || a.pages == 0 {
        bail!("--layers, --page-size and --pages must be at least 1");
    }
    Ok(a)
}

/// A free list of page indices. Pages return in the order requests finish, so a later request's pages are
/// scattered over the pool.
struct PageAllocator {
    free: Vec<u32>,
    /// Pages promised to admitted requests but not yet handed out (so decoding never runs out).
    promised: usize,
}

impl PageAllocator {
    fn new(pages: usize) -> Self {
        PageAllocator { free: (0..pages as u32).rev().collect(), promised: 0 }
    }

    /// Admits a request that will need `pages` pages over its life, if the pool can promise them.
    fn reserve(&mut self, pages: usize) -> bool {
        let ok = self.free.len() >= self.promised + pages;
        if ok {
            self.promised += pages;
        }
        ok
    }

    fn take(&mut self) -> Result<u32> {
        self.promised = self.promised.saturating_sub(1);
        self.free.pop().context("the page pool ran dry (a promise was broken)")
    }

    fn give_back(&mut self, pages: &[u32], unused_promises: usize) {
        self.free.extend(pages.iter().rev());
        self.promised -= unused_promises;
    }
}

/// One request: its prompt, when it arrives, how many tokens it generates, and its place in the cache.
struct Request {
    id: usize,
    prompt: Vec<u32>,
    arrives: usize,
    max_new: usize,
    /// Its pages, in order (the block-table row).
    pages: Vec<u32>,
    /// Tokens whose K/V are in the cache.
    cached: usize,
    /// The token to feed next (the last one generated).
    next: u32,
    generated: usize,
}

impl Request {
    fn life_pages(&self, page_size: usize) -> usize {
        (self.prompt.len() + self.max_new).div_ceil(page_size)
    }
}

/// Arrival steps, prompt lengths and generation lengths: requests that overlap, start late and leave early.
fn workload(seed: u64) -> Vec<Request> {
    let plan = [(0, 13, 6), (0, 5, 9), (1, 40, 3), (2, 1, 7), (2, 22, 5), (4, 17, 8), (5, 9, 2), (6, 33, 4)];
    let mut x = seed;
    let mut token = move || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((x >> 33) % VOCAB as u64) as u32
    };
    plan.iter()
        .enumerate()
        .map(|(id, &(arrives, len, max_new))| Request {
            id,
            prompt: (0..len).map(|_| token()).collect(),
            arrives,
            max_new,
            pages: Vec::new(),
            cached: 0,
            next: 0,
            generated: 0,
        })
        .collect()
}

/// One attention layer's weights and its share of the paged cache.
struct Layer {
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    /// `[num_pages, page_size, Hkv, D]` (NHD).
    k_pages: Tensor,
    v_pages: Tensor,
}

struct Model {
    embed: Tensor,
    layers: Vec<Layer>,
    page_size: usize,
    dtype: DType,
}

impl Model {
    fn new(args: &Args, dev: &Device) -> Result<Self> {
        let w = |rows: usize, cols: usize| -> Result<Tensor> {
            Ok((Tensor::randn(0f32, 1.0, (rows, cols), dev)? / (rows as f64).sqrt())?.to_dtype(args.dtype)?)
        };
        let layers = (0..args.layers)
            .map(|_| -> Result<Layer> {
                let pages = || Tensor::zeros((args.pages, args.page_size, HKV, HEAD_DIM), args.dtype, dev);
                Ok(Layer {
                    wq: w(HIDDEN, HQ * HEAD_DIM)?,
                    wk: w(HIDDEN, HKV * HEAD_DIM)?,
                    wv: w(HIDDEN, HKV * HEAD_DIM)?,
                    wo: w(HQ * HEAD_DIM, HIDDEN)?,
                    k_pages: pages()?,
                    v_pages: pages()?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Model { embed: w(VOCAB, HIDDEN)?, layers, page_size: args.page_size, dtype: args.dtype })
    }
}

/// The integer tables of one call over `batch` (indices into `reqs`) with `new[b]` new tokens each.
struct Tables {
    cu_new: Tensor,
    block_table: Tensor,
    cached_before: Tensor,
    cached_after: Tensor,
}

/// They stay on the host whatever the model's device: sdpa reads them there anyway, and a host tensor
/// costs no wait for the GPU.
fn tables(reqs: &[Request], batch: &[usize], new: &[usize]) -> Result<Tables> {
    let dev = &Device::Cpu;
    let mut cu = vec![0u32];
    for &n in new {
        cu.push(cu[cu.len() - 1] + n as u32);
    }
    let width = batch.iter().map(|&r| reqs[r].pages.len()).max().unwrap_or(0).max(1);
    // Columns past a request's last page are never read: fill them with a value that is no page.
    let mut table = vec![u32::MAX; batch.len() * width];
    for (row, &r) in batch.iter().enumerate() {
        table[row * width..row * width + reqs[r].pages.len()].copy_from_slice(&reqs[r].pages);
    }
    let before: Vec<u32> = batch.iter().map(|&r| reqs[r].cached as u32).collect();
    let after: Vec<u32> = batch.iter().zip(new).map(|(&r, &n)| (reqs[r].cached + n) as u32).collect();
    Ok(Tables {
        cu_new: Tensor::new(cu.as_slice(), dev)?,
        block_table: Tensor::from_vec(table, (batch.len(), width), dev)?,
        cached_before: Tensor::new(before.as_slice(), dev)?,
        cached_after: Tensor::new(after.as_slice(), dev)?,
    })
}

/// Candle's own attention for one request: `q` `[sq, Hq, D]` against its `[sk, Hkv, D]` K/V, bottom-right
/// causal, in f32. Returns `[sq, Hq, D]`.
fn dense_attention(q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
    let heads_first = |t: &Tensor| -> Result<Tensor> { Ok(t.to_dtype(DType::F32)?.transpose(0, 1)?.contiguous()?) };
    let (q, k, v) = (heads_first(q)?, heads_first(k)?, heads_first(v)?);
    let (sq, sk) = (q.dim(1)?, k.dim(1)?);
    let repeat = |t: Tensor| -> Result<Tensor> {
        Ok(t.unsqueeze(1)?.expand((HKV, HQ / HKV, sk, HEAD_DIM))?.reshape((HQ, sk, HEAD_DIM))?)
    };
    let (k, v) = (repeat(k)?, repeat(v)?);
    let mask: Vec<f32> =
        (0..sq * sk).map(|x| if x % sk > x / sk + sk - sq { f32::NEG_INFINITY } else { 0.0 }).collect();
    let mask = Tensor::from_vec(mask, (sq, sk), q.device())?;
    let att = (q.matmul(&k.t()?)? / (HEAD_DIM as f64).sqrt())?.broadcast_add(&mask)?;
    let att = candle_nn::ops::softmax_last_dim(&att)?;
    Ok(att.matmul(&v)?.transpose(0, 1)?)
}

/// A request's first `len` keys and values gathered out of a layer's pages, `[len, Hkv, D]` each.
fn gather(layer: &Layer, pages: &[u32], len: usize, page_size: usize) -> Result<(Tensor, Tensor)> {
    let slots: Vec<u32> = (0..len).map(|j| pages[j / page_size] * page_size as u32 + (j % page_size) as u32).collect();
    let slots = Tensor::new(slots.as_slice(), layer.k_pages.device())?;
    let pool = layer.k_pages.dim(0)? * page_size;
    let pick = |p: &Tensor| -> Result<Tensor> { Ok(p.reshape((pool, HKV, HEAD_DIM))?.index_select(&slots, 0)?) };
    Ok((pick(&layer.k_pages)?, pick(&layer.v_pages)?))
}

/// What one step's checks found: the largest relative L2 error and absolute difference.
#[derive(Default)]
struct Errors {
    rel: f64,
    abs: f64,
}

impl Errors {
    fn add(&mut self, got: &Tensor, want: &Tensor) -> Result<()> {
        let got = got.to_dtype(DType::F32)?;
        self.rel = self.rel.max(rel_l2(&got, want)?);
        self.abs = self.abs.max(f64::from((got - want)?.abs()?.max_all()?.to_scalar::<f32>()?));
        Ok(())
    }
}

/// Runs `new[b]` tokens of each request of `batch` through the layers: projections, append to the pages,
/// one ragged attention call per layer (varlen over the packed new K/V when `prefill`, else paged over the
/// cache), each output checked against dense attention per request. Returns the next token of each.
fn forward(
    model: &Model,
    reqs: &[Request],
    batch: &[usize],
    tokens: &[u32],
    new: &[usize],
    prefill: bool,
    errors: &mut Errors,
) -> Result<Vec<u32>> {
    let dev = model.embed.device().clone();
    let t = tables(reqs, batch, new)?;
    let n = tokens.len();
    let mut x = model.embed.index_select(&Tensor::new(tokens, &dev)?, 0)?; // [n, hidden]
    let opts = SdpaOptions::bshd().with_mask(SdpaMask::CausalBottomRight);
    for layer in &model.layers {
        let q = x.matmul(&layer.wq)?.reshape((n, HQ, HEAD_DIM))?;
        let k = x.matmul(&layer.wk)?.reshape((n, HKV, HEAD_DIM))?;
        let v = x.matmul(&layer.wv)?.reshape((n, HKV, HEAD_DIM))?;
        append_to_pages(&k, &v, &layer.k_pages, &layer.v_pages, &t.block_table, &t.cached_before, &t.cu_new)?;
        let o = if prefill {
            // The prompts attend to themselves: their packed K/V, no cache before them.
            sdpa_varlen(&q, &k, &v, &t.cu_new, &t.cu_new, &opts)?
        } else {
            sdpa_paged(&q, &layer.k_pages, &layer.v_pages, &t.cu_new, &t.block_table, &t.cached_after, &opts)?
        };
        let mut row = 0;
        for (&r, &len) in batch.iter().zip(new) {
            let req = &reqs[r];
            let (kc, vc) = gather(layer, &req.pages, req.cached + len, model.page_size)?;
            errors.add(&o.narrow(0, row, len)?, &dense_attention(&q.narrow(0, row, len)?, &kc, &vc)?)?;
            row += len;
        }
        let out = o.reshape((n, HIDDEN))?.matmul(&layer.wo)?;
        // A residual and an RMS normalisation keep the activations in range through the random layers.
        x = (x + out)?;
        let rms = x.to_dtype(DType::F32)?.sqr()?.mean_keepdim(1)?.sqrt()?.to_dtype(model.dtype)?;
        x = x.broadcast_div(&rms)?;
    }
    // The last row of each request predicts its next token.
    let mut last = Vec::with_capacity(batch.len());
    let mut end = 0;
    for &len in new {
        end += len;
        last.push((end - 1) as u32);
    }
    let h = x.index_select(&Tensor::new(last.as_slice(), &dev)?, 0)?;
    Ok(h.matmul(&model.embed.t()?)?.argmax(1)?.to_dtype(DType::U32)?.to_vec1::<u32>()?)
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("03-continuous-batching: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args = parse_args()?;
    let dev = common::device(&args.device)?;
    let model = Model::new(&args, &dev)?;
    let mut reqs = workload(23);
    let mut pool = PageAllocator::new(args.pages);
    let (mut waiting, mut running): (Vec<usize>, Vec<usize>) = ((0..reqs.len()).collect(), Vec::new());
    let tol = tolerance(args.dtype);
    if let Some(r) = reqs.iter().find(|r| r.life_pages(args.page_size) > args.pages) {
        bail!(
            "request {} needs {} pages over its life but the pool has {}; raise --pages",
            r.id,
            r.life_pages(args.page_size),
            args.pages
        );
    }
    println!(
        "{} requests, {} layers, Hq {HQ} / Hkv {HKV}, D {HEAD_DIM}, {:?} on {}; {} pages of {} slots",
        reqs.len(),
        args.layers,
        args.dtype,
        args.device,
        args.pages,
        args.page_size
    );
    println!("step  admitted  prefill rows  decoding  finished  pages used  max rel err  max abs err");
    let mut step = 0;
    while !waiting.is_empty() || !running.is_empty() {
        let mut errors = Errors::default();
        // 1-2. Admit what arrived and fits; prefill it in one varlen call, K/V appended to its pages.
        let mut admitted = Vec::new();
        waiting.retain(|&r| {
            let fits = reqs[r].arrives <= step && pool.reserve(reqs[r].life_pages(args.page_size));
            if fits {
                admitted.push(r);
            }
            !fits
        });
        let prefill_rows: usize = admitted.iter().map(|&r| reqs[r].prompt.len()).sum();
        if !admitted.is_empty() {
            for &r in &admitted {
                let need = reqs[r].prompt.len().div_ceil(args.page_size);
                reqs[r].pages = (0..need).map(|_| pool.take()).collect::<Result<_>>()?;
            }
            let tokens: Vec<u32> = admitted.iter().flat_map(|&r| reqs[r].prompt.clone()).collect();
            let lens: Vec<usize> = admitted.iter().map(|&r| reqs[r].prompt.len()).collect();
            let next = forward(&model, &reqs, &admitted, &tokens, &lens, true, &mut errors)?;
            for (&r, tok) in admitted.iter().zip(next) {
                let req = &mut reqs[r];
                (req.cached, req.next, req.generated) = (req.prompt.len(), tok, 1);
            }
            running.extend(&admitted);
        }
        // 3. Decode one token for every running request that still has one to make, in one paged call.
        let decoding: Vec<usize> = running.iter().copied().filter(|&r| reqs[r].generated < reqs[r].max_new).collect();
        if !decoding.is_empty() {
            for &r in &decoding {
                if reqs[r].cached == reqs[r].pages.len() * args.page_size {
                    let page = pool.take()?;
                    reqs[r].pages.push(page);
                }
            }
            let tokens: Vec<u32> = decoding.iter().map(|&r| reqs[r].next).collect();
            let next = forward(&model, &reqs, &decoding, &tokens, &vec![1; decoding.len()], false, &mut errors)?;
            for (&r, tok) in decoding.iter().zip(next) {
                let req = &mut reqs[r];
                (req.cached, req.next, req.generated) = (req.cached + 1, tok, req.generated + 1);
            }
        }
        // 4. Free the pages of the requests that are done.
        let in_use = args.pages - pool.free.len();
        let mut finished = Vec::new();
        running.retain(|&r| {
            let req = &reqs[r];
            let done = req.generated >= req.max_new;
            if done {
                pool.give_back(&req.pages, req.life_pages(args.page_size) - req.pages.len());
                finished.push(req.id);
            }
            !done
        });
        let ids = |v: &[usize]| if v.is_empty() { "-".to_string() } else { format!("{v:?}") };
        println!(
            "{step:>4}  {:>8}  {prefill_rows:>12}  {:>8}  {:>8}  {in_use:>10}  {:>11.2e}  {:>11.2e}",
            ids(&admitted),
            decoding.len(),
            ids(&finished),
            errors.rel,
            errors.abs
        );
        if errors.rel > tol {
            bail!("step {step}: relative error {:.3e} above the {:?} tolerance {tol:.1e}", errors.rel, args.dtype);
        }
        step += 1;
    }
    println!(
        "all {} requests done in {step} steps; every attention output within {tol:.1e} of dense attention",
        reqs.len()
    );
    Ok(())
}
