// Plain TF32 attention with Hopper warpgroup MMA (wgmma, sm_90a), development version driven by
// dev/tf32_host.cu. Included after kernels/tf32.cu (reuses its helpers).
//
// One block = NWG warpgroups of 4 warps, each owning 64 query rows (BM = 64 NWG). Per K/V tile of BK keys:
//   S = Q Kᵀ: wgmma m64n{BK}k8, A = Q from registers (rounded to TF32 once per block), B = K from shared
//             memory (K-major: K rows are contiguous in d, which is the product's k dimension);
//   O += P V: wgmma m64n{DP}k8, A = P from the S registers, B = Vᵀ in shared memory. TF32 wgmma needs both
//             operands K-major, so V (row-major, key x d) is transposed while it is rounded, into Vᵀ [d][key].
// Shared layouts: no swizzle; core matrices of 8 rows x 16 bytes (4 floats) stored as 128 contiguous bytes;
// LBO = byte step between core matrices along k, SBO = along m/n. K and the V staging tile use chunk index
// idx -> row 8 (idx / (8 CH)) + idx % 8, 16-byte column (idx / 8) % CH at byte idx * 16, so 8 consecutive
// lanes fill one core matrix (conflict-free cp.async writes).
// P's registers are the A fragment as they are when k-index t <-> key 2t and t+4 <-> key 2t+1 (as in the
// mma.sync kernel); Vᵀ stores key 2t at slot t and key 2t+1 at slot t+4 of each group of 8.
// Only the 16-byte load path (D % 4 == 0, aligned rows); the host falls back to tc_forward otherwise.
#ifndef WG_UNROLL
#define WG_UNROLL 1
#endif
constexpr int kWgUnroll = WG_UNROLL;
// Timing diagnostics only (wrong results): skip the K rounding stores / the Vᵀ scatter.
#ifndef WG_DIAG_NO_KROUND
#define WG_DIAG_NO_KROUND 0
#endif
#ifndef WG_DIAG_NO_VT
#define WG_DIAG_NO_VT 0
#endif
#ifndef WG_SWAP_LBO
#define WG_SWAP_LBO 0
#endif

__device__ __forceinline__ unsigned long long wg_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    if (WG_SWAP_LBO) { unsigned x = lbo; lbo = sbo; sbo = x; }
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
           ((unsigned long long)(sbo >> 4) << 32);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ __forceinline__ void wg_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_pin(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
__device__ __forceinline__ void wg_mma_n64(float (&d)[32], const unsigned (&a)[4], unsigned long long desc, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "{%32,%33,%34,%35}, %36, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}
__device__ __forceinline__ void wg_mma_n128(float (&d)[64], const unsigned (&a)[4], unsigned long long desc, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "{%64,%65,%66,%67}, %68, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}
template <int N>
__device__ __forceinline__ void wg_mma(float (&d)[N / 2], const unsigned (&a)[4], unsigned long long desc, int scale_d) {
    if constexpr (N == 64) wg_mma_n64(d, a, desc, scale_d);
    else wg_mma_n128(d, a, desc, scale_d);
}

template <int DP, int NWG, int BK>
struct WgCfg {
    static constexpr int BM = 64 * NWG;
    static constexpr int THREADS = 128 * NWG;
    static constexpr int TILE_BYTES = BK * DP * 4;
    static constexpr int SMEM_BYTES = 3 * TILE_BYTES;  // K, V staging, Vᵀ
};

// cp.async of a [BK][DP] tile (rows from `src`, `valid` rows, d columns) into the core-matrix layout.
template <int DP, int BK, int THREADS>
__device__ __forceinline__ void wg_load(unsigned dst, const float* src, i64 stride, int valid, int d, int tid) {
    constexpr int CH = DP / 4, TOTAL = BK * CH;
    static_assert(TOTAL % THREADS == 0, "whole chunks per thread");
#pragma unroll kWgUnroll
    for (int i = 0; i < TOTAL / THREADS; ++i) {
        const int idx = tid + i * THREADS;
        const int r = (idx / (8 * CH)) * 8 + (idx & 7), col = ((idx >> 3) % CH) * 4;
        const bool ok = r < valid && col < d;
        tc_cp16(dst + idx * 16, ok ? src + r * stride + col : src, ok);
    }
}

template <int DP, int NWG, int BK, int MASK>
__device__ __forceinline__ void wg_forward(const AttnParams& p, float* smem) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using C = WgCfg<DP, NWG, BK>;
    constexpr int THREADS = C::THREADS, BM = C::BM, CH = DP / 4, NT = BK / 8, DT = DP / 8;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int g = lane >> 2, t = lane & 3;

    const int bh_count = p.b * p.hq;
    const int n_mblocks = (p.sq + BM - 1) / BM;
    const int bh = blockIdx.x % bh_count;
    const int m_block = n_mblocks - 1 - (int)(blockIdx.x / bh_count);
    const int b = bh / p.hq, h = bh % p.hq, kvh = h / p.group;
    const int m0 = m_block * BM, m_end = min(m0 + BM, p.sq);
    const int wrow0 = warp * 16;  // warp w of warpgroup w / 4 owns rows 16 w .. 16 w + 15 of the block

    float* sK = smem;
    float* sVs = smem + BK * DP;
    float* sVt = smem + 2 * BK * DP;
    const unsigned aK = tc_smem_addr(sK), aVs = tc_smem_addr(sVs), aVt = tc_smem_addr(sVt);

    const float* q = static_cast<const float*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1];
    const float* k = static_cast<const float*>(p.k) + b * p.k_stride[0] + kvh * p.k_stride[1];
    const float* v = static_cast<const float*>(p.v) + b * p.v_stride[0] + kvh * p.v_stride[1];

    int n_keys = p.sk;
    if (MASK == TC_MASK_CAUSAL) n_keys = max(0, min(p.sk, m_end + p.causal_offset));
    const int n_tiles = (n_keys + BK - 1) / BK;

    if (n_tiles > 0) wg_load<DP, BK, THREADS>(aK, k, p.k_stride[2], p.sk, p.d, tid);
    tc_commit();

    // Q fragments straight from global memory, rounded: rows g and g + 8 of this warp, columns t and t + 4
    // of every k8 step.
    unsigned qa[DP / 8][4];
    {
        const int r0 = m0 + wrow0 + g, r1 = r0 + 8;
        const float* q0 = q + (i64)min(r0, p.sq - 1) * p.q_stride[2];
        const float* q1 = q + (i64)min(r1, p.sq - 1) * p.q_stride[2];
        unsigned dummy;
#pragma unroll
        for (int kk = 0; kk < DP / 8; ++kk) {
            const int c0 = kk * 8 + t, c1 = c0 + 4;
            tc_split<false>(r0 < p.sq && c0 < p.d ? q0[c0] : 0.f, qa[kk][0], dummy);
            tc_split<false>(r1 < p.sq && c0 < p.d ? q1[c0] : 0.f, qa[kk][1], dummy);
            tc_split<false>(r0 < p.sq && c1 < p.d ? q0[c1] : 0.f, qa[kk][2], dummy);
            tc_split<false>(r1 < p.sq && c1 < p.d ? q1[c1] : 0.f, qa[kk][3], dummy);
        }
    }

    float o[DT * 4];
#pragma unroll
    for (int i = 0; i < DT * 4; ++i) o[i] = 0.f;
    float m[2] = {SDPA_NEG_INF, SDPA_NEG_INF}, l[2] = {0.f, 0.f};
    const float sl2 = p.scale_log2;

    for (int tile = 0; tile < n_tiles; ++tile) {
        const int n0 = tile * BK;
        // K[tile] landed (own chunks): round in place, publish to the async proxy, then to everyone.
        tc_wait_all();
#pragma unroll kWgUnroll
        for (int i = 0; i < BK * CH / THREADS; ++i) {
            const int idx = tid + i * THREADS;
            float4* ptr = reinterpret_cast<float4*>(sK) + idx;
            float4 x = *ptr;
            x.x = tc_big(x.x); x.y = tc_big(x.y); x.z = tc_big(x.z); x.w = tc_big(x.w);
            if (!WG_DIAG_NO_KROUND) *ptr = x;
        }
        wg_proxy_fence();
        __syncthreads();  // K[tile] visible; everyone done with Vᵀ and the V staging of the last tile
        wg_load<DP, BK, THREADS>(aVs, v + n0 * p.v_stride[2], p.v_stride[2], p.sk - n0, p.dv, tid);
        tc_commit();

        // S = Q Kᵀ
        float s[NT * 4];
#pragma unroll
        for (int i = 0; i < NT * 4; ++i) s[i] = 0.f;
        wg_pin(s);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < DP / 8; ++kk)
            wg_mma<BK>(s, qa[kk], wg_desc(aK + kk * 256, 128, CH * 128), kk > 0);
        wg_commit();
        wg_wait0();
        wg_pin(s);

        const bool edge = (n0 + BK > p.sk) || (MASK == TC_MASK_CAUSAL && n0 + BK - 1 > m0 + wrow0 + p.causal_offset) ||
                          MASK == TC_MASK_EXPLICIT;
        if (edge) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int row = m0 + wrow0 + g + hh * 8;
                const float* mrow = nullptr;
                if (MASK == TC_MASK_EXPLICIT) mrow = mask_row(p, b, h, min(row, p.sq - 1));
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int key = n0 + j * 8 + 2 * t + e;
                        float& x = s[j * 4 + hh * 2 + e];
                        bool vis = key < p.sk;
                        if (MASK == TC_MASK_CAUSAL) vis = vis && key <= row + p.causal_offset;
                        if (MASK == TC_MASK_EXPLICIT)
                            x = vis ? fmaf(mrow[key * p.mask_stride[3]], SDPA_LOG2E, x * sl2) : SDPA_NEG_INF;
                        else if (!vis)
                            x = SDPA_NEG_INF;
                    }
            }
        }
        float alpha[2];
        bool rescale = false;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            float mx = SDPA_NEG_INF;
#pragma unroll
            for (int j = 0; j < NT; ++j) mx = fmaxf(mx, fmaxf(s[j * 4 + hh * 2], s[j * 4 + hh * 2 + 1]));
            mx = tc_quad_max(mx);
            const float m_old = m[hh];
            const float m_new = fmaxf(m_old, MASK == TC_MASK_EXPLICIT ? mx : mx * sl2);
            const float m_use = m_new == SDPA_NEG_INF ? 0.f : m_new;
            const float a = tc_exp2(m_old - m_use);
            alpha[hh] = a;
            rescale |= a != 1.f;
            m[hh] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& x = s[j * 4 + hh * 2 + e];
                    x = MASK == TC_MASK_EXPLICIT ? tc_exp2(x - m_use) : tc_exp2(fmaf(x, sl2, -m_use));
                    sum += x;
                }
            l[hh] = l[hh] * a + sum;
        }
        if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
            for (int j = 0; j < DT; ++j) {
                o[j * 4 + 0] *= alpha[0];
                o[j * 4 + 1] *= alpha[0];
                o[j * 4 + 2] *= alpha[1];
                o[j * 4 + 3] *= alpha[1];
            }
        }
        // P rounded to TF32 in place.
#pragma unroll
        for (int i = 0; i < NT * 4; ++i) s[i] = tc_big(s[i]);

        // V[tile] landed (own chunks): round and transpose into Vᵀ. Element (key, d) goes to slot
        // sl = perm(key % 8) + 8 (key / 8), core matrix (d / 8, sl / 4), byte (d % 8) * 16 + (sl % 4) * 4.
        // The four components are stored in a lane-dependent order so that each store of a warp hits 32
        // distinct banks.
        tc_wait_all();
#pragma unroll kWgUnroll
        for (int i = 0; i < BK * CH / THREADS; ++i) {
            const int idx = tid + i * THREADS;
            const int r = (idx / (8 * CH)) * 8 + (idx & 7), c = (idx >> 3) % CH;
            const float4 x = reinterpret_cast<const float4*>(sVs)[idx];
            const int sl = ((r & 7) >> 1) + 4 * (r & 1) + (r & ~7);
            const int rot = 2 * ((c >> 1) & 1) + (r & 1);
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
                const int j = (jj + rot) & 3;
                const float val = j == 0 ? x.x : j == 1 ? x.y : j == 2 ? x.z : x.w;
                const int dd = 4 * c + j;
                if (!WG_DIAG_NO_VT) sVt[((dd >> 3) * (BK / 4) + (sl >> 2)) * 32 + (dd & 7) * 4 + (sl & 3)] = tc_big(val);
            }
        }
        wg_proxy_fence();
        __syncthreads();  // Vᵀ visible; everyone done reading K[tile]
        if (tile + 1 < n_tiles)
            wg_load<DP, BK, THREADS>(aK, k + (n0 + BK) * p.k_stride[2], p.k_stride[2], p.sk - n0 - BK, p.d, tid);
        tc_commit();

        // O += P Vᵀ
        wg_pin(o);
        wg_fence();
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            // k-step j takes keys j*8 + {2t, 2t+1} as k-indices t, t + 4: the S registers as they are.
            const unsigned pa[4] = {__float_as_uint(s[j * 4]), __float_as_uint(s[j * 4 + 2]),
                                    __float_as_uint(s[j * 4 + 1]), __float_as_uint(s[j * 4 + 3])};
            wg_mma<DP>(o, pa, wg_desc(aVt + j * 256, 128, BK * 32), 1);
        }
        wg_commit();
        wg_wait0();
        wg_pin(o);
    }

    float* out = static_cast<float*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
    const bool vec2 = (p.extra & 2) != 0;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const float lsum = tc_quad_sum(l[hh]);
        const float inv = lsum == 0.f ? 0.f : 1.f / lsum;
        const int row = m0 + wrow0 + g + hh * 8;
        if (row >= p.sq) continue;
        float* orow = out + row * p.o_stride[2];
#pragma unroll
        for (int j = 0; j < DT; ++j) {
            const int col = j * 8 + 2 * t;
            const float x0 = o[j * 4 + hh * 2] * inv, x1 = o[j * 4 + hh * 2 + 1] * inv;
            if (vec2 && col + 1 < p.dv) {
                *reinterpret_cast<float2*>(orow + col) = make_float2(x0, x1);
            } else {
                if (col < p.dv) orow[col] = x0;
                if (col + 1 < p.dv) orow[col + 1] = x1;
            }
        }
        if (p.lse != nullptr && t == 0)
            p.lse[((i64)b * p.hq + h) * p.sq + row] = lsum == 0.f ? SDPA_NEG_INF : (m[hh] + log2f(lsum)) * SDPA_LN2;
    }
#else
    __trap();  // wgmma needs sm_90a
#endif
}
