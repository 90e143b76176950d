// Standalone development harness for the fa1 kernels: compiled with nvcc into a shared library that
// dev/fa1_bench.py loads with ctypes and drives with torch tensors. It instantiates the device code of
// kernels/fa1.cu (the register-tiled variant as shipped and in alternative shapes, and the plain fixed
// variant it replaces) so the tile shape is chosen by measurement. Not part of the Rust build.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -cudart static -o fa1dev.so fa1_host.cu
#define FA1_NO_ENTRIES
#include "../kernels/fa1.cu"
#include "dev_host.cuh"

template <typename T, int HD, int TM, bool ALIAS, int MINB, int UNR, int TX>
__global__ void __launch_bounds__(16 * TX, MINB) tiled_dev(const AttnParams p) {
    fa1_tiled<T, HD, TM, ALIAS, UNR, TX>(p);
}
template <typename T, int HD>
__global__ void __launch_bounds__(FA1_THREADS) fixed_dev(const AttnParams p) {
    fa1_fixed<T, HD>(p);
}

template <typename T, int HD, int TM, bool ALIAS, int MINB, int UNR, int TX>
int launch_tiled(const AttnParams& p, cudaStream_t st) {
    const int bq = 16 * TM;
    return launch_dyn(tiled_dev<T, HD, TM, ALIAS, MINB, UNR, TX>, ((p.sq + bq - 1) / bq) * p.b * p.hq, 16 * TX,
                      Fa1Tiled<HD, TM, ALIAS, TX>::SMEM_FLOATS * 4, st, p);
}

template <typename T, int HD>
int launch_fixed(const AttnParams& p, cudaStream_t st) {
    const bool alias = HD * FA1_LDK >= FA1_BK * FA1_LDQ;
    const int smem = 4 * (HD * FA1_LDQ + HD * FA1_LDK + FA1_BK * HD + (alias ? 0 : FA1_BK * FA1_LDQ));
    return launch_dyn(fixed_dev<T, HD>, ((p.sq + FA1_BQ - 1) / FA1_BQ) * p.b * p.hq, FA1_THREADS, smem, st, p);
}

struct Entry {
    int kind;  // 0 tiled (shipped choice), 1 plain fixed, 2 tiled alternative
    int dt;    // 0 f32, 1 f16, 2 bf16
    int d, tm, alias, minb, unr, tx;
    LaunchFn fn;
};
typedef __half H;
typedef __nv_bfloat16 BF;
#define SHIP(DT, T, D)                                                                                    \
    {0, DT, D, Fa1TiledChoice<T, D>::TM, Fa1TiledChoice<T, D>::ALIAS, Fa1TiledChoice<T, D>::MINB,         \
     Fa1TiledChoice<T, D>::UNR, Fa1TiledChoice<T, D>::TX,                                                 \
     launch_tiled<T, D, Fa1TiledChoice<T, D>::TM, Fa1TiledChoice<T, D>::ALIAS, Fa1TiledChoice<T, D>::MINB, \
                  Fa1TiledChoice<T, D>::UNR, Fa1TiledChoice<T, D>::TX>},
#define ALT(DT, T, D, TM, AL, MINB, UNR, TX) \
    {2, DT, D, TM, AL, MINB, UNR, TX, launch_tiled<T, D, TM, AL, MINB, UNR, TX>},
#define FIXED(DT, T, D) {1, DT, D, 4, 0, 1, 1, 16, launch_fixed<T, D>},
static const Entry ENTRIES[] = {
    // The shipped choice (Fa1TiledChoice) for every fast head dim of f32, and a few of f16/bf16.
    SHIP(0, float, 32) SHIP(0, float, 64) SHIP(0, float, 80) SHIP(0, float, 96) SHIP(0, float, 128)
    SHIP(0, float, 256) SHIP(2, BF, 64) SHIP(2, BF, 128) SHIP(1, H, 96) SHIP(2, BF, 256)
    // Alternatives: eight threads per row group (TX = 8: 128 threads, 8 x 8 score tile per thread),
    // P aliasing K (two blocks per SM at D = 128), unrolling.
    ALT(0, float, 64, 8, false, 2, 2, 8) ALT(0, float, 64, 8, false, 2, 1, 8) ALT(0, float, 64, 4, true, 3, 1, 16)
    ALT(0, float, 128, 8, false, 1, 1, 8) ALT(0, float, 128, 4, true, 2, 1, 8) ALT(0, float, 128, 4, true, 2, 2, 16)
    ALT(2, BF, 64, 8, false, 2, 2, 8)
    // The plain fixed variant (4 x 4 per thread) that the tiled one replaces.
    FIXED(0, float, 64) FIXED(0, float, 128)
};

DEV_HOST_EXPORTS(fa1dev, 8)
