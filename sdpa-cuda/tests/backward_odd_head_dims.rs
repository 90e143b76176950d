//! Issue 21 for the backward: head dims that are not multiples of 8 (D and Dv independent, 1..256) and views
//! whose rows are not 16-byte aligned run the tensor-core backward through its pad-copy path
//! (`kernels::bwd_pad`: Q, K, V, O and dO copied into zero-filled scratch of whole 16-byte rows, the aligned
//! backward run there with the caller's scale, dQ, dK and dV's own columns copied back). Checked against the
//! f64 reference gradients on random data with dQ, dK and dV NaN-poisoned before each call
//! (`run_backward_host`), held to the backward's tolerance and to twice the error of an eager same-dtype
//! backward, as `tests/backward.rs` holds the aligned calls: D/Dv in {1, 7, 33, 65, 100, 129, 250} and
//! unequal pairs (72/33, 33/72, 250/7), no mask and causal in both alignments, Sq != Sk off every tile, GQA
//! 1 and 4, both layouts, f16 and bf16; misaligned views of aligned and odd head dims (their elements
//! outside the gradients' views stay poisoned); the deterministic mode and the f32 dQ; a ragged batch and an
//! explicit mask; a few small calls for compute-sanitizer. Which path ran is not observable from here: the
//! routing is a unit test (`kernels::bwd_pad`). Skips (printing why) without a GPU.

mod common;

use common::odd::misaligned;
use common::{gpu, Case};
use sdpa_core::backward::{check_gradients, unfused_error};
use sdpa_core::{
    AttentionSpec, BackwardOptions, DType, ExplicitMask, F32Math, GradInputs, HostBackend, HostGradients, HostInputs,
    Kernel, Layout, Mask, MaskValues, Ragged, RunOptions, Shape,
};
use sdpa_cuda::CudaBackend;
use std::sync::OnceLock;

fn opts() -> RunOptions {
    RunOptions { kernel: Kernel::Auto, lse: true, ..Default::default() }
}

/// Issue 21's head dims for the backward (Dv = D), then unequal pairs (72/33 takes the class 96 for both,
/// 250/7 the class 256).
const DIMS: [(usize, usize); 10] =
    [(1, 1), (7, 7), (33, 33), (65, 65), (100, 100), (129, 129), (250, 250), (72, 33), (33, 72), (250, 7)];

/// The table: every pair with no mask and causal in both alignments; the shape alternates between GQA 1 with
/// Sq < Sk and GQA 4 with Sq > Sk (neither a multiple of any tile), the layout and the dtype alternate so
/// that each pair meets both of each.
fn table() -> Vec<(AttentionSpec, String)> {
    let mut v = Vec::new();
    for (i, &(d, dv)) in DIMS.iter().enumerate() {
        for (j, mask) in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight].into_iter().enumerate() {
            let shape = if i % 2 == 0 {
                Shape { b: 1, hq: 4, hkv: 4, sq: 77, sk: 130, d, dv }
            } else {
                Shape { b: 2, hq: 4, hkv: 1, sq: 130, sk: 77, d, dv }
            };
            let layout = if (i + j) % 2 == 0 { Layout::Bhsd } else { Layout::Bshd };
            let dtype = if (i + j) % 3 == 1 { DType::F16 } else { DType::BF16 };
            let spec = AttentionSpec::new(shape, dtype).with_layout(layout).with_mask(mask);
            v.push((spec, format!("{dtype} {} {} {shape}", mask.name(), layout.name())));
        }
    }
    v
}

/// Misaligned views (BHSD with rows `row` elements apart and heads and batches off 16 bytes, dQ, dK, dV and
/// dO in the same strides): aligned head dims on 8-byte and 2-byte rows, odd ones on rows of their own width
/// plus a few elements.
fn misaligned_specs() -> Vec<(AttentionSpec, String)> {
    let case = |d, dv, dtype, mask| {
        Case::new(
            Shape { b: 2, hq: 4, hkv: 2, sq: 70, sk: 90, d, dv },
            dtype,
            mask,
            Layout::Bhsd,
            Kernel::Auto,
            F32Math::Exact,
        )
    };
    [
        (case(64, 64, DType::BF16, Mask::CausalBottomRight), 68),
        (case(64, 64, DType::F16, Mask::None), 65),
        (case(33, 33, DType::BF16, Mask::CausalTopLeft), 37),
        (case(100, 65, DType::F16, Mask::CausalBottomRight), 103),
    ]
    .into_iter()
    .map(|(c, row)| (misaligned(&c, row), format!("misaligned rows of {row}: {}", c.label())))
    .collect()
}

/// A ragged batch (packed K/V, sequences of 0 and 1 rows) and an explicit mask at odd head dims.
fn other_specs() -> Vec<(AttentionSpec, String)> {
    let r = Ragged::new(vec![0, 1, 77, 40], vec![5, 0, 90, 40]);
    let ragged = AttentionSpec::new(Shape { b: 4, hq: 4, hkv: 2, sq: 77, sk: 90, d: 65, dv: 33 }, DType::BF16)
        .with_ragged(r, Layout::Bshd)
        .with_mask(Mask::CausalBottomRight);
    let s = Shape { b: 1, hq: 2, hkv: 2, sq: 60, sk: 100, d: 7, dv: 129 };
    let explicit =
        AttentionSpec::new(s, DType::F16).with_mask(Mask::Explicit(ExplicitMask::full(MaskValues::Additive, &s)));
    vec![(ragged, "ragged bf16 causal-br 65/33".into()), (explicit, "explicit additive f16 7/129".into())]
}

/// The deterministic mode and the f32 dQ at odd head dims.
fn det_spec() -> AttentionSpec {
    AttentionSpec::new(Shape { b: 1, hq: 4, hkv: 2, sq: 150, sk: 150, d: 65, dv: 65 }, DType::BF16)
        .with_mask(Mask::CausalTopLeft)
}

/// Compiles, on parallel threads, every program this file's calls launch, once per process.
fn warm(gpu: &CudaBackend) {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let mut specs: Vec<AttentionSpec> = table().into_iter().map(|x| x.0).collect();
        specs.extend(misaligned_specs().into_iter().map(|x| x.0));
        specs.extend(other_specs().into_iter().map(|x| x.0));
        specs.push(det_spec());
        // The forwards that make O and the LSE, then the backwards.
        let fwd: Vec<_> = specs.iter().map(|s| (s.clone(), opts())).collect();
        let fwd_loads = gpu.warm_up(&fwd).expect("the forward programs compile").loads.len();
        let mut calls: Vec<_> = specs.into_iter().map(|s| (s, BackwardOptions::default())).collect();
        calls.push((det_spec(), BackwardOptions { deterministic: true, dq_accum: true }));
        let loads = gpu.warm_up_backward(&calls).expect("the backward programs compile");
        eprintln!("warm-up: {fwd_loads} forward and {} backward programs loaded", loads.len());
    });
}

/// The first element of dQ, dK or dV outside the view of a dense `spec` (the gaps of a strided view) that is
/// not NaN, the poison `run_backward_host` wrote before the call: the copies back wrote past their rows.
fn written_outside_the_views(spec: &AttentionSpec, got: &HostGradients) -> Option<String> {
    let s = spec.shape;
    let views = [
        ("dq", &got.dq, spec.q_strides, s.hq, s.sq, s.d),
        ("dk", &got.dk, spec.k_strides, s.hkv, s.sk, s.d),
        ("dv", &got.dv, spec.v_strides, s.hkv, s.sk, s.dv),
    ];
    for (name, buf, st, heads, rows, cols) in views {
        let vals = buf.to_f32_vec();
        let mut inside = vec![false; vals.len()];
        for b in 0..s.b {
            for h in 0..heads {
                for r in 0..rows {
                    let at = b * st.b + h * st.h + r * st.s;
                    inside[at..at + cols].iter_mut().for_each(|x| *x = true);
                }
            }
        }
        if let Some(i) = (0..vals.len()).find(|&i| !inside[i] && !vals[i].is_nan()) {
            return Some(format!("{name}[{i}] = {} lies outside the view and was written", vals[i]));
        }
    }
    None
}

/// Checks the backward of `spec` (tolerance and the 2x-eager rule; for a dense batch, nothing written
/// outside the gradients' views); the failure's description, or `None`.
fn check(gpu: &CudaBackend, spec: &AttentionSpec, bwd: BackwardOptions, seed: u64, label: &str) -> Option<String> {
    let inputs = HostInputs::random(spec, seed).expect("valid spec");
    let grads = GradInputs::from_forward(spec, gpu, &opts(), &inputs, seed + 1).expect("forward");
    let got = match gpu.run_backward_host(spec, &opts(), &bwd, &inputs, &grads) {
        Ok(g) => g,
        Err(e) => return Some(format!("{label}: {e}")),
    };
    if got.run.kernel != Kernel::Fa2 {
        return Some(format!("{label}: kernel {} ran", got.run.kernel));
    }
    if got.run.deterministic != bwd.deterministic {
        return Some(format!("{label}: deterministic {} asked {}", got.run.deterministic, bwd.deterministic));
    }
    if spec.ragged.is_none() {
        if let Some(e) = written_outside_the_views(spec, &got) {
            return Some(format!("{label}: {e}"));
        }
    }
    let rep = check_gradients(spec, &inputs, &grads, &got, F32Math::Exact, None).expect("checks");
    let unfused = unfused_error(spec, &inputs, &grads.d_o).expect("eager reference");
    let floor = 0.1 * spec.dtype.unit_roundoff();
    if !rep.pass {
        return Some(format!("{label}: {:?}\n{rep:?}", rep.failure()));
    }
    if !rep.within_unfused(&unfused, 2.0, floor) {
        return Some(format!("{label}: over twice the eager same-dtype error\nours {rep:?}\neager {unfused:?}"));
    }
    None
}

/// Runs `cases`, printing each, and fails with every failure listed.
fn run_all(gpu: &CudaBackend, what: &str, cases: &[(AttentionSpec, String)], seed: u64) {
    let failures: Vec<String> = cases
        .iter()
        .enumerate()
        .filter_map(|(i, (spec, label))| {
            let f = check(gpu, spec, BackwardOptions::default(), seed + 2 * i as u64, label);
            eprintln!("{} {label}", if f.is_some() { "FAIL" } else { "ok  " });
            f
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{what}: {} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn odd_head_dims_match_the_reference_gradients() {
    let Some(gpu) = gpu() else { return };
    warm(&gpu);
    run_all(&gpu, "odd head dims", &table(), 1000);
}

#[test]
fn misaligned_views_match_the_reference_gradients() {
    let Some(gpu) = gpu() else { return };
    warm(&gpu);
    run_all(&gpu, "misaligned views", &misaligned_specs(), 2000);
}

#[test]
fn a_ragged_batch_and_an_explicit_mask_at_odd_head_dims_match_the_reference_gradients() {
    let Some(gpu) = gpu() else { return };
    warm(&gpu);
    run_all(&gpu, "ragged and explicit", &other_specs(), 3000);
}

/// The deterministic mode through the copies: within tolerance, the same bits on every run; the f32 dQ
/// (copied back with its own 4-byte copies) rounds to the dQ of the same run, atomic and deterministic.
#[test]
fn deterministic_mode_and_the_f32_dq_through_the_copies() {
    let Some(gpu) = gpu() else { return };
    warm(&gpu);
    let spec = det_spec();
    let det = BackwardOptions { deterministic: true, dq_accum: true };
    assert_eq!(check(&gpu, &spec, det, 40, "deterministic 65"), None);
    let inputs = HostInputs::random(&spec, 41).expect("valid");
    let grads = GradInputs::from_forward(&spec, &gpu, &opts(), &inputs, 42).expect("forward");
    let a = gpu.run_backward_host(&spec, &opts(), &det, &inputs, &grads).expect("runs");
    let b = gpu.run_backward_host(&spec, &opts(), &det, &inputs, &grads).expect("runs");
    for (x, y, name) in [(&a.dq, &b.dq, "dq"), (&a.dk, &b.dk, "dk"), (&a.dv, &b.dv, "dv")] {
        assert_eq!(x.as_bytes(), y.as_bytes(), "{name} differs between deterministic runs");
    }
    assert_eq!(a.dq_accum, b.dq_accum);
    for bwd in [det, BackwardOptions { deterministic: false, dq_accum: true }] {
        let got = gpu.run_backward_host(&spec, &opts(), &bwd, &inputs, &grads).expect("runs");
        let acc = got.dq_accum.as_ref().expect("dq_accum was asked for");
        let dq = got.dq.to_f32_vec();
        assert_eq!(acc.len(), dq.len());
        for (i, (&x, &y)) in acc.iter().zip(&dq).enumerate() {
            // bf16 rounds to 8 significant bits; a NaN (an element never copied back) fails here too.
            assert!((x - y).abs() <= x.abs() / 128.0 + 1e-30, "element {i}: f32 {x} vs bf16 {y} ({bwd:?})");
        }
    }
}

/// A few small calls for the sanitizer run (memcheck, racecheck): the copies in and out at D = 33 with GQA
/// and a causal mask, an unequal pair on a misaligned view, atomic and deterministic with the f32 dQ.
#[test]
fn small_odd_calls_for_the_sanitizer() {
    let Some(gpu) = gpu() else { return };
    let a = AttentionSpec::new(Shape { b: 1, hq: 4, hkv: 1, sq: 40, sk: 70, d: 33, dv: 33 }, DType::BF16)
        .with_mask(Mask::CausalBottomRight);
    let c = Case::new(
        Shape { b: 1, hq: 2, hkv: 2, sq: 30, sk: 50, d: 7, dv: 72 },
        DType::F16,
        Mask::None,
        Layout::Bhsd,
        Kernel::Auto,
        F32Math::Exact,
    );
    let b = misaligned(&c, 75);
    for spec in [a, b] {
        for deterministic in [false, true] {
            let inputs = HostInputs::random(&spec, 9).expect("valid");
            let grads = GradInputs::from_forward(&spec, &gpu, &opts(), &inputs, 10).expect("forward");
            let bwd = BackwardOptions { deterministic, dq_accum: true };
            let got = gpu.run_backward_host(&spec, &opts(), &bwd, &inputs, &grads).expect("backward runs");
            let rep = check_gradients(&spec, &inputs, &grads, &got, F32Math::Exact, None).expect("checks");
            assert!(rep.pass, "{spec:?}: {:?}", rep.failure());
        }
    }
}
