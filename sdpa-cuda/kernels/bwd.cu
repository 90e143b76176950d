// FlashAttention-2 backward on tensor cores (mma.sync m16n8k16, f16/bf16 in, f32 accumulate).
//
// Three launches per call (src/kernels/bwd.rs):
//  1. `_pre`: Delta_i = rowsum(dO_i o O_i) per query row (f32, into the call's workspace), one warp per row.
//  2. the main kernel: one block per (key tile of BN keys, kv head, sequence). It loads its K/V tile once and
//     walks the query tiles of BM rows whose band reaches the tile (causal masks and windows skip the rest),
//     for every query head of the kv head's group (GQA: dK/dV summed inside the block, no atomics on them).
//     Warps own 16 MT key rows each (KW warps along the keys; CW warps split the dK/dV columns of the same
//     rows for the big head dims, recomputing the same S and dP), so S^T = K Q^T and dP^T = V dO^T come out
//     with a key per accumulator row, and P^T and dS^T feed dV += P^T dO and dK += dS^T Q straight from
//     registers (the C layout of two n8 tiles is the A layout of one k16 step, as P in the forward). The
//     split layout (SPL, FlashAttention-2's, D = 128) has the CW warps split the queries of S and dP instead
//     and passes P^T and dS^T through shared memory. dQ += dS K needs dS with the queries as rows: dS^T goes
//     through shared memory (ldmatrix.trans reads it back) and every warp adds its part of dQ into an f32
//     accumulator with 16-byte reductions (`_convert` then rounds it into dQ through Q's strides). Q, dO, LSE
//     and Delta of the next query tile load (cp.async) while this one is computed. Causal masks launch the
//     grid heavy-first (HF).
//  3. `_convert`: dQ = scale * accumulator, in the dtype through Q's strides (and in f32 when asked).
// Deterministic programs (`_det`) run the main kernel without dQ and then `_dq`: one block per (query tile,
// query head, sequence) that walks its band's key tiles, recomputes P and dS and accumulates dQ in registers
// (no atomics: the result does not depend on the order blocks run in).
//
// Scores follow the forward exactly (sdpa_core's semantics): x = scale q.k; softcap cap tanh(x / cap) (the
// tensor-core kernels' fast form, fa2_mma.cuh); ALiBi -slope |j - diag(i)|; the explicit additive mask; P =
// exp(s - LSE) from the forward's LSE. Softcap's chain rule: dX = dS (1 - tanh^2). Masked keys, keys past the
// end and rows past the end have P = 0 and dS = 0 exactly (a NaN under a masked key reaches nothing); a row
// with LSE = -inf has P = 0 everywhere, so its dQ is zero. Ragged batches: the params' cu_q / cu_k give each
// sequence's rows (seq_view), each sequence is a problem of its own; blocks past a sequence's tiles exit.
#include "fa2_mma.cuh"

// The launch argument: the forward's parameters (Q, K, V, O, mask, LSE, strides, band, variants, ragged
// offsets) and the backward's own buffers. Mirrors src/kernels/bwd.rs `BwdParams` field for field.
struct BwdParams {
    AttnParams p;
    const void* d_o;  // dO, O's strides
    void* dq;         // Q's strides
    void* dk;         // K's strides
    void* dv;         // V's strides
    float* delta;     // [rows] workspace (row index as the LSE's)
    float* dq_acc;    // [rows][d] f32 workspace (atomic programs), else null
    float* dq_f32;    // the caller's f32 dQ (Q's strides), or null
};
static_assert(sizeof(BwdParams) == 384, "BwdParams must match src/kernels/bwd.rs");

// Rows of the call's row space (the LSE's): B * Hq * Sq dense, Hq * total_q ragged.
__device__ __forceinline__ i64 bwd_rows(const AttnParams& p) {
    return is_ragged(p) ? (i64)p.hq * p.total_q : (i64)p.b * p.hq * p.sq;
}

// Element offset (strides `st`) of row r of the row space.
__device__ __forceinline__ i64 bwd_row_offset(const AttnParams& p, const i64* st, i64 r) {
    if (is_ragged(p)) {
        const i64 h = r / p.total_q, t = r - h * p.total_q;
        return t * st[2] + h * st[1];
    }
    const i64 bh = r / p.sq, i = r - bh * p.sq;
    const i64 b = bh / p.hq, h = bh - b * p.hq;
    return b * st[0] + h * st[1] + i * st[2];
}

// Element offset of row 0 of head h of sequence b (dense: batch b), strides `st`: rows follow at st[2].
__device__ __forceinline__ i64 bwd_head_base(const AttnParams& p, const i64* st, int row0, int b, int h) {
    return (is_ragged(p) ? (i64)row0 * st[2] : (i64)b * st[0]) + (i64)h * st[1];
}

// Index in the row space of row 0 of head h of sequence b (its rows follow).
__device__ __forceinline__ i64 bwd_row_base(const AttnParams& p, const SeqView& s, int b, int h) {
    return is_ragged(p) ? (i64)h * p.total_q + s.q0 : ((i64)b * p.hq + h) * p.sq;
}

// Delta = rowsum(dO o O), one warp per row, 16-byte loads (rows start 16-byte aligned and Dv is a multiple of 8:
// the backward's refusals). The atomic programs also zero the row's dQ accumulator here.
template <typename T>
__device__ __forceinline__ void bwd_pre(const BwdParams& bp) {
    const AttnParams& p = bp.p;
    const i64 r = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= bwd_rows(p)) return;
    const int lane = threadIdx.x % 32;
    const i64 off = bwd_row_offset(p, p.o_stride, r);
    const T* o = static_cast<const T*>(p.o) + off;
    const T* d_o = static_cast<const T*>(bp.d_o) + off;
    float acc = 0.f;
    for (int c = lane * 8; c < p.dv; c += 32 * 8) {
        const uint4 a = __ldg(reinterpret_cast<const uint4*>(o + c));
        const uint4 b = __ldg(reinterpret_cast<const uint4*>(d_o + c));
        const T* x = reinterpret_cast<const T*>(&a);
        const T* y = reinterpret_cast<const T*>(&b);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc = fmaf(to_f32(x[e]), to_f32(y[e]), acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) bp.delta[r] = acc;
    if (bp.dq_acc != nullptr) {
        float* z = bp.dq_acc + r * p.d;
        for (int c = lane * 4; c < p.d; c += 32 * 4) *reinterpret_cast<float4*>(z + c) = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

// dQ = scale * accumulator into the dtype through Q's strides (and into the caller's f32 dQ), one warp per row,
// four columns per lane (D is a multiple of 8, rows 16-byte aligned).
template <typename T>
__device__ __forceinline__ void bwd_convert(const BwdParams& bp) {
    const AttnParams& p = bp.p;
    const i64 r = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (r >= bwd_rows(p)) return;
    const i64 off = bwd_row_offset(p, p.q_stride, r);
    const float* acc = bp.dq_acc + r * p.d;
    T* dq = static_cast<T*>(bp.dq) + off;
    for (int c = (threadIdx.x % 32) * 4; c < p.d; c += 32 * 4) {
        float4 x = *reinterpret_cast<const float4*>(acc + c);
        x.x *= p.scale; x.y *= p.scale; x.z *= p.scale; x.w *= p.scale;
        uint2 packed;
        packed.x = Fa2Type<T>::pack(x.x, x.y);
        packed.y = Fa2Type<T>::pack(x.z, x.w);
        *reinterpret_cast<uint2*>(dq + c) = packed;
        if (bp.dq_f32 != nullptr) *reinterpret_cast<float4*>(bp.dq_f32 + off + c) = x;
    }
}

// Adds a pair of floats to global memory (the dQ accumulator): one vector reduction on sm_90, two elsewhere.
__device__ __forceinline__ void bwd_red_add2(float* dst, float a, float b) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(a), "f"(b) : "memory");
#else
    atomicAdd(dst, a);
    atomicAdd(dst + 1, b);
#endif
}

// Adds four consecutive floats (16-byte aligned) to global memory: one vector reduction on sm_90.
__device__ __forceinline__ void bwd_red_add4(float* dst, float a, float b, float c, float d) {
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(a), "f"(b), "f"(c), "f"(d)
                 : "memory");
#else
    bwd_red_add2(dst, a, b);
    bwd_red_add2(dst + 2, c, d);
#endif
}

// 4-byte global->shared copy; `valid == false` writes zero.
__device__ __forceinline__ void bwd_cp_async4(unsigned dst, const void* gmem, bool valid) {
    int src_bytes = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}

// The probability of one (query, key) pair of a sequence and head: the forward's score path (softcap, ALiBi,
// explicit mask, band) in log2 units, then exp2(s - LSE * log2 e). `edge`: the pair may lie outside the band or
// past the ends (tiles inside need no test). `dfac` receives softcap's derivative 1 - tanh^2 (SC only).
template <bool EXPL, bool SC, bool AL>
struct BwdScore {
    float sl2, kc, c1, a2;
    int sq, sk, lo, hi, diag;
    const float* mask;  // explicit mask at (b, h), or null
    i64 ms_q, ms_k;

    __device__ __forceinline__ BwdScore(const AttnParams& p, const SeqView& s, int b, int h) {
        sl2 = p.scale_log2;
        const float cap = p.softcap > 0.f ? p.softcap : 1.f;
        kc = 2.f * p.scale_log2 / cap;
        c1 = cap * FA2_LOG2E;
        a2 = AL ? p.alibi[h] * FA2_LOG2E : 0.f;
        sq = s.sq; sk = s.sk; lo = s.band_lo; hi = s.band_hi; diag = s.diag_offset;
        mask = EXPL ? p.mask + b * p.mask_stride[0] + h * p.mask_stride[1] : nullptr;
        ms_q = p.mask_stride[2]; ms_k = p.mask_stride[3];
    }

    __device__ __forceinline__ float prob(float x, int q, int key, bool edge, float lse2, float& dfac) const {
        float y;
        if constexpr (SC) {
            // tanh(u) = 1 - 2 / (2^(2u log2 e) + 1), u = x scale / cap; 1 - tanh^2 = 4 r (1 - r).
            const float r = fast_rcp(1.f + fast_exp2(x * kc));
            y = c1 * (1.f - 2.f * r);
            dfac = 4.f * r * (1.f - r);
        } else {
            y = x * sl2;
        }
        if constexpr (AL) y = fmaf(-a2, fabsf((float)(key - q - diag)), y);
        bool vis = true;
        if (edge) {
            const int rel = key - q;
            vis = key < sk && q < sq && rel >= lo && rel <= hi;
        }
        if constexpr (EXPL) {
            if (vis) {
                const float mv = mask[(i64)q * ms_q + (i64)key * ms_k];
                vis = mv != SDPA_NEG_INF;
                y = fmaf(mv, FA2_LOG2E, y);
            }
        }
        return vis ? fast_exp2(y - lse2) : 0.f;
    }
};

// The forward's LSE in log2 units; a row that saw no key (-inf) gets +inf so that every P of it is 0.
__device__ __forceinline__ float bwd_lse2(float lse) {
    return lse == SDPA_NEG_INF ? -SDPA_NEG_INF : lse * FA2_LOG2E;
}

// Tile geometry of the main kernel: KW warps along the keys (16 MT each, BN = 16 MT KW), CW along the dK/dV
// columns. SPL (FlashAttention-2's layout): the CW warps of a key row also split the queries of S and dP
// (BM / CW each) instead of recomputing all of them, and P^T and dS^T go through shared memory, where dV and
// dK read them back by ldmatrix; without SPL each warp computes S and dP for all BM queries and keeps P^T and
// dS^T in registers. dQ (BM x D) is split over the warps in m16 tiles, two per warp where the columns allow (a B fragment
// then serves two mma), else one.
template <int D, int DV, int BM, int KW, int CW, int MT, bool SPL>
struct BwdTile {
    static constexpr int NW = KW * CW;
    static constexpr int THREADS = NW * 32;
    static constexpr int BN = KW * 16 * MT;
    static constexpr int LD = D + 8, LDV = DV + 8, LDS = BM + 8;
    static constexpr int SQ = SPL ? BM / CW : BM;  // queries of a warp's S^T
    static constexpr int NT = SQ / 8;              // n8 tiles of S^T (queries)
    static constexpr int DC = D / CW, DVC = DV / CW;
    static constexpr bool QPAIR = BM % 32 == 0 && NW % (BM / 32) == 0 && (D / (NW / (BM / 32))) % 16 == 0;
    static constexpr int QMT = QPAIR ? 2 : 1;  // dQ m16 tiles per warp
    static constexpr int QR = BM / (16 * QMT); // warps along the dQ rows
    static constexpr int DQC = D / (NW / QR);  // dQ columns per warp
    static constexpr unsigned K_BYTES = BN * LD * 2, V_BYTES = BN * LDV * 2;
    static constexpr unsigned Q_BYTES = BM * LD * 2, DO_BYTES = BM * LDV * 2;
    static constexpr unsigned S_BYTES = BN * LDS * 2;
    static constexpr unsigned P_BYTES = SPL ? S_BYTES : 0;  // P^T (SPL)
    static constexpr unsigned SMEM = K_BYTES + V_BYTES + 2 * (Q_BYTES + DO_BYTES) + S_BYTES + P_BYTES + 2 * 2 * BM * 4;
    static_assert(D % 16 == 0 && DV % 16 == 0 && BM % 16 == 0 && SQ % 16 == 0, "k16 steps, x4 query pairs");
    static_assert(DC % 16 == 0 && DVC % 16 == 0, "whole x4 ldmatrix column pairs per warp");
    static_assert(NW % QR == 0 && DQC % 16 == 0, "dQ: whole m16 tiles and x4 column pairs per warp");
};

// A warp's P^T or dS^T (keys wrow + 16 mt + g + 8 hh, queries q_off + 8 j + 2 t4 + e) into the dtype in shared
// memory, rows of LDS elements (LDS / 2 = 4 mod 32 words: the eight rows of a store hit distinct banks).
template <typename T, int MT, int NT, int LDS>
__device__ __forceinline__ void bwd_store_st(unsigned char* base, const float (&st)[MT][NT][4], int wrow, int q_off,
                                             int g, int t4) {
    T* dst = reinterpret_cast<T*>(base);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
                *reinterpret_cast<unsigned*>(dst + (wrow + mt * 16 + g + hh * 8) * LDS + q_off + j * 8 + t4 * 2) =
                    Fa2Type<T>::pack(st[mt][j][hh * 2], st[mt][j][hh * 2 + 1]);
}

// acc (MT m16 tiles x DT n8 tiles) += A B over KT k16 steps: A row-major in shared memory (`a_ld`, the lane's
// ldmatrix base, rows of LDA elements), B k-major (`b_ld`, the lane's ldmatrix.trans base, rows of LDB).
template <typename T, int LDA, int LDB, int MT, int KT, int DT>
__device__ __forceinline__ void bwd_mma_smem_a(float (&acc)[MT][DT][4], unsigned a_ld, unsigned b_ld) {
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
        unsigned a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) fa2_ldmatrix_x4(a[mt], a_ld + (mt * 16 * LDA + kk * 16) * 2);
#pragma unroll
        for (int dp = 0; dp < DT / 2; ++dp) {
            unsigned bv[4];
            fa2_ldmatrix_x4_trans(bv, b_ld + (kk * 16 * LDB + dp * 16) * 2);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                Fa2Type<T>::mma(acc[mt][2 * dp], a[mt], bv[0], bv[1]);
                Fa2Type<T>::mma(acc[mt][2 * dp + 1], a[mt], bv[2], bv[3]);
            }
        }
    }
}

// dK and dV of one key tile (and, with DQ, its part of dQ through atomics).
template <typename T, int D, int DV, int BM, int KW, int CW, int MT, bool SPL, bool EXPL, bool SC, bool AL, bool HF,
          bool DQ>
__device__ __forceinline__ void bwd_dkdv(const BwdParams& bp, unsigned char* smem) {
    using Tl = BwdTile<D, DV, BM, KW, CW, MT, SPL>;
    constexpr int BN = Tl::BN, LD = Tl::LD, LDV = Tl::LDV, LDS = Tl::LDS, NT = Tl::NT, THREADS = Tl::THREADS;
    constexpr bool VARS = EXPL || SC || AL;
    const AttnParams& p = bp.p;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const int kw = warp % KW, cw = warp / KW;
    // Blocks start in the order of their linear index (x fastest). Under a causal mask the first key tiles of a
    // head see the most query rows, so HF (heavy first) launches the grid as (kv heads, sequences, key tiles):
    // every head's key tile 0 starts first, then tile 1, ..., and light tiles end the launch instead of a heavy
    // one starting last. Otherwise (key tiles, kv heads, sequences): a head's tiles run together and share its
    // Q and dO in L2.
    const int tile = HF ? blockIdx.z : blockIdx.x, kvh = HF ? blockIdx.x : blockIdx.y, b = HF ? blockIdx.y : blockIdx.z;
    const SeqView s = seq_view(p, b);
    const int n0 = tile * BN;
    if (n0 >= s.sk) return;  // ragged: past this sequence's keys
    const int n1 = min(n0 + BN, s.sk);

    const unsigned sK = smem_addr(smem);
    const unsigned sV = sK + Tl::K_BYTES;
    const unsigned sQ = sV + Tl::V_BYTES;
    const unsigned sdO = sQ + 2 * Tl::Q_BYTES;
    const unsigned sdS = sdO + 2 * Tl::DO_BYTES;
    const unsigned sP = sdS + Tl::S_BYTES;  // P^T (SPL)
    const unsigned sL = sP + Tl::P_BYTES;   // [2][BM] LSE, then [2][BM] Delta
    const float* fL = reinterpret_cast<const float*>(smem + (sL - sK));
    const float* fD = fL + 2 * BM;

    // Per-lane ldmatrix bases (see fa2.cu): A operands by rows, B operands by rows (non-trans) or by k (trans).
    const int wrow = kw * 16 * MT;  // the warp's first key in the tile
    const unsigned k_a = sK + ((wrow + lane % 16) * LD + (lane / 16) * 8) * 2;
    const unsigned v_a = sV + ((wrow + lane % 16) * LDV + (lane / 16) * 8) * 2;
    const int q_off = SPL ? cw * Tl::SQ : 0;  // the warp's first query of S^T in the tile
    const unsigned q_b = sQ + (((lane % 8) + (lane / 16) * 8 + q_off) * LD + ((lane / 8) % 2) * 8) * 2;
    const unsigned do_b = sdO + (((lane % 8) + (lane / 16) * 8 + q_off) * LDV + ((lane / 8) % 2) * 8) * 2;
    // SPL: the lane's ldmatrix base of the warp's keys in P^T and dS^T (A operands of dV and dK).
    const unsigned p_a = sP + ((wrow + lane % 16) * LDS + (lane / 16) * 8) * 2;
    const unsigned ds_ak = sdS + ((wrow + lane % 16) * LDS + (lane / 16) * 8) * 2;
    const unsigned q_t = sQ + (((lane % 8) + ((lane / 8) % 2) * 8) * LD + (lane / 16) * 8) * 2 + cw * Tl::DC * 2;
    const unsigned do_t = sdO + (((lane % 8) + ((lane / 8) % 2) * 8) * LDV + (lane / 16) * 8) * 2 + cw * Tl::DVC * 2;

    const i64 kbase = bwd_head_base(p, p.k_stride, s.k0, b, kvh);
    const i64 vbase = bwd_head_base(p, p.v_stride, s.k0, b, kvh);
    fa2_load_tile<T, D, BN, THREADS, true>(sK, static_cast<const T*>(p.k) + kbase + (i64)n0 * p.k_stride[2],
                                           p.k_stride[2], s.sk - n0, tid, p.d);
    fa2_load_tile<T, DV, BN, THREADS, true>(sV, static_cast<const T*>(p.v) + vbase + (i64)n0 * p.v_stride[2],
                                            p.v_stride[2], s.sk - n0, tid, p.dv);

    // Query rows whose band reaches keys [n0, n1): i + lo <= n1 - 1 and i + hi >= n0.
    const long long i_first = max(0LL, (long long)n0 - s.band_hi);
    const long long i_last = min((long long)s.sq - 1, (long long)n1 - 1 - s.band_lo);
    const int mt0 = (int)(i_first / BM);
    const int n_mt = i_last >= i_first ? (int)(i_last / BM) - mt0 + 1 : 0;
    const int n_it = n_mt * p.group;

    auto load_q = [&](int it, int buf) {
        const int h = kvh * p.group + it / n_mt;
        const int m0 = (mt0 + it % n_mt) * BM;
        const i64 qb = bwd_head_base(p, p.q_stride, s.q0, b, h) + (i64)m0 * p.q_stride[2];
        const i64 ob = bwd_head_base(p, p.o_stride, s.q0, b, h) + (i64)m0 * p.o_stride[2];
        fa2_load_tile<T, D, BM, THREADS, true>(sQ + buf * Tl::Q_BYTES, static_cast<const T*>(p.q) + qb,
                                               p.q_stride[2], s.sq - m0, tid, p.d);
        fa2_load_tile<T, DV, BM, THREADS, true>(sdO + buf * Tl::DO_BYTES, static_cast<const T*>(bp.d_o) + ob,
                                                p.o_stride[2], s.sq - m0, tid, p.dv);
        if (tid < BM) {
            const i64 r = bwd_row_base(p, s, b, h) + m0 + tid;
            const bool ok = m0 + tid < s.sq;
            bwd_cp_async4(sL + (buf * BM + tid) * 4, ok ? p.lse + r : p.lse, ok);
            bwd_cp_async4(sL + (2 * BM + buf * BM + tid) * 4, ok ? bp.delta + r : bp.delta, ok);
        }
    };
    if (n_it > 0) load_q(0, 0);
    fa2_cp_async_commit();

    float dk[MT][Tl::DC / 8][4], dv[MT][Tl::DVC / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int j = 0; j < Tl::DC / 8; ++j) dk[mt][j][0] = dk[mt][j][1] = dk[mt][j][2] = dk[mt][j][3] = 0.f;
#pragma unroll
        for (int j = 0; j < Tl::DVC / 8; ++j) dv[mt][j][0] = dv[mt][j][1] = dv[mt][j][2] = dv[mt][j][3] = 0.f;
    }

    const int key_r = n0 + wrow + g;  // this thread's keys: key_r + mt * 16 + hh * 8
    for (int it = 0; it < n_it; ++it) {
        const int buf = it & 1;
        fa2_cp_async_wait<0>();
        __syncthreads();  // tile `it` (and K/V) landed; everyone is done with tile it - 1 and its dS
        if (it + 1 < n_it) load_q(it + 1, buf ^ 1);
        fa2_cp_async_commit();

        const int h = kvh * p.group + it / n_mt;
        const int m0 = (mt0 + it % n_mt) * BM;
        const float* lse_s = fL + buf * BM + q_off;
        const float* del_s = fD + buf * BM + q_off;

        // S^T = K Q^T: this warp's 16 MT keys x BM queries.
        float st[MT][NT][4];
        fa2_qk<T, D, LD, MT, NT>(st, k_a, q_b + buf * Tl::Q_BYTES);

        // P^T (in st), softcap's derivative in dfac.
        const bool edge = n0 + BN > s.sk || m0 + BM > s.sq || (long long)n0 - (m0 + BM - 1) < s.band_lo ||
                          (long long)n0 + BN - 1 - m0 > s.band_hi;
        float dfac[MT][SC ? NT : 1][4];
        if (!VARS && !edge) {
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const float2 l = *reinterpret_cast<const float2*>(lse_s + j * 8 + t4 * 2);
                const float l0 = bwd_lse2(l.x), l1 = bwd_lse2(l.y);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        st[mt][j][hh * 2] = fast_exp2(fmaf(st[mt][j][hh * 2], p.scale_log2, -l0));
                        st[mt][j][hh * 2 + 1] = fast_exp2(fmaf(st[mt][j][hh * 2 + 1], p.scale_log2, -l1));
                    }
            }
        } else {
            const BwdScore<EXPL, SC, AL> sc(p, s, b, h);
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int qi = j * 8 + t4 * 2 + e;
                    const float l2 = bwd_lse2(lse_s[qi]);
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int hh = 0; hh < 2; ++hh) {
                            float f = 1.f;
                            float& x = st[mt][j][hh * 2 + e];
                            x = sc.prob(x, m0 + q_off + qi, key_r + mt * 16 + hh * 8, edge, l2, f);
                            if constexpr (SC) dfac[mt][j][hh * 2 + e] = f;
                        }
                }
        }

        // dV += P^T dO (SPL: once every warp's P^T is in shared memory, below).
        if constexpr (SPL)
            bwd_store_st<T, MT, NT, LDS>(smem + (sP - sK), st, wrow, q_off, g, t4);
        else
            fa2_pv<T, LDV, MT, NT, Tl::DVC / 8>(dv, st, do_t + buf * Tl::DO_BYTES);

        // dP^T = V dO^T, then dS^T = P^T o (dP^T - Delta) (times softcap's derivative) in st.
        {
            float dp[MT][NT][4];
            fa2_qk<T, DV, LDV, MT, NT>(dp, v_a, do_b + buf * Tl::DO_BYTES);
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const float2 dl = *reinterpret_cast<const float2*>(del_s + j * 8 + t4 * 2);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int c = 0; c < 4; ++c) {
                        const float pr = st[mt][j][c];
                        float ds = pr * (dp[mt][j][c] - ((c & 1) ? dl.y : dl.x));
                        if constexpr (SC) ds *= dfac[mt][j][c];
                        // Masked pairs stay exactly 0 (a NaN in a masked key's V must not reach dQ or dK).
                        st[mt][j][c] = pr == 0.f ? 0.f : ds;
                    }
            }
        }

        if constexpr (SPL) {
            // dS^T beside P^T; then dV += P^T dO and dK += dS^T Q over all BM queries, A from shared memory.
            bwd_store_st<T, MT, NT, LDS>(smem + (sdS - sK), st, wrow, q_off, g, t4);
            __syncthreads();
            bwd_mma_smem_a<T, LDS, LDV, MT, BM / 16, Tl::DVC / 8>(dv, p_a, do_t + buf * Tl::DO_BYTES);
            bwd_mma_smem_a<T, LDS, LD, MT, BM / 16, Tl::DC / 8>(dk, ds_ak, q_t + buf * Tl::Q_BYTES);
        } else {
            // dK += dS^T Q.
            fa2_pv<T, LD, MT, NT, Tl::DC / 8>(dk, st, q_t + buf * Tl::Q_BYTES);
            if constexpr (DQ) {
                // dS^T into shared memory (the CW warps of a key row each write their share of the queries).
                T* sds = reinterpret_cast<T*>(smem + (sdS - sK));
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    if (j % CW != cw) continue;
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int hh = 0; hh < 2; ++hh)
                            *reinterpret_cast<unsigned*>(sds + (wrow + mt * 16 + g + hh * 8) * LDS + j * 8 + t4 * 2) =
                                Fa2Type<T>::pack(st[mt][j][hh * 2], st[mt][j][hh * 2 + 1]);
                }
                __syncthreads();
            }
        }

        if constexpr (DQ) {
            // dQ (BM x D) += dS K: warp (qm, qc) takes 16 QMT queries x DQC columns, summed over the BN keys.
            constexpr int QMT = Tl::QMT, QT = Tl::DQC / 8;
            const int qm = warp % Tl::QR, qc = warp / Tl::QR;
            float acc[QMT][QT][4];
#pragma unroll
            for (int t = 0; t < QMT; ++t)
#pragma unroll
                for (int j = 0; j < QT; ++j) acc[t][j][0] = acc[t][j][1] = acc[t][j][2] = acc[t][j][3] = 0.f;
            const unsigned ds_a =
                sdS + (((lane % 8) + (lane / 16) * 8) * LDS + qm * 16 * QMT + ((lane / 8) % 2) * 8) * 2;
            const unsigned k_t = sK + (((lane % 8) + ((lane / 8) % 2) * 8) * LD + (lane / 16) * 8) * 2 + qc * Tl::DQC * 2;
#pragma unroll
            for (int kk = 0; kk < BN / 16; ++kk) {
                unsigned a[QMT][4];
#pragma unroll
                for (int t = 0; t < QMT; ++t) fa2_ldmatrix_x4_trans(a[t], ds_a + (kk * 16 * LDS + t * 16) * 2);
#pragma unroll
                for (int dp = 0; dp < QT / 2; ++dp) {
                    unsigned bk[4];
                    fa2_ldmatrix_x4_trans(bk, k_t + (kk * 16 * LD + dp * 16) * 2);
#pragma unroll
                    for (int t = 0; t < QMT; ++t) {
                        Fa2Type<T>::mma(acc[t][2 * dp], a[t], bk[0], bk[1]);
                        Fa2Type<T>::mma(acc[t][2 * dp + 1], a[t], bk[2], bk[3]);
                    }
                }
            }
            // Lanes t4 and t4 ^ 1 swap halves so that each adds four consecutive columns of one row: the even
            // lane row g, the odd lane row g + 8 (half the reductions of pairs).
            const i64 rb = bwd_row_base(p, s, b, h) + m0;
            const bool odd = t4 & 1;
#pragma unroll
            for (int t = 0; t < QMT; ++t) {
                const int row = qm * 16 * QMT + t * 16 + g + (odd ? 8 : 0);
                float* dst = bp.dq_acc + (rb + row) * p.d;
#pragma unroll
                for (int j = 0; j < QT; ++j) {
                    const float* c = acc[t][j];
                    const float r0 = __shfl_xor_sync(0xffffffffu, odd ? c[0] : c[2], 1);
                    const float r1 = __shfl_xor_sync(0xffffffffu, odd ? c[1] : c[3], 1);
                    const int col = qc * Tl::DQC + j * 8 + (t4 & 2) * 2;
                    if (m0 + row < s.sq && col < p.d) {
                        if (odd)
                            bwd_red_add4(dst + col, r0, r1, c[2], c[3]);
                        else
                            bwd_red_add4(dst + col, c[0], c[1], r0, r1);
                    }
                }
            }
        }
    }
    fa2_cp_async_wait<0>();

    // Epilogue: dK = scale * sum, dV; keys past the end and padded columns are not stored.
    T* dkp = static_cast<T*>(bp.dk) + bwd_head_base(p, p.k_stride, s.k0, b, kvh);
    T* dvp = static_cast<T*>(bp.dv) + bwd_head_base(p, p.v_stride, s.k0, b, kvh);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int key = key_r + mt * 16 + hh * 8;
            if (key >= s.sk) continue;
#pragma unroll
            for (int j = 0; j < Tl::DC / 8; ++j) {
                const int col = cw * Tl::DC + j * 8 + t4 * 2;
                if (col < p.d)
                    *reinterpret_cast<unsigned*>(dkp + (i64)key * p.k_stride[2] + col) =
                        Fa2Type<T>::pack(dk[mt][j][hh * 2] * p.scale, dk[mt][j][hh * 2 + 1] * p.scale);
            }
#pragma unroll
            for (int j = 0; j < Tl::DVC / 8; ++j) {
                const int col = cw * Tl::DVC + j * 8 + t4 * 2;
                if (col < p.dv)
                    *reinterpret_cast<unsigned*>(dvp + (i64)key * p.v_stride[2] + col) =
                        Fa2Type<T>::pack(dv[mt][j][hh * 2], dv[mt][j][hh * 2 + 1]);
            }
        }
}

// Deterministic dQ: one block per (query tile of BM rows, query head, sequence), NW warps of 16 * MT rows, over
// the key tiles of BN keys its rows' bands reach; dQ accumulated in registers and written once.
template <typename T, int D, int DV, int BM, int BN, int NW, bool EXPL, bool SC, bool AL>
__device__ __forceinline__ void bwd_dq_rows(const BwdParams& bp, unsigned char* smem) {
    constexpr int LD = D + 8, LDV = DV + 8, THREADS = NW * 32;
    constexpr int MT = BM / NW / 16, NT = BN / 8;
    constexpr bool VARS = EXPL || SC || AL;
    static_assert(BM % (NW * 16) == 0 && BN % 16 == 0, "whole m16 tiles per warp, k16 steps");
    const AttnParams& p = bp.p;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const int b = blockIdx.z, h = blockIdx.y, kvh = h / p.group;
    const SeqView s = seq_view(p, b);
    const int m0 = blockIdx.x * BM;
    if (m0 >= s.sq) return;
    const int m_end = min(m0 + BM, s.sq);
    const int row0 = warp * MT * 16;

    const unsigned sQ = smem_addr(smem);
    const unsigned sdO = sQ + BM * LD * 2;
    const unsigned sK = sdO + BM * LDV * 2;
    const unsigned sV = sK + BN * LD * 2;
    const unsigned q_a = sQ + ((row0 + lane % 16) * LD + (lane / 16) * 8) * 2;
    const unsigned do_a = sdO + ((row0 + lane % 16) * LDV + (lane / 16) * 8) * 2;
    const unsigned k_b = sK + (((lane % 8) + (lane / 16) * 8) * LD + ((lane / 8) % 2) * 8) * 2;
    const unsigned v_b = sV + (((lane % 8) + (lane / 16) * 8) * LDV + ((lane / 8) % 2) * 8) * 2;
    const unsigned k_t = sK + (((lane % 8) + ((lane / 8) % 2) * 8) * LD + (lane / 16) * 8) * 2;

    const i64 qb = bwd_head_base(p, p.q_stride, s.q0, b, h);
    const i64 ob = bwd_head_base(p, p.o_stride, s.q0, b, h);
    const i64 kb = bwd_head_base(p, p.k_stride, s.k0, b, kvh);
    const i64 vb = bwd_head_base(p, p.v_stride, s.k0, b, kvh);
    fa2_load_tile<T, D, BM, THREADS, true>(sQ, static_cast<const T*>(p.q) + qb + (i64)m0 * p.q_stride[2],
                                           p.q_stride[2], s.sq - m0, tid, p.d);
    fa2_load_tile<T, DV, BM, THREADS, true>(sdO, static_cast<const T*>(bp.d_o) + ob + (i64)m0 * p.o_stride[2],
                                            p.o_stride[2], s.sq - m0, tid, p.dv);
    fa2_cp_async_commit();

    // This thread's rows: row0 + mt * 16 + g + hh * 8.
    float l2[MT][2], del[MT][2];
    const i64 rb = bwd_row_base(p, s, b, h);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int i = m0 + row0 + mt * 16 + g + hh * 8;
            l2[mt][hh] = i < s.sq ? bwd_lse2(p.lse[rb + i]) : -SDPA_NEG_INF;
            del[mt][hh] = i < s.sq ? bp.delta[rb + i] : 0.f;
        }

    // Key tiles of the rows' bands.
    const long long first = max(0LL, min((long long)s.sk, (long long)m0 + s.band_lo));
    const long long end = max(first, min((long long)s.sk, (long long)m_end - 1 + s.band_hi + 1));
    const int t0 = (int)(first / BN);
    const int n_tiles = end > first ? (int)((end + BN - 1) / BN) - t0 : 0;

    float dq[MT][D / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < D / 8; ++j) dq[mt][j][0] = dq[mt][j][1] = dq[mt][j][2] = dq[mt][j][3] = 0.f;
    const BwdScore<EXPL, SC, AL> sc(p, s, b, h);

    for (int t = 0; t < n_tiles; ++t) {
        const int n0 = (t0 + t) * BN;
        __syncthreads();  // everyone is done with the last K/V tile
        fa2_load_tile<T, D, BN, THREADS, true>(sK, static_cast<const T*>(p.k) + kb + (i64)n0 * p.k_stride[2],
                                               p.k_stride[2], s.sk - n0, tid, p.d);
        fa2_load_tile<T, DV, BN, THREADS, true>(sV, static_cast<const T*>(p.v) + vb + (i64)n0 * p.v_stride[2],
                                                p.v_stride[2], s.sk - n0, tid, p.dv);
        fa2_cp_async_commit();
        fa2_cp_async_wait<0>();
        __syncthreads();

        float sr[MT][NT][4];
        fa2_qk<T, D, LD, MT, NT>(sr, q_a, k_b);
        const bool edge = n0 + BN > s.sk || m0 + BM > s.sq || (long long)n0 - (m0 + BM - 1) < s.band_lo ||
                          (long long)n0 + BN - 1 - m0 > s.band_hi;
        float dfac[MT][SC ? NT : 1][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int qi = m0 + row0 + mt * 16 + g + hh * 8;
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float& x = sr[mt][j][hh * 2 + e];
                        if (!VARS && !edge) {
                            x = fast_exp2(fmaf(x, p.scale_log2, -l2[mt][hh]));
                        } else {
                            float f = 1.f;
                            x = sc.prob(x, qi, n0 + j * 8 + t4 * 2 + e, edge, l2[mt][hh], f);
                            if constexpr (SC) dfac[mt][j][hh * 2 + e] = f;
                        }
                    }
            }
        float dp[MT][NT][4];
        fa2_qk<T, DV, LDV, MT, NT>(dp, do_a, v_b);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const float pr = sr[mt][j][c];
                    float ds = pr * (dp[mt][j][c] - del[mt][c / 2]);
                    if constexpr (SC) ds *= dfac[mt][j][c];
                    sr[mt][j][c] = pr == 0.f ? 0.f : ds;
                }
        fa2_pv<T, LD, MT, NT, D / 8>(dq, sr, k_t);
    }
    fa2_cp_async_wait<0>();

    T* dqp = static_cast<T*>(bp.dq) + qb;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int i = m0 + row0 + mt * 16 + g + hh * 8;
            if (i >= s.sq) continue;
            const i64 off = (i64)i * p.q_stride[2];
#pragma unroll
            for (int j = 0; j < D / 8; ++j) {
                const int col = j * 8 + t4 * 2;
                if (col >= p.d) continue;
                const float x0 = dq[mt][j][hh * 2] * p.scale, x1 = dq[mt][j][hh * 2 + 1] * p.scale;
                *reinterpret_cast<unsigned*>(dqp + off + col) = Fa2Type<T>::pack(x0, x1);
                if (bp.dq_f32 != nullptr) {
                    bp.dq_f32[qb + off + col] = x0;
                    bp.dq_f32[qb + off + col + 1] = x1;
                }
            }
        }
}

// One program per (dtype, head-dim classes, score features): NAME (the main kernel with dQ atomics),
// NAME_pre (Delta) and NAME_convert (dQ into the dtype). Tile: BM query rows per step, KW x CW warps of 16 MT
// keys each, SPL for FlashAttention-2's layout (BwdTile), MINB blocks per SM for the register budget
// (__launch_bounds__), HF for the heavy-first grid of causal masks (bwd_dkdv).
#define BWD_ENTRY(NAME, T, D, DV, BM, KW, CW, MT, SPL, MINB, EXPL, SC, AL, HF)                                                 \
    extern "C" __global__ void __launch_bounds__(256) NAME##_pre(const BwdParams bp) { bwd_pre<T>(bp); }   \
    extern "C" __global__ void __launch_bounds__(256) NAME##_convert(const BwdParams bp) {                 \
        bwd_convert<T>(bp);                                                                                \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(KW * CW * 32, MINB) NAME(const BwdParams bp) {            \
        extern __shared__ __align__(16) unsigned char bwd_smem[];                                          \
        bwd_dkdv<T, D, DV, BM, KW, CW, MT, SPL, EXPL, SC, AL, HF, true>(bp, bwd_smem);                              \
    }
// The deterministic program: NAME (main kernel without dQ), NAME_pre, NAME_dq (dQ by query tiles of QBM rows,
// key tiles of QBN, QNW warps).
#define BWD_ENTRY_DET(NAME, T, D, DV, BM, KW, CW, MT, SPL, MINB, EXPL, SC, AL, HF, QBM, QBN, QNW)                              \
    extern "C" __global__ void __launch_bounds__(256) NAME##_pre(const BwdParams bp) { bwd_pre<T>(bp); }   \
    extern "C" __global__ void __launch_bounds__(KW * CW * 32, MINB) NAME(const BwdParams bp) {            \
        extern __shared__ __align__(16) unsigned char bwd_smem[];                                          \
        bwd_dkdv<T, D, DV, BM, KW, CW, MT, SPL, EXPL, SC, AL, HF, false>(bp, bwd_smem);                             \
    }                                                                                                      \
    extern "C" __global__ void __launch_bounds__(QNW * 32) NAME##_dq(const BwdParams bp) {                  \
        extern __shared__ __align__(16) unsigned char bwd_smem[];                                          \
        bwd_dq_rows<T, D, DV, QBM, QBN, QNW, EXPL, SC, AL>(bp, bwd_smem);                                   \
    }
