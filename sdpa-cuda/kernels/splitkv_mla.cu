// Split-KV decoding at MLA's head dims (DeepSeek's absorbed attention: D = 576 for Q·Kᵀ, Dv = 512 for P·V,
// many query heads on one kv head), fused, for sm_90 (issue 21: MLA decoding at 80 % of the copy bandwidth).
//
// Why not splitkv.cu: there one warp owns a 16-row tile and its whole output row, 16 x Dv f32 in registers,
// which at Dv = 512 is 256 registers per lane before anything else. Here the NW = RW x CW warps of a block
// share R = 16·RW packed rows (the query heads of one kv head and their Sq positions, splitkv_row's
// order): warp (r, c) owns rows [16r, 16r + 16) and output columns [c·DV/CW, (c + 1)·DV/CW), and computes the
// scores of its rows for its KS/CW keys of each KS-key step. The row maxima go through shared memory (the
// CW warps of a row group then hold the same running max), the probabilities too (each warp multiplies
// all KS keys of the step into its own columns): two named barriers per step and row group, nothing
// computed twice.
//
// K and V stream by TMA into a STAGES-deep ring of [KS keys][64 columns] boxes in the 128-byte swizzle
// (splitkv.cu's TMA layout), issued by thread 0, completing on a `full` mbarrier per stage; each warp
// releases a stage on its `empty` mbarrier. Every block is one (row tile, split of the keys, batch and kv
// head); a row tile split over several blocks writes partials to scratch (splitkv_common.cuh's layout) and
// a second launch merges them, one block per row (splitkv_mla_combine). Keys outside the split that a step's
// boxes bring score -inf and their V rows are zeroed in registers, so that a NaN there (an unwritten page
// tail) cannot reach a row; a NaN or inf the rows do reach is handled as in every kernel (common.cuh's repair).
//
// Keys: every call's key band (causal masks in both alignments, windows; speculative decoding's Sq > 1 rows),
// dense batches, ragged ones with K/V packed or in a paged cache (a host schedule of chunks of about equal
// keys, splitkv.rs `ragged_units`). The host (src/kernels/splitkv_mla.rs) refuses explicit masks, softcap and
// ALiBi, which `auto` runs on `wide` (dense calls only).
#include "splitkv_common.cuh"

// Shared memory of one block (src/kernels/splitkv_mla.rs `MlaTile::smem_bytes` mirrors it), from a base
// aligned to 1024 bytes (the swizzle period) by hand: the ring (STAGES x (K boxes, V boxes)), the Q tile
// (R rows padded to D + 8 elements so that ldmatrix is conflict-free), P double-buffered (R rows of KS keys
// padded to KS + 8), the row maxima double-buffered ([2][NW][16] f32, reused for the row sums at the end),
// then the `full` and `empty` mbarriers.
template <int D, int DV, int RW, int CW, int KS, int STAGES>
struct MlaTile {
    static constexpr int NW = RW * CW, R = 16 * RW;
    static constexpr int KB = D / 64, VB = DV / 64;  // boxes per key row of K and of V
    static constexpr int BOX_BYTES = KS * 128;
    static constexpr int K_BYTES = KB * BOX_BYTES;
    static constexpr int STAGE_BYTES = (KB + VB) * BOX_BYTES;
    static constexpr int QLD = D + 8, PLD = KS + 8;
    static constexpr int Q_OFF = STAGES * STAGE_BYTES;
    static constexpr int P_OFF = Q_OFF + R * QLD * 2;
    static constexpr int RED_OFF = P_OFF + 2 * R * PLD * 2;
    static constexpr int BAR_OFF = RED_OFF + 2 * NW * 16 * 4;
    static constexpr int SMEM = 1024 + BAR_OFF + STAGES * 2 * 8;
    static constexpr int KSC = KS / CW;  // keys of a step whose scores one warp computes
    static constexpr int DVC = DV / CW;  // output columns of one warp
    static_assert(D % 64 == 0 && DV % 64 == 0, "whole 64-column boxes");
    static_assert(KSC == 8 || KSC == 16, "a warp scores one or two n8 tiles of keys per step");
    static_assert(DVC % 16 == 0 && KS % 16 == 0 && KS % 8 == 0, "whole ldmatrix tiles");
    static_assert(2 * NW * 16 >= CW * R, "the row-max buffer holds the row sums at the end");
    static_assert(SMEM <= 232448, "a block fits an H100's 227 KB");
};

// Named barrier of row group r (ids 1.. ; 0 is __syncthreads): its CW warps.
__device__ __forceinline__ void mla_row_sync(int r, int cw) {
    asm volatile("bar.sync %0, %1;" ::"r"(1 + r), "r"(cw * 32) : "memory");
}

// The TMA entries' parameter (src/kernels/splitkv_mla.rs `MlaArgs` mirrors it): AttnParams; a ragged call's
// schedule (SKV_UNIT_INTS ints per unit, splitkv.rs `ragged_units`) and its per-sequence (chunks, first
// partial slot) pairs for the combine, both null for a dense call; the partial slots of the scratch; padding
// to byte 384; the K and V maps.
// Dense maps run over (D, Sk, Hkv, B); varlen ones over the packed rows (D, total keys, Hkv, 1); paged ones
// over the pool (D, page size, Hkv, pages).
struct SplitKvMlaArgs {
    AttnParams p;
    const int* units;
    const int* seqs;
    long long parts;  // partial slots in the scratch (dense: B·Hq·Sq·splits)
    unsigned char pad[384 - sizeof(AttnParams) - 24];
    Sm90TensorMap k, v;
};
static_assert(sizeof(SplitKvMlaArgs) == 640, "SplitKvMlaArgs must match src/kernels/splitkv_mla.rs");

// BAND: the rows' key bands restrict the keys (causal masks, windows); otherwise every key below Sk is visible.
template <typename T, int D, int DV, int RW, int CW, int KS, int STAGES, bool BAND>
__device__ __forceinline__ void splitkv_mla_forward(const SplitKvMlaArgs& a, unsigned char* smem_raw) {
    using Tile = MlaTile<D, DV, RW, CW, KS, STAGES>;
    constexpr int NW = Tile::NW, R = Tile::R, KSC = Tile::KSC, DVC = Tile::DVC;
    constexpr int NT = KSC / 8;    // n8 tiles of scores per warp and step
    constexpr int OT = DVC / 8;    // n8 tiles of output per warp
    const AttnParams& p = a.p;
    const Sm90TensorMap* kmap = &a.k;
    const Sm90TensorMap* vmap = &a.v;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int wr = warp / CW, wc = warp % CW;  // row group, column slice

    // What the block computes. Dense grid: x = row group of the kv head's packed rows, y = split (block) of the
    // keys, z = batch x kv head. Ragged grid: x = unit x row groups (a unit: sequence b, chunk cidx of nblk,
    // its keys [kb, ke) and the sequence's first partial slot pbase), y = kv head.
    int b, kvh, rg, nblk, cidx, kb, ke;
    long long pbase;
    const bool ragged = a.units != nullptr;
    if (ragged) {
        const int rgs = max(1, p.num_splits);  // a ragged call's num_splits carries its row groups per unit
        const int* un = a.units + (long long)(blockIdx.x / rgs) * SKV_UNIT_INTS;
        rg = blockIdx.x % rgs;
        kvh = blockIdx.y;
        b = un[0], cidx = un[1], nblk = un[2], kb = un[3], ke = un[4];
        pbase = un[5];
    } else {
        rg = blockIdx.x;
        nblk = gridDim.y, cidx = blockIdx.y;
        b = blockIdx.z / p.hkv, kvh = blockIdx.z % p.hkv;
        kb = 0, ke = p.sk;
        pbase = (long long)b * p.hq * p.sq * nblk;
    }
    const SeqView sv = seq_view(p, b);
    const int rows = p.group * sv.sq;
    const int r0 = rg * R;
    if (r0 >= rows) return;  // past this sequence's rows (ragged: the grid has the widest sequence's)
    const int tile_rows = min(R, rows - r0);

    unsigned char* smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    const unsigned ring = smem_addr(smem);
    const unsigned sQ = ring + Tile::Q_OFF, sP = ring + Tile::P_OFF;
    float* red = reinterpret_cast<float*>(smem + Tile::RED_OFF);
    const unsigned bars = ring + Tile::BAR_OFF;
    auto full_bar = [&](int s) { return bars + s * 8; };
    auto empty_bar = [&](int s) { return bars + (STAGES + s) * 8; };

    // The block's keys: those its rows' bands reach, cut to the unit's [kb, ke) (dense: all keys), split cidx
    // of nblk taking [cidx·n/nblk, (cidx + 1)·n/nblk) of them (ragged: the unit is the split). Steps start at a
    // multiple of KS, so that no step's boxes straddle a page (keys before the split's first are masked).
    // The query positions the block's rows span (a row tile mixes heads: rows are g·Sq + i).
    int min_i = sv.sq, max_i = 0;
    if (BAND)
        for (int r = r0; r < r0 + tile_rows; ++r) max_i = max(max_i, r % sv.sq), min_i = min(min_i, r % sv.sq);
    int key_first = kb, key_end = ke;
    if (BAND) {
        key_first = max(key_first, min_i + sv.band_lo);
        key_end = min(key_end, max_i + sv.band_hi + 1);
    }
    key_first = max(0, key_first);
    key_end = max(key_first, min(key_end, sv.sk));
    const int span = key_end - key_first;
    const int k_begin = ragged ? key_first : key_first + (int)((long long)cidx * span / nblk);
    const int k_stop = ragged ? key_end : key_first + (int)((long long)(cidx + 1) * span / nblk);
    const int k_base = k_begin / KS * KS;
    const int n_steps = k_stop > k_begin ? (k_stop - k_base + KS - 1) / KS : 0;

    // Q tile: R packed rows of D columns by 16-byte cp.async, rows past the kv head's group zero-filled.
    constexpr int QCH = D / 8;
    for (int c = threadIdx.x; c < R * QCH; c += NW * 32) {
        const int rr = c / QCH, col = (c % QCH) * 8, r = r0 + rr;
        int hq = 0, i = 0;
        const bool ok = r < rows;
        if (ok) splitkv_row_of(sv.sq, p.group, kvh, r, hq, i);
        const T* src = static_cast<const T*>(p.q) + q_row_offset(p, p.q_stride, sv, b, hq, i) + col;
        fa2_cp_async16(sQ + (rr * Tile::QLD + col) * 2, ok ? src : p.q, ok);
    }
    fa2_cp_async_commit();

    const unsigned long long pol = sm90_l2_policy(p.extra & 0xff);
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            sm90_mbar_init(full_bar(s), 1);
            sm90_mbar_init(empty_bar(s), NW);
        }
        sm90_mbar_init_fence();
    }
    __syncthreads();  // barriers initialised before anyone waits on them or a copy completes on them
    // Paged: each 64-column box of a step comes as KS / BK boxes of BK = min(KS, page size) keys, each from its
    // page (the host allows page sizes that divide KS or are multiples of it); indices are clamped into the
    // table and the pool (kv_row_offset's rule), keys past the sequence being masked anyway.
    const bool paged = is_paged(p);
    const int bk = paged ? min(KS, p.page_size) : KS;
    auto load = [&](int step) {
        const int s = step % STAGES;
        const unsigned dst = ring + s * Tile::STAGE_BYTES;
        const int key0 = k_base + step * KS;
        sm90_mbar_expect(full_bar(s), Tile::STAGE_BYTES);
        for (int q = 0; q < KS / bk; ++q) {
            const int key = key0 + q * bk;
            int c1 = key, c3 = b;
            if (paged) {
                const int pi = min(key / p.page_size, p.max_pages - 1);
                c3 = (int)min(__ldg(p.block_table + (long long)b * p.max_pages + pi), (unsigned)(p.num_pages - 1));
                c1 = key % p.page_size;
            } else if (ragged) {
                c1 = sv.k0 + key, c3 = 0;
            }
            const unsigned off = q * bk * 128;
#pragma unroll
            for (int j = 0; j < Tile::KB; ++j)
                sm90_tma_load(dst + j * Tile::BOX_BYTES + off, kmap, j * 64, c1, kvh, c3, full_bar(s), pol);
#pragma unroll
            for (int j = 0; j < Tile::VB; ++j)
                sm90_tma_load(dst + Tile::K_BYTES + j * Tile::BOX_BYTES + off, vmap, j * 64, c1, kvh, c3, full_bar(s), pol);
        }
    };
    if (threadIdx.x == 0)
        for (int s = 0; s < STAGES - 1 && s < n_steps; ++s) load(s);
    fa2_cp_async_wait<0>();
    __syncthreads();  // every thread's part of Q

    // This warp's rows; a row group wholly past the kv head's rows only keeps the ring turning.
    const bool active = r0 + wr * 16 < rows;
    int row_i[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        int hq;
        splitkv_row_of(sv.sq, p.group, kvh, min(r0 + wr * 16 + g + hh * 8, rows - 1), hq, row_i[hh]);
    }

    // ldmatrix addresses. Q (A of Q·Kᵀ): rows lane % 16, 8-column half lane / 16. K (B of Q·Kᵀ, rows =
    // keys): 16-byte chunk c of key row k sits at box c / 8, chunk (c % 8) ^ (k % 8); this warp's keys
    // start at a multiple of 8, so k % 8 = lane % 8. P (A of P·V): rows lane % 16 of the row group's 16,
    // half lane / 16. V (B of P·V, transposed): key row (lane % 8) + ((lane / 8) % 2)·8, 8-column half lane / 16.
    const unsigned q_ld = sQ + ((wr * 16 + lane % 16) * Tile::QLD + (lane / 16) * 8) * 2;
    const unsigned p_ld = sP + ((wr * 16 + lane % 16) * Tile::PLD + (lane / 16) * 8) * 2;
    const int v_row = (lane % 8) + ((lane / 8) % 2) * 8, v_half = lane / 16;

    float o[OT][4];
#pragma unroll
    for (int j = 0; j < OT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m[2] = {fa2_neg_inf(), fa2_neg_inf()}, l[2] = {0.f, 0.f};
    const float sl2 = p.scale_log2;
    // Keys every row of the block sees: a step inside [band_safe_lo, band_safe_hi] needs no band test.
    const int band_safe_lo = max_i + sv.band_lo, band_safe_hi = min_i + sv.band_hi;  // read when BAND only

    for (int step = 0; step < n_steps; ++step) {
        const int st = step % STAGES, par = step & 1;
        // Thread 0 refills the stage step - 1 used once every warp released it.
        if (threadIdx.x == 0 && step + STAGES - 1 < n_steps) {
            if (step > 0) sm90_mbar_wait(empty_bar((step - 1) % STAGES), ((step - 1) / STAGES) & 1);
            load(step + STAGES - 1);
        }
        sm90_mbar_wait(full_bar(st), (step / STAGES) & 1);
        if (!active) {
            __syncwarp();
            if (lane == 0) sm90_mbar_arrive(empty_bar(st));
            continue;
        }
        const unsigned kst = ring + st * Tile::STAGE_BYTES;
        const int key0 = k_base + step * KS;

        // Scores of this warp's KSC keys, over D in independent accumulator chains (two per n8 tile, summed
        // after) so that consecutive mma do not wait on each other: 36 k16 steps in one chain would.
        float s[NT][4], s2[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = s2[j][0] = s2[j][1] = s2[j][2] = s2[j][3] = 0.f;
        const unsigned k_rows = kst + (wc * KSC) * 128;
        if constexpr (KSC == 16) {
            // x4: keys 0-7 and 8-15 of the warp, both 8-column halves of one k16 step; even steps into s,
            // odd ones into s2.
            const int k_row = (lane % 8) + (lane / 16) * 8, k_half = (lane / 8) % 2;
            auto k16 = [&](int kk, float (&acc)[NT][4]) {
                unsigned a[4], bk[4];
                fa2_ldmatrix_x4(a, q_ld + kk * 32);
                const int c = kk * 2 + k_half;
                fa2_ldmatrix_x4(bk, k_rows + (c / 8) * Tile::BOX_BYTES + k_row * 128 + (((c % 8) ^ (lane % 8)) << 4));
                Fa2Type<T>::mma(acc[0], a, bk[0], bk[1]);
                Fa2Type<T>::mma(acc[NT - 1], a, bk[2], bk[3]);
            };
            static_assert(D % 32 == 0, "k16 steps in pairs");
#pragma unroll 2
            for (int kk = 0; kk < D / 16; kk += 2) {
                k16(kk, s);
                k16(kk + 1, s2);
            }
        } else {
            // x4: the warp's 8 keys over two k16 steps (four 8-column chunks), the first into s, the second
            // into s2.
#pragma unroll 4
            for (int k2 = 0; k2 < D / 32; ++k2) {
                unsigned a0[4], a1[4], bk[4];
                fa2_ldmatrix_x4(a0, q_ld + k2 * 64);
                fa2_ldmatrix_x4(a1, q_ld + k2 * 64 + 32);
                const int c = k2 * 4 + lane / 8;
                fa2_ldmatrix_x4(bk, k_rows + (c / 8) * Tile::BOX_BYTES + (lane % 8) * 128 + (((c % 8) ^ (lane % 8)) << 4));
                Fa2Type<T>::mma(s[0], a0, bk[0], bk[1]);
                Fa2Type<T>::mma(s2[0], a1, bk[2], bk[3]);
            }
        }
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] += s2[j][e];
        // Keys outside the split (the neighbours' keys a step's boxes bring, TMA's zeros past the keys) and
        // keys outside a row's band (causal masks, windows). Only edge steps pay for the test.
        const bool edge = key0 < k_begin || key0 + KS > k_stop ||
                          (BAND && !(key0 >= band_safe_lo && key0 + KS - 1 <= band_safe_hi));
        if (edge) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh)
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int key = key0 + wc * KSC + j * 8 + t4 * 2 + e;
                        bool vis = key >= k_begin && key < k_stop;
                        if (BAND) vis = vis && key >= row_i[hh] + sv.band_lo && key <= row_i[hh] + sv.band_hi;
                        if (!vis) s[j][hh * 2 + e] = fa2_neg_inf();
                    }
        }
        // The row group's max over the step's keys: this warp's, through shared memory to the others.
        float* red_step = red + par * NW * 16;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const float mx = fa2_row_max(s, hh);
            if (t4 == 0) red_step[warp * 16 + g + hh * 8] = mx;
        }
        mla_row_sync(wr, CW);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            float mx = fa2_neg_inf();
#pragma unroll
            for (int c = 0; c < CW; ++c) mx = fmaxf(mx, red_step[(wr * CW + c) * 16 + g + hh * 8]);
            fa2_softmax_row<FA2_MASK_NONE>(s, hh, mx, m[hh], l[hh], o, sl2);
        }
        // P of this warp's keys into the row group's P buffer of this step.
        const unsigned p_step = sP + par * R * Tile::PLD * 2;
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const unsigned at = p_step + ((wr * 16 + g + hh * 8) * Tile::PLD + wc * KSC + j * 8 + t4 * 2) * 2;
                asm volatile("st.shared.u32 [%0], %1;" ::"r"(at), "r"(Fa2Type<T>::pack(s[j][hh * 2], s[j][hh * 2 + 1]))
                             : "memory");
            }
        mla_row_sync(wr, CW);
        // O += P·V over the step's KS keys, this warp's DVC columns. On steps that reach past the split, V's
        // rows of keys outside [k_begin, k_stop) are zeroed in the B fragments: their P is 0, but 0·NaN would
        // make the row NaN (unwritten slots in a page's tail, a neighbouring sequence's or split's rows) and
        // send it to the slow exact repair. Lane (g, t4)'s fragments hold keys 2·t4, 2·t4 + 1 (bv[0], bv[2]) and
        // 8 + 2·t4, 9 + 2·t4 (bv[1], bv[3]) of the k16 step, the lower key in the low half.
        const unsigned v_rows = kst + Tile::K_BYTES + v_row * 128;
        const bool v_edge = key0 < k_begin || key0 + KS > k_stop;
#pragma unroll
        for (int kk = 0; kk < KS / 16; ++kk) {
            unsigned a[4];
            fa2_ldmatrix_x4(a, p_ld + par * R * Tile::PLD * 2 + kk * 32);
            unsigned vm0 = 0xffffffffu, vm1 = 0xffffffffu;
            if (v_edge) {
                auto in = [&](int k) { return k >= k_begin && k < k_stop; };
                const int k0 = key0 + kk * 16 + 2 * t4;
                vm0 = (in(k0) ? 0xffffu : 0u) | (in(k0 + 1) ? 0xffff0000u : 0u);
                vm1 = (in(k0 + 8) ? 0xffffu : 0u) | (in(k0 + 9) ? 0xffff0000u : 0u);
            }
#pragma unroll
            for (int dp = 0; dp < OT / 2; ++dp) {
                const int c = (wc * DVC) / 8 + dp * 2 + v_half;  // 16-byte chunk of V's row
                unsigned bv[4];
                fa2_ldmatrix_x4_trans(bv, v_rows + kk * 16 * 128 + (c / 8) * Tile::BOX_BYTES + (((c % 8) ^ (lane % 8)) << 4));
                if (v_edge) bv[0] &= vm0, bv[1] &= vm1, bv[2] &= vm0, bv[3] &= vm1;
                Fa2Type<T>::mma(o[2 * dp], a, bv[0], bv[1]);
                Fa2Type<T>::mma(o[2 * dp + 1], a, bv[2], bv[3]);
            }
        }
        __syncwarp();
        if (lane == 0) sm90_mbar_arrive(empty_bar(st));
    }

    // Row sums: each warp summed its own keys (with the row group's common max), so they add up.
    __syncthreads();  // every warp is done with the row maxima
    float* lsum_s = red;  // [CW][R]
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const float ls = quad_sum(l[hh]);
        if (t4 == 0) lsum_s[wc * R + wr * 16 + g + hh * 8] = ls;
    }
    __syncthreads();
    bool bad = false;
    const long long parts = a.parts;
    if (active) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int rr = wr * 16 + g + hh * 8;
            if (rr >= tile_rows) continue;
            float ls = 0.f;
#pragma unroll
            for (int c = 0; c < CW; ++c) ls += lsum_s[c * R + rr];
            const float inv = ls == 0.f ? 0.f : 1.f / ls;
            const float lse = ls == 0.f ? fa2_neg_inf() : (m[hh] + __log2f(ls)) * FA2_LN2;
            int hq, i;
            splitkv_row_of(sv.sq, p.group, kvh, r0 + rr, hq, i);
            if (nblk == 1) {
                T* dst = static_cast<T*>(p.o) + q_row_offset(p, p.o_stride, sv, b, hq, i) + wc * DVC;
#pragma unroll
                for (int j = 0; j < OT; ++j) {
                    const float x = o[j][hh * 2] * inv, y = o[j][hh * 2 + 1] * inv;
                    *reinterpret_cast<unsigned*>(dst + j * 8 + t4 * 2) = Fa2Type<T>::pack(x, y);
                    bad |= !isfinite(x) || !isfinite(y);
                }
                if (p.lse != nullptr && wc == 0 && t4 == 0) p.lse[lse_row(p, sv, b, hq, i)] = lse;
            } else {
                const long long slot = pbase + ((long long)hq * sv.sq + i) * nblk + cidx;
                float* dst = splitkv_part_o(p, parts) + slot * DV + wc * DVC;
#pragma unroll
                for (int j = 0; j < OT; ++j)
                    *reinterpret_cast<float2*>(dst + j * 8 + t4 * 2) = make_float2(o[j][hh * 2] * inv, o[j][hh * 2 + 1] * inv);
                if (wc == 0 && t4 == 0) splitkv_part_lse(p)[slot] = lse;
            }
        }
    }
    // One block per row tile: its output, repaired where non-finite. Several: partials only; the combine
    // launch merges them.
    if (nblk == 1) repair_nonfinite_rows<T>(p, b, kvh * p.group, r0, sv.sq, tile_rows, 0, p.dv, true, bad);
}

// The merge of a row tile's partials (sdpa-core's merge_normalized rule, as splitkv_merge), a second launch after
// the forward when its row tiles were split over several blocks (p.num_splits of them, or a ragged call's
// per-sequence count from SplitKvMlaCombineArgs::seqs): one block of G x DV / 4
// threads per query row (blockIdx.x = h·Sq + i of batch blockIdx.y; G = blockDim.x / (DV / 4), 1 to
// MLA_COMBINE_GROUPS, chosen by the host from the split count). Warp 0 reads the row's partial LSEs into shared
// memory with their max and the sum of their weights; then thread group g adds the partials s = g, g + G, ... of
// its four columns, every load independent of the others, and group 0 adds up the groups. Merging in the forward's
// last block to finish, as splitkv.cu does, put all of a row tile's rows x Dv x splits loads on one block (H100:
// 170 us of a 16-head, 32k-key call at 128 splits); one 128-thread block per row with the loads in series was still
// latency-bound at 128 splits, and four groups over a few splits leave too few blocks resident for calls of many
// rows. Dynamic shared memory (src/kernels/splitkv_mla.rs `combine_smem_bytes`): the other groups' sums
// [MLA_COMBINE_GROUPS - 1][DV / 4] float4, three statistics padded to 16 bytes, one weight per split.
#define MLA_COMBINE_GROUPS 4
// The combine's parameter (src/kernels/splitkv.rs `TableArgs`): AttnParams (num_splits: the splits of a
// dense call), a ragged call's per-sequence (chunks, first partial slot) pairs (null when dense), the partial
// slots of the scratch.
struct SplitKvMlaCombineArgs {
    AttnParams p;
    const int* seqs;
    long long parts;
};
template <typename T, int DV>
__device__ __forceinline__ void splitkv_mla_combine(const SplitKvMlaCombineArgs& a) {
    const AttnParams& p = a.p;
    extern __shared__ __align__(16) unsigned char mla_combine_smem[];
    constexpr int CT = DV / 4;  // threads of a group: four columns each
    float4* part = reinterpret_cast<float4*>(mla_combine_smem);                  // [GROUPS - 1][CT]
    float* stat = reinterpret_cast<float*>(part + (MLA_COMBINE_GROUPS - 1) * CT);  // max, total, NaN seen
    float* w = stat + 4;                                                          // [nblk] LSEs, then weights
    // Block (x, b): head x / per_head, row x % per_head of sequence (batch entry) b; per_head is Sq, or the
    // widest sequence's rows of a ragged call. Rows past the sequence, and sequences in one chunk (their
    // output is written), have nothing to merge.
    const int b = blockIdx.y, per_head = gridDim.x / p.hq;
    const int hq = blockIdx.x / per_head, i = blockIdx.x % per_head;
    const SeqView sv = seq_view(p, b);
    const int nblk = a.seqs != nullptr ? a.seqs[2 * b] : p.num_splits;
    const long long base = a.seqs != nullptr ? a.seqs[2 * b + 1] : (long long)b * p.hq * p.sq * nblk;
    if (i >= sv.sq || nblk <= 1) return;
    const long long parts = a.parts;
    const long long first = base + ((long long)hq * sv.sq + i) * nblk;
    const int groups = blockDim.x / CT, grp = threadIdx.x / CT, c = (threadIdx.x % CT) * 4;
    if (threadIdx.x < 32) {
        float mx = fa2_neg_inf();
        bool nan = false;
        for (int s = threadIdx.x; s < nblk; s += 32) {
            const float x = __ldcg(splitkv_part_lse(p) + first + s);
            w[s] = x;
            nan |= x != x;
            mx = fmaxf(mx, x);
        }
        mx = warp_max(mx);
        nan = __any_sync(0xffffffffu, nan);
        float total = 0.f;
        for (int s = threadIdx.x; s < nblk; s += 32) {
            const float e = mx == fa2_neg_inf() ? 0.f : expf(w[s] - mx);
            w[s] = e;
            total += e;
        }
        total = warp_sum(total);
        if (threadIdx.x == 0) stat[0] = mx, stat[1] = total, stat[2] = nan ? 1.f : 0.f;
    }
    __syncthreads();
    const float* po = splitkv_part_o(p, parts) + first * DV + c;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
    for (int s = grp; s < nblk; s += groups) {
        const float e = w[s];
        const float4 o = __ldcg(reinterpret_cast<const float4*>(po + (long long)s * DV));
        acc.x += e * o.x;
        acc.y += e * o.y;
        acc.z += e * o.z;
        acc.w += e * o.w;
    }
    if (grp > 0) part[(grp - 1) * CT + threadIdx.x % CT] = acc;
    __syncthreads();
    bool bad = false;
    if (grp == 0) {
#pragma unroll
        for (int g = 0; g < MLA_COMBINE_GROUPS - 1; ++g) {
            if (g + 1 >= groups) break;
            const float4 o = part[g * CT + threadIdx.x];
            acc.x += o.x, acc.y += o.y, acc.z += o.z, acc.w += o.w;
        }
        const float mx = stat[0], total = stat[1];
        float4 v;
        float lse;
        if (stat[2] != 0.f) {  // a NaN partial: the row is NaN (merge_normalized)
            const float q = __int_as_float(0x7fffffff);
            v = make_float4(q, q, q, q);
            lse = q;
        } else if (mx == fa2_neg_inf()) {  // no split saw a key
            v = make_float4(0.f, 0.f, 0.f, 0.f);
            lse = fa2_neg_inf();
        } else {
            const float inv = 1.f / total;
            v = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
            lse = mx + logf(total);
        }
        splitkv_store4<false>(static_cast<T*>(p.o) + q_row_offset(p, p.o_stride, sv, b, hq, i) + c, v, 4);
        if (p.lse != nullptr && threadIdx.x == 0) p.lse[lse_row(p, sv, b, hq, i)] = lse;
        bad = !isfinite(v.x) || !isfinite(v.y) || !isfinite(v.z) || !isfinite(v.w);
    }
    repair_nonfinite_rows<T>(p, b, hq, i, SDPA_ONE_HEAD, 1, 0, p.dv, true, bad);
}

// Entry points splitkv_mla_{dtype}_{D}_{DV}_{none|band}_r{R} (SplitKvMlaArgs) and splitkv_mla_combine_{dtype}_{DV}
// (SplitKvMlaCombineArgs); src/kernels/splitkv_mla.rs writes the line a call needs. Compiled for an
// architecture without TMA the forward traps; the host launches it on compute capability 9.0 only.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SPLITKV_MLA_BODY(T, D, DV, RW, CW, KS, STAGES, BAND)                                          \
    extern __shared__ __align__(16) unsigned char splitkv_mla_smem[];                                 \
    splitkv_mla_forward<T, D, DV, RW, CW, KS, STAGES, BAND>(a, splitkv_mla_smem);
#else
#define SPLITKV_MLA_BODY(T, D, DV, RW, CW, KS, STAGES, BAND) asm volatile("trap;");
#endif
#define SPLITKV_MLA_ENTRY(NAME, T, D, DV, RW, CW, KS, STAGES, BAND)                                       \
    extern "C" __global__ void __launch_bounds__(RW * CW * 32) NAME(const __grid_constant__ SplitKvMlaArgs a) { \
        SPLITKV_MLA_BODY(T, D, DV, RW, CW, KS, STAGES, BAND)                                              \
    }
#define SPLITKV_MLA_COMBINE_ENTRY(NAME, T, DV)                                                                  \
    extern "C" __global__ void __launch_bounds__(MLA_COMBINE_GROUPS * DV / 4) NAME(const SplitKvMlaCombineArgs a) { \
        splitkv_mla_combine<T, DV>(a);                                                                           \
    }
