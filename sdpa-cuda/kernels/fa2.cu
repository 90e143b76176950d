// FlashAttention-2 forward on tensor cores (mma.sync m16n8k16, f16/bf16 in, f32 accumulate).
//
// Work split: one block per (query tile of BM rows, query head, batch). The query tile is split across
// NW warps, each owning BM/NW whole rows (MT m16 tiles), so the online softmax of a row lives in one warp's
// quad of threads and needs no shared-memory exchange. Every warp reads the whole K/V tile of BN keys.
//
// Pipeline per K/V tile, STAGES = 1 (one K and one V buffer, FlashAttention-2's order): wait K[t] ->
// issue cp.async of V[t] -> S = Q·K^T (ldmatrix) -> wait V[t] -> issue cp.async of K[t+1] -> mask and online
// softmax with exp2 and the scale folded in -> O += P·V with P taken straight from the S accumulators (the
// C layout of two n8 tiles is the A layout of one k16 step) and V read by ldmatrix.trans. So V[t] loads
// during Q·K^T, K[t+1] during softmax and P·V. STAGES >= 2 is a ring of K/V buffers instead: tiles
// t+1 .. t+STAGES-1 load while tile t is computed, one barrier per tile. Which is faster depends on the
// head dim (measured). Grids with no more blocks than SMs take a 4-deep ring: their blocks are alone on
// their SMs, so the shared memory is free, and with little math per tile each K/V tile of the 1- or 2-deep
// forms costs a whole memory latency (issue 4's tiny shapes).
//
// Shared memory rows are padded by 16 bytes (an odd number of 16-byte chunks per row): the eight row
// addresses of every ldmatrix phase then fall in eight different bank groups, and so do cp.async stores.
//
// Causal masks: tiles wholly above the diagonal are never loaded (the loop stops at the last visible key of
// the tile's last row); only tiles that cross the diagonal, or the end of the keys, run the mask code.
// Variant instantiations (VAR, fa2_mma.cuh) generalise that to the band: the loop runs from the tile of the
// first row's first visible key to that of the last row's last one, so a window's time grows with the
// window, not with Sk; softcap and ALiBi are applied to every score in registers before the online max (ALiBi
// with every visible key left of the diagonal as start values of the Q·Kᵀ accumulators: `below`).
//
// Ragged batches and paged caches (issue 23), SERVE != FA2_SERVE_DENSE: the grid's x walks a schedule of
// (sequence, query tile) pairs the launcher uploads into AttnParams::workspace (src/kernels/fa2.rs,
// `schedule`), heaviest tiles first, so that empty sequences and empty tiles cost nothing. A block rewrites
// the parameters into those of its sequence alone (fa2_sequence_params: pointers at its first packed rows,
// its lengths, its own band and diagonal), and the dense kernel body (fa2_forward) runs on them unchanged: causal and band
// tile skipping, variants and GQA per sequence. Paged K/V (FA2_SERVE_PAGED) load each key row through the
// sequence's block-table row (fa2_load_keys), so a tile may cross pages of any size. The non-finite repair
// runs on the call's own parameters (common.cuh resolves sequences there).
#include "fa2_mma.cuh"

// What a program's K/V and query rows are: a dense batch, a packed ragged batch (varlen), or a ragged batch
// whose K/V live in a paged cache.
#define FA2_SERVE_DENSE 0
#define FA2_SERVE_VARLEN 1
#define FA2_SERVE_PAGED 2

// Loads the K or V tile of ROWS keys from key0 of the head whose key 0 is at `head` (rows `stride[2]` apart;
// paged: `head` is the pool's first page of that head, pages `stride[0]` apart, each key through the
// sequence's block-table row `p.block_table`). Keys at or past p.sk are zero-filled.
// `row_bytes`: fa2_row_bytes of the call (16 for exact instantiations and paged K/V, which the launcher
// sends here only with 16-byte aligned rows).
template <typename T, int D, int ROWS, int THREADS, bool PAD, int SERVE>
__device__ __forceinline__ void fa2_load_keys(unsigned dst, const T* head, const i64* stride, const AttnParams& p,
                                              int key0, int tid, int cols, int row_bytes) {
    if constexpr (SERVE != FA2_SERVE_PAGED) {
        fa2_load_tile<T, D, ROWS, THREADS, PAD>(dst, head + (i64)key0 * stride[2], stride[2], p.sk - key0, tid, cols,
                                                row_bytes);
    } else {
        constexpr int CHUNKS = D / 8;
        constexpr int LD = D + 8;
        const unsigned last_page = (unsigned)(p.num_pages - 1);
        // One 16-byte chunk of key j = key0 + r, column col, in slot `slot` of block-table column `column`.
        auto copy = [&](int r, int col, int column, int slot) {
            const bool ok = key0 + r < p.sk && (!PAD || col < cols);
            const T* src = head;
            if (ok) {
                // A device block table is the caller's data: clamped into the pool (as kv_row_offset does).
                const unsigned page = min(__ldg(p.block_table + column), last_page);
                src = head + (i64)page * stride[0] + (i64)slot * stride[2] + col;
            }
            fa2_cp_async16(dst + (r * LD + col) * 2, src, ok);
        };
        const int ps = p.page_size;
        if constexpr (THREADS % CHUNKS == 0 && ROWS % (THREADS / CHUNKS) == 0) {
            // A thread's rows are RSTEP keys apart: one division for its first row, then the column and slot
            // advance by RSTEP (integer division by a run-time page size costs more than the copy's own
            // instructions, measured: 0.57x of packed K/V with a division per row).
            constexpr int RSTEP = THREADS / CHUNKS;
            const int r0 = tid / CHUNKS, col = (tid % CHUNKS) * 8;
            int column = (key0 + r0) / ps, slot = key0 + r0 - column * ps;
#pragma unroll
            for (int i = 0; i < ROWS / RSTEP; ++i) {
                copy(r0 + i * RSTEP, col, column, slot);
                slot += RSTEP;
                while (slot >= ps) {
                    slot -= ps;
                    ++column;
                }
            }
        } else {
#pragma unroll
            for (int c = tid; c < ROWS * CHUNKS; c += THREADS) {
                const int r = c / CHUNKS, j = key0 + r;
                copy(r, (c % CHUNKS) * 8, j / ps, j % ps);
            }
        }
    }
}

// The parameters of sequence b of a ragged call as a dense call of its own (B = 1 at b = 0): Q, O and the
// LSE at its first packed row, K/V at its first packed key (varlen) or its block-table row (paged), its
// lengths, band and diagonal (seq_view). The LSE keeps its [Hq, total_q] rows (fa2_forward's `lse_ld`).
template <typename T, int SERVE>
__device__ __forceinline__ AttnParams fa2_sequence_params(const AttnParams& p, int b) {
    const SeqView s = seq_view(p, b);
    AttnParams r = p;
    r.q = static_cast<const T*>(p.q) + (i64)s.q0 * p.q_stride[2];
    r.o = static_cast<T*>(p.o) + (i64)s.q0 * p.o_stride[2];
    if (p.lse != nullptr) r.lse = p.lse + s.q0;
    if (SERVE == FA2_SERVE_PAGED) {
        r.block_table = p.block_table + (i64)b * p.max_pages;
    } else {
        r.k = static_cast<const T*>(p.k) + (i64)s.k0 * p.k_stride[2];
        r.v = static_cast<const T*>(p.v) + (i64)s.k0 * p.v_stride[2];
    }
    r.sq = s.sq;
    r.sk = s.sk;
    r.band_lo = s.band_lo;
    r.band_hi = s.band_hi;
    r.diag_offset = s.diag_offset;
    r.causal_offset = s.diag_offset;  // plain causal instantiations: key j <= i + diag
    return r;
}

// D: the head dim of Q and K, DV: of V and O, each a multiple of 16 (a head-dim class when PAD: the call's
// p.d <= D and p.dv <= DV columns are read, the rest zero-filled in shared memory, and only p.dv columns of O
// are stored).
template <int D, int DV, int BM, int BN, int NW, int STAGES>
struct Fa2Tile {
    static constexpr int ROWS_PER_WARP = BM / NW;
    static constexpr int MT = ROWS_PER_WARP / 16;  // m16 tiles per warp
    static constexpr int LD = D + 8;               // padded row length of Q and K, in elements
    static constexpr int LDV = DV + 8;             // of V and of the staged O rows
    static constexpr int SMEM_ELEMS = BM * LD + STAGES * BN * (LD + LDV);
    static_assert(ROWS_PER_WARP % 16 == 0, "each warp owns whole m16 tiles");
    static_assert(D % 16 == 0 && DV % 16 == 0 && BN % 16 == 0, "k16 steps");
    static_assert(STAGES >= 1, "one K/V buffer (FA2 order) or a ring of STAGES");
    static_assert(BM * LDV <= SMEM_ELEMS, "the epilogue stages O over the block's shared memory");
};

// Query tile m_block of head h in batch b of the call `p` (for ragged calls the sequence's own parameters,
// b = 0); `call` and `call_b` are the call's parameters and batch index, which the non-finite repair reads.
template <typename T, int D, int DV, int BM, int BN, int NW, int STAGES, int MASK, bool PAD, int VAR, int SERVE>
__device__ __forceinline__ void fa2_forward(const AttnParams& p, T* smem, int m_block, int h, int b,
                                            const AttnParams& call, int call_b) {
    using Tile = Fa2Tile<D, DV, BM, BN, NW, STAGES>;
    constexpr int MT = Tile::MT;
    constexpr int LD = Tile::LD;
    constexpr int LDV = Tile::LDV;
    constexpr int THREADS = NW * 32;
    constexpr int NT = BN / 8;   // n8 tiles of S per m16 tile
    constexpr int DT = DV / 8;   // n8 tiles of O per m16 tile
    constexpr unsigned K_BYTES = BN * LD * 2;   // one K buffer
    constexpr unsigned V_BYTES = BN * LDV * 2;  // one V buffer

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int kvh = h / p.group;
    const int m0 = m_block * BM;
    const int m_end = min(m0 + BM, p.sq);
    const int warp_row0 = warp * Tile::ROWS_PER_WARP;

    // Shared memory: Q [BM][LD], then STAGES x K [BN][LD], then STAGES x V [BN][LDV].
    const unsigned sQ = smem_addr(smem);
    const unsigned sK = sQ + BM * LD * 2;
    const unsigned sV = sK + STAGES * K_BYTES;
    // Per-lane ldmatrix bases; every fragment address is one of these plus a compile-time offset.
    const unsigned q_ld = sQ + ((warp_row0 + (lane % 16)) * LD + (lane / 16) * 8) * 2;
    const unsigned k_ld = sK + (((lane % 8) + (lane / 16) * 8) * LD + ((lane / 8) % 2) * 8) * 2;
    const unsigned v_ld = sV + (((lane % 8) + ((lane / 8) % 2) * 8) * LDV + (lane / 16) * 8) * 2;

    const T* q = static_cast<const T*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1] + (long long)m0 * p.q_stride[2];
    // Paged: the pool has no batch (its batch stride steps pages).
    const T* k = static_cast<const T*>(p.k) + (SERVE == FA2_SERVE_PAGED ? 0 : b * p.k_stride[0]) + kvh * p.k_stride[1];
    const T* v = static_cast<const T*>(p.v) + (SERVE == FA2_SERVE_PAGED ? 0 : b * p.v_stride[0]) + kvh * p.v_stride[1];
    // Copy width of the call's rows (padded instantiations; 16 for exact ones, which need aligned rows).
    const int rb = PAD ? fa2_row_bytes(p) : 16;
    // Row stride of the LSE: [B, Hq, Sq] dense, [Hq, total_q] ragged.
    const i64 lse_ld = SERVE == FA2_SERVE_DENSE ? p.sq : p.total_q;

    int t0, n_tiles;
    fa2_key_tiles<MASK, VAR, BN>(p, m0, m_end, t0, n_tiles);

    // One K/V tile (tile t into ring slot t % STAGES) or, with one buffer, K alone; a commit group each.
    auto load_kv = [&](int t) {
        const int n1 = (t0 + t) * BN;
        const unsigned slot = STAGES == 1 ? 0u : t % STAGES;
        fa2_load_keys<T, D, BN, THREADS, PAD, SERVE>(sK + slot * K_BYTES, k, p.k_stride, p, n1, tid, p.d, rb);
        if (STAGES > 1)
            fa2_load_keys<T, DV, BN, THREADS, PAD, SERVE>(sV + slot * V_BYTES, v, p.v_stride, p, n1, tid, p.dv, rb);
    };
    fa2_load_tile<T, D, BM, THREADS, PAD>(sQ, q, p.q_stride[2], m_end - m0, tid, p.d, rb);
    if (n_tiles > 0) load_kv(0);
    fa2_cp_async_commit();
    // The ring's other leading tiles, one group each (empty groups past the last tile keep the count).
#pragma unroll
    for (int t = 1; t < STAGES - 1; ++t) {
        if (t < n_tiles) load_kv(t);
        fa2_cp_async_commit();
    }

    float o[MT][DT][4];
    float m[MT][2], l[MT][2];
    fa2_init_state(o, m, l);
    const float sl2 = p.scale_log2;
    const float a2 = fa2_alibi_log2<VAR>(p, h);
    // ALiBi without softcap or explicit mask (RAWA) keeps raw scores, with the scale folded into the softmax's
    // exp2 as in plain kernels, and the bias in raw units (a2 / scale) where that is finite (`raw`; else log2
    // units, as the other variants). When no visible key lies right of its row's diagonal (causal masks,
    // windows with right = 0: `below`), -slope |j - diag(i)| = slope (j - ref) + slope (ref - diag(i)): the
    // key's part, relative to ref = diag(m0) so that it stays small where the weight is, is the start value
    // of the Q·Kᵀ accumulators (per tile: a few FMAs per thread, nothing per score), and the row's part,
    // which the softmax ignores, is added to the LSE at the end. Otherwise the |.| form runs on every tile.
    constexpr bool RAWA = (VAR & FA2_VAR_ALIBI) != 0 && (VAR & FA2_VAR_SOFTCAP) == 0 && MASK != FA2_MASK_EXPLICIT;
    constexpr bool PRE = Fa2Scaled<MASK, VAR>::PRE && !RAWA;
    constexpr int UPDATE = PRE ? FA2_MASK_EXPLICIT : FA2_MASK_NONE;
    const bool raw = RAWA && sl2 > 0.f && fabsf(a2) <= sl2 * 1e30f;
    const bool below = raw && p.band_hi <= p.diag_offset;
    const float a2raw = raw ? a2 / sl2 : 0.f;
    const float a2init = below ? a2raw : 0.f;                                    // bias in the accumulators
    const float a2pass = RAWA ? (raw ? (below ? 0.f : a2raw) : a2) : a2;         // bias in the score pass
    const float sl2pass = RAWA && raw ? 1.f : sl2;                               // pass: x * sl2pass
    const float sl2upd = RAWA && !raw ? 1.f : sl2;                               // softmax: exp2(x * sl2upd - m)

    for (int tile = 0; tile < n_tiles; ++tile) {
        const int n0 = (t0 + tile) * BN;
        const unsigned slot = STAGES == 1 ? 0u : tile % STAGES;
        // Groups committed so far: STAGES - 1 (or 1) before the loop and one per earlier tile; with at most
        // STAGES - 2 of them still in flight, this tile's group is complete.
        fa2_cp_async_wait<(STAGES > 2 ? STAGES - 2 : 0)>();
        __syncthreads();  // this tile's K (and Q) landed for everyone; everyone is done with the last tile
        if (STAGES == 1) {
            // FA2 order: V[tile] loads while S = Q K^T runs.
            fa2_load_keys<T, DV, BN, THREADS, PAD, SERVE>(sV, v, p.v_stride, p, n0, tid, p.dv, rb);
        } else if (tile + STAGES - 1 < n_tiles) {
            // Ring: tile + STAGES - 1 loads into the slot the last tile freed while this one is computed.
            load_kv(tile + STAGES - 1);
        }
        fa2_cp_async_commit();

        // S = Q K^T for this warp's rows.
        float s[MT][NT][4];
        if constexpr (RAWA) {
            // Key n0 + j * 8 + t4 * 2 + e starts at a2init (key - ref) (zero unless `below`).
            const float cb0 = a2init * (float)(n0 + t4 * 2 - m0 - p.diag_offset);
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float c = fmaf(a2init, (float)(j * 8 + e), cb0);
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) s[mt][j][e] = s[mt][j][e + 2] = c;
                }
        }
        fa2_qk<T, D, LD, MT, NT, RAWA>(s, q_ld, k_ld + slot * K_BYTES);

        if (STAGES == 1) {
            fa2_cp_async_wait<0>();
            __syncthreads();  // V[tile] landed; everyone is done reading K[tile]
            if (tile + 1 < n_tiles) {
                const int n1 = n0 + BN;
                fa2_load_keys<T, D, BN, THREADS, PAD, SERVE>(sK, k, p.k_stride, p, n1, tid, p.d, rb);
            }
            fa2_cp_async_commit();  // the next K loads during softmax and P V
        }

        // Mask (only tiles that cross the end of the keys or the diagonal, or explicit masks), then the online
        // softmax update and O += P V with P from registers.
        if constexpr (VAR == 0) {
            if (fa2_tile_needs_mask<MASK, BN>(p, n0, m0)) fa2_mask_scores<MASK, MT, NT>(s, p, b, h, m0 + warp_row0, n0, sl2, g, t4);
            fa2_softmax_update<MASK, MT, NT, DT>(s, m, l, o, sl2);
        } else {
            // Two copies of the score pass, so that tiles inside the band carry no band test (one with an
            // explicit mask: every tile runs it, and two copies of its mask loads spill).
            const bool edge = fa2_tile_crosses_band<BN>(p, n0, p.sk, m0, m_end - 1);
            const int row0 = m0 + warp_row0;
            if (MASK == FA2_MASK_EXPLICIT)
                fa2_variant_scores<MASK, VAR, MT, NT, RAWA>(s, p, b, h, row0, n0, sl2pass, a2pass, g, t4, edge);
            else if (edge)
                fa2_variant_scores<MASK, VAR, MT, NT, RAWA>(s, p, b, h, row0, n0, sl2pass, a2pass, g, t4, true);
            else if (PRE || (RAWA && !below))
                fa2_variant_scores<MASK, VAR, MT, NT, RAWA>(s, p, b, h, row0, n0, sl2pass, a2pass, g, t4, false);
            fa2_softmax_update<UPDATE, MT, NT, DT>(s, m, l, o, sl2upd);
        }
        fa2_pv<T, LDV, MT, NT, DT>(o, s, v_ld + slot * V_BYTES);
    }

    // Epilogue: normalise, stage this warp's rows in its own part of sQ, then 16-byte coalesced stores.
    fa2_cp_async_wait<0>();
    __syncthreads();  // no cp.async into sQ may still be in flight (n_tiles == 0 skips the loop)
    T* sO = smem + warp_row0 * LDV;
    bool bad = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const float lsum = quad_sum(l[mt][hh]);
            // NaN stays NaN (NaN == 0 is false); a row that saw no key is zeros with LSE -inf.
            const float inv = lsum == 0.f ? 0.f : 1.f / lsum;
            const int r = mt * 16 + g + hh * 8;
#pragma unroll
            for (int j = 0; j < DT; ++j) {
                const float x0 = o[mt][j][hh * 2] * inv, x1 = o[mt][j][hh * 2 + 1] * inv;
                *reinterpret_cast<unsigned*>(sO + r * LDV + j * 8 + t4 * 2) = Fa2Type<T>::pack(x0, x1);
                bad |= !isfinite(x0) || !isfinite(x1);
            }
            const int row = m0 + warp_row0 + r;
            if (p.lse != nullptr && t4 == 0 && row < p.sq) {
                // `below` ALiBi: the row's part of the bias, a2 (ref - diag(row)) = a2 (m0 - row).
                const float shift = below ? a2 * (float)(m0 - row) : 0.f;
                const float lse = lsum == 0.f ? fa2_neg_inf() : (m[mt][hh] + __log2f(lsum) + shift) * FA2_LN2;
                p.lse[((long long)b * p.hq + h) * lse_ld + row] = lse;
            }
        }
    __syncwarp();
    T* out = static_cast<T*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
    constexpr int CHUNKS = DV / 8;
    if (PAD && rb != 16) {
        fa2_store_rows_narrow_any<T, DV, Tile::ROWS_PER_WARP, LDV>(out + (long long)(m0 + warp_row0) * p.o_stride[2],
                                                                   p.o_stride[2], sO, p.sq - m0 - warp_row0, p.dv,
                                                                   lane, 32, rb);
    } else {
#pragma unroll
        for (int c = lane; c < Tile::ROWS_PER_WARP * CHUNKS; c += 32) {
            const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
            const int row = m0 + warp_row0 + r;
            if (row < p.sq && (!PAD || col < p.dv))
                *reinterpret_cast<uint4*>(out + (long long)row * p.o_stride[2] + col) =
                    *reinterpret_cast<const uint4*>(sO + r * LDV + col);
        }
    }
    // NaN or inf under a masked key must not reach rows that do not see it (common.cuh).
    repair_nonfinite_rows<T>(call, call_b, h, m0, SDPA_ONE_HEAD, m_end - m0, 0, p.dv, true, bad);
}

// A dense call: one block per (query tile, head, batch); causal and banded calls take the heaviest query
// tiles (last rows) first to shorten the tail.
template <typename T, int D, int DV, int BM, int BN, int NW, int STAGES, int MASK, bool PAD, int VAR>
__device__ __forceinline__ void fa2_dense(const AttnParams& p, T* smem) {
    const int m_block = (MASK == FA2_MASK_CAUSAL || VAR != 0) ? (gridDim.x - 1 - blockIdx.x) : blockIdx.x;
    fa2_forward<T, D, DV, BM, BN, NW, STAGES, MASK, PAD, VAR, FA2_SERVE_DENSE>(p, smem, m_block, blockIdx.y,
                                                                              blockIdx.z, p, blockIdx.z);
}

// A ragged call: block (x, h) runs entry x of the schedule, (sequence, query tile) pairs as int2.
template <typename T, int D, int DV, int BM, int BN, int NW, int STAGES, int MASK, bool PAD, int VAR, int SERVE>
__device__ __forceinline__ void fa2_ragged(const AttnParams& p, T* smem) {
    const int2 e = static_cast<const int2*>(p.workspace)[blockIdx.x];
    const AttnParams seq = fa2_sequence_params<T, SERVE>(p, e.x);
    fa2_forward<T, D, DV, BM, BN, NW, STAGES, MASK, PAD, VAR, SERVE>(seq, smem, e.y, blockIdx.y, 0, p, e.x);
}

// One entry point: NAME runs the kernel for element type T, head dims D (Q, K) and DV (V, O) and a tile (BM
// query rows, BN keys, warps, K/V stages, min blocks per SM) under mask MASK; PAD when the call's head dims
// are below D or DV (head-dim classes). Each entry is its own NVRTC program: the launcher (src/kernels/fa2.rs,
// `head_dim_classes`, `tile_for` and `choose_tile`, the tiles measured on the H100) writes the one line that
// instantiates what a call needs. FA2_ENTRY is the common case, D == DV exactly.
#define FA2_ENTRY_DV(NAME, T, D, DV, BM, BN, NW, ST, MINB, MASK, PAD)                                  \
    extern "C" __global__ void __launch_bounds__(NW * 32, MINB) NAME(const AttnParams p) {            \
        extern __shared__ __align__(16) unsigned char fa2_smem[];                                     \
        fa2_dense<T, D, DV, BM, BN, NW, ST, MASK, PAD, 0>(p, reinterpret_cast<T*>(fa2_smem));          \
    }
#define FA2_ENTRY(NAME, T, D, BM, BN, NW, ST, MINB, MASK) FA2_ENTRY_DV(NAME, T, D, D, BM, BN, NW, ST, MINB, MASK, false)
// Variant instantiations (issue 22): VAR is a bit set of FA2_VAR_* (fa2_mma.cuh), MASK none or explicit.
#define FA2_ENTRY_VAR(NAME, T, D, DV, BM, BN, NW, ST, MINB, MASK, PAD, VAR)                            \
    extern "C" __global__ void __launch_bounds__(NW * 32, MINB) NAME(const AttnParams p) {            \
        extern __shared__ __align__(16) unsigned char fa2_smem[];                                     \
        fa2_dense<T, D, DV, BM, BN, NW, ST, MASK, PAD, VAR>(p, reinterpret_cast<T*>(fa2_smem));       \
    }
// Ragged instantiations (issue 23): SERVE is FA2_SERVE_VARLEN or FA2_SERVE_PAGED, VAR 0 or a variant set,
// MASK none or causal (explicit masks are refused with ragged batches).
#define FA2_ENTRY_SERVE(NAME, T, D, DV, BM, BN, NW, ST, MINB, MASK, PAD, VAR, SERVE)                   \
    extern "C" __global__ void __launch_bounds__(NW * 32, MINB) NAME(const AttnParams p) {            \
        extern __shared__ __align__(16) unsigned char fa2_smem[];                                     \
        fa2_ragged<T, D, DV, BM, BN, NW, ST, MASK, PAD, VAR, SERVE>(p, reinterpret_cast<T*>(fa2_smem)); \
    }
