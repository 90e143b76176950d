//! Issue 21's odd head dims through `fa2`'s pad-copy path (`kernels::pad_copy`): Q, K and V copied into
//! zero-filled scratch of whole 16-byte rows, the aligned instantiation run there with the caller's scale,
//! O's own columns copied back. Checked against the f64 reference with poisoned outputs on the same cases as
//! `odd_head_dims` (every head dim and pair, both causal alignments and an explicit mask, GQA, both layouts,
//! LSE, f16 and bf16, within twice the unfused kernel's error) with `SDPA_FA2_PAD_COPY=1`; long prefill by
//! the default rule and with `SDPA_FA2_PAD_COPY=0` (the narrow path) alike; misaligned and strided views,
//! whose elements outside the O view stay poisoned. Every test sets the variable under one lock (it is read
//! per call, and the tests of a binary share the process) and opens the GPU under it too (no driver call
//! reads the environment while another test writes it). Which path ran is not observable from here: the
//! rule and the choice are unit tests (`kernels::pad_copy`), the timings of `fa2_rust_bench.py --odd` tell
//! the paths apart. Skips (printing why) without a GPU.

mod common;

use common::odd::{cases, head_dims, misaligned, HALF};
use common::{check_inputs, gpu, run_table, Case};
use sdpa_core::check::check_output;
use sdpa_core::{AttentionSpec, DType, F32Math, HostBackend, HostInputs, Kernel, Layout, Mask, RunOptions, Shape};
use sdpa_cuda::kernels::pad_copy::ENV;
use sdpa_cuda::CudaBackend;
use std::sync::{Mutex, OnceLock};

/// Runs `f` with `SDPA_FA2_PAD_COPY` set to `mode` (`None`: unset, the rule decides), holding the lock every
/// test of this binary takes.
fn with_mode<R>(mode: Option<&str>, f: impl FnOnce() -> R) -> R {
    static LOCK: Mutex<()> = Mutex::new(());
    let _held = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    match mode {
        Some(m) => std::env::set_var(ENV, m),
        None => std::env::remove_var(ENV),
    }
    let r = f();
    std::env::remove_var(ENV);
    r
}

/// Compiles the programs of the pad-copy cases (and their unfused baselines) on parallel threads, once.
fn warm(gpu: &CudaBackend) {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        let mut calls: Vec<(AttentionSpec, RunOptions)> = Vec::new();
        for c in cases(Kernel::Fa2) {
            calls.push((c.spec(), c.opts()));
            calls.push((c.spec(), Case { kernel: Kernel::Unfused, ..c }.opts()));
        }
        let warmed = with_mode(Some("1"), || gpu.warm_up(&calls)).expect("the programs compile");
        eprintln!("warm-up: {} programs loaded", warmed.loads.len());
    });
}

#[test]
fn pad_copy_at_every_head_dim_matches_the_reference_and_the_unfused_error() {
    let Some(gpu) = with_mode(None, gpu) else { return };
    warm(&gpu);
    with_mode(Some("1"), || run_table(&gpu, "fa2 pad-copy odd head dims", &cases(Kernel::Fa2)));
}

/// Long prefill (past the rule's threshold for 2-byte rows, causal or not) at every head dim and pair: the
/// default (pad-copy by the rule; D = 100's 8-byte rows stay narrow) and `SDPA_FA2_PAD_COPY=0` (narrow)
/// both match the reference on sampled rows, with LSE.
#[test]
fn long_prefill_by_the_rule_and_narrow_match_the_reference() {
    let Some(gpu) = with_mode(None, gpu) else { return };
    let masks = [Mask::CausalBottomRight, Mask::None, Mask::CausalTopLeft];
    for (i, (d, dv)) in head_dims().into_iter().enumerate() {
        let shape = Shape { b: 1, hq: 2, hkv: 1, sq: 1024, sk: 1024, d, dv };
        let layout = if i % 2 == 0 { Layout::Bshd } else { Layout::Bhsd };
        let case = Case::new(shape, HALF[i % 2], masks[i % 3], layout, Kernel::Fa2, F32Math::Exact);
        let case = Case { lse: true, ..case };
        let inputs = HostInputs::random(&case.spec(), 300 + i as u64).expect("valid spec");
        for mode in [None, Some("0")] {
            let r = with_mode(mode, || check_inputs(&gpu, &case, &inputs, Some(64))).expect("runs");
            assert!(r.pass, "{} ({ENV}={mode:?}): {r:?}", case.label());
        }
    }
}

/// Full grids on both paths (sampled rows): the shapes `odd_head_dims` runs at scale.
#[test]
fn larger_shapes_on_both_paths() {
    let Some(gpu) = with_mode(None, gpu) else { return };
    let s = |b, hq, hkv, sq, sk, d, dv| Shape { b, hq, hkv, sq, sk, d, dv };
    for (n, shape) in [
        s(2, 16, 4, 1000, 1500, 65, 65),
        s(1, 32, 8, 1500, 1000, 127, 127),
        s(2, 16, 16, 777, 1201, 100, 100),
        s(1, 16, 4, 900, 900, 250, 250),
        s(1, 16, 16, 1000, 1000, 190, 127),
    ]
    .into_iter()
    .enumerate()
    {
        let case = Case::new(shape, HALF[n % 2], Mask::CausalBottomRight, Layout::Bhsd, Kernel::Fa2, F32Math::Exact);
        let inputs = HostInputs::random(&case.spec(), 77).expect("valid spec");
        for mode in [Some("1"), Some("0")] {
            let r = with_mode(mode, || check_inputs(&gpu, &case, &inputs, Some(96))).expect("runs");
            assert!(r.pass, "{} ({ENV}={mode:?}): {r:?}", case.label());
        }
    }
}

/// Runs `spec` on `case`'s options and inputs seeded `seed`; asserts that `fa2` ran, that O matches the
/// reference and that every element of the O buffer outside the view (the columns past Dv in each row, the
/// gaps between heads and batches) is still the NaN it was poisoned with.
fn assert_view_written_exactly(gpu: &CudaBackend, case: &Case, spec: &AttentionSpec, seed: u64) {
    let inputs = HostInputs::random(spec, seed).expect("valid");
    let run = gpu.run_host(spec, &case.opts(), &inputs).expect("runs");
    assert_eq!(run.kernel, Kernel::Fa2, "{}", case.label());
    let r = check_output(spec, &inputs, &run.output, case.f32_math, None).expect("checks");
    assert!(r.pass, "{}: {r:?}", case.label());
    let s = spec.shape;
    let o = &run.output.o;
    let mut in_view = vec![false; o.len()];
    for b in 0..s.b {
        for h in 0..s.hq {
            for row in 0..s.sq {
                let at = spec.o_strides.offset(b, h, row);
                in_view[at..at + s.dv].iter_mut().for_each(|x| *x = true);
            }
        }
    }
    let written: Vec<usize> = (0..o.len()).filter(|&i| !in_view[i] && !o.get_f32(i).is_nan()).take(5).collect();
    assert!(written.is_empty(), "{}: elements outside the O view written: {written:?}", case.label());
}

/// Views whose rows are 8-, 4- and 2-byte aligned (row strides of 68, 66, 65, 101 and 132 elements, head and
/// batch strides moving each head's base off 16 bytes), and a 33-column row in a 40-element stride: through
/// the pad-copy path they match the reference and write nothing outside the O view.
#[test]
fn misaligned_and_strided_views_through_the_pad_copy_path() {
    let Some(gpu) = with_mode(None, gpu) else { return };
    for (i, (d, row)) in [(64, 68usize), (64, 66), (64, 65), (33, 40), (100, 101), (128, 132)].into_iter().enumerate() {
        let (sq, sk) = (70, 90);
        let shape = Shape { b: 2, hq: 4, hkv: 2, sq, sk, d, dv: d };
        let mask = if i % 2 == 0 { Mask::CausalBottomRight } else { Mask::CausalTopLeft };
        let case = Case::new(shape, HALF[i % 2], mask, Layout::Bhsd, Kernel::Fa2, F32Math::Exact);
        let case = Case { lse: true, ..case };
        let spec = misaligned(&case, row);
        with_mode(Some("1"), || assert_view_written_exactly(&gpu, &case, &spec, 11 + i as u64));
    }
}

/// One small pad-copy call per padded width for the sanitizer run (memcheck and racecheck): D = 33, 100,
/// 130 and Dv != D (65/31), and a strided BSHD view.
#[test]
fn small_pad_copy_calls_for_the_sanitizer() {
    let Some(gpu) = with_mode(None, gpu) else { return };
    with_mode(Some("1"), || {
        for (d, dv) in [(33, 33), (100, 100), (130, 130), (65, 31)] {
            let shape = Shape { b: 1, hq: 2, hkv: 1, sq: 70, sk: 90, d, dv };
            let case =
                Case::new(shape, DType::BF16, Mask::CausalBottomRight, Layout::Bshd, Kernel::Fa2, F32Math::Exact);
            let inputs = HostInputs::random(&case.spec(), 21).expect("valid spec");
            let r = check_inputs(&gpu, &case, &inputs, None).expect("runs");
            assert!(r.pass, "{}: {r:?}", case.label());
        }
        let shape = Shape { b: 1, hq: 2, hkv: 2, sq: 40, sk: 50, d: 33, dv: 33 };
        let case = Case::new(shape, DType::F16, Mask::None, Layout::Bshd, Kernel::Fa2, F32Math::Exact);
        let mut spec = case.spec();
        // BSHD rows 2 · 37 elements apart, heads 37 apart: a 4-element gap after each head's 33 columns.
        for st in [&mut spec.q_strides, &mut spec.o_strides] {
            (st.b, st.h, st.s) = (40 * 2 * 37, 37, 2 * 37);
        }
        for st in [&mut spec.k_strides, &mut spec.v_strides] {
            (st.b, st.h, st.s) = (50 * 2 * 37, 37, 2 * 37);
        }
        assert_view_written_exactly(&gpu, &case, &spec, 12);
    });
}
