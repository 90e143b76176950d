// Pieces of split-KV decoding shared by splitkv.cu and splitkv_mla.cu: the scratch that holds the partials of a
// row tile split over several blocks and its per-tile counters, the merge of partials (sdpa-core's
// merge_normalized rule), the packed GQA row map, the TMA entries' parameter and the 4-column output store.
// Handed to NVRTC as an in-memory header (src/sys/modules.rs HEADERS).
#pragma once

#include "fa2_mma.cuh"
#include "sm90_async.cuh"

// Scratch inside AttnParams::workspace for row tiles split over several blocks: `parts` partials in all
// (splitkv dense: B·Hq·Sq rows x nblk = gridDim.x blocks; ragged: SkvUnit::parts; splitkv_mla: its
// SplitKvMlaArgs::parts), their LSEs first, then their outputs [parts][D] f32 from the next 16-byte boundary,
// then one u32 counter per (batch, row tile), zero before the launch (src/kernels/splitkv.rs `workspace_len`
// sizes it the same way and zeroes the counters; splitkv.cu's last-block merge counts there, splitkv_mla.cu
// merges in a second launch and keeps none).
__device__ __forceinline__ float* splitkv_part_lse(const AttnParams& p) { return static_cast<float*>(p.workspace); }
__device__ __forceinline__ float* splitkv_part_o(const AttnParams& p, long long parts) {
    return static_cast<float*>(p.workspace) + (parts + 3) / 4 * 4;
}
__device__ __forceinline__ unsigned* splitkv_counters(const AttnParams& p, long long parts, int d) {
    return reinterpret_cast<unsigned*>(splitkv_part_o(p, parts) + parts * d);
}

// Ints per unit of a ragged call's schedule (src/kernels/splitkv.rs `UNIT_INTS`, `ragged_units`): sequence,
// chunk index, chunks of the sequence, first key, end key, first partial slot of the sequence.
#define SKV_UNIT_INTS 6

// The TMA entries' parameter: the usual AttnParams, then the K and V maps over (D, Sk, Hkv, B)
// (src/kernels/splitkv.rs `TmaArgs` mirrors it).
// The maps start at byte 384 on both sides whatever alignment each side gives them (explicit padding).
struct SplitKvTmaArgs {
    AttnParams p;
    unsigned char pad[384 - sizeof(AttnParams)];
    Sm90TensorMap k, v;
};
static_assert(sizeof(SplitKvTmaArgs) == 640, "SplitKvTmaArgs must match src/kernels/splitkv.rs");

// Packed row r of kv head kvh's group·sq rows: query i of head kvh·group + r / sq.
__device__ __forceinline__ void splitkv_row_of(int sq, int group, int kvh, int r, int& hq, int& i) {
    const int g = r / sq;
    i = r - g * sq;
    hq = kvh * group + g;
}
// Rows of this warp's tile: r in [r0, r0 + 16) of kv head kvh's G·Sq packed rows.
__device__ __forceinline__ void splitkv_row(const AttnParams& p, int kvh, int r, int& hq, int& i) {
    splitkv_row_of(p.sq, p.group, kvh, r, hq, i);
}

// sdpa_core::softmax::merge_normalized for a 4-wide slice [c, c + 4) of one row's output: n partials
// (normalised output, LSE). `lse_at(s)` and `o_at(s)` (a float4) read partial s. Returns the merged LSE.
template <typename LseAt, typename OAt>
__device__ __forceinline__ float splitkv_merge(int n, LseAt lse_at, OAt o_at, float4& out) {
    float mx = fa2_neg_inf();
    bool nan = false;
#pragma unroll 8
    for (int s = 0; s < n; ++s) {
        const float x = lse_at(s);
        nan |= x != x;
        mx = fmaxf(mx, x);
    }
    if (nan) {
        const float q = __int_as_float(0x7fffffff);
        out = make_float4(q, q, q, q);
        return q;
    }
    if (mx == fa2_neg_inf()) {
        out = make_float4(0.f, 0.f, 0.f, 0.f);
        return fa2_neg_inf();
    }
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float total = 0.f;
#pragma unroll 16
    for (int s = 0; s < n; ++s) {
        const float w = expf(lse_at(s) - mx);
        const float4 o = o_at(s);
        total += w;
        acc.x += w * o.x;
        acc.y += w * o.y;
        acc.z += w * o.z;
        acc.w += w * o.w;
    }
    const float inv = 1.f / total;
    out = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    return mx + logf(total);
}

// Four output columns from `dst`; PAD: only the first `left` of them (the call's Dv need not be a multiple of 4).
template <bool PAD, typename T>
__device__ __forceinline__ void splitkv_store4(T* dst, float4 v, int left) {
    dst[0] = T(v.x);
    if (!PAD || left > 1) dst[1] = T(v.y);
    if (!PAD || left > 2) dst[2] = T(v.z);
    if (!PAD || left > 3) dst[3] = T(v.w);
}
