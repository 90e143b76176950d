//! candle-flash-attn's functions under the same names, argument order and meaning, on sdpa's kernels (the
//! CPU, and CUDA with the `cuda` feature): moving a model from candle-flash-attn is a change of crate in
//! its `use` line.
//!
//! How FlashAttention's conventions map onto sdpa's one definition (`sdpa_core::variants`):
//!
//! - Tensors are `[B, S, H, D]` (sdpa's [`Layout::Bshd`](crate::Layout::Bshd)) with a contiguous head dim;
//!   other strides are read in place. GQA/MQA when the kv heads divide the query heads. f32, f16 and bf16,
//!   any head dim up to the backend's limit (candle-flash-attn: f16/bf16, head dims a multiple of 8 up to
//!   256, CUDA only).
//! - `softmax_scale` multiplies `Q·Kᵀ` (the f32 is widened exactly).
//! - `causal = true` is FlashAttention's bottom-right causal mask: query `i` sees keys `j ≤ i + Sk − Sq`, the
//!   last query row the last key ([`SdpaMask::CausalBottomRight`]); with `Sq = Sk` it is PyTorch's top-left.
//! - `window_size_left` / `window_size_right`: query `i` sees keys `i + Sk − Sq − left ..= i + Sk − Sq +
//!   right`; `None` is an unbounded side (FlashAttention's `-1`). This is sdpa's [`Window`] on the
//!   bottom-right [`Diagonal`]. A right side of `Some(0)` is the causal mask: `(None, Some(0))` is
//!   `causal = true`, `(Some(w), Some(0))` is Mistral's local causal attention; both run as sdpa's
//!   bottom-right causal mask (plus `Window::left(w)`), so the kernels take their causal path.
//! - `alibi_slopes`: an f32 tensor `[Hq]`, read to the host once per call. The bias is FlashAttention's
//!   documented `−slope_h · |i + Sk − Sq − j|`, sdpa's ALiBi on the bottom-right diagonal, added to the
//!   scaled (and capped) score. (FlashAttention's causal kernels add `slope_h · j` instead, which differs by a
//!   constant per row: the same output.)
//! - `softcap`: the scaled score becomes `softcap · tanh(score / softcap)` before ALiBi and the masks;
//!   `0.0` means no cap, as in FlashAttention. A negative or non-finite cap is an error.
//! - A query row that sees no key (`Sq > Sk` under the causal mask, or a narrow window) is zeros, as in
//!   FlashAttention.
//!
//! One difference at the edges: for `Sq > Sk + 1` FlashAttention's launcher replaces a window side that is
//! `≥ Sk` by "unbounded" and an unbounded side opposite a bounded one by `Sk`, so the first rows (those whose
//! diagonal lies more than one key before key 0) can differ from its documented window; sdpa follows the
//! documented formula on every row.
//!
//! There is no backward pass (as in candle-flash-attn).
//!
//! The varlen and paged functions ([`flash_attn_varlen`] and its variants, [`flash_attn_varlen_paged_windowed`])
//! take the same arguments plus the ragged batch; their own notes are in `flash/varlen.rs` and on each function.

mod varlen;

pub use varlen::{
    flash_attn_varlen, flash_attn_varlen_alibi, flash_attn_varlen_alibi_windowed,
    flash_attn_varlen_alibi_windowed_softcap, flash_attn_varlen_paged_windowed, flash_attn_varlen_windowed,
};

use crate::options::{SdpaAlibi, SdpaMask, SdpaOptions};
use crate::sdpa;
use candle_core::{bail, Result, Tensor};
use sdpa_core::{Diagonal, Window};

/// FlashAttention's arguments as the options of one `sdpa` call on `[B, S, H, D]` tensors.
fn fa_options(
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    alibi_slopes: Option<&Tensor>,
    softcap: f32,
) -> Result<SdpaOptions> {
    // FlashAttention measures everything from the bottom-right diagonal; naming it also lets ALiBi and
    // windows without a causal mask validate (with the causal mask it agrees).
    let mut opts = SdpaOptions::bshd().with_scale(softmax_scale as f64).with_diagonal(Diagonal::BottomRight);
    match (window_size_left, window_size_right) {
        (None, None) => {}
        (left, Some(0)) => {
            opts.mask = SdpaMask::CausalBottomRight;
            opts.window = left.map(Window::left);
        }
        (left, right) => opts.window = Some(Window { left, right }),
    }
    if let Some(slopes) = alibi_slopes {
        opts.alibi = Some(SdpaAlibi::Tensor(slopes.clone()));
    }
    if !(softcap >= 0.0 && softcap.is_finite()) {
        bail!("sdpa: softcap {softcap} must be finite and >= 0 (0 means no cap, as in FlashAttention)");
    }
    if softcap > 0.0 {
        opts.softcap = Some(softcap as f64);
    }
    Ok(opts)
}

/// `softmax(Q·Kᵀ·softmax_scale)·V`, optionally causal (bottom-right, FlashAttention's alignment), as
/// candle-flash-attn's `flash_attn`.
///
/// * `q` - `[batch, seq_len_q, num_heads_q, head_size]`.
/// * `k` - `[batch, seq_len_kv, num_heads_kv, head_size]`; `num_heads_kv` divides `num_heads_q`.
/// * `v` - `[batch, seq_len_kv, num_heads_kv, head_size_v]`.
///
/// Returns `[batch, seq_len_q, num_heads_q, head_size_v]`, contiguous. See the module docs for the mapping.
pub fn flash_attn(q: &Tensor, k: &Tensor, v: &Tensor, softmax_scale: f32, causal: bool) -> Result<Tensor> {
    let right = if causal { Some(0) } else { None };
    sdpa(q, k, v, &fa_options(softmax_scale, None, right, None, 0.0)?)
}

/// Sliding-window attention, as candle-flash-attn's `flash_attn_windowed`: query `i` sees keys
/// `i + Sk − Sq − window_size_left ..= i + Sk − Sq + window_size_right` (`None`: unbounded on that side);
/// `(None, Some(0))` is the causal mask. Shapes as [`flash_attn`].
pub fn flash_attn_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    sdpa(q, k, v, &fa_options(softmax_scale, window_size_left, window_size_right, None, 0.0)?)
}

/// Attention with ALiBi biases `−alibi_slopes[h] · |i + Sk − Sq − j|`, as candle-flash-attn's
/// `flash_attn_alibi`; `alibi_slopes` is an f32 tensor `[num_heads_q]`. Shapes as [`flash_attn`].
pub fn flash_attn_alibi(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    softmax_scale: f32,
    causal: bool,
) -> Result<Tensor> {
    let right = if causal { Some(0) } else { None };
    sdpa(q, k, v, &fa_options(softmax_scale, None, right, Some(alibi_slopes), 0.0)?)
}

/// ALiBi and a sliding window together, as candle-flash-attn's `flash_attn_alibi_windowed` (see
/// [`flash_attn_windowed`] and [`flash_attn_alibi`]).
pub fn flash_attn_alibi_windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: &Tensor,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
) -> Result<Tensor> {
    sdpa(q, k, v, &fa_options(softmax_scale, window_size_left, window_size_right, Some(alibi_slopes), 0.0)?)
}

/// Optional ALiBi, a sliding window and a Gemma-style logit softcap (`softcap · tanh(score / softcap)` on
/// the scaled score, before ALiBi and the masks; `0.0`: no cap), as candle-flash-attn's
/// `flash_attn_alibi_windowed_softcap`. Gemma 2's sliding layers are `(Some(4096), Some(0))` with
/// softcap 50, its global layers `(None, Some(0))`.
pub fn flash_attn_alibi_windowed_softcap(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    alibi_slopes: Option<&Tensor>,
    softmax_scale: f32,
    window_size_left: Option<usize>,
    window_size_right: Option<usize>,
    softcap: f32,
) -> Result<Tensor> {
    sdpa(q, k, v, &fa_options(softmax_scale, window_size_left, window_size_right, alibi_slopes, softcap)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sdpa_core::{AttentionSpec, DType, Mask, Shape};

    /// The spec a call with these options describes (no tensors needed).
    fn spec_of(opts: &SdpaOptions, sq: usize, sk: usize, hq: usize) -> AttentionSpec {
        let mask = match opts.mask {
            SdpaMask::None => Mask::None,
            SdpaMask::CausalBottomRight => Mask::CausalBottomRight,
            ref other => panic!("FlashAttention's options never give {other:?}"),
        };
        AttentionSpec::new(Shape { b: 1, hq, hkv: 1, sq, sk, d: 8, dv: 8 }, DType::F16)
            .with_mask(mask)
            .with_variants(opts.variants().expect("variants"))
    }

    /// FlashAttention's documented window: keys `[i + Sk − Sq − left, i + Sk − Sq + right]`, clamped.
    fn fa_keys(i: usize, sq: usize, sk: usize, left: Option<usize>, right: Option<usize>) -> Vec<usize> {
        let diag = i as i64 + sk as i64 - sq as i64;
        (0..sk)
            .filter(|&j| {
                let j = j as i64;
                left.is_none_or(|l| j >= diag - l as i64) && right.is_none_or(|r| j <= diag + r as i64)
            })
            .collect()
    }

    #[test]
    fn windows_are_flash_attentions_documented_keys_on_every_row() {
        let sides = [None, Some(0), Some(1), Some(3), Some(7), Some(40)];
        for (sq, sk) in [(1, 9), (5, 5), (9, 4), (6, 13), (13, 6), (1, 1)] {
            for left in sides {
                for right in sides {
                    let opts = fa_options(0.5, left, right, None, 0.0).expect("options");
                    let spec = spec_of(&opts, sq, sk, 2);
                    spec.validate().expect("valid");
                    for i in 0..sq {
                        let got: Vec<usize> = spec.key_range(i).collect();
                        assert_eq!(got, fa_keys(i, sq, sk, left, right), "Sq {sq} Sk {sk} window {left:?},{right:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_right_side_of_zero_runs_as_the_bottom_right_causal_mask() {
        let causal = fa_options(1.0, None, Some(0), None, 0.0).expect("options");
        assert!(matches!(causal.mask, SdpaMask::CausalBottomRight) && causal.window.is_none());
        let local = fa_options(1.0, Some(4096), Some(0), None, 0.0).expect("options");
        assert!(matches!(local.mask, SdpaMask::CausalBottomRight));
        assert_eq!(local.window, Some(Window::left(4096)));
        let two_sided = fa_options(1.0, Some(2), Some(3), None, 0.0).expect("options");
        assert!(matches!(two_sided.mask, SdpaMask::None));
        assert_eq!(two_sided.window, Some(Window { left: Some(2), right: Some(3) }));
        assert_eq!(two_sided.diagonal, Some(Diagonal::BottomRight));
        let plain = fa_options(1.0, None, None, None, 0.0).expect("options");
        assert!(matches!(plain.mask, SdpaMask::None) && plain.window.is_none());
    }

    #[test]
    fn softcap_zero_is_off_and_bad_caps_are_refused() {
        assert_eq!(fa_options(1.0, None, None, None, 0.0).expect("options").softcap, None);
        assert_eq!(fa_options(1.0, None, None, None, 50.0).expect("options").softcap, Some(50.0));
        for bad in [-1.0, f32::NAN, f32::INFINITY] {
            let err = fa_options(1.0, None, None, None, bad).expect_err("bad cap").to_string();
            assert!(err.contains("softcap"), "{err}");
        }
    }

    #[test]
    fn alibi_slopes_come_from_an_f32_tensor_of_hq_values() {
        let dev = candle_core::Device::Cpu;
        let slopes = Tensor::new(&[0.5f32, 0.25, 0.125, 0.0625], &dev).expect("tensor");
        let opts = fa_options(1.0, None, Some(0), Some(&slopes), 0.0).expect("options");
        let spec = spec_of(&opts, 3, 5, 4);
        spec.validate().expect("valid");
        assert_eq!(spec.alibi_slopes().expect("slopes"), Some(vec![0.5, 0.25, 0.125, 0.0625]));
        // The count is checked against Hq when the call is planned.
        assert!(spec_of(&opts, 3, 5, 8).validate().unwrap_err().to_string().contains("4 ALiBi slopes"));
        let f16 = slopes.to_dtype(candle_core::DType::F16).expect("f16");
        let err = fa_options(1.0, None, None, Some(&f16), 0.0).expect("options").variants().unwrap_err().to_string();
        assert!(err.contains("f32 tensor of shape [Hq]"), "{err}");
        let rank2 = slopes.reshape((1, 4)).expect("reshape");
        let err = fa_options(1.0, None, None, Some(&rank2), 0.0).expect("options").variants().unwrap_err();
        assert!(err.to_string().contains("[1, 4]"), "{err}");
    }
}
