//! [`CudaBackend`]: the `Backend` implementation on top of the three layers: buffer and length checks, the
//! call handed to [`crate::kernels::dispatch`] (which asks the kernel policy which launcher runs it), event
//! timing with an L2 flush, and [`CudaBackend::forward_on_stream`] for callers that own their device memory
//! and stream (candle).

use crate::checked::buffer::CudaBuffer;
use crate::checked::call::Call;
use crate::checked::device::{Device, DeviceInfo};
use crate::checked::params::AttnParams;
use crate::error::{drv, unsupported, BACKEND};
use crate::kernels::dispatch;
use crate::sys::program::Program;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use half::{bf16, f16};
use sdpa_core::{
    AttentionSpec, Backend, BackwardArgs, BackwardOptions, BackwardRun, Capabilities, DType, F32Math, ForwardArgs,
    HostBuffer, Kernel, Mask, MaskKind, Operand, Pass, PassBuffers, ProgramLoad, Result, RunOptions, SdpaError,
    Serving, Variant,
};
use std::sync::{Arc, Mutex};

/// Head dims with a specialised `fa1` variant; others (up to [`MAX_HEAD_DIM`]) take the generic one.
pub const FA1_FAST_HEAD_DIMS: [usize; 6] = [32, 64, 80, 96, 128, 256];
/// Largest D and Dv any kernel accepts.
pub const MAX_HEAD_DIM: usize = 8192;

/// Element types the backend runs, for [`CudaBackend::forward_on_stream`].
pub trait CudaElement: cudarc::driver::DeviceRepr {
    /// The matching dtype.
    const DTYPE: DType;
}
impl CudaElement for f32 {
    const DTYPE: DType = DType::F32;
}
impl CudaElement for f16 {
    const DTYPE: DType = DType::F16;
}
impl CudaElement for bf16 {
    const DTYPE: DType = DType::BF16;
}
/// E4M3 codes, one byte each: the FP8 inputs of `fa3` (candle's `float8::F8E4M3` storage viewed as bytes).
impl CudaElement for u8 {
    const DTYPE: DType = DType::F8E4M3;
}

/// How [`CudaBackend`]'s timed calls ([`Backend::time_forward`]) empty L2 before each call. Either way
/// the call starts with none of its inputs in L2, and host launch overhead hides behind the flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum L2Flush {
    /// Write 256 MB (a memset), as `triton.testing.do_bench` times PyTorch: L2 is left full of dirty
    /// lines, so the timed call also pays for writing up to an L2's worth (50 MB on the H100) back to
    /// memory. Comparable with PyTorch's numbers from `do_bench`.
    #[default]
    Dirty,
    /// Read 256 MB (`kernels/l2_flush.cu`): L2 is left holding clean lines only, as Nsight Compute's
    /// cache control does, so the timed call owes no write-back. Compare only with PyTorch timed the same
    /// way (`sdpa-cuda/dev/decode_flush_study.py`).
    Clean,
}

impl std::str::FromStr for L2Flush {
    type Err = SdpaError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "dirty" => Ok(L2Flush::Dirty),
            "clean" => Ok(L2Flush::Clean),
            _ => Err(SdpaError::InvalidSpec(format!("L2 flush must be dirty or clean, got {s:?}"))),
        }
    }
}

/// `L2FlushArgs` of `kernels/l2_flush.cu`.
#[repr(C)]
#[derive(Clone, Copy)]
struct FlushArgs {
    p: u64,
    n16: u64,
    sink: u64,
}
// SAFETY: plain data, C layout matching the kernel's `L2FlushArgs` (three 8-byte fields).
unsafe impl cudarc::driver::DeviceRepr for FlushArgs {}

/// Bytes the L2 flush before a timed call writes or reads: five times the H100's 50 MB L2.
const FLUSH_BYTES: usize = 256 << 20;

/// The CUDA backend on one GPU.
#[derive(Debug)]
pub struct CudaBackend {
    dev: Arc<Device>,
    /// 256 MB written or read before each timed call (see [`L2Flush`]), allocated on first use.
    flush: Mutex<Option<CudaSlice<u8>>>,
    flush_mode: L2Flush,
}

impl CudaBackend {
    /// Opens GPU `device_ordinal`. Returns `SdpaError::DeviceUnavailable` (never panics) when there is no
    /// driver library, no GPU, or no GPU with that ordinal.
    pub fn new(device_ordinal: usize) -> Result<Self> {
        Ok(CudaBackend {
            dev: Arc::new(Device::open(device_ordinal)?),
            flush: Mutex::new(None),
            flush_mode: L2Flush::Dirty,
        })
    }

    /// A backend on the context of a caller's stream (e.g. candle's device); launches of
    /// [`Self::forward`] go to that stream too.
    pub fn from_stream(stream: Arc<CudaStream>) -> Result<Self> {
        Ok(CudaBackend {
            dev: Arc::new(Device::from_stream(stream)?),
            flush: Mutex::new(None),
            flush_mode: L2Flush::Dirty,
        })
    }

    /// The same backend, with timed calls flushing L2 the given way ([`L2Flush::Dirty`] by default).
    pub fn with_l2_flush(mut self, mode: L2Flush) -> Self {
        self.flush_mode = mode;
        self
    }

    /// The device (limits, modules, stream).
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Limits and facts of the GPU.
    pub fn info(&self) -> &DeviceInfo {
        self.dev.info()
    }

    /// The kernel programs a forward call of `spec` with `opts` would launch on this GPU (what
    /// [`Self::warm_up`] loads), planned as [`dispatch`] plans the call, on contiguous, aligned operands
    /// (the layout `sdpa run`, `sdpa bench` and candle's contiguous tensors have).
    pub fn programs_for(&self, spec: &AttentionSpec, opts: &RunOptions) -> Result<Vec<Program>> {
        spec.validate()?;
        self.capabilities().check(BACKEND, spec, opts)?;
        let params = stand_in_params(spec, opts.lse)?;
        let call = Call { dev: &self.dev, stream: self.dev.stream(), spec, opts, params };
        crate::kernels::programs_for(&call)
    }

    /// Loads now every program the calls `(spec, opts)` would launch: images from the disk cache, the
    /// rest compiled on parallel threads, so that no first call waits for NVRTC (servers at start-up,
    /// benchmarks before timing). Returns what was loaded now (nothing for programs already loaded) and the
    /// calls this backend cannot run, by index, with the reason (running them reports the same).
    pub fn warm_up(&self, calls: &[(AttentionSpec, RunOptions)]) -> Result<WarmedUp> {
        let mut programs: Vec<Program> = Vec::new();
        let mut skipped = Vec::new();
        for (i, (spec, opts)) in calls.iter().enumerate() {
            match self.programs_for(spec, opts) {
                Ok(p) => programs.extend(p),
                Err(e) => skipped.push((i, e)),
            }
        }
        Ok(WarmedUp { loads: self.dev.prepare(&programs)?, skipped })
    }

    /// Loads now the programs the backward calls `(spec, options)` would launch (per call: its Delta, main
    /// and dQ entries, and the copies of the pad-copy path where it takes the call: head dims that are not
    /// multiples of 8, strides that are not whole 16-byte rows), compiled on parallel threads, so that no
    /// first backward call waits for NVRTC. Planned on aligned stand-in addresses, as [`Self::programs_for`]
    /// plans the forward: a call whose own base pointers are misaligned compiles the copies on first use.
    /// Calls the backward cannot run are left out (running them reports why).
    pub fn warm_up_backward(&self, calls: &[(AttentionSpec, BackwardOptions)]) -> Result<Vec<ProgramLoad>> {
        let mut programs: Vec<Program> = Vec::new();
        for (spec, bwd) in calls {
            let planned = spec
                .validate()
                .and_then(|()| stand_in_backward_params(spec, bwd))
                .and_then(|params| crate::kernels::bwd::programs_for(spec, &params, bwd.deterministic));
            if let Ok(ps) = planned {
                for p in ps {
                    if !programs.contains(&p) {
                        programs.push(p);
                    }
                }
            }
        }
        self.dev.prepare(&programs)
    }

    /// Loads every program of every kernel family (the whole compile, in parallel): for a cache that must
    /// hold everything before the machine goes offline, or to time the full compile.
    pub fn warm_up_all(&self) -> Result<Vec<ProgramLoad>> {
        self.dev.prepare(&crate::kernels::all_programs())
    }

    /// The programs loaded since the last call, with where each image came from and its cost (see
    /// [`Device::take_loads`]): what a first call paid before its kernel ran.
    pub fn take_loads(&self) -> Result<Vec<ProgramLoad>> {
        self.dev.take_loads()
    }

    /// Runs one forward call on caller-owned device memory, queued on `stream` (which must belong to
    /// this backend's context). `mask` is the explicit mask as additive f32 over its dims (required iff the
    /// spec's mask is explicit); `lse` receives `[B, Hq, Sq]` f32 when given. Lengths are checked against
    /// the spec's strides. O's element type `U` is the spec's output dtype (`T` itself, bf16 for FP8 inputs
    /// `T = u8`). Returns the kernel that ran.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_on_stream<T: CudaElement, U: CudaElement>(
        &self,
        stream: &Arc<CudaStream>,
        spec: &AttentionSpec,
        opts: &RunOptions,
        q: &impl DevicePtr<T>,
        k: &impl DevicePtr<T>,
        v: &impl DevicePtr<T>,
        mask: Option<&CudaSlice<f32>>,
        o: &mut impl DevicePtrMut<U>,
        lse: Option<&mut CudaSlice<f32>>,
        block_table: Option<&CudaSlice<u32>>,
    ) -> Result<Kernel> {
        if stream.context().cu_ctx() != self.dev.context().cu_ctx() {
            return Err(SdpaError::InvalidSpec("the stream belongs to another CUDA context than the backend".into()));
        }
        if T::DTYPE != spec.dtype {
            return Err(SdpaError::DTypeMismatch { name: "q", expected: spec.dtype, found: T::DTYPE });
        }
        if U::DTYPE != spec.out_dtype() {
            return Err(SdpaError::DTypeMismatch { name: "o", expected: spec.out_dtype(), found: U::DTYPE });
        }
        self.prepare(
            spec,
            opts,
            q.len(),
            k.len(),
            v.len(),
            o.len(),
            mask.map(|m| m.len()),
            lse.as_ref().map(|l| l.len()),
            block_table.map(|t| t.len()),
        )?;
        // Before the guards: they borrow it until the launch is queued.
        let slopes = self.alibi_slopes(spec)?;
        let ragged = self.ragged_table(spec)?;
        let mut guards: Vec<SyncOnDrop<'_>> = Vec::with_capacity(9);
        let qp = keep(&mut guards, q.device_ptr(stream));
        let kp = keep(&mut guards, k.device_ptr(stream));
        let vp = keep(&mut guards, v.device_ptr(stream));
        let mp = mask.map_or(0, |m| keep(&mut guards, m.device_ptr(stream)));
        let op = keep(&mut guards, o.device_ptr_mut(stream));
        let lp = lse.map_or(0, |l| keep(&mut guards, l.device_ptr_mut(stream)));
        let mut params = AttnParams::new(spec, qp, kp, vp, op, mp, lp)?;
        if let Some(s) = &slopes {
            params.alibi = keep(&mut guards, s.device_ptr(stream));
        }
        if let Some(t) = &ragged {
            let tp = keep(&mut guards, t.device_ptr(stream));
            let bp = block_table.map_or(0, |b| keep(&mut guards, b.device_ptr(stream)));
            params.point_at_ragged(spec, tp, bp);
        }
        let call = Call { dev: &self.dev, stream, spec, opts, params };
        let ran = dispatch(&call)?;
        drop(guards);
        Ok(ran)
    }

    /// Runs one backward call on caller-owned device memory, queued on `stream` (which must belong to this
    /// backend's context): from Q, K, V (+ the explicit mask as additive f32, required iff the spec's mask is
    /// explicit), the forward's output `o` and its LSE (`[B, Hq, Sq]` f32, `[Hq, total_q]` ragged), and the
    /// upstream gradient `d_o` (O's strides), writes `dq`, `dk`, `dv` in the spec's dtype through Q's, K's
    /// and V's strides. `dq_accum` receives dQ in f32 (Q's strides) when `bwd.dq_accum` asks for it (then it
    /// is required). Every length is checked against the spec's strides. Returns the kernel that ran and
    /// whether the run was deterministic (`bwd.deterministic`; the default path adds dQ with atomics and
    /// is not). f16/bf16 only; paged KV caches are refused.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_on_stream<T: CudaElement>(
        &self,
        stream: &Arc<CudaStream>,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        q: &impl DevicePtr<T>,
        k: &impl DevicePtr<T>,
        v: &impl DevicePtr<T>,
        mask: Option<&CudaSlice<f32>>,
        o: &impl DevicePtr<T>,
        d_o: &impl DevicePtr<T>,
        lse: &CudaSlice<f32>,
        dq: &mut impl DevicePtrMut<T>,
        dk: &mut impl DevicePtrMut<T>,
        dv: &mut impl DevicePtrMut<T>,
        dq_accum: Option<&mut CudaSlice<f32>>,
    ) -> Result<BackwardRun> {
        if stream.context().cu_ctx() != self.dev.context().cu_ctx() {
            return Err(SdpaError::InvalidSpec("the stream belongs to another CUDA context than the backend".into()));
        }
        if T::DTYPE != spec.dtype {
            return Err(SdpaError::DTypeMismatch { name: "q", expected: spec.dtype, found: T::DTYPE });
        }
        let lens = BackwardLens {
            q: q.len(),
            k: k.len(),
            v: v.len(),
            mask: mask.map(|m| m.len()),
            o: o.len(),
            d_o: d_o.len(),
            lse: lse.len(),
            dq: dq.len(),
            dk: dk.len(),
            dv: dv.len(),
            dq_accum: dq_accum.as_ref().map(|a| a.len()),
        };
        self.prepare_backward(spec, opts, bwd, &lens)?;
        let mut guards: Vec<SyncOnDrop<'_>> = Vec::with_capacity(11);
        let ptrs = BackwardPtrs {
            q: keep(&mut guards, q.device_ptr(stream)),
            k: keep(&mut guards, k.device_ptr(stream)),
            v: keep(&mut guards, v.device_ptr(stream)),
            mask: mask.map_or(0, |m| keep(&mut guards, m.device_ptr(stream))),
            o: keep(&mut guards, o.device_ptr(stream)),
            d_o: keep(&mut guards, d_o.device_ptr(stream)),
            lse: keep(&mut guards, lse.device_ptr(stream)),
            dq: keep(&mut guards, dq.device_ptr_mut(stream)),
            dk: keep(&mut guards, dk.device_ptr_mut(stream)),
            dv: keep(&mut guards, dv.device_ptr_mut(stream)),
            dq_f32: match dq_accum {
                Some(a) if bwd.dq_accum => keep(&mut guards, a.device_ptr_mut(stream)),
                _ => 0,
            },
        };
        self.launch_backward(stream, spec, opts, bwd, ptrs, guards)
    }

    /// Checks what a backward call relies on beyond the spec's validation: capabilities, every buffer's
    /// length against the spec's strides, the f32 dQ output when asked for.
    fn prepare_backward(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        l: &BackwardLens,
    ) -> Result<()> {
        spec.validate()?;
        self.capabilities().check_backward(BACKEND, spec, opts)?;
        spec.check_lengths(l.q, l.k, l.v, l.o, l.mask)?;
        let (nq, nk, nv, no) = (
            spec.required_len(Operand::Q)?,
            spec.required_len(Operand::K)?,
            spec.required_len(Operand::V)?,
            spec.required_len(Operand::O)?,
        );
        let dq32 = if bwd.dq_accum { Some(l.dq_accum.unwrap_or(0)) } else { None };
        let checks = [
            ("d_o", l.d_o, no),
            ("dq", l.dq, nq),
            ("dk", l.dk, nk),
            ("dv", l.dv, nv),
            ("lse", l.lse, spec.lse_len()?),
            ("dq_accum", dq32.unwrap_or(nq), nq),
        ];
        for (name, len, needed) in checks {
            if len < needed {
                return Err(SdpaError::BufferTooShort { name, len, needed });
            }
        }
        Ok(())
    }

    /// Queues the backward's launches on `stream`: the operands' pointers checked against the spec, each
    /// kept ordered by its guard in `guards` until the launches are queued; the ALiBi slopes and a ragged
    /// batch's offsets are uploaded (kept per content by the device) and pointed at here.
    fn launch_backward(
        &self,
        stream: &Arc<CudaStream>,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        p: BackwardPtrs,
        guards: Vec<SyncOnDrop<'_>>,
    ) -> Result<BackwardRun> {
        crate::kernels::policy::choose_backward(opts.kernel)?;
        let slopes = self.alibi_slopes(spec)?;
        let ragged = self.ragged_table(spec)?;
        let mut more: Vec<SyncOnDrop<'_>> = Vec::with_capacity(2);
        let mut params = AttnParams::new(spec, p.q, p.k, p.v, p.o, p.mask, p.lse)?;
        params.alibi = slopes.as_ref().map_or(0, |s| keep(&mut more, s.device_ptr(stream)));
        if let Some(t) = &ragged {
            params.point_at_ragged(spec, keep(&mut more, t.device_ptr(stream)), 0);
        }
        let call = Call { dev: &self.dev, stream, spec, opts, params };
        let ptrs = crate::kernels::bwd::BwdParams {
            attn: params,
            d_o: p.d_o,
            dq: p.dq,
            dk: p.dk,
            dv: p.dv,
            delta: 0,
            dq_acc: 0,
            dq_f32: p.dq_f32,
        };
        let deterministic = crate::kernels::bwd::run(&call, ptrs, bwd.deterministic);
        drop(more);
        drop(guards);
        Ok(BackwardRun { kernel: Kernel::Fa2, deterministic: deterministic? })
    }

    /// The "write to cache" step of a paged KV cache on the device, exactly [`sdpa_core::append_to_pages`]:
    /// the packed new rows `new` (`[total_new, Hkv, D]` in `spec.new_strides`) copied into `pages` after
    /// each sequence's `spec.cache_lens` tokens, through the device block `table`, on `stream`. Call it once
    /// for K and once for V (`spec.for_dim(dv)`). The spec is checked on the host first
    /// ([`AppendSpec::validate`](sdpa_core::AppendSpec::validate): lengths, room in the block table, buffer
    /// lengths, the table's length); the table's entries are the caller's device data, clamped into the
    /// pool by the kernel (check them on the host with `validate` where a host copy exists). Nothing is
    /// written when a check fails.
    pub fn append_to_pages<T: CudaElement>(
        &self,
        stream: &Arc<CudaStream>,
        spec: &sdpa_core::AppendSpec,
        table: &CudaSlice<u32>,
        new: &impl DevicePtr<T>,
        pages: &mut impl DevicePtrMut<T>,
    ) -> Result<()> {
        if stream.context().cu_ctx() != self.dev.context().cu_ctx() {
            return Err(SdpaError::InvalidSpec("the stream belongs to another CUDA context than the backend".into()));
        }
        let rows_needed = spec.cache_lens.len().saturating_mul(spec.paging.max_pages);
        if table.len() < rows_needed {
            return Err(SdpaError::BufferTooShort { name: "block table", len: table.len(), needed: rows_needed });
        }
        // Every check but the table's entries, which live on the device: a table of page 0 stands in.
        spec.validate(&vec![0; rows_needed], new.len(), pages.len())?;
        let rows = crate::kernels::paged_append::token_rows(spec)?;
        if rows.is_empty() {
            return Ok(());
        }
        let rows = self.dev.table_i32(&rows, "an append's token positions")?;
        let mut guards: Vec<SyncOnDrop<'_>> = Vec::with_capacity(4);
        let ptrs = crate::kernels::paged_append::AppendPtrs {
            new: keep(&mut guards, new.device_ptr(stream)),
            pages: keep(&mut guards, pages.device_ptr_mut(stream)),
            table: keep(&mut guards, table.device_ptr(stream)),
            rows: keep(&mut guards, rows.device_ptr(stream)),
        };
        // SAFETY: the lengths were checked against the validated spec above (new rows, pages, table), `rows`
        // is `token_rows(spec)`, and the guards keep every buffer alive and ordered on `stream` until the
        // launch is queued.
        unsafe { crate::kernels::paged_append::run(&self.dev, stream, spec, std::mem::size_of::<T>(), ptrs) }?;
        drop(guards);
        Ok(())
    }

    /// Checks what `forward` relies on beyond the caller's validation.
    #[allow(clippy::too_many_arguments)]
    fn prepare(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        q: usize,
        k: usize,
        v: usize,
        o: usize,
        mask: Option<usize>,
        lse: Option<usize>,
        block_table: Option<usize>,
    ) -> Result<()> {
        spec.validate()?;
        spec.check_lengths(q, k, v, o, mask)?;
        // A device block table's length is checked here; its entries are the caller's (the host entry
        // points check them, `HostInputs::check`) and the kernels clamp them into the pool.
        match (spec.ragged.as_ref().and_then(|r| r.pages.map(|p| (r.batch(), p))), block_table) {
            (None, None) => {}
            (None, Some(_)) => {
                return Err(SdpaError::InvalidSpec("a block table was given but K/V are not paged".into()))
            }
            (Some(_), None) => return Err(SdpaError::InvalidSpec("a paged KV cache needs its block table".into())),
            (Some((b, p)), Some(len)) => {
                let needed = b.saturating_mul(p.max_pages);
                if len < needed {
                    return Err(SdpaError::BufferTooShort { name: "block table", len, needed });
                }
            }
        }
        if let Some(len) = lse {
            let needed = spec.lse_len()?;
            if len < needed {
                return Err(SdpaError::BufferTooShort { name: "lse", len, needed });
            }
        }
        if opts.lse && lse.is_none() {
            return Err(SdpaError::InvalidSpec("options ask for LSE but no LSE buffer was given".into()));
        }
        self.capabilities().check(BACKEND, spec, opts)
    }

    /// A ragged call's offsets and cache lengths on the device ([`AttnParams::ragged_table`], kept per
    /// content by the device), when the batch is ragged.
    fn ragged_table(&self, spec: &AttentionSpec) -> Result<Option<Arc<CudaSlice<i32>>>> {
        AttnParams::ragged_table(spec).map(|t| self.dev.table_i32(&t, "a ragged batch's offsets")).transpose()
    }

    /// The call's ALiBi slopes on the device (kept per slope set by the device), when ALiBi is on.
    fn alibi_slopes(&self, spec: &AttentionSpec) -> Result<Option<Arc<CudaSlice<f32>>>> {
        spec.alibi_slopes()?.map(|s| self.dev.alibi_slopes(&s)).transpose()
    }

    fn flush_l2(&self) -> Result<()> {
        let mut slot = self.flush.lock().map_err(|_| unsupported("flush buffer lock poisoned"))?;
        if slot.is_none() {
            let s =
                self.dev.stream().alloc_zeros::<u8>(FLUSH_BYTES).map_err(drv("cuMemAlloc", "the L2 flush buffer"))?;
            *slot = Some(s);
        }
        let Some(buf) = slot.as_mut() else { return Ok(()) };
        let stream = self.dev.stream();
        match self.flush_mode {
            L2Flush::Dirty => stream.memset_zeros(buf).map_err(drv("cuMemsetD8Async", "flushing L2")),
            L2Flush::Clean => {
                let (ptr, guard) = buf.device_ptr_mut(stream);
                let args = FlushArgs { p: ptr, n16: (FLUSH_BYTES / 16) as u64, sink: ptr };
                let sms = self.dev.info().sm_count.max(1) as u32;
                let dims =
                    crate::checked::launch::LaunchDims { grid: (4 * sms, 1, 1), block: (256, 1, 1), smem_bytes: 0 };
                // SAFETY: `buf` is a live allocation of FLUSH_BYTES bytes (16-byte aligned, as every
                // cuMemAlloc); the kernel reads exactly FLUSH_BYTES / 16 words of it and writes its first
                // word only if they XOR to a value the zeroed buffer never gives. The guard orders later
                // uses of `buf` after the launch.
                let r = unsafe {
                    crate::checked::launch::launch(
                        &self.dev,
                        stream,
                        &crate::kernels::l2_flush_program(),
                        "l2_flush_read",
                        dims,
                        &args,
                    )
                };
                drop(guard);
                r
            }
        }
    }
}

/// Buffer lengths of a backward call (elements), for [`CudaBackend::prepare_backward`].
struct BackwardLens {
    q: usize,
    k: usize,
    v: usize,
    mask: Option<usize>,
    o: usize,
    d_o: usize,
    lse: usize,
    dq: usize,
    dk: usize,
    dv: usize,
    dq_accum: Option<usize>,
}

/// Distinct, 256-byte aligned stand-in address number `i`, for planning a call without its buffers: planning
/// reads pointers for their alignment only (and the TMA path encodes tensor maps, which never dereference
/// them).
fn stand_in(i: u64) -> u64 {
    (i + 1) << 32
}

/// The parameters of a validated `spec` on [`stand_in`] addresses (with the LSE when `lse`): the alignment of
/// contiguous allocations, the layout `sdpa run`, `sdpa bench` and candle's contiguous tensors have; the
/// strides are the spec's own.
fn stand_in_params(spec: &AttentionSpec, lse: bool) -> Result<AttnParams> {
    let mask = if matches!(spec.mask, Mask::Explicit(_)) { stand_in(4) } else { 0 };
    let lse = if lse { stand_in(5) } else { 0 };
    let mut params = AttnParams::new(spec, stand_in(0), stand_in(1), stand_in(2), stand_in(3), mask, lse)?;
    if spec.variants.alibi.is_some() {
        params.alibi = stand_in(6);
    }
    Ok(params)
}

/// [`stand_in_params`] for a backward call of `spec` with `bwd`: the LSE, dO, dQ, dK, dV and, when asked
/// for, the f32 dQ on stand-in addresses too.
fn stand_in_backward_params(spec: &AttentionSpec, bwd: &BackwardOptions) -> Result<crate::kernels::bwd::BwdParams> {
    Ok(crate::kernels::bwd::BwdParams {
        attn: stand_in_params(spec, true)?,
        d_o: stand_in(7),
        dq: stand_in(8),
        dk: stand_in(9),
        dv: stand_in(10),
        delta: 0,
        dq_acc: 0,
        dq_f32: if bwd.dq_accum { stand_in(11) } else { 0 },
    })
}

/// Device addresses of a backward call's buffers (0: absent), ordered on the call's stream by guards the
/// caller holds.
struct BackwardPtrs {
    q: u64,
    k: u64,
    v: u64,
    mask: u64,
    o: u64,
    d_o: u64,
    lse: u64,
    dq: u64,
    dk: u64,
    dv: u64,
    dq_f32: u64,
}

/// What [`CudaBackend::warm_up`] did.
#[derive(Debug)]
pub struct WarmedUp {
    /// The programs loaded now, in load order.
    pub loads: Vec<ProgramLoad>,
    /// The calls left out (index into the calls given, and why the backend cannot run them).
    pub skipped: Vec<(usize, SdpaError)>,
}

/// Keeps the guard of a device pointer (it orders later uses of the memory after this call's launches)
/// until the caller drops `guards`, and returns the pointer.
fn keep<'a>(guards: &mut Vec<SyncOnDrop<'a>>, (ptr, guard): (u64, SyncOnDrop<'a>)) -> u64 {
    guards.push(guard);
    ptr
}

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;
    type Index = CudaSlice<u32>;

    fn name(&self) -> &'static str {
        BACKEND
    }

    fn device_name(&self) -> String {
        let i = self.dev.info();
        format!("{} (sm_{}{}, {} SMs)", i.name, i.compute_capability.0, i.compute_capability.1, i.sm_count)
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // f8e4m3 on fa3 only (sm_90); every other kernel refuses it (kernels::policy).
            dtypes: [DType::ALL.as_slice(), &[DType::F8E4M3]].concat(),
            kernels: vec![Kernel::Unfused, Kernel::Fa1, Kernel::Fa2, Kernel::SplitKv, Kernel::Fa3],
            max_head_dim: MAX_HEAD_DIM,
            fast_head_dims: FA1_FAST_HEAD_DIMS.to_vec(),
            masks: MaskKind::ALL.to_vec(),
            f32_math: vec![F32Math::Exact, F32Math::Tf32, F32Math::SplitTf32],
            // Every kernel honours them except the TF32 path, which refuses them (kernels::policy).
            variants: Variant::ALL.to_vec(),
            // fa2 runs both (splitkv decodes them); fa1, unfused and the f32 paths refuse them (kernels::policy).
            serving: Serving::ALL.to_vec(),
            // The tensor-core backward (kernels::bwd), f16/bf16, any head dim up to 256 (those that are not
            // multiples of 8 through kernels::bwd_pad); f32 and paged caches are refused there.
            backward: vec![Kernel::Fa2],
        }
    }

    fn check_device_memory(&self, spec: &AttentionSpec, opts: &RunOptions) -> Result<()> {
        let b = sdpa_core::memory::OperandBytes::of(spec)?;
        let lse = if opts.lse { b.lse } else { 0 };
        // `unfused` materialises the scores of every head in one cuBLAS batch (f32) and the probabilities
        // (in the dtype) beside them.
        let scores = if opts.kernel == Kernel::Unfused {
            let s = &spec.shape;
            let per_element = 4 + spec.dtype.size_bytes();
            [s.b, s.hq, s.sq, s.sk, per_element].iter().fold(1u64, |a, &x| a.saturating_mul(x as u64))
        } else {
            0
        };
        let needed = b.inputs().saturating_add(b.o).saturating_add(lse).saturating_add(scores);
        self.dev.require_free(needed, || format!("a cuda {} call on shape {}", opts.kernel, spec.shape))
    }

    fn prepare_kernels(&self, calls: &[(AttentionSpec, RunOptions)]) -> Result<Vec<ProgramLoad>> {
        // The calls left out are reported when they run.
        self.warm_up(calls).map(|w| w.loads)
    }

    fn program_loads(&self) -> Vec<ProgramLoad> {
        // Only a poisoned lock (an earlier panic) fails; the record then lacks the list, nothing else.
        self.take_loads().unwrap_or_default()
    }

    fn upload(&self, host: &HostBuffer) -> Result<CudaBuffer> {
        CudaBuffer::upload(self.dev.stream(), host)
    }

    fn download(&self, buf: &CudaBuffer) -> Result<HostBuffer> {
        buf.download(self.dev.stream())
    }

    fn upload_index(&self, host: &[u32]) -> Result<CudaSlice<u32>> {
        let bytes = std::mem::size_of_val(host);
        self.dev.stream().clone_htod(host).map_err(crate::error::driver(
            "cuMemcpyHtoD",
            "uploading a block table",
            bytes,
        ))
    }

    fn synchronize(&self) -> Result<()> {
        self.dev.synchronize()
    }

    fn forward(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        args: ForwardArgs<'_, CudaBuffer, CudaSlice<u32>>,
    ) -> Result<Kernel> {
        for (name, b, expected) in [
            ("q", args.q, spec.dtype),
            ("k", args.k, spec.dtype),
            ("v", args.v, spec.dtype),
            ("o", &*args.o, spec.out_dtype()),
        ] {
            if b.dtype() != expected {
                return Err(SdpaError::DTypeMismatch { name, expected, found: b.dtype() });
            }
        }
        for (name, b) in [("mask", args.mask), ("lse", args.lse.as_deref())] {
            if let Some(b) = b {
                if b.dtype() != DType::F32 {
                    return Err(SdpaError::DTypeMismatch { name, expected: DType::F32, found: b.dtype() });
                }
            }
        }
        if matches!(spec.mask, Mask::Explicit(_)) != args.mask.is_some() {
            return Err(SdpaError::InvalidSpec("an explicit mask needs a mask buffer, and only it".into()));
        }
        self.prepare(
            spec,
            opts,
            args.q.len(),
            args.k.len(),
            args.v.len(),
            args.o.len(),
            args.mask.map(CudaBuffer::len),
            args.lse.as_deref().map(CudaBuffer::len),
            args.block_table.map(|t| t.len()),
        )?;
        let stream = self.dev.stream();
        // Before the guards: they borrow it until the launch is queued.
        let slopes = self.alibi_slopes(spec)?;
        let ragged = self.ragged_table(spec)?;
        let mut guards = Vec::with_capacity(9);
        let q = keep(&mut guards, args.q.ptr(stream));
        let k = keep(&mut guards, args.k.ptr(stream));
        let v = keep(&mut guards, args.v.ptr(stream));
        let mask = args.mask.map_or(0, |m| keep(&mut guards, m.ptr(stream)));
        let o = keep(&mut guards, args.o.ptr_mut(stream));
        let lse = args.lse.map_or(0, |l| keep(&mut guards, l.ptr_mut(stream)));
        let mut params = AttnParams::new(spec, q, k, v, o, mask, lse)?;
        if let Some(s) = &slopes {
            params.alibi = keep(&mut guards, s.device_ptr(stream));
        }
        if let Some(t) = &ragged {
            let tp = keep(&mut guards, t.device_ptr(stream));
            let bp = args.block_table.map_or(0, |b| keep(&mut guards, b.device_ptr(stream)));
            params.point_at_ragged(spec, tp, bp);
        }
        let call = Call { dev: &self.dev, stream, spec, opts, params };
        let ran = dispatch(&call)?;
        drop(guards);
        Ok(ran)
    }

    fn backward(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        args: BackwardArgs<'_, CudaBuffer>,
    ) -> Result<BackwardRun> {
        let halves = [("q", args.q), ("k", args.k), ("v", args.v), ("o", args.o), ("d_o", args.d_o)];
        let outs = [("dq", &*args.dq), ("dk", &*args.dk), ("dv", &*args.dv)];
        for (name, b) in halves.into_iter().chain(outs) {
            if b.dtype() != spec.dtype {
                return Err(SdpaError::DTypeMismatch { name, expected: spec.dtype, found: b.dtype() });
            }
        }
        let f32s = [("mask", args.mask), ("lse", Some(args.lse)), ("dq_accum", args.dq_accum.as_deref())];
        for (name, b) in f32s {
            if let Some(b) = b {
                if b.dtype() != DType::F32 {
                    return Err(SdpaError::DTypeMismatch { name, expected: DType::F32, found: b.dtype() });
                }
            }
        }
        if matches!(spec.mask, Mask::Explicit(_)) != args.mask.is_some() {
            return Err(SdpaError::InvalidSpec("an explicit mask needs a mask buffer, and only it".into()));
        }
        let lens = BackwardLens {
            q: args.q.len(),
            k: args.k.len(),
            v: args.v.len(),
            mask: args.mask.map(CudaBuffer::len),
            o: args.o.len(),
            d_o: args.d_o.len(),
            lse: args.lse.len(),
            dq: args.dq.len(),
            dk: args.dk.len(),
            dv: args.dv.len(),
            dq_accum: args.dq_accum.as_deref().map(CudaBuffer::len),
        };
        self.prepare_backward(spec, opts, bwd, &lens)?;
        let stream = self.dev.stream();
        let mut guards = Vec::with_capacity(11);
        let ptrs = BackwardPtrs {
            q: keep(&mut guards, args.q.ptr(stream)),
            k: keep(&mut guards, args.k.ptr(stream)),
            v: keep(&mut guards, args.v.ptr(stream)),
            mask: args.mask.map_or(0, |m| keep(&mut guards, m.ptr(stream))),
            o: keep(&mut guards, args.o.ptr(stream)),
            d_o: keep(&mut guards, args.d_o.ptr(stream)),
            lse: keep(&mut guards, args.lse.ptr(stream)),
            dq: keep(&mut guards, args.dq.ptr_mut(stream)),
            dk: keep(&mut guards, args.dk.ptr_mut(stream)),
            dv: keep(&mut guards, args.dv.ptr_mut(stream)),
            dq_f32: match args.dq_accum {
                Some(a) if bwd.dq_accum => keep(&mut guards, a.ptr_mut(stream)),
                _ => 0,
            },
        };
        self.launch_backward(stream, spec, opts, bwd, ptrs, guards)
    }

    /// Device-event timing of a pass (forward, backward, or both in turn), each rep bracketed by two events
    /// after the L2 flush ([`L2Flush`]), as [`Backend::time_forward`] times the forward.
    fn time_pass(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        bufs: &mut PassBuffers<CudaBuffer, CudaSlice<u32>>,
        pass: Pass,
        warmup: usize,
        reps: usize,
    ) -> Result<Vec<f64>> {
        let ctx = self.dev.context();
        let stream = self.dev.stream();
        let mut pairs = Vec::with_capacity(reps);
        for i in 0..warmup + reps {
            self.flush_l2()?;
            let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            let events = if i < warmup {
                None
            } else {
                let start = ctx.new_event(timed).map_err(drv("cuEventCreate", "timing"))?;
                let end = ctx.new_event(timed).map_err(drv("cuEventCreate", "timing"))?;
                start.record(stream).map_err(drv("cuEventRecord", "timing"))?;
                Some((start, end))
            };
            if pass.has_forward() {
                self.forward(spec, opts, bufs.fwd_args())?;
            }
            if pass.has_backward() {
                self.backward(spec, opts, bwd, bufs.bwd_args())?;
            }
            if let Some((start, end)) = events {
                end.record(stream).map_err(drv("cuEventRecord", "timing"))?;
                pairs.push((start, end));
            }
        }
        self.dev.synchronize()?;
        pairs
            .iter()
            .map(|(s, e)| s.elapsed_ms(e).map(|ms| ms as f64).map_err(drv("cuEventElapsedTime", "timing")))
            .collect()
    }

    /// Device-event timing: each call is bracketed by two events after an L2 flush ([`L2Flush`]; by default
    /// a write of 256 MB, as `do_bench` does).
    fn time_forward(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        mut args: ForwardArgs<'_, CudaBuffer, CudaSlice<u32>>,
        warmup: usize,
        reps: usize,
    ) -> Result<Vec<f64>> {
        let ctx = self.dev.context();
        let stream = self.dev.stream();
        let mut pairs = Vec::with_capacity(reps);
        for i in 0..warmup + reps {
            self.flush_l2()?;
            let a = ForwardArgs {
                q: args.q,
                k: args.k,
                v: args.v,
                mask: args.mask,
                o: &mut *args.o,
                lse: args.lse.as_deref_mut(),
                block_table: args.block_table,
            };
            if i < warmup {
                self.forward(spec, opts, a)?;
                continue;
            }
            // cudarc's default event flags disable timing; elapsed times need CU_EVENT_DEFAULT.
            let timed = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
            let start = ctx.new_event(timed).map_err(drv("cuEventCreate", "timing"))?;
            let end = ctx.new_event(timed).map_err(drv("cuEventCreate", "timing"))?;
            start.record(stream).map_err(drv("cuEventRecord", "timing"))?;
            self.forward(spec, opts, a)?;
            end.record(stream).map_err(drv("cuEventRecord", "timing"))?;
            pairs.push((start, end));
        }
        self.dev.synchronize()?;
        pairs
            .iter()
            .map(|(s, e)| s.elapsed_ms(e).map(|ms| ms as f64).map_err(drv("cuEventElapsedTime", "timing")))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{bwd, pad_copy};
    use sdpa_core::{Layout, Shape, Strides};

    /// A backward warm-up plans on the stand-ins with the spec's own strides: a view whose rows are not whole
    /// 16-byte chunks (D = 64 in rows 66 elements apart) compiles the copies it will run; a contiguous one,
    /// and an f32 dQ on its stand-in, stay in place.
    #[test]
    fn backward_warm_ups_take_the_copies_for_strides_off_16_bytes() {
        let spec = AttentionSpec::new(Shape { b: 2, hq: 2, hkv: 2, sq: 10, sk: 10, d: 64, dv: 64 }, DType::BF16)
            .with_layout(Layout::Bshd);
        let copies = |spec: &AttentionSpec, bwd: BackwardOptions| {
            let params = stand_in_backward_params(spec, &bwd).expect("params");
            let programs = bwd::programs_for(spec, &params, bwd.deterministic).expect("programs");
            programs.contains(&pad_copy::program())
        };
        let with_f32 = BackwardOptions { deterministic: false, dq_accum: true };
        assert!(!copies(&spec, BackwardOptions::default()) && !copies(&spec, with_f32));
        let mut wide = spec.clone();
        wide.q_strides = Strides { b: 10 * 2 * 66, h: 66, s: 2 * 66 };
        wide.validate().expect("a strided view of Q");
        assert!(copies(&wide, BackwardOptions::default()));
    }
}
