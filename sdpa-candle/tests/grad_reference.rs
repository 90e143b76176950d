//! Gradients through `sdpa` and `sdpa_varlen` on CPU `Var`s against sdpa-core's f64 reference backward
//! (`check_gradients`): every mask (rows that see no key included), sliding windows, softcap and ALiBi,
//! GQA 1/4/8, both dims orders, ragged batches with lengths 0 and 1, Dv != D; f32 within the backward
//! tolerance, f16/bf16 within twice the error of an eager same-dtype backward (`within_unfused`).

// Helpers of a test panic on failure: that is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use candle_core::{Device, Tensor, Var};
use common::{to_host, to_tensor};
use sdpa_candle::{sdpa, sdpa_varlen, Diagonal, Layout, SdpaAlibi, SdpaMask, SdpaOptions, Window};
use sdpa_core::backward::{check_gradients, unfused_error, BackwardRun, GradInputs, HostGradients};
use sdpa_core::{
    reference_attention, Alibi, AttentionSpec, DType, ExplicitMask, F32Math, HostBuffer, HostInputs, Kernel, Mask,
    MaskValues, Operand, Ragged, Shape, Variants,
};

const CPU: Device = Device::Cpu;

/// The options that make `sdpa`/`sdpa_varlen` compute `spec` (explicit masks as additive f32 values).
fn options_of(spec: &AttentionSpec, inputs: &HostInputs) -> SdpaOptions {
    let layout = spec.layout().unwrap();
    let mut o = SdpaOptions { layout, ..Default::default() };
    o.mask = match spec.mask {
        Mask::None => SdpaMask::None,
        Mask::CausalTopLeft => SdpaMask::CausalTopLeft,
        Mask::CausalBottomRight => SdpaMask::CausalBottomRight,
        Mask::Explicit(m) => {
            SdpaMask::Additive(Tensor::from_vec(inputs.mask.clone().unwrap(), m.dims.to_vec(), &CPU).unwrap())
        }
    };
    o.scale = spec.scale;
    o.window = spec.variants.window;
    o.softcap = spec.variants.softcap;
    o.diagonal = spec.variants.diagonal;
    o.alibi = spec.alibi_slopes().unwrap().map(SdpaAlibi::Slopes);
    o
}

/// Dims of Q, K, V and O as candle tensors: `[B, ·, ·, D]` dense, `[·, ·, D]` packed.
fn operand_dims(spec: &AttentionSpec) -> [Vec<usize>; 4] {
    let s = spec.shape;
    let layout = spec.layout().unwrap();
    let shape = |heads: usize, seq: usize, d: usize| match (&spec.ragged, layout) {
        (None, Layout::Bhsd) => vec![s.b, heads, seq, d],
        (None, Layout::Bshd) => vec![s.b, seq, heads, d],
        (Some(_), Layout::Bhsd) => vec![heads, seq, d],
        (Some(_), Layout::Bshd) => vec![seq, heads, d],
    };
    let (tq, tk) = match &spec.ragged {
        None => (s.sq, s.sk),
        Some(r) => (r.total_q(), r.total_k()),
    };
    [shape(s.hq, tq, s.d), shape(s.hkv, tk, s.d), shape(s.hkv, tk, s.dv), shape(s.hq, tq, s.dv)]
}

/// Runs `sum(sdpa(q, k, v) ∘ dO)` backward on `Var`s; the gradients (contiguous, so in the spec's default
/// strides) and the forward's output.
fn candle_backward(spec: &AttentionSpec, inputs: &HostInputs, d_o: &HostBuffer) -> (HostGradients, HostBuffer) {
    let [qd, kd, vd, od] = operand_dims(spec);
    let vars = [(&inputs.q, qd), (&inputs.k, kd), (&inputs.v, vd)]
        .map(|(b, d)| Var::from_tensor(&to_tensor(b, &d, &CPU)).unwrap());
    let opts = options_of(spec, inputs);
    let o = match &spec.ragged {
        None => sdpa(&vars[0], &vars[1], &vars[2], &opts).unwrap(),
        Some(r) => {
            let cu = |o: Vec<usize>| Tensor::new(o.iter().map(|&x| x as u32).collect::<Vec<_>>(), &CPU).unwrap();
            sdpa_varlen(&vars[0], &vars[1], &vars[2], &cu(r.offsets_q()), &cu(r.offsets_k()), &opts).unwrap()
        }
    };
    let d_o_t = to_tensor(d_o, &od, &CPU);
    let store = (&o * &d_o_t).unwrap().sum_all().unwrap().backward().unwrap();
    let [dq, dk, dv] = vars.map(|v| to_host(store.get(v.as_tensor()).unwrap(), spec.dtype));
    // Which kernel ran is not visible through candle; the check reads only the gradients.
    let run = BackwardRun { kernel: Kernel::Auto, deterministic: false };
    (HostGradients { dq, dk, dv, dq_accum: None, run }, to_host(&o, spec.dtype))
}

/// One spec: gradients through candle against the reference.
fn check(label: &str, spec: &AttentionSpec, seed: u64) {
    spec.validate().unwrap();
    let inputs = HostInputs::random(spec, seed).unwrap();
    let d_o = HostBuffer::random(spec.dtype, spec.required_len(Operand::O).unwrap(), seed ^ 0xd0);
    let (got, o) = candle_backward(spec, &inputs, &d_o);
    let lse = reference_attention(spec, &inputs).unwrap().lse.iter().map(|&x| x as f32).collect();
    let grads = GradInputs { o, lse, d_o: d_o.clone() };
    let report = check_gradients(spec, &inputs, &grads, &got, F32Math::Exact, None).unwrap();
    match spec.dtype {
        DType::F32 => assert!(report.pass, "{label}: {:?}", report.failure()),
        _ => {
            let unfused = unfused_error(spec, &inputs, &d_o).unwrap();
            assert!(
                report.within_unfused(&unfused, 2.0, 1e-4),
                "{label}: {report:?} is not within twice the unfused same-dtype error {unfused:?}"
            );
        }
    }
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
