//! candle-flash-attn's varlen and paged functions: the dense functions' arguments (same mapping, see the
//! parent module) plus the ragged batch.
//!
//! - `seqlens_q`, `seqlens_k`: despite the name, **cumulative** offsets (`B + 1` entries: `0, l0, l0 + l1,
//!   ...`), as in candle-flash-attn; u32 there, u32, i32 or i64 here, on any device (read to the host and
//!   checked: first 0, never going down, the last equal to the rows of `q` and of `k`/`v`; candle-flash-attn
//!   leaves rows of `q` past the last offset unwritten, sdpa refuses such a padded batch).
//! - `max_seqlen_q`, `max_seqlen_k`: bounds of the per-sequence lengths. candle-flash-attn trusts them
//!   (a sequence longer than the bound is computed wrongly); sdpa refuses the call with an error naming the
//!   sequence. Its window clamping uses `max_seqlen_k` as the dense functions use `Sk` (the module docs of
//!   [`crate::flash`] describe the edge where that differs from the documented window).
//! - `causal` and the windows measure from each sequence's own bottom-right diagonal, `i + Sk_b − Sq_b`,
//!   as FlashAttention's varlen kernels do; ALiBi and softcap as in the dense functions.
//! - Tensors are packed `[total, H, D]` rows; the result is `[total_q, Hq, Dv]`, contiguous (`v` may have
//!   its own head dim, as in the dense functions; candle-flash-attn needs it equal to `q`'s). f32 too, and
//!   any head dim up to the backend's limit, on the CPU as well as CUDA.
//!
//! The paged function reads K/V from `[num_pages, page_block_size, Hkv, D]` pages through `block_table`
//! (`[B, max_blocks]`, u32 or i32 there; u32, i32 or i64 here) and takes `seqlens_k` as the cumulative
//! **cache** lengths. Where sdpa differs: any `page_block_size` in 1..=256 (candle-flash-attn: a multiple
//! of 32); every page a sequence uses is checked against the pool before anything runs (candle-flash-attn
//! reads whatever the table names); `mm_prefix_ranges` (key ranges that bypass the causal and window
//! masks, for multimodal prefixes) is not supported and must be `None`.

use super::fa_options;
use crate::options::SdpaOptions;
use crate::plan::RaggedPlan;
use crate::serving::{paged_call, ragged_call, ragged_of};
use candle_core::{bail, Result, Tensor};

/// One varlen call with FlashAttention's options.
#[allow(clippy::too_many_arguments)]
fn varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    opts: &SdpaOptions,
) -> Result<Tensor> {
    let ragged = ragged_of(seqlens_q, seqlens_k, "seqlens_k")?;
    ragged_call(q, k, v, RaggedPlan { ragged, max_q: max_seqlen_q, max_k: max_seqlen_k, block_table: None }, opts)
}

fn causal_right(causal: bool) -> Option<usize> {
    if causal {
        Some(0)
    } else {
        None
    }
}

/// `softmax(Q·Kᵀ·softmax_scale)·V` per sequence of a packed batch, optionally causal (bottom-right per
/// sequence), as candle-flash-attn's `flash_attn_varlen`.
///
/// * `q` - `[total_q, num_heads_q, head_size]`; `k` `[total_kv, num_heads_kv, head_size]`; `v` `[total_kv,
///   num_heads_kv, head_size_v]`.
/// * `seqlens_q`, `seqlens_k` - cumulative offsets, `B + 1` entries starting at 0.
/// * `max_seqlen_q`, `max_seqlen_k` - the longest sequence (an upper bound is fine).
///
/// Returns `[total_q, num_heads_q, head_size_v]`. See the module docs for the mapping.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let opts = fa_options(softmax_scale, None, causal_right(causal), None, 0.0)?;
    varlen(q, k, v, seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k, &opts)
}

/// Sliding-window varlen attention, as candle-flash-attn's `flash_attn_varlen_windowed`: query `i` of
/// sequence `b` sees keys `i + Sk_b − Sq_b − window_size_left ..= i + Sk_b − Sq_b + window_size_right`
/// (`None`: unbounded); `(None, Some(0))` is the causal mask. Shapes as [`flash_attn_varlen`].
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let opts = fa_options(softmax_scale, window_size_left, window_size_right, None, 0.0)?;
    varlen(q, k, v, seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k, &opts)
}

/// Varlen attention with ALiBi (`alibi_slopes`: f32 `[num_heads_q]`), as candle-flash-attn's
/// `flash_attn_varlen_alibi`. Shapes as [`flash_attn_varlen`].
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let opts = fa_options(softmax_scale, None, causal_right(causal), Some(alibi_slopes), 0.0)?;
    varlen(q, k, v, seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k, &opts)
}

/// Varlen attention with ALiBi and a sliding window, as candle-flash-attn's
/// `flash_attn_varlen_alibi_windowed`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    let opts = fa_options(softmax_scale, window_size_left, window_size_right, Some(alibi_slopes), 0.0)?;
    varlen(q, k, v, seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k, &opts)
}

/// Varlen attention with optional ALiBi, a sliding window and a logit softcap (`0.0`: none), as
/// candle-flash-attn's `flash_attn_varlen_alibi_windowed_softcap`.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_alibi_windowed_softcap(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    let opts = fa_options(softmax_scale, window_size_left, window_size_right, alibi_slopes, softcap)?;
    varlen(q, k, v, seqlens_q, seqlens_k, max_seqlen_q, max_seqlen_k, &opts)
}

/// Varlen attention over a paged KV cache, as candle-flash-attn's `flash_attn_varlen_paged_windowed`.
///
/// * `q` - `[total_q, num_heads_q, head_size]`, packed; `seqlens_q` its cumulative offsets.
/// * `k`, `v` - pages `[num_blocks, page_block_size, num_heads_kv, head_size]`.
/// * `seqlens_k` - cumulative cache lengths (`B + 1` entries): sequence `b` holds `seqlens_k[b + 1] −
///   seqlens_k[b]` keys, the new tokens included.
/// * `block_table` - `[B, max_blocks]` page indices; `page_block_size` must equal `k`'s second dim.
/// * `mm_prefix_ranges` - must be `None` (not supported; an error says so).
/// * `softcap` - `None` or `Some(0.0)`: no cap.
///
/// Returns `[total_q, num_heads_q, head_size_v]`. See the module docs for where sdpa differs.
#[allow(clippy::too_many_arguments)]
pub fn flash_attn_varlen_paged_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    seqlens_q: &Tensor,
    seqlens_k: &Tensor,
    block_table: &Tensor,
    mm_prefix_ranges: Option<&Tensor>,
    max_seqlen_q: usize,
    max_seqlen_k: usize,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    page_block_size: usize,
    softcap: Option<f32>,
) -> Result<Tensor> {
    if mm_prefix_ranges.is_some() {
        bail!(
            "sdpa: mm_prefix_ranges (key ranges that bypass the causal and window masks) are not supported; pass None"
        );
    }
    if k.rank() == 4 && k.dims()[1] != page_block_size {
        bail!("sdpa: page_block_size {page_block_size} does not match the pages of k, shape {:?}", k.dims());
    }
    let opts = fa_options(softmax_scale, window_size_left, window_size_right, None, softcap.unwrap_or(0.0))?;
    let ragged = ragged_of(seqlens_q, seqlens_k, "seqlens_k")?;
    paged_call(q, k, v, ragged, block_table, Some((max_seqlen_q, max_seqlen_k)), &opts)
}
