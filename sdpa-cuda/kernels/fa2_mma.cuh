// Shared device code of the tensor-core kernels (fa2.cu, splitkv.cu): thin wrappers over the PTX
// instructions they are built from (cp.async, ldmatrix, mma.sync m16n8k16, ex2) and the split-KV scratch
// layout. Kernels take the crate-wide AttnParams (common.cuh) by value. Handed to NVRTC as an in-memory
// header (src/modules.rs HEADERS).
#ifndef SDPA_FA2_MMA_CUH
#define SDPA_FA2_MMA_CUH

#include "common.cuh"

// Split-KV scratch inside AttnParams::workspace: the partial LSEs [rows][splits] first, then the partial
// outputs [rows][splits][D] f32 from the next 16-byte boundary (src/splitkv.rs sizes it the same way).
__device__ __forceinline__ float* fa2_part_lse(const AttnParams& p) { return static_cast<float*>(p.workspace); }
__device__ __forceinline__ float* fa2_part_o(const AttnParams& p) {
    const long long n = (long long)p.b * p.hq * p.sq * p.num_splits;
    return static_cast<float*>(p.workspace) + ((n + 3) / 4) * 4;
}

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
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ unsigned fa2_smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16-byte global->shared copy; `valid == false` writes zeros and reads nothing.
__device__ __forceinline__ void fa2_cp_async16(unsigned dst, const void* gmem, bool valid) {
    int src_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
}
// As fa2_cp_async16 for data read exactly once (split-KV streams K and V): asks L2 to fetch the whole
// 256-byte sector group, so each DRAM access serves the next rows' requests too.
__device__ __forceinline__ void fa2_cp_async16_stream(unsigned dst, const void* gmem, bool valid) {
    int src_bytes = valid ? 16 : 0;
#ifdef SPLITKV_NO_L2_PREFETCH
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
#else
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_bytes));
#endif
}
__device__ __forceinline__ void fa2_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void fa2_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ldmatrix from a 32-bit shared-memory address (callers add compile-time offsets to a per-lane base, so
// the address folds into the instruction's immediate).
__device__ __forceinline__ void fa2_ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void fa2_ldmatrix_x4_trans(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
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
        asm(
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
        asm(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

// Programmatic dependent launch (sm_90): the split-KV kernel lets its combine pass be scheduled early,
// and the combine pass waits here until the split kernel's writes are visible. Both are no-ops when the
// launch did not ask for programmatic serialization, and on older architectures.
__device__ __forceinline__ void fa2_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void fa2_wait_primary() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

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
