// FlashAttention-1 forward in SIMT arithmetic (f32 products and sums for every dtype).
//
// One block per (query tile of 64 rows, query head, batch); a sequential loop over key/value tiles of 64
// keys staged in shared memory as f32; an online softmax per row (running max m, sum l, accumulator).
// 256 threads as a 16 x 16 grid: thread (tx, ty) owns query rows ty*4..ty*4+3 and, for the score tile,
// keys tx*4..tx*4+3, so every shared-memory read is a float4 feeding 16 FMAs. A row's 64 scores live in the
// 16 threads of one half-warp: row max and sum are half-warp shuffles; P goes through shared memory
// (transposed) to the P·V step, where the same thread owns columns tx*4 + 64*c of its rows.
//
// Fast variants fix D = Dv at compile time and keep the Q tile resident; the generic variant takes any D
// and Dv: Q·Kᵀ is accumulated over 32-wide chunks of D, and each block produces one 64-wide chunk of Dv
// (grid.y), recomputing the scores per chunk: still fused and O(S) in memory, for head dims up to 8192.
//
// Causal masks: key tiles wholly past the last visible key of the tile's last row are never loaded.
#include "common.cuh"

constexpr int FA1_BQ = 64;
constexpr int FA1_BK = 64;
constexpr int FA1_THREADS = 256;
constexpr int FA1_LDQ = FA1_BQ + 4;  // padded rows of the transposed Q and P tiles (float4 aligned)
constexpr int FA1_LDK = FA1_BK + 4;
constexpr int FA1_DC = 32;   // generic: D chunk staged at a time
constexpr int FA1_DVC = 64;  // generic: Dv columns per block


struct Fa1Block {
    int b, h, kvh, q0, n_keys;
};

// Block coordinates: grid.x enumerates (query tile, batch*head) with the tile index slow and reversed, so
// the longest causal tiles start first.
__device__ __forceinline__ Fa1Block fa1_block(const AttnParams& p) {
    const int bh_count = p.b * p.hq;
    const int n_tiles = (p.sq + FA1_BQ - 1) / FA1_BQ;
    const int bh = blockIdx.x % bh_count;
    const int tile = n_tiles - 1 - (int)(blockIdx.x / bh_count);
    Fa1Block blk;
    blk.b = bh / p.hq;
    blk.h = bh % p.hq;
    blk.kvh = blk.h / p.group;
    blk.q0 = tile * FA1_BQ;
    const int q_last = min(blk.q0 + FA1_BQ, p.sq) - 1;
    blk.n_keys = causal_limit(p, q_last);  // Sk unless causal
    return blk;
}

// dst[c * ld + r] = src[r * row_stride + c0 + c] for r < rows, c < cols; zero outside `rows_valid` / `cols_valid`.
template <typename T>
__device__ __forceinline__ void fa1_load_transposed(float* dst, int ld, const T* src, i64 row_stride, int rows,
                                                    int rows_valid, int c0, int cols, int cols_valid) {
    for (int idx = threadIdx.x; idx < rows * cols; idx += FA1_THREADS) {
        const int r = idx / cols, c = idx - r * cols;
        float x = 0.f;
        if (r < rows_valid && c0 + c < cols_valid) x = to_f32(src[r * row_stride + c0 + c]);
        dst[c * ld + r] = x;
    }
}

// dst[r * cols + c] = src[r * row_stride + c0 + c], zero outside.
template <typename T>
__device__ __forceinline__ void fa1_load_rows(float* dst, const T* src, i64 row_stride, int rows, int rows_valid,
                                              int c0, int cols, int cols_valid) {
    for (int idx = threadIdx.x; idx < rows * cols; idx += FA1_THREADS) {
        const int r = idx / cols, c = idx - r * cols;
        float x = 0.f;
        if (r < rows_valid && c0 + c < cols_valid) x = to_f32(src[r * row_stride + c0 + c]);
        dst[idx] = x;
    }
}

// s[r][c] += Q[:, ty*4+r] . K[:, tx*4+c] over `depth` rows of the transposed tiles.
__device__ __forceinline__ void fa1_scores(float (&s)[4][4], const float* Qs, const float* Ks, int depth, int tx,
                                           int ty) {
#pragma unroll 8
    for (int d = 0; d < depth; ++d) {
        const float4 q = *reinterpret_cast<const float4*>(Qs + d * FA1_LDQ + ty * 4);
        const float4 k = *reinterpret_cast<const float4*>(Ks + d * FA1_LDK + tx * 4);
        const float qa[4] = {q.x, q.y, q.z, q.w};
        const float ka[4] = {k.x, k.y, k.z, k.w};
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int c = 0; c < 4; ++c) s[r][c] = fmaf(qa[r], ka[c], s[r][c]);
    }
}

// Masks and scales one score tile, updates (m, l), returns the accumulator rescale per row, writes
// P (transposed) to Ps.
template <typename T>
__device__ __forceinline__ void fa1_softmax(const AttnParams& p, const Fa1Block& blk, int k0, float (&s)[4][4],
                                            float (&m)[4], float (&l)[4], float (&alpha)[4], float* Ps, int tx,
                                            int ty) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int i = blk.q0 + ty * 4 + r;
        const bool row_ok = i < p.sq;
        const int limit = row_ok ? causal_limit(p, i) : 0;
        const float* mrow = (row_ok && p.mask_kind == SDPA_MASK_EXPLICIT) ? mask_row(p, blk.b, blk.h, i) : nullptr;
        float mx = SDPA_NEG_INF;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int j = k0 + tx * 4 + c;
            bool vis = j < limit;
            // Scores in log2 units: exp2 of (x - m) is one MUFU instruction (error ~2 ulp, far under f32's
            // tolerance), and the LSE converts back at the end.
            float x = s[r][c] * p.scale_log2;
            if (vis && mrow != nullptr) {
                const float add = mrow[j * p.mask_stride[3]];
                vis = add != SDPA_NEG_INF;
                x = fmaf(add, SDPA_LOG2E, x);
            }
            s[r][c] = vis ? x : SDPA_NEG_INF;
            mx = nan_max(mx, s[r][c]);
        }
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) mx = nan_max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float m_new = nan_max(m[r], mx);
        float sum = 0.f;
        if (m_new == SDPA_NEG_INF) {
            alpha[r] = 1.f;
#pragma unroll
            for (int c = 0; c < 4; ++c) s[r][c] = 0.f;
        } else {
            alpha[r] = m[r] == SDPA_NEG_INF ? 0.f : exp2f(m[r] - m_new);
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                s[r][c] = s[r][c] == SDPA_NEG_INF ? 0.f : exp2f(s[r][c] - m_new);
                sum += s[r][c];
            }
        }
#pragma unroll
        for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
        l[r] = l[r] * alpha[r] + sum;
        m[r] = m_new;
    }
#pragma unroll
    for (int c = 0; c < 4; ++c)
        *reinterpret_cast<float4*>(Ps + (tx * 4 + c) * FA1_LDQ + ty * 4) =
            make_float4(s[0][c], s[1][c], s[2][c], s[3][c]);
}

// acc[r][cc*4+e] = acc * alpha + P[:, row] . V[:, cc*64 + tx*4 + e] over the key tile; V tile row width `vw`.
template <int NC>
__device__ __forceinline__ void fa1_pv(float (&acc)[4][NC * 4], const float (&alpha)[4], const float* Ps,
                                       const float* Vs, int vw, int tx, int ty) {
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int e = 0; e < NC * 4; ++e) acc[r][e] *= alpha[r];
#pragma unroll 4
    for (int k = 0; k < FA1_BK; ++k) {
        const float4 pk = *reinterpret_cast<const float4*>(Ps + k * FA1_LDQ + ty * 4);
        const float pa[4] = {pk.x, pk.y, pk.z, pk.w};
#pragma unroll
        for (int cc = 0; cc < NC; ++cc) {
            const int col = cc * 64 + tx * 4;
            if (col < vw) {
                const float4 v = *reinterpret_cast<const float4*>(Vs + k * vw + col);
                const float va[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int r = 0; r < 4; ++r)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[r][cc * 4 + e] = fmaf(pa[r], va[e], acc[r][cc * 4 + e]);
            }
        }
    }
}

// Writes O = acc / l for the block's rows and columns [c0, c0 + vw) and the LSE (when `write_lse`).
template <typename T, int NC>
__device__ __forceinline__ void fa1_store(const AttnParams& p, const Fa1Block& blk, const float (&acc)[4][NC * 4],
                                          const float (&m)[4], const float (&l)[4], int c0, int vw, bool write_lse,
                                          int tx, int ty) {
    T* o = static_cast<T*>(p.o) + blk.b * p.o_stride[0] + blk.h * p.o_stride[1];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int i = blk.q0 + ty * 4 + r;
        if (i >= p.sq) continue;
        const float inv = row_inv_l(l[r]);
#pragma unroll
        for (int cc = 0; cc < NC; ++cc)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int col = cc * 64 + tx * 4 + e;
                if (col < vw && c0 + col < p.dv) o[i * p.o_stride[2] + c0 + col] = from_f32<T>(acc[r][cc * 4 + e] * inv);
            }
        if (write_lse && tx == 0 && p.lse != nullptr)
            p.lse[((i64)blk.b * p.hq + blk.h) * p.sq + i] = row_lse_log2(m[r], l[r]);
    }
}

// Fast variant: D = Dv = HD fixed, Q tile resident in shared memory.
template <typename T, int HD>
__device__ void fa1_fixed(const AttnParams& p) {
    constexpr int NC = (HD + 63) / 64;
    // P reuses the K tile's memory once the scores are done (one more barrier per tile, a fifth less
    // shared memory: two blocks per SM at D = 128, four at D = 64).
    constexpr bool ALIAS_P = HD * FA1_LDK >= FA1_BK * FA1_LDQ;
    extern __shared__ __align__(16) float smem[];
    float* Qs = smem;                  // [HD][LDQ]
    float* Ks = Qs + HD * FA1_LDQ;     // [HD][LDK]
    float* Vs = Ks + HD * FA1_LDK;     // [BK][HD]
    float* Ps = ALIAS_P ? Ks : Vs + FA1_BK * HD;  // [BK][LDQ]
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const Fa1Block blk = fa1_block(p);
    const T* q = static_cast<const T*>(p.q) + blk.b * p.q_stride[0] + blk.h * p.q_stride[1] + blk.q0 * p.q_stride[2];
    const T* k = static_cast<const T*>(p.k) + blk.b * p.k_stride[0] + blk.kvh * p.k_stride[1];
    const T* v = static_cast<const T*>(p.v) + blk.b * p.v_stride[0] + blk.kvh * p.v_stride[1];
    fa1_load_transposed(Qs, FA1_LDQ, q, p.q_stride[2], FA1_BQ, p.sq - blk.q0, 0, HD, HD);

    float m[4], l[4], alpha[4], acc[4][NC * 4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        m[r] = SDPA_NEG_INF;
        l[r] = 0.f;
#pragma unroll
        for (int e = 0; e < NC * 4; ++e) acc[r][e] = 0.f;
    }
    for (int k0 = 0; k0 < blk.n_keys; k0 += FA1_BK) {
        const int valid = p.sk - k0;
        fa1_load_transposed(Ks, FA1_LDK, k + k0 * p.k_stride[2], p.k_stride[2], FA1_BK, valid, 0, HD, HD);
        fa1_load_rows(Vs, v + k0 * p.v_stride[2], p.v_stride[2], FA1_BK, valid, 0, HD, HD);
        __syncthreads();
        float s[4][4] = {};
        fa1_scores(s, Qs, Ks, HD, tx, ty);
        if (ALIAS_P) __syncthreads();  // every thread is done reading K before P overwrites it
        fa1_softmax<T>(p, blk, k0, s, m, l, alpha, Ps, tx, ty);
        __syncthreads();
        fa1_pv<NC>(acc, alpha, Ps, Vs, HD, tx, ty);
        __syncthreads();
    }
    fa1_store<T, NC>(p, blk, acc, m, l, 0, HD, true, tx, ty);
}

// Generic variant: any D and Dv; grid.y picks the 64-wide Dv chunk.
template <typename T>
__device__ void fa1_generic(const AttnParams& p) {
    extern __shared__ __align__(16) float smem[];
    float* Qs = smem;                   // [DC][LDQ]
    float* Ks = Qs + FA1_DC * FA1_LDQ;  // [DC][LDK]
    float* Vs = Ks + FA1_DC * FA1_LDK;  // [BK][DVC]
    float* Ps = Vs + FA1_BK * FA1_DVC;  // [BK][LDQ]
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const Fa1Block blk = fa1_block(p);
    const int c0 = blockIdx.y * FA1_DVC;
    const T* q = static_cast<const T*>(p.q) + blk.b * p.q_stride[0] + blk.h * p.q_stride[1] + blk.q0 * p.q_stride[2];
    const T* k = static_cast<const T*>(p.k) + blk.b * p.k_stride[0] + blk.kvh * p.k_stride[1];
    const T* v = static_cast<const T*>(p.v) + blk.b * p.v_stride[0] + blk.kvh * p.v_stride[1];

    float m[4], l[4], alpha[4], acc[4][4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        m[r] = SDPA_NEG_INF;
        l[r] = 0.f;
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[r][e] = 0.f;
    }
    for (int k0 = 0; k0 < blk.n_keys; k0 += FA1_BK) {
        const int valid = p.sk - k0;
        float s[4][4] = {};
        for (int d0 = 0; d0 < p.d; d0 += FA1_DC) {
            fa1_load_transposed(Qs, FA1_LDQ, q, p.q_stride[2], FA1_BQ, p.sq - blk.q0, d0, FA1_DC, p.d);
            fa1_load_transposed(Ks, FA1_LDK, k + k0 * p.k_stride[2], p.k_stride[2], FA1_BK, valid, d0, FA1_DC, p.d);
            __syncthreads();
            fa1_scores(s, Qs, Ks, FA1_DC, tx, ty);
            __syncthreads();
        }
        fa1_load_rows(Vs, v + k0 * p.v_stride[2], p.v_stride[2], FA1_BK, valid, c0, FA1_DVC, p.dv);
        fa1_softmax<T>(p, blk, k0, s, m, l, alpha, Ps, tx, ty);
        __syncthreads();
        fa1_pv<1>(acc, alpha, Ps, Vs, FA1_DVC, tx, ty);
        __syncthreads();
    }
    fa1_store<T, 1>(p, blk, acc, m, l, c0, FA1_DVC, blockIdx.y == 0, tx, ty);
}

#define FA1_FIXED(NAME, T, HD)                                                                   \
    extern "C" __global__ void __launch_bounds__(FA1_THREADS) NAME(const AttnParams p) {       \
        fa1_fixed<T, HD>(p);                                                                     \
    }
#define FA1_ALL_DIMS(TNAME, T)      \
    FA1_FIXED(fa1_##TNAME##_32, T, 32)   \
    FA1_FIXED(fa1_##TNAME##_64, T, 64)   \
    FA1_FIXED(fa1_##TNAME##_80, T, 80)   \
    FA1_FIXED(fa1_##TNAME##_96, T, 96)   \
    FA1_FIXED(fa1_##TNAME##_128, T, 128) \
    FA1_FIXED(fa1_##TNAME##_256, T, 256) \
    extern "C" __global__ void __launch_bounds__(FA1_THREADS) fa1_##TNAME(const AttnParams p) { fa1_generic<T>(p); }

FA1_ALL_DIMS(f32, float)
FA1_ALL_DIMS(f16, __half)
FA1_ALL_DIMS(bf16, __nv_bfloat16)
