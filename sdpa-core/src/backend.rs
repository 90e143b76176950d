//! The `Backend` trait every implementation (reference, CPU, CUDA) stands behind.
//!
//! Two levels: [`Backend`] works on the backend's own buffers (device memory for CUDA), so benchmarks and
//! candle can run without host copies; [`HostBackend`] is its object-safe convenience on host tensors, with
//! output poisoning and timing, which the CLI and tests use through `Box<dyn HostBackend>`.

use crate::backward::{BackwardOptions, BackwardRun, GradInputs, HostGradients, Pass};
use crate::dtype::DType;
use crate::error::{Result, SdpaError};
use crate::record::ProgramLoad;
use crate::spec::{AttentionSpec, Operand};
use crate::tensor::{HostBuffer, HostInputs, HostOutput};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::time::Instant;

/// Kernel families; the same name means the same idea on every backend (DESIGN.md, "Kernels").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kernel {
    /// Materialise the scores, softmax, multiply by V: what eager models run.
    Unfused,
    /// FlashAttention-1 structure (CUDA, SIMT).
    Fa1,
    /// FlashAttention-2 structure: the fused tiled kernel.
    Fa2,
    /// Flash-decoding: keys split across workers, partial states merged.
    SplitKv,
    /// The backend picks per spec; `forward` reports which kernel it ran.
    Auto,
    /// The Hopper forward (CUDA, sm_90: TMA, `wgmma`, warp specialisation); `auto` picks it there where it was
    /// measured faster than `fa2`.
    Fa3,
}

impl Kernel {
    /// All kernel names.
    pub const ALL: [Kernel; 6] =
        [Kernel::Unfused, Kernel::Fa1, Kernel::Fa2, Kernel::SplitKv, Kernel::Auto, Kernel::Fa3];

    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Unfused => "unfused",
            Kernel::Fa1 => "fa1",
            Kernel::Fa2 => "fa2",
            Kernel::SplitKv => "splitkv",
            Kernel::Auto => "auto",
            Kernel::Fa3 => "fa3",
        }
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kernel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "unfused" => Ok(Kernel::Unfused),
            "fa1" => Ok(Kernel::Fa1),
            "fa2" => Ok(Kernel::Fa2),
            "splitkv" | "split-kv" => Ok(Kernel::SplitKv),
            "auto" => Ok(Kernel::Auto),
            "fa3" => Ok(Kernel::Fa3),
            other => Err(format!("unknown kernel `{other}` (expected unfused, fa1, fa2, splitkv, auto or fa3)")),
        }
    }
}

/// How f32 inputs are multiplied. Only the CUDA tensor-core paths use anything but `Exact`; every result
/// record carries it so a TF32 figure is never mistaken for an fp32 one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum F32Math {
    /// IEEE f32 products and sums.
    #[default]
    Exact,
    /// TF32 tensor cores (10-bit mantissa products, f32 accumulation): about 3e-4 relative error.
    Tf32,
    /// Split TF32 (3 TF32 products per f32 product): near-f32 accuracy on tensor cores.
    SplitTf32,
}

impl F32Math {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            F32Math::Exact => "exact",
            F32Math::Tf32 => "tf32",
            F32Math::SplitTf32 => "split-tf32",
        }
    }
}

impl FromStr for F32Math {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "exact" | "ieee" | "fp32" => Ok(F32Math::Exact),
            "tf32" => Ok(F32Math::Tf32),
            "split-tf32" | "3xtf32" => Ok(F32Math::SplitTf32),
            other => Err(format!("unknown f32 math `{other}` (expected exact, tf32 or split-tf32)")),
        }
    }
}

/// How to run one forward call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunOptions {
    /// Which kernel.
    pub kernel: Kernel,
    /// f32 multiplication mode.
    pub f32_math: F32Math,
    /// Worker threads for CPU backends; `None` uses the global pool (`RAYON_NUM_THREADS`).
    pub threads: Option<usize>,
    /// Also write the log-sum-exp per query row.
    pub lse: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions { kernel: Kernel::Auto, f32_math: F32Math::Exact, threads: None, lse: false }
    }
}

/// Mask families a backend handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaskKind {
    /// No mask.
    None,
    /// Causal, top-left.
    CausalTopLeft,
    /// Causal, bottom-right.
    CausalBottomRight,
    /// Explicit boolean or additive mask.
    Explicit,
}

impl MaskKind {
    /// The family of a spec's mask.
    pub fn of(mask: &crate::spec::Mask) -> Self {
        use crate::spec::Mask;
        match mask {
            Mask::None => MaskKind::None,
            Mask::CausalTopLeft => MaskKind::CausalTopLeft,
            Mask::CausalBottomRight => MaskKind::CausalBottomRight,
            Mask::Explicit(_) => MaskKind::Explicit,
        }
    }

    /// Every family.
    pub const ALL: [MaskKind; 4] =
        [MaskKind::None, MaskKind::CausalTopLeft, MaskKind::CausalBottomRight, MaskKind::Explicit];
}

/// What a backend can run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Element types.
    pub dtypes: Vec<DType>,
    /// Kernel families (besides `auto`, which every backend accepts).
    pub kernels: Vec<Kernel>,
    /// Largest head dim (D and Dv) any kernel accepts.
    pub max_head_dim: usize,
    /// Head dims with specialised fast paths; others take a generic path.
    pub fast_head_dims: Vec<usize>,
    /// Mask families.
    pub masks: Vec<MaskKind>,
    /// f32 multiplication modes.
    pub f32_math: Vec<F32Math>,
    /// Variants (window, softcap, ALiBi) some kernel of the backend honours; `auto` picks one that does.
    #[serde(default)]
    pub variants: Vec<crate::variants::Variant>,
    /// Serving layouts (ragged batches, paged KV caches) some kernel of the backend honours.
    #[serde(default)]
    pub serving: Vec<crate::ragged::Serving>,
    /// Kernels that have a backward pass (empty: the backend is forward-only); `auto` picks one of them.
    #[serde(default)]
    pub backward: Vec<Kernel>,
}

impl Capabilities {
    /// Returns `Unsupported` when the request is outside these capabilities.
    pub fn check(&self, backend: &'static str, spec: &AttentionSpec, opts: &RunOptions) -> Result<()> {
        let unsupported = |what: String| Err(SdpaError::Unsupported { backend, what });
        if !self.dtypes.contains(&spec.dtype) {
            return unsupported(format!("dtype {}", spec.dtype));
        }
        if opts.kernel != Kernel::Auto && !self.kernels.contains(&opts.kernel) {
            return unsupported(format!("kernel {}", opts.kernel));
        }
        let hd = spec.shape.d.max(spec.shape.dv);
        if hd > self.max_head_dim {
            return unsupported(format!("head dim {hd} (at most {})", self.max_head_dim));
        }
        if !self.masks.contains(&MaskKind::of(&spec.mask)) {
            return unsupported(format!("mask {}", spec.mask.name()));
        }
        if spec.dtype == DType::F32 && !self.f32_math.contains(&opts.f32_math) {
            return unsupported(format!("f32 math {}", opts.f32_math.name()));
        }
        if let Some(v) = spec.variants.kinds().into_iter().find(|v| !self.variants.contains(v)) {
            return unsupported(format!("the {} variant", v.name()));
        }
        if let Some(l) = crate::ragged::Serving::of(spec).filter(|l| !self.serving.contains(l)) {
            return unsupported(format!("{} batches", l.name()));
        }
        Ok(())
    }

    /// [`Self::check`] for a backward call: also refuses backends and kernels without a backward, and
    /// what no backward runs (paged KV caches, [`crate::backward::validate_backward`]).
    pub fn check_backward(&self, backend: &'static str, spec: &AttentionSpec, opts: &RunOptions) -> Result<()> {
        self.check(backend, spec, opts)?;
        crate::backward::validate_backward(spec)?;
        let unsupported = |what: String| Err(SdpaError::Unsupported { backend, what });
        if self.backward.is_empty() {
            return unsupported("the backward pass".to_string());
        }
        if opts.kernel != Kernel::Auto && !self.backward.contains(&opts.kernel) {
            return unsupported(format!("the backward pass of kernel {}", opts.kernel));
        }
        Ok(())
    }
}

/// Operand buffers of one forward call, in the backend's own memory (`I`: its index buffers).
#[derive(Debug)]
pub struct ForwardArgs<'a, B, I = Vec<u32>> {
    /// Queries.
    pub q: &'a B,
    /// Keys.
    pub k: &'a B,
    /// Values.
    pub v: &'a B,
    /// Explicit mask as additive f32, when the spec has one.
    pub mask: Option<&'a B>,
    /// Output, written in full by the call.
    pub o: &'a mut B,
    /// Log-sum-exp f32 (`[B, Hq, Sq]`, or `[Hq, total_q]` for a ragged batch), written when present.
    pub lse: Option<&'a mut B>,
    /// The block table of a paged KV cache (`crate::ragged`), when the spec's K/V are paged.
    pub block_table: Option<&'a I>,
}

/// Operand buffers of one backward call (`crate::backward`), in the backend's own memory. `dq`/`dk`/`dv`
/// (and `dq_accum`, f32) are written in full by the call; the rest are read.
#[derive(Debug)]
pub struct BackwardArgs<'a, B> {
    /// Queries.
    pub q: &'a B,
    /// Keys.
    pub k: &'a B,
    /// Values.
    pub v: &'a B,
    /// Explicit mask as additive f32, when the spec has one.
    pub mask: Option<&'a B>,
    /// The forward's output (O's strides).
    pub o: &'a B,
    /// The gradient of the loss with respect to O (O's strides).
    pub d_o: &'a B,
    /// The forward's log-sum-exp (f32).
    pub lse: &'a B,
    /// `dQ` (Q's strides).
    pub dq: &'a mut B,
    /// `dK` (K's strides).
    pub dk: &'a mut B,
    /// `dV` (V's strides).
    pub dv: &'a mut B,
    /// `dQ` in f32 (Q's strides), when [`BackwardOptions::dq_accum`] asks for it.
    pub dq_accum: Option<&'a mut B>,
}

/// Every buffer of a training step's attention (forward and backward), owned, so that a timing loop can
/// hand out the forward's and the backward's arguments in turn.
#[derive(Debug)]
pub struct PassBuffers<B, I = Vec<u32>> {
    /// Queries.
    pub q: B,
    /// Keys.
    pub k: B,
    /// Values.
    pub v: B,
    /// Explicit additive mask.
    pub mask: Option<B>,
    /// Block table (forward only; the backward refuses paged caches).
    pub block_table: Option<I>,
    /// Forward output, read by the backward.
    pub o: B,
    /// Forward LSE, read by the backward.
    pub lse: B,
    /// Upstream gradient.
    pub d_o: B,
    /// `dQ`.
    pub dq: B,
    /// `dK`.
    pub dk: B,
    /// `dV`.
    pub dv: B,
    /// f32 `dQ`.
    pub dq_accum: Option<B>,
}

impl<B, I> PassBuffers<B, I> {
    /// The forward's arguments (writes O and the LSE).
    pub fn fwd_args(&mut self) -> ForwardArgs<'_, B, I> {
        ForwardArgs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            mask: self.mask.as_ref(),
            o: &mut self.o,
            lse: Some(&mut self.lse),
            block_table: self.block_table.as_ref(),
        }
    }

    /// The backward's arguments (reads O and the LSE).
    pub fn bwd_args(&mut self) -> BackwardArgs<'_, B> {
        BackwardArgs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            mask: self.mask.as_ref(),
            o: &self.o,
            d_o: &self.d_o,
            lse: &self.lse,
            dq: &mut self.dq,
            dk: &mut self.dk,
            dv: &mut self.dv,
            dq_accum: self.dq_accum.as_mut(),
        }
    }
}

/// An attention backend working on its own buffers.
pub trait Backend {
    /// The backend's buffer type (host vector, device slice...).
    type Buffer;
    /// The backend's buffer of `u32` indices (a paged cache's block table).
    type Index;

    /// Short name: "reference", "cpu", "cuda".
    fn name(&self) -> &'static str;
    /// The device it runs on, in words (CPU model, GPU name).
    fn device_name(&self) -> String;
    /// What it can run.
    fn capabilities(&self) -> Capabilities;

    /// Devices one call runs across (ring attention over several GPUs); 1 for every single-device backend.
    fn gpus(&self) -> usize {
        1
    }

    /// What the last timed call measured besides its times, one line each (a ring's per-step compute,
    /// transfer and the fraction of the transfer hidden); empty for backends with nothing to add.
    fn timing_notes(&self) -> Vec<String> {
        Vec::new()
    }

    /// Host bytes one [`HostBackend`] call needs besides the caller's inputs, for backends whose buffers
    /// live in host memory (uploads, output, download and workspace; see
    /// [`crate::memory::host_call_bytes`]). Checked against the host before anything is uploaded. Device
    /// backends keep the default `None` and check their own memory.
    fn host_bytes_per_call(&self, spec: &AttentionSpec, opts: &RunOptions) -> Result<Option<u64>> {
        let _ = (spec, opts);
        Ok(None)
    }

    /// Refuses, before anything is uploaded, a call whose buffers cannot fit the backend's own memory (a
    /// GPU's free memory), with [`SdpaError::InsufficientMemory`]. Host backends keep the default (their
    /// memory is [`Backend::host_bytes_per_call`]'s).
    fn check_device_memory(&self, spec: &AttentionSpec, opts: &RunOptions) -> Result<()> {
        let _ = (spec, opts);
        Ok(())
    }

    /// Makes ready now (compiles and loads) the kernel programs the calls would run, so that none of them
    /// waits for a compiler on its first call; returns what it loaded. Calls the backend cannot run are
    /// left out (running them reports why). Backends that compile nothing at run time keep the default,
    /// which does nothing.
    fn prepare_kernels(&self, calls: &[(AttentionSpec, RunOptions)]) -> Result<Vec<ProgramLoad>> {
        let _ = calls;
        Ok(Vec::new())
    }

    /// The kernel programs loaded since the last call of this method (what a first call paid for).
    fn program_loads(&self) -> Vec<ProgramLoad> {
        Vec::new()
    }

    /// Copies a host buffer into backend memory.
    fn upload(&self, host: &HostBuffer) -> Result<Self::Buffer>;
    /// Copies a buffer back to the host.
    fn download(&self, buf: &Self::Buffer) -> Result<HostBuffer>;
    /// Copies indices (a block table) into backend memory.
    fn upload_index(&self, host: &[u32]) -> Result<Self::Index>;
    /// Waits until all queued work has finished.
    fn synchronize(&self) -> Result<()>;

    /// Runs one forward call. The spec has been validated and buffer lengths checked by the caller
    /// ([`HostBackend`] does both); implementations check what they depend on beyond that. Returns the
    /// kernel that actually ran (what `auto` resolved to).
    fn forward(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        args: ForwardArgs<'_, Self::Buffer, Self::Index>,
    ) -> Result<Kernel>;

    /// Runs one backward call (`crate::backward`). The spec has been validated and the buffers checked by
    /// the caller ([`HostBackend::run_backward_host`] does both, with
    /// [`Capabilities::check_backward`]). Backends without a backward keep the default, which refuses.
    fn backward(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        args: BackwardArgs<'_, Self::Buffer>,
    ) -> Result<BackwardRun> {
        let _ = (spec, opts, bwd, args);
        Err(SdpaError::Unsupported { backend: self.name(), what: "the backward pass".to_string() })
    }

    /// Times `reps` calls of `pass` (the forward, the backward, or both in turn) after `warmup` untimed
    /// ones; milliseconds per call. The default uses the host clock around synchronised calls; GPU
    /// backends override it with device events.
    fn time_pass(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        bufs: &mut PassBuffers<Self::Buffer, Self::Index>,
        pass: Pass,
        warmup: usize,
        reps: usize,
    ) -> Result<Vec<f64>> {
        let mut times = Vec::with_capacity(reps);
        for i in 0..warmup + reps {
            let t = Instant::now();
            if pass.has_forward() {
                self.forward(spec, opts, bufs.fwd_args())?;
            }
            if pass.has_backward() {
                self.backward(spec, opts, bwd, bufs.bwd_args())?;
            }
            self.synchronize()?;
            if i >= warmup {
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        Ok(times)
    }

    /// Times `reps` forward calls after `warmup` untimed ones; returns milliseconds per call. The default
    /// uses the host clock around a synchronised call; GPU backends override it with device events.
    fn time_forward(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        mut args: ForwardArgs<'_, Self::Buffer, Self::Index>,
        warmup: usize,
        reps: usize,
    ) -> Result<Vec<f64>> {
        let mut times = Vec::with_capacity(reps);
        for i in 0..warmup + reps {
            let t = Instant::now();
            let a = ForwardArgs {
                q: args.q,
                k: args.k,
                v: args.v,
                mask: args.mask,
                o: &mut *args.o,
                lse: args.lse.as_deref_mut(),
                block_table: args.block_table,
            };
            self.forward(spec, opts, a)?;
            self.synchronize()?;
            if i >= warmup {
                times.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        Ok(times)
    }
}

/// Result of [`HostBackend::run_host`].
#[derive(Debug, Clone)]
pub struct HostRun {
    /// Output and optional LSE.
    pub output: HostOutput,
    /// The kernel that ran.
    pub kernel: Kernel,
}

/// The object-safe face of a backend, on host tensors. Implemented for every [`Backend`].
pub trait HostBackend {
    /// Short name.
    fn name(&self) -> &'static str;
    /// The device it runs on.
    fn device_name(&self) -> String;
    /// What it can run.
    fn capabilities(&self) -> Capabilities;
    /// See [`Backend::gpus`].
    fn gpus(&self) -> usize;
    /// See [`Backend::timing_notes`].
    fn timing_notes(&self) -> Vec<String>;
    /// Refuses, before anything is allocated, a call whose host memory (the caller's inputs plus what
    /// [`Backend::host_bytes_per_call`] says the call itself holds) exceeds what the host has available,
    /// or whose buffers exceed the device's free memory ([`Backend::check_device_memory`]).
    fn check_host_memory(&self, spec: &AttentionSpec, opts: &RunOptions) -> Result<()>;
    /// See [`Backend::prepare_kernels`].
    fn prepare_kernels(&self, calls: &[(AttentionSpec, RunOptions)]) -> Result<Vec<ProgramLoad>>;
    /// See [`Backend::program_loads`].
    fn program_loads(&self) -> Vec<ProgramLoad>;
    /// Validates, uploads, poisons the output with NaN, runs, downloads.
    fn run_host(&self, spec: &AttentionSpec, opts: &RunOptions, inputs: &HostInputs) -> Result<HostRun>;
    /// Validates, uploads once, times `reps` calls after `warmup`; milliseconds per call and the kernel that
    /// ran.
    fn time_host(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        inputs: &HostInputs,
        warmup: usize,
        reps: usize,
    ) -> Result<(Vec<f64>, Kernel)>;
    /// Validates a backward call ([`Capabilities::check_backward`]), uploads the inputs and `grads`,
    /// poisons dQ, dK, dV (and the f32 dQ) with NaN, runs the backward, downloads the gradients.
    fn run_backward_host(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        inputs: &HostInputs,
        grads: &GradInputs,
    ) -> Result<HostGradients>;
    /// Validates and uploads like [`Self::run_backward_host`], then times `reps` calls of `pass` after
    /// `warmup` ([`Backend::time_pass`]); milliseconds per call and what the backward ran (for
    /// `Pass::Fwd`, the forward's kernel and `deterministic: true`).
    #[allow(clippy::too_many_arguments)]
    fn time_pass_host(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        inputs: &HostInputs,
        grads: &GradInputs,
        pass: Pass,
        warmup: usize,
        reps: usize,
    ) -> Result<(Vec<f64>, BackwardRun)>;
}

/// Host bytes the gradient buffers of a backward call add on the host side (uploads of O, dO, LSE; the
/// poisoned dQ, dK, dV and their downloads), for host backends whose buffers are host memory.
fn backward_host_bytes(spec: &AttentionSpec, bwd: &BackwardOptions) -> Result<u64> {
    let b = crate::memory::OperandBytes::of(spec)?;
    let lse = spec.lse_len()? as u64 * 4;
    let dq32 = if bwd.dq_accum { spec.required_len(Operand::Q)? as u64 * 4 } else { 0 };
    // O and dO uploaded; dQ, dK, dV allocated and downloaded (twice each).
    Ok((2 * b.o).saturating_add(lse).saturating_add(2 * (b.q + b.k + b.v)).saturating_add(2 * dq32))
}

fn upload_pass<T: Backend + ?Sized>(
    be: &T,
    spec: &AttentionSpec,
    opts: &RunOptions,
    bwd: &BackwardOptions,
    inputs: &HostInputs,
    grads: &GradInputs,
) -> Result<PassBuffers<T::Buffer, T::Index>> {
    spec.validate()?;
    inputs.check(spec)?;
    grads.check(spec)?;
    be.capabilities().check_backward(be.name(), spec, opts)?;
    if let Some(bytes) = be.host_bytes_per_call(spec, opts)? {
        let bytes = bytes.saturating_add(backward_host_bytes(spec, bwd)?);
        crate::memory::check_host(bytes, &format!("a {} backward call on shape {}", be.name(), spec.shape))?;
    }
    be.check_device_memory(spec, opts)?;
    let poisoned =
        |op: Operand| -> Result<T::Buffer> { be.upload(&HostBuffer::poisoned(spec.dtype, spec.required_len(op)?)) };
    Ok(PassBuffers {
        q: be.upload(&inputs.q)?,
        k: be.upload(&inputs.k)?,
        v: be.upload(&inputs.v)?,
        mask: match &inputs.mask {
            Some(m) => Some(be.upload(&HostBuffer::F32(m.clone()))?),
            None => None,
        },
        block_table: match &inputs.block_table {
            Some(t) => Some(be.upload_index(t)?),
            None => None,
        },
        o: be.upload(&grads.o)?,
        lse: be.upload(&HostBuffer::F32(grads.lse.clone()))?,
        d_o: be.upload(&grads.d_o)?,
        dq: poisoned(Operand::Q)?,
        dk: poisoned(Operand::K)?,
        dv: poisoned(Operand::V)?,
        dq_accum: if bwd.dq_accum {
            Some(be.upload(&HostBuffer::poisoned(DType::F32, spec.required_len(Operand::Q)?))?)
        } else {
            None
        },
    })
}

struct Uploaded<B, I> {
    q: B,
    k: B,
    v: B,
    mask: Option<B>,
    o: B,
    lse: Option<B>,
    block_table: Option<I>,
}

impl<B, I> Uploaded<B, I> {
    fn args(&mut self) -> ForwardArgs<'_, B, I> {
        ForwardArgs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            mask: self.mask.as_ref(),
            o: &mut self.o,
            lse: self.lse.as_mut(),
            block_table: self.block_table.as_ref(),
        }
    }
}

fn upload_all<T: Backend + ?Sized>(
    be: &T,
    spec: &AttentionSpec,
    opts: &RunOptions,
    inputs: &HostInputs,
) -> Result<Uploaded<T::Buffer, T::Index>> {
    spec.validate()?;
    inputs.check(spec)?;
    be.capabilities().check(be.name(), spec, opts)?;
    if let Some(bytes) = be.host_bytes_per_call(spec, opts)? {
        crate::memory::check_host(bytes, &format!("a {} call on shape {}", be.name(), spec.shape))?;
    }
    be.check_device_memory(spec, opts)?;
    let mask = match &inputs.mask {
        Some(m) => Some(be.upload(&HostBuffer::F32(m.clone()))?),
        None => None,
    };
    let lse = if opts.lse { Some(be.upload(&HostBuffer::poisoned(DType::F32, spec.lse_len()?))?) } else { None };
    Ok(Uploaded {
        q: be.upload(&inputs.q)?,
        k: be.upload(&inputs.k)?,
        v: be.upload(&inputs.v)?,
        mask,
        o: be.upload(&HostBuffer::poisoned(spec.out_dtype(), spec.required_len(Operand::O)?))?,
        lse,
        block_table: match &inputs.block_table {
            Some(t) => Some(be.upload_index(t)?),
            None => None,
        },
    })
}

impl<T: Backend> HostBackend for T {
    fn name(&self) -> &'static str {
        Backend::name(self)
    }
    fn device_name(&self) -> String {
        Backend::device_name(self)
    }
    fn capabilities(&self) -> Capabilities {
        Backend::capabilities(self)
    }
    fn gpus(&self) -> usize {
        Backend::gpus(self)
    }
    fn timing_notes(&self) -> Vec<String> {
        Backend::timing_notes(self)
    }

    fn check_host_memory(&self, spec: &AttentionSpec, opts: &RunOptions) -> Result<()> {
        let inputs = crate::memory::OperandBytes::of(spec)?.inputs();
        let call = Backend::host_bytes_per_call(self, spec, opts)?.unwrap_or(0);
        let what = format!("a {} call on shape {} (its inputs and its own buffers)", Backend::name(self), spec.shape);
        crate::memory::check_host(inputs.saturating_add(call), &what)?;
        Backend::check_device_memory(self, spec, opts)
    }

    fn prepare_kernels(&self, calls: &[(AttentionSpec, RunOptions)]) -> Result<Vec<ProgramLoad>> {
        Backend::prepare_kernels(self, calls)
    }

    fn program_loads(&self) -> Vec<ProgramLoad> {
        Backend::program_loads(self)
    }

    fn run_host(&self, spec: &AttentionSpec, opts: &RunOptions, inputs: &HostInputs) -> Result<HostRun> {
        let mut u = upload_all(self, spec, opts, inputs)?;
        let kernel = self.forward(spec, opts, u.args())?;
        self.synchronize()?;
        let o = self.download(&u.o)?;
        let lse = match &u.lse {
            Some(l) => Some(self.download(l)?.to_f32_vec()),
            None => None,
        };
        Ok(HostRun { output: HostOutput { o, lse }, kernel })
    }

    fn time_host(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        inputs: &HostInputs,
        warmup: usize,
        reps: usize,
    ) -> Result<(Vec<f64>, Kernel)> {
        let mut u = upload_all(self, spec, opts, inputs)?;
        // One untimed call resolves `auto` and surfaces errors before timing starts.
        let kernel = self.forward(spec, opts, u.args())?;
        let times = self.time_forward(spec, opts, u.args(), warmup, reps)?;
        Ok((times, kernel))
    }

    fn run_backward_host(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        inputs: &HostInputs,
        grads: &GradInputs,
    ) -> Result<HostGradients> {
        let mut u = upload_pass(self, spec, opts, bwd, inputs, grads)?;
        let run = self.backward(spec, opts, bwd, u.bwd_args())?;
        self.synchronize()?;
        let dq_accum = match &u.dq_accum {
            Some(b) => Some(self.download(b)?.to_f32_vec()),
            None => None,
        };
        Ok(HostGradients {
            dq: self.download(&u.dq)?,
            dk: self.download(&u.dk)?,
            dv: self.download(&u.dv)?,
            dq_accum,
            run,
        })
    }

    fn time_pass_host(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        inputs: &HostInputs,
        grads: &GradInputs,
        pass: Pass,
        warmup: usize,
        reps: usize,
    ) -> Result<(Vec<f64>, BackwardRun)> {
        let mut u = upload_pass(self, spec, opts, bwd, inputs, grads)?;
        // One untimed call of each half resolves `auto` and surfaces errors before timing starts.
        let fwd = if pass.has_forward() { Some(self.forward(spec, opts, u.fwd_args())?) } else { None };
        let run = if pass.has_backward() {
            self.backward(spec, opts, bwd, u.bwd_args())?
        } else {
            BackwardRun { kernel: fwd.unwrap_or(opts.kernel), deterministic: true }
        };
        let times = self.time_pass(spec, opts, bwd, &mut u, pass, warmup, reps)?;
        Ok((times, run))
    }
}
