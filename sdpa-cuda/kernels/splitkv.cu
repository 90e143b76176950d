// Split-KV (flash-decoding) forward on tensor cores, with its combine folded into the same launch.
//
// When B·Hq·ceil(Sq/BM) blocks cannot fill the GPU (one new token, small batch, long context), the keys
// are split instead: every warp is one split. A warp owns a 16-row tile of the rows that share one kv head,
// packed group-major (row r = g·Sq + i is query i of head kvh·group + g), so GQA heads read their K/V once.
// How K/V reach shared memory (LOAD, chosen by src/kernels/splitkv.rs):
//  - on sm_90 by TMA (SKV_TMA, the default there): one thread issues 2-D tensor copies of the block's whole
//    chunk of NW·KS keys into a STAGES-deep ring the warps share, completing on a `full` mbarrier per stage;
//    each warp computes its KS-key slice and releases the stage on an `empty` mbarrier;
//    head-dim classes run there too, at the class rounded up to whole boxes (64 columns, or 32 for D = 96),
//    the maps carrying the call's widths so that TMA zero-fills the columns past them (PAD);
//  - on sm_90 where no tensor map fits the layout, by 1-D bulk copies (SKV_BULK: one `cp.async.bulk` per K
//    or V row into each warp's private ring);
//  - elsewhere with 16-byte `cp.async` per lane (SKV_CP_ASYNC), each warp through its private ring.
// The NW warps of a block are NW consecutive splits of one row tile. When they are done, the block merges
// their partials in shared memory; if the row tile has one block, that is the output. Otherwise the block
// writes one partial (normalised output + LSE) per row, and the last block of the row tile to finish (an
// atomic counter per row tile, reset by that block for the next call) merges the blocks' partials. Both
// merges use exactly sdpa-core's `merge_normalized` rule: one launch, no separate combine pass.
#include "splitkv_common.cuh"

// LOAD: how the K/V rings are filled.
#define SKV_CP_ASYNC 0  // 16-byte cp.async per lane (every architecture)
#define SKV_BULK 1      // sm_90: one 1-D cp.async.bulk per K or V row, each lane its own rows
#define SKV_TMA 2       // sm_90: 2-D tensor copies (TMA) of the block's whole K/V chunk, one per box

// Shared memory. cp.async and bulk paths: per warp, its Q tile (rows padded to D + 8 so ldmatrix is
// conflict-free) then its STAGES-deep K/V ring, padded the same way. TMA path: one ring for the block,
// unpadded: stage s holds the block's K chunk of NW·KS keys then its V chunk, each as D/BOXC boxes of
// [NW·KS keys][BOXC columns]: 64 columns in the 128-byte swizzle (16-byte chunk c of key row r at chunk
// c ^ (r % 8)) where D is whole 64-column boxes, else 32 columns in the 64-byte swizzle (chunk c of row r at
// c ^ ((r / 2) % 4)), so that D = 96 (and D = 80, run there) fills no stage with zero columns and the
// ring holds a stage more; warp w reads keys [w·KS, (w + 1)·KS) of every chunk. Boxes are whole swizzle
// periods (1024 or 512 bytes; the block's base is aligned to 1024 by hand, hence ALIGN_SLACK). Then one padded Q tile that the block's
// warps share (they are splits of the same rows). The mbarriers come last. In every layout warp w's
// partials reuse bytes [w·WARP_ELEMS + RING_OFF, ...) once the ring is drained.
template <int D, int STAGES, int KS, int LOAD>
struct SplitKvTile {
    static constexpr bool TMA = LOAD == SKV_TMA;
    static constexpr int BOXC = D % 64 == 0 ? 64 : 32;                // TMA box columns (the swizzle's row)
    static constexpr int QLD = D + 8;                                 // Q row, elements
    static constexpr int LD = TMA ? D : D + 8;                        // K/V ring row, elements
    static constexpr int Q_ELEMS = 16 * QLD;
    static constexpr int RING_ELEMS = 2 * STAGES * KS * LD;
    static constexpr int WARP_ELEMS = TMA ? RING_ELEMS : Q_ELEMS + RING_ELEMS;
    static constexpr int RING_OFF = TMA ? 0 : Q_ELEMS;                // the warp's partials reuse the ring
    static constexpr int SHARED_Q_ELEMS = TMA ? Q_ELEMS : 0;          // after the warps' regions
    static constexpr int ALIGN_SLACK = TMA ? 1024 : 0;
    static_assert(!TMA || KS % 8 == 0, "TMA boxes are whole swizzle periods (1024 or 512 bytes)");
    static_assert(KS % 16 == 0 && KS <= 32, "keys per step are whole k16 steps of P·V, one row per lane");
    static_assert(!TMA || D % BOXC == 0, "TMA tiles are whole 64-column (128-byte) or 32-column (64-byte) boxes");
    static_assert(RING_ELEMS * 2 >= (16 * D + 16) * 4, "the ring holds a warp's partials");
    // Dynamic shared memory of an NW-warp block: the warps' regions, then one 8-byte mbarrier per stage
    // and warp (src/kernels/splitkv.rs `SplitKvTile::smem_bytes` mirrors this).
    static constexpr int bars_off(int nw) { return nw * WARP_ELEMS + SHARED_Q_ELEMS; }  // elements
    static constexpr int smem_bytes(int nw) { return ALIGN_SLACK + bars_off(nw) * 2 + nw * STAGES * 8; }
};

// What one block computes: batch entry b; the keys [kb, ke) its splits share, cut to each row tile's band
// (dense: all keys); the splits of the row tile (ns) and the first of them this block's warps take
// (split0); where its partials go (partial slot of query row i of head h: pbase + (h·Sq + i)·nblk + cidx,
// nblk blocks per row tile, this one the cidx-th; `parts` in the whole scratch); where LSE rows go (lse0 +
// h·lse_hs + i). Dense calls derive it from the grid; ragged calls read it from the host's schedule.
struct SkvUnit {
    int b, kb, ke, split0, ns, nblk, cidx, lse_hs;
    long long pbase, parts, lse0;
};
__device__ __forceinline__ SkvUnit splitkv_dense_unit(const AttnParams& p, int nw) {
    SkvUnit u;
    u.b = blockIdx.z;
    u.kb = 0;
    u.ke = p.sk;
    u.split0 = blockIdx.x * nw;
    u.ns = p.num_splits;
    u.nblk = gridDim.x;
    u.cidx = blockIdx.x;
    u.pbase = (long long)u.b * p.hq * p.sq * u.nblk;
    u.parts = (long long)p.b * p.hq * p.sq * u.nblk;
    u.lse0 = (long long)u.b * p.hq * p.sq;
    u.lse_hs = p.sq;
    return u;
}

// ---- sm_90 bulk copies ----------------------------------------------------------------------------------

// The entry points take the bulk path exactly when compiled for sm_90 or newer (sm90_async.cuh).
#define SPLITKV_USE_BULK SM90_ASYNC_AVAILABLE

// Timeline trace for tuning runs (AttnParams::extra bit 8, set by src/kernels/splitkv.rs when SDPA_SPLITKV_TRACE=1;
// read back by the cuda_kernels driver's --trace, summarised by dev/splitkv_timeline.py): thread 0 of each
// of the first SKV_TRACE_BLOCKS blocks writes SKV_TRACE_FIELDS words: globaltimer (ns) at entry and at exit;
// clock64 at entry, after the first stage landed (TMA and bulk paths only; 0 on the cp.async path), after
// the key loop, after the block's partial was counted, and at exit; the SM id and 1 if the block merged its
// row tile (both 0 when a row tile has one block). Off, each point costs one uniform
// branch (same-run A/B on the H100: within 0.3 %, bench/results/gpu/fa2.md).
#define SKV_TRACE_BLOCKS 4096
#define SKV_TRACE_FIELDS 9
__device__ unsigned long long splitkv_trace[SKV_TRACE_BLOCKS * SKV_TRACE_FIELDS];
__device__ __forceinline__ unsigned long long skv_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ void skv_trace(const AttnParams& p, int field, unsigned long long v) {
    if (!(p.extra & 0x100) || threadIdx.x != 0) return;
    const unsigned blk = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    if (blk < SKV_TRACE_BLOCKS) splitkv_trace[blk * SKV_TRACE_FIELDS + field] = v;
}

// One step's K and V tiles (KS keys from key0, keys at or past k_stop and columns past d / dv zero-filled) of a
// padded call whose rows are not 16-byte aligned, in chunks of row_bytes (8, 4 or 2; fa2_row_bytes), by the 32
// lanes of a warp. Out of line: one body however many load sites the ring has. Never paged (the policy keeps
// paged caches on 16-byte rows).
template <typename T, int D, int KS, int LD, int E>
__device__ __forceinline__ void splitkv_load_kv_width(unsigned sK, unsigned sV, const T* kbase, const T* vbase,
                                                      long long ks, long long vs, int key0, int k_stop, int d, int dv,
                                                      int lane) {
    constexpr int KCH = D / E;
    if constexpr (E == 1) {
        auto at = [&](int c, const T* base, long long st, int cols) -> const unsigned short* {
            const int rr = c / KCH, col = c % KCH, key = key0 + rr;
            return key < k_stop && col < cols ? reinterpret_cast<const unsigned short*>(base + (long long)key * st + col)
                                              : nullptr;
        };
        auto to = [&](unsigned s0) { return [=](int c) { return s0 + ((c / KCH) * LD + c % KCH) * 2; }; };
        fa2_copy_elements<KS * KCH, 32>(lane, [&](int c) { return at(c, kbase, ks, d); }, to(sK));
        fa2_copy_elements<KS * KCH, 32>(lane, [&](int c) { return at(c, vbase, vs, dv); }, to(sV));
    } else {
#pragma unroll 4
        for (int c = lane; c < KS * KCH; c += 32) {
            const int rr = c / KCH, col = (c % KCH) * E, key = key0 + rr;
            const bool ok = key < k_stop;
            const long long kk = ok ? key : 0;
            const bool okk = ok && col < d, okv = ok && col < dv;
            fa2_copy_chunk<E, true>(sK + (rr * LD + col) * 2, okk ? kbase + kk * ks + col : kbase, okk);
            fa2_copy_chunk<E, true>(sV + (rr * LD + col) * 2, okv ? vbase + kk * vs + col : vbase, okv);
        }
    }
}
template <typename T, int D, int KS, int LD>
__device__ __noinline__ void splitkv_load_kv_narrow(unsigned sK, unsigned sV, const T* kbase, const T* vbase,
                                                    long long ks, long long vs, int key0, int k_stop, int d, int dv,
                                                    int lane, int row_bytes) {
    switch (row_bytes) {
        case 8: splitkv_load_kv_width<T, D, KS, LD, 4>(sK, sV, kbase, vbase, ks, vs, key0, k_stop, d, dv, lane); break;
        case 4: splitkv_load_kv_width<T, D, KS, LD, 2>(sK, sV, kbase, vbase, ks, vs, key0, k_stop, d, dv, lane); break;
        default: splitkv_load_kv_width<T, D, KS, LD, 1>(sK, sV, kbase, vbase, ks, vs, key0, k_stop, d, dv, lane); break;
    }
}

// INTERLEAVE: the NW warps of a block take turns over the block's key range in KS-key tiles (warp w reads
// tiles w, w + NW, ...), so the block streams K and V in contiguous NW·KS-key chunks; otherwise each warp
// reads its own contiguous split (NW times as many concurrent streams, each NW times longer). The bulk-copy
// entries interleave (B=1, Sk=32k: 1-2 % faster in the dev harness, within the spread through the Rust
// driver; bench/results/gpu/fa2.md); the cp.async entries, which take the long splits, keep contiguous splits
// (interleaving measured nothing there).
// `maps` (K then V) is read by the TMA path only; null otherwise. PAD: D is a head-dim class at or above the
// call's D and Dv (cp.async path), or that class rounded up to whole boxes (TMA path): columns past
// p.d (Q, K) and p.dv (V) are zero-filled in shared memory and O is stored to p.dv only.
// RAGGED: a ragged batch's block (splitkv_ragged_forward): `p` holds its sequence's lengths and band, Q/O
// (and packed K/V) pointers moved to its first row, so batch strides are not applied; paged K/V rows come
// through the block table. `u` says what the block computes (SkvUnit).
template <typename T, int D, int NW, int STAGES, int KS, int MASK, int LOAD, bool INTERLEAVE, bool PAD = false,
          int VAR = 0, bool RAGGED = false>
__device__ __forceinline__ void splitkv_forward(const AttnParams& p, T* smem, const Sm90TensorMap* kmap,
                                                const Sm90TensorMap* vmap, const SkvUnit& u) {
    static_assert(!PAD || LOAD != SKV_BULK, "padded head dims take the TMA or the cp.async path");
    static_assert(!RAGGED || LOAD == SKV_CP_ASYNC, "ragged batches take the cp.async path");
    using Tile = SplitKvTile<D, STAGES, KS, LOAD>;
    constexpr bool BULK = LOAD != SKV_CP_ASYNC;  // bulk or TMA: mbarrier-completed copies
    constexpr bool TMA = LOAD == SKV_TMA;
    constexpr int NT = KS / 8;  // n8 tiles of S per step
    constexpr int LD = Tile::LD;
    constexpr int BOXC = Tile::BOXC;
    constexpr int BOXB = BOXC * 2;  // bytes of one key's row in a box
    constexpr int DT = D / 8;
    constexpr int CHUNKS = D / 8;

    skv_trace(p, 0, skv_globaltimer());
    skv_trace(p, 2, clock64());
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, t4 = lane % 4;
    const int split = u.split0 + warp;
    const int m_tiles = gridDim.y / p.hkv;  // dense: ceil(G·Sq / 16); ragged: the batch's most
    const int kvh = blockIdx.y / m_tiles, r0 = (blockIdx.y % m_tiles) * 16;
    const int b = u.b;
    const int bb = RAGGED ? 0 : b;  // batch index applied through the batch strides
    const int rows = p.group * p.sq;

    if constexpr (TMA) {  // the swizzle pattern is periodic in 1024-byte-aligned addresses
        const unsigned mis = smem_addr(smem) & 1023u;
        smem = reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(smem) + ((1024u - mis) & 1023u));
    }
    // This warp's shared memory: Q [16][QLD] and STAGES x (K tile, V tile) (SplitKvTile).
    const unsigned sQ = smem_addr(smem + (TMA ? NW : warp) * Tile::WARP_ELEMS);
    const unsigned sKV = TMA ? smem_addr(smem) : sQ + Tile::RING_OFF * 2;
    // Keys of one stage's K (or V) as loaded: the block's chunk (TMA) or the warp's tile; K bytes of a
    // stage (V follows), and the bytes of a stage.
    constexpr int BOX_ROWS = TMA ? NW * KS : KS;
    constexpr unsigned TILE_BYTES = BOX_ROWS * LD * 2;
    constexpr unsigned STAGE_BYTES = 2 * TILE_BYTES;
    constexpr int QLD = Tile::QLD;
    const unsigned q_ld = sQ + ((lane % 16) * QLD + (lane / 16) * 8) * 2;
    // ldmatrix row addresses of K (rows = keys, 16-column chunks kk) and V (transposed: rows = keys, chunks
    // of 16 output columns). Padded rings: plain offsets. TMA rings: 16-byte chunk c of key row r is at
    // box c / CPB (CPB = BOXC / 8 chunks per box row), chunk (c % CPB) ^ swz(r) with swz(r) = r % 8 (128-byte
    // swizzle) or (r / 2) % 4 (64-byte); every lane's key row is lane % 8 modulo 8, so the XOR is a per-lane
    // constant and only the chunk's column part varies with kk (see k_off / v_off below).
    const int k_row = (lane % 8) + (lane / 16) * 8, k_half = (lane / 8) % 2;
    const int v_row = (lane % 8) + ((lane / 8) % 2) * 8, v_half = lane / 16;
    const unsigned k_ld = sKV + (TMA ? (warp * KS + k_row) * BOXB : (k_row * LD + k_half * 8) * 2);
    const unsigned v_ld = sKV + TILE_BYTES + (TMA ? (warp * KS + v_row) * BOXB : (v_row * LD + v_half * 8) * 2);
    constexpr int CPB = BOXC / 8, PPB = BOXC / 16;  // 16-byte chunks and 16-column chunk pairs per box row
    const unsigned swz = BOXC == 64 ? lane % 8 : (lane % 8) / 2;
    // Byte offset within a tile of 16-column chunk pair `cp` (columns 16·cp .. 16·cp + 15) for this lane,
    // the row part (keys) added separately.
    auto k_off = [&](int cp) -> unsigned {
        if constexpr (TMA) return (cp / PPB) * BOX_ROWS * BOXB + ((((cp % PPB) * 2 + k_half) ^ swz) << 4);
        else return cp * 32;
    };
    auto v_off = [&](int cp) -> unsigned {
        if constexpr (TMA) return (cp / PPB) * BOX_ROWS * BOXB + ((((cp % PPB) * 2 + v_half) ^ swz) << 4);
        else return cp * 32;
    };
    constexpr int ROW_BYTES = TMA ? BOXB : LD * 2;  // bytes between consecutive keys of a box / padded tile

    // Key range of this split, cut at the last key any row of the tile can see.
    int key_end = p.sk, key_first = 0, min_i = 0, max_i = 0;
    if (MASK == FA2_MASK_CAUSAL || VAR != 0) {
        min_i = p.sq;
        for (int r = r0; r < min(r0 + 16, rows); ++r) max_i = max(max_i, r % p.sq), min_i = min(min_i, r % p.sq);
    }
    if (MASK == FA2_MASK_CAUSAL) key_end = max(0, min(p.sk, max_i + 1 + p.causal_offset));
    // Variants: the splits share the keys of the tile's bands, [key_first, key_end), so that their number
    // and length follow the window, not Sk (src/kernels/splitkv.rs plans the count from the band too).
    if (VAR != 0) {
        fa2_band_keys(p, min_i, max_i, key_first, key_end);
        key_end = max(key_end, key_first);
    }
    // A ragged block's chunk of its sequence's keys.
    key_first = max(key_first, u.kb);
    key_end = max(key_first, min(key_end, u.ke));
    // Split s covers keys [s·Sk/n, (s+1)·Sk/n) of n = num_splits (variants: of the band's keys): any split
    // count divides the keys evenly (to within one key), whatever Sk is.
    // This warp's tiles start at k_begin + step·k_step and stop at k_stop. Warps past the last split (or
    // past the keys) get no steps, and still join the block's merge below.
    const int ns = u.ns;
    const int span = VAR != 0 ? key_end - key_first : p.sk;
    auto split_start = [&](int s) { return key_first + (int)((long long)min(s, ns) * span / ns); };
    const int k_begin = INTERLEAVE ? split_start(u.split0) + warp * KS : split_start(split);
    const int k_stop = min(key_end, INTERLEAVE ? split_start(u.split0 + NW) : split_start(split + 1));
    constexpr int k_step = INTERLEAVE ? NW * KS : KS;
    // TMA: every warp takes every step of the block's chunks (they share the stages), its quarter of the
    // last chunk possibly all past k_stop (masked).
    const int k_first = TMA ? k_begin - warp * KS : k_begin;
    const bool has_keys = (INTERLEAVE || split < ns) && k_stop > k_first;
    const int n_steps = has_keys ? (k_stop - k_first + k_step - 1) / k_step : 0;

    // Paged K/V: the batch stride steps pages, applied per key (page_offsets below).
    const bool paged = RAGGED && is_paged(p);
    const T* kbase = static_cast<const T*>(p.k) + (paged ? 0 : bb * p.k_stride[0]) + kvh * p.k_stride[1];
    const T* vbase = static_cast<const T*>(p.v) + (paged ? 0 : bb * p.v_stride[0]) + kvh * p.v_stride[1];

    // Copy width of the call's rows (fa2_row_bytes): padded instantiations load (and store) rows that are not
    // 16-byte aligned in narrower chunks; exact ones are launched with 16-byte rows only.
    const int rb = PAD ? fa2_row_bytes(p) : 16;
    // Q tile: 16 packed rows, zero rows past the group (TMA: one tile for the block, loaded by all warps).
    auto load_q = [&](auto w) {
        constexpr int E = decltype(w)::value, QCH = D / E;
        if constexpr (E == 1) {  // 2-byte rows (padded cp.async instantiations only), batched loads
            fa2_copy_elements<16 * QCH, 32>(
                lane,
                [&](int c) -> const unsigned short* {
                    const int rr = c / QCH, col = c % QCH, r = r0 + rr;
                    if (r >= rows || col >= p.d) return nullptr;
                    int hq, i;
                    splitkv_row(p, kvh, r, hq, i);
                    return reinterpret_cast<const unsigned short*>(static_cast<const T*>(p.q) + bb * p.q_stride[0] +
                                                                   hq * p.q_stride[1] + (long long)i * p.q_stride[2] + col);
                },
                [&](int c) { return sQ + ((c / QCH) * QLD + c % QCH) * 2; });
            return;
        }
        for (int c = TMA ? threadIdx.x : lane; c < 16 * QCH; c += TMA ? NW * 32 : 32) {
            const int rr = c / QCH, col = (c % QCH) * E, r = r0 + rr;
            int hq = 0, i = 0;
            const bool ok = r < rows && (!PAD || col < p.d);
            if (ok) splitkv_row(p, kvh, r, hq, i);
            const T* src = static_cast<const T*>(p.q) + bb * p.q_stride[0] + hq * p.q_stride[1] + (long long)i * p.q_stride[2] + col;
            fa2_copy_chunk<E>(sQ + (rr * QLD + col) * 2, ok ? src : static_cast<const T*>(p.q), ok);
        }
    };
    if constexpr (PAD) fa2_with_width(rb, load_q);
    else load_q(Fa2Width<8>{});
    fa2_cp_async_commit();

    // Bulk path: one mbarrier per stage of this warp, after every warp's region. Keys past the split's end copy its
    // last key instead of zeros (they score -inf, so p = 0 multiplies a finite value row). TMA: the block's
    // `full` barriers (one per stage: the chunk landed), then its `empty` barriers (every warp read it).
    const unsigned bars = smem_addr(smem + Tile::bars_off(NW)) + (TMA ? 0 : warp * STAGES * 8);
    auto empty_bar = [&](int s) { return bars + (STAGES + s) * 8; };
    unsigned long long pol = 0;
    if constexpr (BULK) {
        // L2 policy of the K/V loads: AttnParams::extra bits 0-7, chosen by src/kernels/splitkv.rs `l2_policy`.
        pol = sm90_l2_policy(p.extra & 0xff);
        if (TMA ? threadIdx.x == 0 : lane == 0)
            for (int s = 0; s < STAGES; ++s) {
                sm90_mbar_init(bars + s * 8, 1);
                if (TMA) sm90_mbar_init(empty_bar(s), NW);
            }
        sm90_mbar_init_fence();
        __syncwarp();
    }
    // TMA: thread 0 issues the chunk's K boxes and V boxes; keys past Sk arrive as zeros, keys past the
    // block's end but before Sk are the next block's (score -inf; their V rows are zeroed on arrival).
    // PAD: the maps carry the call's widths p.d and p.dv, so TMA zero-fills a box's columns past them;
    // boxes wholly past them (k_boxes, v_boxes) are never loaded and were zeroed once below.
    constexpr int NBOX = D / BOXC;  // boxes per key row
    constexpr int BOX_BYTES = BOX_ROWS * BOXB;
    const int k_boxes = PAD ? min(NBOX, (p.d + BOXC - 1) / BOXC) : NBOX;
    const int v_boxes = PAD ? min(NBOX, (p.dv + BOXC - 1) / BOXC) : NBOX;
    auto load_tma = [&](int step) {
        const int s = step % STAGES;
        const unsigned sK = sKV + s * STAGE_BYTES;
        const int key0 = k_first + step * k_step;
        if (threadIdx.x == 0) {
            sm90_mbar_expect(bars + s * 8, (k_boxes + v_boxes) * BOX_BYTES);
#pragma unroll
            for (int j = 0; j < NBOX; ++j) {
                if (j < k_boxes)
                    sm90_tma_load(sK + j * BOX_BYTES, kmap, j * BOXC, key0, kvh, b, bars + s * 8, pol);
                if (j < v_boxes)
                    sm90_tma_load(sK + TILE_BYTES + j * BOX_BYTES, vmap, j * BOXC, key0, kvh, b, bars + s * 8, pol);
            }
        }
    };
    if constexpr (TMA && PAD) {
        // Boxes no copy writes hold zeros in every stage, so that Q·Kᵀ adds nothing there and the unstored
        // columns of O stay finite (the non-finite vote reads every column). Ordered before the first
        // read by the block barrier after Q landed; no copy writes these bytes, so no proxy fence.
        const int dead_k = NBOX - k_boxes, dead = dead_k + NBOX - v_boxes;
        for (int x = threadIdx.x; x < STAGES * dead * (BOX_BYTES / 16); x += NW * 32) {
            const int s = x / (dead * (BOX_BYTES / 16)), y = x % (dead * (BOX_BYTES / 16));
            const int box = y / (BOX_BYTES / 16), c = y % (BOX_BYTES / 16);
            const unsigned at = sKV + s * STAGE_BYTES +
                                (box < dead_k ? (k_boxes + box) * BOX_BYTES
                                              : TILE_BYTES + (v_boxes + box - dead_k) * BOX_BYTES) + c * 16;
            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(at), "r"(0u) : "memory");
        }
    }
    auto load_bulk = [&](int step) {
        if constexpr (TMA) {
            load_tma(step);
            return;
        }
        const int s = step % STAGES;
        const unsigned sK = sKV + s * 2 * TILE_BYTES;
        const int key0 = k_begin + step * k_step;
        if (lane == 0) sm90_mbar_expect(bars + s * 8, 2 * KS * D * 2);
        __syncwarp();
        if (lane < KS) {
            const long long key = min(key0 + lane, k_stop - 1);
            sm90_bulk_copy(sK + lane * LD * 2, kbase + key * p.k_stride[2], D * 2, bars + s * 8, pol);
            sm90_bulk_copy(sK + TILE_BYTES + lane * LD * 2, vbase + key * p.v_stride[2], D * 2, bars + s * 8, pol);
        }
    };
    // Paged K/V: lane l < KS holds the K and V element offsets of key l of the next step to load, read
    // from the block table one step ahead so that the table's latency hides behind a step of math; the
    // loads take each row's offsets from its lane. Indices are clamped into the pool (kv_row_offset).
    long long pk = 0, pv = 0;
    auto page_offsets = [&](int step) {
        if constexpr (RAGGED) {
            const int key = k_begin + step * k_step + lane;
            if (paged && lane < KS && step < n_steps && key < k_stop) {
                const int pi = key / p.page_size;
                const unsigned page =
                    min(__ldg(p.block_table + (long long)b * p.max_pages + pi), (unsigned)(p.num_pages - 1));
                const long long slot = key - pi * p.page_size;
                pk = page * p.k_stride[0] + slot * p.k_stride[2];
                pv = page * p.v_stride[0] + slot * p.v_stride[2];
            }
        }
    };
    // K/V rows of 16-byte chunks; padded calls whose rows are not 16-byte aligned copy narrower chunks out of
    // line (splitkv_load_kv_narrow).
    auto load_kv_chunks = [&](unsigned sK, unsigned sV, int key0) {
        constexpr int KCH = D / 8;
#pragma unroll
        for (int c = lane; c < KS * KCH; c += 32) {
            const int rr = c / KCH, col = (c % KCH) * 8, key = key0 + rr;
            const bool ok = key < k_stop;
            const long long kk = ok ? key : 0;
            long long ko = kk * p.k_stride[2], vo = kk * p.v_stride[2];
            if (paged) {  // every lane runs the same iterations (KS·KCH is a multiple of 32)
                ko = __shfl_sync(0xffffffffu, pk, rr);
                vo = __shfl_sync(0xffffffffu, pv, rr);
            }
            const bool okk = ok && (!PAD || col < p.d), okv = ok && (!PAD || col < p.dv);
            fa2_cp_async16_stream(sK + (rr * LD + col) * 2, okk ? kbase + ko + col : kbase, okk);
            fa2_cp_async16_stream(sV + (rr * LD + col) * 2, okv ? vbase + vo + col : vbase, okv);
        }
    };
    auto load_cp_async = [&](int step) {
        const unsigned sK = sKV + (step % STAGES) * 2 * TILE_BYTES;
        const unsigned sV = sK + TILE_BYTES;
        const int key0 = k_begin + step * k_step;
        if (PAD && rb != 16)
            splitkv_load_kv_narrow<T, D, KS, LD>(sK, sV, kbase, vbase, p.k_stride[2], p.v_stride[2], key0, k_stop,
                                                 p.d, p.dv, lane, rb);
        else
            load_kv_chunks(sK, sV, key0);
        page_offsets(step + 1);  // the next step any load call takes
    };
    if constexpr (BULK) {
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s)
            if (s < n_steps) load_bulk(s);
        fa2_cp_async_wait<0>();  // Q
        if constexpr (TMA) __syncthreads();  // every warp's part of the shared Q tile
    } else {
        page_offsets(0);
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < n_steps) load_cp_async(s);
            fa2_cp_async_commit();
        }
    }

    float o[DT][4];
#pragma unroll
    for (int j = 0; j < DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
    float m[2] = {fa2_neg_inf(), fa2_neg_inf()}, l[2] = {0.f, 0.f};
    int row_i[2], row_h[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = min(r0 + g + hh * 8, rows - 1);
        splitkv_row(p, kvh, r, row_h[hh], row_i[hh]);
    }
    const float sl2 = p.scale_log2;
    // Variants: each row's ALiBi slope (rows of one tile belong to several query heads) and the softcap.
    float a2[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) a2[hh] = fa2_alibi_log2<VAR>(p, row_h[hh]);
    const Fa2Softcap cap = fa2_softcap_consts(p);
    constexpr int UPDATE = VAR != 0 ? Fa2Scaled<MASK, VAR>::UPDATE : MASK;

    for (int step = 0; step < n_steps; ++step) {
        if constexpr (BULK) {
            sm90_mbar_wait(bars + (step % STAGES) * 8, (step / STAGES) & 1);
            if (step == 0) skv_trace(p, 3, clock64());
            if constexpr (TMA) {
                // The next split's V rows in the last tile: zeros, so that 0 · V stays 0 whatever they hold.
                const int key0 = k_begin + step * k_step;
                if (key0 + KS > k_stop && lane < KS && key0 + lane >= k_stop) {
                    const unsigned row = sKV + (step % STAGES) * STAGE_BYTES + TILE_BYTES + (warp * KS + lane) * BOXB;
#pragma unroll
                    for (int j = 0; j < NBOX; ++j)
#pragma unroll
                        for (int c = 0; c < CPB; ++c)
                            asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(
                                             row + j * BOX_BYTES + c * 16),
                                         "r"(0u)
                                         : "memory");
                }
            }
            __syncwarp();  // every lane is done with step - 1's buffer before it is refilled
            if constexpr (TMA) {
                // Step - 1's stage is refilled once every warp has released it.
                if (threadIdx.x == 0 && step + STAGES - 1 < n_steps) {
                    if (step > 0) sm90_mbar_wait(empty_bar((step - 1) % STAGES), ((step - 1) / STAGES) & 1);
                    load_tma(step + STAGES - 1);
                }
            } else if (step + STAGES - 1 < n_steps) {
                load_bulk(step + STAGES - 1);
            }
        } else {
            fa2_cp_async_wait<STAGES - 2>();
            __syncwarp();  // step's tile landed for every lane; every lane is done with step - 1's buffer
            if (step + STAGES - 1 < n_steps) load_cp_async(step + STAGES - 1);
            fa2_cp_async_commit();
        }
        const unsigned buf = (step % STAGES) * STAGE_BYTES;
        const int key0 = k_begin + step * k_step;

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
                fa2_ldmatrix_x4(bk, k_ld + buf + np * 16 * ROW_BYTES + k_off(kk));
                Fa2Type<T>::mma(s[2 * np], a, bk[0], bk[1]);
                Fa2Type<T>::mma(s[2 * np + 1], a, bk[2], bk[3]);
            }
        }

        if constexpr (VAR != 0) {
            // Band test only on steps that cross a band edge of the tile's rows (or the split's end).
            const bool edge = fa2_tile_crosses_band<KS>(p, key0, k_stop, min_i, max_i);
            if (edge || Fa2Scaled<MASK, VAR>::PRE) {
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const float* mrow = MASK == FA2_MASK_EXPLICIT ? mask_row(p, b, row_h[hh], row_i[hh]) : nullptr;
                    fa2_variant_row<MASK, VAR, NT>(s, hh, p, mrow, row_i[hh], key0, sl2, cap, a2[hh], t4, edge, k_stop);
                }
            }
        }
        const bool edge = VAR == 0 && (key0 + KS > k_stop || MASK != FA2_MASK_NONE);
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
        for (int hh = 0; hh < 2; ++hh) fa2_softmax_row<UPDATE>(s, hh, fa2_row_max(s, hh), m[hh], l[hh], o, sl2);

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
                fa2_ldmatrix_x4_trans(bv, v_ld + buf + kk * 16 * ROW_BYTES + v_off(dp));
                Fa2Type<T>::mma(o[2 * dp], a, bv[0], bv[1]);
                Fa2Type<T>::mma(o[2 * dp + 1], a, bv[2], bv[3]);
            }
        }
        if constexpr (TMA) {  // this warp is done with the stage
            __syncwarp();
            if (lane == 0) sm90_mbar_arrive(empty_bar(step % STAGES));
        }
    }
    if constexpr (!BULK) fa2_cp_async_wait<0>();
    // Every lane (TMA: every warp, the ring is shared) is done reading the ring before it holds partials.
    if constexpr (TMA) __syncthreads();
    else __syncwarp();
    skv_trace(p, 4, clock64());

    // This warp's partials (normalised output and LSE per row of the tile) go into its own ring:
    // f32 [16][D], then 16 LSEs. An idle or empty split has l = 0: zeros and LSE -inf.
    float* wo = reinterpret_cast<float*>(smem + warp * Tile::WARP_ELEMS + Tile::RING_OFF);
    float* wlse = wo + 16 * D;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int rr = g + hh * 8;
        const float lsum = quad_sum(l[hh]);
        const float inv = lsum == 0.f ? 0.f : 1.f / lsum;
#pragma unroll
        for (int j = 0; j < DT; ++j)
            *reinterpret_cast<float2*>(wo + rr * D + j * 8 + t4 * 2) =
                make_float2(o[j][hh * 2] * inv, o[j][hh * 2 + 1] * inv);
        if (t4 == 0) wlse[rr] = lsum == 0.f ? fa2_neg_inf() : (m[hh] + __log2f(lsum)) * FA2_LN2;
    }
    __syncthreads();

    // Merge the block's NW partials per row; with one block per row tile that is the output, otherwise
    // the block's partial. Threads take (row, 4 columns) pairs.
    const int tile_rows = min(16, rows - r0);
    const int nblk = u.nblk;
    const long long unit = (long long)b * gridDim.y + blockIdx.y;
    // NaN or inf under a masked key must not reach rows that do not see it: the block that writes the
    // output votes, and the rows it wrote non-finite are recomputed (common.cuh).
    bool bad = false;
    // Row r of the tile is packed row r0 + r of kv head kvh: query head kvh·group + (r0 + r) / Sq (splitkv_row).
    const int h0 = kvh * p.group;
    for (int pr = threadIdx.x; pr < tile_rows * (D / 4); pr += NW * 32) {
        const int rr = pr / (D / 4), c = (pr % (D / 4)) * 4;
        int hq, i;
        splitkv_row(p, kvh, r0 + rr, hq, i);
        const long long row = u.lse0 + (long long)hq * u.lse_hs + i;  // of the LSE
        float4 v;
        const float lse = splitkv_merge(
            NW,
            [&](int w) { return reinterpret_cast<const float*>(smem + w * Tile::WARP_ELEMS + Tile::RING_OFF)[16 * D + rr]; },
            [&](int w) {
                return *reinterpret_cast<const float4*>(
                    reinterpret_cast<const float*>(smem + w * Tile::WARP_ELEMS + Tile::RING_OFF) + rr * D + c);
            },
            v);
        if (nblk == 1) {
            if (!PAD || c < p.dv)
                splitkv_store4<PAD>(static_cast<T*>(p.o) + bb * p.o_stride[0] + hq * p.o_stride[1] + (long long)i * p.o_stride[2] + c, v, p.dv - c);
            if (p.lse != nullptr && c == 0) p.lse[row] = lse;
            bad |= !isfinite(v.x) || !isfinite(v.y) || !isfinite(v.z) || !isfinite(v.w);
        } else {
            const long long slot = u.pbase + ((long long)hq * p.sq + i) * nblk + u.cidx;
            *reinterpret_cast<float4*>(splitkv_part_o(p, u.parts) + slot * D + c) = v;
            if (c == 0) splitkv_part_lse(p)[slot] = lse;
        }
    }
    if (nblk == 1) {
        if constexpr (!RAGGED) repair_nonfinite_rows<T>(p, b, h0, r0, p.sq, tile_rows, 0, p.dv, true, bad);
        skv_trace(p, 5, clock64());
        skv_trace(p, 6, clock64());
        skv_trace(p, 1, skv_globaltimer());
        return;
    }

    // Last block of the row tile merges the blocks' partials (threadFenceReduction pattern: every thread
    // fences its writes before the count; the last block fences before reading).
    __shared__ bool s_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* cnt = splitkv_counters(p, u.parts, D) + unit;
        s_last = atomicAdd(cnt, 1u) == (unsigned)nblk - 1;
        if (s_last) *cnt = 0u;  // ready for the next call on this scratch
    }
    __syncthreads();
    skv_trace(p, 5, clock64());
    unsigned smid;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
    skv_trace(p, 7, smid);
    skv_trace(p, 8, s_last ? 1 : 0);
    if (!s_last) {
        skv_trace(p, 6, clock64());
        skv_trace(p, 1, skv_globaltimer());
        return;
    }
    __threadfence();
    // The tile's partial LSEs go to shared memory first, all loaded at once (the ring is free: every
    // thread passed the barrier above after its last read), so the merge's max pass reads no L2; the
    // partial outputs stream from L2 with many loads in flight (splitkv_merge's unrolled pass).
    float* s_lse = reinterpret_cast<float*>(smem);
    const bool staged = tile_rows * nblk <= NW * Tile::WARP_ELEMS / 2;  // floats that fit in the ring
    if (staged) {
        for (int x = threadIdx.x; x < tile_rows * nblk; x += NW * 32) {
            const int rr = x / nblk, s = x - rr * nblk;
            int hq, i;
            splitkv_row(p, kvh, r0 + rr, hq, i);
            s_lse[x] = __ldcg(splitkv_part_lse(p) + u.pbase + ((long long)hq * p.sq + i) * nblk + s);
        }
        __syncthreads();
    }
    for (int pr = threadIdx.x; pr < tile_rows * (D / 4); pr += NW * 32) {
        const int rr = pr / (D / 4), c = (pr % (D / 4)) * 4;
        int hq, i;
        splitkv_row(p, kvh, r0 + rr, hq, i);
        const long long row = u.lse0 + (long long)hq * u.lse_hs + i;  // of the LSE
        const long long first = u.pbase + ((long long)hq * p.sq + i) * nblk;
        const float* plse = splitkv_part_lse(p) + first;
        const float* po = splitkv_part_o(p, u.parts) + first * D + c;
        float4 v;
        const float lse = splitkv_merge(
            nblk, [&](int s) { return staged ? s_lse[rr * nblk + s] : __ldcg(plse + s); },
            [&](int s) { return __ldcg(reinterpret_cast<const float4*>(po + (long long)s * D)); }, v);
        if (!PAD || c < p.dv)
            splitkv_store4<PAD>(static_cast<T*>(p.o) + bb * p.o_stride[0] + hq * p.o_stride[1] + (long long)i * p.o_stride[2] + c, v, p.dv - c);
        if (p.lse != nullptr && c == 0) p.lse[row] = lse;
        bad |= !isfinite(v.x) || !isfinite(v.y) || !isfinite(v.z) || !isfinite(v.w);
    }
    if constexpr (!RAGGED) repair_nonfinite_rows<T>(p, b, h0, r0, p.sq, tile_rows, 0, p.dv, true, bad);
    skv_trace(p, 6, clock64());
    skv_trace(p, 1, skv_globaltimer());
}

// VAR (every entry's last argument): 0 for plain calls, else a bit set of FA2_VAR_* (fa2_mma.cuh).
#define SPLITKV_ENTRY(NAME, T, D, NW, STAGES, KS, MASK, LOAD, ILV, VAR)                                 \
    extern "C" __global__ void __launch_bounds__(NW * 32) NAME(const AttnParams p) {                    \
        extern __shared__ __align__(16) unsigned char splitkv_smem[];                                   \
        splitkv_forward<T, D, NW, STAGES, KS, MASK, LOAD, ILV, false, VAR>(                             \
            p, reinterpret_cast<T*>(splitkv_smem), nullptr, nullptr, splitkv_dense_unit(p, NW));                                   \
    }
// Head-dim classes (src/kernels/splitkv.rs `HeadDims`): the cp.async path with the call's D and Dv padded up to D.
#define SPLITKV_ENTRY_PAD(NAME, T, D, NW, STAGES, KS, MASK, VAR)                                          \
    extern "C" __global__ void __launch_bounds__(NW * 32) NAME(const AttnParams p) {                    \
        extern __shared__ __align__(16) unsigned char splitkv_smem[];                                   \
        splitkv_forward<T, D, NW, STAGES, KS, MASK, SKV_CP_ASYNC, false, true, VAR>(                    \
            p, reinterpret_cast<T*>(splitkv_smem), nullptr, nullptr, splitkv_dense_unit(p, NW));                                   \
    }
// TMA entries take the tensor maps in their parameter (__grid_constant__: the copies address them in
// parameter space). Compiled for an architecture without TMA they trap; the host launches them on
// compute capability 9.0 or newer only.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SPLITKV_TMA_BODY(T, D, NW, STAGES, KS, MASK, VAR, PAD)                                          \
    extern __shared__ __align__(16) unsigned char splitkv_smem[];                                       \
    splitkv_forward<T, D, NW, STAGES, KS, MASK, SKV_TMA, true, PAD, VAR>(                               \
        a.p, reinterpret_cast<T*>(splitkv_smem), &a.k, &a.v, splitkv_dense_unit(a.p, NW));
#else
#define SPLITKV_TMA_BODY(T, D, NW, STAGES, KS, MASK, VAR, PAD) asm volatile("trap;");
#endif
#define SPLITKV_TMA_ENTRY(NAME, T, D, NW, STAGES, KS, MASK, VAR)                                        \
    extern "C" __global__ void __launch_bounds__(NW * 32) NAME(const __grid_constant__ SplitKvTmaArgs a) { \
        SPLITKV_TMA_BODY(T, D, NW, STAGES, KS, MASK, VAR, false)                                        \
    }
// Head-dim classes on TMA (src/kernels/splitkv.rs `HeadDims::for_tma`): D is the class rounded up to whole
// boxes (SplitKvTile::BOXC); the maps carry the call's D and Dv, so TMA zero-fills the columns past them.
#define SPLITKV_TMA_ENTRY_PAD(NAME, T, D, NW, STAGES, KS, MASK, VAR)                                    \
    extern "C" __global__ void __launch_bounds__(NW * 32) NAME(const __grid_constant__ SplitKvTmaArgs a) { \
        SPLITKV_TMA_BODY(T, D, NW, STAGES, KS, MASK, VAR, true)                                         \
    }

// ---- ragged batches and paged caches ----------------------------------------------------------------------
// A ragged call's grid walks a schedule (src/kernels/splitkv.rs `RaggedSchedule`, computed from the lengths
// and uploaded once per content): blockIdx.x is one unit of SKV_UNIT_INTS ints (sequence b, chunk index c,
// chunks n of that sequence, its keys [kb, ke) and the first partial slot of the sequence), chunks of
// roughly equal key counts whatever the sequences' lengths, so that a batch mixing short and long sequences
// keeps every SM busy; blockIdx.y is (kv head, row tile) with as many row tiles as the batch's widest
// sequence needs (blocks past their sequence's rows leave at once). The block's NW warps split its chunk,
// merge in shared memory, and with n > 1 chunks the last block of the row tile merges the n partials
// (splitkv_forward). Masks, windows and ALiBi are each sequence's own band (seq_view); always the band
// instantiation (VAR), cp.async loads (the TMA path assumes one contiguous key range per block).
struct SplitKvRaggedArgs {
    AttnParams p;
    const int* units;  // [gridDim.x][SKV_UNIT_INTS]
    long long parts;   // partial slots in the scratch
};
static_assert(sizeof(SplitKvRaggedArgs) == sizeof(AttnParams) + 16, "SplitKvRaggedArgs must match src/kernels/splitkv.rs");

template <typename T, int D, int NW, int STAGES, int KS, int VAR, bool PAD>
__device__ __forceinline__ void splitkv_ragged_forward(const SplitKvRaggedArgs& a, T* smem) {
    const int* un = a.units + (long long)blockIdx.x * SKV_UNIT_INTS;
    const int b = un[0];
    AttnParams p = a.p;
    const SeqView s = seq_view(p, b);
    const int m_tiles = gridDim.y / p.hkv;
    if ((blockIdx.y % m_tiles) * 16 >= p.group * s.sq) return;  // past this sequence's rows: the block does nothing
    // The sequence as a dense B = 1 problem: its lengths, band and diagonal, its first rows.
    p.sq = s.sq;
    p.sk = s.sk;
    p.band_lo = s.band_lo;
    p.band_hi = s.band_hi;
    p.diag_offset = s.diag_offset;
    p.q = static_cast<const T*>(p.q) + (long long)s.q0 * p.q_stride[2];
    p.o = static_cast<T*>(p.o) + (long long)s.q0 * p.o_stride[2];
    if (!is_paged(p)) {
        p.k = static_cast<const T*>(p.k) + (long long)s.k0 * p.k_stride[2];
        p.v = static_cast<const T*>(p.v) + (long long)s.k0 * p.v_stride[2];
    }
    SkvUnit u;
    u.b = b;
    u.cidx = un[1];
    u.nblk = un[2];
    u.kb = un[3];
    u.ke = un[4];
    u.split0 = 0;
    u.ns = NW;
    u.pbase = un[5];
    u.parts = a.parts;
    u.lse0 = s.q0;
    u.lse_hs = p.total_q;
    splitkv_forward<T, D, NW, STAGES, KS, FA2_MASK_NONE, SKV_CP_ASYNC, false, PAD, VAR, true>(p, smem, nullptr,
                                                                                             nullptr, u);
}
#define SPLITKV_RAGGED_ENTRY(NAME, T, D, NW, STAGES, KS, VAR, PAD)                                      \
    extern "C" __global__ void __launch_bounds__(NW * 32) NAME(const SplitKvRaggedArgs a) {             \
        extern __shared__ __align__(16) unsigned char splitkv_smem[];                                   \
        splitkv_ragged_forward<T, D, NW, STAGES, KS, VAR, PAD>(a, reinterpret_cast<T*>(splitkv_smem));  \
    }

// Entry points splitkv_{dtype}_{D}_{mask} (16-byte cp.async on every architecture, contiguous splits:
// LOAD = SKV_CP_ASYNC, ILV = false), splitkv_bulk_{dtype}_{D}_{mask} (LOAD = SKV_BULK_OR_CP_ASYNC, ILV =
// true: bulk copies where compiled for sm_90 or newer, the cp.async path elsewhere; warps interleaved over
// the block's keys) and splitkv_tma_{dtype}_{D}_{mask} (SPLITKV_TMA_ENTRY: sm_90 tensor copies, warps
// interleaved; D whole 64- or 32-column boxes); NW warps = splits per block, STAGES-deep ring, KS keys per step. One
// entry per NVRTC program: src/kernels/splitkv.rs (`tile_for`, chosen on the H100) writes the line a call
// needs.
#define SKV_BULK_OR_CP_ASYNC (SPLITKV_USE_BULK ? SKV_BULK : SKV_CP_ASYNC)
