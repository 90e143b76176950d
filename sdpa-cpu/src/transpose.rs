//! Row-major tiles written column-major: the query tiles `Qᵀ[dim][row]` (and the backward's `dOᵀ`) that the
//! score kernels read with rows along the vector lanes.

/// Rows a block of [`transpose_rows`] spans: one 64-byte line of f32 in the destination per column.
pub(crate) const BLOCK: usize = 16;

/// `dst[c·ds + r] = src[r·ss + c] · scale` for rows `r < nr` and columns `c < n`.
///
/// Blocks of [`BLOCK`] rows go column by column, so each line of `dst` is filled by consecutive stores.
/// Row by row, each row touched `n` lines of `dst` (at n = 512 more than L1 holds, so lines went back and
/// forth to L2 between rows), and LLVM made those strided stores scatters: a tenth of an in-cache AVX-512
/// call at D = 512.
///
/// Inlined into the caller so it compiles under the caller's target features.
#[inline(always)]
pub(crate) fn transpose_rows(src: &[f32], ss: usize, nr: usize, n: usize, scale: f32, dst: &mut [f32], ds: usize) {
    let mut r0 = 0;
    while r0 < nr {
        let m = (nr - r0).min(BLOCK);
        for c in 0..n {
            let col = &mut dst[c * ds + r0..c * ds + r0 + m];
            for (k, x) in col.iter_mut().enumerate() {
                *x = src[(r0 + k) * ss + c] * scale;
            }
        }
        r0 += m;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value lands once at its transposed place, scaled; padding columns of `dst` stay untouched.
    #[test]
    fn transposes_blocks_and_ragged_rests() {
        for (nr, n) in [(1, 1), (15, 3), (16, 40), (37, 33)] {
            let (ss, ds) = (n + 2, nr + 5);
            let src: Vec<f32> = (0..nr * ss).map(|i| i as f32).collect();
            let mut dst = vec![-1.0; n * ds];
            transpose_rows(&src, ss, nr, n, 0.5, &mut dst, ds);
            for c in 0..n {
                for r in 0..ds {
                    let want = if r < nr { src[r * ss + c] * 0.5 } else { -1.0 };
                    assert_eq!(dst[c * ds + r], want, "nr {nr} n {n}: column {c} row {r}");
                }
            }
        }
    }
}
