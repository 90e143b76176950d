//! Physical bounds on what a trace can say. A value outside them is not a measurement but damage (a
//! corrupted or hand-edited file, a profiler bug): it is reported as suspect in the report and left out
//! of totals, efficiencies and replays, instead of turning a sum into `inf` or an efficiency into 8e84 %.
//!
//! Every bound is far from anything a real trace comes near, so no genuine event is ever dropped: a
//! bound only has to tell "physically possible" from "impossible", not "typical" from "unusual".

use sdpa_core::{HardwareSpec, Shape, HARDWARE};

/// Longest plausible single event, µs: one day. A profiler records a few steps of seconds to minutes;
/// no kernel, copy or operator runs for a day inside one.
pub const MAX_EVENT_US: f64 = 86_400.0 * 1e6;

/// Largest plausible |timestamp|, µs: 2^53. Kineto writes microseconds since the epoch (about 1.8e15
/// today) or since the profiler's start; 2^53 µs is year 2255, and beyond it an f64 no longer holds every
/// whole microsecond, so the op tree's time containment would be meaningless anyway.
pub const MAX_TIMESTAMP_US: f64 = 9_007_199_254_740_992.0;

/// Largest plausible attention dimension (B, H, S or D): 2^31. Even S = 2^31 with B = H = 1 and D = 1
/// holds 4 GiB per bf16 tensor; every real model is orders of magnitude below, and above it the usize
/// products of a shape can overflow.
pub const MAX_DIM: usize = 1 << 31;

/// Largest plausible Q, K, V or O tensor, elements: 2^40, at least 1 TiB at one byte per element, more
/// than the memory of any single GPU (the largest hold under 300 GB) or of the hosts CPU attention runs on.
pub const MAX_TENSOR_ELEMS: f64 = 1_099_511_627_776.0;

/// An achieved rate above this multiple of the device's peak (or, with no device known, of the fastest
/// device in the hardware table) is implausible. Real kernels stay below 1x; L2-resident inputs can push
/// the minimal-bytes bandwidth a few times above HBM's, never 100x.
pub const MAX_RATE_OVER_PEAK: f64 = 100.0;

/// Checks an event duration, µs; the error says what is wrong with it.
pub fn duration(us: f64) -> Result<(), String> {
    if us.is_nan() {
        Err("is NaN".into())
    } else if us < 0.0 {
        Err(format!("{us} µs is negative"))
    } else if us > MAX_EVENT_US {
        Err(format!("{us:e} µs is longer than a day"))
    } else {
        Ok(())
    }
}

/// Checks an event timestamp, µs.
pub fn timestamp(us: f64) -> Result<(), String> {
    if us.is_nan() {
        Err("is NaN".into())
    } else if us.abs() > MAX_TIMESTAMP_US {
        Err(format!("{us:e} µs is beyond 2^53 µs (year 2255)"))
    } else {
        Ok(())
    }
}

/// Checks what a trace says of a varlen or paged batch: every count (sequences, token totals, longest lengths,
/// page size) at most [`MAX_DIM`], like a shape's dimensions.
pub fn ragged(r: &crate::trace::attention::Ragged) -> Result<(), String> {
    let counts = [
        ("sequences", Some(r.sequences)),
        ("query tokens", Some(r.total_q)),
        ("key tokens", r.total_k),
        ("longest query", Some(r.max_q)),
        ("longest key", Some(r.max_k)),
        ("page size", r.page_size),
    ];
    match counts.iter().find(|(_, v)| v.is_some_and(|v| v > MAX_DIM)) {
        Some((what, Some(v))) => Err(format!("{what} {v} is above 2^31")),
        _ => Ok(()),
    }
}

/// Checks an attention shape: every dimension at most [`MAX_DIM`], every tensor at most
/// [`MAX_TENSOR_ELEMS`] elements.
pub fn shape(s: &Shape) -> Result<(), String> {
    let dims = [("B", s.b), ("Hq", s.hq), ("Hkv", s.hkv), ("Sq", s.sq), ("Sk", s.sk), ("D", s.d), ("Dv", s.dv)];
    if let Some((name, v)) = dims.iter().find(|(_, v)| *v > MAX_DIM) {
        return Err(format!("{name} = {v} is above 2^31"));
    }
    let f = |v: usize| v as f64;
    let tensors = [
        ("Q", f(s.b) * f(s.hq) * f(s.sq) * f(s.d)),
        ("K", f(s.b) * f(s.hkv) * f(s.sk) * f(s.d)),
        ("V", f(s.b) * f(s.hkv) * f(s.sk) * f(s.dv)),
        ("O", f(s.b) * f(s.hq) * f(s.sq) * f(s.dv)),
    ];
    match tensors.iter().find(|(_, n)| *n > MAX_TENSOR_ELEMS) {
        Some((name, n)) => Err(format!("{name} would hold {n:e} elements, above 2^40")),
        None => Ok(()),
    }
}

/// Checks achieved rates (TFLOP/s, TB/s) against the device, or against the fastest tabled device.
pub fn rates(tflops: f64, tbps: f64, hw: Option<&HardwareSpec>) -> Result<(), String> {
    let peak_of = |h: &HardwareSpec| h.f16_tflops.max(h.bf16_tflops).max(h.tf32_tflops).max(h.fp32_tflops);
    let (peak, bw, of) = match hw {
        Some(h) => (peak_of(h), h.mem_bandwidth_gbs / 1e3, h.name.to_string()),
        None => (
            HARDWARE.iter().map(peak_of).fold(0.0, f64::max),
            HARDWARE.iter().map(|h| h.mem_bandwidth_gbs / 1e3).fold(0.0, f64::max),
            "the fastest device in the hardware table".to_string(),
        ),
    };
    if !tflops.is_finite() || tflops > MAX_RATE_OVER_PEAK * peak {
        return Err(format!("{tflops:e} TFLOP/s is more than 100x the peak of {of} ({peak} TFLOP/s)"));
    }
    if !tbps.is_finite() || tbps > MAX_RATE_OVER_PEAK * bw {
        return Err(format!("{tbps:e} TB/s is more than 100x the memory bandwidth of {of} ({bw} TB/s)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_values_pass_and_absurd_ones_do_not() {
        assert!(duration(0.0).is_ok() && duration(3.6e9).is_ok());
        assert!(duration(1.7e308).is_err() && duration(f64::INFINITY).is_err());
        assert!(duration(f64::NAN).is_err() && duration(-1.0).is_err());
        assert!(timestamp(1.76e15).is_ok() && timestamp(-5.0).is_ok());
        assert!(timestamp(1e300).is_err() && timestamp(f64::NEG_INFINITY).is_err());
        assert!(shape(&Shape::new(2, 32, 131_072, 131_072, 128)).is_ok());
        assert!(shape(&Shape::new(1 << 62, 8, 1024, 1024, 64)).is_err());
        assert!(shape(&Shape::new(1 << 20, 1 << 20, 1024, 1024, 64)).is_err(), "Q above 2^40 elements");
        let h100 = HardwareSpec::find("h100-sxm");
        assert!(rates(700.0, 3.0, h100).is_ok());
        assert!(rates(8e85, 1.0, h100).is_err() && rates(1.0, f64::INFINITY, None).is_err());
    }
}
