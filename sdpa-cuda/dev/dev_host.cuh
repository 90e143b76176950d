// What the nvcc-built harness libraries (fa1_host.cu, fa2_host.cu, tf32_host.cu) share: launching a kernel
// with dynamic shared memory, and the C interface that sdpa_dev.py's DevLib reads:
//   <prefix>_count(), <prefix>_entry(i, int* out) (the entry's N ints), <prefix>_launch(i, params, stream),
//   <prefix>_params_size() (checked against the ctypes mirror of AttnParams).
#pragma once
#include <cstddef>
#include <cstring>
#include <cuda_runtime.h>

typedef int (*LaunchFn)(const AttnParams&, cudaStream_t);

// Raises the kernel's dynamic shared memory limit to `smem` bytes and launches it; returns the CUDA error.
template <typename Kernel>
int launch_dyn(Kernel k, dim3 grid, int threads, int smem, cudaStream_t st, const AttnParams& p) {
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return (int)e;
    k<<<grid, threads, smem, st>>>(p);
    return (int)cudaGetLastError();
}

// The exports over `static const Entry ENTRIES[]`, whose Entry holds N ints and then `LaunchFn fn`.
#define DEV_HOST_EXPORTS(PREFIX, N)                                                                       \
    static_assert(offsetof(Entry, fn) == (N) * sizeof(int), "Entry: N ints, then the launcher");          \
    extern "C" int PREFIX##_count() { return sizeof(ENTRIES) / sizeof(Entry); }                           \
    extern "C" void PREFIX##_entry(int i, int* out) { std::memcpy(out, &ENTRIES[i], (N) * sizeof(int)); } \
    extern "C" int PREFIX##_launch(int i, const AttnParams* p, void* stream) {                            \
        if (i < 0 || i >= PREFIX##_count()) return -1;                                                    \
        return ENTRIES[i].fn(*p, (cudaStream_t)stream);                                                   \
    }                                                                                                     \
    extern "C" int PREFIX##_params_size() { return (int)sizeof(AttnParams); }
