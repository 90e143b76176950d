//! The one measurement path of `sdpa run` and `sdpa bench`: the backend's capability check, one checked
//! call on a NaN-poisoned output (it also compiles GPU kernels and warms caches), repetitions sized by a
//! [`Repetitions`] policy, timing through the backend's `time_host` (device events on the GPU), and a
//! [`BenchRecord`] stamped with its [`provenance`].

use sdpa_core::check::{check_output, CheckReport};
use sdpa_core::{
    AttentionSpec, BenchRecord, DType, FirstCall, HostBackend, HostInputs, Kernel, RunOptions, SdpaError, TimeStats,
};

/// Most timed calls per configuration (`--reps`, a spec's `reps`): the samples are kept in memory, and a
/// median needs far fewer.
pub const MAX_REPS: usize = 100_000;
/// Most untimed warm-up calls per configuration.
pub const MAX_WARMUP: usize = 10_000;

/// Refuses counts no measurement needs and that would hang or exhaust the machine: repetitions and
/// warm-up above [`MAX_REPS`] / [`MAX_WARMUP`], and more worker threads than four per logical CPU (each
/// thread is a real OS thread with its own stack; a hundred thousand of them hang thread-pool start-up).
pub fn check_counts(warmup: Option<usize>, reps: Option<usize>, threads: Option<usize>) -> anyhow::Result<()> {
    if reps == Some(0) {
        anyhow::bail!("--reps must be at least 1");
    }
    if let Some(n) = reps.filter(|n| *n > MAX_REPS) {
        anyhow::bail!("--reps {n} is above the limit of {MAX_REPS}");
    }
    if let Some(n) = warmup.filter(|n| *n > MAX_WARMUP) {
        anyhow::bail!("--warmup {n} is above the limit of {MAX_WARMUP}");
    }
    if threads == Some(0) {
        anyhow::bail!("--threads must be at least 1");
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if let Some(n) = threads.filter(|n| *n > 4 * cpus) {
        anyhow::bail!(
            "--threads {n} is more than four per logical CPU (this machine has {cpus}; at most {})",
            4 * cpus
        );
    }
    Ok(())
}

/// How many calls to time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Repetitions {
    /// `sdpa run`: `reps` timed calls after `warmup`, cut to 3 with no warm-up when the checked first call
    /// took over half a second, so slow backends (the reference) keep the command to a few seconds.
    Fixed {
        /// Untimed calls before timing.
        warmup: usize,
        /// Timed calls.
        reps: usize,
    },
    /// `sdpa bench`: one probe call, then as many calls as fit `budget_s` (at least 3 unless one call
    /// alone exceeds the budget, at most `max_reps`); warm-up cut to one call when it alone would exceed it.
    Budget {
        /// Untimed calls before timing.
        warmup: usize,
        /// Most timed calls.
        max_reps: usize,
        /// Seconds of timed calls to aim for.
        budget_s: f64,
    },
}

/// What one measurement does besides timing.
#[derive(Debug, Clone, Copy)]
pub struct Measure {
    /// Compare the first call's output with the f64 reference.
    pub check: bool,
    /// Rows to compare; `None` lets [`check_rows`] choose.
    pub check_rows: Option<usize>,
    /// The repetition policy.
    pub reps: Repetitions,
    /// Record the seconds from process start to the end of the first call (`sdpa run`: the wait for a
    /// first result; in a sweep it would count the configurations before it).
    pub since_process_start: bool,
}

/// Why a measurement has no record.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// The backend refused or failed the call (unsupported, unavailable, out of memory, or broken).
    #[error(transparent)]
    Call(#[from] SdpaError),
    /// The reference comparison itself failed to run.
    #[error("reference check: {0}")]
    Check(SdpaError),
    /// Every timing sample was missing or not finite.
    #[error("no valid timing samples")]
    NoSamples,
}

impl MeasureError {
    /// True for "cannot run here" (unsupported, device unavailable, out of memory) rather than "broke":
    /// sweeps record such configurations as skipped, not failed.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            MeasureError::Call(
                SdpaError::Unsupported { .. } | SdpaError::DeviceUnavailable { .. } | SdpaError::OutOfMemory { .. }
            )
        )
    }
}

/// Checks, times and records one configuration; `backend` and `kernel` names come from `be` and `opts`.
pub fn measure(
    be: &dyn HostBackend,
    spec: &AttentionSpec,
    opts: &RunOptions,
    inputs: &HostInputs,
    how: &Measure,
) -> Result<BenchRecord, MeasureError> {
    be.capabilities().check(be.name(), spec, opts)?;
    // Loads logged before this call (an earlier configuration's) are not this call's.
    be.program_loads();
    let start = std::time::Instant::now();
    let first = be.run_host(spec, opts, inputs)?;
    let first_s = start.elapsed().as_secs_f64();
    let mut first_call = FirstCall::new(first_s, be.program_loads());
    if how.since_process_start {
        first_call.since_process_start_s = crate::process_age_s();
    }
    let check: Option<CheckReport> = if how.check {
        let rows = check_rows(spec, how.check_rows);
        Some(check_output(spec, inputs, &first.output, opts.f32_math, rows).map_err(MeasureError::Check)?)
    } else {
        None
    };
    drop(first);

    let (warmup, reps) = repetitions(how.reps, first_s - first_call.kernel_setup_s(), || {
        let (t, _) = be.time_host(spec, opts, inputs, 0, 1)?;
        Ok(t.first().copied().unwrap_or(0.0))
    })?;
    let (times, ran) = be.time_host(spec, opts, inputs, warmup, reps)?;
    let stats = TimeStats::from_samples(&times).ok_or(MeasureError::NoSamples)?;

    let mut rec = BenchRecord::new(be.name(), opts.kernel.name(), &be.device_name(), spec, stats, check);
    if opts.kernel == Kernel::Auto {
        rec.auto_chose = Some(ran.name().to_string());
    }
    finish(be, spec, opts, &mut rec, first_call);
    Ok(rec)
}

/// (warm-up, timed calls) under a policy, for a configuration whose checked first call took `first_s`
/// seconds besides compiling kernels; `probe` times one call in milliseconds (asked for by the budget policy
/// only).
pub fn repetitions(
    policy: Repetitions,
    first_s: f64,
    probe: impl FnOnce() -> Result<f64, SdpaError>,
) -> Result<(usize, usize), SdpaError> {
    Ok(match policy {
        // A slow call gets few repetitions; what the first call spent compiling kernels does not count.
        Repetitions::Fixed { reps, .. } if first_s > 0.5 => (0, reps.clamp(1, 3)),
        Repetitions::Fixed { warmup, reps } => (warmup, reps.max(1)),
        Repetitions::Budget { warmup, max_reps, budget_s } => {
            // One timed call sizes the repetitions to the budget.
            let probe = probe()? * 1e-3;
            let fit = if probe > 0.0 { (budget_s / probe) as usize } else { max_reps };
            let min_reps = if probe <= budget_s { 3 } else { 1 };
            let reps = fit.max(min_reps).min(max_reps).max(1);
            let warmup = if probe * warmup as f64 > budget_s { warmup.min(1) } else { warmup };
            (warmup, reps)
        }
    })
}

/// What every record of `be` carries besides its timing and check: CPU threads, the f32 math mode, the first
/// call, and where and when it was measured.
pub fn finish(be: &dyn HostBackend, spec: &AttentionSpec, opts: &RunOptions, rec: &mut BenchRecord, first: FirstCall) {
    rec.threads = opts.threads.or_else(|| (be.name() == "cpu").then(provenance::rayon_threads).flatten());
    if spec.dtype == DType::F32 {
        rec.f32_math = Some(opts.f32_math.name().to_string());
    }
    rec.first_call = Some(first);
    rec.gpus = Some(be.gpus()).filter(|&n| n > 1);
    provenance::stamp(rec);
}

/// Rows compared with the reference: all of them while the reference work stays under ~2e8 multiply-adds
/// (a fraction of a second), otherwise an evenly spread sample (first and last row included) of that size.
pub fn check_rows(spec: &AttentionSpec, explicit: Option<usize>) -> Option<usize> {
    if explicit.is_some() {
        return explicit;
    }
    let s = &spec.shape;
    let per_row = (s.sk as f64) * ((s.d + s.dv) as f64);
    // A ragged batch has its own token count; its longest sequence bounds the keys per row.
    let q_rows = spec.ragged.as_ref().map_or(s.b * s.sq, |r| r.total_q());
    let rows = (q_rows * s.hq) as f64;
    if rows * per_row <= 2e8 {
        None
    } else {
        Some(((2e8 / per_row) as usize).clamp(64, 4096))
    }
}

/// Where and when a record was measured: the commit, the date and the machine, computed once per process.
pub mod provenance {
    use sdpa_core::BenchRecord;
    use std::sync::OnceLock;

    /// Stamps `rec` with the commit, the current date and the machine.
    pub fn stamp(rec: &mut BenchRecord) {
        rec.commit = commit();
        rec.date = Some(utc_now());
        rec.machine = Some(machine());
    }

    /// The commit of the code that runs: the one this binary was built from (stamped by `build.rs`), or,
    /// for a build outside a git checkout, the checkout the command runs in.
    pub fn commit() -> Option<String> {
        static COMMIT: OnceLock<Option<String>> = OnceLock::new();
        COMMIT
            .get_or_init(|| {
                if let Some(c) = option_env!("SDPA_BUILD_COMMIT") {
                    return Some(c.to_string());
                }
                let out = std::process::Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().ok()?;
                out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
            })
            .clone()
    }

    /// CPU model (`sdpa_core::hardware::cpu_model`), thread count and host name.
    pub fn machine() -> String {
        static MACHINE: OnceLock<String> = OnceLock::new();
        MACHINE
            .get_or_init(|| {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default();
                let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
                let mut s = format!("{} ({threads} threads)", sdpa_core::hardware::cpu_model());
                if !host.is_empty() {
                    s.push_str(&format!(", host {host}"));
                }
                s
            })
            .clone()
    }

    /// `RAYON_NUM_THREADS` when set (what the CPU backend's global pool uses), else the core count.
    pub fn rayon_threads() -> Option<usize> {
        std::env::var("RAYON_NUM_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|n| *n > 0)
            .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
    }

    /// Current UTC time as RFC 3339 (civil date from the Unix day count; no time-zone database needed).
    pub fn utc_now() -> String {
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let (days, rem) = (secs / 86_400, secs % 86_400);
        // Howard Hinnant's days-to-civil algorithm.
        let z = days as i64 + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z - era * 146_097;
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = doy - (153 * mp + 2) / 5 + 1;
        let m = if mp < 10 { mp + 3 } else { mp - 9 };
        let y = yoe + era * 400 + i64::from(m <= 2);
        format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sdpa_core::{ReferenceBackend, Shape};

    #[test]
    fn counts_beyond_the_limits_are_refused_before_anything_runs() {
        assert!(check_counts(Some(3), Some(20), Some(1)).is_ok());
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        for (w, r, t, want) in [
            (None, Some(0), None, "at least 1"),
            (None, Some(4_294_967_296), None, "limit"),
            (Some(MAX_WARMUP + 1), None, None, "limit"),
            (None, None, Some(0), "at least 1"),
            (None, None, Some(100_000), "four per logical CPU"),
        ] {
            let err = check_counts(w, r, t).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
        assert!(check_counts(None, None, Some(4 * cpus)).is_ok());
    }

    #[test]
    fn big_shapes_are_checked_on_a_sample_of_rows() {
        let small = AttentionSpec::new(Shape::new(1, 8, 256, 256, 64), DType::BF16);
        assert_eq!(check_rows(&small, None), None);
        let big = AttentionSpec::new(Shape::new(1, 32, 16384, 16384, 128), DType::BF16);
        let n = check_rows(&big, None).unwrap();
        assert!((64..=4096).contains(&n));
        assert_eq!(check_rows(&big, Some(7)), Some(7));
    }

    #[test]
    fn both_policies_give_checked_stamped_records() {
        let spec = AttentionSpec::new(Shape::new(1, 2, 33, 47, 16), DType::F32);
        let inputs = HostInputs::random(&spec, 1).unwrap();
        let opts = RunOptions::default();
        for reps in
            [Repetitions::Fixed { warmup: 1, reps: 4 }, Repetitions::Budget { warmup: 1, max_reps: 5, budget_s: 10.0 }]
        {
            let how = Measure { check: true, check_rows: None, reps, since_process_start: false };
            let rec = measure(&ReferenceBackend, &spec, &opts, &inputs, &how).unwrap();
            assert!(rec.check.as_ref().is_some_and(|c| c.pass), "{reps:?}");
            let want = match reps {
                Repetitions::Fixed { reps, .. } => reps,
                Repetitions::Budget { max_reps, .. } => max_reps,
            };
            assert_eq!(rec.time_ms.reps, want, "{reps:?}");
            assert!(rec.date.is_some() && rec.machine.is_some());
        }
    }
}
