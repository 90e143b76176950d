//! The backend's machinery: clean errors without a GPU (runs everywhere, CI included), and on a GPU the
//! disk cache, event timing and `forward_on_stream` on caller-owned memory and a caller's stream.

mod common;

use common::gpu;
use sdpa_core::check::check_output;
use sdpa_core::{
    AttentionSpec, DType, F32Math, HostBackend, HostBuffer, HostInputs, HostOutput, Kernel, Layout, Mask, RunOptions,
    SdpaError, Shape,
};
use sdpa_cuda::{CudaBackend, L2Flush};
use std::sync::{Mutex, MutexGuard};

/// Held by every test here that compiles or loads programs. The disk-cache test points the process-wide
/// `SDPA_CUDA_CACHE` at a directory of its own and counts the files in it, so no other test may compile
/// (and store its images there) meanwhile: cargo runs a binary's tests on parallel threads (session 23's
/// device call saw the warm-up test's ten images land in the cache test's directory).
static COMPILING: Mutex<()> = Mutex::new(());

fn compiling() -> MutexGuard<'static, ()> {
    // A test that panicked while holding it poisons it; the next test still runs.
    COMPILING.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn opening_a_missing_device_is_an_error_not_a_panic() {
    match CudaBackend::new(0) {
        Ok(g) => {
            // On a GPU machine, an ordinal past the last device must still be a clean error.
            let count = cudarc::driver::result::device::get_count().expect("driver works");
            match CudaBackend::new(count as usize + 3) {
                Err(SdpaError::DeviceUnavailable { reason, .. }) => assert!(reason.contains("no GPU with ordinal")),
                other => panic!("expected DeviceUnavailable, got {other:?}"),
            }
            eprintln!("GPU present: {}", sdpa_core::Backend::device_name(&g));
        }
        Err(SdpaError::DeviceUnavailable { backend, reason }) => {
            assert_eq!(backend, "cuda");
            assert!(
                reason.contains("no CUDA driver found") || reason.contains("no GPU") || reason.contains("initialise"),
                "{reason}"
            );
        }
        Err(other) => panic!("expected DeviceUnavailable, got {other}"),
    }
}

/// A warm-up compiles exactly the programs the calls need (one instantiation each, on parallel threads),
/// stores them on disk, and a fresh backend reads them back without compiling or rewriting a file.
#[test]
fn programs_compile_once_per_instantiation_and_are_cached_on_disk() {
    use sdpa_cuda::images::Origin;
    let _alone = compiling();
    let Some(g) = gpu() else { return };
    let dir = std::env::temp_dir().join(format!("sdpa-cuda-cache-test-{}", std::process::id()));
    // The cache directory is read per compile; this test owns its process-wide setting while it holds
    // `COMPILING`, which every other test here that compiles takes too.
    std::env::set_var("SDPA_CUDA_CACHE", &dir);
    let bf16 = |sq, sk, mask| AttentionSpec::new(Shape::new(2, 8, sq, sk, 128), DType::BF16).with_mask(mask);
    let calls = [
        (bf16(1000, 1000, Mask::CausalBottomRight), RunOptions { kernel: Kernel::Fa2, ..Default::default() }),
        (bf16(1, 8192, Mask::None), RunOptions { kernel: Kernel::SplitKv, ..Default::default() }),
        (bf16(77, 77, Mask::None), RunOptions { kernel: Kernel::Fa1, ..Default::default() }),
    ];
    let wanted: Vec<String> =
        calls.iter().flat_map(|(s, o)| g.programs_for(s, o).expect("plannable")).map(|p| p.name).collect();
    assert_eq!(wanted.len(), 3, "one program per call: {wanted:?}");
    let t = std::time::Instant::now();
    let loads = g.warm_up(&calls).expect("the programs compile and load").loads;
    let first = t.elapsed();
    let names: Vec<&str> = loads.iter().map(|l| l.program.as_str()).collect();
    assert_eq!(names, wanted.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(loads.iter().all(|l| l.origin == Origin::Compiled), "{loads:?}");
    assert!(g.warm_up(&calls).expect("already loaded").loads.is_empty(), "a second warm-up loaded again");
    let stamp = |d: &std::path::Path| {
        let mut v: Vec<_> = std::fs::read_dir(d)
            .expect("cache dir created")
            .flatten()
            .map(|e| (e.file_name(), e.metadata().map(|m| m.len()).ok()))
            .collect();
        v.sort();
        v
    };
    let before = stamp(&dir);
    assert_eq!(before.len(), wanted.len(), "{before:?}");
    // A fresh backend (nothing loaded) reads the images: no compile, no new file.
    let g2 = CudaBackend::new(0).expect("gpu");
    let t = std::time::Instant::now();
    let loads = g2.warm_up(&calls).expect("loads from cache").loads;
    let second = t.elapsed();
    eprintln!("first warm-up {first:.2?} ({} programs compiled), from the disk cache {second:.2?}", wanted.len());
    assert!(loads.iter().all(|l| l.origin == Origin::DiskCache), "{loads:?}");
    assert_eq!(before, stamp(&dir), "the second warm-up compiled again");
    std::env::remove_var("SDPA_CUDA_CACHE");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A warm-up loads exactly what the calls then launch: after it, running each call loads nothing more.
/// The calls cover every family and the variants chosen by layout and device (fa1's tiled SIMT and
/// tensor-core entries, the tf32 wgmma entry, splitkv's TMA and bulk paths, the small and deep fa2 tiles, and
/// on sm_90 the fa3 entry `auto` takes for the long causal call, whose deep fa2 tile is asked for by name).
#[test]
fn a_warm_up_loads_what_the_calls_launch() {
    let _alone = compiling();
    let Some(g) = gpu() else { return };
    let spec = |b, hq, hkv, sq, sk, d, dtype, mask| {
        AttentionSpec::new(Shape { b, hq, hkv, sq, sk, d, dv: d }, dtype).with_mask(mask)
    };
    let opts = |kernel, f32_math| RunOptions { kernel, f32_math, ..Default::default() };
    let calls = [
        (spec(1, 4, 4, 200, 200, 80, DType::F32, Mask::None), opts(Kernel::Fa1, F32Math::Exact)),
        (spec(1, 4, 2, 200, 300, 128, DType::BF16, Mask::CausalBottomRight), opts(Kernel::Fa1, F32Math::Exact)),
        (spec(1, 4, 4, 200, 200, 128, DType::F32, Mask::CausalTopLeft), opts(Kernel::Fa2, F32Math::Tf32)),
        (spec(1, 8, 2, 1, 9000, 128, DType::BF16, Mask::None), opts(Kernel::SplitKv, F32Math::Exact)),
        (spec(1, 8, 8, 1, 3000, 96, DType::F16, Mask::None), opts(Kernel::Auto, F32Math::Exact)),
        (spec(1, 1, 1, 64, 64, 64, DType::BF16, Mask::None), opts(Kernel::Fa2, F32Math::Exact)),
        (spec(2, 16, 16, 1000, 1000, 128, DType::F16, Mask::CausalTopLeft), opts(Kernel::Auto, F32Math::Exact)),
        (spec(2, 16, 16, 1000, 1000, 128, DType::F16, Mask::CausalTopLeft), opts(Kernel::Fa2, F32Math::Exact)),
        (spec(1, 2, 2, 70, 90, 64, DType::BF16, Mask::None), opts(Kernel::Unfused, F32Math::Exact)),
    ];
    let warmed = g.warm_up(&calls).expect("warm-up");
    assert!(warmed.skipped.is_empty(), "{:?}", warmed.skipped);
    g.take_loads().expect("log");
    for (i, (spec, opts)) in calls.iter().enumerate() {
        let inputs = HostInputs::random(spec, i as u64).expect("inputs");
        g.run_host(spec, opts, &inputs).expect("runs");
        let late = g.take_loads().expect("log");
        assert!(late.is_empty(), "call {i} ({} {}) loaded after the warm-up: {late:?}", opts.kernel, spec.shape);
    }
}

#[test]
fn event_timing_returns_one_positive_time_per_rep() {
    let _alone = compiling();
    for flush in [L2Flush::Dirty, L2Flush::Clean] {
        let Some(g) = gpu() else { return };
        let g = g.with_l2_flush(flush);
        let spec = AttentionSpec::new(Shape::new(1, 8, 512, 512, 64), DType::BF16);
        let inputs = HostInputs::random(&spec, 3).expect("valid");
        let opts = RunOptions { kernel: Kernel::Fa1, ..Default::default() };
        let (times, kernel) = g.time_host(&spec, &opts, &inputs, 2, 5).expect("timed");
        assert_eq!(kernel, Kernel::Fa1);
        assert_eq!(times.len(), 5);
        assert!(times.iter().all(|&t| t > 0.0 && t < 1000.0), "{flush:?}: {times:?}");
        // The timed calls still compute the right thing after either flush.
        let run = g.run_host(&spec, &opts, &inputs).expect("runs");
        let report = check_output(&spec, &inputs, &run.output, opts.f32_math, Some(8)).expect("checked");
        assert!(report.pass, "{flush:?}: {report:?}");
    }
}

#[test]
fn l2_flush_modes_parse() {
    assert_eq!("dirty".parse::<L2Flush>().expect("parses"), L2Flush::Dirty);
    assert_eq!("clean".parse::<L2Flush>().expect("parses"), L2Flush::Clean);
    assert!("warm".parse::<L2Flush>().is_err());
}

#[test]
fn forward_on_a_callers_stream_and_slices() {
    let _alone = compiling();
    let Some(g) = gpu() else { return };
    let shape = Shape { b: 2, hq: 4, hkv: 2, sq: 37, sk: 80, d: 64, dv: 64 };
    let spec = AttentionSpec::new(shape, DType::F16).with_layout(Layout::Bshd).with_mask(Mask::CausalBottomRight);
    let inputs = HostInputs::random(&spec, 11).expect("valid");
    let stream = g.device().context().new_stream().expect("a second stream");
    let up = |b: &HostBuffer| match b {
        HostBuffer::F16(v) => stream.clone_htod(v).expect("upload"),
        _ => unreachable!("f16 spec"),
    };
    let (q, k, v) = (up(&inputs.q), up(&inputs.k), up(&inputs.v));
    let o_len = spec.required_len(sdpa_core::Operand::O).expect("len");
    let mut o = stream.clone_htod(&vec![half::f16::NAN; o_len]).expect("poisoned output");
    let mut lse = stream.alloc_zeros::<f32>(spec.lse_len().expect("len")).expect("lse");
    let opts = RunOptions { kernel: Kernel::Fa1, f32_math: F32Math::Exact, threads: None, lse: true };
    let ran = g
        .forward_on_stream(&stream, &spec, &opts, &q, &k, &v, None, &mut o, Some(&mut lse), None)
        .expect("runs on the stream");
    assert_eq!(ran, Kernel::Fa1);
    let out = HostOutput {
        o: HostBuffer::F16(stream.clone_dtoh(&o).expect("download")),
        lse: Some(stream.clone_dtoh(&lse).expect("download")),
    };
    let r = check_output(&spec, &inputs, &out, F32Math::Exact, None).expect("check");
    assert!(r.pass, "{r:?}");
    // A view into a larger allocation works too (candle hands out views with offsets).
    let big = stream
        .clone_htod(
            &[
                vec![half::f16::ZERO; 8],
                match &inputs.q {
                    HostBuffer::F16(v) => v.clone(),
                    _ => unreachable!(),
                },
            ]
            .concat(),
        )
        .expect("upload");
    let q_view = big.slice(8..);
    g.forward_on_stream(&stream, &spec, &opts, &q_view, &k, &v, None, &mut o, Some(&mut lse), None).expect("view");
    let o2 = stream.clone_dtoh(&o).expect("download");
    let out2 = HostOutput { o: HostBuffer::F16(o2), lse: None };
    assert!(check_output(&spec, &inputs, &out2, F32Math::Exact, None).expect("check").pass);
}
