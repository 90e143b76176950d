//! The CUDA half (feature `cuda`, run on a GPU machine): `sdpa` on candle CUDA tensors against the f64
//! reference, every mask kind, GQA, both dims orders, transposed and narrowed views, each dtype; and the
//! same call on the CPU and the GPU agreeing; gradients through the op (`Var`s on the GPU) against the f64
//! reference backward. CI builds the default (CPU) features only, so this file is
//! compiled where the feature is on, and there a missing GPU is a failure, not a skip.
#![cfg(feature = "cuda")]
// Helpers of a test panic on failure: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use candle_core::{DType as CDType, Device, Tensor};
use common::{to_host, to_tensor};
use sdpa_candle::{sdpa, Layout, SdpaMask, SdpaOptions};
use sdpa_core::check::check_output;
use sdpa_core::{AttentionSpec, DType, ExplicitMask, F32Math, HostInputs, HostOutput, Mask, MaskValues, Shape};

fn gpu() -> Device {
    Device::new_cuda(0).expect("tests/cuda.rs needs CUDA device 0")
}

fn dims(layout: Layout, b: usize, h: usize, s: usize, d: usize) -> [usize; 4] {
    match layout {
        Layout::Bhsd => [b, h, s, d],
        Layout::Bshd => [b, s, h, d],
    }
}

/// Contiguous values presented as a transposed view (stored in the other order, on the GPU).
fn transposed(t: &Tensor) -> Tensor {
    t.transpose(1, 2).unwrap().contiguous().unwrap().transpose(1, 2).unwrap()
}

/// Cut out of a larger GPU tensor along the heads dim: a non-zero start offset.
fn narrowed(t: &Tensor, layout: Layout) -> Tensor {
    let hd = if layout == Layout::Bhsd { 1 } else { 2 };
    let mut pad = t.dims().to_vec();
    pad[hd] = 2;
    let pad = Tensor::ones(pad, t.dtype(), t.device()).unwrap();
    Tensor::cat(&[&pad, t, &pad], hd).unwrap().narrow(hd, 2, t.dim(hd).unwrap()).unwrap()
}

#[test]
fn every_mask_layout_view_and_dtype_matches_the_reference_on_the_gpu() {
    let dev = gpu();
    let s = Shape { b: 2, hq: 8, hkv: 2, sq: 77, sk: 130, d: 64, dv: 64 };
    let mut seed = 0;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for layout in [Layout::Bhsd, Layout::Bshd] {
            for view in 0..3 {
                for mask in ["none", "causal", "causal-br", "keep", "additive"] {
                    seed += 1;
                    let m = match mask {
                        "none" => Mask::None,
                        "causal" => Mask::CausalTopLeft,
                        "causal-br" => Mask::CausalBottomRight,
                        "keep" => {
                            Mask::Explicit(ExplicitMask { values: MaskValues::Boolean, dims: [s.b, 1, s.sq, s.sk] })
                        }
                        _ => Mask::Explicit(ExplicitMask { values: MaskValues::Additive, dims: [1, s.hq, s.sq, s.sk] }),
                    };
                    let spec = AttentionSpec::new(s, dtype).with_layout(layout).with_mask(m);
                    let inputs = HostInputs::random(&spec, seed).unwrap();
                    let present = |t: Tensor| match view {
                        0 => t,
                        1 => transposed(&t),
                        _ => narrowed(&t, layout),
                    };
                    let q = present(to_tensor(&inputs.q, &dims(layout, s.b, s.hq, s.sq, s.d), &dev));
                    let k = present(to_tensor(&inputs.k, &dims(layout, s.b, s.hkv, s.sk, s.d), &dev));
                    let v = present(to_tensor(&inputs.v, &dims(layout, s.b, s.hkv, s.sk, s.dv), &dev));
                    let sdpa_mask = match (&spec.mask, &inputs.mask) {
                        (Mask::Explicit(e), Some(add)) if e.values == MaskValues::Boolean => {
                            let bits: Vec<u8> = add.iter().map(|&x| u8::from(x == 0.0)).collect();
                            let t = Tensor::from_vec(bits, e.dims.to_vec(), &Device::Cpu).unwrap();
                            SdpaMask::Keep(t.to_device(&dev).unwrap())
                        }
                        (Mask::Explicit(e), Some(add)) => {
                            let t = Tensor::from_vec(add.clone(), e.dims.to_vec(), &Device::Cpu).unwrap();
                            SdpaMask::Additive(t.to_device(&dev).unwrap())
                        }
                        (Mask::CausalTopLeft, _) => SdpaMask::CausalTopLeft,
                        (Mask::CausalBottomRight, _) => SdpaMask::CausalBottomRight,
                        _ => SdpaMask::None,
                    };
                    let opts = SdpaOptions { layout, mask: sdpa_mask, ..Default::default() };
                    let o = sdpa(&q, &k, &v, &opts)
                        .unwrap_or_else(|e| panic!("{dtype} {layout:?} view {view} {mask}: {e}"));
                    assert!(o.device().is_cuda());
                    assert_eq!(o.dims(), &dims(layout, s.b, s.hq, s.sq, s.dv));
                    let got = HostOutput { o: to_host(&o, dtype), lse: None };
                    let rep = check_output(&spec, &inputs, &got, F32Math::Exact, None).unwrap();
                    assert!(rep.pass, "{dtype} {layout:?} view {view} {mask}: {rep:?}");

                    // The same call on the CPU gives the same numbers within the dtype's tolerance.
                    let cpu = |t: &Tensor| t.to_device(&Device::Cpu).unwrap();
                    let cpu_opts = SdpaOptions {
                        mask: match &opts.mask {
                            SdpaMask::Keep(t) => SdpaMask::Keep(cpu(t)),
                            SdpaMask::Additive(t) => SdpaMask::Additive(cpu(t)),
                            other => other.clone(),
                        },
                        ..opts.clone()
                    };
                    let o_cpu = sdpa(&cpu(&q), &cpu(&k), &cpu(&v), &cpu_opts).unwrap();
                    let diff = (o.to_device(&Device::Cpu).unwrap().to_dtype(CDType::F64).unwrap()
                        - o_cpu.to_dtype(CDType::F64).unwrap())
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f64>()
                    .unwrap();
                    assert!(diff < 0.1, "{dtype} {layout:?} view {view} {mask}: CPU and GPU differ by {diff}");
                }
            }
        }
    }
}

#[test]
fn a_gpu_mask_on_the_wrong_device_is_an_error() {
    let dev = gpu();
    let q = Tensor::randn(0f32, 1.0, (1, 2, 4, 8), &dev).unwrap();
    let m = Tensor::zeros((4, 4), CDType::F32, &Device::Cpu).unwrap();
    let err = sdpa(&q, &q, &q, &SdpaOptions::bhsd().with_mask(SdpaMask::Additive(m))).unwrap_err().to_string();
    assert!(err.contains("device"), "{err}");
    let cpu_k = Tensor::randn(0f32, 1.0, (1, 2, 4, 8), &Device::Cpu).unwrap();
    assert!(sdpa(&q, &cpu_k, &cpu_k, &SdpaOptions::bhsd()).is_err());
}

/// Variants on the GPU (issue 22): windows, softcap and ALiBi through `SdpaOptions` (both dims orders) and
/// through the candle-flash-attn-named functions (BSHD, slopes in a GPU tensor), GQA, each dtype, against
/// the f64 reference.
#[test]
fn windows_softcap_and_alibi_match_the_reference_on_the_gpu() {
    use sdpa_candle::{
        flash_attn_alibi, flash_attn_alibi_windowed, flash_attn_alibi_windowed_softcap, flash_attn_windowed, Diagonal,
        SdpaAlibi, Window,
    };
    use sdpa_core::{Alibi, Variants};

    let dev = gpu();
    let s = Shape { b: 2, hq: 8, hkv: 2, sq: 77, sk: 130, d: 64, dv: 64 };
    let br = Some(Diagonal::BottomRight);
    let w = |l, r| Some(Window { left: l, right: r });
    let slopes = Alibi::Slopes((0..s.hq).map(|h| 0.5f32.powi(h as i32 + 1)).collect());
    // (what, mask, variants, scale): the flash cases carry FlashAttention's bottom-right diagonal and no
    // explicit mask.
    let cases: Vec<(&str, Mask, Variants, Option<f64>)> = vec![
        (
            "window 5,0 (narrower than a tile)",
            Mask::None,
            Variants { window: w(Some(5), Some(0)), diagonal: br, ..Default::default() },
            None,
        ),
        (
            "window 20,7",
            Mask::None,
            Variants { window: w(Some(20), Some(7)), diagonal: br, ..Default::default() },
            None,
        ),
        (
            "window left only",
            Mask::None,
            Variants { window: w(Some(40), None), diagonal: br, ..Default::default() },
            None,
        ),
        (
            "window right only",
            Mask::None,
            Variants { window: w(None, Some(9)), diagonal: br, ..Default::default() },
            None,
        ),
        (
            "window wider than Sk",
            Mask::CausalBottomRight,
            Variants { window: w(Some(1000), Some(0)), ..Default::default() },
            None,
        ),
        ("alibi causal", Mask::CausalBottomRight, Variants { alibi: Some(slopes.clone()), ..Default::default() }, None),
        (
            "alibi window",
            Mask::None,
            Variants { alibi: Some(slopes.clone()), window: w(Some(16), Some(4)), diagonal: br, ..Default::default() },
            None,
        ),
        (
            "softcap 50 window (Gemma 2 local)",
            Mask::None,
            Variants { softcap: Some(50.0), window: w(Some(32), Some(0)), diagonal: br, ..Default::default() },
            Some(300.0),
        ),
        (
            "softcap 1 alibi",
            Mask::None,
            Variants { softcap: Some(1.0), alibi: Some(slopes.clone()), diagonal: br, ..Default::default() },
            None,
        ),
        (
            "causal top-left window + standard alibi (options only)",
            Mask::CausalTopLeft,
            Variants { window: w(Some(10), Some(0)), alibi: Some(Alibi::Standard), ..Default::default() },
            None,
        ),
        (
            "explicit mask + window + softcap (options only)",
            Mask::Explicit(ExplicitMask { values: MaskValues::Additive, dims: [1, 1, s.sq, s.sk] }),
            Variants {
                window: w(Some(12), Some(12)),
                softcap: Some(30.0),
                diagonal: Some(Diagonal::TopLeft),
                ..Default::default()
            },
            None,
        ),
    ];
    let mut seed = 500;
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (what, mask, variants, scale) in &cases {
            let flash_ok = !matches!(mask, Mask::Explicit(_) | Mask::CausalTopLeft);
            for (layout, flash) in [(Layout::Bhsd, false), (Layout::Bshd, false), (Layout::Bshd, true)] {
                if flash && !flash_ok {
                    continue;
                }
                seed += 1;
                let mut spec =
                    AttentionSpec::new(s, dtype).with_layout(layout).with_mask(*mask).with_variants(variants.clone());
                spec.scale = *scale;
                let inputs = HostInputs::random(&spec, seed).unwrap();
                let q = transposed(&to_tensor(&inputs.q, &dims(layout, s.b, s.hq, s.sq, s.d), &dev));
                let k = to_tensor(&inputs.k, &dims(layout, s.b, s.hkv, s.sk, s.d), &dev);
                let v = narrowed(&to_tensor(&inputs.v, &dims(layout, s.b, s.hkv, s.sk, s.dv), &dev), layout);
                let sl = spec.alibi_slopes().unwrap();
                let sl_gpu = sl.as_ref().map(|x| Tensor::new(x.as_slice(), &dev).unwrap());
                let label = format!("{dtype} {layout:?} {} {what}", if flash { "flash_attn_*" } else { "options" });
                let o = if flash {
                    let fs = scale.unwrap_or(1.0 / (s.d as f64).sqrt()) as f32;
                    let win = variants.window.unwrap_or(Window { left: None, right: None });
                    let (l, r) =
                        if *mask == Mask::CausalBottomRight { (win.left, Some(0)) } else { (win.left, win.right) };
                    match (sl_gpu.as_ref(), variants.softcap) {
                        (a, Some(cap)) => flash_attn_alibi_windowed_softcap(&q, &k, &v, a, fs, l, r, cap as f32),
                        (Some(a), None) if variants.window.is_some() => {
                            flash_attn_alibi_windowed(&q, &k, &v, a, fs, l, r)
                        }
                        (Some(a), None) => flash_attn_alibi(&q, &k, &v, a, fs, *mask == Mask::CausalBottomRight),
                        (None, None) => flash_attn_windowed(&q, &k, &v, fs, l, r),
                    }
                } else {
                    let sdpa_mask = match (mask, &inputs.mask) {
                        (Mask::Explicit(e), Some(add)) => SdpaMask::Additive(
                            Tensor::from_vec(add.clone(), e.dims.to_vec(), &Device::Cpu)
                                .unwrap()
                                .to_device(&dev)
                                .unwrap(),
                        ),
                        (Mask::CausalTopLeft, _) => SdpaMask::CausalTopLeft,
                        (Mask::CausalBottomRight, _) => SdpaMask::CausalBottomRight,
                        _ => SdpaMask::None,
                    };
                    let alibi = match &variants.alibi {
                        None => None,
                        Some(Alibi::Standard) => Some(SdpaAlibi::Standard),
                        Some(Alibi::Slopes(_)) => Some(SdpaAlibi::Tensor(sl_gpu.clone().unwrap())),
                    };
                    let opts = SdpaOptions {
                        layout,
                        mask: sdpa_mask,
                        scale: *scale,
                        window: variants.window,
                        softcap: variants.softcap,
                        alibi,
                        diagonal: variants.diagonal,
                        ..Default::default()
                    };
                    sdpa(&q, &k, &v, &opts)
                }
                .unwrap_or_else(|e| panic!("{label}: {e}"));
                assert!(o.device().is_cuda(), "{label}");
                assert_eq!(o.dims(), &dims(layout, s.b, s.hq, s.sq, s.dv), "{label}");
                let got = HostOutput { o: to_host(&o, dtype), lse: None };
                let rep = check_output(&spec, &inputs, &got, F32Math::Exact, None).unwrap();
                assert!(rep.pass, "{label}: {rep:?}");
            }
        }
    }
}

#[test]
fn gradients_on_the_gpu_match_the_reference_for_every_mask_layout_and_view() {
    // sdpa-cuda's backward runs f16 and bf16; GQA 4, Sq != Sk, lengths no multiple of a tile; head dims that
    // are not multiples of 8 (65/33) take its pad-copy path (issue 21).
    let dev = gpu();
    let shapes = [
        Shape { b: 2, hq: 8, hkv: 2, sq: 77, sk: 130, d: 64, dv: 64 },
        Shape { b: 1, hq: 4, hkv: 1, sq: 150, sk: 61, d: 128, dv: 128 },
        Shape { b: 1, hq: 4, hkv: 2, sq: 45, sk: 70, d: 65, dv: 33 },
    ];
    let mut seed = 500;
    for s in shapes {
        let additive = Mask::Explicit(ExplicitMask { values: MaskValues::Additive, dims: [s.b, 1, s.sq, s.sk] });
        for dtype in [DType::F16, DType::BF16] {
            for layout in [Layout::Bhsd, Layout::Bshd] {
                for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight, additive] {
                    for transposed in [false, true] {
                        seed += 1;
                        let spec = AttentionSpec::new(s, dtype).with_layout(layout).with_mask(mask);
                        let label = format!("{s:?} {dtype:?} {layout:?} {mask:?} transposed {transposed}");
                        common::grad::check_against_reference(&label, &spec, seed, &dev, transposed);
                    }
                }
            }
        }
    }
}

#[test]
fn varlen_gradients_on_the_gpu_match_the_reference() {
    let dev = gpu();
    let r = sdpa_core::Ragged::new(vec![5, 0, 1, 70, 33], vec![7, 0, 1, 70, 0]);
    let shape = Shape { b: r.batch(), hq: 8, hkv: 2, sq: r.max_q(), sk: r.max_k(), d: 64, dv: 64 };
    let mut seed = 700;
    for mask in [Mask::None, Mask::CausalBottomRight] {
        for layout in [Layout::Bshd, Layout::Bhsd] {
            seed += 1;
            let spec = AttentionSpec::new(shape, DType::BF16).with_mask(mask).with_ragged(r.clone(), layout);
            common::grad::check_against_reference(&format!("varlen {mask:?} {layout:?}"), &spec, seed, &dev, false);
        }
    }
}

#[test]
fn the_deterministic_backward_on_the_gpu_is_bitwise_reproducible() {
    let dev = gpu();
    let s = Shape { b: 2, hq: 8, hkv: 2, sq: 200, sk: 200, d: 64, dv: 64 };
    let spec = AttentionSpec::new(s, DType::BF16).with_layout(Layout::Bshd).with_mask(Mask::CausalTopLeft);
    let inputs = HostInputs::random(&spec, 9).unwrap();
    let d_o = sdpa_core::HostBuffer::random(DType::BF16, spec.required_len(sdpa_core::Operand::O).unwrap(), 10);
    let opts = common::grad::options_of(&spec, &inputs, &dev).with_deterministic_backward(true);
    let run = || common::grad::candle_backward(&spec, &inputs, &d_o, &dev, &opts, false).0;
    let (a, b) = (run(), run());
    for (x, y) in [(&a.dq, &b.dq), (&a.dk, &b.dk), (&a.dv, &b.dv)] {
        assert!((0..x.len()).all(|i| x.get_f64(i).to_bits() == y.get_f64(i).to_bits()));
    }
}

#[test]
fn an_f32_backward_on_the_gpu_is_either_right_or_a_clear_error() {
    // sdpa-cuda's backward kernels are f16/bf16; f32 training on the GPU must not fail silently.
    let dev = gpu();
    let q = candle_core::Var::from_tensor(&Tensor::ones((1, 2, 16, 64), CDType::F32, &dev).unwrap()).unwrap();
    let kv = Tensor::ones((1, 2, 16, 64), CDType::F32, &dev).unwrap();
    let o = sdpa(&q, &kv, &kv, &SdpaOptions::bhsd()).unwrap();
    match o.sum_all().unwrap().backward() {
        Ok(grads) => {
            // Equal keys: the softmax is uniform whatever q is, so dQ is exactly zero.
            let dq = grads.get(&q).unwrap().abs().unwrap().sum_all().unwrap().to_scalar::<f32>().unwrap();
            assert_eq!(dq, 0.0);
        }
        Err(e) => assert!(e.to_string().contains("sdpa"), "{e}"),
    }
}
