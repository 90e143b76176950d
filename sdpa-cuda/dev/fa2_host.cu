// Standalone development harness for the fa2 and splitkv kernels: compiled with nvcc into a shared
// library that dev/fa2_bench.py loads with ctypes and drives with torch tensors. It instantiates the same
// device code as the Rust backend (kernels/fa2.cu, kernels/splitkv.cu) at several tile configurations, so
// tile sizes can be chosen by measurement. Not part of the Rust build.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I../kernels -shared -Xcompiler -fPIC -cudart static -o fa2dev.so fa2_host.cu
//   (add -DFA2DEV_CONFIGS='"tune_configs.inc"' for the tuning candidates)
#define FA2_NO_ENTRIES
#define SPLITKV_NO_ENTRIES
#include "../kernels/fa2.cu"
#include "../kernels/splitkv.cu"
#include <cstdio>
#include <cuda_runtime.h>

template <typename T, int D, int BM, int BN, int NW, int ST, int MINB, int MASK>
__global__ void __launch_bounds__(NW * 32, MINB) fa2_dev(const AttnParams p) {
    extern __shared__ __align__(16) unsigned char smem[];
    fa2_forward<T, D, BM, BN, NW, ST, MASK>(p, reinterpret_cast<T*>(smem));
}

template <typename T, int D, int BM, int BN, int NW, int ST, int MINB, int MASK>
int launch_fa2(const AttnParams& p, cudaStream_t st) {
    const int smem = Fa2Tile<D, BM, BN, NW, ST>::SMEM_ELEMS * 2;
    auto k = fa2_dev<T, D, BM, BN, NW, ST, MINB, MASK>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return (int)e;
    dim3 grid((p.sq + BM - 1) / BM, p.hq, p.b);
    k<<<grid, NW * 32, smem, st>>>(p);
    return (int)cudaGetLastError();
}

template <typename T, int D, int NW, int STAGES, int KS, int MASK>
__global__ void __launch_bounds__(NW * 32) splitkv_dev(const AttnParams p) {
    extern __shared__ __align__(16) unsigned char smem[];
    splitkv_forward<T, D, NW, STAGES, KS, MASK>(p, reinterpret_cast<T*>(smem));
}
static int g_combine = 1;  // 0: time the split kernel alone (the output is then incomplete)
extern "C" void fa2dev_set_combine(int on) { g_combine = on; }
template <typename T, int D, int NWARP>
__global__ void __launch_bounds__(NWARP * 32) combine_dev(const AttnParams p) {
    splitkv_combine_row<T, D, NWARP>(p);
}
static int g_combine_warps = SPLITKV_COMBINE_WARPS;  // 4 or 8: A/B of the combine kernel's width
extern "C" void fa2dev_set_combine_warps(int w) { g_combine_warps = w; }
static int g_pdl = 0;  // 1: launch the combine kernel with programmatic dependent launch
extern "C" void fa2dev_set_pdl(int on) { g_pdl = on; }

template <typename T, int D, int NW, int STAGES, int KS, int MASK>
int launch_splitkv(const AttnParams& p, cudaStream_t st) {
    const int smem = SplitKvTile<D, STAGES, KS>::WARP_ELEMS * 2 * NW;
    auto k = splitkv_dev<T, D, NW, STAGES, KS, MASK>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return (int)e;
    const int m_tiles = (p.group * p.sq + 15) / 16;
    dim3 grid((p.num_splits + NW - 1) / NW, p.hkv * m_tiles, p.b);
    k<<<grid, NW * 32, smem, st>>>(p);
    e = cudaGetLastError();
    if (e != cudaSuccess || !g_combine) return (int)e;
    const long long rows = (long long)p.b * p.hq * p.sq;
    if (g_pdl) {
        // Programmatic dependent launch: the combine grid may start while the split grid drains.
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.gridDim = dim3((unsigned)rows);
        cfg.blockDim = dim3(g_combine_warps * 32);
        cfg.dynamicSmemBytes = 0;
        cfg.stream = st;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        if (g_combine_warps == 4) return (int)cudaLaunchKernelEx(&cfg, combine_dev<T, D, 4>, p);
        return (int)cudaLaunchKernelEx(&cfg, combine_dev<T, D, 8>, p);
    }
    if (g_combine_warps == 4)
        combine_dev<T, D, 4><<<(unsigned)rows, 128, 0, st>>>(p);
    else
        combine_dev<T, D, 8><<<(unsigned)rows, 256, 0, st>>>(p);
    return (int)cudaGetLastError();
}

typedef int (*LaunchFn)(const AttnParams&, cudaStream_t);
struct Entry {
    int kind;  // 0 fa2, 1 splitkv
    int dt;    // 0 f16, 1 bf16
    int d, a, b, c, e, mask;  // fa2: BM, BN, NW, STAGES; splitkv: NW, STAGES, KS, 0
    LaunchFn fn;
};

#define FA2_CFG(DT, T, D, BM, BN, NW, ST, MINB)                                                        \
    {0, DT, D, BM, BN, NW, ST, 0, launch_fa2<T, D, BM, BN, NW, ST, MINB, 0>},                         \
        {0, DT, D, BM, BN, NW, ST, 1, launch_fa2<T, D, BM, BN, NW, ST, MINB, 1>},
#define FA2_CFG_ALL(DT, T, D, BM, BN, NW, ST, MINB)                                                    \
    FA2_CFG(DT, T, D, BM, BN, NW, ST, MINB){0, DT, D, BM, BN, NW, ST, 2, launch_fa2<T, D, BM, BN, NW, ST, MINB, 2>},
#define SKV_CFG(DT, T, D, NW, ST, KS)                                                                  \
    {1, DT, D, NW, ST, KS, 0, 0, launch_splitkv<T, D, NW, ST, KS, 0>},                                \
        {1, DT, D, NW, ST, KS, 0, 1, launch_splitkv<T, D, NW, ST, KS, 1>},
#define SKV_CFG_ALL(DT, T, D, NW, ST, KS)                                                              \
    SKV_CFG(DT, T, D, NW, ST, KS){1, DT, D, NW, ST, KS, 0, 2, launch_splitkv<T, D, NW, ST, KS, 2>},

typedef __half H;
typedef __nv_bfloat16 BF;
static const Entry ENTRIES[] = {
#ifndef FA2DEV_CONFIGS
    // The configurations of the entry points in kernels/fa2.cu and kernels/splitkv.cu (every mask, both
    // dtypes).
    FA2_CFG_ALL(0, H, 64, 128, 128, 4, 1, 1) FA2_CFG_ALL(1, BF, 64, 128, 128, 4, 1, 1)
    FA2_CFG_ALL(0, H, 96, 128, 64, 4, 2, 2) FA2_CFG_ALL(1, BF, 96, 128, 64, 4, 2, 2)
    FA2_CFG_ALL(0, H, 128, 128, 64, 4, 1, 2) FA2_CFG_ALL(1, BF, 128, 128, 64, 4, 1, 2)
    FA2_CFG_ALL(0, H, 256, 64, 64, 4, 1, 1) FA2_CFG_ALL(1, BF, 256, 64, 64, 4, 1, 1)
    SKV_CFG_ALL(0, H, 64, 4, 2, 32) SKV_CFG_ALL(1, BF, 64, 4, 2, 32)
    SKV_CFG_ALL(0, H, 96, 4, 2, 32) SKV_CFG_ALL(1, BF, 96, 4, 2, 32)
    SKV_CFG_ALL(0, H, 128, 4, 2, 32) SKV_CFG_ALL(1, BF, 128, 4, 2, 32)
    SKV_CFG_ALL(0, H, 256, 4, 2, 16) SKV_CFG_ALL(1, BF, 256, 4, 2, 16)
#else
#include FA2DEV_CONFIGS
#endif
};

extern "C" int fa2dev_count() { return sizeof(ENTRIES) / sizeof(Entry); }
extern "C" void fa2dev_entry(int i, int* out8) {
    const Entry& e = ENTRIES[i];
    int v[8] = {e.kind, e.dt, e.d, e.a, e.b, e.c, e.e, e.mask};
    for (int j = 0; j < 8; ++j) out8[j] = v[j];
}
extern "C" int fa2dev_launch(int i, const AttnParams* p, void* stream) {
    if (i < 0 || i >= fa2dev_count()) return -1;
    return ENTRIES[i].fn(*p, (cudaStream_t)stream);
}
extern "C" int fa2dev_params_size() { return (int)sizeof(AttnParams); }
