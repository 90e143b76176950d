//! The tensor-core backward (`kernels/bwd.cu`) against the f64 reference gradients on random data, with
//! dQ/dK/dV NaN-poisoned before each call (`run_backward_host`): awkward lengths, every mask, windows,
//! softcap and ALiBi, GQA 1/4/8, both layouts, ragged batches with empty and one-row sequences, Dv != D, each
//! head-dim class, f16 and bf16, held both to the backward tolerance and to the rule (at most twice the
//! error of an eager same-dtype backward); the deterministic mode bitwise repeatable; the f32 dQ output; the
//! refusals (f32, paged caches). Skips with the reason printed when there is no GPU.

mod common;

use common::gpu;
use sdpa_core::backward::{check_gradients, unfused_error};
use sdpa_core::{
    Alibi, AttentionSpec, BackwardOptions, DType, Diagonal, ExplicitMask, F32Math, GradInputs, HostBackend,
    HostGradients, HostInputs, Kernel, Layout, Mask, MaskValues, Ragged, RunOptions, SdpaError, Shape, Window,
};
use sdpa_cuda::CudaBackend;
use std::sync::OnceLock;

fn shape(b: usize, hq: usize, hkv: usize, sq: usize, sk: usize, d: usize, dv: usize) -> Shape {
    Shape { b, hq, hkv, sq, sk, d, dv }
}

fn opts() -> RunOptions {
    RunOptions { kernel: Kernel::Auto, lse: true, ..Default::default() }
}

/// Compiles, on parallel threads, every program this file's cases launch (instead of one at a time as the
/// cases first meet them), once per process.
fn warm(gpu: &CudaBackend, specs: &[AttentionSpec]) {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let modes = [BackwardOptions::default(), BackwardOptions { deterministic: true, dq_accum: false }];
        let calls: Vec<_> = specs.iter().flat_map(|s| modes.map(|m| (s.clone(), m))).collect();
        gpu.warm_up_backward(&calls).expect("the backward programs compile");
    });
}

/// Runs the backward of `spec` on fresh inputs (the GPU forward's O and LSE, a random dO) and checks it.
fn run(gpu: &CudaBackend, spec: &AttentionSpec, bwd_opts: BackwardOptions, seed: u64) -> (GradInputs, HostGradients) {
    let inputs = HostInputs::random(spec, seed).expect("valid");
    let grads = GradInputs::from_forward(spec, gpu, &opts(), &inputs, seed + 1).expect("forward");
    let got = gpu.run_backward_host(spec, &opts(), &bwd_opts, &inputs, &grads).expect("backward runs");
    (grads, got)
}

/// Asserts that the backward of `spec` passes the tolerance and the 2x-unfused rule.
fn assert_grads(gpu: &CudaBackend, spec: &AttentionSpec, bwd_opts: BackwardOptions, seed: u64, label: &str) {
    let inputs = HostInputs::random(spec, seed).expect("valid");
    let grads = GradInputs::from_forward(spec, gpu, &opts(), &inputs, seed + 1).expect("forward");
    let got = gpu.run_backward_host(spec, &opts(), &bwd_opts, &inputs, &grads).expect("backward runs");
    assert_eq!(got.run.kernel, Kernel::Fa2, "{label}");
    assert_eq!(got.run.deterministic, bwd_opts.deterministic, "{label}");
    let rep = check_gradients(spec, &inputs, &grads, &got, F32Math::Exact, None).expect("checks");
    let unfused = unfused_error(spec, &inputs, &grads.d_o).expect("eager reference");
    let floor = 0.1 * spec.dtype.unit_roundoff();
    assert!(rep.pass, "{label}: {:?}\n{rep:?}", rep.failure());
    assert!(
        rep.within_unfused(&unfused, 2.0, floor),
        "{label}: over twice the eager same-dtype error\nours {rep:?}\neager {unfused:?}"
    );
}

/// The dense table: awkward lengths (not multiples of any tile, Sq != Sk both ways, one query row), GQA
/// 1/4/8, every head-dim class (D = 32, 40 -> 64, 80 -> 96, 128, 160, 192/128, 224, 256), Dv != D.
fn dense_shapes() -> Vec<Shape> {
    vec![
        shape(1, 4, 4, 77, 130, 64, 64),
        shape(2, 8, 2, 130, 77, 128, 128),
        shape(1, 8, 1, 100, 100, 128, 128),
        shape(1, 4, 4, 1, 200, 64, 64),
        shape(1, 2, 2, 70, 90, 32, 32),
        shape(1, 2, 1, 65, 65, 40, 40),
        shape(1, 2, 2, 50, 70, 80, 80),
        shape(1, 2, 2, 70, 90, 160, 160),
        shape(1, 2, 1, 66, 66, 192, 128),
        shape(1, 2, 2, 40, 75, 224, 224),
        shape(1, 2, 2, 70, 90, 256, 256),
        shape(1, 2, 2, 64, 80, 64, 128),
    ]
}

fn plain_specs() -> Vec<(AttentionSpec, String)> {
    let mut v = Vec::new();
    for (i, s) in dense_shapes().into_iter().enumerate() {
        for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight] {
            // Alternate layouts and dtypes over the table (every combination would multiply the compile
            // and reference time for little).
            let layout = if i % 2 == 0 { Layout::Bhsd } else { Layout::Bshd };
            let dtype = if (i + mask.name().len()) % 3 == 0 { DType::F16 } else { DType::BF16 };
            let spec = AttentionSpec::new(s, dtype).with_layout(layout).with_mask(mask);
            v.push((spec, format!("{dtype} {} {} {s}", mask.name(), layout.name())));
        }
    }
    v
}

fn variant_specs() -> Vec<(AttentionSpec, String)> {
    let s = shape(1, 4, 2, 97, 150, 64, 64);
    let t = shape(2, 8, 2, 80, 80, 128, 128);
    let base = |s: Shape| AttentionSpec::new(s, DType::BF16);
    let full = |s: &Shape| Mask::Explicit(ExplicitMask::full(MaskValues::Additive, s));
    let boolean = |s: &Shape| Mask::Explicit(ExplicitMask { values: MaskValues::Boolean, dims: [1, 1, s.sq, s.sk] });
    vec![
        (base(s).with_mask(full(&s)), "explicit additive".into()),
        (base(t).with_mask(boolean(&t)).with_layout(Layout::Bshd), "explicit boolean broadcast".into()),
        (base(s).with_mask(Mask::CausalBottomRight).with_window(Window::left(20)), "causal window 20".into()),
        (
            base(t).with_window(Window { left: Some(9), right: Some(30) }).with_diagonal(Diagonal::BottomRight),
            "window 9,30 bottom-right".into(),
        ),
        (base(s).with_softcap(5.0), "softcap 5".into()),
        (base(t).with_alibi(Alibi::Standard).with_mask(Mask::CausalTopLeft), "alibi causal".into()),
        (
            base(t)
                .with_softcap(3.0)
                .with_alibi(Alibi::Standard)
                .with_window(Window::left(33))
                .with_diagonal(Diagonal::TopLeft)
                .with_mask(full(&t)),
            "softcap alibi window explicit".into(),
        ),
        (
            AttentionSpec::new(s, DType::F16)
                .with_softcap(4.0)
                .with_alibi(Alibi::Standard)
                .with_diagonal(Diagonal::BottomRight),
            "f16 softcap alibi".into(),
        ),
    ]
}

fn ragged_specs() -> Vec<(AttentionSpec, String)> {
    let r = Ragged::new(vec![0, 1, 77, 130, 64], vec![5, 0, 90, 130, 1]);
    let s = shape(5, 8, 2, 130, 130, 128, 128);
    let mut v = Vec::new();
    for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight] {
        let spec = AttentionSpec::new(s, DType::BF16).with_ragged(r.clone(), Layout::Bshd).with_mask(mask);
        v.push((spec, format!("ragged {}", mask.name())));
    }
    let w = AttentionSpec::new(shape(5, 4, 4, 130, 130, 64, 64), DType::F16)
        .with_ragged(r, Layout::Bhsd)
        .with_mask(Mask::CausalBottomRight)
        .with_window(Window::left(16))
        .with_softcap(6.0);
    v.push((w, "ragged f16 causal window softcap".into()));
    v
}

fn all_specs() -> Vec<AttentionSpec> {
    let mut v: Vec<AttentionSpec> = plain_specs().into_iter().map(|x| x.0).collect();
    v.extend(variant_specs().into_iter().map(|x| x.0));
    v.extend(ragged_specs().into_iter().map(|x| x.0));
    v
}

#[test]
fn dense_calls_match_the_reference_gradients() {
    let Some(gpu) = gpu() else { return };
    warm(&gpu, &all_specs());
    for (i, (spec, label)) in plain_specs().iter().enumerate() {
        assert_grads(&gpu, spec, BackwardOptions::default(), 100 + i as u64, label);
    }
}

#[test]
fn masks_and_variants_match_the_reference_gradients() {
    let Some(gpu) = gpu() else { return };
    warm(&gpu, &all_specs());
    for (i, (spec, label)) in variant_specs().iter().enumerate() {
        assert_grads(&gpu, spec, BackwardOptions::default(), 200 + i as u64, label);
        // The deterministic programs compute dQ apart: every feature goes through them too.
        let det = BackwardOptions { deterministic: true, ..Default::default() };
        assert_grads(&gpu, spec, det, 250 + i as u64, &format!("{label} deterministic"));
    }
}

#[test]
fn ragged_batches_with_empty_and_single_row_sequences_match_the_reference_gradients() {
    let Some(gpu) = gpu() else { return };
    warm(&gpu, &all_specs());
    for (i, (spec, label)) in ragged_specs().iter().enumerate() {
        assert_grads(&gpu, spec, BackwardOptions::default(), 300 + i as u64, label);
        let det = BackwardOptions { deterministic: true, ..Default::default() };
        assert_grads(&gpu, spec, det, 350 + i as u64, &format!("{label} deterministic"));
    }
}

/// The deterministic mode gives the same bits on every run (and says so); the default says it is not
/// deterministic. Both write dQ in f32 when asked, and it rounds to the dQ they wrote.
#[test]
fn deterministic_mode_is_bitwise_repeatable_and_dq_accum_matches_dq() {
    let Some(gpu) = gpu() else { return };
    warm(&gpu, &all_specs());
    let spec = AttentionSpec::new(shape(2, 8, 2, 300, 300, 128, 128), DType::BF16).with_mask(Mask::CausalBottomRight);
    let det = BackwardOptions { deterministic: true, dq_accum: true };
    let (grads, a) = run(&gpu, &spec, det, 5);
    assert!(a.run.deterministic);
    let inputs = HostInputs::random(&spec, 5).expect("valid");
    for _ in 0..3 {
        let b = gpu.run_backward_host(&spec, &opts(), &det, &inputs, &grads).expect("runs");
        for (x, y, name) in [(&a.dq, &b.dq, "dq"), (&a.dk, &b.dk, "dk"), (&a.dv, &b.dv, "dv")] {
            assert_eq!(x.as_bytes(), y.as_bytes(), "{name} differs between deterministic runs");
        }
        assert_eq!(a.dq_accum, b.dq_accum);
    }
    for opts_bwd in [det, BackwardOptions { deterministic: false, dq_accum: true }] {
        let (_, got) = run(&gpu, &spec, opts_bwd, 6);
        assert_eq!(got.run.deterministic, opts_bwd.deterministic);
        let acc = got.dq_accum.as_ref().expect("dq_accum was asked for");
        let dq = got.dq.to_f32_vec();
        let mut checked = 0;
        for (i, (&x, &y)) in acc.iter().zip(&dq).enumerate() {
            // bf16 rounds to 8 significant bits.
            assert!((x - y).abs() <= x.abs() / 128.0 + 1e-30, "element {i}: f32 {x} vs bf16 {y}");
            checked += 1;
        }
        assert_eq!(checked, dq.len());
    }
}

#[test]
fn f32_and_paged_caches_are_refused_with_a_reason() {
    let Some(gpu) = gpu() else { return };
    let s = shape(1, 2, 2, 20, 20, 64, 64);
    let f32_spec = AttentionSpec::new(s, DType::F32);
    let inputs = HostInputs::random(&f32_spec, 1).expect("valid");
    let grads = GradInputs::from_forward(&f32_spec, &gpu, &opts(), &inputs, 2).expect("forward");
    let e = gpu.run_backward_host(&f32_spec, &opts(), &BackwardOptions::default(), &inputs, &grads).unwrap_err();
    assert!(matches!(e, SdpaError::Unsupported { .. }) && e.to_string().contains("f16 and bf16"), "{e}");
    let paged = AttentionSpec::new(shape(2, 2, 2, 20, 20, 64, 64), DType::BF16)
        .with_ragged(Ragged::new(vec![3, 20], vec![10, 20]).paged(4, 1), Layout::Bshd);
    let inputs = HostInputs::random(&paged, 3).expect("valid");
    let grads = GradInputs::from_forward(&paged, &gpu, &opts(), &inputs, 4).expect("forward");
    let e = gpu.run_backward_host(&paged, &opts(), &BackwardOptions::default(), &inputs, &grads).unwrap_err();
    assert!(e.to_string().contains("paged"), "{e}");
}

/// A few small calls for the sanitizer run (`run-gpu.sh sanitize`: memcheck and racecheck): a ragged batch with
/// empty sequences, GQA with a causal mask at the small and the large tile, and D = 128 (its own layout: P^T and
/// dS^T through shared memory) with a window and softcap, atomic and deterministic.
#[test]
fn small_calls_for_the_sanitizer() {
    let Some(gpu) = gpu() else { return };
    let ragged = AttentionSpec::new(shape(4, 4, 2, 70, 70, 64, 64), DType::BF16)
        .with_ragged(Ragged::new(vec![0, 1, 70, 33], vec![9, 0, 40, 70]), Layout::Bshd)
        .with_mask(Mask::CausalBottomRight);
    let big = AttentionSpec::new(shape(1, 4, 1, 70, 90, 256, 256), DType::F16).with_mask(Mask::CausalTopLeft);
    let mid = AttentionSpec::new(shape(1, 4, 2, 100, 140, 128, 128), DType::BF16)
        .with_mask(Mask::CausalBottomRight)
        .with_window(Window::left(40))
        .with_softcap(30.0);
    for spec in [ragged, big, mid] {
        for deterministic in [false, true] {
            let (_, got) = run(&gpu, &spec, BackwardOptions { deterministic, dq_accum: true }, 9);
            for g in [&got.dq, &got.dk, &got.dv] {
                assert!(g.to_f32_vec().iter().all(|x| x.is_finite()), "{spec:?}");
            }
        }
    }
}
