// Shared device code of every sdpa kernel module: the launch parameters (mirrors src/params.rs field for
// field), element conversions, mask helpers and warp reductions. Compiled by NVRTC, handed in as an
// in-memory header named "common.cuh".
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef long long i64;

#define SDPA_MASK_NONE 0
#define SDPA_MASK_CAUSAL 1
#define SDPA_MASK_EXPLICIT 2

// One struct by value for every attention kernel. Strides are in elements; the head dim is contiguous.
struct AttnParams {
    const void* q;
    const void* k;
    const void* v;
    void* o;
    const float* mask;  // additive f32, or null
    float* lse;         // [B, Hq, Sq] f32 contiguous, or null
    void* workspace;    // kernel-specific scratch, or null
    i64 q_stride[3];    // batch, head, seq
    i64 k_stride[3];
    i64 v_stride[3];
    i64 o_stride[3];
    i64 mask_stride[4]; // b, h, q, k; 0 for broadcast dims
    int b, hq, hkv, group, sq, sk, d, dv;
    int mask_kind;      // SDPA_MASK_*
    int causal_offset;  // query i sees keys j <= i + causal_offset (0: top-left, Sk - Sq: bottom-right)
    float scale;
    float scale_log2;   // scale * log2(e)
    int num_splits;
    int extra;
};
static_assert(sizeof(AttnParams) == 240, "AttnParams must match src/params.rs");

// ---- element conversions -------------------------------------------------------------------------------

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// ---- numbers ------------------------------------------------------------------------------------------

#define SDPA_NEG_INF (-__int_as_float(0x7f800000))
#define SDPA_NAN (__int_as_float(0x7fffffff))

// max that propagates NaN (fmaxf would drop it, and a NaN score must poison its row as in the reference).
__device__ __forceinline__ float nan_max(float a, float b) {
    return (a != a || b != b) ? SDPA_NAN : fmaxf(a, b);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ---- masks ------------------------------------------------------------------------------------------

// Number of leading keys query row i may see (keys 0..limit); Sk when the mask is not causal.
__device__ __forceinline__ int causal_limit(const AttnParams& p, int i) {
    if (p.mask_kind != SDPA_MASK_CAUSAL) return p.sk;
    long long lim = (long long)i + 1 + p.causal_offset;
    return lim < 0 ? 0 : (lim > p.sk ? p.sk : (int)lim);
}

// Pointer to the explicit mask row of (b, h, i), to be indexed by j * mask_stride[3].
__device__ __forceinline__ const float* mask_row(const AttnParams& p, int b, int h, int i) {
    return p.mask + b * p.mask_stride[0] + h * p.mask_stride[1] + i * p.mask_stride[2];
}

// Finalizes one row: O = acc / l, LSE = m + ln l; a row that saw no key is zeros with LSE -inf.
__device__ __forceinline__ float row_inv_l(float l) { return l > 0.f ? 1.f / l : 0.f; }
__device__ __forceinline__ float row_lse(float m, float l) {
    return l > 0.f ? m + logf(l) : (l != l || m != m ? SDPA_NAN : SDPA_NEG_INF);
}
// The same for kernels that keep the running max in log2 units (scores multiplied by scale * log2(e)).
#define SDPA_LOG2E 1.4426950408889634f
#define SDPA_LN2 0.6931471805599453f
__device__ __forceinline__ float row_lse_log2(float m2, float l) {
    return l > 0.f ? m2 * SDPA_LN2 + logf(l) : (l != l || m2 != m2 ? SDPA_NAN : SDPA_NEG_INF);
}
