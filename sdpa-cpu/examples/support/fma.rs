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
