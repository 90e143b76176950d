//! One query tile and one (query tile, key tile) pair: the query tile packed into scratch (Q and dO both
//! ways round, LSE, Delta, ALiBi's row constants), and the pair's P and dS recomputed in place.

use super::scratch::BwdScratch;
use super::BwdPart;
use crate::element::CpuElement;
use crate::fa2::KeySpan;
use crate::micro;
use crate::problem::{round_up, MaskSel};
use crate::simd::Simd;
use crate::transpose::transpose_rows;

/// A packed query tile: its rows (`scr.rows`, in `brp = nqv·LANES` lanes) of kv head `kvh`'s group in batch `b`, and
/// the keys they see by position.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowsTile {
    pub b: usize,
    pub nqv: usize,
    pub brp: usize,
    pub span: KeySpan,
}

/// Packs rows `r0 .. r0 + nr` of kv head `kvh`'s group (batch `b`) into `scr`: Qᵀ and Q scaled, dOᵀ and
/// dO, the LSE (with `+inf` for a row that sees no key and for padding lanes, so their P is exactly 0),
/// Delta, ALiBi's constants. Padding lanes of the transposed tiles are zero.
#[inline(always)]
pub(crate) fn load_rows<S: Simd, T: CpuElement>(
    _s: S,
    bp: &BwdPart<'_, T>,
    b: usize,
    kvh: usize,
    r0: usize,
    nr: usize,
    span: KeySpan,
    scr: &mut BwdScratch,
) -> RowsTile {
    let p = &bp.p;
    let l = S::LANES;
    let (d, dv) = (p.d, p.dv);
    let (dp, dvp) = (round_up(d, l), round_up(dv, l));
    let nqv = nr.div_ceil(l);
    let brp = nqv * l;
    scr.rows.clear();
    scr.rows.extend((0..nr).map(|r| p.row(kvh, r0 + r)));
    for r in 0..nr {
        let (h, i) = scr.rows[r];
        let off = p.q_st.offset(b, h, i);
        T::widen(&p.q[off..off + d], &mut scr.rowbuf[..d]);
        let qr = &mut scr.qr[r * dp..(r + 1) * dp];
        for (x, &y) in qr.iter_mut().zip(&scr.rowbuf[..d]) {
            *x = y * p.scale;
        }
        qr[d..].fill(0.0);
        let off = p.o_st.offset(b, h, i);
        let dor = &mut scr.dor[r * dvp..(r + 1) * dvp];
        T::widen(&bp.d_o[off..off + dv], &mut dor[..dv]);
        dor[dv..].fill(0.0);
        let lse = bp.lse[b * p.lse_st.0 + h * p.lse_st.1 + i];
        // A row that sees no key has LSE -inf; subtracting +inf makes its P exactly 0 (not NaN).
        scr.lse[r] = if lse == f32::NEG_INFINITY { f32::INFINITY } else { lse };
        scr.delta[r] = bp.delta[(b * p.hq + h) * p.sq + i];
    }
    // Qᵀ and dOᵀ from the row-major tiles just written.
    transpose_rows(&scr.qr[..], dp, nr, d, 1.0, &mut scr.qt[..], brp);
    transpose_rows(&scr.dor[..], dvp, nr, dv, 1.0, &mut scr.dot[..], brp);
    if nr < brp {
        for c in 0..d {
            scr.qt[c * brp + nr..(c + 1) * brp].fill(0.0);
        }
        for c in 0..dv {
            scr.dot[c * brp + nr..(c + 1) * brp].fill(0.0);
        }
        scr.lse[nr..brp].fill(f32::INFINITY);
        scr.delta[nr..brp].fill(0.0);
    }
    p.mods.row_consts(&scr.rows, &mut scr.neg_slope[..brp], &mut scr.diag[..brp]);
    RowsTile { b, nqv, brp, span }
}

/// Recomputes the pair's `Pᵀ` into `scr.st` and `dSᵀ` into `scr.dst` (`[key][row]`, row stride `brp`) for
/// keys `j0 .. j0 + nk` of the packed tile `t`; with a softcap `dSᵀ` already carries its factor
/// `1 − (s0/cap)²`. A key a row does not see has P = 0 and dS = 0 exactly, whatever dP is (so a
/// non-finite V row under the mask stays out of dS).
///
/// # Safety
/// `k` addresses `nk` rows of `d` f32 at stride `ks`, `v` `nk` rows of `dv` f32 at stride `vs`;
/// `nk <= bc` of the scratch's tiles; `t` was packed into `scr` by [`load_rows`].
#[inline(always)]
pub(crate) unsafe fn probs_and_dscores<S: Simd, T: CpuElement>(
    s: S,
    bp: &BwdPart<'_, T>,
    t: &RowsTile,
    scr: &mut BwdScratch,
    j0: usize,
    nk: usize,
    k: *const f32,
    ks: usize,
    v: *const f32,
    vs: usize,
) {
    let p = &bp.p;
    let (l, brp, nqv) = (S::LANES, t.brp, t.nqv);
    let (st, dst, s0) = (scr.st.as_mut_ptr(), scr.dst.as_mut_ptr(), scr.s0.as_mut_ptr());
    let cap = p.mods.softcap;
    // SAFETY (whole body): every tile index (key < nk <= bc, lane < brp) is inside the scratch tiles; the
    // packed Qᵀ/dOᵀ hold d/dv rows of brp lanes; K and V rows as the contract says.
    unsafe {
        micro::scores(s, p.d, k, ks, nk, scr.qt.as_ptr(), brp, nqv, st, brp);
        if cap.is_some() {
            bp.cap_only.apply(s, &scr.neg_slope, &scr.diag, j0, nk, brp, st, brp, 1);
            std::ptr::copy_nonoverlapping(st, s0, nk * brp);
            if bp.alibi_only.neg_slopes.is_some() {
                bp.alibi_only.apply(s, &scr.neg_slope, &scr.diag, j0, nk, brp, st, brp, 1);
            }
        } else if !p.mods.is_plain() {
            p.mods.apply(s, &scr.neg_slope, &scr.diag, j0, nk, brp, st, brp, 1);
        }
        if matches!(p.mask, MaskSel::Explicit { .. }) || t.span.needs_mask(j0, j0 + nk) {
            p.apply_mask(t.b, &scr.rows, j0, j0 + nk, st, brp, 1);
        }
        micro::scores(s, p.dv, v, vs, nk, scr.dot.as_ptr(), brp, nqv, dst, brp);
        let (zero, one, tiny, lowest) = (s.zero(), s.splat(1.0), s.splat(f32::MIN_POSITIVE), s.splat(f32::MIN));
        let inv_cap = s.splat(cap.map_or(0.0, |c| 1.0 / c));
        for n in 0..nqv {
            let g = s.load(scr.lse.as_ptr().add(n * l));
            let dl = s.load(scr.delta.as_ptr().add(n * l));
            for j in 0..nk {
                let off = j * brp + n * l;
                let x = s.load(st.add(off));
                // A masked score (-inf) gives P = 0 even where the row's LSE is NaN (a NaN it sees).
                let pr = s.select_lt(x, lowest, zero, s.exp(s.sub(x, g)));
                let ds = s.mul(pr, s.sub(s.load(dst.add(off)), dl));
                // P = 0 (a masked key, a row without keys, padding): dS = 0 even where dP is not finite.
                let mut ds = s.select_lt(pr, tiny, zero, ds);
                if cap.is_some() {
                    let u = s.mul(s.load(s0.add(off)), inv_cap);
                    ds = s.mul(ds, s.fma(s.sub(zero, u), u, one));
                }
                s.store(st.add(off), pr);
                s.store(dst.add(off), ds);
            }
        }
    }
}

/// Keys `j0 .. j0 + nk` (at most a pass-2 block) of K and V as f32: in place for f32 inputs, else widened
/// into `scr.kp`/`scr.vp`. Returns `(k, ks, v, vs)`: row `j0 + x` of K at `k + x·ks`.
#[inline(always)]
pub(crate) fn key_rows<T: CpuElement>(
    bp: &BwdPart<'_, T>,
    b: usize,
    kvh: usize,
    j0: usize,
    nk: usize,
    dp: usize,
    dvp: usize,
    scr: &mut BwdScratch,
) -> (*const f32, usize, *const f32, usize) {
    let p = &bp.p;
    // Rows `j0..j0 + nk` of one operand as f32: in place, or widened into `buf` at stride `padded`.
    let rows =
        |x: &[T], width: usize, padded: usize, row: &dyn Fn(usize) -> usize, buf: &mut Vec<f32>| match T::as_f32(x) {
            Some(xf) => (xf[row(j0)..].as_ptr(), 0),
            None => {
                for j in 0..nk {
                    let off = row(j0 + j);
                    T::widen(&x[off..off + width], &mut buf[j * padded..j * padded + width]);
                }
                (buf.as_ptr(), padded)
            }
        };
    let k = rows(p.k, p.d, dp, &|j| p.k_row(b, kvh, j), &mut scr.kp);
    let v = rows(p.v, p.dv, dvp, &|j| p.v_row(b, kvh, j), &mut scr.vp);
    // A zero stride marks a tile read in place: its rows lie at the operand's own stride.
    let k = (k.0, if k.1 == 0 { p.k_st.s } else { k.1 });
    let v = (v.0, if v.1 == 0 { p.v_st.s } else { v.1 });
    (k.0, k.1, v.0, v.1)
}

/// The careful form of the tile products, for items whose fast run came out non-finite:
/// `acc[r·accs + c] += Σ_x w[x·ws + r·wr] · m[x·ms + c]` for rows `r < rows`, columns `c < cols`, `x < n`,
/// over the visible pairs only (`vis`, laid out like `w`, non-zero where the pair is visible), so a NaN or
/// inf in `m` reaches only the rows whose pair with it is visible, as in the reference (the fast products
/// multiply whole tiles, and `0 · NaN` is NaN). The same fused multiply-adds in the same order as the fast
/// products where every pair is visible.
///
/// # Safety
/// `w` and `vis` address every `x·ws + r·wr`; `m` `n` rows of `cols` f32 at stride `ms`; `acc` `rows` rows
/// of `cols` f32 at stride `accs`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn careful_product(
    n: usize,
    w: *const f32,
    vis: *const f32,
    ws: usize,
    wr: usize,
    m: *const f32,
    ms: usize,
    rows: usize,
    cols: usize,
    acc: *mut f32,
    accs: usize,
) {
    // SAFETY (whole body): indices inside the contract's extents.
    unsafe {
        for r in 0..rows {
            for c in 0..cols {
                let mut a = *acc.add(r * accs + c);
                for x in 0..n {
                    if *vis.add(x * ws + r * wr) != 0.0 {
                        a = (*w.add(x * ws + r * wr)).mul_add(*m.add(x * ms + c), a);
                    }
                }
                *acc.add(r * accs + c) = a;
            }
        }
    }
}

/// Marks the visible pairs of the packed tile for keys `j0 .. j0 + nk` in `scr.vis` (`[key][row]`, row
/// stride `t.brp`): 1 where row `r` sees key `j` (`Problem::visible`), else 0. Only careful runs ask.
pub(crate) fn mark_visible<T: CpuElement>(
    bp: &BwdPart<'_, T>,
    t: &RowsTile,
    scr: &mut BwdScratch,
    j0: usize,
    nk: usize,
) {
    for j in 0..nk {
        for (r, &(h, i)) in scr.rows.iter().enumerate() {
            scr.vis[j * t.brp + r] = if bp.p.visible(t.b, h, i, j0 + j) { 1.0 } else { 0.0 };
        }
    }
}
