// Helpers shared by the f32 tensor-core kernels: `tf32.cu` (mma.sync) and `tf32_wgmma.cu` (Hopper wgmma):
// PTX wrappers, TF32 rounding and splitting, and the epilogue that stores one accumulator row.
#pragma once
#include "common.cuh"

#define TC_MASK_NONE 0
#define TC_MASK_CAUSAL 1
#define TC_MASK_EXPLICIT 2

// 16-byte global->shared copy; `ok == false` writes zeros and reads nothing.
__device__ __forceinline__ void tc_cp16(unsigned dst, const void* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void tc_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void tc_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void tc_ldsm4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// Nearest TF32 value of x (11 significant bits; Veltkamp splitting with 2^13 + 1). The _rn intrinsics
// keep the compiler from fusing the steps into an FMA, which would break the split. NaN stays NaN.
__device__ __forceinline__ float tc_big(float x) {
    const float c = __fmul_rn(x, 8193.f);
    return __fsub_rn(c, __fsub_rn(c, x));
}
// An operand as TF32 bit patterns: big (nearest TF32) and, for split TF32, small = x - big.
template <bool SPLIT>
__device__ __forceinline__ void tc_split(float x, unsigned& big, unsigned& small) {
    const float hi = tc_big(x);
    big = __float_as_uint(hi);
    if (SPLIT) small = __float_as_uint(__fsub_rn(x, hi));
}

// Epilogue of one accumulator row of tf32.cu and tf32_wgmma.cu (row `row < Sq` of head h, batch b; `out`
// at that head's O): this thread's columns 2t and 2t + 1 of each of the DT n8 tiles, `acc(j, e)` the
// unnormalised output of column j·8 + 2t + e, divided by the row's sum `lsum` (the quad's; NaN stays NaN
// as NaN == 0 is false, a row that saw no key is zeros with LSE -inf) and stored as one float2 where
// `vec2` allows; then the LSE from the running max `m` (log2 units). Returns whether a stored value is not
// finite (the NaN repair's vote).
template <int DT, typename Acc>
__device__ __forceinline__ bool tc_store_row(const AttnParams& p, float* out, int b, int h, int row, int t, float lsum,
                                             float m, bool vec2, Acc acc) {
    const float inv = lsum == 0.f ? 0.f : 1.f / lsum;
    float* orow = out + (i64)row * p.o_stride[2];
    bool bad = false;
#pragma unroll
    for (int j = 0; j < DT; ++j) {
        const int col = j * 8 + 2 * t;
        const float x0 = acc(j, 0) * inv, x1 = acc(j, 1) * inv;
        bad |= (col < p.dv && !isfinite(x0)) || (col + 1 < p.dv && !isfinite(x1));
        if (vec2 && col + 1 < p.dv) {
            *reinterpret_cast<float2*>(orow + col) = make_float2(x0, x1);
        } else {
            if (col < p.dv) orow[col] = x0;
            if (col + 1 < p.dv) orow[col + 1] = x1;
        }
    }
    if (p.lse != nullptr && t == 0)
        p.lse[((i64)b * p.hq + h) * p.sq + row] = lsum == 0.f ? SDPA_NEG_INF : (m + log2f(lsum)) * SDPA_LN2;
    return bad;
}
