//! Windows, softcap and ALiBi (issue 22) on every CUDA family against the f64 reference: `fa2` over every
//! head-dim class (exact and padded, Dv != D), `splitkv` decoding long keys through narrow windows, `fa1`
//! (f32 exactly in SIMT, f16/bf16 on its tensor-core and SIMT variants) and `unfused`; windows narrower than
//! a tile, wider than Sk, one-sided, leaving rows empty; caps 1..100 with logits up to ±1e4; ALiBi standard
//! and given slopes with long keys; each combined with causal masks of both alignments and with explicit
//! masks, GQA, both layouts, LSE, poisoned outputs (`run_host`), NaN/inf under keys outside the window. The
//! TF32 path refuses variants and `auto` never sends them there. Skips (printing why) without a GPU.

mod common;

use common::{gpu, sh};
use sdpa_core::check::{check_output, CheckReport};
use sdpa_core::reference::reference_attention;
use sdpa_core::{
    Alibi, AttentionSpec, DType, Diagonal, ExplicitMask, F32Math, HostBackend, HostBuffer, HostInputs, HostOutput,
    Kernel, Layout, Mask, MaskValues, RunOptions, SdpaError, Shape, Variants, Window,
};
use sdpa_cuda::CudaBackend;

/// One variant call: the spec (shape, dtype, layout, mask, variants, scale) and the kernel asked for.
#[derive(Debug, Clone)]
struct VCase {
    spec: AttentionSpec,
    kernel: Kernel,
    f32_math: F32Math,
    lse: bool,
}

impl VCase {
    fn opts(&self) -> RunOptions {
        RunOptions { kernel: self.kernel, f32_math: self.f32_math, threads: None, lse: self.lse }
    }

    fn label(&self) -> String {
        let s = &self.spec;
        format!(
            "{} {} {} {} [{}] {} scale {:.3}",
            self.kernel,
            s.dtype,
            s.mask.name(),
            s.layout().map_or("strided", |l| l.name()),
            s.shape,
            s.variants.label(s.diagonal()),
            s.scale()
        )
    }
}

/// A scale that takes the largest logits of random inputs (uniform in [-1, 1): |q·k| up to about
/// 4·sqrt(D)/3) to about ±1e4, for the softcap cases.
fn big_scale(d: usize) -> f64 {
    7500.0 / (d as f64).sqrt()
}

/// The variant configurations every kernel runs on a shape: (mask, variants, big scale?).
fn configs(shape: &Shape, n: usize) -> Vec<(Mask, Variants, bool)> {
    let w = |l: Option<usize>, r: Option<usize>| Some(Window { left: l, right: r });
    let v = |window, softcap, alibi, diagonal| Variants { window, softcap, alibi, diagonal };
    let cap = [1.0, 10.0, 50.0, 100.0][n % 4];
    let slopes: Vec<f32> = (0..shape.hq).map(|h| 0.02 + 0.5 * h as f32 / shape.hq as f32).collect();
    let full = Mask::Explicit(ExplicitMask::full(MaskValues::Additive, shape));
    let broadcast = Mask::Explicit(ExplicitMask { values: MaskValues::Boolean, dims: [1, 1, shape.sq, shape.sk] });
    // Rows the window leaves empty: bottom-right with Sq > Sk puts the first diagonals before key 0; top-left
    // with Sq > Sk + 3 puts the last rows' windows past the keys.
    let empty_rows = if shape.sq > shape.sk {
        v(w(Some(2), Some(0)), None, None, Some(Diagonal::BottomRight))
    } else {
        v(w(Some(1), Some(1)), None, None, Some(Diagonal::BottomRight))
    };
    vec![
        // Narrower than any tile, Mistral-style, on a causal mask.
        (Mask::CausalBottomRight, v(w(Some(5), Some(0)), None, None, None), false),
        // One-sided: right only (no mask), left only (no mask).
        (Mask::None, v(w(None, Some(3)), None, None, Some(Diagonal::TopLeft)), false),
        (Mask::None, v(w(Some(20), None), None, None, Some(Diagonal::BottomRight)), false),
        // Wider than Sk on both sides: the same as the causal mask alone.
        (Mask::CausalTopLeft, v(w(Some(1 << 20), Some(1 << 20)), None, None, None), false),
        (Mask::None, empty_rows, false),
        // Softcap alone and on a causal mask, logits up to ±1e4.
        (Mask::None, v(None, Some(cap), None, None), true),
        (Mask::CausalBottomRight, v(w(Some(33), Some(0)), Some(50.0), None, None), true),
        // ALiBi: standard on a causal mask, given slopes (up to 0.5) with no mask.
        (Mask::CausalTopLeft, v(None, None, Some(Alibi::Standard), None), false),
        (Mask::None, v(None, None, Some(Alibi::Slopes(slopes.clone())), Some(Diagonal::BottomRight)), false),
        // ALiBi on a window ending at the diagonal (fa2 splits the bias into a key part and a row part there).
        (Mask::None, v(w(Some(40), Some(0)), None, Some(Alibi::Slopes(slopes)), Some(Diagonal::TopLeft)), false),
        // Everything together on an explicit mask; a window with a broadcast boolean mask.
        (full, v(w(Some(30), Some(10)), Some(30.0), Some(Alibi::Standard), Some(Diagonal::TopLeft)), false),
        (broadcast, v(w(Some(7), Some(0)), None, None, Some(Diagonal::BottomRight)), false),
    ]
}

/// Every configuration on every shape for `kernel`, dtypes and layouts taking turns (every fourth without
/// LSE).
fn table(shapes: &[Shape], kernel: Kernel, dtypes: &[DType]) -> Vec<VCase> {
    let mut out = Vec::new();
    for shape in shapes {
        for (mask, variants, big) in configs(shape, out.len()) {
            let n = out.len();
            let layout = if n % 2 == 0 { Layout::Bhsd } else { Layout::Bshd };
            let dtype = dtypes[(n / 2) % dtypes.len()];
            let mut spec =
                AttentionSpec::new(*shape, dtype).with_layout(layout).with_mask(mask).with_variants(variants);
            if big {
                spec = spec.with_scale(big_scale(shape.d));
            }
            out.push(VCase { spec, kernel, f32_math: F32Math::Exact, lse: n % 4 != 3 });
        }
    }
    out
}

/// Runs a case on random inputs (seeded), returning the kernel that ran and the comparison.
fn run_inputs(gpu: &CudaBackend, c: &VCase, inputs: &HostInputs) -> Result<(Kernel, CheckReport), SdpaError> {
    let run = gpu.run_host(&c.spec, &c.opts(), inputs)?;
    if c.lse {
        assert!(run.output.lse.is_some(), "{}: LSE asked for but not returned", c.label());
    }
    let rows = (c.spec.shape.b * c.spec.shape.hq * c.spec.shape.sq * c.spec.shape.sk > 20_000_000).then_some(96);
    Ok((run.kernel, check_output(&c.spec, inputs, &run.output, c.f32_math, rows)?))
}

/// Runs every case (after one parallel warm-up of their programs), asserting that each passes on the kernel
/// `expect` says (when given).
fn run_table(name: &str, cases: &[VCase], expect: Option<Kernel>) {
    let Some(gpu) = gpu() else { return };
    let calls: Vec<(AttentionSpec, RunOptions)> = cases.iter().map(|c| (c.spec.clone(), c.opts())).collect();
    let warmed = gpu.warm_up(&calls).expect("warm-up");
    assert!(warmed.skipped.is_empty(), "{name}: calls the backend refuses: {:?}", warmed.skipped);
    let mut failures = Vec::new();
    let mut worst: f64 = 0.0;
    for (n, c) in cases.iter().enumerate() {
        let inputs = HostInputs::random(&c.spec, 22_000 + n as u64).expect("valid spec");
        match run_inputs(&gpu, c, &inputs) {
            Err(e) => failures.push(format!("{}: error: {e}", c.label())),
            Ok((ran, r)) => {
                worst = worst.max(r.rel_err / r.tolerance);
                if !r.pass {
                    failures.push(format!("{}: {r:?}", c.label()));
                } else if expect.is_some_and(|k| k != ran) {
                    failures.push(format!("{}: ran {ran}", c.label()));
                }
            }
        }
    }
    eprintln!("{name}: {} cases, worst error {worst:.3} of tolerance", cases.len());
    assert!(failures.is_empty(), "{name}: {} of {} failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

const HALF: [DType; 2] = [DType::F16, DType::BF16];

#[test]
fn fa2_honours_variants_in_every_head_dim_class() {
    // Every class exact, padded ones (40 -> 64, 80 -> 96, 248 -> 256), the MLA pair and unequal head dims,
    // lengths off every tile, Sq != Sk both ways, GQA.
    let shapes = [
        sh(1, 4, 2, 77, 130, 32),
        sh(2, 4, 2, 130, 77, 40),
        sh(1, 8, 2, 129, 257, 64),
        sh(1, 4, 4, 100, 200, 80),
        sh(1, 4, 1, 65, 100, 96),
        sh(1, 8, 2, 200, 333, 128),
        sh(1, 4, 4, 100, 70, 160),
        Shape { dv: 128, ..sh(1, 4, 2, 70, 90, 192) },
        sh(1, 2, 2, 90, 90, 224),
        sh(1, 2, 1, 70, 90, 256),
        sh(1, 2, 2, 65, 33, 248),
        // Long keys: the window's tiles skip most of them; ALiBi over 4k keys.
        sh(1, 4, 1, 300, 4100, 128),
    ];
    run_table("fa2", &table(&shapes, Kernel::Fa2, &HALF), Some(Kernel::Fa2));
}

#[test]
fn splitkv_decodes_long_keys_through_narrow_windows() {
    let w = |l| Some(Window { left: Some(l), right: Some(0) });
    let v = |window, softcap, alibi| Variants { window, softcap, alibi, diagonal: None };
    let mut cases = Vec::new();
    // (shape, window, softcap, alibi); decoding rows (group·Sq <= 64) on long keys, the mask causal-br.
    let rows = [
        (sh(1, 32, 8, 1, 40000, 128), w(256), None, None),
        (sh(2, 8, 2, 3, 9000, 64), w(1000), None, Some(Alibi::Standard)),
        (sh(1, 16, 4, 1, 20000, 80), w(100), Some(50.0), None),
        (sh(1, 8, 1, 2, 12000, 256), w(4096), Some(30.0), Some(Alibi::Standard)),
        (sh(2, 4, 4, 1, 5000, 96), w(3), None, None),
        // Window wider than Sk: every key, split over the whole length.
        (sh(1, 8, 2, 1, 30000, 128), w(1 << 20), None, Some(Alibi::Standard)),
        (sh(1, 8, 2, 4, 7000, 64), None, Some(10.0), None),
        (sh(1, 8, 8, 1, 50000, 128), None, None, Some(Alibi::Standard)),
    ];
    for (n, (shape, window, cap, alibi)) in rows.into_iter().enumerate() {
        let dtype = HALF[n % 2];
        let layout = if n % 3 == 0 { Layout::Bshd } else { Layout::Bhsd };
        let mut spec = AttentionSpec::new(shape, dtype)
            .with_layout(layout)
            .with_mask(Mask::CausalBottomRight)
            .with_variants(v(window, cap, alibi));
        if cap.is_some() {
            spec = spec.with_scale(big_scale(shape.d));
        }
        cases.push(VCase { spec, kernel: Kernel::SplitKv, f32_math: F32Math::Exact, lse: n % 4 != 3 });
    }
    // Explicit masks under a window, with no causal mask (the diagonal named), and one-sided windows.
    let shape = sh(1, 16, 4, 1, 9000, 128);
    for (n, (mask, window)) in [
        (Mask::Explicit(ExplicitMask::full(MaskValues::Additive, &shape)), Window { left: Some(500), right: Some(0) }),
        (Mask::None, Window { left: None, right: Some(0) }),
        (Mask::None, Window { left: Some(2000), right: None }),
    ]
    .into_iter()
    .enumerate()
    {
        let variants = Variants { window: Some(window), diagonal: Some(Diagonal::BottomRight), ..Variants::default() };
        let spec = AttentionSpec::new(shape, HALF[n % 2]).with_mask(mask).with_variants(variants);
        cases.push(VCase { spec, kernel: Kernel::SplitKv, f32_math: F32Math::Exact, lse: true });
    }
    run_table("splitkv", &cases, Some(Kernel::SplitKv));
    // And the configurations of the other tables at decoding shapes.
    let shapes = [sh(1, 16, 2, 1, 3000, 64), sh(2, 8, 2, 4, 2500, 128)];
    run_table("splitkv configs", &table(&shapes, Kernel::SplitKv, &HALF), Some(Kernel::SplitKv));
}

#[test]
fn fa1_honours_variants_in_f32_exactly_and_on_its_tensor_core_variant() {
    // f32: SIMT (tiled, fixed and generic head dims); f16/bf16: fa1m at 64 and 128, SIMT at 36.
    let f32_shapes =
        [sh(2, 4, 2, 77, 130, 1), sh(1, 4, 1, 129, 90, 40), sh(1, 2, 2, 100, 200, 64), sh(1, 4, 4, 65, 300, 130)];
    run_table("fa1 f32", &table(&f32_shapes, Kernel::Fa1, &[DType::F32]), Some(Kernel::Fa1));
    let half_shapes = [sh(1, 4, 2, 130, 77, 64), sh(1, 4, 4, 100, 257, 128), sh(1, 2, 1, 70, 90, 36)];
    run_table("fa1 half", &table(&half_shapes, Kernel::Fa1, &HALF), Some(Kernel::Fa1));
}

#[test]
fn unfused_honours_variants() {
    let shapes = [sh(2, 4, 2, 77, 130, 64), sh(1, 2, 2, 130, 70, 48)];
    run_table("unfused", &table(&shapes, Kernel::Unfused, &[DType::F32, DType::BF16]), Some(Kernel::Unfused));
}

#[test]
fn the_tf32_path_refuses_variants_and_auto_runs_them_exactly() {
    let Some(gpu) = gpu() else { return };
    let shape = sh(1, 4, 2, 70, 90, 64);
    let spec = AttentionSpec::new(shape, DType::F32)
        .with_mask(Mask::CausalTopLeft)
        .with_window(Window::left(8))
        .with_softcap(20.0);
    for math in [F32Math::Tf32, F32Math::SplitTf32] {
        let asked = RunOptions { kernel: Kernel::Fa2, f32_math: math, threads: None, lse: true };
        let inputs = HostInputs::random(&spec, 3).expect("valid");
        let err = gpu.run_host(&spec, &asked, &inputs).expect_err("tf32 refuses variants");
        assert!(err.to_string().contains("TF32") && err.to_string().contains("window"), "{err}");
        // `auto` runs the call on fa1 with exact f32.
        let c = VCase { spec: spec.clone(), kernel: Kernel::Auto, f32_math: math, lse: true };
        let (ran, r) = run_inputs(&gpu, &c, &inputs).expect("runs");
        assert_eq!(ran, Kernel::Fa1);
        let exact = check_output(
            &spec,
            &inputs,
            &gpu.run_host(&spec, &c.opts(), &inputs).expect("runs").output,
            F32Math::Exact,
            None,
        )
        .expect("checks");
        assert!(r.pass && exact.pass, "{r:?} {exact:?}");
    }
}

/// NaN in value rows outside a row's window must not reach it (the kernels' non-finite repair honours the
/// band, softcap and ALiBi), while rows that see it are NaN as in the reference. The NaN key lies in a tile
/// (or split step) that some rows see and others that load it do not.
#[test]
fn nonfinite_values_outside_the_window_stay_outside() {
    let Some(gpu) = gpu() else { return };
    // (kernel, shape, key): window 16 back on the bottom-right diagonal; fa2 and fa1: rows 10..=26 see key
    // 10; splitkv: of four decoding rows over 5000 keys the first two see key 4981.
    for (kernel, shape, key) in [
        (Kernel::Fa2, sh(1, 4, 2, 200, 200, 64), 10),
        (Kernel::SplitKv, sh(1, 8, 2, 4, 5000, 128), 4981),
        (Kernel::Fa1, sh(1, 2, 1, 100, 100, 40), 10),
    ] {
        for dtype in HALF {
            let spec = AttentionSpec::new(shape, dtype)
                .with_mask(Mask::CausalBottomRight)
                .with_window(Window::left(16))
                .with_softcap(30.0)
                .with_alibi(Alibi::Standard);
            let mut inputs = HostInputs::random(&spec, 9).expect("valid");
            inputs.v.set_f32(spec.v_strides.offset(0, 0, key) + 3, f32::NAN);
            inputs.v.set_f32(spec.v_strides.offset(0, shape.hkv - 1, key) + 1, f32::NAN);
            let want = reference_attention(&spec, &inputs).expect("reference");
            let bad_rows = want.o.chunks(shape.dv).filter(|r| r.iter().any(|x| x.is_nan())).count();
            let rows = shape.b * shape.hq * shape.sq;
            assert!(bad_rows > 0 && bad_rows < rows, "{kernel}: {bad_rows} of {rows} rows poisoned");
            let c = VCase { spec, kernel, f32_math: F32Math::Exact, lse: true };
            let (ran, r) = run_inputs(&gpu, &c, &inputs).expect("runs");
            assert!(r.pass && ran == kernel, "{} (ran {ran}): {r:?}", c.label());
        }
    }
}

/// Candle's path: caller-owned memory on the caller's stream, ALiBi slopes uploaded by the backend (kept
/// between calls), a window and a softcap.
#[test]
fn forward_on_a_callers_stream_with_alibi() {
    let Some(g) = gpu() else { return };
    let shape = Shape { b: 2, hq: 8, hkv: 2, sq: 37, sk: 300, d: 64, dv: 64 };
    let spec = AttentionSpec::new(shape, DType::BF16)
        .with_layout(Layout::Bshd)
        .with_mask(Mask::CausalBottomRight)
        .with_window(Window::left(40))
        .with_softcap(50.0)
        .with_alibi(Alibi::Standard);
    let inputs = HostInputs::random(&spec, 12).expect("valid");
    let stream = g.device().context().new_stream().expect("a second stream");
    let up = |b: &HostBuffer| match b {
        HostBuffer::BF16(v) => stream.clone_htod(v).expect("upload"),
        _ => unreachable!("bf16 spec"),
    };
    let (q, k, v) = (up(&inputs.q), up(&inputs.k), up(&inputs.v));
    let o_len = spec.required_len(sdpa_core::Operand::O).expect("len");
    for kernel in [Kernel::Fa2, Kernel::Fa1, Kernel::Unfused, Kernel::Auto] {
        let mut o = stream.clone_htod(&vec![half::bf16::NAN; o_len]).expect("poisoned output");
        let mut lse = stream.alloc_zeros::<f32>(spec.lse_len().expect("len")).expect("lse");
        let opts = RunOptions { kernel, f32_math: F32Math::Exact, threads: None, lse: true };
        g.forward_on_stream(&stream, &spec, &opts, &q, &k, &v, None, &mut o, Some(&mut lse), None).expect("runs");
        let out = HostOutput {
            o: HostBuffer::BF16(stream.clone_dtoh(&o).expect("download")),
            lse: Some(stream.clone_dtoh(&lse).expect("download")),
        };
        let r = check_output(&spec, &inputs, &out, F32Math::Exact, None).expect("check");
        assert!(r.pass, "{kernel}: {r:?}");
    }
}

/// The capabilities claim every variant, and a wrong variant (a window with no diagonal) is refused before
/// any kernel runs.
#[test]
fn capabilities_list_the_variants() {
    let Some(g) = gpu() else { return };
    assert_eq!(g.capabilities().variants, sdpa_core::Variant::ALL.to_vec());
    let spec = AttentionSpec::new(sh(1, 2, 2, 10, 10, 64), DType::F16).with_window(Window::left(3));
    let inputs = HostInputs::random(&AttentionSpec::new(spec.shape, DType::F16), 1).expect("valid");
    assert!(g.run_host(&spec, &RunOptions::default(), &inputs).is_err());
}
