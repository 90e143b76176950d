// The softmax step of the unfused baseline and of the wide-head path (src/kernels/wide.rs): scores S (f32, written
// by cuBLAS without the scale) -> P = softmax(S * scale + mask) in the input dtype, plus the LSE per row.
// One block per query row; pass 1 keeps a running (max, sum) per thread and merges them across the block,
// pass 2 writes P. Masked keys get P = 0; a row that sees no key is all zeros with LSE = -inf. After cuBLAS's
// P·V, `unfused_repair_*` recomputes the rows that NaN or inf under a masked key reached through P = 0.
//
// The scores are a slab: `n_z` GEMM batches of `rows` rows of `w` columns each ([z][row][w] contiguous), column c
// being key k0 + c. Row x of batch z is query row i of head h in batch b (see SoftmaxParams). The unfused
// kernel's slab is the whole call (every head, every row, every key); the wide path's is one query chunk of
// some heads and only the keys its rows' bands reach.
#include "common.cuh"

struct SoftmaxParams {
    AttnParams a;
    const float* s;  // scores of the slab
    void* p;         // probabilities, input dtype, same layout
    // Row x of GEMM batch z (z counted from z0): b = z / zb, h = (z % zb) * hz + h0 + x * fold,
    // i = q0 + x * (1 - fold) (fold: the rows are the query heads of a group at one query position).
    int z0, zb, hz, h0, fold, q0;
    int k0, w, rows, reserved;
};

constexpr int SOFTMAX_THREADS = 256;

// Score of key j (raw score `sx`) of row (b, h, i) after scale, softcap, ALiBi and mask; -inf when the key
// takes no part (outside the row's band, or an explicit -inf).
__device__ __forceinline__ float masked_score(const AttnParams& a, float sx, const float* mrow, int h, int i, int j) {
    if (!band_visible(a, i, j)) return SDPA_NEG_INF;
    float x = sx * a.scale;
    if (has_score_variants(a)) x = variant_score(a, x, h, i, j);
    if (mrow != nullptr) {
        float add = mrow[j * a.mask_stride[3]];
        if (add == SDPA_NEG_INF) return SDPA_NEG_INF;
        x += add;
    }
    return x;
}

// Merges (m2, l2) into (m, l): the online-softmax rule; a state with m = -inf is the identity.
__device__ __forceinline__ void merge_state(float& m, float& l, float m2, float l2) {
    float mn = nan_max(m, m2);
    if (mn == SDPA_NEG_INF) return;
    l = (m == SDPA_NEG_INF ? 0.f : l * expf(m - mn)) + (m2 == SDPA_NEG_INF ? 0.f : l2 * expf(m2 - mn));
    m = mn;
}

template <typename T>
__device__ void softmax_row(const SoftmaxParams& sp) {
    const AttnParams& a = sp.a;
    const long long idx = blockIdx.x;  // z * rows + x in the slab
    const int x = (int)(idx % sp.rows);
    const int z = sp.z0 + (int)(idx / sp.rows);
    const int b = z / sp.zb;
    const int h = (z % sp.zb) * sp.hz + sp.h0 + x * sp.fold;
    const int i = sp.q0 + x * (1 - sp.fold);
    const float* srow = sp.s + idx * sp.w;
    T* prow = static_cast<T*>(sp.p) + idx * sp.w;
    const float* mrow = a.mask_kind == SDPA_MASK_EXPLICIT ? mask_row(a, b, h, i) : nullptr;
    // Pass 1 reads the row's band only (causal masks and windows); pass 2 writes every P (zeros outside).
    const int first = max(band_first(a, i), sp.k0), end = min(band_end(a, i), sp.k0 + sp.w);

    float m = SDPA_NEG_INF, l = 0.f;
    for (int j = first + threadIdx.x; j < end; j += SOFTMAX_THREADS) {
        const float y = masked_score(a, srow[j - sp.k0], mrow, h, i, j);
        if (y == SDPA_NEG_INF) continue;
        merge_state(m, l, y, 1.f);
    }
    // Warp, then block merge of (m, l).
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o);
        float l2 = __shfl_xor_sync(0xffffffffu, l, o);
        merge_state(m, l, m2, l2);
    }
    __shared__ float sm[SOFTMAX_THREADS / 32], sl[SOFTMAX_THREADS / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    __syncthreads();
    m = sm[0];
    l = sl[0];
#pragma unroll
    for (int w = 1; w < SOFTMAX_THREADS / 32; ++w) merge_state(m, l, sm[w], sl[w]);

    const float inv = row_inv_l(l);
    for (int c = threadIdx.x; c < sp.w; c += SOFTMAX_THREADS) {
        const float y = masked_score(a, srow[c], mrow, h, i, sp.k0 + c);
        const float pj = (y == SDPA_NEG_INF || m == SDPA_NEG_INF) ? 0.f : expf(y - m) * inv;
        prow[c] = from_f32<T>(pj);
    }
    if (a.lse != nullptr && threadIdx.x == 0) a.lse[((long long)b * a.hq + h) * a.sq + i] = row_lse(m, l);
}

extern "C" __global__ void __launch_bounds__(SOFTMAX_THREADS) unfused_softmax_f32(const SoftmaxParams sp) {
    softmax_row<float>(sp);
}
extern "C" __global__ void __launch_bounds__(SOFTMAX_THREADS) unfused_softmax_f16(const SoftmaxParams sp) {
    softmax_row<__half>(sp);
}
extern "C" __global__ void __launch_bounds__(SOFTMAX_THREADS) unfused_softmax_bf16(const SoftmaxParams sp) {
    softmax_row<__nv_bfloat16>(sp);
}

// Check pass after cuBLAS: grid-stride over the output rows, REPAIR_WARPS warps per block (src/kernels/unfused.rs
// mirrors it and the row grouping). A warp checks whole rows in 16-byte chunks, several short rows at once
// (lane = row of the group x chunk), so finite output costs one wide read per chunk; a row with a non-finite
// value is recomputed by the whole warp (common.cuh). The softmax already wrote the right LSE (it skips
// masked keys), so only O is rewritten.
constexpr int REPAIR_WARPS = 8;

template <typename T>
__device__ __forceinline__ bool chunk_nonfinite(const T* row, int c, int dv) {
    constexpr int E = 16 / sizeof(T);
    const T* x = row + c;
    bool bad = false;
    if (c + E <= dv && (reinterpret_cast<unsigned long long>(x) & 15) == 0) {
        const uint4 w = *reinterpret_cast<const uint4*>(x);
        const T* e = reinterpret_cast<const T*>(&w);
#pragma unroll
        for (int t = 0; t < E; ++t) bad |= !isfinite(to_f32(e[t]));
    } else {
        for (int t = 0; t < E && c + t < dv; ++t) bad |= !isfinite(to_f32(x[t]));
    }
    return bad;
}

template <typename T>
__device__ void unfused_repair(const AttnParams& p) {
    constexpr int E = 16 / sizeof(T);
    const int chunks = (p.dv + E - 1) / E;                // per row
    if (chunks == 0) return;
    const int group = chunks >= 32 ? 1 : 32 / chunks;     // rows a warp checks at once
    const int lane = threadIdx.x % 32;
    const int sub = chunks >= 32 ? 0 : lane / chunks;     // this lane's row in the group
    const int c_first = chunks >= 32 ? lane : lane % chunks;
    const int c_step = chunks >= 32 ? 32 : chunks;
    const long long rows = (long long)p.b * p.hq * p.sq;
    const long long warp0 = (long long)blockIdx.x * REPAIR_WARPS + threadIdx.x / 32;
    const long long n_warps = (long long)gridDim.x * REPAIR_WARPS;
    for (long long r0 = warp0 * group; r0 < rows; r0 += n_warps * group) {
        const long long row = r0 + sub;
        bool bad = false;
        if (sub < group && row < rows) {
            const int i = (int)(row % p.sq), bh = (int)(row / p.sq);
            const T* o = static_cast<const T*>(p.o) + (bh / p.hq) * p.o_stride[0] + (bh % p.hq) * p.o_stride[1] +
                         (long long)i * p.o_stride[2];
            for (int c = c_first; c < chunks; c += c_step) bad |= chunk_nonfinite(o, c * E, p.dv);
        }
        unsigned hit = __ballot_sync(0xffffffffu, bad);
        while (hit != 0u) {  // warp-uniform: one recompute per row with a non-finite value
            const int g = (__ffs(hit) - 1) / (chunks >= 32 ? 32 : chunks);
            const long long rr = r0 + g;
            const int i = (int)(rr % p.sq), bh = (int)(rr / p.sq);
            careful_row<T>(p, bh / p.hq, bh % p.hq, i, 0, p.dv, false);
            hit &= chunks >= 32 ? 0u : ~(((1u << chunks) - 1u) << (g * chunks));
        }
    }
}

extern "C" __global__ void __launch_bounds__(REPAIR_WARPS * 32) unfused_repair_f32(const AttnParams p) {
    unfused_repair<float>(p);
}
extern "C" __global__ void __launch_bounds__(REPAIR_WARPS * 32) unfused_repair_f16(const AttnParams p) {
    unfused_repair<__half>(p);
}
extern "C" __global__ void __launch_bounds__(REPAIR_WARPS * 32) unfused_repair_bf16(const AttnParams p) {
    unfused_repair<__nv_bfloat16>(p);
}
