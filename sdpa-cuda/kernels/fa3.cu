// `fa3`: attention forward for f16/bf16 on Hopper (sm_90a): TMA tensor loads, `wgmma` for both products,
// a producer warpgroup and consumer warpgroups on an mbarrier ring, register reallocation (`setmaxnreg`).
// src/kernels/fa3.rs plans and launches it (no mask, causal, band) at a head-dim class (D, DV): the Q/K width D
// and the V/O width DV the products compute, multiples of 32 (64, 96, 128, 192/128, 160, 192, 224, 256),
// stored in shared memory as whole 64-column blocks (DS, DVS: a 96 class keeps 128 columns, the last 32
// zero). A call's own head dims p.d <= D and p.dv <= DV may be smaller (multiples of 8): the tensor maps
// carry the true widths, so TMA fills the columns past them with zeros inside a box; 64-column blocks wholly
// past them are not loaded (Q's and K's are zeroed once, V's only feed columns of O that are never stored),
// and O is stored up to p.dv only.
//
// Work tile: BM = 64 NC query rows of one (batch, query head); consumer warpgroups 0 .. NC - 1 (NC = 2, or
// 3 at D = 64 without a mask) own 64 rows each, warpgroup NC is the producer. Blocks are persistent: each
// walks work tiles (head by head, each head's heaviest query tiles first) that the producer takes one at a
// time from an atomic counter (Fa3TileSource: a block takes a tile when it is ready for one, so unequal
// causal tiles balance) and hands to the consumers through a small ring in shared memory; the ring
// position and the Q-load counts carry from tile to tile. `SDPA_FA3_SCHED=static` runs the earlier static
// snake instead (fa3_work; with one block per tile for causal calls with many tiles per head).
// One thread of the producer issues every copy: each consumer's Q (64 rows, once that consumer released
// its previous Q: `q_empty`, after its last S = Q·Kᵀ of the previous tile), and the K and V tiles (one box
// of [BN keys][64 columns] per 64 columns of the head) into an ST-deep ring; each slot has a `full` barrier
// (the copy's bytes arrive on it) and an `empty` one (every consumer thread arrives once it no longer
// reads the slot). So the next tile's Q and first K/V land while the consumers finish the current one.
// Per key tile a consumer runs:
//   S = Q·Kᵀ (wgmma m64nBNk16, both operands in shared memory, K-major),
//   mask (only tiles crossing the end of the keys or the causal diagonal), online softmax in registers
//   (exp2 with the scale folded in), P converted in registers to the A fragment,
//   O += P·V (wgmma m64nDVk16, A = P from registers, B = V read transposed from its [keys][dv] rows; a DV
//   that is not whole 64-column blocks runs as N = DV - 32 and N = 32, fa3_pv_step).
// Intra-warpgroup overlap: S(j+1) = Q·K(j+1) is issued before P(j)·V(j), and the softmax of tile j+1
// runs while P(j)·V(j) is in flight. Inter-warpgroup ping-pong (PP): the consumers take turns issuing
// their products (named barriers, round robin), so one's softmax runs under the others' GEMMs. O leaves
// through a small staging tile of each warp in shared memory as 16-byte chunks (the Q buffer already holds
// the next tile's Q), or from registers where the block has no room for it (classes 160 and up).
//
// Causal: key tiles past the work tile's last visible key are never loaded; a consumer whose rows end
// before a loaded tile releases it unread. Rows past Sq and keys past Sk arrive as zeros from TMA (the
// tensor maps know the extents); keys past Sk are masked. GQA: the K/V head is h / group.
//
// Variants (FA3_ENTRY_VAR; f16/bf16 written in session 9, verified on the H100 in session 10; FP8 written in
// session 24, the same code on E4M3 scores whose descales the host folds into the scale and the softcap's
// constants, behind SDPA_FA3_FP8_VARIANTS=1 until a GPU verifies it): a key band per row
// (windows, causal masks as its special case) loads only the tiles from the work tile's first row's first
// key to its last row's last one; each consumer computes the tiles its own rows see and releases the others,
// leading and trailing, unread; only tiles crossing a band edge run the band test. Softcap and ALiBi turn
// every score into log2 units before the online max (fa3_variant_score).
//
// Ragged batches (FA3_ENTRY_SERVE, f16/bf16; written and verified on the H100 in session 10): work tile w is
// entry w / Hq of the launcher's heaviest-first schedule of (sequence, query tile) pairs and head w % Hq
// (fa3_ragged_tile); the tile runs the dense code on its sequence's own lengths, band and diagonal
// (Fa3Ragged; the dense entries read the parameter as before through Fa3Dense). The Q and O maps run over
// the packed rows as one batch ([1, H, total rows, D]); so do K and V (FA3_SERVE_VARLEN), or over the pages
// of a paged cache (FA3_SERVE_PAGED: [pages, Hkv, page size, D], a key tile loaded as boxes of
// min(BN, page size) keys, each from its page through the block table). Either way a box reaching past a
// sequence loads other data (the next sequence's rows, slots past the cache length): keys at or past Sk_b are
// masked on every tile that reaches them (the plain entries' `edge` test and j_mask, the band test), rows at
// or past Sq_b are never stored, the LSE goes to [Hq, total_q], and a non-finite value there under a masked
// key is repaired as any other. The protocol (rings, Q buffers, turns) is the dense one.
//
// Shared memory (1024-byte aligned tiles, the 128-byte swizzle TMA writes; fa3_wgmma.cuh):
//   Q [NC][DS/64][64][128 B] | K ring ST x [DS/64][BN][128 B] | V ring ST x [DVS/64][BN][128 B] (FP8: Vᵀ,
//   [DV][128 B] of 128 keys) | FP8's staged V tiles SV x [DV/128][BN][128 B] (VT_STAGED) | O staging [4 NC
//   warps][16][128 B] (where it fits: O_STAGED) | mbarriers (Q, K, V and staged-V pairs) | the work-tile ring
//   (FA3_SCHED mbarrier pairs and tiles).
#include "common.cuh"
#include "sm90_async.cuh"
#include "fa3_fp8.cuh"  // T = sdpa_e4m3: E4M3 inputs, bf16 O (the `Fa3Elem<T>::FP8` switch points below)

#define FA3_MASK_NONE 0
#define FA3_MASK_CAUSAL 1

// Variant bits of an FA3_ENTRY_VAR instantiation (VAR; the values of src/checked/params.rs `VAR_*`, as
// fa2_mma.cuh's FA2_VAR_*): BAND is always set, and the keys of row i are then i + band_lo ..= i + band_hi
// (windows and causal masks alike; unbounded sides come clamped so that they restrict nothing), MASK is
// FA3_MASK_NONE (the causal mask is part of the band); SOFTCAP and ALIBI transform every score before the
// online max. VAR = 0 is the plain kernel, whose code the variant paths leave untouched (`if constexpr`).
#define FA3_VAR_BAND 1
#define FA3_VAR_SOFTCAP 2
#define FA3_VAR_ALIBI 4

// Measurement switches of an FA3_ENTRY_XO instantiation (XO; src/kernels/fa3.rs `SDPA_FA3_AB`), each the other
// side of an A/B the product settled (the old code, or an alternative measured and left off), so that one call
// can time both on the same card:
// FA3_XO_STORE16 stores O as 16-byte row chunks after a quad transpose (session 8's choice; session 10 measured
// it up to 8 % slower at S <= 4k, most at 512, than the product's 4-byte column pairs; bench/results/gpu/fa3.md
// "Fifth step"), FA3_XO_TILE_TURNS restarts the ping-pong turns at every work tile (warpgroup 0 waits for the
// last one to enter the tile) instead of running them round robin across tiles (the same call: within 1 %
// either way). XO = 0 is the product kernel (`if constexpr`: its code is unchanged), and so is FA3_XO_VT_PREPASS
// (below) alone, FP8's layout for long calls.
#define FA3_XO_STORE16 1
#define FA3_XO_TILE_TURNS 2
// FA3_XO_EXP_FMA (bits 2-5, a value k + 1 for k = 0..8): k of every 8 n8 columns of S take their exponentials
// on the FMA pipe (common.cuh fma_exp2) instead of the special-function unit, in place of the product's share
// (fa3_exp_fma_eighths); the k columns are spread over the 8 (column j when (j k) mod 8 < k). Session 18
// measured it slower at every point of the bf16 grid and of FP8 (k = 2: 0.84-0.96x, most at D = 64; each
// further eighth about 4 % more; bench/results/gpu/fa3.md, "Seventh step"): the main loop is bound by its
// issue slots as much as by the MUFU, and the polynomial's nine extra instructions per score cost more
// than the MUFU time they free.
#define FA3_XO_EXP_SHIFT 2
// FA3_XO_DESC_FOLD forms each step's wgmma descriptor as sessions 7-17 did: the tile's whole 64-bit descriptor
// plus the step's offset, which the compiler folds back into a masked and shifted address per step (fa3_wgmma.cuh
// fa3_desc has the product's one add). It restores the old code of the Q·Kᵀ steps and of whole-block V steps;
// the FP8 P·V steps and the second (N = 32) product of a DV that is not whole 64-column blocks (96, 160, 224)
// take the new form on both sides.
#define FA3_XO_DESC_FOLD 64
// FA3_XO_EAGER_MAX moves each row's reference maximum whenever a tile's maximum exceeds it, rescaling O then
// (sessions 7-17), instead of only when it exceeds it by more than FA3_MAX_SLACK.
#define FA3_XO_EAGER_MAX 128
// FA3_XO_DIRECT_O writes O as sessions 10-19 did: the row sums reduced after the last P·V completes, every
// value's finiteness tested with its own branch, and 4-byte stores of each thread's column pairs straight
// from registers, instead of the product's staging through shared memory (Fa3Smem::O_STAGED).
#define FA3_XO_DIRECT_O 256
// FA3_XO_FULL_DIAG runs a causal warpgroup's last P·V over the whole tile where the product takes only the first
// 64 keys, the ones its rows see (fa3_consume_tile's HALF).
#define FA3_XO_FULL_DIAG 512
// FA3_XO_VT_PREPASS (FP8 entries, named `_vtp`; not a measurement switch but the layout of long FP8 calls) reads the
// Vᵀ a pre-pass kernel writes into a workspace before the call (fa3_fp8.cuh FA3_FP8_VT_ENTRY) instead of
// transposing each V tile inside the kernel, in the producer warpgroup (Fa3Smem::VT_STAGED, fa3_fp8_transpose_v).
// The transpose in the kernel (once per work tile that loads a V tile) is faster where few work tiles share each
// V tile (up to Sq = 2k without GQA, 1k at the class 256; decoding), the pre-pass (once per V tile) where many do
// (measured on the H100 in session 23, bench/results/gpu/fp8.md; src/kernels/fa3.rs `fp8_transposes_in_kernel`).
#define FA3_XO_VT_PREPASS 1024

// How far (log2 units) a tile's row maximum may pass the row's reference before the reference moves and O is
// rescaled: P = 2^(x - reference) stays at most 2^8 = 256, well inside bf16, f16 and E4M3 (448) and exact in
// f32 sums. A random row's maximum keeps growing by small steps for many tiles, and every step cost a warp the
// rescale of its O accumulators (D / 2 multiplies per thread) between its products. Measured 1.001-1.037x the
// eager rule at S = 512..2k (session 18, bench/results/gpu/fa3.md "Seventh step"). Every entry takes it: the
// plain ones (dense and ragged, FP8 included) since session 18, the variant ones (windows, softcap, ALiBi)
// since their reference test passed under it in session 20.
#define FA3_MAX_SLACK 8.f

// Eighths of a tile's exponentials that the product computes on the FMA pipe, by element type and head-dim
// class: none (measured slower; FA3_XO_EXP_SHIFT).
template <typename T, int D>
__device__ constexpr int fa3_exp_fma_product() {
    return 0;
}
// The share an instantiation runs: the product's, or FA3_XO_EXP_FMA's.
template <typename T, int D, int XO>
__device__ constexpr int fa3_exp_fma_eighths() {
    return ((XO >> FA3_XO_EXP_SHIFT) & 15) != 0 ? ((XO >> FA3_XO_EXP_SHIFT) & 15) - 1 : fa3_exp_fma_product<T, D>();
}

// How an instantiation reads its rows (SERVE; src/kernels/fa3.rs `serve_program`): a dense batch, or a ragged
// one with packed K/V (varlen: Q/O `[total_q, Hq, D]`, K/V `[total_k, Hkv, D]` rows, the tensor maps over the
// packed rows as one batch) or with K/V in a paged cache (paged: the K/V maps over the pool's pages, each
// box of keys from its page through the sequence's block-table row; page sizes that are multiples of 8 and
// divide the key tile or are multiples of it, which the launcher checks).
#define FA3_SERVE_DENSE 0
#define FA3_SERVE_VARLEN 1
#define FA3_SERVE_PAGED 2

// The entries' parameter: AttnParams, padding to byte 384, then the Q, K and V tensor maps over
// (D, S, H, B) (src/kernels/fa3.rs `Fa3Args` mirrors it; explicit padding so the maps sit at 384 on both
// sides).
struct Fa3Args {
    AttnParams p;
    int section;    // query heads (b·h) per scheduling section (fa3_tile_of)
    float o_scale;  // multiplies O at the end: V's descale for FP8 inputs, 1 otherwise
    // The softcap in log2 units (fa3_variant_score): c1 + c2 / (1 + 2^(x kc)) = cap log2(e) tanh(x scale / cap)
    // for a raw score x, so kc = 2 scale log2(e) / cap, c1 = cap log2(e), c2 = -2 cap log2(e); 0 without a
    // softcap. Computed by the host so that the consumers read them from the parameter bank: held in
    // registers, they made ptxas spill in the main loop (47 spill instructions at D = 128, none this way).
    float softcap_kc, softcap_c1, softcap_c2;
    // Ragged batches (FA3_SERVE_VARLEN): the (sequence, query tile) pairs of the call, heaviest first
    // (src/kernels/fa3.rs reuses fa2's `schedule`), as `n_seq_tiles` int pairs at `seq_tiles`; 0 / null for
    // a dense call. `seq_tiles` sits at byte 352 on both sides (natural alignment after the 348 bytes before
    // `n_seq_tiles`; src/kernels/fa3.rs asserts the offset, NVRTC has no offsetof).
    int n_seq_tiles;
    const int* seq_tiles;
    unsigned char pad[384 - sizeof(AttnParams) - 2 * sizeof(int) - 4 * sizeof(float) - sizeof(const int*)];
    Sm90TensorMap q, k, v;
};
static_assert(sizeof(Fa3Args) == 768, "Fa3Args must match src/kernels/fa3.rs");

// Consumer warpgroups NC (2, or 3 at D = 64), 64 query rows each, and the producer warpgroup: a block is
// 128 (NC + 1) threads over BM = 64 NC rows. NC, the ring depth ST and the keys per tile BN are the
// entries' parameters (src/kernels/fa3.rs `Fa3Tile`).
#define FA3_THREADS(NC) (128 * ((NC) + 1))
// Blocks an SM holds at once: one (it takes all the registers), or two of one consumer each (NC = 1, the
// measurement tile `SDPA_FA3_TILE=bn,stages,1`: two independent work tiles in flight per SM, so that one
// block's tile start and epilogue run under the other's products). __launch_bounds__ then caps the launch at
// 128 registers a thread, which the producer's setmaxnreg hands to the consumer.
#define FA3_MIN_BLOCKS(NC) ((NC) == 1 ? 2 : 1)

// Depth of the work-tile ring through which the producer hands each tile it takes to the consumers.
#define FA3_SCHED 4
// Warps of the producer warpgroup that transpose FP8's V tiles (Fa3Smem::VT_STAGED): its warps 1-3. Lane 0 of
// each arrives on the V ring's `full` and the staging ring's `empty` barriers for its warp, after __syncwarp.
#define FA3_VT_WARPS 3
// Dynamic shared memory one block may take on sm_90 (227 KB).
#define FA3_SMEM_LIMIT (227 * 1024)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "fa3_wgmma.cuh"

template <typename T, int D, int DV, int BN, int ST, int NC, int XO = 0>
struct Fa3Smem {
    static constexpr int ES = sizeof(T);            // element bytes: 2, or 1 for E4M3
    static constexpr int COLS = 128 / ES;            // columns of one 128-byte TMA box row
    static constexpr int DS = (D + COLS - 1) / COLS * COLS;  // stored columns of a Q or K row: whole boxes
    // Of a V row; FP8 stores Vᵀ instead: DV rows of BN = 128 keys (one box row each).
    static constexpr int DVS = Fa3Elem<T>::FP8 ? DV : (DV + 63) / 64 * 64;
    static constexpr int Q_BYTES = 64 * DS * ES;   // one consumer's Q rows
    static constexpr int K_BYTES = BN * DS * ES;   // one K tile
    static constexpr int V_BYTES = BN * DVS * ES;  // one V (FP8: Vᵀ) tile
    static constexpr int BLOCK_Q = 64 * 128;      // one 64-column block of a Q tile
    static constexpr int BLOCK_KV = BN * 128;     // one 64-column block of a K or V tile
    static constexpr int Q_OFF = 0;
    static constexpr int K_OFF = NC * Q_BYTES;
    static constexpr int V_OFF = K_OFF + ST * K_BYTES;
    // FP8 (except under FA3_XO_VT_PREPASS): TMA stages each V tile as it is stored, [keys][128-column boxes], and the
    // producer's transposing warps write it into the Vᵀ ring (fa3_fp8_transpose_v). Two staged tiles where
    // they fit beside O's staging (classes 64 and 128), else one (256).
    static constexpr bool VT_STAGED = Fa3Elem<T>::FP8 && (XO & FA3_XO_VT_PREPASS) == 0;
    static constexpr int VS_BYTES = VT_STAGED ? BN * 128 * ((DV + 127) / 128) : 0;  // one staged V tile
    static constexpr int VS_OFF = V_OFF + ST * V_BYTES;
    static constexpr int SV = !VT_STAGED ? 0
                              : VS_OFF + 2 * VS_BYTES + 4 * NC * 2048 + 8 * (2 * NC + 4 * ST + 4) + 20 * FA3_SCHED <=
                                        FA3_SMEM_LIMIT
                                  ? 2
                                  : 1;
    static constexpr int TILES_END = VS_OFF + SV * VS_BYTES;
    // O's staging (the consumers' epilogue): 16 rows x 64 two-byte columns (2 KB) per consumer warp, where the
    // block has room for it within the 227 KB an sm_90 block may take (classes 64, 96, 128 and 192/128, every
    // FP8 class; not 160, 192, 224 and 256); elsewhere O leaves from registers.
    static constexpr int O_STAGE_BYTES = 4 * NC * 2048;
    static constexpr bool O_STAGED =
        TILES_END + O_STAGE_BYTES + 8 * (2 * NC + 4 * ST + 2 * SV) + 20 * FA3_SCHED <= FA3_SMEM_LIMIT;
    static constexpr int O_OFF = TILES_END;
    static constexpr int BAR_OFF = O_OFF + (O_STAGED ? O_STAGE_BYTES : 0);
    // q_full[NC], q_empty[NC], k_full[ST], k_empty[ST], v_full[ST], v_empty[ST], vs_full[SV], vs_empty[SV],
    // 8 bytes each.
    static constexpr int SCHED_BAR_OFF = BAR_OFF + 8 * (2 * NC + 4 * ST + 2 * SV);
    // The work-tile ring (fa3_next_tile): sched_full[FA3_SCHED], sched_empty[FA3_SCHED], then the tiles.
    static constexpr int SCHED_OFF = SCHED_BAR_OFF + 16 * FA3_SCHED;
    static constexpr int BYTES = SCHED_OFF + 4 * FA3_SCHED;
    static_assert(D % 32 == 0 && DV % 32 == 0 && BN % 16 == 0 && BN <= 256, "k16 steps, n32 products");
    static_assert(K_BYTES % 1024 == 0 && V_BYTES % 1024 == 0, "every tile on a 1024-byte boundary");
    static_assert(!Fa3Elem<T>::FP8 || BN == 128, "FP8: a Vᵀ tile row is one 128-byte box row of keys");
    static constexpr int ST_ = ST, NC_ = NC;
};

// Blocks of `C` columns (one 128-byte box row: 64, or 128 for FP8) of a stored Q/K row (`W` = DS) or V row
// (DVS) that hold some of the call's `cols` columns: the ones TMA loads (blocks wholly past them are not
// loaded).
template <int W, int C = 64>
__device__ __forceinline__ int fa3_live_blocks(int cols) {
    return min(W / C, (cols + C - 1) / C);
}

// Zeroes the 64-column blocks `live`..`blocks - 1` of `tiles` tiles (`tile_bytes` apart, blocks `block_bytes`
// long) from `base` with the threads `i0`, `i0 + step`, ..., then publishes the stores to the async proxy
// (wgmma reads them). The caller orders them before the reads with a barrier.
__device__ __forceinline__ void fa3_zero_blocks(unsigned char* base, int tiles, int tile_bytes, int blocks,
                                                int live, int block_bytes, int i0, int step) {
    const int per_tile = (blocks - live) * block_bytes / 16;
    for (int i = i0; i < tiles * per_tile; i += step) {
        const int tile = i / per_tile, x = i % per_tile;
        *reinterpret_cast<uint4*>(base + tile * tile_bytes + live * block_bytes + 16 * x) = make_uint4(0, 0, 0, 0);
    }
    sm90_proxy_fence();
}

// O (64 x DV) += P·V for one k16 step, V's rows at the MN-major descriptor low word `v` (fa3_desc_lo_mn, blocks
// of `block_bytes`): one product when DV is whole 64-column blocks, else N = DV - 32 and then N = 32 from the
// last block, whose accumulators are the last DV/8 - (DV - 32)/8 n8 tiles of O (the register order of one
// N = DV product).
template <int DV, typename T>
__device__ __forceinline__ void fa3_pv_step(float (&o)[DV / 2], const unsigned (&pa)[4], unsigned v,
                                            unsigned block_bytes) {
    if constexpr (DV % 64 == 0) {
        fa3_rs(o, pa, fa3_desc(v), T());
    } else {
        constexpr int LO = DV - 32;
        fa3_rs(*reinterpret_cast<float(*)[LO / 2]>(&o[0]), pa, fa3_desc(v), T());
        fa3_rs(*reinterpret_cast<float(*)[16]>(&o[LO / 2]), pa, fa3_desc(v + (LO / 64) * (block_bytes >> 4)), T());
    }
}

// Work tile w (0 .. n_bh·n_mblocks - 1) -> (batch·head, query tile). The heads go in sections of `section`
// (one head unless `SDPA_FA3_GRID` sets more: sections sized to keep their K/V in L2 measured slower, and
// one head per section was best; bench/results/gpu/fa3.md); within a section, query tiles from the last (under
// a causal mask the heaviest) to the first, each across the section's heads, so that tiles of one weight
// run side by side.
__device__ __forceinline__ void fa3_tile_of(int w, int n_mblocks, int n_bh, int section, int& bh, int& m_block) {
    const int per = section * n_mblocks;
    const int sec = w / per, within = w - sec * per;
    const int h0 = sec * section, hn = min(section, n_bh - h0);
    m_block = n_mblocks - 1 - within / hn;
    bh = h0 + within % hn;
}

// The static schedule (`SDPA_FA3_SCHED=static`): the k-th work tile of this block on a persistent grid of
// gridDim.x blocks, a snake over the tiles (block c takes c in even rounds, gridDim.x - 1 - c in odd ones),
// so that with the heavy tiles first the blocks' sums of work stay close. Negative once no tile is left;
// n_work when this block sits round k out.
__device__ __forceinline__ int fa3_work(int k, int n_work) {
    const int g = gridDim.x, c = blockIdx.x;
    if (k * g >= n_work) return -1;
    const int w = k * g + ((k & 1) ? g - 1 - c : c);
    return w < n_work ? w : n_work;
}

// The producer's source of work tiles, in the order fa3_tile_of numbers them (each head's heaviest tiles
// first). Dynamic (`counter` set, the default): block c starts with tile c, and each next tile is
// gridDim.x + the value an atomic increment of the launch's counter returns, so a block takes a new tile
// when it is ready for one and the tiles' unequal weights (causal) balance by themselves. Static
// (`counter` null): fa3_work's snake.
// The counter is zero when the launch starts and is left zero: with g' = min(gridDim.x, n_work) blocks
// starting on a tile, every one of them increments until it draws a value v with v + gridDim.x >= n_work,
// which happens exactly once per block, so the increments of a launch number max(0, n_work - gridDim.x)
// + g' = n_work, and the one that draws n_work - 1 is the last: that block writes the zero back. No
// launch or memset resets it (src/kernels/fa3.rs keeps one counter per device stream).
struct Fa3TileSource {
    unsigned* counter;
    int n_work, k;
    __device__ __forceinline__ int first() {
        if (counter != nullptr) return blockIdx.x < n_work ? (int)blockIdx.x : -1;
        k = 0;
        return next();
    }
    __device__ __forceinline__ int next() {
        if (counter != nullptr) {
            const unsigned v = atomicAdd(counter, 1u);
            if (v == (unsigned)n_work - 1u) atomicExch(counter, 0u);
            return (long long)v + gridDim.x < n_work ? (int)(v + gridDim.x) : -1;
        }
        for (;;) {
            const int w = fa3_work(k++, n_work);
            if (w != n_work) return w;
        }
    }
};

// The 4 x 4 transpose inside a quad (lanes 4g .. 4g + 3, this one `t`): lane s holds v[e] = columns 2s, 2s + 1
// of n8 tile e (packed pairs); returns the four pairs of n8 tile t (from lanes 0..3, in column order). Round
// r exchanges with lane t ^ r; the register each side sends or keeps is picked by selects (an index that
// varies by lane would put v in local memory). Every lane of the warp must call it.
__device__ __forceinline__ uint4 fa3_quad_take(const unsigned (&v)[4], int t) {
    auto pick = [&](int i) { return i == 0 ? v[0] : i == 1 ? v[1] : i == 2 ? v[2] : v[3]; };
    unsigned w[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int s = t ^ r;  // the partner lane of the quad: it sends its pair of tile t, we send ours of s
        const unsigned got = r == 0 ? pick(t) : __shfl_xor_sync(0xffffffffu, pick(s), r);
#pragma unroll
        for (int k = 0; k < 4; ++k)
            if (k == s) w[k] = got;
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// A compile-time flag as a value (for generic lambdas: `decltype(f)::value`).
template <bool B>
struct Fa3Flag {
    static constexpr bool value = B;
};

// Two f32 values rounded to T and packed (lo in the low half), as an A fragment register or one O store.
template <typename T>
__device__ __forceinline__ unsigned fa3_pack(float lo, float hi);
template <>
__device__ __forceinline__ unsigned fa3_pack<__nv_bfloat16>(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
}
template <>
__device__ __forceinline__ unsigned fa3_pack<__half>(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&v);
}

// max(a, b), NaN when either is NaN (fmaxf would drop it): a running maximum of |x| that is finite exactly
// when every x was.
__device__ __forceinline__ float fa3_max_nan(float a, float b) {
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}

__device__ __forceinline__ uint4 fa3_lds16(unsigned addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

// A 16-byte store to global memory where `pred` holds, predicated rather than branched around; `ptr` 16-byte
// aligned (the host checks O's base and strides: 8-element aligned).
__device__ __forceinline__ void fa3_stg16_if(bool pred, void* ptr, const uint4& v) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %0, 0;\n"
        "@p st.global.v4.u32 [%1], {%2, %3, %4, %5};\n"
        "}\n" ::"r"((int)pred),
        "l"(ptr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
        : "memory");
}

// Shared-memory addresses of a block's buffers and barriers (Fa3Smem's layout).
struct Fa3Ring {
    unsigned q, k, v, vs;  // Q of consumer 0, the K ring, the V ring, FP8's staged V tiles (Fa3Smem::VT_STAGED)
    unsigned q_full, q_empty, k_full, k_empty, v_full, v_empty, vs_full, vs_empty;  // barrier arrays, 8 bytes each
    unsigned sched_full, sched_empty;                       // the work-tile ring's barriers
    volatile int* sched;                                    // its FA3_SCHED tiles
};
template <typename L>
__device__ __forceinline__ Fa3Ring fa3_ring(unsigned base) {
    Fa3Ring r;
    r.q = base + L::Q_OFF;
    r.k = base + L::K_OFF;
    r.v = base + L::V_OFF;
    r.vs = base + L::VS_OFF;
    r.q_full = base + L::BAR_OFF;
    r.q_empty = r.q_full + 8 * L::NC_;
    r.k_full = r.q_empty + 8 * L::NC_;
    r.k_empty = r.k_full + 8 * L::ST_;
    r.v_full = r.k_empty + 8 * L::ST_;
    r.v_empty = r.v_full + 8 * L::ST_;
    r.vs_full = r.v_empty + 8 * L::ST_;
    r.vs_empty = r.vs_full + 8 * L::SV;
    r.sched_full = base + L::SCHED_BAR_OFF;
    r.sched_empty = r.sched_full + 8 * FA3_SCHED;
    return r;
}

// The work-tile ring between the producer's issuing thread and the consumers: entry n (the n-th tile this
// block runs, -1 after the last) sits in slot n % FA3_SCHED; `full` completes when the producer wrote it,
// `empty` once every consumer thread read it. The mbarriers' release/acquire order the plain shared-memory
// store and loads.
__device__ __forceinline__ void fa3_publish_tile(const Fa3Ring& r, int n, int w) {
    const int s = n % FA3_SCHED, use = n / FA3_SCHED;
    if (use > 0) sm90_mbar_wait(r.sched_empty + 8 * s, (use - 1) & 1);
    r.sched[s] = w;
    sm90_mbar_arrive(r.sched_full + 8 * s);
}
__device__ __forceinline__ int fa3_take_tile(const Fa3Ring& r, int n) {
    const int s = n % FA3_SCHED;
    sm90_mbar_wait(r.sched_full + 8 * s, (n / FA3_SCHED) & 1);
    const int w = r.sched[s];
    sm90_mbar_arrive(r.sched_empty + 8 * s);
    return w;
}

// By one warp, after its O stores: recomputes those of its rows [row0, row0 + 16) below Sq (of batch b,
// head h) that hold a non-finite value (common.cuh's careful path: NaN or inf under a masked key must not
// reach rows that do not see it). Out of line, off the consumer's main loop; `p` is the kernel's
// __grid_constant__ parameter, read in place.
// `sq`: the rows of sequence b (p->sq for a dense call; common.cuh resolves a ragged call's sequences itself).
template <typename T>
__device__ __noinline__ void fa3_repair_warp_rows(const AttnParams* p, int b, int h, int row0, int sq) {
    for (int i = row0; i < min(row0 + 16, sq); ++i) repair_row_if_nonfinite<T>(*p, b, h, i, 0, p->dv, true);
}

// The sequence of a work tile as the producer and the consumers read it: its query rows and keys, causal
// offset, band and diagonal, and where its rows sit in the tensor maps (a first row and a batch coordinate).
// Dense (Fa3Dense): the call's own values, read from the parameter `p` (each accessor takes it) where they
// are used, so that the dense entries' code is what it was (a struct holding a reference to the parameter
// instead cost the plain entries 3 % more instructions, moves into uniform registers). Ragged (Fa3Ragged):
// sequence b of a ragged batch (seq_view: its band and diagonal measured from its own lengths, as fa2 runs
// them; a paged one's cache length, k0 = 0) in maps over the packed rows as one batch (K/V: or the pages).
// Rows loaded past a sequence's end are other data (the next sequence's rows; TMA's zeros only past the
// last), so every key at or past sk() is masked wherever a tile reaches it and no row at or past sq() is
// stored.
struct Fa3Dense {
    int b;
    static constexpr bool RAGGED = false;
    static constexpr bool PAGED = false;
    __device__ __forceinline__ int sq(const AttnParams& p) const { return p.sq; }
    __device__ __forceinline__ int sk(const AttnParams& p) const { return p.sk; }
    __device__ __forceinline__ int causal_offset(const AttnParams& p) const { return p.causal_offset; }
    __device__ __forceinline__ int band_lo(const AttnParams& p) const { return p.band_lo; }
    __device__ __forceinline__ int band_hi(const AttnParams& p) const { return p.band_hi; }
    __device__ __forceinline__ int diag_offset(const AttnParams& p) const { return p.diag_offset; }
    __device__ __forceinline__ int q_row0() const { return 0; }  // the Q map's row of query row 0
    __device__ __forceinline__ int k_row0() const { return 0; }  // the K/V maps' row of key 0
    __device__ __forceinline__ int map_b() const { return b; }   // the maps' batch coordinate
};
template <bool PAGED_>
struct Fa3Ragged {
    int b, q0, k0, sq_, sk_, lo, hi, diag;
    static constexpr bool RAGGED = true;
    static constexpr bool PAGED = PAGED_;  // K/V through the block table (k0 = 0)
    __device__ __forceinline__ int sq(const AttnParams&) const { return sq_; }
    __device__ __forceinline__ int sk(const AttnParams&) const { return sk_; }
    // Plain causal entries: key j visible to row i iff j <= i + diag (fa2's `causal_offset = diag_offset`).
    __device__ __forceinline__ int causal_offset(const AttnParams&) const { return diag; }
    __device__ __forceinline__ int band_lo(const AttnParams&) const { return lo; }
    __device__ __forceinline__ int band_hi(const AttnParams&) const { return hi; }
    __device__ __forceinline__ int diag_offset(const AttnParams&) const { return diag; }
    __device__ __forceinline__ int q_row0() const { return q0; }
    __device__ __forceinline__ int k_row0() const { return k0; }
    __device__ __forceinline__ int map_b() const { return 0; }
};

// Work tile w of a ragged call: entry w / Hq of the schedule (heaviest first; src/kernels/fa3.rs), head
// w % Hq, so that the heads of one (sequence, query tile) run side by side as a dense call's tiles of one
// weight do. Every thread that takes the tile resolves it alike (a few cached loads; seq_view reads a paged
// sequence's cache length and gives it k0 = 0).
template <bool PAGED>
__device__ __forceinline__ Fa3Ragged<PAGED> fa3_ragged_tile(const Fa3Args& a, int w, int& h, int& m_block) {
    const int e = w / a.p.hq;
    h = w - e * a.p.hq;
    const int b = __ldg(a.seq_tiles + 2 * e);
    m_block = __ldg(a.seq_tiles + 2 * e + 1);
    const SeqView s = seq_view(a.p, b);
    return Fa3Ragged<PAGED>{b, s.q0, s.k0, s.sq, s.sk, s.band_lo, s.band_hi, s.diag_offset};
}

// First key and one past the last key that some row of [r_first, r_last] sees under the band: the union of
// the rows' bands (each row's band is the previous one shifted by a key, so the union is one range), clamped
// to [0, Sk] (common.cuh band_first for the first); empty when end <= first.
template <typename S>
__device__ __forceinline__ void fa3_band_keys(const AttnParams& p, const S& sv, int r_first, int r_last, int& first,
                                              int& end) {
    const long long f = (long long)r_first + sv.band_lo(p);
    first = f < 0 ? 0 : (f > sv.sk(p) ? sv.sk(p) : (int)f);
    const long long e = (long long)r_last + sv.band_hi(p) + 1;
    end = e < 0 ? 0 : (e > sv.sk(p) ? sv.sk(p) : (int)e);
}

// K/V tiles a query tile [m0, m_end) loads: tiles t0 .. t0 + n_tiles - 1 (of BN keys; the count is returned).
// All of them, or under a causal mask those up to its last visible key (t0 = 0); under a band (VAR) those
// holding a key some row sees, from the first row's first key to the last row's last one, so that tiles
// wholly before or after every row's window are never loaded.
template <int BN, int MASK, int VAR, typename S>
__device__ __forceinline__ int fa3_kv_tiles(const AttnParams& p, const S& sv, int m0, int m_end, int& t0) {
    t0 = 0;
    if constexpr (VAR != 0) {
        int first, end;
        fa3_band_keys(p, sv, m0, m_end - 1, first, end);
        if (end <= first) return 0;
        t0 = first / BN;
        return (end + BN - 1) / BN - t0;
    }
    int n_keys = sv.sk(p);
    if (MASK == FA3_MASK_CAUSAL) n_keys = max(0, min(sv.sk(p), m_end + sv.causal_offset(p)));
    return (n_keys + BN - 1) / BN;
}

// Whether consumer c has rows in the query tile at m0: a warpgroup whose rows all lie past Sq (the last tile
// of a short Sq) gets no Q (a box wholly outside the tensor), computes nothing and releases every K/V tile
// unread. The producer and the consumer decide it alike, so their counts of Q loads agree.
template <typename S>
__device__ __forceinline__ bool fa3_has_rows(const AttnParams& p, const S& sv, int m0, int c) {
    return m0 + 64 * c < sv.sq(p);
}

// The producer's work for one query tile, by its issuing thread: each consumer's Q (rows m0 + 64c.. of the
// sequence `sv`, head h), once that consumer released its previous Q, and the n_tiles K and V tiles of (sv,
// kvh) from key tile t0 on (keys (t0 + j) BN..) into the ring. `ring` is how many tiles went through the ring before
// this query tile (tile j of it takes slot (ring + j) % ST, in that slot's use (ring + j) / ST); nq[c]
// counts consumer c's Q loads so far. The first
// K tile goes before the Q loads: its slot frees earlier than the Q buffers do.
template <typename T, int D, int DV, int BN, int ST, int NC, int XO, typename S>
__device__ __forceinline__ void fa3_produce_tile(const Fa3Args& a, const Fa3Ring& r, const S& sv, int h, int kvh,
                                                 int m0, int t0, int n_tiles, int ring, int (&nq)[NC]) {
    const int b = sv.map_b(), kr = sv.k_row0();  // the maps' batch and first key row
    // The boxes of key tile j, 64 (V) or COLS (K) columns from `col`, into `dst`: one box of BN keys, or for
    // a paged cache BN / PB boxes of PB = min(BN, page size) keys (a multiple of 8: whole 1024-byte swizzle
    // atoms), each from its page: block-table column key / page size, clamped into the row (keys past the
    // sequence's pages are masked) and the page index into the pool (the table is the caller's data, as
    // common.cuh's kv_row_offset clamps it).
    auto boxes = [&](unsigned dst, const Sm90TensorMap* map, int col, int j, unsigned bar,
                     unsigned long long policy) {
        if constexpr (!S::PAGED) {
            sm90_tma_load(dst, map, col, kr + (t0 + j) * BN, kvh, b, bar, policy);
        } else {
            const AttnParams& p = a.p;
            const unsigned* row = p.block_table + (i64)sv.b * p.max_pages;
            const int ps = p.page_size, pb = min(BN, ps);
            for (int i = 0; i < BN; i += pb) {
                const int key = (t0 + j) * BN + i;
                const unsigned page = min(__ldg(row + min(key / ps, p.max_pages - 1)), (unsigned)(p.num_pages - 1));
                sm90_tma_load(dst + i * 128, map, col, key % ps, kvh, (int)page, bar, policy);
            }
        }
    };
    using L = Fa3Smem<T, D, DV, BN, ST, NC, XO>;
    constexpr int CB = L::DS / L::COLS, CBV = L::DVS / 64;  // box blocks of a Q/K row and of a V row
    // Blocks holding some of the call's columns: the others are never loaded.
    const int kb = fa3_live_blocks<L::DS, L::COLS>(a.p.d), vb = fa3_live_blocks<L::DVS>(a.p.dv);
    const unsigned long long pol = sm90_l2_policy(2);  // K/V are read by every query tile of the head
    auto load_k = [&](int j) {
        const int s = (ring + j) % ST, use = (ring + j) / ST;
        if (use > 0) sm90_mbar_wait(r.k_empty + 8 * s, (use - 1) & 1);
        sm90_mbar_expect(r.k_full + 8 * s, kb * L::BLOCK_KV);
#pragma unroll
        for (int c = 0; c < CB; ++c)
            if (c < kb)
                boxes(r.k + s * L::K_BYTES + c * L::BLOCK_KV, &a.k, L::COLS * c, j, r.k_full + 8 * s, pol);
    };
    auto load_v = [&](int j) {
        if constexpr (L::VT_STAGED) {
            // V as stored, into the staging ring (the transposing warps release a slot once they read it):
            // boxes of 128 columns, as K's, those past the call's dv never loaded.
            constexpr int CBS = L::VS_BYTES / (BN * 128);
            const int s = (ring + j) % L::SV, use = (ring + j) / L::SV;
            const int live = fa3_live_blocks<CBS * 128, 128>(a.p.dv);
            if (use > 0) sm90_mbar_wait(r.vs_empty + 8 * s, (use - 1) & 1);
            sm90_mbar_expect(r.vs_full + 8 * s, live * BN * 128);
#pragma unroll
            for (int c = 0; c < CBS; ++c)
                if (c < live) boxes(r.vs + s * L::VS_BYTES + c * BN * 128, &a.v, 128 * c, j, r.vs_full + 8 * s, pol);
            return;
        }
        const int s = (ring + j) % ST, use = (ring + j) / ST;
        if (use > 0) sm90_mbar_wait(r.v_empty + 8 * s, (use - 1) & 1);
        if constexpr (Fa3Elem<T>::FP8) {
            // One box of Vᵀ: keys j·BN.. (128 bytes) of its DV rows (zeros past the call's dv).
            sm90_mbar_expect(r.v_full + 8 * s, L::V_BYTES);
            sm90_tma_load(r.v + s * L::V_BYTES, &a.v, kr + (t0 + j) * BN, 0, kvh, b, r.v_full + 8 * s, pol);
        } else {
            sm90_mbar_expect(r.v_full + 8 * s, vb * L::BLOCK_KV);
#pragma unroll
            for (int c = 0; c < CBV; ++c)
                if (c < vb)
                    boxes(r.v + s * L::V_BYTES + c * L::BLOCK_KV, &a.v, 64 * c, j, r.v_full + 8 * s, pol);
        }
    };
    if (n_tiles > 0) load_k(0);
#pragma unroll
    for (int w = 0; w < NC; ++w) {
        if (!fa3_has_rows(a.p, sv, m0, w)) continue;
        if (nq[w] > 0) sm90_mbar_wait(r.q_empty + 8 * w, (nq[w] - 1) & 1);
        sm90_mbar_expect(r.q_full + 8 * w, kb * L::BLOCK_Q);
        const unsigned dst = r.q + w * L::Q_BYTES;
#pragma unroll
        for (int c = 0; c < CB; ++c)
            if (c < kb)
                sm90_tma_load(dst + c * L::BLOCK_Q, &a.q, L::COLS * c, sv.q_row0() + m0 + 64 * w, h, b, r.q_full + 8 * w,
                              sm90_l2_policy(0));
        ++nq[w];
    }
    for (int j = 0; j < n_tiles; ++j) {
        if (j > 0) load_k(j);
        load_v(j);
    }
}

// One raw score x (Q·Kᵀ, unscaled) of a variant instantiation in log2 units: scaled, softcapped (SOFTCAP,
// the constants of Fa3Args), minus a2 |j - diag(i)| (ALIBI: `a2` the head's slope times log2(e), `dist` =
// j - diag(i), exact in f32 below 2^24): sdpa_core's order, softcap on the scaled natural-unit score and then
// the bias (common.cuh variant_score_at). The softcap takes fa2_mma.cuh's form (Fa2Softcap: one ex2 and one
// rcp on the special-function unit, tanh's absolute error about 1e-6, saturating exactly, NaN stays NaN; its
// note says why not tanh.approx.f32 or tanhf).
template <int VAR>
__device__ __forceinline__ float fa3_variant_score(const Fa3Args& a, float x, float a2, float dist) {
    float y;
    if constexpr ((VAR & FA3_VAR_SOFTCAP) != 0) {
        y = fmaf(a.softcap_c2, fast_rcp(1.f + fast_exp2(x * a.softcap_kc)), a.softcap_c1);
    } else {
        y = x * a.p.scale_log2;
    }
    if constexpr ((VAR & FA3_VAR_ALIBI) != 0) y = fmaf(-a2, fabsf(dist), y);
    return y;
}

// One consumer warpgroup's work for one query tile (rows m0 .. m0 + 127 of the sequence `sv`, head h; this
// warpgroup's are m0 + 64 wgi ..): wait for its Q (`q_phase`: the parity of its Q barrier for this tile), run the n_tiles
// K/V tiles the producer fills from ring position `ring` (key tiles t0.., fa3_kv_tiles), release Q once its
// last S = Q·Kᵀ completed (the producer loads the next tile's Q meanwhile), write O (and LSE); a warp that
// wrote a non-finite value repairs its rows (fa3_repair_warp_rows).
template <typename T, int D, int DV, int BN, int ST, int MASK, bool PP, int NC, int VAR, int XO, typename S>
__device__ __forceinline__ void fa3_consume_tile(const Fa3Args& a, unsigned char* smem, const Fa3Ring& r, const S& sv,
                                                 int h, int m0, int t0, int n_tiles, int ring, int q_phase, int& turn) {
    using L = Fa3Smem<T, D, DV, BN, ST, NC, XO>;
    const AttnParams& p = a.p;
    const int b = sv.b;  // the batch, or the sequence of a ragged call
    constexpr int NT = BN / 8;                      // n8 tiles of S
    constexpr int KS = Fa3Elem<T>::KSTEP;           // k of one wgmma step: 16, or 32 for FP8
    constexpr int KT = BN / KS;                     // k steps of P·V
    constexpr int DT = DV / 8;   // n8 tiles of O
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int g = lane >> 2, t = lane & 3;
    const int wgi = warp / 4;
    bool bad = false;

    const int wrow = 64 * wgi + 16 * (warp % 4);  // this warp's first row in the block
    const unsigned aQw = r.q + wgi * L::Q_BYTES, aK = r.k, aV = r.v;
    const unsigned q_full = r.q_full, q_empty = r.q_empty, k_full = r.k_full, k_empty = r.k_empty,
                   v_full = r.v_full, v_empty = r.v_empty;
    // Slot and parity of tile j of this query tile.
    auto slot = [&](int j) { return (ring + j) % ST; };
    auto phase = [&](int j) { return ((ring + j) / ST) & 1; };
    const bool has_rows = fa3_has_rows(p, sv, m0, wgi);
    // The last key any row of this warpgroup sees, under a causal mask; tiles past it are skipped.
    const int wg_last_key = m0 + 64 * wgi + 63 + sv.causal_offset(p);

    float o[DT * 4];
#pragma unroll
    for (int i = 0; i < DT * 4; ++i) o[i] = 0.f;
    float m[2] = {SDPA_NEG_INF, SDPA_NEG_INF}, l[2] = {0.f, 0.f};
    const float sl2 = p.scale_log2;
    // Softcap and ALiBi (PRE) turn every score into log2 units before the max, so the softmax then takes
    // them as they are (sc = 1); otherwise it folds the scale into its exp2 (sc = sl2), as the plain kernel.
    constexpr bool PRE = (VAR & (FA3_VAR_SOFTCAP | FA3_VAR_ALIBI)) != 0;
    const float sc = PRE ? 1.f : sl2;
    // Eighths of the exponentials on the FMA pipe (the rest on the MUFU): at D = 64, or with FP8's doubled
    // tensor rate, a tile's exponentials take the MUFU about as long as its two products take the tensor cores.
    constexpr int EF = fa3_exp_fma_eighths<T, D, XO>();
    // The eager rule only under the measurement switch (FA3_MAX_SLACK).
    constexpr bool EAGER = (XO & FA3_XO_EAGER_MAX) != 0;
    float s[NT * 4];
    unsigned pa[KT][4];

    // S = Q·Kᵀ of the tile in slot sj, issued and committed, not waited for. Each step's descriptor is the
    // tile's low word plus the step's offset / 16 (fa3_wgmma.cuh: the address field is bits 0-13 and every
    // address stays below 2^18) under the shared high word. The low words pass through fa3_opaque once they
    // are formed, so that each step costs one add: not refolded into a masked and shifted address per step
    // (the D = 64 loop went from 507 to 464 instructions per key tile), and not hoisted out of the tile
    // loop and held (two 64-bit registers per k16 step; the wide classes spilled for them).
    constexpr bool FOLD = (XO & FA3_XO_DESC_FOLD) != 0;
    // Causal (f16/bf16, 128-key tiles): a warpgroup whose rows see only the first 64 keys of its last tile (with
    // two consumers and a diagonal on tile bounds, the first consumer of each diagonal work tile) runs that tile's
    // P·V over those 64 keys only: P is 0 at the other 64 for every row. At S = 512 that is a twentieth of the
    // tensor work, on each tile's critical path.
    // Q·Kᵀ at N = 64 there as well (session 21) made ptxas serialize the wgmma pipeline whichever way it was
    // written (C7520, C7515, C7511: accumulators written on one path only, or too few registers for two
    // shapes), and the causal kernels ran 0.7x as fast, so Q·Kᵀ stays whole. FA3_XO_FULL_DIAG runs the whole
    // P·V (before session 21).
    constexpr bool HALF = MASK == FA3_MASK_CAUSAL && VAR == 0 && !Fa3Elem<T>::FP8 && BN == 128 && !FOLD &&
                          (XO & FA3_XO_FULL_DIAG) == 0;
    auto issue_qk = [&](int sj) {
        // The tile's low words: opaque once formed (the product), or formed from opaque addresses (FOLD).
        auto lo = [&](unsigned addr) {
            if constexpr (FOLD) return fa3_desc_lo_k(fa3_opaque(addr));
            else return fa3_opaque(fa3_desc_lo_k(addr));
        };
        const unsigned dq = lo(aQw), dk = lo(aK + sj * L::K_BYTES);
        fa3_fence();
#pragma unroll
        for (int kk = 0; kk < D / KS; ++kk) {
            // k step kk: column block kk / 4, 32 bytes per step into its 128-byte rows (k16 of 2-byte
            // elements or k32 of E4M3).
            const int off = (kk % 4) * 32, oq = ((kk / 4) * L::BLOCK_Q + off) / 16,
                      ok = ((kk / 4) * L::BLOCK_KV + off) / 16;
            if constexpr (FOLD) {
                fa3_ss(s, fa3_desc(dq) + oq, fa3_desc(dk) + ok, kk > 0, T());  // 64-bit adds, as before
            } else {
                fa3_ss(s, fa3_desc(dq + oq), fa3_desc(dk + ok), kk > 0, T());
            }
        }
        fa3_commit();
    };
    // O += P·V of the tile in slot sj, issued and committed (`half`: its first 64 keys only, HALF above).
    auto issue_pv = [&](int sj, bool half) {
        fa3_fence();
        if constexpr (Fa3Elem<T>::FP8) {
            fa3_fp8_pv<DV, KT>(o, pa, fa3_opaque(fa3_desc_lo_k(aV + sj * L::V_BYTES)));  // Vᵀ, K-major (fa3_fp8.cuh)
        } else {
            // keys 16kk..16kk+15: two groups of 8 rows, 2048 bytes per step
            if constexpr (FOLD) {
                const unsigned va = fa3_opaque(aV + sj * L::V_BYTES);  // each step's low word from its address
#pragma unroll
                for (int kk = 0; kk < KT; ++kk)
                    fa3_pv_step<DV, T>(o, pa[kk], fa3_desc_lo_mn(va + kk * 2048, L::BLOCK_KV), L::BLOCK_KV);
            } else {
                const unsigned v0 = fa3_opaque(fa3_desc_lo_mn(aV + sj * L::V_BYTES, L::BLOCK_KV));
                if (HALF && fa3_warp_uniform(half)) {
#pragma unroll
                    for (int kk = 0; kk < KT / 2; ++kk)  // keys 0..63
                        fa3_pv_step<DV, T>(o, pa[kk], v0 + kk * (2048 / 16), L::BLOCK_KV);
                } else {
#pragma unroll
                    for (int kk = 0; kk < KT; ++kk) fa3_pv_step<DV, T>(o, pa[kk], v0 + kk * (2048 / 16), L::BLOCK_KV);
                }
            }
        }
        fa3_commit();
    };
    // Mask and online softmax of S (tile starting at key n0); returns whether some row's maximum changed,
    // with the factors in alpha. O is not touched (it may be in flight). `masked` (Fa3Flag) says whether
    // the tile may need a mask: the tiles before the warpgroup's first one that does run a copy of the
    // loop without the mask code (fewer live registers: three consumers at 160 each spilled there).
    auto softmax = [&](int n0, float (&alpha)[2], auto masked) {
        if constexpr (VAR == 0) {
            const bool edge = decltype(masked)::value &&
                              ((n0 + BN > sv.sk(p)) ||
                               (MASK == FA3_MASK_CAUSAL && n0 + BN - 1 > m0 + wrow + sv.causal_offset(p)));
            if (edge) {
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int row = m0 + wrow + g + hh * 8;
#pragma unroll
                    for (int j = 0; j < NT; ++j)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int key = n0 + j * 8 + 2 * t + e;
                            bool vis = key < sv.sk(p);
                            if (MASK == FA3_MASK_CAUSAL) vis = vis && key <= row + sv.causal_offset(p);
                            if (!vis) s[j * 4 + hh * 2 + e] = SDPA_NEG_INF;
                        }
                }
            }
        } else {
            // Variants: softcap and ALiBi on every score (PRE), and the band test only where the tile crosses a
            // band edge of one of this warp's 16 rows or the end of the keys (`edge`; a warp-uniform branch, so
            // the two passes are separate code and the common one carries no test). 32-bit arithmetic: the
            // host refuses variant calls with Sq + Sk near 2^31 (fa3.rs `check`), so keys minus band bounds and
            // distances fit; 64-bit compares here made ptxas spill in the main loop (17 spill instructions at
            // D = 256 band, 40 at 192 softcap; none in 32 bits).
            const int r0 = m0 + wrow;
            const bool edge = decltype(masked)::value &&
                              (n0 + BN > sv.sk(p) || n0 - sv.band_lo(p) < r0 + 15 || n0 + BN - 1 - sv.band_hi(p) > r0);
            // The head's ALiBi slope in log2 units, read per key tile (an L1 hit): held across the loop it
            // cost spills there (33 spill instructions at D = 128 against 13).
            const float a2 = (VAR & FA3_VAR_ALIBI) != 0 ? p.alibi[h] * SDPA_LOG2E : 0.f;
            auto pass = [&](auto band) {
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int row = r0 + g + hh * 8;
                    // This thread's first key's distance from the row's diagonal, j - diag(i).
                    const float dist0 = (float)(n0 + 2 * t - row - sv.diag_offset(p));
#pragma unroll
                    for (int j = 0; j < NT; ++j)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            float& x = s[j * 4 + hh * 2 + e];
                            if constexpr (PRE) x = fa3_variant_score<VAR>(a, x, a2, dist0 + (float)(j * 8 + e));
                            if constexpr (decltype(band)::value) {
                                const int key = n0 + j * 8 + 2 * t + e;
                                const int rel = key - row;
                                if (!(key < sv.sk(p) && rel >= sv.band_lo(p) && rel <= sv.band_hi(p))) x = SDPA_NEG_INF;
                            }
                        }
                }
            };
            if (edge) pass(Fa3Flag<true>());
            else if constexpr (PRE) pass(Fa3Flag<false>());
        }
        bool rescale = false;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            float mx = SDPA_NEG_INF;
#pragma unroll
            for (int j = 0; j < NT; ++j) mx = fmaxf(mx, fmaxf(s[j * 4 + hh * 2], s[j * 4 + hh * 2 + 1]));
            mx = quad_max(mx);
            const float m_old = m[hh];
            // The row's reference maximum (log2 units) moves only when the tile's maximum passes it by more
            // than FA3_MAX_SLACK (EAGER: whenever it grows); P is then at most 2^FA3_MAX_SLACK, and O and l
            // stay exact (both are taken against the same reference, and the LSE is m + log2 l).
            const float m_tile = mx * sc;
            // (The difference, not m_old + SLACK: that sum rounds up past SLACK once |m_old| >= 2^27.)
            const float m_new = !EAGER && m_tile - m_old <= FA3_MAX_SLACK ? m_old : fmaxf(m_old, m_tile);
            const float m_use = m_new == SDPA_NEG_INF ? 0.f : m_new;
            const float al = fast_exp2(m_old - m_use);
            alpha[hh] = al;
            rescale |= al != 1.f;
            m[hh] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& x = s[j * 4 + hh * 2 + e];
                    const float y = fmaf(x, sc, -m_use);
                    x = (j * EF) % 8 < EF ? fma_exp2(y) : fast_exp2(y);
                    sum += x;
                }
            l[hh] = l[hh] * al + sum;  // per-thread partial; the quad is summed at the end
        }
        return __any_sync(0xffffffffu, rescale);
    };
    auto rescale_o = [&](const float (&alpha)[2]) {
#pragma unroll
        for (int j = 0; j < DT; ++j) {
            o[j * 4 + 0] *= alpha[0];
            o[j * 4 + 1] *= alpha[0];
            o[j * 4 + 2] *= alpha[1];
            o[j * 4 + 3] *= alpha[1];
        }
    };
    // P in the A-fragment order of k16 step kk: the C fragments of n8 tiles 2kk and 2kk + 1.
    auto take_p = [&]() {
        if constexpr (Fa3Elem<T>::FP8) {
            fa3_fp8_take_p(pa, s);  // E4M3 fragments, keys in Vᵀ's order (fa3_fp8.cuh)
        } else {
#pragma unroll
            for (int kk = 0; kk < KT; ++kk) {
                pa[kk][0] = fa3_pack<T>(s[8 * kk + 0], s[8 * kk + 1]);
                pa[kk][1] = fa3_pack<T>(s[8 * kk + 2], s[8 * kk + 3]);
                pa[kk][2] = fa3_pack<T>(s[8 * kk + 4], s[8 * kk + 5]);
                pa[kk][3] = fa3_pack<T>(s[8 * kk + 6], s[8 * kk + 7]);
            }
        }
    };
    // Tiles this warpgroup computes: ja .. je - 1 of the query tile's 0 .. n_tiles - 1. A causal mask skips
    // only trailing tiles (ja = 0); a band (VAR) also the leading ones before its first row's first key. The
    // others are released unread (`skip`).
    int ja = 0, je = n_tiles;
    if (MASK == FA3_MASK_CAUSAL) je = wg_last_key < 0 ? 0 : min(n_tiles, wg_last_key / BN + 1);
    // Under a band, tiles jp0 .. jp1 - 1 need no mask for any row of this warpgroup (warpgroup-uniform: the
    // products are the warpgroup's): every row sees all of their keys.
    int jp0 = 1, jp1 = 0;
    if constexpr (VAR != 0) {
        const int r0 = m0 + 64 * wgi, r1 = min(r0 + 63, sv.sq(p) - 1);
        int first, end;
        fa3_band_keys(p, sv, r0, r1, first, end);
        ja = end > first ? min(n_tiles, max(0, first / BN - t0)) : 0;
        je = end > first ? max(ja, min(n_tiles, (end + BN - 1) / BN - t0)) : 0;
        // Keys [k0, k0 + BN) lie in every row's band when k0 is at or past the last row's first key and
        // k0 + BN at or before one past the first row's last key (and Sk).
        const long long lo_key = (long long)r1 + sv.band_lo(p);
        const long long hi_end = min((long long)r0 + sv.band_hi(p) + 1, (long long)sv.sk(p));
        jp0 = (int)(lo_key <= 0 ? 0 : (lo_key + BN - 1) / BN) - t0;
        jp1 = (int)(hi_end <= 0 ? 0 : hi_end / BN) - t0;
    }
    if (!has_rows) {
        ja = 0;
        je = 0;
    }
    // HALF: this warpgroup's last tile, when its last row sees at most the tile's first 64 keys.
    const bool half_last = HALF && je > ja && wg_last_key - (t0 + je - 1) * BN < BN / 2;
    // Turns (PP): the consumers issue their products in turn, round robin over the block's whole run
    // (`turn` counts this warpgroup's turns across its tiles): warpgroup w waits on named barrier 3 + w and
    // hands the turn to the next one's. Each takes exactly n_tiles + 1 turns per tile (its issue steps, one
    // empty turn per skipped tile, then empty turns to make up the count), so the order holds across tiles:
    // the next tile's first products follow the current tile's last ones at once, while the other
    // warpgroups still finish theirs and store O. Warpgroup 0 takes its very first turn without waiting;
    // the last warpgroup's last hand-over is taken by fa3_forward (fa3_end_turns).
    // With FA3_XO_TILE_TURNS (a measurement switch) the round restarts at every tile instead: the last
    // warpgroup hands warpgroup 0 its first turn when it enters the tile and keeps its own last one.
    constexpr bool TT = (XO & FA3_XO_TILE_TURNS) != 0;
    const int turns = n_tiles > 0 ? n_tiles + 1 : 0;
    const int turns_end = turn + turns;
    const bool last_wg = wgi == NC - 1;
    if (PP && TT && last_wg && turns > 0) asm volatile("bar.arrive 3, 256;\n" ::: "memory");
    auto turn_begin = [&]() {
        if (PP && (TT || wgi != 0 || turn > 0)) asm volatile("bar.sync %0, 256;\n" ::"r"(3 + wgi) : "memory");
    };
    auto turn_end = [&]() {
        if (PP && !(TT && last_wg && turn == turns_end - 1))
            asm volatile("bar.arrive %0, 256;\n" ::"r"(3 + (last_wg ? 0 : wgi + 1)) : "memory");
        ++turn;
    };
    if (has_rows) sm90_mbar_wait(q_full + 8 * wgi, q_phase);
    // Q is free for the next tile's once every thread's last S = Q·Kᵀ completed (or at once: no tile).
    auto release_q = [&]() { sm90_mbar_arrive(q_empty + 8 * wgi); };
    if (has_rows && je == ja) release_q();
    // A tile this warpgroup does not compute: released unread, after it landed, so that every release of a
    // slot answers exactly one fill of it; it takes one empty turn (the count stays n_tiles + 1), first: a
    // skip at turn j waits for V(j), whose fill may wait (ST = 1) for V(j - 1) from a later warpgroup that
    // releases it only after its own turn j (three consumers, the first seeing no key: a deadlock when the
    // waits came before the turn; the simulation in src/kernels/fa3/protocol.rs).
    auto skip = [&](int j) {
        const int sj = slot(j), ph = phase(j);
        turn_begin();
        turn_end();
        sm90_mbar_wait(k_full + 8 * sj, ph);
        sm90_mbar_arrive(k_empty + 8 * sj);
        sm90_mbar_wait(v_full + 8 * sj, ph);
        sm90_mbar_arrive(v_empty + 8 * sj);
    };
    // Tiles before this warpgroup's first key (a band only): the ring fills them in order, so they are
    // released before this warpgroup waits for its own.
    if constexpr (VAR != 0) {
        for (int j = 0; j < ja; ++j) skip(j);
    }
    if (je > ja) {
        sm90_mbar_wait(k_full + 8 * slot(ja), phase(ja));
        turn_begin();
        issue_qk(slot(ja));
        turn_end();
        fa3_wait<0>();
        fa3_pin(s);
        if (je - ja == 1) release_q();
        sm90_mbar_arrive(k_empty + 8 * slot(ja));
        float alpha[2];
        softmax((t0 + ja) * BN, alpha, Fa3Flag<true>());  // O is still zero: no rescale needed
        take_p();
    }
    // Key tiles ja + 1 .. je - 1: S(j) issued before P(j-1)·V(j-1), the softmax of j under that product.
    auto step = [&](int j, auto masked) {
        const int sj = slot(j), sp = slot(j - 1);
        sm90_mbar_wait(k_full + 8 * sj, phase(j));
        sm90_mbar_wait(v_full + 8 * sp, phase(j - 1));
        turn_begin();
        issue_qk(sj);
        fa3_pin(o);
        issue_pv(sp, false);
        turn_end();
        fa3_wait<1>();  // S(j) is done; P(j-1)·V(j-1) may still run
        fa3_pin(s);
        if (j == je - 1) release_q();
        sm90_mbar_arrive(k_empty + 8 * sj);
        float alpha[2];
        const bool rs = softmax((t0 + j) * BN, alpha, masked);
        fa3_wait<0>();
        fa3_pin(o);
        sm90_mbar_arrive(v_empty + 8 * sp);
        if (rs) rescale_o(alpha);
        take_p();
    };
    // The tiles that need no mask code run in their own loop (each loop is its own copy of `step`).
    if constexpr (VAR == 0) {
        // The first tile that may need a mask for some row of this warpgroup (warpgroup-uniform: the
        // products are the warpgroup's): the partial last tile of the keys, or under a causal mask the first
        // crossing the diagonal of the warpgroup's first row.
        int j_mask = sv.sk(p) / BN;
        if (MASK == FA3_MASK_CAUSAL) j_mask = min(j_mask, max(0, (m0 + 64 * wgi + sv.causal_offset(p) + 1) / BN));
        const int j_plain = max(1, min(j_mask, je));
        for (int j = 1; j < j_plain; ++j) step(j, Fa3Flag<false>());
        for (int j = j_plain; j < je; ++j) step(j, Fa3Flag<true>());
    } else {
        // Under a band: a masked run (tiles crossing the rows' first keys), the plain run jp0 .. jp1 - 1, a
        // masked run (the rows' last keys and the end of the keys).
        const int a1 = min(max(ja + 1, jp0), je), a2 = min(max(a1, jp1), je);
        for (int j = ja + 1; j < a1; ++j) step(j, Fa3Flag<true>());
        for (int j = a1; j < a2; ++j) step(j, Fa3Flag<false>());
        for (int j = a2; j < je; ++j) step(j, Fa3Flag<true>());
    }
    // The row sums are final after the last softmax: the product reduces them across the quad while the last
    // P·V runs (FA3_XO_DIRECT_O: in the epilogue, after it).
    constexpr bool DIRECT_O = (XO & (FA3_XO_DIRECT_O | FA3_XO_STORE16)) != 0;
    float lsum[2], inv[2];
    auto row_sums = [&]() {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            lsum[hh] = quad_sum(l[hh]);
            // NaN stays NaN; no key seen: zeros. o_scale: V's FP8 descale (1 otherwise, exactly 1 / lsum).
            inv[hh] = lsum[hh] == 0.f ? 0.f : a.o_scale / lsum[hh];
        }
    };
    if (je > ja) {
        const int sp = slot(je - 1);
        sm90_mbar_wait(v_full + 8 * sp, phase(je - 1));
        turn_begin();
        fa3_pin(o);
        issue_pv(sp, half_last);
        turn_end();
        if constexpr (!DIRECT_O) row_sums();
        fa3_wait<0>();
        fa3_pin(o);
        sm90_mbar_arrive(v_empty + 8 * sp);
    } else {
        if constexpr (!DIRECT_O) row_sums();
    }
    // Tiles past this warpgroup's rows (causal) or last keys (band).
    for (int j = je; j < n_tiles; ++j) skip(j);
    while (turn < turns_end) {
        turn_begin();
        turn_end();
    }

    // Epilogue: normalise, round to the output type (T, or bf16 for FP8 inputs) and store the columns below
    // p.dv (a multiple of 8: whole n8 tiles; the others are padding, and may hold garbage from V blocks never
    // loaded). A row that wrote a non-finite value is repaired below: the product tracks each row's largest
    // |x| over its stored columns with a NaN-keeping maximum (one instruction per value, no branch).
    // Where the block has room (L::O_STAGED), each warp rounds its 16 rows into its own staging tile with
    // stmatrix and writes them back as 16-byte chunks, whole 128-byte lines per quarter warp. Elsewhere each
    // thread stores its two columns of each n8 tile, 4 bytes each. Session 20's ncu source page at D = 128,
    // S = 512 (bench/studies/session20) had the epilogue at a quarter of the consumers' stall samples: a
    // branch per finiteness test and the 4-byte stores' queue (a register waits until its store has read it).
    // FA3_XO_DIRECT_O (and FA3_XO_STORE16, session 8's 16-byte stores after a quad transpose) run the
    // sessions 10-19 epilogue instead.
    static_assert(DT % 4 == 0, "whole groups of four n8 tiles of O");
    using TO = typename Fa3Elem<T>::Out;
    // A ragged call's O rows are packed: row i of its sequence is row q0 + i (the batch stride is not used).
    TO* out = static_cast<TO*>(p.o) + (S::RAGGED ? (i64)sv.q_row0() * p.o_stride[2] : b * p.o_stride[0]) +
              h * p.o_stride[1];
    const int sq = sv.sq(p);
    if constexpr (DIRECT_O) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const float lsum_ = quad_sum(l[hh]);
            const float inv_ = lsum_ == 0.f ? 0.f : a.o_scale / lsum_;
            const int row = m0 + wrow + g + hh * 8;
            TO* orow = out + (i64)row * p.o_stride[2];
#pragma unroll
            for (int j0 = 0; j0 < DT; j0 += 4) {
                unsigned v[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int j = j0 + e;
                    const float x0 = o[j * 4 + hh * 2] * inv_, x1 = o[j * 4 + hh * 2 + 1] * inv_;
                    bad |= row < sq && 8 * j < p.dv && (!isfinite(x0) || !isfinite(x1));
                    v[e] = fa3_pack<TO>(x0, x1);
                }
                if constexpr ((XO & FA3_XO_STORE16) != 0) {
                    // Session 8's stores (a measurement switch): n8 tile j0 + t of this row, columns in order.
                    const uint4 w = fa3_quad_take(v, t);
                    if (row < sq && 8 * (j0 + t) < p.dv) *reinterpret_cast<uint4*>(orow + 8 * (j0 + t)) = w;
                } else {
                    // This thread's two columns of each n8 tile: no shuffles on the way out, which the
                    // short calls (few key tiles per output tile) notice.
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (row < sq && 8 * (j0 + e) < p.dv)
                            *reinterpret_cast<unsigned*>(orow + 8 * (j0 + e) + 2 * t) = v[e];
                }
            }
            // The LSE: [B, Hq, Sq], or [Hq, total_q] for a ragged call (common.cuh lse_row).
            const i64 lse_at = S::RAGGED ? (i64)h * p.total_q + sv.q_row0() + row : ((i64)b * p.hq + h) * p.sq + row;
            if (row < sq && p.lse != nullptr && t == 0)
                p.lse[lse_at] = lsum_ == 0.f ? SDPA_NEG_INF : (m[hh] + log2f(lsum_)) * SDPA_LN2;
        }
    } else {
        // The largest |x| of each of this thread's two rows over the stored columns; NaN if one was NaN.
        float big[2] = {0.f, 0.f};
        auto scaled = [&](int j, int hh, float& x0, float& x1) {
            x0 = o[j * 4 + hh * 2] * inv[hh];
            x1 = o[j * 4 + hh * 2 + 1] * inv[hh];
            if (8 * j < p.dv) big[hh] = fa3_max_nan(big[hh], fa3_max_nan(fabsf(x0), fabsf(x1)));
        };
        if constexpr (L::O_STAGED) {
            // The warp's staging tile: 16 rows of 128 bytes (64 columns), the 16-byte chunks of row r at
            // chunk ^ (r % 8), so that stmatrix's eight rows and a quarter warp's reads of one row each
            // fall in distinct banks. 64 columns at a time.
            const unsigned stage = smem_addr(smem) + L::O_OFF + warp * 2048;
            const int mi = lane >> 3, mr = lane & 7;  // stmatrix: this lane gives row mr of matrix mi
            // The reads: rows 4i + mi of the warp's 16, columns 8 mr .. 8 mr + 7 of each 64.
            TO* const orow = out + (i64)(m0 + wrow + mi) * p.o_stride[2] + 8 * mr;
            const i64 four_rows = 4 * (i64)p.o_stride[2];
#pragma unroll
            for (int c = 0; c < (DT + 7) / 8; ++c) {
                if (64 * c >= p.dv) break;
                __syncwarp();  // every lane has read the tile's previous contents (this block's, or the last tile's)
#pragma unroll
                for (int k = 0; k < 4; ++k) {
                    const int j0 = 8 * c + 2 * k;  // n8 tiles j0, j0 + 1: matrices (rows 0-7, 8-15) x (j0, j0 + 1)
                    if (j0 < DT) {
                        unsigned v[4];
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            float x0, x1;
                            scaled(j0 + (e >> 1), e & 1, x0, x1);
                            v[e] = fa3_pack<TO>(x0, x1);
                        }
                        const int row = (mi & 1) * 8 + mr, chunk = 2 * k + (mi >> 1);
                        fa3_stmatrix_x4(stage + row * 128 + ((chunk ^ mr) << 4), v);
                    }
                }
                __syncwarp();
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int row = 4 * i + mi, col = 64 * c + 8 * mr;
                    const uint4 w = fa3_lds16(stage + row * 128 + ((mr ^ (row & 7)) << 4));
                    fa3_stg16_if(m0 + wrow + row < sq && col < p.dv, orow + i * four_rows + 64 * c, w);
                }
            }
        } else {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int row = m0 + wrow + g + hh * 8;
                TO* orow = out + (i64)row * p.o_stride[2];
#pragma unroll
                for (int j = 0; j < DT; ++j) {
                    float x0, x1;
                    scaled(j, hh, x0, x1);
                    if (row < sq && 8 * j < p.dv)
                        *reinterpret_cast<unsigned*>(orow + 8 * j + 2 * t) = fa3_pack<TO>(x0, x1);
                }
            }
        }
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int row = m0 + wrow + g + hh * 8;
            bad |= row < sq && !(big[hh] < __int_as_float(0x7f800000));
            // The LSE: [B, Hq, Sq], or [Hq, total_q] for a ragged call (common.cuh lse_row).
            const i64 lse_at = S::RAGGED ? (i64)h * p.total_q + sv.q_row0() + row : ((i64)b * p.hq + h) * p.sq + row;
            if (row < sq && p.lse != nullptr && t == 0)
                p.lse[lse_at] = lsum[hh] == 0.f ? SDPA_NEG_INF : (m[hh] + log2f(lsum[hh])) * SDPA_LN2;
        }
    }
    // The warp's own stores are read back by its lanes: __syncwarp orders them. FP8 has no repair yet
    // (careful_row reads the inputs as the output type): a NaN code in V under a masked key of a loaded tile
    // reaches the tile's rows (src/kernels/fa3.rs documents it).
    if constexpr (!Fa3Elem<T>::FP8) {
        if (__any_sync(0xffffffffu, bad)) {
            __syncwarp();
            fa3_repair_warp_rows<T>(&p, b, h, m0 + wrow, sq);
        }
    }
}

// The persistent block: the producer's issuing thread takes the work tiles (Fa3TileSource) and hands each
// to the consumers through the work-tile ring before loading it; the ring position and the Q-load counts
// carry from one tile to the next, so the producer fills the next tile's Q and K/V while the consumers
// finish the current one. SERVE: a dense batch, or a ragged one (FA3_SERVE_VARLEN: the work tiles are the
// schedule's entries times the heads, fa3_ragged_tile, K/V packed or paged; the protocol is the same).
template <typename T, int D, int DV, int BN, int ST, int MASK, bool PP, int NC, int VAR, int XO,
          int SERVE = FA3_SERVE_DENSE>
__device__ __forceinline__ void fa3_forward(const Fa3Args& a, unsigned char* smem) {
    static_assert(VAR == 0 || MASK == FA3_MASK_NONE, "variants: the band as mask");
    static_assert(SERVE == FA3_SERVE_DENSE || (!Fa3Elem<T>::FP8 && XO == 0),
                  "ragged batches: f16/bf16, no measurement switch");
    static_assert(NC >= 1 && NC <= 3 && (!PP || NC >= 2), "1 to 3 consumers; turns (PP) need two or more");
    constexpr bool RAG = SERVE != FA3_SERVE_DENSE;
    using L = Fa3Smem<T, D, DV, BN, ST, NC, XO>;
    constexpr int BM = 64 * NC;
    const AttnParams& p = a.p;
    const int tid = threadIdx.x, warp = tid / 32;
    const int wgi = warp / 4;  // warpgroup; NC is the producer

    const int n_mblocks = (p.sq + BM - 1) / BM;
    const int n_bh = p.b * p.hq, n_work = RAG ? a.n_seq_tiles * p.hq : n_bh * n_mblocks;
    // Work tile w: its sequence (a dense call's batch; returned), head, first row, K/V tiles (t0 ..).
    auto tile = [&](int w, int& h, int& m0, int& t0, int& n_tiles) {
        int m_block;
        if constexpr (RAG) {
            const auto sv = fa3_ragged_tile<SERVE == FA3_SERVE_PAGED>(a, w, h, m_block);
            m0 = m_block * BM;
            n_tiles = fa3_kv_tiles<BN, MASK, VAR>(p, sv, m0, min(m0 + BM, sv.sq(p)), t0);
            return sv;
        } else {
            int bh;
            fa3_tile_of(w, n_mblocks, n_bh, a.section, bh, m_block);
            const Fa3Dense sv{bh / p.hq};
            h = bh % p.hq;
            m0 = m_block * BM;
            n_tiles = fa3_kv_tiles<BN, MASK, VAR>(p, sv, m0, min(m0 + BM, p.sq), t0);
            return sv;
        }
    };

    const unsigned base = smem_addr(smem);
    Fa3Ring r = fa3_ring<L>(base);
    r.sched = reinterpret_cast<volatile int*>(smem + L::SCHED_OFF);
    if ((base & 1023) != 0) __trap();  // the swizzled layout needs 1024-byte aligned tiles
    if (tid == 0) {
#pragma unroll
        for (int c = 0; c < NC; ++c) {
            sm90_mbar_init(r.q_full + 8 * c, 1);
            sm90_mbar_init(r.q_empty + 8 * c, 128);  // every thread of the consumer
        }
#pragma unroll
        for (int s = 0; s < ST; ++s) {
            sm90_mbar_init(r.k_full + 8 * s, 1);  // the producer's expect_tx; the copies' bytes complete it
            sm90_mbar_init(r.v_full + 8 * s, L::VT_STAGED ? FA3_VT_WARPS : 1);  // (or lane 0 of each transposing warp)
            sm90_mbar_init(r.k_empty + 8 * s, 128 * NC);  // every consumer thread
            sm90_mbar_init(r.v_empty + 8 * s, 128 * NC);
        }
#pragma unroll
        for (int s = 0; s < L::SV; ++s) {
            sm90_mbar_init(r.vs_full + 8 * s, 1);  // the producer's expect_tx
            sm90_mbar_init(r.vs_empty + 8 * s, FA3_VT_WARPS);
        }
#pragma unroll
        for (int s = 0; s < FA3_SCHED; ++s) {
            sm90_mbar_init(r.sched_full + 8 * s, 1);  // the producer's store
            sm90_mbar_init(r.sched_empty + 8 * s, 128 * NC + (L::VT_STAGED ? 32 * FA3_VT_WARPS : 0));
        }
        sm90_mbar_init_fence();
    }
    // Q and K blocks wholly past the call's D are never loaded: zero them once, so that Q·Kᵀ adds nothing
    // there (nothing else writes those buffers: O has its own staging).
    const int kb = fa3_live_blocks<L::DS, L::COLS>(p.d);
    if (kb < L::DS / L::COLS) {
        fa3_zero_blocks(smem + L::Q_OFF, NC, L::Q_BYTES, L::DS / L::COLS, kb, L::BLOCK_Q, tid, FA3_THREADS(NC));
        fa3_zero_blocks(smem + L::K_OFF, ST, L::K_BYTES, L::DS / L::COLS, kb, L::BLOCK_KV, tid, FA3_THREADS(NC));
    }
    // The transposing warps write the 32-row blocks of a Vᵀ slot that hold some of the call's dv columns (rows
    // past dv inside them come from TMA's zeros); the blocks past those they never write are zeroed once here, as
    // the pre-pass's map gave them. Only O's columns past dv read them, which are neither stored nor tested; the
    // zeros keep those accumulators finite all the same.
    const int vt_live = fa3_live_blocks<DV, 32>(p.dv);
    if (L::VT_STAGED && vt_live < DV / 32)
        fa3_zero_blocks(smem + L::V_OFF, ST, L::V_BYTES, DV / 32, vt_live, 32 * 128, tid, FA3_THREADS(NC));
    __syncthreads();

    if (wgi == NC) {
        // Producer: its registers go to the consumers; one thread takes the tiles and issues the copies.
        fa3_regs_dec<24>();
        if (tid == 128 * NC) {
            Fa3TileSource src{static_cast<unsigned*>(p.workspace), n_work, 0};
            int ring = 0, nq[NC] = {}, n = 0;
            for (int w = src.first();; w = src.next()) {
                fa3_publish_tile(r, n++, w);
                if (w < 0) break;
                int h, m0, t0, n_tiles;
                const auto sv = tile(w, h, m0, t0, n_tiles);
                fa3_produce_tile<T, D, DV, BN, ST, NC, XO>(a, r, sv, h, h / p.group, m0, t0, n_tiles, ring, nq);
                ring += n_tiles;
            }
        } else if constexpr (L::VT_STAGED) {
            if (tid < 128 * NC + 32) return;
            // FP8: the other three warps write each staged V tile into the Vᵀ ring, in the ring's order (every
            // V tile the producer loads, whether or not a consumer has rows for it), once the consumers
            // released the slot; they follow the work tiles as the consumers do.
            int ring = 0;
            for (int n = 0;; ++n) {
                const int w = fa3_take_tile(r, n);
                if (w < 0) break;
                int h, m0, t0, n_tiles;
                tile(w, h, m0, t0, n_tiles);
                for (int j = 0; j < n_tiles; ++j, ++ring) {
                    const int s = ring % L::SV, vs = ring % ST, vu = ring / ST;
                    sm90_mbar_wait(r.vs_full + 8 * s, (ring / L::SV) & 1);
                    if (vu > 0) sm90_mbar_wait(r.v_empty + 8 * vs, (vu - 1) & 1);
                    fa3_fp8_transpose_v(r.v + vs * L::V_BYTES, r.vs + s * L::VS_BYTES, 32 * vt_live,
                                        warp - 4 * NC - 1, FA3_VT_WARPS, tid % 32);
                    sm90_proxy_fence();  // each lane's stores, for the consumers' wgmma (async proxy)
                    __syncwarp();        // every lane's loads and fenced stores before lane 0's release
                    if (tid % 32 == 0) {
                        sm90_mbar_arrive(r.v_full + 8 * vs);
                        sm90_mbar_arrive(r.vs_empty + 8 * s);
                    }
                }
            }
        }
    } else {
        // The launch gives every thread 65536 / (128 (NC + 1) FA3_MIN_BLOCKS) registers (168, 128, or 128 for
        // NC = 1 at two blocks an SM); the producer's 24 leave the consumers 240 (NC = 2), 160 (NC = 3) or 232
        // (NC = 1).
        fa3_regs_inc<NC == 2 ? 240 : NC == 3 ? 160 : 232>();
        int ring = 0, nq = 0, turn = 0;
        for (int n = 0;; ++n) {
            const int w = fa3_take_tile(r, n);
            if (w < 0) break;
            int h, m0, t0, n_tiles;
            const auto sv = tile(w, h, m0, t0, n_tiles);
            fa3_consume_tile<T, D, DV, BN, ST, MASK, PP, NC, VAR, XO>(a, smem, r, sv, h, m0, t0, n_tiles, ring, nq & 1,
                                                                  turn);
            ring += n_tiles;
            nq += fa3_has_rows(p, sv, m0, wgi);
        }
        // fa3_end_turns: every warpgroup took the same number of turns; the last one's last hand-over to
        // warpgroup 0 is taken here, so that every named-barrier arrival meets one wait.
        // (Restarting the round at every tile, FA3_XO_TILE_TURNS, leaves no hand-over over.)
        if (PP && (XO & FA3_XO_TILE_TURNS) == 0 && wgi == 0 && turn > 0) asm volatile("bar.sync 3, 256;\n" ::: "memory");
    }
}

#define FA3_BODY(T, D, DV, BN, ST, MASK, PP, NC, VAR, XO)                                              \
    extern __shared__ __align__(1024) unsigned char fa3_smem[];                                        \
    fa3_forward<T, D, DV, BN, ST, MASK, PP, NC, VAR, XO>(a, fa3_smem);
#define FA3_BODY_SERVE(T, D, DV, BN, ST, MASK, PP, NC, VAR, SERVE)                                     \
    extern __shared__ __align__(1024) unsigned char fa3_smem[];                                        \
    fa3_forward<T, D, DV, BN, ST, MASK, PP, NC, VAR, 0, SERVE>(a, fa3_smem);
#else
// Any other target: the entries compile (for the compile check on every architecture) but trap;
// src/kernels/fa3.rs launches them only on compute capability 9.0, where the program is built for sm_90a.
#define FA3_BODY(T, D, DV, BN, ST, MASK, PP, NC, VAR, XO) asm volatile("trap;");
#define FA3_BODY_SERVE(T, D, DV, BN, ST, MASK, PP, NC, VAR, SERVE) asm volatile("trap;");
#endif

// Entry {tile prefix}_{dtype}_{D}[_{DV}]_{mask}[_pp0]: element type, head-dim class (Q/K width D, V/O width
// DV), keys per tile, ring depth, mask, ping-pong, consumer warpgroups.
#define FA3_ENTRY(NAME, T, D, DV, BN, ST, MASK, PP, NC)                                                \
    extern "C" __global__ void __launch_bounds__(FA3_THREADS(NC), FA3_MIN_BLOCKS(NC))                  \
        NAME(const __grid_constant__ Fa3Args a) {                                                      \
        FA3_BODY(T, D, DV, BN, ST, MASK, PP, NC, 0, 0)                                                 \
    }
// Variant entry {tile prefix}_{dtype}_{D}[_{DV}]_band[_softcap][_alibi][_pp0][_vtp]: VAR a set of FA3_VAR_*
// with FA3_VAR_BAND, the band in place of a mask; its own instantiation, so that the plain entries' code and
// registers stay as they were. XO is 0, or FA3_XO_VT_PREPASS for FP8 entries that read the pre-pass's Vᵀ.
#define FA3_ENTRY_VAR(NAME, T, D, DV, BN, ST, VAR, PP, NC, XO)                                         \
    extern "C" __global__ void __launch_bounds__(FA3_THREADS(NC), FA3_MIN_BLOCKS(NC))                  \
        NAME(const __grid_constant__ Fa3Args a) {                                                      \
        FA3_BODY(T, D, DV, BN, ST, FA3_MASK_NONE, PP, NC, VAR, XO)                                     \
    }
// Measurement entry {tile prefix}_{dtype}_{D}[_{DV}]_{mask}[_pp0][_vtp][_xo{XO}]: a plain entry with the FA3_XO_*
// switches XO (`SDPA_FA3_AB`; `_vtp`: FA3_XO_VT_PREPASS, the product's FP8 entries for long calls).
#define FA3_ENTRY_XO(NAME, T, D, DV, BN, ST, MASK, PP, NC, XO)                                         \
    extern "C" __global__ void __launch_bounds__(FA3_THREADS(NC), FA3_MIN_BLOCKS(NC))                  \
        NAME(const __grid_constant__ Fa3Args a) {                                                      \
        FA3_BODY(T, D, DV, BN, ST, MASK, PP, NC, 0, XO)                                                \
    }
// Ragged entry {tile prefix}_{dtype}_{D}[_{DV}]_{mask or band set}_varlen[_pp0] (f16/bf16; SERVE =
// FA3_SERVE_VARLEN): a plain (MASK, VAR = 0) or variant (VAR, MASK = FA3_MASK_NONE) entry over a ragged batch
// with packed K/V, each work tile on its sequence's own lengths, band and diagonal. The first nine arguments
// are in FA3_ENTRY's order (src/kernels/fa3/tests.rs reads them by position).
#define FA3_ENTRY_SERVE(NAME, T, D, DV, BN, ST, MASK, PP, NC, VAR, SERVE)                              \
    extern "C" __global__ void __launch_bounds__(FA3_THREADS(NC), FA3_MIN_BLOCKS(NC))                  \
        NAME(const __grid_constant__ Fa3Args a) {                                                      \
        FA3_BODY_SERVE(T, D, DV, BN, ST, MASK, PP, NC, VAR, SERVE)                                     \
    }
