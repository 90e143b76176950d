//! Gradients through `sdpa` and `sdpa_varlen` on CPU `Var`s against sdpa-core's f64 reference backward
//! (`check_gradients`): every mask (rows that see no key included), sliding windows, softcap and ALiBi,
//! GQA 1/4/8, both dims orders, ragged batches with lengths 0 and 1, Dv != D; f32 within the backward
//! tolerance, f16/bf16 within twice the error of an eager same-dtype backward (`within_unfused`).

// Helpers of a test panic on failure: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use candle_core::Device;
use common::grad::check_against_reference;
use sdpa_candle::{Diagonal, Layout, Window};
use sdpa_core::{Alibi, AttentionSpec, DType, ExplicitMask, Mask, MaskValues, Ragged, Shape, Variants};

/// One spec on the CPU, `Var`s contiguous in the spec's order.
fn check(label: &str, spec: &AttentionSpec, seed: u64) {
    check_against_reference(label, spec, seed, &Device::Cpu, false);
}

fn dense(s: Shape, dtype: DType, layout: Layout, mask: Mask, variants: Variants) -> AttentionSpec {
    AttentionSpec::new(s, dtype).with_layout(layout).with_mask(mask).with_variants(variants)
}

#[test]
fn every_mask_matches_the_reference_backward_including_rows_that_see_no_key() {
    // Sq > Sk: bottom-right causal leaves the first rows with no key (zero dQ, never NaN).
    let shapes = [
        Shape { b: 2, hq: 4, hkv: 1, sq: 21, sk: 13, d: 16, dv: 8 },
        Shape { b: 1, hq: 8, hkv: 8, sq: 9, sk: 30, d: 24, dv: 24 },
    ];
    let mut n = 0;
    for s in shapes {
        let explicit = Mask::Explicit(ExplicitMask { values: MaskValues::Additive, dims: [s.b, 1, s.sq, s.sk] });
        for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight, explicit] {
            for layout in [Layout::Bhsd, Layout::Bshd] {
                check(
                    &format!("{s:?} {mask:?} {layout:?}"),
                    &dense(s, DType::F32, layout, mask, Variants::default()),
                    n,
                );
                n += 1;
            }
        }
    }
}

#[test]
fn windows_softcap_and_alibi_match_the_reference_backward() {
    let s = Shape { b: 1, hq: 8, hkv: 2, sq: 26, sk: 26, d: 16, dv: 16 };
    let variants = [
        Variants { window: Some(Window::left(5)), ..Default::default() },
        Variants { softcap: Some(3.0), ..Default::default() },
        Variants { alibi: Some(Alibi::Standard), ..Default::default() },
        Variants {
            window: Some(Window { left: Some(4), right: Some(2) }),
            softcap: Some(5.0),
            alibi: Some(Alibi::Standard),
            diagonal: Some(Diagonal::BottomRight),
        },
    ];
    let mut n = 100;
    for v in variants {
        let mask = if v.diagonal.is_some() { Mask::None } else { Mask::CausalTopLeft };
        for (dtype, layout) in [(DType::F32, Layout::Bshd), (DType::F32, Layout::Bhsd), (DType::BF16, Layout::Bshd)] {
            check(&format!("{v:?} {dtype:?} {layout:?}"), &dense(s, dtype, layout, mask, v.clone()), n);
            n += 1;
        }
    }
}

#[test]
fn half_precision_gradients_are_within_twice_the_unfused_error() {
    let s = Shape { b: 2, hq: 4, hkv: 1, sq: 17, sk: 33, d: 32, dv: 32 };
    let mut n = 200;
    for dtype in [DType::F16, DType::BF16] {
        for mask in [Mask::None, Mask::CausalBottomRight] {
            for layout in [Layout::Bhsd, Layout::Bshd] {
                check(
                    &format!("{dtype:?} {mask:?} {layout:?}"),
                    &dense(s, dtype, layout, mask, Variants::default()),
                    n,
                );
                n += 1;
            }
        }
    }
}

#[test]
fn ragged_batches_match_the_reference_backward() {
    // Lengths 0 and 1 among them, a sequence with queries but no key, GQA 4, Dv != D.
    let r = Ragged::new(vec![5, 0, 1, 12, 3], vec![7, 0, 1, 12, 0]);
    let shape = Shape { b: r.batch(), hq: 8, hkv: 2, sq: r.max_q(), sk: r.max_k(), d: 16, dv: 8 };
    let window = Variants { window: Some(Window::left(3)), ..Default::default() };
    let mut n = 300;
    for (mask, variants) in [
        (Mask::CausalBottomRight, Variants::default()),
        (Mask::None, Variants::default()),
        (Mask::CausalTopLeft, window),
    ] {
        for layout in [Layout::Bshd, Layout::Bhsd] {
            for dtype in [DType::F32, DType::BF16] {
                let spec = AttentionSpec::new(shape, dtype)
                    .with_mask(mask)
                    .with_variants(variants.clone())
                    .with_ragged(r.clone(), layout);
                check(&format!("ragged {mask:?} {variants:?} {layout:?} {dtype:?}"), &spec, n);
                n += 1;
            }
        }
    }
}
