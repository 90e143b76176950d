// FlashAttention-1 forward on tensor cores for f16/bf16 (mma.sync m16n8k16, f32 accumulation): `fa1m`.
//
// FA-1's work split, not FA-2's: one block per (query tile of BM rows, query head, batch) and a sequential
// loop over K/V tiles of BN keys staged in shared memory, as in fa1.cu; inside a block the warps split the
// KEYS of every K/V tile ("split-K"): warp (wm, wn) computes S = Q·Kᵀ, the online softmax and O += P·V for
// query rows wm·BM/WM .. and keys wn·BN/WN .. of each tile. So a warp's running max m, sum l and output O
// are partial: they cover only its share of the keys, and the WN warps of a row group must be combined.
//
// Where the combine happens: once, after the loop. Each warp keeps its own running (m, l, O) over all the
// tiles and the WN partial states of a row are merged at the end through shared memory with the
// split-softmax rule (sdpa-core's `merge_normalized`, unnormalised form): M = max m_w,
// L = Σ l_w·2^(m_w−M), O = Σ O_w·2^(m_w−M) / L. The FA-1 paper instead combines after every tile; that
// costs WN·BM·D f32 of shared-memory traffic per tile (64 KB in + out at BM = 64, D = 128, WN = 4: more
// shared-memory cycles than the tile's tensor-core work), while the final merge costs the same once per
// block. Register budget and measurement decide WM: a warp's partial O is (BM/WM)·D f32, so a pure key split
// (WM = 1) fits only with small blocks (64 rows at D = 64: 128 accumulators per thread, 244 registers) and
// not at D = 128. On the H100 the pure split at D = 64 (64 x 64 tiles, 1 x 4 warps) reached 148-182 TFLOPS;
// 128-row blocks with 4 row groups x 2 key groups reached 206-255 (bench/results/gpu/fa1.md), so both head dims
// ship WM = 4, WN = 2: every K/V tile is still split between two warps per row group.
//
// Pipeline: STAGES = 2 double-buffers K and V with cp.async, so tile t+1 loads while tile t is computed
// (one barrier per tile). Fragments come from padded shared memory (rows 16 bytes longer, so the eight
// row addresses of each ldmatrix phase hit distinct bank groups) via ldmatrix, transposed for V; P stays in
// registers (the C layout of two n8 accumulators is the A layout of one k16 step); exp2 with the scale
// folded in. Causal tiles wholly above the diagonal are never loaded; only tiles that cross it (or the
// end of the keys) run mask code. The tile loader, Q·Kᵀ, masking, the online-softmax update and P·V are
// fa2's (fa2_mma.cuh); what is fa1m's own is the warp split over keys and the merge after the loop.
#include "fa2_mma.cuh"

template <int D, int BM, int BN, int WM, int WN, int STAGES>
struct Fa1MmaTile {
    static constexpr int NW = WM * WN;
    static constexpr int THREADS = NW * 32;
    static constexpr int ROWS_PER_WARP = BM / WM;
    static constexpr int KEYS_PER_WARP = BN / WN;
    static constexpr int MT = ROWS_PER_WARP / 16;  // m16 tiles per warp
    static constexpr int NT = KEYS_PER_WARP / 8;   // n8 tiles of S per m16 tile
    static constexpr int DT = D / 8;               // n8 tiles of O per m16 tile
    static constexpr int LD = D + 8;               // padded smem row, elements
    static constexpr int LDO = D + 4;              // padded f32 merge row, floats
    static constexpr int LOOP_BYTES = (BM + 2 * STAGES * BN) * LD * 2;
    static constexpr int MERGE_BYTES = (2 * WN * BM + BM * LDO) * 4;
    static constexpr int SMEM_BYTES = LOOP_BYTES > MERGE_BYTES ? LOOP_BYTES : MERGE_BYTES;
    static_assert(ROWS_PER_WARP % 16 == 0, "each warp owns whole m16 tiles");
    static_assert(KEYS_PER_WARP % 16 == 0, "each warp owns whole k16 steps of P·V");
    static_assert(D % 16 == 0, "k16 steps of Q·Kᵀ");
    static_assert(STAGES == 1 || STAGES == 2, "single or double buffered K/V");
};

template <typename T, int D, int BM, int BN, int WM, int WN, int STAGES, int MASK, int VAR = 0>
__device__ __forceinline__ void fa1m_forward(const AttnParams& p, unsigned char* smem_raw) {
    using Tile = Fa1MmaTile<D, BM, BN, WM, WN, STAGES>;
    constexpr int MT = Tile::MT, NT = Tile::NT, DT = Tile::DT, LD = Tile::LD;
    constexpr int THREADS = Tile::THREADS;
    constexpr unsigned KV_BYTES = BN * LD * 2;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int wm = warp % WM, wn = warp / WM;
    // Causal: the heaviest query tiles (last rows) start first to shorten the tail.
    const int m_block = (MASK == FA2_MASK_CAUSAL || VAR != 0) ? (gridDim.x - 1 - blockIdx.x) : blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z;
    const int kvh = h / p.group;
    const int m0 = m_block * BM;
    const int m_end = min(m0 + BM, p.sq);
    const int warp_row0 = wm * Tile::ROWS_PER_WARP;
    const int warp_key0 = wn * Tile::KEYS_PER_WARP;

    // Shared memory during the loop: Q [BM][LD], then STAGES x K [BN][LD], then STAGES x V [BN][LD].
    const unsigned sQ = smem_addr(smem_raw);
    const unsigned sK = sQ + BM * LD * 2;
    const unsigned sV = sK + STAGES * KV_BYTES;
    const unsigned q_ld = sQ + ((warp_row0 + (lane % 16)) * LD + (lane / 16) * 8) * 2;
    const unsigned k_ld = sK + ((warp_key0 + (lane % 8) + (lane / 16) * 8) * LD + ((lane / 8) % 2) * 8) * 2;
    const unsigned v_ld = sV + ((warp_key0 + (lane % 8) + ((lane / 8) % 2) * 8) * LD + (lane / 16) * 8) * 2;

    const T* q = static_cast<const T*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1] + (long long)m0 * p.q_stride[2];
    const T* k = static_cast<const T*>(p.k) + b * p.k_stride[0] + kvh * p.k_stride[1];
    const T* v = static_cast<const T*>(p.v) + b * p.v_stride[0] + kvh * p.v_stride[1];

    int t0, n_tiles;
    fa2_key_tiles<MASK, VAR, BN>(p, m0, m_end, t0, n_tiles);

    fa2_load_tile<T, D, BM, THREADS>(sQ, q, p.q_stride[2], m_end - m0, tid);
    if (n_tiles > 0) {
        const int n1 = t0 * BN;
        fa2_load_tile<T, D, BN, THREADS>(sK, k + (long long)n1 * p.k_stride[2], p.k_stride[2], p.sk - n1, tid);
        fa2_load_tile<T, D, BN, THREADS>(sV, v + (long long)n1 * p.v_stride[2], p.v_stride[2], p.sk - n1, tid);
    }
    fa2_cp_async_commit();

    float o[MT][DT][4];
    float m[MT][2], l[MT][2];
    fa2_init_state(o, m, l);
    const float sl2 = p.scale_log2;
    const float a2 = fa2_alibi_log2<VAR>(p, h);

    for (int tile = 0; tile < n_tiles; ++tile) {
        const int n0 = (t0 + tile) * BN;
        const unsigned buf = STAGES == 2 ? (tile & 1) * KV_BYTES : 0u;
        fa2_cp_async_wait<0>();
        __syncthreads();  // this tile's K and V (and Q) landed; everyone is done with the other buffer
        if (tile + 1 < n_tiles) {
            const int n1 = n0 + BN;
            const unsigned nb = STAGES == 2 ? ((tile + 1) & 1) * KV_BYTES : 0u;
            if (STAGES == 2) {
                fa2_load_tile<T, D, BN, THREADS>(sK + nb, k + (long long)n1 * p.k_stride[2], p.k_stride[2], p.sk - n1, tid);
                fa2_load_tile<T, D, BN, THREADS>(sV + nb, v + (long long)n1 * p.v_stride[2], p.v_stride[2], p.sk - n1, tid);
            }
        }
        fa2_cp_async_commit();

        // S = Q K^T for this warp's rows and its share of the tile's keys; mask (only tiles that cross the end
        // of the keys or the diagonal, or explicit masks); this warp's online softmax update over its keys;
        // O_w += P_w V_w with P from registers.
        float s[MT][NT][4];
        fa2_qk<T, D, LD, MT, NT>(s, q_ld, k_ld + buf);
        if constexpr (VAR == 0) {
            if (fa2_tile_needs_mask<MASK, BN>(p, n0, m0)) fa2_mask_scores<MASK, MT, NT>(s, p, b, h, m0 + warp_row0, n0 + warp_key0, sl2, g, t4);
            fa2_softmax_update<MASK, MT, NT, DT>(s, m, l, o, sl2);
        } else {
            const bool edge = fa2_tile_crosses_band<BN>(p, n0, p.sk, m0, m_end - 1);
            if (edge || Fa2Scaled<MASK, VAR>::PRE)
                fa2_variant_scores<MASK, VAR, MT, NT>(s, p, b, h, m0 + warp_row0, n0 + warp_key0, sl2, a2, g, t4, edge);
            fa2_softmax_update<Fa2Scaled<MASK, VAR>::UPDATE, MT, NT, DT>(s, m, l, o, sl2);
        }
        fa2_pv<T, LD, MT, NT, DT>(o, s, v_ld + buf);
        if (STAGES == 1 && tile + 1 < n_tiles) {
            __syncthreads();  // everyone is done with K[tile] and V[tile]: the single buffer is reused
            const int n1 = n0 + BN;
            fa2_load_tile<T, D, BN, THREADS>(sK, k + (long long)n1 * p.k_stride[2], p.k_stride[2], p.sk - n1, tid);
            fa2_load_tile<T, D, BN, THREADS>(sV, v + (long long)n1 * p.v_stride[2], p.v_stride[2], p.sk - n1, tid);
            fa2_cp_async_commit();
        }
    }

    // Merge the WN partial states of every row through shared memory (the loop's buffers are reused):
    // per (key group, row) m_w and l_w, then one f32 [BM][LDO] sum of the rescaled partial outputs.
    fa2_cp_async_wait<0>();
    __syncthreads();  // no cp.async in flight (n_tiles == 0 skips the loop); everyone is done with K/V
    float* sm_m = reinterpret_cast<float*>(smem_raw);  // [WN][BM]
    float* sm_l = sm_m + WN * BM;                      // [WN][BM]
    float* sO = sm_l + WN * BM;                        // [BM][LDO]
    constexpr int LDO = Tile::LDO;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            l[mt][hh] = quad_sum(l[mt][hh]);
            const int r = warp_row0 + mt * 16 + g + hh * 8;
            if (t4 == 0) {
                sm_m[wn * BM + r] = m[mt][hh];
                sm_l[wn * BM + r] = l[mt][hh];
            }
        }
    __syncthreads();
    float inv_l[MT][2], m_row[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int r = warp_row0 + mt * 16 + g + hh * 8;
            float mx = fa2_neg_inf();
#pragma unroll
            for (int w = 0; w < WN; ++w) mx = fmaxf(mx, sm_m[w * BM + r]);
            const float m_use = mx == fa2_neg_inf() ? 0.f : mx;  // no key seen: every factor is 2^-inf = 0
            float lsum = 0.f;
#pragma unroll
            for (int w = 0; w < WN; ++w) lsum += sm_l[w * BM + r] * fast_exp2(sm_m[w * BM + r] - m_use);
            const float f = fast_exp2(m[mt][hh] - m_use);
            // NaN stays NaN (NaN == 0 is false); a row that saw no key is zeros with LSE -inf.
            inv_l[mt][hh] = lsum == 0.f ? 0.f : 1.f / lsum;
            m_row[mt][hh] = lsum == 0.f ? fa2_neg_inf() : (mx + __log2f(lsum)) * FA2_LN2;  // the row's LSE
#pragma unroll
            for (int j = 0; j < DT; ++j) {
                o[mt][j][hh * 2] *= f;
                o[mt][j][hh * 2 + 1] *= f;
            }
        }
    // Key groups 1..WN-1 add their rescaled O into sO one after another; group 0 adds sO to its registers.
#pragma unroll
    for (int w = 1; w < WN; ++w) {
        if (wn == w) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    float* row = sO + (warp_row0 + mt * 16 + g + hh * 8) * LDO + t4 * 2;
#pragma unroll
                    for (int j = 0; j < DT; ++j) {
                        float2 x = make_float2(o[mt][j][hh * 2], o[mt][j][hh * 2 + 1]);
                        if (w > 1) {
                            const float2 y = *reinterpret_cast<const float2*>(row + j * 8);
                            x.x += y.x;
                            x.y += y.y;
                        }
                        *reinterpret_cast<float2*>(row + j * 8) = x;
                    }
                }
        }
        __syncthreads();
    }
    bool bad = false;
    if (wn == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int r = warp_row0 + mt * 16 + g + hh * 8;
                float* row = sO + r * LDO + t4 * 2;
#pragma unroll
                for (int j = 0; j < DT; ++j) {
                    float2 x = make_float2(o[mt][j][hh * 2], o[mt][j][hh * 2 + 1]);
                    if (WN > 1) {
                        const float2 y = *reinterpret_cast<const float2*>(row + j * 8);
                        x.x += y.x;
                        x.y += y.y;
                    }
                    x.x *= inv_l[mt][hh];
                    x.y *= inv_l[mt][hh];
                    bad |= !isfinite(x.x) || !isfinite(x.y);
                    *reinterpret_cast<float2*>(row + j * 8) = x;
                }
                if (p.lse != nullptr && t4 == 0 && m0 + r < p.sq)
                    p.lse[((long long)b * p.hq + h) * p.sq + m0 + r] = m_row[mt][hh];
            }
    }
    __syncthreads();  // the normalised rows are in sO
    // Coalesced 16-byte stores of the block's rows, converted from f32.
    T* out = static_cast<T*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
    constexpr int CHUNKS = D / 8;
    for (int c = tid; c < BM * CHUNKS; c += THREADS) {
        const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        const int row = m0 + r;
        if (row < p.sq) {
            const float4 x0 = *reinterpret_cast<const float4*>(sO + r * LDO + col);
            const float4 x1 = *reinterpret_cast<const float4*>(sO + r * LDO + col + 4);
            uint4 packed;
            packed.x = Fa2Type<T>::pack(x0.x, x0.y);
            packed.y = Fa2Type<T>::pack(x0.z, x0.w);
            packed.z = Fa2Type<T>::pack(x1.x, x1.y);
            packed.w = Fa2Type<T>::pack(x1.z, x1.w);
            *reinterpret_cast<uint4*>(out + (long long)row * p.o_stride[2] + col) = packed;
        }
    }
    // NaN or inf under a masked key must not reach rows that do not see it (common.cuh).
    repair_nonfinite_rows<T>(p, b, h, m0, SDPA_ONE_HEAD, m_end - m0, 0, p.dv, true, bad);
}

// One entry point per NVRTC program: NAME for element type T, head dim D, a tile (BM query rows, BN keys
// per K/V tile, WM x WN warps (row groups x key groups), K/V stages, min blocks per SM) and mask MASK; the
// launcher (src/kernels/fa1.rs, `mma_tile_for`; bench/results/gpu/fa1.md says how the tiles were chosen)
// writes the instantiation a call needs.
#define FA1M_ENTRY(NAME, T, D, BM, BN, WM, WN, ST, MINB, MASK)                                        \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32, MINB) NAME(const AttnParams p) {     \
        extern __shared__ __align__(16) unsigned char fa1m_smem[];                                  \
        fa1m_forward<T, D, BM, BN, WM, WN, ST, MASK>(p, fa1m_smem);                                 \
    }
// Variant instantiations (issue 22): VAR a bit set of FA2_VAR_* (fa2_mma.cuh), MASK none or explicit.
#define FA1M_ENTRY_VAR(NAME, T, D, BM, BN, WM, WN, ST, MINB, MASK, VAR)                               \
    extern "C" __global__ void __launch_bounds__(WM * WN * 32, MINB) NAME(const AttnParams p) {     \
        extern __shared__ __align__(16) unsigned char fa1m_smem[];                                  \
        fa1m_forward<T, D, BM, BN, WM, WN, ST, MASK, VAR>(p, fa1m_smem);                            \
    }
