// f32 attention on tensor cores: TF32 (`tf32_f32_*`) and split TF32 (`tf32x3_f32_*`).
//
// FlashAttention-2 work split: one block per (query tile of 64 rows, query head, batch), four warps each
// owning 16 whole rows, so the online softmax of a row stays inside one quad of threads. Both products
// use `mma.sync.m16n8k8` with TF32 operands and f32 accumulation. Split TF32 writes each f32 operand as
// big + small (big = tf32(x), small = tf32(x - big)) and sums big·big + big·small + small·big, which
// recovers close to f32 accuracy (the dropped small·small term is ~2^-22 relative).
//
// Shared memory: Q [64][DP+8], K and V [BK][DP+8] as f32 (BK = 64, or 32 from DP = 128), and a per-warp
// P tile [16][BK+8]. The
// columns of Q, K and P are stored permuted inside each group of 8 (c -> 2*(c%4) + c/4), so the two A/B
// fragment elements a thread needs (columns t and t+4) are adjacent: one 8-byte load, and with rows
// padded by 8 floats the 16 lanes of each half-warp hit distinct banks. Global loads are 16 bytes wide
// when D and all strides allow (params.extra = 1). Softmax runs in log2 units (exp2). Head dims are
// padded to DP (16, 32, 64, 128 or 256) with zeros, so any D up to 256 runs; Dv = D.
#include "common.cuh"

constexpr int TC_BQ = 64;
constexpr int TC_WARPS = 4;
// Keys per tile: 64, or 32 from DP = 128 up so that two blocks (eight warps) fit on an SM.
template <int DP> struct TcTile {
    static constexpr int BK = DP >= 128 ? 32 : 64;
    static constexpr int LDP = BK + 8;
};

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

// An operand fragment as TF32: big parts, and for split TF32 the small parts.
template <int N, bool SPLIT>
struct Frag {
    unsigned big[N];
    unsigned small[SPLIT ? N : 1];
    __device__ __forceinline__ void set(const float (&x)[N]) {
#pragma unroll
        for (int i = 0; i < N; ++i) {
            big[i] = to_tf32(x[i]);
            if (SPLIT) small[SPLIT ? i : 0] = to_tf32(x[i] - __uint_as_float(big[i]));
        }
    }
};

template <bool SPLIT>
__device__ __forceinline__ void mma_split(float (&d)[4], const Frag<4, SPLIT>& a, const Frag<2, SPLIT>& b) {
    if (SPLIT) {
        const unsigned as[4] = {a.small[0], a.small[SPLIT ? 1 : 0], a.small[SPLIT ? 2 : 0], a.small[SPLIT ? 3 : 0]};
        const unsigned bs[2] = {b.small[0], b.small[SPLIT ? 1 : 0]};
        mma_tf32(d, as, b.big);
        mma_tf32(d, a.big, bs);
    }
    mma_tf32(d, a.big, b.big);
}

// Position of column c inside its group of 8: t -> 2t, t + 4 -> 2t + 1.
__device__ __forceinline__ int perm8(int c) { return (c & ~7) | ((c & 3) << 1) | ((c >> 2) & 1); }

// rows [0, rows) of a [rows][DP] tile into shared memory (row length ld), columns permuted when PERM;
// zeros past `valid` rows and past column d. VEC: 16-byte global loads (d % 4 == 0, aligned).
template <int DP, bool PERM>
__device__ __forceinline__ void tc_load(float* dst, int ld, const float* src, i64 stride, int rows, int valid, int d,
                                        bool vec) {
    if (vec) {
        constexpr int C4 = DP / 4;
        for (int idx = threadIdx.x; idx < rows * C4; idx += TC_WARPS * 32) {
            const int r = idx / C4, c = (idx - r * C4) * 4;
            float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
            if (r < valid && c < d) x = *reinterpret_cast<const float4*>(src + r * stride + c);
            float* row = dst + r * ld;
            if (PERM) {
                row[perm8(c)] = x.x;
                row[perm8(c + 1)] = x.y;
                row[perm8(c + 2)] = x.z;
                row[perm8(c + 3)] = x.w;
            } else {
                *reinterpret_cast<float4*>(row + c) = x;
            }
        }
    } else {
        for (int idx = threadIdx.x; idx < rows * DP; idx += TC_WARPS * 32) {
            const int r = idx / DP, c = idx - r * DP;
            dst[r * ld + (PERM ? perm8(c) : c)] = (r < valid && c < d) ? src[r * stride + c] : 0.f;
        }
    }
}

template <int DP, bool SPLIT>
__device__ void tc_forward(const AttnParams& p) {
    constexpr int LD = DP + 8;
    constexpr int TC_BK = TcTile<DP>::BK;
    constexpr int TC_LDP = TcTile<DP>::LDP;
    constexpr int NT_S = TC_BK / 8;  // n8 tiles of the score tile
    constexpr int NT_O = DP / 8;     // n8 tiles of the output
    extern __shared__ __align__(16) float smem[];
    float* Qs = smem;
    float* Ks = Qs + TC_BQ * LD;
    float* Vs = Ks + TC_BK * LD;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3;
    float* Ps = Vs + TC_BK * LD + warp * 16 * TC_LDP;
    const bool vec = p.extra == 1;

    const int bh_count = p.b * p.hq;
    const int n_tiles = (p.sq + TC_BQ - 1) / TC_BQ;
    const int bh = blockIdx.x % bh_count;
    const int q0 = (n_tiles - 1 - (int)(blockIdx.x / bh_count)) * TC_BQ;
    const int b = bh / p.hq, h = bh % p.hq, kvh = h / p.group;
    const int n_keys = causal_limit(p, min(q0 + TC_BQ, p.sq) - 1);

    const float* q = static_cast<const float*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1] + q0 * p.q_stride[2];
    const float* k = static_cast<const float*>(p.k) + b * p.k_stride[0] + kvh * p.k_stride[1];
    const float* v = static_cast<const float*>(p.v) + b * p.v_stride[0] + kvh * p.v_stride[1];
    tc_load<DP, true>(Qs, LD, q, p.q_stride[2], TC_BQ, p.sq - q0, p.d, vec);

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
        tc_load<DP, true>(Ks, LD, k + k0 * p.k_stride[2], p.k_stride[2], TC_BK, p.sk - k0, p.d, vec);
        tc_load<DP, false>(Vs, LD, v + k0 * p.v_stride[2], p.v_stride[2], TC_BK, p.sk - k0, p.dv, vec);
        __syncthreads();

        float s[NT_S][4];
#pragma unroll
        for (int n = 0; n < NT_S; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[n][e] = 0.f;
        const float* qw = Qs + warp * 16 * LD;
#pragma unroll 2
        for (int kk = 0; kk < DP; kk += 8) {
            const float2 lo = *reinterpret_cast<const float2*>(qw + g * LD + kk + 2 * t);
            const float2 hi = *reinterpret_cast<const float2*>(qw + (g + 8) * LD + kk + 2 * t);
            Frag<4, SPLIT> a;
            a.set({lo.x, hi.x, lo.y, hi.y});
#pragma unroll
            for (int n = 0; n < NT_S; ++n) {
                const float2 kb = *reinterpret_cast<const float2*>(Ks + (n * 8 + g) * LD + kk + 2 * t);
                Frag<2, SPLIT> bf;
                bf.set({kb.x, kb.y});
                mma_split<SPLIT>(s[n], a, bf);
            }
        }

        // Scale (log2 units), mask, online softmax; element e of tile n is row rr[e / 2],
        // key k0 + n*8 + 2t + (e & 1).
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
                    float x = s[n][hr * 2 + c] * p.scale_log2;
                    bool vis = j < limit;
                    if (vis && mrow != nullptr) {
                        const float add = mrow[j * p.mask_stride[3]];
                        vis = add != SDPA_NEG_INF;
                        x = fmaf(add, SDPA_LOG2E, x);
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
                alpha[hr] = m[hr] == SDPA_NEG_INF ? 0.f : exp2f(m[hr] - m_new);
#pragma unroll
                for (int n = 0; n < NT_S; ++n)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        float& x = s[n][hr * 2 + c];
                        x = x == SDPA_NEG_INF ? 0.f : exp2f(x - m_new);
                        sum += x;
                    }
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            l[hr] = l[hr] * alpha[hr] + sum;
            m[hr] = m_new;
        }
        // P to the warp's shared tile, columns permuted like Q (C layout -> A layout for TF32).
#pragma unroll
        for (int n = 0; n < NT_S; ++n)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const int col = perm8(n * 8 + 2 * t + c);
                Ps[g * TC_LDP + col] = s[n][c];
                Ps[(g + 8) * TC_LDP + col] = s[n][2 + c];
            }
#pragma unroll
        for (int n = 0; n < NT_O; ++n) {
            acc[n][0] *= alpha[0];
            acc[n][1] *= alpha[0];
            acc[n][2] *= alpha[1];
            acc[n][3] *= alpha[1];
        }
        __syncwarp();
#pragma unroll 2
        for (int kk = 0; kk < TC_BK; kk += 8) {
            const float2 lo = *reinterpret_cast<const float2*>(Ps + g * TC_LDP + kk + 2 * t);
            const float2 hi = *reinterpret_cast<const float2*>(Ps + (g + 8) * TC_LDP + kk + 2 * t);
            Frag<4, SPLIT> a;
            a.set({lo.x, hi.x, lo.y, hi.y});
#pragma unroll
            for (int n = 0; n < NT_O; ++n) {
                Frag<2, SPLIT> bf;
                bf.set({Vs[(kk + t) * LD + n * 8 + g], Vs[(kk + t + 4) * LD + n * 8 + g]});
                mma_split<SPLIT>(acc[n], a, bf);
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
        if (p.lse != nullptr && t == 0) p.lse[((i64)b * p.hq + h) * p.sq + i] = row_lse_log2(m[hr], l[hr]);
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
