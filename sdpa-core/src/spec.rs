//! `AttentionSpec`: what one attention call computes, validated once before any kernel runs.
//!
//! Logical shapes (DESIGN.md, "Semantics"): Q `[B, Hq, Sq, D]`, K `[B, Hkv, Sk, D]`, V `[B, Hkv, Sk, Dv]`,
//! O `[B, Hq, Sq, Dv]`. Every tensor is addressed through element strides for (batch, head, sequence); the
//! last dimension is always contiguous. BHSD (PyTorch) and BSHD (FlashAttention, candle) are two stride
//! choices over the same logical shape, so neither needs a copy.

use crate::dtype::DType;
use crate::error::{Result, SdpaError};
use crate::fp8::Descale;
use crate::ragged::{Ragged, Seq};
use crate::variants::{Diagonal, KeyBand, Variants, Window};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Logical sizes of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    /// Batch size.
    pub b: usize,
    /// Query heads.
    pub hq: usize,
    /// Key/value heads; `hq % hkv == 0` (GQA/MQA: query head `h` reads kv head `h / (hq / hkv)`).
    pub hkv: usize,
    /// Query sequence length (rows of the output).
    pub sq: usize,
    /// Key/value sequence length.
    pub sk: usize,
    /// Head dim of Q and K.
    pub d: usize,
    /// Head dim of V and O.
    pub dv: usize,
}

impl Shape {
    /// A shape with `dv == d` and `hkv == hq`.
    pub fn new(b: usize, h: usize, sq: usize, sk: usize, d: usize) -> Self {
        Shape { b, hq: h, hkv: h, sq, sk, d, dv: d }
    }

    /// The sizes with their names, `B=1 Hq=8 Hkv=2 Sq=77 Sk=130 D=64` (` Dv=..` only when it differs from D),
    /// as the CLI prints them.
    pub fn labelled(&self) -> String {
        let dv = if self.dv != self.d { format!(" Dv={}", self.dv) } else { String::new() };
        format!("B={} Hq={} Hkv={} Sq={} Sk={} D={}{dv}", self.b, self.hq, self.hkv, self.sq, self.sk, self.d)
    }

    /// Number of query heads sharing one kv head.
    pub fn group_size(&self) -> usize {
        self.hq.checked_div(self.hkv).unwrap_or(0)
    }

    /// The kv head read by query head `h`.
    #[inline]
    pub fn kv_head(&self, h: usize) -> usize {
        h / self.group_size()
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Dv only when it differs from D: the form people type (`--shape B,Hq,Hkv,Sq,Sk,D`) reads back.
        write!(f, "{},{},{},{},{},{}", self.b, self.hq, self.hkv, self.sq, self.sk, self.d)?;
        if self.dv != self.d {
            write!(f, ",{}", self.dv)?;
        }
        Ok(())
    }
}

impl FromStr for Shape {
    type Err = String;
    /// Parses `B,Hq,Hkv,Sq,Sk,D[,Dv]`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        if parts.len() != 6 && parts.len() != 7 {
            return Err(format!("shape `{s}` must be B,Hq,Hkv,Sq,Sk,D[,Dv] (6 or 7 numbers, got {})", parts.len()));
        }
        let mut v = [0usize; 7];
        for (i, p) in parts.iter().enumerate() {
            v[i] = p.parse().map_err(|_| format!("shape `{s}`: `{p}` is not a non-negative integer"))?;
        }
        let dv = if parts.len() == 7 { v[6] } else { v[5] };
        Ok(Shape { b: v[0], hq: v[1], hkv: v[2], sq: v[3], sk: v[4], d: v[5], dv })
    }
}

/// Memory order of the four logical dimensions; the last one (head dim) is always contiguous.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// `[batch, head, seq, dim]`, PyTorch's `scaled_dot_product_attention` order.
    #[default]
    Bhsd,
    /// `[batch, seq, head, dim]`, FlashAttention's and candle's order.
    Bshd,
}

impl Layout {
    /// Contiguous strides of a `[b, heads, seq, dim]` tensor in this layout.
    pub fn strides(self, heads: usize, seq: usize, dim: usize) -> Strides {
        match self {
            Layout::Bhsd => Strides { b: heads * seq * dim, h: seq * dim, s: dim },
            Layout::Bshd => Strides { b: seq * heads * dim, h: dim, s: heads * dim },
        }
    }

    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Layout::Bhsd => "bhsd",
            Layout::Bshd => "bshd",
        }
    }
}

impl FromStr for Layout {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "bhsd" => Ok(Layout::Bhsd),
            "bshd" => Ok(Layout::Bshd),
            other => Err(format!("unknown layout `{other}` (expected bhsd or bshd)")),
        }
    }
}

/// Element strides of a 4-d tensor over (batch, head, sequence); the head-dim stride is 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Strides {
    /// Elements between consecutive batches.
    pub b: usize,
    /// Elements between consecutive heads.
    pub h: usize,
    /// Elements between consecutive sequence positions.
    pub s: usize,
}

impl Strides {
    /// Offset of element `[b, h, s, 0]`. Only valid after [`AttentionSpec::validate`].
    #[inline]
    pub fn offset(&self, b: usize, h: usize, s: usize) -> usize {
        b * self.b + h * self.h + s * self.s
    }
}

/// How an explicit mask's values are interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MaskValues {
    /// `true` = the key takes part (PyTorch's `attn_mask` convention); stored as 0 / -inf additive.
    Boolean,
    /// Added to the scaled scores before softmax; `-inf` removes a key.
    Additive,
}

/// An explicit mask broadcastable to `[B, Hq, Sq, Sk]`, stored contiguously (row-major) over `dims`.
///
/// Backends receive it as f32 additive values (booleans converted to `0` / `-inf` by
/// [`crate::tensor::mask_from_bool`]); `values` only records where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ExplicitMask {
    /// Boolean or additive origin.
    pub values: MaskValues,
    /// Size of each of the 4 dims: either 1 (broadcast) or the full size (B, Hq, Sq, Sk).
    pub dims: [usize; 4],
}

impl ExplicitMask {
    /// A full `[B, Hq, Sq, Sk]` mask.
    pub fn full(values: MaskValues, shape: &Shape) -> Self {
        ExplicitMask { values, dims: [shape.b, shape.hq, shape.sq, shape.sk] }
    }

    /// Element strides over (b, h, q, k); 0 for broadcast dims. Only valid after validation.
    pub fn strides(&self) -> [usize; 4] {
        let [db, dh, dq, dk] = self.dims;
        let sk = if dk == 1 { 0 } else { 1 };
        let sq = if dq == 1 { 0 } else { dk };
        let sh = if dh == 1 { 0 } else { dq * dk };
        let sb = if db == 1 { 0 } else { dh * dq * dk };
        [sb, sh, sq, sk]
    }

    /// Number of stored elements (product of `dims`), checked.
    pub fn len(&self) -> Result<usize> {
        self.dims
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| SdpaError::overflow("length of the explicit mask"))
    }

    /// True when the mask stores no elements (never the case for a valid mask).
    pub fn is_empty(&self) -> bool {
        self.dims.contains(&0)
    }
}

/// Which keys each query row sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Mask {
    /// Every query sees every key.
    #[default]
    None,
    /// Causal, aligned top-left (PyTorch `is_causal=True`): query `i` sees keys `j <= i`.
    CausalTopLeft,
    /// Causal, aligned bottom-right (FlashAttention, KV-cache decoding): query `i` sees keys
    /// `j <= i + Sk - Sq`.
    CausalBottomRight,
    /// An explicit boolean or additive mask.
    Explicit(ExplicitMask),
}

impl Mask {
    /// Short name as used on the command line and in result records.
    pub fn name(&self) -> &'static str {
        match self {
            Mask::None => "none",
            Mask::CausalTopLeft => "causal",
            Mask::CausalBottomRight => "causal-br",
            Mask::Explicit(m) => match m.values {
                MaskValues::Boolean => "bool",
                MaskValues::Additive => "additive",
            },
        }
    }

    /// True for either causal alignment.
    pub fn is_causal(&self) -> bool {
        matches!(self, Mask::CausalTopLeft | Mask::CausalBottomRight)
    }

    /// The diagonal a causal mask aligns to; `None` for the others.
    pub fn diagonal(&self) -> Option<Diagonal> {
        match self {
            Mask::CausalTopLeft => Some(Diagonal::TopLeft),
            Mask::CausalBottomRight => Some(Diagonal::BottomRight),
            _ => None,
        }
    }

    /// For causal masks, the number of leading keys query row `i` sees (keys `0..limit`), which may be 0
    /// (a fully masked row); `None` when the mask does not restrict by position.
    #[inline]
    pub fn causal_limit(&self, i: usize, sq: usize, sk: usize) -> Option<usize> {
        match self {
            Mask::CausalTopLeft => Some((i + 1).min(sk)),
            Mask::CausalBottomRight => {
                // i + Sk - Sq + 1, clamped to [0, Sk], without going negative in usize.
                let lim = (i + 1 + sk).saturating_sub(sq);
                Some(lim.min(sk))
            }
            _ => None,
        }
    }
}

impl FromStr for Mask {
    type Err = String;
    /// Parses the position masks: `none`, `causal` (top-left), `causal-br` (bottom-right). Explicit masks
    /// need data and are built in code.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "none" => Ok(Mask::None),
            "causal" | "causal-tl" | "causal_top_left" => Ok(Mask::CausalTopLeft),
            "causal-br" | "causal_bottom_right" => Ok(Mask::CausalBottomRight),
            other => Err(format!("unknown mask `{other}` (expected none, causal or causal-br)")),
        }
    }
}

/// The operands of one attention call, for size and stride questions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// Queries.
    Q,
    /// Keys.
    K,
    /// Values.
    V,
    /// Output.
    O,
}

impl Operand {
    /// Lowercase name for messages.
    pub fn name(self) -> &'static str {
        match self {
            Operand::Q => "q",
            Operand::K => "k",
            Operand::V => "v",
            Operand::O => "o",
        }
    }
}

/// One attention call: shapes, dtype, scale, mask and strides. Plain data; call [`AttentionSpec::validate`]
/// once before handing it to a kernel, which then trusts it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttentionSpec {
    /// Logical sizes.
    pub shape: Shape,
    /// Element type of Q, K and V, and of O unless the inputs are FP8 (O is then bf16: [`DType::output`]).
    pub dtype: DType,
    /// Multiplier of `Q·Kᵀ`; `None` means `1/sqrt(D)`.
    pub scale: Option<f64>,
    /// Which keys each query sees.
    pub mask: Mask,
    /// Strides of Q over (b, hq, sq).
    pub q_strides: Strides,
    /// Strides of K over (b, hkv, sk).
    pub k_strides: Strides,
    /// Strides of V over (b, hkv, sk).
    pub v_strides: Strides,
    /// Strides of O over (b, hq, sq).
    pub o_strides: Strides,
    /// Sliding window, softcap and ALiBi (`crate::variants`); plain attention when all are off.
    #[serde(default, skip_serializing_if = "Variants::is_plain")]
    pub variants: Variants,
    /// A ragged (varlen) batch and, within it, a paged KV cache (`crate::ragged`); a dense batch when
    /// absent. Ragged Q/O are packed `[total_q, Hq, D]` token rows (one block: their batch stride is unused)
    /// and so are packed K/V; paged K/V are `[num_pages, page_size, Hkv, D]`, the batch stride stepping
    /// pages. `shape.b` is the number of sequences and `shape.sq`/`shape.sk` bound their lengths.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ragged: Option<Ragged>,
    /// Per-tensor descale factors of FP8 inputs (`crate::fp8`): only with [`DType::F8E4M3`], where `None`
    /// means 1 for all three.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub descale: Option<Descale>,
}

impl AttentionSpec {
    /// A spec with contiguous BHSD strides, no mask and the default scale.
    pub fn new(shape: Shape, dtype: DType) -> Self {
        Self::with_layout_of(shape, dtype, Layout::Bhsd)
    }

    fn with_layout_of(shape: Shape, dtype: DType, layout: Layout) -> Self {
        Self::with_layout_ragged(shape, dtype, layout, None)
    }

    /// Contiguous strides of `layout` over the dense shape or over the ragged batch's packed rows and pages.
    fn with_layout_ragged(shape: Shape, dtype: DType, layout: Layout, ragged: Option<Ragged>) -> Self {
        // The sequence extent each operand is laid out over: the shape's lengths for a dense batch, the
        // packed token count for a ragged one, the page for a paged cache.
        let (q_rows, k_rows) = match &ragged {
            None => (shape.sq, shape.sk),
            Some(r) => (r.total_q(), r.pages.map_or(r.total_k(), |p| p.page_size)),
        };
        // Saturating so that an absurd shape still builds a spec; `validate` reports the overflow.
        let st = |h: usize, s: usize, d: usize| {
            let hs = h.saturating_mul(s);
            let sd = s.saturating_mul(d);
            let hd = h.saturating_mul(d);
            match layout {
                Layout::Bhsd => Strides { b: hs.saturating_mul(d), h: sd, s: d },
                Layout::Bshd => Strides { b: hs.saturating_mul(d), h: d, s: hd },
            }
        };
        AttentionSpec {
            shape,
            dtype,
            scale: None,
            mask: Mask::None,
            q_strides: st(shape.hq, q_rows, shape.d),
            k_strides: st(shape.hkv, k_rows, shape.d),
            v_strides: st(shape.hkv, k_rows, shape.dv),
            o_strides: st(shape.hq, q_rows, shape.dv),
            variants: Variants::default(),
            ragged,
            descale: None,
        }
    }

    /// Replaces all four strides with the contiguous strides of `layout` (over packed rows and pages for a
    /// ragged batch: BSHD is FlashAttention's packed `[total, H, D]` and NHD pages, BHSD is `[H, total, D]`
    /// and HND pages).
    pub fn with_layout(self, layout: Layout) -> Self {
        let fresh = Self::with_layout_ragged(self.shape, self.dtype, layout, self.ragged);
        AttentionSpec { scale: self.scale, mask: self.mask, variants: self.variants, descale: self.descale, ..fresh }
    }

    /// Makes the batch ragged (and, with pages, the cache paged) in contiguous strides of `layout`.
    pub fn with_ragged(self, ragged: Ragged, layout: Layout) -> Self {
        AttentionSpec { ragged: Some(ragged), ..self }.with_layout(layout)
    }

    /// Sequence `b`: its lengths and packed starts (the shape's lengths for a dense batch). O(B) for a
    /// ragged batch: kernels take [`Ragged::seqs`] once.
    pub fn seq(&self, b: usize) -> Seq {
        match &self.ragged {
            None => Seq { sq: self.shape.sq, sk: self.shape.sk, q_start: 0, k_start: 0 },
            Some(r) => r.seqs().get(b).copied().unwrap_or(Seq { sq: 0, sk: 0, q_start: 0, k_start: 0 }),
        }
    }

    /// Every sequence of the batch (B of them).
    pub fn seqs(&self) -> Vec<Seq> {
        match &self.ragged {
            None => vec![self.seq(0); self.shape.b],
            Some(r) => r.seqs(),
        }
    }

    /// Offset of `Q[b, h, i, 0]` of sequence `seq` (= `self.seq(b)`).
    #[inline]
    pub fn q_offset(&self, seq: &Seq, b: usize, h: usize, i: usize) -> usize {
        Self::row_offset(&self.q_strides, self.ragged.is_some(), seq.q_start, b, h, i)
    }

    /// Offset of `O[b, h, i, 0]` of sequence `seq`.
    #[inline]
    pub fn o_offset(&self, seq: &Seq, b: usize, h: usize, i: usize) -> usize {
        Self::row_offset(&self.o_strides, self.ragged.is_some(), seq.q_start, b, h, i)
    }

    #[inline]
    fn row_offset(st: &Strides, ragged: bool, start: usize, b: usize, h: usize, i: usize) -> usize {
        if ragged {
            st.offset(0, h, start + i)
        } else {
            st.offset(b, h, i)
        }
    }

    /// Offset of key `j` of sequence `seq` (`b`), kv head `h`, in K (`Operand::K`) or V: through the block
    /// table when paged (which must have been checked, [`Ragged::check_block_table`]).
    #[inline]
    pub fn kv_offset(&self, op: Operand, table: Option<&[u32]>, seq: &Seq, b: usize, h: usize, j: usize) -> usize {
        let st = if op == Operand::V { &self.v_strides } else { &self.k_strides };
        match (&self.ragged, table) {
            (None, _) => st.offset(b, h, j),
            (Some(Ragged { pages: Some(p), .. }), Some(t)) => {
                let (page, slot) = p.locate(t, b, j);
                st.offset(page, h, slot)
            }
            (Some(_), _) => st.offset(0, h, seq.k_start + j),
        }
    }

    /// Index of row `(b, h, i)` in the LSE and the reference output: `[B, Hq, Sq]` for a dense batch,
    /// `[Hq, total_q]` for a ragged one (FlashAttention's varlen order).
    #[inline]
    pub fn row_index(&self, seq: &Seq, b: usize, h: usize, i: usize) -> usize {
        match &self.ragged {
            None => (b * self.shape.hq + h) * self.shape.sq + i,
            Some(r) => h * r.total_q() + seq.q_start + i,
        }
    }

    /// The `(b, h, i)` of a row index (the inverse of [`Self::row_index`]); `row < lse_len()`.
    pub fn row_coords(&self, row: usize) -> (usize, usize, usize) {
        match &self.ragged {
            None => {
                let s = &self.shape;
                let (i, bh) = (row % s.sq, row / s.sq);
                (bh / s.hq, bh % s.hq, i)
            }
            Some(r) => {
                let total = r.total_q().max(1);
                let (h, t) = (row / total, row % total);
                let (b, i) = Ragged::locate(&r.offsets_q(), t);
                (b, h, i)
            }
        }
    }

    /// Sets the mask.
    pub fn with_mask(mut self, mask: Mask) -> Self {
        self.mask = mask;
        self
    }

    /// Sets a sliding window around the diagonal (name the diagonal with [`Self::with_diagonal`] unless the
    /// mask is causal).
    pub fn with_window(mut self, window: Window) -> Self {
        self.variants.window = Some(window);
        self
    }

    /// Sets a logit softcap.
    pub fn with_softcap(mut self, cap: f64) -> Self {
        self.variants.softcap = Some(cap);
        self
    }

    /// Sets ALiBi biases (name the diagonal unless the mask is causal).
    pub fn with_alibi(mut self, alibi: crate::variants::Alibi) -> Self {
        self.variants.alibi = Some(alibi);
        self
    }

    /// Names the diagonal windows and ALiBi measure from.
    pub fn with_diagonal(mut self, diagonal: Diagonal) -> Self {
        self.variants.diagonal = Some(diagonal);
        self
    }

    /// Replaces all variants.
    pub fn with_variants(mut self, variants: Variants) -> Self {
        self.variants = variants;
        self
    }

    /// The diagonal in effect: the causal mask's alignment, else the one the variants name.
    pub fn diagonal(&self) -> Option<Diagonal> {
        self.mask.diagonal().or(self.variants.diagonal)
    }

    /// Which keys each row may see by position: the causal mask and the window together (explicit masks
    /// apply on top). Only meaningful after validation.
    pub fn band(&self) -> KeyBand {
        self.band_for(self.shape.sq, self.shape.sk)
    }

    /// The band of one sequence of lengths `sq`, `sk`: each sequence of a ragged batch measures its causal
    /// mask and window from its own diagonal.
    pub fn band_for(&self, sq: usize, sk: usize) -> KeyBand {
        let mut band = KeyBand::ALL;
        if let Some(d) = self.mask.diagonal() {
            band.hi = Some(d.offset(sq, sk));
        }
        if let (Some(w), Some(d)) = (self.variants.window, self.diagonal()) {
            let off = d.offset(sq, sk);
            if let Some(l) = w.left {
                band.lo = Some(off - l as i128);
            }
            if let Some(r) = w.right {
                let hi = off + r as i128;
                band.hi = Some(band.hi.map_or(hi, |h| h.min(hi)));
            }
        }
        band
    }

    /// Keys `lo..hi` that query row `i` may see by position (all of `0..Sk` without causal mask or window).
    #[inline]
    pub fn key_range(&self, i: usize) -> std::ops::Range<usize> {
        self.band().range(i, self.shape.sk)
    }

    /// Keys that row `i` of sequence `seq` may see by position.
    #[inline]
    pub fn key_range_in(&self, seq: &Seq, i: usize) -> std::ops::Range<usize> {
        self.band_for(seq.sq, seq.sk).range(i, seq.sk)
    }

    /// The ALiBi slope of every query head, when ALiBi is on (validated specs only return `Ok`).
    pub fn alibi_slopes(&self) -> Result<Option<Vec<f32>>> {
        self.variants.alibi.as_ref().map(|a| a.slopes(self.shape.hq)).transpose()
    }

    /// The variants as records carry them: the diagonal in effect written out (from the causal mask when it
    /// names it), so a record never leaves it to be guessed; plain attention stays plain.
    pub fn recorded_variants(&self) -> Variants {
        let mut v = self.variants.clone();
        if !v.is_plain() {
            v.diagonal = self.diagonal();
        }
        v
    }

    /// The softcap, when on.
    pub fn softcap(&self) -> Option<f64> {
        self.variants.softcap
    }

    /// Sets an explicit scale.
    pub fn with_scale(mut self, scale: f64) -> Self {
        self.scale = Some(scale);
        self
    }

    /// The scale in effect: the explicit one or `1/sqrt(D)`.
    pub fn scale(&self) -> f64 {
        self.scale.unwrap_or_else(|| 1.0 / (self.shape.d as f64).sqrt())
    }

    /// The layout whose contiguous strides these are, if any.
    pub fn layout(&self) -> Option<Layout> {
        [Layout::Bhsd, Layout::Bshd].into_iter().find(|&l| {
            let s = Self::with_layout_ragged(self.shape, self.dtype, l, self.ragged.clone());
            s.q_strides == self.q_strides
                && s.k_strides == self.k_strides
                && s.v_strides == self.v_strides
                && s.o_strides == self.o_strides
        })
    }

    /// Strides of one operand.
    pub fn strides(&self, op: Operand) -> Strides {
        match op {
            Operand::Q => self.q_strides,
            Operand::K => self.k_strides,
            Operand::V => self.v_strides,
            Operand::O => self.o_strides,
        }
    }

    /// Logical `[b, heads, seq, dim]` extent of one operand.
    pub fn extent(&self, op: Operand) -> [usize; 4] {
        let s = &self.shape;
        if let Some(r) = &self.ragged {
            // One block of packed rows; paged K/V span the whole pool of pages.
            let (kb, ks) = r.pages.map_or((1, r.total_k()), |p| (p.num_pages, p.page_size));
            return match op {
                Operand::Q => [1, s.hq, r.total_q(), s.d],
                Operand::K => [kb, s.hkv, ks, s.d],
                Operand::V => [kb, s.hkv, ks, s.dv],
                Operand::O => [1, s.hq, r.total_q(), s.dv],
            };
        }
        match op {
            Operand::Q => [s.b, s.hq, s.sq, s.d],
            Operand::K => [s.b, s.hkv, s.sk, s.d],
            Operand::V => [s.b, s.hkv, s.sk, s.dv],
            Operand::O => [s.b, s.hq, s.sq, s.dv],
        }
    }

    /// Elements a buffer for `op` must hold: one past the largest addressed offset (checked).
    pub fn required_len(&self, op: Operand) -> Result<usize> {
        let [b, h, s, d] = self.extent(op);
        let st = self.strides(op);
        let what = || SdpaError::overflow(format!("length of {}", op.name()));
        let mut last = d.checked_sub(1).ok_or_else(|| SdpaError::invalid("zero head dim"))?;
        for (n, stride) in [(b, st.b), (h, st.h), (s, st.s)] {
            let steps = n.checked_sub(1).ok_or_else(|| SdpaError::invalid(format!("zero dim in {}", op.name())))?;
            last = steps.checked_mul(stride).and_then(|x| x.checked_add(last)).ok_or_else(what)?;
        }
        last.checked_add(1).ok_or_else(what)
    }

    /// Number of logical elements of `op` (checked).
    pub fn numel(&self, op: Operand) -> Result<usize> {
        self.extent(op)
            .iter()
            .try_fold(1usize, |a, &x| a.checked_mul(x))
            .ok_or_else(|| SdpaError::overflow(format!("element count of {}", op.name())))
    }

    /// Elements of the LSE output, `[B, Hq, Sq]` contiguous.
    pub fn lse_len(&self) -> Result<usize> {
        let s = &self.shape;
        if let Some(r) = &self.ragged {
            return s.hq.checked_mul(r.total_q()).ok_or_else(|| SdpaError::overflow("length of lse"));
        }
        s.b.checked_mul(s.hq).and_then(|x| x.checked_mul(s.sq)).ok_or_else(|| SdpaError::overflow("length of lse"))
    }

    /// Sets the FP8 descale factors (the spec's dtype must be [`DType::F8E4M3`]; `validate` checks it).
    pub fn with_descale(mut self, descale: Descale) -> Self {
        self.descale = Some(descale);
        self
    }

    /// The descale factors a kernel applies: the spec's for FP8 inputs (1 where unset), 1 for every other
    /// dtype.
    pub fn descales(&self) -> Descale {
        self.descale.unwrap_or_default()
    }

    /// Element type of O: [`DType::output`] of the input dtype.
    pub fn out_dtype(&self) -> DType {
        self.dtype.output()
    }

    /// Checks everything a kernel relies on. Never panics; returns the first problem found.
    pub fn validate(&self) -> Result<()> {
        let s = &self.shape;
        if let Some(d) = &self.descale {
            if self.dtype != DType::F8E4M3 {
                return Err(SdpaError::invalid(format!(
                    "descale factors apply to f8e4m3 inputs only, not {}",
                    self.dtype
                )));
            }
            d.validate()?;
        }
        for (name, v) in
            [("B", s.b), ("Hq", s.hq), ("Hkv", s.hkv), ("Sq", s.sq), ("Sk", s.sk), ("D", s.d), ("Dv", s.dv)]
        {
            if v == 0 {
                return Err(SdpaError::invalid(format!(
                    "{name} is 0 in shape {s}; every dimension must be at least 1"
                )));
            }
        }
        if !s.hq.is_multiple_of(s.hkv) {
            return Err(SdpaError::invalid(format!(
                "Hq = {} is not a multiple of Hkv = {} (GQA needs whole groups)",
                s.hq, s.hkv
            )));
        }
        if let Some(r) = &self.ragged {
            r.validate(s.b, s.sq, s.sk)?;
            if matches!(self.mask, Mask::Explicit(_)) {
                return Err(SdpaError::invalid(
                    "an explicit mask does not combine with a ragged batch; use a causal mask or a window, \
                     which apply per sequence",
                ));
            }
        }
        if let Some(scale) = self.scale {
            if !scale.is_finite() {
                return Err(SdpaError::invalid(format!("scale {scale} is not finite")));
            }
        }
        // The output must be addressable and the sizes must not overflow, even in the cost model, which
        // counts B·Hq·Sq·Sk pairs.
        for op in [Operand::Q, Operand::K, Operand::V, Operand::O] {
            self.required_len(op)?;
            self.numel(op)?;
        }
        self.lse_len()?;
        // Every buffer, even widened to f64 as the reference does, must be addressable: a Vec can hold at
        // most isize::MAX bytes, and asking for more panics instead of failing.
        for op in [Operand::Q, Operand::K, Operand::V, Operand::O] {
            let n = self.required_len(op)?;
            if n > isize::MAX as usize / 8 {
                return Err(SdpaError::overflow(format!("bytes of {} ({n} elements)", op.name())));
            }
        }
        [s.b, s.hq, s.sq, s.sk]
            .iter()
            .try_fold(1usize, |a, &x| a.checked_mul(x))
            .ok_or_else(|| SdpaError::overflow("number of (query, key) pairs B·Hq·Sq·Sk"))?;
        // A ragged batch bounds its pairs by the same product (each length is within the shape's bound).
        self.check_output_does_not_alias()?;
        self.validate_variants()?;
        if let Mask::Explicit(m) = &self.mask {
            let full = [s.b, s.hq, s.sq, s.sk];
            for (i, (&got, &want)) in m.dims.iter().zip(full.iter()).enumerate() {
                if got != 1 && got != want {
                    let axis = ["B", "Hq", "Sq", "Sk"][i];
                    return Err(SdpaError::invalid(format!(
                        "explicit mask dims {:?} do not broadcast to [B, Hq, Sq, Sk] = {:?}: dim {axis} is {got}, \
                         must be 1 or {want}",
                        m.dims, full
                    )));
                }
            }
            m.len()?;
        }
        Ok(())
    }

    /// The variants' values, and a diagonal named once: by a causal mask, or by the variants when a window
    /// or ALiBi is set without one.
    fn validate_variants(&self) -> Result<()> {
        let v = &self.variants;
        v.validate(self.shape.hq)?;
        if let (Some(masks), Some(named)) = (self.mask.diagonal(), v.diagonal) {
            if masks != named {
                return Err(SdpaError::invalid(format!(
                    "the mask `{}` aligns the diagonal {} but the variants name {}: name one alignment",
                    self.mask.name(),
                    masks.name(),
                    named.name()
                )));
            }
        }
        if (v.window.is_some() || v.alibi.is_some()) && self.diagonal().is_none() {
            return Err(SdpaError::invalid(
                "a window or ALiBi measures from the diagonal: name it (tl = top-left, diag(i) = i; br = \
                 bottom-right, diag(i) = i + Sk - Sq, FlashAttention's) or use a causal mask, which names it",
            ));
        }
        Ok(())
    }

    /// Two distinct output elements must never share an address, or a kernel's writes race.
    fn check_output_does_not_alias(&self) -> Result<()> {
        let [b, h, sq, dv] = self.extent(Operand::O);
        let st = self.o_strides;
        // Sort the non-trivial dims by stride; each stride must step over everything inside it.
        let mut dims: Vec<(usize, usize)> =
            [(st.b, b), (st.h, h), (st.s, sq)].into_iter().filter(|&(_, n)| n > 1).collect();
        dims.sort_unstable();
        let mut span = dv; // the contiguous head dim
        for (stride, n) in dims {
            if stride < span {
                return Err(SdpaError::invalid(format!(
                    "output strides {:?} make distinct elements of O overlap (stride {stride} < span {span})",
                    st
                )));
            }
            span = stride.checked_mul(n).ok_or_else(|| SdpaError::overflow("span of o"))?;
        }
        Ok(())
    }

    /// Checks buffer lengths against the strides (elements, not bytes).
    pub fn check_lengths(&self, q: usize, k: usize, v: usize, o: usize, mask: Option<usize>) -> Result<()> {
        for (name, op, len) in [("q", Operand::Q, q), ("k", Operand::K, k), ("v", Operand::V, v), ("o", Operand::O, o)]
        {
            let needed = self.required_len(op)?;
            if len < needed {
                return Err(SdpaError::BufferTooShort { name, len, needed });
            }
        }
        match (&self.mask, mask) {
            (Mask::Explicit(m), Some(len)) => {
                let needed = m.len()?;
                if len < needed {
                    return Err(SdpaError::BufferTooShort { name: "mask", len, needed });
                }
            }
            (Mask::Explicit(_), None) => {
                return Err(SdpaError::invalid("the spec has an explicit mask but no mask buffer was given"))
            }
            (_, Some(_)) => {
                return Err(SdpaError::invalid(format!(
                    "a mask buffer was given but the spec's mask is `{}`",
                    self.mask.name()
                )))
            }
            (_, None) => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_shapes_with_and_without_dv() {
        let s: Shape = "2,8,2,77,130,64".parse().unwrap();
        assert_eq!(s, Shape { b: 2, hq: 8, hkv: 2, sq: 77, sk: 130, d: 64, dv: 64 });
        let s: Shape = "1,4,4,3,5,40,24".parse().unwrap();
        assert_eq!(s.dv, 24);
        assert!("1,2,3".parse::<Shape>().is_err());
        assert!("1,2,x,4,5,6".parse::<Shape>().is_err());
        assert!("1,2,-3,4,5,6".parse::<Shape>().is_err());
    }

    #[test]
    fn rejects_each_impossible_spec_with_a_message() {
        let ok = AttentionSpec::new(Shape { b: 1, hq: 4, hkv: 2, sq: 3, sk: 5, d: 8, dv: 8 }, DType::F32);
        assert!(ok.validate().is_ok());

        let mut zero = ok.clone();
        zero.shape.sk = 0;
        assert!(zero.validate().unwrap_err().to_string().contains("Sk is 0"));

        let mut gqa = ok.clone();
        gqa.shape.hkv = 3;
        assert!(gqa.validate().unwrap_err().to_string().contains("not a multiple"));

        let huge = AttentionSpec::new(Shape::new(usize::MAX / 2, 1 << 20, 1 << 20, 1 << 20, 128), DType::F32);
        assert!(matches!(huge.validate(), Err(SdpaError::SizeOverflow { .. })));

        let mut alias = ok.clone();
        alias.o_strides.s = 1; // rows overlap
        assert!(alias.validate().unwrap_err().to_string().contains("overlap"));

        let bad_mask =
            ok.clone().with_mask(Mask::Explicit(ExplicitMask { values: MaskValues::Boolean, dims: [1, 2, 3, 5] }));
        assert!(bad_mask.validate().unwrap_err().to_string().contains("do not broadcast"));

        let nan_scale = ok.clone().with_scale(f64::NAN);
        assert!(nan_scale.validate().is_err());
    }

    #[test]
    fn buffer_lengths_are_checked() {
        let spec = AttentionSpec::new(Shape::new(2, 3, 4, 5, 6), DType::F16);
        let q = spec.required_len(Operand::Q).unwrap();
        assert_eq!(q, 2 * 3 * 4 * 6);
        let k = spec.required_len(Operand::K).unwrap();
        assert!(spec.check_lengths(q, k, k, q, None).is_ok());
        let err = spec.check_lengths(q - 1, k, k, q, None).unwrap_err();
        assert!(matches!(err, SdpaError::BufferTooShort { name: "q", .. }));
        assert!(spec.check_lengths(q, k, k, q, Some(10)).is_err());
    }

    #[test]
    fn bshd_and_bhsd_address_the_same_elements_differently() {
        let shape = Shape { b: 2, hq: 4, hkv: 2, sq: 3, sk: 5, d: 8, dv: 6 };
        let bshd = AttentionSpec::new(shape, DType::F32).with_layout(Layout::Bshd);
        assert_eq!(bshd.layout(), Some(Layout::Bshd));
        assert_eq!(bshd.q_strides, Strides { b: 3 * 4 * 8, h: 8, s: 4 * 8 });
        assert_eq!(bshd.required_len(Operand::V).unwrap(), 2 * 5 * 2 * 6);
        assert!(bshd.validate().is_ok());
    }

    #[test]
    fn causal_limits_in_both_alignments() {
        // Sq = 2, Sk = 5: top-left row 0 sees 1 key; bottom-right row 0 sees 4.
        assert_eq!(Mask::CausalTopLeft.causal_limit(0, 2, 5), Some(1));
        assert_eq!(Mask::CausalBottomRight.causal_limit(0, 2, 5), Some(4));
        assert_eq!(Mask::CausalBottomRight.causal_limit(1, 2, 5), Some(5));
        // Sq = 5, Sk = 2 bottom-right: rows 0..3 see nothing.
        assert_eq!(Mask::CausalBottomRight.causal_limit(2, 5, 2), Some(0));
        assert_eq!(Mask::CausalBottomRight.causal_limit(3, 5, 2), Some(1));
        assert_eq!(Mask::CausalTopLeft.causal_limit(4, 5, 2), Some(2));
        assert_eq!(Mask::None.causal_limit(0, 1, 1), None);
    }

    use proptest::prelude::*;

    fn dim() -> impl Strategy<Value = usize> {
        prop_oneof![Just(0usize), 1usize..300, Just(usize::MAX), Just(usize::MAX / 3), Just(1usize << 33)]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Validation, sizing and costing never panic, whatever the numbers; a spec that validates can be
        /// sized and costed.
        #[test]
        fn validation_never_panics(
            b in dim(), hq in dim(), hkv in dim(), sq in dim(), sk in dim(), d in dim(), dv in dim(),
            o_s in dim(), causal in 0u8..3, layout in prop::bool::ANY,
        ) {
            let shape = Shape { b, hq, hkv, sq, sk, d, dv };
            let mask = [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight][causal as usize];
            let mut spec = AttentionSpec::new(shape, DType::BF16).with_mask(mask);
            if layout { spec = spec.with_layout(Layout::Bshd); }
            let _ = spec.validate();
            spec.o_strides.s = o_s;
            if spec.validate().is_ok() {
                for op in [Operand::Q, Operand::K, Operand::V, Operand::O] {
                    prop_assert!(spec.required_len(op).is_ok());
                }
                let c = crate::cost::AttentionCost::of_spec(&spec);
                prop_assert!(c.flops.is_finite() && c.bytes.is_finite());
            }
        }
    }
}
