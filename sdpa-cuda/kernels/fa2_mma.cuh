// Shared device code of the tensor-core kernels (fa2.cu, fa1_mma.cu, splitkv.cu): thin wrappers over the PTX
// instructions they are built from (cp.async, ldmatrix, mma.sync m16n8k16, ex2), the split-KV scratch
// layout, and the per-warp tile steps fa2 and fa1m share (tile loader, Q·Kᵀ, mask, online-softmax update,
// P·V). Kernels take the crate-wide AttnParams (common.cuh) by value. Handed to NVRTC as an in-memory
// header (src/sys/modules.rs HEADERS).
#ifndef SDPA_FA2_MMA_CUH
#define SDPA_FA2_MMA_CUH

#include "common.cuh"

// Split-KV scratch inside AttnParams::workspace: the partial LSEs [rows][splits] first, then the partial
// outputs [rows][splits][D] f32 from the next 16-byte boundary (src/kernels/splitkv.rs sizes it the same way).
__device__ __forceinline__ float* fa2_part_lse(const AttnParams& p) { return static_cast<float*>(p.workspace); }
__device__ __forceinline__ float* fa2_part_o(const AttnParams& p) {
    const long long n = (long long)p.b * p.hq * p.sq * p.num_splits;
    return static_cast<float*>(p.workspace) + ((n + 3) / 4) * 4;
}

// Mask modes, a template parameter of every kernel so that unmasked tiles carry no mask code.
#define FA2_MASK_NONE 0
#define FA2_MASK_CAUSAL 1
#define FA2_MASK_EXPLICIT 2

// Variant bits (issue 22), a second template parameter VAR of every tensor-core kernel (0: plain, as before;
// src/checked/params.rs `Masking` writes them). A variant instantiation always has FA2_VAR_BAND: the keys of
// row i are i + band_lo ..= i + band_hi (causal masks and windows; unbounded sides come clamped so that they
// restrict nothing), key tiles outside every row's band are never loaded, and only tiles that cross a band
// edge run the band test. Its MASK is FA2_MASK_NONE or FA2_MASK_EXPLICIT (an explicit mask on top).
// SOFTCAP and ALIBI transform every score, so their instantiations scale scores into log2 units before the
// online max (as explicit masks do).
#define FA2_VAR_BAND 1
#define FA2_VAR_SOFTCAP 2
#define FA2_VAR_ALIBI 4

#define FA2_LOG2E 1.4426950408889634f
#define FA2_LN2 0.6931471805599453f

__device__ __forceinline__ float fa2_neg_inf() { return __int_as_float(0xff800000); }

// 16-byte global->shared copy; `valid == false` writes zeros and reads nothing.
__device__ __forceinline__ void fa2_cp_async16(unsigned dst, const void* gmem, bool valid) {
    int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
// As fa2_cp_async16 for data read exactly once (split-KV streams K and V): asks L2 to fetch the whole
// 256-byte sector group, so each DRAM access serves the next rows' requests too.
__device__ __forceinline__ void fa2_cp_async16_stream(unsigned dst, const void* gmem, bool valid) {
    int src_bytes = valid ? 16 : 0;
#ifdef SPLITKV_NO_L2_PREFETCH
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
#else
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
#endif
}
__device__ __forceinline__ void fa2_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void fa2_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ldmatrix from a 32-bit shared-memory address (callers add compile-time offsets to a per-lane base, so
// the address folds into the instruction's immediate).
__device__ __forceinline__ void fa2_ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void fa2_ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// Element-type traits: the mma instruction and the f32 -> pair packing for each half type.
template <typename T>
struct Fa2Type;

template <>
struct Fa2Type<__half> {
    __device__ __forceinline__ static unsigned pack(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&h);
    }
    __device__ __forceinline__ static void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <>
struct Fa2Type<__nv_bfloat16> {
    __device__ __forceinline__ static unsigned pack(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&h);
    }
    __device__ __forceinline__ static void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// Rows that are not 16-byte aligned (issue 21: head dims that are not multiples of 8, and views whose base
// pointers or strides are not): the widest copy, in bytes (16, 8, 4 or 2), that divides every base pointer and
// stride of Q, K, V and O and both row lengths (D and Dv, in bytes), so that every row start and every row end
// of the call falls on a copy boundary and no copy reads past a row. Warp-uniform; padded (PAD) instantiations
// pick their load and store path with it per call, and the exact ones are launched only when it is 16.
__device__ __forceinline__ int fa2_row_bytes(const AttnParams& p) {
    unsigned long long x = (unsigned long long)p.q | (unsigned long long)p.k | (unsigned long long)p.v |
                           (unsigned long long)p.o | (unsigned long long)(p.d * 2) | (unsigned long long)(p.dv * 2);
#pragma unroll
    for (int i = 0; i < 3; ++i)
        x |= (unsigned long long)(p.q_stride[i] | p.k_stride[i] | p.v_stride[i] | p.o_stride[i]) * 2ull;
    return (x & 15ull) == 0 ? 16 : (x & 7ull) == 0 ? 8 : (x & 3ull) == 0 ? 4 : 2;
}

// One chunk of E elements (2E bytes) global -> shared, zeros (and no read) when `valid` is false: 16-, 8- and
// 4-byte cp.async (the narrow ones through L1, `.ca`: `.cg` takes 16 bytes only); E = 1 has no cp.async form,
// so a 2-byte load and store (visible to the block after the same barrier that publishes the cp.async
// copies). STREAM: the 16-byte copy asks L2 for the whole 256-byte group (split-KV's streamed K/V).
template <int E, bool STREAM = false>
__device__ __forceinline__ void fa2_copy_chunk(unsigned dst, const void* gmem, bool valid) {
    static_assert(E == 8 || E == 4 || E == 2 || E == 1, "16-, 8-, 4- or 2-byte chunks");
    if constexpr (E == 8) {
        if constexpr (STREAM) fa2_cp_async16_stream(dst, gmem, valid);
        else fa2_cp_async16(dst, gmem, valid);
    } else if constexpr (E == 1) {
        unsigned short x = 0;
        if (valid) x = __ldg(static_cast<const unsigned short*>(gmem));
        asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(dst), "h"(x));
    } else {
        const int src_bytes = valid ? E * 2 : 0;
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(gmem), "n"(E * 2),
                     "r"(src_bytes));
    }
}

// Runs `f(Fa2Width<E>{})` with the chunk width E (elements) of `row_bytes` (fa2_row_bytes): one instantiation
// of the caller's loop per width, chosen once per call.
template <int E>
struct Fa2Width {
    static constexpr int value = E;
};
template <typename F>
__device__ __forceinline__ void fa2_with_width(int row_bytes, F&& f) {
    switch (row_bytes) {
        case 16: f(Fa2Width<8>{}); break;
        case 8: f(Fa2Width<4>{}); break;
        case 4: f(Fa2Width<2>{}); break;
        default: f(Fa2Width<1>{}); break;
    }
}

// The 2-byte copies of elements first, first + STEP, ... below TOTAL: element c from `src(c)` (null: zero)
// to the shared address `dst(c)`. Loads go out in batches of up to 8 before their stores: one load and store
// at a time (fa2_copy_chunk<1>) would wait a whole memory latency per element, the stores being ordered
// after the loads they follow.
template <int TOTAL, int STEP, typename Src, typename Dst>
__device__ __forceinline__ void fa2_copy_elements(int first, const Src& src, const Dst& dst) {
    constexpr int N = (TOTAL + STEP - 1) / STEP;
    constexpr int BATCH = N < 8 ? N : 8;
#pragma unroll 1
    for (int i0 = 0; i0 < N; i0 += BATCH) {
        unsigned short x[BATCH];
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            const int c = first + (i0 + j) * STEP;
            const unsigned short* p = c < TOTAL ? src(c) : nullptr;
            x[j] = p != nullptr ? __ldg(p) : (unsigned short)0;
        }
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            const int c = first + (i0 + j) * STEP;
            if (c < TOTAL) asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(dst(c)), "h"(x[j]));
        }
    }
}

// fa2_load_tile for rows of any alignment: chunks of E elements (fa2_copy_chunk; E = 1 batched,
// fa2_copy_elements), columns at or past `cols` and rows at or past `valid` zero-filled (`cols` a multiple of
// E: fa2_row_bytes divides the row length).
template <typename T, int D, int ROWS, int THREADS, int E, bool STREAM = false>
__device__ __forceinline__ void fa2_load_tile_narrow(unsigned dst, const T* base, long long stride, int valid, int tid,
                                                     int cols) {
    constexpr int CHUNKS = D / E;
    constexpr int LD = D + 8;
    static_assert(D % E == 0, "whole chunks per class row");
    if constexpr (E == 1) {
        fa2_copy_elements<ROWS * CHUNKS, THREADS>(
            tid,
            [&](int c) -> const unsigned short* {
                const int r = c / CHUNKS, col = c % CHUNKS;
                return r < valid && col < cols ? reinterpret_cast<const unsigned short*>(base + r * stride + col)
                                               : nullptr;
            },
            [&](int c) { return dst + ((c / CHUNKS) * LD + c % CHUNKS) * 2; });
    } else {
#pragma unroll 2
        for (int c = tid; c < ROWS * CHUNKS; c += THREADS) {
            const int r = c / CHUNKS, col = (c % CHUNKS) * E;
            const bool ok = r < valid && col < cols;
            fa2_copy_chunk<E, STREAM>(dst + (r * LD + col) * 2, ok ? base + r * stride + col : base, ok);
        }
    }
}

// The narrow copies of a tile (fa2_load_tile with row_bytes below 16: 8, 4 or 2), out of line: one body per
// tile shape however many load sites call it, so a padded program carries each narrow path once instead of
// once per site (NVRTC time and image size); the 16-byte path stays inline.
template <typename T, int D, int ROWS, int THREADS>
__device__ __noinline__ void fa2_load_tile_narrow_any(unsigned dst, const T* base, long long stride, int valid,
                                                      int tid, int cols, int row_bytes) {
    switch (row_bytes) {
        case 8: fa2_load_tile_narrow<T, D, ROWS, THREADS, 4>(dst, base, stride, valid, tid, cols); break;
        case 4: fa2_load_tile_narrow<T, D, ROWS, THREADS, 2>(dst, base, stride, valid, tid, cols); break;
        default: fa2_load_tile_narrow<T, D, ROWS, THREADS, 1>(dst, base, stride, valid, tid, cols); break;
    }
}

// Copies rows [0, ROWS) of a tile (row r at `base + r * stride`) into shared memory (32-bit address `dst`)
// with LD-element rows; rows at or past `valid` are zero-filled so masked keys never meet garbage (0 * NaN
// would poison P·V). With PAD, D is a head-dim class and only the first `cols` columns (a multiple of 8) are
// read; the rest are zero-filled, so they add nothing to Q·Kᵀ and give O columns that are never stored.
// With PAD, `row_bytes` (fa2_row_bytes) below 16 takes fa2_load_tile_narrow: `cols` is then any column count.
template <typename T, int D, int ROWS, int THREADS, bool PAD = false>
__device__ __forceinline__ void fa2_load_tile(unsigned dst, const T* base, long long stride, int valid, int tid,
                                              int cols = D, int row_bytes = 16) {
    constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
    constexpr int LD = D + 8;
    if (PAD && row_bytes != 16) {
        fa2_load_tile_narrow_any<T, D, ROWS, THREADS>(dst, base, stride, valid, tid, cols, row_bytes);
        return;
    }
    if constexpr (THREADS % CHUNKS == 0 && ROWS % (THREADS / CHUNKS) == 0) {
        // Each thread always copies the same column of rows r0, r0 + RSTEP, ...: no divisions in the loop.
        constexpr int RSTEP = THREADS / CHUNKS;
        const int r0 = tid / CHUNKS, col = (tid % CHUNKS) * 8;
        const T* src = base + r0 * stride + col;
        const unsigned d0 = dst + (r0 * LD + col) * 2;
#pragma unroll
        for (int i = 0; i < ROWS / RSTEP; ++i) {
            const bool ok = r0 + i * RSTEP < valid && (!PAD || col < cols);
            fa2_cp_async16(d0 + i * RSTEP * LD * 2, ok ? src : base, ok);
            src += RSTEP * stride;
        }
    } else {
#pragma unroll
        for (int c = tid; c < ROWS * CHUNKS; c += THREADS) {
            const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
            const bool ok = r < valid && (!PAD || col < cols);
            fa2_cp_async16(dst + (r * LD + col) * 2, ok ? base + r * stride + col : base, ok);
        }
    }
}

// The word of E 2-byte elements (E = 4, 2, 1).
template <int E>
struct Fa2Word;
template <>
struct Fa2Word<4> {
    using type = uint2;
};
template <>
struct Fa2Word<2> {
    using type = unsigned;
};
template <>
struct Fa2Word<1> {
    using type = unsigned short;
};

// Stores ROWS staged rows of a tile (shared `src`, LDS-element rows) to global rows `out + r * stride` for
// r < `rows`, columns below `cols`, in chunks of E elements (E = row_bytes / 2, fa2_row_bytes) by `n` threads
// from `lane`: the epilogue of the padded instantiations for rows that are not 16-byte aligned.
template <typename T, int DV, int ROWS, int LDS, int E>
__device__ __forceinline__ void fa2_store_rows_narrow(T* out, long long stride, const T* src, int rows, int cols,
                                                      int lane, int n) {
    constexpr int CHUNKS = DV / E;
    using W = typename Fa2Word<E>::type;
    for (int c = lane; c < ROWS * CHUNKS; c += n) {
        const int r = c / CHUNKS, col = (c % CHUNKS) * E;
        if (r < rows && col < cols)
            *reinterpret_cast<W*>(out + (long long)r * stride + col) = *reinterpret_cast<const W*>(src + r * LDS + col);
    }
}

// fa2_store_rows_narrow for the width of `row_bytes` (8, 4 or 2), out of line (as fa2_load_tile_narrow_any).
template <typename T, int DV, int ROWS, int LDS>
__device__ __noinline__ void fa2_store_rows_narrow_any(T* out, long long stride, const T* src, int rows, int cols,
                                                       int lane, int n, int row_bytes) {
    switch (row_bytes) {
        case 8: fa2_store_rows_narrow<T, DV, ROWS, LDS, 4>(out, stride, src, rows, cols, lane, n); break;
        case 4: fa2_store_rows_narrow<T, DV, ROWS, LDS, 2>(out, stride, src, rows, cols, lane, n); break;
        default: fa2_store_rows_narrow<T, DV, ROWS, LDS, 1>(out, stride, src, rows, cols, lane, n); break;
    }
}

// A warp's running state before the first K/V tile: O = 0, m = -inf, l = 0.
template <int MT, int DT>
__device__ __forceinline__ void fa2_init_state(float (&o)[MT][DT][4], float (&m)[MT][2], float (&l)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int j = 0; j < DT; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
        m[mt][0] = m[mt][1] = fa2_neg_inf();
        l[mt][0] = l[mt][1] = 0.f;
    }
}

// Whether the K/V tile of BN keys at n0 needs mask code for the query tile starting at m0: it crosses the end
// of the keys or the causal diagonal, or the mask is explicit. Other tiles skip it.
template <int MASK, int BN>
__device__ __forceinline__ bool fa2_tile_needs_mask(const AttnParams& p, int n0, int m0) {
    return (n0 + BN > p.sk) || (MASK == FA2_MASK_CAUSAL && n0 + BN - 1 > m0 + p.causal_offset) ||
           MASK == FA2_MASK_EXPLICIT;
}

// Whether a variant kernel scales its scores into log2 units in the mask step (explicit masks, softcap, ALiBi)
// instead of folding the scale into the softmax's exp2: the MASK its softmax update runs as.
template <int MASK, int VAR>
struct Fa2Scaled {
    static constexpr bool PRE = MASK == FA2_MASK_EXPLICIT || (VAR & (FA2_VAR_SOFTCAP | FA2_VAR_ALIBI)) != 0;
    static constexpr int UPDATE = PRE ? FA2_MASK_EXPLICIT : FA2_MASK_NONE;
};

// First key and one past the last key any row of [r_first, r_last] may see: the union of their bands, clamped
// to [0, Sk] (empty when first >= end).
__device__ __forceinline__ void fa2_band_keys(const AttnParams& p, int r_first, int r_last, int& first, int& end) {
    first = band_first(p, r_first);
    const long long e = (long long)r_last + p.band_hi + 1;
    end = e < 0 ? 0 : (e > p.sk ? p.sk : (int)e);
}

// The key tiles of BN keys a query tile of rows [m0, m_end) visits: tiles t0 .. t0 + n_tiles - 1 hold every key
// some row sees (the causal prefix, or with variants the union of the rows' bands); n_tiles may be 0.
template <int MASK, int VAR, int BN>
__device__ __forceinline__ void fa2_key_tiles(const AttnParams& p, int m0, int m_end, int& t0, int& n_tiles) {
    int n_keys = p.sk;
    t0 = 0;
    if (MASK == FA2_MASK_CAUSAL) n_keys = max(0, min(p.sk, m_end + p.causal_offset));
    if (VAR != 0) {
        int first;
        fa2_band_keys(p, m0, m_end - 1, first, n_keys);
        t0 = first / BN;
        n_keys = max(n_keys, t0 * BN);
    }
    n_tiles = (n_keys + BN - 1) / BN - t0;
}

// Whether a variant kernel's tile of W keys at n0 crosses a band edge of some row in [m_first, m_last], or the
// end of the keys `end`: only those tiles run the band test.
template <int W>
__device__ __forceinline__ bool fa2_tile_crosses_band(const AttnParams& p, int n0, int end, int m_first, int m_last) {
    return n0 + W > end || (long long)n0 < (long long)m_last + p.band_lo ||
           (long long)n0 + W - 1 > (long long)m_first + p.band_hi;
}

// Per-thread constants of the softcap in log2 units: s2 = c1 + c2 / (1 + 2^(x kc)) = cap log2(e) tanh(x scale
// / cap) for a raw score x, i.e. tanh(y) = 1 - 2 / (2^(2 y log2 e) + 1) with the scale and log2(e) folded in:
// one ex2 and one rcp on the special-function unit, absolute error of tanh about 1e-6 over the whole range
// (saturating exactly to +-1, NaN stays NaN). Not `tanh.approx.f32`: its relative error of 2^-11 times a cap
// of 50 moves a saturated logit by 0.025, a 2.5 % change of its weight, beyond f16's tolerance of 2e-3; not
// `tanhf`: several times the instructions in the inner loop.
struct Fa2Softcap {
    float kc, c1, c2;
};
__device__ __forceinline__ Fa2Softcap fa2_softcap_consts(const AttnParams& p) {
    const float cap = p.softcap > 0.f ? p.softcap : 1.f;
    return {2.f * p.scale_log2 / cap, cap * FA2_LOG2E, -2.f * cap * FA2_LOG2E};
}

// One raw score x (Q·K, unscaled) in log2 units with the softcap and ALiBi of VAR: `a2` is the row's slope
// times log2(e), `dist` the signed distance j - diag(i) of the key (exact in f32 below 2^24).
template <int VAR>
__device__ __forceinline__ float fa2_variant_score(float x, float sl2, const Fa2Softcap& c, float a2, float dist) {
    float y;
    if constexpr ((VAR & FA2_VAR_SOFTCAP) != 0) y = fmaf(c.c2, fast_rcp(1.f + fast_exp2(x * c.kc)), c.c1);
    else y = x * sl2;
    if constexpr ((VAR & FA2_VAR_ALIBI) != 0) y = fmaf(-a2, fabsf(dist), y);
    return y;
}

// The mask step of a variant kernel for one accumulator row (`NT` n8 tiles, this thread's two keys of each):
// scores into log2 units with softcap and ALiBi (when Fa2Scaled::PRE), the band test where `edge`, then the
// explicit mask (`mrow`, MASK_EXPLICIT). Masked scores become -inf.
// Keys at or past `key_stop` are masked too (Sk, or the end of a split).
template <int MASK, int VAR, int NT, bool RAWA = false>
__device__ __forceinline__ void fa2_variant_row(float (&s)[NT][4], int hh, const AttnParams& p, const float* mrow,
                                                int row, int key0, float sl2, const Fa2Softcap& c, float a2, int t4,
                                                bool edge, int key_stop) {
    constexpr bool PRE = Fa2Scaled<MASK, VAR>::PRE;
    // Distance of this thread's first key from the row's diagonal.
    const float dist0 = (float)(key0 + t4 * 2 - row - p.diag_offset);
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            float& x = s[j][hh * 2 + e];
            float y = x;
            if (PRE) y = fa2_variant_score<VAR>(x, sl2, c, a2, dist0 + (float)(j * 8 + e));
            else if (RAWA) y = fmaf(-a2, fabsf(dist0 + (float)(j * 8 + e)), x * sl2);
            const int key = key0 + j * 8 + t4 * 2 + e;
            bool vis = true;
            if (edge) {
                const int rel = key - row;
                vis = key < key_stop && rel >= p.band_lo && rel <= p.band_hi;
            }
            if (MASK == FA2_MASK_EXPLICIT && vis) y = fmaf(mrow[(long long)key * p.mask_stride[3]], FA2_LOG2E, y);
            x = vis ? y : fa2_neg_inf();
        }
}

// fa2_mask_scores for variant kernels: a warp's MT m16 row tiles of query head h.
template <int MASK, int VAR, int MT, int NT, bool RAWA = false>
__device__ __forceinline__ void fa2_variant_scores(float (&s)[MT][NT][4], const AttnParams& p, int b, int h, int row0,
                                                   int key0, float sl2, float a2, int g, int t4, bool edge) {
    const Fa2Softcap c = fa2_softcap_consts(p);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int row = row0 + mt * 16 + g + hh * 8;
            const float* mrow = MASK == FA2_MASK_EXPLICIT ? mask_row(p, b, h, min(row, p.sq - 1)) : nullptr;
            fa2_variant_row<MASK, VAR, NT, RAWA>(s[mt], hh, p, mrow, row, key0, sl2, c, a2, t4, edge, p.sk);
        }
}

// The ALiBi slope of query head h in log2 units (0 unless VAR has ALiBi).
template <int VAR>
__device__ __forceinline__ float fa2_alibi_log2(const AttnParams& p, int h) {
    return (VAR & FA2_VAR_ALIBI) != 0 ? p.alibi[h] * FA2_LOG2E : 0.f;
}

// S = Q·Kᵀ for a warp's MT m16 row tiles and NT n8 key tiles over D/16 k16 steps. `q_ld` and `k_ld` are the
// lane's ldmatrix addresses of the warp's first Q row and first key (rows LD elements long).
// ACC: add to the caller's values of s (a per-key bias) instead of starting from zero.
template <typename T, int D, int LD, int MT, int NT, bool ACC = false>
__device__ __forceinline__ void fa2_qk(float (&s)[MT][NT][4], unsigned q_ld, unsigned k_ld) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
            if (!ACC) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        unsigned a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) fa2_ldmatrix_x4(a[mt], q_ld + (mt * 16 * LD + kk * 16) * 2);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            unsigned bk[4];
            fa2_ldmatrix_x4(bk, k_ld + (np * 16 * LD + kk * 16) * 2);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                Fa2Type<T>::mma(s[mt][2 * np], a[mt], bk[0], bk[1]);
                Fa2Type<T>::mma(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
            }
        }
    }
}

// Masks a warp's scores: keys past the end, above the causal diagonal, or (MASK_EXPLICIT) with their additive
// mask; masked scores become -inf. `row0` is the warp's first query row, `key0` its first key. MASK_EXPLICIT
// also scales the scores here (log2 units); otherwise the scale is folded into the exp2 of the update.
template <int MASK, int MT, int NT>
__device__ __forceinline__ void fa2_mask_scores(float (&s)[MT][NT][4], const AttnParams& p, int b, int h, int row0,
                                                int key0, float sl2, int g, int t4) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int row = row0 + mt * 16 + g + hh * 8;
            const float* mrow = nullptr;
            if (MASK == FA2_MASK_EXPLICIT)
                mrow = p.mask + b * p.mask_stride[0] + h * p.mask_stride[1] + (long long)min(row, p.sq - 1) * p.mask_stride[2];
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = key0 + j * 8 + t4 * 2 + e;
                    float& x = s[mt][j][hh * 2 + e];
                    bool vis = key < p.sk;
                    if (MASK == FA2_MASK_CAUSAL) vis = vis && key <= row + p.causal_offset;
                    if (MASK == FA2_MASK_EXPLICIT)
                        x = vis ? x * sl2 + mrow[key * p.mask_stride[3]] * FA2_LOG2E : fa2_neg_inf();
                    else if (!vis)
                        x = fa2_neg_inf();
                }
        }
}

// The max of row half hh (rows g, or g + 8) of a warp's n8 score tiles, over the quad that holds the row.
template <int NT>
__device__ __forceinline__ float fa2_row_max(const float (&s)[NT][4], int hh) {
    float mx = fa2_neg_inf();
#pragma unroll
    for (int j = 0; j < NT; ++j) mx = fmaxf(mx, fmaxf(s[j][hh * 2], s[j][hh * 2 + 1]));
    return quad_max(mx);
}

// The online softmax update of row half hh given `mx`, the row's max over the new scores (raw; in log2 units
// when MASK is explicit): new running max m, P = 2^(s·scale − m) left in `s`, l and O rescaled by
// 2^(m_old − m). l stays a per-thread partial; the quad is summed at the end. splitkv_mla.cu takes mx over
// several warps' keys (through shared memory); the others take fa2_row_max of their own.
template <int MASK, int NT, int DT>
__device__ __forceinline__ void fa2_softmax_row(float (&s)[NT][4], int hh, float mx, float& m, float& l,
                                                float (&o)[DT][4], float sl2) {
    const float m_old = m;
    const float m_new = fmaxf(m_old, MASK == FA2_MASK_EXPLICIT ? mx : mx * sl2);
    // A row that has seen only masked keys so far keeps m = -inf; subtract 0 then, so exp2 gives 0.
    const float m_use = m_new == fa2_neg_inf() ? 0.f : m_new;
    const float alpha = fast_exp2(m_old - m_use);
    m = m_new;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            float& x = s[j][hh * 2 + e];
            x = MASK == FA2_MASK_EXPLICIT ? fast_exp2(x - m_use) : fast_exp2(fmaf(x, sl2, -m_use));
            sum += x;
        }
    l = l * alpha + sum;
#pragma unroll
    for (int j = 0; j < DT; ++j) {
        o[j][hh * 2] *= alpha;
        o[j][hh * 2 + 1] *= alpha;
    }
}

// The online softmax update of a warp's rows with its (masked) scores (fa2_softmax_row over each row half).
template <int MASK, int MT, int NT, int DT>
__device__ __forceinline__ void fa2_softmax_update(float (&s)[MT][NT][4], float (&m)[MT][2], float (&l)[MT][2],
                                                   float (&o)[MT][DT][4], float sl2) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
            fa2_softmax_row<MASK>(s[mt], hh, fa2_row_max(s[mt], hh), m[mt][hh], l[mt][hh], o[mt], sl2);
}

// O += P·V over a warp's NT n8 key tiles: P straight from the score registers (the C layout of two n8 tiles is
// the A layout of one k16 step), V by ldmatrix.trans from `v_ld`, the lane's address of the warp's first key.
template <typename T, int LD, int MT, int NT, int DT>
__device__ __forceinline__ void fa2_pv(float (&o)[MT][DT][4], const float (&s)[MT][NT][4], unsigned v_ld) {
#pragma unroll
    for (int kk = 0; kk < NT / 2; ++kk) {
        unsigned a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            a[mt][0] = Fa2Type<T>::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
            a[mt][1] = Fa2Type<T>::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
            a[mt][2] = Fa2Type<T>::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
            a[mt][3] = Fa2Type<T>::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {
            unsigned bv[4];
            fa2_ldmatrix_x4_trans(bv, v_ld + (kk * 16 * LD + dp * 16) * 2);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                Fa2Type<T>::mma(o[mt][2 * dp], a[mt], bv[0], bv[1]);
                Fa2Type<T>::mma(o[mt][2 * dp + 1], a[mt], bv[2], bv[3]);
            }
        }
    }
}

#endif  // SDPA_FA2_MMA_CUH
