//! `wide`: f16/bf16 attention at head dims above 256 (issue 21), where the fused kernels have no tile: the
//! query rows are cut into slabs, and each slab runs the unfused steps on tensor cores (cuBLAS) with a bounded
//! score buffer, so memory grows with S, not S².
//!
//! Per slab (some query rows of some heads): cuBLAS writes the scores `S = Q·Kᵀ` (f32) for the keys the
//! slab's rows can see (a causal or windowed slab stops at its last visible key and starts at its first),
//! the unfused softmax kernel (`kernels/unfused.cu`, its slab form) applies scale, variants and mask and
//! writes `P` in the input dtype and the LSE, and cuBLAS multiplies `O = P·V` straight into the output rows.
//! Both products carry the head dim on the tensor cores (f32 accumulation), at any D and Dv; the softmax
//! reads and writes the slab once. After the last slab, unfused's check pass recomputes rows that a NaN or
//! inf under a masked key reached (see the crate docs). Every mask, both causal alignments, GQA, windows,
//! softcap, ALiBi, the LSE and any strides are honoured, as in `unfused`; ragged batches are refused.
//!
//! Why not a fused kernel: at D = 512 an output accumulator of 64 rows is 128 KB of f32, and above it no
//! longer fits registers and shared memory together; the two GEMMs reach cuBLAS's rate at these widths,
//! where the score traffic (12 bytes per score against 2·(D + Dv) flops) is small beside the math
//! (`bench/results/gpu/headdims.md`, "Head dims above 256").
//!
//! Batching ([`Batching`]): one GEMM batch per (batch, kv head) pair when the operands' strides allow it
//! (always with one kv head), else one launch set per batch. Query heads of a kv head run one group
//! position at a time, except when decoding (Sq = 1): then a group's query heads are the slab's rows
//! (`fold`), so MLA decoding (576/512, 128 query heads on one kv head) is one GEMM pair over the batch.
//! The slab's size ([`slab_shape`]) keeps scores and probabilities within [`slab_budget`] bytes (1 GiB, at
//! most a quarter of the free memory), and never below [`MIN_SLAB_ROWS`] rows of one GEMM batch (O(Sk)
//! bytes); causal and windowed calls take slabs of at most an eighth of the keys or 1024 rows, whichever is
//! more ([`banded_rows`]); the free GPU memory is checked before the slab is allocated, and a slab that
//! cannot fit is an `InsufficientMemory` error.

use super::unfused::{c_int, data_type, handle_on_stream, launch_softmax, repair, Gemm, SoftmaxParams};
use crate::checked::call::Call;
use crate::checked::params::AttnParams;
use crate::error::unsupported;
use cudarc::cublas::sys::{cublasComputeType_t, cublasOperation_t, cudaDataType};
use cudarc::driver::DevicePtr;
use sdpa_core::{AttentionSpec, DType, Result};

/// The widest head dim the fused tensor-core kernels (`fa2`, `splitkv`, `fa3`) take; wider calls run here.
pub const FUSED_MAX_HEAD_DIM: usize = 256;

/// Default bytes of one slab's scores and probabilities, capped at a quarter of the free GPU memory
/// (`SDPA_WIDE_SLAB_MB` overrides both for measurement). Measured on the H100 (`bench/results/gpu/headdims.md`,
/// "Head dims above 256"): 1 GiB ran D = 512 at 4k 8 % faster than 256 MiB and 1.6x faster than 64 MiB
/// (larger slabs are larger GEMMs; keeping a slab in L2 did not pay).
pub const DEFAULT_SLAB_BYTES: usize = 1 << 30;

/// Fewest query rows of a slab (unless the call has fewer): below it the GEMMs lose their tensor-core rate.
pub const MIN_SLAB_ROWS: usize = 64;

/// Whether `wide` takes a call: dense f16/bf16 with D or Dv above [`FUSED_MAX_HEAD_DIM`].
pub fn takes(spec: &AttentionSpec) -> bool {
    matches!(spec.dtype, DType::F16 | DType::BF16)
        && spec.ragged.is_none()
        && spec.shape.d.max(spec.shape.dv) > FUSED_MAX_HEAD_DIM
}

/// The slab budget in bytes: `SDPA_WIDE_SLAB_MB` (MiB, at least 1) when set, else [`DEFAULT_SLAB_BYTES`] or a
/// quarter of `free` bytes, whichever is less.
pub fn slab_budget(free: usize) -> Result<usize> {
    let Ok(v) = std::env::var("SDPA_WIDE_SLAB_MB") else { return Ok(DEFAULT_SLAB_BYTES.min(free / 4)) };
    slab_mb_bytes(&v)
        .ok_or_else(|| unsupported(format!("SDPA_WIDE_SLAB_MB must be a whole number of MiB (at least 1), got {v:?}")))
}

/// `SDPA_WIDE_SLAB_HEADS=n` (measurement): slabs of the query rows of `n` GEMM batches ((batch, kv head)
/// pairs): all of them, or under a band [`banded_rows`]' share, whatever the budget, so that a short call's slab of
/// scores and probabilities can stay in L2 between the three steps that write and read it (D = 512 at 1k keys:
/// 6 MiB a head). `None` when unset.
pub fn forced_slab_heads() -> Result<Option<usize>> {
    let Ok(v) = std::env::var("SDPA_WIDE_SLAB_HEADS") else { return Ok(None) };
    match v.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(Some(n)),
        _ => Err(unsupported(format!("SDPA_WIDE_SLAB_HEADS must be a positive count of heads, got {v:?}"))),
    }
}

/// The bytes of `SDPA_WIDE_SLAB_MB`'s value, or `None` when it is not a whole number of MiB from 1 to what
/// a `usize` of bytes holds (a shift would drop the high bits of a larger one and slab by a wrapped size).
fn slab_mb_bytes(v: &str) -> Option<usize> {
    v.trim().parse::<usize>().ok().filter(|&mb| mb >= 1)?.checked_mul(1 << 20)
}

/// How a call's GEMMs are batched (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// Launch sets over the batch: 1 when the batch folds into the GEMM batches, else B.
    pub outer_b: usize,
    /// GEMM batches per launch set: B·Hkv or Hkv, each one (batch, kv head) pair.
    pub n_z: usize,
    /// Element strides of Q, K, V and O from one GEMM batch to the next.
    pub z_stride: [i64; 4],
    /// The rows of a GEMM batch are its kv head's query heads at query position 0 (decoding, Sq = 1).
    pub fold: bool,
    /// Passes over the group's query heads: the group size, or 1 when `fold`.
    pub passes: usize,
    /// Rows of a GEMM batch: Sq, or the group size when `fold`.
    pub rows: usize,
    /// Element strides from one row to the next in Q and O.
    pub row_stride: [i64; 2],
}

impl Batching {
    /// The batching of `spec` with `p`'s strides.
    pub fn of(spec: &AttentionSpec, p: &AttnParams) -> Self {
        let s = spec.shape;
        let (hkv, g) = (s.hkv as i64, s.group_size() as i64);
        let [qb, qh, qs] = p.q_stride;
        let [kb, kh, _] = p.k_stride;
        let [vb, vh, _] = p.v_stride;
        let [ob, oh, os] = p.o_stride;
        // With one kv head a GEMM batch is a batch; otherwise the batch folds in when stepping kv heads
        // steps batches too.
        let (outer_b, n_z, z_stride) = if hkv == 1 {
            (1, s.b, [qb, kb, vb, ob])
        } else if s.b == 1 || (kb == hkv * kh && vb == hkv * vh && qb == hkv * g * qh && ob == hkv * g * oh) {
            (1, s.b * s.hkv, [g * qh, kh, vh, g * oh])
        } else {
            (s.b, s.hkv, [g * qh, kh, vh, g * oh])
        };
        let fold = s.sq == 1 && g > 1;
        let (passes, rows, row_stride) =
            if fold { (1, s.group_size(), [qh, oh]) } else { (s.group_size(), s.sq, [qs, os]) };
        Batching { outer_b, n_z, z_stride, fold, passes, rows, row_stride }
    }
}

/// Rows per slab and GEMM batches per slab for `rows` rows in each of `n_z` GEMM batches over `sk` keys
/// with elements of `elem` bytes, within `budget` bytes of scores (f32) and probabilities: every row of
/// every batch when that fits; else as many rows of every batch as fit, rounded down to a multiple of
/// [`MIN_SLAB_ROWS`]; else [`MIN_SLAB_ROWS`] rows (all if fewer) of as many batches as fit, at least one.
pub fn slab_shape(rows: usize, n_z: usize, sk: usize, elem: usize, budget: usize) -> (usize, usize) {
    let per_row = sk.max(1).saturating_mul(4 + elem);
    let fit = budget / per_row; // rows of one batch within the budget
    if n_z.saturating_mul(rows) <= fit {
        return (rows.max(1), n_z);
    }
    let per_batch = fit / n_z.max(1) / MIN_SLAB_ROWS * MIN_SLAB_ROWS;
    if per_batch >= MIN_SLAB_ROWS {
        return (per_batch.min(rows).max(1), n_z);
    }
    let c = rows.clamp(1, MIN_SLAB_ROWS);
    (c, (fit / c).clamp(1, n_z.max(1)))
}

/// Fewest rows [`banded_rows`] caps a banded slab at.
pub const MIN_BANDED_SLAB_ROWS: usize = 1024;

/// Rows of a slab when its rows' bands end before the last key (causal masks, windows): at most an eighth of
/// the keys (in whole [`MIN_SLAB_ROWS`]) and never below [`MIN_BANDED_SLAB_ROWS`], so that at long lengths
/// the keys a slab computes past its rows' diagonals stay near a sixteenth of the call's scores, while short
/// calls keep large GEMMs; `rows` otherwise. Measured on the H100 (headdims.md, "Head dims above 256"):
/// causal D = 512 at 16k ran 5.73 ms in 2048-row slabs against 6.21 in 640-row ones; at 512-1024 keys the
/// one whole slab ran 1.9x (D = 4096) and 1.3x (D = 1024) faster than slabs of an eighth of the keys.
pub fn banded_rows(rows: usize, sk: usize, banded: bool) -> usize {
    if !banded {
        return rows;
    }
    rows.min((sk / 8 / MIN_SLAB_ROWS * MIN_SLAB_ROWS).max(MIN_BANDED_SLAB_ROWS))
}

/// The keys `[k0, k0 + w)` a slab's query rows `[i0, i1)` can see under the call's band (`band_lo`,
/// `band_hi` of its parameters, clamped to the keys); an empty band gives one key, which the softmax masks
/// (its rows are zeros with LSE -inf). `sk >= 1`.
pub fn slab_keys(p: &AttnParams, i0: usize, i1: usize, sk: usize) -> (usize, usize) {
    let sk_i = sk as i64;
    let k0 = (i0 as i64 + p.band_lo as i64).clamp(0, sk_i);
    let k1 = (i1 as i64 - 1 + p.band_hi as i64 + 1).clamp(0, sk_i);
    if k1 > k0 {
        (k0 as usize, (k1 - k0) as usize)
    } else {
        ((k0 as usize).min(sk - 1), 1)
    }
}

/// Runs the call slab by slab on its stream (see the module docs).
pub fn run(call: &Call<'_>) -> Result<()> {
    super::policy::refuse_ragged("wide", call.spec)?;
    let spec = call.spec;
    if !takes(spec) {
        return Err(unsupported(format!(
            "the wide-head path takes f16/bf16 with D or Dv above {FUSED_MAX_HEAD_DIM}, got {} D = {}, Dv = {}",
            spec.dtype, spec.shape.d, spec.shape.dv
        )));
    }
    let s = spec.shape;
    if s.sk == 0 || s.sq == 0 || s.b == 0 || s.hq == 0 {
        return Ok(()); // nothing to write
    }
    let p = &call.params;
    let bt = Batching::of(spec, p);
    let es = spec.dtype.size_bytes();
    let (free, _) = call
        .dev
        .context()
        .mem_get_info()
        .map_err(|e| unsupported(format!("the wide-head path could not read the free GPU memory: {e:?}")))?;
    let budget = slab_budget(free)?;
    let (rows_per_slab, z_per_slab) = match forced_slab_heads()? {
        // Every row of `n` GEMM batches a slab, whatever the budget (a measurement switch).
        Some(n) => (bt.rows.max(1), n.min(bt.n_z.max(1))),
        None => slab_shape(bt.rows, bt.n_z, s.sk, es, budget),
    };
    // Causal masks and windows: rows whose bands end before the last key (the softmax masks the rest).
    let banded = !bt.fold && (p.band_hi as i64) < s.sk as i64 - 1;
    let rows_per_slab = banded_rows(rows_per_slab, s.sk, banded);
    // Scores and probabilities of the largest slab.
    let n_scores = rows_per_slab
        .checked_mul(z_per_slab)
        .and_then(|n| n.checked_mul(s.sk))
        .ok_or_else(|| unsupported("the wide-head slab size overflows"))?;
    let bytes = n_scores.saturating_mul(4 + es);
    call.dev.require_free(bytes as u64, || {
        format!(
            "the wide-head path's score slab ({rows_per_slab} rows x {} keys x {z_per_slab} heads, f32 scores and \
             {} probabilities)",
            s.sk, spec.dtype
        )
    })?;
    let scores = call.scratch::<f32>(n_scores, "the wide-head score slab")?;
    let probs = call.scratch::<u8>(n_scores * es, "the wide-head probability slab")?;
    let (s_ptr, _gs) = scores.device_ptr(call.stream);
    let (p_ptr, _gp) = probs.device_ptr(call.stream);

    let dt = data_type(spec.dtype);
    let e = es as u64;
    let [zq, zk, zv, zo] = bt.z_stride;
    let [rq, ro] = bt.row_stride;
    let (qh, oh) = (p.q_stride[1], p.o_stride[1]);
    let (ks, vs) = (p.k_stride[2], p.v_stride[2]);
    let compute = cublasComputeType_t::CUBLAS_COMPUTE_32F;
    for ob in 0..bt.outer_b {
        let ob = ob as i64;
        for r in 0..bt.passes as i64 {
            for x0 in (0..bt.rows).step_by(rows_per_slab) {
                let n = rows_per_slab.min(bt.rows - x0);
                // Query rows of the slab: positions x0.. (one pass per group position), or position 0 (fold).
                let (i0, i1) = if bt.fold { (0, 1) } else { (x0, x0 + n) };
                let (k0, w) = slab_keys(p, i0, i1, s.sk);
                let (x0, k0i) = (x0 as i64, k0 as i64);
                for z0 in (0..bt.n_z).step_by(z_per_slab) {
                    let nz = z_per_slab.min(bt.n_z - z0);
                    let z0i = z0 as i64;
                    let q_at = ob * p.q_stride[0] + z0i * zq + r * qh + x0 * rq;
                    let o_at = ob * p.o_stride[0] + z0i * zo + r * oh + x0 * ro;
                    // S^T (w x n, col-major, i.e. [row][key]) = K (D x w)^T · Q (D x n)
                    let scores_gemm = Gemm {
                        transa: cublasOperation_t::CUBLAS_OP_T,
                        m: c_int("keys of a slab", w as i64)?,
                        n: c_int("rows of a slab", n as i64)?,
                        k: c_int("D", s.d as i64)?,
                        a: p.k + (ob * p.k_stride[0] + z0i * zk + k0i * ks) as u64 * e,
                        a_type: dt,
                        lda: c_int("K row stride", ks)?,
                        stride_a: zk,
                        b: p.q + q_at as u64 * e,
                        b_type: dt,
                        ldb: c_int("Q row stride", rq)?,
                        stride_b: zq,
                        c: s_ptr,
                        c_type: cudaDataType::CUDA_R_32F,
                        ldc: c_int("keys of a slab", w as i64)?,
                        stride_c: (n * w) as i64,
                        batch: c_int("heads of a slab", nz as i64)?,
                        compute,
                    };
                    // O^T (Dv x n) = V^T (Dv x w) · P^T (w x n)
                    let output_gemm = Gemm {
                        transa: cublasOperation_t::CUBLAS_OP_N,
                        m: c_int("Dv", s.dv as i64)?,
                        n: c_int("rows of a slab", n as i64)?,
                        k: c_int("keys of a slab", w as i64)?,
                        a: p.v + (ob * p.v_stride[0] + z0i * zv + k0i * vs) as u64 * e,
                        a_type: dt,
                        lda: c_int("V row stride", vs)?,
                        stride_a: zv,
                        b: p_ptr,
                        b_type: dt,
                        ldb: c_int("keys of a slab", w as i64)?,
                        stride_b: (n * w) as i64,
                        c: p.o + o_at as u64 * e,
                        c_type: dt,
                        ldc: c_int("O row stride", ro)?,
                        stride_c: zo,
                        batch: c_int("heads of a slab", nz as i64)?,
                        compute,
                    };
                    let sp = SoftmaxParams {
                        a: *p,
                        s: s_ptr,
                        p: p_ptr,
                        z0: c_int("GEMM batch", ob * bt.n_z as i64 + z0i)?,
                        zb: c_int("Hkv", s.hkv as i64)?,
                        hz: c_int("group", s.group_size() as i64)?,
                        h0: c_int("head", if bt.fold { x0 } else { r })?,
                        fold: bt.fold as i32,
                        q0: c_int("row", if bt.fold { 0 } else { x0 })?,
                        k0: c_int("key", k0i)?,
                        w: c_int("keys of a slab", w as i64)?,
                        rows: c_int("rows of a slab", n as i64)?,
                        reserved: 0,
                    };
                    // SAFETY: Q, K, V and O cover every addressed element (validated strides; the slab's rows,
                    // keys and GEMM batches lie inside the call's), the slab buffers hold n·w·nz scores and
                    // probabilities (n <= rows_per_slab, w <= Sk, nz <= z_per_slab), and the guards keep
                    // them alive until queued; the three steps run in order on the call's stream, so a slab
                    // reuses the buffers only after the last one's product read them.
                    unsafe {
                        call.dev.with_blas(|blas| scores_gemm.run(handle_on_stream(call, blas)?))?;
                        launch_softmax(call, &sp, nz)?;
                        call.dev.with_blas(|blas| output_gemm.run(handle_on_stream(call, blas)?))?;
                    }
                }
            }
        }
    }
    // SAFETY: every row of O was written by the products above on this stream.
    unsafe { repair(call) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sdpa_core::{Layout, Mask, Shape};

    fn params(spec: &AttentionSpec) -> AttnParams {
        AttnParams::new(spec, 256, 512, 768, 1024, 0, 0).expect("params")
    }

    #[test]
    fn wide_takes_half_calls_above_the_fused_head_dims_only() {
        let spec = |d, dv, dtype| AttentionSpec::new(Shape { dv, ..Shape::new(1, 4, 64, 64, d) }, dtype);
        assert!(takes(&spec(512, 512, DType::BF16)));
        assert!(takes(&spec(576, 512, DType::F16)));
        assert!(takes(&spec(64, 264, DType::BF16)));
        assert!(!takes(&spec(256, 256, DType::BF16)));
        assert!(!takes(&spec(512, 512, DType::F32)));
    }

    /// One GEMM batch per (batch, kv head) where the strides allow; decoding folds a group's heads into
    /// the rows (MLA: 128 heads on one kv head); BSHD with several kv heads and Sq > 1 keeps a launch set
    /// per batch.
    #[test]
    fn batching_folds_what_the_strides_allow() {
        let shape = |b, hq, hkv, sq, d| Shape { b, hq, hkv, sq, sk: 300, d, dv: d };
        let of = |s: Shape, layout| {
            let spec = AttentionSpec::new(s, DType::BF16).with_layout(layout);
            Batching::of(&spec, &params(&spec))
        };
        // MLA decoding: one kv head, Sq = 1, 128 heads: one launch set, B GEMM batches of 128 rows.
        let mla = Shape { dv: 512, ..shape(8, 128, 1, 1, 576) };
        for layout in [Layout::Bhsd, Layout::Bshd] {
            let bt = of(mla, layout);
            assert_eq!((bt.outer_b, bt.n_z, bt.fold, bt.passes, bt.rows), (1, 8, true, 1, 128), "{layout:?}");
            assert_eq!(bt.row_stride[0], 576, "rows are heads: Q's head stride");
        }
        // BHSD prefill without GQA: everything in one set, B·H batches.
        let bt = of(shape(2, 4, 4, 100, 512), Layout::Bhsd);
        assert_eq!((bt.outer_b, bt.n_z, bt.fold, bt.passes, bt.rows), (1, 8, false, 1, 100));
        assert_eq!(bt.z_stride, [100 * 512, 300 * 512, 300 * 512, 100 * 512]);
        // BHSD with GQA 2: per group position, still one set.
        let bt = of(shape(2, 8, 4, 100, 512), Layout::Bhsd);
        assert_eq!((bt.outer_b, bt.n_z, bt.passes), (1, 8, 2));
        // BSHD with several kv heads: the batch stride is not Hkv head strides: one set per batch.
        let bt = of(shape(2, 8, 4, 100, 512), Layout::Bshd);
        assert_eq!((bt.outer_b, bt.n_z, bt.passes), (2, 4, 2));
    }

    #[test]
    fn slabs_stay_within_the_budget_down_to_their_least_rows() {
        const MB: usize = 1 << 20;
        // Everything fits: one slab.
        assert_eq!(slab_shape(100, 8, 300, 2, 256 * MB), (100, 8));
        // 16 heads x 4096 keys x 6 bytes: 2 MiB... 64 MiB holds 170 rows per head: 128.
        assert_eq!(slab_shape(4096, 16, 4096, 2, 64 * MB), (128, 16));
        // Too many heads for 64 rows each: 64 rows of as many heads as fit.
        let (c, z) = slab_shape(4096, 1024, 32768, 2, 64 * MB);
        assert_eq!(c, 64);
        assert!(z >= 1 && z * c * 32768 * 6 <= 64 * MB, "{z}");
        // Nothing fits: 64 rows of one head (O(Sk) bytes).
        assert_eq!(slab_shape(4096, 4, 1 << 22, 2, MB), (64, 1));
        // Fewer rows than the minimum.
        assert_eq!(slab_shape(3, 4096, 1 << 22, 2, MB), (3, 1));
    }

    /// Regression: `SDPA_WIDE_SLAB_MB` above 2^44 MiB wrapped when shifted into bytes (2^44 gave a budget of 0)
    /// instead of being refused.
    #[test]
    fn the_slab_variable_refuses_sizes_that_overflow() {
        assert_eq!(slab_mb_bytes(" 64 "), Some(64 << 20));
        assert_eq!(slab_mb_bytes(&(usize::MAX >> 20).to_string()), Some((usize::MAX >> 20) << 20));
        for bad in [(1usize << 44).to_string(), usize::MAX.to_string(), "0".into(), "-1".into(), "1.5".into()] {
            assert_eq!(slab_mb_bytes(&bad), None, "{bad}");
        }
    }

    #[test]
    fn banded_slabs_take_an_eighth_of_the_keys_and_at_least_1024_rows() {
        assert_eq!(banded_rows(4096, 4096, false), 4096);
        assert_eq!(banded_rows(2688, 16384, true), 2048);
        assert_eq!(banded_rows(2688, 4096, true), 1024);
        assert_eq!(banded_rows(1024, 1024, true), 1024);
        assert_eq!(banded_rows(40, 300, true), 40);
    }

    #[test]
    fn slab_keys_follow_the_band_of_their_rows() {
        let spec = |mask| AttentionSpec::new(Shape::new(1, 2, 100, 300, 512), DType::BF16).with_mask(mask);
        let p = params(&spec(Mask::None));
        assert_eq!(slab_keys(&p, 0, 64, 300), (0, 300));
        // Bottom-right causal: row i sees keys <= i + 200.
        let p = params(&spec(Mask::CausalBottomRight));
        assert_eq!(slab_keys(&p, 0, 64, 300), (0, 264));
        assert_eq!(slab_keys(&p, 64, 100, 300), (0, 300));
        // Top-left: rows 0..64 see keys 0..=63.
        let p = params(&spec(Mask::CausalTopLeft));
        assert_eq!(slab_keys(&p, 0, 64, 300), (0, 64));
        // A band that misses every key: one key, masked by the softmax.
        let none = AttnParams { band_lo: 500, band_hi: 600, ..p };
        assert_eq!(slab_keys(&none, 0, 64, 300), (299, 1));
    }
}
