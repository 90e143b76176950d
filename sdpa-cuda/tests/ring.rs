//! Ring attention across GPUs (`sdpa_cuda::ring`) on the gathered sequence: against the f64 reference on
//! small shapes (causal in both alignments, no mask, GQA, f16 and bf16, LSE, lengths not divisible by 2N,
//! batches of two), against our single-GPU kernel on a large one, and the backward's dQ, dK, dV against the
//! reference gradients and the single-GPU backward. Runs over every GPU count from 1 to the GPUs present
//! (at most 4). Skips with the reason printed when there is no GPU or no NCCL; `SDPA_REQUIRE_RING=1` (the
//! multi-GPU run script) turns that into a failure. The tests at the top run everywhere.

use sdpa_core::backward::check_gradients;
use sdpa_core::check::check_output;
use sdpa_core::{
    AttentionSpec, BackwardOptions, DType, F32Math, GradInputs, HostBackend, HostBuffer, HostInputs, Kernel, Mask,
    RunOptions, SdpaError, Shape,
};
use sdpa_cuda::{CudaBackend, RingBackend};

fn shape(b: usize, hq: usize, hkv: usize, s: usize, d: usize) -> Shape {
    Shape { b, hq, hkv, sq: s, sk: s, d, dv: d }
}

fn opts() -> RunOptions {
    RunOptions { kernel: Kernel::Auto, lse: true, ..Default::default() }
}

/// Rings of 1..=min(GPUs, 4) GPUs, or none with the reason printed.
fn rings() -> Vec<RingBackend> {
    let require = std::env::var_os("SDPA_REQUIRE_RING").is_some_and(|v| v == "1");
    let mut out = Vec::new();
    for n in 1..=4 {
        match RingBackend::new(n) {
            Ok(r) => out.push(r),
            Err(e) => {
                if out.len() < 2 {
                    assert!(!require, "SDPA_REQUIRE_RING=1 but a ring of {n} GPUs cannot open: {e}");
                }
                eprintln!("no ring of {n} GPUs: {e}");
                break;
            }
        }
    }
    out
}

/// Without a GPU (or without NCCL) opening a ring is an error value with the reason, never a panic.
#[test]
fn a_ring_without_gpus_or_nccl_is_an_error() {
    match RingBackend::new(2) {
        Ok(r) => assert_eq!(HostBackend::gpus(&r), 2),
        Err(e) => {
            assert!(matches!(e, SdpaError::DeviceUnavailable { .. }), "{e:?}");
            assert!(!e.to_string().is_empty());
        }
    }
    match sdpa_cuda::ring::nccl::nccl() {
        Ok(n) => assert!(n.version > 0, "{n:?}"),
        Err(e) => assert!(e.to_string().contains("NCCL not found"), "{e}"),
    }
    assert!(matches!(RingBackend::new(0), Err(SdpaError::InvalidSpec(_))));
}

fn spec(s: Shape, dtype: DType, mask: Mask) -> AttentionSpec {
    AttentionSpec::new(s, dtype).with_mask(mask)
}

/// Whether the ring's GPUs are Hopper (sm_90), where `auto` runs the forward steps on `fa3`.
fn hopper(ring: &RingBackend) -> bool {
    ring.ranks().iter().all(|r| r.gpu.device().info().compute_capability == (9, 0))
}

/// Small shapes against the f64 reference, every row, with the LSE, with the steps on each kernel the
/// ring takes: `auto` (fa3 on Hopper where it takes the steps), `fa2`, and `fa3` (refused with the reason
/// off Hopper and at head dims it lacks).
#[test]
fn ring_forward_matches_the_reference() {
    let rings = rings();
    let cases = [
        (shape(1, 4, 4, 256, 64), DType::BF16, Mask::CausalTopLeft),
        (shape(1, 4, 4, 203, 64), DType::BF16, Mask::CausalTopLeft),
        (shape(2, 8, 2, 131, 128), DType::F16, Mask::CausalBottomRight),
        (shape(1, 8, 1, 77, 128), DType::BF16, Mask::None),
        (shape(2, 4, 4, 300, 96), DType::F16, Mask::None),
        (shape(1, 6, 2, 1000, 128), DType::BF16, Mask::CausalTopLeft),
    ];
    for ring in &rings {
        for kernel in [Kernel::Auto, Kernel::Fa2, Kernel::Fa3] {
            for (i, (s, dtype, mask)) in cases.iter().enumerate() {
                let spec = spec(*s, *dtype, *mask);
                let label =
                    format!("{} GPUs, {kernel}, {} {dtype} {}", HostBackend::gpus(ring), s.labelled(), mask.name());
                let inputs = HostInputs::random(&spec, 7 + i as u64).expect("inputs");
                let fa3_takes = hopper(ring) && sdpa_cuda::kernels::fa3::refuses(&spec).is_none();
                let opts = RunOptions { kernel, ..opts() };
                let run = match ring.run_host(&spec, &opts, &inputs) {
                    Ok(run) => run,
                    Err(e) if kernel == Kernel::Fa3 && !fa3_takes => {
                        assert!(matches!(e, SdpaError::Unsupported { .. }), "{label}: {e:?}");
                        assert!(e.to_string().contains("fa3"), "{label}: {e}");
                        continue;
                    }
                    Err(e) => panic!("{label}: {e}"),
                };
                let expected = match kernel {
                    Kernel::Fa2 => Kernel::Fa2,
                    _ if fa3_takes => Kernel::Fa3,
                    _ => Kernel::Fa2,
                };
                assert_eq!(run.kernel, expected, "{label}: the steps ran another kernel");
                let rep = check_output(&spec, &inputs, &run.output, F32Math::Exact, None).expect("check");
                assert!(rep.pass, "{label}: {:?}\n{rep:?}", rep.failure());
                assert!(rep.lse_max_abs_err.is_some_and(|e| e < 1e-3), "{label}: LSE {rep:?}");
            }
        }
    }
}

fn halves(b: &HostBuffer) -> Vec<f32> {
    b.to_f32_vec()
}

/// Largest difference between two outputs, relative to the largest magnitude.
fn rel_diff(a: &HostBuffer, b: &HostBuffer) -> f64 {
    let (a, b) = (halves(a), halves(b));
    assert_eq!(a.len(), b.len());
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max) as f64 / scale as f64
}

/// A large causal shape: the ring's output and LSE against our single-GPU kernel on the gathered sequence
/// (and sampled rows against the reference).
#[test]
fn ring_forward_matches_the_single_gpu_kernel_on_a_long_sequence() {
    let rings = rings();
    let Some(gpu) = rings.first().and_then(|_| CudaBackend::new(0).ok()) else { return };
    for mask in [Mask::CausalTopLeft, Mask::None] {
        let spec = spec(shape(1, 8, 2, 8190, 128), DType::BF16, mask);
        let inputs = HostInputs::random(&spec, 3).expect("inputs");
        let single = gpu.run_host(&spec, &opts(), &inputs).expect("single GPU");
        for (ring, kernel) in rings.iter().skip(1).flat_map(|r| [(r, Kernel::Auto), (r, Kernel::Fa2)]) {
            let label = format!("{} GPUs {} {kernel}", HostBackend::gpus(ring), mask.name());
            let run = ring.run_host(&spec, &RunOptions { kernel, ..opts() }, &inputs).expect(&label);
            let d = rel_diff(&single.output.o, &run.output.o);
            assert!(d < 2e-2, "{label}: output differs from the single GPU's by {d:e} of its largest value");
            let (Some(a), Some(b)) = (&single.output.lse, &run.output.lse) else { panic!("{label}: no LSE") };
            let lse = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
            assert!(lse < 1e-3, "{label}: LSE differs by {lse}");
            let rep = check_output(&spec, &inputs, &run.output, F32Math::Exact, Some(256)).expect("check");
            assert!(rep.pass, "{label}: {:?}", rep.failure());
        }
    }
}

/// dQ, dK, dV of the ring backward against the f64 reference gradients (the ring's own forward gives O and
/// the LSE), and against the single-GPU backward on the same inputs.
#[test]
fn ring_backward_matches_the_reference_and_the_single_gpu_backward() {
    let rings = rings();
    let gpu = rings.first().and_then(|_| CudaBackend::new(0).ok());
    let cases = [
        (shape(1, 4, 4, 256, 64), DType::BF16, Mask::CausalTopLeft),
        (shape(1, 8, 2, 203, 128), DType::F16, Mask::CausalBottomRight),
        (shape(2, 4, 2, 150, 128), DType::BF16, Mask::None),
    ];
    let bwd = BackwardOptions::default();
    for ring in &rings {
        for (i, (s, dtype, mask)) in cases.iter().enumerate() {
            let spec = spec(*s, *dtype, *mask);
            let label = format!("{} GPUs, {} {dtype} {}", HostBackend::gpus(ring), s.labelled(), mask.name());
            let inputs = HostInputs::random(&spec, 11 + i as u64).expect("inputs");
            let grads = GradInputs::from_forward(&spec, ring, &opts(), &inputs, 99).expect("ring forward");
            // With fa3 asked for (where the forward steps take it) the backward still runs: on fa2's backward.
            let kernel = if hopper(ring) && i == 0 { Kernel::Fa3 } else { Kernel::Auto };
            let run_opts = RunOptions { kernel, ..opts() };
            let got = ring.run_backward_host(&spec, &run_opts, &bwd, &inputs, &grads).expect(&label);
            assert_eq!(got.run.kernel, Kernel::Fa2, "{label}");
            let rep = check_gradients(&spec, &inputs, &grads, &got, F32Math::Exact, None).expect("checks");
            assert!(rep.pass, "{label}: {:?}\n{rep:?}", rep.failure());
            if let Some(gpu) = &gpu {
                let single = gpu.run_backward_host(&spec, &opts(), &bwd, &inputs, &grads).expect("single GPU");
                for (name, a, b) in
                    [("dq", &single.dq, &got.dq), ("dk", &single.dk, &got.dk), ("dv", &single.dv, &got.dv)]
                {
                    let d = rel_diff(a, b);
                    assert!(d < 2e-2, "{label}: {name} differs from the single GPU's by {d:e}");
                }
            }
        }
    }
}

/// What the ring cannot express is refused with a reason before any GPU work.
#[test]
fn ring_refuses_what_it_cannot_run() {
    let rings = rings();
    let Some(ring) = rings.last() else { return };
    let n = HostBackend::gpus(ring);
    for (s, dtype) in [(shape(1, 2, 2, 2 * n - 1, 64), DType::BF16), (shape(1, 2, 2, 64, 64), DType::F32)] {
        let spec = spec(s, dtype, Mask::None);
        let inputs = HostInputs::random(&spec, 0).expect("inputs");
        assert!(ring.run_host(&spec, &opts(), &inputs).is_err(), "{} {dtype}", s.labelled());
    }
    let uneven = AttentionSpec::new(Shape::new(1, 2, 64, 128, 64), DType::BF16);
    let inputs = HostInputs::random(&uneven, 0).expect("inputs");
    assert!(ring.run_host(&uneven, &opts(), &inputs).is_err());
}

/// The resident entry point: shards cut once and kept on the GPUs give what the host path gives (forward
/// bit for bit, the same kernels run; the backward within rounding), misfit shards are refused, and the host path's held
/// shards are replaced when the inputs change (a stale reuse would fail the reference check).
#[test]
fn resident_shards_give_the_host_path_results_and_stale_shards_are_never_reused() {
    let rings = rings();
    let bwd = BackwardOptions::default();
    for ring in rings.iter().skip(1) {
        let n = HostBackend::gpus(ring);
        let spec = spec(shape(1, 4, 2, 203, 64), DType::BF16, Mask::CausalTopLeft);
        let inputs = HostInputs::random(&spec, 5).expect("inputs");
        let host = ring.run_host(&spec, &opts(), &inputs).expect("host forward");
        let io = ring.shard_forward(&spec, &inputs.q, &inputs.k, &inputs.v).expect("shards");
        let ran = ring.forward_resident(&spec, &opts(), &io).expect("resident forward");
        assert_eq!(ran, host.kernel, "{n} GPUs");
        let mut o = HostBuffer::poisoned(spec.dtype, host.output.o.len());
        let mut lse = HostBuffer::poisoned(DType::F32, spec.lse_len().expect("lse"));
        ring.gather_forward(&spec, &io, &mut o, Some(&mut lse)).expect("gather");
        assert_eq!(o, host.output.o, "{n} GPUs: resident O differs from the host path's");
        assert_eq!(lse.to_f32_vec(), host.output.lse.clone().expect("lse"), "{n} GPUs: LSE");
        let (times, _) =
            ring.time_resident(&spec, &opts(), &bwd, sdpa_core::Pass::Fwd, &io, None, 1, 2).expect("timed resident");
        assert!(times.len() == 2 && times.iter().all(|t| t.is_finite() && *t > 0.0), "{times:?}");

        // The backward on the same shards (O and LSE as the forward left them) against the host path's.
        let grads = GradInputs::from_forward(&spec, ring, &opts(), &inputs, 17).expect("grads");
        let host_g = ring.run_backward_host(&spec, &opts(), &bwd, &inputs, &grads).expect("host backward");
        let b = ring.shard_backward(&spec, &grads.d_o).expect("dO shards");
        ring.backward_resident(&spec, &opts(), &bwd, &io, &b).expect("resident backward");
        let mut d = [&host_g.dq, &host_g.dk, &host_g.dv].map(|x| HostBuffer::poisoned(spec.dtype, x.len()));
        let [dq, dk, dv] = &mut d;
        ring.gather_grads(&spec, &b, dq, dk, dv).expect("gather grads");
        // The backward adds dQ with atomics (order-dependent in f32): equal within rounding, not bitwise.
        for (name, got, want) in [("dq", &d[0], &host_g.dq), ("dk", &d[1], &host_g.dk), ("dv", &d[2], &host_g.dv)] {
            let diff = rel_diff(got, want);
            assert!(diff < 1e-2, "{n} GPUs: resident {name} differs from the host path's by {diff:e}");
        }

        // Shards of another shape are refused before any GPU work.
        let other = sdpa_core::AttentionSpec::new(shape(1, 4, 2, 205, 64), DType::BF16);
        let err = ring.forward_resident(&other, &opts(), &io).expect_err("misfit shards");
        assert!(matches!(err, SdpaError::BufferTooShort { .. }), "{err:?}");
        assert!(ring.forward_resident(&spec, &opts(), &io[..1]).is_err(), "one rank's shards for {n} GPUs");

        // New inputs of the same spec after the held ones: the output is the new inputs' (checked against
        // the reference), not the held shards'.
        let fresh = HostInputs::random(&spec, 6).expect("inputs");
        let run = ring.run_host(&spec, &opts(), &fresh).expect("second host forward");
        let rep = check_output(&spec, &fresh, &run.output, F32Math::Exact, None).expect("check");
        assert!(rep.pass, "{n} GPUs: held shards reused for new inputs: {:?}", rep.failure());
        ring.release_host_shards();
    }
}
