//! Attention detection on an [`OpTree`]: fused calls ([`fused`], FlexAttention's Triton kernels refined by
//! [`flex`]) and eager matmul-softmax-matmul chains ([`unfused`]), each as an [`AttentionCall`] with what the
//! trace says about its shape, dtype, mask, variants (window, softcap, ALiBi: [`VariantsSeen`]), batch layout
//! (dense, varlen or paged: [`ragged`]) and kernels. [`cache_write`] finds the paged cache's write step;
//! [`implementation`] names whose code ran from the kernel names.

pub mod cache_write;
pub mod flex;
pub mod fused;
pub mod implementation;
pub mod positions;
pub mod ragged;
pub mod signature;
mod steps;
pub mod unfused;

pub use ragged::{BatchLayout, Ragged, WorkBound};
pub use signature::{AttnBackend, Phase};

use crate::trace::tree::OpTree;
use sdpa_core::{Diagonal, Shape, Variants};
use serde::Serialize;

/// Fused (one attention operator) or unfused (separate ops).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// One attention operator (SDPA, flash-attn, ...).
    Fused,
    /// Matmul, softmax, matmul as separate ops.
    Unfused,
}

impl Kind {
    /// `fused` or `unfused`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Fused => "fused",
            Kind::Unfused => "unfused",
        }
    }
}

/// The mask an attention call applied, as far as the trace tells.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum MaskInfo {
    /// No mask.
    None,
    /// Causal, query i sees keys j <= i (PyTorch `is_causal`).
    CausalTopLeft,
    /// Causal, query i sees keys j <= i + Sk - Sq (flash-attn, KV caches).
    CausalBottomRight,
    /// An explicit mask tensor of these dims was applied (its values are not in the trace).
    Explicit {
        /// `additive` (added to scores) or `boolean` (masked_fill / where).
        values: String,
        /// Its dims as recorded.
        dims: Vec<i64>,
    },
    /// A FlexAttention `BlockMask` of these dims (`[B, H, Q blocks, KV blocks]` of its `kv_indices`): which
    /// blocks it keeps is not in the trace, only how finely it tiles the scores.
    BlockMask {
        /// Dims of `kv_indices` as recorded.
        dims: Vec<i64>,
    },
    /// The trace does not say (no `Concrete Inputs`).
    Unknown,
}

impl MaskInfo {
    /// Some(true) for causal masks, Some(false) for none, None when unknown (including explicit masks,
    /// whose values the trace does not record: a causal model's additive mask looks like any other).
    pub fn causal(&self) -> Option<bool> {
        match self {
            MaskInfo::CausalTopLeft | MaskInfo::CausalBottomRight => Some(true),
            MaskInfo::None => Some(false),
            MaskInfo::Explicit { .. } | MaskInfo::BlockMask { .. } | MaskInfo::Unknown => None,
        }
    }

    /// Short label: `none`, `causal`, `causal-br`, `explicit-additive[2,1,1024,1024]`, `block-mask[1,1,16,16]`,
    /// `unknown`.
    pub fn label(&self) -> String {
        match self {
            MaskInfo::None => "none".into(),
            MaskInfo::CausalTopLeft => "causal".into(),
            MaskInfo::CausalBottomRight => "causal-br".into(),
            MaskInfo::Explicit { values, dims } => {
                let d: Vec<String> = dims.iter().map(|x| x.to_string()).collect();
                format!("explicit-{values}[{}]", d.join(","))
            }
            MaskInfo::BlockMask { dims } => {
                let d: Vec<String> = dims.iter().map(|x| x.to_string()).collect();
                format!("block-mask[{}]", d.join(","))
            }
            MaskInfo::Unknown => "unknown".into(),
        }
    }

    /// The core mask used for costing (explicit masks cost every pair, as kernels compute them all; a block
    /// mask whose contents the trace does not show is costed as no mask, an upper bound the call notes).
    pub fn to_core(&self) -> sdpa_core::Mask {
        match self {
            MaskInfo::CausalTopLeft => sdpa_core::Mask::CausalTopLeft,
            MaskInfo::CausalBottomRight => sdpa_core::Mask::CausalBottomRight,
            _ => sdpa_core::Mask::None,
        }
    }
}

/// The variants (sliding window, softcap, ALiBi) a call used, as far as the trace shows them.
///
/// `variants` holds what the trace pins down, in sdpa-core's form (a window always with its diagonal); the
/// two flags say a variant was applied whose value the trace does not record (an eager softcap divides by a
/// Python float, which PyTorch records as a bare `double`; flash-attn's ALiBi slopes are a tensor).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct VariantsSeen {
    /// What the trace shows, as sdpa-core's [`Variants`].
    #[serde(skip_serializing_if = "Variants::is_plain")]
    pub variants: Variants,
    /// A softcap (`cap · tanh(x / cap)`) was applied, its cap not recorded.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub softcap_unrecorded: bool,
    /// ALiBi slopes were passed, their values not recorded.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub alibi_unrecorded: bool,
}

/// The cap a replay uses when the trace shows a softcap but not its value: Gemma 2's attention cap. Costs do
/// not depend on it (the same work for any cap).
pub const REPLAY_SOFTCAP: f64 = 50.0;

impl VariantsSeen {
    /// True when no variant was seen.
    pub fn is_plain(&self) -> bool {
        self.variants.is_plain() && !self.softcap_unrecorded && !self.alibi_unrecorded
    }

    /// `window 256,0 tl · softcap 50`, `softcap ?`, `alibi ?` (unrecorded values as `?`), or empty.
    pub fn label(&self) -> String {
        let mut v = self.variants.clone();
        // The diagonal is printed with the window; ALiBi alone names it too.
        let diag = v.diagonal.take();
        let mut parts = Vec::new();
        let known = v.label(diag);
        if !known.is_empty() {
            parts.push(known);
        }
        if self.softcap_unrecorded && v.softcap.is_none() {
            parts.push("softcap ?".into());
        }
        if self.alibi_unrecorded && v.alibi.is_none() {
            parts.push("alibi ?".into());
        }
        parts.join(" · ")
    }

    /// The variants to replay: what was seen, with an unrecorded cap as [`REPLAY_SOFTCAP`] and unrecorded ALiBi
    /// slopes as the standard ones (the same work); `None` for plain attention.
    pub fn replay(&self) -> Option<Variants> {
        if self.is_plain() {
            return None;
        }
        let mut v = self.variants.clone();
        if self.softcap_unrecorded && v.softcap.is_none() {
            v.softcap = Some(REPLAY_SOFTCAP);
        }
        if self.alibi_unrecorded && v.alibi.is_none() {
            v.alibi = Some(sdpa_core::Alibi::Standard);
        }
        Some(v)
    }

    /// A causal window of `left` keys back on `diagonal` (what Mistral and Gemma 2 run).
    pub fn causal_window(left: usize, diagonal: Diagonal) -> Self {
        let variants =
            Variants { window: Some(sdpa_core::Window::left(left)), diagonal: Some(diagonal), ..Variants::default() };
        VariantsSeen { variants, ..VariantsSeen::default() }
    }
}

/// One part of an unfused chain with its GPU time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Part {
    /// Role: `qk`, `scale`, `mask`, `softmax`, `cast`, `dropout`, `pv`, `other`.
    pub role: &'static str,
    /// Operator name (`aten::bmm`), or a description for `other`.
    pub op: String,
    /// GPU time of its kernels, µs.
    pub gpu_us: f64,
}

/// One attention computation found in the trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttentionCall {
    /// Fused or unfused.
    pub kind: Kind,
    /// Forward or backward.
    pub phase: Phase,
    /// Implementation that ran it.
    pub backend: AttnBackend,
    /// Outermost attention operator (fused) or the QK matmul (unfused).
    pub op: String,
    /// `nn.Module` path, outermost first (empty when the trace has no module frames).
    pub module: Vec<String>,
    /// Logical shape, when the trace recorded shapes; for a varlen or paged batch the envelope (B sequences,
    /// Sq and Sk their longest lengths), with [`AttentionCall::ragged`] telling the rest.
    pub shape: Option<Shape>,
    /// Dense, varlen or paged.
    pub layout: BatchLayout,
    /// For a varlen or paged batch, what the trace recorded of its sequences (costs come from it, exact or
    /// bounded).
    pub ragged: Option<Ragged>,
    /// PyTorch dtype string of Q, e.g. `c10::BFloat16`.
    pub dtype: Option<String>,
    /// Mask.
    pub mask: MaskInfo,
    /// Window, softcap and ALiBi, as far as the trace shows them.
    pub variants: VariantsSeen,
    /// Softmax scale when recorded.
    pub scale: Option<f64>,
    /// Dropout probability when recorded.
    pub dropout: Option<f64>,
    /// True when Q's strides are those of a `[B, S, H, D]` tensor viewed as `[B, H, S, D]`.
    pub q_bshd_strides: bool,
    /// GPU time of every kernel, copy and set the call launched, µs.
    pub gpu_us: f64,
    /// Kernels launched: (name, µs).
    pub kernels: Vec<(String, f64)>,
    /// Grid (blocks) of the main kernel, when recorded.
    pub grid_blocks: Option<i64>,
    /// For unfused calls: the ops that make it up.
    pub parts: Vec<Part>,
    /// Anything the reader should know (assumptions, what was inferred).
    pub notes: Vec<String>,
    /// Why the shape found in the trace was left out as implausible (above [`crate::trace::plausible`]'s
    /// bounds), if it was: then `shape` is `None`.
    pub suspect: Option<String>,
    /// How many identical calls this one stands for: 1 for a call found in a trace, a TraceLens row's
    /// `operation_count` (its times are per call). Keeps a row of ten million calls one record.
    #[serde(skip)]
    pub repeat: u64,
    /// Thread row index and start time, µs (ordering, backward-to-forward matching).
    #[serde(skip)]
    pub at: (u32, f64),
    /// Autograd sequence numbers of the call's forward ops (links an unfused chain to its backward).
    #[serde(skip)]
    pub seqs: Vec<i64>,
    /// K/V facts for judging decoding by bytes (the element type read, an FP8 store converted before the
    /// call) and the call's span on the GPU clock (launch gaps).
    #[serde(skip)]
    pub kv: crate::trace::decode::KvFacts,
}

/// Runs both detectors; calls come back in time order per thread.
pub fn detect(tree: &OpTree<'_>) -> Vec<AttentionCall> {
    let fused = fused::detect(tree);
    let mut calls = fused.calls;
    let eager = unfused::detect(tree, &fused.inside, &fused.claimed);
    let backward = unfused::backward_of(tree, &eager);
    calls.extend(eager);
    calls.extend(backward);
    calls.sort_by(|a, b| a.at.0.cmp(&b.at.0).then(a.at.1.total_cmp(&b.at.1)));
    calls
}

/// Parses PyTorch's dtype strings; `None` for dtypes the cost model has no name for (the caller then uses
/// [`elem_bytes`]).
pub fn core_dtype(t: &str) -> Option<sdpa_core::DType> {
    match t {
        "c10::BFloat16" | "BFloat16" | "bfloat16" => Some(sdpa_core::DType::BF16),
        "c10::Half" | "Half" | "float16" | "half" => Some(sdpa_core::DType::F16),
        "float" | "Float" | "float32" => Some(sdpa_core::DType::F32),
        _ => None,
    }
}

/// Element size in bytes of a PyTorch dtype string (fp8 = 1, double = 8), default 2.
pub fn elem_bytes(t: &str) -> f64 {
    if let Some(d) = core_dtype(t) {
        return d.size_bytes() as f64;
    }
    let l = t.to_ascii_lowercase();
    // `unsigned char`: how kineto names uint8, the dtype of vLLM's FP8 caches.
    if l.contains("float8") || l.contains("fp8") || l.contains("int8") || l.contains("uint8") || l.ends_with(" char") {
        1.0
    } else if l == "double" {
        8.0
    } else {
        2.0
    }
}

/// Short dtype label: `bf16`, `f16`, `f32`, or the PyTorch string.
pub fn dtype_label(t: &str) -> String {
    core_dtype(t).map(|d| d.name().to_string()).unwrap_or_else(|| t.trim_start_matches("c10::").to_string())
}
