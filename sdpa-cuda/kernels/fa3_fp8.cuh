// FP8 (E4M3) for `fa3`: the element tag and traits fa3.cu switches on, the Vᵀ pre-pass (FA3_XO_VT_PREPASS), and
// (sm_90a only) V's transpose inside the kernel, the `wgmma` k32 products and the conversion of P to the A
// fragment. Handed to NVRTC as an in-memory header (src/sys/modules.rs HEADERS).
//
// What differs from f16/bf16 (src/kernels/fa3.rs plans it):
// - Q, K, V are E4M3 bytes with per-tensor descales: Q's and K's are folded into the softmax scale on the
//   host (scale_log2), V's into the final scale of O (Fa3Args::o_scale). O is bf16, LSE f32.
// - A 128-byte TMA box row holds 128 columns, so a k32 step reads the same 32 bytes of a swizzled row as a
//   k16 step of a 2-byte type: the descriptors of S = Q·Kᵀ are unchanged.
// - 8-bit `wgmma` takes both shared-memory operands K-major only. For O += P·V the reduction runs over keys,
//   so V must be stored [dv][keys]: the producer warpgroup transposes each V tile TMA staged as stored
//   (fa3_fp8_transpose_v; short calls), or `fa3_fp8_vt` writes Vᵀ into a workspace before the kernel (long
//   calls, the entries under FA3_XO_VT_PREPASS; the launcher counts it as part of the call); either way with
//   the keys of each group of 16 permuted (below), and zeros past Sk.
// - P leaves the softmax in the f32 accumulator layout (thread t of a quad holds keys 2t, 2t+1 and 8+2t, 9+2t
//   of each 16-key group, rows g and g+8), but an 8-bit A fragment wants keys 4t..4t+3 of the group per
//   register. Instead of shuffling P between threads, Vᵀ stores each group's keys in the order the
//   registers already hold them: position 4t+i of a group holds key 2t + (i & 1) + 8 (i >> 1). A sum over
//   keys does not care about their order, so P·V is unchanged.
#pragma once

// The E4M3 element of an `fa3` entry (one byte; the kernels never do arithmetic on it).
struct sdpa_e4m3 {
    unsigned char bits;
};

// Per element type: bytes, the k of one `wgmma` step, whether it is FP8, and the type of O.
template <typename T>
struct Fa3Elem {
    static constexpr bool FP8 = false;
    static constexpr int KSTEP = 16;
    using Out = T;
};
template <>
struct Fa3Elem<sdpa_e4m3> {
    static constexpr bool FP8 = true;
    static constexpr int KSTEP = 32;
    using Out = __nv_bfloat16;
};

// Key position within a 16-key group of Vᵀ -> the key stored there (see the top of this file).
__device__ __forceinline__ int fa3_fp8_key_of(int pos) { return 2 * (pos >> 2) + (pos & 1) + 8 * ((pos >> 1) & 1); }

// The pre-pass's parameter (src/kernels/fa3.rs `VtArgs`; for the entries under FA3_XO_VT_PREPASS).
struct Fa3VtArgs {
    const unsigned char* v;  // [B, Hkv, Sk, Dv] through v_stride (elements = bytes)
    unsigned char* vt;       // [B, Hkv, Dv, Sk_pad] contiguous
    long long v_stride[3];   // batch, head, key
    int hkv, sk, dv, sk_pad;
};
static_assert(sizeof(Fa3VtArgs) == 56, "Fa3VtArgs must match src/kernels/fa3.rs");

// Block of THREADS = 256 threads per (64 keys, 64 columns, b·hkv): 16-byte loads of V rows into shared memory, then
// 16-byte stores of 16 permuted keys of one Vᵀ row. Keys past Sk (up to Sk_pad) are written as zeros, so a
// masked P of 0 never meets garbage. Dv and the strides are multiples of 16 bytes (the launcher checks).
#define FA3_FP8_VT_ENTRY(NAME, THREADS)                                                                      \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(const Fa3VtArgs a) {                          \
        static_assert(THREADS == 256, "one 16-byte load and one 16-byte store per thread of a 64 x 64 tile"); \
        __shared__ unsigned char tile[64][64 + 16];                                                          \
        const int j0 = blockIdx.x * 64, c0 = blockIdx.y * 64, bh = blockIdx.z;                               \
        const int b = bh / a.hkv, h = bh % a.hkv;                                                            \
        const int tid = threadIdx.x;                                                                         \
        {                                                                                                    \
            const int r = tid / 4, c = c0 + 16 * (tid % 4), j = j0 + r;                                      \
            uint4 x = make_uint4(0, 0, 0, 0);                                                                \
            if (j < a.sk && c < a.dv)                                                                        \
                x = *reinterpret_cast<const uint4*>(a.v + b * a.v_stride[0] + h * a.v_stride[1] +            \
                                                    (long long)j * a.v_stride[2] + c);                       \
            *reinterpret_cast<uint4*>(&tile[r][16 * (tid % 4)]) = x;                                         \
        }                                                                                                    \
        __syncthreads();                                                                                     \
        {                                                                                                    \
            const int dc = tid / 4, grp = tid % 4, c = c0 + dc, j = j0 + 16 * grp;                           \
            if (c < a.dv && j < a.sk_pad) {                                                                  \
                unsigned w[4];                                                                               \
                _Pragma("unroll") for (int q = 0; q < 4; ++q) {                                              \
                    unsigned x = 0;                                                                          \
                    _Pragma("unroll") for (int e = 0; e < 4; ++e) x |=                                       \
                        (unsigned)tile[16 * grp + fa3_fp8_key_of(4 * q + e)][dc] << (8 * e);                 \
                    w[q] = x;                                                                                \
                }                                                                                            \
                *reinterpret_cast<uint4*>(a.vt + ((long long)bh * a.dv + c) * a.sk_pad + j) =                \
                    make_uint4(w[0], w[1], w[2], w[3]);                                                      \
            }                                                                                                \
        }                                                                                                    \
    }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "fa3_wgmma.cuh"

// Four f32 values rounded to E4M3 (round to nearest even, saturating to ±448, NaN kept), x0 in the low byte.
__device__ __forceinline__ unsigned fa3_fp8_pack4(float x0, float x1, float x2, float x3) {
    unsigned short lo, hi;
    // cvt ...e4m3x2.f32 d, a, b puts a in the upper byte and b in the lower one.
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(x1), "f"(x0));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(x3), "f"(x2));
    return (unsigned)lo | ((unsigned)hi << 16);
}

// P (the f32 accumulator layout of S: n8 tile j, row half hh, element e at s[4j + 2hh + e]) as the A fragments
// of the k32 steps of P·V. Register r of step kk: 16-key group 2kk + r / 2, row half r % 2, keys in the order
// fa3_fp8_key_of stores them (2t, 2t+1, 8+2t, 9+2t).
template <int KT, int NS>
__device__ __forceinline__ void fa3_fp8_take_p(unsigned (&pa)[KT][4], const float (&s)[NS]) {
    static_assert(NS == 16 * KT, "four n8 tiles per k32 step");
#pragma unroll
    for (int kk = 0; kk < KT; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int base = 8 * (2 * kk + r / 2) + 2 * (r % 2);
            pa[kk][r] = fa3_fp8_pack4(s[base], s[base + 1], s[base + 4], s[base + 5]);
        }
}

// S (m64 x n128, f32) = A (m64 x k32, descriptor, K-major) * B (k32 x n128, descriptor, K-major), E4M3;
// scale_d = 0 starts from zero. (8-bit operands have no transpose bits: both are K-major.)
__device__ __forceinline__ void fa3_ss(float (&d)[64], unsigned long long a, unsigned long long b, int scale_d, sdpa_e4m3) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "%64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a), "l"(b), "r"(scale_d));
}
// O (m64 x n64, f32) += A (m64 x k32, registers: P) * B (k32 x n64, descriptor, K-major: Vᵀ), E4M3.
__device__ __forceinline__ void fa3_rs(float (&d)[32], const unsigned (&a)[4], unsigned long long b, sdpa_e4m3) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "{%32,%33,%34,%35}, %36, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
// O (m64 x n128, f32) += A (m64 x k32, registers: P) * B (k32 x n128, descriptor, K-major: Vᵀ), E4M3.
__device__ __forceinline__ void fa3_rs(float (&d)[64], const unsigned (&a)[4], unsigned long long b, sdpa_e4m3) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "{%64,%65,%66,%67}, %68, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
// O (m64 x n256, f32) += A (m64 x k32, registers: P) * B (k32 x n256, descriptor, K-major: Vᵀ), E4M3.
__device__ __forceinline__ void fa3_rs(float (&d)[128], const unsigned (&a)[4], unsigned long long b, sdpa_e4m3) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
        "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
        "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
        "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
        "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
        "{%128,%129,%130,%131}, %132, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
          "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
          "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
          "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// O (64 x DV) += P·Vᵀ over the BN keys of one tile: k32 step kk reads bytes 32kk.. of the 128-byte Vᵀ rows
// (DV rows of BN = 128 keys, the swizzled layout TMA writes; groups of 8 rows 1024 bytes apart) whose K-major
// descriptor low word is `vt_lo` (fa3_desc_lo_k; 32 bytes are 2 in it).
template <int DV, int KT>
__device__ __forceinline__ void fa3_fp8_pv(float (&o)[DV / 2], const unsigned (&pa)[KT][4], unsigned vt_lo) {
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) fa3_rs(o, pa[kk], fa3_desc(vt_lo + 2 * kk), sdpa_e4m3());
}

// ---- Vᵀ inside the kernel (short FP8 calls; long ones read the pre-pass's, FA3_XO_VT_PREPASS) ----
// TMA stages a V tile as stored, [BN = 128 keys][128-column boxes] in the 128-byte swizzle (16-byte chunk c of key
// row k at chunk c ^ (k % 8), boxes BN·128 bytes apart), and the producer warpgroup's three warps that do not
// issue copies write it into the Vᵀ slot in the layout the pre-pass's tiles had: DV rows of 128 bytes (keys
// permuted within each 16-key group as fa3_fp8_key_of says), 16-byte chunk g of row d at g ^ (d % 8).
//
// One unit is 16 keys (group g) x 32 columns (d0 = 32 db) of a tile: one ldmatrix.x4.trans of 16-bit pairs, four
// byte permutes, one stmatrix.x4. Matrix m of the load (lanes 8m.. give its row addresses) is keys 8 (m & 1)..
// of the group at columns d0 + 16 (m >> 1)..; transposed, lane t (q = t % 4, c = t / 4) gets from it keys 2q and
// 2q + 1 at columns 2c and 2c + 1 of that half, as bytes [k2q c2c, k2q c2c+1, k2q+1 c2c, k2q+1 c2c+1]. Vᵀ row
// d0 + 2c (+ 1) wants at word q of the group keys 2q, 2q + 1, 2q + 8, 2q + 9 (fa3_fp8_key_of): bytes 0 and 2
// (1 and 3) of matrices 0 and 1, one prmt. The store's matrix j takes each lane's word for row 8 (j >> 1) · 2 +
// 2c + e, with e = (c >> 2) ^ (j & 1) choosing the even or odd row: the eight rows one matrix writes then differ
// in d % 8, so their chunks (g ^ (d % 8)) cover every bank once, as do the load's eight keys (k % 8 = row).
__device__ __forceinline__ void fa3_ldsm_x4_trans(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}
__device__ __forceinline__ unsigned fa3_prmt(unsigned a, unsigned b, unsigned sel) {
    unsigned d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

// Vᵀ of one staged V tile (at `staged`) into a Vᵀ slot (at `vt`) by warp `w` of `nw`, lane `lane`: the units of the
// first `cols` columns (a multiple of 32 within the boxes TMA loaded; later rows of the slot are left as they are,
// their O columns are never stored). BN = 128 keys. A warp takes four groups of one 32-column block at a time: within
// them only the group changes, which moves the load by 2048 bytes and the store's chunk by an xor, so each unit
// costs its load, four permutes, its store and an address (28 instructions per unit when every unit computed its
// own from u; sessions 22's SASS count).
__device__ __forceinline__ void fa3_fp8_transpose_v(unsigned vt, unsigned staged, int cols, int w, int nw, int lane) {
    const int m = lane >> 3, r = lane & 7, c = lane >> 2;
    // Load: key row 8 (m & 1) + r of the group, chunk 2 (db & 3) + (m >> 1) of box db >> 2, swizzled by r.
    const unsigned ld_lane = staged + (8 * (m & 1) + r) * 128;
    // Store: Vᵀ row 16 (m >> 1) + 2r + e of the block, e as above with j = m.
    const int row = 16 * (m >> 1) + 2 * r + (((r >> 2) ^ m) & 1);
    const unsigned lo = 0x6420u, hi = 0x7531u;  // bytes 0, 2 (even row) or 1, 3 (odd row) of two loads
    const unsigned sa = (c >> 2) ? hi : lo, sb = (c >> 2) ? lo : hi;
    for (int hb = w; hb < cols / 16; hb += nw) {  // half-blocks: groups 4 (hb & 1).. of block hb >> 1
        const int db = hb >> 1, g0 = 4 * (hb & 1);
        const unsigned ld = ld_lane + (db >> 2) * (128 * 128) + g0 * 2048 + (((2 * (db & 3) + (m >> 1)) ^ r) << 4);
        const int d = 32 * db + row;
        const unsigned st = vt + d * 128;
        const int chunk = g0 ^ (d & 7);  // the store's chunk of group g0 (+ gi: g0 + gi = g0 ^ gi)
#pragma unroll
        for (int gi = 0; gi < 4; ++gi) {
            unsigned x[4];
            fa3_ldsm_x4_trans(x, ld + gi * 2048);
            const unsigned y[4] = {fa3_prmt(x[0], x[1], sa), fa3_prmt(x[0], x[1], sb), fa3_prmt(x[2], x[3], sa),
                                   fa3_prmt(x[2], x[3], sb)};
            fa3_stmatrix_x4(st + ((chunk ^ gi) << 4), y);  // fa3_wgmma.cuh
        }
    }
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
