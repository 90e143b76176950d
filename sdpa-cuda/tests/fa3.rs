//! `fa3` (the Hopper forward, kernels/fa3.cu) against the f64 reference on an sm_90 GPU: random data,
//! NaN-poisoned outputs (`run_host` poisons them), lengths that are no multiple of any tile (64-row TMA
//! boxes of Q, 128-key tiles), Sq != Sk both ways, several key tiles per block (the ring wraps), GQA 1/4/8,
//! decoding rows, no mask and causal in both alignments (rows that see no key included), both layouts,
//! f16 and bf16, with and without LSE, more query tiles than multiprocessors (each persistent block walks
//! several; `fa3_run.sh` reruns the reference test with `SDPA_FA3_GRID` forcing a few blocks and short
//! sections); a NaN in one query stays in its row; what `fa3` lacks is refused with the reason. Every
//! head-dim class (64, 96, 128, 192/128, 160, 192, 224, 256), exact and padded (D or Dv below the class,
//! 64-column blocks wholly past them), Dv != D, on the same kinds of shapes. Every case must report `fa3` as
//! the kernel that ran. Skips (printing why) without a GPU, and skips the kernel checks on a GPU other than
//! compute capability 9.0 after checking that `fa3` refuses it.

mod common;

use common::{assert_nan_in_a_query_stays_in_its_row, gpu, rows_for, sh, Case};
use sdpa_core::check::check_output;
use sdpa_core::{
    AttentionSpec, DType, ExplicitMask, F32Math, HostBackend, HostBuffer, HostInputs, HostOutput, Kernel, Layout, Mask,
    MaskValues, Operand, RunOptions, SdpaError, Shape,
};
use sdpa_cuda::CudaBackend;

/// Whether the GPU is an sm_90 part; otherwise `fa3` must refuse a call it would run there.
fn hopper(gpu: &CudaBackend) -> bool {
    if gpu.info().compute_capability == (9, 0) {
        return true;
    }
    let case = Case::new(sh(1, 2, 2, 64, 64, 64), DType::BF16, Mask::None, Layout::Bhsd, Kernel::Fa3, F32Math::Exact);
    let inputs = HostInputs::random(&case.spec(), 1).expect("valid");
    match gpu.run_host(&case.spec(), &case.opts(), &inputs) {
        Err(SdpaError::Unsupported { .. }) => eprintln!("skipping fa3 kernel checks: not a compute-capability 9.0 GPU"),
        other => panic!("fa3 on a GPU other than sm_90 must be refused, got {other:?}"),
    }
    false
}

fn shapes() -> Vec<Shape> {
    vec![
        sh(1, 2, 2, 1, 1, 64),
        sh(2, 4, 1, 77, 130, 64),     // GQA 4, Sq < Sk, one partial key tile and a second one
        sh(1, 8, 1, 130, 77, 128),    // GQA 8, Sq > Sk: bottom-right rows that see no key
        sh(1, 4, 4, 129, 257, 128),   // one row past a block, one key past two tiles
        sh(2, 2, 2, 300, 300, 64),    // three query blocks
        sh(1, 8, 2, 1000, 1000, 128), // GQA 4, eight key tiles: the 2-deep ring wraps
        sh(1, 2, 2, 513, 2049, 64),   // 17 key tiles, the last of one key
        sh(1, 2, 1, 65, 1, 128),      // one key
        sh(2, 16, 2, 1, 1000, 64),    // decoding rows
        // More query tiles than an H100 has multiprocessors: persistent blocks walk several tiles each, the
        // ring position and the Q loads carried across tiles of different key counts (causal), last tiles
        // whose second warpgroup has no rows (300 = 2·128 + 44, 700 = 5·128 + 60) among them.
        sh(3, 24, 6, 300, 400, 64),
        sh(2, 20, 4, 700, 650, 128),
    ]
}

#[test]
fn fa3_matches_the_reference() {
    let Some(gpu) = gpu() else { return };
    if !hopper(&gpu) {
        return;
    }
    let mut failures = Vec::new();
    let (mut n, mut worst) = (0usize, 0.0f64);
    for shape in shapes() {
        for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight] {
            for layout in [Layout::Bhsd, Layout::Bshd] {
                for dtype in [DType::F16, DType::BF16] {
                    let mut case = Case::new(shape, dtype, mask, layout, Kernel::Fa3, F32Math::Exact);
                    case.lse = n % 4 != 0; // every fourth without LSE (the null-pointer path)
                    n += 1;
                    worst = worst.max(check_case(&gpu, &case, 25_000 + n as u64, &mut failures));
                }
            }
        }
    }
    eprintln!("fa3: {n} cases, {} failed, worst error {worst:.3} of its tolerance", failures.len());
    assert!(failures.is_empty(), "{} of {n} cases failed:\n{}", failures.len(), failures.join("\n"));
}

/// Runs `case` against the f64 reference (LSE asked for or not), pushing what went wrong onto `failures`;
/// returns the error as a fraction of the tolerance.
fn check_case(gpu: &CudaBackend, case: &Case, seed: u64, failures: &mut Vec<String>) -> f64 {
    let spec = case.spec();
    let inputs = HostInputs::random(&spec, seed).expect("valid spec");
    let run = match gpu.run_host(&spec, &case.opts(), &inputs) {
        Ok(run) => run,
        Err(e) => {
            failures.push(format!("{}: error: {e}", case.label()));
            return 0.0;
        }
    };
    if run.kernel != Kernel::Fa3 {
        failures.push(format!("{}: ran {}", case.label(), run.kernel));
    }
    if case.lse && run.output.lse.is_none() {
        failures.push(format!("{}: LSE asked for, none returned", case.label()));
    }
    match check_output(&spec, &inputs, &run.output, F32Math::Exact, rows_for(&case.shape)) {
        Ok(r) => {
            if !r.pass {
                failures.push(format!("{}: {r:?}", case.label()));
            }
            r.rel_err / r.tolerance
        }
        Err(e) => {
            failures.push(format!("{}: check: {e}", case.label()));
            0.0
        }
    }
}

/// (D, Dv) pairs covering every head-dim class, exact and padded: 32 and 40 run class 64, 80 (padded) and
/// 96 class 96, 112 class 128, 192/128 (MLA) its own class, 136/104 the same class padded, 160 class 160,
/// 176 and 192 class 192, 224 class 224, 240 and 256 class 256; 64/128 and 256/128 leave whole 64-column
/// blocks of Q/K or of V unloaded, 96/64 a V block of the 96 class.
const HEAD_DIM_PAIRS: [(usize, usize); 17] = [
    (32, 32),
    (40, 40),
    (80, 80),
    (96, 96),
    (112, 112),
    (192, 128),
    (136, 104),
    (160, 160),
    (176, 176),
    (192, 192),
    (224, 224),
    (240, 240),
    (256, 256),
    (64, 128),
    (256, 128),
    (96, 64),
    (128, 128),
];

/// Every head-dim class, exact and padded, with Dv != D: GQA, lengths off the tiles (several key tiles, the
/// ring wrapping, Sq > Sk with rows that see no key), no mask and causal in both alignments, both layouts,
/// f16 and bf16 taking turns, LSE on three cases in four.
#[test]
fn fa3_head_dim_classes_match_the_reference() {
    let Some(gpu) = gpu() else { return };
    if !hopper(&gpu) {
        return;
    }
    let mut failures = Vec::new();
    let (mut n, mut worst) = (0usize, 0.0f64);
    for (d, dv) in HEAD_DIM_PAIRS {
        let shapes = [
            Shape { d, dv, ..sh(1, 4, 1, 77, 300, d) }, // GQA 4, Sq < Sk, three key tiles at every tile width
            Shape { d, dv, ..sh(2, 2, 2, 200, 130, d) }, // Sq > Sk: bottom-right rows that see no key
        ];
        for shape in shapes {
            for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight] {
                for layout in [Layout::Bhsd, Layout::Bshd] {
                    let dtype = if n % 2 == 0 { DType::BF16 } else { DType::F16 };
                    let mut case = Case::new(shape, dtype, mask, layout, Kernel::Fa3, F32Math::Exact);
                    case.lse = n % 4 != 3;
                    n += 1;
                    worst = worst.max(check_case(&gpu, &case, 26_000 + n as u64, &mut failures));
                }
            }
        }
    }
    // Long ones: the 2-deep ring wraps many times (D = 256 and 224 run 80-key tiles, 160 and 192 112).
    for (d, dv) in [(256, 256), (224, 224), (192, 128), (160, 160), (96, 96)] {
        let case = Case::new(
            Shape { d, dv, ..sh(1, 4, 2, 600, 1100, d) },
            DType::BF16,
            Mask::CausalBottomRight,
            Layout::Bshd,
            Kernel::Fa3,
            F32Math::Exact,
        );
        n += 1;
        worst = worst.max(check_case(&gpu, &case, 26_000 + n as u64, &mut failures));
    }
    eprintln!("fa3 head dims: {n} cases, {} failed, worst error {worst:.3} of its tolerance", failures.len());
    assert!(failures.is_empty(), "{} of {n} cases failed:\n{}", failures.len(), failures.join("\n"));
}

/// A NaN in one query poisons exactly its row, with and without a causal mask.
#[test]
fn fa3_keeps_a_nan_query_in_its_row() {
    let Some(gpu) = gpu() else { return };
    if !hopper(&gpu) {
        return;
    }
    for mask in [Mask::None, Mask::CausalBottomRight] {
        let case = Case::new(sh(1, 4, 2, 200, 300, 128), DType::BF16, mask, Layout::Bshd, Kernel::Fa3, F32Math::Exact);
        assert_nan_in_a_query_stays_in_its_row(&gpu, &case);
    }
}

/// Small calls of both head dims, both dtypes and each mask kind (GQA, lengths off the tiles, a warpgroup with no
/// rows), checked against the reference: what `fa3_run.sh` runs under compute-sanitizer memcheck, racecheck and
/// synccheck.
#[test]
fn small_calls_for_the_sanitizer() {
    let Some(gpu) = gpu() else { return };
    if !hopper(&gpu) {
        return;
    }
    let calls = [
        (sh(1, 4, 1, 70, 200, 128), DType::BF16, Mask::CausalTopLeft, Layout::Bhsd),
        (sh(1, 2, 2, 33, 300, 64), DType::F16, Mask::CausalBottomRight, Layout::Bshd),
        (sh(1, 2, 1, 130, 100, 64), DType::BF16, Mask::None, Layout::Bhsd),
        // One per new class, each padded somewhere: 192/128 exact, 160 in 192, 224 in 256, 40 in 64, 80 in
        // 128, and 64/128 (Q/K blocks never loaded, zeroed).
        (Shape { dv: 128, ..sh(1, 2, 1, 70, 200, 192) }, DType::BF16, Mask::CausalBottomRight, Layout::Bshd),
        (sh(1, 2, 2, 70, 150, 160), DType::F16, Mask::None, Layout::Bhsd),
        (sh(1, 2, 1, 70, 170, 224), DType::BF16, Mask::CausalTopLeft, Layout::Bhsd),
        (sh(1, 2, 2, 70, 150, 40), DType::BF16, Mask::None, Layout::Bshd),
        (sh(1, 2, 2, 70, 150, 80), DType::F16, Mask::CausalTopLeft, Layout::Bhsd),
        (Shape { dv: 128, ..sh(1, 2, 1, 70, 150, 64) }, DType::BF16, Mask::None, Layout::Bhsd),
    ];
    // A tile forced for a measurement run (`SDPA_FA3_TILE`, e.g. one consumer) may not fit the wide classes'
    // shared memory: those calls are refused by size, and skipped here with a note.
    let forced = std::env::var_os("SDPA_FA3_TILE").is_some();
    for (n, (shape, dtype, mask, layout)) in calls.into_iter().enumerate() {
        let case = Case::new(shape, dtype, mask, layout, Kernel::Fa3, F32Math::Exact);
        let inputs = HostInputs::random(&case.spec(), 90 + n as u64).expect("valid");
        let run = match gpu.run_host(&case.spec(), &case.opts(), &inputs) {
            Err(SdpaError::Unsupported { what, .. }) if forced && what.contains("bytes of shared memory") => {
                eprintln!("{}: skipped, the forced tile does not fit: {what}", case.label());
                continue;
            }
            r => r.expect("runs"),
        };
        assert_eq!(run.kernel, Kernel::Fa3, "{}", case.label());
        let r = check_output(&case.spec(), &inputs, &run.output, F32Math::Exact, None).expect("checks");
        assert!(r.pass, "{}: {r:?}", case.label());
    }
}

/// On a caller's stream (`forward_on_stream`) fa3 takes a work-tile counter zeroed for that call; on the
/// device's own stream it reuses one kept zero between calls, which every launch must leave zero. Calls of
/// different tile counts alternate between the two streams, each checked against the reference: a counter
/// left nonzero would make the next call on its stream skip tiles (the poisoned output would show it).
#[test]
fn fa3_on_a_callers_stream_and_the_devices_in_turn() {
    let Some(gpu) = gpu() else { return };
    if !hopper(&gpu) {
        return;
    }
    let stream = gpu.device().context().new_stream().expect("a second stream");
    let shapes = [sh(2, 20, 4, 700, 650, 64), sh(1, 4, 2, 300, 500, 128), sh(3, 24, 6, 300, 400, 64)];
    for (n, shape) in shapes.into_iter().enumerate() {
        let spec = AttentionSpec::new(shape, DType::BF16).with_mask(Mask::CausalBottomRight);
        let inputs = HostInputs::random(&spec, 700 + n as u64).expect("valid");
        let opts = RunOptions { kernel: Kernel::Fa3, f32_math: F32Math::Exact, threads: None, lse: true };
        // The device's stream first, then the caller's.
        let run = gpu.run_host(&spec, &opts, &inputs).expect("runs");
        let r = check_output(&spec, &inputs, &run.output, F32Math::Exact, None).expect("checks");
        assert!(run.kernel == Kernel::Fa3 && r.pass, "device stream, {shape:?}: {r:?}");
        let up = |b: &HostBuffer| match b {
            HostBuffer::BF16(v) => stream.clone_htod(v).expect("upload"),
            _ => unreachable!("bf16 spec"),
        };
        let (q, k, v) = (up(&inputs.q), up(&inputs.k), up(&inputs.v));
        let o_len = spec.required_len(Operand::O).expect("len");
        let mut o = stream.clone_htod(&vec![half::bf16::NAN; o_len]).expect("poisoned output");
        let mut lse = stream.clone_htod(&vec![f32::NAN; spec.lse_len().expect("len")]).expect("poisoned lse");
        let ran = gpu
            .forward_on_stream(&stream, &spec, &opts, &q, &k, &v, None, &mut o, Some(&mut lse), None)
            .expect("runs on the stream");
        let out = HostOutput {
            o: HostBuffer::BF16(stream.clone_dtoh(&o).expect("download")),
            lse: Some(stream.clone_dtoh(&lse).expect("download")),
        };
        let r = check_output(&spec, &inputs, &out, F32Math::Exact, None).expect("checks");
        assert!(ran == Kernel::Fa3 && r.pass, "caller's stream, {shape:?}: {r:?}");
    }
}

/// What `fa3` lacks is refused with the reason (never run on another kernel behind the caller's back).
#[test]
fn fa3_refuses_what_it_lacks() {
    let Some(gpu) = gpu() else { return };
    let explicit = |s: Shape| Mask::Explicit(ExplicitMask::full(MaskValues::Additive, &s));
    let s64 = sh(1, 2, 2, 100, 100, 64);
    let cases = [
        (sh(1, 2, 2, 100, 100, 36), DType::BF16, Mask::None, "head dims"),
        (sh(1, 2, 2, 100, 100, 264), DType::F16, Mask::None, "head dims"),
        (Shape { dv: 60, ..s64 }, DType::BF16, Mask::None, "head dims"),
        (s64, DType::F32, Mask::None, "not f32"),
        (s64, DType::BF16, explicit(s64), "explicit"),
    ];
    for (shape, dtype, mask, why) in cases {
        let case = Case::new(shape, dtype, mask, Layout::Bhsd, Kernel::Fa3, F32Math::Exact);
        let inputs = HostInputs::random(&case.spec(), 3).expect("valid");
        match gpu.run_host(&case.spec(), &case.opts(), &inputs) {
            Err(e @ SdpaError::Unsupported { .. }) => {
                assert!(e.to_string().contains(why), "{}: {e}", case.label());
            }
            other => panic!("{}: expected Unsupported ({why}), got {:?}", case.label(), other.map(|r| r.kernel)),
        }
    }
}
