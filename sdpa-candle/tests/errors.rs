//! Bad input comes back as a candle error whose text says what is wrong; nothing panics.

// Helpers of a test panic on failure: that is how a test fails.
#![allow(clippy::unwrap_used)]

use candle_core::{DType, Device, Tensor};
use sdpa_candle::{sdpa, SdpaMask, SdpaOptions};

fn t(dims: &[usize], dtype: DType) -> Tensor {
    Tensor::randn(0f32, 1.0, dims, &Device::Cpu).unwrap().to_dtype(dtype).unwrap()
}

/// Runs `sdpa` and returns its error text, failing the test if it succeeded.
fn err(q: &Tensor, k: &Tensor, v: &Tensor, opts: &SdpaOptions) -> String {
    match sdpa(q, k, v, opts) {
        Ok(o) => panic!("expected an error, got a tensor of shape {:?}", o.dims()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn each_bad_input_names_its_problem() {
    let f = DType::F32;
    let q = t(&[1, 4, 6, 8], f);
    let kv = t(&[1, 2, 5, 8], f);
    let o = SdpaOptions::bhsd();
    let cases: Vec<(String, &str)> = vec![
        (err(&t(&[4, 6, 8], f), &kv, &kv, &o), "rank 4"),
        (err(&t(&[1, 3, 6, 8], f), &kv, &kv, &o), "not a multiple"),
        (err(&q, &t(&[1, 2, 5, 8], DType::BF16), &kv, &o), "share one dtype"),
        (err(&t(&[1, 4, 6, 8], DType::F64), &t(&[1, 2, 5, 8], DType::F64), &t(&[1, 2, 5, 8], DType::F64), &o), "F64"),
        (err(&q, &t(&[1, 2, 5, 7], f), &kv, &o), "head dims of q (8) and k (7)"),
        (err(&q, &t(&[2, 2, 5, 8], f), &kv, &o), "batch sizes differ"),
        (err(&q, &kv, &t(&[1, 2, 4, 8], f), &o), "positions"),
        (err(&q, &kv, &t(&[1, 1, 5, 8], f), &o), "heads"),
        (err(&t(&[1, 4, 8, 6], f).transpose(2, 3).unwrap(), &kv, &kv, &o), "contiguous()"),
        (err(&t(&[1, 4, 0, 8], f), &kv, &kv, &o), "Sq is 0"),
        (err(&q, &kv, &kv, &o.clone().with_mask(SdpaMask::Additive(t(&[6, 4], f)))), "does not broadcast"),
        (err(&q, &kv, &kv, &o.clone().with_mask(SdpaMask::Additive(t(&[1, 1, 1, 6, 5], f)))), "rank 1 to 4"),
        (err(&q, &kv, &kv, &o.clone().with_mask(SdpaMask::Keep(t(&[6, 5], f)))), "boolean mask must be"),
        (err(&q, &kv, &kv, &o.clone().with_mask(SdpaMask::Additive(t(&[6, 5], DType::U8)))), "additive mask must be"),
        (err(&q, &kv, &kv, &o.clone().with_scale(f64::INFINITY)), "not finite"),
    ];
    for (text, want) in cases {
        assert!(text.starts_with("sdpa:") || text.contains("sdpa:"), "no `sdpa:` prefix: {text}");
        assert!(text.contains(want), "`{text}` does not mention `{want}`");
    }
}

#[test]
fn the_dims_order_is_read_as_named() {
    // [B, S, H, D] tensors read with the BHSD order have mismatched "heads": an error, never a silent
    // misread.
    let q = t(&[1, 6, 4, 8], DType::F32);
    let kv = t(&[1, 5, 2, 8], DType::F32);
    assert!(sdpa(&q, &kv, &kv, &SdpaOptions::bshd()).is_ok());
    let text = err(&q, &kv, &kv, &SdpaOptions::bhsd());
    assert!(text.contains("positions") || text.contains("heads"), "{text}");
}
