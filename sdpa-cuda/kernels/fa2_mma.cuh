// Shared device code of the tensor-core kernels (fa2.cu, splitkv.cu): the launch parameters, and thin
// wrappers over the PTX instructions they are built from (cp.async, ldmatrix, mma.sync m16n8k16, ex2).
//
// The Rust side prepends this file to each module's source (NVRTC has only `common.cuh` as an in-memory
// header), so the modules guard their own `#include` of it with SDPA_FA2_MMA_CUH.
#ifndef SDPA_FA2_MMA_CUH
#define SDPA_FA2_MMA_CUH

#include <cuda_fp16.h>
#include <cuda_bf16.h>

// One attention call as the tensor-core kernels see it. Mirrored field for field by `Fa2Params` in
// `src/fa2.rs` (#[repr(C)]); element strides, the head dim always contiguous.
struct Fa2Params {
    const void* q;
    const void* k;
    const void* v;
    void* o;
    float* lse;          // [B, Hq, Sq] f32, or null
    const float* mask;   // additive f32 mask, or null
    float* part_o;       // split-KV partial outputs [rows, splits, D] f32, or null
    float* part_lse;     // split-KV partial LSE [rows, splits] f32, or null
    long long q_sb, q_sh, q_ss;
    long long k_sb, k_sh, k_ss;
    long long v_sb, v_sh, v_ss;
    long long o_sb, o_sh, o_ss;
    long long m_sb, m_sh, m_sq, m_sk;  // mask strides, 0 on broadcast dims
    int b, hq, hkv, sq, sk;
    int group;           // hq / hkv
    int causal_off;      // causal masks: key j is visible to query i iff j <= i + causal_off
    int n_splits;        // split-KV: splits per (batch, kv head, row tile)
    int keys_per_split;  // split-KV: keys per split, a multiple of 16
    float scale_log2;    // softmax scale times log2(e), > 0
};

// Mask modes, a template parameter of every kernel so that unmasked tiles carry no mask code.
#define FA2_MASK_NONE 0
#define FA2_MASK_CAUSAL 1
#define FA2_MASK_EXPLICIT 2

#define FA2_LOG2E 1.4426950408889634f
#define FA2_LN2 0.6931471805599453f

__device__ __forceinline__ float fa2_neg_inf() { return __int_as_float(0xff800000); }

// 2^x on the special-function unit (the scale is folded into the exponent by the caller).
__device__ __forceinline__ float fa2_exp2(float x) {
    float y;
    asm volatile("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ unsigned fa2_smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy; `valid == false` writes zeros and reads nothing.
__device__ __forceinline__ void fa2_cp_async16(void* smem, const void* gmem, bool valid) {
    unsigned dst = fa2_smem_addr(smem);
    int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void fa2_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void fa2_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void fa2_ldmatrix_x4(unsigned (&r)[4], const void* smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fa2_smem_addr(smem)));
}
__device__ __forceinline__ void fa2_ldmatrix_x4_trans(unsigned (&r)[4], const void* smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fa2_smem_addr(smem)));
}

// Element-type traits: the mma instruction and the f32 -> pair packing for each half type.
template <typename T>
struct Fa2Type;

template <>
struct Fa2Type<__half> {
    __device__ __forceinline__ static unsigned pack(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&h);
    }
    __device__ __forceinline__ static void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <>
struct Fa2Type<__nv_bfloat16> {
    __device__ __forceinline__ static unsigned pack(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&h);
    }
    __device__ __forceinline__ static void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// Max and sum over the four threads of a quad (they hold one row of an mma accumulator).
__device__ __forceinline__ float fa2_quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float fa2_quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

#endif  // SDPA_FA2_MMA_CUH
