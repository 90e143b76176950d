//! Shared helpers of the GPU tests: opening the GPU (or skipping with the reason), one data-driven
//! `check` against the f64 reference, and the case tables.

#![allow(dead_code)]

pub mod odd;

use sdpa_core::check::{check_output, CheckReport};
use sdpa_core::{
    AttentionSpec, DType, ExplicitMask, F32Math, HostBackend, HostInputs, Kernel, Layout, Mask, MaskValues, RunOptions,
    SdpaError, Shape,
};
use sdpa_cuda::CudaBackend;

/// The GPU, or `None` with the reason printed. `SDPA_REQUIRE_GPU=1` (set by `gpu-bundle/run-gpu.sh`) turns a
/// missing GPU into a failure, so a GPU run can never pass by skipping.
pub fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(g) => Some(g),
        Err(e) => {
            assert!(std::env::var_os("SDPA_REQUIRE_GPU").is_none_or(|v| v != "1"), "SDPA_REQUIRE_GPU=1 but: {e}");
            eprintln!("skipping GPU test: {e}");
            None
        }
    }
}

/// One case: shape, dtype, mask, layout, kernel, f32 math.
#[derive(Debug, Clone)]
pub struct Case {
    pub shape: Shape,
    pub dtype: DType,
    pub mask: Mask,
    pub layout: Layout,
    pub kernel: Kernel,
    pub f32_math: F32Math,
    pub lse: bool,
}

impl Case {
    /// A case that asks for the LSE too.
    pub fn new(shape: Shape, dtype: DType, mask: Mask, layout: Layout, kernel: Kernel, f32_math: F32Math) -> Case {
        Case { shape, dtype, mask, layout, kernel, f32_math, lse: true }
    }

    pub fn spec(&self) -> AttentionSpec {
        AttentionSpec::new(self.shape, self.dtype).with_layout(self.layout).with_mask(self.mask)
    }

    pub fn opts(&self) -> RunOptions {
        RunOptions { kernel: self.kernel, f32_math: self.f32_math, threads: None, lse: self.lse }
    }

    pub fn label(&self) -> String {
        format!(
            "{}/{} {}{} {} {} D={} Dv={} [{}]",
            self.kernel,
            self.f32_math.name(),
            self.dtype,
            if self.lse { "+lse" } else { "" },
            self.mask.name(),
            self.layout.name(),
            self.shape.d,
            self.shape.dv,
            self.shape
        )
    }
}

/// Runs one case on fresh random inputs (seeded by `seed`) with the output poisoned (NaN) by `run_host`,
/// and compares with the f64 reference on at most `max_rows` rows.
pub fn check(gpu: &CudaBackend, case: &Case, seed: u64, max_rows: Option<usize>) -> Result<CheckReport, SdpaError> {
    let spec = case.spec();
    let inputs = HostInputs::random(&spec, seed)?;
    check_inputs(gpu, case, &inputs, max_rows)
}

/// As [`check`] on given inputs.
pub fn check_inputs(
    gpu: &CudaBackend,
    case: &Case,
    inputs: &HostInputs,
    max_rows: Option<usize>,
) -> Result<CheckReport, SdpaError> {
    let spec = case.spec();
    let run = gpu.run_host(&spec, &case.opts(), inputs)?;
    if case.lse {
        assert!(run.output.lse.is_some(), "{}: LSE requested but not returned", case.label());
    }
    check_output(&spec, inputs, &run.output, case.f32_math, max_rows)
}

/// Runs `case` on fresh random inputs (seeded by `seed`), compares on at most `max_rows` rows, and asserts
/// that it passes.
pub fn assert_passes(gpu: &CudaBackend, case: &Case, seed: u64, max_rows: Option<usize>) {
    let r = check(gpu, case, seed, max_rows).expect("runs");
    assert!(r.pass, "{}: {r:?}", case.label());
}

/// A NaN in one query (head 1, row 33, column 5) poisons exactly that row (NaN is never turned into a
/// number): runs `case` with it, on inputs seeded 7, and asserts that it matches the reference.
pub fn assert_nan_in_a_query_stays_in_its_row(gpu: &CudaBackend, case: &Case) {
    let spec = case.spec();
    let mut inputs = HostInputs::random(&spec, 7).expect("valid");
    inputs.q.set_f32(spec.q_strides.offset(0, 1, 33) + 5, f32::NAN);
    let r = check_inputs(gpu, case, &inputs, None).expect("runs");
    assert!(r.pass, "{}: {r:?}", case.label());
}

/// Runs `spec` (the case's spec with hand-made strides) with the case's options on inputs seeded `seed`;
/// returns the kernel that ran and the comparison with the reference under the case's f32 math.
pub fn run_spec(gpu: &CudaBackend, case: &Case, spec: &AttentionSpec, seed: u64) -> (Kernel, CheckReport) {
    let inputs = HostInputs::random(spec, seed).expect("valid");
    let run = gpu.run_host(spec, &case.opts(), &inputs).expect("runs");
    let r = check_output(spec, &inputs, &run.output, case.f32_math, None).expect("checks");
    (run.kernel, r)
}

/// Awkward shapes: lengths not multiples of any tile, Sq != Sk both ways, GQA 1/2/4, head dims of the issue
/// (1, 40, 64, 80, 96, 128, 256, 8192) and one Dv != D.
pub fn shapes() -> Vec<Shape> {
    let s = |b, hq, hkv, sq, sk, d, dv| Shape { b, hq, hkv, sq, sk, d, dv };
    vec![
        s(1, 2, 2, 1, 1, 1, 1),
        s(2, 3, 3, 17, 33, 1, 1),
        s(2, 4, 2, 77, 130, 40, 40),
        s(1, 8, 2, 130, 77, 64, 64),
        s(2, 2, 1, 65, 65, 80, 80),
        s(1, 4, 4, 100, 200, 96, 96),
        s(1, 4, 1, 129, 257, 128, 128),
        s(1, 2, 2, 70, 90, 256, 256),
        s(1, 2, 1, 50, 70, 48, 24),
        s(1, 1, 1, 33, 47, 8192, 8192),
    ]
}

/// A shape with Dv = D.
pub fn sh(b: usize, hq: usize, hkv: usize, sq: usize, sk: usize, d: usize) -> Shape {
    Shape { b, hq, hkv, sq, sk, d, dv: d }
}

/// The awkward shapes plus what every tensor-core table adds: GQA ratio 8 and decoding rows, followed by
/// the table's own `extra` shapes.
pub fn tensor_core_shapes(extra: impl IntoIterator<Item = Shape>) -> Vec<Shape> {
    let mut v = shapes();
    v.extend([sh(1, 8, 1, 77, 300, 128), sh(2, 16, 2, 1, 1000, 64)]);
    v.extend(extra);
    v
}

/// Every mask kind for a shape: none, causal both alignments, a broadcast boolean mask, a full additive
/// mask.
pub fn masks(shape: &Shape) -> Vec<Mask> {
    vec![
        Mask::None,
        Mask::CausalTopLeft,
        Mask::CausalBottomRight,
        Mask::Explicit(ExplicitMask { values: MaskValues::Boolean, dims: [1, 1, shape.sq, shape.sk] }),
        Mask::Explicit(ExplicitMask::full(MaskValues::Additive, shape)),
    ]
}

/// The full table for one kernel and f32 math over `dtypes`.
pub fn cases(kernel: Kernel, f32_math: F32Math, dtypes: &[DType]) -> Vec<Case> {
    table(shapes(), masks, kernel, f32_math, dtypes)
}

/// Every shape of `shapes` with every mask of `masks(shape)`, both layouts and every dtype of `dtypes`, for
/// one kernel and f32 math.
pub fn table(
    shapes: Vec<Shape>,
    masks: impl Fn(&Shape) -> Vec<Mask>,
    kernel: Kernel,
    f32_math: F32Math,
    dtypes: &[DType],
) -> Vec<Case> {
    let mut out = Vec::new();
    for (si, shape) in shapes.into_iter().enumerate() {
        for mask in masks(&shape) {
            for layout in [Layout::Bhsd, Layout::Bshd] {
                for &dtype in dtypes {
                    // LSE on most cases; every fourth runs without it (the null-pointer path).
                    let lse = (si + out.len()) % 4 != 0;
                    out.push(Case { shape, dtype, mask, layout, kernel, f32_math, lse });
                }
            }
        }
    }
    out
}

/// Runs every case on inputs seeded `seed0 + n` (outputs poisoned), comparing with the reference and with the
/// unfused kernel's error on the same inputs (within twice it; both at the dtype's rounding floor count as
/// equal); with `expect`, the kernel that ran must be that one. Skips without a GPU; fails listing every case
/// that did not pass.
pub fn run_table_vs_unfused(name: &str, cases: &[Case], seed0: u64, expect: Option<Kernel>) {
    let Some(gpu) = gpu() else { return };
    run_table_on(&gpu, name, cases, seed0, expect);
}

/// [`run_table_vs_unfused`] on an open backend.
pub fn run_table_on(gpu: &CudaBackend, name: &str, cases: &[Case], seed0: u64, expect: Option<Kernel>) {
    let mut failures = Vec::new();
    let (mut worst, mut worst_vs_unfused): (f64, f64) = (0.0, 0.0);
    for (n, case) in cases.iter().enumerate() {
        let spec = case.spec();
        let inputs = HostInputs::random(&spec, seed0 + n as u64).expect("valid spec");
        let rows = rows_for(&case.shape);
        let run = match gpu.run_host(&spec, &case.opts(), &inputs) {
            Ok(run) => run,
            Err(e) => {
                failures.push(format!("{}: error: {e}", case.label()));
                continue;
            }
        };
        if expect.is_some_and(|k| k != run.kernel) || run.output.lse.is_some() != case.lse {
            let lse = run.output.lse.is_some();
            failures.push(format!("{}: ran {} (LSE returned: {lse}), expected {expect:?}", case.label(), run.kernel));
            continue;
        }
        let r = check_output(&spec, &inputs, &run.output, case.f32_math, rows).expect("checks");
        worst = worst.max(r.rel_err / r.tolerance);
        if !r.pass {
            failures.push(format!("{}: {r:?}", case.label()));
            continue;
        }
        let base = Case { kernel: Kernel::Unfused, ..case.clone() };
        match check_inputs(gpu, &base, &inputs, rows) {
            Ok(u) => {
                // Both at the output dtype's rounding floor counts as equal (2x of a near-zero error is noise).
                let floor = u.rel_err.max(case.dtype.unit_roundoff());
                worst_vs_unfused = worst_vs_unfused.max(r.rel_err / floor);
                if r.rel_err > 2.0 * floor {
                    failures.push(format!(
                        "{}: rel_err {:.3e} > 2 x unfused {:.3e}",
                        case.label(),
                        r.rel_err,
                        u.rel_err
                    ));
                }
            }
            Err(e) => failures.push(format!("{}: unfused baseline error: {e}", case.label())),
        }
    }
    eprintln!(
        "{name}: {} cases, {} failed, worst rel_err/tolerance {worst:.3}, worst rel_err/unfused {worst_vs_unfused:.2}",
        cases.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// Rows compared against the reference: all for small cases, a spread sample for big ones.
pub fn rows_for(shape: &Shape) -> Option<usize> {
    let work = shape.b * shape.hq * shape.sq * shape.sk * (shape.d + shape.dv);
    if work > 50_000_000 {
        Some(96)
    } else {
        None
    }
}

/// [`run_table_vs_unfused`] on an open backend, seeds from 5000, any kernel.
pub fn run_table(gpu: &CudaBackend, name: &str, cases: &[Case]) {
    run_table_on(gpu, name, cases, 5000, None);
}
