// Strided copy of 2-byte rows between head-dim widths, for fa2's pad-copy path (src/kernels/pad_copy.rs):
// dst[b][h][s][c] = c < n_src ? src[b][h][s][c] : 0 for every c < n_dst. Padding (n_src = D < n_dst = D
// rounded up to 8) copies a caller's Q, K or V view into aligned scratch with the extra columns zeroed;
// unpadding (n_dst = Dv <= n_src) copies O's own columns back into the caller's view and writes nothing else
// there. Any strides (both layouts, misaligned views): one thread per element, consecutive threads on
// consecutive columns of a row, so a warp's loads and stores are coalesced. Compiled whole.
#include "common.cuh"

// The one by-value parameter (src/kernels/pad_copy.rs `PadCopyArgs`, same layout). Strides in elements.
struct PadCopyArgs {
    const unsigned short* src;
    unsigned short* dst;
    long long src_stride[3];  // batch, head, row
    long long dst_stride[3];
    long long total;          // b · h · s · n_dst
    int h, s, n_src, n_dst;
};

extern "C" __global__ void pad_copy_2(const PadCopyArgs a) {
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long x = (long long)blockIdx.x * blockDim.x + threadIdx.x; x < a.total; x += step) {
        const long long r = x / a.n_dst;
        const int c = (int)(x - r * a.n_dst);
        const long long bh = r / a.s;
        const int row = (int)(r - bh * a.s);
        const long long b = bh / a.h;
        const int h = (int)(bh - b * a.h);
        unsigned short v = 0;
        if (c < a.n_src)
            v = a.src[b * a.src_stride[0] + h * a.src_stride[1] + row * a.src_stride[2] + c];
        a.dst[b * a.dst_stride[0] + h * a.dst_stride[1] + row * a.dst_stride[2] + c] = v;
    }
}
