//! Ring attention (context parallelism) across the GPUs of one host over NCCL (issue 26).
//!
//! A sequence is cut in sdpa-core's zigzag plan ([`sdpa_core::RingPlan`]: rank `r` holds chunks `r` and
//! `2N-1-r` of `2N`, so causal work is the same on every rank). Each rank runs on a thread of its own
//! ([`rank::Rank`]); at step `t` it computes its queries against the K/V block of rank `r - t` with the
//! ordinary single-GPU kernels (fa2 forward with LSE, the tensor-core backward) while NCCL passes the blocks
//! one rank on, on a communication stream beside the compute stream. Only the Hkv heads travel (GQA).
//!
//! Forward: the diagonal step writes its output and the running LSE; each later step's output is folded
//! in by `kernels/ring.cu`'s merge (sdpa-core's `merge_normalized` rule: an f32 running state between
//! merges, the first merge reading the diagonal's output and the last writing O in the dtype, so no pass
//! over O beyond one merge per step). Backward: the usual ring backward from the final O and LSE: each step
//! yields a dQ part (added into an f32 dQ on the rank) and dK/dV parts for the visiting block, added into an
//! f32 accumulator that travels with the block (its own communicator and stream) and comes home after the
//! last step.
//!
//! NCCL is loaded at run time ([`nccl`]): without it [`RingBackend::new`] returns `DeviceUnavailable`
//! saying what to install; nothing here panics on a machine without GPUs, CUDA or NCCL.
//!
//! The forward steps run `fa3` (the Hopper kernel) where it takes all of them and `auto` or `fa3` was asked
//! for, the requested kernel otherwise ([`step_kernel`]); the backward's steps run the tensor-core backward.
//!
//! Two entry points ([`resident`]): on shards already resident on each GPU ([`RingBackend::forward_resident`],
//! [`RingBackend::backward_resident`], [`RingBackend::time_resident`]: device buffers per rank in the zigzag
//! layout, what a training loop holds), and [`RingBackend`] as an `sdpa_core::Backend` over the gathered
//! tensors on the host, built on the first: a call cuts the tensors into shards, uploads them, runs the
//! resident layer and puts the outputs back. The shards of the last host call stay on the GPUs with the
//! fingerprints of their inputs, so a later call on the same inputs (the bench's checked call, its probe
//! and its timed calls) neither cuts nor uploads them again. Timed calls time only the layers (device events
//! on every rank, the slowest rank's time per layer), then profile one more layer per step ([`RingProfile`]).

pub mod kernels;
pub mod nccl;
pub mod rank;
pub mod resident;
pub mod shard;
pub mod step_kernel;

use crate::backend::CudaBackend;
use crate::error::{drv, unsupported};
use rank::{Geometry, Rank, StepTiming, Workspace};
use resident::HostShards;
use sdpa_core::{
    check_ring_spec, AttentionSpec, Backend, BackwardArgs, BackwardOptions, BackwardRun, Capabilities, DType,
    ForwardArgs, HostBuffer, Kernel, MaskKind, Pass, PassBuffers, Result, RunOptions, SdpaError,
};
use shard::Extent;
use std::sync::Mutex;

pub use rank::{Buf, BwdIo, FwdIo};

/// Per-step timings of one profiled layer on every rank.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RingProfile {
    /// Which pass was profiled.
    pub pass: Pass,
    /// The kernel the forward steps ran (`fa3`, `fa2`, ...); the backward's steps run the tensor-core
    /// backward whatever it is.
    pub forward_kernel: String,
    /// Per rank, per step.
    pub ranks: Vec<Vec<StepTiming>>,
}

impl RingProfile {
    /// One line per step: the slowest rank's compute, the longest transfer it waited for, the longest
    /// wait, and the smallest hidden fraction over the ranks.
    pub fn lines(&self) -> Vec<String> {
        let steps = self.ranks.first().map_or(0, Vec::len);
        (0..steps)
            .map(|t| {
                let col: Vec<&StepTiming> = self.ranks.iter().filter_map(|r| r.get(t)).collect();
                let max = |f: fn(&StepTiming) -> f64| col.iter().map(|x| f(x)).fold(0.0, f64::max);
                let hidden = col.iter().map(|x| x.hidden()).fold(1.0, f64::min);
                format!(
                    "step {t}: compute {:.3} ms, transfer {:.3} ms, compute waited {:.3} ms, hidden {:.1} %",
                    max(|x| x.compute_ms),
                    max(|x| x.transfer_ms),
                    max(|x| x.exposed_ms),
                    100.0 * hidden
                )
            })
            .collect()
    }
}

/// Ring attention over GPUs `0..N` of this host.
#[derive(Debug)]
pub struct RingBackend {
    ranks: Vec<Rank>,
    profile: Mutex<Option<RingProfile>>,
    /// The shards of the last host call, with the fingerprints of its inputs ([`resident::HostShards`]).
    host_shards: Mutex<Option<HostShards>>,
}

/// Widths of the operands, for cutting.
fn extents(spec: &AttentionSpec) -> (Extent, Extent, Extent, Extent, Extent) {
    let s = &spec.shape;
    let e = |heads: usize, width: usize| Extent { heads: s.b * heads, width };
    (e(s.hq, s.d), e(s.hkv, s.d), e(s.hkv, s.dv), e(s.hq, s.dv), e(s.hq, 1))
}

impl RingBackend {
    /// Opens GPUs `0..gpus` and one NCCL communicator per GPU for K/V and one for gradients. Returns
    /// `DeviceUnavailable` when a GPU or NCCL is missing.
    pub fn new(gpus: usize) -> Result<Self> {
        if gpus == 0 {
            return Err(SdpaError::InvalidSpec("ring attention needs at least one GPU".into()));
        }
        let devices = (0..gpus).map(CudaBackend::new).collect::<Result<Vec<_>>>()?;
        let lib = nccl::nccl()?;
        let ordinals: Vec<usize> = (0..gpus).collect();
        let kv = lib.comms(&ordinals)?;
        let grad = lib.comms(&ordinals)?;
        let mut ranks = Vec::with_capacity(gpus);
        for (r, ((gpu, kv_comm), grad_comm)) in devices.into_iter().zip(kv).zip(grad).enumerate() {
            let ctx = gpu.device().context().clone();
            ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent", "opening a ring rank"))?;
            // The exchanges run at the highest stream priority: NCCL's kernels need a few SMs, and while the
            // attention kernel's blocks fill the GPU they get the next free ones first instead of queuing
            // behind the rest of its grid.
            let (_, highest) = cudarc::driver::result::stream::get_priority_range()
                .map_err(drv("cuCtxGetStreamPriorityRange", "opening a ring rank"))?;
            let comm_stream = |what| ctx.new_stream_with_priority(highest).map_err(drv("cuStreamCreate", what));
            let kv_stream = comm_stream("a ring K/V stream")?;
            let grad_stream = comm_stream("a ring gradient stream")?;
            ranks.push(Rank { r, gpu, kv_comm, grad_comm, kv_stream, grad_stream });
        }
        Ok(RingBackend { ranks, profile: Mutex::new(None), host_shards: Mutex::new(None) })
    }

    /// The NCCL library in use: its path and version (e.g. 22703).
    pub fn nccl_version() -> Result<(String, i32)> {
        nccl::nccl().map(|n| (n.path.clone(), n.version))
    }

    /// The per-step profile of the last timed call.
    pub fn last_profile(&self) -> Option<RingProfile> {
        self.profile.lock().ok().and_then(|p| p.clone())
    }

    /// The ring's ranks, in ring order (rank `r` runs on GPU `r`).
    pub fn ranks(&self) -> &[Rank] {
        &self.ranks
    }

    /// The cut of a call and its step kernel for `requested` (see [`step_kernel`]); refuses what the ring
    /// cannot run before any GPU work.
    fn geometry(&self, spec: &AttentionSpec, requested: Kernel) -> Result<Geometry> {
        if !matches!(spec.dtype, DType::F16 | DType::BF16) {
            return Err(unsupported(format!("{} ring attention (f16 and bf16 only)", spec.dtype)));
        }
        let plan = check_ring_spec(spec, self.ranks.len())?;
        // Every rank's GPU must take the kernel: the lowest shared memory decides, and a capability only
        // when every GPU has it (fa3 needs exactly 9.0: a 9.0 and a 10.0 GPU together take no fa3 step).
        let infos: Vec<_> = self.ranks.iter().map(|r| r.gpu.device().info()).collect();
        let cc = match infos.split_first() {
            Some((first, rest)) if rest.iter().all(|i| i.compute_capability == first.compute_capability) => {
                first.compute_capability
            }
            _ => (0, 0),
        };
        let optin = infos.iter().map(|i| i.smem_per_block_optin.max(0) as usize).min().unwrap_or(0);
        let mut g = Geometry { spec: spec.clone(), plan, causal: spec.mask.is_causal(), step_kernel: requested };
        g.check_steps(requested, cc, optin)?;
        Ok(g)
    }

    /// Runs `f` for every rank on a thread of its own (its GPU bound), and returns the results by rank.
    fn on_ranks<R: Send>(&self, f: impl Fn(&Rank) -> Result<R> + Sync) -> Result<Vec<R>> {
        let results: Vec<Result<R>> = std::thread::scope(|scope| {
            let handles: Vec<_> = self
                .ranks
                .iter()
                .map(|rank| {
                    let f = &f;
                    scope.spawn(move || {
                        rank.bind()?;
                        f(rank)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(unsupported("a ring rank's thread panicked"))))
                .collect()
        });
        results.into_iter().collect()
    }

    fn workspaces(&self, g: &Geometry, backward: bool) -> Result<Vec<Workspace>> {
        let ws = self
            .ranks
            .iter()
            .map(|rank| Workspace::new(rank.gpu.device().stream(), g, rank.r, backward))
            .collect::<Result<Vec<_>>>()?;
        // The allocations and uploads are stream-ordered on each compute stream; the communication streams
        // touch these buffers too, so everything is in place before the first layer.
        for rank in &self.ranks {
            rank.gpu.device().synchronize()?;
        }
        Ok(ws)
    }

    /// Runs `reps` layers of `pass` after `warmup` on every rank, timed with device events per rank; then,
    /// with `profile`, one more layer with per-step marks. Returns ms per layer (the slowest rank's) and
    /// the kernel the forward steps ran.
    #[allow(clippy::too_many_arguments)]
    fn layers(
        &self,
        g: &Geometry,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        pass: Pass,
        io: &[FwdIo],
        bio: Option<&[BwdIo]>,
        ws: &[Workspace],
        (warmup, reps, profile): (usize, usize, bool),
    ) -> Result<(Vec<f64>, Kernel)> {
        let per_rank = self.on_ranks(|rank| {
            let r = rank.r;
            let stream = rank.gpu.device().stream();
            let ctx = stream.context();
            let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            let mut pairs = Vec::with_capacity(reps);
            let mut ran = g.step_kernel;
            let mut prof = None;
            for i in 0..warmup + reps + usize::from(profile) {
                let profiled = profile && i == warmup + reps;
                let start = ctx.new_event(timed).map_err(drv("cuEventCreate", "timing"))?;
                start.record(stream).map_err(drv("cuEventRecord", "timing"))?;
                if pass.has_forward() {
                    let (k, p) = rank.forward(g, opts, &io[r], &ws[r], profiled && pass == Pass::Fwd)?;
                    ran = k;
                    prof = p.or(prof);
                }
                if pass.has_backward() {
                    let b = bio.ok_or_else(|| unsupported("a backward layer without its buffers"))?;
                    prof = rank.backward(g, opts, bwd, &io[r], &b[r], &ws[r], profiled)?.or(prof);
                }
                let end = ctx.new_event(timed).map_err(drv("cuEventCreate", "timing"))?;
                end.record(stream).map_err(drv("cuEventRecord", "timing"))?;
                if i >= warmup && !profiled {
                    pairs.push((start, end));
                }
            }
            stream.synchronize().map_err(drv("cuStreamSynchronize", "timing"))?;
            let times = pairs
                .iter()
                .map(|(s, e)| s.elapsed_ms(e).map(f64::from).map_err(drv("cuEventElapsedTime", "timing")))
                .collect::<Result<Vec<f64>>>()?;
            Ok((times, ran, prof))
        })?;
        let times = (0..reps).map(|i| per_rank.iter().map(|(t, _, _)| t[i]).fold(0.0, f64::max)).collect();
        let ran = per_rank.first().map_or(g.step_kernel, |p| p.1);
        if profile {
            let ranks: Vec<Vec<StepTiming>> = per_rank.into_iter().map(|p| p.2.unwrap_or_default()).collect();
            if let Ok(mut slot) = self.profile.lock() {
                *slot = Some(RingProfile { pass, forward_kernel: ran.name().to_string(), ranks });
            }
        }
        Ok((times, ran))
    }
}

fn refuse_extras(spec: &AttentionSpec, mask: bool, table: bool) -> Result<()> {
    if mask || table || matches!(spec.mask, sdpa_core::Mask::Explicit(_)) {
        return Err(unsupported("explicit masks and paged caches in ring attention"));
    }
    Ok(())
}

impl Backend for RingBackend {
    /// Gathered tensors stay on the host; a call cuts them into the ranks' shards (or reuses the shards of
    /// the last call when the inputs are the same, [`resident::HostShards`]).
    type Buffer = HostBuffer;
    type Index = Vec<u32>;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn device_name(&self) -> String {
        self.ranks.first().map_or_else(String::new, |r| Backend::device_name(&r.gpu))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            dtypes: vec![DType::F16, DType::BF16],
            // fa3 runs the forward steps where it takes them all (step_kernel); the others as asked.
            kernels: vec![Kernel::Fa2, Kernel::Fa3],
            max_head_dim: 256,
            fast_head_dims: vec![64, 128],
            masks: vec![MaskKind::None, MaskKind::CausalTopLeft, MaskKind::CausalBottomRight],
            f32_math: vec![],
            variants: vec![],
            serving: vec![],
            // The backward's steps run the tensor-core backward; with fa3 asked, the forward steps run fa3.
            backward: vec![Kernel::Fa2, Kernel::Fa3],
        }
    }

    fn gpus(&self) -> usize {
        self.ranks.len()
    }

    fn timing_notes(&self) -> Vec<String> {
        self.last_profile().map_or_else(Vec::new, |p| {
            p.lines()
                .into_iter()
                .map(|l| {
                    format!(
                        "ring {} over {} GPUs (forward steps on {}), {l}",
                        p.pass,
                        self.ranks.len(),
                        p.forward_kernel
                    )
                })
                .collect()
        })
    }

    fn check_device_memory(&self, spec: &AttentionSpec, opts: &RunOptions) -> Result<()> {
        let g = self.geometry(spec, opts.kernel)?;
        // Shards of another call held from the last one would count against this one: let them go.
        self.release_host_shards_unless(spec);
        let held = self.host_shards_held(spec);
        let s = &spec.shape;
        let es = spec.dtype.size_bytes() as u64;
        for rank in &self.ranks {
            let l = g.plan.local_len(rank.r) as u64;
            let io = (s.b as u64)
                * l
                * ((s.hq as u64) * (s.d + 2 * s.dv) as u64 * es + (s.hkv as u64) * (s.d + s.dv) as u64 * es);
            let needed = if held { 0 } else { io } + Workspace::bytes(&g, rank.r, false);
            rank.gpu
                .device()
                .require_free(needed, || format!("rank {} of a ring call on shape {}", rank.r, spec.shape))?;
        }
        Ok(())
    }

    fn prepare_kernels(&self, calls: &[(AttentionSpec, RunOptions)]) -> Result<Vec<sdpa_core::ProgramLoad>> {
        // The step calls' programs: the diagonal's (causal) and the off-diagonal ones (no mask), on every GPU.
        let mut loads = Vec::new();
        for (spec, opts) in calls {
            let Ok(g) = self.geometry(spec, opts.kernel) else { continue };
            let step_opts = RunOptions { lse: true, kernel: g.step_kernel, ..*opts };
            for rank in &self.ranks {
                let mut steps = Vec::new();
                for t in 0..g.plan.ranks {
                    let src = g.plan.source(rank.r, t);
                    if let Some(w) = g.plan.work(rank.r, src, g.causal) {
                        steps.push((g.step_spec(rank.r, src, &w, false), step_opts));
                    }
                }
                let mut programs = rank.gpu.warm_up(&steps)?.loads;
                programs.extend(rank.gpu.device().prepare(&[kernels::program()])?);
                loads.extend(programs);
            }
        }
        Ok(loads)
    }

    fn program_loads(&self) -> Vec<sdpa_core::ProgramLoad> {
        self.ranks.iter().flat_map(|r| r.gpu.take_loads().unwrap_or_default()).collect()
    }

    fn upload(&self, host: &HostBuffer) -> Result<HostBuffer> {
        Ok(host.clone())
    }

    fn download(&self, buf: &HostBuffer) -> Result<HostBuffer> {
        Ok(buf.clone())
    }

    fn upload_index(&self, host: &[u32]) -> Result<Vec<u32>> {
        Ok(host.to_vec())
    }

    fn synchronize(&self) -> Result<()> {
        self.ranks.iter().try_for_each(|r| r.gpu.device().synchronize())
    }

    fn forward(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        args: ForwardArgs<'_, HostBuffer, Vec<u32>>,
    ) -> Result<Kernel> {
        refuse_extras(spec, args.mask.is_some(), args.block_table.is_some())?;
        self.with_host_shards(spec, (args.q, args.k, args.v), |io| {
            let ran = self.forward_resident(spec, opts, io)?;
            self.gather_forward(spec, io, args.o, args.lse)?;
            Ok(ran)
        })
    }

    fn backward(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        args: BackwardArgs<'_, HostBuffer>,
    ) -> Result<BackwardRun> {
        refuse_extras(spec, args.mask.is_some(), false)?;
        self.with_host_shards(spec, (args.q, args.k, args.v), |io| {
            self.set_forward_outputs(spec, io, args.o, args.lse)?;
            let b = self.shard_backward(spec, args.d_o)?;
            let run = self.backward_resident(spec, opts, bwd, io, &b)?;
            self.gather_grads(spec, &b, args.dq, args.dk, args.dv)?;
            Ok(run)
        })
    }

    fn time_forward(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        args: ForwardArgs<'_, HostBuffer, Vec<u32>>,
        warmup: usize,
        reps: usize,
    ) -> Result<Vec<f64>> {
        refuse_extras(spec, args.mask.is_some(), args.block_table.is_some())?;
        self.with_host_shards(spec, (args.q, args.k, args.v), |io| {
            let (times, _) =
                self.time_resident(spec, opts, &BackwardOptions::default(), Pass::Fwd, io, None, warmup, reps)?;
            self.gather_forward(spec, io, args.o, args.lse)?;
            Ok(times)
        })
    }

    fn time_pass(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        bufs: &mut PassBuffers<HostBuffer, Vec<u32>>,
        pass: Pass,
        warmup: usize,
        reps: usize,
    ) -> Result<Vec<f64>> {
        refuse_extras(spec, bufs.mask.is_some(), bufs.block_table.is_some())?;
        let PassBuffers { q, k, v, o, lse, d_o, dq, dk, dv, .. } = bufs;
        self.with_host_shards(spec, (q, k, v), |io| {
            if !pass.has_forward() {
                self.set_forward_outputs(spec, io, o, lse)?;
            }
            let b = if pass.has_backward() { Some(self.shard_backward(spec, d_o)?) } else { None };
            let (times, _) = self.time_resident(spec, opts, bwd, pass, io, b.as_deref(), warmup, reps)?;
            if pass.has_forward() {
                self.gather_forward(spec, io, o, Some(lse))?;
            }
            if let Some(b) = &b {
                self.gather_grads(spec, b, dq, dk, dv)?;
            }
            Ok(times)
        })
    }
}
