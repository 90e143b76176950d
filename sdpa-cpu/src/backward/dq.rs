//! Pass 3: dQ of one query tile, over the key tiles its rows see (the band), with P and dS recomputed per
//! key tile. Only this item writes these rows of dQ (and of the f32 `dq_accum`).

use super::scratch::{BwdScratch, BwdTiles};
use super::tile::{key_rows, load_rows, probs_and_dscores};
use super::BwdPart;
use crate::element::CpuElement;
use crate::fa2::RowTile;
use crate::micro;
use crate::problem::round_up;
use crate::simd::{dispatch, Simd, SimdKernel, SimdPath};

struct Item<'x, 'a, T> {
    bp: &'x BwdPart<'a, T>,
    tiles: BwdTiles,
    rt: RowTile,
    scr: &'x mut BwdScratch,
}

impl<T: CpuElement> SimdKernel for Item<'_, '_, T> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        query_tile_grads(s, self.bp, self.tiles, self.rt, self.scr)
    }
}

/// Runs the item of row tile `rt`.
pub(crate) fn run<T: CpuElement>(
    path: SimdPath,
    bp: &BwdPart<'_, T>,
    tiles: BwdTiles,
    rt: RowTile,
    scr: &mut BwdScratch,
) {
    dispatch(path, Item { bp, tiles, rt, scr });
}

#[inline(always)]
fn query_tile_grads<S: Simd, T: CpuElement>(
    s: S,
    bp: &BwdPart<'_, T>,
    tiles: BwdTiles,
    rt: RowTile,
    scr: &mut BwdScratch,
) {
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
                micro::pv(s, nk, scr.dst.as_ptr(), t.brp, 1, k, ks, nr, d, scr.acc_k.as_mut_ptr(), dp, None, None);
            }
        }
    }
    for r in 0..nr {
        let (h, i) = scr.rows[r];
        let row = &mut scr.acc_k[r * dp..r * dp + d];
        row.iter_mut().for_each(|x| *x *= p.scale);
        let off = p.q_st.offset(b, h, i);
        // SAFETY: row (b, h, i) belongs to this item only; the validated, non-aliasing Q strides keep its d
        // values inside dQ (and dq_accum, which has Q's strides).
        unsafe {
            T::narrow(row, std::slice::from_raw_parts_mut(bp.dq.ptr().add(off), d));
            if let Some(a) = bp.dq_accum {
                std::ptr::copy_nonoverlapping(row.as_ptr(), a.ptr().add(off), d);
            }
        }
    }
}
