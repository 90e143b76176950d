//! Every kernel of the foundation against the f64 reference on the GPU: random data, poisoned outputs,
//! awkward sizes (D in {1, 40, 64, 80, 96, 128, 256, 8192}, lengths off the tiles, Sq != Sk), every mask,
//! GQA, both layouts, each dtype, with and without LSE. f16/bf16 `fa1` must also stay within twice the
//! unfused kernel's error in the same dtype on the same inputs. Skips (printing why) without a GPU.

mod common;

use common::{cases, check, check_inputs, gpu, rows_for, Case};
use sdpa_core::{DType, F32Math, HostBuffer, HostInputs, Kernel, Layout, Mask, SdpaError, Shape};

/// Runs a table, prints one line per failure and a summary, fails if any case failed.
fn run_table(name: &str, table: Vec<Case>, mut extra: impl FnMut(&Case, &HostInputs, f64) -> Option<String>) {
    let Some(gpu) = gpu() else { return };
    let mut failures = Vec::new();
    let mut worst: f64 = 0.0;
    let mut unsupported = 0;
    for (n, case) in table.iter().enumerate() {
        let spec = case.spec();
        let inputs = HostInputs::random(&spec, 1000 + n as u64).expect("valid spec");
        match check_inputs(&gpu, case, &inputs, rows_for(&case.shape)) {
            Ok(r) => {
                worst = worst.max(r.rel_err / r.tolerance);
                if !r.pass {
                    failures.push(format!("{}: {r:?}", case.label()));
                } else if let Some(f) = extra(case, &inputs, r.rel_err) {
                    failures.push(format!("{}: {f}", case.label()));
                }
            }
            Err(SdpaError::Unsupported { what, .. }) => {
                unsupported += 1;
                if unsupported <= 3 {
                    eprintln!("{}: unsupported ({what})", case.label());
                }
            }
            Err(e) => failures.push(format!("{}: error: {e}", case.label())),
        }
    }
    eprintln!(
        "{name}: {} cases, {} failed, {unsupported} unsupported, worst rel_err/tolerance {worst:.3}",
        table.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), table.len(), failures.join("\n"));
}

#[test]
fn unfused_matches_the_reference() {
    run_table("unfused", cases(Kernel::Unfused, F32Math::Exact, &DType::ALL), |_, _, _| None);
}

#[test]
fn unfused_tf32_matches_the_reference() {
    run_table("unfused tf32", cases(Kernel::Unfused, F32Math::Tf32, &[DType::F32]), |_, _, _| None);
}

#[test]
fn fa1_matches_the_reference_and_the_unfused_error() {
    let unfused_gpu = gpu();
    run_table("fa1", cases(Kernel::Fa1, F32Math::Exact, &DType::ALL), |case, inputs, err| {
        if case.dtype == DType::F32 {
            return None;
        }
        let g = unfused_gpu.as_ref()?;
        let base = Case { kernel: Kernel::Unfused, ..case.clone() };
        let r = check_inputs(g, &base, inputs, rows_for(&case.shape)).ok()?;
        // Both at the output dtype's rounding floor counts as equal (2x of a near-zero error is noise).
        let bound = 2.0 * r.rel_err.max(case.dtype.unit_roundoff());
        (err > bound).then(|| format!("fa1 rel_err {err:.3e} > 2 x unfused {:.3e}", r.rel_err))
    });
}

#[test]
fn tf32_matches_the_reference() {
    run_table("fa2 f32 tf32", cases(Kernel::Fa2, F32Math::Tf32, &[DType::F32]), |_, _, _| None);
}

#[test]
fn split_tf32_matches_the_reference() {
    run_table("fa2 f32 split-tf32", cases(Kernel::Fa2, F32Math::SplitTf32, &[DType::F32]), |_, _, _| None);
}

/// A NaN in one query poisons exactly that row in every kernel (NaN is never turned into a number).
#[test]
fn nan_in_a_query_propagates_to_its_row_only() {
    let Some(gpu) = gpu() else { return };
    let shape = Shape { b: 1, hq: 2, hkv: 1, sq: 70, sk: 90, d: 64, dv: 64 };
    for (kernel, f32_math, dtype) in [
        (Kernel::Unfused, F32Math::Exact, DType::BF16),
        (Kernel::Fa1, F32Math::Exact, DType::F16),
        (Kernel::Fa1, F32Math::Exact, DType::F32),
        (Kernel::Fa2, F32Math::SplitTf32, DType::F32),
    ] {
        let case = Case { shape, dtype, mask: Mask::CausalTopLeft, layout: Layout::Bshd, kernel, f32_math, lse: true };
        let spec = case.spec();
        let mut inputs = HostInputs::random(&spec, 7).expect("valid");
        let off = spec.q_strides.offset(0, 1, 33) + 5;
        inputs.q.set_f32(off, f32::NAN);
        let r = check_inputs(&gpu, &case, &inputs, None).expect("runs");
        assert!(r.pass, "{}: {r:?}", case.label());
    }
}

/// Big enough to fill the GPU many times over: races and tile-boundary bugs show up here if anywhere.
#[test]
fn larger_shapes_sampled() {
    let Some(gpu) = gpu() else { return };
    let shape = Shape { b: 2, hq: 16, hkv: 4, sq: 1000, sk: 1500, d: 128, dv: 128 };
    for (kernel, f32_math, dtype) in [
        (Kernel::Unfused, F32Math::Exact, DType::BF16),
        (Kernel::Fa1, F32Math::Exact, DType::BF16),
        (Kernel::Fa1, F32Math::Exact, DType::F32),
        (Kernel::Fa2, F32Math::Tf32, DType::F32),
        (Kernel::Fa2, F32Math::SplitTf32, DType::F32),
    ] {
        for mask in [Mask::None, Mask::CausalBottomRight] {
            let case = Case { shape, dtype, mask, layout: Layout::Bhsd, kernel, f32_math, lse: true };
            let r = check(&gpu, &case, 99, Some(128)).expect("runs");
            assert!(r.pass, "{}: {r:?}", case.label());
        }
    }
}

/// Unsupported combinations are errors of the `Unsupported` kind, never wrong answers.
#[test]
fn unsupported_requests_say_so() {
    let Some(gpu) = gpu() else { return };
    let shape = Shape { b: 1, hq: 1, hkv: 1, sq: 8, sk: 8, d: 512, dv: 512 };
    let case = Case {
        shape,
        dtype: DType::F32,
        mask: Mask::None,
        layout: Layout::Bhsd,
        kernel: Kernel::Fa2,
        f32_math: F32Math::Tf32,
        lse: false,
    };
    match check(&gpu, &case, 1, None) {
        Err(SdpaError::Unsupported { what, .. }) => assert!(what.contains("D = Dv <= 256"), "{what}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let case = Case { kernel: Kernel::Fa1, f32_math: F32Math::Tf32, shape: Shape::new(1, 1, 8, 8, 64), ..case };
    assert!(matches!(check(&gpu, &case, 1, None), Err(SdpaError::Unsupported { .. })));
    let case = Case { kernel: Kernel::Unfused, f32_math: F32Math::SplitTf32, ..case };
    assert!(matches!(check(&gpu, &case, 1, None), Err(SdpaError::Unsupported { .. })));
}

/// A buffer of the wrong dtype or length is refused before anything runs.
#[test]
fn bad_buffers_are_refused() {
    use sdpa_core::{Backend, ForwardArgs, RunOptions};
    let Some(gpu) = gpu() else { return };
    let spec = sdpa_core::AttentionSpec::new(Shape::new(1, 2, 16, 16, 64), DType::F16);
    let q = gpu.upload(&HostBuffer::random(DType::F16, 2 * 16 * 64, 1)).expect("upload");
    let short = gpu.upload(&HostBuffer::random(DType::F16, 100, 2)).expect("upload");
    let wrong = gpu.upload(&HostBuffer::random(DType::BF16, 2 * 16 * 64, 3)).expect("upload");
    let mut o = gpu.upload(&HostBuffer::poisoned(DType::F16, 2 * 16 * 64)).expect("upload");
    let opts = RunOptions::default();
    let e = gpu.forward(&spec, &opts, ForwardArgs { q: &q, k: &short, v: &q, mask: None, o: &mut o, lse: None });
    assert!(matches!(e, Err(SdpaError::BufferTooShort { name: "k", .. })), "{e:?}");
    let e = gpu.forward(&spec, &opts, ForwardArgs { q: &q, k: &q, v: &wrong, mask: None, o: &mut o, lse: None });
    assert!(matches!(e, Err(SdpaError::DTypeMismatch { name: "v", .. })), "{e:?}");
}
