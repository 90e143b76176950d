//! `CpuBackend`: the CPU kernels behind sdpa-core's `Backend` trait, on host buffers.

use crate::backward::BackwardSlices;
use crate::element::CpuElement;
use crate::run::{attention_on, backward_on, pool_of, BACKEND, MAX_HEAD_DIM};
use crate::simd::SimdPath;
use rayon::ThreadPool;
use sdpa_core::backward::{BackwardOptions, BackwardRun};
use sdpa_core::{
    AttentionSpec, Backend, BackwardArgs, Capabilities, DType, F32Math, ForwardArgs, HostBuffer, Kernel, MaskKind,
    Result, RunOptions, SdpaError, Serving, Variant,
};
use std::sync::Arc;

/// The CPU backend: `unfused`, `fa2`, `splitkv` and `auto`, f32/f16/bf16, every mask, on one SIMD path
/// chosen at construction (the fastest this CPU supports unless forced with `SDPA_CPU_SIMD` or
/// [`CpuBackend::with_simd`]); `device_name()` says which, so every record carries it.
#[derive(Clone)]
pub struct CpuBackend {
    simd: SimdPath,
    threads: Option<usize>,
    pool: Option<Arc<ThreadPool>>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend").field("simd", &self.simd).field("threads", &self.threads).finish()
    }
}

impl CpuBackend {
    /// A backend on the fastest SIMD path of this CPU, or the one `SDPA_CPU_SIMD` names
    /// ([`SimdPath::chosen`]). `threads`: a pool of that many workers, or `None` for the global rayon pool
    /// (`RAYON_NUM_THREADS`). `RunOptions::threads`, when set, overrides both.
    pub fn new(threads: Option<usize>) -> Result<CpuBackend> {
        let simd = SimdPath::chosen().map_err(|what| SdpaError::Unsupported { backend: BACKEND, what })?;
        Self::with_simd(simd, threads)
    }

    /// A backend forced onto `simd` (tests run every supported path); `Unsupported` when this CPU lacks it.
    pub fn with_simd(simd: SimdPath, threads: Option<usize>) -> Result<CpuBackend> {
        if !simd.is_supported() {
            return Err(SdpaError::Unsupported { backend: BACKEND, what: format!("simd path {simd} on this CPU") });
        }
        let pool = threads.map(pool_of).transpose()?;
        Ok(CpuBackend { simd, threads, pool })
    }

    /// The SIMD path in use.
    pub fn simd(&self) -> SimdPath {
        self.simd
    }

    /// Worker threads a call will use when `RunOptions::threads` is unset.
    pub fn threads(&self) -> usize {
        self.pool.as_ref().map_or_else(rayon::current_num_threads, |p| p.current_num_threads())
    }
}

fn mismatch(name: &'static str, expected: DType, found: &HostBuffer) -> SdpaError {
    SdpaError::DTypeMismatch { name, expected, found: found.dtype() }
}

/// The slice of a host buffer of element type `T`, or the mismatch naming it.
fn typed<'a, T: CpuElement>(name: &'static str, b: &'a HostBuffer) -> Result<&'a [T]> {
    T::of_host(b).ok_or_else(|| mismatch(name, T::DTYPE, b))
}

/// The mutable slice of a host buffer of element type `T`.
fn typed_mut<'a, T: CpuElement>(name: &'static str, b: &'a mut HostBuffer) -> Result<&'a mut [T]> {
    let found = b.dtype();
    T::of_host_mut(b).ok_or(SdpaError::DTypeMismatch { name, expected: T::DTYPE, found })
}

/// An f32 host buffer (mask, LSE, f32 dQ).
fn f32_buf<'a>(name: &'static str, b: &'a HostBuffer) -> Result<&'a [f32]> {
    typed::<f32>(name, b)
}

impl CpuBackend {
    fn backward_typed<T: CpuElement>(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        args: BackwardArgs<'_, HostBuffer>,
    ) -> Result<BackwardRun> {
        let x = BackwardSlices::<T> {
            q: typed("q", args.q)?,
            k: typed("k", args.k)?,
            v: typed("v", args.v)?,
            mask: args.mask.map(|m| f32_buf("mask", m)).transpose()?,
            o: typed("o", args.o)?,
            d_o: typed("d_o", args.d_o)?,
            lse: f32_buf("lse", args.lse)?,
            dq: typed_mut("dq", args.dq)?,
            dk: typed_mut("dk", args.dk)?,
            dv: typed_mut("dv", args.dv)?,
            dq_accum: args.dq_accum.map(|a| typed_mut::<f32>("dq_accum", a)).transpose()?,
        };
        backward_on(self.simd, self.pool.as_deref(), spec, opts, bwd, x)
    }
}

impl Backend for CpuBackend {
    type Buffer = HostBuffer;
    type Index = Vec<u32>;

    fn name(&self) -> &'static str {
        BACKEND
    }

    fn device_name(&self) -> String {
        format!("{} ({}, {} threads)", sdpa_core::hardware::cpu_model(), self.simd, self.threads())
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            dtypes: DType::ALL.to_vec(),
            kernels: vec![Kernel::Unfused, Kernel::Fa2, Kernel::SplitKv],
            max_head_dim: MAX_HEAD_DIM,
            fast_head_dims: vec![64, 128],
            masks: MaskKind::ALL.to_vec(),
            f32_math: vec![F32Math::Exact],
            // Every kernel honours all three (natively: no bias tensor, no tiles outside the band).
            variants: Variant::ALL.to_vec(),
            serving: Serving::ALL.to_vec(),
            // The fused backward (FlashAttention-2 style); `auto` runs it.
            backward: vec![Kernel::Fa2],
        }
    }

    fn host_bytes_per_call(&self, spec: &AttentionSpec, opts: &RunOptions) -> Result<Option<u64>> {
        let copies = sdpa_core::memory::host_call_bytes(spec, opts.lse)?;
        // `unfused` holds a whole Sk x Sq score matrix (and f32 copies of K and V) per head in flight, one
        // head per worker; the fused kernels per-thread tiles, small beside the buffers, and each worker a
        // staged kv head where one fits (`fa2::staged`).
        let threads = opts.threads.unwrap_or_else(|| self.threads()) as u64;
        let workspace = if opts.kernel == Kernel::Unfused {
            let s = &spec.shape;
            let per_head = (s.sk as u64)
                .saturating_mul(s.sq as u64 + 16)
                .saturating_add((s.sk as u64).saturating_mul((s.d + s.dv) as u64))
                .saturating_add((s.d.max(s.dv) as u64).saturating_mul(s.sq as u64 + 16))
                .saturating_mul(4);
            let in_flight = threads.min((s.b * s.hq) as u64).max(1);
            per_head.saturating_mul(in_flight)
        } else {
            let (s, paged) = (&spec.shape, spec.ragged.as_ref().is_some_and(|r| r.pages.is_some()));
            crate::fa2::staged_worker_bytes(s.sk, s.d, s.dv, spec.dtype, self.simd, paged)
                .saturating_mul(threads.max(1))
        };
        Ok(Some(copies.saturating_add(workspace)))
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
        Ok(())
    }

    fn forward(&self, spec: &AttentionSpec, opts: &RunOptions, args: ForwardArgs<'_, HostBuffer>) -> Result<Kernel> {
        if spec.dtype == DType::F8E4M3 {
            return Err(fp8_refused());
        }
        let mask = match args.mask {
            Some(HostBuffer::F32(m)) => Some(m.as_slice()),
            Some(other) => return Err(mismatch("mask", DType::F32, other)),
            None => None,
        };
        let lse = match args.lse {
            Some(HostBuffer::F32(l)) => Some(l.as_mut_slice()),
            Some(other) => return Err(mismatch("lse", DType::F32, other)),
            None => None,
        };
        let pool = self.pool.as_deref();
        let table = args.block_table.map(Vec::as_slice);
        let dt = spec.dtype;
        match (args.q, args.k, args.v, args.o) {
            (HostBuffer::F32(q), HostBuffer::F32(k), HostBuffer::F32(v), HostBuffer::F32(o)) => {
                attention_on(self.simd, pool, spec, opts, q, k, v, mask, table, o, lse)
            }
            (HostBuffer::F16(q), HostBuffer::F16(k), HostBuffer::F16(v), HostBuffer::F16(o)) => {
                attention_on(self.simd, pool, spec, opts, q, k, v, mask, table, o, lse)
            }
            (HostBuffer::BF16(q), HostBuffer::BF16(k), HostBuffer::BF16(v), HostBuffer::BF16(o)) => {
                attention_on(self.simd, pool, spec, opts, q, k, v, mask, table, o, lse)
            }
            (q, k, v, o) => {
                let bad = [("q", q), ("k", k), ("v", v), ("o", &*o)]
                    .into_iter()
                    .find(|(_, b)| b.dtype() != dt)
                    .map_or(("q", q.dtype()), |(n, b)| (n, b.dtype()));
                Err(SdpaError::DTypeMismatch { name: bad.0, expected: dt, found: bad.1 })
            }
        }
    }

    fn backward(
        &self,
        spec: &AttentionSpec,
        opts: &RunOptions,
        bwd: &BackwardOptions,
        args: BackwardArgs<'_, HostBuffer>,
    ) -> Result<BackwardRun> {
        match spec.dtype {
            DType::F32 => self.backward_typed::<f32>(spec, opts, bwd, args),
            DType::F16 => self.backward_typed::<half::f16>(spec, opts, bwd, args),
            DType::BF16 => self.backward_typed::<half::bf16>(spec, opts, bwd, args),
            DType::F8E4M3 => Err(fp8_refused()),
        }
    }
}

/// The CPU refuses FP8 inputs: it has no FP8 arithmetic, so a per-tile dequantization would only be the
/// bf16 kernel behind an extra pass, which a caller gets by dequantizing once; FP8 is the CUDA `fa3` path.
fn fp8_refused() -> SdpaError {
    SdpaError::Unsupported {
        backend: BACKEND,
        what: "f8e4m3 inputs (FP8 runs on the CUDA backend's fa3 kernel; dequantize to bf16 for the CPU)".into(),
    }
}
