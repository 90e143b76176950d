//! Printers for a [`super::report::TraceReport`]: a terminal summary, the findings markdown (both with the
//! [`judgement`] lines), one CSV row per attention op and a self-contained HTML page ([`html`], its figures in
//! [`charts`]); and for a [`super::diff::TraceDiff`] the text and markdown of [`diff`]. JSON is `serde_json`
//! on the report or diff.

pub mod charts;
pub mod csv;
pub mod diff;
pub mod html;
pub mod judgement;
pub mod markdown;
pub mod text;

/// `12.3 %` from a fraction.
pub(crate) fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// An optional float with `digits`, or `-`.
pub(crate) fn opt(x: Option<f64>, digits: usize) -> String {
    x.map(|v| format!("{v:.digits$}")).unwrap_or_else(|| "-".into())
}

/// `fwd flash 2,16,16,2048,2048,128 bf16`: an op in a few words, for the lines under a table.
pub(crate) fn op_words(o: &crate::trace::report::AttentionOp) -> String {
    format!("{} {} {} {}", o.phase.name(), o.backend.name(), o.shape_label(), o.dtype.as_deref().unwrap_or("-"))
}

/// The ranks section, one line per rank and per collective, shared by the text and markdown printers.
pub(crate) fn ranks_lines(rk: &crate::trace::ranks::RankReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "ranks: {}{}",
        rk.ranks.len(),
        match (rk.attention_max_over_mean, &rk.busiest) {
            (Some(x), Some(b)) => format!("; attention busiest/mean {x:.2} ({b} does the most)"),
            _ => String::new(),
        }
    );
    for x in &rk.ranks {
        let _ = writeln!(
            s,
            "  {:<16} attention {:>10.1} µs (fwd {:.1}, bwd {:.1}; {} calls) of GPU {:.1} µs",
            x.label(),
            x.attention_us,
            x.attention_fwd_us,
            x.attention_bwd_us,
            x.attention_calls,
            x.gpu_time_us
        );
        if let Some(c) = &x.comm {
            let _ = writeln!(
                s,
                "    collectives {:.1} µs: {} under attention kernels, {} under any compute",
                c.total_us,
                pct(c.under_attention),
                pct(c.under_compute)
            );
            for k in &c.collectives {
                let _ = writeln!(
                    s,
                    "      {} x{} ({}): {:.1} µs, {:.1} µs under attention",
                    k.collective, k.count, k.op, k.total_us, k.under_attention_us
                );
            }
        }
    }
    if let Some(c) = &rk.likely_cause {
        let _ = writeln!(s, "  likely cause: {c}");
    }
    s
}
