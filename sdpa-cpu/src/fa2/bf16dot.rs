//! The fused kernel for bf16 inputs on CPUs with AVX512_BF16: `vdpbf16ps` multiplies pairs of bf16 and
//! accumulates in f32, so each instruction does twice the products of an f32 FMA.
//!
//! Same structure as the generic item kernel ([`super::process`]): Qᵀ is packed once per item, now as pairs
//! along the head dim; K is read in place, a pair of dims per 32-bit broadcast; the scores get the scale
//! on their way out of the registers; softcap, ALiBi, mask and online softmax are the generic f32 code. P is rounded to
//! bf16 and interleaved by key pairs, and each V tile is interleaved by key pairs, so P·V is pairs too.
//! Needs an even head dim (odd ones take the generic path).

use super::{end_item, splits_edge_tile, tail_start, vectors_done_before, Bf16Item, KeyLoop, Scratch, SKIP_PIECE};
use crate::amx::pack::{drop_v_key, pack_v, INTERLEAVE};
use crate::element::CpuElement;
use crate::micro::{self, SoftmaxExp};
use crate::nonfinite::{self, ProbTile};
use crate::problem::round_up;
use crate::simd::x86::Avx512;
use half::bf16;
use std::arch::x86_64::*;

const L: usize = 16;
// P·V takes the pieces of an edge tile as whole key pairs.
const _: () = assert!(SKIP_PIECE.is_multiple_of(2));

#[inline(always)]
fn bh(x: __m512i) -> __m512bh {
    // SAFETY: both are 64-byte plain vectors; every bit pattern is a valid value of either.
    unsafe { std::mem::transmute::<__m512i, __m512bh>(x) }
}

/// Runs one work item (rows `it.r0..` of kv head `it.kvh`, keys `it.k_lo..it.k_hi`). Returns false, having
/// sent nothing, when not `careful` and an accumulator came out non-finite (see `nonfinite`); true once
/// its rows went to the sink.
///
/// # Safety
/// The CPU must support AVX-512 F/VL/BW/DQ and AVX512_BF16; the job's `q`, `k`, `v` are its problem's
/// operands (checked against the spec), `p.d` is even, and `scr` was built with `pairs = true` for its tiles.
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,avx512bf16")]
pub(crate) unsafe fn process<T: CpuElement>(job: Bf16Item<'_, '_, T>, scr: &mut Scratch, careful: bool) -> bool {
    let Bf16Item { p, q, k, v, tiles: t, item: it, sink } = job;
    // SAFETY: the caller guarantees the CPU features.
    let s = unsafe { Avx512::new_unchecked() };
    let (d, dv) = (p.d, p.dv);
    let d2 = d / 2;
    let dvp = round_up(dv, L);
    let nr = it.nr;
    let nqv = nr.div_ceil(L);
    let brp = nqv * L;

    scr.rows.clear();
    scr.rows.extend((0..nr).map(|r| p.row(it.kvh, it.r0 + r)));
    for (r, &(h, i)) in scr.rows.iter().enumerate() {
        let src = &q[p.q_st.offset(it.b, h, i)..][..d];
        for c2 in 0..d2 {
            scr.qt2[c2 * brp + r] = src[2 * c2].to_bits() as u32 | (src[2 * c2 + 1].to_bits() as u32) << 16;
        }
    }
    for c2 in 0..d2 {
        scr.qt2[c2 * brp + nr..(c2 + 1) * brp].fill(0);
    }

    let KeyLoop { span, explicit, kbase, vbase } = KeyLoop::start(p, it, scr, brp, nr * dvp);
    // SAFETY (whole loop): every pointer stays inside its buffer: K and V rows j0..j1 exist (validated
    // spec), the scratch buffers are sized for `t` (bc keys, br rows, dvp columns, d/2 pairs).
    unsafe {
        let scale = _mm512_set1_ps(p.scale);
        let idx = _mm512_loadu_si512(INTERLEAVE.as_ptr().cast());
        let mut j0 = span.lo;
        while j0 < span.hi {
            let j1 = (j0 + t.bc).min(span.hi);
            let nk = j1 - j0;
            let st = scr.st.as_mut_ptr();
            let kp = k.as_ptr().add(kbase + j0 * p.k_st.s);
            // As the generic kernel: a tile crossing the band's edge goes by pieces of SKIP_PIECE keys (an even
            // count: whole key pairs for P·V), each leaving out the query vectors above all of its keys, rounded
            // to the score tiles' pairs of vectors and P·V's 8-row tiles.
            let split = splits_edge_tile(p, &span, &scr.rows, L, j0, j1, !careful && !explicit);
            let piece = if split { SKIP_PIECE } else { nk };
            let done = |ja: usize| if split { vectors_done_before(p, &scr.rows, L, ja) } else { 0 };
            for ja in (j0..j1).step_by(piece) {
                let (n, o, v) = ((j1 - ja).min(piece), ja - j0, tail_start(nqv, done(ja), 2));
                let (qt, out) = (scr.qt2.as_ptr().add(v * L), st.add(o * brp + v * L));
                scores(d2, kp.add(o * p.k_st.s), p.k_st.s, n, qt, brp, nqv - v, out, brp, scale);
            }
            if !p.mods.is_plain() {
                p.mods.apply(s, &scr.neg_slope, &scr.diag, j0, nk, brp, st, brp, 1);
            }
            if explicit || span.needs_mask(j0, j1) {
                p.apply_mask(it.b, &scr.rows, j0, j1, st, brp, 1);
            }
            micro::online_softmax(
                s,
                SoftmaxExp::for_output::<T>(),
                st,
                brp,
                nk,
                nqv,
                &mut scr.m,
                &mut scr.l,
                &mut scr.alpha,
            );

            // Pᵀ as bf16 pairs of consecutive keys, per row.
            let np = nk.div_ceil(2);
            let pb = scr.pb.as_mut_ptr();
            for jp in 0..np {
                for n in 0..nqv {
                    let a = _mm512_loadu_ps(st.add(2 * jp * brp + n * L));
                    let b = if 2 * jp + 1 < nk {
                        _mm512_loadu_ps(st.add((2 * jp + 1) * brp + n * L))
                    } else {
                        _mm512_setzero_ps()
                    };
                    let packed: __m512i = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(b, a));
                    _mm512_storeu_si512(pb.add(jp * brp + n * L).cast(), _mm512_permutexvar_epi16(idx, packed));
                }
            }
            // V rows interleaved by key pairs, columns padded to dvp with zeros.
            let v2 = scr.v2.as_mut_ptr();
            let vs = p.v_st.s;
            pack_v(v.as_ptr().add(vbase + j0 * vs).cast(), vs, nk, dv, v2, dvp);
            // Careful mode: V rows with NaN or inf leave the pair product and come back only where attended.
            let bad: Vec<usize> = if careful {
                (0..nk).filter(|&j| v[vbase + (j0 + j) * vs..][..dv].iter().any(|x| !x.is_finite())).collect()
            } else {
                Vec::new()
            };
            for &j in &bad {
                drop_v_key(v2, dvp, j, dv);
            }
            let o = scr.o.as_mut_ptr();
            // Piece by piece as the scores. The first piece rescales every row a later one reaches (they skip
            // at least as many), so later pieces take alpha = 1; a skipped row's alpha is 1 anyway (its maximum
            // did not move in this tile) or its accumulator still +0.
            let (pb, v2, al) = (scr.pb.as_ptr(), scr.v2.as_ptr(), scr.alpha.as_mut_ptr());
            for ja in (j0..j1).step_by(piece) {
                let (n2, o2) = ((j1 - ja).min(piece).div_ceil(2), (ja - j0) / 2);
                let r = tail_start(nr, done(ja) * L, 8);
                pv(n2, pb.add(o2 * brp + r), brp, v2.add(o2 * dvp), dvp, nr - r, dvp, o.add(r * dvp), dvp, al.add(r));
                if ja == j0 && piece < nk {
                    std::slice::from_raw_parts_mut(al.add(r), brp - r).fill(1.0);
                }
            }
            if !bad.is_empty() {
                let vals = nonfinite::widen_rows(v, vbase + j0 * vs, vs, dv, &bad);
                let prob = ProbTile { pt: st, ps: brp, pr: 1 };
                nonfinite::add_back(p, it.b, &scr.rows, j0, &bad, &vals, prob, o, dvp);
            }
            j0 = j1;
        }
    }
    end_item(s, p, it, scr, dvp, sink, careful)
}

/// `out[j*os + x] = scale · Σ_c k[j*ks + c] · q[x][c]` with Qᵀ given as dim pairs `qt2[c2*qs + x]`.
#[inline(always)]
unsafe fn scores(
    d2: usize,
    k: *const bf16,
    ks: usize,
    nk: usize,
    qt2: *const u32,
    qs: usize,
    nqv: usize,
    out: *mut f32,
    os: usize,
    scale: __m512,
) {
    // SAFETY: offsets stay inside the extents `process` sized.
    unsafe {
        let mut n = 0;
        while n < nqv {
            let nq = if nqv - n >= 2 { 2 } else { 1 };
            let (q_n, o_n) = (qt2.add(n * L), out.add(n * L));
            let mut j = 0;
            while j < nk {
                let mr = if nk - j >= 12 { 12 } else { 1 };
                let (kj, oj) = (k.add(j * ks), o_n.add(j * os));
                match (mr, nq) {
                    (12, 2) => qk_tile::<12, 2>(d2, kj, ks, q_n, qs, oj, os, scale),
                    (12, _) => qk_tile::<12, 1>(d2, kj, ks, q_n, qs, oj, os, scale),
                    (_, 2) => qk_tile::<1, 2>(d2, kj, ks, q_n, qs, oj, os, scale),
                    _ => qk_tile::<1, 1>(d2, kj, ks, q_n, qs, oj, os, scale),
                }
                j += mr;
            }
            n += nq;
        }
    }
}

#[inline(always)]
unsafe fn qk_tile<const MR: usize, const NQ: usize>(
    d2: usize,
    k: *const bf16,
    ks: usize,
    qt2: *const u32,
    qs: usize,
    out: *mut f32,
    os: usize,
    scale: __m512,
) {
    // SAFETY: offsets stay inside the extents `process` sized; K pairs are read unaligned.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NQ]; MR];
        for c2 in 0..d2 {
            let mut qv = [_mm512_setzero_si512(); NQ];
            for (x, q) in qv.iter_mut().enumerate() {
                *q = _mm512_loadu_si512(qt2.add(c2 * qs + x * L).cast());
            }
            for r in 0..MR {
                let pair = k.add(r * ks + 2 * c2).cast::<u32>().read_unaligned();
                let kb = bh(_mm512_set1_epi32(pair as i32));
                for x in 0..NQ {
                    acc[r][x] = _mm512_dpbf16_ps(acc[r][x], kb, bh(qv[x]));
                }
            }
        }
        for r in 0..MR {
            for x in 0..NQ {
                _mm512_storeu_ps(out.add(r * os + x * L), _mm512_mul_ps(acc[r][x], scale));
            }
        }
    }
}

/// `o[r*os + c] = o[r*os + c]·alpha[r] + Σ_jp pb[jp*ps + r] · v2[jp*vs + c]` (pairs of keys) for rows
/// `r < rows` and columns `c < cols` (a multiple of 16).
#[inline(always)]
unsafe fn pv(
    np: usize,
    pb: *const u32,
    ps: usize,
    v2: *const u32,
    vs: usize,
    rows: usize,
    cols: usize,
    o: *mut f32,
    os: usize,
    alpha: *const f32,
) {
    // SAFETY: offsets stay inside the extents `process` sized.
    unsafe {
        let mut r = 0;
        while r < rows {
            let nr = if rows - r >= 8 { 8 } else { 1 };
            let mut c = 0;
            while c < cols {
                let nv = if cols - c >= 2 * L { 2 } else { 1 };
                let (pr, vc, orc, ar) = (pb.add(r), v2.add(c), o.add(r * os + c), alpha.add(r));
                match (nr, nv) {
                    (8, 2) => pv_tile::<8, 2>(np, pr, ps, vc, vs, orc, os, ar),
                    (8, _) => pv_tile::<8, 1>(np, pr, ps, vc, vs, orc, os, ar),
                    (_, 2) => pv_tile::<1, 2>(np, pr, ps, vc, vs, orc, os, ar),
                    _ => pv_tile::<1, 1>(np, pr, ps, vc, vs, orc, os, ar),
                }
                c += nv * L;
            }
            r += nr;
        }
    }
}

#[inline(always)]
unsafe fn pv_tile<const MR: usize, const NV: usize>(
    np: usize,
    pb: *const u32,
    ps: usize,
    v2: *const u32,
    vs: usize,
    o: *mut f32,
    os: usize,
    alpha: *const f32,
) {
    // SAFETY: offsets stay inside the extents `process` sized.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        for r in 0..MR {
            let a = _mm512_set1_ps(*alpha.add(r));
            for x in 0..NV {
                acc[r][x] = _mm512_mul_ps(_mm512_loadu_ps(o.add(r * os + x * L)), a);
            }
        }
        for jp in 0..np {
            let mut vv = [_mm512_setzero_si512(); NV];
            for (x, w) in vv.iter_mut().enumerate() {
                *w = _mm512_loadu_si512(v2.add(jp * vs + x * L).cast());
            }
            for r in 0..MR {
                let pbb = bh(_mm512_set1_epi32(*pb.add(jp * ps + r) as i32));
                for x in 0..NV {
                    acc[r][x] = _mm512_dpbf16_ps(acc[r][x], pbb, bh(vv[x]));
                }
            }
        }
        for r in 0..MR {
            for x in 0..NV {
                _mm512_storeu_ps(o.add(r * os + x * L), acc[r][x]);
            }
        }
    }
}
