//! Which operators are fused attention, and where their arguments are. Positions follow the operators'
//! schemas in PyTorch's `native_functions.yaml` and flash-attn's Python bindings, so `Concrete Inputs[i]`
//! and `Input Dims[i]` can be read by index.

use super::ragged::BatchLayout;
use serde::Serialize;

/// Forward or backward pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Forward.
    Fwd,
    /// Backward.
    Bwd,
}

impl Phase {
    /// `fwd` or `bwd`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Fwd => "fwd",
            Phase::Bwd => "bwd",
        }
    }
}

/// The implementation that computed an attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum AttnBackend {
    /// PyTorch's FlashAttention-2 backend.
    Flash,
    /// PyTorch's memory-efficient (CUTLASS, xformers-derived) backend.
    Efficient,
    /// cuDNN's fused attention (on Hopper a flash-attention kernel with wgmma).
    Cudnn,
    /// SDPA's math fallback: matmul, softmax, matmul inside SDPA (not fused).
    Math,
    /// The `flash-attn` package (Tri Dao's kernels, FA2/FA3).
    FlashAttn,
    /// PyTorch's FlexAttention compiled by Inductor: a Triton template kernel (`triton_tem_fused_flex_attention*`)
    /// with the `score_mod` and the `BlockMask`'s `mask_mod` compiled into it.
    Flex,
    /// AMD's Composable Kernel / aiter fused attention.
    Ck,
    /// vLLM's PagedAttention kernels (`paged_attention_v1_kernel`, `paged_attention_v2_kernel` and its reduce).
    Vllm,
    /// FlashInfer's batch kernels over paged or ragged KV caches.
    FlashInfer,
    /// PyTorch's CPU flash kernel.
    CpuFlash,
    /// A backend registered through `_fused_attention_overrideable` (out-of-tree devices).
    Overrideable,
    /// An attention entry point whose backend neither the op nor its kernels reveal.
    Unknown,
    /// Eager attention written as separate matmul / softmax / matmul ops.
    Eager,
}

impl AttnBackend {
    /// Lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            AttnBackend::Flash => "flash",
            AttnBackend::Efficient => "efficient",
            AttnBackend::Cudnn => "cudnn",
            AttnBackend::Math => "math",
            AttnBackend::FlashAttn => "flash_attn",
            AttnBackend::Flex => "flex",
            AttnBackend::Ck => "ck",
            AttnBackend::Vllm => "vllm",
            AttnBackend::FlashInfer => "flashinfer",
            AttnBackend::CpuFlash => "cpu_flash",
            AttnBackend::Overrideable => "overrideable",
            AttnBackend::Unknown => "unknown",
            AttnBackend::Eager => "eager",
        }
    }

    /// True for kernels that tile K/V with an online softmax and never write the score matrix.
    pub fn is_fused_kernel(self) -> bool {
        !matches!(self, AttnBackend::Math | AttnBackend::Eager | AttnBackend::Unknown)
    }
}

/// How Q, K, V are laid out in the op's inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkvLayout {
    /// `[B, H, S, D]` (SDPA); 3-d `[H, S, D]` means B = 1.
    Bhsd,
    /// `[B, S, H, D]` (flash-attn, PyTorch's `_flash_attention_forward`).
    Bshd,
    /// Packed `[total_tokens, H, D]` with cumulative lengths and maximum lengths.
    Varlen(RaggedArgs),
    /// vLLM's paged decode ops: Q `[num_seqs, Hq, D]`, one query per sequence, against a paged cache.
    VllmPaged(VllmArgs),
    /// The op does not carry Q/K/V shapes (autograd nodes).
    None,
}

/// Where a varlen op keeps its sequence bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaggedArgs {
    /// Index of the query offsets (`cu_seqlens_q`, `cum_seq_q`): B + 1 of them.
    pub cu_q: usize,
    /// Index of the longest query length (`max_seqlen_q`, `max_q`).
    pub max_q: usize,
    /// Index of the longest key length (`max_seqlen_k`, `max_k`).
    pub max_k: usize,
    /// Index of a block table (`[B, max_pages]`): when one is passed, K and V are pages
    /// `[num_pages, page_size, Hkv, D]` of a cache.
    pub block_table: Option<usize>,
}

const fn ragged(cu_q: usize, max_q: usize, max_k: usize, block_table: Option<usize>) -> RaggedArgs {
    RaggedArgs { cu_q, max_q, max_k, block_table }
}

/// Where vLLM's `paged_attention_v1` / `_v2` ops keep their arguments (`csrc/torch_bindings.cpp`: `out, query,
/// key_cache, value_cache, num_kv_heads, scale, block_tables, seq_lens, block_size, max_seq_len, alibi_slopes,
/// kv_cache_dtype, ...`; v2 has `exp_sums, max_logits, tmp_out` after `out`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VllmArgs {
    /// Index of the query `[num_seqs, Hq, D]`.
    pub query: usize,
    /// Index of the value cache `[num_blocks, Hkv, Dv, block_size]`.
    pub value_cache: usize,
    /// Index of `num_kv_heads`.
    pub num_kv_heads: usize,
    /// Index of `block_size` (tokens per page).
    pub block_size: usize,
    /// Index of `max_seq_len`.
    pub max_seq_len: usize,
}

const fn vllm(first: usize) -> VllmArgs {
    VllmArgs {
        query: first,
        value_cache: first + 2,
        num_kv_heads: first + 3,
        block_size: first + 7,
        max_seq_len: first + 8,
    }
}

/// How the op says "causal".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CausalArg {
    /// `is_causal` bool, aligned top-left (PyTorch SDPA semantics).
    TopLeft(usize),
    /// `causal` bool, aligned bottom-right (flash-attn semantics).
    BottomRight(usize),
    /// `custom_mask_type` int: 0 none, 1 causal top-left, 2 causal bottom-right.
    CustomMaskType(usize),
    /// Not recorded.
    None,
}

/// Where to find things in one fused attention operator's inputs.
#[derive(Debug, Clone, Copy)]
pub struct Signature {
    /// Forward or backward.
    pub phase: Phase,
    /// Backend implied by the name (`Unknown` for the dispatcher `scaled_dot_product_attention`).
    pub backend: AttnBackend,
    /// Layout of Q/K/V.
    pub layout: QkvLayout,
    /// Input indices of Q, K, V.
    pub qkv: [usize; 3],
    /// Input index of an explicit mask / bias tensor.
    pub mask: Option<usize>,
    /// Input index of dropout p.
    pub dropout: Option<usize>,
    /// The causal argument.
    pub causal: CausalArg,
    /// Input index of the softmax scale.
    pub scale: Option<usize>,
    /// Input indices of flash-attn's `window_size_left` and `window_size_right` (`-1`: unbounded).
    pub window: Option<[usize; 2]>,
    /// Input index of flash-attn's `softcap` (`0.0`: off).
    pub softcap: Option<usize>,
    /// Input index of flash-attn's `alibi_slopes` tensor (absent: off).
    pub alibi: Option<usize>,
    /// For ops that take either dense or packed inputs (PyTorch's `_flash_attention_forward` and
    /// `_efficient_attention_forward`, which nested tensors and `varlen_attn` call with offsets): where the
    /// offsets are; the call is varlen when they are passed.
    pub varlen_when_given: Option<RaggedArgs>,
}

const fn sig(
    phase: Phase,
    backend: AttnBackend,
    layout: QkvLayout,
    qkv0: usize,
    mask: Option<usize>,
    dropout: Option<usize>,
    causal: CausalArg,
    scale: Option<usize>,
) -> Signature {
    Signature {
        phase,
        backend,
        layout,
        qkv: [qkv0, qkv0 + 1, qkv0 + 2],
        mask,
        dropout,
        causal,
        scale,
        window: None,
        softcap: None,
        alibi: None,
        varlen_when_given: None,
    }
}

/// `s`, read as varlen when the offsets at `r` are passed.
const fn or_varlen(s: Signature, r: RaggedArgs) -> Signature {
    Signature { varlen_when_given: Some(r), ..s }
}

/// flash-attn 2.6+ passes `window_size_left, window_size_right, softcap, alibi_slopes` right after `causal`
/// in all four of its custom ops (`flash_attn::_flash_attn_{,varlen_}{forward,backward}`).
const fn with_fa_variants(s: Signature, causal: usize) -> Signature {
    Signature { window: Some([causal + 1, causal + 2]), softcap: Some(causal + 3), alibi: Some(causal + 4), ..s }
}

/// The signature of a fused attention operator, or `None` when `name` is not one.
pub fn signature(name: &str) -> Option<Signature> {
    use AttnBackend::*;
    use CausalArg::{BottomRight, CustomMaskType, TopLeft};
    use Phase::*;
    use QkvLayout::{Bhsd, Bshd};
    let s = match name {
        "aten::scaled_dot_product_attention" => sig(Fwd, Unknown, Bhsd, 0, Some(3), Some(4), TopLeft(5), Some(6)),
        "aten::_scaled_dot_product_flash_attention" => sig(Fwd, Flash, Bhsd, 0, None, Some(3), TopLeft(4), Some(6)),
        "aten::_scaled_dot_product_flash_attention_for_cpu" => {
            sig(Fwd, CpuFlash, Bhsd, 0, Some(5), Some(3), TopLeft(4), Some(6))
        }
        "aten::_scaled_dot_product_efficient_attention" => {
            sig(Fwd, Efficient, Bhsd, 0, Some(3), Some(5), TopLeft(6), Some(7))
        }
        "aten::_scaled_dot_product_cudnn_attention" => sig(Fwd, Cudnn, Bhsd, 0, Some(3), Some(5), TopLeft(6), Some(8)),
        "aten::_scaled_dot_product_attention_math" | "aten::_scaled_dot_product_attention_math_for_mps" => {
            sig(Fwd, Math, Bhsd, 0, Some(3), Some(4), TopLeft(5), Some(7))
        }
        "aten::_scaled_dot_product_fused_attention_overrideable" => {
            sig(Fwd, Overrideable, Bhsd, 0, Some(3), Some(4), TopLeft(5), Some(7))
        }
        // `_flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
        // return_debug_mask, *, scale, ...)` (native_functions.yaml); nested tensors and `varlen_attn` pass the
        // offsets, dense SDPA passes None.
        "aten::_flash_attention_forward" => {
            or_varlen(sig(Fwd, Flash, Bshd, 0, None, Some(7), TopLeft(8), Some(10)), ragged(3, 5, 6, None))
        }
        // `_efficient_attention_forward(query, key, value, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
        // max_seqlen_k, dropout_p, custom_mask_type, ...)`: nested tensors pass Q as `[1, total, H, D]`.
        "aten::_efficient_attention_forward" => or_varlen(
            sig(Fwd, Efficient, Bshd, 0, Some(3), Some(8), CustomMaskType(9), Some(11)),
            ragged(4, 6, 7, None),
        ),
        // PyTorch >= 2.10's `torch.nn.attention.varlen.varlen_attn` runs through the custom op
        // `torch_attn::_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal, scale, ...)`
        // (`torch/nn/attention/varlen.py`), which calls `_flash_attention_forward`; its causal mask is
        // FlashAttention's, bottom-right in each sequence (the same as top-left where Sq = Sk).
        // Some 2.10 builds registered it as `torch_nn_attention::_varlen_attn`, with the same arguments.
        "torch_attn::_varlen_attn" | "torch_nn_attention::_varlen_attn" => {
            sig(Fwd, Flash, QkvLayout::Varlen(ragged(3, 5, 6, None)), 0, None, None, BottomRight(7), Some(8))
        }
        "torch_attn::_varlen_attn_out" => {
            sig(Fwd, Flash, QkvLayout::Varlen(ragged(4, 6, 7, None)), 1, None, None, BottomRight(8), Some(9))
        }
        "_C::paged_attention_v1" => {
            sig(Fwd, Vllm, QkvLayout::VllmPaged(vllm(1)), 1, None, None, CausalArg::None, Some(5))
        }
        "_C::paged_attention_v2" => {
            sig(Fwd, Vllm, QkvLayout::VllmPaged(vllm(4)), 4, None, None, CausalArg::None, Some(8))
        }
        "aten::_cudnn_attention_forward" => sig(Fwd, Cudnn, Bhsd, 0, Some(3), Some(9), TopLeft(10), Some(12)),
        "flash_attn::_flash_attn_forward" => {
            with_fa_variants(sig(Fwd, FlashAttn, Bshd, 0, None, Some(3), BottomRight(5), Some(4)), 5)
        }
        "flash_attn::_flash_attn_varlen_forward" => with_fa_variants(
            sig(
                Fwd,
                FlashAttn,
                // flash-attn >= 2.6: `(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                // softmax_scale, causal, window_size_left, window_size_right, softcap, alibi_slopes,
                // return_softmax, block_table, ...)` (`flash_attn/flash_attn_interface.py`).
                QkvLayout::Varlen(ragged(3, 5, 6, Some(15))),
                0,
                None,
                Some(7),
                BottomRight(9),
                Some(8),
            ),
            9,
        ),
        // FlashAttention-3's custom ops (`hopper/flash_attn_interface.py`): `_flash_attn_forward(q, k, v, k_new,
        // v_new, qv, out_, cu_seqlens_q, cu_seqlens_k, cu_seqlens_k_new, seqused_q, seqused_k, max_seqlen_q,
        // max_seqlen_k, page_table, kv_batch_idx, leftpad_k, rotary_cos, rotary_sin, seqlens_rotary, q_descale,
        // k_descale, v_descale, softmax_scale, causal, window_size_left, window_size_right, attention_chunk,
        // softcap, ...)`, BSHD, varlen when `cu_seqlens_q` is passed; causal bottom-right as in FlashAttention-2.
        "flash_attn_3::_flash_attn_forward" => Signature {
            window: Some([25, 26]),
            softcap: Some(28),
            varlen_when_given: Some(ragged(7, 12, 13, Some(14))),
            ..sig(Fwd, FlashAttn, Bshd, 0, None, None, BottomRight(24), Some(23))
        },
        // `_flash_attn_backward(dout, q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, sequed_q, sequed_k,
        // max_seqlen_q, max_seqlen_k, dq, dk, dv, softmax_scale, is_causal, window_size_left, window_size_right,
        // softcap, ...)`.
        "flash_attn_3::_flash_attn_backward" => Signature {
            window: Some([17, 18]),
            softcap: Some(19),
            varlen_when_given: Some(ragged(6, 10, 11, None)),
            ..sig(Bwd, FlashAttn, Bshd, 1, None, None, BottomRight(16), Some(15))
        },
        "aten::_scaled_dot_product_flash_attention_backward" => {
            sig(Bwd, Flash, Bhsd, 1, None, Some(10), TopLeft(11), Some(14))
        }
        "aten::_scaled_dot_product_efficient_attention_backward" => {
            sig(Bwd, Efficient, Bhsd, 1, Some(4), Some(9), TopLeft(11), Some(12))
        }
        "aten::_scaled_dot_product_cudnn_attention_backward" | "aten::_cudnn_attention_backward" => {
            sig(Bwd, Cudnn, Bhsd, 1, Some(8), Some(13), TopLeft(14), Some(15))
        }
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward" => {
            sig(Bwd, CpuFlash, Bhsd, 1, Some(8), Some(6), TopLeft(7), Some(9))
        }
        "aten::_scaled_dot_product_fused_attention_overrideable_backward" => {
            sig(Bwd, Overrideable, Bhsd, 1, None, None, CausalArg::None, None)
        }
        "aten::_flash_attention_backward" => sig(Bwd, Flash, Bshd, 1, None, Some(10), TopLeft(11), Some(14)),
        "aten::_efficient_attention_backward" => {
            sig(Bwd, Efficient, Bshd, 1, Some(4), Some(11), CustomMaskType(14), Some(16))
        }
        "flash_attn::_flash_attn_backward" => {
            with_fa_variants(sig(Bwd, FlashAttn, Bshd, 1, None, Some(9), BottomRight(11), Some(10)), 11)
        }
        "flash_attn::_flash_attn_varlen_backward" => with_fa_variants(
            sig(
                Bwd,
                FlashAttn,
                QkvLayout::Varlen(ragged(9, 11, 12, None)),
                1,
                None,
                Some(13),
                BottomRight(15),
                Some(14),
            ),
            15,
        ),
        _ => return generic(name),
    };
    Some(s)
}

/// Autograd nodes, FlexAttention's Triton kernels and other flash-attn entry points: recognised by name.
fn generic(name: &str) -> Option<Signature> {
    let bare = |phase, backend| sig(phase, backend, QkvLayout::None, 0, None, None, CausalArg::None, None);
    if let Some(phase) = flex_phase(name) {
        // Inductor launches each Triton kernel under a CPU op of the kernel's name whose inputs are the kernel's
        // arguments: the template (`triton_tem_`) takes Q, K, V `[B, H, S, D]` first (forward and backward), then
        // the LSE, the BlockMask's block counts and indices, and the output. Its helpers (the backward's
        // `triton_red_..._flex_attention_backward` that sums dO·O) carry no Q/K/V.
        return Some(if name.starts_with("triton_tem_") {
            sig(phase, AttnBackend::Flex, QkvLayout::Bhsd, 0, None, None, CausalArg::None, None)
        } else {
            bare(phase, AttnBackend::Flex)
        });
    }
    if name.starts_with("ScaledDotProduct") && name.contains("AttentionBackward") {
        let backend = if name.contains("Flash") {
            AttnBackend::Flash
        } else if name.contains("Efficient") {
            AttnBackend::Efficient
        } else if name.contains("Cudnn") {
            AttnBackend::Cudnn
        } else if name.contains("Overrideable") {
            AttnBackend::Overrideable
        } else {
            AttnBackend::Unknown
        };
        return Some(bare(Phase::Bwd, backend));
    }
    let lower = name.to_ascii_lowercase();
    if lower.starts_with("flash_attn") || (name.contains("FlashAttn") && !name.starts_with("autograd::")) {
        let bwd = lower.contains("bwd") || lower.contains("backward");
        return Some(bare(if bwd { Phase::Bwd } else { Phase::Fwd }, AttnBackend::FlashAttn));
    }
    None
}

/// Forward or backward for a kernel (or its launching op) that Inductor generated for FlexAttention
/// (`triton_tem_fused_flex_attention_0`, `..._flex_attention_backward_1`, `..._flex_decoding_0`); `None` for any
/// other name.
pub fn flex_phase(name: &str) -> Option<Phase> {
    if !name.starts_with("triton_") || !(name.contains("flex_attention") || name.contains("flex_decoding")) {
        return None;
    }
    Some(if name.contains("backward") { Phase::Bwd } else { Phase::Fwd })
}

/// Serving kernels, by the names their sources give them, with the layout each one reads. vLLM:
/// `csrc/attention/paged_attention_v1.cu` / `_v2.cu` (`vllm::paged_attention_v1_kernel`,
/// `vllm::paged_attention_v2_kernel`, `vllm::paged_attention_v2_reduce_kernel`, which merges v2's partitions).
/// FlashInfer: `include/flashinfer/attention/decode.cuh` and `prefill.cuh` (`BatchDecodeWithPagedKVCacheKernel`,
/// `BatchPrefillWithPagedKVCacheKernel`, `BatchPrefillWithRaggedKVCacheKernel`).
const SERVING_KERNELS: &[(&str, AttnBackend, BatchLayout)] = &[
    ("paged_attention_v1_kernel", AttnBackend::Vllm, BatchLayout::Paged),
    ("paged_attention_v2_kernel", AttnBackend::Vllm, BatchLayout::Paged),
    ("paged_attention_v2_reduce_kernel", AttnBackend::Vllm, BatchLayout::Paged),
    ("BatchDecodeWithPagedKVCacheKernel", AttnBackend::FlashInfer, BatchLayout::Paged),
    ("BatchPrefillWithPagedKVCacheKernel", AttnBackend::FlashInfer, BatchLayout::Paged),
    ("BatchPrefillWithRaggedKVCacheKernel", AttnBackend::FlashInfer, BatchLayout::Varlen),
];

/// The serving kernel a GPU kernel name is, with its backend and layout.
fn serving_kernel(kernel: &str) -> Option<(AttnBackend, BatchLayout)> {
    SERVING_KERNELS.iter().find(|(k, _, _)| kernel.contains(k)).map(|&(_, b, l)| (b, l))
}

/// The layout a kernel name reveals: paged or ragged for the serving kernels; `None` for kernels that read
/// any layout (FlashAttention's `flash_fwd_splitkv_kernel` takes its block table at run time).
pub fn kernel_layout(kernel: &str) -> Option<BatchLayout> {
    serving_kernel(kernel).map(|(_, l)| l)
}

/// The "write to cache" step of serving (new keys and values copied into their pages), by kernel name:
/// vLLM's `vllm::reshape_and_cache_kernel` and `vllm::reshape_and_cache_flash_kernel` (`csrc/cache_kernels.cu`)
/// and FlashInfer's `AppendPagedKVCacheKernel` (`include/flashinfer/page.cuh`). Not attention, but time that
/// paged attention brings with it.
pub fn is_cache_write_kernel(kernel: &str) -> bool {
    kernel.contains("reshape_and_cache_kernel")
        || kernel.contains("reshape_and_cache_flash_kernel")
        || kernel.contains("AppendPagedKVCacheKernel")
}

/// The same step as an op: vLLM's `_C_cache_ops::reshape_and_cache` and `_C_cache_ops::reshape_and_cache_flash`
/// (`csrc/torch_bindings.cpp`, the `_cache_ops` library).
pub fn is_cache_write_op(op: &str) -> bool {
    matches!(op, "_C_cache_ops::reshape_and_cache" | "_C_cache_ops::reshape_and_cache_flash")
}

/// The backend a GPU kernel name reveals, if it is an attention kernel.
pub fn kernel_backend(kernel: &str) -> Option<AttnBackend> {
    if flex_phase(kernel).is_some() {
        return Some(AttnBackend::Flex);
    }
    if let Some((backend, _)) = serving_kernel(kernel) {
        return Some(backend);
    }
    let k = kernel.to_ascii_lowercase();
    if k.contains("flash::") || k.contains("flash_fwd") || k.contains("flash_bwd") {
        // The flash-attn package's FlashAttention-2 and -3 kernels are not PyTorch's copy: name their backend so
        // a flash-attn op over them is not reported as contradicting its kernels.
        use super::implementation::{classify, ImplKind};
        if classify(kernel).is_some_and(|c| matches!(c.kind, ImplKind::Fa2FlashAttn | ImplKind::Fa3)) {
            return Some(AttnBackend::FlashAttn);
        }
    }
    if k.contains("cudnn") && (k.contains("sdpa") || k.contains("fmha") || k.contains("flash") || k.contains("attn")) {
        Some(AttnBackend::Cudnn)
    } else if k.contains("flash_fwd") || k.contains("flash_bwd") || k.contains("flash::") || k.contains("flashattn") {
        Some(AttnBackend::Flash)
    } else if k.contains("fmha_cutlass") || k.contains("attentionkernel") || k.contains("attentionbackwardkernel") {
        Some(AttnBackend::Efficient)
    } else if k.contains("ck_fmha") || k.contains("ck_tile::fmha") || k.contains("aiter") && k.contains("fmha") {
        Some(AttnBackend::Ck)
    } else if k.contains("fmha") {
        Some(AttnBackend::Efficient)
    } else {
        None
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn kernels_name_their_backend() {
        let k = kernel_backend;
        assert_eq!(
            k("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0"),
            Some(AttnBackend::Cudnn)
        );
        assert_eq!(
            k("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>"),
            Some(AttnBackend::Flash)
        );
        assert_eq!(
            k("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<>)"),
            Some(AttnBackend::Efficient)
        );
        assert_eq!(k("nvjet_sm90_tst_128x64_64x8_1x2_h_bz_NNT"), None);
        assert_eq!(k("triton_tem_fused_flex_attention_backward_1"), Some(AttnBackend::Flex));
        assert_eq!(k("triton_poi_fused_add_mul_0"), None);
        assert_eq!(k("void (anonymous namespace)::softmax_warp_forward<c10::Half>"), None);
        assert_eq!(
            k("void vllm::paged_attention_v2_kernel<__nv_bfloat16, __nv_bfloat16, 128, 16, 128, (vllm::Fp8KVCacheDataType)0, false, 512>"),
            Some(AttnBackend::Vllm)
        );
        assert_eq!(k("void flashinfer::BatchDecodeWithPagedKVCacheKernel<>"), Some(AttnBackend::FlashInfer));
        assert_eq!(kernel_layout("flashinfer::BatchPrefillWithRaggedKVCacheKernel<>"), Some(BatchLayout::Varlen));
        assert_eq!(kernel_layout("void flash::flash_fwd_splitkv_kernel<>"), None);
        assert_eq!(
            k("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::half_t>, false>(flash::Flash_fwd_params)"),
            Some(AttnBackend::FlashAttn),
            "flash-attn's FlashAttention-2 is not PyTorch's copy"
        );
        assert_eq!(
            k("void cutlass::device_kernel<flash::enable_sm90<flash::FlashAttnFwdSm90<>>>()"),
            Some(AttnBackend::FlashAttn)
        );
        assert!(is_cache_write_kernel("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16>"));
        assert_eq!(k("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16>"), None, "writing is not attention");
    }

    #[test]
    fn wrappers_are_not_attention_roots() {
        assert!(signature("autograd::engine::evaluate_function: ScaledDotProductCudnnAttentionBackward0").is_none());
        assert_eq!(signature("ScaledDotProductCudnnAttentionBackward0").map(|s| s.backend), Some(AttnBackend::Cudnn));
        assert!(signature("aten::softmax").is_none());
        assert_eq!(signature("flash_attn::_flash_attn_backward").map(|s| s.phase), Some(Phase::Bwd));
        let flex = signature("triton_tem_fused_flex_attention_backward_1").unwrap();
        assert_eq!((flex.backend, flex.phase, flex.layout), (AttnBackend::Flex, Phase::Bwd, QkvLayout::Bhsd));
        assert_eq!(signature("triton_red_fused_flex_attention_backward_0").map(|s| s.layout), Some(QkvLayout::None));
        assert!(signature("triton_tem_fused_mm_0").is_none(), "other Inductor templates are not attention");
    }
}
