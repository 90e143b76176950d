// Shared device code of every sdpa kernel module: the launch parameters (mirrors src/checked/params.rs field for
// field), element conversions, mask helpers, warp and quad reductions, and the PTX helpers every tensor-core kernel uses. Compiled by NVRTC, handed in as an
// in-memory header named "common.cuh".
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef long long i64;

// `rel_lo` / `rel_hi` of a ragged call without a bound on that side (i32::MIN / i32::MAX in params.rs).
#define SDPA_REL_NONE_LO (-2147483647 - 1)
#define SDPA_REL_NONE_HI 2147483647

#define SDPA_MASK_NONE 0
#define SDPA_MASK_CAUSAL 1
#define SDPA_MASK_EXPLICIT 2

// One struct by value for every attention kernel. Strides are in elements; the head dim is contiguous.
struct AttnParams {
    const void* q;
    const void* k;
    const void* v;
    void* o;
    const float* mask;  // additive f32, or null
    float* lse;         // [B, Hq, Sq] f32 contiguous, or null
    void* workspace;    // kernel-specific scratch, or null
    i64 q_stride[3];    // batch, head, seq
    i64 k_stride[3];
    i64 v_stride[3];
    i64 o_stride[3];
    i64 mask_stride[4]; // b, h, q, k; 0 for broadcast dims
    int b, hq, hkv, group, sq, sk, d, dv;
    int mask_kind;      // SDPA_MASK_*
    int causal_offset;  // query i sees keys j <= i + causal_offset (0: top-left, Sk - Sq: bottom-right)
    float scale;
    float scale_log2;   // scale * log2(e)
    int num_splits;
    int extra;
    int band_lo;        // key j is visible to row i iff i + band_lo <= j <= i + band_hi (causal masks, windows)
    int band_hi;
    int diag_offset;    // diag(i) - i: 0 top-left, Sk - Sq bottom-right (ALiBi's distance |j - diag(i)|)
    float softcap;      // cap of the scaled score (cap * tanh(x / cap)), 0 when off
    const float* alibi; // ALiBi slope per query head (f32), or null
    // Ragged batches and paged caches (issue 23); all null / 0 for a dense batch. See seq_view below.
    const int* cu_q;              // [B + 1] packed query-row offsets, or null (dense)
    const int* cu_k;              // [B + 1] packed key-row offsets (varlen), or null
    const int* seqlens_k;         // [B] cache lengths (paged), or null
    const unsigned* block_table;  // [B, max_pages] page indices (paged), or null
    int page_size;                // slots per page (paged), else 0
    int max_pages;                // block-table row length (paged), else 0
    int rel_lo;                   // ragged: band lo relative to each sequence's diagonal; SDPA_REL_NONE_LO: unbounded
    int rel_hi;                   // ragged: band hi relative to the diagonal; SDPA_REL_NONE_HI: unbounded
    int diag_br;                  // ragged: 1 when diag(i) = i + Sk_b - Sq_b (bottom-right), 0 top-left
    int total_q;                  // ragged: packed query rows (the LSE is [Hq, total_q])
    int num_pages;                // paged: pages in the pool (page indices are clamped below it), else 0
    int reserved;                 // keeps the struct a multiple of 8 bytes
};
static_assert(sizeof(AttnParams) == 328, "AttnParams must match src/checked/params.rs");

// ---- ragged batches and paged caches ----------------------------------------------------------------------

// One sequence of a batch as a kernel sees it: its lengths, where its packed rows start, and its key band
// and diagonal measured from its own lengths (sdpa_core::AttentionSpec::band_for). For a dense batch, the
// call's own values.
struct SeqView {
    int q0, sq;                   // first packed query row (0 when dense) and query rows
    int k0, sk;                   // first packed key row (0 when dense or paged) and keys
    int band_lo, band_hi;         // key j visible to row i iff i + band_lo <= j <= i + band_hi (clamped)
    int diag_offset;              // diag(i) - i
};

__device__ __forceinline__ bool is_ragged(const AttnParams& p) { return p.cu_q != nullptr; }
__device__ __forceinline__ bool is_paged(const AttnParams& p) { return p.block_table != nullptr; }

__device__ __forceinline__ SeqView seq_view(const AttnParams& p, int b) {
    SeqView s;
    if (!is_ragged(p)) {
        s.q0 = 0; s.sq = p.sq; s.k0 = 0; s.sk = p.sk;
        s.band_lo = p.band_lo; s.band_hi = p.band_hi; s.diag_offset = p.diag_offset;
        return s;
    }
    s.q0 = p.cu_q[b];
    s.sq = p.cu_q[b + 1] - s.q0;
    if (is_paged(p)) { s.k0 = 0; s.sk = p.seqlens_k[b]; }
    else { s.k0 = p.cu_k[b]; s.sk = p.cu_k[b + 1] - s.k0; }
    const long long diag = p.diag_br ? (long long)s.sk - s.sq : 0;
    // KeyBand::clamped: lo in [-Sq, Sk], hi in [-Sq - 1, Sk]; unbounded sides take the clamp's ends.
    long long lo = p.rel_lo == SDPA_REL_NONE_LO ? -(long long)s.sq : diag + p.rel_lo;
    long long hi = p.rel_hi == SDPA_REL_NONE_HI ? (long long)s.sk : diag + p.rel_hi;
    lo = lo < -(long long)s.sq ? -(long long)s.sq : (lo > s.sk ? s.sk : lo);
    hi = hi < -(long long)s.sq - 1 ? -(long long)s.sq - 1 : (hi > s.sk ? s.sk : hi);
    s.band_lo = (int)lo; s.band_hi = (int)hi; s.diag_offset = (int)diag;
    return s;
}

// Element offset of row i of Q (or O: pass o_stride) of query head h in sequence b.
__device__ __forceinline__ i64 q_row_offset(const AttnParams& p, const i64* stride, const SeqView& s, int b, int h, int i) {
    return is_ragged(p) ? (i64)(s.q0 + i) * stride[2] + (i64)h * stride[1]
                        : (i64)b * stride[0] + (i64)h * stride[1] + (i64)i * stride[2];
}

// Element offset of key j of K (or V: pass v_stride) of kv head h in sequence b: through the block table
// when paged (page = table[b][j / page_size], the batch stride stepping pages).
__device__ __forceinline__ i64 kv_row_offset(const AttnParams& p, const i64* stride, const SeqView& s, int b, int h, int j) {
    if (is_paged(p)) {
        // A device block table is the caller's data (the host entry points check it); clamping keeps a bad
        // index inside the pool instead of reading past it.
        const unsigned page = min(p.block_table[(i64)b * p.max_pages + j / p.page_size], (unsigned)(p.num_pages - 1));
        return (i64)page * stride[0] + (i64)(j % p.page_size) * stride[2] + (i64)h * stride[1];
    }
    return is_ragged(p) ? (i64)(s.k0 + j) * stride[2] + (i64)h * stride[1]
                        : (i64)b * stride[0] + (i64)h * stride[1] + (i64)j * stride[2];
}

// Index of row (b, h, i) in the LSE: [B, Hq, Sq] dense, [Hq, total_q] ragged.
__device__ __forceinline__ i64 lse_row(const AttnParams& p, const SeqView& s, int b, int h, int i) {
    return is_ragged(p) ? (i64)h * p.total_q + s.q0 + i : ((i64)b * p.hq + h) * p.sq + i;
}

// ---- element conversions -------------------------------------------------------------------------------

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// ---- numbers ------------------------------------------------------------------------------------------

#define SDPA_NEG_INF (-__int_as_float(0x7f800000))
#define SDPA_NAN (__int_as_float(0x7fffffff))

// max that propagates NaN (fmaxf would drop it, and a NaN score must poison its row as in the reference).
__device__ __forceinline__ float nan_max(float a, float b) {
    return (a != a || b != b) ? SDPA_NAN : fmaxf(a, b);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Max and sum over the four threads of a quad (they hold one row of an mma accumulator).
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// 2^x on the special-function unit (the tensor-core kernels fold the scale into the exponent).
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// 2^x on the FMA pipe, for a share of a softmax's exponentials where the special-function unit (16 results per
// clock per SM) is as busy as the tensor cores (fa3 at D = 64, FP8): x = j + f with j = rint(x) (the 1.5·2^23
// rounding trick) and f in [-1/2, 1/2], 2^f by a degree-3 polynomial fitted here for relative error (7.5e-5 in
// f32: below the rounding of P to bf16 or f16, 2^-9 and 2^-11; 2^0 comes out as 0.99993), times 2^j built in
// the exponent bits. For x <= 127 only (a softmax passes x <= 8; +inf gives NaN, larger x wraps). Below -125
// it gives 0 (-inf included; a margin above -126, where the scale leaves the normal range), as ex2.approx.ftz
// does below -126; NaN stays NaN (the polynomial carries it, the select keeps it). Ten instructions, none on
// the MUFU.
__device__ __forceinline__ float fma_exp2(float x) {
    const float t = x + 12582912.f;         // 1.5·2^23: rint(x) lands in the low mantissa bits of t
    const float f = x - (t - 12582912.f);   // exact (Sterbenz), in [-1/2, 1/2]
    const float p = fmaf(fmaf(fmaf(5.517145246e-2f, f, 2.426106185e-1f), f, 6.932609677e-1f), f, 9.999281168e-1f);
    // The low bits of t hold j in two's complement; shifted into the exponent field with the bias added,
    // they are 2^j (the bits of 1.5·2^23 above them shift out).
    const float scale = __int_as_float((__float_as_int(t) << 23) + (127 << 23));
    return x < -125.f ? 0.f : p * scale;
}

// 1/x on the special-function unit (rcp(inf) = 0).
__device__ __forceinline__ float fast_rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// 32-bit shared-memory address of a generic pointer (for cp.async, ldmatrix and mbarrier operands).
__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// ---- masks ------------------------------------------------------------------------------------------

// Number of leading keys query row i may see (keys 0..limit); Sk when the mask is not causal.
__device__ __forceinline__ int causal_limit(const AttnParams& p, int i) {
    if (p.mask_kind != SDPA_MASK_CAUSAL) return p.sk;
    long long lim = (long long)i + 1 + p.causal_offset;
    return lim < 0 ? 0 : (lim > p.sk ? p.sk : (int)lim);
}

// Whether key j lies in row i's band (causal masks and windows; AttnParams::band_lo / band_hi).
__device__ __forceinline__ bool band_visible(const AttnParams& p, int i, int j) {
    const long long d = (long long)j - i;
    return d >= p.band_lo && d <= p.band_hi;
}
// First key of row i's band, clamped to [0, Sk].
__device__ __forceinline__ int band_first(const AttnParams& p, int i) {
    const long long x = (long long)i + p.band_lo;
    return x < 0 ? 0 : (x > p.sk ? p.sk : (int)x);
}
// One past the last key of row i's band, clamped to [0, Sk] (band_first when the band is empty there).
__device__ __forceinline__ int band_end(const AttnParams& p, int i) {
    const long long x = (long long)i + p.band_hi + 1;
    const int e = x < 0 ? 0 : (x > p.sk ? p.sk : (int)x);
    return max(e, band_first(p, i));
}
// Whether the call has a softcap or ALiBi (the run-time kernels take the variant path then).
__device__ __forceinline__ bool has_score_variants(const AttnParams& p) {
    return p.softcap > 0.f || p.alibi != nullptr;
}
// Softcap then ALiBi of scaled score x (natural units) of query head h, row i, key j: sdpa_core's
// x' = cap tanh(x / cap), then x' - slope_h |j - diag(i)|. For the kernels that read the variants at run
// time (SIMT fa1, which carries f32 exactly, unfused, the non-finite repair): `tanhf` (about 2 ulp), where
// the tensor-core kernels' faster form (fa2_mma.cuh, error 1e-6 times the cap) would exceed f32's tolerance.
// `dist` is the key's signed distance from the row's diagonal, j - diag(i).
__device__ __forceinline__ float variant_score_at(const AttnParams& p, float x, int h, long long dist) {
    if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
    if (p.alibi != nullptr) x = fmaf(-p.alibi[h], fabsf((float)dist), x);
    return x;
}
__device__ __forceinline__ float variant_score(const AttnParams& p, float x, int h, int i, int j) {
    return variant_score_at(p, x, h, (long long)j - i - p.diag_offset);
}

// Pointer to the explicit mask row of (b, h, i), to be indexed by j * mask_stride[3].
__device__ __forceinline__ const float* mask_row(const AttnParams& p, int b, int h, int i) {
    return p.mask + b * p.mask_stride[0] + h * p.mask_stride[1] + i * p.mask_stride[2];
}

// Finalizes one row: O = acc / l, LSE = m + ln l; a row that saw no key is zeros with LSE -inf.
__device__ __forceinline__ float row_inv_l(float l) { return l > 0.f ? 1.f / l : 0.f; }
__device__ __forceinline__ float row_lse(float m, float l) {
    return l > 0.f ? m + logf(l) : (l != l || m != m ? SDPA_NAN : SDPA_NEG_INF);
}
// The same for kernels that keep the running max in log2 units (scores multiplied by scale * log2(e)).
#define SDPA_LOG2E 1.4426950408889634f
#define SDPA_LN2 0.6931471805599453f
__device__ __forceinline__ float row_lse_log2(float m2, float l) {
    return l > 0.f ? m2 * SDPA_LN2 + logf(l) : (l != l || m2 != m2 ? SDPA_NAN : SDPA_NEG_INF);
}

// ---- rows reached by non-finite values under masked keys ----------------------------------------------
// The fast kernels multiply a masked key's weight (exactly 0) by its V row, and the tensor-core kernels add
// an explicit mask to a score that may already be NaN. So NaN or inf in V under a key a row does not see
// (or NaN in K under an explicit -inf) would turn that row NaN, where the reference leaves it exact: masked
// keys take no part at all. Instead of paying for that on every tile, each kernel votes after its epilogue
// whether it wrote anything non-finite; only then are the affected rows recomputed here, one warp per row,
// skipping masked keys. Rows that are non-finite for real (NaN in Q, or in a key they see) come out
// non-finite again, as in the reference. That slow path is far slower than the kernels, and only taken when
// the inputs hold NaN or inf.

// Scaled score of key j for the query row at `q` (with the explicit mask value `add`), by one warp.
// Softcap and ALiBi of query head h (the key `dist` = j - diag(i) from the row's diagonal) apply before the
// mask.
template <typename T>
__device__ __forceinline__ float careful_score(const AttnParams& p, const T* q, const T* kj, float add, int h,
                                              long long dist) {
    float d = 0.f;
    for (int c = threadIdx.x % 32; c < p.d; c += 32) d = fmaf(to_f32(q[c]), to_f32(kj[c]), d);
    return variant_score_at(p, warp_sum(d) * p.scale, h, dist) + add;
}

// Recomputes columns [c0, c1) of row (b, h, i), and its LSE when `write_lse`, by the calling warp (all 32
// lanes): exact f32 arithmetic over the keys the row sees, masked keys skipped. Ragged batches and paged
// caches too: b is the sequence and i the row inside it (seq_view and the row offsets above).
template <typename T>
__device__ __forceinline__ void careful_row(const AttnParams& p, int b, int h, int i, int c0, int c1, bool write_lse) {
    const int lane = threadIdx.x % 32;
    const int kvh = h / p.group;
    const SeqView s = seq_view(p, b);
    const T* q = static_cast<const T*>(p.q) + q_row_offset(p, p.q_stride, s, b, h, i);
    const T* k = static_cast<const T*>(p.k);
    const T* v = static_cast<const T*>(p.v);
    T* o = static_cast<T*>(p.o) + q_row_offset(p, p.o_stride, s, b, h, i);
    const float* mrow = p.mask_kind == SDPA_MASK_EXPLICIT ? mask_row(p, b, h, i) : nullptr;
    // The row's band (causal masks and windows) in its sequence, clamped to [0, Sk_b].
    const long long lo = (long long)i + s.band_lo, hi = (long long)i + s.band_hi + 1;
    const int first = lo < 0 ? 0 : (lo > s.sk ? s.sk : (int)lo);
    const int limit = max(first, hi < 0 ? 0 : (hi > s.sk ? s.sk : (int)hi));
    const long long diag = (long long)i + s.diag_offset;
    // Pass 1: running max and sum (natural-log units) over the keys the row sees.
    float m = SDPA_NEG_INF, l = 0.f;
    for (int j = first; j < limit; ++j) {
        const float add = mrow != nullptr ? mrow[j * p.mask_stride[3]] : 0.f;
        if (add == SDPA_NEG_INF) continue;
        const float x = careful_score(p, q, k + kv_row_offset(p, p.k_stride, s, b, kvh, j), add, h, j - diag);
        const float mn = nan_max(m, x);
        l = (m == SDPA_NEG_INF ? 0.f : l * expf(m - mn)) + expf(x - mn);
        m = mn;
    }
    const float inv = row_inv_l(l);
    // Pass 2: P·V over the same keys, 8 columns per lane per sweep.
    constexpr int PER = 8;
    for (int cb = c0; cb < c1; cb += 32 * PER) {
        float acc[PER];
#pragma unroll
        for (int t = 0; t < PER; ++t) acc[t] = 0.f;
        for (int j = first; j < limit; ++j) {
            const float add = mrow != nullptr ? mrow[j * p.mask_stride[3]] : 0.f;
            if (add == SDPA_NEG_INF) continue;
            const float w =
                expf(careful_score(p, q, k + kv_row_offset(p, p.k_stride, s, b, kvh, j), add, h, j - diag) - m);
            const T* vj = v + kv_row_offset(p, p.v_stride, s, b, kvh, j);
#pragma unroll
            for (int t = 0; t < PER; ++t) {
                const int c = cb + t * 32 + lane;
                if (c < c1) acc[t] = fmaf(w, to_f32(vj[c]), acc[t]);
            }
        }
#pragma unroll
        for (int t = 0; t < PER; ++t) {
            const int c = cb + t * 32 + lane;
            // l = 0 (no key seen): acc = 0 and inv = 0; m or l NaN: acc is NaN and stays NaN.
            if (c < c1) o[c] = from_f32<T>(acc[t] * inv);
        }
    }
    if (write_lse && p.lse != nullptr && lane == 0) p.lse[lse_row(p, s, b, h, i)] = row_lse(m, l);
}

// By the calling warp: recomputes row (b, h, i) if any of its columns [c0, c1) in O is not finite.
template <typename T>
__device__ __forceinline__ void repair_row_if_nonfinite(const AttnParams& p, int b, int h, int i, int c0, int c1,
                                                        bool write_lse) {
    const T* o = static_cast<const T*>(p.o) + q_row_offset(p, p.o_stride, seq_view(p, b), b, h, i);
    bool bad = false;
    for (int c = c0 + threadIdx.x % 32; c < c1; c += 32) bad |= !isfinite(to_f32(o[c]));
    if (__any_sync(0xffffffffu, bad)) careful_row<T>(p, b, h, i, c0, c1, write_lse);
}

// per_head for blocks whose rows all belong to one head.
#define SDPA_ONE_HEAD 0x7fffffff

// The repair of a block's rows, out of line to keep its code and registers away from the kernels' main loops
// as far as ptxas allows (it still sizes the kernel for the call: bench/studies/gpu/nan-repair-h100.txt).
// Row r of the block is query row x % per_head of head h0 + x / per_head, x = i0 + r.
template <typename T>
__device__ __noinline__ void repair_rows_out_of_line(const AttnParams* ps, int b, int h0, int i0, int per_head,
                                                     int n_rows, int c0, int c1, bool write_lse) {
    for (int r = threadIdx.x / 32; r < n_rows; r += blockDim.x / 32) {
        const int x = i0 + r;
        repair_row_if_nonfinite<T>(*ps, b, h0 + x / per_head, x % per_head, c0, c1, write_lse);
    }
}

// By the whole block, after it wrote its output rows and is done with its dynamic shared memory (at least
// sizeof(AttnParams) bytes, no copies in flight): `bad` is this thread's vote (it wrote a non-finite value).
// When any thread voted, the block's rows (see repair_rows_out_of_line) are checked in columns [c0, c1) and
// the non-finite ones recomputed. The parameters go through shared memory: handing the kernel parameters to
// an out-of-line function by address would make every kernel copy them to local memory. Every thread of the
// block must call this.
template <typename T>
__device__ __forceinline__ void repair_nonfinite_rows(const AttnParams& p, int b, int h0, int i0, int per_head,
                                                      int n_rows, int c0, int c1, bool write_lse, bool bad) {
    if (!__syncthreads_or(bad)) return;
    extern __shared__ __align__(16) unsigned char sdpa_repair_smem[];
    AttnParams* ps = reinterpret_cast<AttnParams*>(sdpa_repair_smem);
    if (threadIdx.x == 0) *ps = p;
    __syncthreads();
    repair_rows_out_of_line<T>(ps, b, h0, i0, per_head, n_rows, c0, c1, write_lse);
}
