//! Micro-kernels, written once over a [`Simd`] token.
//!
//! Scores are kept transposed, `Sᵀ[key][query]`, with queries along the vector lanes: the query tile is
//! packed once as `Qᵀ[dim][query]` and each key row is broadcast straight from K's memory, so K is never
//! packed (for f32) and the online-softmax statistics (max, sum) are plain lane-wise vector operations.
//! P·V then broadcasts `Pᵀ[key][row]` and streams rows of V along the vector lanes of the output.
//!
//! All functions are `#[inline(always)]` and `unsafe`: callers pass pointers with the documented extents.

use crate::simd::{prefetch_l2, Simd};

/// An element type the micro-kernels read K and V in: f32, or bf16 widened in registers (decoding reads
/// bf16 K and V in place).
pub(crate) trait KvElem: Copy {
    /// # Safety
    /// `LANES` elements readable at `p`.
    unsafe fn load<S: Simd>(s: S, p: *const Self) -> S::V;
    /// # Safety
    /// `n < LANES` elements readable at `p`; the other lanes are zero.
    unsafe fn load_part<S: Simd>(s: S, p: *const Self, n: usize) -> S::V;
}

impl KvElem for f32 {
    #[inline(always)]
    unsafe fn load<S: Simd>(s: S, p: *const f32) -> S::V {
        // SAFETY: the caller's contract.
        unsafe { s.load(p) }
    }
    #[inline(always)]
    unsafe fn load_part<S: Simd>(s: S, p: *const f32, n: usize) -> S::V {
        // SAFETY: the caller's contract.
        unsafe { s.load_part(p, n) }
    }
}

impl KvElem for half::bf16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(s: S, p: *const half::bf16) -> S::V {
        // SAFETY: the caller's contract; a bf16 is a u16 bit pattern.
        unsafe { s.load_bf16(p.cast()) }
    }
    #[inline(always)]
    unsafe fn load_part<S: Simd>(s: S, p: *const half::bf16, n: usize) -> S::V {
        // SAFETY: as above.
        unsafe { s.load_bf16_part(p.cast(), n) }
    }
}

/// The rows of the next piece of work, prefetched into L2 one row per row a kernel walks (so the requests
/// spread evenly over the work and run exactly one piece ahead): row `j` starts at `base + j·stride`
/// bytes and spans `lines` cache lines. Decoding passes it; everything else passes `None`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shadow {
    pub base: *const u8,
    pub stride: usize,
    pub lines: usize,
}

impl Shadow {
    #[inline(always)]
    fn row(self, j: usize) {
        for l in 0..self.lines {
            // Wrapping: the address is only a hint and may lie past the tensor at its end.
            prefetch_l2(self.base.wrapping_add(j * self.stride + l * 64));
        }
    }
}

/// `out[j*os + x] = Σ_c k[j*ks + c] · qt[c*qs + x]` for keys `j < nk` and lanes `x < nqv·LANES`.
///
/// # Safety
/// `k` addresses `nk` rows of `d` f32 at stride `ks`; `qt` addresses `d` rows of `nqv·LANES` f32 at
/// stride `qs`; `out` addresses `nk` rows of `nqv·LANES` f32 at stride `os`.
#[inline(always)]
pub(crate) unsafe fn scores<S: Simd>(
    s: S,
    d: usize,
    k: *const f32,
    ks: usize,
    nk: usize,
    qt: *const f32,
    qs: usize,
    nqv: usize,
    out: *mut f32,
    os: usize,
) {
    let l = S::LANES;
    let mut n = 0;
    // SAFETY (whole body): every pointer offset stays inside the extents stated in the contract.
    unsafe {
        while n < nqv {
            let nq = if nqv - n >= S::QK_QVECS {
                S::QK_QVECS
            } else if nqv - n >= 2 {
                2
            } else {
                1
            };
            let (qt_n, out_n) = (qt.add(n * l), out.add(n * l));
            let mut j = 0;
            while j < nk {
                // A tile's last few keys take a 4-key tile where they can: a single key leaves only `nq`
                // accumulators, too few independent chains to cover the FMA latency.
                let mr = if nk - j >= S::QK_KEYS {
                    S::QK_KEYS
                } else if nk - j >= 4 {
                    4
                } else {
                    1
                };
                let (kj, oj) = (k.add(j * ks), out_n.add(j * os));
                macro_rules! tile {
                    ($mr:literal, $nq:literal) => {
                        qk_micro::<S, $mr, $nq>(s, d, kj, ks, qt_n, qs, oj, os)
                    };
                }
                // Only the arms matching the token's constants (and the 1-wide edges) survive inlining.
                match (mr, nq) {
                    (12, 2) => tile!(12, 2),
                    (12, 1) => tile!(12, 1),
                    (6, 4) => tile!(6, 4),
                    (6, 2) => tile!(6, 2),
                    (6, 1) => tile!(6, 1),
                    (4, 4) => tile!(4, 4),
                    (4, 2) => tile!(4, 2),
                    (4, 1) => tile!(4, 1),
                    (1, 4) => tile!(1, 4),
                    (1, 2) => tile!(1, 2),
                    _ => {
                        for r in 0..mr {
                            for x in 0..nq {
                                qk_micro::<S, 1, 1>(
                                    s,
                                    d,
                                    kj.add(r * ks),
                                    ks,
                                    qt_n.add(x * l),
                                    qs,
                                    oj.add(r * os + x * l),
                                    os,
                                )
                            }
                        }
                    }
                }
                j += mr;
            }
            n += nq;
        }
    }
}

/// One register tile of [`scores`]: `MR` keys by `NQ` query vectors.
#[inline(always)]
unsafe fn qk_micro<S: Simd, const MR: usize, const NQ: usize>(
    s: S,
    d: usize,
    k: *const f32,
    ks: usize,
    qt: *const f32,
    qs: usize,
    out: *mut f32,
    os: usize,
) {
    let mut acc = [[s.zero(); NQ]; MR];
    // SAFETY: offsets stay inside the extents of `scores`' contract.
    unsafe {
        for c in 0..d {
            let mut qv = [s.zero(); NQ];
            for (x, q) in qv.iter_mut().enumerate() {
                *q = s.load(qt.add(c * qs + x * S::LANES));
            }
            for r in 0..MR {
                let kb = s.splat(*k.add(r * ks + c));
                for x in 0..NQ {
                    acc[r][x] = s.fma(kb, qv[x], acc[r][x]);
                }
            }
        }
        for r in 0..MR {
            for x in 0..NQ {
                s.store(out.add(r * os + x * S::LANES), acc[r][x]);
            }
        }
    }
}

/// Scores of a few query rows by dot products along the head dim (decoding, where a query tile would
/// leave most lanes empty): `out[j*os] = Σ_c q[c] · k[j*ks + c]` for `j < nk`.
///
/// # Safety
/// `q` addresses `round_up(d, LANES)` f32 (zero beyond `d`); `k` addresses `nk` rows of `d` f32 at stride
/// `ks`; `out` addresses `(nk - 1)·os + 1` f32.
#[inline(always)]
pub(crate) unsafe fn dot_scores<S: Simd, E: KvElem>(
    s: S,
    d: usize,
    q: *const f32,
    k: *const E,
    ks: usize,
    nk: usize,
    out: *mut f32,
    os: usize,
    shadow: Option<Shadow>,
) {
    let l = S::LANES;
    let full = d / l * l;
    let tail = d - full;
    // SAFETY (whole body): offsets stay inside the contract's extents; the tail load reads `tail` values.
    unsafe {
        let mut j = 0;
        while j + 4 <= nk {
            if let Some(sh) = shadow {
                (j..j + 4).for_each(|r| sh.row(r));
            }
            let mut acc = [s.zero(); 4];
            let mut c = 0;
            while c < full {
                let qv = s.load(q.add(c));
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = s.fma(qv, E::load(s, k.add((j + r) * ks + c)), *a);
                }
                c += l;
            }
            if tail > 0 {
                let qv = s.load(q.add(full));
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = s.fma(qv, E::load_part(s, k.add((j + r) * ks + full), tail), *a);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                *out.add((j + r) * os) = s.reduce_sum(*a);
            }
            j += 4;
        }
        while j < nk {
            if let Some(sh) = shadow {
                sh.row(j);
            }
            let mut a = s.zero();
            let mut c = 0;
            while c < full {
                a = s.fma(s.load(q.add(c)), E::load(s, k.add(j * ks + c)), a);
                c += l;
            }
            if tail > 0 {
                a = s.fma(s.load(q.add(full)), E::load_part(s, k.add(j * ks + full), tail), a);
            }
            *out.add(j * os) = s.reduce_sum(a);
            j += 1;
        }
    }
}

/// [`dot_scores`] for `R` query rows at once (GQA decoding): each K vector is loaded once for all rows.
/// `q` row `r` at `q + r·qs`; scores of row `r` at `out + r·ors + j`.
///
/// # Safety
/// As [`dot_scores`] for each row; `out` addresses `R` rows of `nk` f32 at stride `ors`.
#[inline(always)]
pub(crate) unsafe fn dot_scores_rows<S: Simd, E: KvElem, const R: usize>(
    s: S,
    d: usize,
    q: *const f32,
    qs: usize,
    k: *const E,
    ks: usize,
    nk: usize,
    out: *mut f32,
    ors: usize,
    shadow: Option<Shadow>,
) {
    let l = S::LANES;
    let full = d / l * l;
    let tail = d - full;
    // SAFETY (whole body): offsets stay inside the contract's extents; the tail load reads `tail` values.
    unsafe {
        let mut j = 0;
        while j + 2 <= nk {
            if let Some(sh) = shadow {
                sh.row(j);
                sh.row(j + 1);
            }
            let mut acc = [[s.zero(); R]; 2];
            let mut c = 0;
            while c < full {
                let kv = [E::load(s, k.add(j * ks + c)), E::load(s, k.add((j + 1) * ks + c))];
                for r in 0..R {
                    let qv = s.load(q.add(r * qs + c));
                    for (x, a) in acc.iter_mut().enumerate() {
                        a[r] = s.fma(qv, kv[x], a[r]);
                    }
                }
                c += l;
            }
            if tail > 0 {
                let kv =
                    [E::load_part(s, k.add(j * ks + full), tail), E::load_part(s, k.add((j + 1) * ks + full), tail)];
                for r in 0..R {
                    let qv = s.load(q.add(r * qs + full));
                    for (x, a) in acc.iter_mut().enumerate() {
                        a[r] = s.fma(qv, kv[x], a[r]);
                    }
                }
            }
            for (x, a) in acc.iter().enumerate() {
                for (r, v) in a.iter().enumerate() {
                    *out.add(r * ors + j + x) = s.reduce_sum(*v);
                }
            }
            j += 2;
        }
        if j < nk {
            if let Some(sh) = shadow {
                sh.row(j);
            }
            let mut acc = [s.zero(); R];
            let mut c = 0;
            while c < full {
                let kv = E::load(s, k.add(j * ks + c));
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = s.fma(s.load(q.add(r * qs + c)), kv, *a);
                }
                c += l;
            }
            if tail > 0 {
                let kv = E::load_part(s, k.add(j * ks + full), tail);
                for (r, a) in acc.iter_mut().enumerate() {
                    *a = s.fma(s.load(q.add(r * qs + full)), kv, *a);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                *out.add(r * ors + j) = s.reduce_sum(*a);
            }
        }
    }
}

/// How the online softmax exponentiates a tile's scores.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum SoftmaxExp {
    /// `e^(x - m)` to f32 accuracy ([`Simd::exp_nonpositive`]): f32 outputs.
    Full,
    /// `2^((x - m)·log2 e)` through [`Simd::exp2_short_nonpositive`] (3e-6 relative): two vector operations
    /// of about fourteen per score fewer, for bf16 and f16 outputs, whose unit roundoff (2^-8, 2^-11) is far
    /// above it. At head dims below 64 the softmax is a third of the item's time. The exponent is formed as
    /// `x - m` first, exact at the maximum (0, so its weight is exactly 1) whatever the scores' magnitude:
    /// one FMA `x·log2 e - rnd(m·log2 e)` would carry the rounding of `m·log2 e`, which grows with |m| and
    /// at scores of 1e8 and more empties or overflows whole tiles.
    Short,
}

impl SoftmaxExp {
    /// The exponential an output of element type `T` needs.
    pub(crate) fn for_output<T: crate::element::CpuElement>() -> SoftmaxExp {
        if T::DTYPE == sdpa_core::DType::F32 {
            SoftmaxExp::Full
        } else {
            SoftmaxExp::Short
        }
    }
}

/// `e^(x - g)` lane-wise for `x <= g`.
#[inline(always)]
fn exp_below<S: Simd>(s: S, how: SoftmaxExp, x: S::V, g: S::V) -> S::V {
    match how {
        SoftmaxExp::Full => s.exp_nonpositive(s.sub(x, g)),
        SoftmaxExp::Short => s.exp2_short_nonpositive(s.mul(s.sub(x, g), s.splat(std::f32::consts::LOG2_E))),
    }
}

/// Online-softmax update of one score tile, lane-wise over queries: turns `Sᵀ` (scaled, masked, `-inf`
/// for masked keys) into `Pᵀ = e^(Sᵀ - m_new)` in place (exponentiated as `how` says), updates `m` and `l`,
/// and writes the factor `alpha = e^(m_old - m_new)` (always to f32 accuracy) by which the caller rescales
/// its accumulators. A lane whose keys are all masked so far keeps `m = -inf` and uses 0 as the
/// subtrahend, so its P is exactly 0, never NaN.
///
/// # Safety
/// `st` addresses `nk` rows of `nqv·LANES` f32 at stride `sts`; the slices hold `nqv·LANES` values.
#[inline(always)]
pub(crate) unsafe fn online_softmax<S: Simd>(
    s: S,
    how: SoftmaxExp,
    st: *mut f32,
    sts: usize,
    nk: usize,
    nqv: usize,
    m: &mut [f32],
    l: &mut [f32],
    alpha: &mut [f32],
) {
    let lanes = S::LANES;
    // Four independent chains for the maximum and for the sum: one chain would serialise a tile's keys on
    // the latency of `max`/`add` (a 64-key tile: 64 dependent steps per query vector), and with 8 lanes
    // (AVX2) a tile has twice the query vectors, so that latency cost twice the share it costs AVX-512.
    // SAFETY (whole body): every access is inside `st`'s extent or the slices (length nqv·LANES).
    unsafe {
        for n in 0..nqv {
            let off = n * lanes;
            let m_old = s.load(m.as_ptr().add(off));
            let mut mx = [m_old; 4];
            let mut j = 0;
            while j + 4 <= nk {
                for (u, x) in mx.iter_mut().enumerate() {
                    *x = s.max(*x, s.load(st.add((j + u) * sts + off)));
                }
                j += 4;
            }
            while j < nk {
                mx[0] = s.max(mx[0], s.load(st.add(j * sts + off)));
                j += 1;
            }
            let mx = s.max(s.max(mx[0], mx[1]), s.max(mx[2], mx[3]));
            // The subtrahend: the new maximum, or 0 where it is still -inf (so e^(-inf - 0) = 0, not NaN).
            let g = s.neg_inf_to_zero(mx);
            s.store(alpha.as_mut_ptr().add(off), s.exp_nonpositive(s.sub(m_old, g)));
            s.store(m.as_mut_ptr().add(off), mx);
            let mut sum = [s.zero(); 4];
            let mut j = 0;
            while j + 4 <= nk {
                for (u, acc) in sum.iter_mut().enumerate() {
                    let pj = st.add((j + u) * sts + off);
                    let p = exp_below(s, how, s.load(pj), g);
                    s.store(pj, p);
                    *acc = s.add(*acc, p);
                }
                j += 4;
            }
            while j < nk {
                let pj = st.add(j * sts + off);
                let p = exp_below(s, how, s.load(pj), g);
                s.store(pj, p);
                sum[0] = s.add(sum[0], p);
                j += 1;
            }
            let total = s.add(s.add(sum[0], sum[1]), s.add(sum[2], sum[3]));
            let lv = s.load(l.as_ptr().add(off));
            let av = s.load(alpha.as_ptr().add(off));
            s.store(l.as_mut_ptr().add(off), s.fma(lv, av, total));
        }
    }
}

/// Online-softmax update for a few rows whose scores lie along the keys (`st[r*rs + j]`, the decoding
/// layout): the same state update as [`online_softmax`], vectorised along the keys instead of the rows.
///
/// # Safety
/// `st` addresses `nk` f32 at `r*rs` for every `r < rows`; the slices hold at least `rows` values.
#[inline(always)]
pub(crate) unsafe fn online_softmax_rows<S: Simd>(
    s: S,
    how: SoftmaxExp,
    st: *mut f32,
    rs: usize,
    nk: usize,
    rows: usize,
    m: &mut [f32],
    l: &mut [f32],
    alpha: &mut [f32],
) {
    let lanes = S::LANES;
    let full = nk / lanes * lanes;
    // SAFETY (whole body): accesses stay inside row r's nk scores.
    unsafe {
        for r in 0..rows {
            let row = st.add(r * rs);
            let mut mv = s.splat(f32::NEG_INFINITY);
            let mut j = 0;
            while j < full {
                mv = s.max(mv, s.load(row.add(j)));
                j += lanes;
            }
            let mut mx = s.reduce_max(mv);
            for j in full..nk {
                let x = *row.add(j);
                if x.is_nan() || x > mx {
                    mx = x;
                }
            }
            let m_new = if m[r].is_nan() || m[r] > mx { m[r] } else { mx };
            let g = if m_new == f32::NEG_INFINITY { 0.0 } else { m_new };
            let gv = s.splat(g);
            let mut sum = s.zero();
            let mut j = 0;
            while j < full {
                let e = exp_below(s, how, s.load(row.add(j)), gv);
                s.store(row.add(j), e);
                sum = s.add(sum, e);
                j += lanes;
            }
            let mut total = s.reduce_sum(sum);
            for j in full..nk {
                let e = (*row.add(j) - g).exp();
                *row.add(j) = e;
                total += e;
            }
            alpha[r] = (m[r] - g).exp();
            l[r] = l[r] * alpha[r] + total;
            m[r] = m_new;
        }
    }
}

/// `o[r*os + c] = o[r*os + c]·alpha[r] + Σ_j pt[j*ps + r*pr] · v[j*vs + c]` for rows `r < rows`,
/// columns `c < dv` (`alpha = None`: no rescale, accumulate onto `o`). `pr = 1` reads Pᵀ (keys by rows);
/// `ps = 1` reads P row by row.
///
/// # Safety
/// `pt` addresses every `j*ps + r*pr` for `j < nk`, `r < rows`; `v` addresses `nk` rows of `dv` f32 at stride
/// `vs`; `o` addresses `rows` rows of `round_up(dv, LANES)` f32 at stride `os`; `alpha`, when given,
/// `rows` f32.
#[inline(always)]
pub(crate) unsafe fn pv<S: Simd, E: KvElem>(
    s: S,
    nk: usize,
    pt: *const f32,
    ps: usize,
    pr: usize,
    v: *const E,
    vs: usize,
    rows: usize,
    dv: usize,
    o: *mut f32,
    os: usize,
    alpha: Option<*const f32>,
    shadow: Option<Shadow>,
) {
    let l = S::LANES;
    let chunk = S::PV_VECS * l;
    // SAFETY (whole body): offsets stay inside the extents of the contract.
    unsafe {
        let mut r = 0;
        while r < rows {
            // Four rows (GQA decoding) take a tile of their own where the path's tile is taller.
            let nr = if rows - r >= S::PV_ROWS {
                S::PV_ROWS
            } else if rows - r >= 4 {
                4
            } else {
                1
            };
            let (pt_r, o_r) = (pt.add(r * pr), o.add(r * os));
            let al = alpha.map(|a| a.add(r));
            let mut c = 0;
            while c < dv {
                // A single row (decoding) takes eight vectors at once: one pass over each V row.
                let (nv, n) = if nr == 1 && dv - c >= 8 * l {
                    (8, l)
                } else if nr == 4 && S::PV_ROWS > 4 && dv - c >= 4 * l {
                    (4, l)
                } else if nr == 8 && S::PV_VECS == 2 && dv - c > chunk && dv - c <= 3 * l {
                    // AVX-512's last 33..48 columns (D = 40, 48): one 8 x 3 tile (24 accumulators) rather
                    // than 8 x 2 plus 8 x 1, which broadcast every P value twice.
                    (3, dv - c - chunk)
                } else if dv - c >= chunk {
                    (S::PV_VECS, l)
                } else {
                    (1, (dv - c).min(l))
                };
                let part = n < l;
                let (vc, oc) = (v.add(c), o_r.add(c));
                // The first pass over V prefetches the next piece's rows.
                let sh = if r == 0 && c == 0 { shadow } else { None };
                macro_rules! tile {
                    ($mr:literal, $nv:literal, $part:literal) => {
                        pv_micro::<S, E, $mr, $nv, $part>(s, nk, pt_r, ps, pr, vc, vs, oc, os, al, n, sh)
                    };
                }
                // Only the arms matching the token's constants (and the edges) survive inlining.
                match (nr, nv, part) {
                    (1, 8, false) => tile!(1, 8, false),
                    (8, 2, false) => tile!(8, 2, false),
                    (8, 3, false) => tile!(8, 3, false),
                    (8, 3, true) => tile!(8, 3, true),
                    (6, 2, false) => tile!(6, 2, false),
                    (6, 1, false) => tile!(6, 1, false),
                    (6, 1, true) => tile!(6, 1, true),
                    (8, 1, false) => tile!(8, 1, false),
                    (8, 1, true) => tile!(8, 1, true),
                    (4, 4, false) => tile!(4, 4, false),
                    (4, 2, false) => tile!(4, 2, false),
                    (4, 1, false) => tile!(4, 1, false),
                    (4, 1, true) => tile!(4, 1, true),
                    (1, 4, false) => tile!(1, 4, false),
                    (1, 2, false) => tile!(1, 2, false),
                    (1, 1, false) => tile!(1, 1, false),
                    (1, 1, true) => tile!(1, 1, true),
                    _ => {
                        for rr in 0..nr {
                            let alr = al.map(|a| a.add(rr));
                            for x in 0..nv {
                                let (vx, ox) = (vc.add(x * l), oc.add(rr * os + x * l));
                                if part {
                                    pv_micro::<S, E, 1, 1, true>(
                                        s,
                                        nk,
                                        pt_r.add(rr * pr),
                                        ps,
                                        pr,
                                        vx,
                                        vs,
                                        ox,
                                        os,
                                        alr,
                                        n,
                                        None,
                                    )
                                } else {
                                    pv_micro::<S, E, 1, 1, false>(
                                        s,
                                        nk,
                                        pt_r.add(rr * pr),
                                        ps,
                                        pr,
                                        vx,
                                        vs,
                                        ox,
                                        os,
                                        alr,
                                        n,
                                        None,
                                    )
                                }
                            }
                        }
                    }
                }
                c += nv * l;
            }
            r += nr;
        }
    }
}

/// P·V into a transposed accumulator, rows along the lanes as the scores are:
/// `ot[c*os + x] = ot[c*os + x]·alpha[x] + Σ_j v[j*vs + c] · pt[j*ps + x]` for columns `c < dv` and lanes
/// `x < nqv·LANES`. Pads rows (to the vector width) instead of columns: a head dim that is no multiple of
/// the width (D = 40 on AVX-512: 48 columns in [`pv`]) computes only its own columns.
///
/// # Safety
/// `pt` addresses `nk` rows of `nqv·LANES` f32 at stride `ps`; `v` `nk` rows of `dv` f32 at stride `vs`;
/// `ot` `dv` rows of `nqv·LANES` f32 at stride `os`; `alpha` `nqv·LANES` f32.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) unsafe fn pv_transposed<S: Simd>(
    s: S,
    nk: usize,
    pt: *const f32,
    ps: usize,
    v: *const f32,
    vs: usize,
    dv: usize,
    nqv: usize,
    ot: *mut f32,
    os: usize,
    alpha: *const f32,
) {
    let l = S::LANES;
    // SAFETY (whole body): every offset stays inside the extents of the contract.
    unsafe {
        let mut n = 0;
        while n < nqv {
            let nq = if nqv - n >= 2 { 2 } else { 1 };
            let mut c = 0;
            while c < dv {
                // The score tile's shape: 12 columns by 2 row vectors (24 accumulators), 4 and 1 at the edge.
                let mr = if dv - c >= 12 {
                    12
                } else if dv - c >= 4 {
                    4
                } else {
                    1
                };
                let (vc, oc, pn, an) = (v.add(c), ot.add(c * os + n * l), pt.add(n * l), alpha.add(n * l));
                macro_rules! tile {
                    ($mr:literal, $nq:literal) => {
                        pvt_micro::<S, $mr, $nq>(s, nk, pn, ps, vc, vs, oc, os, an)
                    };
                }
                match (mr, nq) {
                    (12, 2) => tile!(12, 2),
                    (12, _) => tile!(12, 1),
                    (4, 2) => tile!(4, 2),
                    (4, _) => tile!(4, 1),
                    (_, 2) => tile!(1, 2),
                    _ => tile!(1, 1),
                }
                c += mr;
            }
            n += nq;
        }
    }
}

/// One register tile of [`pv_transposed`]: `MR` columns by `NQ` row vectors.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn pvt_micro<S: Simd, const MR: usize, const NQ: usize>(
    s: S,
    nk: usize,
    pt: *const f32,
    ps: usize,
    v: *const f32,
    vs: usize,
    ot: *mut f32,
    os: usize,
    alpha: *const f32,
) {
    let l = S::LANES;
    // SAFETY: offsets stay inside the extents of `pv_transposed`'s contract.
    unsafe {
        let mut acc = [[s.zero(); NQ]; MR];
        for x in 0..NQ {
            let a = s.load(alpha.add(x * l));
            for (r, row) in acc.iter_mut().enumerate() {
                row[x] = s.mul(s.load(ot.add(r * os + x * l)), a);
            }
        }
        for j in 0..nk {
            let mut pv = [s.zero(); NQ];
            for (x, p) in pv.iter_mut().enumerate() {
                *p = s.load(pt.add(j * ps + x * l));
            }
            for (r, row) in acc.iter_mut().enumerate() {
                let vb = s.splat(*v.add(j * vs + r));
                for x in 0..NQ {
                    row[x] = s.fma(vb, pv[x], row[x]);
                }
            }
        }
        for (r, row) in acc.iter().enumerate() {
            for (x, a) in row.iter().enumerate() {
                s.store(ot.add(r * os + x * l), *a);
            }
        }
    }
}

/// `acc[r*accs + c] += Σ_x a[r*as_ + x] · b[x*bs + c]` for rows `r < rows`, columns `c < cols`, sums over
/// `x < n`: a plain product `A·B` accumulated onto `acc`, with A read row by row (the backward's `Pᵀ·dO`
/// and `dSᵀ·Q` read the `[key][row]` tiles as A; [`pv`] with a unit stride along the sum).
///
/// # Safety
/// `a` addresses `rows` rows of `n` f32 at stride `as_`; `b` `n` rows of `cols` f32 at stride `bs`; `acc`
/// `rows` rows of `round_up(cols, LANES)` f32 at stride `accs`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) unsafe fn gemm_acc<S: Simd>(
    s: S,
    n: usize,
    a: *const f32,
    as_: usize,
    b: *const f32,
    bs: usize,
    rows: usize,
    cols: usize,
    acc: *mut f32,
    accs: usize,
) {
    // SAFETY: the extents of `pv`'s contract, with keys = x, P = A (ps = 1, pr = as_), V = B.
    unsafe { pv(s, n, a, 1, as_, b, bs, rows, cols, acc, accs, None, None) }
}

/// One register tile of [`pv`]: `MR` rows by `NV` vectors of columns; with `PART` the last vector reads
/// only `tail` columns of V (the output row is padded, so it is stored whole).
#[inline(always)]
unsafe fn pv_micro<S: Simd, E: KvElem, const MR: usize, const NV: usize, const PART: bool>(
    s: S,
    nk: usize,
    pt: *const f32,
    ps: usize,
    pr: usize,
    v: *const E,
    vs: usize,
    o: *mut f32,
    os: usize,
    alpha: Option<*const f32>,
    tail: usize,
    shadow: Option<Shadow>,
) {
    let l = S::LANES;
    // SAFETY: offsets stay inside the extents of `pv`'s contract.
    unsafe {
        let mut acc = [[s.zero(); NV]; MR];
        for r in 0..MR {
            for x in 0..NV {
                acc[r][x] = s.load(o.add(r * os + x * l));
            }
            if let Some(a) = alpha {
                let av = s.splat(*a.add(r));
                for x in 0..NV {
                    acc[r][x] = s.mul(acc[r][x], av);
                }
            }
        }
        for j in 0..nk {
            if let Some(sh) = shadow {
                sh.row(j);
            }
            let mut vv = [s.zero(); NV];
            for x in 0..NV {
                vv[x] = if PART && x == NV - 1 {
                    E::load_part(s, v.add(j * vs + x * l), tail)
                } else {
                    E::load(s, v.add(j * vs + x * l))
                };
            }
            for r in 0..MR {
                let pb = s.splat(*pt.add(j * ps + r * pr));
                for x in 0..NV {
                    acc[r][x] = s.fma(pb, vv[x], acc[r][x]);
                }
            }
        }
        for r in 0..MR {
            for x in 0..NV {
                s.store(o.add(r * os + x * l), acc[r][x]);
            }
        }
    }
}
