//! The slice-level entry point: validation, thread pools, kernel choice (`auto`) and dispatch.

use crate::decode;
use crate::element::CpuElement;
use crate::fa2::{self, Tiles};
use crate::problem::Problem;
use crate::simd::SimdPath;
use crate::unfused;
use rayon::ThreadPool;
use sdpa_core::{AttentionSpec, F32Math, Kernel, Result, RunOptions, SdpaError};
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
    attention_on(path, None, spec, opts, q, k, v, mask, o, lse)
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
    let p = Problem::new(spec, q, k, v, mask, o, lse)?;
    let body = || {
        let threads = rayon::current_num_threads();
        let kernel = resolve(opts.kernel, &p, path, threads);
        match kernel {
            Kernel::Unfused => unfused::run_unfused(&p, path, threads),
            Kernel::SplitKv if decode::applies(&p, path) => decode::run_decode(&p, path, threads),
            Kernel::SplitKv => fa2::run_splitkv(&p, path, threads),
            _ => fa2::run_fa2(&p, path),
        }
        kernel
    };
    Ok(match (opts.threads, pool) {
        (Some(n), _) => pool_of(n)?.install(body),
        (None, Some(pool)) => pool.install(body),
        (None, None) => body(),
    })
}

/// What `auto` runs: `splitkv` for decoding (a few query rows per kv head: it streams K and V in memory
/// order) and when the query tiles cannot keep the threads busy and there are enough keys to split, `fa2`
/// otherwise. `unfused` is never faster.
fn resolve<T: CpuElement>(kernel: Kernel, p: &Problem<'_, T>, path: SimdPath, threads: usize) -> Kernel {
    match kernel {
        Kernel::Auto if decode::applies(p, path) => Kernel::SplitKv,
        Kernel::Auto => {
            let tiles = Tiles::for_path(path, p.row_keys());
            let items = fa2::row_tile_count(p, tiles.br);
            if items < 2 * threads && fa2::split_count(items, p.sk, tiles.bc, threads) > 1 {
                Kernel::SplitKv
            } else {
                Kernel::Fa2
            }
        }
        k => k,
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
