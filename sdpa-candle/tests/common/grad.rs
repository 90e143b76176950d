//! Gradients through `sdpa`/`sdpa_varlen` on `Var`s of any device, checked against sdpa-core's f64
//! reference backward: shared by `grad_reference.rs` (CPU) and `cuda.rs` (GPU).

// Each test file compiles its own copy; the CPU-only files use none of it.
#![allow(dead_code)]

use super::{to_host, to_tensor};
use candle_core::{Device, Tensor, Var};
use sdpa_candle::{sdpa, sdpa_varlen, Layout, SdpaAlibi, SdpaMask, SdpaOptions};
use sdpa_core::backward::{check_gradients, unfused_error, BackwardRun, GradInputs, HostGradients};
use sdpa_core::{reference_attention, AttentionSpec, DType, F32Math, HostBuffer, HostInputs, Kernel, Mask, Operand};

/// The options that make `sdpa`/`sdpa_varlen` compute `spec` (an explicit mask as additive f32 on `dev`).
pub fn options_of(spec: &AttentionSpec, inputs: &HostInputs, dev: &Device) -> SdpaOptions {
    let layout = spec.layout().expect("a spec with one dims order");
    let mut o = SdpaOptions { layout, ..Default::default() };
    o.mask = match spec.mask {
        Mask::None => SdpaMask::None,
        Mask::CausalTopLeft => SdpaMask::CausalTopLeft,
        Mask::CausalBottomRight => SdpaMask::CausalBottomRight,
        Mask::Explicit(m) => {
            let add = HostBuffer::F32(inputs.mask.clone().expect("explicit mask values"));
            SdpaMask::Additive(to_tensor(&add, &m.dims, dev))
        }
    };
    o.scale = spec.scale;
    o.window = spec.variants.window;
    o.softcap = spec.variants.softcap;
    o.diagonal = spec.variants.diagonal;
    o.alibi = spec.alibi_slopes().unwrap().map(SdpaAlibi::Slopes);
    o
}

/// Dims of Q, K, V and O as candle tensors in the spec's order: `[B, ·, ·, D]` dense, `[·, ·, D]` packed.
pub fn operand_dims(spec: &AttentionSpec) -> [Vec<usize>; 4] {
    let s = spec.shape;
    let layout = spec.layout().expect("a spec with one dims order");
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

/// Runs `sum(sdpa(q, k, v) ∘ dO)` backward on `Var`s on `dev`; `transposed` stores each dense `Var` in the
/// other dims order and hands `sdpa` its transposed view. Returns the gradients in the spec's contiguous
/// order and the forward's output.
pub fn candle_backward(
    spec: &AttentionSpec,
    inputs: &HostInputs,
    d_o: &HostBuffer,
    dev: &Device,
    opts: &SdpaOptions,
    transposed: bool,
) -> (HostGradients, HostBuffer) {
    let [qd, kd, vd, od] = operand_dims(spec);
    let swap = transposed && spec.ragged.is_none();
    let vars = [(&inputs.q, qd), (&inputs.k, kd), (&inputs.v, vd)].map(|(b, d)| {
        let t = to_tensor(b, &d, dev);
        let stored = if swap { t.transpose(1, 2).unwrap().contiguous().unwrap() } else { t };
        Var::from_tensor(&stored).unwrap()
    });
    let views = vars.each_ref().map(|v| if swap { v.transpose(1, 2).unwrap() } else { v.as_tensor().clone() });
    let o = match &spec.ragged {
        None => sdpa(&views[0], &views[1], &views[2], opts).unwrap(),
        Some(r) => {
            let cu = |o: Vec<usize>| Tensor::new(o.iter().map(|&x| x as u32).collect::<Vec<_>>(), dev).unwrap();
            sdpa_varlen(&views[0], &views[1], &views[2], &cu(r.offsets_q()), &cu(r.offsets_k()), opts).unwrap()
        }
    };
    let store = (&o * to_tensor(d_o, &od, dev)).unwrap().sum_all().unwrap().backward().unwrap();
    let [dq, dk, dv] = vars.map(|v| {
        let g = store.get(v.as_tensor()).unwrap();
        let g = if swap { g.transpose(1, 2).unwrap().contiguous().unwrap() } else { g.clone() };
        to_host(&g, spec.dtype)
    });
    // Which kernel ran is not visible through candle; the check reads only the gradients.
    let run = BackwardRun { kernel: Kernel::Auto, deterministic: false };
    (HostGradients { dq, dk, dv, dq_accum: None, run }, to_host(&o, spec.dtype))
}

/// Gradients through candle on `dev` against the reference: f32 within the backward tolerance, f16/bf16
/// within twice the error of an eager same-dtype backward (plus 1e-4 where that error is near zero).
pub fn check_against_reference(label: &str, spec: &AttentionSpec, seed: u64, dev: &Device, transposed: bool) {
    spec.validate().unwrap();
    let inputs = HostInputs::random(spec, seed).unwrap();
    let d_o = HostBuffer::random(spec.dtype, spec.required_len(Operand::O).unwrap(), seed ^ 0xd0);
    let opts = options_of(spec, &inputs, dev);
    let (got, o) = candle_backward(spec, &inputs, &d_o, dev, &opts, transposed);
    let lse = reference_attention(spec, &inputs).unwrap().lse.iter().map(|&x| x as f32).collect();
    let grads = GradInputs { o, lse, d_o: d_o.clone() };
    let report = check_gradients(spec, &inputs, &grads, &got, F32Math::Exact, Some(64)).unwrap();
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
