// sm_90 asynchronous copies and their mbarriers, shared by the kernels that use them (splitkv.cu's bulk and
// TMA paths, tf32_wgmma.cu's producer/consumer rings): mbarriers in shared memory (init, arrive, arrive
// with an expected transaction count, wait for a phase), the fences that publish barrier initialisation
// and generic-proxy stores to the async proxy, L2 cache policies, 1-D bulk copies and 4-D TMA tensor
// copies that complete on an mbarrier. Handed to NVRTC as an in-memory header (src/sys/modules.rs HEADERS).
//
// Declared on every architecture, so code paths that never call them on older targets still compile; the
// instructions exist from sm_90 on (SM90_ASYNC), and below sm_90 the functions are empty: callers take
// them only where SM90_ASYNC_AVAILABLE is true.
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SM90_ASYNC_AVAILABLE true
#define SM90_ASYNC(...) __VA_ARGS__
#else
#define SM90_ASYNC_AVAILABLE false
#define SM90_ASYNC(...)
#endif

// ---- mbarriers ----
__device__ __forceinline__ void sm90_mbar_init(unsigned bar, unsigned count) {
    SM90_ASYNC(asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory"));
}
__device__ __forceinline__ void sm90_mbar_arrive(unsigned bar) {
    SM90_ASYNC(asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory"));
}
// Arrives once and adds `bytes` to the transactions the current phase waits for.
__device__ __forceinline__ void sm90_mbar_expect(unsigned bar, unsigned bytes) {
    SM90_ASYNC(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory"));
}
__device__ __forceinline__ void sm90_mbar_wait(unsigned bar, unsigned parity) {
    SM90_ASYNC(asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory"));
}
__device__ __forceinline__ void sm90_mbar_init_fence() {
    SM90_ASYNC(asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"));
}
// Generic-proxy stores to shared memory become visible to the async proxy (e.g. wgmma operand reads).
__device__ __forceinline__ void sm90_proxy_fence() {
    SM90_ASYNC(asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"));
}

// ---- copies ----
// An L2 cache policy for the copies below: 0 evict-first, 1 evict-normal, 2 evict-last.
__device__ __forceinline__ unsigned long long sm90_l2_policy(int mode) {
    unsigned long long pol = 0;
    if (mode == 1) SM90_ASYNC(asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol)));
    else if (mode == 2) SM90_ASYNC(asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol)));
    else SM90_ASYNC(asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol)));
    return pol;
}
// 1-D bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) into shared memory,
// completing as transactions on `bar`.
__device__ __forceinline__ void sm90_bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar,
                                              unsigned long long pol) {
    SM90_ASYNC(asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
        "%4;" ::"r"(dst),
        "l"(src), "r"(bytes), "r"(bar), "l"(pol)
        : "memory"));
}
// A TMA tensor map as the host encodes it (cuTensorMapEncodeTiled; opaque, 128-byte aligned as CUDA 13's
// CUtensorMap). The kernels read it from their __grid_constant__ parameter.
struct alignas(128) Sm90TensorMap {
    unsigned long long opaque[16];
};
// One box at coordinates (c0, c1, c2, c3), innermost first, of the 4-D tensor `map` describes into shared
// memory at `dst` (aligned as the map's swizzle needs), completing on `bar`. Rows past the tensor's extent
// arrive as zeros (splitkv: a [KS keys][64 columns] box at column c0, key c1, kv head c2, batch c3).
__device__ __forceinline__ void sm90_tma_load(unsigned dst, const Sm90TensorMap* map, int c0, int c1, int c2, int c3,
                                             unsigned bar, unsigned long long pol) {
    SM90_ASYNC(asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, "
        "{%2, %3, %4, %5}], [%6], %7;" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar), "l"(pol)
        : "memory"));
}
