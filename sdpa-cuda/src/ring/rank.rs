//! One rank of the ring: its GPU, its communicators and streams, and the forward and backward layers it
//! runs on its own thread.
//!
//! Streams: attention and merges on the device's stream ("compute"); K/V exchanges on `kv_stream`; the
//! backward's dK/dV exchanges on `grad_stream`, with a communicator of their own so that the next step's
//! K/V never queue behind a gradient that waits for compute. Events order the three: a receive into a K/V
//! slot waits until compute has finished reading that slot; a step's compute waits until its K/V arrived.

use super::kernels::{self, AddArgs, MergeArgs};
use super::nccl::{Comm, Transfer};
use crate::backend::CudaBackend;
use crate::checked::buffer::CudaBuffer;
use crate::checked::call::Call;
use crate::checked::params::AttnParams;
use crate::error::{drv, unsupported};
use crate::kernels::bwd::{self, BwdParams};
use cudarc::driver::{CudaEvent, CudaStream};
use sdpa_core::{
    AttentionSpec, BackwardOptions, DType, Kernel, Result, RingPlan, RunOptions, Shape, StepWork, Strides,
};
use std::sync::Arc;

/// One GPU of the ring.
#[derive(Debug)]
pub struct Rank {
    /// Position in the ring (rank `r` sends to `r + 1` and receives from `r - 1`).
    pub r: usize,
    /// The GPU.
    pub gpu: CudaBackend,
    pub(crate) kv_comm: Comm,
    pub(crate) grad_comm: Comm,
    pub(crate) kv_stream: Arc<CudaStream>,
    pub(crate) grad_stream: Arc<CudaStream>,
}

/// A device buffer and its address, taken once (the ring orders its uses with its own events). The fields
/// are the crate's: a `Buf` is only built by [`Buf::zeros`] or [`Buf::wrap`], so the address the kernels and
/// NCCL use is always the buffer's own.
#[derive(Debug)]
pub struct Buf {
    /// The allocation.
    pub(crate) buf: CudaBuffer,
    /// Its device address.
    pub(crate) ptr: u64,
}

impl Buf {
    /// `len` zeroed elements of `dtype` on `stream`'s device.
    pub fn zeros(stream: &Arc<CudaStream>, dtype: DType, len: usize) -> Result<Buf> {
        let buf = CudaBuffer::zeros(stream, dtype, len.max(1))?;
        Ok(Buf::wrap(stream, buf))
    }

    /// Keeps an uploaded buffer with its address.
    pub fn wrap(stream: &Arc<CudaStream>, buf: CudaBuffer) -> Buf {
        let (ptr, guard) = buf.ptr(stream);
        drop(guard);
        Buf { buf, ptr }
    }

    /// The allocation.
    pub fn buffer(&self) -> &CudaBuffer {
        &self.buf
    }
}

/// The sizes every rank's calls are made of.
#[derive(Debug, Clone)]
pub struct Geometry {
    /// The whole call (the gathered sequence).
    pub spec: AttentionSpec,
    /// The cut.
    pub plan: RingPlan,
    /// Causal (either alignment: with Sq = Sk they are the same mask).
    pub causal: bool,
    /// The kernel the forward steps ask dispatch for ([`super::step_kernel::choose`]).
    pub step_kernel: Kernel,
}

impl Geometry {
    fn es(&self) -> usize {
        self.spec.dtype.size_bytes()
    }
    fn s(&self) -> &Shape {
        &self.spec.shape
    }
    /// Bytes of one K (or, with `dv`, V) block of rank `src`'s rows.
    fn kv_bytes(&self, src: usize, width: usize, elem: usize) -> usize {
        let s = self.s();
        s.b * s.hkv * self.plan.local_len(src) * width * elem
    }

    /// Checks every step's call of every rank before any rank starts (a rank that failed halfway would leave
    /// its neighbours waiting in NCCL): specs valid, every call's parameters buildable; then chooses the
    /// forward steps' kernel for `requested` on GPUs of compute capability `cc` ([`super::step_kernel`]),
    /// stored in `step_kernel`. The parameters use aligned stand-in addresses (`stand_in_params`).
    pub fn check_steps(&mut self, requested: Kernel, cc: (i32, i32), smem_optin: usize) -> Result<()> {
        let n = self.plan.ranks;
        let mut forward_steps = Vec::new();
        for r in 0..n {
            for t in 0..n {
                let src = self.plan.source(r, t);
                if let Some(w) = self.plan.work(r, src, self.causal) {
                    for o_local in [false, true] {
                        let spec = self.step_spec(r, src, &w, o_local);
                        spec.validate()?;
                        let p = stand_in_params(&spec)?;
                        if !o_local {
                            forward_steps.push((format!("rank {r} step {t}"), spec, p));
                        }
                    }
                }
            }
        }
        let steps = forward_steps.iter().map(|(label, spec, p)| (label.clone(), spec, *p));
        self.step_kernel = super::step_kernel::choose(requested, steps, cc, smem_optin)?;
        Ok(())
    }

    /// Device memory rank `r`'s backward steps allocate beyond the [`Workspace`]: the largest of
    /// [`bwd::device_bytes`] over its steps' calls (the Delta rows and dQ accumulator in place; the padded
    /// copies' scratch, their workspace and the headroom their own check asks for at head dims that are not
    /// multiples of 8). The largest, not the sum: each step's allocations are freed stream-ordered before the
    /// next step's, which reuses the memory. `Unsupported` when a size overflows.
    pub fn backward_step_bytes(&self, r: usize, deterministic: bool) -> Result<u64> {
        let mut most = 0;
        for t in 0..self.plan.ranks {
            let src = self.plan.source(r, t);
            let Some(w) = self.plan.work(r, src, self.causal) else { continue };
            let spec = self.step_spec(r, src, &w, true);
            let attn = stand_in_params(&spec)?;
            let p =
                BwdParams { attn, d_o: 6 << 32, dq: 7 << 32, dk: 8 << 32, dv: 9 << 32, delta: 0, dq_acc: 0, dq_f32: 0 };
            let bytes = bwd::device_bytes(&spec, &p, deterministic).ok_or_else(|| {
                unsupported(format!(
                    "the backward scratch of ring step {t} on shape {} exceeds the address space",
                    spec.shape
                ))
            })?;
            most = most.max(bytes);
        }
        Ok(most)
    }

    /// The spec of one step's call: local Q rows `w.rows` against the visiting K/V rows `w.keys`, Q and K/V
    /// addressed in their local layouts, O compact over the rows (`o_local`: in the local layout instead,
    /// as the backward reads it).
    pub(crate) fn step_spec(&self, r: usize, src: usize, w: &StepWork, o_local: bool) -> AttentionSpec {
        let s = self.s();
        let (lr, ls) = (self.plan.local_len(r), self.plan.local_len(src));
        let shape = Shape { b: s.b, hq: s.hq, hkv: s.hkv, sq: w.rows.len(), sk: w.keys.len(), d: s.d, dv: s.dv };
        let st =
            |heads: usize, rows: usize, width: usize| Strides { b: heads * rows * width, h: rows * width, s: width };
        let mut spec = AttentionSpec::new(shape, self.spec.dtype).with_mask(w.mask);
        spec.scale = Some(self.spec.scale());
        spec.q_strides = st(s.hq, lr, s.d);
        spec.k_strides = st(s.hkv, ls, s.d);
        spec.v_strides = st(s.hkv, ls, s.dv);
        spec.o_strides = if o_local { st(s.hq, lr, s.dv) } else { st(s.hq, w.rows.len(), s.dv) };
        spec
    }
}

/// The parameters of a step's call on aligned stand-in addresses, for the checks made before any rank
/// starts: the real ones are allocations plus whole rows of D or Dv elements, aligned wherever the strides
/// are (multiples of 8 wherever D and Dv are), so the stand-ins route every call as its run will.
fn stand_in_params(spec: &AttentionSpec) -> Result<AttnParams> {
    AttnParams::new(spec, 1 << 32, 2 << 32, 3 << 32, 4 << 32, 0, 5 << 32)
}

/// A rank's inputs and outputs of the forward, in its local layout.
#[derive(Debug)]
pub struct FwdIo {
    pub q: Buf,
    pub k: Buf,
    pub v: Buf,
    pub o: Buf,
    pub lse: Buf,
}

/// A rank's inputs and outputs of the backward, in its local layout.
#[derive(Debug)]
pub struct BwdIo {
    pub d_o: Buf,
    pub dq: Buf,
    pub dk: Buf,
    pub dv: Buf,
}

/// The buffers a rank's layers use besides their inputs and outputs, allocated once per shape.
#[derive(Debug)]
pub struct Workspace {
    /// Two K/V slots that received blocks alternate between.
    slots: [(Buf, Buf); 2],
    /// The diagonal step's output (dtype), the first operand of the first merge.
    o0: Buf,
    /// A later step's output (dtype, compact over its rows) and LSE.
    o_part: Buf,
    lse_part: Buf,
    /// The running output in f32 between merges (rings of three or more).
    acc: Buf,
    /// Backward: the step's dQ (local layout) and dK/dV (visiting layout), dtype.
    dq_step: Buf,
    dk_step: Buf,
    dv_step: Buf,
    /// Backward: dQ in f32, and two pairs of travelling dK/dV accumulators in f32.
    dq_acc: Buf,
    dkv: [(Buf, Buf); 2],
    /// Backward: LSE rows of the second local chunk, compact.
    lse_sub: Buf,
}

impl Workspace {
    /// Allocates rank `r`'s workspace (the backward's part only when `backward`).
    pub fn new(stream: &Arc<CudaStream>, g: &Geometry, r: usize, backward: bool) -> Result<Workspace> {
        let s = g.s();
        let dt = g.spec.dtype;
        let lr = g.plan.local_len(r);
        let lmax = g.plan.max_local_len();
        let kv = |width: usize| s.b * s.hkv * lmax * width;
        let q_rows = |width: usize| s.b * s.hq * lr * width;
        let z = |dtype, len| Buf::zeros(stream, dtype, len);
        let bw = |dtype, len: usize| z(dtype, if backward { len } else { 1 });
        Ok(Workspace {
            slots: [(z(dt, kv(s.d))?, z(dt, kv(s.dv))?), (z(dt, kv(s.d))?, z(dt, kv(s.dv))?)],
            o0: z(dt, q_rows(s.dv))?,
            o_part: z(dt, q_rows(s.dv))?,
            lse_part: z(DType::F32, q_rows(1))?,
            acc: z(DType::F32, if g.plan.ranks > 2 { q_rows(s.dv) } else { 1 })?,
            dq_step: bw(dt, q_rows(s.d))?,
            dk_step: bw(dt, kv(s.d))?,
            dv_step: bw(dt, kv(s.dv))?,
            dq_acc: bw(DType::F32, q_rows(s.d))?,
            dkv: [
                (bw(DType::F32, kv(s.d))?, bw(DType::F32, kv(s.dv))?),
                (bw(DType::F32, kv(s.d))?, bw(DType::F32, kv(s.dv))?),
            ],
            lse_sub: bw(DType::F32, q_rows(1))?,
        })
    }

    /// Device bytes a backward layer (with `deterministic` steps) needs free on rank `r` once its inputs and
    /// outputs are there: the workspace with its backward part ([`Workspace::bytes`]) and the most one step
    /// allocates ([`Geometry::backward_step_bytes`]). `Unsupported` when a size overflows.
    pub fn backward_bytes(g: &Geometry, r: usize, deterministic: bool) -> Result<u64> {
        let step = g.backward_step_bytes(r, deterministic)?;
        Workspace::bytes(g, r, true)
            .checked_add(step)
            .ok_or_else(|| unsupported(format!("a ring backward on shape {} exceeds the address space", g.spec.shape)))
    }

    /// Device bytes of a workspace for rank `r` (what [`Workspace::new`] allocates), for memory checks.
    pub fn bytes(g: &Geometry, r: usize, backward: bool) -> u64 {
        let s = g.s();
        let es = g.es() as u64;
        let lr = g.plan.local_len(r) as u64;
        let lmax = g.plan.max_local_len() as u64;
        let (b, hq, hkv, d, dv) = (s.b as u64, s.hq as u64, s.hkv as u64, s.d as u64, s.dv as u64);
        let kv = b * hkv * lmax * (d + dv);
        let q = b * hq * lr;
        let mut n = 2 * kv * es + 2 * q * dv * es + q * 4 + if g.plan.ranks > 2 { q * dv * 4 } else { 0 };
        if backward {
            n += q * d * (es + 4) + kv * es + 2 * kv * 4 + q * 4;
        }
        n
    }
}

/// Per step of one layer on one rank: compute, the transfer it waited for, and how long compute waited.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct StepTiming {
    /// Step index (0 = the rank's own K/V).
    pub step: usize,
    /// Milliseconds of this step's kernels (attention, merge, gradient adds).
    pub compute_ms: f64,
    /// Milliseconds of the exchanges this step waited for (K/V, and in the backward dK/dV), measured on
    /// the communication streams from when they could start to when they completed.
    pub transfer_ms: f64,
    /// Milliseconds compute sat idle waiting for them.
    pub exposed_ms: f64,
}

impl StepTiming {
    /// Fraction of the transfer hidden under compute (1 when nothing was transferred).
    pub fn hidden(&self) -> f64 {
        if self.transfer_ms <= 0.0 {
            1.0
        } else {
            (1.0 - self.exposed_ms / self.transfer_ms).clamp(0.0, 1.0)
        }
    }
}

/// Timed events of one profiled layer.
#[derive(Default)]
struct Marks {
    on: bool,
    k_begin: Vec<Option<CudaEvent>>,
    k_end: Vec<Option<CudaEvent>>,
    c_begin: Vec<Option<CudaEvent>>,
    c_end: Vec<Option<CudaEvent>>,
    g_begin: Vec<Option<CudaEvent>>,
    g_end: Vec<Option<CudaEvent>>,
    // Backward: compute's wait for the dK/dV accumulator within a step.
    w_begin: Vec<Option<CudaEvent>>,
    w_end: Vec<Option<CudaEvent>>,
}

impl Marks {
    fn new(on: bool, n: usize) -> Marks {
        let v = || (0..=n).map(|_| None).collect::<Vec<_>>();
        Marks {
            on,
            k_begin: v(),
            k_end: v(),
            c_begin: v(),
            c_end: v(),
            g_begin: v(),
            g_end: v(),
            w_begin: v(),
            w_end: v(),
        }
    }

    fn mark(on: bool, slot: &mut Option<CudaEvent>, stream: &Arc<CudaStream>) -> Result<()> {
        if on {
            let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            let e = stream.context().new_event(timed).map_err(drv("cuEventCreate", "ring profile"))?;
            e.record(stream).map_err(drv("cuEventRecord", "ring profile"))?;
            *slot = Some(e);
        }
        Ok(())
    }

    fn ms(a: &Option<CudaEvent>, b: &Option<CudaEvent>) -> Result<f64> {
        match (a, b) {
            (Some(a), Some(b)) => {
                Ok(f64::from(a.elapsed_ms(b).map_err(drv("cuEventElapsedTime", "ring profile"))?).max(0.0))
            }
            _ => Ok(0.0),
        }
    }

    /// Per-step timings; call after the layer has completed.
    fn timings(&self, n: usize) -> Result<Vec<StepTiming>> {
        let mut out = Vec::with_capacity(n);
        for t in 0..n {
            let compute_ms = Self::ms(&self.k_begin[t], &self.k_end[t])?;
            let (transfer_ms, exposed_ms) = if t == 0 {
                (0.0, 0.0)
            } else {
                let x = Self::ms(&self.c_begin[t - 1], &self.c_end[t - 1])?
                    + Self::ms(&self.g_begin[t - 1], &self.g_end[t - 1])?;
                let wait =
                    Self::ms(&self.k_end[t - 1], &self.k_begin[t])? + Self::ms(&self.w_begin[t], &self.w_end[t])?;
                (x, wait)
            };
            out.push(StepTiming { step: t, compute_ms, transfer_ms, exposed_ms });
        }
        Ok(out)
    }
}

fn event(stream: &Arc<CudaStream>) -> Result<CudaEvent> {
    let e = stream.context().new_event(None).map_err(drv("cuEventCreate", "ring ordering"))?;
    e.record(stream).map_err(drv("cuEventRecord", "ring ordering"))?;
    Ok(e)
}

fn wait(stream: &Arc<CudaStream>, e: &CudaEvent) -> Result<()> {
    stream.wait(e).map_err(drv("cuStreamWaitEvent", "ring ordering"))
}

impl Rank {
    fn next(&self, n: usize) -> usize {
        (self.r + 1) % n
    }
    fn prev(&self, n: usize) -> usize {
        (self.r + n - 1) % n
    }

    /// Binds this rank's GPU to the calling thread (each rank runs on a thread of its own).
    pub fn bind(&self) -> Result<()> {
        self.gpu.device().context().bind_to_thread().map_err(drv("cuCtxSetCurrent", "binding a ring rank's GPU"))
    }

    /// Queues the K/V exchange of step `t` on the K/V stream: the block of step `t` to the next rank, the
    /// block of step `t + 1` from the previous one into slot `t % 2`.
    fn exchange_kv(&self, g: &Geometry, t: usize, kv_t: (u64, u64), ws: &Workspace) -> Result<()> {
        let n = g.plan.ranks;
        let (cur, nxt) = (g.plan.source(self.r, t), g.plan.source(self.r, t + 1));
        let es = g.es();
        let (d, dv) = (g.s().d, g.s().dv);
        let to = self.next(n);
        let from = self.prev(n);
        let sends = [
            Transfer { ptr: kv_t.0, bytes: g.kv_bytes(cur, d, es), peer: to },
            Transfer { ptr: kv_t.1, bytes: g.kv_bytes(cur, dv, es), peer: to },
        ];
        let slot = &ws.slots[t % 2];
        let recvs = [
            Transfer { ptr: slot.0.ptr, bytes: g.kv_bytes(nxt, d, es), peer: from },
            Transfer { ptr: slot.1.ptr, bytes: g.kv_bytes(nxt, dv, es), peer: from },
        ];
        // SAFETY: the sends read blocks of `kv_bytes(cur)` from buffers of `max_local_len` rows (the inputs
        // of rank `cur` or a slot that received them); the receives write `kv_bytes(nxt)` into a slot of
        // `max_local_len` rows that compute no longer reads (the caller waited for it); the neighbours queue
        // the matching calls for the same step.
        unsafe { self.kv_comm.exchange(self.kv_stream.cu_stream() as _, &sends, &recvs) }
    }

    /// The K/V block rank `r` reads at step `t`: its own inputs, then the slots in turn.
    fn kv_at(t: usize, own: (u64, u64), ws: &Workspace) -> (u64, u64) {
        if t == 0 {
            own
        } else {
            let s = &ws.slots[(t - 1) % 2];
            (s.0.ptr, s.1.ptr)
        }
    }

    /// The start of step `t`: the exchange that brings step `t + 1`'s K/V (after compute has freed the slot
    /// it lands in, `freed`), then compute's wait for this step's K/V (`arrived`). Returns the event of the
    /// next block's arrival.
    fn begin_step(
        &self,
        g: &Geometry,
        t: usize,
        kv_t: (u64, u64),
        ws: &Workspace,
        (freed, arrived): (&Option<CudaEvent>, &Option<CudaEvent>),
        marks: &mut Marks,
    ) -> Result<Option<CudaEvent>> {
        let (ks, cs) = (&self.kv_stream, self.gpu.device().stream());
        let mut next_arrived = None;
        if t + 1 < g.plan.ranks {
            if let Some(e) = freed {
                wait(ks, e)?;
            }
            Marks::mark(marks.on, &mut marks.c_begin[t], ks)?;
            self.exchange_kv(g, t, kv_t, ws)?;
            Marks::mark(marks.on, &mut marks.c_end[t], ks)?;
            next_arrived = Some(event(ks)?);
        }
        if let Some(e) = arrived {
            wait(cs, e)?;
        }
        Marks::mark(marks.on, &mut marks.k_begin[t], cs)?;
        Ok(next_arrived)
    }

    /// One forward layer: writes `io.o` and `io.lse` (the merged LSE). With `profile`, returns the per-step
    /// timings (after waiting for the layer).
    pub fn forward(
        &self,
        g: &Geometry,
        opts: &RunOptions,
        io: &FwdIo,
        ws: &Workspace,
        profile: bool,
    ) -> Result<(Kernel, Option<Vec<StepTiming>>)> {
        let n = g.plan.ranks;
        let r = self.r;
        let dev = self.gpu.device();
        let cs = dev.stream();
        let ks = &self.kv_stream;
        let es = g.es();
        let s = g.s();
        let lr = g.plan.local_len(r);
        let mut marks = Marks::new(profile, n);
        wait(ks, &event(cs)?)?;
        let mut freed: Option<CudaEvent> = None;
        let mut arrived: Option<CudaEvent> = None;
        let mut ran = Kernel::Fa2;
        let step_opts = RunOptions { lse: true, kernel: g.step_kernel, ..*opts };
        for t in 0..n {
            let src = g.plan.source(r, t);
            let kv_t = Self::kv_at(t, (io.k.ptr, io.v.ptr), ws);
            let next_arrived = self.begin_step(g, t, kv_t, ws, (&freed, &arrived), &mut marks)?;
            if let Some(w) = g.plan.work(r, src, g.causal) {
                let spec = g.step_spec(r, src, &w, false);
                let qp = io.q.ptr + (w.rows.start * s.d * es) as u64;
                let (o, lse) = match (t, n) {
                    (0, 1) => (io.o.ptr, io.lse.ptr),
                    (0, _) => (ws.o0.ptr, io.lse.ptr),
                    _ => (ws.o_part.ptr, ws.lse_part.ptr),
                };
                let params = AttnParams::new(&spec, qp, kv_t.0, kv_t.1, o, 0, lse)?;
                ran = crate::kernels::dispatch(&Call { dev, stream: cs, spec: &spec, opts: &step_opts, params })?;
                if t > 0 {
                    let last = t + 1 == n;
                    let a = MergeArgs {
                        prev: if t == 1 { ws.o0.ptr } else { ws.acc.ptr },
                        prev_lse: io.lse.ptr,
                        part: ws.o_part.ptr,
                        part_lse: ws.lse_part.ptr,
                        out: if last { io.o.ptr } else { ws.acc.ptr },
                        heads: (s.b * s.hq) as u64,
                        rows: lr as u64,
                        part_row0: w.rows.start as u64,
                        part_rows: w.rows.len() as u64,
                        dv: s.dv as u64,
                        prev_is_f32: i32::from(t > 1),
                        out_is_f32: i32::from(!last),
                    };
                    // SAFETY: every buffer was sized for rank r's rows by Workspace::new / the caller's
                    // FwdIo, the part holds `w.rows` compact rows written by the call just queued on `cs`.
                    unsafe { kernels::merge(dev, cs, g.spec.dtype, &a) }?;
                }
            }
            Marks::mark(marks.on, &mut marks.k_end[t], cs)?;
            freed = Some(event(cs)?);
            arrived = next_arrived;
        }
        wait(cs, &event(ks)?)?;
        let timings = if profile {
            dev.synchronize()?;
            Some(marks.timings(n)?)
        } else {
            None
        };
        Ok((ran, timings))
    }

    /// One backward layer from the forward's `fwd.o` and `fwd.lse` and the upstream `bio.d_o`: writes
    /// `bio.dq`, `bio.dk`, `bio.dv`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        g: &Geometry,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        fwd: &FwdIo,
        bio: &BwdIo,
        ws: &Workspace,
        profile: bool,
    ) -> Result<Option<Vec<StepTiming>>> {
        let n = g.plan.ranks;
        let r = self.r;
        let dev = self.gpu.device();
        let cs = dev.stream();
        let (ks, gs) = (&self.kv_stream, &self.grad_stream);
        let es = g.es();
        let s = g.s();
        let dt = g.spec.dtype;
        let lr = g.plan.local_len(r);
        let first_len = g.plan.chunk(r).len();
        let mut marks = Marks::new(profile, n);
        let start = event(cs)?;
        wait(ks, &start)?;
        wait(gs, &start)?;
        if g.causal && n > 1 {
            // SAFETY: `fwd.lse` holds [B*Hq, lr] rows, `lse_sub` room for as many; queued on `cs`.
            unsafe {
                kernels::gather_rows(
                    dev,
                    cs,
                    (fwd.lse.ptr, ws.lse_sub.ptr),
                    (s.b * s.hq) as u64,
                    lr as u64,
                    first_len as u64,
                    (lr - first_len) as u64,
                )
            }?;
        }
        let mut freed: Option<CudaEvent> = None;
        let mut arrived: Option<CudaEvent> = None;
        let mut grads_arrived: Option<CudaEvent> = None;
        for t in 0..n {
            let src = g.plan.source(r, t);
            let ls = g.plan.local_len(src);
            let kv_t = Self::kv_at(t, (fwd.k.ptr, fwd.v.ptr), ws);
            let next_arrived = self.begin_step(g, t, kv_t, ws, (&freed, &arrived), &mut marks)?;
            let acc = &ws.dkv[t % 2];
            if let Some(w) = g.plan.work(r, src, g.causal) {
                let spec = g.step_spec(r, src, &w, true);
                let row_off = |width: usize| (w.rows.start * width * es) as u64;
                let whole = w.rows.start == 0 && w.rows.len() == lr;
                let lse = if whole { fwd.lse.ptr } else { ws.lse_sub.ptr };
                let attn = AttnParams::new(
                    &spec,
                    fwd.q.ptr + row_off(s.d),
                    kv_t.0,
                    kv_t.1,
                    fwd.o.ptr + row_off(s.dv),
                    0,
                    lse,
                )?;
                let ptrs = BwdParams {
                    attn,
                    d_o: bio.d_o.ptr + row_off(s.dv),
                    dq: ws.dq_step.ptr + row_off(s.d),
                    dk: ws.dk_step.ptr,
                    dv: ws.dv_step.ptr,
                    delta: 0,
                    dq_acc: 0,
                    dq_f32: 0,
                };
                let call = Call { dev, stream: cs, spec: &spec, opts, params: attn };
                crate::kernels::bwd::run(&call, ptrs, bwd.deterministic)?;
                let add = |acc: u64,
                           part: u64,
                           heads: usize,
                           rows_total: usize,
                           rows: &std::ops::Range<usize>,
                           width: usize| {
                    let a = AddArgs {
                        acc,
                        part,
                        heads: heads as u64,
                        rows_total: rows_total as u64,
                        row0: rows.start as u64,
                        n: rows.len() as u64,
                        width: width as u64,
                        first: i32::from(t == 0),
                        pad: 0,
                    };
                    // SAFETY: both buffers hold [heads, rows_total, width] (Workspace::new sizes them for
                    // the longest local length), the part written by the call just queued on `cs`.
                    unsafe { kernels::add(dev, cs, dt, &a) }
                };
                add(ws.dq_acc.ptr, ws.dq_step.ptr, s.b * s.hq, lr, &w.rows, s.d)?;
                if let Some(e) = &grads_arrived {
                    Marks::mark(marks.on, &mut marks.w_begin[t], cs)?;
                    wait(cs, e)?;
                    Marks::mark(marks.on, &mut marks.w_end[t], cs)?;
                }
                add(acc.0.ptr, ws.dk_step.ptr, s.b * s.hkv, ls, &w.keys, s.d)?;
                add(acc.1.ptr, ws.dv_step.ptr, s.b * s.hkv, ls, &w.keys, s.dv)?;
            } else if let Some(e) = &grads_arrived {
                wait(cs, e)?;
            }
            Marks::mark(marks.on, &mut marks.k_end[t], cs)?;
            let ready = event(cs)?;
            freed = Some(ready);
            arrived = next_arrived;
            if n > 1 {
                // Step t's dK/dV accumulator goes on to the next rank; the one for step t + 1 comes in (at
                // the last step: this rank's own, home). The last hop carries finished sums: they are
                // rounded into the dtype before it (the same rounding as at home, so the same result) and
                // land in the outputs, half the bytes on the hop no compute hides.
                let last = t + 1 == n;
                let nxt = g.plan.source(r, t + 1);
                let into = &ws.dkv[(t + 1) % 2];
                let (send, recv, elem) = if last {
                    let kv_len = |width: usize| (s.b * s.hkv * ls * width) as u64;
                    // SAFETY: `acc` holds the visiting block's [B*Hkv, ls, width] f32 sums, the step buffers
                    // room for `max_local_len` rows in the dtype (no longer read this step); queued on `cs`
                    // after the adds.
                    unsafe {
                        kernels::convert(dev, cs, dt, acc.0.ptr, ws.dk_step.ptr, kv_len(s.d))?;
                        kernels::convert(dev, cs, dt, acc.1.ptr, ws.dv_step.ptr, kv_len(s.dv))?;
                    }
                    freed = Some(event(cs)?);
                    ((ws.dk_step.ptr, ws.dv_step.ptr), (bio.dk.ptr, bio.dv.ptr), es)
                } else {
                    ((acc.0.ptr, acc.1.ptr), (into.0.ptr, into.1.ptr), 4)
                };
                if let Some(e) = &freed {
                    wait(gs, e)?;
                }
                let sends = [
                    Transfer { ptr: send.0, bytes: g.kv_bytes(src, s.d, elem), peer: self.next(n) },
                    Transfer { ptr: send.1, bytes: g.kv_bytes(src, s.dv, elem), peer: self.next(n) },
                ];
                let recvs = [
                    Transfer { ptr: recv.0, bytes: g.kv_bytes(nxt, s.d, elem), peer: self.prev(n) },
                    Transfer { ptr: recv.1, bytes: g.kv_bytes(nxt, s.dv, elem), peer: self.prev(n) },
                ];
                Marks::mark(marks.on, &mut marks.g_begin[t], gs)?;
                // SAFETY: the accumulators hold `max_local_len` rows in f32 and the step buffers as many in
                // the dtype; the send waits for compute to finish adding (and at the last hop rounding) step
                // t (event above). The receive writes the other accumulator slot, whose last send was queued
                // earlier on the same stream, or at the last hop this rank's dK/dV outputs ([B*Hkv, lr,
                // width] in the dtype, the size of the block that comes home), which nothing reads during
                // the layer; the next layer's compute waits for this stream before it writes the step
                // buffers again. The neighbours queue the matching calls.
                unsafe { self.grad_comm.exchange(gs.cu_stream() as _, &sends, &recvs) }?;
                Marks::mark(marks.on, &mut marks.g_end[t], gs)?;
                grads_arrived = Some(event(gs)?);
            }
        }
        if let Some(e) = &grads_arrived {
            Marks::mark(marks.on, &mut marks.w_begin[n], cs)?;
            wait(cs, e)?;
            Marks::mark(marks.on, &mut marks.w_end[n], cs)?;
        }
        // With one GPU the accumulator never left; with more, rank r's own dK/dV came home rounded, into
        // the outputs.
        let kv_len = |width: usize| (s.b * s.hkv * lr * width) as u64;
        // SAFETY: the f32 sources and dtype outputs hold the counts given (rank r's rows); queued on `cs`.
        unsafe {
            kernels::convert(dev, cs, dt, ws.dq_acc.ptr, bio.dq.ptr, (s.b * s.hq * lr * s.d) as u64)?;
            if n == 1 {
                kernels::convert(dev, cs, dt, ws.dkv[0].0.ptr, bio.dk.ptr, kv_len(s.d))?;
                kernels::convert(dev, cs, dt, ws.dkv[0].1.ptr, bio.dv.ptr, kv_len(s.dv))?;
            }
        }
        wait(cs, &event(ks)?)?;
        wait(cs, &event(gs)?)?;
        if profile {
            dev.synchronize()?;
            let mut t = marks.timings(n)?;
            // The last hop home: the wait after the last step counts on the last step.
            if let Some(last) = t.last_mut() {
                last.exposed_ms += Marks::ms(&marks.w_begin[n], &marks.w_end[n])?;
                last.transfer_ms += Marks::ms(&marks.g_begin[n - 1], &marks.g_end[n - 1])?;
            }
            Ok(Some(t))
        } else {
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{bwd_pad::BwdScratch, pad_copy::HEADROOM_BYTES};
    use sdpa_core::{check_ring_spec, Mask};

    fn geometry(d: usize) -> Geometry {
        let spec = AttentionSpec::new(Shape { b: 1, hq: 4, hkv: 2, sq: 256, sk: 256, d, dv: d }, DType::BF16)
            .with_mask(Mask::CausalTopLeft);
        let plan = check_ring_spec(&spec, 2).expect("a ring of two");
        Geometry { spec, plan, causal: true, step_kernel: Kernel::Fa2 }
    }

    /// Regression: the ring backward checked no device memory before its ranks started, and nothing counted
    /// the pad-copy path's scratch that its steps allocate at head dims that are not multiples of 8, so a
    /// rank could run short mid-ring (a driver error, its neighbours left waiting in NCCL) instead of
    /// refusing with `InsufficientMemory` up front. The count: the workspace with its backward part and the
    /// largest step's own allocations (rank 0's diagonal step, 128 local rows against 128 keys, of 256 rows
    /// over two ranks).
    #[test]
    fn the_backward_count_holds_the_largest_steps_padded_copies() {
        // Hq x the diagonal step's query rows.
        let rows = 4 * 128u64;
        // D = 33: the copies at D8 = 40 (Q, K, V, O, then dO, dQ, dK, dV), the padded call's Delta and f32 dQ
        // accumulator, and the headroom the path's own check asks for.
        let g = geometry(33);
        let scratch = BwdScratch::of(&Shape { b: 1, hq: 4, hkv: 2, sq: 128, sk: 128, d: 33, dv: 33 }, false)
            .expect("fits")
            .bytes();
        let (q, k) = (4 * 128 * 40, 2 * 128 * 40);
        assert_eq!(scratch, 2 * 2 * (q + k + k + q));
        for r in 0..2 {
            let ws = Workspace::bytes(&g, r, true);
            let atomic = scratch + 4 * rows + 4 * rows * 40 + HEADROOM_BYTES;
            assert_eq!(Workspace::backward_bytes(&g, r, false).expect("fits"), ws + atomic, "rank {r}");
            let det = scratch + 4 * rows + HEADROOM_BYTES;
            assert_eq!(Workspace::backward_bytes(&g, r, true).expect("fits"), ws + det, "rank {r}");
        }
        // D = 32 runs in place: the Delta rows and the accumulator only, no copies, no headroom.
        let g = geometry(32);
        let ws = Workspace::bytes(&g, 0, true);
        assert_eq!(Workspace::backward_bytes(&g, 0, false).expect("fits"), ws + 4 * rows + 4 * rows * 32);
        assert_eq!(Workspace::backward_bytes(&g, 0, true).expect("fits"), ws + 4 * rows);
    }
}
