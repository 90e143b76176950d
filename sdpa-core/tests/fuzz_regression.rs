//! Inputs found by the cargo-fuzz targets under `fuzz/` (fuzz/README.md), minimised. Each test is named
//! after what broke.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use sdpa_core::{parse_results, AttentionSpec, DType, HostInputs, SdpaError, Shape};

/// fuzz `attention_spec`: a valid spec whose V needs more than isize::MAX bytes (Dv = 69522081405220152)
/// made `HostInputs::random` panic with "capacity overflow" inside `Vec::with_capacity`; it must be a size
/// error, found before anything is allocated.
#[test]
fn host_inputs_too_big_to_exist_are_a_size_error_not_a_capacity_overflow_panic() {
    let shape = Shape { b: 4, hq: 4, hkv: 4, sq: 4, sk: 7, d: 4, dv: 69_522_081_405_220_152 };
    let spec = AttentionSpec::new(shape, DType::F32);
    // The element counts fit usize; only the bytes do not. Validation itself refuses it now, so every
    // path (HostInputs::random included) errs before allocating.
    let err = spec.validate().unwrap_err();
    assert!(matches!(err, SdpaError::SizeOverflow { .. }), "{err}");
    assert!(err.to_string().contains("bytes of v"), "{err}");
    let err = HostInputs::random(&spec, 0).unwrap_err();
    assert!(matches!(err, SdpaError::SizeOverflow { .. }), "{err}");
    // The shape from issue 19 (`sdpa run --shape=18446744073709551615,1,1,1,1,1`).
    let spec = AttentionSpec::new(Shape::new(usize::MAX, 1, 1, 1, 1), DType::BF16);
    assert!(matches!(HostInputs::random(&spec, 0), Err(SdpaError::SizeOverflow { .. })));
}

/// fuzz `result_file` (round trip): a record holding NaN, as the GPU harness format always does for the
/// unrecorded `max_abs_err`, or as a Python writer's `NaN` does, was written by serde_json as `null`, and
/// reading that back failed the whole file with "invalid type: null, expected f64". A `null` number in a
/// record now reads as NaN.
#[test]
fn records_holding_nan_read_back_after_being_written() {
    let flat = r#"{"env": {"device": "H100"}, "records": [{"b": 1, "hq": 1, "hkv": 1, "sq": 64, "sk": 64,
        "d": 64, "dtype": "bf16", "kernel": "fa2", "median_ms": 0.007, "rel_err": 0.002}]}"#;
    let file = parse_results(flat, "flat.json").unwrap();
    assert!(file.records[0].check.unwrap().max_abs_err.is_nan(), "not recorded by the harness");
    let back = parse_results(&serde_json::to_string(&file).unwrap(), "back.json").unwrap();
    assert_eq!(back.records.len(), 1);

    let py = r#"[{"backend":"pytorch","kernel":"flash","device":"H100","dtype":"bf16",
        "shape":{"b":1,"hq":8,"hkv":8,"sq":1024,"sk":1024,"d":64,"dv":64},"mask":"none",
        "time_ms":{"median":0.5,"min":NaN,"max":Infinity},"tflops":NaN,"gbps":2.0,
        "check":{"max_abs_err":NaN,"rel_err":0.002,"tolerance":0.016,"pass":true}}]"#;
    let file = parse_results(py, "py.json").unwrap();
    let r = &file.records[0];
    assert!(r.tflops.is_nan() && r.time_ms.min.is_nan() && r.time_ms.max.is_nan());
    assert_eq!(parse_results(&serde_json::to_string(&file).unwrap(), "back.json").unwrap().records.len(), 1);
}
