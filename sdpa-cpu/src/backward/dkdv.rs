//! Pass 2: dK and dV of a block of key tiles of one (batch, kv head), over every query tile of the group
//! whose rows see one of its keys (packed once for the whole block). Only this item writes these rows of dK and dV, so there is nothing to
//! synchronise and the sums run in one fixed order.

use super::dq::dq_product;
use super::scratch::{BwdScratch, BwdTiles};
use super::tile::{careful_product, key_rows, load_rows, mark_visible, probs_and_dscores};
use super::BwdPart;
use crate::element::CpuElement;
use crate::fa2::RowTile;
use crate::micro;
use crate::nonfinite::all_finite;
use crate::problem::{round_up, SharedMut};
use crate::simd::{dispatch, Simd, SimdKernel, SimdPath};

/// The key tiles `kt .. kt + tiles.kblock` of kv head `kvh`, batch `b`, of one part; `rts` are the row tiles of that (batch, kv
/// head) with their key spans.
pub(crate) struct KeyTile<'x, 'a, T> {
    pub bp: &'x BwdPart<'a, T>,
    pub tiles: BwdTiles,
    pub rts: &'x [RowTile],
    pub b: usize,
    pub kvh: usize,
    pub kt: usize,
    /// The fused schedule: dQ of every row of the (batch, kv head) in f32, row `r` of the group at `r·dp`,
    /// accumulated here too (`dQ += dS·K`, unscaled) instead of in pass 3.
    pub dq: Option<SharedMut<f32>>,
    /// Products that skip zero weights (`tile::careful_product`): the re-run of an item whose fast run
    /// came out non-finite.
    pub careful: bool,
}

impl<T> Clone for KeyTile<'_, '_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for KeyTile<'_, '_, T> {}

struct Item<'x, 'a, T>(KeyTile<'x, 'a, T>, &'x mut BwdScratch);

impl<T: CpuElement> SimdKernel for Item<'_, '_, T> {
    type Output = bool;
    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> bool {
        key_tile_grads(s, self.0, self.1)
    }
}

/// Runs one block's item, and again carefully when its dK or dV came out non-finite (not with `dq`: the
/// fused caller re-runs the whole group, whose dQ rows have taken this block's products). Returns whether
/// the run's dK and dV came out finite.
pub(crate) fn run<T: CpuElement>(path: SimdPath, item: KeyTile<'_, '_, T>, scr: &mut BwdScratch) -> bool {
    let finite = dispatch(path, Item(item, scr));
    if finite || item.dq.is_some() || item.careful {
        return finite;
    }
    dispatch(path, Item(KeyTile { careful: true, ..item }, scr))
}

#[inline(always)]
fn key_tile_grads<S: Simd, T: CpuElement>(s: S, item: KeyTile<'_, '_, T>, scr: &mut BwdScratch) -> bool {
    let KeyTile { bp, tiles, rts, b, kvh, kt, dq, careful } = item;
    let p = &bp.p;
    let (d, dv, bc) = (p.d, p.dv, tiles.bc);
    let (dp, dvp) = (round_up(d, S::LANES), round_up(dv, S::LANES));
    // The item's keys: `kblock` key tiles, so each query tile is packed once for all of them.
    let j_lo = kt * bc;
    let j_hi = (j_lo + tiles.kblock * bc).min(p.sk);
    let nb = j_hi - j_lo;
    scr.acc_k[..nb * dp].fill(0.0);
    scr.acc_v[..nb * dvp].fill(0.0);
    let mut loaded = false;
    let (mut k, mut ks, mut v, mut vs) = (std::ptr::null(), 0, std::ptr::null(), 0);
    for &(_, _, _, r0, nr, span) in rts.iter().filter(|t| t.5.lo < j_hi && t.5.hi > j_lo) {
        if !loaded {
            (k, ks, v, vs) = key_rows(bp, b, kvh, j_lo, nb, dp, dvp, scr);
            loaded = true;
        }
        let t = load_rows(s, bp, b, kvh, r0, nr, span, scr);
        let mut j0 = j_lo.max(span.lo / bc * bc);
        while j0 < j_hi.min(span.hi) {
            let nk = (j0 + bc).min(j_hi) - j0;
            let x = j0 - j_lo;
            // SAFETY: K/V rows j_lo..j_hi at (k, ks)/(v, vs) from `key_rows`, so rows j0..j0+nk at offset x;
            // the query tile was packed above; `st`/`dst` hold nk <= bc keys by brp lanes; `dor`/`qr` hold
            // nr rows of dvp/dp values; the accumulators nb rows of dvp/dp values, x + nk <= nb.
            unsafe {
                probs_and_dscores(s, bp, &t, scr, j0, nk, k.add(x * ks), ks, v.add(x * vs), vs);
                let (brp, acc_v, acc_k) =
                    (t.brp, scr.acc_v.as_mut_ptr().add(x * dvp), scr.acc_k.as_mut_ptr().add(x * dp));
                let (pt, dst, kx) = (scr.st.as_ptr(), scr.dst.as_ptr(), k.add(x * ks));
                if careful {
                    mark_visible(bp, &t, scr, j0, nk);
                    let vis = scr.vis.as_ptr();
                    careful_product(nr, pt, vis, 1, brp, scr.dor.as_ptr(), dvp, nk, dv, acc_v, dvp);
                    careful_product(nr, dst, vis, 1, brp, scr.qr.as_ptr(), dp, nk, d, acc_k, dp);
                } else {
                    micro::gemm_acc(s, nr, pt, brp, scr.dor.as_ptr(), dvp, nk, dv, acc_v, dvp);
                    micro::gemm_acc(s, nr, dst, brp, scr.qr.as_ptr(), dp, nk, d, acc_k, dp);
                }
                if let Some(dq) = dq {
                    // The same product, in the same key order, as pass 3 (`dq::dq_product`).
                    let dq = dq.ptr().add(r0 * dp);
                    if careful {
                        careful_product(nk, dst, scr.vis.as_ptr(), brp, 1, kx, ks, nr, d, dq, dp);
                    } else {
                        dq_product(s, nk, dst, brp, kx, ks, nr, d, dq, dp);
                    }
                }
            }
            j0 += nk;
        }
    }
    let finite = all_finite(s, &scr.acc_k[..nb * dp]) && all_finite(s, &scr.acc_v[..nb * dvp]);
    if !finite && !careful && dq.is_none() {
        return false;
    }
    for j in 0..nb {
        let (ko, vo) = (p.k_st.offset(b, kvh, j_lo + j), p.v_st.offset(b, kvh, j_lo + j));
        // SAFETY: key j_lo + j of kv head kvh belongs to this item only; the validated, non-aliasing K and
        // V strides keep its d (dv) values inside dK (dV).
        unsafe {
            T::narrow(&scr.acc_k[j * dp..j * dp + d], std::slice::from_raw_parts_mut(bp.dk.ptr().add(ko), d));
            T::narrow(&scr.acc_v[j * dvp..j * dvp + dv], std::slice::from_raw_parts_mut(bp.dv.ptr().add(vo), dv));
        }
    }
    finite
}
