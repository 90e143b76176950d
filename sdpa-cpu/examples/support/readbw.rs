//! The machine's read bandwidth, measured from Rust in the same process as the kernels it is a ceiling
//! for: `threads` threads each stream one contiguous part of a buffer much larger than the last-level
//! cache, summing it with 512-bit loads (eight independent accumulators), optionally with software
//! prefetch ahead. Included by the examples with `#[path]`.

use std::sync::Barrier;
use std::time::Instant;

/// A buffer of `bytes` (rounded down to whole cache lines) filled with non-zero values, so no page is
/// shared zero memory.
pub fn buffer(bytes: usize) -> Vec<f32> {
    let n = bytes / 64 * 16;
    (0..n).map(|i| (i % 251) as f32 * 0.001 + 1.0).collect()
}

/// GB/s of one pass over `buf` by `threads` threads, each over its own contiguous part, started together.
/// The clock runs from the first worker's start to the last worker's end, as each worker reads it (the
/// spawning thread may itself be descheduled on a busy machine).
pub fn read_gbps(buf: &[f32], threads: usize, prefetch: bool) -> f64 {
    let part = buf.len().div_ceil(threads.max(1)).div_ceil(128) * 128;
    let start = Barrier::new(buf.chunks(part).count());
    let spans: Vec<(Instant, Instant, f32)> = std::thread::scope(|sc| {
        let handles: Vec<_> = buf
            .chunks(part)
            .map(|chunk| {
                let start = &start;
                sc.spawn(move || {
                    start.wait();
                    let t0 = Instant::now();
                    let s = sum(chunk, prefetch);
                    (t0, Instant::now(), s)
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let (Some(first), Some(last)) = (spans.iter().map(|x| x.0).min(), spans.iter().map(|x| x.1).max()) else {
        return f64::NAN;
    };
    std::hint::black_box(spans.iter().map(|x| x.2).sum::<f32>());
    buf.len() as f64 * 4.0 / (last - first).as_secs_f64() / 1e9
}

fn sum(x: &[f32], prefetch: bool) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present (checked just above).
        return unsafe { sum_avx512(x, prefetch) };
    }
    let _ = prefetch;
    let mut acc = [0.0f32; 16];
    for c in x.chunks_exact(16) {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum()
}

/// Distance of the software prefetch, in f32 (4 KiB ahead of the loads).
#[cfg(target_arch = "x86_64")]
const AHEAD: usize = 1024;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_avx512(x: &[f32], prefetch: bool) -> f32 {
    use std::arch::x86_64::*;
    let n = x.len() / 128 * 128;
    let p = x.as_ptr();
    let mut acc = [_mm512_setzero_ps(); 8];
    let mut i = 0;
    // SAFETY: every load reads 16 f32 at `i + 16·k < n <= x.len()`; prefetches never fault.
    unsafe {
        while i < n {
            if prefetch {
                for k in 0..8 {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i + AHEAD + 16 * k).cast());
                }
            }
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm512_add_ps(*a, _mm512_loadu_ps(p.add(i + 16 * k)));
            }
            i += 128;
        }
        let mut s = _mm512_setzero_ps();
        for a in acc {
            s = _mm512_add_ps(s, a);
        }
        _mm512_reduce_add_ps(s) + x[n..].iter().sum::<f32>()
    }
}
