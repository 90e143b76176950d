//! NaN and inf in V under keys a row does not attend to.
//!
//! P·V multiplies whole key tiles. A key masked for some rows of the tile has probability 0 in those rows,
//! but `0 · NaN` is NaN (and so is `0 · inf`), so without care a non-finite V row under a masked key would
//! reach every row that loads the tile, where the f64 reference skips the key. (K needs nothing: a masked
//! score is replaced by `-inf`, never added to, so a NaN score under the mask disappears.)
//!
//! The fast path pays nothing per key: a kernel checks its f32 accumulators once per work item (a few
//! hundred values against the item's millions of products), and only when one is non-finite does the item
//! run again in careful mode. There each V tile is scanned; its non-finite rows are zeroed for the tile
//! product and added back key by key for exactly the rows that attend to them (`Problem::visible`), so a
//! NaN a row does attend to still gives NaN in the columns it touches, as in the reference. Finite inputs
//! never take the careful path.

use crate::element::CpuElement;
use crate::problem::Problem;
use crate::simd::Simd;

/// True when every value of `x` is finite (no NaN, no ±inf).
#[inline(always)]
pub(crate) fn all_finite<S: Simd>(s: S, x: &[f32]) -> bool {
    let l = S::LANES;
    let full = x.len() / l * l;
    // `v - v` is 0 for finite v and NaN for NaN or ±inf; NaN survives the sum.
    let mut acc = s.zero();
    let mut c = 0;
    while c < full {
        // SAFETY: `c + LANES <= x.len()`.
        let v = unsafe { s.load(x.as_ptr().add(c)) };
        acc = s.add(acc, s.sub(v, v));
        c += l;
    }
    let tail_finite = x[full..].iter().all(|v| v.is_finite());
    tail_finite && s.reduce_sum(acc) == 0.0
}

/// Indices `j < nk` of the V rows (`dv` f32 at stride `vs`) holding a non-finite value.
///
/// # Safety
/// `v` addresses `nk` rows of `dv` f32 at stride `vs`.
unsafe fn bad_rows(v: *const f32, vs: usize, nk: usize, dv: usize) -> Vec<usize> {
    (0..nk)
        .filter(|&j| {
            // SAFETY: row j exists (contract).
            let row = unsafe { std::slice::from_raw_parts(v.add(j * vs), dv) };
            row.iter().any(|x| !x.is_finite())
        })
        .collect()
}

/// The tile as `nk` rows of `dvp` f32 (zero beyond `dv`) with the rows listed in `bad` zeroed.
///
/// # Safety
/// As [`bad_rows`].
unsafe fn sanitized(v: *const f32, vs: usize, nk: usize, dv: usize, dvp: usize, bad: &[usize]) -> Vec<f32> {
    let mut out = vec![0.0f32; nk * dvp];
    for j in (0..nk).filter(|j| !bad.contains(j)) {
        // SAFETY: row j exists (contract).
        let row = unsafe { std::slice::from_raw_parts(v.add(j * vs), dv) };
        out[j * dvp..j * dvp + dv].copy_from_slice(row);
    }
    out
}

/// Where the careful path finds a tile's probabilities: `P(row r, key j) = pt[j*ps + r*pr]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProbTile {
    pub pt: *const f32,
    pub ps: usize,
    pub pr: usize,
}

/// Adds `P(r, j) · V[j]` into `o[r*os ..][..dv]` for every bad key `bad[n]` (tile index, key `j0 + bad[n]`,
/// its V row widened in `vals[n*dv..]`) and every row `r` (query `rows[r]` of batch `b`) that attends to it.
///
/// # Safety
/// `prob` addresses every `(j, r)` of the tile; `o` addresses `rows.len()` rows of `dv` f32 at stride `os`.
pub(crate) unsafe fn add_back<T: CpuElement>(
    p: &Problem<'_, T>,
    b: usize,
    rows: &[(usize, usize)],
    j0: usize,
    bad: &[usize],
    vals: &[f32],
    prob: ProbTile,
    o: *mut f32,
    os: usize,
) {
    let dv = p.dv;
    for (n, &j) in bad.iter().enumerate() {
        let vrow = &vals[n * dv..(n + 1) * dv];
        for (r, &(h, i)) in rows.iter().enumerate() {
            if !p.visible(b, h, i, j0 + j) {
                continue;
            }
            // SAFETY: inside the tile and the output rows (contract).
            unsafe {
                let pv = *prob.pt.add(j * prob.ps + r * prob.pr);
                let orow = std::slice::from_raw_parts_mut(o.add(r * os), dv);
                for (x, &y) in orow.iter_mut().zip(vrow) {
                    *x += pv * y;
                }
            }
        }
    }
}

/// A V tile as the careful path multiplies it: the rows holding NaN or inf (tile indices) are taken out of
/// the tile product, kept widened, and added back afterwards for exactly the rows that attend to them.
/// Outside careful mode, or when every row is finite, it is empty: nothing is copied and nothing added.
pub(crate) struct ScreenedV {
    bad: Vec<usize>,
    vals: Vec<f32>,
    clean: Vec<f32>,
}

impl ScreenedV {
    /// Screens the tile `v` (`nk` rows of `dv` f32 at stride `vs`) when `careful`.
    ///
    /// # Safety
    /// As [`bad_rows`].
    pub(crate) unsafe fn new(careful: bool, v: *const f32, vs: usize, nk: usize, dv: usize, dvp: usize) -> Self {
        // SAFETY: the caller's contract.
        let bad = if careful { unsafe { bad_rows(v, vs, nk, dv) } } else { Vec::new() };
        if bad.is_empty() {
            return ScreenedV { bad, vals: Vec::new(), clean: Vec::new() };
        }
        // SAFETY: the caller's contract.
        let clean = unsafe { sanitized(v, vs, nk, dv, dvp, &bad) };
        let mut vals = vec![0.0f32; bad.len() * dv];
        for (n, &j) in bad.iter().enumerate() {
            // SAFETY: row j of the tile exists (contract).
            vals[n * dv..(n + 1) * dv].copy_from_slice(unsafe { std::slice::from_raw_parts(v.add(j * vs), dv) });
        }
        ScreenedV { bad, vals, clean }
    }

    /// The tile to multiply, as (pointer, row stride): the copy without the bad rows (stride `dvp`) when
    /// some were taken out, else `(v, vs)` itself.
    pub(crate) fn tile(&self, v: *const f32, vs: usize, dvp: usize) -> (*const f32, usize) {
        if self.bad.is_empty() {
            (v, vs)
        } else {
            (self.clean.as_ptr(), dvp)
        }
    }

    /// After the tile product: adds each taken-out row back for the rows that attend to it (see
    /// [`add_back`]); `rows`, `j0`, `prob`, `o` and `os` as there.
    ///
    /// # Safety
    /// As [`add_back`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn add_back<T: CpuElement>(
        &self,
        p: &Problem<'_, T>,
        b: usize,
        rows: &[(usize, usize)],
        j0: usize,
        prob: ProbTile,
        o: *mut f32,
        os: usize,
    ) {
        if !self.bad.is_empty() {
            // SAFETY: the caller's contract.
            unsafe { add_back(p, b, rows, j0, &self.bad, &self.vals, prob, o, os) };
        }
    }
}

/// The rows listed in `bad` (tile indices), widened to f32 one after another.
pub(crate) fn widen_rows<T: CpuElement>(v: &[T], base: usize, vs: usize, dv: usize, bad: &[usize]) -> Vec<f32> {
    let mut out = vec![0.0f32; bad.len() * dv];
    for (n, &j) in bad.iter().enumerate() {
        let off = base + j * vs;
        T::widen(&v[off..off + dv], &mut out[n * dv..(n + 1) * dv]);
    }
    out
}
