//! The `fa2` work item on AMX tiles: bf16 Q, K, V; f32 scores, softmax state and output.
//!
//! An item's query rows are packed once (bf16, head dim padded to 32 with zeros). Per key block of `bc`
//! keys, K and V are packed into the B layout once ([`super::pack`]); then each group of 32 rows (two
//! tiles) runs: S = Q·Kᵀ on tiles (2 × 2 product tiles, the head dim in steps of 32), S stored row-major;
//! scale, softcap/ALiBi, mask and the online softmax on AVX-512 (the same code as the generic kernel's
//! decoding layout, keys along the lanes); P rounded to bf16 (as the GPU kernels do); the group's output
//! rows rescaled by the softmax correction; O += P·V on tiles, the output rows loaded into the product
//! tiles and stored back. The tile configuration is loaded at the start of an item and released at its end,
//! so no worker thread keeps tile state between calls.

use super::pack::{drop_v_key, pack_k, pack_v};
use super::profile::{Laps, Phase};
use super::tile::TileUnit;
use crate::aligned::Aligned;
use crate::element::CpuElement;
use crate::fa2::{end_item, Bf16Item, KeyLoop, Scratch, Tiles};
use crate::micro::{self, SoftmaxExp};
use crate::nonfinite::{self, ProbTile};
use crate::problem::{round_up, Problem};
use crate::simd::x86::{exp2_short_512 as exp2_short, Avx512};
use crate::simd::Simd;
use std::arch::x86_64::*;

/// Query rows per group: two tiles of 16.
const GROUP: usize = 32;
/// Head dims and key blocks are padded to a multiple of this: one tile row of bf16.
pub(crate) const ALIGN: usize = 32;

/// Per-worker buffers of the AMX kernel, sized by the tiles and head dims.
#[derive(Debug)]
pub(crate) struct Buffers {
    /// Packed Q rows, `dp` bf16 each (pad dims stay zero).
    q: Aligned<u16>,
    /// K block in the B layout: `dp / 2` pair rows of `bc` keys (pad pairs stay zero).
    kb: Aligned<u32>,
    /// V block in the B layout: `bc / 2` key-pair rows of `dvp` columns (pad columns stay zero).
    vb: Aligned<u32>,
    /// The block's scores, then its probabilities in f32: rows of `bc`.
    s: Aligned<f32>,
    /// The same probabilities in bf16, rows of `bc`: the A operand of P·V.
    p: Aligned<u16>,
    /// The item's output accumulator: rows of `dvp` f32.
    o: Aligned<f32>,
}

impl Buffers {
    /// Buffers for items of up to `tiles.br` rows and key blocks of `tiles.bc` keys (both multiples of 32).
    pub(crate) fn new(tiles: Tiles, d: usize, dv: usize) -> Buffers {
        let (dp, dvp, br, bc) = (round_up(d, ALIGN), round_up(dv, ALIGN), round_up(tiles.br, GROUP), tiles.bc);
        Buffers {
            q: Aligned::new(br * dp),
            kb: Aligned::new(dp / 2 * bc),
            vb: Aligned::new(bc / 2 * dvp),
            s: Aligned::new(br * bc),
            p: Aligned::new(br * bc),
            o: Aligned::new(br * dvp),
        }
    }
}

/// Runs one work item on the AMX unit. Returns false, having sent nothing, when not `careful` and an
/// accumulator came out non-finite (see `nonfinite`); true once its rows went to the sink.
///
/// # Safety
/// [`super::status`] returned `Ok` (AMX-TILE, AMX-BF16, the tile permission, AVX-512 with AVX512_BF16);
/// the job's `q`, `k`, `v` are its problem's operands (checked against the spec), K/V not paged; `scr` was
/// built for the AMX path with the job's tiles and head dims (`scr.amx` present); `tiles.bc` is a multiple
/// of 32.
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,avx512bf16")]
pub(crate) unsafe fn process_hw<T: CpuElement>(job: Bf16Item<'_, '_, T>, scr: &mut Scratch, careful: bool) -> bool {
    // SAFETY: the caller checked the CPU and the permission (`status`).
    let mut u = unsafe { super::tile::Hardware::new() };
    // SAFETY: the caller's contract, passed on.
    unsafe { process(&mut u, job, scr, careful) }
}

/// [`process_hw`] on the scalar model of the tile unit (tests on CPUs without AMX).
///
/// # Safety
/// As [`process_hw`], except that only AVX-512 with AVX512_BF16 is required.
#[cfg(test)]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,avx512bf16")]
pub(crate) unsafe fn process_emulated<T: CpuElement>(
    job: Bf16Item<'_, '_, T>,
    scr: &mut Scratch,
    careful: bool,
) -> bool {
    let mut u = super::tile::Emulated::new();
    // SAFETY: the caller's contract, passed on.
    unsafe { process(&mut u, job, scr, careful) }
}

#[inline(always)]
unsafe fn process<U: TileUnit, T: CpuElement>(
    u: &mut U,
    job: Bf16Item<'_, '_, T>,
    scr: &mut Scratch,
    careful: bool,
) -> bool {
    let Bf16Item { p, q, k, v, tiles: t, item: it, sink } = job;
    // SAFETY: the caller guarantees AVX-512 F/VL/BW/DQ, AVX2 and FMA.
    let s = unsafe { Avx512::new_unchecked() };
    let (d, dv, bc) = (p.d, p.dv, t.bc);
    let (dp, dvp) = (round_up(d, ALIGN), round_up(dv, ALIGN));
    let nr = it.nr;
    let nrp = round_up(nr, GROUP);
    let Some(mut buf) = scr.amx.take() else {
        // Not reachable: `run_item` only calls with AMX scratch. Run nothing and let the caller's second
        // (careful) attempt meet the same answer rather than panic.
        return false;
    };

    scr.rows.clear();
    scr.rows.extend((0..nr).map(|r| p.row(it.kvh, it.r0 + r)));
    let KeyLoop { span, explicit, kbase, vbase } = KeyLoop::start(p, it, scr, nrp, 0);
    {
        let qb = &mut buf.q[..];
        for (r, &(h, i)) in scr.rows.iter().enumerate() {
            let src = &q[p.q_st.offset(it.b, h, i)..][..d];
            for (x, y) in qb[r * dp..r * dp + d].iter_mut().zip(src) {
                *x = y.to_bits();
            }
        }
    }
    buf.o[..nrp * dvp].fill(0.0);
    let groups: Vec<GroupKeys> = scr.rows.chunks(GROUP).map(|rows| GroupKeys::of(p, rows)).collect();

    let (ks, vs) = (p.k_st.s, p.v_st.s);
    // Unmasked tiles of a call without softcap or ALiBi take the fused softmax (scale, max, exp, sum and
    // the rounding to bf16 in two passes over the scores); a positive scale keeps the row max unchanged by
    // scaling it.
    let plain = p.mods.is_plain() && p.scale > 0.0;
    let (qb, kb, vb, sb, pb, ob) = (buf.q.ptr(), buf.kb.ptr(), buf.vb.ptr(), buf.s.ptr(), buf.p.ptr(), buf.o.ptr());
    // SAFETY (whole loop): K and V rows j0..j1 of this kv head exist (validated spec, not paged); the
    // buffers were sized for these tiles and head dims (`Buffers::new`): Q nrp rows of dp, K dp/2 pair rows
    // of bc, V bc/2 pair rows of dvp, S and P 32 rows of bc, O nrp rows of dvp; the tile unit is configured
    // between `configure` and `release`.
    unsafe {
        u.configure();
        let mut laps = Laps::start();
        let mut j0 = span.lo;
        while j0 < span.hi {
            let j1 = (j0 + bc).min(span.hi);
            let nk = j1 - j0;
            let nkp = round_up(nk, ALIGN);
            pack_k(k.as_ptr().add(kbase + j0 * ks).cast(), ks, nk, d, kb, bc);
            pack_v(v.as_ptr().add(vbase + j0 * vs).cast(), vs, nk, dv, vb, dvp);
            // Keys past nk up to the tile edge: zero (P is zero there, but 0 · NaN from an older block is not).
            for jp in nk.div_ceil(2)..nkp / 2 {
                std::ptr::write_bytes(vb.add(jp * dvp), 0, dvp);
            }
            // Careful mode: V rows with NaN or inf leave the product and come back only where attended.
            let bad: Vec<usize> = if careful {
                (0..nk).filter(|&j| v[vbase + (j0 + j) * vs..][..dv].iter().any(|x| !x.is_finite())).collect()
            } else {
                Vec::new()
            };
            for &j in &bad {
                drop_v_key(vb, dvp, j, dv);
            }
            let vals =
                if bad.is_empty() { Vec::new() } else { nonfinite::widen_rows(v, vbase + j0 * vs, vs, dv, &bad) };
            laps.lap(Phase::Pack);

            // Three phases over all row groups, so the tile unit and the vector code hand over twice per
            // block rather than twice per group: scores, softmax (and the output rows' rescaling), P·V.
            for (gi, grp) in groups.iter().enumerate() {
                let nkg = grp.keys(j0, j1);
                if nkg > 0 {
                    scores(u, qb.add(gi * GROUP * dp), dp, kb, bc, round_up(nkg, ALIGN), sb.add(gi * GROUP * bc));
                }
            }
            laps.lap(Phase::Scores);
            for (gi, grp) in groups.iter().enumerate() {
                let nkg = grp.keys(j0, j1);
                if nkg == 0 {
                    continue;
                }
                let g = gi * GROUP;
                let (n, sg, pg) = ((nr - g).min(GROUP), sb.add(g * bc), pb.add(g * bc));
                let masked = explicit || grp.needs_mask(j0, j0 + nkg);
                let (m, l, alpha) = (&mut scr.m[g..], &mut scr.l[g..], &mut scr.alpha[g..]);
                if plain && !masked {
                    softmax_to_bf16(s, sg, pg, bc, n, nkg, round_up(nkg, ALIGN), p.scale, m, l, alpha, careful);
                } else {
                    scale_rows(s, sg, bc, n, nkg, p.scale);
                    if !p.mods.is_plain() {
                        p.mods.apply(s, &scr.neg_slope[g..], &scr.diag[g..], j0, nkg, n, sg, 1, bc);
                    }
                    if masked {
                        p.apply_mask(it.b, &scr.rows[g..g + n], j0, j0 + nkg, sg, 1, bc);
                    }
                    micro::online_softmax_rows(s, SoftmaxExp::for_output::<T>(), sg, bc, nkg, n, m, l, alpha);
                    to_bf16_rows(sg, pg, bc, n, nkg, round_up(nkg, ALIGN));
                }
                rescale_rows(s, ob.add(g * dvp), dvp, n, &scr.alpha[g..]);
            }
            laps.lap(Phase::Softmax);
            for (gi, grp) in groups.iter().enumerate() {
                let nkg = grp.keys(j0, j1);
                if nkg == 0 {
                    continue;
                }
                let g = gi * GROUP;
                pv(u, pb.add(g * bc), bc, vb, dvp, round_up(nkg, ALIGN), ob.add(g * dvp));
                if !bad.is_empty() {
                    let prob = ProbTile { pt: sb.add(g * bc), ps: 1, pr: bc };
                    let rows = &scr.rows[g..(g + GROUP).min(nr)];
                    nonfinite::add_back(p, it.b, rows, j0, &bad, &vals, prob, ob.add(g * dvp), dvp);
                }
            }
            laps.lap(Phase::Pv);
            j0 = j1;
        }
        u.release();
    }
    scr.o[..nr * dvp].copy_from_slice(&buf.o[..nr * dvp]);
    scr.amx = Some(buf);
    end_item(s, p, it, scr, dvp, sink, careful)
}

/// The keys a group of rows sees by position (the band: causal mask and window), so that each group
/// multiplies only the keys of a block some row of it sees, and masks only where one of its rows does not
/// see all of them.
#[derive(Debug, Clone, Copy)]
struct GroupKeys {
    /// Smallest first key and largest end over the rows (keys outside are seen by none).
    lo: usize,
    hi: usize,
    /// Largest first key and smallest end over the rows (keys inside are seen by all).
    in_lo: usize,
    in_hi: usize,
}

impl GroupKeys {
    fn of<T: CpuElement>(p: &Problem<'_, T>, rows: &[(usize, usize)]) -> GroupKeys {
        let mut k = GroupKeys { lo: usize::MAX, hi: 0, in_lo: 0, in_hi: usize::MAX };
        for &(_, i) in rows {
            let r = p.key_range(i);
            k.in_lo = k.in_lo.max(r.start);
            k.in_hi = k.in_hi.min(r.end);
            if !r.is_empty() {
                k.lo = k.lo.min(r.start);
                k.hi = k.hi.max(r.end);
            }
        }
        k
    }

    /// How many keys of block `j0..j1`, from `j0`, the group multiplies: up to its last visible key, none
    /// when the block lies wholly outside its band.
    fn keys(&self, j0: usize, j1: usize) -> usize {
        if self.lo >= j1 || self.hi <= j0 {
            0
        } else {
            self.hi.min(j1) - j0
        }
    }

    /// Whether keys `j0..j1` hold one some row of the group does not see by position.
    fn needs_mask(&self, j0: usize, j1: usize) -> bool {
        j0 < self.in_lo || j1 > self.in_hi
    }
}

/// `s[r·bc + j] = q[r] · k[j]` for the 32 rows of a group (`q`: rows of `dp` bf16) and keys `j < nkp`
/// (`kb`: the packed block), two by two product tiles.
///
/// # Safety
/// Inside `process`'s configured tile unit and buffers.
#[inline(always)]
pub(super) unsafe fn scores<U: TileUnit>(
    u: &mut U,
    q: *mut u16,
    dp: usize,
    kb: *mut u32,
    bc: usize,
    nkp: usize,
    s: *mut f32,
) {
    // SAFETY: each 32-key column block stays inside the group's Q rows, the K block and the group's S rows.
    unsafe {
        for jt in (0..nkp).step_by(32) {
            block_2x2(u, q.cast(), dp * 2, kb.add(jt).cast(), bc * 4, dp / 32, s.add(jt).cast(), bc * 4, false);
        }
    }
}

/// `o[r·dvp + c] += Σ_j p[r·bc + j] · v[j][c]` for the 32 rows of a group, keys `j < nkp` (`vb`: the packed
/// block), every column `c < dvp`.
///
/// # Safety
/// Inside `process`'s configured tile unit and buffers.
#[inline(always)]
pub(super) unsafe fn pv<U: TileUnit>(
    u: &mut U,
    p: *mut u16,
    bc: usize,
    vb: *mut u32,
    dvp: usize,
    nkp: usize,
    o: *mut f32,
) {
    // SAFETY: each 32-column block stays inside the group's P rows, the V block and the group's O rows.
    unsafe {
        for ct in (0..dvp).step_by(32) {
            block_2x2(u, p.cast(), bc * 2, vb.add(ct).cast(), dvp * 4, nkp / 32, o.add(ct).cast(), dvp * 4, true);
        }
    }
}

/// One 32 × 32 block of f32 products on four tiles: `C += A · B` over `steps` reductions of 32, where A
/// is 32 rows of bf16 (`a_stride` bytes apart; step `k` at byte `64k` of each row), B the packed pair rows
/// (`b_stride` bytes apart; step `k` starts 16 pair rows down, its second column tile 64 bytes right) and C
/// 32 rows of f32 (`c_stride` bytes apart), loaded first when `accumulate`, else started at zero.
///
/// # Safety
/// Inside `process`'s configured tile unit; every row named above is readable (A, B) or readable and
/// writable (C).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn block_2x2<U: TileUnit>(
    u: &mut U,
    a: *const u8,
    a_stride: usize,
    b: *const u8,
    b_stride: usize,
    steps: usize,
    c: *mut u8,
    c_stride: usize,
    accumulate: bool,
) {
    let c_lower = 16 * c_stride;
    // SAFETY: the caller's contract.
    unsafe {
        if accumulate {
            u.load::<0>(c, c_stride);
            u.load::<1>(c.add(64), c_stride);
            u.load::<2>(c.add(c_lower), c_stride);
            u.load::<3>(c.add(c_lower + 64), c_stride);
        } else {
            u.zero::<0>();
            u.zero::<1>();
            u.zero::<2>();
            u.zero::<3>();
        }
        for k in 0..steps {
            u.load::<4>(a.add(64 * k), a_stride);
            u.load::<5>(a.add(16 * a_stride + 64 * k), a_stride);
            u.load::<6>(b.add(16 * b_stride * k), b_stride);
            u.load::<7>(b.add(16 * b_stride * k + 64), b_stride);
            u.dp::<0, 4, 6>();
            u.dp::<1, 4, 7>();
            u.dp::<2, 5, 6>();
            u.dp::<3, 5, 7>();
        }
        u.store::<0>(c, c_stride);
        u.store::<1>(c.add(64), c_stride);
        u.store::<2>(c.add(c_lower), c_stride);
        u.store::<3>(c.add(c_lower + 64), c_stride);
    }
}

/// The online softmax of rows `r < n` of raw scores `s[r·bc + j]`, keys `j < nk`, scaled by `scale > 0` on
/// the way (the same state update as `micro::online_softmax_rows` on scaled scores), written as bf16
/// probabilities to `p` (0 for keys `nk <= j < nkp`) and, when `careful`, as f32 back into `s` (what the
/// re-run's `add_back` reads). The exponential runs in base 2 on `(x·scale - m)·log2 e`, exactly 0 at the
/// row's maximum ([`exp2_short`]); the state (`m`, `alpha`) stays in base e.
///
/// # Safety
/// `s` and `p` hold `n` rows of `bc >= nkp` values (`nkp` a multiple of 16); `m`, `l`, `alpha` at least
/// `round_up(n, 16)` values (rows past `n` get harmless updates); AVX-512 with AVX512_BF16 (the caller's
/// features).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn softmax_to_bf16(
    sd: Avx512,
    s: *mut f32,
    p: *mut u16,
    bc: usize,
    n: usize,
    nk: usize,
    nkp: usize,
    scale: f32,
    m: &mut [f32],
    l: &mut [f32],
    alpha: &mut [f32],
    careful: bool,
) {
    let log2e = std::f32::consts::LOG2_E;
    // Whole vectors of keys below nk, then the lanes of the one that straddles it.
    let full = nk / 16 * 16;
    let tail = ((1u32 << (nk - full)) - 1) as u16;
    // SAFETY: loads read only keys < nk of row r (the straddling vector masked); stores stay inside row r's
    // nkp values; the statistics are read and written 16 rows at a time, inside their slices (callers pass
    // at least the rows of a whole group, a multiple of 16).
    unsafe {
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let sv = _mm512_set1_ps(scale);
        let l2 = _mm512_set1_ps(log2e);
        let mut r0 = 0;
        while r0 < n {
            let rn = (n - r0).min(16);
            // Each row's largest raw score (two chains: one would wait on max's latency at every vector),
            // then the state update of 16 rows in vectors (as `micro::online_softmax_rows` does row by
            // row): m' = m unless m < max (NaN in m stays), the shift g = m' (0 when m' = -inf),
            // alpha = e^(m - g).
            let mut mx = [f32::NEG_INFINITY; 16];
            for (r, x) in mx.iter_mut().enumerate().take(rn) {
                let row = s.add((r0 + r) * bc);
                let (mut m0, mut m1) = (ninf, ninf);
                let mut j = 0;
                while j + 32 <= full {
                    m0 = sd.max(m0, _mm512_loadu_ps(row.add(j)));
                    m1 = sd.max(m1, _mm512_loadu_ps(row.add(j + 16)));
                    j += 32;
                }
                if j < full {
                    m0 = sd.max(m0, _mm512_loadu_ps(row.add(j)));
                }
                if full < nk {
                    m1 = sd.max(m1, _mm512_mask_loadu_ps(ninf, tail, row.add(full)));
                }
                *x = sd.reduce_max(sd.max(m0, m1));
            }
            let mxv = _mm512_mul_ps(_mm512_loadu_ps(mx.as_ptr()), sv);
            let mo = _mm512_loadu_ps(m.as_ptr().add(r0));
            let keep = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(mo, mxv) | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(mo, mo);
            let m_new = _mm512_mask_blend_ps(keep, mxv, mo);
            let none = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(m_new, ninf);
            let g = _mm512_mask_blend_ps(none, m_new, _mm512_setzero_ps());
            let a = sd.exp(_mm512_sub_ps(mo, g));
            let mut gs = [0f32; 16];
            _mm512_storeu_ps(gs.as_mut_ptr(), g);
            let mut sums = [0f32; 16];
            for (r, total) in sums.iter_mut().enumerate().take(rn) {
                let (row, prow) = (s.add((r0 + r) * bc), p.add((r0 + r) * bc));
                // e^(x·scale - g) = 2^((x·scale - g)·log2 e), the difference formed first: at the row's
                // maximum x·scale rounds to g itself, so its exponent is exactly 0 whatever the magnitude
                // (one FMA, x·(scale·log2 e) - rnd(g·log2 e), carried the rounding of g·log2 e, which at
                // scores of 1e8 and more emptied or overflowed whole tiles).
                let gv = _mm512_set1_ps(gs[r]);
                // A macro, not a closure (see `put!`).
                macro_rules! t {
                    ($x:expr) => {
                        _mm512_mul_ps(_mm512_sub_ps(_mm512_mul_ps($x, sv), gv), l2)
                    };
                }
                let mut sum = sd.zero();
                // A macro, not a closure: a closure would not inherit the caller's target features.
                macro_rules! put {
                    ($j:expr, $e:expr) => {{
                        if careful {
                            sd.store(row.add($j), $e);
                        }
                        let h = std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh($e));
                        _mm256_storeu_si256(prow.add($j).cast(), h);
                    }};
                }
                let mut j = 0;
                while j < full {
                    let e = exp2_short(t!(_mm512_loadu_ps(row.add(j))));
                    sum = sd.add(sum, e);
                    put!(j, e);
                    j += 16;
                }
                if full < nk {
                    // Lanes past nk load -inf: the exponential gives exactly 0 there.
                    let x = _mm512_mask_loadu_ps(ninf, tail, row.add(full));
                    let e = exp2_short(t!(x));
                    sum = sd.add(sum, e);
                    put!(full, e);
                    j += 16;
                }
                while j < nkp {
                    _mm256_storeu_si256(prow.add(j).cast(), _mm256_setzero_si256());
                    j += 16;
                }
                *total = sd.reduce_sum(sum);
            }
            let lv = _mm512_loadu_ps(l.as_ptr().add(r0));
            _mm512_storeu_ps(l.as_mut_ptr().add(r0), sd.fma(lv, a, _mm512_loadu_ps(sums.as_ptr())));
            _mm512_storeu_ps(alpha.as_mut_ptr().add(r0), a);
            _mm512_storeu_ps(m.as_mut_ptr().add(r0), m_new);
            r0 += 16;
        }
    }
}

/// `s[r·bc + j] *= scale` for rows `r < n`, keys `j < nk`.
///
/// # Safety
/// `s` holds `n` rows of `bc >= nk` f32.
#[inline(always)]
unsafe fn scale_rows(sd: Avx512, s: *mut f32, bc: usize, n: usize, nk: usize, scale: f32) {
    let sv = sd.splat(scale);
    let full = nk / 16 * 16;
    // SAFETY: accesses stay inside row r's nk values.
    unsafe {
        for r in 0..n {
            let row = s.add(r * bc);
            let mut j = 0;
            while j < full {
                sd.store(row.add(j), sd.mul(sd.load(row.add(j)), sv));
                j += 16;
            }
            for j in full..nk {
                *row.add(j) *= scale;
            }
        }
    }
}

/// `p[r·bc + j] = bf16(s[r·bc + j])` (round to nearest even) for rows `r < n`, keys `j < nk`, and 0 for
/// keys `nk <= j < nkp`.
///
/// # Safety
/// `s` and `p` hold `n` rows of `bc >= nkp` values; AVX-512 with AVX512_BF16 (the caller's features).
#[inline(always)]
unsafe fn to_bf16_rows(s: *const f32, p: *mut u16, bc: usize, n: usize, nk: usize, nkp: usize) {
    // SAFETY: masked loads read only keys < nk; stores stay inside row r's nkp values.
    unsafe {
        for r in 0..n {
            let (src, dst) = (s.add(r * bc), p.add(r * bc));
            let mut j = 0;
            while j < nkp {
                let x = if j + 16 <= nk {
                    _mm512_loadu_ps(src.add(j))
                } else if j < nk {
                    _mm512_maskz_loadu_ps(((1u32 << (nk - j)) - 1) as u16, src.add(j))
                } else {
                    _mm512_setzero_ps()
                };
                let h = std::mem::transmute::<__m256bh, __m256i>(_mm512_cvtneps_pbh(x));
                _mm256_storeu_si256(dst.add(j).cast(), h);
                j += 16;
            }
        }
    }
}

/// `o[r·dvp ..][..dvp] *= alpha[r]` for rows `r < n`.
///
/// # Safety
/// `o` holds `n` rows of `dvp` (a multiple of 16) f32; `alpha` at least `n` values.
#[inline(always)]
unsafe fn rescale_rows(sd: Avx512, o: *mut f32, dvp: usize, n: usize, alpha: &[f32]) {
    // SAFETY: accesses stay inside row r's dvp values.
    unsafe {
        for (r, &a) in alpha[..n].iter().enumerate() {
            if a == 1.0 {
                continue;
            }
            let av = sd.splat(a);
            let row = o.add(r * dvp);
            let mut c = 0;
            while c < dvp {
                sd.store(row.add(c), sd.mul(sd.load(row.add(c)), av));
                c += 16;
            }
        }
    }
}
