//! The measurement of a backward pass (`--pass bwd` or `fwd+bwd`), the backward's counterpart of
//! [`crate::measure::measure`]: the backend's backward capability check, the forward with its LSE and a
//! seeded random dO ([`GradInputs::from_forward`]), one checked backward call on NaN-poisoned gradients
//! (`run_backward_host`, compared with the f64 reference by `check_gradients`), then the pass timed by
//! `time_pass_host` under the same repetition policies as the forward.
//!
//! The record's `check` is the worst of dQ, dK and dV (records hold one report); the whole
//! [`GradCheckReport`] comes back beside it for printers that name all three. `deterministic` is what the
//! backend reported for the timed calls. On backends whose buffers are host memory (cpu, reference),
//! `peak_mem_bytes` is how far the first forward and checked backward call raised the process's resident
//! memory ([`crate::peak_memory`]): O, the LSE, the buffers' copies and the scratch, O(S) for a fused
//! backward (PyTorch's records measure the same span: its forward, what autograd keeps, its backward).

use crate::measure::{check_rows, finish, repetitions, Measure, MeasureError};
use crate::peak_memory::PeakWatch;
use sdpa_core::backward::{check_gradients, GradCheckReport};
use sdpa_core::{
    AttentionSpec, BackwardOptions, BenchRecord, FirstCall, GradInputs, HostBackend, HostInputs, Kernel, Pass,
    RunOptions, TimeStats,
};

/// Backends whose buffers are host memory: the resident set measures their calls' peak memory.
const HOST_MEMORY_BACKENDS: [&str; 2] = ["cpu", "reference"];

/// Seed offset of dO against the inputs' seed, so dO is not a copy of Q's random stream.
const D_O_SEED: u64 = 0x6b6f_6f62;

/// A backward pass's record and, when checked, the three gradients' reports.
#[derive(Debug)]
pub struct Measured {
    /// The record (`pass`, `deterministic`, `check` = the worst gradient).
    pub record: BenchRecord,
    /// dQ, dK and dV against the reference.
    pub grads: Option<GradCheckReport>,
}

/// Checks, times and records `pass` (which must run the backward) of one configuration.
#[allow(clippy::too_many_arguments)]
pub fn measure_backward(
    be: &dyn HostBackend,
    spec: &AttentionSpec,
    opts: &RunOptions,
    bwd: &BackwardOptions,
    pass: Pass,
    inputs: &HostInputs,
    how: &Measure,
    seed: u64,
) -> Result<Measured, MeasureError> {
    debug_assert!(pass.has_backward(), "the forward is measured by measure::measure");
    be.capabilities().check_backward(be.name(), spec, opts)?;
    be.program_loads();
    // The first call of a training step: the forward (with LSE) and the backward, with whatever kernels they
    // compile; its gradients are the ones checked.
    let start = std::time::Instant::now();
    // The peak covers the forward too (its O and LSE, as autograd keeps them in PyTorch's measure).
    let watch = HOST_MEMORY_BACKENDS.contains(&be.name()).then(PeakWatch::start).flatten();
    let grad_in = GradInputs::from_forward(spec, be, opts, inputs, seed.wrapping_add(D_O_SEED))?;
    let first = be.run_backward_host(spec, opts, bwd, inputs, &grad_in)?;
    let first_s = start.elapsed().as_secs_f64();
    let peak_mem_bytes = watch.and_then(|w| w.peak_extra_bytes());
    let mut first_call = FirstCall::new(first_s, be.program_loads());
    if how.since_process_start {
        first_call.since_process_start_s = crate::process_age_s();
    }
    let grads = if how.check {
        let rows = check_rows(spec, how.check_rows);
        Some(check_gradients(spec, inputs, &grad_in, &first, opts.f32_math, rows).map_err(MeasureError::Check)?)
    } else {
        None
    };
    drop(first);

    let (warmup, reps) = repetitions(how.reps, first_s - first_call.kernel_setup_s(), || {
        let (t, _) = be.time_pass_host(spec, opts, bwd, inputs, &grad_in, pass, 0, 1)?;
        Ok(t.first().copied().unwrap_or(0.0))
    })?;
    let (times, ran) = be.time_pass_host(spec, opts, bwd, inputs, &grad_in, pass, warmup, reps)?;
    let stats = TimeStats::from_samples(&times).ok_or(MeasureError::NoSamples)?;

    let check = grads.map(|g| *g.worst().1);
    let mut rec =
        BenchRecord::new(be.name(), opts.kernel.name(), &be.device_name(), spec, stats, check).with_pass(spec, pass);
    if opts.kernel == Kernel::Auto {
        rec.auto_chose = Some(ran.kernel.name().to_string());
    }
    rec.deterministic = Some(ran.deterministic);
    rec.grad_check = grads;
    rec.peak_mem_bytes = peak_mem_bytes;
    finish(be, spec, opts, &mut rec, first_call);
    Ok(Measured { record: rec, grads })
}

/// `check pass: dQ rel err 1.2e-3, dK 2.0e-3 (worst), dV 9.0e-4 (tolerance 8e-2)`: the three gradients in one
/// line, the worst named.
pub fn describe_grads(g: &GradCheckReport) -> String {
    let (worst, _) = g.worst();
    let one = |name: &str, key: &str, r: &sdpa_core::check::CheckReport| {
        let mark = if key == worst { " (worst)" } else { "" };
        let nan = if r.nan_mismatches > 0 { format!(", {} NaN mismatches", r.nan_mismatches) } else { String::new() };
        format!("{name} {:.3e}{mark}{nan}", r.rel_err)
    };
    format!(
        "check {}: rel err {}, {}, {} (tolerance {:.1e}; {} query rows, {} key rows)",
        if g.pass { "pass" } else { "FAIL" },
        one("dQ", "dq", &g.dq),
        one("dK", "dk", &g.dk),
        one("dV", "dv", &g.dv),
        g.dq.tolerance,
        g.dq.rows_checked,
        g.dk.rows_checked
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::Repetitions;
    use sdpa_core::{DType, Mask, ReferenceBackend, Shape};

    /// The reference backend's backward: checked against the f64 gradients (its own, rounded once), timed
    /// under both policies, recorded with the pass's FLOPs and as deterministic.
    #[test]
    fn the_reference_backward_gives_checked_records_of_either_pass() {
        let spec = AttentionSpec::new(Shape::new(1, 4, 17, 23, 8), DType::F32).with_mask(Mask::CausalBottomRight);
        let inputs = HostInputs::random(&spec, 3).unwrap();
        let opts = RunOptions::default();
        for (pass, reps) in [
            (Pass::Bwd, Repetitions::Fixed { warmup: 1, reps: 2 }),
            (Pass::FwdBwd, Repetitions::Budget { warmup: 0, max_reps: 2, budget_s: 10.0 }),
        ] {
            let how = Measure { check: true, check_rows: None, reps, since_process_start: false };
            let m =
                measure_backward(&ReferenceBackend, &spec, &opts, &BackwardOptions::default(), pass, &inputs, &how, 0)
                    .unwrap();
            let g = m.grads.expect("checked");
            assert!(g.pass, "{}", describe_grads(&g));
            assert_eq!(m.record.pass, pass);
            assert_eq!(m.record.deterministic, Some(true));
            assert_eq!(m.record.check.map(|c| c.rel_err), Some(g.worst().1.rel_err));
            assert_eq!(m.record.time_ms.reps, 2);
            if PeakWatch::start().is_some() {
                assert!(m.record.peak_mem_bytes.is_some(), "a host backend's peak is measured where /proc allows");
            }
            let want = sdpa_core::AttentionCost::of_pass(&spec, pass).tflops(m.record.time_ms.median);
            assert!((m.record.tflops - want).abs() <= 1e-12 * want.abs().max(1.0));
        }
    }
}
