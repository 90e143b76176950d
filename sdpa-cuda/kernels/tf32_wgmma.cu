// Plain TF32 attention on Hopper's warpgroup tensor cores (`wgmma`, sm_90a only), D padded to 128.
// Entry points `tf32wg_f32_128_{none,causal,explicit}`; src/kernels/tf32.rs launches them on a compute-capability
// 9.0 device for plain TF32 with head dims 65..128 on the 16-byte load path, and the mma.sync kernel of
// tf32.cu otherwise. Same results contract as tf32.cu (operands rounded to the nearest TF32 value, f32
// accumulation, online softmax in log2 units, NaN repair after the epilogue).
//
// Why a second kernel: with `mma.sync` every warp reads its own copy of each K and V fragment from shared
// memory, and at D = 128 the mma.sync kernel is bound by those reads and their latency (bench/results/
// tf32.md). `wgmma` reads each operand tile from shared memory once per warpgroup of four warps, and runs
// asynchronously, so one warpgroup's softmax overlaps the other's products.
//
// Block: NC consumer warpgroups, each owning 64 query rows, and one producer warpgroup.
// - The producer streams K and V tiles of BK keys through two ST-deep rings, one for K and one for Vᵀ, each
//   slot with a `full` and an `empty` mbarrier: a K slot is free again as soon as S = Q·Kᵀ is done, a V
//   slot only after P·V, and a consumer waits for V one softmax later than for K. It copies K with
//   cp.async into its slot (K rows are the product's k dimension, so K is used as it is) and rounds it
//   there; V goes to a staging tile and is then rounded and transposed into its slot: TF32 `wgmma` takes
//   only K-major operands, and for O = P·V the k dimension is the key, so V must be stored d-major (Vᵀ).
//   Doing the transpose in the producer takes it off the consumers' path; cp.async keeps a whole tile per
//   tensor in flight without holding registers.
// - Each consumer computes S = Q·Kᵀ (m64n64k8, A = its Q rows from shared memory, rounded once at the
//   start), the online softmax in registers, and O += P·V (m64n128k8, A = P straight from the S registers).
//   The product S(j+1) = Q·K(j+1) is issued before P(j)·V(j), and the softmax of tile j+1 runs while
//   P(j)·V(j) is in flight (FlashAttention-3's intra-warpgroup pipelining); the two consumer warpgroups
//   take turns issuing their products (its inter-warpgroup "ping-pong").
//
// Shared memory: 224 KB per block, so ST = 2 is the deepest ring that fits.
//
// Shared-memory layout of every operand tile ([rows][k] f32, K-major: Q and K with k = d, Vᵀ with k = key
// slot): the 128-byte swizzle. The k extent is cut into column blocks of 32 floats (128 bytes); block b is
// [rows][128 bytes], and the 16-byte chunk c of row r is stored at position c ^ (r % 8) of its row, so the
// eight rows of a group of 8 read by one operand fetch sit in distinct bank groups. Every tile starts on a
// 1024-byte boundary, as the hardware applies the swizzle to address bits. (A first version used the
// unswizzled layout, 8 x 16-byte "core matrices"; it ran at about 65 TFLOPS whatever the loads did.)
//
// P's registers are the A fragment when k-index t <-> key 2t and t+4 <-> key 2t+1 (as in tf32.cu): so Vᵀ
// stores key 2t at slot t and key 2t+1 at slot t+4 of each group of 8 keys.
#include "tf32_ops.cuh"
#include "sm90_async.cuh"

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ENABLED 1
#else
#define WG_ENABLED 0
#endif

#if WG_ENABLED
namespace wg {

constexpr int DP = 128;          // padded head dim
constexpr int CH = DP / 4;       // 16-byte chunks per row
constexpr int BK = 64;           // keys per K/V tile
constexpr int TILE_BYTES = BK * DP * 4;
// Matrix descriptor of a K-major operand in the 128-byte swizzle layout (see the file comment): start
// address, stride between groups of 8 rows (1024 bytes), layout type 1 (128-byte swizzle) in bits 62-63.
// The leading-dimension offset is not used by this layout (one k8 step stays inside a 128-byte row).
__device__ __forceinline__ unsigned long long desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) |
           (1ull << 62);
}
// Byte offset of 16-byte chunk c (of 32) of row r in a [ROWS][128] f32 operand tile in that layout.
template <int ROWS>
__device__ __forceinline__ int sw_chunk(int r, int c) {
    return (c >> 3) * ROWS * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}
__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Keeps the compiler from moving reads or writes of accumulators across an asynchronous wgmma wait.
template <int N>
__device__ __forceinline__ void pin(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// S (m64 x n64) = A (m64 x k8, descriptor) * B (k8 x n64, descriptor); scale_d = 0 starts from zero.
__device__ __forceinline__ void mma_qk(float (&d)[32], unsigned long long a, unsigned long long b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,"
        "%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(a), "l"(b), "r"(scale_d));
}
// O (m64 x n128) += A (m64 x k8, registers) * B (k8 x n128, descriptor).
__device__ __forceinline__ void mma_pv(float (&d)[64], const unsigned (&a)[4], unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,"
        "%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,"
        "%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "{%64,%65,%66,%67}, %68, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// Chunk map of the tile loads: the 128 threads of one warpgroup (index `tid`) copy ROWS x 128 floats as
// 16-byte chunks i = 0 .. ROWS / 4 - 1: row 8 (i / 2) + tid % 8, 16-byte column tid / 8 + 16 (i % 2). With
// SW the chunks go to their place in the swizzled operand layout, otherwise to byte (tid + 128 i) * 16 (the
// V staging tile). Every later pass over a tile (rounding, transposing) touches only the chunks its thread
// copied, so it needs no barrier after the thread's own cp.async wait. Per quarter warp (8 lanes, one
// 16-byte shared-memory phase) the rows differ in r % 8, so the swizzled chunks land in 8 distinct bank groups.
template <int ROWS, bool SW>
__device__ __forceinline__ int own_chunk(int tid, int i) {
    return SW ? sw_chunk<ROWS>((tid & 7) + 8 * (i / 2), (tid >> 3) + 16 * (i % 2)) : (tid + 128 * i) * 16;
}
// ILV: the tile's rows are taken in groups of 16 from every other group of 16 source rows (row x of the
// tile is source row 32 (x / 16) + x % 16): the query rows of one consumer warpgroup (see wg_forward).
template <int ROWS, bool SW, bool ILV = false>
__device__ __forceinline__ void copy_async(unsigned dst, const float* src, i64 stride, int valid, int d, int tid) {
    static_assert(CH == 32, "the chunk map assumes 128 threads and D = 128");
    const int r0 = tid & 7, c0 = tid >> 3;
#pragma unroll
    for (int i = 0; i < ROWS / 4; ++i) {
        const int r = r0 + 8 * (i / 2), rs = ILV ? 32 * (r >> 4) + (r & 15) : r;
        const bool ok = rs < valid && 4 * (c0 + 16 * (i % 2)) < d;
        tc_cp16(dst + own_chunk<ROWS, SW>(tid, i), ok ? src + rs * stride + 4 * c0 + 64 * (i % 2) : src, ok);
    }
}
__device__ __forceinline__ float4 round4(float4 x) {
    return make_float4(tc_big(x.x), tc_big(x.y), tc_big(x.z), tc_big(x.w));
}
// This thread's chunks of a swizzled ROWS x 128 operand tile rounded to TF32 in place. All loads are issued
// before the first store: interleaved, each store could alias the next load (the swizzle hides that it does
// not), so the compiler kept them in order and the producer paid a shared-memory latency per chunk (ncu:
// the consumers then waited for K; bench/results/gpu/tf32.md, session 7).
template <int ROWS>
__device__ __forceinline__ void round_own(unsigned char* tile, int tid) {
    float4 x[ROWS / 4];
#pragma unroll
    for (int i = 0; i < ROWS / 4; ++i) x[i] = *reinterpret_cast<const float4*>(tile + own_chunk<ROWS, true>(tid, i));
#pragma unroll
    for (int i = 0; i < ROWS / 4; ++i) *reinterpret_cast<float4*>(tile + own_chunk<ROWS, true>(tid, i)) = round4(x[i]);
}
// This thread's chunks of the staged V tile (BK keys, plain chunk order), rounded and stored transposed into
// the swizzled Vᵀ operand tile [128 d][BK key slots]. Key r is stored at slot sl (the P permutation, see the
// file comment); element (sl, dd) sits in column block sl / 32 at row dd, float sl % 32, whose 16-byte chunk
// is swizzled by dd % 8. The four components of a chunk are stored in a lane-dependent order (rot) so that
// each store of a warp hits 32 distinct banks (checked by enumeration over every lane, chunk and store).
__device__ __forceinline__ void transpose_own(float* vt, const float* vs, int tid) {
    const int r0 = tid & 7, c0 = tid >> 3;
    const int sl0 = (r0 >> 1) + 4 * (r0 & 1);
    const int rot = 2 * ((c0 >> 1) & 1);
    // Float offset of store jj of chunk i: a compile-time part, ((i / 2) / 4) * 32 DP + (i % 2) * 2048, plus
    // off[(i / 2) % 4][jj], which depends on the thread only (the same layout as above, with the slot's
    // 32-float group, d and the swizzle split apart), so the stores need no address arithmetic in the loop.
    int off[4][4];
#pragma unroll
    for (int jj = 0; jj < 4; ++jj) {
        const int j = (jj + rot) & 3, w = (sl0 >> 2) ^ (4 * (c0 & 1) + j);
#pragma unroll
        for (int k = 0; k < 4; ++k) off[k][jj] = (4 * c0 + j) * 32 + ((w ^ (2 * k)) << 2) + (sl0 & 3);
    }
    float4 y[BK / 4];  // every load before the first store (see round_own)
#pragma unroll
    for (int i = 0; i < BK / 4; ++i) y[i] = reinterpret_cast<const float4*>(vs)[tid + 128 * i];
#pragma unroll
    for (int i = 0; i < BK / 4; ++i) {
        const float4 z = round4(y[i]);
        float* t = vt + ((i / 2) / 4) * (DP * 32) + (i % 2) * (64 * 32);
#pragma unroll
        for (int jj = 0; jj < 4; ++jj) {
            const int j = (jj + rot) & 3;
            t[off[(i / 2) % 4][jj]] = j == 0 ? z.x : j == 1 ? z.y : j == 2 ? z.z : z.w;
        }
    }
}

}  // namespace wg

// Which (batch·head, query tile) this block takes. The grid goes through the heads in groups of about
// WG_ORDER_GROUP_BLOCKS blocks; within a group, the query tiles with the most keys come first for every head
// of the group, then the next, and so on. Under a causal mask that is longest-first list scheduling, so the
// grid's last blocks are its shortest (one head after another, heaviest first, left the last head's long
// tiles running alone at the end: about 6 % of a causal S = 1024 call in a list-scheduling model, dev note
// in bench/results/gpu/tf32.md). The group keeps the K and V that the resident blocks read (about 128 query
// tiles' heads: 16 MB at D = 128 whatever Sk) in L2, as one head after another did.
#define WG_ORDER_GROUP_BLOCKS 128
__device__ __forceinline__ void wg_block_order(int n_mblocks, int& bh, int& m_block) {
    const int n_bh = gridDim.x / n_mblocks;
    const int per_group = max(1, WG_ORDER_GROUP_BLOCKS / n_mblocks);  // heads per group
    const int group = blockIdx.x / (per_group * n_mblocks);
    const int in_group = blockIdx.x - group * per_group * n_mblocks;
    const int heads = min(per_group, n_bh - group * per_group);  // the last group may be smaller
    bh = group * per_group + in_group % heads;
    m_block = n_mblocks - 1 - in_group / heads;
}

// NC consumer warpgroups, ST-deep rings. PP: the two consumer warpgroups take turns issuing their products
// (FlashAttention-3's inter-warpgroup "ping-pong" schedule), so that one's softmax runs while the other's
// products use the tensor cores.
template <int NC, int ST, bool PP, int MASK>
__device__ __forceinline__ void wg_forward(const AttnParams& p, unsigned char* smem) {
    using namespace wg;
    constexpr int BM = 64 * NC, NT = BK / 8, DT = DP / 8;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int g = lane >> 2, t = lane & 3;
    const int wgi = warp / 4;  // warpgroup; NC is the producer

    const int n_mblocks = (p.sq + BM - 1) / BM;
    int bh, m_block;
    wg_block_order(n_mblocks, bh, m_block);
    const int b = bh / p.hq, h = bh % p.hq, kvh = h / p.group;
    const int m0 = m_block * BM, m_end = min(m0 + BM, p.sq);

    // Shared memory: Q [BM][128] | K ring ST x [BK][128] | Vᵀ ring ST x [128][BK] | V staging [BK][128] |
    // mbarriers: full and empty of each K slot, full and empty of each V slot (8 bytes each).
    float* sQ = reinterpret_cast<float*>(smem);
    float* sK = sQ + BM * DP;
    float* sV = sK + ST * BK * DP;
    float* sVs = sV + ST * BK * DP;
    const unsigned bars = smem_addr(sVs + BK * DP);
    const unsigned k_full = bars, k_empty = bars + 8 * ST, v_full = bars + 16 * ST, v_empty = bars + 24 * ST;

    const float* q = static_cast<const float*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
    const float* k = static_cast<const float*>(p.k) + b * p.k_stride[0] + kvh * p.k_stride[1];
    const float* v = static_cast<const float*>(p.v) + b * p.v_stride[0] + kvh * p.v_stride[1];

    int n_keys = p.sk;
    if (MASK == TC_MASK_CAUSAL) n_keys = max(0, min(p.sk, m_end + p.causal_offset));
    const int n_tiles = (n_keys + BK - 1) / BK;

    if ((smem_addr(smem) & 1023) != 0) __trap();  // the swizzled layout needs 1024-byte aligned tiles
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < ST; ++s) {
            sm90_mbar_init(k_full + 8 * s, 128);  // the producer's threads
            sm90_mbar_init(v_full + 8 * s, 128);
            sm90_mbar_init(k_empty + 8 * s, 128 * NC);  // every consumer thread
            sm90_mbar_init(v_empty + 8 * s, 128 * NC);
        }
    }
    __syncthreads();

    bool bad = false;
    if (wgi == NC) {
        // Producer. K tiles are copied (cp.async) straight into their ring slot and rounded there; V tiles
        // into one staging tile, then rounded and transposed into their Vᵀ slot. Tile j uses slot j % ST once
        // the consumers released the slot's previous tile (use u of a slot completes phase u of its barriers).
        // Two cp.async groups per tile, K(j+1) and V(j+1), issued while tile j is being published.
        const int ptid = tid - 128 * NC;
        const unsigned aK = smem_addr(sK), aVs = smem_addr(sVs);
        const i64 ks = p.k_stride[2], vs = p.v_stride[2];
        if (n_tiles > 0) {
            copy_async<BK, true>(aK, k, ks, p.sk, p.d, ptid);
            tc_commit();
            copy_async<BK, false>(aVs, v, vs, p.sk, p.dv, ptid);
            tc_commit();
        }
        for (int j = 0; j < n_tiles; ++j) {
            const int s = j % ST, use = j / ST;
            const int n1 = (j + 1) * BK, s1 = (j + 1) % ST, use1 = (j + 1) / ST;
            asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // K(j) landed
            round_own<BK>(reinterpret_cast<unsigned char*>(sK + s * BK * DP), ptid);
            sm90_proxy_fence();
            sm90_mbar_arrive(k_full + 8 * s);
            if (j + 1 < n_tiles) {
                if (use1 > 0) sm90_mbar_wait(k_empty + 8 * s1, (use1 - 1) & 1);
                copy_async<BK, true>(aK + s1 * TILE_BYTES, k + (i64)n1 * ks, ks, p.sk - n1, p.d, ptid);
            }
            tc_commit();
            asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // V(j) landed
            if (use > 0) sm90_mbar_wait(v_empty + 8 * s, (use - 1) & 1);
            transpose_own(sV + s * BK * DP, sVs, ptid);
            sm90_proxy_fence();
            sm90_mbar_arrive(v_full + 8 * s);
            if (j + 1 < n_tiles) copy_async<BK, false>(aVs, v + (i64)n1 * vs, vs, p.sk - n1, p.dv, ptid);
            tc_commit();
        }
    } else {
        // Consumer warpgroup wgi: rows m0 + wrow + {g, g + 8} in warp wrow / 16 (below).
        const int ctid = tid - 128 * wgi;
        // The two warpgroups' rows interleave in groups of 16 (warp w of warpgroup wgi owns block rows
        // 32 w + 16 wgi .. + 15), so that under a causal mask both see the same key tiles: with 64 contiguous
        // rows each, the lower warpgroup would sit out the block's last key tile while the other computes it.
        const int wrow = 32 * (warp % 4) + 16 * wgi;
        float* sQw = sQ + 64 * wgi * DP;
        copy_async<64, true, true>(smem_addr(sQw), q + (i64)(m0 + 16 * wgi) * p.q_stride[2], p.q_stride[2],
                                   p.sq - m0 - 16 * wgi, p.d, ctid);
        tc_commit();
        tc_wait_all();
        round_own<64>(reinterpret_cast<unsigned char*>(sQw), ctid);
        sm90_proxy_fence();
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wgi) : "memory");
        const unsigned aQ = smem_addr(sQw), aK = smem_addr(sK), aV = smem_addr(sV);
        // The last key any row of this warpgroup sees, under a causal mask; tiles past it are skipped.
        const int wg_last_key = m0 + 96 + 16 * wgi + 15 + p.causal_offset;

        float o[DT * 4];
#pragma unroll
        for (int i = 0; i < DT * 4; ++i) o[i] = 0.f;
        float m[2] = {SDPA_NEG_INF, SDPA_NEG_INF}, l[2] = {0.f, 0.f};
        const float sl2 = p.scale_log2;
        float s[NT * 4];
        unsigned pa[NT][4];

        // S = Q·Kᵀ of tile j (slot sj), issued and committed, not waited for.
        auto issue_qk = [&](int sj) {
            fence();
#pragma unroll
            for (int kk = 0; kk < DP / 8; ++kk) {
                // k8 step kk: column block kk / 4 (64 rows x 128 bytes each), 32 bytes into its rows.
                const int off = (kk / 4) * (64 * 128) + (kk % 4) * 32;
                mma_qk(s, desc(aQ + off), desc(aK + sj * TILE_BYTES + off), kk > 0);
            }
            commit();
        };
        // O += P·V of the tile in slot sj, issued and committed.
        auto issue_pv = [&](int sj) {
            fence();
#pragma unroll
            for (int j = 0; j < NT; ++j)  // keys 8j..8j+7: column block j / 4 (128 rows x 128 bytes)
                mma_pv(o, pa[j], desc(aV + sj * TILE_BYTES + (j / 4) * (DP * 128) + (j % 4) * 32));
            commit();
        };
        // Mask and online softmax of S (tile starting at key n0); P (rounded) into pa; returns whether some
        // row's maximum changed, with the factors in alpha. O is not touched (it may be in flight).
        auto softmax = [&](int n0, float (&alpha)[2]) {
            const bool edge = (n0 + BK > p.sk) || (MASK == TC_MASK_CAUSAL && n0 + BK - 1 > m0 + wrow + p.causal_offset) ||
                              MASK == TC_MASK_EXPLICIT;
            if (edge) {
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int row = m0 + wrow + g + hh * 8;
                    const float* mrow = nullptr;
                    if (MASK == TC_MASK_EXPLICIT) mrow = mask_row(p, b, h, min(row, p.sq - 1));
#pragma unroll
                    for (int j = 0; j < NT; ++j)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int key = n0 + j * 8 + 2 * t + e;
                            float& x = s[j * 4 + hh * 2 + e];
                            bool vis = key < p.sk;
                            if (MASK == TC_MASK_CAUSAL) vis = vis && key <= row + p.causal_offset;
                            if (MASK == TC_MASK_EXPLICIT)
                                x = vis ? fmaf(mrow[key * p.mask_stride[3]], SDPA_LOG2E, x * sl2) : SDPA_NEG_INF;
                            else if (!vis)
                                x = SDPA_NEG_INF;
                        }
                }
            }
            bool rescale = false;
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                float mx = SDPA_NEG_INF;
#pragma unroll
                for (int j = 0; j < NT; ++j) mx = fmaxf(mx, fmaxf(s[j * 4 + hh * 2], s[j * 4 + hh * 2 + 1]));
                mx = quad_max(mx);
                const float m_old = m[hh];
                const float m_new = fmaxf(m_old, MASK == TC_MASK_EXPLICIT ? mx : mx * sl2);
                const float m_use = m_new == SDPA_NEG_INF ? 0.f : m_new;
                const float a = fast_exp2(m_old - m_use);
                alpha[hh] = a;
                rescale |= a != 1.f;
                m[hh] = m_new;
                float sum = 0.f;
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float& x = s[j * 4 + hh * 2 + e];
                        x = MASK == TC_MASK_EXPLICIT ? fast_exp2(x - m_use) : fast_exp2(fmaf(x, sl2, -m_use));
                        sum += x;
                    }
                l[hh] = l[hh] * a + sum;  // per-thread partial; the quad is summed at the end
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
        // P rounded to TF32, in the A-fragment order (k-index t <-> key 2t, t + 4 <-> key 2t + 1).
        auto take_p = [&]() {
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                pa[j][0] = __float_as_uint(tc_big(s[j * 4]));
                pa[j][1] = __float_as_uint(tc_big(s[j * 4 + 2]));
                pa[j][2] = __float_as_uint(tc_big(s[j * 4 + 1]));
                pa[j][3] = __float_as_uint(tc_big(s[j * 4 + 3]));
            }
        };
        // Tiles this warpgroup computes: 0 .. n_act - 1 (causal skips only trailing tiles).
        int n_act = n_tiles;
        if (MASK == TC_MASK_CAUSAL) n_act = wg_last_key < 0 ? 0 : min(n_tiles, wg_last_key / BK + 1);
        // Turns (PP): each warpgroup takes exactly n_tiles + 1 turns (its issue steps, one empty
        // turn per skipped tile, then empty turns to make up the count); warpgroup 1 gives the first turn
        // to warpgroup 0 and keeps its own last one, so every named-barrier arrival meets one wait.
        static_assert(!PP || NC == 2, "turns between two consumer warpgroups");
        const int turns = n_tiles > 0 ? n_tiles + 1 : 0;
        int turn = 0;
        auto turn_begin = [&]() {
            if (PP) asm volatile("bar.sync %0, 256;\n" ::"r"(3 + wgi) : "memory");
        };
        auto turn_end = [&]() {
            if (PP && !(wgi == 1 && turn == turns - 1))
                asm volatile("bar.arrive %0, 256;\n" ::"r"(4 - wgi) : "memory");
            ++turn;
        };
        if (PP && wgi == 1 && turns > 0) asm volatile("bar.arrive 3, 256;\n" ::: "memory");
        if (n_act > 0) {
            sm90_mbar_wait(k_full, 0);
            turn_begin();
            issue_qk(0);
            turn_end();
            wait<0>();
            pin(s);
            sm90_mbar_arrive(k_empty);
            float alpha[2];
            softmax(0, alpha);  // O is still zero: no rescale needed
            take_p();
        }
        for (int j = 1; j < n_act; ++j) {
            const int sj = j % ST, sp = (j - 1) % ST;
            sm90_mbar_wait(k_full + 8 * sj, (j / ST) & 1);
            sm90_mbar_wait(v_full + 8 * sp, ((j - 1) / ST) & 1);
            turn_begin();
            issue_qk(sj);
            pin(o);
            issue_pv(sp);
            turn_end();
            wait<1>();  // S(j) is done; P(j-1)·V(j-1) may still run
            pin(s);
            sm90_mbar_arrive(k_empty + 8 * sj);
            float alpha[2];
            const bool rs = softmax(j * BK, alpha);
            wait<0>();
            pin(o);
            sm90_mbar_arrive(v_empty + 8 * sp);
            if (rs) rescale_o(alpha);
            take_p();
        }
        if (n_act > 0) {
            const int sp = (n_act - 1) % ST;
            sm90_mbar_wait(v_full + 8 * sp, ((n_act - 1) / ST) & 1);
            turn_begin();
            pin(o);
            issue_pv(sp);
            turn_end();
            wait<0>();
            pin(o);
            sm90_mbar_arrive(v_empty + 8 * sp);
        }
        // Tiles past this warpgroup's rows: released unread, after they landed, so that every release of
        // a slot answers exactly one fill of it.
        for (int j = n_act; j < n_tiles; ++j) {
            const int sj = j % ST, ph = (j / ST) & 1;
            sm90_mbar_wait(k_full + 8 * sj, ph);
            sm90_mbar_arrive(k_empty + 8 * sj);
            sm90_mbar_wait(v_full + 8 * sj, ph);
            sm90_mbar_arrive(v_empty + 8 * sj);
            turn_begin();
            turn_end();
        }
        while (turn < turns) {
            turn_begin();
            turn_end();
        }

        // Epilogue: normalise and store straight from the accumulators (rows g and g+8, columns 2t, 2t+1).
        float* out = static_cast<float*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
        const bool vec2 = (p.extra & 2) != 0;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const float lsum = quad_sum(l[hh]);
            const float inv = lsum == 0.f ? 0.f : 1.f / lsum;  // NaN stays NaN; no key seen: zeros
            const int row = m0 + wrow + g + hh * 8;
            if (row >= p.sq) continue;
            float* orow = out + (i64)row * p.o_stride[2];
#pragma unroll
            for (int j = 0; j < DT; ++j) {
                const int col = j * 8 + 2 * t;
                const float x0 = o[j * 4 + hh * 2] * inv, x1 = o[j * 4 + hh * 2 + 1] * inv;
                bad |= (col < p.dv && !isfinite(x0)) || (col + 1 < p.dv && !isfinite(x1));
                if (vec2 && col + 1 < p.dv) {
                    *reinterpret_cast<float2*>(orow + col) = make_float2(x0, x1);
                } else {
                    if (col < p.dv) orow[col] = x0;
                    if (col + 1 < p.dv) orow[col + 1] = x1;
                }
            }
            if (p.lse != nullptr && t == 0)
                p.lse[((i64)b * p.hq + h) * p.sq + row] = lsum == 0.f ? SDPA_NEG_INF : (m[hh] + log2f(lsum)) * SDPA_LN2;
        }
    }
    // NaN or inf under a masked key must not reach rows that do not see it (common.cuh). Every thread of
    // the block calls this; the ring is idle by now.
    repair_nonfinite_rows<float>(p, b, h, m0, SDPA_ONE_HEAD, m_end - m0, 0, p.dv, true, bad);
}
#else
// Any other target: the entries compile (for the compile check on every architecture) but trap; src/kernels/tf32.rs launches them only
// on compute capability 9.0, where the module is built for sm_90a.
template <int NC, int ST, bool PP, int MASK>
__device__ __forceinline__ void wg_forward(const AttnParams&, unsigned char*) {
    __trap();
}
#endif


// Entry points tf32wg_f32_128_{none|causal|explicit}, one per NVRTC program (src/kernels/tf32.rs writes the
// line): 2 consumer warpgroups (128 query rows), 2-deep rings, ping-pong under every mask (measured:
// bench/results/gpu/tf32.md). src/kernels/tf32.rs mirrors the block size and shared memory (`WG_*`).
#define WG_NC 2
#define WG_ST 2
#define WG_ENTRY(NAME, MASK)                                                                          \
    extern "C" __global__ void __launch_bounds__(128 * (WG_NC + 1), 1) NAME(const AttnParams p) {   \
        extern __shared__ __align__(1024) unsigned char wg_smem[];                                    \
        wg_forward<WG_NC, WG_ST, true, MASK>(p, wg_smem);                                            \
    }
