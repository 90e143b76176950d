// Standalone development harness for the fa2 and splitkv kernels: compiled with nvcc into a shared
// library that dev/fa2_bench.py loads with ctypes and drives with torch tensors. It instantiates the same
// device code as the Rust backend (kernels/fa2.cu, kernels/splitkv.cu) at several tile configurations, so
// tile sizes can be chosen by measurement. Not part of the Rust build. (Until dd5fbb7 it also compiled the
// previous split-KV kernel with its separate combine pass, dev/splitkv_v1.cuh, as entry kind 2.)
//
//   nvcc -O3 -std=c++17 -arch=sm_90 --expt-relaxed-constexpr -I../kernels -shared -Xcompiler -fPIC -cudart static \
//        -o fa2dev.so fa2_host.cu   (--expt-relaxed-constexpr: splitkv.cu calls constexpr tile helpers on the device)
//   (add -DFA2DEV_CONFIGS='"tune_configs.inc"' for the tuning candidates, '"decode_configs.inc"' for the
//   split-KV kernels alone: every head dim, dtype and mask on both load paths, plus decoding variants)
#define FA2_NO_ENTRIES
#define SPLITKV_NO_ENTRIES
#include "../kernels/fa2.cu"
#include "../kernels/splitkv.cu"
#include "dev_host.cuh"

template <typename T, int D, int BM, int BN, int NW, int ST, int MINB, int MASK>
__global__ void __launch_bounds__(NW * 32, MINB) fa2_dev(const AttnParams p) {
    extern __shared__ __align__(16) unsigned char smem[];
    fa2_forward<T, D, D, BM, BN, NW, ST, MASK, false>(p, reinterpret_cast<T*>(smem));
}

template <typename T, int D, int BM, int BN, int NW, int ST, int MINB, int MASK>
int launch_fa2(const AttnParams& p, cudaStream_t st) {
    return launch_dyn(fa2_dev<T, D, BM, BN, NW, ST, MINB, MASK>, dim3((p.sq + BM - 1) / BM, p.hq, p.b), NW * 32,
                      Fa2Tile<D, D, BM, BN, NW, ST>::SMEM_ELEMS * 2, st, p);
}

// The split-KV kernel (kernels/splitkv.cu, combine folded in) with the bulk-copy (sm_90) or cp.async path.
template <typename T, int D, int NW, int STAGES, int KS, int MASK, int BULK>
__global__ void __launch_bounds__(NW * 32) splitkv_dev(const AttnParams p) {
    extern __shared__ __align__(16) unsigned char smem[];
    // BULK bit 0: bulk copies, bit 1: interleaved warps (the TMA path needs tensor maps: Rust driver only).
    splitkv_forward<T, D, NW, STAGES, KS, MASK, (BULK & 1) ? SKV_BULK : SKV_CP_ASYNC, (BULK & 2) != 0>(
        p, reinterpret_cast<T*>(smem), nullptr, nullptr);
}
static int g_memset = 1;  // 0: skip zeroing the row-tile counters (they reset themselves after a call)
extern "C" void fa2dev_set_memset(int on) { g_memset = on; }

template <typename T, int D, int NW, int STAGES, int KS, int MASK, int BULK>
int launch_splitkv(const AttnParams& p, cudaStream_t st) {
    const int smem = SplitKvTile<D, STAGES, KS, (BULK & 1) ? SKV_BULK : SKV_CP_ASYNC>::smem_bytes(NW);
    const int m_tiles = (p.group * p.sq + 15) / 16;
    const int nblk = (p.num_splits + NW - 1) / NW;
    dim3 grid(nblk, p.hkv * m_tiles, p.b);
    if (nblk > 1 && g_memset) {
        // Counters after the partial LSEs and outputs (splitkv_counters in kernels/splitkv.cu).
        const long long rows = (long long)p.b * p.hq * p.sq;
        const long long off = (rows * nblk + 3) / 4 * 4 + rows * nblk * D;
        cudaError_t e = cudaMemsetAsync(static_cast<float*>(p.workspace) + off, 0, sizeof(unsigned) * p.b * grid.y, st);
        if (e != cudaSuccess) return (int)e;
    }
    return launch_dyn(splitkv_dev<T, D, NW, STAGES, KS, MASK, BULK>, grid, NW * 32, smem, st, p);
}

struct Entry {
    int kind;  // 0 fa2, 1 splitkv
    int dt;    // 0 f16, 1 bf16
    int d, a, b, c, e, mask;  // fa2: BM, BN, NW, STAGES; splitkv: NW, STAGES, KS, bulk (1) | interleave (2)
    LaunchFn fn;
};

#define FA2_CFG(DT, T, D, BM, BN, NW, ST, MINB)                                                        \
    {0, DT, D, BM, BN, NW, ST, 0, launch_fa2<T, D, BM, BN, NW, ST, MINB, 0>},                         \
        {0, DT, D, BM, BN, NW, ST, 1, launch_fa2<T, D, BM, BN, NW, ST, MINB, 1>},
#define FA2_CFG_ALL(DT, T, D, BM, BN, NW, ST, MINB)                                                    \
    FA2_CFG(DT, T, D, BM, BN, NW, ST, MINB){0, DT, D, BM, BN, NW, ST, 2, launch_fa2<T, D, BM, BN, NW, ST, MINB, 2>},
#define SKV_CFG(DT, T, D, NW, ST, KS, BULK)                                                            \
    {1, DT, D, NW, ST, KS, BULK, 0, launch_splitkv<T, D, NW, ST, KS, 0, BULK>},                        \
        {1, DT, D, NW, ST, KS, BULK, 1, launch_splitkv<T, D, NW, ST, KS, 1, BULK>},
#define SKV_CFG_ALL(DT, T, D, NW, ST, KS, BULK)                                                        \
    SKV_CFG(DT, T, D, NW, ST, KS, BULK){1, DT, D, NW, ST, KS, BULK, 2, launch_splitkv<T, D, NW, ST, KS, 2, BULK>},

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
    SKV_CFG_ALL(0, H, 64, 4, 2, 32, true) SKV_CFG_ALL(1, BF, 64, 4, 2, 32, true)
    SKV_CFG_ALL(0, H, 96, 4, 2, 32, true) SKV_CFG_ALL(1, BF, 96, 4, 2, 32, true)
    SKV_CFG_ALL(0, H, 128, 4, 2, 32, true) SKV_CFG_ALL(1, BF, 128, 4, 2, 32, true)
    SKV_CFG_ALL(0, H, 256, 4, 2, 16, true) SKV_CFG_ALL(1, BF, 256, 4, 2, 16, true)
#else
#include FA2DEV_CONFIGS
#endif
};

DEV_HOST_EXPORTS(fa2dev, 8)
