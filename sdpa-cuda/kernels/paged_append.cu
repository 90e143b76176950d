// The "write to cache" step of a paged KV cache (sdpa_core::append_to_pages): new K (or V) rows, packed
// [total_new, Hkv, D] in sequence order, copied into their pages after each sequence's cached tokens. The
// host validates the append (AppendSpec::validate) and resolves each new token to its (sequence, position)
// (src/kernels/paged_append.rs); here every thread copies UNIT bytes of one row of one head, so a warp moves
// whole rows with wide, coalesced loads and stores. Compiled whole: one entry per copy width.
#include "common.cuh"

// The one by-value parameter (src/kernels/paged_append.rs `AppendArgs`, same layout). Strides in bytes.
struct PagedAppendArgs {
    const unsigned char* src;    // packed new rows
    unsigned char* pages;        // the page pool
    const unsigned* table;       // [B, max_pages] page indices
    const int* rows;             // [total_new][2]: sequence and position of each new token
    long long src_token, src_head;
    long long page_stride, slot_stride, head_stride;
    long long n_units;           // total_new · Hkv · units_per_row
    int units_per_row, hkv, page_size, max_pages, num_pages, reserved;
};

template <typename U>
__device__ __forceinline__ void paged_append(const PagedAppendArgs& a) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long x = (long long)blockIdx.x * blockDim.x + threadIdx.x; x < a.n_units; x += stride) {
        const long long r = x / a.units_per_row;
        const int u = (int)(x - r * a.units_per_row);
        const long long t = r / a.hkv;
        const int h = (int)(r - t * a.hkv);
        const int b = a.rows[2 * t], j = a.rows[2 * t + 1];
        // The table is the caller's device data (its length and the lengths were checked on the host):
        // clamped into the pool as the attention kernels clamp it.
        const unsigned page = min(a.table[(long long)b * a.max_pages + j / a.page_size], (unsigned)(a.num_pages - 1));
        const long long dst = page * a.page_stride + (long long)(j % a.page_size) * a.slot_stride + h * a.head_stride;
        const long long src = t * a.src_token + h * a.src_head;
        reinterpret_cast<U*>(a.pages + dst)[u] = reinterpret_cast<const U*>(a.src + src)[u];
    }
}

extern "C" __global__ void paged_append_16(const PagedAppendArgs a) { paged_append<uint4>(a); }
extern "C" __global__ void paged_append_4(const PagedAppendArgs a) { paged_append<unsigned>(a); }
extern "C" __global__ void paged_append_2(const PagedAppendArgs a) { paged_append<unsigned short>(a); }
