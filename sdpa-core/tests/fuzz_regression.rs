//! Inputs found by the cargo-fuzz targets under `fuzz/` (fuzz/README.md), minimised. Each test is named
//! after what broke.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use sdpa_core::{AttentionSpec, DType, HostInputs, SdpaError, Shape};

/// fuzz `attention_spec`: a valid spec whose V needs more than isize::MAX bytes (Dv = 69522081405220152)
/// made `HostInputs::random` panic with "capacity overflow" inside `Vec::with_capacity`; it must be a size
/// error, found before anything is allocated.
#[test]
fn host_inputs_too_big_to_exist_are_a_size_error_not_a_capacity_overflow_panic() {
    let shape = Shape { b: 4, hq: 4, hkv: 4, sq: 4, sk: 7, d: 4, dv: 69_522_081_405_220_152 };
    let spec = AttentionSpec::new(shape, DType::F32);
    assert!(spec.validate().is_ok(), "the element counts fit usize; only the bytes do not");
    let err = HostInputs::random(&spec, 0).unwrap_err();
    assert!(matches!(err, SdpaError::SizeOverflow { .. }), "{err}");
    assert!(err.to_string().contains("bytes of v"), "{err}");
    // The shape from issue 19 (`sdpa run --shape=18446744073709551615,1,1,1,1,1`).
    let spec = AttentionSpec::new(Shape::new(usize::MAX, 1, 1, 1, 1), DType::BF16);
    assert!(matches!(HostInputs::random(&spec, 0), Err(SdpaError::SizeOverflow { .. })));
}
