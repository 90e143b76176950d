//! What one `sdpa` call computes: dims order of the tensors, scale, mask and kernel choice.

use candle_core::Tensor;
use sdpa_core::{F32Math, Kernel, Layout};

/// Which keys each query row sees.
///
/// Boolean masks come in two conventions and the variant names the one meant, so nothing is guessed:
/// PyTorch's `attn_mask` marks the keys that take part ([`SdpaMask::Keep`]); candle-transformers' models
/// build a mask whose ones are the keys to hide and call `masked_fill` ([`SdpaMask::Exclude`]).
///
/// An explicit mask tensor has rank 1 to 4 and broadcasts to `[B, Hq, Sq, Sk]` in the usual way (missing
/// leading dims and dims of size 1 broadcast); its dims are always in `[B, H, Sq, Sk]` order, whatever the
/// dims order of Q, K and V. It must live on the same device as Q.
#[derive(Debug, Clone, Default)]
pub enum SdpaMask {
    /// Every query sees every key.
    #[default]
    None,
    /// Causal, aligned top-left (PyTorch `is_causal=True`): query `i` sees keys `j <= i`.
    CausalTopLeft,
    /// Causal, aligned bottom-right (FlashAttention; decoding with a KV cache, where the `Sq` new queries
    /// are the last `Sq` positions): query `i` sees keys `j <= i + Sk - Sq`.
    CausalBottomRight,
    /// Boolean mask of an integer dtype (u8, u32, i16, i32, i64): non-zero = the key takes part.
    Keep(Tensor),
    /// Boolean mask of an integer dtype (u8, u32, i16, i32, i64): non-zero = the key is hidden.
    Exclude(Tensor),
    /// Float mask (f32, f16, bf16, f64) added to the scaled scores before softmax; `-inf` hides a key.
    Additive(Tensor),
}

impl SdpaMask {
    /// Short name, as in sdpa's result records.
    pub fn name(&self) -> &'static str {
        match self {
            SdpaMask::None => "none",
            SdpaMask::CausalTopLeft => "causal",
            SdpaMask::CausalBottomRight => "causal-br",
            SdpaMask::Keep(_) | SdpaMask::Exclude(_) => "bool",
            SdpaMask::Additive(_) => "additive",
        }
    }
}

/// Options of one [`crate::sdpa`] call.
///
/// Defaults: BHSD dims order, scale `1/sqrt(D)`, no mask, the backend's `auto` kernel, the global rayon
/// pool, exact f32 arithmetic.
#[derive(Debug, Clone)]
pub struct SdpaOptions {
    /// Order of the dims of Q, K, V and of the returned output: [`Layout::Bhsd`] means the tensors are
    /// `[B, H, S, D]` (what candle-transformers' models hold after `transpose(1, 2)`), [`Layout::Bshd`]
    /// means `[B, S, H, D]` (what a linear projection followed by `reshape` gives). The memory strides of
    /// each tensor may be anything with a contiguous last dim, so a transposed view needs no copy.
    pub layout: Layout,
    /// Multiplier of `Q·Kᵀ`; `None` means `1/sqrt(D)`.
    pub scale: Option<f64>,
    /// Which keys each query sees.
    pub mask: SdpaMask,
    /// Kernel to run (`auto` picks per shape).
    pub kernel: Kernel,
    /// CPU worker threads; `None` uses rayon's global pool (`RAYON_NUM_THREADS`).
    pub threads: Option<usize>,
    /// How f32 products are computed on the GPU (`exact` by default; the TF32 modes are opt-in).
    pub f32_math: F32Math,
}

impl Default for SdpaOptions {
    fn default() -> Self {
        SdpaOptions {
            layout: Layout::Bhsd,
            scale: None,
            mask: SdpaMask::None,
            kernel: Kernel::Auto,
            threads: None,
            f32_math: F32Math::Exact,
        }
    }
}

impl SdpaOptions {
    /// Options for `[B, H, S, D]` tensors.
    pub fn bhsd() -> Self {
        SdpaOptions { layout: Layout::Bhsd, ..Default::default() }
    }

    /// Options for `[B, S, H, D]` tensors.
    pub fn bshd() -> Self {
        SdpaOptions { layout: Layout::Bshd, ..Default::default() }
    }

    /// Sets the mask.
    pub fn with_mask(mut self, mask: SdpaMask) -> Self {
        self.mask = mask;
        self
    }

    /// Sets an explicit scale.
    pub fn with_scale(mut self, scale: f64) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Picks the kernel.
    pub fn with_kernel(mut self, kernel: Kernel) -> Self {
        self.kernel = kernel;
        self
    }

    /// Sets the CPU thread count.
    pub fn with_threads(mut self, threads: usize) -> Self {
        self.threads = Some(threads);
        self
    }
}
