//! Pass 3: dQ of one query tile, over the key tiles its rows see (the band), with P and dS recomputed per
//! key tile. Only this item writes these rows of dQ (and of the f32 `dq_accum`).

use super::scratch::{BwdScratch, BwdTiles};
use super::tile::{careful_product, key_rows, load_rows, mark_visible, probs_and_dscores};
use super::BwdPart;
use crate::element::CpuElement;
use crate::fa2::RowTile;
use crate::micro;
use crate::nonfinite::all_finite;
use crate::problem::round_up;
use crate::simd::{dispatch, Simd, SimdKernel, SimdPath};

struct Item<'x, 'a, T> {
    bp: &'x BwdPart<'a, T>,
    tiles: BwdTiles,
    rt: RowTile,
    scr: &'x mut BwdScratch,
    careful: bool,
}

impl<T: CpuElement> SimdKernel for Item<'_, '_, T> {
    type Output = bool;
    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> bool {
        query_tile_grads(s, self.bp, self.tiles, self.rt, self.scr, self.careful)
    }
}

/// Runs the item of row tile `rt` (again carefully, `tile::careful_product`, when its dQ came out
/// non-finite).
pub(crate) fn run<T: CpuElement>(
    path: SimdPath,
    bp: &BwdPart<'_, T>,
    tiles: BwdTiles,
    rt: RowTile,
    scr: &mut BwdScratch,
) {
    // Again with careful products when the fast run's dQ came out non-finite.
    if !dispatch(path, Item { bp, tiles, rt, scr: &mut *scr, careful: false }) {
        dispatch(path, Item { bp, tiles, rt, scr, careful: true });
    }
}

#[inline(always)]
fn query_tile_grads<S: Simd, T: CpuElement>(
    s: S,
    bp: &BwdPart<'_, T>,
    tiles: BwdTiles,
    rt: RowTile,
    scr: &mut BwdScratch,
    careful: bool,
) -> bool {
    let p = &bp.p;
    let (_, b, kvh, r0, nr, span) = rt;
    let d = p.d;
    let (dp, dvp) = (round_up(d, S::LANES), round_up(p.dv, S::LANES));
    let t = load_rows(s, bp, b, kvh, r0, nr, span, scr);
    scr.acc_k[..nr * dp].fill(0.0);
    if span.hi > span.lo {
        // Key tiles on the same grid as pass 2.
        for kt in span.lo / tiles.bc..span.hi.div_ceil(tiles.bc) {
            let j0 = kt * tiles.bc;
            let nk = (j0 + tiles.bc).min(p.sk) - j0;
            let (k, ks, v, vs) = key_rows(bp, b, kvh, j0, nk, dp, dvp, scr);
            // SAFETY: K/V rows j0..j0+nk from `key_rows`; the tile was packed above; `dst` holds nk keys
            // by brp lanes; the accumulator nr rows of dp values.
            unsafe {
                probs_and_dscores(s, bp, &t, scr, j0, nk, k, ks, v, vs);
                let (dst, acc) = (scr.dst.as_ptr(), scr.acc_k.as_mut_ptr());
                if careful {
                    mark_visible(bp, &t, scr, j0, nk);
                    careful_product(nk, dst, scr.vis.as_ptr(), t.brp, 1, k, ks, nr, d, acc, dp);
                } else {
                    dq_product(s, nk, dst, t.brp, k, ks, nr, d, acc, dp);
                }
            }
        }
    }
    if !careful && !all_finite(s, &scr.acc_k[..nr * dp]) {
        return false;
    }
    finish_rows(bp, b, &scr.rows, &mut scr.acc_k, dp);
    true
}

/// `dq[r·dqs + c] += Σ_j dSᵀ[j·brp + r] · k[j·ks + c]` for rows `r < nr`, columns `c < d`, keys `j < nk`:
/// the one dQ product of both schedules, so they agree bitwise.
///
/// # Safety
/// `dst` addresses `nk` rows of `brp >= nr` f32; `k` `nk` rows of `d` f32 at stride `ks`; `dq` `nr` rows of
/// `round_up(d, LANES)` f32 at stride `dqs`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) unsafe fn dq_product<S: Simd>(
    s: S,
    nk: usize,
    dst: *const f32,
    brp: usize,
    k: *const f32,
    ks: usize,
    nr: usize,
    d: usize,
    dq: *mut f32,
    dqs: usize,
) {
    // SAFETY: the contract's extents are `pv`'s with P = dSᵀ read key-major (ps = brp, pr = 1), V = K.
    unsafe { micro::pv(s, nk, dst, brp, 1, k, ks, nr, d, dq, dqs, None, None) }
}

/// Scales accumulated dQ rows (`acc` row `r` at `r·dp`, for query rows `rows`) and writes them to dQ (and
/// to the f32 `dq_accum` when asked).
pub(crate) fn finish_rows<T: CpuElement>(
    bp: &BwdPart<'_, T>,
    b: usize,
    rows: &[(usize, usize)],
    acc: &mut [f32],
    dp: usize,
) {
    let (p, d) = (&bp.p, bp.p.d);
    for (r, &(h, i)) in rows.iter().enumerate() {
        let row = &mut acc[r * dp..r * dp + d];
        row.iter_mut().for_each(|x| *x *= p.scale);
        let off = p.q_st.offset(b, h, i);
        // SAFETY: row (b, h, i) belongs to the calling item only; the validated, non-aliasing Q strides keep
        // its d values inside dQ (and dq_accum, which has Q's strides).
        unsafe {
            T::narrow(row, std::slice::from_raw_parts_mut(bp.dq.ptr().add(off), d));
            if let Some(a) = bp.dq_accum {
                std::ptr::copy_nonoverlapping(row.as_ptr(), a.ptr().add(off), d);
            }
        }
    }
}
