//! The fused backward (`fa2`) on every SIMD path against sdpa-core's f64 reference gradients
//! (`check_gradients`, dQ/dK/dV poisoned with NaN before each call by `run_backward_host`): awkward sizes,
//! every mask, windows, softcap and ALiBi on both diagonals, GQA 1/4/8, both layouts, ragged batches with
//! sequences of length 0 and 1, Dv != D, each dtype (f32 to 1e-5 rel-L2; f16/bf16 within twice the error of
//! an eager same-dtype backward), bitwise determinism across thread counts, exact zeros where no key or row
//! reaches, the f32 dQ accumulator, and the refusals. Sizes stay small: CI runs these on two cores.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod common;

use common::{backends, masks, THREADS};
use sdpa_core::backward::{
    check_gradients, unfused_error, BackwardOptions, GradCheckReport, GradInputs, HostGradients,
};
use sdpa_core::{
    Alibi, AttentionSpec, DType, Diagonal, F32Math, HostBackend, HostInputs, Kernel, Layout, Mask, Operand, Ragged,
    RunOptions, SdpaError, Shape, Window,
};
use sdpa_cpu::{CpuBackend, SimdPath};

fn shape(b: usize, hq: usize, hkv: usize, sq: usize, sk: usize, d: usize, dv: usize) -> Shape {
    Shape { b, hq, hkv, sq, sk, d, dv }
}

/// Runs the backward on `be` from the forward's O and LSE and a random dO.
fn run(
    be: &CpuBackend,
    spec: &AttentionSpec,
    inputs: &HostInputs,
    bwd: BackwardOptions,
) -> (GradInputs, HostGradients) {
    let opts = RunOptions::default();
    let grads = GradInputs::from_forward(spec, be, &opts, inputs, 29).unwrap();
    let label = label(be, spec);
    let got = be.run_backward_host(spec, &opts, &bwd, inputs, &grads).unwrap_or_else(|e| panic!("{label}: {e}"));
    assert_eq!(got.run.kernel, Kernel::Fa2, "{label}");
    assert!(got.run.deterministic, "{label}");
    (grads, got)
}

fn label(be: &CpuBackend, spec: &AttentionSpec) -> String {
    format!(
        "{} {} {} {:?} {:?} {:?} ragged {:?}",
        be.simd(),
        spec.dtype,
        spec.shape,
        spec.mask,
        spec.variants,
        spec.layout(),
        spec.ragged.as_ref().map(|r| (&r.seqlens_q, &r.seqlens_k))
    )
}

/// Checks the backward on `spec` against the reference: f32 to its tolerance, f16/bf16 within twice the
/// error of the eager same-dtype backward (a small floor where both are near exact).
fn check(be: &CpuBackend, spec: &AttentionSpec, seed: u64) -> GradCheckReport {
    let inputs = HostInputs::random(spec, seed).unwrap();
    check_inputs(be, spec, &inputs)
}

fn check_inputs(be: &CpuBackend, spec: &AttentionSpec, inputs: &HostInputs) -> GradCheckReport {
    let (grads, got) = run(be, spec, inputs, BackwardOptions::default());
    let rep = check_gradients(spec, inputs, &grads, &got, F32Math::Exact, None).unwrap();
    let label = label(be, spec);
    if spec.dtype == DType::F32 {
        assert!(rep.pass, "{label}: {:?}", rep.failure());
    } else {
        let eager = unfused_error(spec, inputs, &grads.d_o).unwrap();
        assert!(rep.within_unfused(&eager, 2.0, 1e-6), "{label}: {rep:?} against eager {eager:?}");
    }
    rep
}

#[test]
fn every_mask_on_awkward_sizes() {
    for (n, be) in backends().iter().enumerate() {
        for (m, sh) in
            [shape(1, 2, 1, 37, 45, 24, 24), shape(2, 4, 2, 70, 53, 33, 17), shape(1, 2, 2, 130, 140, 64, 64)]
                .into_iter()
                .enumerate()
        {
            for (k, mask) in masks(&sh).into_iter().enumerate() {
                let layout = if (n + m + k) % 2 == 0 { Layout::Bhsd } else { Layout::Bshd };
                check(be, &AttentionSpec::new(sh, DType::F32).with_layout(layout).with_mask(mask), k as u64);
            }
        }
    }
}

#[test]
fn windows_softcap_and_alibi_on_both_diagonals() {
    let sh = shape(1, 4, 2, 75, 90, 32, 40);
    for be in backends() {
        for (diag, mask) in [(Diagonal::TopLeft, Mask::CausalTopLeft), (Diagonal::BottomRight, Mask::None)] {
            let base = AttentionSpec::new(sh, DType::F32).with_layout(Layout::Bshd).with_mask(mask).with_diagonal(diag);
            let cases = [
                base.clone().with_window(Window::left(20)),
                base.clone().with_window(Window { left: Some(9), right: Some(30) }),
                // A cap near the logits' size, so the derivative 1 − tanh² is far from 1.
                base.clone().with_scale(2.0).with_softcap(3.0),
                base.clone().with_alibi(Alibi::Standard),
                base.clone()
                    .with_scale(1.5)
                    .with_softcap(4.0)
                    .with_alibi(Alibi::Standard)
                    .with_window(Window::left(33)),
            ];
            for (n, s) in cases.iter().enumerate() {
                check(&be, s, n as u64);
            }
        }
    }
}

#[test]
fn gqa_groups_of_one_four_and_eight_in_both_layouts() {
    for be in backends() {
        for (hq, hkv) in [(2, 2), (8, 2), (8, 1)] {
            for (layout, mask) in [(Layout::Bhsd, Mask::CausalBottomRight), (Layout::Bshd, Mask::None)] {
                let s = AttentionSpec::new(shape(2, hq, hkv, 40, 29, 16, 16), DType::F32).with_layout(layout);
                check(&be, &s.with_mask(mask), hq as u64);
            }
        }
    }
}

#[test]
fn ragged_batches_with_empty_and_single_token_sequences() {
    // Sequence 1 has no query (its keys get zero gradients), 2 one query and no key (a zero dQ row), 4
    // more queries than keys, 3 spans several tiles, 5 one query and one key.
    let r = Ragged::new(vec![5, 0, 1, 70, 17, 1], vec![9, 4, 0, 83, 12, 1]);
    let dtypes = [DType::F32, DType::BF16, DType::F16];
    for (n, be) in backends().iter().enumerate() {
        for (m, mask) in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight].into_iter().enumerate() {
            for layout in [Layout::Bshd, Layout::Bhsd] {
                let sh = shape(r.batch(), 4, 2, r.max_q(), r.max_k(), 32, 24);
                let s = AttentionSpec::new(sh, dtypes[(n + m) % 3]).with_ragged(r.clone(), layout).with_mask(mask);
                check(be, &s, m as u64);
            }
        }
    }
}

#[test]
fn half_precision_dtypes_within_twice_the_eager_error() {
    let sh = shape(1, 4, 2, 100, 77, 64, 48);
    for be in backends() {
        for dtype in [DType::F16, DType::BF16] {
            for (layout, mask) in [(Layout::Bshd, Mask::CausalBottomRight), (Layout::Bhsd, Mask::None)] {
                check(&be, &AttentionSpec::new(sh, dtype).with_layout(layout).with_mask(mask), 3);
            }
            let capped = AttentionSpec::new(sh, dtype).with_mask(Mask::CausalTopLeft).with_softcap(5.0);
            check(&be, &capped.with_alibi(Alibi::Standard), 4);
        }
    }
}

/// Issue 21's head dims (any D and Dv from 1 to 256, independent; the CUDA backward runs them through its
/// pad-copy path and is checked in `sdpa-cuda/tests/backward_odd_head_dims.rs`): the CPU backward takes them
/// on every SIMD path, with their scalar tails, in f32 to its tolerance and f16/bf16 within twice the eager
/// error, causal in both alignments, GQA 4, both layouts.
#[test]
fn issue_21_head_dims_including_unequal_pairs() {
    let dims = [(1, 1), (7, 7), (33, 33), (65, 65), (100, 100), (129, 129), (250, 250), (72, 33)];
    for be in backends() {
        for (i, &(d, dv)) in dims.iter().enumerate() {
            let dtype = [DType::F32, DType::BF16, DType::F16][i % 3];
            let layout = if i % 2 == 0 { Layout::Bhsd } else { Layout::Bshd };
            let mask = if i % 2 == 0 { Mask::CausalBottomRight } else { Mask::CausalTopLeft };
            let spec = AttentionSpec::new(shape(1, 4, 1, 23, 37, d, dv), dtype).with_layout(layout).with_mask(mask);
            check(&be, &spec, 50 + i as u64);
        }
    }
}

/// The gradients as bits, for bitwise comparisons.
fn bits(g: &HostGradients) -> Vec<u8> {
    [&g.dq, &g.dk, &g.dv].iter().flat_map(|b| b.as_bytes().to_vec()).collect()
}

/// Also across the two schedules: 4 (batch, kv head) groups run fused on 1 and 2 threads (dQ accumulated
/// with dK/dV) and split on 3 and 4 (dQ in a pass of its own).
#[test]
fn results_are_bitwise_the_same_for_any_thread_count() {
    let sh = shape(2, 8, 2, 150, 170, 40, 40);
    for path in [SimdPath::detect(), SimdPath::Scalar] {
        for (dtype, mask) in [(DType::F32, Mask::CausalTopLeft), (DType::BF16, Mask::None)] {
            let s = AttentionSpec::new(sh, dtype).with_layout(Layout::Bshd).with_mask(mask);
            let inputs = HostInputs::random(&s, 5).unwrap();
            let runs: Vec<Vec<u8>> = [1, THREADS, 3, 4]
                .into_iter()
                .map(|t| bits(&run(&CpuBackend::with_simd(path, Some(t)).unwrap(), &s, &inputs, Default::default()).1))
                .collect();
            assert!(runs.windows(2).all(|w| w[0] == w[1]), "{path} {dtype}: results differ between thread counts");
        }
    }
}

#[test]
fn rows_without_keys_and_keys_without_rows_get_exact_zeros() {
    // Top-left causal with Sk > Sq: keys past the last row are seen by no one. One row's explicit mask is
    // all -inf: it sees nothing (LSE -inf), so its dQ row is zero and it adds nothing to dK/dV.
    let sh = shape(1, 2, 1, 20, 50, 16, 16);
    for be in backends() {
        let s = AttentionSpec::new(sh, DType::F32).with_mask(Mask::CausalTopLeft);
        let (_, got) = run(&be, &s, &HostInputs::random(&s, 1).unwrap(), Default::default());
        for j in 20..50 {
            let o = s.k_strides.offset(0, 0, j);
            assert!((o..o + 16).all(|x| got.dk.get_f32(x) == 0.0 && got.dv.get_f32(x) == 0.0), "{} key {j}", be.simd());
        }
        let explicit = masks(&sh)[3];
        let s = AttentionSpec::new(sh, DType::F32).with_mask(explicit);
        let mut inputs = HostInputs::random(&s, 2).unwrap();
        let mask = inputs.mask.as_mut().unwrap();
        let row = s.shape.sk * 7; // (b 0, h 0, row 7) of a full-size mask
        mask[row..row + s.shape.sk].fill(f32::NEG_INFINITY);
        let (_, got) = run(&be, &s, &inputs, Default::default());
        let o = s.q_strides.offset(0, 0, 7);
        assert!((o..o + 16).all(|x| got.dq.get_f32(x) == 0.0), "{}: dQ of a row without keys", be.simd());
        check_inputs(&be, &s, &inputs);
    }
}

#[test]
fn the_f32_dq_accumulator_holds_dq_before_rounding() {
    let bwd = BackwardOptions { dq_accum: true, ..Default::default() };
    for dtype in [DType::F32, DType::BF16] {
        let s = AttentionSpec::new(shape(1, 4, 2, 33, 47, 24, 24), dtype).with_mask(Mask::CausalBottomRight);
        let be = CpuBackend::new(Some(THREADS)).unwrap();
        let (_, got) = run(&be, &s, &HostInputs::random(&s, 8).unwrap(), bwd);
        let acc = got.dq_accum.unwrap();
        for x in 0..s.required_len(Operand::Q).unwrap() {
            let rounded = got.dq.get_f32(x);
            let again = sdpa_core::HostBuffer::from_f32(dtype, &[acc[x]]).get_f32(0);
            assert_eq!(rounded.to_bits(), again.to_bits(), "{dtype} element {x}");
        }
    }
}

#[test]
fn paged_caches_and_other_kernels_are_refused() {
    let be = CpuBackend::new(Some(THREADS)).unwrap();
    let r = Ragged::new(vec![1, 1], vec![17, 5]).paged(16, 1);
    let s = AttentionSpec::new(shape(2, 2, 2, 1, 17, 16, 16), DType::F32).with_ragged(r, Layout::Bshd);
    let inputs = HostInputs::random(&s, 1).unwrap();
    let grads = GradInputs::from_forward(&s, &be, &RunOptions::default(), &inputs, 2).unwrap();
    let e = be.run_backward_host(&s, &RunOptions::default(), &Default::default(), &inputs, &grads).unwrap_err();
    assert!(e.to_string().contains("paged"), "{e}");

    let s = AttentionSpec::new(shape(1, 2, 2, 8, 8, 16, 16), DType::F32);
    let inputs = HostInputs::random(&s, 1).unwrap();
    let grads = GradInputs::from_forward(&s, &be, &RunOptions::default(), &inputs, 2).unwrap();
    let opts = RunOptions { kernel: Kernel::SplitKv, ..Default::default() };
    let e = be.run_backward_host(&s, &opts, &Default::default(), &inputs, &grads).unwrap_err();
    assert!(matches!(e, SdpaError::Unsupported { .. }), "{e}");
}

#[test]
fn non_finite_inputs_reach_only_the_gradients_they_touch() {
    // Causal, so every tile on the diagonal mixes pairs a row sees with pairs it does not: a NaN under a
    // masked pair must not reach through `0 · NaN` in the tile products.
    let sh = shape(1, 2, 1, 70, 70, 16, 16);
    for be in backends() {
        for (n, op) in [Operand::Q, Operand::K, Operand::V, Operand::O].into_iter().enumerate() {
            let s = AttentionSpec::new(sh, DType::F32).with_mask(Mask::CausalTopLeft);
            let mut inputs = HostInputs::random(&s, 9).unwrap();
            let opts = RunOptions::default();
            let mut grads = GradInputs::from_forward(&s, &be, &opts, &inputs, 29).unwrap();
            let (row, val) = (40, if n % 2 == 0 { f32::NAN } else { f32::INFINITY });
            match op {
                Operand::Q => inputs.q.set_f32(s.q_strides.offset(0, 1, row) + 3, val),
                Operand::K => inputs.k.set_f32(s.k_strides.offset(0, 0, row) + 3, val),
                Operand::V => inputs.v.set_f32(s.v_strides.offset(0, 0, row) + 3, val),
                Operand::O => grads.d_o.set_f32(s.o_strides.offset(0, 1, row) + 3, val),
            }
            if op != Operand::O {
                grads = GradInputs {
                    d_o: grads.d_o.clone(),
                    ..GradInputs::from_forward(&s, &be, &opts, &inputs, 29).unwrap()
                };
            }
            let got = be.run_backward_host(&s, &opts, &Default::default(), &inputs, &grads).unwrap();
            let rep = check_gradients(&s, &inputs, &grads, &got, F32Math::Exact, None).unwrap();
            let nan = |r: &sdpa_core::check::CheckReport| r.nan_mismatches;
            assert!([nan(&rep.dq), nan(&rep.dk), nan(&rep.dv)] == [0, 0, 0], "{} {op:?} {val}: {rep:?}", be.simd());
        }
    }
}
