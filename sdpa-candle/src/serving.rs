//! Serving calls: ragged (varlen) batches, paged KV caches and the write-to-cache step, on candle tensors.
//!
//! The semantics are sdpa-core's (`sdpa_core::ragged`): every sequence of a batch is an attention problem of
//! its own, whose causal mask, window and ALiBi measure from its own diagonal; a sequence with no key gives
//! zero rows. The integer tables (offsets, lengths, the block table) are read to the host and checked
//! before anything runs (`tables.rs`); the op carries them (`op.rs` says why). The write-to-cache step is
//! `append.rs`.

use crate::op::SdpaOp;
use crate::options::{SdpaMask, SdpaOptions};
use crate::plan::{MaskPlan, RaggedPlan, View};
use crate::tables::{lengths, lengths_from_offsets, BlockTable};
use candle_core::{bail, Result, Tensor};
use sdpa_core::{Mask, Paging, Ragged};

/// Attention over a ragged batch of packed sequences, FlashAttention's varlen layout.
///
/// With `opts.layout` [`Layout::Bshd`](crate::Layout::Bshd), `q` is `[total_q, Hq, D]`, `k` `[total_k, Hkv, D]`, `v` `[total_k,
/// Hkv, Dv]` and the result `[total_q, Hq, Dv]`; with [`Layout::Bhsd`](crate::Layout::Bhsd) the first two dims swap (`[Hq,
/// total_q, D]`). Sequence `b` owns query rows `cu_seqlens_q[b]..cu_seqlens_q[b + 1]` and key rows
/// `cu_seqlens_k[b]..cu_seqlens_k[b + 1]`. Both offset tensors have `B + 1` entries (u32, i32 or i64), start
/// at 0 and never go down; they are read to the host, so they may be CPU tensors even when Q, K and V are on
/// the GPU (then the call never waits for the GPU to read them); the last entry must equal the rows
/// of `q` (resp. `k`, `v`). Lengths of 0 are allowed.
///
/// Every option of [`SdpaOptions`] applies per sequence except explicit masks, which are refused (their
/// `[B, H, Sq, Sk]` shape has no meaning for sequences of different lengths): a causal mask or a window
/// measures from each sequence's own diagonal (`i + Sk_b − Sq_b` for [`SdpaMask::CausalBottomRight`]).
///
/// Gradients flow as through [`crate::sdpa`]: dQ, dK and dV packed like Q, K and V.
pub fn sdpa_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_seqlens_q: &Tensor,
    cu_seqlens_k: &Tensor,
    opts: &SdpaOptions,
) -> Result<Tensor> {
    let ragged = ragged_of(cu_seqlens_q, cu_seqlens_k, "cu_seqlens_k")?;
    let (max_q, max_k) = (ragged.max_q().max(1), ragged.max_k().max(1));
    ragged_call(q, k, v, RaggedPlan { ragged, max_q, max_k, block_table: None }, opts)
}

/// Attention of a ragged batch of queries over a paged KV cache (vLLM's PagedAttention layout).
///
/// `q` is packed as in [`sdpa_varlen`]. `k_pages` is `[num_pages, page_size, Hkv, D]` and `v_pages`
/// `[num_pages, page_size, Hkv, Dv]` with [`Layout::Bshd`](crate::Layout::Bshd) (FlashInfer's NHD), or `[num_pages, Hkv,
/// page_size, D]` with [`Layout::Bhsd`](crate::Layout::Bhsd) (HND); `page_size` is 1..=256. `block_table` is `[B, max_pages]`
/// (u32, i32 or i64): key `j` of sequence `b` is slot `j % page_size` of page `block_table[b][j /
/// page_size]`. `seqlens_k` is `[B]`, each sequence's cache length **including** the new tokens (append
/// them first with [`append_to_pages`](crate::append_to_pages)). Pages may repeat across sequences (a shared prefix) and sit in
/// any order; columns past a sequence's last page are never read and may hold anything (but not a
/// negative number). Every page a sequence uses is checked against the pool on the host before any kernel
/// runs.
///
/// There is no backward through a paged cache (training keeps none): when `q` or the pages track
/// gradients, `backward()` fails with an error that says so, rather than leave them without gradients.
pub fn sdpa_paged(
    q: &Tensor,
    k_pages: &Tensor,
    v_pages: &Tensor,
    cu_seqlens_q: &Tensor,
    block_table: &Tensor,
    seqlens_k: &Tensor,
    opts: &SdpaOptions,
) -> Result<Tensor> {
    let seqlens_q = lengths_from_offsets("cu_seqlens_q", cu_seqlens_q)?;
    let cache = lengths("seqlens_k", seqlens_k, seqlens_q.len())?;
    let ragged = Ragged::new(seqlens_q, cache);
    paged_call(q, k_pages, v_pages, ragged, block_table, None, opts)
}

/// The batch of two offset tensors, which must name the same number of sequences.
pub(crate) fn ragged_of(cu_q: &Tensor, cu_k: &Tensor, k_name: &str) -> Result<Ragged> {
    let seqlens_q = lengths_from_offsets("cu_seqlens_q", cu_q)?;
    let seqlens_k = lengths_from_offsets(k_name, cu_k)?;
    if seqlens_q.len() != seqlens_k.len() {
        bail!(
            "sdpa: cu_seqlens_q names {} sequences but {k_name} names {}; both need B + 1 offsets",
            seqlens_q.len(),
            seqlens_k.len()
        );
    }
    Ok(Ragged::new(seqlens_q, seqlens_k))
}

/// A paged call: the pages' geometry from the K tensor, the block table read and checked; `bounds` are the
/// caller's bounds of the query and key lengths (the longest given when `None`).
pub(crate) fn paged_call(
    q: &Tensor,
    k_pages: &Tensor,
    v_pages: &Tensor,
    mut ragged: Ragged,
    block_table: &Tensor,
    bounds: Option<(usize, usize)>,
    opts: &SdpaOptions,
) -> Result<Tensor> {
    let pages = View::of("k_pages", k_pages.layout(), opts.layout)?;
    let table = BlockTable::read(block_table, ragged.batch())?;
    ragged.pages = Some(Paging { page_size: pages.s, num_pages: pages.b, max_pages: table.max_pages });
    let (max_q, max_k) = bounds.unwrap_or((ragged.max_q().max(1), ragged.max_k().max(1)));
    ragged_call(q, k_pages, v_pages, RaggedPlan { ragged, max_q, max_k, block_table: Some(table.pages) }, opts)
}

/// One ragged call: the op, validated before candle takes the storage locks.
pub(crate) fn ragged_call(q: &Tensor, k: &Tensor, v: &Tensor, rp: RaggedPlan, opts: &SdpaOptions) -> Result<Tensor> {
    crate::same_device_and_dtype(q, k, v)?;
    let mask = match &opts.mask {
        SdpaMask::None => Mask::None,
        SdpaMask::CausalTopLeft => Mask::CausalTopLeft,
        SdpaMask::CausalBottomRight => Mask::CausalBottomRight,
        SdpaMask::Keep(_) | SdpaMask::Exclude(_) | SdpaMask::Additive(_) => bail!(
            "sdpa: an explicit mask does not combine with a ragged batch; use a causal mask or a window, which \
             apply per sequence"
        ),
    };
    let op = SdpaOp {
        order: opts.layout,
        scale: opts.scale,
        mask: MaskPlan::Position(mask),
        mask_tensor: None,
        variants: opts.variants()?,
        run: opts.run(),
        ragged: Some(rp),
        saved: Default::default(),
        bwd: opts.backward(),
        descale: opts.descale,
    };
    op.plan(q.dtype(), q.layout(), k.layout(), v.layout())?;
    op.apply(q, k, v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn offsets_of_different_batches_are_refused() {
        let dev = Device::Cpu;
        let a = Tensor::new(&[0u32, 2, 5], &dev).expect("a");
        let b = Tensor::new(&[0u32, 2], &dev).expect("b");
        let err = ragged_of(&a, &b, "cu_seqlens_k").expect_err("mismatch").to_string();
        assert!(err.contains("names 2 sequences but cu_seqlens_k names 1"), "{err}");
    }
}
