//! One validated attention call as the kernels see it: sizes, strides, the operand slices, the key band
//! (causal mask and window), the explicit mask, softcap and ALiBi, and the output pointers shared by the
//! worker threads.

use crate::element::CpuElement;
use crate::variants::ScoreMods;
use sdpa_core::{AttentionSpec, KeyBand, Mask, Result, Strides};
use std::ops::Range;

/// How an explicit mask reaches the kernels (causal masks and windows are the key band).
#[derive(Debug, Clone, Copy)]
pub(crate) enum MaskSel<'a> {
    /// No explicit mask.
    None,
    /// Additive f32 values with broadcast strides over (b, h, q, k) (0 on broadcast dims).
    Explicit { data: &'a [f32], strides: [usize; 4] },
}

/// A raw output pointer that worker threads write through, each to rows no other thread writes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SharedMut<T>(pub(crate) *mut T);

impl<T> SharedMut<T> {
    /// The pointer (a method, so closures capture the `Send` wrapper, not the bare pointer).
    #[inline(always)]
    pub(crate) fn ptr(self) -> *mut T {
        self.0
    }
}

// SAFETY: the pointer is only dereferenced for disjoint rows (validated non-aliasing output strides, one
// work item per row), and the slice it came from outlives every worker (rayon joins before returning).
unsafe impl<T: Send> Send for SharedMut<T> {}
// SAFETY: as above; no two threads touch the same element.
unsafe impl<T: Send> Sync for SharedMut<T> {}

/// Everything a kernel needs about one call; built after validation, trusted afterwards.
#[derive(Debug)]
pub(crate) struct Problem<'a, T> {
    pub b: usize,
    pub hq: usize,
    pub sq: usize,
    pub sk: usize,
    pub d: usize,
    pub dv: usize,
    /// Query heads per kv head.
    pub group: usize,
    pub scale: f32,
    pub q: &'a [T],
    pub k: &'a [T],
    pub v: &'a [T],
    pub mask: MaskSel<'a>,
    /// Keys each row may see by position: the causal mask and the window (`KeyBand::range`).
    pub band: KeyBand,
    /// Softcap and ALiBi.
    pub mods: ScoreMods,
    pub q_st: Strides,
    pub k_st: Strides,
    pub v_st: Strides,
    pub o_st: Strides,
    pub o: SharedMut<T>,
    /// `[B, Hq, Sq]` log-sum-exp, when requested.
    pub lse: Option<SharedMut<f32>>,
}

impl<'a, T: CpuElement> Problem<'a, T> {
    pub(crate) fn new(
        spec: &AttentionSpec,
        q: &'a [T],
        k: &'a [T],
        v: &'a [T],
        mask: Option<&'a [f32]>,
        o: &'a mut [T],
        lse: Option<&'a mut [f32]>,
    ) -> Result<Self> {
        let s = spec.shape;
        let mask = match (&spec.mask, mask) {
            (Mask::Explicit(m), Some(data)) => MaskSel::Explicit { data, strides: m.strides() },
            _ => MaskSel::None,
        };
        Ok(Problem {
            b: s.b,
            hq: s.hq,
            sq: s.sq,
            sk: s.sk,
            d: s.d,
            dv: s.dv,
            group: s.group_size(),
            scale: spec.scale() as f32,
            q,
            k,
            v,
            mask,
            band: spec.band(),
            mods: ScoreMods::of(spec)?,
            q_st: spec.q_strides,
            k_st: spec.k_strides,
            v_st: spec.v_strides,
            o_st: spec.o_strides,
            o: SharedMut(o.as_mut_ptr()),
            lse: lse.map(|l| SharedMut(l.as_mut_ptr())),
        })
    }

    /// Number of kv heads.
    pub(crate) fn hkv(&self) -> usize {
        self.hq / self.group
    }

    /// Rows of one kv head's work: every (query head of the group, query position) pair.
    pub(crate) fn group_rows(&self) -> usize {
        self.group * self.sq
    }

    /// Query head and position of row `r` of kv head `kvh`'s group (head-major).
    #[inline]
    pub(crate) fn row(&self, kvh: usize, r: usize) -> (usize, usize) {
        (kvh * self.group + r / self.sq, r % self.sq)
    }

    /// Keys `lo..hi` that query position `i` may see by position (causal mask and window; all keys
    /// without either), possibly empty.
    #[inline]
    pub(crate) fn key_range(&self, i: usize) -> Range<usize> {
        self.band.range(i, self.sk)
    }

    /// The most keys one row sees by position: the window's width when it bounds both sides, else Sk
    /// (what sizes the tiles: the keys an item streams).
    pub(crate) fn row_keys(&self) -> usize {
        match (self.band.lo, self.band.hi) {
            (Some(lo), Some(hi)) => usize::try_from(hi - lo + 1).unwrap_or(0).min(self.sk),
            _ => self.sk,
        }
    }

    /// Whether query `(h, i)` of batch `b` attends to key `j` at all (the f64 reference's rule: keys
    /// outside the row's band and explicit `-inf` entries take no part; a finite additive value keeps the
    /// key). Only the careful path of a tile with non-finite V asks this, key by key.
    pub(crate) fn visible(&self, b: usize, h: usize, i: usize, j: usize) -> bool {
        self.key_range(i).contains(&j)
            && match self.mask {
                MaskSel::None => true,
                MaskSel::Explicit { data, strides } => {
                    data[b * strides[0] + h * strides[1] + i * strides[2] + j * strides[3]] != f32::NEG_INFINITY
                }
            }
    }

    /// Applies the mask to a score tile `st[(j - j0)·ks + r·rs]` for keys `j0..j1` and rows
    /// `rows` (pairs of query head and position, one per lane). Keys outside a row's band become `-inf`;
    /// explicit values are added, and an explicit `-inf` replaces the score so that a masked key takes no
    /// part even when the score is NaN.
    ///
    /// # Safety
    /// Every index `(j - j0)·ks + r·rs` for `j < j1`, `r < rows.len()` is inside `st`, written by no one
    /// else meanwhile.
    pub(crate) unsafe fn apply_mask(
        &self,
        b: usize,
        rows: &[(usize, usize)],
        j0: usize,
        j1: usize,
        st: *mut f32,
        ks: usize,
        rs: usize,
    ) {
        // SAFETY: every index (j - j0)·ks + r·rs is inside the caller's extent.
        let at = |j: usize, r: usize| unsafe { st.add((j - j0) * ks + r * rs) };
        if !self.band.is_all() {
            for (r, &(_, i)) in rows.iter().enumerate() {
                let keys = self.key_range(i);
                for j in (j0..keys.start.clamp(j0, j1)).chain(keys.end.clamp(j0, j1)..j1) {
                    // SAFETY: inside the caller's extent.
                    unsafe { *at(j, r) = f32::NEG_INFINITY };
                }
            }
        }
        match self.mask {
            MaskSel::None => {}
            MaskSel::Explicit { data, strides } => {
                for (r, &(h, i)) in rows.iter().enumerate() {
                    let base = b * strides[0] + h * strides[1] + i * strides[2];
                    for j in j0..j1 {
                        let add = data[base + j * strides[3]];
                        // SAFETY: inside the caller's extent.
                        unsafe {
                            let x = at(j, r);
                            *x = if add == f32::NEG_INFINITY { f32::NEG_INFINITY } else { *x + add };
                        }
                    }
                }
            }
        }
    }

    /// Writes one finished output row from f32 values and its LSE.
    ///
    /// # Safety
    /// Row `(b, h, i)` must belong to the calling work item only; `vals` holds `dv` values.
    pub(crate) unsafe fn write_row(&self, b: usize, h: usize, i: usize, vals: &[f32], lse: f32) {
        let off = self.o_st.offset(b, h, i);
        // SAFETY: the validated spec guarantees `off + dv` is inside `o` and that rows do not overlap; the
        // caller guarantees no other thread writes this row.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.o.0.add(off), self.dv) };
        T::narrow(&vals[..self.dv], dst);
        if let Some(l) = self.lse {
            // SAFETY: `lse` has `B·Hq·Sq` elements (checked by the caller); this row's slot is ours.
            unsafe { *l.0.add((b * self.hq + h) * self.sq + i) = lse };
        }
    }
}

/// Rounds `x` up to a multiple of `m`.
#[inline]
pub(crate) fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}
