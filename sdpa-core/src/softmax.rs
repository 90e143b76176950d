//! Online softmax: the state every fused kernel keeps per query row (DESIGN.md, "Online softmax").
//!
//! State: running max `m`, running sum `l`, accumulator `acc` (length Dv), all f32 as in the kernels.
//! Absorbing a block of scores `s` with value rows `v`:
//! `m' = max(m, max s)`, `acc = acc·e^(m-m') + Σ e^(s-m')·v`, `l = l·e^(m-m') + Σ e^(s-m')`.
//! Merging two states rescales both to the larger max. A state with `m = -inf` (nothing seen, or only
//! masked keys) is the identity of the merge. Finalize: `O = acc / l`, `LSE = m + ln l`; a row that saw no
//! key yields zeros and `LSE = -inf`.
//!
//! NaN propagates: a NaN score or value poisons the row's sum, so the output is NaN, never a number.

/// Partial softmax-weighted sum for one query row.
#[derive(Debug, Clone, PartialEq)]
pub struct OnlineSoftmax {
    /// Running maximum of the scores absorbed so far (`-inf` when none).
    pub m: f32,
    /// Running sum of `e^(s - m)`.
    pub l: f32,
    /// Running sum of `e^(s - m)·v`, length Dv.
    pub acc: Vec<f32>,
}

impl OnlineSoftmax {
    /// The empty state (the merge identity) for value width `dv`.
    pub fn new(dv: usize) -> Self {
        OnlineSoftmax { m: f32::NEG_INFINITY, l: 0.0, acc: vec![0.0; dv] }
    }

    /// Value width.
    pub fn dv(&self) -> usize {
        self.acc.len()
    }

    /// Absorbs scores `s[j]` (already scaled and masked; `-inf` for a masked key) with value rows
    /// `values[j*dv .. (j+1)*dv]`.
    pub fn absorb(&mut self, scores: &[f32], values: &[f32]) {
        let dv = self.dv();
        debug_assert_eq!(values.len(), scores.len() * dv);
        let block_max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let has_nan = scores.iter().any(|s| s.is_nan());
        let m_new = self.m.max(block_max);
        if m_new == f32::NEG_INFINITY {
            // Every key so far is masked: nothing to add, unless a NaN must be carried.
            if has_nan {
                self.l = f32::NAN;
            }
            return;
        }
        let alpha = (self.m - m_new).exp(); // 0 when self.m = -inf
        self.l *= alpha;
        for a in &mut self.acc {
            *a *= alpha;
        }
        for (j, &s) in scores.iter().enumerate() {
            if s == f32::NEG_INFINITY {
                // A masked key takes no part at all, so NaN in its value row cannot leak in.
                continue;
            }
            let p = (s - m_new).exp();
            self.l += p;
            for (a, &v) in self.acc.iter_mut().zip(&values[j * dv..(j + 1) * dv]) {
                *a += p * v;
            }
        }
        self.m = m_new;
    }

    /// Merges `other` into `self` (split-KV combine). Associative and commutative up to rounding.
    pub fn merge(&mut self, other: &OnlineSoftmax) {
        debug_assert_eq!(self.dv(), other.dv());
        let m_new = self.m.max(other.m);
        if m_new == f32::NEG_INFINITY {
            if other.l.is_nan() {
                self.l = f32::NAN;
            }
            return;
        }
        let a = (self.m - m_new).exp();
        let b = (other.m - m_new).exp();
        self.l = self.l * a + other.l * b;
        for (x, &y) in self.acc.iter_mut().zip(&other.acc) {
            *x = *x * a + y * b;
        }
        self.m = m_new;
    }

    /// Writes `acc / l` into `out` (length Dv) and returns the log-sum-exp. A row that saw no unmasked key
    /// gets zeros and `-inf`.
    pub fn finalize(&self, out: &mut [f32]) -> f32 {
        if self.l == 0.0 {
            out.iter_mut().for_each(|o| *o = 0.0);
            return f32::NEG_INFINITY;
        }
        let inv = 1.0 / self.l;
        for (o, &a) in out.iter_mut().zip(&self.acc) {
            *o = a * inv;
        }
        self.m + self.l.ln()
    }
}

/// Merges partial results given as (output row, LSE) pairs, the form split-KV kernels write: each partial
/// is a normalised output with its log-sum-exp. Writes the merged row into `out` and returns its LSE.
/// Partials with `LSE = -inf` take no part; if all are `-inf` the row is zeros.
pub fn merge_normalized(partials: &[(&[f32], f32)], out: &mut [f32]) -> f32 {
    let m = partials.iter().map(|&(_, lse)| lse).fold(f32::NEG_INFINITY, f32::max);
    if partials.iter().any(|&(_, lse)| lse.is_nan()) {
        out.iter_mut().for_each(|o| *o = f32::NAN);
        return f32::NAN;
    }
    if m == f32::NEG_INFINITY {
        out.iter_mut().for_each(|o| *o = 0.0);
        return f32::NEG_INFINITY;
    }
    let mut total = 0.0f32;
    out.iter_mut().for_each(|o| *o = 0.0);
    for &(row, lse) in partials {
        let w = (lse - m).exp();
        total += w;
        for (o, &x) in out.iter_mut().zip(row) {
            *o += w * x;
        }
    }
    let inv = 1.0 / total;
    out.iter_mut().for_each(|o| *o *= inv);
    m + total.ln()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Two-pass softmax in f64: the definition the streaming form must reproduce.
    fn two_pass(scores: &[f32], values: &[f32], dv: usize) -> (Vec<f64>, f64) {
        let m = scores.iter().map(|&s| s as f64).fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            return (vec![0.0; dv], f64::NEG_INFINITY);
        }
        let mut l = 0.0;
        let mut o = vec![0.0; dv];
        for (j, &s) in scores.iter().enumerate() {
            if s == f32::NEG_INFINITY {
                continue;
            }
            let p = (s as f64 - m).exp();
            l += p;
            for c in 0..dv {
                o[c] += p * values[j * dv + c] as f64;
            }
        }
        (o.iter().map(|x| x / l).collect(), m + l.ln())
    }

    fn state_of(scores: &[f32], values: &[f32], dv: usize) -> OnlineSoftmax {
        let mut s = OnlineSoftmax::new(dv);
        s.absorb(scores, values);
        s
    }

    fn close(a: &[f32], b: &[f64], tol: f64) -> bool {
        a.iter().zip(b).all(|(&x, &y)| (x as f64 - y).abs() <= tol * (1.0 + y.abs()))
    }

    /// Scores with occasional masked (-inf) entries and a chosen magnitude, plus values.
    fn block(max_len: usize, mag: f32) -> impl Strategy<Value = (Vec<f32>, Vec<f32>, usize)> {
        (1usize..max_len, 1usize..6).prop_flat_map(move |(n, dv)| {
            (
                prop::collection::vec(prop_oneof![9 => -mag..mag, 1 => Just(f32::NEG_INFINITY)], n),
                prop::collection::vec(-1.0f32..1.0, n * dv),
                Just(dv),
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn any_partition_gives_the_two_pass_result(
            (scores, values, dv) in block(64, 20.0),
            cuts in prop::collection::vec(0usize..64, 0..6),
        ) {
            let n = scores.len();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (n + 1)).collect();
            cuts.push(0);
            cuts.push(n);
            cuts.sort_unstable();
            cuts.dedup();
            let mut st = OnlineSoftmax::new(dv);
            for w in cuts.windows(2) {
                st.absorb(&scores[w[0]..w[1]], &values[w[0] * dv..w[1] * dv]);
            }
            let mut out = vec![0.0; dv];
            let lse = st.finalize(&mut out);
            let (want, want_lse) = two_pass(&scores, &values, dv);
            prop_assert!(close(&out, &want, 1e-5), "{out:?} vs {want:?}");
            if want_lse.is_finite() {
                prop_assert!((lse as f64 - want_lse).abs() <= 1e-5 * (1.0 + want_lse.abs()));
            } else {
                prop_assert_eq!(lse, f32::NEG_INFINITY);
            }
        }

        #[test]
        fn merge_is_associative_and_commutative(
            (scores, values, dv) in block(48, 30.0),
            a in 0usize..48, b in 0usize..48,
        ) {
            let n = scores.len();
            let (a, b) = { let (x, y) = (a % (n + 1), b % (n + 1)); (x.min(y), x.max(y)) };
            let x = state_of(&scores[..a], &values[..a * dv], dv);
            let y = state_of(&scores[a..b], &values[a * dv..b * dv], dv);
            let z = state_of(&scores[b..], &values[b * dv..], dv);

            let mut left = x.clone(); left.merge(&y); left.merge(&z);          // (x·y)·z
            let mut yz = y.clone(); yz.merge(&z);
            let mut right = x.clone(); right.merge(&yz);                       // x·(y·z)
            let mut swapped = z.clone(); swapped.merge(&x); swapped.merge(&y); // z·x·y

            let fin = |s: &OnlineSoftmax| { let mut o = vec![0.0; dv]; let l = s.finalize(&mut o); (o, l) };
            let (lo, ll) = fin(&left);
            for other in [&right, &swapped] {
                let (oo, ol) = fin(other);
                let want: Vec<f64> = lo.iter().map(|&v| v as f64).collect();
                prop_assert!(close(&oo, &want, 1e-5), "{oo:?} vs {lo:?}");
                prop_assert!(ll == ol || (ll - ol).abs() <= 1e-5 * (1.0 + ll.abs()));
            }
        }

        #[test]
        fn the_empty_state_is_the_identity((scores, values, dv) in block(32, 10.0)) {
            let x = state_of(&scores, &values, dv);
            let mut left = OnlineSoftmax::new(dv); left.merge(&x);
            let mut right = x.clone(); right.merge(&OnlineSoftmax::new(dv));
            prop_assert_eq!(&left, &x);
            prop_assert_eq!(&right, &x);
        }

        #[test]
        fn huge_logits_stay_finite(
            (scores, values, dv) in block(40, 1.0),
            sign in prop::bool::ANY,
            cut in 0usize..40,
        ) {
            // Push every unmasked score to about ±1e4: naive exp would overflow to inf or underflow to 0/0.
            let big = if sign { 1e4f32 } else { -1e4f32 };
            let scores: Vec<f32> = scores.iter().map(|&s| if s.is_finite() { big + s } else { s }).collect();
            let cut = cut % (scores.len() + 1);
            let mut st = state_of(&scores[..cut], &values[..cut * dv], dv);
            st.merge(&state_of(&scores[cut..], &values[cut * dv..], dv));
            let mut out = vec![0.0; dv];
            let lse = st.finalize(&mut out);
            prop_assert!(out.iter().all(|x| x.is_finite()), "{out:?}");
            prop_assert!(!lse.is_nan());
            prop_assert!(lse.is_finite() || scores.iter().all(|s| *s == f32::NEG_INFINITY));
        }

        #[test]
        fn a_fully_masked_row_is_zero_with_lse_minus_inf(n in 1usize..50, dv in 1usize..8, cut in 0usize..50) {
            let scores = vec![f32::NEG_INFINITY; n];
            let values = vec![f32::NAN; n * dv]; // masked keys' values never leak in
            let cut = cut % (n + 1);
            let mut st = state_of(&scores[..cut], &values[..cut * dv], dv);
            st.merge(&state_of(&scores[cut..], &values[cut * dv..], dv));
            let mut out = vec![1.0; dv];
            let lse = st.finalize(&mut out);
            prop_assert!(out.iter().all(|&x| x == 0.0));
            prop_assert_eq!(lse, f32::NEG_INFINITY);
        }
    }

    #[test]
    fn nan_score_poisons_the_row() {
        let mut st = OnlineSoftmax::new(2);
        st.absorb(&[0.5, f32::NAN], &[1.0, 1.0, 2.0, 2.0]);
        let mut out = [0.0; 2];
        st.finalize(&mut out);
        assert!(out.iter().all(|x| x.is_nan()));

        let mut only_nan = OnlineSoftmax::new(1);
        only_nan.absorb(&[f32::NAN], &[1.0]);
        let mut out = [0.0; 1];
        only_nan.finalize(&mut out);
        assert!(out[0].is_nan());
    }

    #[test]
    fn merging_normalized_partials_matches_one_pass() {
        let scores = [0.3f32, -1.0, 2.0, 0.7, f32::NEG_INFINITY];
        let values = [1.0f32, 2.0, -1.0, 0.5, 3.0, 3.0, 0.0, 1.0, 9.0, 9.0];
        let whole = state_of(&scores, &values, 2);
        let mut want = [0.0; 2];
        let want_lse = whole.finalize(&mut want);
        let (mut a, mut b) = ([0.0; 2], [0.0; 2]);
        let la = state_of(&scores[..2], &values[..4], 2).finalize(&mut a);
        let lb = state_of(&scores[2..], &values[4..], 2).finalize(&mut b);
        let mut got = [0.0; 2];
        let lse = merge_normalized(&[(&a, la), (&b, lb), (&[0.0, 0.0], f32::NEG_INFINITY)], &mut got);
        assert!((lse - want_lse).abs() < 1e-6);
        assert!(got.iter().zip(&want).all(|(x, y)| (x - y).abs() < 1e-6));
    }
}
