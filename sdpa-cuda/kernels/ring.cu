// Ring attention's small passes (src/ring/): folding a step's partial output into the running one by the
// LSE rule (sdpa-core's merge_normalized), adding a step's gradients into f32 accumulators, rounding them
// into the dtype, and gathering LSE rows. Compiled whole; one entry per dtype where the dtype matters.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#define RING_NEG_INF __int_as_float(0xff800000)
#define RING_NAN __int_as_float(0x7fffffff)

__device__ __forceinline__ float ring_load(const float* p, unsigned long long i) { return p[i]; }
__device__ __forceinline__ float ring_load(const __half* p, unsigned long long i) { return __half2float(p[i]); }
__device__ __forceinline__ float ring_load(const __nv_bfloat16* p, unsigned long long i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void ring_store(float* p, unsigned long long i, float x) { p[i] = x; }
__device__ __forceinline__ void ring_store(__half* p, unsigned long long i, float x) { p[i] = __float2half_rn(x); }
__device__ __forceinline__ void ring_store(__nv_bfloat16* p, unsigned long long i, float x) { p[i] = __float2bfloat16_rn(x); }

// `RingMergeArgs` in src/ring/kernels.rs, same layout. Rows are (b*h, local row) with `rows` local rows per
// head; the part covers local rows [part_row0, part_row0 + part_rows) and is compact over them.
struct RingMergeArgs {
    const void* prev;          // running output: dtype when prev_is_f32 == 0, else f32
    float* prev_lse;           // running LSE per row, updated in place
    const void* part;          // this step's output (dtype), compact over its rows
    const float* part_lse;     // this step's LSE, compact over its rows
    void* out;                 // where the merged output goes: dtype when out_is_f32 == 0, else f32
    unsigned long long heads;  // B * Hq
    unsigned long long rows;   // local rows per head
    unsigned long long part_row0, part_rows;
    unsigned long long dv;
    int prev_is_f32, out_is_f32;
};

// One warp per row: weights from the two LSEs, then the row's Dv elements. A row without a part keeps its
// running state (copied through when the output buffer differs). NaN in either LSE gives NaN, as
// merge_normalized does; two -inf states give zeros and -inf.
template <typename T>
__device__ void ring_merge(const RingMergeArgs& a) {
    const unsigned long long warp = ((unsigned long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const unsigned lane = threadIdx.x % 32;
    if (warp >= a.heads * a.rows) return;
    const unsigned long long hd = warp / a.rows, i = warp % a.rows;
    const bool has_part = i >= a.part_row0 && i < a.part_row0 + a.part_rows;
    const float la = a.prev_lse[warp];
    const float lb = has_part ? a.part_lse[hd * a.part_rows + (i - a.part_row0)] : RING_NEG_INF;
    const float m = fmaxf(la, lb);
    float wa, wb, lse;
    if (isnan(la) || isnan(lb)) {
        wa = wb = RING_NAN;
        lse = RING_NAN;
    } else if (m == RING_NEG_INF) {
        wa = wb = 0.f;
        lse = RING_NEG_INF;
    } else {
        const float ea = __expf(la - m), eb = __expf(lb - m), tot = ea + eb;
        wa = ea / tot;
        wb = eb / tot;
        lse = m + __logf(tot);
    }
    const unsigned long long row = warp * a.dv;
    const unsigned long long prow = has_part ? (hd * a.part_rows + (i - a.part_row0)) * a.dv : 0;
    for (unsigned long long d = lane; d < a.dv; d += 32) {
        const float x = a.prev_is_f32 ? ring_load((const float*)a.prev, row + d) : ring_load((const T*)a.prev, row + d);
        float y = wa == 0.f && !isnan(wa) ? 0.f : wa * x;
        if (has_part && wb != 0.f) y += wb * ring_load((const T*)a.part, prow + d);
        if (isnan(wb)) y = RING_NAN;
        if (a.out_is_f32) ring_store((float*)a.out, row + d, y); else ring_store((T*)a.out, row + d, y);
    }
    __syncwarp();
    if (lane == 0) a.prev_lse[warp] = lse;
}

// `RingAddArgs`: acc[(h, r, c)] (+)= part[(h, r, c)] for rows r in [row0, row0 + n) of `[heads, rows_total,
// width]` (both buffers in that layout); `first` writes instead of adding.
struct RingAddArgs {
    float* acc;
    const void* part;
    unsigned long long heads, rows_total, row0, n, width;
    int first, pad;
};

template <typename T>
__device__ void ring_add(const RingAddArgs& a) {
    const unsigned long long total = a.heads * a.n * a.width;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long e = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += stride) {
        const unsigned long long c = e % a.width, r = (e / a.width) % a.n, h = e / (a.width * a.n);
        const unsigned long long at = (h * a.rows_total + a.row0 + r) * a.width + c;
        const float x = ring_load((const T*)a.part, at);
        a.acc[at] = a.first ? x : a.acc[at] + x;
    }
}

// `RingConvertArgs`: out[i] = acc[i] rounded to the dtype.
struct RingConvertArgs {
    const float* acc;
    void* out;
    unsigned long long n;
};

template <typename T>
__device__ void ring_convert(const RingConvertArgs& a) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < a.n; i += stride)
        ring_store((T*)a.out, i, a.acc[i]);
}

#define RING_ENTRIES(NAME, T)                                                                              \
    extern "C" __global__ void ring_merge_##NAME(const RingMergeArgs a) { ring_merge<T>(a); }              \
    extern "C" __global__ void ring_add_##NAME(const RingAddArgs a) { ring_add<T>(a); }                    \
    extern "C" __global__ void ring_convert_##NAME(const RingConvertArgs a) { ring_convert<T>(a); }

RING_ENTRIES(f16, __half)
RING_ENTRIES(bf16, __nv_bfloat16)

// `RingRowsArgs`: out[(h, i)] = src[(h, row0 + i)] for f32 rows (a step's LSE rows, compact).
struct RingRowsArgs {
    const float* src;
    float* out;
    unsigned long long heads, src_rows, row0, rows;
};

extern "C" __global__ void ring_rows_f32(const RingRowsArgs a) {
    const unsigned long long n = a.heads * a.rows;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long e = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += stride)
        a.out[e] = a.src[(e / a.rows) * a.src_rows + a.row0 + e % a.rows];
}
