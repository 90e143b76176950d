//! From candle tensors to one validated [`AttentionSpec`]: dims, strides and start offsets.
//!
//! candle describes a view by its dims, element strides and a start offset into the storage; sdpa describes
//! an operand by logical `[b, h, s, d]` sizes and element strides over (b, h, s) with a contiguous last
//! dim. So any candle view whose last dim has stride 1 (or size 1) maps onto sdpa without a copy: the
//! offset becomes the start of the slice handed to the kernel, and the strides are read in the dims order
//! the caller named. Transposed views (`[B, S, H, D]` storage seen as `[B, H, S, D]`), narrowed views (a
//! K or V cut out of a fused projection) and broadcast views (stride 0) all qualify.

use crate::error::sdpa_err;
use candle_core::{bail, Result};
use sdpa_core::{
    AttentionSpec, DType, ExplicitMask, Layout, Mask, Operand, Ragged, RunOptions, Shape, Strides, Variants,
};

/// One operand seen through its candle layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct View {
    /// Batch.
    pub b: usize,
    /// Heads.
    pub h: usize,
    /// Sequence positions.
    pub s: usize,
    /// Head dim.
    pub d: usize,
    /// Element strides over (b, h, s).
    pub strides: Strides,
    /// Start offset into the storage, in elements.
    pub offset: usize,
}

impl View {
    /// Reads `layout` as a `[b, h, s, d]` (BHSD) or `[b, s, h, d]` (BSHD) tensor.
    pub(crate) fn of(name: &str, layout: &candle_core::Layout, order: Layout) -> Result<Self> {
        let dims = layout.dims();
        let names = match order {
            Layout::Bhsd => "[B, H, S, D]",
            Layout::Bshd => "[B, S, H, D]",
        };
        if dims.len() != 4 {
            bail!("sdpa: {name} must have rank 4 ({names} for layout {}), got shape {dims:?}", order.name());
        }
        let st = head_dim_contiguous(name, dims, layout.stride())?;
        let (h, s, strides) = match order {
            Layout::Bhsd => (dims[1], dims[2], Strides { b: st[0], h: st[1], s: st[2] }),
            Layout::Bshd => (dims[2], dims[1], Strides { b: st[0], h: st[2], s: st[1] }),
        };
        Ok(View { b: dims[0], h, s, d: dims[3], strides, offset: layout.start_offset() })
    }

    /// Reads `layout` as packed token rows of a ragged batch: `[total, h, d]` (BSHD, FlashAttention's varlen
    /// layout) or `[h, total, d]` (BHSD). One block: `b` is 1 and the batch stride is unused.
    pub(crate) fn packed(name: &str, layout: &candle_core::Layout, order: Layout) -> Result<Self> {
        let dims = layout.dims();
        let names = match order {
            Layout::Bhsd => "[H, total, D]",
            Layout::Bshd => "[total, H, D]",
        };
        if dims.len() != 3 {
            bail!(
                "sdpa: {name} of a ragged batch must have rank 3 ({names} for layout {}), got shape {dims:?}",
                order.name()
            );
        }
        let st = head_dim_contiguous(name, dims, layout.stride())?;
        let (h, s, strides) = match order {
            Layout::Bhsd => (dims[0], dims[1], Strides { b: 0, h: st[0], s: st[1] }),
            Layout::Bshd => (dims[1], dims[0], Strides { b: 0, h: st[1], s: st[0] }),
        };
        Ok(View { b: 1, h, s, d: dims[2], strides, offset: layout.start_offset() })
    }
}

/// The strides of a view whose last dim (the head dim) is contiguous; an error with a hint otherwise.
fn head_dim_contiguous<'a>(name: &str, dims: &[usize], st: &'a [usize]) -> Result<&'a [usize]> {
    match (dims.last(), st.last()) {
        (Some(&n), Some(&s)) if n > 1 && s != 1 => bail!(
            "sdpa: the last dim (head dim) of {name} must be contiguous, but its stride is {s} (shape {dims:?}, \
             strides {st:?}); call `.contiguous()` on {name} first"
        ),
        _ => Ok(st),
    }
}

/// A validated call: the spec (with contiguous output strides in the caller's dims order), where each
/// input starts in its storage, and the candle shape of the output.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// What the kernel computes.
    pub spec: AttentionSpec,
    /// Kernel choice, threads, f32 math.
    pub run: RunOptions,
    /// Start offsets of Q, K and V in their storages.
    pub q_offset: usize,
    pub k_offset: usize,
    pub v_offset: usize,
    /// Elements of the (contiguous) output.
    pub out_len: usize,
    /// Output dims in the caller's order (rank 4 dense, rank 3 ragged).
    pub out_dims: Vec<usize>,
}

/// Position or explicit mask, as the op knows it before looking at the mask tensor's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MaskPlan {
    /// No explicit data.
    Position(Mask),
    /// An explicit mask prepared as contiguous f32 additive values over these dims.
    Explicit(ExplicitMask),
}

/// Maps candle's dtype to sdpa's; sdpa kernels run f32, f16 and bf16, and f8e4m3 inputs (CUDA fa3 only).
pub(crate) fn dtype_of(dt: candle_core::DType) -> Result<DType> {
    match dt {
        candle_core::DType::F32 => Ok(DType::F32),
        candle_core::DType::F16 => Ok(DType::F16),
        candle_core::DType::BF16 => Ok(DType::BF16),
        candle_core::DType::F8E4M3 => Ok(DType::F8E4M3),
        other => bail!("sdpa: unsupported dtype {other:?} for q, k and v (f32, f16, bf16 and f8e4m3 are supported)"),
    }
}

/// Builds and validates the spec of one call from the three input layouts.
pub(crate) fn plan(
    dtype: DType,
    order: Layout,
    scale: Option<f64>,
    mask: MaskPlan,
    variants: &Variants,
    run: RunOptions,
    lq: &candle_core::Layout,
    lk: &candle_core::Layout,
    lv: &candle_core::Layout,
) -> Result<Plan> {
    let q = View::of("q", lq, order)?;
    let k = View::of("k", lk, order)?;
    let v = View::of("v", lv, order)?;
    let dims = |l: &candle_core::Layout| format!("{:?}", l.dims());
    let ctx = || format!("(q {}, k {}, v {}, layout {})", dims(lq), dims(lk), dims(lv), order.name());
    if k.b != q.b || v.b != q.b {
        bail!("sdpa: batch sizes differ: q {}, k {}, v {} {}", q.b, k.b, v.b, ctx());
    }
    heads_fit(&q, &k, &v, &ctx)?;
    let shape = Shape { b: q.b, hq: q.h, hkv: k.h, sq: q.s, sk: k.s, d: q.d, dv: v.d };
    let mut spec = AttentionSpec::new(shape, dtype).with_layout(order);
    spec.scale = scale;
    spec.q_strides = q.strides;
    spec.k_strides = k.strides;
    spec.v_strides = v.strides;
    spec.mask = match mask {
        MaskPlan::Position(m) => m,
        MaskPlan::Explicit(m) => Mask::Explicit(m),
    };
    spec.variants = variants.clone();
    spec.validate().map_err(sdpa_err)?;
    let out_len = spec.numel(Operand::O).map_err(sdpa_err)?;
    let out_dims = match order {
        Layout::Bhsd => vec![shape.b, shape.hq, shape.sq, shape.dv],
        Layout::Bshd => vec![shape.b, shape.sq, shape.hq, shape.dv],
    };
    Ok(Plan { spec, run, q_offset: q.offset, k_offset: k.offset, v_offset: v.offset, out_len, out_dims })
}

/// K and V agree with each other and with Q: heads, positions (or pages), head dims, whole GQA groups.
fn heads_fit(q: &View, k: &View, v: &View, ctx: &dyn Fn() -> String) -> Result<()> {
    if v.h != k.h {
        bail!("sdpa: k has {} heads but v has {} {}", k.h, v.h, ctx());
    }
    if v.s != k.s {
        bail!("sdpa: k has {} positions but v has {} {}", k.s, v.s, ctx());
    }
    if k.d != q.d {
        bail!("sdpa: head dims of q ({}) and k ({}) differ {}", q.d, k.d, ctx());
    }
    if k.h == 0 || !q.h.is_multiple_of(k.h) {
        bail!(
            "sdpa: q has {} heads, which is not a multiple of the {} heads of k and v (GQA needs whole groups) {}",
            q.h,
            k.h,
            ctx()
        );
    }
    Ok(())
}

/// What a ragged call adds to a dense one: the batch (lengths, pages), the bounds of its lengths and, for a
/// paged cache, the block table already read to the host.
#[derive(Debug, Clone)]
pub(crate) struct RaggedPlan {
    /// Lengths and pages (their geometry taken from the K/V tensors when the call was built).
    pub ragged: Ragged,
    /// Bounds of the query and key lengths (the spec's `sq`, `sk`): FlashAttention's `max_seqlen_q/k`.
    pub max_q: usize,
    pub max_k: usize,
    /// The block table `[B, max_pages]`, row-major; `Some` exactly when K/V are paged.
    pub block_table: Option<Vec<u32>>,
}

/// Builds and validates the spec of one ragged call: Q packed `[total_q, Hq, D]` (BSHD) or `[Hq, total_q,
/// D]` (BHSD); K/V packed likewise, or pages `[num_pages, page_size, Hkv, D]` (BSHD) / `[num_pages, Hkv,
/// page_size, D]` (BHSD). The block table is checked against the pool here, on the host, before any kernel
/// runs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_ragged(
    dtype: DType,
    order: Layout,
    scale: Option<f64>,
    mask: Mask,
    variants: &Variants,
    run: RunOptions,
    rp: &RaggedPlan,
    lq: &candle_core::Layout,
    lk: &candle_core::Layout,
    lv: &candle_core::Layout,
) -> Result<Plan> {
    let r = &rp.ragged;
    let q = View::packed("q", lq, order)?;
    let (k, v) = match r.pages {
        Some(_) => (View::of("k", lk, order)?, View::of("v", lv, order)?),
        None => (View::packed("k", lk, order)?, View::packed("v", lv, order)?),
    };
    let dims = |l: &candle_core::Layout| format!("{:?}", l.dims());
    let ctx = || format!("(q {}, k {}, v {}, layout {})", dims(lq), dims(lk), dims(lv), order.name());
    heads_fit(&q, &k, &v, &ctx)?;
    if k.b != v.b {
        bail!("sdpa: k has {} pages but v has {} {}", k.b, v.b, ctx());
    }
    let total_q = r.total_q();
    if q.s != total_q {
        bail!("sdpa: q holds {} token rows but the query offsets end at {total_q} {}", q.s, ctx());
    }
    match r.pages {
        None if k.s != r.total_k() => {
            bail!("sdpa: k and v hold {} token rows but the key offsets end at {} {}", k.s, r.total_k(), ctx())
        }
        Some(p) if (p.num_pages, p.page_size) != (k.b, k.s) => bail!(
            "sdpa: internal: pages {}x{} planned for k and v of {} pages of {} slots",
            p.num_pages,
            p.page_size,
            k.b,
            k.s
        ),
        _ => {}
    }
    let shape = Shape { b: r.batch(), hq: q.h, hkv: k.h, sq: rp.max_q, sk: rp.max_k, d: q.d, dv: v.d };
    let mut spec = AttentionSpec::new(shape, dtype).with_ragged(r.clone(), order);
    spec.scale = scale;
    spec.mask = mask;
    spec.variants = variants.clone();
    // Packed operands keep the spec's (unused) batch stride; pages take the page stride from the tensor.
    spec.q_strides = Strides { b: spec.q_strides.b, ..q.strides };
    let kv_strides = |spec_b: usize, view: &View| match r.pages {
        Some(_) => view.strides,
        None => Strides { b: spec_b, ..view.strides },
    };
    spec.k_strides = kv_strides(spec.k_strides.b, &k);
    spec.v_strides = kv_strides(spec.v_strides.b, &v);
    spec.validate().map_err(sdpa_err)?;
    r.check_block_table(rp.block_table.as_deref()).map_err(sdpa_err)?;
    let out_len = spec.numel(Operand::O).map_err(sdpa_err)?;
    let out_dims = match order {
        Layout::Bhsd => vec![shape.hq, total_q, shape.dv],
        Layout::Bshd => vec![total_q, shape.hq, shape.dv],
    };
    Ok(Plan { spec, run, q_offset: q.offset, k_offset: k.offset, v_offset: v.offset, out_len, out_dims })
}

/// The part of a storage an operand addresses, from its start offset, checked against the spec.
pub(crate) fn operand_slice<'a, T>(name: &str, data: &'a [T], offset: usize, needed: usize) -> Result<&'a [T]> {
    match data.get(offset..) {
        Some(tail) if tail.len() >= needed => Ok(tail),
        _ => bail!(
            "sdpa: the storage of {name} holds {} elements, but its layout addresses {needed} elements from offset \
             {offset}",
            data.len()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    fn layout(t: &Tensor) -> candle_core::Layout {
        t.layout().clone()
    }

    #[test]
    fn a_transposed_bshd_storage_reads_as_bhsd_without_a_copy() {
        // Storage [B=2, S=5, H=3, D=4]; the view [B, H, S, D] after transpose(1, 2).
        let t = Tensor::zeros((2, 5, 3, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
        let bhsd = t.transpose(1, 2).unwrap();
        let v = View::of("q", &layout(&bhsd), Layout::Bhsd).unwrap();
        assert_eq!((v.b, v.h, v.s, v.d), (2, 3, 5, 4));
        assert_eq!(v.strides, Layout::Bshd.strides(3, 5, 4));
        let direct = View::of("q", &layout(&t), Layout::Bshd).unwrap();
        assert_eq!(direct, v);
    }

    #[test]
    fn a_narrowed_view_keeps_its_offset() {
        // A fused KV projection [B, S, 2·H, D]; V is the second half of the heads.
        let kv = Tensor::zeros((1, 6, 4, 8), candle_core::DType::F32, &Device::Cpu).unwrap();
        let v = kv.narrow(2, 2, 2).unwrap();
        let view = View::of("v", &layout(&v), Layout::Bshd).unwrap();
        assert_eq!(view.offset, 2 * 8);
        assert_eq!(view.strides, Strides { b: 6 * 4 * 8, h: 8, s: 4 * 8 });
    }

    #[test]
    fn a_strided_head_dim_is_refused_with_a_hint() {
        let t = Tensor::zeros((1, 2, 4, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
        let bad = t.transpose(2, 3).unwrap();
        let err = View::of("k", &layout(&bad), Layout::Bhsd).unwrap_err().to_string();
        assert!(err.contains("last dim") && err.contains("contiguous()"), "{err}");
        let rank3 = Tensor::zeros((2, 4, 3), candle_core::DType::F32, &Device::Cpu).unwrap();
        assert!(View::of("q", &layout(&rank3), Layout::Bhsd).unwrap_err().to_string().contains("rank 4"));
    }

    #[test]
    fn offsets_past_the_storage_are_errors() {
        let data = [0f32; 10];
        assert!(operand_slice("q", &data, 4, 6).is_ok());
        assert!(operand_slice("q", &data, 4, 7).is_err());
        assert!(operand_slice("q", &data, 11, 0).is_err());
    }
}
