//! The ring on shards already resident on each GPU, and the host-tensor path built on it.
//!
//! A rank's shards are device buffers on its own GPU in the zigzag local layout (`[B·H, local rows, width]`,
//! rows of chunk `r` then of chunk `2N-1-r`, [`sdpa_core::RingPlan::chunks_of`]): [`FwdIo`] holds Q, K, V,
//! O (dtype) and the LSE (f32), [`BwdIo`] dO, dQ, dK, dV (dtype). A training loop keeps them there and calls
//! [`RingBackend::forward_resident`] and [`RingBackend::backward_resident`]; nothing crosses the host.
//! [`RingBackend::alloc_forward`] and [`RingBackend::alloc_backward`] allocate them zeroed on the right GPUs,
//! [`RingBackend::shard_forward`] and [`RingBackend::shard_backward`] cut host tensors into them (each rank on
//! its own thread), [`RingBackend::gather_forward`] and [`RingBackend::gather_grads`] put results back.
//!
//! The host path ([`sdpa_core::Backend`] for [`RingBackend`]) keeps the last call's forward shards
//! ([`HostShards`]) with the fingerprints of its Q, K and V ([`super::shard::fingerprint`]): a call on the
//! same spec and inputs reuses them (fingerprinting is a few hundred milliseconds where cutting and uploading
//! gigabytes takes seconds), any other call replaces them, and [`RingBackend::release_host_shards`] frees
//! them. O and the LSE in them are outputs, rewritten by every forward.

use super::rank::{Buf, BwdIo, FwdIo, Geometry, Workspace};
use super::shard::{self, Extent};
use super::{extents, RingBackend};
use crate::error::unsupported;
use sdpa_core::{
    AttentionSpec, BackwardOptions, BackwardRun, DType, HostBuffer, Kernel, Pass, Result, RunOptions, SdpaError,
};

/// The forward shards of the last host call, and what they were cut from.
#[derive(Debug)]
pub struct HostShards {
    spec: AttentionSpec,
    prints: [u64; 3],
    io: Vec<FwdIo>,
}

fn prints(q: &HostBuffer, k: &HostBuffer, v: &HostBuffer) -> [u64; 3] {
    std::thread::scope(|s| {
        let (hq, hk) = (s.spawn(|| shard::fingerprint(q)), s.spawn(|| shard::fingerprint(k)));
        let pv = shard::fingerprint(v);
        // Plain arithmetic cannot panic; a value no input gives keeps the cache from matching if one did.
        [hq.join().unwrap_or(u64::MAX), hk.join().unwrap_or(u64::MAX - 1), pv]
    })
}

impl RingBackend {
    /// Rank `r`'s element counts of Q, K, V, O, LSE for `spec`.
    fn local_lens(g: &Geometry, r: usize) -> [usize; 5] {
        let (eq, ek, ev, eo, el) = extents(&g.spec);
        let l = g.plan.local_len(r);
        [eq, ek, ev, eo, el].map(|e: Extent| e.heads * l * e.width)
    }

    /// Refuses a shard of rank `r` that lives on another GPU than the rank's (its kernels and NCCL would reach
    /// across devices).
    fn on_its_gpu(&self, r: usize, what: &str, buf: &Buf) -> Result<()> {
        let gpu = self.ranks[r].gpu.info().ordinal;
        if buf.buf.ordinal() == gpu {
            return Ok(());
        }
        Err(SdpaError::InvalidSpec(format!(
            "{what} of ring rank {r} lives on GPU {}, the rank runs on GPU {gpu}",
            buf.buf.ordinal()
        )))
    }

    /// Refuses shards that do not fit `spec`'s cut: one per rank, each buffer of its dtype and at least its
    /// rank's length (rank `r` holds `plan.local_len(r)` rows per head).
    fn check_shards(&self, g: &Geometry, io: &[FwdIo], b: Option<&[BwdIo]>) -> Result<()> {
        let n = self.ranks.len();
        if io.len() != n || b.is_some_and(|b| b.len() != n) {
            return Err(SdpaError::InvalidSpec(format!(
                "ring attention over {n} GPUs needs one set of shards per GPU (got {} forward, {} backward)",
                io.len(),
                b.map_or(n, <[BwdIo]>::len)
            )));
        }
        let dt = g.spec.dtype;
        let check = |r: usize, what: &'static str, buf: &Buf, dtype: DType, needed: usize| -> Result<()> {
            self.on_its_gpu(r, what, buf)?;
            if buf.buf.dtype() != dtype {
                return Err(SdpaError::DTypeMismatch { name: what, expected: dtype, found: buf.buf.dtype() });
            }
            if buf.buf.len() < needed {
                return Err(SdpaError::BufferTooShort { name: what, len: buf.buf.len(), needed });
            }
            Ok(())
        };
        for (r, f) in io.iter().enumerate() {
            let [q, k, v, o, lse] = Self::local_lens(g, r);
            check(r, "ring Q shard", &f.q, dt, q)?;
            check(r, "ring K shard", &f.k, dt, k)?;
            check(r, "ring V shard", &f.v, dt, v)?;
            check(r, "ring O shard", &f.o, dt, o)?;
            check(r, "ring LSE shard", &f.lse, DType::F32, lse)?;
            if let Some(b) = b {
                check(r, "ring dO shard", &b[r].d_o, dt, o)?;
                check(r, "ring dQ shard", &b[r].dq, dt, q)?;
                check(r, "ring dK shard", &b[r].dk, dt, k)?;
                check(r, "ring dV shard", &b[r].dv, dt, v)?;
            }
        }
        Ok(())
    }

    /// Zeroed forward shards for `spec` on every rank's GPU (Q, K, V to be filled by the caller).
    pub fn alloc_forward(&self, spec: &AttentionSpec) -> Result<Vec<FwdIo>> {
        let g = self.geometry(spec, Kernel::Fa2)?;
        let dt = spec.dtype;
        self.on_ranks(|rank| {
            let st = rank.gpu.device().stream();
            let [q, k, v, o, lse] = Self::local_lens(&g, rank.r);
            Ok(FwdIo {
                q: Buf::zeros(st, dt, q)?,
                k: Buf::zeros(st, dt, k)?,
                v: Buf::zeros(st, dt, v)?,
                o: Buf::zeros(st, dt, o)?,
                lse: Buf::zeros(st, DType::F32, lse)?,
            })
        })
    }

    /// Zeroed backward shards for `spec` on every rank's GPU (dO to be filled by the caller).
    pub fn alloc_backward(&self, spec: &AttentionSpec) -> Result<Vec<BwdIo>> {
        let g = self.geometry(spec, Kernel::Fa2)?;
        let dt = spec.dtype;
        self.on_ranks(|rank| {
            let st = rank.gpu.device().stream();
            let [q, k, v, o, _] = Self::local_lens(&g, rank.r);
            Ok(BwdIo {
                d_o: Buf::zeros(st, dt, o)?,
                dq: Buf::zeros(st, dt, q)?,
                dk: Buf::zeros(st, dt, k)?,
                dv: Buf::zeros(st, dt, v)?,
            })
        })
    }

    /// Cuts `host` (gathered, extent `e`) and uploads each rank's shard to its GPU, the ranks in parallel.
    fn upload_cut(&self, g: &Geometry, host: &HostBuffer, e: Extent) -> Result<Vec<Buf>> {
        self.on_ranks(|rank| {
            let part = shard::shard(host, &g.plan, rank.r, e)?;
            let stream = rank.gpu.device().stream();
            Ok(Buf::wrap(stream, crate::checked::buffer::CudaBuffer::upload(stream, &part)?))
        })
    }

    /// Downloads each rank's shard (in parallel) and pastes it into the gathered `dst`.
    fn download_paste(&self, g: &Geometry, parts: &[&Buf], dst: &mut HostBuffer, e: Extent) -> Result<()> {
        let n = self.ranks.len();
        if parts.len() != n {
            return Err(SdpaError::InvalidSpec(format!(
                "ring attention over {n} GPUs gathers one shard per GPU (got {})",
                parts.len()
            )));
        }
        for (r, part) in parts.iter().enumerate() {
            self.on_its_gpu(r, "ring shard", part)?;
        }
        let hosts = self.on_ranks(|rank| parts[rank.r].buf.download(rank.gpu.device().stream()))?;
        for (r, host) in hosts.iter().enumerate() {
            shard::unshard(dst, host, &g.plan, r, e)?;
        }
        Ok(())
    }

    /// Forward shards cut from gathered host tensors (O and the LSE zeroed).
    pub fn shard_forward(
        &self,
        spec: &AttentionSpec,
        q: &HostBuffer,
        k: &HostBuffer,
        v: &HostBuffer,
    ) -> Result<Vec<FwdIo>> {
        let g = self.geometry(spec, Kernel::Fa2)?;
        let (eq, ek, ev, eo, el) = extents(spec);
        let (qs, ks, vs) = (self.upload_cut(&g, q, eq)?, self.upload_cut(&g, k, ek)?, self.upload_cut(&g, v, ev)?);
        let outs = self.on_ranks(|rank| {
            let st = rank.gpu.device().stream();
            let l = g.plan.local_len(rank.r);
            Ok((Buf::zeros(st, spec.dtype, eo.heads * l * eo.width)?, Buf::zeros(st, DType::F32, el.heads * l)?))
        })?;
        Ok(qs.into_iter().zip(ks).zip(vs).zip(outs).map(|(((q, k), v), (o, lse))| FwdIo { q, k, v, o, lse }).collect())
    }

    /// Backward shards: dO cut from the gathered host tensor, dQ, dK, dV zeroed.
    pub fn shard_backward(&self, spec: &AttentionSpec, d_o: &HostBuffer) -> Result<Vec<BwdIo>> {
        let g = self.geometry(spec, Kernel::Fa2)?;
        let dos = self.upload_cut(&g, d_o, extents(spec).3)?;
        let mut grads = self.alloc_backward(spec)?;
        for (b, d_o) in grads.iter_mut().zip(dos) {
            b.d_o = d_o;
        }
        Ok(grads)
    }

    /// Replaces the O and LSE shards with ones cut from the gathered host tensors (a backward's inputs).
    pub fn set_forward_outputs(
        &self,
        spec: &AttentionSpec,
        io: &mut [FwdIo],
        o: &HostBuffer,
        lse: &HostBuffer,
    ) -> Result<()> {
        let g = self.geometry(spec, Kernel::Fa2)?;
        let (_, _, _, eo, el) = extents(spec);
        for ((f, o), l) in io.iter_mut().zip(self.upload_cut(&g, o, eo)?).zip(self.upload_cut(&g, lse, el)?) {
            f.o = o;
            f.lse = l;
        }
        Ok(())
    }

    /// Puts the O (and, given, LSE) shards back into gathered host tensors.
    pub fn gather_forward(
        &self,
        spec: &AttentionSpec,
        io: &[FwdIo],
        o: &mut HostBuffer,
        lse: Option<&mut HostBuffer>,
    ) -> Result<()> {
        let g = self.geometry(spec, Kernel::Fa2)?;
        let (_, _, _, eo, el) = extents(spec);
        self.download_paste(&g, &io.iter().map(|f| &f.o).collect::<Vec<_>>(), o, eo)?;
        if let Some(lse) = lse {
            self.download_paste(&g, &io.iter().map(|f| &f.lse).collect::<Vec<_>>(), lse, el)?;
        }
        Ok(())
    }

    /// Puts the dQ, dK, dV shards back into gathered host tensors.
    pub fn gather_grads(
        &self,
        spec: &AttentionSpec,
        b: &[BwdIo],
        dq: &mut HostBuffer,
        dk: &mut HostBuffer,
        dv: &mut HostBuffer,
    ) -> Result<()> {
        let g = self.geometry(spec, Kernel::Fa2)?;
        let (eq, ek, ev, _, _) = extents(spec);
        self.download_paste(&g, &b.iter().map(|x| &x.dq).collect::<Vec<_>>(), dq, eq)?;
        self.download_paste(&g, &b.iter().map(|x| &x.dk).collect::<Vec<_>>(), dk, ek)?;
        self.download_paste(&g, &b.iter().map(|x| &x.dv).collect::<Vec<_>>(), dv, ev)
    }

    /// One forward layer on resident shards: writes every rank's O and LSE shards. Returns the kernel the
    /// steps ran (see [`super::step_kernel`]).
    pub fn forward_resident(&self, spec: &AttentionSpec, opts: &RunOptions, io: &[FwdIo]) -> Result<Kernel> {
        let g = self.geometry(spec, opts.kernel)?;
        self.check_shards(&g, io, None)?;
        let ws = self.workspaces(&g, false)?;
        let (_, ran) = self.layers(&g, opts, &BackwardOptions::default(), Pass::Fwd, io, None, &ws, (1, 0, false))?;
        Ok(ran)
    }

    /// One backward layer on resident shards, from the forward's O and LSE in `io` and dO in `grads`:
    /// writes every rank's dQ, dK, dV shards. The steps run the tensor-core backward.
    pub fn backward_resident(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        io: &[FwdIo],
        grads: &[BwdIo],
    ) -> Result<BackwardRun> {
        if bwd.dq_accum {
            return Err(unsupported("an f32 dQ output from ring attention"));
        }
        let g = self.geometry(spec, opts.kernel)?;
        self.check_shards(&g, io, Some(grads))?;
        self.check_backward_memory(&g, bwd.deterministic)?;
        let ws = self.workspaces(&g, true)?;
        self.layers(&g, opts, bwd, Pass::Bwd, io, Some(grads), &ws, (1, 0, false))?;
        Ok(BackwardRun { kernel: Kernel::Fa2, deterministic: bwd.deterministic })
    }

    /// Times `reps` layers of `pass` after `warmup` on resident shards (device events on every rank, the
    /// slowest rank's time per layer), then profiles one more per step ([`RingBackend::last_profile`]).
    /// Returns milliseconds per layer and the kernel the forward steps ran.
    #[allow(clippy::too_many_arguments)]
    pub fn time_resident(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        pass: Pass,
        io: &[FwdIo],
        grads: Option<&[BwdIo]>,
        warmup: usize,
        reps: usize,
    ) -> Result<(Vec<f64>, Kernel)> {
        if bwd.dq_accum && pass.has_backward() {
            return Err(unsupported("an f32 dQ output from ring attention"));
        }
        let g = self.geometry(spec, opts.kernel)?;
        self.check_shards(&g, io, grads.filter(|_| pass.has_backward()))?;
        if pass.has_backward() {
            self.check_backward_memory(&g, bwd.deterministic)?;
        }
        let ws = self.workspaces(&g, pass.has_backward())?;
        self.layers(&g, opts, bwd, pass, io, grads, &ws, (warmup, reps, true))
    }

    /// Refuses with `InsufficientMemory`, before any rank allocates or starts, a backward layer that some
    /// rank's GPU cannot hold besides its shards ([`Workspace::backward_bytes`]: the workspace and the most
    /// one step allocates, the pad-copy path's scratch included): a rank whose step ran short mid-ring would
    /// fail there and leave its neighbours waiting in NCCL.
    fn check_backward_memory(&self, g: &Geometry, deterministic: bool) -> Result<()> {
        for rank in &self.ranks {
            let needed = Workspace::backward_bytes(g, rank.r, deterministic)?;
            rank.gpu.device().require_free(needed, || {
                format!("rank {} of a ring backward on shape {} (its workspace and step scratch)", rank.r, g.spec.shape)
            })?;
        }
        Ok(())
    }

    /// Runs `f` on the forward shards of `q`, `k`, `v`: the held ones when they were cut from the same spec
    /// and contents, fresh ones otherwise (replacing the held ones, freed first).
    pub(super) fn with_host_shards<R>(
        &self,
        spec: &AttentionSpec,
        (q, k, v): (&HostBuffer, &HostBuffer, &HostBuffer),
        f: impl FnOnce(&mut [FwdIo]) -> Result<R>,
    ) -> Result<R> {
        let prints = prints(q, k, v);
        let mut slot = self.host_shards.lock().map_err(|_| unsupported("a ring call panicked earlier"))?;
        if slot.as_ref().is_none_or(|h| h.spec != *spec || h.prints != prints) {
            drop(slot.take());
            let io = self.shard_forward(spec, q, k, v)?;
            *slot = Some(HostShards { spec: spec.clone(), prints, io });
        }
        let held = slot.as_mut().ok_or_else(|| unsupported("ring shards vanished"))?;
        f(&mut held.io)
    }

    /// Frees the shards the last host call left on the GPUs.
    pub fn release_host_shards(&self) {
        if let Ok(mut slot) = self.host_shards.lock() {
            drop(slot.take());
        }
    }

    /// Frees the held shards unless they were cut for `spec`.
    pub(super) fn release_host_shards_unless(&self, spec: &AttentionSpec) {
        if let Ok(mut slot) = self.host_shards.lock() {
            if slot.as_ref().is_some_and(|h| h.spec != *spec) {
                drop(slot.take());
            }
        }
    }

    /// Whether shards for `spec` are held (a call on it needs no new memory for its inputs and outputs).
    pub(super) fn host_shards_held(&self, spec: &AttentionSpec) -> bool {
        self.host_shards.lock().is_ok_and(|s| s.as_ref().is_some_and(|h| h.spec == *spec))
    }
}
