//! `fa3` with FP8 (E4M3) inputs and per-tensor descales (kernels/fa3_fp8.cuh) on an sm_90 GPU: against the
//! f64 reference on random E4M3 data spread over the format's range by descales that differ per tensor
//! (never zeros), NaN-poisoned outputs (bf16), lengths that are no multiple of any tile, Sq != Sk both
//! ways, GQA 1/4/8, decoding rows, no mask and causal in both alignments (rows that see no key included),
//! both layouts, with and without LSE, the three head-dim classes (64, 128, 256) exact and padded (32, 96,
//! 192), more query tiles than multiprocessors. The tolerance is `sdpa_core::check::tolerance(F8E4M3)`
//! (8e-2, derived there from P's rounding to E4M3). Beside it, the accuracy against bf16: FP8 and bf16
//! `fa3` on the same draws (rounded to each format), both against the f64 reference of the bf16 inputs,
//! printed and bounded. Windows, softcap and ALiBi on FP8 (session 24) likewise, in both V layouts, behind their
//! verification switch `SDPA_FA3_FP8_VARIANTS=1` (without it, refused naming it). What does not take FP8 refuses
//! it with the reason. Skips (printing why) without a GPU or on a GPU other than compute capability 9.0 (after
//! checking that FP8 is refused there).

mod common;

use common::{gpu, rows_for, sh, Case};
use sdpa_core::check::check_output;
use sdpa_core::{
    reference_attention, AttentionSpec, DType, Descale, F32Math, HostBackend, HostInputs, Kernel, Layout, Mask,
    SdpaError, Shape,
};
use sdpa_cuda::CudaBackend;

/// Descales that map the draws (uniform, |x| < sqrt(3)) onto most of the E4M3 range without saturating any,
/// different per tensor so that a factor applied to the wrong operand shows.
fn descales() -> Descale {
    let full = Descale::for_amax(3f32.sqrt());
    Descale { q: full, k: 2.0 * full, v: 1.5 * full }
}

fn fp8_spec(case: &Case) -> AttentionSpec {
    case.spec().with_descale(descales())
}

fn hopper(gpu: &CudaBackend) -> bool {
    if gpu.info().compute_capability == (9, 0) {
        return true;
    }
    let case =
        Case::new(sh(1, 2, 2, 64, 64, 64), DType::F8E4M3, Mask::None, Layout::Bhsd, Kernel::Auto, F32Math::Exact);
    let inputs = HostInputs::random(&fp8_spec(&case), 1).expect("valid");
    match gpu.run_host(&fp8_spec(&case), &case.opts(), &inputs) {
        Err(SdpaError::Unsupported { .. }) => eprintln!("skipping fa3 FP8 checks: not a compute-capability 9.0 GPU"),
        other => panic!("FP8 on a GPU other than sm_90 must be refused, got {other:?}"),
    }
    false
}

fn shapes() -> Vec<Shape> {
    let dv = |s: Shape, dv: usize| Shape { dv, ..s };
    vec![
        sh(1, 2, 2, 1, 1, 64),
        sh(2, 4, 1, 77, 130, 64),     // GQA 4, Sq < Sk, a partial key tile and a second one
        sh(1, 8, 1, 130, 77, 128),    // GQA 8, Sq > Sk: bottom-right rows that see no key
        sh(1, 4, 4, 129, 257, 128),   // one row past a block, one key past two tiles
        sh(1, 8, 2, 1000, 1000, 128), // GQA 4, eight key tiles: the ring wraps
        sh(1, 2, 2, 513, 2049, 64),   // 17 key tiles, the last of one key
        sh(2, 16, 2, 1, 1000, 64),    // decoding rows
        sh(1, 4, 2, 300, 333, 256),   // class 256
        sh(1, 2, 2, 200, 190, 32),    // class 64, half of its columns padding
        sh(1, 2, 1, 150, 260, 96),    // class 128 padded
        dv(sh(1, 2, 2, 100, 140, 192), 128), // class 256, Dv below D
        sh(3, 24, 6, 300, 400, 64),   // more query tiles than SMs: persistent blocks walk several
    ]
}

#[test]
fn fp8_matches_the_reference() {
    let Some(gpu) = gpu() else { return };
    if !hopper(&gpu) {
        return;
    }
    let mut failures = Vec::new();
    let (mut n, mut worst, mut worst_rel) = (0usize, 0.0f64, 0.0f64);
    for shape in shapes() {
        for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight] {
            for layout in [Layout::Bhsd, Layout::Bshd] {
                // `auto` must take fa3 for FP8 as asking for it does.
                let kernel = if n % 3 == 0 { Kernel::Auto } else { Kernel::Fa3 };
                let mut case = Case::new(shape, DType::F8E4M3, mask, layout, kernel, F32Math::Exact);
                case.lse = n % 4 != 0;
                n += 1;
                let spec = fp8_spec(&case);
                let inputs = HostInputs::random(&spec, 31_000 + n as u64).expect("valid spec");
                let run = match gpu.run_host(&spec, &case.opts(), &inputs) {
                    Ok(run) => run,
                    Err(e) => {
                        failures.push(format!("{}: error: {e}", case.label()));
                        continue;
                    }
                };
                if run.kernel != Kernel::Fa3 {
                    failures.push(format!("{}: ran {}", case.label(), run.kernel));
                }
                if run.output.o.dtype() != DType::BF16 {
                    failures.push(format!("{}: O is {}, not bf16", case.label(), run.output.o.dtype()));
                }
                if case.lse != run.output.lse.is_some() {
                    failures.push(format!("{}: LSE asked for: {}, returned: {}", case.label(), case.lse, !case.lse));
                }
                match check_output(&spec, &inputs, &run.output, F32Math::Exact, rows_for(&shape)) {
                    Ok(r) => {
                        if !r.pass {
                            failures.push(format!("{}: {r:?}", case.label()));
                        }
                        worst = worst.max(r.rel_err / r.tolerance);
                        worst_rel = worst_rel.max(r.rel_err);
                    }
                    Err(e) => failures.push(format!("{}: check: {e}", case.label())),
                }
            }
        }
    }
    eprintln!(
        "fa3 fp8: {n} cases, {} failed, worst relative error {worst_rel:.4} ({worst:.3} of the tolerance 8e-2)",
        failures.len()
    );
    assert!(failures.is_empty(), "{} of {n} cases failed:\n{}", failures.len(), failures.join("\n"));
}

/// Windows, softcap and ALiBi on FP8 inputs (`FA3_ENTRY_VAR` over E4M3 scores; session 24): left windows on
/// causal masks and alone, symmetric and one-sided ones, a window that leaves rows with no key, softcap with
/// logits up to about ±1e4 (the descales folded into its constants), ALiBi (standard and given slopes, both
/// diagonals), everything together; the three FP8 classes (64 padded from 32, 128, 256 with Dv below D), GQA,
/// Sq != Sk both ways, both layouts, LSE on and off. Calls whose V tiles many work tiles share take the pre-pass's
/// Vᵀ (GQA 4 over eight query tiles without a window; a 600-key window over 16 query tiles, whose first work
/// tiles start past key tile 0), the others the kernel's transpose (`fa3::fp8_transposes_in_kernel`): both
/// layouts must run; `SDPA_FA3_AB=vt-kernel` or `vt-prepass` forces either for every case. Behind
/// `SDPA_FA3_FP8_VARIANTS=1` (`fa3::FP8_VARIANTS_SWITCH`); without it each call must be refused naming it.
#[test]
fn fp8_variants_match_the_reference() {
    use sdpa_core::{Alibi, Diagonal, Variants, Window};
    use sdpa_cuda::kernels::fa3;
    let Some(gpu) = gpu() else { return };
    if !hopper(&gpu) {
        return;
    }
    let enabled = fa3::fp8_variants_enabled();
    if !enabled {
        eprintln!("fa3 fp8 variants: {}=1 is not set, checking that they are refused", fa3::FP8_VARIANTS_SWITCH);
    }
    let w = |l: Option<usize>, r: Option<usize>| Some(Window { left: l, right: r });
    let v = |window, softcap, alibi, diagonal| Variants { window, softcap, alibi, diagonal };
    let (tl, br) = (Some(Diagonal::TopLeft), Some(Diagonal::BottomRight));
    let shapes = [
        sh(2, 4, 1, 77, 300, 32),                        // GQA 4, Sq < Sk, class 64 padded
        sh(1, 8, 2, 1000, 1000, 128),                    // GQA 4, eight query tiles: both layouts
        Shape { dv: 128, ..sh(1, 4, 2, 300, 190, 256) }, // Sq > Sk, class 256 with Dv below D
    ];
    // (shape, mask, variants, big scale) of every case.
    let mut cases = Vec::new();
    for shape in shapes {
        let slopes: Vec<f32> = (0..shape.hq).map(|h| 0.02 + 0.5 * h as f32 / shape.hq as f32).collect();
        let configs = [
            (Mask::CausalBottomRight, v(w(Some(150), Some(0)), None, None, None), false),
            (Mask::None, v(w(Some(5), Some(0)), None, None, tl), false),
            (Mask::None, v(w(Some(64), Some(64)), None, None, br), false),
            (Mask::None, v(w(None, Some(3)), None, None, tl), false),
            (Mask::CausalTopLeft, v(w(Some(100), None), None, None, None), false),
            (Mask::None, v(w(Some(2), Some(0)), None, None, br), false), // Sq > Sk: rows with no key
            (Mask::None, v(None, Some(30.0), None, None), true),
            (Mask::CausalBottomRight, v(w(Some(33), Some(0)), Some(50.0), None, None), true),
            (Mask::CausalTopLeft, v(None, None, Some(Alibi::Standard), None), false),
            (Mask::None, v(None, None, Some(Alibi::Slopes(slopes.clone())), br), false),
            (Mask::None, v(w(Some(70), Some(20)), Some(30.0), Some(Alibi::Standard), br), false),
        ];
        cases.extend(configs.into_iter().map(|(mask, variants, big)| (shape, mask, variants, big)));
    }
    // A window over 16 query tiles of GQA 4: the pre-pass's layout (7 query tiles x 4 heads a V tile), work tiles
    // whose keys start past tile 0, consumers releasing leading tiles unread, rows with no key (Sq > Sk).
    cases.push((sh(1, 8, 2, 2000, 1000, 128), Mask::None, v(w(Some(600), Some(0)), None, None, br), false));
    let mut failures = Vec::new();
    let (mut n, mut in_kernel) = (0usize, 0usize);
    for (shape, mask, variants, big) in cases {
        let layout = if n.is_multiple_of(2) { Layout::Bhsd } else { Layout::Bshd };
        let mut case = Case::new(shape, DType::F8E4M3, mask, layout, Kernel::Fa3, F32Math::Exact);
        case.lse = !n.is_multiple_of(3);
        n += 1;
        let mut spec = fp8_spec(&case).with_variants(variants);
        if big {
            // Logits up to about ±1e4 (the draws' products, times the descales, times this scale).
            spec = spec.with_scale(7500.0 / (shape.d as f64).sqrt());
        }
        in_kernel += usize::from(fa3::fp8_transposes_in_kernel(&spec));
        let label = format!("{} {}", case.label(), spec.variants.label(spec.diagonal()));
        let inputs = HostInputs::random(&spec, 52_000 + n as u64).expect("valid spec");
        match gpu.run_host(&spec, &case.opts(), &inputs) {
            Err(SdpaError::Unsupported { what, .. }) if !enabled && what.contains(fa3::FP8_VARIANTS_SWITCH) => {}
            _ if !enabled => failures.push(format!("{label}: not refused naming {}", fa3::FP8_VARIANTS_SWITCH)),
            Ok(run) if run.kernel != Kernel::Fa3 => failures.push(format!("{label}: ran {}", run.kernel)),
            Ok(run) if run.output.o.dtype() != DType::BF16 || case.lse != run.output.lse.is_some() => failures
                .push(format!("{label}: O is {}, LSE returned: {}", run.output.o.dtype(), run.output.lse.is_some())),
            Ok(run) => match check_output(&spec, &inputs, &run.output, F32Math::Exact, rows_for(&shape)) {
                Ok(r) if r.pass => {}
                Ok(r) => failures.push(format!("{label}: {r:?}")),
                Err(e) => failures.push(format!("{label}: check: {e}")),
            },
            Err(e) => failures.push(format!("{label}: error: {e}")),
        }
    }
    // The product's rule sends some cases each way (the switches override it when set).
    assert!(in_kernel > 0 && in_kernel < n, "{in_kernel} of {n} cases transpose V in the kernel");
    eprintln!("fa3 fp8 variants: {n} cases ({in_kernel} with V transposed in the kernel), {} failed", failures.len());
    assert!(failures.is_empty(), "{} of {n} cases failed:\n{}", failures.len(), failures.join("\n"));
}

/// Relative L2 difference of two outputs in logical order.
fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}

/// O of a run in logical `[B, Hq, Sq, Dv]` order (the reference's), from the spec's strides.
fn logical(spec: &AttentionSpec, o: &sdpa_core::HostBuffer) -> Vec<f64> {
    let s = spec.shape;
    let mut out = Vec::with_capacity(s.b * s.hq * s.sq * s.dv);
    for row in 0..s.b * s.hq * s.sq {
        let (b, h, i) = spec.row_coords(row);
        let off = spec.o_offset(&spec.seq(b), b, h, i);
        out.extend((0..s.dv).map(|c| o.get_f64(off + c)));
    }
    out
}

/// FP8 against bf16 on the same draws (HostInputs::random draws the same values for both dtypes and rounds
/// them to each): the bf16 kernel's error and the FP8 kernel's error against the f64 reference of the bf16
/// inputs (FP8's own input quantization included), and the FP8 kernel against its own inputs' reference.
/// Printed for the report; bounded so that a broken descale or permutation fails.
#[test]
fn fp8_accuracy_against_bf16() {
    let Some(gpu) = gpu() else { return };
    if !hopper(&gpu) {
        return;
    }
    for (shape, mask) in [
        (sh(2, 8, 8, 1024, 1024, 128), Mask::None),
        (sh(2, 8, 2, 1024, 1024, 64), Mask::CausalBottomRight),
        (sh(1, 4, 4, 512, 768, 256), Mask::None),
    ] {
        let case = Case::new(shape, DType::F8E4M3, mask, Layout::Bhsd, Kernel::Fa3, F32Math::Exact);
        let f8 = fp8_spec(&case);
        let b16 = AttentionSpec { dtype: DType::BF16, descale: None, ..f8.clone() };
        let (in8, in16) = (HostInputs::random(&f8, 77).expect("valid"), HostInputs::random(&b16, 77).expect("valid"));
        let run8 = gpu.run_host(&f8, &case.opts(), &in8).expect("fp8 runs");
        let run16 = gpu.run_host(&b16, &case.opts(), &in16).expect("bf16 runs");
        let ref8 = reference_attention(&f8, &in8).expect("reference").o;
        let ref16 = reference_attention(&b16, &in16).expect("reference").o;
        let (o8, o16) = (logical(&f8, &run8.output.o), logical(&b16, &run16.output.o));
        let e8_own = rel_l2(&o8, &ref8);
        let e8 = rel_l2(&o8, &ref16);
        let e16 = rel_l2(&o16, &ref16);
        let between = rel_l2(&o8, &o16);
        eprintln!(
            "fa3 fp8 vs bf16 [{shape} {}]: fp8 vs its f64 reference {e8_own:.4}; against the f64 reference of the \
             bf16 inputs: fp8 {e8:.4}, bf16 {e16:.4}; fp8 vs bf16 output {between:.4}",
            mask.name()
        );
        assert!(e8_own <= 8e-2, "fp8 against its own reference: {e8_own}");
        // E4M3 inputs: relative error up to 2^-4 per element of Q, K and V (RMS about 2^-4/sqrt(3) = 3.6e-2
        // each, V's and the scores' adding up) on top of P's; 0.15 is well above what that gives on random
        // data and far below a wrong descale or key order (errors of order 1). A descale that saturates
        // (values past 448) breaks it: the first device run, with V's factor at half the range, measured 0.35.
        assert!(e8 <= 0.15, "fp8 against the bf16 inputs' reference: {e8}");
        assert!(e16 <= 1.6e-2, "bf16: {e16}");
    }
}

/// Kernels other than fa3 refuse FP8 inputs with the reason, as does the backward pass.
#[test]
fn what_does_not_take_fp8_refuses_it() {
    let Some(gpu) = gpu() else { return };
    let shape = sh(1, 2, 2, 64, 64, 64);
    for kernel in [Kernel::Fa2, Kernel::Fa1, Kernel::Unfused, Kernel::SplitKv] {
        let case = Case::new(shape, DType::F8E4M3, Mask::None, Layout::Bhsd, kernel, F32Math::Exact);
        let spec = fp8_spec(&case);
        let inputs = HostInputs::random(&spec, 3).expect("valid");
        match gpu.run_host(&spec, &case.opts(), &inputs) {
            Err(SdpaError::Unsupported { what, .. }) => assert!(what.contains("f8e4m3"), "{kernel}: {what}"),
            other => panic!("{kernel} with f8e4m3 must be refused, got {other:?}"),
        }
    }
    // Head dims fa3 has no FP8 class for.
    let odd = Case::new(sh(1, 2, 2, 64, 64, 40), DType::F8E4M3, Mask::None, Layout::Bhsd, Kernel::Fa3, F32Math::Exact);
    let spec = fp8_spec(&odd);
    let inputs = HostInputs::random(&spec, 3).expect("valid");
    match gpu.run_host(&spec, &odd.opts(), &inputs) {
        Err(SdpaError::Unsupported { what, .. }) => assert!(what.contains("multiples of 16"), "{what}"),
        other => panic!("D = 40 with f8e4m3 must be refused, got {other:?}"),
    }
}

/// More (batch, kv head) pairs than one grid dimension holds (65535), GQA 2, causal, the class 64 padded from
/// 16: the product (V transposed inside the kernel, no such bound) takes it and matches the reference; under
/// `SDPA_FA3_AB=vt-prepass` the Vᵀ pre-pass (one grid row per pair) refuses it before allocating its workspace.
#[test]
fn fp8_past_the_pre_pass_grid_is_taken_in_the_kernel_or_refused_by_the_pre_pass() {
    let Some(gpu) = gpu() else { return };
    if !hopper(&gpu) {
        return;
    }
    let shape = sh(1, 2 * 70_000, 70_000, 5, 7, 16);
    let case = Case::new(shape, DType::F8E4M3, Mask::CausalBottomRight, Layout::Bhsd, Kernel::Fa3, F32Math::Exact);
    let spec = fp8_spec(&case);
    let inputs = HostInputs::random(&spec, 4242).expect("valid spec");
    let prepass = std::env::var("SDPA_FA3_AB").is_ok_and(|v| v.split(',').any(|x| x.trim() == "vt-prepass"));
    match gpu.run_host(&spec, &case.opts(), &inputs) {
        Ok(run) if !prepass => {
            let r = check_output(&spec, &inputs, &run.output, F32Math::Exact, None).expect("checks");
            assert!(r.pass, "{}: {r:?}", case.label());
        }
        Err(SdpaError::Unsupported { what, .. }) if prepass => assert!(what.contains("65535"), "{what}"),
        other => panic!("{} (vt-prepass: {prepass}): {:?}", case.label(), other.map(|r| r.kernel)),
    }
}

/// Small FP8 calls of every class for compute-sanitizer (fa3_fp8_run.sh runs this test under memcheck,
/// racecheck and synccheck with `SDPA_FA3_GRID=2,1`, so that each persistent block walks several tiles):
/// the transposing warps' partial staged tiles and boxes (under `SDPA_FA3_AB=vt-prepass` the Vᵀ pre-pass with
/// partial 64-key and 64-column blocks instead), and the kernel at 64 (padded from 32), 128 and 256 (Dv below
/// D), causal in both alignments and not, both layouts; the variant entries with a window and softcap (leading
/// and trailing tiles released unread) and with ALiBi on a causal mask.
#[test]
fn small_calls_for_the_sanitizer() {
    use sdpa_core::{Alibi, Diagonal, Variants, Window};
    let Some(gpu) = gpu() else { return };
    if !hopper(&gpu) {
        return;
    }
    let plain = Variants::default();
    // Over 300 keys, rows 0..63 see none of key tile 2 and rows 256.. none of key tile 0: tiles skipped both ends.
    let windowed = Variants {
        window: Some(Window { left: Some(40), right: Some(10) }),
        softcap: Some(30.0),
        diagonal: Some(Diagonal::BottomRight),
        ..Variants::default()
    };
    let alibi = Variants { alibi: Some(Alibi::Standard), ..Variants::default() };
    let calls = [
        (sh(1, 4, 1, 70, 200, 128), Mask::CausalTopLeft, Layout::Bhsd, plain.clone()),
        (sh(1, 2, 2, 33, 300, 64), Mask::CausalBottomRight, Layout::Bshd, plain.clone()),
        (sh(1, 2, 1, 130, 100, 32), Mask::None, Layout::Bhsd, plain.clone()),
        (Shape { dv: 192, ..sh(1, 2, 1, 70, 150, 256) }, Mask::CausalBottomRight, Layout::Bshd, plain.clone()),
        (sh(1, 2, 2, 140, 150, 256), Mask::None, Layout::Bhsd, plain),
        (sh(1, 4, 2, 300, 300, 128), Mask::None, Layout::Bshd, windowed),
        (sh(1, 2, 2, 150, 140, 256), Mask::CausalTopLeft, Layout::Bhsd, alibi),
    ];
    for (n, (shape, mask, layout, variants)) in calls.into_iter().enumerate() {
        if !variants.is_plain() && !sdpa_cuda::kernels::fa3::fp8_variants_enabled() {
            eprintln!("skipping an FP8 variant call: SDPA_FA3_FP8_VARIANTS=1 is not set");
            continue;
        }
        let case = Case::new(shape, DType::F8E4M3, mask, layout, Kernel::Fa3, F32Math::Exact);
        let spec = fp8_spec(&case).with_variants(variants);
        let inputs = HostInputs::random(&spec, 90 + n as u64).expect("valid");
        let run = gpu.run_host(&spec, &case.opts(), &inputs).expect("runs");
        assert_eq!(run.kernel, Kernel::Fa3, "{}", case.label());
        let r = check_output(&spec, &inputs, &run.output, F32Math::Exact, None).expect("checks");
        assert!(r.pass, "{}: {r:?}", case.label());
    }
}
