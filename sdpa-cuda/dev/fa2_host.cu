// Standalone development harness for the fa2 and splitkv kernels: compiled with nvcc into a shared
// library that dev/fa2_bench.py loads with ctypes and drives with torch tensors. It instantiates the same
// device code as the Rust backend (kernels/fa2.cu, kernels/splitkv.cu) at several tile configurations, so
// tile sizes can be chosen by measurement. Not part of the Rust build.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -cudart static -o fa2dev.so fa2_host.cu
#define FA2_NO_ENTRIES
#define SPLITKV_NO_ENTRIES
#include "../kernels/fa2.cu"
#include "../kernels/splitkv.cu"
#include <cstdio>
#include <cuda_runtime.h>

template <typename T, int D, int BM, int BN, int NW, int MINB, int MASK>
__global__ void __launch_bounds__(NW * 32, MINB) fa2_dev(const Fa2Params p) {
    extern __shared__ __align__(16) unsigned char smem[];
    fa2_forward<T, D, BM, BN, NW, MASK>(p, reinterpret_cast<T*>(smem));
}

template <typename T, int D, int BM, int BN, int NW, int MINB, int MASK>
int launch_fa2(const Fa2Params& p, cudaStream_t st) {
    const int smem = Fa2Tile<D, BM, BN, NW>::SMEM_ELEMS * 2;
    auto k = fa2_dev<T, D, BM, BN, NW, MINB, MASK>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return (int)e;
    dim3 grid((p.sq + BM - 1) / BM, p.hq, p.b);
    k<<<grid, NW * 32, smem, st>>>(p);
    return (int)cudaGetLastError();
}

template <typename T, int D, int NW, int STAGES, int MASK>
__global__ void __launch_bounds__(NW * 32) splitkv_dev(const Fa2Params p) {
    extern __shared__ __align__(16) unsigned char smem[];
    splitkv_forward<T, D, NW, STAGES, MASK>(p, reinterpret_cast<T*>(smem));
}
template <typename T, int D>
__global__ void __launch_bounds__(128) combine_dev(const Fa2Params p) {
    splitkv_combine_row<T, D>(p);
}

template <typename T, int D, int NW, int STAGES, int MASK>
int launch_splitkv(const Fa2Params& p, cudaStream_t st) {
    const int smem = SplitKvTile<D, STAGES>::WARP_ELEMS * 2 * NW;
    auto k = splitkv_dev<T, D, NW, STAGES, MASK>;
    cudaError_t e = cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return (int)e;
    const int m_tiles = (p.group * p.sq + 15) / 16;
    dim3 grid((p.n_splits + NW - 1) / NW, p.hkv * m_tiles, p.b);
    k<<<grid, NW * 32, smem, st>>>(p);
    e = cudaGetLastError();
    if (e != cudaSuccess) return (int)e;
    const long long rows = (long long)p.b * p.hq * p.sq;
    combine_dev<T, D><<<(unsigned)((rows + 3) / 4), 128, 0, st>>>(p);
    return (int)cudaGetLastError();
}

typedef int (*LaunchFn)(const Fa2Params&, cudaStream_t);
struct Entry {
    int kind;  // 0 fa2, 1 splitkv
    int dt;    // 0 f16, 1 bf16
    int d, a, b, c, mask;  // fa2: BM, BN, NW; splitkv: NW, STAGES, 0
    LaunchFn fn;
};

#define FA2_CFG(DT, T, D, BM, BN, NW, MINB)                                                            \
    {0, DT, D, BM, BN, NW, 0, launch_fa2<T, D, BM, BN, NW, MINB, 0>},                                 \
        {0, DT, D, BM, BN, NW, 1, launch_fa2<T, D, BM, BN, NW, MINB, 1>},
#define FA2_CFG_ALL(DT, T, D, BM, BN, NW, MINB)                                                        \
    FA2_CFG(DT, T, D, BM, BN, NW, MINB){0, DT, D, BM, BN, NW, 2, launch_fa2<T, D, BM, BN, NW, MINB, 2>},
#define SKV_CFG(DT, T, D, NW, ST)                                                                      \
    {1, DT, D, NW, ST, 0, 0, launch_splitkv<T, D, NW, ST, 0>}, {1, DT, D, NW, ST, 0, 1, launch_splitkv<T, D, NW, ST, 1>},
#define SKV_CFG_ALL(DT, T, D, NW, ST)                                                                  \
    SKV_CFG(DT, T, D, NW, ST){1, DT, D, NW, ST, 0, 2, launch_splitkv<T, D, NW, ST, 2>},

typedef __half H;
typedef __nv_bfloat16 BF;
static const Entry ENTRIES[] = {
    // Defaults (every mask, both dtypes).
    FA2_CFG_ALL(0, H, 64, 128, 64, 4, 2) FA2_CFG_ALL(1, BF, 64, 128, 64, 4, 2)
    FA2_CFG_ALL(0, H, 96, 128, 64, 4, 2) FA2_CFG_ALL(1, BF, 96, 128, 64, 4, 2)
    FA2_CFG_ALL(0, H, 128, 128, 64, 4, 2) FA2_CFG_ALL(1, BF, 128, 128, 64, 4, 2)
    FA2_CFG_ALL(0, H, 256, 128, 64, 8, 1) FA2_CFG_ALL(1, BF, 256, 128, 64, 8, 1)
    // Tuning candidates (bf16, none/causal).
    FA2_CFG(1, BF, 64, 128, 128, 4, 1) FA2_CFG(1, BF, 64, 64, 64, 4, 2) FA2_CFG(1, BF, 64, 128, 128, 8, 1)
    FA2_CFG(1, BF, 64, 64, 128, 4, 2)
    FA2_CFG(1, BF, 128, 128, 32, 4, 2) FA2_CFG(1, BF, 128, 64, 64, 4, 2) FA2_CFG(1, BF, 128, 128, 64, 8, 1)
    FA2_CFG(1, BF, 128, 128, 128, 8, 1)
    FA2_CFG(1, BF, 96, 64, 64, 4, 2)
    FA2_CFG(1, BF, 256, 64, 64, 4, 1) FA2_CFG(1, BF, 256, 64, 32, 4, 2)
    // Split-KV.
    SKV_CFG_ALL(0, H, 64, 4, 4) SKV_CFG_ALL(1, BF, 64, 4, 4)
    SKV_CFG_ALL(0, H, 96, 4, 4) SKV_CFG_ALL(1, BF, 96, 4, 4)
    SKV_CFG_ALL(0, H, 128, 4, 4) SKV_CFG_ALL(1, BF, 128, 4, 4)
    SKV_CFG_ALL(0, H, 256, 4, 3) SKV_CFG_ALL(1, BF, 256, 4, 3)
    SKV_CFG(1, BF, 128, 4, 3) SKV_CFG(1, BF, 128, 4, 2) SKV_CFG(1, BF, 128, 8, 3) SKV_CFG(1, BF, 128, 2, 6)
    SKV_CFG(1, BF, 128, 4, 6)
};

extern "C" int fa2dev_count() { return sizeof(ENTRIES) / sizeof(Entry); }
extern "C" void fa2dev_entry(int i, int* out7) {
    const Entry& e = ENTRIES[i];
    int v[7] = {e.kind, e.dt, e.d, e.a, e.b, e.c, e.mask};
    for (int j = 0; j < 7; ++j) out7[j] = v[j];
}
extern "C" int fa2dev_launch(int i, const Fa2Params* p, void* stream) {
    if (i < 0 || i >= fa2dev_count()) return -1;
    return ENTRIES[i].fn(*p, (cudaStream_t)stream);
}
extern "C" int fa2dev_params_size() { return (int)sizeof(Fa2Params); }
