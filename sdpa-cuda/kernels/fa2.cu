// FlashAttention-2 forward on tensor cores (mma.sync m16n8k16, f16/bf16 in, f32 accumulate).
//
// Work split: one block per (query tile of BM rows, query head, batch). The query tile is split across
// NW warps, each owning BM/NW whole rows (MT m16 tiles), so the online softmax of a row lives in one warp's
// quad of threads and needs no shared-memory exchange. Every warp reads the whole K/V tile of BN keys.
//
// Pipeline per K/V tile: wait K[t] -> issue cp.async of V[t] -> S = Q·K^T (ldmatrix) -> mask, online
// softmax with exp2 and the scale folded in -> wait V[t] -> issue cp.async of K[t+1] -> O += P·V with P
// taken straight from the S accumulators (the C layout of two n8 tiles is the A layout of one k16 step)
// and V read by ldmatrix.trans. So the V load overlaps Q·K^T and softmax, the next K load overlaps P·V.
//
// Shared memory rows are padded by 16 bytes (an odd number of 16-byte chunks per row): the eight row
// addresses of every ldmatrix phase then fall in eight different bank groups, and so do cp.async stores.
//
// Causal masks: tiles wholly above the diagonal are never loaded (the loop stops at the last visible key of
// the tile's last row); only tiles that cross the diagonal, or the end of the keys, run the mask code.
#ifndef SDPA_FA2_MMA_CUH
#include "fa2_mma.cuh"
#endif

template <int D, int BM, int BN, int NW>
struct Fa2Tile {
    static constexpr int ROWS_PER_WARP = BM / NW;
    static constexpr int MT = ROWS_PER_WARP / 16;  // m16 tiles per warp
    static constexpr int LD = D + 8;               // padded row length in elements
    static constexpr int SMEM_ELEMS = (BM + 2 * BN) * LD;
    static_assert(ROWS_PER_WARP % 16 == 0, "each warp owns whole m16 tiles");
    static_assert(D % 16 == 0 && BN % 16 == 0, "k16 steps");
};

// Copies rows [0, rows) of a tile (row r at `base + r * stride`) into shared memory with LD-element rows;
// rows at or past `valid` are zero-filled so masked keys never meet garbage (0 * NaN would poison P·V).
template <typename T, int D, int ROWS, int THREADS>
__device__ __forceinline__ void fa2_load_tile(T* smem, const T* base, long long stride, int valid, int tid) {
    constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
    constexpr int LD = D + 8;
#pragma unroll
    for (int c = tid; c < ROWS * CHUNKS; c += THREADS) {
        int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        bool ok = r < valid;
        const T* src = ok ? base + r * stride + col : base;
        fa2_cp_async16(smem + r * LD + col, src, ok);
    }
}

template <typename T, int D, int BM, int BN, int NW, int MASK>
__device__ __forceinline__ void fa2_forward(const Fa2Params& p, T* smem) {
    using Tile = Fa2Tile<D, BM, BN, NW>;
    constexpr int MT = Tile::MT;
    constexpr int LD = Tile::LD;
    constexpr int THREADS = NW * 32;
    constexpr int NT = BN / 8;  // n8 tiles of S per m16 tile
    constexpr int DT = D / 8;   // n8 tiles of O per m16 tile

    T* sQ = smem;
    T* sK = sQ + BM * LD;
    T* sV = sK + BN * LD;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t4 = lane % 4;
    // Causal: the heaviest query tiles (last rows) are scheduled first to shorten the tail.
    const int m_block = (MASK == FA2_MASK_CAUSAL) ? (gridDim.x - 1 - blockIdx.x) : blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / p.group;
    const int m0 = m_block * BM;
    const int m_end = min(m0 + BM, p.sq);

    const T* q = static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh + (long long)m0 * p.q_ss;
    const T* k = static_cast<const T*>(p.k) + b * p.k_sb + kvh * p.k_sh;
    const T* v = static_cast<const T*>(p.v) + b * p.v_sb + kvh * p.v_sh;

    int n_keys = p.sk;
    if (MASK == FA2_MASK_CAUSAL) n_keys = max(0, min(p.sk, m_end + p.causal_off));
    const int n_tiles = (n_keys + BN - 1) / BN;

    fa2_load_tile<T, D, BM, THREADS>(sQ, q, p.q_ss, m_end - m0, tid);
    if (n_tiles > 0) fa2_load_tile<T, D, BN, THREADS>(sK, k, p.k_ss, p.sk, tid);
    fa2_cp_async_commit();

    float o[MT][DT][4];
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int j = 0; j < DT; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
        m[mt][0] = m[mt][1] = fa2_neg_inf();
        l[mt][0] = l[mt][1] = 0.f;
    }
    const int warp_row0 = warp * Tile::ROWS_PER_WARP;
    const float sl2 = p.scale_log2;

    for (int tile = 0; tile < n_tiles; ++tile) {
        const int n0 = tile * BN;
        fa2_cp_async_wait<0>();
        __syncthreads();  // K[tile] (and Q) landed for everyone; everyone is done with V[tile-1]
        fa2_load_tile<T, D, BN, THREADS>(sV, v + (long long)n0 * p.v_ss, p.v_ss, p.sk - n0, tid);
        fa2_cp_async_commit();

        // S = Q K^T for this warp's rows.
        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < NT; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            unsigned a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
                fa2_ldmatrix_x4(a[mt], sQ + (warp_row0 + mt * 16 + (lane % 16)) * LD + kk * 16 + (lane / 16) * 8);
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                unsigned bk[4];
                fa2_ldmatrix_x4(bk, sK + (np * 16 + (lane % 8) + (lane / 16) * 8) * LD + kk * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    Fa2Type<T>::mma(s[mt][2 * np], a[mt], bk[0], bk[1]);
                    Fa2Type<T>::mma(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
                }
            }
        }

        // Mask, then the online softmax update. For MASK_EXPLICIT the scores are scaled (log2 domain)
        // here; otherwise the scale is folded into the exp2 argument below.
        const bool edge = (n0 + BN > p.sk) ||
                          (MASK == FA2_MASK_CAUSAL && n0 + BN - 1 > m0 + p.causal_off) || MASK == FA2_MASK_EXPLICIT;
        if (edge) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int row = m0 + warp_row0 + mt * 16 + g + hh * 8;
                    const float* mrow = nullptr;
                    if (MASK == FA2_MASK_EXPLICIT)
                        mrow = p.mask + b * p.m_sb + h * p.m_sh + (long long)min(row, p.sq - 1) * p.m_sq;
#pragma unroll
                    for (int j = 0; j < NT; ++j)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int key = n0 + j * 8 + t4 * 2 + e;
                            float& x = s[mt][j][hh * 2 + e];
                            bool vis = key < p.sk;
                            if (MASK == FA2_MASK_CAUSAL) vis = vis && key <= row + p.causal_off;
                            if (MASK == FA2_MASK_EXPLICIT)
                                x = vis ? x * sl2 + mrow[key * p.m_sk] * FA2_LOG2E : fa2_neg_inf();
                            else if (!vis)
                                x = fa2_neg_inf();
                        }
                }
        }

#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                float mx = fa2_neg_inf();
#pragma unroll
                for (int j = 0; j < NT; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][hh * 2], s[mt][j][hh * 2 + 1]));
                mx = fa2_quad_max(mx);
                const float m_old = m[mt][hh];
                const float m_new = fmaxf(m_old, MASK == FA2_MASK_EXPLICIT ? mx : mx * sl2);
                // A row that has seen only masked keys keeps m = -inf; subtract 0 then, so exp2 gives 0.
                const float m_use = m_new == fa2_neg_inf() ? 0.f : m_new;
                const float alpha = fa2_exp2(m_old - m_use);
                m[mt][hh] = m_new;
                float sum = 0.f;
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float& x = s[mt][j][hh * 2 + e];
                        x = MASK == FA2_MASK_EXPLICIT ? fa2_exp2(x - m_use) : fa2_exp2(fmaf(x, sl2, -m_use));
                        sum += x;
                    }
                l[mt][hh] = l[mt][hh] * alpha + sum;  // per-thread partial; the quad is summed at the end
#pragma unroll
                for (int j = 0; j < DT; ++j) {
                    o[mt][j][hh * 2] *= alpha;
                    o[mt][j][hh * 2 + 1] *= alpha;
                }
            }

        fa2_cp_async_wait<0>();
        __syncthreads();  // V[tile] landed; everyone is done reading K[tile]
        if (tile + 1 < n_tiles) {
            const int n1 = n0 + BN;
            fa2_load_tile<T, D, BN, THREADS>(sK, k + (long long)n1 * p.k_ss, p.k_ss, p.sk - n1, tid);
        }
        fa2_cp_async_commit();

        // O += P V, P from registers.
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
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
                fa2_ldmatrix_x4_trans(bv, sV + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + dp * 16 + (lane / 16) * 8);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    Fa2Type<T>::mma(o[mt][2 * dp], a[mt], bv[0], bv[1]);
                    Fa2Type<T>::mma(o[mt][2 * dp + 1], a[mt], bv[2], bv[3]);
                }
            }
        }
    }

    // Epilogue: normalise, stage this warp's rows in its own part of sQ, then 16-byte coalesced stores.
    fa2_cp_async_wait<0>();
    __syncthreads();  // no cp.async into sQ may still be in flight (n_tiles == 0 skips the loop)
    T* sO = sQ + warp_row0 * LD;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const float lsum = fa2_quad_sum(l[mt][hh]);
            // NaN stays NaN (NaN == 0 is false); a row that saw no key is zeros with LSE -inf.
            const float inv = lsum == 0.f ? 0.f : 1.f / lsum;
            const int r = mt * 16 + g + hh * 8;
#pragma unroll
            for (int j = 0; j < DT; ++j)
                *reinterpret_cast<unsigned*>(sO + r * LD + j * 8 + t4 * 2) =
                    Fa2Type<T>::pack(o[mt][j][hh * 2] * inv, o[mt][j][hh * 2 + 1] * inv);
            const int row = m0 + warp_row0 + r;
            if (p.lse != nullptr && t4 == 0 && row < p.sq) {
                const float lse = lsum == 0.f ? fa2_neg_inf() : (m[mt][hh] + __log2f(lsum)) * FA2_LN2;
                p.lse[((long long)b * p.hq + h) * p.sq + row] = lse;
            }
        }
    __syncwarp();
    T* out = static_cast<T*>(p.o) + b * p.o_sb + h * p.o_sh;
    constexpr int CHUNKS = D / 8;
#pragma unroll
    for (int c = lane; c < Tile::ROWS_PER_WARP * CHUNKS; c += 32) {
        const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        const int row = m0 + warp_row0 + r;
        if (row < p.sq)
            *reinterpret_cast<uint4*>(out + (long long)row * p.o_ss + col) =
                *reinterpret_cast<const uint4*>(sO + r * LD + col);
    }
}

// Entry points: fa2_{dtype}_{D}_{mask}, tile sizes per head dim chosen by measurement on the H100
// (sdpa-cuda/dev/fa2_bench.py). The Rust launcher mirrors FA2_TILE_* below.
#define FA2_ENTRY(NAME, T, D, BM, BN, NW, MINB, MASK)                                                  \
    extern "C" __global__ void __launch_bounds__(NW * 32, MINB) NAME(const Fa2Params p) {             \
        extern __shared__ __align__(16) unsigned char fa2_smem[];                                     \
        fa2_forward<T, D, BM, BN, NW, MASK>(p, reinterpret_cast<T*>(fa2_smem));                       \
    }

#ifndef FA2_NO_ENTRIES
#define FA2_ENTRIES_FOR(TNAME, T, D, BM, BN, NW, MINB)                                                 \
    FA2_ENTRY(fa2_##TNAME##_##D##_none, T, D, BM, BN, NW, MINB, FA2_MASK_NONE)                         \
    FA2_ENTRY(fa2_##TNAME##_##D##_causal, T, D, BM, BN, NW, MINB, FA2_MASK_CAUSAL)                     \
    FA2_ENTRY(fa2_##TNAME##_##D##_explicit, T, D, BM, BN, NW, MINB, FA2_MASK_EXPLICIT)
#define FA2_ENTRIES_DTYPE(TNAME, T)                                                                    \
    FA2_ENTRIES_FOR(TNAME, T, 64, 128, 64, 4, 2)                                                       \
    FA2_ENTRIES_FOR(TNAME, T, 96, 128, 64, 4, 2)                                                       \
    FA2_ENTRIES_FOR(TNAME, T, 128, 128, 64, 4, 2)                                                      \
    FA2_ENTRIES_FOR(TNAME, T, 256, 128, 64, 8, 1)
FA2_ENTRIES_DTYPE(f16, __half)
FA2_ENTRIES_DTYPE(bf16, __nv_bfloat16)
#endif
