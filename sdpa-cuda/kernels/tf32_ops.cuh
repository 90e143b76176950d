// Helpers shared by the f32 tensor-core kernels: `tf32.cu` (mma.sync) and `tf32_wgmma.cu` (Hopper wgmma):
// PTX wrappers, TF32 rounding and splitting.
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

