//! The f32 tensor-core kernels (`fa2` with `F32Math::Tf32` and `F32Math::SplitTf32`, kernels/tf32.cu)
//! against the f64 reference on the GPU: random data, NaN-poisoned outputs, the foundation's awkward
//! shapes plus GQA 8, decoding rows, Sq > Sk (rows that see no key) and a head dim off the 16-byte path,
//! every mask (none, causal both alignments, broadcast boolean, full and broadcast additive), both layouts,
//! with and without LSE, each with its tolerance; split TF32 also on a long sequence (S = 4096, no mask:
//! the case whose error grew with the sequence before the per-group rounding). Skips (printing why)
//! without a GPU.

mod common;

use common::{
    assert_nan_in_a_query_stays_in_its_row, assert_passes, check, check_inputs, gpu, masks, rows_for, run_spec, sh,
    tensor_core_shapes, Case,
};
use sdpa_core::{DType, ExplicitMask, F32Math, HostInputs, Kernel, Layout, Mask, MaskValues, SdpaError, Shape};

const MATHS: [F32Math; 2] = [F32Math::Tf32, F32Math::SplitTf32];

/// The foundation's shapes plus GQA 8, decoding, Sq > Sk with bottom-right causal rows that see nothing,
/// D = 63 (scalar loads) and D = 256 with odd lengths.
fn table_shapes() -> Vec<Shape> {
    tensor_core_shapes([
        sh(1, 4, 2, 200, 33, 96),
        sh(2, 2, 1, 45, 70, 63),
        sh(1, 3, 3, 150, 101, 256),
        sh(1, 2, 2, 16, 16, 32),
    ])
}

/// Every mask of the foundation's table plus an additive mask broadcast over heads and query rows.
fn table_masks(shape: &Shape) -> Vec<Mask> {
    let mut m = masks(shape);
    m.push(Mask::Explicit(ExplicitMask { values: MaskValues::Additive, dims: [shape.b, 1, 1, shape.sk] }));
    m
}

fn table(f32_math: F32Math) -> Vec<Case> {
    common::table(table_shapes(), table_masks, Kernel::Fa2, f32_math, &[DType::F32])
}

/// Runs every case; head dims above 256 must be `Unsupported`, everything else must pass (D != Dv included:
/// both padded to the class of the larger, issue 21).
fn run_table(name: &str, cases: Vec<Case>) {
    let Some(gpu) = gpu() else { return };
    let mut failures = Vec::new();
    let (mut worst, mut worst_err, mut unsupported): (f64, f64, usize) = (0.0, 0.0, 0);
    for (n, case) in cases.iter().enumerate() {
        let spec = case.spec();
        let inputs = HostInputs::random(&spec, 7000 + n as u64).expect("valid spec");
        let expect_unsupported = case.shape.d.max(case.shape.dv) > 256;
        match check_inputs(&gpu, case, &inputs, rows_for(&case.shape)) {
            Ok(r) if expect_unsupported => failures.push(format!("{}: ran, expected Unsupported: {r:?}", case.label())),
            Ok(r) => {
                worst = worst.max(r.rel_err / r.tolerance);
                worst_err = worst_err.max(r.rel_err);
                if !r.pass {
                    failures.push(format!("{}: {r:?}", case.label()));
                }
            }
            Err(SdpaError::Unsupported { .. }) if expect_unsupported => unsupported += 1,
            Err(e) => failures.push(format!("{}: error: {e}", case.label())),
        }
    }
    eprintln!(
        "{name}: {} cases, {} failed, {unsupported} unsupported as expected, worst rel_err {worst_err:.2e} \
         ({worst:.3} of tolerance)",
        cases.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

#[test]
fn tf32_matches_the_reference() {
    run_table("fa2 f32 tf32", table(F32Math::Tf32));
}

#[test]
fn split_tf32_matches_the_reference() {
    run_table("fa2 f32 split-tf32", table(F32Math::SplitTf32));
}

/// Split TF32 on a long unmasked sequence, sampled rows: the error must stay at f32 level (sdpa-core's
/// split-TF32 tolerance), where chaining every k-step through the tensor-core accumulator had reached
/// 2.9e-5 at S = 4096. Causal and GQA on the same length as well.
#[test]
fn split_tf32_long_sequences_stay_accurate() {
    let Some(gpu) = gpu() else { return };
    for (shape, mask) in [
        (Shape { b: 1, hq: 4, hkv: 4, sq: 4096, sk: 4096, d: 64, dv: 64 }, Mask::None),
        (Shape { b: 1, hq: 2, hkv: 2, sq: 4096, sk: 4096, d: 128, dv: 128 }, Mask::None),
        (Shape { b: 1, hq: 8, hkv: 2, sq: 4096, sk: 4096, d: 128, dv: 128 }, Mask::CausalTopLeft),
        (Shape { b: 1, hq: 2, hkv: 2, sq: 1000, sk: 8191, d: 64, dv: 64 }, Mask::None),
    ] {
        for f32_math in MATHS {
            let case = Case::new(shape, DType::F32, mask, Layout::Bhsd, Kernel::Fa2, f32_math);
            let r = check(&gpu, &case, 4096, Some(96)).expect("runs");
            eprintln!("{}: rel_err {:.2e} (tolerance {:.0e})", case.label(), r.rel_err, r.tolerance);
            assert!(r.pass, "{}: {r:?}", case.label());
        }
    }
}

/// Big enough to fill the GPU many times over: races and tile-boundary bugs show up here if anywhere.
#[test]
fn larger_shapes_sampled() {
    let Some(gpu) = gpu() else { return };
    let s = |b, hq, hkv, sq, sk, d| Shape { b, hq, hkv, sq, sk, d, dv: d };
    // 3 x 7 heads of 9 query tiles: the wgmma kernel's block order groups 14 heads, so its last group is
    // partial (7 heads).
    let shapes = [
        s(2, 16, 4, 1000, 1500, 128),
        s(1, 8, 8, 2048, 2048, 64),
        s(2, 8, 1, 777, 1999, 256),
        s(3, 7, 7, 1100, 900, 96),
    ];
    for shape in shapes {
        for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight] {
            for f32_math in MATHS {
                assert_passes(
                    &gpu,
                    &Case::new(shape, DType::F32, mask, Layout::Bshd, Kernel::Fa2, f32_math),
                    77,
                    Some(128),
                );
            }
        }
    }
}

/// A NaN in one query poisons exactly that row (NaN is never turned into a number by the TF32 rounding).
#[test]
fn nan_in_a_query_propagates_to_its_row_only() {
    let Some(gpu) = gpu() else { return };
    let shape = Shape { b: 1, hq: 4, hkv: 1, sq: 70, sk: 300, d: 64, dv: 64 };
    for f32_math in MATHS {
        let case = Case::new(shape, DType::F32, Mask::CausalBottomRight, Layout::Bshd, Kernel::Fa2, f32_math);
        assert_nan_in_a_query_stays_in_its_row(&gpu, &case);
    }
}

/// Rows only 8-byte aligned (stride 66 floats): the scalar-load path of the same kernel, still exact.
#[test]
fn misaligned_strides_use_scalar_loads() {
    let Some(gpu) = gpu() else { return };
    let shape = Shape { b: 1, hq: 2, hkv: 2, sq: 40, sk: 90, d: 64, dv: 64 };
    for f32_math in MATHS {
        let case = Case::new(shape, DType::F32, Mask::CausalTopLeft, Layout::Bhsd, Kernel::Fa2, f32_math);
        let mut spec = case.spec();
        for st in [&mut spec.q_strides, &mut spec.k_strides, &mut spec.v_strides, &mut spec.o_strides] {
            st.s = 66;
            st.h = 66 * 90;
            st.b = 66 * 90 * 2;
        }
        let (ran, r) = run_spec(&gpu, &case, &spec, 11);
        assert_eq!(ran, Kernel::Fa2);
        assert!(r.pass, "{}: {r:?}", case.label());
    }
}

/// Head dims past 256 (D or Dv) are `Unsupported` with a message naming the limit.
#[test]
fn unsupported_head_dims_say_so() {
    let Some(gpu) = gpu() else { return };
    for (d, dv) in [(512, 512), (64, 300)] {
        let shape = Shape { b: 1, hq: 1, hkv: 1, sq: 8, sk: 8, d, dv };
        let case = Case {
            lse: false,
            ..Case::new(shape, DType::F32, Mask::None, Layout::Bhsd, Kernel::Fa2, F32Math::SplitTf32)
        };
        match check(&gpu, &case, 1, None) {
            Err(SdpaError::Unsupported { what, .. }) => assert!(what.contains("up to 256"), "{what}"),
            other => panic!("expected Unsupported, got {other:?}"),
        }
    }
}

/// A few small cases for `compute-sanitizer` (memcheck, racecheck): every mask path, both maths, D = 64 and
/// 128 under causal masks, lengths off the tiles, GQA, the scalar-load path.
#[test]
fn sanitizer_small_cases() {
    let Some(gpu) = gpu() else { return };
    let s = |b, hq, hkv, sq, sk, d| Shape { b, hq, hkv, sq, sk, d, dv: d };
    for f32_math in MATHS {
        for (shape, mask) in [
            (s(1, 2, 1, 70, 90, 64), Mask::CausalTopLeft),
            (s(1, 2, 1, 90, 70, 64), Mask::CausalBottomRight),
            // Two query blocks of the D = 128 causal tile: warps skip the key tiles past their rows.
            (s(1, 2, 1, 150, 150, 128), Mask::CausalTopLeft),
            (
                s(1, 2, 2, 33, 47, 128),
                Mask::Explicit(ExplicitMask { values: MaskValues::Additive, dims: [1, 2, 33, 47] }),
            ),
            (s(1, 2, 1, 20, 37, 40), Mask::None),
            (s(1, 1, 1, 19, 23, 63), Mask::None),
        ] {
            assert_passes(&gpu, &Case::new(shape, DType::F32, mask, Layout::Bshd, Kernel::Fa2, f32_math), 5, None);
        }
    }
}
