//! The fused backward (`fa2`): dQ, dK and dV from Q, K, V, O, dO and the forward's LSE, in the
//! FlashAttention-2 style, without ever holding a score matrix.
//!
//! Three passes over rayon, each writing only what it owns, so the result is bitwise the same for any
//! thread count and schedule (the backend reports `deterministic: true` always):
//! 1. `Delta = rowsum(dO ∘ O)` per query row (`delta`, O(B·Hq·Sq) f32 like the LSE);
//! 2. one item per (batch, kv head, block of key tiles) (`dkdv`): for every query tile whose rows see a key
//!    of the block (packed once for the block), and every key tile of the block its rows see (pairs outside
//!    the band of the causal mask and window are skipped; GQA: the query tiles of all heads of the group),
//!    P is recomputed from the LSE, `dV += Pᵀ·dO`, `dP = dO·Vᵀ`,
//!    `dS = P ∘ (dP − Delta)` (times the softcap's `1 − (s0/cap)²`), `dK += dSᵀ·Q·scale`; the block's
//!    dK and dV accumulate in scratch and are written once;
//! 3. one item per (batch, kv head, query tile) (`dq`): the same P and dS recomputed per key tile of the
//!    band, `dQ += dS·K·scale`, written once (and in f32 to the `dq_accum` buffer when asked).
//!
//! Recomputing S and dP in pass 3 costs 7 products of 5 (the cost model counts 5), the price of a dQ with
//! no write conflicts, no atomics and O(threads × tile) scratch. When the (batch, kv head) groups fill the
//! threads (two per thread), the fused schedule (`run_fused`) runs instead: one item per group walks all of
//! its key blocks as in pass 2 and also accumulates `dQ += dS·K` into an f32 buffer of the group's rows
//! (O(threads × Hq/Hkv·Sq·D), at most half of Q in f32), so 5 products, no pass 3. Each dQ element sums
//! the same products in the same key order either way, so both schedules give the same bits.
//!
//! Every product is one of the forward's SIMD micro-kernels (`micro::scores` for Sᵀ and dPᵀ, `micro::pv`
//! with transposed strides for the three gradient products: `micro::gemm_acc`, `dq::dq_product`); inputs
//! are widened to f32 per tile, accumulation is f32, each output rounds once. A masked pair has P = 0 and
//! dS = 0 exactly. Non-finite inputs: NaN/inf in V under a masked key stays out (dS is set to 0 where
//! P = 0); NaN/inf in Q, K or dO would reach rows or keys that only share a tile with it through `0 · NaN`
//! in the tile products, so an item whose gradients come out non-finite runs again with products over
//! visible pairs only (`tile::careful_product`), as the forward's `nonfinite` re-run does.

mod dkdv;
mod dq;
mod scratch;
mod tile;

use crate::element::CpuElement;
use crate::fa2::{all_row_tiles, RowTile};
use crate::problem::{Problem, SharedMut};
use crate::simd::SimdPath;
use crate::variants::ScoreMods;
use rayon::prelude::*;
pub(crate) use scratch::BwdTiles;
use scratch::{with_scratch, BwdKey};
use sdpa_core::{AttentionSpec, Operand, Result};

/// The gradient side of one part (a dense call, or one sequence of a ragged batch; `Problem::parts`).
pub(crate) struct BwdPart<'a, T> {
    /// Q, K, V, the mask, band, variants and strides; `p.o_st` are O's (and dO's) strides.
    pub p: Problem<'a, T>,
    /// The forward's output and the upstream gradient, from the part's first row, at O's strides.
    pub o: &'a [T],
    pub d_o: &'a [T],
    /// The forward's LSE from the part's first row: row `(b, h, i)` at `b·p.lse_st.0 + h·p.lse_st.1 + i`.
    pub lse: &'a [f32],
    /// Gradients from the part's first row (dQ at Q's strides, dK at K's, dV at V's).
    pub dq: SharedMut<T>,
    pub dk: SharedMut<T>,
    pub dv: SharedMut<T>,
    /// dQ in f32 at Q's strides, when asked.
    pub dq_accum: Option<SharedMut<f32>>,
    /// `rowsum(dO ∘ O)` of row `(b, h, i)` at `(b·hq + h)·sq + i` (pass 1).
    pub delta: Vec<f32>,
    /// The softcap alone and ALiBi alone (the softcap's derivative needs the capped score before ALiBi).
    pub cap_only: ScoreMods,
    pub alibi_only: ScoreMods,
}

/// The operands of one backward call on host slices ([`crate::attention_backward`]), each laid out by the
/// spec's strides exactly as the forward's: `q`, `k`, `v`, `mask` as [`crate::attention`] takes them (for a
/// ragged batch packed as [`crate::attention_ragged`] takes them), `o` and `d_o` at O's strides, `lse` the
/// forward's f32 log-sum-exp (`[B, Hq, Sq]`, or `[Hq, total_q]` for a ragged batch). The gradients are
/// written: `dq` at Q's strides, `dk` at K's, `dv` at V's, and `dq_accum` (f32, Q's strides) when given.
/// Every element the strides address is written (zeros where no key or row reaches it); nothing else is.
#[derive(Debug)]
pub struct BackwardSlices<'a, T> {
    /// Queries.
    pub q: &'a [T],
    /// Keys.
    pub k: &'a [T],
    /// Values.
    pub v: &'a [T],
    /// The explicit additive f32 mask, when the spec has one.
    pub mask: Option<&'a [f32]>,
    /// The forward's output.
    pub o: &'a [T],
    /// The gradient of the loss with respect to O.
    pub d_o: &'a [T],
    /// The forward's log-sum-exp.
    pub lse: &'a [f32],
    /// Written: the gradient with respect to Q.
    pub dq: &'a mut [T],
    /// Written: the gradient with respect to K (summed over the query heads of each kv head's group).
    pub dk: &'a mut [T],
    /// Written: the gradient with respect to V (summed likewise).
    pub dv: &'a mut [T],
    /// Written when given: dQ in f32 before rounding (Q's strides).
    pub dq_accum: Option<&'a mut [f32]>,
}

/// The parts of a validated call (lengths checked by the caller, K/V not paged) with their gradient
/// pointers.
pub(crate) fn parts<'a, T: CpuElement>(spec: &AttentionSpec, x: BackwardSlices<'a, T>) -> Result<Vec<BwdPart<'a, T>>> {
    // The forward's output slots are not used: the backward reads O and writes dQ/dK/dV itself.
    let ps = Problem::parts(spec, x.q, x.k, x.v, x.mask, &mut [], None, None)?;
    let (dq, dk, dv) = (x.dq.as_mut_ptr(), x.dk.as_mut_ptr(), x.dv.as_mut_ptr());
    let dq_accum = x.dq_accum.map(|a| a.as_mut_ptr());
    let tail = |s: &'a [T], off: usize| s.get(off..).unwrap_or(&[]);
    Ok(ps
        .into_iter()
        .map(|p| {
            let (qo, oo) = (p.q_row0 * p.q_st.s, p.q_row0 * p.o_st.s);
            let (ko, vo) = (p.k_row0 * p.k_st.s, p.k_row0 * p.v_st.s);
            let cap_only = ScoreMods { neg_slopes: None, ..p.mods.clone() };
            let alibi_only = ScoreMods { softcap: None, ..p.mods.clone() };
            BwdPart {
                o: tail(x.o, oo),
                d_o: tail(x.d_o, oo),
                lse: x.lse.get(p.q_row0..).unwrap_or(&[]),
                // `wrapping_add`: offsets inside the validated extent; rows are written only there.
                dq: SharedMut(dq.wrapping_add(qo)),
                dk: SharedMut(dk.wrapping_add(ko)),
                dv: SharedMut(dv.wrapping_add(vo)),
                dq_accum: dq_accum.map(|a| SharedMut(a.wrapping_add(qo))),
                delta: Vec::new(),
                cap_only,
                alibi_only,
                p,
            }
        })
        .collect())
}

/// Zeroes the dK and dV rows of the sequences of a ragged batch that have keys but no query row (no part
/// covers them: `Problem::parts` leaves such sequences out).
pub(crate) fn zero_keys_without_queries<T: CpuElement>(spec: &AttentionSpec, dk: &mut [T], dv: &mut [T]) {
    let Some(r) = &spec.ragged else { return };
    let zero = T::from_f32(0.0);
    for seq in r.seqs().iter().filter(|s| s.sq == 0) {
        for h in 0..spec.shape.hkv {
            for j in 0..seq.sk {
                let ko = spec.kv_offset(Operand::K, None, seq, 0, h, j);
                let vo = spec.kv_offset(Operand::V, None, seq, 0, h, j);
                dk[ko..ko + spec.shape.d].fill(zero);
                dv[vo..vo + spec.shape.dv].fill(zero);
            }
        }
    }
}

/// Pass 1: `Delta = rowsum(dO ∘ O)` of every row of every part, in f32 (in order along the row).
fn compute_delta<T: CpuElement>(parts: &mut [BwdPart<'_, T>]) {
    parts.par_iter_mut().for_each(|bp| {
        let p = &bp.p;
        let (hq, sq, dv) = (p.hq, p.sq, p.dv);
        let mut delta = vec![0.0f32; p.b * hq * sq];
        delta.par_chunks_mut(sq).enumerate().for_each_init(
            || (vec![0.0f32; dv], vec![0.0f32; dv]),
            |(a, o), (bh, out)| {
                let (b, h) = (bh / hq, bh % hq);
                for (i, x) in out.iter_mut().enumerate() {
                    let off = p.o_st.offset(b, h, i);
                    T::widen(&bp.d_o[off..off + dv], a);
                    T::widen(&bp.o[off..off + dv], o);
                    *x = a.iter().zip(o.iter()).fold(0.0f32, |s, (x, y)| x.mul_add(*y, s));
                }
            },
        );
        bp.delta = delta;
    });
}

/// One (part, batch, kv head) and its row tiles (a range of [`all_row_tiles`]' list).
type Group = (usize, usize, usize, std::ops::Range<usize>);

/// The row tiles of one (part, batch, kv head): a range of the list [`all_row_tiles`] returns (it walks
/// parts, batches and kv heads in order).
fn tile_groups(rts: &[RowTile]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for (n, &(pi, b, kvh, ..)) in rts.iter().enumerate() {
        match groups.last_mut() {
            Some(g) if (g.0, g.1, g.2) == (pi, b, kvh) => g.3.end = n + 1,
            _ => groups.push((pi, b, kvh, n..n + 1)),
        }
    }
    groups
}

/// Runs the three passes on the current rayon pool.
pub(crate) fn run_backward<T: CpuElement>(parts: &mut [BwdPart<'_, T>], path: SimdPath) {
    let Some(first) = parts.first() else { return };
    let base = BwdTiles::for_path(path);
    let key_tiles: usize = parts.iter().map(|bp| bp.p.b * bp.p.hkv() * bp.p.sk.div_ceil(base.bc)).sum();
    let tiles = base.for_threads(key_tiles, rayon::current_num_threads());
    let key = BwdKey { path, tiles, d: first.p.d, dv: first.p.dv };
    compute_delta(parts);
    let parts = &*parts;
    let problems: Vec<Problem<'_, T>> = parts.iter().map(|bp| bp.p.clone()).collect();
    let rts = all_row_tiles(&problems, tiles.br);
    let groups = tile_groups(&rts);

    if fused_fits(parts, &groups, rayon::current_num_threads()) {
        run_fused(parts, path, key, &rts, &groups);
        return;
    }
    // Pass 2: one item per block of key tiles of every (part, batch, kv head), heaviest first (the query
    // tiles it meets), so that causal calls end on light items.
    let block = tiles.bc * tiles.kblock;
    let mut items: Vec<(usize, usize, usize)> = Vec::new();
    for (g, (pi, ..)) in groups.iter().enumerate() {
        let sk = parts[*pi].p.sk;
        for kt in (0..sk.div_ceil(tiles.bc)).step_by(tiles.kblock) {
            let (j0, j1) = (kt * tiles.bc, (kt * tiles.bc + block).min(sk));
            let meets = rts[groups[g].3.clone()].iter().filter(|t| t.5.lo < j1 && t.5.hi > j0).count();
            items.push((meets, g, kt));
        }
    }
    items.sort_by_key(|&(w, ..)| std::cmp::Reverse(w));
    items.par_iter().with_max_len(1).for_each(|&(_, g, kt)| {
        let (pi, b, kvh, range) = &groups[g];
        let (bp, rts) = (&parts[*pi], &rts[range.clone()]);
        let item = dkdv::KeyTile { bp, tiles, rts, b: *b, kvh: *kvh, kt, dq: None, careful: false };
        with_scratch(key, |scr| dkdv::run(path, item, scr));
    });

    // Pass 3: one item per row tile.
    let mut order: Vec<(usize, usize)> =
        rts.iter().enumerate().map(|(n, t)| (t.4 * (t.5.len() + tiles.bc), n)).collect();
    order.sort_by_key(|&(w, _)| std::cmp::Reverse(w));
    order.par_iter().with_max_len(1).for_each(|&(_, n)| {
        let rt = rts[n];
        with_scratch(key, |scr| dq::run(path, &parts[rt.0], tiles, rt, scr));
    });
}

/// f32 dQ rows one fused item may hold (256 MiB at most, whatever the thread count).
const FUSED_DQ_MAX: usize = 64 << 20;

/// Whether the fused schedule runs: enough (batch, kv head) groups to keep every thread busy (two per
/// thread; each is one item there), and each group's f32 dQ small enough to hold.
fn fused_fits<T: CpuElement>(parts: &[BwdPart<'_, T>], groups: &[Group], threads: usize) -> bool {
    let dq_len = |bp: &BwdPart<'_, T>| bp.p.group_rows() * (bp.p.d + 16);
    groups.len() >= 2 * threads && parts.iter().all(|bp| dq_len(bp) <= FUSED_DQ_MAX)
}

/// The fused schedule: one item per (part, batch, kv head), heaviest first, running pass 2 over all its
/// key blocks with dQ accumulated in an f32 buffer of the group's rows (O(threads × S) memory, 5 products
/// instead of 7), then writing dQ. Each dQ element sums the same products in the same key order as pass 3
/// (`dq::dq_product`, key tiles ascending), so the two schedules give the same bits.
fn run_fused<T: CpuElement>(parts: &[BwdPart<'_, T>], path: SimdPath, key: BwdKey, rts: &[RowTile], groups: &[Group]) {
    let tiles = key.tiles;
    let dp = crate::problem::round_up(key.d, crate::fa2::lanes(path));
    let mut order: Vec<(usize, usize)> = groups
        .iter()
        .enumerate()
        .map(|(g, grp)| (rts[grp.3.clone()].iter().map(|t| t.4 * (t.5.len() + tiles.bc)).sum(), g))
        .collect();
    order.sort_by_key(|&(w, _)| std::cmp::Reverse(w));
    order.par_iter().with_max_len(1).for_each(|&(_, g)| {
        let (pi, b, kvh, range) = &groups[g];
        let (bp, rts) = (&parts[*pi], &rts[range.clone()]);
        let mut dq = vec![0.0f32; bp.p.group_rows() * dp];
        with_scratch(key, |scr| {
            // Careful products for the whole group when the fast run left a gradient non-finite.
            for careful in [false, true] {
                dq.fill(0.0);
                let sink = SharedMut(dq.as_mut_ptr());
                let mut finite = true;
                for kt in (0..bp.p.sk.div_ceil(tiles.bc)).step_by(tiles.kblock) {
                    let item = dkdv::KeyTile { bp, tiles, rts, b: *b, kvh: *kvh, kt, dq: Some(sink), careful };
                    finite &= dkdv::run(path, item, scr);
                }
                if finite && dq.iter().all(|x| x.is_finite()) {
                    break;
                }
            }
            scr.rows.clear();
            scr.rows.extend((0..bp.p.group_rows()).map(|r| bp.p.row(*kvh, r)));
            dq::finish_rows(bp, *b, &scr.rows, &mut dq, dp);
        });
    });
}

/// Two distinct gradient elements must never share an address (dQ, dK and dV are written through Q's,
/// K's and V's strides, which the forward only reads): each stride steps over everything inside it.
pub(crate) fn check_grads_do_not_alias(spec: &AttentionSpec) -> Result<()> {
    for (op, name) in [(Operand::Q, "dq"), (Operand::K, "dk"), (Operand::V, "dv")] {
        let [b, h, s, d] = spec.extent(op);
        let st = spec.strides(op);
        let mut dims: Vec<(usize, usize)> =
            [(st.b, b), (st.h, h), (st.s, s)].into_iter().filter(|&(_, n)| n > 1).collect();
        dims.sort_unstable();
        let mut span = d;
        for (stride, n) in dims {
            if stride < span {
                return Err(sdpa_core::SdpaError::InvalidSpec(format!(
                    "the strides {st:?} of {} make distinct elements of {name} overlap (stride {stride} < span \
                     {span}): a backward writes its gradient through them",
                    op.name()
                )));
            }
            span = stride.saturating_mul(n);
        }
    }
    Ok(())
}
