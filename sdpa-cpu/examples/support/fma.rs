//! The machine's f32 FMA ceiling, measured in the same process as the kernels it is a ceiling for: 12
//! independent FMA chains per thread, 512-bit (AVX-512: 12 x 16 lanes x 2 flops = 384 flops a round) or
//! 256-bit (AVX2 + FMA: 12 x 8 x 2 = 192), alone or on several threads at once. Included by the examples
//! with `#[path]`.

/// Runs `rounds` rounds of the 12 chains and returns their sum (so nothing is optimised away).
///
/// # Safety
/// The CPU must support AVX-512F and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
pub unsafe fn fma_loop(rounds: u64) -> f32 {
    use std::arch::x86_64::*;
    let mut a = [_mm512_set1_ps(1.0); 12];
    let (b, c) = (_mm512_set1_ps(1.000_000_1), _mm512_set1_ps(1e-7));
    for _ in 0..rounds {
        for x in a.iter_mut() {
            *x = _mm512_fmadd_ps(*x, b, c);
        }
    }
    a.iter().map(|v| _mm512_reduce_add_ps(*v)).sum()
}

/// [`fma_loop`] on 256-bit registers: the AVX2 path's ceiling (8 lanes; two FMA units where the CPU has
/// them). Twelve chains cover a latency of 4-5 cycles on two units.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn fma_loop_256(rounds: u64) -> f32 {
    use std::arch::x86_64::*;
    let mut a = [_mm256_set1_ps(1.0); 12];
    let (b, c) = (_mm256_set1_ps(1.000_000_1), _mm256_set1_ps(1e-7));
    for _ in 0..rounds {
        for x in a.iter_mut() {
            *x = _mm256_fmadd_ps(*x, b, c);
        }
    }
    let mut out = [0.0f32; 8];
    for v in a {
        let mut lanes = [0.0f32; 8];
        // SAFETY: `lanes` holds the 8 f32 the store writes.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), v) };
        out.iter_mut().zip(lanes).for_each(|(o, x)| *o += x);
    }
    out.iter().sum()
}

/// Vector width of an FMA probe: 512 (AVX-512) or 256 (AVX2) bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)] // not every example that includes this file asks for both
pub enum Width {
    W512,
    W256,
}

#[allow(dead_code)] // not every example that includes this file asks for it
impl Width {
    /// The width the SIMD path `path` computes in (`avx512*` → 512, `avx2` → 256; others: none).
    pub fn of_path(path: &str) -> Option<Width> {
        match path {
            p if p.starts_with("avx512") => Some(Width::W512),
            "avx2" => Some(Width::W256),
            _ => None,
        }
    }

    /// Flops one round of the 12 chains does.
    fn flops_per_round(self) -> f64 {
        match self {
            Width::W512 => 12.0 * 16.0 * 2.0,
            Width::W256 => 12.0 * 8.0 * 2.0,
        }
    }

    /// Whether this CPU runs the probe.
    fn supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Width::W512 => is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma"),
                Width::W256 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// `rounds` rounds of the chains on this thread; NaN-free sum. Callers check `supported` first.
    fn run(self, rounds: u64) -> f32 {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: callers run this only where `supported()` is true (the probe's features are present).
            match self {
                Width::W512 => unsafe { fma_loop(rounds) },
                Width::W256 => unsafe { fma_loop_256(rounds) },
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = rounds;
            0.0
        }
    }
}

/// Single-thread f32 FMA rate right now: the fastest of 200 short trials of the 12 512-bit chains (wall
/// clock; the minimum is the trial nothing else interrupted). NaN without AVX-512 or with `NOPEAK` set.
#[allow(dead_code)] // not every example that includes this file asks for it
pub fn peak_gflops() -> f64 {
    peak_gflops_of(Width::W512)
}

/// [`peak_gflops`] for chains of `width`.
#[allow(dead_code)] // not every example that includes this file asks for it
pub fn peak_gflops_of(width: Width) -> f64 {
    if std::env::var_os("NOPEAK").is_some() || !width.supported() {
        return f64::NAN;
    }
    let mut best = f64::INFINITY;
    for _ in 0..200 {
        let t = std::time::Instant::now();
        std::hint::black_box(width.run(20_000));
        best = best.min(t.elapsed().as_secs_f64());
    }
    20_000.0 * width.flops_per_round() / best / 1e9
}

/// The f32 FMA rate of `threads` threads running the chains at once (GFLOP/s, all threads together):
/// each thread runs `trials` short trials in step with the others (a barrier before each), and the trial
/// is timed from the barrier to the last thread's end; the fastest trial is the one nothing else
/// interrupted. This is the ceiling a kernel on `threads` threads is measured against. NaN where the CPU
/// lacks the width.
#[allow(dead_code)] // not every example that includes this file asks for it
pub fn peak_gflops_threads(width: Width, threads: usize, trials: usize) -> f64 {
    if !width.supported() || threads == 0 {
        return f64::NAN;
    }
    const ROUNDS: u64 = 50_000;
    let barrier = std::sync::Barrier::new(threads);
    let done = std::sync::Mutex::new(vec![std::time::Instant::now(); trials]);
    let start = std::sync::Mutex::new(vec![std::time::Instant::now(); trials]);
    std::thread::scope(|sc| {
        for _ in 0..threads {
            let (barrier, done, start) = (&barrier, &done, &start);
            sc.spawn(move || {
                for i in 0..trials {
                    if barrier.wait().is_leader() {
                        if let Ok(mut s) = start.lock() {
                            s[i] = std::time::Instant::now();
                        }
                    }
                    std::hint::black_box(width.run(ROUNDS));
                    let end = std::time::Instant::now();
                    if let Ok(mut d) = done.lock() {
                        // The trial ends with its slowest thread (the initial value is earlier than any end).
                        d[i] = d[i].max(end);
                    }
                    barrier.wait();
                }
            });
        }
    });
    let (start, done) = (start.into_inner().unwrap_or_default(), done.into_inner().unwrap_or_default());
    let best = start.iter().zip(&done).map(|(s, d)| d.duration_since(*s).as_secs_f64()).fold(f64::INFINITY, f64::min);
    ROUNDS as f64 * width.flops_per_round() * threads as f64 / best / 1e9
}

/// User + system CPU time of this process (Linux `/proc/self/stat`, 10 ms ticks); 0 elsewhere. Other
/// jobs on a shared machine inflate wall time but not this.
#[allow(dead_code)] // not every example that includes this file asks for it
pub fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return 0.0 };
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}
