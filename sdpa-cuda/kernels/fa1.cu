// FlashAttention-1 forward in SIMT arithmetic (f32 products and sums for every dtype).
//
// Three variants, all with one block per (query tile, query head, batch), a sequential loop over 64-key
// K/V tiles staged in shared memory as f32 and an online softmax per row (running max m, sum l,
// accumulator):
// - `fa1t_{dtype}_{D}` (register-tiled, below `fa1_tiled`): the fast path for D = Dv in {32, 64, 80, 96,
//   128, 256} on 16-byte aligned views; several query rows and keys per thread, K/V copied with cp.async
//   while the previous step computes.
// - `fa1_{dtype}_{D}` (plain fixed, `fa1_fixed`): the same head dims for views the tiled variant cannot
//   copy in 16-byte chunks. 256 threads as a 16 x 16 grid: thread (tx, ty) owns query rows ty*4..ty*4+3
//   and keys tx*4..tx*4+3 of 64-row / 64-key tiles; Q, K and P transposed in shared memory.
// - `fa1_{dtype}` (generic, `fa1_generic`): any D and Dv. Q·Kᵀ is accumulated over 32-wide chunks of D, and
//   each block produces one 64-wide chunk of Dv (grid.y), recomputing the scores per chunk: still fused and
//   O(S) in memory, for head dims up to 8192.
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
    int k_start;  // first key tile's start (a multiple of 64): the band's first key of the block's first row
};

// Block coordinates: grid.x enumerates (query tile, batch*head) with the tile index slow and reversed, so
// the longest causal tiles start first.
__device__ __forceinline__ Fa1Block fa1_block(const AttnParams& p, int bq = FA1_BQ) {
    const int bh_count = p.b * p.hq;
    const int n_tiles = (p.sq + bq - 1) / bq;
    const int bh = blockIdx.x % bh_count;
    const int tile = n_tiles - 1 - (int)(blockIdx.x / bh_count);
    Fa1Block blk;
    blk.b = bh / p.hq;
    blk.h = bh % p.hq;
    blk.kvh = blk.h / p.group;
    blk.q0 = tile * bq;
    const int q_last = min(blk.q0 + bq, p.sq) - 1;
    // Keys of the block's rows' bands (causal masks and windows; all of Sk otherwise): tiles outside are
    // never loaded. Every tile's start stays a multiple of 64 (FA1_BK and the tiled kernel's BK).
    blk.k_start = (band_first(p, blk.q0) / 64) * 64;
    blk.n_keys = max(band_end(p, q_last), blk.k_start);
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
        const float* mrow = (row_ok && p.mask_kind == SDPA_MASK_EXPLICIT) ? mask_row(p, blk.b, blk.h, i) : nullptr;
        float mx = SDPA_NEG_INF;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int j = k0 + tx * 4 + c;
            bool vis = row_ok && j < p.sk && band_visible(p, i, j);
            // Scores in log2 units: exp2 of (x - m) is one MUFU instruction (error ~2 ulp, far under f32's
            // tolerance), and the LSE converts back at the end. Softcap and ALiBi (uniform branch) first.
            float x = has_score_variants(p) ? variant_score(p, s[r][c] * p.scale, blk.h, i, j) * SDPA_LOG2E
                                            : s[r][c] * p.scale_log2;
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
    bool bad = false;
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
                const float x = acc[r][cc * 4 + e] * inv;
                if (col < vw && c0 + col < p.dv) {
                    o[i * p.o_stride[2] + c0 + col] = from_f32<T>(x);
                    bad |= !isfinite(x);
                }
            }
        if (write_lse && tx == 0 && p.lse != nullptr)
            p.lse[((i64)blk.b * p.hq + blk.h) * p.sq + i] = row_lse_log2(m[r], l[r]);
    }
    // NaN or inf under a masked key must not reach rows that do not see it (common.cuh).
    repair_nonfinite_rows<T>(p, blk.b, blk.h, blk.q0, SDPA_ONE_HEAD, min(FA1_BQ, p.sq - blk.q0), c0, min(c0 + vw, p.dv),
                             write_lse, bad);
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
    for (int k0 = blk.k_start; k0 < blk.n_keys; k0 += FA1_BK) {
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
    for (int k0 = blk.k_start; k0 < blk.n_keys; k0 += FA1_BK) {
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

// ---- Register-tiled fast variant (`fa1t_{dtype}_{D}`) -------------------------------------------------------
//
// The 4x4-per-thread tile above feeds 16 FMAs per two 16-byte shared loads and is bound by shared memory.
// Here the NT = 16 TX threads form 16 row groups of TX (tx = tid % TX, ty = tid / TX): a thread owns TM query
// rows ty + 16 r (BQ = 16 TM rows per block), TN = 64 / TX keys tx + TX c of each 64-key tile and HD / TX
// output columns, so a step of four head-dim elements costs TM + TN shared loads for 4 TM TN FMAs (S = Q·Kᵀ)
// and a step of four keys TM + HD / TX loads for 4 TM HD / TX FMAs (O += P·V). TX = 16 (256 threads) in
// general, TX = 8 (128 threads, an 8 x 8 score tile per thread) where registers allow it (Fa1TiledChoice).
// A row's scores live in TX adjacent lanes, so row max and sum are TX-lane shuffles. All tiles are row-major
// f32 in shared memory with Q and K rows padded by four floats: the rows a warp reads at once (consecutive
// ty) and the key rows (tx) land in distinct bank groups, so every 16-byte load takes the fewest wavefronts.
//
// Loads overlap compute in the order FA-2 uses: V[j] is requested before S = Q·K[j]ᵀ, K[j+1] before the
// softmax and P·V of tile j (f32 through cp.async; f16/bf16 through registers, converted when they land).
// Needs 16-byte aligned Q/K/V bases and strides (the launcher checks, else the plain fixed variant runs).

__device__ __forceinline__ void fa1_cp_async16(float* sdst, const void* gsrc, int src_bytes) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(sdst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gsrc), "r"(src_bytes));
}
__device__ __forceinline__ void fa1_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void fa1_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Two packed 16-bit values to f32.
__device__ __forceinline__ float2 fa1_unpack2(unsigned bits, __half) {
    return __half22float2(*reinterpret_cast<const __half2*>(&bits));
}
__device__ __forceinline__ float2 fa1_unpack2(unsigned bits, __nv_bfloat16) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits));
}

// Copies a ROWS x HD tile (global rows `row_stride` elements apart, rows >= rows_valid read as zeros) into
// shared memory as f32 rows LD floats apart, in 16-byte chunks spread over the 256 threads. f32: `issue`
// starts cp.async copies (completed by the caller's cp.async wait); f16/bf16: `issue` loads into registers
// and `land` converts and stores them.
template <typename T, int ROWS, int HD, int LD, int NT>
struct Fa1TileLoad {
    static constexpr bool ASYNC = sizeof(T) == 4;
    static constexpr int VE = 16 / (int)sizeof(T);  // elements per chunk
    static constexpr int CPR = HD / VE;             // chunks per row
    static constexpr int CHUNKS = ROWS * CPR;
    static constexpr int PER = (CHUNKS + NT - 1) / NT;
    uint4 stage[ASYNC ? 1 : PER];

    __device__ __forceinline__ void issue(float* dst, const T* src, i64 row_stride, int rows_valid) {
        // When CPR divides the thread count, chunk i of a thread is row r0 + i * RSTEP, column ch: one base
        // pointer and one stride (keeps the per-chunk 64-bit addresses out of the registers).
        constexpr bool REGULAR = NT % CPR == 0;
        constexpr int RSTEP = REGULAR ? NT / CPR : 0;
        const int r0 = threadIdx.x / CPR, ch0 = threadIdx.x - r0 * CPR;
        const T* base = src + r0 * row_stride + ch0 * VE;
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const int idx = threadIdx.x + i * NT;
            if (CHUNKS % NT == 0 || idx < CHUNKS) {
                const int r = REGULAR ? r0 + i * RSTEP : idx / CPR;
                const int ch = REGULAR ? ch0 : idx - r * CPR;
                const bool ok = r < rows_valid;
                const T* g = REGULAR ? base + i * RSTEP * row_stride : src + r * row_stride + ch * VE;
                if (!ok) g = src;
                if constexpr (ASYNC) {
                    fa1_cp_async16(dst + r * LD + ch * VE, g, ok ? 16 : 0);
                } else {
                    stage[i] = ok ? *reinterpret_cast<const uint4*>(g) : make_uint4(0, 0, 0, 0);
                }
            }
        }
    }

    __device__ __forceinline__ void land(float* dst) {
        if constexpr (!ASYNC) {
#pragma unroll
            for (int i = 0; i < PER; ++i) {
                const int idx = threadIdx.x + i * NT;
                if (CHUNKS % NT == 0 || idx < CHUNKS) {
                    const int r = idx / CPR, ch = idx - r * CPR;
                    const float2 a = fa1_unpack2(stage[i].x, T()), b = fa1_unpack2(stage[i].y, T());
                    const float2 c = fa1_unpack2(stage[i].z, T()), d = fa1_unpack2(stage[i].w, T());
                    float* o = dst + r * LD + ch * VE;
                    *reinterpret_cast<float4*>(o) = make_float4(a.x, a.y, b.x, b.y);
                    *reinterpret_cast<float4*>(o + 4) = make_float4(c.x, c.y, d.x, d.y);
                }
            }
        }
    }
};

// ALIAS: P takes the K tile's memory (K is dead once the scores are done), so two blocks fit per SM at
// HD = 128 with TM = 4; K[j+1] is then requested only after P·V of tile j, and the other block covers it.
template <int HD, int TM, bool ALIAS = false, int TX = 16>
struct Fa1Tiled {
    static constexpr int NT = 16 * TX;  // threads: 16 row groups of TX
    static constexpr int BQ = 16 * TM;
    static constexpr int BK = 64;
    static constexpr int TN = BK / TX;  // keys per thread
    static constexpr int LDQ = HD + 4;
    static constexpr int LDK = HD + 4;
    static constexpr int LDV = HD;
    static constexpr int LDP = BK + 4;
    static constexpr int TD = HD / TX;  // output columns per thread
    // Output columns as NG groups of VEC adjacent ones: column (g, e) = g * TX * VEC + tx * VEC + e.
    static constexpr int VEC = TD % 4 == 0 ? 4 : (TD % 2 == 0 ? 2 : 1);
    static constexpr int NG = TD / VEC;
    static constexpr int SMEM_FLOATS = BQ * LDQ + BK * LDK + BK * LDV + (ALIAS ? 0 : BQ * LDP);
    static_assert(HD % 16 == 0 && HD % TX == 0, "tiled fa1 needs HD % 16 == 0");
    static_assert(!ALIAS || BQ * LDP <= BK * LDK, "P must fit in the K tile");
};

template <typename T, int HD, int TM, bool ALIAS, int UNR, int TX = 16>
__device__ void fa1_tiled(const AttnParams& p) {
    using C = Fa1Tiled<HD, TM, ALIAS, TX>;
    constexpr int NT = C::NT, TN = C::TN;
    constexpr int BQ = C::BQ, BK = C::BK, LDQ = C::LDQ, LDK = C::LDK, LDV = C::LDV, LDP = C::LDP;
    constexpr int TD = C::TD, VEC = C::VEC, NG = C::NG;
    extern __shared__ __align__(16) float smem[];
    float* Qs = smem;             // [BQ][LDQ]
    float* Ks = Qs + BQ * LDQ;    // [BK][LDK]
    float* Vs = Ks + BK * LDK;    // [BK][LDV]
    float* Ps = ALIAS ? Ks : Vs + BK * LDV;  // [BQ][LDP]
    const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;
    const Fa1Block blk = fa1_block(p, BQ);
    const T* q = static_cast<const T*>(p.q) + blk.b * p.q_stride[0] + blk.h * p.q_stride[1] + blk.q0 * p.q_stride[2];
    const T* k = static_cast<const T*>(p.k) + blk.b * p.k_stride[0] + blk.kvh * p.k_stride[1];
    const T* v = static_cast<const T*>(p.v) + blk.b * p.v_stride[0] + blk.kvh * p.v_stride[1];

    Fa1TileLoad<T, BK, HD, LDK, NT> kload;
    Fa1TileLoad<T, BK, HD, LDV, NT> vload;
    {
        Fa1TileLoad<T, BQ, HD, LDQ, NT> qload;
        qload.issue(Qs, q, p.q_stride[2], p.sq - blk.q0);
        qload.land(Qs);
    }
    const bool any_keys = blk.n_keys > blk.k_start;
    if (any_keys) kload.issue(Ks, k + (i64)blk.k_start * p.k_stride[2], p.k_stride[2], p.sk - blk.k_start);
    fa1_cp_async_commit();
    if (ALIAS && any_keys) vload.issue(Vs, v + (i64)blk.k_start * p.v_stride[2], p.v_stride[2], p.sk - blk.k_start);
    if (ALIAS) fa1_cp_async_commit();

    float m[TM], l[TM], acc[TM][TD];
#pragma unroll
    for (int r = 0; r < TM; ++r) {
        m[r] = SDPA_NEG_INF;
        l[r] = 0.f;
#pragma unroll
        for (int e = 0; e < TD; ++e) acc[r][e] = 0.f;
    }
    const float* qp = Qs + ty * LDQ;
    const float* kp = Ks + tx * LDK;
    const float* pp = Ps + ty * LDP;
    for (int k0 = blk.k_start; k0 < blk.n_keys; k0 += BK) {
        kload.land(Ks);
        if constexpr (ALIAS) {
            fa1_cp_async_wait<1>();  // K[j] (and Q); V[j] may still be in flight
            __syncthreads();
        } else {
            fa1_cp_async_wait<0>();
            __syncthreads();  // K[j] (and Q) in place; every thread is past P·V of tile j-1 (Vs, Ps free)
            vload.issue(Vs, v + k0 * p.v_stride[2], p.v_stride[2], p.sk - k0);
            fa1_cp_async_commit();
        }

        // S = Q·K[j]ᵀ for rows ty + 16 r and keys tx + TX c.
        float s[TM][TN];
#pragma unroll
        for (int r = 0; r < TM; ++r)
#pragma unroll
            for (int c = 0; c < TN; ++c) s[r][c] = 0.f;
        if constexpr (TN <= 4) {
#pragma unroll UNR
            for (int d = 0; d < HD; d += 4) {
                float4 kv[TN];
#pragma unroll
                for (int c = 0; c < TN; ++c) kv[c] = *reinterpret_cast<const float4*>(kp + c * TX * LDK + d);
#pragma unroll
                for (int r = 0; r < TM; ++r) {
                    const float4 qv = *reinterpret_cast<const float4*>(qp + r * 16 * LDQ + d);
#pragma unroll
                    for (int c = 0; c < TN; ++c) {
                        s[r][c] = fmaf(qv.x, kv[c].x, s[r][c]);
                        s[r][c] = fmaf(qv.y, kv[c].y, s[r][c]);
                        s[r][c] = fmaf(qv.z, kv[c].z, s[r][c]);
                        s[r][c] = fmaf(qv.w, kv[c].w, s[r][c]);
                    }
                }
            }
        } else {
            // Eight keys per thread: 8-byte loads halve the K operand registers.
#pragma unroll UNR
            for (int d = 0; d < HD; d += 2) {
                float2 kv[TN];
#pragma unroll
                for (int c = 0; c < TN; ++c) kv[c] = *reinterpret_cast<const float2*>(kp + c * TX * LDK + d);
#pragma unroll
                for (int r = 0; r < TM; ++r) {
                    const float2 qv = *reinterpret_cast<const float2*>(qp + r * 16 * LDQ + d);
#pragma unroll
                    for (int c = 0; c < TN; ++c) {
                        s[r][c] = fmaf(qv.x, kv[c].x, s[r][c]);
                        s[r][c] = fmaf(qv.y, kv[c].y, s[r][c]);
                    }
                }
            }
        }
        __syncthreads();  // every thread is done reading K[j]
        if (!ALIAS) {
            if (k0 + BK < blk.n_keys) kload.issue(Ks, k + (k0 + BK) * p.k_stride[2], p.k_stride[2], p.sk - k0 - BK);
            fa1_cp_async_commit();
        }

        // Online softmax per row (scores in log2 units, as in fa1_softmax); P to shared memory.
        float alpha[TM];
#pragma unroll
        for (int r = 0; r < TM; ++r) {
            const int i = blk.q0 + ty + 16 * r;
            const bool row_ok = i < p.sq;
            const float* mrow = (row_ok && p.mask_kind == SDPA_MASK_EXPLICIT) ? mask_row(p, blk.b, blk.h, i) : nullptr;
            float mx = SDPA_NEG_INF;
#pragma unroll
            for (int c = 0; c < TN; ++c) {
                const int j = k0 + tx + TX * c;
                bool vis = row_ok && j < p.sk && band_visible(p, i, j);
                float x = has_score_variants(p) ? variant_score(p, s[r][c] * p.scale, blk.h, i, j) * SDPA_LOG2E
                                                : s[r][c] * p.scale_log2;
                if (vis && mrow != nullptr) {
                    const float add = mrow[j * p.mask_stride[3]];
                    vis = add != SDPA_NEG_INF;
                    x = fmaf(add, SDPA_LOG2E, x);
                }
                s[r][c] = vis ? x : SDPA_NEG_INF;
                mx = nan_max(mx, s[r][c]);
            }
#pragma unroll
            for (int o = TX / 2; o > 0; o >>= 1) mx = nan_max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float m_new = nan_max(m[r], mx);
            float sum = 0.f;
            if (m_new == SDPA_NEG_INF) {
                alpha[r] = 1.f;
#pragma unroll
                for (int c = 0; c < TN; ++c) s[r][c] = 0.f;
            } else {
                alpha[r] = m[r] == SDPA_NEG_INF ? 0.f : exp2f(m[r] - m_new);
#pragma unroll
                for (int c = 0; c < TN; ++c) {
                    s[r][c] = s[r][c] == SDPA_NEG_INF ? 0.f : exp2f(s[r][c] - m_new);
                    sum += s[r][c];
                }
            }
#pragma unroll
            for (int o = TX / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            l[r] = l[r] * alpha[r] + sum;
            m[r] = m_new;
#pragma unroll
            for (int c = 0; c < TN; ++c) Ps[(ty + 16 * r) * LDP + tx + TX * c] = s[r][c];
        }
        vload.land(Vs);
        if constexpr (ALIAS) {
            fa1_cp_async_wait<0>();
        } else {
            fa1_cp_async_wait<1>();
        }
        __syncthreads();  // V[j] and P in place (K[j+1] may still be in flight)

        // O = O * alpha + P·V[j] for rows ty + 16 r and this thread's columns.
#pragma unroll
        for (int r = 0; r < TM; ++r)
#pragma unroll
            for (int e = 0; e < TD; ++e) acc[r][e] *= alpha[r];
#pragma unroll UNR
        for (int kk = 0; kk < BK; kk += 4) {
            float4 pv[TM];
#pragma unroll
            for (int r = 0; r < TM; ++r) pv[r] = *reinterpret_cast<const float4*>(pp + r * 16 * LDP + kk);
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const float* vrow = Vs + (kk + u) * LDV + tx * VEC;
                float vv[TD];
#pragma unroll
                for (int g = 0; g < NG; ++g) {
                    if constexpr (VEC == 4) {
                        const float4 t = *reinterpret_cast<const float4*>(vrow + g * TX * VEC);
                        vv[g * 4] = t.x, vv[g * 4 + 1] = t.y, vv[g * 4 + 2] = t.z, vv[g * 4 + 3] = t.w;
                    } else if constexpr (VEC == 2) {
                        const float2 t = *reinterpret_cast<const float2*>(vrow + g * TX * VEC);
                        vv[g * 2] = t.x, vv[g * 2 + 1] = t.y;
                    } else {
                        vv[g] = vrow[g * TX];
                    }
                }
#pragma unroll
                for (int r = 0; r < TM; ++r) {
                    const float pr = u == 0 ? pv[r].x : (u == 1 ? pv[r].y : (u == 2 ? pv[r].z : pv[r].w));
#pragma unroll
                    for (int e = 0; e < TD; ++e) acc[r][e] = fmaf(pr, vv[e], acc[r][e]);
                }
            }
        }
        if constexpr (ALIAS) {
            if (k0 + BK < blk.n_keys) {
                __syncthreads();  // every thread is done with P (in the K tile) and V[j]
                kload.issue(Ks, k + (k0 + BK) * p.k_stride[2], p.k_stride[2], p.sk - k0 - BK);
                fa1_cp_async_commit();
                vload.issue(Vs, v + (k0 + BK) * p.v_stride[2], p.v_stride[2], p.sk - k0 - BK);
                fa1_cp_async_commit();
            }
        }
    }
    fa1_cp_async_wait<0>();  // nothing may be in flight when the block exits

    T* o = static_cast<T*>(p.o) + blk.b * p.o_stride[0] + blk.h * p.o_stride[1];
    bool bad = false;
#pragma unroll
    for (int r = 0; r < TM; ++r) {
        const int i = blk.q0 + ty + 16 * r;
        if (i >= p.sq) continue;
        const float inv = row_inv_l(l[r]);
#pragma unroll
        for (int g = 0; g < NG; ++g)
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
                const float x = acc[r][g * VEC + e] * inv;
                o[i * p.o_stride[2] + g * TX * VEC + tx * VEC + e] = from_f32<T>(x);
                bad |= !isfinite(x);
            }
        if (tx == 0 && p.lse != nullptr) p.lse[((i64)blk.b * p.hq + blk.h) * p.sq + i] = row_lse_log2(m[r], l[r]);
    }
    // NaN or inf under a masked key must not reach rows that do not see it (common.cuh).
    repair_nonfinite_rows<T>(p, blk.b, blk.h, blk.q0, SDPA_ONE_HEAD, min(BQ, p.sq - blk.q0), 0, p.dv, true, bad);
}

// The tiled variant's shape per element type and head dim, chosen by measurement on the H100 (dev/fa1_bench.py,
// dev/fa1_build_sets.sh, bench/results/gpu/fa1.md): TX threads per row group (NT = 16 TX threads), TM rows per
// thread, P aliasing the K tile (unused: slower), blocks per SM the registers must allow, inner-loop
// unrolling. With TX = 16: up to HD = 64, 64-row blocks two per SM (128 registers); up to 128, 128-row
// blocks with eight rows per thread, one per SM (238-255 registers); at 256, 64-row blocks (eight rows would
// need 298 KB of shared memory). NARROW (TX = 8, TM = 8: 8 x 8 scores per thread, 128 threads, two blocks
// per SM) for f32 at HD = 64: 28-32 TFLOPS against 27-29 with TX = 16. At HD = 128 it would run one block of
// four warps per SM (its 168 KB of shared memory) and reached only 20 TFLOPS; at HD = 96 and for f16/bf16
// at 128 it spills. src/kernels/fa1.rs mirrors NARROW, TX and TM for the launch.
template <typename T, int HD>
struct Fa1TiledChoice {
    static constexpr bool NARROW = sizeof(T) == 4 && (HD == 64);  // fa1-choice
    static constexpr int TX = NARROW ? 8 : 16;
    static constexpr int NT = 16 * TX;
    static constexpr int TM = NARROW ? 8 : (HD <= 64 || HD > 128 ? 4 : 8);
    static constexpr bool ALIAS = false;
    static constexpr int MINB = HD <= 64 ? 2 : 1;
    static constexpr int UNR = NARROW && HD > 64 ? 1 : 2;
};

// Entry macros, one entry per NVRTC program (src/kernels/fa1.rs writes the line a call needs):
// fa1_{dtype}_{HD} (fixed 4 x 4 per thread), fa1t_{dtype}_{HD} (register-tiled, the shape above) and the
// generic fa1_{dtype} for any head dims.
#define FA1_FIXED(NAME, T, HD)                                                                   \
    extern "C" __global__ void __launch_bounds__(FA1_THREADS) NAME(const AttnParams p) {       \
        fa1_fixed<T, HD>(p);                                                                     \
    }
#define FA1_TILED(NAME, T, HD)                                                                            \
    extern "C" __global__ void __launch_bounds__(Fa1TiledChoice<T, HD>::NT, Fa1TiledChoice<T, HD>::MINB)  \
        NAME(const AttnParams p) {                                                                        \
        using C = Fa1TiledChoice<T, HD>;                                                                  \
        fa1_tiled<T, HD, C::TM, C::ALIAS, C::UNR, C::TX>(p);                                              \
    }
#define FA1_GENERIC(NAME, T) \
    extern "C" __global__ void __launch_bounds__(FA1_THREADS) NAME(const AttnParams p) { fa1_generic<T>(p); }
