//! Key and value blocks in the B-operand layout of `TDPBF16PS` (VNNI: each 32-bit element holds a pair
//! of bf16 along the reduction dimension, low half first).
//!
//! - Q·Kᵀ reduces over the head dim, so K's block becomes `kb[kp·bc + j] = (K[j][2kp], K[j][2kp+1])`:
//!   pairs of dims by rows, keys along a row, i.e. K read as u32 pairs and transposed ([`pack_k`]).
//! - P·V reduces over the keys, so V's block becomes `vb[jp·vs + c] = (V[2jp][c], V[2jp+1][c])`: two
//!   consecutive key rows interleaved ([`pack_v`], also the AVX512_BF16 kernel's layout).
//!
//! Both run on AVX-512 (callers are compiled with it) with scalar tails.

use std::arch::x86_64::*;

/// `vpermw` index that interleaves the two 16-element halves of a vector: lane 2i takes i, lane 2i+1
/// takes 16 + i.
pub(crate) static INTERLEAVE: [u16; 32] = {
    let mut a = [0u16; 32];
    let mut k = 0;
    while k < 32 {
        a[k] = if k % 2 == 0 { (k / 2) as u16 } else { 16 + (k / 2) as u16 };
        k += 1;
    }
    a
};

/// One dim pair of key `j`: dims `2kp` (low half) and `2kp + 1` (high half, 0 past an odd `d`).
///
/// # Safety
/// Row `j` of K holds `d` values at `k + j·ks`, and `2kp < d`.
#[inline(always)]
unsafe fn k_pair(k: *const u16, ks: usize, d: usize, j: usize, kp: usize) -> u32 {
    // SAFETY: the caller's contract; the high half is read only when it exists.
    unsafe {
        let row = k.add(j * ks + 2 * kp);
        let hi = if 2 * kp + 1 < d { *row.add(1) as u32 } else { 0 };
        *row as u32 | hi << 16
    }
}

/// Writes `kb[kp·bc + j]` for keys `j < nk` and pairs `kp < ceil(d / 2)` from K's rows (`d` bf16 bits
/// each, `ks` apart). Pairs past `ceil(d / 2)` and keys past `nk` are left as they are (the caller keeps
/// pad pairs zero; scores of keys past `nk` are never read).
///
/// # Safety
/// `nk` rows of `d` u16 readable at `k`, `ks` apart; `kb` holds `ceil(d/2)` rows of `bc >= nk` u32; the CPU
/// runs AVX-512 F (the caller is compiled with it).
#[inline(always)]
pub(crate) unsafe fn pack_k(k: *const u16, ks: usize, nk: usize, d: usize, kb: *mut u32, bc: usize) {
    let (full_pairs, pairs) = (d / 2, d.div_ceil(2));
    // SAFETY (whole body): 16 x 16 blocks read keys j..j+16 <= nk and pairs kp..kp+16 <= d/2 (whole u32
    // inside each row); the tails go through `k_pair`; writes stay inside kb's `pairs` rows of `bc`.
    unsafe {
        let mut j = 0;
        while j + 16 <= nk {
            let mut kp = 0;
            while kp + 16 <= full_pairs {
                let mut r = [_mm512_setzero_si512(); 16];
                for (x, rx) in r.iter_mut().enumerate() {
                    *rx = _mm512_loadu_si512(k.add((j + x) * ks + 2 * kp).cast());
                }
                let t = transpose16(r);
                for (x, tx) in t.iter().enumerate() {
                    _mm512_storeu_si512(kb.add((kp + x) * bc + j).cast(), *tx);
                }
                kp += 16;
            }
            for kp in kp..pairs {
                for x in 0..16 {
                    *kb.add(kp * bc + j + x) = k_pair(k, ks, d, j + x, kp);
                }
            }
            j += 16;
        }
        for kp in 0..pairs {
            for jj in j..nk {
                *kb.add(kp * bc + jj) = k_pair(k, ks, d, jj, kp);
            }
        }
    }
}

/// The transpose of a 16 × 16 matrix of u32 held as 16 row vectors: out[i] lane j = r[j] lane i.
#[inline(always)]
unsafe fn transpose16(r: [__m512i; 16]) -> [__m512i; 16] {
    // SAFETY: register-only shuffles (the caller is compiled with AVX-512 F).
    unsafe {
        // Pairs of rows interleaved by 32 bits, then by 64 bits: u[g][e] holds, in 128-bit lane L, element
        // 4L + e of rows 4g..4g+3.
        let mut u = [[_mm512_setzero_si512(); 4]; 4];
        for g in 0..4 {
            let (a, b, c, d) = (r[4 * g], r[4 * g + 1], r[4 * g + 2], r[4 * g + 3]);
            let (ab_lo, ab_hi) = (_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
            let (cd_lo, cd_hi) = (_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
            u[g][0] = _mm512_unpacklo_epi64(ab_lo, cd_lo);
            u[g][1] = _mm512_unpackhi_epi64(ab_lo, cd_lo);
            u[g][2] = _mm512_unpacklo_epi64(ab_hi, cd_hi);
            u[g][3] = _mm512_unpackhi_epi64(ab_hi, cd_hi);
        }
        // Lane L of the output row 4L + e gathers lane L of u[0..4][e], in that order.
        let mut out = [_mm512_setzero_si512(); 16];
        for e in 0..4 {
            let x = _mm512_shuffle_i32x4::<0x88>(u[0][e], u[1][e]);
            let y = _mm512_shuffle_i32x4::<0xDD>(u[0][e], u[1][e]);
            let z = _mm512_shuffle_i32x4::<0x88>(u[2][e], u[3][e]);
            let w = _mm512_shuffle_i32x4::<0xDD>(u[2][e], u[3][e]);
            out[e] = _mm512_shuffle_i32x4::<0x88>(x, z);
            out[8 + e] = _mm512_shuffle_i32x4::<0xDD>(x, z);
            out[4 + e] = _mm512_shuffle_i32x4::<0x88>(y, w);
            out[12 + e] = _mm512_shuffle_i32x4::<0xDD>(y, w);
        }
        out
    }
}

/// Writes `out[jp·os + c]` for key pairs `jp < ceil(nk / 2)` and columns `c < round_up(dv, 16)` from V's
/// rows (`dv` bf16 bits each, `vs` apart): keys `2jp` (low half) and `2jp + 1` (high half, 0 past `nk`),
/// columns past `dv` zero.
///
/// # Safety
/// `nk` rows of `dv` u16 readable at `v`, `vs` apart; `out` holds `ceil(nk/2)` rows of `os >=
/// round_up(dv, 16)` u32; the CPU runs AVX-512 F and BW (the caller is compiled with them).
#[inline(always)]
pub(crate) unsafe fn pack_v(v: *const u16, vs: usize, nk: usize, dv: usize, out: *mut u32, os: usize) {
    // SAFETY (whole body): masked loads read only the `dv` values of rows that exist; stores stay inside
    // `out`'s rows.
    unsafe {
        let idx = _mm512_loadu_si512(INTERLEAVE.as_ptr().cast());
        for jp in 0..nk.div_ceil(2) {
            let ra = v.add(2 * jp * vs);
            let has_b = 2 * jp + 1 < nk;
            let mut c = 0;
            while c < dv {
                let n = (dv - c).min(16);
                let m = ((1u32 << n) - 1) as u16;
                let a = _mm256_maskz_loadu_epi16(m, ra.add(c).cast());
                let b = if has_b { _mm256_maskz_loadu_epi16(m, ra.add(vs + c).cast()) } else { _mm256_setzero_si256() };
                let ab = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b);
                _mm512_storeu_si512(out.add(jp * os + c).cast(), _mm512_permutexvar_epi16(idx, ab));
                c += 16;
            }
        }
    }
}

/// Zeroes the half of pair `j / 2` that holds key `j` in each of `cols` columns of a packed V block (a key
/// whose V row is not finite leaves the tile product; see `nonfinite`).
///
/// # Safety
/// `out` holds row `j / 2` of `cols` u32 at stride `os`.
#[inline(always)]
pub(crate) unsafe fn drop_v_key(out: *mut u32, os: usize, j: usize, cols: usize) {
    let keep = if j.is_multiple_of(2) { 0xFFFF_0000u32 } else { 0x0000_FFFF };
    for c in 0..cols {
        // SAFETY: the caller's contract.
        unsafe { *out.add((j / 2) * os + c) &= keep };
    }
}
