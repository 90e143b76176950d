//! The judgement lines both the terminal summary and the markdown print: each fused op against the frontier,
//! each decode op by its K/V bytes, and the launch gaps of decode loops.

use crate::trace::report::TraceReport;

/// One line per judged op and per decode loop, in the report's op order.
pub fn lines(r: &TraceReport) -> Vec<String> {
    let mut out = Vec::new();
    for o in &r.attention_ops {
        if let Some(fr) = &o.frontier {
            out.push(format!(
                "{} {} {}: {}, {:.0} % of the best known {:.1} TFLOP/s ({}, {}) at {}",
                o.backend.name(),
                o.phase.name(),
                o.shape_label(),
                fr.verdict.words(),
                fr.ratio * 100.0,
                fr.best.tflops,
                fr.best.kernel,
                fr.best.how,
                fr.compared_at
            ));
        }
        if let Some(kv) = &o.kv {
            let mib = |b: f64| b / (1u64 << 20) as f64;
            let stored = match (&kv.stored_dtype, kv.stored_bytes) {
                (Some(t), Some(b)) => format!(", stored as {t} ({:.1} MiB; converted before the call)", mib(b)),
                _ => String::new(),
            };
            let range = o.sk_range.map(|(a, b)| format!(" (Sk {a}..{b})")).unwrap_or_default();
            out.push(format!(
                "{} decode {}{range}: K/V {:.1} MiB per call ({}, {} KV heads{}){stored}, {:.2} TB/s of K/V; split-KV \
                 combine {:.1} %",
                o.backend.name(),
                o.shape_label(),
                mib(kv.kv_bytes),
                kv.kv_dtype,
                kv.kv_heads,
                if kv.kv_bytes_are == "exact" { String::new() } else { format!(", {}", kv.kv_bytes_are) },
                kv.kv_tbps,
                kv.combine_share * 100.0
            ));
        }
    }
    for g in &r.decode_gaps {
        out.push(format!(
            "decode loop: {} attention calls, GPU idle a median {:.1} µs of each {:.1} µs period ({:.0} %), {:.1} µs \
             in all",
            g.calls,
            g.median_idle_us,
            g.median_period_us,
            g.idle_share * 100.0,
            g.total_idle_us
        ));
    }
    out
}
