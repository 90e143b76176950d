//! `unfused`: the eager baseline. Per head it materialises the whole score matrix (`Sq × Sk`, f32), runs
//! softmax over it in a separate pass, then multiplies by V, as `matmul → softmax → matmul` does in an
//! eager model. The two products use the same SIMD micro-kernels as `fa2` (a real GEMM, not a loop of dot
//! products). The softmax runs on f32 scores with the row maximum subtracted, whatever the dtype, so it
//! is as accurate as the fused kernels at any scale; for f16/bf16 the normalised probabilities are rounded
//! to the input type before the P·V product, as eager PyTorch's second matmul takes them. (Rounding the
//! scores too, as eager PyTorch also does, overflowed f16 at large scales and missed the bf16 tolerance at
//! negative ones: issue 19.)

use crate::element::CpuElement;
use crate::fa2::lanes;
use crate::micro;
use crate::nonfinite::{self, ProbTile};
use crate::problem::{round_up, Problem, SharedMut};
use crate::simd::{dispatch, Simd, SimdKernel, SimdPath};
use rayon::prelude::*;

/// Keys per chunk of the score pass, rows per chunk of the P·V pass.
const KEY_CHUNK: usize = 256;
const ROW_CHUNK: usize = 64;

/// Runs every (batch, head) of every part (a ragged batch's sequences, one after another). With at least
/// as many heads as threads each head is one task; otherwise heads run one after another and each pass is
/// split across the threads.
pub(crate) fn run_unfused<T: CpuElement>(ps: &[Problem<'_, T>], path: SimdPath, threads: usize) {
    for p in ps {
        let heads: Vec<(usize, usize)> = (0..p.b).flat_map(|b| (0..p.hq).map(move |h| (b, h))).collect();
        if heads.len() >= threads {
            heads.par_iter().for_each(|&(b, h)| head(p, path, b, h, false));
        } else {
            for &(b, h) in &heads {
                head(p, path, b, h, true);
            }
        }
    }
}

fn for_chunks(par: bool, n: usize, chunk: usize, f: impl Fn(usize, usize) + Sync) {
    let count = n.div_ceil(chunk);
    let run = |c: usize| f(c * chunk, ((c + 1) * chunk).min(n));
    if par {
        (0..count).into_par_iter().for_each(run);
    } else {
        (0..count).for_each(run);
    }
}

fn head<T: CpuElement>(p: &Problem<'_, T>, path: SimdPath, b: usize, h: usize, par: bool) {
    let l = lanes(path);
    let (sq, sk, d, dv) = (p.sq, p.sk, p.d, p.dv);
    let sqp = round_up(sq, l);
    let dvp = round_up(dv, l);
    let kvh = h / p.group;

    // Qᵀ, scaled.
    let mut qt = vec![0.0f32; d * sqp];
    let mut row = vec![0.0f32; d.max(dv)];
    for i in 0..sq {
        let off = p.q_st.offset(b, h, i);
        T::widen(&p.q[off..off + d], &mut row[..d]);
        for c in 0..d {
            qt[c * sqp + i] = row[c] * p.scale;
        }
    }
    // K and V as f32 rows: the input itself for f32 not in pages, a widened (gathered) copy of this head
    // otherwise.
    let widen_head = |src: &[T], row: &dyn Fn(usize) -> usize, width: usize| -> Vec<f32> {
        let mut out = vec![0.0f32; sk * width];
        for j in 0..sk {
            let off = row(j);
            T::widen(&src[off..off + width], &mut out[j * width..(j + 1) * width]);
        }
        out
    };
    let in_place = p.pages.is_none();
    // The copies (when made) live until the end of the head; moving a Vec does not move its buffer.
    let (kptr, ks, _kcopy) = match T::as_f32(p.k) {
        Some(kf) if in_place => (SharedConst(kf[p.k_row(b, kvh, 0)..].as_ptr()), p.k_st.s, Vec::new()),
        _ => {
            let c = widen_head(p.k, &|j| p.k_row(b, kvh, j), d);
            (SharedConst(c.as_ptr()), d, c)
        }
    };
    let (vptr, vs, _vcopy) = match T::as_f32(p.v) {
        Some(vf) if in_place => (SharedConst(vf[p.v_row(b, kvh, 0)..].as_ptr()), p.v_st.s, Vec::new()),
        _ => {
            let c = widen_head(p.v, &|j| p.v_row(b, kvh, j), dv);
            (SharedConst(c.as_ptr()), dv, c)
        }
    };

    // Pass 1: Sᵀ = K·Qᵀ, the whole Sk × Sq score matrix.
    let mut st = vec![0.0f32; sk * sqp];
    let stp = SharedMut(st.as_mut_ptr());
    let qtp = SharedConst(qt.as_ptr());
    for_chunks(par, sk, KEY_CHUNK, |j0, j1| {
        dispatch(path, Scores { d, k: kptr, ks, j0, j1, qt: qtp, sqp, st: stp });
    });

    // Pass 2: softcap and ALiBi, mask, softmax over each query's column, normalised probabilities
    // (rounded to T).
    let mut lse = vec![0.0f32; sqp];
    let lsep = SharedMut(lse.as_mut_ptr());
    let cols = (ROW_CHUNK / l).max(1) * l;
    for_chunks(par, sqp, cols, |i0, i1| {
        let rows: Vec<(usize, usize)> = (i0..i1.min(sq)).map(|i| (h, i)).collect();
        dispatch(path, Softmax { p, b, rows: &rows, st: stp, sqp, sk, i0, i1, lse: lsep });
    });

    // Pass 3: O = P·V, then one rounding to T.
    for_chunks(par, sq, ROW_CHUNK, |r0, r1| {
        let mut o = vec![0.0f32; (r1 - r0) * dvp];
        let op = SharedMut(o.as_mut_ptr());
        let finite = dispatch(path, Pv { sk, st: stp, sqp, r0, r1, v: vptr, vs, dv, o: op, dvp });
        if !finite {
            careful_pv(p, b, h, r0, r1, stp.ptr(), sqp, vptr.0, vs, &mut o, dvp, path);
        }
        for i in r0..r1 {
            // SAFETY: row (b, h, i) is written by this chunk only; `lse` is read after pass 2 finished.
            unsafe { p.write_row(b, h, i, &o[(i - r0) * dvp..], *lsep.ptr().add(i)) };
        }
    });
}

/// A read-only pointer shared by the chunk tasks.
#[derive(Debug, Clone, Copy)]
struct SharedConst(*const f32);
// SAFETY: only read while the owning buffer is alive (every pass joins before the buffer drops).
unsafe impl Send for SharedConst {}
// SAFETY: as above.
unsafe impl Sync for SharedConst {}

struct Scores {
    d: usize,
    k: SharedConst,
    ks: usize,
    j0: usize,
    j1: usize,
    qt: SharedConst,
    sqp: usize,
    st: SharedMut<f32>,
}

impl SimdKernel for Scores {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let nk = self.j1 - self.j0;
        // SAFETY: K rows j0..j1 exist at stride ks; Qᵀ is d × sqp; rows j0..j1 of Sᵀ belong to this chunk.
        unsafe {
            micro::scores(
                s,
                self.d,
                self.k.0.add(self.j0 * self.ks),
                self.ks,
                nk,
                self.qt.0,
                self.sqp,
                self.sqp / S::LANES,
                self.st.0.add(self.j0 * self.sqp),
                self.sqp,
            )
        };
    }
}

/// Pass 2 on the columns `i0..i1` of head `(b, rows[0].0)`: query rows `rows` (the chunk's columns below
/// Sq).
struct Softmax<'r, 'a, T> {
    p: &'r Problem<'a, T>,
    b: usize,
    rows: &'r [(usize, usize)],
    st: SharedMut<f32>,
    sqp: usize,
    sk: usize,
    i0: usize,
    i1: usize,
    lse: SharedMut<f32>,
}

impl<T: CpuElement> SimdKernel for Softmax<'_, '_, T> {
    type Output = ();
    #[inline(always)]
    fn run<S: Simd>(self, s: S) {
        let lanes = S::LANES;
        let round = T::DTYPE != sdpa_core::DType::F32;
        let mut mx = [0.0f32; 16];
        let mut sm = [0.0f32; 16];
        let (p, cols) = (self.p, self.i1 - self.i0);
        // SAFETY: columns i0..i1 (a multiple of LANES wide, inside sqp) of the sk rows of Sᵀ and lse[i0..i1]
        // belong to this chunk.
        unsafe {
            let tile = self.st.0.add(self.i0);
            if !p.mods.is_plain() {
                let (mut neg_slope, mut diag) = (vec![0.0f32; cols], vec![0.0f32; cols]);
                p.mods.row_consts(self.rows, &mut neg_slope, &mut diag);
                p.mods.apply(s, &neg_slope, &diag, 0, self.sk, cols, tile, self.sqp, 1);
            }
            p.apply_mask(self.b, self.rows, 0, self.sk, tile, self.sqp, 1);
            let mut n = self.i0;
            while n < self.i1 {
                let col = self.st.0.add(n);
                let at = |j: usize| col.add(j * self.sqp);
                let mut m = s.splat(f32::NEG_INFINITY);
                for j in 0..self.sk {
                    m = s.max(m, s.load(at(j)));
                }
                s.store(mx.as_mut_ptr(), m);
                for v in mx.iter_mut().take(lanes) {
                    if *v == f32::NEG_INFINITY {
                        *v = 0.0;
                    }
                }
                let g = s.load(mx.as_ptr());
                let mut sum = s.zero();
                for j in 0..self.sk {
                    let e = s.exp(s.sub(s.load(at(j)), g));
                    s.store(at(j), e);
                    sum = s.add(sum, e);
                }
                s.store(sm.as_mut_ptr(), sum);
                for x in 0..lanes {
                    let (l, m) = (sm[x], mx[x]);
                    *self.lse.0.add(n + x) = if l == 0.0 { f32::NEG_INFINITY } else { m + l.ln() };
                    sm[x] = if l == 0.0 { 0.0 } else { 1.0 / l };
                }
                let inv = s.load(sm.as_ptr());
                for j in 0..self.sk {
                    s.store(at(j), s.mul(s.load(at(j)), inv));
                    if round {
                        for x in 0..lanes {
                            *at(j).add(x) = T::from_f32(*at(j).add(x)).to_f32();
                        }
                    }
                }
                n += lanes;
            }
        }
    }
}

struct Pv {
    sk: usize,
    st: SharedMut<f32>,
    sqp: usize,
    r0: usize,
    r1: usize,
    v: SharedConst,
    vs: usize,
    dv: usize,
    o: SharedMut<f32>,
    dvp: usize,
}

impl SimdKernel for Pv {
    /// Whether every accumulated value is finite.
    type Output = bool;
    #[inline(always)]
    fn run<S: Simd>(self, s: S) -> bool {
        // SAFETY: Pᵀ columns r0..r1 over sk rows; V is sk rows of dv at stride vs; `o` is this chunk's own
        // (r1 - r0) × dvp buffer.
        unsafe {
            micro::pv(
                s,
                self.sk,
                self.st.0.add(self.r0),
                self.sqp,
                1,
                self.v.0,
                self.vs,
                self.r1 - self.r0,
                self.dv,
                self.o.0,
                self.dvp,
                None,
                None,
            );
            nonfinite::all_finite(s, std::slice::from_raw_parts(self.o.0, (self.r1 - self.r0) * self.dvp))
        }
    }
}

/// Rows `r0..r1` of head `(b, h)` again, for a chunk whose P·V came out non-finite: V rows holding NaN or
/// inf leave the product and come back only for the rows that attend to them (see `nonfinite`).
#[allow(clippy::too_many_arguments)]
fn careful_pv<T: CpuElement>(
    p: &Problem<'_, T>,
    b: usize,
    h: usize,
    r0: usize,
    r1: usize,
    st: *mut f32,
    sqp: usize,
    v: *const f32,
    vs: usize,
    o: &mut [f32],
    dvp: usize,
    path: SimdPath,
) {
    let (sk, dv) = (p.sk, p.dv);
    // SAFETY: `v` holds sk rows of dv f32 at stride vs (the head's V, in place or widened).
    let screened = unsafe { nonfinite::ScreenedV::new(true, v, vs, sk, dv, dvp) };
    let (clean, cs) = screened.tile(v, vs, dvp);
    o.fill(0.0);
    let op = SharedMut(o.as_mut_ptr());
    let stp = SharedMut(st);
    dispatch(path, Pv { sk, st: stp, sqp, r0, r1, v: SharedConst(clean), vs: cs, dv, o: op, dvp });
    let rows: Vec<(usize, usize)> = (r0..r1).map(|i| (h, i)).collect();
    // SAFETY: P is the head's Sk × sqp matrix (columns r0..r1 are this chunk's); `o` holds r1 - r0 rows
    // of dvp values.
    let prob = ProbTile { pt: unsafe { st.add(r0) }, ps: sqp, pr: 1 };
    // SAFETY: as above.
    unsafe { screened.add_back(p, b, &rows, 0, prob, o.as_mut_ptr(), dvp) };
}
