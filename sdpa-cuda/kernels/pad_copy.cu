// Strided copy of rows between head-dim widths, for the pad-copy paths of fa2's forward and of the backward
// (src/kernels/pad_copy.rs, src/kernels/bwd_pad.rs): dst[b][h][s][c] = c < n_src ? src[b][h][s][c] : 0 for
// every c < n_dst. Padding (n_src = D < n_dst = D rounded up to 8) copies a caller's Q, K or V view (the
// backward's O and dO too) into aligned scratch with the extra columns zeroed; unpadding (n_dst = Dv <= n_src)
// copies O's own columns back into the caller's view (the backward's dQ, dK, dV, and dQ in f32) and writes
// nothing else there. Any strides (both layouts, misaligned views). One warp per row, its lanes on
// consecutive columns (coalesced loads and stores, rows of at most 256 columns): the row's (batch, head,
// position) is found once per warp, not once per element (64-bit divisions would cost more than the copy
// itself). Elements are moved as raw bits: `pad_copy_2` for f16/bf16, `pad_copy_4` for f32. Compiled whole.
#include "common.cuh"

// The one by-value parameter (src/kernels/pad_copy.rs `PadCopyArgs`, same layout). Strides in elements.
template <typename E>
struct PadCopyArgs {
    const E* src;
    E* dst;
    long long src_stride[3];  // batch, head, row
    long long dst_stride[3];
    long long rows;           // b · h · s
    int h, s, n_src, n_dst;
};

template <typename E>
__device__ __forceinline__ void pad_copy_rows(const PadCopyArgs<E>& a) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < a.rows; r += warps) {
        const long long bh = r / a.s;
        const long long row = r - bh * a.s;
        const long long b = bh / a.h;
        const long long h = bh - b * a.h;
        const E* src = a.src + b * a.src_stride[0] + h * a.src_stride[1] + row * a.src_stride[2];
        E* dst = a.dst + b * a.dst_stride[0] + h * a.dst_stride[1] + row * a.dst_stride[2];
        for (int c = lane; c < a.n_dst; c += 32)
            dst[c] = c < a.n_src ? src[c] : (E)0;
    }
}

extern "C" __global__ void pad_copy_2(const PadCopyArgs<unsigned short> a) { pad_copy_rows(a); }
extern "C" __global__ void pad_copy_4(const PadCopyArgs<unsigned int> a) { pad_copy_rows(a); }
