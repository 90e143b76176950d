//! Bytes -> a `sdpa bench --spec` file: JSON walked as the CLI's `parse_spec_text` walks it (a spec, an
//! array, a `{command, spec}` replay, a findings report's replays; that function is private to the
//! binary, so its walk is mirrored here) -> `BenchSpec` through serde -> the sweep's cases expanded as the
//! CLI's planner does (dtype x shape x mask x layout, the first 256) -> `AttentionSpec::validate` and the
//! cost model.
//!
//! Invariants: no panic; a spec serialises and reads back equal; a case that validates has finite costs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sdpa_core::record::BenchSpec;
use sdpa_core::{AttentionCost, AttentionSpec, ExplicitMask, Kernel, Layout, Mask, MaskValues, Shape};
use serde_json::Value;

fn collect(value: Value, out: &mut Vec<BenchSpec>, depth: usize) {
    if depth > 64 || out.len() > 64 {
        return;
    }
    match value {
        Value::Array(items) => items.into_iter().for_each(|v| collect(v, out, depth + 1)),
        Value::Object(mut map) => {
            if let Some(Value::Array(findings)) = map.remove("findings") {
                for f in findings {
                    if let Some(r) = f.get("replay").filter(|r| !r.is_null()).cloned() {
                        collect(r, out, depth + 1);
                    }
                }
            } else if let Some(spec) = map.remove("spec") {
                collect(spec, out, depth + 1);
            } else if let Ok(spec) = serde_json::from_value::<BenchSpec>(Value::Object(map)) {
                out.push(spec);
            }
        }
        _ => {}
    }
}

fn mask(name: &str, shape: &Shape) -> Option<Mask> {
    match name {
        "bool" => Some(Mask::Explicit(ExplicitMask::full(MaskValues::Boolean, shape))),
        "additive" => Some(Mask::Explicit(ExplicitMask::full(MaskValues::Additive, shape))),
        other => other.parse().ok(),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    // Straight into one BenchSpec, as the analyzer's replays are read.
    let _ = serde_json::from_str::<BenchSpec>(text);
    let Ok(value) = serde_json::from_str::<Value>(text) else { return };
    let mut specs = Vec::new();
    collect(value, &mut specs, 0);
    let mut budget = 256usize;
    for spec in &specs {
        let json = serde_json::to_string(spec).expect("a BenchSpec serialises");
        let back: BenchSpec = serde_json::from_str(&json).expect("a serialised BenchSpec reads back");
        // serde_json (without its `float_roundtrip` feature) may read a printed f64 back one ulp off
        // (found by this target: max_time_s 4e-84 came back as 3.9999999999999997e-84), so the budget is
        // compared to within rounding and everything else exactly.
        let close = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(x), Some(y)) => x == y || (x - y).abs() <= 4.0 * f64::EPSILON * x.abs().max(y.abs()),
            (x, y) => x == y,
        };
        assert!(close(back.max_time_s, spec.max_time_s), "BenchSpec round trip changed max_time_s: {json}");
        let strip = |s: &BenchSpec| BenchSpec { max_time_s: None, ..s.clone() };
        assert_eq!(strip(&back), strip(spec), "BenchSpec round trip changed it: {json}");
        for k in &spec.kernels {
            let _ = k.parse::<Kernel>();
        }
        let layouts = if spec.layouts.is_empty() { vec![Layout::Bhsd] } else { spec.layouts.clone() };
        let masks = if spec.masks.is_empty() { vec!["none".to_string()] } else { spec.masks.clone() };
        for &dtype in &spec.dtypes {
            for shape in &spec.shapes {
                for m in &masks {
                    let Some(mask) = mask(m, shape) else { continue };
                    for &layout in &layouts {
                        if budget == 0 {
                            return;
                        }
                        budget -= 1;
                        let case = AttentionSpec::new(*shape, dtype).with_layout(layout).with_mask(mask);
                        if case.validate().is_ok() {
                            let c = AttentionCost::of_spec(&case);
                            assert!(c.flops.is_finite() && c.bytes.is_finite(), "cost of {shape}: {c:?}");
                        }
                    }
                }
            }
        }
    }
});
