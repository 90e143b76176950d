//! The slice-level entry point: validation, thread pools, kernel choice (`auto`) and dispatch.

use crate::backward::{self, BackwardSlices};
use crate::decode;
use crate::element::CpuElement;
use crate::fa2;
use crate::problem::Problem;
use crate::simd::SimdPath;
use crate::unfused;
use rayon::ThreadPool;
use sdpa_core::backward::{BackwardOptions, BackwardRun};
use sdpa_core::{AttentionSpec, F32Math, Kernel, Operand, Result, RunOptions, SdpaError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Largest head dim (D and Dv) the kernels accept.
pub const MAX_HEAD_DIM: usize = 8192;

pub(crate) const BACKEND: &str = "cpu";

/// Runs attention on host slices without copying them, on the fastest SIMD path of this CPU.
///
/// `q`, `k`, `v` and `o` are laid out by the spec's strides; `mask` is the additive f32 mask when the spec
/// has an explicit one (booleans converted with [`sdpa_core::mask_from_bool`]); `lse`, when given, receives
/// the `[B, Hq, Sq]` log-sum-exp. Validates the spec, the element type and every length first, and returns
/// the kernel that actually ran (what `auto` resolved to). Threads: `opts.threads`, or the current rayon
/// pool (`RAYON_NUM_THREADS`).
pub fn attention<T: CpuElement>(
    spec: &AttentionSpec,
    opts: &RunOptions,
    q: &[T],
    k: &[T],
    v: &[T],
    mask: Option<&[f32]>,
    o: &mut [T],
    lse: Option<&mut [f32]>,
) -> Result<Kernel> {
    let path = SimdPath::chosen().map_err(|what| SdpaError::Unsupported { backend: BACKEND, what })?;
    attention_on(path, None, spec, opts, q, k, v, mask, None, o, lse)
}

/// [`attention`] for a ragged (varlen) batch, K/V packed or in a paged cache: the entry for serving.
///
/// The spec carries the batch (`spec.ragged`: per-sequence lengths and, for a paged cache, the page
/// geometry; see `sdpa_core::ragged`). `q` and `o` are packed `[total_q, Hq, D]` rows (BSHD strides, or
/// `[Hq, total_q, D]` for BHSD), `k`/`v` packed `[total_k, Hkv, D]` or pages `[num_pages, page_size, Hkv,
/// D]`. `block_table` is the `[B, max_pages]` page table of a paged cache (`None` when K/V are packed);
/// `lse`, when given, receives `[Hq, total_q]`. A dense spec works too (no table). Explicit masks do not
/// combine with a ragged batch (the spec's validation says so).
#[allow(clippy::too_many_arguments)]
pub fn attention_ragged<T: CpuElement>(
    spec: &AttentionSpec,
    opts: &RunOptions,
    q: &[T],
    k: &[T],
    v: &[T],
    block_table: Option<&[u32]>,
    o: &mut [T],
    lse: Option<&mut [f32]>,
) -> Result<Kernel> {
    let path = SimdPath::chosen().map_err(|what| SdpaError::Unsupported { backend: BACKEND, what })?;
    attention_on(path, None, spec, opts, q, k, v, None, block_table, o, lse)
}

/// The backward of [`attention`] and [`attention_ragged`] on host slices, on the fastest SIMD path of this
/// CPU (or the one `SDPA_CPU_SIMD` forces): dQ, dK, dV from Q, K, V (+ mask), the forward's O and LSE and
/// the upstream gradient dO (sdpa-core's `backward` module defines the math). `x` holds the slices (see
/// [`BackwardSlices`]); a ragged spec takes them packed, a paged cache is refused. Validates the spec, the
/// element type, every length and that the gradients' strides do not alias, then runs `fa2`'s backward
/// (`opts.kernel` `auto` or `fa2`) on `opts.threads` threads or the current rayon pool. f32 accumulation,
/// one rounding per output; `bwd.dq_accum` requires `x.dq_accum`. The result is bitwise the same for any
/// thread count, so the returned [`BackwardRun`] says `deterministic: true` whatever `bwd.deterministic`
/// asked.
pub fn attention_backward<T: CpuElement>(
    spec: &AttentionSpec,
    opts: &RunOptions,
    bwd: &BackwardOptions,
    x: BackwardSlices<'_, T>,
) -> Result<BackwardRun> {
    let path = SimdPath::chosen().map_err(|what| SdpaError::Unsupported { backend: BACKEND, what })?;
    backward_on(path, None, spec, opts, bwd, x)
}

/// [`attention`] on a chosen SIMD path and, when given, a chosen pool (`opts.threads` still wins).
pub(crate) fn attention_on<T: CpuElement>(
    path: SimdPath,
    pool: Option<&ThreadPool>,
    spec: &AttentionSpec,
    opts: &RunOptions,
    q: &[T],
    k: &[T],
    v: &[T],
    mask: Option<&[f32]>,
    table: Option<&[u32]>,
    o: &mut [T],
    lse: Option<&mut [f32]>,
) -> Result<Kernel> {
    spec.validate()?;
    if spec.dtype != T::DTYPE {
        return Err(SdpaError::DTypeMismatch { name: "q", expected: spec.dtype, found: T::DTYPE });
    }
    spec.check_lengths(q.len(), k.len(), v.len(), o.len(), mask.map(<[f32]>::len))?;
    if let Some(l) = &lse {
        let needed = spec.lse_len()?;
        if l.len() < needed {
            return Err(SdpaError::BufferTooShort { name: "lse", len: l.len(), needed });
        }
    }
    let unsupported = |what: String| Err(SdpaError::Unsupported { backend: BACKEND, what });
    let hd = spec.shape.d.max(spec.shape.dv);
    if hd > MAX_HEAD_DIM {
        return unsupported(format!("head dim {hd} (at most {MAX_HEAD_DIM})"));
    }
    if spec.dtype == sdpa_core::DType::F32 && opts.f32_math != F32Math::Exact {
        return unsupported(format!("f32 math {} (the CPU multiplies in exact f32)", opts.f32_math.name()));
    }
    if opts.kernel == Kernel::Fa1 {
        return unsupported("kernel fa1 (a CUDA kernel; the CPU runs unfused, fa2, splitkv)".to_string());
    }
    if !path.is_supported() {
        return unsupported(format!("simd path {path} on this CPU"));
    }
    let ragged = spec.ragged.is_some();
    let (ps, empty): (Vec<_>, Vec<_>) =
        Problem::parts(spec, q, k, v, mask, o, lse, table)?.into_iter().partition(|p| p.sk > 0 || !ragged);
    let body = || {
        // Sequences without keys: zeros, LSE -inf.
        empty.iter().for_each(Problem::write_empty_rows);
        let threads = rayon::current_num_threads();
        let kernel = resolve(opts.kernel, &ps, ragged, path, threads);
        match kernel {
            Kernel::Unfused => unfused::run_unfused(&ps, path, threads),
            Kernel::SplitKv if decode::applies(&ps, path) => decode::run_decode(&ps, path, threads),
            Kernel::SplitKv => fa2::run_splitkv(&ps, path, threads),
            _ => fa2::run_fa2(&ps, path),
        }
        kernel
    };
    Ok(match (opts.threads, pool) {
        (Some(n), _) => pool_of(n)?.install(body),
        (None, Some(pool)) => pool.install(body),
        (None, None) => body(),
    })
}

/// The backward on a chosen SIMD path and, when given, a chosen pool (`opts.threads` still wins): checks
/// everything the kernel trusts, then runs `fa2`'s backward (the only one; `auto` resolves to it).
pub(crate) fn backward_on<T: CpuElement>(
    path: SimdPath,
    pool: Option<&ThreadPool>,
    spec: &AttentionSpec,
    opts: &RunOptions,
    bwd: &BackwardOptions,
    x: BackwardSlices<'_, T>,
) -> Result<BackwardRun> {
    // Also refuses paged KV caches (training keeps no cache).
    sdpa_core::backward::validate_backward(spec)?;
    let unsupported = |what: String| Err(SdpaError::Unsupported { backend: BACKEND, what });
    if bwd.dq_accum && x.dq_accum.is_none() {
        return Err(SdpaError::InvalidSpec("dq_accum was asked for but no f32 dQ buffer was given".to_string()));
    }
    if spec.dtype != T::DTYPE {
        return Err(SdpaError::DTypeMismatch { name: "q", expected: spec.dtype, found: T::DTYPE });
    }
    spec.check_lengths(x.q.len(), x.k.len(), x.v.len(), x.o.len(), x.mask.map(<[f32]>::len))?;
    let need = |op| spec.required_len(op);
    let (nq, nk, nv, no) = (need(Operand::Q)?, need(Operand::K)?, need(Operand::V)?, need(Operand::O)?);
    let lens = [
        ("d_o", x.d_o.len(), no),
        ("lse", x.lse.len(), spec.lse_len()?),
        ("dq", x.dq.len(), nq),
        ("dk", x.dk.len(), nk),
        ("dv", x.dv.len(), nv),
        ("dq_accum", x.dq_accum.as_ref().map_or(nq, |a| a.len()), nq),
    ];
    if let Some(&(name, len, needed)) = lens.iter().find(|(_, len, needed)| len < needed) {
        return Err(SdpaError::BufferTooShort { name, len, needed });
    }
    backward::check_grads_do_not_alias(spec)?;
    let hd = spec.shape.d.max(spec.shape.dv);
    if hd > MAX_HEAD_DIM {
        return unsupported(format!("head dim {hd} (at most {MAX_HEAD_DIM})"));
    }
    if spec.dtype == sdpa_core::DType::F32 && opts.f32_math != F32Math::Exact {
        return unsupported(format!("f32 math {} (the CPU multiplies in exact f32)", opts.f32_math.name()));
    }
    if !matches!(opts.kernel, Kernel::Auto | Kernel::Fa2) {
        return unsupported(format!("backward of kernel {} (the CPU's backward is fa2)", opts.kernel.name()));
    }
    if !path.is_supported() {
        return unsupported(format!("simd path {path} on this CPU"));
    }
    backward::zero_keys_without_queries(spec, x.dk, x.dv);
    let mut parts = backward::parts(spec, x)?;
    let body = move || backward::run_backward(&mut parts, path);
    match (opts.threads, pool) {
        (Some(n), _) => pool_of(n)?.install(body),
        (None, Some(pool)) => pool.install(body),
        (None, None) => {
            let mut body = body;
            body()
        }
    }
    // Every gradient element has one writer and sums in a fixed order: deterministic for any thread count.
    Ok(BackwardRun { kernel: Kernel::Fa2, deterministic: true })
}

/// What `auto` runs: `splitkv` for decoding (a few query rows per kv head: it streams K and V in memory
/// order) and when the query tiles cannot keep the threads busy and there are enough keys to split, `fa2`
/// otherwise. `unfused` is never faster. A ragged batch: `splitkv` when every sequence decodes (its
/// splits balance sequences of any lengths), `fa2` otherwise (its items go heaviest first).
fn resolve<T: CpuElement>(
    kernel: Kernel,
    ps: &[Problem<'_, T>],
    ragged: bool,
    path: SimdPath,
    threads: usize,
) -> Kernel {
    match (kernel, ps.first()) {
        (Kernel::Auto, _) if decode::applies(ps, path) => Kernel::SplitKv,
        (Kernel::Auto, _) if ragged => Kernel::Fa2,
        (Kernel::Auto, Some(p)) => {
            let tiles = fa2::tiles_of(std::slice::from_ref(p), path, threads);
            let items = fa2::row_tile_count(p, tiles.br);
            if items < 2 * threads && fa2::split_count(items, p.sk, tiles.bc, threads) > 1 {
                Kernel::SplitKv
            } else {
                Kernel::Fa2
            }
        }
        (Kernel::Auto, None) => Kernel::Fa2,
        (k, _) => k,
    }
}

/// A pool of `n` threads, built once per size and kept for the life of the process.
pub(crate) fn pool_of(n: usize) -> Result<Arc<ThreadPool>> {
    if n == 0 {
        return Err(SdpaError::InvalidSpec("thread count 0: ask for at least one thread".to_string()));
    }
    static POOLS: OnceLock<Mutex<HashMap<usize, Arc<ThreadPool>>>> = OnceLock::new();
    let pools = POOLS.get_or_init(|| Mutex::new(HashMap::new()));
    // A panic while holding the lock cannot leave the map inconsistent (insert is the only write).
    let mut map = pools.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = map.get(&n) {
        return Ok(Arc::clone(p));
    }
    let pool =
        rayon::ThreadPoolBuilder::new().num_threads(n).thread_name(|i| format!("sdpa-cpu-{i}")).build().map_err(
            |e| SdpaError::Backend {
                backend: BACKEND,
                context: format!("building a pool of {n} threads"),
                source: Box::new(e),
            },
        )?;
    let pool = Arc::new(pool);
    map.insert(n, Arc::clone(&pool));
    Ok(pool)
}
