//! One CSV row per attention op (`--csv FILE`).

use crate::trace::report::TraceReport;

const HEADER: &[&str] = &[
    "kind",
    "phase",
    "backend",
    "fused_kernel",
    "module",
    "layers",
    "op",
    "b",
    "hq",
    "hkv",
    "sq",
    "sk",
    "d",
    "dv",
    "dtype",
    "causal",
    "mask",
    "count",
    "total_us",
    "mean_us",
    "share_of_gpu",
    "gflops_per_call",
    "mb_per_call",
    "tflops",
    "tbps",
    "efficiency",
    "band_low",
    "band_high",
    "band_status",
    "bound",
    "top_kernel",
    "variants",
    "layout",
    "work",
    "sequences",
    "total_q",
    "total_k",
    "page_size",
    "implementation",
    "implementation_details",
    "implementation_kernel",
];

/// Quotes a field when it holds a comma, quote or newline (RFC 4180).
pub fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn o<T: ToString>(x: Option<T>) -> String {
    x.map(|v| v.to_string()).unwrap_or_default()
}

/// Renders the table.
pub fn render(r: &TraceReport) -> String {
    let mut out = HEADER.join(",");
    out.push('\n');
    for a in &r.attention_ops {
        let row: Vec<String> = vec![
            a.kind.name().into(),
            a.phase.name().into(),
            a.backend.name().into(),
            a.fused_kernel.to_string(),
            a.module.clone(),
            a.layers.join(" "),
            a.op.clone(),
            o(a.b),
            o(a.hq),
            o(a.hkv),
            o(a.sq),
            o(a.sk),
            o(a.d),
            o(a.dv),
            a.dtype.clone().unwrap_or_default(),
            o(a.causal),
            a.mask.clone(),
            a.count.to_string(),
            format!("{:.3}", a.total_us),
            format!("{:.3}", a.mean_us),
            format!("{:.6}", a.share_of_gpu),
            o(a.flops.map(|f| format!("{:.4}", f / 1e9))),
            o(a.bytes.map(|b| format!("{:.4}", b / 1e6))),
            o(a.tflops.map(|v| format!("{v:.3}"))),
            o(a.tbps.map(|v| format!("{v:.4}"))),
            o(a.efficiency.map(|v| format!("{v:.5}"))),
            o(a.expected_band.as_ref().map(|b| b.low)),
            o(a.expected_band.as_ref().map(|b| b.high)),
            o(a.band_status),
            o(a.bound.map(|b| format!("{b:?}").to_lowercase())),
            a.kernels.first().map(|k| k.name.clone()).unwrap_or_default(),
            a.variants.clone(),
            a.layout.name().into(),
            a.work.name().into(),
            o(a.ragged.map(|r| r.sequences)),
            o(a.ragged.map(|r| r.total_q)),
            o(a.ragged.and_then(|r| r.total_k)),
            o(a.ragged.and_then(|r| r.page_size)),
            a.implementation.as_ref().map(|i| i.id.label().to_string()).unwrap_or_default(),
            a.implementation.as_ref().map(|i| i.details.join("; ")).unwrap_or_default(),
            a.implementation.as_ref().map(|i| i.kernel.clone()).unwrap_or_default(),
        ];
        out.push_str(&row.iter().map(|f| field(f)).collect::<Vec<_>>().join(","));
        out.push('\n');
    }
    out
}
