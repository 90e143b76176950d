// Split-KV (flash-decoding) forward on tensor cores, and the combine kernel that merges its partials.
//
// When B·Hq·ceil(Sq/BM) blocks cannot fill the GPU (one new token, small batch, long context), the keys
// are split instead: every warp is one split. A warp owns a 16-row tile of the rows that share one kv head,
// packed group-major (row r = g·Sq + i is query i of head kvh·group + g), so GQA heads read their K/V once,
// and it streams its own key range through a private STAGES-deep cp.async ring of KS-key K/V tiles. There
// is no block-wide barrier at all: warps are independent, a block only groups NW splits of one row tile.
// Each warp writes a normalised partial output and its LSE; `splitkv_combine` merges the partials of a
// row with exactly sdpa-core's `merge_normalized` rule.
#include "fa2_mma.cuh"

template <int D, int STAGES, int KS>
struct SplitKvTile {
    static constexpr int LD = D + 8;                                // padded row, elements
    static constexpr int WARP_ELEMS = (16 + 2 * STAGES * KS) * LD;  // Q tile + K/V ring, per warp
    static_assert(KS % 16 == 0, "keys per step are whole k16 steps of P·V");
};

// Rows of this warp's tile: r in [r0, r0 + 16) of the group's G·Sq packed rows.
__device__ __forceinline__ void splitkv_row(const AttnParams& p, int r, int& hq, int& i) {
    const int g = r / p.sq;
    i = r - g * p.sq;
    hq = (blockIdx.y / ((p.group * p.sq + 15) / 16)) * p.group + g;
}

template <typename T, int D, int NW, int STAGES, int KS, int MASK>
__device__ __forceinline__ void splitkv_forward(const AttnParams& p, T* smem) {
    using Tile = SplitKvTile<D, STAGES, KS>;
    constexpr int NT = KS / 8;  // n8 tiles of S per step
    constexpr int LD = Tile::LD;
    constexpr int DT = D / 8;
    constexpr int CHUNKS = D / 8;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t4 = lane % 4;
    fa2_launch_dependents();  // the combine pass may be scheduled now; it waits for this grid's writes
    const int split = blockIdx.x * NW + warp;
    if (split >= p.num_splits) return;  // no block barriers below: idle warps may leave
    const int m_tiles = (p.group * p.sq + 15) / 16;
    const int kvh = blockIdx.y / m_tiles, r0 = (blockIdx.y % m_tiles) * 16;
    const int b = blockIdx.z;
    const int rows = p.group * p.sq;

    // This warp's shared memory: Q [16][LD], then STAGES x (K [KS][LD], V [KS][LD]).
    const unsigned sQ = fa2_smem_addr(smem + warp * Tile::WARP_ELEMS);
    const unsigned sKV = sQ + 16 * LD * 2;
    constexpr unsigned TILE_BYTES = KS * LD * 2;
    const unsigned q_ld = sQ + ((lane % 16) * LD + (lane / 16) * 8) * 2;
    const unsigned k_ld = sKV + (((lane % 8) + (lane / 16) * 8) * LD + ((lane / 8) % 2) * 8) * 2;
    const unsigned v_ld = sKV + TILE_BYTES + (((lane % 8) + ((lane / 8) % 2) * 8) * LD + (lane / 16) * 8) * 2;

    // Key range of this split, cut at the last key any row of the tile can see.
    int key_end = p.sk;
    if (MASK == FA2_MASK_CAUSAL) {
        int max_i = 0;
        for (int r = r0; r < min(r0 + 16, rows); ++r) max_i = max(max_i, r % p.sq);
        key_end = max(0, min(p.sk, max_i + 1 + p.causal_offset));
    }
    const int k_begin = split * p.extra;
    const int k_stop = min(key_end, k_begin + p.extra);
    const int n_steps = k_stop > k_begin ? (k_stop - k_begin + KS - 1) / KS : 0;

    const T* kbase = static_cast<const T*>(p.k) + b * p.k_stride[0] + kvh * p.k_stride[1];
    const T* vbase = static_cast<const T*>(p.v) + b * p.v_stride[0] + kvh * p.v_stride[1];

    // Q tile: 16 packed rows, zero rows past the group.
    for (int c = lane; c < 16 * CHUNKS; c += 32) {
        const int rr = c / CHUNKS, col = (c % CHUNKS) * 8, r = r0 + rr;
        int hq = 0, i = 0;
        const bool ok = r < rows;
        if (ok) splitkv_row(p, r, hq, i);
        const T* src = static_cast<const T*>(p.q) + b * p.q_stride[0] + hq * p.q_stride[1] + (long long)i * p.q_stride[2] + col;
        fa2_cp_async16(sQ + (rr * LD + col) * 2, ok ? src : static_cast<const T*>(p.q), ok);
    }
    auto load_step = [&](int step) {
        const unsigned sK = sKV + (step % STAGES) * 2 * TILE_BYTES;
        const unsigned sV = sK + TILE_BYTES;
        const int key0 = k_begin + step * KS;
#pragma unroll
        for (int c = lane; c < KS * CHUNKS; c += 32) {
            const int rr = c / CHUNKS, col = (c % CHUNKS) * 8, key = key0 + rr;
            const bool ok = key < k_stop;
            const long long kk = ok ? key : 0;
            fa2_cp_async16_stream(sK + (rr * LD + col) * 2, kbase + kk * p.k_stride[2] + col, ok);
            fa2_cp_async16_stream(sV + (rr * LD + col) * 2, vbase + kk * p.v_stride[2] + col, ok);
        }
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < n_steps) load_step(s);
        fa2_cp_async_commit();
    }

    float o[DT][4];
#pragma unroll
    for (int j = 0; j < DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m[2] = {fa2_neg_inf(), fa2_neg_inf()}, l[2] = {0.f, 0.f};
    int row_i[2], row_h[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = min(r0 + g + hh * 8, rows - 1);
        splitkv_row(p, r, row_h[hh], row_i[hh]);
    }
    const float sl2 = p.scale_log2;

    for (int step = 0; step < n_steps; ++step) {
        fa2_cp_async_wait<STAGES - 2>();
        __syncwarp();  // step's tile landed for every lane; every lane is done with step - 1's buffer
        if (step + STAGES - 1 < n_steps) load_step(step + STAGES - 1);
        fa2_cp_async_commit();
        const unsigned buf = (step % STAGES) * 2 * TILE_BYTES;
        const int key0 = k_begin + step * KS;

        float s[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            unsigned a[4];
            fa2_ldmatrix_x4(a, q_ld + kk * 32);
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                unsigned bk[4];
                fa2_ldmatrix_x4(bk, k_ld + buf + (np * 16 * LD + kk * 16) * 2);
                Fa2Type<T>::mma(s[2 * np], a, bk[0], bk[1]);
                Fa2Type<T>::mma(s[2 * np + 1], a, bk[2], bk[3]);
            }
        }

        const bool edge = key0 + KS > k_stop || MASK != FA2_MASK_NONE;
        if (edge) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const float* mrow = nullptr;
                if (MASK == FA2_MASK_EXPLICIT)
                    mrow = p.mask + b * p.mask_stride[0] + row_h[hh] * p.mask_stride[1] + (long long)row_i[hh] * p.mask_stride[2];
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int key = key0 + j * 8 + t4 * 2 + e;
                        float& x = s[j][hh * 2 + e];
                        bool vis = key < k_stop;
                        if (MASK == FA2_MASK_CAUSAL) vis = vis && key <= row_i[hh] + p.causal_offset;
                        if (MASK == FA2_MASK_EXPLICIT)
                            x = vis ? x * sl2 + mrow[key * p.mask_stride[3]] * FA2_LOG2E : fa2_neg_inf();
                        else if (!vis)
                            x = fa2_neg_inf();
                    }
            }
        }

#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            float mx = fa2_neg_inf();
#pragma unroll
            for (int j = 0; j < NT; ++j) mx = fmaxf(mx, fmaxf(s[j][hh * 2], s[j][hh * 2 + 1]));
            mx = fa2_quad_max(mx);
            const float m_new = fmaxf(m[hh], MASK == FA2_MASK_EXPLICIT ? mx : mx * sl2);
            const float m_use = m_new == fa2_neg_inf() ? 0.f : m_new;
            const float alpha = fa2_exp2(m[hh] - m_use);
            m[hh] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& x = s[j][hh * 2 + e];
                    x = MASK == FA2_MASK_EXPLICIT ? fa2_exp2(x - m_use) : fa2_exp2(fmaf(x, sl2, -m_use));
                    sum += x;
                }
            l[hh] = l[hh] * alpha + sum;
#pragma unroll
            for (int j = 0; j < DT; ++j) {
                o[j][hh * 2] *= alpha;
                o[j][hh * 2 + 1] *= alpha;
            }
        }

#pragma unroll
        for (int kk = 0; kk < KS / 16; ++kk) {
            unsigned a[4];
            a[0] = Fa2Type<T>::pack(s[2 * kk][0], s[2 * kk][1]);
            a[1] = Fa2Type<T>::pack(s[2 * kk][2], s[2 * kk][3]);
            a[2] = Fa2Type<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            a[3] = Fa2Type<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
            for (int dp = 0; dp < DT / 2; ++dp) {
                unsigned bv[4];
                fa2_ldmatrix_x4_trans(bv, v_ld + buf + (kk * 16 * LD + dp * 16) * 2);
                Fa2Type<T>::mma(o[2 * dp], a, bv[0], bv[1]);
                Fa2Type<T>::mma(o[2 * dp + 1], a, bv[2], bv[3]);
            }
        }
    }
    fa2_cp_async_wait<0>();

    // Partial (normalised output, LSE) per row; rows are indexed like the LSE output, [B, Hq, Sq].
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = r0 + g + hh * 8;
        const float lsum = fa2_quad_sum(l[hh]);
        if (r >= rows) continue;
        const float inv = lsum == 0.f ? 0.f : 1.f / lsum;
        const long long row = ((long long)b * p.hq + row_h[hh]) * p.sq + row_i[hh];
        const long long slot = row * p.num_splits + split;
        float* po = fa2_part_o(p) + slot * D;
#pragma unroll
        for (int j = 0; j < DT; ++j)
            *reinterpret_cast<float2*>(po + j * 8 + t4 * 2) = make_float2(o[j][hh * 2] * inv, o[j][hh * 2 + 1] * inv);
        if (t4 == 0) fa2_part_lse(p)[slot] = lsum == 0.f ? fa2_neg_inf() : (m[hh] + __log2f(lsum)) * FA2_LN2;
    }
}

// Merges the n_splits partials of each row: m = max LSE; any NaN LSE -> NaN row; m = -inf -> zeros and
// -inf; else w_s = e^(lse_s - m), O = Σ w_s·O_s / Σ w_s, LSE = m + ln Σ w_s (sdpa_core::softmax::
// merge_normalized). One block of NWARP warps per row: each warp sums every NWARP-th split (lanes over
// the head dim, so loads are coalesced, and unrolled so that a warp's loads are all in flight at once),
// then the warp sums meet in shared memory.
template <typename T, int D, int NWARP>
__device__ __forceinline__ void splitkv_combine_row(const AttnParams& p) {
    constexpr int PER_LANE = (D + 31) / 32;
    __shared__ float s_acc[NWARP][D];
    __shared__ float s_total[NWARP];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const long long row = blockIdx.x;
    fa2_wait_primary();  // launched dependent on the split kernel: its partials must be complete
    const float* lse = fa2_part_lse(p) + row * p.num_splits;
    float mx = fa2_neg_inf();
    bool nan = false;
    for (int s = lane; s < p.num_splits; s += 32) {
        const float x = lse[s];
        nan |= x != x;
        mx = fmaxf(mx, x);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    nan = __any_sync(0xffffffffu, nan);

    float acc[PER_LANE];
#pragma unroll
    for (int c = 0; c < PER_LANE; ++c) acc[c] = 0.f;
    float total = 0.f;
    const bool live = !nan && mx != fa2_neg_inf();
    if (live) {
        const float* po = fa2_part_o(p) + row * p.num_splits * D;
#pragma unroll 8
        for (int s = warp; s < p.num_splits; s += NWARP) {
            const float w = expf(lse[s] - mx);
            total += w;
#pragma unroll
            for (int c = 0; c < PER_LANE; ++c)
                if (c * 32 + lane < D) acc[c] += w * po[(long long)s * D + c * 32 + lane];
        }
    }
#pragma unroll
    for (int c = 0; c < PER_LANE; ++c)
        if (c * 32 + lane < D) s_acc[warp][c * 32 + lane] = acc[c];
    if (lane == 0) s_total[warp] = total;
    __syncthreads();

    const int i = (int)(row % p.sq);
    const long long bh = row / p.sq;
    const int h = (int)(bh % p.hq), b = (int)(bh / p.hq);
    T* out = static_cast<T*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1] + (long long)i * p.o_stride[2];
    float sum_w = 0.f;
#pragma unroll
    for (int w = 0; w < NWARP; ++w) sum_w += s_total[w];
    const float qnan = __int_as_float(0x7fffffff);
    for (int d = threadIdx.x; d < D; d += NWARP * 32) {
        float x = 0.f;
        if (nan) {
            x = qnan;
        } else if (live) {
#pragma unroll
            for (int w = 0; w < NWARP; ++w) x += s_acc[w][d];
            x *= 1.f / sum_w;
        }
        out[d] = T(x);
    }
    if (p.lse != nullptr && threadIdx.x == 0)
        p.lse[row] = nan ? qnan : (live ? mx + logf(sum_w) : fa2_neg_inf());
}

#define SPLITKV_ENTRY(NAME, T, D, NW, STAGES, KS, MASK)                                                \
    extern "C" __global__ void __launch_bounds__(NW * 32) NAME(const AttnParams p) {                   \
        extern __shared__ __align__(16) unsigned char splitkv_smem[];                                 \
        splitkv_forward<T, D, NW, STAGES, KS, MASK>(p, reinterpret_cast<T*>(splitkv_smem));           \
    }
// Warps of the combine kernel (src/splitkv.rs launches SPLITKV_COMBINE_WARPS * 32 threads per row).
#define SPLITKV_COMBINE_WARPS 8
#define SPLITKV_COMBINE_ENTRY(NAME, T, D)                                                              \
    extern "C" __global__ void __launch_bounds__(SPLITKV_COMBINE_WARPS * 32) NAME(const AttnParams p) {          \
        splitkv_combine_row<T, D, SPLITKV_COMBINE_WARPS>(p);                                          \
    }


// Entry points splitkv_{dtype}_{D}_{mask} (NW warps = splits per block, STAGES-deep ring, KS keys per
// step; chosen on the H100, mirrored by src/splitkv.rs) and splitkv_combine_{dtype}_{D}.
#ifndef SPLITKV_NO_ENTRIES
#define SPLITKV_ENTRIES_FOR(TNAME, T, D, NW, STAGES, KS)                                               \
    SPLITKV_ENTRY(splitkv_##TNAME##_##D##_none, T, D, NW, STAGES, KS, FA2_MASK_NONE)                   \
    SPLITKV_ENTRY(splitkv_##TNAME##_##D##_causal, T, D, NW, STAGES, KS, FA2_MASK_CAUSAL)               \
    SPLITKV_ENTRY(splitkv_##TNAME##_##D##_explicit, T, D, NW, STAGES, KS, FA2_MASK_EXPLICIT)           \
    SPLITKV_COMBINE_ENTRY(splitkv_combine_##TNAME##_##D, T, D)
#define SPLITKV_ENTRIES_DTYPE(TNAME, T)                                                                \
    SPLITKV_ENTRIES_FOR(TNAME, T, 64, 4, 2, 32)                                                        \
    SPLITKV_ENTRIES_FOR(TNAME, T, 96, 4, 2, 32)                                                        \
    SPLITKV_ENTRIES_FOR(TNAME, T, 128, 4, 2, 32)                                                       \
    SPLITKV_ENTRIES_FOR(TNAME, T, 256, 4, 2, 16)
SPLITKV_ENTRIES_DTYPE(f16, __half)
SPLITKV_ENTRIES_DTYPE(bf16, __nv_bfloat16)
#endif
