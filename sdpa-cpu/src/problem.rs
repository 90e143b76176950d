//! One validated attention call as the kernels see it: sizes, strides, the operand slices, the key band
//! (causal mask and window), the explicit mask, softcap and ALiBi, and the output pointers shared by the
//! worker threads.
//!
//! A ragged batch becomes one `Problem` per sequence ([`Problem::parts`]): a dense `B = 1` call whose
//! slices and output pointers start at the sequence's packed rows, with its own lengths, band and ALiBi
//! diagonal, and (for a paged cache) its row of the block table, through which [`Problem::k_row`] and
//! [`Problem::v_row`] address keys. The kernels schedule the work items of all parts together.

use crate::element::CpuElement;
use crate::variants::ScoreMods;
use sdpa_core::{AttentionSpec, KeyBand, Mask, Result, SdpaError, Strides};
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
#[derive(Debug, Clone)]
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
    /// Log-sum-exp, when requested: row `(b, h, i)` at `b·lse_st.0 + h·lse_st.1 + i` (`[B, Hq, Sq]` for a
    /// dense call; the sequence's columns of `[Hq, total_q]` for a part of a ragged one).
    pub lse: Option<SharedMut<f32>>,
    pub lse_st: (usize, usize),
    /// K/V in pages (a part of a paged ragged batch): `k_st.b`/`v_st.b` step pages.
    pub pages: Option<Pages<'a>>,
    /// First packed query row of the part (0 for a dense call): where its rows of Q-shaped and O-shaped
    /// buffers start (the backward addresses dQ, dO and O from it).
    pub q_row0: usize,
    /// First packed key row of the part (0 for a dense call or a paged cache).
    pub k_row0: usize,
    /// Which operands the item kernel stages per kv head (`fa2::staged`), set by the kernels' entry for the
    /// call; `None` as built.
    pub stage: Option<crate::fa2::StagePlan>,
}

/// One sequence's view of a paged KV cache.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pages<'a> {
    /// The sequence's row of the block table (checked: every page its keys use is inside the pool).
    pub table: &'a [u32],
    /// Token slots per page.
    pub size: usize,
}

impl<'a, T: CpuElement> Problem<'a, T> {
    /// The call over the spec's shape, strides and variants, as a dense call sees it.
    fn whole(
        spec: &AttentionSpec,
        q: &'a [T],
        k: &'a [T],
        v: &'a [T],
        mask: Option<&'a [f32]>,
        o: SharedMut<T>,
        lse: Option<SharedMut<f32>>,
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
            o,
            lse,
            lse_st: (s.hq * s.sq, s.sq),
            pages: None,
            q_row0: 0,
            k_row0: 0,
            stage: None,
        })
    }

    /// The call as the kernels run it: itself for a dense call; one part per sequence of a ragged batch
    /// (sequences without query rows left out), each a `B = 1` problem over the sequence's rows. `table`
    /// is the block table of a paged cache (checked here against the pages).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn parts(
        spec: &AttentionSpec,
        q: &'a [T],
        k: &'a [T],
        v: &'a [T],
        mask: Option<&'a [f32]>,
        o: &'a mut [T],
        lse: Option<&'a mut [f32]>,
        table: Option<&'a [u32]>,
    ) -> Result<Vec<Self>> {
        let Some(r) = &spec.ragged else {
            if table.is_some() {
                return Err(SdpaError::InvalidSpec("a block table was given but K/V are not paged".to_string()));
            }
            let (o, lse) = (SharedMut(o.as_mut_ptr()), lse.map(|l| SharedMut(l.as_mut_ptr())));
            return Ok(vec![Self::whole(spec, q, k, v, mask, o, lse)?]);
        };
        r.check_block_table(table)?;
        let total_q = r.total_q();
        let whole =
            Self::whole(spec, q, k, v, None, SharedMut(o.as_mut_ptr()), lse.map(|l| SharedMut(l.as_mut_ptr())))?;
        let tail = |x: &'a [T], off: usize| x.get(off..).unwrap_or(&[]);
        let mut parts = Vec::with_capacity(r.batch());
        for (b, seq) in r.seqs().into_iter().enumerate() {
            if seq.sq == 0 {
                continue;
            }
            let pages = match (r.pages, table) {
                (Some(pg), Some(t)) => {
                    Some(Pages { table: &t[b * pg.max_pages..(b + 1) * pg.max_pages], size: pg.page_size })
                }
                _ => None,
            };
            // Packed K/V start at the sequence's first key; pages are addressed from the pool's start.
            let (koff, voff) = match pages {
                Some(_) => (0, 0),
                None => (seq.k_start * spec.k_strides.s, seq.k_start * spec.v_strides.s),
            };
            let (qoff, ooff) = (seq.q_start * spec.q_strides.s, seq.q_start * spec.o_strides.s);
            parts.push(Problem {
                b: 1,
                sq: seq.sq,
                sk: seq.sk,
                q: tail(q, qoff),
                k: tail(k, koff),
                v: tail(v, voff),
                band: spec.band_for(seq.sq, seq.sk),
                mods: whole.mods.for_lengths(spec, seq.sq, seq.sk),
                // Offsets inside the output: `wrapping_add` keeps the arithmetic defined; rows are written
                // only inside the validated extent.
                o: SharedMut(whole.o.0.wrapping_add(ooff)),
                lse: whole.lse.map(|l| SharedMut(l.0.wrapping_add(seq.q_start))),
                lse_st: (0, total_q),
                pages,
                q_row0: seq.q_start,
                k_row0: if pages.is_some() { 0 } else { seq.k_start },
                ..whole.clone()
            });
        }
        Ok(parts)
    }

    /// Offset of key `j` of kv head `kvh` (batch `b`) in K: through the block table when paged.
    #[inline(always)]
    pub(crate) fn k_row(&self, b: usize, kvh: usize, j: usize) -> usize {
        match &self.pages {
            None => self.k_st.offset(b, kvh, j),
            Some(pg) => self.k_st.offset(pg.table[j / pg.size] as usize, kvh, j % pg.size),
        }
    }

    /// Offset of key `j` of kv head `kvh` (batch `b`) in V.
    #[inline(always)]
    pub(crate) fn v_row(&self, b: usize, kvh: usize, j: usize) -> usize {
        match &self.pages {
            None => self.v_st.offset(b, kvh, j),
            Some(pg) => self.v_st.offset(pg.table[j / pg.size] as usize, kvh, j % pg.size),
        }
    }

    /// Whether keys `j0..j1` lie at one stride from key `j0` (always, unless they cross a page).
    #[inline(always)]
    pub(crate) fn contiguous(&self, j0: usize, j1: usize) -> bool {
        match &self.pages {
            None => true,
            Some(pg) => j1 <= j0 + 1 || j0 / pg.size == (j1 - 1) / pg.size,
        }
    }

    /// Writes the rows of a part with no key: zeros, LSE `-inf` (sdpa-core's convention).
    pub(crate) fn write_empty_rows(&self) {
        let zeros = vec![0.0f32; self.dv];
        for b in 0..self.b {
            for h in 0..self.hq {
                for i in 0..self.sq {
                    // SAFETY: one thread writes every row of this part, which no other part shares.
                    unsafe { self.write_row(b, h, i, &zeros, f32::NEG_INFINITY) };
                }
            }
        }
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
            // SAFETY: `lse` holds every row's slot (checked by the caller); this row's slot is ours.
            unsafe { *l.0.add(b * self.lse_st.0 + h * self.lse_st.1 + i) = lse };
        }
    }
}

/// Rounds `x` up to a multiple of `m`.
#[inline]
pub(crate) fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m) * m
}
