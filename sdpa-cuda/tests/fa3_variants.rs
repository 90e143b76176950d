//! `fa3`'s windows, softcap and ALiBi (kernels/fa3.cu `FA3_ENTRY_VAR`, written in session 9 without a GPU)
//! against the f64 reference on an sm_90 GPU: left windows, symmetric and one-sided ones, windows on causal
//! masks of both alignments, windows narrower than a tile and wider than Sk, windows that leave rows with no
//! key, softcap (logits up to about ±1e4), ALiBi (standard and given slopes, both diagonals), ALiBi with a
//! window, everything together; Sq != Sk both ways with lengths no multiple of any tile, GQA 1/2/4/8, both
//! layouts, f16 and bf16, with and without LSE, poisoned outputs (`run_host`), every head-dim class at least
//! once (64, 96, 128, 192/128, 160, 192, 224, 256), more query tiles than multiprocessors (blocks walk
//! several work tiles whose key ranges start at different tiles); NaN in values outside a row's window stays
//! out of that row. Every case asks for `fa3` by name and must report it as the kernel that ran, so a
//! fallback cannot pass.
//!
//! First run on the H100 in session 10 (`bench/results/gpu/variants.md`), which made them part of what
//! `fa3` takes. Skips (printing why)
//! without a GPU, and the kernel checks on a GPU other than compute capability 9.0 after checking that `fa3`
//! refuses it. `bench/studies/fa3/variants9/run.sh` runs it, again with `SDPA_FA3_GRID` forcing two blocks.

mod common;

use common::{gpu, rows_for, sh};
use sdpa_core::check::check_output;
use sdpa_core::reference::reference_attention;
use sdpa_core::{
    Alibi, AttentionSpec, DType, Diagonal, F32Math, HostBackend, HostInputs, Kernel, Layout, Mask, RunOptions,
    SdpaError, Shape, Variants, Window,
};
use sdpa_cuda::CudaBackend;

/// The GPU, or `None` (printing why): no GPU, or one that is not sm_90 (where fa3 must refuse the call).
fn hopper_with_variants() -> Option<CudaBackend> {
    let gpu = gpu()?;
    if gpu.info().compute_capability == (9, 0) {
        return Some(gpu);
    }
    let spec = AttentionSpec::new(sh(1, 2, 2, 64, 64, 64), DType::BF16).with_mask(Mask::CausalTopLeft);
    let spec = spec.with_window(Window::left(8));
    let inputs = HostInputs::random(&spec, 1).expect("valid");
    match gpu.run_host(&spec, &opts(true), &inputs) {
        Err(SdpaError::Unsupported { .. }) => {
            eprintln!("skipping fa3 variant checks: not a compute-capability 9.0 GPU")
        }
        other => panic!("fa3 on a GPU other than sm_90 must be refused, got {other:?}"),
    }
    None
}

fn opts(lse: bool) -> RunOptions {
    RunOptions { kernel: Kernel::Fa3, f32_math: F32Math::Exact, threads: None, lse }
}

/// A scale that takes the largest logits of random inputs (uniform in [-1, 1)) to about ±1e4, for softcap.
fn big_scale(d: usize) -> f64 {
    7500.0 / (d as f64).sqrt()
}

/// The variant configurations every shape runs: (mask, variants, big scale?).
fn configs(shape: &Shape, n: usize) -> Vec<(Mask, Variants, bool)> {
    let w = |l: Option<usize>, r: Option<usize>| Some(Window { left: l, right: r });
    let v = |window, softcap, alibi, diagonal| Variants { window, softcap, alibi, diagonal };
    let cap = [10.0, 30.0, 50.0][n % 3];
    let slopes: Vec<f32> = (0..shape.hq).map(|h| 0.02 + 0.5 * h as f32 / shape.hq as f32).collect();
    // Rows the window leaves empty: bottom-right with Sq > Sk puts the first rows' windows before key 0.
    let empty_rows = if shape.sq > shape.sk {
        v(w(Some(2), Some(0)), None, None, Some(Diagonal::BottomRight))
    } else {
        v(w(Some(1), Some(1)), None, None, Some(Diagonal::BottomRight))
    };
    let (tl, br) = (Some(Diagonal::TopLeft), Some(Diagonal::BottomRight));
    vec![
        // Left windows (Mistral): wider than a tile, and narrower than one on a causal mask.
        (Mask::None, v(w(Some(150), Some(0)), None, None, tl), false),
        (Mask::CausalBottomRight, v(w(Some(5), Some(0)), None, None, None), false),
        // Symmetric, and one-sided (right only, left only).
        (Mask::None, v(w(Some(64), Some(64)), None, None, br), false),
        (Mask::None, v(w(None, Some(3)), None, None, tl), false),
        (Mask::None, v(w(Some(200), None), None, None, br), false),
        // Windows on causal masks of both alignments.
        (Mask::CausalTopLeft, v(w(Some(100), None), None, None, None), false),
        (Mask::CausalBottomRight, v(w(Some(300), Some(0)), None, None, None), false),
        // Wider than Sk on both sides: every key tile, the plain loop.
        (Mask::None, v(w(Some(1 << 20), Some(1 << 20)), None, None, tl), false),
        (Mask::None, empty_rows, false),
        // Softcap alone (logits up to ±1e4) and on a windowed causal mask.
        (Mask::None, v(None, Some(cap), None, None), true),
        (Mask::CausalBottomRight, v(w(Some(33), Some(0)), Some(50.0), None, None), true),
        // ALiBi: standard on a causal mask, given slopes with no mask, on a window.
        (Mask::CausalTopLeft, v(None, None, Some(Alibi::Standard), None), false),
        (Mask::None, v(None, None, Some(Alibi::Slopes(slopes.clone())), br), false),
        (Mask::None, v(w(Some(40), Some(0)), None, Some(Alibi::Slopes(slopes)), tl), false),
        // Everything together on a symmetric window.
        (Mask::None, v(w(Some(70), Some(20)), Some(30.0), Some(Alibi::Standard), br), false),
    ]
}

/// Shapes: every head-dim class (exact and padded), Sq != Sk both ways, lengths off every tile (64-row Q
/// boxes, 128-, 112- and 80-key tiles), GQA, several key tiles so that windows skip leading and trailing
/// ones, and one call with more query tiles than an H100 has multiprocessors.
fn shapes() -> Vec<Shape> {
    let dims = |s: Shape, d: usize, dv: usize| Shape { d, dv, ..s };
    vec![
        sh(2, 4, 1, 77, 300, 64),                   // GQA 4, Sq < Sk, class 64
        dims(sh(1, 8, 2, 300, 1000, 96), 96, 96),   // GQA 4, eight key tiles, class 96
        sh(1, 4, 4, 129, 257, 128),                 // one row past a work tile, one key past two tiles
        dims(sh(2, 2, 2, 200, 130, 192), 192, 128), // Sq > Sk: MLA class 192/128
        dims(sh(1, 4, 2, 333, 517, 160), 152, 160), // class 160, D padded
        dims(sh(1, 2, 1, 400, 450, 192), 176, 176), // class 192 (112-key tiles), padded
        dims(sh(1, 2, 2, 150, 390, 224), 224, 224), // class 224
        sh(1, 8, 1, 700, 650, 256),                 // GQA 8, class 256 (80-key tiles)
        sh(3, 24, 6, 700, 1500, 128),               // 216 work tiles over 132 blocks
    ]
}

/// Runs one case against the reference (its output poisoned by `run_host`); pushes what went wrong onto
/// `failures` and returns the error as a fraction of the tolerance.
fn check_case(gpu: &CudaBackend, spec: &AttentionSpec, lse: bool, seed: u64, failures: &mut Vec<String>) -> f64 {
    let label = format!(
        "{} {} {} [{}] {} scale {:.3}{}",
        spec.dtype,
        spec.mask.name(),
        spec.layout().map_or("strided", |l| l.name()),
        spec.shape,
        spec.variants.label(spec.diagonal()),
        spec.scale(),
        if lse { " +lse" } else { "" }
    );
    let inputs = HostInputs::random(spec, seed).expect("valid spec");
    let run = match gpu.run_host(spec, &opts(lse), &inputs) {
        Ok(run) => run,
        Err(e) => {
            failures.push(format!("{label}: error: {e}"));
            return 0.0;
        }
    };
    if run.kernel != Kernel::Fa3 {
        failures.push(format!("{label}: ran {}", run.kernel));
    }
    if lse && run.output.lse.is_none() {
        failures.push(format!("{label}: LSE asked for, none returned"));
    }
    match check_output(spec, &inputs, &run.output, F32Math::Exact, rows_for(&spec.shape)) {
        Ok(r) => {
            if !r.pass {
                failures.push(format!("{label}: {r:?}"));
            }
            r.rel_err / r.tolerance
        }
        Err(e) => {
            failures.push(format!("{label}: check: {e}"));
            0.0
        }
    }
}

/// Every configuration on every shape, layouts and dtypes taking turns, every fourth case without LSE.
fn table() -> Vec<(AttentionSpec, bool)> {
    let mut out = Vec::new();
    for shape in shapes() {
        for (mask, variants, big) in configs(&shape, out.len()) {
            let n = out.len();
            let layout = if n % 2 == 0 { Layout::Bhsd } else { Layout::Bshd };
            let dtype = if (n / 2) % 2 == 0 { DType::BF16 } else { DType::F16 };
            let mut spec = AttentionSpec::new(shape, dtype).with_layout(layout).with_mask(mask).with_variants(variants);
            if big {
                spec = spec.with_scale(big_scale(shape.d));
            }
            out.push((spec, n % 4 != 3));
        }
    }
    out
}

/// The table's specs are valid and are variant calls `fa3` takes: checked
/// without a GPU, so the GPU run cannot fail on a malformed case.
#[test]
fn the_cases_are_valid_variant_calls() {
    for (spec, _) in table() {
        spec.validate().unwrap_or_else(|e| panic!("{}: {e}", spec.variants.label(spec.diagonal())));
        assert!(!spec.variants.is_plain());
        assert_eq!(sdpa_cuda::kernels::fa3::refuses(&spec), None, "{}", spec.shape);
    }
}

#[test]
fn fa3_variants_match_the_reference() {
    let Some(gpu) = hopper_with_variants() else { return };
    let mut failures = Vec::new();
    let (mut n, mut worst) = (0usize, 0.0f64);
    for (spec, lse) in table() {
        n += 1;
        worst = worst.max(check_case(&gpu, &spec, lse, 90_000 + n as u64, &mut failures));
    }
    eprintln!("fa3 variants: {n} cases, {} failed, worst error {worst:.3} of its tolerance", failures.len());
    assert!(failures.is_empty(), "{} of {n} cases failed:\n{}", failures.len(), failures.join("\n"));
}

/// Both dtypes on the same window, softcap and ALiBi call at D = 128 and 64, in both layouts: the pairs the
/// table above alternates, here side by side.
#[test]
fn fa3_variants_in_both_dtypes_and_layouts() {
    let Some(gpu) = hopper_with_variants() else { return };
    let mut failures = Vec::new();
    let mut n = 0u64;
    for d in [64, 128] {
        for dtype in [DType::F16, DType::BF16] {
            for layout in [Layout::Bhsd, Layout::Bshd] {
                let spec = AttentionSpec::new(sh(2, 8, 2, 513, 777, d), dtype)
                    .with_layout(layout)
                    .with_mask(Mask::CausalBottomRight)
                    .with_window(Window::left(256))
                    .with_softcap(30.0)
                    .with_alibi(Alibi::Standard);
                n += 1;
                check_case(&gpu, &spec, true, 91_000 + n, &mut failures);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// NaN in value rows outside a row's window must not reach it (fa3's per-warp repair recomputes rows with
/// the band, softcap and ALiBi), while rows that see it are NaN as in the reference. Key 150 lies in the
/// second 128-key tile, which the work tile loads and some of its rows do not see.
#[test]
fn fa3_nonfinite_values_outside_the_window_stay_outside() {
    let Some(gpu) = hopper_with_variants() else { return };
    let shape = sh(1, 4, 2, 300, 300, 128);
    for dtype in [DType::F16, DType::BF16] {
        let spec = AttentionSpec::new(shape, dtype)
            .with_mask(Mask::CausalBottomRight)
            .with_window(Window::left(16))
            .with_softcap(30.0)
            .with_alibi(Alibi::Standard);
        let mut inputs = HostInputs::random(&spec, 9).expect("valid");
        let key = 150;
        inputs.v.set_f32(spec.v_strides.offset(0, 0, key) + 3, f32::NAN);
        inputs.v.set_f32(spec.v_strides.offset(0, shape.hkv - 1, key) + 1, f32::NAN);
        let want = reference_attention(&spec, &inputs).expect("reference");
        let bad_rows = want.o.chunks(shape.dv).filter(|r| r.iter().any(|x| x.is_nan())).count();
        let rows = shape.b * shape.hq * shape.sq;
        assert!(bad_rows > 0 && bad_rows < rows, "{bad_rows} of {rows} rows poisoned");
        let run = gpu.run_host(&spec, &opts(true), &inputs).expect("runs");
        assert_eq!(run.kernel, Kernel::Fa3);
        let r = check_output(&spec, &inputs, &run.output, F32Math::Exact, None).expect("checks");
        assert!(r.pass, "{dtype}: {r:?}");
    }
}

/// Small calls for compute-sanitizer (`bench/studies/fa3/variants9/run.sh` runs this test alone under
/// memcheck, racecheck and synccheck with `SDPA_FA3_GRID=2,1`: two persistent blocks walking several work
/// tiles each, so the ring and the turns carry across tiles whose key ranges start at different tiles):
/// classes 64, 128, 192/128 and 256, a window on a causal mask with softcap and ALiBi, a symmetric window and
/// a left window with ALiBi, each checked against the reference.
#[test]
fn small_variant_calls_for_the_sanitizer() {
    let Some(gpu) = hopper_with_variants() else { return };
    let mut failures = Vec::new();
    let mut n = 0u64;
    let mla = Shape { dv: 128, ..sh(1, 2, 2, 160, 200, 192) };
    for shape in [sh(1, 2, 1, 300, 420, 64), sh(1, 2, 2, 200, 300, 128), mla, sh(1, 2, 1, 150, 250, 256)] {
        let specs = [
            AttentionSpec::new(shape, DType::BF16)
                .with_mask(Mask::CausalBottomRight)
                .with_window(Window::left(40))
                .with_softcap(30.0)
                .with_alibi(Alibi::Standard),
            AttentionSpec::new(shape, DType::F16)
                .with_window(Window { left: Some(64), right: Some(64) })
                .with_diagonal(Diagonal::TopLeft),
            AttentionSpec::new(shape, DType::BF16)
                .with_layout(Layout::Bshd)
                .with_window(Window::left(100))
                .with_alibi(Alibi::Standard)
                .with_diagonal(Diagonal::TopLeft),
        ];
        for spec in specs {
            n += 1;
            check_case(&gpu, &spec, true, 92_000 + n, &mut failures);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
