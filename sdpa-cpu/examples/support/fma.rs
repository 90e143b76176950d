//! The machine's single-thread f32 FMA ceiling, measured in the same process as the kernels it is a
//! ceiling for: 12 independent 512-bit FMA chains (12 x 16 lanes x 2 flops = 384 flops a round). Included
//! by the examples with `#[path]`.

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

/// Single-thread f32 FMA rate right now: the fastest of 200 short trials of the 12 chains (wall clock; the
/// minimum is the trial nothing else interrupted). NaN without AVX-512 or with `NOPEAK` set.
#[allow(dead_code)] // not every example that includes this file asks for it
pub fn peak_gflops() -> f64 {
    if std::env::var_os("NOPEAK").is_some() {
        return f64::NAN;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            let mut best = f64::INFINITY;
            for _ in 0..200 {
                let t = std::time::Instant::now();
                // SAFETY: AVX-512F is present (checked above).
                std::hint::black_box(unsafe { fma_loop(20_000) });
                best = best.min(t.elapsed().as_secs_f64());
            }
            return 20_000.0 * 12.0 * 32.0 / best / 1e9;
        }
    }
    f64::NAN
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
