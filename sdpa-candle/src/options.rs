//! What one `sdpa` call computes: dims order of the tensors, scale, mask, variants (sliding window, softcap,
//! ALiBi) and kernel choice.

use candle_core::{bail, DType, Result, Tensor};
use sdpa_core::{Alibi, Descale, Diagonal, F32Math, Kernel, Layout, Variants, Window};

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

/// ALiBi slopes, one per query head (sdpa-core's [`Alibi`], plus a candle tensor holding them).
#[derive(Debug, Clone)]
pub enum SdpaAlibi {
    /// The ALiBi paper's slopes for `Hq` heads (BLOOM, MPT): [`sdpa_core::standard_alibi_slopes`].
    Standard,
    /// Given slopes, one per query head.
    Slopes(Vec<f32>),
    /// An f32 tensor of shape `[Hq]` (candle-flash-attn's `alibi_slopes`), on any device: its `Hq` values
    /// are read to the host once per call (a few bytes; a GPU tensor costs one small device-to-host copy).
    Tensor(Tensor),
}

impl SdpaAlibi {
    /// The slopes as sdpa-core holds them (their count is checked against `Hq` when the call is planned).
    pub(crate) fn resolve(&self) -> Result<Alibi> {
        match self {
            SdpaAlibi::Standard => Ok(Alibi::Standard),
            SdpaAlibi::Slopes(s) => Ok(Alibi::Slopes(s.clone())),
            SdpaAlibi::Tensor(t) => {
                if t.dtype() != DType::F32 || t.rank() != 1 {
                    bail!(
                        "sdpa: ALiBi slopes must be an f32 tensor of shape [Hq] (one per query head), got {:?} of \
                         shape {:?}",
                        t.dtype(),
                        t.dims()
                    );
                }
                Ok(Alibi::Slopes(t.to_vec1::<f32>()?))
            }
        }
    }
}

/// Options of one [`crate::sdpa`] call.
///
/// Defaults: BHSD dims order, scale `1/sqrt(D)`, no mask, no variant, the backend's `auto` kernel, the global
/// rayon pool, exact f32 arithmetic.
///
/// The variants follow sdpa-core's one definition (`sdpa_core::variants`): with `x = scale · q_i·k_j`,
///
/// ```text
/// s(i, j) = cap · tanh(x / cap) − slope_h · |j − diag(i)| + mask(i, j)
/// key j takes part in row i iff diag(i) − left ≤ j ≤ diag(i) + right   (when a window is set)
/// ```
///
/// `diag(i)` is `i` ([`Diagonal::TopLeft`]) or `i + Sk − Sq` ([`Diagonal::BottomRight`], FlashAttention's).
/// A causal mask names the diagonal; without one, a window or ALiBi needs [`SdpaOptions::diagonal`] (it is
/// never guessed). A window combines with any mask, including an explicit one.
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
    /// Sliding window: keys `diag(i) − left ..= diag(i) + right`, `None` on a side for unbounded.
    /// candle-transformers' Mistral and Gemma 2 hide key `j` from query `i` when `j + sliding_window < i`:
    /// that is `Window::left(sliding_window)` with a causal mask (`sliding_window + 1` keys per row).
    pub window: Option<Window>,
    /// Logit softcap `cap > 0` (Gemma 2: 50): the scaled score becomes `cap · tanh(score / cap)` before
    /// ALiBi, the mask and the softmax.
    pub softcap: Option<f64>,
    /// ALiBi biases `−slope_h · |j − diag(i)|` per query head `h`.
    pub alibi: Option<SdpaAlibi>,
    /// The diagonal windows and ALiBi measure from when the mask is not causal (with a causal mask it may be
    /// left `None`, or must agree with the mask's alignment).
    pub diagonal: Option<Diagonal>,
    /// The backward (when the inputs are `Var`s or depend on one) runs deterministically: gradients
    /// bitwise the same run to run, whatever the thread or atomic ordering (slower on CUDA, where dQ is
    /// otherwise accumulated with atomics). Off by default.
    pub deterministic_backward: bool,
    /// Per-tensor descale factors of FP8 inputs (candle's `DType::F8E4M3`): the value an element stands for
    /// is its stored E4M3 value times its tensor's factor. `None` means 1 for all three; other dtypes take
    /// none. FP8 runs on the CUDA backend's `fa3` (sm_90) and returns bf16; the CPU refuses it.
    pub descale: Option<Descale>,
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
            window: None,
            softcap: None,
            alibi: None,
            diagonal: None,
            deterministic_backward: false,
            descale: None,
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

    /// Sets a sliding window (name the diagonal with [`Self::with_diagonal`] unless the mask is causal).
    pub fn with_window(mut self, window: Window) -> Self {
        self.window = Some(window);
        self
    }

    /// Sets a logit softcap.
    pub fn with_softcap(mut self, cap: f64) -> Self {
        self.softcap = Some(cap);
        self
    }

    /// Sets ALiBi biases (name the diagonal unless the mask is causal).
    pub fn with_alibi(mut self, alibi: SdpaAlibi) -> Self {
        self.alibi = Some(alibi);
        self
    }

    /// Names the diagonal windows and ALiBi measure from.
    pub fn with_diagonal(mut self, diagonal: Diagonal) -> Self {
        self.diagonal = Some(diagonal);
        self
    }

    /// Sets the FP8 descale factors ([`Self::descale`]).
    pub fn with_descale(mut self, descale: Descale) -> Self {
        self.descale = Some(descale);
        self
    }

    /// Asks for a deterministic backward ([`Self::deterministic_backward`]).
    pub fn with_deterministic_backward(mut self, deterministic: bool) -> Self {
        self.deterministic_backward = deterministic;
        self
    }

    /// The backward's options (no f32 dQ copy: candle's gradient is dQ in the input's dtype).
    pub(crate) fn backward(&self) -> sdpa_core::backward::BackwardOptions {
        sdpa_core::backward::BackwardOptions { deterministic: self.deterministic_backward, dq_accum: false }
    }

    /// Kernel, threads and f32 math as sdpa-core's run options (no LSE: the candle calls return O only).
    pub(crate) fn run(&self) -> sdpa_core::RunOptions {
        sdpa_core::RunOptions { kernel: self.kernel, f32_math: self.f32_math, threads: self.threads, lse: false }
    }

    /// The variants as sdpa-core's spec carries them (ALiBi slopes in a tensor read to the host).
    pub(crate) fn variants(&self) -> Result<Variants> {
        Ok(Variants {
            window: self.window,
            softcap: self.softcap,
            alibi: self.alibi.as_ref().map(SdpaAlibi::resolve).transpose()?,
            diagonal: self.diagonal,
        })
    }
}
