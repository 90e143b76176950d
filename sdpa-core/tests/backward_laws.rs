//! The reference backward against an independent oracle (central finite differences of the f64 forward),
//! the identities its gradients obey, and the gradient check's own behaviour (it fails poison and wrong
//! values, its sampled form agrees with the full one).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use sdpa_core::backward::{
    backward_tolerance, check_gradients, reference_backward, unfused_error, BackwardOptions, GradInputs, Pass,
};
use sdpa_core::{
    reference_attention, Alibi, AttentionCost, AttentionSpec, DType, Diagonal, ExplicitMask, HostBackend, HostBuffer,
    HostInputs, Layout, Mask, MaskValues, Operand, Ragged, ReferenceBackend, RunOptions, Shape, Window,
};

/// `L = Σ dO·O` in f64 for the inputs as given.
fn loss(spec: &AttentionSpec, inputs: &HostInputs, d_o: &HostBuffer) -> f64 {
    let r = reference_attention(spec, inputs).unwrap();
    let dv = spec.shape.dv;
    let mut total = 0.0;
    for (row, chunk) in r.o.chunks(dv).enumerate() {
        let (b, h, i) = spec.row_coords(row);
        let off = spec.o_offset(&spec.seq(b), b, h, i);
        total += chunk.iter().enumerate().map(|(c, o)| o * d_o.get_f64(off + c)).sum::<f64>();
    }
    total
}

/// f32 inputs holding bf16 values, so that `x ± 2^-12` is exact and the finite difference measures the
/// function, not the rounding of the perturbation.
fn exact_inputs(spec: &AttentionSpec, seed: u64) -> (HostInputs, HostBuffer) {
    let coarse = AttentionSpec { dtype: DType::BF16, ..spec.clone() };
    let r = HostInputs::random(&coarse, seed).unwrap();
    let widen = |b: &HostBuffer| HostBuffer::F32(b.to_f32_vec());
    let inputs = HostInputs { q: widen(&r.q), k: widen(&r.k), v: widen(&r.v), mask: r.mask, block_table: None };
    let d_o = widen(&HostBuffer::random(DType::BF16, spec.required_len(Operand::O).unwrap(), seed ^ 0x5a5a));
    (inputs, d_o)
}

/// Central differences of `L` at every element of Q, K and V against the reference's dQ, dK, dV (read
/// through the same strides).
fn assert_matches_finite_differences(spec: &AttentionSpec, seed: u64) {
    let (inputs, d_o) = exact_inputs(spec, seed);
    let g = reference_backward(spec, &inputs, &d_o).unwrap();
    let eps = 1.0 / 4096.0;
    let s = spec.shape;
    let seqs = spec.seqs();
    let mut checked = 0;
    for op in [Operand::Q, Operand::K, Operand::V] {
        for (b, seq) in seqs.iter().enumerate() {
            let (heads, len, dim) = match op {
                Operand::Q => (s.hq, seq.sq, s.d),
                Operand::K => (s.hkv, seq.sk, s.d),
                _ => (s.hkv, seq.sk, s.dv),
            };
            for h in 0..heads {
                for t in 0..len {
                    for c in 0..dim {
                        let (off, analytic) = match op {
                            Operand::Q => {
                                (spec.q_offset(seq, b, h, t) + c, g.dq[spec.row_index(seq, b, h, t) * s.d + c])
                            }
                            _ => {
                                let krow = sdpa_core::backward::kv_row_index(spec, seq, b, h, t);
                                let off = spec.kv_offset(op, None, seq, b, h, t) + c;
                                (off, if op == Operand::K { g.dk[krow * s.d + c] } else { g.dv[krow * s.dv + c] })
                            }
                        };
                        let at = |delta: f32| {
                            let mut x = inputs.clone();
                            let buf = match op {
                                Operand::Q => &mut x.q,
                                Operand::K => &mut x.k,
                                _ => &mut x.v,
                            };
                            buf.set_f32(off, buf.get_f32(off) + delta);
                            loss(spec, &x, &d_o)
                        };
                        let fd = (at(eps) - at(-eps)) / (2.0 * eps as f64);
                        assert!(
                            (fd - analytic).abs() <= 2e-6 + 1e-5 * analytic.abs(),
                            "{:?} {op:?}[b{b} h{h} t{t} c{c}]: finite difference {fd} vs reference {analytic}",
                            spec.shape
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 0);
}

#[test]
fn the_reference_backward_matches_finite_differences_of_the_forward() {
    let shape = Shape { b: 2, hq: 4, hkv: 2, sq: 5, sk: 7, d: 3, dv: 2 };
    let masks = [
        Mask::None,
        Mask::CausalTopLeft,
        Mask::CausalBottomRight,
        Mask::Explicit(ExplicitMask { values: MaskValues::Additive, dims: [1, 4, 5, 7] }),
    ];
    for (n, mask) in masks.into_iter().enumerate() {
        let layout = if n % 2 == 0 { Layout::Bhsd } else { Layout::Bshd };
        let spec = AttentionSpec::new(shape, DType::F32).with_mask(mask).with_layout(layout).with_scale(0.8);
        assert_matches_finite_differences(&spec, 10 + n as u64);
    }
    // Every variant at once, on the bottom-right diagonal, with rows that see nothing (Sq > Sk).
    let spec = AttentionSpec::new(Shape { b: 1, hq: 4, hkv: 1, sq: 6, sk: 4, d: 4, dv: 3 }, DType::F32)
        .with_mask(Mask::CausalBottomRight)
        .with_window(Window { left: Some(2), right: Some(0) })
        .with_softcap(1.5)
        .with_alibi(Alibi::Standard);
    assert_matches_finite_differences(&spec, 20);
    // A softcap small enough that tanh saturates, and a two-sided window off the diagonal.
    let spec = AttentionSpec::new(Shape { b: 1, hq: 2, hkv: 2, sq: 5, sk: 9, d: 5, dv: 5 }, DType::F32)
        .with_diagonal(Diagonal::TopLeft)
        .with_window(Window { left: Some(1), right: Some(3) })
        .with_softcap(0.3);
    assert_matches_finite_differences(&spec, 21);
}

#[test]
fn ragged_gradients_match_finite_differences_and_each_sequence_alone() {
    let shape = Shape { b: 4, hq: 4, hkv: 2, sq: 5, sk: 6, d: 3, dv: 4 };
    let ragged = Ragged { seqlens_q: vec![3, 0, 5, 1], seqlens_k: vec![6, 2, 4, 0], pages: None };
    for (layout, mask) in [(Layout::Bshd, Mask::CausalBottomRight), (Layout::Bhsd, Mask::None)] {
        let spec = AttentionSpec::new(shape, DType::F32).with_mask(mask).with_ragged(ragged.clone(), layout);
        spec.validate().unwrap();
        assert_matches_finite_differences(&spec, 30);
    }
}

#[test]
fn paged_caches_have_no_backward() {
    let shape = Shape { b: 2, hq: 2, hkv: 1, sq: 1, sk: 8, d: 4, dv: 4 };
    let ragged = Ragged { seqlens_q: vec![1, 1], seqlens_k: vec![8, 3], pages: None }.paged(4, 0);
    let spec = AttentionSpec::new(shape, DType::F32).with_ragged(ragged, Layout::Bshd);
    let inputs = HostInputs::random(&spec, 1).unwrap();
    let d_o = HostBuffer::random(DType::F32, spec.required_len(Operand::O).unwrap(), 2);
    let err = reference_backward(&spec, &inputs, &d_o).unwrap_err().to_string();
    assert!(err.contains("paged KV cache"), "{err}");
}

/// `Σ_j dS_ij = 0` for every row (the `rowsum(dO∘O)` form of the softmax gradient), so shifting every key
/// of a group by the same vector changes nothing: `Σ_j dK_j = 0` per (batch, kv head) without a softcap
/// or ALiBi. And every row's probabilities sum to one, so `Σ_j dV_j = Σ_i dO_i` over rows that see a key.
#[test]
fn the_gradients_obey_the_softmax_identities() {
    let shape = Shape { b: 2, hq: 6, hkv: 3, sq: 9, sk: 11, d: 8, dv: 5 };
    for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight] {
        let spec = AttentionSpec::new(shape, DType::F32).with_mask(mask);
        let inputs = HostInputs::random(&spec, 3).unwrap();
        let d_o = HostBuffer::random(DType::F32, spec.required_len(Operand::O).unwrap(), 4);
        let g = reference_backward(&spec, &inputs, &d_o).unwrap();
        for b in 0..shape.b {
            for kvh in 0..shape.hkv {
                let rows = |t: usize| (b * shape.hkv + kvh) * shape.sk + t;
                for c in 0..shape.d {
                    let sum: f64 = (0..shape.sk).map(|j| g.dk[rows(j) * shape.d + c]).sum();
                    assert!(sum.abs() < 1e-10, "{mask:?}: Σ dK = {sum}");
                }
                for c in 0..shape.dv {
                    let dv: f64 = (0..shape.sk).map(|j| g.dv[rows(j) * shape.dv + c]).sum();
                    let mut d_o_sum = 0.0;
                    for h in kvh * 2..kvh * 2 + 2 {
                        for i in 0..shape.sq {
                            if g.lse[(b * shape.hq + h) * shape.sq + i].is_finite() {
                                d_o_sum += d_o.get_f64(spec.o_strides.offset(b, h, i) + c);
                            }
                        }
                    }
                    assert!((dv - d_o_sum).abs() < 1e-10, "{mask:?}: Σ dV = {dv}, Σ dO = {d_o_sum}");
                }
            }
        }
    }
}

/// GQA's dK/dV are the sums over the group of what each query head gives with its own copy of K and V.
#[test]
fn gqa_gradients_sum_the_group_of_repeated_heads() {
    let gqa = AttentionSpec::new(Shape { b: 1, hq: 8, hkv: 2, sq: 7, sk: 10, d: 4, dv: 6 }, DType::F32)
        .with_mask(Mask::CausalBottomRight)
        .with_softcap(2.0);
    let inputs = HostInputs::random(&gqa, 5).unwrap();
    let d_o = HostBuffer::random(DType::F32, gqa.required_len(Operand::O).unwrap(), 6);
    let g = reference_backward(&gqa, &inputs, &d_o).unwrap();

    let mha = AttentionSpec { shape: Shape { hkv: 8, ..gqa.shape }, ..gqa.clone() }.with_layout(Layout::Bhsd);
    let repeat = |buf: &HostBuffer, dim: usize| {
        let src = buf.to_f32_vec();
        let mut out = Vec::new();
        for h in 0..8 {
            let g = h / 4;
            out.extend_from_slice(&src[g * 10 * dim..(g + 1) * 10 * dim]);
        }
        HostBuffer::F32(out)
    };
    let rep = HostInputs { k: repeat(&inputs.k, 4), v: repeat(&inputs.v, 6), ..inputs.clone() };
    let m = reference_backward(&mha, &rep, &d_o).unwrap();
    assert_eq!(g.dq, m.dq);
    for kvh in 0..2 {
        for j in 0..10 {
            for c in 0..4 {
                let want: f64 = (kvh * 4..kvh * 4 + 4).map(|h| m.dk[(h * 10 + j) * 4 + c]).sum();
                assert!((g.dk[(kvh * 10 + j) * 4 + c] - want).abs() < 1e-12);
            }
            for c in 0..6 {
                let want: f64 = (kvh * 4..kvh * 4 + 4).map(|h| m.dv[(h * 10 + j) * 6 + c]).sum();
                assert!((g.dv[(kvh * 10 + j) * 6 + c] - want).abs() < 1e-12);
            }
        }
    }
}

/// The reference backend passes its own check in every dtype; a poisoned or a wrong element fails it.
#[test]
fn the_gradient_check_passes_the_reference_and_fails_poison_and_wrong_values() {
    for dt in DType::ALL {
        let spec = AttentionSpec::new(Shape { b: 1, hq: 4, hkv: 2, sq: 9, sk: 13, d: 8, dv: 8 }, dt)
            .with_mask(Mask::CausalTopLeft)
            .with_layout(Layout::Bshd);
        let inputs = HostInputs::random(&spec, 7).unwrap();
        let opts = RunOptions::default();
        let grads = GradInputs::from_forward(&spec, &ReferenceBackend, &opts, &inputs, 8).unwrap();
        let bwd = BackwardOptions { deterministic: false, dq_accum: true };
        let got = ReferenceBackend.run_backward_host(&spec, &opts, &bwd, &inputs, &grads).unwrap();
        assert!(got.run.deterministic);
        let rep = check_gradients(&spec, &inputs, &grads, &got, Default::default(), None).unwrap();
        assert!(rep.pass, "{dt}: {rep:?}");
        assert!(rep.dk.rel_err <= dt.unit_roundoff(), "{dt}: {rep:?}");
        assert_eq!(got.dq_accum.as_ref().map(Vec::len), Some(spec.required_len(Operand::Q).unwrap()));

        let mut bad = got.clone();
        bad.dk.set_f32(3, f32::NAN);
        let rep = check_gradients(&spec, &inputs, &grads, &bad, Default::default(), None).unwrap();
        assert!(!rep.pass && rep.dk.nan_mismatches == 1, "{rep:?}");
        assert!(rep.failure().unwrap().starts_with("dK: 1 output elements are NaN"), "{:?}", rep.failure());

        let mut wrong = got.clone();
        let x = wrong.dv.get_f32(5);
        wrong.dv.set_f32(5, x + 0.5);
        let rep = check_gradients(&spec, &inputs, &grads, &wrong, Default::default(), None).unwrap();
        assert!(!rep.pass && rep.worst().0 == "dv", "{rep:?}");
    }
}

/// On a call too big for the full reference, the sampled check (exact dQ rows; dK/dV keys from the
/// forward's O and LSE) gives the reference backend's gradients a pass and catches one wrong key.
#[test]
fn the_sampled_check_agrees_with_the_reference_and_catches_a_wrong_key() {
    let spec = AttentionSpec::new(Shape { b: 1, hq: 2, hkv: 1, sq: 800, sk: 1000, d: 64, dv: 64 }, DType::F32)
        .with_mask(Mask::CausalBottomRight);
    assert!(AttentionCost::backward_of_spec(&spec).flops > 5e8, "the case must be large enough to sample");
    let inputs = HostInputs::random(&spec, 9).unwrap();
    let opts = RunOptions::default();
    let grads = GradInputs::from_forward(&spec, &ReferenceBackend, &opts, &inputs, 10).unwrap();
    let got = ReferenceBackend.run_backward_host(&spec, &opts, &Default::default(), &inputs, &grads).unwrap();
    let rep = check_gradients(&spec, &inputs, &grads, &got, Default::default(), Some(9)).unwrap();
    assert!(rep.pass, "{rep:?}");
    assert_eq!((rep.dq.rows_checked, rep.dk.rows_checked), (9, 9));
    // The last key is always sampled.
    let mut wrong = got.clone();
    let last = spec.kv_offset(Operand::K, None, &spec.seq(0), 0, 0, 999);
    wrong.dk.set_f32(last, wrong.dk.get_f32(last) + 1.0);
    let rep = check_gradients(&spec, &inputs, &grads, &wrong, Default::default(), Some(9)).unwrap();
    assert!(!rep.pass, "{rep:?}");
}

/// The "2x the same-dtype unfused error" rule fits inside the backward tolerance, and the emulated eager
/// backward's error is real (non-zero) and grows from f16 to bf16.
#[test]
fn the_unfused_same_dtype_error_sits_inside_the_backward_tolerance() {
    let mut errs = Vec::new();
    for dt in [DType::F16, DType::BF16] {
        let spec = AttentionSpec::new(Shape { b: 1, hq: 4, hkv: 2, sq: 67, sk: 131, d: 64, dv: 64 }, dt)
            .with_mask(Mask::CausalBottomRight);
        let inputs = HostInputs::random(&spec, 11).unwrap();
        let d_o = HostBuffer::random(dt, spec.required_len(Operand::O).unwrap(), 12);
        let e = unfused_error(&spec, &inputs, &d_o).unwrap();
        let worst = e.worst().1.rel_err;
        assert!(worst > dt.unit_roundoff() * 0.1, "{dt}: {e:?}");
        assert!(
            2.0 * worst < backward_tolerance(dt, Default::default()),
            "{dt}: 2 x {worst:.2e} is over the tolerance"
        );
        errs.push(worst);
    }
    assert!(errs[1] > errs[0]);
}

#[test]
fn passes_parse_and_cost_the_work_they_time() {
    assert_eq!("fwd+bwd".parse::<Pass>().unwrap(), Pass::FwdBwd);
    assert!("sideways".parse::<Pass>().unwrap_err().contains("fwd, bwd or fwd+bwd"));
    let spec = AttentionSpec::new(Shape::new(2, 8, 512, 512, 64), DType::BF16).with_mask(Mask::CausalTopLeft);
    let f = AttentionCost::of_pass(&spec, Pass::Fwd).flops;
    assert_eq!(AttentionCost::of_pass(&spec, Pass::Bwd).flops, 2.5 * f);
    assert_eq!(AttentionCost::of_pass(&spec, Pass::FwdBwd).flops, 3.5 * f);
}
