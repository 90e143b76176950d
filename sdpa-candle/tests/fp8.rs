//! FP8 (E4M3) through sdpa-candle without a GPU: candle's own E4M3 conversion (the `float8` crate) agrees
//! with sdpa-core's encoder and decoder on every code and every midpoint, so the values a candle model
//! stores are the values sdpa's reference reads; the CPU refuses FP8 inputs with the reason, and descale
//! factors on other dtypes are refused.

use candle_core::{DType, Device, Tensor};
use sdpa_candle::{sdpa, SdpaOptions};
use sdpa_core::fp8::{e4m3_to_f32, f32_to_e4m3};
use sdpa_core::Descale;

#[test]
fn candle_and_sdpa_round_e4m3_alike() {
    let mut xs: Vec<f32> = Vec::new();
    for c in 0..0x7eu8 {
        let (lo, hi) = (e4m3_to_f32(c), e4m3_to_f32(c + 1));
        xs.extend([lo, (lo + hi) / 2.0, lo + (hi - lo) * 0.3, lo + (hi - lo) * 0.7]);
    }
    xs.push(448.0);
    let xs: Vec<f32> = xs.iter().flat_map(|&x| [x, -x]).collect();
    let t = Tensor::new(xs.as_slice(), &Device::Cpu).unwrap();
    let round_trip: Vec<f32> = t.to_dtype(DType::F8E4M3).unwrap().to_dtype(DType::F32).unwrap().to_vec1().unwrap();
    for (x, got) in xs.iter().zip(&round_trip) {
        assert_eq!(*got, e4m3_to_f32(f32_to_e4m3(*x)), "{x:e}");
    }
}

#[test]
fn fp8_on_the_cpu_is_refused_with_the_reason() {
    let q = Tensor::ones((1, 2, 16, 64), DType::F32, &Device::Cpu).unwrap().to_dtype(DType::F8E4M3).unwrap();
    let opts = SdpaOptions::bhsd().with_descale(Descale::uniform(0.5));
    let err = sdpa(&q, &q, &q, &opts).expect_err("the CPU has no FP8 path").to_string();
    assert!(err.contains("f8e4m3"), "{err}");
    // Descales belong to FP8 inputs only.
    let b = Tensor::ones((1, 2, 16, 64), DType::BF16, &Device::Cpu).unwrap();
    let err = sdpa(&b, &b, &b, &opts).expect_err("descale on bf16").to_string();
    assert!(err.contains("descale"), "{err}");
}
