// The softmax step of the unfused baseline: scores S (f32, [B*Hq, Sq, Sk] contiguous, written by cuBLAS
// without the scale) -> P = softmax(S * scale + mask) in the input dtype, plus the LSE per row.
// One block per query row; pass 1 keeps a running (max, sum) per thread and merges them across the block,
// pass 2 writes P. Masked keys get P = 0; a row that sees no key is all zeros with LSE = -inf. After cuBLAS's
// P·V, `unfused_repair_*` recomputes the rows that NaN or inf under a masked key reached through P = 0.
#include "common.cuh"

struct SoftmaxParams {
    AttnParams a;
    const float* s;  // scores
    void* p;         // probabilities, input dtype
};

constexpr int SOFTMAX_THREADS = 256;

// Score j of row (b, h, i) after scale and mask; -inf when the key takes no part.
__device__ __forceinline__ float masked_score(const AttnParams& a, const float* srow, const float* mrow, int limit,
                                              int j) {
    if (j >= limit) return SDPA_NEG_INF;
    float x = srow[j] * a.scale;
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
    const long long row = blockIdx.x;  // (b * Hq + h) * Sq + i
    const int i = (int)(row % a.sq);
    const int bh = (int)(row / a.sq);
    const int h = bh % a.hq, b = bh / a.hq;
    const float* srow = sp.s + row * a.sk;
    T* prow = static_cast<T*>(sp.p) + row * a.sk;
    const float* mrow = a.mask_kind == SDPA_MASK_EXPLICIT ? mask_row(a, b, h, i) : nullptr;
    const int limit = causal_limit(a, i);

    float m = SDPA_NEG_INF, l = 0.f;
    for (int j = threadIdx.x; j < a.sk; j += SOFTMAX_THREADS) {
        float x = masked_score(a, srow, mrow, limit, j);
        if (x == SDPA_NEG_INF) continue;
        merge_state(m, l, x, 1.f);
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
    for (int j = threadIdx.x; j < a.sk; j += SOFTMAX_THREADS) {
        float x = masked_score(a, srow, mrow, limit, j);
        float pj = (x == SDPA_NEG_INF || m == SDPA_NEG_INF) ? 0.f : expf(x - m) * inv;
        prow[j] = from_f32<T>(pj);
    }
    if (a.lse != nullptr && threadIdx.x == 0) a.lse[row] = row_lse(m, l);
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

// One warp per output row (b, h, i), REPAIR_ROWS rows per block; src/unfused.rs mirrors REPAIR_ROWS. The
// softmax already wrote the right LSE (it skips masked keys), so only O is rewritten.
constexpr int REPAIR_ROWS = 8;

template <typename T>
__device__ void unfused_repair(const AttnParams& p) {
    const long long row = (long long)blockIdx.x * REPAIR_ROWS + threadIdx.x / 32;
    if (row >= (long long)p.b * p.hq * p.sq) return;  // whole warps leave together
    const int i = (int)(row % p.sq);
    const int bh = (int)(row / p.sq);
    repair_row_if_nonfinite<T>(p, bh / p.hq, bh % p.hq, i, 0, p.dv, false);
}

extern "C" __global__ void __launch_bounds__(REPAIR_ROWS * 32) unfused_repair_f32(const AttnParams p) {
    unfused_repair<float>(p);
}
extern "C" __global__ void __launch_bounds__(REPAIR_ROWS * 32) unfused_repair_f16(const AttnParams p) {
    unfused_repair<__half>(p);
}
extern "C" __global__ void __launch_bounds__(REPAIR_ROWS * 32) unfused_repair_bf16(const AttnParams p) {
    unfused_repair<__nv_bfloat16>(p);
}
