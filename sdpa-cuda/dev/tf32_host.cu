// Standalone development harness for the TF32 kernels (kernels/tf32.cu): compiled with nvcc into a shared
// library that dev/tf32_bench.py loads with ctypes and drives with torch tensors. It instantiates the same
// device code as the Rust backend at several tile configurations, so tiles can be chosen by measurement,
// and carries a tensor-core microbenchmark (independent mma.sync m16n8k8 TF32 chains, no memory traffic):
// the ceiling of the instruction these kernels are built from. Not part of the Rust build.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -shared -Xcompiler -fPIC -cudart static \
//        -o tf32dev.so tf32_host.cu
//   (add -DTF32DEV_CONFIGS='"file.inc"' for another list of configurations. Until dd5fbb7 this harness also
//   built the first wgmma kernel, dev/tf32_wg.cuh, as WG_CFG entries; the shipped one is kernels/tf32_wgmma.cu,
//   timed through the Rust driver by tf32_wgmma_run.sh.)
#define TC_NO_ENTRIES
#ifdef TF32DEV_KERNEL
#include TF32DEV_KERNEL
#else
#include "../kernels/tf32.cu"
#endif
#include "dev_host.cuh"

template <int DP, int MT, int NW, int BK, int ST, bool SPLIT, bool PRE, int MASK>
__global__ void __launch_bounds__(NW * 32) tc_dev(const AttnParams p) {
    extern __shared__ __align__(16) float smem[];
    tc_forward<DP, MT, NW, BK, ST, SPLIT, PRE, MASK>(p, smem);
}

// At most this many blocks per launch of the mma.sync kernels (0: one block per work item), for a kernel
// built with persistent blocks that loops over the items (-DTF32DEV_KERNEL; the one measured is
// dev/tf32_persist.cu at commit b50d99c).
static int g_grid_cap = 0;
extern "C" void tfdev_set_grid_cap(int cap) { g_grid_cap = cap; }

template <int DP, int MT, int NW, int BK, int ST, bool SPLIT, bool PRE, int MASK>
int launch_tc(const AttnParams& p, cudaStream_t st) {
    using C = TcCfg<DP, MT, NW, BK, ST, SPLIT, PRE>;
    long long blocks = (long long)((p.sq + C::BM - 1) / C::BM) * p.b * p.hq;
    if (g_grid_cap > 0 && blocks > g_grid_cap) blocks = g_grid_cap;
    return launch_dyn(tc_dev<DP, MT, NW, BK, ST, SPLIT, PRE, MASK>, (unsigned)blocks, NW * 32, C::SMEM_BYTES, st, p);
}

struct Entry {
    int dp, mt, nw, bk, st, split, pre, mask, bm, smem;
    LaunchFn fn;
};
#define TC_CFG(DP, MT, NW, BK, ST, SPLIT, PRE, MASK)                                                        \
    {DP, MT, NW, BK, ST, SPLIT, PRE, MASK, TcCfg<DP, MT, NW, BK, ST, SPLIT, PRE>::BM,                       \
     TcCfg<DP, MT, NW, BK, ST, SPLIT, PRE>::SMEM_BYTES, launch_tc<DP, MT, NW, BK, ST, SPLIT, PRE, MASK>},
#define TC_CFG2(DP, MT, NW, BK, ST, SPLIT, PRE) \
    TC_CFG(DP, MT, NW, BK, ST, SPLIT, PRE, 0) TC_CFG(DP, MT, NW, BK, ST, SPLIT, PRE, 1)

static const Entry ENTRIES[] = {
#ifndef TF32DEV_CONFIGS
    // plain TF32
    TC_CFG2(64, 2, 4, 64, 2, false, true) TC_CFG2(64, 2, 8, 64, 2, false, true)
    TC_CFG2(128, 2, 4, 32, 1, false, true) TC_CFG2(128, 2, 8, 32, 1, false, true)
    // split TF32
    TC_CFG2(64, 2, 4, 32, 1, true, true)
    TC_CFG2(128, 1, 8, 16, 1, true, true) TC_CFG2(128, 1, 8, 32, 1, true, true) TC_CFG2(128, 2, 4, 16, 1, true, true)
#else
#include TF32DEV_CONFIGS
#endif
};

DEV_HOST_EXPORTS(tfdev, 10)

// Tensor-core ceiling for mma.sync m16n8k8 TF32: each warp runs 8 independent accumulator chains.
__global__ void __launch_bounds__(128) mma_peak(int iters, float* sink) {
    unsigned a[4], b0 = __float_as_uint(1.0f + threadIdx.x * 1e-3f), b1 = b0 ^ 0x2000u;
    for (int i = 0; i < 4; ++i) a[i] = __float_as_uint(0.5f + (threadIdx.x + i) * 1e-3f);
    float acc[8][4];
    for (int j = 0; j < 8; ++j)
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
    for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int j = 0; j < 8; ++j) tc_mma(acc[j], a, b0, b1);
    }
    float s = 0.f;
    for (int j = 0; j < 8; ++j)
        for (int e = 0; e < 4; ++e) s += acc[j][e];
    if (s == 12345.f) sink[threadIdx.x] = s;
}
// Launches `blocks` blocks of 4 warps, `iters` x 8 mmas per warp; returns the FLOP count through *flops.
extern "C" int tfdev_mma_peak(int blocks, int iters, float* sink, void* stream, double* flops) {
    mma_peak<<<blocks, 128, 0, (cudaStream_t)stream>>>(iters, sink);
    *flops = (double)blocks * 4 * iters * 8 * (2.0 * 16 * 8 * 8);
    return (int)cudaGetLastError();
}
