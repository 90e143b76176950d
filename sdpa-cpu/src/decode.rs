//! `splitkv` for decoding: a few query rows per kv head (at most `LANES / 4`), many keys. The work is a
//! stream over K and V, so it is cut the way memory lies, not by head: the (part, batch, kv head, key
//! block) units are put in memory order (head-major for BHSD, where a head's keys are contiguous;
//! key-major for BSHD, where one key's heads are), and each worker takes a contiguous run of units. A
//! ragged batch's sequences are parts of their own lengths. A paged cache walks key-major in blocks of at
//! most a page (at least 16 keys), so one block's units read each page whole, head after head; a block that
//! crosses pages is read in place a page at a time ([`segments`]). Runs are cut where the keys split evenly across
//! the whole batch, so a batch mixing 100-token and 100k-token caches keeps every thread busy. A unit is a block
//! of `BLOCK_*` keys of one kv head, the blocks covering only the keys the rows see by position (causal
//! mask and window): scores by dot products along the head dim, softcap and ALiBi, mask, online softmax
//! and P·V on that head's running state; f32 and bf16 K and V are read in place (bf16 widened in registers),
//! f16 is widened into scratch. While a unit walks its rows it prefetches the next unit's rows into L2,
//! one row per row read, so the requests run exactly one unit ahead and spread evenly (a burst per unit
//! measured slower; BSHD rows are scattered pieces the hardware prefetcher does not follow across
//! pages). Each run ends with normalised partial rows and their LSE for every head it touched, merged by
//! sdpa-core's `merge_normalized`. More runs than threads leave room for work stealing when another
//! process takes a core.
//!
//! Measured limit (`bench/results/cpu/cpu.md`): on BSHD the rate follows the row size, not the bytes (D = 256
//! f32 rows of 1 KiB stream at about 80 % of the read ceiling, 512-byte rows at about 70 %, 128-byte bf16
//! rows at about 35 %): each key of a head is its own scattered piece of memory there.

use crate::element::{widen_with, CpuElement};
use crate::fa2::{key_span, lanes, normalize_row, KeySpan};
use crate::micro::{self, Shadow, SoftmaxExp};
use crate::nonfinite::{self, ProbTile};
use crate::problem::{round_up, MaskSel, Problem, SharedMut};
use crate::simd::{dispatch, Simd, SimdKernel, SimdPath};
use rayon::prelude::*;
use sdpa_core::softmax::merge_normalized;

/// Keys per unit for f32 and bf16 K and V, read in place: long enough to amortise a unit's softmax step
/// and state update (16 and 64 measured alike on BSHD; 64 is ahead on BHSD).
const BLOCK_IN_PLACE: usize = 64;
/// Keys per unit for f16, widened to f32 scratch first: K and V scratch (2 × 16 × D f32) stay in L1.
const BLOCK_WIDENED: usize = 16;
/// Runs per thread: more than one, so that a thread that another process holds up loses its last runs to
/// the others instead of holding up the call.
const RUNS_PER_THREAD: usize = 8;
/// Least K and V bytes per run.
const MIN_RUN_BYTES: usize = 512 << 10;

/// Whether a call takes this path: rows per kv head few enough for dot products (as `fa2` decides for its
/// items), on a SIMD path; for a ragged batch, in every sequence.
pub(crate) fn applies<T: CpuElement>(ps: &[Problem<'_, T>], path: SimdPath) -> bool {
    let l = lanes(path);
    l >= 8 && ps.iter().all(|p| p.group_rows() * 4 <= l)
}

/// One unit: keys `j0..j1` of kv head `kvh` of batch `b` of part `pi`, accumulated into head `hd`
/// (numbered across all parts and batches); its first key at `koff`/`voff`.
#[derive(Debug, Clone, Copy)]
struct Unit {
    pi: usize,
    b: usize,
    kvh: usize,
    hd: usize,
    j0: usize,
    j1: usize,
    koff: usize,
    voff: usize,
}

/// The call as the runs see it.
struct Plan {
    block: usize,
    /// Rows per head slot: the most of any part (a part's heads use their first `group · Sq` of them).
    nr: usize,
    dp: usize,
    dvp: usize,
    units: Vec<Unit>,
    /// Per part, the keys its rows see by position (causal mask and window): units cover `lo..hi` only,
    /// so keys outside the band are never read.
    spans: Vec<KeySpan>,
}

/// The units of every part in memory order: per batch, head-major (BHSD, where a head's keys are
/// contiguous) or key-major (BSHD, where one key's heads are); blocks of `block` keys (in a paged cache
/// they may cross pages: the run walks them a page at a time, [`segments`]).
fn units_of<T: CpuElement>(ps: &[Problem<'_, T>], spans: &[KeySpan], block: usize) -> Vec<Unit> {
    let mut units = Vec::new();
    let mut hd0 = 0;
    for (pi, p) in ps.iter().enumerate() {
        let span = spans[pi];
        // A paged cache walks key-major too, in either layout: the units of one block then read each of
        // its pages whole, head after head (HND pages hold one head's slots together, so head-major order
        // would read small pieces of many pages).
        let key_major = p.k_st.h < p.k_st.s || p.pages.is_some();
        // Block boundaries: every `block` keys from the span's start.
        // In a paged cache, blocks of at most a page: a block's units (one per head, key-major) then read
        // one page whole before the next (measured: HND pages of 16, 71 % against 59 % of the read ceiling
        // with 64-key blocks across four pages; NHD 42 % against 33 %).
        // Tiny pages still make blocks of 16 keys, walked a page at a time, not one unit per key.
        let block = p.pages.map_or(block, |pg| block.min(pg.size.max(16)));
        let blocks: Vec<(usize, usize)> =
            (span.lo..span.hi).step_by(block).map(|j| (j, (j + block).min(span.hi))).collect();
        let hkv = p.hkv();
        for b in 0..p.b {
            let mut push = |kvh: usize, (j0, j1): (usize, usize)| {
                let (koff, voff) = (p.k_row(b, kvh, j0), p.v_row(b, kvh, j0));
                units.push(Unit { pi, b, kvh, hd: hd0 + b * hkv + kvh, j0, j1, koff, voff });
            };
            if key_major {
                for &blk in &blocks {
                    (0..hkv).for_each(|kvh| push(kvh, blk));
                }
            } else {
                for kvh in 0..hkv {
                    blocks.iter().for_each(|&blk| push(kvh, blk));
                }
            }
        }
        hd0 += p.b * hkv;
    }
    units
}

/// Runs the call: every run on the pool, then the merge.
pub(crate) fn run_decode<T: CpuElement>(ps: &[Problem<'_, T>], path: SimdPath, threads: usize) {
    let Some(p0) = ps.first() else { return };
    let l = lanes(path);
    let (d, dv) = (p0.d, p0.dv);
    let nr = ps.iter().map(Problem::group_rows).max().unwrap_or(1);
    let block = if T::as_f32(p0.k).is_some() || T::as_bf16(p0.k).is_some() { BLOCK_IN_PLACE } else { BLOCK_WIDENED };
    // Every kv head's rows have the same positions (those of kv head 0).
    let spans: Vec<KeySpan> =
        ps.iter().map(|p| key_span(p, (0..p.group_rows()).map(|r| p.row(0, r).1), 0, p.sk)).collect();
    // Each head (part, batch, kv head) in order, as (part, batch, kv head).
    let heads: Vec<(usize, usize, usize)> = ps
        .iter()
        .enumerate()
        .flat_map(|(pi, p)| (0..p.b).flat_map(move |b| (0..p.hkv()).map(move |kvh| (pi, b, kvh))))
        .collect();
    let plan = Plan { block, nr, dp: round_up(d, l), dvp: round_up(dv, l), units: units_of(ps, &spans, block), spans };
    // Q rows of every head, scaled once, zero-padded to the vector width.
    let mut q = vec![0.0f32; heads.len() * nr * plan.dp];
    for (hd, &(pi, b, kvh)) in heads.iter().enumerate() {
        let p = &ps[pi];
        for r in 0..p.group_rows() {
            let (h, i) = p.row(kvh, r);
            let off = p.q_st.offset(b, h, i);
            let dst = &mut q[(hd * nr + r) * plan.dp..][..d];
            T::widen(&p.q[off..off + d], dst);
            dst.iter_mut().for_each(|x| *x *= p.scale);
        }
    }
    // Runs of at least MIN_RUN_BYTES of K and V each (fewer partials to write and merge on small calls),
    // at least one per thread, at most RUNS_PER_THREAD per thread and one per unit; cut where the keys
    // (plus a unit's fixed cost) split evenly, so sequences of any mix of lengths balance.
    let weight = |u: &Unit| u.j1 - u.j0 + 8;
    let total_w: usize = plan.units.iter().map(weight).sum();
    let keys: usize = plan.units.iter().map(|u| u.j1 - u.j0).sum();
    let kv_bytes = keys * (d + dv) * std::mem::size_of::<T>();
    let runs = (kv_bytes / MIN_RUN_BYTES).clamp(threads, RUNS_PER_THREAD * threads).min(plan.units.len()).max(1);
    let mut cuts = Vec::with_capacity(runs + 1);
    cuts.push(0);
    let mut acc = 0;
    for (u, unit) in plan.units.iter().enumerate() {
        acc += weight(unit);
        // Cut after unit u when the weight so far passes the next run's share.
        if cuts.len() < runs && acc * runs >= cuts.len() * total_w {
            cuts.push(u + 1);
        }
    }
    while cuts.len() <= runs {
        cuts.push(plan.units.len());
    }
    // Each run keeps state and writes partials only for the heads it touches (on BHSD a few per run), so
    // the partials stay about the size of the output however many runs there are.
    let spans: Vec<Span> = {
        let mut slot0 = 0;
        cuts.windows(2)
            .map(|w| {
                let (u0, u1) = (w[0], w[1]);
                let touched = plan.units[u0..u1].iter().map(|u| u.hd);
                let (h0, h1) = match (touched.clone().min(), touched.max()) {
                    (Some(a), Some(b)) => (a, b + 1),
                    _ => (0, 0),
                };
                let span = Span { u0, u1, h0, h1, slot0 };
                slot0 += (h1 - h0) * nr;
                span
            })
            .collect()
    };
    let total = spans.last().map_or(0, |sp| sp.slot0 + (sp.h1 - sp.h0) * nr);
    let mut part_o = vec![0.0f32; total * dv];
    let mut part_lse = vec![f32::NEG_INFINITY; total];
    let (po, pl) = (SharedMut(part_o.as_mut_ptr()), SharedMut(part_lse.as_mut_ptr()));
    spans.par_iter().with_max_len(1).for_each(|&span| {
        for careful in [false, true] {
            let run = Run { ps, plan: &plan, q: &q, span, part_o: po, part_lse: pl, careful };
            if dispatch(path, run) {
                break;
            }
        }
    });
    let (part_o, part_lse, spans) = (&part_o, &part_lse, &spans);
    heads.par_iter().enumerate().for_each_init(
        || (vec![0.0f32; dv], Vec::with_capacity(runs)),
        |(out, parts), (hd, &(pi, b, kvh))| {
            let p = &ps[pi];
            for r in 0..p.group_rows() {
                parts.clear();
                parts.extend(spans.iter().filter(|sp| (sp.h0..sp.h1).contains(&hd)).map(|sp| {
                    let slot = sp.slot0 + (hd - sp.h0) * nr + r;
                    (&part_o[slot * dv..(slot + 1) * dv], part_lse[slot])
                }));
                let lse = merge_normalized(parts, out);
                let (h, i) = p.row(kvh, r);
                // SAFETY: each row is merged and written by exactly one task.
                unsafe { p.write_row(b, h, i, out, lse) };
            }
        },
    );
}

/// One run: units `u0..u1`, touching heads `h0..h1`, whose partials go to slots `slot0..` (one per head
/// and row, head-major).
#[derive(Debug, Clone, Copy)]
struct Span {
    u0: usize,
    u1: usize,
    h0: usize,
    h1: usize,
    slot0: usize,
}

/// One run (`span`), on the pool.
struct Run<'r, 'a, T> {
    ps: &'r [Problem<'a, T>],
    plan: &'r Plan,
    q: &'r [f32],
    span: Span,
    part_o: SharedMut<f32>,
    part_lse: SharedMut<f32>,
    careful: bool,
}

impl<T: CpuElement> SimdKernel for Run<'_, '_, T> {
    /// False, having written nothing, when not careful and a state came out non-finite.
    type Output = bool;

    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> bool {
        let pl = self.plan;
        let (d, dv, nrs, dp, dvp) = (self.ps[0].d, self.ps[0].dv, pl.nr, pl.dp, pl.dvp);
        let sp = self.span;
        let nh = sp.h1 - sp.h0;
        let mut m = vec![f32::NEG_INFINITY; nh * nrs];
        let mut l = vec![0.0f32; nh * nrs];
        let mut acc = vec![0.0f32; nh * nrs * dvp];
        let mut alpha = [0.0f32; 16];
        let mut st = vec![0.0f32; nrs * pl.block];
        // K is widened into scratch for f16 (and bf16 in careful mode); V also for f32 in careful mode.
        let k0 = self.ps[0].k;
        let widens = T::as_f32(k0).is_none() && (self.careful || T::as_bf16(k0).is_none());
        let mut kp = if widens { vec![0.0f32; pl.block * dp] } else { Vec::new() };
        let mut vp = if widens || self.careful { vec![0.0f32; pl.block * dvp] } else { Vec::new() };
        let (mut neg_slope, mut diag) = ([0.0f32; 16], [0.0f32; 16]);

        let mut segs = [(0usize, 0usize, 0usize, 0usize); MAX_SEGMENTS];
        let mut next_segs = [(0usize, 0usize, 0usize, 0usize); MAX_SEGMENTS];
        for u in sp.u0..sp.u1 {
            let unit = pl.units[u];
            let p = &self.ps[unit.pi];
            let nr = p.group_rows();
            let nseg = segments(p, &unit, &mut segs);
            // The next unit's pieces, for the prefetch (only when this one is walked a page at a time).
            let nnext = match pl.units.get(u + 1) {
                Some(n) if nseg > 1 && u + 1 < sp.u1 => segments(&self.ps[n.pi], n, &mut next_segs),
                _ => 0,
            };
            let shadows = |x: usize| {
                let at = (x < nnext).then(|| next_segs[x]);
                (
                    shadow(self.ps, pl, u, sp.u1, true, d, at.map(|a| a.2)),
                    shadow(self.ps, pl, u, sp.u1, false, dv, at.map(|a| a.3)),
                )
            };
            let Unit { b, kvh, hd, j0, j1, .. } = unit;
            let nk = j1 - j0;
            let (kf, vf) = (T::as_f32(p.k), T::as_f32(p.v));
            // bf16 K and V are read in place, widened in registers; the careful mode widens into scratch.
            let (kb, vb) = match (self.careful, T::as_bf16(p.k), T::as_bf16(p.v)) {
                (false, Some(kb), Some(vb)) => (Some(kb), Some(vb)),
                _ => (None, None),
            };
            let explicit = matches!(p.mask, MaskSel::Explicit { .. });
            // This head's place in the run's state.
            let sh = hd - sp.h0;
            let stp = st.as_mut_ptr();
            // Scores of the nr rows against `$n` keys read from `$k` at row stride `$ks`, into `st` from
            // column `$c`.
            macro_rules! scores {
                ($k:expr, $ks:expr, $n:expr, $c:expr, $sh:expr) => {{
                    let (q, k, ks, n, stc, ksh) =
                        (self.q[hd * nrs * dp..].as_ptr(), $k, $ks, $n, stp.wrapping_add($c), $sh);
                    // SAFETY: the Q rows hold dp values each (zero past d); the n K rows hold d values at
                    // stride ks; `st` holds nr rows of `block` >= c + n values.
                    unsafe {
                        match nr {
                            4 => micro::dot_scores_rows::<_, _, 4>(s, d, q, dp, k, ks, n, stc, pl.block, ksh),
                            3 => micro::dot_scores_rows::<_, _, 3>(s, d, q, dp, k, ks, n, stc, pl.block, ksh),
                            2 => micro::dot_scores_rows::<_, _, 2>(s, d, q, dp, k, ks, n, stc, pl.block, ksh),
                            _ => {
                                for r in 0..nr {
                                    let sh = if r == 0 { ksh } else { None };
                                    micro::dot_scores(s, d, q.add(r * dp), k, ks, n, stc.add(r * pl.block), 1, sh);
                                }
                            }
                        }
                    }
                }};
            }
            for (x, &(a0, a1, ko, _)) in segs[..nseg].iter().enumerate() {
                let ksh = shadows(x).0;
                match (kf, kb) {
                    (Some(kf), _) => scores!(kf[ko..].as_ptr(), p.k_st.s, a1 - a0, a0 - j0, ksh),
                    (None, Some(kb)) => scores!(kb[ko..].as_ptr(), p.k_st.s, a1 - a0, a0 - j0, ksh),
                    (None, None) => {
                        for j in 0..a1 - a0 {
                            let at = (a0 - j0 + j) * dp;
                            widen_with(s, p.k, ko + j * p.k_st.s, &mut kp[at..at + d]);
                        }
                    }
                }
            }
            if kf.is_none() && kb.is_none() {
                scores!(kp.as_ptr(), dp, nk, 0, None)
            }
            let mut rows = [(0usize, 0usize); 16];
            for (r, x) in rows.iter_mut().enumerate().take(nr) {
                *x = p.row(kvh, r);
            }
            let rows = &rows[..nr];
            if !p.mods.is_plain() {
                p.mods.row_consts(rows, &mut neg_slope, &mut diag);
                // SAFETY: every (key, row) of the block is inside `st` (row stride `block`).
                unsafe { p.mods.apply(s, &neg_slope, &diag, j0, nk, nr, stp, 1, pl.block) };
            }
            if explicit || pl.spans[unit.pi].needs_mask(j0, j1) {
                // SAFETY: every (key, row) of the block is inside `st` (row stride `block`).
                unsafe { p.apply_mask(b, rows, j0, j1, stp, 1, pl.block) };
            }
            let (ms, ls) = (&mut m[sh * nrs..sh * nrs + nr], &mut l[sh * nrs..sh * nrs + nr]);
            // SAFETY: nr rows of nk scores at row stride `block`; the state slices hold nr values.
            unsafe {
                micro::online_softmax_rows(s, SoftmaxExp::for_output::<T>(), stp, pl.block, nk, nr, ms, ls, &mut alpha)
            };
            let o = acc[sh * nrs * dvp..].as_mut_ptr();
            // V read in place (bf16, or f32 outside careful mode): a piece at a time, the first rescaling
            // the state by alpha, the others accumulating onto it.
            macro_rules! pv_in_place {
                ($v:expr) => {{
                    for (x, &(a0, a1, _, vo)) in segs[..nseg].iter().enumerate() {
                        let al = if x == 0 { Some(alpha.as_ptr()) } else { None };
                        let (vptr, vsh) = ($v[vo..].as_ptr(), shadows(x).1);
                        // SAFETY: P is nr rows of the piece's keys at row stride `block` from column
                        // a0 - j0; its V rows hold dv values at stride v_st.s; this head's state is nr
                        // rows of dvp.
                        unsafe {
                            micro::pv(
                                s,
                                a1 - a0,
                                stp.add(a0 - j0),
                                1,
                                pl.block,
                                vptr,
                                p.v_st.s,
                                nr,
                                dv,
                                o,
                                dvp,
                                al,
                                vsh,
                            )
                        };
                    }
                }};
            }
            match (vb, vf) {
                (Some(vb), _) => {
                    pv_in_place!(vb);
                    continue;
                }
                (None, Some(vf)) if !self.careful => {
                    pv_in_place!(vf);
                    continue;
                }
                _ => {}
            }
            // Careful mode, or f16: V rows gathered (widened) into scratch, then screened.
            for &(a0, a1, _, vo) in &segs[..nseg] {
                for j in 0..a1 - a0 {
                    let at = (a0 - j0 + j) * dvp;
                    widen_with(s, p.v, vo + j * p.v_st.s, &mut vp[at..at + dv]);
                }
            }
            let (vptr, vs) = (vp.as_ptr(), dvp);
            // Careful mode: V rows with NaN or inf leave the product and come back only where attended.
            // SAFETY: V rows j0..j1 hold dv values at stride vs.
            let screened = unsafe { nonfinite::ScreenedV::new(self.careful, vptr, vs, nk, dv, dvp) };
            let (vptr, vs) = screened.tile(vptr, vs, dvp);
            // SAFETY: P is nr rows of nk at row stride `block`; V as above; this head's state is nr rows of dvp.
            unsafe { micro::pv(s, nk, stp, 1, pl.block, vptr, vs, nr, dv, o, dvp, Some(alpha.as_ptr()), None) };
            let prob = ProbTile { pt: stp, ps: 1, pr: pl.block };
            // SAFETY: P and the state rows as for the product above.
            unsafe { screened.add_back(p, b, rows, j0, prob, o, dvp) };
        }

        if !self.careful && !nonfinite::all_finite(s, &acc) {
            return false;
        }
        for slot in 0..nh * nrs {
            let row = &mut acc[slot * dvp..slot * dvp + dv];
            let lse = normalize_row(row, m[slot], l[slot]);
            let at = sp.slot0 + slot;
            // SAFETY: the partial buffers hold every span's slots of dv values; this run's are its own.
            unsafe {
                std::ptr::copy_nonoverlapping(row.as_ptr(), self.part_o.0.add(at * dv), dv);
                *self.part_lse.0.add(at) = lse;
            }
        }
        true
    }
}

/// Most pieces one unit is cut into (a page of one slot: one per key).
const MAX_SEGMENTS: usize = BLOCK_IN_PLACE;

/// Keys `j0..j1` of a unit (at most [`MAX_SEGMENTS`]) as runs that lie at one stride: `(first key, end,
/// K offset, V offset)`; one run unless the unit crosses pages. Returns how many runs were written.
#[inline(always)]
fn segments<T: CpuElement>(
    p: &Problem<'_, T>,
    u: &Unit,
    out: &mut [(usize, usize, usize, usize); MAX_SEGMENTS],
) -> usize {
    let Some(pg) = p.pages else {
        out[0] = (u.j0, u.j1, u.koff, u.voff);
        return 1;
    };
    let (mut n, mut j) = (0, u.j0);
    while j < u.j1 && n < MAX_SEGMENTS {
        let end = ((j / pg.size + 1) * pg.size).min(u.j1);
        out[n] = (j, end, p.k_row(u.b, u.kvh, j), p.v_row(u.b, u.kvh, j));
        n += 1;
        j = end;
    }
    n
}

/// What unit `u` prefetches of K (`keys`) or V while it walks its own rows: the next unit's rows (on
/// BSHD, the same keys of the next head), `width` elements each, from `off` (the next unit's first key,
/// or for a unit walked a page at a time, its piece of the same rank). `None` at the end of the run.
#[inline(always)]
fn shadow<T: CpuElement>(
    ps: &[Problem<'_, T>],
    pl: &Plan,
    u: usize,
    u1: usize,
    keys: bool,
    width: usize,
    off: Option<usize>,
) -> Option<Shadow> {
    let esize = std::mem::size_of::<T>();
    let next = pl.units.get(u + 1).filter(|_| u + 1 < u1)?;
    // The next unit may belong to another part, whose slices start elsewhere.
    let np = &ps[next.pi];
    let (base, first, stride) =
        if keys { (np.k.as_ptr(), next.koff, np.k_st.s) } else { (np.v.as_ptr(), next.voff, np.v_st.s) };
    Some(Shadow {
        base: base.cast::<u8>().wrapping_add(off.unwrap_or(first) * esize),
        stride: stride * esize,
        lines: (width * esize).div_ceil(64),
    })
}
