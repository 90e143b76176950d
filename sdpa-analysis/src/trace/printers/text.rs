//! The terminal summary of `sdpa analyze`.

use super::{opt, pct};
use crate::trace::attention::BatchLayout;
use crate::trace::report::TraceReport;
use std::fmt::Write;

/// Renders the summary.
pub fn render(r: &TraceReport) -> String {
    let mut s = String::new();
    let dev = match (&r.device.name, &r.device.spec) {
        (Some(n), Some(spec)) if r.device.source == "override" => format!("{spec} (override; trace says {n})"),
        (_, Some(spec)) => format!("{spec} ({})", r.device.source),
        (Some(n), None) => format!("{n} (not in the hardware table)"),
        (None, None) => "unknown".into(),
    };
    let _ = writeln!(s, "sdpa analyze: {}", r.inputs.join(", "));
    let _ = writeln!(s, "device: {dev}");
    let sm = &r.summary;
    let _ = writeln!(
        s,
        "GPU time {:.1} µs; attention {:.1} µs = {} (fused {:.1} µs, unfused {:.1} µs, {} calls)",
        sm.total_gpu_time_us,
        sm.attention_time_us,
        pct(sm.attention_share),
        sm.fused_time_us,
        sm.unfused_time_us,
        sm.attention_calls
    );
    for u in &r.unreadable {
        let _ = writeln!(s, "unreadable (left out): {u}");
    }
    if !r.suspect.is_empty() {
        let n: u64 = r.suspect.iter().map(|x| x.count).sum();
        let _ = writeln!(s, "suspect: {n} implausible values left out");
        for x in &r.suspect {
            let _ = writeln!(s, "  {}", x.line());
        }
    }
    if !r.attention_ops.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{:<8} {:<4} {:<10} {:<28} {:<22} {:<6} {:<5} {:<38} {:>5} {:>10} {:>9} {:>9} {:>9} {:<12}",
            "kind",
            "pass",
            "backend",
            "module",
            "B,Hq,Hkv,Sq,Sk,D",
            "layout",
            "dtype",
            "mask",
            "calls",
            "total µs",
            "mean µs",
            "TFLOP/s",
            "eff",
            "band"
        );
        for o in &r.attention_ops {
            let module = o.module.rsplit('/').next().unwrap_or("-");
            let band = o
                .expected_band
                .as_ref()
                .map(|b| format!("{:.0}-{:.0} % {}", b.low * 100.0, b.high * 100.0, o.band_status.unwrap_or("")))
                .unwrap_or_else(|| "-".into());
            let _ = writeln!(
                s,
                "{:<8} {:<4} {:<10} {:<28} {:<22} {:<6} {:<5} {:<38} {:>5} {:>10.1} {:>9.1} {:>9} {:>9} {:<12}",
                o.kind.name(),
                o.phase.name(),
                o.backend.name(),
                truncate(module, 28),
                o.shape_label(),
                o.layout.name(),
                o.dtype.as_deref().unwrap_or("-"),
                truncate(&o.mask_and_variants(), 38),
                o.count,
                o.total_us,
                o.mean_us,
                o.bounded(opt(o.tflops, 1)),
                o.bounded(o.efficiency.map(pct).unwrap_or_else(|| "-".into())),
                band
            );
        }
        // Whose kernels ran each fused op, as their names tell.
        for o in &r.attention_ops {
            if let Some(i) = &o.implementation {
                let _ = writeln!(s, "  {}: {} [{}]", super::op_words(o), i.label(), truncate(&i.kernel, 60));
            }
        }
        // Varlen and paged ops: what the trace recorded of their sequences, and how far their work is known.
        for o in r.attention_ops.iter().filter(|o| o.layout != BatchLayout::Dense) {
            let _ =
                writeln!(s, "  {} ({} {}): work {}", o.layout_label(), o.backend.name(), o.phase.name(), o.work.name());
            if let Some(why) = &o.work_why {
                let _ = writeln!(s, "      {why}");
            }
        }
    }
    if r.summary.cache_write_time_us > 0.0 {
        let names: Vec<&str> = r.summary.cache_write_kernels.iter().map(|k| k.name.as_str()).collect();
        let _ = writeln!(
            s,
            "attention-adjacent: KV cache writes {:.1} µs ({})",
            r.summary.cache_write_time_us,
            truncate(&names.join(", "), 100)
        );
    }
    if let Some(rk) = &r.ranks {
        let _ = writeln!(s);
        let _ = write!(s, "{}", super::ranks_lines(rk));
    }
    let _ = writeln!(s);
    let judged = super::judgement::lines(r);
    if !judged.is_empty() {
        let _ = writeln!(s, "judgement:\n  {}\n", judged.join("\n  "));
    }
    let _ = writeln!(s, "findings:");
    for f in &r.findings {
        let _ = writeln!(s, "  [{}] path {}: {}", f.severity.name(), f.path, f.title);
        if let Some(rp) = &f.replay {
            let _ = writeln!(s, "      replay: {}", rp.command);
        } else if let Some(why) = &f.replay_note {
            let _ = writeln!(s, "      replay: none ({why})");
        }
    }
    s
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n - 1).collect::<String>())
    }
}
