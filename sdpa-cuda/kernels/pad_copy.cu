// Strided copy of 2-byte rows between head-dim widths, for fa2's pad-copy path (src/kernels/pad_copy.rs):
// dst[b][h][s][c] = c < n_src ? src[b][h][s][c] : 0 for every c < n_dst. Padding (n_src = D < n_dst = D
// rounded up to 8) copies a caller's Q, K or V view into aligned scratch with the extra columns zeroed;
// unpadding (n_dst = Dv <= n_src) copies O's own columns back into the caller's view and writes nothing else
// there. Any strides (both layouts, misaligned views). One warp per row, its lanes on consecutive columns
// (coalesced 2-byte loads and stores, rows of at most 256 columns): the row's (batch, head, position) is
// found once per warp, not once per element (64-bit divisions would cost more than the copy itself).
// Compiled whole.
#include "common.cuh"

// The one by-value parameter (src/kernels/pad_copy.rs `PadCopyArgs`, same layout). Strides in elements.
struct PadCopyArgs {
    const unsigned short* src;
    unsigned short* dst;
    long long src_stride[3];  // batch, head, row
    long long dst_stride[3];
    long long rows;           // b · h · s
    int h, s, n_src, n_dst;
};

extern "C" __global__ void pad_copy_2(const PadCopyArgs a) {
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < a.rows; r += warps) {
        const long long bh = r / a.s;
        const long long row = r - bh * a.s;
        const long long b = bh / a.h;
        const long long h = bh - b * a.h;
        const unsigned short* src = a.src + b * a.src_stride[0] + h * a.src_stride[1] + row * a.src_stride[2];
        unsigned short* dst = a.dst + b * a.dst_stride[0] + h * a.dst_stride[1] + row * a.dst_stride[2];
        for (int c = lane; c < a.n_dst; c += 32)
            dst[c] = c < a.n_src ? src[c] : (unsigned short)0;
    }
}
