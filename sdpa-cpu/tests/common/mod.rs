//! The one check helper every test file uses: run a kernel on poisoned output, compare with the f64
//! reference through sdpa-core's `check_output`, and fail with a label that names the case.

#![allow(dead_code)]

use sdpa_core::check::{check_output, CheckReport};
use sdpa_core::{
    AttentionSpec, DType, ExplicitMask, F32Math, HostBackend, HostInputs, Kernel, Layout, Mask, MaskValues, RunOptions,
    Shape,
};
use sdpa_cpu::{supported_paths, CpuBackend, SimdPath};

/// Two worker threads, as on the development and CI machines.
pub const THREADS: usize = 2;

/// A backend per SIMD path this CPU supports (the scalar fallback always included).
pub fn backends() -> Vec<CpuBackend> {
    supported_paths().into_iter().map(backend).collect()
}

pub fn backend(path: SimdPath) -> CpuBackend {
    CpuBackend::with_simd(path, Some(THREADS)).expect("a supported path builds")
}

/// The five mask kinds for a shape: none, both causal alignments, explicit boolean and additive (full
/// size and broadcast over some dims).
pub fn masks(shape: &Shape) -> Vec<Mask> {
    vec![
        Mask::None,
        Mask::CausalTopLeft,
        Mask::CausalBottomRight,
        Mask::Explicit(ExplicitMask::full(MaskValues::Boolean, shape)),
        Mask::Explicit(ExplicitMask { values: MaskValues::Additive, dims: [1, shape.hq, 1, shape.sk] }),
        Mask::Explicit(ExplicitMask { values: MaskValues::Additive, dims: [shape.b, 1, shape.sq, shape.sk] }),
    ]
}

pub fn spec(shape: Shape, dtype: DType, mask: Mask, layout: Layout) -> AttentionSpec {
    AttentionSpec::new(shape, dtype).with_layout(layout).with_mask(mask)
}

/// Runs `kernel` on `be` (output and LSE poisoned with NaN by `run_host`), checks against the reference
/// and the LSE, asserts the pass, and returns the report.
pub fn check_inputs(be: &CpuBackend, spec: &AttentionSpec, kernel: Kernel, inputs: &HostInputs) -> CheckReport {
    let label = format!("{} {kernel} {} {} {:?} {:?}", be.simd(), spec.dtype, spec.shape, spec.mask, spec.layout());
    let opts = RunOptions { kernel, lse: true, ..Default::default() };
    let run = be.run_host(spec, &opts, inputs).unwrap_or_else(|e| panic!("{label}: {e}"));
    if kernel != Kernel::Auto {
        assert_eq!(run.kernel, kernel, "{label}");
    }
    let rep = check_output(spec, inputs, &run.output, F32Math::Exact, None).expect("valid spec");
    assert!(rep.pass, "{label}: {rep:?}");
    assert!(run.output.lse.is_some(), "{label}: no lse");
    rep
}

/// [`check_inputs`] on seeded random inputs.
pub fn check(be: &CpuBackend, spec: &AttentionSpec, kernel: Kernel) -> CheckReport {
    let inputs = HostInputs::random(spec, 17).expect("valid spec");
    check_inputs(be, spec, kernel, &inputs)
}

/// Checks every fused kernel on `spec`, and for f16/bf16 holds each to at most twice the error of the
/// unfused kernel in the same dtype (a 1e-6 floor covers cases where both are exact).
pub fn check_all_kernels(be: &CpuBackend, spec: &AttentionSpec) {
    let inputs = HostInputs::random(spec, 23).expect("valid spec");
    let unfused = check_inputs(be, spec, Kernel::Unfused, &inputs);
    for kernel in [Kernel::Fa2, Kernel::SplitKv, Kernel::Auto] {
        let rep = check_inputs(be, spec, kernel, &inputs);
        if spec.dtype != DType::F32 {
            assert!(
                rep.rel_err <= 2.0 * unfused.rel_err + 1e-6,
                "{} {kernel} {} {}: fused error {} > 2 x unfused {}",
                be.simd(),
                spec.dtype,
                spec.shape,
                rep.rel_err,
                unfused.rel_err
            );
        }
    }
}
