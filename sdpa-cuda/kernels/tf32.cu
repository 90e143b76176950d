// f32 attention on tensor cores: TF32 (`tf32_f32_*`) and split TF32 (`tf32x3_f32_*`).
//
// FlashAttention-2 work split: one block per (query tile of 64 rows, query head, batch), four warps each
// owning 16 whole rows, so the online softmax of a row stays inside one quad of threads. Both products
// use `mma.sync.m16n8k8` with TF32 operands and f32 accumulation. Split TF32 writes each f32 operand as
// big + small (big = tf32(x), small = tf32(x - big)) and sums big·big + big·small + small·big, which
// recovers close to f32 accuracy (the dropped small·small term is ~2^-22 relative).
//
// Shared memory: Q [64][DP+4], K [32][DP+4], V [32][DP+8] as f32, and a per-warp P tile [16][32+4]; the
// paddings make every fragment load hit 32 distinct banks. Head dims are padded to DP (16, 32, 64, 128
// or 256) with zeros, so any D up to 256 runs; Dv = D.
#include "common.cuh"

constexpr int TC_BQ = 64;
constexpr int TC_BK = 32;
constexpr int TC_WARPS = 4;
constexpr int TC_LDP = TC_BK + 4;

__device__ __forceinline__ unsigned to_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}

// D += A·B for one m16n8k8 TF32 tile.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// d += a·b with a and b given as f32 values; SPLIT selects 3xTF32.
template <bool SPLIT>
__device__ __forceinline__ void mma_f32(float (&d)[4], const float (&a)[4], const float (&b)[2]) {
    unsigned ab[4], bb[2];
#pragma unroll
    for (int i = 0; i < 4; ++i) ab[i] = to_tf32(a[i]);
#pragma unroll
    for (int i = 0; i < 2; ++i) bb[i] = to_tf32(b[i]);
    if (SPLIT) {
        unsigned as[4], bs[2];
#pragma unroll
        for (int i = 0; i < 4; ++i) as[i] = to_tf32(a[i] - __uint_as_float(ab[i]));
#pragma unroll
        for (int i = 0; i < 2; ++i) bs[i] = to_tf32(b[i] - __uint_as_float(bb[i]));
        mma_tf32(d, as, bb);
        mma_tf32(d, ab, bs);
    }
    mma_tf32(d, ab, bb);
}

// rows [0, rows) of a [rows][DP] tile into shared memory with row length ld; zeros past `valid` rows
// and past column D.
template <int DP>
__device__ __forceinline__ void tc_load(float* dst, int ld, const float* src, i64 stride, int rows, int valid,
                                        int d) {
    for (int idx = threadIdx.x; idx < rows * DP; idx += TC_WARPS * 32) {
        const int r = idx / DP, c = idx - r * DP;
        dst[r * ld + c] = (r < valid && c < d) ? src[r * stride + c] : 0.f;
    }
}

template <int DP, bool SPLIT>
__device__ void tc_forward(const AttnParams& p) {
    constexpr int LDQ = DP + 4, LDK = DP + 4, LDV = DP + 8;
    constexpr int NT_S = TC_BK / 8;  // n8 tiles of the score tile
    constexpr int NT_O = DP / 8;     // n8 tiles of the output
    extern __shared__ __align__(16) float smem[];
    float* Qs = smem;
    float* Ks = Qs + TC_BQ * LDQ;
    float* Vs = Ks + TC_BK * LDK;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3;
    float* Ps = Vs + TC_BK * LDV + warp * 16 * TC_LDP;

    const int bh_count = p.b * p.hq;
    const int n_tiles = (p.sq + TC_BQ - 1) / TC_BQ;
    const int bh = blockIdx.x % bh_count;
    const int q0 = (n_tiles - 1 - (int)(blockIdx.x / bh_count)) * TC_BQ;
    const int b = bh / p.hq, h = bh % p.hq, kvh = h / p.group;
    const int n_keys = causal_limit(p, min(q0 + TC_BQ, p.sq) - 1);

    const float* q = static_cast<const float*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1] + q0 * p.q_stride[2];
    const float* k = static_cast<const float*>(p.k) + b * p.k_stride[0] + kvh * p.k_stride[1];
    const float* v = static_cast<const float*>(p.v) + b * p.v_stride[0] + kvh * p.v_stride[1];
    tc_load<DP>(Qs, LDQ, q, p.q_stride[2], TC_BQ, p.sq - q0, p.d);

    // Rows this thread holds in C fragments: r0 = warp*16 + g and r1 = r0 + 8.
    const int rr[2] = {q0 + warp * 16 + g, q0 + warp * 16 + g + 8};
    float m[2] = {SDPA_NEG_INF, SDPA_NEG_INF}, l[2] = {0.f, 0.f};
    float acc[NT_O][4];
#pragma unroll
    for (int n = 0; n < NT_O; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.f;

    for (int k0 = 0; k0 < n_keys; k0 += TC_BK) {
        __syncthreads();  // the previous tile's K/V reads are done
        tc_load<DP>(Ks, LDK, k + k0 * p.k_stride[2], p.k_stride[2], TC_BK, p.sk - k0, p.d);
        tc_load<DP>(Vs, LDV, v + k0 * p.v_stride[2], p.v_stride[2], TC_BK, p.sk - k0, p.dv);
        __syncthreads();

        float s[NT_S][4];
#pragma unroll
        for (int n = 0; n < NT_S; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
        const float* qw = Qs + warp * 16 * LDQ;
#pragma unroll 4
        for (int kk = 0; kk < DP; kk += 8) {
            const float a[4] = {qw[g * LDQ + kk + t], qw[(g + 8) * LDQ + kk + t], qw[g * LDQ + kk + t + 4],
                                qw[(g + 8) * LDQ + kk + t + 4]};
#pragma unroll
            for (int n = 0; n < NT_S; ++n) {
                const float bf[2] = {Ks[(n * 8 + g) * LDK + kk + t], Ks[(n * 8 + g) * LDK + kk + t + 4]};
                mma_f32<SPLIT>(s[n], a, bf);
            }
        }

        // Scale, mask, online softmax; element e of tile n is row rr[e / 2], key k0 + n*8 + 2t + (e & 1).
        float alpha[2];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int i = rr[hr];
            const bool row_ok = i < p.sq;
            const int limit = row_ok ? causal_limit(p, i) : 0;
            const float* mrow = (row_ok && p.mask_kind == SDPA_MASK_EXPLICIT) ? mask_row(p, b, h, i) : nullptr;
            float mx = SDPA_NEG_INF;
#pragma unroll
            for (int n = 0; n < NT_S; ++n)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int j = k0 + n * 8 + 2 * t + c;
                    float x = s[n][hr * 2 + c] * p.scale;
                    bool vis = j < limit;
                    if (vis && mrow != nullptr) {
                        const float add = mrow[j * p.mask_stride[3]];
                        vis = add != SDPA_NEG_INF;
                        x += add;
                    }
                    s[n][hr * 2 + c] = vis ? x : SDPA_NEG_INF;
                    mx = nan_max(mx, s[n][hr * 2 + c]);
                }
            mx = nan_max(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = nan_max(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = nan_max(m[hr], mx);
            float sum = 0.f;
            if (m_new == SDPA_NEG_INF) {
                alpha[hr] = 1.f;
#pragma unroll
                for (int n = 0; n < NT_S; ++n) s[n][hr * 2] = s[n][hr * 2 + 1] = 0.f;
            } else {
                alpha[hr] = m[hr] == SDPA_NEG_INF ? 0.f : expf(m[hr] - m_new);
#pragma unroll
                for (int n = 0; n < NT_S; ++n)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        float& x = s[n][hr * 2 + c];
                        x = x == SDPA_NEG_INF ? 0.f : expf(x - m_new);
                        sum += x;
                    }
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            l[hr] = l[hr] * alpha[hr] + sum;
            m[hr] = m_new;
        }
        // P to the warp's shared tile (C layout -> A layout goes through shared memory for TF32).
#pragma unroll
        for (int n = 0; n < NT_S; ++n) {
            *reinterpret_cast<float2*>(Ps + g * TC_LDP + n * 8 + 2 * t) = make_float2(s[n][0], s[n][1]);
            *reinterpret_cast<float2*>(Ps + (g + 8) * TC_LDP + n * 8 + 2 * t) = make_float2(s[n][2], s[n][3]);
        }
#pragma unroll
        for (int n = 0; n < NT_O; ++n) {
            acc[n][0] *= alpha[0];
            acc[n][1] *= alpha[0];
            acc[n][2] *= alpha[1];
            acc[n][3] *= alpha[1];
        }
        __syncwarp();
#pragma unroll
        for (int kk = 0; kk < TC_BK; kk += 8) {
            const float a[4] = {Ps[g * TC_LDP + kk + t], Ps[(g + 8) * TC_LDP + kk + t], Ps[g * TC_LDP + kk + t + 4],
                                Ps[(g + 8) * TC_LDP + kk + t + 4]};
#pragma unroll
            for (int n = 0; n < NT_O; ++n) {
                const float bf[2] = {Vs[(kk + t) * LDV + n * 8 + g], Vs[(kk + t + 4) * LDV + n * 8 + g]};
                mma_f32<SPLIT>(acc[n], a, bf);
            }
        }
        __syncwarp();
    }

    float* o = static_cast<float*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int i = rr[hr];
        if (i >= p.sq) continue;
        const float inv = row_inv_l(l[hr]);
#pragma unroll
        for (int n = 0; n < NT_O; ++n)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int col = n * 8 + 2 * t + c;
                if (col < p.dv) o[i * p.o_stride[2] + col] = acc[n][hr * 2 + c] * inv;
            }
        if (p.lse != nullptr && t == 0) p.lse[((i64)b * p.hq + h) * p.sq + i] = row_lse(m[hr], l[hr]);
    }
}

#define TC_KERNEL(NAME, DP, SPLIT)                                                                   \
    extern "C" __global__ void __launch_bounds__(TC_WARPS * 32) NAME(const AttnParams p) {         \
        tc_forward<DP, SPLIT>(p);                                                                    \
    }
#define TC_ALL(DP)                        \
    TC_KERNEL(tf32_f32_##DP, DP, false)   \
    TC_KERNEL(tf32x3_f32_##DP, DP, true)

TC_ALL(16)
TC_ALL(32)
TC_ALL(64)
TC_ALL(128)
TC_ALL(256)
