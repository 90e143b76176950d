//! The CPU half of sdpa-candle against the f64 reference and against candle's own attention
//! (matmul + softmax_last_dim + matmul), on every mask kind, GQA, both dims orders, three kinds of
//! candle views (contiguous, transposed, narrowed with a start offset) and each dtype; then the variants
//! (sliding windows, softcap, ALiBi) through `SdpaOptions` and through the candle-flash-attn-named functions.

// Helpers of a test panic on failure: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use candle_core::{DType as CDType, Device, IndexOp, Tensor};
use common::{to_host, to_tensor};
use sdpa_candle::{
    flash_attn, flash_attn_alibi, flash_attn_alibi_windowed, flash_attn_alibi_windowed_softcap, flash_attn_windowed,
    sdpa, Diagonal, Layout, SdpaAlibi, SdpaMask, SdpaOptions, Window,
};
use sdpa_core::check::{check_output, tolerance};
use sdpa_core::reference_attention;
use sdpa_core::{
    Alibi, AttentionSpec, DType, ExplicitMask, F32Math, HostBuffer, HostInputs, HostOutput, Mask, MaskValues, Shape,
    Variants,
};

/// How the candle tensors handed to `sdpa` sit in memory.
#[derive(Debug, Clone, Copy, PartialEq)]
enum View {
    /// Contiguous in the dims order given to `sdpa`.
    Contiguous,
    /// Stored in the other order and transposed (candle models' `transpose(1, 2)` before attention).
    Transposed,
    /// Cut out of a larger tensor along the heads dim (a fused QKV projection): start offset and gaps.
    Narrowed,
}

/// The mask of a case; explicit masks give their dims over `[B, Hq, Sq, Sk]` and the rank handed to candle.
#[derive(Debug, Clone, Copy, PartialEq)]
enum MaskCase {
    None,
    CausalTopLeft,
    CausalBottomRight,
    Keep([usize; 4], usize),
    Exclude([usize; 4], usize),
    Additive([usize; 4], usize),
}

#[derive(Debug, Clone, Copy)]
struct Case {
    shape: Shape,
    dtype: DType,
    mask: MaskCase,
    layout: Layout,
    view: View,
}

fn candle_dtype(dtype: DType) -> CDType {
    match dtype {
        DType::F32 => CDType::F32,
        DType::F16 => CDType::F16,
        DType::BF16 => CDType::BF16,
        DType::F8E4M3 => CDType::F8E4M3,
    }
}

/// Dims of an operand with `heads` heads and `seq` positions in the case's order.
fn dims(layout: Layout, b: usize, heads: usize, seq: usize, d: usize) -> [usize; 4] {
    match layout {
        Layout::Bhsd => [b, heads, seq, d],
        Layout::Bshd => [b, seq, heads, d],
    }
}

/// Presents contiguous values `t` (in the case's order) as the case's kind of view, same values.
fn present(t: &Tensor, layout: Layout, view: View, seed: u64) -> Tensor {
    match view {
        View::Contiguous => t.clone(),
        View::Transposed => {
            let stored = t.transpose(1, 2).unwrap().contiguous().unwrap();
            let v = stored.transpose(1, 2).unwrap();
            assert!(!v.is_contiguous() || t.dim(1).unwrap() == 1 || t.dim(2).unwrap() == 1);
            v
        }
        View::Narrowed => {
            let heads_dim = match layout {
                Layout::Bhsd => 1,
                Layout::Bshd => 2,
            };
            let mut pad_dims = t.dims().to_vec();
            pad_dims[heads_dim] = 3;
            let pad = Tensor::randn(0f32, 1.0, pad_dims, &Device::Cpu).unwrap().to_dtype(t.dtype()).unwrap();
            let _ = seed;
            let fused = Tensor::cat(&[&pad, t, &pad], heads_dim).unwrap();
            let v = fused.narrow(heads_dim, 3, t.dim(heads_dim).unwrap()).unwrap();
            assert!(v.layout().start_offset() > 0);
            v
        }
    }
}

/// Candle's own attention, the way candle-transformers' models write it (Gemma 2's softcap included): BHSD,
/// K/V heads repeated for GQA, `q·kᵀ·scale`, `cap · tanh(· / cap)`, `+ mask`, `softmax_last_dim`, `·v`, in
/// the tensors' dtype.
fn candle_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    layout: Layout,
    scale: Option<f64>,
    softcap: Option<f64>,
    additive: Option<&Tensor>,
) -> Tensor {
    let bhsd = |t: &Tensor| match layout {
        Layout::Bhsd => t.contiguous().unwrap(),
        Layout::Bshd => t.transpose(1, 2).unwrap().contiguous().unwrap(),
    };
    let (q, k, v) = (bhsd(q), bhsd(k), bhsd(v));
    let (b, hq, _, d) = q.dims4().unwrap();
    let (_, hkv, sk, dv) = v.dims4().unwrap();
    let repeat = |t: &Tensor, dd: usize| {
        let g = hq / hkv;
        t.unsqueeze(2).unwrap().expand((b, hkv, g, sk, dd)).unwrap().reshape((b, hq, sk, dd)).unwrap()
    };
    let (k, v) = (repeat(&k, d), repeat(&v, dv));
    let scale = scale.unwrap_or(1.0 / (d as f64).sqrt());
    let mut att = (q.matmul(&k.t().unwrap()).unwrap() * scale).unwrap();
    if let Some(cap) = softcap {
        att = ((att / cap).unwrap().tanh().unwrap() * cap).unwrap();
    }
    if let Some(m) = additive {
        att = att.broadcast_add(&m.to_dtype(att.dtype()).unwrap()).unwrap();
    }
    let att = candle_nn::ops::softmax_last_dim(&att).unwrap();
    let o = att.matmul(&v).unwrap();
    match layout {
        Layout::Bhsd => o,
        Layout::Bshd => o.transpose(1, 2).unwrap().contiguous().unwrap(),
    }
}

/// Relative L2 distance over the elements where `b` is finite.
fn rel_dist(a: &HostBuffer, b: &HostBuffer) -> f64 {
    let (mut d2, mut r2) = (0.0, 0.0);
    for i in 0..a.len() {
        let (x, y) = (a.get_f64(i), b.get_f64(i));
        if y.is_finite() {
            d2 += (x - y) * (x - y);
            r2 += y * y;
        }
    }
    (d2 / r2.max(f64::MIN_POSITIVE)).sqrt()
}

/// Runs one case through `sdpa` and checks it against the reference and against candle's own attention.
fn check(case: Case, seed: u64) {
    let Case { shape: s, dtype, mask, layout, view } = case;
    let explicit = |values, dims| Mask::Explicit(ExplicitMask { values, dims });
    let spec_mask = match mask {
        MaskCase::None => Mask::None,
        MaskCase::CausalTopLeft => Mask::CausalTopLeft,
        MaskCase::CausalBottomRight => Mask::CausalBottomRight,
        MaskCase::Keep(d, _) | MaskCase::Exclude(d, _) => explicit(MaskValues::Boolean, d),
        MaskCase::Additive(d, _) => explicit(MaskValues::Additive, d),
    };
    let spec = AttentionSpec::new(s, dtype).with_layout(layout).with_mask(spec_mask);
    let mut inputs = HostInputs::random(&spec, seed).unwrap();

    let q = present(&to_tensor(&inputs.q, &dims(layout, s.b, s.hq, s.sq, s.d), &Device::Cpu), layout, view, seed);
    let k = present(&to_tensor(&inputs.k, &dims(layout, s.b, s.hkv, s.sk, s.d), &Device::Cpu), layout, view, seed + 1);
    let v = present(&to_tensor(&inputs.v, &dims(layout, s.b, s.hkv, s.sk, s.dv), &Device::Cpu), layout, view, seed + 2);

    // The mask tensor as a candle model would hold it, and the additive values the reference reads.
    let mask_tensor = |d: [usize; 4], rank: usize, t: Tensor| {
        assert!(d[..4 - rank].iter().all(|&x| x == 1), "rank {rank} cannot hold dims {d:?}");
        t.reshape(&d[4 - rank..]).unwrap()
    };
    let (sdpa_mask, additive_for_candle) = match mask {
        MaskCase::None => (SdpaMask::None, None),
        MaskCase::CausalTopLeft | MaskCase::CausalBottomRight => {
            let tl = mask == MaskCase::CausalTopLeft;
            let add: Vec<f32> = (0..s.sq * s.sk)
                .map(|x| {
                    let (i, j) = (x / s.sk, x % s.sk);
                    let lim = if tl { i + 1 } else { (i + 1 + s.sk).saturating_sub(s.sq) };
                    if j < lim {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect();
            let m = Tensor::from_vec(add, (s.sq, s.sk), &Device::Cpu).unwrap();
            (if tl { SdpaMask::CausalTopLeft } else { SdpaMask::CausalBottomRight }, Some(m))
        }
        MaskCase::Keep(d, rank) | MaskCase::Exclude(d, rank) => {
            let add = inputs.mask.clone().unwrap();
            let keep = matches!(mask, MaskCase::Keep(..));
            let bits: Vec<u8> = add.iter().map(|&x| u8::from((x == 0.0) == keep)).collect();
            let t = mask_tensor(d, rank, Tensor::from_vec(bits, d.to_vec(), &Device::Cpu).unwrap());
            let additive = Tensor::from_vec(add, d.to_vec(), &Device::Cpu).unwrap();
            (if keep { SdpaMask::Keep(t) } else { SdpaMask::Exclude(t) }, Some(additive))
        }
        MaskCase::Additive(d, rank) => {
            // In the model's dtype, as candle models keep it; the reference reads the rounded values.
            let raw = Tensor::from_vec(inputs.mask.clone().unwrap(), d.to_vec(), &Device::Cpu).unwrap();
            let t = raw.to_dtype(candle_dtype(dtype)).unwrap();
            inputs.mask = Some(t.to_dtype(CDType::F32).unwrap().flatten_all().unwrap().to_vec1().unwrap());
            let additive = t.to_dtype(CDType::F32).unwrap();
            (SdpaMask::Additive(mask_tensor(d, rank, t)), Some(additive))
        }
    };
    let opts = SdpaOptions { layout, mask: sdpa_mask, ..Default::default() };

    let o = sdpa(&q, &k, &v, &opts).unwrap_or_else(|e| panic!("{case:?}: {e}"));
    let theirs = candle_attention(&q, &k, &v, layout, None, None, additive_for_candle.as_ref());
    compare(&format!("{case:?}"), &spec, &inputs, &o, &theirs);
}

/// Checks `o` (from sdpa) against the f64 reference of `spec`, and against `theirs` (candle's own attention
/// on the same tensors): within twice the larger of the dtype's tolerance and candle's own error. Rows
/// candle cannot compute (all keys masked: NaN from its softmax, zeros from sdpa) are left out of that
/// distance; the reference check covers them.
fn compare(label: &str, spec: &AttentionSpec, inputs: &HostInputs, o: &Tensor, theirs: &Tensor) {
    let (s, dtype) = (spec.shape, spec.dtype);
    let layout = spec.layout().unwrap();
    assert_eq!(o.dims(), &dims(layout, s.b, s.hq, s.sq, s.dv), "{label}");
    assert_eq!(o.dtype(), candle_dtype(dtype), "{label}");
    assert!(o.is_contiguous(), "{label}");
    let got = HostOutput { o: to_host(o, dtype), lse: None };
    let report = check_output(spec, inputs, &got, F32Math::Exact, None).unwrap();
    assert!(report.pass, "{label} against the reference: {report:?}");

    let theirs = to_host(theirs, dtype);
    let own_err =
        check_output(spec, inputs, &HostOutput { o: theirs.clone(), lse: None }, F32Math::Exact, None).unwrap().rel_err;
    let dist = rel_dist(&got.o, &theirs);
    let tol = tolerance(dtype, F32Math::Exact);
    assert!(
        dist <= 2.0 * tol.max(own_err),
        "{label}: sdpa and candle's attention differ by {dist:.3e} (tolerance {tol:.1e}, candle's own error \
         {own_err:.3e}, sdpa's {:.3e})",
        report.rel_err
    );
}

fn all_masks(s: Shape) -> Vec<MaskCase> {
    vec![
        MaskCase::None,
        MaskCase::CausalTopLeft,
        MaskCase::CausalBottomRight,
        MaskCase::Keep([s.b, s.hq, s.sq, s.sk], 4),
        MaskCase::Exclude([1, 1, s.sq, s.sk], 2),
        MaskCase::Additive([s.b, 1, s.sq, s.sk], 4),
        MaskCase::Additive([1, 1, 1, s.sk], 1),
    ]
}

#[test]
fn every_mask_layout_view_and_dtype_matches_the_reference_and_candle() {
    // GQA (4 query heads per kv head), Sq != Sk, lengths that are no multiple of any tile, odd head dims.
    let s = Shape { b: 2, hq: 8, hkv: 2, sq: 37, sk: 53, d: 24, dv: 24 };
    let mut n = 0;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for layout in [Layout::Bhsd, Layout::Bshd] {
            for view in [View::Contiguous, View::Transposed, View::Narrowed] {
                for mask in all_masks(s) {
                    check(Case { shape: s, dtype, mask, layout, view }, n);
                    n += 1;
                }
            }
        }
    }
}

#[test]
fn awkward_shapes_match_the_reference() {
    let shapes = [
        // More queries than keys, bottom-right causal leaves the first rows with no key (zeros).
        Shape { b: 1, hq: 4, hkv: 4, sq: 29, sk: 11, d: 17, dv: 9 },
        // Decoding one token against a cache, MQA.
        Shape { b: 3, hq: 8, hkv: 1, sq: 1, sk: 130, d: 64, dv: 64 },
        // Head dim 128, Dv != D, B·H = 1.
        Shape { b: 1, hq: 1, hkv: 1, sq: 70, sk: 70, d: 128, dv: 80 },
        // D = 1.
        Shape { b: 1, hq: 2, hkv: 1, sq: 5, sk: 9, d: 1, dv: 3 },
    ];
    let mut n = 1000;
    for s in shapes {
        for dtype in [DType::F32, DType::BF16] {
            for mask in [MaskCase::None, MaskCase::CausalTopLeft, MaskCase::CausalBottomRight] {
                for (layout, view) in [(Layout::Bshd, View::Contiguous), (Layout::Bhsd, View::Transposed)] {
                    let case = Case { shape: s, dtype, mask, layout, view };
                    if mask == MaskCase::CausalBottomRight && s.sq > s.sk {
                        // candle's own attention yields NaN on the empty rows; the reference check covers them.
                        check_reference_only(case, n);
                    } else {
                        check(case, n);
                    }
                    n += 1;
                }
            }
        }
    }
}

/// Fully masked rows: sdpa gives zeros, never NaN.
fn check_reference_only(case: Case, seed: u64) {
    let s = case.shape;
    let spec = AttentionSpec::new(s, case.dtype).with_layout(case.layout).with_mask(Mask::CausalBottomRight);
    let inputs = HostInputs::random(&spec, seed).unwrap();
    let q = present(
        &to_tensor(&inputs.q, &dims(case.layout, s.b, s.hq, s.sq, s.d), &Device::Cpu),
        case.layout,
        case.view,
        seed,
    );
    let k = present(
        &to_tensor(&inputs.k, &dims(case.layout, s.b, s.hkv, s.sk, s.d), &Device::Cpu),
        case.layout,
        case.view,
        seed,
    );
    let v = present(
        &to_tensor(&inputs.v, &dims(case.layout, s.b, s.hkv, s.sk, s.dv), &Device::Cpu),
        case.layout,
        case.view,
        seed,
    );
    let opts = SdpaOptions { layout: case.layout, mask: SdpaMask::CausalBottomRight, ..Default::default() };
    let o = sdpa(&q, &k, &v, &opts).unwrap();
    let got = HostOutput { o: to_host(&o, case.dtype), lse: None };
    let report = check_output(&spec, &inputs, &got, F32Math::Exact, None).unwrap();
    assert!(report.pass, "{case:?}: {report:?}");
    // Row 0 sees no key: exactly zeros.
    let row0 = match case.layout {
        Layout::Bhsd => o.i((0, 0, 0)).unwrap(),
        Layout::Bshd => o.i((0, 0, 0)).unwrap(),
    };
    let row0: Vec<f32> = row0.to_dtype(CDType::F32).unwrap().to_vec1().unwrap();
    assert!(row0.iter().all(|&x| x == 0.0), "{row0:?}");
}

#[test]
fn an_explicit_scale_is_used() {
    let dev = Device::Cpu;
    let q = Tensor::randn(0f32, 1.0, (1, 2, 9, 16), &dev).unwrap();
    let k = Tensor::randn(0f32, 1.0, (1, 2, 11, 16), &dev).unwrap();
    let v = Tensor::randn(0f32, 1.0, (1, 2, 11, 16), &dev).unwrap();
    let a = sdpa(&q, &k, &v, &SdpaOptions::bhsd().with_scale(0.5)).unwrap();
    // scale 0.5 on q equals scale 1/sqrt(16) = 0.25 on 2·q.
    let b = sdpa(&(&q * 2.0).unwrap(), &k, &v, &SdpaOptions::bhsd()).unwrap();
    let diff: f32 = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar().unwrap();
    assert!(diff < 1e-5, "{diff}");
}

// ---------------------------------------------------------------------------------------------------------
// Variants (issue 22): sliding windows, softcap, ALiBi, through `SdpaOptions` and through the
// candle-flash-attn-named functions. Each call is checked against the f64 reference of the spec the test
// builds itself, and against candle's own attention with the variants written as candle-transformers'
// Gemma 2 writes them (tanh softcap, then an additive bias/mask tensor built here from the formulas).
// ---------------------------------------------------------------------------------------------------------

/// The additive `[1 or B, Hq, Sq, Sk]` tensor that candle's own attention adds after the softcap: ALiBi's
/// `−slope_h · |j − diag(i)|`, `−inf` outside the causal mask and the window, plus the explicit mask. Written
/// from the definitions (FlashAttention's documented window and bias), not from sdpa-core's band.
fn variant_bias(spec: &AttentionSpec, explicit: Option<&[f32]>) -> Tensor {
    let s = spec.shape;
    let v = &spec.variants;
    let off = |i: usize| -> i64 {
        let i = i as i64;
        match spec.diagonal() {
            Some(Diagonal::BottomRight) => i + s.sk as i64 - s.sq as i64,
            _ => i,
        }
    };
    let slopes = spec.alibi_slopes().unwrap();
    let causal = spec.mask.is_causal();
    let mdims = match spec.mask {
        Mask::Explicit(m) => m.dims,
        _ => [1, 1, 1, 1],
    };
    let bs = mdims[0].max(1);
    let mut out = Vec::with_capacity(bs * s.hq * s.sq * s.sk);
    for b in 0..bs {
        for h in 0..s.hq {
            for i in 0..s.sq {
                let d = off(i);
                for j in 0..s.sk {
                    let jj = j as i64;
                    let mut visible = !causal || jj <= d;
                    if let Some(w) = v.window {
                        visible &= w.left.is_none_or(|l| jj >= d - l as i64);
                        visible &= w.right.is_none_or(|r| jj <= d + r as i64);
                    }
                    let mut x = if visible { 0.0 } else { f32::NEG_INFINITY };
                    if let Some(sl) = &slopes {
                        x -= sl[h] * (jj - d).unsigned_abs() as f32;
                    }
                    if let Some(m) = explicit {
                        let st = ExplicitMask { values: MaskValues::Additive, dims: mdims }.strides();
                        x += m[b * st[0] + h * st[1] + i * st[2] + j * st[3]];
                    }
                    out.push(x);
                }
            }
        }
    }
    Tensor::from_vec(out, (bs, s.hq, s.sq, s.sk), &Device::Cpu).unwrap()
}

/// What a variant case calls.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Via {
    /// `sdpa` with `SdpaOptions` (ALiBi given as the standard slopes by name, or as values).
    Options,
    /// `sdpa` with the slopes in a candle tensor.
    OptionsTensor,
    /// `flash_attn`, `flash_attn_windowed`, `flash_attn_alibi`, `flash_attn_alibi_windowed`,
    /// `flash_attn_alibi_windowed_softcap`: picked by which variants the case has (BSHD only).
    Flash,
}

#[derive(Debug, Clone)]
struct VCase {
    shape: Shape,
    dtype: DType,
    layout: Layout,
    view: View,
    mask: MaskCase,
    variants: Variants,
    scale: Option<f64>,
    via: Via,
}

/// Runs one variant case and checks it against the reference and candle's own attention; with `sdpa_too`
/// false, checks only candle's own attention (with the variants written as this file writes them) against
/// the reference, which pins the test's own yardstick.
fn check_variant(case: &VCase, seed: u64, sdpa_too: bool) {
    let s = case.shape;
    let (dtype, layout) = (case.dtype, case.layout);
    let spec_mask = match case.mask {
        MaskCase::None => Mask::None,
        MaskCase::CausalTopLeft => Mask::CausalTopLeft,
        MaskCase::CausalBottomRight => Mask::CausalBottomRight,
        MaskCase::Additive(d, _) => Mask::Explicit(ExplicitMask { values: MaskValues::Additive, dims: d }),
        other => panic!("variant cases use none, causal or additive masks, not {other:?}"),
    };
    let mut spec =
        AttentionSpec::new(s, dtype).with_layout(layout).with_mask(spec_mask).with_variants(case.variants.clone());
    spec.scale = case.scale;
    spec.validate().unwrap_or_else(|e| panic!("{case:?}: the test's spec is invalid: {e}"));
    let inputs = HostInputs::random(&spec, seed).unwrap();
    let q = present(&to_tensor(&inputs.q, &dims(layout, s.b, s.hq, s.sq, s.d), &Device::Cpu), layout, case.view, seed);
    let k = present(&to_tensor(&inputs.k, &dims(layout, s.b, s.hkv, s.sk, s.d), &Device::Cpu), layout, case.view, seed);
    let v =
        present(&to_tensor(&inputs.v, &dims(layout, s.b, s.hkv, s.sk, s.dv), &Device::Cpu), layout, case.view, seed);
    let slopes = spec.alibi_slopes().unwrap();
    let slopes_tensor = slopes.as_ref().map(|sl| Tensor::new(sl.as_slice(), &Device::Cpu).unwrap());
    let var = &case.variants;
    let explicit = matches!(case.mask, MaskCase::Additive(..)).then(|| inputs.mask.clone().unwrap());
    let bias = variant_bias(&spec, explicit.as_deref());
    let theirs = candle_attention(&q, &k, &v, layout, case.scale, var.softcap, Some(&bias));
    if !sdpa_too {
        candle_matches_the_reference(&format!("{case:?}"), &spec, &inputs, &theirs);
        return;
    }

    let o = match case.via {
        Via::Options | Via::OptionsTensor => {
            let mask = match case.mask {
                MaskCase::None => SdpaMask::None,
                MaskCase::CausalTopLeft => SdpaMask::CausalTopLeft,
                MaskCase::CausalBottomRight => SdpaMask::CausalBottomRight,
                MaskCase::Additive(d, rank) => {
                    let t = Tensor::from_vec(inputs.mask.clone().unwrap(), d.to_vec(), &Device::Cpu).unwrap();
                    SdpaMask::Additive(t.reshape(&d[4 - rank..]).unwrap())
                }
                _ => unreachable!(),
            };
            let alibi = match (&var.alibi, case.via) {
                (None, _) => None,
                (Some(_), Via::OptionsTensor) => Some(SdpaAlibi::Tensor(slopes_tensor.clone().unwrap())),
                (Some(Alibi::Standard), _) => Some(SdpaAlibi::Standard),
                (Some(Alibi::Slopes(sl)), _) => Some(SdpaAlibi::Slopes(sl.clone())),
            };
            let opts = SdpaOptions {
                layout,
                mask,
                scale: case.scale,
                window: var.window,
                softcap: var.softcap,
                alibi,
                diagonal: var.diagonal,
                ..Default::default()
            };
            sdpa(&q, &k, &v, &opts)
        }
        Via::Flash => {
            // FlashAttention's arguments for the case: bottom-right diagonal, BSHD, no explicit mask; a
            // causal mask is the window's right side 0.
            assert_eq!((layout, spec.diagonal()), (Layout::Bshd, Some(Diagonal::BottomRight)), "{case:?}");
            let scale = case.scale.unwrap_or(1.0 / (s.d as f64).sqrt()) as f32;
            let causal = case.mask == MaskCase::CausalBottomRight;
            let w = var.window.unwrap_or(Window { left: None, right: None });
            assert!(!causal || var.window.is_none(), "{case:?}: causal flash cases carry no window");
            let (left, right) = (w.left, if causal { Some(0) } else { w.right });
            match (slopes_tensor.as_ref(), var.softcap) {
                (alibi, Some(cap)) => {
                    flash_attn_alibi_windowed_softcap(&q, &k, &v, alibi, scale, left, right, cap as f32)
                }
                (Some(sl), None) if var.window.is_some() => {
                    flash_attn_alibi_windowed(&q, &k, &v, sl, scale, left, right)
                }
                (Some(sl), None) => flash_attn_alibi(&q, &k, &v, sl, scale, causal),
                (None, None) if var.window.is_some() => flash_attn_windowed(&q, &k, &v, scale, left, right),
                (None, None) => flash_attn(&q, &k, &v, scale, causal),
            }
        }
    }
    .unwrap_or_else(|e| panic!("{case:?}: {e}"));

    compare(&format!("{case:?}"), &spec, &inputs, &o, &theirs);
}

/// Candle's own attention against the f64 reference: within the dtype's tolerance on the rows that see a
/// key, and NaN (its softmax of a row of `-inf`) exactly on the rows that see none.
fn candle_matches_the_reference(label: &str, spec: &AttentionSpec, inputs: &HostInputs, theirs: &Tensor) {
    let bhsd = match spec.layout().unwrap() {
        Layout::Bhsd => theirs.clone(),
        Layout::Bshd => theirs.transpose(1, 2).unwrap().contiguous().unwrap(),
    };
    let got: Vec<f64> = bhsd.to_dtype(CDType::F64).unwrap().flatten_all().unwrap().to_vec1().unwrap();
    let want = reference_attention(spec, inputs).unwrap();
    let dv = spec.shape.dv;
    let (mut d2, mut r2) = (0.0, 0.0);
    for (row, lse) in want.lse.iter().enumerate() {
        let (g, w) = (&got[row * dv..(row + 1) * dv], &want.o[row * dv..(row + 1) * dv]);
        if *lse == f64::NEG_INFINITY {
            assert!(g.iter().all(|x| x.is_nan()), "{label}: row {row} sees no key but candle gives {g:?}");
            continue;
        }
        for (x, y) in g.iter().zip(w) {
            d2 += (x - y) * (x - y);
            r2 += y * y;
        }
    }
    let rel = (d2 / r2.max(f64::MIN_POSITIVE)).sqrt();
    let tol = tolerance(spec.dtype, F32Math::Exact);
    assert!(rel <= tol, "{label}: candle's own attention is {rel:.3e} from the reference (tolerance {tol:.1e})");
}

fn window(left: Option<usize>, right: Option<usize>) -> Option<Window> {
    Some(Window { left, right })
}

/// The windows the issue names, for `Sq`/`Sk` around 40-60 and CPU tiles of 32-64 keys: narrower than a
/// tile, one-sided either way, wider than Sk, and ones that leave rows empty.
fn windows() -> Vec<Option<Window>> {
    vec![
        window(Some(3), Some(0)),
        window(Some(0), Some(0)),
        window(Some(5), Some(2)),
        window(Some(9), None),
        window(None, Some(4)),
        window(Some(500), Some(500)),
        window(Some(33), Some(0)),
    ]
}

/// The `SdpaOptions` cases in `dtypes`: every window with both causal alignments and with no mask on either
/// diagonal, a window over an explicit mask, caps 1..100 with logits up to ±1e4, ALiBi by name, by value
/// (zero and negative slopes included) and in a tensor, and all three at once over an explicit mask; GQA,
/// Sq != Sk, an odd head dim, both dims orders.
fn option_cases(dtypes: &[DType]) -> Vec<VCase> {
    let s = Shape { b: 2, hq: 4, hkv: 2, sq: 37, sk: 53, d: 24, dv: 24 };
    let mut cases = Vec::new();
    for &dtype in dtypes {
        for (layout, view) in [(Layout::Bhsd, View::Transposed), (Layout::Bshd, View::Contiguous)] {
            let base = |mask, variants| VCase {
                shape: s,
                dtype,
                layout,
                view,
                mask,
                variants,
                scale: None,
                via: Via::Options,
            };
            for w in windows() {
                for (mask, diagonal) in [
                    (MaskCase::CausalTopLeft, None),
                    (MaskCase::CausalBottomRight, Some(Diagonal::BottomRight)),
                    (MaskCase::None, Some(Diagonal::TopLeft)),
                    (MaskCase::None, Some(Diagonal::BottomRight)),
                ] {
                    cases.push(base(mask, Variants { window: w, diagonal, ..Default::default() }));
                }
            }
            // A window with an explicit mask (and no causal mask).
            cases.push(base(
                MaskCase::Additive([s.b, 1, s.sq, s.sk], 4),
                Variants { window: window(Some(6), Some(6)), diagonal: Some(Diagonal::TopLeft), ..Default::default() },
            ));
            // Softcap alone, on a causal mask and with a window; big scales push logits to ±1e4.
            for (cap, scale) in [(1.0, None), (50.0, Some(400.0)), (100.0, Some(2000.0)), (30.0, Some(0.05))] {
                let mut c = base(MaskCase::CausalBottomRight, Variants { softcap: Some(cap), ..Default::default() });
                c.scale = scale;
                cases.push(c.clone());
                c.mask = MaskCase::None;
                cases.push(c.clone());
                c.variants.window = window(Some(7), Some(0));
                c.variants.diagonal = Some(Diagonal::TopLeft);
                cases.push(c);
            }
            // ALiBi: standard slopes by name, given slopes (zero and negative included), causal or two-sided.
            let given = Alibi::Slopes(vec![0.5, 0.0, -0.125, 1.0 / 3.0]);
            for alibi in [Alibi::Standard, given] {
                cases
                    .push(base(MaskCase::CausalTopLeft, Variants { alibi: Some(alibi.clone()), ..Default::default() }));
                cases.push(base(
                    MaskCase::None,
                    Variants {
                        alibi: Some(alibi.clone()),
                        diagonal: Some(Diagonal::BottomRight),
                        ..Default::default()
                    },
                ));
                // All three together, with an explicit mask.
                cases.push(base(
                    MaskCase::Additive([1, 1, s.sq, s.sk], 2),
                    Variants {
                        alibi: Some(alibi),
                        window: window(Some(11), Some(3)),
                        softcap: Some(20.0),
                        diagonal: Some(Diagonal::BottomRight),
                    },
                ));
            }
            // The slopes as a candle tensor.
            let mut t =
                base(MaskCase::CausalBottomRight, Variants { alibi: Some(Alibi::Standard), ..Default::default() });
            t.via = Via::OptionsTensor;
            cases.push(t);
        }
    }
    cases
}

#[test]
fn windows_softcap_and_alibi_through_the_options_match_the_reference_and_candle() {
    for (n, case) in option_cases(&[DType::F32, DType::F16, DType::BF16]).iter().enumerate() {
        check_variant(case, 5000 + n as u64, true);
    }
}

/// The cases of candle-flash-attn's functions in `dtypes` (BSHD, narrowed views, FlashAttention's
/// bottom-right diagonal): each function, windows of each kind, ALiBi, Gemma 2's softcap 50 with logits up to
/// ~1e4, on GQA with Sq < Sk, on Sq > Sk (rows with no key) and on decoding with MQA.
fn flash_cases(dtypes: &[DType]) -> Vec<VCase> {
    let mut out = Vec::new();
    let shapes = [
        // GQA, Sq < Sk (bottom-right differs from top-left), odd head dim.
        Shape { b: 2, hq: 4, hkv: 2, sq: 37, sk: 53, d: 24, dv: 24 },
        // More queries than keys: the first rows see no key under the causal mask.
        Shape { b: 1, hq: 2, hkv: 1, sq: 29, sk: 11, d: 16, dv: 16 },
        // Decoding one token against a cache, MQA.
        Shape { b: 2, hq: 4, hkv: 1, sq: 1, sk: 90, d: 32, dv: 32 },
    ];
    let slopes = Alibi::Slopes(vec![0.25, 0.0625, 0.5, 0.03125]);
    for s in shapes {
        let slopes = match &slopes {
            Alibi::Slopes(v) => Alibi::Slopes(v[..s.hq].to_vec()),
            a => a.clone(),
        };
        for &dtype in dtypes {
            let br = Some(Diagonal::BottomRight);
            let mut cases = vec![
                (MaskCase::None, Variants::default(), None),
                (MaskCase::CausalBottomRight, Variants::default(), None),
            ];
            for w in [window(Some(3), Some(0)), window(Some(4), Some(2)), window(None, Some(3)), window(Some(8), None)]
            {
                cases.push((MaskCase::None, Variants { window: w, diagonal: br, ..Default::default() }, None));
            }
            cases.push((
                MaskCase::CausalBottomRight,
                Variants { alibi: Some(slopes.clone()), ..Default::default() },
                None,
            ));
            cases.push((
                MaskCase::None,
                Variants { alibi: Some(slopes.clone()), diagonal: br, ..Default::default() },
                None,
            ));
            let aw = Variants {
                alibi: Some(slopes.clone()),
                window: window(Some(5), Some(1)),
                diagonal: br,
                ..Default::default()
            };
            cases.push((MaskCase::None, aw.clone(), None));
            // Gemma 2: windowed and global layers with softcap 50 (logits up to ~1e4), with and without ALiBi.
            let gemma =
                Variants { softcap: Some(50.0), window: window(Some(6), Some(0)), diagonal: br, ..Default::default() };
            cases.push((MaskCase::None, gemma.clone(), Some(300.0)));
            cases.push((
                MaskCase::CausalBottomRight,
                Variants { softcap: Some(50.0), ..Default::default() },
                Some(300.0),
            ));
            cases.push((MaskCase::None, Variants { softcap: Some(1.0), alibi: aw.alibi.clone(), ..aw }, None));
            for (mask, variants, scale) in cases {
                out.push(VCase {
                    shape: s,
                    dtype,
                    layout: Layout::Bshd,
                    view: View::Narrowed,
                    mask,
                    variants: Variants { diagonal: br, ..variants },
                    scale,
                    via: Via::Flash,
                });
            }
        }
    }
    out
}

#[test]
fn the_flash_attn_functions_match_flash_attentions_definitions() {
    for (n, case) in flash_cases(&[DType::F32, DType::F16, DType::BF16]).iter().enumerate() {
        check_variant(case, 7000 + n as u64, true);
    }
}

/// ALiBi with a long cache: biases down to −slope · 2000 beside scores of a few units; decoding and a short
/// prefill.
fn long_alibi_cases(dtypes: &[DType]) -> Vec<VCase> {
    let mut out = Vec::new();
    for (sq, mask) in [(1, MaskCase::CausalBottomRight), (5, MaskCase::None)] {
        let s = Shape { b: 1, hq: 8, hkv: 2, sq, sk: 2000, d: 64, dv: 64 };
        for &dtype in dtypes {
            let variants =
                Variants { alibi: Some(Alibi::Standard), diagonal: Some(Diagonal::BottomRight), ..Default::default() };
            out.push(VCase {
                shape: s,
                dtype,
                layout: Layout::Bshd,
                view: View::Contiguous,
                mask,
                variants,
                scale: None,
                via: Via::Options,
            });
        }
    }
    out
}

#[test]
fn alibi_with_a_long_cache_matches_the_reference() {
    for (n, case) in long_alibi_cases(&[DType::F32, DType::BF16]).iter().enumerate() {
        check_variant(case, 9000 + n as u64, true);
    }
}

#[test]
fn candles_own_attention_with_the_variants_matches_the_reference() {
    // The yardstick of the tests above, checked on its own: candle's mask-based attention in
    // f32, with the softcap, the ALiBi bias and the window written here from FlashAttention's documented
    // formulas, agrees with sdpa-core's f64 reference on every f32 case.
    let cases = [option_cases(&[DType::F32]), flash_cases(&[DType::F32]), long_alibi_cases(&[DType::F32])].concat();
    for (n, case) in cases.iter().enumerate() {
        check_variant(case, 11000 + n as u64, false);
    }
}

#[test]
fn variants_without_a_named_diagonal_or_with_bad_values_are_refused() {
    // Validation happens before any kernel runs.
    let dev = Device::Cpu;
    let q = Tensor::randn(0f32, 1.0, (1, 4, 6, 8), &dev).unwrap();
    let kv = Tensor::randn(0f32, 1.0, (1, 2, 9, 8), &dev).unwrap();
    let err = |opts: SdpaOptions| sdpa(&q, &kv, &kv, &opts).unwrap_err().to_string();
    let text = err(SdpaOptions::bhsd().with_window(Window::left(3)));
    assert!(text.contains("name it"), "{text}");
    let text = err(SdpaOptions::bhsd().with_alibi(SdpaAlibi::Standard));
    assert!(text.contains("name it"), "{text}");
    let text = err(SdpaOptions::bhsd()
        .with_mask(SdpaMask::CausalTopLeft)
        .with_diagonal(Diagonal::BottomRight)
        .with_window(Window::left(3)));
    assert!(text.contains("name one alignment"), "{text}");
    let text = err(SdpaOptions::bhsd().with_softcap(0.0));
    assert!(text.contains("softcap"), "{text}");
    let text = err(SdpaOptions::bhsd().with_mask(SdpaMask::CausalTopLeft).with_alibi(SdpaAlibi::Slopes(vec![1.0; 3])));
    assert!(text.contains("3 ALiBi slopes") && text.contains("Hq = 4"), "{text}");
    let text =
        err(SdpaOptions::bhsd().with_mask(SdpaMask::CausalTopLeft).with_alibi(SdpaAlibi::Slopes(vec![f32::NAN; 4])));
    assert!(text.contains("not finite"), "{text}");
    let t = Tensor::ones(4, CDType::F16, &dev).unwrap();
    let text = err(SdpaOptions::bhsd().with_mask(SdpaMask::CausalTopLeft).with_alibi(SdpaAlibi::Tensor(t)));
    assert!(text.contains("f32 tensor of shape [Hq]"), "{text}");
    // candle-flash-attn's functions refuse the same things with the same messages.
    let bshd = |t: &Tensor| t.transpose(1, 2).unwrap();
    let text = flash_attn_alibi_windowed_softcap(&bshd(&q), &bshd(&kv), &bshd(&kv), None, 1.0, None, None, -1.0)
        .unwrap_err()
        .to_string();
    assert!(text.contains("softcap"), "{text}");
}
