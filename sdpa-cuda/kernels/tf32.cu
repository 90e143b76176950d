// f32 attention on tensor cores: TF32 (`tf32_f32_*`) and split TF32 (`tf32x3_f32_*`).
//
// FlashAttention-2 work split: one block per (query tile of BM rows, query head, batch); NW warps each own
// MT whole m16 row tiles, so the online softmax of a row stays inside one quad of threads. Both products
// use `mma.sync.m16n8k8` with TF32 operands and f32 accumulation.
//
// Operands. TF32 keeps 11 significant bits; the tensor cores ignore the low 13 bits of an f32 pattern,
// which would truncate. Every operand is first rounded to the nearest TF32 value (Veltkamp split, three
// f32 operations that keep NaN a NaN). Split TF32 writes each f32 operand as big + small (big = nearest
// TF32, small = x - big, exact in f32 and within one bit of TF32) and sums small·big + big·small +
// big·big; the dropped small·small term is ~2^-22 relative.
//
// Accuracy of split TF32. The tensor cores' own f32 accumulation does not round to nearest: chaining
// every k-step of a long sum through the mma accumulator loses a fraction of an ulp per step, always in
// the same direction, so the error grows with the number of keys (2.9e-5 at S = 4096 before this
// layout). Here each group of three products starts from a zero accumulator (a sum of 8 exact products,
// rounded once) and is added to the running sum with an ordinary f32 add, which rounds to nearest: the
// error then behaves like a plain f32 dot product of length D / 8 (scores) or Sk / 8 (P·V).
//
// Data movement: K and V tiles go global -> shared with 16-byte cp.async (STAGES = 2: the next tile loads
// while this one is computed, one barrier per tile; STAGES = 1: FlashAttention-2's order, V[t] during
// Q·Kᵀ and K[t+1] during softmax and P·V, two barriers per tile). Q is loaded once per block (cp.async,
// overlapping the first K/V tile), rounded (and split) once in place, and kept in shared memory. Fragments of Q and K come from `ldmatrix.b16` on 32-bit data:
// each 8x8 b16 matrix is 8 rows x 4 floats, exactly the m16n8k8 TF32 A/B fragment layout.
//
// P stays in registers: the S accumulator of an 8-key tile holds keys 2t and 2t+1 in thread t of a quad;
// the A fragment of P·V wants k-indices t and t+4. Taking k-index t <-> key 2t and t+4 <-> key 2t+1 makes
// the S registers the A fragment as they are; the B fragment then reads V rows 2t and 2t+1 (scalar
// shared loads). Rows are padded to DP + 4 floats: an odd number of 16-byte chunks (ldmatrix phases hit 8
// distinct bank groups) and 2·LD ≡ 8 (mod 32) banks, so the 32 V reads of a warp hit 32 distinct banks.
//
// Head dims are padded to DP (16, 32, 64, 128 or 256) with zeros, so any D = Dv up to 256 runs. Causal
// tiles wholly above the diagonal are never loaded; a warp skips the loaded tiles wholly above its own rows;
// only tiles that cross a warp's part of the diagonal (or the end of the keys, or any tile under an explicit
// mask) run mask code. Softmax runs in log2 units (exp2, scale folded in).
#include "tf32_ops.cuh"
// Causal key tiles skipped per warp (1) or per block only (0; kept for A/B timing in dev/tf32_host.cu).
#ifndef TC_WARP_SKIP
#define TC_WARP_SKIP 1
#endif

// Tile configuration: DP padded head dim, MT m16 tiles per warp, NW warps, BK keys per tile, STAGES K/V
// buffers, SPLIT split TF32 (Q stored as big and small halves), PRE K and V rounded (split) once per block
// in shared memory, each thread converting the chunks it copied, instead of by every warp at each use.
template <int DP, int MT, int NW, int BK, int STAGES, bool SPLIT, bool PRE>
struct TcCfg {
    static constexpr int BM = 16 * MT * NW;
    static constexpr int LD = DP + 4;
    static constexpr int NT = BK / 8;  // n8 tiles of S per m16 tile
    static constexpr int DT = DP / 8;  // n8 tiles of O per m16 tile
    static constexpr int Q_FLOATS = (SPLIT ? 2 : 1) * BM * LD;
    static constexpr int KV_FLOATS = BK * LD;
    // K and V buffers: STAGES each, plus as many for their small halves when PRE and SPLIT.
    static constexpr int KV_BUFS = (PRE && SPLIT ? 2 : 1) * STAGES;
    static constexpr int SMEM_BYTES = 4 * (Q_FLOATS + 2 * KV_BUFS * KV_FLOATS);
    static_assert(DP % 16 == 0 && BK % 16 == 0, "k8 steps in pairs");
    static_assert(STAGES == 1 || STAGES == 2, "one or two K/V buffers");
};

// D += A·B, one m16n8k8 TF32 tile.
__device__ __forceinline__ void tc_mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// D = A·B (zero accumulator).
__device__ __forceinline__ void tc_mma0(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}
// acc += A·B in the chosen precision. Split: the three products of one k8 step start from zero and are
// added to `acc` with round-to-nearest f32 adds (see the file comment).
template <bool SPLIT>
__device__ __forceinline__ void tc_mma_acc(float (&acc)[4], const unsigned (&ab)[4], const unsigned (&as)[4],
                                           unsigned bb0, unsigned bb1, unsigned bs0, unsigned bs1) {
    if (!SPLIT) {
        tc_mma(acc, ab, bb0, bb1);
    } else {
        float t[4];
        tc_mma0(t, as, bb0, bb1);
        tc_mma(t, ab, bs0, bs1);
        tc_mma(t, ab, bb0, bb1);
        acc[0] += t[0];
        acc[1] += t[1];
        acc[2] += t[2];
        acc[3] += t[3];
    }
}

// Rows [0, ROWS) of a [ROWS][DP] f32 tile into shared memory (LD-float rows at `dst`), zeros at or past
// `valid` rows and past column d. 16-byte cp.async (caller checked d % 4 == 0 and 16-byte alignment).
template <int DP, int LD, int ROWS, int THREADS>
__device__ __forceinline__ void tc_load_async(unsigned dst, const float* src, i64 stride, int valid, int d, int tid) {
    constexpr int CH = DP / 4;
    constexpr int TOTAL = ROWS * CH;
#pragma unroll
    for (int i = 0; i < (TOTAL + THREADS - 1) / THREADS; ++i) {
        const int c = tid + i * THREADS;
        if (TOTAL % THREADS == 0 || c < TOTAL) {
            const int r = c / CH, col = (c % CH) * 4;
            const bool ok = r < valid && col < d;
            tc_cp16(dst + (r * LD + col) * 4, ok ? src + r * stride + col : src, ok);
        }
    }
}
// The same with scalar loads and stores, for any D and alignment; with PRE the values are stored already
// rounded (big at dst, small at dst_small for SPLIT).
template <int DP, int LD, int ROWS, int THREADS, bool SPLIT, bool PRE>
__device__ __forceinline__ void tc_load_sync(float* dst, float* dst_small, const float* src, i64 stride, int valid,
                                             int d, int tid) {
    for (int c = tid; c < ROWS * DP; c += THREADS) {
        const int r = c / DP, col = c % DP;
        const float x = (r < valid && col < d) ? src[r * stride + col] : 0.f;
        if (PRE) {
            unsigned hi, lo;
            tc_split<SPLIT>(x, hi, lo);
            dst[r * LD + col] = __uint_as_float(hi);
            if (SPLIT) dst_small[r * LD + col] = __uint_as_float(lo);
        } else {
            dst[r * LD + col] = x;
        }
    }
}
template <int DP, int LD, int ROWS, int THREADS, bool SPLIT, bool PRE>
__device__ __forceinline__ void tc_load(float* dst, float* dst_small, const float* src, i64 stride, int valid, int d,
                                        int tid, bool vec) {
    if (vec)
        tc_load_async<DP, LD, ROWS, THREADS>(smem_addr(dst), src, stride, valid, d, tid);
    else
        tc_load_sync<DP, LD, ROWS, THREADS, SPLIT, PRE>(dst, dst_small, src, stride, valid, d, tid);
}
// PRE, 16-byte path: once this thread's cp.async copies have landed (wait_group), it rounds (splits) the
// same chunks in place (small halves to dst_small). Only its own chunks: no barrier needed before. All loads
// are issued before the first store, so that their latencies overlap (the compiler keeps a store ahead of a
// later load it cannot prove distinct; the wgmma producer lost 10-15 % to that order, bench/results/gpu/tf32.md).
template <int DP, int LD, int ROWS, int THREADS, bool SPLIT, bool PRE>
__device__ __forceinline__ void tc_round_own(float* dst, float* dst_small, int tid, bool vec) {
    if (!PRE || !vec) return;
    constexpr int CH = DP / 4;
    constexpr int TOTAL = ROWS * CH;
    constexpr int N = (TOTAL + THREADS - 1) / THREADS;
    float4 x[N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const int c = tid + i * THREADS;
        if (TOTAL % THREADS == 0 || c < TOTAL) x[i] = *reinterpret_cast<const float4*>(dst + (c / CH) * LD + (c % CH) * 4);
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
        const int c = tid + i * THREADS;
        if (TOTAL % THREADS == 0 || c < TOTAL) {
            const int off = (c / CH) * LD + (c % CH) * 4;
            unsigned hi[4], lo[4];
            tc_split<SPLIT>(x[i].x, hi[0], lo[0]);
            tc_split<SPLIT>(x[i].y, hi[1], lo[1]);
            tc_split<SPLIT>(x[i].z, hi[2], lo[2]);
            tc_split<SPLIT>(x[i].w, hi[3], lo[3]);
            *reinterpret_cast<uint4*>(dst + off) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
            if (SPLIT) *reinterpret_cast<uint4*>(dst_small + off) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        }
    }
}

// params.extra: bit 0 = 16-byte loads allowed (D % 4 == 0, Q/K/V and their strides 16-byte aligned);
// bit 1 = 8-byte output stores allowed (Dv even, O and its strides 8-byte aligned).
template <int DP, int MT, int NW, int BK, int STAGES, bool SPLIT, bool PRE, int MASK>
__device__ __forceinline__ void tc_forward(const AttnParams& p, float* smem) {
    using C = TcCfg<DP, MT, NW, BK, STAGES, SPLIT, PRE>;
    constexpr int LD = C::LD, NT = C::NT, DT = C::DT, BM = C::BM, THREADS = NW * 32;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane >> 2, t = lane & 3;
    const bool vec = (p.extra & 1) != 0;

    // Block -> (batch, head, query tile); the last query tiles (the most keys under a causal mask) first.
    const int bh_count = p.b * p.hq;
    const int n_mblocks = (p.sq + BM - 1) / BM;
    const int bh = blockIdx.x % bh_count;
    const int m_block = n_mblocks - 1 - (int)(blockIdx.x / bh_count);
    const int b = bh / p.hq, h = bh % p.hq, kvh = h / p.group;
    const int m0 = m_block * BM, m_end = min(m0 + BM, p.sq);
    const int wrow0 = warp * 16 * MT;

    // Shared memory: Q big [BM][LD] (+ Q small [BM][LD]), then STAGES x K [BK][LD] (+ their small halves),
    // STAGES x V [BK][LD] (+ small halves). KS/VS: offset of a small half from its big half, floats.
    constexpr int KS = (PRE && SPLIT) ? STAGES * C::KV_FLOATS : 0;
    float* sQ = smem;
    float* sK = sQ + C::Q_FLOATS;
    float* sV = sK + (PRE && SPLIT ? 2 : 1) * STAGES * C::KV_FLOATS;

    const float* q = static_cast<const float*>(p.q) + b * p.q_stride[0] + h * p.q_stride[1] + m0 * p.q_stride[2];
    const float* k = static_cast<const float*>(p.k) + b * p.k_stride[0] + kvh * p.k_stride[1];
    const float* v = static_cast<const float*>(p.v) + b * p.v_stride[0] + kvh * p.v_stride[1];

    int n_keys = p.sk;
    if (MASK == TC_MASK_CAUSAL) n_keys = max(0, min(p.sk, m_end + p.causal_offset));
    const int n_tiles = (n_keys + BK - 1) / BK;

    // Q first (a cp.async group of its own), then the first K (and V) tile. Q is rounded (and split) in
    // place once per block as soon as it has landed, while K/V are still in flight; each thread converts
    // the chunks it copied, and the first barrier of the loop publishes them.
    tc_load<DP, LD, BM, THREADS, SPLIT, true>(sQ, sQ + BM * LD, q, p.q_stride[2], m_end - m0, p.d, tid, vec);
    tc_commit();
    if (n_tiles > 0) {
        tc_load<DP, LD, BK, THREADS, SPLIT, PRE>(sK, sK + KS, k, p.k_stride[2], p.sk, p.d, tid, vec);
        if (STAGES == 2) tc_load<DP, LD, BK, THREADS, SPLIT, PRE>(sV, sV + KS, v, p.v_stride[2], p.sk, p.dv, tid, vec);
    }
    tc_commit();
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    tc_round_own<DP, LD, BM, THREADS, SPLIT, true>(sQ, sQ + BM * LD, tid, vec);

    // Per-lane fragment addresses. Q (A, 16x8): matrices rows 0-7 / 8-15 x columns 0-3 / 4-7, in the
    // register order a0..a3. K (B of two n8 tiles): keys 0-7 columns 0-3, keys 0-7 columns 4-7, keys 8-15
    // columns 0-3, keys 8-15 columns 4-7. V: rows 2t and 2t+1, column g of each n8 tile.
    const unsigned q_ld = smem_addr(sQ) + ((wrow0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 4) * 4;
    const unsigned k_ld = smem_addr(sK) + (((lane & 7) + ((lane >> 4) & 1) * 8) * LD + ((lane >> 3) & 1) * 4) * 4;
    const float* v_rd = sV + 2 * t * LD + g;

    float o[MT][DT][4];
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int j = 0; j < DT; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
        m[mt][0] = m[mt][1] = SDPA_NEG_INF;
        l[mt][0] = l[mt][1] = 0.f;
    }
    const float sl2 = p.scale_log2;

    for (int tile = 0; tile < n_tiles; ++tile) {
        const int n0 = tile * BK;
        const int buf = STAGES == 2 ? (tile & 1) : 0;
        tc_wait_all();
        tc_round_own<DP, LD, BK, THREADS, SPLIT, PRE>(sK + buf * C::KV_FLOATS, sK + KS + buf * C::KV_FLOATS, tid, vec);
        if (STAGES == 2)
            tc_round_own<DP, LD, BK, THREADS, SPLIT, PRE>(sV + buf * C::KV_FLOATS, sV + KS + buf * C::KV_FLOATS, tid,
                                                          vec);
        __syncthreads();  // this tile's K (and V) and Q are visible; everyone is done with the last tile
        if (STAGES == 1) {
            tc_load<DP, LD, BK, THREADS, SPLIT, PRE>(sV, sV + KS, v + n0 * p.v_stride[2], p.v_stride[2], p.sk - n0,
                                                     p.dv, tid, vec);
        } else if (tile + 1 < n_tiles) {
            const int n1 = n0 + BK, nb = (tile + 1) & 1;
            tc_load<DP, LD, BK, THREADS, SPLIT, PRE>(sK + nb * C::KV_FLOATS, sK + KS + nb * C::KV_FLOATS,
                                                     k + n1 * p.k_stride[2], p.k_stride[2], p.sk - n1, p.d, tid, vec);
            tc_load<DP, LD, BK, THREADS, SPLIT, PRE>(sV + nb * C::KV_FLOATS, sV + KS + nb * C::KV_FLOATS,
                                                     v + n1 * p.v_stride[2], p.v_stride[2], p.sk - n1, p.dv, tid, vec);
        }
        tc_commit();

        // Causal: a tile whose first key lies past the last row of this warp is wholly masked for it; the warp
        // skips its products and softmax (it still loads and meets the barriers with the block).
        const bool active =
            MASK != TC_MASK_CAUSAL || !TC_WARP_SKIP || n0 <= m0 + wrow0 + 16 * MT - 1 + p.causal_offset;

        // S = Q Kᵀ for this warp's rows.
        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int j = 0; j < NT; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
        const unsigned kb_ld = k_ld + buf * C::KV_FLOATS * 4;
        if (active) {
#pragma unroll
            for (int kk = 0; kk < DP / 8; ++kk) {
                unsigned qa[MT][4], qs[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    tc_ldsm4(qa[mt], q_ld + (mt * 16 * LD + kk * 8) * 4);
                    if (SPLIT) tc_ldsm4(qs[mt], q_ld + (BM * LD + mt * 16 * LD + kk * 8) * 4);
                }
#pragma unroll
                for (int np = 0; np < NT / 2; ++np) {
                    unsigned kb[4], ks[4];
                    if (PRE) {
                        tc_ldsm4(kb, kb_ld + (np * 16 * LD + kk * 8) * 4);
                        if (SPLIT) tc_ldsm4(ks, kb_ld + (KS + np * 16 * LD + kk * 8) * 4);
                    } else {
                        unsigned kr[4];
                        tc_ldsm4(kr, kb_ld + (np * 16 * LD + kk * 8) * 4);
#pragma unroll
                        for (int e = 0; e < 4; ++e) tc_split<SPLIT>(__uint_as_float(kr[e]), kb[e], ks[e]);
                    }
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        tc_mma_acc<SPLIT>(s[mt][2 * np], qa[mt], qs[mt], kb[0], kb[1], ks[0], ks[1]);
                        tc_mma_acc<SPLIT>(s[mt][2 * np + 1], qa[mt], qs[mt], kb[2], kb[3], ks[2], ks[3]);
                    }
                }
            }
        }

        if (STAGES == 1) {
            tc_wait_all();
            tc_round_own<DP, LD, BK, THREADS, SPLIT, PRE>(sV, sV + KS, tid, vec);
            __syncthreads();  // V[tile] landed; everyone is done reading K[tile]
            if (tile + 1 < n_tiles) {
                const int n1 = n0 + BK;
                tc_load<DP, LD, BK, THREADS, SPLIT, PRE>(sK, sK + KS, k + n1 * p.k_stride[2], p.k_stride[2], p.sk - n1,
                                                         p.d, tid, vec);
            }
            tc_commit();
        }

        // Mask (edge tiles only). Explicit masks scale the scores here (log2 units); otherwise the scale is
        // folded into the exp2 argument below.
        if (!active) continue;
        const bool edge = (n0 + BK > p.sk) ||
                          (MASK == TC_MASK_CAUSAL && n0 + BK - 1 > m0 + (TC_WARP_SKIP ? wrow0 : 0) + p.causal_offset) ||
                          MASK == TC_MASK_EXPLICIT;
        if (edge) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const int row = m0 + wrow0 + mt * 16 + g + hh * 8;
                    const float* mrow = nullptr;
                    if (MASK == TC_MASK_EXPLICIT) mrow = mask_row(p, b, h, min(row, p.sq - 1));
#pragma unroll
                    for (int j = 0; j < NT; ++j)
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int key = n0 + j * 8 + 2 * t + e;
                            float& x = s[mt][j][hh * 2 + e];
                            bool vis = key < p.sk;
                            if (MASK == TC_MASK_CAUSAL) vis = vis && key <= row + p.causal_offset;
                            if (MASK == TC_MASK_EXPLICIT)
                                x = vis ? fmaf(mrow[key * p.mask_stride[3]], SDPA_LOG2E, x * sl2) : SDPA_NEG_INF;
                            else if (!vis)
                                x = SDPA_NEG_INF;
                        }
                }
        }

        // Online softmax. A row that has seen only masked keys keeps m = -inf and subtracts 0, so exp2 gives 0.
        // O is rescaled only when some row of the warp changed its maximum (after the first tiles, rarely).
        float alpha[MT][2];
        bool rescale = false;
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                float mx = SDPA_NEG_INF;
#pragma unroll
                for (int j = 0; j < NT; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][hh * 2], s[mt][j][hh * 2 + 1]));
                mx = quad_max(mx);
                const float m_old = m[mt][hh];
                const float m_new = fmaxf(m_old, MASK == TC_MASK_EXPLICIT ? mx : mx * sl2);
                const float m_use = m_new == SDPA_NEG_INF ? 0.f : m_new;
                const float a = fast_exp2(m_old - m_use);
                alpha[mt][hh] = a;
                rescale |= a != 1.f;
                m[mt][hh] = m_new;
                float sum = 0.f;
#pragma unroll
                for (int j = 0; j < NT; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        float& x = s[mt][j][hh * 2 + e];
                        x = MASK == TC_MASK_EXPLICIT ? fast_exp2(x - m_use) : fast_exp2(fmaf(x, sl2, -m_use));
                        sum += x;
                    }
                l[mt][hh] = l[mt][hh] * a + sum;  // per-thread partial; the quad is summed at the end
            }
        if (__any_sync(0xffffffffu, rescale)) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int j = 0; j < DT; ++j) {
                    o[mt][j][0] *= alpha[mt][0];
                    o[mt][j][1] *= alpha[mt][0];
                    o[mt][j][2] *= alpha[mt][1];
                    o[mt][j][3] *= alpha[mt][1];
                }
        }

        // O += P V with P from registers: k-step kk is S tile kk, k-index t <-> key 2t, t+4 <-> key 2t+1.
        const float* vb = v_rd + buf * C::KV_FLOATS;
#pragma unroll
        for (int kk = 0; kk < NT; ++kk) {
            unsigned pa[MT][4], ps[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                tc_split<SPLIT>(s[mt][kk][0], pa[mt][0], ps[mt][0]);
                tc_split<SPLIT>(s[mt][kk][2], pa[mt][1], ps[mt][1]);
                tc_split<SPLIT>(s[mt][kk][1], pa[mt][2], ps[mt][2]);
                tc_split<SPLIT>(s[mt][kk][3], pa[mt][3], ps[mt][3]);
            }
#pragma unroll
            for (int n = 0; n < DT; ++n) {
                unsigned vbig[2], vsmall[2];
                if (PRE) {
                    vbig[0] = __float_as_uint(vb[kk * 8 * LD + n * 8]);
                    vbig[1] = __float_as_uint(vb[(kk * 8 + 1) * LD + n * 8]);
                    if (SPLIT) {
                        vsmall[0] = __float_as_uint(vb[KS + kk * 8 * LD + n * 8]);
                        vsmall[1] = __float_as_uint(vb[KS + (kk * 8 + 1) * LD + n * 8]);
                    }
                } else {
                    tc_split<SPLIT>(vb[kk * 8 * LD + n * 8], vbig[0], vsmall[0]);
                    tc_split<SPLIT>(vb[(kk * 8 + 1) * LD + n * 8], vbig[1], vsmall[1]);
                }
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
                    tc_mma_acc<SPLIT>(o[mt][n], pa[mt], ps[mt], vbig[0], vbig[1], vsmall[0], vsmall[1]);
            }
        }
    }

    // Epilogue: normalise and store straight from the accumulators (rows g and g+8, columns 2t, 2t+1).
    float* out = static_cast<float*>(p.o) + b * p.o_stride[0] + h * p.o_stride[1];
    const bool vec2 = (p.extra & 2) != 0;
    bool bad = false;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const float lsum = quad_sum(l[mt][hh]);
            // NaN stays NaN (NaN == 0 is false); a row that saw no key is zeros with LSE -inf.
            const float inv = lsum == 0.f ? 0.f : 1.f / lsum;
            const int row = m0 + wrow0 + mt * 16 + g + hh * 8;
            if (row >= p.sq) continue;
            float* orow = out + row * p.o_stride[2];
#pragma unroll
            for (int j = 0; j < DT; ++j) {
                const int col = j * 8 + 2 * t;
                const float x0 = o[mt][j][hh * 2] * inv, x1 = o[mt][j][hh * 2 + 1] * inv;
                bad |= (col < p.dv && !isfinite(x0)) || (col + 1 < p.dv && !isfinite(x1));
                if (vec2 && col + 1 < p.dv) {
                    *reinterpret_cast<float2*>(orow + col) = make_float2(x0, x1);
                } else {
                    if (col < p.dv) orow[col] = x0;
                    if (col + 1 < p.dv) orow[col + 1] = x1;
                }
            }
            if (p.lse != nullptr && t == 0)
                p.lse[((i64)b * p.hq + h) * p.sq + row] =
                    lsum == 0.f ? SDPA_NEG_INF : (m[mt][hh] + log2f(lsum)) * SDPA_LN2;
        }
    // NaN or inf under a masked key must not reach rows that do not see it (common.cuh).
    repair_nonfinite_rows<float>(p, b, h, m0, SDPA_ONE_HEAD, m_end - m0, 0, p.dv, true, bad);
}

// Entry points {tf32|tf32x3}_f32_{DP}[s]_{none|causal|explicit}: padded head dim DP, MT m16 tiles per warp,
// NW warps, BK keys, K/V stages, split TF32 or not, per-block K/V rounding, mask. One entry per NVRTC
// program: src/kernels/tf32.rs (`tile_for`, `small_tile_for`: tiles chosen by measurement on the H100 with
// dev/tf32_bench.py, see bench/results/gpu/tf32.md) writes the line a call needs.
#define TC_ENTRY(NAME, DP, MT, NW, BK, ST, SPLIT, PRE, MASK)                                          \
    extern "C" __global__ void __launch_bounds__(NW * 32) NAME(const AttnParams p) {                \
        extern __shared__ __align__(16) float tc_smem[];                                             \
        tc_forward<DP, MT, NW, BK, ST, SPLIT, PRE, MASK>(p, tc_smem);                                \
    }
