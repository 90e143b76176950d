//! Softcap and ALiBi on a score tile, in registers, between the score product and the mask (sdpa-core's
//! `variants` defines the score; windows are part of the key band, `Problem::key_range`).
//!
//! The tile holds `x = scale · q·k` (Q is pre-scaled, or the pair kernel scales on the way out). One pass
//! over it, while it is still in L1, turns each score into `cap · tanh(x / cap) − slope_h · |j − diag(i)|`;
//! the mask then replaces the scores of keys a row does not see by `−inf` (or adds the explicit mask), and
//! the online softmax takes its max over the finished scores. No bias tensor: the ALiBi term is computed
//! per element from the row's slope and diagonal and the key's index.

use crate::simd::Simd;
use sdpa_core::{AttentionSpec, Result};

/// The score modifications of one call.
#[derive(Debug, Clone, Default)]
pub(crate) struct ScoreMods {
    /// The softcap, as f32.
    pub softcap: Option<f32>,
    /// `−slope` of every query head, when ALiBi is on.
    pub neg_slopes: Option<Vec<f32>>,
    /// `diag(i) − i` for this call's lengths (0 when no diagonal is named, which validation allows only
    /// without ALiBi or a window).
    pub diag_off: i64,
}

impl ScoreMods {
    /// The spec's softcap and ALiBi (the spec is validated: its slopes are finite, one per query head).
    pub(crate) fn of(spec: &AttentionSpec) -> Result<ScoreMods> {
        let s = spec.shape;
        Ok(ScoreMods {
            softcap: spec.softcap().map(|c| c as f32),
            neg_slopes: spec.alibi_slopes()?.map(|v| v.into_iter().map(|x| -x).collect()),
            diag_off: spec.diagonal().map_or(0, |d| d.offset(s.sq, s.sk)) as i64,
        })
    }

    /// The same modifications for one sequence of lengths `sq`, `sk` (its own ALiBi diagonal).
    pub(crate) fn for_lengths(&self, spec: &AttentionSpec, sq: usize, sk: usize) -> ScoreMods {
        ScoreMods { diag_off: spec.diagonal().map_or(0, |d| d.offset(sq, sk)) as i64, ..self.clone() }
    }

    /// True when scores pass unchanged.
    #[inline]
    pub(crate) fn is_plain(&self) -> bool {
        self.softcap.is_none() && self.neg_slopes.is_none()
    }

    /// ALiBi's per-row constants for `rows` (query head, position): `−slope_h` into `neg_slope[r]` and
    /// `diag(i)` into `diag[r]`, the rest of both slices zeroed (padding lanes: their scores are never
    /// read). Nothing when ALiBi is off.
    pub(crate) fn row_consts(&self, rows: &[(usize, usize)], neg_slope: &mut [f32], diag: &mut [f32]) {
        if let Some(ns) = &self.neg_slopes {
            for (r, &(h, i)) in rows.iter().enumerate() {
                neg_slope[r] = ns[h];
                // Positions and keys are exact in f32 below 2^24, so the distance is exact there.
                diag[r] = (i as i64 + self.diag_off) as f32;
            }
            neg_slope[rows.len()..].fill(0.0);
            diag[rows.len()..].fill(0.0);
        }
    }

    /// Modifies the tile's scores `st[(j − j0)·ks + r·rs]` for keys `j0 .. j0 + nk` and rows `r < nrows`.
    /// `rs == 1` (rows along the lanes, `nrows` a multiple of `LANES`, the Sᵀ tiles) or `ks == 1` (keys
    /// along the lanes, the decoding layout). `neg_slope` and `diag` come from [`ScoreMods::row_consts`]
    /// (at least `nrows` values when ALiBi is on).
    ///
    /// # Safety
    /// Every index `(j − j0)·ks + r·rs` for `j < j0 + nk`, `r < nrows` is inside `st`, written by no one
    /// else meanwhile.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) unsafe fn apply<S: Simd>(
        &self,
        s: S,
        neg_slope: &[f32],
        diag: &[f32],
        j0: usize,
        nk: usize,
        nrows: usize,
        st: *mut f32,
        ks: usize,
        rs: usize,
    ) {
        let lanes = S::LANES;
        let cap = self.softcap.map(|c| Cap::new(s, c));
        let alibi = self.neg_slopes.is_some();
        // SAFETY (whole body): every access is one of the caller's (key, row) indices.
        unsafe {
            if rs == 1 {
                debug_assert!(nrows.is_multiple_of(lanes));
                for j in 0..nk {
                    let row = st.add(j * ks);
                    let jv = s.splat((j0 + j) as f32);
                    let mut r = 0;
                    while r < nrows {
                        let mut x = s.load(row.add(r));
                        if let Some(c) = cap {
                            x = c.apply(s, x);
                        }
                        if alibi {
                            x = alibi_term(s, x, s.load(neg_slope.as_ptr().add(r)), s.load(diag.as_ptr().add(r)), jv);
                        }
                        s.store(row.add(r), x);
                        r += lanes;
                    }
                }
            } else {
                debug_assert_eq!(ks, 1);
                let full = nk / lanes * lanes;
                let iota = s.load(IOTA.as_ptr());
                for r in 0..nrows {
                    let row = st.add(r * rs);
                    let (ns, dg) = if alibi { (neg_slope[r], diag[r]) } else { (0.0, 0.0) };
                    let (nsv, dgv) = (s.splat(ns), s.splat(dg));
                    let mut j = 0;
                    while j < full {
                        let mut x = s.load(row.add(j));
                        if let Some(c) = cap {
                            x = c.apply(s, x);
                        }
                        if alibi {
                            x = alibi_term(s, x, nsv, dgv, s.add(iota, s.splat((j0 + j) as f32)));
                        }
                        s.store(row.add(j), x);
                        j += lanes;
                    }
                    for j in full..nk {
                        let mut x = *row.add(j);
                        if let Some(c) = self.softcap {
                            x = softcap1(x, c);
                        }
                        if alibi {
                            x += ns * ((j0 + j) as f32 - dg).abs();
                        }
                        *row.add(j) = x;
                    }
                }
            }
        }
    }
}

/// Lane offsets 0, 1, 2, ... (key indices along the lanes).
static IOTA: [f32; 16] = [0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12., 13., 14., 15.];

/// `x + neg_slope · |j − diag|`.
#[inline(always)]
fn alibi_term<S: Simd>(s: S, x: S::V, neg_slope: S::V, diag: S::V, j: S::V) -> S::V {
    let dist = s.sub(j, diag);
    let dist = s.max(s.sub(s.zero(), dist), dist);
    s.fma(neg_slope, dist, x)
}

/// The softcap's constants in vectors.
#[derive(Clone, Copy)]
struct Cap<V> {
    inv_cap: V,
    cap: V,
    two_cap: V,
}

/// `|2x / cap|` past which `tanh(x / cap)` is ±1 in f32 (`1 − tanh(20) ≈ 8e-18`), and `e^40` stays finite.
const CAP_CLAMP: f32 = 40.0;
/// Below `(x / cap)² = 1/64` the odd series of tanh is used: the exp form keeps an absolute accuracy of a
/// few ulps of `cap` but loses the relative one near 0.
const SERIES_BELOW: f32 = 1.0 / 64.0;
/// `tanh(u) / u = Σ c_k u^(2k)`, the Taylor coefficients to `u^8` (the next term is under 3e-10 relative at
/// `|u| = 1/8`).
const TANH_SERIES: [f32; 5] = [1.0, -1.0 / 3.0, 2.0 / 15.0, -17.0 / 315.0, 62.0 / 2835.0];

impl<V: Copy> Cap<V> {
    #[inline(always)]
    fn new<S: Simd<V = V>>(s: S, cap: f32) -> Self {
        Cap { inv_cap: s.splat(1.0 / cap), cap: s.splat(cap), two_cap: s.splat(2.0 * cap) }
    }

    /// `cap · tanh(u)`, `u = x / cap`: for `|u| ≥ 1/8` as `cap − 2·cap / (e^(2u) + 1)` (one exp and one
    /// reciprocal, within a few f32 ulps of `cap`; the exponent clamped where tanh is ±1, the constant first
    /// so a NaN lane passes through; ±cap at ±inf), below as `x · Σ c_k u^(2k)` (relative accuracy near 0,
    /// so a cap far above the logits changes nothing). Logits mostly lie well inside the cap, so a vector
    /// whose lanes all take the series skips the exp form. (Skipping the series when all lanes are far was
    /// measured slower here: with logits of tens that branch goes either way and mispredicts.)
    #[inline(always)]
    fn apply<S: Simd<V = V>>(self, s: S, x: V) -> V {
        let u = s.mul(x, self.inv_cap);
        let u2 = s.mul(u, u);
        let mut poly = s.splat(TANH_SERIES[4]);
        for &c in TANH_SERIES[..4].iter().rev() {
            poly = s.fma(poly, u2, s.splat(c));
        }
        let near = s.mul(x, poly);
        let below = s.splat(SERIES_BELOW);
        if s.all_lt(u2, below) {
            return near;
        }
        let y = s.add(u, u);
        let y = s.min(s.splat(CAP_CLAMP), s.max(s.splat(-CAP_CLAMP), y));
        let e = s.exp(y);
        let far = s.sub(self.cap, s.mul(self.two_cap, s.recip(s.add(e, s.splat(1.0)))));
        // A NaN lane compares false, so it keeps the far form's NaN.
        s.select_lt(u2, below, near, far)
    }
}

/// The scalar form of [`Cap::apply`], for tails.
#[inline(always)]
fn softcap1(x: f32, cap: f32) -> f32 {
    cap * (x / cap).tanh()
}
