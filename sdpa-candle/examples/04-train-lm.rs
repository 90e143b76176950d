//! Training through `sdpa`: a small transformer language model (random init, synthetic data, nothing
//! downloaded) trained with AdamW twice from the same seed, once with candle's own attention (matmul +
//! softmax + matmul under a causal mask, all of it kept for autograd) and once with `sdpa_candle::sdpa`
//! (whose backward recomputes the probabilities from the forward's log-sum-exp). It prints both loss curves
//! and fails if they part by more than the tolerance; then it measures one training step of each at a long
//! sequence length: peak memory and step time.
//!
//! ```text
//! RAYON_NUM_THREADS=2 cargo run --release -p sdpa-candle --example 04-train-lm
//! RAYON_NUM_THREADS=2 cargo run --release -p sdpa-candle --example 04-train-lm -- --steps 40 --long-seq 1024
//! cargo run --release -p sdpa-candle --features cuda --example 04-train-lm -- --device cuda
//! cargo run --release -p sdpa-candle --features cuda --example 04-train-lm -- --device cuda --steps 0 --long-seq 16384
//! ```
//!
//! The task: every sequence repeats a random block of `--period` tokens drawn from the first `--alphabet`
//! of the 256 token ids, so a token is predictable from the one `period` places back once the first block
//! has been seen. The loss is counted on those predictable positions only: it starts near ln 256 ≈ 5.5,
//! falls quickly to ln(alphabet) (3.5 for 32) as the model learns which ids occur, and below that only as
//! it learns to look back (an induction head or a positional one): no n-gram shortcut exists.
//!
//! How the runs are compared: both see bit-identical initial weights and batches (one seeded generator,
//! not candle's device RNG). First the gradients of every parameter on one batch, against candle's in
//! f32 (relative L2 per parameter): with attention in f32, sdpa's within `--grad-tol` (1e-4); in f16/bf16
//! (`--attn-dtype`, the default on CUDA, whose backward kernels are f16/bf16), at most twice candle's own
//! error in that dtype plus `--grad-tol` (1e-3), FlashAttention's rule. Then the loss curves: in f32 they
//! must agree at every printed step within `--tol` (1e-2 nats; they differ by rounding only, sdpa
//! accumulating in another order, which AdamW's normalised steps amplify a little each step). In f16/bf16
//! the two paths round differently (candle rounds scores and probabilities to the dtype, sdpa only its
//! outputs), which can move the step where the model finds the look-back by a few steps, so there the
//! bar is the final loss (mean of the last 10 steps) within `--tol` (1e-1 nats); the curves are printed.

//! How the long-sequence step is measured: each path runs in a child process of its own (this program
//! started again with `--measure`), so one path's freed memory cannot hide the other's peak. On the CPU
//! the peak is the growth of the process's resident set over the step: `VmHWM` after the step minus
//! `VmRSS` before it (from `/proc/self/status`; the high-water mark is reset through `/proc/self/clear_refs`
//! first where the kernel allows it). On CUDA it is the growth of the device memory pool candle allocates
//! from (cudarc's stream-ordered `cuMemAllocAsync`): `CU_MEMPOOL_ATTR_USED_MEM_HIGH` after the step
//! (reset before it) minus `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` before it; cuBLAS workspaces sit outside the
//! pool and are not counted. Before the baseline, the child runs one short step (`--seq`), so thread
//! pools, matmul scratch and GPU modules already exist. A step is forward + backward + the AdamW update,
//! timed as the median of `--long-reps` steps after one warm-up step (the peak covers all of them). A
//! child that fails (out of memory, say) is reported as failed, with its last error line; the other still
//! runs.

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use lm::{batch, Attention, Config, Model, Rng, Run, Task};
use std::process::Command;
use std::time::Instant;

#[allow(dead_code)] // `tolerance` and `time_pair` are for the other examples
mod common;
mod lm;

struct Args {
    device: String,
    /// Default f32 on the CPU, bf16 on CUDA (sdpa-cuda's backward runs f16 and bf16).
    attn_dtype: DType,
    seed: u64,
    steps: usize,
    every: usize,
    batch: usize,
    seq: usize,
    period: usize,
    alphabet: usize,
    lr: f64,
    /// Default by the attention dtype: f32 1e-2, f16/bf16 1e-1 (nats).
    tol: f64,
    /// `None`: by the attention dtype (f32 1e-4; f16/bf16 1e-3 on top of twice candle's own error).
    grad_tol: Option<f64>,
    long_seq: usize,
    long_batch: usize,
    long_reps: usize,
    /// Set in a child process: measure one path at the long sequence length and print one line.
    measure: Option<Attention>,
}

const USAGE: &str = "--device cpu|cuda, --attn-dtype f32|f16|bf16, --seed, --steps, --every, --batch, --seq, \
                     --period, --alphabet, --lr, --tol, --grad-tol, --long-seq (0 skips), --long-batch, --long-reps";

fn parse_args() -> Result<Args> {
    let mut a = Args {
        device: "cpu".into(),
        attn_dtype: DType::F32,
        seed: 24,
        steps: 300,
        every: 25,
        batch: 8,
        seq: 64,
        period: 16,
        alphabet: 32,
        lr: 3e-3,
        tol: 0.0,
        grad_tol: None,
        long_seq: 4096,
        long_batch: 1,
        long_reps: 2,
        measure: None,
    };
    let (mut attn_dtype, mut tol) = (None, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--device" => a.device = val()?,
            "--attn-dtype" => attn_dtype = Some(common::dtype(&val()?)?),
            "--seed" => a.seed = val()?.parse().context("--seed")?,
            // 0 skips the training comparison (the long-sequence measurement only).
            "--steps" => a.steps = val()?.parse().context("--steps")?,
            "--every" => a.every = val()?.parse().context("--every")?,
            "--batch" => a.batch = val()?.parse().context("--batch")?,
            "--seq" => a.seq = val()?.parse().context("--seq")?,
            "--period" => a.period = val()?.parse().context("--period")?,
            "--alphabet" => a.alphabet = val()?.parse().context("--alphabet")?,
            "--lr" => a.lr = val()?.parse().context("--lr")?,
            "--tol" => tol = Some(val()?.parse().context("--tol")?),
            "--grad-tol" => a.grad_tol = Some(val()?.parse().context("--grad-tol")?),
            "--long-seq" => a.long_seq = val()?.parse().context("--long-seq")?,
            "--long-batch" => a.long_batch = val()?.parse().context("--long-batch")?,
            "--long-reps" => a.long_reps = val()?.parse().context("--long-reps")?,
            "--measure" => a.measure = Some(Attention::parse(&val()?)?),
            other => bail!("unknown flag `{other}` ({USAGE})"),
        }
    }
    if a.every == 0 || a.batch == 0 || a.long_batch == 0 || a.long_reps == 0 {
        bail!("--every, --batch, --long-batch and --long-reps must be at least 1");
    }
    a.attn_dtype = attn_dtype.unwrap_or(if a.device == "cuda" { DType::BF16 } else { DType::F32 });
    a.tol = tol.unwrap_or(if a.attn_dtype == DType::F32 { 1e-2 } else { 1e-1 });
    if !(2..=256).contains(&a.alphabet) {
        bail!("--alphabet must be 2..=256 (token ids of the 256-word vocabulary), got {}", a.alphabet);
    }
    if a.period < 2 || a.seq <= a.period {
        bail!("--period must be at least 2 and below --seq (got period {}, seq {})", a.period, a.seq);
    }
    Ok(a)
}

fn config(args: &Args) -> Config {
    Config { vocab: 256, d_model: 128, heads: 4, layers: 2, ffn: 512, max_seq: args.seq.max(args.long_seq) }
}

/// How far the gradients of every parameter on one batch are from candle's in f32 (largest relative L2
/// over the parameters): sdpa's, and (when attention runs in f16/bf16) candle's own in that dtype.
struct GradAgreement {
    /// sdpa in the attention dtype against candle in f32.
    sdpa: f64,
    /// candle in the attention dtype against candle in f32 (`None` when that dtype is f32).
    candle: Option<f64>,
    /// Every parameter's sdpa error within the bar: `≤ grad_tol` (f32), or `≤ 2 ×` candle's own error in
    /// that dtype `+ grad_tol` (f16/bf16, FlashAttention's rule).
    pass: bool,
}

fn gradient_agreement(args: &Args, dev: &Device, grad_tol: f64) -> Result<GradAgreement> {
    let cfg = Config { max_seq: args.seq, ..config(args) };
    let b = batch(&mut Rng(args.seed ^ 0x5eed), args.batch, args.seq, args.period, args.alphabet, dev)?;
    let grads = |attention, dtype| -> Result<Vec<Tensor>> {
        let model = Model::new(cfg, args.seed, dev)?;
        let store = model.loss(&b, &Run::new(attention, cfg.max_seq, dtype, dev)?)?.backward()?;
        model
            .vars()
            .iter()
            .map(|v| store.get(v).cloned().with_context(|| format!("no gradient for a {:?} parameter", v.dims())))
            .collect()
    };
    let exact = grads(Attention::Candle, DType::F32)?;
    let errors =
        |got: &[Tensor]| -> Result<Vec<f64>> { got.iter().zip(&exact).map(|(a, b)| common::rel_l2(a, b)).collect() };
    let ours = errors(&grads(Attention::Sdpa, args.attn_dtype)?)?;
    let max = |e: &[f64]| e.iter().copied().fold(0f64, f64::max);
    if args.attn_dtype == DType::F32 {
        return Ok(GradAgreement { sdpa: max(&ours), candle: None, pass: ours.iter().all(|&e| e <= grad_tol) });
    }
    let theirs = errors(&grads(Attention::Candle, args.attn_dtype)?)?;
    let pass = ours.iter().zip(&theirs).all(|(&o, &t)| o <= 2.0 * t + grad_tol);
    Ok(GradAgreement { sdpa: max(&ours), candle: Some(max(&theirs)), pass })
}

/// Trains from `args.seed`; the loss of every step.
fn train(args: &Args, attention: Attention, dev: &Device) -> Result<Vec<f32>> {
    let cfg = Config { max_seq: args.seq, ..config(args) };
    let task = Task { batch: args.batch, seq: args.seq, period: args.period, alphabet: args.alphabet };
    lm::train(cfg, &task, args.seed, args.steps, args.lr, &Run::new(attention, cfg.max_seq, args.attn_dtype, dev)?, dev)
}

/// Child side of the long-sequence measurement: builds the model, runs warm-up + reps steps of one path,
/// prints `MEASURED <peak bytes or -1> <median step ms>`.
fn measure(args: &Args, attention: Attention, dev: &Device) -> Result<()> {
    let cfg = config(args);
    let model = Model::new(cfg, args.seed, dev)?;
    let run = Run::new(attention, args.long_seq, args.attn_dtype, dev)?;
    let params = ParamsAdamW { lr: args.lr, weight_decay: 0.01, ..Default::default() };
    let mut opt = AdamW::new(model.vars(), params)?;
    // A period of a quarter of the sequence keeps the task the same kind at any length.
    let period = (args.long_seq / 4).max(2);
    let b = batch(&mut Rng(args.seed), args.long_batch, args.long_seq, period, args.alphabet, dev)?;
    // One short step first, so thread pools, matmul scratch and kernel modules exist before the baseline
    // is read: the growth measured is what the long step itself needs.
    let short = batch(&mut Rng(args.seed), 1, args.seq, args.period, args.alphabet, dev)?;
    opt.backward_step(&model.loss(&short, &run)?)?;
    dev.synchronize()?;
    let peak = PeakMemory::start(dev)?;
    let mut times = Vec::with_capacity(args.long_reps);
    for i in 0..=args.long_reps {
        let t = Instant::now();
        let loss = model.loss(&b, &run)?;
        opt.backward_step(&loss)?;
        dev.synchronize()?;
        if i > 0 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    let grown = peak.growth()?.map_or(-1, |b| b as i64);
    println!("MEASURED {grown} {:.3}", times[times.len() / 2]);
    Ok(())
}

/// The peak memory growth of the measured steps (see the module docs for how, per device).
enum PeakMemory {
    /// Resident set before the steps, in bytes; `None` where `/proc/self/status` is missing.
    Cpu(Option<u64>),
    #[cfg(feature = "cuda")]
    Cuda(cuda_pool::Pool, u64),
}

impl PeakMemory {
    fn start(dev: &Device) -> Result<Self> {
        match dev {
            Device::Cpu => {
                // Reset the high-water mark to the current resident set (Linux ≥ 4.0); harmless if refused,
                // since in a fresh child the mark before the step is only the model's build-up.
                let _ = std::fs::write("/proc/self/clear_refs", "5");
                Ok(PeakMemory::Cpu(proc_status_kib("VmRSS").map(|k| k * 1024)))
            }
            #[cfg(feature = "cuda")]
            Device::Cuda(cd) => {
                let pool = cuda_pool::Pool::of(cd)?;
                pool.reset_high()?;
                let before = pool.used_current()?;
                Ok(PeakMemory::Cuda(pool, before))
            }
            other => bail!("no peak-memory measure for {other:?}"),
        }
    }

    fn growth(&self) -> Result<Option<u64>> {
        match self {
            PeakMemory::Cpu(before) => {
                Ok(before.zip(proc_status_kib("VmHWM")).map(|(b, hwm)| (hwm * 1024).saturating_sub(b)))
            }
            #[cfg(feature = "cuda")]
            PeakMemory::Cuda(pool, before) => Ok(Some(pool.used_high()?.saturating_sub(*before))),
        }
    }
}

/// One `Vm*` line of `/proc/self/status`, in KiB.
fn proc_status_kib(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key) && l[key.len()..].starts_with(':'))?;
    line[key.len() + 1..].trim().trim_end_matches("kB").trim().parse().ok()
}

/// The statistics of the device memory pool that candle's allocations come from.
#[cfg(feature = "cuda")]
mod cuda_pool {
    use anyhow::{bail, Result};
    use candle_core::cuda::cudarc::driver::sys;
    use std::ffi::c_void;

    #[derive(Debug)]
    pub struct Pool(sys::CUmemoryPool);

    impl Pool {
        /// The current pool of the device of `cd`'s stream (the default pool unless someone set another):
        /// where `cuMemAllocAsync` on that stream allocates.
        pub fn of(cd: &candle_core::CudaDevice) -> Result<Self> {
            let stream = cd.cuda_stream();
            let ctx = stream.context();
            if !ctx.has_async_alloc() {
                bail!("this device has no stream-ordered allocator, so its pool statistics say nothing");
            }
            ctx.bind_to_thread()?;
            let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
            // SAFETY: a valid device handle from a live context and a valid out-pointer.
            unsafe { sys::cuDeviceGetMemPool(&mut pool, ctx.cu_device()) }.result()?;
            Ok(Pool(pool))
        }

        fn get(&self, attr: sys::CUmemPool_attribute) -> Result<u64> {
            let mut v: u64 = 0;
            // SAFETY: the two byte-count attributes read here are `cuuint64_t`, which `v` is.
            unsafe { sys::cuMemPoolGetAttribute(self.0, attr, &mut v as *mut u64 as *mut c_void) }.result()?;
            Ok(v)
        }

        pub fn used_current(&self) -> Result<u64> {
            self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
        }

        pub fn used_high(&self) -> Result<u64> {
            self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)
        }

        /// Resets the high-water mark to the memory in use now (the driver accepts only 0 here).
        pub fn reset_high(&self) -> Result<()> {
            let mut zero: u64 = 0;
            let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH;
            // SAFETY: as in `get`; the driver reads one `cuuint64_t`.
            unsafe { sys::cuMemPoolSetAttribute(self.0, attr, &mut zero as *mut u64 as *mut c_void) }.result()?;
            Ok(())
        }
    }
}

/// Parent side: runs one child per path and reads its line; a failed child is reported, not fatal.
fn measure_in_child(args: &Args, attention: Attention) -> Result<std::result::Result<(Option<u64>, f64), String>> {
    let exe = std::env::current_exe().context("finding this program to run the measurement")?;
    let dtype = format!("{:?}", args.attn_dtype).to_lowercase();
    let out = Command::new(exe)
        .args(["--device", &args.device, "--attn-dtype", &dtype, "--measure", attention.name()])
        .args(["--seed", &args.seed.to_string(), "--long-seq", &args.long_seq.to_string()])
        .args(["--long-batch", &args.long_batch.to_string(), "--long-reps", &args.long_reps.to_string()])
        .args(["--seq", &args.seq.to_string(), "--period", &args.period.to_string()])
        .args(["--alphabet", &args.alphabet.to_string()])
        .output()
        .context("running the measurement child")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().find_map(|l| l.strip_prefix("MEASURED "));
    match (out.status.success(), line) {
        (true, Some(line)) => {
            let mut f = line.split_whitespace();
            let peak: i64 = f.next().context("peak")?.parse().context("peak")?;
            let ms: f64 = f.next().context("time")?.parse().context("time")?;
            Ok(Ok((u64::try_from(peak).ok(), ms)))
        }
        _ => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("no output");
            Ok(Err(format!("failed ({}): {last}", out.status)))
        }
    }
}

/// Trains with each attention from the same seed and prints both loss curves; the difference the
/// tolerance applies to (see the comment at its end).
fn compare_training(args: &Args, dev: &Device) -> Result<f64> {
    let t = Instant::now();
    let theirs = train(args, Attention::Candle, dev)?;
    let t_candle = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let ours = train(args, Attention::Sdpa, dev)?;
    let t_sdpa = t.elapsed().as_secs_f64();
    println!("{} AdamW steps (lr {}), loss on the predictable positions (nats):", args.steps, args.lr);
    println!("  step    candle      sdpa      |diff|");
    let mut worst = 0f64;
    for i in (0..args.steps).filter(|i| i % args.every == 0 || i + 1 == args.steps) {
        let d = (theirs[i] as f64 - ours[i] as f64).abs();
        worst = worst.max(d);
        println!("  {i:4}  {:8.4}  {:8.4}  {d:10.2e}", theirs[i], ours[i]);
    }
    let tail =
        |l: &[f32]| l[l.len().saturating_sub(10)..].iter().map(|&x| x as f64).sum::<f64>() / 10f64.min(l.len() as f64);
    let final_diff = (tail(&theirs) - tail(&ours)).abs();
    println!(
        "largest difference at the printed steps {worst:.2e}; loss {:.3} -> {:.3} (candle), {:.3} -> {:.3} (sdpa, mean of \
         the last 10 steps; difference {final_diff:.2e})",
        theirs[0],
        tail(&theirs),
        ours[0],
        tail(&ours)
    );
    println!("training time: candle {t_candle:.1} s, sdpa {t_sdpa:.1} s");
    // f32: the curves agree step by step. f16/bf16: both paths round differently (candle rounds scores and
    // probabilities to the dtype, sdpa only its outputs), which can move the step where the model finds the
    // look-back by a few steps, so the bar there is the loss both reach.
    let (measured, what) = match args.attn_dtype {
        DType::F32 => (worst, "at the printed steps"),
        _ => (final_diff, "in the final loss"),
    };
    println!("agreement {what}: {measured:.2e} nats (tolerance {:.2e})", args.tol);
    Ok(measured)
}

fn mib(b: Option<u64>) -> String {
    b.map_or("n/a".into(), |b| format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)))
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let dev = common::device(&args.device)?;
    if let Some(attention) = args.measure {
        return measure(&args, attention, &dev);
    }
    let cfg = config(&args);
    println!(
        "LM: {} layers, d_model {}, {} heads, MLP {}, vocab {}; batch {} x seq {}, period {}; attention in {:?} on {:?}",
        cfg.layers, cfg.d_model, cfg.heads, cfg.ffn, cfg.vocab, args.batch, args.seq, args.period, args.attn_dtype, dev
    );

    let grad_tol = args.grad_tol.unwrap_or(if args.attn_dtype == DType::F32 { 1e-4 } else { 1e-3 });
    let grads = gradient_agreement(&args, &dev, grad_tol)?;
    match grads.candle {
        None => println!(
            "gradients of all parameters on one batch, sdpa against candle: max relative L2 {:.2e} (tolerance {grad_tol:.0e})",
            grads.sdpa
        ),
        Some(theirs) => println!(
            "gradients of all parameters on one batch against candle in f32, max relative L2: sdpa {:.2e}, candle in {:?} \
             {theirs:.2e} (bar: each parameter's sdpa error <= 2x candle's + {grad_tol:.0e})",
            grads.sdpa, args.attn_dtype
        ),
    }

    let worst = if args.steps > 0 { compare_training(&args, &dev)? } else { 0.0 };

    if args.long_seq > 0 {
        println!(
            "one training step (forward, backward, AdamW) at batch {} x seq {}, median of {} after a warm-up, each path in its own process:",
            args.long_batch, args.long_seq, args.long_reps
        );
        for attention in [Attention::Candle, Attention::Sdpa] {
            match measure_in_child(&args, attention)? {
                Ok((peak, ms)) => {
                    println!("  {:6}  peak memory growth {:>12}  step {ms:10.1} ms", attention.name(), mib(peak))
                }
                Err(why) => println!("  {:6}  {why}", attention.name()),
            }
        }
    }

    if !grads.pass {
        bail!("the gradients through sdpa are further from candle's f32 gradients than the bar (see above)");
    }
    if worst > args.tol {
        bail!("the loss curves differ by {worst:.2e} nats (> {:.2e})", args.tol);
    }
    Ok(())
}
