//! The launch argument of every attention kernel: one `#[repr(C)]` struct passed by value, mirrored field
//! for field by `struct AttnParams` in `kernels/common.cuh` (both sides assert its size).
//!
//! Conventions: strides are in elements (int64); the head dim is contiguous; `mask` points to additive f32
//! values addressed by `mask_stride_*` (0 for broadcast dims); `lse` is `[B, Hq, Sq]` f32 contiguous or
//! null; query row `i` sees keys `j < causal_limit(i)` where `causal_limit(i) = clamp(i + 1 +
//! causal_offset, 0, Sk)` when `mask_kind` is causal (offset 0 top-left, `Sk - Sq` bottom-right).
//!
//! Variants (issue 22): every call carries its key band (`band_lo`, `band_hi`: key `j` is visible to row `i`
//! iff `i + band_lo <= j <= i + band_hi`; [`sdpa_core::KeyBand::clamped`], so causal masks and windows alike,
//! and a call without either gets bounds that restrict nothing), `softcap` (0: off), the ALiBi slopes
//! (`alibi`: f32 per query head on the device, 0: off) and `diag_offset` (`diag(i) − i`, the diagonal
//! ALiBi measures from). The tensor-core families compile the variants into the instantiation
//! ([`Masking`]); the SIMT and unfused kernels and the non-finite repair read them at run time.

use crate::error::unsupported;
use cudarc::driver::DeviceRepr;
use sdpa_core::{AttentionSpec, Mask, Result, Strides};

/// `mask_kind`: no mask.
pub const MASK_NONE: i32 = 0;
/// `mask_kind`: causal (either alignment; `causal_offset` says which).
pub const MASK_CAUSAL: i32 = 1;
/// `mask_kind`: explicit additive f32 mask through `mask`.
pub const MASK_EXPLICIT: i32 = 2;

/// Variant bit of a tensor-core instantiation: keys restricted to the band `band_lo..=band_hi` around each
/// row (causal masks and windows; set on every variant instantiation, `FA2_VAR_BAND` in fa2_mma.cuh).
pub const VAR_BAND: i32 = 1;
/// Variant bit: logit softcap (`FA2_VAR_SOFTCAP`).
pub const VAR_SOFTCAP: i32 = 2;
/// Variant bit: ALiBi biases (`FA2_VAR_ALIBI`).
pub const VAR_ALIBI: i32 = 4;

/// What a tensor-core instantiation compiles in for the mask and the variants: the plain mask kinds
/// (`var == 0`: `MASK_NONE`, `MASK_CAUSAL`, `MASK_EXPLICIT`, as before issue 22), or a variant bit set
/// (`VAR_BAND` always, plus softcap and ALiBi) over `MASK_NONE` or `MASK_EXPLICIT`; the causal mask of a
/// variant call is part of its band.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Masking {
    /// `MASK_NONE`, `MASK_CAUSAL` (plain only) or `MASK_EXPLICIT`.
    pub kind: i32,
    /// 0 (plain) or `VAR_BAND | VAR_SOFTCAP? | VAR_ALIBI?`.
    pub var: i32,
}

impl Masking {
    /// The plain maskings (no variant).
    pub const PLAIN: [Masking; 3] = [
        Masking { kind: MASK_NONE, var: 0 },
        Masking { kind: MASK_CAUSAL, var: 0 },
        Masking { kind: MASK_EXPLICIT, var: 0 },
    ];

    /// Every variant masking: band alone, with softcap, with ALiBi and with both, each without and with an
    /// explicit mask (8).
    pub fn variants() -> Vec<Masking> {
        let mut v = Vec::new();
        for kind in [MASK_NONE, MASK_EXPLICIT] {
            for extra in [0, VAR_SOFTCAP, VAR_ALIBI, VAR_SOFTCAP | VAR_ALIBI] {
                v.push(Masking { kind, var: VAR_BAND | extra });
            }
        }
        v
    }

    /// The plain ones, then the variants.
    pub fn all() -> Vec<Masking> {
        let mut v = Self::PLAIN.to_vec();
        v.extend(Self::variants());
        v
    }

    /// What a call needs: plain when the spec has no variant, else the band plus its softcap and ALiBi.
    pub fn of(spec: &AttentionSpec) -> Masking {
        let explicit = matches!(spec.mask, Mask::Explicit(_));
        if spec.variants.is_plain() {
            let kind = match spec.mask {
                Mask::None => MASK_NONE,
                Mask::CausalTopLeft | Mask::CausalBottomRight => MASK_CAUSAL,
                Mask::Explicit(_) => MASK_EXPLICIT,
            };
            return Masking { kind, var: 0 };
        }
        let mut var = VAR_BAND;
        if spec.variants.softcap.is_some() {
            var |= VAR_SOFTCAP;
        }
        if spec.variants.alibi.is_some() {
            var |= VAR_ALIBI;
        }
        Masking { kind: if explicit { MASK_EXPLICIT } else { MASK_NONE }, var }
    }

    /// Entry-point suffix: `none`, `causal`, `explicit` (plain); `band`, `band_softcap`, `band_alibi`,
    /// `band_softcap_alibi`, each with `explicit_` before it over an explicit mask.
    pub fn suffix(&self) -> String {
        if self.var == 0 {
            return mask_suffix(self.kind).to_string();
        }
        let mut s = String::new();
        if self.kind == MASK_EXPLICIT {
            s.push_str("explicit_");
        }
        s.push_str("band");
        if self.var & VAR_SOFTCAP != 0 {
            s.push_str("_softcap");
        }
        if self.var & VAR_ALIBI != 0 {
            s.push_str("_alibi");
        }
        s
    }

    /// The variant bit set as a kernel-side expression (`0` or `FA2_VAR_BAND | FA2_VAR_SOFTCAP`).
    pub fn var_const(&self) -> String {
        if self.var == 0 {
            return "0".into();
        }
        let mut parts = vec!["FA2_VAR_BAND"];
        if self.var & VAR_SOFTCAP != 0 {
            parts.push("FA2_VAR_SOFTCAP");
        }
        if self.var & VAR_ALIBI != 0 {
            parts.push("FA2_VAR_ALIBI");
        }
        parts.join(" | ")
    }
}

/// Kernel parameters; see the module docs. Field order matches `common.cuh` exactly.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnParams {
    /// Q base pointer (device address, element type per kernel).
    pub q: u64,
    /// K base pointer.
    pub k: u64,
    /// V base pointer.
    pub v: u64,
    /// O base pointer.
    pub o: u64,
    /// Additive f32 mask or 0.
    pub mask: u64,
    /// LSE output (f32, `[B, Hq, Sq]`) or 0.
    pub lse: u64,
    /// Scratch memory for kernels that need it (split-KV partials) or 0.
    pub workspace: u64,
    /// Q strides (batch, head, seq), elements.
    pub q_stride: [i64; 3],
    /// K strides.
    pub k_stride: [i64; 3],
    /// V strides.
    pub v_stride: [i64; 3],
    /// O strides.
    pub o_stride: [i64; 3],
    /// Mask strides over (b, h, q, k), elements; 0 for broadcast dims.
    pub mask_stride: [i64; 4],
    /// Batch.
    pub b: i32,
    /// Query heads.
    pub hq: i32,
    /// Key/value heads.
    pub hkv: i32,
    /// `hq / hkv`: query head `h` reads kv head `h / group`.
    pub group: i32,
    /// Query length.
    pub sq: i32,
    /// Key length.
    pub sk: i32,
    /// Head dim of Q and K.
    pub d: i32,
    /// Head dim of V and O.
    pub dv: i32,
    /// One of `MASK_NONE`, `MASK_CAUSAL`, `MASK_EXPLICIT`.
    pub mask_kind: i32,
    /// Causal diagonal offset: 0 top-left, `sk - sq` bottom-right.
    pub causal_offset: i32,
    /// Multiplier of Q·Kᵀ.
    pub scale: f32,
    /// `scale * log2(e)`, for kernels that use `exp2`.
    pub scale_log2: f32,
    /// Number of key splits (split-KV), 1 otherwise.
    pub num_splits: i32,
    /// Free for kernel-specific use (0 by default).
    pub extra: i32,
    /// Lowest visible key minus the row: key `j` is visible to row `i` iff `i + band_lo <= j <= i + band_hi`
    /// (`KeyBand::clamped`: `-Sq` when unbounded below).
    pub band_lo: i32,
    /// Highest visible key minus the row (`Sk` when unbounded above).
    pub band_hi: i32,
    /// `diag(i) − i`: 0 (top-left) or `Sk − Sq` (bottom-right); ALiBi's distance is `|j − i − diag_offset|`.
    pub diag_offset: i32,
    /// Logit softcap (`cap · tanh(x / cap)` of the scaled score), 0 when off.
    pub softcap: f32,
    /// ALiBi slopes (f32 per query head, device address), 0 when off.
    pub alibi: u64,
    /// Ragged batch: `[B + 1]` packed query-row offsets (i32, device), 0 for a dense batch.
    pub cu_q: u64,
    /// Varlen: `[B + 1]` packed key-row offsets (i32, device), 0 otherwise.
    pub cu_k: u64,
    /// Paged: `[B]` cache lengths (i32, device), 0 otherwise.
    pub seqlens_k: u64,
    /// Paged: the block table `[B, max_pages]` (u32, device), 0 otherwise.
    pub block_table: u64,
    /// Paged: slots per page, 0 otherwise.
    pub page_size: i32,
    /// Paged: block-table row length, 0 otherwise.
    pub max_pages: i32,
    /// Ragged: the band's low side relative to each sequence's diagonal ([`REL_NONE_LO`]: unbounded).
    pub rel_lo: i32,
    /// Ragged: the band's high side relative to the diagonal ([`REL_NONE_HI`]: unbounded).
    pub rel_hi: i32,
    /// Ragged: 1 when the diagonal is bottom-right (`diag(i) = i + Sk_b − Sq_b`), 0 top-left.
    pub diag_br: i32,
    /// Ragged: packed query rows (the LSE is `[Hq, total_q]`), 0 for a dense batch.
    pub total_q: i32,
    /// Paged: pages in the pool (kernels clamp page indices below it), 0 otherwise.
    pub num_pages: i32,
    /// Unused; keeps the size a multiple of 8.
    pub reserved: i32,
}

/// `rel_lo` of a ragged call with no lower bound (`SDPA_REL_NONE_LO` in common.cuh).
pub const REL_NONE_LO: i32 = i32::MIN;
/// `rel_hi` of a ragged call with no upper bound (`SDPA_REL_NONE_HI`).
pub const REL_NONE_HI: i32 = i32::MAX;

/// Size checked against `static_assert(sizeof(AttnParams) == 328)` in common.cuh.
pub const ATTN_PARAMS_SIZE: usize = 328;
const _: () = assert!(std::mem::size_of::<AttnParams>() == ATTN_PARAMS_SIZE);

// SAFETY: plain-old-data of integers and floats with C layout and no padding (size asserted above), the
// same layout the kernels declare.
unsafe impl DeviceRepr for AttnParams {}

/// Entry-point suffix of a `mask_kind` (`{kernel}_{dtype}_{D}_{mask}`): "none", "causal" or "explicit".
pub fn mask_suffix(mask_kind: i32) -> &'static str {
    match mask_kind {
        MASK_CAUSAL => "causal",
        MASK_EXPLICIT => "explicit",
        _ => "none",
    }
}

fn st(s: Strides) -> [i64; 3] {
    [s.b as i64, s.h as i64, s.s as i64]
}

fn i32_dim(name: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| unsupported(format!("{name} = {v} exceeds the 32-bit range of the CUDA kernels")))
}

impl AttnParams {
    /// Whether every row of Q, K, V and O starts 16 bytes aligned for 2-byte elements, as the tensor-core
    /// kernels' 16-byte `cp.async` and `ldmatrix` need: base pointers multiples of 16 bytes and every
    /// stride a multiple of 8 elements.
    pub fn qkvo_aligned_8_elements(&self) -> bool {
        let ptrs_ok = [self.q, self.k, self.v, self.o].iter().all(|&a| a % 16 == 0);
        let strides_ok =
            [self.q_stride, self.k_stride, self.v_stride, self.o_stride].iter().flatten().all(|&st| st % 8 == 0);
        ptrs_ok && strides_ok
    }

    /// Whether a 2-byte-element call's rows are whole 16-byte chunks that start 16 bytes aligned
    /// ([`Self::qkvo_aligned_8_elements`], and head dims `d` and `dv` multiples of 8): the condition of the
    /// tensor-core kernels' exact instantiations and of their sm_90 copy paths. Other rows take the padded
    /// instantiations' narrow copies (`fa2_row_bytes` in kernels/fa2_mma.cuh).
    pub fn rows_16_byte_aligned(&self, d: usize, dv: usize) -> bool {
        self.qkvo_aligned_8_elements() && d.is_multiple_of(8) && dv.is_multiple_of(8)
    }

    /// Whether the base pointers of Q, K, V and O are multiples of 2 bytes, as every 2-byte element needs
    /// (the narrowest copy of the tensor-core kernels moves one element).
    pub fn qkvo_aligned_2_bytes(&self) -> bool {
        [self.q, self.k, self.v, self.o].iter().all(|&a| a % 2 == 0)
    }

    /// The i32 table a ragged call's kernels read (`[cu_q (B + 1) | cu_k (B + 1) | seqlens_k (B)]`), to be
    /// uploaded ([`crate::checked::device::Device::table_i32`]) and pointed at by [`Self::point_at_ragged`];
    /// `None` for a dense batch. Lengths fit i32 (checked when the parameters were built).
    pub fn ragged_table(spec: &AttentionSpec) -> Option<Vec<i32>> {
        let r = spec.ragged.as_ref()?;
        let mut t: Vec<i32> = r.offsets_q().into_iter().map(|x| x as i32).collect();
        t.extend(r.offsets_k().into_iter().map(|x| x as i32));
        t.extend(r.seqlens_k.iter().map(|&x| x as i32));
        Some(t)
    }

    /// Points `cu_q`, `cu_k` (packed K/V) or `seqlens_k` and `block_table` (paged) into the uploaded
    /// [`Self::ragged_table`] at device address `table` and the block table at `block_table`.
    pub fn point_at_ragged(&mut self, spec: &AttentionSpec, table: u64, block_table: u64) {
        let Some(r) = &spec.ragged else { return };
        let n = (r.batch() as u64 + 1) * 4;
        self.cu_q = table;
        if r.pages.is_some() {
            self.seqlens_k = table + 2 * n;
            self.block_table = block_table;
        } else {
            self.cu_k = table + n;
        }
    }

    /// Builds the parameters of a validated `spec` with the given device pointers (0 for absent ones).
    pub fn new(spec: &AttentionSpec, q: u64, k: u64, v: u64, o: u64, mask: u64, lse: u64) -> Result<Self> {
        let s = spec.shape;
        // Strides and offsets are int64 on the device; every addressed offset fits because lengths were
        // validated as usize, which is 64-bit on every CUDA host.
        let (mask_kind, causal_offset, mask_stride) = match &spec.mask {
            Mask::None => (MASK_NONE, 0, [0; 4]),
            Mask::CausalTopLeft => (MASK_CAUSAL, 0, [0; 4]),
            Mask::CausalBottomRight => (MASK_CAUSAL, i32_dim("Sk - Sq", s.sk)? - i32_dim("Sq", s.sq)?, [0; 4]),
            Mask::Explicit(m) => {
                let [a, b, c, d] = m.strides();
                (MASK_EXPLICIT, 0, [a as i64, b as i64, c as i64, d as i64])
            }
        };
        let scale = spec.scale() as f32;
        let (band_lo, band_hi) = spec.band().clamped(s.sq, s.sk);
        // Clamped into [-Sq - 1, Sk], which fit i32 as Sq and Sk do.
        let band = |x: i64| i32::try_from(x).map_err(|_| unsupported("key band exceeds the 32-bit range"));
        let diag_offset = match spec.diagonal() {
            Some(d) => i32::try_from(d.offset(s.sq, s.sk)).map_err(|_| unsupported("Sk - Sq exceeds i32"))?,
            None => 0,
        };
        AttnParams {
            q,
            k,
            v,
            o,
            mask,
            lse,
            workspace: 0,
            q_stride: st(spec.q_strides),
            k_stride: st(spec.k_strides),
            v_stride: st(spec.v_strides),
            o_stride: st(spec.o_strides),
            mask_stride,
            b: i32_dim("B", s.b)?,
            hq: i32_dim("Hq", s.hq)?,
            hkv: i32_dim("Hkv", s.hkv)?,
            group: i32_dim("Hq/Hkv", s.group_size())?,
            sq: i32_dim("Sq", s.sq)?,
            sk: i32_dim("Sk", s.sk)?,
            d: i32_dim("D", s.d)?,
            dv: i32_dim("Dv", s.dv)?,
            mask_kind,
            causal_offset,
            scale,
            scale_log2: (spec.scale() * std::f64::consts::LOG2_E) as f32,
            num_splits: 1,
            extra: 0,
            band_lo: band(band_lo)?,
            band_hi: band(band_hi)?,
            diag_offset,
            softcap: spec.softcap().map_or(0.0, |c| c as f32),
            alibi: 0,
            cu_q: 0,
            cu_k: 0,
            seqlens_k: 0,
            block_table: 0,
            page_size: 0,
            max_pages: 0,
            rel_lo: REL_NONE_LO,
            rel_hi: REL_NONE_HI,
            diag_br: 0,
            total_q: 0,
            num_pages: 0,
            reserved: 0,
        }
        .with_ragged_sizes(spec)
    }

    /// The ragged fields a spec decides (the device pointers `cu_q`, `cu_k`, `seqlens_k` and `block_table`
    /// are set by the caller that uploaded them): the band relative to each sequence's diagonal, which the
    /// kernels resolve per sequence (`seq_view` in common.cuh), the page geometry and the packed row count.
    fn with_ragged_sizes(mut self, spec: &AttentionSpec) -> Result<Self> {
        let Some(r) = &spec.ragged else { return Ok(self) };
        // Bounds past any 32-bit sequence restrict nothing; clamping them keeps `diag + rel` in i64 range.
        let rel = |x: i128| x.clamp(-(1 << 31) + 1, (1 << 31) - 2) as i32;
        if spec.mask.is_causal() {
            self.rel_hi = 0;
        }
        if let Some(w) = spec.variants.window {
            if let Some(l) = w.left {
                self.rel_lo = rel(-(l as i128));
            }
            if let Some(rr) = w.right {
                self.rel_hi = self.rel_hi.min(rel(rr as i128));
            }
        }
        self.diag_br = i32::from(spec.diagonal() == Some(sdpa_core::Diagonal::BottomRight));
        self.total_q = i32_dim("total query tokens", r.total_q())?;
        i32_dim("total key tokens", r.total_k())?;
        if let Some(p) = r.pages {
            self.page_size = i32_dim("page size", p.page_size)?;
            self.max_pages = i32_dim("block-table columns", p.max_pages)?;
            self.num_pages = i32_dim("pages", p.num_pages)?;
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sdpa_core::{DType, Shape};

    /// The CUDA struct in common.cuh declares the same fields in the same order (sizes are asserted on
    /// both sides; this catches two fields of one size swapped).
    #[test]
    fn common_cuh_declares_the_same_fields_in_order() {
        let src = crate::sys::modules::COMMON_CUH;
        let body = src.split("struct AttnParams {").nth(1).and_then(|s| s.split("};").next()).unwrap_or_default();
        let mut cuda = Vec::new();
        for decl in body.lines().map(|l| l.split("//").next().unwrap_or("").trim()).filter(|l| !l.is_empty()) {
            // `const void* q;`, `int b, hq, hkv;`, `i64 q_stride[3];`: the name is the last word of each
            // comma-separated declarator.
            for part in decl.trim_end_matches(';').split(',') {
                let word = part.split_whitespace().last().unwrap_or("").trim_start_matches('*');
                cuda.push(word.split('[').next().unwrap_or(word).to_string());
            }
        }
        let rust = [
            "q",
            "k",
            "v",
            "o",
            "mask",
            "lse",
            "workspace",
            "q_stride",
            "k_stride",
            "v_stride",
            "o_stride",
            "mask_stride",
            "b",
            "hq",
            "hkv",
            "group",
            "sq",
            "sk",
            "d",
            "dv",
            "mask_kind",
            "causal_offset",
            "scale",
            "scale_log2",
            "num_splits",
            "extra",
            "band_lo",
            "band_hi",
            "diag_offset",
            "softcap",
            "alibi",
            "cu_q",
            "cu_k",
            "seqlens_k",
            "block_table",
            "page_size",
            "max_pages",
            "rel_lo",
            "rel_hi",
            "diag_br",
            "total_q",
            "num_pages",
            "reserved",
        ];
        assert_eq!(cuda, rust);
    }

    #[test]
    fn bottom_right_offset_and_sizes() {
        let spec = AttentionSpec::new(Shape { b: 2, hq: 8, hkv: 2, sq: 3, sk: 10, d: 64, dv: 32 }, DType::F16)
            .with_mask(Mask::CausalBottomRight);
        let p = AttnParams::new(&spec, 1, 2, 3, 4, 0, 0).unwrap();
        assert_eq!((p.mask_kind, p.causal_offset, p.group), (MASK_CAUSAL, 7, 4));
        assert_eq!(p.q_stride, [8 * 3 * 64, 3 * 64, 64]);
        assert!((p.scale - 0.125).abs() < 1e-7);
        // The causal mask is the band's upper side; nothing bounds it below.
        assert_eq!((p.band_lo, p.band_hi, p.diag_offset), (-3, 7, 7));
    }

    #[test]
    fn windows_become_the_band_and_variants_pick_their_instantiation() {
        use sdpa_core::{Alibi, Diagonal, Window};
        let shape = Shape { b: 1, hq: 4, hkv: 4, sq: 100, sk: 300, d: 64, dv: 64 };
        let plain = AttentionSpec::new(shape, DType::BF16);
        let p = AttnParams::new(&plain, 0, 0, 0, 0, 0, 0).unwrap();
        assert_eq!((p.band_lo, p.band_hi, p.softcap), (-100, 300, 0.0));
        assert_eq!(Masking::of(&plain), Masking { kind: MASK_NONE, var: 0 });
        // Window 16 back on the bottom-right diagonal, causal: keys i + 200 - 16 ..= i + 200.
        let w = plain.clone().with_mask(Mask::CausalBottomRight).with_window(Window::left(16)).with_softcap(30.0);
        let p = AttnParams::new(&w, 0, 0, 0, 0, 0, 0).unwrap();
        assert_eq!((p.band_lo, p.band_hi, p.diag_offset, p.softcap), (184, 200, 200, 30.0));
        let m = Masking::of(&w);
        assert_eq!(
            (m, m.suffix().as_str()),
            (Masking { kind: MASK_NONE, var: VAR_BAND | VAR_SOFTCAP }, "band_softcap")
        );
        let a = plain.with_alibi(Alibi::Standard).with_diagonal(Diagonal::TopLeft);
        assert_eq!(Masking::of(&a).suffix(), "band_alibi");
        assert_eq!(Masking::of(&a).var_const(), "FA2_VAR_BAND | FA2_VAR_ALIBI");
        assert_eq!(Masking::all().len(), 11);
    }

    #[test]
    fn ragged_calls_carry_their_band_relative_to_each_diagonal() {
        use sdpa_core::{Layout, Ragged, Window};
        let r = Ragged::new(vec![3, 1], vec![10, 7]).paged(4, 2);
        let shape = Shape { b: 2, hq: 4, hkv: 2, sq: 3, sk: 10, d: 64, dv: 64 };
        let spec = AttentionSpec::new(shape, DType::BF16)
            .with_ragged(r, Layout::Bshd)
            .with_mask(Mask::CausalBottomRight)
            .with_window(Window::left(5));
        let p = AttnParams::new(&spec, 0, 0, 0, 0, 0, 0).unwrap();
        assert_eq!((p.rel_lo, p.rel_hi, p.diag_br, p.total_q), (-5, 0, 1, 4));
        assert_eq!((p.page_size, p.max_pages), (4, 3));
        // Pages of 4 slots x 2 heads x 64: the batch stride steps pages.
        assert_eq!(p.k_stride, [4 * 2 * 64, 64, 2 * 64]);
        let dense = AttnParams::new(&AttentionSpec::new(shape, DType::BF16), 0, 0, 0, 0, 0, 0).unwrap();
        assert_eq!((dense.rel_lo, dense.rel_hi, dense.total_q, dense.cu_q), (REL_NONE_LO, REL_NONE_HI, 0, 0));
    }
}
