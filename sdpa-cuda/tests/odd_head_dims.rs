//! Issue 21: every head dim 1..256 on the tensor cores, not only multiples of 8. Head dims whose rows are
//! not whole 16-byte chunks, and views whose base pointers or strides are not 16-byte aligned, run the
//! padded instantiations of `fa2` and `splitkv` with 8-, 4- or 2-byte copies (`fa2_row_bytes` in
//! kernels/fa2_mma.cuh). Checked here against the f64 reference on random data with poisoned outputs: D and
//! Dv in {1, 3, 7, 33, 65, 100, 127, 130, 250, 255} and unequal pairs, lengths off every tile, Sq != Sk,
//! both causal alignments and an explicit mask, GQA, both layouts, with and without LSE, f16 and bf16 each
//! within twice the unfused kernel's error; misaligned views at every copy width; the kernel that ran (never
//! `fa1` for these), `fa3` refusing them with the reason (the backward runs them: `backward_odd_head_dims`);
//! and f32 on the TF32 and split-TF32 path at Dv != D. The prefill cases are short enough that `fa2`'s pad-copy rule
//! (`kernels::pad_copy::pays`)
//! leaves them on the narrow copies; `odd_head_dims_pad_copy` runs the same cases through aligned scratch.
//! Skips (printing why) without a GPU.

mod common;

use common::odd::{cases, head_dims, masks_for, misaligned, HALF};
use common::{check_inputs, gpu, run_spec, run_table, Case};
use sdpa_core::{AttentionSpec, DType, F32Math, HostBackend, HostInputs, Kernel, Layout, Mask, RunOptions, Shape};
use sdpa_cuda::CudaBackend;
use std::sync::OnceLock;

/// Compiles, on parallel threads, the programs of every case of this file (and of its unfused baselines)
/// once per process, instead of one at a time as the cases first meet them.
fn warm(gpu: &CudaBackend) {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let mut calls: Vec<(AttentionSpec, RunOptions)> = Vec::new();
        for kernel in [Kernel::Fa2, Kernel::SplitKv, Kernel::Auto] {
            for c in cases(kernel) {
                calls.push((c.spec(), c.opts()));
                calls.push((c.spec(), Case { kernel: Kernel::Unfused, ..c }.opts()));
            }
        }
        let warmed = gpu.warm_up(&calls).expect("the programs compile");
        eprintln!("warm-up: {} programs loaded", warmed.loads.len());
    });
}

/// Which kernel a case runs, on inputs seeded 3.
fn ran(gpu: &CudaBackend, case: &Case) -> Kernel {
    let spec = case.spec();
    let inputs = HostInputs::random(&spec, 3).expect("valid spec");
    gpu.run_host(&spec, &case.opts(), &inputs).expect("runs").kernel
}

#[test]
fn fa2_at_every_head_dim_matches_the_reference_and_the_unfused_error() {
    let Some(gpu) = gpu() else { return };
    warm(&gpu);
    run_table(&gpu, "fa2 odd head dims", &cases(Kernel::Fa2));
}

#[test]
fn splitkv_at_every_head_dim_matches_the_reference_and_the_unfused_error() {
    let Some(gpu) = gpu() else { return };
    warm(&gpu);
    run_table(&gpu, "splitkv odd head dims", &cases(Kernel::SplitKv));
}

#[test]
fn auto_at_every_head_dim_matches_the_reference_and_runs_tensor_cores() {
    let Some(gpu) = gpu() else { return };
    warm(&gpu);
    let cases = cases(Kernel::Auto);
    run_table(&gpu, "auto odd head dims", &cases);
    // `auto` never sends these f16/bf16 calls to the SIMT fa1 (fa3 refuses them; fa2 or splitkv run).
    for case in cases.iter().step_by(7) {
        let k = ran(&gpu, case);
        assert!(matches!(k, Kernel::Fa2 | Kernel::SplitKv), "{}: ran {k}", case.label());
    }
    for (d, dv) in head_dims() {
        let case = |sq, sk, kernel| {
            let shape = Shape { b: 1, hq: 4, hkv: 2, sq, sk, d, dv };
            Case::new(shape, DType::BF16, Mask::CausalBottomRight, Layout::Bshd, kernel, F32Math::Exact)
        };
        assert_eq!(ran(&gpu, &case(300, 300, Kernel::Fa2)), Kernel::Fa2, "D = {d}, Dv = {dv}");
        assert_eq!(ran(&gpu, &case(1, 5000, Kernel::SplitKv)), Kernel::SplitKv, "D = {d}, Dv = {dv}");
        assert_eq!(ran(&gpu, &case(1, 5000, Kernel::Auto)), Kernel::SplitKv, "D = {d}, Dv = {dv}");
    }
}

/// Big enough to fill the GPU (full-grid tiles, races and tile-boundary bugs), and long decoding whose rows
/// spread over many blocks, sampled rows. The `fa2` shapes with 2-byte rows pass the pad-copy rule
/// (`kernels::pad_copy::pays`), so here they run through aligned scratch (D = 100's 8-byte rows stay narrow);
/// `odd_head_dims_pad_copy` runs them on both paths.
#[test]
fn larger_shapes_sampled() {
    let Some(gpu) = gpu() else { return };
    let s = |b, hq, hkv, sq, sk, d, dv| Shape { b, hq, hkv, sq, sk, d, dv };
    for (shape, kernel) in [
        (s(2, 16, 4, 1000, 1500, 65, 65), Kernel::Fa2),
        (s(1, 32, 8, 1500, 1000, 127, 127), Kernel::Fa2),
        (s(2, 16, 16, 777, 1201, 100, 100), Kernel::Fa2),
        (s(1, 16, 4, 900, 900, 250, 250), Kernel::Fa2),
        (s(2, 16, 8, 1100, 1000, 33, 33), Kernel::Fa2),
        (s(1, 16, 16, 1000, 1000, 190, 127), Kernel::Fa2),
        (s(1, 32, 8, 1, 32768, 127, 127), Kernel::SplitKv),
        (s(8, 32, 32, 1, 4096, 33, 33), Kernel::SplitKv),
        (s(2, 16, 2, 3, 9000, 130, 65), Kernel::SplitKv),
    ] {
        for mask in [Mask::None, Mask::CausalTopLeft, Mask::CausalBottomRight] {
            for dtype in HALF {
                let case = Case::new(shape, dtype, mask, Layout::Bhsd, kernel, F32Math::Exact);
                let inputs = HostInputs::random(&case.spec(), 77).expect("valid spec");
                let r = check_inputs(&gpu, &case, &inputs, Some(96)).expect("runs");
                assert!(r.pass, "{}: {r:?}", case.label());
            }
        }
    }
}

/// Views whose rows are 8-, 4- and 2-byte aligned (row strides of 68 and 132, 66, and 65 and 101 elements,
/// with batch and head strides that move each head's base pointer off 16 bytes), and a 33-column row in a
/// 40-element stride (16-byte aligned rows, the row length 2-byte): the narrow copies give the reference's
/// answer on `fa2`, `splitkv` and `auto`, none of them falling back to `fa1`.
#[test]
fn misaligned_views_run_the_narrow_copies() {
    let Some(gpu) = gpu() else { return };
    for (d, row) in [(64, 68usize), (64, 66), (64, 65), (33, 40), (100, 101), (128, 132)] {
        for (kernel, sq, sk) in [(Kernel::Fa2, 70, 90), (Kernel::SplitKv, 2, 3000), (Kernel::Auto, 1, 3000)] {
            for dtype in HALF {
                let shape = Shape { b: 2, hq: 4, hkv: 2, sq, sk, d, dv: d };
                let case = Case::new(shape, dtype, Mask::CausalBottomRight, Layout::Bhsd, kernel, F32Math::Exact);
                let spec = misaligned(&case, row);
                let (ran, r) = run_spec(&gpu, &case, &spec, 11);
                assert!(matches!(ran, Kernel::Fa2 | Kernel::SplitKv), "{} row {row}: ran {ran}", case.label());
                assert!(r.pass, "{} row {row}: {r:?}", case.label());
            }
        }
    }
}

/// `fa3` refuses head dims that are not multiples of 8 with its reason (TMA rows of whole 16-byte chunks)
/// and runs them nowhere else (the backward takes them through its pad-copy path:
/// `tests/backward_odd_head_dims.rs`).
#[test]
fn fa3_refuses_odd_head_dims_with_the_reason() {
    let Some(gpu) = gpu() else { return };
    let shape = Shape { b: 1, hq: 2, hkv: 2, sq: 64, sk: 64, d: 33, dv: 33 };
    let case = Case::new(shape, DType::BF16, Mask::None, Layout::Bhsd, Kernel::Fa3, F32Math::Exact);
    let spec = case.spec();
    let inputs = HostInputs::random(&spec, 5).expect("valid spec");
    let e = gpu.run_host(&spec, &case.opts(), &inputs).expect_err("fa3 refuses D = 33").to_string();
    assert!(e.contains("multiple") || e.contains("compute capability"), "{e}");
}

/// f32 on the TF32 and split-TF32 path (kernel `fa2` with f32 inputs) at Dv != D and head dims that are
/// not multiples of 4 or 8 (scalar loads), and unequal pairs on 16-byte loads (the wgmma kernel on sm_90),
/// none and causal masks in both alignments (an explicit mask on some), both layouts: within the f32 math's
/// tolerance of the reference.
#[test]
fn tf32_takes_unequal_and_odd_head_dims() {
    let Some(gpu) = gpu() else { return };
    // 96/64 and 64/128 take the class 128 with 16-byte loads: on sm_90 the wgmma kernel (plain TF32).
    let pairs = [(65, 31), (33, 100), (127, 130), (250, 3), (7, 7), (192, 128), (96, 64), (64, 128)];
    let mut failures = Vec::new();
    let mut n = 0;
    for (i, &(d, dv)) in pairs.iter().enumerate() {
        let shape = Shape { b: 2, hq: 4, hkv: 2, sq: 77, sk: 130, d, dv };
        for math in [F32Math::Tf32, F32Math::SplitTf32] {
            for mask in masks_for(i, &shape) {
                for layout in [Layout::Bhsd, Layout::Bshd] {
                    let case = Case::new(shape, DType::F32, mask, layout, Kernel::Auto, math);
                    let inputs = HostInputs::random(&case.spec(), 40 + n).expect("valid spec");
                    n += 1;
                    match check_inputs(&gpu, &case, &inputs, None) {
                        Ok(r) if r.pass => {}
                        Ok(r) => failures.push(format!("{}: {r:?}", case.label())),
                        Err(e) => failures.push(format!("{}: {e}", case.label())),
                    }
                    if i == 0 && layout == Layout::Bhsd {
                        assert_eq!(ran(&gpu, &case), Kernel::Fa2, "{}", case.label());
                    }
                }
            }
        }
    }
    eprintln!("tf32 odd head dims: {n} cases, {} failed", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One small call per new load path for the sanitizer run (memcheck and racecheck): fa2 and splitkv with
/// 8-, 4- and 2-byte rows (D = 100, 130, 33), and a misaligned view at D = 64.
#[test]
fn small_calls_for_the_sanitizer() {
    let Some(gpu) = gpu() else { return };
    for d in [100, 130, 33] {
        for (kernel, sq, sk) in [(Kernel::Fa2, 70, 90), (Kernel::SplitKv, 1, 2000)] {
            let shape = Shape { b: 1, hq: 2, hkv: 1, sq, sk, d, dv: d };
            let case = Case::new(shape, DType::BF16, Mask::CausalBottomRight, Layout::Bshd, kernel, F32Math::Exact);
            let inputs = HostInputs::random(&case.spec(), 21).expect("valid spec");
            let r = check_inputs(&gpu, &case, &inputs, None).expect("runs");
            assert!(r.pass, "{}: {r:?}", case.label());
        }
    }
    let shape = Shape { b: 1, hq: 2, hkv: 2, sq: 40, sk: 50, d: 64, dv: 64 };
    let case = Case::new(shape, DType::F16, Mask::None, Layout::Bhsd, Kernel::Fa2, F32Math::Exact);
    let mut spec = case.spec();
    for st in [&mut spec.q_strides, &mut spec.k_strides, &mut spec.v_strides, &mut spec.o_strides] {
        st.s = 65;
        st.h = 65 * 50 + 1;
        st.b = (65 * 50 + 1) * 2;
    }
    let (ran, r) = run_spec(&gpu, &case, &spec, 12);
    assert_eq!(ran, Kernel::Fa2);
    assert!(r.pass, "{r:?}");
}
